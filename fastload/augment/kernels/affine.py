"""PIL's ``Geometry.c`` affine transform at bilinear and bicubic (``ImagingGenericTransform`` with
``bilinear_filter32RGB`` / ``bicubic_filter32RGB``), per sample: doubles in PIL's order, taps clamped, truncation."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .layout import FILL_AT


@numba.njit(cache=True, nogil=True, inline="always")
def cubic(v1: float, v2: float, v3: float, v4: float, d: float) -> float:  # PIL's BICUBIC macro, same order
    p1 = v2
    p2 = -v1 + v3
    p3 = 2 * (v1 - v2) + v3 - v4
    p4 = -v1 + v2 - v3 + v4
    return p1 + d * (p2 + d * (p3 + d * p4))


@numba.njit(cache=True, nogil=True)
def warp(out: Any, img: Any, m: Any, p: Any, bicubic: bool) -> None:  # PIL's ImagingGenericTransform + filter
    h, w, ch = img.shape
    for y in range(out.shape[0]):
        yc = y + 0.5
        for x in range(out.shape[1]):
            xc = x + 0.5
            xin = m[0] * xc + m[1] * yc + m[2]
            yin = m[3] * xc + m[4] * yc + m[5]
            if xin < 0.0 or xin >= w or yin < 0.0 or yin >= h:
                for c in range(ch):
                    out[y, x, c] = np.uint8(p[FILL_AT + c])
                continue
            xin -= 0.5
            yin -= 0.5
            xi = int(np.floor(xin))
            yi = int(np.floor(yin))
            dx = xin - xi
            dy = yin - yi
            if not bicubic:  # two clamped taps a side, truncated
                x0, x1 = min(max(xi, 0), w - 1), min(max(xi + 1, 0), w - 1)
                r0, r1 = min(max(yi, 0), h - 1), min(max(yi + 1, 0), h - 1)
                for c in range(ch):
                    v = float(img[r0, x0, c])
                    v1 = v + (float(img[r0, x1, c]) - v) * dx
                    v = float(img[r1, x0, c])
                    v2 = v + (float(img[r1, x1, c]) - v) * dx
                    out[y, x, c] = np.uint8(int(v1 + (v2 - v1) * dy))
                continue
            x0, x1 = min(max(xi - 1, 0), w - 1), min(max(xi, 0), w - 1)  # four a side, clipped to [0, 255]
            x2, x3 = min(max(xi + 1, 0), w - 1), min(max(xi + 2, 0), w - 1)
            r0, r1 = min(max(yi - 1, 0), h - 1), min(max(yi, 0), h - 1)
            r2, r3 = min(max(yi + 1, 0), h - 1), min(max(yi + 2, 0), h - 1)
            for c in range(ch):
                # the cubic at d = 0 is its second value exactly (p1 + 0 * ...): a horizontal translation (dy = 0)
                # needs only the second row's pass, a vertical one (dx = 0) only the middle column's taps
                if dy == 0.0:
                    v = cubic(float(img[r1, x0, c]), float(img[r1, x1, c]), float(img[r1, x2, c]), float(img[r1, x3, c]), dx)
                elif dx == 0.0:
                    v = cubic(float(img[r0, x1, c]), float(img[r1, x1, c]), float(img[r2, x1, c]), float(img[r3, x1, c]), dy)
                else:
                    v1 = cubic(float(img[r0, x0, c]), float(img[r0, x1, c]), float(img[r0, x2, c]), float(img[r0, x3, c]), dx)
                    v2 = cubic(float(img[r1, x0, c]), float(img[r1, x1, c]), float(img[r1, x2, c]), float(img[r1, x3, c]), dx)
                    v3 = cubic(float(img[r2, x0, c]), float(img[r2, x1, c]), float(img[r2, x2, c]), float(img[r2, x3, c]), dx)
                    v4 = cubic(float(img[r3, x0, c]), float(img[r3, x1, c]), float(img[r3, x2, c]), float(img[r3, x3, c]), dx)
                    v = cubic(v1, v2, v3, v4, dy)
                out[y, x, c] = np.uint8(0) if v <= 0.0 else (np.uint8(255) if v >= 255.0 else np.uint8(int(v)))
