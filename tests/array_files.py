"""Write CIFAR-10/100 python batches and MNIST idx files whose pixels encode each image's index (test fixtures)."""

from __future__ import annotations

import hashlib
import pickle
import struct
from pathlib import Path

import numpy as np

CIFAR10_NAMES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck"]


def index_images(n: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """``n`` uint8 images of ``shape`` (HWC or HW): seeded noise, each with its index in its first pixels."""
    rng = np.random.default_rng(seed)
    imgs = rng.integers(0, 256, size=(n, *shape), dtype=np.uint8)
    flat = imgs.reshape(n, -1)
    flat[:, 0] = np.arange(n) % 256
    flat[:, 1] = np.arange(n) // 256
    return imgs


def _md5(path: Path) -> str:
    return hashlib.md5(path.read_bytes()).hexdigest()


def write_cifar(root: Path, *, n_batch: int, n_test: int, hundred: bool = False, seed: int = 0) -> dict:
    """CIFAR-10 (or -100) files under ``root``: five training batches of ``n_batch`` images and a test batch.

    Returns the class attributes (``train_list``, ``test_list``, ``meta``) naming the files with their MD5s, for
    the test to set on torchvision's class (its own MD5s are the real files').
    """
    folder = root / ("cifar-100-python" if hundred else "cifar-10-batches-py")
    folder.mkdir(parents=True, exist_ok=True)
    classes = 100 if hundred else 10
    key = "fine_labels" if hundred else "labels"
    rng = np.random.default_rng(seed + 1)
    names = ["train"] if hundred else [f"data_batch_{k}" for k in range(1, 6)]
    per = n_batch * (5 if hundred else 1)
    train, test = [], []
    for k, name in enumerate(names + ["test" if hundred else "test_batch"]):
        n = n_test if k == len(names) else per
        hwc = index_images(n, (32, 32, 3), seed + 10 + k)
        entry = {"data": hwc.transpose(0, 3, 1, 2).reshape(n, -1), key: rng.integers(0, classes, n).tolist()}
        with open(folder / name, "wb") as f:
            pickle.dump(entry, f)
        (test if k == len(names) else train).append([name, _md5(folder / name)])
    meta_name, meta_key = ("meta", "fine_label_names") if hundred else ("batches.meta", "label_names")
    label_names = [f"class{c:02d}" for c in range(100)] if hundred else CIFAR10_NAMES
    with open(folder / meta_name, "wb") as f:
        pickle.dump({meta_key: label_names}, f)
    return {"train_list": train, "test_list": test, "meta": {"filename": meta_name, "key": meta_key, "md5": _md5(folder / meta_name)}}


def write_mnist(root: Path, cls_name: str = "MNIST", *, n_train: int, n_test: int, side: int = 28, seed: int = 0) -> None:
    """MNIST-format idx files (``raw/train-images-idx3-ubyte`` ...) under ``root/cls_name``."""
    raw = root / cls_name / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed + 1)
    for prefix, n in (("train", n_train), ("t10k", n_test)):
        imgs = index_images(n, (side, side), seed + (0 if prefix == "train" else 1))
        (raw / f"{prefix}-images-idx3-ubyte").write_bytes(struct.pack(">iiii", 2051, n, side, side) + imgs.tobytes())
        labels = rng.integers(0, 10, n).astype(np.uint8)
        (raw / f"{prefix}-labels-idx1-ubyte").write_bytes(struct.pack(">ii", 2049, n) + labels.tobytes())
