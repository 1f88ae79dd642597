"""PIL's bilinear and bicubic affine filters, compiled, as a DALI operator on DALI's CPU threads.

DALI's CPU ``warp_affine`` has no bicubic, rounds where PIL truncates and blends its fill into the edge,
so carrying PIL's semantics with it takes five operators (a float warp, a floor, a cast, a warped mask
and a merge: about 2.3 ms of CPU per 224x224 image). This module is PIL's own arithmetic
(``Geometry.c``'s ``bilinear_filter32RGB`` and ``bicubic_filter32RGB``: the taps clamped to the image, the
cubic with ``a = -1`` evaluated in doubles in PIL's order, truncation to uint8) compiled by numba and run
per sample by DALI's ``numba_function`` in its thread pool, without the GIL: equal to PIL to the level,
at PIL's own cost (0.8 ms bilinear, 2 ms bicubic per 224x224 image here).

The operator reads the image (uint8 HWC, any channel count), the output-to-input matrix ``(a, b, c, d,
e, f)`` in float64 (PIL's convention: output pixel ``(x, y)`` samples the input at ``(a (x + .5) + b (y
+ .5) + c, d (x + .5) + e (y + .5) + f)``) and the step's float32 parameters, whose entries
``[FILL_AT, FILL_AT + channels)`` are the fill levels laid where the sample point falls outside the image.
CPU only: a GPU graph keeps DALI's ``warp_affine`` (:mod:`fastload.augment.ops_geometry`).
"""

from __future__ import annotations

import functools
import logging
from typing import Any

log = logging.getLogger(__name__)

#: Where the fill levels start in a geometric step's parameters (after a matrix's six entries in three float32 parts).
FILL_AT = 18

FILTERS = ("bilinear", "bicubic")


@functools.lru_cache(maxsize=None)
def _kernel() -> Any:
    """The compiled per-sample kernel (numba imported and the kernel compiled on first use, cached on disk)."""
    import numba
    import numpy as np

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
                    v1 = cubic(float(img[r0, x0, c]), float(img[r0, x1, c]), float(img[r0, x2, c]), float(img[r0, x3, c]), dx)
                    v2 = cubic(float(img[r1, x0, c]), float(img[r1, x1, c]), float(img[r1, x2, c]), float(img[r1, x3, c]), dx)
                    v3 = cubic(float(img[r2, x0, c]), float(img[r2, x1, c]), float(img[r2, x2, c]), float(img[r2, x3, c]), dx)
                    v4 = cubic(float(img[r3, x0, c]), float(img[r3, x1, c]), float(img[r3, x2, c]), float(img[r3, x3, c]), dx)
                    v = cubic(v1, v2, v3, v4, dy)
                    out[y, x, c] = np.uint8(0) if v <= 0.0 else (np.uint8(255) if v >= 255.0 else np.uint8(int(v)))

    return warp


def _same_shape(outs: Any, ins: Any) -> None:
    """numba_function's setup: each output sample has its image's shape."""
    out0 = outs[0]
    in0 = ins[0]
    for i in range(len(out0)):
        for d in range(3):
            out0[i][d] = in0[i][d]


@functools.lru_cache(maxsize=None)
def operator(interpolation: str) -> Any:
    """The DALI operator (``numba_function``, CPU) of ``interpolation``'s filter: built once per process and called
    for every geometric step of every graph (building one compiles its entry points: about a second)."""
    if interpolation not in FILTERS:
        raise ValueError(f"interpolation {interpolation!r} is not one of {FILTERS}")
    from nvidia.dali.plugin.numba import NumbaFunction

    from ..pipeline import import_dali

    types = import_dali()[2]
    kernel, bicubic = _kernel(), interpolation == "bicubic"

    def run(out: Any, img: Any, m: Any, p: Any) -> None:
        kernel(out, img, m, p, bicubic)

    log.debug("compiling PIL's %s affine filter for DALI's CPU threads", interpolation)
    return NumbaFunction(
        run_fn=run, setup_fn=_same_shape, device="cpu", batch_processing=False,
        in_types=[types.UINT8, types.FLOAT64, types.FLOAT], ins_ndim=[3, 1, 1], out_types=[types.UINT8], outs_ndim=[3],
    )  # fmt: skip


def warp(img: Any, m64: Any, p: Any, interpolation: str) -> Any:
    """``img`` (a uint8 HWC CPU DataNode) warped as PIL's ``Image.transform(..., AFFINE, m64, resample)`` with the
    fill in ``p[FILL_AT:]``: ``m64`` a float64 ``[6]`` DataNode, ``p`` the step's float32 parameters."""
    from ..pipeline import import_dali

    fn = import_dali()[1]
    return fn.reshape(operator(interpolation)(img, m64, p), layout="HWC")  # (numba_function's output has no layout)
