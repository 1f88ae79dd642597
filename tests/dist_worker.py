"""Worker for the torchrun tests: each rank records which samples it read per epoch.

Run as ``torchrun --nproc_per_node=2 dist_worker.py PACKED OUTDIR``. Uses gloo on CPU;
an all_reduce per batch proves that every rank yields the same number of batches
(a rank with fewer would hang the collective, and the test's timeout would fail it).

``dist_worker.py PACKED OUTDIR save|resume STATE_DIR BATCH`` (under torchrun or alone) uses
accelerate's own checkpointing: ``save`` reads 2 batches of epoch 1 on each rank and
``Accelerator.save_state(STATE_DIR)`` stores the registered loader's state; ``resume``
``load_state``\ s it into a loader on this world and reads the rest of epoch 1 and epoch 2.
Each rank writes ``rankR.json``: the samples it read per epoch and its loader's state.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from conftest import decode_batch
from fastload import IMAGENET_MEAN, IMAGENET_STD, FastLoader


def _ids(x: torch.Tensor) -> list[int]:
    return [idx for _, idx in decode_batch(x.numpy(), IMAGENET_MEAN, IMAGENET_STD)]


def checkpointing(packed: str, out: Path, mode: str, state_dir: str, batch: int) -> None:
    from accelerate import Accelerator

    acc = Accelerator(cpu=True)  # under torchrun: the gloo group, this process's rank
    loader = FastLoader(packed, batch, device="cpu", crop=16, seed=7, num_threads=1)
    acc.register_for_checkpointing(loader)
    record: dict = {"world_size": acc.num_processes, "len": len(loader)}
    if mode == "save":
        loader.set_epoch(1)
        it = iter(loader)
        record["1"] = [i for _ in range(2) for i in _ids(next(it)[0])]
        record["state"] = loader.state_dict()
        acc.save_state(state_dir)
    else:
        acc.load_state(state_dir)
        record["state"] = loader.state_dict()
        start = loader.epoch
        for epoch in range(start, 3):
            loader.set_epoch(epoch)  # the usual loop: the same epoch keeps the restored position
            seen = []
            for x, _ in loader:
                seen += _ids(x)
                if acc.num_processes > 1:
                    t = torch.ones(1)
                    dist.all_reduce(t)
            record[str(epoch)] = seen
    loader.close()
    (out / f"rank{acc.process_index}.json").write_text(json.dumps(record))
    acc.wait_for_everyone()
    if dist.is_initialized():
        dist.destroy_process_group()


def main() -> None:
    packed, out = sys.argv[1], Path(sys.argv[2])
    if len(sys.argv) > 3:
        checkpointing(packed, out, sys.argv[3], sys.argv[4], int(sys.argv[5]))
        return
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
