"""The loader's augmentation graph on given uint8 crops and plans, and how close it must come to the library's own function.

``run_graph`` applies planned steps ``(name, args, interpolation)`` as the loader's graph does
(:func:`fastload.augment.stage.apply_plans`: one DALI ``select`` per step). ``assert_like`` holds
its result to the difference measured per operation against torchvision's and timm's own
functions (``benchmarks/results/graph-ops-geometry.md`` and ``graph-ops-color.md``): exact where
the formula allows, within the measured bound where DALI computes differently.
"""

from __future__ import annotations

import numpy as np
import torch

from fastload.augment.stage import apply_plans

GEOMETRY = {"ShearX", "ShearY", "TranslateX", "TranslateY", "TranslateXRel", "TranslateYRel", "Rotate"}
WHOLE_PIXEL = {"TranslateX", "TranslateY"}

#: (max, mean) absolute difference in levels allowed for the colour operations (measured; every other one is exact).
#: torchvision's GaussianBlur, a separable kernel against torch's 2-D convolution: one level at most. Equalize is
#: not PIL's: DALI's is OpenCV's formula (each level to the top of its share of the histogram, PIL's to its middle),
#: which tests/test_graph_color.py checks exactly; against PIL it is 13 levels at most (2.4 on average) on photos,
#: but up to 238 on the few-level synthetic crops of these tests (two levels of equal count: PIL 0 and 127,
#: OpenCV 0 and 255), so here it is held to nothing.
#: The ImageEnhance blends and autocontrast run as fused float32 operators (a per-sample colour matrix, one 3x3
#: kernel, a centred scale): a level at most (tests/test_graph_color.py measures each).
COLOR_BOUNDS: dict[str, tuple[float, float]] = {
    "Equalize": (255.0, 255.0), "GaussianBlur": (1.0, 0.01),
    **{n: (1.0, 0.4) for n in ("Contrast", "ContrastIncreasing", "Sharpness", "SharpnessIncreasing", "AutoContrast")},
    # the blend with the unrounded luma: at factor 0 (timm's full desaturation) a truncation where PIL rounds
    **{n: (1.0, 0.6) for n in ("Color", "ColorIncreasing", "Desaturate")},
}  # fmt: skip

#: NTSC's RGB -> YIQ, the space in which the graph turns the hue (written here from the standard, not imported).
YIQ = np.array([[0.299, 0.587, 0.114], [0.596, -0.274, -0.322], [0.211, -0.523, 0.312]])


def yiq_hue(rgb: np.ndarray, hue: float) -> np.ndarray:
    """The graph's hue part on an HWC uint8 image: YIQ's chroma turned by ``-hue`` of a full turn (the direction
    closer to PIL's HSV hue), back to RGB, truncated and clipped."""
    t = -2.0 * np.pi * hue
    turn = np.array([[1.0, 0.0, 0.0], [0.0, np.cos(t), -np.sin(t)], [0.0, np.sin(t), np.cos(t)]])
    m = np.linalg.solve(YIQ, turn @ YIQ)
    return np.clip(np.floor(rgb.astype(np.float64) @ m.T), 0, 255).astype(np.uint8)


def run_graph(u8: torch.Tensor, plans, *, library: str, fill=None) -> torch.Tensor:
    """NCHW uint8 ``u8`` through each image's planned steps in the graph; NCHW uint8 out."""
    out = apply_plans([x.permute(1, 2, 0).contiguous().numpy() for x in u8], plans, library=library, fill=fill)
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2)


def bound(name: str, interpolation: str) -> tuple[float, float]:
    """The (max, mean) difference allowed for one operation at one interpolation."""
    if name in GEOMETRY:
        if interpolation == "nearest" or name in WHOLE_PIXEL and interpolation == "bicubic":
            return (0.0, 0.0)
        if interpolation == "bilinear":
            return (1.0, 0.1)
        return (255.0, 16.0)  # bicubic carried out as bilinear: measured up to 79 (mean 7-15) on noise
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
