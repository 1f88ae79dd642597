"""Pack a torchvision image dataset once into a shared cache, safely across ranks.

:func:`cached_pack` takes a file-based dataset (torchvision ``ImageFolder`` /
``DatasetFolder``: ``samples`` of ``(path, class_index)``, ``classes`` naming them) and
returns a packed dataset directory holding exactly those samples, in that order, with
those labels and class names. The first call packs; later calls (and other ranks, other
runs) reuse the entry.

Where: ``cache_dir``, else ``$FASTLOAD_CACHE``, else ``~/.cache/fastload``. The entry is
``<dir>/<root name>-<key>``, where the key is a SHA-256 of, for every sample in order,
its absolute path, its label, and ``os.stat``'s size, ``st_mtime_ns``, ``st_ctime_ns``
and inode (a file that cannot be stat'ed enters as its error), plus the class names, the
number of samples, the cache layout version (:data:`CACHE_VERSION`) and the record format
version. So a file touched, replaced (also by ``cp -p``, ``rsync -t`` or ``tar x``, which
keep its size and modification time: not its status-change time), added, removed or
relabelled gives a new entry (the old one is left, never reused); so does a ``chmod`` or
``chown`` of a file, and a copy of the whole folder. Every call stats every file (about a second per
million files on a local disk, more on a network file system).

Concurrency (``torchrun``: every rank calls it): a finished entry is a directory with a
``manifest.json``; it appears only by an atomic rename of a verified pack, so a reader
that sees the manifest sees a complete dataset. Packing happens under an exclusive
``fcntl.flock`` on ``<entry>.lock``: the first process packs, the others wait (logging
every minute), then find the entry and return it. The kernel drops the lock when its
holder dies, so a killed packer never blocks the next run, which resumes its unfinished
pack (``<entry>.pack.partial``). The lock files stay (deleting one would race another
process opening it); they are empty. Where the file system cannot lock, a warning is
logged and every process packs into a staging directory of its own; the first to
finish renames it into place, the others find the entry there and discard theirs.

The pixels: exactly what the dataset's own loader gives, torchvision's ``pil_loader``
(``Image.open(f).convert("RGB")``; ``default_loader`` with the PIL backend), which applies
no EXIF orientation and clips 16-bit samples, where ``fastload pack`` turns images upright
and scales 16-bit ones. So the entry is packed by
:func:`fastload.packing.run.pack_like_pil_loader`: plain JPEGs byte for byte (an EXIF
orientation tag set to 1, the image data untouched), every other image converted by
``convert("RGB")`` and stored as a lossless PNG. A dataset whose items that does not
reproduce (another loader, the accimage backend, a class overriding ``__getitem__``) is
refused by :func:`check_reproducible`, which FastLoader calls first.

What is packed: a list file ``path,class name`` of the samples (written next to the
entry, removed after), read back first by the very parser ``fastload pack`` uses to check
that it gives back exactly these paths, labels and class names. When it would not (class
names that look like integers, or that sort otherwise, classes without samples, paths
that are not UTF-8...), the files are packed as a Python dataset of their bytes with the
dataset's class names instead (the records then name ``dataset[i]`` rather than the file).
An image that cannot be packed (corrupt, not an image) is an error naming it, and no entry
is made: FastLoader reads a torchvision dataset by its indices (a ``DistributedSampler``
over it, ``Subset``), so the entry holds every sample at the dataset's own index or none.

Torch's dataset objects around such datasets are :mod:`fastload.datasets`' job (above this
module, which it calls): its :func:`~fastload.datasets.plan_dataset` walks ``Subset`` (what
``random_split`` returns) and ``ConcatDataset``, nested in any way, down to their file
datasets (``ImageFolder``, ``DatasetFolder``, ``ImageNet``: its classes are tuples of names,
its entry stores its ``wnids``) and packed :class:`Dataset` objects, checks each, and
refuses what it cannot reproduce before anything is packed; ``DatasetPlan.open`` packs
each file dataset into its own entry (the same entry it has alone: nothing is packed twice)
and returns a :class:`fastload.composite.DatasetView` whose position ``p`` is the user's
``dataset[p]``; ``resolve_dataset`` does both.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import hashlib
import json
import logging
import operator
import os
import re
import socket
import stat
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .errors import BadImageError, ConfigError, FormatError, PackError, printable
from .format import DEFAULT_MAX_PIXELS, FORMAT_VERSION, MANIFEST_NAME
from .packing.run import PIL_LOADER_PIXELS, pack_like_pil_loader
from .packing.images import max_file_bytes
from .packing.journal import fsync_dir, hold_lock, release_lock
from .packing.outdir import remove_dataset_dir
from .packing.sources import MAX_CLASSES, file_kind, read_list, stored_name
from .reader import Dataset, read_manifest

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

__all__ = [
    "CACHE_ENV", "CACHE_VERSION", "FileList", "cache_entry", "cached_pack", "check_reproducible", "default_cache_dir",
    "describe", "file_list", "pack_files", "EntryLock",
]  # fmt: skip

#: Bumped when what the cache packs for a dataset changes (the pack options below, the list layout).
#: 2: the pixels of torchvision's pil_loader (no EXIF orientation, 16-bit clipped, converted
#: images as lossless PNG); entries of version 1 (pack's own conversions) are never reused.
CACHE_VERSION = 2
#: The environment variable naming the cache directory.
CACHE_ENV = "FASTLOAD_CACHE"
#: Seconds between two "still waiting" log lines of a process waiting for the packer.
WAIT_LOG_EVERY = 60.0
_POLL = 0.2


# ============================================================================ the dataset's files


class FileList:
    """The samples of a file-based dataset: absolute paths, labels, class names."""

    def __init__(self, desc: str, root: str | None, paths: list[str], labels: list[int], classes: list[str]) -> None:
        self.desc = desc
        self.root = root
        self.paths = paths
        self.labels = labels
        self.classes = classes
        self.stored_classes = [stored_name(c) for c in classes]
        # an array dataset's (fastload.arrays): its (image, label) items, packed in place of the files; the
        # digest of its arrays, the entry's key in place of the files' stat; (height, width, channels)
        self.items: Any = None
        self.digest: str | None = None
        self.image: tuple[int, int, int] | None = None


def describe(dataset: Any) -> tuple[str, str | None]:
    root = getattr(dataset, "root", None)
    try:
        shown = printable(os.fsdecode(root)) if root is not None else None
    except TypeError:
        shown = printable(str(root))
    return f"{type(dataset).__name__}({shown if shown is not None else '...'})", shown


_PACK_IT = "pack what the dataset returns once with fastload.pack_dataset(dataset, OUT) and pass OUT to FastLoader"
#: Methods whose override changes what ``dataset[i]`` is (``__getitems__``: what a DataLoader
#: fetches a batch with, where a dataset has one).
_ITEM_METHODS = ("__getitem__", "__getitems__")


def _name(obj: Any) -> str:
    return printable(str(getattr(obj, "__qualname__", None) or type(obj).__name__))


def _check_loader(dataset: Any, desc: str) -> None:
    """Refuse a ``loader`` whose pixels the cache does not store: anything but torchvision's
    ``pil_loader``, or its ``default_loader`` while the image backend is PIL."""
    loader = getattr(dataset, "loader", None)
    if loader is None:
        return
    try:
        import torchvision
        from torchvision.datasets import folder
    except ImportError:  # pragma: no cover - a duck-typed dataset without torchvision
        raise ConfigError(
            f"{desc}: loads its files with {_name(loader)}, and torchvision (whose default_loader the cache "
            f"reproduces) is not importable; {_PACK_IT}"
        ) from None
    if loader is getattr(folder, "pil_loader", None):
        return
    if loader is getattr(folder, "default_loader", None):
        backend = torchvision.get_image_backend()
        if backend == "PIL":
            return
        raise ConfigError(
            f"{desc}: torchvision's image backend is {printable(repr(backend))}, so its default_loader decodes with "
            f"{printable(str(backend))}, whose pixels the cache does not reproduce (it stores what PIL's pil_loader "
            f"gives); call torchvision.set_image_backend('PIL'), or {_PACK_IT}"
        )
    if loader is getattr(folder, "accimage_loader", None):
        raise ConfigError(
            f"{desc}: loads its files with accimage_loader, whose pixels the cache does not reproduce (it stores "
            f"what PIL's pil_loader gives); use the default loader with the PIL backend, or {_PACK_IT}"
        )
    raise ConfigError(
        f"{desc}: loads its files with a custom loader ({_name(loader)}), whose images FastLoader cannot "
        "reproduce: FastLoader decodes the files as RGB images like torchvision's default_loader; use the "
        f"default loader, or {_PACK_IT}"
    )


def _check_methods(dataset: Any, desc: str, samples: Any) -> None:
    """Refuse a class that overrides what ``dataset[i]`` is: the cache serves ``samples``' files."""
    try:
        from torchvision.datasets import folder
    except ImportError:  # pragma: no cover
        folder = None
    trusted = {folder.DatasetFolder, folder.ImageFolder} if folder is not None else set()
    try:
        import torch.utils.data as tud

        trusted.add(tud.Dataset)
    except ImportError:  # pragma: no cover
        pass
    cls = type(dataset)
    for name in _ITEM_METHODS:
        owner = next((c for c in cls.__mro__ if name in vars(c)), None)
        if owner is None or owner is object or owner in trusted:
            continue
        raise ConfigError(
            f"{desc}: {printable(owner.__qualname__)}.{name} overrides what dataset[i] gives, which the cache "
            f"cannot reproduce (it serves the files of `samples` as torchvision's ImageFolder.__getitem__ reads them); "
            f"{_PACK_IT}"
        )
    if "__len__" in {n for c in cls.__mro__ if c not in trusted and c is not object for n in vars(c)}:
        try:
            n = len(dataset)
        except Exception:  # noqa: BLE001 - whatever a user's __len__ raises
            n = None
        if n != len(samples):
            owner = next(c for c in cls.__mro__ if "__len__" in vars(c))
            raise ConfigError(
                f"{desc}: {printable(owner.__qualname__)}.__len__ gives {n!r}, not the {len(samples)} `samples` "
                f"the cache packs, so FastLoader's indices would not be the dataset's; {_PACK_IT}"
            )


def check_reproducible(dataset: Any) -> None:
    """Refuse, before anything is read or packed, a dataset whose items the cache cannot reproduce.

    The cache (:func:`cached_pack`) serves ``dataset.samples``' files in order, each image the
    pixels torchvision's ``pil_loader`` gives (``Image.open(f).convert("RGB")``: no EXIF
    orientation, 16-bit samples clipped), with ``samples``' labels and ``classes``' names. So
    the dataset must be file-based (a ``samples`` list of ``(path, class_index)``, as
    ``ImageFolder``/``DatasetFolder``), load its files with torchvision's ``pil_loader``, or
    its ``default_loader`` while the image backend is PIL (not accimage), and not override
    ``__getitem__`` / ``__getitems__`` (nor ``__len__`` to another length than ``samples``').
    A subclass overriding ``find_classes`` or ``make_dataset`` is fine: what they chose is in
    ``samples`` and ``classes``, which the cache reads. Transforms are FastLoader's business.

    Raises:
        ConfigError: naming the dataset, the class and the method (or the loader), and what to
            do instead (pack the dataset's items with ``fastload.pack_dataset``).
    """
    desc, _ = describe(dataset)
    samples = getattr(dataset, "samples", None)
    if samples is None or isinstance(samples, (str, bytes)) or not hasattr(samples, "__len__"):
        raise ConfigError(
            f"{desc} is not file-based (it has no `samples` list of (path, class_index) like ImageFolder): "
            "FastLoader packs ImageFolder/DatasetFolder datasets itself; for another dataset, pack it once with "
            "fastload.pack_dataset(dataset, OUT) and pass OUT to FastLoader"
        )
    _check_methods(dataset, desc, samples)
    _check_loader(dataset, desc)


def _class_names(dataset: Any, classes: list[Any], desc: str) -> list[str]:
    """The names the entry stores: ``classes``, or for torchvision's ``ImageNet`` (whose
    ``classes`` are tuples of names, its targets indices of ``wnids``) its ``wnids``."""
    if len(classes) > MAX_CLASSES:
        raise ConfigError(f"{desc}: {len(classes)} classes; at most {MAX_CLASSES} (MAX_CLASSES) are supported")
    bad = next((c for c in classes if not isinstance(c, str)), None)
    if bad is None:
        return classes
    wnids = getattr(dataset, "wnids", None)
    if (
        isinstance(wnids, (list, tuple)) and len(wnids) == len(classes) and all(isinstance(w, str) for w in wnids)
        and all(isinstance(c, (tuple, list)) for c in classes)
    ):  # fmt: skip
        return list(wnids)  # ImageNet: targets index wnids, the folders' names
    raise ConfigError(f"{desc}: class name {printable(repr(bad))[:80]} is not a string; `classes` must be names")


def file_list(dataset: Any) -> FileList:
    desc, root = describe(dataset)
    check_reproducible(dataset)
    samples = dataset.samples
    n = len(samples)
    if n == 0:
        raise ConfigError(f"{desc}: the dataset has no samples; nothing to pack")
    classes_attr = getattr(dataset, "classes", None)
    classes: list[str] | None = None
    if classes_attr is not None:
        if isinstance(classes_attr, (str, bytes)) or not hasattr(classes_attr, "__iter__"):
            raise ConfigError(f"{desc}: `classes` must be a list of class names, got {type(classes_attr).__name__}")
        classes = _class_names(dataset, list(classes_attr), desc)
    paths: list[str] = []
    labels: list[int] = []
    for i, item in enumerate(samples):
        where = f"{desc}.samples[{i}]"
        try:
            path, label = item
        except (TypeError, ValueError):
            raise ConfigError(f"{where}: expected a (path, class_index) pair, got {printable(repr(item))[:120]}") from None
        try:
            p = os.fsdecode(path)
        except TypeError:
            raise ConfigError(f"{where}: path {printable(repr(path))[:120]} is not a file path") from None
        if not p or "\0" in p:
            raise ConfigError(f"{where}: path {printable(repr(p))[:120]} is not a file path")
        try:
            os.fsencode(p)
        except UnicodeEncodeError:  # a lone surrogate such as "\ud800": no file system name is that
            raise ConfigError(f"{where}: path {printable(repr(p))[:120]} is not a file path (it cannot be encoded)") from None
        try:
            if isinstance(label, bool):
                raise TypeError
            lab = operator.index(label)
        except TypeError:
            raise ConfigError(f"{where}: class index {printable(repr(label))[:80]} is not an integer") from None
        hi = len(classes) if classes is not None else MAX_CLASSES
        if not 0 <= lab < hi:
            what = f"the {len(classes)} classes" if classes is not None else f"0..{MAX_CLASSES - 1}"
            raise ConfigError(f"{where}: class index {lab} is outside {what}")
        paths.append(os.path.abspath(p))
        labels.append(lab)
    if classes is None:
        classes = [str(k) for k in range(max(labels) + 1)]
    if len({stored_name(c) for c in classes}) != len(classes):
        raise ConfigError(f"{desc}: two classes have the same name; class names must be unique")
    return FileList(desc, root, paths, labels, classes)


# ============================================================================ where


def default_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory: ``cache_dir``, else ``$FASTLOAD_CACHE``, else ``~/.cache/fastload`` (not created)."""
    if cache_dir is not None:
        try:
            return Path(os.fspath(cache_dir)).expanduser()
        except TypeError:
            raise ConfigError(f"cache_dir must be a directory path or None, got {cache_dir!r}") from None
    env = os.environ.get(CACHE_ENV, "")
    if env:
        return Path(env).expanduser()
    return Path.home() / ".cache" / "fastload"


def _ensure_dir(d: Path, from_env: bool) -> Path:
    how = f" (from ${CACHE_ENV})" if from_env else ""
    shown = printable(str(d))
    try:
        d.mkdir(parents=True, exist_ok=True)
        st = os.stat(d)
    except FileExistsError:
        raise ConfigError(f"cache directory {shown}{how} is a file; pass cache_dir= or set ${CACHE_ENV} to a directory") from None
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise ConfigError(
            f"cache directory {shown}{how}: cannot create it ({why}); pass cache_dir= or set ${CACHE_ENV} to a writable directory"
        ) from None
    if not stat.S_ISDIR(st.st_mode):
        raise ConfigError(f"cache directory {shown}{how} is not a directory; pass cache_dir= or set ${CACHE_ENV} to one")
    return d.resolve()


def _key(files: FileList) -> str:
    h = hashlib.sha256()
    head = {"cache": CACHE_VERSION, "format": FORMAT_VERSION, "classes": files.stored_classes, "samples": len(files.paths)}
    h.update(json.dumps(head, ensure_ascii=True).encode())
    if files.digest is not None:
        h.update(f"arrays\0{files.digest}".encode())
        return h.hexdigest()
    for p, lab in zip(files.paths, files.labels):
        try:
            st = os.stat(p)
            # the status-change time and inode too: cp -p, rsync -t and tar x keep size and mtime
            sig = f"{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}\0{st.st_ino}"
        except (OSError, ValueError) as e:
            sig = f"!{getattr(e, 'errno', None) or type(e).__name__}"
        h.update(f"{p}\0{lab}\0{sig}\n".encode("utf-8", "surrogateescape"))
    return h.hexdigest()


def _slug(root: str | None) -> str:
    base = os.path.basename(os.path.normpath(root)) if root else "dataset"
    s = re.sub(r"[^A-Za-z0-9._-]+", "_", base).strip("._-")[:40]
    return s or "dataset"


def cache_entry(dataset: Any, *, cache_dir: str | os.PathLike | None = None) -> Path:
    """Where :func:`cached_pack` keeps ``dataset``'s entry (it stats every file; creates nothing but the cache dir).

    Raises:
        ConfigError: the dataset is not file-based, or the cache directory is unusable.
    """
    files = file_list(dataset)
    base = _ensure_dir(default_cache_dir(cache_dir), cache_dir is None and bool(os.environ.get(CACHE_ENV)))
    return base / f"{_slug(files.root)}-{_key(files)[:32]}"


# ============================================================================ the lock


class _Lock:
    """An exclusive ``flock`` on ``<entry>.lock``, waited for with a log line now and then."""

    def __init__(self, path: Path, desc: str, entry: Path) -> None:
        self.path = path
        self.desc = desc
        self.entry = entry
        self.fd: int | None = None
        self.locked = False  # False where the file system cannot lock

    def __enter__(self) -> _Lock:
        flags = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0) | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
        try:
            fd = os.open(self.path, flags, 0o666)
        except OSError as e:
            raise ConfigError(
                f"cache lock {printable(str(self.path))}: cannot open it ({e.strerror}); pass cache_dir= or set "
                f"${CACHE_ENV} to a writable directory"
            ) from None
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ConfigError(f"cache lock {printable(str(self.path))} is not a regular file; remove it yourself")
            self.locked = fcntl is not None and self._wait(fd)
        except BaseException:
            os.close(fd)
            raise
        self.fd = fd
        hold_lock(fd)
        return self

    def _wait(self, fd: int) -> bool:
        t0 = time.monotonic()
        last: float | None = None
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                now = time.monotonic()
                if last is None or now - last >= WAIT_LOG_EVERY:
                    log.info(
                        "waiting for another process packing %s into cache entry %s (%.0f s so far)",
                        self.desc, printable(str(self.entry)), now - t0,
                    )  # fmt: skip
                    last = now
                time.sleep(_POLL)
            except OSError as e:  # ENOLCK, EOPNOTSUPP on some network file systems
                log.warning(
                    "cache lock %s: cannot lock it (%s); every process packs %s on its own, the first to finish "
                    "publishes the entry",
                    printable(str(self.path)), e.strerror, self.desc,
                )  # fmt: skip
                return False

    def __exit__(self, *exc: object) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            release_lock(fd)
            with contextlib.suppress(OSError):
                os.close(fd)


#: The entry lock, for the other caches of torch datasets (:mod:`fastload.annotated`).
EntryLock = _Lock


# ============================================================================ packing


class _FileBytes:
    """The dataset's files as a map-style dataset of ``(encoded bytes, label)`` for ``pack_dataset``."""

    def __init__(self, files: FileList) -> None:
        self.paths = files.paths
        self.labels = files.labels
        self.limit = max_file_bytes(DEFAULT_MAX_PIXELS)

    def __len__(self) -> int:
        return len(self.paths)

    def __getitem__(self, i: int) -> tuple[bytes, int]:
        path = self.paths[i]
        shown = printable(path)
        try:
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise OSError(f"{shown}: cannot open it ({e.strerror})") from None
        with open(fd, "rb", buffering=0) as f:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise OSError(f"{shown}: not a regular file ({file_kind(st.st_mode)})")
            if st.st_size > self.limit:
                raise OSError(f"{shown}: {st.st_size} bytes, more than an image within the pixel limit can need")
            os.set_blocking(fd, True)
            return f.read(self.limit + 1), self.labels[i]


def _list_file(files: FileList, path: Path) -> str | None:
    """Write ``path,class name`` rows; None if the pack's own list parser reads back exactly these samples,
    else why not (a phrase for the log)."""
    p, name = "", ""
    try:
        with open(path, "w", encoding="utf-8", newline="") as f:
            # every cell quoted: a bare carriage return would otherwise end the row (csv quotes only "\n" then)
            w = csv.writer(f, lineterminator="\n", quoting=csv.QUOTE_ALL)
            w.writerow(["path", "label"])
            for p, lab in zip(files.paths, files.labels):
                name = files.classes[lab]
                w.writerow([p, name])
    except UnicodeEncodeError:  # a path or class name that is not valid text: not expressible in a list file
        bad = f"the path {printable(p)}" if _not_utf8(p) else f"the class name {printable(repr(name))}"
        return f"{bad} is not UTF-8 text, which a list file holds"
    except OSError as e:
        raise PackError(f"cannot write the list of {files.desc} to the cache ({printable(str(path))}): {e.strerror}") from None
    try:
        src = read_list(path, on_error="fail")
    except ConfigError as e:
        return f"its list file does not read back: {e}"
    if src.classes != files.stored_classes:
        return (
            f"the class names read back from a list file as {printable(repr(src.classes))[:120]}, "
            f"not {printable(repr(files.stored_classes))[:120]}"
        )
    for it, p in zip(src.items, files.paths):
        if it.path != p:
            return f"the path {printable(repr(p))} reads back from a list file as {printable(repr(it.path))}"
    if len(src.items) != len(files.paths) or any(it.error is not None or it.label != lab for it, lab in zip(src.items, files.labels)):
        return "its samples do not read back from a list file as they are"  # a safeguard: the checks above cover what is known
    return None


def _not_utf8(text: str) -> bool:
    """True if ``text`` has no UTF-8 encoding (it holds a lone surrogate, as ``os.fsdecode`` makes of bad bytes)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _verify(path: Path, files: FileList) -> str | None:
    """Why the packed dataset at ``path`` does not hold ``files`` (None if it does)."""
    try:
        m = read_manifest(path)
    except FormatError as e:
        return str(e)
    if m.options.get("pixels") != PIL_LOADER_PIXELS:
        return f"it was not packed with the pixels of torchvision's pil_loader (options.pixels {m.options.get('pixels')!r})"
    if m.classes != files.stored_classes:
        return f"its classes {printable(repr(m.classes))[:120]} are not the dataset's {printable(repr(files.stored_classes))[:120]}"
    if m.num_samples + len(m.skipped) != len(files.paths):
        return f"it holds {m.num_samples} samples and {len(m.skipped)} skipped, the dataset {len(files.paths)}"
    if not m.skipped:
        labels = Dataset(path).labels
        if not np.array_equal(np.asarray(labels, dtype=np.int64), np.asarray(files.labels, dtype=np.int64)):
            return "its labels are not the dataset's class indices"
    return None


def _pack(files: FileList, entry: Path, progress: bool, *, private: bool) -> None:
    """Pack ``files`` into a staging directory, verify it, and rename it to ``entry``.

    The staging directory is ``<entry>.pack`` (under the lock: a killed pack is resumed
    from ``<entry>.pack.partial``), or one of this process's own (``private``: no lock,
    so several processes may pack at once; the first rename wins, the others discard theirs).
    """
    tag = ".pack"
    if private:
        host = re.sub(r"[^A-Za-z0-9._-]+", "_", socket.gethostname())[:40]
        tag = f".pack-{host}-{os.getpid()}"
    staging = entry.with_name(entry.name + tag)
    list_path = staging.with_name(staging.name + ".csv")
    log.info("packing %s into cache entry %s (once)", files.desc, printable(str(entry)))
    with contextlib.suppress(OSError):
        if stat.S_ISDIR(os.lstat(staging).st_mode):  # a pack that finished but was not verified and renamed
            remove_dataset_dir(staging)  # fastload's own files only
    try:
        why = _list_file(files, list_path) if files.items is None else "an array dataset's images"
        as_list = why is None
        if not as_list:
            log.info("%s: packing its files as a dataset of bytes (%s)", files.desc, why)

        def run(**kw: Any) -> None:
            try:
                if as_list:
                    pack_like_pil_loader(list_path, staging, on_error="fail", progress=progress, **kw)
                else:
                    items = _FileBytes(files) if files.items is None else files.items
                    pack_like_pil_loader(items, staging, classes=files.classes, on_error="fail", progress=progress, **kw)
            except BadImageError as e:
                if files.items is not None:  # an array dataset (fastload.arrays)
                    raise PackError(f"{files.desc}: {e}; {files.items.ADVICE}") from None
                raise PackError(
                    f"{files.desc}: {e}; FastLoader keeps every sample of a torchvision dataset at its own index, "
                    "so it packs all of them or none: fix or remove that file, or pack the folder with "
                    "`fastload pack` (which skips such files) and pass the packed directory"
                ) from None

        leftover = os.path.lexists(staging.with_name(staging.name + ".partial"))
        try:
            run(resume=leftover)  # continues a pack a killed process left in <entry>.pack.partial
        except ConfigError as e:
            if not leftover:
                raise
            log.warning("%s: cannot resume the unfinished pack in the cache (%s); starting it again", files.desc, e)
            run(overwrite=True)
    finally:
        with contextlib.suppress(OSError):
            os.unlink(list_path)
    problem = _verify(staging, files)
    if problem is not None:
        remove_dataset_dir(staging)
        raise PackError(f"the pack of {files.desc} does not match the dataset: {problem}; this is a fastload bug, please report it")
    try:
        os.rename(staging, entry)
    except OSError as e:
        if e.errno in (errno.EEXIST, errno.ENOTEMPTY) and _finished(entry, files):  # another process was first
            remove_dataset_dir(staging)
            return
        raise PackError(
            f"cannot publish cache entry {printable(str(entry))} ({e.strerror}); if it exists but is incomplete, remove it"
        ) from None
    fsync_dir(entry.parent)
    m = read_manifest(entry)
    if m.skipped:
        first = m.skipped[0]
        log.warning(
            "%d of %d images of %s could not be packed and are left out (the first: %s: %s); FastLoader reads the other %d",
            len(m.skipped), len(files.paths), files.desc, printable(str(first.get("path"))),
            printable(str(first.get("reason"))), m.num_samples,
        )  # fmt: skip


def _finished(entry: Path, files: FileList) -> bool:
    """True if ``entry`` is a finished entry (it has its manifest) holding ``files``."""
    if not (entry / MANIFEST_NAME).is_file():
        if os.path.lexists(entry):
            raise FormatError(
                f"cache entry {printable(str(entry))} exists without a {MANIFEST_NAME}: it was not made by fastload's "
                "cache, or was damaged; remove it and run again"
            )
        return False
    problem = _verify(entry, files)
    if problem is not None:
        raise FormatError(f"cache entry {printable(str(entry))} does not hold {files.desc}: {problem}; remove it and run again")
    return True


def cached_pack(dataset: Any, *, cache_dir: str | os.PathLike | None = None, progress: bool = True) -> Path:
    """Pack a file-based torchvision dataset once into the cache; return the packed directory.

    Every rank of a job may call it at once: one packs, the others wait for it, and all
    return the same finished entry. Samples, their order, labels and class names are
    the dataset's (``samples`` and ``classes``); see the module docstring for the key,
    the lock and what is packed.

    Args:
        dataset: a torchvision ``ImageFolder`` / ``DatasetFolder`` (or any object with a
            ``samples`` list of ``(path, class_index)``, ``classes`` optional) using
            torchvision's default loader.
        cache_dir: the cache directory (default ``$FASTLOAD_CACHE``, else ``~/.cache/fastload``).
        progress: show ``fastload pack``'s progress bar on stderr while packing.

    Returns:
        The entry directory, a finished packed dataset to give to :class:`fastload.FastLoader`.

    Raises:
        ConfigError: the dataset is not file-based (no ``samples``), uses a custom loader,
            has bad samples, or the cache directory is unusable.
        PackError: packing failed (no image could be packed, disk full, ...), naming the
            dataset's root; nothing that looks finished is left (an unfinished pack is
            resumed by the next call).
        FormatError: an existing entry is damaged (the message says to remove it).
    """
    return pack_files(file_list(dataset), cache_dir=cache_dir, progress=progress)


def pack_files(files: FileList, *, cache_dir: str | os.PathLike | None, progress: bool) -> Path:
    """:func:`cached_pack` of a dataset's checked files."""
    base = _ensure_dir(default_cache_dir(cache_dir), cache_dir is None and bool(os.environ.get(CACHE_ENV)))
    entry = base / f"{_slug(files.root)}-{_key(files)[:32]}"
    if _finished(entry, files):
        log.debug("%s: using cache entry %s", files.desc, entry)
        return entry
    with _Lock(entry.with_name(entry.name + ".lock"), files.desc, entry) as lock:
        if _finished(entry, files):  # another process packed it while this one waited
            return entry
        try:
            _pack(files, entry, bool(progress), private=not lock.locked)
        except ConfigError as e:
            raise ConfigError(f"cannot pack {files.desc} into cache entry {printable(str(entry))}: {e}") from None
        except PackError as e:
            raise PackError(f"cannot pack {files.desc} into cache entry {printable(str(entry))}: {e}") from None
    return entry
