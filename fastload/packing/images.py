"""One image to its stored form: JPEG header scan, EXIF orientation, conversion, resize, limits.

Plain 8-bit RGB Huffman JPEGs (SOF0/1/2) with no rotation are stored byte for byte; their
header is walked without decoding (:func:`scan_jpeg`, :func:`fast_file`). Everything else is
decoded with PIL and becomes an upright 8-bit RGB JPEG (:func:`process_task`). A refused
image is ``("skip", where, reason)``, never an exception: whatever goes wrong with one
image (an encoder limit, an odd mode, a decoder error) is that image's reason.

With ``ImageOptions.pil_loader`` (the ImageFolder cache) the stored pixels are instead
exactly torchvision's ``pil_loader``'s: no EXIF orientation (a plain JPEG keeps its bytes,
its orientation tag set to 1: :func:`upright_tag`), PIL's own ``convert("RGB")``, and every
converted image a lossless PNG (encoding 2).

Only regular files are read (opened non-blocking and checked with ``fstat``, so a FIFO or
a device is refused, never waited on), and only up to :func:`max_file_bytes`.
"""

from __future__ import annotations

import dataclasses
import io
import os
import stat
import struct
from typing import Any

import numpy as np

from ..errors import BadImageError, printable, short_message
from ..format import (
    DEFAULT_MAX_PIXELS,
    ENC_JPEG,
    ENC_PNG,
    FLAG_CONVERTED,
    FLAG_ORIENTED,
    FLAG_PROGRESSIVE,
    FLAG_RESIZED,
    HEADER,
    HEADER_SIZE,
    RECORD_MAGIC,
    RECORD_VERSION,
    encode_record,
    jpeg_frame,
    payload_checksum,
)
from .sources import Task, file_kind

#: Bytes of EOF a JPEG's end-of-image marker is looked for in.
EOI_WINDOW = 64
#: The longest side a JPEG can hold: libjpeg (PIL, DALI's CPU decoder) refuses more.
JPEG_MAX_SIDE = 65_500
#: Bytes per pixel a real image needs at most (16-bit RGBA, uncompressed) ...
FILE_BYTES_PER_PIXEL = 8
#: ... plus this much for headers and metadata (EXIF, ICC profiles, XMP).
FILE_SLACK_BYTES = 16 << 20

_EXIF_ORIENTATION = 0x0112
#: The shorter side of the evaluation resize every stored image must survive: torchvision's
#: ``Resize(256)``, FastLoader's default for ``crop=224``. A stored image whose resize to that
#: shorter side would have more than :data:`RESIZE_MAX_PIXELS` pixels is refused: its aspect
#: ratio is above :data:`MAX_ASPECT_RATIO`:1. A 65000x1 strip (which JPEG allows) would ask for
#: a 16,640,000x256 resize, 12.8 GB of RGB; the largest accepted one, 1365x1, for 349,440x256.
EVAL_SHORT_SIDE = 256
#: The most pixels that resize may make: the default ``--max-pixels`` (PIL's decompression-bomb
#: limit, 268 MB of RGB), whatever ``--max-pixels`` is (a low one is for small images, not strips).
RESIZE_MAX_PIXELS = DEFAULT_MAX_PIXELS
#: The aspect ratio that bound allows (1365:1).
MAX_ASPECT_RATIO = RESIZE_MAX_PIXELS // (EVAL_SHORT_SIDE * EVAL_SHORT_SIDE)


@dataclasses.dataclass(frozen=True)
class ImageOptions:
    """What :func:`process_task` does to each image (sent to the workers)."""

    max_size: int | None = None
    quality: int = 95
    baseline: bool = False
    max_pixels: int = 89_478_485
    #: Store exactly the pixels torchvision's ``pil_loader`` gives (``Image.open(f).convert("RGB")``):
    #: no EXIF orientation applied (a plain JPEG's orientation tag is set to 1 instead, its
    #: bytes otherwise kept), 16-bit samples clipped as PIL's ``convert`` clips them, and every
    #: converted image stored losslessly as PNG. For the ImageFolder cache (:mod:`fastload.cache`).
    pil_loader: bool = False


def max_file_bytes(max_pixels: int) -> int:
    """The largest file (or encoded image) read: ``8 * max_pixels + 16 MiB``.

    An image within ``--max-pixels`` cannot need more (8 bytes per pixel is 16-bit RGBA
    stored uncompressed), so a larger file is refused from its size, before it is read.
    """
    return FILE_BYTES_PER_PIXEL * max_pixels + FILE_SLACK_BYTES


# ============================================================================ per-image work


class _Refused(Exception):
    """An image cannot be packed; ``args[0]`` is the short reason."""


_TRANSPOSE = {2: 0, 3: 3, 4: 1, 5: 5, 6: 4, 7: 6, 8: 2}  # orientation -> PIL.Image.Transpose value (as exif_transpose)


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
    if mode in ("P", "PA") and im.palette is None:  # lost in pickling (Image.new("P") has an empty one)
        im = im.copy()
        im.putpalette(b"")
    if mode.startswith("I;16") or mode == "I":
        a = np.asarray(im).astype(np.int64) >> 8
        return Image.fromarray(np.clip(a, 0, 255).astype(np.uint8), "L").convert("RGB")
    try:
        if mode == "F":
            return im.convert("L").convert("RGB")
        return im.convert("RGB")
    except ValueError as e:  # PIL has no conversion from this mode ("La", ...)
        raise _Refused(f"cannot convert mode {mode} to RGB ({short_message(e)})") from None


def _encode_jpeg(im: Any, quality: int) -> bytes:
    buf = io.BytesIO()
    im.save(buf, "JPEG", quality=quality)
    return buf.getvalue()


#: zlib level of the lossless PNGs (``pil_loader``): decoding costs the same at every level;
#: level 1 encodes several times faster than PIL's default 6, for files a little larger.
PNG_COMPRESS_LEVEL = 1
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _encode_png(im: Any) -> bytes:
    """8-bit RGB PNG, lossless: decoded, it is ``im`` pixel for pixel (no metadata kept)."""
    buf = io.BytesIO()
    im.save(buf, "PNG", compress_level=PNG_COMPRESS_LEVEL)
    return buf.getvalue()


def _check_size(w: int, h: int, opts: ImageOptions) -> None:
    if w <= 0 or h <= 0:
        raise _Refused(f"invalid image size {w}x{h}")
    if w * h > opts.max_pixels:
        raise _Refused(f"decompression bomb: {w}x{h} pixels exceeds --max-pixels {opts.max_pixels}")


def _check_side(w: int, h: int, opts: ImageOptions, *, jpeg: bool) -> None:
    """Refuse, before decoding, a size no JPEG decoder reads (``jpeg``: the source is a
    JPEG) or that the stored JPEG cannot hold after any ``--max-size`` shrink."""
    if jpeg and max(w, h) > JPEG_MAX_SIDE:
        raise _Refused(f"JPEG of {w}x{h} pixels: JPEG decoders (libjpeg) refuse a side above {JPEG_MAX_SIDE} pixels")
    fw, fh = _target_size(w, h, opts.max_size) if opts.max_size and max(w, h) > opts.max_size else (w, h)
    if max(fw, fh) > JPEG_MAX_SIDE:
        raise _Refused(
            f"{w}x{h} pixels: a JPEG side cannot exceed {JPEG_MAX_SIDE} pixels; shrink it with --max-size {JPEG_MAX_SIDE} or less"
        )
    _check_resize(w, h, fw, fh)


def eval_resize_pixels(w: int, h: int, short: int = EVAL_SHORT_SIDE) -> tuple[int, int]:
    """The size torchvision's ``Resize(short)`` gives a ``w x h`` image (shorter side ``short``)."""
    if w <= h:
        return short, int(short * h / w)
    return int(short * w / h), short


def _check_resize(w: int, h: int, fw: int, fh: int) -> None:
    """Refuse a stored size ``fw x fh`` (of a ``w x h`` source) whose evaluation resize to a
    shorter side of :data:`EVAL_SHORT_SIDE` pixels would exceed :data:`RESIZE_MAX_PIXELS`."""
    rw, rh = eval_resize_pixels(fw, fh)
    if rw * rh > RESIZE_MAX_PIXELS:
        stored = f" (stored {fw}x{fh})" if (fw, fh) != (w, h) else ""
        raise _Refused(
            f"{w}x{h} pixels{stored}: aspect ratio above {MAX_ASPECT_RATIO}:1 (MAX_ASPECT_RATIO): resizing its shorter "
            f"side to {EVAL_SHORT_SIDE} pixels, as an evaluation Resize({EVAL_SHORT_SIDE}) does, would make it "
            f"{rw}x{rh} = {rw * rh} pixels, more than {RESIZE_MAX_PIXELS}; crop or split it"
        )


def _too_large(size: int, opts: ImageOptions, what: str = "file") -> _Refused:
    limit = max_file_bytes(opts.max_pixels)
    return _Refused(
        f"{what} too large: {size} bytes, more than the {limit} bytes an image within --max-pixels {opts.max_pixels} "
        f"can need ({FILE_BYTES_PER_PIXEL} bytes per pixel + 16 MiB)"
    )


def _finish(
    im: Any, opts: ImageOptions, flags: int, orientation: int, orig: tuple[int, int], draft_box: tuple | None = None
) -> tuple[bytes, int, int, int]:
    """Orient, convert to RGB, shrink, encode as JPEG: ``(payload, flags, width, height)``.

    The stored size depends only on the source size ``orig`` (never on a JPEG draft).
    ``draft_box`` is what PIL's ``draft`` returned: where the source lies in the draft, which
    is larger when the source does not divide by the DCT scale (a 1001-px side at 1/4 is 251
    pixels, the last of them a quarter of the source's); the shrink reads exactly that box.
    """
    from PIL import Image

    if opts.pil_loader:  # as torchvision's pil_loader: no EXIF orientation, PIL's own conversion
        orientation = 1
        try:
            im = im.convert("RGB")
        except ValueError as e:  # pil_loader raises the same
            raise _Refused(f"cannot convert mode {im.mode} to RGB ({short_message(e)}), nor can torchvision's pil_loader") from None
    shrink = bool(opts.max_size) and max(orig) > opts.max_size  # type: ignore[operator]
    if shrink and draft_box is not None:  # shrink the draft's box first (its own axes), then turn
        im = _to_rgb(im)
        target = _target_size(orig[0], orig[1], opts.max_size)  # type: ignore[arg-type]
        if im.size != target or tuple(draft_box) != (0, 0, *im.size):
            im = im.resize(target, Image.Resampling.LANCZOS, box=tuple(draft_box))
        flags |= FLAG_RESIZED
        shrink = False
    if orientation != 1:
        im = im.transpose(Image.Transpose(_TRANSPOSE[orientation]))
        flags |= FLAG_ORIENTED
    im = _to_rgb(im)
    if shrink:
        tw, th = _target_size(orig[0], orig[1], opts.max_size)  # type: ignore[arg-type]
        target = (th, tw) if orientation in (5, 6, 7, 8) else (tw, th)
        if im.size != target:
            im = im.resize(target, Image.Resampling.LANCZOS)
        flags |= FLAG_RESIZED
    payload = _encode_png(im) if opts.pil_loader else _encode_jpeg(im, opts.quality)
    return payload, flags & ~FLAG_PROGRESSIVE, im.size[0], im.size[1]


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
            sof = _sof_marker(raw)
            bits = _sof_precision(raw)
            if sof is not None and bits not in (None, 8):
                raise _Refused(f"{bits}-bit {_frame_name(sof)} JPEG: only 8-bit JPEGs can be decoded and stored") from None
            raise _Refused("truncated or corrupt JPEG (cannot parse its header)") from None
        kind = next((k for sig, k in _SIGNATURES if raw.startswith(sig)), None)
        if kind:
            raise _Refused(f"corrupt {kind} (cannot identify image file)") from None
        raise _Refused("not an image (cannot identify image file)") from None
    except Exception as e:
        if is_jpeg and "truncated" in str(e).lower():
            raise _Refused("truncated JPEG (its header is cut short)") from None
        raise _Refused(f"corrupt {'JPEG' if is_jpeg else 'image'} header ({short_message(e)})") from None
    w, h = im.size
    _check_size(w, h, opts)
    jpeg = im.format in ("JPEG", "MPO")
    _check_side(w, h, opts, jpeg=jpeg)
    if jpeg:
        sof = _sof_marker(raw)
        if sof in _SOF_HUFFMAN:  # PIL decodes a scan cut short into grey without a word
            _check_jpeg_length(w, h, len(raw))
        return _from_jpeg(raw, im, opts, sof)
    fmt = im.format or "image"
    try:
        im.load()
    except Exception as e:
        what = "truncated" if "truncated" in str(e) else "corrupt"
        raise _Refused(f"{what} {fmt} ({short_message(e)})") from None
    payload, flags, sw, sh = _finish(im, opts, FLAG_CONVERTED, _orientation(im), (w, h))
    return payload, flags, sw, sh, w, h


def _from_jpeg(raw: bytes, im: Any, opts: ImageOptions, sof: int | None) -> tuple[bytes, int, int, int, int, int]:
    """A JPEG stored byte for byte when decoders all read it (8-bit RGB, Huffman SOF0/1/2,
    upright, within --max-size), else decoded and re-encoded (``FLAG_CONVERTED`` for
    another frame type or colour mode)."""
    w, h = im.size
    loaded = False
    if b"\xff\xd9" not in raw[-EOI_WINDOW:]:
        # No EOI at the end: truncated, or (rarely) data appended after the image. Decode to tell.
        try:
            im.load()
            loaded = True
        except Exception as e:
            if sof is not None and sof not in _SOF_PASSTHROUGH:
                raise _Refused(f"{_frame_name(sof)} JPEG cannot be decoded ({short_message(e)})") from None
            raise _Refused("truncated JPEG (no end-of-image marker)") from None
    orientation = _orientation(im)
    progressive = bool(im.info.get("progressive") or im.info.get("progression"))
    shrink = bool(opts.max_size) and max(w, h) > opts.max_size  # type: ignore[operator]
    plain = im.mode == "RGB" and getattr(im, "bits", 8) == 8 and sof in _SOF_PASSTHROUGH and _one_frame_of(raw, w, h)
    if plain and orientation == 1 and not shrink and not (opts.baseline and progressive):
        return raw, (FLAG_PROGRESSIVE if progressive else 0), w, h, w, h
    if plain and opts.pil_loader and not shrink and not (opts.baseline and progressive):
        # pil_loader does not turn it: the same bytes, its EXIF orientation tag set to 1 (the
        # DCT data untouched, so every decoder gives what pil_loader gives, and none turns it)
        return upright_tag(raw), (FLAG_PROGRESSIVE if progressive else 0), w, h, w, h
    flags = 0
    if not plain or (opts.baseline and progressive):
        flags |= FLAG_CONVERTED
    box = None
    if shrink and not loaded:  # DCT-domain pre-shrink to at least the target size; LANCZOS does the rest
        drafted = im.draft(None, _target_size(w, h, opts.max_size))  # type: ignore[arg-type]
        box = drafted[1] if drafted else None
    try:
        im.load()
    except Exception as e:
        if sof is not None and sof not in _SOF_PASSTHROUGH:
            raise _Refused(f"{_frame_name(sof)} JPEG cannot be decoded ({short_message(e)})") from None
        raise _Refused(f"corrupt JPEG ({short_message(e)})") from None
    payload, flags, sw, sh = _finish(im, opts, flags, orientation, (w, h), box)
    return payload, flags, sw, sh, w, h


def _from_pil(im: Any, opts: ImageOptions) -> tuple[bytes, int, int, int, int, int]:
    w, h = im.size
    _check_size(w, h, opts)
    _check_side(w, h, opts, jpeg=False)
    try:
        im.load()
    except Exception as e:
        raise _Refused(f"cannot load PIL image ({short_message(e)})") from None
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
    _check_side(w, h, opts, jpeg=False)
    mode = "L" if a.ndim == 2 else ("RGB" if a.shape[2] == 3 else "RGBA")
    im = Image.fromarray(np.ascontiguousarray(a), mode)
    payload, flags, sw, sh = _finish(im, opts, FLAG_CONVERTED, 1, (w, h))
    return payload, flags, sw, sh, w, h


# -- the fast path: a JPEG stored byte for byte, checked without PIL -------------------------

_SOF_PASSTHROUGH = {0xC0: False, 0xC1: False, 0xC2: True}  # SOF marker -> progressive (Huffman, 8-bit)
_SOF_ANY = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7, 0xC9, 0xCA, 0xCB, 0xCD, 0xCE, 0xCF}
_SOF_HUFFMAN = {0xC0, 0xC1, 0xC2, 0xC3, 0xC5, 0xC6, 0xC7}  # the others are arithmetic-coded
_SOF_NAMES = {
    0xC0: "baseline", 0xC1: "extended sequential", 0xC2: "progressive", 0xC3: "lossless",
    0xC5: "differential sequential", 0xC6: "differential progressive", 0xC7: "differential lossless",
    0xC9: "arithmetic-coded extended sequential", 0xCA: "arithmetic-coded progressive",
    0xCB: "arithmetic-coded lossless", 0xCD: "arithmetic-coded differential sequential",
    0xCE: "arithmetic-coded differential progressive", 0xCF: "arithmetic-coded differential lossless",
}  # fmt: skip


def _frame_name(sof: int) -> str:
    """The JPEG frame type of an SOFn marker in words, e.g. ``"lossless (SOF3)"``."""
    return f"{_SOF_NAMES[sof]} (SOF{sof - 0xC0})"


def _check_jpeg_length(w: int, h: int, nbytes: int) -> None:
    """Refuse a Huffman-coded JPEG too short for the size its header claims.

    Every 8x8 block of the full-resolution component costs at least one bit (its DC
    code), so a genuine ``w x h`` JPEG holds at least ``ceil(w/8) * ceil(h/8) / 8`` bytes.
    A shorter file has a forged or truncated scan that decoders fill with grey.
    """
    need = (-(-w // 8)) * (-(-h // 8)) // 8
    if nbytes < need:
        raise _Refused(f"JPEG header claims {w}x{h} pixels but the file has only {nbytes} bytes (at least {need} needed): forged or truncated")


def _sof_offsets(b: bytes) -> list[int]:
    """Where the SOFn segments before the first scan of a JPEG start, found by walking its
    segments from SOI (stops at anything that is not a marker)."""
    i, n, found = 2, len(b), []
    while i + 4 <= n and b[i] == 0xFF:
        m = b[i + 1]
        if m == 0xFF:
            i += 1
        elif 0xD0 <= m <= 0xD8 or m == 0x01:
            i += 2
        elif m in (0xD9, 0xDA):
            break
        else:
            if m in _SOF_ANY:
                found.append(i)
            i += 2 + ((b[i + 2] << 8) | b[i + 3])
    return found


def _sof_marker(b: bytes) -> int | None:
    """The first SOFn marker of a JPEG, found by walking its segments (None if there is none)."""
    found = _sof_offsets(b)
    return b[found[0] + 1] if found else None


def _sof_precision(b: bytes) -> int | None:
    """The sample precision (bits) in the first SOFn segment of a JPEG, if it has one."""
    found = _sof_offsets(b)
    return b[found[0] + 4] if found and found[0] + 4 < len(b) else None


def _one_frame_of(b: bytes | memoryview, w: int, h: int) -> bool:
    """Whether the readers will take this JPEG as it is: exactly one SOFn before its first
    scan, declaring ``w x h``, within the readers' segment walk (:func:`fastload.format.jpeg_frame`)."""
    frame = jpeg_frame(b, to_scan=True)
    return frame is not None and frame[1:] == (w, h)


def _ifd0_orientation(b: Any, t: int, end: int) -> tuple[int, int, int, str] | int | None:
    """The Orientation entry of the first IFD of an Exif TIFF structure at ``b[t:end]``:
    ``(its offset, its type, its count, byte order)``; 1 when it has none; None if unreadable."""
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
        tag, typ, n = struct.unpack_from(e + "HHI", b, p + 12 * k)
        if tag == _EXIF_ORIENTATION:
            return p + 12 * k, typ, n, e
    return 1


def _exif_orientation(b: memoryview, t: int, end: int) -> int | None:
    """Orientation from the TIFF structure of an Exif APP1 segment (1 if absent, None if unreadable)."""
    entry = _ifd0_orientation(b, t, end)
    if not isinstance(entry, tuple):
        return entry
    off, typ, _n, e = entry
    return struct.unpack_from(e + "H", b, off + 8)[0] if typ == 3 else None


def _orientation_entry(b: bytes, t: int, end: int) -> tuple[int, str] | None:
    """Where the value of the Orientation entry (a SHORT) of an Exif TIFF structure at
    ``b[t:end]`` is, with its byte order; None if it has none or is unreadable."""
    entry = _ifd0_orientation(b, t, end)
    if not isinstance(entry, tuple):
        return None
    off, typ, n, e = entry
    return (off + 8, e) if typ == 3 and n == 1 else None


def upright_tag(raw: bytes) -> bytes:
    """``raw`` (a JPEG) with the Orientation tag of its first Exif segment (the one PIL reads)
    set to 1, everything else byte for byte; ``raw`` itself when it has no such tag."""
    b, i, n = raw, 2, len(raw)
    while i + 4 <= n and b[i] == 0xFF:
        m = b[i + 1]
        if m == 0xFF:
            i += 1
            continue
        if 0xD0 <= m <= 0xD8 or m == 0x01:
            i += 2
            continue
        if m in (0xD9, 0xDA):
            break
        length = (b[i + 2] << 8) | b[i + 3]
        if m == 0xE1 and b[i + 4 : i + 10] == b"Exif\0\0":
            found = _orientation_entry(b, i + 10, min(n, i + 2 + length))
            if found is None:
                return raw
            at, e = found
            out = bytearray(raw)
            struct.pack_into(e + "H", out, at, 1)
            return bytes(out)
        i += 2 + length
    return raw


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


def _open_image_file(path: str, opts: ImageOptions) -> tuple[int, int]:
    """``(fd, size)`` of a regular file of at most :func:`max_file_bytes`, opened for reading.

    Opened non-blocking, so a FIFO (or a device) is refused from ``fstat``, never waited
    on, even when it replaced a regular file after the scan.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except ValueError:  # a NUL in the path
        raise _Refused("unreadable (the path contains a NUL character)") from None
    except OSError as e:
        try:  # a socket cannot be opened at all: say what it is
            mode = os.stat(path).st_mode
        except (OSError, ValueError):
            mode = stat.S_IFREG
        if not stat.S_ISREG(mode):
            raise _Refused(f"not a regular file ({file_kind(mode)})") from None
        raise _Refused(f"unreadable ({e.strerror or e})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _Refused(f"not a regular file ({file_kind(st.st_mode)})")
        if st.st_size > max_file_bytes(opts.max_pixels):
            raise _too_large(st.st_size, opts)
        os.set_blocking(fd, True)
    except BaseException as e:
        os.close(fd)
        if isinstance(e, OSError):
            raise _Refused(f"unreadable ({e.strerror or e})") from None
        raise
    return fd, st.st_size


def _read_file(path: str, opts: ImageOptions) -> bytes:
    """The bytes of an image file, never more than :func:`max_file_bytes` (it may grow)."""
    fd, size = _open_image_file(path, opts)
    limit = max_file_bytes(opts.max_pixels)
    chunks: list[bytes] = []
    got = 0
    try:
        with open(fd, "rb", buffering=0) as f:
            want = size  # the whole file as fstat saw it, then whatever it grew by
            while got <= limit:
                more = f.read(min(want or (1 << 20), limit + 1 - got))
                if not more:
                    break
                chunks.append(more)
                got += len(more)
                want = 0
    except OSError as e:
        raise _Refused(f"unreadable ({e.strerror or e})") from None
    if got > limit:
        raise _too_large(got, opts)
    return chunks[0] if len(chunks) == 1 else b"".join(chunks)


def read_image_file(path: str | os.PathLike, max_pixels: int) -> bytes:
    """The bytes of the image file at ``path``: a regular file (a FIFO or device is refused from
    ``fstat``, never waited on or read) of at most :func:`max_file_bytes` bytes (checked before
    reading, and again as it is read).

    Raises:
        BadImageError: naming the path and why it is refused.
    """
    try:
        return _read_file(os.fspath(path), ImageOptions(max_pixels=max_pixels))
    except _Refused as r:
        raise BadImageError(printable(os.fspath(path)), str(r.args[0])) from None


def fast_file(task: Task, opts: ImageOptions) -> bytes | bytearray | tuple | None:
    """The record of a plain JPEG file read straight into the record buffer, a
    ``("skip", ...)`` for an unreadable, empty, too large or non-regular file, or None:
    take the full path (which also takes anything unexpected here)."""
    try:
        return _fast_file(task, opts)
    except _Refused as r:
        return ("skip", task[4], printable(str(r.args[0])))
    except Exception:  # MemoryError, ...: the full path decides, and says why
        return None


def _fast_file(task: Task, opts: ImageOptions) -> bytes | bytearray | tuple | None:
    _kind, path, label, name, where = task
    path_b = name.encode("utf-8", "surrogateescape")[:65535]
    off = HEADER_SIZE + len(path_b)
    fd, size = _open_image_file(path, opts)
    try:
        with open(fd, "rb", buffering=0) as f:
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
        if not _one_frame_of(payload, w, h):
            return None  # past the readers' segment walk: the full path converts it
        _check_size(w, h, opts)
        _check_side(w, h, opts, jpeg=True)
        _check_jpeg_length(w, h, size)
        if (opts.max_size and max(w, h) > opts.max_size) or (opts.baseline and progressive):
            return None
        if b"\xff\xd9" not in bytes(payload[-EOI_WINDOW:]):
            return None  # truncated, or data after the image: the full path decodes to tell
        crc = payload_checksum(payload)
        del payload
    flags = FLAG_PROGRESSIVE if progressive else 0
    HEADER.pack_into(buf, 0, RECORD_MAGIC, RECORD_VERSION, ENC_JPEG, flags, label, w, h, w, h, crc, size, len(path_b), 0)
    buf[HEADER_SIZE:off] = path_b
    return buf


# -- the full path ------------------------------------------------------------------------------


def _record(out: tuple[bytes, int, int, int, int, int], label: int, name: str) -> bytes:
    payload, flags, sw, sh, ow, oh = out
    encoding = ENC_PNG if payload[:8] == PNG_SIGNATURE else ENC_JPEG  # PNG: only the lossless pil_loader payloads
    return encode_record(
        payload, label=label, encoding=encoding, width=sw, height=sh, orig_width=ow, orig_height=oh, flags=flags, path=name
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
            return _record(_from_bytes(_read_file(data, opts), opts), label, name)
        if kind == "bytes":
            if len(data) > max_file_bytes(opts.max_pixels):
                raise _too_large(len(data), opts, "image bytes")
            return _record(_from_bytes(data, opts), label, name)
        if kind == "pil":
            return _record(_from_pil(data, opts), label, name)
        if kind == "array":
            return _record(_from_array(data, opts), label, name)
        raise _Refused(str(data))  # "error": the item could not be fetched
    except _Refused as r:
        return ("skip", where, printable(str(r.args[0])))
    except MemoryError:
        return ("skip", where, "out of memory while decoding (lower --max-pixels?)")
    except Exception as e:  # anything else that goes wrong with one image is its reason, never the pack's end
        return ("skip", where, printable(f"cannot convert this image ({type(e).__name__}: {short_message(e)})"))
