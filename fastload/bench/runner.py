"""Run the side-by-side benchmark: every loader on the same images, loader-only and in training.

:func:`run_bench` builds the loaders (:mod:`fastload.bench.loaders`), times them with
:mod:`fastload.bench.measure` as :class:`BenchConfig` says (:mod:`fastload.bench.config`),
shows progress, and writes the report (:mod:`fastload.bench.report`). Loader-only repeats
are interleaved across loaders so drift in the machine's load hits all of them alike.
Each loader's ``memory`` is this process's memory after its loader-only repeats (anonymous
RSS and file-backed pages apart, and the GPU's) and what its first repeat added: that is
when a loader allocates its buffers (DALI its pools). A ``DataLoader``'s workers are other
processes, not counted here.
"""

from __future__ import annotations

import dataclasses
import datetime as _dt
import io
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from ..errors import ConfigError
from .config import BenchConfig, default_workers
from .loaders import check_spec, default_loaders, loader_spec, resolve_images
from .measure import measure_loader, measure_training, memory_added, memory_snapshot, spread, warm_model

log = logging.getLogger(__name__)

# BenchConfig, the loader specs and the measurements live in config, loaders and measure;
# they stay importable from here, where the CLI and scripts import them.
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
    out_dir = Path(out) if out is not None else _default_out()
    out_dir.mkdir(parents=True, exist_ok=True)
    if progress is False:
        prog: Progress = _NoProgress()
    elif isinstance(progress, Progress):
        prog = progress
    else:
        prog = Progress()
    if loaders is None:
        src, note = resolve_images(dataset, images)
        notes.append(note)
        cache_dir = None
        if src is not None:  # the drop-in FastLoader(ImageFolder): its one-time pack, timed apart
            cache_dir = out_dir / "cache"
            notes.append(_prepack(src, cfg, cache_dir, prog))
        specs = default_loaders(dataset, src, cfg, cache_dir=cache_dir)
    else:
        src = str(images) if images is not None else None
        specs = [check_spec(s) for s in loaders]
    if not specs:
        raise ConfigError("no loaders to benchmark")
    names = [s["name"] for s in specs]
    if len(set(names)) != len(names):
        raise ConfigError(f"loader names must be unique, got {names}")

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


def _prepack(src: str, cfg: BenchConfig, cache_dir: Path, prog: Progress) -> str:
    """Pack ImageFolder(src) into the drop-in's cache once, before anything is timed; say how long it took."""
    from ..cache import cached_pack
    from .baselines import imagefolder_dataset

    prog.update(f"packing {src} for FastLoader(ImageFolder) (once, not timed)", force=True)
    t0 = time.perf_counter()
    cached_pack(imagefolder_dataset(src, cfg.crop), cache_dir=cache_dir, progress=False)
    return (
        f"FastLoader(ImageFolder): the one-time pack of {src} into {cache_dir} took "
        f"{time.perf_counter() - t0:.1f} s; its timings start after it, as a second run's would"
    )


def _fastload_version() -> str:
    from ..version import __version__

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
                    "memory": None,
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
                    before = memory_snapshot(cfg.device) if r == 0 else None
                    lo = measure_loader(loader, one, on_batch=on_batch)
                    after = memory_snapshot(cfg.device)
                except KeyboardInterrupt:
                    raise
                except Exception as e:
                    _fail(entry, e, tag, prog)
                    continue
                if before is not None:
                    entry["memory"] = {"added_first_repeat": memory_added(before, after)}
                if entry["memory"] is not None:
                    entry["memory"]["after"] = after
                runs[k - 1] += lo["images_per_s"]["runs"]
                if not extra[k - 1]:
                    extra[k - 1] = lo
        for k, (spec, loader) in enumerate(zip(specs, loaders), 1):
            entry = entries[k - 1]
            if loader is None or entry["error"]:
                continue
            tag = f"[{k}/{n}] {spec['name']}"
            lo = dict(extra[k - 1])
            lo["images_per_s"] = spread(runs[k - 1])
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
