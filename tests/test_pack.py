"""fastload.pack / pack_dataset end to end: round trips, every image kind, bad files,
shards, determinism, atomicity and resume, concurrent readers, the reader's refusals."""

from __future__ import annotations

import errno
import hashlib
import io
import json
import multiprocessing as mp
import os
import signal
import struct
import subprocess
import sys
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from conftest import decode_color, encode_color, write_image
from fastload.packing import run, shards, workers
from fastload.errors import BadImageError, ConfigError, CorruptDataError, FormatError, PackError
from fastload.format import FLAG_CONVERTED, FLAG_ORIENTED, FLAG_PROGRESSIVE, FLAG_RESIZED, shard_name

# ----------------------------------------------------------------------------- helpers


def mean_rgb(payload: bytes) -> np.ndarray:
    im = Image.open(io.BytesIO(payload))
    assert im.format == "JPEG" and im.mode == "RGB"
    a = np.asarray(im, dtype=np.float64)
    h, w = a.shape[:2]
    return a[h // 4 : 3 * h // 4, w // 4 : 3 * w // 4].reshape(-1, 3).mean(axis=0)


def file_hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.name != "manifest.json"}


def manifest_sans_time(d: Path) -> dict:
    m = json.loads((d / "manifest.json").read_text())
    m.pop("created")
    return m


def png_claiming(w: int, h: int) -> bytes:
    """A structurally valid PNG whose header claims w x h pixels (with almost no data)."""

    def chunk(t: bytes, d: bytes) -> bytes:
        return struct.pack(">I", len(d)) + t + d + struct.pack(">I", zlib.crc32(t + d))

    ihdr = struct.pack(">IIBBBBB", w, h, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"\0" * 64)) + chunk(b"IEND", b"")


def pack(src, out, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("workers", 1)
    return fastload.pack(src, out, **kw)


# ----------------------------------------------------------------------------- round trips


def test_round_trip_jpeg_folder_is_byte_for_byte(make_folder, tmp_path):
    src = make_folder(classes=3, per_class=5)
    res = pack(src, tmp_path / "out")
    assert (res.num_samples, res.num_classes, res.num_shards, res.skipped) == (15, 3, 1, [])
    assert res.bytes == (tmp_path / "out" / shard_name(0)).stat().st_size
    assert res.path == tmp_path / "out" and res.seconds > 0
    assert sorted(os.listdir(tmp_path)) == sorted([src.name, "out"])  # no .partial left
    ds = fastload.Dataset(tmp_path / "out", check=True)
    assert len(ds) == 15 and ds.classes == ["class_0", "class_1", "class_2"]
    assert ds.labels.tolist() == [i // 5 for i in range(15)]
    for i in range(15):
        payload, label = ds[i]
        name = ds.source_path(i)
        assert name == f"class_{label}/img_{i % 5:04d}.jpg"
        assert payload == (src / name).read_bytes()  # stored byte for byte
        assert decode_color(mean_rgb(payload)) == (label, i)
        h = ds.header(i)
        assert (h.width, h.height, h.orig_width, h.orig_height, h.flags) == (64, 48, 64, 48, 0)
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert m["class_counts"] == [5, 5, 5] and m["num_samples"] == 15
    assert m["stats"]["encodings"] == {"jpeg": 15} and m["stats"]["width"] == {"min": 64, "median": 64, "max": 64}
    assert fastload.verify(tmp_path / "out", decode=True).ok


def _kinds(root: Path) -> dict[str, tuple]:
    """One image of every kind; returns name -> (expected rgb, expected stored size, flags)."""
    c = (200, 40, 90)
    d = root / "k"
    d.mkdir(parents=True)
    out: dict[str, tuple] = {}
    rgba = Image.new("RGBA", (40, 30), c + (128,))
    rgba.save(d / "rgba.png")
    out["rgba.png"] = (c, (40, 30), FLAG_CONVERTED)
    Image.new("LA", (40, 30), (120, 7)).save(d / "la.png")
    out["la.png"] = ((120, 120, 120), (40, 30), FLAG_CONVERTED)
    Image.new("RGB", (40, 30), c).quantize(16).save(d / "palette.png")
    out["palette.png"] = (c, (40, 30), FLAG_CONVERTED)
    Image.fromarray(np.full((30, 40), 0x8080, np.uint16)).save(d / "gray16.png")  # 16-bit: scaled, not clipped
    out["gray16.png"] = ((128, 128, 128), (40, 30), FLAG_CONVERTED)
    for ext, fmt in (("webp", "WEBP"), ("bmp", "BMP"), ("tif", "TIFF"), ("ppm", "PPM")):
        Image.new("RGB", (40, 30), c).save(d / f"img.{ext}", format=fmt, **({"lossless": True} if fmt == "WEBP" else {}))
        out[f"img.{ext}"] = (c, (40, 30), FLAG_CONVERTED)
    Image.new("L", (40, 30), 77).save(d / "gray.jpg", quality=95)
    out["gray.jpg"] = ((77, 77, 77), (40, 30), FLAG_CONVERTED)
    Image.new("RGB", (40, 30), c).convert("CMYK").save(d / "cmyk.jpg", quality=95)
    out["cmyk.jpg"] = (c, (40, 30), FLAG_CONVERTED)
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90 CW to display
    Image.new("RGB", (40, 30), c).save(d / "rotated.jpg", quality=95, exif=exif)
    out["rotated.jpg"] = (c, (30, 40), FLAG_ORIENTED)
    Image.new("RGB", (40, 30), c).save(d / "progressive.jpg", quality=95, progressive=True)
    out["progressive.jpg"] = (c, (40, 30), FLAG_PROGRESSIVE)
    return out


def test_every_image_kind(tmp_path):
    kinds = _kinds(tmp_path / "src")
    res = pack(tmp_path / "src", tmp_path / "out")
    assert res.skipped == [] and res.num_samples == len(kinds)
    ds = fastload.Dataset(tmp_path / "out", check=True)
    for i in range(len(ds)):
        name = Path(ds.source_path(i)).name
        rgb, size, flags = kinds[name]
        h = ds.header(i)
        payload, _ = ds[i]
        assert (h.width, h.height) == size, name
        assert Image.open(io.BytesIO(payload)).size == size, name
        assert h.flags == flags, name
        assert np.allclose(mean_rgb(payload), rgb, atol=6), (name, mean_rgb(payload))
        assert (h.orig_width, h.orig_height) == (40, 30), name
        assert "exif" not in Image.open(io.BytesIO(payload)).info or name == "progressive.jpg", name
    prog = next(i for i in range(len(ds)) if ds.source_path(i).endswith("progressive.jpg"))
    assert ds[prog][0] == (tmp_path / "src" / "k" / "progressive.jpg").read_bytes()
    info = fastload.inspect(tmp_path / "out")
    assert info["progressive"] == 1 and info["oriented"] == 1 and info["converted"] == len(kinds) - 2


def test_baseline_and_max_size_and_quality(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a" / "prog.jpg", (10, 200, 30), size=(40, 30), quality=95, progressive=True)
    write_image(src / "a" / "big.jpg", (10, 200, 30), size=(400, 100), quality=95)
    write_image(src / "a" / "big.png", (10, 200, 30), size=(100, 400))
    write_image(src / "a" / "small.jpg", (10, 200, 30), size=(40, 30), quality=95)
    write_image(src / "a" / "draft.jpg", (10, 200, 30), size=(260, 200), quality=95)
    exif = Image.Exif()
    exif[0x0112] = 6
    write_image(src / "a" / "rot.jpg", (10, 200, 30), size=(400, 100), quality=95, exif=exif)
    pack(src, tmp_path / "out", baseline=True, max_size=64, quality=80)
    ds = fastload.Dataset(tmp_path / "out")
    got = {Path(ds.source_path(i)).name: (ds.header(i), ds[i][0]) for i in range(len(ds))}
    h, payload = got["prog.jpg"]
    assert h.flags == FLAG_CONVERTED and not Image.open(io.BytesIO(payload)).info.get("progressive")
    h, payload = got["big.jpg"]
    assert (h.width, h.height, h.orig_width, h.orig_height) == (64, 16, 400, 100) and h.flags == FLAG_RESIZED
    assert Image.open(io.BytesIO(payload)).size == (64, 16)
    h, _ = got["big.png"]
    assert (h.width, h.height) == (16, 64) and h.flags == FLAG_CONVERTED | FLAG_RESIZED
    h, payload = got["small.jpg"]
    assert h.flags == 0 and payload == (src / "a" / "small.jpg").read_bytes()
    h, payload = got["draft.jpg"]  # shrunk through a JPEG draft, still exactly the computed size
    assert (h.width, h.height) == (64, 49) == Image.open(io.BytesIO(payload)).size and h.flags == FLAG_RESIZED
    h, payload = got["rot.jpg"]
    assert (h.width, h.height, h.orig_width, h.orig_height) == (16, 64, 400, 100)
    assert h.flags == FLAG_RESIZED | FLAG_ORIENTED and Image.open(io.BytesIO(payload)).size == (16, 64)
    assert np.allclose(mean_rgb(payload), (10, 200, 30), atol=8)


def test_unicode_spaces_symlinks_empty_classes_and_stray_files(tmp_path):
    src = tmp_path / "my src"
    write_image(src / "ünï cødé" / "a b ✓.jpg", encode_color(0, 0))
    write_image(src / "ünï cødé" / "sub dir" / "ç.JPEG", encode_color(0, 1))
    (src / "ünï cødé" / "notes.txt").write_text("ignored like torchvision")
    (src / "zz_empty").mkdir()
    other = tmp_path / "elsewhere"
    write_image(other / "linked_dir" / "x.png", encode_color(2, 2))
    write_image(other / "target.jpg", encode_color(2, 3))
    (src / "zlinks").mkdir()
    os.symlink(other / "linked_dir", src / "zlinks" / "dir")
    os.symlink(other / "target.jpg", src / "zlinks" / "file.jpg")
    res = pack(src, tmp_path / "ø út")
    assert res.skipped == []  # the .txt is not an image file: ignored, not "skipped"
    ds = fastload.Dataset(tmp_path / "ø út")
    assert ds.classes == sorted(["ünï cødé", "zz_empty", "zlinks"])
    m = json.loads((tmp_path / "ø út" / "manifest.json").read_text(encoding="utf-8"))
    assert dict(zip(m["classes"], m["class_counts"])) == {"ünï cødé": 2, "zz_empty": 0, "zlinks": 2}
    names = [ds.source_path(i) for i in range(len(ds))]
    # torchvision order: sorted(os.walk(...)) lists zlinks/ itself before zlinks/dir/
    assert names == ["zlinks/file.jpg", "zlinks/dir/x.png", "ünï cødé/a b ✓.jpg", "ünï cødé/sub dir/ç.JPEG"]
    assert [decode_color(mean_rgb(ds[i][0]))[1] for i in range(4)] == [3, 2, 0, 1]


# ----------------------------------------------------------------------------- bad files


def _bad_folder(root: Path) -> Path:
    rng = np.random.default_rng(0)
    (root / "a").mkdir(parents=True)
    Image.fromarray(rng.integers(0, 255, (60, 80, 3), dtype=np.uint8)).save(root / "a" / "0_good.jpg", quality=95)
    good = (root / "a" / "0_good.jpg").read_bytes()
    (root / "a" / "1_truncated.jpg").write_bytes(good[: len(good) * 2 // 3])
    (root / "a" / "2_zero.jpg").write_bytes(b"")
    (root / "a" / "3_garbage.jpg").write_bytes(os.urandom(2000))
    (root / "a" / "4_text.png").write_text("definitely not a png")
    (root / "a" / "5_bomb.png").write_bytes(png_claiming(100000, 100000))
    (root / "a" / "6_header_only.jpg").write_bytes(good[:20])
    os.symlink(root / "a" / "does-not-exist.jpg", root / "a" / "7_dangling.jpg")
    (root / "a" / "8_trailing.jpg").write_bytes(good + b"\0" * 500)  # data after the end-of-image marker: fine
    (root / "a" / "9_zero_size.png").write_bytes(png_claiming(0, 0))
    sof = good.index(b"\xff\xc0")
    (root / "a" / "9_zero_height.jpg").write_bytes(good[: sof + 5] + b"\0\0" + good[sof + 7 :])
    write_image(root / "b" / "0.jpg", encode_color(1, 1), quality=95)
    return root


def test_bad_files_are_skipped_with_reasons(tmp_path):
    src = _bad_folder(tmp_path / "src")
    res = pack(src, tmp_path / "out")
    reasons = {Path(s["path"]).name: s["reason"] for s in res.skipped}
    assert reasons == {
        "1_truncated.jpg": "truncated JPEG (no end-of-image marker)",
        "2_zero.jpg": "zero-byte file",
        "3_garbage.jpg": "not an image (cannot identify image file)",
        "4_text.png": "not an image (cannot identify image file)",
        "5_bomb.png": "decompression bomb: 100000x100000 pixels exceeds --max-pixels 89478485",
        "6_header_only.jpg": reasons["6_header_only.jpg"],
        "7_dangling.jpg": "unreadable (No such file or directory)",
        "9_zero_size.png": "corrupt PNG (cannot identify image file)",
        "9_zero_height.jpg": "truncated or corrupt JPEG (cannot parse its header)",
    }
    assert reasons["6_header_only.jpg"] == "truncated or corrupt JPEG (cannot parse its header)"
    assert all(s["path"].startswith(str(src)) for s in res.skipped)
    ds = fastload.Dataset(tmp_path / "out")
    assert [Path(ds.source_path(i)).name for i in range(len(ds))] == ["0_good.jpg", "8_trailing.jpg", "0.jpg"]
    assert ds.labels.tolist() == [0, 0, 1]
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["skipped"] == res.skipped
    assert fastload.verify(tmp_path / "out", decode=True).ok


@pytest.mark.parametrize("workers", [1, 2])
def test_on_error_fail_leaves_nothing(tmp_path, workers):
    src = _bad_folder(tmp_path / "src")
    with pytest.raises(BadImageError) as ei:
        pack(src, tmp_path / "out", on_error="fail", workers=workers)
    assert ei.value.path == str(src / "a" / "1_truncated.jpg")
    assert ei.value.reason == "truncated JPEG (no end-of-image marker)"
    assert str(ei.value) == f"{src / 'a' / '1_truncated.jpg'}: truncated JPEG (no end-of-image marker)"
    assert sorted(os.listdir(tmp_path)) == ["src"]


def test_max_pixels_and_pil_bomb_limit(tmp_path):
    src = tmp_path / "src"
    write_image(src / "a" / "x.jpg", (1, 2, 3), size=(64, 48))
    write_image(src / "a" / "y.png", (1, 2, 3), size=(64, 48))
    write_image(src / "a" / "z.jpg", (1, 2, 3), size=(8, 8))
    res = pack(src, tmp_path / "out", max_pixels=1000)
    assert [s["reason"] for s in res.skipped] == ["decompression bomb: 64x48 pixels exceeds --max-pixels 1000"] * 2
    # PIL's own (lower) limit does not interfere with a larger --max-pixels, and is restored after
    before = Image.MAX_IMAGE_PIXELS
    big = tmp_path / "big"
    write_image(big / "a" / "x.png", (1, 2, 3), size=(300, 300))
    Image.MAX_IMAGE_PIXELS = 1000
    try:
        assert pack(big, tmp_path / "out2", max_pixels=10**6).skipped == []
        assert Image.MAX_IMAGE_PIXELS == 1000
    finally:
        Image.MAX_IMAGE_PIXELS = before


# Root reads any file through CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH: this child gives both up
# (capset(2) on its only thread, before any other starts) and then packs as a plain user would.
_PACK_WITHOUT_DAC_CAPS = """
import ctypes, json, sys
libc = ctypes.CDLL(None, use_errno=True)
class Header(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]
class Data(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]
header, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
if libc.capget(ctypes.byref(header), data) != 0:
    sys.exit(f"capget failed: errno {ctypes.get_errno()}")
keep = ~((1 << 1) | (1 << 2)) & 0xFFFFFFFF  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
for field in ("effective", "permitted", "inheritable"):
    setattr(data[0], field, getattr(data[0], field) & keep)
if libc.capset(ctypes.byref(header), data) != 0:
    sys.exit(f"capset failed: errno {ctypes.get_errno()}")
try:
    open(sys.argv[3], "rb").close()
    sys.exit("the locked file is still readable: the capabilities were not dropped")
except PermissionError:
    pass
import fastload
res = fastload.pack(sys.argv[1], sys.argv[2], workers=1, progress=False)
print(json.dumps({"skipped": res.skipped, "samples": res.num_samples}))
"""


def test_unreadable_file_is_skipped(tmp_path):
    """A file the packing process may not read is skipped, with the reason. Root may read any
    file, so as root (how CI runs) the pack runs in a child that has given up that privilege."""
    write_image(tmp_path / "src" / "a" / "ok.jpg", (1, 2, 3))
    locked = write_image(tmp_path / "src" / "a" / "locked.jpg", (1, 2, 3))
    locked.chmod(0)
    if os.geteuid() == 0:
        env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
        argv = [sys.executable, "-c", _PACK_WITHOUT_DAC_CAPS, str(tmp_path / "src"), str(tmp_path / "out"), str(locked)]
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr[-2000:]
        got = json.loads(r.stdout.strip().splitlines()[-1])
        skipped, samples = got["skipped"], got["samples"]
    else:
        res = pack(tmp_path / "src", tmp_path / "out")
        skipped, samples = res.skipped, res.num_samples
    assert skipped == [{"path": str(locked), "reason": "unreadable (Permission denied)"}]
    assert samples == 1


def test_all_refused_is_an_error_and_leaves_nothing(tmp_path):
    src = tmp_path / "src"
    (src / "a").mkdir(parents=True)
    (src / "a" / "x.jpg").write_bytes(b"")
    with pytest.raises(PackError, match="all 1 images were refused; the first: .*x.jpg: zero-byte file"):
        pack(src, tmp_path / "out")
    assert sorted(os.listdir(tmp_path)) == ["src"]


# ----------------------------------------------------------------------------- shards and determinism


def test_shard_rollover(tmp_path, make_folder):
    src = make_folder(classes=2, per_class=40, size=(96, 64))
    res = pack(src, tmp_path / "out", shard_size="16KiB")
    m = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert res.num_shards == len(m["shards"]) >= 3
    first = 0
    for i, s in enumerate(m["shards"]):
        p = tmp_path / "out" / s["file"]
        assert s["file"] == shard_name(i) and s["first"] == first and s["count"] > 0
        assert p.stat().st_size == s["bytes"] <= 16 * 1024
        assert hashlib.sha256(p.read_bytes()).hexdigest() == s["sha256"]
        first += s["count"]
    assert first == 80 == res.num_samples
    ds = fastload.Dataset(tmp_path / "out")
    assert [decode_color(mean_rgb(ds[i][0])) for i in range(80)] == [(i // 40, i) for i in range(80)]
    # a record larger than the shard size gets a shard of its own
    res2 = pack(src, tmp_path / "out2", shard_size=1000)
    assert res2.num_shards == 80


def test_output_identical_for_any_workers(tmp_path, make_folder):
    src = make_folder(classes=3, per_class=12)
    kinds = _kinds(src / "class_1")  # PNGs and friends go through the worker pool
    r1 = pack(src, tmp_path / "w1", workers=1, shard_size="48KiB")
    r2 = pack(src, tmp_path / "w2", workers=2, shard_size="48KiB")
    assert r1.num_shards > 1 and r1.num_samples == r2.num_samples == 36 + len(kinds)
    assert file_hashes(tmp_path / "w1") == file_hashes(tmp_path / "w2")
    assert manifest_sans_time(tmp_path / "w1") == manifest_sans_time(tmp_path / "w2")


# ----------------------------------------------------------------------------- atomicity and resume


def test_existing_out_and_overwrite(tmp_path, make_folder):
    src = make_folder(classes=2, per_class=2)
    out = tmp_path / "out"
    pack(src, out)
    with pytest.raises(ConfigError, match=r"already exists; pass --overwrite"):
        pack(src, out)
    before = (out / "manifest.json").read_text()
    res = pack(src, out, overwrite=True, quality=80)
    assert res.num_samples == 4 and (out / "manifest.json").read_text() != before
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([src.name, "out"])
    foreign = tmp_path / "precious"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("do not delete")
    with pytest.raises(ConfigError, match="not a fastload dataset; refusing"):
        pack(src, foreign, overwrite=True)
    assert (foreign / "thesis.tex").exists()
    with pytest.raises(ConfigError, match="inside SRC"):
        pack(src, src / "packed")


class _Interrupt(BaseException):
    pass


def _interrupt_after(monkeypatch, n: int) -> None:
    """Make the n-th image raise inside pack (like Ctrl-C mid-way)."""
    real = workers.fast_file
    calls = {"n": 0}

    def fake(task, opts):
        calls["n"] += 1
        if calls["n"] == n:
            raise KeyboardInterrupt
        return real(task, opts)

    monkeypatch.setattr(workers, "fast_file", fake)


def test_interrupt_then_resume_is_identical(tmp_path, make_folder, monkeypatch):
    src = make_folder(classes=3, per_class=30)
    (src / "class_1" / "img_0003.jpg").write_bytes(b"")  # a skipped file before the interruption
    (src / "class_2" / "img_0020.jpg").write_bytes(b"")  # and one after it
    ref = pack(src, tmp_path / "ref", shard_size="16KiB")
    assert ref.num_shards >= 4

    out = tmp_path / "out"
    partial = tmp_path / "out.partial"
    _interrupt_after(monkeypatch, 55)
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, shard_size="16KiB")
    monkeypatch.undo()
    assert not out.exists() and partial.is_dir()
    assert not (partial / "manifest.json").exists()
    journal = json.loads((partial / "journal.json").read_text())
    assert journal["format"] == "fastload-journal" and 0 < len(journal["shards"]) < ref.num_shards
    assert journal["skipped"] == [{"path": str(src / "class_1" / "img_0003.jpg"), "reason": "zero-byte file"}]
    assert any(p.name.endswith(".lmdb.tmp") for p in partial.iterdir())
    with pytest.raises(FormatError, match="missing manifest"):
        fastload.Dataset(partial)

    with pytest.raises(ConfigError, match=r"unfinished pack; continue it with --resume .* --overwrite"):
        pack(src, out, shard_size="16KiB")
    with pytest.raises(ConfigError, match=r"options changed \(quality 95 -> 90\)"):
        pack(src, out, shard_size="16KiB", resume=True, quality=90)

    reused = {s["file"]: s["sha256"] for s in journal["shards"]}
    res = pack(src, out, shard_size="16KiB", resume=True, workers=2)
    assert not partial.exists()
    assert res.num_samples == ref.num_samples and res.skipped == ref.skipped and len(res.skipped) == 2
    assert file_hashes(out) == file_hashes(tmp_path / "ref")
    assert manifest_sans_time(out) == manifest_sans_time(tmp_path / "ref")
    assert all(file_hashes(out)[f] == h for f, h in reused.items())


def test_resume_refuses_a_changed_source_and_overwrite_starts_over(tmp_path, make_folder, monkeypatch):
    src = make_folder(classes=2, per_class=20)
    _interrupt_after(monkeypatch, 30)
    with pytest.raises(KeyboardInterrupt):
        pack(src, tmp_path / "out", shard_size="16KiB")
    monkeypatch.undo()
    write_image(src / "class_0" / "new.jpg", (1, 2, 3))
    with pytest.raises(ConfigError, match="the source changed"):
        pack(src, tmp_path / "out", shard_size="16KiB", resume=True)
    res = pack(src, tmp_path / "out", shard_size="16KiB", overwrite=True)
    assert res.num_samples == 41 and not (tmp_path / "out.partial").exists()


def test_resume_repacks_a_damaged_finished_shard(tmp_path, make_folder, monkeypatch):
    src = make_folder(classes=2, per_class=30)
    ref = pack(src, tmp_path / "ref", shard_size="16KiB")
    _interrupt_after(monkeypatch, 50)
    with pytest.raises(KeyboardInterrupt):
        pack(src, tmp_path / "out", shard_size="16KiB")
    monkeypatch.undo()
    partial = tmp_path / "out.partial"
    shards = json.loads((partial / "journal.json").read_text())["shards"]
    assert len(shards) >= 2
    with open(partial / shards[1]["file"], "r+b") as f:  # damage the second finished shard
        f.seek(5000)
        f.write(b"\xff" * 16)
    res = pack(src, tmp_path / "out", shard_size="16KiB", resume=True)
    assert res.num_samples == ref.num_samples
    assert file_hashes(tmp_path / "out") == file_hashes(tmp_path / "ref")


_KILL_SCRIPT = """
import sys, time
import fastload
from fastload.packing import workers
real = workers.Results.__iter__
def slow(self):
    for i, r in enumerate(real(self)):
        if i >= 40:
            time.sleep(0.02)
        yield r
workers.Results.__iter__ = slow
fastload.pack(sys.argv[1], sys.argv[2], shard_size="16KiB", workers=2, progress=False)
"""


def test_killed_pack_leaves_no_manifest_and_resumes(tmp_path, make_folder):
    src = make_folder(classes=3, per_class=40)
    out = tmp_path / "out"
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(src), str(out)], cwd=tmp_path)
    journal = tmp_path / "out.partial" / "journal.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if len(json.loads(journal.read_text())["shards"]) >= 2:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    assert not out.exists()
    assert not (tmp_path / "out.partial" / "manifest.json").exists()
    res = pack(src, out, shard_size="16KiB", resume=True)
    ref = pack(src, tmp_path / "ref", shard_size="16KiB")
    assert res.num_samples == 120
    assert file_hashes(out) == file_hashes(tmp_path / "ref")


def test_disk_full_is_a_pack_error_and_resumable(tmp_path, make_folder, monkeypatch):
    src = make_folder(classes=2, per_class=10)

    def full(self, env, records):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(shards.ShardWriter, "_write_batch", full)
    with pytest.raises(PackError, match=r"out\.partial/shard-00000\.lmdb\.tmp: cannot write shard: .*No space left.*--resume"):
        pack(src, tmp_path / "out")
    monkeypatch.undo()
    assert not (tmp_path / "out").exists()
    assert pack(src, tmp_path / "out", resume=True).num_samples == 20


# ----------------------------------------------------------------------------- options


@pytest.mark.parametrize(
    "value, expected",
    [("1GB", 10**9), ("512MB", 512 * 10**6), ("64KiB", 65536), ("1.5G", 3 << 29), (" 2 mib ", 2 << 20), (4096, 4096), ("100", 100)],
)
def test_parse_size(value, expected):
    assert run.parse_size(value) == expected


@pytest.mark.parametrize("value", ["", "1XB", "-5", "0", 0, "GB", True, "1e9"])
def test_parse_size_refuses(value):
    with pytest.raises(ConfigError, match="--shard-size"):
        run.parse_size(value)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"workers": 0}, "--workers"),
        ({"on_error": "ignore"}, "--on-error"),
        ({"quality": 101}, "--quality"),
        ({"max_size": 0}, "--max-size"),
        ({"max_pixels": "many"}, "--max-pixels"),
        ({"shard_size": "huge"}, "--shard-size"),
    ],
)
def test_bad_options(tmp_path, make_folder, kw, message):
    src = make_folder(classes=1, per_class=1)
    with pytest.raises(ConfigError, match=message):
        pack(src, tmp_path / "out", **kw)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_progress_bar_on_a_tty(monkeypatch, capsys):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    bar = run.Progress(total=100, done=0, enabled=True)
    bar.interval = 0.0
    bar.t0 -= 1.0
    bar.update(50, 5_000_000)
    bar.close()
    text = err.getvalue()
    assert "50/100" in text and "img/s" in text and "MB/s" in text and text.endswith("\r\033[K")


# ----------------------------------------------------------------------------- pack_dataset


class ColourDataset:
    """Items of every accepted image type; colours encode (label, index)."""

    def __init__(self, n: int = 12, classes=None):
        self.n = n
        if classes:
            self.classes = classes

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        label = i % 3
        c = encode_color(label, i)
        img = Image.new("RGB", (20, 16), c)
        kind = i % 4
        if kind == 0:
            return img, label
        if kind == 1:
            return np.asarray(img), np.int64(label)
        if kind == 2:
            buf = io.BytesIO()
            img.save(buf, "PNG")
            return buf.getvalue(), label
        buf = io.BytesIO()
        img.save(buf, "JPEG", quality=95)
        return buf.getvalue(), label


@pytest.mark.parametrize("workers", [1, 2])
def test_pack_dataset_round_trip(tmp_path, workers):
    res = fastload.pack_dataset(ColourDataset(12), tmp_path / "out", workers=workers, progress=False)
    assert (res.num_samples, res.num_classes, res.skipped) == (12, 3, [])
    ds = fastload.Dataset(tmp_path / "out", check=True)
    assert ds.classes == ["0", "1", "2"]
    for i in range(12):
        payload, label = ds[i]
        assert label == i % 3 and decode_color(mean_rgb(payload)) == (i % 3, i)
        assert ds.source_path(i) == f"dataset[{i}]"
    h = [ds.header(i) for i in range(4)]
    assert [x.flags for x in h] == [FLAG_CONVERTED, FLAG_CONVERTED, FLAG_CONVERTED, 0]


def test_pack_dataset_classes_gray_arrays_and_bad_items(tmp_path):
    items = [
        (np.full((10, 12), 200, np.uint8), 0),
        (np.full((10, 12, 1), 50, np.uint8), 1),
        (np.zeros((10, 12), np.float32), 1),
        ("not an image", 0),
        (b"", 1),
    ]
    res = fastload.pack_dataset(items, tmp_path / "out", classes=["a", "b", "c"], progress=False)
    assert [s["reason"] for s in res.skipped] == [
        "array dtype float32 is not uint8",
        "unsupported image type str (need a PIL image, uint8 array or bytes)",
        "zero-byte file",
    ]
    assert [s["path"] for s in res.skipped] == ["dataset[2]", "dataset[3]", "dataset[4]"]
    ds = fastload.Dataset(tmp_path / "out")
    assert ds.classes == ["a", "b", "c"] and ds.labels.tolist() == [0, 1]
    assert np.allclose(mean_rgb(ds[0][0]), 200, atol=2) and np.allclose(mean_rgb(ds[1][0]), 50, atol=2)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["class_counts"] == [1, 1, 0]
    with pytest.raises(ConfigError, match=r"dataset\[0\]: label 7 is outside the 2 classes"):
        fastload.pack_dataset([(b"x", 7)], tmp_path / "out2", classes=["a", "b"], progress=False)
    assert not (tmp_path / "out2").exists() and not (tmp_path / "out2.partial").exists()
    assert fastload.pack_dataset(ColourDataset(3, classes=["r", "g", "b"]), tmp_path / "o3", progress=False).num_classes == 3


# ----------------------------------------------------------------------------- readers


def _read_all(path: str) -> list[tuple[int, int]]:
    ds = fastload.Dataset(path, check=True)
    out = []
    for i in reversed(range(len(ds))):
        payload, label = ds[i]
        a = np.asarray(Image.open(io.BytesIO(payload)), dtype=np.float64).reshape(-1, 3).mean(axis=0)
        lab, idx = decode_color(a)
        assert lab == label
        out.append(idx)
    return out


def test_concurrent_readers(tmp_path, make_folder):
    src = make_folder(classes=4, per_class=15)
    pack(src, tmp_path / "out", shard_size="32KiB")
    with mp.get_context("spawn").Pool(4) as pool:
        results = pool.map(_read_all, [str(tmp_path / "out")] * 4)
    assert results == [list(reversed(range(60)))] * 4


def test_reader_refusals(tmp_path, make_folder):
    src = make_folder(classes=2, per_class=3)
    out = tmp_path / "out"
    pack(src, out)
    with pytest.raises(FormatError, match="missing manifest"):
        fastload.Dataset(src)
    m = json.loads((out / "manifest.json").read_text())

    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "manifest.json").write_text(json.dumps({**m, "format": "mds"}))
    with pytest.raises(FormatError, match="not a fastload manifest"):
        fastload.Dataset(foreign)

    newer = tmp_path / "newer"
    newer.mkdir()
    (newer / "manifest.json").write_text(json.dumps({**m, "version": "4.0"}))
    with pytest.raises(FormatError, match="newer than this fastload reads.*upgrade"):
        fastload.Dataset(newer)

    labels = out / "labels.bin"
    raw = labels.read_bytes()
    labels.write_bytes(raw[:4] + (1).to_bytes(4, "little") + raw[8:])
    with pytest.raises(CorruptDataError, match="labels were altered"):
        fastload.Dataset(out)
    labels.write_bytes(raw)

    shard = out / shard_name(0)
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2])
    ds = fastload.Dataset(out)
    with pytest.raises(CorruptDataError, match="shard is .* bytes, the manifest says"):
        ds[0]
    rep = fastload.verify(out)
    assert not rep.ok and any("bad shard" in p and "truncated" in p for p in rep.problems)


def test_verify_names_a_corrupted_sample(tmp_path, make_folder):
    src = make_folder(classes=2, per_class=3, size=(200, 150))
    out = tmp_path / "out"
    pack(src, out)
    shard = out / shard_name(0)
    data = bytearray(shard.read_bytes())
    payload = (src / "class_1" / "img_0001.jpg").read_bytes()
    at = bytes(data).index(payload[-600:-500])
    data[at + 10] ^= 0xFF
    shard.write_bytes(bytes(data))
    rep = fastload.verify(out)
    assert not rep.ok
    assert rep.problems == [
        f"bad shard {shard}: SHA-256 differs from the manifest",
        f"sample 4 in {shard}: payload XXH3 checksum mismatch (the image bytes were altered)",
    ]
    assert rep.samples_checked == 6


def test_a_dying_worker_is_an_error_not_a_hang(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for i in range(20):
        write_image(src / "a" / f"{i:02d}.png", encode_color(0, i))
    real = workers.process_task

    def crash_on_13(task, opts):
        if task[3].endswith("13.png"):
            os._exit(3)  # like a segfault in a decoder
        return real(task, opts)

    monkeypatch.setattr(workers, "process_task", crash_on_13)
    t0 = time.monotonic()
    with pytest.raises(PackError, match=r"a worker process died while converting .*00\.png \.\. .*15\.png"):
        pack(src, tmp_path / "out", workers=2)
    assert time.monotonic() - t0 < 30
    assert not (tmp_path / "out").exists() and (tmp_path / "out.partial").is_dir()


def test_pack_from_a_list_file(tmp_path):
    imgs = tmp_path / "imgs"
    write_image(imgs / "a.jpg", encode_color(1, 0), quality=95)
    write_image(imgs / "b c.png", encode_color(0, 1))
    write_image(tmp_path / "abs.jpg", encode_color(1, 2), quality=95)
    lst = tmp_path / "lists" / "train.csv"
    lst.parent.mkdir()
    lst.write_text(f"path,label\n../imgs/a.jpg,dog\n../imgs/b c.png,cat\n{tmp_path / 'abs.jpg'},dog\n../imgs/missing.jpg,cat\n")
    res = pack(lst, tmp_path / "out")
    assert res.skipped == [{"path": str(lst.parent / "../imgs/missing.jpg"), "reason": "unreadable (No such file or directory)"}]
    ds = fastload.Dataset(tmp_path / "out")
    assert ds.classes == ["cat", "dog"] and ds.labels.tolist() == [1, 0, 1]
    assert [ds.source_path(i) for i in range(3)] == ["../imgs/a.jpg", "../imgs/b c.png", str(tmp_path / "abs.jpg")]
    assert [decode_color(mean_rgb(ds[i][0])) for i in range(3)] == [(1, 0), (0, 1), (1, 2)]


def test_verify_decode_and_labels(tmp_path, make_folder):
    import lmdb

    from fastload.format import decode_header, encode_record, key

    src = make_folder(classes=2, per_class=2)
    out = tmp_path / "out"
    pack(src, out)
    shard = out / shard_name(0)
    env = lmdb.open(str(shard), subdir=False, lock=False)
    with env.begin(write=True) as txn:  # a record whose CRC is right but whose image is not
        h = decode_header(txn.get(key(1)))
        txn.put(key(1), encode_record(b"\xff\xd8\xff\xe0 not really a jpeg", label=h.label, encoding=h.encoding,
                                      width=h.width, height=h.height, orig_width=h.width, orig_height=h.height))  # fmt: skip
    env.close()
    m = json.loads((out / "manifest.json").read_text())
    m["shards"][0].update(bytes=shard.stat().st_size, sha256=hashlib.sha256(shard.read_bytes()).hexdigest())
    (out / "manifest.json").write_text(json.dumps(m))
    assert fastload.verify(out).ok
    rep = fastload.verify(out, decode=True)
    assert len(rep.problems) == 1 and rep.problems[0].startswith(f"sample 1 in {shard}: does not decode")
    labels = out / "labels.bin"
    raw = labels.read_bytes()
    labels.write_bytes(raw[:-4] + (0).to_bytes(4, "little"))
    assert fastload.verify(out).problems == [f"{labels}: SHA-256 differs from the manifest (labels altered)"]
