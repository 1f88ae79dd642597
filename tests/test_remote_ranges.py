"""``fetch="records"``: each record fetched by a range request into a sparse copy of its shard, against
a real S3 server (SeaweedFS): the batches of a local copy, a node cache that holds only the batches in
flight whatever the dataset's size, and an object replaced mid-epoch caught.

Images are solid colours whose pixels encode (label, index) (``conftest.encode_color``), each JPEG
carrying a comment of random bytes so that its record (about 10 KB) sits in LMDB overflow pages of
its own, as photos do.
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD, FastLoader
from fastload.errors import ConfigError, CorruptDataError

from conftest import decode_batches, encode_color
from s3server import SeaweedServer

obstore = pytest.importorskip("obstore")

N_CLASSES, PER_CLASS = 3, 40  # 120 images of about 10 KB, about 20 per 256 KB shard
SHARD_SIZE = "256KB"
COMMENT = 9000  # bytes of noise in each JPEG's comment
PAGE = 4096


def make_images(root: Path) -> Path:
    rng = np.random.default_rng(0)
    i = 0
    for label in range(N_CLASSES):
        for j in range(PER_CLASS):
            path = root / f"class_{label}" / f"img_{j:03d}.jpg"
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.new("RGB", (64, 48), encode_color(label, i)).save(path, comment=rng.bytes(COMMENT))
            i += 1
    return root


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return make_images(tmp_path_factory.mktemp("images"))


@pytest.fixture(scope="module")
def remote(s3, images, tmp_path_factory):
    os.environ["FASTLOAD_CACHE"] = str(tmp_path_factory.mktemp("packcache"))
    try:
        bucket = s3.make_bucket()
        url = f"s3://{bucket}/train"
        fastload.pack(images, url, shard_size=SHARD_SIZE, storage_options=s3.options(), progress=False)
        local = tmp_path_factory.mktemp("local") / "train"
        fastload.pack(images, local, shard_size=SHARD_SIZE, progress=False)
    finally:
        del os.environ["FASTLOAD_CACHE"]
    return {"url": url, "bucket": bucket, "local": local}


def decoded(batches) -> list[tuple[int, int]]:
    return decode_batches(batches, IMAGENET_MEAN, IMAGENET_STD)


def every_sample_once(got: list[tuple[int, int]]) -> bool:
    return sorted(got) == sorted((i // PER_CLASS, i) for i in range(N_CLASSES * PER_CLASS))


def test_records_give_the_batches_len_and_resume_of_a_local_copy(s3, remote, tmp_path):
    kw = dict(device="cpu", crop=32, seed=5, train=True, shuffle=True)
    with FastLoader(remote["local"], 7, **kw) as ref_loader:
        ref_loader.set_epoch(2)
        ref = [(x.clone(), y.clone()) for x, y in ref_loader]
    opts = dict(storage_options=s3.options(), cache_dir=tmp_path / "c", fetch="records")
    with FastLoader(remote["url"], 7, **kw, **opts) as a:
        assert len(a) == len(ref)
        a.set_epoch(2)
        it = iter(a)
        first = [next(it) for _ in range(4)]
        state = json.loads(json.dumps(a.state_dict()))
        root = a.packed.path
    with FastLoader(remote["url"], 7, **kw, **opts) as b:
        b.load_state_dict(state)
        rest = list(b)
    got = first + rest
    assert len(got) == len(ref)
    for (x1, y1), (x2, y2) in zip(got, ref):  # bit-identical on the CPU path
        assert torch.equal(y1, y2) and torch.equal(x1, x2)
    assert every_sample_once(decoded(got))
    # no shard was downloaded whole: only this process's sparse copies
    assert not list(root.glob("shard-*")) and not (root / ".downloads").exists()
    assert {p.name.rsplit(".", 1)[1] for p in (root / ".ranges").iterdir()} == {str(os.getpid())}


def test_a_dataset_reads_records_by_range_and_the_same_bytes(s3, remote, tmp_path):
    local = fastload.Dataset(remote["local"])
    ds = fastload.Dataset(remote["url"], storage_options=s3.options(), cache_dir=tmp_path / "c", fetch="records")
    for i in (0, 57, 119, 3):
        assert ds[i] == local[i]
    fillers = [ds.remote.filler(k) for k in range(len(ds.manifest.shards))]
    used = [f for f in fillers if f is not None]
    shards = {k for k, sh in enumerate(ds.manifest.shards) for i in (0, 57, 119, 3) if sh.first <= i < sh.first + sh.count}
    assert [k for k, f in enumerate(fillers) if f is not None] == sorted(shards)  # only the shards read were opened
    for k in sorted(shards):  # what came over the wire: the 2 meta pages, the leaf page, the records asked for
        sh = ds.manifest.shards[k]
        asked = [i for i in (0, 57, 119, 3) if sh.first <= i < sh.first + sh.count]
        record_pages = sum(-(-(local.locate(i)[2] + 16) // PAGE) for i in asked)  # + LMDB's overflow page header
        assert fillers[k].fetched == (3 + record_pages) * PAGE < sh.bytes, (k, fillers[k].fetched, sh.bytes)


def allocated(root: Path) -> int:
    total = 0
    for p in root.rglob("*"):
        if p.is_file() and not p.name.endswith(".lock"):
            try:
                total += p.stat().st_blocks * 512
            except FileNotFoundError:
                pass
    return total


def test_under_a_global_shuffle_the_cache_holds_the_batches_in_flight_not_the_dataset(s3, remote, images, tmp_path):
    cache = tmp_path / "c"
    batch, prefetch = 4, 2
    ds = fastload.Dataset(remote["url"], storage_options=s3.options(), cache_dir=cache)
    total = sum(s.bytes for s in ds.manifest.shards)
    meta = allocated(ds.path)  # manifest, labels and the other dataset files, fetched at open
    # what may be on disk at once, from the images and the layout, not from the code: each shard's
    # meta pages and its one leaf page, and the records of the batches the loader has in flight
    # (the one read, DALI's prefetch, the read-ahead's depth of prefetch + 2), each record its
    # file's size plus fastload's header, rounded up to pages, plus a page of LMDB's overflow header
    biggest = max(p.stat().st_size for p in images.rglob("*.jpg")) + 512
    record_pages = -(-(biggest + 16) // PAGE)
    in_flight = (1 + prefetch + prefetch + 2 + 1) * batch * record_pages * PAGE
    structure = len(ds.manifest.shards) * 3 * PAGE
    bound = meta + structure + in_flight
    assert bound < total / 2  # the bound means something: the shards would not fit under it
    samples, stop = [], threading.Event()

    def sample() -> None:
        while not stop.is_set():
            samples.append(allocated(cache / "remote") if (cache / "remote").exists() else allocated(cache))
            time.sleep(0.002)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        with FastLoader(remote["url"], batch, device="cpu", crop=32, train=True, shuffle=True, seed=1, prefetch=prefetch,
                        storage_options=s3.options(), cache_dir=cache, fetch="records") as loader:  # fmt: skip
            got = decoded(loader)
    finally:
        stop.set()
        t.join()
    assert every_sample_once(got)
    assert samples and max(samples) <= bound, (max(samples), bound, total)


def test_an_object_replaced_during_an_epoch_is_an_error_naming_it_never_its_bytes(s3, images, tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "pack"))
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/t"
    fastload.pack(images, url, shard_size=SHARD_SIZE, storage_options=s3.options(), progress=False)
    ds = fastload.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "c", fetch="records")
    k = 3 if len(ds.manifest.shards) > 3 else 1
    first = ds.manifest.shards[k].first
    assert ds[first][1] == first // PER_CLASS  # shard 3 opened: its version (ETag) is the one every request asks for
    st = s3.store(bucket)
    key = f"t/{ds.manifest.shards[k].file}"
    good = bytes(obstore.get(st, key).bytes())
    obstore.put(st, key, good[::-1])  # other bytes, the same size
    with pytest.raises(CorruptDataError, match=rf"{url}/{ds.manifest.shards[k].file}: the object was replaced"):
        ds[first + 1]
    obstore.put(st, key, good)


@pytest.mark.parametrize("value", ["record", "all", 1, True])
def test_fetch_must_be_shards_or_records(value):
    with pytest.raises(ConfigError, match=r"fetch must be 'shards' or 'records', got " + repr(value).replace("'", ".")):
        fastload.Dataset("s3://bucket/prefix", fetch=value)


def test_fetch_is_refused_for_a_local_dataset(remote):
    with pytest.raises(ConfigError, match=r"fetch: only for a dataset URL"):
        fastload.Dataset(remote["local"], fetch="records")
    with pytest.raises(ConfigError, match=r"fetch: only for a dataset URL"):
        FastLoader(remote["local"], 4, fetch="records")


def test_a_server_gone_for_good_is_an_error_within_the_deadline(images, tmp_path, monkeypatch):
    from fastload.errors import RemoteError

    server = SeaweedServer(tmp_path / "weed")
    server.start()
    try:
        monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "pack"))
        url = f"s3://{server.make_bucket()}/t"
        fastload.pack(images, url, shard_size=SHARD_SIZE, storage_options=server.options(), progress=False)
        ds = fastload.Dataset(url, storage_options=server.options(), cache_dir=tmp_path / "c", fetch="records",
                              retry_deadline=3)  # fmt: skip
        assert ds[0][1] == 0
    finally:
        server.stop()
    for i, what in ((1, "GET"), (len(ds) - 1, "HEAD")):  # a record of an open shard; a shard not opened yet
        t = time.monotonic()
        with pytest.raises(RemoteError, match=rf"{url}/shard-\d+\.lmdb: {what} failed .* \(retry_deadline=3 s\)"):
            ds[i]
        assert time.monotonic() - t < 3 + 10  # the deadline plus at most one attempt's connect timeout


def _as_bytes(item):
    return bytes(item[0]), item[1]


def test_dataloader_workers_read_the_same_bytes_and_forked_ones_fail_at_once(s3, remote, tmp_path):
    from torch.utils.data import DataLoader

    from fastload.errors import RemoteError

    local = fastload.Dataset(remote["local"])
    ds = fastload.Dataset(remote["url"], storage_options=s3.options(), cache_dir=tmp_path / "c", fetch="records")
    ds[5], ds[80]  # shards opened (and partly filled) in the parent
    spawned = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="spawn", collate_fn=_as_bytes)
    assert list(spawned) == [(bytes(local[i][0]), local[i][1]) for i in range(len(local))]
    # a forked worker cannot use the store's client (it does not survive fork): an error naming the URL, not a hang
    forked = DataLoader(ds, batch_size=None, num_workers=1, multiprocessing_context="fork", collate_fn=_as_bytes,
                        timeout=120)  # fmt: skip
    t = time.monotonic()
    with pytest.raises(RemoteError, match=rf"{remote['url']}/shard-\d+\.lmdb: a process forked from one that used the object store"):
        list(forked)
    assert time.monotonic() - t < 60
    assert ds[81] == local[81]  # the parent still reads correct bytes
