"""PIL's ``GaussianBlur(radius)`` (``BoxBlur.c``: three passes of an extended box along the rows, then three down the
columns, each in 8.24 fixed point and rounded), per sample: what timm's ``gaussian_blur`` and the self-supervised
recipes' blurs (MoCo's, DINO's) call."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _rows(dst: Any, src: Any, r: int, ww: int, fw: int) -> None:
    """One box pass along each row: ``ww`` times the ``2 r + 1`` nearest levels plus ``fw`` times the next one on each
    side, the image's edge repeated, over ``2**24``, rounded (a running sum per channel). RGB."""
    h, w, _ = src.shape
    last = w - 1
    for y in range(h):
        row, out = src[y], dst[y]
        a0 = a1 = a2 = 0
        for j in range(-r, r + 1):
            k = min(max(j, 0), last)
            a0 += np.int64(row[k, 0])
            a1 += np.int64(row[k, 1])
            a2 += np.int64(row[k, 2])
        for x in range(w):
            lo, hi, gone = max(x - r - 1, 0), min(x + r + 1, last), max(x - r, 0)
            out[x, 0] = np.uint8((a0 * ww + (np.int64(row[lo, 0]) + np.int64(row[hi, 0])) * fw + (1 << 23)) >> 24)
            out[x, 1] = np.uint8((a1 * ww + (np.int64(row[lo, 1]) + np.int64(row[hi, 1])) * fw + (1 << 23)) >> 24)
            out[x, 2] = np.uint8((a2 * ww + (np.int64(row[lo, 2]) + np.int64(row[hi, 2])) * fw + (1 << 23)) >> 24)
            a0 += np.int64(row[hi, 0]) - np.int64(row[gone, 0])
            a1 += np.int64(row[hi, 1]) - np.int64(row[gone, 1])
            a2 += np.int64(row[hi, 2]) - np.int64(row[gone, 2])


@numba.njit(cache=True, nogil=True)
def _columns(dst: Any, src: Any, r: int, ww: int, fw: int) -> None:
    """:func:`_rows` down each column (a running sum per column and channel, a row at a time)."""
    h, w, ch = src.shape
    n = w * ch
    flat_src = src.reshape(h, n)
    flat_dst = dst.reshape(h, n)
    last = h - 1
    acc = np.zeros(n, dtype=np.int64)
    for j in range(-r, r + 1):
        row = flat_src[min(max(j, 0), last)]
        for i in range(n):
            acc[i] += np.int64(row[i])
    for y in range(h):
        above, below, gone, out = flat_src[max(y - r - 1, 0)], flat_src[min(y + r + 1, last)], flat_src[max(y - r, 0)], flat_dst[y]
        for i in range(n):
            out[i] = np.uint8((acc[i] * ww + (np.int64(above[i]) + np.int64(below[i])) * fw + (1 << 23)) >> 24)
            acc[i] += np.int64(below[i]) - np.int64(gone[i])


@numba.njit(cache=True, nogil=True)
def gaussian_blur(out: Any, img: Any, r: int, ww: int, fw: int) -> None:
    """``img.filter(ImageFilter.GaussianBlur(radius))`` into ``out``, the box's integer radius ``r`` and weights ``ww``,
    ``fw`` (over ``2**24``) computed from the radius on the host as Pillow computes them."""
    a = np.empty_like(img)
    _rows(out, img, r, ww, fw)
    _rows(a, out, r, ww, fw)
    _rows(out, a, r, ww, fw)
    _columns(a, out, r, ww, fw)
    _columns(out, a, r, ww, fw)
    _columns(a, out, r, ww, fw)
    out[:] = a
