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
