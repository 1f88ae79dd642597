"""Finishing images on the host with pillow-simd and NumPy: resize, flip, normalise into batches.

The CPU training path finishes DALI's decoded crops here (faster than DALI's CPU resize),
and ``loader.dataset[i]`` processes one sample the same way.
"""

from __future__ import annotations

import numpy as np
import torch

from .augment import eval_params


def finish_crops(
    crops,
    flips: np.ndarray,
    *,
    crop: int,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
    dtype: torch.dtype,
    channels_last: bool,
) -> torch.Tensor:
    """Resize DALI's decoded CPU crops to ``crop``x``crop``, flip, normalise: one batch tensor.

    pillow-simd's SIMD bilinear resize (antialiased, the filter torchvision's PIL path
    uses) and NumPy: both single-threaded and GIL-free, so this thread never competes
    with DALI's workers through a second thread pool. DALI's buffers are read in place.
    """
    from PIL import Image

    n = len(crops)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out_dtype = torch.uint8 if mean is None else torch.float32
    images = torch.empty((n, 3, crop, crop), dtype=out_dtype, memory_format=fmt)
    dst_all = images.numpy()  # (n, 3, crop, crop) view, strided when channels_last
    if mean is not None:
        scale = np.array([1.0 / (255.0 * s) for s in std], dtype=np.float32).reshape(3, 1, 1)  # type: ignore[union-attr]
        shift = np.array([m / s for m, s in zip(mean, std)], dtype=np.float32).reshape(3, 1, 1)  # type: ignore[arg-type]
    for i in range(n):
        hwc = np.ascontiguousarray(crops[i])  # DALI's buffer, no copy
        src = Image.frombuffer("RGB", (hwc.shape[1], hwc.shape[0]), hwc, "raw", "RGB", 0, 1)
        chw = np.asarray(src.resize((crop, crop), Image.BILINEAR)).transpose(2, 0, 1)
        if flips[i]:
            chw = chw[:, :, ::-1]  # a view: the flip happens in the write below
        dst = dst_all[i]
        if mean is None:
            dst[...] = chw
        else:  # normalise while the image is still in cache
            np.multiply(chw, scale, out=dst)
            np.subtract(dst, shift, out=dst)
    return images if dtype in (torch.float32, torch.uint8) else images.to(dtype)


def eval_crop(image: np.ndarray, *, resize: int, crop: int) -> np.ndarray:
    """torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` of an HWC uint8 RGB image (bilinear, antialiased)."""
    from PIL import Image

    h, w = image.shape[:2]
    (nh, nw), (left, top) = (v.astype(int).tolist() for v in (a[0] for a in eval_params([w], [h], resize=resize, crop=crop)))
    src = Image.frombuffer("RGB", (w, h), np.ascontiguousarray(image), "raw", "RGB", 0, 1)
    out = np.asarray(src.resize((nw, nh), Image.BILINEAR))
    return out[top : top + crop, left : left + crop]


__all__ = ["finish_crops", "eval_crop"]
