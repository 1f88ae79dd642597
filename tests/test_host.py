"""fastload.host's batch finishing: both ways of finishing crops give the reference's pixels."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastload import host
from fastload.host import finish_crops

from reference import resized_crop

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def _crops(n: int, lo: int, hi: int, seed: int) -> list[np.ndarray]:
    """Crops of random sizes whose pixels encode their position (x, y) and their index."""
    rng = np.random.default_rng(seed)
    out = []
    for k, (h, w) in enumerate(rng.integers(lo, hi, (n, 2))):
        y, x = np.mgrid[0:h, 0:w]
        out.append(np.stack([x * 255 // max(w - 1, 1), y * 255 // max(h - 1, 1), np.full_like(x, k % 256)], -1).astype(np.uint8))
    return out


def _expected(crops, flips, crop: int, finished=None) -> np.ndarray:
    """HWC uint8 per image: the reference resize (or the finished crop), mirrored where flipped."""
    finished = finished or {}
    out = []
    for i, c in enumerate(crops):
        img = finished[i] if i in finished else resized_crop(c, (0, 0, c.shape[1], c.shape[0]), crop)
        out.append(img[:, ::-1] if flips[i] else img)
    return np.stack(out)


def _as_hwc_uint8(images: torch.Tensor) -> np.ndarray:
    return images.permute(0, 2, 3, 1).contiguous().numpy()


@pytest.fixture(autouse=True, params=["torch", "pil"])
def finish_path(request, monkeypatch):
    """Every test here runs through both finishes: torch's one call per batch, and PIL's (where TorchScript is not)."""
    if request.param == "pil":
        monkeypatch.setattr(host, "_SCRIPT", [None])
    return request.param


def test_the_batch_finish_compiles_with_the_torch_the_set_up_installs(finish_path):
    # None would mean every CPU batch silently went back to the Python loop over its images
    assert (host.batch_finish() is not None) == (finish_path == "torch")


def test_the_fast_path_is_available_with_the_pillow_the_set_up_installs():
    # The chunked path resizes through PIL's C image calls; core_ops() checked them against the
    # public calls. None here would mean small crops silently went back to the slower path.
    assert host.core_ops() is not None


@pytest.mark.parametrize("crop", [8, 32, 56, 97, 98, 130])
@pytest.mark.parametrize("channels_last", [False, True])
def test_crops_are_the_reference_below_and_above_the_chunk_threshold(crop, channels_last):
    # 37 images: two full chunks of 16 and a partial one; sizes from 1 px to twice the output
    crops = _crops(37, 1, 2 * crop, seed=crop)
    flips = np.random.default_rng(crop + 1).integers(0, 2, len(crops)).astype(bool)
    out = finish_crops(crops, flips, crop=crop, mean=None, std=None, dtype=torch.uint8, channels_last=channels_last)
    assert out.shape == (37, 3, crop, crop) and out.dtype == torch.uint8
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else torch.contiguous_format)
    np.testing.assert_array_equal(_as_hwc_uint8(out), _expected(crops, flips, crop))


@pytest.mark.parametrize("crop", [32, 112])
def test_normalised_output_is_torchvision_arithmetic_in_both_paths(crop):
    crops = _crops(20, crop // 2, 2 * crop, seed=7)
    flips = np.arange(20) % 3 == 0
    out = finish_crops(crops, flips, crop=crop, mean=MEAN, std=STD, dtype=torch.float32, channels_last=False)
    want = torch.from_numpy(_expected(crops, flips, crop)).permute(0, 3, 1, 2).float() / 255
    want = (want - torch.tensor(MEAN).view(1, 3, 1, 1)) / torch.tensor(STD).view(1, 3, 1, 1)
    torch.testing.assert_close(out, want, rtol=0, atol=1e-5)


def test_the_chunked_and_the_per_image_paths_agree_exactly(monkeypatch):
    crops = _crops(50, 1, 90, seed=3)
    flips = np.random.default_rng(4).integers(0, 2, 50).astype(bool)
    finished = {5: _crops(1, 40, 41, seed=5)[0][:40, :40], 17: np.zeros((40, 40, 3), np.uint8)}
    kw = dict(crop=40, mean=MEAN, std=STD, dtype=torch.float32, channels_last=False, finished=finished)
    chunked = finish_crops(crops, flips, **kw)
    monkeypatch.setattr(host, "SMALL_CROP_BYTES", 0)
    each = finish_crops(crops, flips, **kw)
    assert torch.equal(chunked, each)
    ref = _expected(crops, flips, 40, finished)
    np.testing.assert_array_equal(ref[17], np.zeros((40, 40, 3), np.uint8))
    monkeypatch.setattr(host, "SMALL_CROP_BYTES", 10**9)
    np.testing.assert_array_equal(_as_hwc_uint8(finish_crops(crops, flips, **{**kw, "mean": None, "std": None, "dtype": torch.uint8})), ref)


def test_without_the_fast_path_small_crops_are_finished_image_by_image(monkeypatch):
    crops = _crops(18, 10, 60, seed=9)
    flips = np.arange(18) % 2 == 1
    monkeypatch.setattr(host, "_CORE", [None])
    assert host.core_ops() is None
    out = finish_crops(crops, flips, crop=24, mean=None, std=None, dtype=torch.uint8, channels_last=False)
    np.testing.assert_array_equal(_as_hwc_uint8(out), _expected(crops, flips, 24))


def test_a_finished_crop_of_the_wrong_shape_is_refused():
    crops = _crops(3, 10, 20, seed=1)
    with pytest.raises(ValueError, match="finished crop 1"):
        finish_crops(crops, np.zeros(3, bool), crop=16, mean=None, std=None, dtype=torch.uint8, channels_last=False,
                     finished={1: np.zeros((15, 16, 3), np.uint8)})  # fmt: skip


def test_crops_that_are_views_with_strides_are_read_correctly():
    # DALI hands contiguous crops; a caller (loader.dataset[i]) may pass a slice of a bigger image
    big = _crops(1, 80, 81, seed=2)[0]
    crops = [big[3:40, 5:70], big[::2, ::3], big[10:11, 10:11]]
    flips = np.array([True, False, True])
    out = finish_crops(crops, flips, crop=20, mean=None, std=None, dtype=torch.uint8, channels_last=False)
    np.testing.assert_array_equal(_as_hwc_uint8(out), _expected([np.ascontiguousarray(c) for c in crops], flips, 20))


def test_c_calls_that_would_give_other_pixels_are_not_used(monkeypatch):
    from PIL import Image

    # Image.core.new is what only the fast path uses (the public calls allocate with core.fill):
    # one pixel wider than asked, it reads the crop's rows skewed, with no error
    real = Image.core.new
    monkeypatch.setattr(Image.core, "new", lambda mode, size: real(mode, (size[0] + 1, size[1])))
    monkeypatch.setattr(host, "_CORE", [])
    assert host.core_ops() is None
    crops = _crops(5, 10, 30, seed=11)
    flips = np.zeros(5, bool)
    out = finish_crops(crops, flips, crop=16, mean=None, std=None, dtype=torch.uint8, channels_last=False)
    np.testing.assert_array_equal(_as_hwc_uint8(out), _expected(crops, flips, 16))
