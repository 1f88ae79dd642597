"""Benchmark: how random ``order="shards"`` is, against the global shuffle and Streaming's ``py1e``, on one shard layout.

Pure NumPy, no data read: the epoch orders of ``EpochSampler`` (global; shards with windows of
``W`` shards) and of MosaicML Streaming's ``get_shuffle_py1e`` (one canonical node, its
``shuffle_block_size`` set to ``W`` shards' samples, the same spread) over the same layout: an
ImageNet-like class-sorted dataset (``--classes`` x ``--per-class`` samples, packed in class order,
as ``fastload pack`` stores an ImageFolder) in shards of ``--shard`` samples. Per batch of
``--batch``: distinct shards, distinct classes, and how far apart in the packed order two samples
of the batch are (mean ``|i - j|`` over the batch's pairs, as a share of the dataset; a uniform
shuffle gives 1/3). Over the epoch: the most shards open at once (first to last sample). Means
over ``--epochs`` epochs.

Streaming is loaded from a directory it was installed in for this benchmark only
(``pip install --no-deps --target DIR mosaicml-streaming``; ``--streaming DIR``): only its
``shuffle`` modules are imported, not the package (which needs its own dependencies).

Usage::

    python benchmarks/bench_shuffle.py --streaming /tmp/streaming --out benchmarks/results/remote/shuffle.md
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

log = logging.getLogger("bench_shuffle")


def load_py1e(where: Path):
    """Streaming's ``get_shuffle_py1e``, its package's ``__init__`` skipped (empty package stubs)."""
    for name in ("streaming", "streaming.base", "streaming.base.shuffle"):
        mod = types.ModuleType(name)
        mod.__path__ = [str(where / name.replace(".", "/"))]
        sys.modules[name] = mod
    return importlib.import_module("streaming.base.shuffle.py1e").get_shuffle_py1e


def batch_stats(order: np.ndarray, counts: np.ndarray, labels: np.ndarray, batch: int) -> dict[str, float]:
    n = len(order)
    shard = np.searchsorted(np.cumsum(counts), order, side="right")
    nb = n // batch
    b_idx = order[: nb * batch].reshape(nb, batch)
    b_shard = shard[: nb * batch].reshape(nb, batch)
    b_label = labels[order[: nb * batch]].reshape(nb, batch)
    shards = np.mean([len(np.unique(r)) for r in b_shard])
    classes = np.mean([len(np.unique(r)) for r in b_label])
    # mean |i - j| over pairs: from the sorted batch, sum_k (2k - m + 1) x_k / (m (m - 1) / 2)
    s = np.sort(b_idx, axis=1).astype(np.float64)
    w = 2 * np.arange(batch) - batch + 1
    dist = float(np.mean((s * w).sum(axis=1) / (batch * (batch - 1) / 2)) / n)
    first = np.full(len(counts), n)
    last = np.full(len(counts), -1)
    np.minimum.at(first, shard, np.arange(n))
    np.maximum.at(last, shard, np.arange(n))
    live = np.zeros(n + 1, dtype=np.int64)
    np.add.at(live, first, 1)
    np.add.at(live, last + 1, -1)
    return {"shards": float(shards), "classes": float(classes), "dist": dist, "open": int(np.cumsum(live).max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--classes", type=int, default=1000)
    ap.add_argument("--per-class", type=int, default=128)
    ap.add_argument("--shard", type=int, default=1000, help="samples per shard")
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--windows", type=int, nargs="+", default=[2, 8, 32])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--streaming", type=Path, default=None, help="a directory mosaicml-streaming was installed in")
    ap.add_argument("--out", type=Path, default=None)
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from fastload.sampler import EpochSampler

    n = args.classes * args.per_class
    counts = np.array([args.shard] * (n // args.shard) + ([n % args.shard] if n % args.shard else []), dtype=np.int64)
    labels = np.repeat(np.arange(args.classes), args.per_class)
    py1e = load_py1e(args.streaming) if args.streaming else None
    rows: list[tuple[str, dict, float]] = []

    def measure(name: str, make) -> None:
        stats, secs = [], []
        for epoch in range(args.epochs):
            t = time.perf_counter()
            order = np.asarray(make(epoch), dtype=np.int64)
            secs.append(time.perf_counter() - t)
            assert np.array_equal(np.sort(order), np.arange(n))
            stats.append(batch_stats(order, counts, labels, args.batch))
        mean = {k: float(np.mean([s[k] for s in stats])) for k in stats[0]}
        mean["open"] = max(s["open"] for s in stats)
        rows.append((name, mean, float(np.median(secs))))
        log.info("%s: %s, %.2f s an epoch", name, mean, np.median(secs))

    kw = dict(num_samples=n, batch_size=args.batch, seed=0)
    measure("global", EpochSampler(**kw).base_order)
    for w in args.windows:
        measure(f"shards W={w}", EpochSampler(**kw, order="shards", window=w, shard_sizes=counts.tolist()).base_order)
        if py1e is not None:
            import warnings

            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                measure(f"py1e block={w * args.shard}", lambda e, w=w: py1e(counts, 1, 0, e, w * args.shard))
    lines = [
        "# How random `order=\"shards\"` is: against the global shuffle and Streaming's `py1e`",
        "",
        f"- layout: {n:,} samples, {args.classes} classes of {args.per_class}, stored class by class, in "
        f"{len(counts)} shards of {args.shard} samples; batches of {args.batch}; means over {args.epochs} epochs "
        "(seed 0); `benchmarks/bench_shuffle.py`.",
        "- `py1e`: mosaicml-streaming's `get_shuffle_py1e` with one canonical node and `shuffle_block_size` = W "
        "shards' samples (a shard's samples spread over about W shards' worth of positions, as `W` here).",
        "- pair distance: mean `|i - j|` over the pairs of a batch, in the packed order, as a share of the "
        "dataset (a uniform shuffle: 1/3). Open shards: the most shards between their first and last sample "
        "at one position of the epoch (the working set a cache must hold, before the batches in flight).",
        "",
        "| order | distinct shards a batch | distinct classes a batch | pair distance | most shards open | s an epoch |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for name, m, secs in rows:
        lines.append(f"| {name} | {m['shards']:.1f} | {m['classes']:.1f} | {m['dist']:.4f} | {m['open']} | {secs:.2f} |")
    text = "\n".join(lines) + "\n"
    log.info(text)
    if args.out:
        args.out.write_text(text)


if __name__ == "__main__":
    main()
