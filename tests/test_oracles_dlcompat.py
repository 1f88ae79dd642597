"""fastload.dlcompat checked against torch.utils.data itself: the DataLoader's rules and samplers as the oracle.

* ``user_batch_sampler`` against ``DataLoader(...)`` over every combination of ``sampler`` kind x
  ``batch_sampler`` x ``batch_size`` x ``shuffle`` x ``drop_last``: refused exactly where the DataLoader
  refuses (ValueError), and otherwise the same batches as the DataLoader's ``batch_sampler``.
* ``SamplerPlan``'s batches against the batches a DataLoader yields over a dataset whose item *is*
  its index, with the crop positions ``k * world_size + rank`` of the docs; every refusal's message.
* ``RankSampler``'s attributes against a ``DistributedSampler`` of the same settings.
* ``check_collate_fn`` with timm's own ``FastCollateMixup`` and ``fast_collate``.
"""

from __future__ import annotations

import copy
import itertools
import logging
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    RandomSampler,
    SequentialSampler,
    SubsetRandomSampler,
    default_collate,
)

import fastload.dlcompat as dlc
from fastload.errors import ConfigError
from fastload.sampler import EpochSampler


class Indices(torch.utils.data.Dataset):
    """Item ``i`` is ``i``: a DataLoader's batches are then the indices it read."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i):
        return i


def raises(fn, message):
    with pytest.raises(ConfigError) as e:
        fn()
    assert str(e.value) == message


N = 11


def _samplers():
    return {
        "none": lambda: None,
        "list": lambda: [3, 1, 4, 1, 5, 9, 2, 6],
        "tuple": lambda: (0, 2, 4),
        "range": lambda: range(2, 9),
        "ndarray": lambda: np.array([5, 4, 3, 2], dtype=np.int32),
        "tensor": lambda: torch.tensor([7, 0, 10], dtype=torch.int64),
        "sequential": lambda: SequentialSampler(range(N)),
        "subset": lambda: SubsetRandomSampler([1, 3, 5, 7], generator=torch.Generator().manual_seed(0)),
    }


COMBOS = list(itertools.product(
    list(_samplers()), [None, "given"], [1, 3, 4], [False, True], [False, True],
))  # fmt: skip


@pytest.mark.parametrize("kind, bs_given, batch_size, shuffle, drop_last", COMBOS)
def test_user_batch_sampler_follows_dataloaders_rules_and_batches(kind, bs_given, batch_size, shuffle, drop_last):
    """Kills: any of the mutually-exclusive rules dropped or inverted; the array flattening or the list's
    index check skipped; batch_size or drop_last not passed on."""
    sampler = _samplers()[kind]()
    batch_sampler = BatchSampler(range(N), 2, False) if bs_given else None
    try:
        dl = DataLoader(Indices(N), batch_size=batch_size, shuffle=shuffle, sampler=copy.deepcopy(sampler),
                        batch_sampler=batch_sampler, drop_last=drop_last)  # fmt: skip
        want = [b.tolist() for b in dl]
    except ValueError:
        want = None
    if want is None:
        with pytest.raises(ConfigError):
            dlc.user_batch_sampler(sampler=sampler, batch_sampler=batch_sampler, batch_size=batch_size, shuffle=shuffle,
                                   drop_last=drop_last)  # fmt: skip
        return
    got = dlc.user_batch_sampler(sampler=sampler, batch_sampler=batch_sampler, batch_size=batch_size, shuffle=shuffle,
                                 drop_last=drop_last)  # fmt: skip
    if sampler is None and batch_sampler is None:
        assert got is None
        return
    if batch_sampler is not None:
        assert got is batch_sampler
    else:
        assert type(got) is BatchSampler and (got.batch_size, got.drop_last) == (batch_size, drop_last)
    assert [list(map(int, b)) for b in got] == want


def test_user_batch_sampler_messages_and_arrays():
    """Kills: the messages changed; a float or bool array accepted; a bool in a list read as 0/1."""
    bs = BatchSampler(range(4), 2, False)
    msg = ("batch_sampler option is mutually exclusive with batch_size, shuffle, sampler, and drop_last "
           "(as in DataLoader)")  # fmt: skip
    for kw in ({"batch_size": 2}, {"shuffle": True}, {"sampler": [0]}, {"drop_last": True}):
        args = dict(sampler=None, batch_sampler=bs, batch_size=1, shuffle=False, drop_last=False) | kw
        raises(lambda: dlc.user_batch_sampler(**args), msg)
    raises(lambda: dlc.user_batch_sampler(sampler=[0], batch_sampler=None, batch_size=1, shuffle=True, drop_last=False),
           "sampler option is mutually exclusive with shuffle (as in DataLoader)")  # fmt: skip
    for arr, kind in ((np.zeros(3), "float64"), (torch.zeros(3, dtype=torch.bool), "torch.bool"),
                      (np.zeros(3, dtype=bool), "bool"), (torch.zeros(2), "torch.float32")):  # fmt: skip
        raises(lambda: dlc.user_batch_sampler(sampler=arr, batch_sampler=None, batch_size=1, shuffle=False, drop_last=False),
               f"sampler is an array of {kind}; sample indices are integers")  # fmt: skip
    for arr in (np.array([2, 0], dtype=np.uint8), torch.tensor([2, 0], dtype=torch.int16), np.array([[2], [0]])):
        got = dlc.user_batch_sampler(sampler=arr, batch_sampler=None, batch_size=5, shuffle=False, drop_last=False)
        assert list(got) == [[2, 0]] and all(type(i) is int for i in got.sampler)
    raises(lambda: dlc.user_batch_sampler(sampler=[0, True], batch_sampler=None, batch_size=1, shuffle=False, drop_last=False),
           "sampler yielded True, not a sample index")  # fmt: skip
    got = dlc.user_batch_sampler(sampler=[np.int64(3)], batch_sampler=None, batch_size=1, shuffle=False, drop_last=False)
    assert got.sampler == [3] and type(got.sampler[0]) is int


@pytest.mark.parametrize("value, ok", [(3, 3), (np.int64(4), 4), (np.uint8(5), 5), (True, None), (2.0, None), ("1", None), (None, None)])
def test_as_index(value, ok):
    if ok is None:
        raises(lambda: dlc.as_index("sampler", value), f"sampler yielded {value!r}, not a sample index")
    else:
        got = dlc.as_index("sampler", value)
        assert got == ok and type(got) is int


# ----------------------------------------------------------------------------- SamplerPlan


class Lists:
    """A batch sampler of the user's: fixed index lists, of any container."""

    def __init__(self, batches) -> None:
        self.b = batches

    def __iter__(self):
        return iter(self.b)

    def __len__(self) -> int:
        return len(self.b)


@pytest.mark.parametrize("world, rank", [(1, 0), (3, 2), (4, 1)])
@pytest.mark.parametrize("start", [0, 1, 3])
@pytest.mark.parametrize(
    "make",
    [
        lambda: BatchSampler(SequentialSampler(range(N)), 3, False),
        lambda: BatchSampler(SequentialSampler(range(N)), 3, True),
        lambda: BatchSampler([4, 4, 2, 10, 0], 2, False),
        lambda: Lists([[1, 2, 3], (4,), range(5, 7), np.array([8, 9], dtype=np.int32), torch.tensor([10, 0])]),
    ],
)
def test_sampler_plan_batches_are_the_dataloaders(make, world, rank, start):
    """Indices: the batches ``DataLoader(batch_sampler=...)`` yields; numbers from 0; positions the k-th
    sample's ``k * world_size + rank`` counted from the epoch's start (batches before ``start`` too).
    Kills: positions without the rank or the world, counted from ``start``, ``start`` ignored, the
    batch number off by one, indices as another dtype."""
    want = [b.tolist() for b in DataLoader(Indices(N), batch_sampler=make())]
    plan = dlc.SamplerPlan(make(), num_samples=N, rank=rank, world_size=world)
    assert len(plan) == len(want) == plan.num_batches(5, [[0, 1]])
    got = list(plan.batches(0, start=start))
    assert [b.number for b in got] == list(range(start, len(want)))
    assert [b.indices.tolist() for b in got] == want[start:]
    k = sum(len(b) for b in want[:start])
    for b in got:
        assert b.indices.dtype == np.int64 and b.positions.dtype == np.int64
        assert b.positions.tolist() == [(k + j) * world + rank for j in range(len(b.indices))]
        k += len(b.indices)


@pytest.mark.parametrize(
    "make, largest",
    [
        (lambda: BatchSampler(range(3), 10**7, False), 3),  # bounded by the sampler's length
        (lambda: BatchSampler(range(30), 4, False), 4),
        (lambda: BatchSampler(range(0), 4, False), 1),
        (lambda: Lists([[1], [2, 3, 4], [5, 6]]), 3),
        (lambda: Lists([]), 1),
    ],
)
def test_sampler_plans_largest_batch(make, largest):
    assert dlc.SamplerPlan(make(), num_samples=40, rank=0, world_size=1).max_batch == largest


class SizeNoLen:
    """A batch sampler whose ``batch_size`` is set but whose sampler has no len()."""

    def __init__(self) -> None:
        self.batch_size, self.sampler = 5, iter(range(3))

    def __iter__(self):
        return iter([[0, 1, 2, 3, 4]])

    def __len__(self) -> int:
        return 1


def test_sampler_plans_largest_batch_of_odd_batch_samplers():
    assert dlc.SamplerPlan(SizeNoLen(), num_samples=9, rank=0, world_size=1).max_batch == 5
    odd = Lists([[1, 2]])
    odd.batch_size = True  # not a size: the batches are measured
    assert dlc.SamplerPlan(odd, num_samples=9, rank=0, world_size=1).max_batch == 2
    odd.batch_size = 0
    assert dlc.SamplerPlan(odd, num_samples=9, rank=0, world_size=1).max_batch == 2


def test_sampler_plan_refuses_naming_the_batch_and_the_index():
    """Kills: each message changed; an empty batch accepted; the index range as ``<=``; the size bound."""

    class Growing(Lists):
        batch_size = 2

        @property
        def sampler(self):
            return range(2)

    raises(lambda: dlc.SamplerPlan(iter([[0]]), num_samples=3, rank=0, world_size=1),
           "sampler/batch_sampler list_iterator has no len(); FastLoader needs to know how many batches an epoch has")  # fmt: skip
    cases = [
        (Lists([[0], []]), "batch_sampler yielded a batch of 0 indices (batch 1); expected 1..1: a DataLoader cannot "
         "collate an empty batch either"),
        (Growing([[0, 1], [0, 1, 2]]), "batch_sampler yielded a batch of 3 indices (batch 1); expected 1..2"),
        (Lists([[0], [5]]), "sampler yielded index 5, outside the dataset's 0..4"),
        (Lists([[-1]]), "sampler yielded index -1, outside the dataset's 0..4"),
        (Lists([[0.5]]), "sampler yielded 0.5, not a sample index"),
        (Lists([np.zeros((1, 1), dtype=np.int64)]),
         "batch_sampler yielded array([[0]]) (ndarray), not a list of sample indices"),
        (Lists([3]), "batch_sampler yielded 3 (int), not a list of sample indices"),
    ]  # fmt: skip
    for bs, message in cases:
        try:
            plan = dlc.SamplerPlan(bs, num_samples=5, rank=0, world_size=1)
        except ConfigError as e:
            assert str(e) == message
            continue
        raises(lambda: list(plan.batches(0)), message)
    assert [b.indices.tolist() for b in dlc.SamplerPlan(Lists([[4]]), num_samples=5, rank=0, world_size=1).batches(0)] == [[4]]


class Stateful:
    def __init__(self, n: int) -> None:
        self.n, self.offset = n, 0

    def __iter__(self):
        return iter([(i + self.offset) % self.n for i in range(self.n)])

    def __len__(self) -> int:
        return self.n

    def state_dict(self):
        return {"offset": self.offset}

    def load_state_dict(self, state) -> None:
        self.offset = state["offset"]


def test_sampler_plan_puts_a_stateful_sampler_back_at_the_resumed_epochs_start():
    """A pending state for epoch 2 is loaded before epoch 2 is iterated (and only then), and the
    sampler's state at the start of each epoch is kept. Kills: the pending epoch not compared, a None
    state loaded, the start state taken after the epoch or not kept, the pending state not cleared."""
    s = Stateful(4)
    plan = dlc.SamplerPlan(BatchSampler(s, 2, False), num_samples=4, rank=0, world_size=1)
    assert plan.stateful is s and not plan.replayable
    s.offset = 1
    plan.pending_state = (2, {"offset": 3})
    assert [b.indices.tolist() for b in plan.batches(1)] == [[1, 2], [3, 0]]  # another epoch: not loaded
    assert plan.epoch_start_state == (1, {"offset": 1}) and plan.pending_state is None
    plan.pending_state = (2, {"offset": 3})
    assert [b.indices.tolist() for b in plan.batches(2)] == [[3, 0], [1, 2]]
    assert plan.epoch_start_state == (2, {"offset": 3}) and plan.pending_state is None
    plan.pending_state = (3, None)
    s.offset = 2
    assert [b.indices.tolist() for b in plan.batches(3)] == [[2, 3], [0, 1]]
    assert plan.epoch_start_state == (3, {"offset": 2})


@pytest.mark.parametrize(
    "make, stateful, replayable",
    [
        (lambda s: BatchSampler(s, 2, False), "inner", False),
        (lambda s: s, "outer", False),  # the batch sampler has state itself
        (lambda s: BatchSampler([0, 1], 2, False), None, True),
        (lambda s: BatchSampler((0, 1), 2, False), None, True),
        (lambda s: BatchSampler(range(2), 2, False), None, True),
        (lambda s: BatchSampler(SequentialSampler(range(2)), 2, False), None, True),
        (lambda s: BatchSampler(DistributedSampler(range(4), num_replicas=2, rank=0), 2, False), None, True),
        (lambda s: BatchSampler(RandomSampler(range(2)), 2, False), None, False),
        (lambda s: Lists([[0]]), None, False),  # not torch's BatchSampler: not known to replay
        (lambda s: dlc.LoaderBatchSampler([0, 1], 2, False), None, False),  # a subclass is not BatchSampler itself
    ],
)
def test_stateful_and_replayable_samplers(make, stateful, replayable):
    class StatefulBatches(Lists, Stateful):
        def __init__(self) -> None:
            Lists.__init__(self, [[0, 1]])
            Stateful.__init__(self, 2)

    inner = StatefulBatches() if stateful == "outer" else Stateful(2)
    bs = make(inner)
    got = dlc.stateful_sampler(bs)
    assert got is ({"inner": inner, "outer": bs}.get(stateful) if stateful else None)
    assert dlc.replayable_sampler(bs) is replayable


# ----------------------------------------------------------------------------- RankSampler


@pytest.mark.parametrize("n, world, rank, shuffle, drop_last", [(23, 3, 1, False, False), (23, 4, 3, True, True), (8, 2, 0, True, False)])
def test_rank_sampler_is_a_distributed_samplers_twin(n, world, rank, shuffle, drop_last):
    """Attributes as ``DistributedSampler(num_replicas, rank, shuffle, seed, drop_last)`` has them;
    unshuffled, its very indices; ``len`` the share, or after a resume of this epoch what is left; a copy
    keeps the epoch it was copied at. Kills: an attribute from another field, the resumed length of
    another epoch, the copy tied to the loader's epoch, ``set_epoch`` or ``bind`` not called."""
    plan = EpochSampler(num_samples=n, batch_size=2, shuffle=shuffle, drop_last=drop_last, seed=9, rank=rank, world_size=world)
    epoch = {"e": 2}
    binds = []
    rs = dlc.RankSampler(plan, lambda: epoch["e"], lambda e: epoch.update(e=e), bind=lambda: binds.append(1))
    ds = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=9, drop_last=drop_last)
    for k in ("num_replicas", "rank", "shuffle", "drop_last", "seed", "num_samples", "total_size"):
        assert getattr(rs, k) == getattr(ds, k), k
    assert isinstance(rs, torch.utils.data.Sampler) and rs.epoch == 2
    if not shuffle:
        assert list(rs) == list(ds)
    assert len(rs) == ds.num_samples == len(list(rs))
    rs.set_epoch(5)
    assert epoch["e"] == 5 and rs.epoch == 5
    copied = copy.deepcopy(rs)
    pickled = pickle.loads(pickle.dumps(copied))
    epoch["e"] = 6
    assert copied.epoch == 5 and pickled.epoch == 5 and rs.epoch == 6
    copied.set_epoch(7)
    assert copied.epoch == 7 and epoch["e"] == 6
    before = len(binds)
    len(copied), list(copied)
    assert len(binds) == before  # a copy is bound to no loader
    plan.resume(6, [[0, 5]])
    left = plan.rank_indices(6)
    assert len(rs) == len(left) and list(iter(rs)) == left.tolist() and len(binds) == before + 2
    epoch["e"] = 7  # another epoch than the resumed one: the whole share
    assert len(rs) == ds.num_samples
    plan2 = EpochSampler(num_samples=n + 5, batch_size=2, rank=0, world_size=1)
    rs.rebind(plan2)
    assert (rs.num_replicas, rs.rank, rs.num_samples, rs.total_size) == (1, 0, n + 5, n + 5)


def test_rank_sampler_without_bind_and_the_detached_epoch():
    plan = EpochSampler(num_samples=5, batch_size=2)
    rs = dlc.RankSampler(plan, lambda: 0, lambda e: None)
    assert len(rs) == 5 and sorted(rs) == [0, 1, 2, 3, 4]
    box = dlc.DetachedEpoch(3)
    box.set(np.int64(4))
    assert box.get() == 4 and type(box.epoch) is int
    with pytest.raises(TypeError):
        box.set(4.0)


def test_loader_batch_sampler_forwards_set_epoch():
    plan = EpochSampler(num_samples=5, batch_size=2, shuffle=False)
    seen = []
    rs = dlc.RankSampler(plan, lambda: 0, seen.append)
    lbs = dlc.LoaderBatchSampler(rs, 2, False)
    lbs.set_epoch(3)
    assert seen == [3] and list(lbs) == [[0, 1], [2, 3], [4]] and len(lbs) == 3
    dlc.LoaderBatchSampler([0, 1], 2, False).set_epoch(1)  # a sampler without set_epoch: nothing to do


# ----------------------------------------------------------------------------- arguments


def test_note_ignored_logs_each_changed_argument_once(monkeypatch, caplog):
    """Kills: a default value logged; an argument logged twice; the level or text changed."""
    monkeypatch.setattr(dlc, "_LOGGED", set())
    with caplog.at_level(logging.DEBUG, logger="fastload.dlcompat"):
        dlc.note_ignored(dict(dlc.IGNORED_DEFAULTS))
        dlc.note_ignored({"num_workers": 4, "pin_memory": False})
        dlc.note_ignored({"num_workers": 8, "pin_memory": True})
    assert [(r.levelno, r.getMessage()) for r in caplog.records] == [
        (logging.DEBUG, "FastLoader: num_workers=4 does not apply (no worker processes; DALI decodes); ignored"),
        (logging.DEBUG, "FastLoader: pin_memory=True does not apply (no worker processes; DALI decodes); ignored"),
    ]
    assert dlc.IGNORED_DEFAULTS == {
        "num_workers": 0, "pin_memory": False, "timeout": 0, "worker_init_fn": None, "multiprocessing_context": None,
        "prefetch_factor": None, "persistent_workers": False, "pin_memory_device": "", "in_order": True,
    }  # fmt: skip
    import inspect

    params = inspect.signature(DataLoader).parameters
    assert all(params[k].default == v for k, v in dlc.IGNORED_DEFAULTS.items() if k != "prefetch_factor")


def test_check_collate_fn_with_torch_and_timm():
    """Kills: None not mapped to default_collate; a user's function replaced; timm's collates let through
    (both tests: the class's module and the function's); the messages."""
    assert dlc.check_collate_fn(None) is default_collate and dlc.check_collate_fn(default_collate) is default_collate

    def mine(batch):
        return batch

    assert dlc.check_collate_fn(mine) is mine
    raises(lambda: dlc.check_collate_fn(3), "collate_fn must be a function of a list of samples, got 3")
    raises(lambda: dlc.check_collate_fn("x" * 100), f"collate_fn must be a function of a list of samples, got {repr('x' * 100)[:60]}")
    from timm.data import FastCollateMixup
    from timm.data.loader import fast_collate

    tail = ("cannot be honoured: it expects timm's uint8 NumPy images (ToNumpy), but FastLoader gives image tensors; "
            "use timm.data.Mixup on each batch inside the training loop instead")  # fmt: skip
    raises(lambda: dlc.check_collate_fn(FastCollateMixup(mixup_alpha=1.0)), f"collate_fn=FastCollateMixup {tail}")
    raises(lambda: dlc.check_collate_fn(fast_collate), f"collate_fn=fast_collate {tail}")


def test_check_collate_fn_takes_a_callable_that_has_no_module():
    """Kills check_collate_fn_39 (the callable's ``__module__`` read without a default): a bound slot
    such as ``[].__add__`` (a method-wrapper) has none, and is a user's function like any other."""
    f = [].__add__
    assert not hasattr(f, "__module__")
    assert dlc.check_collate_fn(f) is f


# ----------------------------------------------------------------------------- SamplerPlan's state, odd batch samplers


@pytest.mark.parametrize("kind", ["replayable", "stateful", "neither"])
def test_a_new_sampler_plan_keeps_its_arguments_and_has_no_state_yet(kind):
    """Kills: an attribute set from another argument or to a stand-in ("" or None for False), the stateful
    sampler not looked up, the replay test not made (``not plan.replayable`` passes for None too)."""
    inner = Stateful(4)
    bs = {"replayable": BatchSampler([0, 1, 2], 2, False), "stateful": BatchSampler(inner, 2, False),
          "neither": Lists([[0], [1]])}[kind]  # fmt: skip
    plan = dlc.SamplerPlan(bs, num_samples=7, rank=2, world_size=3)
    assert (plan.batch_sampler, plan.num_samples, plan.rank, plan.world_size) == (bs, 7, 2, 3)
    assert plan.resumed is None and plan.epoch_start_state is None and plan.pending_state is None
    assert plan.replayable is (kind == "replayable")
    assert plan.stateful is (inner if kind == "stateful" else None)


def test_the_largest_batch_of_a_batch_sampler_that_states_its_size_and_of_empty_batches():
    """A ``batch_size`` of 1 is believed (not measured), and batches all empty count as 1. Kills: the size
    test as ``>= 2``/``> 1``, the ``or 1`` fallback changed."""
    stated = Lists([[1, 2, 3]])
    stated.batch_size = 1
    assert dlc.SamplerPlan(stated, num_samples=9, rank=0, world_size=1).max_batch == 1
    assert dlc.SamplerPlan(Lists([[], []]), num_samples=9, rank=0, world_size=1).max_batch == 1
    assert dlc.SamplerPlan(BatchSampler(range(1), 4, False), num_samples=9, rank=0, world_size=1).max_batch == 1


def test_a_sampler_with_only_half_the_state_methods_is_not_stateful():
    """Kills: ``_has_state``'s two tests joined by ``or``."""

    class Half(Lists):
        def state_dict(self):
            return {}

    class OtherHalf(Lists):
        def load_state_dict(self, state):
            pass

    for cls in (Half, OtherHalf):
        assert dlc.stateful_sampler(cls([[0]])) is None
        assert dlc.stateful_sampler(BatchSampler(cls([0]), 1, False)) is None


def test_what_is_not_a_batch_is_shown_cut_at_60_characters():
    """Kills: the repr cut at another length; a 1-d array or tensor refused, or a 0-d one accepted."""
    text = "x" * 100
    raises(lambda: list(dlc.SamplerPlan(Lists([text]), num_samples=5, rank=0, world_size=1).batches(0)),
           f"batch_sampler yielded {repr(text)[:60]} (str), not a list of sample indices")  # fmt: skip
    raises(lambda: list(dlc.SamplerPlan(Lists([torch.tensor(1)]), num_samples=5, rank=0, world_size=1).batches(0)),
           "batch_sampler yielded tensor(1) (Tensor), not a list of sample indices")  # fmt: skip
    got = dlc.SamplerPlan(Lists([np.array([1, 2]), torch.tensor([3])]), num_samples=5, rank=0, world_size=1).batches(0)
    assert [b.indices.tolist() for b in got] == [[1, 2], [3]]


def test_a_batch_sampler_larger_than_max_batch_is_refused_naming_it():
    """Kills: the refusal's subject (``what=``) dropped or changed: it would name ``batch_size``, which the
    user did not pass."""
    from fastload.sampler import MAX_BATCH

    n = MAX_BATCH + 5
    raises(lambda: dlc.SamplerPlan(BatchSampler(range(n), MAX_BATCH + 1, False), num_samples=n, rank=0, world_size=1),
           f"the sampler's largest batch must be an int in [1, {MAX_BATCH}] (samples in one batch on one rank), got {MAX_BATCH + 1}")  # fmt: skip


@pytest.mark.parametrize(
    "rank, world, message",
    [
        (1, None, "give both rank and world_size or neither, got rank=1, world_size=None"),
        (None, 2, "give both rank and world_size or neither, got rank=None, world_size=2"),
        (0, 0, "world_size must be an int >= 1, got 0"),
        (3, 2, "rank must be an int in [0, world_size=2), got 3"),
        (-1, 2, "rank must be an int in [0, world_size=2), got -1"),
    ],
)
def test_rank_and_world_given_by_halves_or_out_of_range_are_refused(rank, world, message):
    """Both or neither, as DistributedSampler's num_replicas/rank are read; without a process group neither
    is rank 0 of 1. Kills: the both-or-neither tests joined the other way (one of the two given read as
    neither, or passed on), the messages, the world_size name."""
    raises(lambda: dlc.rank_and_world(rank, world), message)
    assert dlc.rank_and_world(None, None) == (0, 1) and dlc.rank_and_world(np.int64(2), 3) == (2, 3)
