"""The node-local cache of a dataset in an object store: verified downloads, file locks shared by a node's
ranks, a size limit, and prefetch and eviction that follow the epoch's order.

Layout under ``CACHE/remote/`` (``CACHE`` is ``cache_dir``, else ``$FASTLOAD_CACHE``, else
``~/.cache/fastload``)::

    .space.lock                       held while room is made for a download (every dataset of the node)
    <name>-<sha256(url)[:12]>/
      <sha256(manifest)[:16]>/        one version of the dataset: a local fastload dataset directory
        manifest.json labels.bin ...  the manifest (written last) and its dataset-level files, verified
        shard-00000.lmdb ...          shards, each present only once downloaded in full and verified
        shard-00000.lmdb.part-P-T     a download in progress (its full size reserved at once); one
                                      whose lock is free was left by a killed reader and is deleted
                                      by the next reader that opens the dataset or makes room
        .locks/shard-00000.lmdb.lock  flock: shared while a reader has the shard open, exclusive while
                                      it is downloaded or deleted
        .downloads                    one line per completed shard download (``file pid``)
        .node/rank-R                  the batch rank R stands at in the epoch's plan (eviction)

A shard is downloaded under its exclusive lock into a ``.part`` file, its SHA-256 computed as
the bytes arrive and compared with the manifest's (on a mismatch it is fetched once more, then
:class:`~fastload.errors.CorruptDataError` names it), and renamed into place: a reader never
sees a partial or unverified shard, and the ranks of a node download each shard once while it
is cached. Under a size limit the shards evicted are those no rank of the node reads again, then
those the node needs latest (:mod:`fastload.remote.nodeplan`: each rank knows every local rank's
batches and reads where they stand from ``.node/rank-R``). Readers hold a shared lock on each shard they have open, and only a shard no reader
holds is deleted to make room.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import json
import logging
import math
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

import numpy as np

from ..errors import ConfigError, CorruptDataError, FormatError, RemoteError, printable
from ..format import MANIFEST_NAME, MAX_MANIFEST_BYTES, MAX_SHARD_BYTES, Manifest
from .nodeplan import PositionBoard, first_use_order, local_ranks, next_use, plan_id, shard_uses
from .store import NotFound, RemoteStore
from .url import parse_url

log = logging.getLogger(__name__)

#: Batches ahead within which a shard a reader has open stays open (and pinned in the cache), at
#: least: the loader passes its read-ahead depth + 2 when that is more (a shard the read-ahead
#: threads may be reading is never closed under them).
HOLD_BATCHES = 8

#: Seconds an :meth:`RemoteShards.acquire` takes, past which it counts as a reader waiting for a download.
WAIT_COUNTED = 0.002

#: Seconds :meth:`RemoteShards.close` waits for its download threads to end (a request in flight cannot
#: be interrupted: past this it ends on its own, at its next chunk, answer or timeout).
CLOSE_WAIT = 2.0

_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
          "k": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mib": 1 << 20, "g": 1 << 30, "gib": 1 << 30, "tib": 1 << 40}  # fmt: skip


def parse_limit(value: Any) -> int | None:
    """``cache_limit`` in bytes: None (no limit), an int, or a string like ``"50GB"`` or ``"512MiB"``."""
    if value is None:
        return None
    if isinstance(value, str):
        m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", value)
        unit = m and _UNITS.get(m.group(2).lower())
        if not m or unit is None:
            raise ConfigError(f"cache_limit must be bytes or a size like '50GB' or '512MiB', got {value!r}")
        return max(1, int(float(m.group(1)) * unit))
    if isinstance(value, bool):
        raise ConfigError(f"cache_limit must be bytes or a size like '50GB', got {value!r}")
    from ..errors import as_int

    return as_int("cache_limit", value, lo=1, hint=" (bytes, or a string like '50GB')")


#: ``fetch=`` values: whole shards (the default), or records by range requests.
FETCH_MODES = ("shards", "records")
#: Range requests in flight at once per dataset with ``fetch="records"``.
RANGE_THREADS = 16


def check_fetch(value: Any) -> str:
    """``fetch=``'s value checked (None: ``"shards"``)."""
    if value is None:
        return "shards"
    if not isinstance(value, str) or value not in FETCH_MODES:
        raise ConfigError(
            f"fetch must be 'shards' or 'records', got {value!r}: 'records' reads each record by a range request "
            "(for a global shuffle over more data than cache_limit), 'shards' downloads whole shards"
        )
    return value


def cache_root(cache_dir: Any) -> Path:
    """``cache_dir``, else ``$FASTLOAD_CACHE``, else ``~/.cache/fastload``; then ``remote/``."""
    if cache_dir is None:
        cache_dir = os.environ.get("FASTLOAD_CACHE") or Path.home() / ".cache" / "fastload"
    if not isinstance(cache_dir, (str, os.PathLike)):
        raise ConfigError(f"cache_dir must be a directory path, got {type(cache_dir).__name__}")
    return Path(cache_dir) / "remote"


def dataset_files(manifest_json: dict, where: str = "manifest.json") -> list[dict]:
    """The dataset-level files a manifest lists (``labels`` and any other entry holding ``file``,
    ``bytes`` and ``sha256``), shards excepted; each entry's ``bytes`` checked to be an int within
    the format's limit and its ``sha256`` 64 hex digits, before anything is reserved or fetched.

    Raises:
        FormatError: naming ``where`` and the entry.
    """
    out = []
    for key, v in manifest_json.items():
        if key == "shards":
            continue
        for item in v if isinstance(v, list) else [v]:
            if isinstance(item, dict) and {"file", "bytes", "sha256"} <= set(item):
                size, sha = item["bytes"], item["sha256"]
                if type(size) is not int or not 0 <= size <= MAX_SHARD_BYTES:
                    raise FormatError(f"{where}: {key!r} claims {printable(repr(size))[:80]} bytes; a size is an int in 0..{MAX_SHARD_BYTES}")
                if not (isinstance(sha, str) and re.fullmatch("[0-9a-f]{64}", sha)):
                    raise FormatError(f"{where}: {key!r} has sha256 {printable(repr(sha))[:80]}, not 64 hex digits")
                out.append(item)
    return out


def _cache_error(path: Path, e: OSError, doing: str) -> ConfigError:
    """The one-line error for a cache directory that cannot be used: the path, what failed, why."""
    return ConfigError(
        f"cache_dir: cannot {doing} {printable(str(path))}: {e.strerror or e}; give a writable directory with room "
        "(cache_dir=..., or $FASTLOAD_CACHE)"
    )


def reserve(part: Path, size: int) -> None:
    """Make ``part`` a file of ``size`` bytes, once the disk is seen to have that much free.

    Raises:
        ConfigError: the disk has too little room, or the file cannot be made (naming it).
    """
    try:
        free = shutil.disk_usage(part.parent).free
        if size > free:
            raise OSError(errno.ENOSPC, f"{size} bytes are needed, the disk has {free} free")
        with open(part, "wb") as f:
            f.truncate(size)
    except OSError as e:
        try:
            part.unlink()
        except OSError:
            pass
        raise _cache_error(part, e, "reserve") from None


def _safe_name(name: str, where: str) -> str:
    if not isinstance(name, str) or not name or "/" in name or name in (".", "..") or name.startswith("."):
        raise FormatError(f"{where}: the manifest names a file {name!r}, which is not a plain file name")
    return name


class _Flock:
    """One open lock file; ``lock(mode)`` blocks, ``try_lock`` does not."""

    def __init__(self, path: Path) -> None:
        self.fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)

    def lock(self, mode: int) -> None:
        fcntl.flock(self.fd, mode)

    def try_lock(self, mode: int) -> bool:
        try:
            fcntl.flock(self.fd, mode | fcntl.LOCK_NB)
            return True
        except OSError as e:
            if e.errno in (errno.EAGAIN, errno.EACCES, errno.EWOULDBLOCK):
                return False
            raise

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)  # releases the lock
            self.fd = -1


#: A download in progress: ``NAME.part-PID-THREAD``.
_PART_RE = re.compile(r"(?P<name>[^/]+)\.part-[0-9]+-[0-9]+")


def reclaim_parts(root: Path) -> int:
    """Delete the ``.part`` downloads in the dataset directory ``root`` that no download holds (left by
    a reader killed with ``kill -9``); the bytes freed. A shard's ``.part`` is written only under
    the shard's exclusive lock, a dataset-level file's under ``meta.lock``: a ``.part`` whose lock
    can be taken at once is nobody's. Locks that cannot be taken are skipped, never waited for."""
    try:
        entries = [e for e in os.scandir(root) if _PART_RE.fullmatch(e.name)]
    except OSError:
        return 0
    freed = 0
    for e in entries:
        name = _PART_RE.fullmatch(e.name)["name"]  # type: ignore[index]
        own = root / ".locks" / f"{name}.lock"
        try:
            fl = _Flock(own if own.exists() else root / ".locks" / "meta.lock")
        except OSError:
            continue
        try:
            if fl.try_lock(fcntl.LOCK_EX):
                n = e.stat(follow_symlinks=False).st_size
                os.unlink(e.path)
                freed += n
                log.info("cache: deleted %s (%d bytes), a download its reader left unfinished", e.path, n)
        except OSError:  # gone meanwhile, or the lock cannot be taken on this file system
            pass
        finally:
            fl.close()
    return freed


class RemoteShards:
    """Where a :class:`~fastload.reader.Dataset` opened from a URL gets its files: the node cache.

    Args:
        url: ``s3://bucket/prefix`` (or ``gs://``, ``az://``, ``https://``).
        cache_dir: the node's cache (default ``$FASTLOAD_CACHE`` or ``~/.cache/fastload``).
        cache_limit: bytes the node's remote cache may hold (int or ``"50GB"``); None: no limit.
            Shards the rest of the epoch does not need (on any rank of the node, when the loader
            gives the other ranks' batches) are deleted first, then those needed latest; it is
            exceeded only by shards that readers of the node have open or are downloading because
            a batch waits for them.
        storage_options: endpoint, credentials and client settings (see :class:`RemoteStore`).
        retry_deadline: seconds a request is retried for before a RemoteError (default 180).
        threads: downloads run ahead of the epoch at once (1..64).
        fetch: ``"shards"`` (whole shards, verified by their SHA-256, kept while the limit allows) or
            ``"records"`` (each record by a range request into a sparse copy of its shard, dropped once
            read: :mod:`fastload.remote.ranges`; for a global shuffle over more data than the cache holds).
    """

    def __init__(self, url: Any, *, cache_dir: Any = None, cache_limit: Any = None, storage_options: Any = None,
                 retry_deadline: Any = None, threads: int = 2, fetch: Any = None) -> None:  # fmt: skip
        from ..errors import as_int

        self.url = parse_url(url)
        self.fetch = check_fetch(fetch)
        self.options = {"cache_dir": cache_dir, "cache_limit": cache_limit, "storage_options": storage_options,
                        "retry_deadline": retry_deadline, "fetch": fetch}  # fmt: skip
        self.remote = RemoteStore(self.url, storage_options=storage_options, retry_deadline=retry_deadline)
        self.cache = cache_root(cache_dir)
        self.limit = parse_limit(cache_limit)
        self.threads = as_int("threads", threads, lo=1, hi=64)
        self.manifest: Manifest | None = None
        self.root: Path | None = None
        self._reset()

    def _reset(self) -> None:
        self._pins: dict[int, _Flock] = {}
        self._bad: dict[int, BaseException] = {}
        n = 0 if self.manifest is None else len(self.manifest.shards)
        self._klocks: list[threading.Lock] = [threading.Lock() for _ in range(n)]  # one per shard, made up front
        self._mutex = threading.Lock()
        self._uses: dict[int, np.ndarray] = {}  # this rank's: shard -> positions of the batches that read it
        self._pos = 0
        self._peer_uses: dict[int, dict[int, np.ndarray]] = {}  # the other local ranks' (nodeplan), by rank
        self._peer_pos: dict[int, int] = {}  # where they stood when last read from the board
        self._board: PositionBoard | None = None
        self._boarded = False  # a board was made (peers that never wrote one since are not of this cache)
        self._began = 0.0  # time.time() when the epoch the cache serves began (its plan was made)
        self._cond = threading.Condition(self._mutex)
        self._queue: list[int] = []
        self._workers: list[threading.Thread] = []
        self._stop = False
        self._ahead_stopped = False  # stop_ahead(): the downloads ahead are given up (until the next plan)
        self._pid = os.getpid()
        self.downloads = 0  # shards this process downloaded
        self.waits = 0  # acquires that found the shard missing: a reader waited for its download
        self.waited = 0.0  # seconds those readers waited
        self._fillers: dict[int, Any] = {}  # fetch="records": shard -> its RangeFiller (sparse file open)
        self._range_pool: Any = None
        self._range_pool_pid = 0
        self._range_bytes_done = 0  # bytes brought by range requests into copies since released

    def __getstate__(self) -> dict:
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        for name in ("downloads", "waits", "waited"):
            state.pop(name, None)
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    # ------------------------------------------------------------------ opening
    def open(self) -> Path:
        """Fetch the manifest and the dataset-level files into the cache; the local dataset directory.

        Raises:
            FormatError: no fastload manifest at the URL, or a malformed one.
            CorruptDataError: a dataset-level file differs from the manifest's hash (twice).
            RemoteError: the store refused or did not answer within the deadline.
        """
        where = self.url.child(MANIFEST_NAME)
        try:
            text = self.remote.get(MANIFEST_NAME, limit=MAX_MANIFEST_BYTES)
        except NotFound:
            raise FormatError(
                f"{self.url}: no fastload dataset there ({MANIFEST_NAME} not found: the bucket or prefix is missing, or "
                f"holds no finished pack); create one with `fastload pack SRC {self.url}`"
            ) from None
        manifest = Manifest.loads(text, where=where)
        digest = hashlib.sha256(text).hexdigest()
        url_id = hashlib.sha256(str(self.url).encode()).hexdigest()[:12]
        slug = re.sub(r"[^A-Za-z0-9._-]+", "_", f"{self.url.bucket}_{self.url.prefix}")[-60:].strip("._") or "dataset"
        root = self.cache / f"{slug}-{url_id}" / digest[:16]
        for s in manifest.shards:
            _safe_name(s.file, where)
        files = dataset_files(json.loads(text), str(where))
        try:
            (root / ".locks").mkdir(parents=True, exist_ok=True)
            probe = root / ".locks" / "meta.lock"
            os.close(os.open(probe, os.O_RDWR | os.O_CREAT, 0o644))
        except OSError as e:  # a file, read-only, under /proc, a full disk
            raise _cache_error(root, e, "use") from None
        reclaim_parts(root)  # what readers killed mid-download left here
        if not (root / MANIFEST_NAME).exists():
            meta = _Flock(root / ".locks" / "meta.lock")
            try:
                meta.lock(fcntl.LOCK_EX)
                if not (root / MANIFEST_NAME).exists():
                    for item in files:
                        self._fetch_verified(root, _safe_name(item["file"], where), item["bytes"], item["sha256"])
                    self._write_atomic(root / MANIFEST_NAME, text)  # last: its presence says the rest is there
            except OSError as e:
                raise _cache_error(root, e, "write into") from None
            finally:
                meta.close()
        self.manifest, self.root = manifest, root
        self._klocks = [threading.Lock() for _ in manifest.shards]
        return root

    def _write_atomic(self, path: Path, data: bytes) -> None:
        tmp = path.with_name(f"{path.name}.part-{os.getpid()}-{threading.get_ident()}")
        tmp.write_bytes(data)
        os.replace(tmp, path)

    def _fetch_verified(self, root: Path, name: str, size: int, sha256: str) -> None:
        """Download ``name`` into ``root`` through a ``.part`` file; rename only once its hash matches."""
        path = root / name
        part = root / f"{name}.part-{os.getpid()}-{threading.get_ident()}"
        try:
            for attempt in (1, 2):
                h = hashlib.sha256()
                reserve(part, size)
                try:
                    self.remote.download(name, part, size, progress=h.update)
                    if h.hexdigest() == sha256:
                        os.replace(part, path)
                        return
                except OSError as e:  # the disk filled up, the directory went away
                    raise _cache_error(part, e, "write") from None
                log.warning("%s: SHA-256 differs from the manifest (try %d of 2)", self.url.child(name), attempt)
            raise CorruptDataError(
                f"{self.url.child(name)}: SHA-256 of the downloaded bytes differs from the manifest, twice; the object was "
                "altered after packing (nothing of it was used): pack the dataset again"
            )
        finally:
            try:
                part.unlink()
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ shards
    def _paths(self, k: int) -> tuple[Path, Path]:
        assert self.root is not None and self.manifest is not None
        name = self.manifest.shards[k].file
        return self.root / name, self.root / ".locks" / f"{name}.lock"

    def _present(self, k: int) -> bool:
        path, _ = self._paths(k)
        try:
            return path.stat().st_size == self.manifest.shards[k].bytes  # type: ignore[union-attr]
        except FileNotFoundError:
            return False

    def acquire(self, k: int) -> Path:
        """Shard ``k``'s local, verified file, downloaded first if needed, and pinned (not deleted)
        until :meth:`release`. Safe from many threads and processes.

        Raises:
            CorruptDataError: its bytes differ from the manifest's hash, twice.
            RemoteError: the store did not answer within the deadline.
        """
        if self.fetch == "records":
            return self._acquire_sparse(k)
        path, lockpath = self._paths(k)
        with self._klocks[k]:
            if k in self._pins:
                return path
            if k in self._bad:
                raise self._bad[k]
            try:
                fl = _Flock(lockpath)
            except OSError as e:
                raise _cache_error(lockpath, e, "create") from None
            t0 = time.monotonic()
            try:
                while True:
                    fl.lock(fcntl.LOCK_SH)  # waits while a thread or rank downloads it
                    if self._present(k):
                        self._pins[k] = fl
                        if time.monotonic() - t0 > WAIT_COUNTED:
                            self.waits += 1
                            self.waited += time.monotonic() - t0
                        return path
                    fl.lock(fcntl.LOCK_EX)  # another rank may be downloading it: wait for it
                    if not self._present(k):
                        try:
                            self._download(k, urgent=True)
                        except (CorruptDataError, RemoteError) as e:
                            self._bad[k] = e
                            raise
            except BaseException:
                fl.close()
                raise

    def release(self, k: int) -> None:
        """Unpin shard ``k`` (its file may now be deleted to make room); with ``fetch="records"``, delete
        this process's sparse copy of it."""
        with self._klocks[k]:
            fl = self._pins.pop(k, None)
            filler = self._fillers.pop(k, None)
        if fl is not None:
            fl.close()
        if filler is not None:
            self._range_bytes_done += filler.filler.fetched
            filler.close()

    @property
    def range_bytes(self) -> int:
        """Bytes this process fetched by range requests (``fetch="records"``)."""
        return self._range_bytes_done + sum(f.filler.fetched for f in list(self._fillers.values()))

    # ------------------------------------------------------------------ fetch="records"
    def _sparse_path(self, k: int) -> Path:
        assert self.root is not None and self.manifest is not None
        return self.root / ".ranges" / f"{self.manifest.shards[k].file}.{os.getpid()}"

    def _acquire_sparse(self, k: int) -> Path:
        """This process's sparse copy of shard ``k`` (made if needed), filled by range requests."""
        from concurrent.futures import ThreadPoolExecutor

        from .ranges import SparseShard

        path = self._sparse_path(k)
        with self._klocks[k]:
            if k in self._bad:
                raise self._bad[k]
            f = self._fillers.get(k)
            if f is not None and f.pid == os.getpid():
                return path
            shard = self.manifest.shards[k]  # type: ignore[union-attr]
            try:
                meta = self.remote.head(shard.file)
                if meta is None:
                    raise FormatError(f"{self.url.child(shard.file)}: shard {k} is missing from the store; the dataset is incomplete")
                if meta["size"] != shard.bytes:
                    raise CorruptDataError(
                        f"{self.url.child(shard.file)}: shard {k} is {meta['size']} bytes, the manifest says {shard.bytes}; "
                        "the dataset in the store was altered or is being replaced"
                    )
            except (CorruptDataError, FormatError, RemoteError) as e:
                self._bad[k] = e
                raise
            with self._mutex:
                if self._range_pool is None or self._range_pool_pid != os.getpid():
                    self._range_pool = ThreadPoolExecutor(RANGE_THREADS, thread_name_prefix="fastload-range")
                    self._range_pool_pid = os.getpid()
            self._fillers[k] = SparseShard(path, self.remote, shard.file, shard.bytes, meta["e_tag"] or None, self._range_pool)
            return path

    def filler(self, k: int) -> Any:
        """Shard ``k``'s :class:`~fastload.store.Filler` (``fetch="records"``, after :meth:`acquire`), else None."""
        f = self._fillers.get(k)
        return None if f is None else f.filler

    def pinned(self) -> list[int]:
        return sorted(self._pins)

    def _download(self, k: int, *, urgent: bool) -> bool:
        """Download shard ``k`` (its exclusive lock held); False if not urgent and no room was made."""
        shard = self.manifest.shards[k]  # type: ignore[union-attr]
        path, _ = self._paths(k)
        part = path.with_name(f"{path.name}.part-{os.getpid()}-{threading.get_ident()}")
        if not self._make_room(k, shard.bytes, part, urgent=urgent):
            return False
        try:
            for attempt in (1, 2):
                h = hashlib.sha256()
                # a download ahead stops when the cache is closed; one a reader waits for does not
                try:
                    self.remote.download(shard.file, part, shard.bytes, progress=h.update,
                                         cancelled=None if urgent else self._stopped)  # fmt: skip
                except OSError as e:  # the disk filled up, the directory went away
                    raise _cache_error(part, e, "write") from None
                if h.hexdigest() == shard.sha256:
                    os.replace(part, path)
                    self.downloads += 1
                    with open(self.root / ".downloads", "a") as f:  # type: ignore[operator]
                        f.write(f"{shard.file} {os.getpid()}\n")
                    return True
                log.warning("%s: SHA-256 differs from the manifest (try %d of 2)", self.url.child(shard.file), attempt)
            raise CorruptDataError(
                f"{self.url.child(shard.file)}: shard {k}: SHA-256 of the downloaded bytes differs from the manifest, "
                "twice; the object was altered after packing (none of it was used): pack the dataset again"
            )
        finally:
            try:
                part.unlink()
            except FileNotFoundError:
                pass

    # ------------------------------------------------------------------ the size limit
    def usage(self) -> int:
        """Bytes of the node's remote cache: shards, downloads in progress (their full size), other files."""
        total = 0
        for dirpath, _dirs, files in os.walk(self.cache):
            for f in files:
                if not f.endswith(".lock"):
                    try:
                        st = os.lstat(os.path.join(dirpath, f))
                    except FileNotFoundError:
                        continue
                    # a fetch="records" copy is sparse: what it holds is its blocks; a reserved .part is its size
                    total += st.st_blocks * 512 if os.path.basename(dirpath) == ".ranges" else st.st_size
        return total

    def _next_use(self, k: int) -> float:
        """Shard ``k``'s next use on the node: by this rank from its position, or by another local rank
        from the position it last wrote on the board (:mod:`fastload.remote.nodeplan`)."""
        nxt = next_use(self._uses, k, self._pos)
        for r, uses in self._peer_uses.items():
            nxt = min(nxt, next_use(uses, k, self._peer_pos.get(r, self._pos)))
        return nxt

    def _candidates(self) -> list[tuple[float, float, Path, Path]]:
        """Cached shards of every dataset of the node: ``(next use here, -mtime, file, lock)``."""
        out = []
        mine = {s.file: k for k, s in enumerate(self.manifest.shards)}  # type: ignore[union-attr]
        for mpath in self.cache.glob(f"*/*/{MANIFEST_NAME}"):
            root = mpath.parent
            try:
                names = [s["file"] for s in json.loads(mpath.read_bytes())["shards"]]
            except (OSError, ValueError, KeyError, TypeError):
                continue
            for name in names:
                if not isinstance(name, str) or "/" in name:
                    continue
                p = root / name
                try:
                    mtime = p.stat().st_mtime
                except OSError:
                    continue
                nxt = self._next_use(mine[name]) if root == self.root and name in mine else math.inf
                out.append((nxt, -mtime, p, root / ".locks" / f"{name}.lock"))
        # never needed again first, then those not downloaded since the epoch began (needed latest first: each is
        # downloaded at most once this epoch all the same), then the others needed latest, then the oldest
        out.sort(key=lambda t: (t[0] != math.inf, -t[1] >= self._began, -t[0], t[1]))
        return out

    def _before_in_order(self, k: int) -> bool:
        """Whether a download ahead of ``k`` would jump the node's order: a shard some local rank needs before ``k``
        is neither cached nor being downloaded. Each rank's threads fetch ahead on their own; taking the node's
        free room for a shard needed later leaves none for the one needed first, and the batch that waits for it
        then evicts a shard still needed (downloaded twice)."""
        assert self.root is not None and self.manifest is not None
        mine = self._next_use(k)
        try:
            there = os.listdir(self.root)
        except OSError:
            return False
        held = {n.split(".part-")[0] if ".part-" in n else n for n in there}
        return any(self._next_use(j) < mine for j, s in enumerate(self.manifest.shards) if j != k and s.file not in held)

    def _make_room(self, k: int, size: int, part: Path, *, urgent: bool) -> bool:
        """Delete unpinned shards until ``size`` more bytes fit in the limit, then reserve them (``part``
        made at its full size). Uses are the node's: every local rank's, from where each stands
        (:mod:`fastload.remote.nodeplan`). A prefetch (not ``urgent``) deletes only shards whose last
        use this epoch is past (or of another dataset), and shards not downloaded since the epoch began that it
        needs later than ``k``, and gives up if that is not enough: a shard downloaded this epoch and
        still needed is never traded for one needed later, so none is downloaded twice in an epoch
        whose working set fits; nor does it fetch ``k`` while a shard the node needs first is missing
        (:meth:`_before_in_order`). A batch waiting for ``k`` deletes those first, then the shards needed
        latest, and goes over the limit only when every other shard is pinned."""
        space = _Flock(self.cache / ".space.lock")
        try:
            space.lock(fcntl.LOCK_EX)
            for root in self.cache.glob("*/*/"):  # downloads left unfinished by killed readers, any dataset
                reclaim_parts(root)
            if self.limit is not None:
                board = self._board
                if board is not None:  # where the node's other ranks stand now
                    self._peer_pos = board.positions(self._pos)
                if not urgent and self._before_in_order(k):
                    return False
                used = self.usage()
                mine = self._next_use(k)
                for nxt, m, p, lockp in self._candidates() if used + size > self.limit else []:
                    if used + size <= self.limit:
                        break
                    if p == self._paths(k)[0] or (not urgent and nxt != math.inf and (-m >= self._began or nxt <= mine)):
                        continue
                    fl = _Flock(lockp)
                    try:
                        if fl.try_lock(fcntl.LOCK_EX):
                            try:
                                n = p.stat().st_size
                                p.unlink()
                                used -= n
                                log.debug("cache: deleted %s (%d bytes) to make room", p, n)
                            except FileNotFoundError:
                                pass
                    finally:
                        fl.close()
                if used + size > self.limit:
                    if not urgent:
                        return False
                    log.info("cache over its limit: %s is needed now and every cached shard is in use", part.name)
            reserve(part, size)
            return True
        finally:
            space.close()

    # ------------------------------------------------------------------ following the epoch
    def follow(self, batches: list, firsts: list[int], ahead: Callable[[Iterable], Iterator],
               release: Callable[[int], None], *, hold: int = HOLD_BATCHES,
               peers: Callable[[int], Iterable] | None = None, rank: int = 0, world_size: int = 1) -> Iterator:  # fmt: skip
        """Yield ``ahead(batches)`` unchanged while downloading the shards they need in order of first
        use, and closing (through ``release(k)``) shards a reader has open that the next ``hold``
        batches do not need. ``batches`` are the rest of the epoch.

        ``peers(r)``: the same stretch of the epoch as rank ``r`` of ``world_size`` reads it (this one
        is ``rank``). Given, and with whole shards under a limit, the evictions follow the uses of every
        rank of the node (:func:`~fastload.remote.nodeplan.local_ranks`), not only this one's."""
        hold = max(HOLD_BATCHES, int(hold))
        others: dict[int, list] = {}
        if peers is not None and self.limit is not None and self.fetch == "shards":
            others = {r: list(peers(r)) for r in local_ranks(rank, world_size) if r != rank}
        self._plan(batches, firsts, others, rank=rank)
        board = self._board
        try:
            for pos, b in enumerate(ahead(batches)):
                with self._cond:
                    self._pos = pos
                    self._cond.notify_all()
                if board is not None:
                    board.publish(pos)
                for k in self.pinned():
                    if next_use(self._uses, k, pos) > pos + hold:  # this rank's own uses: its open files
                        release(k)
                yield b
        finally:
            if board is not None:  # past its end: this rank needs nothing more of the plan
                board.publish(len(batches))
            with self._cond:  # the epoch is over (or abandoned): its downloads ahead are not wanted
                self._queue = []
                self._cond.notify_all()

    def _plan(self, batches: list, firsts: list[int], peers: dict[int, list] | None = None, *, rank: int = 0) -> None:
        """Make ``batches`` the epoch the cache serves: each shard's uses (for eviction; with ``peers``,
        the other local ranks' batches, theirs too, and a position board) and, with whole shards, the
        download queue in order of first use on the node, its threads started."""
        uses, order = shard_uses(batches, firsts)
        peer_uses = {r: shard_uses(b, firsts)[0] for r, b in (peers or {}).items()}
        board = None
        if peer_uses and self.root is not None:
            node = {rank: uses, **peer_uses}
            order = first_use_order(node)
            board = PositionBoard(self.root / ".node", plan_id(node), rank, peer_uses, first=not self._boarded)
            self._boarded = True
            board.publish(0)
        with self._cond:
            old, self._board = self._board, board
            self._uses, self._peer_uses = uses, peer_uses
            self._peer_pos = {r: 0 for r in peer_uses}  # until the board is read: not begun yet
            self._pos = 0
            self._began = time.time() - 1.0  # shards whose files are older were downloaded before this epoch
            self._queue = order if self.fetch == "shards" else []  # records: the read-ahead asks for them
            self._ahead_stopped = False
            self._cond.notify_all()
        if old is not None:
            old.close()
        if self.fetch == "shards":
            self._start_workers()

    def fits(self) -> bool:
        """Whether every shard fits in the cache at once (no limit, or a limit of at least their bytes)."""
        assert self.manifest is not None
        return self.limit is None or self.limit >= sum(int(s.bytes) for s in self.manifest.shards)

    def room_for_shards(self) -> int | None:
        """Bytes of ``cache_limit`` an epoch's shards may take (None without a limit): the limit less this
        dataset's own files (manifest, labels) and the downloads ahead in flight (``threads`` of the largest
        shards), so an order sized to it keeps the cache within the limit."""
        assert self.manifest is not None and self.root is not None
        if self.limit is None:
            return None
        names = {s.file for s in self.manifest.shards}
        own = sum(p.stat().st_size for p in self.root.iterdir() if p.is_file() and p.name not in names and ".part-" not in p.name)
        ahead = sum(sorted((int(s.bytes) for s in self.manifest.shards), reverse=True)[: self.threads])
        return max(0, self.limit - own - ahead)

    @staticmethod
    def batches_held(prefetch: int) -> int:
        """Batches of a rank whose shards may be open at once: the read-ahead's (``prefetch + 2``, as the
        loader's core sets it) and those held open after a batch (:data:`HOLD_BATCHES`, or that depth + 2)."""
        depth = max(2, int(prefetch) + 2)
        return depth + max(HOLD_BATCHES, depth + 2)

    def prefetch(self, batches: list, firsts: list[int]) -> bool:
        """Start downloading the shards ``batches`` (an epoch not started yet) need, in order of first use,
        so that they arrive while the training script is still setting up. Only with whole shards that all
        fit in the cache: nothing fetched early is then evicted before the epoch reads it. :meth:`follow`
        replaces the order when the epoch starts. Returns whether it started."""
        if self.fetch != "shards" or not self.fits():
            return False
        self._plan(batches, firsts)
        return True

    def _start_workers(self) -> None:
        with self._mutex:
            if os.getpid() != self._pid:
                self._reset_after_fork()
            self._workers = [t for t in self._workers if t.is_alive()]
            while len(self._workers) < self.threads:
                t = threading.Thread(target=self._prefetch_loop, name="fastload-remote-prefetch", daemon=True)
                t.start()
                self._workers.append(t)

    def _reset_after_fork(self) -> None:
        self._workers, self._pins, self._pid = [], {}, os.getpid()

    def _prefetch_loop(self) -> None:
        while True:
            with self._cond:
                if self._stopped() or not self._queue:  # nothing left to fetch ahead this epoch
                    self._workers = [t for t in self._workers if t is not threading.current_thread()]
                    return
                k = self._queue.pop(0)
            fl = None
            try:  # whatever fails here (a lock file that cannot be made) the reader that needs shard k reports
                if k in self._pins or k in self._bad or self._present(k) or self._next_use(k) == math.inf:
                    continue  # cached, failed, or already read by every rank of the node (a retry come too late)
                fl = _Flock(self._paths(k)[1])
                if not fl.try_lock(fcntl.LOCK_EX):  # another thread or rank downloads it, or tries to make room for it
                    with self._cond:  # kept, one place back: dropped, it would be missing if that rank found no room
                        self._queue.insert(min(1, len(self._queue)), k)
                        if len(self._queue) == 1:  # nothing else to do meanwhile
                            self._cond.wait(0.05)
                    continue
                if not self._present(k) and not self._download(k, urgent=False):
                    fl.close()  # unlocked before waiting: a thread that pops k meanwhile must not find it taken and drop it
                    fl = None
                    with self._cond:  # no room yet: try again (k first, the order kept) once the epoch has moved on
                        self._queue.insert(0, k)
                        self._cond.wait(0.5)
            except Exception as e:  # noqa: BLE001 - the reader that needs it reports the problem
                log.debug("prefetch of shard %d failed: %s", k, e)
            finally:
                if fl is not None:
                    fl.close()

    def _stopped(self) -> bool:
        return self._stop or self._ahead_stopped

    def stop_ahead(self) -> None:
        """Give up the downloads ahead of the epoch (the loader reading it was closed or dropped): the
        queue is emptied, a download under way gives up at its next chunk or retry, and the threads are
        waited for up to :data:`CLOSE_WAIT` seconds. The next epoch's plan starts them again."""
        with self._cond:
            self._queue = []
            self._ahead_stopped = True
            self._cond.notify_all()
            workers = list(self._workers) if os.getpid() == self._pid else []
        end = time.monotonic() + CLOSE_WAIT
        for t in workers:
            if t is not threading.current_thread():
                t.join(max(0.0, end - time.monotonic()))

    def close(self) -> None:
        """Stop the prefetch threads (as :meth:`stop_ahead`, for good) and unpin every shard."""
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self.stop_ahead()
        board, self._board = self._board, None
        if board is not None:
            board.close()
        for k in sorted(set(self.pinned()) | set(self._fillers)):
            self.release(k)
        pool, self._range_pool = self._range_pool, None
        if pool is not None and getattr(self, "_range_pool_pid", None) == os.getpid():
            pool.shutdown(wait=False, cancel_futures=True)

    def __repr__(self) -> str:
        return f"RemoteShards({printable(str(self.url))!r}, cache={str(self.cache)!r}, limit={self.limit})"
