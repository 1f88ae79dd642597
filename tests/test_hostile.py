"""Hostile images are refused at pack time, each with its reason in the manifest.

Decompression bombs (real ones whose data inflates to gigapixels, and headers that
merely claim it), a JPEG whose header lies about its size, a PNG claiming
100,000 x 100,000 pixels, 0 x 0 images, truncated files, a zero-byte file and a
text file named ``.jpg``. The pack refuses them from their headers, before any
pixel is decoded: it stays fast and small (checked in a child process), keeps the
good images, and ``--on-error fail`` names the first hostile file.
"""

from __future__ import annotations

import io
import json
import os
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import BadImageError
from fastload.format import MANIFEST_NAME

from conftest import encode_color, write_image

MAX_PIXELS = 89_478_485


def _chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _png(width: int, height: int, idat: bytes, *, extra: bytes = b"", color: int = 0) -> bytes:
    """A PNG with a valid structure (every CRC right) and any header values."""
    ihdr = struct.pack(">IIBBBBB", width, height, 8, color, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + _chunk(b"IHDR", ihdr) + extra + _chunk(b"IDAT", idat) + _chunk(b"IEND", b"")


def _png_bomb(width: int, height: int) -> bytes:
    """A real bomb: every row is present and valid, zlib squeezes the zeros ~1000:1."""
    z = zlib.compressobj(9)
    row = b"\0" * (1 + width)  # filter byte + one grey byte per pixel
    body = b"".join(z.compress(row) for _ in range(height)) + z.flush()
    return _png(width, height, body)


def _jpeg(size=(64, 48), mode="RGB", **save) -> bytes:
    buf = io.BytesIO()
    Image.new(mode, size, 200 if mode == "L" else (200, 30, 30)).save(buf, "JPEG", quality=90, **save)
    return buf.getvalue()


def _with_sof_size(jpeg: bytes, width: int, height: int) -> bytes:
    """The same JPEG with its frame header (SOF) claiming another size."""
    b = bytearray(jpeg)
    i = 2
    while True:
        marker, length = b[i + 1], (b[i + 2] << 8) | b[i + 3]
        if marker in (0xC0, 0xC1, 0xC2):
            struct.pack_into(">HH", b, i + 5, height, width)
            return bytes(b)
        i += 2 + length


def _bmp_claiming(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", (4, 4)).save(buf, "BMP")
    b = bytearray(buf.getvalue())
    struct.pack_into("<ii", b, 18, width, height)
    return bytes(b)


def _tiff_claiming(width: int, height: int) -> bytes:
    buf = io.BytesIO()
    Image.new("L", (4, 4)).save(buf, "TIFF")
    b = bytearray(buf.getvalue())
    ifd = struct.unpack_from("<I", b, 4)[0]
    for k in range(struct.unpack_from("<H", b, ifd)[0]):
        tag, typ = struct.unpack_from("<HH", b, ifd + 2 + 12 * k)
        if tag in (256, 257):
            struct.pack_into("<H" if typ == 3 else "<I", b, ifd + 2 + 12 * k + 8, width if tag == 256 else height)
    return bytes(b)


def _png_text_bomb() -> bytes:
    """A 4x4 PNG with a zTXt chunk that inflates to 64 MiB."""
    ztxt = b"comment\0\0" + zlib.compress(b"A" * (64 << 20), 9)
    return _png(4, 4, zlib.compress(b"\0" * 20), extra=_chunk(b"zTXt", ztxt))


def _noise_jpeg() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (150, 200, 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _truncated_png() -> bytes:
    buf = io.BytesIO()
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (48, 64, 3), dtype=np.uint8)).save(buf, "PNG")
    return buf.getvalue()[: len(buf.getvalue()) // 2]


# file name -> (bytes, the reason recorded in the manifest)
HOSTILE: dict[str, tuple[bytes, str]] = {
    "bomb_png_real_12000x8000.png": (_png_bomb(12000, 8000), f"decompression bomb: 12000x8000 pixels exceeds --max-pixels {MAX_PIXELS}"),
    "bomb_png_claims_100000x100000.png": (_png(100_000, 100_000, zlib.compress(b"\0" * 100)), f"decompression bomb: 100000x100000 pixels exceeds --max-pixels {MAX_PIXELS}"),
    "bomb_jpeg_claims_60000x60000.jpg": (_with_sof_size(_jpeg(), 60000, 60000), f"decompression bomb: 60000x60000 pixels exceeds --max-pixels {MAX_PIXELS}"),
    "bomb_bmp_claims_100000x100000.bmp": (_bmp_claiming(100_000, 100_000), f"decompression bomb: 100000x100000 pixels exceeds --max-pixels {MAX_PIXELS}"),
    "bomb_tiff_claims_60000x60000.tif": (_tiff_claiming(60000, 60000), f"decompression bomb: 60000x60000 pixels exceeds --max-pixels {MAX_PIXELS}"),
    "bomb_png_text_chunk.png": (_png_text_bomb(), "corrupt image header (Decompressed data too large for PngImagePlugin.MAX_TEXT_CHUNK)"),
    "lie_jpeg_4000x3000.jpg": (_with_sof_size(_jpeg(), 4000, 3000), "JPEG header claims 4000x3000 pixels but the file has only {n} bytes (at least 23437 needed): forged or truncated"),
    "lie_jpeg_progressive_9000x9000.jpg": (_with_sof_size(_jpeg(progressive=True), 9000, 9000), "JPEG header claims 9000x9000 pixels but the file has only {n} bytes (at least 158203 needed): forged or truncated"),
    "lie_jpeg_grey_4000x3000.jpg": (_with_sof_size(_jpeg(mode="L"), 4000, 3000), "JPEG header claims 4000x3000 pixels but the file has only {n} bytes (at least 23437 needed): forged or truncated"),
    "zero_png_0x0.png": (_png(0, 0, zlib.compress(b"")), "corrupt PNG (cannot identify image file)"),
    "zero_png_0x48.png": (_png(0, 48, zlib.compress(b"\0" * 48)), "corrupt PNG (cannot identify image file)"),
    "zero_jpeg_0x0.jpg": (_with_sof_size(_jpeg(), 0, 0), "truncated or corrupt JPEG (cannot parse its header)"),
    "zero_bmp_0x0.bmp": (_bmp_claiming(0, 0), "corrupt BMP (cannot identify image file)"),
    "truncated.png": (_truncated_png(), "truncated PNG (image file is truncated)"),
    "truncated.jpg": (_noise_jpeg()[:6000], "truncated JPEG (no end-of-image marker)"),
    "truncated_header.jpg": (_jpeg()[:300], "truncated JPEG (its header is cut short)"),
    "empty.jpg": (b"", "zero-byte file"),
    "text.jpg": (b"this is not a picture, it is a text file\n" * 10, "not an image (cannot identify image file)"),
}


@pytest.fixture(scope="module")
def hostile_src(tmp_path_factory) -> Path:
    src = tmp_path_factory.mktemp("hostile") / "src"
    (src / "bad").mkdir(parents=True)
    for name, (data, _) in HOSTILE.items():
        (src / "bad" / name).write_bytes(data)
    for i in range(3):  # good images on both sides of the bad ones
        write_image(src / "bad" / f"good_{i}.jpg", encode_color(0, i), quality=90)
        write_image(src / "good" / f"{i}.png", encode_color(1, 3 + i))
    return src


_PACK_IN_CHILD = r"""
import json, sys, time
import fastload
t0 = time.monotonic()
res = fastload.pack(sys.argv[1], sys.argv[2], workers=1, progress=False)
# VmHWM: this process's peak resident memory (ru_maxrss would include the parent's, from before exec)
hwm = next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("VmHWM:"))
print(json.dumps({"seconds": time.monotonic() - t0, "maxrss_mb": hwm / 1024, "samples": res.num_samples}))
"""


@pytest.fixture(scope="module")
def packed(hostile_src) -> tuple[Path, dict]:
    """Pack in a child process, to measure its time and peak memory (refusals decode nothing)."""
    out = hostile_src.parent / "out"
    r = subprocess.run([sys.executable, "-c", _PACK_IN_CHILD, str(hostile_src), str(out)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    return out, json.loads(r.stdout.splitlines()[-1])


def _reasons(out: Path) -> dict[str, str]:
    m = json.loads((out / MANIFEST_NAME).read_text())
    return {Path(s["path"]).name: s["reason"] for s in m["skipped"]}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_refused_with_its_reason(packed, name):
    out, _ = packed
    data, reason = HOSTILE[name]
    assert _reasons(out)[name] == reason.format(n=len(data))


def test_only_the_good_images_are_packed(packed, hostile_src):
    out, stats = packed
    assert set(_reasons(out)) == set(HOSTILE)
    ds = fastload.Dataset(out)
    assert len(ds) == 6 and ds.classes == ["bad", "good"] and ds.labels.tolist() == [0, 0, 0, 1, 1, 1]
    assert [Path(ds.source_path(i)).name for i in range(6)] == ["good_0.jpg", "good_1.jpg", "good_2.jpg", "0.png", "1.png", "2.png"]
    assert fastload.verify(out, decode=True).ok
    # refused from their headers: a gigapixel bomb is never inflated
    assert stats["seconds"] < 20 and stats["maxrss_mb"] < 300, stats


def test_on_error_fail_names_the_first_hostile_file(hostile_src, tmp_path):
    with pytest.raises(BadImageError) as e:
        fastload.pack(hostile_src, tmp_path / "out", on_error="fail", workers=2, progress=False)
    first = sorted(HOSTILE)[0]
    assert e.value.path == str(hostile_src / "bad" / first) and e.value.reason == HOSTILE[first][1]
    assert sorted(os.listdir(tmp_path)) == []  # nothing left behind


@pytest.mark.parametrize("workers", [1, 2])
def test_lying_jpeg_is_refused_whatever_the_path(tmp_path, workers):
    """A plain JPEG is checked without PIL (the fast path); with --max-size it is decoded by PIL:
    both refuse a header that claims more pixels than the file can hold."""
    src = tmp_path / "src"
    data = _with_sof_size(_jpeg(), 3000, 2000)
    (src / "a").mkdir(parents=True)
    (src / "a" / "lie.jpg").write_bytes(data)
    write_image(src / "a" / "ok.jpg", (10, 20, 30), size=(3000, 2000), quality=90)  # a genuine one of that size
    reason = f"JPEG header claims 3000x2000 pixels but the file has only {len(data)} bytes (at least 11718 needed): forged or truncated"
    for max_size in (None, 500):
        res = fastload.pack(src, tmp_path / f"out{max_size}", workers=workers, max_size=max_size, progress=False)
        assert res.skipped == [{"path": str(src / "a" / "lie.jpg"), "reason": reason}]
        assert res.num_samples == 1


def test_a_genuine_tiny_and_uniform_jpeg_is_kept(tmp_path):
    """The size check has a wide margin: the most compressible genuine JPEGs pass it."""
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for name, kw in {"flat.jpg": {"optimize": True}, "flat_prog.jpg": {"optimize": True, "progressive": True},
                     "q1.jpg": {"quality": 1, "optimize": True}}.items():  # fmt: skip
        Image.new("L", (4000, 3000), 255).save(src / name, "JPEG", **kw)
    Image.new("RGB", (1, 1), (1, 2, 3)).save(src / "one_pixel.jpg", "JPEG")
    res = fastload.pack(tmp_path / "src", tmp_path / "out", workers=1, progress=False)
    assert res.skipped == [] and res.num_samples == 4


def test_lower_max_pixels_refuses_sooner(tmp_path):
    src = tmp_path / "src" / "a"
    write_image(src / "big.jpg", (1, 2, 3), size=(300, 200), quality=90)
    write_image(src / "big.png", (1, 2, 3), size=(300, 200))
    write_image(src / "small.jpg", (1, 2, 3), size=(100, 100), quality=90)
    res = fastload.pack(tmp_path / "src", tmp_path / "out", max_pixels=50_000, workers=1, progress=False)
    assert sorted(s["reason"] for s in res.skipped) == ["decompression bomb: 300x200 pixels exceeds --max-pixels 50000"] * 2


def test_pack_dataset_refuses_empty_and_huge_arrays_and_images(tmp_path):
    items = [
        (np.zeros((0, 0, 3), np.uint8), 0),
        (np.zeros((5, 0), np.uint8), 0),
        (Image.new("RGB", (0, 0)), 0),
        (np.zeros((2, 3, 2), np.uint8), 0),
        (np.zeros((8, 8, 3), np.float32), 0),
        (_with_sof_size(_jpeg(), 4000, 3000), 0),
        (np.full((8, 8, 3), 100, np.uint8), 1),
    ]
    res = fastload.pack_dataset(items, tmp_path / "out", classes=["a", "b"], workers=1, progress=False, max_pixels=10_000)
    reasons = [s["reason"] for s in res.skipped]
    assert reasons[:5] == [
        "invalid image size 0x0",
        "invalid image size 0x5",
        "invalid image size 0x0",
        "array shape (2, 3, 2) is not HxW, HxWx1, HxWx3 or HxWx4",
        "array dtype float32 is not uint8",
    ]
    assert reasons[5] == "decompression bomb: 4000x3000 pixels exceeds --max-pixels 10000"
    assert res.num_samples == 1
