"""Rules of the augmentation side a developer could break without any other test noticing (issue 41's list).

Each expected value comes from the library imitated (timm's own ``AugmentOp`` and PIL's solarize) or
from NumPy's generator used as documented (the noise stream per image, rectangle after rectangle).
"""

from __future__ import annotations

import random

import numpy as np
import pytest
from PIL import Image, ImageOps

pytest.importorskip("nvidia.dali")
timm_aa = pytest.importorskip("timm.data.auto_augment")

from fastload.augment.rounds import apply_once  # noqa: E402
from fastload.augment.ops_color import color_op  # noqa: E402
from fastload.augment.policies import plan  # noqa: E402
from fastload.augment.readaug import timm_policy  # noqa: E402
from fastload.augment.stage import noise_patches  # noqa: E402


def test_timms_level_is_clamped_at_zero_as_timm_clamps_it():
    """Magnitude 1 with std 5: about half the normal draws fall below 0, and timm clamps them to level 0
    (Posterize: 0 bits). Against timm's own AugmentOp with its arguments recorded: the same mass at 0 bits,
    never a negative number of bits."""
    hp = {"magnitude_std": 5.0}
    op = timm_aa.AugmentOp("Posterize", prob=1.0, magnitude=1, hparams=hp)
    seen: list[int] = []
    op.aug_fn = lambda img, *args, **kw: seen.append(args[0]) or img
    img = Image.new("RGB", (4, 4))
    random.seed(0)
    for _ in range(4000):
        op(img)
    pol = timm_policy(timm_aa.RandAugment([timm_aa.AugmentOp("Posterize", prob=1.0, magnitude=1, hparams=hp)], 1), auto=False)
    ours = [s[0][1][0] for s in plan(pol, seed=1, epoch=0, positions=np.arange(4000))]
    assert min(ours) >= 0 and min(seen) >= 0
    theirs_zero, ours_zero = np.mean(np.array(seen) == 0), np.mean(np.array(ours) == 0)
    assert theirs_zero > 0.5 and abs(ours_zero - theirs_zero) < 4 * np.sqrt(0.25 / 4000) * 1.5


@pytest.mark.parametrize("threshold", [254, 255, 256])
def test_timms_solarize_at_the_top_of_the_range_is_pils(threshold):
    """PIL inverts the pixels >= threshold: 255 inverts only the white ones, 256 none (timm's SolarizeIncreasing
    at level 0). Every level of the image appears."""
    img = np.arange(256, dtype=np.uint8).repeat(3).reshape(16, 16, 3)
    want = np.asarray(ImageOps.solarize(Image.fromarray(img), threshold))
    (got,) = apply_once(color_op("timm", "Solarize", "bilinear", (0, 0, 0)), [img], [(threshold,)])
    assert np.array_equal(got, want)


def test_each_erased_rectangle_draws_new_noise_from_its_images_stream():
    """Two rectangles of one image: the first the first draws of the image's generator, the second the next
    ones (not the same values again), as one generator per image drawing rectangle after rectangle."""
    rects = np.array([[[1, 2, 3, 4], [5, 6, 2, 3]], [[0, 0, 0, 0], [0, 0, 0, 0]]])
    seeds = np.array([12345, 99], dtype=np.uint64)
    got = noise_patches(rects, seeds, noise="pixel", layout="CHW")
    gen = np.random.default_rng(12345)
    first, second = gen.standard_normal((3, 3, 4), dtype=np.float32), gen.standard_normal((3, 2, 3), dtype=np.float32)
    assert np.array_equal(got[0][0], first) and np.array_equal(got[1][0], second)
    assert not got[1][1].any() and got[1][1].shape == (3, 1, 1)  # no rectangle: a zero that pastes nothing
    chan = noise_patches(rects, seeds, noise="channel", layout="HWC")
    gen = np.random.default_rng(12345)
    a, b = gen.standard_normal((3, 1, 1), dtype=np.float32), gen.standard_normal((3, 1, 1), dtype=np.float32)
    assert np.array_equal(chan[0][0], np.broadcast_to(a, (3, 3, 4)).transpose(1, 2, 0))
    assert np.array_equal(chan[1][0], np.broadcast_to(b, (3, 2, 3)).transpose(1, 2, 0))


def test_nearest_interpolation_never_averages_pixels(tmp_path):
    """Rule (torchvision's NEAREST picks source pixels): large JPEGs of one-pixel black and white stripes, cropped
    small, come out black and white. A reduced-scale decode (JPEG's DCT scaling averages neighbours, what the CPU
    path does for large crops under the other filters) would give grey."""
    import fastload

    stripes = np.zeros((240, 320, 3), dtype=np.uint8)
    stripes[:, ::2] = 255
    src = tmp_path / "src" / "a"
    src.mkdir(parents=True)
    for i in range(8):
        Image.fromarray(stripes).save(src / f"{i}.jpg", quality=100, subsampling=0)
    fastload.pack(tmp_path / "src", tmp_path / "packed", workers=1, progress=False)
    with fastload.FastLoader(tmp_path / "packed", 8, device="cpu", crop=16, interpolation="nearest", mean=None,
                             std=None, seed=2) as ld:  # fmt: skip
        x, _ = next(iter(ld))
    far = ((x.int() - 128).abs() > 90).float().mean()
    assert far > 0.95, float(far)
