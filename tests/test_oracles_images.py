"""fastload.packing.images as tables: EXIF orientation 1-8 x ``--max-size`` x source format, and sizes that
do not divide by the JPEG DCT scale, against PIL's own ``ImageOps.exif_transpose`` and a full-scale
decode resized by LANCZOS.

The stored size is written out by hand for every case (64x40 with ``--max-size 32`` is 32x20, turned
20x32 by orientations 5-8; a 1001-px JPEG shrunk to 250 px goes through a 1/4 draft of 251 px
first), the flags from the rules in docs/format.md, and the pixels against the oracle within the
JPEG tolerance measured for these gradients; every other orientation of the source lands far away.
"""

from __future__ import annotations

import io
import struct

import numpy as np
import pytest
from PIL import Image, ImageOps

from fastload.format import FLAG_CONVERTED, FLAG_ORIENTED, FLAG_RESIZED, decode_header, record_payload
from fastload.packing.images import ImageOptions, process_task

W, H = 64, 40


def gradient(w=W, h=H) -> np.ndarray:
    """No symmetry: R = x, G = y, B = x * y (each scaled to 0..255), so each orientation differs."""
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([np.rint(xx * 255.0 / (w - 1)), np.rint(yy * 255.0 / (h - 1)),
                     np.rint(xx * yy * 255.0 / ((w - 1) * (h - 1)))], axis=-1).astype(np.uint8)  # fmt: skip


def encode(a: np.ndarray, fmt: str, orientation: int | None) -> bytes:
    kw = {}
    if orientation is not None:
        e = Image.Exif()
        e[0x0112] = orientation
        kw["exif"] = e.tobytes()
    if fmt == "JPEG":
        kw.update(quality=100, subsampling=0)
    if fmt == "WEBP":
        kw.update(lossless=True)
    b = io.BytesIO()
    Image.fromarray(a).save(b, fmt, **kw)
    return b.getvalue()


def pack_one(raw: bytes, **opts):
    out = process_task(("bytes", raw, 3, "x/img", "x/img"), ImageOptions(**opts))
    assert isinstance(out, bytes), out
    header = decode_header(out)
    payload = record_payload(out, header)
    with Image.open(io.BytesIO(payload)) as im:
        return header, payload, np.asarray(im.convert("RGB"))


def oracle(raw: bytes, size: tuple[int, int] | None) -> np.ndarray:
    with Image.open(io.BytesIO(raw)) as im:
        up = ImageOps.exif_transpose(im).convert("RGB")
    if size is not None and up.size != size:
        up = up.resize(size, Image.Resampling.LANCZOS)
    return np.asarray(up)


def mean_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


#: max_size -> the stored (w, h) of the 64x40 source upright (orientations 1-4); 5-8 swap them.
SIZES = {None: (64, 40), 100: (64, 40), 64: (64, 40), 63: (63, 39), 32: (32, 20), 7: (7, 4), 1: (1, 1)}


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "TIFF"])
@pytest.mark.parametrize("max_size", list(SIZES))
@pytest.mark.parametrize("orientation", [None, 1, 2, 3, 4, 5, 6, 7, 8])
def test_orientation_x_max_size_x_format(fmt, max_size, orientation):
    """Kills: an orientation mapped to another turn (5 and 7, the transposes, above all); the sides not
    swapped for 5-8 when shrinking (a 32x20 box squeezed into 20x32 the wrong way round); the size from the
    turned image; ``>`` for ``>=`` at ``--max-size 64`` (no shrink at the size itself); the flags; the
    upright plain JPEG not stored byte for byte; another resampling."""
    raw = encode(gradient(), fmt, orientation)
    header, payload, got = pack_one(raw, max_size=max_size)
    turned = orientation in (5, 6, 7, 8)
    w, h = SIZES[max_size]
    want_size = (h, w) if turned else (w, h)
    assert (header.width, header.height) == want_size and got.shape == (want_size[1], want_size[0], 3)
    oriented = orientation not in (None, 1)
    shrunk = max_size is not None and max_size < 64
    if fmt == "TIFF":
        # PIL's TIFF decoder turns the image itself (and drops the tag): fastload sees it upright, of
        # the upright size, so it flags no orientation of its own; the pixels are upright all the same
        assert (header.orig_width, header.orig_height) == ((H, W) if turned else (W, H))
        assert not header.flags & FLAG_ORIENTED
    else:
        assert (header.orig_width, header.orig_height) == (W, H)
        assert bool(header.flags & FLAG_ORIENTED) == oriented
    assert bool(header.flags & FLAG_RESIZED) == shrunk
    assert bool(header.flags & FLAG_CONVERTED) == (fmt != "JPEG")
    if fmt == "JPEG" and not oriented and not shrunk:
        assert payload == raw
    want = oracle(raw, want_size)
    tol = 1.5 if min(want_size) >= 16 else 16.0
    assert mean_diff(got, want) <= tol
    if min(want_size) >= 16:
        for t in Image.Transpose:  # any other turn or mirror of the source is far away
            with Image.open(io.BytesIO(raw)) as im:
                other = im.convert("RGB").transpose(t)
            other = np.asarray(other.resize(want_size, Image.Resampling.LANCZOS) if other.size != want_size else other)
            if other.shape == want.shape and mean_diff(other, want) > 8:
                assert mean_diff(got, other) > 4 * tol, (orientation, t)


#: (source w, h, max_size) -> the stored size, by hand: the longer side is max_size, the shorter
#: round(short * max_size / long), at least 1; and the mean difference allowed from a full-scale
#: decode shrunk by LANCZOS. None of these sources divide by their DCT scale. Measured (libjpeg-turbo,
#: pillow-simd 12.1): 0.47-0.71 with the draft's box, 0.52-0.73 when the partial last block is
#: stretched over a whole pixel (the 1001-px tolerances tell the two apart); the strips' large
#: differences are the draft's 8-row blocks on a 13- or 19-row side (13 and 31 without the box).
ODD = [
    ((1001, 1001, 250), (250, 250), 0.6),  # a 1/4 draft gives 251x251 (the last a quarter pixel of source)
    ((1001, 1001, 500), (500, 500), 0.5),  # 1/2 draft: 501
    ((1001, 1001, 126), (126, 126), 0.62),  # 1/4 draft: 251 again (1/8 would be 126: not below the target)
    ((500, 375, 100), (100, 75), 0.75),  # 1/4 draft: 125x94, then 100x75
    ((375, 500, 100), (75, 100), 0.75),
    ((500, 375, 63), (63, 47), 0.8),  # 1/8 draft: 63x47
    ((1001, 13, 100), (100, 1), 8.0),  # round(1.3) = 1
    ((1001, 19, 100), (100, 2), 26.0),  # round(1.898) = 2
]


@pytest.mark.parametrize("src, want_size, tol", ODD, ids=[f"{w}x{h}-{m}" for (w, h, m), _, _ in ODD])
@pytest.mark.parametrize("orientation", [1, 6])
def test_sizes_that_do_not_divide_by_the_dct_scale(src, want_size, tol, orientation):
    """A JPEG shrunk through a DCT draft whose size is not a multiple of the scale: the stored size is
    the hand-computed one (from the source size, never the draft's), the pixels those of a full-scale
    decode resized by LANCZOS. Kills: the size taken from the draft (251 for 250), the draft asked for
    less than the target (a later upscale), floor or ceil for round, the sides swapped, the draft's
    box not passed to the resize (the partial last block stretched over a whole pixel)."""
    w, h, m = src
    raw = encode(gradient(w, h), "JPEG", orientation)
    header, _, got = pack_one(raw, max_size=m)
    size = (want_size[1], want_size[0]) if orientation == 6 else want_size
    assert (header.width, header.height) == size and (header.orig_width, header.orig_height) == (w, h)
    assert header.flags & FLAG_RESIZED
    assert mean_diff(got, oracle(raw, size)) <= tol


def _encoded(fmt: str) -> bytes:
    b = io.BytesIO()
    Image.fromarray(np.full((40, 60, 3), 90, np.uint8)).save(b, fmt)
    return b.getvalue()


def _refused_bytes():
    jpg, png = _encoded("JPEG"), _encoded("PNG")
    i = png.index(b"IDAT") + 8  # the compressed pixels, scrambled: a zlib error, not a short file
    scrambled = png[:i] + bytes(b ^ 0x55 for b in png[i : i + 20]) + png[i + 20 :]
    return [
        (b"", "zero-byte file"),
        (b"hello, not an image at all", "not an image (cannot identify image file)"),
        (b"\xff\xd8\xff" + b"\x00" * 20, "truncated or corrupt JPEG (cannot parse its header)"),
        (jpg[:30], "truncated JPEG (its header is cut short)"),
        (b"GIF89a" + b"\x00" * 5, "corrupt GIF (cannot identify image file)"),
        (png[:60], "truncated PNG (image file is truncated)"),
        (scrambled, "corrupt PNG (broken data stream when reading image file)"),
    ]


@pytest.mark.parametrize("k", range(7))
def test_each_refused_payload_says_what_is_wrong_with_it(k):
    """The reason each kind of bad payload is skipped with, exactly: an empty file, text, a JPEG whose
    header is garbage or cut short, a bare GIF signature, a PNG cut short and one whose pixels do not
    inflate. Kills: each message changed; the JPEG test inverted; ``truncated`` looked for in upper case,
    or always or never found; the decoder's own words left out."""
    raw, reason = _refused_bytes()[k]
    assert process_task(("bytes", raw, 3, "x/img", "x/img"), ImageOptions()) == ("skip", "x/img", reason)


# ----------------------------------------------------------------------------- the Exif orientation, by the TIFF spec


def _tiff(order: bytes, entries, *, ifd: int = 8) -> bytes:
    """A TIFF structure (TIFF 6.0, section 2) written out: header, padding to IFD0 at ``ifd``, IFD0's
    entries ``(tag, type, count, value)`` (a SHORT value left-justified in its 4 bytes), no next IFD."""
    e = "<" if order == b"II" else ">"
    out = order + struct.pack(e + "HI", 42, ifd) + b"\0" * (ifd - 8) + struct.pack(e + "H", len(entries))
    for tag, typ, count, value in entries:
        out += struct.pack(e + "HHI", tag, typ, count) + (struct.pack(e + "H", value) + b"\0\0" if typ == 3 else struct.pack(e + "I", value))
    return out + struct.pack(e + "I", 0)


def _with_exif(tiff: bytes) -> bytes:
    jpg = _encoded("JPEG")  # 60 x 40, baseline, no Exif
    body = b"Exif\0\0" + tiff
    return jpg[:2] + b"\xff\xe1" + struct.pack(">H", 2 + len(body)) + body + jpg[2:]


OTHER = [(0x010F, 2, 4, 0), (0x0110, 2, 4, 0), (0x011A, 5, 1, 0), (0x0131, 2, 4, 0)]  # Make, Model, XResolution, Software


@pytest.mark.parametrize("order", [b"II", b"MM"])
@pytest.mark.parametrize("ifd", [8, 26])
def test_scan_jpeg_reads_the_exif_orientation_in_either_byte_order(order, ifd):
    """A JPEG whose Exif says orientation 1, or has no orientation tag, is plain (stored byte for byte); one
    that says 6 is not; the tag after four others and as the fifth of five entries (the IFD fills its
    segment exactly). Malformed structures are not plain. Kills: a byte order not recognised or its format
    changed, the IFD offset read from the wrong place or bound off by one, the entry count or the entries'
    stride misread, the tag test inverted, no orientation taken as another than 1, the value read from
    the wrong offset."""
    from fastload.packing.images import scan_jpeg

    plain = (60, 40, False)
    assert scan_jpeg(memoryview(_encoded("JPEG"))) == plain
    assert scan_jpeg(memoryview(_with_exif(_tiff(order, OTHER + [(0x0112, 3, 1, 1)], ifd=ifd)))) == plain
    assert scan_jpeg(memoryview(_with_exif(_tiff(order, [(0x0112, 3, 1, 1)] + OTHER, ifd=ifd)))) == plain
    assert scan_jpeg(memoryview(_with_exif(_tiff(order, OTHER, ifd=ifd)))) == plain
    for v in (6, 3, 8, 2):
        assert scan_jpeg(memoryview(_with_exif(_tiff(order, OTHER + [(0x0112, 3, 1, v)], ifd=ifd)))) is None, v
        assert scan_jpeg(memoryview(_with_exif(_tiff(order, [(0x0112, 3, 1, v)] + OTHER[:2], ifd=ifd)))) is None, v
    good = _tiff(order, OTHER + [(0x0112, 3, 1, 1)], ifd=ifd)
    e = "<" if order == b"II" else ">"
    malformed = [
        b"XY" + good[2:],  # no byte order
        good[:4] + struct.pack(e + "I", 4) + good[8:],  # IFD0 inside the header
        good[:-4 - 12],  # the last entry cut off: the count runs past the segment
        good[:8],  # a header and nothing else
    ]
    for tiff in malformed:
        assert scan_jpeg(memoryview(_with_exif(tiff))) is None


def _seg(marker: int, body: bytes) -> bytes:
    """A JPEG marker segment (ITU T.81 B.1.1.4): FF, the marker, a big-endian length counting itself, the body."""
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(body)) + body


def _sof(w: int, h: int, marker: int = 0xC0) -> bytes:
    return _seg(marker, struct.pack(">BHHB", 8, h, w, 3) + bytes([1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1]))


SOS = _seg(0xDA, bytes([3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0]))


def test_scan_jpeg_walks_marker_segments_as_t81_lays_them_out():
    """Headers written out from ITU T.81 annex B (no pixels: ``scan_jpeg`` stops at the scan): a long APP
    segment (length over 255), fill bytes and a restart marker before a frame over 32767 pixels wide; the
    scan's header the last bytes there are. Kills: the length's high byte shifted the wrong way, fill bytes
    or parameterless markers stepped wrongly (the walk would loop or misread), the frame's sizes read as
    signed, the loop's end bound, a second frame or a segment running past the end accepted, the SOI test
    with ``and``, progressive not told from baseline."""
    from fastload.packing.images import scan_jpeg

    soi, app = b"\xff\xd8", _seg(0xE1, b"x" * 300)
    head = soi + app + b"\xff\xff\xff" + _seg(0xE0, b"JFIF\0") + b"\xff\xd0" + _sof(40000, 30000)
    assert scan_jpeg(memoryview(head + SOS + b"\x12\x34")) == (40000, 30000, False)
    assert scan_jpeg(memoryview(head + SOS)) == (40000, 30000, False)
    assert scan_jpeg(memoryview(head + b"\xff\xda\x00\x02")) == (40000, 30000, False)  # the scan header ends the data
    assert scan_jpeg(memoryview(soi + _sof(640, 480, 0xC2) + SOS)) == (640, 480, True)
    assert scan_jpeg(memoryview(head + SOS[:-2])) is None  # the scan's header cut short
    assert scan_jpeg(memoryview(head + _sof(40000, 30000) + SOS)) is None  # two frames
    assert scan_jpeg(memoryview(b"\x00" + head[1:] + SOS)) is None  # not SOI
