"""Careless and hostile input, round four (issue 38), class 6: leftovers and messages.

A ``.part`` download left by a reader killed with ``kill -9`` is deleted by the next reader of the
node cache (one still being written by a live reader is not); a prefix holding only its own folder
marker (``prefix/``, what the S3 console's "Create folder" makes) is an empty prefix to ``pack``;
an error line is at most 1,000 characters (`fastload.errors.MAX_MESSAGE`), the whole message in its
``details``. Against a real S3 server (SeaweedFS); the killed reader is a child process.
"""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import fastload
from fastload.errors import ConfigError, PackError

from conftest import paint_folder

obstore = pytest.importorskip("obstore")
ROOT = Path(__file__).resolve().parents[1]
#: The promise: an error line is "at most a few hundred characters".
LINE_LIMIT = 1000  # fastload.errors.MAX_MESSAGE, written out: the promise of docs/reliability.md

#: A reader whose download of ``what`` stalls after its first bytes (a network that stopped), then
#: is killed: its ``.part`` file and locks are real.
STALLED = """
import json, sys, time
import fastload
from fastload.remote import store
url, opts, cache, what = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3], sys.argv[4]
real = store.RemoteStore.download
def stalled(self, name, path, size, **kw):
    if name.startswith(what):
        with open(path, "r+b") as f:
            f.write(b"partial")
        print("stalled", flush=True)
        time.sleep(600)
    return real(self, name, path, size, **kw)
store.RemoteStore.download = stalled
ds = fastload.Dataset(url, storage_options=opts, cache_dir=cache)
ds[0]
"""


@pytest.fixture(scope="module")
def packed(s3, tmp_path_factory):
    images = paint_folder(tmp_path_factory.mktemp("images"), 2, 6, quality=None, digits=3)
    local = tmp_path_factory.mktemp("local") / "ds"
    fastload.pack(images, local, shard_size="4KB", workers=1, progress=False)
    bucket = s3.make_bucket()
    cache = tmp_path_factory.mktemp("packcache")
    os.environ["FASTLOAD_CACHE"] = str(cache)
    try:
        fastload.pack(images, f"s3://{bucket}/ds", shard_size="4KB", workers=1, storage_options=s3.options(), progress=False)
    finally:
        del os.environ["FASTLOAD_CACHE"]
    return {"url": f"s3://{bucket}/ds", "local": local, "images": images, "bucket": bucket}


def _stalled_reader(s3, packed, cache: Path, what: str) -> subprocess.Popen:
    """A child reading the dataset whose download of the first file named ``what...`` has stalled."""
    child = subprocess.Popen([sys.executable, "-c", STALLED, packed["url"], json.dumps(s3.options()), str(cache), what],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT,
                             env={**os.environ, "PYTHONPATH": str(ROOT)})  # fmt: skip
    line = child.stdout.readline()
    assert line == b"stalled\n", child.communicate(timeout=60)
    return child


def _parts(cache: Path) -> list[Path]:
    return sorted(cache.rglob("*.part-*"))


@pytest.mark.parametrize("what", ["shard-", "labels"])
def test_a_part_download_of_a_reader_killed_with_sigkill_is_reclaimed_by_the_next_reader(s3, packed, tmp_path, what):
    """Before: the ``.part`` (its full size reserved, counted against ``cache_limit``) stayed for ever."""
    cache = tmp_path / "cache"
    child = _stalled_reader(s3, packed, cache, what)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = _parts(cache)
    assert len(left) == 1 and left[0].name.startswith(what)
    ds = fastload.Dataset(packed["url"], storage_options=s3.options(), cache_dir=cache)
    local = fastload.Dataset(packed["local"])
    assert [ds[i] for i in range(len(ds))] == [local[i] for i in range(len(local))]
    assert _parts(cache) == []


def test_a_part_download_of_a_live_reader_is_left_alone(s3, packed, tmp_path):
    """A guard: the reclaim never takes a download that is still being written."""
    cache = tmp_path / "cache"
    child = _stalled_reader(s3, packed, cache, "shard-")
    try:
        (part,) = _parts(cache)
        ds = fastload.Dataset(packed["url"], storage_options=s3.options(), cache_dir=cache)
        ds[len(ds) - 1]  # another shard: its download makes room, and looks for leftovers
        assert _parts(cache) == [part] and part.read_bytes()[:7] == b"partial"
        assert child.poll() is None
    finally:
        child.kill()
        child.wait()


@pytest.fixture
def folder_marker(monkeypatch):
    """The listing S3 gives for a prefix made by the console's "Create folder": its own empty
    ``prefix/`` object, which the client (object_store) lists with the trailing ``/`` stripped.
    SeaweedFS keeps such a key as a directory and lists nothing, so the object is added here."""
    real = obstore.list

    def listing(store, prefix=None, **kw):
        if prefix:
            yield [{"path": prefix.rstrip("/"), "size": 0, "e_tag": '"d41d8cd98f00b204e9800998ecf8427e"', "last_modified": None, "version": None}]
        yield from real(store, prefix=prefix, **kw)

    monkeypatch.setattr(obstore, "list", listing)


def test_a_prefix_holding_only_its_folder_marker_is_packed_as_an_empty_one(s3, packed, tmp_path, monkeypatch, folder_marker):
    """Before: ``holds 1 object(s) but no fastload manifest (like '')``."""
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "c"))
    bucket = s3.make_bucket()
    obstore.put(s3.store(bucket), "folder/", b"")
    res = fastload.pack(packed["images"], f"s3://{bucket}/folder", shard_size="4KB", workers=1, storage_options=s3.options(), progress=False)
    assert res.num_samples == 12
    ds = fastload.Dataset(f"s3://{bucket}/folder", storage_options=s3.options(), cache_dir=tmp_path / "read")
    local = fastload.Dataset(packed["local"])
    assert [ds[i] for i in range(len(ds))] == [local[i] for i in range(len(local))]
    res = fastload.pack(packed["images"], f"s3://{bucket}/folder", shard_size="4KB", workers=1, storage_options=s3.options(),
                        progress=False, overwrite=True)  # fmt: skip
    assert res.num_samples == 12  # before: "holds 1 object(s) that are not part of its fastload dataset (like '')"


def test_a_prefix_holding_other_objects_is_still_refused(s3, packed, tmp_path, monkeypatch, folder_marker):
    """Only the prefix's own empty marker is overlooked: other objects still refuse (named, the marker not counted)."""
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "c"))
    bucket = s3.make_bucket()
    obstore.put(s3.store(bucket), "folder/notes.txt", b"mine")
    with pytest.raises(PackError, match=r"holds 1 object\(s\) but no fastload manifest \(like 'notes.txt'\)"):
        fastload.pack(packed["images"], f"s3://{bucket}/folder", workers=1, storage_options=s3.options(), progress=False)


def test_an_error_about_a_concatdataset_of_100_folders_is_one_short_line_with_the_whole_text_in_details(tmp_path):
    """Before: a line of 21,515 characters (every folder's path)."""
    tud = pytest.importorskip("torch.utils.data")
    tv = pytest.importorskip("torchvision")
    parts = [tv.datasets.ImageFolder(str(paint_folder(tmp_path / f"a_folder_with_a_long_name_{k:03d}", 1, 1, size=(16, 12))))
             for k in range(100)]  # fmt: skip
    parts[-1].transform = lambda x: x
    with pytest.raises(ConfigError) as e:
        fastload.FastLoader(tud.ConcatDataset(parts), batch_size=2, device="cpu")
    line, whole = str(e.value), e.value.details
    assert len(line) <= LINE_LIMIT and "\n" not in line
    assert all(f"a_folder_with_a_long_name_{k:03d})" in whole for k in range(100))
    assert ".datasets[99] <function" in whole and whole.endswith("give every part the same one")
    cut = len(whole) - len(line)
    assert line.startswith(whole[:200]) and line.endswith(whole[-150:]) and "characters cut" in line and cut > 20000
    assert pickle.loads(pickle.dumps(e.value)).details == whole  # the whole text crosses processes
    short = ConfigError("a short message")
    assert str(short) == short.details == "a short message"
