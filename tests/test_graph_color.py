"""The colour/pixel graph operations against torchvision's and timm's own functions on the PIL image, per op."""

from __future__ import annotations

import math

import numpy as np
import pytest
from PIL import Image, ImageOps

from fastload.augment.rounds import apply_once
from fastload.augment.ops_color import COLOR_NAMES, box_weights, color_op, statistics_form

NAN = math.nan


def _images() -> list[np.ndarray]:
    rng = np.random.default_rng(7)
    yy, xx = np.mgrid[0:40, 0:64]
    grad = np.stack([xx * 4, yy * 6, (xx + yy) * 2], -1).clip(0, 255).astype(np.uint8)
    noise = rng.integers(0, 256, (48, 48, 3), dtype=np.uint8)
    flat = np.full((24, 32, 3), (90, 140, 200), dtype=np.uint8)
    odd = rng.integers(0, 256, (37, 53, 3), dtype=np.uint8)
    low = (rng.integers(0, 256, (37, 53, 3)) // 4 + 60).astype(np.uint8)  # a narrow range: autocontrast's stretch
    return [grad, noise, flat, odd, low]


IMAGES = _images()


def _tv(name: str, args: tuple, pil: Image.Image) -> Image.Image:
    """torchvision.transforms.functional on the PIL image, as torchvision's ops call it."""
    import torchvision.transforms.functional as F

    calls = {"Brightness": F.adjust_brightness, "Color": F.adjust_saturation, "Contrast": F.adjust_contrast,
             "Sharpness": F.adjust_sharpness}  # fmt: skip
    if name in calls:
        return calls[name](pil, 1.0 + args[0])
    if name == "Posterize":
        return F.posterize(pil, int(args[0]))
    if name == "Solarize":
        return F.solarize(pil, args[0])
    if name == "Grayscale":
        return F.rgb_to_grayscale(pil, num_output_channels=3)
    if name == "GaussianBlur":
        s = float(np.float32(args[2]))
        return F.gaussian_blur(pil, [int(args[0]), int(args[1])], [s, s])
    if name == "ColorJitter":
        parts = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
        for k in args[:4]:
            if not math.isnan(args[4 + int(k)]):
                pil = parts[int(k)](pil, args[4 + int(k)])
        return pil
    return {"AutoContrast": F.autocontrast, "Equalize": F.equalize, "Invert": F.invert}[name](pil)


def _timm(name: str, args: tuple, pil: Image.Image) -> Image.Image:
    from timm.data.auto_augment import NAME_TO_OP

    return NAME_TO_OP[name](pil, *args, fillcolor=(128, 128, 128), resample=Image.BILINEAR)


#: (library, op) -> argument tuples, extremes included.
TV_ARGS = {
    "Brightness": [(-0.99,), (-0.5,), (0.0,), (0.33,), (0.99,)],
    "Color": [(-0.99,), (-0.4,), (0.5,), (0.99,)],
    "Contrast": [(-0.99,), (-0.3,), (0.7,), (0.99,)],
    "Sharpness": [(-0.99,), (-0.5,), (0.6,), (0.99,)],
    "Posterize": [(0,), (2,), (4,), (8,)],
    "Solarize": [(0.0,), (100.5,), (128.0,), (233.33,), (255.0,)],
    "AutoContrast": [()], "Equalize": [()], "Invert": [()], "Grayscale": [()],
    "GaussianBlur": [(3, 3, 0.1), (5, 3, 1.3), (9, 9, 2.0), (23, 23, 1.7)],
    "ColorJitter": [(0, 1, 2, 3, 0.6, 1.4, 0.5, NAN), (3, 0, 2, 1, 1.3, 0.7, 1.6, NAN),
                    (2, 3, 1, 0, NAN, 0.8, 0.3, NAN), (1, 0, 3, 2, 0.9, NAN, 1.2, NAN),
                    (3, 1, 0, 2, 1.2, 0.8, 1.3, 0.07), (2, 0, 3, 1, NAN, NAN, 0.6, -0.2)],
}  # fmt: skip
TIMM_ARGS = {
    "AutoContrast": [()], "Equalize": [()], "Invert": [()],
    "Posterize": [(0,), (2,), (4,)], "PosterizeIncreasing": [(4,), (1,)], "PosterizeOriginal": [(4,), (8,)],
    "Solarize": [(0,), (128,), (256,)], "SolarizeIncreasing": [(256,), (100,), (0,)],
    "SolarizeAdd": [(0,), (66,), (110,)],
    "Color": [(0.1,), (1.9,)], "ColorIncreasing": [(0.1,), (1.81,)], "Contrast": [(0.1,), (1.9,)],
    "ContrastIncreasing": [(0.28,), (1.72,)], "Brightness": [(0.1,), (1.9,)], "BrightnessIncreasing": [(0.19,), (1.9,)],
    "Sharpness": [(0.1,), (1.9,)], "SharpnessIncreasing": [(0.1,), (1.63,)], "Desaturate": [(0.5,), (0.8,), (1.0,)],
    "GaussianBlur": [(0.1,), (0.73,), (1.0,), (2.0,)],
}  # fmt: skip

#: Bounds MEASURED (benchmarks/results/graph-ops-color.md): (max levels, fraction of values off by more than 1), the
#: CPU's form. Everything not listed is exact (PIL's own arithmetic where DALI has no exact operator).
BOUNDS = {
    ("torchvision", "GaussianBlur"): (1, 0.0),  # DALI's kernel and rounding: a level at ties, 0.03 % of values
}  # fmt: skip

#: The GPU's form (DALI's operators) where it is further: DALI's equalize is OpenCV's (max 23, mean 6.3 levels off
#: PIL's); float32 fused operators for PIL's integer/float steps, a level at most (a jitter's four in a row: 2).
ARITHMETIC_BOUNDS = {
    ("torchvision", "Equalize"): (23, 0.62), ("timm", "Equalize"): (23, 0.62),
    **{(lib, n): (1, 0.0) for lib in ("torchvision", "timm") for n in ("Color", "Contrast", "AutoContrast")},
    ("torchvision", "ColorJitter"): (2, 0.001),
    ("timm", "GaussianBlur"): (2, 0.001),  # six rounded float passes for Pillow's integer ones: 0.01 % off by 2
    # one fused float32 filter where PIL rounds the smoothed image first: a level at most
    ("torchvision", "Sharpness"): (1, 0.0), ("timm", "Sharpness"): (1, 0.0), ("timm", "SharpnessIncreasing"): (1, 0.0),
    **{("timm", n): (1, 0.0) for n in ("ColorIncreasing", "ContrastIncreasing", "Desaturate")},
}  # fmt: skip

#: The operations with two forms (PIL's arithmetic compiled, the CPU's; DALI's operators, the GPU's): built in both.
TWO_FORMS = {"Contrast", "ContrastIncreasing", "AutoContrast", "ColorJitter", "Equalize", "Brightness", "BrightnessIncreasing",
             "Color", "ColorIncreasing", "Desaturate", "Sharpness", "SharpnessIncreasing", "Posterize", "PosterizeIncreasing",
             "PosterizeOriginal", "Solarize", "SolarizeIncreasing", "SolarizeAdd", "Invert", "Grayscale", "GaussianBlur"}  # fmt: skip

CASES = [("torchvision", n, a) for n, a in TV_ARGS.items()] + [("timm", n, a) for n, a in TIMM_ARGS.items()]
FORMED = [(*c, f) for c in CASES for f in (("arguments", "arithmetic") if c[1] in TWO_FORMS else ("arguments",))]


def test_every_name_is_tested():
    assert {n for lib, n, _ in CASES if lib == "torchvision"} == set(COLOR_NAMES["torchvision"])
    assert {n for lib, n, _ in CASES if lib == "timm"} == set(COLOR_NAMES["timm"])
    assert color_op("torchvision", "Rotate", "bilinear", (0, 0, 0)) is None
    assert color_op("timm", "ShearX", "bilinear", (0, 0, 0)) is None


@pytest.mark.parametrize(("library", "name", "arg_list", "form"), FORMED, ids=[f"{c[0]}-{c[1]}-{c[3]}" for c in FORMED])
def test_matches_library(library: str, name: str, arg_list: list[tuple], form: str):
    op = color_op(library, name, "bilinear", (128, 128, 128))
    if form == "arithmetic" and name == "ColorJitter":  # the GPU's hue is a YIQ turn: test_jitter_hue_is_a_yiq_turn
        arg_list = [a for a in arg_list if math.isnan(a[7])]
    images = [im for im in IMAGES for _ in arg_list]
    args = [a for _ in IMAGES for a in arg_list]
    with statistics_form(form):
        outs = apply_once(op, images, args)
    ref_fn = _timm if library == "timm" else _tv
    diffs = []
    for im, a, out in zip(images, args, outs):
        ref = np.asarray(ref_fn(name, a, Image.fromarray(im)), dtype=np.int16)
        assert out.shape == ref.shape and out.dtype == np.uint8
        diffs.append(np.abs(out.astype(np.int16) - ref).ravel())
    d = np.concatenate(diffs)
    worst, frac = (ARITHMETIC_BOUNDS.get((library, name)) if form == "arithmetic" else None) or BOUNDS.get((library, name), (0, 0.0))
    assert d.max() <= worst and (d > 1).mean() <= frac, (library, name, int(d.max()), float(d.mean()), float((d > 1).mean()))


def test_box_weights_are_pillows():
    """Radius 1: sigma2 = 1/3, L = sqrt(5), l = 0, a = -1 / (6 (1/3 - 1)) = 0.25: box radius 0.25."""
    r, ww, fw = box_weights(1.0)
    assert r == 0.0
    assert ww == int(np.float32(1 << 24) / np.float32(1.5))
    assert (2 * r + 1) * ww + 2 * fw in ((1 << 24), (1 << 24) - 1)
    with pytest.raises(ValueError):
        box_weights(4.0)


def test_jitter_identity_when_all_parts_off():
    """Every factor NaN: the image comes back unchanged (PIL's HSV round trip is lossy: the hue is skipped)."""
    op = color_op("torchvision", "ColorJitter", "bilinear", (0, 0, 0))
    (out,) = apply_once(op, [IMAGES[1]], [(0, 1, 2, 3, NAN, NAN, NAN, NAN)])
    np.testing.assert_array_equal(out, IMAGES[1])


def _opencv_equalize(img: np.ndarray) -> np.ndarray:
    """OpenCV's equalizeHist per channel, written out: ``lut[v] = round(255 (cdf[v] - cdf_min) / (N - cdf_min))``
    (``cdf_min``: the count of the lowest level present; one level only: the image unchanged)."""
    out = np.empty_like(img)
    for c in range(img.shape[2]):
        ch = img[:, :, c]
        cdf = np.cumsum(np.bincount(ch.ravel(), minlength=256))
        lo, n = cdf[cdf > 0][0], ch.size
        lut = np.arange(256) if n == lo else np.floor(255.0 * (cdf - lo) / (n - lo) + 0.5).clip(0, 255)
        out[:, :, c] = lut.astype(np.uint8)[ch]
    return out


def _equalize_fixtures() -> list[np.ndarray]:
    """Noise, a few-level image, a flat one, one level but a pixel, two levels half and half (where the two formulas
    part most: PIL maps the upper to 127, OpenCV to 255)."""
    rng = np.random.default_rng(3)
    one_off = np.full((16, 16, 3), 200, dtype=np.uint8)
    one_off[3, 4] = (0, 17, 255)
    halves = np.full((16, 16, 3), 30, dtype=np.uint8)
    halves[8:] = 90
    return [rng.integers(0, 256, (37, 53, 3), dtype=np.uint8), (rng.integers(0, 4, (24, 32, 3)) * 60).astype(np.uint8),
            np.full((16, 16, 3), 77, dtype=np.uint8), one_off, halves]  # fmt: skip


@pytest.mark.parametrize("library", ["torchvision", "timm"])
def test_equalize_is_opencvs_formula_on_a_gpu(library):
    """A GPU graph's Equalize is OpenCV's histogram equalisation exactly (what it differs from PIL's by is the
    bound above)."""
    imgs = _equalize_fixtures()
    with statistics_form("arithmetic"):
        got = apply_once(color_op(library, "Equalize", "bilinear", (0, 0, 0)), imgs, [()] * len(imgs))
    for g, i in zip(got, imgs):
        assert np.abs(g.astype(int) - _opencv_equalize(i).astype(int)).max() <= 1


@pytest.mark.parametrize("library", ["torchvision", "timm"])
def test_equalize_is_pils_on_the_cpu(library):
    """The CPU graph's Equalize is ImageOps.equalize to the level, where OpenCV's formula is 128 levels away on the
    two-level image (the fixture that tells them apart)."""
    imgs = _equalize_fixtures()
    got = apply_once(color_op(library, "Equalize", "bilinear", (0, 0, 0)), imgs, [()] * len(imgs))
    for g, i in zip(got, imgs):
        np.testing.assert_array_equal(g, np.asarray(ImageOps.equalize(Image.fromarray(i))))
    assert np.abs(got[4].astype(int) - _opencv_equalize(imgs[4]).astype(int)).max() > 100


#: (hue factor, the most mean levels off torchvision's PIL adjust_hue over the fixtures, and on the gradient): MEASURED.
HUE_BOUNDS = [(0.02, 7, 3), (0.05, 17, 7), (-0.1, 36, 11), (0.25, 36, 36)]


@pytest.mark.parametrize(("hue", "worst_mean", "gradient_mean"), HUE_BOUNDS)
def test_jitter_hue_is_a_yiq_turn_on_a_gpu(hue: float, worst_mean: float, gradient_mean: float):
    """The hue part is a rotation of YIQ's chroma (DALI's hsv), not PIL's HSV round trip: the documented
    difference, bounded as measured; it grows with the turn and vanishes on grey (a grey pixel keeps its level)."""
    import torchvision.transforms.functional as F

    op = color_op("torchvision", "ColorJitter", "bilinear", (0, 0, 0))
    grey = np.repeat(IMAGES[0][:, :, :1], 3, axis=2)
    with statistics_form("arithmetic"):  # the GPU's form
        outs = apply_once(op, IMAGES + [grey], [(0, 1, 2, 3, NAN, NAN, NAN, hue)] * (len(IMAGES) + 1))
    means = [np.abs(o.astype(int) - np.asarray(F.adjust_hue(Image.fromarray(im), hue), dtype=int)).mean()
             for o, im in zip(outs, IMAGES)]  # fmt: skip
    assert max(means) <= worst_mean and means[0] <= gradient_mean, means
    assert np.abs(outs[-1].astype(int) - grey).max() <= 1
    turned = np.abs(outs[1].astype(int) - IMAGES[1]).mean()
    assert turned > 2, "the hue part did nothing"


def _every_colour() -> np.ndarray:
    """All 2**24 RGB colours, one per pixel of a 4096x4096 image."""
    c = np.arange(1 << 24, dtype=np.uint32)
    return np.stack([(c >> 16) & 255, (c >> 8) & 255, c & 255], -1).astype(np.uint8).reshape(4096, 4096, 3)


@pytest.mark.parametrize("hue", [0.0, -0.1, pytest.param(0.05, marks=pytest.mark.slow), pytest.param(-0.5, marks=pytest.mark.slow)])
def test_jitter_hue_is_pils_on_every_colour(hue: float):
    """The CPU graph's hue part is torchvision's adjust_hue on the PIL image (PIL's HSV round trip, float32 inside,
    the uint8 hue wrapped) for every one of the 2**24 colours; at 0 the round trip's own losses are kept too."""
    import torchvision.transforms.functional as F

    img = _every_colour()
    (out,) = apply_once(color_op("torchvision", "ColorJitter", "bilinear", (0, 0, 0)), [img], [(3, 0, 1, 2, NAN, NAN, NAN, hue)])
    want = np.asarray(F.adjust_hue(Image.fromarray(img), hue))
    bad = np.argwhere((out != want).any(-1))
    assert len(bad) == 0, f"{len(bad)} colours differ, e.g. {[img[tuple(b)].tolist() for b in bad[:3]]}"
    assert hue == 0.0 or (out != img).any(-1).mean() > 0.5  # a turn moves most colours


def test_the_yiq_hue_is_noted_for_gpu_graphs_only(caplog, monkeypatch):
    """The hue note (the one visible difference) is logged once for a GPU graph that turns a hue, and not for a stage
    without one; the CPU graph, whose hue is PIL's, is never noted (core.Core calls it for CUDA devices only)."""
    import logging

    from fastload.augment import stage as st
    from fastload.augment.settings import Augment, Jitter

    monkeypatch.setattr(st, "_HUE_SAID", [])
    plain = st.GraphStage(Augment(crop=8, jitter=Jitter(brightness=(0.5, 1.5))))
    hue = st.GraphStage(Augment(crop=8, jitter=Jitter(hue=(-0.1, 0.1))))
    assert hue.turns_hue and not plain.turns_hue
    with caplog.at_level(logging.WARNING, logger=st.__name__):
        st.note_gpu_hue([None, plain])
        assert not caplog.records
        st.note_gpu_hue([plain, hue])
        st.note_gpu_hue([hue])
    assert [r.getMessage() for r in caplog.records] == [st.HUE_NOTE]


@pytest.mark.parametrize("factor", [0.7, 1.3, 0.3, 1.7])
@pytest.mark.parametrize("name", ["Brightness", "Contrast", "Color"])
def test_enhance_blends_are_pils_float32_arithmetic(name: str, factor: float):
    """The CPU graph's ImageEnhance parts are PIL's blend in float32 (``Blend.c``), not the same formula in doubles:
    a factor such as 0.7 (0.699999988 in float32) takes 10 to 7 in float32 and to 6 in doubles, so these factors
    over every level and a million random colours tell the two apart."""
    from PIL import ImageEnhance

    rng = np.random.default_rng(11)
    img = np.concatenate([np.repeat(np.arange(256, dtype=np.uint8)[None, :, None], 3, axis=2).repeat(4, axis=0),
                          rng.integers(0, 256, (1020, 256, 3), dtype=np.uint8)])  # fmt: skip
    (out,) = apply_once(color_op("timm", name, "bilinear", (0, 0, 0)), [img], [(factor,)])
    want = np.asarray(getattr(ImageEnhance, name)(Image.fromarray(img)).enhance(factor))
    np.testing.assert_array_equal(out, want)
    if name == "Brightness" and factor == 0.7:  # the doubles' formula parts from PIL's here: the test sees it
        doubles = np.floor(img.astype(np.float64) * float(np.float32(factor))).clip(0, 255)
        assert (doubles != want).any()
