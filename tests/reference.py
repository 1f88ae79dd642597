"""The reference the loader's pixels are checked against: torchvision's image semantics in PIL and NumPy.

Training: crop the decoded image to the sample's box ``(x, y, w, h)``, resize it to
``crop x crop`` with PIL's antialiased bilinear filter (what torchvision's
``RandomResizedCrop`` does to a PIL image), mirror it if its flip is set, then
normalise. Evaluation: torchvision's ``Resize(resize)`` (the shorter side becomes
``resize``, the longer ``int(resize * long / short)``) and ``CenterCrop(crop)`` (corner
``int(round((side - crop) / 2))``), written out here from torchvision's documented
formulas rather than taken from :mod:`fastload.augment`.

Which sample lands where, and its box and flip, come from the pure functions that define
them (:class:`fastload.sampler.EpochSampler`, :func:`fastload.augment.train_params`);
what those functions return is checked on its own in ``tests/test_pixels.py``.
"""

from __future__ import annotations

import dataclasses
import io
from typing import Sequence

import numpy as np
from PIL import Image

import fastload
from fastload.augment import train_params
from fastload.sampler import EpochSampler

DEFAULT_SCALE = (0.08, 1.0)
DEFAULT_RATIO = (3 / 4, 4 / 3)

# Tolerances, as (max |diff|, worst channel's mean |diff|) in 0..255 units. On the position
# images (tests/conftest.py) the mistakes they must see cost far more: a crop one source
# pixel off moves R or G by 255 / (side - 1) >= 2.6 levels on almost every pixel, a wrong
# flip by tens of levels, nearest instead of bilinear >= 6 levels of mean (the checkerboard),
# a centre crop 2 px off >= 2.2 (tests/test_pixels.py checks these margins on the fixtures).
#
#: CPU training: DALI's CPU decoder is libjpeg-turbo with the same integer IDCT as PIL's, and the
#: resize is pillow-simd's on both sides, so the output is the reference exactly (measured: 0).
#: One level of decoder rounding (another libjpeg-turbo build) spreads to at most 2 after the resize.
CPU_HOST = (2.0, 0.25)
#: DALI's antialiased bilinear resize (CPU evaluation, the DALI training graph): the same triangle
#: filter as PIL's in float, rounded once; measured max 2, worst-channel mean 0.2 on these images.
DALI_RESIZE = (3.0, 0.5)
#: CUDA: nvJPEG's IDCT (or the hardware decoder's) against libjpeg-turbo's adds +/-1..2 levels per
#: pixel on quality-100 4:4:4 JPEGs, on top of DALI's resize rounding; still below a 1-px shift.
CUDA = (8.0, 1.0)
#: An EXIF-rotated sample is re-encoded by pack (quality 100, 4:2:0 chroma): smooth gradients lose
#: about a level to the chroma subsampling; a wrong rotation or mirror costs tens of levels.
ROTATED = (10.0, 2.0)


def decode(payload: bytes) -> np.ndarray:
    """A stored payload decoded by PIL: HWC uint8 RGB."""
    with Image.open(io.BytesIO(payload)) as im:
        return np.asarray(im.convert("RGB"))


def resized_crop(rgb: np.ndarray, box: Sequence[float], size: int, *, resample: int = Image.BILINEAR) -> np.ndarray:
    """``rgb[y:y+h, x:x+w]`` resized to ``size x size`` (PIL's bilinear filter, antialiased)."""
    x, y, w, h = (int(v) for v in box)
    if w <= 0 or h <= 0 or x < 0 or y < 0 or x + w > rgb.shape[1] or y + h > rgb.shape[0]:
        raise ValueError(f"box {tuple(box)} is outside the {rgb.shape[1]}x{rgb.shape[0]} image")
    im = Image.fromarray(np.ascontiguousarray(rgb)).crop((x, y, x + w, y + h))
    return np.asarray(im.resize((size, size), resample))


def train_image(rgb: np.ndarray, box: Sequence[float], flip: bool, *, crop: int, resample: int = Image.BILINEAR) -> np.ndarray:
    """The expected training output of one sample (HWC uint8, before normalisation)."""
    out = resized_crop(rgb, box, crop, resample=resample)
    return np.ascontiguousarray(out[:, ::-1]) if flip else out


def eval_geometry(w: int, h: int, *, resize: int, crop: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """torchvision's ``Resize(resize)`` size ``(w, h)`` and ``CenterCrop(crop)`` corner ``(left, top)``."""
    if w <= h:
        nw, nh = resize, int(resize * h / w)
    else:
        nw, nh = int(resize * w / h), resize
    return (nw, nh), (int(round((nw - crop) / 2.0)), int(round((nh - crop) / 2.0)))


def eval_image(rgb: np.ndarray, *, resize: int, crop: int) -> np.ndarray:
    """The expected evaluation output of one image (HWC uint8, before normalisation)."""
    (nw, nh), (left, top) = eval_geometry(rgb.shape[1], rgb.shape[0], resize=resize, crop=crop)
    im = Image.fromarray(np.ascontiguousarray(rgb)).resize((nw, nh), Image.BILINEAR)
    return np.asarray(im.crop((left, top, left + crop, top + crop)))


def as_hwc255(image, mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> np.ndarray:
    """One output image (CHW tensor or array, uint8 or normalised) as HWC float64 in 0..255 units."""
    x = image.detach().float().cpu().numpy() if hasattr(image, "detach") else np.asarray(image)
    x = x.astype(np.float64)
    if mean is not None:
        x = (x * np.asarray(std).reshape(3, 1, 1) + np.asarray(mean).reshape(3, 1, 1)) * 255.0
    return x.transpose(1, 2, 0)


@dataclasses.dataclass(frozen=True)
class Difference:
    """How far one output image is from its reference, in 0..255 units: the largest absolute
    difference, and the mean absolute difference of the worst channel (a shift along x shows
    in R alone; averaging it with G and B would hide two thirds of it)."""

    max: float
    mean: float

    def within(self, max_abs: float, mean_abs: float) -> bool:
        return self.max <= max_abs and self.mean <= mean_abs


def difference(got: np.ndarray, ref: np.ndarray) -> Difference:
    """Max and mean absolute difference of two HWC images of the same shape."""
    got, ref = np.asarray(got, dtype=np.float64), np.asarray(ref, dtype=np.float64)
    if got.shape != ref.shape:
        raise AssertionError(f"shape {got.shape} != reference shape {ref.shape}")
    d = np.abs(got - ref)
    return Difference(float(d.max()), float(d.reshape(-1, d.shape[-1]).mean(axis=0).max()))


def assert_close(got: np.ndarray, ref: np.ndarray, tolerance: tuple[float, float], *, what: str) -> Difference:
    """Fail, naming ``what``, unless ``got`` is within ``tolerance = (max_abs, mean_abs)`` of ``ref``."""
    max_abs, mean_abs = tolerance
    d = difference(got, ref)
    assert d.within(max_abs, mean_abs), f"{what}: max |diff| {d.max:.2f} (<= {max_abs}), mean {d.mean:.3f} (<= {mean_abs})"
    return d


@dataclasses.dataclass(frozen=True)
class ExpectedBatch:
    """One batch as the reference computes it."""

    indices: list[int]
    positions: list[int]
    boxes: np.ndarray  # [n, 4] (x, y, w, h)
    flips: np.ndarray  # [n] 0/1
    images: list[np.ndarray]  # HWC uint8
    labels: list[int]


class Reference:
    """Expected batches of a packed dataset, decoded once with PIL."""

    def __init__(self, packed) -> None:
        ds = fastload.Dataset(packed)
        self.images = [decode(ds[i][0]) for i in range(len(ds))]
        self.labels = ds.labels.tolist()

    def __len__(self) -> int:
        return len(self.images)

    def train_epoch(
        self,
        *,
        batch_size: int,
        seed: int,
        epoch: int,
        crop: int,
        scale: tuple[float, float] = DEFAULT_SCALE,
        ratio: tuple[float, float] = DEFAULT_RATIO,
        flip: float = 0.5,
        shuffle: bool = True,
        drop_last: bool = False,
        rank: int = 0,
        world_size: int = 1,
        start: int = 0,
        resample: int = Image.BILINEAR,
    ) -> list[ExpectedBatch]:
        """The batches of one training epoch from batch ``start`` on."""
        sampler = EpochSampler(
            num_samples=len(self), batch_size=batch_size, shuffle=shuffle, drop_last=drop_last,
            seed=seed, rank=rank, world_size=world_size,
        )  # fmt: skip
        out = []
        for b in sampler.batches(epoch, start):
            idx = [int(i) for i in b.indices]
            w = np.array([self.images[i].shape[1] for i in idx])
            h = np.array([self.images[i].shape[0] for i in idx])
            boxes, flips = train_params(w, h, seed=seed, epoch=epoch, positions=b.positions, scale=scale, ratio=ratio, flip=flip)
            imgs = [train_image(self.images[i], bx, bool(f), crop=crop, resample=resample) for i, bx, f in zip(idx, boxes, flips)]
            out.append(ExpectedBatch(idx, [int(p) for p in b.positions], boxes, flips, imgs, [self.labels[i] for i in idx]))
        return out

    def eval_epoch(self, *, batch_size: int, resize: int, crop: int) -> list[ExpectedBatch]:
        """The batches of an unshuffled evaluation epoch."""
        out = []
        for s in range(0, len(self), batch_size):
            idx = list(range(s, min(s + batch_size, len(self))))
            imgs = [eval_image(self.images[i], resize=resize, crop=crop) for i in idx]
            none = np.zeros(len(idx), dtype=np.int32)
            out.append(ExpectedBatch(idx, idx, np.zeros((len(idx), 4)), none, imgs, [self.labels[i] for i in idx]))
        return out


__all__ = [
    "CPU_HOST", "DALI_RESIZE", "CUDA", "ROTATED", "Reference", "ExpectedBatch", "Difference", "decode", "resized_crop", "train_image", "eval_geometry",
    "eval_image", "as_hwc255", "difference", "assert_close",
]  # fmt: skip
