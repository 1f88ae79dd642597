"""Careless and hostile input, round four (issue 38), class 3: a field named ``label`` that is not a class index.

A Parquet string or float column, a WebDataset ``.label`` member, a soft-label vector or a
string from ``pack_dataset``: each was stored as a field of its kind and read back as class 0
for every sample. Policy: refused at pack (never renamed behind the user's back), in one line
that names the field's kind and says to rename it or store class indices; the pack writes
nothing. A ``label`` of integers is packed as the class index, as before.
"""

from __future__ import annotations

import io
import tarfile

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.errors import ConfigError


def _jpeg(v: int) -> bytes:
    b = io.BytesIO()
    Image.new("RGB", (20, 12), (v, 255 - v, v // 2)).save(b, "JPEG", quality=95)
    return b.getvalue()


def _parquet(tmp_path, labels):
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    src = tmp_path / "pq"
    src.mkdir()
    pq.write_table(pa.table({"image": [_jpeg(40 * k) for k in range(len(labels))], "label": labels}), src / "part-0.parquet")
    return lambda out: fastload.pack_parquet(src, out, workers=1, progress=False)


def _tar(tmp_path, label_member):
    src = tmp_path / "wds"
    src.mkdir()
    with tarfile.open(src / "00000.tar", "w") as t:
        for k in range(3):
            for ext, data in (("jpg", _jpeg(40 * k)), (label_member, str(k).encode())):
                info = tarfile.TarInfo(f"s{k:03d}.{ext}")
                info.size = len(data)
                t.addfile(info, io.BytesIO(data))
    return lambda out: fastload.pack_webdataset(src, out, workers=1, progress=False)


def _dataset(tmp_path, labels):
    items = [{"image": _jpeg(40 * k), "label": lab} for k, lab in enumerate(labels)]
    return lambda out: fastload.pack_dataset(items, out, workers=1, progress=False)


@pytest.mark.parametrize(
    "make, kind",
    [
        (lambda p: _parquet(p, ["cat", "dog", "cat"]), "str"),
        (lambda p: _parquet(p, [0.5, 1.0, 2.0]), "a float64 field"),
        (lambda p: _tar(p, "label"), "bytes"),
        (lambda p: _dataset(p, [np.array([0.9, 0.1], np.float32), np.array([0.2, 0.8], np.float32), np.array([0.5, 0.5], np.float32)]), "float32[2]"),
    ],
    ids=["parquet-str", "parquet-float", "wds-label-member", "dataset-soft-label"],
)
def test_a_label_field_that_is_not_a_class_index_is_refused_at_pack(tmp_path, make, kind):
    pack = make(tmp_path)
    with pytest.raises(ConfigError) as e:
        pack(tmp_path / "out")
    msg = str(e.value)
    assert "'label' is a" in msg and "class index" in msg and "rename it" in msg, msg
    assert kind in msg, msg
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("make", [lambda p: _parquet(p, [2, 0, 1]), lambda p: _tar(p, "cls"), lambda p: _dataset(p, [2, 0, 1])], ids=["parquet", "wds-cls", "dataset"])
def test_integer_labels_are_still_the_class_index(tmp_path, make):
    make(tmp_path)(tmp_path / "out")
    ds = fastload.Dataset(tmp_path / "out")
    got = sorted(ds[i][1] for i in range(len(ds)))
    assert got == [0, 1, 2]
