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

import collections.abc
import dataclasses
import fractions
import json
import logging
import math
import operator
import os
import re
import reprlib
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from ..errors import BadImageError, ConfigError, PackError, printable
from ..fields import decode_block
from ..format import FIELDS_FORMAT_VERSION, FORMAT_VERSION, Manifest, ShardInfo, decode_header, json_path, record_fields, with_field_block
from ..remote.url import is_url
from ..store import HeaderStats, iter_records, open_shard_readonly
from .images import ImageOptions
from .journal import JOURNAL_NAME, Journal
from .outdir import PARTIAL_SUFFIX, SourceGuard, check_out, discard_partial, finalize, prepare_partial
from .shards import ShardWriter, write_error
from .samples import DictDatasetSource, FieldSource
from .sources import DatasetSource, Source, open_source
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


#: The smallest shard size: below it every record gets a shard of its own anyway, and a
#: value like ``--shard-size 1`` is almost surely a unit mistake (1 byte, not 1 GB).
MIN_SHARD_SIZE = 1000
#: The largest shard size (1 TiB): LMDB maps a shard whole, in a map 1.25 times its size.
MAX_SHARD_SIZE = 1 << 40
#: The largest ``max_size``: a stored JPEG's sides are 16-bit.
MAX_SIDE = 65535
#: The largest ``max_pixels``: the most pixels a stored JPEG can have.
MAX_PIXELS = MAX_SIDE * MAX_SIDE
#: Worker processes per usable CPU core at most (``workers`` above that is capped).
WORKERS_PER_CORE = 4
#: Characters refused in OUT: C0/C1 controls (ESC starts terminal escapes), line and paragraph
#: separators, bidirectional overrides.
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")
_NUMBER = re.compile(r"\s*([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))\s*([a-zA-Z]*)\s*", re.ASCII)


def parse_size(value: Any, *, name: str = "shard_size (--shard-size)") -> int:
    """Parse a byte count: an int, or a string like ``"1GB"``, ``"512MB"``, ``"64KiB"``, ``"1.5G"``.

    ``KB/MB/GB/TB`` are powers of 1000, ``KiB/MiB/GiB/TiB`` and bare ``K/M/G/T`` powers of 1024.
    Any integer type is accepted (``numpy.int64``, a 0-d integer tensor: ``operator.index``);
    digits are ASCII digits only, and a fraction is rounded down to whole bytes.

    Raises:
        ConfigError: the value is not a positive size.
    """
    hint = "use e.g. 1GB, 512MB, 64KiB or a byte count"
    if _is_bool(value):
        raise ConfigError(f"{name}: {reprlib.repr(value)} is not a size; {hint}")
    if isinstance(value, str):
        m = _NUMBER.fullmatch(value)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS or len(m.group(1)) > 40:
            raise ConfigError(f"{name}: cannot parse {reprlib.repr(value)}; {hint}")
        n = int(fractions.Fraction(m.group(1)) * _UNITS[unit])
    else:
        try:
            n = operator.index(value)
        except Exception:  # TypeError, or an __index__ failing otherwise: not an integer
            n = None
        if n is None:
            if not isinstance(value, (float, np.floating)) or not math.isfinite(value) or value != int(value):
                raise ConfigError(f"{name}: cannot parse {reprlib.repr(value)}; {hint}")
            n = int(value)
    if n <= 0:
        raise ConfigError(f"{name}: {reprlib.repr(value)} must be a positive size")
    return n


def _shard_size(value: Any) -> int:
    name = "shard_size (--shard-size)"
    n = parse_size(value, name=name)
    if n < MIN_SHARD_SIZE:
        raise ConfigError(
            f"{name}: {reprlib.repr(value)} is {n} bytes, below the smallest shard size ({MIN_SHARD_SIZE} bytes); "
            "use e.g. 1GB or 256MB"
        )
    if n > MAX_SHARD_SIZE:
        raise ConfigError(
            f"{name}: {reprlib.repr(value)} is {n} bytes, above the largest shard size (1TiB = {MAX_SHARD_SIZE} bytes); "
            "use e.g. 1GB"
        )
    return n


def _is_bool(value: Any) -> bool:
    """A Python, NumPy or torch boolean: never taken for an integer or a size."""
    return isinstance(value, (bool, np.bool_)) or str(getattr(value, "dtype", "")) in ("bool", "torch.bool")


def _int_option(value: Any, name: str, lo: int, hi: int | None = None, *, limit: int | None = None, why: str = "") -> int:
    """An integer option through ``operator.index`` (any integer type; never a bool or a float).

    ``lo..hi`` is the range the message states; ``limit`` (with ``why``) an extra upper bound.
    """
    rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
    bad = ConfigError(f"{name}: expected an integer {rng}, got {reprlib.repr(value)}")
    if _is_bool(value):
        raise bad
    try:
        n = operator.index(value)
    except Exception:  # TypeError, or an __index__ (a tensor of many elements) failing otherwise
        raise bad from None
    if n < lo or (hi is not None and n > hi):
        raise bad
    if limit is not None and n > limit:
        raise ConfigError(f"{name}: {n} is more than {limit}{why}")
    return int(n)


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name}: expected True or False, got {reprlib.repr(value)}")
    return bool(value)


def _default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # pragma: no cover - not Linux
        return max(1, os.cpu_count() or 1)


def _worker_count(requested: int | None, tasks: int) -> int:
    """The pool size: ``requested`` (default: the usable cores), capped at ``tasks`` and
    at :data:`WORKERS_PER_CORE` per usable core; the output does not depend on it."""
    cores = _default_workers()
    if requested is None:
        return max(1, min(cores, tasks))
    cap = WORKERS_PER_CORE * cores
    if requested > cap:
        log.info("workers (--workers): %d is more than %d per usable core; using %d", requested, WORKERS_PER_CORE, cap)
    return max(1, min(requested, cap, tasks))


def _out_path(out: Any) -> Path:
    if isinstance(out, bytes):
        out = os.fsdecode(out)
    try:
        p = Path(out)
    except TypeError:
        raise ConfigError(f"OUT: expected a directory path, got {type(out).__name__} {reprlib.repr(out)}") from None
    s = os.fspath(p)
    bad = _CONTROL.search(s)
    if bad:
        raise ConfigError(
            f"OUT {printable(s)}: the path holds a control character ({printable(bad.group())}); choose a name without one"
        )
    if not p.name or p.name in (".", ".."):
        raise ConfigError(f"OUT {s!r}: needs a directory name (like data/packed)")
    return p


@dataclasses.dataclass(frozen=True)
class _Settings:
    """Every option of a pack, checked before anything is read or written."""

    out: Path
    workers: int | None
    shard_size: int
    on_error: str
    overwrite: bool
    resume: bool
    image: ImageOptions
    progress: bool
    url: str | None = None  # OUT was a URL: packed into a staging directory (``out``), then uploaded
    storage_options: Any = None


def _settings(
    out: Any,
    *,
    workers: Any,
    shard_size: Any,
    on_error: Any,
    overwrite: Any,
    resume: Any,
    max_size: Any,
    quality: Any,
    baseline: Any,
    max_pixels: Any,
    progress: Any,
    pil_loader: bool = False,
    storage_options: Any = None,
) -> _Settings:
    if lmdb is None:  # pragma: no cover
        from ..errors import DependencyError

        raise DependencyError(f"lmdb is not importable ({_lmdb_error}); pip install lmdb")
    size = _shard_size(shard_size)
    nworkers = None if workers is None else _int_option(workers, "workers (--workers)", 1)
    if not isinstance(on_error, str) or on_error not in ("skip", "fail"):
        raise ConfigError(f"on_error (--on-error): expected 'skip' or 'fail', got {reprlib.repr(on_error)}")
    opts = ImageOptions(
        max_size=None if max_size is None else _int_option(
            max_size, "max_size (--max-size)", 1, limit=MAX_SIDE, why=", the longest side a stored JPEG can have; leave it unset for no limit"
        ),
        quality=_int_option(quality, "quality (--quality)", 1, 100),
        baseline=_flag(baseline, "baseline (--baseline)"),
        max_pixels=_int_option(
            max_pixels, "max_pixels (--max-pixels)", 1, limit=MAX_PIXELS, why=f" ({MAX_SIDE}x{MAX_SIDE}), the most pixels a stored JPEG can have"
        ),
        pil_loader=bool(pil_loader),
    )  # fmt: skip
    url = None
    if is_url(out):
        from ..remote.upload import staging_root
        from ..remote.url import parse_url

        url = str(parse_url(out))
        out = staging_root(url) / "dataset"  # the source's own staging copy is chosen when the pack starts
    elif storage_options is not None:
        raise ConfigError("storage_options: only for an OUT that is a URL (s3://bucket/prefix)")
    return _Settings(
        url=url,
        storage_options=storage_options,
        out=_out_path(out),
        workers=nworkers,
        shard_size=size,
        on_error=on_error,
        overwrite=_flag(overwrite, "overwrite (--overwrite)"),
        resume=_flag(resume, "resume (--resume)"),
        image=opts,
        progress=_flag(progress, "progress (--no-progress)"),
    )


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
    url: str | None = None  #: where it was uploaded (``path`` is then the local staging copy, deleted)

    def summary(self) -> str:
        """The one-line summary the CLI prints."""
        return (
            f"packed {self.num_samples} images, {self.num_classes} classes, {self.num_shards} shards, "
            f"{self.bytes / 1e6:.1f} MB, {len(self.skipped)} skipped, {self.seconds:.1f} s -> {self.url or self.path}"
        )

    def __str__(self) -> str:
        return self.summary()





def _options_json(shard_size: int, opts: ImageOptions, fields: bool = False) -> dict[str, Any]:
    d = {
        "shard_size": shard_size,
        "max_size": opts.max_size,
        "quality": opts.quality,
        "baseline": opts.baseline,
        "max_pixels": opts.max_pixels,
        "format_version": FIELDS_FORMAT_VERSION if fields else FORMAT_VERSION,
    }
    if opts.pil_loader:  # only then: every other pack's options (and journals) stay as they were
        d["pixels"] = PIL_LOADER_PIXELS
    return d


#: ``options.pixels`` of a pack made by :func:`pack_like_pil_loader`.
PIL_LOADER_PIXELS = "torchvision pil_loader"



def _run(source: Source, settings: _Settings) -> PackResult:
    if settings.url is not None:
        return _run_to_url(source, settings)
    t0 = time.monotonic()
    out_p = settings.out
    partial = out_p.with_name(out_p.name + PARTIAL_SUFFIX)
    guard = SourceGuard(source)
    guard.check(out_p, "OUT")
    guard.check(partial, f"OUT {printable(os.fspath(out_p))}: the unfinished pack")
    check_out(out_p, settings.overwrite)

    options = _options_json(settings.shard_size, settings.image, isinstance(source, FieldSource) and not source.schema.plain)
    options.update(getattr(source, "manifest_options", None) or {})  # a converter's own record (pack_coco: options.coco)
    stats = HeaderStats()
    journal, lock = prepare_partial(
        partial, out_p, Journal(json_path(source.description), source.fingerprint(), options),
        settings.resume, settings.overwrite, stats, guard,
    )  # fmt: skip
    try:
        manifest = _write(source, settings, partial, journal, stats, options, guard)
    finally:
        lock.release()
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


def _run_to_url(source: Source, settings: _Settings) -> PackResult:
    """Pack into the staging directory, then upload it to ``settings.url`` (fastload.remote.upload)."""
    from ..reader import read_manifest
    from ..remote.upload import pack_to_url

    t0 = time.monotonic()

    def run_local(staging: Path, mode: str) -> PackResult:
        mark = staging.parent / "source.sha256"  # what the staging copy is packed from
        if mode != "reuse":
            mark.parent.mkdir(parents=True, exist_ok=True)
            mark.write_text(source.fingerprint())
            local = dataclasses.replace(settings, url=None, out=staging, resume=mode == "resume", overwrite=True)
            return _run(source, local)
        if not mark.is_file() or mark.read_text() != source.fingerprint():
            raise ConfigError(
                f"cannot resume the upload to {settings.url}: its finished staging copy {printable(str(staging))} was "
                "packed from another source (or the source changed since); resume with the same SRC, or pack again "
                "without --resume"
            )
        m = read_manifest(staging)
        return PackResult(path=staging, num_samples=m.num_samples, num_classes=len(m.classes), num_shards=len(m.shards),
                          bytes=sum(s.bytes for s in m.shards), skipped=list(m.skipped), seconds=0.0)  # fmt: skip

    # the staging copy is the source's and the options' own: another source's is never found, uploaded or deleted
    key = json.dumps([source.fingerprint(), settings.shard_size, repr(settings.image), settings.on_error])
    res, stats = pack_to_url(settings.url, run_local, source_key=key, source=source.description,
                             overwrite=settings.overwrite, resume=settings.resume, storage_options=settings.storage_options)  # fmt: skip
    log.info("uploaded %d files (%d bytes), %d already there", stats["uploaded"], stats["bytes"], stats["kept"])
    return dataclasses.replace(res, url=settings.url, seconds=time.monotonic() - t0)


def _write(
    source: Source,
    settings: _Settings,
    partial: Path,
    journal: Journal,
    stats: HeaderStats,
    options: dict[str, Any],
    guard: SourceGuard,
) -> Manifest:
    """The main loop into the locked ``partial``, then :func:`finalize`; returns the manifest."""
    opts, on_error = settings.image, settings.on_error
    skipped = journal.skipped
    start = journal.position
    first_index = sum(int(s["count"]) for s in journal.shards)
    nworkers = _worker_count(settings.workers, len(source) - start)

    def on_shard(info: ShardInfo, end: int, nskipped: int) -> None:  # runs in the writer's background thread
        journal.shards.append({**info.to_json(), "end": end, "skipped": nskipped})
        try:
            journal.save(partial, skipped=skipped[:nskipped])
        except OSError as e:
            raise write_error(partial / JOURNAL_NAME, e, f"cannot record {info.file}") from None

    writer = ShardWriter(
        partial, shard_size=settings.shard_size, first_shard=len(journal.shards), first_index=first_index,
        on_shard=on_shard, snapshot=lambda: len(skipped),
    )  # fmt: skip
    bar = Progress(len(source), start, settings.progress)
    fielded = isinstance(source, FieldSource) and not source.schema.plain
    if fielded and journal.shards:  # a resumed pack: the kept shards' fields count in the statistics
        _count_kept_fields(source, partial, journal)
    results = None
    nbytes = 0
    try:
        try:
            results = Results(source.tasks(start), opts, nworkers)
            pos = start
            for pos, res in enumerate(results, start):
                block = source.take_block(pos) if fielded else None  # type: ignore[attr-defined]
                if isinstance(res, tuple):
                    _tag, where, reason = res
                    if on_error == "fail":
                        raise BadImageError(where, reason)
                    skipped.append({"path": json_path(where), "reason": reason})
                    log.debug("skipped %s: %s", where, reason)
                else:
                    if block is not None:
                        res = with_field_block(res, block)
                        source.field_stats.add(decode_block(source.schema.stored, block, check=False))  # type: ignore[attr-defined]
                    stats.add(decode_header(res))
                    writer.add(res, pos)
                    nbytes += len(res)
                bar.update(pos + 1, nbytes)
            writer.close(len(source))
        finally:
            bar.close()
            if results is not None:
                results.close()
        if len(stats.labels) == 0:
            first = f"; the first: {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
            raise _NothingPacked(f"nothing packed: all {len(skipped)} images were refused{first}")
    except (BadImageError, ConfigError, _NothingPacked) as e:  # --on-error fail, a dataset with bad labels: nothing to resume
        writer.abort()
        discard_partial(partial)  # fastload's own files only, then the directory if that emptied it
        if isinstance(e, _NothingPacked):
            raise PackError(str(e)) from None
        raise
    except BaseException as e:
        writer.abort()
        _log_stopped(e, partial)
        raise
    try:
        return finalize(partial, settings.out, source, stats, journal, options, on_error, settings.overwrite, guard)
    except BaseException as e:  # nothing is deleted: the finished pack is resumable
        _log_stopped(e, partial)
        raise


def _count_kept_fields(source: FieldSource, partial: Path, journal: Journal) -> None:
    """Add the fields of the shards a resumed pack keeps to ``source.field_stats``."""
    stored = source.schema.stored
    for s in journal.shards:
        p = str(partial / s["file"])
        with open_shard_readonly(p) as scan:
            for _i, v in iter_records(scan, p):
                value = bytes(v)
                source.field_stats.add(decode_block(stored, record_fields(value, decode_header(value, where=p)), where=p))


class _NothingPacked(Exception):
    """Every image was refused: the unfinished pack is discarded."""


def _log_stopped(e: BaseException, partial: Path) -> None:
    if os.path.isdir(partial):  # a PackError says so itself: the CLI prints one line
        level = logging.DEBUG if isinstance(e, PackError) else logging.WARNING
        log.log(level, "pack stopped (%s); the unfinished pack is in %s: continue it with --resume", type(e).__name__, printable(os.fspath(partial)))


_COMMON_DOC = """
    Every option is checked before anything is read or written; a bad one is a
    :class:`ConfigError` naming it. Integer options take any integer type
    (``numpy.int64``, a 0-d integer tensor: anything ``operator.index`` accepts), never
    a bool or a float; the flags take ``True`` or ``False`` only.

    Args:
        workers: processes validating/encoding images (default: all usable cores); the
            output is byte-identical for any value. The pool is capped, not refused, at
            the number of images left to pack and at 4 processes per usable core.
        shard_size: the largest shard file, as bytes or a string like ``"1GB"``, ``"64KiB"``;
            1000 bytes to 1 TiB.
        on_error: ``"skip"`` refused images (listed in the manifest's ``skipped``) or
            ``"fail"`` at the first one with :class:`BadImageError`, leaving nothing behind.
        overwrite: replace an existing OUT and any unfinished pack, but only an empty
            directory or one holding nothing but fastload's own files (a dataset, or an
            unfinished pack), and never one that is, holds or is inside SRC; only
            fastload's own files are ever deleted.
        resume: continue an interrupted pack in ``OUT.partial``, reusing its finished shards.
            For an OUT that is a URL (``s3://bucket/prefix``): the pack is staged under the cache
            (``$FASTLOAD_CACHE/staging/``) and uploaded, shards first and the manifest last;
            ``resume`` continues the staging pack or the upload, sending only what the prefix
            lacks (sizes and MD5 ETags checked); ``overwrite`` replaces only a fastload dataset
            there (``fastload.remote.upload``).
        storage_options: for a URL OUT: endpoint, credentials (``fastload.remote.RemoteStore``).
        max_size: shrink images whose longer side exceeds this many pixels (re-encoded);
            1..65535.
        quality: JPEG quality of every re-encoded image, 1..100.
        baseline: re-encode progressive JPEGs as baseline (GPU hardware decoders need it).
        max_pixels: refuse images with more pixels than this (decompression bombs);
            1..65535*65535.
        progress: show a progress bar on stderr (a log line every 10 s when not a TTY).

    Only one pack writes an OUT at a time: it holds an exclusive ``flock`` on the
    ``OUT.partial`` directory (then on OUT, after the rename) until it returns; a second
    pack of the same OUT gets a :class:`ConfigError` naming the first's process.

    Returns:
        :class:`PackResult` (path, num_samples, num_classes, num_shards, bytes, skipped, seconds).

    Raises:
        ConfigError: a bad option, an existing OUT without ``overwrite`` (or one it may
            not replace), an unfinished pack without ``resume``/``overwrite``, a resume
            with other source/options, or another pack writing the same OUT.
        BadImageError: ``on_error="fail"`` and an image was refused.
        PackError: writing failed (disk full, ...), or a thread or process could not start
            (a pids cgroup, ``ulimit -u``: the message names it and says how to get past it;
            helper threads whose work can be done without them never stop a pack); the
            unfinished pack can be resumed.
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
    storage_options: dict | None = None,
) -> PackResult:
    """Pack an ImageFolder tree or a list file (``path,label`` rows) into ``out``.

    Samples and classes are in torchvision ``ImageFolder`` order. JPEGs are stored
    byte for byte; other images become RGB JPEGs (see ``docs/format.md``).
    """
    settings = _settings(
        out, workers=workers, shard_size=shard_size, on_error=on_error, overwrite=overwrite, resume=resume,
        max_size=max_size, quality=quality, baseline=baseline, max_pixels=max_pixels, progress=progress,
        storage_options=storage_options,
    )  # fmt: skip
    source = open_source(src, on_error=on_error)
    return _run(source, settings)


def pack_dataset(
    dataset: Any,
    out: str | os.PathLike,
    *,
    classes: Sequence[str] | None = None,
    fields: dict[str, Any] | None = None,
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
    storage_options: dict | None = None,
) -> PackResult:
    """Pack a map-style dataset of ``(image, label)`` items, or of dicts of fields, into ``out``.

    ``image`` is a PIL image, an HxW / HxWx3 (or x1, x4) uint8 array or encoded bytes;
    ``label`` an int. Items are fetched in index order in this process. ``classes``
    defaults to ``dataset.classes`` if present, else ``"0" .. str(max label)``. An item
    whose fetch raises is a refused image (skipped or failed per ``on_error``).

    Items that are dicts (``{"image": ..., "label": ..., "caption": "..."}``) carry typed
    fields (``docs/fields.md``): the schema is inferred from the first item, or declared for
    some fields with ``fields`` (name -> kind such as ``"int32[]"``, ``"float32[10]"``, ``"str"``),
    and every item is checked against it (a :class:`ConfigError` names the item and the field).
    The dataset is then written in format 3.0.
    """
    settings = _settings(
        out, workers=workers, shard_size=shard_size, on_error=on_error, overwrite=overwrite, resume=resume,
        max_size=max_size, quality=quality, baseline=baseline, max_pixels=max_pixels, progress=progress,
        storage_options=storage_options,
    )  # fmt: skip
    return _run(_dataset_source(dataset, classes, fields), settings)


def _dataset_source(dataset: Any, classes: Sequence[str] | None, fields: dict[str, Any] | None) -> Source:
    """A :class:`DictDatasetSource` for a dataset of dicts (or with ``fields``), else a :class:`DatasetSource`."""
    if fields is None:
        try:
            first = dataset[0] if len(dataset) > 0 else None
        except Exception:  # noqa: BLE001 - DatasetSource says what is wrong with it, or refuses the item
            first = None
        if not isinstance(first, collections.abc.Mapping):
            return DatasetSource(dataset, classes)
    return DictDatasetSource(dataset, classes, fields)


#: The kinds of source ``fastload pack --from`` names.
SOURCE_KINDS = ("folder", "webdataset", "parquet")


def detect_source(src: Any) -> str:
    """What kind of source ``src`` is: ``"webdataset"`` (a ``.tar``, a brace pattern or glob of
    them, a directory holding ``.tar`` files), ``"parquet"`` (a ``.parquet`` file, a directory
    holding them, a ``datasets`` ``save_to_disk`` directory), else ``"folder"`` (an image
    folder or a list file, as :func:`pack` reads)."""
    if isinstance(src, (list, tuple)):
        return "webdataset"
    s = os.fspath(src)
    if s.endswith(".tar") or ("{" in s and ".tar" in s):
        return "webdataset"
    if s.endswith(".parquet"):
        return "parquet"
    if os.path.isdir(s):
        try:
            names = os.listdir(s)
        except OSError:
            return "folder"
        if "state.json" in names and any(n.endswith(".arrow") for n in names):
            return "parquet"
        if any(n.endswith(".tar") for n in names):
            return "webdataset"
        if any(n.endswith(".parquet") for n in names):
            return "parquet"
    return "folder"


def pack_webdataset(src: Any, out: str | os.PathLike, *, json_fields: Sequence[str] | str | None = None, **options: Any) -> PackResult:
    """Pack WebDataset tar shards into ``out`` with their fields (``docs/fields.md``).

    ``src`` is a directory of ``.tar`` files, a ``.tar`` file, a brace pattern
    (``"shards/{00000..00099}.tar"``) or a list of them; members are grouped by key as
    WebDataset groups them, and each extension is a field of that name (``cls`` the label,
    ``txt`` a str, ``json`` a str or, with ``json_fields="a,b"``, typed fields from it, others
    bytes). A sample without an image or a field of the schema is skipped (listed in the
    manifest). ``options`` are :func:`pack`'s.
    """
    from .convert_wds import WebDatasetSource

    settings = _settings(out, **_options(options))
    return _run(WebDatasetSource(src, json_fields=json_fields), settings)


def pack_parquet(src: str | os.PathLike, out: str | os.PathLike, *, image_column: str | None = None, **options: Any) -> PackResult:
    """Pack Parquet files (or a Hugging Face ``datasets`` ``save_to_disk`` directory) into ``out``.

    The image column is ``image_column``, or the column named ``image``/``img``/``jpg``/...,
    or the one binary column; every other column becomes a field of its name by its Arrow
    type (``docs/fields.md``). ``options`` are :func:`pack`'s.
    """
    from .convert_parquet import ParquetSource

    settings = _settings(out, **_options(options))
    return _run(ParquetSource(src, image_column=image_column), settings)


def pack_coco(
    images: str | os.PathLike, out: str | os.PathLike, *, annotations: str | os.PathLike, skip_empty: bool = False, masks: str | None = None,
    **options: Any,
) -> PackResult:
    """Pack COCO detection annotations (``instances_*.json``) over their image directory into ``out``.

    Every image becomes a sample with the fields ``image``, ``image_id``, ``boxes``
    (``float32[][4]``, XYXY pixels), ``labels`` (``int64[]``, categories sorted by id as
    ``1 .. K``), ``iscrowd`` (``uint8[]``) and with ``masks="instance"`` or ``"semantic"`` a ``mask``
    (PNG bytes of one label image, pycocotools); the category mapping is the manifest's
    ``options.coco`` (``docs/detection.md``). ``skip_empty`` leaves out images without an
    annotation. ``options`` are :func:`pack`'s, except ``max_size`` (a resize at pack time
    would move the pixels under the boxes).
    """
    from .coco import COCO_FIELDS, CocoSamples

    if options.get("max_size") is not None:
        raise ConfigError(f"max_size={options['max_size']!r}: a COCO pack keeps the images' own size (the boxes are in their pixels); resize in the loader")
    settings = _settings(out, **_options(options))
    samples = CocoSamples(images, annotations, skip_empty=skip_empty, masks=masks, max_pixels=settings.image.max_pixels)
    source = DictDatasetSource(samples, None, {**COCO_FIELDS, **({"mask": "bytes"} if masks else {})})
    source.description = f"coco:{os.fspath(annotations)}"
    source.manifest_options = {"coco": samples.manifest_options(annotations)}
    return _run(source, settings)


def _options(options: dict[str, Any]) -> dict[str, Any]:
    """:func:`pack`'s options with their defaults; an unknown name is a ConfigError."""
    kw: dict[str, Any] = dict(
        workers=None, shard_size="1GB", on_error="skip", overwrite=False, resume=False, max_size=None,
        quality=95, baseline=False, max_pixels=89_478_485, progress=True,
    )  # fmt: skip
    unknown = sorted(set(options) - set(kw))
    if unknown:
        raise ConfigError(f"unknown option(s) {', '.join(unknown)}; the options are {', '.join(kw)}")
    kw.update(options)
    return kw


def engine_settings(out: Any, options: dict[str, Any]) -> _Settings:
    """:func:`pack`'s options checked for a pack written by a distributed engine (:mod:`fastload.packing.engines`)."""
    rest = {k: v for k, v in options.items() if k != "storage_options"}
    return _settings(out, storage_options=options.get("storage_options"), **_options(rest))


def manifest_options(settings: _Settings, fields: bool) -> dict[str, Any]:
    """The manifest's ``options`` of a pack with ``settings`` (format 3 when ``fields``)."""
    return _options_json(settings.shard_size, settings.image, fields)


def pack_like_pil_loader(
    src: Any,
    out: str | os.PathLike,
    *,
    classes: Sequence[str] | None = None,
    fields: dict[str, Any] | None = None,
    **options: Any,
) -> PackResult:
    """Pack so that every stored image decodes to exactly what torchvision's ``pil_loader``
    (``Image.open(f).convert("RGB")``, what ``ImageFolder`` gives) makes of its source.

    ``src`` is a folder or list file (as for :func:`pack`), or a map-style dataset of
    ``(encoded bytes, label)`` items with ``classes`` (as for :func:`pack_dataset`).
    ``options`` are :func:`pack`'s. Plain JPEGs are stored byte for byte (one with an EXIF
    orientation too, its orientation tag set to 1: ``pil_loader`` does not turn it, nor does
    any fastload decoder); every other image is decoded by PIL, converted by
    ``convert("RGB")`` as ``pil_loader`` converts it (16-bit samples clipped, alpha dropped,
    no EXIF orientation) and stored as a lossless PNG (``encoding`` 2), so its decode is
    ``pil_loader``'s pixels exactly. The manifest's ``options.pixels`` says so. Used by the
    ImageFolder cache (:func:`fastload.cache.cached_pack`). With ``fields`` (name -> kind), ``src``
    is a dataset of dicts of fields (:func:`pack_dataset`'s), as the COCO/VOC cache packs them
    (:mod:`fastload.annotated`).
    """
    kw: dict[str, Any] = dict(
        workers=None, shard_size="1GB", on_error="skip", overwrite=False, resume=False, max_size=None,
        quality=95, baseline=False, max_pixels=89_478_485, progress=True,
    )  # fmt: skip
    unknown = sorted(set(options) - set(kw))
    if unknown:
        raise ConfigError(f"pack_like_pil_loader: unknown option(s) {', '.join(unknown)}")
    kw.update(options)
    settings = _settings(out, pil_loader=True, **kw)
    if isinstance(src, (str, bytes, os.PathLike)):
        source = open_source(src, on_error=settings.on_error)
    elif fields is not None:
        source = DictDatasetSource(src, classes, fields)
    else:
        source = DatasetSource(src, classes)
    return _run(source, settings)


pack.__doc__ = (pack.__doc__ or "") + _COMMON_DOC
pack_dataset.__doc__ = (pack_dataset.__doc__ or "") + _COMMON_DOC

__all__ = ["pack", "pack_dataset", "pack_webdataset", "pack_parquet", "detect_source", "SOURCE_KINDS", "pack_like_pil_loader", "PackResult", "parse_size", "Progress", "PIL_LOADER_PIXELS", "engine_settings", "manifest_options"]
