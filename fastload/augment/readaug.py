"""Read torchvision's and timm's auto-augment and erasing objects into FastLoader settings (``Policy``, ``Erasing``).

Each reader takes the transform object and returns the settings that reproduce it, or
raises :class:`~fastload.errors.ConfigError` saying what is not translated (the caller,
:mod:`fastload.transforms`, names the step). The objects are read, never called: the
operations, probabilities, magnitudes, fill and interpolation are those they carry, and
torchvision's magnitudes come from the object's own augmentation space at the crop size.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

from ..errors import ConfigError
from .policies import TIMM_OPS, TORCHVISION_OPS
from .settings import Erasing, Jitter, Op, Policy, Stage

#: PIL's resampling codes a timm policy may use, by name.
_PIL_NAMES = {0: "nearest", 2: "bilinear", 3: "bicubic"}


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


def _timm_op(op: Any) -> tuple[Op, Any, Any]:
    """A timm ``AugmentOp`` as an Op, with its fill and resampling filter(s)."""
    name = getattr(op, "name", None)
    if name not in TIMM_OPS:
        raise ConfigError(
            f"its operation {name!r} is not translated (FastLoader runs {', '.join(TIMM_OPS)})"
            + ("; GaussianBlurRand draws its radius inside the operation" if name == "GaussianBlurRand" else "")
        )
    hp = dict(getattr(op, "hparams", {}) or {})
    kw = dict(getattr(op, "kwargs", {}) or {})
    mmax = op.magnitude_max if getattr(op, "magnitude_max", None) else 10.0
    out = Op(
        name=name, prob=op.prob, magnitude=op.magnitude, std=getattr(op, "magnitude_std", 0) or 0.0, level_max=mmax,
        translate_const=hp.get("translate_const", 250), translate_pct=hp.get("translate_pct", 0.45),
    )  # fmt: skip
    resample = kw.get("resample")
    codes = tuple(resample) if isinstance(resample, (tuple, list)) else (resample,)
    try:
        names = tuple(_PIL_NAMES[int(c)] for c in codes)
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"resampling filter {resample!r} of {name}: use bilinear or bicubic (or their random choice)") from None
    return out, tuple(kw.get("fillcolor", (128, 128, 128))), names


def timm_policy(t: Any, *, auto: bool) -> Policy:
    """timm's ``RandAugment`` (``auto=False``) or ``AutoAugment`` (``auto=True``) as a Policy.

    Raises:
        ConfigError: an operation FastLoader does not run, operations with different fills or
            filters, or more layers than operations of non-zero weight.
    """
    if auto:
        groups = [list(s) for s in t.policy]
    else:
        groups = [list(t.ops)]
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
    return Policy(library="timm", kind="rand", ops=ops, num_ops=t.num_layers, interpolation=names, fill=fill, weights=weights)


def timm_erasing(t: Any) -> Erasing:
    """timm's ``RandomErasing`` (modes ``const``, ``rand``, ``pixel``; ``min_count``/``max_count``) as an Erasing."""
    mode = (getattr(t, "mode", "const") or "const").lower()
    noise = {"const": None, "rand": "channel", "pixel": "pixel"}.get(mode, "?")
    if noise == "?":
        raise ConfigError(f"mode {mode!r} is not one of timm's 'const', 'rand', 'pixel'")
    lo, hi = t.log_aspect_ratio
    return Erasing(
        p=t.probability, scale=(t.min_area, t.max_area), ratio=(math.exp(lo), math.exp(hi)), value=0.0,
        noise=noise, count=(t.min_count, t.max_count),
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
