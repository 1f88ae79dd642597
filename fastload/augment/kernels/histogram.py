"""``ImageOps.equalize`` and ``ImageOps.autocontrast`` (no cutoff), per channel, per sample: a histogram, PIL's
lookup table, the table applied."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def _equalize_table(hist: Any, lut: Any) -> None:
    """``ImageOps.equalize``'s table of one channel's histogram."""
    total, last, used = 0, 0, 0
    for i in range(256):
        if hist[i]:
            total += hist[i]
            last = hist[i]
            used += 1
    step = (total - last) // 255 if used > 1 else 0
    n = step // 2
    for i in range(256):
        if step == 0:
            lut[i] = i
        else:
            lut[i] = min(n // step, 255)  # (Image.point clips the table to a level)
            n += hist[i]


@numba.njit(cache=True, nogil=True)
def _autocontrast_table(hist: Any, lut: Any) -> None:
    """``ImageOps.autocontrast``'s table (no cutoff) of one channel's histogram."""
    lo, hi = 0, 255
    while lo < 255 and hist[lo] == 0:
        lo += 1
    while hi > 0 and hist[hi] == 0:
        hi -= 1
    scale = 255.0 / (hi - lo) if hi > lo else 1.0
    offset = -lo * scale
    for i in range(256):
        if hi <= lo:
            lut[i] = i
        else:
            v = int(i * scale + offset)  # Python's int(): toward zero
            lut[i] = 0 if v < 0 else (255 if v > 255 else v)


@numba.njit(cache=True, nogil=True)
def _per_channel(out: Any, img: Any, autocontrast: bool) -> None:
    """Each channel's histogram, its table (equalize's or autocontrast's), the table applied."""
    h, w, ch = img.shape
    hist = np.zeros(256, np.int64)
    lut = np.empty(256, np.uint8)
    for c in range(ch):
        hist[:] = 0
        for y in range(h):
            for x in range(w):
                hist[img[y, x, c]] += 1
        if autocontrast:
            _autocontrast_table(hist, lut)
        else:
            _equalize_table(hist, lut)
        for y in range(h):
            for x in range(w):
                out[y, x, c] = lut[img[y, x, c]]


@numba.njit(cache=True, nogil=True)
def equalize(out: Any, img: Any) -> None:
    _per_channel(out, img, False)


@numba.njit(cache=True, nogil=True)
def autocontrast(out: Any, img: Any) -> None:
    _per_channel(out, img, True)
