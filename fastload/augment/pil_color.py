"""PIL's colour operations that DALI has no exact operator for, compiled, as DALI operators on its CPU threads.

DALI's ``equalize`` is OpenCV's lookup table (each level to the top of its share of the histogram; PIL's to
its middle: up to 13 levels apart on photos, 128 on a two-level image), its ``hsv`` turns the chroma in YIQ
where torchvision's ``adjust_hue`` makes PIL's HSV round trip (3.7 to 15 levels apart on photos), and its fused
float32 operators come within a level of PIL's blends and autocontrast. These are Pillow's own arithmetic
(:mod:`fastload.augment.kernels`):

* :func:`equalize`: ``ImageOps.equalize`` per channel (the step from the histogram without its last
  non-empty bin, ``lut[i] = (step // 2 + cumulative count below i) // step``, a channel of one level
  unchanged), which torchvision's ``F.equalize`` and timm's ``equalize`` call;
* :func:`autocontrast`: ``ImageOps.autocontrast`` without cutoff, per channel;
* :func:`enhance`: ``ImageEnhance``'s Brightness, Contrast and Color (``Blend.c``'s float32 blend with black,
  the rounded mean of ``L``, or each pixel's ``L``);
* the hue, inside :func:`jitter`: ``Image.convert("HSV")`` (``Convert.c``'s ``rgb2hsv_row``: float32 arithmetic, the
  hue's wrap in double), the uint8 hue plus a shift with wrap-around, and ``convert("RGB")``
  (``hsv2rgb``: round half away from zero), as torchvision's ``adjust_hue`` does on a PIL image;
* :func:`jitter`: torchvision's ``ColorJitter``, its four parts in the drawn order (brightness, contrast,
  saturation as :func:`enhance`, the hue as above).

Each runs per sample in DALI's ``numba_function`` (:mod:`fastload.augment.compiled`). CPU only: a GPU graph
keeps DALI's operators (:mod:`fastload.augment.ops_color`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .compiled import apply, image_op
from .kernels.layout import SLOT

__all__ = [
    "ENHANCE_NAMES", "SLOT", "autocontrast", "enhance", "equalize", "hue_shift", "jitter",
]  # fmt: skip


def hue_shift(hue_factor: float) -> int:
    """torchvision's ``np.int32(hue_factor * 255).astype(np.uint8)``: the levels added to PIL's uint8 hue."""
    return int(np.int32(float(hue_factor) * 255)) & 0xFF


#: The ImageEnhance parts :func:`enhance` does.
ENHANCE_NAMES = ("Brightness", "Contrast", "Color")


def equalize(img: Any) -> Any:
    """``ImageOps.equalize`` of a uint8 HWC CPU DataNode, per channel."""
    return apply(image_op("equalize"), img)


def autocontrast(img: Any) -> Any:
    """``ImageOps.autocontrast`` (no cutoff) of a uint8 HWC CPU DataNode, per channel."""
    return apply(image_op("autocontrast"), img)


def enhance(img: Any, factor: Any, name: str) -> Any:
    """``ImageEnhance.<name>(image).enhance(factor)`` of a uint8 HWC (RGB) CPU DataNode (``name`` one of
    :data:`ENHANCE_NAMES`; ``factor`` a float32 ``[1]`` DataNode): PIL's float32 blend with the degenerate image."""
    if name not in ENHANCE_NAMES:
        raise ValueError(f"{name!r} is not one of {ENHANCE_NAMES}")
    return apply(image_op(name), img, factor)


def jitter(img: Any, p: Any) -> Any:
    """torchvision's ``ColorJitter`` on a PIL image, of a uint8 HWC (RGB) CPU DataNode: its four slots in ``p`` (the
    step's float32 parameters, laid out by :func:`fastload.augment.ops_color.jitter_slots`), each part PIL's
    ``ImageEnhance`` blend in float32 (brightness with black, contrast with the rounded mean of ``L``, saturation with
    each pixel's ``L``) or the hue shift, in the drawn order."""
    return apply(image_op("jitter"), img, p)
