"""Rules of packing to a URL: what a reader may find during an upload, and which staging copy is uploaded."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

import fastload
from fastload.format import MANIFEST_NAME
from fastload.remote import upload
from fastload.remote.url import parse_url
from conftest import paint_folder

URL = "s3://bucket/ds"


class MemoryStore:
    """An object store in a dict; after every change ``check`` is called with the objects (a
    reader looking at the prefix at that moment)."""

    objects: dict[str, bytes] = {}
    check = staticmethod(lambda objects: None)

    def __init__(self, url, **kw) -> None:
        self.url = url

    def list(self) -> list[dict]:
        return [{"name": n, "size": len(b)} for n, b in sorted(self.objects.items())]

    def get(self, name: str, **kw) -> bytes:
        return self.objects[name]

    def head(self, name: str) -> dict | None:
        b = self.objects.get(name)
        return None if b is None else {"size": len(b), "e_tag": hashlib.md5(b).hexdigest()}

    def put_bytes(self, name: str, data: bytes) -> None:
        self.objects[name] = bytes(data)
        self.check(self.objects)

    def put_file(self, name: str, path: Path) -> None:
        self.put_bytes(name, Path(path).read_bytes())

    def delete(self, names: list[str]) -> None:
        for n in names:
            self.objects.pop(n, None)
        self.check(self.objects)


@pytest.fixture
def store(monkeypatch, tmp_path):
    monkeypatch.setenv("FASTLOAD_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(MemoryStore, "objects", {})
    monkeypatch.setattr(MemoryStore, "check", staticmethod(lambda objects: None))
    monkeypatch.setattr(upload, "RemoteStore", MemoryStore)
    return MemoryStore


def local_pack(src: Path, out: Path) -> dict[str, bytes]:
    fastload.pack(src, out, shard_size="8KiB", workers=1, progress=False)
    return {p.name: p.read_bytes() for p in out.iterdir()}


def listed(manifest: bytes) -> list[str]:
    m = json.loads(manifest)
    return [s["file"] for s in m["shards"]]


def same_dataset(objects: dict[str, bytes], want: dict[str, bytes]) -> bool:
    """The prefix holds ``want``'s shards and labels, byte for byte (the manifest but its date)."""
    strip = lambda b: {k: v for k, v in json.loads(b).items() if k != "created"}  # noqa: E731
    return strip(objects[MANIFEST_NAME]) == strip(want[MANIFEST_NAME]) and all(
        objects.get(n) == b for n, b in want.items() if n != MANIFEST_NAME)


# (images per class of the old dataset, of the new one): the new one has fewer shards, as many, more
SIZES = [(10, 4), (6, 6), (3, 9)]


@pytest.mark.parametrize("old_n,new_n", SIZES)
def test_during_an_overwrite_no_reader_finds_a_manifest_whose_shards_are_being_replaced(store, monkeypatch, tmp_path, old_n, new_n):
    """Scenario: a dataset at the prefix, replaced with ``overwrite=True`` by another. Rule
    (docs: the manifest is written last and with overwrite the old one deleted first): at every
    moment of the upload, a manifest at the prefix is either the old one with every shard it lists
    holding its old bytes, or the new one with every shard it lists complete. Bugs: the old
    manifest deleted after the stale shards or left in place until the new one overwrites it (a
    reader then opens the old manifest and reads a new shard under an old shard's name)."""
    old_src = paint_folder(tmp_path / "a", classes=2, per_class=old_n, size=(60, 40))
    new_src = paint_folder(tmp_path / "b", classes=3, per_class=new_n, size=(50, 44))
    old = local_pack(old_src, tmp_path / "old")
    new = local_pack(new_src, tmp_path / "new")
    assert len(listed(old[MANIFEST_NAME])) >= 2 and len(listed(new[MANIFEST_NAME])) >= 2
    fastload.pack(old_src, URL, shard_size="8KiB", workers=1, progress=False)
    assert same_dataset(store.objects, old)
    old = dict(store.objects)  # what a reader found before (its manifest's date included)
    seen = []

    def check(objects):
        m = objects.get(MANIFEST_NAME)
        seen.append(m)
        if m is None:
            return
        ref = old if m == old[MANIFEST_NAME] else new
        for name in listed(m):
            assert objects.get(name) == ref[name], f"the manifest at the prefix lists {name}, which holds other bytes"

    monkeypatch.setattr(store, "check", staticmethod(check))
    fastload.pack(new_src, URL, shard_size="8KiB", workers=1, progress=False, overwrite=True)
    assert same_dataset(store.objects, new)
    assert seen[-1] is not None and seen.count(None) >= 1  # the manifest was absent during the upload


def test_a_fresh_pack_never_uploads_another_sources_finished_staging_copy(store, monkeypatch, tmp_path):
    """Scenario: a pack of source A to the URL finished its staging copy and was cut before the
    upload (the store refused); then source B is packed to the same URL without ``resume``. Rule:
    a fresh pack packs its own source (the staging copy left is replaced). Bug: a finished staging
    copy reused whenever it exists, so B's pack uploads A's dataset."""
    a_src = paint_folder(tmp_path / "a", classes=2, per_class=5, size=(60, 40))
    b_src = paint_folder(tmp_path / "b", classes=3, per_class=4, size=(50, 44))
    b = local_pack(b_src, tmp_path / "b_local")

    def refuse(objects):
        raise ConnectionError("the store went away")

    monkeypatch.setattr(store, "check", staticmethod(refuse))
    with pytest.raises(ConnectionError):
        fastload.pack(a_src, URL, shard_size="8KiB", workers=1, progress=False)
    assert staged_copies() == 1  # A's finished staging copy
    monkeypatch.setattr(store, "check", staticmethod(lambda objects: None))
    store.objects.clear()
    fastload.pack(b_src, URL, shard_size="8KiB", workers=1, progress=False)
    assert same_dataset(store.objects, b)


def staged_copies() -> int:
    """How many finished staging copies the cache holds for URL."""
    return len(list(upload.staging_root(str(parse_url(URL))).glob(f"*/dataset/{MANIFEST_NAME}")))


def test_a_resumed_upload_with_another_source_never_uploads_the_first_sources_staging_copy(store, monkeypatch, tmp_path):
    """Scenario: source A's pack to the URL finished its staging copy and lost the store during the
    upload; then source B is packed to the URL with ``resume=True``. Rule (issue 38 class 1: the
    staging area is keyed by the source): B's resume packs and uploads B, never A's staging copy,
    and leaves A's copy as it was (A can still be resumed, over B with ``overwrite``). Bugs: the
    finished staging copy reused whatever the source, so B's command uploaded A (fixed before);
    one staging copy per URL, so B's pack replaced or deleted A's."""
    a_src = paint_folder(tmp_path / "a", classes=2, per_class=5, size=(60, 40))
    b_src = paint_folder(tmp_path / "b", classes=3, per_class=4, size=(50, 44))
    a = local_pack(a_src, tmp_path / "a_local")
    b = local_pack(b_src, tmp_path / "b_local")

    def refuse(objects):
        raise ConnectionError("the store went away")

    monkeypatch.setattr(store, "check", staticmethod(refuse))
    with pytest.raises(ConnectionError):
        fastload.pack(a_src, URL, shard_size="8KiB", workers=1, progress=False)
    a_staged = {p.relative_to(upload.staging_root(str(parse_url(URL)))): p.read_bytes()
                for p in upload.staging_root(str(parse_url(URL))).rglob("*") if p.is_file()}
    monkeypatch.setattr(store, "check", staticmethod(lambda objects: None))
    store.objects.clear()
    res = fastload.pack(b_src, URL, shard_size="8KiB", workers=1, progress=False, resume=True)
    assert same_dataset(store.objects, b) and res.num_samples == 12
    root = upload.staging_root(str(parse_url(URL)))
    assert {p.relative_to(root): p.read_bytes() for p in root.rglob("*") if p.is_file()} == a_staged
    fastload.pack(a_src, URL, shard_size="8KiB", workers=1, progress=False, resume=True, overwrite=True)
    assert same_dataset(store.objects, a) and staged_copies() == 0
