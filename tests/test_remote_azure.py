"""``az://`` datasets against a real Azure Blob server (Azurite, Azure Storage's own emulator): pack
to, inspect and verify a container, train from it with whole shards and with ``fetch="records"``,
and the errors that name the URL.

The store goes through the same code as ``s3://``; what differs is the client's Azure side (its
requests, its ETags, its errors), which only a real Azure server exercises. Objects are listed,
read and altered with ``azure-storage-blob``, Microsoft's client, a second way from fastload's own.
Images are solid colours whose pixels encode (label, index) (``conftest.encode_color``).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD
from fastload.cli import main
from fastload.errors import CorruptDataError, FormatError, RemoteError


from azserver import ACCOUNT_KEY
from conftest import decode_batches, paint_folder, resumed_like_local

pytest.importorskip("obstore")

N_CLASSES, PER_CLASS = 3, 8  # 24 images, one per 4 KB shard: 24 shards
SHARD_SIZE = "4KB"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> Path:
    return paint_folder(tmp_path_factory.mktemp("images"), N_CLASSES, PER_CLASS, quality=None, digits=3)


@pytest.fixture(autouse=True)
def cache_env(tmp_path, monkeypatch):
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def packed(azurite, images, tmp_path_factory):
    """The images packed to az://CONTAINER/train and, the same way, locally."""
    os.environ["FASTLOAD_CACHE"] = str(tmp_path_factory.mktemp("packcache"))
    container = azurite.make_container()
    url = f"az://{container}/train"
    fastload.pack(images, url, shard_size=SHARD_SIZE, storage_options=azurite.options(), progress=False)
    local = tmp_path_factory.mktemp("local") / "train"
    fastload.pack(images, local, shard_size=SHARD_SIZE, progress=False)
    del os.environ["FASTLOAD_CACHE"]
    return {"url": url, "container": container, "local": local}


def blobs(azurite, container: str, prefix: str) -> dict[str, int]:
    """Names (below ``prefix``) and sizes of the container's blobs, as Azure's own client lists them."""
    cc = azurite.client().get_container_client(container)
    return {b.name[len(prefix) + 1 :]: b.size for b in cc.list_blobs(name_starts_with=prefix + "/")}


def every_sample_once(got: list[tuple[int, int]]) -> bool:
    return sorted(got) == sorted((i // PER_CLASS, i) for i in range(N_CLASSES * PER_CLASS))


def test_pack_uploads_the_local_datasets_files_byte_for_byte(azurite, packed):
    """Written for an upload to Azure that loses, renames or cuts a file: the container holds exactly
    the files a local pack writes, with their bytes."""
    local = packed["local"]
    expected = {p.name: p.stat().st_size for p in local.iterdir() if p.is_file()}
    assert blobs(azurite, packed["container"], "train") == expected
    cc = azurite.client().get_container_client(packed["container"])
    for name in expected:
        if name != "manifest.json":  # the manifest names its own place (the URL): compared below
            assert cc.download_blob(f"train/{name}").readall() == (local / name).read_bytes(), name
    m = json.loads(cc.download_blob("train/manifest.json").readall())
    assert [s["sha256"] for s in m["shards"]] == [s["sha256"] for s in json.loads((local / "manifest.json").read_text())["shards"]]


def test_the_cli_inspects_and_verifies_a_container_and_names_a_damaged_shard(azurite, images, capsys, monkeypatch):
    """Written for ``inspect``/``verify`` that read only ``s3://``, or a verify that passes a damaged
    shard: both work on ``az://``, and a shard altered in the container is named, exit 1."""
    container = azurite.make_container()
    url = f"az://{container}/cli"
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_NAME", "devstoreaccount1")
    monkeypatch.setenv("AZURE_STORAGE_ACCOUNT_KEY", ACCOUNT_KEY)
    monkeypatch.setenv("AZURE_STORAGE_ENDPOINT", azurite.endpoint)
    assert main(["pack", str(images), url, "--shard-size", SHARD_SIZE, "--no-progress"]) == 0
    assert f"-> {url}" in capsys.readouterr().out
    assert main(["inspect", url, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["samples"] == N_CLASSES * PER_CLASS and info["path"] == url
    assert main(["verify", url]) == 0
    assert capsys.readouterr().out.startswith(f"ok: {url}: ")
    bc = azurite.client().get_blob_client(container, "cli/shard-00001.lmdb")
    good = bc.download_blob().readall()
    bc.upload_blob(good[:-5] + b"XXXXX", overwrite=True)
    assert main(["verify", url]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert any(f"{url}/shard-00001.lmdb" in line and "SHA-256" in line for line in err)
    assert err[-1].startswith(f"fastload verify: 2 problem(s) in {url} ")


@pytest.mark.parametrize("fetch", ["shards", "records"])
def test_batches_len_and_resume_are_those_of_a_local_copy(azurite, packed, tmp_path, fetch):
    """Written for a reader that gives other batches, crops or order from ``az://`` than from a local
    copy, or loses its place on resume: bit-identical to the local loader on the CPU path, every
    sample once by its pixels, for whole shards and for range requests per record."""
    got = resumed_like_local(packed["local"], packed["url"], epoch=2, stop_after=2, seed=5,
                             storage_options=azurite.options(), cache_dir=tmp_path / "c", fetch=fetch)
    assert every_sample_once(decode_batches(got, IMAGENET_MEAN, IMAGENET_STD))


def test_a_blob_replaced_with_other_bytes_of_its_size_is_never_served(azurite, images, tmp_path):
    """Written for a cache that trusts Azure's bytes: a shard overwritten with bytes of the same size is
    a CorruptDataError naming it (whole shards: its SHA-256; records: the ETag the shard was opened on),
    and the other shards are still served."""
    container = azurite.make_container()
    url = f"az://{container}/t"
    fastload.pack(images, url, shard_size="32KB", storage_options=azurite.options(), progress=False)  # several a shard
    records = fastload.Dataset(url, storage_options=azurite.options(), cache_dir=tmp_path / "r", fetch="records")
    first_of_2 = int(records.manifest.shards[2].first)
    assert records.manifest.shards[2].count > 1
    records[first_of_2]  # shard 2 opened (its ETag taken) before the blob is replaced
    bc = azurite.client().get_blob_client(container, "t/shard-00002.lmdb")
    bad = bytearray(bc.download_blob().readall())
    bad[len(bad) // 2] ^= 0xFF
    bc.upload_blob(bytes(bad), overwrite=True)
    shards = fastload.Dataset(url, storage_options=azurite.options(), cache_dir=tmp_path / "s")
    with pytest.raises(CorruptDataError, match=rf"{url}/shard-00002.lmdb: shard 2: SHA-256 .* differs from the manifest, twice"):
        shards[first_of_2]
    assert shards[0] == fastload.Dataset(url, storage_options=azurite.options(), cache_dir=tmp_path / "s2")[0]
    with pytest.raises(CorruptDataError, match=r"shard-00002"):
        records[first_of_2 + records.manifest.shards[2].count - 1]  # a record on another page, not yet fetched


def test_a_missing_container_a_prefix_without_a_dataset_and_a_wrong_key_name_the_url(azurite, packed, tmp_path):
    """Written for Azure's answers reaching the user as a client error, or a refused key retried for the
    whole deadline: each is a FastloadError naming the URL, the refused key at once."""
    container = packed["container"]
    with pytest.raises(FormatError, match=rf"az://{container}/nothing: no fastload dataset there"):
        fastload.Dataset(f"az://{container}/nothing", storage_options=azurite.options(), cache_dir=tmp_path / "a")
    with pytest.raises((FormatError, RemoteError), match=r"az://no-such-container/p"):
        fastload.Dataset("az://no-such-container/p", storage_options=azurite.options(), retry_deadline=5,
                         cache_dir=tmp_path / "b")  # fmt: skip
    wrong = azurite.options(key="AAAA" + ACCOUNT_KEY[4:])
    t0 = time.monotonic()
    with pytest.raises(RemoteError, match=rf"{packed['url']}/manifest.json: GET refused .*check the credentials"):
        fastload.Dataset(packed["url"], storage_options=wrong, retry_deadline=60, cache_dir=tmp_path / "c")
    no_http = dict(azurite.options(), allow_http=False)  # an http:// endpoint the client will not call
    with pytest.raises(RemoteError, match=rf"{packed['url']}/manifest.json: GET could not be sent: .*allow_http"):
        fastload.Dataset(packed["url"], storage_options=no_http, retry_deadline=60, cache_dir=tmp_path / "d")
    assert time.monotonic() - t0 < 30  # refused, not retried for a minute
