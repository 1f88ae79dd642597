"""``order="shards"``: shards permuted per epoch, samples mixed within a sliding window of shards.

The oracles are the shard layout itself (which shard a sample index falls in, computed here from
the counts), DistributedSampler's sharing rule written out, and, over an object store (SeaweedFS),
the pixels of the batches, the cache's bytes sampled through the epochs and the node's log of
downloads.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD, ConfigError, FastLoader
from fastload.sampler import EpochSampler

from conftest import decode_batches, paint_folder

LAYOUTS = [[7] * 9 + [3], [5, 9, 2, 11, 6, 8, 1, 4], [4] * 30]


def shard_of(counts: list[int], indices: np.ndarray) -> np.ndarray:
    """The shard each sample index is stored in, from the layout alone."""
    ends = np.cumsum(counts)
    return np.searchsorted(ends, indices, side="right")


def open_at_once(counts: list[int], order: np.ndarray, span: int = 1) -> int:
    """The most shards a reader of ``order`` needs between their first and last sample, over any
    ``span`` consecutive positions."""
    k = shard_of(counts, order)
    first = {int(s): p for p, s in reversed(list(enumerate(k)))}
    last = {int(s): p for p, s in enumerate(k)}
    live = np.zeros(len(order) + span, dtype=np.int64)
    for s in first:  # a shard is needed by every stretch that meets [first, last]
        live[max(0, first[s] - span + 1) : last[s] + 1] += 1
    return int(live.max())


def sampler(counts, window, **kw) -> EpochSampler:
    return EpochSampler(num_samples=sum(counts), batch_size=kw.pop("batch_size", 4), order="shards",
                        window=window, shard_sizes=counts, seed=kw.pop("seed", 7), **kw)  # fmt: skip


# ----------------------------------------------------------------------------- the order itself
@pytest.mark.parametrize("counts", LAYOUTS)
@pytest.mark.parametrize("window", [1, 2, 3, 5, 100])
def test_at_most_window_shards_are_open_at_any_position(counts, window):
    for epoch in range(6):
        order = sampler(counts, window).base_order(epoch)
        assert sorted(order.tolist()) == list(range(sum(counts)))  # every sample once
        assert open_at_once(counts, order) <= min(window, len(counts))
    # and a narrow window is used in full, not a smaller one (a window as wide as the epoch needs a
    # shard's last sample after a shard W - 1 slots on has begun: rare with few samples a shard)
    most = max(open_at_once(counts, sampler(counts, window).base_order(e)) for e in range(6))
    assert most == window if window <= 5 else most > 5


@pytest.mark.parametrize("counts", LAYOUTS)
def test_a_window_of_one_reads_shard_after_shard_each_shuffled(counts):
    s = sampler(counts, 1)
    order = s.base_order(3)
    k = shard_of(counts, order)
    runs = [int(k[0])] + [int(b) for a, b in zip(k, k[1:]) if a != b]
    assert sorted(runs) == list(range(len(counts)))  # each shard one contiguous run, shards permuted
    firsts = np.cumsum(counts) - counts
    assert any(sorted(order[k == j].tolist()) != order[k == j].tolist() for j in range(len(counts)) if counts[j] > 2)
    for j in range(len(counts)):
        assert sorted(order[k == j].tolist()) == list(range(firsts[j], firsts[j] + counts[j]))


def test_windows_slide_so_no_shard_has_fixed_neighbours():
    """Written for windows cut at fixed places (shards 0-3, 4-7, ...): there a shard meets the same
    few shards all epoch, and only W - 1 others. Sliding, a shard in the middle overlaps the shards
    up to W - 1 slots on each side: more than W - 1 of them, and others every epoch."""
    counts, window = [10] * 24, 4
    met: dict[int, list[set[int]]] = {j: [] for j in range(24)}
    for epoch in range(8):
        order = sampler(counts, window).base_order(epoch)
        k = shard_of(counts, order)
        span = {j: (np.flatnonzero(k == j).min(), np.flatnonzero(k == j).max()) for j in range(24)}
        for j in range(24):
            met[j].append({i for i in range(24) if i != j and span[i][0] <= span[j][1] and span[j][0] <= span[i][1]})
        assert max(len(m[-1]) for m in met.values()) > window - 1  # overlapping windows, not a partition
        assert max(len(m[-1]) for m in met.values()) <= 2 * (window - 1)  # yet only its neighbours
    for j in range(24):
        assert len(set().union(*met[j])) > 2 * (window - 1)  # other neighbours in other epochs


def test_the_shard_order_is_a_fresh_uniform_permutation_each_epoch():
    counts = [6] * 8
    s = sampler(counts, 2, seed=3)
    heads = Counter(int(shard_of(counts, s.base_order(e)[:1])[0]) for e in range(800))
    assert set(heads) == set(range(8)) and max(heads.values()) < 800 / 8 * 1.5  # about 100 each
    assert not np.array_equal(s.base_order(0), s.base_order(1))
    assert np.array_equal(s.base_order(5), sampler(counts, 2, seed=3).base_order(5))  # (seed, epoch) decide it
    assert not np.array_equal(s.base_order(5), sampler(counts, 2, seed=4).base_order(5))


@pytest.mark.parametrize("world", [1, 2, 3, 5])
@pytest.mark.parametrize("drop_last, pad", [(False, True), (True, True), (False, False)])
def test_ranks_share_it_as_distributed_sampler_and_read_the_same_stretch(world, drop_last, pad):
    counts = [7] * 9 + [3]
    n = sum(counts)
    ranks = [sampler(counts, 3, batch_size=4, rank=r, world_size=world, drop_last=drop_last, pad=pad) for r in range(world)]
    order = sampler(counts, 3).base_order(2)  # world size and batch size do not change the order
    for s in ranks:
        assert np.array_equal(s.base_order(2), order)
    # DistributedSampler's rule written out: padded from the head, rank r takes r, r + world, ...
    total = (n // world) * world if drop_last else (-(-n // world) * world if pad else n)
    full = np.concatenate([order, order])[:total]
    for r, s in enumerate(ranks):
        assert s.rank_indices(2).tolist() == full[r:total:world].tolist()
    got = Counter(np.concatenate([s.rank_indices(2) for s in ranks]).tolist())
    assert sum(got.values()) == total and max(got.values()) <= (2 if total > n else 1)
    if not drop_last:
        assert set(got) == set(range(n))
    # at batch b every rank reads positions of the same stretch [b * 4 * world, (b + 1) * 4 * world)
    for b in range(len(ranks[0]) - 1):
        for s in ranks:
            pos = next(x for x in s.batches(2) if x.number == b).positions
            assert (pos // (4 * world) == b).all()


def test_resumed_mid_epoch_it_reads_the_rest_exactly_and_elsewhere_every_sample_once():
    counts = [7] * 9 + [3]
    n = sum(counts)
    a = sampler(counts, 3, batch_size=4, rank=0, world_size=2)
    b = sampler(counts, 3, batch_size=4, rank=1, world_size=2)
    whole = [[x.indices.tolist() for x in s.batches(1)] for s in (a, b)]
    consumed = a.consumed_after(1, 3)
    again = [sampler(counts, 3, batch_size=4, rank=r, world_size=2) for r in (0, 1)]
    for s in again:
        s.resume(1, consumed)
    assert [[x.indices.tolist() for x in s.batches(1)] for s in again] == [w[3:] for w in whole]
    # on 3 ranks at batch size 5: the rest shared among them, nothing read twice or skipped
    three = [sampler(counts, 3, batch_size=5, rank=r, world_size=3) for r in range(3)]
    for s in three:
        s.resume(1, consumed)
    before = [i for w in whole for batch in w[:3] for i in batch]
    after = [i for s in three for x in s.batches(1) for i, p in zip(x.indices.tolist(), x.positions.tolist()) if p < n]
    assert sorted(before + after) == list(range(n))


def test_arguments_are_checked():
    with pytest.raises(ConfigError, match="adding up to num_samples=10"):
        EpochSampler(num_samples=10, batch_size=2, order="shards", shard_sizes=[4, 4])
    with pytest.raises(ConfigError, match="counts >= 1"):
        EpochSampler(num_samples=10, batch_size=2, order="shards", shard_sizes=[10, 0])
    s = EpochSampler(num_samples=10, batch_size=2, order="shards", window=2)  # counts and shares without a layout
    assert len(s) == 5 and s.consumed_after(0, 2) == [[0, 4]]
    with pytest.raises(ConfigError, match="needs shard_sizes"):
        s.base_order(0)


# ----------------------------------------------------------------------------- a packed dataset
N_CLASSES, PER_CLASS = 3, 80  # 240 images of ~1 KB, 9 in each 20 KB shard: 27 shards


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return paint_folder(tmp_path_factory.mktemp("images"), N_CLASSES, PER_CLASS, quality=None, digits=3)


@pytest.fixture(scope="module")
def local(images, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local") / "train"
    fastload.pack(images, out, shard_size="32KB", progress=False)
    return out


def every_sample_once(got) -> bool:
    return sorted(got) == sorted((i // PER_CLASS, i) for i in range(N_CLASSES * PER_CLASS))


def test_a_local_dataset_reads_in_it_and_resumes_exactly(local):
    kw = dict(device="cpu", crop=32, train=True, seed=5, order="shards", window=3)
    counts = [s.count for s in fastload.Dataset(local).manifest.shards]
    with FastLoader(local, 16, **kw) as ld:
        ld.set_epoch(2)
        ref = [(x.clone(), y.clone()) for x, y in ld]
        assert (ld.order, ld.window) == ("shards", 3)
    got = decode_batches(ref, IMAGENET_MEAN, IMAGENET_STD)
    assert every_sample_once(got)
    assert open_at_once(counts, np.array([i for _, i in got])) <= 3
    with FastLoader(local, 16, **kw) as a:
        a.set_epoch(2)
        it = iter(a)
        first = [next(it) for _ in range(4)]
        state = json.loads(json.dumps(a.state_dict()))
    assert state["order"] == "shards" and state["window"] == 3 and state["block_size"] is None
    with FastLoader(local, 16, **kw) as b:
        b.load_state_dict(state)
        rest = list(b)
    import torch

    assert all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(first + rest, ref))
    with FastLoader(local, 16, **{**kw, "window": 4}) as c:
        with pytest.raises(ConfigError, match=r"window=3 but this loader has window=4.*pass window=3"):
            c.load_state_dict(state)
    with pytest.raises(ConfigError, match="window applies only with order='block' or 'shards'"):
        FastLoader(local, 16, device="cpu", window=3)


# ----------------------------------------------------------------------------- over an object store
@pytest.fixture(scope="module")
def remote(s3, images, tmp_path_factory) -> dict:
    pytest.importorskip("obstore")
    os.environ["FASTLOAD_CACHE"] = str(tmp_path_factory.mktemp("packcache"))
    try:
        url = f"s3://{s3.make_bucket()}/train"
        fastload.pack(images, url, shard_size="32KB", storage_options=s3.options(), progress=False)
    finally:
        del os.environ["FASTLOAD_CACHE"]
    return {"url": url, "options": s3.options()}


def cache_bytes(root: Path) -> int:
    total = 0
    for p in root.rglob("*"):
        try:
            if p.is_file() and not p.name.endswith(".lock"):
                total += p.stat().st_size
        except FileNotFoundError:
            pass  # deleted while listed
    return total


def test_a_limit_of_a_third_is_held_and_each_shard_downloaded_once_per_epoch(remote, tmp_path, caplog):
    cache = tmp_path / "c"
    ds = fastload.Dataset(remote["url"], storage_options=remote["options"], cache_dir=tmp_path / "probe")
    sizes = [s.bytes for s in ds.manifest.shards]
    limit = (sum(sizes) + sum(p.stat().st_size for p in ds.path.iterdir() if p.is_file())) // 3
    samples, stop = [], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(cache_bytes(cache / "remote"))
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    got = []
    try:
        with caplog.at_level(logging.INFO, logger="fastload"):
            loader = FastLoader(remote["url"], 1, device="cpu", crop=32, train=True, seed=3, cache_limit=limit,
                                storage_options=remote["options"], cache_dir=cache)  # fmt: skip
        with loader:
            assert loader.order == "shards" and loader.window >= 2
            downloads = []
            for _epoch in range(2):
                got.append(decode_batches(loader, IMAGENET_MEAN, IMAGENET_STD))
                lines = next((cache / "remote").glob("*/*/.downloads")).read_text().split("\n")
                downloads.append([line.split()[0] for line in lines if line][sum(map(len, downloads)) :])
    finally:
        stop.set()
        t.join()
    why = [r.getMessage() for r in caplog.records if "order='shards'" in r.getMessage()]
    assert len(why) == 1 and "larger than cache_limit" in why[0] and "fetch='records'" in why[0]
    assert all(every_sample_once(g) for g in got) and got[0] != got[1]
    names = [s.file for s in ds.manifest.shards]
    assert sorted(downloads[0]) == sorted(names), (len(downloads[0]), len(names))  # a cold epoch: every shard once
    assert len(set(downloads[1])) == len(downloads[1]), downloads[1]  # then each at most once (some still cached)
    assert max(samples) <= limit + max(sizes), (max(samples), limit)  # the limit plus one shard in flight
    assert max(samples) < limit + max(sizes) and max(samples) < sum(sizes) * 0.6


def test_a_global_shuffle_through_a_small_cache_is_refused_naming_the_choices(remote, tmp_path):
    ds = fastload.Dataset(remote["url"], storage_options=remote["options"], cache_dir=tmp_path / "c")
    limit = sum(s.bytes for s in ds.manifest.shards) // 3
    kw = dict(device="cpu", crop=32, cache_limit=limit, storage_options=remote["options"], cache_dir=tmp_path / "c")
    for order in ("global", "block"):
        with pytest.raises(ConfigError, match=rf"order='{order}' with fetch='shards'.*order='shards'.*fetch='records'"):
            FastLoader(remote["url"], 2, order=order, **kw)
    with FastLoader(remote["url"], 2, order="global", fetch="records", **kw) as a:  # a global shuffle by ranges
        assert a.order == "global"
    with FastLoader(remote["url"], 2, shuffle=False, **kw) as b:  # in storage order every shard is read once
        assert b.order == "global"
    with FastLoader(remote["url"], 2, order="global", storage_options=remote["options"], cache_dir=tmp_path / "c") as c:
        assert c.order == "global"  # no limit: the whole dataset is cached, the global shuffle stays


#: Batches rank 0 runs ahead of rank 1 in the two-rank test: about two shards of the order (9 samples a
#: shard, 2 a step), so rank 0 is done with shards that rank 1 still reads for a while.
LAG = 24


def _node_rank(url: str, options: dict, cache: str, limit: int, rank: int, barrier, out: str) -> None:
    """One rank of a two-rank node, one epoch. Rank 0 runs ``LAG`` batches ahead of rank 1 and stays
    there: it meets the barrier from its batch ``LAG`` on, rank 1 from its first, as many times each."""
    os.environ["LOCAL_WORLD_SIZE"] = "2"  # as torchrun sets it: the two ranks share this node
    loader = FastLoader(url, 1, device="cpu", crop=32, train=True, seed=3, rank=rank, world_size=2, num_threads=1,
                        order="shards", window=2, cache_limit=limit, storage_options=options, cache_dir=cache)  # fmt: skip
    got = []
    with loader:
        n = len(loader)
        for b, (x, y) in enumerate(loader):
            got += decode_batches([(x, y)])
            if (rank == 0 and b >= LAG) or (rank == 1 and b < n - LAG):
                barrier.wait(150)
        order, window = loader.order, loader.window
    Path(out).write_text(json.dumps({"got": got, "order": order, "window": window}))


def test_two_ranks_of_a_node_under_a_limit_download_each_shard_once_between_them(remote, tmp_path):
    """Two processes as two ranks of one node, one ``LAG`` batches behind the other, through a cache of
    half the dataset: every shard is downloaded once between them. Evicting by each rank's own uses
    fails this every time (the rank ahead deletes the shards it is done with, which the other still
    reads); the node's plan (every local rank's uses, from where each stands) passes it."""
    import multiprocessing as mp

    probe = fastload.Dataset(remote["url"], storage_options=remote["options"], cache_dir=tmp_path / "probe")
    sizes = [s.bytes for s in probe.manifest.shards]
    limit = (sum(sizes) + sum(p.stat().st_size for p in probe.path.iterdir() if p.is_file())) // 2
    cache, ctx = str(tmp_path / "node"), mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    procs = [ctx.Process(target=_node_rank, args=(remote["url"], remote["options"], cache, limit, r, barrier,
                                                  str(tmp_path / f"r{r}"))) for r in (0, 1)]  # fmt: skip
    samples, stop = [], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(cache_bytes(Path(cache) / "remote"))
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(180)
            assert p.exitcode == 0
    finally:
        stop.set()
        t.join()
    res = [json.loads((tmp_path / f"r{r}").read_text()) for r in (0, 1)]
    assert all(r["order"] == "shards" and r["window"] == 2 for r in res), [(r["order"], r["window"]) for r in res]
    assert max(samples) <= limit + max(sizes), (max(samples), limit)  # the limit, plus a shard a batch waits for
    assert every_sample_once([tuple(v) for v in res[0]["got"] + res[1]["got"]])  # the two shares: the dataset
    lines = next((Path(cache) / "remote").glob("*/*/.downloads")).read_text().split("\n")
    files = [line.split()[0] for line in lines if line]
    assert sorted(files) == sorted(s.file for s in probe.manifest.shards), Counter(files).most_common(3)  # once each
    assert len({line.split()[1] for line in lines if line}) == 2  # both ranks downloaded some
