#!/usr/bin/env python
"""Packing throughput of Ray Data (2 CPUs) and Spark (local[2]) beside ``fastload pack --workers 2``, and the commit's cost.

On the same ImageFolder of JPEGs (:func:`fastload.make_sample`, ``--images`` of them, default
20,000 as in issue 40; or ``--src`` a folder), page cache warm (every file read once first):

* **pack**: ``fastload.pack(src, out, workers=2)``;
* **ray**: ``fastload.pack_ray`` of ``ray.data.from_items`` rows (image = the file's path, read by
  the workers; label; path) in ``--tasks`` blocks, on ``ray.init(num_cpus=2)``;
* **inline**: the same task writer and commit with the tasks run one after another in this
  process (no engine): one task's rate, what each engine worker does;
* **spark**: ``fastload.pack_spark`` of a DataFrame of the same rows in ``--tasks`` partitions on
  ``local[2]``.

Each is wall time from the call to the published dataset (engine start-up excluded, the
commit included), ``--repeats`` times, interleaved; the median images/s is reported. Every
result is checked: the same labels as ``pack``'s.

The **commit** alone (what grows with the number of shards on the driver): a manifest of
``--fake-shards`` (default 10**5) shard entries built, validated, written (fsync) and read
back, which is the driver's part of a commit of that many shards; moving keys and hashing
(``rekey_shard``) runs on the engine's workers, per shard, and is timed here per MB.

Writes ``benchmarks/results/pack-engines-<machine>.json`` and ``.md``::

    .venv/bin/python benchmarks/bench_pack_engines.py --images 2000 --repeats 1   # a small run
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import fastload  # noqa: E402
from fastload.format import Manifest, ShardInfo  # noqa: E402
from fastload.packing.engines.commit import rekey_shard  # noqa: E402
from fastload.packing.journal import atomic_write  # noqa: E402

log = logging.getLogger("bench_pack_engines")


def rows_of(src: Path) -> tuple[list[dict], list[str]]:
    classes = sorted(d.name for d in src.iterdir() if d.is_dir())
    rows = [{"image": str(f), "label": k, "path": f"{c}/{f.name}"} for k, c in enumerate(classes) for f in sorted((src / c).iterdir())]
    return rows, classes


def warm(rows: list[dict]) -> int:
    return sum(len(Path(r["image"]).read_bytes()) for r in rows)


def timed(fn, out: Path) -> float:
    shutil.rmtree(out, ignore_errors=True)
    os.sync()
    t0 = time.perf_counter()
    fn(out)
    return time.perf_counter() - t0


def commit_cost(n: int, tmp: Path) -> dict:
    """The driver's part of committing ``n`` shards: the manifest built, validated, written and read."""
    t0 = time.perf_counter()
    shards = [ShardInfo(f"shard-{i:05d}.lmdb", 100 * i, 100, 11_000_000, "ab" * 32) for i in range(n)]
    m = Manifest(num_samples=100 * n, classes=["a"], class_counts=[100 * n], shards=shards, labels_sha256="0" * 64)
    m.validate()
    atomic_write(tmp / "manifest.json", m.dumps().encode())
    t1 = time.perf_counter()
    Manifest.loads((tmp / "manifest.json").read_bytes())
    t2 = time.perf_counter()
    return {"shards": n, "write_s": t1 - t0, "read_s": t2 - t1, "manifest_bytes": (tmp / "manifest.json").stat().st_size}


def rekey_cost(dataset: Path) -> dict:
    """``rekey_shard`` (keys moved by 10**6, then SHA-256) of every shard of a copy of ``dataset``."""
    files = [dataset / s.file for s in fastload.Dataset(dataset).shards]
    t0, nbytes = time.perf_counter(), 0
    for k, f in enumerate(files):
        nbytes += rekey_shard((str(f), 10**6 + 10 * k))[0]
    dt = time.perf_counter() - t0
    return {"shards": len(files), "bytes": nbytes, "seconds": dt, "mb_per_s": nbytes / dt / 1e6}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=20_000)
    ap.add_argument("--src", type=Path, help="an ImageFolder to pack (default: a sample made in a temp dir)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--tasks", type=int, default=8, help="Ray blocks / Spark partitions")
    ap.add_argument("--shard-size", default="256MB")
    ap.add_argument("--fake-shards", type=int, default=100_000)
    ap.add_argument("--steps", default="pack,inline,ray,spark")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tmp = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    os.environ["PYTHONPATH"] = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    os.environ["PYSPARK_PYTHON"] = sys.executable
    try:
        src = args.src or fastload.make_sample(tmp / "src", num_images=args.images)
        rows, classes = rows_of(Path(src))
        total = warm(rows)
        log.info("%d images, %.1f MB", len(rows), total / 1e6)
        steps, runs = args.steps.split(","), {}
        opts = {"shard_size": args.shard_size}
        fns = {"pack": lambda out: fastload.pack(src, out, workers=2, progress=False, **opts)}
        stop = []
        if "inline" in steps:  # the same task writer and commit, the tasks one after another in this process: the per-task rate
            from fastload.packing.engines.commit import local_map, pack_with
            from fastload.packing.engines.task import write_task

            chunks = [rows[k * len(rows) // args.tasks : (k + 1) * len(rows) // args.tasks] for k in range(args.tasks)]

            def run(spec):
                return [write_task(c, k, spec) for k, c in enumerate(chunks)], len(chunks)

            fns["inline"] = lambda out: pack_with("inline", rows[0], out, run=run, parallel_map=local_map, image_column=None,
                                                  path_column=None, classes=classes, fields=None, options={**opts, "progress": False})  # fmt: skip
        if "ray" in steps:
            import ray

            ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False)
            ds = ray.data.from_items(rows, override_num_blocks=args.tasks)
            fns["ray"] = lambda out: fastload.pack_ray(ds, out, classes=classes, **opts)
            stop.append(ray.shutdown)
        if "spark" in steps:
            from pyspark.sql import SparkSession

            spark = SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false").getOrCreate()
            spark.sparkContext.setLogLevel("ERROR")
            df = spark.sparkContext.parallelize([(r["image"], r["label"], r["path"]) for r in rows], args.tasks).toDF(
                "image string, label long, path string")  # fmt: skip
            fns["spark"] = lambda out: fastload.pack_spark(df, out, classes=classes, **opts)
            stop.append(spark.stop)
        want = None
        for rep in range(args.repeats):
            for name in steps:
                dt = timed(fns[name], tmp / name)
                runs.setdefault(name, []).append(dt)
                labels = fastload.Dataset(tmp / name).labels
                want = labels if want is None else want
                assert np.array_equal(labels, want), f"{name}: other labels than the first step's"
                log.info("repeat %d %-5s %.2f s  %.0f images/s", rep, name, dt, len(labels) / dt)
        rk = rekey_cost(tmp / steps[0])
        cc = commit_cost(args.fake_shards, tmp)
        for s in stop:
            s()
        res = {
            "machine": platform.node(), "cpus": os.cpu_count(), "images": len(rows), "bytes": total, "tasks": args.tasks,
            "shard_size": args.shard_size, "seconds": runs,
            "images_per_s": {k: len(rows) / statistics.median(v) for k, v in runs.items()}, "rekey": rk, "commit": cc,
        }  # fmt: skip
        out = ROOT / "benchmarks" / "results" / f"pack-engines-{platform.node()}"
        out.with_suffix(".json").write_text(json.dumps(res, indent=1) + "\n")
        md = [f"# Packing with engines: {len(rows)} JPEGs ({total / 1e6:.0f} MB), {args.tasks} tasks, {os.cpu_count()} CPUs", "",
              "| step | median s | images/s |", "|---|---:|---:|"]  # fmt: skip
        md += [f"| {k} | {statistics.median(v):.2f} | {len(rows) / statistics.median(v):,.0f} |" for k, v in runs.items()]
        md += ["", f"rekey + SHA-256 on a worker: {rk['mb_per_s']:,.0f} MB/s ({rk['shards']} shards)",
               f"commit bookkeeping of {cc['shards']:,} shards: manifest built+validated+written {cc['write_s']:.2f} s, "
               f"read back {cc['read_s']:.2f} s, {cc['manifest_bytes'] / 1e6:.1f} MB"]  # fmt: skip
        out.with_suffix(".md").write_text("\n".join(md) + "\n")
        log.info("%s", "\n".join(md))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
