"""A FastLoader cleans up after itself: early exits, dropped loaders, competing iterators, bad state.

Exit behaviour is checked in child processes (under a timeout), since what is being tested
is how the interpreter ends.
"""

from __future__ import annotations

import gc
import subprocess
import sys
import textwrap
import threading
import time
import weakref

import numpy as np
import pytest
import torch

import fastload
from fastload import ConfigError, FastLoader, LoaderError

from conftest import decode_batch

N = 24  # samples in the packed fixture


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    from conftest import encode_color, write_image

    root = tmp_path_factory.mktemp("lifecycle")
    for i in range(N):
        write_image(root / "src" / f"class_{i % 3}" / f"{i:03d}.jpg", encode_color(i % 3, i), size=(40, 32))
    fastload.pack(root / "src", root / "packed", progress=False, workers=1)
    return root / "packed"


def _fastload_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("fastload")]


# ----------------------------------------------------------------------------- leaving early

_EXIT_SCRIPT = """
import os, signal, sys, time
# Ctrl-C as a terminal delivers it, whatever this process inherited from the one that started it
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
import fastload
loader = fastload.FastLoader(sys.argv[1], 4, device="cpu", crop=16, num_threads=1)
mode = sys.argv[2]
if mode == "break":
    for batch in loader:
        break
elif mode == "exception":
    for batch in loader:
        raise RuntimeError("boom in the training step")
elif mode == "sys.exit":
    for batch in loader:
        sys.exit(3)
elif mode == "ctrl-c":
    for batch in loader:
        os.kill(os.getpid(), signal.SIGINT)
        while True:  # the step goes on until the interrupt lands (a thread of the process may take the
            time.sleep(0.01)  # signal: signal.pause() would then wait for another one, for ever)
elif mode == "iterator-alive":
    it = iter(loader)
    next(it)
elif mode == "two-loaders":
    other = iter(fastload.FastLoader(sys.argv[1], 4, device="cpu", crop=16, train=False))
    next(other)
    for batch in loader:
        break
elif mode == "never-iterated":
    pass
print("end of script", flush=True)
"""

_EXPECTED_RC = {"break": 0, "exception": 1, "sys.exit": 3, "ctrl-c": 130, "iterator-alive": 0, "two-loaders": 0, "never-iterated": 0}


@pytest.mark.parametrize("attempt", [0, 1])
@pytest.mark.parametrize("mode", sorted(_EXPECTED_RC))
def test_leaving_an_epoch_early_exits_cleanly_and_promptly(packed, mode, attempt):
    """break / exception / sys.exit / Ctrl-C / live iterators at exit: the status the script asked
    for, never DALI's exit-time AssertionError or an abort (134) from a running thread."""
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-c", _EXIT_SCRIPT, str(packed), mode], capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    rc = 128 - r.returncode if r.returncode < 0 else r.returncode  # a signal death reads as 128+N
    assert rc == _EXPECTED_RC[mode], (r.returncode, r.stderr[-3000:])
    assert "terminate called" not in r.stderr
    assert "Exception ignored" not in r.stderr and "AssertionError" not in r.stderr, r.stderr[-3000:]
    if mode not in ("exception", "sys.exit", "ctrl-c"):
        assert "end of script" in r.stdout
    assert took < 60, f"took {took:.1f} s to exit"


# ----------------------------------------------------------------------------- dropped loaders


def test_a_dropped_loader_is_collected_and_stops_its_thread(packed):
    loader = FastLoader(packed, 4, device="cpu", crop=16)
    it = iter(loader)
    next(it)
    assert _fastload_threads()
    ref = weakref.ref(loader)
    del loader
    gc.collect()
    assert ref() is not None, "a live iterator keeps its loader alive, as a DataLoader's does"
    next(it)
    del it
    gc.collect()
    assert ref() is None, "nothing but the user's references may keep a loader alive"
    deadline = time.monotonic() + 10
    while _fastload_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _fastload_threads() == []


def test_a_dropped_iterator_stops_its_thread_and_the_loader_goes_on(packed):
    loader = FastLoader(packed, 4, device="cpu", crop=16, shuffle=False, train=False)
    it = iter(loader)
    next(it)
    del it
    gc.collect()
    deadline = time.monotonic() + 10
    epoch_threads = lambda: [n for n in _fastload_threads() if n.startswith("fastload-epoch")]  # noqa: E731
    while epoch_threads() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert epoch_threads() == []  # the loader's read-ahead pool lives as long as the loader
    labels = torch.cat([y for _x, y in loader])
    assert len(labels) == N
    loader.close()
    assert _fastload_threads() == []


_MANY_SCRIPT = """
import gc, json, sys, threading, time
import fastload

def rss_mb():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) // 1024 for l in f if l.startswith("VmRSS"))

def one():
    loader = fastload.FastLoader(sys.argv[1], 4, device="cpu", crop=16, num_threads=1)
    next(iter(loader))  # one batch, then dropped without close()

def settle():  # a stopped thread ends by itself a moment after its loader is collected
    gc.collect()
    deadline = time.monotonic() + 10
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.02)

for _ in range(int(sys.argv[2])):  # warm-up: allocator arenas, DALI's caches
    one()
settle()
before, threads_before = rss_mb(), threading.active_count()
for _ in range(int(sys.argv[3])):
    one()
settle()
print(json.dumps({"before": before, "after": rss_mb(), "threads_before": threads_before,
                  "threads_after": threading.active_count()}))
"""


@pytest.mark.slow  # long
def test_many_dropped_loaders_leave_no_threads_and_no_memory(packed):
    r = subprocess.run([sys.executable, "-c", _MANY_SCRIPT, str(packed), "15", "40"], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    import json

    m = json.loads(r.stdout.strip().splitlines()[-1])
    assert m["threads_after"] == m["threads_before"] == 1, m
    # Before: about 3 MB and one thread per dropped loader (100 loaders: +300 MB, 102 threads).
    assert m["after"] - m["before"] < 40, m


# ----------------------------------------------------------------------------- several iterators


def test_a_new_iterator_ends_the_previous_one_with_a_clear_error(packed):
    loader = FastLoader(packed, 4, device="cpu", crop=16, shuffle=False, train=False)
    first = iter(loader)
    x0, _ = next(first)
    second = iter(loader)
    with pytest.raises(LoaderError, match="newer iter"):
        next(first)
    with pytest.raises(StopIteration):
        next(first)  # ended stays ended
    batches = list(second)
    assert len(batches) == len(loader)
    got = [idx for x, _y in batches for _label, idx in decode_batch(x.numpy(), fastload.IMAGENET_MEAN, fastload.IMAGENET_STD)]
    assert sorted(got) == list(range(N))  # the new epoch is complete
    loader.close()


def test_two_threads_on_one_loader_never_get_a_silently_short_epoch(packed):
    loader = FastLoader(packed, 2, device="cpu", crop=16, shuffle=False, train=False, prefetch=1)
    results: dict[str, object] = {}
    go = threading.Barrier(2)

    def consume(name: str) -> None:
        go.wait()
        n = 0
        try:
            for _ in loader:
                n += 1
                time.sleep(0.01)
            results[name] = n
        except LoaderError as e:
            results[name] = e

    threads = [threading.Thread(target=consume, args=(k,)) for k in ("a", "b")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not any(t.is_alive() for t in threads)
    for v in results.values():
        assert v == len(loader) or (isinstance(v, LoaderError) and "newer iter" in str(v)), results
    assert len(loader) in results.values(), results  # the one that started last read a whole epoch
    loader.close()


# ----------------------------------------------------------------------------- state and arguments


def _state(loader: FastLoader, **change):
    s = loader.state_dict()
    s.update(change)
    return s


@pytest.mark.parametrize(
    "change, match",
    [
        ({"epoch": "1"}, "epoch='1'"),
        ({"epoch": 1.0}, "epoch=1.0"),
        ({"epoch": True}, "epoch=True"),
        ({"epoch": -1}, "invalid position"),
        ({"batches_done": 10**9}, "invalid position"),
        ({"batches_done": None}, "batches_done=None"),
        ({"shuffle": "yes"}, "shuffle='yes'"),
        ({"consumed": [[5, 2]]}, "invalid consumed"),
        ({"resumed_from": [[0, 4]]}, "resumed_from outside consumed"),
        ({"seed": 2**70}, "seed"),
        ({"version": True}, "version"),
    ],
)
def test_load_state_dict_checks_every_field(packed, change, match):
    loader = FastLoader(packed, 4, device="cpu", crop=16)
    before = loader.state_dict()
    with pytest.raises(ConfigError, match=match):
        loader.load_state_dict(_state(loader, **change))
    assert loader.state_dict() == before  # a refused state changes nothing
    loader.close()


def test_load_state_dict_names_missing_fields(packed):
    loader = FastLoader(packed, 4, device="cpu", crop=16)
    s = loader.state_dict()
    del s["batches_done"], s["consumed"]
    with pytest.raises(ConfigError, match="lacks batches_done, consumed"):
        loader.load_state_dict(s)
    loader.close()


def test_integer_arguments_accept_numpy_and_tensor_integers(packed):
    loader = FastLoader(packed, np.int64(4), device="cpu", crop=torch.tensor(16), seed=np.uint8(3), prefetch=np.int32(2))
    assert (loader.batch_size, loader.crop, loader.seed) == (4, 16, 3)
    assert all(type(v) is int for v in (loader.batch_size, loader.crop, loader.seed, loader.prefetch))
    loader.set_epoch(np.int64(2))
    assert loader.epoch == 2
    x, _ = next(iter(loader))
    assert tuple(x.shape) == (4, 3, 16, 16)
    loader.close()


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"world_size": N + 1, "rank": 0}, r"world_size=25 is larger than the dataset \(24 samples"),
        ({"crop": 100_000}, r"crop must be an int in \[1, 8192\]"),
        ({"crop": 4096, "resize": 10**6}, "resize"),
        ({"num_threads": 10**6}, r"num_threads must be an int in \[1, 256\]"),
        ({"prefetch": 10**6}, "prefetch"),
        ({"batch_size": True}, "batch_size"),
        ({"crop": 16.0}, "crop"),
        ({"rank": np.int64(3), "world_size": np.int64(2)}, r"rank must be an int in \[0, world_size=2\)"),
    ],
)
def test_arguments_that_cannot_work_fail_at_construction(packed, kwargs, match):
    kw = {"batch_size": 4, **kwargs}
    with pytest.raises(ConfigError, match=match):
        FastLoader(packed, kw.pop("batch_size"), device="cpu", **kw)
    assert _fastload_threads() == []


def test_a_batch_size_above_the_dataset_gives_one_batch(packed):
    loader = FastLoader(packed, 10**9, device="cpu", crop=16)
    batches = list(loader)
    assert [len(y) for _x, y in batches] == [N]
    loader.close()


def test_a_dropped_loader_is_freed_at_once_without_the_cyclic_collector(packed):
    # Its sampler and dataset view reach it weakly: no reference cycle, so dropping the last
    # reference frees it, and its finaliser stops its threads, even with the collector off
    # (before, it waited for a full collection, its threads and DALI pipeline with it).
    gc.collect()
    gc.disable()
    try:
        loader = FastLoader(packed, 4, device="cpu", crop=16, num_threads=1)
        next(iter(loader))
        assert loader.sampler.epoch == 0 and len(loader.dataset) == N
        gone = weakref.ref(loader)
        del loader
        assert gone() is None
        deadline = time.monotonic() + 10
        while _fastload_threads() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _fastload_threads() == []
    finally:
        gc.enable()


def test_a_sampler_and_dataset_view_kept_after_their_loader_keep_its_last_epoch(packed):
    loader = FastLoader(packed, 4, device="cpu", crop=16, num_threads=1, shuffle=True)
    loader.set_epoch(3)
    sampler, view = loader.sampler, loader.dataset
    order = list(sampler)
    first = view[0][0]
    del loader
    gc.collect()
    assert sampler.epoch == 3 and list(sampler) == order  # the epoch it was left at
    assert torch.equal(view[0][0], first)
    sampler.set_epoch(4)  # no loader to move: the sampler's own epoch moves
    assert sampler.epoch == 4 and list(sampler) != order
