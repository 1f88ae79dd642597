#!/usr/bin/env python
"""Train a torchvision ResNet on a packed dataset with FastLoader or a torch DataLoader.

One flag switches the input pipeline; everything else stays the same, and
``fastload.profile`` says whether the loop waits for data::

    fastload sample data/sample && fastload pack data/sample data/packed
    python examples/train.py data/packed --loader fastload          # DALI (GPU if present)
    python examples/train.py data/packed --loader torch             # torchvision + DataLoader
    python examples/train.py data/packed --arch resnet18 --steps 5  # CPU smoke test

    # several GPUs (or several CPU processes with gloo):
    torchrun --nproc_per_node=8 examples/train.py data/packed --loader fastload

Loading and training overlap: ``fastload.profile`` synchronises only the current CUDA stream
(the training step's) around each wait, never the device, so DALI and the loader's copy stream
prepare the next batches while the step runs; ``--no-profile-sync`` synchronises nothing.

Under ``torchrun`` (``WORLD_SIZE`` set) it uses DistributedDataParallel: NCCL on GPUs,
gloo on CPUs. FastLoader then gives each rank an equal, disjoint share of every epoch
by itself; the DataLoader path uses a ``DistributedSampler``.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
from contextlib import nullcontext

import torch
import torch.distributed as dist
import torch.nn as nn

import fastload

log = logging.getLogger("train")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("data", help="packed dataset directory (fastload pack)")
    p.add_argument("--loader", choices=("fastload", "torch"), default="fastload", help="input pipeline (default fastload)")
    p.add_argument("--images", default=None, help="--loader torch: read this ImageFolder tree instead of the packed shards")
    p.add_argument("--arch", default="resnet50", help="torchvision model name (default resnet50)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=None, help="stop after this many steps in total")
    p.add_argument("--batch-size", type=int, default=64, help="per process")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--crop", type=int, default=224)
    p.add_argument("--workers", type=int, default=None, help="--loader torch: DataLoader workers (default: cores per process)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if present)")
    p.add_argument("--amp", action=argparse.BooleanOptionalAction, default=None, help="mixed precision (default: on for CUDA)")
    p.add_argument("--log-every", type=int, default=20)
    p.add_argument(
        "--profile-sync", action=argparse.BooleanOptionalAction, default=True,
        help="fastload.profile waits for the current CUDA stream around each wait (default on; never the whole device)",
    )  # fmt: skip
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def setup_distributed(device_arg: str | None) -> tuple[torch.device, int, int, int]:
    """Initialise DDP under torchrun; return (device, rank, world_size, local_rank)."""
    use_cuda = torch.cuda.is_available() if device_arg is None else device_arg.startswith("cuda")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    if "WORLD_SIZE" in os.environ:
        if use_cuda:
            torch.cuda.set_device(local_rank)
        dist.init_process_group(backend="nccl" if use_cuda else "gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    return device, rank, world, local_rank


def build_loader(args: argparse.Namespace, device: torch.device, world: int):
    """(loader, sampler or None, classes): FastLoader or the torchvision DataLoader baseline."""
    if args.loader == "fastload":
        loader = fastload.FastLoader(
            args.data, args.batch_size, shuffle=True, drop_last=True, train=True, crop=args.crop,
            device=str(device), channels_last=device.type == "cuda", seed=args.seed,
        )  # fmt: skip
        return loader, None, loader.classes
    import torchvision

    from fastload.bench.baselines import PackedImageDataset, train_transform

    tf = train_transform(args.crop)
    dataset = torchvision.datasets.ImageFolder(args.images, tf) if args.images else PackedImageDataset(args.data, tf)
    sampler = torch.utils.data.DistributedSampler(dataset, shuffle=True, seed=args.seed, drop_last=True) if world > 1 else None
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    workers = args.workers if args.workers is not None else max(1, cores // max(1, int(os.environ.get("LOCAL_WORLD_SIZE", world))))
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=args.batch_size, shuffle=sampler is None, sampler=sampler, num_workers=workers,
        pin_memory=device.type == "cuda", persistent_workers=workers > 0, drop_last=True,
    )  # fmt: skip
    return loader, sampler, dataset.classes


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    device, rank, world, local_rank = setup_distributed(args.device)
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format=f"[rank {rank}] %(message)s")
    torch.manual_seed(args.seed)
    loader, sampler, classes = build_loader(args, device, world)

    import torchvision

    model = getattr(torchvision.models, args.arch)(weights=None, num_classes=len(classes)).to(device)
    cuda = device.type == "cuda"
    if cuda:
        model = model.to(memory_format=torch.channels_last)
        torch.backends.cudnn.benchmark = True  # fixed input shape: pick the fastest convolutions once
    if dist.is_initialized():
        model = nn.parallel.DistributedDataParallel(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-4)
    loss_fn = nn.CrossEntropyLoss()
    amp = cuda if args.amp is None else args.amp
    amp_dtype = torch.bfloat16 if (not cuda or torch.cuda.is_bf16_supported()) else torch.float16
    scaler = torch.amp.GradScaler("cuda", enabled=amp and amp_dtype == torch.float16)
    log.info(
        "training %s on %s (%d process%s) with %s, batch %d per process, AMP %s",
        args.arch, device, world, "es" if world > 1 else "", args.loader, args.batch_size, amp_dtype if amp else "off",
    )  # fmt: skip

    # profile's sync is the current stream's only: the loader's streams keep decoding ahead of the step
    prof = fastload.profile(
        loader, log_every=args.log_every if rank == 0 else None, warmup=1, log_summary=False, sync_cuda=args.profile_sync
    )
    step, t0 = 0, time.perf_counter()
    model.train()
    try:
        for epoch in range(args.epochs):
            if sampler is not None:
                sampler.set_epoch(epoch)
            elif hasattr(loader, "set_epoch"):
                loader.set_epoch(epoch)
            for images, labels in prof:
                images = images.to(device, non_blocking=True)
                labels = labels.to(device, non_blocking=True)
                if cuda:
                    images = images.contiguous(memory_format=torch.channels_last)
                ctx = torch.autocast(device.type, dtype=amp_dtype) if amp else nullcontext()
                with ctx:
                    loss = loss_fn(model(images), labels)
                opt.zero_grad(set_to_none=True)
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
                step += 1
                if step % args.log_every == 0:
                    log.info("epoch %d step %d loss %.3f", epoch, step, loss.item())
                if args.steps is not None and step >= args.steps:
                    break
            if args.steps is not None and step >= args.steps:
                break
    finally:
        prof.close()
        if hasattr(loader, "close"):
            loader.close()
    elapsed = time.perf_counter() - t0
    if rank == 0:
        print(f"{step} steps in {elapsed:.1f} s, final loss {loss.item():.3f}" if step else "no steps run")
        print(prof.summary())
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
