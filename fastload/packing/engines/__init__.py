"""Packing on many machines: Ray Data and Spark write the shards, one commit publishes them.

    task.py      one write task: its rows -> shards of its own, a receipt (the same checks and writer as pack)
    commit.py    the driver: staging area and lock, keys moved to their global place, the manifest
    ray_data.py  pack_ray: a ray.data.Dataset through a Datasink
    spark.py     pack_spark: a pyspark DataFrame through mapInPandas

Ray and PySpark are imported only when ``pack_ray`` / ``pack_spark`` is called.
"""

from __future__ import annotations

from typing import Any


def pack_ray(ds: Any, out: Any, **kwargs: Any) -> Any:
    """:func:`fastload.packing.engines.ray_data.pack_ray` (Ray imported on the call)."""
    from .ray_data import pack_ray as run

    return run(ds, out, **kwargs)


def pack_spark(df: Any, out: Any, **kwargs: Any) -> Any:
    """:func:`fastload.packing.engines.spark.pack_spark` (PySpark imported on the call)."""
    from .spark import pack_spark as run

    return run(df, out, **kwargs)


__all__ = ["pack_ray", "pack_spark"]
