"""Run the side-by-side benchmark: every loader on the same images, loader-only and in training.

Loaders are passed as named factories (``{"name", "kind", "make", "params"}``, see
:func:`loader_spec`), so the runner knows nothing of how any loader is built; the
default set (:func:`default_loaders`) is the torchvision ``ImageFolder`` baseline with
``num_workers`` swept, a ``DataLoader`` over the packed shards decoding with PIL, and
FastLoader on the chosen device.

For each loader:

* **loader only**: ``repeats`` runs, each starting a new epoch, ``warmup`` batches left
  out, then ``batches`` timed batches (moved to the device when the loader leaves them
  on the host); images/s median, min and max.
* **training**: a real model (:mod:`fastload.bench.models`) trained for ``train_steps``
  steps after ``warmup``, measured with :func:`fastload.profile`: images/s, the share of
  each step spent waiting for the next batch, GPU and CPU utilisation.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import io
import logging
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, TextIO

from ..errors import ConfigError, FastloadError

log = logging.getLogger(__name__)

__all__ = [
    "BenchConfig",
    "loader_spec",
    "default_loaders",
    "default_workers",
    "resolve_images",
    "run_bench",
    "measure_loader",
    "measure_training",
    "Progress",
]

KINDS = ("DataLoader", "FastLoader")


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


def loader_spec(name: str, kind: str, make: Callable[[], Iterable[Any]], **params: Any) -> dict[str, Any]:
    """A named loader factory: ``make()`` returns a fresh loader yielding ``(images, labels)``.

    ``kind`` is ``"DataLoader"`` (a baseline) or ``"FastLoader"``; ``params`` are recorded
    in the report (``num_workers``, ``source``, ``device``...).
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"loader name must be a non-empty string, got {name!r}")
    if kind not in KINDS:
        raise ConfigError(f"loader kind must be one of {KINDS}, got {kind!r} (loader {name!r})")
    if not callable(make):
        raise ConfigError(f"loader {name!r}: make must be a callable returning a loader, got {type(make).__name__}")
    return {"name": name, "kind": kind, "make": make, "params": dict(params)}


def _check_spec(spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict) or not {"name", "kind", "make"} <= set(spec):
        raise ConfigError(f"a loader must be a dict with name, kind and make (see loader_spec), got {spec!r}")
    return loader_spec(spec["name"], spec["kind"], spec["make"], **dict(spec.get("params") or {}))


# ----------------------------------------------------------------------------- images


_SOURCE_KEYS = ("source", "src", "source_path", "source_dir", "root", "images")


def resolve_images(dataset_path: str | os.PathLike, images: str | os.PathLike | None) -> tuple[str | None, str]:
    """The ImageFolder tree for the baseline: ``images`` if given, else the one the manifest records.

    Returns ``(path or None, note)``; the note says where the path came from or why the
    ImageFolder baseline is skipped.

    Raises:
        ConfigError: ``images`` was given but is not a directory.
    """
    if images is not None:
        if not os.path.isdir(images):
            raise ConfigError(f"--images {str(images)!r}: not a directory; give the unpacked ImageFolder tree")
        return str(images), f"ImageFolder baseline over {images}"
    from ..reader import read_manifest

    options = read_manifest(dataset_path).options or {}
    for k in _SOURCE_KEYS:
        v = options.get(k)
        if isinstance(v, str) and v:
            if os.path.isdir(v):
                return v, f"ImageFolder baseline over {v} (the source recorded in the manifest)"
            return None, (
                f"ImageFolder baseline skipped: the source recorded in the manifest ({v}) is not a directory "
                "here; pass --images SRC"
            )
    return None, "ImageFolder baseline skipped: no --images given and the manifest records no source folder"


# ----------------------------------------------------------------------------- loaders


def default_loaders(dataset: str | os.PathLike, images: str | None, cfg: BenchConfig) -> list[dict[str, Any]]:
    """ImageFolder DataLoaders (one per ``cfg.workers``), packed+PIL DataLoader, FastLoader."""
    from . import baselines

    specs: list[dict[str, Any]] = []
    bs, dev, crop, seed = cfg.batch_size, cfg.device, cfg.crop, cfg.seed
    assert cfg.workers  # validated
    if images is not None:
        for w in cfg.workers:
            specs.append(
                loader_spec(
                    f"DataLoader(ImageFolder, workers={w})",
                    "DataLoader",
                    lambda w=w: baselines.imagefolder_loader(images, bs, num_workers=w, device=dev, crop=crop, seed=seed),
                    source="imagefolder",
                    num_workers=w,
                    pin_memory=dev.startswith("cuda"),
                    persistent_workers=w > 0,
                )
            )
    w = max(cfg.workers)
    specs.append(
        loader_spec(
            f"DataLoader(packed+PIL, workers={w})",
            "DataLoader",
            lambda: baselines.packed_pil_loader(dataset, bs, num_workers=w, device=dev, crop=crop, seed=seed),
            source="packed-pil",
            num_workers=w,
            pin_memory=dev.startswith("cuda"),
            persistent_workers=w > 0,
        )
    )

    def make_fastloader() -> Iterable[Any]:
        from ..loader import FastLoader  # imported lazily: DALI is heavy

        return FastLoader(
            dataset, bs, shuffle=True, drop_last=False, train=True, crop=crop, device=dev, seed=seed
        )

    specs.append(loader_spec(f"FastLoader({dev})", "FastLoader", make_fastloader, source="fastload", device=dev))
    return specs


def _close_loader(loader: Any) -> None:
    """Release a loader's threads and worker processes now, not at garbage collection."""
    try:
        close = getattr(loader, "close", None)
        if callable(close):
            close()
            return
        it = getattr(loader, "_iterator", None)  # DataLoader with persistent workers
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()
            loader._iterator = None
    except Exception as e:  # pragma: no cover - clean-up is best effort
        log.debug("closing %r failed: %s", loader, e)


def _epochs(loader: Iterable[Any]) -> Iterator[Any]:
    """Batches of ``loader``, epoch after epoch (a new ``iter()`` at each end)."""
    while True:
        n = 0
        for batch in loader:
            n += 1
            yield batch
        if n == 0:
            raise FastloadError(f"{type(loader).__name__} yielded no batches (is the dataset empty?)")


def _num(batch: Any) -> int:
    x = batch[0] if isinstance(batch, (tuple, list)) else batch
    shape = getattr(x, "shape", None)
    if shape is None or not len(shape):
        raise FastloadError(f"a batch must be (images, labels) with images [B, ...]; got {type(x).__name__}")
    return int(shape[0])


def _to_device(batch: Any, device: Any) -> None:
    if device is None:
        return
    for t in batch if isinstance(batch, (tuple, list)) else (batch,):
        if getattr(t, "device", None) is not None and t.device != device:
            t.to(device, non_blocking=True)


def _spread(values: list[float]) -> dict[str, Any]:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "runs": list(values),
    }


def measure_loader(loader: Iterable[Any], cfg: BenchConfig, *, on_batch: Callable[[int, int, int], None] | None = None) -> dict[str, Any]:
    """Loader-only throughput: ``cfg.repeats`` runs, each a new epoch, warm-up batches left out.

    ``on_batch(repeat, done, total)`` is called after each timed batch (progress display).
    """
    torch_device, sync = _device_and_sync(cfg.device)
    runs: list[float] = []
    first_batch_s: float | None = None
    timed = None
    for r in range(cfg.repeats):
        stream = _epochs(loader)
        try:
            t_start = time.perf_counter()
            for i in range(cfg.warmup):
                batch = next(stream)
                if i == 0 and first_batch_s is None:
                    first_batch_s = time.perf_counter() - t_start
                _to_device(batch, torch_device)
            if timed is None:
                timed = cfg.batches if cfg.epochs is None else max(1, cfg.epochs * len(loader) - cfg.warmup)  # type: ignore[arg-type]
            sync()
            images = 0
            t0 = time.perf_counter()
            for i in range(timed):
                batch = next(stream)
                if first_batch_s is None:
                    first_batch_s = time.perf_counter() - t_start
                images += _num(batch)
                _to_device(batch, torch_device)
                if on_batch is not None:
                    on_batch(r, i + 1, timed)
            sync()
            dt = time.perf_counter() - t0
        finally:
            stream.close()
        runs.append(images / dt if dt > 0 else float("nan"))
    return {
        "images_per_s": _spread(runs),
        "batches_per_repeat": timed,
        "repeats": cfg.repeats,
        "warmup_batches": cfg.warmup,
        "first_batch_s": first_batch_s,
    }


def _device_and_sync(device: str) -> tuple[Any, Callable[[], None]]:
    if not str(device).startswith("cuda"):
        return None, lambda: None
    import torch

    dev = torch.device(device)
    return dev, (lambda: torch.cuda.synchronize(dev))


@contextlib.contextmanager
def _torch_threads(n: int | None) -> Iterator[None]:
    """Run with ``torch.set_num_threads(n)`` (no change for None), restoring the old value."""
    if n is None:
        yield
        return
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def measure_training(
    loader: Iterable[Any],
    cfg: BenchConfig,
    num_classes: int,
    *,
    name: str = "loader",
    on_step: Callable[[int, int], None] | None = None,
) -> dict[str, Any]:
    """Train ``cfg.model`` for ``cfg.warmup + cfg.train_steps`` steps on ``loader``; report via :func:`fastload.profile`."""
    from ..profile import profile
    from .models import TrainStep, build_model

    model = build_model(str(cfg.model), num_classes, cfg.device)
    step = TrainStep(model, cfg.device)
    total = cfg.warmup + cfg.train_steps
    # The profiler wraps the loader itself (so its suggestion knows the loader) and is
    # iterated epoch after epoch; its totals accumulate across epochs.
    prof = profile(loader, warmup=cfg.warmup, sample_interval=cfg.sample_interval, name=name, log_summary=False)
    loss = None
    done = 0
    try:
        with _torch_threads(cfg.train_threads):
            while done < total:
                before = done
                for images, labels in prof:
                    loss = step(images, labels)
                    done += 1
                    if on_step is not None:
                        on_step(done, total)
                    if done >= total:
                        break
                if done == before:
                    raise FastloadError(f"{name} yielded no batches (is the dataset empty?)")
    finally:
        prof.close()
    s = prof.stats()
    final_loss = float(loss.detach().float().item()) if loss is not None else None
    keep = (
        "steps", "warmup_steps", "samples", "images_per_s", "wait_fraction", "wait_ms", "compute_ms", "step_ms",
        "step_ms_p50", "step_ms_p90", "wait_ms_p50", "wait_ms_p90", "gpu_util", "cpu_util", "gpu_reason",
        "cpu_reason", "verdict", "suggestion",
    )  # fmt: skip
    out = {k: s[k] for k in keep}
    out.update(
        model=cfg.model, amp=step.amp, channels_last=step.cuda, torch_threads=cfg.train_threads, final_loss=final_loss
    )
    return out


def warm_model(cfg: BenchConfig, num_classes: int, steps: int = 2) -> None:
    """Train a throw-away model for ``steps`` steps on random data of the benchmark's shape.

    The first steps in a process pay one-time costs (oneDNN/cuDNN kernel selection,
    allocator growth); without this the first loader measured would pay them alone.
    """
    import torch

    from .models import TrainStep, build_model

    step = TrainStep(build_model(str(cfg.model), num_classes, cfg.device), cfg.device)
    x = torch.randn(cfg.batch_size, 3, cfg.crop, cfg.crop)
    y = torch.randint(0, num_classes, (cfg.batch_size,))
    with _torch_threads(cfg.train_threads):
        for _ in range(steps):
            step(x, y)
    if str(cfg.device).startswith("cuda"):
        torch.cuda.synchronize()


# ----------------------------------------------------------------------------- progress


class Progress:
    """A live one-line display on a stream (stderr): redrawn in place on a terminal, phase lines otherwise."""

    def __init__(self, stream: TextIO | None = None, *, live: bool | None = None, interval: float = 0.1) -> None:
        self.stream = stream if stream is not None else sys.stderr
        isatty = getattr(self.stream, "isatty", lambda: False)
        self.live = bool(isatty()) if live is None else live
        self.interval = interval
        self._last = 0.0
        self._width = 0

    def update(self, text: str, *, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now - self._last < self.interval:
            return
        self._last = now
        pad = max(0, self._width - len(text))
        self._width = len(text)
        self.stream.write("\r" + text + " " * pad)
        self.stream.flush()

    def line(self, text: str) -> None:
        """A permanent line (replaces the live one)."""
        if self.live and self._width:
            self.stream.write("\r" + " " * self._width + "\r")
            self._width = 0
        self.stream.write(text + "\n")
        self.stream.flush()


class _NoProgress(Progress):
    """No display; permanent lines go to the debug log."""

    def __init__(self) -> None:
        super().__init__(stream=io.StringIO(), live=False)

    def line(self, text: str) -> None:
        log.debug("%s", text)


# ----------------------------------------------------------------------------- the run


def _default_out() -> Path:
    return Path("reports") / _dt.datetime.now().strftime("%Y%m%d-%H%M%S")


def _check_device(device: str) -> None:
    if not str(device).startswith("cuda"):
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError(f"--device {device}: no CUDA device is available here; use --device cpu")
    idx = torch.device(device).index or 0
    if idx >= torch.cuda.device_count():
        raise ConfigError(f"--device {device}: only {torch.cuda.device_count()} CUDA device(s) exist")


def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {e}".splitlines()[0][:500]


def run_bench(
    dataset: str | os.PathLike,
    *,
    images: str | os.PathLike | None = None,
    out: str | os.PathLike | None = None,
    config: BenchConfig | None = None,
    loaders: list[dict[str, Any]] | None = None,
    progress: Progress | bool | None = None,
) -> dict[str, Any]:
    """Benchmark every loader on ``dataset`` and write ``report.md``, ``report.json``, ``report.png`` to ``out``.

    Args:
        dataset: a packed dataset directory (``fastload pack``).
        images: the unpacked ImageFolder tree for the baseline (default: the manifest's source, if recorded).
        out: output directory (default ``reports/<timestamp>/``).
        config: what to measure (default :class:`BenchConfig` ``()``).
        loaders: loader specs (:func:`loader_spec`) replacing :func:`default_loaders`.
        progress: a :class:`Progress`, True/None for one on stderr, False for none.

    Returns:
        The report dict (what ``report.json`` holds), with ``"files"`` naming the written files.

    A loader that fails to build or run is reported with its ``error``; the others still run.
    """
    from ..reader import Dataset
    from . import report as report_mod

    cfg = (config or BenchConfig()).validate()
    ds = Dataset(dataset)  # FormatError for a missing/foreign dataset: one readable line in the CLI
    _check_device(cfg.device)
    notes: list[str] = []
    if loaders is None:
        src, note = resolve_images(dataset, images)
        notes.append(note)
        specs = default_loaders(dataset, src, cfg)
    else:
        src = str(images) if images is not None else None
        specs = [_check_spec(s) for s in loaders]
    if not specs:
        raise ConfigError("no loaders to benchmark")
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"loader names must be unique, got {names}")
    if progress is False:
        prog: Progress = _NoProgress()
    elif isinstance(progress, Progress):
        prog = progress
    else:
        prog = Progress()
    out_dir = Path(out) if out is not None else _default_out()
    out_dir.mkdir(parents=True, exist_ok=True)

    num_classes = max(1, len(ds.classes))
    t_run = time.perf_counter()
    results: list[dict[str, Any]] = []
    prog.line(
        f"fastload bench: {len(specs)} loaders on {len(ds)} images ({ds.path}), device {cfg.device}, "
        f"batch {cfg.batch_size}, model {cfg.model}"
    )
    if cfg.train_steps > 0 and cfg.model != "none":
        prog.update(f"warming up {cfg.model} on {cfg.device}", force=True)
        warm_model(cfg, num_classes)
    results = _run_all(specs, cfg, num_classes, prog)
    elapsed = time.perf_counter() - t_run

    result: dict[str, Any] = {
        "fastload_version": _fastload_version(),
        "created": _dt.datetime.now().astimezone().isoformat(timespec="seconds"),
        "dataset": {
            "path": str(ds.path),
            "num_samples": len(ds),
            "classes": len(ds.classes),
            "stats": ds.manifest.stats,
        },
        "images": src,
        "config": cfg.to_json(),
        "machine": {},
        "versions": {},
        "loaders": results,
        "notes": notes,
        "elapsed_s": elapsed,
    }
    report_mod.add_environment(result)
    report_mod.summarise(result)
    result["files"] = report_mod.write_report(result, out_dir)
    prog.line(f"verdict: {result['verdict']}")
    return result


def _fastload_version() -> str:
    from .. import __version__

    return __version__


def _run_all(specs: list[dict[str, Any]], cfg: BenchConfig, num_classes: int, prog: Progress) -> list[dict[str, Any]]:
    """Build every loader, time them **interleaved** (repeat r of each loader, then repeat r+1),
    so that drift in the machine's background load hits all loaders alike; then run the
    training loop of each. A loader that fails is reported with its error; the others go on.
    """
    n = len(specs)
    entries: list[dict[str, Any]] = []
    loaders: list[Any] = []
    runs: list[list[float]] = [[] for _ in specs]
    extra: list[dict[str, Any]] = [{} for _ in specs]
    one = dataclasses.replace(cfg, repeats=1)
    try:
        for k, spec in enumerate(specs, 1):
            entries.append(
                {
                    "name": spec["name"],
                    "kind": spec["kind"],
                    "params": _jsonable(spec["params"]),
                    "create_s": None,
                    "loader_only": None,
                    "training": None,
                    "error": None,
                }
            )
            loader = None
            try:
                prog.update(f"[{k}/{n}] {spec['name']}: starting", force=True)
                t0 = time.perf_counter()
                loader = spec["make"]()
                entries[-1]["create_s"] = time.perf_counter() - t0
            except KeyboardInterrupt:
                raise
            except Exception as e:
                _fail(entries[-1], e, f"[{k}/{n}] {spec['name']}", prog)
            loaders.append(loader)
        for r in range(cfg.repeats):
            for k, (spec, loader) in enumerate(zip(specs, loaders), 1):
                entry = entries[k - 1]
                if loader is None or entry["error"]:
                    continue
                tag = f"[{k}/{n}] {spec['name']}"

                def on_batch(_r: int, done: int, total: int, tag: str = tag) -> None:
                    prog.update(f"{tag}: loader only, repeat {r + 1}/{cfg.repeats}, batch {done}/{total}")

                try:
                    lo = measure_loader(loader, one, on_batch=on_batch)
                except KeyboardInterrupt:
                    raise
                except Exception as e:
                    _fail(entry, e, tag, prog)
                    continue
                runs[k - 1] += lo["images_per_s"]["runs"]
                if not extra[k - 1]:
                    extra[k - 1] = lo
        for k, (spec, loader) in enumerate(zip(specs, loaders), 1):
            entry = entries[k - 1]
            if loader is None or entry["error"]:
                continue
            tag = f"[{k}/{n}] {spec['name']}"
            lo = dict(extra[k - 1])
            lo["images_per_s"] = _spread(runs[k - 1])
            lo["repeats"] = cfg.repeats
            entry["loader_only"] = lo
            prog.line(
                f"{tag}: loader only {lo['images_per_s']['median']:,.0f} images/s "
                f"(min {lo['images_per_s']['min']:,.0f}, max {lo['images_per_s']['max']:,.0f}; batch {cfg.batch_size})"
            )
            if cfg.train_steps > 0 and cfg.model != "none":

                def on_step(done: int, total: int, tag: str = tag) -> None:
                    prog.update(f"{tag}: training {cfg.model}, step {done}/{total}")

                try:
                    entry["training"] = tr = measure_training(loader, cfg, num_classes, name=spec["name"], on_step=on_step)
                except KeyboardInterrupt:
                    raise
                except Exception as e:
                    _fail(entry, e, tag, prog)
                    continue
                prog.line(
                    f"{tag}: training {_f(tr['images_per_s'], ',.0f')} images/s, waiting "
                    f"{_pct(tr['wait_fraction'])} of each step ({tr['verdict']})"
                )
    finally:
        for loader in loaders:
            if loader is not None:
                _close_loader(loader)
    return entries


def _fail(entry: dict[str, Any], e: BaseException, tag: str, prog: Progress) -> None:
    entry["error"] = _error_text(e)
    log.debug("loader %s failed", entry["name"], exc_info=True)
    prog.line(f"{tag}: FAILED: {entry['error']}")


def _f(v: Any, spec: str) -> str:
    return "?" if v is None else format(v, spec)


def _pct(v: Any) -> str:
    return "?" if v is None else f"{v:.0%}"


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in d.items():
        out[str(k)] = v if isinstance(v, (str, int, float, bool, type(None), list)) else str(v)
    return out
