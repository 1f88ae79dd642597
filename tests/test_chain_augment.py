"""RandomApply, RandomChoice, GaussianBlur and torchvision's single colour operations, against torchvision.

Oracles: torchvision's own transform objects (p=1, a fixed sigma) on the PIL image of the
same crop, per pixel; their laws (``RandomChoice``'s weights, ``RandomApply``'s gate,
``GaussianBlur.get_params``) drawn by torchvision itself, compared with chi-square and
Kolmogorov-Smirnov tests at alpha = 0.001.
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
from torchvision.transforms import v2  # noqa: E402

from fastload.augment import color_params  # noqa: E402
from graphrun import assert_like, run_graph  # noqa: E402
from fastload.augment.policies import plan  # noqa: E402
from fastload.transforms import translate  # noqa: E402

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
ALPHA = 0.001


def _chain(*steps, api=T):
    return translate(api.Compose([api.RandomResizedCrop(24), *steps, api.PILToTensor()])).policy


@pytest.fixture(scope="module")
def crops(pixel_dataset):
    with FastLoader(pixel_dataset.packed, 24, device="cpu", crop=24, seed=4, flip=0.0, mean=None, std=None) as b:
        u8, _ = next(iter(b))
    return u8


OPS = {
    "solarize": lambda api: api.RandomSolarize(100, p=1.0),
    "posterize": lambda api: api.RandomPosterize(3, p=1.0),
    "sharpness": lambda api: api.RandomAdjustSharpness(2.5, p=1.0),
    "sharpness-blur": lambda api: api.RandomAdjustSharpness(0.2, p=1.0),
    "autocontrast": lambda api: api.RandomAutocontrast(p=1.0),
    "equalize": lambda api: api.RandomEqualize(p=1.0),
    "invert": lambda api: api.RandomInvert(p=1.0),
    "grayscale": lambda api: api.Grayscale(3),
    "blur": lambda api: api.GaussianBlur(5, sigma=(1.3, 1.3)),
    "blur-wide": lambda api: api.GaussianBlur((3, 7), sigma=(0.6, 0.6)),
}


@pytest.mark.parametrize("api", [T, v2], ids=["v1", "v2"])
@pytest.mark.parametrize("name", list(OPS))
def test_each_operation_is_torchvisions_on_the_crop(crops, name, api):
    """Oracle: the torchvision object itself on the PIL image of each crop (what a DataLoader worker holds)."""
    t = OPS[name](api)
    if name == "grayscale":  # alone it is the grayscale setting; inside RandomChoice it is a chain operation
        pol = _chain(api.RandomChoice([t]), api=api)
    else:
        pol = _chain(t, api=api)
    steps = plan(pol, seed=1, epoch=0, positions=np.arange(len(crops)))
    got = run_graph(crops, steps, library="torchvision")
    for j in range(len(crops)):
        want = torch.from_numpy(np.array(t(Image.fromarray(crops[j].permute(1, 2, 0).numpy())))).permute(2, 0, 1)
        assert_like(got[j], want, steps[j][0][0] if steps[j] else "Identity", "bilinear", (name, j))


def test_choice_weights_gate_and_sigma_follow_torchvisions_own_draws():
    """RandomChoice (uniform, and weights 1:2:5) and RandomApply's p counted on torchvision's objects holding
    recorders; GaussianBlur's sigma from GaussianBlur.get_params; each against FastLoader's plan."""
    import random

    n = 6000
    picked: list[int] = []
    recorders = [(lambda k: lambda img: (picked.append(k), img)[1])(k) for k in range(3)]
    ops = [T.RandomInvert(p=1.0), T.RandomEqualize(p=1.0), T.RandomAutocontrast(p=1.0)]
    names = ["Invert", "Equalize", "AutoContrast"]
    for weights in (None, [1.0, 2.0, 5.0]):
        picked.clear()
        random.seed(4)
        chooser = T.RandomChoice(recorders, p=weights)
        for _ in range(n):
            chooser(None)
        ours = [names.index(s[0][0]) for s in plan(_chain(T.RandomChoice(ops, p=weights)), seed=2, epoch=0, positions=np.arange(n))]
        table = np.array([np.bincount(picked, minlength=3), np.bincount(ours, minlength=3)])
        assert stats.chi2_contingency(table).pvalue > ALPHA, weights
    applied = []
    torch.manual_seed(5)
    gate = T.RandomApply([lambda img: (applied.append(1), img)[1]], p=0.3)
    for _ in range(n):
        gate(None)
    ours = sum(bool(s) for s in plan(_chain(T.RandomApply([T.RandomInvert(1.0)], p=0.3)), seed=3, epoch=0, positions=np.arange(n)))
    assert stats.chi2_contingency([[len(applied), n - len(applied)], [ours, n - ours]]).pvalue > ALPHA
    torch.manual_seed(6)
    theirs = [T.GaussianBlur.get_params(0.1, 2.0) for _ in range(n)]
    sig = [s[0][1][2] for s in plan(_chain(T.GaussianBlur(5, (0.1, 2.0))), seed=4, epoch=0, positions=np.arange(n))]
    assert stats.ks_2samp(sig, theirs).pvalue > ALPHA


def test_random_order_follows_torchvisions_shuffle():
    """The six orders of three operations: as often as torchvision's RandomOrder (holding recorders) gives each."""
    import random

    n = 6000
    seen: list[int] = []
    recorders = [(lambda k: lambda img: (seen.append(k), img)[1])(k) for k in range(3)]
    random.seed(7)
    shuffler = T.RandomOrder(recorders)
    for _ in range(n):
        shuffler(None)
    theirs = [tuple(seen[3 * i : 3 * i + 3]) for i in range(n)]
    names = ["Invert", "Equalize", "AutoContrast"]
    pol = _chain(T.RandomOrder([T.RandomInvert(1.0), T.RandomEqualize(1.0), T.RandomAutocontrast(1.0)]))
    ours = [tuple(names.index(s[0]) for s in steps) for steps in plan(pol, seed=5, epoch=1, positions=np.arange(n))]
    orders = sorted(set(theirs))
    assert len(orders) == 6 and set(ours) == set(orders)
    table = np.array([[x.count(o) for o in orders] for x in (theirs, ours)])
    assert stats.chi2_contingency(table).pvalue > ALPHA


def test_random_apply_of_a_jitter_gates_whole_images_at_p():
    """RandomApply([ColorJitter], 0.8): every part of an image jittered, or none, 80 % of images (4 s.e.)."""
    tf = T.Compose([T.RandomResizedCrop(24), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                    T.RandomGrayscale(0.2), T.ToTensor()])  # fmt: skip
    a = translate(tf)
    assert a.jitter.p == 0.8 and a.grayscale == 0.2 and a.policy is None
    n = 20000
    _, factors, _ = color_params(seed=1, epoch=0, positions=np.arange(n), parts=a.jitter.parts, grayscale=0.2, p=0.8)
    on = ~np.isnan(factors)
    assert (on.all(1) | ~on.any(1)).all()
    assert abs(on.all(1).mean() - 0.8) < 4 * np.sqrt(0.16 / n)
    g = translate(T.Compose([T.RandomResizedCrop(24), T.RandomApply([T.RandomGrayscale(0.5)], p=0.4), T.ToTensor()]))
    assert g.grayscale == pytest.approx(0.2)


def test_three_augment_runs_through_the_loader_seeded(pixel_dataset):
    """DeiT's --ThreeAugment spelt with torchvision's classes: RandomChoice(grayscale, solarize, blur) + jitter."""
    tf = T.Compose([
        T.RandomResizedCrop(24, interpolation=3), T.RandomHorizontalFlip(),
        T.RandomChoice([T.Grayscale(3), T.RandomSolarize(128, p=1.0), T.GaussianBlur(5, (0.1, 2.0))]),
        T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(), T.Normalize(MEAN, STD),
    ])  # fmt: skip
    out = []
    for seed in (1, 1, 2):
        with FastLoader(pixel_dataset.packed, 8, device="cpu", transform=tf, seed=seed) as ld:
            assert ld.augment.policy.kind == "chain" and ld.augment.jitter is not None
            out.append(torch.cat([x for x, _ in ld]))
    assert torch.equal(out[0], out[1]) and not torch.equal(out[0], out[2])


@pytest.mark.parametrize(
    ("steps", "message"),
    [
        ([T.RandomOrder([T.RandomInvert()] * 6)], "RandomOrder of more than 5"),
        ([T.RandomApply([T.RandomRotation(10)])], "cannot run inside it"),
        ([T.TrivialAugmentWide(), T.ColorJitter(0.4), T.RandomApply([T.GaussianBlur(3)])], "TrivialAugmentWide alone"),
        ([T.RandomChoice([T.Grayscale(1)])], "one output channel"),
        ([T.Grayscale(1)], "one output channel"),
        ([T.RandAugment(), T.GaussianBlur(3)], "one auto-augment"),
    ],
    ids=["order", "rotation-inside", "trivial-jitter-blur", "one-channel-inside", "one-channel", "after-randaugment"],
)
def test_chains_fastload_cannot_run_are_refused_naming_the_step(steps, message):
    with pytest.raises(ConfigError, match=message) as e:
        translate(T.Compose([T.RandomResizedCrop(24), *steps, T.ToTensor()]))
    assert "step " in str(e.value)


def test_posterize_on_floats_is_refused_and_solarize_on_floats_is_scaled():
    with pytest.raises(ConfigError, match="RandomPosterize needs uint8"):
        translate(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.RandomPosterize(3)]))
    pol = translate(T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.RandomSolarize(0.5)])).policy
    assert pol.stages[0].groups[0][0].magnitude == pytest.approx(127.5)


def test_three_augment_assigned_after_construction_is_translated_then(make_folder, tmp_path):
    """DeiT's --ThreeAugment assigns data_loader_train.dataset.transform after the loader is built: the chain
    and jitter are in the loader's settings from then on, as the same transform given at construction."""
    from torchvision.datasets import ImageFolder

    three = T.Compose([
        T.RandomResizedCrop(24, interpolation=3), T.RandomHorizontalFlip(),
        T.RandomChoice([T.Grayscale(3), T.RandomSolarize(128, p=1.0), T.GaussianBlur(5, (0.1, 2.0))]),
        T.ColorJitter(0.3, 0.3, 0.3), T.ToTensor(), T.Normalize(MEAN, STD),
    ])  # fmt: skip
    root = make_folder(classes=2, per_class=4, size=(64, 48))
    kw = dict(device="cpu", progress=False, cache_dir=tmp_path / "c", seed=2, shuffle=True)
    later = FastLoader(ImageFolder(str(root), transform=T.Compose([T.RandomResizedCrop(24), T.ToTensor()])), 4, **kw)
    first = FastLoader(ImageFolder(str(root), transform=three), 4, **kw)
    with later, first:
        later.dataset.transform = three
        assert later.augment == first.augment and later.augment.policy.kind == "chain"
        assert all(torch.equal(x, u) for (x, _), (u, _) in zip(later, first))


def test_timms_to_numpy_is_read_as_pil_to_tensor(pixel_dataset):
    """timm's ToNumpy (uint8 CHW arrays, which default_collate stacks): the batches PILToTensor gives."""
    from timm.data.transforms import ToNumpy

    a = translate(T.Compose([T.RandomResizedCrop(24), ToNumpy()]))
    b = translate(T.Compose([T.RandomResizedCrop(24), T.PILToTensor()]))
    assert a == b and a.mean is None
    sample = ToNumpy()(Image.new("RGB", (5, 4), (1, 2, 3)))
    assert sample.dtype == np.uint8 and sample.shape == (3, 4, 5)  # what the translation assumes of it



#: Chains whose stages have one operation (the jitter, the blur), a choice of groups, and groups of two.
CHAINS = {
    "dino-like": lambda: [T.RandomApply([T.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8), T.RandomGrayscale(0.2),
                          T.RandomApply([T.GaussianBlur(3, (0.1, 2.0))], p=0.5), T.RandomSolarize(128, p=0.2)],
    "choice-then-pair": lambda: [T.RandomChoice([T.RandomSolarize(100, p=1.0), T.RandomEqualize(1.0)]),
                                 T.RandomApply([T.RandomInvert(1.0), T.RandomPosterize(3, p=1.0)], p=0.5)],
    "pair-then-one": lambda: [T.RandomApply([T.RandomAutocontrast(1.0), T.RandomAdjustSharpness(2.0, 1.0)], p=0.6),
                              T.RandomInvert(0.3)],
}


@pytest.mark.parametrize("name", list(CHAINS))
def test_a_chains_fixed_plan_is_its_packed_plan_with_each_operation_at_its_stages_step(name):
    """``plan(..., fixed=True)`` (what the graph is fed) holds the packed plan's operations, in its order, each at a
    position whose step table (``GraphStage.tables``) has it and nothing from another stage; a position's table is
    built from the stage's groups alone (the graph builds each operation only into the steps that can draw it)."""
    from fastload.augment.policies import chain_positions
    from fastload.augment.stage import GraphStage

    augment = translate(T.Compose([T.RandomResizedCrop(24), *CHAINS[name](), T.PILToTensor()]))
    policy = augment.policy
    positions = np.arange(400)
    packed = plan(policy, seed=7, epoch=2, positions=positions)
    fixed = plan(policy, seed=7, epoch=2, positions=positions, fixed=True)
    allowed = chain_positions(policy)
    assert len(allowed) == sum(max(len(g) for g in st.groups) for st in policy.stages)
    for p, f in zip(packed, fixed):
        assert len(f) == len(allowed)
        assert [s for s in f if s is not None] == p
        assert all(s is None or s[0] in allowed[j] for j, s in enumerate(f))
    assert any(s is None for f in fixed for s in f) and any(all(s is not None for s in f) for f in fixed)
    stage = GraphStage(augment)
    assert len(stage.tables) == len(allowed)
    for j, table in enumerate(stage.tables):
        assert table[0] == 0 and {stage.ops[i].name for i in table[1:]} == allowed[j]
    idx = stage.feed(seed=7, epoch=2, positions=positions, layout="CHW")[0]
    for k, f in enumerate(fixed):  # each sample's fed index, through its step's table, is its planned operation
        got = [stage.ops[stage.tables[j][int(idx[k, j])]].name for j in range(len(allowed))]
        assert got == [("Identity" if s is None else s[0]) for s in f]
