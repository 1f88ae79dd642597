"""The loaders a benchmark compares: named loader factories and the default line-up.

Loaders are passed as named factories (``{"name", "kind", "make", "params"}``, see
:func:`loader_spec`), so the runner knows nothing of how any loader is built; the
default set (:func:`default_loaders`) is the torchvision ``ImageFolder`` baseline with
``num_workers`` swept, a ``DataLoader`` over the packed shards decoding with PIL, and
FastLoader on the chosen device.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Iterable

from ..errors import ConfigError
from .config import BenchConfig

__all__ = ["KINDS", "loader_spec", "check_spec", "resolve_images", "default_loaders"]

KINDS = ("DataLoader", "FastLoader")


def loader_spec(name: str, kind: str, make: Callable[[], Iterable[Any]], **params: Any) -> dict[str, Any]:
    """A named loader factory: ``make()`` returns a fresh loader yielding ``(images, labels)``.

    ``kind`` is ``"DataLoader"`` (a baseline) or ``"FastLoader"``; ``params`` are recorded
    in the report (``num_workers``, ``source``, ``device``...).
    """
    if not isinstance(name, str) or not name:
        raise ConfigError(f"loader name must be a non-empty string, got {name!r}")
    if kind not in KINDS:
        raise ConfigError(f"loader kind must be one of {KINDS}, got {kind!r} (loader {name!r})")
    if not callable(make):
        raise ConfigError(f"loader {name!r}: make must be a callable returning a loader, got {type(make).__name__}")
    return {"name": name, "kind": kind, "make": make, "params": dict(params)}


def check_spec(spec: Any) -> dict[str, Any]:
    """``spec`` as :func:`loader_spec` returns it, checked (a user's own dict, for example)."""
    if not isinstance(spec, dict) or not {"name", "kind", "make"} <= set(spec):
        raise ConfigError(f"a loader must be a dict with name, kind and make (see loader_spec), got {spec!r}")
    return loader_spec(spec["name"], spec["kind"], spec["make"], **dict(spec.get("params") or {}))


# ----------------------------------------------------------------------------- images


_SOURCE_KEYS = ("source", "src", "source_path", "source_dir", "root", "images")


def resolve_images(dataset_path: str | os.PathLike, images: str | os.PathLike | None) -> tuple[str | None, str]:
    """The ImageFolder tree for the baseline: ``images`` if given, else the one the manifest records.

    Returns ``(path or None, note)``; the note says where the path came from or why the
    ImageFolder baseline is skipped.

    Raises:
        ConfigError: ``images`` was given but is not a directory.
    """
    if images is not None:
        if not os.path.isdir(images):
            raise ConfigError(f"--images {str(images)!r}: not a directory; give the unpacked ImageFolder tree")
        return str(images), f"ImageFolder baseline over {images}"
    from ..reader import read_manifest

    options = read_manifest(dataset_path).options or {}
    for k in _SOURCE_KEYS:
        v = options.get(k)
        if isinstance(v, str) and v:
            if os.path.isdir(v):
                return v, f"ImageFolder baseline over {v} (the source recorded in the manifest)"
            return None, (
                f"ImageFolder baseline skipped: the source recorded in the manifest ({v}) is not a directory "
                "here; pass --images SRC"
            )
    return None, "ImageFolder baseline skipped: no --images given and the manifest records no source folder"


# ----------------------------------------------------------------------------- loaders


def default_loaders(
    dataset: str | os.PathLike, images: str | None, cfg: BenchConfig, *, cache_dir: str | os.PathLike | None = None
) -> list[dict[str, Any]]:
    """ImageFolder DataLoaders (one per ``cfg.workers``), packed+PIL DataLoader, FastLoader; with
    ``images`` and ``cache_dir`` also the drop-in ``FastLoader(ImageFolder(images, transform))``."""
    from . import baselines

    specs: list[dict[str, Any]] = []
    bs, dev, crop, seed = cfg.batch_size, cfg.device, cfg.crop, cfg.seed
    assert cfg.workers  # validated
    if images is not None:
        for w in cfg.workers:
            specs.append(
                loader_spec(
                    f"DataLoader(ImageFolder, workers={w})",
                    "DataLoader",
                    lambda w=w: baselines.imagefolder_loader(images, bs, num_workers=w, device=dev, crop=crop, seed=seed),
                    source="imagefolder",
                    num_workers=w,
                    pin_memory=dev.startswith("cuda"),
                    persistent_workers=w > 0,
                )
            )
    w = max(cfg.workers)
    specs.append(
        loader_spec(
            f"DataLoader(packed+PIL, workers={w})",
            "DataLoader",
            lambda: baselines.packed_pil_loader(dataset, bs, num_workers=w, device=dev, crop=crop, seed=seed),
            source="packed-pil",
            num_workers=w,
            pin_memory=dev.startswith("cuda"),
            persistent_workers=w > 0,
        )
    )

    def make_fastloader() -> Iterable[Any]:
        from ..loader import FastLoader  # imported lazily: DALI is heavy

        return FastLoader(
            dataset, bs, shuffle=True, drop_last=False, train=True, crop=crop, device=dev, seed=seed
        )

    specs.append(loader_spec(f"FastLoader({dev})", "FastLoader", make_fastloader, source="fastload", device=dev))

    if images is not None and cache_dir is not None:

        def make_dropin() -> Iterable[Any]:
            from ..loader import FastLoader

            folder = baselines.imagefolder_dataset(images, crop)
            return FastLoader(folder, bs, shuffle=True, device=dev, seed=seed, cache_dir=cache_dir, progress=False)

        specs.append(
            loader_spec(f"FastLoader(ImageFolder, {dev})", "FastLoader", make_dropin, source="fastload-dropin", device=dev)
        )
    return specs
