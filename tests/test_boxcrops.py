"""Detection crops: boxes and masks still on their pixels after crop + resize + flip, the crop laws torchvision's.

Oracles, each independent of the code under test:

* the pixels: every box of the fixture is painted in its own colour, so a kept box must be
  the extent of its colour in the output image, and an instance mask must be exactly the
  packed mask (read back here with PIL) cut to the window and resized by nearest neighbour
  (written out here: output pixel ``x`` takes source pixel ``floor((x + 0.5) * in / out)``),
  flipped with the image, and cover its colour;
* the boxes dropped: counted from the painted rectangles (the fixture's integer boxes) inside
  the window, scaled to the output, against ``SanitizeBoundingBoxes``' ``min_size`` (and, for the
  IoU crop, the centre rule written out here);
* torchvision itself: ``RandomIoUCrop`` and ``RandomResizedCrop``'s own ``make_params`` drawn many
  times (fixed seeds) against the loader's windows as distributions, and torchvision v2's
  functional ``crop``/``resize``/``horizontal_flip`` + ``SanitizeBoundingBoxes`` on
  ``tv_tensors.BoundingBoxes`` for one draw's window.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import fastload
from fastload import boxcrops
from fastload.augment import uniforms
from fastload.detection import DetectionLoader
from fastload.errors import ConfigError

from coco_fixture import IMAGES, colour_box, colour_mask, write_coco

torchvision = pytest.importorskip("torchvision")


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("crops")
    img_dir, ann, colours = write_coco(root)
    plain, masked = root / "plain", root / "masked"
    fastload.pack_coco(img_dir, plain, annotations=ann, workers=1, progress=False)
    fastload.pack_coco(img_dir, masked, annotations=ann, masks="instance", workers=1, progress=False)
    return {None: plain, "instance": masked}, colours


def _painted(n: int) -> list[np.ndarray]:
    """Each box's painted pixels in image ``n`` as an HxW bool array (from the fixture's integers)."""
    (h, w), boxes = IMAGES[n]
    out = []
    for x, y, bw, bh, _, _ in boxes:
        m = np.zeros((h, w), bool)
        m[y : y + bh, x : x + bw] = True
        out.append(m)
    return out


def _nearest(a: np.ndarray, new: tuple[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """Nearest-neighbour resize of a 2-D array: output pixel x takes source floor((x + 0.5) * in / out).

    Returned twice: where that falls within 0.01 of a source pixel's edge (a tie, which PIL's
    16.16 fixed-point arithmetic may round down), the second takes the pixel before it.
    """
    (h, w), idx = a.shape, []
    for n_in, n_out in ((h, new[0]), (w, new[1])):
        src = (np.arange(n_out) + 0.5) * n_in / n_out
        idx.append((np.floor(src).astype(int), np.maximum(np.floor(src - 0.01).astype(int), 0)))
    (ys, ys2), (xs, xs2) = idx
    return a[ys][:, xs], a[ys2][:, xs2]


def _stored_masks(path, n: int) -> list[np.ndarray] | None:
    """Each box's mask of sample ``n`` as packed (the label image read back with PIL, pixel k + 1 is box k)."""
    import io

    from PIL import Image

    ds = fastload.Dataset(path)
    if "mask" not in ds.schema.names:
        return None
    lab = np.asarray(Image.open(io.BytesIO(ds.fields(n, ["mask"])["mask"])))
    return [lab == k + 1 for k in range(len(IMAGES[n][1]))]


def _expected(n: int, win, new: tuple[int, int], kind: str, stored=None, min_box: float = 1.0):
    """Which boxes of image ``n`` survive ``win`` and the resize to ``new`` (counted on the painted
    rectangles), and their stored masks cut to the window and resized by nearest neighbour."""
    (h, w), boxes = IMAGES[n]
    top, left, wh, ww = (0, 0, h, w) if win is None else (win.top, win.left, win.height, win.width)
    kept, masks = [], []
    for k, m in enumerate(_painted(n)):
        cut = m[top : top + wh, left : left + ww]
        cols, rows = int(cut.any(axis=0).sum()), int(cut.any(axis=1).sum())  # painted columns and rows in the window
        ok = cols * new[1] / ww >= min_box and rows * new[0] / wh >= min_box
        if kind == "iou" and win is not None:
            x, y, bw, bh = boxes[k][:4]
            cx, cy = x + bw / 2, y + bh / 2
            ok &= left < cx < left + ww and top < cy < top + wh
        if ok:
            kept.append(k)
            if stored is not None:
                masks.append(_nearest(stored[k][top : top + wh, left : left + ww], new))
    return kept, masks


CASES = [
    (kind, flip, masks, size)
    for kind in ("iou", "resized")
    for flip in (0.0, 1.0)
    for masks in (None, "instance")
    for size in (None, (50, 70))
]


@pytest.mark.parametrize("kind,flip,masks,size", CASES)
def test_kept_boxes_enclose_their_colour_and_dropped_ones_left_the_window(packed, kind, flip, masks, size):
    """Kills: boxes not shifted by the window or not clipped to it, the flip about the image's width
    before the crop, boxes kept whose colour left the window (or dropped while it is there), labels
    or masks not dropped with their box, masks not cut with the window, instance k not box k."""
    paths, colours = packed
    fields = ("image", "boxes", "image_id", "iscrowd") + (("mask",) if masks else ())
    loader = DetectionLoader(paths[masks], 2, fields=fields, crop=kind, flip=flip, size=size, min_size=64, max_size=100, seed=11)
    cropped = kept_total = dropped_total = 0
    for epoch in range(4):  # four epochs: many windows per image
        loader.set_epoch(epoch)
        for images, targets in loader:
            for img, t in zip(images, targets):
                n = (int(t["image_id"]) - 100) // 7
                (h, w), boxes = IMAGES[n]
                win = boxcrops.window(loader.crop, np.array([[x, y, x + bw, y + bh] for x, y, bw, bh, _, _ in boxes], np.float32),
                                      h, w, seed=11, epoch=epoch, index=n)  # fmt: skip
                cropped += win is not None
                new = tuple(img.shape[1:])
                if size is not None:
                    assert new == size
                kept, want_masks = _expected(n, win, new, kind, _stored_masks(paths[masks], n) if masks else None)
                assert len(t["boxes"]) == len(kept), (n, epoch, win, t["boxes"], kept)
                kept_total += len(kept)
                dropped_total += len(boxes) - len(kept)
                want_crowd = [boxes[k][5] for k in kept]
                assert t["iscrowd"].tolist() == want_crowd and len(t["labels"]) == len(kept)
                arr = img.numpy()
                for j, k in enumerate(kept):
                    box = t["boxes"][j].numpy()
                    assert (box[0::2] >= 0).all() and (box[0::2] <= new[1]).all() and (box[1::2] <= new[0]).all()
                    if min(box[2] - box[0], box[3] - box[1]) >= 3:  # a sliver of 1-2 px is blended away by the resize
                        found = colour_box(arr, colours[100 + 7 * n][k])
                        assert found is not None, (n, k, box)
                        np.testing.assert_allclose(found, box, atol=1.5, err_msg=f"image {n} box {k} window {win}")
                    if masks:
                        want, tie = want_masks[j]
                        if flip:
                            want, tie = want[:, ::-1], tie[:, ::-1]
                        got = t["masks"][j].numpy().astype(bool)
                        bad = (got != want) & (got != tie)
                        assert not bad.any(), (n, k, np.argwhere(bad)[:5])
                        painted = colour_mask(arr, colours[100 + 7 * n][k])
                        if painted.sum() >= 20:  # the mask covers its colour (pycocotools' polygon fill reaches a pixel further)
                            assert (got & painted).sum() / painted.sum() > 0.9, (n, k)
                if masks:
                    assert t["masks"].shape == (len(kept), *new)
    assert cropped and kept_total and dropped_total, (cropped, kept_total, dropped_total)  # the table exercised every branch


def _ks(a, b) -> float:
    """The two-sample Kolmogorov-Smirnov statistic."""
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    return float(np.abs(np.searchsorted(a, grid, side="right") / len(a) - np.searchsorted(b, grid, side="right") / len(b)).max())


#: Draws in the distribution tests (torchvision's RandomIoUCrop.make_params takes about 13 ms a
#: call here, so it is drawn fewer times). Two-sample KS: at 3000 against 3000 a statistic of
#: 0.05 has a p-value of about 1e-3 under equal laws, at 600 against 3000 (about 500 effective)
#: 0.087 has; the tolerances are above those. Rates of "no crop" agree within 0.07 (about 4 sigma).
DRAWS, TV_IOU_DRAWS = 3000, 600
KS_TOL, KS_TOL_IOU = 0.06, 0.1


@pytest.mark.parametrize("n", [1, pytest.param(3, marks=pytest.mark.slow)])
def test_iou_crop_law_is_random_iou_crops(n):
    """Kills: one uniform for both sides (the aspect's law), the centre rule dropped, the IoU
    threshold ignored, the 'no crop' option never drawn, the corner drawn over the whole image."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    (h, w), raw = IMAGES[n]
    boxes = np.array([[x, y, x + bw, y + bh] for x, y, bw, bh, _, _ in raw], np.float32)
    spec = boxcrops.crop_spec("iou")
    ours = [boxcrops.window(spec, boxes, h, w, seed=5, epoch=0, index=i) for i in range(DRAWS)]
    torch.manual_seed(0)
    tv = v2.RandomIoUCrop()
    flat = [tv_tensors.Image(torch.zeros(3, h, w)), tv_tensors.BoundingBoxes(torch.from_numpy(boxes), format="XYXY", canvas_size=(h, w))]
    theirs = [tv.make_params(flat) for _ in range(TV_IOU_DRAWS)]
    none_ours = sum(o is None for o in ours) / len(ours)
    none_theirs = sum(not p for p in theirs) / len(theirs)
    assert abs(none_ours - none_theirs) < 0.07, (none_ours, none_theirs)
    o = [x for x in ours if x is not None]
    t = [p for p in theirs if p]
    for name in ("top", "left", "height", "width"):
        ks = _ks([getattr(x, name) for x in o], [p[name] for p in t])
        assert ks < KS_TOL_IOU, (name, ks)
    assert _ks([x.width / x.height for x in o], [p["width"] / p["height"] for p in t]) < KS_TOL_IOU
    kept_o = [int(x.within.sum()) for x in o]
    kept_t = [int(p["is_within_crop_area"].sum()) for p in t]
    assert abs(np.mean(kept_o) - np.mean(kept_t)) < 0.1 * len(boxes), (np.mean(kept_o), np.mean(kept_t))


@pytest.mark.parametrize("hw,scale,ratio", [((100, 100), (0.08, 1.0), (3 / 4, 4 / 3)), ((72, 150), (0.3, 0.9), (0.5, 2.0))])
def test_resized_crop_law_is_random_resized_crops(hw, scale, ratio):
    """Kills: scale or ratio ranges swapped, width and height swapped, a corner drawn past the image."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2

    h, w = hw
    spec = boxcrops.crop_spec("resized", scale=scale, ratio=ratio)
    ours = [boxcrops.window(spec, np.zeros((0, 4), np.float32), h, w, seed=9, epoch=2, index=i) for i in range(DRAWS)]
    torch.manual_seed(1)
    tv = v2.RandomResizedCrop(32, scale=scale, ratio=ratio)
    theirs = [tv.make_params([tv_tensors.Image(torch.zeros(3, h, w))]) for _ in range(DRAWS)]
    for name in ("top", "left", "height", "width"):
        ks = _ks([getattr(x, name) for x in ours], [p[name] for p in theirs])
        assert ks < KS_TOL, (name, ks)
    assert all(x.top + x.height <= h and x.left + x.width <= w and x.top >= 0 and x.left >= 0 for x in ours)


@pytest.mark.parametrize("kind", ["iou", "resized"])
@pytest.mark.parametrize("flip", [0.0, 1.0])
def test_boxes_are_torchvisions_functional_crop_resize_flip_sanitize(packed, kind, flip):
    """The same window through torchvision v2: F.crop, (RandomIoUCrop's zeroing), F.resize,
    F.horizontal_flip on BoundingBoxes, then ClampBoundingBoxes and SanitizeBoundingBoxes. Kills: any reordering of
    the steps, a resize by the wrong window side, sanitizing before the resize."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2
    from torchvision.transforms.v2 import functional as F

    paths, _ = packed
    loader = DetectionLoader(paths[None], 1, fields=("image", "boxes", "image_id"), crop=kind, flip=flip, min_size=64, max_size=100, seed=4)
    compared = 0
    for epoch in range(3):
        loader.set_epoch(epoch)
        for _, (t,) in loader:
            n = (int(t["image_id"]) - 100) // 7
            (h, w), raw = IMAGES[n]
            boxes = torch.tensor([[x, y, x + bw, y + bh] for x, y, bw, bh, _, _ in raw], dtype=torch.float32).reshape(-1, 4)
            win = boxcrops.window(loader.crop, boxes.numpy(), h, w, seed=4, epoch=epoch, index=n)
            bb = tv_tensors.BoundingBoxes(boxes, format="XYXY", canvas_size=(h, w))
            labels = torch.arange(len(boxes))
            if win is not None:
                bb = F.crop(bb, top=win.top, left=win.left, height=win.height, width=win.width)
                if win.within is not None:
                    bb[~torch.from_numpy(win.within)] = 0
            bb = F.resize(bb, size=_new_size(loader, bb.canvas_size))
            if flip:
                bb = F.horizontal_flip(bb)
            bb = v2.ClampBoundingBoxes()(bb)  # as torchvision's docs advise before the sanitizing
            out = v2.SanitizeBoundingBoxes()({"boxes": bb, "labels": labels})
            torch.testing.assert_close(t["boxes"], out["boxes"].as_subclass(torch.Tensor), rtol=0, atol=1e-4)
            compared += 1
    assert compared == 3 * len(IMAGES)


def _new_size(loader: DetectionLoader, canvas: tuple[int, int]) -> list[int]:
    """GeneralizedRCNNTransform's output size of a ``canvas`` (h, w), written out: floor(side * scale)."""
    import math

    h, w = canvas
    s = min(loader.min_size / min(h, w), loader.max_size / max(h, w))
    return [math.floor(h * s), math.floor(w * s)]


def test_sanitize_false_keeps_every_box_and_flags_the_sanitized_ones(packed):
    """Kills: sanitize=False still dropping boxes, or the flag disagreeing with SanitizeBoundingBoxes."""
    paths, _ = packed
    keep = DetectionLoader(paths[None], 6, crop="iou", sanitize=False, min_size=64, max_size=100, seed=3)
    drop = DetectionLoader(paths[None], 6, crop="iou", min_size=64, max_size=100, seed=3)
    flagged = 0
    for epoch in range(3):
        keep.set_epoch(epoch)
        drop.set_epoch(epoch)
        (_, kt), (_, dt) = next(iter(keep)), next(iter(drop))
        for n, (a, b) in enumerate(zip(kt, dt)):
            assert len(a["boxes"]) == len(IMAGES[n][1]) and a["valid"].dtype == torch.bool
            torch.testing.assert_close(a["boxes"][a["valid"]], b["boxes"])
            torch.testing.assert_close(a["labels"][a["valid"]], b["labels"])
            flagged += int((~a["valid"]).sum())
    assert flagged


def test_same_seed_same_crops_other_seed_other_crops(packed):
    paths, _ = packed

    def boxes(seed, epoch=0):
        loader = DetectionLoader(paths[None], 6, crop="resized", min_size=64, max_size=100, seed=seed)
        loader.set_epoch(epoch)
        return [t["boxes"].tolist() for _, ts in loader for t in ts]

    assert boxes(1) == boxes(1)
    assert boxes(1) != boxes(2) and boxes(1) != boxes(1, epoch=1)


def test_crop_arguments_are_checked_naming_the_value(packed):
    paths, _ = packed
    out = paths[None]
    with pytest.raises(ConfigError, match=r"crop must be None, 'iou' .* or 'resized' .*got 'ssd'"):
        DetectionLoader(out, 1, crop="ssd")
    with pytest.raises(ConfigError, match=r"crop must be None, 'iou'.*got 224"):
        fastload.FastLoader(out, 2, fields=("image", "boxes"), crop=224)
    with pytest.raises(ConfigError, match=r"scale must be \(low, high\) with 0 < low <= high, got \(0.9, 0.2\)"):
        DetectionLoader(out, 1, crop="resized", scale=(0.9, 0.2))
    with pytest.raises(ConfigError, match=r"scale must be within \(0, 1\] for crop='iou'"):
        DetectionLoader(out, 1, crop="iou", scale=(0.3, 1.5))
    with pytest.raises(ConfigError, match=r"ratio must be a pair of numbers"):
        DetectionLoader(out, 1, crop="iou", ratio=2.0)
    with pytest.raises(ConfigError, match=r"iou_options=\[0.5\] applies to crop='iou' only"):
        DetectionLoader(out, 1, crop="resized", iou_options=[0.5])
    with pytest.raises(ConfigError, match=r"scale=\(0.5, 1.0\) applies to a crop"):
        DetectionLoader(out, 1, scale=(0.5, 1.0))
    with pytest.raises(ConfigError, match=r"iou_options must be finite and >= 0, got \[-1\]"):
        DetectionLoader(out, 1, crop="iou", iou_options=[-1])
    with pytest.raises(ConfigError, match=r"iou_trials must be an int in \[1, 10000\], got 0"):
        DetectionLoader(out, 1, crop="iou", iou_trials=0)
    with pytest.raises(ConfigError, match=r"min_box_size must be a number >= 1.*got 0.5"):
        DetectionLoader(out, 1, crop="iou", min_box_size=0.5)
    with pytest.raises(ConfigError, match=r"sanitize must be True, False or None.*got 'yes'"):
        DetectionLoader(out, 1, sanitize="yes")
    with pytest.raises(ConfigError, match=r"size\[1\] must be an int in \[1, 8192\] \(width\), got 0"):
        DetectionLoader(out, 1, size=(10, 0))
    with pytest.raises(ConfigError, match=r"size must be an int or \(height, width\), got \(1, 2, 3\)"):
        DetectionLoader(out, 1, size=(1, 2, 3))
    loader = fastload.FastLoader(out, 2, fields=("image", "boxes"), crop="iou", scale=(0.5, 1.0), size=40, device="cpu")
    assert isinstance(loader, DetectionLoader) and loader.crop.scale == (0.5, 1.0) and loader.size == (40, 40)


@pytest.mark.parametrize("kind", ["iou", "resized"])
def test_semantic_mask_is_cut_resized_and_flipped_with_the_image(tmp_path, kind):
    """Kills: a semantic mask left uncut by the window, or not flipped with the image."""
    import io

    from PIL import Image

    img_dir, ann, _ = write_coco(tmp_path / "src")
    out = tmp_path / "packed"
    fastload.pack_coco(img_dir, out, annotations=ann, masks="semantic", workers=1, progress=False)
    ds = fastload.Dataset(out)
    loader = DetectionLoader(out, 2, fields=("image", "boxes", "mask", "image_id"), crop=kind, flip=0.5, min_size=64, max_size=100, seed=8)
    for epoch in range(2):
        loader.set_epoch(epoch)
        flips = uniforms(8, epoch, np.arange(len(IMAGES)), 1)[:, 0] < 0.5  # the flip's draw, as documented
        for _, targets in loader:
            for t in targets:
                n = (int(t["image_id"]) - 100) // 7
                (h, w), raw = IMAGES[n]
                lab = np.asarray(Image.open(io.BytesIO(ds.fields(n, ["mask"])["mask"]))).astype(np.int64)
                win = boxcrops.window(loader.crop, np.array([[x, y, x + bw, y + bh] for x, y, bw, bh, _, _ in raw], np.float32).reshape(-1, 4),
                                      h, w, seed=8, epoch=epoch, index=n)  # fmt: skip
                if win is not None:
                    lab = lab[win.top : win.top + win.height, win.left : win.left + win.width]
                want, tie = _nearest(lab, tuple(t["mask"].shape))
                if flips[n]:
                    want, tie = want[:, ::-1], tie[:, ::-1]
                got = t["mask"].numpy()
                assert not ((got != want) & (got != tie)).any(), (n, epoch)
