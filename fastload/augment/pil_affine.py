"""PIL's bilinear and bicubic affine filters, compiled, as a DALI operator on DALI's CPU threads.

DALI's CPU ``warp_affine`` has no bicubic, rounds where PIL truncates and blends its fill into the edge,
so carrying PIL's semantics with it takes five operators (a float warp, a floor, a cast, a warped mask
and a merge: about 2.3 ms of CPU per 224x224 image). This module is PIL's own arithmetic
(``Geometry.c``'s ``bilinear_filter32RGB`` and ``bicubic_filter32RGB``: the taps clamped to the image, the
cubic with ``a = -1`` evaluated in doubles in PIL's order, truncation to uint8) compiled by numba and run
per sample by DALI's ``numba_function`` in its thread pool, without the GIL: equal to PIL to the level,
at PIL's own cost (0.6-0.7 ms bilinear, 1.7-2 ms bicubic per 224x224 image here).

The operator reads the image (uint8 HWC, any channel count), the output-to-input matrix ``(a, b, c, d,
e, f)`` in float64 (PIL's convention: output pixel ``(x, y)`` samples the input at ``(a (x + .5) + b (y
+ .5) + c, d (x + .5) + e (y + .5) + f)``) and the step's float32 parameters, whose entries
``[FILL_AT, FILL_AT + channels)`` are the fill levels laid where the sample point falls outside the image.
CPU only: a GPU graph keeps DALI's ``warp_affine`` (:mod:`fastload.augment.ops_geometry`).
"""

from __future__ import annotations

from typing import Any

from .compiled import apply, image_op
from .kernels.layout import FILL_AT

__all__ = ["FILL_AT", "FILTERS", "warp"]

FILTERS = ("bilinear", "bicubic")


def warp(img: Any, m64: Any, p: Any, interpolation: str) -> Any:
    """``img`` (a uint8 HWC CPU DataNode) warped as PIL's ``Image.transform(..., AFFINE, m64, resample)`` with the
    fill in ``p[FILL_AT:]``: ``m64`` a float64 ``[6]`` DataNode, ``p`` the step's float32 parameters."""
    if interpolation not in FILTERS:
        raise ValueError(f"interpolation {interpolation!r} is not one of {FILTERS}")
    return apply(image_op(interpolation), img, m64, p)
