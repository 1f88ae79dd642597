"""The DataLoader surface of FastLoader: its keyword arguments, and the samplers clients look for.

``torch.utils.data.DataLoader`` takes a dozen arguments that are about worker processes
and host memory; FastLoader has neither, so it accepts them, keeps their values as
attributes (what the DataLoader would show) and logs once at debug level that they do
not apply. The samplers clients read (Lightning, accelerate, timm, pytorch/examples)
are real ``torch.utils.data.Sampler`` objects:

* without ``sampler=``: :class:`RankSampler` (this rank's indices of the current
  epoch, ``set_epoch``) inside a :class:`LoaderBatchSampler` (index lists);
* with ``sampler=`` (a ``DistributedSampler``, ``WeightedRandomSampler``, a list...):
  that sampler, iterated each epoch, inside a ``BatchSampler``; with
  ``batch_sampler=``: that one. :class:`SamplerPlan` turns either into the batch plans
  the loader reads, exactly those indices in that order.
"""

from __future__ import annotations

import logging
import operator
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import BatchSampler, Sampler

from .errors import ConfigError, as_int, printable
from .sampler import Batch, check_batch

if TYPE_CHECKING:  # pragma: no cover
    from .sampler import EpochSampler

log = logging.getLogger(__name__)

#: DataLoader arguments about worker processes and host memory: accepted, kept, not used.
IGNORED_DEFAULTS: dict[str, Any] = {
    "num_workers": 0,
    "pin_memory": False,
    "timeout": 0,
    "worker_init_fn": None,
    "multiprocessing_context": None,
    "prefetch_factor": None,
    "persistent_workers": False,
    "pin_memory_device": "",
    "in_order": True,
}
_LOGGED: set[str] = set()


def note_ignored(values: dict[str, Any]) -> None:
    """Log once per argument name (debug level) that a DataLoader argument does not apply."""
    for name, value in values.items():
        if value != IGNORED_DEFAULTS[name] and name not in _LOGGED:
            _LOGGED.add(name)
            log.debug("FastLoader: %s=%r does not apply (no worker processes; DALI decodes); ignored", name, value)


def check_collate_fn(collate_fn: Any) -> Callable:
    """The collate function a DataLoader would show: ``default_collate`` for None, else the user's own.

    A user's function is called on every batch as a list of ``(image, label)`` pairs (see
    :func:`fastload.epochs.EpochIterator`), as a DataLoader calls it on its items. timm's
    ``FastCollateMixup``/``fast_collate`` are refused: they expect timm's uint8 NumPy images.
    """
    from torch.utils.data import default_collate

    if collate_fn is None or collate_fn is default_collate:
        return default_collate
    name = getattr(collate_fn, "__qualname__", None) or type(collate_fn).__name__
    if not callable(collate_fn):
        raise ConfigError(f"collate_fn must be a function of a list of samples, got {printable(repr(collate_fn))[:60]}")
    if getattr(type(collate_fn), "__module__", "").startswith("timm.") or getattr(collate_fn, "__module__", "") == "timm.data.loader":
        raise ConfigError(
            f"collate_fn={name} cannot be honoured: it expects timm's uint8 NumPy images (ToNumpy), but FastLoader "
            "gives image tensors; use timm.data.Mixup on each batch inside the training loop instead"
        )
    return collate_fn


def as_index(name: str, value: Any) -> int:
    try:
        if isinstance(value, bool):
            raise TypeError
        return operator.index(value)
    except TypeError:
        raise ConfigError(f"{name} yielded {value!r}, not a sample index") from None


def _nothing() -> None:
    pass


class DetachedEpoch:
    """What a copied sampler or dataset view holds instead of its loader: an epoch of its own."""

    def __init__(self, epoch: int) -> None:
        self.epoch = epoch

    def get(self) -> int:
        return self.epoch

    def set(self, epoch: int) -> None:
        self.epoch = operator.index(epoch)


class RankSampler(Sampler[int]):
    """This rank's sample indices of the loader's current epoch (as a ``DistributedSampler``).

    ``len`` is the number of samples this rank reads per epoch; ``set_epoch(e)`` chooses
    the loader's epoch, as it does on a ``DistributedSampler``.
    """

    def __init__(
        self, plan: "EpochSampler", get_epoch: Callable[[], int], set_epoch: Callable[[int], None],
        bind: Callable[[], None] | None = None,
    ) -> None:
        self._get_epoch = get_epoch
        self._set_epoch = set_epoch
        self._bind = bind or _nothing
        self.rebind(plan)

    def rebind(self, plan: "EpochSampler") -> None:
        """Read ``plan`` from now on (the loader found its rank in the process group)."""
        self._plan = plan
        self.num_replicas = plan.world_size
        self.rank = plan.rank
        self.shuffle = plan.shuffle
        self.drop_last = plan.drop_last
        self.seed = plan.seed
        self.num_samples = plan.per_rank
        self.total_size = plan.total

    @property
    def epoch(self) -> int:
        return self._get_epoch()

    def __getstate__(self) -> dict[str, Any]:
        """A copy (pickle, deepcopy) has an epoch of its own, the loader's at copy time."""
        state = self.__dict__.copy()
        box = DetachedEpoch(self._get_epoch())
        state.update(_get_epoch=box.get, _set_epoch=box.set, _bind=_nothing)
        return state

    def set_epoch(self, epoch: int) -> None:
        self._set_epoch(epoch)

    def __iter__(self) -> Iterator[int]:
        """This rank's indices of the loader's epoch (of a resumed epoch: the ones still to read)."""
        self._bind()
        return iter(self._plan.rank_indices(self._get_epoch()).tolist())

    def __len__(self) -> int:
        self._bind()
        plan = self._plan
        epoch = self._get_epoch()
        if plan.resumed is not None and plan.resumed[0] == epoch:
            return len(plan.rank_indices(epoch))
        return plan.per_rank


class LoaderBatchSampler(BatchSampler):
    """Index lists of the batches the loader yields: ``len`` = batches, ``.sampler``, ``set_epoch``."""

    def set_epoch(self, epoch: int) -> None:
        set_epoch = getattr(self.sampler, "set_epoch", None)
        if set_epoch is not None:
            set_epoch(epoch)


class SamplerPlan:
    """Batch plans from a user's ``sampler=`` or ``batch_sampler=``: exactly its indices, in its order.

    Each epoch iterates the sampler once. Crop positions are ``k * world_size + rank`` for
    the ``k``-th sample this rank reads, so they differ between ranks as they do without
    a user sampler.

    Args:
        batch_sampler: yields lists of indices, one per batch (a ``BatchSampler`` over the
            user's sampler, or the user's own ``batch_sampler``).
        num_samples: samples in the dataset (every index is checked against it).
        rank, world_size: this process's place (for crop positions only; the sampler shards).
    """

    def __init__(self, batch_sampler: Iterable[Sequence[int]], *, num_samples: int, rank: int, world_size: int) -> None:
        try:
            self._len = len(batch_sampler)  # type: ignore[arg-type]
        except TypeError:
            raise ConfigError(
                f"sampler/batch_sampler {type(batch_sampler).__name__} has no len(); FastLoader needs to know "
                "how many batches an epoch has"
            ) from None
        self.batch_sampler = batch_sampler
        self.num_samples = num_samples
        self.rank = rank
        self.world_size = world_size
        self.max_batch = check_batch(_largest_batch(batch_sampler), what="the sampler's largest batch")
        self.resumed = None  # EpochSampler's attribute; a user's sampler is never re-shared
        self.stateful = stateful_sampler(batch_sampler)
        self.replayable = replayable_sampler(batch_sampler)
        self.epoch_start_state: tuple[int, Any] | None = None  # (epoch, the sampler's state before it)
        self.pending_state: tuple[int, Any] | None = None  # restore before iterating this epoch

    def __len__(self) -> int:
        return self._len

    def num_batches(self, epoch: int, consumed: Any = None) -> int:
        """Batches of every epoch (the sampler's ``len``)."""
        del epoch, consumed
        return self._len

    def batches(self, epoch: int, start: int = 0) -> Iterator[Batch]:
        """This epoch's batches from batch number ``start`` (the sampler is iterated from its start).

        The whole epoch is planned here, in the caller's thread, so a bad index is a
        :class:`ConfigError` from ``iter(loader)``, not a failure in the background.
        """
        # the sampler's own epoch (set_epoch) decides its order; a sampler with state is put back
        # where it stood at the start of a resumed epoch, and its state there is kept for state_dict
        src = self.stateful
        if src is not None:
            pending, self.pending_state = self.pending_state, None
            if pending is not None and pending[0] == epoch and pending[1] is not None:
                src.load_state_dict(pending[1])
            self.epoch_start_state = (epoch, src.state_dict())
        pos = 0
        plans = []
        for number, batch in enumerate(self.batch_sampler):
            values = [as_index("sampler", i) for i in _sized_batch(batch)]
            n = len(values)
            if n == 0 or n > self.max_batch:
                raise ConfigError(
                    f"batch_sampler yielded a batch of {n} indices (batch {number}); expected 1..{self.max_batch}"
                    + (": a DataLoader cannot collate an empty batch either" if n == 0 else "")
                )
            bad = [i for i in values if not 0 <= i < self.num_samples]
            if bad:
                raise ConfigError(f"sampler yielded index {bad[0]}, outside the dataset's 0..{self.num_samples - 1}")
            idx = np.array(values, dtype=np.int64)
            positions = (np.arange(pos, pos + n, dtype=np.int64) * self.world_size) + self.rank
            pos += n
            if number >= start:
                plans.append(Batch(number, idx, positions))
        return iter(plans)


def _sized_batch(batch: Any) -> Sequence[Any]:
    """One batch a batch sampler yielded, as a sequence of what should be sample indices."""
    if isinstance(batch, (list, tuple, range)):
        return batch
    if isinstance(batch, (np.ndarray, torch.Tensor)) and batch.ndim == 1:
        return batch.tolist()
    raise ConfigError(
        f"batch_sampler yielded {printable(repr(batch))[:60]} ({type(batch).__name__}), not a list of sample indices"
    )


def _largest_batch(batch_sampler: Any) -> int:
    """The most indices one batch of ``batch_sampler`` holds (what DALI's pipeline is sized for).

    A ``BatchSampler``'s ``batch_size`` is bounded by its sampler's length (``DataLoader(ds, 10**7,
    sampler=[0, 1, 2])`` makes one batch of 3); any other batch sampler is measured by iterating it.
    """
    size = getattr(batch_sampler, "batch_size", None)
    if isinstance(size, int) and not isinstance(size, bool) and size >= 1:
        try:
            return max(1, min(size, len(batch_sampler.sampler)))
        except (AttributeError, TypeError):
            return size
    return max((len(_sized_batch(b)) for b in batch_sampler), default=1) or 1


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(getattr(obj, "load_state_dict", None))


def stateful_sampler(batch_sampler: Any) -> Any:
    """The object whose ``state_dict``/``load_state_dict`` resume a user's order: the batch sampler
    if it has them, else its ``.sampler`` if that has them; None if neither does."""
    if _has_state(batch_sampler):
        return batch_sampler
    inner = getattr(batch_sampler, "sampler", None)
    return inner if _has_state(inner) else None


def replayable_sampler(batch_sampler: Any) -> bool:
    """True where iterating the batch sampler again gives the same batches: torch's ``BatchSampler``
    over a list of indices, a ``SequentialSampler`` or a ``DistributedSampler`` (whose order is a
    function of its settings and ``set_epoch``). Not a ``RandomSampler``: it draws a new order."""
    from torch.utils.data import DistributedSampler, SequentialSampler

    if type(batch_sampler) is not BatchSampler:
        return False
    inner = batch_sampler.sampler
    return isinstance(inner, (list, tuple, range)) or type(inner) in (SequentialSampler, DistributedSampler)


def user_batch_sampler(
    *, sampler: Any, batch_sampler: Any, batch_size: Any, shuffle: Any, drop_last: bool
) -> BatchSampler | Any | None:
    """The batch sampler a DataLoader would build from these arguments, or None for FastLoader's own.

    Raises:
        ConfigError: the combination is one a DataLoader refuses (the same rules, as ConfigError).
    """
    if batch_sampler is not None:
        if batch_size != 1 or shuffle or sampler is not None or drop_last:
            raise ConfigError(
                "batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last "
                "(as in DataLoader)"
            )
        return batch_sampler
    if sampler is None:
        return None
    if shuffle:
        raise ConfigError("sampler option is mutually exclusive with shuffle (as in DataLoader)")
    if isinstance(sampler, (np.ndarray, torch.Tensor)):
        kind = str(sampler.dtype)
        if not any(k in kind for k in ("int", "uint")) or "bool" in kind:
            raise ConfigError(f"sampler is an array of {kind}; sample indices are integers")
        sampler = np.asarray(sampler).reshape(-1).tolist()
    elif isinstance(sampler, (list, tuple, range)):
        sampler = [as_index("sampler", i) for i in sampler]
    return BatchSampler(sampler, batch_size, drop_last)


__all__ = [
    "IGNORED_DEFAULTS", "note_ignored", "check_collate_fn", "RankSampler", "LoaderBatchSampler",
    "SamplerPlan", "user_batch_sampler", "stateful_sampler", "replayable_sampler",
]  # fmt: skip

def rank_and_world(rank: Any, world_size: Any) -> tuple[int, int]:
    """``(rank, world_size)``: both given (checked), or neither (torch.distributed's group, else 0 and 1)."""
    if rank is None and world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ConfigError(f"give both rank and world_size or neither, got rank={rank!r}, world_size={world_size!r}")
    ws = as_int("world_size", world_size, lo=1)
    try:
        r = as_int("rank", rank, lo=0, hi=ws - 1)
    except ConfigError:
        raise ConfigError(f"rank must be an int in [0, world_size={ws}), got {rank!r}") from None
    return r, ws
