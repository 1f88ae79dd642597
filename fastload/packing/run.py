"""``pack`` and ``pack_dataset``: options, the main loop from source to shards, progress, result.

How a pack runs:

1. The source (:mod:`fastload.packing.sources`) yields tasks in sample order.
2. Each image becomes its record value (:mod:`fastload.packing.images`): plain JPEG
   files on a fast path in this process, everything else decoded in worker processes
   (:mod:`fastload.packing.workers`), results in source order.
3. The records go in source order into LMDB shards (:mod:`fastload.packing.shards`)
   with fixed transaction batching, so the files are byte-identical whatever the
   number of workers.
4. Everything is written into ``OUT.partial``, with ``journal.json``
   (:mod:`fastload.packing.journal`) after every shard; at the end come
   ``labels.bin``, then ``manifest.json``, then the rename to ``OUT``
   (:mod:`fastload.packing.outdir`). ``resume=True`` continues an interrupted pack.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import re
import shutil
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import BadImageError, ConfigError, PackError
from ..format import FORMAT_VERSION, ShardInfo, decode_header, json_path
from ..store import HeaderStats
from .images import ImageOptions
from .journal import JOURNAL_NAME, Journal
from .outdir import PARTIAL_SUFFIX, check_out, finalize, prepare_partial
from .shards import ShardWriter, write_error
from .sources import DatasetSource, FileSource, Source, open_source
from .workers import Results

try:
    import lmdb
except ImportError as e:  # pragma: no cover
    lmdb = None
    _lmdb_error = e

log = logging.getLogger(__name__)

_UNITS = {
    "": 1, "b": 1,
    "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tib": 1 << 40,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
}  # fmt: skip


# ============================================================================ options


def parse_size(value: Any, *, name: str = "shard_size (--shard-size)") -> int:
    """Parse a byte count: an int, or a string like ``"1GB"``, ``"512MB"``, ``"64KiB"``, ``"1.5G"``.

    ``KB/MB/GB/TB`` are powers of 1000, ``KiB/MiB/GiB/TiB`` and bare ``K/M/G/T`` powers of 1024.

    Raises:
        ConfigError: the value is not a positive size.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name}: {value!r} is not a size; use e.g. 1GB, 512MB, 64KiB or a byte count")
    if isinstance(value, (int, np.integer)):
        n = int(value)
    else:
        m = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-zA-Z]*)\s*", str(value))
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ConfigError(f"{name}: cannot parse {value!r}; use e.g. 1GB, 512MB, 64KiB or a byte count")
        n = int(float(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ConfigError(f"{name}: {value!r} must be a positive size")
    return n



def _int_option(value: Any, name: str, lo: int, hi: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < lo or (hi is not None and value > hi):
        rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
        raise ConfigError(f"{name}: expected an integer {rng}, got {value!r}")
    return int(value)


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)



# ============================================================================ progress


class Progress:
    """A small progress bar on stderr (TTY), or a log line every 10 s otherwise."""

    def __init__(self, total: int, done: int, enabled: bool) -> None:
        self.total = total
        self.start_done = done
        self.enabled = enabled
        stream = sys.stderr
        self.tty = enabled and hasattr(stream, "isatty") and stream.isatty()
        self.interval = 0.2 if self.tty else 10.0
        self.t0 = time.monotonic()
        self.last = self.t0
        self.drawn = False

    def update(self, done: int, nbytes: int) -> None:
        if not self.enabled:
            return
        now = time.monotonic()
        if now - self.last < self.interval:
            return
        self.last = now
        dt = max(now - self.t0, 1e-9)
        rate = (done - self.start_done) / dt
        pct = 100.0 * done / self.total if self.total else 100.0
        eta = (self.total - done) / rate if rate > 0 else 0.0
        line = f"packing {done}/{self.total} {pct:5.1f}% | {rate:,.0f} img/s | {nbytes / dt / 1e6:,.1f} MB/s | ETA {eta:,.0f} s"
        if self.tty:
            width = 30
            fill = int(width * done / self.total) if self.total else width
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {line} ")
            sys.stderr.flush()
            self.drawn = True
        else:
            log.info("%s", line)

    def close(self) -> None:
        if self.drawn:
            sys.stderr.write("\r\033[K")
            sys.stderr.flush()
            self.drawn = False


# ============================================================================ pack


@dataclasses.dataclass
class PackResult:
    """What :func:`pack` wrote."""

    path: Path
    num_samples: int
    num_classes: int
    num_shards: int
    bytes: int
    skipped: list[dict[str, str]]
    seconds: float

    def summary(self) -> str:
        """The one-line summary the CLI prints."""
        return (
            f"packed {self.num_samples} images, {self.num_classes} classes, {self.num_shards} shards, "
            f"{self.bytes / 1e6:.1f} MB, {len(self.skipped)} skipped, {self.seconds:.1f} s -> {self.path}"
        )

    def __str__(self) -> str:
        return self.summary()





def _options_json(shard_size: int, opts: ImageOptions) -> dict[str, Any]:
    return {
        "shard_size": shard_size,
        "max_size": opts.max_size,
        "quality": opts.quality,
        "baseline": opts.baseline,
        "max_pixels": opts.max_pixels,
        "format_version": FORMAT_VERSION,
    }



def _run(
    source: Source,
    out: str | os.PathLike,
    *,
    workers: int | None,
    shard_size: Any,
    on_error: str,
    overwrite: bool,
    resume: bool,
    max_size: int | None,
    quality: int,
    baseline: bool,
    max_pixels: int,
    progress: bool,
) -> PackResult:
    t0 = time.monotonic()
    if lmdb is None:  # pragma: no cover
        from ..errors import DependencyError

        raise DependencyError(f"lmdb is not importable ({_lmdb_error}); pip install lmdb")
    size = parse_size(shard_size)
    nworkers = _default_workers() if workers is None else _int_option(workers, "workers (--workers)", 1)
    if on_error not in ("skip", "fail"):
        raise ConfigError(f"on_error (--on-error): expected 'skip' or 'fail', got {on_error!r}")
    opts = ImageOptions(
        max_size=None if max_size is None else _int_option(max_size, "max_size (--max-size)", 1),
        quality=_int_option(quality, "quality (--quality)", 1, 100),
        baseline=bool(baseline),
        max_pixels=_int_option(max_pixels, "max_pixels (--max-pixels)", 1),
    )
    out_p = Path(out)
    if not out_p.name or out_p.name in (".", ".."):
        raise ConfigError(f"OUT {out!r}: needs a directory name (like data/packed)")
    if isinstance(source, FileSource) and source.kind == "folder":
        try:
            inside = out_p.resolve().is_relative_to(Path(source.description).resolve())
        except OSError:  # pragma: no cover
            inside = False
        if inside:
            raise ConfigError(f"OUT {out_p} is inside SRC {source.description}; write the packed dataset elsewhere")
    check_out(out_p, overwrite)
    partial = out_p.with_name(out_p.name + PARTIAL_SUFFIX)

    options = _options_json(size, opts)
    stats = HeaderStats()
    journal = prepare_partial(
        partial, Journal(json_path(source.description), source.fingerprint(), options), resume, overwrite, stats
    )
    skipped = journal.skipped
    start = journal.position
    first_index = sum(int(s["count"]) for s in journal.shards)

    def on_shard(info: ShardInfo, end: int, nskipped: int) -> None:  # runs in the writer's background thread
        journal.shards.append({**info.to_json(), "end": end, "skipped": nskipped})
        try:
            journal.save(partial, skipped=skipped[:nskipped])
        except OSError as e:
            raise write_error(partial / JOURNAL_NAME, e, f"cannot record {info.file}") from None

    writer = ShardWriter(
        partial, shard_size=size, first_shard=len(journal.shards), first_index=first_index,
        on_shard=on_shard, snapshot=lambda: len(skipped),
    )  # fmt: skip
    bar = Progress(len(source), start, progress)
    results = None
    nbytes = 0
    try:
        try:
            results = Results(source.tasks(start), opts, nworkers)
            pos = start
            for pos, res in enumerate(results, start):
                if isinstance(res, tuple):
                    _tag, where, reason = res
                    if on_error == "fail":
                        raise BadImageError(where, reason)
                    skipped.append({"path": json_path(where), "reason": reason})
                    log.debug("skipped %s: %s", where, reason)
                else:
                    stats.add(decode_header(res))
                    writer.add(res, pos)
                    nbytes += len(res)
                bar.update(pos + 1, nbytes)
            writer.close(len(source))
        finally:
            bar.close()
            if results is not None:
                results.close()
        n = len(stats.labels)
        if n == 0:
            shutil.rmtree(partial, ignore_errors=True)
            first = f"; the first: {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
            raise PackError(f"nothing packed: all {len(skipped)} images were refused{first}")
        manifest = finalize(partial, out_p, source, stats, journal, options, on_error, overwrite)
    except (BadImageError, ConfigError):  # --on-error fail, or a dataset with bad labels: nothing to resume
        writer.abort()
        shutil.rmtree(partial, ignore_errors=True)
        raise
    except BaseException as e:
        writer.abort()
        if partial.exists():  # a PackError says so itself: the CLI prints one line
            level = logging.DEBUG if isinstance(e, PackError) else logging.WARNING
            log.log(level, "pack stopped (%s); the unfinished pack is in %s: continue it with --resume", type(e).__name__, partial)
        raise
    result = PackResult(
        path=out_p,
        num_samples=manifest.num_samples,
        num_classes=len(manifest.classes),
        num_shards=len(manifest.shards),
        bytes=sum(s.bytes for s in manifest.shards),
        skipped=list(manifest.skipped),
        seconds=time.monotonic() - t0,
    )
    log.debug("%s", result.summary())
    return result



_COMMON_DOC = """
    Args:
        workers: processes validating/encoding images (default: all cores); the output
            is byte-identical for any value.
        shard_size: the largest shard file, as bytes or a string like ``"1GB"``, ``"64KiB"``.
        on_error: ``"skip"`` refused images (listed in the manifest's ``skipped``) or
            ``"fail"`` at the first one with :class:`BadImageError`, leaving nothing behind.
        overwrite: replace an existing OUT (only a fastload dataset) and any unfinished pack.
        resume: continue an interrupted pack in ``OUT.partial``, reusing its finished shards.
        max_size: shrink images whose longer side exceeds this many pixels (re-encoded).
        quality: JPEG quality of every re-encoded image.
        baseline: re-encode progressive JPEGs as baseline (GPU hardware decoders need it).
        max_pixels: refuse images with more pixels than this (decompression bombs).
        progress: show a progress bar on stderr (a log line every 10 s when not a TTY).

    Returns:
        :class:`PackResult` (path, num_samples, num_classes, num_shards, bytes, skipped, seconds).

    Raises:
        ConfigError: a bad option, an existing OUT without ``overwrite``, an unfinished
            pack without ``resume``/``overwrite``, or a resume with other source/options.
        BadImageError: ``on_error="fail"`` and an image was refused.
        PackError: writing failed (disk full, ...); the unfinished pack can be resumed.
"""


def pack(
    src: str | os.PathLike,
    out: str | os.PathLike,
    *,
    workers: int | None = None,
    shard_size: int | str = "1GB",
    on_error: str = "skip",
    overwrite: bool = False,
    resume: bool = False,
    max_size: int | None = None,
    quality: int = 95,
    baseline: bool = False,
    max_pixels: int = 89_478_485,
    progress: bool = True,
) -> PackResult:
    """Pack an ImageFolder tree or a list file (``path,label`` rows) into ``out``.

    Samples and classes are in torchvision ``ImageFolder`` order. JPEGs are stored
    byte for byte; other images become RGB JPEGs (see ``docs/format.md``).
    """
    source = open_source(src)
    return _run(
        source, out, workers=workers, shard_size=shard_size, on_error=on_error, overwrite=overwrite, resume=resume,
        max_size=max_size, quality=quality, baseline=baseline, max_pixels=max_pixels, progress=progress,
    )  # fmt: skip


def pack_dataset(
    dataset: Any,
    out: str | os.PathLike,
    *,
    classes: Sequence[str] | None = None,
    workers: int | None = None,
    shard_size: int | str = "1GB",
    on_error: str = "skip",
    overwrite: bool = False,
    resume: bool = False,
    max_size: int | None = None,
    quality: int = 95,
    baseline: bool = False,
    max_pixels: int = 89_478_485,
    progress: bool = True,
) -> PackResult:
    """Pack a map-style dataset of ``(image, label)`` items into ``out``.

    ``image`` is a PIL image, an HxW / HxWx3 (or x1, x4) uint8 array or encoded bytes;
    ``label`` an int. Items are fetched in index order in this process. ``classes``
    defaults to ``dataset.classes`` if present, else ``"0" .. str(max label)``. An item
    whose fetch raises is a refused image (skipped or failed per ``on_error``).
    """
    source = DatasetSource(dataset, classes)
    return _run(
        source, out, workers=workers, shard_size=shard_size, on_error=on_error, overwrite=overwrite, resume=resume,
        max_size=max_size, quality=quality, baseline=baseline, max_pixels=max_pixels, progress=progress,
    )  # fmt: skip


pack.__doc__ = (pack.__doc__ or "") + _COMMON_DOC
pack_dataset.__doc__ = (pack_dataset.__doc__ or "") + _COMMON_DOC

__all__ = ["pack", "pack_dataset", "PackResult", "parse_size", "Progress"]
