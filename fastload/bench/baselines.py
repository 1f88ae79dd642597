"""The baselines FastLoader is measured against, all with torchvision's training transforms.

1. :func:`imagefolder_loader`: what users have today, ``torchvision.datasets.ImageFolder``
   over the unpacked folder in a ``DataLoader``.
2. :func:`packed_pil_loader`: a ``DataLoader`` over the packed shards, decoding with PIL
   (:class:`PackedImageDataset`), which separates the format's gain from the decoder's.

Both produce what FastLoader produces: ``(images [B, 3, crop, crop] float32 normalized,
labels int64)``.
"""

from __future__ import annotations

import io
import os
from typing import Any, Callable

import torch

from ..errors import ConfigError, DependencyError

__all__ = [
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "train_transform",
    "PackedImageDataset",
    "imagefolder_loader",
    "packed_pil_loader",
]

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def _torchvision():
    try:
        import torchvision
        from torchvision import transforms
    except ImportError as e:
        raise DependencyError(f"the DataLoader baselines need torchvision ({e}); pip install torchvision") from None
    return torchvision, transforms


def train_transform(crop: int = 224) -> Callable[[Any], torch.Tensor]:
    """``RandomResizedCrop(crop)``, ``RandomHorizontalFlip()``, ``ToTensor()``, ``Normalize(ImageNet)``."""
    _, T = _torchvision()
    return T.Compose(
        [
            T.RandomResizedCrop(crop),
            T.RandomHorizontalFlip(),
            T.ToTensor(),
            T.Normalize(IMAGENET_MEAN, IMAGENET_STD),
        ]
    )


def _pil_open(data: bytes):
    from PIL import Image

    img = Image.open(io.BytesIO(data))
    return img.convert("RGB")


class PackedImageDataset(torch.utils.data.Dataset):
    """Map-style torch ``Dataset`` over a packed dataset, decoding each record with PIL.

    The :class:`fastload.Dataset` is opened lazily in each process (shards are
    memory-mapped per process), so the object pickles cheaply to spawned workers.

    Args:
        path: a directory written by ``fastload pack``.
        transform: applied to the decoded RGB ``PIL.Image`` (default: :func:`train_transform`).
    """

    def __init__(self, path: str | os.PathLike, transform: Callable[[Any], Any] | None = None) -> None:
        from ..reader import Dataset

        self.path = str(path)
        ds = Dataset(self.path)  # validate now, in the parent: a missing dataset fails here
        self._len = len(ds)
        self.classes = ds.classes
        self.targets = ds.labels.tolist()
        self.transform = transform
        self._ds: Any = None

    def __len__(self) -> int:
        return self._len

    def __getstate__(self) -> dict[str, Any]:
        d = dict(self.__dict__)
        d["_ds"] = None
        return d

    def __getitem__(self, index: int) -> tuple[Any, int]:
        if self._ds is None:
            from ..reader import Dataset

            self._ds = Dataset(self.path)
        data, label = self._ds[index]
        img = _pil_open(data)
        if self.transform is not None:
            img = self.transform(img)
        return img, int(label)


def _check_workers(num_workers: int) -> None:
    if not isinstance(num_workers, int) or isinstance(num_workers, bool) or num_workers < 0:
        raise ConfigError(f"num_workers must be an int >= 0, got {num_workers!r}")


def _dataloader(dataset: Any, batch_size: int, num_workers: int, device: str, seed: int) -> torch.utils.data.DataLoader:
    _check_workers(num_workers)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.utils.data.DataLoader(
        dataset,
        batch_size=batch_size,
        shuffle=True,
        drop_last=False,
        num_workers=num_workers,
        persistent_workers=num_workers > 0,
        pin_memory=str(device).startswith("cuda"),
        prefetch_factor=2 if num_workers > 0 else None,
        generator=g,
    )


def imagefolder_loader(
    src: str | os.PathLike, batch_size: int, *, num_workers: int, device: str = "cpu", crop: int = 224, seed: int = 0
) -> torch.utils.data.DataLoader:
    """torchvision ``ImageFolder(src)`` with :func:`train_transform` in a shuffling ``DataLoader``.

    Persistent workers, and pinned memory when ``device`` is CUDA.
    """
    return _dataloader(imagefolder_dataset(src, crop), batch_size, num_workers, device, seed)


def imagefolder_dataset(src: str | os.PathLike, crop: int = 224) -> Any:
    """torchvision ``ImageFolder(src)`` with :func:`train_transform`: what the baseline and the drop-in read."""
    tv, _ = _torchvision()
    if not os.path.isdir(src):
        raise ConfigError(f"images={str(src)!r}: not a directory; give the unpacked ImageFolder tree (--images SRC)")
    return tv.datasets.ImageFolder(str(src), transform=train_transform(crop))


def packed_pil_loader(
    path: str | os.PathLike, batch_size: int, *, num_workers: int, device: str = "cpu", crop: int = 224, seed: int = 0
) -> torch.utils.data.DataLoader:
    """:class:`PackedImageDataset` (PIL decoding of the packed shards) in a shuffling ``DataLoader``."""
    return _dataloader(PackedImageDataset(path, train_transform(crop)), batch_size, num_workers, device, seed)
