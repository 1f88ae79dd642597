"""fastload.packing.images, more paths: a JPEG's end-of-image marker looked for at its end only, the
first decode's refusal of another frame type, plain JPEGs re-encoded only to shrink, PIL images shrunk,
the header walk of ``upright_tag`` (fill bytes, TEM, EOI, the file's last bytes), and a read error.

Oracles: ITU T.81 / TIFF 6.0 structures built by hand, whose byte offsets are known; the flags and
messages written out; the errno text of EIO (``Input/output error``).
"""

from __future__ import annotations

import io
import os
import struct

import numpy as np
import pytest
from PIL import Image

from fastload.format import FLAG_CONVERTED, FLAG_RESIZED, decode_header, record_payload
from fastload.packing.images import ImageOptions, process_task, upright_tag


def _seg(marker: int, body: bytes) -> bytes:
    """ITU T.81 B.1.1.4: FF, the marker, a big-endian length counting itself, the body."""
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(body)) + body


def _exif6() -> tuple[bytes, int]:
    """An Exif APP1 segment (little-endian TIFF, IFD0 with one SHORT Orientation 6) and the offset of the
    Orientation value in it: FFE1 + length (4), ``Exif\\0\\0`` (6), TIFF header (8), count (2), tag,
    type and count of the entry (8)."""
    tiff = b"II" + struct.pack("<HI", 42, 8) + struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, 6, 0)
    return _seg(0xE1, b"Exif\0\0" + tiff + struct.pack("<I", 0)), 4 + 6 + 8 + 2 + 8


def _jpeg(a: np.ndarray, **kw) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=90, **kw)
    return b.getvalue()


def _noise(h: int, w: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 256, (h, w, 3), np.uint8)


def _smooth(h: int, w: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([xx, 2 * yy, xx + yy], axis=-1).astype(np.uint8)


# ----------------------------------------------------------------------------- the end-of-image marker


def test_a_truncated_jpeg_with_an_eoi_inside_its_header_is_refused_as_truncated():
    """A JPEG cut inside its scan whose comment segment (bytes 6-88) holds FF D9: the end-of-image marker
    is looked for in its last 64 bytes only, so it is decoded and refused as truncated, not stored as
    it is. Written for: the window taken from the file's start rather than its end."""
    raw = _jpeg(_noise(128, 128))
    raw = raw[:2] + _seg(0xFE, b"x" * 80 + b"\xff\xd9") + raw[2:]
    cut = raw[: len(raw) * 4 // 5]
    assert b"\xff\xd9" in cut[64:] and b"\xff\xd9" not in cut[-64:]
    r = process_task(("bytes", cut, 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "truncated JPEG (no end-of-image marker)")


def test_a_cut_lossless_jpeg_is_refused_with_the_decoders_words():
    """A lossless (SOF3) JPEG cut inside its scan (no end-of-image marker) fails its first decode: refused
    naming the frame type and PIL's own message. Written for: the decoder's message lost from the reason."""
    raw = bytearray(_jpeg(_noise(64, 64)))
    raw[raw.index(b"\xff\xc0") + 1] = 0xC3
    r = process_task(("bytes", bytes(raw[: len(raw) * 4 // 5]), 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "lossless (SOF3) JPEG cannot be decoded (broken data stream when reading image file)")


def test_a_frame_header_cut_at_its_length_is_a_corrupt_header():
    """SOI then an SOF0 marker whose length (2) is the file's last two bytes: PIL cannot identify it and no
    precision byte is there, so ``truncated or corrupt JPEG (cannot parse its header)``. Written for: the
    precision read one byte past the end."""
    r = process_task(("bytes", b"\xff\xd8\xff\xc0\x00\x02", 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "truncated or corrupt JPEG (cannot parse its header)")


# ----------------------------------------------------------------------------- shrinking


@pytest.mark.parametrize("progressive, baseline", [(True, False), (False, True)])
def test_a_plain_jpeg_reencoded_only_to_shrink_is_flagged_resized_only(progressive, baseline):
    """A plain 64x40 RGB JPEG (progressive, or baseline under ``--baseline``) with ``--max-size 32``: a
    32x20 JPEG flagged exactly ``FLAG_RESIZED`` (it was no other frame type or mode, nor progressive
    under ``--baseline``). Written for: ``--baseline`` or progressive alone taken as a conversion."""
    raw = _jpeg(_smooth(40, 64), progressive=progressive)
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions(max_size=32, baseline=baseline))
    h = decode_header(out)
    assert (h.flags, h.width, h.height, h.orig_width, h.orig_height) == (FLAG_RESIZED, 32, 20, 64, 40)


def test_a_pil_image_is_shrunk_by_max_size_and_not_held_to_the_jpeg_side_limit():
    """A 65501x2 PIL image (wider than libjpeg reads, but no JPEG) with ``--max-size 100``: stored 100x1,
    flags converted and resized, the original size kept. Written for: the JPEG-source side check applied
    to PIL images, the source size not passed on to the shrink."""
    im = Image.fromarray(np.full((2, 65501, 3), 90, np.uint8))
    out = process_task(("pil", im, 0, "n", "w"), ImageOptions(max_size=100))
    assert isinstance(out, bytes), out
    h = decode_header(out)
    assert (h.flags, h.width, h.height, h.orig_width, h.orig_height) == (FLAG_CONVERTED | FLAG_RESIZED, 100, 1, 65501, 2)
    with Image.open(io.BytesIO(record_payload(out, h))) as stored:
        assert stored.size == (100, 1)


# ----------------------------------------------------------------------------- upright_tag's walk


def test_upright_tag_steps_over_one_fill_byte_and_a_tem_marker():
    """An Exif segment after one fill byte (FF), or after TEM (FF 01, no length), is found: only its
    Orientation value (offset by hand) becomes 1. Written for: a fill byte stepped as two, TEM taken for a
    segment with a length."""
    exif, at = _exif6()
    for lead in (b"\xff", b"\xff\x01"):
        raw = b"\xff\xd8" + lead + exif + b"\xff\xda"
        k = 2 + len(lead) + at
        assert raw[k : k + 2] == b"\x06\x00"
        assert upright_tag(raw) == raw[:k] + b"\x01\x00" + raw[k + 2 :]


@pytest.mark.parametrize("after_eoi", [b"", b"\x00\x02"], ids=["at once", "after two bytes"])
def test_upright_tag_does_not_read_past_an_end_of_image_marker(after_eoi):
    """An Exif segment after an EOI marker (FF D9) is not read, whether it follows the marker at once or
    after two bytes that could be read as a length: the bytes are returned unchanged. Written for: EOI
    taken for a marker without a length, or for a segment with one."""
    exif, _ = _exif6()
    raw = b"\xff\xd8\xff\xd9" + after_eoi + exif + b"\xff\xda"
    assert upright_tag(raw) == raw


def test_upright_tag_stops_before_the_last_four_bytes():
    """Bytes whose last three are fill bytes (FF FF FF after SOI): no segment fits, the bytes come back
    unchanged and nothing is read past the end. Written for: the walk's bound loosened past the end."""
    raw = b"\xff\xd8\xff\xff\xff"
    assert upright_tag(raw) == raw


# ----------------------------------------------------------------------------- reading a file


@pytest.mark.skipif(not os.path.exists("/proc/self/mem"), reason="needs Linux's /proc/self/mem")
def test_a_regular_file_whose_read_fails_is_refused_with_the_os_error():
    """``/proc/self/mem`` is a regular file (of size 0) whose read at offset 0 fails with EIO: refused as
    ``unreadable (Input/output error)``. Written for: the read error's text lost from the reason."""
    r = process_task(("file", "/proc/self/mem", 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "unreadable (Input/output error)")


def test_a_socket_is_refused_as_not_a_regular_file(tmp_path):
    """A Unix socket cannot be opened at all; its mode then says what it is: ``not a regular file
    (socket)``. Written for: the reason lost when the open fails."""
    import socket

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.bind(str(tmp_path / "s.jpg"))
        r = process_task(("file", str(tmp_path / "s.jpg"), 0, "n", "w"), ImageOptions())
    finally:
        s.close()
    assert r == ("skip", "w", "not a regular file (socket)")


def test_a_strip_past_the_aspect_ratio_is_refused_with_its_resize_written_out():
    """A 1x1366 array: Resize(256) would make it 349696x256 = 89522176 pixels, more than 89478485, so it is
    refused with that whole message (no "stored" size: it is not shrunk). Written for: the product taken
    as a quotient, the stored size shown or misnamed for an image kept at its size."""
    r = process_task(("array", np.zeros((1, 1366), np.uint8), 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", (
        "1366x1 pixels: aspect ratio above 1365:1 (MAX_ASPECT_RATIO): resizing its shorter side to 256 pixels, "
        "as an evaluation Resize(256) does, would make it 349696x256 = 89522176 pixels, more than 89478485; "
        "crop or split it"))  # fmt: skip


# ----------------------------------------------------------------------------- the header walks


_SOF0 = _seg(0xC0, struct.pack(">BHHB", 8, 30, 40, 3) + bytes([1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1]))
_SOS = _seg(0xDA, bytes([3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0]))


def test_sof_offsets_steps_over_soi_and_lengths_and_stops_at_eoi():
    """``_sof_offsets`` steps over a stray SOI (no length) and an APP0 of length 0x0102 (offsets by hand),
    and stops at EOI even when two bytes after it could be a length. Written for: SOI taken for a segment,
    the length's high byte lost, EOI walked past."""
    from fastload.packing.images import _sof_offsets

    assert _sof_offsets(b"\xff\xd8\xff\xd8\xff\xc0\x00\x11") == [4]
    assert _sof_offsets(b"\xff\xd8\xff\xe0\x01\x02" + b"x" * 256 + b"\xff\xc0\x00\x11") == [262]
    assert _sof_offsets(b"\xff\xd8\xff\xd9\x00\x02\xff\xc0\x00\x11") == []


def test_scan_jpeg_walk_tem_eoi_and_the_buffers_end():
    """``scan_jpeg``: a frame after TEM (FF 01, no length) is found; one after an EOI is not (None); three
    trailing fill bytes give None without reading past the end. Written for: TEM taken for a segment, EOI
    stepped over, the walk's bound loosened past the end."""
    from fastload.packing.images import scan_jpeg

    assert scan_jpeg(memoryview(b"\xff\xd8\xff\x01" + _SOF0 + _SOS)) == (40, 30, False)
    assert scan_jpeg(memoryview(b"\xff\xd8\xff\xd9" + _SOF0 + _SOS)) is None
    assert scan_jpeg(memoryview(b"\xff\xd8\xff\xff\xff")) is None


def test_scan_jpeg_refuses_a_zero_height_and_takes_a_short_frame_header():
    """A frame of height 0 (width 40) is refused (None); a frame header of length 8 (its four fields, no
    component table) is still read. Written for: both sides needed zero to refuse, the length bound off."""
    from fastload.packing.images import scan_jpeg

    zero_h = _seg(0xC0, struct.pack(">BHHB", 8, 0, 40, 3) + bytes([1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1]))
    assert scan_jpeg(memoryview(b"\xff\xd8" + zero_h + _SOS)) is None
    short = _seg(0xC0, struct.pack(">BHHB", 8, 30, 40, 3))
    assert scan_jpeg(memoryview(b"\xff\xd8" + short + _SOS)) == (40, 30, False)


def test_scan_jpeg_reads_only_the_first_exif_up_to_its_segments_end():
    """An Exif with Orientation 1 whose IFD0 ends exactly at the segment's end is read (the frame is
    returned); a second Exif saying 6 is ignored, as PIL ignores it. Written for: the segment's end taken
    4 bytes short, the second Exif read."""
    from fastload.packing.images import scan_jpeg

    tiff = b"II" + struct.pack("<HI", 42, 8) + struct.pack("<H", 1) + struct.pack("<HHIHH", 0x0112, 3, 1, 1, 0)
    first = _seg(0xE1, b"Exif\0\0" + tiff)
    second, _ = _exif6()
    assert scan_jpeg(memoryview(b"\xff\xd8" + first + second + _SOF0 + _SOS)) == (40, 30, False)


def test_a_jpeg_side_of_exactly_the_decoders_limit_is_packed():
    """A 65500x48 JPEG (a side of exactly JPEG_MAX_SIDE, within the aspect-ratio bound) is packed, not refused:
    libjpeg reads sides up to 65500 inclusive. Kills: ``>=`` for ``>`` in the JPEG side check."""
    import io

    from PIL import Image

    buf = io.BytesIO()
    Image.new("RGB", (65500, 48), (10, 20, 30)).save(buf, "JPEG")
    out = process_task(("bytes", buf.getvalue(), 0, "n", "w"), ImageOptions())
    assert isinstance(out, bytes)


@pytest.mark.parametrize("shape, size", [((5, 0, 3), "0x5"), ((0, 5, 3), "5x0")])
def test_an_array_with_no_width_or_no_height_is_refused_as_an_invalid_size(shape, size):
    """Kills: ``w < 0`` for ``w <= 0`` (a width of 0 then passes the size check)."""
    import numpy as np

    assert process_task(("array", np.zeros(shape, np.uint8), 0, "n", "w"), ImageOptions()) == ("skip", "w", f"invalid image size {size}")


@pytest.mark.parametrize("w, h", [(3, 5), (5, 3), (2, 7), (7, 2), (6, 6), (255, 256)])
def test_eval_resize_pixels_is_torchvisions_resize(w, h):
    """The size ``Resize(256)`` gives a ``w x h`` image, taken from torchvision resizing a tensor of that
    size. Kills: the long side computed as ``short / h / w``."""
    import torch
    from torchvision.transforms import functional as F

    from fastload.packing.images import eval_resize_pixels

    out = F.resize(torch.zeros(1, h, w), 256, antialias=False)
    assert eval_resize_pixels(w, h) == (out.shape[2], out.shape[1])


def test_a_whole_lossless_jpeg_that_fails_to_decode_is_refused_with_the_decoders_words():
    """A lossless (SOF3) JPEG whole, its end-of-image marker in place, so only the final decode reads it:
    refused naming the frame type and PIL's own message. Written for: the decoder's message lost from that
    (second) refusal."""
    raw = bytearray(_jpeg(_noise(64, 64)))
    raw[raw.index(b"\xff\xc0") + 1] = 0xC3
    assert raw[-2:] == b"\xff\xd9"
    r = process_task(("bytes", bytes(raw), 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "lossless (SOF3) JPEG cannot be decoded (broken data stream when reading image file)")


def test_scan_jpeg_stops_at_an_end_of_image_before_the_scan():
    """A frame, then an end-of-image marker (FF D9) and what would read as a 2-byte segment and a scan: the
    image ended before its scan, so it is not one to store as it is (None). Written for: EOI matched as
    another marker (the walk then read past it and found the scan)."""
    from fastload.packing.images import scan_jpeg

    sof = _seg(0xC0, struct.pack(">BHHB", 8, 48, 64, 3) + bytes([1, 0x11, 0, 2, 0x11, 1, 3, 0x11, 1]))
    sos = _seg(0xDA, bytes([3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0]))
    assert scan_jpeg(memoryview(b"\xff\xd8" + sof + sos)) == (64, 48, False)  # the same without the EOI: a plain JPEG
    assert scan_jpeg(memoryview(b"\xff\xd8" + sof + b"\xff\xd9\x00\x02" + sos)) is None


@pytest.mark.parametrize("w, h, need", [(64, 64, 8), (65, 64, 9), (8, 8, 0), (1000, 8, 15)])
def test_a_jpeg_exactly_as_long_as_its_blocks_need_is_accepted(w, h, need):
    """The rule by hand: one bit per 8x8 block at least, ``ceil(w/8) * ceil(h/8) // 8`` bytes (64x64: 64 blocks,
    8 bytes; 65x64: 72 blocks, 9; 1000x8: 125 blocks, 15). A file of exactly that many bytes passes, one byte
    fewer is refused as forged or truncated. Written for: a file of exactly the bound refused (``<=``)."""
    from fastload.packing.images import _check_jpeg_length, _Refused

    _check_jpeg_length(w, h, need)
    if need:
        with pytest.raises(_Refused) as e:
            _check_jpeg_length(w, h, need - 1)
        assert str(e.value) == (
            f"JPEG header claims {w}x{h} pixels but the file has only {need - 1} bytes (at least {need} needed): "
            "forged or truncated"
        )
