"""The DALI path of detection batches (``backend="dali"``, the graph on DALI's CPU backend here) against the PIL path.

Both paths take their geometry from the same host plan, so boxes, labels and masks must be
equal exactly; the pixels differ only by the two libraries' decoders and resamplers
(libjpeg-turbo in both; DALI's antialiased linear resize against pillow-simd's bilinear). The
tolerances were measured here (DALI 2.4.0 CPU backend, pillow-simd 12.1.1): at most 5/255
on a pixel and 0.26/255 on average over textured JPEGs up- and downscaled; the tests allow
8/255 and 0.5/255. Every painted colour must still be enclosed by its box in the DALI images.
The ``mixed``/GPU graph is the same graph on another device and was never run on a GPU here.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastload
from fastload.detection import DetectionLoader
from fastload.errors import ConfigError

from coco_fixture import colour_box, pack_painted

pytest.importorskip("nvidia.dali")

MAX_TOL, MEAN_TOL = 8 / 255, 0.5 / 255


@pytest.fixture(scope="module")
def painted(tmp_path_factory):
    root = tmp_path_factory.mktemp("dali-det")
    out = root / "packed"
    return out, pack_painted(root, out)


@pytest.fixture(scope="module")
def textured(tmp_path_factory):
    """JPEGs of smooth waves plus noise (what resamplers disagree on), one box each."""
    from PIL import Image

    root = tmp_path_factory.mktemp("dali-tex")
    (root / "images").mkdir()
    rng = np.random.default_rng(0)
    images, anns = [], []
    for n, (h, w) in enumerate([(120, 160), (200, 150), (97, 211), (256, 256)]):
        yy, xx = np.mgrid[0:h, 0:w]
        px = np.stack([128 + 100 * np.sin(xx / 7.0 + c) * np.cos(yy / 11.0 - c) for c in range(3)], -1) + rng.normal(0, 20, (h, w, 3))
        Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(root / "images" / f"{n}.jpg", quality=90)
        images.append({"id": n + 1, "file_name": f"{n}.jpg", "height": h, "width": w})
        anns.append({"id": 10 + n, "image_id": n + 1, "category_id": 1, "bbox": [5, 6, w // 2, h // 2], "area": 1, "iscrowd": 0})
    (root / "a.json").write_text(json.dumps({"images": images, "annotations": anns, "categories": [{"id": 1, "name": "x"}]}))
    fastload.pack_coco(root / "images", root / "packed", annotations=root / "a.json", workers=1, progress=False)
    return root / "packed"


def _pairs(path, epochs=2, **kw):
    pil, dali = DetectionLoader(path, 3, **kw), DetectionLoader(path, 3, backend="dali", **kw)
    for epoch in range(epochs):
        pil.set_epoch(epoch)
        dali.set_epoch(epoch)
        for (ia, ta), (ib, tb) in zip(pil, dali, strict=True):
            yield from zip(ia, ib, ta, tb)


@pytest.mark.parametrize("crop", [None, "iou", "resized"])
@pytest.mark.parametrize("flip", [0.0, 1.0])
@pytest.mark.parametrize("size", [None, (50, 70)])
def test_dali_path_gives_the_pil_paths_boxes_and_masks_and_enclosed_colours(painted, crop, flip, size):
    """Kills: the DALI window anchored at (y, x) instead of (x, y), the resize size given as (w, h),
    the flip not applied (or applied to every image) in the graph, another window than the host's."""
    path, colours = painted
    seen = 0
    for a, b, ta, tb in _pairs(path, fields=("image", "boxes", "mask", "image_id"), crop=crop, flip=flip, size=size,
                               min_size=64, max_size=100, seed=5):  # fmt: skip
        assert a.shape == b.shape and b.dtype == torch.float32
        assert ta.keys() == tb.keys()
        for k in ta:
            assert torch.equal(ta[k], tb[k]), k
        d = (a - b).abs()
        assert float(d.max()) <= MAX_TOL and float(d.mean()) <= MEAN_TOL, (float(d.max()) * 255, float(d.mean()) * 255)
        img = b.numpy()
        for box in tb["boxes"].numpy():
            if min(box[2] - box[0], box[3] - box[1]) < 3:
                continue
            found = [colour_box(img, c) for c in colours[int(tb["image_id"])]]
            assert any(f is not None and np.allclose(f, box, atol=1.5) for f in found), (int(tb["image_id"]), box)
            seen += 1
    assert seen


@pytest.mark.parametrize("crop", [None, "iou", "resized"])
@pytest.mark.parametrize("size", [None, (60, 90)])
def test_dali_pixels_are_within_the_measured_tolerance_of_pil_on_textured_images(textured, crop, size):
    worst = 0.0
    for a, b, ta, tb in _pairs(textured, epochs=3, crop=crop, flip=0.5, size=size, min_size=100, max_size=180, seed=3):
        assert torch.equal(ta["boxes"], tb["boxes"])
        d = (a - b).abs()
        assert float(d.max()) <= MAX_TOL and float(d.mean()) <= MEAN_TOL, (float(d.max()) * 255, float(d.mean()) * 255)
        worst = max(worst, float(d.max()))
    assert worst > 0  # the two paths are really two decoders


def test_dali_path_resumes_and_checks_its_backend(painted):
    path, _ = painted
    kw = dict(fields=("image", "boxes", "image_id"), shuffle=True, crop="iou", flip=0.5, min_size=48, max_size=80, seed=2, backend="dali")
    whole = [[int(t["image_id"]) for t in ts] for _, ts in DetectionLoader(path, 2, **kw)]
    first = DetectionLoader(path, 2, **kw)
    it = iter(first)
    next(it)
    state = first.state_dict()
    it.close()
    again = DetectionLoader(path, 2, **kw)
    again.load_state_dict(state)
    assert [[int(t["image_id"]) for t in ts] for _, ts in again] == whole[1:]
    with pytest.raises(ConfigError, match=r"backend must be 'pil' or 'dali', got 'gpu'"):
        DetectionLoader(path, 2, backend="gpu")
