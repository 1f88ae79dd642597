"""What to pack: an ImageFolder tree, a list file, or a Python map-style dataset.

Every source turns into an ordered sequence of *tasks* that
:mod:`fastload.packing.workers` hands to worker processes. A task is a small tuple
``(kind, data, label, name, where)``:

* ``kind`` -- ``"file"`` (``data`` is a path to read), ``"bytes"`` (encoded image
  bytes), ``"pil"`` (a ``PIL.Image.Image``), ``"array"`` (a ``numpy`` uint8 array)
  or ``"error"`` (``data`` is the reason the item could not even be fetched: a list
  row that does not parse, a folder entry that is not a regular file, a dataset
  item that raised);
* ``label`` -- the integer label;
* ``name`` -- the path stored in the record (relative to the source root);
* ``where`` -- the path shown to users in errors and in the ``skipped`` list, with
  control characters and undecodable bytes escaped (:func:`fastload.errors.printable`).

The order of a folder source is exactly torchvision's ``ImageFolder`` order:
class folders sorted by name, then ``sorted(os.walk(class_dir, followlinks=True))``
with the file names of each folder sorted, keeping files whose lower-cased
name ends with one of :data:`IMG_EXTENSIONS`.
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import hashlib
import io
import itertools
import json
import logging
import operator
import os
import reprlib
import stat
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np

from ..errors import ConfigError, printable, short_message

log = logging.getLogger(__name__)

#: The file extensions torchvision's ``ImageFolder`` accepts (compared lower-cased).
IMG_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
#: Suffixes that make SRC a list file instead of a folder.
LIST_SUFFIXES = (".csv", ".tsv", ".txt")
#: Labels are ``0 .. MAX_CLASSES - 1``: a larger label (from a list file or a dataset) is
#: refused before anything is allocated for it, and so is a source with more classes.
MAX_CLASSES = 1_000_000

_HEADER_PATHS = {"path", "file", "filename", "file_name", "filepath", "image", "img", "image_path", "name"}
_HEADER_LABELS = {"label", "labels", "class", "class_name", "classname", "target", "category", "y"}
_CELL_SPACE = " \t\f\v"  # stripped around list-file cells (ASCII only)
_ON_ERROR = ("skip", "fail")

Task = tuple  # (kind, data, label, name, where)


# ----------------------------------------------------------------------------- names


def _escape_char(ch: str) -> str:
    o = ord(ch)
    if 0xDC80 <= o <= 0xDCFF:  # an undecodable byte kept by surrogateescape
        return f"\\x{o - 0xDC00:02x}"
    return f"\\u{o:04x}"


def stored_name(s: str) -> str:
    """A class name as stored in the manifest (UTF-8 JSON): undecodable bytes kept by
    ``surrogateescape`` become ``\\xNN`` (other lone surrogates ``\\uNNNN``); valid text,
    control characters included, is unchanged (JSON escapes those, and reads them back)."""
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return "".join(_escape_char(ch) if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in s)


def _check_on_error(on_error: Any) -> str:
    if on_error not in _ON_ERROR:
        raise ConfigError(f"on_error (--on-error): expected 'skip' or 'fail', got {on_error!r}")
    return on_error


_KINDS = ((stat.S_ISFIFO, "FIFO"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
          (stat.S_ISSOCK, "socket"), (stat.S_ISDIR, "directory"))  # fmt: skip


def file_kind(mode: int) -> str:
    """What a non-regular ``st_mode`` is, in words: ``"FIFO"``, ``"character device"``, ..."""
    return next((name for test, name in _KINDS if test(mode)), "special file")


# ----------------------------------------------------------------------------- sources


@dataclasses.dataclass(frozen=True)
class FileItem:
    """One image file of a folder or list source (``error``: why it cannot be packed)."""

    path: str  # what to open (absolute or relative to the current directory)
    name: str  # what to store in the record (relative to the source root)
    label: int
    error: str | None = None
    where: str | None = None  # shown to users; default: printable(path)


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
            where = it.where if it.where is not None else printable(it.path)
            if it.error is None:
                yield ("file", it.path, it.label, it.name, where)
            else:
                yield ("error", it.error, it.label, it.name, where)

    def fingerprint(self) -> str:
        h = hashlib.sha256()
        h.update(json.dumps({"kind": self.kind, "classes": self.classes}, ensure_ascii=True).encode())
        for it in self.items:
            h.update(f"{it.name}\0{it.label}\n".encode("utf-8", "surrogateescape"))
            if it.error is not None:
                h.update(f"!{it.error}\n".encode("utf-8", "backslashreplace"))
        return h.hexdigest()

    def class_counts(self) -> list[int]:
        counts = [0] * len(self.classes or [])
        for it in self.items:
            if it.error is None:
                counts[it.label] += 1
        return counts


# ----------------------------------------------------------------------------- folders


def _scan_dir(root: str) -> tuple[list[str], list[str], dict[str, str]] | None:
    """One directory as ``os.walk`` sees it: (dirs, files, {image file: why not regular}).

    None where ``os.walk`` drops the directory (it cannot be listed). Whether an entry is
    a regular file comes from the directory listing itself for plain entries (no stat).
    """
    try:
        it = os.scandir(root)
    except OSError:
        return None
    dirs, files, odd = [], [], {}
    with it:
        while True:
            try:
                entry = next(it)
            except StopIteration:
                break
            except OSError:
                return None
            try:
                is_dir = entry.is_dir()
            except OSError:
                is_dir = False
            if is_dir:
                dirs.append(entry.name)
                continue
            name = entry.name
            files.append(name)
            try:
                if entry.is_file() or not name.lower().endswith(IMG_EXTENSIONS):
                    continue
                mode = entry.stat().st_mode
            except OSError:  # dangling symlink, ...: opening it says why
                continue
            if not stat.S_ISREG(mode):
                odd[name] = f"not a regular file ({file_kind(mode)})"
    return dirs, files, odd


def _walk_sorted(top: str) -> list[tuple[str, list[str], dict[str, str]]]:
    """``sorted(os.walk(top, followlinks=True))`` as (root, files, odd files), minus symlink loops."""
    out = []
    stack = [(top, (os.path.realpath(top),))]
    while stack:
        root, chain = stack.pop()
        listing = _scan_dir(root)
        if listing is None:
            continue
        dirs, files, odd = listing
        keep = []
        for d in dirs:
            full = os.path.join(root, d)
            real = os.path.realpath(full)
            if real in chain:
                log.warning("%s: symlink loop back to %s; not followed", printable(full), printable(real))
                continue
            keep.append((full, chain + (real,)))
        out.append((root, files, odd))
        stack.extend(reversed(keep))
    out.sort(key=lambda t: t[0])
    return out


def scan_folder(root: str | os.PathLike) -> FileSource:
    """Scan an ImageFolder tree in torchvision's order.

    Empty class folders are kept as classes (with a warning) where torchvision
    raises, so class indices match a tree that has images in every class. An image
    name that is not a regular file (a FIFO, a device, a socket, a symlink to one)
    is an item that is refused with that reason. A class folder name with bytes that
    are not UTF-8 is stored as a class name with those bytes written ``\\xNN``.

    Raises:
        ConfigError: ``root`` has no class folders, no image at all, more than
            :data:`MAX_CLASSES` class folders, or two class folders whose stored
            names are the same.
    """
    top = os.fspath(root)
    shown = printable(top)
    try:
        with os.scandir(top) as it:
            classes = sorted(e.name for e in it if e.is_dir())
    except OSError as e:
        raise ConfigError(f"SRC {shown}: cannot list the folder: {e.strerror}") from None
    if not classes:
        raise ConfigError(
            f"SRC {shown}: no class folders found; an ImageFolder tree has one sub-folder per class "
            "(SRC/cat/1.jpg, SRC/dog/2.jpg), or pass a list file (.csv/.tsv/.txt)"
        )
    if len(classes) > MAX_CLASSES:
        raise ConfigError(f"SRC {shown}: {len(classes)} class folders; at most {MAX_CLASSES} classes (MAX_CLASSES) are supported")
    names = [stored_name(c) for c in classes]
    if len(set(names)) != len(names):
        seen: dict[str, str] = {}
        for c, n in zip(classes, names):
            if n in seen:
                raise ConfigError(
                    f"SRC {shown}: class folders {printable(seen[n])!r} and {printable(c)!r} are both stored as class "
                    f"{printable(n)!r} (undecodable bytes are written \\xNN); rename one of them"
                )
            seen[n] = c
    items: list[FileItem] = []
    empty = []
    prefix = os.path.join(top, "")  # every walked path starts with it: slice, not relpath (hot)
    for label, cls in enumerate(classes):
        cdir = os.path.join(top, cls)
        n0 = len(items)
        for r, files, odd in _walk_sorted(cdir):
            for fname in sorted(files):
                if fname.lower().endswith(IMG_EXTENSIONS):
                    path = os.path.join(r, fname)
                    if odd and fname in odd:
                        items.append(FileItem(path, path[len(prefix) :], label, odd[fname]))
                    else:
                        items.append(FileItem(path, path[len(prefix) :], label))
        if len(items) == n0:
            empty.append(cls)
    if not items:
        raise ConfigError(
            f"SRC {shown}: found no images in {len(classes)} class folder(s) (extensions: {', '.join(IMG_EXTENSIONS)})"
        )
    if empty:
        log.warning(
            "%d empty class folder(s) kept as classes with 0 samples: %s", len(empty), ", ".join(printable(c) for c in empty[:10])
        )
    return FileSource("folder", top, names, items)


# ----------------------------------------------------------------------------- list files


def _read_regular(path: str, what: str) -> bytes:
    """The bytes of a regular file; a FIFO or device is refused before anything is read."""
    shown = printable(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as e:
        raise ConfigError(f"SRC {shown}: cannot read {what}: {getattr(e, 'strerror', None) or e}") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):  # before open(): open() of a directory's fd raises IsADirectoryError
        os.close(fd)
        raise ConfigError(f"SRC {shown}: not a regular file ({file_kind(mode)}); a {what} must be a regular file")
    with open(fd, "rb", buffering=0) as f:
        try:
            os.set_blocking(fd, True)
            return f.read()
        except OSError as e:
            raise ConfigError(f"SRC {shown}: cannot read {what}: {e.strerror or e}") from None


def _decode_list(data: bytes, shown: str) -> str:
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        line = data[: e.start].count(b"\n") + 1
        raise ConfigError(
            f"SRC {shown}:{line}: cannot read list file: byte 0x{data[e.start]:02x} is not UTF-8; save the list file as UTF-8"
        ) from None
    return text.replace("\r\n", "\n").replace("\r", "\n")  # universal newlines, as text mode reads


def _split_rows(text: str, suffix: str) -> Iterator[tuple[int, int, list[str] | str]]:
    """``(first line, last line, cells)`` of every data row, or a reason instead of cells."""
    lines = text.split("\n")
    first = next((ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")), "")
    if suffix == ".tsv" or (suffix != ".csv" and "\t" in first):
        delim: str | None = "\t"
    elif suffix == ".csv" or "," in first:
        delim = ","
    else:
        delim = None  # whitespace: "path label", path may contain spaces
    if delim is None:
        for n, ln in enumerate(lines, 1):
            ln = ln.strip(_CELL_SPACE)
            if ln and not ln.startswith("#"):
                cut = max(ln.rfind(" "), ln.rfind("\t"))
                yield n, n, [ln] if cut < 0 else [ln[:cut], ln[cut + 1 :]]
        return
    reader = csv.reader(io.StringIO(text, newline="\n"), delimiter=delim)
    end = 0
    while True:
        start = end + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as e:
            end = reader.line_num
            yield start, end, f"not a valid {'TSV' if delim == chr(9) else 'CSV'} row ({e})"
            continue
        end = reader.line_num
        if not row or not "".join(row).strip() or row[0].lstrip().startswith("#"):
            continue
        yield start, end, row


def _label_kind(lab: str) -> str:
    """``"int"`` (ASCII digits), ``"neg"`` (``-`` and ASCII digits) or ``"name"``."""
    digits = lab[1:] if lab.startswith("-") else lab
    if digits and digits.isascii() and digits.isdigit():
        return "neg" if lab.startswith("-") else "int"
    return "name"


def _short(s: str) -> str:
    return printable(s if len(s) <= 40 else s[:40] + "...")


def _int_label(lab: str) -> int | str:
    """The integer of an ASCII-digit label, or why it is refused."""
    if lab.startswith("-"):
        return f"label {_short(lab)} is negative; labels are 0, 1, 2, ... or class names"
    digits = lab.lstrip("0") or "0"
    if len(digits) > len(str(MAX_CLASSES)) or int(digits) >= MAX_CLASSES:
        return f"label {_short(lab)} is too large; integer labels must be below {MAX_CLASSES} (MAX_CLASSES)"
    return int(digits)


def _majority(values: list[Any]) -> Any:
    """The most common value; on a tie, the one that comes first."""
    counts = collections.Counter(values)
    top = max(counts.values())
    return next(v for v in values if counts[v] == top)


def read_list(list_path: str | os.PathLike, *, on_error: str = "fail") -> FileSource:
    """Read a list file of ``path,label`` rows (CSV, TSV or whitespace-separated .txt).

    The rules, decided by the rows as a whole, so one odd row never changes the others:

    * Spaces and tabs around a cell are ignored. A header row (``path,label``,
      ``file,class`` ...) first is skipped; blank rows and rows starting with ``#`` too.
    * Every row has the number of columns most rows have (at least 2: path, label;
      further columns are ignored). On a tie, the first data row's count wins.
    * A label is an *integer* when it is plain ASCII decimal digits (``7``, ``007``
      is 7); ``+1``, ``1.0``, ``1_0``, ``١`` are not integers. The file's labels are
      integers or class names, whichever most rows have (on a tie, the first data
      row's kind). Integer labels must be below :data:`MAX_CLASSES`; classes are then
      ``"0" .. str(max label)``. Class names give sorted unique names as classes.
    * Relative paths resolve against the list file's folder.

    A row that does not follow them (wrong column count, an empty path or label, a
    label of the other kind, a negative or too large label, a NUL in the path) is an
    error naming the file and line with ``on_error="fail"``; with ``"skip"`` it is an
    item refused with that reason (shown as ``LISTFILE:LINE``), unless no row at all
    is valid (then the file is not a list file: the first bad row's error).

    Raises:
        ConfigError: the file is not a regular file, unreadable, not UTF-8, empty,
            or has a bad row (see above).
    """
    _check_on_error(on_error)
    lp = os.fspath(list_path)
    shown = printable(lp)
    text = _decode_list(_read_regular(lp, "list file"), shown)
    base = os.path.dirname(lp)
    rows: list[tuple[int, list[str] | str]] = []  # (line, cells or the reason it is bad)
    for n, end, row in _split_rows(text, Path(lp).suffix.lower()):
        if isinstance(row, list):
            row = [c.strip(_CELL_SPACE) for c in row]
            if not rows and len(row) >= 2 and (row[0].lower() in _HEADER_PATHS or row[1].lower() in _HEADER_LABELS):
                continue  # header row
            if end > n and (len(row) < 2 or not row[0] or not row[1]):
                row = f"a quoted cell runs from line {n} to line {end} (a quote left open?)"
        rows.append((n, row))
    if not rows:
        raise ConfigError(f"SRC {shown}: the list file has no 'path,label' rows")
    ncols = _majority([len(r) for _n, r in rows if isinstance(r, list)] or [0])
    if ncols < 2:
        ncols = 0  # most rows are not 'path,label': every row is bad
    bad: dict[int, str] = {}
    for k, (_n, row) in enumerate(rows):
        if isinstance(row, str):
            bad[k] = row
        elif len(row) != ncols or not row[0] or not row[1]:
            bad[k] = f"expected 'path,label', got {reprlib.repr(row) if len(repr(row)) > 200 else repr(row)}"
            if ncols and len(row) != ncols and len(row) >= 2:
                bad[k] += f" ({len(row)} columns where the other rows have {ncols})"
        elif "\0" in row[0]:
            bad[k] = "the path contains a NUL character"
    good = [k for k in range(len(rows)) if k not in bad]
    kinds = {k: ("name" if _label_kind(rows[k][1][1]) == "name" else "int") for k in good}  # type: ignore[index]
    kind = _majority([kinds[k] for k in good]) if good else "int"
    nkind = sum(1 for k in good if kinds[k] == kind)
    labels: dict[int, int] = {}
    for k in good:
        lab = rows[k][1][1]  # type: ignore[index]
        if kinds[k] != kind:
            other = "an integer" if kinds[k] == "int" else "not an integer"
            theirs = "integers (ASCII digits)" if kind == "int" else "class names"
            bad[k] = f"label {_short(lab)!r} is {other}, but this list file's labels are {theirs} ({nkind} of {len(rows)} rows)"
        elif kind == "int":
            v = _int_label(lab)
            if isinstance(v, str):
                bad[k] = v
            else:
                labels[k] = v
    if kind == "int":
        classes = [str(i) for i in range(max(labels.values()) + 1)] if labels else []
    else:
        classes = sorted({rows[k][1][1] for k in good if k not in bad})  # type: ignore[index]
        if len(classes) > MAX_CLASSES:
            raise ConfigError(f"SRC {shown}: {len(classes)} class names; at most {MAX_CLASSES} classes (MAX_CLASSES) are supported")
        index = {c: i for i, c in enumerate(classes)}
        labels = {k: index[rows[k][1][1]] for k in good if k not in bad}  # type: ignore[index]
    if bad and (on_error == "fail" or not labels):
        k = min(bad)
        raise ConfigError(f"SRC {shown}:{rows[k][0]}: {bad[k]}")
    if bad:
        k = min(bad)
        log.warning("%s: %d row(s) that do not parse are skipped; the first, line %d: %s", shown, len(bad), rows[k][0], bad[k])
    items = []
    for k, (n, row) in enumerate(rows):
        where = printable(f"{lp}:{n}")
        if k in bad:
            items.append(FileItem(f"{lp}:{n}", f"{lp}:{n}", 0, bad[k], where))
        else:
            p = row[0]  # type: ignore[index]
            items.append(FileItem(os.path.join(base, p), p, labels[k]))
    return FileSource("list", lp, classes, items)


def open_source(src: str | os.PathLike, *, on_error: str = "fail") -> FileSource:
    """An ImageFolder directory or a list file (.csv/.tsv/.txt).

    ``on_error`` decides what a list-file row that does not parse is (see :func:`read_list`).

    Raises:
        ConfigError: SRC does not exist, is neither a directory nor a regular file,
            is another kind of file, or is a bad folder or list file.
    """
    _check_on_error(on_error)
    p = os.fspath(src)
    shown = printable(p)
    try:
        mode = os.stat(p).st_mode
    except FileNotFoundError:
        raise ConfigError(f"SRC {shown}: no such file or directory") from None
    except (OSError, ValueError) as e:
        raise ConfigError(f"SRC {shown}: cannot access it: {getattr(e, 'strerror', None) or e}") from None
    if stat.S_ISDIR(mode):
        return scan_folder(p)
    if not stat.S_ISREG(mode):
        raise ConfigError(
            f"SRC {shown}: not a regular file ({file_kind(mode)}); pass an ImageFolder directory or a .csv/.tsv/.txt list of 'path,label'"
        )
    if Path(p).suffix.lower() in LIST_SUFFIXES:
        return read_list(p, on_error=on_error)
    raise ConfigError(
        f"SRC {shown}: a file but not a list file; pass an ImageFolder directory or a .csv/.tsv/.txt list of 'path,label'"
    )


# ----------------------------------------------------------------------------- datasets


def _not_an_int(value: Any, i: int) -> ConfigError:
    return ConfigError(
        f"dataset[{i}]: label {printable(reprlib.repr(value))} ({type(value).__name__}) is not an integer; items must be (image, int label)"
    )


def _as_label(value: Any, i: int) -> int:
    """An item's label as an int in ``0 .. MAX_CLASSES - 1`` (numpy and 0-d tensor integers too)."""
    v = value
    if not isinstance(v, (int, np.integer)) and hasattr(v, "item"):  # numpy scalar, 0-d array, tensor
        try:
            v = v.item()
        except Exception:  # a tensor of several values, an object whose .item() is something else
            raise _not_an_int(value, i) from None
    if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, np.integer)):
        raise _not_an_int(value, i)
    v = operator.index(v)
    if v < 0:
        raise ConfigError(f"dataset[{i}]: label {v} is negative; labels are 0, 1, 2, ...")
    if v >= MAX_CLASSES:
        raise ConfigError(f"dataset[{i}]: label {v} is too large; labels must be below {MAX_CLASSES} (MAX_CLASSES)")
    return v



def map_style_len(dataset: Any) -> int:
    """``len(dataset)`` of a map-style dataset to pack; a ConfigError for no len(), no [i], or empty."""
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
    return n


def class_names(dataset: Any, classes: Sequence[str] | None) -> list[str] | None:
    """The class names to store: ``classes``, else ``dataset.classes``, else None; checked."""
    if classes is None:
        classes = getattr(dataset, "classes", None)
    if classes is None:
        return None
    if isinstance(classes, (str, bytes)) or not hasattr(classes, "__iter__"):
        raise ConfigError(f"classes: expected a list of class names, got {type(classes).__name__}")
    names = [stored_name(str(c)) for c in itertools.islice(classes, MAX_CLASSES + 1)]
    if not names:
        raise ConfigError("classes: the list of class names is empty")
    if len(names) > MAX_CLASSES:
        raise ConfigError(f"classes: more than {MAX_CLASSES} class names; at most {MAX_CLASSES} (MAX_CLASSES) are supported")
    return names


class DatasetSource(Source):
    """A map-style dataset of ``(image, label)`` items, fetched in order."""

    def __init__(self, dataset: Any, classes: Sequence[str] | None = None) -> None:
        n = map_style_len(dataset)
        classes = class_names(dataset, classes)
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
            return ("error", f"dataset raised {type(e).__name__}: {printable(short_message(e))}", 0, where, where)
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
