"""Careless and hostile input, round four (issue 38), classes 3 and 4 in the converters and COCO.

Each source is written by its own library (pyarrow, GNU tar, tarfile, PIL) and what fastload
packs is compared with what that library, or webdataset, reads: a null inside a Parquet list is
a refused sample (never NaN or 0, never a ``TypeError`` ending the pack), a uint64 of 2**63 or
more a refused sample, a ``.json`` nested past Python's JSON reader a refused sample, a GNU
sparse member the expanded file webdataset reads, and a COCO entry whose ``height``/``width``
are not the image's as packed (EXIF orientation applied) a refused sample naming the image.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image, ImageOps

import fastload
from fastload.errors import ConfigError
from fastload.packing import convert_wds

pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _jpeg(seed: int, size=(24, 16)) -> bytes:
    rng = np.random.default_rng(seed)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _reasons(res) -> dict[str, str]:
    return {s["path"]: s["reason"] for s in res.skipped}


# ----------------------------------------------------------------------------- Parquet


LISTS = {
    "float-list": (pa.list_(pa.float32()), [[1.5, 2.5], [1.0, None, 3.0], [0.25]], "[1]"),
    "int-list": (pa.list_(pa.int64()), [[1, 2], [7, None], [3]], "[1]"),
    "fixed-list": (pa.list_(pa.float32(), 2), [[1.5, 2.5], [None, 4.0], [5.0, 6.0]], "[0]"),
    "nested-list": (pa.list_(pa.list_(pa.int32(), 2)), [[[1, 2]], [[3, 4], [5, None]], []], "[1][1]"),
}


@pytest.mark.parametrize("kind", list(LISTS))
def test_a_null_inside_a_parquet_list_is_a_refused_sample_never_nan_or_0(tmp_path, kind):
    """Before: a float null became NaN (packed and served), an int null ended the pack with a TypeError."""
    typ, rows, at = LISTS[kind]
    src = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"image": [_jpeg(i) for i in range(3)], "v": pa.array(rows, typ)}), src)
    res = fastload.pack_parquet(src, tmp_path / "out", workers=1, progress=False)
    assert res.num_samples == 2
    assert _reasons(res) == {f"{src} row 1": f"field 'v' ({fastload.Dataset(tmp_path / 'out').schema['v'].spec}) holds a null "
                                              f"at {at}; a null is refused, never stored as NaN or 0"}
    ds = fastload.Dataset(tmp_path / "out")
    want = pq.read_table(src).column("v").to_pylist()  # pyarrow's own reading of the kept rows
    for i, row in enumerate((0, 2)):
        got = ds.fields(i)["v"]
        assert not np.isnan(np.asarray(got, dtype=np.float64)).any()
        assert np.asarray(got).tolist() == (np.asarray(want[row], dtype=np.asarray(got).dtype).tolist() if want[row] else [])


@pytest.mark.parametrize("typ, rows", [
    (pa.uint64(), [1, 2**63, 3]),
    (pa.uint64(), [1, 2**64 - 1, 3]),
    (pa.list_(pa.uint64()), [[1], [5, 2**63], [3]]),
], ids=["scalar-2**63", "scalar-2**64-1", "list-2**63"])  # fmt: skip
def test_a_uint64_of_2_63_or_more_is_a_refused_sample_never_wrapped(tmp_path, typ, rows):
    """Before: in a list, an OverflowError ended the pack (a scalar was refused already: a guard)."""
    src = tmp_path / "rows.parquet"
    pq.write_table(pa.table({"image": [_jpeg(i) for i in range(3)], "n": pa.array(rows, typ)}), src)
    res = fastload.pack_parquet(src, tmp_path / "out", workers=1, progress=False)
    assert res.num_samples == 2 and list(_reasons(res)) == [f"{src} row 1"]
    assert "does not fit in int64" in _reasons(res)[f"{src} row 1"]
    ds = fastload.Dataset(tmp_path / "out")
    assert [np.asarray(ds.fields(i)["n"]).tolist() for i in range(2)] == [rows[0], rows[2]]


# ----------------------------------------------------------------------------- WebDataset


def _tar(path: Path, samples: list[dict[str, bytes]]) -> Path:
    with tarfile.open(path, "w") as tf:
        for k, members in enumerate(samples):
            for ext, data in members.items():
                ti = tarfile.TarInfo(f"{k:06d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return path


DEEP = ("[" * 50000 + "]" * 50000).encode()


def test_a_json_member_nested_past_pythons_reader_is_a_refused_sample(tmp_path):
    """Before: a RecursionError ended the pack."""
    docs = [b'{"a": [1, 2]}', b'{"a": ' + DEEP + b"}", b'{"a": [3]}']
    src = _tar(tmp_path / "s.tar", [{"jpg": _jpeg(i), "json": d} for i, d in enumerate(docs)])
    with pytest.raises(RecursionError):
        json.loads(docs[1])  # what Python's own reader does with it
    res = fastload.pack_webdataset(src, tmp_path / "out", json_fields="a:int32[]", workers=1, progress=False)
    assert res.num_samples == 2
    assert _reasons(res) == {f"{src}:000001": ".json nests deeper than Python's JSON reader can read"}
    ds = fastload.Dataset(tmp_path / "out")
    assert [ds.fields(i)["a"].tolist() for i in range(2)] == [[1, 2], [3]]


def test_a_json_member_too_deep_in_the_sample_that_decides_the_schema_is_one_error_naming_it(tmp_path):
    """Before: a RecursionError."""
    src = _tar(tmp_path / "s.tar", [{"jpg": _jpeg(0), "json": b'{"a": ' + DEEP + b"}"}, {"jpg": _jpeg(1), "json": b'{"a": [3]}'}])
    with pytest.raises(ConfigError, match=r"s\.tar:000000: the fields of the first sample .* nests deeper than Python's JSON reader"):
        fastload.pack_webdataset(src, tmp_path / "out", json_fields="a", workers=1, progress=False)


@pytest.fixture
def sparse_tars(tmp_path):
    """Tars written by GNU tar --sparse (old GNU and PAX formats): a sample whose image and .bin
    have holes between two regular samples; with webdataset's reading of each."""
    wds = pytest.importorskip("webdataset")
    files = tmp_path / "files"
    files.mkdir()
    jpg = _jpeg(1)
    (files / "000000.jpg").write_bytes(_jpeg(0))
    (files / "000000.bin").write_bytes(b"first")
    with open(files / "000001.jpg", "wb") as f:  # a JPEG followed by a hole: decoders stop at its end
        f.write(jpg)
        f.truncate(len(jpg) + 65536)
    with open(files / "000001.bin", "wb") as f:
        f.write(b"head")
        f.seek(3 * 65536)
        f.write(b"tail")
    (files / "000002.jpg").write_bytes(_jpeg(2))
    (files / "000002.bin").write_bytes(np.random.default_rng(5).bytes(300000))  # raw chunks would read into it
    names = sorted(p.name for p in files.iterdir())
    out = {}
    for fmt in ("gnu", "posix"):
        t = tmp_path / f"{fmt}.tar"
        subprocess.run(["tar", "--sparse", f"--format={fmt}", "-cf", str(t), *names], cwd=files, check=True)
        members = {m.name: m for m in tarfile.open(t)}
        assert members["000001.bin"].issparse() and members["000001.jpg"].issparse()
        out[fmt] = (t, list(wds.WebDataset(str(t), shardshuffle=False)))
    return out


@pytest.mark.parametrize("fmt", ["gnu", "posix"])
def test_a_gnu_sparse_member_is_packed_as_webdataset_reads_it(tmp_path, sparse_tars, fmt):
    """Before: stored as the raw chunks followed by the next member's bytes (or refused as a short tar)."""
    src, ref = sparse_tars[fmt]
    res = fastload.pack_webdataset(src, tmp_path / "out", workers=1, progress=False)
    assert res.num_samples == 3 and res.skipped == []
    ds = fastload.Dataset(tmp_path / "out")
    for i, sample in enumerate(ref):
        assert ds.fields(i)["bin"] == sample["bin"]
        assert ds[i][0] == sample["jpg"]  # JPEGs are stored byte for byte
    assert len(ref[1]["bin"]) == 3 * 65536 + 4 and ref[1]["bin"][4:-4] == bytes(3 * 65536 - 4)


def test_a_sparse_member_claiming_more_than_the_limit_is_refused_by_name(tmp_path, sparse_tars, monkeypatch):
    monkeypatch.setattr(convert_wds, "MAX_SPARSE_BYTES", 100000)
    src, _ = sparse_tars["gnu"]
    res = fastload.pack_webdataset(src, tmp_path / "out", workers=1, progress=False)
    assert res.num_samples == 2
    assert _reasons(res) == {f"{src}:000001": f"{src}: member 000001.bin is a sparse file claiming 196612 bytes, over the 100000 a member may expand to"}


# ----------------------------------------------------------------------------- COCO and EXIF


def _exif_jpeg(path: Path, w: int, h: int, orientation: int) -> None:
    exif = Image.Exif()
    exif[0x0112] = orientation
    a = np.zeros((h, w, 3), np.uint8)
    a[..., 0] = np.arange(w, dtype=np.uint8)[None, :] * 5
    a[..., 1] = np.arange(h, dtype=np.uint8)[:, None] * 7
    Image.fromarray(a).save(path, "JPEG", quality=95, exif=exif)


def _coco_pack(tmp_path: Path, entry: dict) -> fastload.packing.run.PackResult:
    src = tmp_path / "images"
    src.mkdir(exist_ok=True)
    Image.fromarray(np.full((20, 30, 3), 90, np.uint8)).save(src / "plain.png")
    ann = {
        "images": [{"id": 1, "file_name": "plain.png", "height": 20, "width": 30}, {"id": 2, **entry}],
        "categories": [{"id": 3, "name": "thing"}],
        "annotations": [
            {"id": 1, "image_id": 1, "category_id": 3, "bbox": [1, 1, 10, 8], "iscrowd": 0, "segmentation": [[1, 1, 11, 1, 11, 9, 1, 9]]},
            {"id": 2, "image_id": 2, "category_id": 3, "bbox": [2, 2, 12, 6], "iscrowd": 0, "segmentation": [[2, 2, 14, 2, 14, 8, 2, 8]]},
        ],
    }  # fmt: skip
    (tmp_path / "instances.json").write_text(json.dumps(ann))
    return fastload.pack_coco(src, tmp_path / "out", annotations=tmp_path / "instances.json", masks="instance", workers=1, progress=False)


@pytest.mark.parametrize("orientation", [6, 8, 5])
def test_coco_sizes_of_the_unturned_file_of_an_exif_turned_image_are_refused_naming_it(tmp_path, orientation):
    """A file 40 wide, 30 high with EXIF orientation 6: the pack turns it upright (30 wide, 40 high,
    as PIL's exif_transpose), so annotations saying height 30, width 40 do not describe the image
    served. Before: packed, then the mask (30x40) and the image (40x30) disagreed at every epoch."""
    _exif_jpeg(tmp_path / "turned.jpg", 40, 30, orientation)
    (tmp_path / "images").mkdir()
    (tmp_path / "turned.jpg").rename(tmp_path / "images" / "turned.jpg")
    with Image.open(tmp_path / "images" / "turned.jpg") as im:
        upright = ImageOps.exif_transpose(im).size
    assert upright == (30, 40)
    res = _coco_pack(tmp_path, {"file_name": "turned.jpg", "height": 30, "width": 40})
    assert res.num_samples == 1
    assert list(_reasons(res).values()) == [
        f"dataset raised ConfigError: image 2 (turned.jpg): the annotations say height 30, width 40, the file is 30 high, 40 wide, "
        f"40 high and 30 wide once its EXIF orientation {orientation} is applied as packed"]  # fmt: skip


def test_coco_sizes_of_an_exif_turned_image_as_packed_are_accepted(tmp_path):
    """The same file annotated upright (height 40, width 30): packed, its image and mask both 40x30.
    Before: refused against the unturned header."""
    (tmp_path / "images").mkdir()
    _exif_jpeg(tmp_path / "images" / "turned.jpg", 40, 30, 6)
    res = _coco_pack(tmp_path, {"file_name": "turned.jpg", "height": 40, "width": 30})
    assert res.num_samples == 2 and res.skipped == []
    ds = fastload.Dataset(tmp_path / "out")
    f = ds.fields(1)
    with Image.open(io.BytesIO(ds[1][0])) as im, Image.open(io.BytesIO(f["mask"])) as mask:
        assert im.size == (30, 40) and mask.size == (30, 40)
