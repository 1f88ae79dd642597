"""fastload.store's page-cache readings and header statistics, against hand-built inputs.

``process_memory`` against a ``/proc/self/status`` text written out by hand (its kB values times
1024, the fields it does not read ignored, a malformed file read as zeros). ``resident_bytes`` and
``drop_cached`` against what the page cache must hold of a file just written and read (all of it, a
size that is not a whole number of pages included) and after the drop (none of it, on a disk
filesystem). ``HeaderStats`` against counts made by hand from the flag bits of ``fastload.format``.
``fastload.store.files``' refusals (a directory, a FIFO, a dangling symlink, a file outside its
dataset, a size that changed) against their errno and reason written out.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import hashlib
import io
import mmap
import os
import stat
import time
import warnings

import numpy as np
import pytest

from fastload.errors import CorruptDataError
from fastload.format import RecordHeader
from fastload.store import files, hashes, pagecache

STATUS = """Name:\tpython
Umask:\t0022
VmPeak:\t  999999 kB
VmRSS:\t  123456 kB
RssAnon:\t   100000 kB
RssFile:\t    20000 kB
RssShmem:\t    3456 kB
VmSwap:\t       7 kB
"""


def fake_open(text: str):
    def opener(path, *args, **kwargs):
        assert path == "/proc/self/status"
        return io.StringIO(text)

    return opener


def test_process_memory_reads_the_four_fields_in_bytes(monkeypatch) -> None:
    """Each of VmRSS, RssAnon, RssFile, RssShmem is reported under its own name, kB times 1024."""
    monkeypatch.setattr(pagecache, "open", fake_open(STATUS), raising=False)
    assert pagecache.process_memory() == {"rss": 123456 * 1024, "anon": 100000 * 1024, "file": 20000 * 1024, "shmem": 3456 * 1024}


@pytest.mark.parametrize(
    "text",
    ["VmRSS:\tmany kB\n", "VmRSS:\n"],
    ids=["not-a-number", "no-value"],
)
def test_process_memory_of_a_malformed_status_is_zeros(monkeypatch, text: str) -> None:
    """A status line that does not parse gives zeros, not an error."""
    monkeypatch.setattr(pagecache, "open", fake_open(text), raising=False)
    assert pagecache.process_memory() == {"rss": 0, "anon": 0, "file": 0, "shmem": 0}


def test_process_memory_without_proc_is_zeros(monkeypatch) -> None:
    """No /proc (another platform) gives zeros for every field."""

    def missing(*args, **kwargs):
        raise FileNotFoundError("/proc/self/status")

    monkeypatch.setattr(pagecache, "open", missing, raising=False)
    assert pagecache.process_memory() == {"rss": 0, "anon": 0, "file": 0, "shmem": 0}


def test_process_memory_of_this_process_matches_its_status() -> None:
    """The real reading: rss is VmRSS of /proc/self/status (read here by hand), within what a read allocates."""
    if not os.path.exists("/proc/self/status"):
        pytest.skip("no /proc")
    got = pagecache.process_memory()
    with open("/proc/self/status") as f:
        rss = next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
    assert set(got) == {"rss", "anon", "file", "shmem"}
    assert abs(got["rss"] - rss) < 64 * 1024 * 1024
    assert got["anon"] > 0 and got["file"] > 0


@pytest.mark.parametrize("pages,extra", [(0, 1), (3, 5), (4, 0)])
def test_resident_bytes_of_a_file_just_read_is_its_size_and_zero_after_the_drop(tmp_path, pages: int, extra: int) -> None:
    """A file written and read is all in the page cache (its size, not a page multiple); after drop_cached none of it."""
    size = pages * mmap.PAGESIZE + extra
    p = tmp_path / "f.bin"
    p.write_bytes(os.urandom(size))
    assert p.read_bytes()  # in the page cache now
    assert pagecache.resident_bytes(p) == size
    pagecache.drop_cached(p)
    assert pagecache.resident_bytes(p) == 0


def test_resident_bytes_of_an_empty_file_is_zero(tmp_path) -> None:
    """An empty file holds no pages (and cannot be mapped)."""
    p = tmp_path / "empty"
    p.write_bytes(b"")
    assert pagecache.resident_bytes(p) == 0


def test_drop_cached_goes_on_when_fsync_is_refused(tmp_path, monkeypatch) -> None:
    """A filesystem that refuses fsync of a read-only descriptor does not stop the drop."""
    p = tmp_path / "f.bin"
    p.write_bytes(b"x" * (2 * mmap.PAGESIZE))
    os.sync()
    assert p.read_bytes()

    def refused(fd):
        raise OSError(22, "Invalid argument")

    monkeypatch.setattr(os, "fsync", refused)
    pagecache.drop_cached(p)
    assert pagecache.resident_bytes(p) == 0


def test_drop_cached_closes_its_descriptor(tmp_path) -> None:
    """drop_cached leaves no descriptor open (counted in /proc/self/fd)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    p = tmp_path / "f.bin"
    p.write_bytes(b"y" * 100)
    before = len(os.listdir("/proc/self/fd"))
    for _ in range(5):
        pagecache.drop_cached(p)
        pagecache.resident_bytes(p)
    assert len(os.listdir("/proc/self/fd")) == before


def header(encoding: int, flags: int, label: int = 0, width: int = 1, height: int = 1, payload_len: int = 0) -> RecordHeader:
    return RecordHeader(encoding, flags, label, width, height, width, height, 0, payload_len, 0)


def test_header_stats_count_each_flag_bit_once_per_record() -> None:
    """Flag bits 1/2/8/4 are counted as progressive/converted/oriented/resized, one per record that has them."""
    st = hashes.HeaderStats()
    st.add(header(1, 1 | 8, label=3, width=10, height=20, payload_len=100))
    st.add(header(1, 1 | 2 | 4 | 8, label=-1, width=30, height=40, payload_len=50))
    st.add(header(2, 0, label=7, width=20, height=60, payload_len=7))
    st.add(header(9, 4, label=0, width=5, height=5, payload_len=1))
    assert st.to_json() == {
        "payload_bytes": 158,
        "encodings": {"9": 1, "jpeg": 2, "png": 1},
        "progressive": 2,
        "converted": 1,
        "oriented": 2,
        "resized": 2,
        "width": {"min": 5, "median": 15, "max": 30},
        "height": {"min": 5, "median": 30, "max": 60},
    }
    assert list(st.labels) == [3, -1, 7, 0]


def test_header_stats_of_no_records() -> None:
    """No records: zero counts, every flag present at 0, and 0/0/0 distributions."""
    assert hashes.HeaderStats().to_json() == {
        "payload_bytes": 0,
        "encodings": {},
        "progressive": 0,
        "converted": 0,
        "oriented": 0,
        "resized": 0,
        "width": {"min": 0, "median": 0, "max": 0},
        "height": {"min": 0, "median": 0, "max": 0},
    }


@pytest.mark.parametrize(
    "mode,kind",
    [
        (stat.S_IFDIR | 0o755, "a directory"),
        (stat.S_IFIFO | 0o644, "a FIFO"),
        (stat.S_IFCHR | 0o666, "a character device"),
        (stat.S_IFBLK | 0o660, "a block device"),
        (stat.S_IFSOCK | 0o777, "a socket"),
        (stat.S_IFLNK | 0o777, "not a regular file"),
    ],
)
def test_file_kind_names_each_kind_of_file(mode: int, kind: str) -> None:
    """Each st_mode type is named as the refusals write it; a type with no name of its own is 'not a regular file'."""
    assert files.file_kind(mode) == kind


@pytest.mark.timeout(30)  # a FIFO opened without O_NONBLOCK would wait for a writer forever
def test_stat_regular_refusals_say_what_the_file_is(tmp_path) -> None:
    """Directory, FIFO, dangling symlink, a NUL in the name, a file outside `within`: each with its errno and reason."""
    d = tmp_path / "d"
    d.mkdir()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    os.symlink("nowhere", link)
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"z")
    ds = tmp_path / "ds"
    ds.mkdir()
    os.symlink(outside, ds / "escape.bin")
    cases = [
        (d, {}, errno.EINVAL, "is a directory, not a regular file"),
        (fifo, {}, errno.EINVAL, "is a FIFO, not a regular file"),
        (link, {}, errno.ENOENT, "is a symlink to 'nowhere', which does not exist"),
        (ds / "escape.bin", {"within": ds}, errno.EXDEV, f"resolves to {str(outside)!r}, outside the dataset directory"),
    ]
    for path, kw, code, reason in cases:
        with pytest.raises(files.UnusableFileError) as ei:
            files.stat_regular(path, **kw)
        assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (code, reason, os.fspath(path))
        assert files.file_problem(ei.value) == reason
    with pytest.raises(files.UnusableFileError) as ei:
        files.stat_regular(str(tmp_path / "a\0b"))
    assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (
        errno.EINVAL, "has an unusable name (embedded null byte)", str(tmp_path / "a\0b"))  # fmt: skip
    assert files.stat_regular(outside, within=tmp_path).st_size == 1


def test_file_problem_of_plain_os_errors() -> None:
    """A missing file 'is missing'; another OSError 'cannot be opened (its strerror, or its type's name)'."""
    assert files.file_problem(FileNotFoundError(errno.ENOENT, "No such file or directory")) == "is missing"
    assert files.file_problem(PermissionError(errno.EACCES, "Permission denied")) == "cannot be opened (Permission denied)"
    assert files.file_problem(OSError()) == "cannot be opened (OSError)"


def test_read_regular_refuses_a_file_whose_size_changed(tmp_path) -> None:
    """A file not of the size checked before is refused as changed, naming both sizes; of that size, read whole."""
    p = tmp_path / "f.bin"
    p.write_bytes(b"abcdef")
    assert files.read_regular(p, 6) == b"abcdef"
    for size in (5, 7):
        with pytest.raises(files.UnusableFileError) as ei:
            files.read_regular(p, size)
        assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (
            errno.ESTALE, f"changed while being opened (6 bytes, expected {size})", str(p))  # fmt: skip


class FakeLibc:
    """A libc whose mmap or mincore fails with ENOMEM (ctypes' errno set as the call would)."""

    class Call:
        def __init__(self, fn):
            self.fn = fn

        def __call__(self, *args):
            return self.fn(*args)

    def __init__(self, fail: str):
        def mmap_(*args):
            if fail == "mmap":
                ctypes.set_errno(errno.ENOMEM)
                return ctypes.c_void_p(-1).value
            return 4096

        def mincore(*args):
            ctypes.set_errno(errno.ENOMEM)
            return -1

        self.mmap, self.munmap, self.mincore = self.Call(mmap_), self.Call(lambda *a: 0), self.Call(mincore)


@pytest.mark.parametrize("fail", ["mmap", "mincore"])
def test_resident_bytes_reports_a_failed_mmap_or_mincore_naming_the_file(tmp_path, monkeypatch, fail: str) -> None:
    """mmap returning MAP_FAILED, or mincore -1, is an OSError with libc's errno, the call's name and the path."""
    p = tmp_path / "f.bin"
    p.write_bytes(b"q" * 10)
    monkeypatch.setattr(ctypes, "CDLL", lambda *a, **kw: FakeLibc(fail))
    with pytest.raises(OSError) as ei:
        pagecache.resident_bytes(p)
    assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (errno.ENOMEM, f"{fail} failed", str(p))


def test_read_regular_of_a_file_longer_than_its_size_says(tmp_path) -> None:
    """A file that holds more than its size says (a /proc file: regular, size 0) is refused as changed
    while being read, naming the bytes read: the size asked for and one more, never more than that."""
    with pytest.raises(files.UnusableFileError) as ei:
        files.read_regular("/proc/self/status", 0)
    assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (
        errno.ESTALE, "changed while being read (1 bytes, expected 0)", "/proc/self/status")  # fmt: skip


def test_resident_bytes_of_a_file_past_2_gib(tmp_path) -> None:
    """A sparse file of 3 GiB with its last two pages written: those two pages are resident (its
    length passes to mmap and mincore as a size_t, not an int)."""
    p = tmp_path / "sparse.bin"
    size = 3 * 2**30
    with open(p, "wb") as f:
        f.seek(size - 2 * mmap.PAGESIZE)
        f.write(b"x" * (2 * mmap.PAGESIZE))
    assert os.path.getsize(p) == size
    assert pagecache.resident_bytes(p) == 2 * mmap.PAGESIZE
    if os.path.exists("/proc/self/maps"):  # and the 3 GiB map is gone (munmap given the whole length too)
        with open("/proc/self/maps") as f:
            assert not [line for line in f if line.rstrip().endswith(str(p))]


def test_load_preadv2_gives_libcs_preadv2_with_64_bit_offsets(tmp_path) -> None:
    """The function _load_preadv2 returns reads at an offset past 4 GiB of a sparse file (the offset
    passed as a 64-bit integer), the bytes written there, and returns their count."""
    f = files._load_preadv2()
    assert f is not None  # glibc >= 2.26 on Linux
    p = tmp_path / "far.bin"
    off = 2**32 + 3 * 4096 + 7
    with open(p, "wb") as out:
        out.seek(off)
        out.write(b"far away")
        out.seek(11)
        out.write(b"near")
    buf = ctypes.create_string_buffer(8)
    iov = files._Iovec(ctypes.addressof(buf), 8)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert f(fd, ctypes.pointer(iov), 1, off, 0) == 8
        assert buf.raw == b"far away"
        assert f(fd, ctypes.pointer(iov), 1, 11, 0) == 8 and buf.raw[:4] == b"near"
        ctypes.set_errno(0)  # a failed call's errno is what ctypes.get_errno() gives next (nowait_read reads it)
        assert f(fd, ctypes.pointer(iov), 1, -2, 0) == -1 and ctypes.get_errno() == errno.EINVAL
    finally:
        os.close(fd)


def test_nowait_read_copies_what_the_page_cache_holds(tmp_path, monkeypatch) -> None:
    """A file just written is cached: nowait_read copies exactly the bytes asked for to the address
    given and returns their count; once a drop has taken effect it copies nothing (-1: EAGAIN) and stays usable.
    (On a flag of this test's own: another test may have met a descriptor without RWF_NOWAIT.)"""
    monkeypatch.setattr(files, "_NOWAIT_OK", [True])
    p = tmp_path / "f.bin"
    data = bytes(range(256)) * 64
    p.write_bytes(data)
    p.read_bytes()
    buf = np.full(200, 0xEE, dtype=np.uint8)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert files.nowait_read(fd, buf.ctypes.data + 3, 100, 5000) == 100
        assert bytes(buf[3:103]) == data[5000:5100] and set(buf[:3]) | set(buf[103:]) == {0xEE}
        # the drop is advice: pages in another CPU's LRU batch or under writeback, or read ahead again,
        # can stay; on a loaded machine the first drop was not always enough. Until a read finds nothing
        # cached, each read that finds the pages must copy them exactly.
        for _ in range(50):
            pagecache.drop_cached(p)
            buf[:] = 0xEE
            got = files.nowait_read(fd, buf.ctypes.data, 100, 9000)
            if got == -1:
                break
            assert got == 100 and bytes(buf[:100]) == data[9000:9100]
            time.sleep(0.05)
        else:
            pytest.fail("nowait_read found the file cached after each of 50 drops")
        assert files._NOWAIT_OK == [True]
    finally:
        os.close(fd)


def test_nowait_read_where_the_kernel_refuses_it(tmp_path, monkeypatch) -> None:
    """preadv2 failing with EINVAL (here: an offset of -2) marks RWF_NOWAIT unavailable: -1 then and
    from then on, without calling it again (the real flag restored afterwards)."""
    monkeypatch.setattr(files, "_NOWAIT_OK", [True])
    p = tmp_path / "f.bin"
    p.write_bytes(b"y" * 4096)
    buf = np.zeros(16, dtype=np.uint8)
    fd = os.open(p, os.O_RDONLY)
    try:
        assert files.nowait_read(fd, buf.ctypes.data, 16, -2) == -1
        assert files._NOWAIT_OK == [False]
        assert files.nowait_read(fd, buf.ctypes.data, 16, 0) == -1  # cached, but no longer asked
        assert not buf.any()
    finally:
        os.close(fd)


def test_nowait_read_at_the_end_of_the_file_copies_nothing_and_stays_on(tmp_path, monkeypatch) -> None:
    """preadv2 at the end of the file returns 0 and sets no errno: whatever errno a failed call left
    (here lseek with a whence that does not exist: EINVAL) does not mark RWF_NOWAIT unavailable, and
    the next read of cached bytes copies them. (On a flag of this test's own.)"""
    monkeypatch.setattr(files, "_NOWAIT_OK", [True])
    p = tmp_path / "f.bin"
    data = bytes(range(256)) * 16
    p.write_bytes(data)
    p.read_bytes()
    buf = np.zeros(16, dtype=np.uint8)
    fd = os.open(p, os.O_RDONLY)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.lseek.restype, libc.lseek.argtypes = ctypes.c_int64, [ctypes.c_int, ctypes.c_int64, ctypes.c_int]
        assert libc.lseek(fd, 0, 12345) == -1 and ctypes.get_errno() == errno.EINVAL
        assert files.nowait_read(fd, buf.ctypes.data, 16, len(data)) == 0
        assert files._NOWAIT_OK == [True]
        assert files.nowait_read(fd, buf.ctypes.data, 16, 100) == 16 and bytes(buf) == data[100:116]
    finally:
        os.close(fd)


def test_close_fd_of_a_descriptor_that_is_gone_does_nothing() -> None:
    """close_fd of a descriptor that is not open (EBADF for os.close) returns without an error; of one
    that is, closes it."""
    for fd in (-1, 2**30):  # never open (a number just closed could be reused by another thread meanwhile)
        with pytest.raises(OSError) as ei:
            os.close(fd)
        assert ei.value.errno == errno.EBADF
        assert files.close_fd(fd) is None
    r, w = os.pipe()
    files.close_fd(w)
    assert os.read(r, 1) == b""  # its only writer gone: end of file, so it was closed
    os.close(r)


def test_resident_bytes_of_a_file_that_cannot_be_mapped_gives_the_systems_errno() -> None:
    """A sysfs attribute is a regular file (4096 bytes) that cannot be mapped: mmap fails with ENODEV
    (kernfs maps only binary attributes), reported with that errno, whatever errno was left before."""
    p = "/sys/devices/system/cpu/online"
    if not os.path.exists(p):
        pytest.skip("no sysfs")
    assert stat.S_ISREG(os.stat(p).st_mode)
    ctypes.set_errno(0)
    with pytest.raises(OSError) as ei:
        pagecache.resident_bytes(p)
    assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (errno.ENODEV, "mmap failed", p)


def test_file_sha256_is_the_files_digest_and_leaves_no_descriptor_open(tmp_path) -> None:
    """file_sha256 of a file of a few 4 MiB blocks is hashlib's digest of its bytes, with no warning; no
    descriptor of it is left open (none in /proc/self/fd names it)."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    p = tmp_path / "f.bin"
    data = bytes(range(251)) * 40000  # 10 MB: two whole blocks and a part
    p.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # and warns of nothing
        assert hashes.file_sha256(p) == hashlib.sha256(data).hexdigest()
    assert str(p) not in names_open()


def test_iter_headers_names_the_file_of_a_key_that_is_not_8_bytes(tmp_path) -> None:
    """A shard (written by LMDB itself) whose key is 7 bytes: iter_headers refuses it naming the file."""
    lmdb = pytest.importorskip("lmdb")
    p = tmp_path / "k.lmdb"
    env = lmdb.open(str(p), subdir=False, map_size=1 << 20, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"1234567", bytes(64))
    env.close()
    with pytest.raises(CorruptDataError) as ei:
        list(hashes.iter_headers(p))
    assert str(ei.value) == f"{p}: record key of 7 bytes (expected 8)"


def test_iter_headers_names_the_file_and_the_sample_of_a_bad_header(tmp_path) -> None:
    """A shard (written by LMDB itself) holding sample 5 (key: 5 as 8 big-endian bytes) whose value is 64 zero
    bytes: iter_headers refuses its header naming the file and that sample's index."""
    lmdb = pytest.importorskip("lmdb")
    p = tmp_path / "h.lmdb"
    env = lmdb.open(str(p), subdir=False, map_size=1 << 20, lock=False)
    with env.begin(write=True) as txn:
        txn.put((5).to_bytes(8, "big"), bytes(64))
    env.close()
    with pytest.raises(CorruptDataError) as ei:
        list(hashes.iter_headers(p))
    assert str(ei.value) == f"{p} sample 5: bad record magic {bytes(4)!r} (expected {b'FLRC'!r})"


def test_iter_records_names_its_where_for_a_key_that_is_not_8_bytes(tmp_path) -> None:
    """iter_records of an open shard whose key is 9 bytes: refused, the message led by the caller's ``where``."""
    lmdb = pytest.importorskip("lmdb")
    p = tmp_path / "k9.lmdb"
    env = lmdb.open(str(p), subdir=False, map_size=1 << 20, lock=False)
    with env.begin(write=True) as txn:
        txn.put(b"123456789", b"v")
    env.close()
    with hashes.open_shard_readonly(p) as scan, pytest.raises(CorruptDataError) as ei:
        list(hashes.iter_records(scan, "shard 00003"))
    assert str(ei.value) == "shard 00003: record key of 9 bytes (expected 8)"


def test_read_regular_reads_without_a_warning(tmp_path) -> None:
    """read_regular gives the file's bytes and warns of nothing (warnings made errors)."""
    p = tmp_path / "f.bin"
    data = bytes(range(256)) * 3
    p.write_bytes(data)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert files.read_regular(p, len(data)) == data


def test_open_regular_of_a_path_swapped_for_a_directory_as_it_is_opened(tmp_path, monkeypatch) -> None:
    """A symlink to a regular file, checked, then pointed at a directory just before the open (the race
    made exact: the open itself is the real one): the check through the descriptor refuses it with
    EINVAL and the reason, and the descriptor it opened is closed."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    f = tmp_path / "f.bin"
    f.write_bytes(b"x")
    d = tmp_path / "d"
    d.mkdir()
    link = tmp_path / "link"
    os.symlink(f, link)
    real_open = os.open

    def swap_then_open(path, flags, *args, **kwargs):
        if os.fspath(path) == str(link):
            os.remove(link)
            os.symlink(d, link)
        return real_open(path, flags, *args, **kwargs)

    before = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(os, "open", swap_then_open)
    try:
        with pytest.raises(files.UnusableFileError) as ei:
            files.open_regular(link)
    finally:
        monkeypatch.undo()
    assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (errno.EINVAL, "is a directory, not a regular file", str(link))
    assert os.path.isdir(link) and len(os.listdir("/proc/self/fd")) == before


def test_open_regular_within_a_directory_refuses_a_file_that_resolves_outside_it(tmp_path) -> None:
    """open_regular with ``within``: a symlink out of the directory is refused as stat_regular refuses it,
    EXDEV and the reason; one inside is opened."""
    outside = tmp_path / "outside.bin"
    outside.write_bytes(b"z")
    ds = tmp_path / "ds"
    ds.mkdir()
    os.symlink(outside, ds / "escape.bin")
    (ds / "in.bin").write_bytes(b"abc")
    with pytest.raises(files.UnusableFileError) as ei:
        files.open_regular(ds / "escape.bin", within=ds)
    assert (ei.value.errno, ei.value.strerror, ei.value.filename) == (
        errno.EXDEV, f"resolves to {str(outside)!r}, outside the dataset directory", str(ds / "escape.bin"))  # fmt: skip
    fd, st = files.open_regular(ds / "in.bin", within=ds)
    try:
        assert st.st_size == 3 and os.pread(fd, 3, 0) == b"abc"
    finally:
        os.close(fd)


def names_open() -> list[str]:
    """What this process's open descriptors name (/proc/self/fd)."""
    names = []
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):  # the listing's own descriptor is gone by now
            names.append(os.readlink(f"/proc/self/fd/{fd}"))
    return names


def test_read_regular_leaves_no_descriptor_open(tmp_path) -> None:
    """read_regular gives the file's bytes; no descriptor of it is left open."""
    if not os.path.isdir("/proc/self/fd"):
        pytest.skip("no /proc")
    p = tmp_path / "f.bin"
    p.write_bytes(b"labels!")
    assert files.read_regular(p, 7) == b"labels!"
    assert str(p) not in names_open()


def test_resident_bytes_leaves_no_map_of_the_file(tmp_path) -> None:
    """resident_bytes maps the file to ask mincore, and unmaps it: no line of /proc/self/maps names it."""
    if not os.path.exists("/proc/self/maps"):
        pytest.skip("no /proc")
    p = tmp_path / "mapped.bin"
    p.write_bytes(b"m" * 10000)
    p.read_bytes()
    assert pagecache.resident_bytes(p) == 10000
    with open("/proc/self/maps") as f:
        assert not [line for line in f if line.rstrip().endswith(str(p))]


@pytest.mark.slow
def test_read_regular_reads_a_file_larger_than_one_read_returns(tmp_path) -> None:
    """Linux's read(2) returns at most 0x7ffff000 bytes (2 GiB - 4 KiB) per call: a labels file past that
    (more than 536,869,888 samples) was refused as "changed while being read". A sparse file of
    2 GiB + 4 KiB with marks at its start, at the first call's limit and at its end reads back whole."""
    path, size = tmp_path / "big.bin", (2 << 30) + 4096
    with open(path, "wb") as f:
        f.truncate(size)
        for off, mark in [(0, b"first"), (0x7FFFF000 - 3, b"limit"), (size - 4, b"last")]:
            f.seek(off)
            f.write(mark)
    data = files.read_regular(path, size)
    assert len(data) == size
    assert data[:5] == b"first" and data[0x7FFFF000 - 3 : 0x7FFFF000 + 2] == b"limit" and data[-4:] == b"last"
    del data
