"""A built-in, ImageNet-like sample dataset made from photos that ship with scikit-image.

:func:`make_sample` writes an ImageFolder tree of JPEGs (about 500x375, quality 90,
about 100 KB each) for demos, tests and benchmarks, with no download: the photos
come from the ``skimage/data`` directory inside scikit-image's wheel (located
without importing scikit-image, and without its network fetchers).

Each class draws from its own photos, so classes differ; each image is a random
crop, resized, with a little colour and brightness jitter, film-grain noise and a
faint texture overlay (which brings the file size up to that of real photos),
sometimes mirrored; about 5% are progressive JPEGs, the rest baseline. Every image
depends only on ``(seed, class, index)``, so the output is byte-for-byte the same
whatever the number of worker processes.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import io
import json
import logging
import os
import shutil
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ConfigError, DependencyError, as_int

__all__ = ["make_sample", "SAMPLE_MARKER", "CLASS_PHOTOS"]

log = logging.getLogger(__name__)

#: File written at the root of a sample tree (hidden, so ImageFolder ignores it):
#: the parameters it was made with, used to reuse or safely replace it.
SAMPLE_MARKER = ".fastload-sample.json"

#: Classes in label order: (name, photos in ``skimage/data``). Grayscale photos are
#: converted to RGB. Beyond these, classes reuse them (with a distinct index prefix).
CLASS_PHOTOS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("astronaut", ("astronaut.png",)),
    ("cat", ("chelsea.png",)),
    ("coffee", ("coffee.png",)),
    ("rocket", ("rocket.jpg",)),
    ("retina", ("retina.jpg",)),
    ("galaxy", ("hubble_deep_field.jpg",)),
    ("motorcycle", ("motorcycle_left.png", "motorcycle_right.png")),
    ("tissue", ("ihc.png",)),
    ("cameraman", ("camera.png",)),
    ("texture", ("brick.png", "grass.png", "gravel.png")),
    ("coins", ("coins.png",)),
    ("moon", ("moon.png",)),
)
_TEXTURES = ("grass.png", "gravel.png")

_INSTALL_HINT = "pip install 'fastload[sample]'"
_MAX_CLASSES = 1000
_MAX_IMAGES = 10_000_000
_PROGRESSIVE = 0.05  # fraction of progressive JPEGs
_SUBSAMPLING_444 = 0.6  # fraction saved with full-resolution chroma (the rest 4:2:0)


@dataclasses.dataclass(frozen=True)
class _Job:
    label: int
    index: int  # index within the class
    path: str
    photos: tuple[str, ...]


# ----------------------------------------------------------------------------- validation


def _check_size(size) -> tuple[int, int]:
    ok = isinstance(size, (tuple, list)) and len(size) == 2
    ok = ok and all(isinstance(v, (int, np.integer)) and not isinstance(v, bool) for v in size)
    if not ok or not all(16 <= v <= 8192 for v in size):
        raise ConfigError(f"size must be (width, height) with each in 16..8192 pixels, got {size!r}; e.g. size=(500, 375)")
    return int(size[0]), int(size[1])


def photo_dir() -> Path:
    """``skimage/data`` of the installed scikit-image, found without importing it."""
    try:
        spec = importlib.util.find_spec("skimage")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise DependencyError(f"the sample dataset needs scikit-image's bundled photos; {_INSTALL_HINT}")
    for loc in spec.submodule_search_locations:
        d = Path(loc) / "data"
        if d.is_dir():
            return d
    raise DependencyError(f"scikit-image is installed without its data directory; reinstall it: {_INSTALL_HINT}")


def _class_names(num_classes: int) -> list[str]:
    width = max(2, len(str(num_classes - 1)))
    return [f"{i:0{width}d}_{CLASS_PHOTOS[i % len(CLASS_PHOTOS)][0]}" for i in range(num_classes)]


# ----------------------------------------------------------------------------- image synthesis

_CACHE: dict[str, object] = {}


def _photo(photo_dir: str, name: str):
    """Decoded RGB photo, cached per process."""
    from PIL import Image

    key = f"photo:{photo_dir}/{name}"
    img = _CACHE.get(key)
    if img is None:
        with Image.open(os.path.join(photo_dir, name)) as im:
            img = im.convert("RGB")
        _CACHE[key] = img
    return img


def _texture(photo_dir: str, i: int) -> np.ndarray:
    """Zero-mean grayscale texture, mirrored to 2x its size so any crop fits, cached."""
    from PIL import Image

    key = f"texture:{photo_dir}/{i}"
    t = _CACHE.get(key)
    if t is None:
        with Image.open(os.path.join(photo_dir, _TEXTURES[i])) as im:
            a = np.asarray(im.convert("L"), dtype=np.float32)
        a = np.block([[a, a[:, ::-1]], [a[::-1], a[::-1, ::-1]]])
        t = a - a.mean()
        _CACHE[key] = t
    return t  # type: ignore[return-value]


def crop_plan(rng: np.random.Generator, src_size: tuple[int, int], size: tuple[int, int]) -> tuple[int, int, tuple[float, ...]]:
    """Output size and source box of one sample image: ``(w, h, (x0, y0, x1, y1))``.

    The window is 0.9..1.25x the source's scale, shrunk to fit the photo; its corner is
    drawn inside the photo (a window that fills the photo after rounding has its corner at 0).
    """
    sw, sh = src_size
    w = int(rng.integers(int(size[0] * 0.8), int(size[0] * 1.12) + 1))
    h = int(rng.integers(int(size[1] * 0.8), int(size[1] * 1.12) + 1))
    zoom = rng.uniform(0.9, 1.25)
    cw, ch = w / zoom, h / zoom
    fit = min(1.0, sw / cw, sh / ch)
    cw, ch = min(cw * fit, sw), min(ch * fit, sh)  # cw * (sw / cw) can round to just above sw
    x, y = rng.uniform(0, max(0.0, sw - cw)), rng.uniform(0, max(0.0, sh - ch))
    return w, h, (x, y, x + cw, y + ch)


def _render(job: _Job, *, photo_dir: str, seed: int, size: tuple[int, int], quality: int) -> bytes:
    """Encoded JPEG of one sample image; depends only on the arguments."""
    from PIL import Image, ImageFilter

    rng = np.random.default_rng([seed, job.label, job.index])
    src = _photo(photo_dir, job.photos[int(rng.integers(len(job.photos)))])
    w, h, box = crop_plan(rng, src.size, size)
    img = src.resize((w, h), Image.BICUBIC, box=box)
    if rng.random() < 0.5:
        img = img.transpose(Image.FLIP_LEFT_RIGHT)
    img = img.filter(ImageFilter.UnsharpMask(radius=2, percent=int(rng.integers(80, 161)), threshold=2))

    a = np.asarray(img, dtype=np.float32)
    gain = rng.uniform(0.85, 1.15) * rng.uniform(0.92, 1.08, 3).astype(np.float32)  # brightness, colour
    tex = _texture(photo_dir, int(rng.integers(len(_TEXTURES))))
    ty, tx = int(rng.integers(0, tex.shape[0] - h + 1)), int(rng.integers(0, tex.shape[1] - w + 1))
    luma = tex[ty : ty + h, tx : tx + w] * rng.uniform(0.15, 0.3)
    luma += rng.normal(0.0, 7.0, (h, w)).astype(np.float32)
    a = a * gain + luma[:, :, None] + rng.normal(0.0, 4.0, a.shape).astype(np.float32)
    out = Image.fromarray(np.clip(a + 0.5, 0, 255).astype(np.uint8), "RGB")

    progressive = bool(rng.random() < _PROGRESSIVE)
    subsampling = 0 if rng.random() < _SUBSAMPLING_444 else 2
    buf = io.BytesIO()
    out.save(buf, "JPEG", quality=quality, subsampling=subsampling, progressive=progressive, optimize=progressive)
    return buf.getvalue()


def _write_chunk(jobs: Sequence[_Job], photo_dir: str, seed: int, size: tuple[int, int], quality: int) -> int:
    total = 0
    for job in jobs:
        data = _render(job, photo_dir=photo_dir, seed=seed, size=size, quality=quality)
        with open(job.path, "wb") as f:
            f.write(data)
        total += len(data)
    return total


# ----------------------------------------------------------------------------- public API


def make_sample(
    out: str | os.PathLike,
    *,
    num_images: int = 3000,
    num_classes: int = 10,
    seed: int = 0,
    size: tuple[int, int] = (500, 375),
    quality: int = 90,
    overwrite: bool = False,
    workers: int | None = None,
) -> Path:
    """Write an ImageNet-like ImageFolder tree of JPEGs to ``out`` and return its path.

    Classes are folders ``00_astronaut``, ``01_cat``, ... (sorted order = label
    order) with ``num_images`` split evenly between them; files are
    ``<class>_<n>.jpg``, about ``size`` (each side jittered by -20%..+12%), at JPEG
    ``quality``. The tree is written under a temporary name and renamed at the end.

    If ``out`` already holds a sample made with the same arguments it is reused as
    is; any other existing ``out`` is refused unless ``overwrite=True``, which
    replaces it only if it is empty or was made by this function.

    Args:
        out: directory to create.
        num_images: total number of images (at least ``num_classes``).
        num_classes: number of classes (1..1000).
        seed: non-negative seed; the same seed gives byte-identical files.
        size: nominal ``(width, height)`` in pixels.
        quality: JPEG quality (1..100).
        overwrite: replace an existing sample (or empty directory) at ``out``.
        workers: processes to use (default: up to 2, one for small samples).

    Raises:
        ConfigError: an argument is invalid or ``out`` exists and cannot be replaced.
        DependencyError: scikit-image (the source of the photos) is not installed.
    """
    num_images = as_int("num_images", num_images, lo=1, hi=_MAX_IMAGES)
    num_classes = as_int("num_classes", num_classes, lo=1, hi=_MAX_CLASSES)
    if num_classes > num_images:
        raise ConfigError(f"num_images ({num_images}) must be at least num_classes ({num_classes}) so no class is empty")
    seed = as_int("seed", seed, lo=0, hi=2**63 - 1)
    size = _check_size(size)
    quality = as_int("quality", quality, lo=1, hi=100)
    if workers is not None:
        workers = as_int("workers", workers, lo=1, hi=256)
    if not isinstance(out, (str, os.PathLike)) or not str(out):
        raise ConfigError(f"out must be a directory path, got {out!r}")
    out = Path(out)
    photos_at = photo_dir()

    params = {"num_images": num_images, "num_classes": num_classes, "seed": seed, "size": list(size), "quality": quality}
    if out.exists() or out.is_symlink():
        if not out.is_dir():
            raise ConfigError(f"out {str(out)!r} exists and is not a directory; choose another path")
        marker = read_marker(out)
        if marker is not None and marker.get("params") == params and not overwrite:
            log.info("reusing the sample dataset in %s (same parameters)", out)
            return out
        if not overwrite:
            raise ConfigError(f"out {str(out)!r} already exists; pass overwrite=True (--overwrite) to replace it")
        if marker is None and any(out.iterdir()):
            raise ConfigError(
                f"out {str(out)!r} is not empty and was not made by make_sample; refusing to delete it "
                "(remove it yourself or choose another path)"
            )

    names = _class_names(num_classes)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    jobs: list[_Job] = []
    per, extra = divmod(num_images, num_classes)
    for label, name in enumerate(names):
        (tmp / name).mkdir(parents=True)
        photos = CLASS_PHOTOS[label % len(CLASS_PHOTOS)][1]
        for j in range(per + (label < extra)):
            jobs.append(_Job(label, j, str(tmp / name / f"{name}_{j:05d}.jpg"), photos))

    if workers is None:
        workers = 1 if num_images < 200 else max(1, min(2, os.cpu_count() or 1))
    workers = min(workers, len(jobs))
    t0 = time.perf_counter()
    try:
        if workers == 1:
            total = _write_chunk(jobs, str(photos_at), seed, size, quality)
        else:
            chunks = [jobs[i::workers] for i in range(workers)]
            with ProcessPoolExecutor(max_workers=workers) as ex:
                futs = [ex.submit(_write_chunk, c, str(photos_at), seed, size, quality) for c in chunks]
                total = sum(f.result() for f in futs)
        marker = {
            "made_by": "fastload.make_sample",
            "params": params,
            "classes": names,
            "bytes": total,
        }
        (tmp / SAMPLE_MARKER).write_text(json.dumps(marker, indent=1) + "\n")
        if out.exists():
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
            tmp.rename(out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    dt = time.perf_counter() - t0
    log.debug(
        "made %d images in %d classes (%.1f MB, %.0f KB each) in %s in %.1f s",
        num_images, num_classes, total / 1e6, total / num_images / 1e3, out, dt,
    )
    return out


def read_marker(path: Path) -> dict | None:
    try:
        data = json.loads((path / SAMPLE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("made_by") == "fastload.make_sample" else None
