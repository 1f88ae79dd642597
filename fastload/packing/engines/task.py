"""One engine task: its rows become complete, verified shards in a directory of its own, then a receipt.

A write task of Ray Data or Spark calls :func:`write_task` with the rows it was given and its
index in the input's order. Every row goes through what ``pack_dataset`` does to an item
(:mod:`fastload.packing.samples`: the label and field checks; :mod:`fastload.packing.workers`:
the per-image checks, skip reasons and record format) and into a :class:`ShardWriter` whose
keys start at 0 (the commit moves them to their global place). The task writes into
``TASKS/t<index>-<attempt>/``, a directory no other attempt uses, and its receipt
(``receipt.json``) is the last file it writes: an attempt killed mid-shard leaves ``*.tmp``
files and no receipt, and the commit never takes a shard without one.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import uuid
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping

import numpy as np
import xxhash

from ...errors import BadImageError, PackError, printable
from ...fields import decode_block, parse_spec
from ...format import decode_header, json_path, with_field_block
from ...store import HeaderStats, file_sha256
from ..images import ImageOptions
from ..journal import atomic_write
from ..samples import FieldSource, check_label, schema_of
from ..shards import ShardWriter
from ..sources import Task, image_task
from ..workers import Results

log = logging.getLogger(__name__)

RECEIPT_NAME = "receipt.json"
SIDE_NAME = "stats.npz"
RECEIPT_FORMAT = "fastload-engine-task"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    """What every write task of one engine pack needs (pickled to the workers)."""

    tasks_dir: str  #: where the attempts' directories go (``OUT.engine/tasks``)
    image_column: str
    path_column: str | None
    fields: tuple[tuple[str, str], ...]  #: every field but the image: (name, spec), in order
    classes: tuple[str, ...] | None
    opts: ImageOptions
    shard_size: int
    on_error: str
    fingerprint: str  #: of the options, schema and classes: a receipt of another run is never reused
    resume: bool = False

    @property
    def names(self) -> list[str]:
        return ["image", *(n for n, _ in self.fields)]


def task_dir_prefix(index: int) -> str:
    """The start of the directory names of task ``index``'s attempts."""
    return f"t{index:09d}-"


class RowSource(FieldSource):
    """A task's rows as a source of image tasks, each checked as ``pack_dataset`` checks a dict item."""

    def __init__(self, spec: TaskSpec, rows: list[dict[str, Any]], names: list[str | None], index: int) -> None:
        order = spec.names
        self.schema = schema_of(dict.fromkeys(order), {n: parse_spec(n, s) for n, s in spec.fields}, where="rows", order=order)
        super().__init__()
        self.rows, self.row_names, self.index = rows, names, index
        self.classes = list(spec.classes) if spec.classes is not None else None
        self.kind, self.description = "rows", f"task {index}"

    def __len__(self) -> int:
        return len(self.rows)

    def fingerprint(self) -> str:  # pragma: no cover - a task is never resumed through a journal
        return ""

    def tasks(self, start: int = 0) -> Iterator[Task]:
        for i in range(start, len(self.rows)):
            yield self.task(i)

    def task(self, i: int) -> Task:
        item, name = self.rows[i], self.row_names[i]
        where = name or f"task {self.index} row {i}"
        image = item.get("image")
        if image is None:
            return ("error", "the row has no image", 0, where, where)
        label = check_label(item["label"], where, self.classes) if self.schema.has_label else 0
        if isinstance(image, str):  # a path the worker reads: the same checks as a packed folder's files
            task: Task = ("file", image, label, name or image, name or image)
        else:
            task = image_task(image, label, where)
        if task[0] != "error":
            self.keep_block(i, item, where)
        return task


def split_row(row: Mapping[str, Any], spec: TaskSpec) -> tuple[dict[str, Any], str | None]:
    """A row as ``pack_dataset``'s dict item (the image column named ``image``) and its stored name."""
    item = {"image": row[spec.image_column]}
    for n, _ in spec.fields:
        item[n] = row[n]
    name = None
    if spec.path_column is not None and row.get(spec.path_column) is not None:
        name = str(row[spec.path_column])
    return item, name


def _feed(h: Any, v: Any) -> None:
    if isinstance(v, str):
        h.update(b"s" + v.encode("utf-8", "surrogateescape"))
    elif isinstance(v, (bytes, bytearray, memoryview)):
        h.update(b"b" + len(v).to_bytes(8, "little"))
        h.update(v)
    elif v is None:
        h.update(b"n")
    else:
        a = np.asarray(v)
        h.update(f"a{a.dtype.str}{a.shape}".encode())
        h.update(np.ascontiguousarray(a).tobytes() if a.dtype != object else repr(a.tolist()).encode())


def input_digest(items: list[dict[str, Any]], names: list[str | None]) -> str:
    """XXH3-128 of a task's rows (every value, in order): a resumed task is reused only for the same rows."""
    h = xxhash.xxh3_128()
    for item, name in zip(items, names):
        _feed(h, name)
        for k in sorted(item):
            _feed(h, k)
            _feed(h, item[k])
    return h.hexdigest()


def _verified(receipt: dict[str, Any], tdir: Path) -> bool:
    """Whether every shard and the side file of a receipt are there with their recorded hashes."""
    try:
        if file_sha256(tdir / SIDE_NAME) != receipt["side_sha256"]:
            return False
        return all(os.path.getsize(tdir / s["file"]) == s["bytes"] and file_sha256(tdir / s["file"]) == s["sha256"]
                   for s in receipt["shards"])  # fmt: skip
    except (OSError, KeyError, TypeError):
        return False


def load_receipt(tdir: Path) -> dict[str, Any] | None:
    """The receipt in an attempt's directory, or None (no receipt: a killed or running attempt)."""
    try:
        d = json.loads((tdir / RECEIPT_NAME).read_bytes())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("format") == RECEIPT_FORMAT else None


def _earlier(spec: TaskSpec, index: int, digest: str) -> dict[str, Any] | None:
    """A finished attempt of this task from an earlier run of the same pack, verified by hash."""
    top = Path(spec.tasks_dir)
    try:
        dirs = sorted(d for d in os.listdir(top) if d.startswith(task_dir_prefix(index)))
    except OSError:
        return None
    for d in dirs:
        r = load_receipt(top / d)
        if r and r.get("fingerprint") == spec.fingerprint and r.get("input") == digest and _verified(r, top / d):
            return r
    return None


def write_task(rows: Iterable[Mapping[str, Any]], index: int, spec: TaskSpec) -> dict[str, Any]:
    """Pack one task's rows into shards of its own; return its receipt (also written, last, as a file).

    With ``spec.resume``, an earlier attempt's receipt for the same rows is returned instead,
    after its files are verified by hash.

    Raises:
        BadImageError: ``on_error="fail"`` and a row's image was refused.
        ConfigError: a row's label or field does not fit the schema (naming the row).
    """
    items, names = [], []
    for row in rows:
        item, name = split_row(row, spec)
        items.append(item)
        names.append(name)
    digest = input_digest(items, names)
    if spec.resume:
        old = _earlier(spec, index, digest)
        if old is not None:
            log.info("task %d: reusing %s (%d shards, verified)", index, old["dir"], len(old["shards"]))
            return old
    attempt = uuid.uuid4().hex[:12]
    tdir = Path(spec.tasks_dir) / f"{task_dir_prefix(index)}{attempt}"
    tdir.mkdir(parents=True)
    source = RowSource(spec, items, names, index)
    stats = HeaderStats()
    done, skipped = _write_rows(source, spec, tdir, stats)
    return _finish(tdir, spec, index, attempt, digest, len(items), done, skipped, stats, source)


def _write_rows(source: RowSource, spec: TaskSpec, tdir: Path, stats: HeaderStats) -> tuple[list, list[dict[str, str]]]:
    """The pack loop of ``run._write`` over one task's rows: records in row order, skips listed."""
    writer = ShardWriter(tdir, shard_size=spec.shard_size)
    fielded = not source.schema.plain
    skipped: list[dict[str, str]] = []
    results = Results(source.tasks(0), spec.opts, 1)
    try:
        for pos, res in enumerate(results):
            block = source.take_block(pos) if fielded else None
            if isinstance(res, tuple):
                _tag, where, reason = res
                if spec.on_error == "fail":
                    raise BadImageError(where, reason)
                skipped.append({"path": json_path(where), "reason": reason})
                log.debug("skipped %s: %s", where, reason)
                continue
            if block is not None:
                res = with_field_block(res, block)
                source.field_stats.add(decode_block(source.schema.stored, block, check=False))
            stats.add(decode_header(res))
            writer.add(res, pos)
        writer.close(len(source))
    except BaseException:
        writer.abort()
        raise
    finally:
        results.close()
    return writer.done, skipped


def _finish(tdir: Path, spec: TaskSpec, index: int, attempt: str, digest: str, nrows: int, done: list, skipped: list,
            stats: HeaderStats, source: RowSource) -> dict[str, Any]:  # fmt: skip
    """Write the side file (labels, sizes, field lengths), then the receipt; return the receipt."""
    fs = source.field_stats
    arrays = {"labels": np.frombuffer(stats.labels, dtype=np.int32), "widths": np.frombuffer(stats.widths, dtype=np.uint32),
              "heights": np.frombuffer(stats.heights, dtype=np.uint32)}  # fmt: skip
    for i, (_name, lengths) in enumerate(fs.lengths.items()):
        arrays[f"length{i}"] = np.asarray(lengths, dtype=np.int64)
    try:
        with open(tdir / SIDE_NAME, "wb") as f:
            np.savez(f, **arrays)
            f.flush()
            os.fsync(f.fileno())
        receipt = {
            "format": RECEIPT_FORMAT, "version": 1, "index": index, "attempt": attempt, "dir": tdir.name,
            "fingerprint": spec.fingerprint, "input": digest, "rows": nrows, "count": len(stats.labels),
            "shards": [s.to_json() for s in done], "skipped": skipped,
            "encodings": dict(stats.encodings), "flags": dict(stats.flags), "payload_bytes": stats.payload_bytes,
            "lengths": list(fs.lengths), "lo": fs.lo, "hi": fs.hi, "side_sha256": file_sha256(tdir / SIDE_NAME),
        }  # fmt: skip
        atomic_write(tdir / RECEIPT_NAME, json.dumps(receipt).encode())
    except OSError as e:
        raise PackError(f"{printable(str(tdir))}: cannot write the task's receipt: {e.strerror or e}") from None
    return receipt


__all__ = ["TaskSpec", "RowSource", "write_task", "load_receipt", "input_digest", "split_row", "task_dir_prefix",
           "RECEIPT_NAME", "SIDE_NAME"]  # fmt: skip
