"""``ImageEnhance.Sharpness``: PIL's ``SMOOTH`` filter (Pillow-SIMD's integer 3x3 path, ``ImagingFilter3x3i_4u8``) and
the float32 blend of the image with it, per sample."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .pixel import blend

f32 = np.float32

#: ``ImagingFilter``'s fixed point: each float32 weight times ``2**13``, rounded half away from zero, to int16.
PRECISION_BITS = 13


@numba.njit(cache=True, nogil=True, inline="always")
def _fixed(weight: float) -> int:
    t = f32(f32(weight) * f32(1 << PRECISION_BITS))
    return int(t + f32(0.5)) if t >= 0 else int(t - f32(0.5))


@numba.njit(cache=True, nogil=True)
def sharpness(out: Any, img: Any, alpha: Any) -> None:
    """``ImageEnhance.Sharpness(img).enhance(alpha)``: ``SMOOTH`` (``(1 1 1; 1 5 1; 1 1 1) / 13``) in fixed point
    inside a 1-pixel border it leaves as it is, then blended with ``img`` at float32 ``alpha``."""
    h, w, ch = img.shape
    edge = _fixed(f32(1.0) / f32(13.0))
    centre = _fixed(f32(5.0) / f32(13.0))
    half = 1 << (PRECISION_BITS - 1)
    for y in range(h):
        for x in range(w):
            for c in range(ch):
                v = int(img[y, x, c])
                s = v
                if 0 < y < h - 1 and 0 < x < w - 1 and h >= 3 and w >= 3:
                    ring = (int(img[y - 1, x - 1, c]) + int(img[y - 1, x, c]) + int(img[y - 1, x + 1, c])
                            + int(img[y, x - 1, c]) + int(img[y, x + 1, c])
                            + int(img[y + 1, x - 1, c]) + int(img[y + 1, x, c]) + int(img[y + 1, x + 1, c]))
                    s = (half + edge * ring + centre * v) >> PRECISION_BITS
                    s = 0 if s < 0 else (255 if s > 255 else s)
                out[y, x, c] = blend(s, v, alpha)
