"""``fastload inspect|verify s3://...``: the dataset fetched whole into a fresh directory, then checked locally."""

from __future__ import annotations

import dataclasses
import logging
import tempfile
from pathlib import Path
from typing import Any

from ..errors import CorruptDataError
from .nodecache import RemoteShards

log = logging.getLogger(__name__)


def mirror(url: str, cache_dir: str | Path, *, storage_options: Any = None, retry_deadline: Any = None) -> tuple[Path, list[str]]:
    """Download every file of the dataset at ``url`` into ``cache_dir`` (a fresh cache, so nothing
    cached before is trusted); ``(local dataset directory, problems)``, a shard whose bytes differ
    from the manifest's hash (fetched twice) being a problem that names its URL.

    Raises:
        FormatError: no manifest there; CorruptDataError: a dataset-level file is altered;
        RemoteError: the store refused or did not answer.
    """
    rs = RemoteShards(url, cache_dir=cache_dir, storage_options=storage_options, retry_deadline=retry_deadline)
    root = rs.open()
    problems = []
    for k in range(len(rs.manifest.shards)):  # type: ignore[union-attr]
        try:
            rs.acquire(k)
        except CorruptDataError as e:
            problems.append(f"bad shard {e}")
    rs.close()
    return root, problems


def inspect_url(url: str, **options: Any) -> dict:
    """:func:`fastload.checks.inspect` of the dataset at ``url`` (every shard downloaded once)."""
    from ..checks import inspect

    with tempfile.TemporaryDirectory(prefix="fastload-inspect-") as tmp:
        root, problems = mirror(url, tmp, **options)
        if problems:
            raise CorruptDataError(f"{problems[0]}; run `fastload verify {url}`")
        info = inspect(root)
    info["path"] = str(url)
    return info


def verify_url(url: str, *, decode: bool = False, **options: Any) -> Any:
    """:func:`fastload.checks.verify` of the dataset at ``url``: every shard's hash (at download),
    then every record; the report's problems name the URL."""
    from ..checks import verify

    with tempfile.TemporaryDirectory(prefix="fastload-verify-") as tmp:
        root, problems = mirror(url, tmp, **options)
        rep = verify(root, decode=decode)
        bad = {p.split(":")[0].rsplit("/", 1)[-1] for p in problems}
        local = [p.replace(str(root), str(url)) for p in rep.problems
                 if not any(f"/{name}: missing" in p for name in bad)]  # fmt: skip
    return dataclasses.replace(rep, path=str(url), problems=problems + local)
