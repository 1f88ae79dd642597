"""fastload.augment checked against oracles of its own: nothing here computes an expected value with fastload.

* The random-resized crop against torchvision's ``RandomResizedCrop.get_params`` written out below
  (:func:`tv_get_params`, the documented algorithm, one sample at a time in plain Python), fed the
  same uniforms; and against torchvision's own ``get_params`` in distribution (two-sample KS).
* Statistical laws with fixed seeds and stated tolerances: the crop's area uniform over the scale
  range and its log-aspect uniform over the log-ratio range (one-sample Kolmogorov-Smirnov against
  the theoretical law, where no attempt can be rejected so that law is exact), the crop's offset
  uniform over every place it fits (every edge and corner reached), flips at rate ``p``, and the
  draws independent across epochs, positions and seeds.
* The evaluation geometry against torchvision's ``Resize(size)`` + ``CenterCrop(size)`` arithmetic
  written out (and, for the crop corner, torchvision's functional ``center_crop`` on a tensor).

Every test states the tolerance it uses; with the fixed seeds each is deterministic. A test fails on
the planted bug or mutant named in its docstring (see docs/testing.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from fastload.augment import eval_params, random_resized_crop, train_params, uniforms

try:  # scipy's KS when it is installed; the written-out statistic below otherwise
    from scipy import stats as _sstats
except ImportError:  # pragma: no cover
    _sstats = None

ATTEMPTS = 10  # torchvision's get_params tries ten times before its fallback
DEFAULT_SCALE, DEFAULT_RATIO = (0.08, 1.0), (3 / 4, 4 / 3)


# ----------------------------------------------------------------------------- the oracles


def tv_get_params(width: int, height: int, u: np.ndarray, scale, ratio, attempts: int = ATTEMPTS):
    """torchvision's ``RandomResizedCrop.get_params`` (torchvision/transforms/transforms.py), written out.

    The random draws come from ``u`` instead of torch's generator: attempt ``i`` draws the area
    fraction from ``u[i]``, the log-aspect from ``u[attempts + i]``, the top from
    ``u[2 * attempts + i]`` and the left from ``u[3 * attempts + i]``; ``torch.randint(0, n)`` is
    ``floor(u * n)``. Returns ``(x, y, w, h)`` (torchvision returns ``(i, j, h, w)``: top, left, h, w).
    """
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for k in range(attempts):
        target_area = area * (scale[0] + (scale[1] - scale[0]) * float(u[k]))  # uniform_(scale[0], scale[1])
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * float(u[attempts + k]))
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = int(math.floor(float(u[2 * attempts + k]) * (height - h + 1)))  # randint(0, height - h + 1)
            j = int(math.floor(float(u[3 * attempts + k]) * (width - w + 1)))
            return j, i, w, h
    # Fallback to central crop
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:  # whole image
        w = width
        h = height
    i = (height - h) // 2
    j = (width - w) // 2
    return j, i, w, h


def tv_resize_center_crop(width: int, height: int, resize: int, crop: int):
    """torchvision's ``Resize(resize)`` (an int: the shorter side) then ``CenterCrop(crop)``, written out.

    ``_compute_resized_output_size``: the short side becomes ``resize``, the long one
    ``int(resize * long / short)``; ``center_crop``: the corner is ``int(round((side - crop) / 2.0))``.
    Returns ``((new_h, new_w), (left, top))``.
    """
    short, long = (width, height) if width <= height else (height, width)
    new_short, new_long = resize, int(resize * long / short)
    new_w, new_h = (new_short, new_long) if width <= height else (new_long, new_short)
    top = int(round((new_h - crop) / 2.0))
    left = int(round((new_w - crop) / 2.0))
    return (new_h, new_w), (left, top)


def ks_uniform(sample: np.ndarray, lo: float, hi: float) -> tuple[float, float]:
    """One-sample KS of ``sample`` against U(lo, hi): ``(D, p-value)`` (the p-value by the asymptotic law)."""
    x = np.sort((np.asarray(sample, dtype=np.float64) - lo) / (hi - lo))
    if _sstats is not None:
        r = _sstats.kstest(x, "uniform")
        return float(r.statistic), float(r.pvalue)
    n = len(x)
    cdf = np.clip(x, 0.0, 1.0)
    d = max(float((np.arange(1, n + 1) / n - cdf).max()), float((cdf - np.arange(n) / n).max()))
    return d, _kolmogorov_sf(d * math.sqrt(n))


def _kolmogorov_sf(t: float) -> float:
    return float(min(1.0, max(0.0, 2 * sum((-1) ** (k - 1) * math.exp(-2 * k * k * t * t) for k in range(1, 101)))))


def ks_two_samples(a: np.ndarray, b: np.ndarray) -> tuple[float, float]:
    """Two-sample KS ``(D, p-value)``."""
    if _sstats is not None:
        r = _sstats.ks_2samp(a, b)
        return float(r.statistic), float(r.pvalue)
    a, b = np.sort(a), np.sort(b)
    grid = np.concatenate([a, b])
    d = float(np.abs(np.searchsorted(a, grid, "right") / len(a) - np.searchsorted(b, grid, "right") / len(b)).max())
    ne = len(a) * len(b) / (len(a) + len(b))
    return d, _kolmogorov_sf(d * math.sqrt(ne))


#: One-sample and two-sample KS tests below reject at this p-value (fixed seeds: each outcome is fixed too).
ALPHA = 1e-3


# ----------------------------------------------------------------------------- random_resized_crop = get_params

SIZE_CASES = [
    (500, 375), (375, 500), (224, 224), (1000, 10), (10, 1000), (1, 1), (2, 3), (3, 2), (17, 5), (640, 427),
    (4000, 3000), (33, 100), (100, 33), (5, 7),
]  # fmt: skip
PARAM_CASES = [
    (DEFAULT_SCALE, DEFAULT_RATIO),
    ((0.5, 1.0), (0.5, 2.0)),
    ((0.9, 1.0), (3 / 4, 4 / 3)),  # large crops: many rejected attempts, the fallback on thin images
    ((1.0, 1.0), (1.0, 1.0)),  # the whole image when square, else the fallback
    ((0.2, 0.3), (1.0, 1.0)),
    ((0.08, 1.0), (1 / 3, 3.0)),
]


@pytest.mark.parametrize("scale, ratio", PARAM_CASES)
def test_random_resized_crop_is_torchvisions_get_params_written_out(scale, ratio):
    """Box for box, on uniforms from NumPy's own generator: every size, many draws each.

    Kills: a scale range read as ``scale[0] + u * scale[1]``; a crop that never reaches the
    bottom or right edge (``H - h`` for ``H - h + 1``); the first *rejected* attempt used; the
    fallback's clamp swapped (min/max of ``ratio``), centred with ``ceil``; w and h swapped."""
    rng = np.random.default_rng(2501)
    per = 300
    w = np.repeat([s[0] for s in SIZE_CASES], per)
    h = np.repeat([s[1] for s in SIZE_CASES], per)
    u = rng.random((len(w), 4 * ATTEMPTS))
    got = random_resized_crop(w, h, u, scale=scale, ratio=ratio, attempts=ATTEMPTS)
    assert got.shape == (len(w), 4) and got.dtype == np.float32
    want = np.array([tv_get_params(int(a), int(b), row, scale, ratio) for a, b, row in zip(w, h, u)], dtype=np.float64)
    bad = np.flatnonzero((got != want).any(axis=1))
    assert len(bad) == 0, f"{len(bad)} boxes differ, first: size {w[bad[0]]}x{h[bad[0]]}: {got[bad[0]]} != {want[bad[0]]}"


def test_random_resized_crop_takes_the_first_accepted_attempt_and_falls_back_only_when_none_is():
    """Hand-made draws on a 100x50 image, scale (0.5, 1), ratio (1, 4/3).

    Row 0: attempts 0 and 1 rejected (71x53 and 61x61 do not fit in 50 rows), attempt 2 accepted
    (50x50, at the right-most place x = 50). Row 1: every attempt rejected (82x61): the fallback.
    Row 2: attempt 0 accepted (50x50 at the origin).

    Kills: ``argmax`` over the rejections; the fallback taken whenever attempt 0 fails; an
    attempt's offset read from another attempt's column; ``(W - w) // 2`` centred with rounding up."""
    a = ATTEMPTS
    u = np.full((3, 4 * a), 0.5)
    u[0, a + 0] = 1.0 - 1e-12  # attempt 0: area 0.75 * 5000, aspect 4/3: 71x53, too tall
    u[0, a + 1] = 0.0  # attempt 1: area 0.75 * 5000, aspect 1: 61x61, too tall
    u[0, 2] = 0.0  # attempt 2: area 0.5 * 5000 ...
    u[0, a + 2] = 0.0  # ... at aspect 1: 50x50, fits
    u[0, 2 * a + 2] = 0.0  # top 0
    u[0, 3 * a + 2] = 1.0 - 1e-12  # left: the last place, 100 - 50 = 50
    u[1] = 1.0 - 1e-12  # every attempt: area 5000 at aspect 4/3, 82x61: all rejected
    u[2] = 0.0  # attempt 0: area 2500 at aspect 1, 50x50 at (0, 0)
    w, h = np.full(3, 100), np.full(3, 50)
    boxes = random_resized_crop(w, h, u, scale=(0.5, 1.0), ratio=(1.0, 4 / 3), attempts=a)
    for row, box in zip(u, boxes):
        assert tuple(box) == tv_get_params(100, 50, row, (0.5, 1.0), (1.0, 4 / 3))
    assert tuple(boxes[0]) == (50, 0, 50, 50)
    assert tuple(boxes[1]) == (16, 0, 67, 50)  # in_ratio 2 > 4/3: h = 50, w = round(66.7) = 67, x = 33 // 2
    assert tuple(boxes[2]) == (0, 0, 50, 50)


def test_fallback_cases_of_get_params():
    """The three fallback branches, u forcing every attempt to fail.

    Kills: the clamp to ``min(ratio)`` and ``max(ratio)`` exchanged; the whole image replaced by the
    clamped crop; ``(W - w) // 2`` rounded the other way."""
    u = np.full((4, 4 * ATTEMPTS), 1.0 - 1e-12)
    w = np.array([1000, 10, 100, 101])
    h = np.array([10, 1000, 100, 100])
    # scale (1, 1) and aspect drawn at the top of the range: too wide for every one of them
    boxes = random_resized_crop(w, h, u, scale=(1.0, 1.0), ratio=(3 / 4, 4 / 3), attempts=ATTEMPTS)
    assert boxes.tolist() == [
        [493, 0, 13, 10],  # in_ratio 100 > 4/3: h = 10, w = round(13.33) = 13, x = (1000 - 13) // 2
        [0, 493, 10, 13],  # in_ratio 0.01 < 3/4: w = 10, h = round(13.33) = 13
        [0, 0, 100, 100],  # in range: the whole image
        [0, 0, 101, 100],
    ]
    for a, b, row, box in zip(w, h, u, boxes):
        assert tuple(box) == tv_get_params(int(a), int(b), row, (1.0, 1.0), (3 / 4, 4 / 3))


def test_train_params_crops_are_random_resized_crops_of_their_own_uniforms():
    """train_params's boxes are torchvision's algorithm applied to 40 of its draws, with no draw
    shared between the crop and the flip (checked in distribution: see the independence tests).

    Kills: train_params passing ``scale`` as ``ratio``, or fewer than ten attempts."""
    w = np.array([500, 375, 1000, 10, 224] * 200)
    h = np.array([375, 500, 10, 1000, 224] * 200)
    pos = np.arange(len(w))
    boxes, _ = train_params(w, h, seed=7, epoch=3, positions=pos, scale=DEFAULT_SCALE, ratio=DEFAULT_RATIO, flip=0.5)
    u = uniforms(7, 3, pos, 4 * ATTEMPTS + 1)
    want = [tv_get_params(int(a), int(b), row[: 4 * ATTEMPTS], DEFAULT_SCALE, DEFAULT_RATIO) for a, b, row in zip(w, h, u)]
    assert boxes.tolist() == [list(map(float, t)) for t in want]


# ----------------------------------------------------------------------------- uniforms


def test_uniforms_are_uniform_and_independent_of_each_other():
    """KS of every column against U(0, 1), 8000 draws; correlation of neighbouring columns and
    rows under 4.5 / sqrt(n) (4.5 sigma).

    Kills: a mixer step dropped (``_mix`` without its second multiply), draws that repeat across
    columns (``d`` all equal), positions ignored."""
    n = 8000
    u = uniforms(123, 4, np.arange(n), 41)
    assert u.shape == (n, 41) and u.dtype == np.float64
    assert (u >= 0).all() and (u < 1).all()
    tol = 4.5 / math.sqrt(n)
    for c in range(41):
        d, p = ks_uniform(u[:, c], 0.0, 1.0)
        assert p > ALPHA, f"column {c}: KS D={d:.4f} p={p:.2g}"
    for c in range(40):
        assert abs(np.corrcoef(u[:, c], u[:, c + 1])[0, 1]) < tol
    assert abs(np.corrcoef(u[:-1, 0], u[1:, 0])[0, 1]) < tol
    assert len(np.unique(u)) == u.size  # 53-bit draws: a repeat in 328,000 would be a bug


@pytest.mark.parametrize("what", ["seed", "epoch", "position"])
def test_uniforms_change_with_each_argument_and_are_independent_of_it(what):
    """Changing one of (seed, epoch, position) by one gives draws uncorrelated with the first
    (|r| < 4.5 sigma) and all different; the same arguments give the same draws.

    Kills: the epoch (or seed) not mixed in; ``epoch`` and ``seed`` added (so (s, e+1) == (s+1, e))."""
    n = 6000
    pos = np.arange(n)
    kw = dict(seed=5, epoch=9)
    a = uniforms(kw["seed"], kw["epoch"], pos, 41)
    assert np.array_equal(a, uniforms(5, 9, pos.copy(), 41))
    if what == "position":
        b = uniforms(5, 9, pos + n, 41)  # positions n..2n-1 against 0..n-1
    else:
        kw[what] += 1
        b = uniforms(kw["seed"], kw["epoch"], pos, 41)
    assert not np.isin(a, b).any()
    tol = 4.5 / math.sqrt(n)
    for c in (0, 10, 20, 30, 40):
        assert abs(np.corrcoef(a[:, c], b[:, c])[0, 1]) < tol
    # seed and epoch are not interchangeable: (s+1, e) and (s, e+1) differ
    assert not np.array_equal(uniforms(6, 9, pos, 5), uniforms(5, 10, pos, 5))


def test_uniforms_use_all_64_bits_of_seed_epoch_and_position():
    """Seeds, epochs and positions that differ only in a high bit give different draws.

    Kills: a seed masked to 32 bits; positions converted through int32."""
    pos = np.array([0, 1, 2**40, 2**40 + 1], dtype=np.uint64)
    a = uniforms(1, 0, pos, 3)
    assert len(np.unique(a[:, 0])) == 4
    assert not np.array_equal(uniforms(1 + 2**40, 0, pos, 3), a)
    assert not np.array_equal(uniforms(1, 2**40, pos, 3), a)
    assert not np.array_equal(uniforms(2**63 + 1, 0, pos, 3), a)


_M64 = (1 << 64) - 1
_GOLDEN = 0x9E3779B97F4A7C15


def splitmix64(z: int) -> int:
    """SplitMix64's output for state ``z`` before its increment (Steele, Lea, Flood 2014; Vigna's
    splitmix64.c), in Python integers: ``z += golden``, then the finaliser."""
    z = (z + _GOLDEN) & _M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _M64
    return z ^ (z >> 31)


def py_uniforms(seed: int, epoch: int, positions, draws: int) -> list[list[float]]:
    """The draws of ``uniforms`` in Python integers: a SplitMix64 hash chain of seed, epoch, position,
    then of the draw number; the top 53 bits as a float in [0, 1)."""
    base = splitmix64(seed & _M64)
    base = splitmix64((base + (epoch & _M64)) & _M64)
    out = []
    for p in positions:
        k = splitmix64((base + int(p)) & _M64)
        out.append([(splitmix64(k ^ ((d * _GOLDEN) & _M64)) >> 11) * (1.0 / (1 << 53)) for d in range(1, draws + 1)])
    return out


def test_the_mixer_is_splitmix64():
    """The first outputs of SplitMix64 seeded 0, as published (splitmix64.c's reference values), and
    the finaliser on random states against the Python-integer version above.

    Kills: a shift reversed (``<<``) or changed (30 -> 31), a multiplier's constant changed, the
    increment dropped: any change to the stream."""
    from fastload.augment.draws import _mix

    k = np.arange(4, dtype=np.uint64) * np.uint64(_GOLDEN)
    assert [int(v) for v in _mix(k)] == [0xE220A8397B1DCDAF, 0x6E789E6AA1B965F4, 0x06C45D188009454F, 0xF88BB8A8724C81EC]
    z = np.random.default_rng(5).integers(0, 2**64, 1000, dtype=np.uint64, endpoint=False)
    assert [int(v) for v in _mix(z)] == [splitmix64(int(v)) for v in z]


@pytest.mark.parametrize("seed, epoch", [(0, 0), (1, 2), (2**64 - 1, 7), (12345, 2**40)])
def test_the_stream_of_uniforms_is_pinned(seed, epoch):
    """Every draw equals the Python-integer construction: a saved epoch's crops and flips are the
    same in every version, on every machine (a resume across an upgrade reads the crops it would
    have). Kills: ``base - epoch`` or ``base - position`` for ``+``, the draw counter starting at 0,
    53 bits taken from the wrong end."""
    pos = [0, 1, 2, 1000, 2**40 + 3]
    got = uniforms(seed, epoch, np.array(pos, dtype=np.uint64), 7)
    assert got.tolist() == py_uniforms(seed, epoch, pos, 7)


@pytest.mark.parametrize("dtype", [np.int32, np.uint16, np.int64, "list"])
def test_random_resized_crop_takes_sizes_of_any_integer_type(dtype):
    """Sizes given as int32 (a 50000x50000 image: its area overflows int32), uint16 or a list give
    torchvision's boxes. Kills: the sizes not converted to float64 before their product."""
    sizes = [(50000, 50000), (60000, 40000), (65535, 300), (300, 65535), (500, 375)]
    if dtype == np.uint16:
        sizes = [(min(a, 65535), min(b, 65535)) for a, b in sizes]
    w = [a for a, _ in sizes] * 50
    h = [b for _, b in sizes] * 50
    u = np.random.default_rng(9).random((len(w), 4 * ATTEMPTS))
    ww, hh = (w, h) if dtype == "list" else (np.array(w, dtype=dtype), np.array(h, dtype=dtype))
    got = random_resized_crop(ww, hh, u, scale=DEFAULT_SCALE, ratio=DEFAULT_RATIO)
    want = [tv_get_params(a, b, row, DEFAULT_SCALE, DEFAULT_RATIO) for a, b, row in zip(w, h, u)]
    assert got.tolist() == [list(map(float, t)) for t in want]


# ----------------------------------------------------------------------------- the laws of the crop

#: A 4000x4000 image with scale (0.08, 0.5) and ratio (3/4, 4/3): the widest crop asked for is
#: sqrt(0.5 * 4000^2 * 4/3) = 3266 px < 4000, so no attempt is ever rejected and the first draw's
#: law is the crop's law: area fraction ~ U(0.08, 0.5), log(w / h) ~ U(log 3/4, log 4/3), up to the
#: rounding of w and h to whole pixels (at least 1000 px each: a CDF error under 0.002, well inside
#: the KS tolerance of about 1.95 / sqrt(n) = 0.014 at n = 20000).
EXACT = dict(side=4000, scale=(0.08, 0.5), ratio=(3 / 4, 4 / 3), n=20000)


def _exact_boxes(seed=0, epoch=0, flip=0.5):
    n, s = EXACT["n"], EXACT["side"]
    return train_params(
        np.full(n, s), np.full(n, s), seed=seed, epoch=epoch, positions=np.arange(n),
        scale=EXACT["scale"], ratio=EXACT["ratio"], flip=flip,
    )  # fmt: skip


def test_crop_area_is_uniform_over_the_scale_range():
    """KS of the crop's area fraction against U(scale[0], scale[1]), rejecting at p < 1e-3.

    Kills: ``scale[0] + u * scale[1]`` (U(0.08, 0.58)); the area drawn as ``u ** 2``; the scale
    range's ends exchanged (U(0.5, 0.92) would be mostly rejected, then its law is not this one)."""
    boxes, _ = _exact_boxes()
    frac = boxes[:, 2].astype(np.float64) * boxes[:, 3] / EXACT["side"] ** 2
    lo, hi = EXACT["scale"]
    d, p = ks_uniform(frac, lo, hi)
    assert p > ALPHA, f"area fraction not U{EXACT['scale']}: KS D={d:.4f} p={p:.2g}"
    # and it fills the range: within 1 % of each end
    assert frac.min() < lo + 0.01 * (hi - lo) and frac.max() > hi - 0.01 * (hi - lo)


def test_crop_log_aspect_is_uniform_over_the_log_ratio_range():
    """KS of log(w / h) against U(log ratio[0], log ratio[1]), rejecting at p < 1e-3.

    Kills: the aspect drawn uniformly in ratio instead of log-ratio; w and h both from ``target * aspect``."""
    boxes, _ = _exact_boxes(seed=1)
    la = np.log(boxes[:, 2].astype(np.float64) / boxes[:, 3])
    lo, hi = (math.log(r) for r in EXACT["ratio"])
    d, p = ks_uniform(la, lo, hi)
    assert p > ALPHA, f"log-aspect not uniform: KS D={d:.4f} p={p:.2g}"


def _offset_uniforms(boxes, W, H, rng):
    """Each crop's left and top as U(0, 1) draws: x is uniform on {0..W-w}, so (x + V) / (W - w + 1)
    with an independent V ~ U(0, 1) is exactly U(0, 1) (likewise y)."""
    x, y, w, h = (boxes[:, k].astype(np.float64) for k in range(4))
    ux = (x + rng.random(len(x))) / (W - w + 1)
    uy = (y + rng.random(len(y))) / (H - h + 1)
    return ux, uy


@pytest.mark.parametrize("W, H", [(4000, 4000), (500, 375), (37, 23)])
def test_crop_offset_is_uniform_over_every_place_the_crop_fits(W, H):
    """The crop's left (top) is uniform over 0..W-w (0..H-h): KS of the jittered offsets against
    U(0, 1) at p < 1e-3, 20000 crops, for a large, a usual and a small odd-sized image.

    Kills: a crop that never reaches the right or bottom edge (``W - w`` for ``W - w + 1``); the
    offsets drawn from one uniform (x and y tied); the top drawn with the width."""
    n = 20000
    boxes, _ = train_params(np.full(n, W), np.full(n, H), seed=3, epoch=1, positions=np.arange(n),
                            scale=DEFAULT_SCALE, ratio=DEFAULT_RATIO, flip=0.5)  # fmt: skip
    ux, uy = _offset_uniforms(boxes, W, H, np.random.default_rng(W * H))
    for name, v in (("left", ux), ("top", uy)):
        d, p = ks_uniform(v, 0.0, 1.0)
        assert p > ALPHA, f"{name} offsets of {W}x{H} not uniform over the places: KS D={d:.4f} p={p:.2g}"
    assert abs(np.corrcoef(ux, uy)[0, 1]) < 4.5 / math.sqrt(n)


def test_every_edge_and_corner_is_reached():
    """On a 37x23 image, among 20000 crops that do not fill it: some touch each edge, and each of
    the four corners is the corner of some crop.

    Kills: the bottom or right edge unreachable (``floor(u * (H - h))``); top-left only."""
    W, H, n = 37, 23, 20000
    boxes, _ = train_params(np.full(n, W), np.full(n, H), seed=11, epoch=0, positions=np.arange(n),
                            scale=DEFAULT_SCALE, ratio=DEFAULT_RATIO, flip=0.5)  # fmt: skip
    x, y, w, h = boxes.T
    assert ((x >= 0) & (y >= 0) & (x + w <= W) & (y + h <= H)).all()
    small = (w < W) & (h < H)
    assert small.sum() > n // 2
    left, top, right, bottom = x == 0, y == 0, x + w == W, y + h == H
    for name, m in {"left": left, "top": top, "right": right, "bottom": bottom,
                    "top-left": left & top, "top-right": right & top,
                    "bottom-left": left & bottom, "bottom-right": right & bottom}.items():  # fmt: skip
        assert (m & small).any(), f"no crop reaches the {name} of the image"
    # for the commonest crop width and height, every left (top) offset it fits at occurs
    cw = np.bincount(w.astype(int)).argmax()
    ch = np.bincount(h.astype(int)).argmax()
    assert set(x[w == cw].astype(int).tolist()) == set(range(W - cw + 1))
    assert set(y[h == ch].astype(int).tolist()) == set(range(H - ch + 1))


def test_default_crops_have_torchvisions_distribution():
    """fastload's crops against torchvision's own ``RandomResizedCrop.get_params`` (torch's
    generator), 6000 each on a 500x375 image with the default scale and ratio: two-sample KS of
    area, log-aspect, left and top at p < 1e-3. Here attempts are rejected (the law is not the
    simple one above): this is the check that the rejection and fallback behave like torchvision's.

    Kills: any bias of the accepted attempt (the last accepted instead of the first, a rejection
    test with ``<`` instead of ``<=``), and what the oracle tests above kill."""
    tvt = pytest.importorskip("torchvision.transforms")
    import torch

    W, H, n = 500, 375, 6000
    torch.manual_seed(0)
    img = torch.zeros(1, H, W)
    tv = np.array([tvt.RandomResizedCrop.get_params(img, list(DEFAULT_SCALE), list(DEFAULT_RATIO)) for _ in range(n)])
    ti, tj, th, tw = (tv[:, k].astype(np.float64) for k in range(4))
    boxes, _ = train_params(np.full(n, W), np.full(n, H), seed=21, epoch=0, positions=np.arange(n),
                            scale=DEFAULT_SCALE, ratio=DEFAULT_RATIO, flip=0.5)  # fmt: skip
    fx, fy, fw, fh = (boxes[:, k].astype(np.float64) for k in range(4))
    for name, a, b in (
        ("area", fw * fh, tw * th),
        ("log-aspect", np.log(fw / fh), np.log(tw / th)),
        ("left", fx, tj),
        ("top", fy, ti),
    ):
        d, p = ks_two_samples(a, b)
        assert p > ALPHA, f"{name}: fastload and torchvision differ, KS D={d:.4f} p={p:.2g}"


# ----------------------------------------------------------------------------- flips


@pytest.mark.parametrize("p", [0.0, 0.1, 0.5, 0.9, 1.0])
def test_flips_happen_at_rate_p(p):
    """The share of flipped crops is within 4.5 binomial sigma of ``p`` (exactly 0 or all at 0 and 1).

    Kills: ``u > flip`` (rate 1 - p); a constant flip; flags that are not 0/1 int32. (``u <= flip``
    differs only for a draw of exactly ``p``: equivalent in practice.)"""
    n = 20000
    _, flips = train_params(np.full(n, 64), np.full(n, 48), seed=4, epoch=2, positions=np.arange(n),
                            scale=DEFAULT_SCALE, ratio=DEFAULT_RATIO, flip=p)  # fmt: skip
    assert flips.dtype == np.int32 and set(np.unique(flips).tolist()) <= {0, 1}
    rate = flips.mean()
    if p in (0.0, 1.0):
        assert rate == p
    else:
        assert abs(rate - p) < 4.5 * math.sqrt(p * (1 - p) / n), f"flip rate {rate:.4f}, expected {p}"


def test_flips_are_independent_of_the_crop():
    """Flip flags uncorrelated (|r| < 4.5 / sqrt(n)) with the crop's area, aspect, left and top.

    Kills: the flip decided from one of the crop's own draws (``u[:, 0] < flip``, ``u[:, 39] < flip``...)."""
    boxes, flips = _exact_boxes(seed=8)
    n = len(flips)
    ux, uy = _offset_uniforms(boxes, EXACT["side"], EXACT["side"], np.random.default_rng(0))
    tol = 4.5 / math.sqrt(n)
    for name, v in (("area", boxes[:, 2] * boxes[:, 3]), ("aspect", boxes[:, 2] / boxes[:, 3]), ("left", ux), ("top", uy)):
        assert abs(np.corrcoef(flips, v)[0, 1]) < tol, f"flips correlate with the crop's {name}"


# ----------------------------------------------------------------------------- independence across epochs, positions, seeds


@pytest.mark.parametrize("other", ["next epoch", "next position", "other seed", "far epoch"])
def test_crops_and_flips_are_independent_across_epochs_positions_and_seeds(other):
    """The same images with one of (epoch, position, seed) changed: the crops' areas, offsets and
    flips are uncorrelated with the first (|r| < 4.5 / sqrt(n)), and no more than a handful equal.

    Kills: crops that stop varying across epochs (the epoch not passed on, ``epoch=0``); position
    ``k`` reusing position ``k - 1``'s draws; the seed ignored."""
    boxes, flips = _exact_boxes(seed=2, epoch=5)
    n, s = EXACT["n"], EXACT["side"]
    kw = dict(seed=2, epoch=5, positions=np.arange(n))
    if other == "next epoch":
        kw["epoch"] = 6
    elif other == "far epoch":
        kw["epoch"] = 5 + 2**32
    elif other == "other seed":
        kw["seed"] = 3
    else:
        kw["positions"] = np.arange(n) + 1  # sample k now at position k + 1: compare position k+1 with k
    b2, f2 = train_params(np.full(n, s), np.full(n, s), scale=EXACT["scale"], ratio=EXACT["ratio"], flip=0.5, **kw)
    if other == "next position":
        boxes, flips, b2, f2 = boxes[1:], flips[1:], b2[:-1], f2[:-1]  # the same positions: equal draws
        assert np.array_equal(boxes, b2) and np.array_equal(flips, f2)
        boxes, flips = _exact_boxes(seed=2, epoch=5)
        b2, f2 = train_params(np.full(n, s), np.full(n, s), scale=EXACT["scale"], ratio=EXACT["ratio"], flip=0.5,
                              seed=2, epoch=5, positions=np.arange(n) + 1)  # fmt: skip
    m = len(flips)
    tol = 4.5 / math.sqrt(m)
    rng = np.random.default_rng(1)
    u1, v1 = _offset_uniforms(boxes, s, s, rng)
    u2, v2 = _offset_uniforms(b2, s, s, rng)
    for name, a, b in (("area", boxes[:, 2] * boxes[:, 3], b2[:, 2] * b2[:, 3]), ("left", u1, u2), ("top", v1, v2),
                       ("flip", flips, f2)):  # fmt: skip
        assert abs(np.corrcoef(a, b)[0, 1]) < tol, f"{other}: the crops' {name} correlate"
    assert (boxes == b2).all(axis=1).sum() < 5
    assert abs((flips == f2).mean() - 0.5) < 4.5 * 0.5 / math.sqrt(m)


# ----------------------------------------------------------------------------- eval_params = Resize + CenterCrop

EVAL_SIZES = [(500, 375), (375, 500), (224, 224), (1001, 667), (667, 1001), (257, 256), (256, 257), (1, 1),
              (3, 1000), (1000, 3), (641, 480), (480, 641), (299, 300), (99, 77)]  # fmt: skip


@pytest.mark.parametrize("resize, crop", [(256, 224), (232, 224), (160, 128), (224, 224), (73, 64), (1, 1), (255, 224)])
def test_eval_params_are_torchvisions_resize_and_center_crop_arithmetic(resize, crop):
    """Resized size and crop corner, image for image, against the arithmetic written out above.

    Kills: the long side rounded instead of truncated; the corner floored (``(v - crop) // 2``
    differs from round-half-to-even where (v - crop) / 2 is k + 1/2 with k odd); width and height
    exchanged in the result; the portrait and landscape branches exchanged."""
    w = np.array([s[0] for s in EVAL_SIZES])
    h = np.array([s[1] for s in EVAL_SIZES])
    size, corner = eval_params(w, h, resize=resize, crop=crop)
    assert size.dtype == np.float32 and corner.dtype == np.float32
    for k, (a, b) in enumerate(EVAL_SIZES):
        (nh, nw), (left, top) = tv_resize_center_crop(a, b, resize, crop)
        assert tuple(size[k]) == (nh, nw), f"{a}x{b}: resized to {size[k]}, torchvision {(nh, nw)}"
        assert tuple(corner[k]) == (left, top), f"{a}x{b}: corner {corner[k]}, torchvision {(left, top)}"


def test_eval_params_match_torchvision_itself():
    """torchvision's Resize output size and center_crop's corner, computed by torchvision on tensors
    (the corner read back from pixels that encode their column and row)."""
    tvf = pytest.importorskip("torchvision.transforms.functional")
    import torch

    for a, b in [(500, 375), (375, 500), (257, 256), (99, 77), (641, 480)]:
        size, corner = eval_params(np.array([a]), np.array([b]), resize=73, crop=64)
        img = torch.zeros(1, b, a)
        resized = tvf.resize(img, 73, antialias=True)
        assert tuple(size[0]) == tuple(resized.shape[1:]), (a, b)
        nh, nw = resized.shape[1:]
        coords = torch.stack(torch.meshgrid(torch.arange(nh), torch.arange(nw), indexing="ij")).float()
        c = tvf.center_crop(coords, [64, 64])
        assert (int(c[1, 0, 0]), int(c[0, 0, 0])) == tuple(corner[0]), (a, b)


@pytest.mark.parametrize("dtype", [np.uint16, np.int32, "list"])
def test_eval_params_take_sizes_of_any_integer_type(dtype):
    """Sizes as uint16 (``resize * w`` would wrap at 65536 in uint16), int32 or a list: torchvision's
    geometry. Kills: the sizes not converted to int64 before ``resize * side``."""
    sizes = [(500, 375), (375, 500), (4000, 3000), (65535, 1000), (1000, 65535), (641, 480)]
    w = [a for a, _ in sizes]
    h = [b for _, b in sizes]
    ww, hh = (w, h) if dtype == "list" else (np.array(w, dtype=dtype), np.array(h, dtype=dtype))
    size, corner = eval_params(ww, hh, resize=256, crop=224)
    want = [tv_resize_center_crop(a, b, 256, 224) for a, b in sizes]
    assert size.tolist() == [list(map(float, s)) for s, _ in want]
    assert corner.tolist() == [list(map(float, c)) for _, c in want]


@pytest.mark.parametrize("seed", [0, 1])
def test_eval_params_on_random_sizes(seed):
    """2000 random sizes (1..3000 a side), random resize >= crop: every one as torchvision computes it."""
    rng = np.random.default_rng(seed)
    w = rng.integers(1, 3001, 2000)
    h = rng.integers(1, 3001, 2000)
    crop = int(rng.integers(1, 300))
    resize = crop + int(rng.integers(0, 64))
    size, corner = eval_params(w, h, resize=resize, crop=crop)
    want = [tv_resize_center_crop(int(a), int(b), resize, crop) for a, b in zip(w, h)]
    assert size.tolist() == [list(map(float, s)) for s, _ in want]
    assert corner.tolist() == [list(map(float, c)) for _, c in want]
