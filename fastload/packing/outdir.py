"""OUT and OUT.partial: overwrite and resume rules, reuse of finished shards, the final rename.

A pack writes into ``OUT.partial``; :func:`finalize` writes ``labels.bin``, then
``manifest.json``, then renames the directory to ``OUT`` (see ``docs/format.md``).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ConfigError, PackError
from ..format import LABELS_DTYPE, LABELS_NAME, MANIFEST_NAME, Manifest, ShardInfo
from ..store import HeaderStats, file_sha256, iter_headers
from ..version import __version__
from .journal import JOURNAL_NAME, Journal, atomic_write, fsync_dir
from .sources import Source

log = logging.getLogger(__name__)

PARTIAL_SUFFIX = ".partial"


def _is_fastload_dir(p: Path) -> bool:
    if not p.is_dir():
        return False
    if not any(p.iterdir()):
        return True
    try:
        return json.loads((p / MANIFEST_NAME).read_bytes()).get("format") == "fastload"
    except (OSError, ValueError, AttributeError):
        return False


def check_out(out: Path, overwrite: bool) -> None:
    if out.exists() or out.is_symlink():
        if not overwrite:
            raise ConfigError(f"OUT {out} already exists; pass --overwrite (overwrite=True) to replace it")
        if not _is_fastload_dir(out):
            raise ConfigError(
                f"OUT {out} exists and is not a fastload dataset; refusing to replace it even with --overwrite "
                "(choose another OUT or remove it yourself)"
            )


def _partial_is_ours(p: Path) -> bool:
    return p.is_dir() and ((p / JOURNAL_NAME).exists() or all(q.name.endswith((".lmdb", ".tmp", ".bin", ".json")) for q in p.iterdir()))


def prepare_partial(partial: Path, journal: Journal, resume: bool, overwrite: bool, stats: HeaderStats) -> Journal:
    """Create or reuse ``OUT.partial``; return the journal to continue from."""
    if resume and partial.is_dir() and not (partial / JOURNAL_NAME).exists() and _partial_is_ours(partial):
        # stopped between creating OUT.partial and writing its journal: nothing to reuse
        log.info("%s holds no journal (the pack stopped before its first shard): starting it again", partial)
        shutil.rmtree(partial)
    if partial.exists() or partial.is_symlink():
        if resume:
            old = Journal.load(partial)
            if old.source_fingerprint != journal.source_fingerprint:
                raise ConfigError(
                    f"cannot resume {partial}: the source changed since it was started ({old.source}); "
                    "resume with the same SRC, or start over with --overwrite"
                )
            if old.options != journal.options:
                diff = ", ".join(f"{k} {old.options.get(k)!r} -> {v!r}" for k, v in journal.options.items() if old.options.get(k) != v)
                raise ConfigError(f"cannot resume {partial}: options changed ({diff}); resume with the same options, or start over with --overwrite")
            return _reuse_shards(partial, old, stats)
        if not overwrite:
            raise ConfigError(
                f"{partial} holds an unfinished pack; continue it with --resume (resume=True) "
                "or start over with --overwrite (overwrite=True)"
            )
        if not _partial_is_ours(partial):
            raise ConfigError(f"{partial} exists and is not a fastload partial pack; remove it yourself")
        shutil.rmtree(partial)
    elif resume:
        log.info("nothing to resume at %s: starting a new pack", partial)
    try:
        partial.mkdir(parents=True)
        journal.save(partial)
    except OSError as e:
        raise PackError(f"{partial}: cannot create the output directory: {e.strerror or e}") from None
    return journal


def _reuse_shards(partial: Path, journal: Journal, stats: HeaderStats) -> Journal:
    """Keep the journal's shards that still match their size and hash; drop the rest."""
    kept: list[dict[str, Any]] = []
    for s in journal.shards:
        p = partial / s["file"]
        try:
            ok = p.stat().st_size == int(s["bytes"]) and file_sha256(p) == s["sha256"]
        except OSError:
            ok = False
        if not ok:
            log.warning("%s: missing or changed since it was written; packing it again", p)
            break
        kept.append(s)
    keep_names = {s["file"] for s in kept} | {JOURNAL_NAME}
    for q in partial.iterdir():
        if q.name not in keep_names:
            q.unlink() if not q.is_dir() else shutil.rmtree(q)
    for s in kept:
        for _i, h in iter_headers(partial / s["file"]):
            stats.add(h)
    nskipped = int(kept[-1]["skipped"]) if kept else 0
    journal.shards = kept
    journal.skipped = journal.skipped[:nskipped]
    journal.save(partial)
    if kept:
        log.info("resuming %s: %d finished shard(s) reused, continuing at source item %d", partial, len(kept), journal.position)
    return journal



def finalize(
    partial: Path,
    out: Path,
    source: Source,
    stats: HeaderStats,
    journal: Journal,
    options: dict[str, Any],
    on_error: str,
    overwrite: bool,
) -> Manifest:
    """labels.bin, then manifest.json, then rename ``partial`` to ``out``."""
    labels = np.frombuffer(stats.labels, dtype=np.int32).astype(LABELS_DTYPE)
    classes = source.classes if source.classes is not None else [str(i) for i in range(int(labels.max()) + 1)]
    counts = np.bincount(labels, minlength=len(classes)).tolist()
    shards = [ShardInfo.from_json({k: s[k] for k in ("file", "first", "count", "bytes", "sha256")}, where=JOURNAL_NAME) for s in journal.shards]
    raw = labels.tobytes()
    manifest = Manifest(
        num_samples=len(labels),
        classes=list(classes),
        class_counts=counts,
        shards=shards,
        labels_sha256=hashlib.sha256(raw).hexdigest(),
        skipped=list(journal.skipped),
        stats=stats.to_json(),
        options={**options, "source": journal.source, "on_error": on_error},
        created=datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0).isoformat(),
        fastload_version=__version__,
    )
    manifest.validate(where=str(partial / MANIFEST_NAME))
    try:
        atomic_write(partial / LABELS_NAME, raw)
        atomic_write(partial / MANIFEST_NAME, manifest.dumps().encode("utf-8"))
        old = None
        if out.exists() or out.is_symlink():
            check_out(out, overwrite)
            old = out.with_name(f"{out.name}.old-{os.getpid()}")
            os.replace(out, old)
        os.replace(partial, out)
        fsync_dir(out.parent)
        # the journal goes last: a crash before the rename leaves a resumable OUT.partial
        with contextlib.suppress(FileNotFoundError):
            (out / JOURNAL_NAME).unlink()
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except OSError as e:
        raise PackError(f"{partial}: cannot finish the pack: {e.strerror or e}; fix that, then continue with --resume") from None
    return manifest
