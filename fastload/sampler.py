"""Which samples each rank reads, in which order, batch by batch. Pure Python/NumPy.

Every epoch is a seeded permutation of *all* samples (a true global shuffle, not a
buffer shuffle). With ``world_size`` ranks the permutation is padded (or, with
``drop_last``, cut) to a multiple of ``world_size`` exactly like
``torch.utils.data.DistributedSampler``, and rank ``r`` takes positions
``r, r + world_size, ...``: equal, disjoint shares that together cover every sample,
so every rank yields the same number of batches and DDP never waits on a straggler.

With ``pad=False`` (exact evaluation) nothing is repeated: rank ``r`` takes positions
``r, r + world_size, ... < num_samples``, so ranks may differ by one sample (and so by
one batch); only use it where ranks do not meet in a collective once per batch.

``order="block"`` trades some randomness for locality, for datasets larger than memory
(see :func:`block_order` and ``docs/loader.md``, "Order"): the epoch is a random order of
runs of ``block_size`` consecutive samples, shuffled within windows of ``window`` runs, and
each rank takes a contiguous stretch of it (the same counts, padding and cuts as above).
"""

from __future__ import annotations

import dataclasses
import operator
from typing import Any, Iterator

import numpy as np

from .errors import ConfigError

#: The orders an epoch can have (``EpochSampler(order=...)``).
ORDERS = ("global", "block")


def block_order(num_samples: int, *, block_size: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """A block-shuffled permutation of ``range(num_samples)`` (FFCV's "quasi-random" order).

    The samples are cut into runs of ``block_size`` consecutive indices (the last may be
    shorter); the runs are put in a random order; then the samples are shuffled within
    each window of ``window * block_size`` consecutive positions. Every index appears
    exactly once. Reading in this order touches ``window`` runs at a time, so a reader that
    sorts what it asks the disk for (:class:`fastload.reader.ReadAhead` does) reads long
    stretches of each shard instead of scattered records; samples that are neighbours in
    storage land near each other in the epoch (at most ``window * block_size`` apart).
    """
    n, b = num_samples, block_size
    if n == 0:
        return np.empty(0, dtype=np.int64)
    runs = rng.permutation(-(-n // b)).astype(np.int64)
    starts = runs * b
    lens = np.minimum(b, n - starts)
    seq = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(n, dtype=np.int64)
    w = window * b
    grid = np.full(-(-n // w) * w, -1, dtype=np.int64)
    grid[:n] = seq
    grid = rng.permuted(grid.reshape(-1, w), axis=1).ravel()
    return grid[grid >= 0]


def block_size_for(record_bytes: float, run_bytes: int = 8 << 20) -> int:
    """A ``block_size`` whose runs of records are about ``run_bytes`` long (8 MiB: long enough to be
    read at a disk's sequential rate), for records of ``record_bytes`` on average (at least 1)."""
    return max(1, int(run_bytes // max(1.0, float(record_bytes))))


def _positive(name: str, value: Any) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a positive integer, got {value!r}")
    try:
        v = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} must be a positive integer, got {value!r}") from None
    if v < 1:
        raise ConfigError(f"{name} must be a positive integer, got {v}")
    return v


@dataclasses.dataclass(frozen=True)
class Batch:
    """One planned batch: sample indices and their positions in the epoch's global order."""

    number: int
    indices: np.ndarray
    positions: np.ndarray


class EpochSampler:
    """Deterministic epoch plans for one rank.

    Args:
        num_samples: samples in the dataset.
        batch_size: samples per batch on this rank.
        shuffle: permute every epoch (seeded by ``(seed, epoch)``); else dataset order.
        drop_last: drop the tail that does not fill a batch (and the tail that does not
            divide among ranks); else pad ranks like DistributedSampler and yield a last
            partial batch.
        seed: base seed of the permutation.
        rank: this rank, ``0 <= rank < world_size``.
        world_size: number of ranks sharing each epoch.
        pad: without ``drop_last``, repeat samples so every rank gets as many
            (DistributedSampler's padding); False gives each sample to exactly one rank.
        order: with ``shuffle``, ``"global"`` (every epoch a permutation of all samples) or
            ``"block"`` (:func:`block_order`; each rank reads a contiguous stretch of it).
        block_size: with ``order="block"``, samples per run (:func:`block_size_for` picks one
            from the records' size).
        window: with ``order="block"``, runs shuffled together.
    """

    def __init__(
        self,
        *,
        num_samples: int,
        batch_size: int,
        shuffle: bool = True,
        drop_last: bool = False,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        pad: bool = True,
        order: str = "global",
        block_size: int = 64,
        window: int = 16,
    ) -> None:
        if order not in ORDERS:
            raise ConfigError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        self.mode = order
        self.block_size = _positive("block_size", block_size)
        self.window = _positive("window", window)
        if num_samples < 0:
            raise ConfigError(f"num_samples must be >= 0, got {num_samples}")
        if world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size!r}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size!r}")
        self.num_samples = num_samples
        self.batch_size = batch_size
        self.shuffle = shuffle
        self.drop_last = drop_last
        self.seed = seed
        self.rank = rank
        self.world_size = world_size
        self.pad = pad
        if drop_last:
            self.per_rank = num_samples // world_size
            self.total = self.per_rank * world_size
        elif pad:
            self.per_rank = -(-num_samples // world_size) if num_samples else 0
            self.total = self.per_rank * world_size
        else:  # every sample once: the first num_samples % world_size ranks get one more
            self.per_rank = len(range(rank, num_samples, world_size))
            self.total = num_samples

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def order(self, epoch: int) -> np.ndarray:
        """The global order of ``epoch`` (padded or cut to ``total``), all ranks together."""
        n = self.num_samples
        if self.shuffle:
            rng = np.random.Generator(np.random.PCG64([self.seed & 0xFFFFFFFFFFFFFFFF, epoch]))
            if self.mode == "block":
                perm = block_order(n, block_size=self.block_size, window=self.window, rng=rng)
            else:
                perm = rng.permutation(n)
        else:
            perm = np.arange(n)
        if self.total <= n:
            return perm[: self.total]
        reps = -(-self.total // n)
        return np.concatenate([perm] * reps)[: self.total]

    def rank_positions(self) -> np.ndarray:
        """Positions in the global order that this rank reads.

        Every ``world_size``-th from ``rank`` (as DistributedSampler); with ``order="block"``
        a contiguous stretch of the same length, so each rank reads whole runs.
        """
        if self.mode == "block" and self.shuffle:
            if self.drop_last or self.pad:
                start = self.rank * self.per_rank
            else:  # the first num_samples % world_size ranks have one more
                base, extra = divmod(self.num_samples, self.world_size)
                start = self.rank * base + min(self.rank, extra)
            return np.arange(start, start + self.per_rank)
        return np.arange(self.rank, self.total, self.world_size)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This rank's batches of ``epoch``, starting at batch number ``start``."""
        order = self.order(epoch)
        pos = self.rank_positions()
        idx = order[pos]
        for b in range(start, len(self)):
            s = slice(b * self.batch_size, (b + 1) * self.batch_size)
            yield Batch(b, idx[s], pos[s])
