"""FastLoader against the torchvision DataLoader, side by side in one run, plus memory over epochs.

    .venv/bin/python benchmarks/bench_loader.py [--device cpu] [--images data/sample-images]

1. Makes the sample dataset (``--num-images``, 3,000) if it is missing and packs it.
2. Throughput, full epochs, ``--repeats`` (5) of each loader **interleaved** (epoch 1 of
   each loader, then epoch 2, ...): torchvision ``ImageFolder`` +
   RandomResizedCrop/RandomHorizontalFlip/ToTensor/Normalize in a ``DataLoader`` with
   ``num_workers`` = cores and persistent workers, against ``FastLoader`` with its defaults
   (``check=True``, ``order="global"``, read-ahead on) on the same images, both producing
   224x224 float32 normalized batches of 64 (``fastload.bench.run_bench``, loader only).
   Each loader's images/s is the median over all its epochs with the min-max spread; the
   speed-up is the median over repeats of FastLoader's epoch over the DataLoader's epoch of
   the same repeat, with its spread too.
3. Memory: FastLoader for 5 epochs: host RSS (and GPU memory on CUDA), threads and open files
   after each epoch.

Writes ``benchmarks/results/loader-<device>/report.{md,json,png}`` (every epoch's images/s in
``report.json``), ``summary.json`` (medians, spreads, per-repeat ratios, every run) and
``memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastload  # noqa: E402
from fastload.bench.runner import BenchConfig, default_loaders, run_bench  # noqa: E402
from fastload.format import checksum_name  # noqa: E402

CPU_TARGET = 1.3  # FastLoader(cpu) / DataLoader images/s
GPU_TARGET = 5.0


def _rss_mb() -> dict[str, float]:
    """Resident memory: total, anonymous (the process's own) and file-backed (mapped shards, libraries)."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "RssAnon", "RssFile"):
                out[key] = round(int(rest.split()[0]) / 1024, 1)
    return {"rss_mb": out.get("VmRSS", 0.0), "rss_anon_mb": out.get("RssAnon", 0.0), "rss_file_mb": out.get("RssFile", 0.0)}


def memory_over_epochs(packed: Path, device: str, epochs: int = 5, batch_size: int = 64) -> dict:
    """RSS, GPU memory, threads and open files after each of ``epochs`` FastLoader epochs."""
    import torch

    rows = []
    with fastload.FastLoader(packed, batch_size, device=device) as loader:
        for e in range(epochs):
            t = time.perf_counter()
            n = sum(len(y) for _, y in loader)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            rows.append(
                {
                    "epoch": e,
                    "images": n,
                    "seconds": round(time.perf_counter() - t, 2),
                    **_rss_mb(),
                    "gpu_allocated_mb": round(torch.cuda.memory_allocated() / 2**20, 1) if device.startswith("cuda") else None,
                    "threads": threading.active_count(),
                    "open_files": len(os.listdir("/proc/self/fd")),
                }
            )
    after = rows[1:] or rows
    return {
        "device": device,
        "epochs": rows,
        "rss_growth_after_first_epoch_mb": round(max(r["rss_mb"] for r in after) - after[0]["rss_mb"], 1),
        "rss_anon_growth_after_first_epoch_mb": round(max(r["rss_anon_mb"] for r in after) - after[0]["rss_anon_mb"], 1),
        "note": "RssFile counts file-backed resident pages (libraries, any mapped file; shared, reclaimable): the Dataset reads shards with pread and maps none; RssAnon is the process's own memory.",
    }


def _spread(values: list[float], digits: int = 1) -> dict:
    """Median, min, max and every value of a list of runs."""
    return {
        "median": round(statistics.median(values), digits),
        "min": round(min(values), digits),
        "max": round(max(values), digits),
        "runs": [round(v, digits) for v in values],
    }


def summarise(res: dict, target: float) -> dict:
    """Per loader: images/s median, min-max and every epoch; FastLoader over the DataLoader per repeat."""
    loaders = {}
    for e in res["loaders"]:
        lo = e.get("loader_only")
        if e.get("error") or not lo:
            raise SystemExit(f"{e['name']} failed: {e.get('error') or 'no measurement'}")
        loaders[e["name"]] = {"kind": e["kind"], "params": e["params"], "images_per_s": _spread(lo["images_per_s"]["runs"])}
    by_kind = {v["kind"]: v["images_per_s"]["runs"] for v in loaders.values()}
    base, fast = by_kind["DataLoader"], by_kind["FastLoader"]
    per_repeat = [f / b for f, b in zip(fast, base)]  # repeat r of both loaders ran back to back
    ratio = _spread(per_repeat, digits=3)
    return {
        "loaders": loaders,
        "speedup_per_repeat": ratio,
        "speedup_of_medians": round(statistics.median(fast) / statistics.median(base), 3),
        "target": target,
        "passed": ratio["median"] >= target,
        "settings": {
            "batch_size": res["config"]["batch_size"],
            "crop": res["config"]["crop"],
            "repeats": res["config"]["repeats"],
            "warmup_batches_per_epoch": res["config"]["warmup"],
            "fastloader": "FastLoader defaults: check=True (payload checksum verified), order='global', read-ahead on",
            "dataloader": f"ImageFolder, num_workers={max(res['config']['workers'])}, persistent workers",
        },
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", default=str(ROOT / "data" / "sample-images"))
    ap.add_argument("--packed", default=str(ROOT / "data" / "sample-packed"))
    ap.add_argument("--num-images", type=int, default=3000, help="size of the sample made when --images is missing (default 3000)")
    ap.add_argument("--repeats", type=int, default=5, help="full epochs of each loader, interleaved (default 5)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    images, packed = Path(a.images), Path(a.packed)
    if not images.exists():
        fastload.make_sample(images, num_images=a.num_images, num_classes=10, seed=0)
    if not (packed / "manifest.json").exists():
        fastload.pack(images, packed, overwrite=True)
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"loader-{a.device.split(':')[0]}"
    cores = len(os.sched_getaffinity(0))
    cfg = BenchConfig(device=a.device, epochs=1, repeats=a.repeats, warmup=3, train_steps=0, workers=[cores])
    specs = [s for s in default_loaders(packed, str(images), cfg) if "packed+PIL" not in s["name"]]
    res = run_bench(packed, images=images, out=out, config=cfg, loaders=specs)
    target = CPU_TARGET if a.device == "cpu" else GPU_TARGET
    summary = summarise(res, target)
    summary["command"] = " ".join(["python", "benchmarks/bench_loader.py", *(argv if argv is not None else sys.argv[1:])])
    summary["created"] = res["created"]
    summary["settings"]["payload_checksum"] = checksum_name(fastload.Dataset(packed).header(0).version)
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    mem = memory_over_epochs(packed, a.device)
    (out / "memory.json").write_text(json.dumps(mem, indent=1) + "\n")
    print(f"images/s per full epoch, {a.repeats} epochs of each loader interleaved (median, min-max):")
    for name, v in summary["loaders"].items():
        ips = v["images_per_s"]
        print(f"  {name}: {ips['median']:,.0f} ({ips['min']:,.0f}-{ips['max']:,.0f}); every epoch: {ips['runs']}")
    r = summary["speedup_per_repeat"]
    print(f"FastLoader / DataLoader per repeat: {r['median']:.2f}x ({r['min']:.2f}-{r['max']:.2f}x; "
          f"of the medians {summary['speedup_of_medians']:.2f}x), target {target}x -> {'PASS' if summary['passed'] else 'FAIL'}")
    print("memory over epochs (RSS MB):", [r["rss_mb"] for r in mem["epochs"]], "anonymous:", [r["rss_anon_mb"] for r in mem["epochs"]],
          "threads:", [r["threads"] for r in mem["epochs"]], "open files:", [r["open_files"] for r in mem["epochs"]])
    print(f"wrote {out}/report.{{md,json,png}}, summary.json and memory.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
