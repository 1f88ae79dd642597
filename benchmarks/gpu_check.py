"""One script for the lent GPU machine: correctness first, then speed.

Usage (see ../shared/gpu/README.md for carrying DALI over):
    python3 benchmarks/gpu_check.py [--images 10000] [--out $OUT]
    python3 benchmarks/gpu_check.py --cpu-dry-run --images 200   # the same steps on CPU

Steps:
 1. make N ImageNet-like JPEGs (about 500x375, q90, ~100 KB; smooth random textures,
    a few progressive, one EXIF-rotated) and pack them;
 2. correctness on CUDA: shapes, dtypes, labels, no NaN/Inf; eval-mode outputs equal to
    the CPU pipeline within tolerance; the EXIF-rotated image decodes upright; training
    crops are the same boxes as on CPU (compared on the uint8 path);
 3. speed, side by side in this run, median of repeats: FastLoader(cuda) images/s against a
    torchvision ImageFolder DataLoader with ``num_workers`` = cores (persistent, pinned), both
    producing 224x224 float32 normalized batches on the GPU; plus hw_decoder_load variants;
 4. memory: host RSS and GPU memory over 5 epochs.
Prints a short table last and writes details to ``--out/gpu_check.json``.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def _texture(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """A smooth, photo-like RGB texture (low-frequency noise plus detail)."""
    small = rng.integers(0, 256, size=(h // 16 + 2, w // 16 + 2, 3)).astype(np.uint8)
    from PIL import Image

    base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), dtype=np.float32)
    detail = rng.normal(0, 12, size=(h, w, 3)).astype(np.float32)
    return np.clip(base + detail, 0, 255).astype(np.uint8)


def _write(args: tuple[str, int, int, int]) -> int:
    from PIL import Image

    root, start, stop, classes = args
    written = 0
    for i in range(start, stop):
        rng = np.random.default_rng(i)
        w, h = int(rng.integers(420, 560)), int(rng.integers(320, 420))
        label = i % classes
        img = Image.fromarray(_texture(rng, w, h))
        d = Path(root) / f"class_{label:02d}"
        d.mkdir(parents=True, exist_ok=True)
        kw = {"quality": 90, "progressive": i % 25 == 0}
        if i == 0:  # EXIF-rotated (orientation 6): must come out upright exactly once
            exif = Image.Exif()
            exif[0x0112] = 6
            kw["exif"] = exif
        img.save(d / f"img_{i:06d}.jpg", **kw)
        written += 1
    return written


def make_images(root: Path, n: int, classes: int = 10) -> None:
    if root.exists() and sum(1 for _ in root.rglob("*.jpg")) == n:
        return
    workers = os.cpu_count() or 1
    step = -(-n // workers)
    with ProcessPoolExecutor(workers) as ex:
        list(ex.map(_write, [(str(root), s, min(n, s + step), classes) for s in range(0, n, step)]))


def machine() -> dict:
    import torch

    info = {"python": platform.python_version(), "torch": torch.__version__, "cores": os.cpu_count()}
    try:
        import nvidia.dali as dali

        info["dali"] = dali.__version__
    except ImportError:
        info["dali"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}"
    with open("/proc/cpuinfo") as f:
        info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    return info


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def check_correctness(packed: Path, device: str, results: dict) -> None:
    import torch
    from fastload import FastLoader

    from PIL import Image

    # 1. training batches: shapes, dtypes, labels, finite
    with FastLoader(packed, 64, device=device, seed=0) as loader:
        labels_seen = 0
        for b, (x, y) in enumerate(loader):
            assert x.shape[1:] == (3, 224, 224) and x.dtype == torch.float32 and x.device.type == device.split(":")[0]
            assert y.dtype == torch.int64 and torch.isfinite(x).all()
            labels_seen += len(y)
            if b == 10:
                break
    # 2. eval mode: CUDA equals CPU within tolerance (nvJPEG vs libjpeg-turbo IDCT differ by a little)
    diffs = []
    kw = dict(train=False, shuffle=False, mean=None, std=None)
    with FastLoader(packed, 32, device=device, **kw) as g, FastLoader(packed, 32, device="cpu", **kw) as c:
        for b, ((xg, yg), (xc, yc)) in enumerate(zip(g, c)):
            assert torch.equal(yg.cpu(), yc)
            diffs.append((xg.cpu().float() - xc.float()).abs().mean().item())
            if b == 5:
                break
    results["eval_mean_abs_diff_cuda_vs_cpu"] = max(diffs)
    assert max(diffs) < 2.0, f"eval outputs differ from CPU by {max(diffs):.2f} on average"
    # 3. training crops: the same boxes on both devices (compare uint8 outputs)
    kw = dict(train=True, shuffle=True, seed=3, mean=None, std=None)
    with FastLoader(packed, 32, device=device, **kw) as g, FastLoader(packed, 32, device="cpu", **kw) as c:
        (xg, yg), (xc, yc) = next(iter(g)), next(iter(c))
        d = (xg.cpu().float() - xc.float()).abs().mean().item()
    results["train_mean_abs_diff_cuda_vs_cpu"] = d
    assert torch.equal(yg.cpu(), yc) and d < 3.0, f"training crops differ between devices ({d:.2f})"
    # 4. the EXIF-rotated sample 0 is upright: compare with PIL's exif_transpose of the source
    import fastload

    ds = fastload.Dataset(packed)
    h = ds.header(0)
    results["exif_sample_stored_size"] = [h.width, h.height]
    with FastLoader(packed, 1, device=device, train=False, shuffle=False, mean=None, std=None, crop=224) as g:
        x, _ = next(iter(g))
    src = Image.open(packed.parent / "images" / ds.source_path(0))  # paths are stored relative to SRC
    from PIL import ImageOps

    ref = ImageOps.exif_transpose(src).convert("RGB")
    w, hh = ref.size
    ref = ref.resize((int(256 * w / hh), 256) if w > hh else (256, int(256 * hh / w)), Image.BILINEAR)
    l, t = (ref.width - 224) // 2, (ref.height - 224) // 2
    ref_a = np.asarray(ref.crop((l, t, l + 224, t + 224)), dtype=np.float32)
    got = x[0].permute(1, 2, 0).cpu().numpy().astype(np.float32)
    results["exif_mean_abs_diff"] = float(np.abs(got - ref_a).mean())
    assert results["exif_mean_abs_diff"] < 6.0, "EXIF-rotated image is not upright (or rotated twice)"
    results["correctness"] = "ok"


def time_fastload(packed: Path, device: str, repeats: int, **kw) -> tuple[list[float], dict]:
    import torch
    from fastload import FastLoader

    rates, mem = [], {"rss_mb": [], "gpu_mb": []}
    with FastLoader(packed, 256, device=device, **kw) as loader:
        for epoch in range(repeats + 1):
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            t = time.perf_counter()
            n = 0
            for x, y in loader:
                n += len(y)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            dt = time.perf_counter() - t
            if epoch:  # epoch 0 warms up (nvJPEG buffers, page cache)
                rates.append(n / dt)
            mem["rss_mb"].append(round(rss_mb(), 1))
            if device.startswith("cuda"):
                mem["gpu_mb"].append(round(torch.cuda.memory_allocated() / 2**20, 1))
    return rates, mem


def time_dataloader(src: Path, device: str, repeats: int, workers: int) -> list[float]:
    import torch
    from torchvision import datasets, transforms

    tf = transforms.Compose(
        [
            transforms.RandomResizedCrop(224),
            transforms.RandomHorizontalFlip(),
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ]
    )
    ds = datasets.ImageFolder(str(src), transform=tf)
    dl = torch.utils.data.DataLoader(
        ds, batch_size=256, shuffle=True, num_workers=workers, persistent_workers=True,
        pin_memory=device.startswith("cuda"), prefetch_factor=4,
    )
    rates = []
    for epoch in range(repeats + 1):
        t = time.perf_counter()
        n = 0
        for x, y in dl:
            x = x.to(device, non_blocking=True)
            y = y.to(device, non_blocking=True)
            n += len(y)
        if device.startswith("cuda"):
            torch.cuda.synchronize()
        if epoch:
            rates.append(n / (time.perf_counter() - t))
    return rates


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=10000)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--work", default="/tmp/fastload-gpu")
    ap.add_argument("--out", default=os.environ.get("OUT", "benchmarks/results"))
    ap.add_argument("--cpu-dry-run", action="store_true", help="run every step on CPU (to test this script)")
    a = ap.parse_args(argv)
    import torch
    import fastload

    device = "cpu" if a.cpu_dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device: use --cpu-dry-run", file=sys.stderr)
        return 2
    work = Path(a.work)
    t0 = time.perf_counter()
    make_images(work / "images", a.images)
    t1 = time.perf_counter()
    fastload.pack(work / "images", work / "packed", overwrite=True, progress=False)
    t2 = time.perf_counter()
    results: dict = {"machine": machine(), "images": a.images, "make_s": round(t1 - t0, 1), "pack_s": round(t2 - t1, 1)}
    print(f"made {a.images} images in {t1 - t0:.0f}s, packed in {t2 - t1:.0f}s", flush=True)
    check_correctness(work / "packed", device, results)
    print(f"correctness ok: {json.dumps({k: v for k, v in results.items() if 'diff' in k})}", flush=True)

    cores = os.cpu_count() or 1
    table = []
    dl = time_dataloader(work / "images", device, a.repeats, workers=cores)
    table.append(("DataLoader (torchvision, %d workers)" % cores, statistics.median(dl), dl))
    print(f"DataLoader: {statistics.median(dl):.0f} img/s", flush=True)
    variants = [("FastLoader", {})]
    if device == "cuda":
        variants += [("FastLoader hw_decoder_load=0", {"hw_decoder_load": 0.0}), ("FastLoader hw_decoder_load=1", {"hw_decoder_load": 1.0})]
    for name, kw in variants:
        rates, mem = time_fastload(work / "packed", device, a.repeats if kw == {} else 1, **kw)
        table.append((name, statistics.median(rates), rates))
        if not kw:
            results["memory_over_epochs"] = mem
        print(f"{name}: {statistics.median(rates):.0f} img/s", flush=True)
    # the 5-epoch memory curve
    _, mem5 = time_fastload(work / "packed", device, 4)
    results["memory_5_epochs"] = mem5
    base = table[0][1]
    results["table"] = [{"loader": n, "images_per_s": round(m, 1), "runs": [round(r, 1) for r in rs], "ratio": round(m / base, 2)} for n, m, rs in table]
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / ("gpu_check.json" if device == "cuda" else "gpu_check-cpu-dry-run.json")).write_text(json.dumps(results, indent=1))
    print(f"\n{'loader':42s} {'img/s':>9s} {'x base':>7s}")
    for n, m, _ in table:
        print(f"{n:42s} {m:9.0f} {m / base:7.2f}")
    print(f"memory over 5 epochs: {mem5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
