"""The segmentation reference's joint transforms (and its COCO-to-mask steps), drawn from seeded uniforms and applied with the classes' own kernels.

:mod:`fastload.detaug` reads a dataset's ``transforms`` into steps; this module adds what
torchvision's ``references/segmentation`` uses (``SegmentationPresetTrain``/``Eval``, both forms):

* torchvision v2's ``RandomResize`` and ``RandomCrop`` (any ``padding``, ``pad_if_needed``,
  ``fill``): the parameters their ``make_params`` would give, drawn here, applied by the class's
  own ``transform(inpt, params)``;
* the reference's own ``transforms.py`` classes, plain objects recognised by name and the
  attributes they carry: ``RandomResize`` (``min_size``, ``max_size``: ``random.randint``'s
  inclusive bounds), ``RandomHorizontalFlip`` (``flip_prob``), ``RandomCrop`` (``size``: the image
  padded with 0 and the mask with 255 on the bottom/right when smaller, then a crop placed as
  ``transforms.RandomCrop.get_params`` places it), ``CenterCrop``, ``PILToTensor``, ``ToTensor``,
  ``ConvertImageDtype``, ``ToDtype``, ``Normalize``; its ``v2_extras.PadIfSmaller`` and
  ``CocoDetectionToVOCSegmentation``; its ``coco_utils`` ``FilterAndRemapCocoCategories`` and
  ``ConvertCocoPolysToMask`` (pycocotools' polygon decoding, overlaps marked 255).

Where the detection reference has a class of the same name (``RandomHorizontalFlip``,
``PILToTensor``, ``ToDtype``, ``ConvertImageDtype``), the attributes decide: the detection
reference's are ``nn.Module``\\ s (its flip carries ``p``), the segmentation reference's plain
objects (its flip carries ``flip_prob``). Draws are keyed by ``(seed, epoch, position)`` of the step.
"""

from __future__ import annotations

import copy
import numbers
from typing import Any, Callable

import numpy as np

from .augment import uniforms
from .detaug import Step

__all__ = ["SEG_CLASSES", "SEG_DRAWS", "V2_EXTRAS", "V2_KINDS", "apply", "draw", "seg_step", "v2_params"]

#: The segmentation reference's own classes (``transforms.py``, ``coco_utils.py``), by name: the attributes each carries.
SEG_CLASSES = {
    "RandomResize": ("min_size", "max_size"),
    "RandomHorizontalFlip": ("flip_prob",),
    "RandomCrop": ("size",),
    "CenterCrop": ("size",),
    "PILToTensor": (),
    "ToTensor": (),
    "ConvertImageDtype": ("dtype",),
    "ToDtype": ("dtype", "scale"),
    "Normalize": ("mean", "std"),
    "FilterAndRemapCocoCategories": ("categories", "remap"),
    "ConvertCocoPolysToMask": (),
}
#: The reference's ``v2_extras`` classes (torchvision v2 ``Transform`` subclasses), by name: their attributes.
V2_EXTRAS = {"PadIfSmaller": ("size", "fill"), "CocoDetectionToVOCSegmentation": ("COCO_TO_VOC_LABEL_MAP", "INVALID_VALUE")}
#: Names the detection reference also uses: its classes are ``nn.Module``\ s.
SHARED = frozenset({"RandomHorizontalFlip", "PILToTensor", "ToDtype", "ConvertImageDtype"})
#: torchvision v2 random classes this module translates, by name: the step's kind.
V2_KINDS = {"RandomResize": "resize", "RandomCrop": "crop"}
_KIND = {"RandomResize": "seg_resize", "RandomHorizontalFlip": "seg_flip", "RandomCrop": "seg_crop", "CenterCrop": "seg_center",
         "PILToTensor": "seg_piltotensor", "ToTensor": "seg_totensor", "ConvertImageDtype": "seg_convertdtype",
         "ToDtype": "seg_todtype", "Normalize": "seg_normalize", "FilterAndRemapCocoCategories": "seg_filtercats",
         "ConvertCocoPolysToMask": "seg_polystomask", "PadIfSmaller": "seg_padifsmaller",
         "CocoDetectionToVOCSegmentation": "seg_cocotovoc"}  # fmt: skip
#: Uniforms each kind draws per item.
SEG_DRAWS = {"seg_resize": 1, "seg_flip": 1, "seg_crop": 2, "resize": 1, "crop": 2}


def _is_int(x: Any) -> bool:
    return isinstance(x, numbers.Integral) and not isinstance(x, bool)


def _values_unreadable(t: Any, name: str) -> str | None:
    """Why the values ``t`` carries are not what the reference's ``name`` holds (None: they are)."""
    import torch

    if name == "RandomResize" and not (_is_int(t.min_size) and _is_int(t.max_size) and t.min_size <= t.max_size):
        return "its min_size and max_size are not integers with min_size <= max_size (random.randint's bounds)"
    if name == "RandomHorizontalFlip" and not isinstance(t.flip_prob, numbers.Real):
        return "its flip_prob is not a number"
    if name in ("RandomCrop", "PadIfSmaller") and not (_is_int(t.size) and t.size > 0):
        return "its size is not a positive integer (the reference's crops are square)"
    if name in ("ToDtype", "ConvertImageDtype") and not isinstance(t.dtype, torch.dtype):
        return "its dtype is not a torch.dtype"
    if name == "FilterAndRemapCocoCategories" and not isinstance(t.categories, (list, tuple)):
        return "its categories are not a list"
    if name == "CocoDetectionToVOCSegmentation" and not isinstance(t.COCO_TO_VOC_LABEL_MAP, dict):
        return "its COCO_TO_VOC_LABEL_MAP is not a dict"
    return None


def seg_step(t: Any, joint: bool) -> Step | str | None:
    """The :class:`fastload.detaug.Step` ``t`` is as a segmentation-reference class, why it cannot be
    read as one (a string), or None when it is not one (the detection reference's, or another)."""
    import torch

    name = type(t).__name__
    if type(t).__module__.startswith("torchvision.") or (name not in SEG_CLASSES and name not in V2_EXTRAS):
        return None
    if name in V2_EXTRAS:
        from torchvision.transforms import v2

        if not isinstance(t, v2.Transform):
            return f"not a torchvision v2 Transform, as the segmentation reference's v2_extras.{name} is"
        attrs = V2_EXTRAS[name]
    else:
        if name in SHARED and isinstance(t, torch.nn.Module) and not hasattr(t, "flip_prob"):
            return None  # the detection reference's (an nn.Module): fastload.detaug reads it
        if name == "RandomHorizontalFlip" and not hasattr(t, "flip_prob"):
            return "it carries neither flip_prob (the segmentation reference's) nor is it an nn.Module with p (the detection reference's)"
        attrs = SEG_CLASSES[name]
    if not joint:
        return "the references' classes take (image, target): give it as the dataset's transforms="
    missing = [a for a in attrs if not hasattr(t, a)]
    if missing:
        return f"it carries no {', '.join(missing)} (the segmentation reference's {name} does)"
    why = _values_unreadable(t, name)
    return why if why is not None else Step(t, "seg", _KIND[name])


# ============================================================================ the draws


def _integer(u: float, lo: int, hi: int) -> int:
    """A uniform integer in [lo, hi] from ``u`` in [0, 1)."""
    return lo + min(int(u * (hi - lo + 1)), hi - lo)


def _hw(image: Any) -> tuple[int, int]:
    from torchvision.transforms import functional as F1

    _, h, w = F1.get_dimensions(image)
    return int(h), int(w)


def _padded(image: Any, size: int) -> tuple[int, int]:
    """The image's (height, width) after the reference's ``pad_if_smaller(image, size)``."""
    h, w = _hw(image)
    return (max(h, size), max(w, size)) if min(h, w) < size else (h, w)


def draw(step: Step, image: Any, *, seed: int, epoch: int, position: int) -> Any:
    """The reference class's parameters for one item: ``seg_resize`` the shorter side (``random.randint``'s
    law), ``seg_flip`` whether it flips (None: not), ``seg_crop`` (top, left) on the padded image."""
    t, kind = step.obj, step.kind
    u = uniforms(seed, epoch, np.array([position]), SEG_DRAWS[kind])[0]
    if kind == "seg_resize":
        return _integer(u[0], int(t.min_size), int(t.max_size))
    if kind == "seg_flip":
        return True if u[0] < float(t.flip_prob) else None
    h, w = _padded(image, int(t.size))  # seg_crop: get_params' torch.randint(0, h - size + 1), then the width's
    return _integer(u[0], 0, h - int(t.size)), _integer(u[1], 0, w - int(t.size))


def v2_params(step: Step, image: Any, *, seed: int, epoch: int, position: int) -> dict[str, Any]:
    """The parameters the v2 class's ``make_params`` would give (``image`` gives the sample's size)."""
    t, kind = step.obj, step.kind
    u = uniforms(seed, epoch, np.array([position]), SEG_DRAWS[kind])[0]
    if kind == "resize":  # torch.randint(min_size, max_size): the upper bound excluded
        return {"size": [_integer(u[0], int(t.min_size), int(t.max_size) - 1)]}
    from torchvision.transforms.v2 import functional as F2

    h, w = (int(x) for x in F2.get_size(image))
    left, right, top, bottom = (int(x) for x in t.padding) if t.padding is not None else (0, 0, 0, 0)
    h, w = h + top + bottom, w + left + right
    ch, cw = (int(x) for x in t.size)
    if t.pad_if_needed and h < ch:
        top, bottom, h = top + ch - h, bottom + ch - h, h + 2 * (ch - h)
    if t.pad_if_needed and w < cw:
        left, right, w = left + cw - w, right + cw - w, w + 2 * (cw - w)
    if h < ch or w < cw:
        raise ValueError(f"Required crop size {(ch, cw)} is larger than input image size {(h, w)}.")
    y = _integer(u[0], 0, h - ch) if h > ch else 0
    x = _integer(u[1], 0, w - cw) if w > cw else 0
    padding = [left, top, right, bottom]
    return {"needs_crop": h > ch or w > cw, "top": y, "left": x, "height": ch, "width": cw, "needs_pad": any(padding), "padding": padding}


# ============================================================================ applying them


def _resize(t: Any, image: Any, target: Any, size: Any) -> tuple[Any, Any]:
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F1

    return F1.resize(image, size), F1.resize(target, size, interpolation=InterpolationMode.NEAREST)


def _flip(t: Any, image: Any, target: Any, flip: Any) -> tuple[Any, Any]:
    from torchvision.transforms import functional as F1

    return (F1.hflip(image), F1.hflip(target)) if flip else (image, target)


def _pad_if_smaller(x: Any, size: int, fill: int) -> Any:
    """The reference's ``pad_if_smaller``: the bottom and right padded to ``size`` when the shorter side is below it."""
    from torchvision.transforms import functional as F1

    h, w = _hw(x)
    if min(h, w) >= size:
        return x
    return F1.pad(x, [0, 0, max(size - w, 0), max(size - h, 0)], fill=fill)


def _crop(t: Any, image: Any, target: Any, where: Any) -> tuple[Any, Any]:
    from torchvision.transforms import functional as F1

    from PIL import Image

    if not isinstance(image, Image.Image):  # the reference's pad_if_smaller reads min(img.size): PIL images only
        raise TypeError(f"the segmentation reference's RandomCrop pads PIL images only (its pad_if_smaller reads img.size), got {type(image).__name__}")
    size = int(t.size)
    image, target = _pad_if_smaller(image, size, 0), _pad_if_smaller(target, size, 255)
    top, left = where
    return F1.crop(image, top, left, size, size), F1.crop(target, top, left, size, size)


def _center(t: Any, image: Any, target: Any, _: Any) -> tuple[Any, Any]:
    from torchvision.transforms import functional as F1

    return F1.center_crop(image, t.size), F1.center_crop(target, t.size)


def _convert(t: Any, image: Any, target: Any, _: Any) -> tuple[Any, Any]:
    """``PILToTensor``, ``ToTensor``, ``ConvertImageDtype`` (the mask made int64), ``ToDtype``, ``Normalize``."""
    import torch
    from torchvision.transforms import functional as F1

    name = type(t).__name__
    if name == "PILToTensor":
        return F1.pil_to_tensor(image), torch.as_tensor(np.array(target), dtype=torch.int64)
    if name == "ToTensor":
        return F1.to_tensor(image), torch.as_tensor(np.asarray(target), dtype=torch.int64)
    if name == "ConvertImageDtype":
        return F1.convert_image_dtype(image, t.dtype), torch.as_tensor(target, dtype=torch.int64)
    if name == "ToDtype":
        return (F1.convert_image_dtype(image, t.dtype) if t.scale else image.to(dtype=t.dtype)), target
    return F1.normalize(image, mean=t.mean, std=t.std), target


def _filter_categories(t: Any, image: Any, anns: Any, _: Any) -> tuple[Any, Any]:
    anns = [a for a in anns if a["category_id"] in t.categories]
    if not t.remap:
        return image, anns
    anns = copy.deepcopy(anns)
    for a in anns:
        a["category_id"] = t.categories.index(a["category_id"])
    return image, anns


def _polys_to_mask(t: Any, image: Any, anns: Any, _: Any) -> tuple[Any, Any]:
    """``ConvertCocoPolysToMask``: each annotation's polygons (or RLE) decoded by pycocotools, the masks
    merged by the largest category id, pixels of two or more annotations marked 255."""
    import torch
    from PIL import Image
    from pycocotools import mask as coco_mask

    w, h = image.size
    if not anns:
        return image, Image.fromarray(torch.zeros((h, w), dtype=torch.uint8).numpy())
    masks = []
    for a in anns:
        m = coco_mask.decode(coco_mask.frPyObjects(a["segmentation"], h, w))
        m = m[..., None] if m.ndim < 3 else m
        masks.append(torch.as_tensor(m, dtype=torch.uint8).any(dim=2))
    stacked = torch.stack(masks, dim=0)
    cats = torch.as_tensor([a["category_id"] for a in anns], dtype=stacked.dtype)
    merged, _ = (stacked * cats[:, None, None]).max(dim=0)
    merged[stacked.sum(0) > 1] = 255
    return image, Image.fromarray(merged.numpy())


def _coco_to_voc(t: Any, image: Any, target: Any, _: Any) -> tuple[Any, Any]:
    """``v2_extras.CocoDetectionToVOCSegmentation``: the v2-wrapped COCO masks of the mapped categories merged, overlaps invalid."""
    import torch
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F2

    merged = None
    if "masks" in target:
        kept = [(i, t.COCO_TO_VOC_LABEL_MAP[c]) for i, c in enumerate(target["labels"].tolist()) if c in t.COCO_TO_VOC_LABEL_MAP]
        if kept:
            masks = target["masks"][[i for i, _ in kept]].to(torch.uint8)
            labels = torch.tensor([v for _, v in kept], dtype=torch.uint8)
            merged, _ = (masks * labels.reshape(-1, 1, 1)).max(dim=0)
            merged[masks.sum(dim=0) > 1] = t.INVALID_VALUE
    if merged is None:
        merged = torch.zeros(F2.get_size(image), dtype=torch.uint8)
    return image, tv_tensors.Mask(merged)


def _pad_v2(t: Any, inputs: Any) -> Any:
    """``v2_extras.PadIfSmaller``: each input its ``forward`` transforms padded on the bottom/right to ``size``,
    with its type's fill (``fill[type]``, else ``fill["others"]``)."""
    from torch.utils._pytree import tree_flatten, tree_unflatten
    from torchvision.transforms.v2 import functional as F2

    flat, spec = tree_flatten(inputs)
    needs = t._needs_transform_list(flat)
    image = next((x for x, n in zip(flat, needs) if n), flat[0])
    h, w = (int(x) for x in F2.get_size(image))
    padding = [0, 0, max(int(t.size) - w, 0), max(int(t.size) - h, 0)]
    if not any(padding):
        return inputs
    fills = t.fill if isinstance(t.fill, dict) else {"others": t.fill}
    out = []
    for x, n in zip(flat, needs):
        fill = fills[type(x)] if type(x) in fills else fills.get("others")
        fill = fill if fill is None or isinstance(fill, (int, float)) else [float(v) for v in fill]
        out.append(F2.pad(x, padding=padding, fill=fill) if n else x)
    return tree_unflatten(out, spec)


_APPLY: dict[str, Callable[[Any, Any, Any, Any], tuple[Any, Any]]] = {
    "seg_resize": _resize, "seg_flip": _flip, "seg_crop": _crop, "seg_center": _center, "seg_piltotensor": _convert,
    "seg_totensor": _convert, "seg_convertdtype": _convert, "seg_todtype": _convert, "seg_normalize": _convert,
    "seg_filtercats": _filter_categories, "seg_polystomask": _polys_to_mask, "seg_cocotovoc": _coco_to_voc,
}  # fmt: skip


def apply(step: Step, image: Any, target: Any, *, seed: int, epoch: int, position: int) -> tuple[Any, Any]:
    """One segmentation-reference step on one item (its draws from ``seed``, the step's own)."""
    if step.kind == "seg_padifsmaller":
        return _pad_v2(step.obj, (image, target))
    got = draw(step, image, seed=seed, epoch=epoch, position=position) if step.kind in SEG_DRAWS else None
    return _APPLY[step.kind](step.obj, image, target, got)
