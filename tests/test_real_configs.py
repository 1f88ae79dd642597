"""Public training scripts' data code, configuration by configuration, with only ``DataLoader(`` -> ``fastload.FastLoader(``.

Each case builds the dataset, transform and loader the way the published script builds them (a
few lines, citing the script's path; nothing copied) over small images the test makes, then
iterates a batch or two through ``torch.utils.data.DataLoader`` (the oracle) and through
``fastload.FastLoader`` in its place, and compares what the script would notice: the batch's
structure, shapes and dtypes, labels (position by position where both read one sampler, as a
multiset per epoch where each shuffles on its own), value ranges, and the evaluation's pixels.
Scripts that pin an old timm (MAE, ConvNeXt: 0.3.2; DeiT: 0.4.12) run in a subprocess with that
version first on ``PYTHONPATH`` (``real_configs_probe.py``; installed as ``test_timm_versions.py``
installs it). The detection and segmentation references record what happens now: refused with a
route, which is followed to a DataLoader's batches, or served as the DataLoader serves them.
docs/dropin.md, "Real scripts, configuration by configuration", is the table of these cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402
from torchvision import datasets, transforms  # noqa: E402

import fastload  # noqa: E402
from fastload.errors import ConfigError  # noqa: E402

from array_files import write_cifar  # noqa: E402
from timm_install import install_timm  # noqa: E402

HERE = Path(__file__).resolve().parent
PROBE = HERE / "real_configs_probe.py"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZES = [(60, 44), (48, 64), (52, 52), (70, 50)]  # (w, h): square and not

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def gradient_folder(root: Path, per: dict[str, int]) -> Path:
    """``root/<split>/c<k>/<j>.png``: 3 classes of smooth gradients (each image its own offsets), four sizes."""
    i = 0
    for split, n in per.items():
        for c in range(3):
            for j in range(n):
                w, h = SIZES[i % len(SIZES)]
                y, x = np.mgrid[0:h, 0:w].astype(np.float32)
                px = np.stack([x / w * 180 + c * 30, y / h * 180 + j * 6, 90 + c * 50 + 0 * x], -1)
                p = root / split / f"c{c}" / f"{j}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(p)
                i += 1
    return root


def pixel_range(mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised range of 0..1 pixels per channel, ``[1, C, 1, 1]`` each."""
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    return (0 - m) / s, (1 - m) / s


def fast_extra(cache: Path) -> dict:
    """What the test environment adds to the swapped call: the cache folder, no progress bar, the CPU."""
    return {"cache_dir": cache, "progress": False, "device": "cpu"}


# ============================================================================ scripts pinning an old timm


def probe(version: str, config: str, data: Path, cache: Path) -> dict:
    """``real_configs_probe.py config`` under timm ``version``: both loaders' observations."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(install_timm(version)), str(HERE.parent), str(HERE)]),
               PYTHONWARNINGS="ignore")  # fmt: skip
    r = subprocess.run([sys.executable, str(PROBE), config, str(data), str(cache)], capture_output=True, text=True,
                       timeout=600, env=env, cwd=HERE.parent)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["version"] == version
    return out


@pytest.fixture(scope="module")
def gradients(tmp_path_factory) -> Path:
    """12 training images (2 batches of 6) and 9 validation images (a batch of 6 or 9, and the rest)."""
    return gradient_folder(tmp_path_factory.mktemp("gradients"), {"train": 4, "val": 3})


def check_classification(out: dict, *, shape: tuple[int, ...], batches: int, val_batches: list[int], same_order: bool) -> None:
    """What a classification script notices, FastLoader against the DataLoader in the same script."""
    ref, got = out["torch"], out["fastload"]
    for r, g in zip(ref["train"], got["train"], strict=True):
        assert g["batches"] == r["batches"] == batches  # drop_last=True
        assert {tuple(s) for s in g["shapes"]} == {tuple(s) for s in r["shapes"]} == {shape}
        assert set(g["dtypes"]) == set(r["dtypes"]) == {"torch.float32"}
        assert Counter(g["labels"]) == Counter(r["labels"])  # every training image once per epoch
        if same_order:  # one sampler read as given
            assert g["labels"] == r["labels"]
    # the erasing's pixel noise reaches past the normalised range in both, as timm's pixel mode draws it
    noise = [sum(e["outside"] for e in x["train"]) for x in (ref, got)]
    assert min(noise) > 0, noise
    rv, gv = ref["val"], got["val"]
    assert [s[0] for s in gv["shapes"]] == [s[0] for s in rv["shapes"]] == val_batches
    assert gv["labels"] == rv["labels"]  # evaluation in order
    assert {tuple(s[1:]) for s in gv["shapes"]} == {shape[1:]}
    lo, hi = pixel_range(IMAGENET_MEAN, IMAGENET_STD)
    assert min(gv["min"]) >= float(lo.min()) - 1e-4 and max(gv["max"]) <= float(hi.max()) + 1e-4
    # evaluation is deterministic: the same pixels within a level (1/255 / 0.225 = 0.0174 normalised)
    assert out["val_diff"]["max"] <= 0.0175 and out["val_diff"]["mean"] < 1e-3, out["val_diff"]


def test_mae_finetune_with_its_timm_0_3_2(gradients, tmp_path):
    """MAE main_finetune.py + util/datasets.py (timm==0.3.2): RandAugment m9, pixel erasing 0.25, bicubic, at 224."""
    out = probe("0.3.2", "mae", gradients, tmp_path / "cache")
    check_classification(out, shape=(6, 3, 224, 224), batches=2, val_batches=[6, 3], same_order=False)


def test_convnext_imagenet_with_its_timm_0_3_2(gradients, tmp_path):
    """ConvNeXt main.py + datasets.py (timm==0.3.2), ``--data_set IMNET``: its DistributedSampler read as given."""
    out = probe("0.3.2", "convnext", gradients, tmp_path / "cache")
    check_classification(out, shape=(6, 3, 224, 224), batches=2, val_batches=[9], same_order=True)


def test_convnext_cifar100_with_its_timm_0_3_2(tmp_path):
    """ConvNeXt ``--data_set CIFAR --input_size 32``: CIFAR100 with timm's transform, its crop replaced by
    RandomCrop(32, padding=4); evaluation ToTensor + Normalize without a resize."""
    out = probe("0.3.2", "convnext-cifar", tmp_path / "data", tmp_path / "cache")
    check_classification(out, shape=(6, 3, 32, 32), batches=5, val_batches=[9, 6], same_order=True)


@pytest.mark.slow
def test_deit_with_its_timm_0_4_12(tmp_path):
    """DeiT main.py's defaults (but Mixup, whose targets these versions put on "cuda") under timm==0.4.12,
    through its tests' script (deit_style.py): the same batches, samples, shapes and evaluation count."""
    from test_deit_swap import _colour
    from conftest import write_image

    i = 0
    for split, per in (("train", 10), ("val", 7)):
        for c in range(3):
            for j in range(per):
                write_image(tmp_path / "d" / split / f"c{c}" / f"{j}.jpg", _colour(c, i), size=(52 + 4 * c, 48), quality=95)
                i += 1
    out = probe("0.4.12", "deit", tmp_path / "d", tmp_path / "cache")
    ref, got = out["torch"], out["fastload"]
    assert got["batches"] == ref["batches"] == [5, 5] and got["samples"] == ref["samples"] == [30, 30]
    assert got["shapes"] == ref["shapes"] == [[3, 40, 40]]
    assert got["val_count"] == ref["val_count"] == 21
    for r in (ref, got):
        assert r["loss"][-1] < r["loss"][0] and r["val_acc"] >= 2 / 3
