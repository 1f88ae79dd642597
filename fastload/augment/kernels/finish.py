"""The end of a CPU graph's stage, per sample: the uint8 HWC image normalised as DALI's ``crop_mirror_normalize``
computes it (float32 ``(x - mean) * (1 / std)``, CHW or HWC), then its erasing rectangles laid (a value per channel,
or the noise drawn for them), in one pass where DALI's operators take four buffers."""

from __future__ import annotations

from typing import Any

import numba
import numpy as np

from .layout import INV, MEAN, NOISE, VALUE

f32 = np.float32


@numba.njit(cache=True, nogil=True)
def finish(out: Any, img: Any, spec: Any, rects: Any, noise: Any, chw: bool) -> None:
    """``out`` (float32 ``(3, H, W)`` when ``chw``, else ``(H, W, 3)``) from ``img``; ``rects`` ``[top, left, height,
    width]`` per slot (height 0: none), ``noise`` each slot's patch end to end (in ``out``'s layout; three zeros for a
    slot without a rectangle)."""
    h, w, _ = img.shape
    for c in range(3):
        m, inv = f32(spec[MEAN + c]), f32(spec[INV + c])
        for y in range(h):
            for x in range(w):
                v = (f32(img[y, x, c]) - m) * inv
                if chw:
                    out[c, y, x] = v
                else:
                    out[y, x, c] = v
    at = 0
    for b in range(len(rects) // 4):
        top, left, eh, ew = int(rects[4 * b]), int(rects[4 * b + 1]), int(rects[4 * b + 2]), int(rects[4 * b + 3])
        if eh <= 0 or ew <= 0:
            at += 3
            continue
        for yy in range(eh):
            y = top + yy
            if y < 0 or y >= h:
                continue
            for xx in range(ew):
                x = left + xx
                if x < 0 or x >= w:
                    continue
                for c in range(3):
                    if spec[NOISE] == 0.0:
                        v = f32(spec[VALUE + c])
                    elif chw:
                        v = f32(noise[at + (c * eh + yy) * ew + xx])
                    else:
                        v = f32(noise[at + (yy * ew + xx) * 3 + c])
                    if chw:
                        out[c, y, x] = v
                    else:
                        out[y, x, c] = v
        at += 3 * eh * ew
