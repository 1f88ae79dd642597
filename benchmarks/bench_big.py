"""Big photos on the CPU training path: reduced-scale decoding against full scale, PIL's draft() and --max-size.

    .venv/bin/python benchmarks/bench_big.py [--images 60] [--epochs 3] [--repeats 3]

On ``--images`` generated 3000x2000 JPEGs (quality 90, about 1 MB: colour gradients, soft
waves and pixel noise, cached under ``data/big/``), packed as they are and with
``--max-size 512``, it measures training epochs (RandomResizedCrop 224 + flip + normalise,
batch 32), interleaved, ``--repeats`` times each:

| row | what |
|---|---|
| `fastload full-scale` | ``FastLoader(device="cpu")`` with ``fastload.host.REDUCED_SCALE_RATIO = inf``: DALI decodes every crop window at full scale (before) |
| `fastload reduced` | ``FastLoader(device="cpu")`` as shipped: windows >= 2 x 224 on both sides decoded at 1/2..1/8 scale |
| `PIL draft DataLoader` | ``torch.utils.data.DataLoader`` (one worker per core) over the JPEG files: PIL ``draft("RGB", (448, 448))``, torchvision ``RandomResizedCrop`` etc. |
| `fastload --max-size 512` | ``FastLoader(device="cpu")`` on the pack made with ``--max-size 512`` |

Images/s count the images after each run's first batch (pipeline builds and worker starts
excluded), over ``--epochs`` epochs. It also compares the two fastload paths' pixels (same
seed, uint8 output): PSNR and worst-channel mean |diff| per image. The machine is shared:
it waits until the 1-minute load average is below ``--max-load`` before each measurement.

Writes ``benchmarks/results/big-images-<machine>.json`` and ``.md``.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

CROP = 224
BATCH = 32


def photo(w: int, h: int, seed: int) -> bytes:
    """A 3000x2000-class JPEG with detail at every scale (gradients, waves, noise), quality 90."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    img = np.empty((h, w, 3), dtype=np.float32)
    for c in range(3):
        img[..., c] = 128 + 60 * (xx / w - 0.5) * (c - 1) + 40 * (yy / h - 0.5)
        for _ in range(5):
            fx, fy = rng.uniform(1, 60, 2)
            img[..., c] += rng.uniform(8, 30) * np.sin(2 * np.pi * (xx / w * fx + yy / h * fy) + rng.uniform(0, 6.3))
    img += rng.normal(0, 4, img.shape).astype(np.float32)
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def prepare(data: Path, n: int) -> tuple[Path, Path, Path]:
    import fastload

    src = data / f"src-{n}"
    if not src.exists():
        tmp = data / f"src-{n}.tmp"
        for i in range(n):
            p = tmp / f"class_{i % 4}" / f"{i:04d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_bytes(photo(3000, 2000, i))
        tmp.rename(src)
    full, small = data / f"packed-{n}", data / f"packed-{n}-512"
    if not full.exists():
        fastload.pack(src, full, progress=False)
    if not small.exists():
        fastload.pack(src, small, max_size=512, progress=False)
    return src, full, small


def wait_for_quiet(max_load: float) -> float:
    while True:
        load = os.getloadavg()[0]
        if load < max_load:
            return load
        time.sleep(5)


def run_fastload(packed: Path, epochs: int, *, reduced: bool) -> float:
    import fastload
    import fastload.host

    fastload.host.REDUCED_SCALE_RATIO = 2.0 if reduced else math.inf
    try:
        with fastload.FastLoader(packed, BATCH, device="cpu", crop=CROP, seed=0, progress=False) as loader:
            t0, n = None, 0
            for epoch in range(epochs):
                loader.set_epoch(epoch)
                for x, _ in loader:
                    if t0 is None:
                        t0 = time.perf_counter()
                    else:
                        n += x.shape[0]
        return n / (time.perf_counter() - t0)
    finally:
        fastload.host.REDUCED_SCALE_RATIO = 2.0


class DraftFolder:
    """An ImageFolder-like dataset that decodes with PIL's draft() (DCT scaling) before RandomResizedCrop."""

    def __init__(self, root: Path) -> None:
        import torchvision.transforms as T

        self.files = sorted(root.rglob("*.jpg"))
        self.tf = T.Compose([
            T.RandomResizedCrop(CROP), T.RandomHorizontalFlip(), T.ToTensor(),
            T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ])  # fmt: skip

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        from PIL import Image

        with Image.open(self.files[i]) as im:
            im.draft("RGB", (2 * CROP, 2 * CROP))
            return self.tf(im.convert("RGB")), 0


def run_pil(src: Path, epochs: int) -> float:
    import torch

    ds = DraftFolder(src)
    sampler = torch.utils.data.RandomSampler(ds, num_samples=len(ds) * epochs, generator=torch.Generator().manual_seed(0))
    dl = torch.utils.data.DataLoader(ds, BATCH, sampler=sampler, num_workers=os.cpu_count() or 1)
    t0, n = None, 0
    for x, _ in dl:
        if t0 is None:
            t0 = time.perf_counter()
        else:
            n += x.shape[0]
    return n / (time.perf_counter() - t0)


def compare_pixels(packed: Path) -> dict:
    """Reduced against full scale, same seed, uint8: PSNR and worst-channel mean |diff| per image."""
    import fastload
    import fastload.host

    out = {}
    for reduced in (False, True):
        fastload.host.REDUCED_SCALE_RATIO = 2.0 if reduced else math.inf
        with fastload.FastLoader(packed, BATCH, device="cpu", crop=CROP, seed=0, mean=None, std=None, progress=False) as loader:
            out[reduced] = np.concatenate([x.numpy() for x, _ in loader]).astype(np.float64)
    fastload.host.REDUCED_SCALE_RATIO = 2.0
    diff = out[True] - out[False]
    mse = (diff**2).mean(axis=(1, 2, 3))
    psnr = [10 * math.log10(255.0**2 / m) if m else math.inf for m in mse.tolist()]
    worst_mean = np.abs(diff).mean(axis=(2, 3)).max(axis=1)
    return {
        "images": len(psnr),
        "psnr_db": {"min": min(psnr), "median": statistics.median(psnr), "max": max(psnr)},
        "worst_channel_mean_abs": {"median": float(np.median(worst_mean)), "max": float(worst_mean.max())},
        "max_abs": float(np.abs(diff).max()),
    }


def machine() -> dict:
    import PIL
    import nvidia.dali
    import torch

    cpu = platform.processor()
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
    return {
        "cpu": cpu, "cores": os.cpu_count(), "ram_gb": round(mem / 1e6, 1), "python": platform.python_version(),
        "kernel": platform.release(), "dali": nvidia.dali.__version__, "torch": torch.__version__,
        "pillow": PIL.__version__ + " (pillow-simd)", "numpy": np.__version__,
    }  # fmt: skip


def report(res: dict) -> str:
    m = res["machine"]
    rows = res["rows"]
    base = statistics.median(rows["fastload full-scale"])
    lines = [
        "# Big photos on the CPU training path: reduced-scale decoding",
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['ram_gb']} GB RAM, Linux {m['kernel']}, Python {m['python']}, "
        f"DALI {m['dali']}, torch {m['torch']}, Pillow {m['pillow']}. Page cache warm.",
        "",
        f"Data: {res['images']} generated 3000x2000 JPEGs (quality 90, {res['mean_file_kb']:.0f} KB on average), "
        f"RandomResizedCrop {CROP} + flip + normalise, batch {BATCH}, {res['epochs']} epochs per run, images/s "
        f"after each run's first batch; {res['repeats']} runs each, interleaved; 1-minute load average before "
        f"each run {min(res['loads']):.2f}-{max(res['loads']):.2f}.",
        "",
        "| row | images/s (median) | runs | vs full scale |",
        "|---|---:|---|---:|",
    ]
    for name, v in rows.items():
        lines.append(f"| {name} | {statistics.median(v):.1f} | {', '.join(f'{x:.1f}' for x in v)} | {statistics.median(v) / base:.2f}x |")
    px = res["pixels"]
    lines += [
        "",
        f"Pixels, reduced against full scale (same seed, uint8, {px['images']} images): PSNR "
        f"{px['psnr_db']['min']:.1f} dB (min), {px['psnr_db']['median']:.1f} dB (median); worst channel's mean "
        f"|diff| {px['worst_channel_mean_abs']['median']:.2f} (median), {px['worst_channel_mean_abs']['max']:.2f} "
        f"(max) levels of 255; largest single difference {px['max_abs']:.0f}.",
        "",
        "Command: `.venv/bin/python benchmarks/bench_big.py` "
        f"(`--images {res['images']} --epochs {res['epochs']} --repeats {res['repeats']}`).",
    ]
    return "\n".join(lines) + "\n"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=60)
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--max-load", type=float, default=2.0)
    ap.add_argument("--data", type=Path, default=ROOT / "data" / "big")
    ap.add_argument("--machine", default=None)
    args = ap.parse_args()
    src, full, small = prepare(args.data, args.images)
    rows: dict[str, list[float]] = {"fastload full-scale": [], "fastload reduced": [], "PIL draft DataLoader": [], "fastload --max-size 512": []}
    loads = []
    for _ in range(args.repeats):
        for name in rows:
            loads.append(wait_for_quiet(args.max_load))
            if name == "fastload full-scale":
                v = run_fastload(full, args.epochs, reduced=False)
            elif name == "fastload reduced":
                v = run_fastload(full, args.epochs, reduced=True)
            elif name == "PIL draft DataLoader":
                v = run_pil(src, args.epochs)
            else:
                v = run_fastload(small, args.epochs, reduced=True)
            rows[name].append(v)
            print(f"{name}: {v:.1f} images/s", flush=True)
    res = {
        "machine": machine(), "images": args.images, "epochs": args.epochs, "repeats": args.repeats, "loads": loads,
        "mean_file_kb": statistics.mean(p.stat().st_size for p in src.rglob("*.jpg")) / 1e3,
        "rows": rows, "pixels": compare_pixels(full),
    }  # fmt: skip
    name = args.machine or f"{res['machine']['cores']}cpu-" + "-".join(res["machine"]["cpu"].lower().split()[:2])
    out = ROOT / "benchmarks" / "results"
    (out / f"big-images-{name}.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / f"big-images-{name}.md").write_text(report(res))
    print(report(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
