"""The CPU graph's compiled step and finish: rounds of operations in one operator, and the normalisation and erasing
in one, equal to the library applied step by step and to DALI's own operators (the GPU's road)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torchvision
import torchvision.transforms as T
from PIL import Image

import fastload
from fastload.augment.ops_color import statistics_form
from fastload.augment.stage import apply_plans

timm_aa = pytest.importorskip("timm.data.auto_augment")

FILL = (124, 116, 104)


def _images() -> list[np.ndarray]:
    """Noise, a gradient with noise, and a photo-like blocky image: sizes odd and even."""
    rng = np.random.default_rng(5)
    noise = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    yy, xx = np.mgrid[0:48, 0:40]
    ramp = np.stack([yy * 5, xx * 6, (yy + xx) * 2], axis=2) + rng.integers(0, 20, (48, 40, 3))
    blocks = np.kron(rng.integers(0, 256, (6, 7, 3)), np.ones((7, 6, 1))).astype(np.uint8)
    return [noise, np.clip(ramp, 0, 255).astype(np.uint8), blocks]


def _timm(name: str, args: tuple, pil: Image.Image) -> Image.Image:
    return timm_aa.NAME_TO_OP[name](pil, *args, fillcolor=FILL, resample=Image.BICUBIC)


#: Plans of 0 to 4 operations over four rounds (Identity where a round does nothing): the compiled rounds skip
#: Identity and pass the image through one scratch image, then two.
PLANS = [
    [],
    [("Rotate", (17.0,))],
    [("Equalize", ()), ("ShearX", (0.21,))],
    [("TranslateXRel", (-0.3,)), ("SharpnessIncreasing", (1.7,)), ("Posterize", (3,))],
    [("ShearY", (-0.15,)), ("SolarizeAdd", (80,)), ("Rotate", (-29.0,)), ("ColorIncreasing", (0.4,))],
    [("Invert", ()), ("TranslateYRel", (0.2,)), ("AutoContrast", ()), ("Solarize", (150,))],
]  # fmt: skip


@pytest.mark.parametrize("plan", PLANS, ids=[str(len(p)) + "-" + "-".join(n for n, _ in p) for p in PLANS])
def test_rounds_in_one_operator_are_the_library_applied_in_order(plan):
    """Four rounds, Identity where the plan has fewer steps (at the front, the back and between): timm's own
    functions applied in order, to the level."""
    images = _images()
    steps = [("Identity", ())] + list(plan[:2]) + [("Identity", ())] + list(plan[2:])
    plans = [[(n, a, "bicubic") for n, a in steps] for _ in images]
    got = apply_plans(images, plans, library="timm", fill=FILL)
    for img, out in zip(images, got):
        want = Image.fromarray(img)
        for name, args in plan:
            want = _timm(name, args, want)
        assert np.array_equal(out, np.asarray(want)), (plan, np.abs(out.astype(int) - np.asarray(want)).max())


def _finish_pair(img: np.ndarray, layout: str, rects: np.ndarray, noise: np.ndarray | None, value) -> tuple:
    """The compiled finish and DALI's crop_mirror_normalize of ``img`` (ImageNet's mean and std, in levels)."""
    from nvidia.dali import fn, pipeline_def, types

    from fastload.augment.compiled import finish

    mean = [0.485 * 255, 0.456 * 255, 0.406 * 255]
    std = [0.229 * 255, 0.224 * 255, 0.225 * 255]

    @pipeline_def(batch_size=1, num_threads=1, device_id=None)
    def pipe():
        x = fn.external_source(source=lambda: [img], batch=True, layout="HWC", dtype=types.UINT8)
        r = fn.external_source(source=lambda: [rects], batch=True, dtype=types.FLOAT)
        z = fn.external_source(source=lambda: [noise if noise is not None else np.zeros(1, np.float32)], batch=True,
                               dtype=types.FLOAT)  # fmt: skip
        ours = finish(x, mean=mean, std=std, layout=layout, rects=r, noise=z if noise is not None else None, value=value)
        return ours, fn.crop_mirror_normalize(x, mean=mean, std=std, output_layout=layout, dtype=types.FLOAT)

    p = pipe()
    p.build()
    ours, cmn = p.run()
    return np.array(ours[0]), np.array(cmn[0]), np.float32(mean), np.float32(1) / np.float32(std)


@pytest.mark.parametrize("layout", ["CHW", "HWC"])
@pytest.mark.parametrize("fill", ["noise", "value", "values"])
def test_the_compiled_finish_is_crop_mirror_normalize_then_the_rectangles(layout, fill):
    """Every level normalised as DALI's crop_mirror_normalize (``(x - mean) * (1 / std)`` in float32, checked against
    it and against that formula), then two rectangles laid in order (the second over the first), clipped to the
    image; a slot without one (height 0) takes nothing and its three placeholder floats are skipped."""
    rng = np.random.default_rng(1)
    img = np.arange(256 * 3, dtype=np.int64).reshape(16, 16, 3).astype(np.uint8)  # every level in every channel
    rects = np.array([2, 3, 5, 4, 0, 0, 0, 0, 4, 1, 3, 6], dtype=np.float32)  # top, left, height, width per slot
    patches = [rng.standard_normal((3, 5, 4)).astype(np.float32), np.zeros((3, 1, 1), np.float32),
               rng.standard_normal((3, 3, 6)).astype(np.float32)]  # fmt: skip
    as_laid = [p if layout == "CHW" else p.transpose(1, 2, 0) for p in patches]
    noise = np.concatenate([p.ravel() for p in as_laid]) if fill == "noise" else None
    value = None if fill == "noise" else ((0.5,) if fill == "value" else (0.1, -0.2, 0.3))
    ours, cmn, mean, inv = _finish_pair(img, layout, rects, noise, value)
    want = (img.astype(np.float32) - mean) * inv  # HWC
    assert np.array_equal(want if layout == "HWC" else want.transpose(2, 0, 1), cmn)
    for b in (0, 2):
        top, left, h, w = (int(v) for v in rects[4 * b : 4 * b + 4])
        part = patches[b].transpose(1, 2, 0) if fill == "noise" else np.broadcast_to(np.float32(value), (h, w, 3))
        want[top : top + h, left : left + w] = part[: 16 - top, : 16 - left]
    assert np.array_equal(ours, want if layout == "HWC" else want.transpose(2, 0, 1))


ERASINGS = {
    "torchvision random": lambda: T.RandomErasing(1.0, value="random"),
    "torchvision values": lambda: T.RandomErasing(1.0, value=(0.1, 0.2, 0.3)),
    "timm pixel x3": lambda: __import__("timm.data.random_erasing", fromlist=["x"]).RandomErasing(
        1.0, mode="pixel", max_count=3, device="cpu"),
}  # fmt: skip


@pytest.mark.parametrize(("channels_last", "dtype"), [(False, torch.float32), (True, torch.float32), (False, torch.float16)])
@pytest.mark.parametrize("erasing", sorted(ERASINGS))
def test_a_loaders_compiled_finish_is_its_gpu_form(erasing, channels_last, dtype, make_folder):
    """A loader's CPU batches with erasing (one or three rectangles, noise or values), made by the compiled finish, are
    bit for bit the ones the GPU's form (crop_mirror_normalize, then DALI's erasing) makes of the same draws, in
    float32 and in float16 (the finish's float32 cast)."""
    root = make_folder(classes=2, per_class=3, size=(72, 56))
    tf = T.Compose([T.RandomResizedCrop(40), T.RandomHorizontalFlip(), T.ToTensor(),
                    T.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)), ERASINGS[erasing]()])  # fmt: skip
    ds = torchvision.datasets.ImageFolder(str(root), tf)
    batches = []
    for form in ("arguments", "arithmetic"):
        with statistics_form(form), fastload.FastLoader(ds, 6, shuffle=True, seed=3, device="cpu", progress=False,
                                                         channels_last=channels_last, dtype=dtype) as ld:  # fmt: skip
            x, _ = next(iter(ld))
            names = [type(o).__name__ + str(o._spec) for o in ld._core.augment_pipe._ops] if ld._core.augment_pipe else []
        batches.append((x, names))
    (ours, ours_ops), (theirs, their_ops) = batches
    assert any("finish" in n or "Numba" in n for n in ours_ops) and not any("CropMirrorNormalize" in n for n in ours_ops)
    assert any("CropMirrorNormalize" in n for n in their_ops)
    assert ours.dtype == dtype and torch.equal(ours, theirs)


def _tv(name: str, args: tuple, interp: str, pil: Image.Image) -> Image.Image:
    """torchvision's functional call of ``name`` on the PIL image, as its ops make it."""
    import math

    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode

    mode, fill = InterpolationMode(interp), list(FILL)
    if name == "Rotate":
        return F.rotate(pil, args[0], interpolation=mode, fill=fill)
    if name == "ShearX":
        shear = math.degrees(math.atan(args[0]))
        return F.affine(pil, angle=0.0, translate=[0, 0], scale=1.0, shear=[shear, 0.0], center=[0, 0], interpolation=mode, fill=fill)
    if name == "TranslateY":
        return F.affine(pil, angle=0.0, translate=[0, int(args[0])], scale=1.0, shear=[0.0, 0.0], interpolation=mode, fill=fill)
    if name == "GaussianBlur":
        return F.gaussian_blur(pil, [int(args[0]), int(args[1])], [float(np.float32(args[2]))] * 2)
    return {"Equalize": F.equalize, "Identity": lambda im: im, "Posterize": lambda im: F.posterize(im, int(args[0]))}[name](pil)


def test_a_round_mixing_compiled_operations_and_dalis_gives_each_sample_its_own():
    """One round whose table holds compiled operations and one DALI keeps (torchvision's GaussianBlur): the compiled
    step is one branch of DALI's select beside it, and every sample gets its own operation, to the level (the blur
    within its measured level)."""
    base = _images()
    steps = [("Rotate", (23.0,), "nearest"), ("Equalize", (), "bilinear"), ("GaussianBlur", (5, 3, 1.3), "bilinear"),
             ("ShearX", (0.2,), "bilinear"), ("TranslateY", (-7.0,), "nearest"), ("Identity", (), "bilinear"),
             ("GaussianBlur", (3, 3, 0.8), "bilinear"), ("Posterize", (2,), "bilinear"), ("Rotate", (-11.0,), "bicubic")]  # fmt: skip
    images = [base[k % len(base)] for k in range(len(steps))]
    got = apply_plans(images, [[s] for s in steps], library="torchvision", fill=FILL)
    for img, (name, args, interp), out in zip(images, steps, got):
        want = np.asarray(_tv(name, args, interp, Image.fromarray(img)), dtype=np.int16)
        d = np.abs(out.astype(np.int16) - want)
        assert d.max() <= (1 if name == "GaussianBlur" else 0), (name, interp, int(d.max()))
