"""Packing into an object store: a local staging pack, then the upload (shards, dataset files, manifest last).

``pack_to_url`` checks the prefix first (what ``overwrite``/``resume`` allow), packs into a staging
directory under the cache (``$FASTLOAD_CACHE/staging/``), uploads, and deletes the staging copy. A
reader never sees a half-uploaded dataset: the manifest is the last object written, and with
``overwrite`` the old manifest is the first deleted. ``resume`` sends only the files the prefix
lacks or holds with another size or content (an S3 single-part upload's ETag is its MD5, compared
with the local file's; an object whose ETag is not a plain MD5 is sent again).
"""

from __future__ import annotations

import hashlib
import logging
import shutil
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..errors import PackError
from ..format import MANIFEST_NAME, Manifest
from .nodecache import cache_root, dataset_files
from .store import RemoteStore
from .url import parse_url

log = logging.getLogger(__name__)
R = TypeVar("R")


def staging_dir(url: str, cache_dir: Any = None) -> Path:
    """Where a pack to ``url`` is staged before its upload."""
    return cache_root(cache_dir).parent / "staging" / hashlib.sha256(str(url).encode()).hexdigest()[:16] / "dataset"


def _md5(path: Path) -> str:
    h = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while True:
            b = f.read(8 << 20)
            if not b:
                return h.hexdigest()
            h.update(b)


def _plan(store: RemoteStore, *, overwrite: bool, resume: bool) -> tuple[dict[str, dict], list[str]]:
    """What is at the prefix (``name -> {size}``) and the old dataset's files to delete; refuses what
    the flags do not allow."""
    url = store.url
    listing = {o["name"]: o for o in store.list()}
    old: list[str] = []
    if MANIFEST_NAME in listing:
        old_m = Manifest.loads(store.get(MANIFEST_NAME), where=url.child(MANIFEST_NAME))
        names = {MANIFEST_NAME, *(s.file for s in old_m.shards), *(f["file"] for f in dataset_files(old_m.to_json()))}
        if not overwrite:
            raise PackError(
                f"{url}: a fastload dataset is already there ({len(old_m.shards)} shards); pass --overwrite "
                "(overwrite=True) to replace it, or choose another prefix"
            )
        foreign = sorted(set(listing) - names)
        if foreign:
            raise PackError(
                f"{url}: holds {len(foreign)} object(s) that are not part of its fastload dataset (like "
                f"{foreign[0]!r}); --overwrite replaces only a fastload dataset: nothing was deleted"
            )
        old = sorted(names)
    elif listing and not resume:
        raise PackError(
            f"{url}: holds {len(listing)} object(s) but no fastload manifest (like {sorted(listing)[0]!r}): an "
            "unfinished upload is continued with --resume; anything else: choose an empty prefix (nothing was deleted)"
        )
    return listing, old


def pack_to_url(
    url: str, run_local: Callable[[Path, str], R], *, overwrite: bool, resume: bool,
    storage_options: Any = None, retry_deadline: Any = None,
) -> tuple[R, dict]:  # fmt: skip
    """Pack with ``run_local(staging, mode)`` then upload the staging dataset to ``url``; ``mode`` is
    ``"fresh"`` (pack anew, replacing a staging copy), ``"resume"`` (continue an unfinished staging
    pack) or ``"reuse"`` (the staging pack is complete: upload it).

    Returns:
        ``(run_local's result, {"uploaded": n, "kept": n, "bytes": n})``.

    Raises:
        PackError: the prefix holds a dataset and not ``overwrite``, or other objects.
        RemoteError: the store refused or did not answer within the deadline.
    """
    u = parse_url(url)
    store = RemoteStore(u, storage_options=storage_options, retry_deadline=retry_deadline)
    if not u.writable:
        from ..errors import ConfigError

        raise ConfigError(f"{u}: {u.scheme}:// is read-only; pack to s3://, gs:// or az://")
    listing, old = _plan(store, overwrite=overwrite, resume=resume)
    staging = staging_dir(str(u))
    partial = staging.with_name(staging.name + ".partial")
    if resume and (staging / MANIFEST_NAME).exists():
        mode = "reuse"  # the staging pack finished before the upload was cut: only the upload goes on
    elif resume and partial.exists():
        mode = "resume"
    else:
        mode = "fresh"  # (a staging copy left by an earlier try is replaced)
        staging.parent.mkdir(parents=True, exist_ok=True)
    result = run_local(staging, mode)
    stats = upload_dir(store, staging, listing, old, resume=resume)
    shutil.rmtree(staging.parent, ignore_errors=True)
    return result, stats


def upload_dir(store: RemoteStore, local: Path, listing: dict[str, dict], old: list[str], *, resume: bool) -> dict:
    """Upload the local dataset ``local``: shards, dataset files, then the manifest."""
    text = (local / MANIFEST_NAME).read_bytes()
    m = Manifest.loads(text, where=str(local / MANIFEST_NAME))
    files = [(s.file, s.bytes) for s in m.shards] + [(f["file"], int(f["bytes"])) for f in dataset_files(m.to_json())]
    if old:  # overwrite: the old manifest goes first, so no reader sees old and new mixed
        store.delete([MANIFEST_NAME])
        stale = [n for n in old if n != MANIFEST_NAME and n not in {f for f, _ in files}]
        store.delete(stale)
    uploaded = kept = nbytes = 0
    for name, size in files:
        have = listing.get(name)
        if resume and not old and have is not None and have["size"] == size:
            head = store.head(name)
            if head is not None and head["size"] == size and head["e_tag"] == _md5(local / name):
                kept += 1
                continue
        store.put_file(name, local / name)
        uploaded += 1
        nbytes += size
        log.debug("uploaded %s (%d bytes)", store.url.child(name), size)
    store.put_bytes(MANIFEST_NAME, text)
    return {"uploaded": uploaded, "kept": kept, "bytes": nbytes}
