"""Array datasets (torchvision's CIFAR10/100, MNIST, FashionMNIST, SVHN, STL10...) as the cache packs them: their items without their transform.

Such a dataset keeps every image in one uint8 array ``.data`` (``N x H x W x 3`` for CIFAR,
``N x H x W`` -- a torch tensor -- for MNIST, ``N x 3 x H x W`` for SVHN and STL10) and its labels
in ``.targets`` or ``.labels``; its ``__getitem__`` makes a PIL image of row ``i`` and applies its
``transform``. :func:`array_files` recognises one and describes what the cache
(:func:`fastload.cache.pack_files`) packs for it: the items of a shallow copy of the dataset
whose ``transform`` and ``target_transform`` are None -- exactly the PIL images the dataset's
own ``__getitem__`` hands its transform, each checked against the first (one mode, one size)
and its label against the label array. The entry's key is a digest of the arrays, so changed
data gives a new entry. Grayscale (``L``) images are stored as RGB and read back one-channel
(``image``'s third number), as the dataset's own transform sees them.
"""

from __future__ import annotations

import copy
import hashlib
import operator
from typing import Any

import numpy as np

from .errors import ConfigError, printable

__all__ = ["ArrayItems", "array_files", "is_array_dataset", "one_size", "packed_image"]

#: The label attributes read, in order.
LABEL_ATTRS = ("targets", "labels")
#: The PIL modes served, and their channel counts.
MODES = {"RGB": 3, "L": 1}


def one_size(stats: Any) -> tuple[int, int, int] | None:
    """``(height, width, 3)`` when a packed dataset's manifest ``stats`` say every image has that size, else None."""
    if not isinstance(stats, dict):
        return None
    sides = [stats.get(k) if isinstance(stats.get(k), dict) else {} for k in ("height", "width")]
    lo, hi = [d.get("min") for d in sides], [d.get("max") for d in sides]
    if any(type(v) is not int for v in lo + hi) or lo != hi:
        return None
    return (lo[0], lo[1], 3)


def packed_image(dataset: Any) -> tuple[int, int, int] | None:
    """:func:`one_size` of a packed dataset (a local directory or a :class:`fastload.Dataset`); None for a URL."""
    from .errors import FastloadError
    from .reader import Dataset, read_manifest
    from .remote.url import is_url

    if isinstance(dataset, Dataset):
        return one_size(dataset.manifest.stats)
    if is_url(dataset):
        return None
    try:
        return one_size(read_manifest(dataset).stats)
    except (FastloadError, OSError):  # opening it says what is wrong
        return None


def _as_array(value: Any) -> np.ndarray | None:
    """``value`` as a NumPy array when it is a NumPy array or a CPU torch tensor, else None."""
    if isinstance(value, np.ndarray):
        return value
    if type(value).__module__.startswith("torch") and hasattr(value, "numpy"):
        try:
            return value.detach().cpu().numpy()
        except Exception:  # noqa: BLE001 - not an array after all
            return None
    return None


def is_array_dataset(obj: Any) -> bool:
    """Whether ``obj`` keeps its images in a uint8 ``.data`` array (N images of 2 or 3 dimensions), its labels, a transform."""
    data = _as_array(getattr(obj, "data", None))
    labelled = any(getattr(obj, a, None) is not None for a in LABEL_ATTRS)
    return data is not None and data.dtype == np.uint8 and data.ndim in (3, 4) and hasattr(obj, "transform") and labelled


def _labels(obj: Any, n: int, desc: str) -> np.ndarray:
    """The first of ``.targets``/``.labels`` that is set (:func:`is_array_dataset` saw one), as int64 class indices."""
    attr = next(a for a in LABEL_ATTRS if getattr(obj, a, None) is not None)
    value = getattr(obj, attr)
    arr = _as_array(value)
    arr = np.asarray(value) if arr is None else arr
    if arr.shape != (n,) or arr.dtype.kind not in "iu":
        raise ConfigError(f"{desc}.{attr}: {arr.dtype} {arr.shape}, where FastLoader needs {n} integer class indices, one per image")
    if n and arr.min() < 0:
        raise ConfigError(
            f"{desc}.{attr}: label {int(arr.min())} is not a class index (an unlabelled split?); FastLoader "
            "serves labelled images: use a labelled split"
        )
    return arr.astype(np.int64)


def _plain(obj: Any) -> Any:
    """A shallow copy of ``obj`` that returns its items without its transforms."""
    plain = copy.copy(obj)
    for attr in ("transform", "target_transform", "transforms"):
        if hasattr(plain, attr):
            setattr(plain, attr, None)
    return plain


class ArrayItems:
    """The dataset's ``(PIL image, label)`` items without its transforms, each checked as it is read."""

    #: What to do when an item is not what the first was (the cache's error says it).
    ADVICE = ""

    def __init__(self, obj: Any, labels: np.ndarray, desc: str, mode: str, size: tuple[int, int]) -> None:
        self.plain, self.labels, self.desc, self.mode, self.size = _plain(obj), labels, desc, mode, size

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[Any, int]:
        image, label = self.plain[i][:2]
        why = _item_problem(image, label, int(self.labels[i]), self.mode, self.size)
        if why is not None:
            raise ValueError(f"{self.desc}[{i}] without its transform: {why}")
        return image, int(self.labels[i])


def _item_problem(image: Any, label: Any, expected: int, mode: str, size: tuple[int, int]) -> str | None:
    """Why an item is not the image and label the cache stores (None: it is)."""
    from PIL import Image

    if not isinstance(image, Image.Image):
        return f"its image is a {type(image).__name__}, not a PIL image"
    if image.mode != mode or image.size != size:
        return f"a {image.mode} {image.size[0]}x{image.size[1]} image, where the first is {mode} {size[0]}x{size[1]}"
    try:
        lab = operator.index(label) if not hasattr(label, "item") else int(label.item())
    except (TypeError, ValueError):
        return f"its label {printable(repr(label))[:60]} is not an integer"
    if lab != expected:
        return f"its label {lab} is not the label array's {expected}"
    return None


def _digest(obj: Any, data: np.ndarray, labels: np.ndarray, classes: list[str]) -> str:
    h = hashlib.sha256()
    cls = type(obj)
    h.update(f"{cls.__module__}.{cls.__qualname__}\0{data.dtype}\0{data.shape}\0{len(classes)}\0".encode())
    h.update("\0".join(classes).encode("utf-8", "surrogateescape"))
    h.update(np.ascontiguousarray(data).data)
    h.update(np.ascontiguousarray(labels).data)
    return h.hexdigest()


def array_files(obj: Any, desc: str, root: str | None) -> Any:
    """What the cache packs for an array dataset (a :class:`fastload.cache.FileList` with ``items``).

    Its first item, without its transforms, must be an RGB or L PIL image with the label of its
    label array; ``image`` is then ``(height, width, channels)``.

    Raises:
        ConfigError: naming the attribute or the item that does not fit, and what to do.
    """
    from .cache import FileList

    data = _as_array(obj.data)
    n = int(data.shape[0])
    if n == 0:
        raise ConfigError(f"{desc}: the dataset has no images; nothing to pack")
    try:
        length = len(obj)
    except Exception:  # noqa: BLE001 - a user's __len__
        length = None
    if length != n:
        raise ConfigError(f"{desc}: len(dataset) is {length!r} but .data holds {n} images; {_ROUTE}")
    labels = _labels(obj, n, desc)
    plain = _plain(obj)
    try:
        image, label = plain[0][:2]
    except Exception as e:  # noqa: BLE001 - the dataset's own error, shown
        raise ConfigError(f"{desc}[0] without its transform raises {type(e).__name__}: {printable(str(e))[:120]}") from None
    mode = getattr(image, "mode", None)
    if mode is not None and mode not in MODES:
        raise ConfigError(
            f"{desc}[0] without its transform is a {printable(str(mode))} image, and FastLoader's batches hold RGB or "
            "grayscale (L) images: keep the dataset's .data as RGB (or grayscale) images"
        )
    if mode is None:
        raise ConfigError(f"{desc}[0] without its transform is a {type(image).__name__}, not a PIL image; {_ROUTE}")
    why = _item_problem(image, label, int(labels[0]), mode, image.size)
    if why is not None:
        raise ConfigError(f"{desc}[0] without its transform: {why}; {_ROUTE}")
    own = getattr(obj, "classes", None)
    classes = [str(c) for c in own] if own is not None else [str(k) for k in range(int(labels.max()) + 1)]
    if int(labels.max()) >= len(classes):
        raise ConfigError(f"{desc}: label {int(labels.max())} is outside its {len(classes)} classes")
    files = FileList(desc, root, [f"{desc}[{i}]" for i in range(n)], labels.tolist(), classes)
    files.items = ArrayItems(obj, labels, desc, mode, image.size)
    files.digest = _digest(obj, data, labels, classes)
    files.image = (image.size[1], image.size[0], MODES[mode])
    return files


_ROUTE = (
    "pack its images once with fastload.pack_dataset(dataset, OUT) after setting dataset.transform = None, and pass "
    "FastLoader(OUT, batch_size, transform=the transform)"
)
ArrayItems.ADVICE = f"every item must be a {' or '.join(MODES)} PIL image of the first one's size with its label array's label; {_ROUTE}"
