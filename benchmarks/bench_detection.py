"""Detection loading, loader-only: fastload's DetectionLoader against torchvision's v2 detection pipeline in a DataLoader.

Usage::

    python benchmarks/bench_detection.py --images 300 --repeats 3 --out benchmarks/results/detection
    python benchmarks/bench_detection.py --crop iou       # + RandomIoUCrop and SanitizeBoundingBoxes
    python benchmarks/bench_detection.py --crop resized   # RandomResizedCrop(--size) with the boxes
    python benchmarks/bench_detection.py --crop iou --backend dali   # fastload's DALI graph (CPU here)

Makes a COCO-shaped sample (the built-in photos of ``fastload.make_sample``, 1-6 random
boxes per image drawn by a seeded generator, three categories), packs it with
``pack_coco``, then times one epoch per repeat of each loader, each in a process of its
own, the kinds interleaved (fastload, torchvision, fastload, ...), and reports the
medians. Both do the same work: decode, horizontal flip (p=0.5) with the boxes, resize
keeping the aspect ratio (shorter side ``--min-size``, longer at most ``--max-size``),
float 0..1 CHW images and XYXY float boxes. The DataLoader is torchvision's
``CocoDetection`` wrapped by ``wrap_dataset_for_transforms_v2``, ``v2.Compose([ToImage,
RandomHorizontalFlip, Resize(min_size, max_size=max_size), ToDtype(float32, scale=True)])``,
``num_workers`` = the cores, batches as lists (``collate_fn=lambda b: tuple(zip(*b))``,
as torchvision's detection references do).

``--crop iou``: fastload ``crop="iou"`` against ``v2.RandomIoUCrop()`` before the flip and
the resize, and ``v2.SanitizeBoundingBoxes()`` after (what fastload's sanitizing does).
``--crop resized``: fastload ``crop="resized", size=--size`` against
``v2.RandomResizedCrop(--size)`` (window, boxes clipped, resized to a square) and the
sanitizing; the aspect-keeping resize is then not done by either. The load average
(``/proc/loadavg``) before and after the run is written beside the numbers.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

log = logging.getLogger("bench_detection")


def make_coco(root: Path, n: int, seed: int) -> tuple[Path, Path]:
    """A COCO-shaped sample: photos and an instances.json of random boxes."""
    import numpy as np
    from PIL import Image

    import fastload

    photos = fastload.make_sample(root / "photos", num_images=n, num_classes=1, seed=seed)
    files = sorted(p for p in photos.rglob("*.jpg"))
    rng = np.random.default_rng(seed)
    images, anns = [], []
    for i, f in enumerate(files):
        with Image.open(f) as im:
            w, h = im.size
        images.append({"id": i + 1, "file_name": str(f.relative_to(photos)), "width": w, "height": h})
        for _ in range(int(rng.integers(1, 7))):
            bw, bh = rng.uniform(0.1, 0.5) * w, rng.uniform(0.1, 0.5) * h
            x, y = rng.uniform(0, w - bw), rng.uniform(0, h - bh)
            anns.append({"id": len(anns) + 1, "image_id": i + 1, "category_id": int(rng.integers(1, 4)),
                         "bbox": [x, y, bw, bh], "area": bw * bh, "iscrowd": 0})  # fmt: skip
    ann = root / "instances.json"
    ann.write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": c, "name": f"c{c}"} for c in (1, 2, 3)]}))
    return photos, ann


def run_one(kind: str, args: argparse.Namespace) -> float:
    """Images per second of one epoch of ``kind``, after one warm-up batch."""
    import torch

    torch.set_num_threads(1)
    if kind == "fastload":
        import fastload

        crop = {} if args.crop == "none" else {"crop": args.crop}
        if args.crop == "resized":
            crop["size"] = args.size
        loader = fastload.FastLoader(args.packed, args.batch_size, fields=("image", "boxes"), shuffle=True, flip=0.5,
                                     min_size=args.min_size, max_size=args.max_size, device="cpu", num_threads=os.cpu_count(),
                                     backend=args.backend, **crop)  # fmt: skip
    else:
        from torchvision import datasets
        from torchvision.transforms import v2

        if args.crop == "resized":
            steps = [v2.RandomResizedCrop(args.size), v2.RandomHorizontalFlip(0.5), v2.SanitizeBoundingBoxes()]
        else:
            steps = [v2.RandomIoUCrop()] if args.crop == "iou" else []
            steps += [v2.RandomHorizontalFlip(0.5), v2.Resize(args.min_size, max_size=args.max_size)]
            steps += [v2.SanitizeBoundingBoxes()] if args.crop == "iou" else []
        tf = v2.Compose([v2.ToImage(), *steps, v2.ToDtype(torch.float32, scale=True)])
        ds = datasets.wrap_dataset_for_transforms_v2(datasets.CocoDetection(args.photos, args.annotations, transforms=tf))
        loader = torch.utils.data.DataLoader(ds, args.batch_size, shuffle=True, num_workers=os.cpu_count(),
                                             collate_fn=_collate, persistent_workers=False)  # fmt: skip
    n, t0 = 0, None
    for images, targets in loader:
        if t0 is None:  # the first batch (worker start-up, pool start) is left out
            t0 = time.perf_counter()
            continue
        n += len(images)
        assert all(t["boxes"].shape[-1] == 4 for t in targets)
    return n / (time.perf_counter() - t0)


def _collate(batch):
    return tuple(zip(*batch))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--images", type=int, default=300)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--min-size", type=int, default=320)
    p.add_argument("--max-size", type=int, default=512)
    p.add_argument("--crop", choices=("none", "iou", "resized"), default="none")
    p.add_argument("--size", type=int, default=320, help="the square output of --crop resized")
    p.add_argument("--backend", choices=("pil", "dali"), default="pil", help="fastload's decoding path")
    p.add_argument("--work", default="/tmp/fastload-bench-detection")
    p.add_argument("--out", default="benchmarks/results/detection")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)
    p.add_argument("--packed", default=None, help=argparse.SUPPRESS)
    p.add_argument("--photos", default=None, help=argparse.SUPPRESS)
    p.add_argument("--annotations", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.one:
        print(json.dumps({"ips": run_one(args.one, args)}))
        return 0
    import fastload

    work = Path(args.work)
    photos, ann = work / "photos", work / "instances.json"
    packed = work / "packed"
    if not packed.exists():
        photos, ann = make_coco(work, args.images, seed=0)
        fastload.pack_coco(photos, packed, annotations=ann, progress=False)
    load_before = Path("/proc/loadavg").read_text().split()[:3]
    res: dict[str, list[float]] = {"fastload": [], "torchvision": []}
    for r in range(args.repeats):
        for kind in res:
            cmd = [sys.executable, __file__, "--one", kind, "--packed", str(packed), "--photos", str(photos), "--annotations", str(ann),
                   "--batch-size", str(args.batch_size), "--min-size", str(args.min_size), "--max-size", str(args.max_size),
                   "--crop", args.crop, "--size", str(args.size), "--backend", args.backend]  # fmt: skip
            out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
            res[kind].append(json.loads(out.strip().splitlines()[-1])["ips"])
            log.info("repeat %d %s: %.1f images/s", r, kind, res[kind][-1])
    med = {k: statistics.median(v) for k, v in res.items()}
    cpu = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
    model = next((line.split(":", 1)[1].strip() for line in cpu.splitlines() if line.startswith("Model name")), platform.processor())
    report = {"images": args.images, "batch_size": args.batch_size, "min_size": args.min_size, "max_size": args.max_size,
              "repeats": res, "median_images_per_s": med, "ratio_fastload_over_torchvision": med["fastload"] / med["torchvision"],
              "crop": args.crop, "size": args.size if args.crop == "resized" else None, "backend": args.backend,
              "nproc": os.cpu_count(), "cpu": model, "loadavg_before": load_before,
              "loadavg_after": Path("/proc/loadavg").read_text().split()[:3]}  # fmt: skip
    outdir = Path(args.out)
    outdir.mkdir(parents=True, exist_ok=True)
    name = "detection-cpu" + ("" if args.crop == "none" else f"-{args.crop}") + ("" if args.backend == "pil" else f"-{args.backend}")
    (outdir / f"{name}.json").write_text(json.dumps(report, indent=1) + "\n")
    log.info("medians: %s; fastload / torchvision = %.2fx; load %s -> %s", med, report["ratio_fastload_over_torchvision"],
             " ".join(load_before), " ".join(report["loadavg_after"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
