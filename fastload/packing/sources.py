"""What to pack: an ImageFolder tree, a list file, or a Python map-style dataset.

Every source turns into an ordered sequence of *tasks* that
:mod:`fastload.packing.workers` hands to worker processes. A task is a small tuple
``(kind, data, label, name, where)``:

* ``kind`` -- ``"file"`` (``data`` is a path to read), ``"bytes"`` (encoded image
  bytes), ``"pil"`` (a ``PIL.Image.Image``), ``"array"`` (a ``numpy`` uint8 array)
  or ``"error"`` (``data`` is the reason the item could not even be fetched);
* ``label`` -- the integer label;
* ``name`` -- the path stored in the record (relative to the source root);
* ``where`` -- the path shown to users in errors and in the ``skipped`` list.

The order of a folder source is exactly torchvision's ``ImageFolder`` order:
class folders sorted by name, then ``sorted(os.walk(class_dir, followlinks=True))``
with the file names of each folder sorted, keeping files whose lower-cased
name ends with one of :data:`IMG_EXTENSIONS`.
"""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import io
import json
import logging
import os
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ConfigError

log = logging.getLogger(__name__)

#: The file extensions torchvision's ``ImageFolder`` accepts (compared lower-cased).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: Suffixes that make SRC a list file instead of a folder.
LIST_SUFFIXES = (".csv", ".tsv", ".txt")

_HEADER_PATHS = {"path", "file", "filename", "file_name", "filepath", "image", "img", "image_path", "name"}
_HEADER_LABELS = {"label", "labels", "class", "class_name", "classname", "target", "category", "y"}

Task = tuple  # (kind, data, label, name, where)


@dataclasses.dataclass(frozen=True)
class FileItem:
    """One image file of a folder or list source."""

    path: str  # what to open (absolute or relative to the current directory)
    name: str  # what to store in the record (relative to the source root)
    label: int


class Source:
    """An ordered collection of samples to pack.

    Attributes:
        kind: ``"folder"``, ``"list"`` or ``"dataset"``.
        description: what the source is, for messages and the manifest.
        classes: class names in label order, or ``None`` when they are only known
            after every label was seen (a dataset without ``classes``).
    """

    kind: str = ""
    description: str = ""
    classes: list[str] | None = None

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def tasks(self, start: int = 0) -> Iterator[Task]:  # pragma: no cover - abstract
        """Yield the tasks of items ``start, start+1, ...`` in order."""
        raise NotImplementedError

    def fingerprint(self) -> str:  # pragma: no cover - abstract
        """A SHA-256 that changes whenever the list of samples or classes changes."""
        raise NotImplementedError


class FileSource(Source):
    """A folder or list-file source: a fixed list of :class:`FileItem`."""

    def __init__(self, kind: str, description: str, classes: list[str], items: list[FileItem]) -> None:
        self.kind = kind
        self.description = description
        self.classes = classes
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def tasks(self, start: int = 0) -> Iterator[Task]:
        for it in self.items[start:]:
            yield ("file", it.path, it.label, it.name, it.path)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps({"kind": self.kind, "classes": self.classes}, ensure_ascii=True).encode())
        for it in self.items:
            h.update(f"{it.name}\0{it.label}\n".encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def class_counts(self) -> list[int]:
        counts = [0] * len(self.classes or [])
        for it in self.items:
            counts[it.label] += 1
        return counts


# ----------------------------------------------------------------------------- folders


def _walk_sorted(top: str) -> list[tuple[str, list[str]]]:
    """``sorted(os.walk(top, followlinks=True))`` as (root, files), minus symlink loops."""
    out = []
    ancestors: dict[str, tuple[str, ...]] = {top: (os.path.realpath(top),)}
    for root, dirs, files in os.walk(top, followlinks=True):
        chain = ancestors.pop(root, (os.path.realpath(root),))
        keep = []
        for d in dirs:
            full = os.path.join(root, d)
            real = os.path.realpath(full)
            if real in chain:
                log.warning("%s: symlink loop back to %s; not followed", full, real)
                continue
            ancestors[full] = chain + (real,)
            keep.append(d)
        dirs[:] = keep
        out.append((root, dirs, files))
    out.sort()
    return [(root, files) for root, _dirs, files in out]


def scan_folder(root: str | os.PathLike) -> FileSource:
    """Scan an ImageFolder tree in torchvision's order.

    Empty class folders are kept as classes (with a warning) where torchvision
    raises, so class indices match a tree that has images in every class.

    Raises:
        ConfigError: ``root`` has no class folders or no image at all.
    """
    top = os.fspath(root)
    try:
        classes = sorted(e.name for e in os.scandir(top) if e.is_dir())
    except OSError as e:
        raise ConfigError(f"SRC {top}: cannot list the folder: {e.strerror}") from None
    if not classes:
        raise ConfigError(
            f"SRC {top}: no class folders found; an ImageFolder tree has one sub-folder per class "
            "(SRC/cat/1.jpg, SRC/dog/2.jpg), or pass a list file (.csv/.tsv/.txt)"
        )
    items: list[FileItem] = []
    empty = []
    prefix = os.path.join(top, "")  # every walked path starts with it: slice, not relpath (hot)
    for label, cls in enumerate(classes):
        cdir = os.path.join(top, cls)
        n0 = len(items)
        for r, files in _walk_sorted(cdir):
            for fname in sorted(files):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    path = os.path.join(r, fname)
                    items.append(FileItem(path, path[len(prefix) :], label))
        if len(items) == n0:
            empty.append(cls)
    if not items:
        raise ConfigError(
            f"SRC {top}: found no images in {len(classes)} class folder(s) (extensions: {', '.join(IMG_EXTENSIONS)})"
        )
    if empty:
        log.warning("%d empty class folder(s) kept as classes with 0 samples: %s", len(empty), ", ".join(empty[:10]))
    return FileSource("folder", top, classes, items)


# ----------------------------------------------------------------------------- list files


def _split_rows(text: str, suffix: str) -> Iterator[tuple[int, list[str]]]:
    lines = text.splitlines()
    first = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), "")
    if suffix == ".tsv" or (suffix != ".csv" and "\t" in first):
        delim: str | None = "\t"
    elif suffix == ".csv" or "," in first:
        delim = ","
    else:
        delim = None  # whitespace: "path label", path may contain spaces
    if delim is None:
        for n, ln in enumerate(lines, 1):
            if ln.strip() and not ln.lstrip().startswith("#"):
                yield n, ln.strip().rsplit(None, 1)
        return
    reader = csv.reader(io.StringIO(text), delimiter=delim)
    for row in reader:
        n = reader.line_num
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        yield n, row


def read_list(list_path: str | os.PathLike) -> FileSource:
    """Read a list file of ``path,label`` rows (CSV, TSV or whitespace-separated .txt).

    ``label`` is an integer or a class name (if any label is not an integer, all are
    class names, and classes are their sorted unique names; otherwise classes are
    ``"0" .. str(max label)``). Relative paths resolve against the list file's folder.
    A header row (``path,label``, ``file,class`` ...) is skipped.

    Raises:
        ConfigError: the file is unreadable, empty or has a malformed row.
    """
    lp = os.fspath(list_path)
    try:
        text = Path(lp).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"SRC {lp}: cannot read list file: {getattr(e, 'strerror', None) or e}") from None
    base = os.path.dirname(lp)
    rows: list[tuple[int, str, str]] = []
    for n, row in _split_rows(text, Path(lp).suffix.lower()):
        if len(row) < 2 or not row[0].strip() or not row[1].strip():
            raise ConfigError(f"SRC {lp}:{n}: expected 'path,label', got {row!r}")
        p, lab = row[0].strip(), row[1].strip()
        if not rows and (p.lower() in _HEADER_PATHS or lab.lower() in _HEADER_LABELS):
            continue  # header row
        rows.append((n, p, lab))
    if not rows:
        raise ConfigError(f"SRC {lp}: the list file has no 'path,label' rows")
    try:
        ints = [int(lab) for _n, _p, lab in rows]
    except ValueError:
        ints = None
    if ints is not None:
        bad = next(((n, v) for (n, _p, _l), v in zip(rows, ints) if v < 0), None)
        if bad:
            raise ConfigError(f"SRC {lp}:{bad[0]}: label {bad[1]} is negative; labels are 0, 1, 2, ... or class names")
        classes = [str(i) for i in range(max(ints) + 1)]
        labels = ints
    else:
        classes = sorted({lab for _n, _p, lab in rows})
        index = {c: i for i, c in enumerate(classes)}
        labels = [index[lab] for _n, _p, lab in rows]
    items = [FileItem(os.path.join(base, p), p, lab) for (_n, p, _l), lab in zip(rows, labels)]
    return FileSource("list", lp, classes, items)


def open_source(src: str | os.PathLike) -> FileSource:
    """An ImageFolder directory or a list file (.csv/.tsv/.txt)."""
    p = os.fspath(src)
    if os.path.isdir(p):
        return scan_folder(p)
    if os.path.isfile(p):
        if Path(p).suffix.lower() in LIST_SUFFIXES:
            return read_list(p)
        raise ConfigError(
            f"SRC {p}: a file but not a list file; pass an ImageFolder directory or a .csv/.tsv/.txt list of 'path,label'"
        )
    raise ConfigError(f"SRC {p}: no such file or directory")


# ----------------------------------------------------------------------------- datasets


def _as_label(value: Any, i: int) -> int:
    v = value.item() if hasattr(value, "item") and not isinstance(value, (int, np.integer)) else value
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise ConfigError(f"dataset[{i}]: label {value!r} is not an integer; items must be (image, int label)")
    if v < 0:
        raise ConfigError(f"dataset[{i}]: label {int(v)} is negative; labels are 0, 1, 2, ...")
    return int(v)


class DatasetSource(Source):
    """A map-style dataset of ``(image, label)`` items, fetched in order."""

    def __init__(self, dataset: Any, classes: Sequence[str] | None = None) -> None:
        try:
            n = len(dataset)
        except TypeError:
            raise ConfigError(
                f"dataset: {type(dataset).__name__} has no len(); pass a map-style dataset (len() and [i])"
            ) from None
        if not hasattr(dataset, "__getitem__"):
            raise ConfigError(f"dataset: {type(dataset).__name__} has no [i]; pass a map-style dataset")
        if n <= 0:
            raise ConfigError(f"dataset: {type(dataset).__name__} is empty (len 0); nothing to pack")
        if classes is None:
            classes = getattr(dataset, "classes", None)
        if classes is not None:
            if isinstance(classes, (str, bytes)) or not hasattr(classes, "__iter__"):
                raise ConfigError(f"classes: expected a list of class names, got {type(classes).__name__}")
            classes = [str(c) for c in classes]
            if not classes:
                raise ConfigError("classes: the list of class names is empty")
        self.dataset = dataset
        self.n = n
        self.kind = "dataset"
        self.description = f"{type(dataset).__module__}.{type(dataset).__qualname__}"
        self.classes = classes

    def __len__(self) -> int:
        return self.n

    def fingerprint(self) -> str:
        d = {"kind": "dataset", "type": self.description, "len": self.n, "classes": self.classes}
        return hashlib.sha256(json.dumps(d, ensure_ascii=True).encode()).hexdigest()

    def tasks(self, start: int = 0) -> Iterator[Task]:
        for i in range(start, self.n):
            yield self.task(i)

    def task(self, i: int) -> Task:
        where = f"dataset[{i}]"
        try:
            item = self.dataset[i]
        except Exception as e:  # a user's dataset failing on one item is a bad sample
            return ("error", f"dataset raised {type(e).__name__}: {e}", 0, where, where)
        try:
            image, raw_label = item
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected an (image, label) pair, got {type(item).__name__}") from None
        label = _as_label(raw_label, i)
        if self.classes is not None and label >= len(self.classes):
            raise ConfigError(f"{where}: label {label} is outside the {len(self.classes)} classes (0..{len(self.classes) - 1})")
        return image_task(image, label, where)


def image_task(image: Any, label: int, where: str) -> Task:
    """The task for one in-memory image (PIL image, uint8 array or encoded bytes)."""
    from PIL import Image

    if isinstance(image, (bytes, bytearray, memoryview)):
        return ("bytes", bytes(image), label, where, where)
    if isinstance(image, Image.Image):
        return ("pil", image, label, where, where)
    if hasattr(image, "numpy") and not isinstance(image, np.ndarray):  # torch tensor: assume HWC
        try:
            image = image.numpy()
        except Exception:  # pragma: no cover - exotic tensor types
            pass
    if isinstance(image, np.ndarray):
        return ("array", image, label, where, where)
    return ("error", f"unsupported image type {type(image).__name__} (need a PIL image, uint8 array or bytes)", label, where, where)
