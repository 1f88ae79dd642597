"""Packing: an image folder, a list file or a Python dataset into LMDB shards plus a manifest.

One job per module, each importing only the ones below it::

    run.py       pack() / pack_dataset() / pack_like_pil_loader(): options, the main loop, progress, PackResult
    outdir.py    OUT and OUT.partial: overwrite/resume rules, shard reuse, labels, manifest, rename
    workers.py   the worker pool: tasks -> records in source order
    shards.py    ShardWriter: size rollover, temp name, fsync, hash, rename
    journal.py   the resume journal; fsync, atomic-write, lock and thread-start helpers
    images.py    one image -> its stored form: JPEG header scan, EXIF, conversion, resize, limits
    sources.py   what to pack: ImageFolder scan, list files, Python datasets -> tasks
    samples.py   samples with typed fields: schema inferred and checked, field blocks; dict datasets
    convert_wds.py      WebDataset tar shards as a source (members grouped by key, extensions as fields)
    convert_parquet.py  Parquet files and datasets' save_to_disk directories as a source
    engines/     pack_ray / pack_spark: Ray Data and Spark write the shards, one commit publishes them
    coco.py      COCO instances_*.json over an image directory: boxes, labels, iscrowd per image

Reading finished shards (a resumed pack re-reads the ones it keeps) goes through the
read side, :mod:`fastload.store`; nothing on the read side imports this package.
"""

from __future__ import annotations

from .engines import pack_ray, pack_spark
from .run import PackResult, detect_source, pack, pack_coco, pack_dataset, pack_parquet, pack_webdataset, parse_size

__all__ = ["pack_ray", "pack_spark", "pack", "pack_dataset", "pack_webdataset", "pack_parquet", "pack_coco", "detect_source", "PackResult", "parse_size"]
