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
