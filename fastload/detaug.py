"""The detection references' random joint transforms, drawn from seeded uniforms and applied with the classes' own kernels.

A COCO/VOC dataset's ``transforms`` (``DetectionPresetTrain`` of torchvision's detection
reference, in either form) is read into a :class:`Program`: each step is one of

* a torchvision v2 class run as it is (deterministic: ``ToImage``, ``ToDtype``,
  ``SanitizeBoundingBoxes``, ``ConvertBoundingBoxFormat``, ``ToPureTensor``, ...);
* a v2 random class (``RandomHorizontalFlip``, ``RandomPhotometricDistort``, ``RandomZoomOut``,
  ``RandomIoUCrop``, ``ScaleJitter``, ``RandomShortestSize``): its parameters are drawn here,
  following the class's own ``make_params`` law, and applied by the class's own
  ``transform(inpt, params)`` to each input its ``forward`` would transform;
* a class of the references' own ``transforms.py`` (a user module), recognised by its name and
  the attributes it carries (``RandomHorizontalFlip``, ``RandomPhotometricDistort``,
  ``RandomZoomOut``, ``RandomIoUCrop``, ``ScaleJitter``, ``FixedSizeCrop``,
  ``RandomShortestSize``, ``PILToTensor``, ``ToDtype``, ``ConvertImageDtype``): its draws
  follow its ``forward``'s law and its ``forward`` is replayed with those values, call by call
  (``torchvision.transforms.functional`` on the image, the same tensor operations on the target).
* a class of the segmentation reference (``SegmentationPresetTrain``/``Eval``, its
  ``transforms.py``, ``v2_extras.py`` and ``coco_utils.py``) or torchvision v2's ``RandomResize`` /
  ``RandomCrop``: read, drawn and applied by :mod:`fastload.segaug`.

Every draw of step ``k`` of item ``position`` in ``epoch`` is a pure function of
``(seed, epoch, position, k)`` (:func:`fastload.augment.uniforms`; ``RandomIoUCrop``'s window
through :func:`fastload.boxcrops.iou_window`), so the items do not depend on which thread builds
them, nor on the order in which they are built. Anything else is refused by name.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from .augment import uniforms
from .boxcrops import CropSpec, iou_window
from .errors import ConfigError

__all__ = ["DRAWS", "Program", "Step", "V1_CLASSES", "V2_RANDOM", "V2_RUN", "draw", "program", "step_seed", "v2_params"]

#: torchvision v2 classes run as they are (deterministic), by name.
V2_RUN = frozenset({
    "ToImage", "ToDtype", "PILToTensor", "ToPureTensor", "ConvertImageDtype", "ToTensor", "Identity",
    "SanitizeBoundingBoxes", "ConvertBoundingBoxFormat", "ClampBoundingBoxes", "Normalize", "Resize", "CenterCrop",
})  # fmt: skip
#: torchvision v2 random classes translated, by name: the step's kind.
V2_RANDOM = {"RandomHorizontalFlip": "flip", "RandomPhotometricDistort": "photometric", "RandomZoomOut": "zoomout",
             "RandomIoUCrop": "ioucrop", "ScaleJitter": "scalejitter", "RandomShortestSize": "shortest",
             "RandomResize": "resize", "RandomCrop": "crop"}  # fmt: skip
#: The references' own classes (``references/detection/transforms.py``), by name: the attributes each carries.
V1_CLASSES = {
    "RandomHorizontalFlip": ("p",),
    "RandomPhotometricDistort": ("_brightness", "_contrast", "_saturation", "_hue", "p"),
    "RandomZoomOut": ("fill", "side_range", "p"),
    "RandomIoUCrop": ("min_scale", "max_scale", "min_aspect_ratio", "max_aspect_ratio", "options", "trials"),
    "ScaleJitter": ("target_size", "scale_range", "interpolation"),
    "FixedSizeCrop": ("crop_height", "crop_width", "fill", "padding_mode"),
    "RandomShortestSize": ("min_size", "max_size", "interpolation"),
    "PILToTensor": (),
    "ToDtype": ("dtype", "scale"),
    "ConvertImageDtype": ("dtype",),
}
_V1_KIND = {"RandomHorizontalFlip": "flip", "RandomPhotometricDistort": "photometric", "RandomZoomOut": "zoomout",
            "RandomIoUCrop": "ioucrop", "ScaleJitter": "scalejitter", "FixedSizeCrop": "fixedsizecrop",
            "RandomShortestSize": "shortest", "PILToTensor": "piltotensor", "ToDtype": "todtype",
            "ConvertImageDtype": "convertdtype"}  # fmt: skip
#: Uniforms each kind draws per item (RandomIoUCrop draws through :func:`fastload.boxcrops.iou_window`).
DRAWS = {"flip": 1, "photometric": 15, "zoomout": 4, "scalejitter": 1, "fixedsizecrop": 1, "shortest": 1}
#: Mixed with the step's place into the seed its draws come from.
STEP_SALT = 0x4F1BBCDCBFA53E0B
#: The steps translated, as a refusal lists them.
TRANSLATED = ("RandomHorizontalFlip, RandomPhotometricDistort, RandomZoomOut, RandomIoUCrop, ScaleJitter, RandomShortestSize "
              "(torchvision v2 and the detection references' own), FixedSizeCrop (the references'), RandomResize, RandomCrop "
              "(torchvision v2 and the segmentation reference's own), the segmentation reference's CenterCrop, Normalize, "
              "PadIfSmaller, CocoDetectionToVOCSegmentation, FilterAndRemapCocoCategories, ConvertCocoPolysToMask")  # fmt: skip


def step_seed(seed: int, k: int) -> int:
    """The seed step ``k``'s draws come from: ``seed`` mixed with the step's place."""
    return (int(seed) ^ ((STEP_SALT * (k + 1)) & 0xFFFFFFFFFFFFFFFF)) & 0xFFFFFFFFFFFFFFFF


@dataclasses.dataclass(frozen=True)
class Step:
    """One step: ``how`` is ``"run"`` (the object, as it is), ``"v2"``, ``"v1"`` or ``"seg"`` (:mod:`fastload.segaug`); ``kind`` what it does."""

    obj: Any
    how: str
    kind: str


# ============================================================================ reading the transforms


def _v2_module() -> Any:
    from torchvision.transforms import v2

    return v2


def _is_tv(t: Any) -> bool:
    return type(t).__module__.startswith("torchvision.")


def _opened(t: Any, joint: bool, depth: int = 0) -> list[Any]:
    """The steps of the Composes opened: torchvision v2's; for a joint transform the references' ``Compose``
    and ``DetectionPresetTrain``/``Eval`` (whose call is ``self.transforms(image, target)``); for an image
    transform torchvision v1's."""
    if depth > 50:
        raise ConfigError("transforms: Compose nested more than 50 deep")
    name, mod = type(t).__name__, type(t).__module__
    if name == "Compose" and isinstance(getattr(t, "transforms", None), (list, tuple)):
        v1 = mod.startswith("torchvision.transforms") and not mod.startswith("torchvision.transforms.v2")
        if mod.startswith("torchvision.transforms.v2") or (v1 and not joint) or (joint and not _is_tv(t)):
            return [s for x in t.transforms for s in _opened(x, joint, depth + 1)]
    presets = ("DetectionPresetTrain", "DetectionPresetEval", "SegmentationPresetTrain", "SegmentationPresetEval")
    if joint and name in presets and not _is_tv(t) and callable(getattr(t, "transforms", None)):
        return _opened(t.transforms, joint, depth + 1)
    return [t]


def _v1_unreadable(t: Any) -> str | None:
    """Why ``t``, named as one of the references' classes, cannot be read (None: it can)."""
    import torch

    name = type(t).__name__
    if not isinstance(t, torch.nn.Module):
        return "not an nn.Module as the references' classes are"
    missing = [a for a in V1_CLASSES[name] if not hasattr(t, a)]
    if missing:
        return f"it carries no {', '.join(missing)} (the references' {name} does)"
    if name == "RandomPhotometricDistort":
        parts = {"_brightness": "brightness", "_contrast": "contrast", "_saturation": "saturation", "_hue": "hue"}
        for attr, part in parts.items():
            jitter = getattr(t, attr)
            rng = getattr(jitter, part, None)
            if type(jitter).__name__ != "ColorJitter" or not _is_tv(jitter) or rng is None or len(rng) != 2:
                return f"its {attr} is not a torchvision ColorJitter with a {part} range"
    if name == "RandomIoUCrop" and (not len(t.options) or int(t.trials) < 1):
        return "its options are empty or its trials below 1"
    return None


def _step(t: Any, joint: bool) -> Step | str:
    """The :class:`Step` ``t`` is, or why it is not one."""
    import torch

    from .segaug import seg_step

    name = type(t).__name__
    seg = seg_step(t, joint)
    if seg is not None:  # the segmentation reference's (by name and attributes), or why it cannot be read as one
        return seg
    if _is_tv(t):
        v2 = _v2_module()
        if getattr(v2, name, None) is type(t):
            if name in V2_RUN:
                return Step(t, "run", name)
            if name in V2_RANDOM:
                if not callable(getattr(t, "_needs_transform_list", None)):
                    return "this torchvision's v2 transforms do not say which inputs they transform"
                return Step(t, "v2", V2_RANDOM[name])
        if isinstance(t, torch.nn.Identity):
            return Step(t, "run", "Identity")
        if not joint and name in ("ToTensor", "PILToTensor", "ConvertImageDtype") and type(t).__module__ == "torchvision.transforms.transforms":
            return Step(t, "run", name)
        return "a step FastLoader neither runs nor translates"
    if name in V1_CLASSES:
        if not joint:
            return "the references' classes take (image, target): give it as the dataset's transforms="
        why = _v1_unreadable(t)
        return why if why is not None else Step(t, "v1", _V1_KIND[name])
    return "a step FastLoader neither runs nor translates"


def program(t: Any, *, joint: bool, where: str, kind: str, route: str) -> "Program | None":
    """The :class:`Program` running ``t`` (None when ``t`` is None).

    Raises:
        ConfigError: the first step that is not translated, its place, why, and ``route``.
    """
    from .annotated import shown

    if t is None:
        return None
    steps = _opened(t, joint)
    out = []
    for k, s in enumerate(steps):
        got = _step(s, joint)
        if isinstance(got, str):
            raise ConfigError(
                f"{where}: step {k + 1} of {len(steps)}, {shown(s)}, is not run by FastLoader on a {kind} ({got}; it runs the "
                f"deterministic conversions ToImage, ToDtype, PILToTensor, ToTensor, ConvertImageDtype, ToPureTensor, "
                f"ConvertBoundingBoxFormat, SanitizeBoundingBoxes, Normalize, Resize, CenterCrop as they are and translates {TRANSLATED}); {route}"
            )
        out.append(got)
    return Program(out, joint)


# ============================================================================ the draws


def _f32(x: float) -> np.float32:
    return np.float32(x)


def _u32(u: float) -> np.float32:
    """``u`` on ``torch.rand``'s float32 lattice (multiples of 2**-24), so float32 arithmetic follows torch's."""
    return np.float32(math.floor(u * (1 << 24)) / (1 << 24))


def _size(image: Any) -> tuple[int, int, int]:
    """(channels, height, width) of an image, as ``torchvision.transforms.functional.get_dimensions``."""
    from torchvision.transforms import functional as F1

    c, h, w = F1.get_dimensions(image)
    return int(c), int(h), int(w)


def _ranges(step: Step) -> list[tuple[str, tuple[float, float]]]:
    t = step.obj
    if step.how == "v2":
        return [(p, tuple(getattr(t, p))) for p in ("brightness", "contrast", "saturation", "hue")]
    return [(p, tuple(getattr(getattr(t, "_" + p), p))) for p in ("brightness", "contrast", "saturation", "hue")]


def _photometric(step: Step, u: np.ndarray, channels: int) -> dict[str, Any]:
    """``RandomPhotometricDistort``'s draws: each part gated by ``p`` with its factor uniform in its range (a
    float32 value, as torch draws it), the contrast before or after (1/2), a channel permutation gated by ``p``."""
    import torch

    p = float(step.obj.p)
    out: dict[str, Any] = {}
    for k, (part, (lo, hi)) in enumerate(_ranges(step)):  # gates u[0], u[2], u[3], u[4]; factors u[7:11]
        out[part] = float(_f32(lo + u[7 + k] * (hi - lo))) if u[(0, 2, 3, 4)[k]] < p else None
    out["contrast_before"] = bool(u[1] < 0.5)
    if channels > 4:
        raise ValueError(f"RandomPhotometricDistort: an image of {channels} channels (FastLoader draws permutations of at most 4)")
    out["perm"] = torch.from_numpy(np.argsort(u[11 : 11 + channels], kind="stable")) if u[6] < p else None
    return out


def _boxes_xyxy(step: Step, target: Any, flat: list[Any] | None) -> np.ndarray:
    """The boxes ``RandomIoUCrop`` reads, XYXY, as float64."""
    import torch

    if step.how == "v1":
        return target["boxes"].detach().to("cpu", torch.float64).numpy()
    from torchvision import tv_tensors
    from torchvision.transforms.v2 import functional as F2

    b = next(x for x in flat if isinstance(x, tv_tensors.BoundingBoxes))
    xyxy = F2.convert_bounding_box_format(b.as_subclass(torch.Tensor), b.format, tv_tensors.BoundingBoxFormat.XYXY)
    return xyxy.to(torch.float64).numpy().reshape(-1, 4)


def draw(step: Step, image: Any, target: Any, *, seed: int, epoch: int, position: int, flat: list[Any] | None = None) -> Any:
    """Step ``step``'s parameters for one item (None: the step leaves it as it is), following the class's law.

    ``seed`` is the step's own (:func:`step_seed`); ``flat`` the v2 step's inputs (for the boxes).
    """
    t, kind = step.obj, step.kind
    u = uniforms(seed, epoch, np.array([position]), DRAWS[kind])[0] if kind in DRAWS else None
    if kind == "flip":
        return bool(u[0] < float(t.p)) or None
    c, h, w = _size(image)
    if kind == "photometric":
        return _photometric(step, u, c)
    if kind == "zoomout":
        if not u[0] < float(t.p):
            return None
        lo, hi = (float(x) for x in t.side_range)
        r = _f32(lo) + _u32(u[1]) * _f32(hi - lo)
        cw, ch = int(_f32(w) * r), int(_f32(h) * r)
        left, top = int(_f32(cw - w) * _u32(u[2])), int(_f32(ch - h) * _u32(u[3]))
        return [left, top, cw - (left + w), ch - (top + h)]
    if kind == "ioucrop":
        spec = CropSpec("iou", (float(t.min_scale), float(t.max_scale)), (float(t.min_aspect_ratio), float(t.max_aspect_ratio)),
                        tuple(float(o) for o in t.options), int(t.trials))  # fmt: skip
        win = iou_window(spec, _boxes_xyxy(step, target, flat), h, w, seed=seed, epoch=epoch, index=position)
        return None if win is None else (win.top, win.left, win.height, win.width)
    if kind == "scalejitter":
        lo, hi = (float(x) for x in t.scale_range)
        scale = _f32(lo) + _u32(u[0]) * _f32(hi - lo)
        r = _f32(min(t.target_size[1] / h, t.target_size[0] / w)) * scale
        return int(_f32(h) * r), int(_f32(w) * r)
    if kind == "fixedsizecrop":
        return _u32(u[0])
    if kind == "shortest":
        sizes = list(t.min_size)
        m = sizes[min(int(u[0] * len(sizes)), len(sizes) - 1)]
        r = m / min(h, w)
        if t.max_size is not None:
            r = min(r, t.max_size / max(h, w))
        return int(h * r), int(w * r)
    return None


# ============================================================================ applying them


def v2_params(step: Step, flat: list[Any], needs: list[bool], *, seed: int, epoch: int, position: int) -> dict[str, Any] | None:
    """The parameters the v2 class's ``make_params`` would give for these inputs, drawn here (None: a
    ``_RandomApplyTransform``'s gate left the inputs as they came)."""
    import torch

    kind = step.kind
    chosen = [x for x, n in zip(flat, needs) if n]
    image = next((x for x in chosen if not _is_box_or_mask(x)), chosen[0] if chosen else None)
    if kind in ("resize", "crop"):
        from .segaug import v2_params as seg_params

        return seg_params(step, image if image is not None else flat[0], seed=seed, epoch=epoch, position=position)
    got = draw(step, image, None, seed=seed, epoch=epoch, position=position, flat=flat)
    if kind in ("flip", "zoomout"):
        return None if got is None else ({} if kind == "flip" else {"padding": got})
    if kind == "photometric":
        params = {f"{k}_factor": got[k] for k in ("brightness", "contrast", "saturation", "hue")}
        params["contrast_before"], params["channel_permutation"] = got["contrast_before"], got["perm"]
        return params
    if kind == "ioucrop":
        if got is None:
            return {}
        top, left, h, w = got
        b = torch.from_numpy(_boxes_xyxy(step, None, flat)).to(next(x for x in flat if _is_box(x)).dtype)
        cx, cy = 0.5 * (b[..., 0] + b[..., 2]), 0.5 * (b[..., 1] + b[..., 3])
        within = (left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)
        return {"top": top, "left": left, "height": h, "width": w, "is_within_crop_area": within}
    return {"size": got}  # scalejitter, shortest


def _v2_apply(step: Step, inputs: Any, *, seed: int, epoch: int, position: int) -> Any:
    """The v2 class's ``forward`` with the parameters drawn here: its ``check_inputs``, its choice of the
    inputs to transform, its ``transform(inpt, params)`` on each of them."""
    from torch.utils._pytree import tree_flatten, tree_unflatten

    t = step.obj
    flat, spec = tree_flatten(inputs)
    t.check_inputs(flat)
    needs = t._needs_transform_list(flat)
    params = v2_params(step, flat, needs, seed=seed, epoch=epoch, position=position)
    if params is None:
        return inputs
    return tree_unflatten([t.transform(x, params) if n else x for x, n in zip(flat, needs)], spec)


def _is_box(x: Any) -> bool:
    from torchvision import tv_tensors

    return isinstance(x, tv_tensors.BoundingBoxes)


def _is_box_or_mask(x: Any) -> bool:
    from torchvision import tv_tensors

    kinds = (tv_tensors.BoundingBoxes, tv_tensors.Mask, getattr(tv_tensors, "KeyPoints", tv_tensors.Mask))
    return isinstance(x, kinds)


#: COCO person keypoints' left/right pairs swapped by a horizontal flip (the references' own table).
_FLIP_KEYPOINTS = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]


def _v1_flip(t: Any, image: Any, target: Any, flip: Any) -> tuple[Any, Any]:
    from torchvision.transforms import functional as F1

    if flip is None:
        return image, target
    image = F1.hflip(image)
    if target is not None:
        width = F1.get_dimensions(image)[2]
        target["boxes"][:, [0, 2]] = width - target["boxes"][:, [2, 0]]
        if "masks" in target:
            target["masks"] = target["masks"].flip(-1)
        if "keypoints" in target:
            kps = target["keypoints"][:, _FLIP_KEYPOINTS]
            kps[..., 0] = width - kps[..., 0]
            kps[kps[..., 2] == 0] = 0
            target["keypoints"] = kps
    return image, target


def _v1_photometric(t: Any, image: Any, target: Any, got: dict[str, Any]) -> tuple[Any, Any]:
    from PIL import Image as PILImage
    from torchvision.transforms import functional as F1

    if got["brightness"] is not None:
        image = F1.adjust_brightness(image, got["brightness"])
    if got["contrast"] is not None and got["contrast_before"]:
        image = F1.adjust_contrast(image, got["contrast"])
    if got["saturation"] is not None:
        image = F1.adjust_saturation(image, got["saturation"])
    if got["hue"] is not None:
        image = F1.adjust_hue(image, got["hue"])
    if got["contrast"] is not None and not got["contrast_before"]:
        image = F1.adjust_contrast(image, got["contrast"])
    if got["perm"] is not None:
        is_pil = isinstance(image, PILImage.Image)
        if is_pil:
            image = F1.convert_image_dtype(F1.pil_to_tensor(image))
        image = image[..., got["perm"], :, :]
        if is_pil:
            image = F1.to_pil_image(image)
    return image, target


def _v1_zoomout(t: Any, image: Any, target: Any, padding: Any) -> tuple[Any, Any]:
    import torch
    from PIL import Image as PILImage
    from torchvision.transforms import functional as F1

    if padding is None:
        return image, target
    left, top, _, _ = padding
    _, h, w = _size(image)
    is_pil = isinstance(image, PILImage.Image)
    image = F1.pad(image, list(padding), fill=tuple(int(x) for x in t.fill) if is_pil else 0)
    if isinstance(image, torch.Tensor):  # the references overwrite the border with the fill (pad takes integers)
        v = torch.tensor(t.fill, device=image.device, dtype=image.dtype).view(-1, 1, 1)
        image[..., :top, :] = image[..., :, :left] = image[..., (top + h) :, :] = image[..., :, (left + w) :] = v
    if target is not None:
        target["boxes"][:, 0::2] += left
        target["boxes"][:, 1::2] += top
    return image, target


def _v1_ioucrop(t: Any, image: Any, target: Any, win: Any) -> tuple[Any, Any]:
    from torchvision.transforms import functional as F1

    if win is None:
        return image, target
    top, left, h, w = win
    cx = 0.5 * (target["boxes"][:, 0] + target["boxes"][:, 2])
    cy = 0.5 * (target["boxes"][:, 1] + target["boxes"][:, 3])
    within = (left < cx) & (cx < left + w) & (top < cy) & (cy < top + h)
    target["boxes"] = target["boxes"][within]
    target["labels"] = target["labels"][within]
    target["boxes"][:, 0::2] -= left
    target["boxes"][:, 1::2] -= top
    target["boxes"][:, 0::2].clamp_(min=0, max=w)
    target["boxes"][:, 1::2].clamp_(min=0, max=h)
    return F1.crop(image, top, left, h, w), target


def _v1_resize(t: Any, image: Any, target: Any, size: Any) -> tuple[Any, Any]:
    """``ScaleJitter`` and ``RandomShortestSize`` of the references: the image, boxes and masks resized."""
    from torchvision.transforms import InterpolationMode
    from torchvision.transforms import functional as F1

    _, h, w = _size(image)
    nh, nw = size
    aa = {"antialias": t.antialias} if "antialias" in vars(t) else {}
    image = F1.resize(image, [nh, nw], interpolation=t.interpolation, **aa)
    if target is not None:
        target["boxes"][:, 0::2] *= nw / w
        target["boxes"][:, 1::2] *= nh / h
        if "masks" in target:
            target["masks"] = F1.resize(target["masks"], [nh, nw], interpolation=InterpolationMode.NEAREST, **aa)
    return image, target


def _v1_fixedsizecrop(t: Any, image: Any, target: Any, r: Any) -> tuple[Any, Any]:
    from torchvision.transforms import functional as F1

    _, h, w = _size(image)
    nh, nw = min(h, t.crop_height), min(w, t.crop_width)
    if nh != h or nw != w:
        top, left = int(_f32(max(h - t.crop_height, 0)) * r), int(_f32(max(w - t.crop_width, 0)) * r)
        image = F1.crop(image, top, left, nh, nw)
        if target is not None:
            boxes = target["boxes"]
            boxes[:, 0::2] -= left
            boxes[:, 1::2] -= top
            boxes[:, 0::2].clamp_(min=0, max=nw)
            boxes[:, 1::2].clamp_(min=0, max=nh)
            valid = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
            target["boxes"] = boxes[valid]
            target["labels"] = target["labels"][valid]
            if "masks" in target:
                target["masks"] = F1.crop(target["masks"][valid], top, left, nh, nw)
    pad_bottom, pad_right = max(t.crop_height - nh, 0), max(t.crop_width - nw, 0)
    if pad_bottom or pad_right:
        padding = [0, 0, pad_right, pad_bottom]
        image = F1.pad(image, padding, t.fill, t.padding_mode)
        if target is not None and "masks" in target:
            target["masks"] = F1.pad(target["masks"], padding, 0, "constant")
    return image, target


def _v1_convert(t: Any, image: Any, target: Any, _: Any) -> tuple[Any, Any]:
    from torchvision.transforms import functional as F1

    name = type(t).__name__
    if name == "PILToTensor":
        return F1.pil_to_tensor(image), target
    if name == "ToDtype" and not t.scale:
        return image.to(dtype=t.dtype), target
    return F1.convert_image_dtype(image, t.dtype), target


_V1_APPLY: dict[str, Callable[[Any, Any, Any, Any], tuple[Any, Any]]] = {
    "flip": _v1_flip, "photometric": _v1_photometric, "zoomout": _v1_zoomout, "ioucrop": _v1_ioucrop,
    "scalejitter": _v1_resize, "shortest": _v1_resize, "fixedsizecrop": _v1_fixedsizecrop,
    "piltotensor": _v1_convert, "todtype": _v1_convert, "convertdtype": _v1_convert,
}  # fmt: skip


class Program:
    """The steps of a dataset's transforms, run on one item with draws keyed by (seed, epoch, position, step).

    ``joint``: the steps take ``(image, target)`` (the dataset's ``transforms=``); else the image alone
    (its ``transform=``).
    """

    def __init__(self, steps: list[Step], joint: bool) -> None:
        self.steps, self.joint = steps, joint

    def __call__(self, image: Any, target: Any, *, seed: int, epoch: int, position: int) -> tuple[Any, Any]:
        for k, s in enumerate(self.steps):
            image, target = self.apply(k, s, image, target, seed=step_seed(seed, k), epoch=epoch, position=position)
        return image, target

    def apply(self, k: int, s: Step, image: Any, target: Any, *, seed: int, epoch: int, position: int) -> tuple[Any, Any]:
        """Step ``s`` (the ``k``-th) on one item, its draws from ``seed`` (the step's own)."""
        if s.how == "run":
            return s.obj(image, target) if self.joint else (s.obj(image), target)
        if s.how == "seg":
            from .segaug import apply

            return apply(s, image, target, seed=seed, epoch=epoch, position=position)
        if s.how == "v2":
            if not self.joint:
                return _v2_apply(s, image, seed=seed, epoch=epoch, position=position), target
            return _v2_apply(s, (image, target), seed=seed, epoch=epoch, position=position)
        if s.kind == "ioucrop" and target is None:
            raise ValueError("The targets can't be None for this transform.")
        got = draw(s, image, target, seed=seed, epoch=epoch, position=position) if s.kind in DRAWS or s.kind == "ioucrop" else None
        return _V1_APPLY[s.kind](s.obj, image, target, got)
