"""Per-sample augmentation parameters, as pure functions of (seed, epoch, position).

Crops and flips are decided here, in NumPy, and handed to the DALI graph as inputs.
Because each sample's draw depends only on ``(seed, epoch, position in the epoch)``
(a counter-based generator, SplitMix64), results are identical on CPU and GPU, after
``load_state_dict`` resumes mid-epoch, and whatever the batch size.
"""

from __future__ import annotations

import math

import numpy as np

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def _mix(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finaliser over a uint64 array (wrapping arithmetic)."""
    with np.errstate(over="ignore"):
        x = x + _GOLDEN
        x = (x ^ (x >> np.uint64(30))) * _M1
        x = (x ^ (x >> np.uint64(27))) * _M2
        return x ^ (x >> np.uint64(31))


def uniforms(seed: int, epoch: int, positions: np.ndarray, draws: int) -> np.ndarray:
    """``[len(positions), draws]`` floats in [0, 1), a pure function of the arguments."""
    base = _mix(np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64))
    with np.errstate(over="ignore"):
        base = _mix(base + np.uint64(epoch & 0xFFFFFFFFFFFFFFFF))
        k = _mix(base + np.asarray(positions, dtype=np.uint64))
        d = np.arange(1, draws + 1, dtype=np.uint64) * _GOLDEN
        x = _mix(k[:, None] ^ d[None, :])
    return (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


def random_resized_crop(
    widths: np.ndarray,
    heights: np.ndarray,
    u: np.ndarray,
    *,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    attempts: int = 10,
) -> np.ndarray:
    """torchvision ``RandomResizedCrop.get_params``, vectorised.

    Args:
        widths, heights: image sizes.
        u: uniforms ``[n, 4 * attempts + 2]`` from :func:`uniforms`.
        scale, ratio: as in torchvision.

    Returns:
        ``[n, 4]`` float32 boxes ``(x, y, w, h)`` in pixels.
    """
    W = np.asarray(widths, dtype=np.float64)[:, None]
    H = np.asarray(heights, dtype=np.float64)[:, None]
    area = W * H
    a = attempts
    target = area * (scale[0] + u[:, 0:a] * (scale[1] - scale[0]))
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(lr0 + u[:, a : 2 * a] * (lr1 - lr0))
    w = np.rint(np.sqrt(target * aspect))
    h = np.rint(np.sqrt(target / aspect))
    ok = (w > 0) & (h > 0) & (w <= W) & (h <= H)
    first = np.argmax(ok, axis=1)
    any_ok = ok[np.arange(len(first)), first]
    rows = np.arange(len(first))
    cw = w[rows, first]
    ch = h[rows, first]
    Wf, Hf = W[:, 0], H[:, 0]
    y = np.floor(u[rows, 2 * a + first] * (Hf - ch + 1))
    x = np.floor(u[rows, 3 * a + first] * (Wf - cw + 1))
    # fallback: central crop with the ratio clamped into range
    in_ratio = Wf / Hf
    fw = np.where(in_ratio < min(ratio), Wf, np.where(in_ratio > max(ratio), np.rint(Hf * max(ratio)), Wf))
    fh = np.where(in_ratio < min(ratio), np.rint(Wf / min(ratio)), Hf)
    fw = np.minimum(fw, Wf)
    fh = np.minimum(fh, Hf)
    fx = np.floor((Wf - fw) / 2)
    fy = np.floor((Hf - fh) / 2)
    box = np.stack(
        [np.where(any_ok, x, fx), np.where(any_ok, y, fy), np.where(any_ok, cw, fw), np.where(any_ok, ch, fh)], axis=1
    )
    return box.astype(np.float32)


def train_params(
    widths: np.ndarray,
    heights: np.ndarray,
    *,
    seed: int,
    epoch: int,
    positions: np.ndarray,
    scale: tuple[float, float],
    ratio: tuple[float, float],
    flip: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Crop boxes ``[n, 4]`` (x, y, w, h) and flip flags ``[n]`` (int32 0/1) for a batch."""
    attempts = 10
    u = uniforms(seed, epoch, positions, 4 * attempts + 1)
    boxes = random_resized_crop(widths, heights, u[:, : 4 * attempts], scale=scale, ratio=ratio, attempts=attempts)
    flips = (u[:, 4 * attempts] < flip).astype(np.int32)
    return boxes, flips


#: Mixed into the seed of the erasing draws, so that they are independent of the crop and flip draws.
ERASE_SALT = 0x6A09E667F3BCC908


def erase_params(
    crop: int, *, seed: int, epoch: int, positions: np.ndarray, p: float,
    scale: tuple[float, float], ratio: tuple[float, float], attempts: int = 10, divide: np.ndarray | None = None,
) -> np.ndarray:  # fmt: skip
    """torchvision ``RandomErasing``'s rectangles on ``crop`` x ``crop`` images, vectorised.

    Per sample: erased with probability ``p``; then up to ``attempts`` draws of an area
    ``crop^2 * U(scale)`` and a log-uniform aspect in ``ratio``, ``h = round(sqrt(area * aspect))``,
    ``w = round(sqrt(area / aspect))``, the first with ``h < crop`` and ``w < crop`` taken, its
    top-left corner uniform over the places it fits (``randint(0, crop - h + 1)``); none taken:
    not erased (torchvision returns the image). A pure function of (seed, epoch, position).

    ``divide`` (per sample) divides the area, as timm's ``RandomErasing`` does for each of its
    ``count`` rectangles.

    Returns:
        ``[n, 4]`` int64 ``(top, left, h, w)``; ``h == 0`` where nothing is erased.
    """
    n = len(positions)
    u = uniforms(seed ^ ERASE_SALT, epoch, positions, 1 + 4 * attempts)
    a = attempts
    area = float(crop * crop) * (scale[0] + u[:, 1 : 1 + a] * (scale[1] - scale[0]))
    if divide is not None:  # timm's count: each of the image's rectangles gets 1 / count of the area
        area = area / np.asarray(divide, dtype=np.float64)[:, None]
    lr0, lr1 = math.log(ratio[0]), math.log(ratio[1])
    aspect = np.exp(lr0 + u[:, 1 + a : 1 + 2 * a] * (lr1 - lr0))
    h = np.rint(np.sqrt(area * aspect)).astype(np.int64)  # Python's round: half to even, as np.rint
    w = np.rint(np.sqrt(area / aspect)).astype(np.int64)
    ok = (h < crop) & (w < crop)
    first = np.argmax(ok, axis=1)
    rows = np.arange(n)
    take = ok[rows, first] & (u[:, 0] < p)
    ch, cw = h[rows, first], w[rows, first]
    top = np.floor(u[rows, 1 + 2 * a + first] * (crop - ch + 1)).astype(np.int64)
    left = np.floor(u[rows, 1 + 3 * a + first] * (crop - cw + 1)).astype(np.int64)
    out = np.stack([top, left, ch, cw], axis=1)
    out[~take] = 0
    return out


#: Mixed into the seed of the number of rectangles, of each further rectangle, and of the noise filling them.
COUNT_SALT = 0x510E527FADE682D1
BOX_SALT = 0x9B05688C2B3E6C1F
NOISE_SALT = 0x1F83D9ABFB41BD6B


def erase_boxes(
    crop: int, *, seed: int, epoch: int, positions: np.ndarray, p: float, scale: tuple[float, float],
    ratio: tuple[float, float], count: tuple[int, int] = (1, 1),
) -> np.ndarray:  # fmt: skip
    """timm ``RandomErasing``'s rectangles (torchvision's with ``count=(1, 1)``): ``[n, max count, 4]``.

    Per sample: erased with probability ``p``; then ``count`` uniform in ``[min, max]``
    rectangles, each drawn as :func:`erase_params` draws one (ten attempts) with ``1 / count``
    of the area; rows past an image's count, or whose attempts all failed, are zero.
    ``count=(1, 1)`` gives exactly :func:`erase_params`'s rectangle in row 0.
    """
    lo, hi = count
    n = len(positions)
    gate = uniforms(seed ^ ERASE_SALT, epoch, positions, 1)[:, 0] < p
    counts = lo + np.minimum(np.floor(uniforms(seed ^ COUNT_SALT, epoch, positions, 1)[:, 0] * (hi - lo + 1)), hi - lo)
    out = np.zeros((n, hi, 4), dtype=np.int64)
    for b in range(hi):
        s = seed if b == 0 else seed ^ ((BOX_SALT * b) & 0xFFFFFFFFFFFFFFFF)
        r = erase_params(crop, seed=s, epoch=epoch, positions=positions, p=1.0, scale=scale, ratio=ratio,
                         divide=None if hi == 1 else counts)  # fmt: skip
        r[~gate | (b >= counts)] = 0
        out[:, b] = r
    return out


def noise_seeds(*, seed: int, epoch: int, positions: np.ndarray) -> np.ndarray:
    """A 53-bit seed per sample for the normal noise of its erased rectangles, a pure function of (seed, epoch, position)."""
    return (uniforms(seed ^ NOISE_SALT, epoch, positions, 1)[:, 0] * float(1 << 53)).astype(np.uint64)


#: Mixed into the seed of the colour draws (order, factors, grayscale), independent of the others.
COLOR_SALT = 0xBB67AE8584CAA73B


def color_params(
    *, seed: int, epoch: int, positions: np.ndarray, parts: tuple, grayscale: float, p: float = 1.0
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """torchvision ``ColorJitter`` + ``RandomGrayscale`` draws per image, a pure function of (seed, epoch, position).

    ``parts`` is ``(brightness, contrast, saturation, hue)``, each None or ``(min, max)``.

    Returns:
        ``order`` ``[n, 4]`` (a uniformly random permutation of the four parts, torchvision's
        ``randperm(4)``), ``factors`` ``[n, 4]`` float64 (each uniform in its range; NaN where the
        part is off, and on every part of an image not jittered: ``u >= p``, ``RandomApply``'s gate),
        ``gray`` ``[n]`` bool (``u < grayscale``).
    """
    u = uniforms(seed ^ COLOR_SALT, epoch, positions, 10)
    order = np.argsort(u[:, :4], axis=1, kind="stable")
    factors = np.full((len(positions), 4), np.nan)
    for k, part in enumerate(parts):
        if part is not None:
            lo, hi = part
            factors[:, k] = lo + u[:, 4 + k] * (hi - lo)
    if p < 1.0:  # torchvision's RandomApply: ``if p < rand(): return img``
        factors[~(u[:, 9] <= p)] = np.nan
    return order, factors, u[:, 8] < grayscale


#: Mixed into the seed of the TrivialAugmentWide draws (operation, magnitude bin, sign).
TRIVIAL_SALT = 0x3C6EF372FE94F82B

#: TrivialAugmentWide's operations, in torchvision's order, and whether their magnitude is signed.
TRIVIAL_OPS = (
    ("Identity", False), ("ShearX", True), ("ShearY", True), ("TranslateX", True), ("TranslateY", True),
    ("Rotate", True), ("Brightness", True), ("Color", True), ("Contrast", True), ("Sharpness", True),
    ("Posterize", False), ("Solarize", False), ("AutoContrast", False), ("Equalize", False),
)  # fmt: skip


def trivial_magnitudes(name: str, num_bins: int) -> np.ndarray:
    """TrivialAugmentWide's magnitude bins of operation ``name`` (the TrivialAugment paper's wide space).

    torchvision's ``_augmentation_space`` under torch's default float32, bit for bit, whatever
    torch's default dtype is set to (a function of the arguments only).
    """
    lin = {"ShearX": (0.0, 0.99), "ShearY": (0.0, 0.99), "TranslateX": (0.0, 32.0), "TranslateY": (0.0, 32.0),
           "Rotate": (0.0, 135.0), "Brightness": (0.0, 0.99), "Color": (0.0, 0.99), "Contrast": (0.0, 0.99),
           "Sharpness": (0.0, 0.99), "Solarize": (255.0, 0.0)}  # fmt: skip
    if name in lin:  # torch's float32 linspace, torchvision's own: NumPy's float32 linspace differs in the last bit
        import torch  # (31 bins: TranslateX's bin 15 is 15.999999 in torch, whose int() is 15; NumPy gives 16.0)

        return torch.linspace(*lin[name], num_bins, dtype=torch.float32).numpy().astype(np.float64)
    if name == "Posterize":
        return (8 - np.round(np.arange(num_bins) / ((num_bins - 1) / 6))).astype(np.float64)
    return np.zeros(0)  # no magnitude


def trivial_params(*, seed: int, epoch: int, positions: np.ndarray, num_bins: int) -> tuple[np.ndarray, np.ndarray]:
    """Per image: the operation (an index into :data:`TRIVIAL_OPS`, uniform) and its signed magnitude."""
    u = uniforms(seed ^ TRIVIAL_SALT, epoch, positions, 3)
    ops = np.minimum((u[:, 0] * len(TRIVIAL_OPS)).astype(np.int64), len(TRIVIAL_OPS) - 1)
    bins = np.minimum((u[:, 1] * num_bins).astype(np.int64), num_bins - 1)
    mags = np.zeros(len(positions))
    for k, (name, signed) in enumerate(TRIVIAL_OPS):
        sel = ops == k
        table = trivial_magnitudes(name, num_bins)
        if sel.any() and len(table):
            mags[sel] = table[bins[sel]] * np.where(signed & (u[sel, 2] < 0.5), -1.0, 1.0)
    return ops, mags


def eval_params(widths: np.ndarray, heights: np.ndarray, *, resize: int, crop: int) -> tuple[np.ndarray, np.ndarray]:
    """torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` geometry, exactly, per image.

    The shorter side becomes ``resize`` and the longer ``int(resize * long / short)``
    (truncated, as torchvision does); the crop's corner is ``int(round((side - crop) / 2))``
    (Python's round, half to even, as torchvision's ``CenterCrop``).

    Returns:
        ``([n, 2] float32 resized (height, width), [n, 2] float32 crop corner (x, y))``.
    """
    w = np.asarray(widths, dtype=np.int64)
    h = np.asarray(heights, dtype=np.int64)
    short = np.minimum(w, h)
    nw = np.where(w <= h, resize, (resize * w) // np.maximum(short, 1))
    nh = np.where(w <= h, (resize * h) // np.maximum(short, 1), resize)
    nw, nh = np.maximum(nw, 1), np.maximum(nh, 1)
    left = np.array([int(round((v - crop) / 2.0)) for v in nw.tolist()], dtype=np.int64)
    top = np.array([int(round((v - crop) / 2.0)) for v in nh.tolist()], dtype=np.int64)
    return np.stack([nh, nw], axis=1).astype(np.float32), np.stack([left, top], axis=1).astype(np.float32)


#: Mixed into the seed of every view after the first of a multi-view transform (view 0 keeps the seed itself).
VIEW_SALT = 0xA54FF53A5F1D36F1


def view_seed(seed: int, view: int) -> int:
    """The seed view ``view`` of a multi-view transform draws everything from: ``seed`` itself for view 0 (a
    one-view loader's draws), a SplitMix64 mix of ``(seed, view)`` for the others. Every draw of a view is then a
    pure function of (seed, epoch, position, view)."""
    if view == 0:
        return seed
    with np.errstate(over="ignore"):
        x = np.array([seed & 0xFFFFFFFFFFFFFFFF], dtype=np.uint64) ^ (np.uint64(VIEW_SALT) * np.uint64(view))
        return int(_mix(_mix(x))[0])
