"""benchmarks/bench_augment.py: DALI's own graph reads every file once an epoch and erases like RandomErasing(0.25)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]

pytest.importorskip("nvidia.dali")


def _bench():
    spec = importlib.util.spec_from_file_location("bench_augment", ROOT / "benchmarks" / "bench_augment.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_dali_graph_reads_each_file_once_and_erases_a_quarter_of_the_images(make_folder):
    """2 classes x 64 non-square JPEGs, 2 epochs: labels from the folder, 256 crops of 3x224x224, and
    torchvision's RandomErasing(p=0.25, scale=(0.02, 0.33)) in numbers: erased rectangles on about a
    quarter of the crops, each 2-33 % of the crop, in the fill that normalises to (fill - mean) / std."""
    bench = _bench()
    src = make_folder(classes=2, per_class=64, size=(96, 64))
    it = bench.dali_loader(str(src), "ta", 2)
    mean = torch.tensor([0.485, 0.456, 0.406]) * 255
    std = torch.tensor([0.229, 0.224, 0.225]) * 255
    fill = ((torch.round(mean) - mean) / std).view(1, 3, 1, 1)
    shares = []
    for _ in range(2):
        epoch_labels = []
        for out in it:
            x, y = out[0]["x"], out[0]["y"]
            assert x.dtype == torch.float32 and tuple(x.shape[1:]) == (3, 224, 224)
            epoch_labels += y.flatten().tolist()
            shares += (x - fill).abs().lt(1e-4).all(1).float().mean((1, 2)).tolist()
        assert sorted(epoch_labels) == [0] * 64 + [1] * 64
    erased = [s for s in shares if s > 0.005]
    assert len(shares) == 256
    assert 0.14 <= len(erased) / 256 <= 0.37, len(erased)  # binomial(256, 0.25): mean 64, sd 6.9
    assert all(0.015 <= s <= 0.34 for s in erased), erased
