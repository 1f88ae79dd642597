"""fastload: keep the GPU fed.

Pack an image folder into LMDB shards once (:func:`pack`), then replace
``torch.utils.data.DataLoader`` with :class:`FastLoader`, which decodes and
augments JPEGs on the GPU through NVIDIA DALI and prefetches on a CUDA stream.
"""

from __future__ import annotations

from .version import __version__

from .errors import (
    BadImageError,
    ConfigError,
    CorruptDataError,
    DependencyError,
    FastloadError,
    FormatError,
    LoaderError,
    RemoteError,
    PackError,
)
from .profile import profile
from .checks import inspect, verify
from .reader import Dataset
from .sample import make_sample
from .packing import PackResult, pack, pack_coco, pack_dataset, pack_parquet, pack_ray, pack_spark, pack_webdataset
from .fields import Field, Schema

# FastLoader and Augment import torch (FastLoader DALI too): load it on first use so that `fastload pack`
# and `import fastload` stay light and work where DALI is not installed.
_LAZY = {"FastLoader": "loader", "DetectionLoader": "detection", "TransformsCollate": "annotated", "AnnotatedLoader": "pairloader", "FieldBatch": "fieldbatch", "Augment": "augment.settings", "IMAGENET_MEAN": "augment.settings", "IMAGENET_STD": "augment.settings"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'fastload' has no attribute {name!r}")

__all__ = [
    "__version__",
    "Dataset",
    "pack",
    "pack_dataset",
    "pack_webdataset",
    "pack_parquet",
    "pack_coco",
    "pack_ray",
    "pack_spark",
    "Field",
    "Schema",
    "FieldBatch",
    "DetectionLoader",
    "AnnotatedLoader",
    "TransformsCollate",
    "PackResult",
    "inspect",
    "verify",
    "make_sample",
    "profile",
    "FastLoader",
    "Augment",
    "IMAGENET_MEAN",
    "IMAGENET_STD",
    "FastloadError",
    "ConfigError",
    "DependencyError",
    "FormatError",
    "CorruptDataError",
    "PackError",
    "BadImageError",
    "LoaderError",
    "RemoteError",
]
