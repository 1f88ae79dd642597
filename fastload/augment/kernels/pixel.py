"""Scalar helpers the colour kernels share: C's rounding and clipping, PIL's ``L`` and its blend of two values."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

f32 = np.float32


@numba.njit(cache=True, nogil=True, inline="always")
def round_half_away(v: float) -> int:  # C's round() of a non-negative double
    r = math.floor(v)
    return int(r + 1.0) if v - r >= 0.5 else int(r)


@numba.njit(cache=True, nogil=True, inline="always")
def clip8(v: int) -> np.uint8:
    return np.uint8(0 if v < 0 else (255 if v > 255 else v))


@numba.njit(cache=True, nogil=True, inline="always")
def luma(r: int, g: int, b: int) -> int:  # convert("L"), Pillow(-SIMD)'s weights
    return (r * 9798 + g * 19235 + b * 3735 + 16384) >> 15


@numba.njit(cache=True, nogil=True, inline="always")
def blend(a: int, b: int, alpha: Any) -> np.uint8:  # ImagingBlend(a's image, b's, alpha) at one value
    if alpha == 0.0:
        return np.uint8(a)
    if alpha == 1.0:
        return np.uint8(b)
    t = f32(a) + alpha * f32(b - a)  # float32, as Blend.c computes it
    if 0.0 <= alpha <= 1.0:
        return np.uint8(int(t))
    return np.uint8(0) if t <= 0.0 else (np.uint8(255) if t >= 255.0 else np.uint8(int(t)))
