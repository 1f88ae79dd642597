"""A training script shaped like DeiT's ``main.py``, for the swap test.

Written for this test suite from that script's behaviour, not copied: ``build_transform``
makes the training transform with ``timm.data.create_transform`` (DeiT's defaults: colour
jitter 0.3, which timm drops beside RandAugment, ``rand-m9-mstd0.5-inc1``, bicubic,
erasing with probability 0.25 in ``pixel`` mode, one rectangle) and the evaluation one as
``Resize(int(size / 0.875), interpolation=3)``, ``CenterCrop``, ``ToTensor``, ``Normalize``;
the training loader takes a ``RandomSampler`` and ``drop_last=True``, the evaluation loader
a ``SequentialSampler`` and one and a half times the batch size; timm's ``Mixup`` (0.8,
cutmix 1.0, label smoothing 0.1) mixes each batch in the loop and ``SoftTargetCrossEntropy``
scores it; the evaluation counts its samples over exactly the validation set.
``run(..., loader="fastload")`` is the literal swap: ``fastload.FastLoader(`` where the
script has ``torch.utils.data.DataLoader(``.
"""

from __future__ import annotations

import torch
from timm.data import create_transform
from timm.data.constants import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from timm.data.mixup import Mixup
from timm.loss import SoftTargetCrossEntropy
from torch import nn
from torchvision import datasets, transforms

import fastload


def build_transform(is_train: bool, *, input_size: int, color_jitter=0.3, aa="rand-m9-mstd0.5-inc1",
                    train_interpolation="bicubic", reprob=0.25, remode="pixel", recount=1):  # fmt: skip
    """DeiT's transform builder: timm's factory for training, resize + centre crop for evaluation."""
    if is_train:
        return create_transform(
            input_size=input_size, is_training=True, color_jitter=color_jitter, auto_augment=aa,
            interpolation=train_interpolation, re_prob=reprob, re_mode=remode, re_count=recount,
        )  # fmt: skip
    size = int(input_size / 0.875)
    return transforms.Compose([
        transforms.Resize(size, interpolation=3), transforms.CenterCrop(input_size), transforms.ToTensor(),
        transforms.Normalize(IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD),
    ])  # fmt: skip


def run(data, *, loader: str, epochs=3, batch_size=6, input_size=40, mixup=0.8, cutmix=1.0, seed=0, lr=0.05, **aug) -> dict:
    """Train a tiny model for ``epochs`` and evaluate it; what it saw and scored, for comparison."""
    Loader = fastload.FastLoader if loader == "fastload" else torch.utils.data.DataLoader
    torch.manual_seed(seed)
    dataset_train = datasets.ImageFolder(f"{data}/train", transform=build_transform(True, input_size=input_size, **aug))
    dataset_val = datasets.ImageFolder(f"{data}/val", transform=build_transform(False, input_size=input_size))
    num_classes = len(dataset_train.classes)
    sampler_train = torch.utils.data.RandomSampler(dataset_train)
    sampler_val = torch.utils.data.SequentialSampler(dataset_val)
    extra = {"progress": False, "cache_dir": f"{data}/.cache", "device": "cpu"} if loader == "fastload" else {}
    if loader != "fastload":
        # The reference's workers start from a fork server, not by forking the test process: after a
        # full suite's earlier tests (threads of DALI, pyarrow, ...) a forked worker running timm's
        # RandAugment was killed by SIGSEGV in two clean-checkout runs. What is compared (batches,
        # samples, shapes, the evaluation count, a falling loss) does not depend on how workers start.
        extra = {"multiprocessing_context": "forkserver", "persistent_workers": True}
    data_loader_train = Loader(dataset_train, sampler=sampler_train, batch_size=batch_size, num_workers=2,
                               pin_memory=True, drop_last=True, **extra)  # fmt: skip
    data_loader_val = Loader(dataset_val, sampler=sampler_val, batch_size=int(1.5 * batch_size), num_workers=2,
                             pin_memory=True, drop_last=False, **extra)  # fmt: skip
    mixup_fn = None
    if mixup > 0 or cutmix > 0:
        mixup_fn = Mixup(mixup_alpha=mixup, cutmix_alpha=cutmix, label_smoothing=0.1, num_classes=num_classes)
    criterion = SoftTargetCrossEntropy() if mixup_fn is not None else nn.CrossEntropyLoss()
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out = {"batches": [], "samples": [], "loss": [], "shapes": set()}
    for _ in range(epochs):
        total, n, seen = 0.0, 0, 0
        for samples, targets in data_loader_train:
            out["shapes"].add(tuple(samples.shape[1:]))
            if mixup_fn is not None:
                samples, targets = mixup_fn(samples, targets)
            loss = criterion(model(samples), targets)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n, seen = total + loss.item(), n + 1, seen + len(samples)
        out["batches"].append(n)
        out["samples"].append(seen)
        out["loss"].append(total / n)
    correct = count = 0
    model.eval()
    with torch.inference_mode():
        for images, target in data_loader_val:
            correct += int((model(images).argmax(1) == target).sum())
            count += len(target)
    out["val_count"], out["val_acc"] = count, correct / count
    for ld in (data_loader_train, data_loader_val):
        getattr(ld, "close", lambda: None)()
    return out
