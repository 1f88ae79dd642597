"""``ImageEnhance``'s Brightness, Contrast and Color (PIL's float32 blend with the degenerate image) and
torchvision's ``ColorJitter`` (its four parts in the drawn order, the hue's HSV shift among them), per sample."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .hsv import hue_pixel
from .layout import SLOT
from .pixel import blend, luma

f32 = np.float32


@numba.njit(cache=True, nogil=True)
def blended(out: Any, img: Any, alpha: Any, kind: int) -> None:
    """ImageEnhance part ``kind`` (1 Brightness, 2 Contrast, 3 Color) of ``img`` at float32 ``alpha`` into ``out``
    (which may be ``img``: each pixel is read before it is written)."""
    h, w, _ = img.shape
    centre = 0
    if kind == 2:  # ImageEnhance.Contrast: the rounded mean of convert("L")
        total = 0
        for y in range(h):
            for x in range(w):
                total += luma(int(img[y, x, 0]), int(img[y, x, 1]), int(img[y, x, 2]))
        centre = int(float(total) / float(h * w) + 0.5)
    for y in range(h):
        for x in range(w):
            r, g, b = int(img[y, x, 0]), int(img[y, x, 1]), int(img[y, x, 2])
            if kind == 3:  # ImageEnhance.Color: blended with the pixel's own L
                centre = luma(r, g, b)
            out[y, x, 0] = blend(centre, r, alpha)  # (Brightness blends with black: centre 0)
            out[y, x, 1] = blend(centre, g, alpha)
            out[y, x, 2] = blend(centre, b, alpha)


@numba.njit(cache=True, nogil=True)
def jitter(out: Any, img: Any, p: Any) -> None:
    """ColorJitter's four slots of ``p`` (``ops_color.jitter_slots``) in order."""
    h, w, _ = img.shape
    out[:] = img
    for j in range(4):
        at = SLOT * j
        kind = int(p[at])
        if kind == 4:
            shift = int(p[at + 10])
            for y in range(h):
                for x in range(w):
                    out[y, x, 0], out[y, x, 1], out[y, x, 2] = hue_pixel(int(out[y, x, 0]), int(out[y, x, 1]), int(out[y, x, 2]), shift)
        elif kind > 0:
            blended(out, out, f32(p[at + 1] if kind < 3 else p[at + 10]), kind)
