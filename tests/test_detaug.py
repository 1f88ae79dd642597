"""The detection references' random transforms through FastLoader: each step's law against the class's own draws, each item against the class given the same draws, and whole loaders.

The classes compared with are torchvision v2's and the detection reference's own
(``tests/detection_reference.py``, the user module a reference user has). Laws are compared
by two-sample tests between the class's own draws (torch's generator) and FastLoader's (its
seeded uniforms); items by running the class itself with FastLoader's parameters (v2: its
``make_params`` made to return them; the references' classes: torch's generator made to
return the draws that give them). The loaders run on a COCO file written by the test
(painted boxes, so the boxes of a batch can be checked against its pixels).
"""

from __future__ import annotations

import copy
import json
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pycocotools")
pytest.importorskip("scipy.stats")
from torch.utils._pytree import tree_flatten  # noqa: E402
from torchvision import tv_tensors  # noqa: E402
from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2  # noqa: E402
from torchvision.transforms import functional as F1  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

import fastload  # noqa: E402
from fastload import detaug  # noqa: E402
from fastload.augment import uniforms  # noqa: E402
from fastload.errors import ConfigError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
import detection_reference as ref  # noqa: E402
from coco_fixture import IMAGES, PALETTE, colour_box, write_coco  # noqa: E402
from item_checks import same  # noqa: E402
from law_checks import close, rates  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
MEAN = (123.0, 117.0, 104.0)
ANNOTATED = [0, 1, 2, 3, 4]  # the fixture's images with annotations (the reference trains on these only)
WITH_MASKS = [1, 2, 3, 4]  # image 0's degenerate annotation has no polygon: no mask for it


def pairs(batch):
    """The detection references' collate_fn."""
    return tuple(zip(*batch))



@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    """The painted COCO fixture, its boxes written as floats (as COCO's own files hold them)."""
    root = tmp_path_factory.mktemp("cocoaug")
    img, ann, colours = write_coco(root)
    data = json.loads(ann.read_text())
    for a in data["annotations"]:
        a["bbox"] = [float(v) for v in a["bbox"]]
    ann.write_text(json.dumps(data))
    return root, str(img), str(ann)


def wrapped(coco, transforms=None, keys=None):
    _, img, ann = coco
    return wrap_dataset_for_transforms_v2(CocoDetection(img, ann, transforms=transforms), target_keys=keys)


def one(t):
    """The :class:`fastload.detaug.Program` of a single step."""
    return detaug.program(t, joint=True, where="t", kind="CocoDetection", route="the route")


def lattice(seed, position, n, epoch=0):
    """The step's uniforms on torch.rand's float32 lattice, as the step uses them."""
    u = uniforms(seed, epoch, np.array([position]), n)[0]
    return np.floor(u * (1 << 24)) / (1 << 24)



N = 3000


# ============================================================================ (a) laws


def test_flip_rate_is_the_classes():
    t = v2.RandomHorizontalFlip(p=0.3)
    step = one(t).steps[0]
    x = torch.tensor([[[0.0, 1.0]]])
    torch.manual_seed(0)
    theirs = [bool(t(x)[0, 0, 0] == 1.0) for _ in range(N)]
    mine = [bool(detaug.draw(step, x, None, seed=11, epoch=0, position=k)) for k in range(N)]
    rates(theirs, mine, "flip")
    assert abs(np.mean(mine) - 0.3) < 0.03


def test_photometric_gates_and_factors_are_the_classes():
    t = v2.RandomPhotometricDistort(p=0.4)
    step = one(t).steps[0]
    flat = [tv_tensors.Image(torch.zeros(3, 4, 4, dtype=torch.uint8))]
    torch.manual_seed(1)
    theirs = [t.make_params(flat) for _ in range(N)]
    mine = [detaug.v2_params(step, flat, [True], seed=3, epoch=0, position=k) for k in range(N)]
    for part in ("brightness", "contrast", "saturation", "hue"):
        key = f"{part}_factor"
        rates([p[key] is None for p in theirs], [p[key] is None for p in mine], f"{part} gate")
        close([p[key] for p in theirs if p[key] is not None], [p[key] for p in mine if p[key] is not None], f"{part} factor")
    rates([p["contrast_before"] for p in theirs], [p["contrast_before"] for p in mine], "contrast before")
    perm = lambda p: None if p["channel_permutation"] is None else tuple(p["channel_permutation"].tolist())  # noqa: E731
    rates([perm(p) for p in theirs], [perm(p) for p in mine], "channel permutation")
    assert len({perm(p) for p in mine}) == 7  # no permutation, and each of the 6


def test_photometric_of_the_reference_draws_its_law(monkeypatch):
    """The references' class: which adjustments run, in which order, with which factors (seen by spying on them)."""
    t = ref.RandomPhotometricDistort(p=0.5)
    step = one(t).steps[0]
    calls: list = []
    for name in ("adjust_brightness", "adjust_contrast", "adjust_saturation", "adjust_hue"):
        monkeypatch.setattr(F1, name, lambda img, f, _n=name: (calls.append((_n[7:], float(f))), img)[1])
    image = torch.zeros(3, 2, 2)
    torch.manual_seed(2)
    theirs = []
    for _ in range(N // 2):
        calls.clear()
        t(image, None)
        theirs.append(list(calls))
    mine = []
    for k in range(N // 2):
        calls.clear()
        detaug.Program([step], True)(image, None, seed=9, epoch=0, position=k)
        mine.append(list(calls))
    order = lambda c: tuple(n for n, _ in c)  # noqa: E731 - which ran, and whether contrast came first
    rates([order(c) for c in theirs], [order(c) for c in mine], "adjustments and their order")
    for part in ("brightness", "contrast", "saturation", "hue"):
        close([f for c in theirs for n, f in c if n == part], [f for c in mine for n, f in c if n == part], part)


def test_zoom_out_ratio_and_offsets_are_the_classes():
    t = v2.RandomZoomOut(side_range=(1.0, 3.0), p=1.0)
    step = one(t).steps[0]
    flat = [tv_tensors.Image(torch.zeros(3, 90, 120, dtype=torch.uint8))]
    torch.manual_seed(3)
    theirs = np.array([t.make_params(flat)["padding"] for _ in range(N)])
    mine = np.array([detaug.v2_params(step, flat, [True], seed=4, epoch=0, position=k)["padding"] for k in range(N)])
    for j, side in enumerate(("left", "top", "right", "bottom")):
        close(theirs[:, j], mine[:, j], side)
    close(theirs[:, 0] + theirs[:, 2], mine[:, 0] + mine[:, 2], "canvas width")


def test_zoom_out_of_the_reference_gate_and_canvas():
    t = ref.RandomZoomOut(fill=list(MEAN), side_range=(1.0, 2.0), p=0.5)
    step = one(t).steps[0]
    torch.manual_seed(4)
    image = torch.zeros(3, 9, 12, dtype=torch.uint8)
    theirs = [tuple(t(image, {"boxes": torch.zeros(1, 4)})[0].shape) for _ in range(N)]
    mine = []
    for k in range(N):
        got = detaug.draw(step, image, None, seed=5, epoch=0, position=k)
        mine.append((3, 9, 12) if got is None else (3, 9 + got[1] + got[3], 12 + got[0] + got[2]))
    rates([s == (3, 9, 12) for s in theirs], [s == (3, 9, 12) for s in mine], "gate")
    close([s[2] for s in theirs if s != (3, 9, 12)], [s[2] for s in mine if s != (3, 9, 12)], "canvas width")


def test_iou_crop_options_and_windows_are_the_classes():
    t = v2.RandomIoUCrop()
    step = one(t).steps[0]
    boxes = tv_tensors.BoundingBoxes([[10, 8, 40, 28], [60, 40, 100, 70]], format="XYXY", canvas_size=(90, 120), dtype=torch.float32)
    flat = [tv_tensors.Image(torch.zeros(3, 90, 120, dtype=torch.uint8)), boxes]
    torch.manual_seed(5)
    n = 1000  # torchvision's loop of trials is slow in Python: 1000 of its draws take seconds
    theirs = [t.make_params(flat) for _ in range(n)]
    mine = [detaug.v2_params(step, flat, [True, True], seed=6, epoch=0, position=k) for k in range(n)]
    rates([not p for p in theirs], [not p for p in mine], "left whole (option 1.0)")
    for key in ("top", "left", "height", "width"):
        close([p[key] for p in theirs if p], [p[key] for p in mine if p], key)

    def best_iou(p):  # the best IoU of a kept box with the window: its law shows the options' frequencies
        w = torch.tensor([[p["left"], p["top"], p["left"] + p["width"], p["top"] + p["height"]]], dtype=torch.float32)
        import torchvision

        return float(torchvision.ops.box_iou(boxes[p["is_within_crop_area"]].as_subclass(torch.Tensor), w).max())

    close([best_iou(p) for p in theirs if p], [best_iou(p) for p in mine if p], "best IoU")
    rates([tuple(p["is_within_crop_area"].tolist()) for p in theirs if p], [tuple(p["is_within_crop_area"].tolist()) for p in mine if p], "kept boxes")


def test_scale_jitter_and_shortest_size_are_the_classes():
    flat = [tv_tensors.Image(torch.zeros(3, 90, 120, dtype=torch.uint8))]
    torch.manual_seed(6)
    t = v2.ScaleJitter(target_size=(64, 48), scale_range=(0.5, 2.0))
    step = one(t).steps[0]
    theirs = np.array([t.make_params(flat)["size"] for _ in range(N)])
    mine = np.array([detaug.v2_params(step, flat, [True], seed=7, epoch=0, position=k)["size"] for k in range(N)])
    close(theirs[:, 0], mine[:, 0], "ScaleJitter height")
    close(theirs[:, 1], mine[:, 1], "ScaleJitter width")
    t = v2.RandomShortestSize(min_size=(30, 40, 50, 60), max_size=70)
    step = one(t).steps[0]
    theirs = [tuple(t.make_params(flat)["size"]) for _ in range(N)]
    mine = [tuple(detaug.v2_params(step, flat, [True], seed=8, epoch=0, position=k)["size"]) for k in range(N)]
    rates(theirs, mine, "RandomShortestSize's choice")
    assert set(mine) == {(30, 40), (40, 53), (50, 66), (52, 70)}  # 60 is capped by max_size: 70 / 120


def test_fixed_size_crop_offsets_are_the_references():
    t = ref.FixedSizeCrop(size=(40, 50))
    step = one(t).steps[0]
    rows, cols = torch.meshgrid(torch.arange(90.0), torch.arange(120.0), indexing="ij")
    image = torch.stack([cols, rows])  # each pixel holds its column and row: a crop's corner is its first pixel
    torch.manual_seed(7)
    theirs = np.array([t(image, None)[0][:, 0, 0].tolist() for _ in range(N)])
    mine = np.array([detaug.Program([step], True)(image, None, seed=1, epoch=0, position=k)[0][:, 0, 0].tolist() for k in range(N)])
    close(theirs[:, 0], mine[:, 0], "left")
    close(theirs[:, 1], mine[:, 1], "top")
    for got in (theirs, mine):  # one draw places both: top / 50 and left / 70 agree
        assert np.all(np.abs(got[:, 1] / 50 - got[:, 0] / 70) <= 1 / 50 + 1e-9)


# ============================================================================ (b) items, given the same draws

V2_STEPS = {
    "flip": lambda: v2.RandomHorizontalFlip(p=0.5),
    "photometric": lambda: v2.RandomPhotometricDistort(p=0.5),
    "zoomout": lambda: v2.RandomZoomOut(fill={tv_tensors.Image: MEAN, tv_tensors.Mask: 0}, side_range=(1.0, 2.0)),
    "ioucrop": lambda: v2.RandomIoUCrop(),
    "scalejitter": lambda: v2.ScaleJitter(target_size=(64, 64), scale_range=(0.5, 1.5)),
    "shortest": lambda: v2.RandomShortestSize(min_size=(40, 56, 72), max_size=100),
}


@pytest.mark.parametrize("backend", ["pil", "image"])
@pytest.mark.parametrize("kind", sorted(V2_STEPS))
def test_v2_step_equals_the_class_given_the_same_parameters(coco, kind, backend):
    ds = wrapped(coco, keys={"boxes", "labels", "masks", "image_id"})
    t = V2_STEPS[kind]()
    step = one(t).steps[0]
    seen = set()
    for pos in range(10):
        for i in WITH_MASKS:
            image, target = ds[i]
            image = v2.functional.to_image(image) if backend == "image" else image
            got = one(t)(image, target, seed=5, epoch=2, position=pos)
            flat, _ = tree_flatten((image, target))
            params = detaug.v2_params(step, flat, t._needs_transform_list(flat), seed=detaug.step_seed(5, 0), epoch=2, position=pos)
            seen.add(repr(params)[:40] if params is not None else None)
            if params is None:
                want = (image, target)
            else:
                theirs = copy.deepcopy(t)
                if hasattr(theirs, "p") and kind in ("flip", "zoomout"):
                    theirs.p = 1.0  # the gate opened: the class's own forward from there
                theirs.make_params = lambda flat, _p=params: _p
                want = theirs(image, target)
            assert same(got, want), (kind, pos, i)
    assert len(seen) > 1  # the parameters vary with the position


class Rigged:
    """torch's ``rand``/``randint``/``randperm`` made to return given values, in order."""

    def __init__(self, monkeypatch, rand=(), randint=(), randperm=()):
        self.rand, self.randint, self.randperm = list(rand), list(randint), list(randperm)
        monkeypatch.setattr(torch, "rand", lambda *s, **k: torch.tensor(self.rand.pop(0), dtype=torch.float32).reshape(s[0] if len(s) == 1 else s))
        monkeypatch.setattr(torch, "randint", lambda *a, **k: torch.tensor([self.randint.pop(0)]))
        monkeypatch.setattr(torch, "randperm", lambda n, **k: torch.tensor(self.randperm.pop(0)))


def rig(monkeypatch, t, kind, got, u):
    """Make the reference's class draw what gives FastLoader's parameters ``got`` (its uniforms ``u``)."""
    shut = 1.0 - 2.0**-24
    if kind == "flip":
        return Rigged(monkeypatch, rand=[[0.0 if got else shut]])
    if kind == "zoomout":
        return Rigged(monkeypatch, rand=[[shut]] if got is None else [[0.0], [u[1]], list(u[2:4])])
    if kind in ("scalejitter", "fixedsizecrop"):
        return Rigged(monkeypatch, rand=[[u[0]]])
    if kind == "shortest":
        return Rigged(monkeypatch, randint=[min(int(u[0] * len(t.min_size)), len(t.min_size) - 1)])
    if kind == "ioucrop":
        if got is None:
            return Rigged(monkeypatch, randint=[t.options.index(1.0)])
        top, left, h, w = got
        H, W = t._size
        scale = [((w + 0.5) / W - t.min_scale) / (t.max_scale - t.min_scale), ((h + 0.5) / H - t.min_scale) / (t.max_scale - t.min_scale)]
        offset = [(left + 0.5) / (W - w) if W > w else 0.0, (top + 0.5) / (H - h) if H > h else 0.0]
        return Rigged(monkeypatch, randint=[t.options.index(0.0)], rand=[scale, offset])
    gate = lambda f: 0.0 if f is not None else shut  # noqa: E731
    r = [gate(got["brightness"]), 0.0 if got["contrast_before"] else shut, gate(got["contrast"]), gate(got["saturation"]),
         gate(got["hue"]), gate(got["contrast"]), gate(got["perm"])]  # fmt: skip

    def params(b, c, s, h):  # ColorJitter.get_params of the one part each of the class's jitters has
        return torch.arange(4), *(None if x is None else got[n] for x, n in zip((b, c, s, h), ("brightness", "contrast", "saturation", "hue")))

    monkeypatch.setattr(ref.T.ColorJitter, "get_params", staticmethod(params))
    return Rigged(monkeypatch, rand=[r], randperm=[] if got["perm"] is None else [got["perm"].tolist()])


V1_STEPS = {
    "flip": lambda: ref.RandomHorizontalFlip(p=0.5),
    "photometric": lambda: ref.RandomPhotometricDistort(p=0.5),
    "zoomout": lambda: ref.RandomZoomOut(fill=list(MEAN), side_range=(1.0, 2.0)),
    "ioucrop": lambda: ref.RandomIoUCrop(),
    "scalejitter": lambda: ref.ScaleJitter(target_size=(64, 64), scale_range=(0.5, 1.5)),
    "shortest": lambda: ref.RandomShortestSize(min_size=(40, 56, 72), max_size=100),
    "fixedsizecrop": lambda: ref.FixedSizeCrop(size=(72, 80), fill=MEAN),
}


@pytest.mark.parametrize("backend", ["pil", "tensor"])
@pytest.mark.parametrize("kind", sorted(V1_STEPS))
def test_reference_step_equals_the_class_given_the_same_draws(coco, kind, backend, monkeypatch):
    ds = wrapped(coco, keys={"boxes", "labels", "masks", "image_id"})
    t = V1_STEPS[kind]()
    if kind == "fixedsizecrop" and backend == "tensor":
        t.fill = 0  # the reference pads tensors with a number only (its "fill respected only on PIL")
    step = one(t).steps[0]
    seen = set()
    for pos in range(10):
        for i in WITH_MASKS:
            image, target = ds[i]
            image = F1.pil_to_tensor(image) if backend == "tensor" else image
            got = one(t)(image, target, seed=6, epoch=1, position=pos)
            image, target = ds[i]  # the class changes the target in place: a fresh item
            image = F1.pil_to_tensor(image) if backend == "tensor" else image
            params = detaug.draw(step, image, target, seed=detaug.step_seed(6, 0), epoch=1, position=pos)
            seen.add(repr(params)[:60])
            t._size = F1.get_dimensions(image)[1:]
            with monkeypatch.context() as m:
                rig(m, t, kind, params, lattice(detaug.step_seed(6, 0), pos, detaug.DRAWS.get(kind, 1), epoch=1))
                want = t(image, target)
            assert same(got, want), (kind, pos, i, params)
    assert len(seen) > 1


# ============================================================================ (c) loaders


def loader(ds, coco, **kw):
    kw.setdefault("collate_fn", pairs)
    kw.setdefault("batch_size", 2)
    return fastload.FastLoader(ds, cache_dir=coco[0] / "cache", progress=False, **kw)


def boxes_match_pixels(images, targets, tol=2.5):
    """Every box of area >= 4 covers exactly the pixels of one painted box (the boxes moved with the pixels)."""
    checked = 0
    for image, target in zip(images, targets):
        px = image.numpy()
        extents = [colour_box(px, c) for c in PALETTE]
        for b in target["boxes"].tolist():
            if (b[2] - b[0]) * (b[3] - b[1]) < 4:
                continue
            assert any(e is not None and max(abs(x - y) for x, y in zip(e, b)) <= tol for e in extents), (b, extents)
            checked += 1
    return checked


POLICIES = [("hflip", False), ("hflip", True), ("ssdlite", False), ("ssdlite", True), ("multiscale", False),
            ("multiscale", True), ("lsj", False), ("ssd", False), ("ssd", True)]  # fmt: skip


@pytest.mark.parametrize("policy,use_v2", POLICIES)
def test_detection_preset_through_fastloader(coco, policy, use_v2):
    preset = ref.DetectionPresetTrain(data_augmentation=policy, use_v2=use_v2, size=96, scales=((48, 64, 80), 120))
    ds = torch.utils.data.Subset(wrapped(coco, preset), ANNOTATED)
    first = list(loader(ds, coco, seed=3, num_threads=1, shuffle=True))
    again = list(loader(ds, coco, seed=3, num_threads=3, shuffle=True))
    assert same(first, again)  # the same seed: the same batches, whatever the threads
    assert not same(first, list(loader(ds, coco, seed=4, num_threads=2, shuffle=True)))
    items = [(im, t) for images, targets in first for im, t in zip(images, targets)]
    assert len(items) == len(ANNOTATED) and all(im.dtype == torch.float32 and im.ndim == 3 for im, _ in items)
    for im, t in items:
        b = t["boxes"]
        assert len(b) == len(t["labels"]) and bool((b[:, 2] <= im.shape[2] + 1e-4).all() and (b[:, 3] <= im.shape[1] + 1e-4).all())
    if policy == "lsj":
        assert {tuple(im.shape) for im, _ in items} == {(3, 96, 96)}
    if policy == "ssd":  # the photometric distortion changes the colours the check reads: its gates shut
        preset.transforms.transforms[0].p = 0.0
        items = [(im, t) for images, targets in loader(ds, coco, seed=3) for im, t in zip(images, targets)]
        assert any(im.shape[1:] != (h, w) for (im, _), ((h, w), _) in zip(items, IMAGES))  # zoomed out or cropped
    assert boxes_match_pixels(*pairs(items)) > 0


def test_epochs_differ_and_set_epoch_replays_one(coco):
    preset = ref.DetectionPresetTrain(data_augmentation="ssdlite", use_v2=True)
    ds = torch.utils.data.Subset(wrapped(coco, preset), ANNOTATED)
    ld = loader(ds, coco, seed=1, num_threads=2)
    e0, e1 = list(ld), list(ld)
    assert not same(e0, e1)  # a new epoch, new draws (the same order: no shuffle)
    ld.set_epoch(1)
    assert same(list(ld), e1)
    ld.set_epoch(0)
    assert same(list(ld), e0)


def test_both_forms_draw_the_same_geometry(coco):
    """The v1 and v2 forms of one policy, with one seed: the same windows and flips, so the same kept boxes."""
    got = {}
    for use_v2 in (False, True):
        preset = ref.DetectionPresetTrain(data_augmentation="ssdlite", use_v2=use_v2)
        ds = torch.utils.data.Subset(wrapped(coco, preset), ANNOTATED)
        got[use_v2] = [(im, t) for images, targets in loader(ds, coco, seed=8) for im, t in zip(images, targets)]
    for (a, ta), (b, tb) in zip(got[False], got[True]):
        assert a.shape == b.shape and torch.allclose(a, b, atol=1e-6)  # v1's and v2's uint8-to-float scalings round apart
        area = (ta["boxes"][:, 2] - ta["boxes"][:, 0]) * (ta["boxes"][:, 3] - ta["boxes"][:, 1])
        assert torch.equal(ta["boxes"].as_subclass(torch.Tensor)[area >= 1], tb["boxes"])  # v2 sanitises what v1 keeps


# ============================================================================ (d) what is not translated


class RandomZoomOut(torch.nn.Module):
    """A user's own class with a reference class's name but not its attributes."""

    def __init__(self):
        super().__init__()
        self.p = 0.5

    def forward(self, image, target):
        return image, target


@pytest.mark.parametrize("step,words", [
    (lambda: v2.RandomResizedCrop(32), "RandomResizedCrop"),
    (lambda: RandomZoomOut(), "carries no fill, side_range"),
    (lambda: ref.RandomZoomOut(fill=list(MEAN)), None),
])  # fmt: skip
def test_untranslated_steps_are_refused_by_name_and_the_route_works(coco, step, words):
    transforms = v2.Compose([step(), v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    ds = torch.utils.data.Subset(wrapped(coco, transforms), ANNOTATED)
    if words is None:  # the reference's own class with its attributes: translated
        assert len(list(loader(ds, coco))) == 3
        return
    with pytest.raises(ConfigError) as e:
        loader(ds, coco)
    msg = str(e.value)
    assert words in msg and "step 1 of 3" in msg and "TransformsCollate(transforms, collate_fn)" in msg and " at 0x" not in msg
    plain = torch.utils.data.Subset(wrapped(coco), ANNOTATED)  # the route: the dataset without them, they in collate_fn
    batches = list(loader(plain, coco, collate_fn=fastload.TransformsCollate(transforms)))
    assert sum(len(images) for images, _ in batches) == len(ANNOTATED)
    assert all(im.dtype == torch.float32 for images, _ in batches for im in images)


def test_reference_classes_as_an_image_transform_are_refused(coco):
    _, img, ann = coco
    ds = CocoDetection(img, ann, transform=ref.RandomHorizontalFlip(0.5))
    with pytest.raises(ConfigError, match=r"take \(image, target\)"):
        loader(ds, coco)


def test_an_image_transform_of_v2_steps_is_translated(coco):
    """``transform=`` (the image alone): the v2 steps are translated and the target passes as it is."""
    _, img, ann = coco
    ds = CocoDetection(img, ann, transform=v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.PILToTensor()]))
    got = [(im, t) for images, targets in loader(ds, coco, batch_size=3) for im, t in zip(images, targets)]
    for i, (im, t) in enumerate(got):
        want_im, want_t = ds[i]  # p=1: the dataset's own flip is certain
        assert torch.equal(im, want_im) and t == want_t
    assert math.isfinite(float(got[0][0].float().mean()))


def test_voc_datasets_with_translated_steps(tmp_path):
    """VOC, v2-wrapped: a segmentation mask (its 255 border too) flips with its image; a detection preset runs, seeded."""
    from test_annotated import write_voc
    from torchvision.datasets import VOCDetection, VOCSegmentation

    root = write_voc(tmp_path)
    flip = v2.Compose([v2.RandomHorizontalFlip(p=1.0), v2.ToImage()])  # p=1: the dataset's own flip is certain
    seg = wrap_dataset_for_transforms_v2(VOCSegmentation(str(root), year="2012", image_set="train", transforms=flip))
    got = [(im, m) for images, masks in fastload.FastLoader(seg, batch_size=2, collate_fn=pairs, cache_dir=tmp_path / "c", progress=False)
           for im, m in zip(images, masks)]  # fmt: skip
    for i, (im, m) in enumerate(got):
        assert same(im, seg[i][0]) and same(m, seg[i][1]) and 255 in m.unique().tolist(), i
    preset = ref.DetectionPresetTrain(data_augmentation="ssdlite", use_v2=True)
    det = wrap_dataset_for_transforms_v2(VOCDetection(str(root), year="2012", image_set="train", transforms=preset))
    runs = [list(fastload.FastLoader(det, batch_size=2, collate_fn=pairs, cache_dir=tmp_path / "c", progress=False, seed=2, num_threads=n))
            for n in (1, 2)]  # fmt: skip
    assert same(runs[0], runs[1])
    for images, targets in runs[0]:
        for im, t in zip(images, targets):
            assert len(t["boxes"]) == len(t["labels"]) >= 1 and bool((t["boxes"][:, 2] <= im.shape[2]).all())


def test_distributed_ranks_draw_as_one_process_would(coco):
    """Rank r of a DistributedSampler draws at the places r, r + n, ... of the epoch: the ranks' items,
    interleaved, are one process's items (one image forty times, flipped or not)."""
    _, img, ann = coco
    base = wrap_dataset_for_transforms_v2(CocoDetection(img, ann, transforms=v2.Compose([v2.RandomHorizontalFlip(), v2.ToImage()])))
    ds = torch.utils.data.Subset(base, [1] * 40)
    one_process = [im for images, _ in loader(ds, coco, seed=5, batch_size=4) for im in images]
    ranks = []
    for r in range(2):
        sampler = torch.utils.data.distributed.DistributedSampler(ds, num_replicas=2, rank=r, shuffle=False)
        ranks.append([im for images, _ in loader(ds, coco, seed=5, batch_size=4, sampler=sampler) for im in images])
    assert not same(ranks[0], ranks[1])
    assert same([ranks[g % 2][g // 2] for g in range(40)], one_process)
    assert 5 < sum(bool(torch.equal(im, one_process[0])) for im in one_process) < 35  # flipped some of the times
