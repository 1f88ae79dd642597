"""Read torchvision's and timm's auto-augment and erasing objects into FastLoader settings (``Policy``, ``Erasing``).

Each reader takes the transform object and returns the settings that reproduce it, or
raises :class:`~fastload.errors.ConfigError` saying what is not translated (the caller,
:mod:`fastload.transforms`, names the step). The objects are read, never called: the
operations, probabilities, magnitudes, fill and interpolation are those they carry, and
torchvision's magnitudes come from the object's own augmentation space at the crop size.

timm is read by each version's own layout (0.3.x, 0.4.x and 1.x alike): an ``AugmentOp`` is
named by its ``aug_fn`` and ``level_fn``, found by identity in its own module's ``NAME_TO_OP``
and ``LEVEL_TO_ARG`` (0.3/0.4 keep no ``name``); ``RandomErasing``'s law by the ``per_pixel`` and
``rand_color`` flags every version draws from, checked against ``mode`` where one is kept.
"""

from __future__ import annotations

import dataclasses
import math
import re
import sys
from typing import Any

from ..errors import ConfigError
from .policies import LEVEL_DENOM, TIMM_OPS, TORCHVISION_OPS
from .settings import Erasing, Jitter, Op, Policy, Stage

#: PIL's resampling codes a timm policy may use, by name.
_PIL_NAMES = {0: "nearest", 2: "bilinear", 3: "bicubic"}

#: timm before 0.4.9 draws ``magnitude_std=inf`` as ``random.gauss(m, inf)``: the level clamps to 0 or
#: 10, half each (later versions draw ``uniform(0, m)``). A normal of this std, clamped, draws the same.
TWO_POINT_STD = 1e300

#: The first timm version whose ``AugmentOp`` draws ``magnitude_std=inf`` uniformly.
TIMM_UNIFORM_INF = (0, 4, 9)

#: Erasing modes by timm's name: FastLoader's ``Erasing.noise``.
_TIMM_NOISE = {"const": None, "rand": "channel", "pixel": "pixel"}


def _fill(fill: Any) -> tuple[float, ...] | None:
    if fill is None:
        return None
    if isinstance(fill, dict):
        raise ConfigError("a fill per input type is not translated: give one number or one per channel")
    f = fill if isinstance(fill, (tuple, list)) else (fill,)
    try:
        return tuple(float(v) for v in f)
    except (TypeError, ValueError):
        raise ConfigError(f"fill {fill!r} is not numbers") from None


def _space(t: Any, num_bins: int, crop: int) -> dict[str, tuple[Any, bool]]:
    """The object's augmentation space at ``crop`` x ``crop``: name -> (magnitudes tensor, signed)."""
    if hasattr(t, "_augmentation_space"):  # torchvision.transforms (v1)
        return dict(t._augmentation_space(num_bins, [crop, crop]))
    table = getattr(type(t), "_AUGMENTATION_SPACE", None)  # torchvision.transforms.v2
    if not isinstance(table, dict):
        raise ConfigError("its augmentation space cannot be read (not torchvision's RandAugment/AutoAugment layout)")
    space = {name: (fn(num_bins, crop, crop), signed) for name, (fn, signed) in table.items()}
    if "Solarize" in space:  # v2 keeps its thresholds as fractions of the dtype's maximum: 255 on uint8 pixels
        space["Solarize"] = (space["Solarize"][0] * 255.0, space["Solarize"][1])
    return space


def _tv_interpolation(t: Any) -> str:
    mode = getattr(t, "interpolation", "nearest")
    name = getattr(mode, "value", mode)
    name = str(name).lower()
    if name not in ("nearest", "bilinear", "bicubic"):
        raise ConfigError(f"interpolation {name.upper()} for its geometric operations: use NEAREST, BILINEAR or BICUBIC")
    return name


def torchvision_policy(t: Any, *, auto: bool, crop: int) -> Policy:
    """torchvision's ``RandAugment`` (``auto=False``) or ``AutoAugment`` (``auto=True``), v1 or v2, as a Policy.

    Raises:
        ConfigError: an operation, interpolation, fill or magnitude it cannot reproduce.
    """
    interp, fill = _tv_interpolation(t), _fill(getattr(t, "fill", None))
    if not auto:
        bins, mag = int(t.num_magnitude_bins), t.magnitude
        if isinstance(mag, bool) or not isinstance(mag, int) or not 0 <= mag < bins:
            raise ConfigError(f"magnitude {mag!r} must be a bin index in [0, {bins}) (torchvision indexes its bins with it)")
        ops = []
        for name, (mags, signed) in _space(t, bins, crop).items():
            if name not in TORCHVISION_OPS:
                raise ConfigError(f"its operation {name!r} is not translated")
            value = float(mags[mag]) if mags is not None and mags.ndim > 0 else 0.0
            ops.append(Op(name=name, magnitude=value, signed=bool(signed) and mags is not None and mags.ndim > 0))
        return Policy(library="torchvision", kind="rand", ops=tuple(ops), num_ops=t.num_ops, interpolation=interp, fill=fill)
    space = _space(t, 10, crop)
    policies = getattr(t, "policies", None) or getattr(t, "_policies", None)
    if not policies:
        raise ConfigError("its sub-policies cannot be read")
    subs = []
    for sub in policies:
        ops = []
        for name, p, idx in sub:
            if name not in space or name not in TORCHVISION_OPS:
                raise ConfigError(f"its operation {name!r} is not translated")
            mags, signed = space[name]
            value = float(mags[idx]) if idx is not None else 0.0
            ops.append(Op(name=name, prob=p, magnitude=value, signed=bool(signed) and idx is not None))
        subs.append(tuple(ops))
    return Policy(library="torchvision", kind="auto", sub_policies=tuple(subs), interpolation=interp, fill=fill)


def _need(obj: Any, attr: str, what: str) -> Any:
    """``obj.attr``, or a ConfigError naming what lacks it."""
    try:
        return getattr(obj, attr)
    except AttributeError:
        raise ConfigError(f"{what} has no {attr!r}: not a timm layout FastLoader reads") from None


def timm_version(obj: Any) -> tuple[int, int, int] | None:
    """The version of the timm that defined ``obj``'s class (``timm.__version__``), or None if unreadable."""
    root = sys.modules.get(type(obj).__module__.partition(".")[0])
    m = re.match(r"(\d+)\.(\d+)\.(\d+)", str(getattr(root, "__version__", "")))
    return (int(m[1]), int(m[2]), int(m[3])) if m else None


def timm_op_name(op: Any) -> str:
    """A timm ``AugmentOp``'s operation in its own version's tables: the name whose ``NAME_TO_OP`` function is its
    ``aug_fn`` and whose ``LEVEL_TO_ARG`` function is its ``level_fn`` (by identity); a ``name`` kept must agree.

    Raises:
        ConfigError: the functions are in no entry of its module's tables, or the name disagrees with them.
    """
    table = sys.modules.get(type(op).__module__)
    ops, levels = getattr(table, "NAME_TO_OP", None), getattr(table, "LEVEL_TO_ARG", None)
    if not isinstance(ops, dict) or not isinstance(levels, dict):
        raise ConfigError(f"{type(op).__module__} has no NAME_TO_OP/LEVEL_TO_ARG tables to name its operations by")
    fn, level_fn = _need(op, "aug_fn", "its AugmentOp"), _need(op, "level_fn", "its AugmentOp")
    found = [n for n, f in ops.items() if f is fn and n in levels and levels[n] is level_fn]
    kept = getattr(op, "name", None)
    if len(found) != 1:
        what = getattr(fn, "__name__", repr(fn))
        raise ConfigError(f"its operation {kept or what!r} (aug_fn {what}) is in no entry of its timm's NAME_TO_OP/LEVEL_TO_ARG")
    if kept is not None and kept != found[0]:
        raise ConfigError(f"its operation named {kept!r} runs {found[0]}'s functions: FastLoader will not guess which")
    return found[0]


def _timm_std(op: Any, name: str) -> float:
    """``magnitude_std`` as the law of ``op``'s own version: <= 0 fixed, inf uniform (two-point before 0.4.9)."""
    std = _need(op, "magnitude_std", f"its {name}")
    if isinstance(std, bool) or not isinstance(std, (int, float)):
        raise ConfigError(f"magnitude_std {std!r} of {name} is not a number")
    if not std > 0:  # every version: `std > 0` (0.3/0.4: `std and std > 0`) or no noise
        return 0.0
    if std != math.inf:
        return float(std)
    version = timm_version(op)
    if version is None:
        raise ConfigError(f"magnitude_std=inf of {name}: its timm version cannot be read (before 0.4.9 it is not uniform)")
    return math.inf if version >= TIMM_UNIFORM_INF else TWO_POINT_STD


def _timm_op(op: Any) -> tuple[Op, Any, Any]:
    """A timm ``AugmentOp`` (any version) as an Op, with its fill and resampling filter(s)."""
    name = timm_op_name(op)
    if name not in TIMM_OPS:
        raise ConfigError(
            f"its operation {name!r} is not translated (FastLoader runs {', '.join(TIMM_OPS)})"
            + ("; GaussianBlurRand draws its radius inside the operation" if name == "GaussianBlurRand" else "")
        )
    hp, kw = _need(op, "hparams", f"its {name}"), _need(op, "kwargs", f"its {name}")
    if not isinstance(hp, dict) or not isinstance(kw, dict) or "fillcolor" not in kw or "resample" not in kw:
        raise ConfigError(f"the hparams/kwargs (fill, resample) of {name} cannot be read")
    if name in ("TranslateX", "TranslateY") and "translate_const" not in hp:
        raise ConfigError(f"{name} has no translate_const in its hparams (timm raises KeyError when it runs)")
    # 0.3/0.4 keep no magnitude_max and clamp the level at 10 whatever the hparams say; 1.x: magnitude_max or 10
    mmax = getattr(op, "magnitude_max", None) or LEVEL_DENOM
    out = Op(
        name=name, prob=_need(op, "prob", f"its {name}"), magnitude=_need(op, "magnitude", f"its {name}"),
        std=_timm_std(op, name), level_max=mmax, translate_const=hp.get("translate_const", 250.0),
        translate_pct=hp.get("translate_pct", 0.45),
    )  # fmt: skip
    resample = kw["resample"]
    codes = tuple(resample) if isinstance(resample, (tuple, list)) else (resample,)
    try:
        names = tuple(_PIL_NAMES[int(c)] for c in codes)
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"resampling filter {resample!r} of {name}: use bilinear or bicubic (or their random choice)") from None
    try:
        fill = tuple(kw["fillcolor"])
    except TypeError:
        raise ConfigError(f"fill {kw['fillcolor']!r} of {name} is not one value per channel") from None
    return out, fill, names


def timm_policy(t: Any, *, auto: bool) -> Policy:
    """timm's ``RandAugment`` (``auto=False``) or ``AutoAugment`` (``auto=True``) as a Policy.

    Raises:
        ConfigError: an operation FastLoader does not run, operations with different fills or
            filters, or more layers than operations of non-zero weight.
    """
    if auto:
        groups = [list(s) for s in _need(t, "policy", "its AutoAugment")]
    else:
        groups = [list(_need(t, "ops", "its RandAugment"))]
    read = [[_timm_op(op) for op in g] for g in groups]
    extras = {(fill, names) for g in read for _, fill, names in g}
    if len(extras) != 1:
        raise ConfigError(f"its operations use different fills or filters ({sorted(extras)}): FastLoader uses one")
    fill, names = extras.pop()
    if auto:
        subs = tuple(tuple(o for o, _, _ in g) for g in read)
        return Policy(library="timm", kind="auto", sub_policies=subs, interpolation=names, fill=fill)
    ops = tuple(o for o, _, _ in read[0])
    weights = getattr(t, "choice_weights", None)
    weights = None if weights is None else tuple(float(w) for w in weights)
    layers = _need(t, "num_layers", "its RandAugment")
    return Policy(library="timm", kind="rand", ops=ops, num_ops=layers, interpolation=names, fill=fill, weights=weights)


def timm_erasing_mode(t: Any) -> str:
    """timm's ``RandomErasing`` mode: what its ``per_pixel``/``rand_color`` flags draw (every version's
    ``_get_pixels``: ``per_pixel`` first), equal to its ``mode`` where one is kept (1.x); ``mode`` alone where
    it has no flags.

    Raises:
        ConfigError: neither is readable, a flag is not a bool, an unknown mode, or the two disagree.
    """
    flags = None
    if hasattr(t, "per_pixel") or hasattr(t, "rand_color"):
        pp, rc = getattr(t, "per_pixel", None), getattr(t, "rand_color", None)
        if not isinstance(pp, bool) or not isinstance(rc, bool):
            raise ConfigError(f"per_pixel={pp!r}, rand_color={rc!r} are not the two bools timm's erasing draws from")
        flags = "pixel" if pp else "rand" if rc else "const"
    mode = getattr(t, "mode", None)
    if mode is None:
        if flags is None:
            raise ConfigError("it has neither mode nor per_pixel/rand_color: its erasing values cannot be read")
        return flags
    if not isinstance(mode, str) or (mode.lower() or "const") not in _TIMM_NOISE:
        raise ConfigError(f"mode {mode!r} is not one of timm's 'const', 'rand', 'pixel'")
    mode = mode.lower() or "const"  # timm accepts '' as const
    if flags is not None and flags != mode:
        raise ConfigError(f"mode {mode!r} but per_pixel/rand_color draw {flags!r} (what timm erases with): set them alike")
    return mode


def timm_erasing(t: Any) -> Erasing:
    """timm's ``RandomErasing`` (any version; modes ``const``, ``rand``, ``pixel``; ``min_count``/``max_count``)
    as an Erasing. ``num_splits`` (a batch's clean part) and ``device`` (where the noise is drawn) do not act on
    one image, which is what a dataset's transform erases.

    Raises:
        ConfigError: an attribute missing or unreadable (see :func:`timm_erasing_mode`).
    """
    noise = _TIMM_NOISE[timm_erasing_mode(t)]
    what = "its RandomErasing"
    log_ratio = _need(t, "log_aspect_ratio", what)
    try:
        lo, hi = log_ratio
        ratio = (math.exp(lo), math.exp(hi))
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"log_aspect_ratio {log_ratio!r} is not two numbers") from None
    return Erasing(
        p=_need(t, "probability", what), scale=(_need(t, "min_area", what), _need(t, "max_area", what)), ratio=ratio,
        value=0.0, noise=noise, count=(_need(t, "min_count", what), _need(t, "max_count", what)),
    )  # fmt: skip


#: torchvision's single-operation steps a chain runs, by the kind :mod:`fastload.transforms` gives them.
CHAIN_KINDS = ("solarize", "posterize", "sharpness", "autocontrast", "equalize", "invert", "blur", "gray_fixed", "grayscale")
#: The steps a chain may also hold (``ColorJitter``: its parts in a random order, on the uint8 pixels).
CHAIN_EXTRA_KINDS = ("jitter",)


def jitter_ranges(t: Any, *, p: float = 1.0) -> Jitter | None:
    """``ColorJitter``'s four ranges as a Jitter applied with probability ``p``, or None when every part is off (a no-op)."""
    parts = {a: getattr(t, a, None) for a in ("brightness", "contrast", "saturation", "hue")}
    if all(v is None for v in parts.values()):
        return None
    return Jitter(**{k: None if v is None else tuple(float(x) for x in v) for k, v in parts.items()}, p=p)


def chain_op(t: Any, kind: str, *, float_pixels: bool) -> Op:
    """One of torchvision's ``RandomSolarize``, ``RandomPosterize``, ``RandomAdjustSharpness``,
    ``RandomAutocontrast``, ``RandomEqualize``, ``RandomInvert``, ``GaussianBlur``, ``Grayscale(3)``,
    ``RandomGrayscale``, ``ColorJitter`` as an Op of a chain (run on the uint8 pixels; ``float_pixels``: the step sees
    0..1 floats, so a solarize threshold is scaled to 255ths).

    Raises:
        ConfigError: a form FastLoader cannot run (one output channel, posterize on floats, ...).
    """
    p = float(getattr(t, "p", 1.0))
    if kind == "jitter":
        ranges = jitter_ranges(t)
        if ranges is None:  # every part off: nothing happens, at no draw's cost
            return Op(name="Identity")
        return Op(name="ColorJitter", jitter=ranges)
    if kind == "solarize":
        return Op(name="Solarize", prob=p, magnitude=float(t.threshold) * (255.0 if float_pixels else 1.0))
    if kind == "posterize":
        if float_pixels:
            raise ConfigError("RandomPosterize needs uint8 pixels (torchvision raises on floats): put it before ToTensor()")
        return Op(name="Posterize", prob=p, magnitude=float(t.bits))
    if kind == "sharpness":
        return Op(name="Sharpness", prob=p, magnitude=float(t.sharpness_factor) - 1.0)
    if kind in ("autocontrast", "equalize", "invert"):
        return Op(name={"autocontrast": "AutoContrast", "equalize": "Equalize", "invert": "Invert"}[kind], prob=p)
    if kind == "blur":
        sigma = tuple(float(v) for v in t.sigma)
        return Op(name="GaussianBlur", kernel=tuple(t.kernel_size), spread=(sigma[0], sigma[-1]))
    if kind in ("gray_fixed", "grayscale"):
        if getattr(t, "num_output_channels", 3) != 3:
            raise ConfigError("Grayscale with one output channel: FastLoader batches are RGB; use num_output_channels=3")
        return Op(name="Grayscale", prob=p if kind == "grayscale" else 1.0)
    raise ConfigError(f"{type(t).__name__} is not one of the operations a RandomApply/RandomChoice may hold here")


def colour_stages(jitter: Jitter | None, gray: float | None) -> tuple[Stage, ...]:
    """A ``ColorJitter`` (its ``p`` the stage's) and a ``RandomGrayscale(gray)`` as chain stages, in that order."""
    stages = []
    if jitter is not None:
        stages.append(Stage(p=jitter.p, groups=((Op(name="ColorJitter", jitter=dataclasses.replace(jitter, p=1.0)),),)))
    if gray:
        stages.append(Stage(groups=((Op(name="Grayscale", prob=gray),),)))
    return tuple(stages)


def chained(policy: Policy | None, stages: tuple[Stage, ...]) -> Policy:
    """The chain ``policy`` (None: an empty one) with ``stages`` after its own."""
    return Policy(library="torchvision", kind="chain", stages=(policy.stages if policy is not None else ()) + tuple(stages))
