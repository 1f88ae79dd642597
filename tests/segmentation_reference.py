"""The segmentation reference's own modules as a user has them (transforms, v2 extras, COCO helpers and presets, re-expressed for the tests).

torchvision's ``references/segmentation`` files are not installed with torchvision: a user copies
them next to ``train.py``. These classes carry the same names and attributes and draw and apply
as those files do (Python's ``random`` for the resize and the flip, ``transforms.RandomCrop.get_params``
for the crop, the same functional calls on the image and the mask), so the tests can hand
FastLoader what a user of the reference hands it and compare with what it computes.
"""

from __future__ import annotations

import copy
import random

import numpy as np
import torch
from PIL import Image
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F
from torchvision.transforms import transforms as T

VOC_CATEGORIES = [0, 5, 2, 16, 9, 44, 6, 3, 17, 62, 21, 67, 18, 19, 4, 1, 64, 20, 63, 7, 72]


def pad_smaller(img, size, fill=0):
    """Pad the bottom and right of a PIL image up to ``size`` when its shorter side is below it."""
    w, h = img.size
    if min(w, h) >= size:
        return img
    return F.pad(img, (0, 0, size - w if w < size else 0, size - h if h < size else 0), fill=fill)


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image, target):
        for step in self.transforms:
            image, target = step(image, target)
        return image, target


class RandomResize:
    def __init__(self, min_size, max_size=None):
        self.min_size = min_size
        self.max_size = min_size if max_size is None else max_size

    def __call__(self, image, target):
        side = random.randint(self.min_size, self.max_size)
        return F.resize(image, side, antialias=True), F.resize(target, side, interpolation=InterpolationMode.NEAREST)


class RandomHorizontalFlip:
    def __init__(self, flip_prob):
        self.flip_prob = flip_prob

    def __call__(self, image, target):
        if random.random() < self.flip_prob:
            return F.hflip(image), F.hflip(target)
        return image, target


class RandomCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image, target):
        image, target = pad_smaller(image, self.size), pad_smaller(target, self.size, fill=255)
        box = T.RandomCrop.get_params(image, (self.size, self.size))
        return F.crop(image, *box), F.crop(target, *box)


class CenterCrop:
    def __init__(self, size):
        self.size = size

    def __call__(self, image, target):
        return F.center_crop(image, self.size), F.center_crop(target, self.size)


class PILToTensor:
    def __call__(self, image, target):
        return F.pil_to_tensor(image), torch.as_tensor(np.array(target), dtype=torch.int64)


class ToTensor:
    """The older reference's conversion: a 0..1 float image, the mask as int64."""

    def __call__(self, image, target):
        return F.to_tensor(image), torch.as_tensor(np.asarray(target), dtype=torch.int64)


class ConvertImageDtype:
    def __init__(self, dtype):
        self.dtype = dtype

    def __call__(self, image, target):
        return F.convert_image_dtype(image, self.dtype), torch.as_tensor(target, dtype=torch.int64)


class ToDtype:
    def __init__(self, dtype, scale=False):
        self.dtype, self.scale = dtype, scale

    def __call__(self, image, target):
        if self.scale:
            return F.convert_image_dtype(image, self.dtype), target
        return image.to(dtype=self.dtype), target


class Normalize:
    def __init__(self, mean, std):
        self.mean, self.std = mean, std

    def __call__(self, image, target):
        return F.normalize(image, mean=self.mean, std=self.std), target


class FilterAndRemapCocoCategories:
    def __init__(self, categories, remap=True):
        self.categories, self.remap = categories, remap

    def __call__(self, image, anns):
        anns = [a for a in anns if a["category_id"] in self.categories]
        if self.remap:
            anns = copy.deepcopy(anns)
            for a in anns:
                a["category_id"] = self.categories.index(a["category_id"])
        return image, anns


class ConvertCocoPolysToMask:
    def __call__(self, image, anns):
        from pycocotools import mask as coco_mask

        w, h = image.size
        if not anns:
            return image, Image.fromarray(np.zeros((h, w), np.uint8))
        layers = []
        for a in anns:
            m = coco_mask.decode(coco_mask.frPyObjects(a["segmentation"], h, w))
            layers.append(torch.as_tensor(m.reshape(h, w, -1), dtype=torch.uint8).any(dim=2))
        masks = torch.stack(layers)
        cats = torch.as_tensor([a["category_id"] for a in anns], dtype=masks.dtype)
        merged = (masks * cats[:, None, None]).max(dim=0).values
        merged[masks.sum(0) > 1] = 255
        return image, Image.fromarray(merged.numpy())


def v2_extras():
    """The reference's ``v2_extras`` classes (built lazily, as the reference imports that module)."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    class PadIfSmaller(v2.Transform):
        def __init__(self, size, fill=0):
            super().__init__()
            self.size = size
            self.fill = dict(fill) if isinstance(fill, dict) else {"others": fill}

        def make_params(self, flat_inputs):
            h, w = v2.functional.get_size(next(x for x in flat_inputs if isinstance(x, (Image.Image, tv_tensors.Image))))
            pad = [0, 0, max(self.size - w, 0), max(self.size - h, 0)]
            return {"padding": pad, "needs_padding": any(pad)}

        def transform(self, inpt, params):
            if not params["needs_padding"]:
                return inpt
            fill = self.fill.get(type(inpt), self.fill.get("others"))
            return v2.functional.pad(inpt, padding=params["padding"], fill=fill)

    class CocoDetectionToVOCSegmentation(v2.Transform):
        COCO_TO_VOC_LABEL_MAP = {c: k for k, c in enumerate(VOC_CATEGORIES)}
        INVALID_VALUE = 255

        def forward(self, image, target):
            mask = None
            if "masks" in target:
                pairs = [(i, self.COCO_TO_VOC_LABEL_MAP[c]) for i, c in enumerate(target["labels"].tolist()) if c in self.COCO_TO_VOC_LABEL_MAP]
                if pairs:
                    inst = target["masks"][[i for i, _ in pairs]].to(torch.uint8)
                    labels = torch.tensor([v for _, v in pairs], dtype=torch.uint8)
                    mask = (inst * labels.reshape(-1, 1, 1)).max(dim=0).values
                    mask[inst.sum(dim=0) > 1] = self.INVALID_VALUE
            if mask is None:
                mask = torch.zeros(v2.functional.get_size(image), dtype=torch.uint8)
            return image, tv_tensors.Mask(mask)

    return PadIfSmaller, CocoDetectionToVOCSegmentation


class SegmentationPresetTrain:
    """The reference's training preset: ``self.transforms(img, target)``; ``pad`` picks the v2 padding
    (``"extras"``: the reference's ``PadIfSmaller``; ``"if_needed"``: ``RandomCrop(pad_if_needed=True)``)."""

    def __init__(self, *, base_size, crop_size, hflip_prob=0.5, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                 backend="pil", use_v2=False, pad="extras"):  # fmt: skip
        from torchvision import tv_tensors
        from torchvision.transforms import v2

        R = v2 if use_v2 else __import__(__name__, fromlist=["Compose"])
        steps = {"tensor": [R.PILToTensor()], "tv_tensor": [v2.ToImage()], "pil": []}[backend]
        steps.append(R.RandomResize(min_size=int(0.5 * base_size), max_size=int(2.0 * base_size)))
        if hflip_prob > 0:
            steps.append(R.RandomHorizontalFlip(hflip_prob))
        fill = {tv_tensors.Mask: 255, "others": 0}
        if use_v2 and pad == "extras":
            steps += [v2_extras()[0](crop_size, fill=fill), v2.RandomCrop(crop_size)]
        elif use_v2:
            steps.append(v2.RandomCrop(crop_size, pad_if_needed=True, fill=fill))
        else:
            steps.append(RandomCrop(crop_size))
        if backend == "pil":
            steps.append(R.PILToTensor())
        if use_v2:
            image_type = tv_tensors.Image if backend == "tv_tensor" else torch.Tensor
            steps.append(v2.ToDtype(dtype={image_type: torch.float32, tv_tensors.Mask: torch.int64, "others": None}, scale=True))
        else:
            steps.append(ToDtype(torch.float, scale=True))
        steps.append(R.Normalize(mean=mean, std=std))
        if use_v2:
            steps.append(v2.ToPureTensor())
        self.transforms = R.Compose(steps)

    def __call__(self, img, target):
        return self.transforms(img, target)


class SegmentationPresetEval:
    def __init__(self, *, base_size, mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225), use_v2=False):
        from torchvision.transforms import v2

        if use_v2:
            steps = [v2.Resize(size=(base_size, base_size)), v2.PILToTensor(), v2.ToDtype(torch.float, scale=True),
                     v2.Normalize(mean=mean, std=std), v2.ToPureTensor()]  # fmt: skip
            self.transforms = v2.Compose(steps)
        else:
            self.transforms = Compose([RandomResize(base_size, base_size), PILToTensor(), ToDtype(torch.float, scale=True), Normalize(mean=mean, std=std)])

    def __call__(self, img, target):
        return self.transforms(img, target)
