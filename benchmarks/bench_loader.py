"""FastLoader against the torchvision DataLoader, side by side in one run, plus memory over epochs.

    .venv/bin/python benchmarks/bench_loader.py [--device cpu] [--images data/sample-images]

1. Makes the 3,000-image sample dataset if it is missing and packs it.
2. Throughput, full epochs, median of ``--repeats``: torchvision ``ImageFolder`` +
   RandomResizedCrop/RandomHorizontalFlip/ToTensor/Normalize in a ``DataLoader`` with
   ``num_workers`` = cores and persistent workers, against ``FastLoader`` on the same images,
   both producing 224x224 float32 normalized batches (``fastload.bench.run_bench``, loader only).
3. Memory: FastLoader for 5 epochs: host RSS (and GPU memory on CUDA), threads and open files
   after each epoch.

Writes ``benchmarks/results/loader-<device>/report.{md,json,png}`` and ``memory.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import fastload  # noqa: E402
from fastload.bench.runner import BenchConfig, default_loaders, run_bench  # noqa: E402

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
        "note": "RSS counts the shards' pages mapped by LMDB (file-backed, shared, reclaimable); RssAnon is the process's own memory.",
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--images", default=str(ROOT / "data" / "sample-images"))
    ap.add_argument("--packed", default=str(ROOT / "data" / "sample-packed"))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    images, packed = Path(a.images), Path(a.packed)
    if not images.exists():
        fastload.make_sample(images, num_images=3000, num_classes=10, seed=0)
    if not (packed / "manifest.json").exists():
        fastload.pack(images, packed, overwrite=True)
    out = Path(a.out) if a.out else ROOT / "benchmarks" / "results" / f"loader-{a.device.split(':')[0]}"
    cores = len(os.sched_getaffinity(0))
    cfg = BenchConfig(device=a.device, epochs=1, repeats=a.repeats, warmup=3, train_steps=0, workers=[cores])
    specs = [s for s in default_loaders(packed, str(images), cfg) if "packed+PIL" not in s["name"]]
    res = run_bench(packed, images=images, out=out, config=cfg, loaders=specs)
    mem = memory_over_epochs(packed, a.device)
    (out / "memory.json").write_text(json.dumps(mem, indent=1) + "\n")
    by_kind = {r["kind"]: r for r in res["loaders"]}
    base = by_kind["DataLoader"]["loader_only"]["images_per_s"]["median"]
    fast = by_kind["FastLoader"]["loader_only"]["images_per_s"]["median"]
    target = CPU_TARGET if a.device == "cpu" else GPU_TARGET
    ratio = fast / base
    print(f"DataLoader {base:,.0f} images/s, FastLoader {fast:,.0f} images/s: {ratio:.2f}x (target {target}x) "
          f"-> {'PASS' if ratio >= target else 'FAIL'}")
    print("memory over epochs (RSS MB):", [r["rss_mb"] for r in mem["epochs"]], "anonymous:", [r["rss_anon_mb"] for r in mem["epochs"]],
          "threads:", [r["threads"] for r in mem["epochs"]], "open files:", [r["open_files"] for r in mem["epochs"]])
    return 0


if __name__ == "__main__":
    sys.exit(main())
