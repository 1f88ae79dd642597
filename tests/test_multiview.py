"""Multi-view transforms (MoCo v2/v3, SimCLR, DINO's multi-crop) served as a DataLoader serves them.

Oracles: the recipes' own classes, defined here as their public repositories define them
(``moco/loader.py``, SimCLR's ``data_aug/view_generator.py``, DINO's ``main_dino.py`` and ``utils.py``), run by a ``DataLoader`` over the
same ImageFolder with an identically seeded sampler (labels position by position, the batch's
structure and every view's shape); PIL's own ``GaussianBlur``/``solarize`` through the recipes'
classes (per pixel); the laws (blur radius, solarization gate) compared with what the same
objects draw in a DataLoader (Kolmogorov-Smirnov and Fisher tests at alpha = 0.001) on flat and
striped fixtures whose statistics isolate the one operation.
"""

from __future__ import annotations

import random
import types

import numpy as np
import pytest
import torch

from fastload import ConfigError, FastLoader

pytest.importorskip("torchvision")
stats = pytest.importorskip("scipy.stats")

from PIL import Image, ImageFilter, ImageOps  # noqa: E402
from torch.utils.data import DataLoader, RandomSampler  # noqa: E402
from torchvision import transforms  # noqa: E402
from torchvision.datasets import ImageFolder  # noqa: E402

from fastload.augment.stage import apply_plans  # noqa: E402
from fastload.multiview import MultiView  # noqa: E402
from fastload.transforms import translate  # noqa: E402

ALPHA = 0.001
SIZES = [(40, 30), (50, 64), (33, 45), (64, 48), (29, 29), (70, 52)]


# ----------------------------------------------------------------------------- the recipes' own classes
class TwoCropsTransform:
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform):
        self.base_transform = base_transform

    def __call__(self, x):
        q = self.base_transform(x)
        k = self.base_transform(x)
        return [q, k]


class MocoV3TwoCropsTransform:
    """Take two random crops of one image"""

    def __init__(self, base_transform1, base_transform2):
        self.base_transform1 = base_transform1
        self.base_transform2 = base_transform2

    def __call__(self, x):
        im1 = self.base_transform1(x)
        im2 = self.base_transform2(x)
        return [im1, im2]


class ContrastiveLearningViewGenerator(object):
    """Take two random crops of one image as the query and key."""

    def __init__(self, base_transform, n_views=2):
        self.base_transform = base_transform
        self.n_views = n_views

    def __call__(self, x):
        return [self.base_transform(x) for i in range(self.n_views)]


class GaussianBlur(object):
    """Gaussian blur augmentation in SimCLR https://arxiv.org/abs/2002.05709"""

    def __init__(self, sigma=[.1, 2.]):  # noqa: B006 - as MoCo writes it
        self.sigma = sigma

    def __call__(self, x):
        sigma = random.uniform(self.sigma[0], self.sigma[1])
        x = x.filter(ImageFilter.GaussianBlur(radius=sigma))
        return x


class Solarize(object):
    """Solarize augmentation from BYOL: https://arxiv.org/abs/2006.07733"""

    def __call__(self, x):
        return ImageOps.solarize(x)


class DinoGaussianBlur(object):
    """
    Apply Gaussian Blur to the PIL image.
    """
    def __init__(self, p=0.5, radius_min=0.1, radius_max=2.):
        self.prob = p
        self.radius_min = radius_min
        self.radius_max = radius_max

    def __call__(self, img):
        do_it = random.random() <= self.prob
        if not do_it:
            return img

        return img.filter(
            ImageFilter.GaussianBlur(
                radius=random.uniform(self.radius_min, self.radius_max)
            )
        )


class Solarization(object):
    """
    Apply Solarization to the PIL image.
    """
    def __init__(self, p):
        self.p = p

    def __call__(self, img):
        if random.random() < self.p:
            return ImageOps.solarize(img)
        else:
            return img


DinoGaussianBlur.__name__ = DinoGaussianBlur.__qualname__ = "GaussianBlur"  # DINO's utils.GaussianBlur
utils = types.SimpleNamespace(GaussianBlur=DinoGaussianBlur, Solarization=Solarization)


class DataAugmentationDINO(object):
    def __init__(self, global_crops_scale, local_crops_scale, local_crops_number):
        flip_and_color_jitter = transforms.Compose([
            transforms.RandomHorizontalFlip(p=0.5),
            transforms.RandomApply(
                [transforms.ColorJitter(brightness=0.4, contrast=0.4, saturation=0.2, hue=0.1)],
                p=0.8
            ),
            transforms.RandomGrayscale(p=0.2),
        ])
        normalize = transforms.Compose([
            transforms.ToTensor(),
            transforms.Normalize((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
        ])

        # first global crop
        self.global_transfo1 = transforms.Compose([
            transforms.RandomResizedCrop(224, scale=global_crops_scale, interpolation=Image.BICUBIC),
            flip_and_color_jitter,
            utils.GaussianBlur(1.0),
            normalize,
        ])
        # second global crop
        self.global_transfo2 = transforms.Compose([
            transforms.RandomResizedCrop(224, scale=global_crops_scale, interpolation=Image.BICUBIC),
            flip_and_color_jitter,
            utils.GaussianBlur(0.1),
            utils.Solarization(0.2),
            normalize,
        ])
        # transformation for the local small crops
        self.local_crops_number = local_crops_number
        self.local_transfo = transforms.Compose([
            transforms.RandomResizedCrop(96, scale=local_crops_scale, interpolation=Image.BICUBIC),
            flip_and_color_jitter,
            utils.GaussianBlur(p=0.5),
            normalize,
        ])

    def __call__(self, image):
        crops = []
        crops.append(self.global_transfo1(image))
        crops.append(self.global_transfo2(image))
        for _ in range(self.local_crops_number):
            crops.append(self.local_transfo(image))
        return crops


NORMALIZE = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])


def moco_v2(crop: int):
    """MoCo v2's ``aug_plus`` at ``crop``."""
    return transforms.Compose([
        transforms.RandomResizedCrop(crop, scale=(0.2, 1.)),
        transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
        transforms.RandomGrayscale(p=0.2),
        transforms.RandomApply([GaussianBlur([.1, 2.])], p=0.5),
        transforms.RandomHorizontalFlip(),
        transforms.ToTensor(),
        NORMALIZE,
    ])  # fmt: skip


def moco_v3(crop: int):
    """MoCo v3's ``augmentation1`` and ``augmentation2`` at ``crop``."""
    common = [transforms.RandomResizedCrop(crop, scale=(0.08, 1.)),
              transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
              transforms.RandomGrayscale(p=0.2)]  # fmt: skip
    one = transforms.Compose([*common, transforms.RandomApply([GaussianBlur([.1, 2.])], p=1.0),
                              transforms.RandomHorizontalFlip(), transforms.ToTensor(), NORMALIZE])  # fmt: skip
    two = transforms.Compose([*common, transforms.RandomApply([GaussianBlur([.1, 2.])], p=0.1),
                              transforms.RandomApply([Solarize()], p=0.2), transforms.RandomHorizontalFlip(),
                              transforms.ToTensor(), NORMALIZE])  # fmt: skip
    return one, two


# ----------------------------------------------------------------------------- fixtures
def _folder(root, painter, classes: int = 3, per_class: int = 6):
    for c in range(classes):
        (root / f"class_{c}").mkdir(parents=True)
        for j in range(per_class):
            w, h = SIZES[(c * per_class + j) % len(SIZES)]
            Image.fromarray(painter(w, h, c * per_class + j)).save(root / f"class_{c}" / f"{j:02d}.png")
    return root


@pytest.fixture(scope="module")
def noise_root(tmp_path_factory):
    """3 classes x 6 images of seeded uniform noise, six sizes (square and not), lossless PNG."""
    return _folder(tmp_path_factory.mktemp("noise"), lambda w, h, k: np.random.default_rng(k).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("cache")


def _fast(ds, cache, **kw):
    kw.setdefault("device", "cpu")
    kw.setdefault("progress", False)
    return FastLoader(ds, cache_dir=cache, **kw)


def _sampler(ds, seed: int):
    return RandomSampler(ds, generator=torch.Generator().manual_seed(seed))


def _structure(batch):
    """``[[shape, dtype] per view], label shape`` of a ``[views, labels]`` batch."""
    views, labels = batch
    assert isinstance(views, list) and isinstance(labels, torch.Tensor), type(views)
    return [(tuple(v.shape), v.dtype) for v in views], tuple(labels.shape)


# ----------------------------------------------------------------------------- batches as a DataLoader's
@pytest.mark.parametrize("recipe", ["moco_v2", "moco_v3", "simclr", "dino"])
def test_batches_are_the_dataloaders_views_and_labels(noise_root, cache, recipe):
    """Oracle: a DataLoader over the same ImageFolder with the recipe's own transform and a sampler seeded alike:
    every batch ``[views, labels]``, each view its own size and dtype, labels equal at every position."""
    if recipe == "moco_v2":
        t = TwoCropsTransform(moco_v2(24))
    elif recipe == "moco_v3":
        t = MocoV3TwoCropsTransform(*moco_v3(24))
    elif recipe == "simclr":  # SimCLR's view generator, three views of its base transform
        t = ContrastiveLearningViewGenerator(moco_v2(20), n_views=3)
    else:
        t = DataAugmentationDINO((0.4, 1.0), (0.05, 0.4), 3)
    ds = ImageFolder(str(noise_root), transform=t)
    want = list(DataLoader(ds, batch_size=5, sampler=_sampler(ds, 11)))
    with _fast(ds, cache, batch_size=5, sampler=_sampler(ds, 11), seed=3) as fl:
        got = list(fl)
    assert len(got) == len(want) == 4
    for g, w in zip(got, want):
        assert _structure(g) == _structure(w)
        assert torch.equal(g[1], w[1])
    if recipe == "dino":
        assert [s for s, _ in _structure(got[0])[0]] == [(5, 3, 224, 224)] * 2 + [(5, 3, 96, 96)] * 3


def test_a_user_collate_fn_gets_each_items_list_of_views(noise_root, cache):
    """As a DataLoader calls it: on ``(views, label)`` items, ``views`` the item's list of one tensor per view."""
    ds = ImageFolder(str(noise_root), transform=TwoCropsTransform(moco_v2(16)))
    seen = []

    def collate(items):
        seen.append([(len(v), tuple(v[0].shape), type(y)) for v, y in items])
        return torch.utils.data.default_collate(items)

    with _fast(ds, cache, batch_size=4, seed=1, collate_fn=collate) as fl:
        batch = next(iter(fl))
    assert seen[0] == [(2, (3, 16, 16), int)] * 4
    assert _structure(batch) == ([((4, 3, 16, 16), torch.float32)] * 2, (4,))


def test_each_views_settings_are_its_own_transforms(noise_root):
    """DINO: the global views crop to 224 with scale (0.4, 1), the local ones to 96 with (0.05, 0.4), bicubic; the
    first global view always blurs (radius 0.1..2), the second blurs at p 0.1 and solarizes (threshold 128) at 0.2."""
    mv = translate(DataAugmentationDINO((0.4, 1.0), (0.05, 0.4), 2))
    assert isinstance(mv, MultiView) and len(mv.views) == 4
    assert [(a.crop, a.scale, a.interpolation, a.flip) for a in mv.views] == (
        [(224, (0.4, 1.0), "bicubic", 0.5)] * 2 + [(96, (0.05, 0.4), "bicubic", 0.5)] * 2
    )
    blur = [[(o.name, o.prob, o.spread) for st in a.policy.stages for g in st.groups for o in g if "Blur" in o.name] for a in mv.views]
    assert blur == [[("PILGaussianBlur", 1.0, (0.1, 2.0))], [("PILGaussianBlur", 0.1, (0.1, 2.0))]] + [[("PILGaussianBlur", 0.5, (0.1, 2.0))]] * 2
    sol = [(o.prob, o.magnitude) for st in mv.views[1].policy.stages for g in st.groups for o in g if o.name == "Solarize"]
    assert sol == [(0.2, 128.0)]
    assert [s.rsplit(".", 1)[-1] for s in mv.sources] == ["global_transfo1)", "global_transfo2)", "local_transfo)", "local_transfo)"]


# ----------------------------------------------------------------------------- draws per view
def test_views_of_one_image_differ_and_view_0_is_a_one_view_loaders(noise_root, cache):
    """View 0 draws what a one-view loader with the same seed draws, pixel for pixel (on the CPU both resize on the
    host with PIL's kernel and augment in the same stage graph); view 1 draws its own (different pixels on every
    image of the epoch)."""
    base = transforms.Compose([transforms.RandomResizedCrop(20), transforms.RandomHorizontalFlip(),
                               transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.4)], p=0.8), transforms.ToTensor()])  # fmt: skip
    ds = ImageFolder(str(noise_root), transform=TwoCropsTransform(base))
    with _fast(ds, cache, batch_size=6, seed=9) as multi:
        views = [torch.cat(x) for x in zip(*[v for v, _ in multi])]
    with _fast(ImageFolder(str(noise_root), transform=base), cache, batch_size=6, seed=9) as one:
        single = torch.cat([x for x, _ in one])
    assert torch.equal(views[0], single)
    assert ((views[1] - single).abs().flatten(1).mean(1) > 10 / 255).all()
    assert ((views[0] - views[1]).abs().flatten(1).amax(1) > 0.1).all()


@pytest.mark.parametrize("device_seed", [9, 2**40 + 3])
def test_every_view_is_a_one_view_loader_of_its_transform_at_the_views_seed(noise_root, cache, device_seed):
    """DINO's multi-crop (two global views with their own blur and solarization, two local ones at 96 px): view
    ``v`` is, pixel for pixel, what a one-view loader of that view's own transform gives with the seed
    :func:`~fastload.augment.draws.view_seed` makes for ``v`` (an unshuffled epoch: the same positions). The views'
    windows are resized on the host as single crops are, and their stages run in the same graph operations."""
    from fastload.augment.draws import view_seed

    dino = DataAugmentationDINO((0.4, 1.0), (0.05, 0.4), 2)
    with _fast(ImageFolder(str(noise_root), transform=dino), cache, batch_size=5, seed=device_seed) as multi:
        views = [torch.cat(x) for x in zip(*[v for v, _ in multi])]
    own = [dino.global_transfo1, dino.global_transfo2, dino.local_transfo, dino.local_transfo]
    assert [tuple(v.shape[1:]) for v in views] == [(3, 224, 224)] * 2 + [(3, 96, 96)] * 2
    for v, t in enumerate(own):
        with _fast(ImageFolder(str(noise_root), transform=t), cache, batch_size=5, seed=view_seed(device_seed, v)) as one:
            single = torch.cat([x for x, _ in one])
        assert torch.equal(views[v], single), f"view {v}: max {float((views[v] - single).abs().max())}"
    assert not torch.equal(views[2], views[3])  # the two local views draw apart


def _epoch_views(loader) -> list[torch.Tensor]:
    return [torch.cat(x) for x in zip(*[v for v, _ in loader])]


def test_draws_are_reproducible_per_seed_epoch_and_across_resume(noise_root, cache):
    """The same seed gives the same views; another seed or epoch other views; a loader resumed from a state_dict
    after one batch gives the rest of the epoch exactly as the loader that went on."""
    ds = ImageFolder(str(noise_root), transform=MocoV3TwoCropsTransform(*moco_v3(16)))
    with _fast(ds, cache, batch_size=4, seed=5, shuffle=True) as a, _fast(ds, cache, batch_size=4, seed=5, shuffle=True) as b:
        first, again = _epoch_views(a), _epoch_views(b)
        a.set_epoch(1)
        later = _epoch_views(a)
    assert all(torch.equal(x, y) for x, y in zip(first, again))
    assert not any(torch.equal(x, y) for x, y in zip(first, later))
    with _fast(ds, cache, batch_size=4, seed=6, shuffle=True) as c:
        assert not any(torch.equal(x, y) for x, y in zip(first, _epoch_views(c)))
    with _fast(ds, cache, batch_size=4, seed=5, shuffle=True) as a:
        it = iter(a)
        next(it)
        state = a.state_dict()
        rest = list(it)
    with _fast(ds, cache, batch_size=4, seed=5, shuffle=True) as r:
        r.load_state_dict(state)
        resumed = list(r)
    assert len(resumed) == len(rest) == 4
    for (gv, gl), (wv, wl) in zip(resumed, rest):
        assert torch.equal(gl, wl) and all(torch.equal(x, y) for x, y in zip(gv, wv))


# ----------------------------------------------------------------------------- the recipes' operations and laws
def _noise(h=37, w=53, seed=4) -> Image.Image:
    return Image.fromarray(np.random.default_rng(seed).integers(0, 256, (h, w, 3), dtype=np.uint8))


@pytest.mark.parametrize("cls", [GaussianBlur, DinoGaussianBlur])
def test_the_recipes_blur_is_the_class_itself_per_pixel(cls):
    """Oracle: the recipe's class called on a non-square noise image after ``random.seed(s)``; its radius re-drawn
    from the same state; the graph's operation at that radius must give the same pixels."""
    obj = GaussianBlur([.1, 2.]) if cls is GaussianBlur else DinoGaussianBlur(1.0)
    op = translate(transforms.Compose([transforms.RandomResizedCrop(8), obj, transforms.PILToTensor()])).policy.stages[0].groups[0][0]
    img = _noise()
    for s in range(6):
        random.seed(s)
        want = np.asarray(obj(img))
        random.seed(s)
        if cls is DinoGaussianBlur:
            random.random()
        radius = random.uniform(0.1, 2.0)
        (got,) = apply_plans([np.asarray(img)], [[(op.name, (radius,), "bilinear")]], library="torchvision", fill=None)
        assert np.array_equal(got, want), (s, radius, int(np.abs(got.astype(int) - want).max()))


def test_the_recipes_solarize_is_the_class_itself_per_pixel():
    """Oracle: MoCo v3's Solarize (PIL's ImageOps.solarize) on a gradient through every level."""
    img = Image.fromarray(np.broadcast_to(np.arange(256, dtype=np.uint8)[None, :, None], (3, 256, 3)).copy())
    op = translate(transforms.Compose([transforms.RandomResizedCrop(8), Solarize(), transforms.PILToTensor()])).policy.stages[0].groups[0][0]
    (got,) = apply_plans([np.asarray(img)], [[(op.name, (op.magnitude,), "bilinear")]], library="torchvision", fill=None)
    assert np.array_equal(got, np.asarray(Solarize()(img)))


def _flat(w, h, k):
    return np.full((h, w, 3), 200, dtype=np.uint8)


def _stripes(w, h, k):
    x = (np.arange(24) // 4 % 2 * 255).astype(np.uint8)
    return np.broadcast_to(x[None, :, None], (24, 24, 3)).copy()


def _runs(loader, epochs: int) -> list[torch.Tensor]:
    out = []
    for e in range(epochs):
        if hasattr(loader, "set_epoch"):
            loader.set_epoch(e)
        for views, _ in loader:
            out += [v for v in views]
    return out


def test_the_solarization_gate_follows_dinos_law(tmp_path, cache):
    """Flat 200-level images: a view is solarized (55) or not (200). DINO's Solarization(0.3) in both views; the
    share solarized through FastLoader against the share through a DataLoader running the class itself (Fisher's
    exact test), and against 0.3 (binomial), at alpha = 0.001."""
    root = _folder(tmp_path / "flat", _flat)
    view = transforms.Compose([transforms.RandomResizedCrop(12), Solarization(0.3), transforms.PILToTensor()])
    ds = ImageFolder(str(root), transform=TwoCropsTransform(view))
    with _fast(ds, cache, batch_size=6, seed=2) as fl:
        got = torch.cat(_runs(fl, 8))
    torch.manual_seed(0), random.seed(0)
    want = torch.cat(_runs(DataLoader(ds, batch_size=6), 8))
    for x in (got, want):
        assert set(torch.unique(x).tolist()) <= {55, 200}
    g, w = (int((x.flatten(1)[:, 0] == 55).sum()) for x in (got, want))
    n = len(got)
    assert n == len(want) == 288
    assert stats.fisher_exact([[g, n - g], [w, n - w]]).pvalue > ALPHA, (g, w, n)
    assert stats.binomtest(g, n, 0.3).pvalue > ALPHA, (g, n)


def test_the_blur_radius_follows_mocos_law(tmp_path, cache):
    """Four-pixel stripes on 24 x 24 images cropped whole (scale and ratio 1: no resampling): each view's contrast
    (the std of its pixels) is a function of the blur radius alone (radius 0.1 keeps it, 2 leaves a third); MoCo
    v3's RandomApply([GaussianBlur([.1, 2.])], p=1.0) through FastLoader and through a DataLoader running the class
    itself: the same law (Kolmogorov-Smirnov, alpha = 0.001)."""
    root = _folder(tmp_path / "stripes", _stripes)
    view = transforms.Compose([transforms.RandomResizedCrop(24, scale=(1.0, 1.0), ratio=(1.0, 1.0)),
                               transforms.RandomApply([GaussianBlur([.1, 2.])], p=1.0), transforms.PILToTensor()])  # fmt: skip
    ds = ImageFolder(str(root), transform=TwoCropsTransform(view))
    with _fast(ds, cache, batch_size=6, seed=4) as fl:
        got = torch.cat(_runs(fl, 6)).float().flatten(1).std(1)
    random.seed(1)
    want = torch.cat(_runs(DataLoader(ds, batch_size=6), 6)).float().flatten(1).std(1)
    sharp = float(torch.from_numpy(_stripes(24, 24, 0)).float().std())
    assert len(got) == len(want) == 216
    assert float(got.max()) > 0.95 * sharp and float(got.min()) < 0.5 * sharp, (float(got.min()), float(got.max()), sharp)
    assert stats.ks_2samp(got.numpy(), want.numpy()).pvalue > ALPHA


# ----------------------------------------------------------------------------- refusals
class OwnBlur:
    """A blur of a training script's own, not one of the recipes' (a kernel attribute)."""

    def __init__(self, kernel=3):
        self.kernel = kernel

    def __call__(self, x):
        return x.filter(ImageFilter.BoxBlur(self.kernel))


class FakeGaussianBlur:
    """Named and built as MoCo's blur, but a max filter: refused after the probe."""

    def __init__(self, sigma=[.1, 2.]):  # noqa: B006
        self.sigma = sigma

    def __call__(self, x):
        return x.filter(ImageFilter.MaxFilter(3))


FakeGaussianBlur.__name__ = FakeGaussianBlur.__qualname__ = "GaussianBlur"


@pytest.mark.parametrize("obj", [OwnBlur(), FakeGaussianBlur()], ids=["own", "look-alike"])
def test_an_unknown_class_is_refused_by_its_name_never_its_address(obj):
    """Inside RandomApply and alone: the message names the class (``OwnBlur()``, ``GaussianBlur()``), with no
    ``object at 0x`` anywhere."""
    name = type(obj).__qualname__
    for step in (transforms.RandomApply([obj], p=0.5), obj):
        with pytest.raises(ConfigError) as e:
            translate(transforms.Compose([transforms.RandomResizedCrop(16), step, transforms.ToTensor()]))
        msg = str(e.value)
        assert " at 0x" not in msg and f"{name}()" in msg, msg


class HiddenViews:
    """Two views made by transforms kept where no attribute shows them (a dict)."""

    def __init__(self, a, b):
        self.steps = {"a": a, "b": b}

    def __call__(self, x):
        return [self.steps["a"](x), self.steps["b"](x)]


def test_views_that_cannot_be_found_are_refused_with_advice_that_works(noise_root, cache):
    """The refusal says to pass the views' transforms as transform=[...]; following it gives the views."""
    a = transforms.Compose([transforms.RandomResizedCrop(16), transforms.ToTensor()])
    b = transforms.Compose([transforms.RandomResizedCrop(8), transforms.ToTensor()])
    ds = ImageFolder(str(noise_root), transform=HiddenViews(a, b))
    with pytest.raises(ConfigError, match=r"HiddenViews returns 2 views .* transform=\[view_1, \.\.\., view_2\]\)$"):
        _fast(ds, cache, batch_size=4)
    with _fast(ds, cache, batch_size=4, transform=[a, b], seed=1) as fl:
        batch = next(iter(fl))
    want = next(iter(DataLoader(ds, batch_size=4)))
    assert _structure(batch) == _structure(want) == ([((4, 3, 16, 16), torch.float32), ((4, 3, 8, 8), torch.float32)], (4,))


def test_a_multi_view_step_inside_a_longer_transform_and_flat_keywords_are_refused(noise_root, cache):
    """A multi-view transform must be the whole transform (a DataLoader would fail on the list it hands on); the flat
    image keywords cannot say which view they mean. Neither message advises one loader per view."""
    two = TwoCropsTransform(transforms.Compose([transforms.RandomResizedCrop(16), transforms.PILToTensor()]))
    with pytest.raises(ConfigError) as e:
        translate(transforms.Compose([two, transforms.ConvertImageDtype(torch.float32)]))
    assert "inside a longer transform" in str(e.value) and "one loader per view" not in str(e.value)
    ds = ImageFolder(str(noise_root), transform=two)
    with pytest.raises(ConfigError, match=r"^crop= given with a multi-view transform"):
        _fast(ds, cache, batch_size=4, crop=8)
    with pytest.raises(ConfigError, match=r"view 2 of 2 \(transform\[1\]\) is an evaluation transform.*RandomResizedCrop"):
        _fast(ds, cache, batch_size=4, transform=[two.base_transform, transforms.Compose([transforms.Resize(16), transforms.CenterCrop(16), transforms.ToTensor()])])


def test_the_loaders_dataset_gives_each_items_views_and_a_loader_over_it_the_same_batches(noise_root, cache):
    """``loader.dataset[i]`` is ``([view, ...], label)`` with each view's crop size (view 0 cropped from the loader's
    own seed); a FastLoader made from ``loader.dataset`` batches the same views as the loader."""
    a = transforms.Compose([transforms.RandomResizedCrop(16), transforms.ToTensor()])
    b = transforms.Compose([transforms.RandomResizedCrop(12), transforms.RandomHorizontalFlip(), transforms.ToTensor()])
    ds = ImageFolder(str(noise_root), transform=MocoV3TwoCropsTransform(a, b))
    with _fast(ds, cache, batch_size=3, seed=2) as fl:
        views, label = fl.dataset[4]
        assert [tuple(v.shape) for v in views] == [(3, 16, 16), (3, 12, 12)] and label == ds.targets[4]
        first = next(iter(fl))
        with FastLoader(fl.dataset, batch_size=3, seed=2, device="cpu", shuffle=False) as again:
            second = next(iter(again))
    assert _structure(first) == _structure(second) and torch.equal(first[1], second[1])
    assert all(torch.equal(x, y) for x, y in zip(first[0], second[0]))
