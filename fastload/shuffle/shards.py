"""``order="shards"``: shards permuted each epoch, samples mixed within a sliding window of consecutive shards.

The epoch's shards are put in a seeded random order (slots ``0..S-1``). Every sample of the
shard in slot ``j`` draws a key uniformly in ``[j, j + W)`` (in units of one slot, on an
integer grid), and the epoch is the samples sorted by key. At any key ``x`` exactly the shards
of slots ``x - W < j <= x`` can have samples there, so reading the epoch in order needs at
most ``W`` shards at a time, each from its first to its last sample, and the window slides by
one shard at a time: a shard's samples are spread over ``W`` slots and meet the samples of
the ``W - 1`` shards on either side of it (a different set each epoch), not a fixed group.

It is the same idea as MosaicML Streaming's ``py1e`` (samples of a shard spread over a range
around the shard's place), with the range counted in shards rather than samples, so that the
number of shards open at once is exact whatever the shard sizes.
"""

from __future__ import annotations

import math
from typing import Sequence

import numpy as np

#: Key grid steps per slot: keys are integers, so "at most W shards at a key" holds exactly.
KEY_STEPS = 1 << 24


def window_order(counts: Sequence[int], window: int, rng: np.random.Generator) -> np.ndarray:
    """The epoch's permutation of ``range(sum(counts))`` for shards of ``counts`` samples (storage order).

    ``window`` (at least 1; above the number of shards it is that number) is the number of
    consecutive shards, in the epoch's shard order, whose samples are mixed together. Draws, in
    order: the shard permutation, then one key per sample.
    """
    c = np.asarray(counts, dtype=np.int64)
    n = int(c.sum())
    if n == 0:
        return np.empty(0, dtype=np.int64)
    firsts = np.cumsum(c) - c
    slots = rng.permutation(len(c)).astype(np.int64)  # slot j holds shard slots[j]
    sc = c[slots]
    slot_of = np.repeat(np.arange(len(c), dtype=np.int64), sc)
    # the samples laid out shard after shard in slot order: index = first of its shard + offset in it
    seq = np.repeat(firsts[slots] - (np.cumsum(sc) - sc), sc) + np.arange(n, dtype=np.int64)
    w = max(1, min(int(window), len(c)))
    keys = slot_of * KEY_STEPS + rng.integers(0, w * KEY_STEPS, size=n, dtype=np.int64)
    return seq[np.argsort(keys, kind="stable")]


def shards_in_stretch(counts: Sequence[int], window: int, span: int) -> int:
    """About how many shards a reader holds while ``span`` consecutive positions of the order are in
    flight: the ``window`` a single position needs, plus the slots those positions move through
    (a slot holds a mean shard's samples; a quarter more for the draws' scatter), plus one."""
    c = np.asarray(counts, dtype=np.int64)
    mean = max(1.0, float(c.sum()) / max(1, len(c)))
    return int(window) + math.ceil(1.25 * max(0, int(span)) / mean) + 1


def window_for(shard_bytes: Sequence[int], counts: Sequence[int], room: int, span: int) -> int:
    """The widest window (in shards) whose stretch of ``span`` positions in flight fits in ``room``
    bytes even if it holds the largest shards; 0 when not even a window of one shard does."""
    sizes = np.sort(np.asarray(shard_bytes, dtype=np.int64))[::-1]
    fit = int(np.searchsorted(np.cumsum(sizes), int(room), side="right"))  # the most shards that fit
    extra = shards_in_stretch(counts, 0, span)
    return max(0, min(fit - extra, len(sizes)))
