"""The draws of RandAugment and AutoAugment (torchvision's and timm's) per image, as pure functions of (seed, epoch, position).

A :class:`~fastload.augment.settings.Policy` says which operations an image may get; :func:`plan`
decides, for each sample of a batch, the operations it gets, in order, with their
arguments, from FastLoader's counter-based uniforms (:func:`fastload.augment.uniforms`),
so the same seed gives the same images on any batch size, world size and after a resume.
The laws are those of the objects translated:

* torchvision ``RandAugment``: ``num_ops`` operations, each uniform over its augmentation
  space (with replacement), at the magnitude of its bin, negated with probability 1/2
  where the operation is signed;
* torchvision ``AutoAugment``: one sub-policy uniform over the policy's, each of its two
  operations applied with its probability, at its bin's magnitude, signed as above;
* timm ``RandAugment``: ``num_layers`` operations uniform with replacement (with
  ``choice_weights``: by weight, without replacement, each draw among those left), each applied
  with its probability (``random() > prob`` skips), its level ``gauss(magnitude, std)``
  (``std = inf``: ``uniform(0, magnitude)``) clamped to ``[0, level_max]``, turned into the
  operation's arguments by timm's law (:func:`timm_args`, whose ``_randomly_negate`` is a
  uniform draw here too), with one of its interpolations drawn per operation;
* timm ``AutoAugment``: one sub-policy uniform, each operation as above;
* a torchvision chain (``RandomApply``, ``RandomChoice``, ``RandomSolarize``, ``GaussianBlur``...):
  each stage runs with its probability (``p < rand()`` skips), picks one of its groups
  (``RandomChoice``'s weights, else uniform), and applies the group's operations, each
  with its own probability; GaussianBlur's sigma is uniform in its range per image; a
  ``ColorJitter`` in a chain draws torchvision's ``get_params``: a uniformly random order of
  its four parts and each part's factor uniform in its range (its step's arguments: the
  order, then the four factors, NaN for a part that is off).

Nothing here imports torch, torchvision or timm.
"""

from __future__ import annotations

import math

import numpy as np

from .draws import uniforms
from .settings import Op, Policy, Stage

#: Mixed into the seed of the policy draws, independent of the crop, colour and erasing draws.
POLICY_SALT = 0x5BE0CD19137E2179

#: Uniforms per operation slot: choice, gate, two for the normal level, sign, interpolation.
_PER_SLOT = 6

#: timm's level scale: ``magnitude / 10`` is the fraction of each operation's range.
LEVEL_DENOM = 10.0

#: timm's operations without arguments, and those whose arguments this module computes.
TIMM_NO_ARGS = ("AutoContrast", "Equalize", "Invert")
TIMM_OPS = TIMM_NO_ARGS + (
    "Rotate", "Posterize", "PosterizeIncreasing", "PosterizeOriginal", "Solarize", "SolarizeIncreasing",
    "SolarizeAdd", "Color", "ColorIncreasing", "Contrast", "ContrastIncreasing", "Brightness",
    "BrightnessIncreasing", "Sharpness", "SharpnessIncreasing", "ShearX", "ShearY", "TranslateX", "TranslateY",
    "TranslateXRel", "TranslateYRel", "Desaturate", "GaussianBlur",
)  # fmt: skip

#: torchvision's ``_apply_op`` operations.
TORCHVISION_OPS = (
    "Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color", "Contrast",
    "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize", "Invert", "Grayscale", "GaussianBlur",
)  # fmt: skip


def timm_args(name: str, level: float, negate: bool, op: Op) -> tuple:
    """timm's ``LEVEL_TO_ARG[name](level, hparams)``, with its random sign given as ``negate``.

    Written from timm's ``auto_augment`` laws: rotations up to 30 degrees, shears up to 0.3,
    translations up to ``translate_const`` pixels or ``translate_pct`` of the side (all
    negated at random), enhancements ``0.1 + 1.8 * level / 10`` (``...Increasing``:
    ``max(0.1, 1 +/- 0.9 * level / 10)``), posterize/solarize levels truncated to ints.
    """
    f = level / LEVEL_DENOM
    sign = -1.0 if negate else 1.0
    if name in TIMM_NO_ARGS:
        return ()
    if name == "Rotate":
        return (sign * f * 30.0,)
    if name in ("ShearX", "ShearY"):
        return (sign * f * 0.3,)
    if name in ("TranslateX", "TranslateY"):
        return (sign * f * op.translate_const,)
    if name in ("TranslateXRel", "TranslateYRel"):
        return (sign * f * op.translate_pct,)
    if name == "Posterize":
        return (int(f * 4),)
    if name == "PosterizeIncreasing":
        return (4 - int(f * 4),)
    if name == "PosterizeOriginal":
        return (int(f * 4) + 4,)
    if name == "Solarize":
        return (min(256, int(f * 256)),)
    if name == "SolarizeIncreasing":
        return (256 - min(256, int(f * 256)),)
    if name == "SolarizeAdd":
        return (min(128, int(f * 110)),)
    if name.endswith("Increasing"):
        return (max(0.1, 1.0 + sign * f * 0.9),)
    if name in ("Color", "Contrast", "Brightness", "Sharpness"):
        return (f * 1.8 + 0.1,)
    if name == "Desaturate":
        return (min(1.0, max(0.5, 0.5 + 0.5 * f)),)
    if name == "GaussianBlur":
        return (min(2.0, max(0.1, 0.1 + 1.9 * f)),)
    raise KeyError(name)


def _level(op: Op, u1: float, u2: float) -> float:
    """timm's magnitude of ``op`` from two uniforms: fixed, normal (Box-Muller) or uniform, clamped."""
    m = op.magnitude
    if op.std == math.inf:
        m = u1 * m
    elif op.std > 0:
        m = m + op.std * math.sqrt(-2.0 * math.log(1.0 - u1)) * math.cos(2.0 * math.pi * u2)
    return max(0.0, min(m, op.level_max))


def _step(policy: Policy, op: Op, u: np.ndarray) -> tuple[str, tuple, str] | None:
    """One chosen operation's ``(name, args, interpolation)`` from its slot's uniforms, or None if skipped."""
    if op.prob < 1.0 and not u[1] <= op.prob:
        return None
    if op.jitter is not None:  # ColorJitter.get_params: randperm(4), then each part uniform in its range
        order = np.argsort(u[_PER_SLOT : _PER_SLOT + 4], kind="stable")
        factors = [math.nan if r is None else float(r[0] + u[2 + k] * (r[1] - r[0])) for k, r in enumerate(op.jitter.parts)]
        return op.name, tuple(float(v) for v in order) + tuple(factors), policy.interpolation[0]
    interp = policy.interpolation[min(int(u[5] * len(policy.interpolation)), len(policy.interpolation) - 1)]
    if policy.library == "timm":
        return op.name, timm_args(op.name, _level(op, u[2], u[3]), bool(u[4] > 0.5), op), interp
    m = op.magnitude if op.spread is None else op.spread[0] + u[2] * (op.spread[1] - op.spread[0])
    m = m * (-1.0 if op.signed and u[4] < 0.5 else 1.0)
    if op.kernel is not None:
        return op.name, (op.kernel[0], op.kernel[1], m), interp
    return op.name, (m,), interp


def _pick(u: float, weights: tuple[float, ...] | None, n: int) -> int:
    """An index in ``range(n)`` from one uniform: uniform, or by relative ``weights`` (``random.choices``)."""
    if weights is None:
        return min(int(u * n), n - 1)
    cum = np.cumsum(weights)
    return min(int(np.searchsorted(cum, u * cum[-1], side="right")), n - 1)


def _chain(policy: Policy, row: np.ndarray, fixed: bool = False) -> list:
    """One image's steps of a ``"chain"`` policy from its uniforms (per stage: gate, pick, then slots); ``fixed``: each
    stage's operations at the stage's own positions (:func:`chain_positions`), None where nothing is done."""
    steps: list = []
    i = 1
    for stage in policy.stages:
        width = _width(stage)
        gate, pick, slots = row[i], row[i + 1], row[i + 2 : i + 2 + _PER_SLOT * width]
        i += 2 + _PER_SLOT * width
        at = len(steps)
        if fixed:
            steps += [None] * max(len(g) for g in stage.groups)
        if stage.p < 1.0 and not gate <= stage.p:
            continue
        k = 0
        for j, op in enumerate(stage.groups[_pick(pick, stage.weights, len(stage.groups))]):
            s = _step(policy, op, slots[_PER_SLOT * k : _PER_SLOT * (k + _slots(op))])
            k += _slots(op)
            if fixed:
                steps[at + j] = s
            elif s is not None:
                steps.append(s)
    return steps


def chain_positions(policy: Policy) -> list[set[str]]:
    """The operation names each position of a ``"chain"`` policy's fixed plan (``plan(..., fixed=True)``) can hold:
    a stage's ``j``-th operation of any of its groups, at the stage's ``j``-th position."""
    out: list[set[str]] = []
    for stage in policy.stages:
        out += [{g[j].name for g in stage.groups if j < len(g)} for j in range(max(len(g) for g in stage.groups))]
    return out


def _slots(op: Op) -> int:
    """Slots of uniforms an operation draws from: two for a jitter (its order and factors), else one."""
    return 2 if op.jitter is not None else 1


def _width(stage: Stage) -> int:
    """Slots a chain stage reserves: its widest group's."""
    return max(sum(_slots(o) for o in g) for g in stage.groups)


def plan(policy: Policy, *, seed: int, epoch: int, positions: np.ndarray, fixed: bool = False) -> list[list]:
    """Per sample of ``positions``: the operations it gets, in order, as ``(name, args, interpolation)``.

    ``args`` are what the operation is called with: torchvision's one magnitude, or timm's
    level arguments (empty for AutoContrast, Equalize, Invert); GaussianBlur: its kernel and
    sigma; ColorJitter: its order and four factors. Skipped operations (their
    probability not drawn) are left out; ``Identity`` is kept (it does nothing). ``fixed``, for a
    ``"chain"`` policy: every sample's list has one entry per position of :func:`chain_positions`, its
    operation there or None (the same operations, in the same order, as the packed plan).
    """
    slots = policy.layers
    if policy.kind == "chain":
        draws = 1 + sum(2 + _PER_SLOT * _width(st) for st in policy.stages)
    else:
        draws = 1 + _PER_SLOT * slots
    u = uniforms(seed ^ POLICY_SALT, epoch, positions, draws)
    out: list[list[tuple[str, tuple, str]]] = []
    for row in u:
        if policy.kind == "chain":
            out.append(_chain(policy, row, fixed))
            continue
        if policy.kind == "rand" and policy.weights is not None:  # np.random.choice(replace=False, p=weights)
            left = list(policy.weights)
            chosen = []
            for k in range(slots):
                i = _pick(row[1 + _PER_SLOT * k], tuple(left), len(left))
                chosen.append(policy.ops[i])
                left[i] = 0.0
        elif policy.kind == "rand":
            ops = policy.ops
            chosen = [ops[min(int(row[1 + _PER_SLOT * k] * len(ops)), len(ops) - 1)] for k in range(slots)]
        else:
            subs = policy.sub_policies
            chosen = list(subs[min(int(row[0] * len(subs)), len(subs) - 1)])
        steps = []
        for k, op in enumerate(chosen):
            s = _step(policy, op, row[1 + _PER_SLOT * k : 1 + _PER_SLOT * (k + 1)])
            if s is not None:
                steps.append(s)
        out.append(steps)
    return out
