"""Colour steps in the user's order: ColorJitter, RandomGrayscale, GaussianBlur, RandomSolarize... after one another.

The self-supervised recipes (SimCLR, MoCo v2, BYOL's two views, DINO's global and local views)
write ``RandomApply([ColorJitter], p)``, ``RandomGrayscale`` and then a blur and a solarize.
Oracles: torchvision's own ``Compose`` of those steps, run with its own random state on real
images, with its draws recorded where torchvision makes them (``ColorJitter.get_params``,
``GaussianBlur.get_params``, the grayscale and solarize calls), compared as distributions with
FastLoader's plans (chi-square, Kolmogorov-Smirnov, alpha = 0.001); and per pixel, torchvision's
own transform objects with one draw fixed, in the plan's order, on the PIL image of the same crop
(measured: identical, 0 levels, on every image).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fastload import ConfigError, FastLoader

pytest.importorskip("torchvision")
stats = pytest.importorskip("scipy.stats")

from PIL import Image  # noqa: E402
from torchvision import transforms as T  # noqa: E402
from torchvision.transforms import functional as F  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

from fastload.augment.policies import plan  # noqa: E402
from fastload.transforms import translate  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ALPHA = 0.001


def _recipes(api=T, blur=23):
    """The colour steps of each recipe's single view (after its crop and flip), as the papers' code writes them."""
    jitter = lambda b, c, s, h: api.RandomApply([api.ColorJitter(b, c, s, h)], p=0.8)  # noqa: E731
    gblur = lambda p: api.RandomApply([api.GaussianBlur(blur, sigma=(0.1, 2.0))], p=p)  # noqa: E731
    return {
        "simclr": [jitter(0.8, 0.8, 0.8, 0.2), api.RandomGrayscale(p=0.2), gblur(0.5)],
        "moco-v2": [jitter(0.4, 0.4, 0.4, 0.1), api.RandomGrayscale(p=0.2), gblur(0.5)],
        "byol-1": [jitter(0.4, 0.4, 0.2, 0.1), api.RandomGrayscale(p=0.2), gblur(1.0), api.RandomSolarize(128, p=0.0)],
        "byol-2": [jitter(0.4, 0.4, 0.2, 0.1), api.RandomGrayscale(p=0.2), gblur(0.1), api.RandomSolarize(128, p=0.2)],
        "dino-global-1": [jitter(0.4, 0.4, 0.2, 0.1), api.RandomGrayscale(p=0.2), api.GaussianBlur(blur, (0.1, 2.0))],
        "dino-global-2": [jitter(0.4, 0.4, 0.2, 0.1), api.RandomGrayscale(p=0.2), gblur(0.1), api.RandomSolarize(128, p=0.2)],
        "dino-local": [jitter(0.4, 0.4, 0.2, 0.1), api.RandomGrayscale(p=0.2), gblur(0.5)],
        "gray-then-jitter": [api.RandomGrayscale(p=0.3), api.ColorJitter(0.4, 0.4, 0.4, 0.1), api.RandomSolarize(100, p=0.5)],
    }


RECIPES = list(_recipes())
_NAMES = {"ColorJitter": "jitter", "Grayscale": "gray", "GaussianBlur": "blur", "Solarize": "solarize"}


def _record(monkeypatch) -> list:
    """Record, in order, torchvision's draws and calls: jitter (order, factors), grayscale, blur sigma, solarize."""
    events: list = []
    cj, gb = T.ColorJitter.get_params, T.GaussianBlur.get_params
    gray, sol = F.rgb_to_grayscale, F.solarize

    def jitter_params(*a):
        r = cj(*a)
        events.append(("jitter", tuple(r[0].tolist()), tuple(np.nan if v is None else v for v in r[1:])))
        return r

    def blur_params(*a):
        s = gb(*a)
        events.append(("blur", s))
        return s

    monkeypatch.setattr(T.ColorJitter, "get_params", staticmethod(jitter_params))
    monkeypatch.setattr(T.GaussianBlur, "get_params", staticmethod(blur_params))
    monkeypatch.setattr(F, "rgb_to_grayscale", lambda *a, **k: (events.append(("gray",)), gray(*a, **k))[1])
    monkeypatch.setattr(F, "solarize", lambda *a, **k: (events.append(("solarize",)), sol(*a, **k))[1])
    monkeypatch.setattr(F, "gaussian_blur", lambda img, *a, **k: img)  # its pixels do not change the draws; torch's
    return events  # convolution on the 2 shared cores was most of the run


@pytest.mark.parametrize("recipe", RECIPES)
def test_each_recipe_translates_to_one_chain_in_its_order(recipe):
    """Nothing is left in the fixed jitter/grayscale places: every colour step is a chain stage, in order."""
    for api in (T, v2):
        steps = _recipes(api)[recipe]
        a = translate(api.Compose([api.RandomResizedCrop(24), api.RandomHorizontalFlip(), *steps, api.ToTensor()
                                   if api is T else api.PILToTensor()]))  # fmt: skip
        assert a.jitter is None and a.grayscale == 0.0 and a.policy.kind == "chain", recipe
        names = [o.name for st in a.policy.stages for g in st.groups for o in g]
        want = {"gray-then-jitter": ["Grayscale", "ColorJitter", "Solarize"]}.get(recipe)
        if want is None:
            want = ["ColorJitter", "Grayscale", "GaussianBlur"] + (["Solarize"] if "Solarize" in str(steps) else [])
        assert names == want, (recipe, names)


@pytest.mark.parametrize("recipe", ["simclr", "byol-2", "dino-global-1", "gray-then-jitter"])
def test_which_steps_fire_and_their_draws_follow_torchvisions_own_compose(recipe, monkeypatch):
    """torchvision's Compose of the recipe's colour steps, run 4000 times on an image with its own RNG:
    the sequence of steps that fire (in order), the jitter's order of parts and each factor, and the blur's
    sigma, against FastLoader's plans of 4000 positions."""
    n = 4000
    steps = _recipes(T, blur=3)[recipe]  # the kernel does not change the draws; a small one keeps the run short
    events = _record(monkeypatch)
    torch.manual_seed(11)
    img = Image.fromarray(np.random.default_rng(3).integers(0, 256, (6, 6, 3), dtype=np.uint8))
    compose = T.Compose(steps)
    theirs = []
    for _ in range(n):
        del events[:]
        compose(img)
        theirs.append(list(events))
    monkeypatch.undo()
    pol = translate(T.Compose([T.RandomResizedCrop(24), *steps, T.PILToTensor()])).policy
    ours = [
        [("jitter", tuple(int(v) for v in a[:4]), a[4:]) if nm == "ColorJitter" else ("blur", a[2]) if nm == "GaussianBlur"
         else (_NAMES[nm],) for nm, a, _ in p]
        for p in plan(pol, seed=6, epoch=2, positions=np.arange(n))
    ]  # fmt: skip
    fired = [[tuple(e[0] for e in x) for x in side] for side in (theirs, ours)]
    patterns = sorted(set(fired[0]) | set(fired[1]))
    assert len(patterns) > 2 and set(fired[1]) <= set(fired[0])
    table = np.array([[f.count(p) for p in patterns] for f in fired])
    assert stats.chi2_contingency(table).pvalue > ALPHA, (recipe, patterns, table)
    jit = [[e for x in side for e in x if e[0] == "jitter"] for side in (theirs, ours)]
    orders = sorted({e[1] for e in jit[0]})
    assert len(orders) == 24
    table = np.array([[sum(e[1] == o for e in side) for o in orders] for side in jit])
    assert stats.chi2_contingency(table).pvalue > ALPHA
    for part in range(4):
        a, b = ([e[2][part] for e in side] for side in jit)
        assert stats.ks_2samp(a, b).pvalue > ALPHA, (recipe, part)
    sig = [[e[1] for x in side for e in x if e[0] == "blur"] for side in (theirs, ours)]
    if sig[0]:
        assert stats.ks_2samp(*sig).pvalue > ALPHA


def _torchvision_steps(steps: list, monkeypatch) -> list:
    """torchvision's own transform objects that make one planned draw: ColorJitter with its get_params fixed
    to the plan's order and factors, RandomGrayscale(p=1), GaussianBlur(sigma=(s, s)), RandomSolarize(p=1)."""
    out = []
    for name, args, _ in steps:
        if name == "ColorJitter":
            order, f = torch.tensor([int(v) for v in args[:4]]), [None if np.isnan(v) else float(v) for v in args[4:]]
            cj = T.ColorJitter(0.5, 0.5, 0.5, 0.1)
            monkeypatch.setattr(cj, "get_params", lambda *a, order=order, f=f: (order, *f))
            out.append(cj)
        elif name == "Grayscale":
            out.append(T.RandomGrayscale(p=1.0))
        elif name == "GaussianBlur":
            out.append(T.GaussianBlur(args[:2], sigma=(float(args[2]), float(args[2]))))
        else:
            assert name == "Solarize"
            out.append(T.RandomSolarize(args[0], p=1.0))
    return out


@pytest.mark.parametrize("recipe", ["simclr", "byol-2", "dino-global-1", "gray-then-jitter"])
def test_each_image_is_torchvisions_steps_in_order_on_the_same_crop(pixel_dataset, recipe, monkeypatch):
    """Through the loader: the recipe's uint8 batch equals, per image, torchvision's objects making the
    plan's draw, in its order, on the PIL image of the crop a loader without the colour steps gives
    (the same seed: the same crops). Measured: 0 levels (the jitter's hue included: the CPU graph makes PIL's HSV
    round trip) but for torchvision's GaussianBlur, whose separable kernel in the graph is one level off torch's
    2-D convolution on a few values."""
    steps = _recipes(T, blur=9)[recipe]
    kw = dict(device="cpu", seed=5, shuffle=False, progress=False)
    with FastLoader(pixel_dataset.packed, 24, transform=T.Compose([T.RandomResizedCrop(24), *steps, T.PILToTensor()]), **kw) as a, \
            FastLoader(pixel_dataset.packed, 24, transform=T.Compose([T.RandomResizedCrop(24), T.RandomInvert(p=0.0),
                                                                      T.PILToTensor()]), **kw) as b:  # fmt: skip
        # (the crops' loader carries a step of rate 0: the same graph, DALI's resize, nothing done)
        (got, _), (crops, _) = next(iter(a)), next(iter(b))
        plans = plan(a.augment.policy, seed=5, epoch=0, positions=np.arange(24))
    assert sum(len(p) for p in plans) > 24  # most images get several steps
    for j in range(24):
        pil = Image.fromarray(crops[j].permute(1, 2, 0).numpy())
        want = T.Compose(_torchvision_steps(plans[j], monkeypatch))(pil)
        d = (got[j].int() - torch.from_numpy(np.array(want)).permute(2, 0, 1).int()).abs()
        assert d.max() <= 1 and (d > 0).float().mean() <= 0.01, (recipe, j, plans[j])
        if not any(s[0] == "GaussianBlur" for s in plans[j]):
            assert d.max() == 0, (recipe, j, plans[j])


def test_normalised_batches_are_the_uint8_result_normalised(pixel_dataset):
    """SimCLR's view with ToTensor + Normalize: the uint8 result of the same chain, normalised (within
    float32 rounding), so the chain runs before normalisation on the 0..255 pixels."""
    steps = _recipes(T, blur=9)["simclr"]
    kw = dict(device="cpu", seed=8, shuffle=False, progress=False)
    norm = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), *steps, T.ToTensor(), T.Normalize(MEAN, STD)])
    raw = T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), *steps, T.PILToTensor()])
    with FastLoader(pixel_dataset.packed, 24, transform=norm, **kw) as a, FastLoader(pixel_dataset.packed, 24, transform=raw, **kw) as b:
        (x, _), (u8, _) = next(iter(a)), next(iter(b))
    want = (u8.float() / 255.0 - torch.tensor(MEAN).view(3, 1, 1)) / torch.tensor(STD).view(3, 1, 1)
    assert torch.allclose(x, want, atol=1e-5)


def test_the_fixed_order_keeps_its_draws():
    """ColorJitter then RandomGrayscale (and a chain before them) stay in their own places (the tensor
    formula's jitter and its draws), so the batches of these transforms do not change."""
    a = translate(T.Compose([T.RandomResizedCrop(24), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                             T.RandomGrayscale(0.2), T.ToTensor()]))  # fmt: skip
    assert a.policy is None and a.jitter.p == 0.8 and a.grayscale == 0.2
    b = translate(T.Compose([T.RandomResizedCrop(24), T.RandomSolarize(128, p=0.5), T.ColorJitter(0.4), T.ToTensor()]))
    assert b.jitter is not None and [o.name for st in b.policy.stages for g in st.groups for o in g] == ["Solarize"]


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([T.RandAugment(), T.ColorJitter(0.4), T.RandomGrayscale(0.2), T.ColorJitter(0.2)], "cannot hold the auto-augment"),
        ([T.TrivialAugmentWide(), T.ColorJitter(0.4), T.GaussianBlur(3)], "TrivialAugmentWide alone"),
        ([T.ColorJitter(0.4), T.RandAugment()], "after another colour step"),
        ([T.ColorJitter(0.4), T.RandomApply([T.RandomRotation(10)])], "cannot run inside it"),
    ],
    ids=["randaugment-then-reordered", "trivial-then-blur", "randaugment-after-jitter", "rotation"],
)
def test_orders_fastload_cannot_run_are_refused_naming_the_step(steps, message):
    with pytest.raises(ConfigError, match=message) as e:
        translate(T.Compose([T.RandomResizedCrop(24), *steps, T.ToTensor()]))
    assert "step " in str(e.value)


class TwoViews:
    """What SimCLR's and MoCo's scripts give the dataset: the same augmentation drawn twice per image."""

    def __init__(self, base):
        self.base = base

    def __call__(self, img):
        return [self.base(img), self.base(img)]


def _simclr_view(size: int):
    return T.Compose([T.RandomResizedCrop(size), T.RandomHorizontalFlip(), *_recipes(T, blur=3)["simclr"],
                      T.ToTensor(), T.Normalize(MEAN, STD)])  # fmt: skip


def test_a_simclr_shaped_loop_runs_with_its_two_view_transform(make_folder, tmp_path):
    """A SimCLR training loop with only DataLoader -> FastLoader changed: the two-view transform runs as it is
    (each image decoded once, both views in the graph), the two views of a batch are the same samples with different
    augmentations, and an NT-Xent loss falls."""
    from torchvision.datasets import ImageFolder

    root = make_folder(classes=2, per_class=6, size=(40, 32))
    kw = dict(device="cpu", progress=False, cache_dir=tmp_path / "c", drop_last=True)
    loader = FastLoader(ImageFolder(str(root), transform=TwoViews(_simclr_view(16))), 4, shuffle=True, seed=1, **kw)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, stride=2), torch.nn.ReLU(), torch.nn.AdaptiveAvgPool2d(1),
                              torch.nn.Flatten(), torch.nn.Linear(8, 16))  # fmt: skip
    opt = torch.optim.SGD(net.parameters(), lr=0.5)
    losses = []
    with loader:
        for epoch in range(6):
            loader.set_epoch(epoch)
            for (x1, x2), _ in loader:
                assert not torch.equal(x1, x2) and x1.shape == x2.shape == (4, 3, 16, 16)
                z = torch.nn.functional.normalize(net(torch.cat([x1, x2])), dim=1)
                sim = (z @ z.T / 0.5).fill_diagonal_(-1e9)
                target = torch.cat([torch.arange(4, 8), torch.arange(0, 4)])
                loss = torch.nn.functional.cross_entropy(sim, target)
                opt.zero_grad()
                loss.backward()
                opt.step()
                losses.append(float(loss.detach()))
    assert np.mean(losses[-3:]) < np.mean(losses[:3])


def test_a_jitter_beside_other_operations_in_one_stage_draws_independently_of_them():
    """RandomApply([ColorJitter, GaussianBlur]) and RandomOrder of the two: the jitter takes two slots of
    uniforms and the blur its own, so the blur's sigma is independent of the jitter's order (chi-square of
    the part that comes first against sigma's quartile, alpha = 0.001) and RandomOrder puts either first
    half the time (4 s.e.)."""
    n = 8000
    for stage in (T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.GaussianBlur(3, (0.1, 2.0))], p=1.0),
                  T.RandomOrder([T.ColorJitter(0.4, 0.4, 0.4, 0.1), T.GaussianBlur(3, (0.1, 2.0))])):  # fmt: skip
        pol = translate(T.Compose([T.RandomResizedCrop(24), stage, T.PILToTensor()])).policy
        plans = plan(pol, seed=12, epoch=0, positions=np.arange(n))
        assert all(sorted(s[0] for s in p) == ["ColorJitter", "GaussianBlur"] for p in plans)
        first = np.array([next(int(s[1][0]) for s in p if s[0] == "ColorJitter") for p in plans])
        sigma = np.array([next(s[1][2] for s in p if s[0] == "GaussianBlur") for p in plans])
        quart = np.digitize(sigma, np.quantile(sigma, [0.25, 0.5, 0.75]))
        table = np.array([[np.sum((first == a) & (quart == b)) for b in range(4)] for a in range(4)])
        assert stats.chi2_contingency(table).pvalue > ALPHA, type(stage).__name__
        if isinstance(stage, T.RandomOrder):
            jitter_first = np.mean([p[0][0] == "ColorJitter" for p in plans])
            assert abs(jitter_first - 0.5) < 4 * np.sqrt(0.25 / n)
