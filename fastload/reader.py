"""Read-only random access to a packed dataset. Knows nothing of DALI or torch."""

from __future__ import annotations

import bisect
import hashlib
import mmap
import operator
import os
import struct
import threading
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import CorruptDataError, DependencyError, FormatError
from .format import (
    HEADER_SIZE,
    LABELS_NAME,
    MANIFEST_NAME,
    Manifest,
    RecordHeader,
    KEY,
    ShardInfo,
    decode_header,
    record_path,
)

try:  # lmdb is a hard dependency; keep the hint readable anyway
    import lmdb
except ImportError as e:  # pragma: no cover - exercised only without lmdb
    lmdb = None
    _lmdb_error = e

# py-lmdb refuses to open one environment twice in a process: share one handle per
# shard file per process (the pid guards against handles inherited through fork).
# The file's identity (inode, size, mtime) is kept beside it, so a shard replaced on
# disk (a pack with --overwrite into the same OUT) is reopened, not read stale.
_ENVS: dict[tuple[int, str], "lmdb.Environment"] = {}
_ENV_IDS: dict[tuple[int, str], tuple[int, int, int]] = {}
_ENVS_LOCK = threading.Lock()
# Shard files whose LMDB structure was checked (path, identity), so each is checked once per process.
_CHECKED: set[tuple[str, tuple[int, int, int]]] = set()


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
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return _check_pages(mm, size, None if first is None or count is None else (first, count))
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


def _open_env(path: str, identity: tuple[int, int, int] | None = None) -> "lmdb.Environment":
    k = (os.getpid(), path)
    with _ENVS_LOCK:
        env = _ENVS.get(k)
        if env is not None and identity is not None and _ENV_IDS.get(k) != identity:
            env.close()  # the file on disk is not the one this handle maps
            env = None
        if env is None:
            try:
                env = lmdb.open(
                    path, subdir=False, readonly=True, lock=False, readahead=False, meminit=False, max_readers=1024
                )
            except lmdb.Error:
                # Forked after the parent opened this file: py-lmdb's registry of open
                # files came along and refuses a second handle. The parent's read-only,
                # lock-free mapping was inherited too and is safe to read: adopt it.
                env = next((e for (pid, q), e in _ENVS.items() if q == path and pid != k[0]), None)
                if env is None:
                    raise
            _ENVS[k] = env
            if identity is not None:
                _ENV_IDS[k] = identity
    return env


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate ``manifest.json`` of the dataset directory ``path``."""
    root = Path(path)
    if not root.exists():
        raise FormatError(f"{root}: no such dataset directory; create one with `fastload pack SRC {root}`")
    if not root.is_dir():
        raise FormatError(f"{root}: not a directory; a packed dataset is a directory made by `fastload pack`")
    mpath = root / MANIFEST_NAME
    if not mpath.is_file():
        hint = " (an unfinished pack: continue it with `fastload pack --resume`)" if any(root.glob("*.tmp")) else ""
        raise FormatError(f"{mpath}: missing manifest; {root} is not a complete fastload dataset{hint}")
    try:
        text = mpath.read_bytes()
    except OSError as e:
        raise FormatError(f"{mpath}: cannot read manifest: {e.strerror}") from None
    return Manifest.loads(text, where=str(mpath))


class Dataset:
    """A packed dataset: ``len(ds)``, ``ds[i] -> (encoded bytes, label)``.

    Opening reads only the manifest and the labels; shards are opened lazily, one
    shared read-only handle per shard per process, so a ``Dataset`` may be used
    from many threads and processes (including forked DataLoader workers) at once.

    Args:
        path: directory written by :func:`fastload.pack`.
        check: verify each payload's CRC-32 on read (about 1 ms per MB; off by default
            for raw reads, on in :class:`fastload.FastLoader`).
    """

    def __init__(self, path: str | os.PathLike, *, check: bool = False) -> None:
        if lmdb is None:  # pragma: no cover
            raise DependencyError(f"lmdb is not importable ({_lmdb_error}); pip install lmdb")
        self.path = Path(path)
        self.check = bool(check)
        self.manifest = read_manifest(self.path)
        self._firsts = [s.first for s in self.manifest.shards]
        self._labels = self._read_labels()
        self._envs: list["lmdb.Environment" | None] = [None] * len(self.manifest.shards)
        self._pid = os.getpid()

    # -- metadata ---------------------------------------------------------------------------
    def _read_labels(self) -> np.ndarray:
        p = self.path / LABELS_NAME
        n = self.manifest.num_samples
        try:
            size = p.stat().st_size  # before reading: a replaced file may be huge
            raw = p.read_bytes() if size == 4 * n else b""
        except OSError as e:
            raise FormatError(f"{p}: cannot read labels: {e.strerror}") from None
        if len(raw) != 4 * n:
            raise CorruptDataError(f"{p}: {size} bytes, expected {4 * n} for {n} samples; pack the dataset again")
        if hashlib.sha256(raw).hexdigest() != self.manifest.labels_sha256:
            raise CorruptDataError(f"{p}: SHA-256 differs from the manifest; the labels were altered")
        labels = np.frombuffer(raw, dtype="<i4").astype(np.int64)
        if n and (labels.min() < 0 or labels.max() >= len(self.manifest.classes)):
            raise CorruptDataError(f"{p}: labels outside 0..{len(self.manifest.classes) - 1}")
        labels.setflags(write=False)
        return labels

    @property
    def classes(self) -> list[str]:
        """Class names in label order."""
        return list(self.manifest.classes)

    @property
    def labels(self) -> np.ndarray:
        """All labels (int64, read-only), without touching the shards."""
        return self._labels

    @property
    def shards(self) -> list[ShardInfo]:
        return list(self.manifest.shards)

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        m = self.manifest
        return f"Dataset({str(self.path)!r}, samples={m.num_samples}, classes={len(m.classes)}, shards={len(m.shards)})"

    # -- records ----------------------------------------------------------------------------
    def _shard_of(self, index: int) -> ShardInfo:
        return self.manifest.shards[bisect.bisect_right(self._firsts, index) - 1]

    def _env(self, k: int) -> "lmdb.Environment":
        """The open environment of shard ``k``, checked against the manifest on first use."""
        if self._pid != os.getpid():  # forked: handles of the parent are not ours
            self._envs = [None] * len(self._envs)
            self._pid = os.getpid()
        env = self._envs[k]
        if env is not None:
            return env
        shard = self.manifest.shards[k]
        fpath = str(self.path / shard.file)
        # A truncated file read through mmap kills the process with SIGBUS: check first.
        try:
            st = os.stat(fpath)
        except OSError:
            raise FormatError(f"{fpath}: shard file is missing; the dataset is incomplete") from None
        if st.st_size != shard.bytes:
            raise CorruptDataError(
                f"{fpath}: shard is {st.st_size} bytes, the manifest says {shard.bytes}; "
                "it was truncated or replaced (run `fastload verify`)"
            )
        identity = (st.st_ino, st.st_size, st.st_mtime_ns)
        if (fpath, identity) not in _CHECKED:
            problem = check_shard_structure(fpath, st.st_size, first=shard.first, count=shard.count)
            if problem:
                raise CorruptDataError(f"{fpath}: damaged shard ({problem}); run `fastload verify {self.path}`")
            _CHECKED.add((fpath, identity))
        try:
            env = _open_env(fpath, identity)
        except lmdb.Error as e:
            raise CorruptDataError(f"{fpath}: cannot open shard: {e}") from None
        self._envs[k] = env
        return env

    def _index(self, index: int) -> int:
        n = self.manifest.num_samples
        try:
            i = operator.index(index)
        except TypeError:
            raise TypeError(f"dataset index must be an integer, got {type(index).__name__}") from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {index} out of range for a dataset of {n} samples")
        return i

    def _read(self, index: int, *, check: bool, want_path: bool) -> tuple[RecordHeader, bytes, str | None]:
        """Header, payload and (optionally) source path of one sample: the hot path."""
        i = self._index(index)
        k = bisect.bisect_right(self._firsts, i) - 1
        env = self._env(k)
        try:
            with env.begin(buffers=True) as txn:
                value = txn.get(KEY.pack(i))
                if value is None:
                    raise CorruptDataError(f"{self._where(k, i)}: record missing from its shard")
                try:
                    header = decode_header(value, where="")
                except CorruptDataError as e:
                    raise CorruptDataError(f"{self._where(k, i)}{e}") from None
                start = HEADER_SIZE + header.path_len
                payload = bytes(value[start:])
                path = bytes(value[HEADER_SIZE:start]).decode("utf-8", "surrogateescape") if want_path else None
        except lmdb.Error as e:
            raise CorruptDataError(f"{self._where(k, i)}: LMDB error: {e}") from None
        if header.label != self._labels[i]:
            raise CorruptDataError(f"{self._where(k, i)}: label {header.label} differs from labels.bin ({int(self._labels[i])})")
        if check and zlib.crc32(payload) != header.crc32:
            raise CorruptDataError(f"{self._where(k, i)}: payload CRC-32 mismatch (the image bytes were altered)")
        return header, payload, path

    def _where(self, k: int, i: int) -> str:
        return f"{self.path / self.manifest.shards[k].file} sample {i}"

    def location(self, index: int) -> str:
        """``"<shard path> sample <index>"``: how the reader's own errors name a sample."""
        i = self._index(index)
        return self._where(bisect.bisect_right(self._firsts, i) - 1, i)

    def raw(self, index: int) -> tuple[RecordHeader, bytes, str]:
        """``(header, stored value, description)`` of one sample, validated against its header."""
        i = self._index(index)
        k = bisect.bisect_right(self._firsts, i) - 1
        env = self._env(k)
        where = self._where(k, i)
        try:
            with env.begin() as txn:
                value = txn.get(KEY.pack(i))
        except lmdb.Error as e:
            raise CorruptDataError(f"{where}: LMDB error: {e}") from None
        if value is None:
            raise CorruptDataError(f"{where}: record missing from its shard")
        header = decode_header(value, where=where)
        return header, value, where

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        """``(encoded image bytes, label)`` of sample ``index``."""
        header, payload, _ = self._read(index, check=self.check, want_path=False)
        return payload, header.label

    def record(self, index: int) -> tuple[RecordHeader, bytes]:
        """``(header, encoded image bytes)`` of sample ``index`` (CRC-checked if ``check``)."""
        header, payload, _ = self._read(index, check=self.check, want_path=False)
        return header, payload

    def header(self, index: int) -> RecordHeader:
        """The record header of sample ``index`` (size, encoding, flags)."""
        return self.raw(index)[0]

    def source_path(self, index: int) -> str:
        """The path the sample was packed from (for error messages)."""
        header, value, _ = self.raw(index)
        return record_path(value, header)

    def where(self, index: int) -> str:
        """A human description of sample ``index``: its shard and source path."""
        i = self._index(index)
        shard = self._shard_of(i)
        try:
            src = self.source_path(i)
        except FormatError:
            src = "?"
        return f"sample {i} ({src}) in {self.path / shard.file}"

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        for i in range(len(self)):
            yield self[i]


__all__ = ["Dataset", "read_manifest", "check_shard_structure", "HEADER_SIZE"]
