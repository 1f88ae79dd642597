"""DeiT's ``main.py`` configurations with only ``DataLoader(`` -> ``fastload.FastLoader(``.

The oracle is the same script on ``torch.utils.data.DataLoader``: batches per epoch (with
``drop_last=True``), samples seen, image shapes, the evaluation counted over exactly the
validation set, and a model that learns in both.
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("torchvision")
pytest.importorskip("timm")

from conftest import write_image  # noqa: E402
from deit_style import build_transform, run  # noqa: E402


def _colour(c: int, i: int) -> tuple[int, int, int]:
    """One strong primary colour per class, the index in the other channels: learnable in a few steps."""
    rgb = [(i * 37) % 64, (i * 53) % 64, (i * 71) % 64]
    rgb[c] = 200 + (i % 40)
    return tuple(rgb)


CONFIGS = {
    "defaults": {},  # RandAugment rand-m9-mstd0.5-inc1, bicubic, pixel erasing 0.25, Mixup/CutMix
    "no-mixup": {"mixup": 0.0, "cutmix": 0.0},
    "closest-flags": {"aa": None, "color_jitter": 0.0, "train_interpolation": "bilinear", "reprob": 0.0},
    "erase-rand-count": {"remode": "rand", "recount": 2, "reprob": 0.5, "mixup": 0.0, "cutmix": 0.0},
}


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("deit")
    i = 0
    for split, per in (("train", 10), ("val", 7)):  # 30 training images (5 batches of 6), 21 validation (2 of 9 + 3)
        for c in range(3):
            for j in range(per):
                write_image(root / split / f"c{c}" / f"{j}.jpg", _colour(c, i), size=(52 + 4 * c, 48), quality=95)
                i += 1
    return root


def test_deits_transforms_translate_to_what_they_say():
    """What DeiT's defaults become: timm's RandAugment (15 increasing operations, m9, std 0.5, p 0.5, two
    layers, bicubic, the mean as fill), pixel erasing at 0.25, bicubic crops; bicubic 256 -> 224 evaluation."""
    from fastload.transforms import translate

    train = translate(build_transform(True, input_size=224))
    pol = train.policy
    assert (pol.library, pol.kind, pol.num_ops, pol.interpolation) == ("timm", "rand", 2, ("bicubic",))
    assert len(pol.ops) == 15 and {o.magnitude for o in pol.ops} == {9.0} and {o.std for o in pol.ops} == {0.5}
    assert {o.prob for o in pol.ops} == {0.5} and "SolarizeIncreasing" in {o.name for o in pol.ops}
    assert pol.fill == tuple(float(min(255, round(255 * m))) for m in (0.485, 0.456, 0.406))
    assert train.jitter is None  # timm drops the colour jitter beside RandAugment
    assert (train.erasing.p, train.erasing.noise, train.erasing.count) == (0.25, "pixel", (1, 1))
    assert train.interpolation == "bicubic" and train.crop == 224
    ev = translate(build_transform(False, input_size=224))
    assert (ev.train, ev.resize, ev.crop, ev.interpolation) == (False, 256, 224, "bicubic")


@pytest.mark.parametrize("name", [n if n == "defaults" else pytest.param(n, marks=pytest.mark.slow) for n in CONFIGS])  # 7 s each
def test_the_swap_runs_as_the_dataloader_does(data, name):
    kw = CONFIGS[name]
    ref = run(data, loader="torch", **kw)
    got = run(data, loader="fastload", **kw)
    assert got["batches"] == ref["batches"] == [5, 5, 5]  # drop_last: 30 // 6
    assert got["samples"] == ref["samples"] == [30, 30, 30]
    assert got["shapes"] == ref["shapes"] == {(3, 40, 40)}
    assert got["val_count"] == ref["val_count"] == 21  # every validation image, once
    for out in (got, ref):
        assert out["loss"][-1] < out["loss"][0]
        if kw.get("mixup", 0.8) == 0:  # (mixed, smoothed targets keep the loss high)
            assert out["loss"][-1] < math.log(3)
        assert out["val_acc"] >= 2 / 3  # one primary colour per class: learnt in 3 epochs
