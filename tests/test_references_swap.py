"""torchvision's references/classification configurations with only ``DataLoader(`` -> ``fastload.FastLoader(``.

The oracle is the same script on ``torch.utils.data.DataLoader``: batches per epoch, samples
seen, the evaluation counted over exactly the validation set, and a loss that falls in both.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torchvision")

from conftest import write_image  # noqa: E402
from references_style import run  # noqa: E402

#: One strong primary colour per class, the index in the other channels: learnable in a few steps.
def _colour(c: int, i: int) -> tuple[int, int, int]:
    rgb = [(i * 37) % 64, (i * 53) % 64, (i * 71) % 64]
    rgb[c] = 200 + (i % 40)
    return tuple(rgb)

CONFIGS = {
    "plain": {},
    "bicubic": {"interpolation": "bicubic"},
    "random-erase": {"random_erase": 0.25},
    "mixup-cutmix": {"mixup_alpha": 0.2, "cutmix_alpha": 1.0},
    "val-sizes": {"train_crop": 20, "val_resize": 32, "val_crop": 28},
    # (the auto-augments at a smaller learning rate: at 0.2 the tiny model diverges on either loader)
    "ta-wide-erase": {"auto_augment": "ta_wide", "random_erase": 0.25, "lr": 0.05},
    "ra-bicubic": {"auto_augment": "ra", "interpolation": "bicubic", "lr": 0.05},
    "autoaugment-imagenet": {"auto_augment": "imagenet", "lr": 0.05},
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("refs")
    i = 0
    for split, per in (("train", 10), ("val", 7)):  # 30 training images, 21 validation: batches of 6 leave remainders
        for c in range(3):
            for j in range(per):
                write_image(root / split / f"c{c}" / f"{j}.jpg", _colour(c, i), size=(40 + 4 * c, 36), quality=95)
                i += 1
    return root


@pytest.mark.parametrize("name", list(CONFIGS))
def test_the_swap_runs_as_the_dataloader_does(data, name):
    kw = CONFIGS[name]
    ref = run(data, loader="torch", **kw)
    got = run(data, loader="fastload", **kw)
    assert got["batches"] == ref["batches"] and got["samples"] == ref["samples"]
    assert got["val_count"] == ref["val_count"] == 21  # every validation image, once
    assert got["soft_targets"] == ref["soft_targets"]
    for out in (got, ref):
        assert out["loss"][-1] < math.log(3)  # below chance: it learns
        if "mixup_alpha" not in kw:  # (mixed targets keep the loss high and noisy)
            assert out["loss"][-1] < out["loss"][0]
        assert out["val_acc"] >= 2 / 3  # one primary colour per class: learnt in 3 epochs


@pytest.mark.slow
@pytest.mark.parametrize("name", ["plain", "random-erase"])
def test_the_swap_under_torchrun_on_two_ranks(data, tmp_path, name):
    """torchrun --nproc_per_node=2 (gloo on CPU): per rank the same batches and samples as the DataLoader
    run (15 of 30 per epoch), the evaluation summed across ranks over the DistributedSampler's padded
    22 (21 images, one twice), as the references count it, and a falling loss on both ranks."""
    here = Path(__file__).resolve().parent
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(here.parent), str(here)]), "OMP_NUM_THREADS": "1"}
    results = {}
    for which in ("torch", "fastload"):
        out = tmp_path / which
        out.mkdir()
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
               str(here / "references_style.py"), str(data), which, str(out), json.dumps(CONFIGS[name])]  # fmt: skip
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        results[which] = [json.loads((out / f"rank{r}.json").read_text()) for r in range(2)]
    for ref, got in zip(results["torch"], results["fastload"]):
        assert got["batches"] == ref["batches"] == [3, 3, 3]  # 15 samples per rank in batches of 6
        assert got["samples"] == ref["samples"] == [15, 15, 15]
        assert got["val_count"] == ref["val_count"] == 22
        for out in (got, ref):
            assert out["loss"][-1] < out["loss"][0]
