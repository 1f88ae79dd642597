"""Careless and hostile input, round three (issue 24), the pack side: classes 1-3.

1. ``fastload sample D --overwrite`` deletes only what a sample wrote: a checkpoint saved in
   ``D``, a photo dropped into a class folder, an image renamed, a symlinked class folder, a
   marker copied into someone's photos, or a directory that happens to carry the names of the
   temporary folders are refused or left, never deleted.
2. A thread or process that cannot start anywhere in ``pack`` (the worker pool, its manager
   thread, its queue's feeder thread, the shard threads, a worker's watchdog) is a
   :class:`PackError` naming it with the hint, or is done without a thread; never a hang, never
   a raw ``RuntimeError``; and a ``--resume`` afterwards finishes the very dataset an
   uninterrupted pack writes. Shown by injection (``threading.Thread.start`` failing after N
   starts, every N) and by a real pids cgroup where ``/sys/fs/cgroup/pids`` is writable.
3. Sizes from user input are bounded before anything is allocated: ``bench``'s crop and batch
   size (and its counts); images whose aspect ratio would make an evaluation resize unbounded
   are refused at pack with the bound in the reason (a real 65000x1 JPEG; one at the bound is
   accepted).
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cli import main
from fastload.errors import ConfigError, PackError
from fastload.sample import SAMPLE_MARKER, make_sample

ROOT = Path(__file__).resolve().parents[1]
SMALL = dict(num_images=4, num_classes=2, size=(48, 32), workers=1)


# ============================================================================ 1. no user file deleted


def _tree(d: Path) -> dict[str, bytes]:
    """Every file under ``d`` (relative path -> bytes), symlinks as their target."""
    out = {}
    for p in sorted(d.rglob("*")):
        if p.is_symlink():
            out[str(p.relative_to(d))] = b"-> " + os.readlink(p).encode()
        elif p.is_file():
            out[str(p.relative_to(d))] = p.read_bytes()
    return out


def _relink(path: Path, target: Path) -> None:
    target.write_bytes(b"my photo")
    path.unlink()
    path.symlink_to(target)


def _sample(tmp_path: Path, name: str = "D") -> Path:
    return make_sample(tmp_path / name, **SMALL)


@pytest.mark.parametrize(
    "plant, named",
    [
        (lambda d: (d / "my_results").mkdir() or (d / "my_results" / "ckpt.pt").write_bytes(b"weights"), "my_results/"),
        (lambda d: (d / "notes.txt").write_text("mine"), "notes.txt"),
        (lambda d: (d / "00_astronaut" / "holiday.jpg").write_bytes(b"\xff\xd8\xffmy photo"), "00_astronaut/holiday.jpg"),
        # an image name of the sample's pattern, past the class's count: not one the sample wrote
        (lambda d: (d / "01_cat" / "01_cat_00007.jpg").write_bytes(b"mine"), "01_cat/01_cat_00007.jpg"),
        (lambda d: (d / "01_cat" / "01_cat_00000.jpg.bak").write_bytes(b"mine"), "01_cat/01_cat_00000.jpg.bak"),
        (lambda d: (d / "00_astronaut" / "sub").mkdir(), "00_astronaut/sub/"),
        (lambda d: (d / ".DS_Store").write_bytes(b"x"), ".DS_Store"),
        # an image of the sample replaced by a link to the user's photo
        (lambda d: _relink(d / "00_astronaut" / "00_astronaut_00000.jpg", d.parent / "mine.jpg"), "00_astronaut_00000.jpg (a symlink)"),
    ],
)
def test_sample_overwrite_refuses_a_directory_holding_user_files_and_deletes_nothing(tmp_path, plant, named, capsys):
    d = _sample(tmp_path)
    plant(d)
    before = _tree(d)
    with pytest.raises(ConfigError, match="did not write") as e:
        make_sample(d, **{**SMALL, "num_images": 6}, overwrite=True)
    assert named in str(e.value) and str(d) in str(e.value)
    assert _tree(d) == before  # the old sample and the user's file, all of it
    # the command line says the same in one line and changes nothing
    assert main(["sample", str(d), "--images", "6", "--classes", "2", "--overwrite"]) == 2
    err = capsys.readouterr().err
    assert "did not write" in err and named in err
    assert _tree(d) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary folder left


def test_sample_overwrite_of_a_symlinked_class_folder_or_a_symlink_out_is_refused(tmp_path):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "00_astronaut_00000.jpg").write_bytes(b"my photo, named like the sample's")
    d = _sample(tmp_path)
    for f in (d / "00_astronaut").iterdir():
        f.unlink()
    (d / "00_astronaut").rmdir()
    (d / "00_astronaut").symlink_to(mine, target_is_directory=True)
    with pytest.raises(ConfigError, match=r"did not write \(00_astronaut \(a symlink\)\)"):
        make_sample(d, **SMALL, overwrite=True)
    assert (mine / "00_astronaut_00000.jpg").read_bytes() == b"my photo, named like the sample's"
    # OUT itself a symlink to a sample: refused (the old code renamed the link and emptied its target)
    real = _sample(tmp_path, "real")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    before = _tree(real)
    with pytest.raises(ConfigError, match="is a symlink"):
        make_sample(link, **{**SMALL, "seed": 3}, overwrite=True)
    assert _tree(real) == before and link.is_symlink()
    assert make_sample(link, **SMALL) == link  # reusing through the link is fine


def test_a_sample_marker_copied_into_a_photo_folder_deletes_nothing(tmp_path):
    d = _sample(tmp_path)
    photos = tmp_path / "photos"
    (photos / "holiday").mkdir(parents=True)
    (photos / "holiday" / "beach.jpg").write_bytes(b"beach")
    (photos / SAMPLE_MARKER).write_bytes((d / SAMPLE_MARKER).read_bytes())
    before = _tree(photos)
    with pytest.raises(ConfigError, match=r"did not write \(holiday/\)"):
        make_sample(photos, **SMALL, overwrite=True)
    assert _tree(photos) == before
    # a marker that does not say what was written (no classes): refused too
    m = json.loads((d / SAMPLE_MARKER).read_text())
    del m["classes"]
    (photos / SAMPLE_MARKER).write_text(json.dumps(m))
    with pytest.raises(ConfigError, match="does not say what the sample wrote"):
        make_sample(photos, **SMALL, overwrite=True)
    assert (photos / "holiday" / "beach.jpg").read_bytes() == b"beach"


def test_sample_overwrite_replaces_a_clean_sample_and_keeps_folders_named_like_its_temporaries(tmp_path):
    pid = os.getpid()
    # folders of the user that the old code used as its temporary names: rmtree'd, or renamed over
    for name in (f".D.tmp-{pid}", f".D.old-{pid}"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "keep.txt").write_text(name)
    d = _sample(tmp_path)
    old = _tree(d)
    make_sample(d, **{**SMALL, "num_images": 6}, overwrite=True)
    assert len([p for p in d.rglob("*.jpg")]) == 6 and _tree(d) != old
    for name in (f".D.tmp-{pid}", f".D.old-{pid}"):
        assert (tmp_path / name / "keep.txt").read_text() == name
    hidden = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("."))
    assert hidden == sorted([f".D.tmp-{pid}", f".D.old-{pid}"])  # nothing of make_sample's left
    # an empty directory is filled
    (tmp_path / "empty").mkdir()
    make_sample(tmp_path / "empty", **SMALL, overwrite=True)
    assert len(list((tmp_path / "empty").rglob("*.jpg"))) == 4


def test_files_added_while_the_new_sample_is_made_are_kept(tmp_path, monkeypatch, caplog):
    import fastload.sample as sample_mod

    d = _sample(tmp_path)
    real_write = sample_mod._write_chunk

    def write_and_save_a_checkpoint(*args, **kw):  # the user saves into D while the new sample is made
        (d / "ckpt.pt").write_bytes(b"weights")
        return real_write(*args, **kw)

    monkeypatch.setattr(sample_mod, "_write_chunk", write_and_save_a_checkpoint)
    with pytest.raises(ConfigError, match=r"did not write \(ckpt.pt\)"):
        make_sample(d, **{**SMALL, "seed": 1}, overwrite=True)
    assert (d / "ckpt.pt").read_bytes() == b"weights"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]
    (d / "ckpt.pt").unlink()
    monkeypatch.setattr(sample_mod, "_write_chunk", real_write)

    # ... and one saved after the last check, into the old sample as it is moved aside: kept there
    real_remove = sample_mod._remove_sample_files

    def remove_after_a_late_save(directory, layout):
        if directory.name.startswith(".D.old-"):
            (directory / "00_astronaut" / "late.jpg").write_bytes(b"late")
        return real_remove(directory, layout)

    monkeypatch.setattr(sample_mod, "_remove_sample_files", remove_after_a_late_save)
    with caplog.at_level(logging.WARNING, logger="fastload.sample"):
        make_sample(d, **{**SMALL, "seed": 2}, overwrite=True)
    aside = [p for p in tmp_path.iterdir() if p.name.startswith(".D.old-")]
    assert len(aside) == 1 and _tree(aside[0]) == {"00_astronaut/late.jpg": b"late"}
    assert "late.jpg" in caplog.text and "left in place" in caplog.text


# ============================================================================ 2. threads that cannot start

PACK_KW = dict(workers=2, progress=False, shard_size="24KiB")


def _hashes(root: Path) -> dict[str, str]:
    import hashlib

    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(root.iterdir()) if p.name != "manifest.json"}


def _manifest(root: Path) -> dict:
    m = json.loads((root / "manifest.json").read_text())
    m.pop("created")
    return m


def _assert_identical(out: Path, ref: Path) -> None:
    assert _hashes(out) == _hashes(ref)
    assert _manifest(out) == _manifest(ref)


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> tuple[Path, Path]:
    """24 plain JPEGs (packed in this process, no pool), then 24 PNGs (the pool's work): shards of
    the JPEGs are finished before the pool starts. Returns (src, a reference pack of it)."""
    base = tmp_path_factory.mktemp("mixed")
    rng = np.random.default_rng(0)
    for i in range(24):
        a = rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)
        for cls, ext in (("a", "jpg"), ("b", "png")):
            (base / "src" / cls).mkdir(parents=True, exist_ok=True)
            Image.fromarray(a).save(base / "src" / cls / f"{i:02d}.{ext}", **({"quality": 90} if ext == "jpg" else {}))
    fastload.pack(base / "src", base / "ref", **PACK_KW)
    return base / "src", base / "ref"


def _kind(t: threading.Thread) -> str:
    """Which of pack's threads ``t`` is."""
    if type(t).__name__ == "_ExecutorManagerThread":
        return "manager"
    target = getattr(t, "_target", None)
    name = getattr(target, "__name__", "")
    if name == "_feed":
        return "feeder"
    if name == "watch":
        return "watchdog"  # a worker process's: the patch is inherited through fork
    return t.name.split("-")[1] if t.name.startswith("fastload-") else "other"


def _fail_starts(monkeypatch, should_fail) -> list[str]:
    """Make ``threading.Thread.start`` raise what CPython raises at a thread limit whenever
    ``should_fail(kind, n)`` (n: starts so far); returns the kinds started or refused."""
    real = threading.Thread.start
    seen: list[str] = []

    def start(self):
        kind = _kind(self)
        seen.append(kind)
        if should_fail(kind, len(seen)):
            raise RuntimeError("can't start new thread")
        return real(self)

    monkeypatch.setattr(threading.Thread, "start", start)
    return seen


def _pack_or_error(src: Path, out: Path) -> PackError | None:
    try:
        fastload.pack(src, out, **PACK_KW)
    except PackError as e:
        return e
    return None


def _check_stopped(e: PackError, out: Path) -> None:
    msg = str(e)
    assert "cannot start" in msg and "--workers 1" in msg and "--resume" in msg and "pids" in msg, msg
    assert not out.exists() and Path(f"{out}.partial").is_dir()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kind", ["manager", "feeder", "shard", "fsync", "watchdog"])
def test_a_thread_of_pack_that_cannot_start_is_a_pack_error_or_its_work_done_inline(mixed, tmp_path, monkeypatch, capfd, kind):
    src, ref = mixed
    out = tmp_path / "out"
    seen = _fail_starts(monkeypatch, lambda k, n: k == kind)
    e = _pack_or_error(src, out)
    if kind in ("manager", "feeder"):  # the pool cannot run: a PackError naming it (the old code hung on "feeder")
        assert e is not None, f"no error with {kind} refused"
        _check_stopped(e, out)
        assert ("feeder thread" in str(e)) == (kind == "feeder"), str(e)
        journal = json.loads((Path(f"{out}.partial") / "journal.json").read_text())
        assert len(journal["shards"]) >= 2  # the JPEGs' shards were finished before the pool started: kept
        monkeypatch.undo()
        fastload.pack(src, out, resume=True, **PACK_KW)  # continues: the very dataset of an uninterrupted pack
    else:  # a helper thread's work is done without it
        assert e is None, f"{kind}: {e}"
        if kind != "watchdog":
            assert kind in seen
    _assert_identical(out, ref)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "can't start new thread" not in err, err  # no thread traceback on stderr


def _starts_of_a_pack(src: Path, tmp_path: Path, monkeypatch) -> int:
    seen = _fail_starts(monkeypatch, lambda k, n: False)
    fastload.pack(src, tmp_path / "count", **PACK_KW)
    monkeypatch.undo()
    return len(seen)


@pytest.mark.slow  # 31 s: every start of the sequence refused in turn
@pytest.mark.timeout(600)
def test_every_thread_start_failing_from_the_nth_on_stops_cleanly_and_resumes_identically(mixed, tmp_path, monkeypatch):
    """A limit reached at any point of a pack: from the N-th start on, every thread start fails,
    for every N up to all the starts a pack makes (and in forked workers, which inherit it)."""
    src, ref = mixed
    total = _starts_of_a_pack(src, tmp_path, monkeypatch)
    assert total >= 6
    outcomes = []
    for n in range(total + 1):
        out = tmp_path / f"out{n}"
        _fail_starts(monkeypatch, lambda k, seen, n=n: seen > n)
        e = _pack_or_error(src, out)
        monkeypatch.undo()
        if e is not None:
            _check_stopped(e, out)
            fastload.pack(src, out, resume=True, **PACK_KW)
        outcomes.append(e is not None)
        _assert_identical(out, ref)
    assert any(outcomes) and not outcomes[-1]  # some limits stop the pool; all starts allowed: it packs


# -- a real limit: a pids cgroup of a few tasks

_CGROUP_V1 = Path("/sys/fs/cgroup/pids")


def _cgroup_base() -> Path | None:
    """A pids cgroup directory this process may create children in (v1's pids hierarchy, or v2)."""
    for base in (_CGROUP_V1, Path("/sys/fs/cgroup")):
        if not os.access(base, os.W_OK):
            continue
        if base == _CGROUP_V1 or "pids" in (base / "cgroup.subtree_control").read_text(errors="replace").split():
            try:
                probe = base / f"fastload-probe-{os.getpid()}"
                probe.mkdir()
                ok = (probe / "pids.max").exists()
                probe.rmdir()
            except OSError:
                continue
            if ok:
                return base
    return None


_LIMITED = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    cg, extra = Path(sys.argv[1]), int(sys.argv[2])
    from fastload.cli import main
    (cg / "cgroup.procs").write_text(str(os.getpid()))  # this process, with its threads so far
    (cg / "pids.max").write_text(str(int((cg / "pids.current").read_text()) + extra))  # and `extra` more tasks
    sys.exit(main(sys.argv[3:]))
    """
)


@pytest.mark.timeout(600)
def test_pack_under_a_real_pids_cgroup_ends_with_one_line_and_resumes(mixed, tmp_path):
    base = _cgroup_base()
    if base is None:
        pytest.skip("no writable pids cgroup here (needs root and /sys/fs/cgroup/pids or a v2 pids controller)")
    src, ref = mixed
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    stopped = 0
    for extra in (0, 1, 2, 3, 5, 8, 64):
        cg = base / f"fastload-test-{os.getpid()}-{extra}"
        cg.mkdir()
        out = tmp_path / f"out{extra}"
        try:
            cmd = [sys.executable, "-c", _LIMITED, str(cg), str(extra), "pack", str(src), str(out),
                   "--workers", "2", "--shard-size", "24KiB", "--no-progress"]  # fmt: skip
            r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120)  # a hang fails here
        finally:
            cg.rmdir()  # the process has exited: the group is empty
        if r.returncode != 0:
            stopped += 1
            assert r.returncode == 2, (extra, r.returncode, r.stderr[-2000:])
            lines = r.stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("fastload: error: pack: cannot start"), (extra, r.stderr[-2000:])
            assert "--workers 1" in lines[0] and "--resume" in lines[0]
            assert main(["pack", str(src), str(out), "--resume", "--workers", "2", "--shard-size", "24KiB", "--no-progress"]) == 0
        else:
            assert "packed 48 images" in r.stdout, (extra, r.stdout, r.stderr[-2000:])
        _assert_identical(out, ref)
    assert stopped >= 1


# ============================================================================ 3. sizes bounded before anything is allocated

from fastload.bench import config as bench_config  # noqa: E402
from fastload.bench.config import MAX_BATCH, MAX_CROP, BenchConfig  # noqa: E402
from fastload.packing.images import EVAL_SHORT_SIDE, MAX_ASPECT_RATIO, RESIZE_MAX_PIXELS  # noqa: E402


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"crop": 100_000}, r"crop must be an int in \[8, 8192\] \(pixels; the loader's largest crop, MAX_CROP\), got 100000"),
        ({"crop": MAX_CROP + 1}, r"crop must be an int in \[8, 8192\].*got 8193"),
        ({"batch_size": 10**11}, r"batch_size must be an int in \[1, 65536\] \(samples per batch, MAX_BATCH\), got 100000000000"),
        ({"batch_size": MAX_BATCH + 1, "crop": 8}, r"batch_size must be an int in \[1, 65536\].*got 65537"),
        ({"batches": 10**11}, r"batches must be an int in \[1, 10000000\]"),
        ({"train_steps": 10**8}, r"train_steps must be an int in \[0, 10000000\]"),
        ({"epochs": 10**5}, r"epochs must be an int in \[1, 10000\]"),
        ({"warmup": 10**7}, r"warmup must be an int in \[0, 1000000\]"),
        ({"repeats": 10**4}, r"repeats must be an int in \[1, 1000\]"),
        ({"workers": [10**6]}, r"workers must be .* ints in \[0, 1024\]"),
        ({"workers": list(range(65))}, r"workers must be a non-empty list of at most 64 ints"),
        ({"train_threads": 10**9}, r"train_threads must be an int in \[1, 1024\]"),
        ({"sample_interval": float("inf")}, r"sample_interval must be seconds in \[0.01, 60.0\], got inf"),
        ({"sample_interval": float("nan")}, r"sample_interval must be seconds in \[0.01, 60.0\], got nan"),
        ({"sample_interval": 1e-9}, r"sample_interval must be seconds in \[0.01, 60.0\]"),
    ],
)
def test_bench_sizes_past_their_bound_are_refused_naming_it(kw, match):
    with pytest.raises(ConfigError, match=match):
        BenchConfig(**kw).validate()


def test_bench_sizes_at_their_bound_are_accepted_and_one_batch_must_fit_in_memory(monkeypatch):
    BenchConfig(crop=MAX_CROP, batch_size=1).validate()  # 805 MB: within a quarter of any machine running this
    BenchConfig(crop=8, batch_size=MAX_BATCH).validate()  # 50 MB
    BenchConfig(batches=10**7, train_steps=10**7, epochs=10**4, warmup=10**6, repeats=1000, workers=[0, 1024]).validate()
    monkeypatch.setattr(bench_config, "memory_bytes", lambda: 1 << 30)  # a 1 GiB machine
    BenchConfig(batch_size=445, crop=224).validate()  # 268 MB, within 25 %
    with pytest.raises(ConfigError, match=r"batch_size 446 x crop 224x224: one float32 batch is 0.3 GB, more than 25% of "
                       r"this machine's memory \(1.1 GB; BATCH_MEMORY_SHARE\); lower batch_size \(--batch-size\) or crop"):
        BenchConfig(batch_size=446, crop=224).validate()


@pytest.mark.parametrize("flag, value, match", [
    ("--crop", "100000", "crop must be an int in [8, 8192]"),
    ("--batch-size", str(10**11), "batch_size must be an int in [1, 65536]"),
])  # fmt: skip
def test_bench_cli_checks_crop_and_batch_size_before_it_opens_or_allocates_anything(tmp_path, capsys, flag, value, match):
    # the dataset does not even exist: the size is checked first (the old code opened it, then
    # packed the folder and asked torch for a 1.9 TB batch of random data)
    code = main(["bench", str(tmp_path / "nothing-here"), flag, value, "--device", "cpu", "--quick", "--out", str(tmp_path / "r")])
    err = capsys.readouterr().err
    assert code == 2 and match in err and value in err, err
    assert not (tmp_path / "r").exists()


def _strip(path: Path, w: int, h: int) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", (w, h), (9, 99, 199)).save(path, **({"quality": 90} if path.suffix == ".jpg" else {}))
    return path


@pytest.mark.parametrize("workers", [1, 2])
def test_a_strip_whose_evaluation_resize_is_unbounded_is_refused_at_pack_and_one_at_the_bound_packs(tmp_path, workers):
    assert MAX_ASPECT_RATIO == 1365 and EVAL_SHORT_SIDE == 256
    a = tmp_path / "src" / "a"
    refused = {
        "65000x1.jpg": (65000, 1),  # a real 65000x1 JPEG: the old pack stored it byte for byte
        "1366x1.jpg": (1366, 1),
        "1x1366.jpg": (1, 1366),
        "2731x2.png": (2731, 2),
        "65000x1.png": (65000, 1),
    }
    accepted = {"1365x1.jpg": (1365, 1), "1x1365.jpg": (1, 1365), "2730x2.png": (2730, 2), "64x48.jpg": (64, 48)}
    for name, (w, h) in {**refused, **accepted}.items():
        _strip(a / name, w, h)
    res = fastload.pack(tmp_path / "src", tmp_path / "out", workers=workers, progress=False)
    reasons = {Path(s["path"]).name: s["reason"] for s in res.skipped}
    assert set(reasons) == set(refused)
    for name, (w, h) in refused.items():
        r = reasons[name]
        assert r.startswith(f"{w}x{h} pixels: aspect ratio above 1365:1 (MAX_ASPECT_RATIO)"), r
        assert f"more than {RESIZE_MAX_PIXELS}" in r
    assert "would make it 16640000x256 = 4259840000 pixels" in reasons["65000x1.jpg"]
    ds = fastload.Dataset(tmp_path / "out")
    assert sorted(Path(ds.source_path(i)).name for i in range(len(ds))) == sorted(accepted)
    for i in range(len(ds)):
        name = Path(ds.source_path(i)).name
        assert (ds.header(i).width, ds.header(i).height) == accepted[name]
    # the same bound for a dataset's arrays, and after --max-size: the stored size counts
    arrays = [(np.zeros((1, 1366), np.uint8), 0), (np.zeros((1, 1365), np.uint8), 0)]
    res = fastload.pack_dataset(arrays, tmp_path / "arrays", workers=workers, progress=False)
    assert [s["path"] for s in res.skipped] == ["dataset[0]"] and "aspect ratio above 1365:1" in res.skipped[0]["reason"]
    res = fastload.pack(tmp_path / "src", tmp_path / "shrunk", workers=workers, progress=False, max_size=1000)
    shrunk = {Path(s["path"]).name: s["reason"] for s in res.skipped}
    assert "65000x1.jpg" not in shrunk and "1366x1.jpg" not in shrunk  # stored 1000x1: within the bound
    assert "65000x1.png" not in shrunk
