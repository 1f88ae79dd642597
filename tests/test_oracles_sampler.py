"""fastload.sampler and fastload.resume checked against oracles of their own.

* Shares of the ranks against ``torch.utils.data.DistributedSampler`` itself where the semantics
  match (no shuffle: the very same indices; the same batches as ``DataLoader(sampler=...)``), and
  against DistributedSampler's padding and striding written out over the epoch's permutation
  when shuffled (the permutation differs: fastload's is NumPy's, seeded by (seed, epoch)).
* The shuffle's law: every sample equally likely at every position (chi-square), epochs and
  seeds independent, the order independent of the world and batch size.
* Resume as a table (order kind x world before x world after x drop_last x pad x resume point),
  every expectation brute-forced from the positions the ranks actually read: what was consumed,
  what the remainder gives each rank (DistributedSampler's rule over the unconsumed positions,
  padded from the head of the epoch's order), the batch numbers and counts; ``merge_states`` of
  ranks at different batches, of an epoch that was already resumed once.
* FastLoader on a tiny dataset (CPU): ``sampler=`` x ``drop_last`` x ranks against DataLoader, and
  training crops on two ranks with ``sampler=`` at the positions ``k * world_size + rank``.

Hypothesis runs with a fixed derandomised seed (``derandomize=True``): every run tries the same inputs.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from torch.utils.data import BatchSampler, DataLoader, DistributedSampler

import fastload
from fastload import FastLoader
from fastload.resume import Shape, make_state, merge_states
from fastload.sampler import EpochSampler, interval_mask, intervals_of

from conftest import decode_batch, encode_color, position_pattern, save_lossless_jpeg, write_image

try:
    from scipy import stats as _sstats
except ImportError:  # pragma: no cover
    _sstats = None

HYP = settings(max_examples=200, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.too_slow])

KINDS = {
    "global": {"shuffle": True, "order": "global"},
    "sequential": {"shuffle": False, "order": "global"},
    "block": {"shuffle": True, "order": "block", "block_size": 3, "window": 2},
}


def _flat(batches) -> list[int]:
    return [int(i) for b in batches for i in (b.indices if hasattr(b, "indices") else b)]


def dist_layout(perm: list[int], world: int, rank: int, drop_last: bool) -> list[int]:
    """``DistributedSampler.__iter__`` (torch/utils/data/distributed.py) written out over ``perm``."""
    n = len(perm)
    if drop_last and n % world != 0:
        num_samples = math.ceil((n - world) / world)
    else:
        num_samples = math.ceil(n / world)
    total = num_samples * world
    indices = list(perm)
    if not drop_last:
        padding_size = total - len(indices)
        if padding_size <= len(indices):
            indices += indices[:padding_size]
        else:
            indices += (indices * math.ceil(padding_size / len(indices)))[:padding_size]
    else:
        indices = indices[:total]
    assert len(indices) == total
    return indices[rank:total:world]


def batched(xs: list[int], batch: int, drop_last: bool) -> list[list[int]]:
    """``BatchSampler`` written out."""
    out = [xs[i : i + batch] for i in range(0, len(xs), batch)]
    if drop_last and out and len(out[-1]) < batch:
        out.pop()
    return out


# ----------------------------------------------------------------------------- fresh epochs against DistributedSampler


@HYP
@given(n=st.integers(1, 90), world=st.integers(1, 6), batch=st.integers(1, 9), drop_last=st.booleans(), epoch=st.integers(0, 5))
def test_unshuffled_shares_are_distributed_samplers_batches(n, world, batch, drop_last, epoch):
    """No shuffle: each rank's batches are exactly ``BatchSampler(DistributedSampler(shuffle=False))``'s.

    Kills: ``per_rank`` rounded the wrong way, padding from the tail, ranks striding from 0, the
    last partial batch dropped without drop_last or kept with it, ``len`` off by one."""
    for rank in range(world):
        s = EpochSampler(num_samples=n, batch_size=batch, shuffle=False, drop_last=drop_last, rank=rank, world_size=world)
        ds = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=False, drop_last=drop_last)
        ds.set_epoch(epoch)
        ref = [list(b) for b in BatchSampler(ds, batch, drop_last)]
        got = [b.indices.tolist() for b in s.batches(epoch)]
        assert got == ref
        assert len(s) == len(ref) == s.num_batches(epoch)
        assert s.per_rank == len(ds) and s.total == ds.total_size
        assert [b.number for b in s.batches(epoch)] == list(range(len(ref)))


@HYP
@given(n=st.integers(1, 90), world=st.integers(1, 6), batch=st.integers(1, 9), drop_last=st.booleans(),
       seed=st.integers(0, 2**64 - 1), epoch=st.integers(0, 2**20))  # fmt: skip
def test_shuffled_shares_are_distributed_samplers_layout_of_the_epochs_permutation(n, world, batch, drop_last, seed, epoch):
    """Shuffled: the epoch's order is a permutation of all samples, and each rank's indices and
    positions are DistributedSampler's padding and striding of it (written out above).

    Kills: padding repeated from the wrong end, a rank reading ``rank * per_rank + k`` with the global
    order, positions that are not the slot's (so crops that are not the sample's own)."""
    samplers = [EpochSampler(num_samples=n, batch_size=batch, drop_last=drop_last, seed=seed, rank=r, world_size=world)
                for r in range(world)]  # fmt: skip
    perm = samplers[0].base_order(epoch).tolist()
    assert sorted(perm) == list(range(n))
    for r, s in enumerate(samplers):
        assert s.base_order(epoch).tolist() == perm  # one order for all ranks
        want = dist_layout(perm, world, r, drop_last)
        got = s.batches(epoch)
        bs = list(got)
        assert [b.indices.tolist() for b in bs] == batched(want, batch, drop_last)
        pos = np.concatenate([b.positions for b in bs]) if bs else np.empty(0, dtype=np.int64)
        idx = np.concatenate([b.indices for b in bs]) if bs else np.empty(0, dtype=np.int64)
        total = len(want) * world
        assert pos.tolist() == list(range(r, total, world))[: len(pos)]  # slot k*world + r
        real = pos < n
        assert (np.asarray(perm)[pos[real]] == idx[real]).all()


@HYP
@given(n=st.integers(0, 60), world=st.integers(1, 6), batch=st.integers(1, 7), kind=st.sampled_from(["global", "sequential"]))
def test_without_padding_every_sample_is_read_by_exactly_one_rank(n, world, batch, kind):
    """``pad=False``: rank r reads positions r, r + world, ... < n; together every sample once.

    Kills: ``pad=False`` padding anyway; ``range(rank, n, world)`` off by one; an empty rank crashing."""
    samplers = [EpochSampler(num_samples=n, batch_size=batch, pad=False, seed=3, rank=r, world_size=world, **KINDS[kind])
                for r in range(world)]  # fmt: skip
    perm = samplers[0].base_order(1)
    seen = []
    for r, s in enumerate(samplers):
        bs = list(s.batches(1))
        assert _flat(bs) == perm[r::world].tolist()
        assert len(s) == len(bs) == -(-len(range(r, n, world)) // batch)
        seen += _flat(bs)
    assert sorted(seen) == list(range(n))


def test_the_order_does_not_depend_on_the_world_or_the_batch_size():
    """Position p is the same sample whatever the world size, rank and batch size (crops follow
    positions, so a sample's crop is the same on any world). Kills: world size mixed into the seed."""
    n = 97
    ref = EpochSampler(num_samples=n, batch_size=1, seed=12).base_order(3)
    for world in (1, 2, 5):
        for batch in (1, 7):
            for kind in ("global", "block"):
                s = EpochSampler(num_samples=n, batch_size=batch, seed=12, rank=world - 1, world_size=world, **KINDS[kind])
                other = EpochSampler(num_samples=n, batch_size=1, seed=12, **KINDS[kind]).base_order(3)
                assert np.array_equal(s.base_order(3), other)
    assert np.array_equal(EpochSampler(num_samples=n, batch_size=3, seed=12, world_size=4, rank=2).base_order(3), ref)


# ----------------------------------------------------------------------------- the shuffle's law


def test_the_shuffle_puts_every_sample_at_every_position_equally_often():
    """8 samples over 4000 epochs: the sample-by-position counts against 500 each, chi-square with
    49 degrees of freedom, rejecting at p < 1e-3 (the statistic at that level: 85.4).

    Kills: a permutation that is a rotation or reversal of the last; a shuffle of only a part."""
    n, epochs = 8, 4000
    s = EpochSampler(num_samples=n, batch_size=2, seed=99)
    counts = np.zeros((n, n))
    for e in range(epochs):
        counts[np.arange(n), s.base_order(e)] += 1
    expected = epochs / n
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 85.4, f"chi-square {chi2:.1f} over 49 df"
    if _sstats is not None:
        assert _sstats.chi2.sf(chi2, (n - 1) ** 2) > 1e-3


@pytest.mark.parametrize("what", ["epoch", "seed", "high seed bit"])
def test_orders_of_neighbouring_epochs_and_seeds_are_independent(what):
    """Spearman correlation of the orders of (seed, e) and (seed, e+1) (or seed+1, or seed + 2**63)
    under 4.5 / sqrt(n), n = 20000, and fewer than 10 samples at the same position.

    Kills: the epoch (or the seed) not seeding the generator; the seed taken modulo 2**32."""
    n = 20000
    a = EpochSampler(num_samples=n, batch_size=1, seed=7).base_order(4)
    if what == "epoch":
        b = EpochSampler(num_samples=n, batch_size=1, seed=7).base_order(5)
    elif what == "seed":
        b = EpochSampler(num_samples=n, batch_size=1, seed=8).base_order(4)
    else:
        b = EpochSampler(num_samples=n, batch_size=1, seed=7 + 2**63).base_order(4)
    assert abs(np.corrcoef(a, b)[0, 1]) < 4.5 / math.sqrt(n)
    assert (a == b).sum() < 10


# ----------------------------------------------------------------------------- resume, as a table


def _reads(samplers, epoch, counts):
    """``{rank: [(number, index, position)...]}``: each rank's first ``counts[rank]`` batches *read*
    (from the start of its plan, resumed or not)."""
    out = {}
    for r, s in enumerate(samplers):
        got = []
        for k, b in enumerate(s.batches(epoch)):
            if k >= counts[r]:
                break
            got += [(b.number, int(i), int(p)) for i, p in zip(b.indices, b.positions)]
        out[r] = got
    return out


def _consumed(reads, n) -> set[int]:
    return {p for got in reads.values() for _, _, p in got if p < n}


def _samplers(n, world, batch, kind, drop_last, pad, seed=5):
    return [EpochSampler(num_samples=n, batch_size=batch, world_size=world, rank=r, drop_last=drop_last, pad=pad,
                         seed=seed, **KINDS[kind]) for r in range(world)]  # fmt: skip


def _remainder_oracle(order, rem, n, world, rank, drop_last, pad, kind):
    """What rank ``rank`` reads of the remainder ``rem`` (unconsumed positions, ascending), from the
    docs (sampler module docstring): DistributedSampler's rule over the m = len(rem) positions,
    padding slots (m and above) repeating the head of the epoch's order; block order: contiguous
    stretches of the same lengths. Returns ``[(index, position)]`` (padding: position n + slot - m)."""
    m = len(rem)
    if drop_last:
        per, total = m // world, (m // world) * world
    elif pad:
        per = -(-m // world) if m else 0
        total = per * world
    else:
        per, total = len(range(rank, m, world)), m
    if kind == "block":
        if drop_last or pad:
            slots = list(range(rank * per, rank * per + per))
        else:
            base, extra = divmod(m, world)
            start = rank * base + min(rank, extra)
            slots = list(range(start, start + per))
    else:
        slots = list(range(rank, total, world))
    out = []
    for s in slots:
        if s < m:
            out.append((int(order[rem[s]]), int(rem[s])))
        else:
            out.append((int(order[(s - m) % n]), n + s - m))
    return out


RESUME_TABLE = [
    (kind, w1, w2, drop_last, pad, point)
    for kind in ("global", "sequential", "block")
    for (w1, w2) in ((1, 1), (2, 3), (3, 2), (4, 1))
    for (drop_last, pad) in ((False, True), (True, True), (False, False))
    for point in ("start", "one batch", "mid", "last batch")
]  # fmt: skip


@pytest.mark.parametrize("kind, w1, w2, drop_last, pad, point", RESUME_TABLE)
def test_resume_table(kind, w1, w2, drop_last, pad, point):
    """An epoch read partly on ``w1`` ranks (batch 3), resumed on ``w2`` ranks (batch 2).

    Expected from the reads alone: ``consumed_after`` is the set of positions the ranks read; the
    resumed ranks read exactly the remainder the docs describe (``_remainder_oracle``); nothing
    consumed is read again; with padding every sample of the epoch is read; the batch numbers run up to
    ``len(sampler) - 1`` and ``first_batch + num_batches == len``. Kills: padding counted as consumed;
    ``first_batch`` computed on the wrong world; the remainder not sorted in the order's order; a resume
    that restarts the epoch; ``_slots`` ignoring drop_last on the remainder."""
    n, epoch = 29, 3
    before = _samplers(n, w1, 3, kind, drop_last, pad)
    total = len(before[0])
    k = {"start": 0, "one batch": 1, "mid": total // 2, "last batch": max(total - 1, 0)}[point]
    reads = _reads(before, epoch, [k] * w1)
    consumed = _consumed(reads, n)
    iv = before[0].consumed_after(epoch, k)
    assert iv == intervals_of(np.isin(np.arange(n), sorted(consumed)))
    after = _samplers(n, w2, 2, kind, drop_last, pad)
    order = after[0].base_order(epoch)
    rem = [p for p in range(n) if p not in consumed]
    later: set[int] = set()
    for r, s in enumerate(after):
        s.resume(epoch, iv)
        got = list(s.batches(epoch))
        flat = [(int(i), int(p)) for b in got for i, p in zip(b.indices, b.positions)]
        want = _remainder_oracle(order, rem, n, w2, r, drop_last, pad, kind)
        if drop_last:
            want = want[: len(want) // 2 * 2]  # whole batches only
        assert flat == want, f"rank {r}"
        assert len(s.rank_indices(epoch)) == len(_remainder_oracle(order, rem, n, w2, r, drop_last, pad, kind))
        first = s.first_batch(epoch)
        assert [b.number for b in got] == list(range(first, first + len(got)))
        assert first + s.num_batches(epoch) == len(s)
        if got:
            assert got[-1].number == len(s) - 1
        for i, p in flat:
            if p < n:
                assert p not in consumed and order[p] == i
                later.add(p)
    if not drop_last:
        assert consumed | later == set(range(n)), "a sample of the epoch was never read"
        assert not consumed & later
    # the next epoch is whole again
    for s in after:
        assert s.first_batch(epoch + 1) == 0 and len(list(s.batches(epoch + 1))) == len(s)


def _shape(s: EpochSampler) -> Shape:
    return Shape(seed=s.seed, num_samples=s.num_samples, shuffle=s.shuffle, order=s.mode,
                 block_size=s.block_size if s.mode == "block" else None, window=s.window if s.mode == "block" else None,
                 batch_size=s.batch_size, world_size=s.world_size, drop_last=s.drop_last, pad=s.pad)  # fmt: skip


@pytest.mark.parametrize("kind", ["global", "block", "sequential"])
@pytest.mark.parametrize("pad", [True, False])
def test_merge_states_of_an_epoch_already_resumed_once_is_exactly_what_was_read(kind, pad):
    """Read 2 batches on 3 ranks, resume on 2 ranks, which stop at different batches; their states
    merged: ``consumed`` is every position read, in both stints (brute-forced from the reads), and a
    third world resuming it reads the rest, each sample once.

    Kills: merge_states dropping ``resumed_from``; ``consumed_after`` counting batch numbers from 0
    on a resumed epoch; a rank's ``done`` read as batches of the remainder."""
    n, epoch = 40, 2
    first = _samplers(n, 3, 3, kind, False, pad)
    r1 = _reads(first, epoch, [2, 2, 2])
    c1 = _consumed(r1, n)
    iv1 = first[0].consumed_after(epoch, 2)
    second = _samplers(n, 2, 4, kind, False, pad)
    for s in second:
        s.resume(epoch, iv1)
    counts = [1, 3]  # batches read after the resume
    r2 = _reads(second, epoch, counts)
    c2 = _consumed(r2, n)
    assert not c1 & c2
    states = [make_state(s, _shape(s), epoch=epoch, done=s.first_batch(epoch) + c) for s, c in zip(second, counts)]
    for st_ in states:
        assert st_["resumed_from"] == iv1
    merged = merge_states(states)
    assert merged["consumed"] == intervals_of(np.isin(np.arange(n), sorted(c1 | c2)))
    assert merged["samples_consumed"] == len(c1 | c2)
    third = _samplers(n, 5, 2, kind, False, pad)
    rest = set()
    for s in third:
        s.resume(epoch, merged["consumed"])
        for b in s.batches(epoch):
            for p in b.positions.tolist():
                if p < n:
                    assert p not in rest and p not in c1 | c2
                    rest.add(p)
    assert c1 | c2 | rest == set(range(n))


def test_make_state_on_every_rank_at_the_same_step_is_the_same_state():
    """A state describes the epoch: ranks that read as many batches give equal states; its
    ``consumed`` is the union of all ranks' reads, not one rank's. Kills: consumed of rank 0 only."""
    n, epoch = 31, 1
    ss = _samplers(n, 3, 2, "global", False, True)
    states = [make_state(s, _shape(s), epoch=epoch, done=3) for s in ss]
    assert all(st_ == states[0] for st_ in states)
    want = _consumed(_reads(ss, epoch, [3, 3, 3]), n)
    assert states[0]["consumed"] == intervals_of(np.isin(np.arange(n), sorted(want)))
    assert states[0]["samples_consumed"] == len(want) == 18


@HYP
@given(n=st.integers(1, 50), data=st.data())
def test_interval_mask_and_intervals_of_are_inverse(n, data):
    """Any mask -> intervals -> mask round trip; intervals sorted, disjoint, non-touching, maximal."""
    mask = np.array(data.draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    iv = intervals_of(mask)
    assert np.array_equal(interval_mask(np.array(iv, dtype=np.int64).reshape(-1, 2), n), mask)
    assert np.array_equal(interval_mask(iv, n), mask)  # a plain list too, the empty one included
    for (a, b), (c, d) in zip(iv, iv[1:]):
        assert a < b < c < d
    assert sum(b - a for a, b in iv) == int(mask.sum())


# ----------------------------------------------------------------------------- FastLoader on a tiny dataset

N_TINY = 13


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """13 solid-colour images whose colour encodes their index (one class), packed."""
    root = tmp_path_factory.mktemp("oracles_sampler")
    for i in range(N_TINY):
        write_image(root / "src" / "class_0" / f"{i:03d}.jpg", encode_color(0, i), size=(40, 32), quality=95)
    fastload.pack(root / "src", root / "packed", progress=False, workers=1)
    return root / "packed"


@pytest.fixture(scope="module")
def patterned(tmp_path_factory):
    """6 position images (pixels encode their coordinates: every crop and flip shows), packed."""
    root = tmp_path_factory.mktemp("oracles_sampler_pattern")
    for i in range(6):
        save_lossless_jpeg(root / "src" / "class_0" / f"{i:02d}.jpg", position_pattern(64 + 8 * i, 48, 0))
    fastload.pack(root / "src", root / "packed", progress=False, workers=1)
    return root / "packed"


def _indices(loader) -> list[list[int]]:
    return [[i for _label, i in decode_batch(x.numpy(), fastload.IMAGENET_MEAN, fastload.IMAGENET_STD)] for x, _ in loader]


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("shuffle", [False, True])
def test_sampler_argument_with_drop_last_on_ranks_is_dataloaders(tiny, world, drop_last, shuffle):
    """``FastLoader(sampler=DistributedSampler(...), drop_last=...)`` on each rank yields the batches
    ``DataLoader(range(n), sampler=the same, drop_last=...)`` yields (indices read from the pixels),
    and ``len`` agrees. Kills: ``drop_last`` ignored with ``sampler=``, the last partial batch kept."""
    for rank in range(world):
        ds = DistributedSampler(range(N_TINY), num_replicas=world, rank=rank, shuffle=shuffle, seed=4, drop_last=drop_last)
        ds.set_epoch(1)
        ref = [b.tolist() for b in DataLoader(list(range(N_TINY)), 3, sampler=ds, drop_last=drop_last)]
        with FastLoader(tiny, 3, sampler=ds, drop_last=drop_last, device="cpu", train=False, crop=16,
                        rank=rank, world_size=world) as loader:  # fmt: skip
            assert len(loader) == len(ref)
            assert _indices(loader) == ref


def test_training_crops_with_a_sampler_on_two_ranks_are_at_their_global_positions(patterned):
    """With ``sampler=`` the k-th sample of rank r gets the crop and flip of position k * world + r:
    two ranks reading the same sample list see rank 0 the world-1 loader's even positions and
    rank 1 its odd ones, tensor for tensor, so no two ranks share a crop.

    Kills: positions ``k`` on every rank (ranks reusing each other's crops and flips); ``k + rank``."""
    same = [5] * 8  # one sample, eight times: only the crop and flip differ
    kw = dict(device="cpu", crop=16, seed=21, train=True)
    with FastLoader(patterned, 4, sampler=same, **kw) as one:
        ref = torch.cat([x for x, _ in one])
    ranks = []
    for r in range(2):
        with FastLoader(patterned, 2, sampler=same[:4], rank=r, world_size=2, **kw) as loader:
            ranks.append(torch.cat([x for x, _ in loader]))
    assert torch.equal(ranks[0], ref[0::2]) and torch.equal(ranks[1], ref[1::2])
    assert not torch.equal(ranks[0], ranks[1])
    # and the eight crops of one sample are not all alike
    assert len({hash(t.numpy().tobytes()) for t in ref}) > 4


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("w1, w2", [(1, 2), (2, 1), (2, 3)])
def test_len_of_the_loader_and_its_sampler_after_a_resume_on_another_world(tiny, train, w1, w2):
    """After ``load_state_dict`` of a state saved on ``w1`` ranks (batch 2) on ``w2`` ranks (batch 3):
    ``len(loader.sampler)`` is the samples this rank still reads, ``len(loader)`` the epoch's batch count,
    and iterating gives exactly ``len(loader) - first`` batches holding ``len(loader.sampler)`` samples.

    Kills: ``len(sampler)`` of a resumed epoch reporting the whole epoch's share."""
    states = []
    for r in range(w1):
        with FastLoader(tiny, 2, device="cpu", crop=16, train=train, seed=2, rank=r, world_size=w1) as loader:
            it = iter(loader)
            next(it)
            states.append(loader.state_dict())
    state = FastLoader.merge_states(states) if w1 > 1 else states[0]
    read_before = sum(b - a for a, b in state["consumed"])
    total_after = 0
    for r in range(w2):
        with FastLoader(tiny, 3, device="cpu", crop=16, train=train, seed=2, rank=r, world_size=w2) as loader:
            loader.load_state_dict(state)
            n_samples = len(loader.sampler)
            got = [x for x, _ in loader]
            assert sum(len(x) for x in got) == n_samples
            assert len(got) <= len(loader)
            total_after += n_samples
    assert total_after >= N_TINY - read_before  # padded shares cover the remainder
    assert total_after - (N_TINY - read_before) < w2  # padding: fewer than one sample a rank


# ----------------------------------------------------------------------------- small contracts, each against its own oracle


def test_block_size_for_is_the_most_records_whose_run_fits():
    """``block_size_for(r)`` is the largest k >= 1 with k * r <= run_bytes, computed exactly with
    fractions; the inputs include the record sizes where the float quotient rounds up to an
    integer (8 MiB / 932067.5555555556 is 8.999... but 9.0 in floats).

    Kills: ``run_bytes / r`` truncated for ``run_bytes // r`` (a run one record over its size)."""
    import math
    from fractions import Fraction

    from fastload.sampler import block_size_for

    run = 8 << 20
    sizes = [math.nextafter(run / k, math.inf) for k in (9, 17, 1000, 4097)] + [1.0, 0.5, 100.0, 8e6, 9e6, 123456.789]
    for r in sizes:
        exact = max(1, int(Fraction(run) // Fraction(max(1.0, r))))
        assert block_size_for(r) == exact, r
        assert block_size_for(r) == 1 or block_size_for(r) * Fraction(r) <= run


def test_block_order_of_no_samples_is_an_empty_int64_array():
    """Kills: the empty order returned as float64 (indexing a dataset with it fails)."""
    from fastload.sampler import block_order

    out = block_order(0, block_size=4, window=2, rng=np.random.default_rng(0))
    assert out.dtype == np.int64 and out.shape == (0,)


def test_check_batch_bounds_and_its_message():
    """1 and MAX_BATCH pass, 0 and MAX_BATCH + 1 are ConfigErrors naming the argument and what it counts.

    Kills: ``lo=2``, the bounds or the name dropped, the hint dropped or changed."""
    from fastload import ConfigError
    from fastload.sampler import MAX_BATCH, check_batch

    assert check_batch(1) == 1 and check_batch(MAX_BATCH) == MAX_BATCH
    for bad in (0, MAX_BATCH + 1, -3):
        with pytest.raises(ConfigError, match=r"^batch_size must be an int in \[1, 65536\] \(samples in one batch on one rank\), got"):
            check_batch(bad)
    with pytest.raises(ConfigError, match=r"^the sampler's largest batch"):
        check_batch(0, what="the sampler's largest batch")


def test_resume_arguments_and_their_errors():
    """``resume(epoch)`` and ``resume(epoch, [])`` read every epoch from its start (no resumed
    epoch is left behind: the loader warns when one is left before its end); bad intervals name
    ``consumed``; a batch count per rank must be one per rank.

    Kills: ``resume(e, [])`` recording an empty resumed epoch; ``consumed=None`` passed on; the
    argument's name dropped from the messages."""
    from fastload import ConfigError

    s = EpochSampler(num_samples=20, batch_size=3, world_size=2, rank=1, seed=1)
    s.resume(2)
    assert s.resumed is None
    s.resume(2, [])
    assert s.resumed is None
    s.resume(2, [[0, 4]])
    assert s.resumed is not None and s.resumed[0] == 2 and s.resumed[1].tolist() == [[0, 4]]
    s.resume(None)
    assert s.resumed is None
    with pytest.raises(ConfigError, match=r"^consumed must hold"):
        s.resume(2, [[5, 3]])
    with pytest.raises(ConfigError, match=r"^consumed must hold"):
        s.consumed_after(2, 1, consumed=[[0, 99]])
    with pytest.raises(ConfigError, match=r"need one batch count per rank \(2\), got 3"):
        s.consumed_after(2, [1, 1, 1])


@pytest.mark.parametrize("kind", ["global", "block", "sequential"])
def test_num_batches_and_consumed_after_of_a_resumed_epoch_given_explicitly(kind):
    """``num_batches(e, consumed)`` and ``consumed_after(e, done, consumed)`` with the consumed
    intervals given as an argument (the sampler itself not resumed) agree with a sampler resumed
    on them, and with the brute-forced reads. Kills: the ``consumed`` argument ignored (or the
    epoch) in num_batches, consumed_after or first_batch."""
    n, epoch = 23, 4
    a = _samplers(n, 2, 3, kind, False, True)
    iv = a[0].consumed_after(epoch, 2)
    fresh = _samplers(n, 3, 2, kind, False, True)
    resumed = _samplers(n, 3, 2, kind, False, True)
    for s in resumed:
        s.resume(epoch, iv)
    for f, r in zip(fresh, resumed):
        assert f.num_batches(epoch, iv) == r.num_batches(epoch) == len(list(r.batches(epoch)))
        assert f.num_batches(epoch) == len(f) and f.num_batches(epoch + 1, None) == len(f)
        assert f.first_batch(epoch, iv) == r.first_batch(epoch) > 0
    done = [r.first_batch(epoch) + 1 for r in resumed]
    got = fresh[0].consumed_after(epoch, done, consumed=iv)
    assert got == resumed[0].consumed_after(epoch, done)
    reads = _reads(resumed, epoch, [1, 1, 1])
    before = set(np.flatnonzero(interval_mask(np.array(iv).reshape(-1, 2), n)).tolist())
    assert got == intervals_of(np.isin(np.arange(n), sorted(before | _consumed(reads, n))))
    assert resumed[0].consumed_after(epoch + 1, 1) == fresh[0].consumed_after(epoch + 1, 1)


def test_intervals_of_reads_truthiness_not_values():
    """A 0/1/2 integer mask has the True runs of its truthiness. Kills: the mask not cast to bool
    (a step from 1 to 2 read as an edge)."""
    assert intervals_of(np.array([0, 1, 2, 2, 0, 3])) == [[1, 4], [5, 6]]


BAD_INTERVALS = [
    ("c", 5, r"^c must be a list of \[start, stop\] pairs, got 5"),
    ("c", [5], r"^c must be a list of \[start, stop\] integer pairs, got the item 5"),
    ("c", [[1, 2, 3]], r"integer pairs, got the item \[1, 2, 3\]"),
    ("c", [np.array([1, 2])], r"integer pairs, got the item"),
    ("c", [[True, 2]], r"integer pairs, got the item \[True, 2\]"),
    ("c", [[0.5, 2]], r"integer pairs, got the item \[0.5, 2\]"),
    ("c", [[0, 2**70]], rf"^c must hold \[start, stop\) pairs within 0..10, got {2**70}"),
    ("c", [[-1, 3]], r"^c must hold \[start, stop\) pairs within 0..10, got -1"),
    ("c", [[3, 3]], r"^c must hold ascending, disjoint \[start, stop\) pairs with 0 <= start < stop <= 10"),
    ("c", [[4, 3]], r"ascending, disjoint"),
    ("c", [[0, 5], [3, 8]], r"ascending, disjoint"),
    ("c", [[0, 2], [5, 6], [3, 4]], r"ascending, disjoint"),
    ("c", np.array([[0, 11]], dtype=np.int64), r"ascending, disjoint"),
    ("c", np.array([[-1, 3]], dtype=np.int64), r"ascending, disjoint"),
    ("c", np.array([[3, 3]], dtype=np.int64), r"ascending, disjoint"),
]  # fmt: skip


@pytest.mark.parametrize("name, value, message", BAD_INTERVALS)
def test_check_intervals_refuses_what_is_not_sorted_disjoint_pairs_in_range(name, value, message):
    """Each malformed value a ConfigError naming the argument and the offending part. Kills: any
    of the checks' conditions joined by ``and``, ``<`` for ``<=``, the out-of-range pre-check or a
    message dropped, the wrong item quoted, a slice bound changed."""
    from fastload import ConfigError
    from fastload.sampler import check_intervals

    with pytest.raises(ConfigError, match=message):
        check_intervals(name, value, 10)


@pytest.mark.parametrize("value", [[], [[0, 3], [3, 5]], [[0, 10]], [(2, 4), [6, 7]], np.array([[1, 2], [4, 9]], dtype=np.int64)])
def test_check_intervals_accepts_touching_and_whole_intervals(value):
    """Touching intervals are disjoint; [0, n) is in range. Kills: ``a[1:] <= b[:-1]`` for ``<``."""
    from fastload.sampler import check_intervals

    rows = check_intervals("c", value, 10)
    assert rows.dtype == np.int64 and rows.shape == (len(value), 2)
    assert rows.tolist() == [list(p) for p in (value.tolist() if isinstance(value, np.ndarray) else value)]


BAD_SAMPLERS = [
    (dict(num_samples=-1), r"^num_samples must be an int in \[0, 8589934592\], got -1"),
    (dict(num_samples=2**33 + 1), r"^num_samples must be an int in \[0, 8589934592\]"),
    (dict(seed=-1), r"^seed must be an int in \[0, 18446744073709551615\], got -1"),
    (dict(seed=2**64), r"^seed must be an int in \[0, 18446744073709551615\]"),
    (dict(window=0), r"^window must be an int"),
    (dict(block_size=0), r"^block_size must be an int"),
    (dict(batch_size=0), r"^batch_size must be >= 1, got 0"),
    (dict(world_size=0, rank=0), r"^world_size must be >= 1, got 0"),
    (dict(world_size=2, rank=2), r"^rank must be in \[0, world_size=2\), got 2"),
    (dict(world_size=2, rank=-1), r"^rank must be in \[0, world_size=2\), got -1"),
    (dict(order="random"), r"^order must be one of 'global', 'block', 'shards', got 'random'"),
]  # fmt: skip


@pytest.mark.parametrize("kw, message", BAD_SAMPLERS)
def test_epoch_sampler_refuses_bad_arguments_naming_them(kw, message):
    """Kills: a bound dropped or moved (``lo=2`` for window, ``rank <= world_size``), a name or a
    message dropped or changed."""
    from fastload import ConfigError

    args = {"num_samples": 10, "batch_size": 2, **kw}
    with pytest.raises(ConfigError, match=message):
        EpochSampler(**args)


def test_epoch_sampler_defaults_and_edges():
    """The documented defaults (seed 0, block_size 64, window 16, no drop_last, padding); window 1 and
    seed 2**64 - 1 and 2**33 samples accepted; no samples: no batch on any rank. Kills: a default
    changed; ``per_rank`` 1 for an empty dataset; a bound one too tight."""
    s = EpochSampler(num_samples=10, batch_size=2)
    assert (s.seed, s.block_size, s.window, s.drop_last, s.pad, s.shuffle, s.mode) == (0, 64, 16, False, True, True, "global")
    assert EpochSampler(num_samples=10, batch_size=2, window=1, block_size=1, seed=2**64 - 1).window == 1
    assert EpochSampler(num_samples=2**33, batch_size=2).per_rank == 2**33
    for kind in KINDS.values():
        for dl, pad in ((False, True), (True, True), (False, False)):
            e = EpochSampler(num_samples=0, batch_size=2, world_size=2, rank=1, drop_last=dl, pad=pad, **kind)
            assert e.per_rank == 0 and len(e) == 0 and list(e.batches(0)) == [] and e.total == 0


def test_indices_and_positions_are_int64_and_the_order_is_read_only():
    """Batches hold int64 indices and positions (a dataset is indexed by them); the cached order cannot
    be changed by a caller. Kills: indices cast with ``astype(None)`` (float64); the order left writable."""
    for kind in KINDS.values():
        s = EpochSampler(num_samples=11, batch_size=3, world_size=2, rank=1, **kind)
        for b in s.batches(0):
            assert b.indices.dtype == np.int64 and b.positions.dtype == np.int64
        order = s.base_order(0)
        assert not order.flags.writeable
        with pytest.raises(ValueError):
            order[0] = 5


def test_an_epoch_resumed_with_everything_consumed_reads_nothing():
    """Every position consumed: no batch on any rank, no padding read. Kills: one padded slot per rank
    for an empty remainder (``per = 1`` when nothing remains)."""
    for kind in KINDS.values():
        for dl, pad in ((False, True), (True, True), (False, False)):
            for r in range(3):
                s = EpochSampler(num_samples=10, batch_size=2, world_size=3, rank=r, drop_last=dl, pad=pad, **kind)
                s.resume(1, [[0, 10]])
                assert list(s.batches(1)) == [] and s.num_batches(1) == 0 and len(s.rank_indices(1)) == 0


def test_consumed_after_counts_each_ranks_own_first_batch():
    """Without padding the ranks' shares of a remainder differ (19 positions on 3 ranks: 7, 6, 6, so
    3 or 4 batches of 2, after 4 of the full epoch): rank 0 resumes at batch 0, ranks 1 and 2 at batch
    1, and consumed_after reads each rank's count against its own first batch, brute-forced from the
    reads. Kills: ``first_batch`` of the calling rank used for every rank (``rank=None``)."""
    n, epoch = 24, 0
    iv = [[0, 5]]  # 19 positions remain
    ss = _samplers(n, 3, 2, "sequential", False, False)
    for s in ss:
        s.resume(epoch, iv)
    firsts = [s.first_batch(epoch) for s in ss]
    assert firsts == [0, 1, 1]
    reads = _reads(ss, epoch, [1, 1, 1])
    want = intervals_of(np.isin(np.arange(n), sorted(set(range(5)) | _consumed(reads, n))))
    done = [f + 1 for f in firsts]
    for s in ss:
        assert s.consumed_after(epoch, done) == want
