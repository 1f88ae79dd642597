"""``pack_ray``: a Ray Data dataset packed by Ray's own write tasks (a ``Datasink``), committed on the driver.

Why a function and not only ``ds.write_datasink(...)``: a fastload pack needs, before any task
runs, the schema (from the first row) and the lock on OUT, and after the last one a commit that
moves keys on the workers; ``pack_ray`` does those around ``ds.write_datasink`` and returns a
:class:`~fastload.packing.PackResult` as ``pack`` does. The write tasks run with
``preserve_order`` set, so a task's index (``TaskContext.task_idx``, kept by retries) is its
place in the input's order.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Iterable, Mapping, Sequence

from ...errors import DependencyError, PackError
from ..run import PackResult
from .commit import pack_with
from .task import TaskSpec, write_task

log = logging.getLogger(__name__)


def _import_ray() -> Any:
    try:
        import ray
        import ray.data
    except ImportError as e:
        raise DependencyError(f"pack_ray needs Ray Data ({e}); pip install 'fastload[ray]'") from None
    return ray


def _rows(blocks: Iterable[Any]) -> Iterable[dict[str, Any]]:
    from ray.data.block import BlockAccessor

    for b in blocks:
        yield from BlockAccessor.for_block(b).to_pandas().to_dict("records")


def make_datasink(spec: TaskSpec) -> Any:
    """A ``ray.data.Datasink`` whose write tasks run :func:`write_task`; ``receipts`` holds theirs after the write."""
    ray = _import_ray()

    class FastloadDatasink(ray.data.Datasink):
        def __init__(self) -> None:
            self.receipts: list[dict[str, Any]] = []
            self.num_rows = 0

        def write(self, blocks: Iterable[Any], ctx: Any) -> dict[str, Any]:
            return write_task(_rows(blocks), int(ctx.task_idx), spec)

        def on_write_complete(self, write_result: Any) -> None:
            self.receipts = list(write_result.write_returns)
            self.num_rows = int(write_result.num_rows)

        def get_name(self) -> str:
            return "FastloadShards"

    return FastloadDatasink()


def _ray_map(fn: Any, items: list) -> list:
    ray = _import_ray()
    remote = ray.remote(fn)
    return ray.get([remote.remote(x) for x in items])


def pack_ray(
    ds: Any,
    out: str | os.PathLike,
    *,
    image_column: str | None = None,
    path_column: str | None = None,
    classes: Sequence[str] | None = None,
    fields: Mapping[str, Any] | None = None,
    **options: Any,
) -> PackResult:
    """Pack a ``ray.data.Dataset`` into ``out`` with Ray's workers; see ``docs/packing.md``.

    Each row holds an image (``image_column``: encoded bytes, a uint8 array, or a path the workers
    can read; default the ``image`` column, else ``bytes``), optionally a ``label`` and other columns
    (typed fields, as ``pack_dataset`` infers or ``fields`` declares them) and a ``path`` column
    (``path_column``: each record's stored name and what skip reasons name). Each write task
    writes complete shards of its own; the driver commits them in the input's order: a retried
    task counts once, a re-run with ``resume=True`` reuses finished tasks (verified by hash).
    ``options`` are :func:`fastload.pack`'s (``workers`` is ignored: Ray decides the parallelism).
    """
    ray = _import_ray()
    options = {k: v for k, v in options.items() if k != "workers"}
    first = ds.limit(1).to_pandas().to_dict("records")
    if not first:
        from ...errors import ConfigError

        raise ConfigError("ds: the dataset has no rows; nothing to pack")

    def run(spec: TaskSpec) -> tuple[list[dict[str, Any]], int | None]:
        sink = make_datasink(spec)
        ctx = ray.data.DataContext.get_current()
        before = ctx.execution_options.preserve_order
        ctx.execution_options.preserve_order = True
        try:
            ds.write_datasink(sink)
        finally:
            ctx.execution_options.preserve_order = before
        rows = {int(r["index"]): int(r["rows"]) for r in sink.receipts}
        if sum(rows.values()) != sink.num_rows or sorted(rows) != list(range(len(rows))):
            raise PackError(f"the write tasks' receipts cover {sum(rows.values())} rows in tasks {sorted(rows)[:5]}..., "
                            f"Ray wrote {sink.num_rows}; nothing was published: run again with resume=True")  # fmt: skip
        return sink.receipts, len(rows)

    return pack_with("ray", first[0], out, run=run, parallel_map=_ray_map,
                     image_column=image_column, path_column=path_column, classes=classes, fields=fields, options=options)  # fmt: skip


__all__ = ["pack_ray", "make_datasink"]
