"""Rules of the node cache: which shard is evicted (against a brute-force optimum), and what a sparse copy counts."""

from __future__ import annotations

import hashlib
import itertools
import json
import os
from functools import lru_cache
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload.remote.nodecache import RemoteShards
from conftest import paint_folder

SHARD = 32 << 10  # every fake shard's size
URL = "s3://bucket/ds"


class DictRemote:
    """The store, as a dict of objects; counts the shard downloads."""

    def __init__(self, objects: dict[str, bytes]) -> None:
        self.objects, self.downloaded = objects, []

    def get(self, name: str, *, limit: int | None = None) -> bytes:
        return self.objects[name]

    def head(self, name: str) -> dict | None:
        b = self.objects[name]
        return {"size": len(b), "e_tag": hashlib.md5(b).hexdigest()}

    def download(self, name, dest, size, *, progress=None, cancelled=None) -> None:
        data = self.objects[name]
        with open(dest, "r+b" if Path(dest).exists() else "wb") as f:
            f.write(data)
        if progress is not None:
            progress(data)
        self.downloaded.append(name)

    def get_range(self, name: str, start: int, end: int, *, e_tag=None) -> bytes:
        return self.objects[name][start:end]


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> dict[str, bytes]:
    """A real manifest of 6 one-sample shards whose shard entries name fake shards of SHARD bytes."""
    root = tmp_path_factory.mktemp("rules_nodecache")
    src = paint_folder(root / "src", classes=1, per_class=6, size=(60, 40))
    fastload.pack(src, root / "ds", shard_size="4KiB", workers=1, progress=False)
    m = json.loads((root / "ds" / "manifest.json").read_text())
    assert len(m["shards"]) == 6
    objs = {"labels.bin": (root / "ds" / "labels.bin").read_bytes()}
    rng = np.random.default_rng(0)
    for s in m["shards"]:
        data = rng.integers(0, 256, SHARD, dtype=np.uint8).tobytes()
        s.update(bytes=SHARD, sha256=hashlib.sha256(data).hexdigest())
        objs[s["file"]] = data
    objs["manifest.json"] = json.dumps(m).encode()
    return objs


def cache(tmp_path: Path, objects: dict[str, bytes], limit: int | None, fetch: str = "shards") -> RemoteShards:
    rs = RemoteShards(URL, cache_dir=tmp_path / "cache", cache_limit=limit, fetch=fetch)
    rs.remote = DictRemote(objects)
    rs.open()
    return rs


def optimum(seq: tuple[int, ...], capacity: int) -> int:
    """The fewest downloads any eviction policy can make for ``seq`` with room for ``capacity``
    shards: every choice of victim tried (brute force over cache states)."""

    @lru_cache(maxsize=None)
    def best(i: int, held: frozenset) -> int:
        if i == len(seq):
            return 0
        k = seq[i]
        if k in held:
            return best(i + 1, held)
        if len(held) < capacity:
            return 1 + best(i + 1, held | {k})
        return 1 + min(best(i + 1, (held - {v}) | {k}) for v in held)

    return best(0, frozenset())


rng = np.random.default_rng(5)
SEQUENCES = [
    (0, 1, 2, 0, 1, 3, 0, 3, 1, 2, 0),
    (0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2, 3),  # cyclic: LRU's worst case
    (5, 4, 5, 3, 4, 5, 2, 1, 0, 1, 5, 4),
    *(tuple(int(x) for x in rng.integers(0, 6, 14)) for _ in range(4)),
]


@pytest.mark.parametrize("capacity", [2, 3])
@pytest.mark.parametrize("seq", SEQUENCES)
def test_an_epoch_replayed_downloads_no_more_than_the_brute_force_optimum(tmp_path, objects, seq, capacity):
    """Scenario: an epoch whose batches read one shard each (``seq``), through a cache with room for
    ``capacity`` shards; the cache knows the epoch (each shard's uses). Rule: the shard evicted is
    the one the rest of the epoch needs last (never again first), which downloads as few shards as
    any policy can: the count is compared with a brute-force search over every eviction choice.
    Bugs: the sort reversed (the shard needed next evicted), the oldest file evicted first (LRU),
    the next use looked up from the epoch's start instead of the current batch."""
    rs = cache(tmp_path, objects, limit=capacity * SHARD + SHARD // 2)
    rs._uses = {k: np.array([p for p, x in enumerate(seq) if x == k], np.int64) for k in set(seq)}  # noqa: SLF001 - the epoch's plan
    for pos, k in enumerate(seq):
        rs._pos = pos  # noqa: SLF001 - the batch the epoch stands at
        rs.acquire(k)
        rs.release(k)
        assert rs.usage() <= rs.limit
    assert len([n for n in rs.remote.downloaded if n.startswith("shard-")]) == optimum(seq, capacity)
    rs.close()


def test_a_sparse_copy_counts_its_blocks_not_its_size(tmp_path, objects):
    """Rule (``cache_limit``): a ``fetch="records"`` copy is a sparse file of the shard's full size of
    which only the fetched pages take disk; the limit counts what takes disk. Bug: its apparent size
    counted, so a few open sparse copies fill the limit and every whole-shard download must evict.
    Expected: the usage is the other files' sizes plus what ``os.stat`` says the copies occupy,
    which is far below their apparent size."""
    rs = cache(tmp_path, objects, limit=None, fetch="records")
    base = rs.usage()
    paths = [rs.acquire(k) for k in range(3)]
    for k in range(3):
        rs.filler(k).fill([(0, 100)], wait=True)  # one page of each
    blocks = sum(os.stat(p).st_blocks * 512 for p in paths)
    if blocks >= 3 * SHARD:
        pytest.skip("this file system does not keep files sparse")
    assert rs.usage() == base + blocks
    assert rs.usage() < base + SHARD
    for k in range(3):
        rs.release(k)
    rs.close()


@pytest.mark.parametrize("order", ["a then b", "b then a", "threads"])
def test_two_readers_of_one_cache_download_each_shard_once(tmp_path, objects, order):
    """Scenario: two readers of one node (two ranks, each its own RemoteShards on the same
    cache_dir) read the same shards. Rule: a shard one of them downloaded (or is downloading) is
    the other's too: each shard comes from the store once, and both read its verified bytes.
    Bugs: a per-process cache directory, the shared lock not taken before the download."""
    import threading

    a, b = cache(tmp_path, objects, limit=None), cache(tmp_path, objects, limit=None)
    assert a.root == b.root
    shards, wrong = list(range(6)), []

    def read(rs):
        for k in shards:
            path = rs.acquire(k)
            if path.read_bytes() != objects[rs.manifest.shards[k].file]:
                wrong.append(k)
            rs.release(k)

    if order == "threads":
        ts = [threading.Thread(target=read, args=(rs,)) for rs in (a, b)]
        for t in ts:
            t.start()
        for t in ts:
            t.join()
    else:
        for rs in (a, b) if order == "a then b" else (b, a):
            read(rs)
    assert not wrong
    got = [n for rs in (a, b) for n in rs.remote.downloaded if n.startswith("shard-")]
    assert sorted(got) == sorted(s.file for s in a.manifest.shards)
    a.close()
    b.close()
