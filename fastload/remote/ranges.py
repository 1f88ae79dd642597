"""Records fetched by range requests into a sparse local copy of a shard, and dropped again once read.

``fetch="records"`` (:class:`fastload.remote.RemoteShards`): instead of downloading a whole
shard before its first record is read, a shard is a sparse file of its full size in the node
cache, filled page by page as :class:`fastload.store.ShardFile` asks for byte ranges (its
:class:`~fastload.store.Filler`): the LMDB meta, branch and leaf pages when it is opened
(about 0.03 % of a shard of photos), then each record's pages when the read-ahead announces
it, several requests at once, and again, synchronously, when a read finds them missing. Once
a batch has been read its records' pages are punched out of the file again, so under a
global shuffle the cache holds the shards' structure and the records of the next few
batches, whatever the dataset's size.

What is verified: every page of the tree is checked by the B-tree reader as always, every
payload by its checksum (the loader reads with ``check=True``), and every request asks for
the version of the object the shard was opened on (``If-Match`` its ETag), so an object
replaced while the dataset is read is an error naming it, never a mix of old and new bytes.
A shard's SHA-256 cannot be checked without reading all of it: that is what
``fetch="shards"`` (the default) gives.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import threading
import weakref
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Sequence

import numpy as np

log = logging.getLogger(__name__)

#: Granularity of what is fetched and dropped: LMDB's page size, so a record's pages are whole.
PAGE = 4096
#: Runs of missing pages closer than this are fetched as one request (the gap is fetched too).
JOIN_GAP = 2 * PAGE
_MISSING, _FLIGHT, _HERE = 0, 1, 2

_FALLOC_FL_KEEP_SIZE, _FALLOC_FL_PUNCH_HOLE = 0x01, 0x02
_libc: Any = None


def punch_hole(fd: int, offset: int, length: int) -> bool:
    """Free ``length`` bytes of the file at ``offset`` (they read as zeros after); False where the
    file system cannot (the bytes then stay on disk until the file is deleted)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
            _libc.fallocate.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    return _libc.fallocate(fd, _FALLOC_FL_PUNCH_HOLE | _FALLOC_FL_KEEP_SIZE, offset, length) == 0


class RangeFiller:
    """Fills the sparse file ``fd`` (``size`` bytes) with object ``name``'s bytes, on demand.

    Args:
        remote: the store client (:class:`fastload.remote.store.RemoteStore`).
        name: the object's name under the dataset's URL.
        fd: the sparse file, opened for reading and writing, ``size`` bytes long.
        size: the object's size.
        e_tag: the version of the object every request asks for (``If-Match``); None: any.
        pool: the threads that run the requests (shared by a dataset's shards).

    Thread-safe. A request that failed is raised by the next :meth:`fill` that needs its pages
    (and by every later one: the shard is then unusable, as a damaged download would be).
    """

    def __init__(self, remote: Any, name: str, fd: int, size: int, e_tag: str | None, pool: ThreadPoolExecutor) -> None:
        self.remote, self.name, self.fd, self.size, self.e_tag, self.pool = remote, name, fd, size, e_tag, pool
        self._state = np.zeros(-(-size // PAGE), dtype=np.uint8)
        self._cond = threading.Condition()
        self._pid = os.getpid()
        self._error: BaseException | None = None
        self.requests = 0  # range requests made
        self.fetched = 0  # bytes they brought
        self.resident = 0  # bytes of the file filled now

    # ------------------------------------------------------------------ filling
    def _runs(self, ranges: Sequence[tuple[int, int]]) -> list[tuple[int, int]]:
        """The missing page runs ``[p0, p1)`` that cover ``ranges``, marked in flight (lock held).
        Runs at most :data:`JOIN_GAP` apart, with only missing pages between, are one request."""
        state = self._state
        wanted = np.zeros(len(state), dtype=bool)
        for off, n in ranges:
            if n > 0:
                wanted[max(0, off) // PAGE : min(len(state), -(-(off + n) // PAGE))] = True
        want = np.flatnonzero(wanted & (state == _MISSING))
        if not len(want):
            return []
        cuts = (np.flatnonzero(np.diff(want) != 1) + 1).tolist()
        runs: list[tuple[int, int]] = []
        for a, b in zip([0, *cuts], [*cuts, len(want)]):
            p0, p1 = int(want[a]), int(want[b - 1]) + 1
            if runs and p0 - runs[-1][1] <= JOIN_GAP // PAGE and (state[runs[-1][1] : p0] == _MISSING).all():
                runs[-1] = (runs[-1][0], p1)
            else:
                runs.append((p0, p1))
        for p0, p1 in runs:
            state[p0:p1] = _FLIGHT
        return runs

    def _fetch(self, p0: int, p1: int) -> None:
        start, end = p0 * PAGE, min(p1 * PAGE, self.size)
        try:
            data = self.remote.get_range(self.name, start, end, e_tag=self.e_tag)
            view = memoryview(data)
            done = 0
            while done < len(view):
                done += os.pwrite(self.fd, view[done:], start + done)
        except BaseException as e:  # noqa: BLE001 - handed to the reader that waits for these pages
            with self._cond:
                self._state[p0:p1] = _MISSING
                if self._error is None:
                    self._error = e
                self._cond.notify_all()
            return
        with self._cond:
            self._state[p0:p1] = _HERE
            self.requests += 1
            self.fetched += end - start
            self.resident += end - start
            self._cond.notify_all()

    def fill(self, ranges: Sequence[tuple[int, int]], *, wait: bool) -> None:
        """Have ``ranges`` (``(offset, length)``) in the file: fetched in the pool, and with ``wait``
        waited for (the missing ones among them fetched in this thread if the pool is busy).

        Raises:
            RemoteError: the store did not answer within the deadline, or refused.
            CorruptDataError: the object changed since the shard was opened.
        """
        forked = self._forked()  # a forked child (a DataLoader worker): no pool there, nothing read ahead
        if forked and not wait:
            return
        with self._cond:
            if self._error is not None:
                raise self._error
            runs = self._runs(ranges)
        for p0, p1 in [] if forked else runs[1:] if wait else runs:
            self.pool.submit(self._fetch, p0, p1)
        for p0, p1 in (runs if forked else runs[:1]) if wait else []:
            self._fetch(p0, p1)  # what this reader waits for: in this thread, not behind the pool's queue
        if not wait:
            return
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if all(self._here(off, n) for off, n in ranges):
                    return
                self._cond.wait(1.0)

    def _forked(self) -> bool:
        """True in a child forked from the process that made this: its own lock from now on (the
        parent's may have been held by a thread that does not exist here)."""
        if os.getpid() == self._pid:
            return False
        if not getattr(self, "_child", False):
            self._cond, self._child = threading.Condition(), True
            self._state[self._state == _FLIGHT] = _MISSING  # the parent's requests do not arrive here
        return True

    def _here(self, off: int, n: int) -> bool:
        if n <= 0:
            return True
        return bool((self._state[max(0, off) // PAGE : -(-(off + n) // PAGE)] == _HERE).all())

    # ------------------------------------------------------------------ dropping
    def drop(self, ranges: Sequence[tuple[int, int]]) -> None:
        """Free the whole pages inside ``ranges`` (records already read) that are in the file. Not in
        a forked child: the file is its parent's, whose reads must not find holes."""
        if self._forked():
            return
        with self._cond:
            for off, n in ranges:
                p0, p1 = -(-off // PAGE), (off + n) // PAGE  # only pages entirely inside
                if p1 <= p0:
                    continue
                here = np.flatnonzero(self._state[p0:p1] == _HERE)
                if not len(here):
                    continue
                if punch_hole(self.fd, p0 * PAGE, (p1 - p0) * PAGE):
                    self._state[p0 + here] = _MISSING
                    self.resident -= len(here) * PAGE
                else:
                    log.debug("%s: cannot free pages of a sparse file here; they stay until the shard is closed", self.name)

    def disk_bytes(self) -> int:
        """Bytes of the file on disk (its allocated blocks)."""
        return os.fstat(self.fd).st_blocks * 512



class SparseShard:
    """This process's sparse copy of one shard in the node cache, and the :class:`RangeFiller` that fills it.

    Made empty at the shard's full size (a file left by an earlier process of the same pid is
    replaced); deleted by :meth:`close`, or when the process exits.
    """

    def __init__(self, path: Path, remote: Any, name: str, size: int, e_tag: str | None, pool: ThreadPoolExecutor) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            path.unlink()
        except FileNotFoundError:
            pass
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            os.ftruncate(fd, size)
        except BaseException:
            os.close(fd)
            raise
        self.path, self.pid = path, os.getpid()
        self.filler = RangeFiller(remote, name, fd, size, e_tag, pool)
        self._finalizer = weakref.finalize(self, _remove, fd, str(path), self.pid)

    def close(self) -> None:
        """Close and delete the copy (only in the process that made it)."""
        self._finalizer()


def _remove(fd: int, path: str, pid: int) -> None:
    if os.getpid() != pid:
        return
    try:
        os.close(fd)
    except OSError:
        pass
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


__all__ = ["RangeFiller", "SparseShard", "punch_hole", "PAGE"]
