"""The loader FastLoader becomes for a COCO or VOC dataset: its items rebuilt from the cache in threads, batched by the user's sampler and collate_fn.

``FastLoader(dataset, ...)`` where ``dataset`` is a torchvision ``CocoDetection``,
``VOCSegmentation`` or ``VOCDetection`` (plain, under ``Subset``, v2-wrapped) returns an
:class:`AnnotatedLoader` (:mod:`fastload.annotated` packs and rebuilds the items). Its batches are
what a DataLoader with the same ``batch_size``, ``shuffle``, ``sampler``, ``batch_sampler``,
``drop_last`` and ``collate_fn`` gives: ``collate_fn(items)`` of the items the sampler names, each
item what ``dataset[i]`` returns. The images are decoded (PIL) by ``num_threads`` threads, one batch
ahead of the loop. The random steps of the dataset's transforms that :mod:`fastload.detaug` translates
draw from ``(seed, epoch, place in the epoch, step)``, so the same seed gives the same batches
whatever the number of threads.
"""

from __future__ import annotations

import logging
import os
import reprlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator

import torch

from .annotated import AnnotatedItems, AnnotatedPlan, check_transforms
from .errors import ConfigError, as_int

log = logging.getLogger(__name__)

__all__ = ["AnnotatedLoader", "annotated_loader"]

#: DataLoader's arguments kept as attributes and otherwise unused (no worker processes here).
_KEPT = ("num_workers", "pin_memory", "timeout", "worker_init_fn", "multiprocessing_context", "prefetch_factor",
         "persistent_workers", "pin_memory_device", "in_order")  # fmt: skip
#: FastLoader's own keywords this path takes.
_TAKEN = ("seed", "num_threads", "cache_dir", "progress")
#: DataLoader's positional order after ``dataset``.
_ORDER = ("batch_size", "shuffle", "sampler", "batch_sampler", "num_workers", "collate_fn", "pin_memory", "drop_last",
          "timeout", "worker_init_fn", "multiprocessing_context", "generator")  # fmt: skip


class _EpochPermutation(torch.utils.data.Sampler):
    """``shuffle=True``'s order: a permutation of ``n`` items drawn from ``(seed, epoch)``."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[int]:
        g = torch.Generator()
        g.manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=g).tolist())

    def __len__(self) -> int:
        return self.n


class AnnotatedLoader:
    """Batches of a COCO/VOC dataset's items as a DataLoader makes them (see the module docstring).

    Args:
        plan: the dataset, as :func:`fastload.annotated.annotated_plan` found it.
        batch_size, shuffle, sampler, batch_sampler, drop_last, collate_fn, generator: DataLoader's.
            ``collate_fn=None`` is DataLoader's ``default_collate``.
        seed: seeds ``shuffle``'s order and the transforms' random steps (default: ``generator.initial_seed()``, else 0).
        num_threads: decoding threads (default: the cores, at most 8).
        cache_dir, progress: where the entry is kept, and whether packing shows progress.

    Raises:
        ConfigError: DataLoader's exclusions (``batch_sampler`` with ``batch_size``, ``shuffle``,
            ``sampler`` or ``drop_last``; ``shuffle`` with ``sampler``), a step of the dataset's
            transforms FastLoader does not run (named, with the route), a bad value.
    """

    def __init__(self, plan: AnnotatedPlan, batch_size: int | None = 1, shuffle: bool | None = None, sampler: Any = None,
                 batch_sampler: Any = None, collate_fn: Callable[[list], Any] | None = None, drop_last: bool = False,
                 generator: torch.Generator | None = None, seed: int | None = None, num_threads: int | None = None,
                 cache_dir: Any = None, progress: bool = True, **kept: Any) -> None:  # fmt: skip
        check_transforms(plan)
        if batch_sampler is not None and (batch_size not in (None, 1) or shuffle or sampler is not None or drop_last):
            raise ConfigError("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last (as in DataLoader)")
        if sampler is not None and shuffle:
            raise ConfigError("sampler option is mutually exclusive with shuffle (as in DataLoader)")
        if collate_fn is not None and not callable(collate_fn):
            raise ConfigError(f"collate_fn must be callable, got {reprlib.repr(collate_fn)}")
        self.plan = plan
        self.dataset = plan.obj
        self.seed = as_int("seed", seed if seed is not None else (generator.initial_seed() % (1 << 31) if generator is not None else 0), lo=0)
        self.num_threads = min(8, os.cpu_count() or 1) if num_threads is None else as_int("num_threads", num_threads, lo=1)
        if batch_sampler is None:
            self.batch_size = as_int("batch_size", batch_size, lo=1) if batch_size is not None else None
            if self.batch_size is None:
                raise ConfigError("batch_size=None (no batching) is not supported; give a batch size")
            if sampler is None:
                sampler = _EpochPermutation(len(plan), self.seed) if shuffle else torch.utils.data.SequentialSampler(range(len(plan)))
            batch_sampler = torch.utils.data.BatchSampler(sampler, self.batch_size, bool(drop_last))
        else:
            self.batch_size = None
        self.sampler = getattr(batch_sampler, "sampler", sampler)
        self.batch_sampler = batch_sampler
        self.drop_last = bool(drop_last)
        self.collate_fn = collate_fn if collate_fn is not None else torch.utils.data.default_collate
        self.generator = generator
        for k, v in kept.items():
            setattr(self, k, v)
        self.epoch = 0
        self._epoch_set = False
        self.items: AnnotatedItems = plan.open(cache_dir=cache_dir, progress=progress)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order next (passed on to a sampler that has ``set_epoch``)."""
        self.epoch = as_int("epoch", epoch, lo=0)
        self._epoch_set = True

    def __len__(self) -> int:
        return len(self.batch_sampler)

    def _batches(self) -> Iterator[list[int]]:
        for s in (self.batch_sampler, self.sampler):
            if hasattr(s, "set_epoch"):
                s.set_epoch(self.epoch)
        n = len(self.items)
        for batch in self.batch_sampler:
            idx = [int(i) for i in batch]
            bad = next((i for i in idx if not -n <= i < n), None)
            if bad is not None:
                raise IndexError(f"the sampler gave index {bad}, and the dataset has {n} items")
            yield [i % n for i in idx]

    def _places(self) -> tuple[int, int]:
        """This rank's first place in the epoch's global order and the stride between its places: a
        DistributedSampler's rank ``r`` of ``n`` takes the places ``r, r + n, ...`` of its order, so
        no two ranks draw alike and together they draw what one process would."""
        rank, world = getattr(self.sampler, "rank", None), getattr(self.sampler, "num_replicas", None)
        if isinstance(rank, int) and isinstance(world, int) and 0 <= rank < world:
            return rank, world
        return 0, 1

    def __iter__(self) -> Iterator[Any]:
        if not self._epoch_set and getattr(self, "_iterated", False):
            self.epoch += 1
        self._epoch_set, self._iterated = False, True
        with ThreadPoolExecutor(self.num_threads, thread_name_prefix="fastload-items") as pool:
            pending: list[Future] | None = None
            place, step = self._places()
            for idx in self._batches():  # each item's transforms draw from (seed, epoch, its place in the epoch)
                nxt = [pool.submit(self.items.item, i, seed=self.seed, epoch=self.epoch, position=place + step * k) for k, i in enumerate(idx)]
                place += step * len(idx)  # the next batch's items are built while this one is used
                if pending is not None:
                    yield self.collate_fn([f.result() for f in pending])
                pending = nxt
            if pending is not None:
                yield self.collate_fn([f.result() for f in pending])

    def close(self) -> None:
        """Nothing to release (the threads live for one iteration); kept for FastLoader's interface."""

    def __enter__(self) -> "AnnotatedLoader":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AnnotatedLoader({self.plan.name}, batch_size={self.batch_size}, batches={len(self)})"


def annotated_loader(plan: AnnotatedPlan, *args: Any, **kwargs: Any) -> AnnotatedLoader:
    """The :class:`AnnotatedLoader` that ``FastLoader(dataset, *args, **kwargs)`` gives for ``plan``'s dataset.

    Raises:
        ConfigError: a FastLoader keyword that does not apply to these items (a transform, crops,
            normalisation, fields: the dataset's own transforms make the items), naming it.
    """
    if len(args) > len(_ORDER):
        raise ConfigError(f"FastLoader: {len(args) + 1} positional arguments; DataLoader takes at most {len(_ORDER) + 1}")
    given = dict(zip(_ORDER, args))
    twice = sorted(set(given) & set(kwargs))
    if twice:
        raise ConfigError(f"FastLoader: {', '.join(twice)} given both by position and by keyword")
    kwargs = {**given, **kwargs}
    other = {k: v for k, v in kwargs.items() if k not in _ORDER + _KEPT + _TAKEN and v is not None}
    if other:
        raise ConfigError(
            f"FastLoader({plan.name}): {', '.join(f'{k}={reprlib.repr(v)}' for k, v in other.items())} does not apply: each item "
            f"is what the dataset's own __getitem__ returns (its transforms included); give the dataset the transforms "
            f"(docs/dropin.md, COCO and VOC datasets)"
        )
    return AnnotatedLoader(plan, **kwargs)
