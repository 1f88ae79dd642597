"""The driver's side of an engine pack: the staging area and its lock, the plan, and the commit that publishes.

Layout while a pack runs (``OUT`` is the dataset directory)::

    OUT.partial/        locked (``WriterLock``) by the driver from the start until it returns;
                        the commit links the chosen shards here, then ``finalize`` writes
                        labels.bin and manifest.json and renames it to OUT
    OUT.engine/engine.json          the run's fingerprint (options, schema, classes)
    OUT.engine/tasks/t<index>-<attempt>/   one write task's attempt: shards, stats.npz, receipt.json

The commit takes one receipt per task index (a retried or duplicated task contributes once:
the first attempt, by name, whose files are there), orders them by index (the input's order),
moves every shard's keys to its global place (:func:`rekey_shard`, run on the engine's
workers), links the shards in as ``shard-NNNNN.lmdb`` and publishes through the same
``finalize`` as ``pack``: the manifest is written last and names only those shards.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import logging
import os
import shutil
import struct
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from ...errors import ConfigError, PackError, printable
from ...fields import FieldStats, Schema
from ...format import KEY, Manifest, shard_name
from ...store import HeaderStats, file_sha256
from ..journal import Journal, atomic_write, fsync_file
from ..run import PackResult, engine_settings, manifest_options
from ..outdir import PARTIAL_SUFFIX, SourceGuard, WriterLock, check_out, finalize, remove_fastload_files
from ..samples import schema_of
from ..sources import Source
from .task import SIDE_NAME, TaskSpec

log = logging.getLogger(__name__)

ENGINE_SUFFIX = ".engine"
ENGINE_NAME = "engine.json"
TASKS_NAME = "tasks"
#: A ``parallel_map(fn, items)``: ``[fn(x) for x in items]``, run where the engine runs its tasks.
ParallelMap = Callable[[Callable[[Any], Any], list], list]


def local_map(fn: Callable[[Any], Any], items: list) -> list:
    """``parallel_map`` in this process (threads: the work is file reads and hashing)."""
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(max(1, min(8, len(items)))) as pool:
        return list(pool.map(fn, items))


# ============================================================================ columns and schema


@dataclasses.dataclass(frozen=True)
class Plan:
    """The columns of an engine's rows and the schema they are packed with."""

    image_column: str
    path_column: str | None
    schema: Schema
    classes: tuple[str, ...] | None

    def fields(self) -> tuple[tuple[str, str], ...]:
        return tuple((f.name, f.spec) for f in self.schema if f.name != "image")


def plan_columns(first: Mapping[str, Any], *, image_column: str | None, path_column: str | None,
                 classes: Sequence[str] | None, fields: Mapping[str, Any] | None) -> Plan:  # fmt: skip
    """The plan for rows like ``first``: the image column (``image_column``, else ``image``, else
    ``bytes``), the path column (``path_column``, else ``path`` if present; stored as each record's
    name, not as a field) and every other column a field, of its declared or inferred kind.

    Raises:
        ConfigError: no image column, a named column missing, a value of no kind.
    """
    cols = list(first.keys())
    if image_column is None:
        image_column = next((c for c in ("image", "bytes") if c in cols), None)
        if image_column is None:
            raise ConfigError(f"rows: no 'image' or 'bytes' column (columns: {', '.join(map(repr, cols))}); pass image_column=")
    if path_column is None and "path" in cols and image_column != "path":
        path_column = "path"
    for what, c in (("image_column", image_column), ("path_column", path_column)):
        if c is not None and c not in cols:
            raise ConfigError(f"{what}={c!r}: the rows have no such column (columns: {', '.join(map(repr, cols))})")
    item = {"image": first[image_column], **{c: first[c] for c in cols if c not in (image_column, path_column)}}
    schema = schema_of(item, fields, where="the first row")
    if classes is not None and not schema.has_label:
        raise ConfigError("classes: given, but the rows have no 'label' column")
    names = tuple(str(c) for c in classes) if classes is not None else None
    return Plan(image_column, path_column, schema, names)


def run_fingerprint(plan: Plan, options: dict[str, Any], engine: str) -> str:
    """What must match for a re-run to resume: the engine, options, schema, classes and columns."""
    d = {"engine": engine, "options": options, "schema": plan.schema.to_json(), "classes": plan.classes,
         "image": plan.image_column, "path": plan.path_column}  # fmt: skip
    return hashlib.sha256(json.dumps(d, sort_keys=True, default=str).encode()).hexdigest()


def _row_digest(row: Mapping[str, Any]) -> str:
    """A SHA-256 of a row's columns and values (bytes hashed as they are, others by ``repr``): part of
    an upload's staging key, so a ``--resume`` of other rows never finds this pack's staging copy."""
    h = hashlib.sha256()
    for k in sorted(row, key=str):
        v = row[k]
        h.update(f"{k}\0".encode("utf-8", "surrogateescape"))
        h.update(bytes(v) if isinstance(v, (bytes, bytearray, memoryview)) else repr(v).encode("utf-8", "surrogateescape"))
        h.update(b"\0")
    return h.hexdigest()


# ============================================================================ staging and its lock


@dataclasses.dataclass(frozen=True)
class Layout:
    out: Path
    partial: Path
    engine_dir: Path

    @property
    def tasks(self) -> Path:
        return self.engine_dir / TASKS_NAME

    @classmethod
    def of(cls, out: Path) -> "Layout":
        return cls(out, out.with_name(out.name + PARTIAL_SUFFIX), out.with_name(out.name + ENGINE_SUFFIX))


def _clear_engine_dir(d: Path) -> None:
    foreign = sorted(set(os.listdir(d)) - {ENGINE_NAME, TASKS_NAME, ENGINE_NAME + ".tmp"}) if d.is_dir() else []
    if foreign:
        raise ConfigError(f"{printable(str(d))} holds files fastload did not write ({', '.join(foreign[:5])}); move them away yourself")
    shutil.rmtree(d, ignore_errors=True)


def prepare(out: Path, fingerprint: str, *, resume: bool, overwrite: bool) -> tuple[Layout, WriterLock]:
    """Lock ``OUT.partial`` and make the staging area ready; a finished run's tasks are kept for ``resume``.

    Raises:
        ConfigError: OUT exists (without ``overwrite``), another process packs this OUT, an
            unfinished pack is there without ``resume``/``overwrite``, or it was started with
            other options or another schema.
    """
    check_out(out, overwrite)
    lay = Layout.of(out)
    try:
        lay.partial.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise PackError(f"{printable(str(lay.partial))}: cannot create it: {e.strerror or e}") from None
    lock = WriterLock.acquire(lay.partial, out)
    if lock is None:
        raise PackError(f"{printable(str(lay.partial))}: changed while fastload locked it; is another program using it?")
    try:
        state = None
        with contextlib.suppress(OSError, ValueError):
            state = json.loads((lay.engine_dir / ENGINE_NAME).read_bytes())
        left = os.listdir(lay.partial)
        if state is not None or left or lay.engine_dir.exists():
            ours = isinstance(state, dict) and state.get("format") == "fastload-engine"
            if resume and ours and state.get("fingerprint") != fingerprint:
                raise ConfigError(f"cannot resume {printable(str(out))}: it was started with other options, columns or fields; "
                                  "resume with the same ones, or start over with overwrite=True")  # fmt: skip
            if resume and not ours and not overwrite:
                raise ConfigError(f"cannot resume {printable(str(lay.partial))}: it is not an unfinished pack_ray/pack_spark "
                                  "pack (a fastload pack's, or one stopped before it began); start over with overwrite=True")  # fmt: skip
            if not resume and not overwrite:
                raise ConfigError(f"{printable(str(lay.partial))} holds an unfinished pack; continue it with resume=True "
                                  "or start over with overwrite=True")  # fmt: skip
            if not (resume and ours):
                _clear_engine_dir(lay.engine_dir)
            if remove_fastload_files(lay.partial):
                raise ConfigError(f"{printable(str(lay.partial))} holds files fastload did not write; move them away yourself")
        lay.tasks.mkdir(parents=True, exist_ok=True)
        atomic_write(lay.engine_dir / ENGINE_NAME, json.dumps({"format": "fastload-engine", "fingerprint": fingerprint}).encode())
    except BaseException:
        lock.release()
        raise
    return lay, lock


# ============================================================================ keys to their global place

_P_BRANCH, _P_LEAF = 0x01, 0x02
_U16, _U32, _U64 = struct.Struct("<H"), struct.Struct("<I"), struct.Struct("<Q")


def _main_root(fd: int) -> tuple[int, int]:
    """(page size, root page of the main database) from the newer of the two LMDB meta pages."""
    head = os.pread(fd, 160, 0)
    psize = _U32.unpack_from(head, 40)[0]
    if psize < 512 or psize & (psize - 1):
        raise ValueError(f"not an LMDB file (page size {psize})")
    metas = [head, os.pread(fd, 160, psize)]
    best = max(metas, key=lambda m: _U64.unpack_from(m, 144)[0])
    return psize, _U64.unpack_from(best, 128)[0]


def _nodes(page: bytes | bytearray) -> list[int]:
    lower = _U16.unpack_from(page, 12)[0]
    return [_U16.unpack_from(page, 16 + 2 * i)[0] for i in range((lower - 16) // 2)]


def _shift_keys(fd: int, psize: int, root: int, delta: int) -> None:
    """Add ``delta`` to every key of the B-tree under ``root`` (branch and leaf pages, in place)."""
    todo = [root]
    while todo:
        pgno = todo.pop()
        page = bytearray(os.pread(fd, psize, pgno * psize))
        flags = _U16.unpack_from(page, 10)[0]
        if not flags & (_P_BRANCH | _P_LEAF):
            raise ValueError(f"page {pgno}: not a branch or leaf page (flags {flags:#x})")
        for off in _nodes(page):
            if flags & _P_BRANCH:
                lo, hi, top = (_U16.unpack_from(page, off + 2 * k)[0] for k in range(3))
                todo.append(lo | hi << 16 | top << 32)
            ksize = _U16.unpack_from(page, off + 6)[0]
            if ksize == KEY.size:
                KEY.pack_into(page, off + 8, KEY.unpack_from(page, off + 8)[0] + delta)
            elif ksize or flags & _P_LEAF:
                raise ValueError(f"page {pgno}: a key of {ksize} bytes (fastload keys are {KEY.size})")
        os.pwrite(fd, bytes(page), pgno * psize)


def _first_key(fd: int, psize: int, root: int) -> int:
    pgno = root
    for _depth in range(64):
        page = os.pread(fd, psize, pgno * psize)
        off = _nodes(page)[0]
        if _U16.unpack_from(page, 10)[0] & _P_LEAF:
            return KEY.unpack_from(page, off + 8)[0]
        lo, hi, top = (_U16.unpack_from(page, off + 2 * k)[0] for k in range(3))
        pgno = lo | hi << 16 | top << 32
    raise ValueError("the B-tree is deeper than 64 levels")


def rekey_shard(job: tuple[str, int]) -> tuple[int, str]:
    """Give the records of shard ``job[0]`` the keys ``job[1], job[1]+1, ...`` (in place; idempotent:
    the shift is from the keys it holds); return its size and SHA-256 afterwards."""
    path, first = job
    fd = os.open(path, os.O_RDWR)
    try:
        psize, root = _main_root(fd)
        delta = first - _first_key(fd, psize, root)
        if delta:
            _shift_keys(fd, psize, root, delta)
            os.fsync(fd)
    except (ValueError, IndexError, struct.error) as e:
        raise PackError(f"{printable(path)}: cannot move its keys: {e}") from None
    finally:
        os.close(fd)
    return os.path.getsize(path), file_sha256(path)


def rekey_many(jobs: list[tuple[str, int]]) -> list[tuple[int, str]]:
    """:func:`rekey_shard` of several shards (one engine task for a batch of them)."""
    return [rekey_shard(j) for j in jobs]


# ============================================================================ the commit


class _Committed(Source):
    """What ``finalize`` needs to know of the rows: classes, schema, field statistics."""

    def __init__(self, plan: Plan, description: str) -> None:
        self.classes = list(plan.classes) if plan.classes is not None else None
        self.schema = plan.schema
        self.field_stats = FieldStats(plan.schema.stored)
        self.kind, self.description = "engine", description


def choose(receipts: list[dict[str, Any]], tasks: Path, expected: int | None) -> list[dict[str, Any]]:
    """One receipt per task index, in index order: the first attempt (by name) whose files are all there.

    Raises:
        PackError: a task index without a usable receipt (or fewer tasks than ``expected``).
    """
    by_index: dict[int, list[dict[str, Any]]] = {}
    for r in receipts:
        by_index.setdefault(int(r["index"]), []).append(r)
    n = max(by_index, default=-1) + 1 if expected is None else expected
    chosen = []
    for i in range(n):
        ok = [r for r in sorted(by_index.get(i, []), key=lambda r: r["dir"])
              if all(os.path.isfile(tasks / r["dir"] / s["file"]) for s in r["shards"]) and os.path.isfile(tasks / r["dir"] / SIDE_NAME)]  # fmt: skip
        if not ok:
            raise PackError(f"task {i} of {n} left no finished attempt in {printable(str(tasks))}; run the pack again with resume=True")
        chosen.append(ok[0])
    if len(by_index) > n or any(i >= n for i in by_index):
        raise PackError(f"receipts of tasks past the {n} expected ({sorted(by_index)[-1]}); the input changed while it was packed")
    return chosen


def _merge_stats(chosen: list[dict[str, Any]], tasks: Path, source: _Committed) -> HeaderStats:
    stats = HeaderStats()
    fs = source.field_stats
    for r in chosen:
        with np.load(tasks / r["dir"] / SIDE_NAME) as side:
            stats.labels.frombytes(side["labels"].astype(np.int32).tobytes())
            stats.widths.frombytes(side["widths"].astype(np.uint32).tobytes())
            stats.heights.frombytes(side["heights"].astype(np.uint32).tobytes())
            for i, name in enumerate(r["lengths"]):
                fs.lengths[name].extend(side[f"length{i}"].tolist())
        stats.encodings.update(r["encodings"])
        stats.flags.update(r["flags"])
        stats.payload_bytes += int(r["payload_bytes"])
        for name, v in r["lo"].items():
            fs.lo[name] = min(fs.lo.get(name, v), v)
        for name, v in r["hi"].items():
            fs.hi[name] = max(fs.hi.get(name, v), v)
    return stats


def _link(src: Path, dst: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        dst.unlink()
    try:
        os.link(src, dst)
    except OSError:  # no hard links here (some network file systems): a copy
        shutil.copyfile(src, dst)
        fsync_file(dst)


def commit(receipts: list[dict[str, Any]], lay: Layout, *, plan: Plan, spec: TaskSpec, options: dict[str, Any],
           overwrite: bool, description: str, fingerprint: str, expected: int | None = None,
           parallel_map: ParallelMap = local_map, batch: int = 16) -> Manifest:  # fmt: skip
    """Publish the tasks' shards as one dataset at ``lay.out`` (the caller holds the lock on ``lay.partial``).

    Raises:
        PackError: a task left no finished attempt, a shard changed since its task wrote it,
            nothing was packed, or publishing failed (what is staged is kept for ``resume``).
    """
    chosen = choose(receipts, lay.tasks, expected)
    jobs, shards, base, skipped = [], [], 0, []
    for r in chosen:
        for s in r["shards"]:
            jobs.append((str(lay.tasks / r["dir"] / s["file"]), base + int(s["first"])))
            shards.append((lay.tasks / r["dir"] / s["file"], base + int(s["first"]), int(s["count"])))
        base += int(r["count"])
        skipped += r["skipped"]
    if base == 0:
        first = f"; the first: {skipped[0]['path']}: {skipped[0]['reason']}" if skipped else ""
        raise PackError(f"nothing packed: all {len(skipped)} images were refused{first}")
    groups = [jobs[i : i + batch] for i in range(0, len(jobs), batch)]
    done = [x for g in parallel_map(rekey_many, groups) for x in g]
    remove_fastload_files(lay.partial)
    entries = []
    for k, ((src, first, count), (size, sha)) in enumerate(zip(shards, done)):
        _link(src, lay.partial / shard_name(k))
        entries.append({"file": shard_name(k), "first": first, "count": count, "bytes": size, "sha256": sha})
    source = _Committed(plan, description)
    stats = _merge_stats(chosen, lay.tasks, source)
    journal = Journal(description, fingerprint, options, shards=entries, skipped=skipped)
    manifest = finalize(lay.partial, lay.out, source, stats, journal, options, spec.on_error, overwrite, SourceGuard(source))
    shutil.rmtree(lay.engine_dir, ignore_errors=True)
    log.info("committed %d tasks, %d shards, %d samples to %s", len(chosen), len(entries), manifest.num_samples, printable(str(lay.out)))
    return manifest


# ============================================================================ one engine pack, start to end


def pack_with(engine: str, first: Mapping[str, Any], out: Any, *, run: Callable[[TaskSpec], tuple[list[dict[str, Any]], int | None]],
              parallel_map: ParallelMap, image_column: str | None, path_column: str | None,
              classes: Sequence[str] | None, fields: Mapping[str, Any] | None, options: dict[str, Any]) -> PackResult:  # fmt: skip
    """An engine pack: plan the columns from the ``first`` row, lock and prepare the staging area,
    ``run(spec)`` the write tasks (their receipts, and how many tasks there must be), commit.
    A URL OUT is packed into the staging directory under the cache, then uploaded (as ``pack`` does)."""
    import time

    t0 = time.monotonic()
    settings = engine_settings(out, options)
    plan = plan_columns(first, image_column=image_column, path_column=path_column, classes=classes, fields=fields)
    if settings.url is not None:
        from ...remote.upload import pack_to_url

        def run_local(staging: Path, mode: str) -> PackResult:
            if mode == "reuse":  # the staging pack was finished before its upload was cut
                m = Manifest.loads((staging / "manifest.json").read_bytes(), where=str(staging))
                return PackResult(path=staging, num_samples=m.num_samples, num_classes=len(m.classes), num_shards=len(m.shards),
                                  bytes=sum(s.bytes for s in m.shards), skipped=list(m.skipped), seconds=0.0)  # fmt: skip
            local = {**{k: v for k, v in options.items() if k != "storage_options"}, "overwrite": True, "resume": mode != "fresh"}
            return pack_with(engine, first, staging, run=run, parallel_map=parallel_map, image_column=image_column,
                             path_column=path_column, classes=classes, fields=fields, options=local)  # fmt: skip

        key = json.dumps([engine, _row_digest(first), {k: v for k, v in options.items() if k != "storage_options"}], default=repr)
        res, _stats = pack_to_url(settings.url, run_local, source_key=key, source=f"{engine} rows", overwrite=settings.overwrite,
                                  resume=settings.resume, storage_options=settings.storage_options)  # fmt: skip
        return dataclasses.replace(res, url=settings.url, seconds=time.monotonic() - t0)
    opts = {**manifest_options(settings, not plan.schema.plain), "engine": engine}
    fingerprint = run_fingerprint(plan, opts, engine)
    lay, lock = prepare(settings.out, fingerprint, resume=settings.resume, overwrite=settings.overwrite)
    try:
        spec = TaskSpec(str(lay.tasks.resolve()), plan.image_column, plan.path_column, plan.fields(), plan.classes, settings.image,
                        settings.shard_size, settings.on_error, fingerprint, settings.resume)  # fmt: skip
        receipts, expected = run(spec)
        m = commit(receipts, lay, plan=plan, spec=spec, options=opts, overwrite=settings.overwrite, description=f"{engine} rows",
                   fingerprint=fingerprint, expected=expected, parallel_map=parallel_map)  # fmt: skip
    finally:
        lock.release()
    return PackResult(path=settings.out, num_samples=m.num_samples, num_classes=len(m.classes), num_shards=len(m.shards),
                      bytes=sum(s.bytes for s in m.shards), skipped=list(m.skipped), seconds=time.monotonic() - t0)  # fmt: skip


__all__ = ["pack_with", "Plan", "Layout", "plan_columns", "run_fingerprint", "prepare", "commit", "choose", "rekey_shard", "rekey_many",
           "local_map", "ENGINE_NAME", "ENGINE_SUFFIX"]  # fmt: skip
