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
    inside a 1-pixel border it leaves as it is, then blended with ``img`` at float32 ``alpha`` (where the smoothed
    image is the image, the border and any image under 3 pixels a side, the blend gives the image)."""
    h, w, ch = img.shape
    out[:] = img
    if h < 3 or w < 3:
        return
    edge = _fixed(f32(1.0) / f32(13.0))
    centre = _fixed(f32(5.0) / f32(13.0))
    half = 1 << (PRECISION_BITS - 1)
    for y in range(1, h - 1):
        above, row, below, dst = img[y - 1], img[y], img[y + 1], out[y]
        for x in range(1, w - 1):
            for c in range(ch):
                v = int(row[x, c])
                ring = (int(above[x - 1, c]) + int(above[x, c]) + int(above[x + 1, c]) + int(row[x - 1, c])
                        + int(row[x + 1, c]) + int(below[x - 1, c]) + int(below[x, c]) + int(below[x + 1, c]))
                s = (half + edge * ring + centre * v) >> PRECISION_BITS
                dst[x, c] = blend(0 if s < 0 else (255 if s > 255 else s), v, alpha)
