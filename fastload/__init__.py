"""fastload: keep the GPU fed.

Pack an image folder into LMDB shards once (:func:`pack`), then replace
``torch.utils.data.DataLoader`` with :class:`FastLoader`, which decodes and
augments JPEGs on the GPU through NVIDIA DALI and prefetches on a CUDA stream.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .errors import (
    BadImageError,
    ConfigError,
    CorruptDataError,
    DependencyError,
    FastloadError,
    FormatError,
    LoaderError,
    PackError,
)
from .reader import Dataset

__all__ = [
    "__version__",
    "Dataset",
    "FastloadError",
    "ConfigError",
    "DependencyError",
    "FormatError",
    "CorruptDataError",
    "PackError",
    "BadImageError",
    "LoaderError",
]
