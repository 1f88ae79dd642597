"""Datasets in an object store, against a real S3 server (SeaweedFS ``weed mini``): pack to, inspect
and verify ``s3://``, read through the node cache, and the errors that name the URL.

Images are solid colours whose pixels encode (label, index) (``conftest.encode_color``), so every
record read back is checked against its pixels, a second way from the reader's own bookkeeping.
"""

from __future__ import annotations

import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import fastload
from fastload.cli import main
from fastload.errors import ConfigError, CorruptDataError, FormatError, PackError, RemoteError
from fastload.remote import is_url, parse_url

from conftest import decode_color, paint_folder
from s3server import ACCESS_KEY, SECRET_KEY, Proxy, SeaweedServer

obstore = pytest.importorskip("obstore")

N_CLASSES, PER_CLASS = 3, 8  # 24 images, one per 4 KB shard: 24 shards


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return paint_folder(tmp_path_factory.mktemp("images"), N_CLASSES, PER_CLASS, quality=None, digits=3)


@pytest.fixture(autouse=True)
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "cache"))


def names(server: SeaweedServer, bucket: str, prefix: str) -> dict[str, int]:
    st = server.store(bucket)
    out = {}
    for chunk in obstore.list(st, prefix=prefix):
        for m in chunk:
            out[m["path"][len(prefix) + 1 :]] = int(m["size"])
    return out


def pixels_of(payload: bytes) -> tuple[int, int]:
    return decode_color(np.asarray(Image.open(io.BytesIO(payload)).convert("RGB"), dtype=np.float64).mean(axis=(0, 1)))


@pytest.fixture(scope="module")
def packed(s3, images, tmp_path_factory):
    """The images packed to s3://BUCKET/train (one image per shard) and, the same way, locally."""
    cache = tmp_path_factory.mktemp("packcache")
    os.environ["FASTLOAD_CACHE"] = str(cache)
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/train"
    res = fastload.pack(images, url, shard_size="4KB", storage_options=s3.options(), progress=False)
    local = tmp_path_factory.mktemp("local") / "train"
    fastload.pack(images, local, shard_size="4KB", progress=False)
    del os.environ["FASTLOAD_CACHE"]
    return {"url": url, "bucket": bucket, "local": local, "result": res, "cache": cache}


# ------------------------------------------------------------------ URLs
def test_any_string_with_a_scheme_is_a_url_never_a_local_path(tmp_path, images, monkeypatch):
    assert is_url("s3://b/p") and is_url("gs://b") and is_url("https://host/x") and is_url("foo://x")
    assert is_url("s3:/b/p") and is_url("S3:b") and is_url("gs:/b")  # a store's scheme, slashes mistyped: refused, never a folder
    assert not is_url("data/s3") and not is_url(tmp_path) and not is_url("C:\\x") and not is_url("C:/x") and not is_url("s3")
    u = parse_url("s3://bucket/a/b/")
    assert (u.kind, u.bucket, u.prefix, u.key("manifest.json")) == ("s3", "bucket", "a/b", "a/b/manifest.json")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match="foo://bucket/x.*scheme 'foo' is not supported"):
        fastload.pack(images, "foo://bucket/x", progress=False)
    with pytest.raises(ConfigError, match="no bucket"):
        fastload.Dataset("s3:///x")
    with pytest.raises(ConfigError, match=r"s3:/bucket/x: not a URL: write s3://bucket/prefix \(two slashes\)"):
        fastload.pack(images, "s3:/bucket/x", progress=False)
    assert main(["pack", str(images), "gs:bucket"]) == 2
    assert not any(tmp_path.iterdir())  # nothing written locally (the old code made a folder "foo:", then "s3:")


# ------------------------------------------------------------------ pack to a bucket, read back
def test_pack_uploads_every_file_and_the_records_come_back_with_their_pixels(s3, packed):
    m = json.loads((packed["local"] / "manifest.json").read_text())
    stored = names(s3, packed["bucket"], "train")
    expected = {s["file"]: s["bytes"] for s in m["shards"]}
    expected["labels.bin"] = 4 * N_CLASSES * PER_CLASS
    assert {k: v for k, v in stored.items() if k != "manifest.json"} == expected
    assert packed["result"].url == packed["url"] and str(packed["url"]) in packed["result"].summary()
    ds = fastload.Dataset(packed["url"], storage_options=s3.options())
    assert len(ds) == N_CLASSES * PER_CLASS and ds.url == packed["url"] and ds.classes == m["classes"]
    for i in range(len(ds)):
        payload, label = ds[i]
        assert pixels_of(payload) == (label, i)  # the pixels say which image it is
    local = fastload.Dataset(packed["local"])
    assert [ds[i] for i in range(len(ds))] == [local[i] for i in range(len(local))]
    assert not list((packed["cache"] / "staging").glob("*/dataset*"))  # the staging copy was deleted


def test_the_manifest_is_the_last_object_uploaded(s3, images, tmp_path):
    proxy = Proxy("127.0.0.1", s3.ports["s3"])
    try:
        bucket = s3.make_bucket()
        fastload.pack(images, f"s3://{bucket}/p", shard_size="4KB", storage_options=s3.options(proxy.endpoint), progress=False)
    finally:
        proxy.close()
    puts = [r.split(" ")[1].rsplit("/", 1)[-1] for r in proxy.requests if r.startswith("PUT ")]
    assert puts[-1] == "manifest.json" and puts.count("manifest.json") == 1
    assert puts[-2] == "labels.bin" and len(puts) == N_CLASSES * PER_CLASS + 2  # shards, labels, manifest


def test_resume_sends_only_what_is_missing_or_altered(s3, images):
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/r"
    fastload.pack(images, url, shard_size="4KB", storage_options=s3.options(), progress=False)
    st = s3.store(bucket)
    have = names(s3, bucket, "r")
    shards = sorted(n for n in have if n.startswith("shard-"))
    # an upload cut before its end: no manifest, two shards missing, one with other bytes of its size
    obstore.delete(st, ["r/manifest.json", f"r/{shards[3]}", f"r/{shards[7]}"])
    obstore.put(st, f"r/{shards[5]}", os.urandom(have[shards[5]]))
    with pytest.raises(PackError, match=r"no fastload manifest.*--resume"):
        fastload.pack(images, url, shard_size="4KB", storage_options=s3.options(), progress=False)
    proxy = Proxy("127.0.0.1", s3.ports["s3"])
    try:
        fastload.pack(images, url, shard_size="4KB", resume=True, storage_options=s3.options(proxy.endpoint), progress=False)
    finally:
        proxy.close()
    puts = sorted(r.split(" ")[1].rsplit("/", 1)[-1] for r in proxy.requests if r.startswith("PUT "))
    assert puts == sorted([shards[3], shards[5], shards[7], "manifest.json"])
    ds = fastload.Dataset(url, storage_options=s3.options())
    assert [pixels_of(ds[i][0]) for i in range(len(ds))] == [(int(ds.labels[i]), i) for i in range(len(ds))]


def test_overwrite_replaces_a_fastload_dataset_and_nothing_else(s3, images, make_folder):
    bucket = s3.make_bucket()
    st = s3.store(bucket)
    obstore.put(st, "mine/notes.txt", b"keep me")
    with pytest.raises(PackError, match=r"s3://.*/mine: holds 1 object\(s\) but no fastload manifest.*nothing was deleted"):
        fastload.pack(images, f"s3://{bucket}/mine", overwrite=True, storage_options=s3.options(), progress=False)
    assert bytes(obstore.get(st, "mine/notes.txt").bytes()) == b"keep me"
    url = f"s3://{bucket}/ds"
    fastload.pack(images, url, shard_size="4KB", storage_options=s3.options(), progress=False)
    with pytest.raises(PackError, match="a fastload dataset is already there.*--overwrite"):
        fastload.pack(images, url, shard_size="4KB", storage_options=s3.options(), progress=False)
    small = make_folder(classes=2, per_class=2)  # 4 images: the 20 shards above them must go
    fastload.pack(small, url, shard_size="4KB", overwrite=True, storage_options=s3.options(), progress=False)
    left = names(s3, bucket, "ds")
    assert sorted(left) == sorted(["manifest.json", "labels.bin"] + [f"shard-{k:05d}.lmdb" for k in range(4)])
    ds = fastload.Dataset(url, storage_options=s3.options())
    assert len(ds) == 4 and [pixels_of(ds[i][0]) for i in range(4)] == [(0, 0), (0, 1), (1, 2), (1, 3)]
    obstore.put(st, "ds/other.bin", b"x")  # a foreign object beside the dataset: refused, nothing deleted
    with pytest.raises(PackError, match="not part of its fastload dataset.*'other.bin'.*nothing was deleted"):
        fastload.pack(images, url, shard_size="4KB", overwrite=True, storage_options=s3.options(), progress=False)
    assert len(names(s3, bucket, "ds")) == 7


# ------------------------------------------------------------------ errors that name the URL
def test_a_prefix_without_a_manifest_and_a_missing_bucket_name_the_url(s3):
    bucket = s3.make_bucket()
    with pytest.raises(FormatError, match=rf"s3://{bucket}/nothing: no fastload dataset there"):
        fastload.Dataset(f"s3://{bucket}/nothing", storage_options=s3.options())
    with pytest.raises((FormatError, RemoteError), match=r"s3://no-such-bucket-x/p"):
        fastload.Dataset("s3://no-such-bucket-x/p", storage_options=s3.options(), retry_deadline=5)


def test_an_object_overwritten_with_other_bytes_of_its_size_is_caught_and_never_served(s3, images, tmp_path):
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/t"
    fastload.pack(images, url, shard_size="4KB", storage_options=s3.options(), progress=False)
    st = s3.store(bucket)
    key = "t/shard-00002.lmdb"
    good = bytes(obstore.get(st, key).bytes())
    bad = bytearray(good)
    bad[len(bad) // 2] ^= 0xFF  # one byte of the image's payload region flipped: same size
    obstore.put(st, key, bytes(bad))
    proxy = Proxy("127.0.0.1", s3.ports["s3"])
    try:
        ds = fastload.Dataset(url, storage_options=s3.options(proxy.endpoint), cache_dir=tmp_path / "c")
        assert pixels_of(ds[0][0]) == (0, 0)
        with pytest.raises(CorruptDataError, match=rf"{url}/shard-00002.lmdb: shard 2: SHA-256 .* differs from the manifest, twice"):
            ds[2]
        with pytest.raises(CorruptDataError, match="shard-00002"):  # remembered: not fetched a third time
            ds[2]
    finally:
        proxy.close()
    gets = [r for r in proxy.requests if r.startswith("GET ") and r.endswith("shard-00002.lmdb")]
    assert len(gets) == 2  # fetched again once
    assert not (ds.path / "shard-00002.lmdb").exists() and not list(ds.path.glob("shard-00002*"))
    assert pixels_of(ds[3][0]) == (0, 3)  # the other shards are still served


def test_cli_pack_inspect_verify_a_bucket(s3, images, monkeypatch, capsys):
    from fastload.cli import main

    monkeypatch.setenv("AWS_ENDPOINT_URL", s3.endpoint)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_REGION", "us-east-1")
    bucket = s3.make_bucket()
    url = f"s3://{bucket}/cli"
    assert main(["pack", str(images), url, "--shard-size", "4KB", "--no-progress"]) == 0
    assert f"-> {url}" in capsys.readouterr().out
    assert main(["inspect", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["samples"] == N_CLASSES * PER_CLASS and info["path"] == url
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {url}: {N_CLASSES * PER_CLASS} shards")
    st = s3.store(bucket)
    good = bytes(obstore.get(st, "cli/shard-00004.lmdb").bytes())
    obstore.put(st, "cli/shard-00004.lmdb", good[:-5] + b"XXXXX")
    assert main(["verify", url]) == 1
    err = capsys.readouterr().err
    assert f"{url}/shard-00004.lmdb" in err and "SHA-256" in err
    assert main(["inspect", f"s3://{bucket}/none"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"s3://{bucket}/none: no fastload dataset there" in err[0]


def test_remote_options_are_checked_up_front(tmp_path, packed, s3):
    with pytest.raises(ConfigError, match="cache_limit must be bytes or a size like '50GB'.*'lots'"):
        fastload.Dataset(packed["url"], cache_limit="lots", storage_options=s3.options())
    with pytest.raises(ConfigError, match="retry_deadline must be a number of seconds.*-1"):
        fastload.Dataset(packed["url"], retry_deadline=-1, storage_options=s3.options())
    with pytest.raises(ConfigError, match="cache_limit: only for a dataset URL"):
        fastload.Dataset(packed["local"], cache_limit="1GB")
    with pytest.raises(ConfigError, match="storage_options must be a dict"):
        fastload.Dataset(packed["url"], storage_options="endpoint")


def test_wrong_credentials_and_access_denied_are_errors_at_once(tmp_path, images):
    """A server with identities (SeaweedFS ``-s3.config``): a wrong secret and a read-only identity
    writing are RemoteErrors naming the URL, without the retries a dead server gets."""
    server = SeaweedServer(tmp_path / "weed")
    server.start()
    try:
        bucket = server.make_bucket()
        url = f"s3://{bucket}/d"
        fastload.pack(images, url, shard_size="4KB", storage_options=server.options(), progress=False)
    finally:
        server.stop()
    server.identities = [
        {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List"]},
        {"name": "reader", "credentials": [{"accessKey": "reader", "secretKey": "reader-secret"}], "actions": ["Read", "List"]},
    ]  # fmt: skip
    server.start()
    try:
        ds = fastload.Dataset(url, storage_options=server.options(), retry_deadline=60)
        assert len(ds) == N_CLASSES * PER_CLASS
        wrong = dict(server.options(), secret_access_key="not-the-secret")
        t0 = time.monotonic()
        with pytest.raises(RemoteError, match=rf"{url}/manifest.json: GET refused .*check the credentials"):
            fastload.Dataset(url, storage_options=wrong, retry_deadline=60, cache_dir=tmp_path / "c1")
        reader = dict(server.options(), access_key_id="reader", secret_access_key="reader-secret")
        assert len(fastload.Dataset(url, storage_options=reader, retry_deadline=60, cache_dir=tmp_path / "c2")) == len(ds)
        with pytest.raises(RemoteError, match=rf"s3://{bucket}/w.*refused"):
            fastload.pack(images, f"s3://{bucket}/w", shard_size="4KB", storage_options=reader, progress=False)
        assert time.monotonic() - t0 < 30  # no retrying for a minute
    finally:
        server.stop()


def test_without_the_client_a_url_is_a_dependency_error_naming_the_extra(tmp_path):
    """obstore made unimportable (``sys.modules['obstore'] = None``) in a fresh interpreter: opening
    a URL, and the CLI, say to install fastload[s3]; a local dataset still needs nothing of it."""
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['obstore'] = None\n"
        "import fastload\n"
        "try:\n    fastload.Dataset('s3://bucket/prefix')\n"
        "except fastload.DependencyError as e:\n    print('DEP', e)\n"
        "from fastload.cli import main\n"
        "print('RC', main(['inspect', 's3://bucket/prefix']))\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parent.parent), FASTLOAD_CACHE=str(tmp_path))
    res = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert 'DEP reading or writing an object store' in res.stdout and 'pip install "fastload[s3]"' in res.stdout
    assert "RC 2" in res.stdout
    err = [line for line in res.stderr.splitlines() if line.strip()]
    assert len(err) == 1 and 'fastload[s3]' in err[0]


def test_an_http_url_is_read_only(tmp_path, images):
    """``http://host/bucket/prefix`` (a server that lets anyone read: SeaweedFS's anonymous identity
    with Read): the same records as through s3://; packing to it is refused up front."""
    server = SeaweedServer(tmp_path / "weed")
    server.start()
    try:
        bucket = server.make_bucket()
        fastload.pack(images, f"s3://{bucket}/d", shard_size="4KB", storage_options=server.options(), progress=False)
    finally:
        server.stop()
    server.identities = [
        {"name": "admin", "credentials": [{"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List"]},
        {"name": "anonymous", "actions": ["Read"]},
    ]  # fmt: skip
    server.start()
    try:
        url = f"{server.endpoint}/{bucket}/d"
        assert is_url(url) and parse_url(url).kind == "http"
        ds = fastload.Dataset(url, cache_dir=tmp_path / "c", retry_deadline=30)
        assert ds.url == url and len(ds) == N_CLASSES * PER_CLASS
        assert [pixels_of(ds[i][0]) for i in range(len(ds))] == [(i // PER_CLASS, i) for i in range(len(ds))]
        with pytest.raises(ConfigError, match=r"http:// is read-only; pack to s3://"):
            fastload.pack(images, url, shard_size="4KB", progress=False)
    finally:
        server.stop()
