#!/usr/bin/env python
"""Pack and read throughput of fastload, beside the floor measured in the same run.

Measured on the built-in sample dataset (3,000 ImageNet-like JPEGs of about 100 KB,
made with :func:`fastload.make_sample` unless ``--images`` points at a folder),
with the page cache warm (every source file is read once first) and earlier runs'
writes flushed before each timed run (``os.sync()``, untimed). Every figure is the
median over all ``--repeats`` runs with its min-max spread beside it; every run's time
is in the JSON. Steps run interleaved, repeat by repeat, so drift hits all alike:

* **floor** (the target's baseline): the source files' bytes written into ONE new file
  on the disk ``pack`` writes to, padded with zeros to exactly the size of the shards
  ``pack`` writes, then ``fsync``'d: what writing a shard durably costs at minimum (a
  shard is one file, and ``pack`` fsyncs it before it returns). One floor run is
  measured right before each pack run (floor, pack w=1, floor, pack w=N, ...), and pack
  is reported as a fraction of the floor run beside it: ``pack_s / floor_s`` and
  ``floor_s / pack_s`` (pack's images/s over the floor's), median and min-max over pairs.
* **copy**, **copy+sync** (context): ``shutil.copyfile`` of every file into a fresh
  directory on the same disk, without and with ``os.sync()`` after it.
* **pack**: ``fastload.pack(src, out, workers=N)`` (JPEGs stored byte for byte) for
  N = 1 and N = all cores, after one untimed warm-up pack that sizes the floor.
  Target: the best pack's images/s >= 50% of the floor's (median over pairs).
* **read** (one process, warm page cache, the settings ``FastLoader`` reads with):
  ``Dataset(path, check=True)`` (the payload checksum verified on every read: XXH3 in
  format 2.0 datasets) ``ds[i]`` in a random permutation of all indices (FastLoader's
  default ``order="global"``), the headline, target >= 100,000 samples/s; the same with
  ``check=False`` beside it; in index order with ``check=True``; and
  ``Dataset.read_batch`` (the loader's batch reader) of 256 indices at a time in random
  order, ``check=True``, its buffer reused as the loader reuses it.

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
from fastload.format import checksum_name  # noqa: E402

log = logging.getLogger("bench_pack")

PACK_TARGET = 0.5  # pack images/s over the floor's (fsync'd one-file write), median over pairs
READ_TARGET = 100_000  # random ds[i] reads per second with check=True, one process


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


def _write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


def run_floor(files: list[Path], dest: Path, size: int) -> float:
    """Seconds to write the source files' bytes into one new file of ``size`` bytes, then fsync it.

    The files are read (from the warm page cache, as ``pack`` reads them) and written in
    order, unbuffered; the file is cut at ``size`` or padded with zeros up to it, so it is
    exactly as large as the shards ``pack`` writes. What writing a shard durably costs at
    least: ``pack`` also frames, indexes and hashes the records and fsyncs its directory.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    zeros = bytes(1 << 20)
    settle()
    t0 = time.perf_counter()
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        left = size
        for p in files:
            if left <= 0:
                break
            with open(p, "rb") as f:
                data = f.read()
            _write_all(fd, memoryview(data)[:left])
            left -= min(left, len(data))
        while left > 0:
            n = min(left, len(zeros))
            _write_all(fd, memoryview(zeros)[:n])
            left -= n
        os.fsync(fd)
    finally:
        os.close(fd)
    dt = time.perf_counter() - t0
    if dest.stat().st_size != size:
        raise SystemExit(f"{dest}: floor file is {dest.stat().st_size} bytes, not {size}")
    return dt


def run_pack(src: Path, out: Path, workers: int, expect: int) -> tuple[float, dict]:
    settle()
    t0 = time.perf_counter()
    r = fastload.pack(src, out, workers=workers, overwrite=True, progress=False)
    dt = time.perf_counter() - t0
    if r.num_samples != expect or r.skipped:
        raise SystemExit(f"pack stored {r.num_samples} of {expect} images, skipped {r.skipped!r}")
    return dt, {"num_shards": r.num_shards, "bytes": r.bytes, "seconds_reported": round(r.seconds, 3)}


def read_pass(ds, order: np.ndarray) -> float:
    """Seconds to read ``ds[i]`` for every ``i`` of ``order``."""
    t0 = time.perf_counter()
    n = 0
    for i in order.tolist():
        n += len(ds[i][0])
    dt = time.perf_counter() - t0
    if n <= 0:
        raise SystemExit("read no bytes")
    return dt


def batch_pass(ds, order: np.ndarray, batch: int) -> float:
    """Seconds to read ``order`` with ``ds.read_batch`` ``batch`` indices at a time, reusing its buffer."""
    buffer = None
    t0 = time.perf_counter()
    for a in range(0, len(order), batch):
        rb = ds.read_batch(order[a : a + batch], buffer=buffer)
        if rb.errors:
            pos, err = next(iter(rb.errors.items()))
            raise SystemExit(f"read_batch: {len(rb.errors)} records failed, first at batch position {pos}: {err}")
        buffer = rb.buffer
    return time.perf_counter() - t0


#: The read rows: name -> (what it measures and with which settings, check, order, batch or None).
READ_ROWS: dict[str, tuple[str, bool, str, int | None]] = {
    "random, check=True": ("`ds[i]`, a random permutation, payload checksum verified (FastLoader's settings)", True, "random", None),
    "random, check=False": ("`ds[i]`, a random permutation, no checksum", False, "random", None),
    "sequential, check=True": ("`ds[i]` in index order, payload checksum verified", True, "sequential", None),
    "read_batch 256, random, check=True": (
        "`Dataset.read_batch` of 256 indices of a random permutation, buffer reused, checksum verified (what FastLoader calls)",
        True, "random", 256,
    ),
}  # fmt: skip
HEADLINE_READ = "random, check=True"


def bench_reads(path: Path, repeats: int, min_reads: int, seed: int) -> dict:
    """Samples/s of each :data:`READ_ROWS` row, ``repeats`` runs of each, interleaved row by row."""
    datasets = {c: fastload.Dataset(path, check=c) for c in (True, False)}
    n = len(datasets[True])
    for ds in datasets.values():
        read_pass(ds, np.arange(n))  # warm-up: opens the shards, reads every page once
    rng = np.random.default_rng(seed)
    rounds = max(1, math.ceil(min_reads / n))
    rates: dict[str, list[float]] = {k: [] for k in READ_ROWS}
    for _ in range(repeats):
        for name, (_, check, order_kind, batch) in READ_ROWS.items():
            if order_kind == "random":
                order = np.concatenate([rng.permutation(n) for _ in range(rounds)])
            else:
                order = np.tile(np.arange(n), rounds)
            ds = datasets[check]
            dt = batch_pass(ds, order, batch) if batch else read_pass(ds, order)
            rates[name].append(len(order) / dt)
    version = datasets[True].header(0).version
    out = {}
    for name, (what, check, order_kind, batch) in READ_ROWS.items():
        out[name] = {
            "what": what,
            "check": check,
            "order": order_kind,
            "batch": batch,
            "samples_per_s": spread(rates[name], digits=0),
            "reads_per_run": rounds * n,
        }
    out["_checksum"] = checksum_name(version)
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


def spread(values: list[float], digits: int = 4) -> dict:
    """Median, min, max and every value (rounded to ``digits``) of a list of runs."""

    def r(x: float) -> float:
        return round(x) if digits == 0 else round(x, digits)

    return {"median": r(statistics.median(values)), "min": r(min(values)), "max": r(max(values)), "runs": [r(x) for x in values]}


# ----------------------------------------------------------------------------- report


def _mm(s: dict, spec: str) -> str:
    return f"{format(s['min'], spec)}–{format(s['max'], spec)}"


def render_md(res: dict) -> str:
    m, d = res["machine"], res["dataset"]
    fl = res["floor"]
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
        f"({d['bytes'] / d['images'] / 1e3:.0f} KB each); page cache warm; {res['repeats']} repeats, interleaved; "
        "medians over all runs, min–max beside them.",
        "",
        f"Floor: the source files' bytes written into one new file of {fl['bytes'] / 1e6:.1f} MB (the size of the shards "
        "pack writes) on the same disk, then fsync'd: what a shard costs at minimum. One floor run right before each pack run.",
        "",
        "| step | images/s (median) | min–max | MB/s | seconds (median) | min–max | each run, s |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    for name, r in res["throughput"].items():
        ips, s = r["images_per_s"], r["seconds"]
        lines.append(
            f"| {name} | {ips['median']:,.0f} | {_mm(ips, ',.0f')} | {r['mb_per_s']:,.1f} | {s['median']:.2f} | "
            f"{_mm(s, '.2f')} | {', '.join(f'{x:.2f}' for x in s['runs'])} |"
        )
    lines += [
        "",
        "Pack against the floor run measured right before it (each pair one ratio; median and min–max over pairs):",
        "",
        "| pack | pack time / floor time | min–max | pack images/s / floor images/s | min–max | pairs |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, v in res["pack_vs_floor"].items():
        t, f = v["time_over_floor"], v["rate_over_floor"]
        lines.append(f"| {name} | {t['median']:.2f} | {_mm(t, '.2f')} | {f['median']:.2f} | {_mm(f, '.2f')} | {len(t['runs'])} |")
    rd = res["read"]
    lines += [
        "",
        f"Dataset reads, one process, page cache warm; payload checksum of this dataset: {rd['_checksum']}. "
        f"Headline: `{HEADLINE_READ}`, the settings FastLoader reads with.",
        "",
        "| read | settings | samples/s (median) | min–max | each run |",
        "|---|---|---:|---:|---|",
    ]
    for name, r in rd.items():
        if name.startswith("_"):
            continue
        s = r["samples_per_s"]
        lines.append(f"| {name} | {r['what']} | {s['median']:,} | {_mm(s, ',')} | {', '.join(f'{x:,}' for x in s['runs'])} |")
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
        "seconds": spread(seconds),
        "images_per_s": spread([images / x for x in seconds], digits=1),
        "mb_per_s": round(nbytes / s / 1e6, 1),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--images", type=Path, help="image folder (made with make_sample if missing; default: a temporary sample)")
    ap.add_argument("--num-images", type=int, default=3000, help="size of a generated sample (default 3000)")
    ap.add_argument("--repeats", type=int, default=7, help="runs of every step, interleaved (default 7)")
    ap.add_argument("--workers", type=str, default=None, help="comma-separated pack worker counts (default: 1,<cores>)")
    ap.add_argument("--work-dir", type=Path, default=ROOT / "data", help="where copies and packs are written (default: data/)")
    ap.add_argument("--min-reads", type=int, default=100_000, help="reads per read run")
    ap.add_argument("--machine", help="name in the result files (default: from the CPU model and cores)")
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    ap.add_argument("--note", action="append", default=[], help="a line of context for the report (repeatable)")
    ap.add_argument("--profile", choices=["auto", "always", "never"], default="auto",
                    help="cProfile a workers=1 pack: when the pack target is missed (auto), always or never")
    args = ap.parse_args(argv)
    if args.repeats < 1:
        ap.error(f"--repeats must be >= 1, got {args.repeats}")
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

        # One untimed pack: sizes the floor file (the shards' total bytes) and pays the
        # one-time costs (imports, first forks) that no timed run should carry alone.
        warm_s, warm_info = run_pack(src, work / "pack-warmup", max(workers), len(files))
        floor_bytes = warm_info["bytes"]
        log.info("warm-up pack: %.2f s, %d shard(s), %.1f MB", warm_s, warm_info["num_shards"], floor_bytes / 1e6)
        shutil.rmtree(work / "pack-warmup")

        times: dict[str, list[float]] = {"copy": [], "copy+sync": [], "floor": [], **{f"pack w={w}": [] for w in workers}}
        pairs: dict[str, list[tuple[float, float]]] = {f"pack w={w}": [] for w in workers}
        pack_info: dict = {}
        notes = list(args.note)
        # Deleting files between runs slows the next runs' file creation (ext4 journal
        # commits, discard): keep every output until the end when the disk has room.
        steps = 2 + 2 * len(workers)
        keep = shutil.disk_usage(work).free > max(nbytes, floor_bytes) * 1.2 * steps * args.repeats + (2 << 30)
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
            for w in workers:
                dest = work / f"floor-w{w}-{rep}" / "shard.bin"
                floor_s = run_floor(files, dest, floor_bytes)
                times["floor"].append(floor_s)
                outs.append(dest.parent)
                last = work / f"pack-w{w}-{rep}"
                dt, pack_info[w] = run_pack(src, last, w, len(files))
                times[f"pack w={w}"].append(dt)
                pairs[f"pack w={w}"].append((floor_s, dt))
                outs.append(last)
                if pack_info[w]["bytes"] != floor_bytes:
                    notes.append(f"pack w={w} run {rep + 1} wrote {pack_info[w]['bytes']} bytes of shards, the floor {floor_bytes}")
            if not keep:
                for o in outs:
                    if o != last or rep < args.repeats - 1:
                        shutil.rmtree(o)
            log.info("run %d: %s", rep + 1, ", ".join(f"{k} {v[-1]:.2f} s" for k, v in times.items()))
        packed = last
        read = bench_reads(packed, args.repeats, args.min_reads, seed=0)
        log.info("reads (median samples/s): %s", {k: v["samples_per_s"]["median"] for k, v in read.items() if not k.startswith("_")})

        rows = {k: _rate(v, len(files), nbytes) for k, v in times.items()}
        vs_floor = {
            k: {
                "time_over_floor": spread([p / f for f, p in v], digits=3),
                "rate_over_floor": spread([f / p for f, p in v], digits=3),
                "pairs_s": [[round(f, 4), round(p, 4)] for f, p in v],
            }
            for k, v in pairs.items()
        }
        best = max(vs_floor, key=lambda k: vs_floor[k]["rate_over_floor"]["median"])
        ratio = vs_floor[best]["rate_over_floor"]["median"]
        head = read[HEADLINE_READ]["samples_per_s"]["median"]
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
            "notes": notes,
            "workers": workers,
            "floor": {
                "what": "source files' bytes written into one new file of the shards' total size on the same disk, then fsync'd",
                "bytes": floor_bytes,
                "interleaving": "one floor run right before each pack run",
            },
            "warmup_pack": {"seconds": round(warm_s, 4), **warm_info},
            "throughput": rows,
            "pack_vs_floor": vs_floor,
            "best_pack": best,
            "pack_result": {str(w): v for w, v in pack_info.items()},
            "read": read,
            "targets": [
                {"what": f"{best} images/s / floor images/s (median over pairs)", "value": ratio,
                 "target": f">= {PACK_TARGET}", "passed": ratio >= PACK_TARGET},
                {"what": f"Dataset reads/s, one process, {HEADLINE_READ} (median)", "value": head,
                 "target": f">= {READ_TARGET:,}", "passed": head >= READ_TARGET},
            ],
        }  # fmt: skip
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
