"""The geometric augmentation operations (shears, translations, rotations) of torchvision and timm as DALI graph operators.

Every operation here is one affine map in PIL's convention, the one both libraries end in
(``Image.transform(size, Image.AFFINE, (a, b, c, d, e, f))``): the output pixel ``(x, y)`` takes the
input at ``(a (x + .5) + b (y + .5) + c, d (x + .5) + e (y + .5) + f)``, pixel ``i`` covering
``[i, i + 1)``. DALI's ``warp_affine`` with ``inverse_map=True`` uses the same convention. For shears
and absolute translations the host sends the six entries; for rotations (cosine and sine) and relative
translations (the fraction) it sends each double as three float32 parts, and the graph builds the matrix from the
image's size in float64, as PIL does in doubles.

Three details make the result PIL's and not DALI's own:

* PIL fills exactly where the sampling point falls outside ``[0, W) x [0, H)`` and interpolates the
  rest from the edge-clamped image; DALI blends its fill value into a band along the edge and takes one
  fill value for all channels. So, unless the interpolation is nearest and the fill grey (one warp with
  ``fill_value``, exact), the image is warped with clamped borders and a one-channel zero image is
  warped at nearest with fill 1: that mask picks the fill, per channel.
* PIL's bilinear and bicubic truncate to uint8; DALI rounds. So interpolated warps come out as float32
  and are floored before the cast; the fill is then laid in uint8.
* PIL's nearest affine with a shear or rotation part steps in 16.16 fixed point: the matrix is rounded
  the same way, or source points on whole pixels (a rotation's centre column) land one pixel off.

DALI's ``warp_affine`` has nearest and linear only (``INTERP_CUBIC`` is refused on the CPU): on a GPU, bicubic
is carried out as bilinear. On the CPU every step runs PIL's own ``Geometry.c`` compiled (``kernels.affine`` in the
compiled step, :mod:`fastload.augment.compiled`; the matrix computed there as above, ``kernels.steps``): its
filters at bilinear and bicubic, its fixed-point and scaling paths at nearest; exact, and cheaper than the
operators above. The host sends every matrix as three float32 parts per entry
and the fill levels at ``kernels.layout.FILL_AT``, so both roads read the same parameters. ``benchmarks/results/graph-ops-geometry.md`` has what each costs, per operation.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import numpy as np

from .graphop import GraphOp
from .kernels.layout import FILL_AT, warp_code


#: The operations this module carries out, per library (timm's ``NAME_TO_OP`` keys, torchvision's ``_apply_op`` names).
GEOMETRY_NAMES: dict[str, tuple[str, ...]] = {
    "torchvision": ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate"),
    "timm": ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel"),
}

INTERPOLATIONS = ("nearest", "bilinear", "bicubic")

#: How a CPU graph warps: PIL's ``Geometry.c`` compiled (exact) or DALI's ``warp_affine`` (a GPU's road).
CPU_WARPS = ("pil", "dali")

#: PIL's nearest affine (any map with a shear or rotation part) steps in 16.16 fixed point.
_FIXED = 65536.0


def _fix(v: float) -> float:
    """``v`` rounded as PIL's ``FIX`` does (``floor(v * 65536 + 0.5)``), back in pixels."""
    return math.floor(v * _FIXED + 0.5) / _FIXED


def _split(v: float) -> tuple[float, float, float]:
    """``v`` as three float32 whose sum in float64, ``(hi + mid) + lo``, is ``v`` exactly (two parts keep 48 bits:
    a sample point that far off truncates to another level now and then)."""
    hi = float(np.float32(v))
    mid = float(np.float32(v - hi))
    return hi, mid, float(np.float32(v - hi - mid))


def _static(m: Sequence[float], nearest: bool) -> tuple[float, ...]:
    """PIL's matrix ``(a, b, c, d, e, f)`` of a map that does not depend on the image's size, as DALI reads it:
    at nearest with a shear part, the increments and the first pixel's centre rounded to 16.16 as PIL's
    ``affine_fixed`` rounds them (all exact in float32)."""
    a, b, c, d, e, f = (float(v) for v in m)
    if not nearest or (b == 0.0 and d == 0.0):  # PIL's scaling path and its filters work in doubles
        return (a, b, c, d, e, f)
    fa, fb, fd, fe = _fix(a), _fix(b), _fix(d), _fix(e)
    ox, oy = _fix(c + a * 0.5 + b * 0.5), _fix(f + d * 0.5 + e * 0.5)
    return (fa, fb, ox - (fa + fb) * 0.5, fd, fe, oy - (fd + fe) * 0.5)


def _tv_shear(shear_x_deg: float, shear_y_deg: float) -> tuple[float, ...]:
    """torchvision's inverse affine matrix for a shear at zero angle about ``center=[0, 0]`` (``_apply_op``'s)."""
    sx, sy = math.radians(shear_x_deg), math.radians(shear_y_deg)
    a = math.cos(-sy) / math.cos(sy)
    b = -math.cos(-sy) * math.tan(sx) / math.cos(sy)
    c = math.sin(-sy) / math.cos(sy)
    d = -math.sin(-sy) * math.tan(sx) / math.cos(sy) + 1.0
    return (d, -b, 0.0, -c, a, 0.0)


def _rotation(args: tuple) -> tuple[float, ...]:
    """``PIL.Image.rotate(degrees)``'s cosine and sine (rounded to 15 places as PIL rounds them), split in two
    float32 each; the graph adds the centre. PIL's copies and transposes at multiples of 90 degrees sample the
    same pixel centres."""
    angle = -math.radians(float(args[0]) % 360.0)
    return _split(round(math.cos(angle), 15)) + _split(round(math.sin(angle), 15))


def _laid_out(values: tuple[float, ...], sized: bool, fill: Sequence[int]) -> tuple[float, ...]:
    """A step's floats as the graph reads them: a matrix as its six entries' first float32 parts, then their second,
    then their third (:func:`_split`; a rotation's and a relative translation's own parts as they are), then the
    fill levels at :data:`FILL_AT`."""
    if not sized:
        parts = [_split(v) for v in values]
        values = tuple(part[k] for k in range(3) for part in parts)
    return tuple(values) + (0.0,) * (FILL_AT - len(values)) + tuple(float(v) for v in fill)


def _host(library: str, name: str, nearest: bool) -> Callable[[tuple], tuple[float, ...]]:
    """A step's ``args`` -> the floats its graph reads: torchvision's as ``_apply_op`` calls ``F.affine``/``F.rotate``
    on a PIL image, timm's as its PIL functions call ``Image.transform``/``Image.rotate``."""
    if name == "Rotate":  # F.rotate on a PIL image is Image.rotate, as timm's rotate is
        return _rotation
    if name.endswith("Rel"):  # timm: pixels = pct * side
        return lambda args: _split(float(args[0]))
    if library == "torchvision":
        tv: dict[str, Callable[[float], tuple[float, ...]]] = {
            "ShearX": lambda m: _tv_shear(math.degrees(math.atan(m)), 0.0),
            "ShearY": lambda m: _tv_shear(0.0, math.degrees(math.atan(m))),
            "TranslateX": lambda m: (1.0, 0.0, -float(int(m)), 0.0, 1.0, 0.0),  # F.affine(translate=[int(m), 0])
            "TranslateY": lambda m: (1.0, 0.0, 0.0, 0.0, 1.0, -float(int(m))),
        }
        return lambda args: _static(tv[name](float(args[0])), nearest)
    timm: dict[str, Callable[[float], tuple[float, ...]]] = {
        "ShearX": lambda v: (1.0, v, 0.0, 0.0, 1.0, 0.0),
        "ShearY": lambda v: (1.0, 0.0, 0.0, v, 1.0, 0.0),
        "TranslateX": lambda v: (1.0, 0.0, v, 0.0, 1.0, 0.0),
        "TranslateY": lambda v: (1.0, 0.0, 0.0, 0.0, 1.0, v),
    }
    return lambda args: _static(timm[name](float(args[0])), nearest)


def _sized_matrix(img: Any, p: Any, name: str, nearest: bool) -> Any:
    """The float64 ``[6]`` matrix of a rotation or a relative translation, computed from the image's size as PIL
    computes it (16.16 fixed point at nearest, for a rotation)."""
    from ..pipeline import import_dali

    dali, fn, types = import_dali()
    q = fn.cast(p, dtype=types.FLOAT64)
    shape = img.shape(dtype=types.FLOAT64)
    h, w = shape[0], shape[1]
    one, zero = q[0] * 0.0 + 1.0, q[0] * 0.0

    def joined(k: int) -> Any:  # the double the host split at q[k:k + 3]
        return (q[k] + q[k + 1]) + q[k + 2]

    if name.endswith("Rel"):
        shift = joined(0) * (w if name == "TranslateXRel" else h)
        row = (one, zero, shift, zero, one, zero) if name == "TranslateXRel" else (one, zero, zero, zero, one, shift)
        return fn.stack(*row)
    cos, sin = joined(0), joined(3)
    cx, cy = w * 0.5, h * 0.5
    a, b, d, e = cos, sin, zero - sin, cos
    c = (a * (zero - cx) + b * (zero - cy)) + cx
    f = (d * (zero - cx) + e * (zero - cy)) + cy
    if nearest:
        def fix(v: Any) -> Any:
            return dali.math.floor(v * _FIXED + 0.5) * (1.0 / _FIXED)

        fa, fb, fd, fe = fix(a), fix(b), fix(d), fix(e)
        c = fix(c + a * 0.5 + b * 0.5) - (fa + fb) * 0.5
        f = fix(f + d * 0.5 + e * 0.5) - (fd + fe) * 0.5
        a, b, d, e = fa, fb, fd, fe
    return fn.stack(a, b, c, d, e, f)


def warp_like_pil(img: Any, mt: Any, interpolation: str, fill: Sequence[int]) -> Any:
    """``img`` (uint8 HWC, cpu or gpu) warped by the float32 ``[2, 3]`` output-to-input matrix ``mt`` (a CPU
    DataNode, PIL's convention) as PIL's ``Image.transform`` does at ``interpolation``, filling with ``fill``."""
    from ..pipeline import import_dali

    dali, fn, types = import_dali()
    fill = tuple(int(v) for v in fill)
    if interpolation == "nearest" and len(set(fill)) == 1:
        return fn.warp_affine(img, matrix=mt, fill_value=float(fill[0]), interp_type=types.INTERP_NN, inverse_map=True)
    if interpolation == "nearest":
        warped = fn.warp_affine(img, matrix=mt, interp_type=types.INTERP_NN, inverse_map=True)  # borders clamped
    else:  # PIL truncates the interpolated value: float out, floored (the edge clamp keeps it in [0, 255])
        warped = fn.warp_affine(img, matrix=mt, interp_type=types.INTERP_LINEAR, inverse_map=True, dtype=types.FLOAT)
        warped = fn.cast(dali.math.floor(warped), dtype=types.UINT8)
    blank = img[:, :, 0:1] * types.Constant(0, dtype=types.UINT8)  # (zeros_like has no GPU backend)
    outside = fn.warp_affine(blank, matrix=mt, fill_value=1.0, interp_type=types.INTERP_NN, inverse_map=True)
    colour = types.Constant(np.array(fill, dtype=np.uint8))
    return warped * (types.Constant(1, dtype=types.UINT8) - outside) + colour * outside


def geometry_op(library: str, name: str, interpolation: str, fill: tuple[int, int, int], *, cpu_warp: str = "pil") -> GraphOp | None:
    """The GraphOp of ``library``'s geometric operation ``name`` at ``interpolation``, filling with ``fill``;
    None for a name this module does not do.

    ``fill`` is what the library is given (timm's ``fillcolor``; torchvision's ``fill``, ``None`` being
    ``(0, 0, 0)``), one uint8 level per channel. ``cpu_warp``: how a CPU graph warps, ``"pil"`` (PIL's
    ``Geometry.c`` compiled: exact) or ``"dali"`` (DALI's ``warp_affine``, as a GPU graph does).
    """
    if name not in GEOMETRY_NAMES.get(library, ()):
        return None
    if interpolation not in INTERPOLATIONS:
        raise ValueError(f"interpolation {interpolation!r} is not one of {INTERPOLATIONS}")
    if len(fill) != 3:
        raise ValueError(f"fill needs three levels (R, G, B), got {fill!r}")
    if cpu_warp not in CPU_WARPS:
        raise ValueError(f"cpu_warp {cpu_warp!r} is not one of {CPU_WARPS}")
    nearest = interpolation == "nearest"
    levels = tuple(int(v) for v in fill)
    sized = name == "Rotate" or name.endswith("Rel")
    matrix = "rotation" if name == "Rotate" else {"TranslateXRel": "x_rel", "TranslateYRel": "y_rel"}.get(name, "fed")
    number = warp_code(matrix, interpolation) if cpu_warp == "pil" else None

    def code(img: Any) -> int | None:
        return number if getattr(img, "device", "cpu") == "cpu" else None

    def graph(img: Any, p: Any) -> Any:
        from ..pipeline import import_dali

        fn, types = import_dali()[1:]
        if code(img) is not None:
            from .compiled import step

            return step(img, [number], p)
        if sized:
            m64 = _sized_matrix(img, p, name, nearest)
        else:  # the three parts joined: the double the host computed
            m64 = (fn.cast(p[0:6], dtype=types.FLOAT64) + fn.cast(p[6:12], dtype=types.FLOAT64)) + fn.cast(p[12:18], dtype=types.FLOAT64)
        return warp_like_pil(img, fn.cast(fn.reshape(m64, shape=[2, 3]), dtype=types.FLOAT), interpolation, levels)

    host = _host(library, name, nearest)

    return GraphOp(library, name, interpolation, host=lambda args: _laid_out(tuple(host(args)), sized, levels), graph=graph,
                   code=code)  # fmt: skip
