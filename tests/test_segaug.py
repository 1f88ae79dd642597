"""The segmentation reference's transforms through FastLoader: each step's law against the class's own draws, each item against the class given the same draws, whole loaders on a VOC tree written here.

The classes compared with are torchvision v2's and the segmentation reference's own
(``tests/segmentation_reference.py``, the user module a reference user has). Laws are compared by
two-sample tests between the class's own draws (Python's ``random``, torch's generator) and
FastLoader's (its seeded uniforms); items by running the class itself on FastLoader's draws (v2:
its ``make_params`` made to return them; the reference's classes: ``random`` and ``torch.randint``
made to return the draws that give them).
"""

from __future__ import annotations

import copy
import json
import random
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("scipy.stats")
from PIL import Image  # noqa: E402
from torch.utils._pytree import tree_flatten  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.datasets import CocoDetection, VOCSegmentation, wrap_dataset_for_transforms_v2  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

import fastload  # noqa: E402
from fastload import detaug, segaug  # noqa: E402
from fastload.augment import uniforms  # noqa: E402
from fastload.errors import ConfigError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import detection_reference as dref  # noqa: E402
import segmentation_reference as sref  # noqa: E402
from item_checks import same  # noqa: E402
from law_checks import close, rates  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
N = 3000
#: (height, width) of the VOC tree's images: non-square, some below the crop size.
SIZES = [(60, 90), (75, 50), (40, 40), (33, 70), (96, 64), (50, 120)]



def write_tree(root: Path) -> Path:
    """A VOC2012 segmentation tree: gradient JPEGs, palette PNG masks (a class rectangle ringed by 255)."""
    base = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "ImageSets/Segmentation"):
        (base / d).mkdir(parents=True)
    palette = [int(v) for v in np.random.default_rng(1).integers(0, 256, 768)]
    names = []
    for k, (h, w) in enumerate(SIZES):
        name = f"2012_{k:06d}"
        names.append(name)
        rows, cols = np.mgrid[0:h, 0:w]
        px = np.stack([cols * 255 // max(w - 1, 1), rows * 255 // max(h - 1, 1), (rows + cols + 40 * k) % 256], -1).astype(np.uint8)
        Image.fromarray(px).save(base / "JPEGImages" / f"{name}.jpg", quality=95)
        mask = np.zeros((h, w), np.uint8)
        mask[h // 4 - 1 : h // 2 + 1, w // 4 - 1 : w // 2 + 1] = 255  # the border VOC marks "ignore"
        mask[h // 4 : h // 2, w // 4 : w // 2] = k + 1
        pim = Image.fromarray(mask, mode="P")
        pim.putpalette(palette)
        pim.save(base / "SegmentationClass" / f"{name}.png")
    (base / "ImageSets" / "Segmentation" / "train.txt").write_text("\n".join(names) + "\n")
    return root


@pytest.fixture(scope="module")
def voc(tmp_path_factory):
    return write_tree(tmp_path_factory.mktemp("segvoc"))


def voc_ds(root, transforms=None, wrap=False):
    ds = VOCSegmentation(str(root), year="2012", image_set="train", transforms=transforms)
    return wrap_dataset_for_transforms_v2(ds) if wrap else ds


def one(t):
    """The :class:`fastload.detaug.Program` of a single step."""
    return detaug.program(t, joint=True, where="t", kind="VOCSegmentation", route="the route")



def coords(h, w):
    """A PIL image whose pixel (r, c) holds (c, r, 7): a crop's corner is its first pixel."""
    rows, cols = np.mgrid[0:h, 0:w]
    return Image.fromarray(np.stack([cols, rows, np.full_like(rows, 7)], -1).astype(np.uint8))


# ============================================================================ (a) laws


def test_random_resize_is_randint_inclusive():
    t = sref.RandomResize(10, 16)
    step = one(t).steps[0]
    assert (step.how, step.kind) == ("seg", "seg_resize")
    image, mask = Image.new("RGB", (12, 9)), Image.new("L", (12, 9))
    random.seed(0)
    theirs = [t(image, mask)[0].size[1] for _ in range(N)]  # the shorter side (the height here) is the drawn size
    mine = [segaug.draw(step, image, seed=3, epoch=0, position=k) for k in range(N)]
    rates(theirs, mine, "resize")
    assert set(mine) == set(range(10, 17))


def test_flip_rate_is_flip_prob():
    t = sref.RandomHorizontalFlip(0.3)
    step = one(t).steps[0]
    image = Image.fromarray(np.array([[[0, 0, 0], [255, 255, 255]]], np.uint8))
    random.seed(1)
    theirs = [t(image, image)[0].getpixel((0, 0))[0] == 255 for _ in range(N)]
    mine = [bool(segaug.draw(step, image, seed=4, epoch=0, position=k)) for k in range(N)]
    rates(theirs, mine, "flip")
    assert abs(np.mean(mine) - 0.3) < 0.03


@pytest.mark.parametrize("h,w", [(30, 50), (15, 40)])
def test_random_crop_offsets_are_get_params(h, w):
    """Offsets uniform on the padded image (a 15-row image is padded to 20 first: its top is always 0)."""
    t = sref.RandomCrop(20)
    step = one(t).steps[0]
    image = coords(h, w)
    torch.manual_seed(2)
    theirs = [t(image, image)[0].getpixel((0, 0))[:2] for _ in range(N)]  # (left, top)
    mine = [segaug.draw(step, image, seed=5, epoch=0, position=k)[::-1] for k in range(N)]
    rates([x for x, _ in theirs], [x for x, _ in mine], "left")
    rates([y for _, y in theirs], [y for _, y in mine], "top")
    assert {x for x, _ in mine} == set(range(0, w - 20 + 1)) and {y for _, y in mine} == set(range(0, max(h, 20) - 20 + 1))


def test_v2_random_resize_excludes_max_size():
    t = v2.RandomResize(10, 16)
    step = one(t).steps[0]
    flat = [tv_tensors.Image(torch.zeros(3, 9, 12, dtype=torch.uint8))]
    torch.manual_seed(3)
    theirs = [t.make_params(flat)["size"][0] for _ in range(N)]
    mine = [detaug.v2_params(step, flat, [True], seed=6, epoch=0, position=k)["size"][0] for k in range(N)]
    rates(theirs, mine, "v2 resize")
    assert set(mine) == set(range(10, 16))  # torch.randint's upper bound is excluded


@pytest.mark.parametrize("size", [(16, 20), (24, 30)])
def test_v2_random_crop_params_are_the_classes(size):
    t = v2.RandomCrop(size, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0})
    step = one(t).steps[0]
    flat = [tv_tensors.Image(torch.zeros(3, 20, 25, dtype=torch.uint8)), tv_tensors.Mask(torch.zeros(20, 25, dtype=torch.uint8))]
    torch.manual_seed(4)
    theirs = [t.make_params(flat) for _ in range(N)]
    mine = [detaug.v2_params(step, flat, [True, True], seed=7, epoch=0, position=k) for k in range(N)]
    assert {(p["padding"] == theirs[0]["padding"]) for p in mine} == {True}
    for key in ("top", "left"):
        rates([p[key] for p in theirs], [p[key] for p in mine], key)
    assert {k: v for k, v in mine[0].items() if k not in ("top", "left")} == {k: v for k, v in theirs[0].items() if k not in ("top", "left")}


# ============================================================================ (b) items, given the same draws


class Rigged:
    """Python's ``random.randint``/``random.random`` and torch's ``randint`` made to return given uniforms
    mapped to their ranges (a uniform integer in the range, as each documents)."""

    def __init__(self, monkeypatch, randint=(), rand=(), torch_randint=()):
        self.a, self.b, self.c = list(randint), list(rand), list(torch_randint)
        monkeypatch.setattr(random, "randint", lambda lo, hi: lo + min(int(self.a.pop(0) * (hi - lo + 1)), hi - lo))
        monkeypatch.setattr(random, "random", lambda: self.b.pop(0))

        def trandint(lo, hi=None, size=None, **k):
            lo, hi = (0, lo) if hi is None else (lo, hi)
            return torch.tensor([lo + min(int(self.c.pop(0) * (hi - lo)), hi - lo - 1)])

        monkeypatch.setattr(torch, "randint", trandint)


V1_STEPS = {
    "seg_resize": lambda: sref.RandomResize(30, 70),
    "seg_flip": lambda: sref.RandomHorizontalFlip(0.5),
    "seg_crop": lambda: sref.RandomCrop(48),
    "seg_center": lambda: sref.CenterCrop(36),
}


@pytest.mark.parametrize("kind", sorted(V1_STEPS))
def test_reference_step_equals_the_class_given_the_same_draws(voc, kind, monkeypatch):
    ds = voc_ds(voc)
    t = V1_STEPS[kind]()
    seen = set()
    for pos in range(6):
        for i in range(len(SIZES)):
            image, mask = ds[i]
            got = one(t)(image, mask, seed=6, epoch=1, position=pos)
            u = uniforms(detaug.step_seed(6, 0), 1, np.array([pos]), 2)[0]
            seen.add((i, got[1].size, got[1].tobytes()))
            with monkeypatch.context() as m:
                Rigged(m, randint=[u[0]], rand=[u[0]], torch_randint=list(u))
                want = t(image, mask)
            assert same(got, want), (kind, pos, i)
            if kind == "seg_crop" and min(SIZES[i]) < 48:  # padded: the image's new pixels 0, the mask's 255
                h, w = SIZES[i]
                top, left = segaug.draw(one(t).steps[0], image, seed=detaug.step_seed(6, 0), epoch=1, position=pos)
                px, mk = np.asarray(got[0]), np.asarray(got[1])
                if h < 48:
                    assert (px[h - top :] == 0).all() and (mk[h - top :] == 255).all()
                if w < 48:
                    assert (px[:, w - left :] == 0).all() and (mk[:, w - left :] == 255).all()
                assert got[1].mode == "P" and got[1].getpalette() == mask.getpalette()
    assert len(seen) > len(SIZES) or kind == "seg_center"  # the random steps' items vary with the position


def test_conversions_make_the_mask_int64_as_the_reference():
    image, mask = coords(20, 30), Image.fromarray(np.arange(600, dtype=np.uint8).reshape(20, 30) % 5 * 51, mode="L")
    steps = [sref.PILToTensor(), sref.ToDtype(torch.float, scale=True), sref.Normalize((0.4, 0.5, 0.6), (0.2, 0.3, 0.25))]
    got = one(sref.Compose(steps))(image, mask, seed=0, epoch=0, position=0)
    assert same(got, sref.Compose(steps)(image, mask))
    assert got[1].dtype == torch.int64 and torch.equal(got[1], torch.from_numpy(np.asarray(mask)).long())
    assert torch.allclose(got[0][0, 0, 5], torch.tensor((5 / 255 - 0.4) / 0.2))  # column 5 of the red channel, normalised
    for steps in ([sref.ToTensor()], [sref.PILToTensor(), sref.ConvertImageDtype(torch.float)]):  # the older reference's forms
        got = one(sref.Compose(steps))(image, mask, seed=0, epoch=0, position=0)
        assert [s.kind for s in one(sref.Compose(steps)).steps] == [{"ToTensor": "seg_totensor", "PILToTensor": "seg_piltotensor",
                                                                      "ConvertImageDtype": "seg_convertdtype"}[type(x).__name__] for x in steps]
        assert same(got, sref.Compose(steps)(image, mask)) and got[1].dtype == torch.int64 and got[0].dtype == torch.float32


V2_STEPS = {
    "resize": lambda: v2.RandomResize(30, 70),
    "crop": lambda: v2.RandomCrop(48, pad_if_needed=True, fill={tv_tensors.Mask: 255, "others": 0}),
    "flip": lambda: v2.RandomHorizontalFlip(0.5),
}


@pytest.mark.parametrize("kind", sorted(V2_STEPS))
def test_v2_step_equals_the_class_given_the_same_parameters(voc, kind):
    ds = voc_ds(voc, wrap=True)
    t = V2_STEPS[kind]()
    for pos in range(4):
        for i in range(len(SIZES)):
            image, mask = ds[i]
            got = one(t)(image, mask, seed=5, epoch=2, position=pos)
            flat, _ = tree_flatten((image, mask))
            params = detaug.v2_params(one(t).steps[0], flat, t._needs_transform_list(flat), seed=detaug.step_seed(5, 0), epoch=2, position=pos)
            theirs = copy.deepcopy(t)
            if params is None:
                want = (image, mask)
            else:
                theirs.p = 1.0 if kind == "flip" else getattr(theirs, "p", None)
                theirs.make_params = lambda flat, _p=params: _p
                want = theirs(image, mask)
            assert same(got, want), (kind, pos, i)
            if kind == "crop":
                assert tuple(got[1].shape[-2:]) == (48, 48) and (min(SIZES[i]) >= 48 or 255 in got[1].unique().tolist())


def test_pad_if_smaller_of_the_v2_extras(voc):
    pad = sref.v2_extras()[0](48, fill={tv_tensors.Mask: 255, "others": 0})
    assert one(pad).steps[0].kind == "seg_padifsmaller"
    ds = voc_ds(voc, v2.ToImage(), wrap=True)
    for i in range(len(SIZES)):
        image, mask = ds[i]
        got = one(pad)(image, mask, seed=0, epoch=0, position=0)
        assert same(got, pad(image, mask)), i
        h, w = SIZES[i]
        assert got[0].shape[-2:] == (max(h, 48), max(w, 48)) and (h >= 48 or bool((got[1][..., h:, :] == 255).all()))


# ============================================================================ (c) loaders


def flat_items(loader):
    return [(im, m) for images, masks in loader for im, m in zip(images, masks)]


def load(ds, root, **kw):
    kw.setdefault("batch_size", 2)
    kw.setdefault("collate_fn", lambda b: tuple(zip(*b)))  # the references' collate_fn
    return fastload.FastLoader(ds, cache_dir=root / "cache", progress=False, **kw)


def test_train_preset_through_fastloader_is_the_reference_on_the_same_draws(voc, monkeypatch):
    """``SegmentationPresetTrain`` (v1) on VOC: every item is the preset run on the draws of its place in the epoch."""
    preset = sref.SegmentationPresetTrain(base_size=40, crop_size=48)
    ds = voc_ds(voc, preset)
    first = list(load(ds, voc, seed=3, num_threads=1, shuffle=True))
    assert same(first, list(load(ds, voc, seed=3, num_threads=3, shuffle=True)))
    assert not same(first, list(load(ds, voc, seed=4, num_threads=2, shuffle=True)))
    ld = load(ds, voc, seed=9, num_threads=2)
    items = flat_items(ld)
    for pos, (im, m) in enumerate(items):
        u = [uniforms(detaug.step_seed(9, k), 0, np.array([pos]), 2)[0] for k in range(3)]  # resize, flip, crop
        with monkeypatch.context() as mp:
            Rigged(mp, randint=[u[0][0]], rand=[u[1][0]], torch_randint=list(u[2]))
            want = voc_ds(voc, preset)[pos]
        assert same((im, m), want), pos
        assert im.shape == (3, 48, 48) and m.dtype == torch.int64 and set(m.unique().tolist()) <= {0, pos + 1, 255}
    assert any(255 in m.unique().tolist() for _, m in items)


@pytest.mark.parametrize("pad,backend", [("extras", "pil"), ("if_needed", "tv_tensor"), ("extras", "tensor")])
def test_v2_train_preset_through_fastloader(voc, pad, backend):
    preset = sref.SegmentationPresetTrain(base_size=40, crop_size=48, use_v2=True, pad=pad, backend=backend)
    ds = voc_ds(voc, preset, wrap=True)
    runs = [list(load(ds, voc, seed=2, num_threads=n)) for n in (1, 3)]
    assert same(runs[0], runs[1])
    items = flat_items(runs[0])
    assert len(items) == len(SIZES)
    for k, (im, m) in enumerate(items):
        assert type(im) is torch.Tensor and im.shape == (3, 48, 48) and im.dtype == torch.float32
        assert m.shape == (1, 48, 48) and m.dtype == torch.int64 and set(m.unique().tolist()) <= {0, k + 1, 255}
    assert any(255 in m.unique().tolist() for _, m in items)


@pytest.mark.parametrize("use_v2", [False, True])
def test_eval_preset_items_are_the_datasets(voc, use_v2):
    ds = voc_ds(voc, sref.SegmentationPresetEval(base_size=32, use_v2=use_v2), wrap=use_v2)
    got = flat_items(load(ds, voc, batch_size=4))
    for i, item in enumerate(got):
        assert same(item, ds[i]), i


# ============================================================================ COCO, as the reference's get_coco builds it


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """The painted COCO fixture with an extra annotation overlapping another (their overlap becomes 255)."""
    from coco_fixture import write_coco

    pytest.importorskip("pycocotools")
    root = tmp_path_factory.mktemp("segcoco")
    img, ann, _ = write_coco(root)
    data = json.loads(ann.read_text())
    data["annotations"].append({"id": 5000, "image_id": 107, "category_id": 3, "bbox": [40, 20, 30, 30], "area": 900, "iscrowd": 0,
                                "segmentation": [[40, 20, 70, 20, 70, 50, 40, 50]]})  # fmt: skip
    ann.write_text(json.dumps(data))
    return root, str(img), str(ann)


WITH_ANNOTATIONS = [1, 2, 3, 4]  # image 0's degenerate annotation has no polygon: pycocotools fails on it, as in the reference


def test_get_coco_v1_is_served_exactly(coco):
    root, img, ann = coco
    cats = [0, 3, 7]  # 11 (the crowd's category among them) filtered out
    steps = [sref.FilterAndRemapCocoCategories(cats, remap=True), sref.ConvertCocoPolysToMask(), sref.SegmentationPresetEval(base_size=40)]
    ds = torch.utils.data.Subset(CocoDetection(img, ann, transforms=sref.Compose(steps)), WITH_ANNOTATIONS)
    got = flat_items(load(ds, root, batch_size=3))
    for k, item in enumerate(got):
        assert same(item, ds[k]), k
    assert 255 in got[0][1].unique().tolist() and set(got[0][1].unique().tolist()) <= {0, 1, 2, 255}  # image 1: the overlap


def test_get_coco_v1_with_the_train_preset_is_seeded(coco):
    root, img, ann = coco
    steps = [sref.FilterAndRemapCocoCategories([0, 3, 7]), sref.ConvertCocoPolysToMask(), sref.SegmentationPresetTrain(base_size=60, crop_size=64)]
    ds = torch.utils.data.Subset(CocoDetection(img, ann, transforms=sref.Compose(steps)), WITH_ANNOTATIONS)
    runs = [list(load(ds, root, seed=5, num_threads=n)) for n in (1, 2)]
    assert same(runs[0], runs[1]) and not same(runs[0], list(load(ds, root, seed=6)))
    items = flat_items(runs[0])
    assert all(im.shape == (3, 64, 64) and m.shape == (64, 64) and set(m.unique().tolist()) <= {0, 1, 2, 255} for im, m in items)


def test_get_coco_v2_is_served_exactly(coco):
    root, img, ann = coco
    to_voc = sref.v2_extras()[1]()
    to_voc.COCO_TO_VOC_LABEL_MAP = {0: 0, 3: 1, 7: 2}
    transforms = sref.Compose([to_voc, sref.SegmentationPresetEval(base_size=40, use_v2=True)])
    base = wrap_dataset_for_transforms_v2(CocoDetection(img, ann, transforms=transforms), target_keys={"masks", "labels"})
    ds = torch.utils.data.Subset(base, WITH_ANNOTATIONS + [5])  # 5: no annotation, an all-background mask
    got = flat_items(load(ds, root, batch_size=3))
    for k, item in enumerate(got):
        assert same(item, ds[k]), k
    assert got[-1][1].unique().tolist() == [0] and 255 in got[0][1].unique().tolist()


# ============================================================================ (d) names shared with the detection reference; refusals


def test_shared_names_are_told_apart_by_their_attributes(voc):
    flip, to_tensor = one(sref.RandomHorizontalFlip(0.5)).steps[0], one(sref.PILToTensor()).steps[0]
    assert (flip.how, flip.kind, to_tensor.how, to_tensor.kind) == ("seg", "seg_flip", "seg", "seg_piltotensor")
    flip, to_tensor = one(dref.RandomHorizontalFlip(0.5)).steps[0], one(dref.PILToTensor()).steps[0]
    assert (flip.how, flip.kind, to_tensor.how, to_tensor.kind) == ("v1", "flip", "v1", "piltotensor")
    image, mask = voc_ds(voc)[0]
    assert isinstance(one(dref.PILToTensor())(image, mask, seed=0, epoch=0, position=0)[1], Image.Image)  # the detection one leaves it
    assert one(sref.PILToTensor())(image, mask, seed=0, epoch=0, position=0)[1].dtype == torch.int64


class RandomResize:
    """A user's own class with a reference class's name but not its attributes."""

    def __init__(self, size):
        self.size = size

    def __call__(self, image, target):
        return image, target


class RandomHorizontalFlip:
    """Neither reference's flip: no ``flip_prob``, not an ``nn.Module`` with ``p``."""

    def __init__(self):
        self.prob = 0.5

    def __call__(self, image, target):
        return image, target


@pytest.mark.parametrize("step,words", [
    (lambda: RandomResize(40), "carries no min_size, max_size"),
    (lambda: RandomHorizontalFlip(), "neither flip_prob"),
    (lambda: sref.RandomResize(50, 40), "min_size <= max_size"),
    (lambda: v2.RandomRotation(10), "RandomRotation"),
])  # fmt: skip
def test_untranslated_steps_are_refused_by_name_and_the_route_works(voc, step, words):
    transforms = sref.Compose([step(), sref.RandomCrop(48), sref.PILToTensor()])
    with pytest.raises(ConfigError) as e:
        load(voc_ds(voc, transforms), voc)
    msg = str(e.value)
    assert words in msg and "step 1 of 3" in msg and "TransformsCollate(transforms, collate_fn)" in msg and " at 0x" not in msg
    if "min_size" in words and "<=" in words:
        return  # the reference's own RandomResize would fail in random.randint too: no route makes it work
    got = flat_items(load(voc_ds(voc), voc, collate_fn=fastload.TransformsCollate(transforms)))  # the route, followed
    assert len(got) == len(SIZES) and all(im.shape[-2:] == (48, 48) and m.dtype == torch.int64 for im, m in got)


def test_reference_classes_as_an_image_transform_are_refused(voc):
    ds = VOCSegmentation(str(voc), year="2012", image_set="train", transform=sref.RandomHorizontalFlip(0.5))
    with pytest.raises(ConfigError, match=r"take \(image, target\)"):
        load(ds, voc)


def test_the_references_crop_of_a_tensor_fails_as_it_does(voc):
    """The reference's ``pad_if_smaller`` reads ``img.size`` (a PIL image's): on a tensor both fail."""
    image, mask = voc_ds(voc, sref.PILToTensor())[0]
    with pytest.raises(TypeError):
        sref.RandomCrop(48)(image, mask)
    with pytest.raises(TypeError, match="PIL images only"):
        one(sref.RandomCrop(48))(image, mask, seed=0, epoch=0, position=0)
