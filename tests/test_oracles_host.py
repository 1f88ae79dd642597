"""fastload.host's reduced-scale decode and its scale choice, against a full-scale decode and a hand table.

``reduced_crop`` decodes a JPEG at 1/2, 1/4 or 1/8 and resizes the crop window from there; its
oracle is PIL's full-scale decode of the same JPEG, the same window resized by the same filter. The
images here do not divide by the DCT scale (1001x1001, 500x375), and the windows touch the right and
bottom edges, where the last scaled pixel holds only part of a block: a window mapped with
``ceil(W / scale)`` as the scale lands a few pixels off and fails. ``reduced_scales`` against a table
of window sides written out by hand (the ratio bound at 2 and each scale's threshold on both sides).
``eval_crop`` against torchvision's ``Resize`` + ``CenterCrop``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image

from fastload import host


def gradient(w: int, h: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([np.rint(xx * 255.0 / (w - 1)), np.rint(yy * 255.0 / (h - 1)),
                     np.rint(((xx // 7 + yy // 5) % 2) * 120 + 60)], axis=-1).astype(np.uint8)  # fmt: skip


def jpeg(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=100, subsampling=0)
    return b.getvalue()


def full_scale(payload: bytes, box, crop: int, interpolation: str = "bilinear") -> np.ndarray:
    x, y, w, h = box
    with Image.open(io.BytesIO(payload)) as im:
        return np.asarray(im.convert("RGB").resize((crop, crop), host.PIL_FILTERS[interpolation], box=(x, y, x + w, y + h)))


def diff(a, b) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


#: (image size, window, scale, the mean difference allowed from the full-scale window at crop 32).
#: Measured (libjpeg-turbo, pillow-simd 12.1): 0.02-0.19, and 1.10 where the window is exactly 32
#: scaled pixels; with the window mapped by ``ceil(W / scale)``'s ratio instead: 0.17-0.65 and 1.84.
CASES = [
    ((1001, 1001), (601, 601, 400, 400), 4, 0.2),  # touches the right and bottom edges: 1001 = 250 * 4 + 1
    ((1001, 1001), (0, 0, 1001, 1001), 8, 0.3),  # the whole image at 1/8: 126 pixels, the last 1/8 of one
    ((1001, 1001), (3, 500, 998, 501), 2, 0.08),
    ((500, 375), (100, 119, 400, 256), 4, 0.18),  # 375 = 93 * 4 + 3
    ((500, 375), (0, 0, 500, 375), 2, 0.2),
    ((375, 500), (119, 100, 256, 400), 8, 1.4),
]


@pytest.mark.parametrize("size, box, scale, tol", CASES)
def test_reduced_crop_is_the_full_scale_window(size, box, scale, tol):
    """Kills: the window divided by ``ceil(W / scale)``'s ratio instead of the scale (the window slides
    by up to a scaled pixel towards the far edges); the window not clipped to the scaled image; the
    draft asked at another scale."""
    crop = 32
    payload = jpeg(gradient(*size))
    got = host.reduced_crop(payload, box, scale=scale, crop=crop)
    assert got.shape == (crop, crop, 3) and got.dtype == np.uint8
    d = diff(got, full_scale(payload, box, crop))
    assert d <= tol, d
    x, y, w, h = box
    for dx, dy in ((-scale * 2, 0), (0, -scale * 2)):  # a window a couple of scaled pixels off is farther
        if x + dx >= 0 and y + dy >= 0:
            assert diff(got, full_scale(payload, (x + dx, y + dy, w, h), crop)) > d


def test_reduced_crop_honours_the_interpolation():
    payload = jpeg(gradient(1001, 1001))
    box = (601, 601, 400, 400)
    got = {m: host.reduced_crop(payload, box, scale=4, crop=32, interpolation=m) for m in ("bilinear", "bicubic", "nearest")}
    assert not np.array_equal(got["bilinear"], got["bicubic"]) and not np.array_equal(got["bilinear"], got["nearest"])


def test_reduced_crop_at_scale_1_is_the_full_scale_window_exactly():
    payload = jpeg(gradient(300, 200))
    box = (10, 20, 200, 150)
    assert np.array_equal(host.reduced_crop(payload, box, scale=1, crop=24), full_scale(payload, box, 24))


#: min(window side) / crop -> scale, crop 32: below 2 always 1; else the largest of 2, 4, 8 it reaches
SCALES = [(63, 1), (63.99, 1), (64, 2), (127, 2), (128, 4), (255.9, 4), (256, 8), (5000, 8)]


@pytest.mark.parametrize("side, scale", SCALES)
def test_reduced_scales_table(side, scale):
    """Kills: the ratio bound or a scale threshold off by one, ``>`` for ``>=``, the width alone read."""
    boxes = np.array([[0, 0, side, 9999], [0, 0, 9999, side], [0, 0, side, side]])
    got = host.reduced_scales(boxes, np.full(3, 9000), np.full(3, 9000), crop=32)  # 81 MP: PIL opens it
    assert got.tolist() == [scale] * 3 and got.dtype == np.int64


def test_reduced_scales_leave_images_pil_refuses_at_full_scale(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000 * 1000)
    boxes = np.array([[0, 0, 900, 900]] * 3)
    got = host.reduced_scales(boxes, np.array([1000, 1001, 2000]), np.array([1000, 1000, 2000]), crop=32)
    assert got.tolist() == [8, 1, 1]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert host.reduced_scales(boxes, np.array([10**5] * 3), np.array([10**5] * 3), crop=32).tolist() == [8, 8, 8]


@pytest.mark.parametrize("hw", [(40, 64), (64, 40), (57, 57), (300, 17)])
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic"])
def test_eval_crop_is_torchvisions_resize_and_center_crop(hw, interpolation):
    """Kills: the short side resized to another size, the crop off centre, the filter ignored."""
    from torchvision.transforms import CenterCrop, InterpolationMode, Resize

    h, w = hw
    a = gradient(w, h)
    got = host.eval_crop(a, resize=36, crop=32, interpolation=interpolation)
    mode = {"bilinear": InterpolationMode.BILINEAR, "nearest": InterpolationMode.NEAREST,
            "bicubic": InterpolationMode.BICUBIC}[interpolation]  # fmt: skip
    want = np.asarray(CenterCrop(32)(Resize(36, interpolation=mode)(Image.fromarray(a))))
    assert got.shape == want.shape == (32, 32, 3)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1
