"""FastLoader over ``s3://`` against a real S3 server (SeaweedFS): the same batches as over a local copy,
the cache's size limit, ranks sharing a cache, and a server that dies, comes back, stalls or cuts
connections.

Images are solid colours whose pixels encode (label, index) (``conftest.encode_color``): "every
sample once" is read from the pixels of the batches, not from the loader's bookkeeping.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD, FastLoader
from fastload.errors import FastloadError, RemoteError

from conftest import decode_batches, paint_folder, resumed_like_local
from s3server import Proxy, SeaweedServer

pytest.importorskip("obstore")

N_CLASSES, PER_CLASS = 3, 12  # 36 images, 64x48 JPEGs of ~1 KB: 4 per 16 KB shard
SHARD_SIZE = "16KB"


def make_images(root: Path) -> Path:
    return paint_folder(root, N_CLASSES, PER_CLASS, quality=None, digits=3)


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(autouse=True)
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "cache"))


def upload(server: SeaweedServer, images: Path, prefix: str = "train") -> str:
    bucket = server.make_bucket()
    url = f"s3://{bucket}/{prefix}"
    fastload.pack(images, url, shard_size=SHARD_SIZE, storage_options=server.options(), progress=False)
    return url


@pytest.fixture(scope="module")
def remote(s3, images, tmp_path_factory):
    os.environ["FASTLOAD_CACHE"] = str(tmp_path_factory.mktemp("packcache"))
    url = upload(s3, images)
    local = tmp_path_factory.mktemp("local") / "train"
    fastload.pack(images, local, shard_size=SHARD_SIZE, progress=False)
    del os.environ["FASTLOAD_CACHE"]
    return {"url": url, "local": local}


def decoded(batches) -> list[tuple[int, int]]:
    return decode_batches(batches, IMAGENET_MEAN, IMAGENET_STD)


def every_sample_once(got: list[tuple[int, int]]) -> bool:
    expected = sorted((i // PER_CLASS, i) for i in range(N_CLASSES * PER_CLASS))
    return sorted(got) == expected


# ------------------------------------------------------------------ the same batches
def test_batches_len_and_resume_are_those_of_a_local_copy(s3, remote, tmp_path):
    got = resumed_like_local(remote["local"], remote["url"], epoch=1, stop_after=3, seed=3,
                             storage_options=s3.options(), cache_dir=tmp_path / "c")
    assert every_sample_once(decoded(got))


def test_a_loader_of_a_url_pickles_to_the_url_not_the_cache(s3, remote, tmp_path):
    import pickle

    with FastLoader(remote["url"], 6, device="cpu", crop=32, train=False, storage_options=s3.options(),
                    cache_dir=tmp_path / "c") as a:  # fmt: skip
        ref = list(a)
        b = pickle.loads(pickle.dumps(a))
    with b:
        assert b.packed.url == remote["url"]
        got = list(b)
    assert all(torch.equal(x1, x2) for (x1, _), (x2, _) in zip(ref, got))


# ------------------------------------------------------------------ the cache
def cache_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file() and not p.name.endswith(".lock"))


def test_the_cache_stays_within_its_limit_and_downloads_each_shard_once(s3, remote, tmp_path):
    cache = tmp_path / "c"
    ds = fastload.Dataset(remote["url"], storage_options=s3.options(), cache_dir=cache)
    sizes = [s.bytes for s in ds.manifest.shards]
    total, biggest = sum(sizes), max(sizes)
    limit = total // 2
    samples, stop = [], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            try:
                samples.append(cache_bytes(cache / "remote"))
            except FileNotFoundError:
                pass  # a file deleted while listed
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        with FastLoader(remote["url"], 2, device="cpu", crop=32, train=False, shuffle=False, cache_limit=limit,
                        storage_options=s3.options(), cache_dir=cache) as loader:  # fmt: skip
            got = decoded(loader)
    finally:
        stop.set()
        t.join()
    assert every_sample_once(got)
    meta = sum(p.stat().st_size for p in (ds.path).iterdir() if p.is_file() and not p.name.startswith("shard-"))
    assert samples and max(samples) <= limit + biggest + meta, (max(samples), limit, biggest)
    assert max(samples) < total  # shards were deleted on the way: the whole dataset was never there at once
    lines = (ds.path / ".downloads").read_text().split()
    shard_files = [w for w in lines if w.startswith("shard-")]
    assert sorted(shard_files) == sorted(s.file for s in ds.manifest.shards)  # each once, in order of use


def _rank(url: str, options: dict, cache: str, rank: int, out: str, start_at: float) -> None:
    ds = fastload.Dataset(url, storage_options=options, cache_dir=cache)
    time.sleep(max(0.0, start_at - time.time()))  # both ranks ask for the same shards at once
    order = list(range(len(ds)))  # both ranks read every shard, in the same order, at the same time
    for i in order:
        ds[i]
    Path(out).write_text(json.dumps([int(ds.labels[i]) for i in order]))


def test_two_ranks_of_a_node_download_each_shard_once(s3, remote, tmp_path):
    cache = str(tmp_path / "node")
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.05)  # each download slow enough for both to want it
    ctx = mp.get_context("spawn")
    start_at = time.time() + 8
    procs = [ctx.Process(target=_rank, args=(remote["url"], s3.options(proxy.endpoint), cache, r,
                                             str(tmp_path / f"r{r}"), start_at)) for r in (0, 1)]  # fmt: skip
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(120)
            assert p.exitcode == 0
    finally:
        proxy.close()
    root = next((Path(cache) / "remote").glob("*/*/.downloads")).read_text().split("\n")
    files = [line.split()[0] for line in root if line]
    ds = fastload.Dataset(remote["local"])
    assert sorted(files) == sorted(s.file for s in ds.manifest.shards)  # once each, though both ranks read all
    for r in (0, 1):
        assert json.loads((tmp_path / f"r{r}").read_text()) == [int(v) for v in ds.labels]


# ------------------------------------------------------------------ failures
@pytest.mark.slow  # long (a server stopped or slowed on purpose); a download cut midway and test_remote_ranges' dead server stay fast
def test_a_server_restarted_mid_epoch_costs_nothing(fresh_s3, images, tmp_path):
    url = upload(fresh_s3, images)
    loader = FastLoader(url, 3, device="cpu", crop=32, train=False, shuffle=False, cache_limit=40_000,
                        storage_options=fresh_s3.options(), cache_dir=tmp_path / "c", retry_deadline=60)  # fmt: skip
    with loader:
        it = iter(loader)
        got = decoded([next(it)])
        fresh_s3.stop()  # the rest of the epoch must still be downloaded: the cache holds about 2 shards
        restart = threading.Timer(3.0, fresh_s3.start)
        restart.start()
        t0 = time.monotonic()
        try:
            got += decoded(it)
        finally:
            restart.join()  # before the fixture stops it for good
    assert every_sample_once(got)
    assert time.monotonic() - t0 < 60


@pytest.mark.slow  # long (a server stopped or slowed on purpose); a download cut midway and test_remote_ranges' dead server stay fast
def test_a_dead_server_is_an_error_within_the_deadline(fresh_s3, images, tmp_path):
    url = upload(fresh_s3, images)
    opts = fresh_s3.options()
    loader = FastLoader(url, 3, device="cpu", crop=32, train=False, shuffle=False, cache_limit=40_000,
                        storage_options=opts, cache_dir=tmp_path / "c", retry_deadline=4)  # fmt: skip
    with loader:
        it = iter(loader)
        next(it)
        fresh_s3.stop()
        t0 = time.monotonic()
        with pytest.raises(FastloadError, match=rf"{url}/shard-\d+\.lmdb: GET failed \d+ time\(s\).*retry_deadline=4 s"):
            for _ in it:
                pass
        assert time.monotonic() - t0 < 4 + 10
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=rf"{url}/manifest.json: GET failed .*the server does not answer"):
        fastload.Dataset(url, storage_options=opts, cache_dir=tmp_path / "d", retry_deadline=3)
    assert time.monotonic() - t0 < 3 + 5


@pytest.mark.slow  # long (a server stopped or slowed on purpose); a download cut midway and test_remote_ranges' dead server stay fast
def test_a_slow_server_and_cut_connections(s3, remote, tmp_path):
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.02)  # 20 ms added to every request
    try:
        opts = s3.options(proxy.endpoint)
        with FastLoader(remote["url"], 4, device="cpu", crop=32, train=False, storage_options=opts,
                        cache_dir=tmp_path / "slow") as loader:  # fmt: skip
            assert every_sample_once(decoded(loader))
        proxy.delay = 0.0
        proxy.drop = True  # every answer cut after 64 bytes, for 2 s
        threading.Timer(2.0, lambda: setattr(proxy, "drop", False)).start()
        t0 = time.monotonic()
        ds = fastload.Dataset(remote["url"], storage_options=opts, cache_dir=tmp_path / "cut", retry_deadline=30)
        got = [ds[i][1] for i in range(len(ds))]
        assert got == [i // PER_CLASS for i in range(len(ds))] and proxy.dropped > 0
        assert time.monotonic() - t0 < 30
        proxy.drop = True  # cut for good: an error within the deadline, never a hang
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match="GET failed"):
            fastload.Dataset(remote["url"], storage_options=opts, cache_dir=tmp_path / "cut2", retry_deadline=3)
        assert time.monotonic() - t0 < 3 + 5
    finally:
        proxy.close()


@pytest.mark.slow
def test_two_nodes_of_two_ranks_under_torchrun(s3, remote, tmp_path):
    """Two nodes simulated as two cache directories, two ranks each, one torchrun of 4 ranks: every
    sample read exactly once per epoch across the 4 ranks; each node downloads each shard at most
    once, and only the shards its own ranks read."""
    import subprocess
    import sys

    tests = Path(__file__).parent
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=4",
           str(tests / "remote_dist_worker.py"), remote["url"], json.dumps(s3.options()), str(tmp_path / "nodes"), str(out)]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tests.parent), str(tests)]))
    res = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    n = N_CLASSES * PER_CLASS
    ds = fastload.Dataset(remote["local"])
    firsts = [s.first for s in ds.manifest.shards]
    for epoch in ("0", "1"):
        assert sorted(i for r in ranks for i in r[epoch]) == list(range(n))  # exactly once, from the pixels
    for node in (0, 1):
        lines = next((tmp_path / "nodes" / f"node{node}" / "remote").glob("*/*/.downloads")).read_text().split("\n")
        files = [line.split()[0] for line in lines if line]
        assert len(files) == len(set(files))  # at most once per node
        read = {int(np.searchsorted(firsts, i, side="right") - 1) for r in ranks[2 * node : 2 * node + 2]
                for e in ("0", "1") for i in r[e]}  # fmt: skip
        assert set(files) == {ds.manifest.shards[k].file for k in read}


def test_shards_are_fetched_in_the_order_the_epoch_first_needs_them(s3, remote, tmp_path):
    """The GETs the server sees (through the proxy) follow the order in which the shuffled epoch's
    batches first touch each shard, read back from the batches' pixels: within a few places (the
    read-ahead and the prefetch threads fetch a few at once)."""
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.01)
    try:
        with FastLoader(remote["url"], 4, device="cpu", crop=32, train=False, shuffle=True, seed=11,
                        storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c") as loader:  # fmt: skip
            got = decoded(loader)
    finally:
        proxy.close()
    assert every_sample_once(got)
    firsts = [s.first for s in fastload.Dataset(remote["local"]).manifest.shards]
    first_use: list[int] = []
    for _label, i in got:  # the epoch's order, from the pixels
        k = int(np.searchsorted(firsts, i, side="right") - 1)
        if k not in first_use:
            first_use.append(k)
    fetched = [int(r.rsplit("shard-", 1)[1].split(".")[0]) for r in proxy.requests
               if r.startswith("GET ") and "/shard-" in r]  # fmt: skip
    assert sorted(fetched) == sorted(first_use)  # each once
    where = {k: p for p, k in enumerate(fetched)}
    assert max(abs(where[k] - p) for p, k in enumerate(first_use)) <= 6, (first_use, fetched)


def shard_gets(proxy: Proxy) -> list[int]:
    """The shard numbers of the GETs the proxy has seen, in order."""
    return [int(r.rsplit("shard-", 1)[1].split(".")[0]) for r in list(proxy.requests)
            if r.startswith("GET ") and "/shard-" in r]  # fmt: skip


def first_use_order(local: Path, batches: list[tuple[int, int]]) -> list[int]:
    """Shards in the order an epoch's samples (decoded from their pixels) first touch them."""
    firsts = [s.first for s in fastload.Dataset(local).manifest.shards]
    order: list[int] = []
    for _label, i in batches:
        k = int(np.searchsorted(firsts, i, side="right") - 1)
        if k not in order:
            order.append(k)
    return order


@pytest.mark.parametrize("epoch", [0, 2])
def test_a_loader_downloads_its_first_epochs_shards_before_iter(s3, remote, tmp_path, epoch):
    """Written for a cold start that waits for its first shards only when the loop begins: a loader
    whose shards all fit in the cache fetches those of the epoch its next ``iter()`` reads (epoch 0,
    then the one ``set_epoch`` chose) while the script is still setting up, in that epoch's order; the
    epoch then needs no more GETs, and reads every sample once."""
    n_shards = len(fastload.Dataset(remote["local"]).manifest.shards)
    with FastLoader(remote["local"], 4, device="cpu", crop=32, train=False, shuffle=True, seed=11) as ref:
        ref.set_epoch(epoch)
        order = first_use_order(remote["local"], decoded(ref))
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.01)
    try:
        opts = dict(storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c")
        with FastLoader(remote["url"], 4, device="cpu", crop=32, train=False, shuffle=True, seed=11, **opts) as loader:
            if epoch:
                loader.set_epoch(epoch)
            deadline = time.monotonic() + 60
            while len(set(shard_gets(proxy))) < n_shards and time.monotonic() < deadline:
                time.sleep(0.05)
            before = shard_gets(proxy)
            assert sorted(before) == list(range(n_shards))  # every shard once, before iter()
            got = decoded(loader)
            assert shard_gets(proxy) == before  # nothing more fetched by the epoch
    finally:
        proxy.close()
    assert every_sample_once(got) and first_use_order(remote["local"], got) == order
    # set_epoch(2) comes while epoch 0's order is being fetched: the threads take up epoch 2's order
    # from there, within a few places (the shards already under way, two threads' requests racing
    # through the proxy: the bound of test_shards_are_fetched_in_the_order_the_epoch_first_needs_them)
    where = {k: p for p, k in enumerate(before)}
    late = [k for p, k in enumerate(order) if where[k] > p + 6]
    assert not late, (order, before)


def test_a_loaders_downloads_start_before_dali_is_imported(s3, remote, tmp_path, monkeypatch):
    """Written for downloads that begin only once the loader is built: importing DALI (a third of a
    second) and building the pipeline come after the dataset is opened, so the first epoch's shards
    are already being fetched when DALI's import begins, and the epoch reads every sample once."""
    import fastload.core as core_mod

    seen: list[list[str]] = []
    real = core_mod.import_dali

    def import_dali():
        seen.append(fastload_threads())
        return real()

    monkeypatch.setattr(core_mod, "import_dali", import_dali)
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.05)  # every shard still under way at the import
    try:
        opts = dict(storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c")
        with FastLoader(remote["url"], 4, device="cpu", crop=32, train=False, shuffle=True, seed=11, **opts) as loader:
            assert seen and "fastload-remote-prefetch" in seen[0], seen
            got = decoded(loader)
    finally:
        proxy.close()
    assert every_sample_once(got)


def test_a_loader_that_fails_after_its_downloads_began_gives_them_up(s3, remote, tmp_path, monkeypatch):
    """Written for a construction that raises once the downloads ahead are under way (here DALI's
    import, found installed but failing): the error reaches the caller, and the dropped loader leaves
    no download thread behind and asks for no more shards."""
    import fastload.core as core_mod
    from fastload.errors import DependencyError

    def broken():
        raise DependencyError("NVIDIA DALI is not importable (a broken install)")

    monkeypatch.setattr(core_mod, "import_dali", broken)
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.2)
    try:
        opts = dict(storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c")
        with pytest.raises(DependencyError, match="a broken install"):
            FastLoader(remote["url"], 4, device="cpu", crop=32, shuffle=True, seed=3, **opts)
        deadline = time.monotonic() + 10
        while fastload_threads() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert fastload_threads() == []
        seen = len(shard_gets(proxy))
        time.sleep(0.5)
        assert len(shard_gets(proxy)) == seen < len(fastload.Dataset(remote["local"]).manifest.shards)
    finally:
        proxy.close()


@pytest.mark.parametrize("why", ["cache_limit below the dataset", "torchrun before the process group", "records"])
def test_nothing_is_fetched_ahead_when_it_could_be_wasted(s3, remote, tmp_path, monkeypatch, why):
    """Written for an early fetch that fills a cache too small for the dataset with shards evicted before
    their turn, fetches another rank's order under torchrun (the rank is not known before the process
    group exists), or downloads whole shards where ``fetch="records"`` reads ranges: none of them starts
    a download before ``iter()``; the epoch then reads every sample once."""
    total = sum(s.bytes for s in fastload.Dataset(remote["local"]).manifest.shards)
    kw: dict = {}
    if why.startswith("cache_limit"):
        kw["cache_limit"] = total // 2
    elif why.startswith("torchrun"):
        monkeypatch.setenv("WORLD_SIZE", "2")
    else:
        kw["fetch"] = "records"
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.0)
    try:
        opts = dict(storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c", **kw)
        with FastLoader(remote["url"], 4, device="cpu", crop=32, train=False, shuffle=True, seed=11, **opts) as loader:
            time.sleep(1.0)  # what a fetch ahead would have sent by now (the whole dataset takes ~0.1 s)
            assert shard_gets(proxy) == []
            if why.startswith("torchrun"):
                monkeypatch.delenv("WORLD_SIZE")  # read as one process (no process group came)
            got = decoded(loader)
    finally:
        proxy.close()
    assert every_sample_once(got)


def fastload_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fastload")]


@pytest.mark.parametrize("server", ["slow", "cutting every answer"])
def test_closing_a_loader_gives_up_its_downloads_ahead(s3, remote, tmp_path, server):
    """Written for download threads that outlive their loader: fetching the whole dataset after a
    ``close()``, or retrying a failing server until ``retry_deadline``. After ``close()`` returns no
    fastload thread is left and no shard GET follows; a loader made again on the same cache reads
    every sample once."""
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.2 if server == "slow" else 0.0)
    proxy.drop = server != "slow"
    proxy.drop_after = 9000  # the manifest (7 KB) passes, every shard (12 KB) is cut
    try:
        opts = dict(storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c", retry_deadline=120)
        loader = FastLoader(remote["url"], 4, device="cpu", crop=32, shuffle=True, seed=3, **opts)
        deadline = time.monotonic() + 30
        while not shard_gets(proxy) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert shard_gets(proxy)  # under way
        t0 = time.monotonic()
        loader.close()
        assert time.monotonic() - t0 < 10 and fastload_threads() == []
        seen = len(shard_gets(proxy))
        time.sleep(0.5)
        assert len(shard_gets(proxy)) == seen  # nothing more asked for
        assert len(shard_gets(proxy)) < len(fastload.Dataset(remote["local"]).manifest.shards)
        proxy.drop = False
        with FastLoader(remote["url"], 4, device="cpu", crop=32, shuffle=True, seed=3, **opts) as again:
            assert every_sample_once(decoded(again))
    finally:
        proxy.close()


def test_a_download_cut_midway_goes_on_from_where_it_stopped(s3, tmp_path):
    """Every answer cut after 150 KB: each shard (two ~350 KB noise JPEGs) arrives over several
    range requests, and the bytes joined are the shard's (its SHA-256 is checked before use)."""
    from PIL import Image

    rng = np.random.default_rng(0)
    src = tmp_path / "noise"
    for i in range(6):
        p = src / f"class_{i % 2}" / f"{i}.jpg"
        p.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (400, 400, 3), dtype=np.uint8)).save(p, quality=95)
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/noise"
    fastload.pack(src, url, shard_size="800KB", storage_options=s3.options(), progress=False)
    fastload.pack(src, tmp_path / "local", shard_size="800KB", progress=False)
    local = fastload.Dataset(tmp_path / "local")
    assert min(s.bytes for s in local.manifest.shards) > 300_000
    proxy = Proxy("127.0.0.1", s3.ports["s3"])
    try:
        proxy.drop_after, proxy.drop = 150_000, True  # the manifest and labels are smaller
        ds = fastload.Dataset(url, storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c", retry_deadline=60)
        assert [ds[i] for i in range(len(ds))] == [local[i] for i in range(len(local))]
    finally:
        proxy.close()
    gets = [r for r in proxy.requests if r.startswith("GET ") and "/shard-" in r]
    assert len(gets) >= 3 * len(ds.manifest.shards)  # each shard in 3 or more pieces
