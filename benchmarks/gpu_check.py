"""The GPU check: correctness first, then speed and memory, in one run of at most 8 minutes.

Usage (docs/gpu.md says what the GPU machine needs installed)::

    python3 benchmarks/gpu_check.py                    # on a CUDA machine; about 5 minutes
    python3 benchmarks/gpu_check.py --cpu-dry-run      # every step on the CPU, small (tests/test_gpu_check.py)

Steps, in order; each is recorded with its status and time, and a failed correctness step
fails the run (exit 1) after the report is written:

 1. **preflight**: a one-batch ``mixed`` DALI pipeline, so that a missing CUDA library fails
    in seconds, naming it (exit 3);
 2. **data**: N ImageNet-like JPEGs (about 500x375, q90; a few progressive, one EXIF-rotated)
    packed with ``fastload pack``;
 3. **pytest -m gpu**: the label/pixel tests that only run on CUDA;
 4. **agreement**: every image of the first batches from ``FastLoader(cuda)`` against
    ``FastLoader(cpu)``, max absolute difference and PSNR *per image*: evaluation mode (both
    decode with DALI and resize with DALI) and training mode (the same crop boxes);
 5. **race**: a consumer that delays its stream with ``torch.cuda._sleep`` before reading each
    batch gets the same batches (checksums) as a same-seed run that does not;
 6. **hardware decoder**: NVML's JPEG-engine utilisation during an epoch with
    ``hw_decoder_load=0`` and with DALI's default;
 7. **throughput**: ``FastLoader(cuda)`` against a 16-worker torchvision ``DataLoader`` and
    against DALI's own ``readers.file`` pipeline with the same decoder settings, epochs
    interleaved, medians; GPU memory each loader added beside
    :func:`fastload.pipeline.memory_estimate`, and this process's anonymous and file-backed RSS;
 8. **training**: ResNet-50, AMP (bfloat16), channels-last, measured with ``fastload.profile``
    for FastLoader and the DataLoader: images/s, the share of each step spent waiting, NVML
    GPU utilisation.

Writes ``report.json``, ``report.md`` and ``report.png`` to ``--out`` (default
``$OUT/gpu-h200`` when ``$OUT`` is set, else ``benchmarks/results/gpu-h200``; a dry run
defaults to ``WORK/report``) and prints a short table last. Steps past ``--budget-s`` are
skipped and say so.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import math
import os
import platform
import re
import statistics
import subprocess
import sys
import threading
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEAN = (0.485, 0.456, 0.406)
STD = (0.229, 0.224, 0.225)
#: per-image agreement floors (dB): eval decodes and resizes with DALI on both devices; training
#: compares the same crop boxes, resized by DALI on the GPU and by pillow-simd on the CPU
EVAL_PSNR_MIN = 30.0
TRAIN_PSNR_MIN = 20.0
PSNR_IDENTICAL = 99.0  # reported for identical images (JSON has no infinity)


# ----------------------------------------------------------------------------- settings


class Plan:
    """Sizes of every step: the full GPU run, or a small CPU dry run of the same code."""

    def __init__(self, a: argparse.Namespace) -> None:
        dry = a.cpu_dry_run
        self.dry = dry
        self.device = "cpu" if dry else "cuda"
        self.images = a.images if a.images is not None else (48 if dry else 8000)
        self.classes = 4 if dry else 10
        self.batch = 8 if dry else 256
        self.crop = 32 if dry else 224
        self.repeats = a.repeats if a.repeats is not None else (2 if dry else 3)
        self.workers = min(2, os.cpu_count() or 1) if dry else 16
        self.agree_images = 16 if dry else 512
        self.race_batches = 4 if dry else 24
        self.train_warmup = 1 if dry else 10
        self.train_steps = 2 if dry else 40
        self.model = "resnet50"
        # the test files that hold gpu-marked tests (collecting only them keeps a missing
        # optional package of another file from stopping the run); a dry run takes the smallest
        marked = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "tests").glob("test_*.py") if "mark.gpu" in p.read_text())
        self.pytest_paths = (["tests/test_profile.py"] if dry else marked) or ["tests"]
        self.budget_s = a.budget_s


def _gpu_index(device: str) -> int:
    return 0 if device == "cpu" else (int(device.split(":")[1]) if ":" in device else 0)


# ----------------------------------------------------------------------------- images


def _texture(rng: np.random.Generator, w: int, h: int) -> np.ndarray:
    """A smooth, photo-like RGB texture (low-frequency noise plus detail)."""
    from PIL import Image

    small = rng.integers(0, 256, size=(h // 16 + 2, w // 16 + 2, 3)).astype(np.uint8)
    base = np.asarray(Image.fromarray(small).resize((w, h), Image.BICUBIC), dtype=np.float32)
    detail = rng.normal(0, 12, size=(h, w, 3)).astype(np.float32)
    return np.clip(base + detail, 0, 255).astype(np.uint8)


def _write(args: tuple[str, int, int, int]) -> int:
    from PIL import Image

    root, start, stop, classes = args
    for i in range(start, stop):
        rng = np.random.default_rng(i)
        w, h = int(rng.integers(420, 560)), int(rng.integers(320, 420))
        d = Path(root) / f"class_{i % classes:02d}"
        d.mkdir(parents=True, exist_ok=True)
        kw: dict[str, Any] = {"quality": 90, "progressive": i % 25 == 0}
        if i == 0:  # EXIF-rotated: pack turns it upright once; the loader must not turn it again
            exif = Image.Exif()
            exif[0x0112] = 6
            kw["exif"] = exif
        Image.fromarray(_texture(rng, w, h)).save(d / f"img_{i:06d}.jpg", **kw)
    return stop - start


def make_images(root: Path, n: int, classes: int) -> None:
    if root.exists() and sum(1 for _ in root.rglob("*.jpg")) == n:
        return
    workers = max(1, min(os.cpu_count() or 1, 16))
    step = -(-n // workers)
    with ProcessPoolExecutor(workers) as ex:
        list(ex.map(_write, [(str(root), s, min(n, s + step), classes) for s in range(0, n, step)]))


# ----------------------------------------------------------------------------- measurements


def machine() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__, "cores": os.cpu_count()}
    try:
        import nvidia.dali as dali

        info["dali"] = dali.__version__
    except ImportError:
        info["dali"] = None
    if torch.cuda.is_available():
        p = torch.cuda.get_device_properties(0)
        info["gpu"] = f"{p.name}, {p.total_memory / 2**30:.0f} GiB, sm_{p.major}{p.minor}"
    try:
        with open("/proc/cpuinfo") as f:
            info["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), "?")
    except OSError:
        info["cpu"] = "?"
    return info


def memory(device: str) -> dict[str, Any]:
    """This process: anonymous and file-backed RSS (bytes), and the GPU's memory in use."""
    from fastload.bench.measure import memory_snapshot

    return memory_snapshot(device)


def _gpu_bytes(snap: dict[str, Any]) -> int | None:
    """The device's memory in use (one figure for every snapshot: NVML's per-process one is
    missing in a container's PID namespace; on a dedicated GPU machine nothing else runs)."""
    g = snap.get("gpu") or {}
    return g["used"] if g.get("available") else None


class NvmlSampler:
    """Samples NVML's GPU and JPEG-engine utilisation (percent) from a thread; 'unavailable' says why not."""

    def __init__(self, index: int = 0, interval: float = 0.05) -> None:
        self.interval, self.reason = interval, ""
        self.gpu: list[float] = []
        self.jpg: list[float] = []
        self.jpg_reason = ""
        self._nvml: Any = None
        self._handle: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except ImportError:
            self.reason = "nvidia-ml-py is not installed (stage it with the DALI parts: see docs/gpu.md)"
        except Exception as e:
            self.reason = f"NVML: {type(e).__name__}: {e}"

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.gpu.append(float(self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu))
            except Exception as e:
                self.reason = f"NVML: {e}"
            if not self.jpg_reason:
                try:
                    self.jpg.append(float(self._nvml.nvmlDeviceGetJpgUtilization(self._handle)[0]))
                except Exception as e:  # older drivers, GPUs without JPEG engines
                    self.jpg_reason = f"NVML JPEG utilisation: {type(e).__name__}: {e}"

    def __enter__(self) -> "NvmlSampler":
        if self._nvml is not None:
            self._thread = threading.Thread(target=self._loop, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        if self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception:
                pass

    @staticmethod
    def summary(values: list[float], reason: str) -> Any:
        if not values:
            return f"unavailable ({reason or 'no samples'})"
        return {"mean": round(statistics.fmean(values), 1), "max": max(values), "samples": len(values)}


def _digest(x: Any) -> str:
    return hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest()[:16]


def _psnr(a: np.ndarray, b: np.ndarray) -> float:
    mse = float(np.mean((a.astype(np.float64) - b.astype(np.float64)) ** 2))
    return PSNR_IDENTICAL if mse == 0 else min(PSNR_IDENTICAL, 10 * math.log10(255.0**2 / mse))


def _epoch_loop(loader: Any, device: str, limit: int | None = None) -> tuple[int, float]:
    """Images and seconds for one epoch of ``loader`` (batches moved to ``device``, synchronised)."""
    import torch

    cuda = device.startswith("cuda")
    if cuda:
        torch.cuda.current_stream().synchronize()
    t = time.perf_counter()
    n = 0
    for b, batch in enumerate(loader):
        dali_out = isinstance(batch, list) and bool(batch) and isinstance(batch[0], dict)  # DALIGenericIterator
        x = batch[0]["images"] if dali_out else batch[0]
        x = x.to(device, non_blocking=True)
        n += int(x.shape[0])
        if limit is not None and b + 1 >= limit:
            break
    if cuda:
        torch.cuda.current_stream().synchronize()
    return n, time.perf_counter() - t


# ----------------------------------------------------------------------------- the steps


def step_preflight(plan: Plan, res: dict) -> None:
    """A one-batch pipeline on the decoder the run needs: ``mixed`` on CUDA, ``cpu`` on a dry run."""
    from PIL import Image

    from fastload.pipeline import import_dali

    dali, fn, types = import_dali()
    buf = io.BytesIO()
    Image.fromarray(_texture(np.random.default_rng(0), 96, 64)).save(buf, "JPEG", quality=90)
    enc = np.frombuffer(buf.getvalue(), np.uint8)
    gpu = plan.device != "cpu"

    @dali.pipeline_def(batch_size=2, num_threads=1, device_id=_gpu_index(plan.device) if gpu else None)
    def one():
        x = fn.external_source(source=lambda: [enc, enc], batch=True, dtype=types.UINT8)
        img = fn.decoders.image(x, device="mixed" if gpu else "cpu", output_type=types.RGB, jpeg_fancy_upsampling=True)
        return fn.resize(img, device="gpu" if gpu else "cpu", size=[32, 32], antialias=True)

    pipe = one()
    pipe.build()
    (out,) = pipe.run()
    if gpu:
        out = out.as_cpu()
    shape = tuple(np.asarray(out[0]).shape)
    if shape != (32, 32, 3):
        raise RuntimeError(f"the one-batch pipeline returned {shape}, not (32, 32, 3)")
    res["decoder"] = "mixed" if gpu else "cpu"
    del pipe


def step_data(plan: Plan, res: dict, work: Path) -> None:
    import fastload

    t0 = time.perf_counter()
    make_images(work / "images", plan.images, plan.classes)
    t1 = time.perf_counter()
    fastload.pack(work / "images", work / "packed", overwrite=True, progress=False, workers=min(16, os.cpu_count() or 1))
    ds = fastload.Dataset(work / "packed")
    res.update(images=len(ds), make_s=round(t1 - t0, 1), pack_s=round(time.perf_counter() - t1, 1), stats=ds.manifest.stats)


def step_pytest(plan: Plan, res: dict) -> None:
    try:
        import pytest  # noqa: F401
    except ImportError:
        raise Unavailable("pytest is not installed here: stage it with the DALI parts (docs/gpu.md)") from None
    cmd = [sys.executable, "-m", "pytest", "-m", "gpu", "-q", "-p", "no:cacheprovider", "--continue-on-collection-errors",
           *plan.pytest_paths]  # fmt: skip
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240, env=env)
    tail = (r.stdout + r.stderr).strip().splitlines()
    res.update(command=" ".join(cmd[1:]), rc=r.returncode, summary=tail[-1] if tail else "")
    counts = {k: 0 for k in ("passed", "failed", "skipped", "error", "deselected")}
    for num, word in re.findall(r"(\d+) (passed|failed|skipped|errors?|deselected)", res["summary"]):
        counts[word.rstrip("s") if word.startswith("error") else word] = int(num)
    res["counts"] = counts
    if r.returncode not in (0, 5):  # 5: nothing collected
        res["output_tail"] = tail[-40:]
    if counts["failed"] or r.returncode not in (0, 1, 5):
        raise CheckFailed(f"pytest -m gpu failed: {res['summary']}")
    if not plan.dry and counts["passed"] == 0:
        raise CheckFailed(f"pytest -m gpu passed nothing on CUDA: {res['summary']}")
    if counts["error"]:  # a file that could not be collected here (a package this machine lacks)
        res["summary"] += " (collection errors: see output_tail)"


def _uint8_batches(packed: Path, device: str, *, train: bool, n_images: int, batch: int, crop: int) -> list[np.ndarray]:
    from fastload import FastLoader

    out: list[np.ndarray] = []
    kw: dict[str, Any] = dict(train=train, shuffle=train, seed=7, mean=None, std=None, crop=crop)
    with FastLoader(packed, batch, device=device, **kw) as loader:
        for x, _ in loader:
            out.extend(np.asarray(x.cpu().numpy()))
            if len(out) >= n_images:
                break
    return out[:n_images]


def step_agreement(plan: Plan, res: dict, packed: Path) -> None:
    for mode, train, floor in (("eval", False, EVAL_PSNR_MIN), ("train", True, TRAIN_PSNR_MIN)):
        kw = dict(train=train, n_images=plan.agree_images, batch=plan.batch, crop=plan.crop)
        got = _uint8_batches(packed, plan.device, **kw)
        ref = _uint8_batches(packed, "cpu", **kw)
        per = []
        for i, (a, b) in enumerate(zip(got, ref)):
            per.append({"i": i, "max_abs": int(np.abs(a.astype(np.int16) - b.astype(np.int16)).max()), "psnr": round(_psnr(a, b), 2)})
        psnrs = [p["psnr"] for p in per]
        worst = sorted(per, key=lambda p: p["psnr"])[:5]
        res[mode] = {
            "images": len(per), "psnr_min": min(psnrs), "psnr_median": statistics.median(psnrs),
            "max_abs_max": max(p["max_abs"] for p in per), "max_abs_median": statistics.median(p["max_abs"] for p in per),
            "floor_db": floor, "below_floor": sum(p < floor for p in psnrs), "worst": worst, "per_image": per,
        }  # fmt: skip
    bad = [m for m in ("eval", "train") if res[m]["below_floor"]]
    if bad:
        raise CheckFailed("; ".join(f"{m}: {res[m]['below_floor']} of {res[m]['images']} images below {res[m]['floor_db']} dB "
                                    f"(worst {res[m]['psnr_min']} dB)" for m in bad))  # fmt: skip


def step_race(plan: Plan, res: dict, packed: Path) -> None:
    """The same seed twice: once read at once, once by a consumer whose stream sleeps ~5 ms first."""
    import torch

    from fastload import FastLoader

    cuda = plan.device != "cpu"

    def run(delay: bool) -> list[str]:
        digests: list[Any] = []
        kw: dict[str, Any] = dict(train=True, shuffle=True, seed=11, mean=None, std=None, crop=plan.crop, prefetch=3)
        with FastLoader(packed, plan.batch, device=plan.device, **kw) as loader:
            for b, (x, _) in enumerate(loader):
                if delay:
                    if cuda:
                        torch.cuda._sleep(10_000_000)  # ~5 ms of GPU time before this stream reads x
                    else:
                        time.sleep(0.005)
                # read on the current stream; kept on the device so nothing synchronises per batch
                digests.append(x.clone() if cuda else x.numpy().copy())
                if b + 1 >= plan.race_batches:
                    break
            if cuda:
                torch.cuda.current_stream().synchronize()
        return [_digest(d.cpu().numpy() if cuda else d) for d in digests]

    ref, delayed = run(False), run(True)
    res.update(batches=len(ref), equal=ref == delayed, first=ref[:3])
    if len(ref) != len(delayed) or ref != delayed:
        diff = [i for i, (a, b) in enumerate(zip(ref, delayed)) if a != b]
        raise CheckFailed(f"a delayed consumer saw different batches: {diff[:10]} of {len(ref)}")


def step_hw_decoder(plan: Plan, res: dict, packed: Path) -> None:
    from fastload import FastLoader

    for name, load in (("hw_decoder_load=0", 0.0), ("default", None)):
        with FastLoader(packed, plan.batch, device=plan.device, seed=1, crop=plan.crop, hw_decoder_load=load) as loader:
            _epoch_loop(loader, plan.device, limit=2)  # warm-up
            with NvmlSampler(_gpu_index(plan.device)) as s:
                n, dt = _epoch_loop(loader, plan.device)
        res[name] = {
            "images_per_s": round(n / dt, 1), "jpeg_util": NvmlSampler.summary(s.jpg, s.jpg_reason or s.reason),
            "gpu_util": NvmlSampler.summary(s.gpu, s.reason),
        }  # fmt: skip
    d, z = res["default"]["jpeg_util"], res["hw_decoder_load=0"]["jpeg_util"]
    if isinstance(d, dict) and isinstance(z, dict):
        res["hardware_decoder_used"] = d["mean"] > z["mean"] + 5
        if not plan.dry and not res["hardware_decoder_used"]:
            raise CheckFailed(f"JPEG engines no busier with the default load ({d['mean']}%) than with 0 ({z['mean']}%)")
    else:
        res["hardware_decoder_used"] = "unavailable"


def _dataloader(plan: Plan, src: Path):
    import torch
    from torchvision import datasets, transforms

    tf = transforms.Compose([
        transforms.RandomResizedCrop(plan.crop), transforms.RandomHorizontalFlip(), transforms.ToTensor(),
        transforms.Normalize(MEAN, STD),
    ])  # fmt: skip
    ds = datasets.ImageFolder(str(src), transform=tf)
    return torch.utils.data.DataLoader(
        ds, batch_size=plan.batch, shuffle=True, num_workers=plan.workers, persistent_workers=True,
        pin_memory=plan.device != "cpu", prefetch_factor=4, drop_last=True,
    )  # fmt: skip


def _fastloader(plan: Plan, packed: Path, **kw: Any):
    from fastload import FastLoader

    return FastLoader(packed, plan.batch, device=plan.device, seed=0, crop=plan.crop, drop_last=True, **kw)


def _graph_spec(plan: Plan, loader: Any, stats: dict, max_pixels: int):
    from fastload.pipeline import GraphSpec, decoder_sizing

    return GraphSpec(
        batch_size=plan.batch, num_threads=loader.num_threads, device_id=None if plan.device == "cpu" else 0,
        train=True, crop=plan.crop, resize=round(plan.crop / 0.875), mean=[m * 255 for m in MEAN],
        std=[s * 255 for s in STD], out_dtype="float32", channels_last=False, prefetch=loader.prefetch,
        hw_decoder_load=None, **decoder_sizing(stats, max_pixels=max_pixels).fields(),
    )  # fmt: skip


def _dali_readers_file(plan: Plan, src: Path, spec: Any):
    """DALI's own pipeline on the JPEG folder: readers.file, random-crop decode, resize, normalise, flip;
    the decoder settings, threads and prefetch of FastLoader's graph (``spec``)."""
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    from fastload.pipeline import decoder_args, graph_threads, import_dali

    dali, fn, types = import_dali()
    gpu = spec.device_id is not None

    @dali.pipeline_def(batch_size=spec.batch_size, num_threads=graph_threads(spec), device_id=spec.device_id,
                       prefetch_queue_depth=spec.prefetch, seed=0)  # fmt: skip
    def peer():
        jpegs, labels = fn.readers.file(file_root=str(src), random_shuffle=True, name="Reader", seed=0)
        img = fn.decoders.image_random_crop(
            jpegs, device="mixed" if gpu else "cpu", random_area=[0.08, 1.0], random_aspect_ratio=[0.75, 4 / 3],
            **decoder_args(spec),
        )  # fmt: skip
        img = fn.resize(img, device="gpu" if gpu else "cpu", size=[spec.crop, spec.crop], antialias=True)
        img = fn.crop_mirror_normalize(
            img, device="gpu" if gpu else "cpu", mean=list(spec.mean), std=list(spec.std), dtype=types.FLOAT,
            output_layout="CHW", mirror=fn.random.coin_flip(),
        )  # fmt: skip
        return img, (labels.gpu() if gpu else labels)

    pipe = peer()
    pipe.build()
    return DALIGenericIterator(pipe, ["images", "labels"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)


def step_throughput(plan: Plan, res: dict, work: Path) -> None:
    import fastload

    ds = fastload.Dataset(work / "packed")
    stats, max_px = ds.manifest.stats, ds.manifest.max_pixels
    from fastload.pipeline import memory_estimate

    makers: list[tuple[str, Callable[[], Any]]] = [
        ("FastLoader", lambda: _fastloader(plan, work / "packed")),
        (f"DataLoader ({plan.workers} workers)", lambda: _dataloader(plan, work / "images")),
        ("DALI readers.file", None),  # built after FastLoader: it borrows FastLoader's graph settings
    ]
    loaders: dict[str, Any] = {}
    entries: dict[str, dict] = {}
    spec = None
    if plan.device != "cpu":
        import torch

        torch.zeros(1, device=plan.device)  # torch's own CUDA start-up is no loader's memory
    try:
        for name, make in makers:
            before = memory(plan.device)
            if make is None:
                loaders[name] = _dali_readers_file(plan, work / "images", spec)
            else:
                loaders[name] = make()
            n, dt = _epoch_loop(loaders[name], plan.device)  # warm-up epoch: buffers, pools, workers
            after = memory(plan.device)
            gb, ga = _gpu_bytes(before), _gpu_bytes(after)
            entries[name] = {
                "runs": [], "warmup_images_per_s": round(n / dt, 1),
                "gpu_added_bytes": (ga - gb) if gb is not None and ga is not None else "unavailable",
                "anon_added_bytes": after["anon"] - before["anon"], "file_added_bytes": after["file"] - before["file"],
                "after": {k: after[k] for k in ("rss", "anon", "file")},
            }  # fmt: skip
            if name == "FastLoader":
                spec = _graph_spec(plan, loaders[name], stats, max_px)
                est = memory_estimate(spec)
                entries[name]["estimate"] = {"gpu_bytes": est["device"], "pinned_bytes": est["pinned"], "threads": est["threads"]}
        for _ in range(plan.repeats):  # interleaved: epoch r of every loader, then epoch r+1
            for name, loader in loaders.items():
                n, dt = _epoch_loop(loader, plan.device)
                entries[name]["runs"].append(round(n / dt, 1))
    finally:
        for loader in loaders.values():
            close = getattr(loader, "close", None)
            if callable(close):
                close()
    for e in entries.values():
        e["images_per_s"] = statistics.median(e["runs"])
    fl = entries["FastLoader"]["images_per_s"]
    for e in entries.values():
        e["fastloader_ratio"] = round(fl / e["images_per_s"], 2) if e["images_per_s"] else None
    res["loaders"] = entries


def _recipe(name: str, crop: int):
    """The transform of a recipe row: DeiT's (timm's own ``create_transform``; torchvision's RandAugment(2, 9) with
    bicubic and erasing where timm is not installed) or torchvision's ``ta_wide`` reference recipe."""
    import torch
    from torchvision import transforms as T
    from torchvision.transforms import InterpolationMode

    if name == "deit":
        try:
            from timm.data import create_transform

            return create_transform(crop, is_training=True, auto_augment="rand-m9-mstd0.5-inc1", interpolation="bicubic",
                                    re_prob=0.25, re_mode="pixel"), "timm rand-m9-mstd0.5-inc1 + pixel erasing"  # fmt: skip
        except ImportError:
            aug, what = T.RandAugment(2, 9, interpolation=InterpolationMode.BICUBIC), "torchvision RandAugment(2, 9) + erasing"
    else:
        aug, what = T.TrivialAugmentWide(), "torchvision ta_wide + erasing"
    return T.Compose([T.RandomResizedCrop(crop, interpolation=InterpolationMode.BICUBIC), T.RandomHorizontalFlip(), aug,
                      T.PILToTensor(), T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD), T.RandomErasing(0.25)]), what  # fmt: skip


def _dali_auto_aug(plan: Plan, src: Path, spec: Any, policy: str):
    """DALI's own pipeline with its ``auto_aug`` (``rand_augment`` n=2 m=9, or ``trivial_augment_wide``) and ``fn.erase``."""
    from nvidia.dali.auto_aug import rand_augment, trivial_augment
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.pytorch import DALIGenericIterator

    from fastload.pipeline import decoder_args, graph_threads, import_dali

    dali, fn, types = import_dali()
    gpu = spec.device_id is not None
    dev = "gpu" if gpu else "cpu"

    @dali.pipeline_def(batch_size=spec.batch_size, num_threads=graph_threads(spec), device_id=spec.device_id,
                       prefetch_queue_depth=spec.prefetch, seed=0, enable_conditionals=True)  # fmt: skip
    def peer():
        jpegs, labels = fn.readers.file(file_root=str(src), random_shuffle=True, name="Reader", seed=0)
        img = fn.decoders.image_random_crop(jpegs, device="mixed" if gpu else "cpu", **decoder_args(spec))
        img = fn.resize(img, device=dev, size=[spec.crop, spec.crop], antialias=True, interp_type=types.INTERP_CUBIC)
        img = fn.flip(img, device=dev, horizontal=fn.random.coin_flip())
        shape = [spec.crop, spec.crop]
        img = rand_augment.rand_augment(img, n=2, m=9, shape=shape) if policy == "rand" else \
            trivial_augment.trivial_augment_wide(img, shape=shape)  # fmt: skip
        img = fn.crop_mirror_normalize(img, device=dev, mean=list(spec.mean), std=list(spec.std), dtype=types.FLOAT,
                                       output_layout="CHW")  # fmt: skip
        side = fn.random.uniform(range=[0.1, 0.5], shape=[2])
        img = fn.erase(img, anchor=fn.random.uniform(range=[0.0, 0.5], shape=[2]), shape=side, normalized=True,
                       axis_names="HW", fill_value=0.0)  # fmt: skip
        return img, (labels.gpu() if gpu else labels)

    pipe = peer()
    pipe.build()
    return DALIGenericIterator(pipe, ["images", "labels"], reader_name="Reader", last_batch_policy=LastBatchPolicy.DROP, auto_reset=True)


def step_augment(plan: Plan, res: dict, work: Path) -> None:
    """The recipes of today's scripts in the graph: DeiT's and ta_wide through FastLoader, beside DALI's own auto_aug
    pipelines on the same images: checked (finite, shapes, erased and augmented), then timed, interleaved."""
    import torch

    import fastload

    ds = fastload.Dataset(work / "packed")
    rows: dict[str, Any] = {}
    for recipe, policy in (("deit", "rand"), ("ta_wide", "trivial")):
        tf, what = _recipe(recipe, plan.crop)
        fl = _fastloader(plan, work / "packed", transform=tf)
        x, y = next(iter(fl))
        if tuple(x.shape) != (plan.batch, 3, plan.crop, plan.crop) or not torch.isfinite(x).all():
            raise CheckFailed(f"{recipe}: batch {tuple(x.shape)}, finite: {bool(torch.isfinite(x).all())}")
        spec = _graph_spec(plan, fl, ds.manifest.stats, ds.manifest.max_pixels)
        peer = _dali_auto_aug(plan, work / "images", spec, policy)
        loaders = {f"FastLoader {recipe}": fl, f"DALI auto_aug {policy}": peer}
        entries = {k: {"runs": []} for k in loaders}
        try:
            for name, loader in loaders.items():
                _epoch_loop(loader, plan.device)  # warm-up
            for _ in range(plan.repeats):
                for name, loader in loaders.items():
                    n, dt = _epoch_loop(loader, plan.device)
                    entries[name]["runs"].append(round(n / dt, 1))
        finally:
            fl.close()
        for e in entries.values():
            e["images_per_s"] = statistics.median(e["runs"])
        rows[recipe] = {"recipe": what, **entries}
    res["recipes"] = rows


def step_training(plan: Plan, res: dict, work: Path) -> None:
    import fastload
    from fastload.bench.models import TrainStep, build_model

    classes = len(fastload.Dataset(work / "packed").classes)
    total = plan.train_warmup + plan.train_steps
    if plan.device != "cpu":
        import torch

        torch.backends.cudnn.benchmark = True  # fixed shapes: the fastest convolutions, chosen in the warm-up
    for name, make in (
        ("FastLoader", lambda: _fastloader(plan, work / "packed", channels_last=plan.device != "cpu")),
        (f"DataLoader ({plan.workers} workers)", lambda: _dataloader(plan, work / "images")),
    ):
        loader = make()
        step = TrainStep(build_model(plan.model, classes, plan.device), plan.device)  # AMP + channels-last on CUDA
        prof = fastload.profile(loader, warmup=plan.train_warmup, sample_interval=0.2, name=name, log_summary=False)
        done = 0
        try:
            while done < total:
                for x, y in prof:
                    step(x, y)
                    done += 1
                    if done >= total:
                        break
        finally:
            prof.close()
            close = getattr(loader, "close", None)
            if callable(close):
                close()
        s = prof.stats()
        res[name] = {k: s[k] for k in ("steps", "images_per_s", "wait_fraction", "wait_ms", "step_ms", "gpu_util", "gpu_reason", "verdict")}
    res["model"] = f"{plan.model}, AMP bf16, channels-last" if plan.device != "cpu" else f"{plan.model}, float32 (CPU)"


class CheckFailed(Exception):
    """A correctness step found a difference."""


class Unavailable(Exception):
    """A step cannot run on this machine (a missing package); reported, not failed."""


# ----------------------------------------------------------------------------- report


def _fmt_util(u: Any) -> str:
    return f"{u['mean']:.0f}% (max {u['max']:.0f}%)" if isinstance(u, dict) else str(u)


def _mb(v: Any) -> str:
    return f"{v / 2**20:,.0f} MB" if isinstance(v, (int, float)) else str(v)


def render_markdown(r: dict) -> str:
    m, st = r["machine"], r["steps"]
    L = [
        f"# GPU check{' (CPU dry run)' if r['dry_run'] else ''}",
        "",
        f"{m.get('gpu', 'no GPU')}; {m.get('cpu')} ({m.get('cores')} cores); Python {m['python']}, torch {m['torch']}, "
        f"DALI {m.get('dali')}. {r.get('images', '?')} generated JPEGs, batch {r['plan']['batch']}, crop {r['plan']['crop']}. "
        f"Total {r['elapsed_s']:.0f} s.",
        "",
        "![throughput per loader; training step waiting share](report.png)",
        "",
        "| step | status | s | result |",
        "|---|---|---:|---|",
    ]
    for name, s in st.items():
        L.append(f"| {name} | {s['status']} | {s.get('seconds', 0):.1f} | {str(s.get('note', '')).replace('|', '/')} |")
    tp = st.get("throughput", {}).get("loaders")
    if tp:
        L += ["", "## Throughput (images/s, median of interleaved epochs)", "",
              "| loader | images/s | runs | FastLoader ÷ this | GPU memory added | anon RSS added | file-backed added |",
              "|---|---:|---|---:|---:|---:|---:|"]  # fmt: skip
        for name, e in tp.items():
            L.append(f"| {name} | {e['images_per_s']:,.0f} | {e['runs']} | {e['fastloader_ratio']} | {_mb(e['gpu_added_bytes'])} "
                     f"| {_mb(e['anon_added_bytes'])} | {_mb(e['file_added_bytes'])} |")  # fmt: skip
        est = tp.get("FastLoader", {}).get("estimate")
        if est:
            L += ["", f"FastLoader's estimate (fastload.pipeline.memory_estimate): {_mb(est['gpu_bytes'])} GPU, "
                      f"{_mb(est['pinned_bytes'])} pinned, {est['threads']} DALI threads."]  # fmt: skip
    tr = st.get("training", {})
    if tr.get("status") == "ok":
        L += ["", f"## Training ({tr['model']})", "", "| loader | images/s | waiting | step (ms) | GPU util |", "|---|---:|---:|---:|---|"]
        for name, e in tr.items():
            if isinstance(e, dict) and "wait_fraction" in e:
                L.append(f"| {name} | {e['images_per_s'] or 0:,.0f} | {e['wait_fraction']:.1%} | {e['step_ms'] or 0:.1f} | {_fmt_util(e['gpu_util'])} |")
    hw = st.get("hw_decoder", {})
    if hw.get("status") == "ok":
        L += ["", "## Hardware JPEG decoder", "", "| setting | images/s | NVML JPEG util | GPU util |", "|---|---:|---|---|"]
        for k in ("hw_decoder_load=0", "default"):
            L.append(f"| {k} | {hw[k]['images_per_s']:,.0f} | {_fmt_util(hw[k]['jpeg_util'])} | {_fmt_util(hw[k]['gpu_util'])} |")
    ag = st.get("agreement", {})
    if ag.get("status") in ("ok", "failed") and "eval" in ag:
        L += ["", "## Agreement with the CPU path (per image)", "", "| mode | images | PSNR min | PSNR median | max abs diff (max) | below floor |",
              "|---|---:|---:|---:|---:|---:|"]  # fmt: skip
        for k in ("eval", "train"):
            a = ag[k]
            L.append(f"| {k} | {a['images']} | {a['psnr_min']} dB | {a['psnr_median']} dB | {a['max_abs_max']} | {a['below_floor']} (floor {a['floor_db']} dB) |")
    L += ["", "Every number, per image and per run, is in `report.json`."]
    return "\n".join(L) + "\n"


def plot(r: dict, path: Path) -> None:
    """Throughput bars and training waiting shares; matplotlib if present, else drawn with PIL."""
    tp = (r["steps"].get("throughput") or {}).get("loaders") or {}
    tr = r["steps"].get("training") or {}
    bars = [(n, e["images_per_s"]) for n, e in tp.items()]
    waits = [(n, e["wait_fraction"]) for n, e in tr.items() if isinstance(e, dict) and e.get("wait_fraction") is not None]
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 3))
        a1.barh([n for n, _ in bars], [v for _, v in bars], color="#2a9d8f")
        a1.set_xlabel("images/s (median)")
        a1.invert_yaxis()
        a2.barh([n for n, _ in waits], [100 * v for _, v in waits], color="#e76f51")
        a2.set_xlabel("% of each training step waiting for data")
        a2.invert_yaxis()
        fig.tight_layout()
        fig.savefig(path, dpi=100)
        plt.close(fig)
        return
    except ImportError:
        pass
    from PIL import Image, ImageDraw

    rows = [("images/s", n, v, max([b for _, b in bars] or [1])) for n, v in bars] + [("waiting", n, v, 1.0) for n, v in waits]
    img = Image.new("RGB", (900, 30 + 28 * max(1, len(rows))), "white")
    d = ImageDraw.Draw(img)
    for i, (kind, n, v, top) in enumerate(rows):
        y = 15 + 28 * i
        d.text((10, y), f"{kind}: {n}", fill="black")
        d.rectangle([330, y, 330 + int(450 * v / (top or 1)), y + 18], fill="#2a9d8f" if kind == "images/s" else "#e76f51")
        d.text((790, y), f"{v:,.0f}" if kind == "images/s" else f"{v:.1%}", fill="black")
    img.save(path)


def short_table(r: dict) -> str:
    st = r["steps"]
    lines = [f"{'step':14s} {'status':12s} result"]
    for name, s in st.items():
        lines.append(f"{name:14s} {s['status']:12s} {s.get('note', '')}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main


def _note(name: str, res: dict) -> str:
    if name == "preflight":
        return f"{res.get('decoder')} decoder ran one batch"
    if name == "data":
        return f"{res.get('images')} images, made in {res.get('make_s')} s, packed in {res.get('pack_s')} s"
    if name == "pytest":
        return res.get("summary", "")
    if name == "agreement":
        return "; ".join(f"{k}: PSNR min {res[k]['psnr_min']} dB, max abs {res[k]['max_abs_max']}" for k in ("eval", "train") if k in res)
    if name == "race":
        return f"{res.get('batches')} batches, delayed consumer equal: {res.get('equal')}"
    if name == "hw_decoder":
        return "; ".join(f"{k}: {res[k]['images_per_s']:,.0f}/s, JPEG util {_fmt_util(res[k]['jpeg_util'])}"
                         for k in ("hw_decoder_load=0", "default") if k in res)  # fmt: skip
    if name == "throughput":
        return "; ".join(f"{k} {e['images_per_s']:,.0f}/s" for k, e in res.get("loaders", {}).items())
    if name == "augment":
        return "; ".join(f"{k} {e['images_per_s']:,.0f}/s" for row in res.get("recipes", {}).values()
                         for k, e in row.items() if isinstance(e, dict))  # fmt: skip
    if name == "training":
        return "; ".join(f"{k} waits {e['wait_fraction']:.1%}, GPU {_fmt_util(e['gpu_util'])}"
                         for k, e in res.items() if isinstance(e, dict) and e.get("wait_fraction") is not None)  # fmt: skip
    return ""


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=None, help="JPEGs to generate (default 8000; 48 on a dry run)")
    ap.add_argument("--repeats", type=int, default=None, help="timed epochs per loader (default 3; 2 on a dry run)")
    ap.add_argument("--work", default=None, help="scratch directory (default /tmp/fastload-gpu-check[-dry])")
    ap.add_argument("--out", default=None, help="report directory (default $OUT/gpu-h200 or benchmarks/results/gpu-h200)")
    ap.add_argument("--budget-s", type=float, default=480.0, help="skip the steps that would start after this many seconds")
    ap.add_argument("--cpu-dry-run", action="store_true", help="every step on the CPU, small: tests this script")
    a = ap.parse_args(argv)
    import torch

    plan = Plan(a)
    if not plan.dry and not torch.cuda.is_available():
        print("no CUDA device: use --cpu-dry-run", file=sys.stderr)
        return 2
    work = Path(a.work or ("/tmp/fastload-gpu-check-dry" if plan.dry else "/tmp/fastload-gpu-check"))
    if a.out:
        out = Path(a.out)
    elif plan.dry:
        out = work / "report"
    else:
        out = Path(os.environ["OUT"]) / "gpu-h200" if os.environ.get("OUT") else ROOT / "benchmarks" / "results" / "gpu-h200"
    work.mkdir(parents=True, exist_ok=True)
    t_start = time.perf_counter()
    report: dict[str, Any] = {"dry_run": plan.dry, "machine": machine(), "plan": {k: v for k, v in vars(plan).items()}, "steps": {}}
    steps: list[tuple[str, Callable[[dict], None], bool]] = [
        ("preflight", lambda r: step_preflight(plan, r), True),
        ("data", lambda r: step_data(plan, r, work), True),
        ("pytest", lambda r: step_pytest(plan, r), False),
        ("agreement", lambda r: step_agreement(plan, r, work / "packed"), False),
        ("race", lambda r: step_race(plan, r, work / "packed"), False),
        ("hw_decoder", lambda r: step_hw_decoder(plan, r, work / "packed"), False),
        ("throughput", lambda r: step_throughput(plan, r, work), False),
        ("augment", lambda r: step_augment(plan, r, work), False),
        ("training", lambda r: step_training(plan, r, work), False),
    ]
    rc = 0
    for name, fn, essential in steps:
        res: dict[str, Any] = {}
        report["steps"][name] = res
        if time.perf_counter() - t_start > plan.budget_s:
            res.update(status="skipped", note=f"time budget of {plan.budget_s:.0f} s spent")
            continue
        print(f"[{time.perf_counter() - t_start:5.0f} s] {name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            fn(res)
            res["status"] = "ok"
            res["note"] = _note(name, res)
        except CheckFailed as e:
            res.update(status="failed", note=str(e))
            rc = 1
        except Unavailable as e:
            res.update(status="unavailable", note=str(e))
        except Exception as e:
            res.update(status="error", note=f"{type(e).__name__}: {e}".splitlines()[0][:400], traceback=traceback.format_exc()[-3000:])
            rc = 1
        res["seconds"] = round(time.perf_counter() - t0, 1)
        print(f"        {res['status']}: {res['note']}", flush=True)
        if res["status"] in ("error", "failed") and essential:
            rc = 3 if name == "preflight" else 1
            for later, _, _ in steps[steps.index((name, fn, essential)) + 1 :]:
                report["steps"][later] = {"status": "skipped", "note": f"{name} failed"}
            break
    report["elapsed_s"] = round(time.perf_counter() - t_start, 1)
    report["images"] = report["steps"].get("data", {}).get("images")
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=str) + "\n")
    (out / "report.md").write_text(render_markdown(report))
    plot(report, out / "report.png")
    print(f"\nreport: {out}/report.{{md,json,png}}\n")
    print(short_table(report))
    return rc


if __name__ == "__main__":
    sys.exit(main())
