"""The CPU loader's pixels, image by image, against the reference in ``tests/reference.py``.

The fixtures are position images (``tests/conftest.py``: R = x, G = y, B = label and a
checkerboard), so a crop in the wrong place, of the wrong shape, flipped the wrong way,
resized with the wrong filter, the same every epoch, or resumed into the wrong batch
changes the output far beyond the tolerances (justified in ``tests/reference.py``).
"""

from __future__ import annotations

import io
import json

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD, FastLoader
from fastload.augment import train_params
from fastload.pipeline import GraphSpec, build_pipeline

from conftest import ROTATED_ORIENTATIONS, pattern_label
from reference import (
    CPU_HOST,
    CUDA,
    DALI_RESIZE,
    ROTATED,
    Reference,
    as_hwc255,
    assert_close,
    difference,
    eval_geometry,
    eval_image,
    train_image,
)

CROP = 48
BATCH = 5


@pytest.fixture(scope="module")
def ref(pixel_dataset) -> Reference:
    return Reference(pixel_dataset.packed)


def _loader(pixel_dataset, **kw) -> FastLoader:
    kw = {"device": "cpu", "crop": CROP, "num_threads": 1, **kw}
    return FastLoader(pixel_dataset.packed, kw.pop("batch_size", BATCH), **kw)


def _images(x: torch.Tensor, mean=None, std=None) -> list[np.ndarray]:
    return [as_hwc255(im, mean, std) for im in x]


def _epoch_images(loader, mean=None, std=None) -> list[tuple[list[np.ndarray], list[int]]]:
    return [(_images(x, mean, std), y.tolist()) for x, y in loader]


def _by_sample(loader) -> list[np.ndarray]:
    """One unshuffled epoch's uint8 outputs, one per sample in index order."""
    return [im for ims, _ in _epoch_images(loader) for im in ims]


def _flipped(im: np.ndarray) -> bool:
    """Whether an output of a position image is mirrored: R (= x) falls from left to right."""
    return bool(im[:, -1, 0].mean() < im[:, 0, 0].mean())


# ----------------------------------------------------------------------------- the reference and the fixtures


def test_the_reference_is_torchvision(pixel_dataset, ref):
    """The reference's training and evaluation images are torchvision's, on every fixture."""
    F = pytest.importorskip("torchvision.transforms.functional")
    from torchvision.transforms import InterpolationMode

    w = np.array([im.shape[1] for im in ref.images])
    h = np.array([im.shape[0] for im in ref.images])
    boxes, _ = train_params(w, h, seed=0, epoch=0, positions=np.arange(len(ref)), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5)
    for i, (rgb, box) in enumerate(zip(ref.images, boxes)):
        x, y, bw, bh = (int(v) for v in box)
        pil = Image.fromarray(rgb)
        tv = F.resized_crop(pil, y, x, bh, bw, [CROP, CROP], InterpolationMode.BILINEAR, antialias=True)
        assert np.array_equal(np.asarray(F.hflip(tv)), train_image(rgb, box, True, crop=CROP)), i
        tv = F.center_crop(F.resize(pil, 55, InterpolationMode.BILINEAR, antialias=True), 48)
        assert np.array_equal(np.asarray(tv), eval_image(rgb, resize=55, crop=48)), i


def test_the_fixtures_are_stored_as_written_and_show_every_mistake(pixel_dataset, ref):
    """The JPEGs are stored byte for byte, read back within 2 levels of the pattern, and each
    mistake the loader tests look for moves the output by more than the loosest tolerance."""
    ds = fastload.Dataset(pixel_dataset.packed)
    for i in range(len(ds)):
        path = pixel_dataset.src / ds.source_path(i)
        assert ds[i][0] == path.read_bytes(), path
        assert (ref.images[i].shape[1], ref.images[i].shape[0]) == pixel_dataset.sizes[i]
        assert pattern_label(ref.images[i]) == ref.labels[i] == pixel_dataset.labels[i]
    loosest = CUDA[1]
    for i, rgb in enumerate(ref.images):
        H, W = rgb.shape[:2]
        for box in ((4, 6, W // 2, H // 2), (2, 3, W - 6, H - 7), (W // 3, 0, 20, 31)):
            x, y, w, h = box
            good = train_image(rgb, box, False, crop=CROP)
            wrong = {
                "1 px right": train_image(rgb, (x + 1, y, w, h), False, crop=CROP),
                "1 px down": train_image(rgb, (x, y + 1, w, h), False, crop=CROP),
                "flipped": train_image(rgb, box, True, crop=CROP),
                "nearest": train_image(rgb, box, False, crop=CROP, resample=Image.NEAREST),
            }
            if x + h <= W and y + w <= H and abs(w - h) >= 4:
                wrong["w and h swapped"] = train_image(rgb, (x, y, h, w), False, crop=CROP)
            for name, other in wrong.items():
                assert difference(other, good).mean > 2 * loosest, (i, box, name)
        good = eval_image(rgb, resize=56, crop=48)
        (nw, nh), (left, top) = eval_geometry(W, H, resize=56, crop=48)
        big = np.asarray(Image.fromarray(rgb).resize((nw, nh), Image.BILINEAR))
        for dx, dy in ((2, 0), (-2, 0), (0, 2), (0, -2)):
            if 0 <= left + dx <= nw - 48 and 0 <= top + dy <= nh - 48:
                off = big[top + dy : top + dy + 48, left + dx : left + dx + 48]
                assert difference(off, good).mean > 2 * loosest, (i, dx, dy)


# ----------------------------------------------------------------------------- training crops


@pytest.mark.parametrize(
    "epoch, normalised, channels_last", [(0, False, False), (3, True, True)], ids=["epoch0-uint8", "epoch3-normalised"]
)
def test_training_batches_match_the_reference_per_image(pixel_dataset, ref, epoch, normalised, channels_last):
    norm = {} if normalised else {"mean": None, "std": None}
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalised else (None, None)
    with _loader(pixel_dataset, seed=17, channels_last=channels_last, **norm) as loader:
        loader.set_epoch(epoch)
        got = _epoch_images(loader, mean, std)
    want = ref.train_epoch(batch_size=BATCH, seed=17, epoch=epoch, crop=CROP)
    assert len(got) == len(want) == -(-len(ref) // BATCH)
    flips = []
    for b, ((images, labels), exp) in enumerate(zip(got, want)):
        assert labels == exp.labels
        for k, (im, r, i) in enumerate(zip(images, exp.images, exp.indices)):
            assert_close(im, r, CPU_HOST, what=f"epoch {epoch} batch {b} image {k} (sample {i}, box {exp.boxes[k]}, flip {exp.flips[k]})")
            assert pattern_label(im) == labels[k]
            assert _flipped(im) == bool(exp.flips[k])
            flips.append(bool(exp.flips[k]))
    assert 0 < sum(flips) < len(flips)  # both branches were looked at


def test_crops_take_the_ratio_range_as_width_over_height(pixel_dataset, ref):
    """Wide crops (ratio 2..2.5) show in the pixels: the x gradient spans more of the source
    than the y gradient. Swapped width and height would make them tall."""
    ratio, scale = (2.0, 2.5), (0.15, 0.35)
    with _loader(pixel_dataset, seed=5, ratio=ratio, scale=scale, mean=None, std=None, shuffle=False) as loader:
        got = _by_sample(loader)
    want = [im for b in ref.train_epoch(batch_size=BATCH, seed=5, epoch=0, crop=CROP, ratio=ratio, scale=scale, shuffle=False) for im in b.images]
    w = np.array([im.shape[1] for im in ref.images])
    h = np.array([im.shape[0] for im in ref.images])
    boxes, _ = train_params(w, h, seed=5, epoch=0, positions=np.arange(len(ref)), scale=scale, ratio=ratio, flip=0.5)
    aspect = boxes[:, 2] / boxes[:, 3]
    assert (aspect > 1.9).all() and (aspect < 2.6).all(), aspect
    for i, (im, r) in enumerate(zip(got, want)):
        assert_close(im, r, CPU_HOST, what=f"sample {i}")
        W, H = ref.images[i].shape[1], ref.images[i].shape[0]
        r_span = abs(im[:, -1, 0].mean() - im[:, 0, 0].mean()) / 255 * (W - 1)  # source columns covered
        g_span = abs(im[-1, :, 1].mean() - im[0, :, 1].mean()) / 255 * (H - 1)  # source rows covered
        assert 1.7 < r_span / g_span < 2.9, (i, r_span, g_span)


def test_crops_and_flips_change_with_the_epoch_and_come_back_with_it(pixel_dataset):
    with _loader(pixel_dataset, seed=8, shuffle=False, mean=None, std=None) as loader:
        epochs = [_by_sample(loader) for _ in range(3)]  # epochs 0, 1, 2 (shuffle off: sample i at position i)
        loader.set_epoch(1)
        again = _by_sample(loader)
    n = len(epochs[0])
    for a, b in ((0, 1), (1, 2), (0, 2)):
        moved = sum(difference(x, y).mean > 2 * CUDA[1] for x, y in zip(epochs[a], epochs[b]))
        assert moved >= 0.9 * n, f"only {moved} of {n} samples changed between epochs {a} and {b}"
    flips = np.array([[_flipped(im) for im in e] for e in epochs])
    assert (flips.min(axis=0) != flips.max(axis=0)).sum() >= n // 4  # flips are redrawn each epoch
    assert all(np.array_equal(x, y) for x, y in zip(again, epochs[1]))


def test_same_seed_same_pixels_and_another_seed_other_crops(pixel_dataset):
    def run(seed, shuffle):
        with _loader(pixel_dataset, seed=seed, shuffle=shuffle, mean=None, std=None) as loader:
            loader.set_epoch(2)
            return [(x.clone(), y.clone()) for x, y in loader]

    a, b = run(21, True), run(21, True)
    assert len(a) == len(b) and all(torch.equal(x1, x2) and torch.equal(y1, y2) for (x1, y1), (x2, y2) in zip(a, b))
    c, d = run(21, False), run(22, False)  # unshuffled: the same sample at each place, other crops
    same = [as_hwc255(im) for x, _ in c for im in x]
    other = [as_hwc255(im) for x, _ in d for im in x]
    moved = sum(difference(p, q).mean > 2 * CUDA[1] for p, q in zip(same, other))
    assert moved >= 0.9 * len(same)


# ----------------------------------------------------------------------------- resume


@pytest.fixture(scope="module")
def straight_run(pixel_dataset) -> list[list[tuple[torch.Tensor, torch.Tensor]]]:
    """Epochs 2, 3 and 4 of seed 4, read straight through."""
    with _loader(pixel_dataset, seed=4, mean=None, std=None) as loader:
        loader.set_epoch(2)
        return [[(x.clone(), y.clone()) for x, y in loader] for _ in range(3)]


def _same_batches(got, want, what):
    assert len(got) == len(want), f"{what}: {len(got)} batches, expected {len(want)}"
    for k, ((x1, y1), (x2, y2)) in enumerate(zip(got, want)):
        assert torch.equal(y1, y2) and torch.equal(x1, x2), f"{what}: batch {k} differs"


@pytest.mark.parametrize("where", ["start", "middle", "after-last-batch", "after-the-epoch"])
def test_resume_yields_exactly_the_remaining_pixels(pixel_dataset, ref, straight_run, where):
    with _loader(pixel_dataset, seed=4, mean=None, std=None) as a:
        a.set_epoch(2)
        n = len(a)
        done = {"start": 0, "middle": n // 2, "after-last-batch": n, "after-the-epoch": n}[where]
        it = iter(a)
        for _ in range(done):
            next(it)
        if where == "after-the-epoch":
            with pytest.raises(StopIteration):
                next(it)
        state = json.loads(json.dumps(a.state_dict()))
    with _loader(pixel_dataset, seed=4, mean=None, std=None) as b:
        b.load_state_dict(state)
        rest = [(x.clone(), y.clone()) for x, y in b]
        following = [(x.clone(), y.clone()) for x, y in b]
    e2, e3, e4 = straight_run
    if done < n:
        _same_batches(rest, e2[done:], f"resumed at batch {done} of epoch 2")
        _same_batches(following, e3, "the epoch after it")
    else:  # a state taken after the last batch resumes into the next epoch, whole
        _same_batches(rest, e3, f"resumed from a state taken {where} of epoch 2")
        _same_batches(following, e4, "the epoch after it")
    # and those are the reference's pixels, not only the same ones twice
    want = ref.train_epoch(batch_size=BATCH, seed=4, epoch=2 if done < n else 3, crop=CROP, start=done if done < n else 0)
    for (x, y), exp in zip(rest, want):
        assert y.tolist() == exp.labels
        for k, (im, r) in enumerate(zip(x, exp.images)):
            assert_close(as_hwc255(im), r, CPU_HOST, what=f"resumed image {k} (sample {exp.indices[k]})")


# ----------------------------------------------------------------------------- evaluation


@pytest.mark.parametrize("resize, crop, normalised", [(56, 48, False), (64, 56, True), (55, 48, False)])
def test_evaluation_matches_resize_and_center_crop_per_image(pixel_dataset, ref, resize, crop, normalised):
    norm = {} if normalised else {"mean": None, "std": None}
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalised else (None, None)
    with _loader(pixel_dataset, train=False, shuffle=False, resize=resize, crop=crop, **norm) as loader:
        got = _epoch_images(loader, mean, std)
    want = ref.eval_epoch(batch_size=BATCH, resize=resize, crop=crop)
    assert len(got) == len(want)
    for (images, labels), exp in zip(got, want):
        assert labels == exp.labels
        for im, r, i in zip(images, exp.images, exp.indices):
            assert_close(im, r, DALI_RESIZE, what=f"sample {i} ({ref.images[i].shape[1]}x{ref.images[i].shape[0]})")
            assert not _flipped(im)


def test_loader_dataset_items_are_the_reference(pixel_dataset, ref):
    """``loader.dataset[i]``: the training item of the loader's current epoch, and the evaluation item."""
    with _loader(pixel_dataset, seed=3, mean=None, std=None) as loader:
        loader.set_epoch(2)
        w = np.array([im.shape[1] for im in ref.images])
        h = np.array([im.shape[0] for im in ref.images])
        boxes, flips = train_params(w, h, seed=3, epoch=2, positions=np.arange(len(ref)), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5)
        for i in range(len(ref)):
            x, label = loader.dataset[i]
            assert label == ref.labels[i]
            assert_close(as_hwc255(x), train_image(ref.images[i], boxes[i], bool(flips[i]), crop=CROP), CPU_HOST, what=f"train item {i}")
    with _loader(pixel_dataset, train=False, resize=56, crop=48, mean=None, std=None) as loader:
        for i in range(len(ref)):
            x, _ = loader.dataset[i]
            assert_close(as_hwc255(x), eval_image(ref.images[i], resize=56, crop=48), CPU_HOST, what=f"eval item {i}")


# ----------------------------------------------------------------------------- the DALI training graph


def test_the_dali_training_graph_crops_resizes_and_mirrors_per_image(pixel_dataset, ref):
    """The graph FastLoader runs on CUDA (decode the crop window, resize, mirror, normalise), built
    here on DALI's CPU backend: each image must be the reference, mirrored exactly when its flag is set."""
    ds = fastload.Dataset(pixel_dataset.packed)
    payloads = [np.frombuffer(ds[i][0], dtype=np.uint8) for i in range(len(ds))]
    w = np.array([im.shape[1] for im in ref.images])
    h = np.array([im.shape[0] for im in ref.images])
    boxes, flips = train_params(w, h, seed=9, epoch=1, positions=np.arange(len(ds)), scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3), flip=0.5)
    assert 0 < flips.sum() < len(flips)
    spec = GraphSpec(
        batch_size=len(ds), num_threads=1, device_id=None, train=True, crop=CROP, resize=55, mean=None, std=None,
        out_dtype="uint8", channels_last=True, prefetch=1, hw_decoder_load=None, host_finish=False,
    )  # fmt: skip
    pipe = build_pipeline(spec, lambda: (payloads, list(boxes[:, :2]), list(boxes[:, 2:]), list(flips)))
    out = pipe.run()[0].as_array()  # NHWC uint8
    assert out.shape == (len(ds), CROP, CROP, 3)
    for i in range(len(ds)):
        want = train_image(ref.images[i], boxes[i], bool(flips[i]), crop=CROP)
        assert_close(out[i], want, DALI_RESIZE, what=f"sample {i}, flip {flips[i]}")
        assert difference(out[i], want[:, ::-1]).mean > 2 * CUDA[1]  # and not its mirror image


# ----------------------------------------------------------------------------- EXIF


def _turned(path, transpose: "Image.Transpose | None" = None) -> np.ndarray:
    """The source file's pixels turned upright as PIL's ``exif_transpose`` does (``transpose``
    None), or as they are (``transpose`` -1), or with one given transpose."""
    with Image.open(path) as im:
        if transpose is None:
            return np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        rgb = im.convert("RGB")
        return np.asarray(rgb if transpose == -1 else rgb.transpose(transpose))


def _rotated_sources(rotated_dataset) -> list:
    ds = fastload.Dataset(rotated_dataset.packed)
    return [rotated_dataset.src / ds.source_path(i) for i in range(len(ds))]


def test_exif_rotated_samples_come_out_upright(rotated_dataset):
    sources = _rotated_sources(rotated_dataset)
    with FastLoader(rotated_dataset.packed, 3, device="cpu", train=False, shuffle=False, resize=56, crop=48, mean=None, std=None) as loader:
        x, y = next(iter(loader))
    assert y.tolist() == list(range(len(ROTATED_ORIENTATIONS)))
    for i, (path, orientation) in enumerate(zip(sources, ROTATED_ORIENTATIONS)):
        got = as_hwc255(x[i])
        upright = _turned(path)
        assert (upright.shape[1], upright.shape[0]) == rotated_dataset.sizes[i]
        assert_close(got, eval_image(upright, resize=56, crop=48), ROTATED, what=f"orientation {orientation}")
        for t in [-1, *Image.Transpose]:  # every other way to turn or mirror it is far off
            wrong = _turned(path, t)
            if wrong.shape == upright.shape and not np.array_equal(wrong, upright):
                assert difference(got, eval_image(wrong, resize=56, crop=48)).mean > 4 * ROTATED[1], (orientation, t)
