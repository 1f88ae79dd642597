"""Whether two dataset items are the same: the comparison the COCO/VOC tests make between FastLoader's items and the dataset's own."""

from __future__ import annotations

import torch
from PIL import Image


def same(a, b) -> bool:
    """Equal in type and value: PIL images (mode, size, pixels, palette), tensors and tv_tensors (dtype, shape,
    values, and a box's format and canvas size), and dicts, lists and tuples of them."""
    if isinstance(a, Image.Image) or isinstance(b, Image.Image):
        return (isinstance(a, Image.Image) and isinstance(b, Image.Image) and a.mode == b.mode and a.size == b.size
                and a.tobytes() == b.tobytes() and a.getpalette() == b.getpalette())  # fmt: skip
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        meta = all(getattr(a, k, None) == getattr(b, k, None) for k in ("format", "canvas_size"))
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a.as_subclass(torch.Tensor), b.as_subclass(torch.Tensor))) and meta
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return a == b
