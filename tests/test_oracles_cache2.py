"""fastload.cache: the entry's name and key, the lock, reuse against repack, and every refusal's message whole.

The expected values are written out by hand from the module's documentation: the entry is
``<root name made safe>-<first 32 hex digits of a SHA-256>`` over a JSON head (cache layout and record
format versions, class names, number of samples) and one line per sample (its absolute path, its
label, and ``os.stat``'s size, ``st_mtime_ns``, ``st_ctime_ns`` and inode, or ``!`` and the error of a
file that cannot be stat'ed). The lock is a real ``flock`` on ``<entry>.lock``: a lock the test takes on
its own open file of that path is another holder's lock (``flock`` locks belong to an open file, not a
process), and the call under test runs in a thread of this process, so what it waits for and what it
packs are the module's own code. Pixels carry their label and index (``encode_color``).
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import itertools
import locale
import logging
import os
import shutil
import socket
import string
import threading
import time
import types
from pathlib import Path

import pytest

import fastload
import fastload.cache as cache_mod
from fastload.cache import CACHE_VERSION, FileList, cache_entry, cached_pack, file_list
from fastload.errors import ConfigError, FormatError, PackError
from fastload.format import FORMAT_VERSION
from fastload.packing import journal
from fastload.packing.sources import MAX_CLASSES

from conftest import encode_color, write_image
from test_oracles_cache import colours

torchvision = pytest.importorskip("torchvision")
from torchvision.datasets import ImageFolder  # noqa: E402
from torchvision.datasets import folder as tv_folder  # noqa: E402

#: What every refusal of a dataset the cache cannot serve ends with.
PACK_IT = "pack what the dataset returns once with fastload.pack_dataset(dataset, OUT) and pass OUT to FastLoader"
WAIT = 60.0  # seconds a thread under test may take before the test calls it hung


class Files:
    """A file-based dataset reduced to what the cache reads: ``root``, ``samples``, ``classes`` (if given)."""

    def __init__(self, root, samples, classes=None):
        self.root = str(root)
        self.samples = samples
        if classes is not None:
            self.classes = classes




def bmp_folder(root: Path, per_class: int = 2) -> Path:
    """class_0, class_1 of 20x12 BMPs (every one the same file size), index in torchvision's order."""
    index = 0
    for label in range(2):
        for j in range(per_class):
            write_image(root / f"class_{label}" / f"img_{j}.bmp", encode_color(label, index), size=(20, 12))
            index += 1
    return root


def stat_sig(path) -> bytes:
    st = os.stat(path)
    return f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}".encode()


def documented_key(classes_json: str, rows: list[tuple[bytes, int, bytes]]) -> str:
    """The SHA-256 of the docstring's recipe; ``classes_json`` written out by hand (ASCII-only JSON)."""
    h = hashlib.sha256()
    head = f'{{"cache": {CACHE_VERSION}, "format": "{FORMAT_VERSION}", "classes": {classes_json}, "samples": {len(rows)}}}'
    h.update(head.encode("ascii"))
    for path, label, sig in rows:
        h.update(path + b"\0" + str(label).encode() + b"\0" + sig + b"\n")
    return h.hexdigest()


# ----------------------------------------------------------------------------- the entry's name


def test_the_entry_name_is_the_roots_safe_name_and_the_documented_sha256(tmp_path):
    """Kills: any field of the head or of a sample's line left out, reordered, or joined otherwise; the
    class names' JSON not ASCII-escaped; the wrong number of hex digits; a name that is not the root's."""
    data = tmp_path / "My data"
    data.mkdir()
    a = data / "a.bin"
    a.write_bytes(b"x" * 7)
    b = data / "b.bin"
    b.write_bytes(b"")
    odd = os.path.join(os.fsencode(data), b"\xff.bin")  # a name that is not UTF-8
    with open(odd, "wb") as f:
        f.write(b"yz")
    odd_str = os.fsdecode(odd)
    ds = Files(data, [(str(a), 1), (odd_str, 0), (str(b), 1)], ["caf\u00e9", 'say "hi"'])
    entry = cache_entry(ds, cache_dir=tmp_path / "c")
    key = documented_key(
        '["caf\\u00e9", "say \\"hi\\""]',
        [(os.fsencode(a), 1, stat_sig(a)), (odd, 0, stat_sig(odd)), (os.fsencode(b), 1, stat_sig(b))],
    )
    assert entry == (tmp_path / "c").resolve() / f"My_data-{key[:32]}"
    assert sorted(os.listdir(tmp_path / "c")) == []  # it creates nothing but the directory


def test_a_file_that_cannot_be_stated_enters_the_key_as_its_error(tmp_path):
    """A missing file as ``!2`` (ENOENT), a path below a regular file as ``!20`` (ENOTDIR), a path
    ``os.stat`` refuses outright (a NUL in it: only a hand-made FileList holds one) as the exception's
    name. Kills: the error's number or name replaced."""
    plain = tmp_path / "plain"
    plain.write_bytes(b"p")
    missing = str(tmp_path / "gone.jpg")
    below = str(plain / "x.jpg")
    ds = Files(tmp_path, [(missing, 0), (below, 0)], ["k"])
    entry = cache_entry(ds, cache_dir=tmp_path / "c")
    key = documented_key('["k"]', [(missing.encode(), 0, b"!2"), (below.encode(), 0, b"!20")])
    assert entry.name == f"{tmp_path.name}-{key[:32]}"
    nul = str(tmp_path / "a\0b")
    files = FileList("X", None, [nul], [0], ["k"])
    assert cache_mod._key(files) == documented_key('["k"]', [(nul.encode(), 0, b"!ValueError")])


def test_what_changes_the_entry_name_and_what_does_not(tmp_path):
    """The key follows every documented input: reading a file keeps the name; a chmod, a touch to the
    same times, a ``cp -p``-style replacement and a same-size rewrite with the mtime put back (each
    keeps size and mtime: only the status-change time or inode tell), a relabel, a renamed class, two
    samples swapped, a sample added each give another; a dataset of another type with the same
    samples, classes and root gets the same."""
    root = bmp_folder(tmp_path / "imgs")
    files = sorted(str(p) for p in root.rglob("*.bmp"))
    classes = ["class_0", "class_1"]
    base = [(files[0], 0), (files[1], 0), (files[2], 1), (files[3], 1)]
    c = tmp_path / "c"

    def name(samples=base, cls=classes):
        return cache_entry(Files(root, list(samples), list(cls)), cache_dir=c).name

    first = name()
    assert cache_entry(ImageFolder(str(root)), cache_dir=c).name == first  # another dataset, the same samples
    Path(files[0]).read_bytes()
    assert name() == first
    seen = {first}

    def changed(what):
        n = name()
        assert n not in seen, what
        seen.add(n)

    st = os.stat(files[1])
    os.chmod(files[1], 0o600)
    changed("chmod")
    os.utime(files[1], ns=(st.st_atime_ns, st.st_mtime_ns))
    changed("touch to the same times")
    victim = files[2]
    st = os.stat(victim)
    new = tmp_path / "new.bmp"
    write_image(new, encode_color(1, 99), size=(20, 12))
    shutil.copyfile(new, victim)  # cp -p: the content over the same file, then the old times
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert (os.stat(victim).st_size, os.stat(victim).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    changed("cp -p")
    tmp = tmp_path / "swap.bmp"
    write_image(tmp, encode_color(1, 98), size=(20, 12))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, victim)  # another inode, the same size and mtime
    changed("replaced by rename")
    before = name()
    assert name([(p, 1 - lab) if i == 0 else (p, lab) for i, (p, lab) in enumerate(base)]) not in seen | {before}
    assert name(cls=["class_0", "class_x"]) not in seen | {before}
    assert name([base[1], base[0], base[2], base[3]]) not in seen | {before}
    assert name(base + [base[0]]) not in seen | {before}
    assert name() == before


# ----------------------------------------------------------------------------- reuse and repack


def test_an_unchanged_dataset_is_reused_and_only_the_changed_one_repacks(tmp_path, caplog):
    """Two folders packed; one file of the second rewritten to other pixels with its size and mtime kept:
    the first is reused as it is (the debug line says so, nothing packed), the second packs a new entry
    with the new pixels and leaves its old entry as it was."""
    one = bmp_folder(tmp_path / "one")
    two = bmp_folder(tmp_path / "two")
    c = tmp_path / "c"
    e1 = cached_pack(ImageFolder(str(one)), cache_dir=c, progress=False)
    e2 = cached_pack(ImageFolder(str(two)), cache_dir=c, progress=False)
    stamp = [(e / "manifest.json").stat().st_mtime_ns for e in (e1, e2)]
    victim = two / "class_1" / "img_0.bmp"
    st = victim.stat()
    victim.write_bytes(write_image(tmp_path / "n.bmp", encode_color(1, 55), size=(20, 12)).read_bytes())
    os.utime(victim, ns=(st.st_atime_ns, st.st_mtime_ns))
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="fastload.cache"):
        again1 = cached_pack(ImageFolder(str(one)), cache_dir=c, progress=False)
        again2 = cached_pack(ImageFolder(str(two)), cache_dir=c, progress=False)
    msgs = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert again1 == e1 and again2 != e2
    assert msgs[0] == f"ImageFolder({one}): using cache entry {e1}"
    assert [m for m in msgs if "(once)" in m] == [f"packing ImageFolder({two}) into cache entry {again2} (once)"]
    assert colours(again2) == [(0, 0), (0, 1), (1, 55), (1, 3)]
    assert colours(e2) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert [(e / "manifest.json").stat().st_mtime_ns for e in (e1, e2)] == stamp


# ----------------------------------------------------------------------------- the lock


def _in_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t, out


def _waiting(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for another")]


def test_a_held_lock_makes_the_call_wait_then_it_packs(tmp_path, caplog):
    """While another open file of ``<entry>.lock`` holds its flock, the call waits: it logs one line
    (the next would come after a minute), packs nothing, creates nothing; once that holder is gone (its
    file closed, as the kernel closes a killed process's) it packs. Kills: a wait that does not wait, a
    log line every poll, the line's wording or entry."""
    root = bmp_folder(tmp_path / "imgs")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    lock = entry.with_name(entry.name + ".lock")
    fd = os.open(lock, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        try:
            t, out = _in_thread(lambda: cached_pack(folder, cache_dir=c, progress=False))
            deadline = time.monotonic() + WAIT
            while not _waiting(caplog) and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(1.0)
            assert t.is_alive(), out
            assert sorted(os.listdir(c)) == [lock.name]
            waited = _waiting(caplog)
        finally:
            os.close(fd)
        t.join(WAIT)
    assert not t.is_alive() and "error" not in out, out
    assert waited == [f"waiting for another process packing ImageFolder({root}) into cache entry {entry} (0 s so far)"]
    assert out["value"] == entry and colours(entry) == [(0, 0), (0, 1), (1, 2), (1, 3)]


def test_the_wait_logs_again_after_each_interval(tmp_path, caplog, monkeypatch):
    """``WAIT_LOG_EVERY`` seconds between two lines (here 0.5 s, not a minute), the seconds so far
    counting from the start of the wait."""
    monkeypatch.setattr(cache_mod, "WAIT_LOG_EVERY", 0.5)
    root = bmp_folder(tmp_path / "imgs")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    fd = os.open(entry.with_name(entry.name + ".lock"), os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        try:
            t, out = _in_thread(lambda: cached_pack(folder, cache_dir=c, progress=False))
            deadline = time.monotonic() + WAIT
            while not _waiting(caplog) and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.02)
            time.sleep(1.6)
        finally:
            os.close(fd)
        t.join(WAIT)
    assert out.get("value") == entry, out
    lines = [r for r in caplog.records if r.getMessage().startswith("waiting for another")]
    assert len(lines) >= 2, [r.getMessage() for r in lines]  # one at 0 s, then again after 0.5 s
    gaps = [b.created - a.created for a, b in zip(lines, lines[1:])]
    assert all(0.45 <= g for g in gaps), gaps  # never sooner (polls are 0.2 s apart: not every poll)
    assert lines[0].getMessage().endswith("(0 s so far)")
    for r in lines[1:]:  # "%.0f s so far": the seconds since the first line, rounded
        shown = int(r.getMessage().rsplit("(", 1)[1].split(" ")[0])
        assert abs(shown - (r.created - lines[0].created)) <= 0.5 + 0.1, (shown, r.created - lines[0].created)


def test_two_calls_at_once_pack_once(tmp_path, caplog):
    root = bmp_folder(tmp_path / "imgs", per_class=6)
    c = tmp_path / "c"
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        calls = [_in_thread(lambda: cached_pack(ImageFolder(str(root)), cache_dir=c, progress=False)) for _ in range(2)]
        for t, _ in calls:
            t.join(WAIT)
    outs = [out for _, out in calls]
    assert all("value" in o for o in outs), outs
    entry = outs[0]["value"]
    assert outs[1]["value"] == entry
    assert len([r for r in caplog.records if "(once)" in r.getMessage()]) == 1
    assert sorted(os.listdir(c)) == sorted([entry.name, entry.name + ".lock"])
    assert [i for _, i in colours(entry)] == list(range(12))


def test_a_stale_lock_file_and_staging_left_behind_do_not_block(tmp_path, caplog):
    """A lock file nobody holds (left by a process that died, whatever is in it) is taken at once, and
    stays; a finished pack left in ``<entry>.pack`` (published by nobody) is removed and packed again."""
    root = bmp_folder(tmp_path / "imgs")
    other = bmp_folder(tmp_path / "other")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    lock = entry.with_name(entry.name + ".lock")
    lock.write_text("12345\n")
    leftover = cached_pack(ImageFolder(str(other)), cache_dir=tmp_path / "elsewhere", progress=False)
    shutil.copytree(leftover, entry.with_name(entry.name + ".pack"))
    t0 = time.monotonic()
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        got = cached_pack(folder, cache_dir=c, progress=False)
    assert time.monotonic() - t0 < 30
    assert got == entry and _waiting(caplog) == []
    assert sorted(os.listdir(c)) == sorted([entry.name, lock.name]) and lock.read_text() == "12345\n"
    assert fastload.Dataset(entry).source_path(2) == str(root / "class_1" / "img_0.bmp")


def test_the_lock_is_released_and_forgotten_when_the_call_returns(tmp_path, monkeypatch):
    """While it packs, the lock's descriptor is in the list of held locks that a forked child closes;
    afterwards it is not (a later file reusing the number would be closed there), and another open
    file can take the lock at once."""
    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    lock = entry.with_name(entry.name + ".lock")
    during: list[int] = []
    _spy_pack(monkeypatch, c, before=lambda: during.extend(
        fd for fd in list(journal._HELD) if os.fstat(fd).st_ino == os.stat(lock).st_ino
    ))
    assert cached_pack(folder, cache_dir=c, progress=False) == entry
    assert len(during) == 1 and during[0] not in journal._HELD
    fd = os.open(lock, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises if still held
    finally:
        os.close(fd)
    assert os.path.getsize(lock) == 0  # the lock file stays empty


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
@pytest.mark.parametrize("kind", ["directory", "symlink", "fifo"])
def test_a_lock_path_that_is_not_a_regular_file_is_refused_whole(tmp_path, kind):
    """Kills: the lock opened through a symlink (O_NOFOLLOW lost: the link's target would be locked,
    and created if missing), the messages' path or wording."""
    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    lock = entry.with_name(entry.name + ".lock")
    target = tmp_path / "target"
    if kind == "directory":
        lock.mkdir()
        why = f"cannot open it ({os.strerror(errno.EISDIR)}); pass cache_dir= or set $FASTLOAD_CACHE to a writable directory"
        expected = f"cache lock {lock}: {why}"
    elif kind == "symlink":
        target.write_bytes(b"")
        lock.symlink_to(target)
        why = f"cannot open it ({os.strerror(errno.ELOOP)}); pass cache_dir= or set $FASTLOAD_CACHE to a writable directory"
        expected = f"cache lock {lock}: {why}"
    else:
        os.mkfifo(lock)
        expected = f"cache lock {lock} is not a regular file; remove it yourself"
    with pytest.raises(ConfigError) as e:
        cached_pack(folder, cache_dir=c, progress=False)
    assert str(e.value) == expected
    assert not entry.exists()


def _safe(name: str) -> str:
    """Runs of characters outside ``[A-Za-z0-9._-]`` as one ``_``, at most 40 characters."""
    ok = set(string.ascii_letters + string.digits + "._-")
    return "".join("".join(g) if k else "_" for k, g in itertools.groupby(name, key=lambda ch: ch in ok))[:40]


def _spy_pack(monkeypatch, c: Path, after=None, before=None) -> list:
    """Record (source, staging dir, the cache directory's listing) of each pack, then pack for real."""
    from fastload.packing.run import pack_like_pil_loader as real
    calls: list = []

    def spy(src, out, **kw):
        calls.append((src, Path(out), sorted(os.listdir(c))))
        if before is not None:
            before()
        res = real(src, out, **kw)
        if after is not None:
            after(Path(out))
        return res

    monkeypatch.setattr(cache_mod, "pack_like_pil_loader", spy)
    return calls


def test_what_a_pack_under_the_lock_keeps_beside_the_entry(tmp_path, monkeypatch):
    """Under the lock: the list file ``<entry>.pack.csv`` and the staging directory ``<entry>.pack``
    (the name a killed pack is resumed from); nothing of either afterwards."""
    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    calls = _spy_pack(monkeypatch, c)
    assert cached_pack(folder, cache_dir=c, progress=False) == entry
    [(src, staging, listing)] = calls
    assert Path(src) == c.resolve() / f"{entry.name}.pack.csv" and staging == entry.with_name(entry.name + ".pack")
    assert listing == sorted([entry.name + ".lock", entry.name + ".pack.csv"])
    assert sorted(os.listdir(c)) == sorted([entry.name, entry.name + ".lock"])


def test_where_the_file_system_cannot_lock_each_process_packs_into_its_own_staging(tmp_path, monkeypatch, caplog):
    """A stand-in ``fcntl`` whose flock fails as an NFS mount without a lock daemon does (ENOLCK; the real
    one cannot be made to): the warning whole, and the staging directory named for this host and pid."""

    def flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(cache_mod, "fcntl", types.SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB))
    root = bmp_folder(tmp_path / "imgs")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    calls = _spy_pack(monkeypatch, c)
    with caplog.at_level(logging.WARNING, logger="fastload.cache"):
        assert cached_pack(folder, cache_dir=c, progress=False) == entry
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"cache lock {entry}.lock: cannot lock it ({os.strerror(errno.ENOLCK)}); every process packs "
        f"ImageFolder({root}) on its own, the first to finish publishes the entry"
    ]
    [(_, staging, _)] = calls
    assert staging.name == f"{entry.name}.pack-{_safe(socket.gethostname())}-{os.getpid()}"
    assert sorted(os.listdir(c)) == sorted([entry.name, entry.name + ".lock"])


def test_an_entry_another_process_published_first_wins(tmp_path, monkeypatch):
    """The same pack published at the entry while this one packed (what a process packing on its own
    does): this one's staging is discarded and the entry returned. A file there instead: the rename's
    error, whole."""
    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    _spy_pack(monkeypatch, c, after=lambda staging: shutil.copytree(staging, entry))
    assert cached_pack(folder, cache_dir=c, progress=False) == entry
    assert sorted(os.listdir(c)) == sorted([entry.name, entry.name + ".lock"])
    assert colours(entry) == [(0, 0), (0, 1), (1, 2), (1, 3)]

    other = ImageFolder(str(bmp_folder(tmp_path / "other")))
    e2 = cache_entry(other, cache_dir=c)
    _spy_pack(monkeypatch, c, after=lambda staging: e2.write_bytes(b""))
    with pytest.raises(PackError) as e:
        cached_pack(other, cache_dir=c, progress=False)
    assert str(e.value) == (
        f"cannot pack ImageFolder({other.root}) into cache entry {e2}: cannot publish cache entry {e2} "
        f"({os.strerror(errno.ENOTDIR)}); if it exists but is incomplete, remove it"
    )


# ----------------------------------------------------------------------------- messages


def test_unusable_cache_directories_are_named_with_where_they_came_from(tmp_path, monkeypatch):
    """``(from $FASTLOAD_CACHE)`` only when the directory came from the environment, for both entry points."""
    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    afile = tmp_path / "afile"
    afile.write_text("x")
    tail = "; pass cache_dir= or set $FASTLOAD_CACHE to a directory"
    wtail = "; pass cache_dir= or set $FASTLOAD_CACHE to a writable directory"
    monkeypatch.delenv("FASTLOAD_CACHE", raising=False)
    home = tmp_path / "home"
    (home / ".cache").parent.mkdir()
    (home / ".cache").write_text("not a directory")
    monkeypatch.setenv("HOME", str(home))
    cases = [
        ({"cache_dir": afile}, None, f"cache directory {afile} is a file{tail}"),
        ({}, str(afile), f"cache directory {afile} (from $FASTLOAD_CACHE) is a file{tail}"),
        ({"cache_dir": afile}, str(tmp_path / "unused"), f"cache directory {afile} is a file{tail}"),
        ({}, None, f"cache directory {home}/.cache/fastload: cannot create it ({os.strerror(errno.ENOTDIR)}){wtail}"),
        ({"cache_dir": f"{tmp_path}/a\0b"}, None, f"cache directory {tmp_path}/a\\x00b: cannot create it (embedded null byte){wtail}"),
        ({"cache_dir": 3}, None, "cache_dir must be a directory path or None, got 3"),
    ]
    for kw, env, expected in cases:
        if env is None:
            monkeypatch.delenv("FASTLOAD_CACHE", raising=False)
        else:
            monkeypatch.setenv("FASTLOAD_CACHE", env)
        for call in (cache_entry, lambda ds, **k: cached_pack(ds, progress=False, **k)):
            with pytest.raises(ConfigError) as e:
                call(folder, **kw)
            assert str(e.value) == expected, (kw, env)


def test_datasets_the_cache_cannot_serve_are_refused_whole(tmp_path):
    root = bmp_folder(tmp_path / "imgs")

    class Thing:
        root = "/r"

    class Short(ImageFolder):
        def __len__(self):
            return 1

    not_files = (
        "is not file-based (it has no `samples` list of (path, class_index) like ImageFolder): FastLoader packs "
        "ImageFolder/DatasetFolder datasets itself; for another dataset, pack it once with "
        "fastload.pack_dataset(dataset, OUT) and pass OUT to FastLoader"
    )
    worded = Thing()
    worded.samples = "a.jpg"
    cases = [
        (Thing(), f"Thing(/r) {not_files}"),
        (worded, f"Thing(/r) {not_files}"),
        (
            ImageFolder(str(root), loader=tv_folder.accimage_loader),
            f"ImageFolder({root}): loads its files with accimage_loader, whose pixels the cache does not reproduce "
            f"(it stores what PIL's pil_loader gives); use the default loader with the PIL backend, or {PACK_IT}",
        ),
        (
            Short(str(root)),
            f"Short({root}): {Short.__qualname__}.__len__ gives 1, not the 4 `samples` the cache packs, so "
            f"FastLoader's indices would not be the dataset's; {PACK_IT}",
        ),
    ]
    for ds, expected in cases:
        with pytest.raises(ConfigError) as e:
            cached_pack(ds, cache_dir=tmp_path / "c", progress=False)
        assert str(e.value) == expected
    before = torchvision.get_image_backend()
    torchvision.set_image_backend("accimage")
    try:
        with pytest.raises(ConfigError) as e:
            cached_pack(ImageFolder(str(root)), cache_dir=tmp_path / "c", progress=False)
    finally:
        torchvision.set_image_backend(before)
    assert str(e.value) == (
        f"ImageFolder({root}): torchvision's image backend is 'accimage', so its default_loader decodes with "
        f"accimage, whose pixels the cache does not reproduce (it stores what PIL's pil_loader gives); call "
        f"torchvision.set_image_backend('PIL'), or {PACK_IT}"
    )
    assert not (tmp_path / "c").exists()


def test_bad_samples_and_classes_are_refused_whole(tmp_path):
    a = str(tmp_path / "a.jpg")
    d = f"Files({tmp_path})"
    s = f"{d}.samples"
    cases = [
        ([], ["x"], f"{d}: the dataset has no samples; nothing to pack"),
        ([(a, 0)], "xy", f"{d}: `classes` must be a list of class names, got str"),
        ([(a, 0)], ["x", 3], f"{d}: class name 3 is not a string; `classes` must be names"),
        ([(a, 0)], ["x", "x"], f"{d}: two classes have the same name; class names must be unique"),
        ([(a, 0)], [str(k) for k in range(MAX_CLASSES + 1)], f"{d}: {MAX_CLASSES + 1} classes; at most {MAX_CLASSES} (MAX_CLASSES) are supported"),
        ([(a, 0), (a,)], ["x"], f"{s}[1]: expected a (path, class_index) pair, got ('{a}',)"),
        # a long item shown cut at 120 characters: "('" and 118 of its 200 letters
        ([("q" * 200,)], ["x"], f"{s}[0]: expected a (path, class_index) pair, got ('" + "q" * 118),
        ([(3.5, 0)], ["x"], f"{s}[0]: path 3.5 is not a file path"),
        ([("", 0)], ["x"], f"{s}[0]: path '' is not a file path"),
        ([(a, True)], ["x"], f"{s}[0]: class index True is not an integer"),
        ([(a, 0), (a, 2)], ["x", "y"], f"{s}[1]: class index 2 is outside the 2 classes"),
        ([(a, -1)], ["x"], f"{s}[0]: class index -1 is outside the 1 classes"),
        ([(a, MAX_CLASSES)], None, f"{s}[0]: class index {MAX_CLASSES} is outside 0..{MAX_CLASSES - 1}"),
    ]
    for samples, classes, expected in cases:
        with pytest.raises(ConfigError) as e:
            cache_entry(Files(tmp_path, samples, classes), cache_dir=tmp_path / "c")
        assert str(e.value) == expected
    # what is accepted: label 0 and the last class; no classes: "0".."max label"; ImageNet's tuples: its wnids
    ok = file_list(Files(tmp_path, [(a, 0), ("rel.jpg", 2)], None))
    assert (ok.paths, ok.labels, ok.classes) == ([a, os.path.join(os.getcwd(), "rel.jpg")], [0, 2], ["0", "1", "2"])
    imagenet = Files(tmp_path, [(a, 1)], [("tench", "Tinca tinca"), ("goldfish",)])
    imagenet.wnids = ["n01440764", "n01443537"]
    assert file_list(imagenet).classes == ["n01440764", "n01443537"]


def test_an_entry_that_does_not_hold_the_dataset_is_refused_whole(tmp_path):
    """An entry directory holding another dataset's pack (other classes, another count, other labels), or
    a damaged manifest: a FormatError naming the entry, the dataset and the difference."""
    root = bmp_folder(tmp_path / "imgs")
    c = tmp_path / "c"
    packed = cached_pack(ImageFolder(str(root)), cache_dir=c, progress=False)
    files = sorted(str(p) for p in root.rglob("*.bmp"))
    d = f"Files({root})"
    cases = [
        (
            Files(root, [(f, i // 2) for i, f in enumerate(files)], ["a", "b"]),
            f"its classes ['class_0', 'class_1'] are not the dataset's ['a', 'b']",
        ),
        (Files(root, [(f, i // 2) for i, f in enumerate(files[:3])], ["class_0", "class_1"]), "it holds 4 samples and 0 skipped, the dataset 3"),
        (Files(root, [(f, 1 - i // 2) for i, f in enumerate(files)], ["class_0", "class_1"]), "its labels are not the dataset's class indices"),
    ]
    for ds, problem in cases:
        entry = cache_entry(ds, cache_dir=c)
        shutil.copytree(packed, entry)
        with pytest.raises(FormatError) as e:
            cached_pack(ds, cache_dir=c, progress=False)
        assert str(e.value) == f"cache entry {entry} does not hold {d}: {problem}; remove it and run again"
    ds = Files(root, [(f, i // 2) for i, f in enumerate(files)], ["k0", "k1"])
    entry = cache_entry(ds, cache_dir=c)
    entry.mkdir()
    with pytest.raises(FormatError) as e:
        cached_pack(ds, cache_dir=c, progress=False)
    assert str(e.value) == (
        f"cache entry {entry} exists without a manifest.json: it was not made by fastload's cache, or was "
        "damaged; remove it and run again"
    )
    (entry / "manifest.json").write_text("{")
    with pytest.raises(FormatError) as e:
        cached_pack(ds, cache_dir=c, progress=False)
    msg = str(e.value)
    head = f"cache entry {entry} does not hold {d}: "
    assert msg.startswith(head) and msg.endswith("; remove it and run again")
    assert "manifest.json" in msg[len(head):] and msg[len(head):] != "None; remove it and run again"


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_a_list_file_that_cannot_be_written_and_a_sample_that_is_not_a_file_are_named_whole(tmp_path):
    root = bmp_folder(tmp_path / "imgs")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    (c / f"{entry.name}.pack.csv").mkdir()
    with pytest.raises(PackError) as e:
        cached_pack(folder, cache_dir=c, progress=False)
    assert str(e.value) == (
        f"cannot pack ImageFolder({root}) into cache entry {entry}: cannot write the list of ImageFolder({root}) "
        f"to the cache ({entry}.pack.csv): {os.strerror(errno.EISDIR)}"
    )
    # class names "1", "10" do not survive a list file (integer labels): the files are packed as bytes
    fifo = tmp_path / "fifo.bmp"
    os.mkfifo(fifo)
    files = sorted(str(p) for p in root.rglob("*.bmp"))
    ds = Files(root, [(files[0], 0), (str(fifo), 1)], ["1", "10"])
    with pytest.raises(PackError) as e:
        cached_pack(ds, cache_dir=c, progress=False)
    assert f"dataset[1]: dataset raised OSError: {fifo}: not a regular file (FIFO);" in str(e.value)


def test_the_list_file_is_utf8_whatever_the_locale(tmp_path):
    """Under the C locale (ASCII) a folder of non-ASCII names still goes through the list file, so the
    records name their files (packed as a dataset of bytes they would name ``dataset[i]``)."""
    root = tmp_path / "imgs"
    write_image(root / "caf\u00e9" / "\u00e9t\u00e9.bmp", encode_color(0, 0), size=(8, 8))
    write_image(root / "th\u00e9" / "x.bmp", encode_color(1, 1), size=(8, 8))
    folder = ImageFolder(str(root))
    before = locale.setlocale(locale.LC_CTYPE)
    locale.setlocale(locale.LC_CTYPE, "C")
    try:
        entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    finally:
        locale.setlocale(locale.LC_CTYPE, before)
    ds = fastload.Dataset(entry)
    assert [ds.source_path(i) for i in range(2)] == [str(root / "caf\u00e9" / "\u00e9t\u00e9.bmp"), str(root / "th\u00e9" / "x.bmp")]
    assert ds.classes == ["caf\u00e9", "th\u00e9"]


def test_what_is_in_the_way_of_the_staging_names_is_named(tmp_path, caplog):
    """A file where the staging directory goes: the pack's refusal, inside the cache's own message. A file
    where an unfinished pack would be resumed from: the warning that it cannot be resumed (naming it),
    then the fresh pack's refusal."""
    root = bmp_folder(tmp_path / "imgs")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    staging = c.resolve() / f"{entry.name}.pack"
    staging.write_text("x")
    with pytest.raises(ConfigError) as e:
        cached_pack(folder, cache_dir=c, progress=False)
    head = f"cannot pack ImageFolder({root}) into cache entry {entry}: "
    assert str(e.value).startswith(head) and f"{staging} already exists" in str(e.value)[len(head):]
    staging.unlink()
    partial = c.resolve() / f"{entry.name}.pack.partial"
    partial.write_text("x")
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastload.cache"):
        with pytest.raises(ConfigError) as e:
            cached_pack(folder, cache_dir=c, progress=False)
    [warned] = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert warned.startswith(f"ImageFolder({root}): cannot resume the unfinished pack in the cache ({partial} is a file")
    assert warned.endswith("); starting it again")
    assert str(e.value).startswith(head) and f"{partial} is a file" in str(e.value)[len(head):]
    partial.unlink()
    assert cached_pack(folder, cache_dir=c, progress=False) == entry


def test_a_file_packed_as_bytes_is_read_whole_up_to_the_limit_and_refused_past_it(tmp_path, monkeypatch):
    """The byte reader's bound is ``max_file_bytes(DEFAULT_MAX_PIXELS)`` (over 700 MB: set here to the
    size of the test's JPEG, which the real one cannot be made to be): a file of exactly the bound is
    read to its last byte (a plain JPEG is stored byte for byte), one of a byte more refused by its size."""
    from fastload.format import DEFAULT_MAX_PIXELS

    root = tmp_path / "d"
    jpeg = write_image(root / "1" / "a.jpg", encode_color(0, 3), size=(16, 16), quality=90)
    big = write_image(root / "10" / "b.jpg", encode_color(1, 4), size=(16, 16), quality=95)
    n = jpeg.stat().st_size
    assert big.stat().st_size > n
    asked = []
    monkeypatch.setattr(cache_mod, "max_file_bytes", lambda max_pixels: asked.append(max_pixels) or n)
    entry = cached_pack(Files(root, [(str(jpeg), 0)], ["1", "10"]), cache_dir=tmp_path / "c", progress=False)
    assert asked == [DEFAULT_MAX_PIXELS]
    payload, label = fastload.Dataset(entry)[0]
    assert payload == jpeg.read_bytes() and int(label) == 0
    with pytest.raises(PackError) as e:
        cached_pack(Files(root, [(str(jpeg), 0), (str(big), 1)], ["1", "10"]), cache_dir=tmp_path / "c", progress=False)
    assert f"dataset[1]: dataset raised OSError: {big}: {big.stat().st_size} bytes, more than an image within the pixel limit can need;" in str(e.value)


def test_the_dataset_is_named_by_its_roots_file_system_path(tmp_path):
    """``os.fspath`` of the root, not its ``str``: a path-like root whose text differs is shown (and the
    entry named) by the path it stands for; a root that is no path at all by its ``str``."""

    class Where(os.PathLike):
        def __fspath__(self):
            return "/data/where"

        def __str__(self):
            return "somewhere"

    ds = Files(tmp_path, [])
    ds.root = Where()
    with pytest.raises(ConfigError) as e:
        cache_entry(ds, cache_dir=tmp_path / "c")
    assert str(e.value) == "Files(/data/where): the dataset has no samples; nothing to pack"
    ds.samples = [(str(tmp_path / "a.jpg"), 0)]
    assert cache_entry(ds, cache_dir=tmp_path / "c").name.startswith("where-")
    ds.root = 5
    ds.samples = []
    with pytest.raises(ConfigError) as e:
        cache_entry(ds, cache_dir=tmp_path / "c")
    assert str(e.value) == "Files(5): the dataset has no samples; nothing to pack"


def test_a_list_file_that_does_not_read_back_is_logged_and_the_files_packed_as_bytes(tmp_path, caplog):
    """An empty class name makes an empty label cell, a bad row to the list parser: the info line names the
    dataset, says what is done instead and why, in the parser's words (about line 2 of ``<entry>.pack.csv``),
    and the entry holds the dataset's classes and labels, its records naming ``dataset[i]``."""
    a = write_image(tmp_path / "d" / "a.bmp", encode_color(0, 0), size=(8, 8))
    b = write_image(tmp_path / "d" / "b.bmp", encode_color(1, 1), size=(8, 8))
    ds = Files(tmp_path / "d", [(str(a), 0), (str(b), 1)], ["", "b"])
    entry = cache_entry(ds, cache_dir=tmp_path / "c")
    d = f"Files({tmp_path / 'd'})"
    with caplog.at_level(logging.DEBUG, logger="fastload.cache"):
        assert cached_pack(ds, cache_dir=tmp_path / "c", progress=False) == entry
    msgs = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert f"{d}: packing its files as a dataset of bytes (its list file does not read back: SRC {entry}.pack.csv:2: " \
        f"expected 'path,label', got ['{a}', ''])" in msgs
    packed = fastload.Dataset(entry)
    assert packed.classes == ["", "b"] and [int(x) for x in packed.labels] == [0, 1]
    assert [packed.source_path(i) for i in range(2)] == ["dataset[0]", "dataset[1]"]
    assert colours(entry) == [(0, 0), (1, 1)]


def interrupted_pack(monkeypatch, listed, staging, *, on_error: str) -> None:
    """Pack ``listed`` into ``staging`` as the cache does, interrupted (Ctrl-C) just before it finishes:
    what a killed packer leaves behind."""
    import fastload.packing.run as run

    def killed(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(run, "finalize", killed)
        with pytest.raises(KeyboardInterrupt):
            run.pack_like_pil_loader(listed, staging, on_error=on_error, progress=False)


def test_a_resumed_pack_that_left_images_out_says_so(tmp_path, monkeypatch, caplog):
    """``<entry>.pack.partial`` left by a pack of the same list that skips bad images (``on_error="skip"``,
    stopped just before it finished: a stand-in ``finalize`` raises as a kill would land there) is resumed,
    and the entry it publishes lacks that image: the warning names how many of how many, the first one
    and its reason (as the entry's manifest records them), and how many FastLoader reads."""
    import json

    import fastload.packing.run as run

    root = bmp_folder(tmp_path / "imgs")
    bad = root / "class_1" / "img_0.bmp"
    bad.write_bytes(b"BM not a bitmap")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    staging = c.resolve() / f"{entry.name}.pack"
    rows = ["path,label"] + [f"{p},{folder.classes[k]}" for p, k in folder.samples]
    listed = c.resolve() / f"{entry.name}.pack.csv"
    listed.write_text("\n".join(rows) + "\n", encoding="utf-8")

    interrupted_pack(monkeypatch, listed, staging, on_error="skip")
    assert (c / f"{entry.name}.pack.partial").is_dir()
    with caplog.at_level(logging.WARNING, logger="fastload.cache"):
        assert cached_pack(folder, cache_dir=c, progress=False) == entry
    [reason] = [s["reason"] for s in json.loads((entry / "manifest.json").read_text())["skipped"]]
    [warned] = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert warned == (
        f"1 of 4 images of ImageFolder({root}) could not be packed and are left out (the first: {bad}: {reason}); "
        "FastLoader reads the other 3"
    )
    assert reason and colours(entry) == [(0, 0), (0, 1), (1, 3)]


# ----------------------------------------------------------------------------- classes, verification, staging


def test_classes_that_are_not_names_are_refused_unless_they_are_imagenets(tmp_path):
    """Tuples of names are taken only with ``wnids``, one string per class (torchvision's ``ImageNet``);
    tuples alone, too few wnids or a wnid that is no string: the first class that is not a string named,
    its repr cut at 80 characters. Kills: the three conditions joined by ``or``, another cut."""
    a = str(tmp_path / "a.jpg")
    d = f"Files({tmp_path})"
    tench = ("tench", "Tinca tinca")

    def refused(classes, wnids=None):
        ds = Files(tmp_path, [(a, 0)], classes)
        if wnids is not None:
            ds.wnids = wnids
        with pytest.raises(ConfigError) as e:
            file_list(ds)
        return str(e.value)

    first = f"{d}: class name ('tench', 'Tinca tinca') is not a string; `classes` must be names"
    assert refused([tench, ("goldfish",)]) == first
    assert refused([tench, ("goldfish",)], wnids=["n01440764"]) == first
    assert refused([tench, ("goldfish",)], wnids=["n01440764", 7]) == first
    assert refused([tench, "goldfish"], wnids=["n01440764", "n01443537"]) == first  # not all tuples
    long = ("x" * 100,)  # repr: ('xxx...',) 105 characters, the first 80 shown: ( ' and 78 x
    assert refused(["ok", long]) == f"{d}: class name ('{'x' * 78} is not a string; `classes` must be names"
    ok = Files(tmp_path, [(a, 1)], [["tench"], ["goldfish", "Carassius auratus"]])  # lists as tuples
    ok.wnids = ("n01440764", "n01443537")
    assert file_list(ok).classes == ["n01440764", "n01443537"]


def test_an_entry_with_other_long_class_names_is_refused_with_both_lists_cut(tmp_path):
    """Each list of class names shown as its repr cut at 120 characters: two names of 60 characters make
    a repr of 128, ``['`` + 60 + ``', '`` + 54 of it shown."""
    root = tmp_path / "imgs"
    p, q = "p" * 60, "q" * 60
    for label, name in enumerate((p, q)):
        write_image(root / name / "i.bmp", encode_color(label, label), size=(8, 8))
    c = tmp_path / "c"
    packed = cached_pack(ImageFolder(str(root)), cache_dir=c, progress=False)
    files = [str(root / p / "i.bmp"), str(root / q / "i.bmp")]
    ds = Files(root, [(files[0], 0), (files[1], 1)], ["a" * 60, "b" * 60])
    entry = cache_entry(ds, cache_dir=c)
    shutil.copytree(packed, entry)
    with pytest.raises(FormatError) as e:
        cached_pack(ds, cache_dir=c, progress=False)
    theirs = "['" + "p" * 60 + "', '" + "q" * 54
    ours = "['" + "a" * 60 + "', '" + "b" * 54
    assert len(theirs) == len(ours) == 120
    assert str(e.value) == (
        f"cache entry {entry} does not hold Files({root}): its classes {theirs} are not the dataset's {ours}; "
        "remove it and run again"
    )


def test_an_image_that_cannot_be_packed_is_refused_with_the_whole_advice(tmp_path):
    """The pack's complaint about the file between the dataset's name and the advice, written out whole;
    nothing but the lock is left in the cache directory."""
    root = bmp_folder(tmp_path / "imgs")
    bad = root / "class_1" / "img_0.bmp"
    bad.write_bytes(b"BM not a bitmap")
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    with pytest.raises(PackError) as e:
        cached_pack(folder, cache_dir=c, progress=False)
    msg = str(e.value)
    head = f"cannot pack ImageFolder({root}) into cache entry {entry}: ImageFolder({root}): "
    tail = (
        "; FastLoader keeps every sample of a torchvision dataset at its own index, so it packs all of them or "
        "none: fix or remove that file, or pack the folder with `fastload pack` (which skips such files) and "
        "pass the packed directory"
    )
    assert msg.startswith(head) and msg.endswith(tail), msg
    assert str(bad) in msg[len(head):-len(tail)]
    assert sorted(os.listdir(c)) == [entry.name + ".lock"]


def test_an_unfinished_pack_of_another_list_is_started_again(tmp_path, monkeypatch, caplog):
    """``<entry>.pack.partial`` left by a pack of another list under the same name (the source changed:
    it cannot be resumed) is warned about and replaced by a fresh pack of the dataset, whose entry holds
    the dataset's own pixels."""
    import fastload.packing.run as run

    root = bmp_folder(tmp_path / "imgs")
    other = bmp_folder(tmp_path / "other", per_class=1)
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    staging = c.resolve() / f"{entry.name}.pack"
    partial = c.resolve() / f"{entry.name}.pack.partial"
    listed = c.resolve() / f"{entry.name}.pack.csv"
    rows = ["path,label"] + [f"{p},class_{k}" for p, k in ImageFolder(str(other)).samples]
    listed.write_text("\n".join(rows) + "\n", encoding="utf-8")

    interrupted_pack(monkeypatch, listed, staging, on_error="fail")
    listed.unlink()
    assert partial.is_dir()
    with caplog.at_level(logging.WARNING, logger="fastload.cache"):
        assert cached_pack(folder, cache_dir=c, progress=False) == entry
    [warned] = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert warned.startswith(
        f"ImageFolder({root}): cannot resume the unfinished pack in the cache (cannot resume {partial}: the source changed"
    ), warned
    assert warned.endswith("); starting it again")
    assert colours(entry) == [(0, 0), (0, 1), (1, 2), (1, 3)]
    assert sorted(os.listdir(c)) == sorted([entry.name, entry.name + ".lock"])


def test_a_pack_that_does_not_hold_the_dataset_is_removed_and_reported(tmp_path, monkeypatch):
    """A stand-in packer that packs another folder (three classes) into the staging directory, as the real
    one never does: the verification's finding in the message, the staging directory removed, no entry."""
    from fastload.packing.run import pack_like_pil_loader as real

    root = bmp_folder(tmp_path / "imgs")
    other = tmp_path / "other"
    for k in range(3):
        write_image(other / f"class_{k}" / "i.bmp", encode_color(k, k), size=(8, 8))
    folder = ImageFolder(str(root))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    seen = []

    def wrong(src, out, **kw):
        seen.append(Path(out))
        return real(str(other), out, on_error="fail", progress=False)

    monkeypatch.setattr(cache_mod, "pack_like_pil_loader", wrong)
    with pytest.raises(PackError) as e:
        cached_pack(folder, cache_dir=c, progress=False)
    assert str(e.value) == (
        f"cannot pack ImageFolder({root}) into cache entry {entry}: the pack of ImageFolder({root}) does not match "
        "the dataset: its classes ['class_0', 'class_1', 'class_2'] are not the dataset's ['class_0', 'class_1']; "
        "this is a fastload bug, please report it"
    )
    assert seen == [entry.with_name(entry.name + ".pack")]
    assert sorted(os.listdir(c)) == [entry.name + ".lock"]


def test_a_length_of_its_own_on_a_dataset_of_no_torch_class_is_checked_too(tmp_path):
    """A duck-typed dataset (no torchvision or torch base) whose ``__len__`` is not the number of its
    ``samples``: refused, the length shown. One whose ``__len__`` agrees is served. Kills: the length
    checked only on trusted classes."""
    a, b = str(tmp_path / "a.jpg"), str(tmp_path / "b.jpg")

    class Listed(Files):
        def __len__(self):
            return self.n

    for cls, n, shown in ((Listed, 1, "1"), (Listed, 3, "3")):
        ds = cls(tmp_path, [(a, 0), (b, 0)], ["k"])
        ds.n = n
        with pytest.raises(ConfigError) as e:
            cache_entry(ds, cache_dir=tmp_path / "c")
        assert str(e.value) == (
            f"{cls.__name__}({tmp_path}): {cls.__qualname__}.__len__ gives {shown}, not the 2 `samples` the cache "
            f"packs, so FastLoader's indices would not be the dataset's; {PACK_IT}"
        )
    ok = Listed(tmp_path, [(a, 0), (b, 0)], ["k"])
    ok.n = 2
    assert cache_entry(ok, cache_dir=tmp_path / "c").name.startswith(f"{tmp_path.name}-")


def test_a_loader_is_named_by_its_qualified_name_or_else_its_type(tmp_path):
    """A function by its ``__qualname__``; an object that has none (a callable instance) by its class's
    name. Kills: the type of something else named."""
    root = bmp_folder(tmp_path / "imgs")

    def mine(path):
        return tv_folder.pil_loader(path)

    class Reader:
        def __call__(self, path):
            return tv_folder.pil_loader(path)

    for loader, name in ((mine, mine.__qualname__), (Reader(), "Reader")):
        with pytest.raises(ConfigError) as e:
            cache_entry(ImageFolder(str(root), loader=loader), cache_dir=tmp_path / "c")
        assert str(e.value) == (
            f"ImageFolder({root}): loads its files with a custom loader ({name}), whose images FastLoader cannot "
            "reproduce: FastLoader decodes the files as RGB images like torchvision's default_loader; use the "
            f"default loader, or {PACK_IT}"
        )


def test_without_torchvision_a_duck_typed_dataset_is_served_and_a_loader_refused(tmp_path, monkeypatch):
    """torchvision made unimportable (``sys.modules[name] = None``, Python's own way to make an import
    fail): a dataset of no torchvision class and no loader still gets its entry, its ``__getitem__``
    checked against torch's ``Dataset`` alone; one with a loader is refused, naming it. Kills: a stand-in
    for the missing module that is not None, the loader's name lost."""
    import sys

    for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "torchvision", None)
    a = str(tmp_path / "a.jpg")
    ds = Files(tmp_path, [(a, 0)], ["k"])
    assert cache_entry(ds, cache_dir=tmp_path / "c").name.startswith(f"{tmp_path.name}-")

    def mine(path):
        return path

    ds.loader = mine
    with pytest.raises(ConfigError) as e:
        cache_entry(ds, cache_dir=tmp_path / "c")
    assert str(e.value) == (
        f"Files({tmp_path}): loads its files with {mine.__qualname__}, and torchvision (whose default_loader the "
        f"cache reproduces) is not importable; {PACK_IT}"
    )


def test_a_length_that_raises_is_shown_as_none(tmp_path):
    class Broken(Files):
        def __len__(self):
            raise RuntimeError("no length")

    ds = Broken(tmp_path, [(str(tmp_path / "a.jpg"), 0)], ["k"])
    with pytest.raises(ConfigError) as e:
        cache_entry(ds, cache_dir=tmp_path / "c")
    assert str(e.value) == (
        f"Broken({tmp_path}): {Broken.__qualname__}.__len__ gives None, not the 1 `samples` the cache packs, so "
        f"FastLoader's indices would not be the dataset's; {PACK_IT}"
    )


def test_samples_without_a_length_are_not_file_based(tmp_path):
    """``samples`` that can be iterated but has no length (a generator) is refused as a dataset that is not
    file-based, before anything is read. Kills: the three conditions joined otherwise."""
    a = str(tmp_path / "a.jpg")
    ds = Files(tmp_path, (s for s in [(a, 0)]), ["k"])
    with pytest.raises(ConfigError) as e:
        cache_entry(ds, cache_dir=tmp_path / "c")
    assert str(e.value) == (
        f"Files({tmp_path}) is not file-based (it has no `samples` list of (path, class_index) like ImageFolder): "
        "FastLoader packs ImageFolder/DatasetFolder datasets itself; for another dataset, pack it once with "
        "fastload.pack_dataset(dataset, OUT) and pass OUT to FastLoader"
    )


def test_exactly_max_classes_classes_are_accepted(tmp_path):
    """``MAX_CLASSES`` names, the last one used: accepted (one more is refused: see above)."""
    names = [f"c{k}" for k in range(MAX_CLASSES)]
    a = str(tmp_path / "a.jpg")
    got = file_list(Files(tmp_path, [(a, MAX_CLASSES - 1)], names))
    assert got.labels == [MAX_CLASSES - 1] and len(got.classes) == MAX_CLASSES and got.classes[-1] == f"c{MAX_CLASSES - 1}"


def test_a_path_that_is_no_path_is_shown_cut_at_120(tmp_path):
    """An int of 131 digits as a path: its repr cut to 120 characters, ``1`` and 119 zeros; the same cut for a
    path with a NUL and one that cannot be encoded. Kills: a cut at 121 in any of the three messages."""
    with pytest.raises(ConfigError) as e:
        file_list(Files(tmp_path, [(10**130, 0)], ["k"]))
    assert str(e.value) == f"Files({tmp_path}).samples[0]: path 1{'0' * 119} is not a file path"
    # a long path with a NUL, and one with a lone surrogate: their reprs cut the same way, "'/" and 118 letters
    with pytest.raises(ConfigError) as e:
        file_list(Files(tmp_path, [("/" + "a" * 200 + "\0", 0)], ["k"]))
    assert str(e.value) == f"Files({tmp_path}).samples[0]: path '/{'a' * 118} is not a file path"
    with pytest.raises(ConfigError) as e:
        file_list(Files(tmp_path, [("/" + "a" * 200 + "\ud800", 0)], ["k"]))
    assert str(e.value) == f"Files({tmp_path}).samples[0]: path '/{'a' * 118} is not a file path (it cannot be encoded)"


def test_a_private_staging_is_named_for_the_host_made_safe(tmp_path, monkeypatch):
    """Where the file system cannot lock: the staging directory ``<entry>.pack-<host>-<pid>``, the host
    name (a stand-in: this machine's is already safe) with runs of characters outside ``[A-Za-z0-9._-]``
    as one ``_`` (capitals kept), cut at 40. Kills: the pattern or the cut changed (``A-Z`` lowered)."""

    def flock(fd, op):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(cache_mod, "fcntl", types.SimpleNamespace(flock=flock, LOCK_EX=fcntl.LOCK_EX, LOCK_NB=fcntl.LOCK_NB))
    monkeypatch.setattr(socket, "gethostname", lambda: "Node 7//GPU\u00e9" + "x" * 40)
    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    c = tmp_path / "c"
    entry = cache_entry(folder, cache_dir=c)
    calls = _spy_pack(monkeypatch, c)
    assert cached_pack(folder, cache_dir=c, progress=False) == entry
    [(_, staging, _)] = calls
    host = "Node_7_GPU_" + "x" * 29  # 11 + 29 = 40
    assert staging.name == f"{entry.name}.pack-{host}-{os.getpid()}"


def test_the_progress_wish_reaches_the_packer(tmp_path, monkeypatch):
    """``progress`` (default True) handed to the packer as given, for a list file and for files packed as
    bytes (class names ``1``, ``10`` that a list file cannot carry)."""
    from fastload.packing.run import pack_like_pil_loader as real

    got = []

    def spy(src, out, **kw):
        got.append((isinstance(src, (str, os.PathLike)), kw["progress"]))
        return real(src, out, **kw)

    monkeypatch.setattr(cache_mod, "pack_like_pil_loader", spy)
    root = bmp_folder(tmp_path / "imgs")
    files = sorted(str(p) for p in root.rglob("*.bmp"))
    c = tmp_path / "c"
    cached_pack(ImageFolder(str(root)), cache_dir=c)
    cached_pack(Files(root, [(files[0], 0)], ["1", "10"]), cache_dir=c)
    cached_pack(Files(root, [(files[1], 0)], ["1", "10"]), cache_dir=c, progress=False)
    cached_pack(Files(root, [(files[2], 0), (files[3], 1)], ["a", "b"]), cache_dir=c, progress=0)
    assert got == [(True, True), (False, True), (False, False), (True, False)]


def test_a_path_the_list_file_would_change_is_packed_as_bytes(tmp_path, caplog):
    """A file whose name ends in a space: the list parser strips a cell's spaces, so the list file would
    name another path (with the same label). Every sample must read back as its own path *and* label
    before the list file is used; here the files are packed as bytes, each record its own pixels. Kills:
    ``or`` for the second ``and`` of that check (a matching label then passes a changed path, and the
    pack looks for ``a.bmp``, which does not exist)."""
    a = write_image(tmp_path / "d" / "a.bmp", encode_color(0, 0), size=(8, 8))
    spaced = tmp_path / "d" / "a.bmp "
    os.rename(a, spaced)
    b = write_image(tmp_path / "d" / "b.bmp", encode_color(1, 1), size=(8, 8))
    ds = Files(tmp_path / "d", [(str(spaced), 0), (str(b), 1)], ["a", "b"])
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        entry = cached_pack(ds, cache_dir=tmp_path / "c", progress=False)
    msgs = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert f"Files({tmp_path / 'd'}): packing its files as a dataset of bytes (the path '{spaced}' reads back from a " \
        f"list file as '{tmp_path / 'd' / 'a.bmp'}')" in msgs
    packed = fastload.Dataset(entry)
    assert [packed.source_path(i) for i in range(2)] == ["dataset[0]", "dataset[1]"]
    assert colours(entry) == [(0, 0), (1, 1)]


def _not_utf8_name(d: Path) -> str:
    """``d/x<FF>.bmp`` as ``os.fsdecode`` gives it: a lone surrogate for the byte that is not UTF-8."""
    return os.fsdecode(os.fsencode(str(d)) + b"/x\xff.bmp")


#: (class names, the first file's name or a function of the folder, the reason the info line gives): each way a
#: dataset's samples cannot go through a list file, and the words for it, written out
WHY_BYTES = [
    (["a", "b", "c"], "a.bmp", "the class names read back from a list file as ['a', 'b'], not ['a', 'b', 'c']"),
    ([" a", "b"], "a.bmp", "the class names read back from a list file as ['a', 'b'], not [' a', 'b']"),
    (["a\udcff", "b"], "a.bmp", "the class name 'a\\udcff' is not UTF-8 text, which a list file holds"),
    (["a", "b"], _not_utf8_name, "the path {d}/x\\xff.bmp is not UTF-8 text, which a list file holds"),
    # every cell quoted, so the row stays whole; the parser reads line ends universally: \r comes back \n
    (["a", "b"], "a\rb.bmp", "the path '{d}/a\\rb.bmp' reads back from a list file as '{d}/a\\nb.bmp'"),
]


@pytest.mark.parametrize("classes, first, why", WHY_BYTES, ids=["unused-class", "spaced-class", "surrogate-class", "bytes-path", "carriage-return"])
def test_why_a_dataset_is_packed_as_bytes_is_said_in_its_own_words(tmp_path, caplog, classes, first, why):
    """A class no sample has (a list file names only the classes of its rows), a class name the parser would
    strip, a class name or a file name that is not UTF-8: the info line gives that reason (the class names
    read back, or the name that cannot be written), and the entry holds every sample's own pixels and label
    under the dataset's classes; a file name with a carriage return: the path and what it reads back as.
    Written for: one reason, about class names, given for every case (a path ending in a space or of bytes
    was said to be about class names); and the list file written with only cells holding a newline quoted
    (a bare carriage return ended the row; the reason was the parser's complaint about a row cut in two)."""
    d = tmp_path / "d"
    a = write_image(d / "a.bmp", encode_color(0, 0), size=(8, 8))
    name = first(d) if callable(first) else str(d / first)
    os.rename(a, name)
    b = write_image(d / "b.bmp", encode_color(1, 1), size=(8, 8))
    ds = Files(d, [(name, 0), (str(b), 1)], classes)
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        entry = cached_pack(ds, cache_dir=tmp_path / "c", progress=False)
    msgs = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert f"Files({d}): packing its files as a dataset of bytes ({why.format(d=d)})" in msgs
    packed = fastload.Dataset(entry)
    assert [int(x) for x in packed.labels] == [0, 1]
    assert [packed.source_path(i) for i in range(2)] == ["dataset[0]", "dataset[1]"]
    assert colours(entry) == [(0, 0), (1, 1)]


def test_the_lock_file_is_created_with_the_permissions_the_umask_leaves_of_rw(tmp_path):
    """``<entry>.lock`` is created 0o666 less the umask, as a file should be (0o664 under umask 002, a cache
    a group shares), never executable. Kills: the mode argument of its ``os.open`` dropped (0o777: 0o775)."""
    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    old = os.umask(0o002)
    try:
        entry = cached_pack(folder, cache_dir=tmp_path / "c", progress=False)
    finally:
        os.umask(old)
    assert oct(os.stat(entry.with_name(entry.name + ".lock")).st_mode & 0o777) == oct(0o664)


def test_a_sample_that_cannot_be_opened_is_named_with_why(tmp_path):
    """A sample that is a dangling symlink, packed as bytes (class names ``1``, ``10``): the pack fails naming
    the sample, its path and the operating system's reason. Kills: that OSError's message replaced by None."""
    root = bmp_folder(tmp_path / "imgs")
    files = sorted(str(p) for p in root.rglob("*.bmp"))
    dangling = tmp_path / "dangling.bmp"
    os.symlink(tmp_path / "gone.bmp", dangling)
    ds = Files(root, [(files[0], 0), (str(dangling), 1)], ["1", "10"])
    with pytest.raises(PackError) as e:
        cached_pack(ds, cache_dir=tmp_path / "c", progress=False)
    assert f"dataset[1]: dataset raised OSError: {dangling}: cannot open it ({os.strerror(errno.ENOENT)});" in str(e.value)


def test_an_entry_of_other_pixels_is_refused_naming_them(tmp_path):
    """An entry whose manifest says other pixels than pil_loader's (``options.pixels`` edited to ``PIL 9``):
    refused, the message showing the value found. Kills: another key looked up for the message (None shown)."""
    import json

    folder = ImageFolder(str(bmp_folder(tmp_path / "imgs")))
    c = tmp_path / "c"
    entry = cached_pack(folder, cache_dir=c, progress=False)
    m = json.loads((entry / "manifest.json").read_text())
    m["options"]["pixels"] = "PIL 9"
    (entry / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(FormatError) as e:
        cached_pack(folder, cache_dir=c, progress=False)
    assert str(e.value) == (
        f"cache entry {entry} does not hold ImageFolder({tmp_path / 'imgs'}): it was not packed with the pixels of "
        "torchvision's pil_loader (options.pixels 'PIL 9'); remove it and run again"
    )
