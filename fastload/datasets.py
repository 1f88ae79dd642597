"""Torch dataset objects as FastLoader reads them: Subset and ConcatDataset trees down to file datasets, checked, then opened through the cache.

:func:`plan_dataset` walks what a script hands ``FastLoader`` (an ``ImageFolder``, an
``ImageNet``, a packed :class:`fastload.Dataset`, and any nesting of ``Subset`` --
what ``random_split`` returns -- and ``ConcatDataset`` over them), refuses what cannot be
reproduced naming the place, the class and the method, and returns a :class:`DatasetPlan`
whose ``open()`` packs each file dataset once (:mod:`fastload.cache`) and gives what reads
the user's items in the user's order (:class:`fastload.composite.DatasetView`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from .arrays import array_files, is_array_dataset
from .cache import FileList, check_reproducible, describe, file_list, pack_files
from .errors import ConfigError, printable
from .reader import Dataset

__all__ = ["DatasetPlan", "MAX_DEPTH", "Resolved", "plan_dataset", "resolve_dataset"]

#: How deep Subsets and ConcatDatasets may nest.
MAX_DEPTH = 64
#: The route for a dataset of ``(image, target)`` items whose target is not a class index.
_PAIRS = (
    "its items are (image, target) pairs with a {kind} target, which pack_dataset cannot store as a label: "
    "torchvision's CocoDetection, VOCSegmentation and VOCDetection are served as they are (pass one); for another, "
    "pack its items as dicts of fields, e.g. fastload.pack_dataset([{{'image': image, 'boxes': float32 [N, 4] XYXY, "
    "'labels': int64 [N]}}, ...], OUT, fields={{'boxes': 'float32[][4]', 'labels': 'int64[]'}}), and read them with "
    "FastLoader(OUT, batch_size, fields=('image', 'boxes', 'labels')) (docs/detection.md)"
)
_TO_PACK = "pack it once with fastload.pack_dataset(dataset, OUT) and pass OUT (or Subset(fastload.Dataset(OUT), indices))"


class _Leaf:
    """A dataset at the bottom of a Subset/ConcatDataset tree: a file dataset (packed through the
    cache) or a packed :class:`Dataset`; its transforms and classes as the user's objects hold them."""

    def __init__(self, obj: Any, where: str, files: FileList | None) -> None:
        self.obj, self.where, self.files = obj, where, files
        self.transform = getattr(obj, "transform", None) if files is not None else None
        self.target_transform = getattr(obj, "target_transform", None) if files is not None else None
        own = getattr(obj, "classes", None) if files is not None else obj.classes
        self.classes = list(own) if own is not None else list(files.classes)  # type: ignore[union-attr]
        self.size = len(files.paths) if files is not None else len(obj)


def _owner(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in vars(c)), None)


def _overridden(obj: Any, base: type, where: str, methods: tuple[str, ...]) -> None:
    """Refuse a subclass of torch's ``base`` overriding what ``obj[i]`` (or its length) is."""
    import torch.utils.data as tud

    for name in methods:
        owner = _owner(type(obj), name)
        if owner is not None and owner not in (base, tud.Dataset, object):
            raise ConfigError(
                f"{where}: {printable(owner.__qualname__)}.{name} overrides {base.__name__}.{name}, which FastLoader cannot "
                f"reproduce (it reads the samples {base.__name__} would give); {_TO_PACK}"
            )


def _item_advice(obj: Any) -> str:
    """What to change for a dataset whose items are built in Python: read from its first item (this
    error's path only) and its transform, e.g. accelerate's cv_example ``PetsDataset`` (dict items,
    ``Resize((224, 224))``)."""
    try:
        item = obj[0]
    except Exception:  # noqa: BLE001 - advice only
        return _TO_PACK
    steps = []
    if isinstance(item, (tuple, list)) and len(item) == 2 and not isinstance(item[1], int):
        return _PAIRS.format(kind=printable(type(item[1]).__name__))
    if isinstance(item, dict):
        keys = ", ".join(repr(k) for k in list(item)[:4])
        steps.append(
            f"its items are dicts ({keys}) and FastLoader yields [images, labels] batches: write its files and labels "
            "as a list file (one `path,label` line each) and `fastload pack LIST OUT` (or make its items (image, label) "
            "pairs and fastload.pack_dataset(dataset, OUT)), then read batch[0] and batch[1] where the loop reads the "
            "dict's image and label"
        )
    else:
        steps.append(_TO_PACK)
    for attr in sorted(vars(obj)) if hasattr(obj, "__dict__") else []:
        t = getattr(obj, attr, None)
        if "transform" in attr and t is not None and callable(t) and not attr.startswith("target"):
            from .transforms import translate

            try:
                translate(t)
                steps.append(f"pass its {attr} as FastLoader(OUT, batch_size, transform=dataset.{attr})")
            except ConfigError as e:
                steps.append(f"and its {attr} cannot be run as it is: {e}")
            break
    return "; ".join(steps)


def _refuse(obj: Any, where: str) -> ConfigError:
    """Why FastLoader cannot read ``obj``: the method that builds its items, and what to do."""
    import torch.utils.data as tud

    cls = type(obj)
    names = ("__iter__", "__getitem__") if isinstance(obj, tud.IterableDataset) else ("__getitem__", "__iter__")
    for name in names:
        owner = _owner(cls, name)
        if owner is not None and owner not in (object, tud.Dataset, tud.IterableDataset):
            how = "builds each item in Python" if name == "__getitem__" else "yields its items in Python (an IterableDataset)"
            return ConfigError(
                f"{where}: {printable(owner.__qualname__)}.{name} {how}, which FastLoader cannot reproduce (it reads "
                f"packed images: ImageFolder/DatasetFolder files, packed datasets, and Subsets and ConcatDatasets of them); "
                f"{_item_advice(obj) if name == '__getitem__' else _TO_PACK}"
            )
    return ConfigError(f"{where}: a {printable(cls.__qualname__)} is not a dataset FastLoader can read; {_TO_PACK}")


def _walk(obj: Any, where: str, leaves: list[_Leaf], depth: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """``(leaf of each item, its index in that leaf)`` of ``obj``, whose leaves are appended to ``leaves``."""
    import torch.utils.data as tud

    from .composite import positions

    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: Subsets and ConcatDatasets nested more than {MAX_DEPTH} deep")
    if isinstance(obj, Dataset):  # packed already (a DatasetView too)
        leaves.append(_Leaf(obj, where, None))
    elif isinstance(obj, tud.Subset):
        _overridden(obj, tud.Subset, where, ("__getitem__", "__getitems__", "__len__"))
        which, index = _walk(obj.dataset, f"{where}.dataset", leaves, depth + 1)
        idx = positions(obj.indices, len(which), what=f"{where}.indices")
        return which[idx], index[idx]
    elif isinstance(obj, tud.ConcatDataset):
        _overridden(obj, tud.ConcatDataset, where, ("__getitem__", "__getitems__", "__len__"))
        parts = [_walk(d, f"{where}.datasets[{k}]", leaves, depth + 1) for k, d in enumerate(obj.datasets)]
        if not parts:
            raise ConfigError(f"{where}: a ConcatDataset of no datasets")
        return np.concatenate([w for w, _ in parts]), np.concatenate([i for _, i in parts])
    elif isinstance(getattr(obj, "packed", None), Dataset):  # another loader's .dataset
        raise ConfigError(
            f"{where}: a FastLoader's .dataset inside a Subset or ConcatDataset; give FastLoader "
            "fastload.composite.subset(loader.dataset.packed, indices) with the loader's transform or settings"
        )
    elif getattr(obj, "samples", None) is not None:  # ImageFolder/DatasetFolder/ImageNet, or duck-typed
        try:
            leaves.append(_Leaf(obj, where, file_list(obj)))
        except ConfigError as e:
            raise (e if depth == 0 else ConfigError(f"{where}: {e}")) from None
    elif is_array_dataset(obj):  # CIFAR10, MNIST, SVHN...: its images without its transform
        desc, root = describe(obj)
        leaves.append(_Leaf(obj, where, array_files(obj, where if depth else desc, root)))
    else:
        raise _refuse(obj, where)
    k = len(leaves) - 1
    return np.full(leaves[k].size, k, dtype=np.int32), np.arange(leaves[k].size, dtype=np.int64)


def _same(a: Any, b: Any) -> bool:
    """Whether two transforms are the same: one object, equal, or of one repr showing no address."""
    if a is b:
        return True
    try:
        if bool(a == b):
            return True
    except Exception:  # noqa: BLE001 - a user's __eq__
        pass
    ra, rb = repr(a), repr(b)
    return ra == rb and " at 0x" not in ra


class DatasetPlan:
    """What :func:`plan_dataset` found: the transforms to translate, and how to open the data.

    Attributes:
        name: how the dataset is named in messages (``Subset(ImageFolder(/data))``).
        transform, target_transform: the innermost file datasets' (a Subset has none).
        classes, class_to_idx: the user's dataset's own (``ImageNet``: tuples of names,
            each name to its index), which may differ from the stored names (its wnids).
        root: the first file dataset's ``root`` ("" when there is none).
        samples: ``(path, target)`` of each item in the user's index order, as the file
            datasets hold them; None where an item comes from a packed dataset.
    """

    def __init__(self, obj: Any, leaves: list[_Leaf], which: np.ndarray, index: np.ndarray, name: str) -> None:
        self.obj, self.name = obj, name
        self._leaves, self._which, self._index = leaves, which, index
        first = leaves[0]
        self.transform, self.target_transform = first.transform, first.target_transform
        self.classes = first.classes
        c2i = getattr(first.obj, "class_to_idx", None) if first.files is not None else None
        self.class_to_idx = dict(c2i) if isinstance(c2i, dict) else {c: i for i, c in enumerate(self.classes)}
        roots = (getattr(lf.obj, "root", None) for lf in leaves if lf.files is not None)
        self.root = next((str(r) for r in roots if r is not None), "")

    @property
    def image(self) -> tuple[int, int, int] | None:
        """``(height, width, channels)`` of every image, when all come from array datasets of that size; else None."""
        sizes = {lf.files.image if lf.files is not None else None for lf in self._leaves}
        return sizes.pop() if len(sizes) == 1 else None

    @property
    def samples(self) -> list[tuple[str, int]] | None:
        if any(lf.files is None or lf.files.items is not None for lf in self._leaves):
            return None
        own = [lf.obj.samples for lf in self._leaves]
        return [(own[k][j][0], int(own[k][j][1])) for k, j in zip(self._which.tolist(), self._index.tolist())]

    def open(self, *, cache_dir: str | os.PathLike | None = None, progress: bool = True, check: bool = False) -> Dataset:
        """Pack each file dataset once (:func:`cached_pack`'s entry) and return what reads the user's items.

        The dataset given was itself a file dataset: its entry as a :class:`Dataset`, as
        before. Otherwise a :class:`fastload.composite.DatasetView` whose position ``p`` is
        the user's ``dataset[p]``; its errors name ``p`` and the file.
        """
        from .composite import DatasetView, concat, subset

        opened: dict[int, Dataset] = {}
        entries: dict[int, Path] = {}  # one file dataset used twice is looked up once
        for lf in self._leaves:
            if lf.files is None:
                opened[id(lf)] = lf.obj
                continue
            if id(lf.obj) not in entries:
                entries[id(lf.obj)] = pack_files(lf.files, cache_dir=cache_dir, progress=progress)
            ds = Dataset(entries[id(lf.obj)], check=check)
            n = len(ds)
            opened[id(lf)] = DatasetView([ds], np.zeros(n, np.int32), np.arange(n), paths=[lf.files.paths], name=lf.files.desc)
        if len(self._leaves) == 1 and self._leaves[0].obj is self.obj:
            lf = self._leaves[0]
            return opened[id(lf)].parts[0] if lf.files is not None else lf.obj  # type: ignore[attr-defined]
        offsets = np.cumsum([0] + [lf.size for lf in self._leaves])
        whole = concat([opened[id(lf)] for lf in self._leaves], name=self.name)
        return subset(whole, offsets[self._which] + self._index, name=self.name)


def _describe_tree(obj: Any) -> str:
    import torch.utils.data as tud

    if isinstance(obj, tud.Subset):
        return f"Subset({_describe_tree(obj.dataset)})"
    if isinstance(obj, tud.ConcatDataset):
        return f"ConcatDataset({', '.join(_describe_tree(d) for d in obj.datasets)})"
    if isinstance(obj, Dataset):
        return printable(str(getattr(obj, "name", None) or obj.path))
    return describe(obj)[0]


def plan_dataset(obj: Any) -> DatasetPlan:
    """Check a torch dataset object FastLoader is given, before anything is packed or read.

    Accepted: a torchvision ``ImageFolder``/``DatasetFolder`` (``ImageNet`` too) whose items
    the cache reproduces (:func:`check_reproducible`), a packed :class:`Dataset`, and any
    nesting of ``torch.utils.data.Subset`` (what ``random_split`` returns) and
    ``ConcatDataset`` over them, whose file datasets have the same classes and the same
    ``transform`` and ``target_transform``.

    Raises:
        ConfigError: naming the place in the tree (``dataset.datasets[1].dataset``), the class
            and the method whose items cannot be reproduced, and what to do; or the two class
            lists, or the two transforms, that differ.
    """
    name = _describe_tree(obj)
    leaves: list[_Leaf] = []
    which, index = _walk(obj, name, leaves)
    first = leaves[0]
    for lf in leaves[1:]:
        why = _mismatch(first, lf)
        if why is not None:
            raise ConfigError(f"{name}: {why}")
    return DatasetPlan(obj, leaves, which, index, name)


def _mismatch(a: _Leaf, b: _Leaf) -> str | None:
    """Why two leaves cannot be read as one dataset (classes or transforms differ), or None."""
    from .composite import class_mismatch

    why = class_mismatch(a.classes, b.classes, a.where, b.where)
    if why is not None:
        return f"{why}; concatenate datasets with the same classes"
    for attr in ("transform", "target_transform"):
        x, y = getattr(a, attr), getattr(b, attr)
        if not _same(x, y):
            return (
                f"{a.where} has the {attr} {printable(repr(x))[:160]} and {b.where} {printable(repr(y))[:160]}: "
                f"FastLoader runs one {attr} for the whole dataset; give every part the same one"
            )
    return None


class Resolved(NamedTuple):
    """What :func:`resolve_dataset` returns."""

    dataset: Dataset  #: what the loader reads: a Dataset, or a DatasetView of the user's indices
    transform: Any  #: the innermost file datasets' transform (None: none, or a packed dataset)
    target_transform: Any
    plan: DatasetPlan  #: root, samples, classes, class_to_idx as the user's objects have them


def resolve_dataset(
    obj: Any, *, cache_dir: str | os.PathLike | None = None, progress: bool = True, check: bool = False
) -> Resolved:
    """:func:`plan_dataset` then :meth:`DatasetPlan.open`: a torch dataset object as a packed dataset and its transforms."""
    plan = plan_dataset(obj)
    return Resolved(plan.open(cache_dir=cache_dir, progress=progress, check=check), plan.transform, plan.target_transform, plan)
