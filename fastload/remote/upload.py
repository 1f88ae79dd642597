"""Packing into an object store: a local staging pack, then the upload (shards, dataset files, manifest last).

``pack_to_url`` locks the URL against a second writer, checks the prefix (what ``overwrite``/``resume``
allow), packs into a staging directory under the cache, uploads, and deletes the URL's staging copies.
A reader never sees a half-uploaded dataset: the manifest is the last object written, and with
``overwrite`` the old manifest is the first deleted. ``resume`` sends only the files the prefix
lacks or holds with another size or content (an S3 single-part upload's ETag is its MD5, compared
with the local file's; an object whose ETag is not a plain MD5 is sent again).

Staging: ``$FASTLOAD_CACHE/staging/<url key>/<source key>/dataset``: one copy per URL *and* source
(the caller's fingerprint of what is packed and how), so a pack or ``--resume`` of another source
never finds, uploads or deletes a copy staged from the first. The lock is an exclusive ``flock`` on
``staging/<url key>.lock`` held from before the prefix is listed until the upload ends; it holds
the writer's process, host and source, which a second pack of the same URL (``--resume`` or not)
names in its refusal. The kernel drops it when the writer dies (``kill -9``). It guards writers
sharing a cache directory (one machine, or a shared ``$FASTLOAD_CACHE``), not the store itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import socket
import time
from pathlib import Path
from typing import Any, Callable, TypeVar

from ..errors import ConfigError, PackError, printable
from ..format import MANIFEST_NAME, Manifest
from ..packing.journal import HeldLock, hold_lock
from .nodecache import cache_root, dataset_files
from .store import RemoteStore
from .url import parse_url

log = logging.getLogger(__name__)
R = TypeVar("R")
#: Objects a fastload upload writes besides the manifest (shards and dataset files).
_UPLOADED = re.compile(r"shard-[0-9]{5,}\.lmdb|labels\.bin|[A-Za-z0-9_.-]+\.(?:bin|lmdb)", re.ASCII)


try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX
    fcntl = None  # type: ignore[assignment]


def _key(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()[:16]


def staging_root(url: str, cache_dir: Any = None) -> Path:
    """The folder of every staging copy of packs to ``url`` (one per source key)."""
    return cache_root(cache_dir).parent / "staging" / _key(str(url))


def staging_dir(url: str, source_key: str, cache_dir: Any = None) -> Path:
    """Where a pack of the source ``source_key`` (a fingerprint of what is packed) to ``url`` is staged."""
    return staging_root(url, cache_dir) / _key(source_key) / "dataset"


class UploadLock(HeldLock):
    """An exclusive ``flock`` on ``staging/<url key>.lock``: one writer per URL among the packs
    sharing this cache; the file says who holds it (process, host, source, start time)."""

    @classmethod
    def acquire(cls, url: str, source: str, cache_dir: Any = None) -> "UploadLock":
        """Lock ``url`` for this process, packing ``source`` (a description, for the refusal of others).

        Raises:
            ConfigError: another pack holds the lock, naming it; or the cache cannot hold the lock file.
        """
        path = staging_root(url, cache_dir).with_suffix(".lock")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as e:
            raise ConfigError(f"{url}: cannot make the upload lock {printable(str(path))}: {e.strerror or e}; "
                              "give a writable cache_dir ($FASTLOAD_CACHE)") from None  # fmt: skip
        try:
            if fcntl is not None:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            who = _holder_text(fd)
            os.close(fd)
            raise ConfigError(f"{url}: another pack is uploading to this prefix ({who}); wait for it to finish or "
                              "stop it, then pack again (its staging copy was not touched)") from None  # fmt: skip
        except OSError as e:  # a file system that cannot lock: go on, as a local pack does
            log.warning("%s: cannot lock %s (%s); make sure no other pack uploads there meanwhile", url, path, e)
        hold_lock(fd)  # a forked pack worker closes its copy: the lock dies with this process
        owner = {"pid": os.getpid(), "host": socket.gethostname(), "source": printable(source)[:200],
                 "since": time.strftime("%Y-%m-%d %H:%M:%S")}  # fmt: skip
        with contextlib.suppress(OSError):
            os.ftruncate(fd, 0)
            os.pwrite(fd, json.dumps(owner).encode(), 0)
        return cls(fd, path)


def _holder_text(fd: int) -> str:
    """Who holds the lock behind ``fd``, from what it wrote there."""
    try:
        owner = json.loads(os.pread(fd, 4096, 0) or b"{}")
        return (f"process {int(owner['pid'])} on {printable(str(owner['host']))[:64]}, packing "
                f"{printable(str(owner['source']))[:200]}, since {printable(str(owner['since']))[:20]}")  # fmt: skip
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"


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
    url: str, run_local: Callable[[Path, str], R], *, source_key: str, source: str, overwrite: bool, resume: bool,
    storage_options: Any = None, retry_deadline: Any = None,
) -> tuple[R, dict]:  # fmt: skip
    """Lock ``url``, pack with ``run_local(staging, mode)`` then upload the staging dataset to ``url``;
    ``mode`` is ``"fresh"`` (pack anew, replacing a staging copy), ``"resume"`` (continue an
    unfinished staging pack) or ``"reuse"`` (the staging pack is complete: upload it). The staging
    copy is the one of ``source_key`` (a fingerprint of the source and the options); ``source``
    describes it in a second writer's refusal.

    Returns:
        ``(run_local's result, {"uploaded": n, "kept": n, "bytes": n})``.

    Raises:
        ConfigError: another pack uploads to ``url`` (naming it), or the URL is read-only.
        PackError: the prefix holds a dataset and not ``overwrite``, or other objects.
        RemoteError: the store refused or did not answer within the deadline.
    """
    u = parse_url(url)
    if not u.writable:
        raise ConfigError(f"{u}: {u.scheme}:// is read-only; pack to s3://, gs:// or az://")
    lock = UploadLock.acquire(str(u), source)
    try:
        store = RemoteStore(u, storage_options=storage_options, retry_deadline=retry_deadline)
        listing, old = _plan(store, overwrite=overwrite, resume=resume)
        staging = staging_dir(str(u), source_key)
        partial = staging.with_name(staging.name + ".partial")
        if resume and (staging / MANIFEST_NAME).exists():
            mode = "reuse"  # the staging pack finished before the upload was cut: only the upload goes on
        elif resume and partial.exists():
            mode = "resume"
        else:
            mode = "fresh"  # (a staging copy of this source left by an earlier try is replaced)
            staging.parent.mkdir(parents=True, exist_ok=True)
        result = run_local(staging, mode)
        stats = upload_dir(store, staging, listing, old, resume=resume)
        shutil.rmtree(staging.parent, ignore_errors=True)  # only this source's copy: another's stays for its --resume
        with contextlib.suppress(OSError):
            staging.parent.parent.rmdir()  # the URL's folder, once no copy is left
    finally:
        lock.release()
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
    if resume and not old:  # an unfinished upload's shards that this dataset does not have (another source's)
        stale = sorted(n for n in listing if _UPLOADED.fullmatch(n) and n not in {f for f, _ in files})
        if stale:
            log.info("%s: deleting %d object(s) of an unfinished upload that this dataset does not list", store.url, len(stale))
            store.delete(stale)
    return {"uploaded": uploaded, "kept": kept, "bytes": nbytes}
