"""An ImageNet training script shaped like pytorch/examples ``imagenet/main.py``, on FastLoader.

It does what that script does with its data, written for this test suite: two
torchvision ``ImageFolder``s (``DATA/train``, ``DATA/val``) with its training transforms
(``RandomResizedCrop``, ``RandomHorizontalFlip``, ``ToTensor``, ``Normalize``) and its
evaluation transforms (``Resize``, ``CenterCrop``, ``ToTensor``, ``Normalize``), at a
small size; under ``torchrun`` a ``DistributedSampler`` for each (the validation one
without shuffling and with ``drop_last``), ``set_epoch`` on the training one every
epoch; loaders built with that script's arguments (``batch_size``, ``shuffle=(train_sampler
is None)``, ``num_workers``, ``pin_memory=True``, ``sampler=``), but ``fastload.FastLoader(``
where it has ``torch.utils.data.DataLoader(``; accuracy bookkeeping with
``len(val_loader.sampler)``; and the samples the distributed validation leaves out
evaluated through ``Subset(val_loader.dataset, ...)`` in a plain ``DataLoader``.

Run: ``python imagenet_style.py DATA --record OUT.json`` or
``torchrun --nproc_per_node=2 imagenet_style.py DATA --record OUT.json`` (gloo on CPU).
``--steps`` caps the training steps per epoch (a smoke run). With ``--record``, each
rank writes ``OUT.rankR.json``: the samples each step and each evaluation read, decoded
from their pixels (the test images encode their index, see ``conftest.encode_color``).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.utils.data import Subset
from torchvision import datasets, transforms

import fastload

log = logging.getLogger("imagenet_style")

MEAN, STD = [0.485, 0.456, 0.406], [0.229, 0.224, 0.225]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description="ImageNet-style training on FastLoader")
    p.add_argument("data", help="folder with train/ and val/ ImageFolders")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="training steps per epoch at most")
    p.add_argument("-b", "--batch-size", type=int, default=4, help="per process")
    p.add_argument("-j", "--workers", type=int, default=2, help="DataLoader workers (FastLoader ignores them)")
    p.add_argument("--crop", type=int, default=32, help="RandomResizedCrop / CenterCrop size")
    p.add_argument("--resize", type=int, default=36, help="evaluation Resize size")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--record", default=None, help="write what each rank read to RECORD with .rankN.json")
    return p.parse_args(argv)


def small_net(num_classes: int) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, num_classes)
    )


def indices(images: torch.Tensor) -> list[int]:
    """The sample index each image encodes (the test images' colours; see conftest.encode_color)."""
    from conftest import decode_batch

    return [idx for _, idx in decode_batch(images.float().cpu().numpy(), MEAN, STD)]


def train(loader, model, criterion, optimizer, steps: int | None, record: list) -> None:
    model.train()
    for i, (images, target) in enumerate(loader):
        if steps is not None and i >= steps:
            break
        images, target = images.to("cpu"), target.to("cpu")
        loss = criterion(model(images), target)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if not math.isfinite(loss.item()):
            raise RuntimeError(f"loss is {loss.item()} at step {i}")
        record.append({"indices": indices(images), "labels": target.tolist(), "batch": len(images)})


def evaluate(loader, model, record: list) -> tuple[int, int]:
    """(correct top-1, samples) over ``loader``; what it read goes to ``record``."""
    correct = seen = 0
    with torch.no_grad():
        for images, target in loader:
            out = model(images.to("cpu"))
            correct += int((out.argmax(1) == target.to("cpu")).sum())
            seen += len(target)
            record += [{"index": i, "label": int(t)} for i, t in zip(indices(images), target)]
    return correct, seen


def validate(val_loader, model, args, distributed: bool, world_size: int, record: dict) -> dict:
    model.eval()
    main_part: list = []
    correct, seen = evaluate(val_loader, model, main_part)
    if distributed:
        totals = torch.tensor([correct, seen], dtype=torch.int64)
        dist.all_reduce(totals)
        correct, seen = (int(v) for v in totals)
    covered = len(val_loader.sampler) * world_size
    # pytorch/examples' progress meter counts the extra remainder pass as one more "batch"
    progress_total = len(val_loader) + (distributed and covered < len(val_loader.dataset))
    rest: list = []
    if distributed and covered < len(val_loader.dataset):
        aux = torch.utils.data.DataLoader(
            Subset(val_loader.dataset, range(covered, len(val_loader.dataset))),
            batch_size=args.batch_size, shuffle=False, num_workers=args.workers, pin_memory=True,
        )  # fmt: skip
        c, s = evaluate(aux, model, rest)
        correct, seen = correct + c, seen + s
    record.update(main=main_part, rest=rest, sampler_len=len(val_loader.sampler), dataset_len=len(val_loader.dataset),
                  progress_total=progress_total, evaluated=seen, top1=100.0 * correct / max(1, seen))  # fmt: skip
    return record


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    distributed = int(os.environ.get("WORLD_SIZE", "1")) > 1
    if distributed:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if distributed else 0
    world_size = dist.get_world_size() if distributed else 1
    logging.basicConfig(level=logging.INFO, format=f"[rank {rank}] %(message)s")
    torch.manual_seed(0)

    normalize = transforms.Normalize(mean=MEAN, std=STD)
    train_dataset = datasets.ImageFolder(
        os.path.join(args.data, "train"),
        transforms.Compose([
            transforms.RandomResizedCrop(args.crop), transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize,
        ]),
    )  # fmt: skip
    val_dataset = datasets.ImageFolder(
        os.path.join(args.data, "val"),
        transforms.Compose([
            transforms.Resize(args.resize), transforms.CenterCrop(args.crop), transforms.ToTensor(), normalize,
        ]),
    )  # fmt: skip
    if distributed:
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset)
        val_sampler = torch.utils.data.distributed.DistributedSampler(val_dataset, shuffle=False, drop_last=True)
    else:
        train_sampler = val_sampler = None

    # the only change from the DataLoader version: fastload.FastLoader( for torch.utils.data.DataLoader(
    train_loader = fastload.FastLoader(
        train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
        num_workers=args.workers, pin_memory=True, sampler=train_sampler,
    )  # fmt: skip
    val_loader = fastload.FastLoader(
        val_dataset, batch_size=args.batch_size, shuffle=False,
        num_workers=args.workers, pin_memory=True, sampler=val_sampler,
    )  # fmt: skip

    model = small_net(len(train_dataset.classes))
    if distributed:
        model = nn.parallel.DistributedDataParallel(model)
    criterion = nn.CrossEntropyLoss()
    optimizer = torch.optim.SGD(model.parameters(), args.lr, momentum=0.9, weight_decay=1e-4)

    record: dict = {"rank": rank, "world_size": world_size, "train_len": len(train_loader), "train": {}, "val": {},
                    "classes": train_loader.dataset.classes}  # fmt: skip
    for epoch in range(args.epochs):
        if distributed:
            train_sampler.set_epoch(epoch)
        record["train"][epoch] = steps = []
        train(train_loader, model, criterion, optimizer, args.steps, steps)
        record["val"][epoch] = validate(val_loader, model, args, distributed, world_size, {})
        log.info("epoch %d: %d steps, top-1 %.1f%% of %d", epoch, len(steps), record["val"][epoch]["top1"],
                 record["val"][epoch]["evaluated"])  # fmt: skip
    train_loader.close()
    val_loader.close()
    if args.record:
        Path(f"{args.record}.rank{rank}.json").write_text(json.dumps(record))
    if distributed:
        dist.barrier()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
