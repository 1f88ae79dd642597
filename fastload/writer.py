"""``pack``: turn a source of images into a packed dataset, atomically and reproducibly.

How a pack runs:

1. The source (:mod:`fastload.sources`) yields tasks in sample order.
2. Each image is validated and turned into its record value. Plain JPEG files (the
   bulk of real datasets) take a fast path in the main process: read straight into
   the record buffer, header walked without decoding, stored byte for byte
   (:func:`scan_jpeg`, :func:`_fast_file`). Everything else is decoded with PIL in
   worker processes, in chunks, and becomes an upright 8-bit RGB JPEG
   (:func:`process_task`). Refused images come back as ``("skip", path, reason)``.
3. The main process writes the records in source order into LMDB shards
   (:class:`ShardWriter`) with fixed transaction batching, so the files are
   byte-identical whatever the number of workers.
4. Everything is written into ``OUT.partial``: shards as ``*.lmdb.tmp`` renamed when
   complete, and ``journal.json`` (see ``docs/format.md``) after every shard. At the
   end come ``labels.bin``, then ``manifest.json``, then the directory is renamed to
   ``OUT``. An interrupted pack leaves only ``OUT.partial``; ``resume=True`` continues it.
"""

from __future__ import annotations

import array
import contextlib
import dataclasses
import datetime
import errno
import hashlib
import io
import json
import logging
import multiprocessing as mp
import os
import re
import shutil
import signal
import struct
import sys
import threading
import time
import warnings
import zlib
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from .errors import BadImageError, ConfigError, CorruptDataError, FastloadError, PackError
from .format import (
    ENC_JPEG,
    ENCODINGS,
    FLAG_CONVERTED,
    FLAG_ORIENTED,
    FLAG_PROGRESSIVE,
    FLAG_RESIZED,
    FORMAT_VERSION,
    HEADER,
    HEADER_SIZE,
    KEY,
    LABELS_DTYPE,
    LABELS_NAME,
    MANIFEST_NAME,
    RECORD_MAGIC,
    RECORD_VERSION,
    Manifest,
    RecordHeader,
    ShardInfo,
    decode_header,
    encode_record,
    key,
    shard_name,
)
from .sources import DatasetSource, FileSource, Source, Task, open_source

try:
    import lmdb
except ImportError as e:  # pragma: no cover
    lmdb = None
    _lmdb_error = e

log = logging.getLogger(__name__)

JOURNAL_NAME = "journal.json"
JOURNAL_FORMAT = "fastload-journal"
JOURNAL_VERSION = 1
PARTIAL_SUFFIX = ".partial"

#: Records per write transaction, and bytes per transaction: fixed so files are reproducible.
TXN_RECORDS = 256
TXN_BYTES = 4 << 20
#: How many times a shard's LMDB map may double while one transaction is written.
MAX_MAP_DOUBLINGS = 8
#: Tasks per chunk sent to a worker process.
CHUNKSIZE = 16
#: Bytes of EOF a JPEG's end-of-image marker is looked for in.
EOI_WINDOW = 64

_EXIF_ORIENTATION = 0x0112
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


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """What :func:`process_task` does to each image (sent to the workers)."""

    max_size: int | None = None
    quality: int = 95
    baseline: bool = False
    max_pixels: int = 89_478_485


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


# ============================================================================ per-image work


class _Refused(Exception):
    """An image cannot be packed; ``args[0]`` is the short reason."""


_TRANSPOSE = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}  # orientation -> PIL.Image.Transpose value (as exif_transpose)


@contextlib.contextmanager
def pil_settings() -> Iterator[None]:
    """PIL globals fastload needs while packing (restored afterwards).

    PIL's own decompression-bomb check is disabled (fastload checks ``--max-pixels``
    itself and names it), truncated images are never silently accepted, and PIL's
    warnings about odd metadata are muted.
    """
    from PIL import Image, ImageFile

    old = (Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES)
    Image.MAX_IMAGE_PIXELS = None
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        Image.MAX_IMAGE_PIXELS, ImageFile.LOAD_TRUNCATED_IMAGES = old


def _short(e: BaseException) -> str:
    msg = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
    return msg[:200]


def _orientation(im: Any) -> int:
    try:
        o = im.getexif().get(_EXIF_ORIENTATION, 1)
    except Exception:  # malformed EXIF: decoders ignore it as well
        return 1
    return o if isinstance(o, int) and o in _TRANSPOSE else 1


def _target_size(w: int, h: int, max_size: int) -> tuple[int, int]:
    s = max_size / max(w, h)
    return max(1, round(w * s)), max(1, round(h * s))


def _to_rgb(im: Any) -> Any:
    """8-bit RGB: 16-bit samples scaled by >> 8 (not clipped), alpha dropped as ``convert("RGB")``."""
    from PIL import Image

    mode = im.mode
    if mode == "RGB":
        return im
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(im).astype(np.int64) >> 8
        return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "L").convert("RGB")
    if mode == "F":
        return im.convert("L").convert("RGB")
    return im.convert("RGB")


def _encode_jpeg(im: Any, quality: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


def _check_size(w: int, h: int, opts: ImageOptions) -> None:
    if w <= 0 or h <= 0:
        raise _Refused(f"invalid image size {w}x{h}")
    if w * h > opts.max_pixels:
        raise _Refused(f"decompression bomb: {w}x{h} pixels exceeds --max-pixels {opts.max_pixels}")


def _finish(im: Any, opts: ImageOptions, flags: int, orientation: int, orig: tuple[int, int]) -> tuple[bytes, int, int, int]:
    """Orient, convert to RGB, shrink, encode as JPEG: ``(payload, flags, width, height)``.

    The stored size depends only on the source size ``orig`` (never on a JPEG draft).
    """
    from PIL import Image

    if orientation != 1:
        im = im.transpose(Image.Transpose(_TRANSPOSE[orientation]))
        flags |= FLAG_ORIENTED
    im = _to_rgb(im)
    if opts.max_size and max(orig) > opts.max_size:
        tw, th = _target_size(orig[0], orig[1], opts.max_size)
        target = (th, tw) if orientation in (5, 6, 7, 8) else (tw, th)
        if im.size != target:
            im = im.resize(target, Image.Resampling.LANCZOS)
        flags |= FLAG_RESIZED
    return _encode_jpeg(im, opts.quality), flags & ~FLAG_PROGRESSIVE, im.size[0], im.size[1]


_SIGNATURES = (
    (b"\x89PNG\r\n\x1a\n", "PNG"), (b"GIF8", "GIF"), (b"BM", "BMP"), (b"II*\x00", "TIFF"), (b"MM\x00*", "TIFF"),
    (b"RIFF", "WebP"),
)  # fmt: skip


def _from_bytes(raw: bytes, opts: ImageOptions) -> tuple[bytes, int, int, int, int, int]:
    """``(payload, flags, width, height, orig_width, orig_height)`` of an encoded image."""
    from PIL import Image, UnidentifiedImageError

    if not raw:
        raise _Refused("zero-byte file")
    is_jpeg = raw[:3] == b"\xff\xd8\xff"
    try:
        im = Image.open(io.BytesIO(raw))
    except UnidentifiedImageError:
        if is_jpeg:
            raise _Refused("truncated or corrupt JPEG (cannot parse its header)") from None
        kind = next((k for sig, k in _SIGNATURES if raw.startswith(sig)), None)
        if kind:
            raise _Refused(f"corrupt {kind} (cannot identify image file)") from None
        raise _Refused("not an image (cannot identify image file)") from None
    except Exception as e:
        if is_jpeg and "truncated" in str(e).lower():
            raise _Refused("truncated JPEG (its header is cut short)") from None
        raise _Refused(f"corrupt {'JPEG' if is_jpeg else 'image'} header ({_short(e)})") from None
    w, h = im.size
    _check_size(w, h, opts)
    if im.format in ("JPEG", "MPO"):
        if _sof_marker(raw) in _SOF_HUFFMAN:  # PIL decodes a scan cut short into grey without a word
            _check_jpeg_length(w, h, len(raw))
        return _from_jpeg(raw, im, opts)
    fmt = im.format or "image"
    try:
        im.load()
    except Exception as e:
        what = "truncated" if "truncated" in str(e) else "corrupt"
        raise _Refused(f"{what} {fmt} ({_short(e)})") from None
    payload, flags, sw, sh = _finish(im, opts, FLAG_CONVERTED, _orientation(im), (w, h))
    return payload, flags, sw, sh, w, h


def _from_jpeg(raw: bytes, im: Any, opts: ImageOptions) -> tuple[bytes, int, int, int, int, int]:
    w, h = im.size
    loaded = False
    if b"\xff\xd9" not in raw[-EOI_WINDOW:]:
        # No EOI at the end: truncated, or (rarely) data appended after the image. Decode to tell.
        try:
            im.load()
            loaded = True
        except Exception:
            raise _Refused("truncated JPEG (no end-of-image marker)") from None
    orientation = _orientation(im)
    progressive = bool(im.info.get("progressive") or im.info.get("progression"))
    shrink = bool(opts.max_size) and max(w, h) > opts.max_size  # type: ignore[operator]
    plain = im.mode == "RGB" and getattr(im, "bits", 8) == 8
    if plain and orientation == 1 and not shrink and not (opts.baseline and progressive):
        return raw, (FLAG_PROGRESSIVE if progressive else 0), w, h, w, h
    flags = 0
    if not plain or (opts.baseline and progressive):
        flags |= FLAG_CONVERTED
    if shrink and not loaded:  # DCT-domain pre-shrink to at least the target size; LANCZOS does the rest
        im.draft(None, _target_size(w, h, opts.max_size))  # type: ignore[arg-type]
    try:
        im.load()
    except Exception as e:
        raise _Refused(f"corrupt JPEG ({_short(e)})") from None
    payload, flags, sw, sh = _finish(im, opts, flags, orientation, (w, h))
    return payload, flags, sw, sh, w, h


def _from_pil(im: Any, opts: ImageOptions) -> tuple[bytes, int, int, int, int, int]:
    w, h = im.size
    _check_size(w, h, opts)
    try:
        im.load()
    except Exception as e:
        raise _Refused(f"cannot load PIL image ({_short(e)})") from None
    payload, flags, sw, sh = _finish(im, opts, FLAG_CONVERTED, _orientation(im), (w, h))
    return payload, flags, sw, sh, w, h


def _from_array(a: np.ndarray, opts: ImageOptions) -> tuple[bytes, int, int, int, int, int]:
    from PIL import Image

    if a.dtype != np.uint8:
        raise _Refused(f"array dtype {a.dtype} is not uint8")
    if a.ndim == 3 and a.shape[2] == 1:
        a = a[:, :, 0]
    if not (a.ndim == 2 or (a.ndim == 3 and a.shape[2] in (3, 4))):
        raise _Refused(f"array shape {a.shape} is not HxW, HxWx1, HxWx3 or HxWx4")
    h, w = a.shape[:2]
    _check_size(w, h, opts)
    mode = "L" if a.ndim == 2 else ("RGB" if a.shape[2] == 3 else "RGBA")
    im = Image.fromarray(np.ascontiguousarray(a), mode)
    payload, flags, sw, sh = _finish(im, opts, FLAG_CONVERTED, 1, (w, h))
    return payload, flags, sw, sh, w, h


# -- the fast path: a JPEG stored byte for byte, checked without PIL -------------------------

_SOF_PASSTHROUGH = {0xC0: False, 0xC1: False, 0xC2: True}  # SOF marker -> progressive (Huffman, 8-bit)
_SOF_ANY = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_SOF_HUFFMAN = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7}  # the others are arithmetic-coded


def _check_jpeg_length(w: int, h: int, nbytes: int) -> None:
    """Refuse a Huffman-coded JPEG too short for the size its header claims.

    Every 8x8 block of the full-resolution component costs at least one bit (its DC
    code), so a genuine ``w x h`` JPEG holds at least ``ceil(w/8) * ceil(h/8) / 8`` bytes.
    A shorter file has a forged or truncated scan that decoders fill with grey.
    """
    need = (-(-w // 8)) * (-(-h // 8)) // 8
    if nbytes < need:
        raise _Refused(f"JPEG header claims {w}x{h} pixels but the file has only {nbytes} bytes (at least {need} needed): forged or truncated")


def _sof_marker(b: bytes) -> int | None:
    """The first SOFn marker of a JPEG, found by walking its segments (None if there is none)."""
    i, n = 2, len(b)
    while i + 4 <= n and b[i] == 0xFF:
        m = b[i + 1]
        if m == 0xFF:
            i += 1
        elif 0xD0 <= m <= 0xD8 or m == 0x01:
            i += 2
        elif m in _SOF_ANY:
            return m
        elif m in (0xD9, 0xDA):
            return None
        else:
            i += 2 + ((b[i + 2] << 8) | b[i + 3])
    return None


def _exif_orientation(b: memoryview, t: int, end: int) -> int | None:
    """Orientation from the TIFF structure of an Exif APP1 segment (1 if absent, None if unreadable)."""
    if end - t < 8:
        return None
    order = bytes(b[t : t + 2])
    e = "<" if order == b"II" else ">" if order == b"MM" else None
    if e is None:
        return None
    (ifd,) = struct.unpack_from(e + "I", b, t + 4)
    p = t + ifd
    if ifd < 8 or p + 2 > end:
        return None
    (count,) = struct.unpack_from(e + "H", b, p)
    p += 2
    if p + 12 * count > end:
        return None
    for k in range(count):
        tag, typ = struct.unpack_from(e + "HH", b, p + 12 * k)
        if tag == _EXIF_ORIENTATION:
            return struct.unpack_from(e + "H", b, p + 12 * k + 8)[0] if typ == 3 else None
    return 1


def scan_jpeg(b: memoryview) -> tuple[int, int, bool] | None:
    """``(width, height, progressive)`` of a plain JPEG that can be stored byte for byte.

    Walks the marker segments up to the first scan (no decoding). Returns None for
    anything else -- not a JPEG, not 3-component 8-bit Huffman (grayscale, CMYK,
    12-bit, lossless, arithmetic), an EXIF orientation other than 1, a malformed or
    unusual structure -- which then takes the full PIL path.
    """
    n = len(b)
    if n < 4 or b[0] != 0xFF or b[1] != 0xD8:
        return None
    i, sof, orientation, exif_seen = 2, None, 1, False
    while i + 4 <= n:
        if b[i] != 0xFF:
            return None
        m = b[i + 1]
        if m == 0xFF:  # fill byte
            i += 1
            continue
        if 0xD0 <= m <= 0xD8 or m == 0x01:  # parameterless markers
            i += 2
            continue
        length = (b[i + 2] << 8) | b[i + 3]
        if length < 2 or i + 2 + length > n:
            return None
        if m == 0xDA:  # start of scan: the header is complete
            if sof is None or orientation != 1:
                return None
            return sof
        if m in _SOF_ANY:
            if m not in _SOF_PASSTHROUGH or sof is not None or length < 8:
                return None
            precision, h, w, ncomp = struct.unpack_from(">BHHB", b, i + 4)
            if precision != 8 or ncomp != 3 or w == 0 or h == 0:
                return None
            sof = (w, h, _SOF_PASSTHROUGH[m])
        elif m == 0xE1 and not exif_seen and bytes(b[i + 4 : i + 10]) == b"Exif\0\0":
            exif_seen = True  # the first Exif segment counts, as in PIL
            o = _exif_orientation(b, i + 10, i + 2 + length)
            if o is None:
                return None
            orientation = o
        elif m == 0xD9:
            return None
        i += 2 + length
    return None


def _fast_file(task: Task, opts: ImageOptions) -> bytes | bytearray | tuple | None:
    """The record of a plain JPEG file read straight into the record buffer, a
    ``("skip", ...)`` for an unreadable or empty file, or None: take the full path."""
    _kind, path, label, name, where = task
    path_b = name.encode("utf-8", "surrogateescape")[:65535]
    off = HEADER_SIZE + len(path_b)
    try:
        with open(path, "rb", buffering=0) as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                return ("skip", where, "zero-byte file")
            if os.pread(f.fileno(), 3, 0) != b"\xff\xd8\xff":
                return None  # not a JPEG: a worker reads it
            buf = bytearray(off + size)
            with memoryview(buf) as view:
                got = f.readinto(view[off:])
            if got != size or f.read(1):
                return None  # the file is changing: let the full path read it
    except OSError as e:
        return ("skip", where, f"unreadable ({e.strerror or e})")
    with memoryview(buf) as view:
        payload = view[off:]
        info = scan_jpeg(payload)
        if info is None:
            return None
        w, h, progressive = info
        if w * h > opts.max_pixels:
            return ("skip", where, f"decompression bomb: {w}x{h} pixels exceeds --max-pixels {opts.max_pixels}")
        try:
            _check_jpeg_length(w, h, size)
        except _Refused as r:
            return ("skip", where, str(r.args[0]))
        if (opts.max_size and max(w, h) > opts.max_size) or (opts.baseline and progressive):
            return None
        if b"\xff\xd9" not in bytes(payload[-EOI_WINDOW:]):
            return None  # truncated, or data after the image: the full path decodes to tell
        crc = zlib.crc32(payload)
        del payload
    flags = FLAG_PROGRESSIVE if progressive else 0
    HEADER.pack_into(buf, 0, RECORD_MAGIC, RECORD_VERSION, ENC_JPEG, flags, label, w, h, w, h, crc, size, len(path_b), 0)
    buf[HEADER_SIZE:off] = path_b
    return buf


# -- the full path ------------------------------------------------------------------------------


def _record(out: tuple[bytes, int, int, int, int, int], label: int, name: str) -> bytes:
    payload, flags, sw, sh, ow, oh = out
    return encode_record(
        payload, label=label, encoding=ENC_JPEG, width=sw, height=sh, orig_width=ow, orig_height=oh, flags=flags, path=name
    )


def process_task(task: Task, opts: ImageOptions) -> bytes | tuple:
    """Validate and encode one image with PIL: the record value, or ``("skip", path, reason)``.

    JPEG headers are parsed by ``PIL.Image.open`` without decoding (a JPEG with no
    end-of-image marker near its end is decoded to tell truncation from trailing
    data); every other image is decoded. Call inside :func:`pil_settings`.
    """
    kind, data, label, name, where = task
    try:
        if kind == "file":
            try:
                with open(data, "rb") as f:
                    raw = f.read()
            except OSError as e:
                raise _Refused(f"unreadable ({e.strerror or e})") from None
            return _record(_from_bytes(raw, opts), label, name)
        if kind == "bytes":
            return _record(_from_bytes(data, opts), label, name)
        if kind == "pil":
            return _record(_from_pil(data, opts), label, name)
        if kind == "array":
            return _record(_from_array(data, opts), label, name)
        raise _Refused(str(data))  # "error": the item could not be fetched
    except _Refused as r:
        return ("skip", where, str(r.args[0]))
    except MemoryError:
        return ("skip", where, "out of memory while decoding (lower --max-pixels?)")


def process(task: Task, opts: ImageOptions) -> bytes | bytearray | tuple:
    """:func:`_fast_file` where it applies, else :func:`process_task`."""
    if task[0] == "file":
        r = _fast_file(task, opts)
        if r is not None:
            return r
    return process_task(task, opts)


# ---------------------------------------------------------------------------- worker pool

_WORKER_OPTS: ImageOptions | None = None


def _init_worker(opts: ImageOptions, parent: int) -> None:
    global _WORKER_OPTS
    from PIL import Image, ImageFile

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    _WORKER_OPTS = opts
    Image.MAX_IMAGE_PIXELS = None
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    warnings.simplefilter("ignore")

    def watch() -> None:  # exit when the parent dies (a killed pack must not leave orphans)
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _work_chunk(tasks: list[Task]) -> list[bytes | tuple]:
    assert _WORKER_OPTS is not None
    return [process_task(t, _WORKER_OPTS) for t in tasks]


class _Results:
    """Ordered results of processing ``tasks``.

    Plain JPEG files take the fast path right here in the main process (reading the
    file is all the work there is; sending it through a pipe would cost more). Every
    other task goes, in chunks of :data:`CHUNKSIZE`, to a pool of ``workers`` processes
    (``workers <= 1``: processed inline). Results come out in task order, at most
    ``window`` tasks ahead, so the output does not depend on the number of workers.
    A worker that dies (a decoder crash, the OOM killer) is a :class:`PackError`
    naming the images it had, never a hang.
    """

    def __init__(self, tasks: Iterator[Task], opts: ImageOptions, workers: int) -> None:
        self._tasks = tasks
        self._opts = opts
        self._pool: Any = None
        self._ctx = pil_settings()
        self._ctx.__enter__()
        self._window = max(256, workers * CHUNKSIZE * 4)
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            methods = mp.get_all_start_methods()
            ctx = mp.get_context("fork" if sys.platform.startswith("linux") and "fork" in methods else "spawn")
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(opts, os.getpid()))

    def __iter__(self) -> Iterator[bytes | bytearray | tuple]:
        from collections import deque
        from concurrent.futures.process import BrokenProcessPool

        opts, pool = self._opts, self._pool
        window: deque[list] = deque()  # [result] | [None, task] (queued) | [future, k, tasks] (sent)
        chunk: list[list] = []

        def send() -> None:
            nonlocal chunk
            if chunk:
                tasks = [e[1] for e in chunk]
                fut = pool.submit(_work_chunk, tasks)
                for k, e in enumerate(chunk):
                    e[:] = [fut, k, tasks]
                chunk = []

        def take(e: list) -> bytes | bytearray | tuple:
            if len(e) == 1:
                return e[0]
            if e[0] is None:
                send()
            fut, k, tasks = e
            try:
                return fut.result()[k]
            except BrokenProcessPool:
                raise PackError(
                    f"a worker process died while converting {tasks[0][4]} .. {tasks[-1][4]} "
                    "(a decoder crash or out of memory); find the image with --workers 1, then --resume"
                ) from None

        for task in self._tasks:
            r = _fast_file(task, opts) if task[0] == "file" else None
            if r is None and pool is None:
                r = process_task(task, opts)
            if r is not None:
                window.append([r])
            else:
                e = [None, task]
                chunk.append(e)
                window.append(e)
                if len(chunk) >= CHUNKSIZE:
                    send()
            while window and (len(window[0]) == 1 or (window[0][0] is not None and window[0][0].done())):
                yield take(window.popleft())
            while len(window) >= self._window:
                yield take(window.popleft())
        while window:
            yield take(window.popleft())

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                with contextlib.suppress(Exception):
                    proc.terminate()
            pool.shutdown(wait=True, cancel_futures=True)


# ============================================================================ shard writing


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a file (read in 4 MiB blocks)."""
    h = hashlib.sha256()
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()


def _write_error(path: Path, e: BaseException, what: str = "cannot write shard") -> PackError:
    msg = e.strerror if isinstance(e, OSError) and e.strerror else _short(e)
    hint = ""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left" in msg:
        hint = "; the disk is full: free space, then continue with --resume"
    elif "MDB_MAP_FULL" in msg or "set_mapsize" in msg:
        hint = "; the shard's LMDB memory map could not grow to hold it"
    return PackError(f"{path}: {what}: {msg}{hint}")


class ShardWriter:
    """Writes records at consecutive global indices into size-limited LMDB shards.

    A shard is written as ``shard-NNNNN.lmdb.tmp`` with a write transaction every
    :data:`TXN_RECORDS` records or :data:`TXN_BYTES` bytes. A finished shard is
    closed, then -- in a background thread, while the next shard is written --
    fsynced, hashed, renamed to ``shard-NNNNN.lmdb`` and reported through
    ``on_shard(info, end, extra)`` (in shard order), where ``end`` is the source
    position after the shard and ``extra`` what ``snapshot()`` returned when the
    shard was closed.

    A new shard starts when the next record would grow the current one beyond
    ``shard_size`` bytes (a record larger than that gets a shard of its own).
    """

    def __init__(
        self,
        directory: Path,
        *,
        shard_size: int,
        first_shard: int = 0,
        first_index: int = 0,
        on_shard: Callable[[ShardInfo, int, Any], None] = lambda info, end, extra: None,
        snapshot: Callable[[], Any] = lambda: None,
    ) -> None:
        self.dir = directory
        self.shard_size = shard_size
        self.shard = first_shard
        self.index = first_index
        self.on_shard = on_shard
        self.snapshot = snapshot
        self.done: list[ShardInfo] = []
        self._env: Any = None
        self._path: Path | None = None
        self._first = first_index
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._pending_est = 0
        self._committed = 0
        self._psize = 4096
        self._nodemax = 2038
        self._jobs: list[threading.Thread] = []
        self._error: BaseException | None = None

    # -- size estimate ------------------------------------------------------------------------
    def _estimate(self, vlen: int) -> int:
        node = 16 + vlen  # node header + 8-byte key + value
        if node > self._nodemax:  # overflow pages plus a small leaf node
            return -(-(vlen + 16) // self._psize) * self._psize + 26
        return node + 2

    def _open(self) -> None:
        self._path = self.dir / (shard_name(self.shard) + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
        map_size = max(64 << 20, self.shard_size + (self.shard_size >> 2))
        try:
            self._env = lmdb.open(
                str(self._path), subdir=False, map_size=map_size, lock=False, sync=False, metasync=False,
                readahead=False, meminit=True, max_dbs=0,
            )  # fmt: skip
        except (lmdb.Error, OSError) as e:
            raise _write_error(self._path, e) from None
        self._psize = self._env.stat()["psize"]
        self._nodemax = ((self._psize - 16) // 2 & ~1) - 2
        self._first = self.index
        self._committed = 2 * self._psize
        self._pending_est = 0

    def add(self, value: bytes | bytearray, position: int) -> int:
        """Store ``value`` at the next global index; ``position`` is its source position."""
        if self._error is not None:
            self._raise()
        est = self._estimate(len(value))
        if self._env is not None and self.index > self._first:
            if self._committed + self._pending_est + est + 4 * self._psize > self.shard_size:
                self._finish(position)
        if self._env is None:
            self._open()
        self._pending.append((key(self.index), value))
        self._pending_bytes += len(value)
        self._pending_est += est
        self.index += 1
        if len(self._pending) >= TXN_RECORDS or self._pending_bytes >= TXN_BYTES:
            self._flush()
        return self.index - 1

    def _write_batch(self, env: Any, records: list[tuple[bytes, bytes]]) -> None:
        with env.begin(write=True) as txn:
            for k, v in records:
                txn.put(k, v, append=True)

    def _flush(self) -> None:
        if not self._pending:
            return
        assert self._env is not None and self._path is not None
        grown = 0
        while True:
            try:
                self._write_batch(self._env, self._pending)
                break
            except lmdb.MapFullError as e:
                if grown >= MAX_MAP_DOUBLINGS:
                    raise _write_error(self._path, e) from None
                grown += 1
                try:
                    self._env.set_mapsize(self._env.info()["map_size"] * 2)
                except (lmdb.Error, OSError) as e2:  # no address space for a larger map
                    raise _write_error(self._path, e2) from None
            except (lmdb.Error, OSError) as e:
                raise _write_error(self._path, e) from None
        self._committed = (self._env.info()["last_pgno"] + 1) * self._psize
        self._pending.clear()
        self._pending_bytes = 0
        self._pending_est = 0

    def _finish(self, end: int) -> None:
        if self._env is None:
            return
        self._flush()
        assert self._path is not None
        env, self._env = self._env, None
        try:
            env.close()
        except (lmdb.Error, OSError) as e:  # pragma: no cover
            raise _write_error(self._path, e) from None
        job = threading.Thread(
            target=self._complete,
            args=(self._path, self.dir / shard_name(self.shard), self._first, self.index - self._first, end, self.snapshot(), self._jobs[-1:]),
            name=f"fastload-shard-{self.shard}",
            daemon=True,
        )  # fmt: skip
        self._jobs.append(job)
        job.start()
        self.shard += 1

    def _complete(self, tmp: Path, final: Path, first: int, count: int, end: int, extra: Any, before: list) -> None:
        """fsync, hash and rename a closed shard, then report it (after the previous one)."""
        try:
            sync_errors: list[BaseException] = []

            def sync() -> None:
                try:
                    _fsync_file(tmp)
                except BaseException as e:  # a failed write-back (EIO, ENOSPC) fails the shard
                    sync_errors.append(e)

            syncer = threading.Thread(target=sync, daemon=True)
            syncer.start()  # the disk writes back while this thread hashes from the page cache
            size = tmp.stat().st_size
            digest = file_sha256(tmp)
            syncer.join()
            if sync_errors:
                raise sync_errors[0]
            for job in before:
                job.join()
            if self._error is not None:
                return
            os.replace(tmp, final)
            _fsync_dir(self.dir)
            info = ShardInfo(final.name, first, count, size, digest)
            self.done.append(info)
            self.on_shard(info, end, extra)
        except BaseException as e:  # reported to the main thread by add()/close()
            if self._error is None:
                self._error = _write_error(tmp, e) if isinstance(e, OSError) else e

    def _raise(self) -> None:
        e = self._error
        assert e is not None
        raise e

    def wait(self) -> None:
        """Wait until every closed shard is renamed and reported; re-raise a background error."""
        for job in self._jobs:
            job.join()
        self._jobs.clear()
        if self._error is not None:
            self._raise()

    def close(self, end: int) -> None:
        """Finish the open shard (if any) and wait for all; ``end`` is the source position after it."""
        self._finish(end)
        self.wait()

    def abort(self) -> None:
        """Stop: the open shard stays ``*.tmp``; shards already closed are still completed."""
        self._pending.clear()
        if self._env is not None:
            with contextlib.suppress(Exception):
                self._env.close()
            self._env = None
        for job in self._jobs:
            job.join()
        self._jobs.clear()


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_shard_readonly(path: str | os.PathLike) -> Iterator[Any]:
    """A read-only LMDB environment of one shard file, closed afterwards.

    If this process already holds the file open through a :class:`fastload.Dataset`
    (py-lmdb refuses a second handle), that handle is shared and left open.

    Raises:
        CorruptDataError: the file's LMDB structure is damaged (reading it could crash).
        lmdb.Error: LMDB cannot open the file.
    """
    from .reader import _ENVS, check_shard_structure

    p = str(path)
    problem = check_shard_structure(p, os.stat(p).st_size)
    if problem:  # LMDB would read outside the file (and die of SIGBUS): refuse instead
        raise CorruptDataError(f"{p}: damaged shard ({problem})")
    shared = None
    try:
        env = lmdb.open(p, subdir=False, readonly=True, lock=False, readahead=False)
    except lmdb.Error:
        real = os.path.realpath(p)
        shared = next((e for (pid, q), e in list(_ENVS.items()) if pid == os.getpid() and os.path.realpath(q) == real), None)
        if shared is None:
            raise
        env = shared
    try:
        yield env
    finally:
        if shared is None:
            env.close()


def iter_records(env: Any, where: str) -> Iterator[tuple[int, memoryview]]:
    """``(global index, value)`` of every record of an open shard, in key order."""
    with env.begin(buffers=True) as txn:
        for k, v in txn.cursor():
            if len(k) != KEY.size:
                raise CorruptDataError(f"{where}: record key of {len(k)} bytes (expected {KEY.size})")
            (i,) = KEY.unpack(bytes(k))
            yield i, v


def iter_headers(path: str | os.PathLike) -> Iterator[tuple[int, RecordHeader]]:
    """``(global index, header)`` of every record of one shard file, in key order.

    Raises:
        lmdb.Error: the file is not a readable LMDB environment.
        CorruptDataError: a record header or key is malformed.
    """
    p = str(path)
    with open_shard_readonly(p) as env:
        for i, v in iter_records(env, p):
            yield i, decode_header(v, where=f"{p} sample {i}")


# ============================================================================ journal and stats


@dataclasses.dataclass
class Journal:
    """``OUT.partial/journal.json``: how far an unfinished pack got (JSON, no pickle)."""

    source: str
    source_fingerprint: str
    options: dict[str, Any]
    shards: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # ShardInfo + end + skipped
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)

    @property
    def position(self) -> int:
        return int(self.shards[-1]["end"]) if self.shards else 0

    def save(self, directory: Path, *, skipped: list[dict[str, str]] | None = None) -> None:
        d = {
            "format": JOURNAL_FORMAT,
            "version": JOURNAL_VERSION,
            "source": self.source,
            "source_fingerprint": self.source_fingerprint,
            "options": self.options,
            "position": self.position,
            "shards": self.shards,
            "skipped": self.skipped if skipped is None else skipped,
        }
        _atomic_write(directory / JOURNAL_NAME, (json.dumps(d, indent=1, ensure_ascii=True) + "\n").encode())

    @classmethod
    def load(cls, directory: Path) -> "Journal":
        p = directory / JOURNAL_NAME
        try:
            d = json.loads(p.read_bytes())
            if d.get("format") != JOURNAL_FORMAT or int(d.get("version", 0)) != JOURNAL_VERSION:
                raise ValueError(f"format {d.get('format')!r} version {d.get('version')!r}")
            j = cls(str(d["source"]), str(d["source_fingerprint"]), dict(d["options"]), list(d["shards"]), list(d["skipped"]))
            for s in j.shards:
                ShardInfo.from_json(s, where=str(p))
                int(s["end"]), int(s["skipped"])
        except FileNotFoundError:
            raise PackError(f"{directory}: no {JOURNAL_NAME}; it cannot be resumed: start over with --overwrite") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError, FastloadError) as e:
            raise PackError(f"{p}: unreadable journal ({_short(e)}); start over with --overwrite") from None
        return j


class _Stats:
    """Labels and header statistics of the records written so far."""

    def __init__(self) -> None:
        self.labels = array.array("i")
        self.widths = array.array("I")
        self.heights = array.array("I")
        self.encodings: Counter[str] = Counter()
        self.flags = Counter({"progressive": 0, "converted": 0, "oriented": 0, "resized": 0})
        self.payload_bytes = 0

    def add(self, h: RecordHeader) -> None:
        self.labels.append(h.label)
        self.widths.append(h.width)
        self.heights.append(h.height)
        self.encodings[ENCODINGS.get(h.encoding, str(h.encoding))] += 1
        for bit, name in ((FLAG_PROGRESSIVE, "progressive"), (FLAG_CONVERTED, "converted"), (FLAG_ORIENTED, "oriented"), (FLAG_RESIZED, "resized")):
            if h.flags & bit:
                self.flags[name] += 1
        self.payload_bytes += h.payload_len

    def to_json(self) -> dict[str, Any]:
        def dist(a: array.array) -> dict[str, int]:
            if not a:
                return {"min": 0, "median": 0, "max": 0}
            x = np.frombuffer(a, dtype=np.uint32)
            return {"min": int(x.min()), "median": int(np.median(x)), "max": int(x.max())}

        return {
            "payload_bytes": self.payload_bytes,
            "encodings": dict(sorted(self.encodings.items())),
            **dict(self.flags),
            "width": dist(self.widths),
            "height": dist(self.heights),
        }


# ============================================================================ progress


class _Progress:
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


def _json_path(s: str) -> str:
    """A path made safe for JSON/UTF-8 (undecodable bytes shown as \\xNN)."""
    return s.encode("utf-8", "surrogateescape").decode("utf-8", "backslashreplace")


def _is_fastload_dir(p: Path) -> bool:
    if not p.is_dir():
        return False
    if not any(p.iterdir()):
        return True
    try:
        return json.loads((p / MANIFEST_NAME).read_bytes()).get("format") == "fastload"
    except (OSError, ValueError, AttributeError):
        return False


def _check_out(out: Path, overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise ConfigError(f"OUT {out} already exists; pass --overwrite (overwrite=True) to replace it")
        if not _is_fastload_dir(out):
            raise ConfigError(
                f"OUT {out} exists and is not a fastload dataset; refusing to replace it even with --overwrite "
                "(choose another OUT or remove it yourself)"
            )


def _partial_is_ours(p: Path) -> bool:
    return p.is_dir() and ((p / JOURNAL_NAME).exists() or all(q.name.endswith((".lmdb", ".tmp", ".bin", ".json")) for q in p.iterdir()))


def _options_json(shard_size: int, opts: ImageOptions) -> dict[str, Any]:
    return {
        "shard_size": shard_size,
        "max_size": opts.max_size,
        "quality": opts.quality,
        "baseline": opts.baseline,
        "max_pixels": opts.max_pixels,
        "format_version": FORMAT_VERSION,
    }


def _prepare_partial(partial: Path, journal: Journal, resume: bool, overwrite: bool, stats: _Stats) -> Journal:
    """Create or reuse ``OUT.partial``; return the journal to continue from."""
    if resume and partial.is_dir() and not (partial / JOURNAL_NAME).exists() and _partial_is_ours(partial):
        # stopped between creating OUT.partial and writing its journal: nothing to reuse
        log.info("%s holds no journal (the pack stopped before its first shard): starting it again", partial)
        shutil.rmtree(partial)
    if partial.exists() or partial.is_symlink():
        if resume:
            old = Journal.load(partial)
            if old.source_fingerprint != journal.source_fingerprint:
                raise ConfigError(
                    f"cannot resume {partial}: the source changed since it was started ({old.source}); "
                    "resume with the same SRC, or start over with --overwrite"
                )
            if old.options != journal.options:
                diff = ", ".join(f"{k} {old.options.get(k)!r} -> {v!r}" for k, v in journal.options.items() if old.options.get(k) != v)
                raise ConfigError(f"cannot resume {partial}: options changed ({diff}); resume with the same options, or start over with --overwrite")
            return _reuse_shards(partial, old, stats)
        if not overwrite:
            raise ConfigError(
                f"{partial} holds an unfinished pack; continue it with --resume (resume=True) "
                "or start over with --overwrite (overwrite=True)"
            )
        if not _partial_is_ours(partial):
            raise ConfigError(f"{partial} exists and is not a fastload partial pack; remove it yourself")
        shutil.rmtree(partial)
    elif resume:
        log.info("nothing to resume at %s: starting a new pack", partial)
    try:
        partial.mkdir(parents=True)
        journal.save(partial)
    except OSError as e:
        raise PackError(f"{partial}: cannot create the output directory: {e.strerror or e}") from None
    return journal


def _reuse_shards(partial: Path, journal: Journal, stats: _Stats) -> Journal:
    """Keep the journal's shards that still match their size and hash; drop the rest."""
    kept: list[dict[str, Any]] = []
    for s in journal.shards:
        p = partial / s["file"]
        try:
            ok = p.stat().st_size == int(s["bytes"]) and file_sha256(p) == s["sha256"]
        except OSError:
            ok = False
        if not ok:
            log.warning("%s: missing or changed since it was written; packing it again", p)
            break
        kept.append(s)
    keep_names = {s["file"] for s in kept} | {JOURNAL_NAME}
    for q in partial.iterdir():
        if q.name not in keep_names:
            q.unlink() if not q.is_dir() else shutil.rmtree(q)
    for s in kept:
        for _i, h in iter_headers(partial / s["file"]):
            stats.add(h)
    nskipped = int(kept[-1]["skipped"]) if kept else 0
    journal.shards = kept
    journal.skipped = journal.skipped[:nskipped]
    journal.save(partial)
    if kept:
        log.info("resuming %s: %d finished shard(s) reused, continuing at source item %d", partial, len(kept), journal.position)
    return journal


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
        from .errors import DependencyError

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
    _check_out(out_p, overwrite)
    partial = out_p.with_name(out_p.name + PARTIAL_SUFFIX)

    options = _options_json(size, opts)
    stats = _Stats()
    journal = _prepare_partial(
        partial, Journal(_json_path(source.description), source.fingerprint(), options), resume, overwrite, stats
    )
    skipped = journal.skipped
    start = journal.position
    first_index = sum(int(s["count"]) for s in journal.shards)

    def on_shard(info: ShardInfo, end: int, nskipped: int) -> None:  # runs in the writer's background thread
        journal.shards.append({**info.to_json(), "end": end, "skipped": nskipped})
        try:
            journal.save(partial, skipped=skipped[:nskipped])
        except OSError as e:
            raise _write_error(partial / JOURNAL_NAME, e, f"cannot record {info.file}") from None

    writer = ShardWriter(
        partial, shard_size=size, first_shard=len(journal.shards), first_index=first_index,
        on_shard=on_shard, snapshot=lambda: len(skipped),
    )  # fmt: skip
    bar = _Progress(len(source), start, progress)
    results = None
    nbytes = 0
    try:
        try:
            results = _Results(source.tasks(start), opts, nworkers)
            pos = start
            for pos, res in enumerate(results, start):
                if isinstance(res, tuple):
                    _tag, where, reason = res
                    if on_error == "fail":
                        raise BadImageError(where, reason)
                    skipped.append({"path": _json_path(where), "reason": reason})
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
        manifest = _finalize(partial, out_p, source, stats, journal, options, on_error, overwrite)
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


def _finalize(
    partial: Path,
    out: Path,
    source: Source,
    stats: _Stats,
    journal: Journal,
    options: dict[str, Any],
    on_error: str,
    overwrite: bool,
) -> Manifest:
    """labels.bin, then manifest.json, then rename ``partial`` to ``out``."""
    from . import __version__

    labels = np.frombuffer(stats.labels, dtype=np.int32).astype(LABELS_DTYPE)
    classes = source.classes if source.classes is not None else [str(i) for i in range(int(labels.max()) + 1)]
    counts = np.bincount(labels, minlength=len(classes)).tolist()
    shards = [ShardInfo.from_json({k: s[k] for k in ("file", "first", "count", "bytes", "sha256")}, where=JOURNAL_NAME) for s in journal.shards]
    raw = labels.tobytes()
    manifest = Manifest(
        num_samples=len(labels),
        classes=list(classes),
        class_counts=counts,
        shards=shards,
        labels_sha256=hashlib.sha256(raw).hexdigest(),
        skipped=list(journal.skipped),
        stats=stats.to_json(),
        options={**options, "source": journal.source, "on_error": on_error},
        created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        fastload_version=__version__,
    )
    manifest.validate(where=str(partial / MANIFEST_NAME))
    try:
        _atomic_write(partial / LABELS_NAME, raw)
        _atomic_write(partial / MANIFEST_NAME, manifest.dumps().encode("utf-8"))
        old = None
        if out.exists() or out.is_symlink():
            _check_out(out, overwrite)
            old = out.with_name(f"{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(partial, out)
        _fsync_dir(out.parent)
        # the journal goes last: a crash before the rename leaves a resumable OUT.partial
        with contextlib.suppress(FileNotFoundError):
            (out / JOURNAL_NAME).unlink()
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise PackError(f"{partial}: cannot finish the pack: {e.strerror or e}; fix that, then continue with --resume") from None
    return manifest


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

__all__ = ["pack", "pack_dataset", "PackResult", "parse_size", "process_task", "ShardWriter", "iter_headers", "file_sha256"]
