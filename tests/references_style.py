"""A training script shaped like torchvision's ``references/classification/train.py``, for the swap test.

Written for this test suite from that script's behaviour, not copied: its transforms live in
preset classes that keep a ``Compose`` in ``.transforms`` (random-resized crop with the chosen
interpolation, flip, an optional ``RandomErasing`` after ``Normalize``; resize + center crop
for evaluation); ``--mixup-alpha``/``--cutmix-alpha`` make a ``collate_fn`` of
``v2.MixUp``/``v2.CutMix`` over ``default_collate``; the loaders take its arguments
(``batch_size``, ``shuffle``/``sampler``, ``num_workers``, ``pin_memory``, ``collate_fn``); the
evaluation counts its samples over exactly the validation set. ``run(..., loader="fastload")``
is the literal swap: ``fastload.FastLoader(`` where the script has ``torch.utils.data.DataLoader(``.

Under ``torchrun`` (``python -m torch.distributed.run --nproc_per_node=2 references_style.py
DATA LOADER OUT``), as that script does there: a gloo process group, a ``DistributedSampler``
for training (``set_epoch`` every epoch) and one without shuffling for evaluation, the model
in ``DistributedDataParallel``, and the evaluation's correct and sample counts summed
across ranks with ``all_reduce``; each rank writes ``OUT/rankR.json``.
"""

from __future__ import annotations

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import default_collate
from torchvision import datasets
from torchvision.transforms import InterpolationMode
from torchvision.transforms import v2 as T

import fastload

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class PresetTrain:
    def __init__(self, *, crop_size, interpolation, random_erase_prob=0.0, auto_augment_policy=None):
        steps = [T.RandomResizedCrop(crop_size, interpolation=interpolation, antialias=True), T.RandomHorizontalFlip(0.5)]
        if auto_augment_policy == "ra":  # the preset hands its interpolation on to the auto-augment
            steps.append(T.RandAugment(interpolation=interpolation, magnitude=9))
        elif auto_augment_policy == "ta_wide":
            steps.append(T.TrivialAugmentWide(interpolation=interpolation))
        elif auto_augment_policy is not None:
            steps.append(T.AutoAugment(policy=T.AutoAugmentPolicy(auto_augment_policy), interpolation=interpolation))
        steps += [T.PILToTensor(), T.ToDtype(torch.float, scale=True), T.Normalize(mean=MEAN, std=STD)]
        if random_erase_prob > 0:
            steps.append(T.RandomErasing(p=random_erase_prob))
        steps.append(T.ToPureTensor())
        self.transforms = T.Compose(steps)

    def __call__(self, img):
        return self.transforms(img)


class PresetEval:
    def __init__(self, *, crop_size, resize_size, interpolation):
        self.transforms = T.Compose([
            T.PILToTensor(), T.Resize(resize_size, interpolation=interpolation, antialias=True), T.CenterCrop(crop_size),
            T.ToDtype(torch.float, scale=True), T.Normalize(mean=MEAN, std=STD), T.ToPureTensor(),
        ])  # fmt: skip

    def __call__(self, img):
        return self.transforms(img)


def run(data, *, loader: str, epochs=3, batch_size=6, train_crop=24, val_resize=28, val_crop=24, interpolation="bilinear",
        random_erase=0.0, mixup_alpha=0.0, cutmix_alpha=0.0, auto_augment=None, seed=0, lr=0.2) -> dict:  # fmt: skip
    """Train a tiny model for ``epochs`` and evaluate it; what it saw and scored, for comparison."""
    Loader = fastload.FastLoader if loader == "fastload" else torch.utils.data.DataLoader
    torch.manual_seed(seed)
    interp = InterpolationMode(interpolation)
    train_ds = datasets.ImageFolder(f"{data}/train", PresetTrain(crop_size=train_crop, interpolation=interp, random_erase_prob=random_erase,
                                                                 auto_augment_policy=auto_augment))  # fmt: skip
    val_ds = datasets.ImageFolder(f"{data}/val", PresetEval(crop_size=val_crop, resize_size=val_resize, interpolation=interp))
    num_classes = len(train_ds.classes)
    collate_fn = None
    mix = []
    if mixup_alpha > 0:
        mix.append(T.MixUp(alpha=mixup_alpha, num_classes=num_classes))
    if cutmix_alpha > 0:
        mix.append(T.CutMix(alpha=cutmix_alpha, num_classes=num_classes))
    if mix:
        mixup_cutmix = T.RandomChoice(mix)

        def collate_fn(batch):
            return mixup_cutmix(*default_collate(batch))

    extra = {"progress": False, "cache_dir": f"{data}/.cache", "device": "cpu"} if loader == "fastload" else {}
    dist = torch.distributed.is_initialized()
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_ds) if dist else None
    val_sampler = torch.utils.data.distributed.DistributedSampler(val_ds, shuffle=False) if dist else None
    train_loader = Loader(train_ds, batch_size=batch_size, shuffle=train_sampler is None, sampler=train_sampler,
                          num_workers=2, pin_memory=True, collate_fn=collate_fn, drop_last=bool(mix), **extra)  # fmt: skip
    val_loader = Loader(val_ds, batch_size=batch_size, sampler=val_sampler, num_workers=2, pin_memory=True, **extra)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes))
    if dist:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    out = {"batches": [], "samples": [], "loss": [], "soft_targets": 0}
    for epoch in range(epochs):
        if train_sampler is not None:
            train_sampler.set_epoch(epoch)
        total, n, seen = 0.0, 0, 0
        for images, target in train_loader:
            if target.ndim == 2:
                out["soft_targets"] += 1
            loss = nn.functional.cross_entropy(model(images), target)
            opt.zero_grad()
            loss.backward()
            opt.step()
            total, n, seen = total + loss.item(), n + 1, seen + len(images)
        out["batches"].append(n)
        out["samples"].append(seen)
        out["loss"].append(total / n)
    correct = count = 0
    with torch.inference_mode():
        for images, target in val_loader:
            correct += int((model(images).argmax(1) == target).sum())
            count += len(target)
    if dist:  # the references' reduce_across_processes
        t = torch.tensor([correct, count], dtype=torch.float64)
        torch.distributed.all_reduce(t)
        correct, count = int(t[0]), int(t[1])
    out["val_count"], out["val_acc"] = count, correct / count
    for ld in (train_loader, val_loader):
        getattr(ld, "close", lambda: None)()
    return out


if __name__ == "__main__":  # under torchrun: DATA LOADER OUT [JSON of run()'s keywords]
    torch.distributed.init_process_group("gloo")
    data, which, out = sys.argv[1:4]
    kw = json.loads(sys.argv[4]) if len(sys.argv) > 4 else {}
    result = run(data, loader=which, **kw)
    rank = torch.distributed.get_rank()
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({**result, "rank": rank, "world": torch.distributed.get_world_size()}, f)
    torch.distributed.destroy_process_group()
