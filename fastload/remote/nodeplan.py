"""The eviction plan of a node: which shard any local rank needs next, from every local rank's batches and position.

The ranks of one node share one cache (:mod:`fastload.remote.nodecache`). Each plans the same
epoch with its own rank, so each can compute every local rank's batches, hence when each of
them uses each shard (:func:`shard_uses`). A shard's next use on the node is the earliest use,
by any local rank, at or after that rank's position (:func:`node_next_uses`); a shard no local
rank uses again is the first to go, then the one needed farthest ahead (:func:`eviction_order`).

The positions come from a :class:`PositionBoard`: each rank writes the batch it stands at into a
small file of the node cache, and reads the others'. A rank that has not begun this plan yet is
taken to stand at its start for a grace period; any other rank whose position is not known
(its process gone, or never seen in this cache after the first epoch: a rank of another node
that ``LOCAL_WORLD_SIZE`` counts here) stands where the reader stands: the ranks of a node train
in step under DDP, so batch ``b`` of every rank is read at about the same time.

Which ranks share a node: ``LOCAL_WORLD_SIZE`` (set by ``torchrun``) ranks numbered contiguously,
this one ``LOCAL_RANK`` among them (else ``rank % LOCAL_WORLD_SIZE``); without it, one rank.
"""

from __future__ import annotations

import collections
import hashlib
import logging
import math
import os
import threading
import time
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np

log = logging.getLogger(__name__)

#: Seconds after a rank's plan began during which a local rank that wrote no position for it is taken
#: to stand at its start (it has not begun the epoch yet); later, to stand where the reader stands.
PEER_GRACE = 60.0

#: A board record: plan id (16 hex digits), pid, position; fixed width, rewritten in place.
_RECORD = "{plan:16.16} {pid:10d} {pos:12d}\n"
_RECORD_BYTES = len(_RECORD.format(plan="0" * 16, pid=0, pos=0))


def local_ranks(rank: int, world_size: int, env: Mapping[str, str] | None = None) -> list[int]:
    """The ranks of ``world_size`` that share this node with ``rank`` (``rank`` included), ascending.

    From ``LOCAL_WORLD_SIZE`` and ``LOCAL_RANK`` as ``torchrun`` sets them (the ranks of a node are
    numbered contiguously); a ``LOCAL_RANK`` missing or out of range is taken as ``rank %
    LOCAL_WORLD_SIZE``. Without ``LOCAL_WORLD_SIZE`` (or with 1, or a value that is not a number),
    ``[rank]``.
    """
    env = os.environ if env is None else env
    try:
        local = int(env.get("LOCAL_WORLD_SIZE", "1") or 1)
    except ValueError:
        local = 1
    if local <= 1 or world_size <= 1:
        return [rank]
    try:
        lr = int(env.get("LOCAL_RANK", ""))
    except ValueError:
        lr = -1
    if not 0 <= lr < local or lr > rank:
        lr = rank % local
    first = rank - lr
    return [r for r in range(first, first + local) if 0 <= r < world_size]


def shard_uses(batches: Iterable[Any], firsts: Any) -> tuple[dict[int, np.ndarray], list[int]]:
    """``(uses, order)`` of ``batches`` (each a batch with ``indices``, or the indices): for each
    shard the positions (ascending) of the batches that read it, and the shards in order of first use.
    ``firsts``: the first sample index of each shard, ascending."""
    shard_of = np.asarray(firsts, dtype=np.int64)
    uses: dict[int, list[int]] = collections.defaultdict(list)
    order: list[int] = []
    for pos, b in enumerate(batches):
        idx = np.asarray(getattr(b, "indices", b), dtype=np.int64).ravel()
        for k in np.unique(np.searchsorted(shard_of, idx, side="right") - 1).tolist():
            if not uses[k]:
                order.append(k)
            uses[k].append(pos)
    return {k: np.asarray(v, dtype=np.int64) for k, v in uses.items()}, order


def next_use(uses: Mapping[int, np.ndarray], k: int, pos: int) -> float:
    """The first position at or after ``pos`` at which ``uses`` reads shard ``k``; ``inf`` if none."""
    u = uses.get(k)
    if u is None:
        return math.inf
    j = int(np.searchsorted(u, pos))
    return float(u[j]) if j < len(u) else math.inf


def node_next_uses(uses_by_rank: Mapping[int, Mapping[int, np.ndarray]], positions: Mapping[int, int]) -> dict[int, float]:
    """Each shard's next use on the node: the earliest, over the local ranks, of its next use by that
    rank at or after that rank's position (``inf``: no local rank reads it again)."""
    out: dict[int, float] = {}
    for r, uses in uses_by_rank.items():
        for k in uses:
            out[k] = min(out.get(k, math.inf), next_use(uses, k, positions[r]))
    return out


def first_use_order(uses_by_rank: Mapping[int, Mapping[int, np.ndarray]]) -> list[int]:
    """The shards the node's ranks read, in order of their first use by any of them (ties: shard number)."""
    first: dict[int, int] = {}
    for uses in uses_by_rank.values():
        for k, u in uses.items():
            if len(u):
                first[k] = min(first.get(k, int(u[0])), int(u[0]))
    return sorted(first, key=lambda k: (first[k], k))


def eviction_order(shards: Iterable[int], next_uses: Mapping[int, float]) -> list[int]:
    """``shards`` in the order they should leave the cache: those no local rank reads again first,
    then the one whose next use on the node is farthest (ties: shard number)."""
    return sorted(shards, key=lambda k: (next_uses.get(k, math.inf) != math.inf, -next_uses.get(k, math.inf), k))


def plan_id(uses_by_rank: Mapping[int, Mapping[int, np.ndarray]]) -> str:
    """A digest of the node's plan: the same on every local rank that planned the same epoch."""
    h = hashlib.sha256()
    for r in sorted(uses_by_rank):
        h.update(f"r{r};".encode())
        for k in sorted(uses_by_rank[r]):
            h.update(f"{k}:".encode())
            h.update(np.ascontiguousarray(uses_by_rank[r][k], dtype="<i8").tobytes())
    return h.hexdigest()[:16]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it exists
        return True
    return True


class PositionBoard:
    """The batch each local rank stands at in the node's plan, one small file per rank in ``folder``.

    Args:
        folder: a directory of the node cache (made if missing).
        plan: :func:`plan_id` of the epoch being read.
        rank: this rank.
        peers: the other local ranks.
        first: this is the process's first plan (a peer may not have written anything yet).
    """

    def __init__(self, folder: Path, plan: str, rank: int, peers: Iterable[int], *, first: bool = True) -> None:
        self.folder, self.plan, self.rank, self.first = Path(folder), plan, rank, first
        self.peers = [p for p in peers if p != rank]
        self.since = time.monotonic()
        self._fd = -1
        self._lock = threading.Lock()  # publish() and close() from different threads: never a closed fd
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.folder / f"rank-{rank}", os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:  # a read-only cache is reported where shards are written; here: no board
            log.debug("node cache: no position board in %s: %s", self.folder, e)

    def publish(self, pos: int) -> None:
        """Say that this rank stands at batch ``pos`` of the plan (past its end: it needs nothing more)."""
        rec = _RECORD.format(plan=self.plan, pid=os.getpid(), pos=max(0, int(pos))).encode()
        with self._lock:
            if self._fd >= 0:
                try:
                    os.pwrite(self._fd, rec, 0)
                except OSError as e:
                    log.debug("node cache: position not written: %s", e)

    def _record(self, rank: int) -> tuple[str, int, int] | None:
        """``(plan, pid, position)`` that ``rank`` last wrote; None if it wrote nothing readable."""
        try:
            fd = os.open(self.folder / f"rank-{rank}", os.O_RDONLY)
        except OSError:
            return None
        try:
            raw = os.pread(fd, _RECORD_BYTES, 0).decode("ascii", "replace").split()
        except OSError:
            return None
        finally:
            os.close(fd)
        if len(raw) != 3 or not raw[1].isdigit() or not raw[2].isdigit():
            return None
        return raw[0], int(raw[1]), int(raw[2])

    def read(self, rank: int) -> int | None:
        """Where ``rank`` stands in this plan; None if it wrote no position for it or its process is gone."""
        rec = self._record(rank)
        return rec[2] if rec is not None and rec[0] == self.plan and _alive(rec[1]) else None

    def positions(self, mine: int) -> dict[int, int]:
        """Every local rank's position: this rank's ``mine``; each peer's as it wrote it for this plan.
        A peer not begun yet stands at 0 for :data:`PEER_GRACE` seconds after this plan began: one
        whose last position is of another plan (the last epoch), or, at this process's ``first``
        plan, one with no live position yet (none, or one a past run left). Any other (none live
        after the first plan: not of this cache, or ended; the grace past) stands at ``mine``."""
        waiting = time.monotonic() - self.since < PEER_GRACE
        out = {self.rank: mine}
        for p in self.peers:
            rec = self._record(p)
            live = rec is not None and _alive(rec[1])  # else none, or left by a process that ended
            if live and rec[0] == self.plan:  # type: ignore[index]
                out[p] = rec[2]  # type: ignore[index]
            else:
                out[p] = 0 if waiting and (live or self.first) else mine
        return out

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
