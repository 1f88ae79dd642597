"""``gs://`` datasets against a real Google Cloud Storage server (fake-gcs-server): inspect and verify
a bucket, train from it with whole shards and with ``fetch="records"``, the emulator found through
``STORAGE_EMULATOR_HOST``, and the errors that name the URL.

The store goes through the same code as ``s3://``; what differs is the client's Google side (its
XML-API reads, its ETags, its JSON-API listing), which only a GCS server exercises. The datasets
are packed locally and copied into the bucket through the server's JSON API (``gcsserver.GCSServer``),
a second way from fastload's client; the server does not take the XML API's uploads, so packing
*to* ``gs://`` is not tested here. Images are solid colours whose pixels encode (label, index).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD
from fastload.cli import main
from fastload.errors import CorruptDataError, FormatError, RemoteError

from conftest import decode_batches, paint_folder, resumed_like_local

pytest.importorskip("obstore")

N_CLASSES, PER_CLASS = 3, 8  # 24 images, one per 4 KB shard: 24 shards
SHARD_SIZE = "4KB"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return paint_folder(tmp_path_factory.mktemp("images"), N_CLASSES, PER_CLASS, quality=None, digits=3)


@pytest.fixture(autouse=True)
def emulator(gcs, tmp_path, monkeypatch):
    """Every test: the server named the way Google's clients find an emulator, and a cache of its own."""
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs.endpoint)
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def packed(gcs, images, tmp_path_factory):
    """The images packed locally and copied to gs://BUCKET/train."""
    local = tmp_path_factory.mktemp("local") / "train"
    fastload.pack(images, local, shard_size=SHARD_SIZE, progress=False)
    bucket = gcs.make_bucket()
    gcs.upload_tree(local, bucket, "train")
    return {"url": f"gs://{bucket}/train", "bucket": bucket, "local": local}


def every_sample_once(got: list[tuple[int, int]]) -> bool:
    return sorted(got) == sorted((i // PER_CLASS, i) for i in range(N_CLASSES * PER_CLASS))


def test_the_bucket_holds_the_local_datasets_files(gcs, packed):
    """The fixture's copy is what the other tests read: every file of the local dataset, by size."""
    local = packed["local"]
    assert gcs.listing(packed["bucket"], "train") == {p.name: p.stat().st_size for p in local.iterdir() if p.is_file()}
    assert len([p for p in local.iterdir() if p.name.startswith("shard-")]) == N_CLASSES * PER_CLASS


def test_the_cli_inspects_and_verifies_a_bucket_and_names_a_damaged_shard(gcs, packed, capsys):
    """Written for ``inspect``/``verify`` that read only ``s3://``, or a verify that passes a damaged
    shard: both work on ``gs://`` with the server found through ``STORAGE_EMULATOR_HOST`` alone, and a
    shard altered in the bucket is named, exit 1."""
    bucket = gcs.make_bucket()
    url = f"gs://{bucket}/cli"
    gcs.upload_tree(packed["local"], bucket, "cli")
    assert main(["inspect", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["samples"] == N_CLASSES * PER_CLASS and info["path"] == url
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {url}: ")
    good = gcs.read(bucket, "cli/shard-00001.lmdb")
    gcs.put(bucket, "cli/shard-00001.lmdb", good[:-5] + b"XXXXX")
    assert main(["verify", url]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert any(f"{url}/shard-00001.lmdb" in line and "SHA-256" in line for line in err)
    assert err[-1].startswith(f"fastload verify: ") and url in err[-1]


@pytest.mark.parametrize("fetch", ["shards", "records"])
def test_batches_len_and_resume_are_those_of_a_local_copy(packed, tmp_path, fetch):
    """Written for a reader that gives other batches, crops or order from ``gs://`` than from a local
    copy, or loses its place on resume: bit-identical to the local loader on the CPU path, every
    sample once by its pixels, for whole shards and for range requests per record."""
    got = resumed_like_local(packed["local"], packed["url"], epoch=2, stop_after=2, seed=5,
                             cache_dir=tmp_path / "c", fetch=fetch)
    assert every_sample_once(decode_batches(got, IMAGENET_MEAN, IMAGENET_STD))


def test_an_object_replaced_with_other_bytes_of_its_size_is_never_served(gcs, images, tmp_path):
    """Written for a cache that trusts the server's bytes: a shard overwritten with bytes of the same
    size is a CorruptDataError naming it (whole shards: its SHA-256; records: the ETag the shard was
    opened on, which this server sends back though it ignores ``If-Match``), and the other shards are
    still served."""
    local = tmp_path / "local"
    fastload.pack(images, local, shard_size="32KB", progress=False)  # several images a shard
    bucket = gcs.make_bucket()
    url = f"gs://{bucket}/t"
    gcs.upload_tree(local, bucket, "t")
    records = fastload.Dataset(url, cache_dir=tmp_path / "r", fetch="records")
    first_of_2 = int(records.manifest.shards[2].first)
    assert records.manifest.shards[2].count > 1
    assert records[first_of_2] == fastload.Dataset(local)[first_of_2]  # shard 2 opened, its ETag taken
    bad = bytearray(gcs.read(bucket, "t/shard-00002.lmdb"))
    bad[len(bad) // 2] ^= 0xFF
    gcs.put(bucket, "t/shard-00002.lmdb", bytes(bad))
    shards = fastload.Dataset(url, cache_dir=tmp_path / "s")
    with pytest.raises(CorruptDataError, match=rf"{url}/shard-00002.lmdb: shard 2: SHA-256 .* differs from the manifest, twice"):
        shards[first_of_2]
    assert shards[0] == fastload.Dataset(local)[0]
    with pytest.raises(CorruptDataError, match=rf"{url}/shard-00002.lmdb: the object was replaced"):
        records[first_of_2 + records.manifest.shards[2].count - 1]  # a record on another page, not yet fetched


def test_a_missing_bucket_a_prefix_without_a_dataset_and_an_unusable_endpoint_name_the_url(gcs, packed, tmp_path, monkeypatch):
    """Written for the server's answers reaching the user as a client error, or an endpoint the client
    cannot call retried for the whole deadline: each is a FastloadError naming the URL, at once."""
    bucket = packed["bucket"]
    with pytest.raises(FormatError, match=rf"gs://{bucket}/nothing: no fastload dataset there"):
        fastload.Dataset(f"gs://{bucket}/nothing", cache_dir=tmp_path / "a")
    t0 = time.monotonic()
    with pytest.raises((FormatError, RemoteError), match=r"gs://no-such-bucket/p"):
        fastload.Dataset("gs://no-such-bucket/p", retry_deadline=60, cache_dir=tmp_path / "b")
    no_http = {"service_account_key": json.dumps({"gcs_base_url": gcs.endpoint, "disable_oauth": True,
                                                  "client_email": "", "private_key": "", "private_key_id": ""}),
               "allow_http": False}  # fmt: skip
    with pytest.raises(RemoteError, match=rf"{packed['url']}/manifest.json: GET could not be sent: .*allow_http"):
        fastload.Dataset(packed["url"], storage_options=no_http, retry_deadline=60, cache_dir=tmp_path / "d")
    assert time.monotonic() - t0 < 30  # neither retried for a minute


def test_no_credentials_anywhere_is_an_error_saying_where_google_credentials_come_from(tmp_path, monkeypatch):
    """Written for the AWS variables named for a ``gs://`` URL, or the metadata server asked until the
    deadline: without an emulator or credentials, the error names the URL and Google's ways, at once."""
    for var in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS", "GOOGLE_SERVICE_ACCOUNT",
                "GOOGLE_SERVICE_ACCOUNT_PATH", "GOOGLE_SERVICE_ACCOUNT_KEY"):  # fmt: skip
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no gcloud application-default credentials either
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=r"^gs://somebucket/x/manifest.json: no credentials found: set "
                                          r"GOOGLE_APPLICATION_CREDENTIALS .*'service_account_path'"):  # fmt: skip
        fastload.Dataset("gs://somebucket/x", retry_deadline=60, cache_dir=tmp_path / "c")
    assert time.monotonic() - t0 < 30
