"""fastload.augment's erasing, colour and TrivialAugmentWide draws against oracles of their own.

Nothing here computes an expected value with fastload:

* torchvision's ``RandomErasing`` (``forward``'s gate and ``get_params``), timm's ``RandomErasing``
  with ``max_count`` (``_erase``), ``ColorJitter.get_params`` with ``RandomApply`` and
  ``RandomGrayscale``'s gates, and ``TrivialAugmentWide``'s ``forward`` and ``_augmentation_space``,
  written out below in plain Python (torchvision/transforms/transforms.py, autoaugment.py; timm/data/
  random_erasing.py), one sample at a time. They read their random numbers from the module's stream
  of draws written out in Python integers (``py_uniforms``, pinned to ``fastload.augment.uniforms``
  by ``tests/test_oracles_augment.py``), at the place each draw has in that stream (stated in each
  oracle's docstring), so their results are compared draw for draw.
* torchvision itself where it runs: ``RandomErasing.get_params`` and ``ColorJitter.get_params`` on
  torch's generator, compared in distribution (two-sample KS and chi-square).
* Statistical laws with fixed seeds and stated tolerances: rates within 4.5 binomial standard errors,
  uniform counts (chi-square), independent parts (|r| < 4.5 / sqrt(n)), p-values against ALPHA.

A test fails on the mutant or planted change named in its docstring (see docs/testing.md).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from test_oracles_augment import ALPHA, py_uniforms

from fastload.augment import (
    BOX_SALT,
    COLOR_SALT,
    COUNT_SALT,
    ERASE_SALT,
    NOISE_SALT,
    TRIVIAL_OPS,
    TRIVIAL_SALT,
    color_params,
    erase_boxes,
    erase_params,
    noise_seeds,
    trivial_magnitudes,
    trivial_params,
)

torch = pytest.importorskip("torch")
T = pytest.importorskip("torchvision.transforms")
stats = pytest.importorskip("scipy.stats")

_M64 = (1 << 64) - 1
TV_ERASE = dict(scale=(0.02, 0.33), ratio=(0.3, 3.3))  # RandomErasing's defaults


# ----------------------------------------------------------------------------- the oracles


def tv_erasing(crop: int, row, *, p: float, scale, ratio, attempts: int = 10, count: int = 1):
    """torchvision's ``RandomErasing`` on a ``crop`` x ``crop`` image, written out; timm's with ``count``.

    ``forward``: erased when ``torch.rand(1) < p`` (``row[0]``). ``get_params``: attempt ``k``
    draws the area fraction ``uniform_(scale)`` from ``row[1 + k]``, the log-aspect from
    ``row[1 + attempts + k]``; ``h = round(sqrt(area * aspect))``, ``w = round(sqrt(area / aspect))``;
    ``continue`` unless ``h < img_h and w < img_w``; top ``randint(0, img_h - h + 1)`` from
    ``row[1 + 2 * attempts + k]``, left from ``row[1 + 3 * attempts + k]`` (``floor(u * n)``).
    Ten failures: the image returned as it is. timm's ``_erase`` divides the area by ``count``.
    Returns ``(top, left, h, w)``, zeros where nothing is erased.
    """
    if not row[0] < p:
        return (0, 0, 0, 0)
    area = crop * crop
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for k in range(attempts):
        erase_area = area * (scale[0] + (scale[1] - scale[0]) * row[1 + k]) / count
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * row[1 + attempts + k])
        h = int(round(math.sqrt(erase_area * aspect_ratio)))
        w = int(round(math.sqrt(erase_area / aspect_ratio)))
        if not (h < crop and w < crop):
            continue
        i = int(math.floor(row[1 + 2 * attempts + k] * (crop - h + 1)))
        j = int(math.floor(row[1 + 3 * attempts + k] * (crop - w + 1)))
        return (i, j, h, w)
    return (0, 0, 0, 0)


def rejected_for_width_alone(crop: int, row, *, scale, ratio, attempts: int = 10) -> bool:
    """Whether an attempt before the one taken had ``h < crop`` but ``w == crop`` (torchvision: rejected)."""
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for k in range(attempts):
        erase_area = crop * crop * (scale[0] + (scale[1] - scale[0]) * row[1 + k])
        aspect_ratio = math.exp(log_ratio[0] + (log_ratio[1] - log_ratio[0]) * row[1 + attempts + k])
        h = int(round(math.sqrt(erase_area * aspect_ratio)))
        w = int(round(math.sqrt(erase_area / aspect_ratio)))
        if h < crop and w < crop:
            return False
        if h < crop and w == crop:
            return True
    return False


def timm_count(u: float, lo: int, hi: int) -> int:
    """timm's ``random.randint(min_count, max_count)`` (both ends included) from one uniform draw."""
    return lo + min(int(math.floor(u * (hi - lo + 1))), hi - lo)


def tv_linspace(start: float, end: float, steps: int) -> list[float]:
    """``torch.linspace(start, end, steps)``: ``start + i * (end - start) / (steps - 1)``, in float64."""
    return [start + i * (end - start) / (steps - 1) for i in range(steps)]


def tv_augmentation_space(num_bins: int) -> dict:
    """``TrivialAugmentWide._augmentation_space`` (torchvision/transforms/autoaugment.py) written out:
    ``name: (magnitudes or None, signed)`` in torchvision's order."""
    return {
        "Identity": (None, False),
        "ShearX": (tv_linspace(0.0, 0.99, num_bins), True),
        "ShearY": (tv_linspace(0.0, 0.99, num_bins), True),
        "TranslateX": (tv_linspace(0.0, 32.0, num_bins), True),
        "TranslateY": (tv_linspace(0.0, 32.0, num_bins), True),
        "Rotate": (tv_linspace(0.0, 135.0, num_bins), True),
        "Brightness": (tv_linspace(0.0, 0.99, num_bins), True),
        "Color": (tv_linspace(0.0, 0.99, num_bins), True),
        "Contrast": (tv_linspace(0.0, 0.99, num_bins), True),
        "Sharpness": (tv_linspace(0.0, 0.99, num_bins), True),
        "Posterize": ([8 - round(i / ((num_bins - 1) / 6)) for i in range(num_bins)], False),
        "Solarize": (tv_linspace(255.0, 0.0, num_bins), False),
        "AutoContrast": (None, False),
        "Equalize": (None, False),
    }


def tv_trivial(row, space: dict):
    """``TrivialAugmentWide.forward``'s draws written out: the operation ``randint(14)`` from ``row[0]``,
    the magnitude bin ``randint(len(magnitudes))`` from ``row[1]``, the sign ``randint(2)`` (1: negative)
    from ``row[2]`` (``u < 0.5`` is 1); 0.0 for the operations without magnitudes.
    ``space``: :func:`tv_augmentation_space`'s. Returns ``(operation index, signed magnitude)``."""
    op = min(int(math.floor(row[0] * len(space))), len(space) - 1)
    magnitudes, signed = list(space.values())[op]
    if magnitudes is None:
        return op, 0.0
    magnitude = float(magnitudes[min(int(math.floor(row[1] * len(magnitudes))), len(magnitudes) - 1)])
    if signed and row[2] < 0.5:
        magnitude *= -1.0
    return op, magnitude


def tv_color(row, parts, *, grayscale: float, p: float):
    """``ColorJitter`` in ``RandomApply(p)``, then ``RandomGrayscale(grayscale)``, written out.

    ``get_params``: ``fn_idx = randperm(4)``, the permutation that sorts ``row[0:4]``; each part's
    factor ``uniform_(min, max)`` from ``row[4 + k]`` (None: off); ``RandomApply``: ``if p < rand():
    return img`` (``row[9]``: every factor off); ``RandomGrayscale``: ``rand() < p`` (``row[8]``).
    Returns ``(order, factors with NaN for off, gray)``."""
    order = sorted(range(4), key=lambda k: row[k])
    factors = [math.nan if part is None else part[0] + row[4 + k] * (part[1] - part[0]) for k, part in enumerate(parts)]
    if p < row[9]:
        factors = [math.nan] * 4
    return order, factors, row[8] < grayscale


def binomial_ok(hits: int, n: int, p: float, sigmas: float = 4.5) -> bool:
    return abs(hits - n * p) <= sigmas * math.sqrt(n * p * (1 - p)) + 1e-9


# ----------------------------------------------------------------------------- erase_params


ERASE_CASES = {
    # torchvision's defaults at p 0.5 on a 32-pixel crop
    "defaults": dict(crop=32, p=0.5, **TV_ERASE),
    # large, tall-or-square rectangles: many attempts rejected, some for their width alone (w == crop), some
    # images never erased
    "large": dict(crop=24, p=1.0, scale=(0.5, 1.0), ratio=(0.4, 1.0)),
    # wide rectangles, three attempts
    "wide": dict(crop=16, p=0.7, scale=(0.1, 0.9), ratio=(1.0, 3.0), attempts=3),
    "never": dict(crop=32, p=0.0, **TV_ERASE),
}


@pytest.mark.parametrize("case", list(ERASE_CASES))
def test_erase_params_are_torchvisions_random_erasing_written_out(case):
    """Rectangle for rectangle over 1500 positions (seed 41, epoch 3, positions from 700), int64
    ``(top, left, h, w)``, zeros where torchvision returns the image.

    Kills: the gate read as ``or`` (erased when it should not be); the attempts' columns shifted (an
    area slice one longer, the top or left of another attempt); ``scale[1] +`` for ``scale[0] +``;
    ``lr1 + lr0`` for the log-ratio's width; ``w`` computed as ``h``; ``w <= crop`` accepted; the left
    ranging over ``crop + w + 1``; a not-erased row filled with 1 instead of 0; fewer draws."""
    kw = dict(ERASE_CASES[case])
    crop, attempts = kw.pop("crop"), kw.get("attempts", 10)
    pos = np.arange(700, 2200)
    got = erase_params(crop, seed=41, epoch=3, positions=pos, **kw)
    assert got.shape == (len(pos), 4) and got.dtype == np.int64
    u = py_uniforms(41 ^ ERASE_SALT, 3, pos, 1 + 4 * attempts)
    want = [tv_erasing(crop, row, **kw) for row in u]
    bad = [k for k in range(len(pos)) if tuple(got[k]) != want[k]]
    assert not bad, f"{len(bad)} rectangles differ, first at position {pos[bad[0]]}: {got[bad[0]]} != {want[bad[0]]}"
    gated, erased = sum(row[0] < kw["p"] for row in u), sum(w[2] > 0 for w in want)
    assert binomial_ok(gated, len(pos), kw["p"]) and erased <= gated
    assert erased > 0 if kw["p"] > 0 else erased == 0
    if case == "large":  # the cases the test is there for: images left as they are, a width of crop refused
        assert erased < gated
        assert any(rejected_for_width_alone(crop, row, scale=kw["scale"], ratio=kw["ratio"]) for row in u)


def test_erase_params_divide_is_timms_count():
    """``divide`` per sample: timm's ``target_area = uniform(scale) * area / count``, draw for draw.

    Kills: the area multiplied by ``divide``; ``divide`` ignored."""
    crop, pos = 40, np.arange(1200)
    divide = 1 + pos % 4
    kw = dict(p=0.9, scale=(0.3, 0.9), ratio=(0.5, 2.0))
    got = erase_params(crop, seed=5, epoch=0, positions=pos, divide=divide, **kw)
    u = py_uniforms(5 ^ ERASE_SALT, 0, pos, 41)
    want = [tv_erasing(crop, row, count=int(c), **kw) for row, c in zip(u, divide)]
    assert [tuple(r) for r in got.tolist()] == want
    # the area shrinks with the count: the mean erased area of count c is about 1/c of count 1's
    areas = got[:, 2] * got[:, 3]
    mean = [areas[(divide == c) & (areas > 0)].mean() for c in (1, 2, 3, 4)]
    assert all(abs(mean[c - 1] * c / mean[0] - 1) < 0.2 for c in (2, 3, 4))


def test_erase_params_follow_torchvisions_own_get_params_in_law():
    """torchvision's ``RandomErasing.get_params`` itself on torch's generator (3000 draws) against 3000 of
    fastload's, on the "large" case: the rate of images left as they are (4.5 standard errors of the
    difference) and the laws of h, w, top and left of the erased ones (two-sample KS, p > ALPHA)."""
    crop, scale, ratio, n = 24, (0.5, 1.0), (0.4, 1.0), 3000
    ours = erase_params(crop, seed=2, epoch=1, positions=np.arange(n), p=1.0, scale=scale, ratio=ratio)
    torch.manual_seed(0)
    img = torch.zeros(3, crop, crop)
    theirs = []
    for _ in range(n):
        i, j, h, w, v = T.RandomErasing.get_params(img, scale=scale, ratio=ratio, value=[0.0])
        theirs.append((0, 0, 0, 0) if v is img else (i, j, h, w))  # the image itself: nothing erased
    theirs = np.array(theirs)
    kept_o, kept_t = (ours[:, 2] == 0).mean(), (theirs[:, 2] == 0).mean()
    q = (kept_o + kept_t) / 2
    assert 0.01 < q < 0.99 and abs(kept_o - kept_t) < 4.5 * math.sqrt(2 * q * (1 - q) / n)
    eo, et = ours[ours[:, 2] > 0], theirs[theirs[:, 2] > 0]
    for c in range(4):
        assert stats.ks_2samp(eo[:, c], et[:, c]).pvalue > ALPHA, "top left h w".split()[c]


# ----------------------------------------------------------------------------- erase_boxes


def timm_boxes(crop: int, seed: int, epoch: int, pos, *, p, scale, ratio, count):
    """timm's ``RandomErasing._erase`` with ``min_count, max_count = count``, written out over the
    module's streams: the gate from ``ERASE_SALT``'s first draw, the count (``randint``) from
    ``COUNT_SALT``'s, rectangle ``b`` from the stream of ``seed ^ (BOX_SALT * b)`` (``b = 0``: the seed
    itself, so one rectangle is torchvision's), each with ``area / count`` when ``max_count > 1``.
    Returns ``[n][max count]`` of ``(top, left, h, w)``."""
    lo, hi = count
    gate = [row[0] < p for row in py_uniforms(seed ^ ERASE_SALT, epoch, pos, 1)]
    counts = [timm_count(row[0], lo, hi) for row in py_uniforms(seed ^ COUNT_SALT, epoch, pos, 1)]
    out = [[(0, 0, 0, 0)] * hi for _ in pos]
    for b in range(hi):
        s = seed if b == 0 else seed ^ ((BOX_SALT * b) & _M64)
        for k, row in enumerate(py_uniforms(s ^ ERASE_SALT, epoch, pos, 41)):
            if gate[k] and b < counts[k]:
                out[k][b] = tv_erasing(crop, row, p=1.0, scale=scale, ratio=ratio, count=counts[k] if hi > 1 else 1)
    return out, counts, gate


@pytest.mark.parametrize(
    "count, p",
    [((1, 1), 0.6), ((1, 2), 0.7), ((1, 3), 0.8), ((2, 4), 1.0), ((3, 3), 0.5)],
    ids=["one", "1-2", "1-3", "2-4", "three"],
)
def test_erase_boxes_are_timms_random_erasing_written_out(count, p):
    """Every rectangle of 1000 images (seed 9, epoch 2), ``[n, max count, 4]`` int64, rows past an image's
    count zero.

    Kills: the count ``lo - k`` or drawn with ``/`` for ``*`` (always ``lo``) or over one more value; the
    area not divided by the count (also where the max count is 2); the rectangles' streams all the same;
    the output as floats; the gate or a stream's seed dropped."""
    crop, pos = 32, np.arange(1000)
    got = erase_boxes(crop, seed=9, epoch=2, positions=pos, p=p, count=count, **TV_ERASE)
    assert got.shape == (len(pos), count[1], 4) and got.dtype == np.int64
    want, counts, gate = timm_boxes(crop, 9, 2, pos, p=p, count=count, **TV_ERASE)
    bad = [k for k in range(len(pos)) if [tuple(r) for r in got[k].tolist()] != want[k]]
    assert not bad, f"{len(bad)} images differ, first {bad[0]}: {got[bad[0]].tolist()} != {want[bad[0]]}"
    # the law: erased at rate p, the count uniform over [min, max] (chi-square, p > ALPHA)
    assert binomial_ok(sum(gate), len(pos), p)
    if count[0] < count[1]:
        seen = np.bincount(np.array(counts) - count[0], minlength=count[1] - count[0] + 1)
        assert len(seen) == count[1] - count[0] + 1 and stats.chisquare(seen).pvalue > ALPHA
    drawn = (got[:, :, 2] > 0).sum(1)
    assert (drawn <= np.where(gate, counts, 0)).all() and drawn.max() == (count[1] if p > 0 else 0)


def test_erase_boxes_with_one_rectangle_are_torchvisions():
    """``count=(1, 1)``: torchvision's rectangle, draw for draw, in row 0 (the same draws ``erase_params``
    documents), with ``TV_ERASE`` at p 0.5 over positions 5000..5999."""
    pos = np.arange(5000, 6000)
    got = erase_boxes(32, seed=123, epoch=7, positions=pos, p=0.5, **TV_ERASE)
    u = py_uniforms(123 ^ ERASE_SALT, 7, pos, 41)
    assert got.shape == (1000, 1, 4)
    assert [tuple(r) for r in got[:, 0].tolist()] == [tv_erasing(32, row, p=0.5, **TV_ERASE) for row in u]


# ----------------------------------------------------------------------------- noise_seeds


def test_noise_seeds_are_the_53_bit_draws_of_their_own_stream():
    """The seed of each image's noise: the 53-bit integer of the first draw of ``seed ^ NOISE_SALT``'s stream
    (``floor(u * 2**53)``), uint64, all below 2**53, about half with the top bit (2**52) set.

    Kills: the seed or its salt dropped; another column; ``2**54`` for ``2**53``."""
    pos = np.arange(300, 2300)
    got = noise_seeds(seed=77, epoch=4, positions=pos)
    assert got.dtype == np.uint64 and got.shape == (len(pos),)
    want = [int(row[0] * (1 << 53)) for row in py_uniforms(77 ^ NOISE_SALT, 4, pos, 1)]
    assert [int(v) for v in got] == want
    assert max(want) < 1 << 53 and binomial_ok(sum(v >= 1 << 52 for v in want), len(pos), 0.5)
    assert len(set(want)) == len(want)
    # a function of the seed: the next seed gives other noise
    assert not np.isin(noise_seeds(seed=78, epoch=4, positions=pos), got).any()


# ----------------------------------------------------------------------------- color_params


COLOR_PARTS = ((0.6, 1.4), None, (0.5, 1.5), (-0.1, 0.1))


@pytest.mark.parametrize("p", [1.0, 0.8, 0.3])
def test_color_params_are_colorjitter_randomapply_and_grayscale_written_out(p):
    """Order, factors (NaN for a part off and for an image ``RandomApply`` skips) and the grayscale flag
    of 2000 images (seed 13, epoch 5), draw for draw; the rates of jitter and grayscale within 4.5
    standard errors.

    Kills: no order returned; a part's factor NaN (``None``) or read from the next part's draw; the
    ``RandomApply`` draw read from a column that does not exist."""
    pos = np.arange(2000)
    order, factors, gray = color_params(seed=13, epoch=5, positions=pos, parts=COLOR_PARTS, grayscale=0.3, p=p)
    assert order.shape == (2000, 4) and factors.shape == (2000, 4) and factors.dtype == np.float64
    assert gray.dtype == np.bool_ and gray.shape == (2000,)
    want = [tv_color(row, COLOR_PARTS, grayscale=0.3, p=p) for row in py_uniforms(13 ^ COLOR_SALT, 5, pos, 10)]
    assert order.tolist() == [w[0] for w in want]
    assert np.array_equal(factors, np.array([w[1] for w in want]), equal_nan=True)
    assert gray.tolist() == [w[2] for w in want]
    jittered = ~np.isnan(factors[:, 0])
    assert binomial_ok(int(jittered.sum()), 2000, p) and binomial_ok(int(gray.sum()), 2000, 0.3)
    assert np.isnan(factors[:, 1]).all() and (np.isnan(factors) == ~jittered[:, None]).all(axis=0)[[0, 2, 3]].all()


def test_color_params_follow_colorjitter_get_params_in_law():
    """torchvision's ``ColorJitter.get_params`` itself (6000 draws on torch's generator) against 6000 of
    fastload's: the same law of the 24 orders (two-sample chi-square, p > ALPHA) and of each factor
    (two-sample KS, p > ALPHA); fastload's factors of different parts, and the grayscale draw,
    uncorrelated (|r| < 4.5 / sqrt(n)).

    Kills: two parts' factors read from one draw (brightness from contrast's, hue from grayscale's)."""
    n, parts = 6000, ((0.6, 1.4), (0.7, 1.3), (0.5, 1.5), (-0.1, 0.1))
    order, factors, gray = color_params(seed=3, epoch=0, positions=np.arange(n), parts=parts, grayscale=0.5)
    torch.manual_seed(0)
    tv = [T.ColorJitter.get_params(*parts) for _ in range(n)]
    tv_order = [tuple(t[0].tolist()) for t in tv]
    cats = sorted(set(tv_order) | set(map(tuple, order.tolist())))
    assert len(cats) == 24
    table = [[tv_order.count(c) for c in cats], [list(map(tuple, order.tolist())).count(c) for c in cats]]
    assert stats.chi2_contingency(table).pvalue > ALPHA
    for k in range(4):
        assert stats.ks_2samp(factors[:, k], [t[1 + k] for t in tv]).pvalue > ALPHA, k
    tol = 4.5 / math.sqrt(n)
    cols = np.column_stack([factors, gray.astype(np.float64)])
    r = np.corrcoef(cols, rowvar=False)
    assert (np.abs(r[np.triu_indices(5, 1)]) < tol).all(), r


# ----------------------------------------------------------------------------- TrivialAugmentWide


@pytest.mark.parametrize("num_bins", [31, 11, 8, 2])
def test_trivial_magnitudes_are_torchvisions_augmentation_space_written_out(num_bins):
    """Each operation's bins, float64, to float32's precision (torchvision's linspace is float32; rtol
    1e-6); Posterize's exactly; none for the operations without magnitude.

    Kills: an operation's name misspelt (its bins lost); the bins' number not passed to linspace;
    Posterize's step multiplied."""
    space = tv_augmentation_space(num_bins)
    assert [name for name, _ in TRIVIAL_OPS] == list(space)
    for name, signed in TRIVIAL_OPS:
        want, tv_signed = space[name]
        got = trivial_magnitudes(name, num_bins)
        assert signed == tv_signed and got.dtype == np.float64, name
        if want is None:
            assert got.shape == (0,), name
        elif name == "Posterize":
            assert got.tolist() == [float(v) for v in want]
        else:
            assert got.shape == (num_bins,) and np.allclose(got, want, rtol=1e-6, atol=1e-6), name
    assert trivial_magnitudes("NoSuchOperation", num_bins).shape == (0,)


@pytest.mark.parametrize("num_bins", [31, 11, 8, 2, 15, 100])
def test_trivial_magnitudes_are_torchvisions_own_to_the_last_bit(num_bins):
    """torchvision's own ``_augmentation_space`` (torch's float32 ``linspace``), every bin equal as float64.

    The last bit matters: ``_apply_op`` translates by ``int(magnitude)`` pixels, and torch's float32
    linspace puts some bins one ulp below an integer (31 bins, the default: TranslateX's bin 15,
    ``32 * 15 / 30``), where NumPy's float32 linspace gives the integer itself, a pixel more.
    Kills: the bins from NumPy's float32 linspace (the bug this test was written for: that bin translated
    16 pixels where torchvision translates 15); the linspace in float64."""
    space = T.TrivialAugmentWide(num_magnitude_bins=num_bins)._augmentation_space(num_bins)
    one_below = False
    for name, _ in TRIVIAL_OPS:
        mags, _ = space[name]
        want = mags.double().numpy() if mags.ndim else np.zeros(0)
        got = trivial_magnitudes(name, num_bins)
        assert np.array_equal(got, want), (name, np.flatnonzero(got != want))
        if name in ("TranslateX", "TranslateY"):
            assert [int(v) for v in got] == [int(v) for v in want]
            one_below |= any(0 < round(v) - v < 1e-5 for v in want)  # an integer bin a float32 ulp short
    if num_bins in (31, 15):  # the case is there: 32 * 15 / 30 and 32 * 7 / 14 are 16 in exact arithmetic
        assert one_below


def test_trivial_magnitudes_do_not_follow_torchs_default_dtype():
    """With torch's default dtype set to float64 (torchvision's own bins then become float64) the bins are
    still torchvision's float32 ones: the draws of a run do not depend on a global setting.
    Kills: torch.linspace with the default dtype."""
    tv = T.TrivialAugmentWide(num_magnitude_bins=31)
    want = {name: m.double().numpy() for name, (m, _) in tv._augmentation_space(31).items() if m.ndim}
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        assert tv._augmentation_space(31)["TranslateX"][0][15].item() == 16.0  # the case: float64 bins differ
        got = {name: trivial_magnitudes(name, 31) for name in want}
    finally:
        torch.set_default_dtype(old)
    assert all(np.array_equal(got[name], want[name]) for name in want)


@pytest.mark.parametrize("num_bins", [31, 8])
def test_trivial_params_are_trivial_augment_wides_draws_written_out(num_bins):
    """Operation index (int64) and signed magnitude of 3000 images (seed 17, epoch 6), draw for draw:
    the same operation, the same sign, the magnitude to float32's precision.

    Kills: the operations' indices as floats; a positive magnitude doubled; the sign's draw or table
    dropped; the epoch not passed."""
    pos = np.arange(3000)
    ops, mags = trivial_params(seed=17, epoch=6, positions=pos, num_bins=num_bins)
    assert ops.dtype == np.int64 and mags.dtype == np.float64 and ops.shape == mags.shape == (3000,)
    space = tv_augmentation_space(num_bins)
    want = [tv_trivial(row, space) for row in py_uniforms(17 ^ TRIVIAL_SALT, 6, pos, 3)]
    assert ops.tolist() == [w[0] for w in want]
    wm = np.array([w[1] for w in want])
    assert np.array_equal(np.sign(mags), np.sign(wm)) and np.allclose(mags, wm, rtol=1e-6, atol=1e-6)
    # the law: every operation equally likely (chi-square), signed magnitudes negative half the time
    assert stats.chisquare(np.bincount(ops, minlength=14)).pvalue > ALPHA
    signed = np.array([TRIVIAL_OPS[o][1] for o in ops]) & (mags != 0)
    assert binomial_ok(int((mags[signed] < 0).sum()), int(signed.sum()), 0.5)


def test_trivial_params_depend_on_seed_epoch_and_position():
    """Another epoch or seed gives other draws; a slice of positions the same draws as the whole.

    Kills: the epoch replaced by None or dropped (errors), the seed not mixed in."""
    pos = np.arange(2000)
    ops, mags = trivial_params(seed=1, epoch=2, positions=pos, num_bins=31)
    ops2, mags2 = trivial_params(seed=1, epoch=2, positions=pos[500:700], num_bins=31)
    assert np.array_equal(ops[500:700], ops2) and np.array_equal(mags[500:700], mags2)
    for kw in (dict(seed=1, epoch=3), dict(seed=2, epoch=2)):
        o, _ = trivial_params(positions=pos, num_bins=31, **kw)
        assert (o == ops).mean() < 1 / 14 + 4.5 * math.sqrt((1 / 14) * (13 / 14) / 2000)
