"""Augmentations of a finished batch, on its device: colour jitter and grayscale, and ``RandomErasing`` rectangles.

What each image gets is decided by :mod:`fastload.augment` (pure functions of seed, epoch
and position, like the crops); here it is only carried out, on the stream the batch is
made on, with torchvision's tensor formulas (``adjust_brightness``/``contrast``/``saturation``
blends clamped to [0, 1], its grayscale weights, ``adjust_hue``).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def _gray(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(-3)


def _apply(op: int, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    if op == 0:  # brightness: blend with black
        return (f * x).clamp(0, 1)
    if op == 1:  # contrast: blend with the mean of the grayscale image
        return (f * x + (1 - f) * _gray(x).mean(dim=(-3, -2, -1), keepdim=True)).clamp(0, 1)
    if op == 2:  # saturation: blend with the grayscale image
        return (f * x + (1 - f) * _gray(x)).clamp(0, 1)
    from torchvision.transforms.functional import adjust_hue  # hue: through HSV, image by image

    return torch.stack([adjust_hue(x[j], float(f[j])) for j in range(len(x))])


def color(
    images: torch.Tensor, order: np.ndarray, factors: np.ndarray, gray: np.ndarray, *,
    mean: Sequence[float] | None, std: Sequence[float] | None,
) -> torch.Tensor:  # fmt: skip
    """Jitter (each image's parts in its own ``order``) and grayscale NCHW ``images``, in place.

    ``images`` are normalised with ``mean``/``std`` (or uint8 when they are None): the colour
    operations work on pixel values in [0, 1], as torchvision's do before ``Normalize``.
    """
    if np.isnan(factors).all() and not gray.any():
        return images
    dev = images.device
    if mean is None:
        x = images.float() / 255.0
    else:
        m = torch.tensor(mean, device=dev).view(1, 3, 1, 1)
        s = torch.tensor(std, device=dev).view(1, 3, 1, 1)
        x = images.float() * s + m
    for k in range(4):
        for op in range(4):
            sel = np.flatnonzero((order[:, k] == op) & ~np.isnan(factors[:, op]))
            if len(sel):
                idx = torch.as_tensor(sel, device=dev)
                f = torch.as_tensor(factors[sel, op], dtype=torch.float32, device=dev).view(-1, 1, 1, 1)
                x[idx] = _apply(op, x[idx], f)
    if gray.any():
        idx = torch.as_tensor(np.flatnonzero(gray), device=dev)
        x[idx] = _gray(x[idx]).expand(-1, 3, -1, -1)
    if mean is None:
        images.copy_((x * 255.0).round_().clamp_(0, 255))
    else:
        images.copy_((x - m) / s)
    return images


def erase(images: torch.Tensor, rects: np.ndarray, value: Sequence[float]) -> torch.Tensor:
    """Fill ``rects`` (``[n, 4]`` top, left, h, w; ``h == 0``: none) of NCHW ``images`` with ``value``, in place."""
    if not (rects[:, 2] > 0).any():
        return images
    fill = torch.tensor(list(value), dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    for k in np.flatnonzero(rects[:, 2] > 0).tolist():
        t, left, h, w = (int(v) for v in rects[k])
        images[k, :, t : t + h, left : left + w] = fill
    return images
