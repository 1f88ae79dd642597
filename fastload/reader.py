"""Read-only random access to a packed dataset. Knows nothing of DALI or torch."""

from __future__ import annotations

import bisect
import hashlib
import operator
import os
import stat
import zlib
from pathlib import Path
from typing import Iterator

import numpy as np

from .errors import CorruptDataError, DependencyError, FormatError, printable
from .format import (
    ENC_JPEG,
    HEADER_SIZE,
    LABELS_NAME,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MIN_RECORD_BYTES,
    Manifest,
    RecordHeader,
    KEY,
    ShardInfo,
    check_stored_size,
    decode_header,
    jpeg_frame,
    payload_size,
    record_path,
)
from .store import (
    UnusableFileError,
    check_once,
    file_identity,
    file_problem,
    open_regular,
    read_regular,
    shared_env,
    stat_regular,
)

try:  # lmdb is a hard dependency; keep the hint readable anyway
    import lmdb
except ImportError as e:  # pragma: no cover - exercised only without lmdb
    lmdb = None
    _lmdb_error = e


def read_manifest(path: str | os.PathLike) -> Manifest:
    """Read and validate ``manifest.json`` of the dataset directory ``path``.

    Only a regular file of at most :data:`~fastload.format.MAX_MANIFEST_BYTES` is read.
    """
    root = Path(path)
    shown = printable(str(root))
    try:
        st = os.stat(root)
    except FileNotFoundError:
        raise FormatError(f"{shown}: no such dataset directory; create one with `fastload pack SRC {shown}`") from None
    except (OSError, ValueError) as e:  # a NUL in the name, a name the file system cannot encode, ELOOP...
        raise FormatError(f"{shown}: not a usable dataset path ({getattr(e, 'strerror', None) or e})") from None
    if not stat.S_ISDIR(st.st_mode):
        raise FormatError(f"{shown}: not a directory; a packed dataset is a directory made by `fastload pack`")
    mpath = root / MANIFEST_NAME
    try:
        fd, st = open_regular(mpath)
    except FileNotFoundError:
        hint = " (an unfinished pack: continue it with `fastload pack --resume`)" if any(root.glob("*.tmp")) else ""
        raise FormatError(f"{mpath}: missing manifest; {root} is not a complete fastload dataset{hint}") from None
    except OSError as e:
        raise FormatError(f"{mpath}: cannot read manifest: it {file_problem(e)}") from None
    try:
        with open(fd, "rb", closefd=True) as f:
            if st.st_size > MAX_MANIFEST_BYTES:
                raise FormatError(
                    f"{mpath}: {st.st_size} bytes, more than the {MAX_MANIFEST_BYTES} a manifest may have; "
                    "it is not a fastload manifest or it was damaged: pack the dataset again"
                )
            text = f.read(st.st_size + 1)  # a read of n bytes allocates n: ask only for what is there
    except OSError as e:
        raise FormatError(f"{mpath}: cannot read manifest: {e.strerror}") from None
    if len(text) > st.st_size:
        raise FormatError(f"{mpath}: grew while being read; a manifest is written once, atomically: open the dataset again")
    return Manifest.loads(text, where=str(mpath))


def claimed_samples_problem(root: str | os.PathLike, manifest: Manifest) -> str | None:
    """Why the shard files on disk cannot hold the samples the manifest claims, or None.

    Looks only at the shards' sizes (``os.stat``, nothing read): a record takes at least
    :data:`~fastload.format.MIN_RECORD_BYTES` bytes of its shard, so ``num_samples`` must fit
    in the bytes the shard files really have (each counted up to its manifest size). Checked
    before ``labels.bin`` is read, so a forged ``num_samples`` cannot make a reader allocate
    more than a fraction of the dataset's real size. Missing or wrong-sized shards are
    otherwise reported when they are first read.
    """
    have, first_bad = 0, None
    for s in manifest.shards:
        p = os.path.join(root, s.file)
        try:
            size = stat_regular(p, within=root).st_size
        except OSError as e:
            size, why = 0, f"{p}: shard file {file_problem(e)}"
        else:
            why = None if size == s.bytes else f"{p}: shard is {size} bytes, the manifest says {s.bytes}"
        have += min(size, s.bytes)
        first_bad = first_bad or why
    n = manifest.num_samples
    if n * MIN_RECORD_BYTES <= have:
        return None
    return (
        f"{os.path.join(root, MANIFEST_NAME)}: claims {n} samples but its shard files hold {have} bytes, room for at "
        f"most {have // MIN_RECORD_BYTES} records ({first_bad}); the dataset is incomplete or was altered: pack it again"
    )


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
        self._max_pixels = self.manifest.max_pixels
        self._labels = self._read_labels()
        self._envs: list["lmdb.Environment" | None] = [None] * len(self.manifest.shards)
        self._pid = os.getpid()

    # -- metadata ---------------------------------------------------------------------------
    def _read_labels(self) -> np.ndarray:
        p = self.path / LABELS_NAME
        n = self.manifest.num_samples
        try:
            size = stat_regular(p).st_size  # before reading: a replaced file may be huge, or a FIFO
        except OSError as e:
            raise FormatError(f"{p}: cannot read labels: it {file_problem(e)}") from None
        if size != 4 * n:
            raise CorruptDataError(f"{p}: {size} bytes, expected {4 * n} for {n} samples; pack the dataset again")
        problem = claimed_samples_problem(self.path, self.manifest)  # n is bounded by real bytes before 4n are read
        if problem:
            raise CorruptDataError(problem)
        try:
            raw = read_regular(p, size)
        except UnusableFileError as e:
            raise CorruptDataError(f"{p}: {e.strerror}; it was replaced: open the dataset again") from None
        except OSError as e:
            raise FormatError(f"{p}: cannot read labels: it {file_problem(e)}") from None
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
        # A truncated file read through mmap kills the process with SIGBUS: check first. Only a
        # regular file inside the dataset directory is opened (a FIFO or a device would hang).
        try:
            st = stat_regular(fpath, within=self.path)
        except FileNotFoundError:
            raise FormatError(f"{fpath}: shard file is missing; the dataset is incomplete") from None
        except OSError as e:
            raise FormatError(f"{fpath}: shard file {file_problem(e)}; run `fastload verify {self.path}`") from None
        if st.st_size != shard.bytes:
            raise CorruptDataError(
                f"{fpath}: shard is {st.st_size} bytes, the manifest says {shard.bytes}; "
                "it was truncated or replaced (run `fastload verify`)"
            )
        identity = file_identity(st)
        problem = check_once(fpath, identity, first=shard.first, count=shard.count)
        if problem:
            raise CorruptDataError(f"{fpath}: damaged shard ({problem}); run `fastload verify {self.path}`")
        try:
            env = shared_env(fpath, identity)
        except lmdb.Error as e:
            raise CorruptDataError(f"{fpath}: cannot open shard: {e}") from None
        except OSError as e:
            raise FormatError(f"{fpath}: cannot open shard: it {file_problem(e)}") from None
        self._envs[k] = env
        return env

    def _index(self, index: int) -> int:
        n = self.manifest.num_samples
        if type(index) is int:
            i = index
        else:
            # numpy integers and 0-d integer arrays/tensors work; a bool does not (numpy reads it as a mask)
            if isinstance(index, bool) or str(getattr(index, "dtype", "")) in ("bool", "torch.bool"):
                raise TypeError(f"dataset index must be an integer, not a bool ({index!r})")
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
        # The header is not covered by the CRC and a decoder sizes its output from the payload's
        # own frame header: both must agree, within the dataset's pixel cap (a short marker walk).
        if header.encoding == ENC_JPEG:
            f = jpeg_frame(payload)
            ok = f is not None and f[1] == header.width and f[2] == header.height
        else:
            ok = payload_size(payload, header.encoding) == (header.width, header.height)
        if not ok or header.width * header.height > self._max_pixels:
            check_stored_size(header, payload, max_pixels=self._max_pixels, where=self._where(k, i))
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
            src = printable(self.source_path(i))  # the stored path may hold control characters
        except FormatError:
            src = "?"
        return f"sample {i} ({src}) in {self.path / shard.file}"

    def __iter__(self) -> Iterator[tuple[bytes, int]]:
        for i in range(len(self)):
            yield self[i]


__all__ = ["Dataset", "read_manifest", "claimed_samples_problem"]
