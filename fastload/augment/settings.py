"""The augmentation settings: one frozen, validated description of what is done to each image.

:class:`Augment` holds the ten settings a loader applies to every sample (random-resized
crop and flip for training, resize and center crop for evaluation, normalisation, output
dtype and memory format). It is what :func:`fastload.transforms.translate` returns for a
torchvision transform and what ``FastLoader(transform=...)`` takes, and it checks every
value when it is made, with the messages the loader's flat keywords have always given.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

from ..errors import ConfigError, as_int
from .padcrop import PadCrop

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

#: The largest ``crop``/``resize`` side accepted: far above any training resolution, and
#: small enough that one image of a batch stays a bounded allocation (3 x 8192^2 x 4 B = 805 MB).
MAX_SIDE = 8192

#: The output dtypes of a normalised batch.
FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

#: The resampling filters every resize may use (torchvision's names), on the CPU and the GPU path alike
#: (DALI's nearest neighbour picks the pixels PIL's NEAREST picks: measured equal).
INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "lanczos")

#: The settings' names, in the order they are checked.
FIELDS = (
    "train", "crop", "scale", "ratio", "flip", "resize", "mean", "std", "dtype", "channels_last", "interpolation",
    "erasing", "jitter", "grayscale", "trivial", "policy", "pad_crop", "channels",
)  # fmt: skip

#: The libraries whose operation sequences a :class:`Policy` runs, and how it picks them per image.
POLICY_LIBRARIES = ("torchvision", "timm")
POLICY_KINDS = ("rand", "auto", "chain")
#: The resampling filters of a policy's geometric operations (torchvision: nearest, bilinear; timm: PIL's).
POLICY_INTERPOLATIONS = ("nearest", "bilinear", "bicubic")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Trivial:
    """torchvision's ``TrivialAugmentWide``: one of its 14 operations per image, at a random magnitude bin.

    Args:
        num_bins: its ``num_magnitude_bins``.
        interpolation: ``"nearest"`` (its default), ``"bilinear"`` or ``"bicubic"`` (torchvision's references
            pass their ``--interpolation``), for the geometric operations (bicubic: on the PIL image, also on CUDA).
        fill: the value of pixels the geometric operations uncover (0..255), one or one per channel; None: 0.
    """

    num_bins: int = 31
    interpolation: str = "nearest"
    fill: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "num_bins", as_int("trivial num_bins", self.num_bins, lo=2, hi=1024))
        if self.interpolation not in ("nearest", "bilinear", "bicubic"):
            raise ConfigError(f"trivial interpolation must be 'nearest', 'bilinear' or 'bicubic', got {self.interpolation!r}")
        if self.fill is not None:
            f = self.fill if isinstance(self.fill, (tuple, list)) else (self.fill,)
            try:
                object.__setattr__(self, "fill", tuple(float(x) for x in f))
            except (TypeError, ValueError):
                raise ConfigError(f"trivial fill must be numbers, got {self.fill!r}") from None


@dataclasses.dataclass(frozen=True, kw_only=True)
class Op:
    """One operation of a :class:`Policy`, as the torchvision or timm object carries it.

    Args:
        name: the operation (torchvision's ``_apply_op`` names, or timm's ``NAME_TO_OP`` keys).
        prob: probability that it is applied when chosen (torchvision's RandAugment: 1).
        magnitude: torchvision: the magnitude itself (its bin already looked up; 0 for none);
            timm: the level on its 0..10 scale, turned into the operation's argument by timm's law.
        signed: torchvision: negated with probability 1/2 (timm's laws decide their own signs).
        std: timm's ``magnitude_std`` (0: fixed; ``inf``: uniform in ``[0, magnitude]``).
        level_max: timm's upper bound of the level (``magnitude_max``, else 10).
        translate_const, translate_pct: timm's ``hparams`` for its translations.
        spread: ``(low, high)``: the magnitude is drawn uniformly in it each time (GaussianBlur's sigma).
        kernel: GaussianBlur's ``(kx, ky)`` kernel size.
        jitter: ``ColorJitter``'s ranges (its ``p`` 1): the operation jitters, its parts in a random order.
    """

    name: str
    prob: float = 1.0
    magnitude: float = 0.0
    signed: bool = False
    std: float = 0.0
    level_max: float = 10.0
    translate_const: float = 250.0
    translate_pct: float = 0.45
    spread: tuple[float, float] | None = None
    kernel: tuple[int, int] | None = None
    jitter: Jitter | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ConfigError(f"policy operation name must be a non-empty string, got {self.name!r}")
        object.__setattr__(self, "prob", check_probability(f"policy operation {self.name} prob", self.prob))
        for k in ("magnitude", "std", "level_max", "translate_const", "translate_pct"):
            try:
                v = float(getattr(self, k))
            except (TypeError, ValueError):
                raise ConfigError(f"policy operation {self.name} {k} must be a number, got {getattr(self, k)!r}") from None
            if math.isnan(v) or (k != "std" and not math.isfinite(v)) or (k == "std" and v < 0):
                raise ConfigError(f"policy operation {self.name} {k} must be finite (std: >= 0), got {getattr(self, k)!r}")
            object.__setattr__(self, k, v)
        object.__setattr__(self, "signed", bool(self.signed))
        if self.spread is not None:
            object.__setattr__(self, "spread", check_pair(f"policy operation {self.name} spread", self.spread, lo=0.0))
        if self.kernel is not None:
            try:
                kx, ky = self.kernel
            except (TypeError, ValueError):
                raise ConfigError(f"policy operation {self.name} kernel must be (kx, ky), got {self.kernel!r}") from None
            k = tuple(as_int(f"policy operation {self.name} kernel", v, lo=1, hi=1023) for v in (kx, ky))
            if any(v % 2 == 0 for v in k):
                raise ConfigError(f"policy operation {self.name} kernel must be odd sizes, got {self.kernel!r}")
            object.__setattr__(self, "kernel", k)
        if self.jitter is not None and (not isinstance(self.jitter, Jitter) or self.jitter.p != 1.0):
            raise ConfigError(f"policy operation {self.name} jitter must be a fastload.augment.settings.Jitter with p=1, got {self.jitter!r}")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Stage:
    """One stage of a ``"chain"`` :class:`Policy`: torchvision's ``RandomApply``/``RandomChoice`` or one ``Random...`` step.

    Args:
        p: probability that the stage runs (``RandomApply``'s ``p``; 1 otherwise).
        groups: the alternatives, each a sequence of operations applied in order; one
            group: it is the stage's sequence.
        weights: ``RandomChoice``'s ``p`` (relative weights of the groups), or None: uniform.
    """

    p: float = 1.0
    groups: tuple[tuple[Op, ...], ...] = ()
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_probability("stage p", self.p))
        groups = tuple(tuple(g) for g in self.groups)
        if not groups or not all(isinstance(o, Op) for g in groups for o in g):
            raise ConfigError(f"a stage needs groups of fastload.augment.settings.Op, got {self.groups!r}")
        object.__setattr__(self, "groups", groups)
        if self.weights is not None:
            try:
                w = tuple(float(v) for v in self.weights)
            except (TypeError, ValueError):
                raise ConfigError(f"stage weights must be numbers, got {self.weights!r}") from None
            if len(w) != len(groups) or any(not math.isfinite(v) or v < 0 for v in w) or sum(w) <= 0:
                raise ConfigError(f"stage weights must be {len(groups)} non-negative numbers, not all 0, got {self.weights!r}")
            object.__setattr__(self, "weights", w)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Policy:
    """torchvision's ``RandAugment``/``AutoAugment`` or timm's: a sequence of operations per training crop.

    Run on the crop's uint8 pixels (as on the PIL image a DataLoader worker holds), in the
    place of :class:`Trivial`, before the colour steps.

    Args:
        library: ``"torchvision"`` (its ``_apply_op`` operations) or ``"timm"`` (its PIL operations).
        kind: ``"rand"``: ``num_ops`` operations drawn uniformly from ``ops``, with replacement;
            ``"auto"``: one of ``sub_policies`` drawn uniformly, each of its operations applied
            with its own probability; ``"chain"``: each of ``stages`` in turn.
        ops, num_ops: for ``"rand"``.
        weights: for ``"rand"``: relative weights of ``ops``, drawn without replacement (timm's
            ``choice_weights``, ``np.random.choice(replace=False, p=...)``); None: uniform, with replacement.
        sub_policies: for ``"auto"``.
        stages: for ``"chain"`` (torchvision only).
        interpolation: the geometric operations' filter; several (timm's random choice): one
            drawn uniformly per operation.
        fill: the value of uncovered pixels, one or one per channel (0..255); None: 0.
    """

    library: str
    kind: str
    ops: tuple[Op, ...] = ()
    num_ops: int = 2
    sub_policies: tuple[tuple[Op, ...], ...] = ()
    stages: tuple[Stage, ...] = ()
    interpolation: tuple[str, ...] = ("nearest",)
    fill: tuple[float, ...] | None = None
    weights: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.library not in POLICY_LIBRARIES or self.kind not in POLICY_KINDS:
            raise ConfigError(
                f"policy library must be one of {POLICY_LIBRARIES} and kind one of {POLICY_KINDS}, "
                f"got library={self.library!r}, kind={self.kind!r}"
            )
        object.__setattr__(self, "num_ops", as_int("policy num_ops", self.num_ops, lo=0, hi=64))
        ops = tuple(self.ops)
        subs = tuple(tuple(s) for s in self.sub_policies)
        if not all(isinstance(o, Op) for o in ops + tuple(o for s in subs for o in s)):
            raise ConfigError("policy ops and sub_policies must hold fastload.augment.settings.Op objects")
        need = {"rand": ("ops", ops), "auto": ("sub_policies", subs), "chain": ("stages", tuple(self.stages))}[self.kind]
        if not need[1]:
            raise ConfigError(f"a {self.kind!r} policy needs {need[0]}, got none")
        if not all(isinstance(st, Stage) for st in self.stages) or (self.stages and self.library != "torchvision"):
            raise ConfigError("policy stages must be fastload.augment.settings.Stage objects, of a torchvision policy")
        object.__setattr__(self, "stages", tuple(self.stages))
        if self.weights is not None:
            try:
                w = tuple(float(v) for v in self.weights)
            except (TypeError, ValueError):
                raise ConfigError(f"policy weights must be numbers, got {self.weights!r}") from None
            if len(w) != len(ops) or any(not math.isfinite(v) or v < 0 for v in w) or sum(v > 0 for v in w) < self.num_ops:
                raise ConfigError(
                    f"policy weights must be {len(ops)} non-negative numbers, at least num_ops={self.num_ops} of them "
                    f"above 0 (drawn without replacement), got {self.weights!r}"
                )
            object.__setattr__(self, "weights", w)
        object.__setattr__(self, "ops", ops)
        object.__setattr__(self, "sub_policies", subs)
        interp = (self.interpolation,) if isinstance(self.interpolation, str) else tuple(self.interpolation)
        if not interp or any(m not in POLICY_INTERPOLATIONS for m in interp):
            raise ConfigError(f"policy interpolation must be among {POLICY_INTERPOLATIONS}, got {self.interpolation!r}")
        object.__setattr__(self, "interpolation", interp)
        if self.fill is not None:
            f = self.fill if isinstance(self.fill, (tuple, list)) else (self.fill,)
            try:
                object.__setattr__(self, "fill", tuple(float(x) for x in f))
            except (TypeError, ValueError):
                raise ConfigError(f"policy fill must be numbers, got {self.fill!r}") from None

    @property
    def layers(self) -> int:
        """The most operations an image gets."""
        if self.kind == "chain":
            return sum(max(len(g) for g in st.groups) for st in self.stages)
        return self.num_ops if self.kind == "rand" else max(len(s) for s in self.sub_policies)


#: The largest brightness, contrast or saturation factor: float32's largest value, past which
#: torchvision's ``ColorJitter`` refuses to draw one.
MAX_JITTER_FACTOR = 3.4028234663852886e38


@dataclasses.dataclass(frozen=True, kw_only=True)
class Jitter:
    """torchvision's ``ColorJitter`` ranges (None: that part off), applied in a random order per image.

    Args:
        brightness, contrast, saturation: ``(min, max)`` factors, ``0 <= min <= max``.
        hue: ``(min, max)`` shifts within ``[-0.5, 0.5]``.
        p: probability that an image is jittered at all (``RandomApply([ColorJitter(...)], p)``).
    """

    brightness: tuple[float, float] | None = None
    contrast: tuple[float, float] | None = None
    saturation: tuple[float, float] | None = None
    hue: tuple[float, float] | None = None
    p: float = 1.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_probability("jitter p", self.p))
        for name in ("brightness", "contrast", "saturation"):
            v = getattr(self, name)
            if v is not None:
                # torchvision draws each factor with torch's float32 uniform_, which refuses a bound past
                # float32's largest value ("to is out of bounds for float"); here it would be inf, then NaN
                object.__setattr__(self, name, check_pair(f"jitter {name}", v, lo=0.0, hi=MAX_JITTER_FACTOR))
        if self.hue is not None:
            object.__setattr__(self, "hue", check_pair("jitter hue", self.hue, lo=-0.5, hi=0.5))

    @property
    def parts(self) -> tuple:
        """``(brightness, contrast, saturation, hue)``, torchvision's order of ``fn_idx``."""
        return (self.brightness, self.contrast, self.saturation, self.hue)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Erasing:
    """torchvision's ``RandomErasing`` on the finished (normalised) training batch.

    Args:
        p: probability that an image gets a rectangle.
        scale, ratio: the rectangle's area fraction and aspect ratio ranges (torchvision's defaults).
        value: what the rectangle holds, in the batch's own (normalised) units: one number, or
            one per channel (unused with ``noise``).
        noise: None (``value``), ``"pixel"`` (a standard normal draw per pixel and channel:
            torchvision's ``value="random"``, timm's ``mode="pixel"``) or ``"channel"`` (one per
            channel and rectangle: timm's ``mode="rand"``).
        count: ``(min, max)`` rectangles per erased image, drawn uniformly, each of
            ``1 / count`` of the area (timm's ``min_count``/``max_count``); torchvision: ``(1, 1)``.
    """

    p: float = 0.5
    scale: tuple[float, float] = (0.02, 0.33)
    ratio: tuple[float, float] = (0.3, 3.3)
    value: tuple[float, ...] = (0.0,)
    noise: str | None = None
    count: tuple[int, int] = (1, 1)

    def __post_init__(self) -> None:
        object.__setattr__(self, "p", check_probability("erasing p", self.p))
        object.__setattr__(self, "scale", check_pair("erasing scale", self.scale, lo=0.0, hi=1.0))
        object.__setattr__(self, "ratio", check_pair("erasing ratio", self.ratio, lo=1e-6))
        v = self.value if isinstance(self.value, (tuple, list)) else (self.value,)
        try:
            v = tuple(float(x) for x in v)
        except (TypeError, ValueError):
            raise ConfigError(f"erasing value must be a number or 3 numbers, got {self.value!r}") from None
        if len(v) not in (1, 3) or not all(math.isfinite(x) for x in v):
            raise ConfigError(f"erasing value must be a finite number or 3 of them, got {self.value!r}")
        object.__setattr__(self, "value", v)
        if self.noise not in (None, "pixel", "channel"):
            raise ConfigError(f"erasing noise must be None, 'pixel' or 'channel', got {self.noise!r}")
        try:
            lo, hi = self.count
        except (TypeError, ValueError):
            raise ConfigError(f"erasing count must be a pair (min, max) of ints, got {self.count!r}") from None
        lo = as_int("erasing count min", lo, lo=1, hi=64)
        object.__setattr__(self, "count", (lo, as_int("erasing count max", hi, lo=lo, hi=64, hint=f" (>= min {lo})")))


def check_pair(name: str, value: Any, *, lo: float, hi: float | None = None) -> tuple[float, float]:
    """``value`` as a ``(min, max)`` pair of finite floats with ``lo <= min <= max (<= hi)``."""
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a pair of numbers (min, max), got {value!r}") from None
    if not (lo <= a <= b) or (hi is not None and b > hi) or not (math.isfinite(a) and math.isfinite(b)):
        bound = f"{lo} <= min <= max" + (f" <= {hi}" if hi is not None else "")
        raise ConfigError(f"{name} must satisfy {bound}, got {value!r}")
    return a, b


def check_triple(name: str, value: Any, *, positive: bool) -> tuple[float, float, float]:
    """``value`` as three finite floats, one per RGB channel (positive ones when asked)."""
    try:
        t = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be 3 numbers (one per RGB channel) or None, got {value!r}") from None
    if len(t) != 3 or not all(math.isfinite(v) for v in t) or (positive and min(t) <= 0):
        need = "3 positive numbers" if positive else "3 numbers"
        raise ConfigError(f"{name} must be {need} (0..1 units, like torchvision) or None, got {value!r}")
    return t  # type: ignore[return-value]


def check_probability(name: str, value: Any) -> float:
    """``value`` as a float in [0, 1]."""
    try:
        p = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a probability in [0, 1], got {value!r}") from None
    if not 0.0 <= p <= 1.0:
        raise ConfigError(f"{name} must be a probability in [0, 1], got {value!r}")
    return p


@dataclasses.dataclass(frozen=True, kw_only=True)
class Augment:
    """What a loader does to each image, checked when made (torchvision's semantics throughout).

    Args:
        train: random-resized crop + flip (True) or resize + center crop (False).
        crop: output side in pixels, 1..:data:`MAX_SIDE`.
        scale, ratio: random-resized-crop area fraction and aspect ratio ranges.
        flip: probability of a horizontal flip when training.
        resize: shorter side before the evaluation center crop, at least ``crop``; None gives
            ``round(crop / 0.875)`` (:attr:`resize_side`).
        mean, std: per-channel normalisation in 0..1 units; both None gives uint8 images.
        dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16`` (unused for uint8 output).
        channels_last: images in channels-last memory format.
        interpolation: the resampling filter of every resize, torchvision's name: ``"bilinear"``
            (the default), ``"bicubic"`` or ``"lanczos"`` (antialiased).
        erasing: an :class:`Erasing` applied to training batches after normalisation, or None.
        jitter: a :class:`Jitter` (torchvision's ``ColorJitter``) applied to training crops, or None.
        grayscale: probability of torchvision's ``RandomGrayscale`` after the jitter (training).
        trivial: a :class:`Trivial` (``TrivialAugmentWide``) applied to training crops first, or None.
        policy: a :class:`Policy` (``RandAugment``/``AutoAugment``, torchvision's or timm's) applied to
            training crops first, or None; not with ``trivial``.
        pad_crop: a :class:`~fastload.augment.padcrop.PadCrop` (torchvision's ``RandomCrop``): training
            windows of ``crop`` pixels taken from the padded image, not resized (``scale``/``ratio`` unused).
        channels: 3 (RGB), or 1: the first channel only (a grayscale dataset's images, stored as RGB).

    Raises:
        ConfigError: a value out of its range or of the wrong kind, naming the setting and the value.
    """

    train: bool = True
    crop: int = 224
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    flip: float = 0.5
    resize: int | None = None
    mean: tuple[float, float, float] | None = IMAGENET_MEAN
    std: tuple[float, float, float] | None = IMAGENET_STD
    dtype: torch.dtype = torch.float32
    channels_last: bool = False
    interpolation: str = "bilinear"
    erasing: Erasing | None = None
    jitter: Jitter | None = None
    grayscale: float = 0.0
    trivial: Trivial | None = None
    policy: Policy | None = None
    pad_crop: PadCrop | None = None
    channels: int = 3

    def __post_init__(self) -> None:
        put = lambda k, v: object.__setattr__(self, k, v)  # noqa: E731 - frozen: set once, here
        put("train", bool(self.train))
        crop = as_int("crop", self.crop, lo=1, hi=MAX_SIDE, hint=" (pixels)")
        put("crop", crop)
        if self.resize is not None:
            put("resize", as_int("resize", self.resize, lo=crop, hi=2 * MAX_SIDE, hint=f" (>= crop {crop})"))
        else:
            as_int("resize", self.resize_side, lo=crop, hi=2 * MAX_SIDE, hint=f" (>= crop {crop})")
        scale = check_pair("scale", self.scale, lo=0.0, hi=1.0)
        if scale[1] <= 0:
            raise ConfigError(f"scale must have max > 0, got {self.scale!r}")
        put("scale", scale)
        put("ratio", check_pair("ratio", self.ratio, lo=1e-6))
        put("flip", check_probability("flip", self.flip))
        mean, std = self.mean, self.std
        if (mean is None) != (std is None):
            raise ConfigError(f"give both mean and std, or neither for uint8 output; got mean={mean!r}, std={std!r}")
        put("mean", None if mean is None else check_triple("mean", mean, positive=False))
        put("std", None if std is None else check_triple("std", std, positive=True))
        if self.dtype not in FLOAT_DTYPES:
            raise ConfigError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {self.dtype!r}")
        put("channels_last", bool(self.channels_last))
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(
                f"interpolation must be one of {', '.join(map(repr, INTERPOLATIONS))}, got {self.interpolation!r}"
            )
        if self.erasing is not None and not isinstance(self.erasing, Erasing):
            raise ConfigError(f"erasing must be a fastload.augment.settings.Erasing or None, got {self.erasing!r}")
        if self.jitter is not None and not isinstance(self.jitter, Jitter):
            raise ConfigError(f"jitter must be a fastload.augment.settings.Jitter or None, got {self.jitter!r}")
        if self.jitter is not None and all(p is None for p in self.jitter.parts):
            object.__setattr__(self, "jitter", None)
        object.__setattr__(self, "grayscale", check_probability("grayscale", self.grayscale))
        if (self.jitter is not None or self.grayscale > 0) and not self.train:
            raise ConfigError("jitter and grayscale apply to training batches (train=True), as in a training transform")
        if self.trivial is not None and (not isinstance(self.trivial, Trivial) or not self.train):
            raise ConfigError(f"trivial must be a fastload.augment.settings.Trivial for training batches, got {self.trivial!r}")
        if self.policy is not None and (not isinstance(self.policy, Policy) or not self.train or self.trivial is not None):
            raise ConfigError(
                f"policy must be a fastload.augment.settings.Policy for training batches, without trivial, got {self.policy!r}"
            )
        if self.erasing is not None and self.erasing.noise is not None and self.mean is None:
            raise ConfigError("erasing noise needs float (normalised) batches: give mean and std")
        if self.erasing is not None and not self.train:
            raise ConfigError("erasing applies to training batches (train=True), as torchvision's RandomErasing in a training transform")
        if self.pad_crop is not None and (not isinstance(self.pad_crop, PadCrop) or not self.train):
            raise ConfigError(f"pad_crop must be a fastload.augment.padcrop.PadCrop for training batches, got {self.pad_crop!r}")
        if self.channels not in (1, 3) or isinstance(self.channels, bool):
            raise ConfigError(f"channels must be 1 or 3, got {self.channels!r}")

    @classmethod
    def merged(cls, *layers: "Augment | dict[str, Any] | None") -> "Augment":
        """Settings from ``layers``, later ones winning; a dict gives only the settings it names.

        An :class:`Augment` layer gives all of its settings except an unset ``resize``
        (None: derived from the final ``crop``). Values are checked once, on the result.
        """
        values: dict[str, Any] = {}
        for layer in layers:
            if layer is None:
                continue
            given = layer.given() if isinstance(layer, Augment) else layer
            unknown = sorted(set(given) - set(FIELDS))
            if unknown:
                raise ConfigError(f"unknown augmentation setting(s) {', '.join(unknown)}; known: {', '.join(FIELDS)}")
            values.update(given)
        return cls(**values)

    def given(self) -> dict[str, Any]:
        """The settings as keyword arguments that make this object again (an unset ``resize`` left out)."""
        out = {k: getattr(self, k) for k in FIELDS}
        if out["resize"] is None:
            del out["resize"]
        return out

    @property
    def resize_side(self) -> int:
        """The shorter side before the evaluation center crop (``resize``, or ``round(crop / 0.875)``)."""
        return int(round(self.crop / 0.875)) if self.resize is None else self.resize

    @property
    def out_dtype(self) -> torch.dtype:
        """The dtype of the batches: ``dtype``, or ``torch.uint8`` without normalisation."""
        return self.dtype if self.mean is not None else torch.uint8
