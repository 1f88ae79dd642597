#!/usr/bin/env python
"""Pack and read throughput of fastload, beside the floor measured in the same run.

Measured on the built-in sample dataset (3,000 ImageNet-like JPEGs of about 100 KB,
made with :func:`fastload.make_sample` unless ``--images`` points at a folder),
with the page cache warm (every source file is read once first) and earlier runs'
writes flushed before each timed run (``os.sync()``, untimed), each figure the median
of ``--repeats`` runs, the repeats interleaved so drift hits all alike:

* **copy** (the floor): ``shutil.copyfile`` of every file into a fresh directory on
  the same disk that ``pack`` writes to; also **copy+sync** (the same, then
  ``os.sync()``), since ``pack`` fsyncs its shards and directories before returning.
* **concat+fsync**: every file appended to one new file, fsynced once: the least
  any packer that writes one durable file must do.
* **pack**: ``fastload.pack(src, out, workers=N)`` (JPEGs stored byte for byte) for
  N = 1 and N = all cores. Target: images/s >= 50% of the copy rate.
* **read**: ``fastload.Dataset``: ``ds[i]`` for a random permutation of all indices in
  one process (target >= 100,000 samples/s), sequentially, and randomly with
  ``check=True`` (CRC-32 of each payload, what FastLoader does).

Writes ``benchmarks/results/pack-<machine>.json`` and ``.md``::

    .venv/bin/python benchmarks/bench_pack.py                       # temp sample, removed after
    .venv/bin/python benchmarks/bench_pack.py --images data/sample-images   # reuse / create it
"""

from __future__ import annotations

import argparse
import cProfile
import importlib.metadata as md
import io
import json
import logging
import math
import os
import platform
import pstats
import re
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

log = logging.getLogger("bench_pack")

PACK_TARGET = 0.5  # pack images/s over copy images/s
READ_TARGET = 100_000  # random reads per second, one process


# ----------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _ram_gb() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 1024**2, 1)
    except OSError:
        pass
    return None


def _filesystem(path: Path) -> str:
    """Filesystem type of the mount holding ``path`` (from /proc/mounts)."""
    try:
        best, fstype = "", "?"
        p = str(path.resolve())
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and (p == parts[1] or p.startswith(parts[1].rstrip("/") + "/")) and len(parts[1]) > len(best):
                best, fstype = parts[1], parts[2]
        return f"{fstype} on {best}" if best else fstype
    except OSError:
        return "?"


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def machine_info(work: Path) -> dict:
    import PIL

    cores = os.cpu_count() or 1
    usage = shutil.disk_usage(work)
    return {
        "cpu": _cpu_model(),
        "cores": cores,
        "ram_gb": _ram_gb(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "fastload": fastload.__version__,
        "torch": _version("torch"),
        "pillow": PIL.__version__ + (" (pillow-simd)" if _version("pillow-simd") else ""),
        "lmdb": _version("lmdb"),
        "numpy": np.__version__,
        "work_dir": str(work.parent),
        "work_dir_fs": _filesystem(work),
        "disk_free_gb": round(usage.free / 1e9, 1),
        "disk_total_gb": round(usage.total / 1e9, 1),
    }


def machine_slug(info: dict) -> str:
    cpu = re.sub(r"\(r\)|\(tm\)|cpu|@.*$|processor", "", info["cpu"].lower())
    cpu = re.sub(r"[^a-z0-9]+", "-", cpu).strip("-")
    return f"{info['cores']}cpu-{cpu}"[:60].strip("-") or "unknown"


# ----------------------------------------------------------------------------- measurements


def _files(src: Path) -> list[Path]:
    return sorted(p for p in src.rglob("*") if p.is_file() and not p.name.startswith("."))


def warm(files: list[Path]) -> int:
    total = 0
    for p in files:
        with open(p, "rb") as f:
            total += len(f.read())
    return total


def settle() -> None:
    """Flush earlier runs' dirty pages (untimed) so their writeback does not throttle the next run."""
    os.sync()


def run_copy(src: Path, files: list[Path], dest: Path, *, sync: bool) -> float:
    """Seconds to copy every file of ``src`` into ``dest`` (then ``os.sync()`` if ``sync``)."""
    settle()
    t0 = time.perf_counter()
    made: set[Path] = set()
    for p in files:
        target = dest / p.relative_to(src)
        if target.parent not in made:
            target.parent.mkdir(parents=True, exist_ok=True)
            made.add(target.parent)
        shutil.copyfile(p, target)
    if sync:
        os.sync()
    return time.perf_counter() - t0


def run_concat(files: list[Path], dest: Path) -> float:
    """Seconds to append every file to one new file on the same disk, then fsync it.

    What any single-file packer must do at least (pack also fsyncs its shards).
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    settle()
    t0 = time.perf_counter()
    with open(dest, "wb") as out:
        for p in files:
            with open(p, "rb") as f:
                out.write(f.read())
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - t0


def run_pack(src: Path, out: Path, workers: int, expect: int) -> tuple[float, dict]:
    settle()
    t0 = time.perf_counter()
    r = fastload.pack(src, out, workers=workers, overwrite=True, progress=False)
    dt = time.perf_counter() - t0
    if r.num_samples != expect or r.skipped:
        raise SystemExit(f"pack stored {r.num_samples} of {expect} images, skipped {r.skipped!r}")
    return dt, {"num_shards": r.num_shards, "bytes": r.bytes, "seconds_reported": round(r.seconds, 3)}


def read_pass(ds, order: np.ndarray) -> float:
    t0 = time.perf_counter()
    n = 0
    for i in order.tolist():
        n += len(ds[i][0])
    dt = time.perf_counter() - t0
    if n <= 0:
        raise SystemExit("read no bytes")
    return dt


def bench_reads(path: Path, repeats: int, min_reads: int, seed: int) -> dict:
    ds = fastload.Dataset(path)
    n = len(ds)
    rng = np.random.default_rng(seed)
    read_pass(ds, np.arange(n))  # warm-up: opens the shards, faults the pages in
    rounds = max(1, math.ceil(min_reads / n))
    out = {}
    for name, check, make in [
        ("random", False, lambda: np.concatenate([rng.permutation(n) for _ in range(rounds)])),
        ("sequential", False, lambda: np.tile(np.arange(n), rounds)),
        ("random_check_crc", True, lambda: rng.permutation(n)),
    ]:
        d = fastload.Dataset(path, check=check) if check else ds
        rates = []
        for _ in range(repeats):
            order = make()
            rates.append(len(order) / read_pass(d, order))
        out[name] = {"samples_per_s": round(statistics.median(rates)), "runs": [round(r) for r in rates], "reads_per_run": len(order)}
    return out


def profile_pack(src: Path, out: Path, top: int = 25) -> str:
    """cProfile of a single-process pack (workers=1 runs everything inline)."""
    prof = cProfile.Profile()
    prof.enable()
    fastload.pack(src, out, workers=1, overwrite=True, progress=False)
    prof.disable()
    s = io.StringIO()
    st = pstats.Stats(prof, stream=s).strip_dirs()
    st.sort_stats("cumulative").print_stats(top)
    st.sort_stats("tottime").print_stats(top)
    return s.getvalue()


# ----------------------------------------------------------------------------- report


def render_md(res: dict) -> str:
    m, d = res["machine"], res["dataset"]
    lines = [
        f"# Pack and read throughput — {res['machine_name']}",
        "",
        f"{res['created']} · `{res['command']}`",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM; written to {m['work_dir']} "
        f"({m['work_dir_fs']}, {m['disk_free_gb']} GB free); Python {m['python']}, fastload {m['fastload']}, torch {m['torch']}, "
        f"PIL {m['pillow']}, lmdb {m['lmdb']}.",
        "",
        f"Dataset: {d['images']} JPEGs in {d['classes']} classes, {d['bytes'] / 1e6:.1f} MB "
        f"({d['bytes'] / d['images'] / 1e3:.0f} KB each); page cache warm; median of {res['repeats']} interleaved runs.",
        "",
        "| step | images/s | MB/s | seconds (median) | vs copy | each run, s |",
        "|---|---:|---:|---:|---:|---|",
    ]
    copy_rate = res["copy"]["images_per_s"]
    for name, r in res["throughput"].items():
        lines.append(
            f"| {name} | {r['images_per_s']:,.0f} | {r['mb_per_s']:,.1f} | {r['seconds']:.2f} | "
            f"{r['images_per_s'] / copy_rate:.2f} | {', '.join(f'{x:.2f}' for x in r['runs_s'])} |"
        )
    lines += [
        "",
        f"Best pack over copy: {res['pack_over_copy']:.2f} (target >= {PACK_TARGET}); over copy+sync: "
        f"{res['pack_over_copy_sync']:.2f}; over concat+fsync: {res['pack_over_concat_fsync']:.2f}.",
    ]
    lines += ["", "| Dataset read (one process) | samples/s | runs |", "|---|---:|---|"]
    for name, r in res["read"].items():
        lines.append(f"| {name.replace('_', ' ')} | {r['samples_per_s']:,} | {', '.join(f'{x:,}' for x in r['runs'])} |")
    lines += ["", "Targets:"]
    for t in res["targets"]:
        lines.append(f"- {'PASS' if t['passed'] else 'FAIL'}: {t['what']} = {t['value']} (target {t['target']})")
    if res.get("notes"):
        lines += ["", "Notes:"] + [f"- {n}" for n in res["notes"]]
    if res.get("profile_file"):
        lines += ["", f"cProfile of a single-process pack: `{res['profile_file']}`."]
    return "\n".join(lines) + "\n"


def _rate(seconds: list[float], images: int, nbytes: int) -> dict:
    s = statistics.median(seconds)
    return {
        "seconds": round(s, 4),
        "images_per_s": round(images / s, 1),
        "mb_per_s": round(nbytes / s / 1e6, 1),
        "runs_s": [round(x, 4) for x in seconds],
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, help="image folder (made with make_sample if missing; default: a temporary sample)")
    ap.add_argument("--num-images", type=int, default=3000, help="size of a generated sample (default 3000)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=str, default=None, help="comma-separated pack worker counts (default: 1,<cores>)")
    ap.add_argument("--work-dir", type=Path, default=ROOT / "data", help="where copies and packs are written (default: data/)")
    ap.add_argument("--min-reads", type=int, default=100_000, help="reads per random/sequential read run")
    ap.add_argument("--machine", help="name in the result files (default: from the CPU model and cores)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--note", action="append", default=[], help="a line of context for the report (repeatable)")
    ap.add_argument("--profile", choices=["auto", "always", "never"], default="auto",
                    help="cProfile a workers=1 pack: when the pack target is missed (auto), always or never")
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="[bench] %(message)s")
    logging.getLogger("fastload").setLevel(logging.WARNING)

    cores = os.cpu_count() or 1
    workers = sorted({int(w) for w in args.workers.split(",")}) if args.workers else sorted({1, cores})
    args.work_dir.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="bench-pack-", dir=args.work_dir))
    t_start = time.perf_counter()
    try:
        if args.images is None:
            src = work / "images"
            log.info("making a %d-image sample in %s", args.num_images, src)
            fastload.make_sample(src, num_images=args.num_images)
        else:
            src = args.images
            if not src.exists():
                log.info("making a %d-image sample in %s", args.num_images, src)
                fastload.make_sample(src, num_images=args.num_images)
        files = _files(src)
        if not files:
            raise SystemExit(f"{src}: no files")
        nbytes = warm(files)
        warm(files)
        classes = len({p.parent for p in files})
        log.info("%d files, %.1f MB, page cache warm", len(files), nbytes / 1e6)

        times: dict[str, list[float]] = {"copy": [], "copy+sync": [], "concat+fsync": [], **{f"pack w={w}": [] for w in workers}}
        pack_info: dict = {}
        # Deleting files between runs slows the next runs' file creation (ext4 journal
        # commits, discard): keep every output until the end when the disk has room.
        steps = 3 + len(workers)
        keep = shutil.disk_usage(work).free > nbytes * 1.2 * steps * args.repeats + (2 << 30)
        if not keep:
            log.info("not enough free disk to keep every run's output: deleting between runs")
        last = None
        for rep in range(args.repeats):
            outs = []
            for sync in (False, True):
                name = "copy+sync" if sync else "copy"
                dest = work / f"{name}-{rep}"
                times[name].append(run_copy(src, files, dest, sync=sync))
                outs.append(dest)
            dest = work / f"concat-{rep}" / "all.bin"
            times["concat+fsync"].append(run_concat(files, dest))
            outs.append(dest.parent)
            for w in workers:
                last = work / f"pack-w{w}-{rep}"
                dt, pack_info[w] = run_pack(src, last, w, len(files))
                times[f"pack w={w}"].append(dt)
                outs.append(last)
            if not keep:
                for o in outs:
                    if o != last or rep < args.repeats - 1:
                        shutil.rmtree(o)
            log.info("run %d: %s", rep + 1, ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
        packed = last
        read = bench_reads(packed, args.repeats, args.min_reads, seed=0)
        log.info("reads: %s", {k: v["samples_per_s"] for k, v in read.items()})

        rows = [(k, _rate(v, len(files), nbytes)) for k, v in times.items()]
        res_rows = dict(rows)
        copy = res_rows["copy"]
        best_pack = max((res_rows[f"pack w={w}"] for w in workers), key=lambda r: r["images_per_s"])
        ratio = best_pack["images_per_s"] / copy["images_per_s"]
        ratio_sync = best_pack["images_per_s"] / res_rows["copy+sync"]["images_per_s"]
        ratio_concat = best_pack["images_per_s"] / res_rows["concat+fsync"]["images_per_s"]
        info = machine_info(work)
        name = args.machine or machine_slug(info)
        res = {
            "benchmark": "pack",
            "machine_name": name,
            "created": time.strftime("%Y-%m-%d %H:%M:%S %z"),
            "command": " ".join(["python", "benchmarks/bench_pack.py", *(argv if argv is not None else sys.argv[1:])]),
            "machine": info,
            "dataset": {"images": len(files), "classes": classes, "bytes": nbytes, "source": str(args.images or "temporary sample")},
            "repeats": args.repeats,
            "notes": args.note,
            "workers": workers,
            "throughput": res_rows,
            "copy": copy,
            "pack_result": {str(w): v for w, v in pack_info.items()},
            "read": read,
            "pack_over_copy": round(ratio, 3),
            "pack_over_copy_sync": round(ratio_sync, 3),
            "pack_over_concat_fsync": round(ratio_concat, 3),
            "targets": [
                {"what": "best pack images/s / copy images/s", "value": round(ratio, 3), "target": f">= {PACK_TARGET}",
                 "passed": ratio >= PACK_TARGET},
                {"what": "Dataset random reads/s, one process", "value": read["random"]["samples_per_s"],
                 "target": f">= {READ_TARGET:,}", "passed": read["random"]["samples_per_s"] >= READ_TARGET},
            ],
        }
        args.out.mkdir(parents=True, exist_ok=True)
        if args.profile == "always" or (args.profile == "auto" and ratio < PACK_TARGET):
            log.info("profiling a workers=1 pack")
            text = profile_pack(src, work / "pack-profile")
            pfile = args.out / f"pack-{name}.profile.txt"
            pfile.write_text(text)
            res["profile_file"] = str(pfile.relative_to(ROOT) if pfile.is_relative_to(ROOT) else pfile)
        res["bench_seconds"] = round(time.perf_counter() - t_start, 1)
        jpath, mpath = args.out / f"pack-{name}.json", args.out / f"pack-{name}.md"
        jpath.write_text(json.dumps(res, indent=1) + "\n")
        mpath.write_text(render_md(res))
        print(render_md(res))
        log.info("wrote %s and %s (%.0f s)", jpath, mpath, res["bench_seconds"])
        return 0 if all(t["passed"] for t in res["targets"]) else 1
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
