"""Shard files on the read side: safe file opening, the checked ``pread`` B-tree reader, page-cache control, scans and hashes.

One job per module, imports pointing one way: ``files`` at the bottom, ``btree`` and
``pagecache`` on it, ``hashes`` on ``btree`` (docs/architecture.md draws it):

* :mod:`.files`: safe opening of regular files (:func:`open_regular`, :class:`UnusableFileError`),
  ``posix_fadvise`` advice, the GIL-keeping ``preadv2`` read (:func:`nowait_read`);
* :mod:`.btree`: the LMDB B-tree read with ``pread`` and checked page by page
  (:class:`ShardFile`, :func:`open_shard_file`, :func:`check_shard_structure`, and
  :class:`ShardScan`, every record of a shard in key order);
* :mod:`.pagecache`: what the page cache and the process hold (:func:`resident_bytes`,
  :func:`drop_cached`, :func:`process_memory`);
* :mod:`.hashes`: whole-file scans: :func:`file_sha256`, records and headers in key order
  (through :class:`ShardScan`: nothing on the read side reads a shard through a map), :class:`HeaderStats`.

Everything public is re-exported here: ``from fastload.store import ShardFile`` keeps working.
"""

from __future__ import annotations

from .btree import READ_SLACK, DamagedShardError, Filler, ShardFile, ShardScan, check_shard_structure, close_shared, open_shard_file
from .files import (
    UnusableFileError,
    file_identity,
    file_kind,
    file_problem,
    nowait_read,
    open_regular,
    read_regular,
    stat_regular,
)
from .hashes import HeaderStats, file_sha256, iter_headers, iter_records, open_shard_readonly
from .pagecache import drop_cached, process_memory, resident_bytes

__all__ = [
    "check_shard_structure", "ShardFile", "open_shard_file", "DamagedShardError", "close_shared", "open_shard_readonly",
    "process_memory", "resident_bytes", "drop_cached",
    "iter_records", "iter_headers", "file_sha256", "HeaderStats",
    "UnusableFileError", "file_kind", "stat_regular", "open_regular", "read_regular", "file_problem", "file_identity",
    "READ_SLACK", "nowait_read", "ShardScan", "Filler",
]  # fmt: skip
