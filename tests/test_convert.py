"""Converters from WebDataset tars and Parquet, tested with the real writers and readers.

Inputs are written by ``webdataset.TarWriter``, ``pyarrow.parquet`` and
``datasets.Dataset.save_to_disk``; what fastload packed is compared, field by field and
pixel by pixel, with what the same library reads back (``webdataset.WebDataset``,
``pyarrow.parquet.read_table``, ``datasets.load_from_disk``). Pixel-encoded: sample ``k``'s
image is a flat grey ``grey(k)`` and its caption names it.
"""

from __future__ import annotations

import io
import json
import os

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import ConfigError
from fastload.cli import main

wds = pytest.importorskip("webdataset")
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def grey(k: int) -> int:
    return (k * 24 + 12) % 240


def jpeg(v: int, size=(32, 24)) -> bytes:
    b = io.BytesIO()
    Image.new("RGB", size, (v, v, v)).save(b, "JPEG", quality=95)
    return b.getvalue()


def png(v: int) -> bytes:
    b = io.BytesIO()
    Image.new("L", (8, 8), v).save(b, "PNG")
    return b.getvalue()


def mean_grey(payload: bytes) -> float:
    return float(np.asarray(Image.open(io.BytesIO(payload)).convert("L"), dtype=np.float64).mean())


def write_tars(root, *, shards=2, per=6, no_image=(), no_txt=()):
    root.mkdir(parents=True, exist_ok=True)
    k = 0
    for s in range(shards):
        with wds.TarWriter(str(root / f"{s:05d}.tar")) as w:
            for _ in range(per):
                v = grey(k)
                sample = {
                    "__key__": f"s{k:05d}",
                    "jpg": jpeg(v),
                    "txt": f"a photo of grey {v}",
                    "cls": str(k % 4),
                    "json": json.dumps({"grey": v, "ids": list(range(k % 3 + 1)), "soft": [v / 255, 1.0]}),
                    "seg.png": png(v),
                }
                if k in no_image:
                    del sample["jpg"]
                if k in no_txt:
                    del sample["txt"]
                w.write(sample)
                k += 1
    return k


def read_with_webdataset(root) -> list[dict]:
    """What webdataset itself makes of the tars: its own grouping, its own key and extensions."""
    paths = sorted(str(p) for p in root.glob("*.tar"))
    return list(wds.WebDataset(paths, shardshuffle=False))


# ----------------------------------------------------------------------------- WebDataset


def test_webdataset_every_field_and_pixel_as_webdataset_reads_them(tmp_path):
    n = write_tars(tmp_path / "tars", no_image={4}, no_txt={7})
    res = fastload.pack_webdataset(tmp_path / "tars", tmp_path / "out", workers=2, progress=False)
    skipped = {s["path"].rsplit(":", 1)[1]: s["reason"] for s in res.skipped}
    assert skipped.keys() == {"s00004", "s00007"}
    assert "no image member" in skipped["s00004"] and "missing member(s) .txt" in skipped["s00007"]
    ds = fastload.Dataset(tmp_path / "out", check=True)
    assert ds.schema.names == ("image", "label", "json", "seg.png", "txt")  # in the order of the members (TarWriter sorts them)
    assert [ds.schema[n].kind for n in ds.schema.names] == ["image", "label", "str", "bytes", "str"]
    theirs = [s for s in read_with_webdataset(tmp_path / "tars") if s["__key__"] not in skipped]
    assert len(ds) == len(theirs) == n - 2
    for i, s in enumerate(theirs):
        got = ds.fields(i, ["image", "label", "txt", "json", "seg.png"])
        assert got["image"] == s["jpg"]  # stored byte for byte
        assert got["label"] == int(s["cls"]) and got["txt"] == s["txt"].decode()
        assert got["json"] == s["json"].decode() and got["seg.png"] == s["seg.png"]
        v = int(got["txt"].rsplit(" ", 1)[1])  # the caption names the grey its pixels carry
        assert abs(mean_grey(got["image"]) - v) < 2 and abs(mean_grey(got["seg.png"]) - v) < 1
        assert ds.source_path(i) == f"{s['__url__'].rsplit('/', 1)[1]}:{s['__key__']}"
    assert fastload.verify(tmp_path / "out", decode=True).ok


def test_brace_pattern_directory_and_single_tar(tmp_path):
    write_tars(tmp_path / "tars", shards=3, per=2)
    fastload.pack_webdataset(tmp_path / "tars", tmp_path / "a", workers=1, progress=False)
    fastload.pack_webdataset(str(tmp_path / "tars" / "{00000..00002}.tar"), tmp_path / "b", workers=1, progress=False)
    fastload.pack_webdataset(tmp_path / "tars" / "00001.tar", tmp_path / "c", workers=1, progress=False)
    a, b, c = (fastload.Dataset(tmp_path / x) for x in "abc")
    assert len(a) == len(b) == 6 and len(c) == 2
    assert [a.fields(i)["txt"] for i in range(6)] == [b.fields(i)["txt"] for i in range(6)]
    assert [c.fields(i)["txt"] for i in range(2)] == [f"a photo of grey {grey(k)}" for k in (2, 3)]
    with pytest.raises(ConfigError, match=r"2 of its 4 tar files do not exist"):
        fastload.pack_webdataset(str(tmp_path / "tars" / "{00001..00004}.tar"), tmp_path / "d", progress=False)


def test_json_fields_become_typed_fields(tmp_path):
    n = write_tars(tmp_path / "tars", shards=1, per=5)
    fastload.pack_webdataset(tmp_path / "tars", tmp_path / "o", json_fields="grey,ids:int32[],soft", workers=1, progress=False)
    ds = fastload.Dataset(tmp_path / "o")
    assert ds.schema.names == ("image", "label", "grey", "ids", "soft", "seg.png", "txt")
    assert [ds.schema[x].spec for x in ("grey", "ids", "soft")] == ["int", "int32[]", "float32[2]"]
    for k in range(n):
        f = ds.fields(k)
        assert f["grey"] == grey(k) and f["ids"].tolist() == list(range(k % 3 + 1))
        assert np.allclose(f["soft"], [grey(k) / 255, 1.0])


def test_a_json_key_of_another_kind_is_a_skipped_sample(tmp_path):
    root = tmp_path / "tars"
    root.mkdir()
    with wds.TarWriter(str(root / "a.tar")) as w:
        for k in range(4):
            meta = {"score": [0.5, 0.25] if k != 2 else [1.0]}
            w.write({"__key__": f"{k}", "jpg": jpeg(grey(k)), "json": json.dumps(meta)})
    res = fastload.pack_webdataset(root, tmp_path / "o", json_fields="score", workers=1, progress=False)
    assert len(res.skipped) == 1 and res.skipped[0]["path"].endswith("a.tar:2")
    assert "field 'score' (float32[2]) must have shape (2,)" in res.skipped[0]["reason"]
    with pytest.raises(fastload.BadImageError, match="a.tar:2"):
        fastload.pack_webdataset(root, tmp_path / "p", json_fields="score", on_error="fail", workers=1, progress=False)


def test_webdataset_cli_recognises_the_source_and_errors_are_one_line(tmp_path, capsys):
    write_tars(tmp_path / "tars", shards=1, per=3)
    assert main(["pack", str(tmp_path / "tars"), str(tmp_path / "o"), "--no-progress", "--workers", "1"]) == 0
    assert "packed 3 images" in capsys.readouterr().out
    assert fastload.Dataset(tmp_path / "o").schema.names == ("image", "label", "json", "seg.png", "txt")
    (tmp_path / "x.tar.gz").write_bytes(b"")
    for argv, msg in [
        (["pack", str(tmp_path / "x.tar.gz"), str(tmp_path / "p"), "--from", "webdataset"], "a compressed tar"),
        (["pack", str(tmp_path / "tars"), str(tmp_path / "p"), "--image-column", "img"], "--image-column applies to a parquet source"),
        (["pack", str(tmp_path / "tars"), str(tmp_path / "p"), "--json-fields", "nope"], "has no key 'nope'"),
    ]:
        assert main(argv) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err
    assert not (tmp_path / "p").exists()


# ----------------------------------------------------------------------------- Parquet


def parquet_table(first: int, n: int):
    ks = range(first, first + n)
    return pa.table({
        "id": pa.array(list(ks), pa.int64()),
        "jpg": [jpeg(grey(k)) for k in ks],
        "label": pa.array([k % 3 for k in ks], pa.int16()),
        "caption": [f"grey {grey(k)}" for k in ks],
        "emb": pa.array([[grey(k) / 255.0] * 3 for k in ks], pa.list_(pa.float32(), 3)),
        "tokens": pa.array([list(range(k % 4)) for k in ks], pa.list_(pa.int32())),
        "boxes": pa.array([[[0.0, 0.0, float(k), float(k)]] * (k % 3) for k in ks], pa.list_(pa.list_(pa.float32(), 4))),
        "score": pa.array([k / 10 for k in ks], pa.float64()),
        "meta": pa.array([{"k": k} for k in ks]),
    })  # fmt: skip


def test_parquet_files_every_column_and_pixel(tmp_path, caplog):
    root = tmp_path / "pq"
    (root / "part").mkdir(parents=True)
    pq.write_table(parquet_table(0, 7), root / "a.parquet", row_group_size=3)
    pq.write_table(parquet_table(7, 5), root / "part" / "b.parquet", row_group_size=2)
    res = fastload.pack_parquet(root, tmp_path / "o", workers=2, progress=False)
    assert res.num_samples == 12 and not res.skipped
    assert "meta (struct<k: int64>)" in caplog.text  # a column with no kind is named, not dropped in silence
    ds = fastload.Dataset(tmp_path / "o", check=True)
    assert ds.schema.names == ("image", "id", "label", "caption", "emb", "tokens", "boxes", "score")
    assert [ds.schema[x].spec for x in ds.schema.names[1:]] == ["int", "label", "str", "float32[3]", "int32[]", "float32[][4]", "float64"]
    rows = pq.read_table(root / "a.parquet").to_pylist() + pq.read_table(root / "part" / "b.parquet").to_pylist()
    for i, r in enumerate(rows):
        f = ds.fields(i, ["image", "id", "label", "caption", "emb", "tokens", "boxes", "score"])
        assert f["image"] == r["jpg"] and f["id"] == r["id"] == i and f["label"] == r["label"]
        assert f["caption"] == r["caption"] and abs(mean_grey(f["image"]) - int(r["caption"].split()[1])) < 2
        assert f["emb"].tolist() == pytest.approx(r["emb"]) and f["tokens"].tolist() == r["tokens"]
        assert f["boxes"].tolist() == r["boxes"] and f["boxes"].shape == (len(r["boxes"]), 4)
        assert float(f["score"]) == r["score"]
    assert fastload.verify(tmp_path / "o").ok


def test_parquet_image_column_by_type_by_flag_and_paths(tmp_path):
    t = pa.table({"pixels": [jpeg(grey(k)) for k in range(3)], "n": [1, 2, 3]})
    pq.write_table(t, tmp_path / "one.parquet")
    fastload.pack_parquet(tmp_path / "one.parquet", tmp_path / "a", workers=1, progress=False)  # the one binary column
    assert fastload.Dataset(tmp_path / "a").schema.names == ("image", "n")
    t2 = t.append_column("thumb", pa.array([png(1)] * 3))
    pq.write_table(t2, tmp_path / "two.parquet")
    with pytest.raises(ConfigError, match=r"which column holds the images\? name it with --image-column"):
        fastload.pack_parquet(tmp_path / "two.parquet", tmp_path / "b", progress=False)
    fastload.pack_parquet(tmp_path / "two.parquet", tmp_path / "b", image_column="pixels", workers=1, progress=False)
    assert fastload.Dataset(tmp_path / "b").fields(0)["thumb"] == png(1)
    # a column of paths, relative to the file's folder; a null image and a negative label are skipped
    (tmp_path / "imgs").mkdir()
    for k in range(3):
        (tmp_path / "imgs" / f"{k}.jpg").write_bytes(jpeg(grey(k)))
    t3 = pa.table({"image": ["imgs/0.jpg", None, "imgs/2.jpg", "imgs/1.jpg"], "label": [0, 1, -1, 1]})
    pq.write_table(t3, tmp_path / "paths.parquet")
    res = fastload.pack_parquet(tmp_path / "paths.parquet", tmp_path / "c", workers=1, progress=False)
    assert [s["reason"] for s in res.skipped] == ["no image (column 'image' is null)", "label -1 is outside 0..999999; labels are class indices 0, 1, 2, ..."]
    ds = fastload.Dataset(tmp_path / "c")
    assert len(ds) == 2 and abs(mean_grey(ds[1][0]) - grey(1)) < 2 and ds.labels.tolist() == [0, 1]


def test_huggingface_save_to_disk(tmp_path):
    datasets = pytest.importorskip("datasets")
    n = 7
    feats = datasets.Features({
        "image": datasets.Image(), "label": datasets.ClassLabel(names=["cat", "dog", "emu"]), "text": datasets.Value("string"),
        "ids": datasets.Sequence(datasets.Value("int32")),
    })  # fmt: skip
    hf = datasets.Dataset.from_dict(
        {"image": [{"bytes": jpeg(grey(k)), "path": None} for k in range(n)], "label": [k % 3 for k in range(n)],
         "text": [f"grey {grey(k)}" for k in range(n)], "ids": [list(range(k)) for k in range(n)]},
        features=feats,
    )  # fmt: skip
    hf.save_to_disk(str(tmp_path / "hf"))
    assert main(["pack", str(tmp_path / "hf"), str(tmp_path / "o"), "--no-progress", "--workers", "1"]) == 0
    ds = fastload.Dataset(tmp_path / "o")
    assert ds.classes == ["cat", "dog", "emu"]
    back = datasets.load_from_disk(str(tmp_path / "hf")).cast_column("image", datasets.Image(decode=False))
    for i, r in enumerate(back):
        f = ds.fields(i, ["image", "label", "text", "ids"])
        assert f["image"] == r["image"]["bytes"] and f["label"] == r["label"] and f["text"] == r["text"]
        assert f["ids"].tolist() == r["ids"] and abs(mean_grey(f["image"]) - int(r["text"].split()[1])) < 2


def test_parquet_resume_is_identical(tmp_path, monkeypatch):
    pq.write_table(parquet_table(0, 40), tmp_path / "a.parquet", row_group_size=7)
    ref = fastload.pack_parquet(tmp_path / "a.parquet", tmp_path / "ref", shard_size="8KiB", workers=1, progress=False)
    assert ref.num_shards >= 3
    from fastload.packing import convert_parquet

    real = convert_parquet.ParquetSource._task
    calls = {"n": 0}

    def stop(self, *a):
        calls["n"] += 1
        if calls["n"] == 30:
            raise KeyboardInterrupt
        return real(self, *a)

    monkeypatch.setattr(convert_parquet.ParquetSource, "_task", stop)
    with pytest.raises(KeyboardInterrupt):
        fastload.pack_parquet(tmp_path / "a.parquet", tmp_path / "out", shard_size="8KiB", workers=1, progress=False)
    monkeypatch.undo()
    journal = json.loads((tmp_path / "out.partial" / "journal.json").read_text())
    assert 0 < len(journal["shards"]) < ref.num_shards
    fastload.pack_parquet(tmp_path / "a.parquet", tmp_path / "out", shard_size="8KiB", workers=1, progress=False, resume=True)
    names = sorted(os.listdir(tmp_path / "ref"))
    assert sorted(os.listdir(tmp_path / "out")) == names
    for nm in names:
        if nm != "manifest.json":
            assert (tmp_path / "out" / nm).read_bytes() == (tmp_path / "ref" / nm).read_bytes(), nm
    strip = lambda p: {k: v for k, v in json.loads((p / "manifest.json").read_text()).items() if k != "created"}  # noqa: E731
    assert strip(tmp_path / "out") == strip(tmp_path / "ref")


def test_webdataset_resume_is_identical(tmp_path, monkeypatch):
    write_tars(tmp_path / "tars", shards=3, per=12)
    ref = fastload.pack_webdataset(tmp_path / "tars", tmp_path / "ref", shard_size="8KiB", workers=1, progress=False)
    assert ref.num_shards >= 3
    from fastload.packing import convert_wds

    real = convert_wds.WebDatasetSource.task
    calls = {"n": 0}

    def stop(self, i):
        calls["n"] += 1
        if calls["n"] == 25:
            raise KeyboardInterrupt
        return real(self, i)

    monkeypatch.setattr(convert_wds.WebDatasetSource, "task", stop)
    with pytest.raises(KeyboardInterrupt):
        fastload.pack_webdataset(tmp_path / "tars", tmp_path / "out", shard_size="8KiB", workers=1, progress=False)
    monkeypatch.undo()
    assert json.loads((tmp_path / "out.partial" / "journal.json").read_text())["shards"]
    fastload.pack_webdataset(tmp_path / "tars", tmp_path / "out", shard_size="8KiB", workers=1, progress=False, resume=True)
    for nm in sorted(os.listdir(tmp_path / "ref")):
        if nm != "manifest.json":
            assert (tmp_path / "out" / nm).read_bytes() == (tmp_path / "ref" / nm).read_bytes(), nm
    strip = lambda p: {k: v for k, v in json.loads((p / "manifest.json").read_text()).items() if k != "created"}  # noqa: E731
    assert strip(tmp_path / "out") == strip(tmp_path / "ref")


def test_parquet_cli_errors_are_one_line(tmp_path, capsys):
    pq.write_table(parquet_table(0, 3), tmp_path / "a.parquet")
    for argv, msg in [
        (["pack", str(tmp_path / "a.parquet"), str(tmp_path / "p"), "--json-fields", "a"], "--json-fields applies to a webdataset source"),
        (["pack", str(tmp_path / "a.parquet"), str(tmp_path / "p"), "--image-column", "nope"], "'nope' is not a column"),
        (["pack", str(tmp_path / "missing.parquet"), str(tmp_path / "p"), "--from", "parquet"], "no such file or directory"),
    ]:
        assert main(argv) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and msg in err[0], err
    assert not (tmp_path / "p").exists()
