"""The colour and pixel augmentation operations (torchvision's and timm's) as graph operations.

Each operation is a :class:`~fastload.augment.graphop.GraphOp` with two roads. On the CPU every one but
torchvision's Gaussian blur is PIL's own arithmetic, compiled (the compiled step, :mod:`fastload.augment.compiled`): exact to
the level. On a GPU the host's numbers (a 3x3 colour matrix, a filter kernel, a threshold) feed DALI's fused
per-pixel operators, one pass over the image where the library's PIL function makes one: ``brightness_contrast``,
``coord_transform`` (a per-sample colour matrix), ``filter`` (a per-sample kernel), ``gaussian_blur``,
``equalize`` and uint8 arithmetic. What DALI's road reproduces, as Pillow(-SIMD) computes it, and how close
(measured per operation in benchmarks/results/graph-ops-color.md, bounded in the tests):

* the ``ImageEnhance`` blends: Brightness ``floor(f x)`` and Contrast ``floor(c + f (x - c))``
  (``c`` the rounded mean of ``L``) exactly but for float rounding at integers; Color blends
  with the unrounded luma (PIL's is rounded first: a level at most); Sharpness is one 3x3 filter
  ``f * identity + (1 - f) * SMOOTH/13``, rounded (PIL rounds the smoothed image, then truncates
  the blend: a level or two), the 1-pixel border left as PIL leaves it;
* the lookup tables of ``ImageOps`` (posterize, solarize, invert, autocontrast) and timm's
  ``solarize_add``, exactly; ``equalize`` is OpenCV's lookup table, not PIL's (measured);
* ``Grayscale``: DALI's RGB -> GRAY, which is PIL's ``L`` on all 2**24 colours;
* ``GaussianBlur``: torchvision's through DALI's Gaussian kernel (on both roads: its 2-D convolution in torch has no
  order to reproduce); timm's (PIL's three extended box passes per axis) as six 1-D filters with Pillow's weights,
  each pass rounded (on the CPU Pillow's integer passes, compiled);
* ``ColorJitter``: four slots in the drawn order, each sample's slot chosen by its kind
  (a nested ``select``: nothing, brightness's scale, contrast's, a colour matrix for
  saturation or hue), rounded and clipped after each as PIL does; the hue a rotation in YIQ (what DALI's ``hsv``
  does), where the CPU's is PIL's HSV round trip: the one operation whose pixels differ visibly (docs/dropin.md).

A GPU operator takes argument inputs only from the CPU, so the statistics of the image itself (Contrast's mean,
AutoContrast's range) enter DALI's road through its arithmetic. :func:`statistics_form` builds a CPU graph in the
GPU's form (``"arithmetic"``: DALI's operators), so that the tests check the GPU's road without a GPU.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any, Callable, Iterator

import numpy as np

from .graphop import GraphOp, no_params
from .kernels import layout

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

#: PIL's ``L`` weights (``(9798 R + 19235 G + 3735 B + 16384) >> 15``).
LUMA = np.array([9798, 19235, 3735], dtype=np.float64) / 32768.0

#: RGB -> YIQ (NTSC), the space of the hue rotation.
_YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])

#: Floats one ColorJitter slot takes: its kind (:data:`SLOT_KINDS`), then a 3x3 matrix, or the factor first; a hue's
#: matrix is followed by its shift of PIL's uint8 hue.
SLOT = layout.SLOT

#: What a ColorJitter slot does: nothing, a scale (brightness), a scale about the centre (contrast), a colour matrix
#: (saturation), a hue turn (PIL's HSV shift on the CPU, its YIQ matrix on a GPU).
SLOT_KINDS = ("identity", "scale", "contrast", "matrix", "hue")

#: Shift that makes DALI's rounding (half away from zero) PIL's truncation of a non-negative value.
_TRUNC = -0.5

_FORCED: list[str] = []


@contextlib.contextmanager
def statistics_form(form: str) -> Iterator[None]:
    """Build graphs, while inside, with ``form``: ``"arguments"`` (the CPU's: PIL's arithmetic compiled) or
    ``"arithmetic"`` (the GPU's: DALI's operators, the image's statistics through its arithmetic)."""
    if form not in ("arguments", "arithmetic"):
        raise ValueError(f"form must be 'arguments' or 'arithmetic', got {form!r}")
    _FORCED.append(form)
    try:
        yield
    finally:
        _FORCED.pop()


def _form(img: Any) -> str:
    if _FORCED:
        return _FORCED[-1]
    return "arithmetic" if getattr(img, "device", "cpu") == "gpu" else "arguments"


def _dali() -> tuple[Any, Any, Any]:
    from ..pipeline import import_dali

    return import_dali()


def _u8(value: int) -> Any:
    _, _, types = _dali()
    return types.Constant(value, dtype=types.UINT8)


def _to_device(node: Any, img: Any) -> Any:
    """``node`` on the device of ``img`` (a data input of a GPU operator must be on the GPU)."""
    return node.gpu() if getattr(img, "device", "cpu") == "gpu" else node


def _luma_plane(img: Any) -> Any:
    """PIL's ``convert("L")`` of a uint8 HWC node, uint8 ``HW1`` (DALI's RGB -> GRAY: PIL's on all 2**24 colours)."""
    _, fn, types = _dali()
    return fn.color_space_conversion(img, image_type=types.RGB, output_type=types.GRAY)


def _centre(img: Any) -> Any:
    """ImageEnhance.Contrast's centre: ``int(mean(L) + 0.5)``, a float scalar node on ``img``'s device."""
    dali, fn, types = _dali()
    mean = fn.reductions.mean(_luma_plane(img), dtype=types.FLOAT)
    return dali.math.floor(mean + 0.5)


def _matrix(p: Any, at: int = 0) -> Any:
    """The 3x3 colour matrix fed in ``p[at:at + 9]``."""
    _, fn, _ = _dali()
    return fn.reshape(p[at : at + 9], shape=[3, 3])


# ---- the host's side: what each operation is fed
def color_matrix(factor: float) -> np.ndarray:
    """ImageEnhance.Color's blend with ``L`` as a matrix: ``f I + (1 - f) [L weights; x3]``."""
    return factor * np.eye(3) + (1.0 - factor) * np.tile(LUMA, (3, 1))


def hue_matrix(hue: float) -> np.ndarray:
    """A hue turn of ``hue`` (torchvision's factor, a fraction of a full turn) as a rotation of YIQ's chroma."""
    t = -2.0 * math.pi * hue  # PIL's hue turns the other way round YIQ's chroma plane (measured: the closer sign)
    rot = np.array([[1.0, 0.0, 0.0], [0.0, math.cos(t), -math.sin(t)], [0.0, math.sin(t), math.cos(t)]])
    return np.linalg.inv(_YIQ) @ rot @ _YIQ


def sharpness_kernel(factor: float) -> np.ndarray:
    """ImageEnhance.Sharpness as one 3x3 kernel: ``f identity + (1 - f) SMOOTH / 13``."""
    smooth = np.array([[1, 1, 1], [1, 5, 1], [1, 1, 1]], dtype=np.float64) / 13.0
    delta = np.zeros((3, 3))
    delta[1, 1] = 1.0
    return factor * delta + (1.0 - factor) * smooth


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


def box_taps(radius: float) -> np.ndarray:
    """One pass of PIL's box blur of ``radius`` as :data:`BOX_TAPS` taps (inner ``ww``, the two outer ``fw``, /2**24)."""
    r, ww, fw = box_weights(radius)
    dist = np.abs(np.arange(BOX_TAPS) - BOX_TAPS // 2)
    return (np.where(dist <= r, ww, 0.0) + np.where(dist == r + 1, fw, 0.0)) / float(1 << 24)


def jitter_slots(args: tuple) -> tuple[float, ...]:
    """ColorJitter's (order, factors) as four slots in the drawn order (:data:`SLOT` floats each): the slot's kind
    (an index of :data:`SLOT_KINDS`), then brightness's or contrast's factor, or saturation's or hue's 3x3 matrix
    then saturation's factor or hue's shift (:func:`hue_shift`); a part that is off
    (NaN) is the identity."""
    out: list[float] = []
    for k in args[:4]:
        kind, f = int(k), float(args[4 + int(k)])
        slot = np.zeros(SLOT)
        if not math.isnan(f):
            if kind in (0, 1):
                slot[0], slot[1] = (1.0 if kind == 0 else 2.0), f
            elif kind == 2:
                slot[0], slot[1:10], slot[10] = 3.0, color_matrix(f).ravel(), f
            else:
                slot[0], slot[1:10], slot[10] = 4.0, hue_matrix(f).ravel(), hue_shift(f)
        out += [float(v) for v in slot]
    return tuple(out)


# ---- the graph's side
def _brightness(img: Any, p: Any, at: int = 0) -> Any:
    """``floor(f x)`` with ``f`` in ``p[at]``, clipped."""
    _, fn, _ = _dali()
    return fn.brightness_contrast(img, brightness=p[at], brightness_shift=_TRUNC / 255.0)


def _contrast(img: Any, p: Any, at: int = 0) -> Any:
    """``floor(c + f (x - c))`` with ``f`` in ``p[at]``, ``c`` the image's rounded mean luma."""
    dali, fn, types = _dali()
    f, c = p[at], _centre(img)
    v = dali.math.floor(c + _to_device(f, img) * (fn.cast(img, dtype=types.FLOAT) - c))
    return fn.cast(dali.math.clamp(v, 0.0, 255.0), dtype=types.UINT8)


def _color(img: Any, p: Any, at: int = 0) -> Any:
    """The 3x3 colour matrix in ``p[at:at + 9]`` on every pixel, truncated and clipped."""
    _, fn, types = _dali()
    return fn.coord_transform(img, M=_matrix(p, at), T=_TRUNC, dtype=types.UINT8)


def _sharpness(img: Any, p: Any) -> Any:
    """The fed 3x3 kernel over the inside of the image; the 1-pixel border as it was (PIL's SMOOTH keeps it)."""
    _, fn, types = _dali()
    kernel = _to_device(_matrix(p), img)
    inner = fn.filter(img, kernel, mode="valid")
    middle = fn.cat(img[1:-1, 0:1], inner, img[1:-1, -1:], axis=1)
    return fn.cat(img[0:1], middle, img[-1:], axis=0)


def _posterize(img: Any, p: Any) -> Any:
    _, fn, types = _dali()
    return img & fn.cast(p[0], dtype=types.UINT8)


def _solarize(img: Any, p: Any) -> Any:
    """``x ^ 255`` where ``x >= threshold`` (the integer threshold fed; 256: nothing)."""
    return img ^ ((img >= p[0]) * _u8(255))


def _solarize_add(img: Any, p: Any) -> Any:
    """timm's ``min(x + add, 255)`` below 128: a uint8 sum, its wrap-around clipped back to 255."""
    _, fn, types = _dali()
    s = img + (img < 128) * fn.cast(p[0], dtype=types.UINT8)
    return s | ((s < img) * _u8(255))


def _invert(img: Any, p: Any) -> Any:
    return _u8(255) - img


def takes_compiled(img: Any) -> bool:
    """Whether ``img``'s graph takes PIL's arithmetic compiled (the CPU's form): the compiled step and finish."""
    return _form(img) == "arguments" and getattr(img, "device", "cpu") == "cpu"


def hue_shift(hue_factor: float) -> int:
    """torchvision's ``np.int32(hue_factor * 255).astype(np.uint8)``: the levels added to PIL's uint8 hue."""
    return int(np.int32(float(hue_factor) * 255)) & 0xFF


def _equalize(img: Any, p: Any) -> Any:
    """``ImageOps.equalize`` as DALI does it (OpenCV's lookup table, not PIL's: measured)."""
    _, fn, _ = _dali()
    return fn.equalize(img)


def _autocontrast(img: Any, p: Any) -> Any:
    """``ImageOps.autocontrast`` (cutoff 0) per channel: ``int(x * scale - lo * scale)``; a flat channel as it is."""
    dali, fn, types = _dali()
    lo = fn.cast(fn.reductions.min(img, axis_names="HW"), dtype=types.FLOAT)
    hi = fn.cast(fn.reductions.max(img, axis_names="HW"), dtype=types.FLOAT)
    flat = fn.cast((hi - lo) < 0.5, dtype=types.FLOAT)
    scale = (255.0 / (hi - lo + flat)) * (1.0 - flat) + flat
    offset = (0.0 - lo * scale) * (1.0 - flat)
    v = dali.math.floor(fn.cast(img, dtype=types.FLOAT) * scale + offset)
    return fn.cast(dali.math.clamp(v, 0.0, 255.0), dtype=types.UINT8)


def _grayscale(img: Any, p: Any) -> Any:
    """PIL's ``L`` repeated on three channels."""
    _, fn, _ = _dali()
    lum = _luma_plane(img)
    return fn.cat(lum, lum, lum, axis=2)


def _gaussian_tv(img: Any, p: Any) -> Any:
    """torchvision's ``gaussian_blur`` (kernel ``(kx, ky)``, one sigma, reflect borders), rounded."""
    _, fn, types = _dali()
    window = fn.cast(p[0:2], dtype=types.INT32)  # (ky, kx): DALI's axes in layout order
    sigma = p[2:3]
    return fn.gaussian_blur(img, window_size=window, sigma=fn.cat(sigma, sigma))


def _gaussian_timm(img: Any, p: Any) -> Any:
    """PIL's ``GaussianBlur(radius)``: three box passes along the rows, then three down the columns, each rounded."""
    _, fn, _ = _dali()
    row = _to_device(fn.reshape(p[0:BOX_TAPS], shape=[1, BOX_TAPS]), img)
    col = _to_device(fn.reshape(p[0:BOX_TAPS], shape=[BOX_TAPS, 1]), img)
    x = img
    for kernel in (row, row, row, col, col, col):
        x = fn.filter(x, kernel, border="clamp")
    return x


def _kept(img: Any, p: Any, at: int = 0) -> Any:
    return img


def _jitter(img: Any, p: Any) -> Any:
    """ColorJitter: its four slots in order, each sample's slot by its kind (DALI's conditional ``select``), each
    rounded and clipped as PIL does after every part."""
    from nvidia.dali.auto_aug.core import select

    _, fn, types = _dali()
    x = img
    for j in range(4):
        at = SLOT * j
        kind = fn.cast(p[at], dtype=types.INT32)
        x = select([_kept, _brightness, _contrast, _color, _color], kind, x, p, at=at + 1)  # (the hue: its YIQ matrix)
    return x


def _posterize_mask(bits: float) -> float:
    """ImageOps.posterize's mask keeping ``bits`` high bits (8 or more: all)."""
    b = max(0, min(8, int(bits)))
    return float(256 - (1 << (8 - b)))


def _threshold(value: float) -> float:
    """Solarize's ``i < threshold`` keeps ``i``: the integer threshold ``ceil(threshold)`` in [0, 256]."""
    return float(min(256, max(0, math.ceil(float(value)))))


#: An operation's host side, its DALI graph and the name of its compiled step's code (``kernels.layout.CODES``;
#: None: DALI's operators everywhere).
_Made = tuple[Callable[[tuple], Any], Callable[[Any, Any], Any], "str | None"]

_ENHANCE: dict[str, Callable[[float], tuple[float, ...]]] = {
    "Brightness": lambda f: (f,),
    "Contrast": lambda f: (f,),
    # the matrix or kernel (a GPU's), then the factor (the compiled step's, at layout.FACTOR_AT)
    "Color": lambda f: (*color_matrix(f).ravel(), f),
    "Sharpness": lambda f: (*sharpness_kernel(f).ravel(), f),
}
_ENHANCE_GRAPH = {"Brightness": _brightness, "Contrast": _contrast, "Color": _color, "Sharpness": _sharpness}
_PLAIN = {"AutoContrast": _autocontrast, "Equalize": _equalize, "Invert": _invert, "Grayscale": _grayscale}


def _enhance(kind: str, factor_of: Callable[[tuple], float]) -> _Made:
    make = _ENHANCE[kind]
    return (lambda a: make(factor_of(a))), _ENHANCE_GRAPH[kind], kind


def _tv_op(name: str) -> _Made | None:
    """torchvision's ``(host, graph, code name)`` of ``name``."""
    if name in _ENHANCE:
        return _enhance(name, lambda a: 1.0 + float(a[0]))
    if name == "Posterize":
        return (lambda a: (_posterize_mask(int(a[0])),)), _posterize, name
    if name == "Solarize":
        return (lambda a: (_threshold(a[0]),)), _solarize, name
    if name == "GaussianBlur":
        return (lambda a: (float(a[1]), float(a[0]), float(np.float32(a[2])))), _gaussian_tv, None
    if name == "ColorJitter":
        return jitter_slots, _jitter, name
    return (no_params, _PLAIN[name], name) if name in _PLAIN else None


def _timm_op(name: str) -> _Made | None:
    """timm's ``(host, graph, code name)`` of ``name``."""
    base = name[: -len("Increasing")] if name.endswith("Increasing") else name
    if base in _ENHANCE:
        return _enhance(base, lambda a: float(a[0]))
    if name == "Desaturate":
        return _enhance("Color", lambda a: min(1.0, max(0.0, 1.0 - float(a[0]))))
    if name.startswith("Posterize"):
        return (lambda a: (_posterize_mask(int(a[0])),)), _posterize, "Posterize"
    if base == "Solarize":
        return (lambda a: (_threshold(a[0]),)), _solarize, "Solarize"
    if name == "SolarizeAdd":
        return (lambda a: (float(min(255, max(0, int(a[0])))),)), _solarize_add, name
    if name == "GaussianBlur":  # the taps (a GPU's), then the box (the compiled step's, at layout.BLUR_AT)
        return (lambda a: (*box_taps(float(a[0])), *box_weights(float(a[0])))), _gaussian_timm, "BoxBlur"
    return (no_params, _PLAIN[name], name) if name in _PLAIN and name != "Grayscale" else None


def _roads(dali_graph: Callable[[Any, Any], Any], code_name: str | None) -> tuple[Callable[[Any, Any], Any], Callable[[Any], int | None]]:
    """An operation's graph and code: the compiled step where the graph takes PIL's arithmetic compiled
    (:func:`takes_compiled`) and the operation has a code, DALI's operators elsewhere."""
    number = None if code_name is None else layout.code(code_name)

    def code(img: Any) -> int | None:
        return number if number is not None and takes_compiled(img) else None

    def graph(img: Any, p: Any) -> Any:
        c = code(img)
        if c is None:
            return dali_graph(img, p)
        from .compiled import step

        return step(img, [c], p)

    return graph, code


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
    host, dali_graph, code_name = made
    graph, code = _roads(dali_graph, code_name)
    return GraphOp(library, name, interpolation, host=host, graph=graph, code=code)
