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

``order="shards"`` keeps the working set of a node's cache small, for datasets read from an
object store through a cache smaller than them (:func:`fastload.shuffle.shards.window_order`,
``docs/loader.md``, "Order"): the shards are permuted and the samples of a sliding window of
``window`` consecutive shards are mixed, so at most ``window`` shards are needed at a time; the
ranks share it as the global shuffle (every ``world_size``-th position), so all ranks of a node
read the same stretch of it, from the same shards. :func:`choose_order` picks it for a URL whose
dataset is larger than ``cache_limit``.

Resuming: a resumed epoch is described by the positions of its order that all ranks
together have consumed (sorted ``[start, stop)`` intervals, :meth:`EpochSampler.consumed_after`),
independent of the world size that consumed them. :meth:`EpochSampler.resume` makes the
rest of that epoch the *remainder*: the unconsumed positions, in the order's order, shared
among this sampler's ranks by the rules above (padded from the head of the epoch's order,
cut, or exact with ``pad=False``). A sample keeps its position in the order, so its crop
and flip (:mod:`fastload.augment`) are the same whatever the world size.
"""

from __future__ import annotations

import dataclasses
import logging
import operator
from typing import Any, Iterator, Sequence

import numpy as np

from .errors import ConfigError, as_int
from .shuffle.shards import window_for, window_order

log = logging.getLogger(__name__)

#: The orders an epoch can have (``EpochSampler(order=...)``).
ORDERS = ("global", "block", "shards")


def block_order(num_samples: int, *, block_size: int, window: int, rng: np.random.Generator) -> np.ndarray:
    """A block-shuffled permutation of ``range(num_samples)`` (FFCV's "quasi-random" order).

    The samples are cut into runs of ``block_size`` consecutive indices (the last may be
    shorter); the runs are put in a random order; then the samples are shuffled within
    each window of ``window * block_size`` consecutive positions. Every index appears
    exactly once. Reading in this order touches ``window`` runs at a time, so a reader that
    sorts what it asks the disk for (:class:`fastload.reader.ReadAhead` does) reads long
    stretches of each shard instead of scattered records; samples that are neighbours in
    storage land near each other in the epoch (at most ``window * block_size`` apart).
    ``block_size`` above ``num_samples`` is read as ``num_samples``, ``window`` above the number
    of runs as that number (the memory it takes is bounded by the epoch, not by the arguments).
    """
    n = num_samples
    if n == 0:
        return np.empty(0, dtype=np.int64)
    # A run longer than the dataset is the dataset, a window wider than the runs is all of them: the
    # shuffle's grid (window * block_size positions) is never larger than the epoch rounded up to a run.
    b = min(block_size, n)
    nruns = -(-n // b)
    runs = rng.permutation(nruns).astype(np.int64)
    starts = runs * b
    lens = np.minimum(b, n - starts)
    seq = np.repeat(starts - (np.cumsum(lens) - lens), lens) + np.arange(n, dtype=np.int64)
    w = min(window, nruns) * b
    grid = np.full(-(-n // w) * w, -1, dtype=np.int64)
    grid[:n] = seq
    grid = rng.permuted(grid.reshape(-1, w), axis=1).ravel()
    return grid[grid >= 0]


#: The most samples an epoch plan holds: its permutation is in memory (8 bytes a sample, 64 GiB here).
MAX_EPOCH_SAMPLES = 2**33
#: The most samples one batch may hold on one rank (what DALI's pipeline is sized for).
MAX_BATCH = 65536
#: Seeds are 64-bit: every bit of one in this range decides the order, crops and flips.
MAX_SEED = 2**64 - 1


def check_batch(n: int, *, what: str = "batch_size") -> int:
    """``n`` samples in one batch, at most :data:`MAX_BATCH` (ConfigError naming ``what`` otherwise)."""
    return as_int(what, n, lo=1, hi=MAX_BATCH, hint=" (samples in one batch on one rank)")


def block_size_for(record_bytes: float, run_bytes: int = 8 << 20) -> int:
    """A ``block_size`` whose runs of records are about ``run_bytes`` long (8 MiB: long enough to be
    read at a disk's sequential rate), for records of ``record_bytes`` on average (at least 1)."""
    return max(1, int(run_bytes // max(1.0, float(record_bytes))))


def check_order(order: Any, block_size: Any, window: Any, user_batches: Any) -> tuple[str | None, int | None, int | None]:
    """``FastLoader``'s ``order``, ``block_size`` and ``window`` checked before the dataset is opened
    (``order=None``: the default, decided by :func:`choose_order` once the dataset is known)."""
    if order is not None and (not isinstance(order, str) or order not in ORDERS):
        raise ConfigError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
    if order != "block" and block_size is not None:
        raise ConfigError(f"block_size applies only with order='block', got order={order!r}")
    if order not in ("block", "shards") and window is not None:
        raise ConfigError(f"window applies only with order='block' or 'shards', got order={order!r}")
    if order not in (None, "global") and user_batches is not None:
        raise ConfigError(f"order={order!r} is FastLoader's own order: it excludes sampler and batch_sampler")
    if block_size is not None:
        block_size = as_int("block_size", block_size, lo=1, hint=" (samples per run) or None")
    if window is not None:
        window = as_int("window", window, lo=1, hint=" (runs or shards mixed together) or None")
    return order, block_size, window


def shard_layout(dataset: Any) -> list[int]:
    """The samples of each shard of ``dataset`` (its manifest's, in storage order), or a ConfigError
    where its indices are not its shards' (a Subset or ConcatDataset of packed datasets)."""
    shards = getattr(getattr(dataset, "manifest", None), "shards", None) or []
    counts = [int(s.count) for s in shards]
    firsts = [int(s.first) for s in shards]
    if not counts or firsts != [sum(counts[:k]) for k in range(len(counts))] or sum(counts) != len(dataset):
        raise ConfigError("order='shards' reads a packed dataset's own shards; this dataset's indices are not its shards' (use order='global')")
    return counts


def choose_order(order: str | None, block_size: int | None, window: int | None, dataset: Any, *, shuffle: bool,
                 rank_batch: int, prefetch: int) -> tuple[str, int | None, int | None]:  # fmt: skip
    """The order a loader reads ``dataset`` in, with its defaults filled in.

    A URL read in whole shards through a cache smaller than the dataset gets ``"shards"`` by
    default (one log line says why), and refuses ``"global"`` and ``"block"`` (whose batches
    read nearly every shard: the cache would grow to the dataset). ``"shards"``' window is then
    the widest whose shards, for ``rank_batch`` samples a step (``batch_size * world_size``)
    times the batches in flight, fit in the limit. Without a limit it is 16 shards.
    """
    remote = getattr(dataset, "remote", None)
    over = bool(shuffle) and remote is not None and remote.fetch == "shards" and not remote.fits()
    chosen = order is None and over
    if order is None:
        order = "shards" if over else "global"
    elif over and order in ("global", "block"):
        total = sum(int(s.bytes) for s in dataset.manifest.shards)
        raise ConfigError(
            f"order={order!r} with fetch='shards' reads nearly every shard in every batch, so the node cache would "
            f"grow to the dataset ({total} bytes of shards) past cache_limit={remote.limit}: choose order='shards' "
            "(the default here: shards shuffled, samples mixed within a window of shards that fits the limit), "
            "fetch='records' (a global shuffle by range requests), or a cache_limit of at least the dataset"
        )
    if order == "block":
        if block_size is None:
            block_size = block_size_for(sum(sh.bytes for sh in dataset.manifest.shards) / len(dataset))
        return order, block_size, 16 if window is None else window
    if order != "shards":
        return order, block_size, window
    counts = shard_layout(dataset)
    room = None if remote is None else remote.room_for_shards()
    if window is None and room is None:
        window = 16
    elif window is None:
        span = rank_batch * remote.batches_held(prefetch)
        window = window_for([int(s.bytes) for s in dataset.manifest.shards], counts, room, span)
        if window == 0:
            window = 1
            log.warning(
                "FastLoader: cache_limit=%d holds less than the shards of %d samples in flight: windows of one "
                "shard; the cache may pass its limit by the shards open (fetch='records' needs no more than "
                "the batches in flight)", remote.limit, span,
            )  # fmt: skip
    if chosen:
        log.info(
            "FastLoader: order='shards' with a window of %d of %d shards, because the dataset is larger than "
            "cache_limit=%d and a global shuffle reads every shard in every batch; for a global shuffle choose "
            "fetch='records' (or a cache_limit of the dataset's size), or set order= and window= yourself",
            window, len(counts), remote.limit,
        )  # fmt: skip
    return order, block_size, window


def order_options(order: str, block_size: int | None, window: int | None, dataset: Any) -> dict[str, Any]:
    """The keywords :class:`EpochSampler` takes for ``order`` beyond its name, for ``dataset``."""
    if order == "block":
        return {"block_size": block_size, "window": window}
    if order == "shards":
        return {"window": window, "shard_sizes": shard_layout(dataset)}
    return {}


def _check_layout(shard_sizes: Sequence[int], num_samples: int) -> np.ndarray:
    """``shard_sizes`` as a read-only int64 array of positive counts that add up to ``num_samples``."""
    try:
        c = np.array([operator.index(v) for v in shard_sizes], dtype=np.int64)
    except (TypeError, OverflowError):
        raise ConfigError(f"shard_sizes must be a list of sample counts, got {shard_sizes!r:.60}") from None
    if (c < 1).any() or int(c.sum()) != num_samples:
        raise ConfigError(f"shard_sizes must be counts >= 1 adding up to num_samples={num_samples}, got {c.tolist()!r:.60}")
    c.setflags(write=False)
    return c


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
        order: with ``shuffle``, ``"global"`` (every epoch a permutation of all samples),
            ``"block"`` (:func:`block_order`; each rank reads a contiguous stretch of it) or
            ``"shards"`` (:func:`fastload.shuffle.shards.window_order`; shared as ``"global"``).
        block_size: with ``order="block"``, samples per run (:func:`block_size_for` picks one
            from the records' size).
        window: with ``order="block"``, runs shuffled together; with ``order="shards"``, shards.
        shard_sizes: with ``order="shards"``, the samples of each shard in storage order (the
            manifest's ``count`` values); needed to plan an epoch, not to count or share one.
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
        shard_sizes: Sequence[int] | None = None,
    ) -> None:
        if order not in ORDERS:
            raise ConfigError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        self.mode = order
        num_samples = as_int("num_samples", num_samples, lo=0, hi=MAX_EPOCH_SAMPLES)
        self.block_size = as_int("block_size", block_size, lo=1)
        self.window = as_int("window", window, lo=1)
        self.shard_sizes = None if shard_sizes is None else _check_layout(shard_sizes, num_samples)
        seed = as_int("seed", seed, lo=0, hi=MAX_SEED)
        if batch_size < 1:
            raise ConfigError(f"batch_size must be >= 1, got {batch_size!r}")
        if world_size < 1:
            raise ConfigError(f"world_size must be >= 1, got {world_size!r}")
        if not 0 <= rank < world_size:
            raise ConfigError(f"rank must be in [0, world_size={world_size}), got {rank!r}")
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
        self.resumed: tuple[int, np.ndarray] | None = None  # (epoch, consumed intervals) of a resumed epoch
        self._cache: tuple[int, np.ndarray] | None = None

    def __len__(self) -> int:
        """Batches per epoch on this rank (of an epoch read from its start)."""
        if self.drop_last:
            return self.per_rank // self.batch_size
        return -(-self.per_rank // self.batch_size)

    def base_order(self, epoch: int) -> np.ndarray:
        """The permutation of ``range(num_samples)`` of ``epoch``, before padding or cuts.

        It depends on ``(seed, epoch, shuffle, order, block_size, window)`` (and with
        ``order="shards"`` the shard layout) only, never on the world size or batch size:
        position ``p`` of it is the same sample on any world.
        """
        cached = self._cache
        if cached is not None and cached[0] == epoch:
            return cached[1]
        n = self.num_samples
        if self.shuffle:
            rng = np.random.Generator(np.random.PCG64([self.seed, epoch]))
            if self.mode == "block":
                perm = block_order(n, block_size=self.block_size, window=self.window, rng=rng)
            elif self.mode == "shards":
                if self.shard_sizes is None:
                    raise ConfigError("order='shards' needs shard_sizes (the samples of each shard) to plan an epoch")
                perm = window_order(self.shard_sizes, self.window, rng)
            else:
                perm = rng.permutation(n)
        else:
            perm = np.arange(n)
        perm = np.asarray(perm, dtype=np.int64)
        perm.setflags(write=False)
        self._cache = (epoch, perm)
        return perm

    def order(self, epoch: int) -> np.ndarray:
        """The global order of ``epoch`` (padded or cut to ``total``), all ranks together."""
        perm = self.base_order(epoch)
        n = self.num_samples
        if self.total <= n:
            return perm[: self.total]
        reps = -(-self.total // n)
        return np.concatenate([perm] * reps)[: self.total]

    def rank_positions(self) -> np.ndarray:
        """Positions in the global order that this rank reads (of an epoch read from its start).

        Every ``world_size``-th from ``rank`` (as DistributedSampler); with ``order="block"``
        a contiguous stretch of the same length, so each rank reads whole runs.
        """
        return self._slots(self.num_samples, self.rank)

    # ---------------------------------------------------------------- sharing (fresh or resumed)
    def _slots(self, m: int, rank: int) -> np.ndarray:
        """The slots ``rank`` reads when ``m`` samples are shared among the ranks (0..m-1 real, above: padding)."""
        w = self.world_size
        if self.drop_last:
            per, total = m // w, (m // w) * w
        elif self.pad:
            per = -(-m // w) if m else 0
            total = per * w
        else:
            per, total = len(range(rank, m, w)), m
        if self.mode == "block" and self.shuffle:
            if self.drop_last or self.pad:
                start = rank * per
            else:  # the first m % world_size ranks have one more
                base, extra = divmod(m, w)
                start = rank * base + min(rank, extra)
            return np.arange(start, start + per, dtype=np.int64)
        return np.arange(rank, total, w, dtype=np.int64)

    def _count(self, samples: int) -> int:
        if self.drop_last:
            return samples // self.batch_size
        return -(-samples // self.batch_size)

    def _base(self, epoch: int, consumed: Any) -> np.ndarray:
        """Consumed intervals ``[k, 2]`` of ``epoch``: ``consumed`` if given, else this sampler's resume."""
        if consumed is not None:
            return check_intervals("consumed", consumed, self.num_samples)
        if self.resumed is not None and self.resumed[0] == epoch:
            return self.resumed[1]
        return np.empty((0, 2), dtype=np.int64)

    def _remaining(self, base: np.ndarray) -> np.ndarray:
        """Positions of the order not in ``base``, ascending."""
        if len(base) == 0:
            return np.arange(self.num_samples, dtype=np.int64)
        return np.flatnonzero(~interval_mask(base, self.num_samples)).astype(np.int64)

    def _layout(self, epoch: int, rank: int, base: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(indices, positions)`` of everything ``rank`` reads of ``epoch`` after ``base`` was consumed."""
        order = self.base_order(epoch)
        rem = self._remaining(base)
        m, n = len(rem), self.num_samples
        slots = self._slots(m, rank)
        real = slots < m
        pos = np.where(real, rem[np.minimum(slots, max(m - 1, 0))] if m else 0, n + slots - m)
        idx = np.where(real, order[pos % n] if n else pos, order[(slots - m) % n] if n else pos)
        return idx.astype(np.int64), pos.astype(np.int64)

    def resume(self, epoch: int | None, consumed: Any = None) -> None:
        """Read ``epoch`` from now on as the remainder after ``consumed`` (intervals of positions
        of its order); ``epoch=None`` or no interval: every epoch from its start."""
        if epoch is None:
            self.resumed = None
            return
        base = check_intervals("consumed", [] if consumed is None else consumed, self.num_samples)
        self.resumed = (operator.index(epoch), base) if len(base) else None

    def num_batches(self, epoch: int, consumed: Any = None) -> int:
        """Batches this rank reads of ``epoch`` (its remainder, if resumed or ``consumed`` is given)."""
        return len(self) - self.first_batch(epoch, consumed)

    def first_batch(self, epoch: int, consumed: Any = None, rank: int | None = None) -> int:
        """The number of the first batch of ``epoch`` (0, or for a resumed epoch ``len(self)`` minus
        the batches of its remainder: the remainder's batches are numbered up to ``len(self)``, as
        the last batches of an epoch, so a client counting the batches of the epoch ends it in time)."""
        base = self._base(epoch, consumed)
        if len(base) == 0:
            return 0
        r = self.rank if rank is None else rank
        full = self._count(len(self._slots(self.num_samples, r)))
        return full - self._count(len(self._slots(len(self._remaining(base)), r)))

    def rank_indices(self, epoch: int) -> np.ndarray:
        """The sample indices this rank reads of ``epoch``, in order (a resumed epoch: its remainder)."""
        idx, _ = self._layout(epoch, self.rank, self._base(epoch, None))
        return idx  # with drop_last, the batches are its first len(...) // batch_size * batch_size

    def consumed_after(self, epoch: int, done: int | Sequence[int], consumed: Any = None) -> list[list[int]]:
        """The positions of ``epoch``'s order consumed once the ranks have read ``done`` batches of
        this plan (one count for every rank, or one per rank in rank order), with what was consumed
        before it: sorted, disjoint ``[start, stop)`` intervals, JSON-safe. Padding is not counted:
        a padded slot repeats a sample, it does not consume one."""
        base = self._base(epoch, consumed)
        counts = [operator.index(done)] * self.world_size if not isinstance(done, Sequence) else [operator.index(d) for d in done]
        if len(counts) != self.world_size:
            raise ConfigError(f"need one batch count per rank ({self.world_size}), got {len(counts)}")
        n = self.num_samples
        mask = interval_mask(base, n)
        rem = self._remaining(base)
        m = len(rem)
        for rank, k in enumerate(counts):
            k -= self.first_batch(epoch, base, rank=rank)  # batches of the remainder read
            if k <= 0:
                continue
            slots = self._slots(m, rank)[: k * self.batch_size]
            mask[rem[slots[slots < m]]] = True
        return intervals_of(mask)

    def batches(self, epoch: int, start: int = 0, rank: int | None = None) -> Iterator[Batch]:
        """This rank's batches of ``epoch`` (or those of ``rank`` of the same world), starting at batch
        number ``start``.

        A resumed epoch (:meth:`resume`) yields the batches of its remainder, numbered from
        :meth:`first_batch` to ``len(self) - 1``.
        """
        r = self.rank if rank is None else operator.index(rank)
        if not 0 <= r < self.world_size:
            raise ConfigError(f"rank must be in [0, world_size={self.world_size}), got {rank!r}")
        base = self._base(epoch, None)
        idx, pos = self._layout(epoch, r, base)
        first = self.first_batch(epoch, base, rank=r)
        for b in range(max(start, first), first + self._count(len(idx))):
            s = slice((b - first) * self.batch_size, (b - first + 1) * self.batch_size)
            yield Batch(b, idx[s], pos[s])


def interval_mask(intervals: np.ndarray, n: int) -> np.ndarray:
    """A boolean mask of ``range(n)``, True inside the ``[start, stop)`` rows of ``intervals``."""
    d = np.zeros(n + 1, dtype=np.int64)
    iv = np.asarray(intervals, dtype=np.int64).reshape(-1, 2)
    np.add.at(d, iv[:, 0], 1)
    np.add.at(d, iv[:, 1], -1)
    return np.cumsum(d[:n]) > 0


def intervals_of(mask: np.ndarray) -> list[list[int]]:
    """The True runs of a boolean mask as sorted ``[start, stop)`` pairs of Python ints."""
    m = np.concatenate([[False], np.asarray(mask, dtype=bool), [False]])
    edges = np.flatnonzero(m[1:] != m[:-1])
    return [[int(a), int(b)] for a, b in zip(edges[0::2], edges[1::2])]


def check_intervals(name: str, value: Any, n: int) -> np.ndarray:
    """``value`` (a list of ``[start, stop)`` pairs) as an ``[k, 2]`` array, checked against ``range(n)``.

    Raises:
        ConfigError: not a list of integer pairs with ``0 <= start < stop <= n``, ascending and disjoint.
    """
    if isinstance(value, np.ndarray) and value.ndim == 2 and value.shape[1] == 2 and value.dtype == np.int64:
        rows = value
    else:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{name} must be a list of [start, stop] pairs, got {value!r:.60}")
        flat: list[int] = []
        for pair in value:
            if not isinstance(pair, (list, tuple)) or len(pair) != 2 or any(
                isinstance(v, bool) or not isinstance(v, (int, np.integer)) for v in pair
            ):
                raise ConfigError(f"{name} must be a list of [start, stop] integer pairs, got the item {pair!r:.60}")
            flat += [int(pair[0]), int(pair[1])]
        outside = [v for v in flat if not 0 <= v <= n]
        if outside:  # before NumPy, which cannot hold every Python int
            raise ConfigError(f"{name} must hold [start, stop) pairs within 0..{n}, got {outside[0]}")
        rows = np.array(flat, dtype=np.int64).reshape(-1, 2)
    if len(rows):
        a, b = rows[:, 0], rows[:, 1]
        if a.min() < 0 or b.max() > n or (b <= a).any() or (a[1:] < b[:-1]).any():
            raise ConfigError(
                f"{name} must hold ascending, disjoint [start, stop) pairs with 0 <= start < stop <= {n}, "
                f"got {rows.tolist()!r:.80}"
            )
    return rows
