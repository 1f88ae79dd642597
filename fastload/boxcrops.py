"""Crop windows for detection samples and the boxes they leave, as torchvision v2 draws and keeps them; pure NumPy.

Two crops, each a pure function of ``(seed, epoch, sample index)`` through
:func:`fastload.augment.uniforms` (so a rerun, a resume and the DALI path draw the same windows):

* ``"iou"``: SSD's random IoU crop, torchvision v2 ``RandomIoUCrop``'s algorithm: draw one of
  the ``options`` (minimum IoU; ``>= 1`` leaves the image as it is); then up to ``trials``
  windows with sides ``int(side * U(scale))`` (width and height drawn apart), kept when
  ``ratio[0] <= w / h <= ratio[1]``, corner ``int((side - new side) * U)``, non-empty, holding
  the centre of at least one box (strictly inside) and with at least one such box of IoU
  ``>= option`` with the window; no trial passes: draw an option again. The boxes whose centre
  is outside the window are zeroed (``RandomIoUCrop.transform``), so the sanitising drops them.
* ``"resized"``: torchvision ``RandomResizedCrop``'s window (:func:`fastload.augment.random_resized_crop`).

Boxes are then shifted into the window and clipped to it (``F.crop`` on ``BoundingBoxes``), and
:func:`sanitize_mask` is ``SanitizeBoundingBoxes``' rule.
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from typing import Any, Sequence

import numpy as np

from .augment import random_resized_crop, uniforms
from .errors import ConfigError, as_int

#: torchvision ``RandomIoUCrop``'s defaults (the SSD paper's sampler).
IOU_OPTIONS = (0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0)
IOU_TRIALS = 40
#: The most ``iou_trials`` (torchvision's default is 40): each is a draw per sample per option.
MAX_IOU_TRIALS = 10_000
#: ``(scale, ratio)`` defaults of each crop: ``RandomIoUCrop``'s ``min/max_scale`` and
#: ``min/max_aspect_ratio``; ``RandomResizedCrop``'s ``scale`` and ``ratio``.
DEFAULTS = {"iou": ((0.3, 1.0), (0.5, 2.0)), "resized": ((0.08, 1.0), (3 / 4, 4 / 3))}
#: Rounds of option draws before an IoU crop gives up and leaves the image whole. torchvision
#: loops until a draw succeeds; a round fails only when no trial passes, and with the default
#: options the ``1.0`` option ends the loop with probability 1/7 a round, so 64 rounds change the
#: law by less than 1e-4 ((6/7)^64 = 5e-5).
MAX_ROUNDS = 64
#: Mixed into the seed of the crop draws, independent of the flip draws (``uniforms(seed, ...)``).
IOU_SALT = 0x243F6A8885A308D3
RRC_SALT = 0x13198A2E03707344
_ROUND = 0x9E3779B97F4A7C15
RRC_ATTEMPTS = 10


@dataclasses.dataclass(frozen=True)
class CropSpec:
    """A detection crop's law: ``kind`` (``"iou"`` or ``"resized"``) and its parameters."""

    kind: str
    scale: tuple[float, float]
    ratio: tuple[float, float]
    options: tuple[float, ...] = IOU_OPTIONS
    trials: int = IOU_TRIALS


@dataclasses.dataclass(frozen=True)
class Window:
    """A crop window in pixels of the stored image, and which boxes the crop keeps (None: all)."""

    top: int
    left: int
    height: int
    width: int
    within: np.ndarray | None = None


def _pair(name: str, value: Any, *, positive: bool) -> tuple[float, float]:
    try:
        lo, hi = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a pair of numbers (low, high), got {reprlib.repr(value)}") from None
    if not (math.isfinite(lo) and math.isfinite(hi)) or lo > hi or (lo <= 0 if positive else lo < 0):
        raise ConfigError(f"{name} must be (low, high) with 0 {'<' if positive else '<='} low <= high, got {reprlib.repr(value)}")
    return lo, hi


def crop_spec(crop: Any, *, scale: Any = None, ratio: Any = None, iou_options: Any = None, iou_trials: Any = None) -> CropSpec | None:
    """The validated :class:`CropSpec` of ``DetectionLoader``'s crop arguments (None: no crop).

    Raises:
        ConfigError: naming the argument and the value (an unknown crop, a bad range, IoU options
            given for another crop).
    """
    if crop is None:
        for name, v in (("scale", scale), ("ratio", ratio), ("iou_options", iou_options), ("iou_trials", iou_trials)):
            if v is not None:
                raise ConfigError(f"{name}={reprlib.repr(v)} applies to a crop: give crop='iou' or crop='resized'")
        return None
    if crop not in DEFAULTS:
        raise ConfigError(f"crop must be None, 'iou' (SSD's RandomIoUCrop) or 'resized' (RandomResizedCrop) with boxes, got {reprlib.repr(crop)}")
    d_scale, d_ratio = DEFAULTS[crop]
    scale = d_scale if scale is None else _pair("scale", scale, positive=True)
    ratio = d_ratio if ratio is None else _pair("ratio", ratio, positive=True)
    if crop == "iou" and scale[1] > 1.0:
        raise ConfigError(f"scale must be within (0, 1] for crop='iou' (a window inside the image), got {scale}")
    if crop != "iou":
        for name, v in (("iou_options", iou_options), ("iou_trials", iou_trials)):
            if v is not None:
                raise ConfigError(f"{name}={reprlib.repr(v)} applies to crop='iou' only (crop={crop!r})")
        return CropSpec(crop, scale, ratio)
    options = IOU_OPTIONS if iou_options is None else iou_options
    if isinstance(options, (str, bytes)) or not isinstance(options, Sequence) or not options:
        raise ConfigError(f"iou_options must be a non-empty list of minimum IoUs (>= 1 leaves the image whole), got {reprlib.repr(iou_options)}")
    try:
        opts = tuple(float(o) for o in options)
    except (TypeError, ValueError):
        raise ConfigError(f"iou_options must be numbers, got {reprlib.repr(iou_options)}") from None
    if not all(math.isfinite(o) and o >= 0 for o in opts):
        raise ConfigError(f"iou_options must be finite and >= 0, got {reprlib.repr(iou_options)}")
    trials = IOU_TRIALS if iou_trials is None else as_int("iou_trials", iou_trials, lo=1, hi=MAX_IOU_TRIALS)
    return CropSpec(crop, scale, ratio, opts, trials)


def _box_iou(boxes: np.ndarray, window: np.ndarray) -> np.ndarray:
    """IoU of each box ``[N, 4]`` with each window ``[T, 4]`` (XYXY): ``[T, N]``, as ``torchvision.ops.box_iou``."""
    area_b = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    area_w = (window[:, 2] - window[:, 0]) * (window[:, 3] - window[:, 1])
    lt = np.maximum(window[:, None, :2], boxes[None, :, :2])
    rb = np.minimum(window[:, None, 2:], boxes[None, :, 2:])
    wh = np.clip(rb - lt, 0, None)
    inter = wh[..., 0] * wh[..., 1]
    with np.errstate(invalid="ignore", divide="ignore"):
        return inter / (area_w[:, None] + area_b[None, :] - inter)


def iou_window(spec: CropSpec, boxes: np.ndarray, height: int, width: int, *, seed: int, epoch: int, index: int) -> Window | None:
    """``RandomIoUCrop``'s window for one sample (None: the image is left whole)."""
    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    t = spec.trials
    cx, cy = 0.5 * (boxes[:, 0] + boxes[:, 2]), 0.5 * (boxes[:, 1] + boxes[:, 3])
    (s0, s1), (a0, a1) = spec.scale, spec.ratio
    for r in range(MAX_ROUNDS):
        u = uniforms((seed ^ IOU_SALT) + r * _ROUND, epoch, np.array([index]), 1 + 4 * t)[0]
        min_iou = spec.options[min(int(u[0] * len(spec.options)), len(spec.options) - 1)]
        if min_iou >= 1.0 or not len(boxes):
            return None  # without boxes no trial passes: torchvision draws options until "no crop"
        sw, sh = u[1 : 1 + t], u[1 + t : 1 + 2 * t]
        new_w = np.floor(width * (s0 + (s1 - s0) * sw))
        new_h = np.floor(height * (s0 + (s1 - s0) * sh))
        with np.errstate(divide="ignore", invalid="ignore"):
            aspect = new_w / new_h
        ok = (new_h > 0) & (a0 <= aspect) & (aspect <= a1)
        left = np.floor((width - new_w) * u[1 + 2 * t : 1 + 3 * t])
        top = np.floor((height - new_h) * u[1 + 3 * t : 1 + 4 * t])
        right, bottom = left + new_w, top + new_h
        ok &= (left != right) & (top != bottom)
        inside = (left[:, None] < cx) & (cx < right[:, None]) & (top[:, None] < cy) & (cy < bottom[:, None])  # [T, N]
        ok &= inside.any(axis=1)
        iou = np.where(inside, _box_iou(boxes, np.stack([left, top, right, bottom], axis=1)), -np.inf)
        ok &= iou.max(axis=1) >= min_iou
        if ok.any():
            k = int(np.argmax(ok))
            return Window(int(top[k]), int(left[k]), int(new_h[k]), int(new_w[k]), inside[k].copy())
    return None


def resized_window(spec: CropSpec, height: int, width: int, *, seed: int, epoch: int, index: int) -> Window:
    """``RandomResizedCrop``'s window for one sample (its central fallback after 10 attempts)."""
    u = uniforms(seed ^ RRC_SALT, epoch, np.array([index]), 4 * RRC_ATTEMPTS)
    x, y, w, h = random_resized_crop(np.array([width]), np.array([height]), u, scale=spec.scale, ratio=spec.ratio)[0]
    return Window(int(y), int(x), int(h), int(w))


def window(spec: CropSpec | None, boxes: np.ndarray, height: int, width: int, *, seed: int, epoch: int, index: int) -> Window | None:
    """The crop window of sample ``index`` in ``epoch`` (None: no crop)."""
    if spec is None:
        return None
    if spec.kind == "iou":
        return iou_window(spec, boxes, height, width, seed=seed, epoch=epoch, index=index)
    return resized_window(spec, height, width, seed=seed, epoch=epoch, index=index)


def crop_boxes(boxes: np.ndarray, win: Window) -> np.ndarray:
    """XYXY ``boxes`` moved into ``win`` and clipped to it (``F.crop`` on ``BoundingBoxes``); boxes
    outside ``win.within`` zeroed (``RandomIoUCrop``'s mark for the sanitising)."""
    out = np.asarray(boxes, dtype=np.float32).reshape(-1, 4) - np.array([win.left, win.top, win.left, win.top], np.float32)
    out[:, 0::2] = np.clip(out[:, 0::2], 0, win.width)
    out[:, 1::2] = np.clip(out[:, 1::2], 0, win.height)
    if win.within is not None:
        out[~win.within] = 0
    return out


def sanitize_mask(boxes: np.ndarray, size: tuple[int, int], *, min_size: float = 1.0) -> np.ndarray:
    """Which XYXY ``boxes`` of an image of ``size`` (h, w) ``SanitizeBoundingBoxes(min_size)`` keeps:
    width and height ``>= min_size``, area ``>= 1`` (its ``min_area``), every coordinate within the image."""
    b = np.asarray(boxes, dtype=np.float32).reshape(-1, 4)
    ws, hs = b[:, 2] - b[:, 0], b[:, 3] - b[:, 1]
    valid = (ws >= min_size) & (hs >= min_size) & (ws * hs >= 1.0) & (b >= 0).all(axis=1)
    valid &= (b[:, 0] <= size[1]) & (b[:, 2] <= size[1]) & (b[:, 1] <= size[0]) & (b[:, 3] <= size[0])
    return valid


__all__ = ["CropSpec", "DEFAULTS", "IOU_OPTIONS", "Window", "crop_boxes", "crop_spec", "iou_window", "resized_window", "sanitize_mask", "window"]
