"""The detection reference's own transforms module as a user has it (its classes re-expressed for the tests), and its training presets in both forms.

torchvision's ``references/detection/transforms.py`` is not installed with torchvision: a user
copies it next to ``train.py``. These classes carry the same names and attributes and draw and
apply as that file's do (``torch.rand``/``randint``/``randperm`` in the same order, the same
functional calls on the image and the same in-place operations on the target), so the tests can
hand FastLoader what a user of the reference hands it and compare with what it computes.
:func:`preset` builds ``DetectionPresetTrain``'s ``transforms`` for each policy, v1 or v2.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torchvision
from torch import nn
from torchvision.transforms import InterpolationMode
from torchvision.transforms import functional as F
from torchvision.transforms import transforms as T

KEYPOINT_PAIRS = [0, 2, 1, 4, 3, 6, 5, 8, 7, 10, 9, 12, 11, 14, 13, 16, 15]


class Compose:
    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image, target):
        for step in self.transforms:
            image, target = step(image, target)
        return image, target


class RandomHorizontalFlip(T.RandomHorizontalFlip):
    def forward(self, image, target=None):
        if torch.rand(1) < self.p:
            image = F.hflip(image)
            if target is not None:
                width = F.get_dimensions(image)[2]
                target["boxes"][:, [0, 2]] = width - target["boxes"][:, [2, 0]]
                if "masks" in target:
                    target["masks"] = target["masks"].flip(-1)
                if "keypoints" in target:
                    kps = target["keypoints"][:, KEYPOINT_PAIRS]
                    kps[..., 0] = width - kps[..., 0]
                    kps[kps[..., 2] == 0] = 0
                    target["keypoints"] = kps
        return image, target


class PILToTensor(nn.Module):
    def forward(self, image, target=None):
        return F.pil_to_tensor(image), target


class ToDtype(nn.Module):
    def __init__(self, dtype, scale=False):
        super().__init__()
        self.dtype, self.scale = dtype, scale

    def forward(self, image, target=None):
        if self.scale:
            return F.convert_image_dtype(image, self.dtype), target
        return image.to(dtype=self.dtype), target


class ConvertImageDtype(nn.Module):
    def __init__(self, dtype):
        super().__init__()
        self.dtype = dtype

    def forward(self, image, target=None):
        return F.convert_image_dtype(image, self.dtype), target


class RandomIoUCrop(nn.Module):
    def __init__(self, min_scale=0.3, max_scale=1.0, min_aspect_ratio=0.5, max_aspect_ratio=2.0, sampler_options=None, trials=40):
        super().__init__()
        self.min_scale, self.max_scale = min_scale, max_scale
        self.min_aspect_ratio, self.max_aspect_ratio = min_aspect_ratio, max_aspect_ratio
        self.options = [0.0, 0.1, 0.3, 0.5, 0.7, 0.9, 1.0] if sampler_options is None else sampler_options
        self.trials = trials

    def forward(self, image, target=None):
        if target is None:
            raise ValueError("The targets can't be None for this transform.")
        _, h, w = F.get_dimensions(image)
        while True:
            least = self.options[int(torch.randint(low=0, high=len(self.options), size=(1,)))]
            if least >= 1.0:
                return image, target
            for _ in range(self.trials):
                r = self.min_scale + (self.max_scale - self.min_scale) * torch.rand(2)
                nw, nh = int(w * r[0]), int(h * r[1])
                if not (self.min_aspect_ratio <= nw / nh <= self.max_aspect_ratio):
                    continue
                r = torch.rand(2)
                left, top = int((w - nw) * r[0]), int((h - nh) * r[1])
                right, bottom = left + nw, top + nh
                if left == right or top == bottom:
                    continue
                b = target["boxes"]
                cx, cy = 0.5 * (b[:, 0] + b[:, 2]), 0.5 * (b[:, 1] + b[:, 3])
                inside = (left < cx) & (cx < right) & (top < cy) & (cy < bottom)
                if not inside.any():
                    continue
                kept = b[inside]
                window = torch.tensor([[left, top, right, bottom]], dtype=kept.dtype)
                if torchvision.ops.boxes.box_iou(kept, window).max() < least:
                    continue
                target["boxes"] = kept
                target["labels"] = target["labels"][inside]
                target["boxes"][:, 0::2] -= left
                target["boxes"][:, 1::2] -= top
                target["boxes"][:, 0::2].clamp_(min=0, max=nw)
                target["boxes"][:, 1::2].clamp_(min=0, max=nh)
                return F.crop(image, top, left, nh, nw), target


class RandomZoomOut(nn.Module):
    def __init__(self, fill=None, side_range=(1.0, 4.0), p=0.5):
        super().__init__()
        self.fill = [0.0, 0.0, 0.0] if fill is None else fill
        self.side_range, self.p = side_range, p

    def forward(self, image, target=None):
        if torch.rand(1) >= self.p:
            return image, target
        _, h, w = F.get_dimensions(image)
        r = self.side_range[0] + torch.rand(1) * (self.side_range[1] - self.side_range[0])
        cw, ch = int(w * r), int(h * r)
        r = torch.rand(2)
        left, top = int((cw - w) * r[0]), int((ch - h) * r[1])
        right, bottom = cw - (left + w), ch - (top + h)
        is_pil = not isinstance(image, torch.Tensor)
        image = F.pad(image, [left, top, right, bottom], fill=tuple(int(x) for x in self.fill) if is_pil else 0)
        if not is_pil:
            v = torch.tensor(self.fill, dtype=image.dtype).view(-1, 1, 1)
            image[..., :top, :] = image[..., :, :left] = image[..., (top + h) :, :] = image[..., :, (left + w) :] = v
        if target is not None:
            target["boxes"][:, 0::2] += left
            target["boxes"][:, 1::2] += top
        return image, target


class RandomPhotometricDistort(nn.Module):
    def __init__(self, contrast=(0.5, 1.5), saturation=(0.5, 1.5), hue=(-0.05, 0.05), brightness=(0.875, 1.125), p=0.5):
        super().__init__()
        self._brightness = T.ColorJitter(brightness=brightness)
        self._contrast = T.ColorJitter(contrast=contrast)
        self._hue = T.ColorJitter(hue=hue)
        self._saturation = T.ColorJitter(saturation=saturation)
        self.p = p

    def forward(self, image, target=None):
        r = torch.rand(7)
        if r[0] < self.p:
            image = self._brightness(image)
        before = r[1] < 0.5
        if before and r[2] < self.p:
            image = self._contrast(image)
        if r[3] < self.p:
            image = self._saturation(image)
        if r[4] < self.p:
            image = self._hue(image)
        if not before and r[5] < self.p:
            image = self._contrast(image)
        if r[6] < self.p:
            channels = F.get_dimensions(image)[0]
            order = torch.randperm(channels)
            is_pil = not isinstance(image, torch.Tensor)
            if is_pil:
                image = F.convert_image_dtype(F.pil_to_tensor(image))
            image = image[..., order, :, :]
            if is_pil:
                image = F.to_pil_image(image)
        return image, target


class ScaleJitter(nn.Module):
    def __init__(self, target_size, scale_range=(0.1, 2.0), interpolation=InterpolationMode.BILINEAR, antialias=True):
        super().__init__()
        self.target_size, self.scale_range = target_size, scale_range
        self.interpolation, self.antialias = interpolation, antialias

    def forward(self, image, target=None):
        _, h, w = F.get_dimensions(image)
        scale = self.scale_range[0] + torch.rand(1) * (self.scale_range[1] - self.scale_range[0])
        r = min(self.target_size[1] / h, self.target_size[0] / w) * scale
        nw, nh = int(w * r), int(h * r)
        image = F.resize(image, [nh, nw], interpolation=self.interpolation, antialias=self.antialias)
        if target is not None:
            target["boxes"][:, 0::2] *= nw / w
            target["boxes"][:, 1::2] *= nh / h
            if "masks" in target:
                target["masks"] = F.resize(target["masks"], [nh, nw], interpolation=InterpolationMode.NEAREST, antialias=self.antialias)
        return image, target


class FixedSizeCrop(nn.Module):
    def __init__(self, size, fill=0, padding_mode="constant"):
        super().__init__()
        size = (size, size) if isinstance(size, int) else tuple(size)
        self.crop_height, self.crop_width = size
        self.fill, self.padding_mode = fill, padding_mode

    def forward(self, img, target=None):
        _, h, w = F.get_dimensions(img)
        nh, nw = min(h, self.crop_height), min(w, self.crop_width)
        if nh != h or nw != w:
            r = torch.rand(1)
            top, left = int(max(h - self.crop_height, 0) * r), int(max(w - self.crop_width, 0) * r)
            img = F.crop(img, top, left, nh, nw)
            if target is not None:
                boxes = target["boxes"]
                boxes[:, 0::2] -= left
                boxes[:, 1::2] -= top
                boxes[:, 0::2].clamp_(min=0, max=nw)
                boxes[:, 1::2].clamp_(min=0, max=nh)
                ok = (boxes[:, 0] < boxes[:, 2]) & (boxes[:, 1] < boxes[:, 3])
                target["boxes"], target["labels"] = boxes[ok], target["labels"][ok]
                if "masks" in target:
                    target["masks"] = F.crop(target["masks"][ok], top, left, nh, nw)
        pad_bottom, pad_right = max(self.crop_height - nh, 0), max(self.crop_width - nw, 0)
        if pad_bottom or pad_right:
            padding = [0, 0, pad_right, pad_bottom]
            img = F.pad(img, padding, self.fill, self.padding_mode)
            if target is not None:
                target["boxes"][:, 0::2] += 0
                target["boxes"][:, 1::2] += 0
                if "masks" in target:
                    target["masks"] = F.pad(target["masks"], padding, 0, "constant")
        return img, target


class RandomShortestSize(nn.Module):
    def __init__(self, min_size, max_size, interpolation=InterpolationMode.BILINEAR):
        super().__init__()
        self.min_size = [min_size] if isinstance(min_size, int) else list(min_size)
        self.max_size, self.interpolation = max_size, interpolation

    def forward(self, image, target=None):
        _, h, w = F.get_dimensions(image)
        m = self.min_size[torch.randint(len(self.min_size), (1,)).item()]
        r = min(m / min(h, w), self.max_size / max(h, w))
        nw, nh = int(w * r), int(h * r)
        image = F.resize(image, [nh, nw], interpolation=self.interpolation)
        if target is not None:
            target["boxes"][:, 0::2] *= nw / w
            target["boxes"][:, 1::2] *= nh / h
            if "masks" in target:
                target["masks"] = F.resize(target["masks"], [nh, nw], interpolation=InterpolationMode.NEAREST)
        return image, target


class DetectionPresetTrain:
    """The reference's preset: ``self.transforms(img, target)``."""

    def __init__(self, *, data_augmentation, hflip_prob=0.5, mean=(123.0, 117.0, 104.0), use_v2=False, size=1024, scales=None):
        self.transforms = preset(data_augmentation, hflip_prob=hflip_prob, mean=mean, use_v2=use_v2, size=size, scales=scales)

    def __call__(self, img, target):
        return self.transforms(img, target)


def preset(policy, *, hflip_prob=0.5, mean=(123.0, 117.0, 104.0), use_v2=False, size=1024, scales=None):
    """``DetectionPresetTrain(data_augmentation=policy, use_v2=use_v2).transforms`` with the PIL backend;
    ``size`` is lsj's 1024 and ``scales`` multiscale's (480, ..., 800) / 1333, made small for the tests."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    R = v2 if use_v2 else __import__(__name__, fromlist=["Compose"])
    scales = scales or ((480, 512, 544, 576, 608, 640, 672, 704, 736, 768, 800), 1333)
    steps = {
        "hflip": lambda: [R.RandomHorizontalFlip(p=hflip_prob)],
        "lsj": lambda: [R.ScaleJitter(target_size=(size, size), antialias=True), FixedSizeCrop(size=(size, size), fill=mean),
                        R.RandomHorizontalFlip(p=hflip_prob)],
        "multiscale": lambda: [R.RandomShortestSize(min_size=scales[0], max_size=scales[1]), R.RandomHorizontalFlip(p=hflip_prob)],
        "ssd": lambda: [R.RandomPhotometricDistort(),
                        R.RandomZoomOut(fill=defaultdict(lambda: mean, {tv_tensors.Mask: 0}) if use_v2 else list(mean)),
                        R.RandomIoUCrop(), R.RandomHorizontalFlip(p=hflip_prob)],
        "ssdlite": lambda: [R.RandomIoUCrop(), R.RandomHorizontalFlip(p=hflip_prob)],
    }[policy]()
    steps += [v2.ToImage() if use_v2 else PILToTensor(), R.ToDtype(torch.float, scale=True)]
    if use_v2:
        steps += [v2.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY), v2.SanitizeBoundingBoxes(), v2.ToPureTensor()]
        return v2.Compose(steps)
    return Compose(steps)
