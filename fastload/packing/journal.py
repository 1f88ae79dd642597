"""The resume journal of an unfinished pack, and the fsync, atomic-write, lock and thread-start helpers it relies on."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import threading
from pathlib import Path
from typing import Any, Callable

from ..errors import FastloadError, PackError, short_message
from ..format import ShardInfo

JOURNAL_NAME = "journal.json"
JOURNAL_FORMAT = "fastload-journal"
JOURNAL_VERSION = 1


# ============================================================================ shard writing


def fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def atomic_write(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fsync_dir(path.parent)



def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)



# ============================================================================ journal and stats


@dataclasses.dataclass
class Journal:
    """``OUT.partial/journal.json``: how far an unfinished pack got (JSON, no pickle)."""

    source: str
    source_fingerprint: str
    options: dict[str, Any]
    shards: list[dict[str, Any]] = dataclasses.field(default_factory=list)  # ShardInfo + end + skipped
    skipped: list[dict[str, str]] = dataclasses.field(default_factory=list)

    @property
    def position(self) -> int:
        return int(self.shards[-1]["end"]) if self.shards else 0

    def save(self, directory: Path, *, skipped: list[dict[str, str]] | None = None) -> None:
        d = {
            "format": JOURNAL_FORMAT,
            "version": JOURNAL_VERSION,
            "source": self.source,
            "source_fingerprint": self.source_fingerprint,
            "options": self.options,
            "position": self.position,
            "shards": self.shards,
            "skipped": self.skipped if skipped is None else skipped,
        }
        atomic_write(directory / JOURNAL_NAME, (json.dumps(d, indent=1, ensure_ascii=True) + "\n").encode())

    @classmethod
    def load(cls, directory: Path) -> "Journal":
        p = directory / JOURNAL_NAME
        try:
            d = json.loads(p.read_bytes())
            if d.get("format") != JOURNAL_FORMAT or int(d.get("version", 0)) != JOURNAL_VERSION:
                raise ValueError(f"format {d.get('format')!r} version {d.get('version')!r}")
            j = cls(str(d["source"]), str(d["source_fingerprint"]), dict(d["options"]), list(d["shards"]), list(d["skipped"]))
            for s in j.shards:
                ShardInfo.from_json(s, where=str(p))
                int(s["end"]), int(s["skipped"])
        except FileNotFoundError:
            raise PackError(f"{directory}: no {JOURNAL_NAME}; it cannot be resumed: start over with --overwrite") from None
        except (OSError, ValueError, KeyError, TypeError, AttributeError, OverflowError, RecursionError, FastloadError) as e:
            raise PackError(f"{p}: unreadable journal ({short_message(e)}); start over with --overwrite") from None
        return j


# ---------------------------------------------------------------------------- locks across fork

_HELD: set[int] = set()  # descriptors of the flocks this process holds


def _close_held_in_child() -> None:
    # a forked worker must not keep its parent's lock alive after the parent dies
    for fd in list(_HELD):
        with contextlib.suppress(OSError):
            os.close(fd)
    _HELD.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_held_in_child)


def hold_lock(fd: int) -> None:
    """Note that ``fd`` carries a lock of this process: forked children close their copy of it."""
    _HELD.add(fd)


def release_lock(fd: int) -> None:
    """``fd`` no longer carries a lock (call before closing it)."""
    _HELD.discard(fd)


class HeldLock:
    """An open descriptor ``fd`` of ``path`` carrying an ``flock`` of this process (see :func:`hold_lock`)."""

    def __init__(self, fd: int, path: Any) -> None:
        self.fd: int | None = fd
        self.path = path

    def release(self) -> None:
        """Drop the lock and close the descriptor (idempotent); the file stays (removing it would race with a new
        holder)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            release_lock(fd)
            with contextlib.suppress(OSError):
                os.close(fd)


# ---------------------------------------------------------------------------- threads that cannot start

_log = logging.getLogger(__name__)

#: What to do when a thread or process cannot start.
LIMIT_HINT = (
    "this process may not start more threads or processes (a pids cgroup's pids.max, systemd TasksMax, "
    "ulimit -u, or memory): raise that limit, or pack with fewer processes (--workers 1 starts none); "
    "continue with --resume: the finished shards are kept"
)


def cannot_start(what: str, e: BaseException) -> PackError:
    """The error of a thread or process ``what`` that could not start because of ``e``."""
    return PackError(f"pack: cannot start {what} ({type(e).__name__}: {short_message(e)}); {LIMIT_HINT}")


def start_thread(thread: threading.Thread, what: str, *, inline: Callable[[], None] | None = None) -> bool:
    """Start ``thread``; True if it runs.

    When it cannot start (``RuntimeError: can't start new thread``), ``inline`` (the
    thread's work, done in this thread instead) is called and False returned; without
    ``inline`` it is a :class:`PackError` naming ``what`` with :data:`LIMIT_HINT`.
    """
    try:
        thread.start()
        return True
    except RuntimeError as e:
        if inline is None:
            raise cannot_start(what, e) from None
        _log.debug("cannot start %s (%s): doing its work in this thread", what, short_message(e))
    inline()
    return False
