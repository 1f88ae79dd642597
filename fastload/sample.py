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

import contextlib
import dataclasses
import importlib.util
import io
import json
import logging
import os
import re
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Sequence

import numpy as np

from .errors import ConfigError, DependencyError, as_int, printable

__all__ = ["make_sample", "replace_problem", "SAMPLE_MARKER", "CLASS_PHOTOS"]

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
    replaces it only if it is empty, or holds nothing but the files a sample wrote
    (its marker, its class folders and the images named in them, all named from the
    marker's parameters; :func:`replace_problem`). Anything else there (a checkpoint
    saved in it, a photo added to a class folder, a symlink) makes ``overwrite``
    refuse, naming it; and only those files are ever deleted, never a tree.

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
        problem = replace_problem(out)
        if problem:
            raise ConfigError(problem)

    names = _class_names(num_classes)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.tmp-", dir=out.parent))  # a new directory, never an old one
    layout = _Layout(names, _class_counts(num_images, num_classes))
    jobs: list[_Job] = []
    try:
        for label, name in enumerate(names):
            (tmp / name).mkdir()
            photos = CLASS_PHOTOS[label % len(CLASS_PHOTOS)][1]
            for j in range(layout.counts[label]):
                jobs.append(_Job(label, j, str(tmp / name / _image_name(name, j)), photos))
    except BaseException:
        _remove_sample_files(tmp, layout)
        raise

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
        if out.exists() or out.is_symlink():
            _replace(out, tmp)
        else:
            tmp.rename(out)
    except BaseException:
        _remove_sample_files(tmp, layout)
        raise
    dt = time.perf_counter() - t0
    log.debug(
        "made %d images in %d classes (%.1f MB, %.0f KB each) in %s in %.1f s",
        num_images, num_classes, total / 1e6, total / num_images / 1e3, out, dt,
    )
    return out


# ----------------------------------------------------------------------------- what a sample wrote


def _class_counts(num_images: int, num_classes: int) -> list[int]:
    per, extra = divmod(num_images, num_classes)
    return [per + (label < extra) for label in range(num_classes)]


def _image_name(class_name: str, j: int) -> str:
    return f"{class_name}_{j:05d}.jpg"


_INDEX = re.compile(r"_([0-9]{5,})\.jpg", re.ASCII)


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The names a sample writes: its class folders (``classes``), ``counts[k]`` images in the
    k-th, named :func:`_image_name`, and the marker at the top."""

    classes: list[str]
    counts: list[int]

    @classmethod
    def of(cls, marker: dict) -> "_Layout | None":
        """The layout a sample's marker describes (None if the marker does not describe one)."""
        params, classes = marker.get("params"), marker.get("classes")
        if not isinstance(params, dict) or not isinstance(classes, list) or not classes:
            return None
        n, k = params.get("num_images"), params.get("num_classes")
        ok = all(isinstance(v, int) and not isinstance(v, bool) for v in (n, k))
        ok = ok and 1 <= k <= _MAX_CLASSES and k <= n <= _MAX_IMAGES and len(classes) == k  # type: ignore[operator]
        ok = ok and all(isinstance(c, str) and c not in ("", ".", "..") and "/" not in c and "\0" not in c for c in classes)
        if not ok or len(set(classes)) != len(classes):
            return None
        return cls(list(classes), _class_counts(n, k))  # type: ignore[arg-type]

    def is_image(self, label: int, name: str) -> bool:
        """Whether ``name`` is one of the images a sample writes in its ``label``-th class folder."""
        prefix = self.classes[label]
        if not name.startswith(prefix):
            return False
        m = _INDEX.fullmatch(name, len(prefix))
        return m is not None and int(m.group(1)) < self.counts[label] and name == _image_name(prefix, int(m.group(1)))


def _shown(names: list[str], most: int = 5) -> str:
    s = ", ".join(printable(n) for n in names[:most])
    return s + (f" and {len(names) - most} more" if len(names) > most else "")


def _foreign(out: Path, layout: _Layout | None) -> list[str]:
    """What in ``out`` a sample of ``layout`` did not write (``name``, ``name/`` for a folder,
    ``class/name`` inside a class folder), sorted; everything when ``layout`` is None."""
    found: list[str] = []
    index = {c: k for k, c in enumerate(layout.classes)} if layout is not None else {}
    with os.scandir(out) as it:
        top = sorted(it, key=lambda e: e.name)
    for e in top:
        try:
            is_file = e.is_file(follow_symlinks=False)
            is_dir = not is_file and e.is_dir(follow_symlinks=False)
        except OSError:
            is_file = is_dir = False
        if layout is not None and is_file and e.name == SAMPLE_MARKER:
            continue
        if layout is None or not is_dir or e.name not in index:
            found.append(e.name + ("/" if is_dir else " (a symlink)" if e.is_symlink() else ""))
            continue
        k = index[e.name]
        with os.scandir(e.path) as inner:
            for f in sorted(inner, key=lambda f: f.name):
                try:
                    ours = f.is_file(follow_symlinks=False) and layout.is_image(k, f.name)
                    kind = "/" if f.is_dir(follow_symlinks=False) else " (a symlink)" if f.is_symlink() else ""
                except OSError:
                    ours, kind = False, ""
                if not ours:
                    found.append(f"{e.name}/{f.name}{kind}")
    return found


def replace_problem(out: str | os.PathLike) -> str | None:
    """Why ``overwrite`` may not replace the existing directory ``out``, in one line; None if it may.

    It may replace an empty directory, or a sample (a ``make_sample`` marker) that holds
    nothing but what a sample with the marker's parameters writes: the marker, the class
    folders it names, and in them the images ``<class>_<n>.jpg`` for ``n`` below that
    class's count, as regular files. A symlink, a file or folder added, a photo dropped into
    a class folder, a renamed image: all refused, named in the message.
    """
    out = Path(out)
    shown = printable(os.fspath(out))
    if out.is_symlink():
        return (
            f"out {shown!r} is a symlink (to {printable(os.readlink(out))}); refusing to replace it even with "
            "overwrite: pass the directory it points to, or remove the link yourself"
        )
    marker = read_marker(out)
    try:
        if marker is None:
            left = _foreign(out, None)
            if not left:
                return None
            return (
                f"out {shown!r} is not empty and was not made by make_sample; refusing to delete it "
                f"(it holds {_shown(left)}; remove it yourself or choose another path)"
            )
        layout = _Layout.of(marker)
        if layout is None:
            return f"out {shown!r}: its {SAMPLE_MARKER} does not say what the sample wrote; remove the directory yourself or choose another path"
        left = _foreign(out, layout)
    except OSError as e:
        return f"out {shown!r}: cannot look at what it holds ({e.strerror or e}); remove it yourself or choose another path"
    if left:
        return (
            f"out {shown!r} holds files make_sample did not write ({_shown(left)}); refusing to replace it even with "
            "overwrite: move them away yourself, or choose another path"
        )
    return None


def _remove_sample_files(directory: Path, layout: _Layout | None) -> list[str]:
    """Delete what a sample of ``layout`` writes in ``directory`` (its images, class folders once
    empty, the marker), then ``directory`` if that emptied it; return what was left there.
    Never raises; never deletes anything else."""
    if layout is None:
        left = []
    else:
        for k, name in enumerate(layout.classes):
            d = directory / name
            if d.is_symlink() or not d.is_dir():
                continue
            try:
                with os.scandir(d) as it:
                    entries = list(it)
            except OSError:
                continue
            for f in entries:
                with contextlib.suppress(OSError):
                    if f.is_file(follow_symlinks=False) and layout.is_image(k, f.name):
                        os.unlink(f.path)
            with contextlib.suppress(OSError):
                os.rmdir(d)
        marker = directory / SAMPLE_MARKER
        with contextlib.suppress(OSError):
            if marker.is_file() and not marker.is_symlink():
                marker.unlink()
        try:
            left = _foreign(directory, layout) if directory.is_dir() else []
        except OSError:
            left = ["?"]
    with contextlib.suppress(OSError):
        os.rmdir(directory)
    return left if os.path.lexists(directory) else []


def _aside(out: Path) -> Path:
    base = f".{out.name}.old-{os.getpid()}"
    for n in range(1000):
        p = out.with_name(base if n == 0 else f"{base}-{n}")
        if not os.path.lexists(p):
            return p
    raise ConfigError(f"{printable(os.fspath(out.parent))}: no free name to move the old sample aside ({base}-*); remove those yourself")


def _replace(out: Path, tmp: Path) -> None:
    """Move ``out`` aside, ``tmp`` into its place, then delete what the old sample wrote.

    ``out`` is checked again first (files may have been added while the new sample was
    made); whatever appears in the old one after that stays, in the directory it was moved
    to, with a warning naming it.
    """
    problem = replace_problem(out)
    if problem:
        raise ConfigError(problem)
    old_marker = read_marker(out)
    layout = _Layout.of(old_marker) if old_marker is not None else _Layout([], [])
    old = _aside(out)
    out.rename(old)
    try:
        tmp.rename(out)
    except BaseException:
        with contextlib.suppress(OSError):
            old.rename(out)  # put the old sample back
        raise
    left = _remove_sample_files(old, layout)
    if left:
        log.warning(
            "%s: the old sample moved here still holds files make_sample did not write (%s); left in place",
            printable(os.fspath(old)), _shown(left),
        )  # fmt: skip


def read_marker(path: Path) -> dict | None:
    try:
        data = json.loads((path / SAMPLE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) and data.get("made_by") == "fastload.make_sample" else None
