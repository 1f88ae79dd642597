"""Long runs of FastLoader: memory, threads and file descriptors stay flat.

The 20-epoch run is ``slow`` (``scripts/test-slow.sh``); a 6-epoch version runs in CI.
"""

from __future__ import annotations

import io
import multiprocessing as mp
import os
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload import FastLoader, IMAGENET_MEAN, IMAGENET_STD

from conftest import decode_batch, decode_color, encode_color, write_image

N = 96


@pytest.fixture(scope="module")
def packed(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("longrun")
    for i in range(N):
        label = i % 4
        write_image(base / "src" / f"c{label}" / f"{i:03d}.jpg", encode_color(label, i), size=(160, 120), quality=90)
    fastload.pack(base / "src", base / "p", workers=1, progress=False)
    return base / "p"


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _run_epochs(packed: Path, epochs: int) -> dict:
    rss, threads, fds = [], [], []
    with FastLoader(packed, 16, device="cpu", crop=64) as loader:
        for _ in range(epochs):
            seen = 0
            for x, y in loader:
                seen += len(y)
            assert seen == N
            rss.append(_rss_mb())
            threads.append(threading.active_count())
            fds.append(_fds())
    return {"rss": rss, "threads": threads, "fds": fds}


def _assert_flat(m: dict, max_growth_mb: float) -> None:
    # the first epoch allocates DALI's buffers; growth is measured after it
    growth = max(m["rss"][1:]) - m["rss"][1]
    assert growth < max_growth_mb, f"RSS grew by {growth:.1f} MB over {len(m['rss'])} epochs: {m['rss']}"
    assert len(set(m["threads"])) == 1, f"thread count changed: {m['threads']}"
    assert len(set(m["fds"])) == 1, f"open file descriptors changed: {m['fds']}"




def test_memory_threads_fds_flat_over_epochs(packed):
    before_threads = threading.active_count()
    m = _run_epochs(packed, 6)
    _assert_flat(m, max_growth_mb=20)
    assert threading.active_count() == before_threads  # close() joined everything


@pytest.mark.slow
def test_twenty_epochs_rss_grows_less_than_50mb(packed):
    m = _run_epochs(packed, 20)
    _assert_flat(m, max_growth_mb=50)


def _reader_proc(packed: str, rank: int, q) -> None:
    try:
        with FastLoader(packed, 8, device="cpu", crop=32, num_threads=1, seed=rank, train=rank % 2 == 0) as loader:
            got = []
            for x, y in loader:
                dec = decode_batch(x.numpy(), IMAGENET_MEAN, IMAGENET_STD)
                assert [d[0] for d in dec] == y.tolist()
                got += [d[1] for d in dec]
        ds = fastload.Dataset(packed)
        order = np.random.default_rng(rank).permutation(N)
        for i in order:  # raw random reads in parallel with the others
            payload, label = ds[int(i)]
            rgb = np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"), dtype=np.float64).mean(axis=(0, 1))
            pixel_label, pixel_index = decode_color(rgb)
            assert label == pixel_label == pixel_index % 4
        q.put((rank, sorted(got)))
    except Exception as e:  # pragma: no cover - reported to the parent
        q.put((rank, repr(e)))


@pytest.mark.slow  # long
def test_four_processes_read_one_dataset_at_once(packed):
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    procs = [ctx.Process(target=_reader_proc, args=(str(packed), r, q)) for r in range(4)]
    for p in procs:
        p.start()
    results = dict(q.get(timeout=240) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert all(results[r] == list(range(N)) for r in range(4)), results
