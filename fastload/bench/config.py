"""The settings of a benchmark run: what to measure and for how long (:class:`BenchConfig`).

:meth:`BenchConfig.validate` checks every field and fills in the defaults that depend on
the machine (the ``num_workers`` sweep, the model, torch threads).

Every size is bounded there, before anything is allocated (the benchmark's first batch of
random data is ``batch_size x 3 x crop x crop`` float32): ``crop`` at most :data:`MAX_CROP`
pixels (the loader's own largest crop), ``batch_size`` at most :data:`MAX_BATCH` samples and
one float32 batch at most :data:`BATCH_MEMORY_SHARE` of this machine's memory
(:func:`memory_bytes`), the counts and the ``num_workers`` values at the bounds below. Each
error names the setting, the value and the limit.
"""

from __future__ import annotations

import dataclasses
import os
import reprlib
from typing import Any

from ..errors import ConfigError

__all__ = ["BenchConfig", "default_workers", "memory_bytes", "MAX_CROP", "MAX_BATCH"]

#: The largest ``crop``: the loader's largest output side (``fastload.loader.MAX_SIDE``, 8192;
#: the same number, kept here so that checking a configuration imports neither torch nor DALI).
MAX_CROP = 8192
#: The largest ``batch_size`` (samples per batch).
MAX_BATCH = 65536
#: The largest share of this machine's memory one float32 batch (``batch_size x 3 x crop x crop``)
#: may take: the benchmark holds several (the loaders' queues, the training step's copy).
BATCH_MEMORY_SHARE = 0.25
#: The largest ``batches`` / ``train_steps`` (timed steps; their timings are kept), ``epochs``,
#: ``warmup``, ``repeats``.
MAX_STEPS = 10_000_000
MAX_EPOCHS = 10_000
MAX_WARMUP = 1_000_000
MAX_REPEATS = 1_000
#: The largest ``num_workers`` value swept and ``train_threads``, and how many values the sweep may hold.
MAX_WORKERS = 1024
MAX_WORKER_VALUES = 64
#: ``sample_interval`` bounds, seconds (utilisation samples are kept: not faster than 100 a second).
MIN_INTERVAL, MAX_INTERVAL = 0.01, 60.0


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


def memory_bytes() -> int | None:
    """This machine's memory in bytes (``SC_PHYS_PAGES x SC_PAGE_SIZE``), lowered to the memory
    cgroup's limit when one is set; None where neither can be read."""
    total = None
    try:
        total = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        pass
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text.isdigit() and int(text) > 0:
            total = int(text) if total is None else min(total, int(text))
    return total if total and total > 0 else None


def _pos_int(name: str, value: Any, *, minimum: int = 1, maximum: int | None = None, what: str = "") -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        rng = f"in [{minimum}, {maximum}]" if maximum is not None else f">= {minimum}"
        raise ConfigError(f"{name} must be an int {rng}{what}, got {value!r}")
    if maximum is not None and value > maximum:
        raise ConfigError(f"{name} must be an int in [{minimum}, {maximum}]{what}, got {value!r}")
    return value


def _gb(n: float) -> str:
    return f"{n / 1e9:,.1f} GB"


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
        # sizes first, each against its bound, before anything is allocated
        _pos_int("crop", self.crop, minimum=8, maximum=MAX_CROP, what=" (pixels; the loader's largest crop, MAX_CROP)")
        _pos_int("batch_size", self.batch_size, maximum=MAX_BATCH, what=" (samples per batch, MAX_BATCH)")
        self._check_batch_memory()
        _pos_int("batches", self.batches, maximum=MAX_STEPS, what=" (MAX_STEPS)")
        if self.epochs is not None:
            _pos_int("epochs", self.epochs, maximum=MAX_EPOCHS, what=" (MAX_EPOCHS)")
        _pos_int("warmup", self.warmup, minimum=0, maximum=MAX_WARMUP, what=" (MAX_WARMUP)")
        _pos_int("repeats", self.repeats, maximum=MAX_REPEATS, what=" (MAX_REPEATS)")
        _pos_int("train_steps", self.train_steps, minimum=0, maximum=MAX_STEPS, what=" (MAX_STEPS)")
        if self.model is None:
            self.model = default_model(dev)
        if self.model not in MODELS:
            raise ConfigError(f"model must be one of {', '.join(MODELS)}, got {self.model!r}")
        if self.workers is None:
            self.workers = default_workers()
        if isinstance(self.workers, (str, bytes)) or not hasattr(self.workers, "__len__"):
            raise ConfigError(f"workers must be a non-empty list of ints in [0, {MAX_WORKERS}], got {self.workers!r}")
        if not self.workers or len(self.workers) > MAX_WORKER_VALUES or any(
            isinstance(w, bool) or not isinstance(w, int) or not 0 <= w <= MAX_WORKERS for w in self.workers
        ):
            raise ConfigError(
                f"workers must be a non-empty list of at most {MAX_WORKER_VALUES} ints in [0, {MAX_WORKERS}] "
                f"(num_workers values, MAX_WORKERS), got {reprlib.repr(self.workers)}"
            )
        self.workers = sorted(set(self.workers))
        if self.train_threads is not None:
            _pos_int("train_threads", self.train_threads, maximum=MAX_WORKERS, what=" (MAX_WORKERS)")
        elif dev == "cpu":
            self.train_threads = 1
        iv = self.sample_interval
        if isinstance(iv, bool) or not isinstance(iv, (int, float)) or not (MIN_INTERVAL <= iv <= MAX_INTERVAL):
            raise ConfigError(f"sample_interval must be seconds in [{MIN_INTERVAL}, {MAX_INTERVAL}], got {iv!r}")
        return self

    def batch_bytes(self) -> int:
        """Bytes of one float32 batch of this configuration: ``batch_size x 3 x crop x crop x 4``."""
        return int(self.batch_size) * 3 * int(self.crop) ** 2 * 4

    def _check_batch_memory(self) -> None:
        total = memory_bytes()
        need = self.batch_bytes()
        if total is not None and need > BATCH_MEMORY_SHARE * total:
            raise ConfigError(
                f"batch_size {self.batch_size} x crop {self.crop}x{self.crop}: one float32 batch is {_gb(need)}, more "
                f"than {BATCH_MEMORY_SHARE:.0%} of this machine's memory ({_gb(total)}; BATCH_MEMORY_SHARE); "
                "lower batch_size (--batch-size) or crop (--crop)"
            )

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)
