"""``pack_spark``: a Spark DataFrame packed by its own tasks (``mapInPandas``), committed on the driver.

Each partition is one write task, its index the partition's (the DataFrame's order: partition
``i`` holds the rows before partition ``i + 1``'s); a retried or speculative attempt writes into
a directory of its own, and the commit takes one attempt per partition.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any, Iterator, Mapping, Sequence

from ...errors import ConfigError, DependencyError
from ..run import PackResult
from .commit import pack_with
from .task import TaskSpec, write_task

log = logging.getLogger(__name__)


def _spark_task(spec: TaskSpec) -> Any:
    def run(batches: Iterator[Any]) -> Iterator[Any]:
        import pandas as pd
        from pyspark import TaskContext

        index = TaskContext.get().partitionId()
        rows = (r for b in batches for r in b.to_dict("records"))
        receipt = write_task(rows, index, spec)
        yield pd.DataFrame({"index": [index], "receipt": [json.dumps(receipt)]})

    return run


def pack_spark(
    df: Any,
    out: str | os.PathLike,
    *,
    image_column: str | None = None,
    path_column: str | None = None,
    classes: Sequence[str] | None = None,
    fields: Mapping[str, Any] | None = None,
    **options: Any,
) -> PackResult:
    """Pack a ``pyspark.sql.DataFrame`` into ``out`` with Spark's executors; see ``docs/packing.md``.

    The rows are as for :func:`fastload.pack_ray` (an image column of bytes or paths, a ``label``,
    other columns as typed fields, a ``path`` column for the stored names). ``options`` are
    :func:`fastload.pack`'s (``workers`` is ignored: one task per partition).
    """
    try:
        import pyspark  # noqa: F401
    except ImportError as e:
        raise DependencyError(f"pack_spark needs PySpark ({e}); pip install 'fastload[spark]'") from None
    options = {k: v for k, v in options.items() if k != "workers"}
    first = df.limit(1).toPandas().to_dict("records")
    if not first:
        raise ConfigError("df: the DataFrame has no rows; nothing to pack")
    sc = df.sparkSession.sparkContext

    def run(spec: TaskSpec) -> tuple[list[dict[str, Any]], int | None]:
        nparts = df.rdd.getNumPartitions()
        rows = df.mapInPandas(_spark_task(spec), schema="index long, receipt string").collect()
        return [json.loads(r["receipt"]) for r in rows], nparts

    def parallel_map(fn: Any, items: list) -> list:
        return sc.parallelize(items, max(1, min(len(items), sc.defaultParallelism * 4))).map(fn).collect() if items else []

    return pack_with("spark", first[0], out, run=run, parallel_map=parallel_map, image_column=image_column,
                     path_column=path_column, classes=classes, fields=fields, options=options)  # fmt: skip


__all__ = ["pack_spark"]
