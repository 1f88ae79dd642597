"""Read the augmentation classes of public recipes (MoCo's, DINO's, DeiT's) as chain operations.

Self-supervised training scripts define a few augmentations of their own, on PIL images:

* MoCo (v2 and v3, ``moco/loader.py``): ``GaussianBlur(sigma=[.1, 2.])`` blurs with PIL's
  ``ImageFilter.GaussianBlur(radius)``, ``radius = random.uniform(*sigma)``; v3's ``Solarize()`` is
  ``ImageOps.solarize`` (threshold 128);
* DINO (``utils.py``): ``GaussianBlur(p, radius_min, radius_max)`` blurs when
  ``random.random() <= p`` with ``radius = random.uniform(radius_min, radius_max)``;
  ``Solarization(p)`` solarizes (threshold 128) when ``random.random() < p``;
* DeiT (``augment.py``, its ``--ThreeAugment``): the same ``GaussianBlur`` and ``Solarization``, and
  ``gray_scale(p)``, torchvision's ``Grayscale(3)`` (kept as ``transf``) when ``random.random() < p``.

:func:`recipe_op` recognises such an object by its class name and its exact attributes, then
checks it: called on a probe image from two random states, it must give what that law gives
(PIL's own functions, with the same draws). Only then is it an
:class:`~fastload.augment.settings.Op` of a chain; anything else stays unknown and is refused
by its class name. The blur runs in the graph as PIL's three box passes (the operation timm's
``GaussianBlur`` uses), named ``PILGaussianBlur`` in a torchvision chain.
"""

from __future__ import annotations

import math
from typing import Any, Callable

from .settings import Op

__all__ = ["MAX_PIL_RADIUS", "PIL_BLUR", "recipe_op"]

#: The chain operation of PIL's ``GaussianBlur(radius)``, its one argument the radius.
PIL_BLUR = "PILGaussianBlur"

#: The largest blur radius the graph's box passes hold (7 taps: a box radius of at most 2).
MAX_PIL_RADIUS = 3.4


def _numbers(*vals: Any) -> tuple[float, ...] | None:
    """``vals`` as finite floats, or None where one is not a number."""
    try:
        out = tuple(float(v) for v in vals)
    except (TypeError, ValueError):
        return None
    if any(isinstance(v, bool) or not math.isfinite(f) for v, f in zip(vals, out)):
        return None
    return out


def _laws(t: Any) -> tuple[Op, Callable[[Any], Any]] | None:
    """The Op a recipe object is read as, and the law (a function of a PIL image, drawing from ``random``) it must
    follow; None when ``t`` is not one of the recipes' classes by name and attributes."""
    import random

    from PIL import ImageFilter, ImageOps

    name, attrs = type(t).__name__, vars(t) if hasattr(t, "__dict__") else None
    if attrs is None:
        return None
    keys = set(attrs)
    blur = lambda im, lo, hi: im.filter(ImageFilter.GaussianBlur(radius=random.uniform(lo, hi)))  # noqa: E731
    if name == "GaussianBlur" and keys == {"sigma"}:  # MoCo
        sigma = attrs["sigma"]
        pair = _numbers(*sigma) if isinstance(sigma, (list, tuple)) and len(sigma) == 2 else None
        if pair is None or not 0 < pair[0] <= pair[1] <= MAX_PIL_RADIUS:
            return None
        return Op(name=PIL_BLUR, spread=pair), lambda im: blur(im, *pair)
    if name == "GaussianBlur" and keys == {"prob", "radius_min", "radius_max"}:  # DINO
        vals = _numbers(attrs["prob"], attrs["radius_min"], attrs["radius_max"])
        if vals is None or not (0 <= vals[0] <= 1 and 0 < vals[1] <= vals[2] <= MAX_PIL_RADIUS):
            return None
        p, lo, hi = vals
        return Op(name=PIL_BLUR, prob=p, spread=(lo, hi)), lambda im: blur(im, lo, hi) if random.random() <= p else im
    if name == "Solarization" and keys == {"p"}:  # DINO
        vals = _numbers(attrs["p"])
        if vals is None or not 0 <= vals[0] <= 1:
            return None
        p = vals[0]
        return Op(name="Solarize", prob=p, magnitude=128.0), lambda im: ImageOps.solarize(im) if random.random() < p else im
    if name == "Solarize" and not keys:  # MoCo v3
        return Op(name="Solarize", magnitude=128.0), ImageOps.solarize
    if name == "gray_scale" and keys == {"p", "transf"}:  # DeiT
        vals, transf = _numbers(attrs["p"]), attrs["transf"]
        if vals is None or not 0 <= vals[0] <= 1 or type(transf).__name__ != "Grayscale":
            return None
        if getattr(transf, "num_output_channels", None) != 3:
            return None
        p = vals[0]
        return Op(name="Grayscale", prob=p), lambda im: im.convert("L").convert("RGB") if random.random() < p else im
    return None


def recipe_op(t: Any) -> Op | None:
    """The chain operation a recipe's own augmentation object is, checked on the probe; None if it is not one.

    ``p < 1`` draws are gates, as ``RandomApply``'s: DINO's blur applies at ``u <= p``, its solarization at
    ``u < p`` (the same law: the two differ only at ``u == p``).
    """
    from ..tvkinds import on_probe, outputs_equal

    found = _laws(t)
    if found is None or not callable(t):
        return None
    op, law = found
    try:
        if not all(outputs_equal(on_probe(t, seed), on_probe(law, seed)) for seed in (0, 1, 2)):
            return None
    except Exception:  # noqa: BLE001 - one that cannot run on an RGB PIL image is not the recipe's
        return None
    return op
