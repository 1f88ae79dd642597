"""FastLoader, DataLoader and DALI's own graph with the same heavy training augmentation, side by side in one run.

    .venv/bin/python benchmarks/bench_augment.py --images data/sample-images --transform deit \\
        --repeats 5 --with-gil-thread [--root /tmp/fastload-before --root .]

Three loaders, batches of 64, the same image folder, the same recipe:

- ``FastLoader(ImageFolder(transform), 64, device=<device>)``: the literal swap. Its first epoch
  of the run packs the folder into its cache (one cache per ``--root``).
- ``DataLoader(ImageFolder(transform), 64, num_workers=<cores>, persistent_workers=True)``.
- DALI's own CPU graph (``device_id=None``, ``num_threads=<cores>``) on the same files:
  ``fn.readers.file`` + ``fn.decoders.image_random_crop`` (area 0.08-1, ratio 3/4-4/3) +
  ``fn.resize`` (224, cubic, antialiased) + DALI's ``rand_augment(n=2, m=9)`` or
  ``trivial_augment_wide()`` + ``fn.erase`` (probability 0.25, area 0.02-1/3, log-uniform ratio
  0.3-3.3, anchor from ``fn.random.uniform``, filled with the mean pixel) +
  ``fn.crop_mirror_normalize`` (the flip, float CHW, ImageNet mean/std).

``--transform ta`` (default) is torchvision's references' ``--auto-augment ta_wide --random-erase
0.25 --interpolation bicubic``: RandomResizedCrop(224, bicubic), flip, TrivialAugmentWide,
PILToTensor, ConvertImageDtype, Normalize, RandomErasing(0.25). ``--transform deit`` is DeiT's
``timm.data.create_transform(224, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
interpolation="bicubic", re_prob=0.25, re_mode="pixel")``. DALI's RandAugment has no magnitude
noise (timm's ``mstd0.5``) and its erasing fills a constant, not pixel noise: same work, near enough.
``--transform plain`` is the classic recipe, for comparison: RandomResizedCrop(224), flip, ToTensor,
Normalize (DALI's row: the same graph without the augmentation and the erasing, bilinear).
``--transform mocov3`` and ``--transform dino`` are MoCo v3's two views and DINO's multi-crop (2 x 224
+ 6 x 96), their own blur and solarization classes included, batches ``[views, labels]``: FastLoader
and DataLoader only (no DALI row).

Each measurement is one process of its own: a warm-up epoch, then one timed epoch. Within a
repeat the loaders take turns at going first. ``--with-gil-thread`` measures every loader a
second time beside a Python thread that loops pure-Python bytecode for the whole timed epoch (a
training step's Python holding the GIL). ``--root DIR`` (repeatable) imports ``fastload`` from
that checkout for a FastLoader row of its own: ``--root /tmp/old --root .`` measures old and new
source in one run. Writes ``benchmarks/results/augment-<transform>-<device>-<cores>cpu.{md,json}``:
the machine (CPU model, cores, load average before and after), every epoch's images/s, medians
with min-max, and FastLoader / DataLoader and FastLoader / DALI per repeat.
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
BATCH = 64
CROP = 224
MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
CONDITIONS = {"alone": "alone", "gil": "beside a GIL-holding thread"}

log = logging.getLogger("bench_augment")


# ============================================================================ the child: one loader, one epoch


class GilThread:
    """A Python thread that loops bytecode (holding the GIL) until stopped, counting its loops."""

    def __init__(self, on: bool) -> None:
        self.on = on
        self.stop = False
        self.loops = 0
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        n = 0
        while not self.stop:
            x = 0
            for i in range(1000):  # pure-Python work: never releases the GIL by itself
                x += i * i
            n += 1
        self.loops = n

    def __enter__(self) -> "GilThread":
        if self.on:
            self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop = True
        if self.thread.is_alive():
            self.thread.join()


#: The recipes whose transform returns several views of each image (DALI has no graph of them here).
MULTI_VIEW = ("mocov3", "dino")


class GaussianBlur:
    """MoCo's blur (``moco/loader.py``): PIL's GaussianBlur, its radius uniform in ``sigma``."""

    def __init__(self, sigma=(0.1, 2.0)):
        self.sigma = sigma

    def __call__(self, x):
        import random

        from PIL import ImageFilter

        return x.filter(ImageFilter.GaussianBlur(radius=random.uniform(self.sigma[0], self.sigma[1])))


class Solarize:
    """MoCo v3's solarization: ``ImageOps.solarize`` (threshold 128)."""

    def __call__(self, x):
        from PIL import ImageOps

        return ImageOps.solarize(x)


class TwoCrops:
    """MoCo v3's ``TwoCropsTransform``: one view from each of its two transforms."""

    def __init__(self, base_transform1, base_transform2):
        self.base_transform1, self.base_transform2 = base_transform1, base_transform2

    def __call__(self, x):
        return [self.base_transform1(x), self.base_transform2(x)]


class DinoBlur:
    """DINO's ``utils.GaussianBlur(p, radius_min, radius_max)``."""

    def __init__(self, p=0.5, radius_min=0.1, radius_max=2.0):
        self.prob, self.radius_min, self.radius_max = p, radius_min, radius_max

    def __call__(self, img):
        import random

        from PIL import ImageFilter

        if not random.random() <= self.prob:
            return img
        return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(self.radius_min, self.radius_max)))


class Solarization:
    """DINO's ``utils.Solarization(p)``."""

    def __init__(self, p):
        self.p = p

    def __call__(self, img):
        import random

        from PIL import ImageOps

        return ImageOps.solarize(img) if random.random() < self.p else img


DinoBlur.__name__ = DinoBlur.__qualname__ = "GaussianBlur"  # DINO's class name


class MultiCrop:
    """DINO's ``DataAugmentationDINO``: two global crops (224), then ``local_crops_number`` local ones (96)."""

    def __init__(self, global_transfo1, global_transfo2, local_crops_number, local_transfo):
        self.global_transfo1, self.global_transfo2 = global_transfo1, global_transfo2
        self.local_crops_number, self.local_transfo = local_crops_number, local_transfo

    def __call__(self, image):
        return [self.global_transfo1(image), self.global_transfo2(image)] + [
            self.local_transfo(image) for _ in range(self.local_crops_number)
        ]


def multi_view_transform(name: str) -> Any:
    """MoCo v3's two views (``main_moco.py``'s augmentation1/2) or DINO's 2 global + 6 local crops (``main_dino.py``)."""
    from torchvision import transforms as T
    from torchvision.transforms import InterpolationMode

    norm = [T.ToTensor(), T.Normalize(MEAN, STD)]
    if name == "mocov3":
        common = [T.RandomResizedCrop(CROP, scale=(0.08, 1.0)), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                  T.RandomGrayscale(p=0.2)]  # fmt: skip
        return TwoCrops(
            T.Compose([*common, T.RandomApply([GaussianBlur([0.1, 2.0])], p=1.0), T.RandomHorizontalFlip(), *norm]),
            T.Compose([*common, T.RandomApply([GaussianBlur([0.1, 2.0])], p=0.1), T.RandomApply([Solarize()], p=0.2),
                       T.RandomHorizontalFlip(), *norm]),
        )  # fmt: skip
    jitter = [T.RandomHorizontalFlip(p=0.5), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
              T.RandomGrayscale(p=0.2)]  # fmt: skip
    crop = lambda side, scale: T.RandomResizedCrop(side, scale=scale, interpolation=InterpolationMode.BICUBIC)  # noqa: E731
    return MultiCrop(
        T.Compose([crop(CROP, (0.4, 1.0)), *jitter, DinoBlur(1.0), *norm]),
        T.Compose([crop(CROP, (0.4, 1.0)), *jitter, DinoBlur(0.1), Solarization(0.2), *norm]),
        6, T.Compose([crop(96, (0.05, 0.4)), *jitter, DinoBlur(p=0.5), *norm]),
    )  # fmt: skip


def build_transform(name: str) -> Any:
    """The per-image torchvision / timm training transform ``name`` (``ta``, ``ta_bilinear``, ``deit``, ``plain``,
    ``mocov3`` or ``dino``)."""
    import torch
    from torchvision import transforms as T
    from torchvision.transforms import InterpolationMode

    if name in MULTI_VIEW:
        return multi_view_transform(name)
    if name == "deit":
        from timm.data import create_transform

        return create_transform(CROP, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
                                re_prob=0.25, re_mode="pixel")  # fmt: skip
    if name == "plain":
        return T.Compose([T.RandomResizedCrop(CROP), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)])
    if name == "ta_bilinear":  # the references' presets at their default --interpolation bilinear
        return T.Compose([
            T.RandomResizedCrop(CROP), T.RandomHorizontalFlip(), T.TrivialAugmentWide(interpolation=InterpolationMode.BILINEAR),
            T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD), T.RandomErasing(0.25),
        ])  # fmt: skip
    return T.Compose([
        T.RandomResizedCrop(CROP, interpolation=InterpolationMode.BICUBIC), T.RandomHorizontalFlip(),
        T.TrivialAugmentWide(), T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD),
        T.RandomErasing(0.25),
    ])  # fmt: skip


def dali_loader(images: str, transform: str, threads: int) -> Any:
    """DALI's own CPU graph for ``transform`` on the ImageFolder ``images``, wrapped in DALIGenericIterator."""
    from nvidia import dali
    from nvidia.dali import fn, types
    from nvidia.dali import math as dmath
    from nvidia.dali.auto_aug import rand_augment, trivial_augment
    from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

    fill = [round(m * 255) for m in MEAN]  # erased pixels normalise to 0, as torchvision's value=0

    @dali.pipeline_def(batch_size=BATCH, num_threads=threads, device_id=None, seed=0, enable_conditionals=True)
    def graph():
        enc, label = fn.readers.file(file_root=images, random_shuffle=True, name="r")
        img = fn.decoders.image_random_crop(enc, device="cpu", output_type=types.RGB, random_area=[0.08, 1.0],
                                            random_aspect_ratio=[3 / 4, 4 / 3])  # fmt: skip
        cubic = transform not in ("plain", "ta_bilinear")
        img = fn.resize(img, size=[CROP, CROP], interp_type=types.INTERP_CUBIC if cubic else types.INTERP_LINEAR,
                        antialias=True)  # fmt: skip
        if transform == "plain":
            pass
        elif transform == "deit":
            img = rand_augment.rand_augment(img, n=2, m=9)
        else:
            img = trivial_augment.trivial_augment_wide(img)
        if transform != "plain" and fn.random.coin_flip(probability=0.25):
            area = fn.random.uniform(range=[0.02, 1 / 3])
            ratio = dmath.exp(fn.random.uniform(range=[math.log(0.3), math.log(1 / 0.3)]))
            h = dmath.min(dmath.sqrt(area * ratio), 1.0)
            w = dmath.min(dmath.sqrt(area / ratio), 1.0)
            y = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - h)
            x = fn.random.uniform(range=[0.0, 1.0]) * (1.0 - w)
            img = fn.erase(img, anchor=fn.stack(y, x), shape=fn.stack(h, w), axis_names="HW", fill_value=fill,
                           normalized_anchor=True, normalized_shape=True)  # fmt: skip
        img = fn.crop_mirror_normalize(img, dtype=types.FLOAT, output_layout="CHW", mirror=fn.random.coin_flip(),
                                       mean=[m * 255 for m in MEAN], std=[s * 255 for s in STD])  # fmt: skip
        return img, label

    pipe = graph()
    pipe.build()
    return DALIGenericIterator([pipe], ["x", "y"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL,
                               auto_reset=True)  # fmt: skip


def child(a: argparse.Namespace) -> dict:
    """One measurement in this fresh process: a warm-up epoch, then one timed epoch of loader ``a.child``."""
    if a.child == "fastload":
        sys.path.insert(0, a.root)  # before any import of fastload: this checkout's source, not the installed one
    import torch

    threads = len(os.sched_getaffinity(0))
    where = None
    if a.child == "dali":
        loader = dali_loader(a.images, a.transform, threads)
    else:
        from torchvision import datasets

        ds = datasets.ImageFolder(a.images, transform=build_transform(a.transform))
        if a.child == "fastload":
            import fastload

            where = fastload.__file__
            if not Path(where).resolve().is_relative_to(Path(a.root).resolve()):
                raise RuntimeError(f"fastload came from {where}, not from --root {a.root}")
            loader = fastload.FastLoader(ds, BATCH, shuffle=True, device=a.device, cache_dir=a.cache, progress=False)
        else:
            loader = torch.utils.data.DataLoader(ds, BATCH, shuffle=True, num_workers=threads, persistent_workers=True)

    def epoch() -> int:
        n = 0
        for out in loader:
            n += len(out[0]["y"] if a.child == "dali" else out[1])
        if a.device.startswith("cuda") and a.child == "fastload":
            torch.cuda.synchronize()
        return n

    epoch()  # warm-up: worker processes, DALI's pools, FastLoader's cache, the page cache
    with GilThread(a.condition == "gil") as gil:
        t = time.perf_counter()
        n = epoch()
        dt = time.perf_counter() - t
    return {"images": n, "seconds": dt, "images_per_s": n / dt, "gil_loops_per_s": gil.loops / dt if gil.on else None,
            "fastload": where}  # fmt: skip


# ============================================================================ the parent: turns, repeats, report


def run_child(kind: str, condition: str, a: argparse.Namespace, root: str = "", cache: str = "") -> dict:
    """Run one measurement in a fresh interpreter; ``{"error": ...}`` if it failed (the others still run)."""
    cmd = [sys.executable, __file__, "--child", kind, "--condition", condition, "--images", a.images,
           "--transform", a.transform, "--device", a.device, "--root", root or str(ROOT),
           "--cache", cache or a.cache]  # fmt: skip
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode:
        log.error("%s (%s) failed:\n%s", kind, condition, r.stderr[-3000:])
        return {"error": r.stderr.strip().splitlines()[-1] if r.stderr.strip() else f"exit {r.returncode}"}
    out = json.loads(r.stdout.strip().splitlines()[-1])
    out["load_1min_after"] = os.getloadavg()[0]
    return out


def describe_root(path: str) -> str:
    """``path`` and its git commit (``+dirty`` when its fastload/ has uncommitted changes), as far as known."""
    try:
        sha = subprocess.run(["git", "-C", path, "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=True).stdout.strip()  # fmt: skip
        dirty = subprocess.run(["git", "-C", path, "status", "--porcelain", "--", "fastload"], capture_output=True,
                               text=True).stdout.strip()  # fmt: skip
        return f"{path} @ {sha}{'+dirty' if dirty else ''}"
    except (OSError, subprocess.CalledProcessError):
        return path


def machine() -> dict:
    """CPU model, cores, and the versions that decide the numbers."""
    cpu = platform.processor()
    for ln in Path("/proc/cpuinfo").read_text().splitlines():
        if ln.startswith("model name"):
            cpu = ln.split(":", 1)[1].strip()
            break
    versions = {"python": platform.python_version()}
    for mod in ("torch", "torchvision", "timm", "PIL", "nvidia.dali"):
        try:
            versions[mod] = __import__(mod, fromlist=["__version__"]).__version__
        except ImportError:
            versions[mod] = None
    return {"cpu": cpu, "cores": len(os.sched_getaffinity(0)), "cpu_count": os.cpu_count(), "versions": versions}


def measure(a: argparse.Namespace, roots: list[str]) -> tuple[dict, dict]:
    """Every measurement, repeat by repeat, the loaders taking turns at going first; ``(runs, ratios)``."""
    names = [f"FastLoader[{i}]" for i in range(len(roots))] + ["DataLoader"] + ([] if a.transform in MULTI_VIEW else ["DALI"])
    conditions = ["alone", "gil"] if a.with_gil_thread else ["alone"]
    runs = {c: {n: [] for n in names} for c in conditions}
    ratios = {c: {f"{f} / {o}": [] for f in names if f.startswith("FastLoader") for o in names if not o.startswith("Fast")}
              for c in conditions}  # fmt: skip
    for r in range(a.repeats):
        for c in conditions:
            got = {}
            for name in names[r % len(names):] + names[: r % len(names)]:
                if name.startswith("FastLoader"):
                    i = int(name[len("FastLoader["):-1])
                    got[name] = run_child("fastload", c, a, roots[i], str(Path(a.cache) / f"root{i}"))
                else:
                    got[name] = run_child("torch" if name == "DataLoader" else "dali", c, a)
                runs[c][name].append(got[name])
                log.info("repeat %d, %s: %s %s images/s", r + 1, CONDITIONS[c], name,
                         f"{got[name]['images_per_s']:.0f}" if "error" not in got[name] else "failed")  # fmt: skip
            for key in ratios[c]:
                f, o = key.split(" / ")
                if "error" not in got[f] and "error" not in got[o]:
                    ratios[c][key].append(got[f]["images_per_s"] / got[o]["images_per_s"])
    return runs, ratios


def spread(v: list[float], d: int = 0, unit: str = "") -> str:
    """``median (min–max)`` of ``v``, or a dash when nothing was measured."""
    if not v:
        return "—"
    return f"{statistics.median(v):,.{d}f} ({min(v):,.{d}f}–{max(v):,.{d}f}){unit}"


def report(s: dict) -> str:
    """The Markdown page for summary ``s``."""
    m = s["machine"]
    v = ", ".join(f"{k} {x}" for k, x in m["versions"].items())
    conds = list(s["runs"])
    rates = {c: {n: [x["images_per_s"] for x in xs if "error" not in x] for n, xs in s["runs"][c].items()}
             for c in conds}  # fmt: skip
    head = "| loader | " + " | ".join(f"images/s {CONDITIONS[c]}, median (min–max)" for c in conds) + " |"
    rows = [head, "|---|" + "---:|" * len(conds)]
    for n, label in s["loaders"].items():
        rows.append(f"| {label} | " + " | ".join(spread(rates[c][n]) for c in conds) + " |")
    for key in s["ratios"][conds[0]]:
        rows.append(f"| {key}, per repeat | " + " | ".join(spread(s["ratios"][c][key], 2, "×") for c in conds) + " |")
    notes = []
    if "gil" in conds:
        loops = {n: [x["gil_loops_per_s"] for x in xs if "error" not in x] for n, xs in s["runs"]["gil"].items()}
        notes.append("The GIL-holding thread's loops/s (1,000 additions each), median (min–max), beside "
                     + "; ".join(f"{n} {spread(loops[n])}" for n in s["loaders"]) + ".")
    notes += [f"Failed: {n} ({CONDITIONS[c]}): {x['error']}" for c in conds for n, xs in s["runs"][c].items()
              for x in xs if "error" in x]  # fmt: skip
    before = ", ".join(f"{x:.1f}" for x in s["load_average_before"])
    after = ", ".join(f"{x:.1f}" for x in s["load_average_after"])
    what = {"ta": "TrivialAugmentWide + RandomErasing(0.25) + bicubic (torchvision's references)",
            "ta_bilinear": "TrivialAugmentWide + RandomErasing(0.25), bilinear crop and warps (the references' default)",
            "deit": "DeiT's training transform (timm RandAugment rand-m9-mstd0.5-inc1, bicubic, "
                    "pixel erasing 0.25)",
            "plain": "The classic recipe (RandomResizedCrop(224), flip, ToTensor, Normalize)",
            "mocov3": "MoCo v3's two views (jitter, grayscale, MoCo's blur, solarize)",
            "dino": "DINO's multi-crop (2 x 224 + 6 x 96, jitter, grayscale, DINO's blur and solarization)"}  # fmt: skip
    roots = "".join(f"\n- `FastLoader[{i}]`: fastload from {r}" for i, r in enumerate(s["roots"]))
    page = f"""# {what[s['transform']]}: FastLoader, DataLoader and DALI

Machine: {m['cpu']}, {m['cores']} cores; {v}; {s['created']}.
Load average (1, 5, 15 min) before {before}, after {after}: other processes share these cores, read the spread.
Images: `{s['images']}` ({s['num_images']} files); batches of {BATCH}; FastLoader on `{s['device']}`; DataLoader with
{m['cores']} workers; DALI's CPU graph with {m['cores']} threads. Each measurement one process: a warm-up epoch, then
one timed epoch; the loaders take turns at going first; repeats: {s["repeats"]}. Command: `{s['command']}`.
{roots}

{chr(10).join(rows)}

{(chr(10) * 2).join(notes)}
"""
    return page.rstrip() + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", default=str(ROOT / "data" / "sample-images"))
    ap.add_argument("--device", default="cpu", help="FastLoader's device (DataLoader and DALI run on the CPU)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--cache", default=str(ROOT / "data" / "bench-cache"))
    ap.add_argument("--out", default=None, help="path prefix of the .md and .json written")
    ap.add_argument("--transform", choices=("ta", "ta_bilinear", "deit", "plain", *MULTI_VIEW), default="ta")
    ap.add_argument("--with-gil-thread", action="store_true",
                    help="also measure each loader beside a GIL-holding thread")  # fmt: skip
    ap.add_argument("--root", action="append", default=None, help="a checkout to import fastload from (repeatable)")
    ap.add_argument("--child", choices=("fastload", "torch", "dali"), help=argparse.SUPPRESS)
    ap.add_argument("--condition", choices=tuple(CONDITIONS), default="alone", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.child:
        a.root = a.root[0]
        print(json.dumps(child(a)))
        return
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    a.images = str(Path(a.images).resolve())
    roots = [str(Path(r).resolve()) for r in (a.root or [str(ROOT)])]
    load_before = os.getloadavg()
    runs, ratios = measure(a, roots)
    summary = {
        "machine": machine(), "device": a.device, "transform": a.transform, "images": a.images,
        "num_images": sum(1 for p in Path(a.images).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES),
        "repeats": a.repeats,
        "roots": [describe_root(r) for r in roots], "command": " ".join([Path(sys.argv[0]).name] + sys.argv[1:]),
        "loaders": {
            **{f"FastLoader[{i}]": f"`FastLoader(ImageFolder(transform), {BATCH}, device=\"{a.device}\")` [{i}]"
               for i in range(len(roots))},
            "DataLoader": f"`DataLoader(ImageFolder(transform), {BATCH}, num_workers={len(os.sched_getaffinity(0))})`",
            **({} if a.transform in MULTI_VIEW else {"DALI": "DALI `readers.file` + `decoders.image_random_crop` + `resize` + "
                    + {"deit": "`rand_augment(n=2, m=9)` + `erase` + ", "plain": ""}.get(a.transform, "`trivial_augment_wide()` + `erase` + ")
                    + "`crop_mirror_normalize`"}),
        },
        "runs": runs, "ratios": ratios, "load_average_before": load_before, "load_average_after": os.getloadavg(),
        "created": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }  # fmt: skip
    md = report(summary)
    tag = a.out or str(ROOT / "benchmarks" / "results" / f"augment-{a.transform}-{a.device.split(':')[0]}-"
                       f"{summary['machine']['cores']}cpu")  # fmt: skip
    Path(tag + ".json").write_text(json.dumps(summary, indent=1) + "\n")
    Path(tag + ".md").write_text(md)
    log.info("%s\nwrote %s.md and %s.json", md, tag, tag)


if __name__ == "__main__":
    main()
