"""Shard files on the read side: the LMDB structure check, shared read-only handles, records, hashes.

Everything that opens a finished shard goes through here: :class:`fastload.Dataset`,
``inspect``/``verify`` and a resumed pack (which re-reads the shards it keeps).
"""

from __future__ import annotations

import array
import contextlib
import errno
import hashlib
import mmap
import os
import stat
import struct
import threading
from collections import Counter
from typing import Any, Iterator

import numpy as np

from .errors import CorruptDataError
from .format import (
    ENCODINGS,
    FLAG_CONVERTED,
    FLAG_ORIENTED,
    FLAG_PROGRESSIVE,
    FLAG_RESIZED,
    KEY,
    RecordHeader,
    decode_header,
)

try:  # lmdb is a hard dependency; keep the hint readable anyway
    import lmdb
except ImportError:  # pragma: no cover - exercised only without lmdb
    lmdb = None


# py-lmdb refuses to open one environment twice in a process: share one handle per
# shard file per process (the pid guards against handles inherited through fork).
# The file's identity (inode, size, mtime) is kept beside it, so a shard replaced on
# disk (a pack with --overwrite into the same OUT) is reopened, not read stale.
_ENVS: dict[tuple[int, str], "lmdb.Environment"] = {}
_ENV_IDS: dict[tuple[int, str], tuple[int, int, int]] = {}
_ENVS_LOCK = threading.Lock()
# Shard files whose LMDB structure was checked (path, identity), so each is checked once per process.
_CHECKED: set[tuple[str, tuple[int, int, int]]] = set()


# -- regular files only ------------------------------------------------------------------------
# A FIFO, a device (a symlink to /dev/zero) or a directory where a dataset file should be makes
# open() block, read() never end, or mmap fail: every file of a dataset is checked to be a regular
# file before it is opened, opened with O_NONBLOCK (a FIFO swapped in meanwhile cannot block the
# open) and checked again through its descriptor.
_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOCTTY", 0)
_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


class UnusableFileError(OSError):
    """A dataset file that exists but cannot be used: not a regular file, outside its dataset
    directory, or replaced while being opened. ``strerror`` says what it is (``"is a FIFO, not a
    regular file"``). An ``OSError``, so callers that handle I/O errors handle it too."""


def file_kind(mode: int) -> str:
    """``"a FIFO"``, ``"a directory"``, ``"a character device"``... for an ``st_mode``."""
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def _require_regular(path: str, st: os.stat_result) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise UnusableFileError(errno.EINVAL, f"is {file_kind(st.st_mode)}, not a regular file", path)


def stat_regular(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> os.stat_result:
    """``os.stat`` of a regular file; with ``within``, one that resolves inside that directory.

    Raises:
        FileNotFoundError: nothing is there.
        UnusableFileError: it is not a regular file (a FIFO, a device, a directory, a dangling
            symlink), or it resolves outside ``within``.
        OSError: it cannot be looked at (permissions, a symlink loop, ...).
    """
    p = os.fspath(path)
    try:
        st = os.stat(p)
    except FileNotFoundError:
        if os.path.islink(p):
            raise UnusableFileError(errno.ENOENT, f"is a symlink to {os.readlink(p)!r}, which does not exist", p) from None
        raise
    except ValueError as e:  # an embedded NUL, or a name the file system encoding cannot express
        raise UnusableFileError(errno.EINVAL, f"has an unusable name ({e})", p) from None
    _require_regular(p, st)
    if within is not None:
        real, top = os.path.realpath(p), os.path.realpath(within)
        if os.path.commonpath([real, top]) != top:
            raise UnusableFileError(errno.EXDEV, f"resolves to {real!r}, outside the dataset directory", p)
    return st


def open_regular(path: str | os.PathLike, *, within: str | os.PathLike | None = None) -> tuple[int, os.stat_result]:
    """A read-only descriptor of a regular file and its ``fstat`` (see :func:`stat_regular`).

    Checked before the open, opened with ``O_NONBLOCK`` and checked again through the
    descriptor, so nothing swapped in between can block or feed endless bytes. The
    caller closes the descriptor.
    """
    p = os.fspath(path)
    stat_regular(p, within=within)
    fd = os.open(p, _OPEN_FLAGS)
    try:
        st = os.fstat(fd)
        _require_regular(p, st)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def read_regular(path: str | os.PathLike, size: int) -> bytes:
    """The ``size`` bytes of a regular file whose size was checked already (refused if it changed)."""
    p = os.fspath(path)
    fd, st = open_regular(p)
    with open(fd, "rb", buffering=0, closefd=True) as f:
        if st.st_size != size:
            raise UnusableFileError(errno.ESTALE, f"changed while being opened ({st.st_size} bytes, expected {size})", p)
        data = f.read(size + 1)
    if len(data) != size:
        raise UnusableFileError(errno.ESTALE, f"changed while being read ({len(data)} bytes, expected {size})", p)
    return data


def file_problem(e: OSError) -> str:
    """What an ``OSError`` of :func:`stat_regular` / :func:`open_regular` says about the file,
    for a message: ``"is missing"``, ``"is a FIFO, not a regular file"``, ``"cannot be opened
    (Permission denied)"``."""
    if isinstance(e, UnusableFileError):
        return str(e.strerror)
    if isinstance(e, FileNotFoundError):
        return "is missing"
    return f"cannot be opened ({e.strerror or type(e).__name__})"


def file_identity(st: os.stat_result) -> tuple[int, int, int]:
    """A file's identity for the shared handles and the checked set: (inode, size, mtime)."""
    return (st.st_ino, st.st_size, st.st_mtime_ns)


_PROC_FD = os.path.isdir("/proc/self/fd")  # Linux: /proc/self/fd/N reopens the very file behind N


def _lmdb_open(fd: int, path: str, **kw: Any) -> "lmdb.Environment":
    """A read-only LMDB environment of exactly the file behind ``fd``.

    LMDB opens ``/proc/self/fd/N`` (where there is one), so it maps the file that was checked
    even if ``path`` is replaced meanwhile. py-lmdb tells open files apart by ``realpath``,
    which resolves that name to the file's own: a second handle of one file is still refused.
    LMDB's errors name ``path``.
    """
    name = f"/proc/self/fd/{fd}" if _PROC_FD else path
    try:
        return lmdb.open(name, subdir=False, readonly=True, lock=False, readahead=False, **kw)
    except lmdb.Error as e:
        if name == path:
            raise
        raise type(e)(str(e).replace(repr(name.encode()), path).replace(name, path)) from None


# -- LMDB structure check ----------------------------------------------------------------------
# LMDB trusts its own pages: a flipped bit in a page's node-offset table or a node's size makes
# it read outside the file through its mmap, which kills the process with SIGBUS (or SIGSEGV).
# Before a shard is opened, every page a reader can reach (meta, branch and leaf pages) is
# checked so that everything LMDB will dereference lies inside the file. Layout: lmdb.h/mdb.c
# of LMDB 0.9 on 64-bit platforms. Reading the branch and leaf pages is cheap for datasets of
# ordinary photos (their records live in overflow pages, which are not read here).
_LMDB_MAGIC = 0xBEEFC0DE
_P_BRANCH, _P_LEAF, _P_META = 0x01, 0x02, 0x08
_F_BIGDATA = 0x01
_P_INVALID = 2**64 - 1
_PAGEHDR = 16  # mp_pgno u64 | mp_pad u16 | mp_flags u16 | mp_lower u16 | mp_upper u16
_NODEHDR = 8  # mn_lo u16 | mn_hi u16 | mn_flags u16 | mn_ksize u16
_META = struct.Struct("<IIQQ48xIHHQQQQQQQ")  # magic, version, address, mapsize, FREE db (skipped), MAIN db, last_pg, txnid
_MAX_DEPTH = 32  # LMDB's CURSOR_STACK


def check_shard_structure(
    path: str | os.PathLike, size: int, *, first: int | None = None, count: int | None = None
) -> str | None:
    """Why the shard file ``path`` of ``size`` bytes cannot be read safely, or None if it can.

    Checks the meta pages and every branch and leaf page reachable from the root: page
    numbers, node-offset tables, node and key sizes, that each value (inline or in
    overflow pages) lies inside the file, and that no two records share overflow pages.
    With ``first`` and ``count`` (from the manifest), also that the keys are exactly
    ``first .. first + count - 1``, so a record can never be found under another index.
    The values themselves are checked by their header, label and CRC-32.
    """
    try:
        fd, st = open_regular(path)
    except OSError as e:
        return f"the file {file_problem(e)}"
    try:
        return _check_fd(fd, st, size, None if first is None or count is None else (first, count))
    finally:
        os.close(fd)


def _check_fd(fd: int, st: os.stat_result, size: int, keys: tuple[int, int] | None) -> str | None:
    if st.st_size != size:
        return f"the file is {st.st_size} bytes, expected {size} (it changed while being checked)"
    try:
        with mmap.mmap(fd, 0, access=mmap.ACCESS_READ) as mm:
            return _check_pages(mm, size, keys)
    except (OSError, ValueError) as e:
        return f"cannot map the file ({getattr(e, 'strerror', None) or e})"


def _check_pages(mm: mmap.mmap, size: int, keys: tuple[int, int] | None) -> str | None:
    if size != len(mm) or size < 2 * 512:
        return f"{size} bytes is too small for an LMDB file"
    metas = []
    for off in (0, struct.unpack_from("<I", mm, _PAGEHDR + 24)[0]):  # meta 1 sits at meta 0's page size
        if off + _PAGEHDR + _META.size > size:
            return "LMDB meta page outside the file"
        (flags,) = struct.unpack_from("<H", mm, off + 10)
        m = _META.unpack_from(mm, off + _PAGEHDR)
        if not flags & _P_META or m[0] != _LMDB_MAGIC or m[1] != 1:
            return "not an LMDB file (bad meta page)"
        metas.append(m)
    psize = struct.unpack_from("<I", mm, _PAGEHDR + 24)[0]
    if psize < 512 or psize > 65536 or psize & (psize - 1) or struct.unpack_from("<I", mm, psize + _PAGEHDR + 24)[0] != psize:
        return f"LMDB page size {psize} is invalid"
    meta = metas[1] if metas[0][-1] < metas[1][-1] else metas[0]  # the newer transaction, as LMDB picks
    root, last = meta[-3], meta[-2]
    if (last + 1) * psize > size:
        return f"LMDB meta page says {last + 1} pages, the file holds {size // psize}"
    if root == _P_INVALID:
        return None if not keys or keys[1] == 0 else f"LMDB file holds no records, the manifest says {keys[1]}"
    if root > last:
        return "LMDB root page is past the last page"
    flat = np.frombuffer(mm, dtype=np.uint8)
    try:
        return _check_tree(flat, psize, last, root, keys)
    except IndexError:  # numpy bounds-checks every read: whatever was missed above is still caught
        return "LMDB page structure points outside the file"
    finally:
        del flat  # release the buffer before the mmap closes


def _gather_u(flat: np.ndarray, offsets: np.ndarray, nbytes: int) -> np.ndarray:
    """Little-endian unsigned ints of ``nbytes`` bytes at ``offsets`` of ``flat``."""
    b = flat[offsets[:, None] + np.arange(nbytes)].astype(np.uint64)
    return (b << (8 * np.arange(nbytes, dtype=np.uint64))).sum(axis=1, dtype=np.uint64)


def _check_tree(flat: np.ndarray, psize: int, last: int, root: int, keys: tuple[int, int] | None) -> str | None:
    level = np.array([root], dtype=np.int64)
    seen = 0
    for _depth in range(_MAX_DEPTH):
        if level.size == 0:
            return None
        seen += level.size
        if seen > last + 1 or np.unique(level).size != level.size:
            return "LMDB B-tree pages are referenced more than once"
        base = level * psize
        hdr = _gather_u(flat, base + 10, 2), _gather_u(flat, base + 12, 2), _gather_u(flat, base + 14, 2)
        flags, lower, upper = (h.astype(np.int64) for h in hdr)
        kind = flags & 0x7F
        if not ((kind == _P_BRANCH) | (kind == _P_LEAF)).all():
            return "LMDB B-tree reaches a page that is neither a branch nor a leaf"
        n = (lower - _PAGEHDR) >> 1
        if ((n < 1) | (lower > upper) | (upper > psize)).any():
            return "LMDB page with an invalid node table"
        page_of = np.repeat(np.arange(level.size), n)
        j = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
        nbase = base[page_of]
        ptr = _gather_u(flat, nbase + _PAGEHDR + 2 * j, 2).astype(np.int64)
        if ((ptr < upper[page_of]) | (ptr + _NODEHDR > psize)).any():
            return "LMDB node offset outside its page"
        node = nbase + ptr
        lo, hi = _gather_u(flat, node, 2).astype(np.int64), _gather_u(flat, node + 2, 2).astype(np.int64)
        nflags, ksize = _gather_u(flat, node + 4, 2).astype(np.int64), _gather_u(flat, node + 6, 2).astype(np.int64)
        end = ptr + _NODEHDR + ksize
        branch = kind[page_of] == _P_BRANCH
        if branch.any():
            child = lo[branch] | (hi[branch] << 16) | (nflags[branch] << 32)
            if ((end[branch] > psize) | (child > last)).any():
                return "LMDB branch node outside its page or pointing past the last page"
        leaf = ~branch
        if leaf.any():
            dsize, lflags, lend, lnode = lo[leaf] | (hi[leaf] << 16), nflags[leaf], end[leaf], node[leaf]
            if (lflags & ~_F_BIGDATA).any():
                return "LMDB leaf node with unsupported flags"
            big = (lflags & _F_BIGDATA) != 0
            if ((lend + np.where(big, 8, dsize)) > psize).any():
                return "LMDB leaf node outside its page"
            if big.any():
                ov = _gather_u(flat, lnode[big] + _NODEHDR + ksize[leaf][big], 8)
                if (ov > last).any() or ((ov.astype(np.int64) * psize + _PAGEHDR + dsize[big]) > (last + 1) * psize).any():
                    return "LMDB record points past the end of the file"
                order = np.argsort(ov.astype(np.int64), kind="stable")
                start, npages = ov.astype(np.int64)[order], -(-(_PAGEHDR + dsize[big][order]) // psize)
                if (start[1:] < start[:-1] + npages[:-1]).any():
                    return "two LMDB records share overflow pages"
            if keys is not None:
                first, count = keys
                if lnode.size != count or (ksize[leaf] != 8).any():
                    return f"LMDB file holds {lnode.size} records, the manifest says {count}"
                found = flat[(lnode + _NODEHDR)[:, None] + np.arange(8)].view(">u8").ravel()
                if not np.array_equal(found, np.arange(first, first + count, dtype=np.uint64)):
                    return f"LMDB keys are not the sample indices {first}..{first + count - 1}"
        if branch.any() and leaf.any():
            return "LMDB B-tree level mixes branch and leaf pages"
        level = child if branch.any() else np.empty(0, dtype=np.int64)
    return "LMDB B-tree deeper than 32 levels"


def shared_env(path: str, identity: tuple[int, int, int] | None = None) -> "lmdb.Environment":
    """This process's one read-only handle of the shard file ``path`` (reopened if ``identity`` changed).

    LMDB opens the very file that was checked (through its descriptor), and only if it
    still has ``identity``.

    Raises:
        OSError: the file is not a regular file, or was replaced since it was checked
            (:class:`UnusableFileError`), or cannot be opened.
        lmdb.Error: LMDB cannot open it.
    """
    k = (os.getpid(), path)
    with _ENVS_LOCK:
        env = _ENVS.get(k)
        if env is not None and identity is not None and _ENV_IDS.get(k) != identity:
            env.close()  # the file on disk is not the one this handle maps
            env = None
        if env is None:
            fd, st = open_regular(path)
            try:
                if identity is not None and file_identity(st) != identity:
                    raise UnusableFileError(errno.ESTALE, "was replaced while being opened; try again", path)
                env = _lmdb_open(fd, path, meminit=False, max_readers=1024)
            except lmdb.Error:
                # Forked after the parent opened this file: py-lmdb's registry of open
                # files came along and refuses a second handle. The parent's read-only,
                # lock-free mapping was inherited too and is safe to read: adopt it.
                env = next((e for (pid, q), e in _ENVS.items() if q == path and pid != k[0]), None)
                if env is None:
                    raise
            finally:
                os.close(fd)  # LMDB holds its own descriptor
            _ENVS[k] = env
            if identity is not None:
                _ENV_IDS[k] = identity
    return env


def check_once(path: str, identity: tuple[int, int, int], *, first: int, count: int) -> str | None:
    """:func:`check_shard_structure` of a shard file, remembered per file identity (inode, size, mtime)."""
    if (path, identity) in _CHECKED:
        return None
    problem = check_shard_structure(path, identity[1], first=first, count=count)
    if problem is None:
        _CHECKED.add((path, identity))
    return problem


def close_shared() -> None:
    """Close every shared handle of this process and forget which files were checked.

    For tools that open many datasets one after another and want the number of open
    files bounded; a :class:`fastload.Dataset` opened before must not be read afterwards.
    """
    with _ENVS_LOCK:
        for env in list(_ENVS.values()):
            with contextlib.suppress(Exception):
                env.close()
        _ENVS.clear()
        _ENV_IDS.clear()
        _CHECKED.clear()


def file_sha256(path: str | os.PathLike) -> str:
    """SHA-256 of a regular file (read in 4 MiB blocks).

    Raises:
        OSError: the file cannot be read, or is not a regular file (:class:`UnusableFileError`).
    """
    h = hashlib.sha256()
    fd, _st = open_regular(path)
    with open(fd, "rb", buffering=0, closefd=True) as f:
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        while n := f.readinto(buf):
            h.update(view[:n])
    return h.hexdigest()



@contextlib.contextmanager
def open_shard_readonly(path: str | os.PathLike) -> Iterator[Any]:
    """A read-only LMDB environment of one shard file, closed afterwards (for scans: inspect, verify, resume).

    If this process already holds the file open through a :class:`fastload.Dataset`
    (py-lmdb refuses a second handle), that handle is shared and left open.

    The structure check and LMDB read the same file, through one descriptor.

    Raises:
        CorruptDataError: the file's LMDB structure is damaged (reading it could crash).
        OSError: the file cannot be opened, or is not a regular file (:class:`UnusableFileError`).
        lmdb.Error: LMDB cannot open the file.
    """
    p = str(path)
    fd, st = open_regular(p)
    shared = None
    try:
        problem = _check_fd(fd, st, st.st_size, None)
        if problem:  # LMDB would read outside the file (and die of SIGBUS): refuse instead
            raise CorruptDataError(f"{p}: damaged shard ({problem})")
        try:
            env = _lmdb_open(fd, p)
        except lmdb.Error:
            real = os.path.realpath(p)
            shared = next((e for (pid, q), e in list(_ENVS.items()) if pid == os.getpid() and os.path.realpath(q) == real), None)
            if shared is None:
                raise
            env = shared
    finally:
        os.close(fd)
    try:
        yield env
    finally:
        if shared is None:
            env.close()


def iter_records(env: Any, where: str) -> Iterator[tuple[int, memoryview]]:
    """``(global index, value)`` of every record of an open shard, in key order."""
    with env.begin(buffers=True) as txn:
        for k, v in txn.cursor():
            if len(k) != KEY.size:
                raise CorruptDataError(f"{where}: record key of {len(k)} bytes (expected {KEY.size})")
            (i,) = KEY.unpack(bytes(k))
            yield i, v


def iter_headers(path: str | os.PathLike) -> Iterator[tuple[int, RecordHeader]]:
    """``(global index, header)`` of every record of one shard file, in key order.

    Raises:
        lmdb.Error: the file is not a readable LMDB environment.
        CorruptDataError: a record header or key is malformed.
    """
    p = str(path)
    with open_shard_readonly(p) as env:
        for i, v in iter_records(env, p):
            yield i, decode_header(v, where=f"{p} sample {i}")



class HeaderStats:
    """Labels and header statistics of a sequence of records (the manifest's ``stats``, ``inspect``)."""

    def __init__(self) -> None:
        self.labels = array.array("i")
        self.widths = array.array("I")
        self.heights = array.array("I")
        self.encodings: Counter[str] = Counter()
        self.flags = Counter({"progressive": 0, "converted": 0, "oriented": 0, "resized": 0})
        self.payload_bytes = 0

    def add(self, h: RecordHeader) -> None:
        self.labels.append(h.label)
        self.widths.append(h.width)
        self.heights.append(h.height)
        self.encodings[ENCODINGS.get(h.encoding, str(h.encoding))] += 1
        for bit, name in ((FLAG_PROGRESSIVE, "progressive"), (FLAG_CONVERTED, "converted"), (FLAG_ORIENTED, "oriented"), (FLAG_RESIZED, "resized")):
            if h.flags & bit:
                self.flags[name] += 1
        self.payload_bytes += h.payload_len

    def to_json(self) -> dict[str, Any]:
        def dist(a: array.array) -> dict[str, int]:
            if not a:
                return {"min": 0, "median": 0, "max": 0}
            x = np.frombuffer(a, dtype=np.uint32)
            return {"min": int(x.min()), "median": int(np.median(x)), "max": int(x.max())}

        return {
            "payload_bytes": self.payload_bytes,
            "encodings": dict(sorted(self.encodings.items())),
            **dict(self.flags),
            "width": dist(self.widths),
            "height": dist(self.heights),
        }


__all__ = [
    "check_shard_structure", "check_once", "shared_env", "close_shared", "open_shard_readonly",
    "iter_records", "iter_headers", "file_sha256", "HeaderStats",
    "UnusableFileError", "file_kind", "stat_regular", "open_regular", "read_regular", "file_problem", "file_identity",
]  # fmt: skip
