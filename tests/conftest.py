"""Shared fixtures: small image folders whose pixels encode their label and index, or their position.

Solid-colour images (:func:`encode_color`, ``make_folder``): R encodes the label, G and B
the index within the whole folder (``index = (G // 16) + 16 * (B // 16)``), on a 16-level
grid so that JPEG round trips, crops, flips and resizes keep them readable.

Position images (:func:`position_pattern`, ``pixel_dataset``, ``rotated_dataset``): R is
the x coordinate, G the y coordinate, B the label plus a one-pixel checkerboard, so a
crop's place, size, flip and resize filter all show in its pixels (``tests/reference.py``
computes what each should look like).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from PIL import Image
from s3server import fresh_s3, s3  # noqa: F401  (fixtures: a real S3 server for the object-store tests)
from azserver import azurite  # noqa: F401  (fixture: a real Azure Blob server for the az:// tests)
from gcsserver import gcs  # noqa: F401  (fixture: a real Google Cloud Storage server for the gs:// tests)

STEP = 16


def _numba_cache_per_kernel_sources() -> None:
    """The compiled kernels (fastload/augment/kernels) cached per version of their sources, under .pytest_cache:
    numba's own cache key is the file that defines an entry point, blind to a change in a kernel it calls from
    another file, so a test never runs a kernel older than its source. Set before anything imports numba."""
    import hashlib

    root = Path(__file__).resolve().parent.parent
    sources = sorted((root / "fastload" / "augment" / "kernels").glob("*.py"))
    digest = hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in sources)).hexdigest()[:16]
    os.environ.setdefault("NUMBA_CACHE_DIR", str(root / ".pytest_cache" / "numba" / digest))


_numba_cache_per_kernel_sources()


def encode_color(label: int, index: int) -> tuple[int, int, int]:
    """Solid colour of the image with ``label`` and global ``index`` (< 256, label < 16)."""
    if not (0 <= label < 16 and 0 <= index < 256):
        raise ValueError("encode_color supports label < 16 and index < 256")
    return (label * STEP + STEP // 2, (index % 16) * STEP + STEP // 2, (index // 16) * STEP + STEP // 2)


def decode_color(rgb) -> tuple[int, int]:
    """Inverse of :func:`encode_color` from a mean RGB (0..255 floats): ``(label, index)``."""
    r, g, b = (int(np.clip(c, 0, 255)) // STEP for c in rgb)
    return r, g + 16 * b


def decode_batch(images: np.ndarray, mean=None, std=None) -> list[tuple[int, int]]:
    """Decode ``(label, index)`` of each image of an NCHW batch (normalized or uint8)."""
    x = np.asarray(images, dtype=np.float64)
    if mean is not None:
        x = x * np.asarray(std).reshape(1, 3, 1, 1) + np.asarray(mean).reshape(1, 3, 1, 1)
        x = x * 255.0
    # centre region: edges may blend after resize
    h, w = x.shape[2], x.shape[3]
    c = x[:, :, h // 4 : 3 * h // 4, w // 4 : 3 * w // 4].mean(axis=(2, 3))
    return [decode_color(row) for row in c]


def decode_batches(batches, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225)) -> list[tuple[int, int]]:
    """``(label, index)`` of every image of normalised ``(images, labels)`` batches, from the pixels; each
    batch's label tensor is checked against what its pixels say."""
    out = []
    for x, y in batches:
        dec = decode_batch(x.float().numpy(), mean, std)
        assert [d[0] for d in dec] == y.tolist()  # the label tensor agrees with the pixels
        out += dec
    return out


def write_image(path: Path, color, size=(64, 48), fmt: str | None = None, mode: str = "RGB", **save) -> Path:
    """Write a solid image of ``color`` and ``size`` (w, h) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, tuple(color))
    if mode != "RGB":
        img = img.convert(mode)
    img.save(path, format=fmt, **save)
    return path


def paint_folder(root: Path, classes: int = 3, per_class: int = 4, size=(64, 48), ext: str = ".jpg",
                 quality: int | None = 95, digits: int = 4) -> Path:  # fmt: skip
    """An ImageFolder at ``root``: ``class_<label>/img_<j>`` images, numbered in torchvision ImageFolder
    order, each a solid colour that encodes (label, index); ``quality`` None: PIL's default."""
    index = 0
    for label in range(classes):
        for j in range(per_class):
            p = root / f"class_{label}" / f"img_{j:0{digits}d}{ext}"
            kw = {"quality": quality} if quality is not None and ext in (".jpg", ".jpeg") else {}
            write_image(p, encode_color(label, index), size=size, **kw)
            index += 1
    return root


@pytest.fixture
def make_folder(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``make_folder(classes=3, per_class=4, size=(64, 48), ext=".jpg")`` -> root.

    Classes are named ``class_0``, ``class_1``... Images are numbered in
    torchvision ImageFolder order, and their colour encodes (label, index).
    """
    counter = {"n": 0}

    def make(classes: int = 3, per_class: int = 4, size=(64, 48), ext: str = ".jpg", name: str | None = None, quality: int = 95) -> Path:
        counter["n"] += 1
        return paint_folder(tmp_path / (name or f"images{counter['n']}"), classes, per_class, size, ext, quality)

    return make


# ----------------------------------------------------------------------------- position images

#: B = PATTERN_BASE + PATTERN_STEP * label, then +/- PATTERN_CHECK on a one-pixel checkerboard.
PATTERN_BASE, PATTERN_STEP, PATTERN_CHECK = 36, 60, 24
#: Source sizes (w, h) of the position images: landscape, portrait, square, wide, odd.
PATTERN_SIZES = [(80, 56), (56, 80), (72, 72), (96, 64), (67, 75)]


def resumed_like_local(local: Path, url: str, *, epoch: int, stop_after: int, seed: int, **opts) -> list:
    """The batches of ``epoch`` from ``url``, read ``stop_after`` batches by one loader and the rest by a
    second one resumed from its ``state_dict`` (through JSON), checked bit-identical (CPU path) to one
    uninterrupted epoch of the local copy ``local``, with the same ``len`` and classes; returns them.
    ``opts``: the URL's loader options (``storage_options``, ``cache_dir``, ``fetch``...)."""
    import json

    import torch

    from fastload import FastLoader

    kw = dict(device="cpu", crop=32, seed=seed, train=True)
    with FastLoader(local, 5, **kw) as ref_loader:
        ref_loader.set_epoch(epoch)
        ref = [(x.clone(), y.clone()) for x, y in ref_loader]
        n_ref, classes = len(ref_loader), ref_loader.classes
    with FastLoader(url, 5, **kw, **opts) as a:
        assert len(a) == n_ref and a.classes == classes
        a.set_epoch(epoch)
        it = iter(a)
        first = [next(it) for _ in range(stop_after)]
        state = json.loads(json.dumps(a.state_dict()))
    with FastLoader(url, 5, **kw, **opts) as b:
        b.load_state_dict(state)
        rest = list(b)
    got = first + rest
    assert len(got) == len(ref)
    for (x1, y1), (x2, y2) in zip(got, ref):  # bit-identical on the CPU path
        assert torch.equal(y1, y2) and torch.equal(x1, x2)
    return got


def position_pattern(w: int, h: int, label: int, *, checker: bool = True) -> np.ndarray:
    """An HWC uint8 image whose pixels say where they are: R = x, G = y (each 0..255 across the
    image), B = the label's level with a +/-24 one-pixel checkerboard (``checker``).

    The gradients make any shift, scale, swap of width and height or flip of a crop change
    almost every pixel; the checkerboard is what tells resize filters apart (bilinear
    averages it to the label's level, nearest keeps its extremes). ``label`` < 4.
    """
    if not 0 <= label < 4:
        raise ValueError(f"position_pattern supports labels 0..3, got {label}")
    yy, xx = np.mgrid[0:h, 0:w]
    r = np.rint(xx * 255.0 / max(w - 1, 1))
    g = np.rint(yy * 255.0 / max(h - 1, 1))
    b = np.full((h, w), PATTERN_BASE + PATTERN_STEP * label, dtype=np.float64)
    if checker:
        b += np.where((xx + yy) % 2 == 0, PATTERN_CHECK, -PATTERN_CHECK)
    return np.stack([r, g, b], axis=-1).astype(np.uint8)


def pattern_label(image_hwc: np.ndarray) -> int:
    """The label a position image's B channel says (its mean survives crops, flips and resizes)."""
    b = float(np.asarray(image_hwc, dtype=np.float64)[..., 2].mean())
    return int(round((b - PATTERN_BASE) / PATTERN_STEP))


def save_lossless_jpeg(path: Path, image_hwc: np.ndarray, **save) -> Path:
    """Save as a quality-100 4:4:4 baseline JPEG: stored by ``pack`` byte for byte, within +/-2 of the array."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(image_hwc).save(path, "JPEG", quality=100, subsampling=0, **save)
    return path


@dataclasses.dataclass(frozen=True)
class PixelData:
    """A packed dataset of position images: its source folder, packed path, and each sample's label and size."""

    src: Path
    packed: Path
    labels: list[int]
    sizes: list[tuple[int, int]]


PIXEL_CLASSES, PIXEL_PER_CLASS = 3, 8


@pytest.fixture(scope="session")
def pixel_dataset(tmp_path_factory) -> PixelData:
    """24 position images (3 classes x 8, the sizes of :data:`PATTERN_SIZES` in turn), packed.

    The JPEGs are quality 100 with full-resolution chroma, so ``pack`` stores them as they
    are and every decoder reads back the same pixels (within one or two levels). Read-only:
    tests must not change it.
    """
    import fastload

    base = tmp_path_factory.mktemp("pixels")
    labels, sizes = [], []
    for label in range(PIXEL_CLASSES):
        for j in range(PIXEL_PER_CLASS):
            w, h = PATTERN_SIZES[(label * PIXEL_PER_CLASS + j) % len(PATTERN_SIZES)]
            save_lossless_jpeg(base / "src" / f"class_{label}" / f"{j:02d}.jpg", position_pattern(w, h, label))
            labels.append(label)
            sizes.append((w, h))
    fastload.pack(base / "src", base / "packed", workers=1, progress=False)
    return PixelData(base / "src", base / "packed", labels, sizes)


#: EXIF orientations of ``rotated_dataset``'s samples, in sample order (label = position in this list).
ROTATED_ORIENTATIONS = (6, 8, 3)
ROTATED_SOURCE_SIZE = (80, 56)  # (w, h) as stored in the file, before its EXIF rotation


@pytest.fixture(scope="session")
def rotated_dataset(tmp_path_factory) -> PixelData:
    """Position images (smooth: no checkerboard) saved with EXIF orientations 6, 8 and 3, packed.

    ``pack`` turns them upright and re-encodes them (quality 100 here); ``sizes`` are the
    upright sizes. Read-only.
    """
    import fastload

    base = tmp_path_factory.mktemp("rotated")
    sizes = []
    for label, orientation in enumerate(ROTATED_ORIENTATIONS):
        w, h = ROTATED_SOURCE_SIZE
        exif = Image.Exif()
        exif[0x0112] = orientation
        save_lossless_jpeg(
            base / "src" / f"class_{label}" / "rotated.jpg", position_pattern(w, h, label, checker=False), exif=exif.tobytes()
        )
        sizes.append((h, w) if orientation in (5, 6, 7, 8) else (w, h))
    fastload.pack(base / "src", base / "packed", workers=1, progress=False, quality=100)
    return PixelData(base / "src", base / "packed", list(range(len(ROTATED_ORIENTATIONS))), sizes)


def pytest_collection_modifyitems(config, items):
    """Skip ``gpu`` tests when no CUDA device is present."""
    try:
        import torch

        has_cuda = torch.cuda.is_available()
    except Exception:  # pragma: no cover
        has_cuda = False
    if has_cuda:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


os.environ.setdefault("PYTHONHASHSEED", "0")
