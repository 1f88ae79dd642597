"""pack_ray and pack_spark on a real local Ray (2 CPUs) and a real local Spark (local[2]), against ``fastload pack``.

The expected dataset is always what ``fastload.pack`` (or ``pack_dataset``, for typed fields) makes of
the same images, read back with ``fastload.Dataset``: the same records byte for byte (header, image,
stored name, field block), the same labels, classes and skip reasons, in the input's order. The
failure cases run the driver's commit with tasks written by hand (``write_task``), as an engine's
retried, duplicated or killed attempts would leave them.
"""

from __future__ import annotations

import io
import json
import os
import pickle
import shutil
import signal
import subprocess
import sys
import threading
from pathlib import Path

import lmdb
import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.errors import ConfigError, PackError
from fastload.format import key
from fastload.packing.engines.commit import Layout, pack_with, rekey_shard
from fastload.packing.engines.task import RECEIPT_NAME, write_task
from fastload.packing.shards import ShardWriter

from conftest import paint_folder

ROOT = Path(__file__).resolve().parent.parent
SHARD = "6KB"  # a few images per shard: every task writes several shards


@pytest.fixture(scope="module", autouse=True)
def engine_env():
    """Engine workers import this tree's fastload and run this interpreter (Spark's python workers too)."""
    old = {k: os.environ.get(k) for k in ("PYTHONPATH", "PYSPARK_PYTHON")}
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), *(p for p in [old["PYTHONPATH"]] if p)])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    yield
    for k, v in old.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


@pytest.fixture(autouse=True)
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    """An ImageFolder of 3 classes: solid JPEGs (64x48), one PNG of seeded noise (37x23, converted to
    JPEG by pack), and one file that is no image (skipped, with its reason)."""
    root = paint_folder(tmp_path_factory.mktemp("images"), 3, 5, size=(64, 48), digits=3)
    noise = np.random.default_rng(7).integers(0, 256, (23, 37, 3), dtype=np.uint8)
    Image.fromarray(noise).save(root / "class_1" / "img_zz_noise.png")
    (root / "class_2" / "img_bad.jpg").write_bytes(b"\xff\xd8\xff this is no JPEG")
    return root


@pytest.fixture(scope="module")
def reference(images, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("ref") / "ref"
    fastload.pack(images, out, shard_size=SHARD, workers=1, progress=False)
    return out


def folder_rows(root: Path, *, as_bytes: bool) -> list[dict]:
    """The folder's images in ImageFolder order as rows: image (bytes or absolute path), label, path (the name pack stores)."""
    classes = sorted(d.name for d in root.iterdir() if d.is_dir())
    rows = []
    for label, c in enumerate(classes):
        for f in sorted((root / c).iterdir()):
            rows.append({"image": f.read_bytes() if as_bytes else str(f), "label": label, "path": f"{c}/{f.name}"})
    return rows


def assert_same_dataset(got: Path | str, want: Path | str, **open_kw) -> None:
    """Both read with fastload.Dataset: the same records, labels, classes, fields and skip reasons."""
    a, b = fastload.Dataset(got, **open_kw), fastload.Dataset(want)
    assert len(a) == len(b) > 0
    assert a.classes == b.classes
    assert np.array_equal(a.labels, b.labels)
    assert a.manifest.fields == b.manifest.fields
    for i in range(len(b)):
        assert a.raw(i)[:2] == b.raw(i)[:2], f"sample {i}"
        assert a.fields(i).keys() == b.fields(i).keys()
        for k, v in b.fields(i).items():
            assert np.array_equal(np.asarray(a.fields(i)[k]), np.asarray(v)), (i, k)
    assert [(Path(s["path"]).name, s["reason"]) for s in a.manifest.skipped] == [
        (Path(s["path"]).name, s["reason"]) for s in b.manifest.skipped
    ]
    if not open_kw:
        assert fastload.verify(got).problems == []


# ---------------------------------------------------------------------------- engines


@pytest.fixture(scope="module")
def ray_session(engine_env):
    ray = pytest.importorskip("ray")
    pytest.importorskip("ray.data")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    yield ray
    ray.shutdown()


@pytest.fixture(scope="module")
def spark(engine_env):
    pytest.importorskip("pyspark")
    if shutil.which("java") is None:
        pytest.skip("Spark needs a Java runtime (openjdk-17-jre-headless)")
    from pyspark.sql import SparkSession

    s = (SparkSession.builder.master("local[2]").appName("fastload-tests").config("spark.ui.enabled", "false")
         .config("spark.sql.shuffle.partitions", "2").config("spark.task.maxFailures", "2").getOrCreate())  # fmt: skip
    s.sparkContext.setLogLevel("ERROR")
    yield s
    s.stop()


def spark_frame(spark, rows: list[dict], parts: int):
    """A DataFrame of ``rows`` in ``parts`` partitions, in order (parallelize slices a list in order)."""
    tuples = [(r["image"], r["label"], r["path"]) for r in rows]
    return spark.sparkContext.parallelize(tuples, parts).toDF("image binary, label long, path string")


def test_ray_packs_what_fastload_pack_packs(ray_session, images, reference, tmp_path):
    ds = ray_session.data.from_items(folder_rows(images, as_bytes=False), override_num_blocks=3)
    res = fastload.pack_ray(ds, tmp_path / "out", classes=["class_0", "class_1", "class_2"], shard_size=SHARD)
    assert res.num_samples == 16 and len(res.skipped) == 1
    assert_same_dataset(tmp_path / "out", reference)
    assert not (tmp_path / "out.engine").exists() and not (tmp_path / "out.partial").exists()


def test_spark_packs_what_fastload_pack_packs(spark, images, reference, tmp_path):
    df = spark_frame(spark, folder_rows(images, as_bytes=True), 3)
    res = fastload.pack_spark(df, tmp_path / "out", classes=["class_0", "class_1", "class_2"], shard_size=SHARD)
    assert res.num_shards > 3
    assert_same_dataset(tmp_path / "out", reference)
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["options"]["engine"] == "spark"


def typed_rows(n: int = 9) -> list[dict]:
    rng = np.random.default_rng(3)
    rows = []
    for i in range(n):
        a = rng.integers(0, 256, (20 + i, 33, 3), dtype=np.uint8)
        b = io.BytesIO()
        Image.fromarray(a).save(b, "PNG")
        rows.append({"image": b.getvalue(), "label": i % 2, "caption": f"sample {i} " * (i % 3), "score": float(i) / 4})
    return rows


def test_spark_typed_fields_are_those_of_pack_dataset(spark, tmp_path):
    rows = typed_rows()
    want = tmp_path / "want"
    fastload.pack_dataset(rows, want, fields={"score": "float64"}, shard_size=SHARD, workers=1, progress=False)
    import pandas as pd

    df = spark.createDataFrame(pd.DataFrame(rows), schema="image binary, label long, caption string, score double").coalesce(2)
    fastload.pack_spark(df, tmp_path / "got", fields={"score": "float64"}, shard_size=SHARD)
    assert [f.spec for f in fastload.Dataset(tmp_path / "got").schema] == ["image", "label", "str", "float64"]
    # the records' stored names: pack_dataset's are dataset[i], an engine's name the task and row
    a, b = fastload.Dataset(tmp_path / "got"), fastload.Dataset(want)
    for i in range(len(rows)):
        (ha, pa), (hb, pb) = a.record(i), b.record(i)
        assert pa == pb and ha._replace(path_len=0) == hb._replace(path_len=0)
        assert {k: v for k, v in a.fields(i).items()} == b.fields(i)
    assert a.manifest.stats == b.manifest.stats


def test_ray_skips_an_unreadable_image_naming_it_and_fails_with_on_error_fail(ray_session, images, tmp_path):
    rows = folder_rows(images, as_bytes=False)[:4]
    gone = str(images / "class_0" / "no_such.jpg")
    rows[2] = {"image": gone, "label": 0, "path": "class_0/no_such.jpg"}
    ds = ray_session.data.from_items(rows, override_num_blocks=2)
    res = fastload.pack_ray(ds, tmp_path / "out", shard_size=SHARD)
    assert res.skipped == [{"path": "class_0/no_such.jpg", "reason": "unreadable (No such file or directory)"}]
    assert fastload.Dataset(tmp_path / "out").source_path(2) == "class_0/img_003.jpg"
    with pytest.raises(Exception, match="class_0/no_such.jpg: unreadable"):
        fastload.pack_ray(ds, tmp_path / "out2", shard_size=SHARD, on_error="fail")


# ---------------------------------------------------------------------------- the commit's failure cases


def fake_engine(chunks: list[list[dict]], *, twice: tuple[int, ...] = ()):
    """A ``run`` that writes the tasks here, in order; the tasks in ``twice`` run twice (a duplicated attempt)."""

    def run(spec):
        receipts = [write_task(rows, i, spec) for i, rows in enumerate(chunks)]
        receipts += [write_task(chunks[i], i, spec) for i in twice]
        return receipts, len(chunks)

    return run


def engine_pack(out: Path, chunks: list[list[dict]], engine: str = "spark", run=None, **options):
    first = chunks[0][0]
    return pack_with(engine, first, out, run=run or fake_engine(chunks), parallel_map=lambda fn, xs: [fn(x) for x in xs],
                     image_column=None, path_column=None, classes=["class_0", "class_1", "class_2"], fields=None,
                     options={"shard_size": SHARD, "progress": False, **options})  # fmt: skip


def split(rows: list, sizes: list[int]) -> list[list]:
    out, at = [], 0
    for n in sizes:
        out.append(rows[at : at + n])
        at += n
    return out


def test_a_duplicated_task_contributes_once(images, reference, tmp_path):
    chunks = split(folder_rows(images, as_bytes=True), [6, 5, 6])
    engine_pack(tmp_path / "out", chunks, run=fake_engine(chunks, twice=(1, 1)))
    assert_same_dataset(tmp_path / "out", reference)


def test_a_task_without_a_finished_attempt_is_never_committed(images, tmp_path):
    chunks = split(folder_rows(images, as_bytes=True), [6, 5, 6])

    def run(spec):
        receipts, n = fake_engine(chunks)(spec)
        return [r for r in receipts if r["index"] != 1], n  # task 1's receipt never came back

    with pytest.raises(PackError, match="task 1 of 3 left no finished attempt"):
        engine_pack(tmp_path / "out", chunks, run=run)
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial" / "manifest.json").exists()


_KILLED_RUN = """
import os, pathlib, pickle, signal, sys
sys.path.insert(0, {root!r}); sys.path.insert(0, {tests!r})
import test_engines
from fastload.packing.shards import ShardWriter
chunks = pickle.load(open({chunks!r}, "rb"))
state = {{"index": -1}}
real_write, real_add = test_engines.write_task, ShardWriter.add
def tracking(rows, index, spec):
    state["index"] = index
    return real_write(rows, index, spec)
def add_then_die(self, value, position):
    if state["index"] == 1 and self.shard >= 1:  # task 1 has finished its first shard and begun its second: kill -9
        self.wait()
        os.kill(os.getpid(), signal.SIGKILL)
    return real_add(self, value, position)
test_engines.write_task, ShardWriter.add = tracking, add_then_die
test_engines.engine_pack(pathlib.Path({out!r}), chunks, engine="spark")
"""


def partition_sizes(df) -> list[int]:
    return df.rdd.mapPartitions(lambda it: [sum(1 for _ in it)]).collect()


def test_a_task_killed_mid_shard_leaves_nothing_the_manifest_names_and_the_rerun_resumes(spark, images, reference, tmp_path):
    rows = folder_rows(images, as_bytes=True)
    df = spark_frame(spark, rows, 3)
    chunks = split(rows, partition_sizes(df))
    (tmp_path / "chunks.pkl").write_bytes(pickle.dumps(chunks))
    out = tmp_path / "out"
    code = _KILLED_RUN.format(root=str(ROOT), tests=str(ROOT / "tests"), chunks=str(tmp_path / "chunks.pkl"), out=str(out))
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert p.returncode == -signal.SIGKILL, p.stderr
    tasks = Layout.of(out).tasks
    attempts = {d.name: d for d in tasks.iterdir()}
    done = [d for d in attempts.values() if (d / RECEIPT_NAME).exists()]
    killed = [d for d in attempts.values() if not (d / RECEIPT_NAME).exists()]
    assert [d.name[:11] for d in done] == ["t000000000-"] and [d.name[:11] for d in killed] == ["t000000001-"]
    assert (killed[0] / "shard-00000.lmdb").exists() and (killed[0] / "shard-00001.lmdb.tmp").exists()
    kept = {(d / f).stat().st_ino for d in done for f in os.listdir(d) if f.endswith(".lmdb")}
    dead = {(killed[0] / f).stat().st_ino for f in os.listdir(killed[0])}
    with pytest.raises(ConfigError, match="holds an unfinished pack; continue it with resume=True"):
        fastload.pack_spark(df, out, classes=["class_0", "class_1", "class_2"], shard_size=SHARD)
    with pytest.raises(ConfigError, match="started with other options"):
        fastload.pack_spark(df, out, classes=["class_0", "class_1", "class_2"], shard_size="7KB", resume=True)
    fastload.pack_spark(df, out, classes=["class_0", "class_1", "class_2"], shard_size=SHARD, resume=True)
    assert_same_dataset(out, reference)
    published = {(out / s.file).stat().st_ino for s in fastload.Dataset(out).shards}
    assert kept and kept <= published  # task 0's shards were reused (verified by hash), not written again
    assert not published & dead
    assert not Layout.of(out).engine_dir.exists()


def test_two_racing_packs_of_one_out_cannot_both_publish(images, tmp_path):
    chunks = split(folder_rows(images, as_bytes=True), [8, 9])
    out, second_done, errors = tmp_path / "out", threading.Event(), []

    def slow(spec):
        assert second_done.wait(60)
        return fake_engine(chunks)(spec)

    def first():
        try:
            engine_pack(out, chunks, run=slow)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    t = threading.Thread(target=first)
    t.start()
    try:
        for _ in range(200):
            if Layout.of(out).engine_dir.exists():
                break
            threading.Event().wait(0.05)
        with pytest.raises(ConfigError, match="is being written by process"):
            engine_pack(out, chunks)
    finally:
        second_done.set()
        t.join(120)
    assert errors == [] and fastload.Dataset(out).manifest.num_samples == 16
    with pytest.raises(ConfigError, match="already exists"):
        engine_pack(out, chunks)


def test_rekey_moves_every_key_and_nothing_else(tmp_path):
    """Keys of a shard of many small records (a B-tree with branch pages) and some large ones (overflow pages)."""
    rng = np.random.default_rng(0)
    values = [bytes(rng.integers(0, 256, 3000 if i % 50 == 0 else 30, dtype=np.uint8)) for i in range(900)]
    w = ShardWriter(tmp_path, shard_size=1 << 30)
    for i, v in enumerate(values):
        w.add(v, i)
    w.close(len(values))
    path = tmp_path / w.done[0].file
    size, sha = rekey_shard((str(path), 123_456_789))
    assert rekey_shard((str(path), 123_456_789)) == (size, sha)  # idempotent
    env = lmdb.open(str(path), subdir=False, readonly=True, lock=False)
    with env.begin() as txn:
        got = list(txn.cursor())
    assert env.stat()["depth"] >= 2
    env.close()
    assert got == [(key(123_456_789 + i), v) for i, v in enumerate(values)]


# ---------------------------------------------------------------------------- heavier: object store, many tasks


@pytest.mark.slow
def test_spark_packs_to_an_s3_prefix(spark, s3, images, reference, tmp_path):
    bucket = s3.make_bucket()
    df = spark_frame(spark, folder_rows(images, as_bytes=True), 3)
    url = f"s3://{bucket}/train"
    fastload.pack_spark(df, url, classes=["class_0", "class_1", "class_2"], shard_size=SHARD, storage_options=s3.options())
    assert_same_dataset(url, reference, storage_options=s3.options())


@pytest.mark.slow
def test_ray_packs_to_an_s3_prefix_and_many_blocks(ray_session, s3, images, reference, tmp_path):
    bucket = s3.make_bucket()
    ds = ray_session.data.from_items(folder_rows(images, as_bytes=True), override_num_blocks=8)
    url = f"s3://{bucket}/train"
    fastload.pack_ray(ds, url, classes=["class_0", "class_1", "class_2"], shard_size=SHARD, storage_options=s3.options())
    assert_same_dataset(url, reference, storage_options=s3.options())


def test_resume_never_deletes_an_unfinished_pack_of_another_kind(images, tmp_path):
    partial = tmp_path / "out.partial"
    partial.mkdir()
    journal = partial / "journal.json"
    journal.write_text(json.dumps({"format": "fastload-journal", "version": 1}))
    chunks = split(folder_rows(images, as_bytes=True), [8, 9])
    with pytest.raises(ConfigError, match="not an unfinished pack_ray/pack_spark pack"):
        engine_pack(tmp_path / "out", chunks, resume=True)
    assert journal.exists()
    engine_pack(tmp_path / "out", chunks, overwrite=True)  # replaced only when asked
    assert fastload.Dataset(tmp_path / "out").manifest.num_samples == 16 and not partial.exists()
