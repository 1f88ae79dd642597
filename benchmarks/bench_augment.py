"""FastLoader against DataLoader with the same heavy torchvision training transform, side by side in one run.

    .venv/bin/python benchmarks/bench_augment.py [--images data/sample-images] [--repeats 3] [--transform ta|deit]

The transform is what torchvision's references build for ``--auto-augment ta_wide
--random-erase 0.25 --interpolation bicubic``: RandomResizedCrop(224, bicubic), flip,
TrivialAugmentWide, PILToTensor, ConvertImageDtype, Normalize, RandomErasing(0.25). Each
measurement is one full epoch of one loader in a process of its own (two loaders in one
process disturb each other's timings), the loaders taking turns within each repeat:
``DataLoader(ImageFolder(transform), batch_size=64, num_workers=<cores>)`` against
``fastload.FastLoader(ImageFolder(transform), 64, device=<device>)`` (the literal swap;
FastLoader's first epoch of the run packs the folder into its cache, so each of its processes
first reads one warm-up epoch). ``--transform deit`` measures DeiT's default training transform
instead: ``timm.data.create_transform(224, is_training=True, color_jitter=0.3,
auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic", re_prob=0.25, re_mode="pixel")``.
Writes ``benchmarks/results/augment-<device>-<machine>.{md,json}`` (``augment-deit-...`` for DeiT's):
every epoch's images/s, medians with min-max, and FastLoader / DataLoader per repeat.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, os, sys, time, torch
sys.path.insert(0, {root!r})
from torchvision import datasets, transforms as T
from torchvision.transforms import InterpolationMode
import fastload
if {transform!r} == "deit":
    from timm.data import create_transform
    tf = create_transform(224, is_training=True, color_jitter=0.3, auto_augment="rand-m9-mstd0.5-inc1",
                          interpolation="bicubic", re_prob=0.25, re_mode="pixel", re_count=1)
else:
    tf = T.Compose([
        T.RandomResizedCrop(224, interpolation=InterpolationMode.BICUBIC), T.RandomHorizontalFlip(),
        T.TrivialAugmentWide(), T.PILToTensor(), T.ConvertImageDtype(torch.float),
        T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), T.RandomErasing(0.25),
    ])
ds = datasets.ImageFolder({images!r}, transform=tf)
if {kind!r} == "fastload":
    loader = fastload.FastLoader(ds, 64, shuffle=True, device={device!r}, cache_dir={cache!r}, progress=False)
    for _ in loader:  # warm-up epoch (the pipeline, the page cache)
        pass
else:
    loader = torch.utils.data.DataLoader(ds, 64, shuffle=True, num_workers={workers}, persistent_workers=True)
    for _ in loader:
        pass
t = time.perf_counter()
n = 0
for x, y in loader:
    n += len(y)
if {device!r}.startswith("cuda"):
    torch.cuda.synchronize()
print(json.dumps({{"images": n, "seconds": time.perf_counter() - t}}))
"""


def _epoch(kind: str, images: str, device: str, cache: str, workers: int, transform: str = "ta") -> float:
    code = CHILD.format(root=str(ROOT), images=images, kind=kind, device=device, cache=cache, workers=workers,
                        transform=transform)  # fmt: skip
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    r = json.loads(out.stdout.strip().splitlines()[-1])
    return r["images"] / r["seconds"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", default=str(ROOT / "data" / "sample-images"))
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default=str(ROOT / "data" / "bench-cache"))
    ap.add_argument("--out", default=None)
    ap.add_argument("--transform", choices=("ta", "deit"), default="ta")
    a = ap.parse_args()
    workers = len(os.sched_getaffinity(0))
    runs: dict[str, list[float]] = {"DataLoader": [], "FastLoader": []}
    ratios = []
    for r in range(a.repeats):
        order = ["DataLoader", "FastLoader"] if r % 2 == 0 else ["FastLoader", "DataLoader"]  # turns at going first
        got = {}
        for name in order:
            got[name] = _epoch("fastload" if name == "FastLoader" else "torch", a.images, a.device, a.cache, workers,
                               a.transform)  # fmt: skip
            runs[name].append(got[name])
            print(f"repeat {r + 1}: {name} {got[name]:.0f} images/s", flush=True)
        ratios.append(got["FastLoader"] / got["DataLoader"])
    cpu = next((ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name")), platform.processor())
    def spread(v, d=0):
        return f"{statistics.median(v):,.{d}f} ({min(v):,.{d}f}–{max(v):,.{d}f})"
    summary = {
        "machine": f"{cpu}, {workers} cores", "device": a.device, "python": platform.python_version(),
        "images": a.images, "repeats": a.repeats, "images_per_s": runs, "ratio_per_repeat": ratios,
        "transform": a.transform, "load_average_at_end": os.getloadavg(),
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    if a.transform == "deit":
        title = "DeiT's default training transform"
        what = ("timm `create_transform(224, is_training=True, color_jitter=0.3, auto_augment='rand-m9-mstd0.5-inc1', "
                "interpolation='bicubic', re_prob=0.25, re_mode='pixel', re_count=1)`: RandomResizedCropAndInterpolation "
                "(bicubic), flip, timm's RandAugment, MaybeToTensor, Normalize, timm's RandomErasing (pixel noise).")
    else:
        title = "TrivialAugmentWide + RandomErasing + bicubic"
        what = ("torchvision's references, `--auto-augment ta_wide --random-erase 0.25 --interpolation bicubic`: "
                "RandomResizedCrop(224, bicubic), RandomHorizontalFlip, TrivialAugmentWide, PILToTensor, "
                "ConvertImageDtype(float), Normalize, RandomErasing(0.25).")
    load = ", ".join(f"{v:.1f}" for v in summary["load_average_at_end"])
    md = f"""# {title}: FastLoader against DataLoader

Machine: {summary['machine']}; device {a.device}; Python {summary['python']}; {summary['created']}; load average
at the end {load} (other processes share these cores: read the spread).
Transform: {what} Batches of 64, one full epoch per
measurement, each in its own process, the loaders taking turns at going first; {a.repeats} repeats.

| loader | images/s, median (min–max) |
|---|---:|
| `DataLoader(ImageFolder(transform), num_workers={workers})` | {spread(runs['DataLoader'])} |
| `FastLoader(ImageFolder(transform), device="{a.device}")` | {spread(runs['FastLoader'])} |
| FastLoader / DataLoader, per repeat | {spread(ratios, 2)}× |
"""
    kind = "" if a.transform == "ta" else f"{a.transform}-"
    tag = a.out or str(ROOT / "benchmarks" / "results" / f"augment-{kind}{a.device.split(':')[0]}-{workers}cpu")
    Path(tag + ".json").write_text(json.dumps(summary, indent=1) + "\n")
    Path(tag + ".md").write_text(md)
    print(md)


if __name__ == "__main__":
    main()
