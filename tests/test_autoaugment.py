"""RandAugment and AutoAugment (torchvision's and timm's) and timm's RandomErasing, against the libraries' own objects.

Oracles: the laws are compared with what torchvision's and timm's objects themselves draw
(their operation calls recorded, their RNGs seeded), with chi-square and Kolmogorov-Smirnov
tests at alpha = 0.001; the pixels with timm's ``AugmentOp`` run on the same PIL image; the
level laws with timm's ``LEVEL_TO_ARG``. None of these expected values comes from FastLoader.
"""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from fastload import ConfigError, FastLoader

pytest.importorskip("torchvision")
timm_aa = pytest.importorskip("timm.data.auto_augment")
stats = pytest.importorskip("scipy.stats")

from PIL import Image  # noqa: E402
from timm.data.random_erasing import RandomErasing as TimmErasing  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from fastload.augment import erase_boxes  # noqa: E402
from graphrun import assert_like, like, run_graph  # noqa: E402
from fastload.augment.policies import TIMM_OPS, plan, timm_args  # noqa: E402
from fastload.augment.settings import Erasing, Op, Policy  # noqa: E402
from fastload.transforms import translate  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ALPHA = 0.001


def _same_law(a, b) -> float:
    """p-value of a chi-square test that two samples of categories come from one law."""
    cats = sorted(set(a) | set(b), key=repr)
    table = np.array([[list(x).count(c) for c in cats] for x in (a, b)])
    return stats.chi2_contingency(table[:, table.sum(0) > 0]).pvalue


def _timm_policy(config="rand-m9-mstd0.5-inc1", size=224):
    hp = dict(translate_const=int(size * 0.45), img_mean=(124, 116, 104), interpolation=Image.BICUBIC)
    if config.startswith("rand"):
        return timm_aa.rand_augment_transform(config, hp)
    return timm_aa.auto_augment_transform(config, hp)


def _translated(t):
    return translate(T.Compose([T.RandomResizedCrop(24), t, T.PILToTensor()])).policy


# ----------------------------------------------------------------------------- timm's laws


def test_timm_level_laws_are_timms():
    """Each operation's arguments at 41 levels, both signs, equal timm's LEVEL_TO_ARG (which draws its sign)."""
    hp = {"translate_const": 100, "translate_pct": 0.3, "img_mean": (1, 2, 3)}
    op = Op(name="any", translate_const=100, translate_pct=0.3)
    random.seed(0)
    for name in TIMM_OPS:
        fn = timm_aa.LEVEL_TO_ARG[name]
        for level in np.linspace(0.0, 10.0, 41).tolist():
            seen = {tuple(fn(level, hp)) if fn else () for _ in range(60)}
            assert seen == {timm_args(name, level, neg, op) for neg in (False, True)}, (name, level)


def _timm_calls(t, n: int) -> list[list[tuple]]:
    """Run timm's own RandAugment/AutoAugment ``n`` times, recording each operation it applies and its arguments."""
    calls: list[list[tuple]] = []
    ops = t.ops if hasattr(t, "ops") else [op for sub in t.policy for op in sub]
    for op in ops:
        op.aug_fn = (lambda name: lambda img, *args, **kw: (calls[-1].append((name, args)), img)[1])(op.name)
    img = Image.new("RGB", (8, 8))
    random.seed(1), np.random.seed(1)
    for _ in range(n):
        calls.append([])
        t(img)
    return calls


@pytest.mark.parametrize("config", ["rand-m9-mstd0.5-inc1", "rand-m7-n3-p0.8", "original-mstd0.5", "rand-m9-n3-tweights-p1.0",
                                    "rand-m9-mstd0.5-t3aw"])  # fmt: skip
def test_timm_draws_follow_timms_own_objects(config):
    """Operations per image, which operations, and the argument law of a signed and a discrete one."""
    n = 6000
    theirs = _timm_calls(_timm_policy(config), n)
    pol = translate(T.Compose([T.RandomResizedCrop(224), _timm_policy(config), T.PILToTensor()])).policy
    ours = [[(name, args) for name, args, _ in steps] for steps in plan(pol, seed=5, epoch=0, positions=np.arange(n))]
    assert _same_law([len(c) for c in ours], [len(c) for c in theirs]) > ALPHA
    flat_o, flat_t = [s for c in ours for s in c], [s for c in theirs for s in c]
    assert _same_law([s[0] for s in flat_o], [s[0] for s in flat_t]) > ALPHA
    if "tweights" in config:  # drawn without replacement: never one operation twice in an image, in either
        assert all(len({s[0] for s in c}) == len(c) for c in ours + theirs)
        assert _same_law([tuple(s[0] for s in c) for c in ours], [tuple(s[0] for s in c) for c in theirs]) > ALPHA
    for name in ("Rotate", "ShearX"):
        a = [s[1][0] for s in flat_o if s[0] == name]
        b = [s[1][0] for s in flat_t if s[0] == name]
        if a or b:
            assert stats.ks_2samp(a, b).pvalue > ALPHA, name
    for name in ("PosterizeIncreasing", "PosterizeOriginal", "SolarizeIncreasing", "Solarize"):
        a = [s[1] for s in flat_o if s[0] == name]
        b = [s[1] for s in flat_t if s[0] == name]
        if len(a) > 50 and len(b) > 50:
            assert _same_law(a, b) > ALPHA, name


@pytest.mark.parametrize("name", TIMM_OPS)
def test_each_timm_operation_is_timms_on_the_uint8_crop(pixel_dataset, name):
    """Oracle: timm's AugmentOp (prob 1, no magnitude noise) on the PIL image of the same crop, at levels 0..10;
    its random sign is one of the two FastLoader can draw; the graph within the difference measured per operation."""
    with FastLoader(pixel_dataset.packed, 24, device="cpu", crop=24, seed=4, flip=0.0, mean=None, std=None) as b:
        u8, _ = next(iter(b))
    hp = dict(translate_const=10, translate_pct=0.3, img_mean=(124, 116, 104), interpolation=Image.BICUBIC)
    fill = (124.0, 116.0, 104.0)
    ops = [Op(name=name, magnitude=float(j % 11), translate_const=10, translate_pct=0.3) for j in range(24)]
    plans = [[(name, timm_args(name, float(j % 11), neg, ops[j]), "bicubic")] for neg in (False, True) for j in range(24)]
    got = run_graph(torch.cat([u8, u8]), plans, library="timm", fill=fill)  # one batch: both signs of every level
    for j in range(24):
        random.seed(j)
        want = torch.from_numpy(np.array(timm_aa.AugmentOp(name, prob=1.0, magnitude=float(j % 11), hparams=hp)(
            Image.fromarray(u8[j].permute(1, 2, 0).numpy())))).permute(2, 0, 1)  # fmt: skip
        assert like(got[j], want, name, "bicubic") or like(got[24 + j], want, name, "bicubic"), (name, j % 11)


def test_timm_forms_fastload_cannot_run_are_refused_by_name():
    weighted = timm_aa.rand_augment_transform("rand-m9-n3-t3a", {"translate_const": 100})
    weighted.choice_weights = np.array([1.0, 1.0, 0.0])  # three layers, two operations to draw from
    with pytest.raises(ConfigError, match="RandAugment.*step 2 of 3.*at least num_ops=3 of them above 0"):
        _translated(weighted)
    blur = timm_aa.rand_augment_transform("rand-m9-t3a", {"translate_const": 100})  # has no GaussianBlurRand
    assert {o.name for o in _translated(blur).ops} == {"SolarizeIncreasing", "Desaturate", "GaussianBlur"}
    augmix = timm_aa.augment_and_mix_transform("augmix-m5-w4-d2", {"translate_const": 100})
    with pytest.raises(ConfigError, match="AugMixAugment.*step 2 of 3.*AugMix"):
        _translated(augmix)
    with pytest.raises(ConfigError, match="RandAugment.*TrivialAugmentWide after another colour step|after another"):
        translate(T.Compose([T.RandomResizedCrop(24), _timm_policy(), T.TrivialAugmentWide(), T.PILToTensor()]))


# ----------------------------------------------------------------------------- torchvision's RandAugment, AutoAugment


def _torchvision_calls(t, n: int, monkeypatch) -> list[list[tuple]]:
    """Run torchvision's own object ``n`` times on a 24 x 24 image, recording each ``_apply_op`` it makes."""
    from torchvision.transforms import autoaugment

    calls: list[list[tuple]] = []

    def record(img, op_name, magnitude, interpolation, fill):
        calls[-1].append((op_name, round(float(magnitude), 4)))
        return img

    monkeypatch.setattr(autoaugment, "_apply_op", record)
    img = Image.new("RGB", (24, 24))
    torch.manual_seed(2)
    for _ in range(n):
        calls.append([])
        t(img)
    return calls


@pytest.mark.parametrize("make", [lambda: T.RandAugment(), lambda: T.RandAugment(num_ops=3, magnitude=14),
                                  lambda: T.AutoAugment(), lambda: T.AutoAugment(T.AutoAugmentPolicy.SVHN)],
                         ids=["ra", "ra-n3-m14", "aa-imagenet", "aa-svhn"])  # fmt: skip
def test_torchvision_draws_follow_torchvisions_own_objects(make, monkeypatch):
    """Operations per image and the joint law of (operation, signed magnitude), chi-square at alpha 0.001."""
    n = 6000
    theirs = _torchvision_calls(make(), n, monkeypatch)
    monkeypatch.undo()
    pol = _translated(make())
    ours = [[(nm, round(a[0], 4)) for nm, a, _ in steps] for steps in plan(pol, seed=9, epoch=3, positions=np.arange(n))]
    assert _same_law([len(c) for c in ours], [len(c) for c in theirs]) > ALPHA
    flat_o, flat_t = [s for c in ours for s in c], [s for c in theirs for s in c]
    assert set(flat_o) == set(flat_t)  # the same magnitudes, from the same bins
    assert _same_law([s[0] for s in flat_o], [s[0] for s in flat_t]) > ALPHA
    assert _same_law([np.sign(s[1]) for s in flat_o], [np.sign(s[1]) for s in flat_t]) > ALPHA


def test_v1_and_v2_objects_translate_alike_and_v2_thresholds_are_in_255ths():
    """v2 keeps Solarize's thresholds as fractions of the dtype's maximum; on uint8 pixels they are v1's levels."""
    for a, b in ((T.RandAugment(), v2.RandAugment()), (T.AutoAugment(), v2.AutoAugment())):
        pa = translate(T.Compose([T.RandomResizedCrop(24), a, T.PILToTensor()])).policy
        pb = translate(v2.Compose([v2.RandomResizedCrop(24), b, v2.PILToTensor()])).policy
        xs = pa.ops or tuple(o for s in pa.sub_policies for o in s)
        ys = pb.ops or tuple(o for s in pb.sub_policies for o in s)
        assert [(o.name, o.signed, o.prob) for o in xs] == [(o.name, o.signed, o.prob) for o in ys]
        assert np.allclose([o.magnitude for o in xs], [o.magnitude for o in ys], atol=1e-3)


def test_torchvision_invert_and_a_policy_through_the_loader(pixel_dataset):
    """Invert (AutoAugment's only operation TrivialAugmentWide lacks) is torchvision's F.invert on the crop; a
    RandAugment loader gives the same batches for the same seed, other ones for another seed."""
    import torchvision.transforms.functional as F

    with FastLoader(pixel_dataset.packed, 24, device="cpu", crop=24, seed=4, flip=0.0, mean=None, std=None) as b:
        u8, _ = next(iter(b))
    got = run_graph(u8, [[("Invert", (0.0,), "nearest")]] * 24, library="torchvision")
    assert torch.equal(got, F.invert(u8))
    tf = T.Compose([T.RandomResizedCrop(24), T.RandAugment(num_ops=2, magnitude=9), T.ToTensor(), T.Normalize(MEAN, STD)])
    batches = []
    for seed in (1, 1, 2):
        with FastLoader(pixel_dataset.packed, 8, device="cpu", transform=tf, seed=seed) as ld:
            assert ld.augment.policy is not None
            batches.append(torch.cat([x for x, _ in ld]))
    assert torch.equal(batches[0], batches[1]) and not torch.equal(batches[0], batches[2])


def test_policy_settings_are_checked_naming_the_value():
    with pytest.raises(ConfigError, match="policy library"):
        Policy(library="kornia", kind="rand", ops=(Op(name="Rotate"),))
    with pytest.raises(ConfigError, match="needs ops"):
        Policy(library="timm", kind="rand")
    with pytest.raises(ConfigError, match="prob must be a probability"):
        Op(name="Rotate", prob=1.5)
    with pytest.raises(ConfigError, match="num_ops must be an int"):
        Policy(library="timm", kind="rand", ops=(Op(name="Rotate"),), num_ops=2.5)
    with pytest.raises(ConfigError, match="interpolation"):
        Policy(library="timm", kind="rand", ops=(Op(name="Rotate"),), interpolation="lanczos")
    with pytest.raises(ConfigError, match="magnitude 31 must be a bin index"):
        _translated(T.RandAugment(magnitude=31))


# ----------------------------------------------------------------------------- timm's RandomErasing


def _timm_rects(t, n: int, crop: int, monkeypatch) -> tuple[list[int], list[tuple[int, int]]]:
    """Rectangles per image and their (h, w), as timm's own object draws them (its pixel source recorded)."""
    import timm.data.random_erasing as re_mod

    counts, sizes = [], []

    def record(per_pixel, rand_color, patch_size, dtype=torch.float32, device="cuda"):
        counts[-1] += 1
        sizes.append(tuple(patch_size[1:]))
        return torch.zeros(patch_size[0], 1, 1, dtype=dtype)

    monkeypatch.setattr(re_mod, "_get_pixels", record)
    random.seed(3)
    img = torch.ones(3, crop, crop)
    for _ in range(n):
        counts.append(0)
        t(img)
    return counts, sizes


@pytest.mark.parametrize("count", [1, 3])
def test_timm_erasing_follows_timms_own_object(count, monkeypatch):
    """Rate and number of rectangles (chi-square), area and aspect of each (KS), at alpha 0.001."""
    n, crop = 6000, 32
    t = TimmErasing(0.4, mode="const", max_count=count, device="cpu")
    counts_t, sizes_t = _timm_rects(t, n, crop, monkeypatch)
    er = translate(T.Compose([T.RandomResizedCrop(crop), T.ToTensor(), t])).erasing
    assert er.count == (1, count) and er.noise is None and er.value == (0.0,)
    boxes = erase_boxes(crop, seed=8, epoch=1, positions=np.arange(n), p=er.p, scale=er.scale, ratio=er.ratio, count=er.count)
    counts_o = (boxes[:, :, 2] > 0).sum(1).tolist()
    sizes_o = [(int(h), int(w)) for h, w in boxes[:, :, 2:].reshape(-1, 2) if h > 0]
    assert _same_law(counts_o, counts_t) > ALPHA
    for f in (lambda hw: hw[0] * hw[1], lambda hw: np.log(hw[0] / hw[1])):
        assert stats.ks_2samp([f(s) for s in sizes_o], [f(s) for s in sizes_t]).pvalue > ALPHA


@pytest.mark.parametrize("mode", ["pixel", "rand"])
def test_erasing_noise_is_standard_normal_where_it_erases_and_nowhere_else(pixel_dataset, mode):
    """timm's 'pixel' (a draw per pixel and channel) and 'rand' (one per channel and rectangle) against the
    same loader without erasing: only one rectangle per image changes, its values standard normal (KS)."""
    base = [T.RandomResizedCrop(24), T.ToTensor(), T.Normalize(MEAN, STD)]
    kw = dict(device="cpu", seed=6)
    with FastLoader(pixel_dataset.packed, 24, transform=T.Compose(base + [T.RandomErasing(0.0)]), **kw) as a, \
            FastLoader(pixel_dataset.packed, 24, transform=T.Compose(base + [TimmErasing(1.0, mode=mode, device="cpu")]), **kw) as b, \
            FastLoader(pixel_dataset.packed, 24, transform=T.Compose(base + [TimmErasing(1.0, mode=mode, device="cpu")]), **kw) as c:  # fmt: skip
        (x, _), (y, _), (z, _) = next(iter(a)), next(iter(b)), next(iter(c))
    assert torch.equal(y, z)  # the same seed, the same noise
    values = []
    for j in range(len(x)):
        mask = (x[j] != y[j]).any(0)  # (the plain loader erases at rate 0: the same graph)
        if not mask.any():
            continue
        rows, cols = mask.any(1).nonzero(), mask.any(0).nonzero()
        box = y[j][:, rows.min() : rows.max() + 1, cols.min() : cols.max() + 1]
        assert mask.sum() == box.shape[1] * box.shape[2]  # one rectangle, every pixel of it changed
        if mode == "rand":
            assert (box == box[:, :1, :1]).all()
            values += box[:, 0, 0].tolist()
        else:
            values += box.flatten().tolist()
    assert len(values) >= 60 and stats.kstest(values, "norm").pvalue > ALPHA


def test_torchvisions_random_value_is_pixel_noise_and_erasing_settings_are_checked():
    er = translate(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.RandomErasing(value="random")])).erasing
    assert er.noise == "pixel" and er.count == (1, 1)
    er2 = translate(v2.Compose([v2.RandomResizedCrop(24), v2.ToImage(), v2.ToDtype(torch.float32, scale=True),
                                v2.RandomErasing(value="random")])).erasing  # fmt: skip
    assert er2 == er
    with pytest.raises(ConfigError, match="erasing noise must be"):
        Erasing(noise="gauss")
    with pytest.raises(ConfigError, match=r"erasing count max must be an int in \[2, 64\]"):
        Erasing(count=(2, 1))


@pytest.mark.gpu
def test_policies_and_noise_erasing_on_cuda_batches(pixel_dataset):
    """On CUDA the same graph runs on the device: DeiT's transform gives finite batches, the same for the same
    seed, and other ones for another seed."""
    tf = T.Compose([T.RandomResizedCrop(24), _timm_policy("rand-m9-mstd0.5-inc1", 24), T.ToTensor(),
                    T.Normalize(MEAN, STD), TimmErasing(0.5, mode="pixel", device="cpu")])  # fmt: skip
    runs = []
    for seed in (3, 3, 4):
        with FastLoader(pixel_dataset.packed, 8, device="cuda", transform=tf, seed=seed) as ld:
            runs.append(torch.cat([x for x, _ in ld]).cpu())
    assert torch.isfinite(runs[0]).all() and torch.equal(runs[0], runs[1]) and not torch.equal(runs[0], runs[2])


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([T.ToTensor(), T.RandAugment()], "RandAugment on a float tensor"),
        ([T.ToTensor(), T.TrivialAugmentWide()], "TrivialAugmentWide on a float tensor"),
        ([T.PILToTensor(), _timm_policy("rand-m9", 24)], "RandAugment on a tensor"),
    ],
    ids=["ra-float", "ta-float", "timm-tensor"],
)
def test_auto_augments_on_float_or_tensor_images_are_refused(steps, message):
    """torchvision's thresholds and posterize bits mean 0..255 levels (on floats torchvision solarizes nothing
    and cannot posterize); timm's operations take PIL images only."""
    with pytest.raises(ConfigError, match=message):
        translate(T.Compose([T.RandomResizedCrop(24), *steps]))
    ok = translate(T.Compose([T.RandomResizedCrop(24), T.PILToTensor(), T.RandAugment()]))  # uint8 tensors: fine
    assert ok.policy is not None


@pytest.mark.parametrize("op", ["ShearX", "ShearY", "TranslateX", "Rotate"])
def test_bicubic_geometric_operations_are_torchvisions(pixel_dataset, op):
    """torchvision's references pass --interpolation to TrivialAugmentWide, RandAugment and AutoAugment: their
    bicubic geometric operations against torchvision's _apply_op with BICUBIC on the PIL image of each crop."""
    from torchvision.transforms import InterpolationMode, autoaugment

    from fastload.augment import TRIVIAL_OPS

    with FastLoader(pixel_dataset.packed, 24, device="cpu", crop=24, seed=4, flip=0.0, mean=None, std=None) as b:
        u8, _ = next(iter(b))
    mags = np.linspace(-0.6, 0.6, 24) * (40.0 if op == "Rotate" else 12.0 if op == "TranslateX" else 1.0)
    assert op in [n for n, _ in TRIVIAL_OPS]  # TrivialAugmentWide's operations are the policies' (one table)
    ra = run_graph(u8, [[(op, (float(m),), "bicubic")] for m in mags], library="torchvision")
    for j in range(24):
        want = autoaugment._apply_op(Image.fromarray(u8[j].permute(1, 2, 0).numpy()), op, float(mags[j]),
                                     interpolation=InterpolationMode.BICUBIC, fill=None)  # fmt: skip
        want = torch.from_numpy(np.array(want)).permute(2, 0, 1)
        assert_like(ra[j], want, op, "bicubic", j)
    for t in (T.TrivialAugmentWide(interpolation=InterpolationMode.BICUBIC), T.RandAugment(interpolation=InterpolationMode.BICUBIC),
              T.AutoAugment(interpolation=InterpolationMode.BICUBIC)):  # fmt: skip
        a = translate(T.Compose([T.RandomResizedCrop(24, interpolation=InterpolationMode.BICUBIC), t, T.PILToTensor()]))
        assert (a.trivial.interpolation if a.trivial else a.policy.interpolation[0]) == "bicubic"
