"""Auto-augment and chain operations on the batch's device: torchvision's tensor functions on the uint8 images.

``fastload.batchaug.policy(..., on_device=True)`` is the path CUDA batches take; here it runs
on CPU tensors (the same code, the same torchvision calls). Oracles: torchvision's own tensor
implementation (``autoaugment._apply_op``, ``ColorJitter`` with its draw fixed, on the uint8
tensor), exactly; and the PIL path (torchvision's and timm's PIL pipeline, as a DataLoader worker
runs it), within the per-operation differences measured here on textured 32 x 32 images:

* identical: translations, Brightness, Posterize, Solarize, Equalize, Invert, GaussianBlur (torchvision's
  PIL blur runs the tensor kernel), timm's Solarize, SolarizeAdd, Posterize, Brightness;
* within 1 level (torch truncates its blends where PIL rounds some): Color, Contrast, Sharpness,
  AutoContrast, Grayscale, the jitter's contrast and saturation, timm's Color, Contrast,
  Sharpness, Desaturate (mean 0.2 to 0.5 levels);
* hue (torchvision's float HSV against PIL's 8-bit HSV): mean 0.4 to 0.7, max 10 levels;
* shears and rotations (torch's grid sampling against PIL's affine: a pixel may come from the
  neighbouring source pixel): mean 0 to 3.5 levels, single pixels up to 251 apart on noise.

timm's affine operations and its blur (PIL's box-filter approximation) have no tensor twin and
stay on the host: identical to the PIL path. On the CPU the PIL path is the default: it is
exactly the DataLoader's pipeline and measured faster (RandAugment(2, 9) on 224 x 224 crops:
1.6 ms/image in PIL against 2.5 ms on tensors, one thread).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")

from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import InterpolationMode  # noqa: E402
from torchvision.transforms.autoaugment import _apply_op  # noqa: E402

from fastload.batchaug import TIMM_HOST_OPS, tensor_op  # noqa: E402
from fastload.batchaug import policy as run_policy  # noqa: E402
from fastload.augment.policies import plan  # noqa: E402
from fastload.transforms import translate  # noqa: E402

NAN = math.nan
MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def images() -> torch.Tensor:
    """16 textured 32 x 32 uint8 images: gradients of several slopes plus uniform noise."""
    rng = np.random.default_rng(0)
    yy, xx = np.mgrid[0:32, 0:32]
    out = []
    for i in range(16):
        base = np.stack([(xx * 7 + i * 13) % 256, (yy * 5 + i * 29) % 256, ((xx + yy) * 3 + i * 7) % 256]).astype(float)
        out.append(np.clip(0.6 * base + 0.4 * rng.integers(0, 256, (3, 32, 32)), 0, 255).astype(np.uint8))
    return torch.from_numpy(np.stack(out))


def _jit(k: int, f: float) -> tuple:
    order = (k,) + tuple(j for j in range(4) if j != k)
    return tuple(float(v) for v in order) + tuple(f if j == k else NAN for j in range(4))


#: torchvision's operations: (step, max levels from the PIL path, mean levels from it); None: unbounded max.
TORCHVISION = {
    "shear-x-nearest": (("ShearX", (0.3,), "nearest"), None, 4.0),
    "shear-y-nearest": (("ShearY", (0.2,), "nearest"), None, 4.0),
    "shear-x-bilinear": (("ShearX", (-0.3,), "bilinear"), None, 4.0),
    "translate-x": (("TranslateX", (5.0,), "nearest"), 0, 0.0),
    "translate-y-bilinear": (("TranslateY", (-7.0,), "bilinear"), 0, 0.0),
    "rotate-nearest": (("Rotate", (20.0,), "nearest"), None, 4.0),
    "rotate-bilinear": (("Rotate", (-30.0,), "bilinear"), None, 4.0),
    "brightness": (("Brightness", (-0.6,), "nearest"), 0, 0.0),
    "color": (("Color", (0.7,), "nearest"), 1, 0.5),
    "contrast": (("Contrast", (-0.5,), "nearest"), 1, 0.6),
    "sharpness": (("Sharpness", (0.8,), "nearest"), 1, 0.3),
    "posterize": (("Posterize", (3.0,), "nearest"), 0, 0.0),
    "solarize": (("Solarize", (100.0,), "nearest"), 0, 0.0),
    "autocontrast": (("AutoContrast", (0.0,), "nearest"), 1, 0.01),
    "equalize": (("Equalize", (0.0,), "nearest"), 0, 0.0),
    "invert": (("Invert", (0.0,), "nearest"), 0, 0.0),
    "grayscale": (("Grayscale", (0.0,), "nearest"), 1, 0.6),
    "blur": (("GaussianBlur", (5, 5, 1.3), "nearest"), 0, 0.0),
    "jitter-brightness": (("ColorJitter", _jit(0, 1.3), "nearest"), 0, 0.0),
    "jitter-contrast": (("ColorJitter", _jit(1, 0.6), "nearest"), 1, 0.5),
    "jitter-saturation": (("ColorJitter", _jit(2, 1.6), "nearest"), 1, 0.5),
    "jitter-hue": (("ColorJitter", _jit(3, 0.15), "nearest"), 12, 1.0),
}

#: timm's operations with a tensor twin: (step, max levels, mean levels) from the PIL path.
TIMM = {
    "autocontrast": (("AutoContrast", (), "bilinear"), 1, 0.01),
    "equalize": (("Equalize", (), "bilinear"), 0, 0.0),
    "invert": (("Invert", (), "bilinear"), 0, 0.0),
    "solarize": (("Solarize", (128,), "bilinear"), 0, 0.0),
    "solarize-none": (("SolarizeIncreasing", (256,), "bilinear"), 0, 0.0),
    "solarize-add": (("SolarizeAdd", (100,), "bilinear"), 0, 0.0),
    "posterize": (("PosterizeIncreasing", (2,), "bilinear"), 0, 0.0),
    "posterize-8": (("PosterizeOriginal", (8,), "bilinear"), 0, 0.0),
    "color": (("ColorIncreasing", (1.6,), "bilinear"), 1, 0.5),
    "contrast": (("Contrast", (0.3,), "bilinear"), 1, 0.6),
    "brightness": (("Brightness", (1.5,), "bilinear"), 0, 0.0),
    "sharpness": (("Sharpness", (1.8,), "bilinear"), 1, 0.3),
    "desaturate": (("Desaturate", (0.6,), "bilinear"), 1, 0.5),
}


def _both(images, library, steps, fill):
    n = len(images)
    kw = dict(library=library, mean=None, std=None, fill=fill)
    pil = run_policy(images.clone(), [steps] * n, on_device=False, **kw)
    dev = run_policy(images.clone(), [steps] * n, on_device=True, **kw)
    return pil, dev


def _check(pil, dev, most, mean, what):
    d = (pil.int() - dev.int()).abs().float()
    assert d.mean() <= mean + 1e-9, (what, float(d.mean()))
    if most is not None:
        assert d.max() <= most, (what, float(d.max()))


@pytest.mark.parametrize("name", list(TORCHVISION))
def test_each_torchvision_operation_on_the_device_path_is_torchvisions_tensor_one(images, name):
    """Exactly torchvision's own tensor implementation on the uint8 tensor; within the measured difference of
    the PIL path."""
    step, most, mean = TORCHVISION[name]
    pil, dev = _both(images, "torchvision", [step], None)
    op, args, interp = step
    for j in range(len(images)):
        if op == "ColorJitter":
            cj = T.ColorJitter(0.5, 0.5, 0.5, 0.2)
            cj.get_params = lambda *a: (torch.tensor([int(v) for v in args[:4]]), *[None if math.isnan(v) else v for v in args[4:]])
            want = cj(images[j])
        elif op == "Grayscale":
            want = T.Grayscale(3)(images[j])
        elif op == "GaussianBlur":
            want = T.GaussianBlur(args[:2], sigma=(args[2], args[2]))(images[j])
        else:
            want = _apply_op(images[j], op, args[0], interpolation=InterpolationMode(interp), fill=None)
        assert torch.equal(dev[j], want), (name, j)
    _check(pil, dev, most, mean, name)


@pytest.mark.parametrize("name", list(TIMM))
def test_each_timm_operation_with_a_tensor_twin_is_within_its_measured_difference(images, name):
    step, most, mean = TIMM[name]
    pil, dev = _both(images, "timm", [step], (128, 128, 128))
    _check(pil, dev, most, mean, name)
    assert tensor_op(images[0], "timm", step, (128, 128, 128)) is not None


@pytest.mark.parametrize(
    ("library", "step"),
    [("torchvision", ("Rotate", (25.0,), "bicubic")), ("torchvision", ("ShearY", (-0.2,), "bicubic")),
     *[("timm", (op, (0.2,) if op.startswith("Shear") else (3.0,), "bilinear")) for op in TIMM_HOST_OPS]],
    ids=lambda v: v if isinstance(v, str) else f"{v[0]}-{v[2]}",
)  # fmt: skip
def test_operations_without_a_tensor_twin_go_to_the_host_and_are_the_pil_path(images, library, step):
    assert tensor_op(images[0], library, step, None) is None
    pil, dev = _both(images, library, [step], (128, 128, 128) if library == "timm" else None)
    assert torch.equal(pil, dev)


#: Operations within a level of the PIL path alone (no resampling, no hue).
GENTLE = ("Brightness", "Color", "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert",
          "Grayscale", "GaussianBlur", "SolarizeAdd", "ColorIncreasing", "ContrastIncreasing", "BrightnessIncreasing",
          "SharpnessIncreasing", "SolarizeIncreasing", "PosterizeIncreasing")  # fmt: skip


def _policies():
    from timm.data.auto_augment import rand_augment_transform

    simclr = [T.RandomApply([T.ColorJitter(0.8, 0.8, 0.8, 0.2)], p=0.8), T.RandomGrayscale(0.2),
              T.RandomApply([T.GaussianBlur(5, (0.1, 2.0))], p=0.5), T.RandomSolarize(128, p=0.2)]  # fmt: skip
    timm_ra = rand_augment_transform("rand-m9-mstd0.5-inc1", {"translate_const": 10, "img_mean": (124, 116, 104)})
    return {
        "randaugment": [T.RandAugment(num_ops=2, magnitude=9)],
        "autoaugment": [T.AutoAugment()],
        "randaugment-bilinear": [T.RandAugment(num_ops=1, magnitude=12, interpolation=InterpolationMode.BILINEAR)],
        "simclr-chain": simclr,
        "timm-rand": [timm_ra],
    }


@pytest.mark.parametrize("name", ["randaugment", "autoaugment", "randaugment-bilinear", "simclr-chain", "timm-rand"])
@pytest.mark.parametrize("normalised", [False, True], ids=["uint8", "normalised"])
def test_a_whole_policy_on_the_device_path_is_the_pil_paths_batch(images, name, normalised):
    """A batch of 64 planned images: the device path against the PIL path, mean under 1.5 levels (measured:
    RandAugment 0.03, AutoAugment 0.07, bilinear RandAugment 0.29, the SimCLR chain 0.48 (its hue), timm's
    rand-m9-mstd0.5-inc1 0.02; single pixels up to 142 apart where a level's difference meets a solarize
    threshold); an image with one operation that neither resamples nor shifts hue within 1 level;
    normalised batches alike."""
    steps = _policies()[name]
    pol = translate(T.Compose([T.RandomResizedCrop(32), *steps, T.PILToTensor()])).policy
    batch = images.repeat(4, 1, 1, 1)
    plans = plan(pol, seed=3, epoch=1, positions=np.arange(len(batch)))
    mean, std = (MEAN, STD) if normalised else (None, None)
    x = batch if not normalised else (batch.float() / 255 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    kw = dict(library=pol.library, mean=mean, std=std, fill=pol.fill)
    pil, dev = (run_policy(x.clone(), plans, on_device=d, **kw) for d in (False, True))
    if normalised:
        pil, dev = ((v * torch.tensor(STD).view(3, 1, 1) + torch.tensor(MEAN).view(3, 1, 1)) * 255 for v in (pil, dev))
    d = (pil.double() - dev.double()).abs()
    assert d.mean() < 1.5, (name, float(d.mean()))
    one = [j for j, p in enumerate(plans) if len([s for s in p if s[0] != "Identity"]) == 1 and p[0][0] in GENTLE]
    assert one and d[one].max() <= 1.0 + 1e-3, name  # a level apart compounds: a solarize after it may flip a pixel
    print(f"{name} {'normalised' if normalised else 'uint8'}: mean {float(d.mean()):.3f} levels, max {float(d.max()):.0f}")
    assert not torch.equal(pil, x)  # the batch was augmented


def test_cpu_batches_keep_the_pil_path_by_default(images):
    """On CPU tensors the default is the PIL path (exactly the DataLoader's pipeline), not the tensor one."""
    steps = [("Contrast", (-0.5,), "nearest"), ("Rotate", (20.0,), "bilinear")]
    got = run_policy(images.clone(), [steps] * 16, library="torchvision", mean=None, std=None, fill=None)
    pil, dev = _both(images, "torchvision", steps, None)
    assert torch.equal(got, pil) and not torch.equal(got, dev)


@pytest.mark.gpu
def test_cuda_batches_run_the_tensor_path_on_the_device(images):
    """On CUDA: the result stays on the device and is the tensor path's on CPU tensors (the same calls;
    within 1 level for float rounding of the GPU kernels), with host fallbacks for bicubic operations."""
    pol = translate(T.Compose([T.RandomResizedCrop(32), *_policies()["simclr-chain"], T.PILToTensor()])).policy
    batch = images.repeat(4, 1, 1, 1)
    plans = plan(pol, seed=3, epoch=1, positions=np.arange(len(batch)))
    plans[0] = plans[0] + [("Rotate", (25.0,), "bicubic")]
    want = run_policy(batch.clone(), plans, library="torchvision", mean=None, std=None, fill=None, on_device=True)
    got = run_policy(batch.clone().cuda(), plans, library="torchvision", mean=None, std=None, fill=None)
    assert got.is_cuda and (got.cpu().int() - want.int()).abs().max() <= 1
