"""translate()'s refusals, written out whole, and its reading of sizes, flips, PIL codes, wrappers and timm's modules.

Oracles: the messages as the user reads them, written out by hand; torchvision's own reading of an int
interpolation (``RandomResizedCrop(interpolation=code)`` maps PIL's codes to ``InterpolationMode``) and its
refusal of a float crop size; presets built here whose calls differ from their ``.transforms`` only in one
random state, or that cannot run; and ``sys.modules`` without timm, or with a timm module lacking names.
"""

from __future__ import annotations

import random
import sys
import types

import numpy as np
import pytest
import torch

from fastload import ConfigError

pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402

from fastload.transforms import translate  # noqa: E402
from fastload.tvkinds import on_probe  # noqa: E402

_RRC = "transforms.RandomResizedCrop(size=(24, 24), scale=(0.08, 1.0), ratio=(0.75, 1.3333), interpolation=bilinear, antialias=True)"
_TAIL = "remove it from the dataset's transform, or apply it to the batch on the GPU after the loader"
_HINT = "RandomResizedCrop(N) [+ RandomHorizontalFlip()] for training, or Resize(S) + CenterCrop(N) for evaluation"


def _refusal(transform) -> str:
    with pytest.raises(ConfigError) as e:
        translate(transform)
    return str(e.value)


# ----------------------------------------------------------------------------- messages written out whole


def test_a_random_apply_of_a_jitter_or_grayscale_in_evaluation_is_refused_naming_the_random_apply():
    """RandomApply([ColorJitter]) and RandomApply([RandomGrayscale]) in the evaluation form are refused with the
    RandomApply's own name and position, as the user wrote them."""
    msg = _refusal(T.Compose([T.Resize(32), T.CenterCrop(24), T.RandomApply([T.ColorJitter(0.4)], p=0.5), T.PILToTensor()]))
    assert msg == (
        "transforms.RandomApply( p=0.5 ColorJitter(brightness=(0.6, 1.4), contrast=None, saturation=None, hue=None) ) "
        "(step 3 of 4 of the transform): ColorJitter in the evaluation form: FastLoader applies it to training batches "
        "only; remove it"
    )
    msg = _refusal(T.Compose([T.Resize(32), T.CenterCrop(24), T.RandomApply([T.RandomGrayscale(0.5)], p=0.5), T.PILToTensor()]))
    assert msg == (
        "transforms.RandomApply( p=0.5 RandomGrayscale(p=0.5) ) (step 3 of 4 of the transform): RandomGrayscale in the "
        "evaluation form: FastLoader applies it to training batches only; remove it"
    )


def test_a_v1_dtype_conversion_of_a_pil_image_is_refused_written_out_whole():
    """transforms.ConvertImageDtype on a PIL image (torchvision raises): the message says what to put before it."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.ConvertImageDtype(torch.float32), T.PILToTensor()]))
    assert msg == (
        "transforms.ConvertImageDtype() (step 2 of 3 of the transform): it needs a tensor, but the image is still a "
        "PIL image here (torchvision raises): put PILToTensor() before it"
    )


def test_a_mean_that_is_not_numbers_is_refused_naming_it():
    """Normalize(mean='abc'): the message names the mean as given and says it is not numbers."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.Normalize("abc", (1, 1, 1))]))
    assert msg == "transforms.Normalize(mean=abc, std=(1, 1, 1)) (step 3 of 3 of the transform): mean 'abc' is not numbers"


class MyRandomCrop:
    """A look-alike of a crop that is not torchvision's."""

    def __call__(self, img):
        return img


def test_a_look_alike_of_a_known_step_is_pointed_to_torchvisions_written_out_whole():
    """A user's class named like a crop: the message lists the steps FastLoader translates and where they come from."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), MyRandomCrop(), T.PILToTensor()]))
    assert msg == (
        f"{__name__}.MyRandomCrop() (step 2 of 3 of the transform): not one of torchvision's own transforms that "
        "FastLoader translates (RandomResizedCrop, RandomCrop, RandomHorizontalFlip, Resize, CenterCrop, ToTensor, PILToTensor, "
        "ToImage, ConvertImageDtype, ToDtype and Normalize, from torchvision.transforms or torchvision.transforms.v2); "
        "use the torchvision one"
    )


def test_an_empty_transform_is_refused_naming_it():
    """An empty Compose or nn.Sequential: the message names the transform itself, then says what to use."""
    assert _refusal(T.Compose([])) == f"transform transforms.Compose( ) is empty; FastLoader batches need one size: use {_HINT}"
    assert _refusal(torch.nn.Sequential()) == f"transform nn.Sequential() is empty; FastLoader batches need one size: use {_HINT}"


def test_a_center_crop_after_a_crop_is_refused_naming_the_step_that_set_the_form():
    """CenterCrop after RandomResizedCrop, or after Resize + CenterCrop: the message names the crop or the Resize
    that set the form, with its position."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.CenterCrop(24), T.PILToTensor()]))
    assert msg == (
        f"transforms.CenterCrop(size=(24, 24)) (step 2 of 3 of the transform): a second crop or resize after {_RRC} "
        "(step 1 of 3 of the transform): FastLoader crops and resizes once, with RandomResizedCrop from the full image "
        "(training); remove this step"
    )
    msg = _refusal(T.Compose([T.Resize(32), T.CenterCrop(24), T.CenterCrop(24), T.PILToTensor()]))
    assert msg == (
        "transforms.CenterCrop(size=(24, 24)) (step 3 of 4 of the transform): a crop or resize after "
        "transforms.Resize(size=32, interpolation=bilinear, max_size=None, antialias=True) (step 1 of 4 of the "
        "transform): FastLoader's evaluation path is exactly Resize(S) then CenterCrop(N); remove this step"
    )


# ----------------------------------------------------------------------------- sizes, flips, interpolation codes


@pytest.mark.parametrize("size", [(24.0, 24), (24, 24.0)])
def test_a_size_pair_with_a_float_side_is_refused(size):
    """RandomResizedCrop((24.0, 24)) or ((24, 24.0)): equal sides, but 24.0 is no number of pixels (torchvision
    raises TypeError for either). Written for: only the side that is kept checked, so (24, 24.0) was read as 24."""
    with pytest.raises(TypeError):
        T.RandomResizedCrop(size)(Image.new("RGB", (32, 32)))
    msg = _refusal(T.Compose([T.RandomResizedCrop(size), T.PILToTensor()]))
    assert msg == (
        f"transforms.RandomResizedCrop(size={size!r}, scale=(0.08, 1.0), ratio=(0.75, 1.3333), interpolation=bilinear, "
        f"antialias=True) (step 1 of 2 of the transform): crop size {size!r} is not an integer number of pixels"
    )


@pytest.mark.parametrize("p", [0.0, 1.0, 0.5])
def test_a_flip_probability_at_its_bounds_is_read(p):
    """RandomHorizontalFlip(p) for p in [0, 1], both bounds included, is the Augment's flip."""
    aug = translate(T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(p), T.PILToTensor()]))
    assert (aug.train, aug.crop, aug.flip) == (True, 24, p)


@pytest.mark.parametrize("p", [1.5, 2.0, -0.5])
def test_a_flip_probability_outside_0_1_is_refused_naming_it(p):
    """RandomHorizontalFlip(p) with p above 1 or below 0 is no probability: refused, naming p."""
    msg = _refusal(T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(p), T.PILToTensor()]))
    assert msg == f"transforms.RandomHorizontalFlip(p={p}) (step 2 of 3 of the transform): p {p} is not a probability in [0, 1]"


@pytest.mark.parametrize("code", [0, 1, 2, 3, Image.Resampling.BICUBIC, Image.Resampling.LANCZOS])
def test_pils_interpolation_codes_are_read_as_torchvision_reads_them(code):
    """An int interpolation (PIL's code, as timm passes it, or PIL's own Resampling member) is the filter
    torchvision maps it to."""
    want = T.RandomResizedCrop(24, interpolation=int(code)).interpolation.value
    t = T.RandomResizedCrop(24)
    t.interpolation = code
    assert translate(T.Compose([t, T.PILToTensor()])).interpolation == want


@pytest.mark.parametrize(("code", "mode"), [(4, InterpolationMode.BOX), (5, InterpolationMode.HAMMING)])
def test_pils_box_and_hamming_codes_are_refused_by_their_names(code, mode):
    """PIL's codes 4 and 5 are BOX and HAMMING (as torchvision maps them), which FastLoader does not resize with."""
    assert T.RandomResizedCrop(24, interpolation=code).interpolation is mode
    t = T.RandomResizedCrop(24)
    t.interpolation = code
    assert _refusal(T.Compose([t, T.PILToTensor()])).endswith(
        f"(step 1 of 2 of the transform): interpolation {mode.value.upper()} is not one FastLoader resizes with as "
        "torchvision does (NEAREST, BILINEAR, BICUBIC, LANCZOS: PIL's filter on the CPU, DALI's on the GPU); use one of those"
    )


# ----------------------------------------------------------------------------- wrappers, views and the probe

_INNER = T.Compose([T.Resize(48), T.CenterCrop(48), T.PILToTensor()])
_NOT_ITS_TRANSFORMS = (
    "(step 1 of 1 of the transform): it keeps steps in .transforms, but calling it does not give what calling its "
    ".transforms gives (checked on a probe image), so it does more than apply them: give the dataset its "
    ".transforms, and do the rest in the training loop"
)


class _Preset:
    """A preset class: applies .transforms, then flips the result when Python's first draw is at least 1/2."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        out = self.transforms(img)
        return out.flip(-1) if random.random() >= 0.5 else out


def test_a_wrapper_that_does_more_only_from_the_first_random_state_is_noticed():
    """Python's first draw is 0.84 at seed 0 and 0.13 at seed 1: a preset that flips when it draws at least 1/2
    differs from its .transforms only from the first state, and is not read as them."""
    assert random.Random(0).random() >= 0.5 > random.Random(1).random()
    assert _refusal(_Preset(_INNER)) == f"{__name__}._Preset() {_NOT_ITS_TRANSFORMS}"


class _Failing:
    """A preset that cannot run on an RGB PIL image (it wants something else)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, img):
        raise ValueError("wants a tensor")


def test_a_wrapper_that_cannot_run_on_the_probe_is_not_read_through():
    """A preset whose call raises on the RGB probe cannot be checked to only apply .transforms: refused, not read."""
    assert _refusal(_Failing(_INNER)) == f"{__name__}._Failing() {_NOT_ITS_TRANSFORMS}"


class _Views:
    """A multi-view transform whose number of views is drawn: 2 when Python's first draw is at least 1/2, else 3."""

    def __call__(self, img):
        return (img,) * (2 if random.random() >= 0.5 else 3)


def test_the_views_are_counted_from_the_first_random_state():
    """The count in the message is what the transform returns from the random state seeded 0 (0.84: two views)."""
    assert random.Random(0).random() >= 0.5
    msg = _refusal(T.Compose([_Views()]))
    assert msg == (
        f"{__name__}._Views returns 2 views of each image (a 2-item list or tuple), but no transforms among its "
        "attributes give those views when called in turn (checked on a probe image): pass the transform of each view, "
        "in order, as FastLoader(..., transform=[view_1, ..., view_2])"
    )


def test_the_probe_is_the_same_image_every_time():
    """The wrapper probe is one fixed image (NumPy's PCG64 from seed 7, uniform in 0..255, 48 rows of 64 RGB pixels),
    so a wrapper is read the same way on every call."""
    want = np.random.Generator(np.random.PCG64(7)).integers(0, 256, size=(48, 64, 3), dtype=np.uint8)
    for seed in (0, 1):
        seen = on_probe(lambda img: np.asarray(img).copy(), seed)
        assert seen.dtype == np.uint8 and np.array_equal(seen, want)


def test_a_wrapper_counts_one_level_of_nesting_like_a_compose():
    """A preset around 49 Compose inside each other puts the steps at depth 50, the deepest read; around 50, at 51:
    refused."""

    class Plain:
        def __init__(self, transforms):
            self.transforms = transforms

        def __call__(self, img):
            return self.transforms(img)

    def nest(n):
        t = T.Compose([T.RandomResizedCrop(24), T.PILToTensor()])
        for _ in range(n - 1):
            t = T.Compose([t])
        return t

    assert translate(Plain(nest(49))).crop == 24
    with pytest.raises(ConfigError) as e:
        translate(Plain(nest(50)))
    assert str(e.value) == "transform: containers nested more than 50 deep"


# ----------------------------------------------------------------------------- without timm, or an older timm


def test_translate_runs_with_no_timm_module_loaded(monkeypatch):
    """With none of timm's modules imported (most users), torchvision's steps are read as ever."""
    for name in ("timm.data.transforms", "timm.data.auto_augment", "timm.data.random_erasing"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    aug = translate(T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.PILToTensor()]))
    assert (aug.train, aug.crop, aug.flip, aug.mean) == (True, 24, 0.5, None)


def test_an_older_timm_without_its_maybe_conversions_is_read(monkeypatch):
    """A timm whose transforms module has RandomResizedCropAndInterpolation and ToNumpy but no MaybeToTensor or
    MaybePILToTensor: its crop is still read as RandomResizedCrop, its ToNumpy as PILToTensor."""
    from timm.data import transforms as timm_transforms

    older = types.ModuleType("timm.data.transforms")
    older.RandomResizedCropAndInterpolation = timm_transforms.RandomResizedCropAndInterpolation
    older.ToNumpy = timm_transforms.ToNumpy
    monkeypatch.setitem(sys.modules, "timm.data.transforms", older)
    aug = translate(T.Compose([older.RandomResizedCropAndInterpolation(24), older.ToNumpy()]))
    assert (aug.train, aug.crop, aug.interpolation, aug.mean, aug.std) == (True, 24, "bilinear", None, None)
