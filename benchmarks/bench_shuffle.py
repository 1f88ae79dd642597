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

``--train DIR`` measures training instead: a small CNN on the image folder ``DIR`` (packed class by
class), the global shuffle against ``order="shards"`` at each ``--windows``, the same seeds, the
model's loss and accuracy over the whole dataset every ``--every`` steps.

Usage::

    python benchmarks/bench_shuffle.py --streaming /tmp/streaming --out benchmarks/results/remote/shuffle.md
    python benchmarks/bench_shuffle.py --train SAMPLE --shard-size 1MB --batch 32 --windows 1 4 16 --lr 0.01 \
        --out benchmarks/results/remote/shuffle-training.md
"""

from __future__ import annotations

import argparse
import importlib
import logging
import sys
import time
import types
from pathlib import Path
from typing import Any

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


def evaluate(model: Any, loader: Any) -> tuple[float, float]:
    """Mean cross-entropy and accuracy of ``model`` over every batch of ``loader``."""
    import torch

    total, right, n = 0.0, 0, 0
    with torch.no_grad():
        for x, y in loader:
            out = model(x.float())
            total += float(torch.nn.functional.cross_entropy(out, y, reduction="sum"))
            right += int((out.argmax(1) == y).sum())
            n += len(y)
    return total / n, right / n


def train_curve(packed: Path, order: str, window: int | None, args: argparse.Namespace) -> list[tuple[float, float]]:
    """A small CNN trained on ``packed`` read in ``order`` (seed 0): after every ``--every`` steps, its loss
    and accuracy over the whole dataset (centre crops, no augmentation)."""
    import torch
    from torch import nn

    from fastload import FastLoader

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, stride=2, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10),
    )  # fmt: skip
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    kw = {"order": order} if window is None else {"order": order, "window": window}
    points: list[tuple[float, float]] = []
    steps = 0
    with FastLoader(packed, args.batch, device="cpu", crop=64, train=True, seed=0, **kw) as loader, \
            FastLoader(packed, 100, device="cpu", crop=64, train=False, shuffle=False) as whole:  # fmt: skip
        epoch = 0
        while steps < args.steps:
            loader.set_epoch(epoch)
            for x, y in loader:
                loss = nn.functional.cross_entropy(model(x.float()), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                steps += 1
                if steps % args.every == 0:
                    points.append(evaluate(model, whole))
                if steps == args.steps:
                    break
            epoch += 1
    return points


def train_table(args: argparse.Namespace) -> None:
    """``--train DIR``: the loss curves of a small CNN, global shuffle against ``order="shards"``, as a table."""
    import tempfile

    import fastload

    with tempfile.TemporaryDirectory(prefix="bench-shuffle-") as tmp:
        packed = Path(tmp) / "packed"
        fastload.pack(args.train, packed, shard_size=args.shard_size, progress=False)
        shards = len(fastload.Dataset(packed).manifest.shards)
        runs = [("global", "global", None)] + [(f"shards W={w}", "shards", w) for w in args.windows]
        curves = {}
        for name, order, window in runs:
            t = time.perf_counter()
            curves[name] = train_curve(packed, order, window, args)
            log.info("%s: %s (%.0f s)", name, curves[name], time.perf_counter() - t)
    names = list(curves)
    lines = [
        "# Training loss: global shuffle against `order=\"shards\"` (same seed)",
        "",
        f"- data: `{args.train.name}`, photos of `fastload sample` (10 classes), packed class by class in {shards} "
        f"shards of {args.shard_size}.",
        f"- model: 3 conv layers (16-32-64, stride 2) + linear, SGD lr {args.lr} momentum 0.9, torch seed 0; FastLoader "
        f"crop 64, train=True, seed 0, batch {args.batch}; {args.steps} steps on the CPU; "
        f"`benchmarks/bench_shuffle.py --train`.",
        f"- each cell: after that many steps, the model's cross-entropy over the whole dataset (centre crops, "
        "no augmentation) and its accuracy in brackets; a batch's own loss is not comparable between orders "
        "(a window's batches hold few classes).",
        "",
        "| steps | " + " | ".join(names) + " |",
        "|---|" + "---:|" * len(names),
    ]
    for i in range(len(curves[names[0]])):
        cells = " | ".join(f"{curves[n][i][0]:.3f} ({curves[n][i][1]:.2f})" for n in names)
        lines.append(f"| {(i + 1) * args.every} | {cells} |")
    text = "\n".join(lines) + "\n"
    log.info(text)
    if args.out:
        args.out.write_text(text)


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
    ap.add_argument("--train", type=Path, default=None, help="an image folder: the loss curves instead (--batch, --windows)")
    ap.add_argument("--shard-size", default="512KB", help="with --train: the packed shards' size")
    ap.add_argument("--steps", type=int, default=300, help="with --train: optimizer steps per order")
    ap.add_argument("--every", type=int, default=25, help="with --train: steps per row of the table")
    ap.add_argument("--lr", type=float, default=0.02, help="with --train: SGD's learning rate")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.train is not None:
        return train_table(args)
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
