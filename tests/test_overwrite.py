"""``--overwrite`` never loses a user's file; one writer per OUT; arguments that cannot work.

* ``--overwrite`` replaces only an empty directory, a fastload dataset or a fastload
  unfinished pack holding nothing but fastload's own files, never one that is, holds or
  is inside SRC (through symlinks; for a list file, never one holding the list or a
  listed image), and deletes only fastload's own files, on success and on every
  failure path; everything else is refused in one line that says what was found.
* Two packs of one OUT at once: the second is refused, naming the first's PID; a
  ``kill -9`` leaves nothing that blocks ``--resume`` (real processes).
* Options: any integer type, bools and floats refused, bounds with the option's name.
* The write path: OUT's parent a file or a FIFO, OUT a FIFO or a device, control
  characters, PermissionError and friends in prepare and finalize: one line each.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

import fastload
from conftest import encode_color, write_image
from fastload.cli import main
from fastload.errors import BadImageError, ConfigError, PackError
from fastload.format import MANIFEST_NAME, shard_name
from fastload.packing import journal, outdir, run, workers

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional for packing
    torch = None


def pack(src, out, **kw):
    kw.setdefault("progress", False)
    kw.setdefault("workers", 1)
    return fastload.pack(src, out, **kw)


def tree(root: Path) -> dict[str, tuple]:
    """Everything under ``root`` (symlinks not followed): relative path -> (kind, content)."""
    out: dict[str, tuple] = {}
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(top) / name
            rel = str(p.relative_to(root))
            if p.is_symlink():
                out[rel] = ("link", os.readlink(p))
            elif p.is_dir():
                out[rel] = ("dir",)
            elif p.is_fifo():
                out[rel] = ("fifo",)
            else:
                out[rel] = ("file", hashlib.sha256(p.read_bytes()).hexdigest())
    return out


def file_hashes(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir()) if p.name != MANIFEST_NAME}


def manifest_sans_time(d: Path) -> dict:
    m = json.loads((d / MANIFEST_NAME).read_text())
    m.pop("created")
    return m


def one_line(capsys) -> str:
    out, err = capsys.readouterr()
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert len(lines) == 1 and "Traceback" not in err and out == "", err
    return lines[0]


@pytest.fixture
def src(tmp_path) -> Path:
    root = tmp_path / "D" / "imgs"
    for label in range(2):
        for j in range(3):
            write_image(root / f"c{label}" / f"{j}.jpg", encode_color(label, 3 * label + j), quality=90)
    return root


@pytest.fixture
def dataset(src, tmp_path) -> Path:
    """A real fastload dataset (three shards) outside SRC."""
    out = tmp_path / "ds"
    pack(src, out, shard_size="1000")
    assert len(json.loads((out / MANIFEST_NAME).read_text())["shards"]) == 6
    return out


# ============================================================================ SRC and OUT


def test_src_inside_out_is_refused_and_every_image_survives(src, tmp_path, capsys):
    d = src.parent
    before = tree(d)
    assert main(["pack", str(src), str(d), "--overwrite", "--no-progress"]) == 2
    line = one_line(capsys)
    assert line == (
        f"fastload: error: OUT {d} contains SRC {src}; fastload never replaces a directory holding its source: "
        "write the packed dataset elsewhere"
    )
    assert tree(d) == before and not (tmp_path / "D.partial").exists()
    assert main(["pack", str(src), str(src), "--overwrite", "--no-progress"]) == 2
    assert f"OUT {src} is SRC {src}" in one_line(capsys)
    assert tree(d) == before


def test_symlinks_are_resolved_before_anything_is_replaced(src, dataset, tmp_path, capsys):
    before = tree(tmp_path / "D")
    to_parent = tmp_path / "link_to_parent"
    to_parent.symlink_to(src.parent)
    assert main(["pack", str(src), str(to_parent), "--overwrite", "--no-progress"]) == 2
    assert f"OUT {to_parent} (a symlink to {src.parent}) contains SRC {src}" in one_line(capsys)
    into_src = tmp_path / "link_into_src"
    into_src.symlink_to(src / "c0")
    assert main(["pack", str(src), str(into_src / "out"), "--overwrite", "--no-progress"]) == 2
    assert "is inside SRC" in one_line(capsys)
    # a symlink to a real dataset: the link is not fastload's to replace, the dataset stays
    to_ds = tmp_path / "link_to_ds"
    to_ds.symlink_to(dataset)
    ds_before = tree(dataset)
    assert main(["pack", str(src), str(to_ds), "--overwrite", "--no-progress"]) == 2
    assert one_line(capsys).endswith(
        f"OUT {to_ds} is not a fastload dataset; refusing to replace it even with --overwrite: it is a symlink "
        f"(to {dataset}); pass the directory it points to, or remove the link yourself"
    )
    assert tree(dataset) == ds_before and tree(tmp_path / "D") == before and to_ds.is_symlink()


def test_src_named_like_out_partial_is_never_cleared(tmp_path, capsys):
    src = tmp_path / "x.partial"
    write_image(src / "a" / "0.jpg", encode_color(0, 0), quality=90)
    before = tree(src)
    for flag in ("--overwrite", "--resume"):
        assert main(["pack", str(src), str(tmp_path / "x"), flag, "--no-progress"]) == 2
        assert f"OUT {tmp_path / 'x'}: the unfinished pack {src} is SRC {src}" in one_line(capsys)
        assert tree(src) == before


def test_list_file_source_guards_the_list_and_its_images(tmp_path, dataset, capsys):
    # a list file inside OUT
    lst = dataset / "train.csv"
    write_image(tmp_path / "imgs" / "a.jpg", encode_color(0, 0), quality=90)
    lst.write_text(f"path,label\n{tmp_path / 'imgs' / 'a.jpg'},0\n")
    before = tree(dataset)
    assert main(["pack", str(lst), str(dataset), "--overwrite", "--no-progress"]) == 2
    assert f"OUT {dataset} contains SRC {lst}" in one_line(capsys)
    assert tree(dataset) == before
    lst.unlink()
    # a listed image that sits in OUT under a name fastload writes: only the guard can save it
    ds_before = tree(dataset)
    img = dataset / "shard-00099.lmdb"
    img.write_bytes((tmp_path / "imgs" / "a.jpg").read_bytes())
    other = tmp_path / "lists" / "l.csv"
    other.parent.mkdir()
    other.write_text(f"path,label\n{img},0\n")
    assert main(["pack", str(other), str(dataset), "--overwrite", "--no-progress"]) == 2
    assert f"OUT {dataset} holds images SRC {other} lists" in one_line(capsys)
    assert img.read_bytes() == (tmp_path / "imgs" / "a.jpg").read_bytes()
    img.unlink()
    assert tree(dataset) == ds_before
    # the same through a symlinked folder of the list
    (tmp_path / "via").symlink_to(dataset)
    img.write_bytes((tmp_path / "imgs" / "a.jpg").read_bytes())
    other.write_text(f"path,label\n{tmp_path / 'via' / img.name},0\n")
    assert main(["pack", str(other), str(dataset), "--overwrite", "--no-progress"]) == 2
    assert "holds images SRC" in one_line(capsys) and img.exists()


# ============================================================================ what OUT holds


def _foreign(kind: str, d: Path) -> str:
    if kind == "notes":
        (d / "NOTES.txt").write_text("my notes")
        return "NOTES.txt"
    if kind == "subdir":
        (d / "checkpoints").mkdir()
        (d / "checkpoints" / "model.pt").write_bytes(b"weights")
        return "checkpoints/"
    if kind == "symlink-named-like-a-shard":
        (d / "shard-00007.lmdb").symlink_to("/dev/zero")
        return "shard-00007.lmdb"
    if kind == "dir-named-like-labels":
        (d / "labels.bin.tmp").mkdir()
        (d / "labels.bin.tmp" / "keep").write_text("x")
        return "labels.bin.tmp/"
    if kind == "fifo-named-like-journal":
        os.mkfifo(d / "journal.json")
        return "journal.json"
    if kind == "non-ascii-digits":
        (d / "shard-٠٠٠٠١.lmdb").write_bytes(b"not fastload's")
        return "shard-٠٠٠٠١.lmdb"
    raise AssertionError(kind)


@pytest.mark.parametrize(
    "kind", ["notes", "subdir", "symlink-named-like-a-shard", "dir-named-like-labels", "fifo-named-like-journal", "non-ascii-digits"]
)
def test_a_dataset_with_anything_else_in_it_is_not_replaced(src, dataset, capsys, kind):
    name = _foreign(kind, dataset)
    before = tree(dataset)
    assert main(["pack", str(src), str(dataset), "--overwrite", "--no-progress"]) == 2
    assert one_line(capsys) == (
        f"fastload: error: OUT {dataset} is not a fastload dataset; refusing to replace it even with --overwrite: "
        f"it holds files fastload did not write ({name}); choose another OUT or remove them yourself"
    )
    assert tree(dataset) == before
    with pytest.raises(ConfigError, match="holds files fastload did not write"):
        pack(src, dataset, overwrite=True, resume=True)
    assert tree(dataset) == before


@pytest.mark.parametrize(
    "content, found",
    [
        ({"labels.bin": b"my own labels"}, "it has no fastload manifest.json"),
        ({"manifest.json": b'{"format": "mds"}', "shard-00000.lmdb": b"x"}, "its manifest.json is not a fastload manifest"),
        ({"manifest.json": b"\xff garbage"}, "its manifest.json is not a fastload manifest"),
        ({"journal.json": b'{"format": "something-else"}'}, "it has no fastload manifest.json"),
    ],
)
def test_a_directory_of_fastload_names_without_a_fastload_manifest_is_not_replaced(src, tmp_path, capsys, content, found):
    d = tmp_path / "mine"
    d.mkdir()
    for name, data in content.items():
        (d / name).write_bytes(data)
    before = tree(d)
    assert main(["pack", str(src), str(d), "--overwrite", "--no-progress"]) == 2
    line = one_line(capsys)
    assert f"OUT {d} is not a fastload dataset; refusing to replace it even with --overwrite: {found}" in line, line
    assert tree(d) == before


def test_many_foreign_names_are_listed_in_one_line(src, tmp_path, capsys):
    d = tmp_path / "busy"
    d.mkdir()
    for i in range(12):
        (d / f"f{i:02d}\x1b[31m.txt").write_text("x")
    assert main(["pack", str(src), str(d), "--overwrite", "--no-progress"]) == 2
    line = one_line(capsys)
    assert "(f00\\x1b[31m.txt, f01\\x1b[31m.txt, f02\\x1b[31m.txt, f03\\x1b[31m.txt, f04\\x1b[31m.txt and 7 more)" in line
    assert "\x1b" not in line and len(list(d.iterdir())) == 12


def test_replacing_a_dataset_removes_exactly_fastloads_files(src, dataset, tmp_path):
    res = pack(src, dataset, overwrite=True)  # six shards before, one now
    assert res.num_shards == 1
    assert sorted(os.listdir(dataset)) == ["labels.bin", "manifest.json", shard_name(0)]
    assert sorted(os.listdir(tmp_path)) == ["D", "ds"]  # no .partial, no .old-PID left
    assert fastload.verify(dataset).ok
    empty = tmp_path / "empty"
    empty.mkdir()
    assert pack(src, empty, overwrite=True).num_samples == 6
    # an unfinished pack (a fastload journal, no manifest) may be replaced too
    un = tmp_path / "un"
    un.mkdir()
    (un / "journal.json").write_text(json.dumps({"format": "fastload-journal"}))
    (un / "shard-00000.lmdb").write_bytes(b"old")
    assert pack(src, un, overwrite=True).num_samples == 6
    assert file_hashes(un) == file_hashes(empty)


def test_a_user_file_named_like_the_old_out_is_kept(src, dataset, tmp_path):
    mine = tmp_path / f"ds.old-{os.getpid()}"
    mine.write_text("mine")
    pack(src, dataset, overwrite=True)
    assert mine.read_text() == "mine"
    assert sorted(os.listdir(tmp_path)) == ["D", "ds", mine.name]


def test_files_added_to_out_while_packing_stop_the_replace_and_the_pack_resumes(src, dataset, tmp_path, monkeypatch):
    ref = pack(src, tmp_path / "ref", quality=80)
    real = outdir.atomic_write

    def write(path, data):
        if path.name == MANIFEST_NAME:
            (dataset / "NOTES.txt").write_text("written during the pack")
        real(path, data)

    old = tree(dataset)
    monkeypatch.setattr(outdir, "atomic_write", write)
    with pytest.raises(PackError, match=r"holds files fastload did not write \(NOTES\.txt\).*the finished pack is kept in .*ds\.partial"):
        pack(src, dataset, overwrite=True, quality=80)
    monkeypatch.undo()
    assert tree(dataset) == {**old, "NOTES.txt": tree(dataset)["NOTES.txt"]}
    assert (tmp_path / "ds.partial" / MANIFEST_NAME).exists()
    (dataset / "NOTES.txt").unlink()
    res = pack(src, dataset, overwrite=True, resume=True, quality=80)
    assert res.num_samples == ref.num_samples and file_hashes(dataset) == file_hashes(tmp_path / "ref")
    assert not (tmp_path / "ds.partial").exists()


def test_an_out_that_appears_while_packing_keeps_the_finished_pack(src, tmp_path, monkeypatch):
    out = tmp_path / "late"
    real = outdir.atomic_write

    def write(path, data):
        if path.name == MANIFEST_NAME:
            out.mkdir()
            (out / "thesis.tex").write_text("do not delete")
        real(path, data)

    monkeypatch.setattr(outdir, "atomic_write", write)
    with pytest.raises(PackError, match=r"appeared while packing; the finished pack is kept in"):
        pack(src, out)
    monkeypatch.undo()
    assert (out / "thesis.tex").read_text() == "do not delete"
    assert (tmp_path / "late.partial" / MANIFEST_NAME).exists()


# ============================================================================ OUT.partial


def _drop_note_at(monkeypatch, n: int, partial: Path, *, interrupt: bool = False) -> None:
    """On the n-th image, put a user's file into OUT.partial (or stop the pack, like Ctrl-C)."""
    real = workers.fast_file
    calls = {"n": 0}

    def fake(task, opts):
        calls["n"] += 1
        if calls["n"] == n:
            if interrupt:
                raise KeyboardInterrupt
            (partial / "NOTES.txt").write_text("mine")
        return real(task, opts)

    monkeypatch.setattr(workers, "fast_file", fake)


def test_on_error_fail_cleanup_keeps_a_user_file_in_the_partial(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for j in range(6):
        write_image(src / "a" / f"{j}.jpg", encode_color(0, j), quality=90)
    (src / "a" / "9_empty.jpg").write_bytes(b"")
    partial = tmp_path / "out.partial"
    _drop_note_at(monkeypatch, 3, partial)
    with pytest.raises(BadImageError, match="zero-byte file"):
        pack(src, tmp_path / "out", on_error="fail", shard_size="1000")
    assert sorted(os.listdir(partial)) == ["NOTES.txt"]  # fastload's shards gone, the note kept


def test_nothing_packed_cleanup_keeps_a_user_file_in_the_partial(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for j in range(4):
        (src / "a").mkdir(parents=True, exist_ok=True)
        (src / "a" / f"{j}.jpg").write_bytes(b"")
    partial = tmp_path / "out.partial"
    _drop_note_at(monkeypatch, 2, partial)
    with pytest.raises(PackError, match="nothing packed: all 4 images were refused"):
        pack(src, tmp_path / "out")
    assert sorted(os.listdir(partial)) == ["NOTES.txt"]


def test_resume_refuses_a_partial_with_files_fastload_did_not_write(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for j in range(20):
        write_image(src / "a" / f"{j:02d}.jpg", encode_color(0, j), quality=90)
    ref = pack(src, tmp_path / "ref", shard_size="1000")
    out, partial = tmp_path / "out", tmp_path / "out.partial"
    _drop_note_at(monkeypatch, 12, partial, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, shard_size="1000")
    monkeypatch.undo()
    (partial / "NOTES.txt").write_text("mine")
    (partial / "sub").mkdir()
    (partial / "sub" / "x").write_text("mine too")
    before = tree(partial)
    for kw in ({"resume": True}, {"overwrite": True}, {"resume": True, "overwrite": True}):
        with pytest.raises(ConfigError, match=r"out\.partial holds files fastload did not write \(NOTES\.txt, sub/\)"):
            pack(src, out, shard_size="1000", **kw)
        assert tree(partial) == before
    (partial / "NOTES.txt").unlink()
    (partial / "sub" / "x").unlink()
    (partial / "sub").rmdir()
    res = pack(src, out, shard_size="1000", resume=True)
    assert res.num_samples == ref.num_samples and file_hashes(out) == file_hashes(tmp_path / "ref")


def test_a_journal_with_shards_under_other_names_reuses_none_of_them(tmp_path, monkeypatch):
    src = tmp_path / "src"
    for j in range(20):
        write_image(src / "a" / f"{j:02d}.jpg", encode_color(0, j), quality=90)
    pack(src, tmp_path / "ref", shard_size="1000")
    out, partial = tmp_path / "out", tmp_path / "out.partial"
    _drop_note_at(monkeypatch, 12, partial, interrupt=True)
    with pytest.raises(KeyboardInterrupt):
        pack(src, out, shard_size="1000")
    monkeypatch.undo()
    jf = partial / "journal.json"
    d = json.loads(jf.read_text())
    assert len(d["shards"]) >= 2
    a, b = d["shards"][0]["file"], d["shards"][1]["file"]  # swap two shards' names, files and journal alike
    os.rename(partial / a, partial / "swap")
    os.rename(partial / b, partial / a)
    os.rename(partial / "swap", partial / b)
    d["shards"][0]["file"], d["shards"][1]["file"] = b, a
    jf.write_text(json.dumps(d))
    pack(src, out, shard_size="1000", resume=True)
    assert file_hashes(out) == file_hashes(tmp_path / "ref")
    assert manifest_sans_time(out) == manifest_sans_time(tmp_path / "ref")


@pytest.mark.parametrize("flags", [[], ["--resume"], ["--overwrite"]])
def test_out_partial_that_is_a_symlink_or_a_file_is_refused(src, tmp_path, capsys, flags):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "labels.bin").write_text("not fastload's")
    link = tmp_path / "a.partial"
    link.symlink_to(elsewhere)
    assert main(["pack", str(src), str(tmp_path / "a"), *flags, "--no-progress"]) == 2
    assert one_line(capsys) == (
        f"fastload: error: {link} is a symlink; fastload writes an unfinished pack only into a real directory "
        "there: remove the link yourself, or choose another OUT"
    )
    assert (elsewhere / "labels.bin").read_text() == "not fastload's" and link.is_symlink()
    f = tmp_path / "b.partial"
    f.write_text("a file")
    assert main(["pack", str(src), str(tmp_path / "b"), *flags, "--no-progress"]) == 2
    assert f"{f} is a file, not an unfinished pack" in one_line(capsys)
    assert f.read_text() == "a file"
    fifo = tmp_path / "c.partial"
    os.mkfifo(fifo)
    assert main(["pack", str(src), str(tmp_path / "c"), *flags, "--no-progress"]) == 2
    assert f"{fifo} is a FIFO, not an unfinished pack" in one_line(capsys)


# ============================================================================ one writer per OUT

_SLOW = r"""
import os, sys, time
import fastload
from fastload.packing import workers
gate = sys.argv[3]
real = workers.Results.__iter__
def slow(self):
    for i, r in enumerate(real(self)):
        if i == 8:
            deadline = time.monotonic() + 60
            while not os.path.exists(gate) and time.monotonic() < deadline:
                time.sleep(0.02)
        yield r
workers.Results.__iter__ = slow
fastload.pack(sys.argv[1], sys.argv[2], shard_size="1000", workers=2, progress=False, overwrite=True)
"""


@pytest.fixture
def png_src(tmp_path) -> Path:
    """PNGs: they go through the worker processes, so the pack has forked children."""
    root = tmp_path / "pngs"
    for label in range(2):
        for j in range(8):
            write_image(root / f"c{label}" / f"{j}.png", encode_color(label, 8 * label + j), size=(32, 24))
    return root


def _start_slow(png_src: Path, out: Path, gate: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-c", _SLOW, str(png_src), str(out), str(gate)], stderr=subprocess.PIPE, text=True)
    journal_file = out.with_name(out.name + ".partial") / "journal.json"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if len(json.loads(journal_file.read_text())["shards"]) >= 3:
                return proc
        except (OSError, ValueError, KeyError):
            pass
        assert proc.poll() is None, proc.stderr.read()
        time.sleep(0.02)
    proc.kill()
    raise AssertionError("the slow pack did not get going")


def test_a_second_pack_of_the_same_out_is_refused_naming_the_first(png_src, tmp_path):
    ref = pack(png_src, tmp_path / "ref", shard_size="1000")
    out, gate = tmp_path / "out", tmp_path / "gate"
    first = _start_slow(png_src, out, gate)
    try:
        for flags in (["--overwrite"], ["--resume"], []):
            r = subprocess.run(
                [sys.executable, "-m", "fastload", "pack", str(png_src), str(out), "--shard-size", "1000", "--no-progress", *flags],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
            assert r.returncode == 2 and r.stdout == "", r.stderr
            assert re.fullmatch(
                rf"fastload: error: OUT {re.escape(str(out))} is being written by process {first.pid} "
                r"\(started \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\); wait for it or stop it\n",
                r.stderr,
            ), r.stderr
        with pytest.raises(ConfigError, match=rf"is being written by process {first.pid} "):
            pack(png_src, out, shard_size="1000", overwrite=True)
        # OUT.partial itself as OUT: the same lock
        with pytest.raises(ConfigError, match=rf"out\.partial is being written by process {first.pid} "):
            pack(png_src, tmp_path / "out.partial", shard_size="1000", overwrite=True)
        gate.touch()
        assert first.wait(timeout=120) == 0, first.stderr.read()
    finally:
        first.kill()
        first.wait(timeout=30)
    assert file_hashes(out) == file_hashes(tmp_path / "ref") and ref.num_samples == 16
    assert manifest_sans_time(out) == manifest_sans_time(tmp_path / "ref")


def test_kill_9_leaves_no_lock_that_blocks_resume(png_src, tmp_path):
    pack(png_src, tmp_path / "ref", shard_size="1000")
    out, gate = tmp_path / "out", tmp_path / "gate"
    first = _start_slow(png_src, out, gate)
    children = psutil.Process(first.pid).children(recursive=True)
    assert children, "the pack should have worker processes"
    try:
        for c in children:  # stopped workers keep every descriptor they inherited open
            c.send_signal(signal.SIGSTOP)
        first.send_signal(signal.SIGKILL)
        assert first.wait(timeout=30) == -signal.SIGKILL
        assert all(c.is_running() for c in children)
        res = pack(png_src, out, shard_size="1000", resume=True)
    finally:
        for c in children:
            try:
                c.kill()
            except psutil.NoSuchProcess:
                pass
        first.kill()
    assert res.num_samples == 16 and file_hashes(out) == file_hashes(tmp_path / "ref")
    assert not (tmp_path / "out.partial").exists()


# ============================================================================ options


class Index:
    def __init__(self, n):
        self.n = n

    def __index__(self):
        return self.n


def _integer_kinds():
    kinds = [("numpy", np.int64), ("numpy-unsigned", np.uint32), ("__index__", Index)]
    return kinds + ([("torch-0d", torch.tensor)] if torch is not None else [])


@pytest.mark.parametrize("kind, make", _integer_kinds(), ids=[k for k, _ in _integer_kinds()])
def test_integer_options_take_any_integer_type(src, tmp_path, kind, make):
    plain = pack(src, tmp_path / "plain", workers=2, shard_size=4096, quality=80, max_size=40, max_pixels=10**6)
    res = pack(src, tmp_path / kind, workers=make(2), shard_size=make(4096), quality=make(80), max_size=make(40), max_pixels=make(10**6))
    assert res.num_samples == plain.num_samples == 6
    assert file_hashes(tmp_path / kind) == file_hashes(tmp_path / "plain")
    assert manifest_sans_time(tmp_path / kind)["options"] == manifest_sans_time(tmp_path / "plain")["options"]


def _refused_values():
    tensors = []
    if torch is not None:
        tensors = [
            ("workers", torch.tensor(True), "workers (--workers): expected an integer >= 1"),
            ("workers", torch.tensor([1, 2]), "workers (--workers): expected an integer >= 1"),
            ("quality", torch.tensor(80.0), "quality (--quality): expected an integer 1..100"),
        ]
    return tensors + [
        ("workers", True, "workers (--workers): expected an integer >= 1, got True"),
        ("workers", np.True_, "workers (--workers): expected an integer >= 1"),
        ("workers", 2.0, "workers (--workers): expected an integer >= 1, got 2.0"),
        ("workers", "2", "workers (--workers): expected an integer >= 1, got '2'"),
        ("workers", -1, "workers (--workers): expected an integer >= 1, got -1"),
        ("quality", 0, "quality (--quality): expected an integer 1..100, got 0"),
        ("quality", np.int64(101), "quality (--quality): expected an integer 1..100"),
        ("quality", None, "quality (--quality): expected an integer 1..100, got None"),
        ("max_size", 0, "max_size (--max-size): expected an integer >= 1, got 0"),
        ("max_size", 65536, "max_size (--max-size): 65536 is more than 65535, the longest side a stored JPEG can have"),
        ("max_size", 10**30, "max_size (--max-size): 1000000000000000000000000000000 is more than 65535"),
        ("max_pixels", 0, "max_pixels (--max-pixels): expected an integer >= 1, got 0"),
        ("max_pixels", 10**20, "max_pixels (--max-pixels): 100000000000000000000 is more than 4294836225"),
        ("shard_size", 999, "shard_size (--shard-size): 999 is 999 bytes, below the smallest shard size (1000 bytes)"),
        ("shard_size", "1", "shard_size (--shard-size): '1' is 1 bytes, below the smallest shard size"),
        ("shard_size", "2TiB", "shard_size (--shard-size): '2TiB' is 2199023255552 bytes, above the largest shard size"),
        ("shard_size", 10**30, "above the largest shard size"),
        ("on_error", ["skip"], "on_error (--on-error): expected 'skip' or 'fail', got ['skip']"),
        ("on_error", np.array(["skip", "fail"]), "on_error (--on-error): expected 'skip' or 'fail'"),
        ("overwrite", "False", "overwrite (--overwrite): expected True or False, got 'False'"),
        ("resume", 1, "resume (--resume): expected True or False, got 1"),
        ("baseline", "yes", "baseline (--baseline): expected True or False, got 'yes'"),
        ("progress", None, "progress (--no-progress): expected True or False, got None"),
    ]


@pytest.mark.parametrize("name, value, message", _refused_values(), ids=lambda v: repr(v)[:30])
def test_options_that_cannot_work_fail_first_with_their_name(src, dataset, tmp_path, name, value, message):
    before = tree(dataset)
    for out in (tmp_path / "new", dataset):
        with pytest.raises(ConfigError) as ei:
            fastload.pack(src, out, **{"progress": False, name: value})
        assert message in str(ei.value), str(ei.value)
    with pytest.raises(ConfigError) as ei:
        fastload.pack_dataset([(b"x", 0)], tmp_path / "new", **{"progress": False, name: value})
    assert message in str(ei.value)
    assert tree(dataset) == before and not (tmp_path / "new").exists() and not (tmp_path / "new.partial").exists()


@pytest.mark.parametrize(
    "value",
    ["1e999GB", "nanGB", "infGB", "inf", float("inf"), float("nan"), -1, "-1GB", "١٢GB", "１２GB", "12\u00a0GB", "9" * 100, "9" * 5000 + "TB",
     np.float64("inf"), 1.5, object(), b"1GB", "0x10"],
    ids=repr,
)  # fmt: skip
def test_parse_size_refuses_hostile_values_with_a_config_error(value):
    with pytest.raises(ConfigError, match=r"^shard_size \(--shard-size\): "):
        run.parse_size(value)


@pytest.mark.parametrize("value, expected", [("4.35KB", 4350), ("+8KiB", 8192), (4096.0, 4096), ("0.5GB", 5 * 10**8)])
def test_parse_size_is_exact(value, expected):
    assert run.parse_size(value) == expected


def test_workers_far_above_the_images_are_capped_not_forked(tmp_path, png_src, monkeypatch):
    import concurrent.futures

    sizes = []
    real = concurrent.futures.ProcessPoolExecutor

    class Spy(real):
        def __init__(self, max_workers=None, *a, **k):
            sizes.append(max_workers)
            if max_workers > 64:  # a regression must fail here, not fork that many processes
                raise RuntimeError(f"would fork {max_workers} worker processes")
            super().__init__(max_workers, *a, **k)

    monkeypatch.setattr(concurrent.futures, "ProcessPoolExecutor", Spy)
    t0 = time.monotonic()
    res = pack(png_src, tmp_path / "many", workers=100_000)
    assert time.monotonic() - t0 < 60
    cores = len(os.sched_getaffinity(0))
    assert len(sizes) == 1 and 1 <= sizes[0] <= min(16, 4 * cores), sizes
    assert file_hashes(tmp_path / "many") == file_hashes(Path(pack(png_src, tmp_path / "one").path))
    assert res.num_samples == 16


def test_out_argument_types(src, tmp_path):
    for bad in (None, 5, 3.5):
        with pytest.raises(ConfigError, match=r"^OUT: expected a directory path, got"):
            pack(src, bad)
    assert pack(src, os.fsencode(tmp_path / "bytes_out")).num_samples == 6


# ============================================================================ the write path


@pytest.mark.parametrize(
    "name, shown, char",
    [
        ("o\x1b[31mut", "o\\x1b[31mut", "\\x1b"),
        ("two\nlines", "two\\x0alines", "\\x0a"),
        ("bell\x07", "bell\\x07", "\\x07"),
        ("rtl\u202eevil", "rtl\\u202eevil", "\\u202e"),
    ],
)
def test_out_with_control_characters_is_refused_in_one_safe_line(src, tmp_path, capsys, name, shown, char):
    out = tmp_path / name
    assert main(["pack", str(src), str(out), "--no-progress"]) == 2
    line = one_line(capsys)
    assert line == f"fastload: error: OUT {tmp_path}/{shown}: the path holds a control character ({char}); choose a name without one"
    assert not any(c in line for c in "\x1b\x07\u202e") and not out.exists()


def test_paths_in_messages_are_printed_safely(tmp_path, capsys):
    src = tmp_path / "evil\x1b[2J"
    write_image(src / "a" / "0.jpg", encode_color(0, 0), quality=90)
    (tmp_path / "plain").symlink_to(src)
    assert main(["pack", str(src), str(tmp_path / "plain" / "out"), "--no-progress"]) == 2
    line = one_line(capsys)
    assert "\x1b" not in line and line.endswith(f"is inside SRC {tmp_path}/evil\\x1b[2J; write the packed dataset elsewhere")
    assert main(["pack", str(src), str(tmp_path), "--overwrite", "--no-progress"]) == 2
    line = one_line(capsys)
    assert "\x1b" not in line and f"contains SRC {tmp_path}/evil\\x1b[2J;" in line


def test_write_path_errors_are_one_line(src, tmp_path, capsys):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    afile = tmp_path / "afile"
    afile.write_text("x")
    (tmp_path / "zero").symlink_to("/dev/zero")
    cases = [
        ([str(fifo / "out")], f"{fifo}/out.partial: cannot create the output directory: Not a directory"),
        ([str(afile / "deeper" / "out")], "out.partial: cannot create the output directory: Not a directory"),
        ([str(fifo), "--overwrite"], f"OUT {fifo} is not a fastload dataset; refusing to replace it even with --overwrite: it is a FIFO, not a directory"),
        ([str(tmp_path / "zero"), "--overwrite"], f"OUT {tmp_path / 'zero'} is not a fastload dataset; refusing to replace it even with --overwrite: it is a symlink (to /dev/zero)"),
        ([str(afile), "--overwrite"], "it is a file, not a directory; choose another OUT or remove it yourself"),
        (["/proc/fastload-cannot-be-here"], "/proc/fastload-cannot-be-here.partial: cannot create the output directory: "),
        ([str(tmp_path / ("n" * 300))], ": cannot look at it: File name too long"),
    ]
    for argv, message in cases:
        assert main(["pack", str(src), *argv, "--no-progress"]) == 2, argv
        line = one_line(capsys)
        assert message in line, (argv, line)
    assert fifo.is_fifo() and afile.read_text() == "x"


def test_out_on_a_read_only_file_system_is_one_line(src, tmp_path, capsys):
    ro = tmp_path / "ro"
    ro.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("needs root and mount for a read-only tmpfs")
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1M", "tmpfs", str(ro)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a tmpfs here")
    try:
        assert main(["pack", str(src), str(ro / "out"), "--no-progress"]) == 2
        assert one_line(capsys) == f"fastload: error: {ro}/out.partial: cannot create the output directory: Read-only file system"
    finally:
        subprocess.run(["umount", "-l", str(ro)], capture_output=True)


@pytest.mark.parametrize("error", [PermissionError, IsADirectoryError, NotADirectoryError])
def test_os_errors_in_prepare_and_finalize_are_one_line_pack_errors(src, tmp_path, capsys, monkeypatch, error):
    out = tmp_path / "out"
    partial = tmp_path / "out.partial"
    ref = pack(src, tmp_path / "ref")
    real_replace = os.replace

    def replace(a, b, *k, **kw):
        if Path(a) == partial:
            raise error(13, os.strerror(13), str(a))
        return real_replace(a, b, *k, **kw)

    monkeypatch.setattr(os, "replace", replace)  # the final rename fails
    assert main(["pack", str(src), str(out), "--workers", "1", "--no-progress"]) == 2
    line = one_line(capsys)
    assert line == f"fastload: error: {partial}: cannot finish the pack: Permission denied ({partial}); fix that, then continue with --resume"
    monkeypatch.undo()
    assert not out.exists() and (partial / MANIFEST_NAME).exists()

    def save(self, directory, **kw):
        raise error(21, "cannot write it", str(directory / "journal.json"))

    monkeypatch.setattr(journal.Journal, "save", save)  # the journal cannot be (re)written
    assert main(["pack", str(src), str(out), "--resume", "--workers", "1", "--no-progress"]) == 2
    assert one_line(capsys) == f"fastload: error: {partial}: cannot resume the unfinished pack: cannot write it"
    assert main(["pack", str(src), str(tmp_path / "other"), "--workers", "1", "--no-progress"]) == 2
    assert one_line(capsys) == f"fastload: error: {tmp_path / 'other.partial'}: cannot create the output directory: cannot write it"
    monkeypatch.undo()
    real_scandir = os.scandir

    def scandir(p="."):
        if Path(p) == tmp_path / "ref":
            raise error(13, "Permission denied", str(p))
        return real_scandir(p)

    monkeypatch.setattr(os, "scandir", scandir)  # OUT cannot be listed
    assert main(["pack", str(src), str(tmp_path / "ref"), "--overwrite", "--workers", "1", "--no-progress"]) == 2
    assert one_line(capsys) == f"fastload: error: OUT {tmp_path / 'ref'}: cannot list it: Permission denied"
    monkeypatch.undo()
    assert main(["pack", str(src), str(out), "--resume", "--workers", "1", "--no-progress"]) == 0
    capsys.readouterr()
    assert file_hashes(out) == file_hashes(tmp_path / "ref") and ref.num_samples == 6
