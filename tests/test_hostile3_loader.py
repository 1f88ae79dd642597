"""Careless and hostile use of a loader, round three: forks, thread limits, sizes, states, seeds, close mid-epoch.

Each test names the defect it was written for; each fails on the code before its fix.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import threading
import uuid
from pathlib import Path

import numpy as np
import pytest

import fastload
from fastload import ConfigError, FastLoader, LoaderError

ROOT = Path(__file__).resolve().parent.parent


def _run(code: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (fastload from this checkout); a hang fails the test, not the suite."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=timeout, env=env)


# ----------------------------------------------------------------------------- fork


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
@pytest.mark.parametrize("iterated", [True, False], ids=["iterated-in-parent", "never-iterated"])
def test_a_loader_used_in_a_forked_child_reads_the_epoch_the_parent_would(pixel_dataset, tmp_path, train, iterated):
    """Defect: the decode pool and read-ahead checked the pid, the DALI pipeline did not: the child hung."""
    out = tmp_path / "child.npy"
    r = _run(f"""
        import os, sys
        import numpy as np
        import fastload
        ld = fastload.FastLoader({str(pixel_dataset.packed)!r}, 5, device="cpu", crop=16, train={train}, shuffle=True, seed=4)
        if {iterated}:
            next(iter(ld))  # the parent's thread and pipeline exist now; the epoch is not finished
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                xs = [x.numpy() for x, _ in ld]
                np.save({str(out)!r}, np.concatenate(xs))
                assert ld.state_dict()["epoch"] == 1
                ld.close()
                code = 0
            finally:
                sys.stdout.flush()
                os._exit(code) if code else None
            sys.exit(0)  # a normal exit: atexit hooks and finalisers run in the child
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        want = np.concatenate([x.numpy() for x, _ in ld])
        assert np.array_equal(np.load({str(out)!r}), want)
        print("same", want.shape[0])
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.split() == ["same", str(len(pixel_dataset.labels))]


def test_a_forked_child_that_only_exits_does_not_hang(pixel_dataset):
    r = _run(f"""
        import os
        import fastload
        ld = fastload.FastLoader({str(pixel_dataset.packed)!r}, 5, device="cpu", crop=16)
        it = iter(ld); next(it)
        pid = os.fork()
        if pid == 0:
            del it, ld
            raise SystemExit(0)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """)
    assert r.returncode == 0 and r.stdout.strip() == "0", r.stderr[-3000:]


# ----------------------------------------------------------------------------- thread limits


def _pids_cgroup(limit: int) -> Path:
    base = Path("/sys/fs/cgroup/pids")
    if not (base / "cgroup.procs").exists() or not os.access(base, os.W_OK):
        pytest.skip("no writable pids cgroup (v1) here")
    cg = base / f"fastload-test-{uuid.uuid4().hex[:8]}"
    try:
        cg.mkdir()
        (cg / "pids.max").write_text(str(limit))
    except OSError as e:
        pytest.skip(f"cannot make a pids cgroup: {e}")
    return cg


@pytest.mark.parametrize("threads", [8, 32])
def test_a_pids_limit_gives_an_error_naming_the_threads_never_an_abort(pixel_dataset, threads):
    """Defect: DALI's Pipeline.build aborted the process (SIGABRT) when it could not start its threads.

    (Evaluation: no decode pool, whose threads would be refused first, with their own LoaderError.)
    """
    cg = _pids_cgroup(20)  # the interpreter with torch and DALI imported uses about 6
    try:
        r = _run(f"""
            import os
            open({str(cg / "cgroup.procs")!r}, "w").write(str(os.getpid()))
            import fastload
            try:
                ld = fastload.FastLoader({str(pixel_dataset.packed)!r}, 5, device="cpu", crop=16, num_threads={threads}, train=False)
                next(iter(ld))
            except fastload.LoaderError as e:
                print("LoaderError:", e)
        """)
    finally:
        cg.rmdir()
    assert r.returncode == 0, (r.returncode, r.stderr[-2000:])
    assert f"the DALI pipeline ({threads} CPU threads) needs about {2 * threads + 8} threads" in r.stdout
    assert "pids.max" in r.stdout and "num_threads" in r.stdout


def test_under_a_pids_limit_a_loader_that_fits_still_runs(pixel_dataset):
    cg = _pids_cgroup(24)
    try:
        r = _run(f"""
            import os
            open({str(cg / "cgroup.procs")!r}, "w").write(str(os.getpid()))
            import fastload
            ld = fastload.FastLoader({str(pixel_dataset.packed)!r}, 5, device="cpu", crop=16, num_threads=1)
            print(sum(len(y) for _, y in ld))
        """)
    finally:
        cg.rmdir()
    assert r.returncode == 0 and r.stdout.strip() == str(len(pixel_dataset.labels)), r.stderr[-2000:]


class _RefuseThreads:
    """``threading.Thread.start`` that refuses threads whose name starts with ``prefix`` (as a limit would)."""

    def __init__(self, monkeypatch, prefix: str, after: int = 0) -> None:
        self.prefix, self.after, self.started = prefix, after, 0
        real = threading.Thread.start
        me = self

        def start(t: threading.Thread) -> None:
            if t.name.startswith(me.prefix):
                if me.started >= me.after:
                    raise RuntimeError("can't start new thread")
                me.started += 1
            real(t)

        monkeypatch.setattr(threading.Thread, "start", start)


@pytest.mark.parametrize(
    ("prefix", "after", "where", "what"),
    [
        ("fastload-epoch", 0, "iter", "the epoch thread"),
        ("fastload-readahead", 0, "iter", "the read-ahead's 4 threads"),
        ("fastload-readahead", 2, "iter", "the read-ahead's 4 threads"),
        ("fastload-probe", 3, "iter", "the DALI pipeline"),
    ],
)
def test_a_thread_that_cannot_start_is_a_loader_error_and_no_thread_is_left(pixel_dataset, monkeypatch, prefix, after, where, what):
    """Defect: a raw RuntimeError from FastLoader()/iter(), or a traceback from inside DALI's callback."""
    before = {t.ident for t in threading.enumerate()}
    ld = FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16)
    refuse = _RefuseThreads(monkeypatch, prefix, after)
    with pytest.raises(LoaderError, match=f"could not start {what}|{what}.*needs about") as e:
        next(iter(ld))
    assert "ulimit -u" in str(e.value)
    monkeypatch.undo()
    assert refuse.started == after
    # the threads that had started were ended; the loader works once threads can start again
    x, y = next(iter(ld))
    assert x.shape == (5, 3, 16, 16)
    ld.close()
    left = [t for t in threading.enumerate() if t.ident not in before and t.name.startswith("fastload-")]
    for t in left:
        t.join(5)
    assert not [t.name for t in left if t.is_alive()]


def test_a_decode_pool_that_cannot_start_is_a_loader_error_from_the_constructor(tmp_path, monkeypatch):
    from PIL import Image

    src = tmp_path / "src" / "c"
    src.mkdir(parents=True)
    for i in range(4):  # big enough for reduced-scale decoding of 16-px crops
        Image.new("RGB", (400, 300), (i * 40, 90, 30)).save(src / f"{i}.jpg")
    fastload.pack(tmp_path / "src", tmp_path / "packed", workers=1, progress=False)
    _RefuseThreads(monkeypatch, "fastload-decode", after=1)
    with pytest.raises(LoaderError, match="could not start the decode pool's"):
        FastLoader(tmp_path / "packed", 2, device="cpu", crop=16, num_threads=2)


# ----------------------------------------------------------------------------- sizes a user or a file merely claims


def _rss_mb() -> float:
    from fastload.store import process_memory

    return process_memory()["rss"] / 2**20


@pytest.mark.parametrize("batch_size", [10**7, 10**8])
def test_a_huge_batch_size_over_a_small_sampler_sizes_the_pipeline_by_the_batches(pixel_dataset, batch_size):
    """Defect: FastLoader(ds, 10**7, sampler=[0, 1, 2]) sized DALI for 10**7 samples (+611 MB; 3.8 GB at 10**8)."""
    ld = FastLoader(pixel_dataset.packed, batch_size, sampler=[0, 1, 2], device="cpu", crop=16)
    before = _rss_mb()
    batches = [y.tolist() for _, y in ld]
    grew = _rss_mb() - before
    assert batches == [[pixel_dataset.labels[i] for i in (0, 1, 2)]]  # one batch of the 3, as a DataLoader gives
    assert grew < 150, f"{grew:.0f} MB for one batch of 3"
    ld.close()


def test_an_effective_batch_over_the_limit_is_refused_naming_it(tmp_path):
    from fastload.sampler import MAX_BATCH

    ld_sampler = list(range(24)) * (MAX_BATCH // 24 + 1)  # more indices than one batch may hold
    src = tmp_path / "s" / "c"
    src.mkdir(parents=True)
    from PIL import Image

    for i in range(24):
        Image.new("RGB", (8, 8), (i, 0, 0)).save(src / f"{i}.jpg")
    fastload.pack(tmp_path / "s", tmp_path / "p", workers=1, progress=False)
    with pytest.raises(ConfigError, match=f"the sampler's largest batch must be an int in \\[1, {MAX_BATCH}\\].*got {len(ld_sampler)}"):
        FastLoader(tmp_path / "p", 10**7, sampler=ld_sampler, device="cpu", crop=8)
    assert FastLoader(tmp_path / "p", MAX_BATCH, sampler=ld_sampler[:MAX_BATCH], device="cpu", crop=8, train=False)


@pytest.mark.parametrize(("block_size", "window"), [(1000, 20000), (2**62, 2**62), (5, 2**40), (10**6, 1)])
def test_block_order_memory_is_bounded_by_the_epoch_not_the_arguments(pixel_dataset, block_size, window):
    """Defect: order="block", block_size=1000, window=20000 on 24 samples: +304 MB (2**62: a DALI error)."""
    before = _rss_mb()
    with FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16, shuffle=True, order="block",
                    block_size=block_size, window=window) as ld:  # fmt: skip
        got = sorted(i for _, y in ld for i in y.tolist())
    assert _rss_mb() - before < 150
    assert got == sorted(pixel_dataset.labels)  # every sample once (labels stand in for them)


def test_block_order_with_runs_and_window_beyond_the_epoch_is_a_plain_shuffle_of_it():
    """Oracle: a run longer than the dataset, or a window of more runs than exist, shuffles all of it."""
    from fastload.sampler import block_order

    for n, b, w in [(10, 10**6, 3), (10, 3, 10**9), (1, 2**62, 2**62)]:
        orders = {tuple(block_order(n, block_size=b, window=w, rng=np.random.default_rng(s)).tolist()) for s in range(40)}
        assert all(sorted(o) == list(range(n)) for o in orders)
        assert len(orders) > (1 if n > 1 else 0)  # it does shuffle


def test_merge_states_of_states_claiming_huge_epochs_is_a_config_error(pixel_dataset):
    """Defect: merge_states of states claiming 10**12 samples: a raw MemoryError (7.28 TiB)."""
    with FastLoader(pixel_dataset.packed, 4, device="cpu", crop=16) as ld:
        it = iter(ld)
        next(it)
        st = ld.state_dict()
    for n in (10**12, 2**33 + 1):
        with pytest.raises(ConfigError, match="num_samples must be an int in"):
            FastLoader.merge_states([dict(st, num_samples=n, consumed=[[0, 4]], resumed_from=[])])


def test_an_evaluation_resize_over_the_pixel_limit_fails_alone_naming_its_sample(tmp_path, monkeypatch):
    """Defect: a 65000x1 JPEG asked DALI for a 16,640,000x256 resize in evaluation (12.8 GB)."""
    from PIL import Image

    from fastload.packing import images

    src = tmp_path / "s" / "c"
    src.mkdir(parents=True)
    Image.new("RGB", (20, 20), (200, 0, 0)).save(src / "0.jpg")
    Image.new("RGB", (65000, 1), (0, 200, 0)).save(src / "1.jpg")  # a strip, as an older pack accepted
    Image.new("RGB", (30, 20), (0, 0, 200)).save(src / "2.jpg")
    monkeypatch.setattr(images, "RESIZE_MAX_PIXELS", 2**62)  # packed as an older version did
    fastload.pack(tmp_path / "s", tmp_path / "p", workers=1, progress=False)
    assert len(fastload.Dataset(tmp_path / "p")) == 3
    before = _rss_mb()
    with FastLoader(tmp_path / "p", 1, device="cpu", train=False, crop=224, shuffle=False) as ld:
        it = iter(ld)
        first = next(it)[0]
        with pytest.raises(LoaderError, match=r"sample 1 .*1\.jpg.*65000x1 image would be resized to 16640000x256"):
            next(it)
    assert first.shape == (1, 3, 224, 224)
    assert _rss_mb() - before < 500


# ----------------------------------------------------------------------------- silently different results


def test_close_in_the_middle_of_an_epoch_makes_next_an_error_not_the_end(pixel_dataset):
    """Defect: close() mid-epoch made the next next() raise StopIteration: a 5-batch epoch looked complete."""
    ld = FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16)
    it = iter(ld)
    next(it)
    ld.close()
    for _ in range(2):  # every time, never StopIteration
        with pytest.raises(LoaderError, match="closed while it was being iterated"):
            next(it)
    assert list(iter(FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16)))  # others unaffected


def test_close_after_the_end_of_an_epoch_leaves_that_epoch_complete(pixel_dataset):
    ld = FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16)
    it = iter(ld)
    assert len(list(it)) == 5
    ld.close()
    with pytest.raises(StopIteration):
        next(it)


def test_load_state_dict_while_an_iterator_is_live_says_so(pixel_dataset):
    """Defect: the iterator then said it was 'ended by a newer iter()'."""
    ld = FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16, shuffle=True, seed=2)
    it = iter(ld)
    next(it)
    state = ld.state_dict()
    ld.load_state_dict(state)
    with pytest.raises(LoaderError, match=r"ended by load_state_dict\(\)") as e:
        next(it)
    assert "newer iter()" not in str(e.value)
    assert len(list(ld)) == 4  # the rest of the epoch, from the saved position
    ld.close()


@pytest.mark.parametrize("seed", [2**64, 2**64 + 7, -1, -(2**63)])
def test_seeds_outside_64_bits_are_refused(pixel_dataset, seed):
    """Defect: seed=2**64 gave exactly seed 0's batches."""
    with pytest.raises(ConfigError, match=r"seed must be an int in \[0, 18446744073709551615\]"):
        FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16, seed=seed)


def test_every_bit_of_a_seed_changes_the_order(pixel_dataset):
    def order(seed):
        with FastLoader(pixel_dataset.packed, 24, device="cpu", crop=8, shuffle=True, seed=seed, train=False) as ld:
            return next(iter(ld.batch_sampler))

    base = order(0)
    assert all(order(1 << bit) != base for bit in (0, 31, 32, 63))


def _state(ld) -> dict:
    it = iter(ld)
    next(it)
    return ld.state_dict()


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("batches_done", -5, "invalid position"),
        ("batches_done", 10**6, r"batches_done=1000000 \(0\.\.5\)"),
        ("batches_done", "1", r"batches_done='1' \(str\); expected int"),
        ("batches_done", 1.5, r"\(float\); expected int"),
        ("batches_done", [1], r"\(list\); expected int"),
        ("batches_done", True, r"\(bool\); expected int"),
        ("batches_done", 3, "consumes"),  # the count of another position than its consumed list
        ("consumed", [[0, 2**64]], "within 0..24"),
        ("consumed", [[0, 3]], "consumes"),
        ("epoch", -1, "invalid position"),
    ],
)
def test_merge_states_refuses_what_no_loader_saved(pixel_dataset, field, value, message):
    """Defect: batches_done=-5 or 10**6 for a 3-batch epoch gave a made-up consumed list; '1', 1.5, [1] raw errors."""
    with FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16, shuffle=True, seed=1) as ld:
        st = _state(ld)
    assert FastLoader.merge_states([st]) == st
    with pytest.raises(ConfigError, match=message):
        FastLoader.merge_states([dict(st, **{field: value})])


@pytest.mark.parametrize("consumed", [[[0, 2**64]], [[-(2**70), 3]], [[0, 10**30]]])
def test_load_state_dict_with_out_of_range_intervals_is_a_config_error(pixel_dataset, consumed):
    """Defect: consumed=[[0, 2**64]] raised a raw OverflowError."""
    with FastLoader(pixel_dataset.packed, 5, device="cpu", crop=16) as ld:
        st = _state(ld)
        with pytest.raises(ConfigError, match="invalid consumed"):
            ld.load_state_dict(dict(st, consumed=consumed))


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"sampler": [0, 2**70]}, "sampler yielded index 1180591620717411303424, outside the dataset's 0..23"),
        ({"sampler": [0, 1, 2.5]}, r"sampler yielded 2\.5, not a sample index"),
        ({"sampler": np.array([0.0, 1.0])}, "sampler is an array of float64"),
        ({"batch_sampler": [1, 2, 3], "batch_size": 1}, r"batch_sampler yielded 1 \(int\), not a list of sample indices"),
        ({"batch_sampler": [iter([0, 1])], "batch_size": 1}, r"\(list_iterator\), not a list of sample indices"),
        ({"batch_sampler": [[0], []], "batch_size": 1}, r"batch of 0 indices \(batch 1\)"),
        ({"batch_sampler": [[], []], "batch_size": 1}, r"batch of 0 indices \(batch 0\)"),
    ],
)
def test_samplers_that_yield_no_sample_indices_are_config_errors(pixel_dataset, kw, message):
    """Defects: raw OverflowError/TypeError, 'sampler yielded 0.0', and DALI's 'Invalid batch size: 0'."""
    bs = kw.pop("batch_size", 4)
    with pytest.raises(ConfigError, match=message):
        ld = FastLoader(pixel_dataset.packed, bs, device="cpu", crop=16, **kw)
        next(iter(ld))


@pytest.mark.parametrize(
    ("target_transform", "message"),
    [
        (lambda c: __import__("torch").nn.functional.one_hot(__import__("torch").tensor(c), 3), "one integer label"),
        (lambda c: 2**64, "outside int64 labels"),
        (lambda c: np.array([c, c]), "one integer label"),
        (lambda c: 1.5, "one integer label"),
    ],
    ids=["one-hot", "2**64", "array", "float"],
)
def test_a_target_transform_that_gives_no_integer_label_is_a_config_error(pixel_dataset, target_transform, message):
    """Defect: a one-hot tensor or 2**64 raised raw RuntimeError/OverflowError."""
    with pytest.raises(ConfigError, match=f"target_transform\\(0\\) returned .*{message}"):
        FastLoader(pixel_dataset.packed, 4, device="cpu", crop=16, target_transform=target_transform)


def test_a_target_transform_returning_0d_tensors_still_works(pixel_dataset):
    import torch

    with FastLoader(pixel_dataset.packed, 24, device="cpu", crop=8, shuffle=False, target_transform=lambda c: torch.tensor(c + 10)) as ld:
        _, y = next(iter(ld))
    assert y.tolist() == [c + 10 for c in pixel_dataset.labels]


def test_a_forked_child_finishes_on_the_pil_path_with_the_same_pixels(tmp_path):
    """A thread of the parent inside the compiled finish at the fork holds its executor's lock in the child for good
    (a child's epoch thread hung there under load): after a fork the child never calls the parent's compiled
    function, and its PIL path gives the same batch. Kills: the fork hook dropped (the child gets the compiled one)."""
    out = tmp_path / "child.npy"
    r = _run(f"""
        import os, sys
        import numpy as np, torch
        from fastload import host
        rng = np.random.default_rng(3)
        crops = [rng.integers(0, 256, (int(h), int(w), 3), dtype=np.uint8) for h, w in rng.integers(20, 90, (6, 2))]
        flips = np.array([0, 1, 0, 1, 1, 0], dtype=bool)
        kw = dict(crop=32, mean=(0.5, 0.4, 0.3), std=(0.2, 0.3, 0.25), dtype=torch.float32, channels_last=False, interpolation="bicubic")
        assert host.batch_finish() is not None
        parent = host.finish_crops(crops, flips, **kw).numpy()
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                assert host.batch_finish() is None
                np.save({str(out)!r}, host.finish_crops(crops, flips, **kw).numpy())
                code = 0
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert host.batch_finish() is not None
        assert np.array_equal(np.load({str(out)!r}), parent)
        print("same")
    """)
    assert r.returncode == 0 and r.stdout.strip() == "same", r.stderr[-2000:]
