"""Shard-aware shuffles: one module per algorithm, each a pure function of the shard layout and a seeded generator.

:mod:`fastload.sampler` is the one place that decides an epoch's order; it calls these.

* :mod:`fastload.shuffle.shards`: ``order="shards"``, shards permuted, samples mixed within a
  window of consecutive shards that slides along the epoch (and the window a cache can hold).
"""
