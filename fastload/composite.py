"""Subsets and concatenations of packed datasets, read as one :class:`fastload.Dataset`.

What ``torch.utils.data.Subset(ds, indices)``, ``random_split`` and ``ConcatDataset([a, b])``
give over torchvision datasets, for packed ones: a :class:`DatasetView` maps each of its
positions ``p`` to one sample of one packed dataset (its *part*), so the loader reads
``view[p]`` exactly where ``dataset[p]`` of the torch object reads, without packing
anything again. Views of views are flattened: a view always reads plain
:class:`fastload.Dataset` parts, each opened once however many positions use it.

A view is a :class:`fastload.Dataset` (``isinstance`` holds, for the loader and
:class:`~fastload.reader.ReadAhead`) and answers everything the loader and its core use:
``len``, ``labels``, ``classes``, ``read_batch``, ``record``, ``[p]``, ``header``,
``source_path``, ``where``, ``location``, ``locate``, ``prefetch``, ``evict``,
``manifest`` and ``path``. Its errors name the sample by its position in the view and by
its source path (then where it is stored). Its ``manifest`` describes the view: its
samples, classes, class counts and labels; ``shards`` are its parts (the packed directory
each is read from, how many of the view's samples come from it, and about how many bytes
they take: the part's shard bytes times the fraction of its samples the view reads);
``stats`` are the parts' merged (their extremes bound the view's images); ``options``
hold the largest ``max_pixels`` of the parts and the list of parts.
"""

from __future__ import annotations

import hashlib
import os
import reprlib
from typing import Any, Iterable, Sequence

import numpy as np

from .errors import ConfigError, FormatError, printable
from .format import Manifest, RecordHeader, ShardInfo
from .reader import Dataset, RecordBatch

__all__ = ["DatasetView", "PartBuffers", "concat", "subset", "class_mismatch"]


class PartBuffers(np.ndarray):
    """The ``buffer`` of a :class:`RecordBatch` read from several parts: an empty array holding
    each part's own read buffer (``held``: part number -> array), to be passed back as
    ``read_batch(..., buffer=)`` so every part reuses its own."""

    held: dict

    def __array_finalize__(self, obj: Any) -> None:
        self.held = getattr(obj, "held", {})


def _part_buffers(held: dict) -> PartBuffers:
    b = np.empty(0, dtype=np.uint8).view(PartBuffers)
    b.held = held
    return b


def class_mismatch(a: Sequence[Any], b: Sequence[Any], what_a: str, what_b: str) -> str | None:
    """Why two class lists differ (naming both, shortened), or None when they are equal."""
    a, b = list(a), list(b)
    if a == b:
        return None
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    short = reprlib.Repr()
    short.maxlist, short.maxstring, short.maxother = 8, 60, 60
    return (
        f"{what_a} has the classes {printable(short.repr(a))} ({len(a)}) and {what_b} {printable(short.repr(b))} "
        f"({len(b)}), which differ at index {k}: a label would mean one class in one and another class in the other"
    )


class _Flat:
    """A view's map: parts, each position's part and index in it, and the parts' known source paths."""

    def __init__(self, parts: list[Dataset], which: np.ndarray, index: np.ndarray, paths: list[Sequence[str] | None]) -> None:
        self.parts, self.which, self.index, self.paths = parts, which, index, paths


def _flat(dataset: Any) -> _Flat:
    if isinstance(dataset, DatasetView):
        return _Flat(list(dataset.parts), dataset.part_of, dataset.index_in_part, list(dataset.part_paths))
    if isinstance(dataset, Dataset):
        n = len(dataset)
        return _Flat([dataset], np.zeros(n, dtype=np.int32), np.arange(n, dtype=np.int64), [None])
    raise ConfigError(f"a view is made of fastload.Dataset objects, got {type(dataset).__name__}")


def _key(ds: Dataset) -> str:
    return os.path.realpath(str(ds.path))


def _merge(flats: list[_Flat]) -> _Flat:
    """One map of several, each packed directory one part (nothing opened twice)."""
    parts: list[Dataset] = []
    paths: list[Sequence[str] | None] = []
    seen: dict[str, int] = {}
    whichs, indexes = [], []
    for f in flats:
        remap = np.empty(len(f.parts), dtype=np.int32)
        for k, (ds, ps) in enumerate(zip(f.parts, f.paths)):
            key = _key(ds)
            if key not in seen:
                seen[key] = len(parts)
                parts.append(ds)
                paths.append(ps)
            elif paths[seen[key]] is None and ps is not None:
                paths[seen[key]] = ps
            remap[k] = seen[key]
        whichs.append(remap[f.which] if len(f.which) else f.which.astype(np.int32))
        indexes.append(f.index)
    which = np.concatenate(whichs) if whichs else np.zeros(0, dtype=np.int32)
    index = np.concatenate(indexes) if indexes else np.zeros(0, dtype=np.int64)
    return _Flat(parts, which.astype(np.int32), index.astype(np.int64), paths)


def positions(indices: Any, n: int, *, what: str = "indices") -> np.ndarray:
    """``indices`` (a sequence, range, NumPy array or tensor of integers) as int64 positions in ``0..n-1``;
    negative ones count from the end, as Python's (and torch's ``Subset``'s) do.

    Raises:
        ConfigError: naming the first entry that is not an integer or is out of range.
    """
    if hasattr(indices, "detach"):  # a torch tensor
        indices = indices.detach().cpu().numpy()
    if isinstance(indices, (str, bytes)) or not hasattr(indices, "__len__"):
        raise ConfigError(f"{what} must be a sequence of integers, got {type(indices).__name__}")
    arr = np.asarray(indices if isinstance(indices, np.ndarray) else list(indices))
    if arr.size == 0:
        return np.zeros(0, dtype=np.int64)
    if arr.ndim != 1:
        raise ConfigError(f"{what} must be one-dimensional, got shape {tuple(arr.shape)}")
    if arr.dtype.kind not in "iu":
        bad = next((k for k, v in enumerate(arr.tolist()) if isinstance(v, bool) or not isinstance(v, int)), 0)
        raise ConfigError(f"{what}[{bad}] is {printable(repr(arr.tolist()[bad]))[:60]}, not an integer index")
    out = arr.astype(np.int64)
    bad_at = np.flatnonzero((out < -n) | (out >= n))
    if bad_at.size:
        k = int(bad_at[0])
        raise ConfigError(f"{what}[{k}] is {int(out[k])}, out of range for a dataset of {n} samples")
    out = np.where(out < 0, out + n, out)
    return out


def subset(dataset: Dataset, indices: Any, *, name: str | None = None) -> "DatasetView":
    """The samples ``dataset[indices[0]], dataset[indices[1]], ...`` as a view (``torch.utils.data.Subset``'s).

    ``dataset`` is a :class:`fastload.Dataset` or another view (flattened: a view of a view
    reads the same parts). Repeated and negative indices mean what they mean to ``Subset``.
    """
    f = _flat(dataset)
    idx = positions(indices, len(f.which))
    return DatasetView(f.parts, f.which[idx], f.index[idx], paths=f.paths, name=name or f"Subset({_name_of(dataset)})")


def concat(datasets: Iterable[Dataset], *, name: str | None = None) -> "DatasetView":
    """The samples of ``datasets`` one after another as a view (``torch.utils.data.ConcatDataset``'s).

    Raises:
        ConfigError: no datasets, or two of them with different classes (a label would mean
            different classes in them), naming both class lists.
    """
    parts = list(datasets)
    if not parts:
        raise ConfigError("concat() needs at least one dataset (ConcatDataset refuses an empty list too)")
    for k, ds in enumerate(parts[1:], 1):
        why = class_mismatch(
            parts[0].classes, ds.classes, f"datasets[0] ({_name_of(parts[0])})", f"datasets[{k}] ({_name_of(ds)})"
        )
        if why is not None:
            raise ConfigError(f"cannot concatenate them: {why}; concatenate datasets with the same classes")
    f = _merge([_flat(ds) for ds in parts])
    name = name or f"ConcatDataset({', '.join(_name_of(d) for d in parts)})"
    return DatasetView(f.parts, f.which, f.index, paths=f.paths, name=name)


def _name_of(ds: Any) -> str:
    if isinstance(ds, DatasetView):
        return ds.name
    return printable(str(getattr(ds, "path", type(ds).__name__)))


def _merged_stats(parts: list[Dataset], counts: np.ndarray) -> dict[str, Any]:
    """The parts' stats merged: sides' extremes over all, median of the part reading the most."""
    stats = [p.manifest.stats if isinstance(p.manifest.stats, dict) else {} for p in parts]
    if len(parts) == 1:
        return dict(stats[0])
    main = stats[int(np.argmax(counts))] if len(counts) else {}
    out: dict[str, Any] = {}
    for side in ("width", "height"):
        ds = [s.get(side) for s in stats if isinstance(s.get(side), dict)]
        if len(ds) != len(stats):
            continue
        try:
            out[side] = {"min": min(d["min"] for d in ds), "median": main[side]["median"], "max": max(d["max"] for d in ds)}
        except (KeyError, TypeError):
            out.pop(side, None)
    return out


class DatasetView(Dataset):
    """Samples of packed datasets, in the order of a torch ``Subset``/``ConcatDataset``: ``view[p]``
    is ``parts[part_of[p]][index_in_part[p]]``.

    Made by :func:`subset` and :func:`concat` (or :func:`fastload.cache.resolve_dataset`
    from torch dataset objects). It reads, never writes; it pickles (its parts reopen their
    shards in the copy) and may be read from many threads at once, as a Dataset may.

    Args:
        parts: the packed datasets read (plain :class:`fastload.Dataset` objects, all with
            the same classes).
        part_of: for each position, the number of its part.
        index_in_part: for each position, the sample's index in its part.
        paths: for each part, the source path of each of its samples where known (the
            files a torchvision dataset was packed from), else None: the path stored in the
            record is read (for error messages and ``source_path``).
        name: how the view is named in messages (``Subset(ImageFolder(/data/train))``).
    """

    def __init__(
        self, parts: Sequence[Dataset], part_of: Any, index_in_part: Any, *,
        paths: Sequence[Sequence[str] | None] | None = None, name: str = "view",
    ) -> None:  # fmt: skip
        parts = list(parts)
        if not parts or not all(type(p) is Dataset for p in parts):
            raise ConfigError("a DatasetView's parts must be one or more plain fastload.Dataset objects")
        which = np.asarray(part_of, dtype=np.int32).ravel()
        index = np.asarray(index_in_part, dtype=np.int64).ravel()
        if which.shape != index.shape:
            raise ConfigError(f"part_of has {which.size} entries, index_in_part {index.size}")
        if which.size and (which.min() < 0 or which.max() >= len(parts)):
            raise ConfigError(f"part_of names a part outside 0..{len(parts) - 1}")
        for k, ds in enumerate(parts):
            sel = index[which == k]
            if sel.size and (sel.min() < 0 or sel.max() >= len(ds)):
                raise ConfigError(f"index_in_part holds an index outside the {len(ds)} samples of part {k} ({ds.path})")
            why = class_mismatch(parts[0].classes, ds.classes, f"part 0 ({parts[0].path})", f"part {k} ({ds.path})")
            if why is not None:
                raise ConfigError(f"a view reads datasets of the same classes: {why}")
        paths = list(paths) if paths is not None else [None] * len(parts)
        if len(paths) != len(parts):
            raise ConfigError(f"paths has {len(paths)} entries for {len(parts)} parts")
        for k, (ps, ds) in enumerate(zip(paths, parts)):
            if ps is not None and len(ps) != len(ds):
                raise ConfigError(f"paths[{k}] has {len(ps)} entries for the {len(ds)} samples of part {k}")
        # the parts a view does not read are dropped
        used = np.unique(which)
        remap = np.full(len(parts), -1, dtype=np.int32)
        remap[used] = np.arange(used.size, dtype=np.int32)
        self.parts: tuple[Dataset, ...] = tuple(parts[k] for k in used.tolist()) or (parts[0],)
        self.part_paths: tuple[Sequence[str] | None, ...] = tuple(paths[k] for k in used.tolist()) or (paths[0],)
        self.part_of = remap[which] if which.size else which
        self.index_in_part = index
        self.part_of.setflags(write=False)
        self.index_in_part.setflags(write=False)
        self.name = name
        self.path = self.parts[0].path  # the first part's directory (messages); ``parts`` lists them all
        self.check = all(p.check for p in self.parts)
        self._labels = self._view_labels()
        self.manifest = self._view_manifest()

    def _view_labels(self) -> np.ndarray:
        labels = np.zeros(self.index_in_part.size, dtype=np.int64)
        for k, ds in enumerate(self.parts):
            sel = self.part_of == k
            labels[sel] = ds.labels[self.index_in_part[sel]]
        labels.setflags(write=False)
        return labels

    def _view_manifest(self) -> Manifest:
        n, classes = int(self.index_in_part.size), list(self.parts[0].classes)
        counts = np.bincount(self.part_of, minlength=len(self.parts)) if n else np.zeros(len(self.parts), dtype=np.int64)
        shards, first = [], 0
        for ds, c in zip(self.parts, counts.tolist()):
            est = int(round(ds.nbytes * c / len(ds))) if len(ds) else 0
            shards.append(ShardInfo(file=str(ds.path), first=first, count=int(c), bytes=est, sha256=""))
            first += int(c)
        pixels = {p.manifest.options.get("pixels") if isinstance(p.manifest.options, dict) else None for p in self.parts}
        sources = {p.manifest.options.get("source") if isinstance(p.manifest.options, dict) else None for p in self.parts}
        options: dict[str, Any] = {
            "view": self.name, "parts": [str(p.path) for p in self.parts],
            "max_pixels": max(p.manifest.max_pixels for p in self.parts),
        }  # fmt: skip
        if len(pixels) == 1 and None not in pixels:
            options["pixels"] = pixels.pop()
        if len(sources) == 1 and None not in sources:
            options["source"] = sources.pop()
        m0 = self.parts[0].manifest
        return Manifest(
            num_samples=n, classes=classes, class_counts=np.bincount(self._labels, minlength=len(classes)).tolist(),
            shards=shards, labels_sha256=hashlib.sha256(self._labels.astype("<i4").tobytes()).hexdigest(),
            stats=_merged_stats(list(self.parts), counts), options=options, created=m0.created,
            fastload_version=m0.fastload_version, version=m0.version,
        )  # fmt: skip

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__)  # the parts drop their descriptors themselves

    # -- metadata ---------------------------------------------------------------------------
    # classes, labels: Dataset's own (this view's manifest and labels)

    def __len__(self) -> int:
        return int(self.index_in_part.size)

    def __repr__(self) -> str:
        return f"DatasetView({self.name}, samples={len(self)}, parts={len(self.parts)})"

    # -- positions --------------------------------------------------------------------------
    def _position(self, index: Any) -> int:
        n = len(self)
        if isinstance(index, bool) or str(getattr(index, "dtype", "")) in ("bool", "torch.bool"):
            raise TypeError(f"dataset index must be an integer, not a bool ({index!r})")
        try:
            i = index if type(index) is int else int(index.__index__())
        except (AttributeError, TypeError):
            raise TypeError(f"dataset index must be an integer, got {type(index).__name__}") from None
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sample index {index} out of range for {self.name} of {n} samples")
        return i

    def _positions(self, indices: Any) -> np.ndarray:
        idx = np.asarray(indices)
        if idx.size and idx.dtype.kind not in "iu":
            raise TypeError(f"sample indices must be integers, got an array of {idx.dtype}")
        idx = idx.astype(np.int64).ravel()
        n = len(self)
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = int(idx[(idx < -n) | (idx >= n)][0])
            raise IndexError(f"sample index {bad} out of range for {self.name} of {n} samples")
        return np.where(idx < 0, idx + n, idx)

    def _at(self, index: Any) -> tuple[int, Dataset, int]:
        p = self._position(index)
        return p, self.parts[int(self.part_of[p])], int(self.index_in_part[p])

    def _named(self, p: int, e: FormatError) -> FormatError:
        """``e``, raised by a part, again as the same error naming the view's sample ``p``."""
        part, j = self.parts[int(self.part_of[p])], int(self.index_in_part[p])
        msg = str(e)
        try:
            prefix = f"{part.location(j)}"
        except FormatError:  # pragma: no cover - location reads nothing
            prefix = ""
        if prefix and msg.startswith(prefix):
            msg = msg[len(prefix) :].lstrip(":").lstrip()
        try:
            return type(e)(f"{self.where(p)}: {msg}")
        except TypeError:  # pragma: no cover - an error class of other arguments
            return FormatError(f"{self.where(p)}: {msg}")

    # -- records ----------------------------------------------------------------------------
    def source_path(self, index: int) -> str:
        """The file the sample was packed from (the torchvision dataset's own path where known)."""
        p, part, j = self._at(index)
        known = self.part_paths[int(self.part_of[p])]
        if known is not None:
            return str(known[j])
        try:
            return part.source_path(j)
        except FormatError as e:
            raise self._named(p, e) from None

    def where(self, index: int) -> str:
        """``sample <p> of <view> (<source path>); stored as <shard> sample <j>``: how a view's errors name a sample."""
        p, part, j = self._at(index)
        known = self.part_paths[int(self.part_of[p])]
        if known is not None:
            src = printable(str(known[j]))
        else:
            try:
                src = printable(part.source_path(j))
            except FormatError:
                src = "?"
        return f"sample {p} of {self.name} ({src}); stored as {part.location(j)}"

    def location(self, index: int) -> str:
        """How the view's own errors begin: :meth:`where`."""
        return self.where(index)

    def raw(self, index: int) -> tuple[RecordHeader, bytes, str]:
        p, part, j = self._at(index)
        try:
            header, value, _ = part.raw(j)
        except FormatError as e:
            raise self._named(p, e) from None
        return header, value, self.location(p)

    def record(self, index: int) -> tuple[RecordHeader, bytes]:
        p, part, j = self._at(index)
        try:
            return part.record(j)
        except FormatError as e:
            raise self._named(p, e) from None

    def __getitem__(self, index: int) -> tuple[bytes, int]:
        p, part, j = self._at(index)
        try:
            return part[j]
        except FormatError as e:
            raise self._named(p, e) from None

    def header(self, index: int) -> RecordHeader:
        return self.raw(index)[0]

    def locate(self, index: int) -> tuple[str, int, int]:
        p, part, j = self._at(index)
        try:
            return part.locate(j)
        except FormatError as e:
            raise self._named(p, e) from None

    def read_batch(self, indices: Sequence[int] | np.ndarray, *, buffer: np.ndarray | None = None) -> RecordBatch:
        """:meth:`fastload.Dataset.read_batch` of the view's positions; errors name them (:meth:`where`).

        Each part reads its samples into its own buffer; a batch from several parts returns a
        :class:`PartBuffers` holding them all, to pass back as ``buffer`` (a plain array is
        used by the first part read).
        """
        pos = self._positions(indices)
        ks, js = self.part_of[pos], self.index_in_part[pos]
        held: dict[int, np.ndarray] = dict(buffer.held) if isinstance(buffer, PartBuffers) else {}
        plain = buffer if buffer is not None and not isinstance(buffer, PartBuffers) else None
        used = np.unique(ks).tolist() if pos.size else [0]
        if len(used) == 1:
            k = int(used[0])
            rb = self.parts[k].read_batch(js, buffer=held.get(k, plain))
            errors = {q: self._named(int(pos[q]), e) for q, e in rb.errors.items()}
            if len(self.parts) == 1:
                return RecordBatch(rb.payloads, rb.widths, rb.heights, errors, rb.buffer)
            held[k] = rb.buffer
            return RecordBatch(rb.payloads, rb.widths, rb.heights, errors, _part_buffers(held))
        payloads: list = [None] * pos.size
        widths = np.zeros(pos.size, dtype=np.int64)
        heights = np.zeros(pos.size, dtype=np.int64)
        errors = {}
        for n, k in enumerate(used):
            sel = np.flatnonzero(ks == k)
            rb = self.parts[k].read_batch(js[sel], buffer=held.get(k, plain if n == 0 else None))
            held[k] = rb.buffer
            for q, at in enumerate(sel.tolist()):
                payloads[at] = rb.payloads[q]
            widths[sel], heights[sel] = rb.widths, rb.heights
            errors.update({int(sel[q]): self._named(int(pos[sel[q]]), e) for q, e in rb.errors.items()})
        return RecordBatch(payloads, widths, heights, errors, _part_buffers(held))

    # -- the page cache ---------------------------------------------------------------------
    def _by_part(self, indices: Any) -> Iterable[tuple[Dataset, np.ndarray]]:
        pos = self._positions(indices)
        if pos.size == 0:
            return
        ks, js = self.part_of[pos], self.index_in_part[pos]
        for k in np.unique(ks).tolist():
            yield self.parts[k], js[ks == k]

    def prefetch(self, indices: Sequence[int] | np.ndarray) -> None:
        """:meth:`fastload.Dataset.prefetch` of these positions, part by part."""
        for part, js in self._by_part(indices):
            part.prefetch(js)

    def evict(self, indices: Sequence[int] | np.ndarray) -> None:
        """:meth:`fastload.Dataset.evict` of these positions, part by part."""
        for part, js in self._by_part(indices):
            part.evict(js)
