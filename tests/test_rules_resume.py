"""Rules of resuming: batches counted from the resumed position, and merge_states of one epoch only."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

import fastload
from fastload import FastLoader
from fastload.errors import ConfigError
from fastload.resume import Shape, make_state, merge_states
from fastload.sampler import EpochSampler
from conftest import decode_batch, paint_folder

N, BATCH = 23, 4  # 6 batches an epoch, the last one short
TOTAL = -(-N // BATCH)


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("rules_resume")
    src = paint_folder(base / "src", classes=1, per_class=N, size=(40, 30))
    out = base / "packed"
    fastload.pack(src, out, workers=1, progress=False)
    return out


def loader(packed: Path) -> FastLoader:
    return FastLoader(packed, BATCH, device="cpu", crop=16, seed=3, train=False)


def ids(batch) -> list[tuple[int, int]]:
    return decode_batch(batch[0].float().numpy())


@pytest.mark.parametrize("first,second", [(1, 2), (2, 3), (3, 0), (0, 4), (4, 1), (5, 0)])
def test_a_state_saved_after_a_resume_counts_batches_from_the_epochs_start(packed, first, second):
    """Scenario: read ``first`` batches, save, resume, read ``second`` more, save again, resume.
    Rule (docs/loader.md): ``batches_done`` is the batch of the epoch the loader stands at, so the
    second state says first + second, and the batches of the three runs, end to end, are an
    uninterrupted epoch's. Bug: the count restarted at 0 after a resume (the second state then
    resumes ``first`` batches too early: samples read twice) or ``len(iter(loader))`` of the
    resumed loader counting the whole epoch."""
    with loader(packed) as full:
        full.set_epoch(2)
        want = [ids(b) for b in full]
    got = []
    with loader(packed) as a:
        a.set_epoch(2)
        it = iter(a)
        got += [ids(next(it)) for _ in range(first)]
        state = json.loads(json.dumps(a.state_dict()))
    assert (state["epoch"], state["batches_done"]) == (2, first)
    with loader(packed) as b:
        b.load_state_dict(state)
        it = iter(b)
        assert (len(b), len(it)) == (TOTAL, TOTAL - first)  # docs/loader.md: len(iter(loader)) is what is left
        got += [ids(next(it)) for _ in range(second)]
        state2 = json.loads(json.dumps(b.state_dict()))
    assert (state2["epoch"], state2["batches_done"]) == (2, first + second)
    with loader(packed) as c:
        c.load_state_dict(state2)
        it = iter(c)
        assert len(it) == TOTAL - first - second
        got += [ids(x) for x in it]
    assert got == want


def plans(world: int, epoch_kind: dict) -> list[EpochSampler]:
    return [EpochSampler(num_samples=30, batch_size=2, world_size=world, rank=r, seed=5, **epoch_kind) for r in range(world)]


KINDS = [{"shuffle": True, "order": "global"}, {"shuffle": False, "order": "global"},
         {"shuffle": True, "order": "block", "block_size": 3, "window": 2}]  # fmt: skip


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("epochs,done", [((1, 2), (3, 0)), ((2, 1), (1, 1)), ((0, 1), (7, 7)), ((1, 2, 1), (2, 2, 2))])
def test_merge_states_refuses_ranks_in_different_epochs(kind, epochs, done):
    """Rule: one merged state stands in one epoch; ranks saved in different epochs (one rank past
    the end of an epoch, the rest not) have no one position, so merging them is refused, naming the
    field. Bug: ``epoch`` left out of the fields compared between ranks (each rank's consumed is
    checked against its own epoch, so every state is valid on its own): the merge then takes rank
    0's epoch and adds the other rank's reads of another epoch's order to it."""
    world = len(epochs)
    shape = Shape(seed=5, num_samples=30, shuffle=kind["shuffle"], order=kind["order"], block_size=kind.get("block_size"),
                  window=kind.get("window"), batch_size=2, world_size=world, drop_last=False, pad=True)  # fmt: skip
    states = [make_state(p, shape, epoch=e, done=d) for p, e, d in zip(plans(world, kind), epochs, done)]
    with pytest.raises(ConfigError, match=r"rank \d's state has epoch=\d but rank 0's has \d"):
        merge_states(states)
    same = [make_state(p, shape, epoch=epochs[0], done=d) for p, d in zip(plans(world, kind), done)]
    merged = merge_states(same)  # the same steps in one epoch merge
    assert merged["epoch"] == epochs[0]
