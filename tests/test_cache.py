"""fastload.cache.cached_pack: a torchvision ImageFolder packed once into a shared cache, safely across processes.

Real torchvision ``ImageFolder`` datasets over folders the tests make (pixels encode
label and index, see conftest); everything that waits on another process runs in
subprocesses under a timeout, so a regression fails instead of hanging.
"""

from __future__ import annotations

import io
import json
import logging
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cache import CACHE_ENV, cache_entry, cached_pack
from fastload.errors import ConfigError, FormatError, PackError

from conftest import decode_color, encode_color, write_image

tv = pytest.importorskip("torchvision")
from torchvision.datasets import DatasetFolder, FakeData, ImageFolder

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 300  # generous: CI machines can be heavily loaded


def _contents(entry: Path) -> list[tuple[str, int, tuple[int, int]]]:
    """(source path, label, decoded (label, index) from the pixels) of every packed sample."""
    ds = fastload.Dataset(entry)
    out = []
    for i in range(len(ds)):
        payload, label = ds[i]
        with Image.open(io.BytesIO(payload)) as im:
            rgb = np.asarray(im.convert("RGB"), dtype=np.float64).reshape(-1, 3).mean(axis=0)
        out.append((ds.source_path(i), int(label), decode_color(rgb)))
    return out


def _assert_holds(entry: Path, folder: ImageFolder) -> None:
    ds = fastload.Dataset(entry)
    assert ds.classes == folder.classes
    assert [int(x) for x in ds.labels] == folder.targets
    got = _contents(entry)
    assert [p for p, _, _ in got] == [os.path.abspath(p) for p, _ in folder.samples]
    for (_, label, (pix_label, _)), (_, target) in zip(got, folder.samples):
        assert label == target == pix_label


def _manifest_mtime(entry: Path) -> int:
    return (entry / "manifest.json").stat().st_mtime_ns


def _packed_messages(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "fastload.cache" and "(once)" in r.getMessage()]


# ----------------------------------------------------------------------------- packing and reuse


def test_packs_an_image_folder_with_its_order_labels_and_class_names(make_folder, tmp_path, caplog):
    root = make_folder(classes=3, per_class=4)
    folder = ImageFolder(str(root))
    with caplog.at_level(logging.INFO, logger="fastload"):
        entry = cached_pack(folder, cache_dir=tmp_path / "cache", progress=False)
    assert entry.parent == (tmp_path / "cache").resolve() and entry.name.startswith(root.name + "-")
    _assert_holds(entry, folder)
    assert [idx for _, _, (_, idx) in _contents(entry)] == list(range(12))  # torchvision's order
    msgs = _packed_messages(caplog)
    assert len(msgs) == 1 and f"ImageFolder({root})" in msgs[0] and str(entry) in msgs[0]
    assert sorted(os.listdir(tmp_path / "cache")) == sorted([entry.name, entry.name + ".lock"])  # no list, no partial
    assert cache_entry(folder, cache_dir=tmp_path / "cache") == entry


def test_a_second_call_reuses_the_entry(make_folder, tmp_path, caplog):
    folder = ImageFolder(str(make_folder()))
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    before = _manifest_mtime(entry)
    time.sleep(0.02)
    caplog.clear()  # the first call's own line, when an earlier test left fastload's logger at INFO
    with caplog.at_level(logging.INFO, logger="fastload"):
        again = cached_pack(ImageFolder(folder.root), cache_dir=tmp_path / "c", progress=False)
    assert again == entry and _manifest_mtime(entry) == before
    assert _packed_messages(caplog) == []


def test_a_touched_file_repacks(make_folder, tmp_path):
    root = make_folder()
    folder = ImageFolder(str(root))
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    target = Path(folder.samples[5][0])
    st = target.stat()
    os.utime(target, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    new = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    assert new != entry and (new / "manifest.json").is_file()
    _assert_holds(new, folder)


def test_a_replaced_file_repacks_with_the_new_image(make_folder, tmp_path):
    root = make_folder(classes=2, per_class=3)
    folder = ImageFolder(str(root))
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    victim = Path(folder.samples[1][0])
    tmp = victim.with_name("new.tmp")
    write_image(tmp, encode_color(0, 99), size=(80, 60), fmt="JPEG", quality=90)
    os.replace(tmp, victim)
    new = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    assert new != entry
    assert _contents(new)[1][2] == (0, 99) and _contents(entry)[1][2] == (0, 1)


def test_added_and_removed_files_repack(make_folder, tmp_path):
    root = make_folder(classes=2, per_class=3)
    entry = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    write_image(root / "class_1" / "img_9999.jpg", encode_color(1, 50))
    added = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    assert added != entry and len(fastload.Dataset(added)) == 7
    (root / "class_0" / "img_0000.jpg").unlink()
    removed = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    assert removed not in (entry, added) and len(fastload.Dataset(removed)) == 6


def test_cache_dir_from_the_environment_then_home(make_folder, tmp_path, monkeypatch):
    folder = ImageFolder(str(make_folder()))
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "from-env"))
    entry = cached_pack(folder, progress=False)
    assert entry.parent == (tmp_path / "from-env").resolve()
    explicit = cached_pack(folder, cache_dir=tmp_path / "explicit", progress=False)
    assert explicit.parent == (tmp_path / "explicit").resolve()  # the argument wins over the environment
    monkeypatch.delenv(CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    home = cached_pack(folder, progress=False)
    assert home.parent == (tmp_path / "home" / ".cache" / "fastload").resolve()
    assert home.name == entry.name == explicit.name


def test_unusable_cache_directories(make_folder, tmp_path, monkeypatch):
    folder = ImageFolder(str(make_folder()))
    (tmp_path / "afile").write_text("x")
    with pytest.raises(ConfigError, match="afile.*file"):
        cached_pack(folder, cache_dir=tmp_path / "afile", progress=False)
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "afile" / "below"))
    with pytest.raises(ConfigError, match=r"cannot create it.*\$FASTLOAD_CACHE"):
        cached_pack(folder, progress=False)


# ----------------------------------------------------------------------------- datasets the list file cannot carry


def test_class_names_that_look_like_integers(tmp_path):
    """Folders "1", "10", "2": ImageFolder's classes sort as strings, so label 1 is "10", not 1."""
    root = tmp_path / "digits"
    names = ["1", "10", "2"]
    for k, name in enumerate(names):
        for j in range(2):
            write_image(root / name / f"{j}.jpg", encode_color(k, 2 * k + j))
    folder = ImageFolder(str(root))
    assert folder.classes == names
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    ds = fastload.Dataset(entry)
    assert ds.classes == names and [int(x) for x in ds.labels] == folder.targets == [0, 0, 1, 1, 2, 2]
    assert [lab for _, lab, _ in _contents(entry)] == [pix for _, _, (pix, _) in _contents(entry)]


def test_an_empty_class_keeps_its_index(tmp_path):
    root = tmp_path / "withempty"
    for k, name in enumerate(["a", "c"]):
        write_image(root / name / "0.jpg", encode_color(2 * k, k))
    (root / "b").mkdir()
    folder = ImageFolder(str(root), allow_empty=True)
    assert folder.classes == ["a", "b", "c"] and folder.targets == [0, 2]
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    ds = fastload.Dataset(entry)
    assert ds.classes == ["a", "b", "c"] and [int(x) for x in ds.labels] == [0, 2]
    assert [pix for _, _, (pix, _) in _contents(entry)] == [0, 2]


def test_a_filtered_folder_packs_only_its_samples(make_folder, tmp_path):
    root = make_folder(classes=3, per_class=4)
    folder = ImageFolder(str(root), is_valid_file=lambda p: p.endswith(("0.jpg", "2.jpg")))
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    _assert_holds(entry, folder)
    assert len(fastload.Dataset(entry)) == 6


def test_a_custom_class_order_is_kept(make_folder, tmp_path):
    class Reversed(ImageFolder):
        def find_classes(self, directory):
            classes = sorted((e.name for e in os.scandir(directory) if e.is_dir()), reverse=True)
            return classes, {c: i for i, c in enumerate(classes)}

    folder = Reversed(str(make_folder(classes=3, per_class=2)))
    assert folder.classes == ["class_2", "class_1", "class_0"]
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    _assert_holds_labels = [int(x) for x in fastload.Dataset(entry).labels]
    assert fastload.Dataset(entry).classes == folder.classes and _assert_holds_labels == folder.targets
    assert [2 - lab for _, lab, _ in _contents(entry)] == [pix for _, _, (pix, _) in _contents(entry)]


def test_a_dataset_folder_of_images(tmp_path):
    root = tmp_path / "df"
    for k in range(2):
        write_image(root / f"k{k}" / "x.png", encode_color(k, k), fmt="PNG")
    folder = DatasetFolder(str(root), loader=tv.datasets.folder.default_loader, extensions=(".png",))
    entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    assert [pix for _, _, (pix, _) in _contents(entry)] == [0, 1]


# ----------------------------------------------------------------------------- refusals


def test_datasets_that_are_not_file_based(tmp_path, make_folder):
    import torch.utils.data as tud

    with pytest.raises(ConfigError, match=r"FakeData\(.*not file-based.*pack_dataset"):
        cached_pack(FakeData(size=4, image_size=(3, 8, 8)), cache_dir=tmp_path / "c")
    with pytest.raises(ConfigError, match=r"Subset\(\.\.\.\) is not file-based"):
        cached_pack(tud.Subset(ImageFolder(str(make_folder())), [0, 1]), cache_dir=tmp_path / "c")
    assert not (tmp_path / "c").exists() or not os.listdir(tmp_path / "c")


def test_a_custom_loader_is_refused(make_folder, tmp_path):
    folder = ImageFolder(str(make_folder()), loader=lambda p: Image.open(p).convert("L"))
    with pytest.raises(ConfigError, match="custom loader.*<lambda>.*pack_dataset"):
        cached_pack(folder, cache_dir=tmp_path / "c")


@pytest.mark.parametrize(
    "samples, needle",
    [
        ([("a.jpg", 0), ("b.jpg", 5)], r"samples\[1\]: class index 5 is outside the 2 classes"),
        ([("a.jpg", True)], r"samples\[0\]: class index True is not an integer"),
        ([("a.jpg",)], r"samples\[0\]: expected a \(path, class_index\) pair"),
        ([(3.5, 0)], r"samples\[0\]: path 3.5 is not a file path"),
        ([("a\0b.jpg", 0)], r"samples\[0\]: path .* is not a file path"),
        ([("a\ud800.jpg", 0)], r"samples\[0\]: path 'a\\ud800.jpg' is not a file path \(it cannot be encoded\)"),
        ([], "no samples"),
    ],
)
def test_bad_samples_are_named(tmp_path, samples, needle):
    class Fake:
        root = "/nowhere"
        classes = ["x", "y"]

    fake = Fake()
    fake.samples = samples
    with pytest.raises(ConfigError, match=needle):
        cached_pack(fake, cache_dir=tmp_path / "c")


def test_a_bytes_root_is_named_as_a_path(make_folder, tmp_path):
    """A dataset whose ``root`` is bytes (a path as the file system gives it) is described by that path."""
    folder = ImageFolder(str(make_folder()))
    folder.root = os.fsencode(folder.root)
    folder.samples = folder.samples[:1] + [(folder.samples[1][0], 7)]
    with pytest.raises(ConfigError, match=rf"^ImageFolder\({re.escape(os.fsdecode(folder.root))}\)\.samples\[1\]: class index 7"):
        cached_pack(folder, cache_dir=tmp_path / "c")


def test_a_failed_pack_names_the_root_and_leaves_nothing_finished(tmp_path):
    root = tmp_path / "broken"
    for k in range(2):
        p = root / f"c{k}" / "0.jpg"
        p.parent.mkdir(parents=True)
        p.write_bytes(b"this is not a JPEG")
    folder = ImageFolder(str(root))
    with pytest.raises(PackError) as e:
        cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    msg = str(e.value)
    assert f"ImageFolder({root})" in msg and str(root / "c0" / "0.jpg") in msg and "\n" not in msg
    entry = cache_entry(folder, cache_dir=tmp_path / "c")
    assert not entry.exists() and not entry.with_name(entry.name + ".pack").exists()
    for k in range(2):  # fixed: the same call now packs
        write_image(root / f"c{k}" / "0.jpg", encode_color(k, k))
    fixed = cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    assert [pix for _, _, (pix, _) in _contents(fixed)] == [0, 1]


def test_an_unreadable_image_is_named_and_nothing_is_cached(make_folder, tmp_path):
    """Leaving it out would shift every later index away from the ImageFolder's own."""
    root = make_folder(classes=2, per_class=3)
    bad = root / "class_1" / "img_0001.jpg"
    good = bad.read_bytes()
    bad.write_bytes(b"\xff\xd8 truncated")
    folder = ImageFolder(str(root))
    with pytest.raises(PackError, match=f"{bad}: .*packs all of them or none"):
        cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    entry = cache_entry(folder, cache_dir=tmp_path / "c")
    assert not entry.exists()
    bad.write_bytes(good)
    folder = ImageFolder(str(root))
    ds = fastload.Dataset(cached_pack(folder, cache_dir=tmp_path / "c", progress=False))
    assert len(ds) == 6 and [int(x) for x in ds.labels] == folder.targets


def test_an_entry_without_manifest_is_reported(make_folder, tmp_path):
    folder = ImageFolder(str(make_folder()))
    entry = cache_entry(folder, cache_dir=tmp_path / "c")
    entry.mkdir()
    with pytest.raises(FormatError, match="without a manifest.json.*remove it"):
        cached_pack(folder, cache_dir=tmp_path / "c", progress=False)


# ----------------------------------------------------------------------------- processes


_CHILD = textwrap.dedent(
    """
    import faulthandler, json, logging, os, sys, time
    faulthandler.dump_traceback_later({dump}, exit=True)  # a hang shows where it is, then ends
    sys.path.insert(0, {repo!r})
    from torchvision.datasets import ImageFolder
    import fastload.cache as cache

    class Flag(logging.Handler):
        packed = False
        waited = False
        def emit(self, record):
            msg = record.getMessage()
            Flag.packed |= "(once)" in msg
            if msg.startswith("waiting for another process"):
                Flag.waited = True
                open(go + ".waiting", "w").close()

    lg = logging.getLogger("fastload.cache")
    lg.setLevel(logging.INFO)
    lg.addHandler(Flag())
    mode, root, cache_dir, go = sys.argv[1:5]
    if mode == "nolock":  # a file system that cannot lock
        import types
        def flock(fd, op):
            raise OSError(37, "No locks available")
        cache.fcntl = types.SimpleNamespace(flock=flock, LOCK_EX=2, LOCK_NB=4)
    if mode == "hang-in-pack":  # take the lock, start packing, and stop forever inside the pack
        import fastload.packing.shards as shards
        def hang(self, *a, **k):
            open(go + ".inside", "w").close()
            time.sleep(3600)
        shards.ShardWriter.add = hang
    while not os.path.exists(go):
        time.sleep(0.01)
    t0 = time.monotonic()
    entry = cache.cached_pack(ImageFolder(root), cache_dir=cache_dir, progress=False)
    print(json.dumps({{"entry": str(entry), "packed": Flag.packed, "waited": Flag.waited, "s": time.monotonic() - t0}}))
    """
)


def _child(tmp_path: Path, mode: str, root: Path, cache_dir: Path, go: Path) -> subprocess.Popen:
    script = tmp_path / "child.py"
    script.write_text(_CHILD.format(repo=str(REPO), dump=TIMEOUT - 20))
    return subprocess.Popen(
        [sys.executable, str(script), mode, str(root), str(cache_dir), str(go)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def _result(p: subprocess.Popen) -> dict:
    try:
        out, err = p.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        _, err = p.communicate()
        pytest.fail(f"a cached_pack process hung: {err[-3000:]}")
    assert p.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def test_two_processes_at_once_make_one_entry(make_folder, tmp_path):
    root = make_folder(classes=4, per_class=30, size=(160, 120))
    go = tmp_path / "go"
    procs = [_child(tmp_path, "plain", root, tmp_path / "c", go) for _ in range(2)]
    time.sleep(1.0)  # both are waiting for the start signal
    go.touch()
    results = [_result(p) for p in procs]
    assert results[0]["entry"] == results[1]["entry"]
    assert sorted(r["packed"] for r in results) == [False, True]  # one packed, the other waited and reused
    entry = Path(results[0]["entry"])
    assert sorted(os.listdir(tmp_path / "c")) == sorted([entry.name, entry.name + ".lock"])
    _assert_holds(entry, ImageFolder(str(root)))


def test_a_held_lock_is_waited_for_and_a_dead_holders_lock_does_not_block(make_folder, tmp_path):
    import fcntl

    root = make_folder(classes=2, per_class=2)
    entry = cache_entry(ImageFolder(str(root)), cache_dir=tmp_path / "c")
    lock = entry.with_name(entry.name + ".lock")
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import fcntl, os, sys, time
            fd = os.open({str(lock)!r}, os.O_RDWR | os.O_CREAT)
            fcntl.flock(fd, fcntl.LOCK_EX)
            print("locked", flush=True)
            time.sleep(3600)
        """)],
        stdout=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        assert holder.stdout.readline().strip() == "locked"
        go = tmp_path / "go"
        go.touch()
        waiter = _child(tmp_path, "plain", root, tmp_path / "c", go)
        deadline = time.monotonic() + TIMEOUT
        while not Path(str(go) + ".waiting").exists():  # it says it waits for the holder
            assert waiter.poll() is None, waiter.communicate()[1][-3000:]
            assert time.monotonic() < deadline, "the waiter never reached the lock"
            time.sleep(0.05)
        time.sleep(1.0)
        assert waiter.poll() is None  # and it still waits
        fd = os.open(lock, os.O_RDWR)
        try:  # the lock is really held
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        os.killpg(holder.pid, signal.SIGKILL)  # a holder killed without releasing anything
        holder.wait(timeout=TIMEOUT)
        res = _result(waiter)
    finally:
        if holder.poll() is None:
            os.killpg(holder.pid, signal.SIGKILL)
    assert res["packed"] and res["waited"] and res["s"] >= 1.0 and res["entry"] == str(entry)
    _assert_holds(entry, ImageFolder(str(root)))


def test_a_packer_killed_mid_pack_leaves_nothing_finished_and_the_next_call_packs(make_folder, tmp_path):
    root = make_folder(classes=2, per_class=5)
    go = tmp_path / "go"
    go.touch()
    p = _child(tmp_path, "hang-in-pack", root, tmp_path / "c", go)
    deadline = time.monotonic() + TIMEOUT
    while not Path(str(go) + ".inside").exists():
        assert p.poll() is None, p.communicate()[1][-3000:]
        assert time.monotonic() < deadline, "the child never reached the pack"
        time.sleep(0.05)
    entry = cache_entry(ImageFolder(str(root)), cache_dir=tmp_path / "c")
    assert not entry.exists()  # mid-pack: no entry that looks finished
    os.killpg(p.pid, signal.SIGKILL)
    p.communicate(timeout=TIMEOUT)
    assert entry.with_name(entry.name + ".pack.partial").is_dir()  # what the killed pack left
    again = _child(tmp_path, "plain", root, tmp_path / "c", go)
    res = _result(again)
    assert res["entry"] == str(entry) and res["packed"]
    _assert_holds(entry, ImageFolder(str(root)))
    assert sorted(os.listdir(tmp_path / "c")) == sorted([entry.name, entry.name + ".lock"])


def test_the_module_needs_no_torchvision_to_import():
    code = "import sys; sys.modules['torchvision'] = None\nimport fastload.cache\nprint('ok')"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=TIMEOUT, cwd=REPO)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stderr


def test_where_the_file_system_cannot_lock_every_process_packs_alone_and_one_entry_wins(make_folder, tmp_path):
    root = make_folder(classes=3, per_class=20, size=(160, 120))
    go = tmp_path / "go"
    procs = [_child(tmp_path, "nolock", root, tmp_path / "c", go) for _ in range(2)]
    time.sleep(1.0)
    go.touch()
    results = [_result(p) for p in procs]
    assert results[0]["entry"] == results[1]["entry"]
    entry = Path(results[0]["entry"])
    _assert_holds(entry, ImageFolder(str(root)))
    assert sorted(os.listdir(tmp_path / "c")) == sorted([entry.name, entry.name + ".lock"])  # the loser's staging is gone


def test_an_unlockable_cache_warns_and_packs(make_folder, tmp_path, monkeypatch, caplog):
    import types

    import fastload.cache as cache

    def flock(fd, op):
        raise OSError(37, "No locks available")

    monkeypatch.setattr(cache, "fcntl", types.SimpleNamespace(flock=flock, LOCK_EX=2, LOCK_NB=4))
    folder = ImageFolder(str(make_folder()))
    with caplog.at_level(logging.WARNING, logger="fastload.cache"):
        entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    assert any("cannot lock it" in r.getMessage() and "No locks available" in r.getMessage() for r in caplog.records)
    _assert_holds(entry, folder)
