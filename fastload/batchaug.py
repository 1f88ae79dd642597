"""Augmentations of a finished batch, on its device: torchvision's ``RandomErasing`` rectangles written in place.

The rectangles are decided by :func:`fastload.augment.erase_params` (a pure function of
seed, epoch and position, like the crops); here they are only written, one slice per
erased image, on the stream the batch is made on.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import torch


def erase(images: torch.Tensor, rects: np.ndarray, value: Sequence[float]) -> torch.Tensor:
    """Fill ``rects`` (``[n, 4]`` top, left, h, w; ``h == 0``: none) of NCHW ``images`` with ``value``, in place."""
    if not (rects[:, 2] > 0).any():
        return images
    fill = torch.tensor(list(value), dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    for k in np.flatnonzero(rects[:, 2] > 0).tolist():
        t, left, h, w = (int(v) for v in rects[k])
        images[k, :, t : t + h, left : left + w] = fill
    return images
