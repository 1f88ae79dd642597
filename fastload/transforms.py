"""Translate a torchvision transform into FastLoader settings.

:func:`translate` reads a ``transforms.Compose`` (or a ``transforms.v2.Compose``, an
``nn.Sequential``, or one transform) of a torchvision image dataset and returns the
:class:`fastload.Augment` settings that produce the same batches, or
raises :class:`~fastload.errors.ConfigError` naming the one step it cannot reproduce
and what to do. It reads the transform objects without calling the steps it translates
(:mod:`fastload.tvkinds` calls a wrapper or a multi-view transform once on a probe image, its
random state restored, to tell what it is), and imports torchvision only when called
(``import fastload`` works without it).

The input is what torchvision's ``ImageFolder`` loader returns: an RGB PIL image.
Two forms are understood, with the transforms of ``torchvision.transforms`` and of
``torchvision.transforms.v2`` alike (matched by exact class: a subclass may change
what its parent does, so it is refused):

* **training**: ``RandomResizedCrop(size, scale, ratio)`` with an optional
  ``RandomHorizontalFlip(p)`` before or after it -> ``train=True, crop, scale, ratio,
  flip`` (``flip=0.0`` without a flip);
* **evaluation**: ``Resize(size)`` then ``CenterCrop(crop)`` -> ``train=False, resize,
  crop``. ``size`` is an int (or a one-element list): the shorter side. A ``(h, w)``
  pair is refused, even a square one: it stretches every image to ``h x w``, while
  FastLoader keeps the aspect ratio. ``max_size`` must be None, and the shorter side
  at least the crop (torchvision would pad with black).
* **RandomCrop** (training): ``RandomCrop(size, padding, pad_if_needed, fill, padding_mode)``
  with an optional flip -> ``train=True, crop=size, pad_crop=PadCrop(...)``: a window at uniform
  offsets of the padded image (any padding mode), not resized. ``fill`` must be a whole pixel
  value of the image where the step stands (after ``ToTensor()``, ``1.0`` is 255).

Given ``image=(h, w, channels)`` (every image of the dataset that size, as an array dataset's:
CIFAR-10, MNIST...), a transform without a crop keeps square images whole (``train=False,
resize=crop=h``, nearest: nothing is resampled), ``CenterCrop`` needs no ``Resize`` before it,
and ``channels=1`` (a grayscale dataset) gives one-channel batches.

Around them, in any order torchvision itself accepts: exactly one conversion from the
PIL image to a tensor (``ToTensor()``: float 0..1; ``PILToTensor()`` / v2
``ToImage()``: uint8 0..255), dtype conversions (``ConvertImageDtype(dtype)``, v2
``ToDtype(dtype, scale=...)``; v2 ones before the tensor conversion do nothing, as in
torchvision) and ``Normalize(mean, std)`` (any number; they compose). The result is
``mean``/``std`` in FastLoader's 0..1 units: ``ToTensor()`` alone is ``mean=(0, 0, 0),
std=(1, 1, 1)`` (float 0..1); ``PILToTensor()`` alone is ``mean=None, std=None`` (uint8
0..255); ``ToDtype(torch.float32, scale=False)`` after ``ToImage()`` is float 0..255,
``std=(1/255,) * 3``. ``dtype`` is the float type of the last conversion
(``torch.float32``, ``float16`` or ``bfloat16``); for uint8 output it is
``torch.float32``, which FastLoader ignores then. Crops, resizes and flips commute with
normalisation (bilinear weights sum to one), so their place relative to the tensor
conversion and ``Normalize`` does not matter. No-ops are accepted: ``v2.Identity``,
``nn.Identity``, ``v2.ToPureTensor``, ``v2.RGB`` (the images already are RGB).

timm's ``RandomResizedCropAndInterpolation``, ``MaybeToTensor``, ``MaybePILToTensor`` and
``ToNumpy`` (what ``timm.data.create_transform`` builds) are read as torchvision's
``RandomResizedCrop``, ``ToTensor`` and ``PILToTensor``.

Training augmentations after the crop become the Augment's ``jitter`` (``ColorJitter``,
``RandomApply([ColorJitter], p)``), ``grayscale``, ``trivial`` (``TrivialAugmentWide``),
``policy`` (torchvision's and timm's ``RandAugment``/``AutoAugment``; ``RandomApply``,
``RandomChoice``, ``RandomOrder`` of colour operations, ``GaussianBlur``, ``RandomSolarize``
and the like, read by :mod:`fastload.augment.readaug`) and ``erasing`` (``RandomErasing`` after the last
``Normalize``); colour steps in another order than policy, jitter, grayscale: one chain, in order.

A multi-view transform (one returning a list of views: MoCo's ``TwoCropsTransform``, SimCLR's,
DINO's multi-crop), or a list of one transform per view, becomes a
:class:`fastload.multiview.MultiView`: each view's transform found and translated on its own
(:func:`fastload.multiview.read_views`). MoCo's and DINO's own ``GaussianBlur``/``Solarize``/
``Solarization`` classes are chain operations (:mod:`fastload.augment.recipes`, checked on a probe);
any other unknown class is refused by its name (an ``<... object at 0x...>`` inside a step's repr
is shown as ``Class()``).

Interpolation: ``NEAREST``, ``BILINEAR`` (the default), ``BICUBIC`` and ``LANCZOS`` (or PIL's
codes for them, as timm passes), kept as ``Augment.interpolation``: PIL's filter on the CPU
training path, DALI's ``INTERP_NN`` and antialiased ``INTERP_LINEAR``/``CUBIC``/``LANCZOS3``
resize elsewhere (nearest: the same pixels as torchvision's; the others within one level of
torchvision's PIL path in evaluation, two in training, measured). BOX, HAMMING and
NEAREST_EXACT are refused. ``antialias=False`` (or
None) is refused where torchvision honours it, on a tensor; on a PIL image torchvision
ignores it (PIL always antialiases), so it is accepted there.
"""

from __future__ import annotations

import itertools
import math
import operator
import re
from typing import TYPE_CHECKING, Any

from .augment import readaug, recipes
from .errors import ConfigError, printable
from .tvkinds import Kinds, flatten, views

if TYPE_CHECKING:  # pragma: no cover
    from .augment.settings import Augment
    from .multiview import MultiView

__all__ = ["translate"]

#: Training-form defaults that the evaluation form returns for the settings it does not use.
_DEFAULT_SCALE = (0.08, 1.0)
_DEFAULT_RATIO = (3 / 4, 4 / 3)

_NO_EQUIVALENT = "remove it from the dataset's transform, or apply it to the batch on the GPU after the loader"
_TRAIN_HINT = "RandomResizedCrop(N) [+ RandomHorizontalFlip()] for training, or Resize(S) + CenterCrop(N) for evaluation"
#: PIL's resampling codes, which torchvision also accepts as ``interpolation``.
_PIL_CODES = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic", 4: "box", 5: "hamming"}


#: An object shown by ``object.__repr__`` inside another's repr (``<moco.loader.GaussianBlur object at 0x7f...>``).
_ADDRESS = re.compile(r"<((?:[\w.]|<locals>)+) object at 0x[0-9a-fA-F]+>")  # (a class made in a function too)


def _name(t: Any) -> str:
    """``transforms.v2.Resize(size=[256], ...)``: where the class comes from, and its repr, on one line."""
    cls = type(t)
    mod = cls.__module__ or ""
    if mod.startswith("torchvision.transforms.v2"):
        prefix = "transforms.v2."
    elif mod.startswith("torchvision.transforms"):
        prefix = "transforms."
    elif mod.startswith("torch.nn"):
        prefix = "nn."
    else:
        prefix = f"{mod}." if mod and mod != "builtins" else ""
    try:
        text = repr(t)
    except Exception:  # noqa: BLE001 - a user's object whose repr fails is still named
        text = f"{cls.__qualname__}(...)"
    if cls.__repr__ is object.__repr__:  # "<presets.X object at 0x7f...>" says nothing more than the class
        text = f"{cls.__qualname__}()"
    text = _ADDRESS.sub(lambda m: f"{m.group(1).rsplit('.', 1)[-1]}()", text)  # inner objects (RandomApply's) alike
    text = printable(re.sub(r"\s+", " ", text)).strip()
    if len(text) > 160:
        text = text[:157] + "..."
    return prefix + text


class _Step:
    """One transform of the flattened list, with its position for messages."""

    def __init__(self, t: Any, index: int, total: int) -> None:
        self.t = t
        self.where = f"{_name(t)} (step {index + 1} of {total} of the transform)"

    def fail(self, why: str) -> ConfigError:
        return ConfigError(f"{self.where}: {why}")


def _index(step: _Step, v: Any, value: Any, what: str) -> int:
    """``v`` (one side of ``value``) as an int through ``operator.index``; a bool or a float is a ConfigError."""
    try:
        if isinstance(v, bool):
            raise TypeError
        return operator.index(v)
    except TypeError:
        raise step.fail(f"{what} {value!r} is not an integer number of pixels") from None


def _side(step: _Step, value: Any, what: str, *, allow_pair: bool) -> int:
    """A square size as an int: ``224``, ``[224]`` or (``allow_pair``) ``(224, 224)``."""
    v = value
    if isinstance(v, (list, tuple)):
        if len(v) == 1:
            v = v[0]
        elif len(v) == 2 and allow_pair:
            for side in v:  # each side an integer, not only the one kept: (24, 24.0) is no size either
                _index(step, side, value, what)
            if v[0] != v[1]:
                raise step.fail(
                    f"{what} {tuple(v)!r} is not square; FastLoader produces square {what}s: use one size, e.g. {v[0]!r}"
                )
            v = v[0]
        else:
            raise step.fail(f"{what} {v!r} is not one size")
    n = _index(step, v, value, what)
    if n < 1:
        raise step.fail(f"{what} {value!r} must be at least 1 pixel")
    return n


def _interpolation(step: _Step, t: Any, tv: Kinds, tensor: bool) -> str:
    """The step's resampling filter, one of fastload.augment.settings.INTERPOLATIONS, or a ConfigError."""
    mode = getattr(t, "interpolation", "bilinear")
    if isinstance(mode, (tuple, list)):  # timm's interpolation="random"
        raise step.fail(
            "a random choice of interpolation: FastLoader resizes every image with one filter; "
            "use interpolation='bilinear' or 'bicubic'"
        )
    if isinstance(mode, tv.mode):
        name = mode.value
    elif isinstance(mode, str):
        name = mode.lower()
    elif isinstance(mode, int) and not isinstance(mode, bool):
        name = _PIL_CODES.get(int(mode), str(mode))
    else:
        name = repr(mode)
    if name not in ("nearest", "bilinear", "bicubic", "lanczos"):
        raise step.fail(
            f"interpolation {name.upper()} is not one FastLoader resizes with as torchvision does (NEAREST, BILINEAR, "
            "BICUBIC, LANCZOS: PIL's filter on the CPU, DALI's on the GPU); use one of those"
        )
    if tensor and name != "nearest" and getattr(t, "antialias", True) is not True:
        raise step.fail(
            f"antialias={getattr(t, 'antialias', None)!r} on a tensor image (not antialiased): FastLoader always "
            "resizes with antialiasing; use antialias=True (the default)"
        )
    return name


def _pair(step: _Step, value: Any, what: str, *, lo: float, hi: float | None) -> tuple[float, float]:
    try:
        a, b = (float(x) for x in value)
    except (TypeError, ValueError):
        raise step.fail(f"{what} {value!r} is not a pair of numbers (min, max)") from None
    if not (math.isfinite(a) and math.isfinite(b)) or a > b or a < lo or (hi is not None and b > hi) or b <= 0:
        bound = f"{lo} <= min <= max" + (f" <= {hi}" if hi is not None else "") + ", max > 0"
        raise step.fail(f"{what} {value!r} must satisfy {bound}")
    return a, b


def _triple(step: _Step, value: Any, what: str, torch: Any) -> list[float]:
    try:
        vals = [float(x) for x in torch.as_tensor(value, dtype=torch.float64).reshape(-1).tolist()]
    except (TypeError, ValueError, RuntimeError):
        raise step.fail(f"{what} {value!r} is not numbers") from None
    if len(vals) == 1:
        vals = vals * 3
    if len(vals) != 3 or not all(math.isfinite(v) for v in vals):
        raise step.fail(f"{what} {value!r} must be 1 or 3 finite numbers (the images are RGB)")
    return vals


class _State:
    """What the image is after each step: PIL or tensor, its dtype, and its values.

    Values are ``(u - M) / S`` per channel, with ``u`` the pixel in 0..1: a uint8
    tensor is ``M = 0, S = 1/255``; ``ToTensor()`` gives ``M = 0, S = 1``.
    """

    def __init__(self) -> None:
        self.tensor = False
        self.image_type = False  # a tv_tensors.Image (v2 ToImage) rather than a plain tensor
        self.dtype: Any = None
        self.M = [0.0, 0.0, 0.0]
        self.S = [1.0, 1.0, 1.0]
        self.converted_by: _Step | None = None
        self.erasing: tuple[Any, _Step] | None = None  # (fastload.augment.settings.Erasing, its step)
        self.jitter: tuple[Any, _Step] | None = None  # (fastload.augment.settings.Jitter, its step)
        self.gray: tuple[float, _Step] | None = None  # (RandomGrayscale's p, its step)
        self.trivial: tuple[Any, _Step] | None = None  # (fastload.augment.settings.Trivial, its step)
        self.policy: tuple[Any, _Step] | None = None  # (fastload.augment.settings.Policy, its step)
        self.crop: int | None = None  # the training crop's side (set before each step)
        self.form: str | None = None  # the geometric form so far (set before each step)
        self.ordered = False  # jitter and grayscale are stages of the chain policy, in the user's order
        self.channels = 3  # the image's channels: 1 for a grayscale dataset's, until a Grayscale(3)


def _convert_dtype(step: _Step, st: _State, dtype: Any, scale: bool, tv: Kinds) -> None:
    torch = tv.torch
    if dtype is None or dtype == st.dtype:
        return
    floats = (torch.float32, torch.float16, torch.bfloat16)
    if dtype not in floats + (torch.uint8,):
        raise step.fail(
            f"dtype {dtype} is not one FastLoader produces (torch.float32, torch.float16, torch.bfloat16, or uint8 "
            "with PILToTensor alone); convert the batch after the loader"
        )
    if dtype == torch.uint8:  # float -> uint8
        raise step.fail(
            "converting a float image back to uint8 has no FastLoader equivalent; for uint8 batches use "
            "PILToTensor() (or v2.ToImage()) without a float conversion"
        )
    if st.dtype == torch.uint8 and scale:
        st.S = [s * 255.0 for s in st.S]
    st.dtype = dtype


class _Shape:
    """What the geometric steps decided: the form and its sizes, the flip, and the steps that set them."""

    def __init__(self) -> None:
        self.form: str | None = None  # None -> "train" (after RandomResizedCrop) | "resized" (after Resize) -> "eval"
        self.crop: int | None = None
        self.resize: int | None = None
        self.scale, self.ratio = _DEFAULT_SCALE, _DEFAULT_RATIO
        self.flip = 0.0
        self.flip_step: _Step | None = None
        self.shape_step: _Step | None = None  # the RandomResizedCrop or Resize that set the form
        self.interpolation = "bilinear"
        self.pad_crop: Any = None  # a fastload.augment.padcrop.PadCrop (RandomCrop), or None
        self.image: tuple[int, int, int] | None = None  # (height, width, channels) every image has, if known

    def random_crop(self, step: _Step, t: Any, tv: Kinds, st: _State) -> None:
        """torchvision's ``RandomCrop``: a window at uniform offsets of the padded image, never resized."""
        from .augment.padcrop import PAD_MODES, PadCrop

        if self.form is not None:
            raise step.fail(_second_crop(self.form, self.shape_step))
        crop = _side(step, t.size, "crop size", allow_pair=True)
        mode = getattr(t, "padding_mode", "constant")
        if mode not in PAD_MODES:
            raise step.fail(f"padding_mode {mode!r} is not one of {', '.join(PAD_MODES)}")
        pad = _padding(step, t.padding, v2=type(t).__module__.startswith("torchvision.transforms.v2"))
        used = mode == "constant" and (any(pad) or bool(t.pad_if_needed))  # torchvision reads fill only then
        fill = _fill(step, t, st) if used else (0.0, 0.0, 0.0)
        self.pad_crop = PadCrop(padding=pad, fill=fill, mode=mode, pad_if_needed=bool(t.pad_if_needed))
        if self.image is not None and not self.pad_crop.pad_if_needed:
            h, w = self.image[0] + pad[1] + pad[3], self.image[1] + pad[0] + pad[2]
            if min(h, w) < crop:
                raise step.fail(
                    f"the dataset's images, padded, are {h}x{w}, smaller than the {crop}x{crop} window (torchvision "
                    "raises there too): give RandomCrop pad_if_needed=True, or a larger padding"
                )
        self.crop, self.form, self.shape_step = crop, "train", step
        self.interpolation = "nearest"  # nothing is resized

    def rrc(self, step: _Step, t: Any, tv: Kinds, st: _State) -> None:
        if self.form is not None:
            raise step.fail(_second_crop(self.form, self.shape_step))
        self.interpolation = _interpolation(step, t, tv, st.tensor)
        self.crop = _side(step, t.size, "crop size", allow_pair=True)
        self.scale = _pair(step, t.scale, "scale", lo=0.0, hi=1.0)
        self.ratio = _pair(step, t.ratio, "ratio", lo=1e-6, hi=None)
        self.form, self.shape_step = "train", step

    def resize_step(self, step: _Step, t: Any, tv: Kinds, st: _State) -> None:
        if self.form is not None:
            raise step.fail(_second_crop(self.form, self.shape_step))
        if self.flip_step is not None:
            raise self.flip_step.fail(_FLIP_IN_EVAL)
        self.interpolation = _interpolation(step, t, tv, st.tensor)
        if getattr(t, "max_size", None) is not None:
            raise step.fail(
                "max_size caps the longer side, so the shorter one can end below the crop; FastLoader resizes the "
                "shorter side only: remove max_size"
            )
        size = t.size
        if isinstance(size, (list, tuple)) and len(size) == 2:
            raise step.fail(
                f"size {tuple(size)!r} stretches every image to {size[0]}x{size[1]}, but FastLoader keeps the "
                f"aspect ratio (shorter side to `resize`, then a center crop): use Resize({size[0]}) + "
                f"CenterCrop({size[0]})"
            )
        if size is None:
            raise step.fail("size=None (only max_size): FastLoader resizes the shorter side to one size; give size")
        self.resize = _side(step, size, "size", allow_pair=False)
        self.form, self.shape_step = "resized", step

    def center(self, step: _Step, t: Any, tv: Kinds, st: _State) -> None:
        if self.form is None and self.image is not None:  # every image one size: as Resize(its shorter side) first
            self.resize, self.form, self.interpolation = min(self.image[:2]), "resized", "nearest"
        if self.form != "resized":
            if self.form is None:
                raise step.fail(
                    "CenterCrop without a Resize before it crops the full-resolution image; FastLoader's evaluation "
                    "path resizes the shorter side first: put Resize(S) before it (S >= the crop; 256 for 224)"
                )
            raise step.fail(_second_crop(self.form, self.shape_step))
        crop = _side(step, t.size, "crop size", allow_pair=True)
        if self.resize is not None and crop > self.resize:
            raise step.fail(
                f"crop {crop} is larger than the resized shorter side {self.resize}: torchvision pads with black, "
                f"FastLoader never pads; use Resize(S) with S >= {crop}"
            )
        self.crop, self.form = crop, "eval"

    def flip_step_(self, step: _Step, t: Any, tv: Kinds, st: _State) -> None:
        if self.form in ("resized", "eval"):
            raise step.fail(_FLIP_IN_EVAL)
        if self.flip_step is not None:
            raise step.fail(f"a second horizontal flip (the first is {self.flip_step.where}); keep one")
        try:
            flip = float(t.p)
        except (TypeError, ValueError):
            raise step.fail(f"p {t.p!r} is not a probability") from None
        if not 0.0 <= flip <= 1.0:
            raise step.fail(f"p {t.p!r} is not a probability in [0, 1]")
        self.flip, self.flip_step = flip, step


def _padding(step: _Step, value: Any, *, v2: bool) -> tuple[int, int, int, int]:
    """RandomCrop's ``padding`` as ``(left, top, right, bottom)``: v1 keeps what it was given (an int, or 1, 2 or 4
    numbers: ``(left/right, top/bottom)``, ``(left, top, right, bottom)``); v2 keeps ``[left, right, top, bottom]``."""
    if value is None:
        return (0, 0, 0, 0)
    v = [value] if not isinstance(value, (list, tuple)) else list(value)
    sides = [_index(step, x, value, "padding") for x in v]
    if any(x < 0 for x in sides) or len(sides) not in (1, 2, 4):
        raise step.fail(f"padding {value!r} must be 1, 2 or 4 numbers of pixels >= 0")
    if len(sides) == 1:
        return (sides[0],) * 4
    if len(sides) == 2:
        return (sides[0], sides[1], sides[0], sides[1])
    if v2:
        return (sides[0], sides[2], sides[1], sides[3])
    return (sides[0], sides[1], sides[2], sides[3])


def _fill(step: _Step, t: Any, st: _State) -> tuple[float, float, float]:
    """RandomCrop's ``fill`` in pixels 0..255 (on a tensor: its values undone to pixels), each a whole pixel value."""
    fill = getattr(t, "fill", 0)
    if isinstance(fill, dict):
        raise step.fail(f"fill {fill!r} is a dict of fills per type; give one value (or one per channel)")
    vals = [fill] if not isinstance(fill, (list, tuple)) else list(fill)
    try:
        vals = [float(v) for v in (vals * 3 if len(vals) == 1 else vals)]
    except (TypeError, ValueError):
        raise step.fail(f"fill {fill!r} is not numbers") from None
    if len(vals) != 3:
        raise step.fail(f"fill {fill!r} must be one value or one per channel (the images are RGB)")
    if st.tensor:  # a tensor value v is the pixel 255 * (v * S + M)
        vals = [255.0 * (v * s + m) for v, s, m in zip(vals, st.S, st.M)]
    px = [round(v) for v in vals]
    if any(abs(v - p) > 1e-3 or not 0 <= p <= 255 for v, p in zip(vals, px)):
        raise step.fail(
            f"fill {fill!r} is not a pixel value 0..255 of the image here (FastLoader pads the uint8 image); "
            "give RandomCrop a fill the image's pixels can hold, or put it before ToTensor()"
        )
    return (float(px[0]), float(px[1]), float(px[2]))


def _to_tensor(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    torch = tv.torch
    if st.tensor:
        if type(t) in tv.maybe:
            return  # timm's MaybeToTensor / MaybePILToTensor: a tensor passes through
        if kind == "to_image":
            st.image_type = True  # v2.ToImage of a tensor: the same values
            return
        raise step.fail(
            f"the image is already a tensor ({st.converted_by.where if st.converted_by else 'converted before'}); "
            "it converts PIL images: keep one tensor conversion"
        )
    st.tensor, st.converted_by = True, step
    st.image_type = kind == "to_image"
    if kind == "to_tensor":
        st.dtype = torch.float32
    else:
        st.dtype, st.S = torch.uint8, [1.0 / 255.0] * 3


def _convert(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    if not st.tensor:
        if type(t) in tv.v1_convert:
            raise step.fail(
                "it needs a tensor, but the image is still a PIL image here (torchvision raises): put "
                "PILToTensor() before it"
            )
        return  # v2 passes PIL images through untouched
    _convert_dtype(step, st, t.dtype, True, tv)


def _to_dtype(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    if not st.tensor:
        return  # v2 passes PIL images through untouched
    dtype = t.dtype
    if isinstance(dtype, dict):
        key = tv.tv_image if st.image_type else tv.torch.Tensor
        if key in dtype:
            dtype = dtype[key]
        elif "others" in dtype:
            dtype = dtype["others"]
        else:
            raise step.fail(
                f"its dtype dict has no entry for {'tv_tensors.Image' if st.image_type else 'torch.Tensor'} "
                "and no 'others' (torchvision raises); give dtype=torch.float32"
            )
    _convert_dtype(step, st, dtype, bool(getattr(t, "scale", False)), tv)


def _normalize(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    if not st.tensor or st.dtype == tv.torch.uint8:
        what = "a PIL image" if not st.tensor else "a uint8 tensor"
        raise step.fail(
            f"Normalize needs a float tensor, but the image is {what} here (torchvision raises): put ToTensor() "
            "(or PILToTensor() + ConvertImageDtype(torch.float)) before it"
        )
    if st.erasing is not None:
        raise step.fail(
            f"Normalize after RandomErasing ({st.erasing[1].where}) changes the erased value too; FastLoader erases "
            "the finished batch: put RandomErasing after Normalize (as torchvision's references do)"
        )
    m = _triple(step, t.mean, "mean", tv.torch)
    s = _triple(step, t.std, "std", tv.torch)
    if any(v == 0 for v in s):
        raise step.fail(f"std {t.std!r} has a zero: division by zero")
    st.M = [M + mi * S for M, mi, S in zip(st.M, m, st.S)]
    st.S = [S * si for S, si in zip(st.S, s)]
    if any(v <= 0 for v in st.S):
        why = "is negative" if min(s) < 0 else "times the std of the Normalize before it underflows to 0.0 (a division by zero)"
        raise step.fail(f"std {t.std!r} {why}; FastLoader's std must be positive")


def _erasing(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    """``RandomErasing`` on the tensor, after the last Normalize (its value in the batch's own units)."""
    from .augment.settings import Erasing

    if not st.tensor:
        raise step.fail("RandomErasing needs a tensor (torchvision raises on a PIL image): put it after ToTensor()")
    value = getattr(t, "value", 0.0)  # (timm's RandomErasing has none: its mode says)
    if st.erasing is not None:
        raise step.fail(f"a second RandomErasing (the first is {st.erasing[1].where}); keep one")
    if st.dtype == tv.torch.uint8 and (value is None or isinstance(value, str) or kind == "timm_erasing"):
        raise step.fail("random-noise erasing on a uint8 image: put it after the float conversion and Normalize")
    try:
        if kind == "timm_erasing":
            er = readaug.timm_erasing(t)
        elif value is None or isinstance(value, str):  # "random" (v2 keeps None): normal noise per pixel
            er = Erasing(p=t.p, scale=tuple(t.scale), ratio=tuple(t.ratio), noise="pixel")
        else:
            er = Erasing(p=t.p, scale=tuple(t.scale), ratio=tuple(t.ratio), value=value)
    except ConfigError as e:
        raise step.fail(str(e)) from None
    st.erasing = (er, step)


def _colour_place(step: _Step, st: _State, what: str) -> None:
    """A colour step must act on the training crop's pixels in [0, 1]: after the crop, before Normalize."""
    if st.form in ("resized", "eval"):
        raise step.fail(f"{what} in the evaluation form: FastLoader applies it to training batches only; remove it")
    if st.form is None:
        raise step.fail(f"{what} before the crop sees the whole image (contrast uses its mean): put it after RandomResizedCrop")
    unscaled = all(abs(s - 1.0) < 1e-9 or abs(s - 1.0 / 255.0) < 1e-12 for s in st.S)  # 0..1 or 0..255
    if any(m != 0 for m in st.M) or not unscaled:
        raise step.fail(f"{what} after Normalize acts on normalised values: put it before Normalize (and ToTensor)")


def _jitter(step: _Step, t: Any, tv: Kinds, st: _State, kind: str, p: float = 1.0) -> None:
    """``ColorJitter``: its ranges, applied to each training crop in a random order (all off: a no-op);
    after a grayscale, a second jitter or a chain: a stage of the chain, in the user's order."""
    try:
        ranges = readaug.jitter_ranges(t, p=p)
    except ConfigError as e:
        raise step.fail(str(e)) from None
    if ranges is None:
        return
    _colour_place(step, st, "ColorJitter")
    if st.ordered or st.gray is not None or st.jitter is not None:
        _fold(step, st, "ColorJitter")
        _append(step, st, *readaug.colour_stages(ranges, None))
        return
    st.jitter = (ranges, step)


def _fold(step: _Step, st: _State, what: str) -> None:
    """The jitter and grayscale so far become chain stages: from here on, one chain in the user's order."""
    if st.ordered:
        return
    if st.trivial is not None or (st.policy is not None and st.policy[0].kind != "chain"):
        first = st.trivial if st.trivial is not None else st.policy
        raise step.fail(
            f"{what} after a colour step, with {first[1].where}: FastLoader runs an auto-augment first, then one "
            "ColorJitter, then one RandomGrayscale; a chain in another order cannot hold the auto-augment"
        )
    stages = readaug.colour_stages(st.jitter and st.jitter[0], st.gray and st.gray[0])
    st.jitter = st.gray = None
    st.ordered = True
    if stages:
        _append(step, st, *stages)


def _append(step: _Step, st: _State, *stages: Any) -> None:
    """``stages`` after the chain policy's stages (a new chain if there is none)."""
    st.policy = (readaug.chained(st.policy and st.policy[0], stages), step)


def _trivial(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    """``TrivialAugmentWide`` on the training crop's uint8 pixels, before any colour step."""
    from .augment.settings import Trivial

    _colour_place(step, st, "TrivialAugmentWide")
    _on_pixels(step, st, tv, "TrivialAugmentWide", pil_only=False)
    if st.jitter is not None or st.gray is not None or st.trivial is not None or st.policy is not None:
        raise step.fail("TrivialAugmentWide after another colour step (or a second one): FastLoader runs it first; keep it first and once")
    mode = t.interpolation
    name = mode.value if isinstance(mode, tv.mode) else str(mode).lower()
    fill = t.fill
    if isinstance(fill, dict):
        raise step.fail("a fill per input type is not translated: give one number or one per channel")
    try:
        st.trivial = (Trivial(num_bins=t.num_magnitude_bins, interpolation=name, fill=fill), step)
    except ConfigError as e:
        raise step.fail(str(e)) from None


def _on_pixels(step: _Step, st: _State, tv: Kinds, what: str, *, pil_only: bool) -> None:
    """Auto-augments act on uint8 pixels (their thresholds and posterize bits are in 0..255): refused on floats."""
    if st.tensor and (pil_only or st.dtype != tv.torch.uint8):
        where = "a tensor" if pil_only else "a float tensor"
        raise step.fail(
            f"{what} on {where} ({st.converted_by.where if st.converted_by else 'converted before'}): its operations "
            "take PIL images or uint8 pixels here; put it before ToTensor()/PILToTensor(), as the references do"
        )


def _policy(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    """torchvision's or timm's ``RandAugment``/``AutoAugment`` on the training crop's uint8 pixels, before any colour step."""
    what = type(t).__name__
    _colour_place(step, st, what)
    _on_pixels(step, st, tv, what, pil_only=kind in ("timm_rand", "timm_auto"))
    if st.jitter is not None or st.gray is not None or st.trivial is not None or st.policy is not None:
        raise step.fail(f"{what} after another colour step (or a second auto-augment): FastLoader runs it first; keep it first and once")
    try:
        if kind in ("timm_rand", "timm_auto"):
            pol = readaug.timm_policy(t, auto=kind == "timm_auto")
        else:
            pol = readaug.torchvision_policy(t, auto=kind == "auto_augment", crop=st.crop)
    except ConfigError as e:
        raise step.fail(str(e)) from None
    st.policy = (pol, step)


def _chain(step: _Step, t: Any, tv: Kinds, st: _State, kind: str) -> None:
    """``RandomApply``, ``RandomChoice``, ``RandomOrder`` and torchvision's single operations (``RandomSolarize``, ``GaussianBlur``...)
    as stages of a chain policy, in the auto-augment place, or after a jitter or grayscale in the user's
    order (:func:`_fold`); ``RandomApply([ColorJitter])`` and ``RandomApply([RandomGrayscale])`` become
    the jitter's and the grayscale's own probability."""
    from .augment.settings import Stage

    inner = list(t.transforms) if kind in ("random_apply", "random_choice", "random_order") else [t]
    if kind == "random_order" and len(inner) > 5:
        raise step.fail(_REFUSAL["random_order"])
    kinds = [tv.kind(x) for x in inner]
    found = {i: recipes.recipe_op(x) for i, (x, k) in enumerate(zip(inner, kinds)) if k is None}
    kinds = [k if k is not None or found[i] is None else "recipe" for i, k in enumerate(kinds)]
    if kind == "random_apply" and kinds in (["jitter"], ["grayscale"], ["gray_fixed"]):
        (_jitter if kinds == ["jitter"] else _grayscale)(step, inner[0], tv, st, kinds[0], p=float(t.p))
        return
    what = type(t).__name__
    _colour_place(step, st, what)
    if st.trivial is not None:
        raise step.fail(f"{what} after {st.trivial[1].where}: FastLoader runs TrivialAugmentWide alone; remove one")
    bad = next((x for x, k in zip(inner, kinds) if k not in readaug.CHAIN_KINDS + readaug.CHAIN_EXTRA_KINDS + ("recipe",)), None)
    if bad is not None:
        raise step.fail(f"it holds {_name(bad)}, which FastLoader cannot run inside it: {_NO_EQUIVALENT}")
    if "recipe" in kinds and st.tensor:
        raise step.fail(f"{_name(inner[kinds.index('recipe')])} takes PIL images (it fails on a tensor): put it before ToTensor()")
    float_pixels = st.tensor and st.dtype != tv.torch.uint8
    try:
        ops = [found[i] if k == "recipe" else readaug.chain_op(x, k, float_pixels=float_pixels)
               for i, (x, k) in enumerate(zip(inner, kinds))]  # fmt: skip
        if kind == "random_choice":
            weights = None if getattr(t, "p", None) is None else tuple(t.p)
            stage = Stage(groups=tuple((o,) for o in ops), weights=weights)
        elif kind == "random_order":  # a uniformly random order (random.shuffle): one of the orders, uniformly
            stage = Stage(groups=tuple(tuple(ops[i] for i in order) for order in itertools.permutations(range(len(ops)))))
        else:
            stage = Stage(p=float(getattr(t, "p", 1.0)) if kind == "random_apply" else 1.0, groups=(tuple(ops),))
    except ConfigError as e:
        raise step.fail(str(e)) from None
    if st.policy is not None and st.policy[0].kind != "chain":
        raise step.fail(f"{what} after {st.policy[1].where}: FastLoader runs one auto-augment; keep one")
    if st.jitter is not None or st.gray is not None:
        _fold(step, st, what)
    _append(step, st, stage)


def _grayscale(step: _Step, t: Any, tv: Kinds, st: _State, kind: str, p: float = 1.0) -> None:
    """``RandomGrayscale``/``Grayscale(3)``: the grayscale after the jitter, or a chain stage in the user's order."""
    if kind == "gray_fixed" and p == 1.0 and st.channels == 1:  # a grayscale image's gray is itself, in 1 or 3 channels
        st.channels = getattr(t, "num_output_channels", 1)
        return
    if getattr(t, "num_output_channels", 3) != 3:
        raise step.fail("Grayscale with one output channel: FastLoader batches are RGB; use num_output_channels=3")
    p = p * (1.0 if kind == "gray_fixed" else float(getattr(t, "p", 0.1)))
    if p == 0:
        return
    _colour_place(step, st, "RandomGrayscale")
    if st.ordered or st.gray is not None:
        _fold(step, st, "RandomGrayscale")
        _append(step, st, *readaug.colour_stages(None, p))
        return
    st.gray = (p, step)


#: The steps that change the image's values, by kind (the geometric ones are :class:`_Shape`'s methods).
_PIXEL_STEPS = {
    "to_tensor": _to_tensor, "pil_to_tensor": _to_tensor, "to_image": _to_tensor,
    "convert": _convert, "to_dtype": _to_dtype, "normalize": _normalize, "jitter": _jitter, "erasing": _erasing,
    "grayscale": _grayscale, "trivial": _trivial, "rand_augment": _policy, "auto_augment": _policy,
    "timm_rand": _policy, "timm_auto": _policy, "timm_erasing": _erasing, "random_apply": _chain,
    "random_choice": _chain, "random_order": _chain, **{k: _chain for k in readaug.CHAIN_KINDS if k != "grayscale"}, "gray_fixed": _grayscale,
    "recipe": _chain,
}  # fmt: skip


def _takes_pairs(t: Any) -> bool:
    """Whether calling ``t`` needs two positional arguments (an ``(image, target)`` joint transform)."""
    import inspect

    try:
        params = inspect.signature(t).parameters.values()
    except (TypeError, ValueError):
        return False
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(p.kind in kinds and p.default is inspect.Parameter.empty for p in params) >= 2


def _unknown_step(step: _Step, t: Any, tv: Kinds) -> None:
    """A step torchvision's kinds do not cover: a no-op passes, anything else is refused."""
    if type(t) in tv.noop:
        return
    parent = tv.subclass_of(t)
    if parent is not None:
        raise step.fail(
            f"a subclass of torchvision's {parent}, which may change what {parent} does: FastLoader cannot "
            f"know; use {parent} itself, or {_NO_EQUIVALENT}"
        )
    n = views(t)
    if n:
        raise step.fail(
            f"it returns {n} views of each image (a {n}-item tuple or list) inside a longer transform; FastLoader "
            "batches a multi-view transform that is the dataset's whole transform (each view's own steps inside it): "
            "give the dataset the multi-view transform alone, or FastLoader(..., transform=[view_1, view_2, ...])"
        )
    if _takes_pairs(t):
        raise step.fail(
            "it takes (image, target) pairs (a detection or segmentation reference's joint transform), and an image "
            "dataset's transform gets the image alone: pass the torchvision CocoDetection, VOCSegmentation or "
            "VOCDetection it was written for to FastLoader, built without it, with "
            "collate_fn=fastload.TransformsCollate(it, collate_fn), which runs it on each (image, target) item"
        )
    if getattr(t, "transforms", None) is not None:
        raise step.fail(
            "it keeps steps in .transforms, but calling it does not give what calling its .transforms gives "
            "(checked on a probe image), so it does more than apply them: give the dataset its .transforms, "
            "and do the rest in the training loop"
        )
    raise step.fail(_unknown(t))


def _result(transform: Any, shape: _Shape, st: _State, tv: Kinds) -> "Augment":
    """The Augment of a walked transform, or a ConfigError where it does not end in one batchable form."""
    from .augment.settings import Augment

    if shape.flip_step is not None and shape.form != "train":
        raise shape.flip_step.fail(
            "a flip without RandomResizedCrop: FastLoader flips only on its training path; add "
            "RandomResizedCrop(N) (training), or remove the flip"
        )
    last = _name(transform)
    if shape.form is None and shape.image is not None:  # every image one size: kept whole
        h, w = shape.image[:2]
        if h != w:
            raise ConfigError(
                f"transform {last}: no crop, so the images keep their {h}x{w} size, but FastLoader's batches are "
                f"square: add CenterCrop({min(h, w)}) (or RandomCrop({min(h, w)}) for training)"
            )
        shape.form, shape.crop, shape.resize, shape.interpolation = "eval", h, h, "nearest"
    if shape.form is None:
        raise ConfigError(
            f"transform {last}: no crop, so the images keep their own sizes, but FastLoader batches need one size: "
            f"use {_TRAIN_HINT}"
        )
    if shape.form == "resized":
        raise ConfigError(
            f"transform {last}: Resize({shape.resize}) without CenterCrop gives images of different sizes, but "
            f"FastLoader batches need one size: add CenterCrop(N) after it (N <= {shape.resize})"
        )
    if not st.tensor:
        raise ConfigError(
            f"transform {last}: it returns PIL images, which a DataLoader cannot batch; add ToTensor() (float 0..1) "
            "or PILToTensor() (uint8 0..255) after the crop"
        )
    uint8 = st.dtype == tv.torch.uint8
    return Augment(
        train=shape.form == "train",
        crop=shape.crop,
        scale=shape.scale,
        ratio=shape.ratio,
        flip=shape.flip,
        resize=shape.resize if shape.form == "eval" else None,
        mean=None if uint8 else tuple(st.M),
        std=None if uint8 else tuple(st.S),
        dtype=tv.torch.float32 if uint8 else st.dtype,
        interpolation=shape.interpolation,
        erasing=None if st.erasing is None else st.erasing[0],
        jitter=None if st.jitter is None else st.jitter[0],
        grayscale=0.0 if st.gray is None else st.gray[0],
        trivial=None if st.trivial is None else st.trivial[0],
        policy=None if st.policy is None else st.policy[0],
        pad_crop=shape.pad_crop,
        channels=st.channels,
    )


def translate(transform: Any, *, image: tuple[int, int, int] | None = None) -> "Augment | MultiView":
    """The FastLoader settings a torchvision transform implies, as one :class:`fastload.Augment`, or, for a
    multi-view transform (one returning a list of views: MoCo's, SimCLR's, DINO's) or a list of one transform
    per view, a :class:`fastload.multiview.MultiView` of one Augment per view.

    Args:
        transform: a ``Compose`` (v1 or v2), an ``nn.Sequential`` or one transform, as
            given to a torchvision image dataset; see the module docstring for what is
            understood.
        image: ``(height, width, channels)`` when every image of the dataset has that size (an array
            dataset such as CIFAR-10): then a transform without a crop keeps square images whole,
            ``CenterCrop`` needs no ``Resize`` before it, and ``channels`` 1 (MNIST) gives
            one-channel batches.

    Returns:
        an :class:`~fastload.augment.settings.Augment` (``channels_last`` False): ``resize`` is None
        for training (unused); ``scale``, ``ratio`` are FastLoader's
        defaults and ``flip`` is 0.0 for evaluation (unused); ``mean``/``std`` are tuples
        in 0..1 units, or both None for uint8 output.

    Raises:
        ConfigError: ``transform`` is None, or holds a step FastLoader cannot reproduce;
            the message names the step (its class, arguments and position) and says what
            to do.
    """
    if transform is None:
        raise ConfigError(
            "transform=None: the dataset returns PIL images of every size, but FastLoader batches need one size; "
            f"give the dataset a transform ({_TRAIN_HINT}, then ToTensor()), or pass crop= (and train=) to FastLoader"
        )
    from . import multiview

    if isinstance(transform, (list, tuple)):
        return multiview.views_of_list(transform)
    tv = Kinds()
    items = flatten(transform, tv)
    if len(items) == 1 and tv.kind(items[0]) is None and type(items[0]) not in tv.noop and tv.subclass_of(items[0]) is None:
        n = views(items[0])
        if n:
            return multiview.read_views(items[0], n)
    if not items:
        raise ConfigError(f"transform {_name(transform)} is empty; FastLoader batches need one size: use {_TRAIN_HINT}")
    shape, st = _Shape(), _State()
    shape.image = None if image is None else (int(image[0]), int(image[1]), int(image[2]))
    st.channels = 3 if shape.image is None else shape.image[2]
    geometry = {
        "rrc": shape.rrc, "resize": shape.resize_step, "center": shape.center, "flip": shape.flip_step_,
        "random_crop": shape.random_crop,
    }  # fmt: skip
    for i, t in enumerate(items):
        step = _Step(t, i, len(items))
        kind = tv.kind(t)
        if kind is None and recipes.recipe_op(t) is not None:
            kind = "recipe"  # MoCo's and DINO's own blur and solarization (checked on a probe)
        if kind is None:
            _unknown_step(step, t, tv)
        elif kind in geometry:
            geometry[kind](step, t, tv, st)
        elif kind in _PIXEL_STEPS:
            st.form, st.crop = shape.form, shape.crop
            _PIXEL_STEPS[kind](step, t, tv, st, kind)
        else:
            raise step.fail(_REFUSAL.get(kind, f"has no FastLoader equivalent: {_NO_EQUIVALENT}"))
    return _result(transform, shape, st, tv)


_FLIP_IN_EVAL = (
    "a horizontal flip in the evaluation form (Resize + CenterCrop): FastLoader flips only on its training path "
    "(RandomResizedCrop); remove the flip"
)

_REFUSAL = {
    "lambda": f"Lambda runs your own code, which FastLoader cannot translate: {_NO_EQUIVALENT}",
    "random_order": f"RandomOrder of more than 5 transforms (FastLoader draws one of their orders): {_NO_EQUIVALENT}",
    "to_pil": f"ToPILImage has no FastLoader equivalent: {_NO_EQUIVALENT}",
    "augmix": f"AugMix (a mix of several augmented chains per image) is not translated: {_NO_EQUIVALENT}",
    "timm_augmix": f"timm's AugMix (a mix of several augmented chains per image) is not translated: {_NO_EQUIVALENT}",
}


_KNOWN = (
    "RandomResizedCrop, RandomCrop, RandomHorizontalFlip, Resize, CenterCrop, ToTensor, PILToTensor, ToImage, "
    "ConvertImageDtype, ToDtype and Normalize"
)


def _unknown(t: Any) -> str:
    """Why an unknown step is refused: a look-alike of a known one gets pointed to torchvision's."""
    if re.search(r"crop|resize|flip|tensor|normali[sz]e|dtype", type(t).__name__, re.IGNORECASE):
        return (
            f"not one of torchvision's own transforms that FastLoader translates ({_KNOWN}, from "
            "torchvision.transforms or torchvision.transforms.v2); use the torchvision one"
        )
    return f"has no FastLoader equivalent: {_NO_EQUIVALENT}"


def _second_crop(form: str, first: _Step | None) -> str:
    first_where = first.where if first is not None else "an earlier step"
    if form == "train":
        return (
            f"a second crop or resize after {first_where}: FastLoader crops and resizes once, with RandomResizedCrop "
            "from the full image (training); remove this step"
        )
    return (
        f"a crop or resize after {first_where}: FastLoader's evaluation path is exactly Resize(S) then CenterCrop(N); "
        "remove this step"
    )
