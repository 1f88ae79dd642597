"""Runs one real script's data configuration under the timm version it pins, on both loaders (a subprocess).

``python real_configs_probe.py CONFIG DATA CACHE``, with the pinned timm first on ``PYTHONPATH``:
builds the datasets and loaders the way the named script builds them (a few lines each, citing
the script; nothing copied), once with ``torch.utils.data.DataLoader`` and once with
``fastload.FastLoader`` in its place, iterates them as the script's loop does, and prints one
JSON object on the last line of stdout: for each loader what a script would notice (batches per
epoch, shapes, dtypes, labels in order, value ranges) and the evaluation batches' largest
difference. ``CONFIG``: ``mae``, ``convnext``, ``convnext-cifar`` or ``deit``. Nothing here
decides what is expected; ``test_real_configs.py`` compares.
"""

from __future__ import annotations

import collections.abc
import json
import logging
import os
import random
import sys
import types
from pathlib import Path

import numpy as np

log = logging.getLogger("real_configs_probe")

# timm 0.3.x imports torch._six (removed in torch 2.0), the fix MAE's README asks for: the standard library's names.
_six = types.ModuleType("torch._six")
_six.container_abcs, _six.string_classes, _six.int_classes = collections.abc, (str,), int
sys.modules.setdefault("torch._six", _six)

import timm  # noqa: E402
import torch  # noqa: E402
from timm.data import create_transform  # noqa: E402
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # noqa: E402
from torchvision import datasets, transforms  # noqa: E402

import fastload  # noqa: E402

HERE = Path(__file__).resolve().parent


def _loader_class(which: str):
    return fastload.FastLoader if which == "fastload" else torch.utils.data.DataLoader


def _extra(which: str, cache: str) -> dict:
    """What the test environment adds: FastLoader's cache and device; the DataLoader oracle without worker
    processes (its batches do not depend on them, and a fork under old timm is not what is compared)."""
    if which == "fastload":
        return {"cache_dir": cache, "progress": False, "device": "cpu"}
    return {"num_workers": 0}


def _stats(batches, mean, std) -> dict:
    """Per epoch: batch count, labels in order, shapes, dtypes, the values' range and the share outside the
    normalised pixel range ``[(0 - m) / s, (1 - m) / s]`` per channel."""
    m = torch.tensor(mean).view(1, -1, 1, 1)
    s = torch.tensor(std).view(1, -1, 1, 1)
    lo, hi = (0 - m) / s, (1 - m) / s
    out = {"batches": len(batches), "labels": [], "shapes": [], "dtypes": [], "min": [], "max": [], "outside": 0, "values": 0}
    for images, labels in batches:
        out["labels"] += [int(v) for v in labels]
        out["shapes"].append(list(images.shape))
        out["dtypes"].append(str(images.dtype))
        out["min"].append(float(images.min()))
        out["max"].append(float(images.max()))
        out["outside"] += int(((images < lo - 1e-4) | (images > hi + 1e-4)).sum())
        out["values"] += images.numel()
    return out


def _epochs(loader, sampler, n: int, mean, std) -> list[dict]:
    """``n`` epochs as the scripts' loops run them, with ``sampler.set_epoch`` where the sampler has one.
    (No Mixup: these timm versions build its targets on ``"cuda"``, which fails on a CPU machine with
    either loader; mixing is checked under the current timm by test_deit_swap.py.)"""
    out = []
    for epoch in range(n):
        if hasattr(sampler, "set_epoch"):
            sampler.set_epoch(epoch)
        out.append(_stats([(x.clone(), y.clone()) for x, y in loader], mean, std))
    return out


def _eval(loader, mean, std) -> tuple[dict, torch.Tensor]:
    batches = [(x.clone(), y.clone()) for x, y in loader]
    return _stats(batches, mean, std), torch.cat([x for x, _ in batches])


def _seed() -> None:
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)


def mae(data: str, cache: str) -> dict:
    """MAE's main_finetune.py (timm==0.3.2) on one process: util/datasets.py's build_transform with the
    script's defaults (input_size 224, color_jitter None, aa rand-m9-mstd0.5-inc1, bicubic, reprob 0.25,
    remode pixel, recount 1, ImageNet mean/std; evaluation Resize(256, BICUBIC), CenterCrop(224)); a
    RandomSampler with drop_last=True, a SequentialSampler."""
    import PIL

    mean, std = IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
    train_t = create_transform(input_size=224, is_training=True, color_jitter=None, auto_augment="rand-m9-mstd0.5-inc1",
                               interpolation="bicubic", re_prob=0.25, re_mode="pixel", re_count=1, mean=mean, std=std)  # fmt: skip
    val_t = transforms.Compose([transforms.Resize(int(224 / (224 / 256)), interpolation=PIL.Image.BICUBIC),
                                transforms.CenterCrop(224), transforms.ToTensor(), transforms.Normalize(mean, std)])  # fmt: skip
    result = {}
    for which in ("torch", "fastload"):
        _seed()
        Loader, extra = _loader_class(which), _extra(which, cache)
        dataset_train = datasets.ImageFolder(os.path.join(data, "train"), transform=train_t)
        dataset_val = datasets.ImageFolder(os.path.join(data, "val"), transform=val_t)
        sampler_train = torch.utils.data.RandomSampler(dataset_train)
        sampler_val = torch.utils.data.SequentialSampler(dataset_val)
        kw = {"num_workers": 10, "pin_memory": True, **extra}
        train = Loader(dataset_train, sampler=sampler_train, batch_size=6, drop_last=True, **kw)
        val = Loader(dataset_val, sampler=sampler_val, batch_size=6, drop_last=False, **kw)
        result[which] = {"train": _epochs(train, sampler_train, 2, mean, std)}
        result[which]["val"], result[which]["val_images"] = _eval(val, mean, std)
    return result


def _convnext_transform(input_size: int, mean, std):
    """ConvNeXt's datasets.py build_transform (train) with main.py's defaults: color_jitter 0.4,
    aa rand-m9-mstd0.5-inc1, bicubic, reprob 0.25, pixel, recount 1; at 32 px its first step becomes
    RandomCrop(input_size, padding=4)."""
    t = create_transform(input_size=input_size, is_training=True, color_jitter=0.4, auto_augment="rand-m9-mstd0.5-inc1",
                         interpolation="bicubic", re_prob=0.25, re_mode="pixel", re_count=1, mean=mean, std=std)  # fmt: skip
    if input_size <= 32:
        t.transforms[0] = transforms.RandomCrop(input_size, padding=4)
    return t


def _convnext_eval(input_size: int, mean, std):
    """datasets.py's evaluation transform: Resize(int(size / (224 / 256)), BICUBIC) + CenterCrop below 384 px;
    no resize at 32 px."""
    t = []
    if input_size > 32:
        t += [transforms.Resize(int(input_size / (224 / 256)), interpolation=transforms.InterpolationMode.BICUBIC),
              transforms.CenterCrop(input_size)]  # fmt: skip
    return transforms.Compose([*t, transforms.ToTensor(), transforms.Normalize(mean, std)])


def convnext(data: str, cache: str, cifar: bool = False) -> dict:
    """ConvNeXt's main.py (timm==0.3.2) on one process: ``--data_set IMNET`` (ImageFolder train/val at
    input_size 224) or ``--data_set CIFAR`` (``datasets.CIFAR100(data_path, train=..., download=True)`` at
    input_size 32); a DistributedSampler(num_replicas=1, rank=0, shuffle=True, seed=0) with drop_last=True,
    the evaluation's DistributedSampler(shuffle=False) (dist_eval) at 1.5x the batch."""
    mean, std = IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD  # --imagenet_default_mean_and_std true
    size = 32 if cifar else 224
    if cifar:
        sys.path.insert(0, str(HERE))
        from array_files import write_cifar

        for k, v in write_cifar(Path(data), n_batch=6, n_test=15, hundred=True).items():
            setattr(datasets.CIFAR100, k, v)
    result = {}
    for which in ("torch", "fastload"):
        _seed()
        Loader, extra = _loader_class(which), _extra(which, cache)
        train_t, val_t = _convnext_transform(size, mean, std), _convnext_eval(size, mean, std)
        if cifar:
            dataset_train = datasets.CIFAR100(data, train=True, transform=train_t, download=True)
            dataset_val = datasets.CIFAR100(data, train=False, transform=val_t, download=True)
        else:
            dataset_train = datasets.ImageFolder(os.path.join(data, "train"), transform=train_t)
            dataset_val = datasets.ImageFolder(os.path.join(data, "val"), transform=val_t)
        sampler_train = torch.utils.data.DistributedSampler(dataset_train, num_replicas=1, rank=0, shuffle=True, seed=0)
        sampler_val = torch.utils.data.DistributedSampler(dataset_val, num_replicas=1, rank=0, shuffle=False)
        kw = {"num_workers": 10, "pin_memory": True, **extra}
        train = Loader(dataset_train, sampler=sampler_train, batch_size=6, drop_last=True, **kw)
        val = Loader(dataset_val, sampler=sampler_val, batch_size=int(1.5 * 6), drop_last=False, **kw)
        result[which] = {"train": _epochs(train, sampler_train, 2, mean, std)}
        result[which]["val"], result[which]["val_images"] = _eval(val, mean, std)
    return result


def deit(data: str, cache: str) -> dict:
    """DeiT's main.py with its defaults but Mixup (see ``_epochs``), through ``deit_style.run``, under this timm."""
    sys.path.insert(0, str(HERE))
    from deit_style import run

    out = {}
    for which in ("torch", "fastload"):
        got = run(data, loader=which, epochs=2, mixup=0.0, cutmix=0.0)
        got["shapes"] = sorted(list(s) for s in got["shapes"])
        out[which] = got
    return out


def main() -> dict:
    config, data, cache = sys.argv[1:4]
    if config == "deit":
        result = deit(data, cache)
    else:
        result = convnext(data, cache, cifar=True) if config == "convnext-cifar" else (mae if config == "mae" else convnext)(data, cache)
        a, b = result["torch"].pop("val_images"), result["fastload"].pop("val_images")
        d = (a - b).abs() if a.shape == b.shape else None
        result["val_diff"] = None if d is None else {"max": float(d.max()), "mean": float(d.mean()), "p99": float(d.flatten().quantile(0.99))}
    result["version"] = timm.__version__
    return result


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    sys.stdout.write("\n" + json.dumps(main()) + "\n")
