"""Interrupted packs: ``kill -9`` at any moment, a full disk, a full LMDB map.

Whatever stops ``fastload pack`` part-way, OUT never opens as a complete dataset
(it does not exist, so ``Dataset(OUT)`` raises ``FormatError``), the process leaves
no worker behind, and ``--resume`` then produces a dataset byte-identical to an
uninterrupted pack (every file's SHA-256; the manifest up to its ``created`` time).

* Random moments: a real ``python -m fastload pack`` subprocess of a few hundred
  small images with a tiny ``--shard-size`` (hundreds of shards) is SIGKILLed at
  times drawn (seeded) from the measured duration of a full pack.
* The narrow windows, deterministically: the child kills itself between creating
  ``OUT.partial`` and writing its journal, between renaming a shard and recording
  it, after ``labels.bin``, after ``manifest.json``, and after the final rename.
* A real full disk (a 2 MiB tmpfs, mounted when running as root; skipped otherwise)
  and simulated ``ENOSPC`` at each write stage; an LMDB map that cannot grow.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

import fastload
from fastload import FormatError, PackError
from fastload.packing import journal, outdir, shards
from fastload.cli import main
from fastload.format import LABELS_NAME, MANIFEST_NAME

from conftest import encode_color, write_image

SHARD_SIZE = "16KiB"  # one small image per shard: about 300 shards, and as many journal updates
PACK_ARGS = ["--shard-size", SHARD_SIZE, "--workers", "2", "--no-progress"]
JOURNAL = "journal.json"


def file_hashes(root: Path, *, skip: tuple[str, ...] = ()) -> dict[str, str]:
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.iterdir())
        if p.name != MANIFEST_NAME and p.name not in skip
    }


def manifest_sans_time(root: Path) -> dict:
    m = json.loads((root / MANIFEST_NAME).read_text())
    m.pop("created")
    return m


def assert_identical(out: Path, ref: Path, *, skip: tuple[str, ...] = ()) -> None:
    assert file_hashes(out, skip=skip) == file_hashes(ref)
    assert manifest_sans_time(out) == manifest_sans_time(ref)


def assert_not_a_dataset(out: Path) -> None:
    """OUT never opens as a complete dataset after an interrupted pack."""
    assert not out.exists()
    with pytest.raises(FormatError, match="no such dataset directory"):
        fastload.Dataset(out)


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> tuple[Path, Path, float]:
    """(SRC, reference OUT, seconds a full ``python -m fastload pack`` takes)."""
    base = tmp_path_factory.mktemp("interrupt")
    src = base / "src"
    index = 0
    for label in range(4):
        for j in range(75):
            ext = ".png" if j % 10 == 0 else ".jpg"  # PNGs go through the worker processes
            kw = {"quality": 90} if ext == ".jpg" else {}
            write_image(src / f"c{label}" / f"{j:03d}{ext}", encode_color(label, index % 256), size=(64, 48), **kw)
            index += 1
    (src / "c2" / "011.jpg").write_bytes(b"")  # one refused image, listed in "skipped"
    ref = base / "ref"
    t0 = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "fastload", "pack", str(src), str(ref), *PACK_ARGS], capture_output=True, text=True, timeout=120)
    duration = time.monotonic() - t0
    assert r.returncode == 0, r.stderr
    m = json.loads((ref / MANIFEST_NAME).read_text())
    assert m["num_samples"] == 299 and len(m["shards"]) > 100 and len(m["skipped"]) == 1
    return src, ref, duration


def _resume(src: Path, out: Path) -> None:
    assert main(["pack", str(src), str(out), "--resume", *PACK_ARGS]) == 0
    assert not out.with_name(out.name + ".partial").exists()


def _kill_at(src: Path, out: Path, delay: float) -> tuple[int, list[psutil.Process]]:
    """Start a pack, SIGKILL it after ``delay`` seconds; (return code, its worker processes)."""
    proc = subprocess.Popen([sys.executable, "-m", "fastload", "pack", str(src), str(out), *PACK_ARGS],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    time.sleep(delay)
    try:
        workers = psutil.Process(proc.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        workers = []
    proc.send_signal(signal.SIGKILL)
    return proc.wait(timeout=60), workers


def _random_kills(source, tmp_path, seeds) -> list[str]:
    src, ref, duration = source
    seen, workers = [], []
    for seed in seeds:
        delay = random.Random(seed).uniform(0.0, duration)
        out = tmp_path / f"out{seed}"
        code, procs = _kill_at(src, out, delay)
        workers += procs
        if out.exists():  # the kill came after the final rename: the pack had finished
            assert (out / MANIFEST_NAME).exists()
            assert_identical(out, ref, skip=(JOURNAL,))
            seen.append("finished")
            continue
        assert_not_a_dataset(out)
        partial = out.with_name(out.name + ".partial")
        seen.append("partial" if partial.exists() else "nothing")
        _resume(src, out)
        assert_identical(out, ref)
        assert fastload.verify(out).ok
    # the workers notice that their parent is gone and exit (within about a second): no orphans
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive, f"orphaned pack workers: {alive}"
    return seen


@pytest.mark.slow  # long; the file's other kills stay fast
def test_kill_at_random_moments_then_resume(source, tmp_path):
    seen = _random_kills(source, tmp_path, seeds=[11, 12, 13])
    assert "partial" in seen, seen  # at least one kill landed mid-pack


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_kill_at_many_random_moments_then_resume(source, tmp_path):
    seen = _random_kills(source, tmp_path, seeds=range(100, 140))
    assert seen.count("partial") >= 20, seen


# ----------------------------------------------------------------------------- the narrow windows

_WINDOWS = r"""
import os, signal, sys
from pathlib import Path
from fastload.packing import journal as j, outdir as o
from fastload.cli import main

mode, out, argv = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
die = lambda: os.kill(os.getpid(), signal.SIGKILL)
real_save, real_write, real_fsync_dir = j.Journal.save, o.atomic_write, o.fsync_dir
calls = []

def save(self, directory, **kw):
    calls.append(1)
    if mode == "before-journal" or (mode == "shard-not-journaled" and len(calls) == 3):
        die()  # 1st save: the new OUT.partial; 2nd: shard 0 recorded; 3rd: shard 1 recorded
    return real_save(self, directory, **kw)

def atomic_write(path, data):
    if mode == "after-labels" and path.name == "manifest.json":
        die()
    real_write(path, data)
    if mode == "after-manifest" and path.name == "manifest.json":
        die()

def fsync_dir(path):
    real_fsync_dir(path)
    if mode == "after-rename" and Path(path) == out.parent and out.exists():
        die()

j.Journal.save, o.atomic_write, o.fsync_dir = save, atomic_write, fsync_dir
sys.exit(main(argv))
"""


@pytest.mark.parametrize("mode", ["before-journal", "shard-not-journaled", "after-labels", "after-manifest", "after-rename"])
def test_kill_in_each_narrow_window_then_resume(source, tmp_path, mode):
    src, ref, _ = source
    out = tmp_path / "out"
    partial = tmp_path / "out.partial"
    argv = ["pack", str(src), str(out), *PACK_ARGS]
    r = subprocess.run([sys.executable, "-c", _WINDOWS, mode, str(out), *argv], capture_output=True, text=True, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr[-2000:]
    if mode == "after-rename":
        # the dataset was complete and in place; only the journal inside it was left to delete
        assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
        assert_identical(out, ref, skip=(JOURNAL,))
        assert len(fastload.Dataset(out)) == 299 and fastload.verify(out).ok
        return
    assert_not_a_dataset(out)
    names = {p.name for p in partial.iterdir()}
    expected = {
        "before-journal": lambda: JOURNAL not in names,
        "shard-not-journaled": lambda: {"shard-00001.lmdb", JOURNAL} <= names
        and [s["file"] for s in json.loads((partial / JOURNAL).read_text())["shards"]] == ["shard-00000.lmdb"],
        "after-labels": lambda: LABELS_NAME in names and MANIFEST_NAME not in names,
        "after-manifest": lambda: MANIFEST_NAME in names and JOURNAL in names,
    }[mode]
    assert expected(), sorted(names)[:10]
    _resume(src, out)
    assert_identical(out, ref)


# ----------------------------------------------------------------------------- full disk, full map


def _mount_tmpfs(path: Path, size: str) -> bool:
    path.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        return False
    return subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], capture_output=True).returncode == 0


def test_real_full_disk_is_a_pack_error_and_resumes(source, tmp_path, capsys):
    src, ref, _ = source
    disk = tmp_path / "disk"
    if not _mount_tmpfs(disk, "2M"):
        pytest.skip("cannot mount a small tmpfs here (needs root and mount); ENOSPC is simulated below")
    try:
        out = disk / "out"
        code = main(["pack", str(src), str(out), *PACK_ARGS])
        err = capsys.readouterr().err
        assert code == 2 and len(err.splitlines()) == 1, err
        assert err.startswith(f"fastload: error: {disk}/out.partial/shard-") and "No space left on device" in err, err
        assert "the disk is full: free space, then continue with --resume" in err
        assert_not_a_dataset(out)
        assert not (disk / "out.partial" / MANIFEST_NAME).exists()
        # free space (grow the tmpfs), then continue
        assert subprocess.run(["mount", "-o", "remount,size=16M", str(disk)]).returncode == 0
        _resume(src, out)
        assert_identical(out, ref)
    finally:
        subprocess.run(["umount", "-l", str(disk)], capture_output=True)


def _enospc(*_a, **_k):
    raise OSError(errno.ENOSPC, "No space left on device")


def _fail_after(n: int, real):
    calls = []

    def save(self, directory, **kw):
        calls.append(1)
        if len(calls) > n:
            _enospc()
        return real(self, directory, **kw)

    return save


def _fail_on(name: str, real):
    def atomic_write(path, data):
        if path.name == name:
            _enospc()
        return real(path, data)

    return atomic_write


_STAGES = [
    ("shard write", lambda mp: mp.setattr(shards.ShardWriter, "_write_batch", _enospc), r"out\.partial/shard-00000\.lmdb\.tmp: cannot write shard: .*No space left on device; the disk is full"),
    # shards are synced in background threads, concurrently: the first to fail is named
    ("shard fsync", lambda mp: mp.setattr(shards, "fsync_file", _enospc), r"out\.partial/shard-0000\d\.lmdb\.tmp: cannot write shard: No space left on device; the disk is full"),
    ("journal", lambda mp: mp.setattr(journal.Journal, "save", lambda self, d, **k: _enospc()), r"out\.partial: cannot create the output directory: No space left on device"),
    ("journal update", lambda mp: mp.setattr(journal.Journal, "save", _fail_after(1, journal.Journal.save)), r"out\.partial/journal\.json: cannot record shard-00000\.lmdb: No space left on device; the disk is full"),
    ("labels.bin", lambda mp: mp.setattr(outdir, "atomic_write", _fail_on(LABELS_NAME, outdir.atomic_write)), r"out\.partial: cannot finish the pack: No space left on device; fix that, then continue with --resume"),
    ("manifest.json", lambda mp: mp.setattr(outdir, "atomic_write", _fail_on(MANIFEST_NAME, outdir.atomic_write)), r"out\.partial: cannot finish the pack: No space left on device; fix that, then continue with --resume"),
]  # fmt: skip


@pytest.mark.parametrize("stage, patch, message", [pytest.param(*s, id=s[0]) for s in _STAGES])
def test_enospc_at_each_stage_is_a_clear_pack_error(source, tmp_path, monkeypatch, capsys, stage, patch, message):
    src, ref, _ = source
    out = tmp_path / "out"
    patch(monkeypatch)
    code = main(["pack", str(src), str(out), *PACK_ARGS])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert code == 2 and len(err.splitlines()) == 1 and "Traceback" not in err, err
    assert re.search(message, err), err
    assert_not_a_dataset(out)  # nothing half-written looks valid
    partial = tmp_path / "out.partial"
    if stage != "manifest.json":
        assert not (partial / MANIFEST_NAME).exists()
    if partial.exists():
        _resume(src, out)
    else:
        assert main(["pack", str(src), str(out), *PACK_ARGS]) == 0
    assert_identical(out, ref)


def test_full_lmdb_map_is_a_pack_error_not_a_hang(source, tmp_path, monkeypatch, capsys):
    import lmdb

    src, ref, _ = source

    def full(self, env, records):
        raise lmdb.MapFullError("mdb_put: MDB_MAP_FULL: Environment mapsize limit reached")

    monkeypatch.setattr(shards.ShardWriter, "_write_batch", full)
    t0 = time.monotonic()
    code = main(["pack", str(src), str(tmp_path / "out"), *PACK_ARGS])
    monkeypatch.undo()
    err = capsys.readouterr().err
    assert time.monotonic() - t0 < 30
    assert code == 2 and err.strip() == (
        f"fastload: error: {tmp_path}/out.partial/shard-00000.lmdb.tmp: cannot write shard: "
        "mdb_put: MDB_MAP_FULL: Environment mapsize limit reached; the shard's LMDB memory map could not grow to hold it"
    )
    assert_not_a_dataset(tmp_path / "out")
    _resume(src, tmp_path / "out")
    assert_identical(tmp_path / "out", ref)


def test_map_that_cannot_grow_is_a_pack_error(source, tmp_path, monkeypatch):
    """Growing the map can itself fail (no address space): still a PackError, not lmdb.Error."""
    import lmdb

    src, _, _ = source
    real = shards.ShardWriter._write_batch
    state = {"n": 0}

    def full_once(self, env, records):
        state["n"] += 1
        if state["n"] == 1:
            raise lmdb.MapFullError("mdb_put: MDB_MAP_FULL: Environment mapsize limit reached")
        return real(self, env, records)

    def no_memory(self, size):
        raise lmdb.MemoryError("mdb_env_set_mapsize: Cannot allocate memory")

    class NoGrow:  # lmdb.Environment is immutable: wrap the writer's handle instead
        def __init__(self, env):
            self._env = env

        def __getattr__(self, name):
            return getattr(self._env, name)

        set_mapsize = no_memory

    real_open = shards.ShardWriter._open

    def open_(self):
        real_open(self)
        self._env = NoGrow(self._env)

    monkeypatch.setattr(shards.ShardWriter, "_write_batch", full_once)
    monkeypatch.setattr(shards.ShardWriter, "_open", open_)
    with pytest.raises(PackError, match=r"shard-00000\.lmdb\.tmp: cannot write shard: mdb_env_set_mapsize: Cannot allocate memory"):
        fastload.pack(src, tmp_path / "out", shard_size=SHARD_SIZE, workers=1, progress=False)
