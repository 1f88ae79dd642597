"""Dataset: random access, index rules, handles shared per process and renewed when a shard is replaced."""

from __future__ import annotations

import io
import multiprocessing as mp

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import CorruptDataError

from conftest import decode_color


def _label_of(payload: bytes) -> tuple[int, int]:
    rgb = np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"), dtype=np.float64).mean(axis=(0, 1))
    return decode_color(rgb)


def test_random_access_and_index_rules(make_folder, tmp_path):
    src = make_folder(classes=2, per_class=3)
    fastload.pack(src, tmp_path / "p", workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "p")
    assert len(ds) == 6 and ds.classes == ["class_0", "class_1"]
    assert ds.labels.tolist() == [0, 0, 0, 1, 1, 1] and ds.labels.dtype == np.int64
    for i in (5, 0, 3, -1, np.int64(2)):
        payload, label = ds[i]
        assert _label_of(payload) == (label, int(i) % 6)
    assert ds[-1] == ds[5]
    with pytest.raises(IndexError, match="out of range"):
        ds[6]
    with pytest.raises(TypeError, match="integer"):
        ds[1.0]
    assert ds.source_path(4) == "class_1/img_0001.jpg"
    assert "sample 4 (class_1/img_0001.jpg)" in ds.where(4)


def test_overwritten_dataset_is_reread_in_the_same_process(make_folder, tmp_path):
    out = tmp_path / "p"
    fastload.pack(make_folder(classes=1, per_class=2), out, workers=1, progress=False)
    first = fastload.Dataset(out)[1][0]
    fastload.pack(make_folder(classes=2, per_class=2), out, workers=1, progress=False, overwrite=True)
    ds = fastload.Dataset(out)
    assert len(ds) == 4
    assert ds[1][0] == first and _label_of(ds[3][0]) == (1, 3)  # same image 1, new image 3


def _child(path, q):
    ds = path if isinstance(path, fastload.Dataset) else fastload.Dataset(path)
    q.put([_label_of(ds[i][0]) for i in range(len(ds))])


def test_dataset_used_before_and_after_fork(make_folder, tmp_path):
    fastload.pack(make_folder(classes=2, per_class=2), tmp_path / "p", workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "p")
    ds[0]  # the parent opens the shard first
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=_child, args=(ds, q))
    p.start()
    got = q.get(timeout=60)
    p.join(timeout=60)
    assert p.exitcode == 0 and got == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert ds[3][1] == 1  # the parent's handle still works


def test_check_reports_altered_bytes(make_folder, tmp_path):
    fastload.pack(make_folder(classes=1, per_class=3), tmp_path / "p", workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "p")
    _, value, _ = ds.raw(1)
    shard = tmp_path / "p" / ds.shards[0].file
    raw = bytearray(shard.read_bytes())
    pos = raw.find(bytes(value))
    raw[pos + len(value) - 10] ^= 0x01
    shard.write_bytes(bytes(raw))
    fresh = fastload.Dataset(tmp_path / "p", check=True)
    fresh[0]
    with pytest.raises(CorruptDataError, match=r"sample 1: payload XXH3 checksum mismatch"):
        fresh[1]
    assert fastload.Dataset(tmp_path / "p", check=False)[1][1] == 0  # unchecked reads still work
