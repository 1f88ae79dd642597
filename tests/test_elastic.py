"""Elastic mid-epoch resume: a state saved on N ranks resumes on M, at another batch size.

What is checked (``docs/loader.md``, "Resuming"):

* the state describes the epoch: every rank's is the same JSON-safe dict when the ranks
  stand at the same batch, and it resumes on any world size and batch size;
* across an interruption every sample of the epoch is read exactly once (plus padding
  repeats, which have positions past the end of the order), never again and never skipped;
  with ``drop_last`` at most once; with ``pad=False`` exactly once;
* on the same world size and batch size the rest is exactly the uninterrupted run's batches;
* each sample keeps its position in the epoch's order, so its crop and flip are the ones
  an uninterrupted run on any world size gives it (checked on pixels);
* the epoch after the resumed one is the one an uninterrupted run on the new world reads;
* ``FastLoader.merge_states`` makes one exact state of ranks that stand at different batches.

Property tests run on the sampler (fast); a few real FastLoader runs compare pixels.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fastload
from fastload import ConfigError, FastLoader
from fastload.sampler import EpochSampler

from conftest import decode_batch, encode_color

# ----------------------------------------------------------------------------- sampler level

ORDERS = [
    {"shuffle": True, "order": "global"},
    {"shuffle": False, "order": "global"},
    {"shuffle": True, "order": "block", "block_size": 3, "window": 2},
    {"shuffle": True, "order": "shards", "window": 3},
]


def _layout(n: int) -> list[int]:
    """Shards of 7 samples, the last one shorter: what ``order="shards"`` permutes."""
    return [7] * (n // 7) + ([n % 7] if n % 7 else [])


def _samplers(n: int, world: int, batch: int, kind: dict, drop_last: bool, pad: bool, seed: int = 11):
    layout = {"shard_sizes": _layout(n)} if kind["order"] == "shards" else {}
    return [
        EpochSampler(num_samples=n, batch_size=batch, rank=r, world_size=world, drop_last=drop_last, pad=pad,
                     seed=seed, **kind, **layout)
        for r in range(world)
    ]  # fmt: skip


def _reads(samplers, epoch: int, counts=None) -> list[tuple[int, int]]:
    """(index, position) of every sample the ranks read of ``epoch``, each rank its first ``counts[r]`` batches."""
    out = []
    for r, s in enumerate(samplers):
        for b in s.batches(epoch):
            if counts is not None and b.number >= counts[r]:
                break
            out += list(zip(b.indices.tolist(), b.positions.tolist()))
    return out


def _check_epoch(reads, n: int, order: np.ndarray, drop_last: bool, pad: bool, pads_allowed: int) -> None:
    real = [(i, p) for i, p in reads if p < n]
    for i, p in real:
        assert order[p] == i  # a sample is read at its own position of the order: the same crop as any run
    positions = Counter(p for _, p in real)
    assert all(c == 1 for c in positions.values()), "a sample was read twice"
    if drop_last:
        assert len(positions) <= n
    else:
        assert set(positions) == set(range(n)), "a sample was skipped"
    extra = [p for _, p in reads if p >= n]
    assert len(extra) <= (pads_allowed if pad and not drop_last else 0)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    n=st.integers(1, 60),
    w1=st.integers(1, 8),
    w2=st.integers(1, 8),
    b1=st.integers(1, 9),
    b2=st.integers(1, 9),
    kind=st.sampled_from(ORDERS),
    drop_last=st.booleans(),
    pad=st.booleans(),
    cut=st.floats(0, 1),
    epoch=st.integers(0, 3),
)
def test_an_interrupted_epoch_resumed_on_another_world_reads_every_sample_once(n, w1, w2, b1, b2, kind, drop_last, pad, cut, epoch):
    w1, w2 = min(w1, n), min(w2, n)
    old = _samplers(n, w1, b1, kind, drop_last, pad)
    if len(old[0]) == 0:
        return
    k = min(int(cut * len(old[0])), len(old[0]) - 1)  # mid-epoch (a finished epoch moves on)
    before = _reads(old, epoch, [k] * w1)
    states = [s.consumed_after(epoch, k) for s in old]
    assert all(st_ == states[0] for st_ in states)  # every rank describes the epoch the same way
    assert json.loads(json.dumps(states[0])) == states[0]
    new = _samplers(n, w2, b2, kind, drop_last, pad)
    for s in new:
        s.resume(epoch, states[0])
    counts = [s.num_batches(epoch) for s in new]
    if pad or drop_last:
        assert len(set(counts)) == 1  # equal shares: DDP never waits on a rank
    after = _reads(new, epoch)
    order = old[0].base_order(epoch)
    _check_epoch(before + after, n, order, drop_last, pad, pads_allowed=(w1 - 1) + (w2 - 1))
    if drop_last:  # left out: at most what does not fill a batch or divide among the new ranks
        assert n - len({p for _, p in before + after if p < n}) <= w2 * b2 - 1
    # the following epoch is the one an uninterrupted run on the new world reads
    fresh = _samplers(n, w2, b2, kind, drop_last, pad)
    for s, f in zip(new, fresh):
        s.resume(None)
        assert [(b.indices.tolist(), b.positions.tolist()) for b in s.batches(epoch + 1)] == [
            (b.indices.tolist(), b.positions.tolist()) for b in f.batches(epoch + 1)
        ]


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(1, 60),
    world=st.integers(1, 8),
    batch=st.integers(1, 9),
    kind=st.sampled_from(ORDERS),
    drop_last=st.booleans(),
    pad=st.booleans(),
)
def test_a_fresh_epoch_keeps_the_distributed_sampler_layout(n, world, batch, kind, drop_last, pad):
    """The plan of an epoch read from its start is still order()[rank_positions()] in batches."""
    for s in _samplers(n, min(world, n), batch, kind, drop_last, pad):
        got = [b.indices for b in s.batches(2)]
        flat = np.concatenate(got).tolist() if got else []
        assert flat == s.order(2)[s.rank_positions()][: len(flat)].tolist()
        assert len(got) == len(s) == s.num_batches(2)
        assert s.rank_indices(2).tolist() == s.order(2)[s.rank_positions()].tolist()


@settings(max_examples=100, deadline=None)
@given(
    n=st.integers(2, 60),
    w1=st.integers(2, 8),
    w2=st.integers(1, 8),
    b1=st.integers(1, 9),
    b2=st.integers(1, 9),
    kind=st.sampled_from(ORDERS),
    pad=st.booleans(),
    data=st.data(),
)
def test_merge_states_of_ranks_at_different_batches_is_exact(n, w1, w2, b1, b2, kind, pad, data):
    w1, w2 = min(w1, n), min(w2, n)
    old = _samplers(n, w1, b1, kind, False, pad)
    counts = [data.draw(st.integers(0, s.num_batches(3))) for s in old]
    states = []
    for s, k in zip(old, counts):
        st_ = {"format": "fastload.FastLoader", "version": fastload.loader.STATE_VERSION, "epoch": 3, "batches_done": k,
               "consumed": s.consumed_after(3, k), "resumed_from": [], "samples_consumed": None, "seed": 11,
               "num_samples": n, "shuffle": kind["shuffle"], "order": kind["order"],
               "block_size": kind.get("block_size"), "window": kind.get("window"), "batch_size": b1,
               "world_size": w1, "drop_last": False, "pad": pad, "sampler": None}  # fmt: skip
        states.append(st_)
    merged = FastLoader.merge_states(states)
    before = _reads(old, 3, counts)
    new = _samplers(n, w2, b2, kind, False, pad)
    for s in new:
        s.resume(3, merged["consumed"])
    _check_epoch(before + _reads(new, 3), n, old[0].base_order(3), False, pad, pads_allowed=(w1 - 1) + (w2 - 1))


def test_merge_states_refuses_states_of_different_loaders():
    s = _samplers(10, 2, 2, ORDERS[0], False, True)
    base = {"format": "fastload.FastLoader", "version": fastload.loader.STATE_VERSION, "epoch": 0, "batches_done": 1,
            "consumed": s[0].consumed_after(0, 1), "resumed_from": [], "samples_consumed": 4, "seed": 11,
            "num_samples": 10, "shuffle": True, "order": "global", "block_size": None, "window": None,
            "batch_size": 2, "world_size": 2, "drop_last": False, "pad": True, "sampler": None}  # fmt: skip
    with pytest.raises(ConfigError, match="one per rank"):
        FastLoader.merge_states([base])
    with pytest.raises(ConfigError, match="rank 1's state has seed=12"):
        FastLoader.merge_states([base, {**base, "seed": 12, "batches_done": 2}])
    assert FastLoader.merge_states([base, dict(base)]) == base


# ----------------------------------------------------------------------------- real loaders, pixels

N_CLASSES, PER_CLASS = 3, 9  # 27 samples: no world size of 2..8 divides it, so ranks are padded
N = N_CLASSES * PER_CLASS


def _textured(label: int, index: int, size=(40, 32)) -> np.ndarray:
    """The solid colour of ``encode_color(label, index)`` plus a +/-5 ramp along x in R and along y
    in B: any crop box or flip changes the pixels, the colour still names the sample."""
    w, h = size
    img = np.empty((h, w, 3), dtype=np.float64)
    img[:] = encode_color(label, index)
    img[..., 0] += np.linspace(-5, 5, w)[None, :]
    img[..., 2] += np.linspace(-5, 5, h)[:, None]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def textured(tmp_path_factory) -> Path:
    from PIL import Image

    base = tmp_path_factory.mktemp("elastic")
    index = 0
    for label in range(N_CLASSES):
        for j in range(PER_CLASS):
            p = base / "src" / f"c{label}" / f"{j:02d}.jpg"
            p.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(_textured(label, index)).save(p, "JPEG", quality=95)
            index += 1
    fastload.pack(base / "src", base / "packed", workers=1, progress=False)
    return base / "packed"


def _loader(packed, batch, rank, world, **kw) -> FastLoader:
    return FastLoader(packed, batch, device="cpu", crop=16, num_threads=1, seed=3, rank=rank, world_size=world,
                      mean=None, std=None, **kw)  # fmt: skip


def _decode(x: torch.Tensor) -> list[tuple[int, str]]:
    """(sample index from its colour, digest of its exact pixels) of each uint8 image."""
    ids = [i for _, i in decode_batch(x.numpy())]
    return [(i, hashlib.sha1(img.contiguous().numpy().tobytes()).hexdigest()) for i, img in zip(ids, x)]


def _read(loader: FastLoader, batches: int | None = None) -> list[tuple[int, str]]:
    out = []
    it = iter(loader)
    for b, (x, _) in enumerate(it):
        out += _decode(x)
        if batches is not None and b + 1 == batches:
            break
    return out


def _crops_by_sample(reads, n=N) -> dict[int, set[str]]:
    by: dict[int, set[str]] = {}
    for i, d in reads:
        by.setdefault(i, set()).add(d)
    return by


@pytest.mark.parametrize(
    "w1, b1, w2, b2, kw",
    [
        (2, 4, 1, 4, {}),  # 2 -> 1 ranks
        (1, 5, 3, 2, {}),  # 1 -> 3 ranks, another batch size
        (3, 2, 2, 3, {"order": "block", "block_size": 4, "window": 2}),
        (2, 3, 4, 2, {"shuffle": False}),
    ],
)
def test_resume_on_another_world_gives_every_sample_its_uninterrupted_crop(textured, w1, b1, w2, b2, kw):
    epoch = 1
    savers = [_loader(textured, b1, r, w1, **kw) for r in range(w1)]
    before, states = [], []
    for ld in savers:
        ld.set_epoch(epoch)
        before += _read(ld, 2)
        states.append(json.loads(json.dumps(ld.state_dict())))
        ld.close()
    assert all(s == states[0] for s in states)  # rank 0's state is enough
    assert states[0]["samples_consumed"] == len({i for i, _ in before})
    resumed = [_loader(textured, b2, r, w2, **kw) for r in range(w2)]
    after, lengths = [], []
    for ld in resumed:
        ld.load_state_dict(states[0])
        lengths.append(len(ld))
        after += _read(ld)
        assert ld.epoch == epoch + 1
    assert len(set(lengths)) == 1  # equal shares on the new world
    # every sample read once, plus padding repeats (at most one short share per world)
    counts = Counter(i for i, _ in before + after)
    assert set(counts) == set(range(N))
    assert sum(counts.values()) - N <= (w1 - 1) + (w2 - 1)
    # each sample's crop is the one it has in an uninterrupted run, on one rank (no padding) or
    # on the new world; the other reads of a sample are padding repeats, with crops of their own
    with _loader(textured, 4, 0, 1, **kw) as one:
        one.set_epoch(epoch)
        real = dict(_read(one))
    assert len(real) == N
    ref = []
    for r in range(w2):
        with _loader(textured, b2, r, w2, **kw) as ld:
            ld.set_epoch(epoch)
            ref += _read(ld)
    got, want = _crops_by_sample(before + after), _crops_by_sample(ref)
    for i in range(N):
        assert real[i] in got[i] and real[i] in want[i], f"sample {i} has another crop than in an uninterrupted run"
    assert sum(d != real[i] for i, d in before + after) <= (w1 - 1) + (w2 - 1)
    # the next epoch is an uninterrupted run's on the new world
    for r, ld in enumerate(resumed):
        with _loader(textured, b2, r, w2, **kw) as ref:
            ref.set_epoch(epoch + 1)
            assert _read(ld) == _read(ref)
        ld.close()


def test_resume_survives_pickling_and_a_second_resize(textured):
    """4 ranks -> 3 (state pickled with the loaders, as a spawn-based launcher does) -> 1."""
    import pickle

    epoch, reads = 0, []
    savers = [_loader(textured, 2, r, 4) for r in range(4)]
    for ld in savers:
        reads += _read(ld, 1)
    state = savers[0].state_dict()
    for ld in savers:
        ld.close()
    mids = []
    for r in range(3):
        ld = _loader(textured, 3, r, 3)
        ld.load_state_dict(state)
        copy = pickle.loads(pickle.dumps(ld))  # the copy holds the resumed epoch too
        ld.close()
        reads += _read(copy, 1)
        mids.append(copy)
    state2 = mids[0].state_dict()
    assert all(m.state_dict() == state2 for m in mids)
    for m in mids:
        m.close()
    with _loader(textured, 5, 0, 1) as last:
        last.load_state_dict(state2)
        reads += _read(last)
        assert last.epoch == epoch + 1
    counts = Counter(i for i, _ in reads)
    assert set(counts) == set(range(N)) and sum(counts.values()) - N <= 3 + 2


def test_version_1_states_load_on_the_same_world_and_are_refused_on_another(textured):
    with _loader(textured, 4, 0, 1) as ref:
        want = _read(ref)
    with _loader(textured, 4, 0, 1) as a:
        first = _read(a, 2)
    v1 = {"format": "fastload.FastLoader", "version": 1, "epoch": 0, "batches_done": 2, "seed": 3, "num_samples": N,
          "batch_size": 4, "world_size": 1, "rank": 0, "shuffle": True, "drop_last": False}  # fmt: skip
    with _loader(textured, 4, 0, 1) as b:
        b.load_state_dict(v1)
        assert first + _read(b) == want
    with _loader(textured, 4, 0, 2) as c:
        with pytest.raises(ConfigError, match="version-1 state .* world_size=1"):
            c.load_state_dict(v1)


def test_a_user_sampler_resumes_only_with_state_of_its_own(textured):
    class Stateful(torch.utils.data.Sampler):
        """A seeded random order whose state is its seed and epoch."""

        def __init__(self):
            self.seed, self.epoch = 5, 0

        def __iter__(self):
            g = torch.Generator().manual_seed(self.seed * 1000 + self.epoch)
            return iter(torch.randperm(N, generator=g).tolist())

        def __len__(self):
            return N

        def set_epoch(self, e):
            self.epoch = e

        def state_dict(self):
            return {"seed": self.seed, "epoch": self.epoch}

        def load_state_dict(self, s):
            self.seed, self.epoch = s["seed"], s["epoch"]

    def make(sampler, world=1, batch=4):
        return FastLoader(textured, batch, sampler=sampler, device="cpu", crop=16, num_threads=1, seed=3,
                          rank=0, world_size=world, mean=None, std=None)  # fmt: skip

    s = Stateful()
    s.set_epoch(2)
    with make(s) as a:
        first = _read(a, 3)
        state = a.state_dict()
    assert state["order"] == "sampler" and state["sampler"] == {"seed": 5, "epoch": 2}
    s2 = Stateful()  # a fresh sampler: its state comes from the checkpoint
    with make(s2) as b:
        b.load_state_dict(state)
        rest = _read(b)
    ref = Stateful()
    ref.set_epoch(2)
    with make(ref) as c:
        assert first + rest == _read(c)
    with make(Stateful(), world=2) as d, pytest.raises(ConfigError, match="same world_size"):
        d.load_state_dict(state)
    rs = torch.utils.data.RandomSampler(range(N))
    with make(rs) as e:
        _read(e, 2)
        plain = e.state_dict()
    with make(torch.utils.data.RandomSampler(range(N))) as f:
        with pytest.raises(ConfigError, match="RandomSampler has no state_dict"):
            f.load_state_dict(plain)
        f.load_state_dict({**plain, "batches_done": 0})  # at an epoch boundary there is nothing to replay


def test_order_block_is_a_fastloader_keyword(textured):
    with _loader(textured, 4, 0, 1, order="block", block_size=5, window=2) as ld:
        ids = [i for i, _ in _read(ld)]
        assert sorted(ids) == list(range(N)) and ld.state_dict()["order"] == "block"
        assert (ld.block_size, ld.window, ld._core.read_ahead.runs) == (5, 2, 5)
        ref = EpochSampler(num_samples=N, batch_size=4, seed=3, order="block", block_size=5, window=2)
        assert ids == ref.order(0).tolist()
    with _loader(textured, 4, 0, 1, order="block") as ld:
        assert ld.block_size >= 1 and ld.window == 16  # runs of about 8 MiB: the whole dataset here
    with pytest.raises(ConfigError, match="order must be one of"):
        _loader(textured, 4, 0, 1, order="random")
    with pytest.raises(ConfigError, match="only with order='block'"):
        _loader(textured, 4, 0, 1, block_size=4)
    with _loader(textured, 4, 0, 1, order="block", block_size=5, window=2) as a:
        state = a.state_dict()
    with _loader(textured, 4, 0, 1, order="block", block_size=6, window=2) as b:
        with pytest.raises(ConfigError, match="block_size=5"):
            b.load_state_dict(state)


def test_a_state_saved_at_the_end_of_an_epoch_resumes_at_the_next_on_any_world(textured):
    with _loader(textured, 4, 0, 2, drop_last=True) as a:
        _read(a)
        state = a.state_dict()  # the epoch was read to its end: the loader stands at epoch 1
    assert (state["epoch"], state["batches_done"], state["consumed"]) == (1, 0, [])
    it = iter(_loader(textured, 4, 1, 2, drop_last=True))
    for _ in range(3):  # 13 samples per rank, 3 batches of 4: the last one read, the tail dropped
        next(it)
    end = it._loader.state_dict()
    assert (end["epoch"], end["batches_done"]) == (0, 3)
    it._loader.close()
    with _loader(textured, 5, 0, 3) as b:
        b.load_state_dict(end)
        assert b.epoch == 1 and len(b) == 2  # not the 3 samples the 2 ranks dropped: epoch 1, whole
    with _loader(textured, 4, 0, 2, drop_last=True) as c:
        with pytest.raises(ConfigError, match="invalid position"):
            c.load_state_dict({**end, "batches_done": 4})


def test_leaving_a_resumed_epoch_before_its_end_is_logged(textured, caplog):
    """Lightning ends a resumed epoch by its own step count: with a larger global batch it moves
    on with samples unread. That is said (a warning), and only for a resumed epoch left early."""
    with _loader(textured, 3, 0, 2) as a:
        _read(a, batches=2)
        state = a.state_dict()
    with caplog.at_level("WARNING", logger="fastload.loader"):
        with _loader(textured, 6, 0, 1) as b:  # one rank, a larger global batch
            b.load_state_dict(state)
            b.set_epoch(state["epoch"])  # the same epoch (what a sampler's set_epoch does): nothing said
            it = iter(b)
            next(it)
            assert not caplog.records
            b.set_epoch(state["epoch"] + 1)  # left early
        assert [r.getMessage() for r in caplog.records] == [
            f"FastLoader: epoch {state['epoch']}, resumed from a checkpoint, is left before its end for epoch "
            f"{state['epoch'] + 1}: the rest of its samples are not read. A training loop that counts the epoch's "
            "steps itself (Lightning) does this when world_size x batch_size grew since the checkpoint; keep it "
            "the same or smaller (docs/loader.md, Resuming)."
        ]
        caplog.clear()
        with _loader(textured, 6, 0, 1) as c:  # read to its end: nothing to say
            c.load_state_dict(state)
            _read(c)
            c.set_epoch(c.epoch + 1)
        with _loader(textured, 6, 0, 1) as d:  # an epoch that was not resumed, left early: a user's choice
            _read(d, batches=1)
            d.set_epoch(1)
        assert not caplog.records
