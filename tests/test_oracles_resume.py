"""fastload.resume checked against oracles of its own: hand-built states, brute force, first principles.

* Every expected state is written out field by field (``hand_state``), never built by ``make_state``;
  what an epoch consumed is brute-forced from the positions the ranks actually read, and turned into
  intervals by ``runs`` below (not ``intervals_of``).
* Where a resume lands (``resume_position``) as a table: order kind x world and batch before/after x
  ``drop_last``/``pad`` x resume point (the start, a batch, the last batch, the end, a merged state),
  the expected batch number from the formula of the docs (``docs/loader.md``, "Resuming"): a resumed
  epoch's batches are numbered up to ``len(sampler)``, so its first is ``len`` minus the batches of
  the remainder, a share of ``ceil(m / world)`` (pad), ``m // world`` (drop_last) or the strided
  share of ``m`` unconsumed samples.
* A user's sampler (``sampler=``) with state, replayable without state, and neither, at every point.
* Every error: its exact message (a message is an interface: it names the state, the rank, the field).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from torch.utils.data import BatchSampler, RandomSampler, SequentialSampler

from fastload.dlcompat import SamplerPlan
from fastload.errors import ConfigError
from fastload.resume import Shape, checked_state, make_state, merge_states, resume_position, saved_plan, upgrade_v1
from fastload.sampler import EpochSampler

KINDS = {
    "global": {"shuffle": True, "order": "global"},
    "sequential": {"shuffle": False, "order": "global"},
    "block": {"shuffle": True, "order": "block", "block_size": 3, "window": 2},
}
SEED = 7  # not the default seed: a plan rebuilt without it differs


def plans(n, world, batch, kind, drop_last=False, pad=True):
    return [EpochSampler(num_samples=n, batch_size=batch, world_size=world, rank=r, drop_last=drop_last, pad=pad,
                         seed=SEED, **KINDS[kind]) for r in range(world)]  # fmt: skip


def shape_of(kind, n, world, batch, drop_last=False, pad=True, order=None) -> Shape:
    k = KINDS[kind]
    block = k["order"] == "block"
    return Shape(seed=SEED, num_samples=n, shuffle=k["shuffle"], order=order or k["order"],
                 block_size=k.get("block_size") if block else None, window=k.get("window") if block else None,
                 batch_size=batch, world_size=world, drop_last=drop_last, pad=pad)  # fmt: skip


def runs(positions) -> list[list[int]]:
    """Sorted distinct positions as ``[start, stop)`` runs, written out (not ``intervals_of``)."""
    out: list[list[int]] = []
    for p in sorted(set(positions)):
        if out and out[-1][1] == p:
            out[-1][1] = p + 1
        else:
            out.append([p, p + 1])
    return out


def read(ps, epoch, counts, n) -> set[int]:
    """Positions (below ``n``: padding consumes nothing) of each rank's first ``counts[r]`` batches."""
    got: set[int] = set()
    for p, c in zip(ps, counts):
        for k, b in enumerate(p.batches(epoch)):
            if k >= c:
                break
            got |= {int(x) for x in b.positions if x < n}
    return got


def hand_state(shape: Shape, *, epoch, done, consumed=(), resumed_from=(), samples=None, sampler=None, own=True):
    """A version-2 state written out field by field (the layout of ``docs/loader.md``)."""
    consumed, resumed_from = [list(x) for x in consumed], [list(x) for x in resumed_from]
    return {
        "format": "fastload.FastLoader", "version": 2, "epoch": epoch, "batches_done": done,
        "consumed": consumed, "resumed_from": resumed_from,
        "samples_consumed": (sum(b - a for a, b in consumed) if samples is None else samples) if own else None,
        "seed": shape.seed, "num_samples": shape.num_samples, "shuffle": shape.shuffle, "order": shape.order,
        "block_size": shape.block_size, "window": shape.window, "batch_size": shape.batch_size,
        "world_size": shape.world_size, "drop_last": shape.drop_last, "pad": shape.pad, "sampler": sampler,
    }  # fmt: skip


def share(m, world, rank, drop_last, pad) -> int:
    """Samples rank ``rank`` reads when ``m`` are shared among ``world`` ranks (DistributedSampler's rule)."""
    if drop_last:
        return m // world
    if pad:
        return math.ceil(m / world)
    return len(range(rank, m, world))


def batches_of(samples, batch, drop_last) -> int:
    return samples // batch if drop_last else math.ceil(samples / batch)


def first_batch_oracle(n, consumed_count, world, batch, rank, drop_last, pad) -> int:
    """The first batch number of a remainder of ``n - consumed_count`` samples: ``len`` minus its batches."""
    full = batches_of(share(n, world, rank, drop_last, pad), batch, drop_last)
    return full - batches_of(share(n - consumed_count, world, rank, drop_last, pad), batch, drop_last)


def assert_position(pos, epoch, batch, consumed=None, sampler_state=None):
    assert (pos.epoch, pos.batch) == (epoch, batch)
    if consumed is None:
        assert pos.consumed is None
    else:
        assert isinstance(pos.consumed, np.ndarray) and pos.consumed.dtype == np.int64
        assert pos.consumed.shape == (len(consumed), 2) and pos.consumed.tolist() == consumed
    assert pos.sampler_state == sampler_state


def raises(fn, message):
    with pytest.raises(ConfigError) as e:
        fn()
    assert str(e.value) == message


# ----------------------------------------------------------------------------- make_state


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("world, pad", [(1, True), (2, False), (3, True), (3, False)])
@pytest.mark.parametrize("resumed", [False, True])
def test_make_state_is_the_hand_built_state_of_what_the_ranks_read(kind, world, pad, resumed):
    """``make_state`` after ``done`` batches on every rank, of a fresh epoch or of one resumed from a
    first stint on 2 ranks: every field as written out by hand, ``consumed`` brute-forced from the reads.

    Kills: ``samples_consumed`` as ``sum(b + a)`` (block order without padding consumes stretches that do
    not start at 0; a resumed epoch's runs do not either); ``resumed_from`` not the resume's intervals."""
    n, epoch, batch = 29, 3, 2
    ps = plans(n, world, batch, kind, pad=pad)
    before: set[int] = set()
    if resumed:
        first = plans(n, 2, 3, kind, pad=pad)
        before = read(first, epoch, [2, 2], n)
        for p in ps:
            p.resume(epoch, runs(before))
    done = ps[0].first_batch(epoch) + 2
    got = read(ps, epoch, [2] * world, n) | before
    for p in ps:
        state = make_state(p, shape_of(kind, n, world, batch, pad=pad), epoch=epoch, done=done)
        want = hand_state(shape_of(kind, n, world, batch, pad=pad), epoch=epoch, done=done, consumed=runs(got),
                          resumed_from=runs(before), samples=len(got))  # fmt: skip
        assert state == want
    if kind == "block" and world == 2 and not pad:
        assert any(a > 0 for a, _ in runs(got)), "the case that tells sum(b - a) from sum(b + a)"


class StatefulSampler:
    """A user's sampler with ``state_dict``/``load_state_dict``: its state is a dict naming where it is."""

    def __init__(self, n: int, tag: int = 0) -> None:
        self.n, self.at, self.tag = n, 0, tag

    def __iter__(self):
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict:
        return {"at": self.at, "tag": self.tag}

    def load_state_dict(self, state: dict) -> None:
        self.at = state["at"]


def user_plan(kind: str, n: int = 10, batch: int = 2, *, rank: int = 0, world: int = 1, tag: int = 0) -> SamplerPlan:
    inner = {"stateful": lambda: StatefulSampler(n, tag), "replayable": lambda: SequentialSampler(range(n)),
             "list": lambda: list(range(n)), "random": lambda: RandomSampler(range(n))}[kind]()  # fmt: skip
    return SamplerPlan(BatchSampler(inner, batch, False), num_samples=n, rank=rank, world_size=world)


def sampler_shape(n=10, batch=2, world=1) -> Shape:
    return Shape(seed=0, num_samples=n, shuffle=False, order="sampler", block_size=64, window=16,
                 batch_size=batch, world_size=world, drop_last=False, pad=True)  # fmt: skip


@pytest.mark.parametrize(
    "start, pending, want",
    [
        (None, None, {"at": 5, "tag": 0}),  # the epoch has not started: the sampler's state now
        ((3, {"at": 1}), None, {"at": 1}),  # the state it had at the start of this epoch
        ((2, {"at": 1}), (3, {"at": 9}), {"at": 9}),  # the start's is another epoch's: the pending one
        (None, (3, {"at": 9}), {"at": 9}),
        ((2, {"at": 1}), (4, {"at": 9}), {"at": 5, "tag": 0}),  # neither is this epoch's
        ((3, {"at": 1}), (3, {"at": 9}), {"at": 1}),  # the start's first
    ],
)
def test_make_state_with_a_users_stateful_sampler_records_the_epochs_sampler_state(start, pending, want):
    """With ``sampler=`` the state's ``sampler`` is the user's sampler state at the start of the epoch:
    held at the start (``epoch_start_state``) or waiting to be loaded (``pending_state``) for *that*
    epoch, else the sampler's state now. Kills: ``held is not None or ...`` (None[0]), ``held[1] == epoch``,
    ``held[0] != epoch``, the state now replaced by None, the state written under another key."""
    plan = user_plan("stateful")
    plan.stateful.at = 5
    plan.epoch_start_state, plan.pending_state = start, pending
    state = make_state(plan, sampler_shape(), epoch=3, done=2)
    assert state == hand_state(sampler_shape(), epoch=3, done=2, sampler=want, own=False)


def test_make_state_with_a_users_sampler_without_state():
    plan = user_plan("list")
    assert make_state(plan, sampler_shape(), epoch=1, done=4) == hand_state(sampler_shape(), epoch=1, done=4, own=False)


# ----------------------------------------------------------------------------- saved_plan


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("drop_last, pad", [(False, True), (True, True), (False, False)])
def test_saved_plan_is_the_plan_of_every_rank_that_saved_the_state(kind, drop_last, pad):
    """``saved_plan(state, rank=r)`` reads the batches rank ``r`` of the saving loader read: the same
    numbers, indices and positions. The seed (7), the block parameters (3, 2), ``shuffle=False`` and the
    rank are not the defaults, so a plan rebuilt without any of them differs.
    Kills: seed, shuffle, rank or the block parameters left out; the block test misspelt."""
    n, world, batch, epoch = 23, 3, 2, 4
    ps = plans(n, world, batch, kind, drop_last, pad)
    state = hand_state(shape_of(kind, n, world, batch, drop_last, pad), epoch=epoch, done=0)
    for r, p in enumerate(ps):
        got = saved_plan(state, rank=r)
        assert [(b.number, b.indices.tolist(), b.positions.tolist()) for b in got.batches(epoch)] == [
            (b.number, b.indices.tolist(), b.positions.tolist()) for b in p.batches(epoch)
        ]
        assert (got.seed, got.shuffle, got.rank, got.mode) == (SEED, KINDS[kind]["shuffle"], r, KINDS[kind]["order"])
        if kind == "block":
            assert (got.block_size, got.window) == (3, 2)


def test_saved_plan_of_a_state_no_loader_can_make():
    state = hand_state(shape_of("global", 10, 2, 3), epoch=0, done=0)
    state["batch_size"] = 0
    with pytest.raises(ConfigError) as e:
        saved_plan(state)
    assert str(e.value).startswith("state describes no loader FastLoader can make: ")


# ----------------------------------------------------------------------------- merge_states


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("pad", [True, False])
def test_merge_states_is_the_hand_built_state_of_every_read(kind, pad):
    """Ranks at different batches: the merged state is rank 0's with ``batches_done`` 0 and
    ``consumed`` = ``resumed_from`` = every position read (brute force); ranks at the same batch: rank
    0's state unchanged. Kills: the merged state's ``batches_done`` 1 or written under another key;
    ``resumed_from`` left as it was."""
    n, world, batch, epoch = 31, 3, 2, 1
    ps = plans(n, world, batch, kind, pad=pad)
    sh = shape_of(kind, n, world, batch, pad=pad)
    counts = [1, 3, 2]
    states = [make_state(p, sh, epoch=epoch, done=c) for p, c in zip(ps, counts)]
    got = read(ps, epoch, counts, n)
    merged = merge_states(states)
    assert merged == hand_state(sh, epoch=epoch, done=0, consumed=runs(got), resumed_from=runs(got), samples=len(got))
    same = [make_state(p, sh, epoch=epoch, done=2) for p in ps]
    assert merge_states(same) == same[0] == hand_state(sh, epoch=epoch, done=2, consumed=runs(read(ps, epoch, [2] * 3, n)))


def test_merge_states_of_a_users_sampler():
    """With ``sampler=``: ranks at the same step merge to rank 0's state, whatever each rank's own sampler
    state (``sampler`` differs by rank and is not compared); at different steps it is refused, saying why.
    Kills: the order test misspelt (a sampler's state checked against a plan of FastLoader's own, which
    ``order="sampler"`` has none of); ``sampler`` compared between ranks; the refusal's message."""
    sh = sampler_shape(world=2)
    states = [make_state(user_plan("stateful", rank=r, world=2, tag=r), sh, epoch=2, done=3) for r in range(2)]
    assert states[0]["sampler"] != states[1]["sampler"]
    assert merge_states(states) == hand_state(sh, epoch=2, done=3, sampler={"at": 0, "tag": 0}, own=False)
    states[1]["batches_done"] = 4
    raises(lambda: merge_states(states), "the ranks stand at batches [3, 4] of a loader with its own sampler=: "
           "FastLoader cannot tell which samples that sampler gave them; checkpoint all ranks at the same step")  # fmt: skip


def _two(**rank1):
    sh = shape_of("global", 20, 2, 2)
    ps = plans(20, 2, 2, "global")
    states = [make_state(p, sh, epoch=1, done=2) for p in ps]
    states[1].update(rank1)
    return states


def _without(states, r, *keys):
    for k in keys:
        del states[r][k]
    return states


NEED = "merge_states needs a list of FastLoader state_dicts, one per rank in rank order"
MERGE_ERRORS = [
    ("no states", lambda: [], NEED),
    ("a list", lambda: [[1, 2]], NEED),
    ("another format", lambda: [{"format": "other"}], NEED),
    ("version 1", lambda: [dict(s, version=1) for s in _two()], "merge_states needs version-2 states"),
    ("version True", lambda: [dict(s, version=True) for s in _two()], "merge_states needs version-2 states"),
    ("rank 0 lacks", lambda: _without(_two(), 0, "seed", "shuffle"),
     "state lacks seed, shuffle: not a complete FastLoader state_dict"),
    ("rank 1 lacks", lambda: _without(_two(), 1, "pad"), "rank 1's state lacks pad: not a complete FastLoader state_dict"),
    ("rank 1 type", lambda: _two(samples_consumed="x"),
     "rank 1's state has samples_consumed='x' (str); expected int or None"),
    ("rank 1 type bool", lambda: _two(world_size=True), "rank 1's state has world_size=True (bool); expected int"),
    ("rank 0 epoch", lambda: [dict(s, epoch=-1) for s in _two()],
     "state has an invalid position: epoch=-1, batches_done=2"),
    ("rank 1 done", lambda: _two(batches_done=-1), "rank 1's state has an invalid position: epoch=1, batches_done=-1"),
    ("rank 1 past the end", lambda: _two(batches_done=6),
     "rank 1's state has an invalid position: epoch=1, batches_done=6 (0..5)"),
    ("rank 1 consumed", lambda: _two(consumed=[[3, 2]]),
     "rank 1's state has an invalid consumed must hold ascending, disjoint [start, stop) pairs with "
     "0 <= start < stop <= 20, got [[3, 2]]"),
    ("resumed_from", lambda: [dict(s, resumed_from=[[5]]) for s in _two()],
     "state has an invalid resumed_from must be a list of [start, stop] integer pairs, got the item [5]"),
    ("world", lambda: [dict(s, world_size=3) for s in _two()], "merge_states got 2 states for world_size=3: give one per rank"),
    ("rank 1 seed", lambda: _two(seed=8), "rank 1's state has seed=8 but rank 0's has 7"),
    ("rank 1 consumed wrong", lambda: _two(consumed=[[0, 9]]),
     "rank 1's state has consumed=[[0, 9]] but batches_done=2 of epoch 1 consumes [[0, 8]]: not a state a "
     "FastLoader saved"),
]  # fmt: skip


@pytest.mark.parametrize("what, states, message", MERGE_ERRORS, ids=[m[0] for m in MERGE_ERRORS])
def test_merge_states_refuses_naming_the_rank_and_the_field(what, states, message):
    """Each refusal with its exact message: rank 0's state is "state", rank r's "rank r's state".
    Kills: the list test as ``and`` (an empty list: IndexError), the dict test as ``or`` (a list:
    AttributeError), the version test as ``and``, a missing field as a KeyError, the names of the
    rank or the field dropped or misspelt, the message replaced by None."""
    raises(lambda: merge_states(states()), message)


# ----------------------------------------------------------------------------- checked_state


def test_checked_state_refuses_versions_and_incomplete_states():
    """Kills: the version test as ``and`` (version 3 accepted), the message None, a missing field a KeyError,
    the name "state" in the message misspelt or None."""
    sh = shape_of("global", 20, 2, 2)
    plan = plans(20, 2, 2, "global")[0]
    good = hand_state(sh, epoch=1, done=1, consumed=[[0, 4]])
    assert checked_state(good, plan, sh) == good
    for v in (3, True, "2", None, 0):
        raises(lambda: checked_state(dict(good, version=v), plan, sh),
               f"state version {v!r} is not supported (expected 2, or 1)")  # fmt: skip
    raises(lambda: checked_state({k: v for k, v in good.items() if k != "window"}, plan, sh),
           "state lacks window: not a complete FastLoader state_dict")  # fmt: skip
    raises(lambda: checked_state([good], plan, sh), f"state is not a FastLoader state_dict: {[good]!r:.80}")


def test_checked_state_compares_the_block_parameters_only_of_a_block_order():
    """A block order resumes only with the same ``block_size`` and ``window``; a global order ignores
    them (the loader records its settings, unused). Kills: the block test inverted or misspelt, either
    parameter compared with None or not compared."""
    sh = shape_of("block", 20, 2, 2)
    plan = plans(20, 2, 2, "block")[0]
    good = hand_state(sh, epoch=1, done=0)
    assert checked_state(good, plan, sh) == good
    raises(lambda: checked_state(dict(good, block_size=4), plan, sh),
           "state has block_size=4 but this loader has block_size=3; resume needs the same")  # fmt: skip
    raises(lambda: checked_state(dict(good, window=5), plan, sh),
           "state has window=5 but this loader has window=2; resume needs the same")  # fmt: skip
    g = shape_of("global", 20, 2, 2)
    gplan = plans(20, 2, 2, "global")[0]
    other = dict(hand_state(g, epoch=1, done=0), block_size=64, window=16)
    loader = dataclass_replace(g, block_size=32, window=8)
    assert checked_state(other, gplan, loader) == other


def dataclass_replace(shape: Shape, **kw) -> Shape:
    import dataclasses

    return dataclasses.replace(shape, **kw)


# ----------------------------------------------------------------------------- resume_position


POINTS = ("start", "one batch", "last batch", "end", "merged")
RESUME_POSITIONS = [
    (kind, before, after, drop_last, pad, point)
    for kind in KINDS
    for before, after in (((2, 3), (2, 3)), ((2, 3), (3, 2)), ((3, 2), (1, 4)), ((1, 4), (1, 4)))
    for drop_last, pad in ((False, True), (True, True), (False, False))
    for point in POINTS
]  # fmt: skip


@pytest.mark.parametrize("kind, before, after, drop_last, pad, point", RESUME_POSITIONS)
def test_resume_position_table(kind, before, after, drop_last, pad, point):
    """A state saved on ``before`` = (world, batch) at a point of epoch 3, resumed on ``after``: the
    Position every rank of ``after`` gets, expected from first principles:

    * the same world and batch, a rank's own state at batch ``d`` of a fresh epoch: ``(3, d)`` and
      nothing resumed; at the end: ``(4, 0)``;
    * a merged state (``batches_done`` 0, ``consumed`` = ``resumed_from`` = what was read), or another
      world or batch mid-epoch: ``(3, len - batches of the remainder)`` (the docs' numbering, the
      remainder's share by DistributedSampler's rule), resuming after what was read (brute force);
    * another world after the last batch: ``(4, 0)`` (what the saving ranks left out stays out);
      a remainder of no batches on this rank: ``(4, 0)``.

    Kills: the same-world test inverted or None; ``first_batch`` of the plan's own resume (None) for the
    merged state or another world; the end-of-epoch checks as ``>=``/``>``; ``epoch = 1`` for ``+= 1``;
    start 1 for 0; the empty consumed of another shape or dtype."""
    n, epoch = 29, 3
    (w1, b1), (w2, b2) = before, after
    saving = plans(n, w1, b1, kind, drop_last, pad)
    total = len(saving[0])
    done = {"start": 0, "one batch": 1, "last batch": total - 1, "end": total, "merged": 0}[point]
    counts = [done] * w1
    if point == "merged":
        counts = [min(1 + r, total) for r in range(w1)]
    got = read(saving, epoch, counts, n)
    if point == "merged":
        state = hand_state(shape_of(kind, n, w1, b1, drop_last, pad), epoch=epoch, done=0, consumed=runs(got),
                           resumed_from=runs(got))  # fmt: skip
    else:
        state = hand_state(shape_of(kind, n, w1, b1, drop_last, pad), epoch=epoch, done=done, consumed=runs(got))
    same = (w1, b1) == (w2, b2)
    sh = shape_of(kind, n, w2, b2, drop_last, pad)
    for r, plan in enumerate(plans(n, w2, b2, kind, drop_last, pad)):
        pos = resume_position(state, plan, sh, sampler_name="x")
        length = batches_of(share(n, w2, r, drop_last, pad), b2, drop_last)
        assert length == len(plan)
        if same and point != "merged":
            want = (epoch + 1, 0, []) if done >= length else (epoch, done, [])
        elif point == "end" and not same:
            want = (epoch + 1, 0, [])
        elif not got:
            want = (epoch, 0, [])
        else:
            first = first_batch_oracle(n, len(got), w2, b2, r, drop_last, pad)
            want = (epoch + 1, 0, []) if first >= length else (epoch, first, runs(got))
        assert_position(pos, *want)


@pytest.mark.parametrize("kind", list(KINDS))
def test_resume_position_of_a_ranks_state_of_a_resumed_epoch_on_the_same_world(kind):
    """A rank's state saved mid-way through an epoch it had resumed: on the same world and batch the
    loader continues that very plan at the saved batch, resuming after what had been consumed before
    it (``resumed_from``), not re-sharing what is left now. Kills: the "very plan" test inverted, or
    made without the state's ``resumed_from`` (the plan's own, none)."""
    n, epoch = 29, 2
    first = plans(n, 2, 3, kind)
    before = read(first, epoch, [2, 2], n)
    ps = plans(n, 3, 2, kind)
    for p in ps:
        p.resume(epoch, runs(before))
    start = ps[0].first_batch(epoch)
    assert start == first_batch_oracle(n, len(before), 3, 2, 0, False, True)
    done = start + 1
    got = read(ps, epoch, [1, 1, 1], n) | before
    sh = shape_of(kind, n, 3, 2)
    state = hand_state(sh, epoch=epoch, done=done, consumed=runs(got), resumed_from=runs(before))
    for plan in plans(n, 3, 2, kind):  # a fresh loader: its plan not resumed
        assert_position(resume_position(state, plan, sh, sampler_name="x"), epoch, done, runs(before))


def test_resume_position_refuses_naming_the_field():
    """Each refusal with its exact message. Kills: ``resumed_from`` checked under another name or
    without its range (a TypeError); the subset test inverted (every resumed state refused); the
    position test as ``and``; the messages None or misspelt."""
    n = 20
    sh = shape_of("global", n, 2, 2)
    plan = plans(n, 2, 2, "global")[0]
    other = shape_of("global", n, 4, 2)
    oplan = plans(n, 4, 2, "global")[0]

    def st(**kw):
        return dict(hand_state(sh, epoch=1, done=1, consumed=[[0, 4]]), **kw)

    cases = [
        (st(resumed_from=[[5]]), sh, plan,
         "state has an invalid resumed_from must be a list of [start, stop] integer pairs, got the item [5]"),
        (st(resumed_from=[[0, 21]]), sh, plan,
         "state has an invalid resumed_from must hold [start, stop) pairs within 0..20, got 21"),
        (st(consumed=[[0, 21]]), sh, plan, "state has an invalid consumed must hold [start, stop) pairs within 0..20, got 21"),
        (st(resumed_from=[[2, 6]]), sh, plan, "state has resumed_from outside consumed: not a FastLoader state_dict"),
        (st(epoch=-1, done=0, consumed=[]), sh, plan, "state has an invalid position: epoch=-1, batches_done=1"),
        (dict(st(), epoch=-1, batches_done=0, consumed=[]), sh, plan, "state has an invalid position: epoch=-1, batches_done=0"),
        (dict(st(), batches_done=-1, consumed=[]), sh, plan, "state has an invalid position: epoch=1, batches_done=-1"),
        (dict(st(), batches_done=6, consumed=[]), sh, plan, "state has an invalid position: epoch=1, batches_done=6 (0..5)"),
        (dict(st(), batches_done=6, consumed=[]), other, oplan,
         "state has an invalid position: epoch=1, batches_done=6 (0..5)"),
    ]  # fmt: skip
    for state, shape, p, message in cases:
        raises(lambda: resume_position(state, p, shape, sampler_name="x"), message)
    # a genuine resumed state: resumed_from inside consumed is accepted
    ok = st(consumed=[[0, 8]], resumed_from=[[0, 4]], batches_done=0)
    assert_position(resume_position(ok, plan, sh, sampler_name="x"), 1, first_batch_oracle(n, 8, 2, 2, 0, False, True),
                    [[0, 8]])  # fmt: skip


# ----------------------------------------------------------------------------- a user's sampler


@pytest.mark.parametrize("kind", ["stateful", "replayable", "list", "random"])
@pytest.mark.parametrize("done", [0, 1, 2, 4, 5])
def test_resume_position_with_a_users_sampler(kind, done):
    """10 samples in batches of 2 (5 batches). At the start: ``(e, 0)``, nothing to load; at the end:
    ``(e + 1, 0)``; mid-epoch: ``(e, done)``, with the sampler's state to load where it has one, refused
    where the sampler can neither be put back nor replayed (a RandomSampler).
    Kills: the end test as ``>=``; ``mid`` from 1 or up to ``len``; the stateful test inverted; the
    next epoch's numbers; the pending state given at the start or without a stateful sampler."""
    plan = user_plan(kind)
    sh = sampler_shape()
    sampler = {"at": 3} if kind == "stateful" else None
    state = hand_state(sh, epoch=6, done=done, sampler=sampler, own=False)
    mid = 0 < done < 5
    if mid and kind == "random":
        raises(lambda: resume_position(state, plan, sh, sampler_name="RandomSampler"),
               "the sampler RandomSampler has no state_dict()/load_state_dict(), and iterating it again may give "
               "another order, so the rest of epoch 6 cannot be resumed exactly: give a sampler that has them (or "
               "a DistributedSampler, a SequentialSampler, a list of indices), or resume from a checkpoint taken "
               "at the end of an epoch")  # fmt: skip
        return
    pos = resume_position(state, plan, sh, sampler_name="x")
    if done == 5:
        assert_position(pos, 7, 0)
    else:
        assert_position(pos, 6, done, sampler_state=(6, {"at": 3}) if mid and kind == "stateful" else None)


def test_resume_position_with_a_users_sampler_refuses_naming_why():
    """Kills: the stateful test inverted (a replayable sampler with no state refused, a stateful one
    without its state accepted); the messages None or changed."""
    sh = sampler_shape()
    raises(lambda: resume_position(hand_state(sh, epoch=1, done=2, own=False), user_plan("stateful"), sh,
                                   sampler_name="StatefulSampler"),
           "state has sampler=None but the sampler StatefulSampler resumes from its own state")  # fmt: skip
    raises(lambda: resume_position(hand_state(sh, epoch=1, done=6, own=False), user_plan("list"), sh, sampler_name="x"),
           "state has an invalid position: epoch=1, batches_done=6 (0..5)")  # fmt: skip
    for k, v in (("world_size", 2), ("batch_size", 3)):
        state = dict(hand_state(sh, epoch=1, done=2, own=False), **{k: v})
        raises(lambda: resume_position(state, user_plan("list"), sh, sampler_name="x"),
               f"state has {k}={v} but this loader has {k}={getattr(sh, k)}: with a sampler= of your own the "
               "sampler shares the epoch among the ranks, so FastLoader resumes it only on the same "
               f"{k} (without sampler=, FastLoader's own order resumes on any)")  # fmt: skip


# ----------------------------------------------------------------------------- version 1


def v1_state(shape: Shape, *, epoch, done, **kw):
    s = {"format": "fastload.FastLoader", "version": 1, "epoch": epoch, "batches_done": done, "seed": shape.seed,
         "num_samples": shape.num_samples, "batch_size": shape.batch_size, "world_size": shape.world_size,
         "rank": 0, "shuffle": shape.shuffle, "drop_last": shape.drop_last}  # fmt: skip
    s.update(kw)
    return s


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("pad", [True, False])
@pytest.mark.parametrize("point", ["start", "mid", "end", "past the end"])
def test_upgrade_v1_is_the_hand_built_version_2_state(kind, pad, point):
    """A version-1 state (one rank's batch count) as version 2: its fields kept, ``consumed`` what every
    rank read in ``done`` batches from the epoch's start (brute force), whatever the plan's own resume;
    a count past the end consumes nothing here (the position check refuses it later).
    Kills: ``format``/``version`` under other keys; ``sum(b + a)`` (block order, no padding: stretches
    not at 0); the range test as ``done < len`` or joined by ``or``; the plan's own resume used."""
    n, world, batch, epoch = 29, 2, 3, 5
    ps = plans(n, world, batch, kind, pad=pad)
    total = len(ps[0])
    done = {"start": 0, "mid": 2, "end": total, "past the end": total + 1}[point]
    got = read(ps, epoch, [done] * world, n) if done <= total else set()
    sh = shape_of(kind, n, world, batch, pad=pad)
    plan = plans(n, world, batch, kind, pad=pad)[0]
    plan.resume(epoch, [[0, 3]])  # a resume of the loader's own: a version-1 count knows nothing of it
    old = v1_state(sh, epoch=epoch, done=done)
    want = dict(hand_state(sh, epoch=epoch, done=done, consumed=runs(got), samples=len(got)), rank=0)
    assert upgrade_v1(old, plan, sh) == want
    if kind == "block" and not pad and point == "mid":
        assert any(a > 0 for a, _ in runs(got))


def test_upgrade_v1_of_a_users_sampler_consumes_nothing():
    """Kills: the own-order test joined by ``or`` (a SamplerPlan has no ``consumed_after``); consumed None."""
    sh = sampler_shape()
    old = v1_state(sh, epoch=1, done=2)
    want = dict(hand_state(sh, epoch=1, done=2), rank=0)
    assert upgrade_v1(old, user_plan("list"), sh) == want


def test_upgrade_v1_refuses_another_world_or_batch_and_incomplete_states():
    """Kills: ``batch_size`` misspelt in the comparison; a missing field a KeyError; the messages."""
    sh = shape_of("global", 20, 2, 2)
    plan = plans(20, 2, 2, "global")[0]
    for k, v in (("batch_size", 4), ("world_size", 3)):
        raises(lambda: upgrade_v1(v1_state(sh, epoch=1, done=1, **{k: v}), plan, sh),
               f"state is a version-1 state (saved by a fastload without elastic resume) with {k}={v}, but this "
               f"loader has {k}={getattr(sh, k)}: a version-1 state resumes only on the same world_size and "
               "batch_size; save it again with this version to change them")  # fmt: skip
    old = v1_state(sh, epoch=1, done=1)
    del old["seed"], old["rank"]
    raises(lambda: upgrade_v1(old, plan, sh), "state lacks seed, rank: not a complete FastLoader state_dict")


# ----------------------------------------------------------------------------- properties (hypothesis)

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HYP = settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])


@HYP
@given(
    n=st.integers(1, 40), w1=st.integers(1, 4), b1=st.integers(1, 5), w2=st.integers(1, 4), b2=st.integers(1, 5),
    kind=st.sampled_from(list(KINDS)), pad=st.booleans(), data=st.data(),
)  # fmt: skip
def test_merge_then_resume_reads_every_sample_once(n, w1, b1, w2, b2, kind, pad, data):
    """For any dataset size, worlds, batch sizes, order and per-rank stopping points: the merged state's
    ``consumed`` is exactly what the ranks read (brute force), and the ranks of another world resuming
    it read each of the other samples exactly once (without drop_last, nothing is lost)."""
    ps = plans(n, w1, b1, kind, pad=pad)
    total = len(ps[0])
    counts = [data.draw(st.integers(0, len(p)), label=f"rank {r}") for r, p in enumerate(ps)]
    sh = shape_of(kind, n, w1, b1, pad=pad)
    merged = merge_states([make_state(p, sh, epoch=2, done=c) for p, c in zip(ps, counts)])
    got = read(ps, 2, counts, n)
    assert merged["consumed"] == runs(got) and merged["samples_consumed"] == len(got)
    assert total == len(ps[0])
    rest: list[int] = []
    sh2 = shape_of(kind, n, w2, b2, pad=pad)
    for plan in plans(n, w2, b2, kind, pad=pad):
        pos = resume_position(merged, plan, sh2, sampler_name="x")
        if pos.epoch != 2:  # nothing left of epoch 2 here
            continue
        plan.resume(pos.epoch, pos.consumed)
        for b in plan.batches(pos.epoch, pos.batch):
            rest += [int(p) for p in b.positions if p < n]
    assert not set(rest) & got
    left = sorted(set(range(n)) - got)
    if pad:  # every rank reads its whole share of the remainder; padding repeats, positions do not
        assert sorted(set(rest)) == left
    else:
        assert sorted(rest) == left
