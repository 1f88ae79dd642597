"""torchvision's ``adjust_hue`` on a PIL image: ``Convert.c``'s ``rgb2hsv_row`` (float32 inside, the hue's wrap
in double), the uint8 hue plus a shift with wrap-around, ``hsv2rgb`` (round half away from zero)."""

from __future__ import annotations

import math
from typing import Any

import numba
import numpy as np

from .pixel import clip8, round_half_away

f32 = np.float32


@numba.njit(cache=True, nogil=True)
def hue_pixel(r: int, g: int, b: int, shift: int) -> tuple:  # RGB -> HSV, hue + shift (mod 256), HSV -> RGB
    maxc, minc = max(r, max(g, b)), min(r, min(g, b))
    if minc == maxc:  # grey: PIL gives hue and saturation 0, and the way back gives the grey
        return np.uint8(maxc), np.uint8(maxc), np.uint8(maxc)
    cr = f32(maxc - minc)
    s = cr / f32(maxc)
    rc = f32(maxc - r) / cr
    gc = f32(maxc - g) / cr
    bc = f32(maxc - b) / cr
    if r == maxc:
        hh = bc - gc
    elif g == maxc:
        hh = f32((2.0 + float(rc)) - float(bc))
    else:
        hh = f32((4.0 + float(gc)) - float(rc))
    turn = float(hh) / 6.0 + 1.0  # in [5/6, 2): C's fmod(turn, 1.0), exactly
    hh = f32(turn - 1.0 if turn >= 1.0 else turn)
    uh = (int(clip8(int(float(hh) * 255.0))) + shift) & 0xFF
    us = int(clip8(int(float(s) * 255.0)))
    vv = np.uint8(maxc)
    if us == 0:
        return vv, vv, vv
    hf = float(f32(uh)) * 6.0 / 255.0
    i = int(math.floor(hf))
    f = f32(hf - float(f32(i)))
    fs = f32(float(f32(us)) / 255.0)
    fv = float(f32(maxc))
    up = clip8(round_half_away(fv * (1.0 - float(fs))))
    uq = clip8(round_half_away(fv * (1.0 - float(fs * f))))
    ut = clip8(round_half_away(fv * (1.0 - float(fs) * (1.0 - float(f)))))
    k = i % 6
    if k == 0:
        return vv, ut, up
    if k == 1:
        return uq, vv, up
    if k == 2:
        return up, vv, ut
    if k == 3:
        return up, uq, vv
    if k == 4:
        return ut, up, vv
    return vv, up, uq
