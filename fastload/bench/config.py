"""The settings of a benchmark run: what to measure and for how long (:class:`BenchConfig`).

:meth:`BenchConfig.validate` checks every field and fills in the defaults that depend on
the machine (the ``num_workers`` sweep, the model, torch threads).
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any

from ..errors import ConfigError

__all__ = ["BenchConfig", "default_workers"]


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def default_workers(cores: int | None = None) -> list[int]:
    """``num_workers`` values to sweep: powers of two up to the core count and the count itself, the last 3."""
    cores = _cores() if cores is None else max(1, int(cores))
    vals = {cores}
    p = 1
    while p < cores:
        vals.add(p)
        p *= 2
    return sorted(vals)[-3:]


def _pos_int(name: str, value: Any, *, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"{name} must be an int >= {minimum}, got {value!r}")
    return value


@dataclasses.dataclass
class BenchConfig:
    """What to measure and for how long. :meth:`quick` gives a seconds-long configuration for tests.

    Attributes:
        device: ``"cpu"`` or ``"cuda"``/``"cuda:N"``.
        batch_size: samples per batch for every loader.
        batches: timed batches per loader-only repeat (ignored when ``epochs`` is set).
        epochs: time this many full epochs per repeat instead of ``batches``.
        warmup: batches (and training steps) left out of every measurement.
        repeats: loader-only repeats (median and min/max over them).
        train_steps: timed training steps per loader (0 skips the training loop).
        model: training model name (default: ``small-cnn`` on CPU, ``resnet50`` on CUDA; ``none`` skips).
        crop: output side in pixels (224, as ImageNet training).
        workers: ``num_workers`` values for the ImageFolder baseline (default :func:`default_workers`).
        seed: seeds shuffling and augmentation.
        sample_interval: seconds between GPU/CPU utilisation samples.
        train_threads: torch intra-op threads for the training step (default: 1 on CPU, so the
            model does not fight the loader's workers for the cores as a GPU would not; unchanged on CUDA).
    """

    device: str = "cpu"
    batch_size: int = 64
    batches: int = 20
    epochs: int | None = None
    warmup: int = 3
    repeats: int = 3
    train_steps: int = 40
    model: str | None = None
    crop: int = 224
    workers: list[int] | None = None
    seed: int = 0
    sample_interval: float = 0.25
    train_threads: int | None = None

    @classmethod
    def quick(cls, **overrides: Any) -> "BenchConfig":
        """A few batches of 16 per loader, one worker value: for tests and smoke runs."""
        base: dict[str, Any] = dict(
            batch_size=16, batches=3, warmup=1, repeats=2, train_steps=3, workers=[min(2, _cores())], sample_interval=0.1
        )
        base.update(overrides)
        return cls(**base)

    def validate(self) -> "BenchConfig":
        from .models import MODELS, default_model

        dev = str(self.device)
        if not (dev == "cpu" or dev == "cuda" or (dev.startswith("cuda:") and dev[5:].isdigit())):
            raise ConfigError(f"device must be 'cpu', 'cuda' or 'cuda:N', got {self.device!r}")
        _pos_int("batch_size", self.batch_size)
        _pos_int("batches", self.batches)
        if self.epochs is not None:
            _pos_int("epochs", self.epochs)
        _pos_int("warmup", self.warmup, minimum=0)
        _pos_int("repeats", self.repeats)
        _pos_int("train_steps", self.train_steps, minimum=0)
        _pos_int("crop", self.crop, minimum=8)
        if self.model is None:
            self.model = default_model(dev)
        if self.model not in MODELS:
            raise ConfigError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.workers is None:
            self.workers = default_workers()
        if not self.workers or any(isinstance(w, bool) or not isinstance(w, int) or w < 0 for w in self.workers):
            raise ConfigError(f"workers must be a non-empty list of ints >= 0, got {self.workers!r}")
        self.workers = sorted(set(self.workers))
        if self.train_threads is not None:
            _pos_int("train_threads", self.train_threads)
        elif dev == "cpu":
            self.train_threads = 1
        if not (isinstance(self.sample_interval, (int, float)) and self.sample_interval > 0):
            raise ConfigError(f"sample_interval must be seconds > 0, got {self.sample_interval!r}")
        return self

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
