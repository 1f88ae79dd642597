"""Worker for the torchrun test: each rank records which samples it read per epoch.

Run as ``torchrun --nproc_per_node=2 dist_worker.py PACKED OUTDIR``. Uses gloo on CPU;
an all_reduce per batch proves that every rank yields the same number of batches
(a rank with fewer would hang the collective, and the test's timeout would fail it).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from conftest import decode_batch
from fastload import IMAGENET_MEAN, IMAGENET_STD, FastLoader


def main() -> None:
    packed, out = sys.argv[1], Path(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    record: dict = {}
    with FastLoader(packed, 4, device="cpu", crop=16, seed=7, num_threads=1) as loader:
        assert loader.rank == rank and loader.world_size == dist.get_world_size()
        record["batches"] = len(loader)
        for epoch in range(2):
            loader.set_epoch(epoch)
            seen = []
            for x, _ in loader:
                seen += [idx for _, idx in decode_batch(x.numpy(), IMAGENET_MEAN, IMAGENET_STD)]
                t = torch.ones(1)
                dist.all_reduce(t)
            record[str(epoch)] = seen
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
