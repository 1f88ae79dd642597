"""The compiled step: each sample's operation chosen by its code (``layout.CODES``, ``layout.warp_code``) and run on
it, so that a CPU graph's round of a policy is one operator however many operations its table holds."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .affine import nearest, warp
from .blur import gaussian_blur
from .enhance import blended, jitter
from .histogram import autocontrast, equalize
from .layout import BLUR_AT, FACTOR_AT, WARP, code
from .pointwise import grayscale, levels
from .smooth import sharpness

f32 = np.float32
f64 = np.float64

INVERT, SOLARIZE_ADD, GRAYSCALE = code("Invert"), code("SolarizeAdd"), code("Grayscale")
EQUALIZE, AUTOCONTRAST, BRIGHTNESS, CONTRAST = code("Equalize"), code("AutoContrast"), code("Brightness"), code("Contrast")
COLOR, SHARPNESS, JITTER, BOX_BLUR = code("Color"), code("Sharpness"), code("ColorJitter"), code("BoxBlur")


@numba.njit(cache=True, nogil=True, inline="always")
def _joined(p: Any, k: int) -> float:
    """The double the host split into three float32 at ``p[k:k + 3]``."""
    return (f64(p[k]) + f64(p[k + 1])) + f64(p[k + 2])


@numba.njit(cache=True, nogil=True)
def matrix(m: Any, h: int, w: int, kind: int, p: Any) -> None:
    """The output-to-input matrix ``m`` (float64 ``[6]``) of warp ``kind`` on an ``h`` x ``w`` image, as PIL computes it:
    the fed entries; ``Image.rotate``'s about the centre; a translation by the fed fraction of the width or height."""
    if kind == 0:
        for k in range(6):
            m[k] = (f64(p[k]) + f64(p[6 + k])) + f64(p[12 + k])
        return
    m[0], m[1], m[2], m[3], m[4], m[5] = 1.0, 0.0, 0.0, 0.0, 1.0, 0.0
    if kind == 2:
        m[2] = _joined(p, 0) * f64(w)
    elif kind == 3:
        m[5] = _joined(p, 0) * f64(h)
    else:
        cos, sin = _joined(p, 0), _joined(p, 3)
        cx, cy = f64(w) * 0.5, f64(h) * 0.5
        m[0], m[1], m[3], m[4] = cos, sin, 0.0 - sin, cos
        m[2] = (cos * (0.0 - cx) + sin * (0.0 - cy)) + cx
        m[5] = ((0.0 - sin) * (0.0 - cx) + cos * (0.0 - cy)) + cy


@numba.njit(cache=True, nogil=True)
def step(out: Any, img: Any, code: int, p: Any) -> None:
    """Operation ``code`` with the step's float32 parameters ``p`` on the uint8 HWC ``img``, into ``out``."""
    if code >= WARP:
        m = np.empty(6, dtype=np.float64)
        matrix(m, img.shape[0], img.shape[1], (code - WARP) // 3, p)
        kind = (code - WARP) % 3
        if kind == 0:
            nearest(out, img, m, p)
        else:
            warp(out, img, m, p, kind == 2)
    elif INVERT <= code <= SOLARIZE_ADD:  # Invert, Posterize, Solarize, SolarizeAdd: pointwise's kinds in that order
        levels(out, img, code - INVERT, int(p[0]))
    elif code == GRAYSCALE:
        grayscale(out, img)
    elif code == EQUALIZE:
        equalize(out, img)
    elif code == AUTOCONTRAST:
        autocontrast(out, img)
    elif code == BRIGHTNESS or code == CONTRAST:  # blended's kinds 1 and 2
        blended(out, img, f32(p[0]), 1 + code - BRIGHTNESS)
    elif code == COLOR:
        blended(out, img, f32(p[FACTOR_AT]), 3)
    elif code == SHARPNESS:
        sharpness(out, img, f32(p[FACTOR_AT]))
    elif code == JITTER:
        jitter(out, img, p)
    elif code == BOX_BLUR:
        gaussian_blur(out, img, int(p[BLUR_AT]), int(p[BLUR_AT + 1]), int(p[BLUR_AT + 2]))
    else:  # Identity
        out[:] = img


@numba.njit(cache=True, nogil=True)
def rounds(out: Any, img: Any, at: Any, codes: Any, p: Any) -> None:
    """Rounds of steps, one after the other, from ``img`` into ``out``: round ``r`` runs code
    ``codes[r * width + at[r]]`` (``codes`` the rounds' tables, ``width`` codes each) with the float32 parameters
    ``p[r * args : (r + 1) * args]`` (``p`` the rounds' parameters end to end). Identity rounds are skipped, and
    between the others the image goes through at most two scratch images."""
    n = len(at)
    width, args = len(codes) // n, len(p) // n
    last, count = -1, 0
    for r in range(n):
        if codes[r * width + at[r]] != 0:
            last, count = r, count + 1
    if count == 0:
        out[:] = img
        return
    first, second = out, out
    if count >= 2:
        first = np.empty_like(img)
    if count >= 3:
        second = np.empty_like(img)
    src, j = img, 0
    for r in range(n):
        c = codes[r * width + at[r]]
        if c == 0:
            continue
        dst = out if r == last else (first if j % 2 == 0 else second)
        step(dst, src, c, p[r * args : (r + 1) * args])
        src, j = dst, j + 1
