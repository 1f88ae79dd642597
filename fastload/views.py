"""``loader.dataset``: an ImageFolder-like view of a packed dataset whose items are processed samples.

Training scripts use their loader's dataset as a torchvision ``ImageFolder``: they read
``classes``, ``class_to_idx``, ``targets``, ``samples``/``imgs`` and ``root``, and some
index it in a plain ``DataLoader`` (``Subset(val_loader.dataset, ...)`` for the remainder
of a distributed evaluation). :class:`LoaderDataset` answers all of that; its items are
``(image_tensor, label)``, processed on the CPU, one sample at a time, the way the loader
processes them. Raw records stay on :class:`fastload.Dataset` (``.packed``).
"""

from __future__ import annotations

import functools
import io
import operator
import os
from collections.abc import Sequence
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .augment import train_params
from .augment.padcrop import host_window, pad_crop_params
from .host import eval_crop, finish_crops
from .reader import Dataset


class _SourcePaths(Sequence):
    """``(source path, label)`` of each sample, read from its record when asked for (lazily)."""

    def __init__(self, packed: Dataset, root: str, labels: np.ndarray) -> None:
        self._packed, self._root, self._labels = packed, root, labels

    def __len__(self) -> int:
        return len(self._packed)

    def __getitem__(self, i: Any) -> Any:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        path = self._packed.source_path(i)
        return os.path.join(self._root, path), int(self._labels[i])

    def __iter__(self) -> Iterator[tuple[str, int]]:
        for i in range(len(self)):
            yield self[i]


class LoaderDataset(torch.utils.data.Dataset):
    """An ImageFolder-like view of ``packed`` whose items are ``(image_tensor, label)``.

    Args:
        packed: the packed dataset.
        labels: the labels the loader yields (after any ``target_transform``).
        settings: the loader's image settings: ``train``, ``crop``, ``resize``, ``scale``,
            ``ratio``, ``flip``, ``mean``, ``std``, ``seed``.
        epoch: returns the loader's current epoch (training crops and flips depend on it).
        transform: when the loader was made from a torchvision dataset, that dataset's
            transform (kept for clients that read it; FastLoader applies its translation).
        origin: that torchvision dataset: ``root`` and ``samples``/``imgs`` are its own.
    """

    def __init__(
        self,
        packed: Dataset,
        *,
        labels: np.ndarray,
        settings: dict[str, Any],
        epoch: Callable[[], int],
        transform: Any = None,
        target_transform: Any = None,
        origin: Any = None,
        on_transform: Callable[[Any], dict[str, Any]] | None = None,
    ) -> None:
        self.packed = packed
        self._labels = labels
        self._settings = dict(settings)
        self._epoch = epoch
        self._on_transform = on_transform
        self._transform = transform
        self.target_transform = target_transform
        self.classes: list[str] = packed.classes
        self.class_to_idx: dict[str, int] = {c: i for i, c in enumerate(self.classes)}
        if origin is not None:  # a torchvision dataset packed into the cache: its own root and files
            self.root: str = str(getattr(origin, "root", ""))
            self.samples: Any = [(str(p), int(y)) for (p, _y), y in zip(origin.samples, labels.tolist())]
            own = getattr(origin, "classes", None)  # ImageNet's are tuples of names: the dataset's own
            if own is not None and len(own) == len(self.classes):
                self.classes = list(own)
                self.class_to_idx = dict(getattr(origin, "class_to_idx", None) or {c: i for i, c in enumerate(own)})
        else:
            options = packed.manifest.options if isinstance(packed.manifest.options, dict) else {}
            self.root = str(options.get("source", ""))
            # a list file's paths are relative to its folder, a folder's to the folder
            base = os.path.dirname(self.root) if self.root.lower().endswith((".csv", ".tsv", ".txt")) else self.root
            self.samples = _SourcePaths(packed, base, labels)
        self.imgs = self.samples

    def __getstate__(self) -> dict[str, Any]:
        """A copy (a DataLoader worker under spawn/forkserver, deepcopy) keeps the epoch it was made in."""
        state = self.__dict__.copy()
        state["_epoch"] = functools.partial(operator.index, self._epoch())
        state["_on_transform"] = None  # a copy is not its loader's view any more
        return state

    @property
    def transform(self) -> Any:
        """The transform the loader runs (translated into its DALI graph), as a torchvision dataset's.

        Assigning one (DeiT's ``--ThreeAugment`` does, after the loader is built) makes the loader
        run it from its next ``iter()`` on, or raises ConfigError naming the step it cannot run;
        never ignored.
        """
        return self._transform

    @transform.setter
    def transform(self, transform: Any) -> None:
        if self._on_transform is not None:
            self._settings = dict(self._on_transform(transform))  # ConfigError: nothing changes
        self._transform = transform

    @property
    def settings(self) -> dict[str, Any]:
        """The loader's image settings this view processes samples with."""
        return dict(self._settings)

    @property
    def targets(self) -> list[int]:
        """Every sample's label, in index order (from ``labels.bin``: no shard is read)."""
        return self._labels.tolist()

    def __len__(self) -> int:
        return len(self.packed)

    def __getitem__(self, index: int) -> tuple[Any, int]:
        """Sample ``index`` decoded and processed like the loader's: CHW, normalised unless uint8 (a multi-view
        transform's: the list of its views, each cropped, flipped and normalised as that view's settings say)."""
        from PIL import Image

        i = operator.index(index)
        if i < 0:
            i += len(self)
        _header, payload = self.packed.record(i)  # IndexError for an index out of range
        with Image.open(io.BytesIO(payload)) as im:
            rgb = np.asarray(im.convert("RGB"))
        views = self._settings.get("views")
        if views:
            return [self._processed(rgb, i, s) for s in views], int(self._labels[i])
        return self._processed(rgb, i, self._settings), int(self._labels[i])

    def _processed(self, rgb: np.ndarray, i: int, s: dict[str, Any]) -> torch.Tensor:
        """Sample ``i``'s decoded pixels ``rgb`` under settings ``s``, as one CHW tensor."""
        interp = s.get("interpolation", "bilinear")
        pc = s.get("pad_crop")
        if s["train"] and pc is not None:  # torchvision's RandomCrop: the loader's window, drawn alike
            corners, flips, _ = pad_crop_params(
                np.array([rgb.shape[1]]), np.array([rgb.shape[0]]), pc=pc, crop=s["crop"], seed=s["seed"],
                epoch=self._epoch(), positions=np.array([i]), flip=s["flip"],
            )  # fmt: skip
            crops, flip = [host_window(rgb, corners[0], pc=pc, crop=s["crop"])], flips
        elif s["train"]:
            boxes, flips = train_params(
                np.array([rgb.shape[1]]), np.array([rgb.shape[0]]), seed=s["seed"], epoch=self._epoch(),
                positions=np.array([i]), scale=s["scale"], ratio=s["ratio"], flip=s["flip"],
            )  # fmt: skip
            x, y, w, h = (int(v) for v in boxes[0])
            crops, flip = [rgb[y : y + h, x : x + w]], flips
        else:
            crops, flip = [eval_crop(rgb, resize=s["resize"], crop=s["crop"], interpolation=interp)], np.zeros(1, dtype=bool)
        batch = finish_crops(
            crops, flip, crop=s["crop"], mean=s["mean"], std=s["std"], dtype=torch.float32, channels_last=False,
            interpolation=interp,
        )  # fmt: skip
        return batch[0][: s.get("channels", 3)]

    def __repr__(self) -> str:
        return f"LoaderDataset({str(self.packed.path)!r}, samples={len(self)}, classes={len(self.classes)})"


__all__ = ["LoaderDataset"]
