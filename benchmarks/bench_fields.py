"""FastLoader(fields=...) against webdataset.WebLoader on a WebDataset version of the sample, side by side.

    .venv/bin/python benchmarks/bench_fields.py [--images data/sample-images] [--repeats 3]

1. Writes the sample images (``--images``, an ImageFolder tree; made with
   ``fastload.make_sample`` if missing) as WebDataset tar shards with ``webdataset.TarWriter``:
   per sample ``jpg`` (the file's bytes), ``txt`` (a caption naming its class and index) and
   ``cls``; then packs them with ``fastload.pack_webdataset``.
2. Each measurement runs in a process of its own, loaders interleaved within every repeat:
   ``fastload``: ``FastLoader(packed, 64, fields=("image", "txt", "label"), device=...)``
   (RandomResizedCrop(224) + flip + normalize, its defaults); ``webloader``: the tars through
   ``wds.WebDataset(...).shuffle(1000).decode("pil").to_tuple("jpg", "txt", "cls")
   .map_tuple(transform, ...).batched(64)`` in ``wds.WebLoader(batch_size=None,
   num_workers=cores)``, as webdataset's docs recommend, transform = torchvision's
   RandomResizedCrop(224), RandomHorizontalFlip, ToTensor, Normalize. Both yield images,
   captions and labels for every sample.
3. Modes: ``loader`` (iterate only) and ``train`` (the SmallCNN of ``fastload.bench.models``:
   forward, cross-entropy, backward, SGD step per batch). Each process runs one untimed warm-up
   epoch, then one timed epoch; images/s is the median over repeats, with the min-max spread, and
   the speed-up the median of the per-repeat ratios.

Writes ``benchmarks/results/fields/report.md`` and ``results.json``. ``--kinds
fastload,fastload-plain --modes loader`` measures instead what the captions cost: the same
FastLoader with ``fields=`` against it without (``[images, labels]`` batches), written under
``benchmarks/results/fields/fastload-vs-fastload-plain/``.
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
sys.path.insert(0, str(ROOT))

BATCH = 64
TARGET = 1.3


def write_tars(images: Path, tars: Path, shards: int = 8) -> list[str]:
    """The ImageFolder tree as ``shards`` WebDataset tars (kept if already there)."""
    import webdataset as wds

    paths = [str(tars / f"{s:05d}.tar") for s in range(shards)]
    if all(os.path.exists(p) for p in paths):
        return paths
    tars.mkdir(parents=True, exist_ok=True)
    classes = sorted(d.name for d in images.iterdir() if d.is_dir())
    files = [(c, f) for c in range(len(classes)) for f in sorted((images / classes[c]).iterdir())]
    per = -(-len(files) // shards)
    for s in range(shards):
        with wds.TarWriter(paths[s]) as w:
            for k, (c, f) in enumerate(files[s * per : (s + 1) * per], s * per):
                w.write({"__key__": f"{k:06d}", "jpg": f.read_bytes(), "txt": f"a photo of a {classes[c]}, number {k}", "cls": str(c)})
    return paths


def _fastload(packed: str, device: str, seed: int, fields: bool = True):
    import fastload

    if not fields:  # the same dataset as [images, labels] batches: what reading the captions costs
        return _Plain(fastload.FastLoader(packed, BATCH, device=device, seed=seed))
    return fastload.FastLoader(packed, BATCH, fields=("image", "txt", "label"), device=device, seed=seed)


class _Plain:
    """A FastLoader without fields, its batches given an empty caption each (for the same loop)."""

    def __init__(self, loader) -> None:
        self.loader = loader

    def __iter__(self):
        for images, labels in self.loader:
            yield images, [""] * len(labels), labels

    def close(self) -> None:
        self.loader.close()


def _webloader(tars: list[str], seed: int):
    import torch
    import torchvision.transforms as T
    import webdataset as wds

    tf = T.Compose([T.RandomResizedCrop(224), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))])
    torch.manual_seed(seed)
    ds = (
        wds.WebDataset(tars, shardshuffle=len(tars), seed=seed, workersplitter=wds.split_by_worker)
        .shuffle(1000)
        .decode("pil")
        .to_tuple("jpg", "txt", "cls")
        .map_tuple(tf, lambda t: t, lambda c: c)
        .batched(BATCH, partial=True)
    )
    return wds.WebLoader(ds, batch_size=None, num_workers=len(os.sched_getaffinity(0)))


def one(kind: str, mode: str, packed: str, tars: list[str], device: str, seed: int, classes: int) -> dict:
    """One process's measurement: a warm-up epoch, then a timed one."""
    import torch

    from fastload.bench.models import SmallCNN

    if kind == "webloader":
        loader = _webloader(tars, seed)
    else:
        loader = _fastload(packed, device, seed, fields=kind == "fastload")
    model = SmallCNN(classes).to(device) if mode == "train" else None
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9) if model is not None else None
    crit = torch.nn.CrossEntropyLoss()

    def epoch() -> tuple[int, int]:
        n = chars = 0
        for images, txt, labels in loader:
            labels = torch.as_tensor(labels).to(device)
            n += len(images)
            chars += sum(len(t) for t in txt)  # captions arrive with their images
            if model is not None:
                loss = crit(model(images.to(device)), labels)
                opt.zero_grad()
                loss.backward()
                opt.step()
        return n, chars

    epoch()
    t = time.perf_counter()
    n, chars = epoch()
    dt = time.perf_counter() - t
    if hasattr(loader, "close"):
        loader.close()
    return {"kind": kind, "mode": mode, "images": n, "caption_chars": chars, "seconds": dt, "images_per_s": n / dt}


def machine() -> dict:
    model = ""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        model = next((ln.split(":", 1)[1].strip() for ln in out.splitlines() if ln.startswith("Model name")), "")
    except OSError:
        pass
    import torch
    import webdataset

    return {"nproc": len(os.sched_getaffinity(0)), "cpu": model, "python": platform.python_version(), "torch": torch.__version__,
            "webdataset": webdataset.__version__}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", default=str(ROOT / "data" / "sample-images"))
    ap.add_argument("--work", default="/tmp/bench-fields")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--modes", default="loader,train")
    ap.add_argument("--kinds", default="fastload,webloader", help="fastload, webloader, fastload-plain (no fields=)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fields"))
    ap.add_argument("--one", nargs=5, metavar=("KIND", "MODE", "SEED", "CLASSES", "ARGS_JSON"), help=argparse.SUPPRESS)
    a = ap.parse_args()
    work = Path(a.work)
    if a.one:
        kind, mode, seed, classes, extra = a.one
        e = json.loads(extra)
        print(json.dumps(one(kind, mode, e["packed"], e["tars"], a.device, int(seed), int(classes))))
        return
    import fastload

    images = Path(a.images)
    if not images.is_dir():
        fastload.make_sample(images)
    tars = write_tars(images, work / "tars")
    packed = work / "packed"
    if not (packed / "manifest.json").exists():
        fastload.pack_webdataset(work / "tars", packed, progress=False)
    classes = len(fastload.Dataset(packed).classes)
    extra = json.dumps({"packed": str(packed), "tars": tars})
    runs = []
    for r in range(a.repeats):
        for mode in a.modes.split(","):
            for kind in a.kinds.split(","):
                cmd = [sys.executable, __file__, "--device", a.device, "--one", kind, mode, str(r), str(classes), extra]
                out = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(ROOT)})
                if out.returncode != 0:
                    raise SystemExit(f"{kind} {mode} failed:\n{out.stderr[-3000:]}")
                row = {**json.loads(out.stdout.strip().splitlines()[-1]), "repeat": r}
                runs.append(row)
                print(f"repeat {r} {mode:6s} {kind:9s} {row['images_per_s']:7.1f} images/s ({row['images']} images)", flush=True)
    summary = {}
    for mode in a.modes.split(","):
        kinds = a.kinds.split(",")
        by = {k: [x["images_per_s"] for x in runs if x["mode"] == mode and x["kind"] == k] for k in kinds}
        ratios = [f / w for f, w in zip(by[kinds[0]], by[kinds[1]])]
        summary[mode] = {
            **{k: {"median": statistics.median(v), "min": min(v), "max": max(v)} for k, v in by.items()},
            "speedup": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios), "per_repeat": ratios},
        }
    res = {"machine": machine(), "device": a.device, "batch": BATCH, "images": runs[0]["images"], "summary": summary, "runs": runs,
           "when": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())}  # fmt: skip
    out = Path(a.out) if a.kinds == "fastload,webloader" else Path(a.out) / a.kinds.replace(",", "-vs-")
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(res, indent=1) + "\n")
    lines = [
        f"# {' vs '.join(a.kinds.split(','))} ({a.device}, {res['when']})",
        "",
        f"Machine: {res['machine']['nproc']} CPUs ({res['machine']['cpu']}), torch {res['machine']['torch']}, "
        f"webdataset {res['machine']['webdataset']}. Shared with other jobs while measuring: the numbers are noisy.",
        f"{res['images']} images (the 3,000-image sample as 8 WebDataset tars, jpg + txt caption + cls), batches of {BATCH}, "
        "224x224 RandomResizedCrop + flip + normalize; each cell a separate process (warm-up epoch, then a timed epoch); "
        f"{a.repeats} interleaved repeats, medians (min-max).",
        "",
        f"| mode | {a.kinds.split(',')[0]} images/s | {a.kinds.split(',')[1]} images/s | ratio |",
        "|---|---|---|---|",
    ]
    for mode, s in summary.items():
        f, w, sp = s[a.kinds.split(",")[0]], s[a.kinds.split(",")[1]], s["speedup"]
        lines.append(f"| {mode} | {f['median']:.0f} ({f['min']:.0f}-{f['max']:.0f}) | {w['median']:.0f} ({w['min']:.0f}-{w['max']:.0f}) | "
                     f"{sp['median']:.2f}x ({sp['min']:.2f}-{sp['max']:.2f}) |")  # fmt: skip
    lines += ["", f"Goal: >= {TARGET}x."]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
