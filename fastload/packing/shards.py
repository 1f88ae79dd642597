"""``ShardWriter``: records into size-limited LMDB shards (temp name, fsync, hash, rename)."""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from pathlib import Path
from typing import Any, Callable

from ..errors import PackError, short_message
from ..format import ShardInfo, key, shard_name
from ..store import file_sha256
from .journal import fsync_dir, fsync_file, start_thread

try:
    import lmdb
except ImportError:  # pragma: no cover
    lmdb = None

#: Records per write transaction, and bytes per transaction: fixed so files are reproducible.
TXN_RECORDS = 256
TXN_BYTES = 4 << 20
#: How many times a shard's LMDB map may double while one transaction is written.
MAX_MAP_DOUBLINGS = 8


def write_error(path: Path, e: BaseException, what: str = "cannot write shard") -> PackError:
    msg = e.strerror if isinstance(e, OSError) and e.strerror else short_message(e)
    hint = ""
    if isinstance(e, OSError) and e.errno == errno.ENOSPC or "No space left" in msg:
        hint = "; the disk is full: free space, then continue with --resume"
    elif "MDB_MAP_FULL" in msg or "set_mapsize" in msg:
        hint = "; the shard's LMDB memory map could not grow to hold it"
    return PackError(f"{path}: {what}: {msg}{hint}")


class ShardWriter:
    """Writes records at consecutive global indices into size-limited LMDB shards.

    A shard is written as ``shard-NNNNN.lmdb.tmp`` with a write transaction every
    :data:`TXN_RECORDS` records or :data:`TXN_BYTES` bytes. A finished shard is
    closed, then -- in a background thread, while the next shard is written --
    fsynced, hashed, renamed to ``shard-NNNNN.lmdb`` and reported through
    ``on_shard(info, end, extra)`` (in shard order), where ``end`` is the source
    position after the shard and ``extra`` what ``snapshot()`` returned when the
    shard was closed.

    A new shard starts when the next record would grow the current one beyond
    ``shard_size`` bytes (a record larger than that gets a shard of its own).
    """

    def __init__(
        self,
        directory: Path,
        *,
        shard_size: int,
        first_shard: int = 0,
        first_index: int = 0,
        on_shard: Callable[[ShardInfo, int, Any], None] = lambda info, end, extra: None,
        snapshot: Callable[[], Any] = lambda: None,
    ) -> None:
        self.dir = directory
        self.shard_size = shard_size
        self.shard = first_shard
        self.index = first_index
        self.on_shard = on_shard
        self.snapshot = snapshot
        self.done: list[ShardInfo] = []
        self._env: Any = None
        self._path: Path | None = None
        self._first = first_index
        self._pending: list[tuple[bytes, bytes]] = []
        self._pending_bytes = 0
        self._pending_est = 0
        self._committed = 0
        self._psize = 4096
        self._nodemax = 2038
        self._jobs: list[threading.Thread] = []
        self._error: BaseException | None = None

    # -- size estimate ------------------------------------------------------------------------
    def _estimate(self, vlen: int) -> int:
        node = 16 + vlen  # node header + 8-byte key + value
        if node > self._nodemax:  # overflow pages plus a small leaf node
            return -(-(vlen + 16) // self._psize) * self._psize + 26
        return node + 2

    def _open(self) -> None:
        self._path = self.dir / (shard_name(self.shard) + ".tmp")
        with contextlib.suppress(FileNotFoundError):
            self._path.unlink()
        map_size = max(64 << 20, self.shard_size + (self.shard_size >> 2))
        try:
            self._env = lmdb.open(
                str(self._path), subdir=False, map_size=map_size, lock=False, sync=False, metasync=False,
                readahead=False, meminit=True, max_dbs=0,
            )  # fmt: skip
        except (lmdb.Error, OSError) as e:
            raise write_error(self._path, e) from None
        self._psize = self._env.stat()["psize"]
        self._nodemax = ((self._psize - 16) // 2 & ~1) - 2
        self._first = self.index
        self._committed = 2 * self._psize
        self._pending_est = 0

    def add(self, value: bytes | bytearray, position: int) -> int:
        """Store ``value`` at the next global index; ``position`` is its source position."""
        if self._error is not None:
            self._raise()
        est = self._estimate(len(value))
        if self._env is not None and self.index > self._first:
            if self._committed + self._pending_est + est + 4 * self._psize > self.shard_size:
                self._finish(position)
        if self._env is None:
            self._open()
        self._pending.append((key(self.index), value))
        self._pending_bytes += len(value)
        self._pending_est += est
        self.index += 1
        if len(self._pending) >= TXN_RECORDS or self._pending_bytes >= TXN_BYTES:
            self._flush()
        return self.index - 1

    def _write_batch(self, env: Any, records: list[tuple[bytes, bytes]]) -> None:
        with env.begin(write=True) as txn:
            for k, v in records:
                txn.put(k, v, append=True)

    def _flush(self) -> None:
        if not self._pending:
            return
        assert self._env is not None and self._path is not None
        grown = 0
        while True:
            try:
                self._write_batch(self._env, self._pending)
                break
            except lmdb.MapFullError as e:
                if grown >= MAX_MAP_DOUBLINGS:
                    raise write_error(self._path, e) from None
                grown += 1
                try:
                    self._env.set_mapsize(self._env.info()["map_size"] * 2)
                except (lmdb.Error, OSError) as e2:  # no address space for a larger map
                    raise write_error(self._path, e2) from None
            except (lmdb.Error, OSError) as e:
                raise write_error(self._path, e) from None
        self._committed = (self._env.info()["last_pgno"] + 1) * self._psize
        self._pending.clear()
        self._pending_bytes = 0
        self._pending_est = 0

    def _finish(self, end: int) -> None:
        if self._env is None:
            return
        self._flush()
        assert self._path is not None
        env, self._env = self._env, None
        try:
            env.close()
        except (lmdb.Error, OSError) as e:  # pragma: no cover
            raise write_error(self._path, e) from None
        args = (self._path, self.dir / shard_name(self.shard), self._first, self.index - self._first, end, self.snapshot(), self._jobs[-1:])
        job = threading.Thread(target=self._complete, args=args, name=f"fastload-shard-{self.shard}", daemon=True)
        self.shard += 1
        # no thread to spare (a pids limit): the shard is completed here, before the next is written
        if start_thread(job, f"the thread completing {args[1].name}", inline=lambda: self._complete(*args)):
            self._jobs.append(job)
        elif self._error is not None:
            self._raise()

    def _complete(self, tmp: Path, final: Path, first: int, count: int, end: int, extra: Any, before: list) -> None:
        """fsync, hash and rename a closed shard, then report it (after the previous one)."""
        try:
            sync_errors: list[BaseException] = []

            def sync() -> None:
                try:
                    fsync_file(tmp)
                except BaseException as e:  # a failed write-back (EIO, ENOSPC) fails the shard
                    sync_errors.append(e)

            syncer = threading.Thread(target=sync, daemon=True, name=f"fastload-fsync-{final.name}")
            # the disk writes back while this thread hashes from the page cache (or, with no
            # thread to spare, first the one, then the other)
            started = start_thread(syncer, f"the thread syncing {tmp.name}", inline=sync)
            size = tmp.stat().st_size
            digest = file_sha256(tmp)
            if started:
                syncer.join()
            if sync_errors:
                raise sync_errors[0]
            for job in before:
                job.join()
            if self._error is not None:
                return
            os.replace(tmp, final)
            fsync_dir(self.dir)
            info = ShardInfo(final.name, first, count, size, digest)
            self.done.append(info)
            self.on_shard(info, end, extra)
        except BaseException as e:  # reported to the main thread by add()/close()
            if self._error is None:
                self._error = write_error(tmp, e) if isinstance(e, OSError) else e

    def _raise(self) -> None:
        e = self._error
        assert e is not None
        raise e

    def wait(self) -> None:
        """Wait until every closed shard is renamed and reported; re-raise a background error."""
        for job in self._jobs:
            job.join()
        self._jobs.clear()
        if self._error is not None:
            self._raise()

    def close(self, end: int) -> None:
        """Finish the open shard (if any) and wait for all; ``end`` is the source position after it."""
        self._finish(end)
        self.wait()

    def abort(self) -> None:
        """Stop: the open shard stays ``*.tmp``; shards already closed are still completed."""
        self._pending.clear()
        if self._env is not None:
            with contextlib.suppress(Exception):
                self._env.close()
            self._env = None
        for job in self._jobs:
            job.join()
        self._jobs.clear()
