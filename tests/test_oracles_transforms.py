"""translate()'s colour, auto-augment and erasing steps, against torchvision's documented parameters.

Oracles: the settings each torchvision object's documented arguments imply, written out by hand
(``RandomApply(ts, p)`` gates the group at ``p``, ``RandomChoice(ts, p)`` weighs the choices,
``RandomOrder`` runs one of the orders, ``RandomGrayscale(p)`` of ``RandomApply(.., q)`` is ``p * q``,
RandAugment's TranslateX bins are ``150/331 * width * i / (bins - 1)``), and PIL/NumPy images built here.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastload import ConfigError

pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from fastload.augment.settings import Erasing, Jitter, Op, Stage, Trivial  # noqa: E402
from fastload.transforms import translate  # noqa: E402
from fastload.tvkinds import outputs_equal  # noqa: E402

MEAN, STD = (0.5, 0.25, 0.125), (0.5, 0.5, 0.25)


def _train(*steps, tail=(T.PILToTensor(),), api=T):
    """RandomResizedCrop(24), the steps, then ``tail``."""
    return translate(api.Compose([api.RandomResizedCrop(24), *steps, *tail]))


def _stages(*steps, tail=(T.PILToTensor(),)):
    aug = _train(*steps, tail=tail)
    assert aug.policy is not None and aug.policy.kind == "chain"
    return aug.policy.stages


# ----------------------------------------------------------------------------- _pair (RandomResizedCrop's scale and ratio)


@pytest.mark.parametrize(
    ("scale", "ratio", "want"),
    [
        ((0.0, 1.0), (1e-6, 1.0), ((0.0, 1.0), (1e-6, 1.0))),
        ((1, 1), (2, 2), ((1.0, 1.0), (2.0, 2.0))),
        ((0.25, 0.5), (0.5, 3), ((0.25, 0.5), (0.5, 3.0))),
    ],
)
def test_scale_and_ratio_at_their_bounds_are_kept_as_floats(scale, ratio, want):
    """The documented bounds 0 <= min <= max <= 1 (scale) and min >= 1e-6 (ratio) are inclusive; ints become floats."""
    t = T.RandomResizedCrop(24)
    t.scale, t.ratio = scale, ratio
    aug = translate(T.Compose([t, T.ToTensor()]))
    assert (aug.scale, aug.ratio) == want
    assert all(type(v) is float for v in aug.scale + aug.ratio)


@pytest.mark.parametrize(
    ("scale", "ratio", "message"),
    [
        ((0.5, 0.25), (0.75, 1.0), r"scale \(0.5, 0.25\) must satisfy 0.0 <= min <= max <= 1.0, max > 0"),
        ((-0.1, 0.5), (0.75, 1.0), "scale .* must satisfy"),
        ((0.1, 1.5), (0.75, 1.0), "scale .* must satisfy"),
        ((0.0, 0.0), (0.75, 1.0), "scale .* must satisfy"),
        ((0.1, float("inf")), (0.75, 1.0), "scale .* must satisfy"),
        ((float("nan"), 0.5), (0.75, 1.0), "scale .* must satisfy"),
        ((0.1, 0.5), (1e-7, 1.0), r"ratio \(1e-07, 1.0\) must satisfy 1e-06 <= min <= max, max > 0"),
        ((0.1, 0.5), (2.0, 1.0), "ratio .* must satisfy"),
        ((0.1, 0.5), (0.5, float("inf")), "ratio .* must satisfy"),
        ((0.1, 0.5, 0.9), (0.75, 1.0), "scale .* is not a pair of numbers"),
        ((0.1, 0.5), ("a", "b"), "ratio .* is not a pair of numbers"),
        (0.5, (0.75, 1.0), "scale 0.5 is not a pair of numbers"),
    ],
)
def test_scale_and_ratio_outside_their_bounds_are_refused_naming_them(scale, ratio, message):
    """A scale or ratio torchvision would misread (reversed, out of range, not two numbers) is refused, naming it."""
    t = T.RandomResizedCrop(24)
    t.scale, t.ratio = scale, ratio
    with pytest.raises(ConfigError, match=message):
        translate(T.Compose([t, T.ToTensor()]))


# ----------------------------------------------------------------------------- _grayscale


@pytest.mark.parametrize(
    ("steps", "want"),
    [
        ([T.RandomGrayscale(0.3)], 0.3),
        ([v2.RandomGrayscale(0.7)], 0.7),
        ([T.RandomGrayscale()], 0.1),
        ([T.Grayscale(3)], 1.0),
        ([v2.Grayscale(3)], 1.0),
        ([T.RandomApply([T.RandomGrayscale(0.5)], p=0.4)], 0.2),
        ([T.RandomApply([T.Grayscale(3)], p=0.3)], 0.3),
        ([T.RandomGrayscale(0.0)], 0.0),
        ([T.ColorJitter(0.4), T.RandomGrayscale(0.25)], 0.25),
    ],
)
def test_grayscale_probability_is_torchvisions(steps, want):
    """RandomGrayscale(p) greys with p (default 0.1), Grayscale(3) always, RandomApply([it], q) with p * q."""
    aug = _train(*steps)
    assert aug.grayscale == pytest.approx(want)
    assert aug.policy is None


def test_a_grayscale_that_never_applies_is_a_no_op_anywhere():
    """RandomGrayscale(0) does nothing, so it passes even in the evaluation form; RandomGrayscale(0.5) there is refused."""
    aug = translate(T.Compose([T.Resize(32), T.CenterCrop(24), T.RandomGrayscale(0.0), T.ToTensor()]))
    assert (aug.train, aug.grayscale, aug.policy) == (False, 0.0, None)
    with pytest.raises(ConfigError, match=r"step 3 of 4.*RandomGrayscale in the evaluation form"):
        translate(T.Compose([T.Resize(32), T.CenterCrop(24), T.RandomGrayscale(0.5), T.ToTensor()]))


def test_grayscale_with_one_channel_is_refused():
    """Grayscale(1) gives one channel; FastLoader batches are RGB."""
    with pytest.raises(ConfigError, match=r"Grayscale\(num_output_channels=1\) \(step 2 of 3.*one output channel"):
        _train(T.Grayscale(1))


def test_grayscales_after_a_grayscale_or_before_a_jitter_are_chain_stages_in_the_users_order():
    """Two greyscales, or a grayscale before a jitter, run in the user's order: chain stages; after a chain it stays last."""
    gray = lambda p: Stage(groups=((Op(name="Grayscale", prob=p),),))  # noqa: E731
    aug = _train(T.RandomGrayscale(0.5), T.RandomGrayscale(0.25))
    assert aug.grayscale == 0.0 and aug.policy.stages == (gray(0.5), gray(0.25))
    aug = _train(T.RandomGrayscale(0.5), T.ColorJitter(brightness=0.5))
    jit = Stage(groups=((Op(name="ColorJitter", jitter=Jitter(brightness=(0.5, 1.5))),),))
    assert (aug.grayscale, aug.jitter) == (0.0, None) and aug.policy.stages == (gray(0.5), jit)
    aug = _train(T.RandomInvert(p=1.0), T.RandomGrayscale(0.5))
    inv = Stage(groups=((Op(name="Invert", prob=1.0),),))
    assert aug.grayscale == 0.5 and aug.policy.stages == (inv,)  # the chain runs first anyway: no fold needed


# ----------------------------------------------------------------------------- _chain


def test_random_apply_choice_and_order_are_torchvisions_laws():
    """RandomApply gates its group at p; RandomChoice picks one with its p weights; RandomOrder: every order."""
    sol = Op(name="Solarize", prob=1.0, magnitude=100.0)
    inv = Op(name="Invert", prob=0.5)
    eq = Op(name="Equalize", prob=1.0)
    assert _stages(T.RandomApply([T.RandomSolarize(100, p=1.0), T.RandomInvert(0.5)], p=0.3)) == (
        Stage(p=0.3, groups=((sol, inv),)),
    )
    assert _stages(T.RandomChoice([T.RandomSolarize(100, p=1.0), T.RandomInvert(0.5)], p=[0.2, 0.8])) == (
        Stage(groups=((sol,), (inv,)), weights=(0.2, 0.8)),
    )
    assert _stages(T.RandomChoice([T.RandomSolarize(100, p=1.0), T.RandomInvert(0.5)])) == (
        Stage(groups=((sol,), (inv,)), weights=None),
    )
    assert _stages(T.RandomOrder([T.RandomSolarize(100, p=1.0), T.RandomInvert(0.5), T.RandomEqualize(1.0)])) == (
        Stage(groups=((sol, inv, eq), (sol, eq, inv), (inv, sol, eq), (inv, eq, sol), (eq, sol, inv), (eq, inv, sol))),
    )
    # a single operation: a stage that always runs it (its own p inside), and stages follow each other
    assert _stages(T.RandomInvert(0.5), T.RandomEqualize(1.0)) == (Stage(groups=((inv,),)), Stage(groups=((eq,),)))
    assert _stages(v2.RandomApply([v2.RandomInvert(0.5)], p=0.6)) == (Stage(p=0.6, groups=((inv,),)),)


def test_random_order_of_five_is_translated_and_of_six_refused():
    """RandomOrder is drawn as one of its n! orders: up to 5 steps (120 orders)."""
    ops = [T.RandomInvert(0.5) for _ in range(5)]
    (stage,) = _stages(T.RandomOrder(ops))
    assert len(stage.groups) == 120 and all(len(g) == 5 for g in stage.groups)
    with pytest.raises(ConfigError, match=r"step 2 of 3 of the transform\): RandomOrder of more than 5 transforms"):
        _train(T.RandomOrder(ops + [T.RandomInvert(0.5)]))


def test_random_apply_of_a_jitter_is_the_jitters_own_probability():
    """RandomApply([ColorJitter(b)], p): the jitter at probability p, brightness in [1 - b, 1 + b]."""
    aug = _train(T.RandomApply([T.ColorJitter(brightness=0.4)], p=0.3))
    assert aug.policy is None
    assert aug.jitter == Jitter(brightness=(0.6, 1.4), p=0.3)


def test_a_solarize_on_floats_has_its_threshold_in_255ths():
    """After ToTensor() RandomSolarize(0.5) thresholds 0..1 values at 0.5: 127.5 on FastLoader's uint8 pixels."""
    (stage,) = _stages(tail=(T.ToTensor(), T.RandomSolarize(0.5, p=1.0)))
    assert stage == Stage(groups=((Op(name="Solarize", prob=1.0, magnitude=127.5),),))
    (stage,) = _stages(tail=(T.PILToTensor(), T.RandomSolarize(100, p=1.0)))
    assert stage.groups[0][0].magnitude == 100.0


def test_a_jitter_then_a_chain_becomes_one_chain_in_the_users_order():
    """ColorJitter then RandomInvert: the jitter is the chain's first stage, not the Augment's jitter."""
    aug = _train(T.ColorJitter(contrast=0.5), T.RandomInvert(0.5))
    assert aug.jitter is None
    assert aug.policy.stages == (
        Stage(groups=((Op(name="ColorJitter", jitter=Jitter(contrast=(0.5, 1.5))),),)),
        Stage(groups=((Op(name="Invert", prob=0.5),),)),
    )


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([T.TrivialAugmentWide(), T.RandomInvert(0.5)], r"RandomInvert after transforms.TrivialAugmentWide\(.*\(step 2 of 4"),
        ([T.RandAugment(), T.RandomInvert(0.5)], r"RandomInvert after transforms.RandAugment\(.*one auto-augment"),
        ([T.RandomApply([T.RandomRotation(10)], p=0.5)], r"it holds transforms.RandomRotation\("),
        ([T.RandomChoice([T.RandomInvert(0.5), T.RandomCrop(8)])], r"it holds transforms.RandomCrop\("),
        ([T.RandomApply([T.RandomPosterize(3)], p=0.5)], None),
    ],
)
def test_chains_fastload_cannot_run_are_refused_naming_the_step(steps, message):
    """A chain after TrivialAugmentWide or RandAugment, or holding a step it cannot run, is refused naming it."""
    if message is None:  # posterize on floats: torchvision raises, so does translate, naming the RandomApply
        with pytest.raises(ConfigError, match=r"RandomApply\(.*\(step 3 of 3 of the transform\): RandomPosterize needs uint8"):
            translate(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), *steps]))
        return
    with pytest.raises(ConfigError, match=message):
        _train(*steps)


def test_a_chain_before_the_crop_or_in_evaluation_is_refused():
    """Colour steps act on the training crop."""
    with pytest.raises(ConfigError, match="RandomInvert before the crop"):
        translate(T.Compose([T.RandomInvert(0.5), T.RandomResizedCrop(24), T.ToTensor()]))
    with pytest.raises(ConfigError, match="RandomApply in the evaluation form"):
        translate(T.Compose([T.Resize(32), T.CenterCrop(24), T.RandomApply([T.RandomInvert(0.5)]), T.ToTensor()]))


# ----------------------------------------------------------------------------- _trivial


def test_trivial_settings_are_the_objects_arguments():
    """TrivialAugmentWide(num_magnitude_bins, interpolation, fill) as FastLoader's Trivial; defaults: 31, nearest, None."""
    aug = _train(T.TrivialAugmentWide(num_magnitude_bins=17, interpolation=InterpolationMode.BILINEAR, fill=[1, 2, 3]))
    assert aug.trivial == Trivial(num_bins=17, interpolation="bilinear", fill=(1.0, 2.0, 3.0))
    assert _train(v2.TrivialAugmentWide(), api=v2).trivial == Trivial(num_bins=31, interpolation="nearest", fill=None)
    t = T.TrivialAugmentWide()
    t.interpolation = "BICUBIC"  # a name in place of the enum
    assert _train(t).trivial.interpolation == "bicubic"
    # on uint8 tensor pixels too (torchvision runs it on them)
    aug = translate(T.Compose([T.RandomResizedCrop(24), T.PILToTensor(), T.TrivialAugmentWide()]))
    assert aug.trivial == Trivial()


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([T.ColorJitter(0.4), T.TrivialAugmentWide()], r"TrivialAugmentWide\(.*\(step 3 of 4 of the transform\): TrivialAugmentWide after another"),
        ([T.RandomGrayscale(0.5), T.TrivialAugmentWide()], "TrivialAugmentWide after another colour step"),
        ([T.TrivialAugmentWide(), T.TrivialAugmentWide()], "TrivialAugmentWide after another colour step"),
        ([T.RandAugment(), T.TrivialAugmentWide()], "TrivialAugmentWide after another colour step"),
        ([T.RandomInvert(0.5), T.TrivialAugmentWide()], "TrivialAugmentWide after another colour step"),
        ([T.TrivialAugmentWide(num_magnitude_bins=1)], r"TrivialAugmentWide\(.*\(step 2 of 3 of the transform\): trivial num_bins"),
        ([T.TrivialAugmentWide(interpolation=InterpolationMode.LANCZOS)], r"step 2 of 3 of the transform\): trivial interpolation"),
    ],
)
def test_trivial_in_a_place_or_form_fastload_cannot_run_is_refused(steps, message):
    """TrivialAugmentWide runs first and once, with settings Trivial accepts; otherwise the message names the step."""
    with pytest.raises(ConfigError, match=message):
        _train(*steps)


def test_trivial_on_floats_before_the_crop_or_with_a_fill_per_type_is_refused():
    """Its operations take uint8 pixels; before the crop it sees the whole image; a fill dict is not one value."""
    with pytest.raises(ConfigError, match="TrivialAugmentWide on a float tensor"):
        translate(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.TrivialAugmentWide()]))
    with pytest.raises(ConfigError, match="TrivialAugmentWide before the crop"):
        translate(T.Compose([T.TrivialAugmentWide(), T.RandomResizedCrop(24), T.ToTensor()]))
    t = v2.TrivialAugmentWide()
    t.fill = {Image.Image: 0}
    with pytest.raises(ConfigError, match=r"\): a fill per input type is not translated: give one number"):
        _train(t)


# ----------------------------------------------------------------------------- _policy


def test_rand_augment_and_auto_augment_are_read_as_torchvisions_own_tables():
    """RandAugment: its 14 operations at bin `magnitude` (TranslateX 150/331 * crop * m / (bins - 1)); AutoAugment:
    ImageNet's 25 sub-policies, the first (Posterize 0.4 at bin 8, Rotate 0.6 at bin 9)."""
    pol = _train(T.RandAugment(num_ops=3, magnitude=9, num_magnitude_bins=31)).policy
    assert (pol.library, pol.kind, pol.num_ops, len(pol.ops)) == ("torchvision", "rand", 3, 14)
    tx = {o.name: o for o in pol.ops}["TranslateX"]
    assert tx.magnitude == pytest.approx(150.0 / 331.0 * 24 * 9 / 30) and tx.signed
    pol = _train(T.AutoAugment()).policy
    assert (pol.library, pol.kind, len(pol.sub_policies)) == ("torchvision", "auto", 25)
    first = pol.sub_policies[0]
    assert [(o.name, o.prob) for o in first] == [("Posterize", 0.4), ("Rotate", 0.6)]
    assert first[0].magnitude == 8 - round(8 / (9 / 4))  # Posterize bits: 8 - round(i / ((bins - 1) / 4))
    assert first[1].magnitude == pytest.approx(30.0)  # Rotate: linspace(0, 30, 10)[9]
    # on uint8 tensor pixels too, as torchvision runs them
    pol = translate(T.Compose([T.RandomResizedCrop(24), T.PILToTensor(), T.RandAugment()])).policy
    assert pol.kind == "rand" and pol.num_ops == 2


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([T.ColorJitter(0.4), T.RandAugment()], r"RandAugment\(.*\(step 3 of 4 of the transform\): RandAugment after another colour step"),
        ([T.RandomGrayscale(0.5), T.AutoAugment()], "AutoAugment after another colour step"),
        ([T.TrivialAugmentWide(), T.RandAugment()], "RandAugment after another colour step"),
        ([T.RandAugment(), T.AutoAugment()], "AutoAugment after another colour step"),
        ([T.RandomInvert(0.5), T.RandAugment()], "RandAugment after another colour step"),
        ([T.RandAugment(magnitude=31)], r"RandAugment\(.*\(step 2 of 3 of the transform\): magnitude 31 must be a bin index"),
    ],
)
def test_policies_in_a_place_or_form_fastload_cannot_run_are_refused(steps, message):
    """An auto-augment runs first and once; a magnitude past its bins is refused naming the step."""
    with pytest.raises(ConfigError, match=message):
        _train(*steps)


def test_policies_on_floats_and_timms_on_tensors_are_refused():
    """Auto-augments take uint8 pixels; timm's take PIL images only."""
    from timm.data.auto_augment import rand_augment_transform

    with pytest.raises(ConfigError, match="RandAugment on a float tensor"):
        translate(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.RandAugment()]))
    with pytest.raises(ConfigError, match="AutoAugment before the crop"):
        translate(T.Compose([T.AutoAugment(), T.RandomResizedCrop(24), T.ToTensor()]))
    timm_ra = rand_augment_transform("rand-m9-n2", {})
    assert _train(timm_ra).policy.library == "timm"
    with pytest.raises(ConfigError, match="RandAugment on a tensor"):
        translate(T.Compose([T.RandomResizedCrop(24), T.PILToTensor(), timm_ra]))


# ----------------------------------------------------------------------------- _erasing


@pytest.mark.parametrize("api", [T, v2], ids=["v1", "v2"])
def test_erasing_settings_are_the_objects_arguments(api):
    """RandomErasing(p, scale, ratio, value) as FastLoader's Erasing; value 'random' (v2: None): pixel noise."""
    norm = (api.ToTensor() if api is T else v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)]),
            api.Normalize(MEAN, STD))  # fmt: skip
    aug = _train(tail=(*norm, api.RandomErasing(p=0.3, scale=(0.1, 0.2), ratio=(0.5, 2.0), value=0.7)), api=api)
    assert aug.erasing == Erasing(p=0.3, scale=(0.1, 0.2), ratio=(0.5, 2.0), value=(0.7,))
    aug = _train(tail=(*norm, api.RandomErasing(p=0.6, value="random")), api=api)
    assert aug.erasing == Erasing(p=0.6, scale=(0.02, 0.33), ratio=(0.3, 3.3), noise="pixel")
    # on uint8 pixels a fixed value is erased as is
    aug = _train(tail=(api.PILToTensor(), api.RandomErasing(p=1.0, value=0)), api=api)
    assert aug.erasing == Erasing(p=1.0, value=(0.0,)) and aug.mean is None


def test_erasing_in_a_form_fastload_cannot_run_is_refused():
    """On a PIL image (torchvision raises), twice, noise on uint8 pixels, or settings Erasing refuses: named."""
    with pytest.raises(ConfigError, match=r"RandomErasing\(.*\(step 2 of 3 of the transform\): RandomErasing needs a tensor"):
        translate(T.Compose([T.RandomResizedCrop(24), T.RandomErasing(), T.ToTensor()]))
    with pytest.raises(ConfigError, match=r"step 4 of 4 of the transform\): a second RandomErasing \(the first is .*step 3 of 4"):
        _train(tail=(T.ToTensor(), T.RandomErasing(), T.RandomErasing()))
    with pytest.raises(ConfigError, match="random-noise erasing on a uint8 image"):
        _train(tail=(T.PILToTensor(), T.RandomErasing(value="random")))
    with pytest.raises(ConfigError, match="random-noise erasing on a uint8 image"):
        _train(tail=(v2.PILToTensor(), v2.RandomErasing(value="random")), api=v2)  # kept as value=None
    t = T.RandomErasing()
    t.p = 1.5
    with pytest.raises(ConfigError, match=r"RandomErasing\(.*\(step 3 of 3 of the transform\): erasing p"):
        _train(tail=(T.ToTensor(), t))


def test_timms_erasing_is_read_and_refused_on_uint8():
    """timm's RandomErasing (its mode) after Normalize is translated; on uint8 pixels it is refused (it draws noise)."""
    from timm.data.random_erasing import RandomErasing as TimmErasing

    aug = _train(tail=(T.ToTensor(), T.Normalize(MEAN, STD), TimmErasing(probability=0.25, mode="pixel", device="cpu")))
    assert aug.erasing.p == 0.25 and aug.erasing.noise == "pixel"
    with pytest.raises(ConfigError, match="random-noise erasing on a uint8 image"):
        _train(tail=(T.PILToTensor(), TimmErasing(probability=0.25, mode="const", device="cpu")))


# ----------------------------------------------------------------------------- outputs_equal (wrapper detection)


def _img(mode="RGB", size=(4, 3), value=7):
    return Image.new(mode, size, value if mode == "L" else (value, value, value))


@pytest.mark.parametrize(
    ("a", "b", "want"),
    [
        (_img(), _img(), True),
        (_img(), _img(value=8), False),
        (_img(), _img(size=(3, 4)), False),
        (_img("L", value=7), _img(value=7).convert("L"), True),
        (_img("L"), _img("P"), False),
        (np.arange(6).reshape(2, 3), np.arange(6).reshape(2, 3), True),
        (np.arange(6).reshape(2, 3), np.arange(6).reshape(3, 2), False),
        (np.arange(6).reshape(2, 3), np.arange(6).reshape(2, 3) + (np.arange(6).reshape(2, 3) == 5), False),
        (torch.arange(6), torch.arange(6), True),
        (torch.arange(6), np.arange(6), False),
        (torch.arange(4), torch.arange(6), False),
        ((1, 2), (1, 2), False),
        (_img(), np.asarray(_img()), False),
    ],
)
def test_outputs_equal_is_same_type_shape_and_values(a, b, want):
    """Two probe outputs are the same only with the same image mode, size and bytes, or array type, shape and values."""
    assert outputs_equal(a, b) is want


class _Wrapper:
    """A preset class (torchvision's references' ClassificationPresetTrain): its .transforms, optionally altered."""

    def __init__(self, transforms, after=None):
        self.transforms = transforms
        self.after = after

    def __call__(self, img):
        out = self.transforms(img)
        return out if self.after is None else self.after(out)


def test_a_wrapper_is_read_through_only_when_it_gives_what_its_transforms_give():
    """A class that only applies .transforms is unwrapped; one that also flips the result is refused."""
    inner = T.Compose([T.RandomResizedCrop(24), T.PILToTensor()])
    aug = translate(_Wrapper(inner))
    assert (aug.train, aug.crop, aug.mean) == (True, 24, None)
    with pytest.raises(ConfigError, match=r"it keeps steps in .transforms, but calling it does not give"):
        translate(_Wrapper(inner, after=lambda x: x.flip(-1)))
    with pytest.raises(ConfigError, match=r"it keeps steps in .transforms, but calling it does not give"):
        translate(_Wrapper(inner, after=lambda x: x + 1))


class _Preset:
    """A preset class that converts its input to RGB before applying .transforms (as training scripts write)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        return self.transforms(img.convert("RGB"))


def test_a_wrapper_is_probed_with_an_rgb_image_and_every_generator_restored():
    """The probe is an RGB image (a preset's convert("RGB") changes nothing), and the random states are put back."""
    import random

    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    before = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(11), np.random.seed(11), torch.manual_seed(11)
    aug = translate(_Preset(T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()])))
    assert (aug.train, aug.crop, aug.flip) == (True, 24, 0.5)
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == before


class _TwoViews:
    """SimCLR's two-view transform: the same transform twice, as a tuple."""

    def __init__(self, t):
        self.t = t

    def __call__(self, img):
        return self.t(img), self.t(img)


class MyRandomCrop:
    """A look-alike of a crop that is not torchvision's."""

    def __call__(self, img):
        return img


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        # multi-view transforms, of PIL images and of tensors
        ([_TwoViews(T.RandomResizedCrop(24))], r"\): it returns 2 views of each image \(a 2-item tuple or list\) inside a "
         r"longer transform; .* transform=\[view_1, view_2, \.\.\.\]\)$"),
        ([_TwoViews(T.Compose([T.RandomResizedCrop(24), T.PILToTensor()]))], r"\): it returns 2 views of each image"),
        ([MyRandomCrop()], r"\): not one of torchvision's own transforms that FastLoader translates"),
        ([_Wrapper(T.RandomResizedCrop(24), after=lambda x: x.rotate(90))],
         r"\): it keeps steps in .transforms, .* give the dataset its .transforms, and do the rest in the training loop$"),
        # geometry messages
        ([T.RandomResizedCrop(24), T.RandomResizedCrop(24)],
         r"step 2 of 3 of the transform\): a second crop or resize after transforms.RandomResizedCrop\(.*remove this step$"),
        ([T.RandomResizedCrop(24), T.Resize(32)], r"step 2 of 3 of the transform\): a second crop or resize after"),
        ([T.Resize(32), T.CenterCrop(24), T.Resize(32)],
         r"step 3 of 4 of the transform\): a crop or resize after transforms.Resize\(.*Resize\(S\) then CenterCrop\(N\); remove this step$"),
        ([T.Resize(32), T.CenterCrop((24, 32))], r"\): crop size \(24, 32\) is not square"),
        ([T.Resize(0), T.CenterCrop(24)], r"\): size 0 must be at least 1 pixel"),
        ([T.Resize(32, max_size=40), T.CenterCrop(24)], r"\): max_size caps the longer side"),
        ([T.Resize(32), T.RandomHorizontalFlip(), T.CenterCrop(24)],
         r"step 2 of 4 of the transform\): a horizontal flip in the evaluation form"),
        # colour steps where FastLoader cannot run them
        ([T.Resize(32), T.ColorJitter(0.4), T.CenterCrop(24)], r"\): ColorJitter in the evaluation form"),
        ([T.RandomResizedCrop(24), T.ToTensor(), T.Normalize((0, 0, 0), (0.5, 0.5, 0.5)), T.ColorJitter(0.4)],
         r"\): ColorJitter after Normalize acts on normalised values"),
        ([T.RandomResizedCrop(24), T.ToTensor(), T.RandAugment()],
         r"\): RandAugment on a float tensor \(transforms.ToTensor\(\) \(step 2 of 3 of the transform\)\): its operations "
         r"take PIL images or uint8 pixels here; put it before ToTensor\(\)/PILToTensor\(\), as the references do$"),
        ([T.RandomResizedCrop(24), T.TrivialAugmentWide(), T.ColorJitter(0.4), T.ColorJitter(contrast=0.4)],
         r"step 4 of 5 of the transform\): ColorJitter after a colour step, with transforms.TrivialAugmentWide\(.*\(step 2 of 5"
         r".*ColorJitter, then one RandomGrayscale; a chain in another order cannot hold the auto-augment$"),
        # conversions and Normalize
        ([T.RandomResizedCrop(24), T.ConvertImageDtype(torch.float32), T.PILToTensor()],
         r"\): it needs a tensor, but the image is still a PIL image here \(torchvision raises\)"),
        ([T.RandomResizedCrop(24), T.ToTensor(), T.ConvertImageDtype(torch.uint8)],
         r"\): converting a float image back to uint8 .* use PILToTensor\(\) \(or v2.ToImage\(\)\) without a float conversion$"),
        ([T.RandomResizedCrop(24), v2.ToImage(), v2.ToDtype({torch.Tensor: torch.float32})],
         r"\): its dtype dict has no entry for tv_tensors.Image and no 'others' \(torchvision raises\); give dtype=torch.float32$"),
        ([T.RandomResizedCrop(24), T.Normalize(MEAN, STD), T.ToTensor()],
         r"\): Normalize needs a float tensor, but the image is a PIL image here"),
        ([T.RandomResizedCrop(24), T.ToTensor(), T.Normalize((0.5, 0.5), STD)], r"\): mean \(0.5, 0.5\) must be 1 or 3 finite"),
        ([T.RandomResizedCrop(24), T.ToTensor(), T.Normalize(MEAN, (1, 1))], r"\): std \(1, 1\) must be 1 or 3 finite"),
    ],
)
def test_refusals_name_the_step_and_say_what_to_do(steps, message):
    """Each refusal's message: the step, then why and what to do (the text the user reads, checked as written)."""
    if not any(isinstance(s, (T.PILToTensor, T.ToTensor, v2.ToImage)) for s in steps):
        steps = [*steps, T.PILToTensor()]
    with pytest.raises(ConfigError, match=message):
        translate(T.Compose(steps))


def test_a_v2_dtype_conversion_of_a_pil_image_passes_it_through():
    """v2's ConvertImageDtype/ToDtype leave a PIL image untouched (torchvision.transforms' ConvertImageDtype raises)."""
    aug = translate(v2.Compose([v2.RandomResizedCrop(24), v2.ConvertImageDtype(torch.float32), v2.PILToTensor()]))
    assert aug.mean is None and aug.std is None


def test_a_second_jitter_is_a_chain_stage_after_the_first():
    """ColorJitter then ColorJitter: both run, in order: two chain stages."""
    stages = _stages(T.ColorJitter(brightness=0.4), T.ColorJitter(contrast=0.5))
    assert stages == (
        Stage(groups=((Op(name="ColorJitter", jitter=Jitter(brightness=(0.6, 1.4))),),)),
        Stage(groups=((Op(name="ColorJitter", jitter=Jitter(contrast=(0.5, 1.5))),),)),
    )


def test_a_jitter_range_jitter_refuses_is_refused_naming_the_step():
    """A ColorJitter whose brightness range is reversed (set after construction) is refused, naming the step."""
    t = T.ColorJitter()
    t.brightness = (1.5, 0.5)
    with pytest.raises(ConfigError, match=r"ColorJitter\(.*\(step 2 of 3 of the transform\): .*brightness"):
        _train(t)


def test_timms_auto_augment_on_a_tensor_is_refused():
    """timm's AutoAugment takes PIL images only."""
    from timm.data.auto_augment import auto_augment_transform

    aa = auto_augment_transform("original", {})
    assert _train(aa).policy.kind == "auto"
    with pytest.raises(ConfigError, match=r"\): AutoAugment on a tensor"):
        translate(T.Compose([T.RandomResizedCrop(24), T.PILToTensor(), aa]))


def test_jitters_after_a_chain_fold_into_that_chain():
    """RandomInvert, ColorJitter, ColorJitter: the chain then both jitters, in order (a chain policy may take them)."""
    stages = _stages(T.RandomInvert(0.5), T.ColorJitter(brightness=0.4), T.ColorJitter(contrast=0.5))
    assert stages == (
        Stage(groups=((Op(name="Invert", prob=0.5),),)),
        Stage(groups=((Op(name="ColorJitter", jitter=Jitter(brightness=(0.6, 1.4))),),)),
        Stage(groups=((Op(name="ColorJitter", jitter=Jitter(contrast=(0.5, 1.5))),),)),
    )


def test_resize_without_a_size_is_refused_saying_why():
    """Resize(size=None) (v2's max_size-only form) has no shorter side to resize to."""
    t = T.Resize(32)
    t.size = None
    with pytest.raises(ConfigError, match=r"step 1 of 3 of the transform\): size=None \(only max_size\): FastLoader resizes"):
        translate(T.Compose([t, T.CenterCrop(24), T.ToTensor()]))


# ----------------------------------------------------------------------------- refusals written out whole


def _refusal(transform) -> str:
    with pytest.raises(ConfigError) as e:
        translate(transform)
    return str(e.value)


def test_refusals_of_conversions_and_normalize_are_written_out_whole():
    """The text after the step's name, as the user reads it, for the conversion, Normalize and Grayscale refusals."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.ConvertImageDtype(torch.uint8)]))
    assert msg.endswith(
        "(step 3 of 3 of the transform): converting a float image back to uint8 has no FastLoader equivalent; for "
        "uint8 batches use PILToTensor() (or v2.ToImage()) without a float conversion"
    )
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.Normalize(MEAN, STD), T.ToTensor()]))
    assert msg.endswith(
        "(step 2 of 3 of the transform): Normalize needs a float tensor, but the image is a PIL image here "
        "(torchvision raises): put ToTensor() (or PILToTensor() + ConvertImageDtype(torch.float)) before it"
    )
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.PILToTensor()]))
    assert msg.endswith(
        "(step 3 of 3 of the transform): the image is already a tensor (transforms.ToTensor() (step 2 of 3 of the "
        "transform)); it converts PIL images: keep one tensor conversion"
    )
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.Grayscale(1), T.PILToTensor()]))
    assert msg.endswith(
        "(step 2 of 3 of the transform): Grayscale with one output channel: FastLoader batches are RGB; use "
        "num_output_channels=3"
    )
    msg = _refusal(T.Compose([T.RandomResizedCrop((24, 32)), T.PILToTensor()]))
    assert msg.endswith("(step 1 of 2 of the transform): crop size (24, 32) is not square; FastLoader produces square "
                        "crop sizes: use one size, e.g. 24")


def test_a_transform_that_ends_on_a_pil_image_is_refused_saying_what_to_add():
    """No tensor conversion: a DataLoader cannot batch PIL images; the message names the transform and both conversions."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24)]))
    assert msg.startswith("transform transforms.Compose(")
    assert msg.endswith(
        "): it returns PIL images, which a DataLoader cannot batch; add ToTensor() (float 0..1) or PILToTensor() "
        "(uint8 0..255) after the crop"
    )


def test_greyscales_after_an_auto_augment_cannot_become_a_chain_and_are_refused_naming_both():
    """TrivialAugmentWide or RandAugment, then two greyscales: the second would make a chain in the user's order,
    which cannot hold the auto-augment; the message names the RandomGrayscale and the auto-augment's step."""
    for first, name in ((T.TrivialAugmentWide(), "TrivialAugmentWide"), (T.RandAugment(), "RandAugment")):
        msg = _refusal(T.Compose([T.RandomResizedCrop(24), first, T.RandomGrayscale(0.5), T.RandomGrayscale(0.5), T.PILToTensor()]))
        assert msg.startswith("transforms.RandomGrayscale(p=0.5) (step 4 of 5 of the transform): RandomGrayscale after a colour "
                              f"step, with transforms.{name}(")
        assert "(step 2 of 5 of the transform): FastLoader runs an auto-augment first" in msg


def test_a_std_that_underflows_to_zero_is_refused_naming_the_normalize():
    """Two Normalize of std 1e-200: their product, 1e-400, is 0.0 in float64 (a division by zero): refused at the
    second Normalize, not passed on as std=0."""
    tiny = (1e-200, 1e-200, 1e-200)
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.Normalize((0, 0, 0), tiny), T.Normalize((0, 0, 0), tiny)]))
    assert msg.startswith("transforms.Normalize(")
    assert "(step 4 of 4 of the transform): std (1e-200, 1e-200, 1e-200) times the std of the Normalize before it " \
           "underflows to 0.0 (a division by zero); FastLoader's std must be positive" in msg


def test_a_negative_std_is_refused_as_negative_and_not_as_an_underflow():
    """A std with a negative channel (its product with the std before is negative, never 0.0) is named negative."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.Normalize((0, 0, 0), (0.5, -0.25, 0.5))]))
    assert msg.startswith("transforms.Normalize(")
    assert msg.endswith("(step 3 of 3 of the transform): std (0.5, -0.25, 0.5) is negative; FastLoader's std must be positive")


def test_random_noise_erasing_keeps_its_scale_and_ratio():
    """RandomErasing(value='random') with its own scale and ratio: both kept, with pixel noise."""
    for api in (T, v2):
        t = api.RandomErasing(p=0.4, scale=(0.05, 0.25), ratio=(0.4, 2.5), value="random")
        aug = _train(tail=(T.ToTensor(), T.Normalize(MEAN, STD), t))
        assert aug.erasing == Erasing(p=0.4, scale=(0.05, 0.25), ratio=(0.4, 2.5), noise="pixel")


def test_v2_to_image_of_a_tensor_keeps_it_and_makes_it_an_image():
    """v2.ToImage after PILToTensor(): the same uint8 values, now a tv_tensors.Image, so ToDtype's dict entry for
    Image applies (float 0..1 with scale=True: mean 0, std 1)."""
    from torchvision import tv_tensors

    aug = translate(v2.Compose([v2.RandomResizedCrop(24), v2.PILToTensor(), v2.ToImage()]))
    assert aug.mean is None and aug.std is None
    by_type = v2.ToDtype({tv_tensors.Image: torch.float32, "others": torch.float16}, scale=True)
    aug = translate(v2.Compose([v2.RandomResizedCrop(24), v2.PILToTensor(), v2.ToImage(), by_type]))
    assert (aug.mean, aug.std, aug.dtype) == ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), torch.float32)
    # without the ToImage the plain tensor takes the "others" entry
    aug = translate(v2.Compose([v2.RandomResizedCrop(24), v2.PILToTensor(), by_type]))
    assert (aug.mean, aug.std, aug.dtype) == ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), torch.float16)


def test_the_wrapper_probe_is_a_64_by_48_rgb_image_seen_from_the_seeded_generators():
    """What a wrapper is called on: a 64 x 48 RGB PIL image, with Python's, NumPy's and torch's generators seeded
    with the seed (the draws are those of freshly seeded generators), and all three put back afterwards."""
    import random

    from fastload.tvkinds import on_probe

    def look(img):
        return img.mode, img.size, random.random(), float(np.random.rand()), float(torch.rand(()))

    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    before = (random.random(), float(np.random.rand()), float(torch.rand(())))
    random.seed(5), np.random.seed(5), torch.manual_seed(5)
    for seed in (0, 1):
        want = ("RGB", (64, 48), random.Random(seed).random(), float(np.random.RandomState(seed).rand()),
                float(torch.rand((), generator=torch.Generator().manual_seed(seed))))  # fmt: skip
        assert on_probe(look, seed) == want
    assert (random.random(), float(np.random.rand()), float(torch.rand(()))) == before


def test_an_interpolation_that_is_no_known_code_or_name_is_refused_naming_it():
    """An int that is none of PIL's codes (0..5), a float or an unknown name: the message names the value as given."""
    for value, shown in ((7, "7"), (-1, "-1"), (2.5, "2.5"), ("area", "AREA")):
        t = T.RandomResizedCrop(24)
        t.interpolation = value
        msg = _refusal(T.Compose([t, T.PILToTensor()]))
        assert msg.endswith(
            f"(step 1 of 2 of the transform): interpolation {shown} is not one FastLoader resizes with as torchvision "
            "does (NEAREST, BILINEAR, BICUBIC, LANCZOS: PIL's filter on the CPU, DALI's on the GPU); use one of those"
        )


def test_an_unknown_step_is_named_by_its_module_and_class():
    """A user's class: its module, then the class (no repr of its own: ``Name()``); a builtin object: its repr alone;
    a class with no module (``__module__`` None or empty): the class alone."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), _Ungrouped(), T.PILToTensor()]))
    assert msg.startswith(f"{__name__}._Ungrouped() (step 2 of 3 of the transform): has no FastLoader equivalent")
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), 5, T.PILToTensor()]))
    assert msg.startswith("5 (step 2 of 3 of the transform): has no FastLoader equivalent")
    for module in (None, ""):
        nameless = type("Nameless", (), {"__module__": module, "__call__": lambda self, img: img})
        msg = _refusal(T.Compose([T.RandomResizedCrop(24), nameless(), T.PILToTensor()]))
        assert msg.startswith("Nameless() (step 2 of 3 of the transform): has no FastLoader equivalent")


class _Ungrouped:
    """A step of the user's own, unknown to FastLoader."""

    def __call__(self, img):
        return img


class _Spaced:
    """A user's step whose repr runs over lines, with tabs and runs of spaces."""

    def __init__(self, width=0):
        self.width = width

    def __repr__(self):
        return "Spaced(\n    a=1,\t\tb=2,   c=3\n)" + "x" * self.width

    def __call__(self, img):
        return img


def test_a_steps_repr_is_named_on_one_line_and_cut_at_160_characters():
    """Runs of whitespace (newlines, tabs, spaces) become one space; a repr over 160 characters ends in "..." at 160."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), _Spaced(), T.PILToTensor()]))
    assert msg.startswith(f"{__name__}.Spaced( a=1, b=2, c=3 ) (step 2 of 3 of the transform): has no FastLoader equivalent")
    one_line = "Spaced( a=1, b=2, c=3 )"  # 23 characters
    for extra, shown in ((160 - 23, one_line + "x" * 137), (161 - 23, one_line + "x" * 134 + "...")):
        msg = _refusal(T.Compose([T.RandomResizedCrop(24), _Spaced(extra), T.PILToTensor()]))
        assert msg.startswith(f"{__name__}.{shown} (step 2 of 3 of the transform): ")


def test_augmix_is_refused_saying_what_it_is():
    """AugMix mixes several augmented chains per image: refused with its own reason, in both APIs."""
    for api, prefix in ((T, "transforms."), (v2, "transforms.v2.")):
        msg = _refusal(api.Compose([api.RandomResizedCrop(24), api.AugMix(), api.PILToTensor()]))
        assert msg.startswith(prefix + "AugMix(")
        assert msg.endswith(
            "(step 2 of 3 of the transform): AugMix (a mix of several augmented chains per image) is not translated: "
            "remove it from the dataset's transform, or apply it to the batch on the GPU after the loader"
        )


def test_the_no_ops_pass_anywhere():
    """v2.Identity, nn.Identity, v2.ToPureTensor and v2.RGB change nothing: accepted before, between and after steps."""
    for noop in (v2.Identity(), torch.nn.Identity(), v2.ToPureTensor(), v2.RGB()):
        aug = translate(v2.Compose([noop, v2.Resize(32), noop, v2.CenterCrop(24), noop, v2.PILToTensor(), noop]))
        assert (aug.train, aug.resize, aug.crop, aug.mean) == (False, 32, 24, None)


def test_a_no_op_is_never_read_as_a_wrapper():
    """An nn.Identity given a .transforms attribute is still the no-op: what it holds (here a flip that never flips,
    which the evaluation form would refuse) is not read."""
    ident = torch.nn.Identity()
    ident.transforms = T.RandomHorizontalFlip(p=0.0)
    aug = translate(T.Compose([T.Resize(32), T.CenterCrop(24), ident, T.PILToTensor()]))
    assert (aug.train, aug.crop, aug.flip) == (False, 24, 0.0)


def test_timms_maybe_pil_to_tensor_is_read_as_pil_to_tensor():
    """timm's MaybePILToTensor converts a PIL image as PILToTensor does (uint8), and passes a tensor through."""
    from timm.data.transforms import MaybePILToTensor

    aug = translate(T.Compose([T.RandomResizedCrop(24), MaybePILToTensor()]))
    assert (aug.mean, aug.std, aug.train, aug.crop) == (None, None, True, 24)
    aug = translate(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), MaybePILToTensor()]))
    assert (aug.mean, aug.std, aug.dtype) == ((0.0, 0.0, 0.0), (1.0, 1.0, 1.0), torch.float32)


def test_containers_nested_more_than_50_deep_are_refused():
    """51 Compose inside each other (the steps at depth 51) are refused with the module's message; 50 are read, and
    wrappers count as a level like containers do."""

    def nest(n):
        t = T.Compose([T.RandomResizedCrop(24), T.PILToTensor()])
        for _ in range(n - 1):
            t = T.Compose([t])
        return t

    assert translate(nest(50)).crop == 24
    with pytest.raises(ConfigError) as e:
        translate(nest(51))
    assert str(e.value) == "transform: containers nested more than 50 deep"
    wrapped = T.Compose([T.RandomResizedCrop(24), T.PILToTensor()])
    for _ in range(51):
        wrapped = _Wrapper(wrapped)
    with pytest.raises(ConfigError, match="^transform: containers nested more than 50 deep$"):
        translate(wrapped)


def test_without_torchvision_every_step_is_unknown(monkeypatch):
    """With torchvision not importable, translate still runs: nn.Identity passes, any other step is refused."""
    import sys

    monkeypatch.setitem(sys.modules, "torchvision", None)
    monkeypatch.setitem(sys.modules, "torchvision.transforms", None)
    msg = _refusal(torch.nn.Sequential(torch.nn.Identity(), torch.nn.ReLU()))
    assert msg == (
        "nn.ReLU() (step 2 of 2 of the transform): has no FastLoader equivalent: remove it from the "
        "dataset's transform, or apply it to the batch on the GPU after the loader"
    )


def test_geometry_refusals_are_written_out_whole():
    """The text after the step's name for the size, flip, max_size, stretching Resize and lone CenterCrop refusals."""
    cases = [
        ([T.RandomResizedCrop(24)], "size", 2.5,
         "(step 1 of 2 of the transform): crop size 2.5 is not an integer number of pixels"),
        ([T.RandomResizedCrop(24)], "size", True,
         "(step 1 of 2 of the transform): crop size True is not an integer number of pixels"),
        ([T.RandomResizedCrop(24), T.RandomHorizontalFlip()], "p", "half",
         "(step 2 of 3 of the transform): p 'half' is not a probability"),
    ]
    for steps, attr, value, tail in cases:
        setattr(steps[-1], attr, value)
        assert _refusal(T.Compose([*steps, T.PILToTensor()])).endswith(tail)
    assert _refusal(T.Compose([T.Resize(32, max_size=40), T.CenterCrop(24), T.PILToTensor()])).endswith(
        "(step 1 of 3 of the transform): max_size caps the longer side, so the shorter one can end below the crop; "
        "FastLoader resizes the shorter side only: remove max_size"
    )
    assert _refusal(T.Compose([T.Resize((32, 40)), T.CenterCrop(24), T.PILToTensor()])).endswith(
        "(step 1 of 3 of the transform): size (32, 40) stretches every image to 32x40, but FastLoader keeps the aspect "
        "ratio (shorter side to `resize`, then a center crop): use Resize(32) + CenterCrop(32)"
    )
    assert _refusal(T.Compose([T.CenterCrop(24), T.PILToTensor()])).endswith(
        "(step 1 of 2 of the transform): CenterCrop without a Resize before it crops the full-resolution image; "
        "FastLoader's evaluation path resizes the shorter side first: put Resize(S) before it (S >= the crop; 256 for 224)"
    )
    assert _refusal(T.Compose([T.RandomHorizontalFlip(), T.PILToTensor()])).endswith(
        "(step 1 of 2 of the transform): a flip without RandomResizedCrop: FastLoader flips only on its training path; "
        "add RandomResizedCrop(N) (training), or remove the flip"
    )
    assert _refusal(v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(24, antialias=False)])).endswith(
        "(step 2 of 2 of the transform): antialias=False on a tensor image (not antialiased): FastLoader always "
        "resizes with antialiasing; use antialias=True (the default)"
    )


def test_dtype_and_normalize_refusals_are_written_out_whole():
    """The text after the step's name for a dtype FastLoader does not produce, a dict without the image's type,
    Normalize of uint8 pixels, and Normalize after RandomErasing."""
    crop = T.RandomResizedCrop(24)
    assert _refusal(T.Compose([crop, T.PILToTensor(), T.ConvertImageDtype(torch.float64)])).endswith(
        "(step 3 of 3 of the transform): dtype torch.float64 is not one FastLoader produces (torch.float32, "
        "torch.float16, torch.bfloat16, or uint8 with PILToTensor alone); convert the batch after the loader"
    )
    from torchvision import tv_tensors

    assert _refusal(v2.Compose([crop, v2.PILToTensor(), v2.ToDtype({tv_tensors.Image: torch.float32})])).endswith(
        "(step 3 of 3 of the transform): its dtype dict has no entry for torch.Tensor and no 'others' (torchvision "
        "raises); give dtype=torch.float32"
    )
    assert _refusal(T.Compose([crop, T.PILToTensor(), T.Normalize(MEAN, STD)])).endswith(
        "(step 3 of 3 of the transform): Normalize needs a float tensor, but the image is a uint8 tensor here "
        "(torchvision raises): put ToTensor() (or PILToTensor() + ConvertImageDtype(torch.float)) before it"
    )
    msg = _refusal(T.Compose([crop, T.ToTensor(), T.RandomErasing(), T.Normalize(MEAN, STD)]))
    head, _, tail = msg.partition("(step 4 of 4 of the transform): Normalize after RandomErasing (transforms.RandomErasing(")
    assert head.startswith("transforms.Normalize(") and tail.endswith(
        ") (step 3 of 4 of the transform)) changes the erased value too; FastLoader erases the finished batch: put "
        "RandomErasing after Normalize (as torchvision's references do)"
    ), msg


def test_a_multi_view_transforms_refusal_is_written_out_whole():
    """Two views per image inside a longer transform: what to do instead, as the user reads it (tests/test_multiview.py
    follows it)."""
    assert _refusal(T.Compose([_TwoViews(T.RandomResizedCrop(24)), T.PILToTensor()])).endswith(
        "(step 1 of 2 of the transform): it returns 2 views of each image (a 2-item tuple or list) inside a longer "
        "transform; FastLoader batches a multi-view transform that is the dataset's whole transform (each view's own "
        "steps inside it): give the dataset the multi-view transform alone, or FastLoader(..., transform=[view_1, "
        "view_2, ...])"
    )


def test_a_whole_multi_view_transform_is_read_view_by_view():
    """Alone, the same two-view transform is read as its one transform twice; a view that returns PIL images is
    refused by its view and attribute."""
    mv = translate(_TwoViews(T.Compose([T.RandomResizedCrop(24), T.PILToTensor()])))
    assert [a.crop for a in mv.views] == [24, 24] and mv.views[0] == mv.views[1]
    with pytest.raises(ConfigError, match=r"^view 1 of 2 \(test_oracles_transforms._TwoViews.t\): transform "
                                          r"transforms.RandomResizedCrop\(.*it returns PIL images"):
        translate(_TwoViews(T.RandomResizedCrop(24)))


class _Lifting:
    """A preset that also changes its input's extreme pixels (0 -> 1, or 255 -> 254) before applying .transforms."""

    def __init__(self, transforms, low):
        self.transforms, self.low = transforms, low

    def __call__(self, img):
        return self.transforms(img.point(lambda v: max(v, 1) if self.low else min(v, 254)))


def test_a_wrapper_that_changes_only_black_or_only_white_pixels_is_noticed():
    """The probe holds every value 0..255, so a preset that lifts blacks or lowers whites is not read as its
    .transforms. Resize(48) of the 64 x 48 probe keeps its size (PIL copies) and CenterCrop(48) keeps pixels as
    they are, so the change reaches the output unblurred."""
    inner = T.Compose([T.Resize(48), T.CenterCrop(48), T.PILToTensor()])
    assert translate(_Preset(inner)).crop == 48  # the probe is RGB: convert("RGB") changes nothing
    for low in (True, False):
        with pytest.raises(ConfigError, match=r"it keeps steps in .transforms, but calling it does not give"):
            translate(_Lifting(inner, low))


def test_size_refusals_and_the_smallest_size():
    """A size of 1 pixel is read; three sizes are not one size; the messages say so."""
    assert translate(T.Compose([T.RandomResizedCrop(1), T.PILToTensor()])).crop == 1
    aug = translate(T.Compose([T.Resize(1), T.CenterCrop(1), T.PILToTensor()]))
    assert (aug.resize, aug.crop) == (1, 1)
    t = T.RandomResizedCrop(24)
    t.size = (24, 24, 24)
    assert _refusal(T.Compose([t, T.PILToTensor()])).endswith("(step 1 of 2 of the transform): crop size (24, 24, 24) is not one size")
    t = T.Resize(32)
    t.size = [32, 32, 32]
    assert _refusal(T.Compose([t, T.CenterCrop(24), T.PILToTensor()])).endswith(
        "(step 1 of 3 of the transform): size [32, 32, 32] is not one size"
    )


def test_timms_crop_without_an_antialias_setting_is_read_on_a_tensor():
    """timm's RandomResizedCropAndInterpolation has no antialias attribute: on a tensor it resizes as torchvision's
    antialiased default does, so it is read; its random interpolation is refused, written out whole."""
    from timm.data.transforms import RandomResizedCropAndInterpolation

    aug = translate(T.Compose([T.PILToTensor(), RandomResizedCropAndInterpolation(24)]))
    assert (aug.train, aug.crop, aug.interpolation) == (True, 24, "bilinear")
    msg = _refusal(T.Compose([RandomResizedCropAndInterpolation(24, interpolation="random"), T.PILToTensor()]))
    assert msg.endswith(
        "(step 1 of 2 of the transform): a random choice of interpolation: FastLoader resizes every image with one "
        "filter; use interpolation='bilinear' or 'bicubic'"
    )


def test_none_and_to_pil_image_are_refused_written_out_whole():
    """transform=None, and ToPILImage (after a tensor conversion): what to do, as the user reads it."""
    with pytest.raises(ConfigError) as e:
        translate(None)
    assert str(e.value) == (
        "transform=None: the dataset returns PIL images of every size, but FastLoader batches need one size; give the "
        "dataset a transform (RandomResizedCrop(N) [+ RandomHorizontalFlip()] for training, or Resize(S) + "
        "CenterCrop(N) for evaluation, then ToTensor()), or pass crop= (and train=) to FastLoader"
    )
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.PILToTensor(), T.ToPILImage(), T.PILToTensor()]))
    assert msg.endswith(
        "(step 3 of 4 of the transform): ToPILImage has no FastLoader equivalent: remove it from the dataset's "
        "transform, or apply it to the batch on the GPU after the loader"
    )


def test_a_random_apply_of_a_sequential_is_one_stage_not_a_wrapper():
    """RandomApply(nn.Sequential(a, b), p=1.0) gives what its .transforms gives, but it is a known transform: one
    stage running a then b, not two stages read through it."""
    ra = T.RandomApply(torch.nn.Sequential(T.RandomInvert(1.0), T.RandomSolarize(100, p=1.0)), p=1.0)
    assert _stages(ra) == (Stage(p=1.0, groups=((Op(name="Invert", prob=1.0), Op(name="Solarize", prob=1.0, magnitude=100.0)),)),)


class _SometimesMore:
    """A preset that, with probability 1/2 (Python's random), also flips the result of its .transforms."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        import random

        out = self.transforms(img)
        return out.flip(-1) if random.random() < 0.5 else out


def test_a_wrapper_that_does_more_only_sometimes_is_noticed():
    """The probe runs from two random states (seeds 0 and 1); Python's first draw is 0.84 at seed 0 and 0.13 at
    seed 1, so a preset that flips when it draws below 1/2 flips at the second and is not read as its .transforms."""
    import random

    assert random.Random(0).random() >= 0.5 > random.Random(1).random()
    with pytest.raises(ConfigError, match=r"it keeps steps in .transforms, but calling it does not give"):
        translate(_SometimesMore(T.Compose([T.Resize(48), T.CenterCrop(48), T.PILToTensor()])))


def test_once_a_chain_has_taken_a_jitter_later_jitters_join_it():
    """ColorJitter, RandomInvert, ColorJitter: the first jitter became the chain's first stage, so the user's order
    holds from there on: the second jitter is the chain's third stage, not the Augment's own jitter."""
    aug = _train(T.ColorJitter(brightness=0.4), T.RandomInvert(0.5), T.ColorJitter(contrast=0.5))
    assert aug.jitter is None and aug.policy.stages == (
        Stage(groups=((Op(name="ColorJitter", jitter=Jitter(brightness=(0.6, 1.4))),),)),
        Stage(groups=((Op(name="Invert", prob=0.5),),)),
        Stage(groups=((Op(name="ColorJitter", jitter=Jitter(contrast=(0.5, 1.5))),),)),
    )


def test_nearest_on_a_tensor_needs_no_antialias_and_noise_erasing_on_uint8_says_where_to_go():
    """NEAREST never antialiases, so antialias=False on a tensor is read for it; noise erasing on uint8: the message."""
    aug = translate(v2.Compose([v2.PILToTensor(), v2.RandomResizedCrop(24, interpolation=InterpolationMode.NEAREST, antialias=False)]))
    assert (aug.crop, aug.interpolation) == (24, "nearest")
    assert _refusal(T.Compose([T.RandomResizedCrop(24), T.PILToTensor(), T.RandomErasing(value="random")])).endswith(
        "(step 3 of 3 of the transform): random-noise erasing on a uint8 image: put it after the float conversion and Normalize"
    )
