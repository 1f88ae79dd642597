"""The loader's augmentation graph on given uint8 crops and plans, and how close it must come to the library's own function.

``run_graph`` applies planned steps ``(name, args, interpolation)`` as the loader's graph does
(:func:`fastload.augment.stage.apply_plans`: a round per step). ``assert_like`` holds
its result to the difference measured per operation against torchvision's and timm's own
functions (``benchmarks/results/graph-ops-geometry.md`` and ``graph-ops-color.md``): exact where
the formula allows, within the measured bound where DALI computes differently.
"""

from __future__ import annotations

import numpy as np
import torch

from fastload.augment.stage import apply_plans

GEOMETRY = {"ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel", "Rotate"}

#: (max, mean) absolute difference in levels allowed for the colour operations on the CPU graph (measured; every other
#: one is exact: PIL's own arithmetic, compiled). torchvision's GaussianBlur, a separable kernel against torch's 2-D
#: convolution: one level at most.
COLOR_BOUNDS: dict[str, tuple[float, float]] = {"GaussianBlur": (1.0, 0.01)}


def run_graph(u8: torch.Tensor, plans, *, library: str, fill=None) -> torch.Tensor:
    """NCHW uint8 ``u8`` through each image's planned steps in the graph; NCHW uint8 out."""
    out = apply_plans([x.permute(1, 2, 0).contiguous().numpy() for x in u8], plans, library=library, fill=fill)
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2)


def bound(name: str, interpolation: str) -> tuple[float, float]:
    """The (max, mean) difference allowed for one operation at one interpolation (the CPU graph: geometry is PIL's
    at every interpolation)."""
    if name in GEOMETRY:
        return (0.0, 0.0)
    return COLOR_BOUNDS.get(name, (0.0, 0.0))


def like(got: torch.Tensor, want: torch.Tensor, name: str, interpolation: str) -> bool:
    """Whether ``got`` is within the measured bound of ``want`` for ``name``."""
    top, mean = bound(name, interpolation)
    d = (got.to(torch.int16) - want.to(torch.int16)).abs().double()
    return bool(d.max() <= top and d.mean() <= mean)


def assert_like(got: torch.Tensor, want: torch.Tensor, name: str, interpolation: str, what: object = "") -> None:
    """``got`` within the measured bound of ``want`` (the library's own output) for ``name``."""
    top, mean = bound(name, interpolation)
    d = (got.to(torch.int16) - want.to(torch.int16)).abs().double()
    assert d.max() <= top and d.mean() <= mean, (name, interpolation, what, float(d.max()), float(d.mean()))
