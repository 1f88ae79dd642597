"""Careless and hostile input, round four (issue 38), class 4: the node cache of a dataset in an object store.

A manifest's sizes and types are checked before anything is reserved or fetched, and a
``cache_dir`` that cannot be used (a file, under ``/proc``, a disk without room for what is
claimed) is one :class:`~fastload.FastloadError` naming the path: on the old code each of these
was a raw ``OSError``, ``ValueError`` or ``TypeError`` (and, in a loader, a dying thread).
Against a real S3 server (SeaweedFS), as ``tests/test_remote.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import fastload
from fastload.errors import ConfigError, FastloadError, FormatError

from conftest import paint_folder

obstore = pytest.importorskip("obstore")


@pytest.fixture(scope="module")
def packed(s3, tmp_path_factory):
    """A small dataset packed to a fresh bucket; its manifest as a dict."""
    images = paint_folder(tmp_path_factory.mktemp("images"), 2, 3, quality=None, digits=3)
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/train"
    cache = tmp_path_factory.mktemp("packcache")
    os.environ["FASTLOAD_CACHE"] = str(cache)
    try:
        fastload.pack(images, url, shard_size="4KB", storage_options=s3.options(), progress=False)
    finally:
        del os.environ["FASTLOAD_CACHE"]
    manifest = json.loads(bytes(obstore.get(s3.store(bucket), "train/manifest.json").bytes()))
    return {"bucket": bucket, "manifest": manifest}


def _with_manifest(s3, packed, change) -> str:
    """A copy of the packed dataset under a new prefix whose manifest ``change`` altered; its URL."""
    import uuid

    st = s3.store(packed["bucket"])
    prefix = f"m{uuid.uuid4().hex[:8]}"
    m = json.loads(json.dumps(packed["manifest"]))
    change(m)
    for chunk in obstore.list(st, prefix="train/"):
        for o in chunk:
            name = o["path"][len("train/") :]
            if name != "manifest.json":
                obstore.put(st, f"{prefix}/{name}", bytes(obstore.get(st, o["path"]).bytes()))
    obstore.put(st, f"{prefix}/manifest.json", json.dumps(m).encode())
    return f"s3://{packed['bucket']}/{prefix}"


def _labels(value):
    return lambda m: m["labels"].__setitem__("bytes", value)


def _shard0(value):
    return lambda m: m["shards"][0].__setitem__("bytes", value)


@pytest.mark.parametrize(
    "change, error, says",
    [
        (_labels("lots"), FormatError, "'labels' claims 'lots' bytes"),
        (_labels(None), FormatError, "'labels' claims None bytes"),
        (_labels(True), FormatError, "'labels' claims True bytes"),
        (_labels(2.5), FormatError, "'labels' claims 2.5 bytes"),
        (lambda m: m["labels"].__setitem__("sha256", None), FormatError, "sha256 None, not 64 hex digits"),
        (_labels(10**15), ConfigError, "bytes are needed, the disk has"),
        (_shard0(10**15), ConfigError, "bytes are needed, the disk has"),
    ],
    ids=["labels-lots", "labels-null", "labels-bool", "labels-float", "sha-null", "labels-1PB", "shard-1PB"],
)
def test_a_manifest_claiming_bad_sizes_is_one_fastload_error(s3, packed, tmp_path, change, error, says):
    url = _with_manifest(s3, packed, change)
    with pytest.raises(FastloadError) as e:
        ds = fastload.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "cache")
        for i in range(len(ds)):
            ds[i]
    assert type(e.value) is error and says in str(e.value), repr(e.value)
    assert "\n" not in str(e.value) and len(str(e.value)) < 400
    assert not list((tmp_path / "cache").rglob("*.part-*"))  # a refused reservation leaves nothing


def _a_file(tmp_path: Path) -> Path:
    (tmp_path / "f").write_text("not a directory")
    return tmp_path / "f"


def _remote_a_file(tmp_path: Path) -> Path:
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "remote").write_text("not a directory")
    return tmp_path / "c"


@pytest.mark.parametrize(
    "cache_dir",
    [_a_file, _remote_a_file, lambda tmp_path: Path("/proc/fastload-cache"), lambda tmp_path: Path("/proc/self/status")],
    ids=["a-file", "remote-a-file", "under-proc", "proc-file"],
)
def test_a_cache_dir_that_cannot_be_used_is_a_config_error_naming_it(s3, packed, tmp_path, cache_dir):
    cache = cache_dir(tmp_path)
    with pytest.raises(ConfigError) as e:
        fastload.Dataset(f"s3://{packed['bucket']}/train", storage_options=s3.options(), cache_dir=cache)
    msg = str(e.value)
    assert msg.startswith("cache_dir: cannot use ") and str(cache) in msg and "$FASTLOAD_CACHE" in msg, msg
