"""The lookup-table operations of ``ImageOps`` and timm (invert, posterize, solarize, timm's solarize_add) and PIL's
``convert("L")`` on three channels, per sample: each output level a function of its input level (and its pixel's)."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .pixel import luma

INVERT, POSTERIZE, SOLARIZE, SOLARIZE_ADD = 0, 1, 2, 3


@numba.njit(cache=True, nogil=True)
def levels(out: Any, img: Any, kind: int, value: int) -> None:
    """``kind``'s table at ``value`` (posterize: the bits' mask; solarize: the first level turned, 256 none;
    solarize_add: the levels added below 128, clipped to 255) on every level of ``img``."""
    lut = np.empty(256, dtype=np.uint8)
    for i in range(256):
        if kind == INVERT:
            lut[i] = 255 - i
        elif kind == POSTERIZE:
            lut[i] = i & value
        elif kind == SOLARIZE:
            lut[i] = 255 - i if i >= value else i
        else:
            lut[i] = min(255, i + value) if i < 128 else i
    h, w, ch = img.shape
    for y in range(h):
        for x in range(w):
            for c in range(ch):
                out[y, x, c] = lut[img[y, x, c]]


@numba.njit(cache=True, nogil=True)
def grayscale(out: Any, img: Any) -> None:
    """PIL's ``convert("L")`` of each RGB pixel, on all three channels (torchvision's ``Grayscale(3)``)."""
    h, w, _ = img.shape
    for y in range(h):
        for x in range(w):
            v = np.uint8(luma(int(img[y, x, 0]), int(img[y, x, 1]), int(img[y, x, 2])))
            out[y, x, 0] = v
            out[y, x, 1] = v
            out[y, x, 2] = v
