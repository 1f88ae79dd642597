"""Augmentations of a finished batch, on its device: auto-augment operations, colour jitter and grayscale, and ``RandomErasing`` rectangles.

What each image gets is decided by :mod:`fastload.augment` (pure functions of seed, epoch
and position, like the crops); here it is only carried out, on the stream the batch is
made on, with torchvision's tensor formulas (``adjust_brightness``/``contrast``/``saturation``
blends clamped to [0, 1], its grayscale weights, ``adjust_hue``). The auto-augment and chain
operations run on the PIL image on the CPU (exactly a DataLoader worker's pipeline, and faster
there), and on the uint8 tensor on any other device (torchvision's tensor functions, within the
differences ``tests/test_device_ops.py`` measures), the few without a tensor twin on the host.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import torch


def _gray(x: torch.Tensor) -> torch.Tensor:
    r, g, b = x.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).unsqueeze(-3)


def _apply(op: int, x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    if op == 0:  # brightness: blend with black
        return (f * x).clamp(0, 1)
    if op == 1:  # contrast: blend with the mean of the grayscale image
        return (f * x + (1 - f) * _gray(x).mean(dim=(-3, -2, -1), keepdim=True)).clamp(0, 1)
    if op == 2:  # saturation: blend with the grayscale image
        return (f * x + (1 - f) * _gray(x)).clamp(0, 1)
    from torchvision.transforms.functional import adjust_hue  # hue: through HSV, image by image

    return torch.stack([adjust_hue(x[j], float(f[j])) for j in range(len(x))])


def color(
    images: torch.Tensor, order: np.ndarray, factors: np.ndarray, gray: np.ndarray, *,
    mean: Sequence[float] | None, std: Sequence[float] | None,
) -> torch.Tensor:  # fmt: skip
    """Jitter (each image's parts in its own ``order``) and grayscale NCHW ``images``, in place.

    ``images`` are normalised with ``mean``/``std`` (or uint8 when they are None): the colour
    operations work on pixel values in [0, 1], as torchvision's do before ``Normalize``.
    """
    if np.isnan(factors).all() and not gray.any():
        return images
    dev = images.device
    if mean is None:
        x = images.float() / 255.0
    else:
        m = torch.tensor(mean, device=dev).view(1, 3, 1, 1)
        s = torch.tensor(std, device=dev).view(1, 3, 1, 1)
        x = images.float() * s + m
    for k in range(4):
        for op in range(4):
            sel = np.flatnonzero((order[:, k] == op) & ~np.isnan(factors[:, op]))
            if len(sel):
                idx = torch.as_tensor(sel, device=dev)
                f = torch.as_tensor(factors[sel, op], dtype=torch.float32, device=dev).view(-1, 1, 1, 1)
                x[idx] = _apply(op, x[idx], f)
    if gray.any():
        idx = torch.as_tensor(np.flatnonzero(gray), device=dev)
        x[idx] = _gray(x[idx]).expand(-1, 3, -1, -1)
    if mean is None:
        images.copy_((x * 255.0).round_().clamp_(0, 255))
    else:
        images.copy_((x - m) / s)
    return images


def _trivial_op(img: Any, name: str, m: float, interpolation: Any, fill: Any) -> Any:
    """One TrivialAugmentWide operation on a CHW uint8 tensor or a PIL image, as torchvision applies it."""
    import torchvision.transforms.functional as F

    if name == "ShearX":
        return F.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=[math.degrees(math.atan(m)), 0.0],
                        interpolation=interpolation, fill=fill, center=[0, 0])  # fmt: skip
    if name == "ShearY":
        return F.affine(img, angle=0.0, translate=[0, 0], scale=1.0, shear=[0.0, math.degrees(math.atan(m))],
                        interpolation=interpolation, fill=fill, center=[0, 0])  # fmt: skip
    if name == "TranslateX":
        return F.affine(img, angle=0.0, translate=[int(m), 0], scale=1.0, shear=[0.0, 0.0], interpolation=interpolation, fill=fill)
    if name == "TranslateY":
        return F.affine(img, angle=0.0, translate=[0, int(m)], scale=1.0, shear=[0.0, 0.0], interpolation=interpolation, fill=fill)
    if name == "Rotate":
        return F.rotate(img, m, interpolation=interpolation, fill=fill)
    simple = {"Brightness": F.adjust_brightness, "Color": F.adjust_saturation, "Contrast": F.adjust_contrast,
              "Sharpness": F.adjust_sharpness}  # fmt: skip
    if name in simple:
        return simple[name](img, 1.0 + m)
    if name == "Posterize":
        return F.posterize(img, int(m))
    if name == "Solarize":
        return F.solarize(img, m)
    if name == "AutoContrast":
        return F.autocontrast(img)
    if name == "Equalize":
        return F.equalize(img)
    if name == "Invert":
        return F.invert(img)
    return img  # Identity


def trivial(
    images: torch.Tensor, ops: np.ndarray, mags: np.ndarray, *, mean: Sequence[float] | None,
    std: Sequence[float] | None, interpolation: str, fill: Sequence[float] | None,
) -> torch.Tensor:  # fmt: skip
    """TrivialAugmentWide on each image of NCHW ``images``, in place, on its uint8 pixels (as before ToTensor)."""
    from torchvision.transforms import InterpolationMode

    from .augment import TRIVIAL_OPS

    work = np.flatnonzero(ops != 0)  # Identity leaves the image
    if not len(work):
        return images
    if images.device.type == "cpu" and images.dtype in (torch.float32, torch.float16, torch.uint8):
        _trivial_numpy(images.numpy(), work, ops, mags, mean=mean, std=std, mode=InterpolationMode(interpolation), fill=fill)
        return images
    dev = images.device
    if mean is not None:
        m = torch.tensor(mean, device=dev).view(3, 1, 1)
        s = torch.tensor(std, device=dev).view(3, 1, 1)
    mode = InterpolationMode(interpolation)
    filled = None if fill is None else [float(v) for v in (fill if len(fill) == 3 else list(fill) * 3)]
    on_cpu = images.device.type == "cpu"
    for k in work.tolist():
        x = images[k]
        u8 = x if mean is None else ((x.float() * s + m) * 255.0).round_().clamp_(0, 255).to(torch.uint8)
        name, mag = TRIVIAL_OPS[int(ops[k])][0], float(mags[k])
        if on_cpu or interpolation == "bicubic":  # PIL's single-threaded C, as a DataLoader worker runs it on
            # the PIL image (torch's small per-image kernels beside DALI's threads spin in its intra-op pool: 50x
            # slower measured; torch's tensor affine has no bicubic)
            out = _pil_op(u8.cpu(), name, mag, mode, filled).to(images.device)
        else:
            out = _trivial_op(u8, name, mag, mode, filled)
        images[k] = out if mean is None else ((out.float() / 255.0 - m) / s).to(images.dtype)
    return images


def _trivial_numpy(arr: np.ndarray, work: np.ndarray, ops: np.ndarray, mags: np.ndarray, *, mean, std, mode, fill) -> None:
    """:func:`trivial` on the CPU, in NumPy and PIL: each image's uint8 pixels, its operation on the PIL
    image (as a DataLoader worker runs TrivialAugmentWide), written back normalised.

    Neither NumPy nor PIL uses a thread pool here: torch's small per-image kernels beside DALI's
    threads spun in its intra-op pool, 50x slower (measured on 2 cores).
    """
    from PIL import Image

    from .augment import TRIVIAL_OPS

    if mean is not None:
        m = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        s = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    pil_fill = None if fill is None else [int(round(v)) for v in (fill if len(fill) == 3 else list(fill) * 3)]
    for k in work.tolist():
        x = arr[k]  # CHW (a strided view for channels_last)
        u8 = x if mean is None else np.clip(np.rint((x * s + m) * 255.0), 0, 255).astype(np.uint8)
        pil = Image.fromarray(np.ascontiguousarray(u8.transpose(1, 2, 0)))
        out = np.asarray(_trivial_op(pil, TRIVIAL_OPS[int(ops[k])][0], float(mags[k]), mode, pil_fill)).transpose(2, 0, 1)
        x[...] = out if mean is None else (out.astype(np.float32) * (1.0 / 255.0) - m) / s


def _pil_op(u8: torch.Tensor, name: str, m: float, mode: Any, fill: Any) -> torch.Tensor:
    """:func:`_trivial_op` on the PIL image of a CHW uint8 tensor, back as CHW uint8."""
    from PIL import Image

    pil = Image.fromarray(u8.permute(1, 2, 0).contiguous().numpy())
    pil_fill = None if fill is None else [int(round(v)) for v in fill]
    out = _trivial_op(pil, name, m, mode, pil_fill)
    return torch.from_numpy(np.array(out, dtype=np.uint8)).permute(2, 0, 1)


#: PIL's resampling codes of the policies' interpolation names (timm passes PIL's codes).
_PIL_FILTERS = {"nearest": 0, "bilinear": 2, "bicubic": 3}


def _policy_op(pil: Any, library: str, step: tuple, fill: Any) -> Any:
    """One planned operation ``(name, args, interpolation)`` on a PIL image, by the library's own function."""
    name, args, interp = step
    if library == "timm":
        from timm.data.auto_augment import NAME_TO_OP

        return NAME_TO_OP[name](pil, *args, fillcolor=fill, resample=_PIL_FILTERS[interp])
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode

    if name == "Grayscale":
        return F.rgb_to_grayscale(pil, num_output_channels=3)
    if name == "GaussianBlur":
        sigma = float(np.float32(args[2]))  # torchvision draws it as a float32 (uniform_ on a tensor)
        return F.gaussian_blur(pil, [int(args[0]), int(args[1])], [sigma, sigma])
    if name == "ColorJitter":
        return _jitter_parts(pil, args)
    return _trivial_op(pil, name, float(args[0]), InterpolationMode(interp), fill)


def _jitter_parts(img: Any, args: tuple) -> Any:
    """``ColorJitter.forward`` with its draws given: ``args`` is the order of the four parts, then their
    factors (NaN: off), run by torchvision's functional calls on a PIL image or a uint8 tensor."""
    import torchvision.transforms.functional as F

    calls = (F.adjust_brightness, F.adjust_contrast, F.adjust_saturation, F.adjust_hue)
    for k in args[:4]:
        f = args[4 + int(k)]
        if not math.isnan(f):
            img = calls[int(k)](img, f)
    return img


#: timm's operations that torchvision's tensor functions run with timm's (PIL's) semantics, by the call.
_TIMM_TENSOR = {
    "AutoContrast": "autocontrast", "Equalize": "equalize", "Invert": "invert", "Solarize": "solarize",
    "SolarizeIncreasing": "solarize", "SolarizeAdd": "solarize_add", "Posterize": "posterize",
    "PosterizeIncreasing": "posterize", "PosterizeOriginal": "posterize", "Color": "adjust_saturation",
    "ColorIncreasing": "adjust_saturation", "Desaturate": "adjust_saturation", "Contrast": "adjust_contrast",
    "ContrastIncreasing": "adjust_contrast", "Brightness": "adjust_brightness", "BrightnessIncreasing": "adjust_brightness",
    "Sharpness": "adjust_sharpness", "SharpnessIncreasing": "adjust_sharpness",
}  # fmt: skip
#: timm's operations left to PIL on the host: its affine transforms (PIL's own coordinate rounding and
#: float translations) and its blur (PIL's box-filter approximation of a Gaussian) have no tensor twin.
TIMM_HOST_OPS = ("Rotate", "ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel", "GaussianBlur")
_GEOMETRIC = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")


def tensor_op(x: torch.Tensor, library: str, step: tuple, fill: Any) -> torch.Tensor | None:
    """One planned operation on a CHW uint8 tensor on any device, by torchvision's tensor functions; None
    where no tensor function has the operation's semantics (bicubic geometric operations, timm's
    :data:`TIMM_HOST_OPS`), which then run on the PIL image."""
    import torchvision.transforms.functional as F
    from torchvision.transforms import InterpolationMode

    name, args, interp = step
    if library == "timm":
        call = _TIMM_TENSOR.get(name)
        if call is None:
            return None
        if call == "solarize":  # PIL inverts pixels >= the threshold; 256 inverts none
            return x if args[0] > 255 else F.solarize(x, float(args[0]))
        if call == "solarize_add":  # timm's table: pixels below 128 get `add`, clipped at 255
            return torch.where(x < 128, (x.to(torch.int16) + int(args[0])).clamp_(max=255).to(torch.uint8), x)
        if call == "posterize":
            return x if args[0] >= 8 else F.posterize(x, int(args[0]))
        if call in ("autocontrast", "equalize", "invert"):
            return getattr(F, call)(x)
        if name == "Desaturate":  # timm enhances Color by 1 - factor, clamped to [0, 1]
            return F.adjust_saturation(x, min(1.0, max(0.0, 1.0 - float(args[0]))))
        return getattr(F, call)(x, float(args[0]))
    if name == "Grayscale":
        return F.rgb_to_grayscale(x, num_output_channels=3)
    if name == "GaussianBlur":  # torchvision's PIL path runs this very tensor kernel
        sigma = float(np.float32(args[2]))
        return F.gaussian_blur(x, [int(args[0]), int(args[1])], [sigma, sigma])
    if name == "ColorJitter":
        return _jitter_parts(x, args)
    if name in _GEOMETRIC and interp == "bicubic":  # torch's tensor affine has no bicubic
        return None
    return _trivial_op(x, name, float(args[0]), InterpolationMode(interp), None if fill is None else [float(v) for v in fill])


def policy(
    images: torch.Tensor, plans: list, *, library: str, mean: Sequence[float] | None, std: Sequence[float] | None,
    fill: Sequence[float] | None, on_device: bool | None = None,
) -> torch.Tensor:  # fmt: skip
    """Each image's planned operations (:func:`fastload.augment.policies.plan`) on its uint8 pixels, in place.

    On the CPU (``on_device`` False, the default there) every operation runs on the PIL image,
    by torchvision's ``_apply_op`` functions or timm's ``NAME_TO_OP``, as a DataLoader worker
    runs RandAugment/AutoAugment before ``ToTensor``. On another device (``on_device`` True, the
    default there) they run on the image's uint8 tensor where it is, by :func:`tensor_op`; an
    operation without a tensor twin takes that one image to the host and back.
    """
    work = [k for k, steps in enumerate(plans) if any(s[0] != "Identity" for s in steps)]
    if not work:
        return images
    three = None if fill is None else tuple(int(round(v)) for v in (fill if len(fill) == 3 else list(fill) * 3))
    pil_fill = ((0, 0, 0) if three is None else three) if library == "timm" else (None if three is None else list(three))
    if on_device if on_device is not None else images.device.type != "cpu":
        _policy_tensors(images, work, plans, library=library, mean=mean, std=std, fill=pil_fill)
        return images
    from PIL import Image

    if mean is not None:
        m = np.asarray(mean, dtype=np.float32).reshape(3, 1, 1)
        s = np.asarray(std, dtype=np.float32).reshape(3, 1, 1)
    host = images.device.type == "cpu" and images.dtype in (torch.float32, torch.float16, torch.uint8)
    arr = images.numpy() if host else None
    for k in work:
        x = arr[k] if host else images[k].float().cpu().numpy()
        u8 = x if mean is None else np.clip(np.rint((x * s + m) * 255.0), 0, 255).astype(np.uint8)
        pil = Image.fromarray(np.ascontiguousarray(u8.astype(np.uint8).transpose(1, 2, 0)))
        for step in plans[k]:
            pil = _policy_op(pil, library, step, pil_fill)
        out = np.asarray(pil).transpose(2, 0, 1)
        out = out if mean is None else (out.astype(np.float32) * (1.0 / 255.0) - m) / s
        if host:
            x[...] = out
        else:
            images[k] = torch.from_numpy(np.ascontiguousarray(out)).to(images.device, images.dtype)
    return images


def _policy_tensors(images: torch.Tensor, work: list, plans: list, *, library: str, mean, std, fill) -> None:
    """:func:`policy` on the images' own device: each image's uint8 tensor through :func:`tensor_op`."""
    from PIL import Image

    dev = images.device
    if mean is not None:
        m = torch.tensor(mean, device=dev).view(3, 1, 1)
        s = torch.tensor(std, device=dev).view(3, 1, 1)
    for k in work:
        x = images[k]
        u8 = x if mean is None else ((x.float() * s + m) * 255.0).round_().clamp_(0, 255).to(torch.uint8)
        for step in plans[k]:
            out = tensor_op(u8, library, step, fill)
            if out is None:  # on the host, by the library's own PIL function
                pil = Image.fromarray(u8.permute(1, 2, 0).contiguous().cpu().numpy())
                out = torch.from_numpy(np.array(_policy_op(pil, library, step, fill), dtype=np.uint8)).permute(2, 0, 1).to(dev)
            u8 = out
        images[k] = u8 if mean is None else ((u8.float() / 255.0 - m) / s).to(images.dtype)


def erase_noisy(images: torch.Tensor, rects: np.ndarray, seeds: np.ndarray, *, noise: str) -> torch.Tensor:
    """Fill ``rects`` (``[n, k, 4]``) of NCHW ``images`` with standard normal noise, in place.

    ``noise="pixel"``: a draw per pixel and channel (torchvision's ``value="random"``, timm's
    ``"pixel"``); ``"channel"``: one per channel and rectangle (timm's ``"rand"``). Each image's
    noise comes from its own generator seeded with ``seeds[k]`` (NumPy's on the CPU, torch's on
    the batch's device): the same seed gives the same noise on the same kind of device.
    """
    hit = np.flatnonzero((rects[:, :, 2] > 0).any(axis=1))
    host = images.device.type == "cpu" and images.dtype in (torch.float32, torch.float16)
    arr = images.numpy() if host else None
    c = images.shape[1]
    for k in hit.tolist():
        gen = np.random.default_rng(int(seeds[k])) if host else torch.Generator(images.device).manual_seed(int(seeds[k]))
        for t, left, h, w in (tuple(int(v) for v in r) for r in rects[k]):
            if h == 0:
                continue
            shape = (c, h, w) if noise == "pixel" else (c, 1, 1)
            if host:
                arr[k, :, t : t + h, left : left + w] = gen.standard_normal(shape, dtype=np.float32)
            else:
                z = torch.randn(shape, generator=gen, device=images.device, dtype=torch.float32)
                images[k, :, t : t + h, left : left + w] = z.to(images.dtype)
    return images


def erase(images: torch.Tensor, rects: np.ndarray, value: Sequence[float]) -> torch.Tensor:
    """Fill ``rects`` (``[n, 4]`` top, left, h, w; ``h == 0``: none) of NCHW ``images`` with ``value``, in place.

    ``[n, k, 4]`` rectangles (timm's ``count``) fill each image's ``k`` rectangles in turn.
    """
    if rects.ndim == 3:
        for b in range(rects.shape[1]):
            erase(images, rects[:, b], value)
        return images
    if not (rects[:, 2] > 0).any():
        return images
    if images.device.type == "cpu" and images.dtype in (torch.float32, torch.float16, torch.uint8):
        arr, fill_np = images.numpy(), np.asarray(list(value), dtype=images.numpy().dtype).reshape(-1, 1, 1)
        for k in np.flatnonzero(rects[:, 2] > 0).tolist():  # NumPy: no thread pool (see _trivial_numpy)
            t, left, h, w = (int(v) for v in rects[k])
            arr[k, :, t : t + h, left : left + w] = fill_np
        return images
    fill = torch.tensor(list(value), dtype=images.dtype, device=images.device).reshape(-1, 1, 1)
    for k in np.flatnonzero(rects[:, 2] > 0).tolist():
        t, left, h, w = (int(v) for v in rects[k])
        images[k, :, t : t + h, left : left + w] = fill
    return images
