"""The colour and pixel augmentation operations (torchvision's and timm's) as DALI graph operators.

Each operation is a :class:`~fastload.augment.graphop.GraphOp` whose graph rebuilds the
library's PIL arithmetic from DALI operators that exist on both backends (arithmetic,
``reductions``, ``filter``, ``gaussian_blur``, ``equalize``), so it may run as a branch of a
DALI conditional on ``cpu`` or ``gpu`` images. What each reproduces, as Pillow(-SIMD) computes it:

* the ``ImageEnhance`` blends (Brightness, Color, Contrast, Sharpness): ``Image.blend``'s
  float32 ``d + f * (x - d)`` truncated and clipped; ``L`` is ``(9798 r + 19235 g + 3735 b +
  16384) >> 15``; Contrast's centre is the rounded mean of ``L``; Sharpness's degenerate is the
  3x3 SMOOTH filter rounded, the 1-pixel border left as it is;
* the lookup tables of ``ImageOps`` (posterize, solarize, invert, autocontrast) and timm's
  ``solarize_add``; ``equalize`` is DALI's (OpenCV's lookup table, not PIL's: measured);
* torchvision's hue: PIL's RGB -> HSV -> RGB conversions (float32/float64 as Pillow's C), the
  hue channel shifted modulo 256;
* torchvision's ``GaussianBlur``: DALI's Gaussian kernel with reflect-101 borders, rounded;
* timm's ``GaussianBlur``: PIL's three extended box passes per axis, in Pillow's integer
  weights (``ww``, ``fw`` over ``2**24``), each pass rounded to uint8, edges repeated.

The per-sample parameters ``p`` are expected on the CPU (as ``external_source`` gives them):
some become argument inputs (``gaussian_blur``'s window and sigma).
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

from .graphop import GraphOp

#: The operations :func:`color_op` builds, per library.
COLOR_NAMES: dict[str, tuple[str, ...]] = {
    "torchvision": (
        "Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize",
        "Invert", "Grayscale", "GaussianBlur", "ColorJitter",
    ),
    "timm": (
        "AutoContrast", "Equalize", "Invert", "Posterize", "PosterizeIncreasing", "PosterizeOriginal", "Solarize",
        "SolarizeIncreasing", "SolarizeAdd", "Color", "ColorIncreasing", "Contrast", "ContrastIncreasing",
        "Brightness", "BrightnessIncreasing", "Sharpness", "SharpnessIncreasing", "Desaturate", "GaussianBlur",
    ),
}  # fmt: skip

#: Taps of timm's box-blur kernel: box radii up to 2 (PIL radius < 3.46; timm draws at most 2).
BOX_TAPS = 7

#: ColorJitter's blend kinds, in torchvision's part order (hue is the fourth part).
_BRIGHT, _CONTRAST, _SAT = 0, 1, 2


def _dali() -> tuple[Any, Any, Any]:
    from ..pipeline import import_dali

    return import_dali()


def _u8(x: Any) -> Any:
    """A float/int node already in [0, 255] (integral) as uint8."""
    _, fn, types = _dali()
    return fn.cast(x, dtype=types.UINT8)


def _f32(x: Any) -> Any:
    _, fn, types = _dali()
    return fn.cast(x, dtype=types.FLOAT)


def _f64(x: Any) -> Any:
    _, fn, types = _dali()
    return fn.cast(x, dtype=types.FLOAT64)


def _to_device(node: Any, img: Any) -> Any:
    """``node`` on the device of ``img`` (a data input of a GPU operator must be on the GPU)."""
    return node.gpu() if getattr(img, "device", "cpu") == "gpu" else node


def _luma(img: Any) -> Any:
    """PIL's ``convert("L")`` of an RGB uint8 HWC node, as an int32 ``HW1`` node."""
    _, fn, types = _dali()
    x = fn.cast(img, dtype=types.INT32)
    s = x[:, :, 0:1] * 9798 + x[:, :, 1:2] * 19235 + x[:, :, 2:3] * 3735 + 16384
    return s // 32768


def _blend(degenerate: Any, img: Any, factor: Any) -> Any:
    """PIL's ``Image.blend(degenerate, img, factor)``: float32 ``d + f * (x - d)``, truncated, clipped; float32."""
    dali, _, _ = _dali()
    d = _f32(degenerate)
    t = d + factor * (_f32(img) - d)
    return dali.math.clamp(dali.math.floor(t), 0.0, 255.0)


def _contrast_centre(img: Any) -> Any:
    """``int(mean(L) + 0.5)`` per sample, exactly (integer sums), as an int64 scalar node."""
    _, fn, types = _dali()
    lum = _luma(img)
    total = fn.reductions.sum(lum, dtype=types.INT64)
    count = fn.reductions.sum(fn.cast(lum >= 0, dtype=types.INT64), dtype=types.INT64)
    return (total * 2 + count) // (count * 2)


def _smooth(img: Any) -> Any:
    """PIL's ``filter(SMOOTH)`` (kernel 1,1,1 / 1,5,1 / 1,1,1 over 13, rounded); the border row and column kept."""
    _, fn, types = _dali()
    k = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float32)
    sums = fn.filter(img, _to_device(types.Constant(k), img), dtype=types.FLOAT, border="constant")
    ones = fn.filter(_f32(img) * 0.0 + 1.0, _to_device(types.Constant(np.ones((3, 3), np.float32)), img),
                     dtype=types.FLOAT, border="constant")  # fmt: skip
    dali = _dali()[0]
    smooth = dali.math.floor(sums / 13.0 + 0.5)
    inner = ones > 8.5
    return inner * smooth + (inner ^ True) * _f32(img)


def _enhance(kind: str) -> Callable[[Any, Any], Any]:
    """The graph of one ``ImageEnhance`` class with the factor in ``p[0]``."""

    def graph(img: Any, p: Any) -> Any:
        f = p[0]
        if kind == "Brightness":
            deg = _f32(img) * 0.0
        elif kind == "Color":
            deg = _luma(img)
        elif kind == "Contrast":
            deg = _contrast_centre(img)
        else:
            deg = _smooth(img)
        return _u8(_blend(deg, img, f))

    return graph


def _lut_graph(kind: str) -> Callable[[Any, Any], Any]:
    """Posterize (mask in ``p[0]``), Solarize (integer threshold), SolarizeAdd (add), Invert."""
    _, fn, types = _dali()

    def graph(img: Any, p: Any) -> Any:
        if kind == "Posterize":
            return img & fn.cast(p[0], dtype=types.UINT8)
        if kind == "Invert":
            return types.Constant(255, dtype=types.UINT8) - img
        x = fn.cast(img, dtype=types.INT32)
        if kind == "Solarize":
            return _u8(x ^ ((x >= p[0]) * 255))
        dali = _dali()[0]
        return _u8(dali.math.min(x + (x < 128) * fn.cast(p[0], dtype=types.INT32), 255))

    return graph


def _autocontrast(img: Any, p: Any) -> Any:
    """``ImageOps.autocontrast`` (cutoff 0) per channel: ``int(x * scale + offset)`` in float64, or identity."""
    dali, fn, _ = _dali()
    lo = _f64(fn.reductions.min(img, axis_names="HW", keep_dims=True))
    hi = _f64(fn.reductions.max(img, axis_names="HW", keep_dims=True))
    spread = hi - lo
    flat = spread < 0.5
    scale = 255.0 / (spread + flat)
    offset = -(lo * scale)
    v = dali.math.clamp(dali.math.floor(_f64(img) * scale + offset), 0.0, 255.0)
    return _u8(flat * _f64(img) + (flat ^ True) * v)


def _equalize(img: Any, p: Any) -> Any:
    """DALI's histogram equalisation (OpenCV's lookup table; PIL's differs by a level here and there: measured)."""
    _, fn, _ = _dali()
    return fn.equalize(img)


def _grayscale(img: Any, p: Any) -> Any:
    """PIL's ``L`` repeated on three channels."""
    _, fn, _ = _dali()
    lum = _luma(img)
    return _u8(fn.cat(lum, lum, lum, axis=2))


def _gaussian_tv(img: Any, p: Any) -> Any:
    """torchvision's ``gaussian_blur`` (kernel ``(kx, ky)``, one sigma, reflect borders), rounded."""
    dali, fn, types = _dali()
    window = fn.cast(p[0:2], dtype=types.INT32)  # (ky, kx): DALI's axes in layout order
    sigma = p[2:3]
    out = fn.gaussian_blur(img, window_size=window, sigma=fn.cat(sigma, sigma), dtype=types.FLOAT)
    return _u8(dali.math.clamp(dali.math.floor(out + 0.5), 0.0, 255.0))


def _box_pass(x: Any, kernel: Any, ww: Any, fw: Any) -> Any:
    """One of PIL's extended box passes: ``(ww * inner + fw * outer + 2**23) >> 24``, exactly (int64)."""
    _, fn, types = _dali()
    s = fn.filter(x, kernel, dtype=types.FLOAT, border="clamp")  # 1024 * inner + outer, exact in float32
    si = fn.cast(s, dtype=types.INT64)
    inner = si // 1024
    outer = si - inner * 1024
    return _u8((inner * ww + outer * fw + 8388608) // 16777216)


def _gaussian_timm(img: Any, p: Any) -> Any:
    """PIL's ``GaussianBlur(radius)``: three box passes along the rows, then three down the columns (Pillow-SIMD's)."""
    _, fn, types = _dali()
    half = BOX_TAPS // 2
    dist = types.Constant(np.abs(np.arange(BOX_TAPS) - half).astype(np.float32))
    r = p[0]
    taps = _f32((dist < r + 0.5) * 1024 + (dist > r + 0.5) * (dist < r + 1.5))
    ww = fn.cast(p[1], dtype=types.INT64)
    fw = fn.cast(p[2], dtype=types.INT64)
    col = _to_device(fn.reshape(taps, shape=[BOX_TAPS, 1]), img)
    row = _to_device(fn.reshape(taps, shape=[1, BOX_TAPS]), img)
    x = img
    for kernel in (row, row, row, col, col, col):
        x = _box_pass(x, kernel, ww, fw)
    return x


def box_weights(radius: float) -> tuple[float, float, float]:
    """PIL's ``GaussianBlur(radius)`` (3 passes) as its box pass's integer radius and weights ``ww``, ``fw``.

    Pillow's float32 ``_gaussian_blur_radius`` and ``ImagingHorizontalBoxBlur``'s weights over ``2**24``.
    """
    f = np.float32
    sigma2 = f(f(radius) * f(radius) / f(3))
    big = f(math.sqrt(12.0 * float(sigma2) + 1.0))
    lo = f(math.floor((float(big) - 1.0) / 2.0))
    a = f((f(2) * lo + f(1)) * (lo * (lo + f(1)) - f(3) * sigma2))
    a = f(a / (f(6) * (sigma2 - (lo + f(1)) * (lo + f(1)))))
    box = f(lo + a)
    r = int(box)
    if r > BOX_TAPS // 2 - 1:
        raise ValueError(f"GaussianBlur radius {radius} needs a box wider than {BOX_TAPS} taps")
    ww = int(f(1 << 24) / (box * f(2) + f(1)))
    fw = ((1 << 24) - (2 * r + 1) * ww) // 2
    return float(r), float(ww), float(fw)


def _jitter_host(args: tuple) -> tuple[float, ...]:
    """ColorJitter's (order, factors) as three blend slots (kind, factor) in order, the hue's place among
    them and its shift (``-1``: no hue)."""
    slots: list[tuple[float, float]] = []
    hue_at, shift = 3.0, -1.0
    for k in args[:4]:
        f = float(args[4 + int(k)])
        if int(k) == 3:
            if not math.isnan(f):
                hue_at, shift = float(len(slots)), float(int(np.int32(f * 255)) % 256)
            continue
        slots.append((float(int(k)), 1.0 if math.isnan(f) else f))
    flat = [v for s in slots for v in s]
    return tuple(flat) + (hue_at, shift)


def _jitter_slot(img: Any, kind: Any, factor: Any) -> Any:
    """One brightness/contrast/saturation blend chosen per sample by ``kind`` (factor 1: the image as is)."""
    deg = (kind == _CONTRAST) * _contrast_centre(img) + (kind == _SAT) * _luma(img)
    return _u8(_blend(deg, img, factor))


def _rgb_to_hsv(img: Any) -> tuple[Any, Any, Any]:
    """Pillow's ``rgb2hsv`` (float32 ratios, float64 hue) of a uint8 HWC node: float64 ``HW`` planes."""
    dali, _, _ = _dali()
    r, g, b = (_f64(img[:, :, c]) for c in range(3))
    mx = dali.math.max(r, dali.math.max(g, b))
    mn = dali.math.min(r, dali.math.min(g, b))
    same = mx == mn
    cr = _f32(mx - mn + same)
    s = _f32(mx - mn) / _f32(mx + (mx < 0.5))
    rc, gc, bc = (_f32(mx - c) / cr for c in (r, g, b))
    is_r = r == mx
    is_g = (g == mx) & (is_r ^ True)
    is_b = (is_r | is_g) ^ True
    h = is_r * _f64(bc - gc) + is_g * _f32(2.0 + _f64(rc) - _f64(bc)) + is_b * _f32(4.0 + _f64(gc) - _f64(rc))
    y = _f64(h) / 6.0 + 1.0
    hue = _f64(_f32(y - dali.math.floor(y)))
    uh = dali.math.clamp(dali.math.floor(hue * 255.0), 0.0, 255.0) * (same ^ True)
    us = dali.math.clamp(dali.math.floor(_f64(s) * 255.0), 0.0, 255.0) * (same ^ True)
    return uh, us, mx


def _cround(v: Any) -> Any:
    """C's ``round`` (half away from zero) of a non-negative float64 node, exactly."""
    dali, _, _ = _dali()
    fl = dali.math.floor(v)
    return fl + ((v - fl) >= 0.5)


def _hsv_to_rgb(h: Any, s: Any, v: Any) -> Any:
    """Pillow's ``hsv2rgb`` of float64 ``HW`` planes (integral values): a uint8 HWC node."""
    dali, fn, _ = _dali()
    i = dali.math.floor(h * 6.0 / 255.0)
    f = _f32(h * 6.0 / 255.0 - i)
    fs = _f32(s / 255.0)
    pp = _cround(v * (1.0 - _f64(fs)))
    qq = _cround(v * (1.0 - _f64(fs * f)))
    tt = _cround(v * (1.0 - _f64(fs) * (1.0 - _f64(f))))
    sec = i - (i > 5.5) * 6.0
    m = [sec == k for k in range(6)]
    red = (m[0] | m[5]) * v + m[1] * qq + (m[2] | m[3]) * pp + m[4] * tt
    green = m[0] * tt + (m[1] | m[2]) * v + m[3] * qq + (m[4] | m[5]) * pp
    blue = (m[0] | m[1]) * pp + m[2] * tt + (m[3] | m[4]) * v + m[5] * qq
    grey = s < 0.5
    planes = [grey * v + (grey ^ True) * c for c in (red, green, blue)]
    return _u8(fn.stack(*planes, axis=2, axis_name="C"))


def _hue(img: Any, shift: Any) -> Any:
    """torchvision's PIL ``adjust_hue``: HSV, hue + ``shift`` modulo 256, back; ``shift < 0``: the image."""
    h, s, v = _rgb_to_hsv(img)
    on = shift > -0.5
    hs = h + on * _f64(shift)
    hs = hs - (hs > 255.5) * 256.0
    moved = _hsv_to_rgb(hs, s, v)
    return _u8(on * _f64(moved) + (on ^ True) * _f64(img))


def _jitter(img: Any, p: Any) -> Any:
    """ColorJitter: the blends before the hue, the hue, the blends after it (a blend out of place: factor 1)."""
    hue_at = p[6]
    x = img
    for after in (False, True):
        for j in range(3):
            here = (hue_at <= j) if after else (hue_at > j)
            factor = here * p[2 * j + 1] + (here ^ True) * 1.0
            x = _jitter_slot(x, p[2 * j], _f32(factor))
        if not after:
            x = _hue(x, p[7])
    return x


def _posterize_mask(bits: float) -> float:
    """ImageOps.posterize's mask keeping ``bits`` high bits (8 or more: all)."""
    b = max(0, min(8, int(bits)))
    return float(256 - (1 << (8 - b)))


def _tv_op(name: str) -> tuple[Callable[[tuple], Any], Callable[[Any, Any], Any]] | None:
    """torchvision's ``(host, graph)`` of ``name``."""
    if name in ("Brightness", "Color", "Contrast", "Sharpness"):
        return (lambda a: (1.0 + float(a[0]),)), _enhance(name)
    if name == "Posterize":
        return (lambda a: (_posterize_mask(int(a[0])),)), _lut_graph("Posterize")
    if name == "Solarize":  # i < threshold keeps i: the integer threshold ceil(threshold)
        return (lambda a: (float(min(256, max(0, math.ceil(float(a[0]))))),)), _lut_graph("Solarize")
    if name == "GaussianBlur":
        return (lambda a: (float(a[1]), float(a[0]), float(np.float32(a[2])))), _gaussian_tv
    if name == "ColorJitter":
        return _jitter_host, _jitter
    plain = {"AutoContrast": _autocontrast, "Equalize": _equalize, "Invert": _lut_graph("Invert"),
             "Grayscale": _grayscale}  # fmt: skip
    return ((lambda a: ()), plain[name]) if name in plain else None


def _timm_op(name: str) -> tuple[Callable[[tuple], Any], Callable[[Any, Any], Any]] | None:
    """timm's ``(host, graph)`` of ``name``."""
    base = name[: -len("Increasing")] if name.endswith("Increasing") else name
    if base in ("Brightness", "Color", "Contrast", "Sharpness"):
        return (lambda a: (float(a[0]),)), _enhance(base)
    if name == "Desaturate":
        return (lambda a: (min(1.0, max(0.0, 1.0 - float(a[0]))),)), _enhance("Color")
    if name.startswith("Posterize"):
        return (lambda a: (_posterize_mask(int(a[0])),)), _lut_graph("Posterize")
    if base == "Solarize":
        return (lambda a: (float(min(256, max(0, math.ceil(float(a[0]))))),)), _lut_graph("Solarize")
    if name == "SolarizeAdd":
        return (lambda a: (float(int(a[0])),)), _lut_graph("SolarizeAdd")
    if name == "GaussianBlur":
        return (lambda a: box_weights(float(a[0]))), _gaussian_timm
    plain = {"AutoContrast": _autocontrast, "Equalize": _equalize, "Invert": _lut_graph("Invert")}
    return ((lambda a: ()), plain[name]) if name in plain else None


def color_op(library: str, name: str, interpolation: str, fill: tuple[int, int, int]) -> GraphOp | None:
    """The :class:`GraphOp` of ``library``'s colour/pixel operation ``name``; None for a name this module does not do.

    ``interpolation`` and ``fill`` are accepted for the common signature of the operation tables; none of
    these operations resamples or fills.
    """
    if name not in COLOR_NAMES.get(library, ()):
        return None
    made = _timm_op(name) if library == "timm" else _tv_op(name)
    if made is None:
        return None
    host, graph = made
    return GraphOp(library, name, interpolation, host=host, graph=graph)
