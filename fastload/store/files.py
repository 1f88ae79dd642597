"""Safe opening of a dataset's regular files: checked before and after the open, never blocking, and reads with ``pread``.

A FIFO, a device or a directory where a dataset file should be is refused (:class:`UnusableFileError`)
before anything reads it. Also the low-level calls the shard reader shares with the page-cache
helpers: ``posix_fadvise`` advice (:func:`advise`), a ``preadv2(RWF_NOWAIT)`` that keeps the GIL
(:func:`nowait_read`) and closing a descriptor that may be closed already (:func:`close_fd`).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import stat
from typing import Any, Iterator


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
        while len(data) <= size:  # one read(2) returns at most 0x7ffff000 bytes on Linux: read on to the end
            more = f.read(size + 1 - len(data))
            if not more:
                break
            data += more
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


# -- advice to the page cache ------------------------------------------------------------------
FADV_WILLNEED = getattr(os, "POSIX_FADV_WILLNEED", None)
FADV_DONTNEED = getattr(os, "POSIX_FADV_DONTNEED", None)
FADV_RANDOM = getattr(os, "POSIX_FADV_RANDOM", None)


def advise(fd: int, ranges: Iterator[tuple[int, int]] | list[tuple[int, int]], advice: int | None) -> None:
    """``posix_fadvise`` of each ``(offset, length)``; advice is only advice, so errors are ignored."""
    if advice is None:
        return
    for off, n in ranges:
        try:
            os.posix_fadvise(fd, off, n, advice)
        except OSError:
            return


# -- a read that keeps the GIL -----------------------------------------------------------------
class _Iovec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


_RWF_NOWAIT = 0x00000008  # linux/fs.h: fail with EAGAIN rather than wait for the disk


def _load_preadv2() -> Any:
    """libc's ``preadv2`` called through :class:`ctypes.PyDLL` (which keeps the GIL), or None."""
    try:
        f = ctypes.PyDLL(None, use_errno=True).preadv2
    except (OSError, AttributeError):  # not glibc >= 2.26, or not Linux
        return None
    f.restype = ctypes.c_ssize_t
    f.argtypes = [ctypes.c_int, ctypes.POINTER(_Iovec), ctypes.c_int, ctypes.c_int64, ctypes.c_int]
    return f


_PREADV2 = _load_preadv2()
_NOWAIT_OK = [_PREADV2 is not None]
# One iovec for every call: a PyDLL call holds the GIL from start to end, so no two threads use it at once.
_IOV = _Iovec(0, 0)
_IOV_P = ctypes.pointer(_IOV)


def nowait_read(fd: int, addr: int, n: int, off: int) -> int:
    """Copy up to ``n`` bytes at ``off`` of ``fd`` to address ``addr`` from the page cache only.

    ``preadv2(..., RWF_NOWAIT)`` holding the GIL: returns the bytes copied (fewer than ``n``,
    or -1, where the page cache does not hold them: the caller reads the rest with a call
    that releases the GIL). Costs about 4 us per 100 KB cached, and never releases the GIL,
    so a busy Python thread elsewhere cannot make it wait. Returns -1 where ``preadv2`` or
    ``RWF_NOWAIT`` is unavailable (then every read is a plain ``preadv``).
    """
    if not _NOWAIT_OK[0]:
        return -1
    _IOV.base, _IOV.len = addr, n
    r = _PREADV2(fd, _IOV_P, 1, off, _RWF_NOWAIT)
    if r < 0 and ctypes.get_errno() in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        _NOWAIT_OK[0] = False  # this kernel or filesystem has no RWF_NOWAIT for buffered reads
    return r


def close_fd(fd: int) -> None:
    """``os.close(fd)``, ignoring an error (a finalizer's close of a descriptor that may be gone)."""
    with contextlib.suppress(OSError):
        os.close(fd)


__all__ = [
    "UnusableFileError", "file_kind", "stat_regular", "open_regular", "read_regular", "file_problem", "file_identity",
    "FADV_WILLNEED", "FADV_DONTNEED", "FADV_RANDOM", "advise", "nowait_read", "close_fd",
]  # fmt: skip
