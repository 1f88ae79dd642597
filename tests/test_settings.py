"""``fastload.Augment``: one frozen, validated settings object, taken by FastLoader as ``transform=``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import fastload
from fastload import Augment, ConfigError, FastLoader

T = pytest.importorskip("torchvision.transforms")

#: Bad values of each setting; the loader's flat keyword and Augment must refuse each with one message.
BAD = [
    ("crop", 0), ("crop", 8193), ("crop", 2.5), ("crop", True), ("resize", 10), ("resize", 2 * 8192 + 1),
    ("scale", (0.5, 0.2)), ("scale", (0.0, 0.0)), ("scale", (0.1, 1.5)), ("scale", "ab"), ("ratio", (0.0, 1.0)),
    ("ratio", (float("nan"), 1.0)), ("flip", 1.5), ("flip", "x"), ("mean", (0.5, 0.5)), ("std", (0.2, 0.2, 0.0)),
    ("dtype", torch.int32), ("dtype", "float32"),
]  # fmt: skip


@pytest.mark.parametrize(("name", "value"), BAD, ids=[f"{n}={v!r}" for n, v in BAD])
def test_augment_and_the_flat_keyword_refuse_a_bad_value_with_the_same_message(pixel_dataset, name, value):
    kw = {name: value}
    if name in ("mean", "std"):  # both or neither: give the other one a good value
        kw.setdefault("std" if name == "mean" else "mean", (0.5, 0.5, 0.5))
    if name == "resize":
        kw["crop"] = 32
    with pytest.raises(ConfigError) as direct:
        Augment(**kw)
    with pytest.raises(ConfigError) as flat:
        FastLoader(pixel_dataset.packed, 4, device="cpu", **kw)
    assert str(direct.value) == str(flat.value)
    assert name in str(direct.value) and repr(value)[:6] in str(direct.value)


def test_augment_is_frozen_keyword_only_and_normalised():
    a = Augment(crop=np.int64(32), scale=[0.25, 1], flip=1, mean=[0, 0, 0], std=[1, 1, 1], train=0)
    assert (a.crop, a.scale, a.flip, a.mean, a.train) == (32, (0.25, 1.0), 1.0, (0.0, 0.0, 0.0), False)
    assert type(a.crop) is int and a.resize is None and a.resize_side == round(32 / 0.875) == 37
    with pytest.raises(dataclasses.FrozenInstanceError):
        a.crop = 64  # type: ignore[misc]
    with pytest.raises(TypeError):
        Augment(True, 32)  # type: ignore[misc]  # keyword-only
    assert Augment(mean=None, std=None).out_dtype == torch.uint8 and Augment().out_dtype == torch.float32


def test_merged_layers_later_wins_and_resize_follows_the_final_crop():
    base = Augment(crop=64, flip=0.0)
    got = Augment.merged(base, {"crop": 32})
    assert (got.crop, got.flip, got.resize_side) == (32, 0.0, 37)  # not 64 / 0.875: an unset resize is derived last
    assert Augment.merged(Augment(crop=64, resize=80), {"train": False}).resize == 80
    with pytest.raises(ConfigError, match="unknown augmentation setting.*seeds"):
        Augment.merged({"seeds": 1})


def _epoch(loader) -> list[torch.Tensor]:
    return [x.clone() for x, _ in loader]


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_a_torchvision_transform_on_a_packed_dataset_gives_the_batches_of_the_flat_keywords(pixel_dataset, train):
    norm = T.Normalize((0.5, 0.4, 0.3), (0.2, 0.25, 0.3))
    if train:
        tv = T.Compose([T.RandomResizedCrop(24, scale=(0.3, 0.9)), T.RandomHorizontalFlip(0.3), T.ToTensor(), norm])
        flat = dict(train=True, crop=24, scale=(0.3, 0.9), flip=0.3)
    else:
        tv = T.Compose([T.Resize(40), T.CenterCrop(24), T.ToTensor(), norm])
        flat = dict(train=False, crop=24, resize=40)
    common = dict(device="cpu", shuffle=True, seed=3)
    with FastLoader(pixel_dataset.packed, 8, transform=tv, **common) as a:
        got = _epoch(a)
        assert a.augment == fastload.transforms.translate(tv)
    with FastLoader(pixel_dataset.packed, 8, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), **flat, **common) as b:
        want = _epoch(b)
    with FastLoader(pixel_dataset.packed, 8, transform=fastload.transforms.translate(tv), **common) as c:
        same = _epoch(c)
    assert len(got) == len(want) == 3
    for x, y, z in zip(got, want, same):
        assert torch.equal(x, y) and torch.equal(x, z)


def test_flat_keywords_override_the_transform(pixel_dataset):
    tv = T.Compose([T.RandomResizedCrop(24), T.ToTensor()])
    with FastLoader(pixel_dataset.packed, 4, device="cpu", transform=tv, crop=16, channels_last=True) as ld:
        x, _ = next(iter(ld))
        assert x.shape == (4, 3, 16, 16) and x.is_contiguous(memory_format=torch.channels_last)
        assert (ld.augment.crop, ld.augment.flip, ld.augment.mean) == (16, 0.0, (0.0, 0.0, 0.0))  # the rest: the transform's


def test_transform_that_cannot_be_translated_is_refused_naming_the_step(pixel_dataset):
    with pytest.raises(ConfigError, match="Lambda"):
        FastLoader(pixel_dataset.packed, 4, device="cpu", transform=T.Compose([T.Lambda(lambda x: x), T.ToTensor()]))
