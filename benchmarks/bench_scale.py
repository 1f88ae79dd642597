"""Bigger-than-RAM reading, measured cold and warm: open time, read-ahead, block order, memory.

    .venv/bin/python benchmarks/bench_scale.py [--compare-with OLD_SRC] [--quick]

Everything runs on this machine's own disk, with the dataset's files dropped from the page
cache before each cold measurement (``fsync`` + ``posix_fadvise(POSIX_FADV_DONTNEED)`` per
file, checked with ``mincore`` as ``fincore`` does: the bytes still resident are reported),
each measurement in a fresh process (nothing cached from an earlier one). The machine is
shared: before each measurement the script waits until the 1-minute load average is below
``--max-load`` (3) and records it.

1. The disk itself, in the same run: ``pread`` of exactly the records' byte ranges, in random
   order, from 1 and from ``--threads`` threads; sequential ``O_DIRECT`` reads of the shards.
2. ``Dataset`` on the sample datasets (3,000 and 20,000 ImageNet-like JPEGs, ~110 KB, made
   by ``fastload.make_sample`` and packed): an epoch cold and warm, random and storage order,
   with ``Dataset.record`` alone and with ``ReadAhead`` (``--threads``, ``--depth`` batches
   of ``--batch``); the block-shuffled order with ``ReadAhead``; resident memory
   (anonymous / file-backed) before and after.
3. A synthetic 1.28-million-sample dataset of 1 KB records in >= 100 shards (tiny JPEGs,
   ``fastload.pack_dataset``): open + the first batch of a shuffled epoch, cold: seconds and
   bytes read from the disk (``/proc/self/io`` ``read_bytes``, and what ``mincore`` finds
   resident afterwards).
4. The randomness of each order (no I/O): mean distance between neighbours, how often
   storage neighbours share a batch, classes per batch on class-sorted labels, and how
   uniform each sample's position is over epochs.

``--compare-with DIR`` runs the cold ``Dataset`` rows and the open row also with the
``fastload`` package found in ``DIR`` (e.g. ``git archive <old commit> fastload | tar -x -C DIR``):
the numbers before this change, in the same run.

Writes ``benchmarks/results/scale-<machine>.json`` and ``.md``. Datasets are cached under
``data/scale/`` (``--data``); the 1.28M one takes about a minute to make, the 20k sample
about three.
"""

from __future__ import annotations

import argparse
import io
import json
import mmap
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if "--child" not in sys.argv:  # a child imports the fastload its PYTHONPATH names (this tree, or --compare-with)
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

SYNTH_N = 1_281_167  # ImageNet-1k's train set
SYNTH_CLASSES = 1000


# ============================================================================ children (fresh processes)


def _proc_io() -> int:
    try:
        for line in Path("/proc/self/io").read_text().splitlines():
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    except OSError:
        pass
    return -1


def _mem() -> dict:
    out = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        k, _, v = line.partition(":")
        if k in ("VmRSS", "RssAnon", "RssFile"):
            out[k] = int(v.split()[0]) * 1024
    return out


def _order(n: int, kind: str, seed: int = 0, block: int = 64, window: int = 16) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "random":
        return rng.permutation(n)
    if kind == "storage":
        return np.arange(n)
    from fastload.sampler import block_order

    return block_order(n, block_size=block, window=window, rng=rng)


def child_dataset_epoch(a: dict) -> dict:
    """``Dataset.record`` over an order (optionally through ``ReadAhead``): records/s, bytes, memory."""
    import fastload

    ds = fastload.Dataset(a["path"], check=False)
    idx = _order(len(ds), a["order"], block=a.get("block", 64), window=a.get("window", 16))[: a.get("limit") or None]
    m0, io0 = _mem(), _proc_io()
    t = time.perf_counter()
    nbytes = 0
    if a.get("threads"):
        from fastload.reader import ReadAhead

        b = a["batch"]
        ra = ReadAhead(ds, threads=a["threads"], depth=a["depth"], evict=a.get("evict", False), runs=a.get("runs"))
        for batch in ra.ahead(idx[k : k + b] for k in range(0, idx.size, b)):
            for i in batch.tolist():
                nbytes += len(ds.record(i)[1])
        ra.close()
    else:
        for i in idx.tolist():
            nbytes += len(ds.record(i)[1])
    dt = time.perf_counter() - t
    m1 = _mem()
    return {"records": int(idx.size), "seconds": dt, "records_per_s": idx.size / dt, "payload_mb_per_s": nbytes / dt / 1e6,
            "read_bytes": _proc_io() - io0, "rss_anon_before": m0.get("RssAnon"), "rss_anon_after": m1.get("RssAnon"),
            "rss_file_before": m0.get("RssFile"), "rss_file_after": m1.get("RssFile")}  # fmt: skip


def child_open_first_batch(a: dict) -> dict:
    """Open a dataset and read the first batch of a shuffled epoch: seconds, bytes read."""
    io0 = _proc_io()
    t0 = time.perf_counter()
    import fastload
    from fastload.sampler import EpochSampler

    t = time.perf_counter()
    ds = fastload.Dataset(a["path"], check=True)
    t_open = time.perf_counter() - t
    batch = next(EpochSampler(num_samples=len(ds), batch_size=a["batch"], seed=0).batches(0)).indices
    if a.get("prefetch") and hasattr(ds, "prefetch"):
        ds.prefetch(batch)
    for i in batch.tolist():
        ds.record(i)
    dt = time.perf_counter() - t
    shards = {int(np.searchsorted([s.first for s in ds.shards], i, side="right")) - 1 for i in batch.tolist()}
    return {"seconds": dt, "open_seconds": t_open, "import_seconds": t - t0, "read_bytes": _proc_io() - io0,
            "batch": len(batch), "shards_touched": len(shards)}  # fmt: skip


def child_pread(a: dict) -> dict:
    """The disk's own rate: ``pread`` of exactly the given byte ranges, from ``threads`` threads."""
    ranges = json.loads(Path(a["ranges"]).read_text())
    files = ranges["files"]
    recs = np.load(ranges["records"])  # file, offset, length
    order = _order(len(recs), a["order"])[: a.get("limit") or None]
    recs = recs[order]
    fds = [os.open(f, os.O_RDONLY) for f in files]
    for fd in fds:
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)  # exactly the bytes asked for, as the readers do
    threads = a["threads"]
    parts = np.array_split(np.arange(len(recs)), threads)
    total = [0] * threads

    def run(k: int) -> None:
        for f, off, n in recs[parts[k]].tolist():
            total[k] += len(os.pread(fds[f], n, off))

    t = time.perf_counter()
    ts = [threading.Thread(target=run, args=(k,)) for k in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    dt = time.perf_counter() - t
    return {"records": len(recs), "seconds": dt, "records_per_s": len(recs) / dt, "mb_per_s": sum(total) / dt / 1e6,
            "mean_record_bytes": float(recs[:, 2].mean())}  # fmt: skip


def child_odirect(a: dict) -> dict:
    """Sequential ``O_DIRECT`` reads of whole files in 8 MiB requests (no page cache)."""
    chunk = 8 << 20
    buf = mmap.mmap(-1, chunk)  # page-aligned, as O_DIRECT needs
    total = 0
    t = time.perf_counter()
    for f in a["files"]:
        fd = os.open(f, os.O_RDONLY | os.O_DIRECT)
        try:
            while True:
                n = os.readv(fd, [buf])
                total += n
                if n < chunk:
                    break
        finally:
            os.close(fd)
    dt = time.perf_counter() - t
    return {"bytes": total, "seconds": dt, "mb_per_s": total / dt / 1e6}


def child_loader_epoch(a: dict) -> dict:
    """One ``FastLoader(device="cpu")`` training epoch (224x224, batch 64, defaults): images/s, bytes read, memory."""
    import fastload

    loader = fastload.FastLoader(a["path"], batch_size=64, device="cpu", shuffle=True, seed=0)
    m0, io0 = _mem(), _proc_io()
    t = time.perf_counter()
    n = 0
    for x, _y in loader:
        n += x.shape[0]
    dt = time.perf_counter() - t
    m1 = _mem()
    loader.close()
    return {"records": n, "seconds": dt, "records_per_s": n / dt, "read_bytes": _proc_io() - io0,
            "rss_anon_before": m0.get("RssAnon"), "rss_anon_after": m1.get("RssAnon"),
            "rss_file_before": m0.get("RssFile"), "rss_file_after": m1.get("RssFile")}  # fmt: skip


CHILDREN = {"dataset_epoch": child_dataset_epoch, "loader_epoch": child_loader_epoch, "open_first_batch": child_open_first_batch, "pread": child_pread,
            "odirect": child_odirect}  # fmt: skip


# ============================================================================ the parent


class Runner:
    def __init__(self, max_load: float, compare_with: str | None) -> None:
        self.max_load = max_load
        self.compare_with = compare_with
        self.loads: list[float] = []

    def wait_for_load(self) -> float:
        waited = 0
        while os.getloadavg()[0] >= self.max_load and waited < 3600:
            if waited % 60 == 0:
                print(f"  load {os.getloadavg()[0]:.1f} >= {self.max_load}: waiting", flush=True)
            time.sleep(10)
            waited += 10
        load = round(os.getloadavg()[0], 2)
        self.loads.append(load)
        return load

    def child(self, task: str, args: dict, *, old: bool = False) -> dict:
        load = self.wait_for_load()
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        env["PYTHONPATH"] = (self.compare_with if old else str(ROOT)) + os.pathsep + env.get("PYTHONPATH", "")
        r = subprocess.run([sys.executable, __file__, "--child", task, json.dumps(args)], capture_output=True, text=True,
                           env=env, timeout=3600, cwd=str(ROOT))  # fmt: skip
        if r.returncode != 0:
            raise RuntimeError(f"child {task} failed: {r.stderr[-3000:]}")
        out = json.loads(r.stdout.strip().splitlines()[-1])
        out["load"] = load
        return out


def dataset_files(path: Path) -> list[Path]:
    return sorted(p for p in path.iterdir() if p.is_file())


def make_cold(path: Path) -> int:
    """Drop the dataset's files from the page cache; the bytes still resident afterwards."""
    from fastload.store import drop_cached, resident_bytes

    for f in dataset_files(path):
        drop_cached(f)
    return sum(resident_bytes(f) for f in dataset_files(path))


def make_warm(path: Path) -> int:
    """Read every file of the dataset; the bytes not resident afterwards."""
    from fastload.store import resident_bytes

    for f in dataset_files(path):
        with open(f, "rb", buffering=0) as fh:
            while fh.read(8 << 20):
                pass
    return sum(f.stat().st_size - resident_bytes(f) for f in dataset_files(path))


def sample_dataset(data: Path, n: int) -> Path:
    import fastload

    src = data / f"sample-{n // 1000}k"
    out = data / f"sample-{n // 1000}k-packed"
    if not (out / "manifest.json").exists():
        print(f"making {src} and {out}", flush=True)
        fastload.make_sample(src, num_images=n)
        fastload.pack(src, out, progress=False, overwrite=True)
    return out


class _Synthetic:
    """1.28M tiny JPEGs (32x32, ~1 KB: records stored inside LMDB leaf pages), class-sorted labels."""

    classes = [f"class{i:04d}" for i in range(SYNTH_CLASSES)]

    def __init__(self, n: int) -> None:
        from PIL import Image

        self.n = n
        rng = np.random.default_rng(0)
        self.jpegs = []
        for _ in range(64):
            a = (rng.random((32, 32, 3)) * 60 + np.linspace(0, 180, 32)[None, :, None]).astype(np.uint8)
            b = io.BytesIO()
            Image.fromarray(a).save(b, "JPEG", quality=85)
            self.jpegs.append(b.getvalue())

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        if not 0 <= i < self.n:
            raise IndexError(i)
        return self.jpegs[i % 64], i * SYNTH_CLASSES // self.n


def synthetic_dataset(data: Path, n: int) -> Path:
    import fastload

    out = data / f"synthetic-{n}"
    if not (out / "manifest.json").exists():
        print(f"making {out}", flush=True)
        fastload.pack_dataset(_Synthetic(n), out, shard_size="16MB", progress=False, overwrite=True)
    return out


def record_ranges(path: Path, where: Path) -> Path:
    """Every record's (file, offset, length), for the disk baseline (found through the new reader)."""
    import fastload

    ds = fastload.Dataset(path)
    ds.prefetch(np.arange(len(ds)))  # locates every record, a shard's pages at a time
    files, recs = [], np.empty((len(ds), 3), dtype=np.int64)
    for i in range(len(ds)):
        f, off, n = ds.locate(i)
        if not files or files[-1] != f:
            files.append(f)
        recs[i] = (len(files) - 1, off, n)
    np.save(where.with_suffix(".npy"), recs)
    where.write_text(json.dumps({"files": files, "records": str(where.with_suffix(".npy"))}))
    return where


# ----------------------------------------------------------------------------- randomness


def randomness(n: int, labels: np.ndarray, batch: int, orders: dict, epochs: int = 20) -> dict:
    """Per order: mean |i - j| of neighbours in the epoch (over n/3 for a true shuffle), how often
    storage neighbours land in one batch, distinct classes per batch, and the mean absolute
    correlation of a sample's positions between epochs and with its index."""
    out = {}
    for name, make in orders.items():
        eps = [make(e) for e in range(epochs)]
        o = eps[0]
        pos = np.empty((epochs, n), dtype=np.int64)
        for e, p in enumerate(eps):
            pos[e, p] = np.arange(n)
        same_batch = float(np.mean(pos[0, 1:] // batch == pos[0, :-1] // batch))
        classes = [len(np.unique(labels[o[k : k + batch]])) for k in range(0, n - batch + 1, batch)]
        between = float(np.mean([abs(np.corrcoef(pos[e], pos[e + 1])[0, 1]) for e in range(epochs - 1)]))
        with_index = float(np.mean([abs(np.corrcoef(pos[e], np.arange(n))[0, 1]) for e in range(epochs)]))
        # how uniform one sample's position is over epochs: mean over samples of the KS distance
        # between its `epochs` positions and U(0, n); a true shuffle sets the floor for this many epochs
        u = np.sort(pos / n, axis=0)
        grid = np.arange(1, epochs + 1)[:, None] / epochs
        ks = float(np.mean(np.max(np.maximum(grid - u, u - (grid - 1 / epochs)), axis=0)))
        out[name] = {
            "mean_neighbour_distance": float(np.mean(np.abs(np.diff(o)))),
            "storage_neighbours_in_one_batch": same_batch,
            "classes_per_batch_mean": float(np.mean(classes)),
            "position_corr_between_epochs": between,
            "position_corr_with_index": with_index,
            "position_ks_mean": ks,
        }
    return out


# ----------------------------------------------------------------------------- report


def _median_run(runs: list[dict]) -> dict:
    """The run with the median records/s, and the range over all runs."""
    runs = sorted(runs, key=lambda r: r["records_per_s"])
    out = dict(runs[len(runs) // 2])
    out["records_per_s_min"], out["records_per_s_max"] = runs[0]["records_per_s"], runs[-1]["records_per_s"]
    return out


def _fmt(x: float, unit: str = "") -> str:
    return f"{x:,.0f}{unit}" if x >= 100 else f"{x:,.2f}{unit}"


def write_report(res: dict, out: Path, slug: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"scale-{slug}.json").write_text(json.dumps(res, indent=1))
    m = res["machine"]
    L = [f"# Bigger-than-RAM reading: cold and warm ({slug})", ""]
    L += [f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GiB RAM, {res['disk']}. Python {m['python']}, lmdb {m['lmdb']}.",
          f"Cold cache: {res['cold_method']}. Each measurement in a fresh process. "
          f"1-minute load average at the measurements: {min(res['loads']):.2f}..{max(res['loads']):.2f} (others share this machine; "
          f"the script waits for < {res['max_load']} before each). Read-ahead: {res['threads']} threads, {res['depth']} batches of "
          f"{res['batch']} ahead; CRC check off (no decoding: reading only).", ""]  # fmt: skip
    for name, d in res["datasets"].items():
        L += [f"## {name}: {d['samples']:,} samples ({d.get('label', '')}), {d['bytes'] / 1e9:.2f} GB in {d['shards']} shards, "
              f"{d['mean_record_bytes'] / 1e3:.1f} KB per record"
              + (f"; each run reads the first {d['limit']:,} samples of its order" if d.get("limit") else ""), ""]  # fmt: skip
        L += ["| what | order | cold records/s (median; range) | cold MB/s | warm records/s | RssFile growth over the run |",
              "|---|---|---:|---:|---:|---:|"]  # fmt: skip
        for row in d["rows"]:
            c, w = row.get("cold"), row.get("warm")
            growth = c.get("rss_file_after", 0) - c.get("rss_file_before", 0) if c and c.get("rss_file_after") is not None else None
            L.append(f"| {row['what']} | {row['order']} | {_fmt(c['records_per_s'])} ({_fmt(c['records_per_s_min'])}..{_fmt(c['records_per_s_max'])}) | "
                     f"{_fmt(c.get('payload_mb_per_s', c.get('mb_per_s', 0)))} | {_fmt(w['records_per_s']) if w else ''} | "
                     f"{'' if growth is None else f'{growth / 1e6:,.0f} MB'} |")  # fmt: skip
        L += ["", f"Sequential O_DIRECT read of the shards: {_fmt(d['odirect']['mb_per_s'])} MB/s. "
              f"Residual resident bytes after dropping: {d['residual_after_drop']:,}. Disk rows: `pread` of exactly the "
              "records' byte ranges (the reader's own offsets) from 1 or 4 threads, kernel read-around off, as the reader does. "
              "Warm: the dataset's files read in full first, in a fresh process. RssFile growth: file-backed resident memory "
              "of the reading process after the run minus before (the old reader mapped every page it read).", ""]  # fmt: skip
        for t in d.get("targets", []):
            L.append(f"- {t}")
        L.append("")
    s = res["synthetic"]
    L += [f"## Open + first batch: {s['samples']:,} samples, {s['bytes'] / 1e9:.2f} GB in {s['shards']} shards (cold)", "",
          "| code | first batch | seconds (median) | of which open | bytes read from disk | share of the dataset | resident after (mincore) |",
          "|---|---|---:|---:|---:|---:|---:|"]  # fmt: skip
    for row in s["rows"]:
        L.append(f"| {row['code']} | {row['what']} | {row['seconds']:.3f} | {row['open_seconds']:.3f} | {row['read_bytes'] / 1e6:,.1f} MB | "
                 f"{100 * row['read_bytes'] / s['bytes']:.2f} % | {row['resident_after'] / 1e6:,.1f} MB |")  # fmt: skip
    L += [""] + [f"- {t}" for t in s.get("targets", [])] + [""]
    L += ["## Randomness of the orders (no I/O)", "",
          "Mean neighbour distance: mean |i - j| of consecutive samples of an epoch (n/3 for a true shuffle). Storage neighbours "
          "in one batch: how often samples i and i+1 land in the same batch (batch/n for a true shuffle). Classes per batch: "
          "distinct labels in a batch, with labels sorted by class in storage as `fastload pack` stores an ImageFolder. "
          "Position correlations: |Pearson r| of each sample's positions between consecutive epochs and with its index (0 for "
          "a true shuffle). Position KS: mean over samples of the Kolmogorov-Smirnov distance between its positions over the "
          "epochs measured and the uniform distribution (the global shuffle's value is the floor for that many epochs).", ""]  # fmt: skip
    for name, r in res["randomness"].items():
        L += [f"{name}:", "", "| order | mean neighbour distance | storage neighbours in one batch | classes per batch | "
              "position corr. between epochs | position corr. with index | position KS (mean) |", "|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
        for o, v in r.items():
            L.append(f"| {o} | {v['mean_neighbour_distance']:,.0f} | {v['storage_neighbours_in_one_batch']:.3f} | "
                     f"{v['classes_per_batch_mean']:.1f} | {v['position_corr_between_epochs']:.4f} | {v['position_corr_with_index']:.4f} | "
                     f"{v['position_ks_mean']:.3f} |")  # fmt: skip
        L.append("")
    (out / f"scale-{slug}.md").write_text("\n".join(L) + "\n")


def loader_epochs(run: Runner, data: Path, info: dict, slug: str, args) -> int:
    """FastLoader(cpu) epochs, cold and warm, interleaved, on the 3k and 20k samples; a report of its own."""
    out: dict = {"machine": info, "disk": disk_description(data), "started": time.strftime("%Y-%m-%d %H:%M:%S"),
                 "settings": "FastLoader(path, batch_size=64, device='cpu', shuffle=True, seed=0): 224x224 float32 training "
                             "batches, the loader's defaults (read-ahead on, payload checksum on)", "datasets": {}}  # fmt: skip
    sizes = [3000] if args.quick else [3000, 20000]
    paths = {n: sample_dataset(data, n) for n in sizes}
    for n in sizes:
        out["datasets"][str(n)] = {"path": str(paths[n]), "cold_runs": [], "warm_runs": [], "residual_after_drop": []}
    for rep in range(args.repeats):
        for n in sizes:
            d = out["datasets"][str(n)]
            d["residual_after_drop"].append(make_cold(paths[n]))
            d["cold_runs"].append(run.child("loader_epoch", {"path": str(paths[n])}))
            make_warm(paths[n])
            d["warm_runs"].append(run.child("loader_epoch", {"path": str(paths[n])}))
            print(f"  [{rep}] {n:6d} images: cold {d['cold_runs'][-1]['records_per_s']:7,.0f}/s  "
                  f"warm {d['warm_runs'][-1]['records_per_s']:7,.0f}/s", flush=True)  # fmt: skip
    lines = [f"# FastLoader(cpu) epochs on a cold and a warm page cache ({slug})", "",
             f"Machine: {info.get('cpu', '?')}; {out['disk']}. {out['settings']}. Cold: every dataset file dropped "
             "with fsync + POSIX_FADV_DONTNEED before the process starts (bytes still resident after dropping: "
             + ", ".join(str(max(d['residual_after_drop'])) for d in out['datasets'].values())
             + "); warm: the files read in full first. Each epoch a fresh process; cold and warm alternated, "
             f"{args.repeats} repeats; 1-minute load at the measurements {min(run.loads):.2f}..{max(run.loads):.2f}.", "",
             "| images | cold images/s (median; min–max) | warm images/s (median; min–max) | cold / warm (median of per-repeat ratios) | read from disk, cold | RssFile growth, cold |",
             "|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for n, d in out["datasets"].items():
        c = [r["records_per_s"] for r in d["cold_runs"]]
        w = [r["records_per_s"] for r in d["warm_runs"]]
        ratios = [a / b for a, b in zip(c, w)]
        rb = statistics.median(r["read_bytes"] for r in d["cold_runs"]) / 1e6
        rf = statistics.median((r["rss_file_after"] or 0) - (r["rss_file_before"] or 0) for r in d["cold_runs"]) / 2**20
        d["cold_over_warm"] = statistics.median(ratios)
        lines.append(f"| {int(n):,} | {statistics.median(c):,.0f} ({min(c):,.0f}–{max(c):,.0f}) | {statistics.median(w):,.0f} "
                     f"({min(w):,.0f}–{max(w):,.0f}) | {d['cold_over_warm']:.2f} ({min(ratios):.2f}–{max(ratios):.2f}) | "
                     f"{rb:,.0f} MB | {rf:,.0f} MB |")  # fmt: skip
    lines += ["", "Target: a cold epoch at >= 90 % of a warm one: "
              + "; ".join(f"{int(n):,} images {d['cold_over_warm']:.2f} ({'met' if d['cold_over_warm'] >= 0.9 else 'MISSED'})"
                          for n, d in out["datasets"].items()) + "."]  # fmt: skip
    dest = Path(args.out)
    dest.mkdir(parents=True, exist_ok=True)
    (dest / f"scale-loader-{slug}.json").write_text(json.dumps(out, indent=1) + "\n")
    (dest / f"scale-loader-{slug}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


def disk_description(path: Path) -> str:
    dev = os.stat(path).st_dev
    name = "?"
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        parts = line.split()
        if parts[2] == f"{os.major(dev)}:{os.minor(dev)}":
            sep = parts.index("-")
            name = f"{parts[sep + 2]} ({parts[sep + 1]})"
            break
    base = Path(name.split()[0]).name
    extra = []
    for attr in ("read_ahead_kb", "scheduler"):
        p = Path(f"/sys/block/{base}/queue/{attr}")
        if p.exists():
            extra.append(f"{attr} {p.read_text().strip()}")
    return f"disk {name}" + (f", {', '.join(extra)}" if extra else "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--child", nargs=2, help=argparse.SUPPRESS)
    ap.add_argument("--data", default=str(ROOT / "data" / "scale"))
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results"))
    ap.add_argument("--threads", type=int, default=4)
    ap.add_argument("--depth", type=int, default=4)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--max-load", type=float, default=3.0)
    ap.add_argument("--compare-with", help="a directory holding an older fastload package, for before/after rows")
    ap.add_argument("--quick", action="store_true", help="the 3k sample and a 100k synthetic dataset only")
    ap.add_argument("--repeats", type=int, default=3, help="cold (and warm) runs of each row, interleaved; medians reported")
    ap.add_argument("--machine")
    ap.add_argument("--report-only", metavar="JSON", help="rewrite the .md from a results .json (no measuring)")
    ap.add_argument("--loader-only", action="store_true",
                    help="only FastLoader(cpu) epochs, cold and warm, on the 3k and 20k samples (scale-loader-<machine>.*)")
    args = ap.parse_args(argv)
    if args.child:
        print(json.dumps(CHILDREN[args.child[0]](json.loads(args.child[1]))))
        return 0

    if args.report_only:
        res = json.loads(Path(args.report_only).read_text())
        write_report(res, Path(args.out), args.machine or Path(args.report_only).stem.removeprefix("scale-"))
        return 0
    from bench_pack import machine_info, machine_slug

    data = Path(args.data)
    data.mkdir(parents=True, exist_ok=True)
    run = Runner(args.max_load, str(Path(args.compare_with).resolve()) if args.compare_with else None)
    info = machine_info(data)
    slug = args.machine or machine_slug(info)
    T, D, B = args.threads, args.depth, args.batch
    if args.loader_only:
        return loader_epochs(run, data, info, slug, args)
    res: dict = {"machine": info, "disk": disk_description(data), "max_load": args.max_load, "threads": T, "depth": D, "batch": B,
                 "cold_method": "fsync + posix_fadvise(POSIX_FADV_DONTNEED) of every file of the dataset, resident bytes checked "
                                "with mincore (fincore); nothing else dropped",
                 "started": time.strftime("%Y-%m-%d %H:%M:%S"), "datasets": {}}  # fmt: skip
    from fastload.sampler import block_size_for

    def measure(name: str, path: Path, *, limit: int | None, old_limit: int, label: str) -> None:
        """The rows of one dataset: the disk, Dataset.record, ReadAhead, in each order, cold (and warm)."""
        import fastload

        ds = fastload.Dataset(path)
        total = ds.nbytes
        ranges = record_ranges(path, data / f"ranges-{len(ds)}.json")
        d: dict = {"path": str(path), "samples": len(ds), "shards": len(ds.shards), "bytes": total, "label": label,
                   "mean_record_bytes": total / len(ds), "limit": limit, "rows": []}  # fmt: skip
        print(f"== {path}", flush=True)
        d["residual_after_drop"] = make_cold(path)
        d["odirect"] = run.child("odirect", {"files": [str(path / s.file) for s in ds.shards]})
        specs: list[dict] = []

        def row(what: str, order: str, task: str, a: dict, *, warm: bool = True, old: bool = False) -> dict:
            r = {"what": what, "order": order, "task": task, "args": {"limit": limit, **a}, "old": old, "cold_runs": [],
                 "warm_runs": [] if warm else None}  # fmt: skip
            specs.append(r)
            return r

        base = {"path": str(path)}
        rr = {"ranges": str(ranges)}
        ra = {"threads": T, "depth": D, "batch": B}
        bs = block_size_for(total / len(ds))
        p1 = row("disk: pread, 1 thread", "random", "pread", {**rr, "order": "random", "threads": 1}, warm=False)
        pT = row(f"disk: pread, {T} threads", "random", "pread", {**rr, "order": "random", "threads": T}, warm=False)
        row(f"disk: pread, {T} threads", "storage", "pread", {**rr, "order": "storage", "threads": T}, warm=False)
        dr = row("Dataset.record", "random", "dataset_epoch", {**base, "order": "random"})
        row("Dataset.record", "storage", "dataset_epoch", {**base, "order": "storage"})
        rar = row(f"ReadAhead({T}, {D}) + Dataset.record", "random", "dataset_epoch", {**base, "order": "random", **ra})
        row(f"ReadAhead({T}, {D}) + Dataset.record", "storage", "dataset_epoch", {**base, "order": "storage", **ra})
        rab = row(f"ReadAhead({T}, {D}, runs={bs}) + Dataset.record", f"block {bs}x16", "dataset_epoch",
                  {**base, "order": "block", "block": bs, "window": 16, "runs": bs, **ra})  # fmt: skip
        row(f"ReadAhead({T}, {D}, evict=True) + Dataset.record", "random", "dataset_epoch", {**base, "order": "random", **ra, "evict": True},
            warm=False)  # fmt: skip
        if run.compare_with:
            lim = min(len(ds), old_limit)
            row(f"before: Dataset.record (LMDB mmap), first {lim:,}", "random", "dataset_epoch",
                {**base, "order": "random", "limit": lim}, old=True)  # fmt: skip
            row(f"before: Dataset.record (LMDB mmap), first {lim:,}", "storage", "dataset_epoch",
                {**base, "order": "storage", "limit": lim}, old=True)  # fmt: skip
        for rep in range(args.repeats):  # interleaved: every row once, then again
            for r in specs:
                make_cold(path)
                r["cold_runs"].append(run.child(r["task"], r["args"], old=r["old"]))
                if r["warm_runs"] is not None:
                    make_warm(path)
                    r["warm_runs"].append(run.child(r["task"], r["args"], old=r["old"]))
                w = r["warm_runs"][-1]["records_per_s"] if r["warm_runs"] else None
                print(f"  [{rep}] {r['what']:46s} {r['order']:11s} cold {r['cold_runs'][-1]['records_per_s']:9,.0f}/s"
                      + (f"  warm {w:9,.0f}/s" if w else ""), flush=True)  # fmt: skip
        for r in specs:
            r["cold"] = _median_run(r["cold_runs"])
            r["warm"] = _median_run(r["warm_runs"]) if r["warm_runs"] else None
        d["rows"] = specs
        ratio = rar["cold"]["records_per_s"] / pT["cold"]["records_per_s"]
        d["targets"] = [
            f"read-ahead, random order, cold: {rar['cold']['records_per_s']:,.0f} records/s (median) = {100 * ratio:.0f} % of the disk's "
            f"{pT['cold']['records_per_s']:,.0f} random preads/s of the same records with the same {T} threads "
            f"(target >= 80 %: {'met' if ratio >= 0.8 else 'MISSED'}); per repeat: "
            + ", ".join(f"{100 * a['records_per_s'] / b['records_per_s']:.0f} %" for a, b in zip(rar["cold_runs"], pT["cold_runs"])),
            f"Dataset.record alone, random order, cold: {dr['cold']['records_per_s']:,.0f} records/s "
            f"(the disk, 1 thread: {p1['cold']['records_per_s']:,.0f}/s)",
            f"block order with read-ahead (runs of {bs} records, {bs * total / len(ds) / 2**20:.1f} MiB), cold: "
            f"{rab['cold']['records_per_s']:,.0f} records/s ({rab['cold']['records_per_s'] / rar['cold']['records_per_s']:.2f}x the random order)",
        ]
        res["datasets"][name] = d

    for n in [3000] if args.quick else [3000, 20000]:
        measure(f"sample-{n // 1000}k", sample_dataset(data, n), limit=None, old_limit=5000, label="ImageNet-like JPEGs")
    measure("synthetic-small-records", synthetic_dataset(data, 100_000 if args.quick else SYNTH_N), limit=100_000 if args.quick else 200_000,
            old_limit=20_000, label="tiny JPEGs, records inside LMDB leaf pages")  # fmt: skip

    n = 100_000 if args.quick else SYNTH_N
    path = synthetic_dataset(data, n)
    import fastload

    ds = fastload.Dataset(path)
    total = sum(f.stat().st_size for f in dataset_files(path))
    s: dict = {"path": str(path), "samples": len(ds), "shards": len(ds.shards), "bytes": total, "rows": []}
    print(f"== {path}", flush=True)
    codes = [("this", False)] + ([("before", True)] if run.compare_with else [])
    from fastload.store import resident_bytes

    for code, old in codes:
        for what, pre in (("records one by one", False), ("Dataset.prefetch(batch) first", True)):
            if old and pre:
                continue
            runs = []
            for _rep in range(args.repeats):
                residual = make_cold(path)
                r = run.child("open_first_batch", {"path": str(path), "batch": B, "prefetch": pre}, old=old)
                r.update(residual_before=residual, resident_after=sum(resident_bytes(f) for f in dataset_files(path)))
                runs.append(r)
                print(f"  {code:7s} {what:32s} {r['seconds']:.3f} s, {r['read_bytes'] / 1e6:,.1f} MB read", flush=True)
            runs.sort(key=lambda r: r["seconds"])
            s["rows"].append({**runs[len(runs) // 2], "code": code, "what": what, "seconds_all": [r["seconds"] for r in runs]})
    best = [r for r in s["rows"] if r["code"] == "this"]
    s["targets"] = [
        f"{r['what']}: {r['seconds']:.2f} s (target < 1 s: {'met' if r['seconds'] < 1 else 'MISSED'}), "
        f"{100 * r['read_bytes'] / total:.2f} % of the dataset's bytes read (target < 1 %: "
        f"{'met' if r['read_bytes'] < 0.01 * total else 'MISSED'}); the batch touched {r['shards_touched']} shards"
        for r in best
    ]
    res["synthetic"] = s

    from fastload.sampler import block_order, block_size_for

    samples = [k for k in res["datasets"] if k.startswith("sample-")]
    lab20 = fastload.Dataset(res["datasets"][samples[-1]]["path"]).labels
    rec_bytes = res["datasets"][samples[-1]]["mean_record_bytes"]
    bs = block_size_for(rec_bytes)

    def orders(nn: int) -> dict:
        g = lambda e: np.random.default_rng([0, e]).permutation(nn)  # noqa: E731
        o = {"storage": lambda e: np.arange(nn), "global": g}
        for b, w in ((bs, 16), (16, 16), (16, 64), (64, 16)):
            o[f"block {b}x{w}"] = lambda e, b=b, w=w: block_order(nn, block_size=b, window=w, rng=np.random.default_rng([0, e]))
        return o

    lab_big = (np.arange(SYNTH_N) * SYNTH_CLASSES // SYNTH_N).astype(np.int64)
    res["randomness"] = {
        f"{len(lab20):,} samples in {len(np.unique(lab20))} class-sorted classes (the sample), batch {B}": randomness(len(lab20), lab20, B, orders(len(lab20))),
        f"{SYNTH_N:,} samples in {SYNTH_CLASSES} class-sorted classes (ImageNet-like), batch {B}": randomness(SYNTH_N, lab_big, B, orders(SYNTH_N), epochs=5),
    }  # fmt: skip
    res["block_size_for_sample_records"] = bs
    res["loads"] = run.loads
    res["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    write_report(res, Path(args.out), slug)
    print(f"wrote {Path(args.out) / f'scale-{slug}.md'}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
