"""Read-only random access to a packed dataset, and reading ahead of it. Knows nothing of DALI or torch."""

from __future__ import annotations

import bisect
import collections
import hashlib
import logging
import operator
import os
import queue
import stat
import threading
import weakref
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, NamedTuple, Sequence, TypeVar

import numpy as np

from .remote.url import is_url
from .threads import cannot_start, start_threads
from .errors import ConfigError, CorruptDataError, FormatError, as_int, printable
from .format import (
    ENC_JPEG,
    HEADER_SIZE,
    LABELS_NAME,
    MANIFEST_NAME,
    MAX_MANIFEST_BYTES,
    MIN_RECORD_BYTES,
    Manifest,
    RecordHeader,
    ShardInfo,
    check_stored_size,
    checksum_name,
    ValueHead,
    decode_header,
    jpeg_frame,
    payload_checksum,
    payload_size,
    FIELDS_RECORD_VERSION,
    fields_offset,
    record_field_values,
    record_path,
    record_payload,
)
from .fields import Schema, decode_block
from .store import (
    READ_SLACK,
    DamagedShardError,
    ShardFile,
    UnusableFileError,
    file_identity,
    file_problem,
    open_regular,
    open_shard_file,
    read_regular,
    stat_regular,
)

log = logging.getLogger(__name__)
T = TypeVar("T")

#: Bytes of a record read first when its payload is read apart (header, source path).
_HEAD = 512


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

    Opening reads only the manifest and the labels. Shards are opened when first read, one
    :class:`~fastload.store.ShardFile` per shard file per process, read with ``pread``
    (nothing is memory-mapped, so reading adds nothing to resident memory but the bytes
    returned); a ``Dataset`` may be used from many threads and processes (including forked
    DataLoader workers) at once. Opening a shard reads its LMDB meta pages, and its branch
    and leaf pages (about 0.03 % of a shard of 100 KB records) if its records are stored
    in overflow pages; a shard of small records is checked page by page as records are read.

    Args:
        path: directory written by :func:`fastload.pack`.
        check: verify each payload's checksum on read (XXH3 in datasets of format 2.0 and later:
            about 3 us per 100 KB; zlib's CRC-32 in older ones, 14 us per 100 KB;
            off by default for raw reads, on in :class:`fastload.FastLoader`).
        cache_dir, cache_limit, storage_options, retry_deadline, fetch: for a ``path`` that is a URL
            (``s3://bucket/prefix``...): the node-local cache its shards are downloaded into and
            its size limit, the object store's settings, how long a request is retried, and
            whether whole shards or single records are fetched
            (:class:`fastload.remote.RemoteShards`; ``docs/loader.md``, "Many nodes"). Then
            :attr:`path` is the dataset's directory in the cache and :attr:`url` the URL.
    """

    #: Where a URL's files come from (:class:`fastload.remote.RemoteShards`) and the URL; None for a
    #: directory, and for views of datasets (:class:`fastload.composite.DatasetView`), which read
    #: through their parts.
    remote: Any = None
    url: str | None = None

    def __init__(
        self, path: str | os.PathLike, *, check: bool = False, cache_dir: str | os.PathLike | None = None,
        cache_limit: int | str | None = None, storage_options: dict | None = None, retry_deadline: float | None = None,
        fetch: str | None = None,
    ) -> None:  # fmt: skip
        self.remote = None  # RemoteShards: where a URL's files come from
        if is_url(path):
            from .remote.nodecache import RemoteShards

            self.remote = RemoteShards(path, cache_dir=cache_dir, cache_limit=cache_limit, storage_options=storage_options,
                                       retry_deadline=retry_deadline, fetch=fetch)  # fmt: skip
            path = self.remote.open()
        else:
            given = [n for n, v in (("cache_dir", cache_dir), ("cache_limit", cache_limit), ("storage_options", storage_options),
                                    ("retry_deadline", retry_deadline), ("fetch", fetch)) if v is not None]  # fmt: skip
            if given:
                raise ConfigError(f"{', '.join(given)}: only for a dataset URL (s3://...), not the local path {printable(str(path))!r}")
        self.url = None if self.remote is None else str(self.remote.url)
        self.path = Path(path)
        self.check = bool(check)
        self.manifest = read_manifest(self.path)
        self._firsts = [s.first for s in self.manifest.shards]
        self._max_pixels = self.manifest.max_pixels
        self._labels = self._read_labels()
        self._files: list[ShardFile | None] = [None] * len(self.manifest.shards)

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_files"] = [None] * len(self._files)  # descriptors do not travel: the copy opens its own
        return state

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
        # n is bounded by real bytes before 4n are read (a URL's labels were fetched at their manifest size)
        problem = None if self.remote is not None else claimed_samples_problem(self.path, self.manifest)
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

    @property
    def nbytes(self) -> int:
        """Bytes of the shard files (from the manifest): what reading every record reads, about."""
        return sum(s.bytes for s in self.manifest.shards)

    def __len__(self) -> int:
        return self.manifest.num_samples

    def __repr__(self) -> str:
        m = self.manifest
        return f"Dataset({self.url or str(self.path)!r}, samples={m.num_samples}, classes={len(m.classes)}, shards={len(m.shards)})"

    # -- records ----------------------------------------------------------------------------
    def _shard_of(self, index: int) -> ShardInfo:
        return self.manifest.shards[bisect.bisect_right(self._firsts, index) - 1]

    def _file(self, k: int) -> ShardFile:
        """Shard ``k``'s open file, checked against the manifest on first use."""
        f = self._files[k]
        if f is not None and not f.closed:
            return f
        shard = self.manifest.shards[k]
        fpath, filler = str(self.path / shard.file), None
        if self.remote is not None:  # downloaded into the node cache, verified, pinned while open (or a sparse copy)
            fpath, filler = str(self.remote.acquire(k)), self.remote.filler(k)
        # Only a regular file inside the dataset directory is opened (a FIFO or a device would hang).
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
        try:
            ident = file_identity(st) if filler is None else (st.st_ino, st.st_size, 0)  # a sparse copy: its mtime moves
            f = open_shard_file(fpath, ident, first=shard.first, count=shard.count, filler=filler)
        except DamagedShardError as e:
            raise CorruptDataError(f"{e}; run `fastload verify {self.path}`") from None
        except OSError as e:
            raise FormatError(f"{fpath}: cannot open shard: it {file_problem(e)}") from None
        self._files[k] = f
        return f

    def _release(self, k: int) -> None:
        """Close shard ``k`` and unpin it in the node cache (a URL's dataset: the epoch no longer needs it soon)."""
        f, self._files[k] = self._files[k], None
        if f is not None:
            f.close()
        if self.remote is not None:
            self.remote.release(k)

    def follow_epoch(self, batches: Iterable[Any], ahead: Callable[[Iterable[Any]], Iterator[Any]], *, hold: int = 8,
                     peers: Callable[[int], Iterable[Any]] | None = None, rank: int = 0, world_size: int = 1) -> Iterator[Any]:  # fmt: skip
        """``ahead(batches)``; for a URL's dataset, while its shards are downloaded in the order the
        batches need them and those the next ``hold`` batches do not need are closed (``hold`` must
        exceed how far ``ahead`` reads in advance; :meth:`RemoteShards.follow`). ``peers(r)``: the
        same batches as rank ``r`` of ``world_size`` reads them (this one is ``rank``), so that the
        node's cache evicts by the uses of every rank of the node."""
        if self.remote is None:
            return ahead(batches)
        return self.remote.follow(list(batches), self._firsts, ahead, self._release, hold=hold,
                                  peers=peers, rank=rank, world_size=world_size)  # fmt: skip

    def prefetch_epoch(self, batches: Iterable[Any]) -> bool:
        """For a URL's dataset, start downloading the shards of an epoch that is about to start (``batches``,
        its plan) before it does, when they all fit in the node cache (:meth:`RemoteShards.prefetch`).
        Returns whether downloads started; a local dataset has nothing to fetch."""
        if self.remote is None:
            return False
        return self.remote.prefetch(list(batches), self._firsts)

    def stop_fetching(self) -> None:
        """For a URL's dataset, give up the downloads ahead of the epoch (its loader was closed); a later
        epoch starts them again. A local dataset has none."""
        if self.remote is not None:
            self.remote.stop_ahead()

    def _value(self, k: int, i: int) -> bytes | memoryview:
        try:
            return self._file(k).value(i)
        except DamagedShardError as e:
            raise CorruptDataError(f"{e}; run `fastload verify {self.path}`") from None

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
        f = self._file(k)
        try:
            value, n, off = f.read(i, _HEAD)
        except DamagedShardError as e:
            raise CorruptDataError(f"{e}; run `fastload verify {self.path}`") from None
        try:
            header = decode_header(value if len(value) == n else ValueHead(value, n), where="")
        except CorruptDataError as e:
            raise CorruptDataError(f"{self._where(k, i)}{e}") from None
        start = HEADER_SIZE + header.path_len
        if len(value) == n:
            payload = bytes(value[start : start + header.payload_len])
            path = bytes(value[HEADER_SIZE:start]) if want_path else None
        else:  # only the value's start was read: the payload straight into its bytes object
            payload = f.pread(off + start, header.payload_len, i)
            path = None
            if want_path:
                path = bytes(value[HEADER_SIZE:start]) if start <= len(value) else f.pread(off + HEADER_SIZE, header.path_len, i)
        path = path.decode("utf-8", "surrogateescape") if path is not None else None
        self._check_payload(k, i, header, payload, check)
        return header, payload, path

    def _check_payload(self, k: int, i: int, header: RecordHeader, payload: bytes | memoryview, check: bool) -> None:
        """The checks every read makes of a record whose header decoded (both read paths share them)."""
        if header.label != self._labels[i]:
            raise CorruptDataError(f"{self._where(k, i)}: label {header.label} differs from labels.bin ({int(self._labels[i])})")
        # The header is not covered by the checksum and a decoder sizes its output from the payload's
        # own frame header: both must agree, within the dataset's pixel cap (a short marker walk).
        if header.encoding == ENC_JPEG:
            f = jpeg_frame(payload)
            ok = f is not None and f[1] == header.width and f[2] == header.height
        else:
            ok = payload_size(payload, header.encoding) == (header.width, header.height)
        if not ok or header.width * header.height > self._max_pixels:
            check_stored_size(header, payload, max_pixels=self._max_pixels, where=self._where(k, i))
        if check and payload_checksum(payload, header.version) != header.checksum:
            raise CorruptDataError(
                f"{self._where(k, i)}: payload {checksum_name(header.version)} mismatch (the image bytes were altered)"
            )

    def read_batch(self, indices: Sequence[int] | np.ndarray, *, buffer: np.ndarray | None = None) -> "RecordBatch":
        """Read many samples at once into one buffer: the loader's feeder.

        Each record is checked as :meth:`record` checks it (the payload's checksum if
        ``check``), but its bytes are copied once, into ``buffer`` (grown if too small; pass
        the previous batch's ``buffer`` back to reuse it), and the payloads come back as NumPy
        views of it. A cached record is read without releasing the GIL
        (:meth:`fastload.store.ShardFile.read_into`), so another busy Python thread does not
        slow the batch down. A record that cannot be read does not stop the batch: its
        payload is None and its error is in :attr:`RecordBatch.errors`.

        Raises:
            IndexError, TypeError: an index is out of range or not an integer.
        """
        idx = [self._index(i) for i in (indices.tolist() if isinstance(indices, np.ndarray) else indices)]
        firsts, files = self._firsts, self._files
        need = 0
        errors: dict[int, FormatError] = {}
        ks = [bisect.bisect_right(firsts, i) - 1 for i in idx]
        for p, (k, i) in enumerate(zip(ks, idx)):
            try:
                f = files[k]
                if f is None or f.closed:
                    f = self._file(k)
                _, n = f.locate(i)
            except DamagedShardError as e:
                errors[p] = CorruptDataError(f"{e}; run `fastload verify {self.path}`")
                n = 0
            except FormatError as e:
                errors[p] = e
                n = 0
            need += n + READ_SLACK
        if buffer is None or buffer.size < need:
            buffer = np.empty(max(need, 1 << 20, int(need * 1.25)), dtype=np.uint8)
        view, addr = memoryview(buffer), buffer.ctypes.data
        payloads: list[np.ndarray | None] = [None] * len(idx)
        widths = np.zeros(len(idx), dtype=np.int64)
        heights = np.zeros(len(idx), dtype=np.int64)
        check, pos = self.check, 0
        for p, (k, i) in enumerate(zip(ks, idx)):
            if p in errors:
                continue
            try:
                try:
                    start, n = files[k].read_into(i, buffer, pos, addr)  # type: ignore[union-attr]
                except DamagedShardError as e:
                    raise CorruptDataError(f"{e}; run `fastload verify {self.path}`") from None
                value = view[start : start + n]
                try:
                    header = decode_header(value, where="")
                except CorruptDataError as e:
                    raise CorruptDataError(f"{self._where(k, i)}{e}") from None
                a = start + HEADER_SIZE + header.path_len
                end = a + header.payload_len  # a field block (format 3) follows the payload
                self._check_payload(k, i, header, view[a:end], check)
            except FormatError as e:
                errors[p] = e
                continue
            payloads[p] = buffer[a:end]
            widths[p], heights[p] = header.width, header.height
            pos = start + n
        return RecordBatch(payloads, widths, heights, errors, buffer)

    @property
    def schema(self) -> Schema:
        """The dataset's fields (:class:`fastload.fields.Schema`): the image, the label, and any typed fields."""
        return self.manifest.schema

    def fields(self, index: int, names: Sequence[str] | None = None) -> dict[str, Any]:
        """The values of sample ``index``'s fields (default: all of them but the image), by name.

        ``label`` is the int of ``labels.bin``; typed fields are ints, NumPy arrays,
        ``bytes`` and ``str`` (:func:`fastload.fields.decode_block`); ``image`` the encoded bytes.
        The field block's check is verified when the dataset was opened with ``check``.

        Raises:
            KeyError: a name the schema does not have.
            CorruptDataError: the record or its field block is damaged.
        """
        schema = self.schema
        want = [f.name for f in schema if f.kind != "image"] if names is None else list(names)
        for name in want:
            schema[name]  # KeyError for an unknown name
        i = self._index(index)
        out: dict[str, Any] = {}
        stored = schema.stored
        if "image" in want or any(schema[n].stored for n in want):
            header, value, where = self.raw(i)
            if "image" in want:
                out["image"] = record_payload(value, header, check=self.check, where=where)
            if any(schema[n].stored for n in want):
                vals = record_field_values(value, header, stored, check=self.check, where=where)
                out.update((n, vals[n]) for n in want if n in vals)
        if "label" in want:
            out["label"] = int(self._labels[i])
        return {n: out[n] for n in want}

    def field_values(self, indices: Sequence[int] | np.ndarray) -> list[dict[str, Any]]:
        """The typed field values (the block fields, :attr:`schema` ``.stored``) of many samples, in order.

        Reads only each record's header and field block, never its image (a record read whole
        only when it is small); the block's check is verified when the dataset was opened with
        ``check``. The loader's producer thread calls it for every batch of ``fields=``.

        Raises:
            CorruptDataError: a record or its field block is damaged (naming its shard and sample).
        """
        stored = self.schema.stored
        out = []
        for index in (indices.tolist() if isinstance(indices, np.ndarray) else indices):
            i = self._index(index)
            k = bisect.bisect_right(self._firsts, i) - 1
            f = self._file(k)
            try:  # the file's own errors (a failed read, a missing record) name the shard and sample already
                value, n, off = f.read(i, _HEAD)
            except DamagedShardError as e:
                raise CorruptDataError(f"{e}; run `fastload verify {self.path}`") from None
            try:
                header = decode_header(value if len(value) == n else ValueHead(value, n), where="")
                if header.version != FIELDS_RECORD_VERSION or not stored:
                    out.append(record_field_values(b"", header, stored, where=""))  # says what is wrong
                    continue
                start = fields_offset(header)
            except CorruptDataError as e:  # the sample named only now: a path join per sample costs a fifth of the read
                raise CorruptDataError(f"{self._where(k, i)}{e}") from None
            block = value[start:] if len(value) == n else f.pread(off + start, n - start, i)
            try:
                out.append(decode_block(stored, block, check=self.check, where=""))
            except CorruptDataError as e:
                raise CorruptDataError(f"{self._where(k, i)}{e}") from None
        return out

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
        where = self._where(k, i)
        value = bytes(self._value(k, i))
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

    # -- the page cache ---------------------------------------------------------------------
    def _by_shard(self, indices: Any) -> Iterator[tuple[int, list[int]]]:
        """``(shard, its indices)`` of a sequence of sample indices, sorted, without repeats, in shard order."""
        idx = np.asarray(indices)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"sample indices must be integers, got an array of {idx.dtype}")
        if idx.size == 0:
            return
        n = self.manifest.num_samples
        lo, hi = int(idx.min()), int(idx.max())
        if lo < 0 or hi >= n:
            raise IndexError(f"sample index {lo if lo < 0 else hi} out of range for a dataset of {n} samples")
        firsts, k, part = self._firsts, -1, []
        end = -1  # first index past shard k
        for i in sorted(set(idx.ravel().tolist())):
            if i >= end:
                if part:
                    yield k, part
                k = bisect.bisect_right(firsts, i) - 1
                end = firsts[k + 1] if k + 1 < len(firsts) else n
                part = []
            part.append(i)
        if part:
            yield k, part

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """Have the kernel read these samples' records into the page cache, then return.

        Locates each record (opening its shard and reading the B-tree pages on its path if
        that was not done yet: those reads are waited for), then asks for exactly the
        records' byte ranges, sorted and joined, with ``POSIX_FADV_WILLNEED``: the disk
        reads them in parallel while this returns. A later :meth:`record` of them finds
        them in memory. :class:`ReadAhead` calls this from a few threads, batches ahead.

        Raises:
            IndexError, TypeError: an index is out of range or not an integer.
            FormatError, CorruptDataError: a shard cannot be opened or is damaged, as
                :meth:`record` would say.
        """
        for k, idx in self._by_shard(indices):
            try:
                self._file(k).willneed(idx)
            except DamagedShardError as e:
                raise CorruptDataError(f"{e}; run `fastload verify {self.path}`") from None

    def evict(self, indices: Sequence[int] | np.ndarray) -> None:
        """Drop from the page cache the pages that only these samples' records occupy.

        Records stored in overflow pages (more than about 2 KB) own whole pages, which are
        dropped (``POSIX_FADV_DONTNEED``); records inside leaf pages share them and are
        left. For epochs over datasets larger than memory: the cache then holds what is
        about to be read rather than what was just read. Reads return copies, so evicting
        records already read never changes them. Shards not opened yet are skipped.
        """
        for k, idx in self._by_shard(indices):
            f = self._files[k]
            if f is not None:
                f.evict(idx)

    def locate(self, index: int) -> tuple[str, int, int]:
        """``(shard file, offset, length)`` of sample ``index``'s stored value in its shard file."""
        i = self._index(index)
        k = bisect.bisect_right(self._firsts, i) - 1
        try:
            off, n = self._file(k).locate(i)
        except DamagedShardError as e:
            raise CorruptDataError(f"{e}; run `fastload verify {self.path}`") from None
        return str(self.path / self.manifest.shards[k].file), off, n


class RecordBatch(NamedTuple):
    """What :meth:`Dataset.read_batch` returns: payloads (views of ``buffer``), sizes, errors."""

    payloads: list  #: encoded image bytes of each sample (uint8 arrays), None where it failed
    widths: np.ndarray  #: stored width of each sample (0 where it failed)
    heights: np.ndarray  #: stored height of each sample (0 where it failed)
    errors: dict  #: position in the batch -> the FormatError reading it raised
    buffer: np.ndarray  #: the memory the payloads are views of: keep it alive while they are used


def _batch_indices(batch: Any) -> Any:
    return getattr(batch, "indices", batch)


class _Token:
    """Cancels the tasks of one :meth:`ReadAhead.ahead` when its iteration ends."""

    cancelled = False


class _Workers:
    """ReadAhead's threads and their queue (held apart from the ReadAhead, which they must not keep alive)."""

    def __init__(self, dataset: Dataset, threads: int) -> None:
        self.dataset = dataset
        self.queue: queue.SimpleQueue = queue.SimpleQueue()
        self.failed = 0  # requests that raised (the reads report why)
        self.pid = os.getpid()
        self.threads = [threading.Thread(target=self.run, name=f"fastload-readahead-{k}", daemon=True) for k in range(threads)]
        err = start_threads(self.threads)
        if err is not None:
            self.stop(0.0)  # the threads that did start end
            raise cannot_start(f"the read-ahead's {threads} threads", err)

    def run(self) -> None:
        while True:
            task = self.queue.get()
            if task is None:
                return
            token, evict, idx = task
            if token is not None and token.cancelled:
                continue
            try:
                if evict:
                    self.dataset.evict(idx)
                else:
                    self.dataset.prefetch(idx)
            except Exception as e:  # noqa: BLE001 - advice only: the read itself reports the problem
                self.failed += 1
                log.debug("read-ahead of %d records failed: %s", len(idx), e)

    def stop(self, timeout: float = 5.0) -> None:
        for _ in self.threads:
            self.queue.put(None)
        if os.getpid() == self.pid:
            for t in self.threads:
                if t is not threading.current_thread() and t.ident is not None:  # started
                    t.join(timeout)


class ReadAhead:
    """Reads the records of upcoming batches into the page cache ahead of their use, from a few threads.

    On a cold cache :meth:`Dataset.record` waits for each record in turn; here ``threads``
    threads locate the records of the next ``depth`` batches and ask the kernel for them
    (:meth:`Dataset.prefetch`), so the disk reads many at once and ``record`` finds them in
    memory. Usage, wrapping any iterable of batches (``Batch`` objects or index arrays)::

        ra = ReadAhead(dataset, threads=4, depth=4)
        for batch in ra.ahead(sampler.batches(epoch)):
            records = [dataset.record(i) for i in batch.indices]
        ra.close()

    It never raises on behalf of a record: a record it could not read ahead is read (and
    its problem reported) by ``record`` as without it.

    Args:
        dataset: the dataset the batches index.
        threads: threads locating records and asking for them, 1..64.
        depth: batches kept requested ahead of the one being read, 1..1024.
        evict: once a batch has been read (when the next one is asked for), drop the pages
            only its records occupy from the page cache (:meth:`Dataset.evict`): for datasets
            larger than memory. Leave it False when the dataset fits, so later epochs are warm.
        runs: for a block-shuffled order (``EpochSampler(order="block")``), its
            ``block_size``: the first time a batch needs a sample of a run of ``runs``
            consecutive samples (``[k * runs, (k + 1) * runs)``), the whole run is asked for,
            so each run is read once, sequentially, and its other samples, due within the
            next ``window`` runs' worth of batches, are found in memory. The page cache then
            holds about ``window`` runs at a time.
    """

    def __init__(
        self, dataset: Dataset, *, threads: int = 4, depth: int = 4, evict: bool = False, runs: int | None = None
    ) -> None:
        if not isinstance(dataset, Dataset):
            raise ConfigError(f"dataset must be a fastload.Dataset, got {type(dataset).__name__}")
        self.dataset = dataset
        self.threads = as_int("threads", threads, lo=1, hi=64)
        self.depth = as_int("depth", depth, lo=1, hi=1024)
        if not isinstance(evict, bool):
            raise ConfigError(f"evict must be True or False, got {evict!r}")
        self.evict = evict
        self.runs = None if runs is None else as_int("runs", runs, lo=1, hi=2**62)
        self._workers: _Workers | None = None
        self._finalizer: Any = None
        self._default = _Token()
        self._requested = 0
        self._closed = False
        # Starting and stopping the threads: an epoch thread draining its last batches, the next
        # epoch's thread and a finaliser's close() may all get here at once.
        self._lock, self._lock_pid = threading.Lock(), os.getpid()

    def _locked(self) -> threading.Lock:
        if self._lock_pid != os.getpid():  # forked: a thread of the parent may have held it
            self._lock, self._lock_pid = threading.Lock(), os.getpid()
        return self._lock

    def _pool(self) -> _Workers | None:
        """The threads (started on first use, and again after a fork); None once closed."""
        with self._locked():
            if self._closed:
                return None
            w = self._workers
            if w is None or w.pid != os.getpid():  # none yet, or forked: the parent's threads are not here
                w = self._workers = _Workers(self.dataset, self.threads)
                if self._finalizer is not None:
                    self._finalizer.detach()
                self._finalizer = weakref.finalize(self, w.stop, 0.0)
            return w

    def start(self) -> None:
        """Start the threads now rather than on first use (a thread that cannot start: a LoaderError here)."""
        self._pool()

    @property
    def requested(self) -> int:
        """Records asked for so far (by :meth:`prefetch` and :meth:`ahead`)."""
        return self._requested

    def prefetch(self, indices: Sequence[int] | np.ndarray, *, _token: _Token | None = None) -> None:
        """Ask for these samples' records in the background; returns at once."""
        idx = np.asarray(indices)
        if idx.size == 0 or self._closed:  # closed: a batch still being handed on must not restart the threads
            return
        idx = np.sort(idx.ravel())  # by shard and by place in it, split between the threads
        pool = self._pool()
        if pool is None:
            return
        self._requested += idx.size
        for part in np.array_split(idx, min(self.threads, idx.size)):
            pool.queue.put((_token or self._default, False, part))

    def ahead(self, batches: Iterable[T], *, indices: Callable[[T], Any] | None = None) -> Iterator[T]:
        """Yield ``batches`` unchanged, keeping the next ``depth`` of them requested.

        ``indices(batch)`` gives a batch's sample indices (default: ``batch.indices``, or the
        batch itself). When the iteration ends or is closed, its requests not yet started
        are dropped.
        """
        get = indices or _batch_indices
        runs_seen: set[int] = set()
        token = _Token()
        window: collections.deque[T] = collections.deque()
        it = iter(batches)
        prev: T | None = None
        try:
            while True:
                while len(window) <= self.depth:
                    try:
                        b = next(it)
                    except StopIteration:
                        break
                    self.prefetch(self._new_runs(get(b), runs_seen), _token=token)
                    window.append(b)
                pool = self._pool() if self.evict and prev is not None else None
                if pool is not None:  # the next batch asked for: the previous one was read
                    pool.queue.put((None, True, np.asarray(get(prev))))
                if not window:
                    return
                prev = window.popleft()
                yield prev
        finally:
            token.cancelled = True

    def _new_runs(self, indices: Any, seen: set[int]) -> np.ndarray:
        """``indices``, or with ``runs``, every sample of the runs they touch not asked for yet."""
        idx = np.asarray(indices, dtype=np.int64).ravel()
        if self.runs is None or idx.size == 0:
            return idx
        fresh = [r for r in np.unique(idx // self.runs).tolist() if r not in seen]
        seen.update(fresh)
        n = len(self.dataset)
        parts = [np.arange(r * self.runs, min((r + 1) * self.runs, n)) for r in fresh]
        return np.concatenate(parts) if parts else idx[:0]

    def close(self) -> None:
        """Stop the threads and wait for them (the requests already made to the kernel complete by themselves).

        Later requests are ignored: batches still being read (a finaliser may close the pool
        while an epoch's last batches are handed on) are read without read-ahead.
        """
        with self._locked():
            self._closed = True
            if self._finalizer is not None:
                self._finalizer.detach()
                self._finalizer = None
            workers, self._workers = self._workers, None
        if workers is not None:
            workers.stop(5.0)

    def __enter__(self) -> "ReadAhead":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


__all__ = ["Dataset", "ReadAhead", "read_manifest", "claimed_samples_problem"]
