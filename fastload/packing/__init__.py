"""Packing: an image folder, a list file or a Python dataset into LMDB shards plus a manifest.

One job per module, each importing only the ones below it::

    run.py       pack() / pack_dataset() / pack_like_pil_loader(): options, the main loop, progress, PackResult
    outdir.py    OUT and OUT.partial: overwrite/resume rules, shard reuse, labels, manifest, rename
    workers.py   the worker pool: tasks -> records in source order
    shards.py    ShardWriter: size rollover, temp name, fsync, hash, rename
    journal.py   the resume journal; fsync, atomic-write, lock and thread-start helpers
    images.py    one image -> its stored form: JPEG header scan, EXIF, conversion, resize, limits
    sources.py   what to pack: ImageFolder scan, list files, Python datasets -> tasks

Reading finished shards (a resumed pack re-reads the ones it keeps) goes through the
read side, :mod:`fastload.store`; nothing on the read side imports this package.
"""

from __future__ import annotations

from .run import PackResult, pack, pack_dataset, parse_size

__all__ = ["pack", "pack_dataset", "PackResult", "parse_size"]
