"""Whole shard files scanned: SHA-256 hashes, records and headers in key order, header statistics.

For ``inspect``, ``verify``, a resumed pack and the manifest's ``stats``: each scan opens a
regular file (:func:`~fastload.store.files.open_regular`); records are read with ``pread``
through the checked B-tree reader (:class:`~fastload.store.btree.ShardScan`), never through
LMDB's memory map.
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
    HEADER_SIZE,
    KEY,
    RecordHeader,
    ValueHead,
    decode_header,
)
from .btree import ShardScan
from .files import open_regular

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
def open_shard_readonly(path: str | os.PathLike, size: int | None = None) -> Iterator[ShardScan]:
    """A :class:`~fastload.store.btree.ShardScan` of one shard file, closed afterwards (for scans: inspect, verify, resume).

    Read with ``pread`` and checked page by page, never through a memory map: a shard
    damaged, or cut short while it is read, is a :class:`~fastload.store.btree.DamagedShardError`, not SIGBUS.
    With ``size``, the file must still have that many bytes.

    Raises:
        DamagedShardError: the file's LMDB structure is damaged (a ``CorruptDataError``).
        OSError: the file cannot be opened, or is not a regular file (:class:`UnusableFileError`).
    """
    with ShardScan(path, size) as scan:
        yield scan


def iter_records(scan: ShardScan, where: str) -> Iterator[tuple[int, bytes | memoryview]]:
    """``(global index, value)`` of every record of an open shard (:func:`open_shard_readonly`), in key order.

    Raises:
        CorruptDataError: a key is not 8 bytes; :class:`~fastload.store.btree.DamagedShardError`
            as :meth:`~fastload.store.btree.ShardScan.records`.
    """
    for i, v, _n in _indexed(scan.records(), where):
        yield i, v


def _indexed(records: Iterator[tuple[bytes, Any, int]], where: str) -> Iterator[tuple[int, Any, int]]:
    for k, v, n in records:
        if len(k) != KEY.size:
            raise CorruptDataError(f"{where}: record key of {len(k)} bytes (expected {KEY.size})")
        (i,) = KEY.unpack(k)
        yield i, v, n


def iter_headers(path: str | os.PathLike) -> Iterator[tuple[int, RecordHeader]]:
    """``(global index, header)`` of every record of one shard file, in key order.

    Read with ``pread`` (:class:`~fastload.store.btree.ShardScan`), never through a memory
    map; of a record in overflow pages only its header is read.

    Raises:
        CorruptDataError: a record header or key is malformed, or the file's structure is
            damaged or it became shorter while it was read (:class:`~fastload.store.btree.DamagedShardError`).
        OSError: the file cannot be opened, or is not a regular file.
    """
    p = str(path)
    with open_shard_readonly(p) as scan:
        for i, v, n in _indexed(scan.records(head=HEADER_SIZE), p):
            yield i, decode_header(v if len(v) == n else ValueHead(v, n), where=f"{p} sample {i}")


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
