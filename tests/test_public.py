"""The public surface: ``fastload.__all__`` is exactly what the package documents, and every name resolves."""

from __future__ import annotations

import subprocess
import sys

import fastload

#: What the README and the docs promise ``import fastload`` gives (written out, not read from the package).
DOCUMENTED = {
    "__version__", "Dataset", "pack", "pack_dataset", "PackResult", "inspect", "verify", "make_sample", "profile",
    "FastLoader", "Augment", "IMAGENET_MEAN", "IMAGENET_STD",
    "pack_webdataset", "pack_parquet", "pack_coco", "pack_ray", "pack_spark", "DetectionLoader", "Field", "Schema", "FieldBatch",
    "AnnotatedLoader", "TransformsCollate",
    "FastloadError", "ConfigError", "DependencyError", "FormatError", "CorruptDataError", "PackError",
    "BadImageError", "LoaderError", "RemoteError",
}  # fmt: skip


def test_all_is_what_is_documented():
    assert len(fastload.__all__) == len(set(fastload.__all__)), "a name listed twice"
    assert set(fastload.__all__) == DOCUMENTED


def test_every_name_in_all_resolves_and_star_import_gives_them():
    for name in fastload.__all__:
        assert getattr(fastload, name) is not None, name
    ns: dict = {}
    exec("from fastload import *", ns)  # noqa: S102 - what a user's star import gets
    assert DOCUMENTED - {"__version__"} <= set(ns)


def test_errors_are_one_hierarchy():
    errors = [getattr(fastload, n) for n in DOCUMENTED if n.endswith("Error")]
    assert all(issubclass(e, fastload.FastloadError) for e in errors)
    assert issubclass(fastload.ConfigError, ValueError) and issubclass(fastload.DependencyError, ImportError)


def test_import_fastload_stays_light():
    """``import fastload`` (and ``fastload pack``) never import torch or DALI; FastLoader and Augment load them."""
    code = (
        "import sys, fastload\n"
        "heavy = [m for m in ('torch', 'nvidia.dali') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "fastload.Augment(crop=32)\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_augment_is_the_settings_object_of_the_loader_and_the_translator():
    from fastload.augment.settings import Augment
    from fastload.transforms import translate

    assert fastload.Augment is Augment
    import torchvision.transforms as T

    got = translate(T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()]))
    assert isinstance(got, Augment) and (got.train, got.crop, got.resize, got.mean) == (False, 32, 40, None)
