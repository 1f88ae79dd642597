"""PIL's ``Geometry.c`` affine transform, per sample: at bilinear and bicubic ``ImagingGenericTransform`` with
``bilinear_filter32RGB`` / ``bicubic_filter32RGB`` (doubles in PIL's order, taps clamped, truncation); at nearest
``ImagingScaleAffine`` for a map without shear or rotation (positions in doubles, accumulated) and ``affine_fixed``
for any other (16.16 fixed point, accumulated)."""

from __future__ import annotations

from typing import Any

import math

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


@numba.njit(cache=True, nogil=True, inline="always")
def _coord(v: float) -> int:  # PIL's COORD: -1 left of the image, else truncated
    return -1 if v < 0.0 else int(v)


@numba.njit(cache=True, nogil=True, inline="always")
def _fix(v: float) -> int:  # PIL's FIX: 16.16 fixed point
    return int(math.floor(v * 65536.0 + 0.5))


@numba.njit(cache=True, nogil=True)
def nearest(out: Any, img: Any, m: Any, p: Any) -> None:  # PIL's ImagingTransformAffine at NEAREST
    h, w, ch = img.shape
    oh, ow = out.shape[0], out.shape[1]
    for y in range(oh):  # Image.transform's new image of the fill colour; pixels mapped outside keep it
        for x in range(ow):
            for c in range(ch):
                out[y, x, c] = np.uint8(p[FILL_AT + c])
    if m[1] == 0.0 and m[3] == 0.0:  # ImagingScaleAffine: the columns pretabulated, positions accumulated in doubles
        cols = np.empty(ow, dtype=np.int64)
        xo = m[2] + m[0] * 0.5
        for x in range(ow):
            cols[x] = _coord(xo)
            xo += m[0]
        yo = m[5] + m[4] * 0.5
        for y in range(oh):
            yi = _coord(yo)
            if 0 <= yi < h:
                for x in range(ow):
                    xi = cols[x]
                    if 0 <= xi < w:
                        for c in range(ch):
                            out[y, x, c] = img[yi, xi, c]
            yo += m[4]
        return
    a0, a1, a3, a4 = _fix(m[0]), _fix(m[1]), _fix(m[3]), _fix(m[4])  # affine_fixed
    a2 = _fix(m[2] + m[0] * 0.5 + m[1] * 0.5)
    a5 = _fix(m[5] + m[3] * 0.5 + m[4] * 0.5)
    for y in range(oh):
        xx, yy = a2, a5
        for x in range(ow):
            xi = xx >> 16
            if 0 <= xi < w:
                yi = yy >> 16
                if 0 <= yi < h:
                    for c in range(ch):
                        out[y, x, c] = img[yi, xi, c]
            xx += a0
            yy += a3
        a2 += a1
        a5 += a4
