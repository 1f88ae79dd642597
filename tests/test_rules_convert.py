"""Rules of the pack sources: WebDataset grouping per tar, resumes equal to one run, a changed source refused, image columns."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import webdataset as wds
from PIL import Image

import fastload
from fastload.errors import ConfigError
from fastload.packing import run as pack_run
from fastload.packing.convert_parquet import ParquetSource
from fastload.packing.convert_wds import WebDatasetSource
from coco_fixture import write_coco
from conftest import paint_folder


def jpeg(k: int, size=(24, 16)) -> bytes:
    rng = np.random.default_rng(k)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 255, (size[1], size[0], 3), dtype=np.uint8)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


def write_tar(path: Path, keys: list[str], first: int) -> None:
    with wds.TarWriter(str(path)) as w:
        for j, key in enumerate(keys):
            w.write({"__key__": key, "jpg": jpeg(first + j), "cls": str((first + j) % 3), "txt": f"sample {first + j}"})


# tars as lists of keys: two tars numbering from 000000; the same key at the end of one tar and the
# start of the next; a key whose members are split across two tars
TAR_LAYOUTS = [
    [["000000", "000001", "000002"], ["000000", "000001"]],
    [["a", "b", "x"], ["x", "c"]],
    [["000000"], ["000000"], ["000000"]],
]


@pytest.mark.parametrize("layout", TAR_LAYOUTS)
def test_webdataset_members_are_grouped_per_tar_as_webdataset_groups_them(tmp_path, layout):
    """webdataset's group_by_keys starts a new sample when the key changes or the tar (``__url__``)
    does, so two tars numbering their samples from 000000 give every sample of both. Bug: the
    current sample carried over from one tar to the next, so a tar's first sample is merged into
    the previous tar's last one when their keys agree (a sample lost, its members overwritten).
    Expected: webdataset.WebDataset's own reading, sample by sample."""
    paths, first = [], 0
    for t, keys in enumerate(layout):
        paths.append(tmp_path / f"part{t}.tar")
        write_tar(paths[-1], keys, first)
        first += len(keys)
    want = list(wds.WebDataset([str(p) for p in paths], shardshuffle=False))
    src = WebDatasetSource(tmp_path)
    assert len(src) == len(want) == first
    for i, w in enumerate(want):
        kind, data, label, name, _where = src.task(i)
        assert kind == "bytes" and data == w["jpg"] and label == int(w["cls"])
        assert name == f"{os.path.basename(w['__url__'])}:{w['__key__']}"
    src.close()


def test_a_webdataset_resume_after_a_tar_was_rewritten_is_refused(tmp_path, monkeypatch):
    """Rule: a resume packs the rest of the same source; a tar rewritten since (same names, same
    size, other bytes) is another source, so the resume is refused naming the change. Bug: the
    fingerprint of the tars by name and size only. The rewrite keeps the size (bytes changed in
    place) and the pack would otherwise mix two versions of the tar."""
    tars = tmp_path / "tars"
    tars.mkdir()
    write_tar(tars / "a.tar", [f"{k:06d}" for k in range(12)], 0)
    interrupt_after(monkeypatch, 5)
    with pytest.raises(KeyboardInterrupt):
        fastload.pack_webdataset(tars, tmp_path / "out", shard_size="8KiB", workers=1, progress=False)
    monkeypatch.undo()
    data = bytearray((tars / "a.tar").read_bytes())
    st = os.stat(tars / "a.tar")
    k = data.index(b"sample 11")
    data[k : k + 9] = b"sample 99"
    (tars / "a.tar").write_bytes(bytes(data))
    os.utime(tars / "a.tar", ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    assert os.path.getsize(tars / "a.tar") == st.st_size
    with pytest.raises(ConfigError, match="the source changed since it was started"):
        fastload.pack_webdataset(tars, tmp_path / "out", shard_size="8KiB", workers=1, progress=False, resume=True)


def interrupt_after(monkeypatch, n: int) -> None:
    """The pack run stops (Ctrl-C) when it asks its source for task ``n``, whatever the source."""
    real = pack_run.Results

    def cut(tasks):
        for k, t in enumerate(tasks):
            if k == n:
                raise KeyboardInterrupt
            yield t

    monkeypatch.setattr(pack_run, "Results", lambda tasks, *a, **kw: real(cut(tasks), *a, **kw))


def parquet_rows(first: int, n: int) -> pa.Table:
    ks = range(first, first + n)
    return pa.table({"image": [jpeg(k) for k in ks], "label": pa.array([k % 3 for k in ks], pa.int64()),
                     "caption": [f"row {k}" for k in ks], "tokens": pa.array([list(range(k % 5)) for k in ks], pa.list_(pa.int32()))})  # fmt: skip


def make_source(kind: str, root: Path):
    """(the pack function, its source argument, extra arguments) for each source kind."""
    if kind == "folder":
        return fastload.pack, paint_folder(root / "src", classes=3, per_class=8, size=(40, 30)), {}
    if kind == "webdataset":
        (root / "tars").mkdir()
        write_tar(root / "tars" / "a.tar", [f"{k:06d}" for k in range(13)], 0)
        write_tar(root / "tars" / "b.tar", [f"{k:06d}" for k in range(11)], 13)
        return fastload.pack_webdataset, root / "tars", {}
    if kind == "parquet file":
        pq.write_table(parquet_rows(0, 24), root / "a.parquet", row_group_size=5)
        return fastload.pack_parquet, root / "a.parquet", {}
    if kind == "parquet directory":
        (root / "pq" / "sub").mkdir(parents=True)
        pq.write_table(parquet_rows(0, 9), root / "pq" / "a.parquet", row_group_size=4)
        pq.write_table(parquet_rows(9, 8), root / "pq" / "b.parquet", row_group_size=3)
        pq.write_table(parquet_rows(17, 7), root / "pq" / "sub" / "c.parquet")
        return fastload.pack_parquet, root / "pq", {}
    if kind == "coco":
        images, annotations, _ = write_coco(root)
        return fastload.pack_coco, images, {"annotations": annotations, "masks": "instance"}
    raise AssertionError(kind)


def packed_files(out: Path) -> dict[str, bytes]:
    files = {n: (out / n).read_bytes() for n in sorted(os.listdir(out)) if n != "manifest.json"}
    manifest = json.loads((out / "manifest.json").read_text())
    manifest.pop("created", None)
    files["manifest.json"] = json.dumps(manifest, sort_keys=True).encode()
    return files


@pytest.mark.parametrize("cut", ["early", "late"])
@pytest.mark.parametrize("kind", ["folder", "webdataset", "parquet file", "parquet directory", "coco"])
def test_an_interrupted_then_resumed_pack_equals_an_uninterrupted_one(tmp_path, monkeypatch, kind, cut):
    """Scenario, for every source kind: a pack stopped (Ctrl-C) at its fourth task or its
    last but one and resumed gives
    the very files (shards byte for byte, labels, manifest but its date) of a pack never stopped.
    Bugs: a resume that restarts a source at the wrong row (a Parquet directory's second file, a
    tar's first member), counts the kept shards' samples again, or loses the field statistics."""
    fn, src, extra = make_source(kind, tmp_path)
    opts = dict(shard_size="8KiB", workers=1, progress=False, **extra)
    total = fn(src, tmp_path / "ref", **opts).num_samples
    interrupt_after(monkeypatch, 3 if cut == "early" else total - 2)
    with pytest.raises(KeyboardInterrupt):
        fn(src, tmp_path / "out", **opts)
    monkeypatch.undo()
    journal = json.loads((tmp_path / "out.partial" / "journal.json").read_text())
    assert journal["shards"], "the interruption came before a shard was finished: nothing to resume"
    fn(src, tmp_path / "out", resume=True, **opts)
    want, got = packed_files(tmp_path / "ref"), packed_files(tmp_path / "out")
    assert list(got) == list(want)
    for name in want:
        assert got[name] == want[name], name


# (column names and types; the image column the docs name: ``image``, ``img``, ``jpg``, ``jpeg``,
# ``png`` or ``webp``, case-insensitive, else the one binary column)
COLUMNS = [
    ({"Image": "binary", "label": "int"}, "Image"),
    ({"caption": "str", "JPEG": "binary"}, "JPEG"),
    ({"WebP": "binary", "extra": "binary"}, "WebP"),
    ({"IMG": "binary"}, "IMG"),
    ({"photo": "binary", "label": "int"}, "photo"),
    ({"PNG": "binary", "label": "int", "caption": "str"}, "PNG"),
]


@pytest.mark.parametrize("columns,expected", COLUMNS)
def test_the_image_column_is_found_by_name_case_insensitively_then_by_type(tmp_path, columns, expected):
    """Bug: the names compared as written (``Image`` or ``JPEG``, as Hugging Face exports often
    spell them, not found: the pack then asks which column, or takes another binary column).
    Expected: the documented rule (docs/fields.md) written in the table."""
    arrays = {}
    for name, kind in columns.items():
        arrays[name] = {"binary": pa.array([jpeg(k) for k in range(3)], pa.binary()), "int": pa.array([0, 1, 2], pa.int64()),
                        "str": pa.array(["a", "b", "c"])}[kind]  # fmt: skip
    pq.write_table(pa.table(arrays), tmp_path / "t.parquet")
    assert ParquetSource(tmp_path / "t.parquet").image_column == expected
