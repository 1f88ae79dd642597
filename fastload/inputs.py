"""Where a FastLoader's images come from: a packed path, a Dataset, a loader's view or a torchvision dataset, with its
transform read into the loader's settings."""

from __future__ import annotations

import os
from typing import Any

import torch

from .arrays import packed_image
from .augment.settings import FIELDS, Augment
from .errors import ConfigError
from .multiview import MultiView
from .reader import Dataset
from .remote.url import is_url
from .views import LoaderDataset


class Source:
    """Where a loader's images come from: a packed path, a Dataset, a loader's view, a torchvision dataset."""

    def __init__(self, kind: str, obj: Any, settings: Augment | dict[str, Any] | None = None, transform: Any = None, target_transform: Any = None) -> None:
        self.kind, self.obj = kind, obj
        self.settings = settings or {}
        self.transform, self.target_transform = transform, target_transform
        self.image: tuple[int, int, int] | None = None  # (height, width, channels) of every image, where known

    def open(self, *, check: bool, cache_dir: Any, progress: bool, remote: dict | None = None) -> Dataset:
        if self.kind == "dataset":
            return self.obj
        if self.kind == "view":
            return self.obj.packed
        if self.kind == "torchvision":  # a fastload.datasets.DatasetPlan: packed once, read as torch reads it
            return self.obj.open(cache_dir=cache_dir, progress=progress, check=check)
        if is_url(self.obj):  # s3://... through the node cache
            return Dataset(self.obj, check=check, cache_dir=cache_dir, **(remote or {}))
        return Dataset(self.obj, check=check)


def is_torch_dataset(obj: Any) -> bool:
    """A torch dataset object (an ImageFolder, a Subset, a ConcatDataset...) for fastload.cache to plan."""
    return isinstance(obj, torch.utils.data.Dataset) or hasattr(obj, "samples")


def translated(transform: Any, image: tuple[int, int, int] | None = None) -> Augment | MultiView | None:
    """``transform`` (an Augment, a MultiView or a torchvision transform translated knowing ``image``, every image's
    size) as an Augment, or a MultiView for a multi-view transform (or a list of one transform per view); None stays None."""
    if transform is None or isinstance(transform, (Augment, MultiView)):
        return transform
    from .transforms import translate

    return translate(transform, image=image)


def remote_options(dataset: Any, **options: Any) -> dict[str, Any]:
    """FastLoader's settings for a dataset URL (``s3://...``): refused for anything else."""
    if not is_url(dataset) and any(v is not None for v in options.values()):
        raise ConfigError(f"{', '.join(k for k, v in options.items() if v is not None)}: only for a dataset URL (s3://...)")
    return options


def resolve_source(dataset: Any, transform: Any) -> Source:
    if isinstance(dataset, (str, os.PathLike, Dataset)):
        image = packed_image(dataset) if transform is not None and not isinstance(transform, Augment) else None
        kind = "dataset" if isinstance(dataset, Dataset) else "path"
        source = Source(kind, dataset, translated(transform, image), transform)
        source.image = image
        return source
    if isinstance(dataset, LoaderDataset):
        if transform is not None:
            return Source("view", dataset, translated(transform), transform, dataset.target_transform)
        settings = {k: v for k, v in dataset.settings.items() if k in FIELDS}  # the view also holds the seed
        if "views" in dataset.settings:  # a multi-view loader's: its transform read again, every view
            settings = translated(dataset.transform)
        return Source("view", dataset, settings, dataset.transform, dataset.target_transform)
    if is_torch_dataset(dataset):
        from .datasets import plan_dataset

        plan = plan_dataset(dataset)  # ConfigError naming what cannot be reproduced, before any work
        if transform is None:
            transform = plan.transform  # None: FastLoader's defaults
        source = Source("torchvision", plan, translated(transform, plan.image), transform, plan.target_transform)
        source.image = plan.image
        return source
    raise ConfigError(
        f"dataset must be a packed dataset directory, a fastload.Dataset, a torchvision ImageFolder/DatasetFolder "
        f"of image files (or a Subset/ConcatDataset of them), got {type(dataset).__name__}; pack other datasets "
        "once with fastload.pack_dataset(dataset, OUT) and pass OUT"
    )


def origin(source: Source) -> Any:
    """What ``loader.dataset`` shows as ``root``/``samples``/``classes``: the user's torch dataset's own."""
    plan = source.obj if source.kind == "torchvision" else None
    return plan if plan is not None and plan.samples is not None else None
