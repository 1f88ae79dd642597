"""torchvision's ``RandomCrop`` (padding, fill, padding mode, pad_if_needed): its settings, its draws and its graph.

``RandomCrop(size, padding, pad_if_needed, fill, padding_mode)`` pads the image, then takes a
``size x size`` window whose top-left corner is uniform over the places it fits
(``torch.randint(0, h - size + 1)`` for the row, then the column). Here the corner is drawn on
the host from ``(seed, epoch, position)`` (:func:`pad_crop_params`, as every draw of
:mod:`fastload.augment.draws`), and the graph (:func:`pad_window`) takes that window from the
decoded image: out-of-bounds pixels filled with ``fill`` (``constant``), or from the image
extended by ``edge``/``reflect``/``symmetric`` padding built from slices, flips and one
concatenation per axis (operators DALI has on the CPU and the GPU alike).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

import numpy as np

from ..errors import ConfigError, as_int
from .draws import uniforms

__all__ = ["PAD_MODES", "PAD_SALT", "PadCrop", "host_window", "pad_crop_params", "pad_window", "static_pads"]

#: torchvision's padding modes.
PAD_MODES = ("constant", "edge", "reflect", "symmetric")
#: Mixed into the seed of the window draws, so that they are independent of the other draws.
PAD_SALT = 0x3C6EF372FE94F82B


@dataclasses.dataclass(frozen=True, kw_only=True)
class PadCrop:
    """What ``RandomCrop`` does before its window is taken (the window's side is ``Augment.crop``).

    Args:
        padding: pixels added on the ``(left, top, right, bottom)`` sides.
        fill: the ``constant`` padding's value per channel, in pixels 0..255.
        mode: one of :data:`PAD_MODES`.
        pad_if_needed: pad a side shorter than the window by the shortfall on both ends, as torchvision does.
    """

    padding: tuple[int, int, int, int] = (0, 0, 0, 0)
    fill: tuple[float, float, float] = (0.0, 0.0, 0.0)
    mode: str = "constant"
    pad_if_needed: bool = False

    def __post_init__(self) -> None:
        pad = self.padding
        if not isinstance(pad, (tuple, list)) or len(pad) != 4:
            raise ConfigError(f"pad_crop padding must be (left, top, right, bottom), got {pad!r}")
        object.__setattr__(self, "padding", tuple(as_int("pad_crop padding", p, lo=0, hi=1 << 14) for p in pad))
        fill = self.fill if isinstance(self.fill, (tuple, list)) else (self.fill,) * 3
        try:
            fill = tuple(float(v) for v in fill)
        except (TypeError, ValueError):
            raise ConfigError(f"pad_crop fill must be numbers, got {self.fill!r}") from None
        if len(fill) == 1:
            fill = fill * 3
        if len(fill) != 3 or not all(0.0 <= v <= 255.0 for v in fill):
            raise ConfigError(f"pad_crop fill must be 1 or 3 pixel values in 0..255, got {self.fill!r}")
        object.__setattr__(self, "fill", fill)
        if self.mode not in PAD_MODES:
            raise ConfigError(f"pad_crop mode must be one of {', '.join(PAD_MODES)}, got {self.mode!r}")
        object.__setattr__(self, "pad_if_needed", bool(self.pad_if_needed))


def _sides(pc: PadCrop, crop: int, widths: np.ndarray, heights: np.ndarray) -> tuple[np.ndarray, ...]:
    """Per image: left, top padding and the padded width, height (``pad_if_needed`` included)."""
    left, top, right, bottom = pc.padding
    w = np.asarray(widths, dtype=np.int64) + left + right
    h = np.asarray(heights, dtype=np.int64) + top + bottom
    lx = np.full(w.shape, left, dtype=np.int64)
    ty = np.full(h.shape, top, dtype=np.int64)
    if pc.pad_if_needed:  # torchvision: F.pad(img, [crop - width, 0]) pads both ends by the shortfall
        ex, ey = np.maximum(crop - w, 0), np.maximum(crop - h, 0)
        lx, ty, w, h = lx + ex, ty + ey, w + 2 * ex, h + 2 * ey
    return lx, ty, w, h


def static_pads(pc: PadCrop, crop: int, stats: Mapping[str, Any]) -> tuple[int, int, int, int]:
    """The ``(left, top, right, bottom)`` padding the graph builds for a non-``constant`` mode.

    ``stats`` is the packed dataset's manifest ``stats`` (``width``/``height`` with ``min``/``max``).
    ``pad_if_needed`` padding must then be the same for every image, and ``reflect`` (``symmetric``)
    padding at most one pixel less than (as many as) the shorter side, as torch's own padding allows.

    Raises:
        ConfigError: naming the sizes that do not allow it, and what to do.
    """
    left, top, right, bottom = pc.padding
    side = {k: (stats.get(k) or {}) if isinstance(stats.get(k), dict) else {} for k in ("width", "height")}
    lo = [side[k].get("min") for k in ("width", "height")]
    hi = [side[k].get("max") for k in ("width", "height")]
    if None in lo or None in hi:
        raise ConfigError(
            f"RandomCrop with padding_mode={pc.mode!r}: the packed dataset records no image sizes (its manifest's "
            "stats); pack it again (fastload pack, fastload.pack_dataset), which records them"
        )
    if pc.pad_if_needed:
        ex = [max(crop - (v + a + b), 0) for v, a, b in ((lo[0], left, right), (lo[1], top, bottom))]
        ex_hi = [max(crop - (v + a + b), 0) for v, a, b in ((hi[0], left, right), (hi[1], top, bottom))]
        if ex != ex_hi:
            raise ConfigError(
                f"RandomCrop({crop}, pad_if_needed=True, padding_mode={pc.mode!r}): images of {lo[0]}..{hi[0]} x "
                f"{lo[1]}..{hi[1]} pixels need different padding; use padding_mode='constant', or a padding "
                f"that leaves every image at least {crop} pixels on each side"
            )
        left, right, top, bottom = left + ex[0], right + ex[0], top + ex[1], bottom + ex[1]
    most = max(left, top, right, bottom)
    limit = min(lo) - (1 if pc.mode == "reflect" else 0)
    if pc.mode in ("reflect", "symmetric") and most > limit:
        raise ConfigError(
            f"RandomCrop with padding_mode={pc.mode!r}: a padding of {most} pixels is more than the {limit} the "
            f"smallest image ({lo[0]}x{lo[1]}) reflects; use a padding of at most {limit}, or padding_mode='constant'"
        )
    return left, top, right, bottom


def pad_crop_params(
    widths: np.ndarray, heights: np.ndarray, *, pc: PadCrop, crop: int, seed: int, epoch: int, positions: np.ndarray,
    flip: float,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Windows and flips of a batch: a pure function of (seed, epoch, position).

    Returns:
        ``[n, 2]`` float32 corners ``(x, y)``: for ``constant`` padding in the coordinates of the
        unpadded image (negative: inside the padding), for the other modes in those of the padded
        image (which :func:`static_pads` makes the same for every image), ``[n]`` int32 flips, and ``[n]`` bool: the padded image is smaller than
        the window (torchvision raises there).
    """
    lx, ty, w, h = _sides(pc, crop, widths, heights)
    u = uniforms(seed ^ PAD_SALT, epoch, positions, 3)
    too_small = (w < crop) | (h < crop)
    y = np.floor(u[:, 0] * np.maximum(h - crop + 1, 1)).astype(np.int64)  # torchvision draws the row first
    x = np.floor(u[:, 1] * np.maximum(w - crop + 1, 1)).astype(np.int64)
    flips = (u[:, 2] < flip).astype(np.int32)
    if pc.mode == "constant":
        x, y = x - lx, y - ty
    corners = np.stack([x, y], axis=1).astype(np.float32)
    return np.ascontiguousarray(corners), flips, too_small


def _extend(img: Any, axis: int, before: int, after: int, mode: str, device: str) -> Any:
    """``img`` (HWC) padded by ``before``/``after`` pixels along ``axis`` (0: rows, 1: columns), as ``np.pad``'s ``mode``."""
    from ..pipeline import import_dali

    _, fn, _ = import_dali()
    if not before and not after:
        return img
    turn = {"horizontal": 1, "vertical": 0} if axis == 1 else {"horizontal": 0, "vertical": 1}
    skip = 1 if mode == "reflect" else 0  # reflect leaves the edge pixel out; symmetric repeats it
    parts = []
    if before:
        if mode == "edge":
            parts += [fn.slice(img, start=[0], shape=[1], axes=[axis], device=device)] * before
        else:
            head = fn.slice(img, start=[skip], shape=[before], axes=[axis], device=device)
            parts.append(fn.flip(head, device=device, **turn))
    parts.append(img)
    if after:
        turned = fn.flip(img, device=device, **turn)  # its first pixels are the image's last, in reverse
        if mode == "edge":
            parts += [fn.slice(turned, start=[0], shape=[1], axes=[axis], device=device)] * after
        else:
            parts.append(fn.slice(turned, start=[skip], shape=[after], axes=[axis], device=device))
    return fn.cat(*parts, axis=axis, device=device)


def pad_window(img: Any, corner: Any, shape: Any, *, pc: PadCrop, pads: tuple[int, int, int, int], device: str) -> Any:
    """The window ``shape`` ``(w, h)`` at ``corner`` ``(x, y)`` (:func:`pad_crop_params`) of the padded HWC uint8 ``img``.

    ``constant``: pixels outside the image are ``fill`` (``slice``'s ``out_of_bounds_policy="pad"``);
    other modes: the image is first extended by ``pads`` (:func:`static_pads`).
    """
    from ..pipeline import import_dali

    _, fn, _ = import_dali()
    if pc.mode != "constant":
        left, top, right, bottom = pads
        img = _extend(img, 1, left, right, pc.mode, device)
        img = _extend(img, 0, top, bottom, pc.mode, device)
    return fn.slice(
        img, corner, shape, normalized_anchor=False, normalized_shape=False,
        out_of_bounds_policy="pad", fill_values=list(pc.fill), device=device,
    )  # fmt: skip


def host_window(rgb: np.ndarray, corner: np.ndarray, *, pc: PadCrop, crop: int) -> np.ndarray:
    """:func:`pad_window` of one HWC uint8 image on the host (``np.pad``'s modes are torchvision's), for ``loader.dataset[i]``."""
    x, y = int(corner[0]), int(corner[1])
    h, w = rgb.shape[:2]
    if pc.mode == "constant":
        out = np.empty((crop, crop, rgb.shape[2]), dtype=np.uint8)
        out[:] = np.asarray(pc.fill[: rgb.shape[2]], dtype=np.uint8)
        x0, x1, y0, y1 = max(x, 0), min(x + crop, w), max(y, 0), min(y + crop, h)
        if x0 < x1 and y0 < y1:
            out[y0 - y : y1 - y, x0 - x : x1 - x] = rgb[y0:y1, x0:x1]
        return out
    lx, ty, pw, ph = (int(v[0]) for v in _sides(pc, crop, np.array([w]), np.array([h])))
    padded = np.pad(rgb, ((ty, ph - h - ty), (lx, pw - w - lx), (0, 0)), mode=pc.mode)
    return padded[y : y + crop, x : x + crop]
