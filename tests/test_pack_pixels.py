"""What pack writes, checked pixel by pixel and call by call: EXIF orientations, shard sizes, fsync order.

* Every EXIF orientation (1-8) of a gradient image is stored upright, pixel for pixel
  what PIL's ``ImageOps.exif_transpose`` makes of the file.
* Shards roll over neither late (no shard above ``shard_size``) nor early (no shard
  that still had room for the record that opened the next one).
* A shard is fsynced before it is renamed to its final name, and renamed (and its
  directory fsynced) before the journal that lists it is written: the order of the real
  ``os.fsync`` / ``os.replace`` calls is recorded while ``pack`` runs.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

import fastload
from fastload.format import FLAG_ORIENTED

from conftest import position_pattern, save_lossless_jpeg
from reference import decode, difference

#: (w, h) of the EXIF test image as stored in the file: not square, so 5-8 swap the sides.
EXIF_SIZE = (64, 40)
#: Stored JPEG (quality 100, 4:2:0 chroma) against the upright source: measured max 5, worst-channel
#: mean 0.5 on this gradient; any wrong turn or mirror of it costs more than 100 levels of mean.
EXIF_TOLERANCE = (8.0, 1.0)


def _exif_gradient() -> np.ndarray:
    """A gradient with no symmetry: R = x, G = y, B = x * y, so each of the 8 orientations differs."""
    a = position_pattern(*EXIF_SIZE, 0, checker=False)
    yy, xx = np.mgrid[0 : EXIF_SIZE[1], 0 : EXIF_SIZE[0]]
    a[..., 2] = np.rint(xx * yy * 255.0 / ((EXIF_SIZE[0] - 1) * (EXIF_SIZE[1] - 1))).astype(np.uint8)
    return a


@pytest.fixture(scope="module")
def exif_packed(tmp_path_factory) -> tuple[Path, Path]:
    base = tmp_path_factory.mktemp("exif")
    a = _exif_gradient()
    for orientation in range(1, 9):
        exif = Image.Exif()
        exif[0x0112] = orientation
        save_lossless_jpeg(base / "src" / "c" / f"o{orientation}.jpg", a, exif=exif.tobytes())
    fastload.pack(base / "src", base / "packed", workers=1, progress=False, quality=100)
    return base / "src", base / "packed"


@pytest.mark.parametrize("orientation", range(1, 9))
def test_exif_orientation_is_stored_upright_pixel_for_pixel(exif_packed, orientation):
    src, packed = exif_packed
    ds = fastload.Dataset(packed)
    i = [ds.source_path(k) for k in range(len(ds))].index(f"c/o{orientation}.jpg")
    header, _, _ = ds.raw(i)
    payload, _ = ds[i]
    with Image.open(src / "c" / f"o{orientation}.jpg") as im:
        raw = np.asarray(im.convert("RGB"))
        want = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
    got = decode(payload)
    assert got.shape == want.shape, f"stored {got.shape[1]}x{got.shape[0]}, upright {want.shape[1]}x{want.shape[0]}"
    assert (header.width, header.height) == (want.shape[1], want.shape[0])
    assert (header.orig_width, header.orig_height) == EXIF_SIZE
    assert bool(header.flags & FLAG_ORIENTED) == (orientation != 1)
    d = difference(got, want)
    assert d.within(*EXIF_TOLERANCE), f"orientation {orientation}: {d}"
    if orientation == 1:
        assert payload == (src / "c" / "o1.jpg").read_bytes()  # upright already: stored as it is
    for t in Image.Transpose:  # every other turn or mirror of the file is far from what is stored
        other = np.asarray(Image.fromarray(raw).transpose(t))
        if other.shape == got.shape and not np.array_equal(other, want):
            assert difference(got, other).mean > 10 * EXIF_TOLERANCE[1], (orientation, t)


# ----------------------------------------------------------------------------- shard sizes


def _noisy_folder(root: Path, n: int) -> Path:
    """``n`` JPEGs of different sizes and noise levels in 3 classes: records of about 1-3 KB, none alike."""
    rng = np.random.default_rng(7)
    for i in range(n):
        w, h = 48 + 8 * (i % 5), 40 + 8 * (i % 3)
        noise = 4 + 6 * (i % 7)
        a = position_pattern(w, h, i % 3).astype(np.int16) + rng.integers(-noise, noise + 1, size=(h, w, 3), dtype=np.int16)
        path = root / f"c{i % 3}" / f"{i:03d}.jpg"
        path.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.clip(a, 0, 255).astype(np.uint8)).save(path, quality=90)
    return root


@pytest.mark.parametrize("shard_size", [40 << 10, 72 << 10])
def test_shards_roll_over_neither_late_nor_early(tmp_path, shard_size):
    src = _noisy_folder(tmp_path / "src", 90)
    res = fastload.pack(src, tmp_path / "out", workers=1, progress=False, shard_size=shard_size)
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    shards = manifest["shards"]
    assert res.num_shards == len(shards) >= 4
    ds = fastload.Dataset(tmp_path / "out")
    page = 4096
    for k, s in enumerate(shards):
        size = (tmp_path / "out" / s["file"]).stat().st_size
        assert size == s["bytes"] <= shard_size, f"{s['file']}: {size} bytes > shard_size {shard_size}"
        if k + 1 < len(shards):
            # from below: the record that opened the next shard did not fit in this one. The writer
            # keeps 4 pages of headroom for LMDB's own pages (branch pages, meta, free list), and the
            # record itself costs its bytes plus a node header; one more page covers page rounding.
            nxt = len(ds.raw(shards[k + 1]["first"])[1])
            assert size + nxt + 5 * page > shard_size, (
                f"{s['file']} closed at {size} bytes with room for the next record ({nxt} bytes) under {shard_size}"
            )
    assert sum(s["count"] for s in shards) == res.num_samples == 90


# ----------------------------------------------------------------------------- fsync order


def test_each_shard_is_fsynced_before_its_rename_and_its_journal(tmp_path, monkeypatch):
    src = _noisy_folder(tmp_path / "src", 40)
    out = tmp_path / "out"
    events: list[tuple] = []
    lock = threading.Lock()
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            path = "?"
        if path.endswith((".lmdb", ".lmdb.tmp")):
            time.sleep(0.02)  # a slow disk: a rename that does not wait for the fsync would overtake it
        real_fsync(fd)
        with lock:
            events.append(("fsync", path))  # recorded once the data is on disk

    def replace(a, b, **kw):
        a, b = os.fspath(a), os.fspath(b)
        listed = None
        if os.path.basename(b) == "journal.json":
            listed = [s["file"] for s in json.loads(Path(a).read_text())["shards"]]
        real_replace(a, b, **kw)
        with lock:
            events.append(("replace", os.path.abspath(a), os.path.abspath(b), listed))

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    res = fastload.pack(src, out, workers=1, progress=False, shard_size=48 << 10)
    monkeypatch.undo()
    assert res.num_shards >= 3
    names = [s["file"] for s in json.loads((out / "manifest.json").read_text())["shards"]]

    def first(pred, what, after=-1):
        hits = [k for k, e in enumerate(events) if k > after and pred(e)]
        assert hits, f"no {what} among the {len(events)} calls recorded"
        return hits[0]

    real = os.path.realpath
    for name in names:
        renamed = first(lambda e: e[0] == "replace" and e[2].endswith("/" + name) and e[1].endswith(name + ".tmp"), f"rename of {name}")
        partial = real(os.path.dirname(events[renamed][2]))
        synced = first(lambda e: e[0] == "fsync" and os.path.basename(e[1]) in (name, name + ".tmp"), f"fsync of {name}")
        assert synced < renamed, f"{name} was renamed before its data was fsynced"
        dir_synced = first(lambda e: e[0] == "fsync" and real(e[1]) == partial, f"fsync of {partial} after the rename", after=renamed)
        journaled = first(lambda e: e[0] == "replace" and e[3] is not None and name in e[3], f"journal listing {name}")
        assert renamed < dir_synced < journaled, f"{name}: the journal listed it before it was renamed and its directory fsynced"
        journal_tmp = real(events[journaled][1])
        assert any(e[0] == "fsync" and real(e[1]) == journal_tmp for e in events[:journaled]), "journal written without fsync"
