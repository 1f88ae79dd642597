"""Detection batches: boxes resized and flipped with their pixels, torchvision's targets, a Faster R-CNN loop.

The oracle is the pixels: every box of the fixture is painted in its own colour, so after
the loader's resize and flip the extent of that colour in the output image must be the
box the loader hands out. Sizes and boxes are also checked against torchvision's own
``GeneralizedRCNNTransform.resize``.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import fastload
from fastload.detection import DetectionLoader
from fastload.errors import ConfigError

from coco_fixture import IMAGES, colour_box, pack_painted, write_coco

torchvision = pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("det")
    img_dir, ann, colours = write_coco(root)
    out = root / "packed"
    fastload.pack_coco(img_dir, out, annotations=ann, workers=1, progress=False)
    # the two 90x120 images only: batches of one size
    data = json.loads(ann.read_text())
    same = {data["images"][0]["id"], data["images"][4]["id"]}
    data["images"] = [im for im in data["images"] if im["id"] in same]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in same]
    (root / "same.json").write_text(json.dumps(data))
    fastload.pack_coco(img_dir, root / "same", annotations=root / "same.json", workers=1, progress=False)
    return out, root / "same", colours


def _original_boxes(n: int) -> np.ndarray:
    return np.array([[x, y, x + w, y + h] for x, y, w, h, _, _ in IMAGES[n][1]], np.float32).reshape(-1, 4)


@pytest.mark.parametrize("min_size,max_size", [(64, 100), (150, 260)])
def test_sizes_and_boxes_are_torchvision_generalized_rcnn_resize(packed, min_size, max_size):
    """Kills: a scale from the wrong side, round instead of floor, x scaled by the height ratio."""
    from torchvision.models.detection.transform import GeneralizedRCNNTransform

    out, _, _ = packed
    tv = GeneralizedRCNNTransform(min_size, max_size, [0.0] * 3, [1.0] * 3).eval()
    loader = DetectionLoader(out, 1, min_size=min_size, max_size=max_size)
    for n, (images, targets) in enumerate(loader):
        (h, w), _ = IMAGES[n]
        want_img, want_t = tv.resize(torch.zeros(3, h, w), {"boxes": torch.from_numpy(_original_boxes(n))})
        assert tuple(images.shape[-2:]) == tuple(want_img.shape[-2:]), n
        torch.testing.assert_close(targets[0]["boxes"], want_t["boxes"], rtol=0, atol=1e-4)


def _check_colours(images, targets, ids, colours, flipped=None):
    """Every box encloses exactly its painted colour (within a pixel of blending at the edges)."""
    seen = 0
    for k, (img, t) in enumerate(zip(images, targets)):
        img = img.cpu().numpy()
        for box, colour in zip(t["boxes"].cpu().numpy(), colours[ids[k]]):
            found = colour_box(img, colour)
            assert found is not None, (ids[k], colour)
            np.testing.assert_allclose(found, box, atol=1.5, err_msg=f"image {ids[k]} colour {colour}")
            seen += 1
    return seen


@pytest.mark.parametrize("flip", [0.0, 1.0])
@pytest.mark.parametrize("min_size,max_size", [(64, 100), (150, 260)])
def test_every_box_encloses_its_colour_after_resize_and_flip(packed, flip, min_size, max_size):
    """Kills: boxes not flipped (or flipped about the old width), boxes not scaled, pixels flipped twice."""
    out, _, colours = packed
    loader = DetectionLoader(out, 3, fields=("image", "boxes", "image_id"), min_size=min_size, max_size=max_size, flip=flip)
    seen = 0
    for images, targets in loader:
        ids = [int(t["image_id"]) for t in targets]
        seen += _check_colours(images, targets, ids, colours)
    assert seen == sum(len(b) for _, b in IMAGES)


def test_seeded_flips_differ_per_sample_and_repeat(packed):
    """A flip probability of 0.5 flips some images and not others, the same ones on a rerun of the epoch."""
    out, _, colours = packed
    loader = fastload.FastLoader(out, 2, fields=("image", "boxes", "image_id"), shuffle=True, flip=0.5, seed=3,
                                 min_size=64, max_size=100, device="cpu")  # fmt: skip
    assert isinstance(loader, DetectionLoader)

    def run():
        loader.set_epoch(0)
        got = []
        for images, targets in loader:
            ids = [int(t["image_id"]) for t in targets]
            _check_colours(images, targets, ids, colours)
            got += [(i, t["boxes"].numpy().tolist()) for i, t in zip(ids, targets)]
        return got

    first = run()
    assert first == run()
    assert sorted(i for i, _ in first) == sorted(colours)
    unflipped = DetectionLoader(out, 6, fields=("image", "boxes", "image_id"), min_size=64, max_size=100)
    _, plain = next(iter(unflipped))
    plain_boxes = {int(t["image_id"]): t["boxes"].numpy().tolist() for t in plain}
    flipped = [i for i, b in first if b and b != plain_boxes[i]]
    kept = [i for i, b in first if b and b == plain_boxes[i]]
    assert flipped and kept, (flipped, kept)


def test_targets_are_torchvision_detection_dicts(packed):
    """``FastLoader(..., fields=("image", "boxes"))``: a tensor when the sizes agree, else a list; labels as packed."""
    out, same, _ = packed
    loader = fastload.FastLoader(same, 8, fields=("image", "boxes"), min_size=60, max_size=100, device="cpu")
    images, targets = next(iter(loader))
    assert isinstance(images, torch.Tensor) and images.shape == (2, 3, 60, 80) and images.dtype == torch.float32
    assert 0.0 <= float(images.min()) and float(images.max()) <= 1.0
    images, targets = next(iter(fastload.FastLoader(out, 8, fields=("image", "boxes"), min_size=60, max_size=100, device="cpu")))
    assert isinstance(images, list) and len(images) == len(IMAGES)
    ds = fastload.Dataset(out)
    for i, t in enumerate(targets):
        assert set(t) == {"boxes", "labels"}
        assert t["boxes"].dtype == torch.float32 and t["boxes"].shape == (len(IMAGES[i][1]), 4)
        assert t["labels"].dtype == torch.int64
        np.testing.assert_array_equal(t["labels"].numpy(), ds.fields(i, ["labels"])["labels"])


def test_faster_rcnn_trains_and_evaluates_on_the_batches(packed):
    """A few CPU steps of torchvision's fasterrcnn_mobilenet_v3_large_320_fpn on the loader's batches."""
    from torchvision.models.detection import fasterrcnn_mobilenet_v3_large_320_fpn

    out, _, _ = packed
    torch.manual_seed(0)
    model = fasterrcnn_mobilenet_v3_large_320_fpn(weights=None, weights_backbone=None, num_classes=4, min_size=96, max_size=160)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    loader = fastload.FastLoader(out, 2, fields=("image", "boxes"), shuffle=True, flip=0.5, min_size=96, max_size=160, device="cpu")
    model.train()
    steps = 0
    for images, targets in loader:
        losses = model(images if isinstance(images, list) else list(images), targets)
        assert {"loss_classifier", "loss_box_reg", "loss_objectness", "loss_rpn_box_reg"} <= set(losses)
        loss = sum(losses.values())
        assert torch.isfinite(loss)
        opt.zero_grad()
        loss.backward()
        opt.step()
        steps += 1
    assert steps == 3
    model.eval()
    images, _ = next(iter(DetectionLoader(out, 2, min_size=96, max_size=160)))
    with torch.no_grad():
        preds = model(list(images))
    assert len(preds) == 2 and all(p["boxes"].shape[-1] == 4 for p in preds)


def test_bad_arguments_name_themselves(packed, tmp_path):
    out, _, _ = packed
    with pytest.raises(ConfigError, match=r"flip must be a probability in \[0, 1\], got 2"):
        DetectionLoader(out, 2, flip=2)
    with pytest.raises(ConfigError, match="min_size must be an int in [[]1, 8192], got 0"):
        DetectionLoader(out, 2, min_size=0)
    with pytest.raises(ConfigError, match="max_size=50 is below min_size=60"):
        DetectionLoader(out, 2, min_size=60, max_size=50)
    with pytest.raises(ConfigError, match="fields must include 'boxes'"):
        DetectionLoader(out, 2, fields=("image", "labels"))
    with pytest.raises(ConfigError, match="'masks' is not a field of this dataset"):
        DetectionLoader(out, 2, fields=("image", "boxes", "masks"))
    with pytest.raises(ConfigError, match=r"mean=\(0.5, 0.5, 0.5\) not supported with boxes yet"):
        fastload.FastLoader(out, 2, fields=("image", "boxes"), mean=(0.5, 0.5, 0.5))
    with pytest.raises(ConfigError, match="min_size=10 applies to detection batches"):
        fastload.FastLoader(out, 2, min_size=10)
    plain = tmp_path / "plain"
    fastload.pack_dataset([{"image": np.zeros((8, 8, 3), np.uint8), "label": 0, "caption": "x"}], plain, progress=False)
    with pytest.raises(ConfigError, match="has no 'boxes' field of kind float32\\[\\]\\[4\\]"):
        DetectionLoader(plain, 1)


@pytest.mark.parametrize("flip", [0.0, 1.0])
def test_instance_masks_cover_their_painted_colour_after_resize_and_flip(tmp_path, flip):
    """Kills: masks not flipped, masks resized to another size than the image, instance k not box k."""
    from coco_fixture import colour_mask

    out = tmp_path / "packed"
    colours = pack_painted(tmp_path / "src", out)
    loader = DetectionLoader(out, 3, fields=("image", "boxes", "mask", "image_id"), min_size=64, max_size=100, flip=flip)
    seen = 0
    for images, targets in loader:
        for img, t in zip(images, targets):
            img = img.numpy()
            masks = t["masks"]
            assert masks.dtype == torch.uint8 and masks.shape == (len(t["boxes"]), *img.shape[1:])
            for m, colour in zip(masks.numpy().astype(bool), colours[int(t["image_id"])]):
                painted = colour_mask(img, colour)
                iou = (m & painted).sum() / (m | painted).sum()
                assert iou > 0.8, (int(t["image_id"]), colour, iou)
                seen += 1
    assert seen == sum(len(b) for _, b in IMAGES)


def test_semantic_mask_is_one_label_image(tmp_path):
    img_dir, ann, _ = write_coco(tmp_path / "src")
    out = tmp_path / "packed"
    fastload.pack_coco(img_dir, out, annotations=ann, masks="semantic", workers=1, progress=False)
    _, targets = next(iter(DetectionLoader(out, 1, fields=("image", "boxes", "mask"), min_size=90, max_size=120)))
    mask = targets[0]["mask"]
    assert mask.dtype == torch.int64 and mask.shape == (90, 120)
    assert sorted(torch.unique(mask).tolist()) == [0, *sorted(set(targets[0]["labels"].tolist()))]


def test_deeplabv3_trains_on_semantic_masks(tmp_path):
    """A few CPU steps of torchvision's deeplabv3_mobilenet_v3_large on images and their semantic masks."""
    from torchvision.models.segmentation import deeplabv3_mobilenet_v3_large

    img_dir, ann, _ = write_coco(tmp_path / "src")
    data = json.loads(ann.read_text())
    same = {data["images"][0]["id"], data["images"][4]["id"]}  # the two 90x120 images: one batch tensor
    data["images"] = [im for im in data["images"] if im["id"] in same]
    data["annotations"] = [a for a in data["annotations"] if a["image_id"] in same]
    (tmp_path / "same.json").write_text(json.dumps(data))
    out = tmp_path / "packed"
    fastload.pack_coco(img_dir, out, annotations=tmp_path / "same.json", masks="semantic", workers=1, progress=False)
    torch.manual_seed(0)
    model = deeplabv3_mobilenet_v3_large(weights=None, weights_backbone=None, num_classes=4).train()
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = fastload.FastLoader(out, 2, fields=("image", "boxes", "mask"), flip=0.5, shuffle=True, min_size=90, max_size=120, device="cpu")
    losses = []
    for _ in range(3):
        for images, targets in loader:
            assert isinstance(images, torch.Tensor) and images.shape == (2, 3, 90, 120)
            mask = torch.stack([t["mask"] for t in targets])
            loss = torch.nn.functional.cross_entropy(model(images)["out"], mask)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses.append(float(loss))
    assert len(losses) == 3 and all(np.isfinite(losses))


def test_fastloader_signature_is_still_its_init():
    """Kills: __new__'s (*args, **kwargs) showing as FastLoader's signature in help() and IDEs."""
    import inspect

    params = list(inspect.signature(fastload.FastLoader).parameters)
    assert params[:3] == ["dataset", "batch_size", "shuffle"] and "fields" in params and "args" not in params


def test_ranks_share_each_epoch_as_distributed_sampler(packed):
    """Kills: every rank serving the whole epoch, ranks overlapping beyond the padding, unequal shares."""
    out, _, _ = packed
    n = len(IMAGES)
    for world in (1, 4):
        ids = []
        for rank in range(world):
            loader = DetectionLoader(out, 2, fields=("image", "boxes", "image_id"), shuffle=True, seed=5, min_size=32, max_size=64,
                                     rank=rank, world_size=world)  # fmt: skip
            got = [int(t["image_id"]) for _, targets in loader for t in targets]
            assert len(got) == -(-n // world) and len(loader) == -(-len(got) // 2)
            ids += got
        want = torch.utils.data.DistributedSampler(list(range(n)), num_replicas=world, rank=0, shuffle=False)
        assert len(ids) == len(want) * world  # padded to equal shares, as DistributedSampler pads
        assert sorted(set(ids)) == sorted(100 + 7 * k for k in range(n))
    with pytest.raises(ConfigError, match=r"rank must be an int in \[0, world_size=2\), got 2"):
        DetectionLoader(out, 2, rank=2, world_size=2)
    with pytest.raises(ConfigError, match="give both rank and world_size or neither"):
        DetectionLoader(out, 2, rank=0)


def test_a_loop_left_early_leaves_no_thread_and_the_next_epoch_is_whole(packed):
    """The batch decoded ahead is finished or dropped when a loop breaks; kills threads left running."""
    import threading

    out, _, _ = packed
    loader = DetectionLoader(out, 2, fields=("image", "boxes", "image_id"), min_size=32, max_size=64)
    it = iter(loader)
    next(it)
    it.close()  # what a `break` does to the generator
    assert not [t for t in threading.enumerate() if t.name.startswith("fastload-detect")]
    loader.set_epoch(0)
    assert [int(t["image_id"]) for _, ts in loader for t in ts] == [100 + 7 * k for k in range(len(IMAGES))]
