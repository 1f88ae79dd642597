"""fastload.packing.images, the held-out sample ``[19]``: the JPEG and Exif header walks at their boundaries
(a field that ends exactly at the buffer's end, counts and offsets read unsigned, EOI and DQT in the walk),
the aspect-ratio refusal's message, the pil_loader tag rewrite of progressive JPEGs, and file reads.

Oracles: TIFF 6.0 / ITU T.81 structures built by hand with ``struct``, whose offsets and values are known
because the test wrote them; messages written out with their numbers computed by hand; PIL's own decode,
resize and encode for the pixels; the file's own bytes for what is read.
"""

from __future__ import annotations

import builtins
import errno
import io
import mmap
import os
import struct
import warnings

import numpy as np
import pytest
from PIL import Image

import fastload.packing.images as images
from fastload.format import (
    ENC_JPEG,
    FLAG_CONVERTED,
    FLAG_PROGRESSIVE,
    FLAG_RESIZED,
    decode_header,
    record_payload,
)
from fastload.packing.images import (
    ImageOptions,
    _ifd0_orientation,
    _sof_offsets,
    _sof_precision,
    process_task,
    scan_jpeg,
    upright_tag,
)

from test_oracles_images2 import coords, grows_after_fstat, tiff_ifd


def _seg(marker: int, body: bytes) -> bytes:
    """ITU T.81 B.1.1.4: FF, the marker, a big-endian length counting itself, the body."""
    return bytes([0xFF, marker]) + struct.pack(">H", 2 + len(body)) + body


def _jpeg(a: np.ndarray, **save) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=90, **save)
    return b.getvalue()


def _jpeg_with_orientation(a: np.ndarray, orientation: int, **save) -> bytes:
    e = Image.Exif()
    e[0x0112] = orientation
    return _jpeg(a, exif=e.tobytes(), **save)


def _sof0(w: int, h: int, ncomp: int = 3) -> bytes:
    comps = b"".join(bytes([k + 1, 0x11, 0]) for k in range(ncomp))
    return _seg(0xC0, struct.pack(">BHHB", 8, h, w, ncomp) + comps)


_SOS = _seg(0xDA, bytes([3, 1, 0, 2, 0x11, 3, 0x11, 0, 63, 0]))


# ----------------------------------------------------------------------------- the Exif IFD0 walk


def test_a_tiff_header_cut_short_at_the_buffers_end_is_unreadable_not_an_error():
    """A TIFF structure at offset 5 of a buffer that ends 5 bytes into it (no room for IFD0's offset): None,
    nothing read past the buffer. Written for: the structure's length taken as ``end + t``."""
    b = b"\xaa" * 5 + b"II*\0\x08"
    assert _ifd0_orientation(b, 5, len(b)) is None


@pytest.mark.parametrize("cut", [8, 9])
def test_ifd0s_count_cut_by_the_buffers_end_is_unreadable_not_an_error(cut):
    """IFD0 at offset 8 of a buffer that ends at 8 or 9 (its 2-byte entry count missing or cut): None, no
    read past the end. Written for: the count's bound checked as ``p - 2 > end``."""
    b = (b"II" + struct.pack("<HI", 42, 8) + struct.pack("<H", 0))[:cut]
    assert _ifd0_orientation(b, 0, len(b)) is None


@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_ifd0s_entry_count_is_unsigned(order):
    """TIFF 6.0: the entry count is an unsigned SHORT. A count of 32768 whose entries run past the buffer is
    unreadable (None); the same count with all 32768 entries there (393,216 bytes), the first the
    Orientation entry, finds that entry at offset 10. Written for: the count read as a signed short
    (negative: no entry, "no orientation")."""
    e = "<" if order == b"II" else ">"
    head = order + struct.pack(e + "HI", 42, 8) + struct.pack(e + "H", 0x8000)
    first = struct.pack(e + "HHI", 0x0112, 3, 1) + struct.pack(e + "H", 6) + b"\0\0"
    short = head + first
    assert _ifd0_orientation(short, 0, len(short)) is None
    whole = head + first + (struct.pack(e + "HHI", 0x010F, 2, 4) + b"abcd") * (0x8000 - 1)
    assert len(whole) == 10 + 12 * 0x8000
    assert _ifd0_orientation(whole, 0, len(whole)) == (10, 3, 1, e)


@pytest.mark.parametrize("order", [b"II", b"MM"])
def test_the_orientation_entrys_type_and_count_are_read_unsigned(order):
    """An Orientation entry of type 65535 and count 4294967295 (the largest SHORT and LONG): returned as
    exactly those. Written for: the entry's fields read as signed (-1, -1)."""
    e = "<" if order == b"II" else ">"
    b = tiff_ifd(order, [(0x0112, 0xFFFF, 0xFFFFFFFF, b"\0\0\0\0")])
    assert _ifd0_orientation(b, 0, len(b)) == (10, 0xFFFF, 0xFFFFFFFF, e)


def test_ifd0s_offset_is_unsigned(tmp_path):
    """TIFF 6.0: IFD0's offset is an unsigned LONG. A structure (a sparse 2 GiB file, mapped) whose IFD0
    lies 2**31 bytes past its header: its Orientation entry is found there, at ``2**31 + 2``. Written for:
    the offset read as signed (negative: unreadable)."""
    p = tmp_path / "big.tif"
    off = 1 << 31
    with open(p, "wb") as f:
        f.write(b"II" + struct.pack("<HI", 42, off))
        f.seek(off)
        f.write(struct.pack("<H", 1) + struct.pack("<HHI", 0x0112, 3, 1) + struct.pack("<H", 6) + b"\0\0")
        f.write(struct.pack("<I", 0))
    with open(p, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        assert _ifd0_orientation(m, 0, len(m)) == (off + 2, 3, 1, "<")


# ----------------------------------------------------------------------------- scan_jpeg


@pytest.mark.parametrize(
    "w, h, ncomp, ok",
    [(40, 30, 3, True), (40, 30, 1, False), (40, 30, 4, False), (0, 30, 3, False), (40, 0, 3, False)],
)
def test_scan_jpeg_takes_only_three_component_frames_of_a_size(w, h, ncomp, ok):
    """An 8-bit SOF0 header of 3 components and a size is a plain JPEG ``(w, h, False)``; greyscale (1),
    CMYK (4), a width or a height of 0 are not (None: the full path). Written for: the component test
    joined to the width test by ``and``."""
    raw = b"\xff\xd8" + _sof0(w, h, ncomp) + _SOS
    assert scan_jpeg(memoryview(raw)) == ((w, h, False) if ok else None)


def test_scan_jpeg_refuses_an_exif_too_short_for_a_tiff_header_at_the_buffers_end():
    """An Exif APP1 whose body is ``Exif\\0\\0`` and 5 TIFF bytes, ending the buffer: its TIFF structure is
    unreadable, so None (the full path), not an error. Written for: the structure's length taken as
    ``end + t``."""
    raw = b"\xff\xd8" + _sof0(40, 30) + _seg(0xE1, b"Exif\0\0II*\0\x08")
    assert scan_jpeg(memoryview(raw)) is None


def test_scan_jpeg_reads_the_exif_only_within_its_segments_length():
    """An Exif segment (orientation 1) whose declared length ends one byte before its Orientation entry
    does: the entry is past the segment, the Exif unreadable, so None; its last byte is FF, so the walk
    would go on (a fill byte) to SOF0 and SOS. Declared whole, the same header is plain: (40, 30, False).
    Written for: the segment's end taken one byte too far."""
    tiff = tiff_ifd(b"II", [(0x0112, 3, 1, struct.pack("<H", 1) + b"\0\xff")])[:-4]  # the entry ends the body
    body = b"Exif\0\0" + tiff
    rest = _sof0(40, 30) + _SOS
    cut = b"\xff\xd8\xff\xe1" + struct.pack(">H", 2 + len(body) - 1) + body + rest
    assert scan_jpeg(memoryview(cut)) is None
    whole = b"\xff\xd8\xff\xe1" + struct.pack(">H", 2 + len(body)) + body + rest
    assert scan_jpeg(memoryview(whole)) == (40, 30, False)


# ----------------------------------------------------------------------------- SOF walk and precision


def test_sof_offsets_stops_at_the_end_of_image():
    """An SOF0 after an EOI (FFD9) is not a frame of this image: none found. Written for: EOI taken for a
    parameterless marker and stepped over."""
    assert _sof_offsets(b"\xff\xd8\xff\xd9\xff\xc0\x00\x11") == []


def test_sof_offsets_steps_over_a_segment_by_both_bytes_of_its_length():
    """An APP2 of length 0x0134 (310 bytes with its marker) before SOF0: the frame is found at 2 + 310.
    Written for: the length's high byte shifted by 9."""
    raw = b"\xff\xd8" + _seg(0xE2, b"y" * 306) + b"\xff\xc0\x00\x11"
    assert _sof_offsets(raw) == [312]


def test_sof_precision_reads_the_byte_after_the_length_up_to_the_buffers_end():
    """An SOF1 header cut right after its length has no precision byte: None (not an error); one more byte
    (12) ending the buffer is the precision. Written for: the bound taken as ``offset - 4`` or one byte
    short."""
    assert _sof_precision(b"\xff\xd8\xff\xc1\x00\x11") is None
    assert _sof_precision(b"\xff\xd8\xff\xc1\x00\x11\x0c") == 12


def test_an_8_bit_jpeg_header_pil_cannot_identify_is_corrupt_not_a_precision_refusal():
    """SOI and an 8-bit SOF0, nothing after: PIL cannot identify it; its precision is 8, so the reason is
    the corrupt header, not the "only 8-bit JPEGs" refusal. Written for: the precision compared with 9."""
    raw = b"\xff\xd8" + _sof0(8, 8)
    assert process_task(("bytes", raw, 0, "n", "w"), ImageOptions()) == (
        "skip", "w", "truncated or corrupt JPEG (cannot parse its header)")  # fmt: skip


def test_an_error_pil_raises_opening_a_jpeg_is_a_corrupt_jpeg_header(monkeypatch):
    """Outside the packer's PIL settings, PIL's own decompression-bomb limit (set to 100 pixels) makes
    ``Image.open`` of a 24x16 JPEG raise an error that is not "cannot identify": the reason is ``corrupt
    JPEG header (<PIL's words>)``. Written for: the format's name in that reason."""
    raw = _jpeg(coords(16, 24))
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(Image.DecompressionBombError) as err:
        Image.open(io.BytesIO(raw))
    assert process_task(("bytes", raw, 0, "n", "w"), ImageOptions()) == ("skip", "w", f"corrupt JPEG header ({err.value})")


def test_a_jpeg_wider_than_libjpeg_reads_is_refused_as_a_jpeg():
    """A JPEG header forged to 65501x1: refused before decoding as a JPEG no decoder reads, not as a JPEG
    too wide to store. Written for: the JPEG-source side check skipped for JPEG bytes."""
    jpg = _jpeg(coords(16, 24))
    i = jpg.index(b"\xff\xc0")
    forged = jpg[: i + 5] + struct.pack(">HH", 1, 65501) + jpg[i + 9 :]
    assert process_task(("bytes", forged, 0, "n", "w"), ImageOptions()) == (
        "skip", "w", "JPEG of 65501x1 pixels: JPEG decoders (libjpeg) refuse a side above 65500 pixels")  # fmt: skip


# ----------------------------------------------------------------------------- upright_tag's walk


def _tagged(order: bytes = b"II") -> bytes:
    return _seg(0xE1, b"Exif\0\0" + tiff_ifd(order, [(0x0112, 3, 1, struct.pack("<H", 6) + b"\0\0")]))


def test_upright_tag_steps_over_a_stray_soi():
    """An SOI marker (FFD8, no length) before the Exif is stepped over like RSTn: the value (at 2 + 2 + 4 +
    6 + 10 + 8) is set to 1. Written for: D8 left out of the parameterless range."""
    jpg = _jpeg(coords(16, 24))
    raw = jpg[:2] + b"\xff\xd8" + _tagged() + jpg[2:]
    at = 2 + 2 + 4 + 6 + 10 + 8
    assert raw[at : at + 2] == b"\x06\x00"
    assert upright_tag(raw) == raw[:at] + b"\x01\x00" + raw[at + 2 :]


def test_upright_tag_walks_past_the_tables_to_an_exif_just_before_the_scan():
    """A JPEG whose Exif comes after its DQT, SOF0 and DHT, right before SOS: still rewritten (PIL reads it
    there, then as 1). Written for: DQT taken for the end of the header."""
    jpg = _jpeg(coords(16, 24))
    s = jpg.index(b"\xff\xda")
    assert b"\xff\xdb" in jpg[:s]
    raw = jpg[:s] + _tagged() + jpg[s:]
    at = s + 4 + 6 + 10 + 8
    out = upright_tag(raw)
    assert out == raw[:at] + b"\x01\x00" + raw[at + 2 :]
    with Image.open(io.BytesIO(raw)) as a, Image.open(io.BytesIO(out)) as b:
        assert (a.getexif()[0x0112], b.getexif()[0x0112]) == (6, 1)


# ----------------------------------------------------------------------------- JPEG paths


@pytest.mark.parametrize("orientation", [0, 9])
def test_an_orientation_outside_1_to_8_is_upright(orientation):
    """A plain JPEG whose Exif orientation is 0 or 9 (no TIFF value): taken as 1, as decoders do, so stored
    byte for byte, flags 0. Written for: any value returned as the orientation (then no turn to make)."""
    raw = _jpeg_with_orientation(coords(16, 24), orientation)
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions())
    assert isinstance(out, bytes), out
    header = decode_header(out)
    assert (header.flags, header.width, header.height, record_payload(out, header)) == (0, 24, 16, raw)


@pytest.mark.parametrize("progressive, baseline", [(True, False), (False, True)])
def test_pil_loader_rewrites_the_tag_of_a_progressive_jpeg_or_under_baseline(progressive, baseline):
    """Under ``pil_loader`` a plain JPEG with orientation 6 keeps its bytes but the tag: a progressive one
    (flags exactly ``FLAG_PROGRESSIVE``), or a baseline one under ``--baseline`` (flags 0); only a
    progressive JPEG under ``--baseline`` is re-encoded. Written for: ``baseline or progressive`` for
    ``and``, the progressive flag dropped."""
    raw = _jpeg_with_orientation(coords(40, 64), 6, progressive=progressive)
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions(pil_loader=True, baseline=baseline))
    header = decode_header(out)
    payload = record_payload(out, header)
    want_flags = FLAG_PROGRESSIVE if progressive else 0
    assert (header.encoding, header.flags, header.width, header.height) == (ENC_JPEG, want_flags, 64, 40)
    assert payload == upright_tag(raw) and payload != raw


def test_a_converted_jpeg_shrunk_through_its_draft_keeps_the_converted_flag():
    """A greyscale 64x40 JPEG (not plain: converted) with ``--max-size 32``: flags exactly converted and
    resized, 32x20. Written for: the draft's shrink setting the flags to resized alone."""
    raw = _jpeg(coords(40, 64)[:, :, 0])
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions(max_size=32))
    header = decode_header(out)
    assert (header.flags, header.width, header.height) == (FLAG_CONVERTED | FLAG_RESIZED, 32, 20)


def test_a_jpeg_with_trailing_data_is_shrunk_from_its_full_decode():
    """A 64x40 JPEG followed by 100 bytes of zeros (no EOI in its last 64 bytes: decoded to tell it from a
    truncated one) with ``--max-size 32``: already decoded, so no draft; the stored JPEG is exactly PIL's
    full decode resized with LANCZOS to 32x20 and encoded at quality 95, flags resized. Written for: a
    draft box assumed when none was taken."""
    jpg = _jpeg(coords(40, 64))
    raw = jpg + b"\0" * 100
    with Image.open(io.BytesIO(jpg)) as im:
        want = io.BytesIO()
        im.convert("RGB").resize((32, 20), Image.Resampling.LANCZOS).save(want, "JPEG", quality=95)
    out = process_task(("bytes", raw, 0, "n", "w"), ImageOptions(max_size=32))
    assert isinstance(out, bytes), out
    header = decode_header(out)
    assert (header.flags, header.width, header.height) == (FLAG_RESIZED, 32, 20)
    assert record_payload(out, header) == want.getvalue()


# ----------------------------------------------------------------------------- the aspect-ratio refusal


def test_a_strip_too_long_for_the_evaluation_resize_is_refused_with_its_sizes():
    """A 1x1366 array (1366:1, above 1365:1): resized to a shorter side of 256 it would be 349696x256 =
    89522176 pixels; a 2x65000 one shrunk by ``--max-size 20000`` is stored 20000x1, 5120000x256 =
    1310720000 pixels. Each refused with its source size, the stored size only when it differs. Written
    for: the source width lost from the message, the stored size shown or left out wrongly."""
    tail = ("aspect ratio above 1365:1 (MAX_ASPECT_RATIO): resizing its shorter side to 256 pixels, as an evaluation "
            "Resize(256) does, would make it ")  # fmt: skip
    r = process_task(("array", np.zeros((1, 1366), np.uint8), 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "1366x1 pixels: " + tail + "349696x256 = 89522176 pixels, more than 89478485; crop or split it")
    r = process_task(("array", np.zeros((2, 65000), np.uint8), 0, "n", "w"), ImageOptions(max_size=20000))
    assert r == ("skip", "w", "65000x2 pixels (stored 20000x1): " + tail
                 + "5120000x256 = 1310720000 pixels, more than 89478485; crop or split it")  # fmt: skip


# ----------------------------------------------------------------------------- reading files


def test_a_file_of_the_limit_that_then_grows_is_refused(tmp_path, monkeypatch):
    """``--max-pixels 1``: the limit is 16777224 bytes. A file of exactly that many when ``fstat`` sees it
    that then grows by 1000 is read one byte past the limit and refused with 16777225. Written for: the
    read stopping at the limit (the growth never seen)."""
    p = tmp_path / "a.jpg"
    p.write_bytes(b"\0" * 16777224)
    grows_after_fstat(monkeypatch, b"\0" * 1000)
    assert process_task(("file", str(p), 0, "n", "w"), ImageOptions(max_pixels=1)) == ("skip", "w", (
        "file too large: 16777225 bytes, more than the 16777224 bytes an image within --max-pixels 1 can need "
        "(8 bytes per pixel + 16 MiB)"))  # fmt: skip


def test_a_file_that_grew_is_read_in_large_reads(tmp_path, monkeypatch):
    """A file of 100 bytes when ``fstat`` sees it that grows by 300,000: read whole in at most three reads
    (its size, then at least 1 MiB at a time, then the empty read at its end), not byte by byte. Written
    for: the reads after the first asking for one byte."""
    rng = np.random.default_rng(1)
    data = rng.integers(0, 256, 300_100, np.uint8).tobytes()
    p = tmp_path / "a.bin"
    p.write_bytes(data[:100])
    grows_after_fstat(monkeypatch, data[100:])
    reads: list[int] = []

    class Counted:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n: int) -> bytes:
            reads.append(n)
            return self.f.read(n)

    monkeypatch.setattr(images, "open", lambda *a, **k: Counted(builtins.open(*a, **k)), raising=False)
    assert images._read_file(str(p), ImageOptions()) == data
    assert len(reads) <= 3, reads[:10]


def test_a_file_is_read_without_a_warning(tmp_path):
    """Reading a plain JPEG file raises no warning (with warnings as errors it is still stored): a worker's
    warning would be printed for every image. Written for: the file opened with a buffering Python warns
    about in binary mode."""
    raw = _jpeg(coords(16, 24))
    p = tmp_path / "a.jpg"
    p.write_bytes(raw)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = process_task(("file", str(p), 0, "n", "w"), ImageOptions())
    assert isinstance(out, bytes), out
    assert record_payload(out, decode_header(out)) == raw


def test_an_error_after_opening_is_the_oses_words_and_the_descriptor_is_closed(tmp_path, monkeypatch):
    """An ``fstat`` failing with EIO on the opened file: refused as ``unreadable (Input/output error)`` (the
    OS's words, not the exception's repr), and no descriptor left open. Written for: the error's text
    chosen with ``and`` for ``or``."""
    p = tmp_path / "a.jpg"
    p.write_bytes(_jpeg(coords(4, 4)))
    before = len(os.listdir("/proc/self/fd"))

    def failing(fd):
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    with monkeypatch.context() as m:
        m.setattr(images.os, "fstat", failing)
        r = process_task(("file", str(p), 0, "n", "w"), ImageOptions())
    assert r == ("skip", "w", "unreadable (Input/output error)")
    assert len(os.listdir("/proc/self/fd")) == before
