"""What the page cache and this process hold of files: resident pages, dropping them, memory readings.

How the benchmarks make a cold cache for one dataset (:func:`drop_cached`) and check it
(:func:`resident_bytes`), and the resident-memory split they report (:func:`process_memory`).
"""

from __future__ import annotations

import contextlib
import mmap
import os

import numpy as np

from .files import FADV_DONTNEED, advise, open_regular


# -- memory and the page cache ----------------------------------------------------------------
def process_memory() -> dict[str, int]:
    """This process's resident memory in bytes, from ``/proc/self/status`` (zeros where there is none).

    ``rss`` = ``anon`` (its own heap: arrays, tensors, decoded batches) + ``file`` (pages of
    mapped files: libraries, and any shard an LMDB handle maps) + ``shmem``. ``top``'s RES is
    ``rss``; ``SHR`` is roughly ``file + shmem``. fastload's readers use ``pread``, so the
    page cache that holds shard pages counts in none of these.
    """
    want = {"VmRSS": "rss", "RssAnon": "anon", "RssFile": "file", "RssShmem": "shmem"}
    out = dict.fromkeys(want.values(), 0)
    try:
        with open("/proc/self/status") as f:
            for line in f:
                name, _, rest = line.partition(":")
                if name in want:
                    out[want[name]] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return out


def resident_bytes(path: str | os.PathLike) -> int:
    """Bytes of a regular file that are in the page cache now (what ``fincore`` reports).

    Raises:
        OSError: the file cannot be opened, or this platform has no ``mincore``.
    """
    import ctypes

    fd, st = open_regular(path)
    try:
        size = st.st_size
        if size == 0:
            return 0
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p]
        addr = libc.mmap(None, size, mmap.PROT_READ, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            raise OSError(ctypes.get_errno(), "mmap failed", str(path))
        try:
            page = mmap.PAGESIZE
            vec = np.zeros(-(-size // page), dtype=np.uint8)
            if libc.mincore(ctypes.c_void_p(addr), size, vec.ctypes.data_as(ctypes.c_void_p)) != 0:
                raise OSError(ctypes.get_errno(), "mincore failed", str(path))
        finally:
            libc.munmap(ctypes.c_void_p(addr), size)
        return min(int(np.count_nonzero(vec & 1)) * page, size)
    finally:
        os.close(fd)


def drop_cached(path: str | os.PathLike) -> None:
    """Write back and drop a file's pages from the page cache (``fsync`` + ``POSIX_FADV_DONTNEED``),
    so that it is read from the disk again: how the benchmarks make a cold cache for one dataset.
    Pages other processes have mapped stay; check with :func:`resident_bytes`.

    Raises:
        OSError: the file cannot be opened.
    """
    fd, _st = open_regular(path)
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
        advise(fd, [(0, 0)], FADV_DONTNEED)
    finally:
        os.close(fd)


__all__ = ["process_memory", "resident_bytes", "drop_cached"]
