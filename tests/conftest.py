"""Shared fixtures: small image folders whose pixels encode their label and index.

Every generated image is a solid colour: R encodes the label, G and B the index
within the whole folder (``index = (G // 16) + 16 * (B // 16)``), on a 16-level grid
so that JPEG round trips, crops, flips and resizes keep them readable.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
from PIL import Image

STEP = 16


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


def write_image(path: Path, color, size=(64, 48), fmt: str | None = None, mode: str = "RGB", **save) -> Path:
    """Write a solid image of ``color`` and ``size`` (w, h) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    img = Image.new("RGB", size, tuple(color))
    if mode != "RGB":
        img = img.convert(mode)
    img.save(path, format=fmt, **save)
    return path


@pytest.fixture
def make_folder(tmp_path: Path) -> Callable[..., Path]:
    """Factory: ``make_folder(classes=3, per_class=4, size=(64, 48), ext=".jpg")`` -> root.

    Classes are named ``class_0``, ``class_1``... Images are numbered in
    torchvision ImageFolder order, and their colour encodes (label, index).
    """
    counter = {"n": 0}

    def make(classes: int = 3, per_class: int = 4, size=(64, 48), ext: str = ".jpg", name: str | None = None, quality: int = 95) -> Path:
        counter["n"] += 1
        root = tmp_path / (name or f"images{counter['n']}")
        index = 0
        for label in range(classes):
            for j in range(per_class):
                p = root / f"class_{label}" / f"img_{j:04d}{ext}"
                kw = {"quality": quality} if ext in (".jpg", ".jpeg") else {}
                write_image(p, encode_color(label, index), size=size, **kw)
                index += 1
        return root

    return make


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
