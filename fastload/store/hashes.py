"""Whole shard files scanned: SHA-256 hashes, records and headers in key order, header statistics.

For ``inspect``, ``verify``, a resumed pack and the manifest's ``stats``: each scan opens a
regular file (:func:`~fastload.store.files.open_regular`) and, before LMDB reads a shard,
checks its structure (:func:`~fastload.store.btree.check_fd_structure`).
"""

from __future__ import annotations

import array
import contextlib
import hashlib
import os
from collections import Counter
from typing import Any, Iterator

import numpy as np

from ..errors import CorruptDataError
from ..format import (
    ENCODINGS,
    FLAG_CONVERTED,
    FLAG_ORIENTED,
    FLAG_PROGRESSIVE,
    FLAG_RESIZED,
    KEY,
    RecordHeader,
    decode_header,
)
from .btree import check_fd_structure
from .files import open_regular

try:  # lmdb is a hard dependency; keep the hint readable anyway
    import lmdb
except ImportError:  # pragma: no cover - exercised only without lmdb
    lmdb = None


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

    The structure check (:func:`check_shard_structure`, without the manifest's keys) and
    LMDB read the same file, through one descriptor.

    Raises:
        CorruptDataError: the file's LMDB structure is damaged (reading it could crash).
        OSError: the file cannot be opened, or is not a regular file (:class:`UnusableFileError`).
        lmdb.Error: LMDB cannot open the file.
    """
    p = str(path)
    fd, st = open_regular(p)
    try:
        problem = check_fd_structure(fd, st, st.st_size, None)
        if problem:  # LMDB would read outside the file (and die of SIGBUS): refuse instead
            raise CorruptDataError(f"{p}: damaged shard ({problem})")
        env = _lmdb_open(fd, p)
    finally:
        os.close(fd)
    try:
        yield env
    finally:
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


__all__ = ["file_sha256", "open_shard_readonly", "iter_records", "iter_headers", "HeaderStats"]
