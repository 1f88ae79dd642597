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
"""

from __future__ import annotations

import dataclasses
from typing import Iterator

import numpy as np

from .errors import ConfigError


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
    ) -> None:
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
            perm = np.random.Generator(np.random.PCG64([self.seed & 0xFFFFFFFFFFFFFFFF, epoch])).permutation(n)
        else:
            perm = np.arange(n)
        if self.total <= n:
            return perm[: self.total]
        reps = -(-self.total // n)
        return np.concatenate([perm] * reps)[: self.total]

    def rank_positions(self) -> np.ndarray:
        """Positions in the global order that this rank reads."""
        return np.arange(self.rank, self.total, self.world_size)

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This rank's batches of ``epoch``, starting at batch number ``start``."""
        order = self.order(epoch)
        pos = self.rank_positions()
        idx = order[pos]
        for b in range(start, len(self)):
            s = slice(b * self.batch_size, (b + 1) * self.batch_size)
            yield Batch(b, idx[s], pos[s])
