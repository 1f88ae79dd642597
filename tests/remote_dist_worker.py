"""Worker for the two-node torchrun test of ``s3://`` datasets: ranks 0-1 are node 0, ranks 2-3 node 1.

Run as ``torchrun --nproc_per_node=4 remote_dist_worker.py URL OPTIONS_JSON CACHE_BASE OUTDIR``. Each
rank reads two epochs from ``URL`` through the cache ``CACHE_BASE/node{rank // 2}`` (gloo on CPU, an
all_reduce per batch: a rank with fewer batches would hang it) and writes ``rankR.json``: the sample
indices it read per epoch, from the batches' pixels.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from conftest import decode_batch
from fastload import IMAGENET_MEAN, IMAGENET_STD, FastLoader


def main() -> None:
    url, options, base, out = sys.argv[1], json.loads(sys.argv[2]), Path(sys.argv[3]), Path(sys.argv[4])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = FastLoader(url, 3, device="cpu", crop=16, train=False, seed=5, num_threads=1, storage_options=options,
                        cache_dir=base / f"node{rank // 2}")  # fmt: skip
    record = {"rank": rank, "world": dist.get_world_size()}
    for epoch in range(2):
        loader.set_epoch(epoch)
        seen = []
        for x, _ in loader:
            seen += [idx for _, idx in decode_batch(x.numpy(), IMAGENET_MEAN, IMAGENET_STD)]
            t = torch.ones(1)
            dist.all_reduce(t)
        record[str(epoch)] = seen
    loader.close()
    (out / f"rank{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    main()
