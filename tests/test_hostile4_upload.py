"""Careless and hostile input, round four (issue 38), class 1: a pack to an object store never publishes another's data.

The staging area of an upload is keyed by the source, and one writer per URL holds a lock: a
``--resume`` of another source after a pack was killed mid-upload packs and uploads its own
source (never the first's staging copy), and a pack started while another uploads the same prefix
is refused in one line naming that writer, touching neither its staging copy nor the prefix.
Against a real S3 server (SeaweedFS), the first pack in a child process that is slowed by a proxy
(and, in one case, killed with SIGKILL mid-upload).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import fastload
from fastload.errors import ConfigError

from conftest import paint_folder
from s3server import Proxy

obstore = pytest.importorskip("obstore")
ROOT = Path(__file__).resolve().parents[1]
CHILD = """
import json, sys
import fastload
src, url, opts = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
r = fastload.pack(src, url, shard_size="4KB", workers=1, storage_options=opts, progress=False)
print(r.num_samples)
"""


def _objects(s3, bucket: str, prefix: str) -> dict[str, bytes]:
    st = s3.store(bucket)
    out = {}
    for chunk in obstore.list(st, prefix=f"{prefix}/"):
        for o in chunk:
            out[o["path"][len(prefix) + 1 :]] = bytes(obstore.get(st, o["path"]).bytes())
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}


def _start(src: Path, url: str, opts: dict, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "FASTLOAD_CACHE": str(cache), "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-c", CHILD, str(src), url, json.dumps(opts)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT)  # fmt: skip


def _wait_uploading(proc: subprocess.Popen, cache: Path, s3, bucket: str, prefix: str, timeout: float = 60.0) -> None:
    """Until the child's staging copy is finished and at least one object reached the prefix."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        if list((cache / "staging").rglob("dataset/manifest.json")) and _objects(s3, bucket, prefix):
            return
        time.sleep(0.05)
    raise AssertionError("the first pack never started its upload")


@pytest.fixture
def sources(tmp_path):
    a = paint_folder(tmp_path / "a", classes=2, per_class=6, size=(60, 40), quality=None, digits=3)
    b = paint_folder(tmp_path / "b", classes=3, per_class=2, size=(50, 44), quality=None, digits=3)
    return a, b


@pytest.mark.parametrize("resume", [pytest.param(True, marks=pytest.mark.slow), False], ids=["resume", "fresh"])  # 7 s each
def test_a_pack_while_another_uploads_the_prefix_is_refused_naming_it(s3, sources, tmp_path, monkeypatch, resume):
    """Bug (before): B's ``--resume`` uploaded A's staging copy and deleted it, and A then failed."""
    a, b = sources
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/ds"
    cache = tmp_path / "cache"
    monkeypatch.setenv("FASTLOAD_CACHE", str(cache))
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.4)  # each request of A's slow: its upload lasts seconds
    try:
        child = _start(a, url, s3.options(proxy.endpoint), cache)
        try:
            _wait_uploading(child, cache, s3, bucket, "ds")
            staged = _files(cache / "staging")
            with pytest.raises(ConfigError) as e:
                fastload.pack(b, url, shard_size="4KB", workers=1, storage_options=s3.options(), progress=False, resume=resume)
            msg = str(e.value)
            assert "\n" not in msg and len(msg) < 600
            assert "another pack is uploading" in msg and f"process {child.pid}" in msg and str(a) in msg
            assert _files(cache / "staging") == staged  # A's staging copy untouched
            out, err = child.communicate(timeout=120)
        finally:
            if child.poll() is None:
                child.kill()
                child.wait()
    finally:
        proxy.close()
    assert child.returncode == 0, err.decode()[-2000:]
    assert int(out.decode().split()[-1]) == 12
    ds = fastload.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "read")
    assert len(ds) == 12 and ds.classes == ["class_0", "class_1"]  # A's dataset, whole


def test_a_resume_of_another_source_after_a_killed_upload_publishes_its_own_source(s3, sources, tmp_path, monkeypatch):
    """Bug (before): ``pack B URL --resume`` after A's pack was killed mid-upload uploaded A's staging copy."""
    a, b = sources
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/ds"
    cache = tmp_path / "cache"
    monkeypatch.setenv("FASTLOAD_CACHE", str(cache))
    proxy = Proxy("127.0.0.1", s3.ports["s3"], delay=0.4)
    try:
        child = _start(a, url, s3.options(proxy.endpoint), cache)
        try:
            _wait_uploading(child, cache, s3, bucket, "ds")
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
    finally:
        proxy.close()
    assert "manifest.json" not in _objects(s3, bucket, "ds")  # cut mid-upload
    staged = _files(cache / "staging")
    res = fastload.pack(b, url, shard_size="4KB", workers=1, storage_options=s3.options(), progress=False, resume=True)
    assert res.num_samples == 6
    ds = fastload.Dataset(url, storage_options=s3.options(), cache_dir=tmp_path / "read")
    assert len(ds) == 6 and ds.classes == ["class_0", "class_1", "class_2"]
    m = json.loads(_objects(s3, bucket, "ds")["manifest.json"])
    listed = {s["file"] for s in m["shards"]} | {"labels.bin", "manifest.json"}
    assert set(_objects(s3, bucket, "ds")) == listed  # A's leftover shards gone from the prefix
    assert {k: v for k, v in _files(cache / "staging").items() if not k.endswith(".lock")} == {
        k: v for k, v in staged.items() if not k.endswith(".lock")}  # A's staging copy untouched
