"""``fast_file`` (a plain JPEG file read straight into its record) against the record layout of
``docs/format.md`` written out here: the 40-byte little-endian header field by field, the UTF-8 path,
the file's bytes, the low 32 bits of XXH3-64 (seed 0) of them. The images are made with PIL at sizes
the test chooses, so every field's expected value is known without fastload; which files the fast
path must hand to the full path (``None``) and which it refuses (``("skip", where, reason)``) are
tables, with the reasons written out whole.
"""

from __future__ import annotations

import io
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import xxhash
from PIL import Image

from fastload.packing.images import ImageOptions, fast_file

#: docs/format.md: magic 4s | version u16 | encoding u8 | flags u8 | label i32 | width u32 | height u32 |
#: orig_width u32 | orig_height u32 | payload_check u32 | payload_len u32 | path_len u16 | reserved u16
LAYOUT = "<4sHBBiIIIIIIHH"
JPEG, PROGRESSIVE = 1, 1  # encoding 1 = JPEG; flags bit 0 = progressive (docs/format.md)


def jpeg(w: int, h: int, *, progressive: bool = False, seed: int = 0, **save) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90, progressive=progressive, **save)
    return buf.getvalue()


def record(data: bytes, *, label: int, name: str, w: int, h: int, progressive: bool) -> bytes:
    """The record docs/format.md describes for a JPEG stored as it is."""
    path = name.encode("utf-8", "surrogateescape")[:65535]
    check = xxhash.xxh3_64_intdigest(data) & 0xFFFFFFFF
    head = struct.pack(LAYOUT, b"FLRC", 2, JPEG, PROGRESSIVE if progressive else 0, label, w, h, w, h, check,
                       len(data), len(path), 0)  # fmt: skip
    assert len(head) == 40
    return head + path + data


def two_frames(data: bytes) -> bytes:
    """``data`` with its SOF0 segment written twice (the readers take one frame before the scan)."""
    sof = data.index(b"\xff\xc0")
    n = struct.unpack_from(">H", data, sof + 2)[0]
    return data[: sof + 2 + n] + data[sof : sof + 2 + n] + data[sof + 2 + n :]


def run(path: Path, *, label: int = 0, name: str = "c/x.jpg", where: str = "SRC/c/x.jpg", **opts):
    return fast_file(("file", str(path), label, name, where), ImageOptions(**opts))


@pytest.mark.parametrize(
    "w, h, progressive, label, name",
    [
        (64, 48, False, 0, "c/x.jpg"),
        (33, 17, True, 7, "dogs/caf\u00e9 \u72ac.jpeg"),  # odd sides, a non-ASCII name
        (1, 1, False, 2**31 - 1, "a.jpg"),  # the smallest image, the largest label
        (500, 375, True, 3, "deep/" * 40 + "z.jpg"),
    ],
)
def test_a_plain_jpeg_is_its_documented_record(tmp_path, w, h, progressive, label, name):
    """Written for a fast path that stores another size, flag, label, checksum, length or path than
    the file's, or hands a plain JPEG to the slow path: the record is, byte for byte, the layout written
    out from the documentation, and the payload is the file unchanged."""
    data = jpeg(w, h, progressive=progressive)
    p = tmp_path / "x.jpg"
    p.write_bytes(data)
    got = run(p, label=label, name=name)
    assert isinstance(got, (bytes, bytearray)), got
    assert bytes(got) == record(data, label=label, name=name, w=w, h=h, progressive=progressive)


def test_a_path_is_cut_at_65535_bytes_and_undecodable_bytes_are_kept(tmp_path):
    """Written for a path length past the u16 field, or a name whose surrogate-escaped bytes are lost:
    the stored path is the name's first 65535 bytes, its undecodable bytes as they were."""
    data = jpeg(16, 16)
    p = tmp_path / "x.jpg"
    p.write_bytes(data)
    long = "\u00e9" * 40_000  # 80,000 UTF-8 bytes
    got = bytes(run(p, name=long))
    assert struct.unpack_from(LAYOUT, got)[11] == 65535
    assert got == record(data, label=0, name=long, w=16, h=16, progressive=False)
    odd = b"caf\xe9.jpg".decode("utf-8", "surrogateescape")
    got = bytes(run(p, name=odd))
    assert got[40 : 40 + 8] == b"caf\xe9.jpg"


def test_what_the_fast_path_leaves_to_the_full_one(tmp_path):
    """Written for a fast path that stores what it must not (a PNG, a progressive JPEG under
    ``baseline``, one above ``max_size``, one cut short or with data after its end, two frames) or that
    gives up on what it should take (a baseline JPEG under ``baseline``, a JPEG within ``max_size``):
    None hands a file to the full path, a record is taken."""
    base, prog = jpeg(64, 48), jpeg(64, 48, progressive=True)
    png = io.BytesIO()
    Image.new("RGB", (8, 8)).save(png, "PNG")
    cases = [  # (bytes, options, taken by the fast path)
        (base, {}, True),
        (png.getvalue(), {}, False),
        (prog, {"baseline": True}, False),
        (base, {"baseline": True}, True),
        (base, {"max_size": 63}, False),
        (base, {"max_size": 64}, True),
        (base[:-2], {}, False),  # no end-of-image marker: truncated
        (base + b"\0" * 70, {}, False),  # 70 bytes after it: past the 64-byte window
        (base + b"\0" * 10, {}, True),  # its end within the last 64 bytes
        (two_frames(base), {}, False),  # two SOF segments before the scan
    ]
    for i, (data, opts, taken) in enumerate(cases):
        p = tmp_path / f"{i}.jpg"
        p.write_bytes(data)
        got = run(p, **opts)
        if taken:
            assert isinstance(got, (bytes, bytearray)), (i, got)
            w, h = 64, 48
            assert bytes(got) == record(data, label=0, name="c/x.jpg", w=w, h=h, progressive=False), i
        else:
            assert got is None, (i, got)


def test_what_the_fast_path_refuses_and_its_reasons(tmp_path):
    """Written for a refusal that names another reason, or a bomb let through: an empty file, a JPEG
    over ``max_pixels``, one whose header claims far more pixels than its bytes hold, and a file over
    the size any image within ``max_pixels`` needs are skipped with their reasons whole."""
    empty = tmp_path / "empty.jpg"
    empty.write_bytes(b"")
    assert run(empty, where="W") == ("skip", "W", "zero-byte file")
    big = tmp_path / "big.jpg"
    big.write_bytes(jpeg(64, 48))
    assert run(big, where="W", max_pixels=64 * 48 - 1) == (
        "skip", "W", f"decompression bomb: 64x48 pixels exceeds --max-pixels {64 * 48 - 1}")  # fmt: skip
    assert isinstance(run(big, max_pixels=64 * 48), (bytes, bytearray))  # exactly at the limit: taken
    # a header claiming 4000x4000: at least ceil(4000/8)^2 / 8 = 31,250 bytes, the file far fewer
    small = bytearray(jpeg(8, 8))
    sof = small.index(b"\xff\xc0")
    struct.pack_into(">HH", small, sof + 5, 4000, 4000)
    forged = tmp_path / "forged.jpg"
    forged.write_bytes(bytes(small))
    assert run(forged, where="W") == (
        "skip", "W",
        f"JPEG header claims 4000x4000 pixels but the file has only {len(small)} bytes (at least 31250 needed): forged or truncated",
    )  # fmt: skip
    huge = tmp_path / "huge.jpg"
    with open(huge, "wb") as f:
        f.write(jpeg(8, 8))
        f.truncate(8 * 100 + (16 << 20) + 1)  # one byte over 8 bytes a pixel + 16 MiB, for max_pixels=100
    reason = run(huge, where="W", max_pixels=100)
    assert reason == ("skip", "W", f"file too large: {os.path.getsize(huge)} bytes, more than the {8 * 100 + (16 << 20)} "
                      "bytes an image within --max-pixels 100 can need (8 bytes per pixel + 16 MiB)")  # fmt: skip


#: A regular sysfs file of 4096 bytes whose read fails with EIO (its device has no autosuspend).
EIO_FILE = "/sys/devices/system/cpu/power/autosuspend_delay_ms"


def test_a_file_whose_read_fails_is_skipped_with_the_systems_reason():
    """Written for the read error's reason replaced by the exception's text, or the refusal not marked
    a skip: a regular file whose read fails (sysfs's EIO) is ``("skip", where, "unreadable
    (Input/output error)")``."""
    try:
        fd = os.open(EIO_FILE, os.O_RDONLY)
    except OSError:
        pytest.skip(f"{EIO_FILE} is not here")
    try:
        os.pread(fd, 3, 0)
        pytest.skip(f"{EIO_FILE} reads on this machine")
    except OSError as e:
        if e.errno != 5:
            pytest.skip(f"{EIO_FILE}: {e}")
    finally:
        os.close(fd)
    assert fast_file(("file", EIO_FILE, 0, "x", "W"), ImageOptions()) == ("skip", "W", "unreadable (Input/output error)")


@pytest.mark.parametrize("change", [+1, -1])
def test_a_file_that_is_not_the_size_it_was_is_left_to_the_full_path(tmp_path, monkeypatch, change):
    """Written for a record made of a file that grew or shrank between its ``fstat`` and its read (the
    record would hold bytes of neither version): the fast path hands it to the full path. The
    change is made by a stand-in for the size ``fstat`` reported (a real change there is a race):
    the file then holds one byte more, or one less, than the size the read is sized to."""
    import fastload.packing.images as images

    data = jpeg(64, 48)
    p = tmp_path / "x.jpg"
    p.write_bytes(data + b"X" if change > 0 else data)  # either way the first len(data) bytes end the JPEG
    real = images._open_image_file

    def opened(path, opts):
        fd, size = real(path, opts)
        return fd, size - 1 if change > 0 else size + 1

    monkeypatch.setattr(images, "_open_image_file", opened)
    assert run(p) is None


def test_the_fast_path_raises_no_warning(tmp_path):
    """Written for a file opened with an unsupported buffering (Python warns that binary files cannot be
    line-buffered): reading a plain JPEG warns of nothing."""
    import warnings

    p = tmp_path / "x.jpg"
    p.write_bytes(jpeg(16, 16))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert isinstance(run(p), (bytes, bytearray))
