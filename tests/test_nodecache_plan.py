"""The node's eviction plan (``fastload.remote.nodeplan``): the ranks of a node, the next use of each shard by
any of them from where each stands, the eviction order that follows, and the board where ranks say where they stand.

The oracles are formulas written here: torchrun's numbering of a node's ranks, and a shard's next use
found by scanning each rank's batches (the shard of a sample from the layout's cumulative counts).
"""

from __future__ import annotations

import math
import subprocess
import sys

import numpy as np
import pytest

from fastload.remote import nodeplan
from fastload.remote.nodeplan import (PositionBoard, eviction_order, first_use_order, local_ranks, node_next_uses,
                                      plan_id, shard_uses)  # fmt: skip
from fastload.sampler import EpochSampler

COUNTS = [5, 9, 2, 11, 6, 8, 1, 4, 7, 3]  # samples per shard, uneven
FIRSTS = np.cumsum(COUNTS) - COUNTS


def shards_read(indices) -> set[int]:
    """The shards a batch reads: sample ``i`` is in the shard whose cumulative count first exceeds it."""
    ends = np.cumsum(COUNTS)
    return {int(np.argmax(ends > i)) for i in indices}


def rank_batches(rank: int, world: int = 2, batch: int = 3) -> list:
    s = EpochSampler(num_samples=sum(COUNTS), batch_size=batch, seed=11, rank=rank, world_size=world,
                     order="shards", window=2, shard_sizes=COUNTS)  # fmt: skip
    return list(s.batches(5))


def next_use_by_scan(batches: dict[int, list], positions: dict[int, int], k: int) -> float:
    """The first batch at or after its rank's position that reads shard ``k``, over the ranks; inf if none."""
    found = [b for r, bs in batches.items() for b in range(positions[r], len(bs)) if k in shards_read(bs[b].indices)]
    return float(min(found)) if found else math.inf


@pytest.mark.parametrize(
    "env, rank, world, want",
    [
        ({}, 3, 8, [3]),  # one process per node (no torchrun): one rank
        ({"LOCAL_WORLD_SIZE": "1", "LOCAL_RANK": "0"}, 3, 8, [3]),
        ({"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"}, 5, 8, [4, 5, 6, 7]),  # node 1 of 2, four GPUs each
        ({"LOCAL_WORLD_SIZE": "4"}, 6, 8, [4, 5, 6, 7]),  # LOCAL_RANK missing: rank % 4
        ({"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "9"}, 2, 8, [0, 1, 2, 3]),  # out of range: rank % 4
        ({"LOCAL_WORLD_SIZE": "4", "LOCAL_RANK": "1"}, 5, 6, [4, 5]),  # a world smaller than the nodes' slots
        ({"LOCAL_WORLD_SIZE": "2"}, 0, 1, [0]),  # a world of one
        ({"LOCAL_WORLD_SIZE": "two"}, 1, 2, [1]),
    ],
)
def test_the_ranks_of_a_node_are_numbered_as_torchrun_numbers_them(env, rank, world, want):
    assert local_ranks(rank, world, env) == want
    lws = int(env["LOCAL_WORLD_SIZE"]) if env.get("LOCAL_WORLD_SIZE", "").isdigit() else 1
    if lws > 1 and world > 1:  # torchrun: node n holds ranks n*lws .. n*lws + lws - 1
        node = rank // lws
        assert want == [r for r in range(node * lws, node * lws + lws) if r < world]


@pytest.mark.parametrize("positions", [{0: 6, 1: 2}, {0: 0, 1: 0}, {0: 3, 1: 9}, {0: 14, 1: 5}])
def test_two_ranks_evict_first_what_neither_reads_again_then_what_the_node_needs_last(positions):
    batches = {r: rank_batches(r) for r in (0, 1)}
    uses = {r: shard_uses(batches[r], FIRSTS)[0] for r in (0, 1)}
    nxt = node_next_uses(uses, positions)
    want_next = {k: next_use_by_scan(batches, positions, k) for k in range(len(COUNTS))}
    assert {k: nxt.get(k, math.inf) for k in range(len(COUNTS))} == want_next
    # the rule: never read again by any local rank first, then the farthest next use on the node (ties by number)
    want = sorted(range(len(COUNTS)), key=lambda k: (want_next[k] != math.inf, -want_next[k], k))
    assert eviction_order(range(len(COUNTS)), nxt) == want


def test_a_rank_behind_keeps_the_shards_it_still_reads_that_the_rank_ahead_is_done_with():
    batches = {r: rank_batches(r) for r in (0, 1)}
    uses = {r: shard_uses(batches[r], FIRSTS)[0] for r in (0, 1)}
    positions = {0: 12, 1: 4}  # rank 1 lags eight batches
    alone = node_next_uses({0: uses[0]}, {0: 12})  # what rank 0 alone would plan by (the old eviction)
    node = node_next_uses(uses, positions)
    done_by_0 = [k for k in range(len(COUNTS)) if alone.get(k, math.inf) == math.inf]
    still_read_by_1 = [k for k in done_by_0 if next_use_by_scan({1: batches[1]}, positions, k) != math.inf]
    assert still_read_by_1, "the layout must give rank 1 shards that rank 0 is done with"
    order = eviction_order(range(len(COUNTS)), node)
    never = [k for k in range(len(COUNTS)) if next_use_by_scan(batches, positions, k) == math.inf]
    assert order[: len(never)] == sorted(never)  # only what no rank reads again comes first
    assert not set(still_read_by_1) & set(order[: len(never)])
    assert eviction_order(range(len(COUNTS)), alone)[: len(done_by_0)] == sorted(done_by_0)  # the old plan: it goes


def test_the_download_order_is_the_first_use_on_the_node():
    batches = {r: rank_batches(r) for r in (0, 1)}
    uses = {r: shard_uses(batches[r], FIRSTS)[0] for r in (0, 1)}
    first = {}
    for r, bs in batches.items():
        for b, batch in enumerate(bs):
            for k in shards_read(batch.indices):
                first[k] = min(first.get(k, b), b)
    assert first_use_order(uses) == sorted(first, key=lambda k: (first[k], k))
    assert sorted(first) == list(range(len(COUNTS)))  # the two ranks read every shard


def test_the_ranks_of_a_node_name_the_same_plan_and_another_epoch_another():
    a = {r: shard_uses(rank_batches(r), FIRSTS)[0] for r in (0, 1)}
    b = {r: shard_uses(rank_batches(r), FIRSTS)[0] for r in (1, 0)}  # planned by the other rank
    assert plan_id(a) == plan_id(b)
    other = EpochSampler(num_samples=sum(COUNTS), batch_size=3, seed=11, rank=0, world_size=2, order="shards",
                         window=2, shard_sizes=COUNTS)  # fmt: skip
    c = {**a, 0: shard_uses(list(other.batches(6)), FIRSTS)[0]}
    assert plan_id(c) != plan_id(a)


def test_each_rank_reads_where_the_others_stand_on_the_board(tmp_path, monkeypatch):
    folder = tmp_path / ".node"
    zero, one = PositionBoard(folder, "a" * 16, 0, [0, 1]), PositionBoard(folder, "a" * 16, 1, [0, 1])
    lone = PositionBoard(tmp_path / "elsewhere", "a" * 16, 0, [0, 1], first=False)
    assert zero.positions(9) == {0: 9, 1: 0}  # the first epoch, rank 1 not started yet: at its start
    assert lone.positions(9) == {0: 9, 1: 9}  # after the first epoch, never seen here: in step
    one.publish(5)
    assert zero.positions(9) == {0: 9, 1: 5}
    one.publish(123456)
    assert zero.read(1) == 123456
    later = PositionBoard(folder, "b" * 16, 1, [0, 1])  # rank 1 on another plan (another epoch)
    later.publish(3)
    assert zero.read(1) is None and zero.positions(9) == {0: 9, 1: 0}
    gone = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    (folder / "rank-1").write_text(f"{'a' * 16} {int(gone.stdout):10d} {7:12d}\n")  # left by a process that ended
    assert zero.read(1) is None
    assert zero.positions(9) == {0: 9, 1: 0}  # the first epoch: maybe a rank of this run not started yet
    again = PositionBoard(folder, "a" * 16, 0, [0, 1], first=False)  # a later epoch of the same process
    assert again.positions(9) == {0: 9, 1: 9}
    later.publish(3)
    monkeypatch.setattr(nodeplan, "PEER_GRACE", 0.0)  # long after the plan began: taken to be in step
    assert zero.positions(9) == {0: 9, 1: 9}
    for b in (zero, one, later, lone, again):
        b.close()
    zero.publish(4)  # closed: nothing written, nothing raised


@pytest.mark.parametrize("pad, drop_last", [(True, False), (False, False), (True, True)])
def test_a_rank_plans_another_ranks_batches_as_that_rank_does(pad, drop_last):
    kw = dict(num_samples=sum(COUNTS), batch_size=4, seed=2, world_size=3, order="shards", window=3,
              shard_sizes=COUNTS, pad=pad, drop_last=drop_last)  # fmt: skip
    mine = EpochSampler(rank=0, **kw)
    consumed = [[0, 7], [20, 32]]  # 37 left: with pad=False ranks get 13, 12, 12, so 4, 3, 3 batches
    for r in range(3):
        theirs = EpochSampler(rank=r, **kw)
        for start, resumed in ((0, None), (1, None), (0, consumed)):
            mine.resume(1 if resumed else None, resumed)
            theirs.resume(1 if resumed else None, resumed)
            a, b = list(mine.batches(1, start, rank=r)), list(theirs.batches(1, start))
            assert [(x.number, x.indices.tolist(), x.positions.tolist()) for x in a] == \
                   [(x.number, x.indices.tolist(), x.positions.tolist()) for x in b]  # fmt: skip
    with pytest.raises(Exception, match="rank must be in"):
        next(mine.batches(1, rank=3))
