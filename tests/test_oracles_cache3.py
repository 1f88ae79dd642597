"""fastload.cache, the dataset packed as bytes: its byte reader, a resumed pack of bytes, and the words for why.

Each expected value is written out from the module's documentation or from what the test made (pixels that
carry their label and index, ``encode_color``; class names whose ``repr`` the test spells out), never taken
from the code under test.
"""

from __future__ import annotations

import logging
import os
import warnings

import pytest

import fastload
import fastload.cache as cache_mod
from fastload.cache import cache_entry, cached_pack, file_list

from conftest import encode_color, write_image
from test_oracles_cache import colours
from test_oracles_cache2 import Files

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")


def two_images(d):
    """``d/a.bmp`` (label 0, index 0) and ``d/b.bmp`` (label 1, index 1), 8 x 8."""
    a = write_image(d / "a.bmp", encode_color(0, 0), size=(8, 8))
    b = write_image(d / "b.bmp", encode_color(1, 1), size=(8, 8))
    return str(a), str(b)


def test_class_names_that_read_back_otherwise_are_shown_cut_at_120_characters(tmp_path, caplog):
    """Long class names, one of them unused (a list file names only the classes of its rows): both lists in the
    info line are their ``repr`` cut at 120 characters, here ``['`` + 70 ``a`` + ``', '`` + 44 ``b``. Kills: the
    first list cut at 121."""
    d = tmp_path / "d"
    a, b = two_images(d)
    ds = Files(d, [(a, 0), (b, 1)], ["a" * 70, "b" * 70, "c"])
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        entry = cached_pack(ds, cache_dir=tmp_path / "c", progress=False)
    cut = "['" + "a" * 70 + "', '" + "b" * 44
    assert len(cut) == 120
    msgs = [r.getMessage() for r in caplog.records if r.name == "fastload.cache"]
    assert f"Files({d}): packing its files as a dataset of bytes (the class names read back from a list file as " \
        f"{cut}, not {cut})" in msgs
    assert colours(entry) == [(0, 0), (1, 1)]


def test_a_killed_pack_of_bytes_is_resumed(tmp_path, monkeypatch, caplog):
    """A dataset packed as bytes (an unused class), its pack killed just before it finished (a stand-in
    ``finalize`` raises as Ctrl-C would there): the next call resumes ``<entry>.pack.partial`` without a
    warning, and the entry holds each sample's own pixels and label. Kills: the resume (and overwrite)
    argument not passed on to the packer of bytes (it then refuses the leftover, twice, and the call fails)."""
    import fastload.packing.run as run

    d = tmp_path / "d"
    a, b = two_images(d)
    ds = Files(d, [(a, 0), (b, 1)], ["a", "b", "c"])
    c = tmp_path / "c"
    entry = cache_entry(ds, cache_dir=c)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(run, "finalize", killed)
        with pytest.raises(KeyboardInterrupt):
            cached_pack(ds, cache_dir=c, progress=False)
    assert (c / f"{entry.name}.pack.partial").is_dir() and not entry.exists()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="fastload"):
        assert cached_pack(ds, cache_dir=c, progress=False) == entry
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING] == []
    packed = fastload.Dataset(entry)
    assert packed.classes == ["a", "b", "c"] and [int(x) for x in packed.labels] == [0, 1]
    assert colours(entry) == [(0, 0), (1, 1)]


def test_the_byte_reader_reads_a_file_whole_and_without_a_warning(tmp_path):
    """One sample read by the byte reader with warnings as errors: its bytes are the file's, its label the
    sample's. Kills: the file opened with ``buffering=1``, which Python warns about in binary mode."""
    d = tmp_path / "d"
    a, b = two_images(d)
    files = file_list(Files(d, [(a, 0), (b, 1)], ["a", "b"]))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        data, label = cache_mod._FileBytes(files)[1]
    with open(b, "rb") as f:
        assert data == f.read()
    assert label == 1


@pytest.mark.parametrize("grown", [1, 2, 100])
def test_a_file_that_grew_after_its_fstat_is_read_to_one_byte_past_the_bound(tmp_path, monkeypatch, grown):
    """A file of exactly the byte reader's bound (set to its size) when ``fstat`` sees it, ``grown`` bytes
    appended right then: the reader returns its first bound + 1 bytes, no more (the packer then refuses them
    as more than the bound, naming bound + 1 bytes). Kills: bound + 2 read (two bytes past it), and the file
    read to its end (``read(None)``), both of which name another size."""
    d = tmp_path / "d"
    a, b = two_images(d)
    with open(a, "rb") as f:
        head = f.read()
    more = bytes(range(1, grown + 1))
    monkeypatch.setattr(cache_mod, "max_file_bytes", lambda max_pixels: len(head))
    reader = cache_mod._FileBytes(file_list(Files(d, [(a, 0), (b, 1)], ["a", "b"])))
    real = os.fstat

    def fstat_then_grow(fd):
        st = real(fd)
        with open(a, "ab") as f:
            f.write(more)
        return st

    with monkeypatch.context() as m:
        m.setattr(os, "fstat", fstat_then_grow)
        data, label = reader[0]
    assert data == head + more[:1] and label == 0


def test_a_torch_dataset_that_only_carries_samples_is_served(tmp_path):
    """A ``torch.utils.data.Dataset`` subclass that carries ``samples`` and ``classes`` and defines no item method
    of its own (``dataset[i]`` is torch's base, which the cache does not replace): accepted, and packed with each
    sample's pixels. Kills: torch's ``Dataset`` left out of the trusted classes (its ``__getitem__`` then read as
    an override)."""
    d = tmp_path / "d"
    a, b = two_images(d)

    class Carried(torch.utils.data.Dataset):
        def __init__(self):
            self.root = str(d)
            self.samples = [(a, 0), (b, 1)]
            self.classes = ["a", "b"]

    entry = cached_pack(Carried(), cache_dir=tmp_path / "c", progress=False)
    assert [int(x) for x in fastload.Dataset(entry).labels] == [0, 1]
    assert colours(entry) == [(0, 0), (1, 1)]


def test_a_lock_whose_close_fails_is_still_released_without_an_error(tmp_path, monkeypatch):
    """``close`` of the lock file failing (EIO, as on a network file system) when the lock is left: no error
    (the entry is already published), and the flock was released before, so another open file of the lock
    takes it at once. Kills: the close's OSError no longer suppressed."""
    import errno
    import fcntl

    path = tmp_path / "e.lock"
    lock = cache_mod._Lock(path, "Files(d)", tmp_path / "e")
    real_close = os.close
    with lock:
        held = lock.fd

        def close(fd):
            if fd == held:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            real_close(fd)

        monkeypatch.setattr(os, "close", close)
    monkeypatch.undo()
    real_close(held)
    other = os.open(path, os.O_RDWR)
    try:
        fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)  # raises BlockingIOError if the flock were still held
    finally:
        os.close(other)


def test_the_wait_logs_again_once_exactly_the_interval_has_passed(tmp_path, monkeypatch, caplog):
    """The waiting line is logged again once ``WAIT_LOG_EVERY`` seconds have passed, that many exactly
    included: with a clock that moves 1 s per reading and an interval of 1 s, every poll logs, the seconds so
    far 1, 2, 3. Kills: ``>`` for ``>=`` (then only every other poll, 1, 3, 5)."""
    import fcntl
    import threading
    import time
    import types

    ticks = iter(range(10**6))
    monkeypatch.setattr(cache_mod, "time", types.SimpleNamespace(monotonic=lambda: float(next(ticks)), sleep=time.sleep))
    monkeypatch.setattr(cache_mod, "WAIT_LOG_EVERY", 1.0)
    monkeypatch.setattr(cache_mod, "_POLL", 0.01)
    path = tmp_path / "e.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    done = threading.Event()

    def wait():
        with cache_mod._Lock(path, "Files(d)", tmp_path / "e"):
            done.set()

    waiting = lambda: [r.getMessage() for r in caplog.records if r.getMessage().startswith("waiting for")]  # noqa: E731
    with caplog.at_level(logging.INFO, logger="fastload.cache"):
        t = threading.Thread(target=wait, daemon=True)
        t.start()
        try:
            deadline = time.monotonic() + 60
            while len(waiting()) < 3 and t.is_alive() and time.monotonic() < deadline:
                time.sleep(0.01)
        finally:
            os.close(fd)
        t.join(60)
    assert done.is_set()
    lines = waiting()[:3]
    assert lines == [f"waiting for another process packing Files(d) into cache entry {tmp_path / 'e'} ({s} s so far)"
                     for s in (1, 2, 3)], lines


def test_a_cache_directory_that_is_no_directory_once_made_is_refused(tmp_path, monkeypatch):
    """The cache directory made, then found not to be one (replaced by a file in between: a stand-in ``stat``
    says so for that path only): a ConfigError naming it and what to pass. Kills: the message replaced by None."""
    import stat as stat_mod

    from fastload.errors import ConfigError

    c = tmp_path / "c"
    real = os.stat
    plain = real(__file__)
    assert stat_mod.S_ISREG(plain.st_mode)
    monkeypatch.setattr(os, "stat", lambda p, *a, **k: plain if os.fspath(p) == str(c) else real(p, *a, **k))
    with pytest.raises(ConfigError) as e:
        cache_entry(Files(tmp_path, [(__file__, 0)], ["a"]), cache_dir=c)
    monkeypatch.undo()
    assert str(e.value) == f"cache directory {c} is not a directory; pass cache_dir= or set $FASTLOAD_CACHE to one"
