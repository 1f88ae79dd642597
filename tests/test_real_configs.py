"""Public training scripts' data code, configuration by configuration, with only ``DataLoader(`` -> ``fastload.FastLoader(``.

Each case builds the dataset, transform and loader the way the published script builds them (a
few lines, citing the script's path; nothing copied) over small images the test makes, then
iterates a batch or two through ``torch.utils.data.DataLoader`` (the oracle) and through
``fastload.FastLoader`` in its place, and compares what the script would notice: the batch's
structure, shapes and dtypes, labels (position by position where both read one sampler, as a
multiset per epoch where each shuffles on its own), value ranges, and the evaluation's pixels.
Scripts that pin an old timm (MAE, ConvNeXt: 0.3.2; DeiT: 0.4.12) run in a subprocess with that
version first on ``PYTHONPATH`` (``real_configs_probe.py``; installed as ``test_timm_versions.py``
installs it). The detection and segmentation references record what happens now: refused with a
route, which is followed to a DataLoader's batches, or served as the DataLoader serves them.
docs/dropin.md, "Real scripts, configuration by configuration", is the table of these cases.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("torchvision")

from PIL import Image  # noqa: E402
from torchvision import datasets, transforms  # noqa: E402

import fastload  # noqa: E402
from fastload.errors import ConfigError  # noqa: E402

from array_files import write_cifar  # noqa: E402
from timm_install import install_timm  # noqa: E402

HERE = Path(__file__).resolve().parent
PROBE = HERE / "real_configs_probe.py"
IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIZES = [(60, 44), (48, 64), (52, 52), (70, 50)]  # (w, h): square and not

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def gradient_folder(root: Path, per: dict[str, int]) -> Path:
    """``root/<split>/c<k>/<j>.png``: 3 classes of smooth gradients (each image its own offsets), four sizes."""
    i = 0
    for split, n in per.items():
        for c in range(3):
            for j in range(n):
                w, h = SIZES[i % len(SIZES)]
                y, x = np.mgrid[0:h, 0:w].astype(np.float32)
                px = np.stack([x / w * 180 + c * 30, y / h * 180 + j * 6, 90 + c * 50 + 0 * x], -1)
                p = root / split / f"c{c}" / f"{j}.png"
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(np.clip(px, 0, 255).astype(np.uint8)).save(p)
                i += 1
    return root


def pixel_range(mean, std) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised range of 0..1 pixels per channel, ``[1, C, 1, 1]`` each."""
    m, s = torch.tensor(mean).view(1, -1, 1, 1), torch.tensor(std).view(1, -1, 1, 1)
    return (0 - m) / s, (1 - m) / s


def fast_extra(cache: Path) -> dict:
    """What the test environment adds to the swapped call: the cache folder, no progress bar, the CPU."""
    return {"cache_dir": cache, "progress": False, "device": "cpu"}


# ============================================================================ scripts pinning an old timm


def probe(version: str, config: str, data: Path, cache: Path) -> dict:
    """``real_configs_probe.py config`` under timm ``version``: both loaders' observations."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(install_timm(version)), str(HERE.parent), str(HERE)]),
               PYTHONWARNINGS="ignore")  # fmt: skip
    r = subprocess.run([sys.executable, str(PROBE), config, str(data), str(cache)], capture_output=True, text=True,
                       timeout=600, env=env, cwd=HERE.parent)  # fmt: skip
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["version"] == version
    return out


@pytest.fixture(scope="module")
def gradients(tmp_path_factory) -> Path:
    """12 training images (2 batches of 6) and 9 validation images (a batch of 6 or 9, and the rest)."""
    return gradient_folder(tmp_path_factory.mktemp("gradients"), {"train": 4, "val": 3})


def check_classification(out: dict, *, shape: tuple[int, ...], batches: int, val_batches: list[int], same_order: bool) -> None:
    """What a classification script notices, FastLoader against the DataLoader in the same script."""
    ref, got = out["torch"], out["fastload"]
    for r, g in zip(ref["train"], got["train"], strict=True):
        assert g["batches"] == r["batches"] == batches  # drop_last=True
        assert {tuple(s) for s in g["shapes"]} == {tuple(s) for s in r["shapes"]} == {shape}
        assert set(g["dtypes"]) == set(r["dtypes"]) == {"torch.float32"}
        assert Counter(g["labels"]) == Counter(r["labels"])  # every training image once per epoch
        if same_order:  # one sampler read as given
            assert g["labels"] == r["labels"]
    # the erasing's pixel noise reaches past the normalised range in both, as timm's pixel mode draws it
    noise = [sum(e["outside"] for e in x["train"]) for x in (ref, got)]
    assert min(noise) > 0, noise
    rv, gv = ref["val"], got["val"]
    assert [s[0] for s in gv["shapes"]] == [s[0] for s in rv["shapes"]] == val_batches
    assert gv["labels"] == rv["labels"]  # evaluation in order
    assert {tuple(s[1:]) for s in gv["shapes"]} == {shape[1:]}
    lo, hi = pixel_range(IMAGENET_MEAN, IMAGENET_STD)
    assert min(gv["min"]) >= float(lo.min()) - 1e-4 and max(gv["max"]) <= float(hi.max()) + 1e-4
    # evaluation is deterministic: the same pixels within a level (1/255 / 0.225 = 0.0174 normalised)
    assert out["val_diff"]["max"] <= 0.0175 and out["val_diff"]["mean"] < 1e-3, out["val_diff"]


def test_mae_finetune_with_its_timm_0_3_2(gradients, tmp_path):
    """MAE main_finetune.py + util/datasets.py (timm==0.3.2): RandAugment m9, pixel erasing 0.25, bicubic, at 224."""
    out = probe("0.3.2", "mae", gradients, tmp_path / "cache")
    check_classification(out, shape=(6, 3, 224, 224), batches=2, val_batches=[6, 3], same_order=False)


def test_convnext_imagenet_with_its_timm_0_3_2(gradients, tmp_path):
    """ConvNeXt main.py + datasets.py (timm==0.3.2), ``--data_set IMNET``: its DistributedSampler read as given."""
    out = probe("0.3.2", "convnext", gradients, tmp_path / "cache")
    check_classification(out, shape=(6, 3, 224, 224), batches=2, val_batches=[9], same_order=True)


def test_convnext_cifar100_with_its_timm_0_3_2(tmp_path):
    """ConvNeXt ``--data_set CIFAR --input_size 32``: CIFAR100 with timm's transform, its crop replaced by
    RandomCrop(32, padding=4); evaluation ToTensor + Normalize without a resize."""
    out = probe("0.3.2", "convnext-cifar", tmp_path / "data", tmp_path / "cache")
    check_classification(out, shape=(6, 3, 32, 32), batches=5, val_batches=[9, 6], same_order=True)


@pytest.mark.slow
def test_deit_with_its_timm_0_4_12(tmp_path):
    """DeiT main.py's defaults (but Mixup, whose targets these versions put on "cuda") under timm==0.4.12,
    through its tests' script (deit_style.py): the same batches, samples, shapes and evaluation count."""
    from test_deit_swap import _colour
    from conftest import write_image

    i = 0
    for split, per in (("train", 10), ("val", 7)):
        for c in range(3):
            for j in range(per):
                write_image(tmp_path / "d" / split / f"c{c}" / f"{j}.jpg", _colour(c, i), size=(52 + 4 * c, 48), quality=95)
                i += 1
    out = probe("0.4.12", "deit", tmp_path / "d", tmp_path / "cache")
    ref, got = out["torch"], out["fastload"]
    assert got["batches"] == ref["batches"] == [5, 5] and got["samples"] == ref["samples"] == [30, 30]
    assert got["shapes"] == ref["shapes"] == [[3, 40, 40]]
    assert got["val_count"] == ref["val_count"] == 21
    for r in (ref, got):
        assert r["loss"][-1] < r["loss"][0] and r["val_acc"] >= 2 / 3


# ============================================================================ CIFAR-10


@pytest.fixture
def cifar10(tmp_path, monkeypatch) -> Path:
    """CIFAR-10 files of 5 x 30 training and 150 test images, torchvision's class told their MD5s."""
    for k, v in write_cifar(tmp_path / "data", n_batch=30, n_test=150).items():
        monkeypatch.setattr(datasets.CIFAR10, k, v)
    return tmp_path / "data"


def test_kuangliu_pytorch_cifar(cifar10, tmp_path):
    """kuangliu/pytorch-cifar main.py: RandomCrop(32, padding=4), flip, its own Normalize; batches of 128 shuffled
    and of 100 in order. The test batches are the DataLoader's; the training batches hold every image once per
    epoch, within the normalised range, with the zero padding's share the crop's law gives."""
    mean, std = (0.4914, 0.4822, 0.4465), (0.2023, 0.1994, 0.2010)  # main.py's values
    transform_train = transforms.Compose([transforms.RandomCrop(32, padding=4), transforms.RandomHorizontalFlip(),
                                          transforms.ToTensor(), transforms.Normalize(mean, std)])  # fmt: skip
    transform_test = transforms.Compose([transforms.ToTensor(), transforms.Normalize(mean, std)])
    trainset = datasets.CIFAR10(root=cifar10, train=True, download=True, transform=transform_train)
    testset = datasets.CIFAR10(root=cifar10, train=False, download=True, transform=transform_test)
    torch.manual_seed(0)
    loaders = {
        "torch": (torch.utils.data.DataLoader(trainset, batch_size=128, shuffle=True, num_workers=0),
                  torch.utils.data.DataLoader(testset, batch_size=100, shuffle=False, num_workers=0)),
        "fastload": (fastload.FastLoader(trainset, batch_size=128, shuffle=True, num_workers=2, **fast_extra(tmp_path)),
                     fastload.FastLoader(testset, batch_size=100, shuffle=False, num_workers=2, **fast_extra(tmp_path))),
    }  # fmt: skip
    lo, hi = pixel_range(mean, std)
    # the crop's law: offsets uniform in 0..8 per axis, so a window keeps (32 - |d - 4|) rows of 32 on average
    keep = np.mean([32 - abs(d - 4) for d in range(9)]) / 32
    padded_share = 1 - keep**2
    for which, (train, test) in loaders.items():
        for _ in range(2):
            batches = list(train)
            assert [tuple(x.shape) for x, _ in batches] == [(128, 3, 32, 32), (22, 3, 32, 32)], which
            assert {x.dtype for x, _ in batches} == {torch.float32}
            labels = torch.cat([y for _, y in batches])
            assert Counter(labels.tolist()) == Counter(trainset.targets), which
            images = torch.cat([x for x, _ in batches])
            assert bool((images >= lo - 1e-5).all() and (images <= hi + 1e-5).all()), which
            padded = (images - lo).abs().amax(1) < 1e-5  # all three channels at the fill (0)
            assert abs(float(padded.float().mean()) - padded_share) < 0.03, (which, float(padded.float().mean()), padded_share)
    got, want = list(loaders["fastload"][1]), list(loaders["torch"][1])
    assert [len(y) for _, y in got] == [len(y) for _, y in want] == [100, 50]
    for (a, la), (b, lb) in zip(got, want):
        assert torch.equal(la, lb) and a.dtype == b.dtype and (a - b).abs().max().item() <= 1e-6
    for train, test in (loaders["fastload"],):
        train.close()
        test.close()


# ============================================================================ MoCo v3, DINO


@pytest.fixture(scope="module")
def ssl_folder(tmp_path_factory) -> Path:
    """3 classes x 6 smooth gradients, four sizes."""
    return gradient_folder(tmp_path_factory.mktemp("ssl"), {"train": 6}) / "train"


def views_and_labels(batches) -> tuple[list[list[tuple[int, ...]]], list[int]]:
    """Each batch's views' shapes (``[views, labels]`` batches, every view float32 and in the normalised range)."""
    lo, hi = pixel_range(IMAGENET_MEAN, IMAGENET_STD)
    shapes, labels = [], []
    for views, y in batches:
        assert isinstance(views, list) and isinstance(y, torch.Tensor)
        for v in views:
            assert v.dtype == torch.float32
            assert bool((v >= lo - 1e-4).all() and (v <= hi + 1e-4).all())
        assert not torch.equal(views[0], views[1])  # two crops of one image differ
        shapes.append([tuple(v.shape) for v in views])
        labels += y.tolist()
    return shapes, labels


def test_moco_v3_main_moco(ssl_folder, tmp_path):
    """facebookresearch/moco-v3 main_moco.py (one process): augmentation1/2 at 224 with crop_min 0.08, moco/loader.py's
    TwoCropsTransform, GaussianBlur and Solarize (as that file writes them: test_multiview.py), and its loader call
    with shuffle=(train_sampler is None), drop_last=True: two views a batch, every image once per epoch but the
    dropped remainder, as the DataLoader gives them."""
    from test_multiview import GaussianBlur, MocoV3TwoCropsTransform as TwoCropsTransform, Solarize

    normalize = transforms.Normalize(mean=[0.485, 0.456, 0.406], std=[0.229, 0.224, 0.225])
    augmentation1 = [transforms.RandomResizedCrop(224, scale=(0.08, 1.)),
                     transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                     transforms.RandomGrayscale(p=0.2), transforms.RandomApply([GaussianBlur([.1, 2.])], p=1.0),
                     transforms.RandomHorizontalFlip(), transforms.ToTensor(), normalize]  # fmt: skip
    augmentation2 = [transforms.RandomResizedCrop(224, scale=(0.08, 1.)),
                     transforms.RandomApply([transforms.ColorJitter(0.4, 0.4, 0.2, 0.1)], p=0.8),
                     transforms.RandomGrayscale(p=0.2), transforms.RandomApply([GaussianBlur([.1, 2.])], p=0.1),
                     transforms.RandomApply([Solarize()], p=0.2), transforms.RandomHorizontalFlip(),
                     transforms.ToTensor(), normalize]  # fmt: skip
    train_dataset = datasets.ImageFolder(ssl_folder, TwoCropsTransform(transforms.Compose(augmentation1), transforms.Compose(augmentation2)))
    train_sampler = None
    seen = {}
    for which in ("torch", "fastload"):
        Loader, extra = (fastload.FastLoader, fast_extra(tmp_path)) if which == "fastload" else (torch.utils.data.DataLoader, {})
        train_loader = Loader(train_dataset, batch_size=8, shuffle=(train_sampler is None), num_workers=0,
                              pin_memory=True, sampler=train_sampler, drop_last=True, **extra)  # fmt: skip
        seen[which] = views_and_labels(list(train_loader))
    (fs, fl), (ts, tl) = seen["fastload"], seen["torch"]
    assert fs == ts == [[(8, 3, 224, 224)] * 2] * 2  # 18 images: two batches of 8, 2 dropped
    counts = Counter(train_dataset.targets)
    for labels in (fl, tl):
        assert len(labels) == 16 and all(Counter(labels)[c] <= counts[c] for c in counts)


@pytest.mark.slow
def test_dino_main_dino(ssl_folder, tmp_path):
    """facebookresearch/dino main_dino.py (one process): DataAugmentationDINO's defaults (global scale (0.4, 1),
    local (0.05, 0.4), 8 local crops; the class as main_dino.py writes it: test_multiview.py), its
    DistributedSampler(shuffle=True) as one rank of one, batch_size_per_gpu, drop_last=True, and
    data_loader.sampler.set_epoch(epoch): 2 + 8 views a batch, labels the DataLoader's at every position."""
    from test_multiview import DataAugmentationDINO

    transform = DataAugmentationDINO((0.4, 1.), (0.05, 0.4), 8)
    dataset = datasets.ImageFolder(ssl_folder, transform=transform)
    seen = {}
    for which in ("torch", "fastload"):
        Loader, extra = (fastload.FastLoader, fast_extra(tmp_path)) if which == "fastload" else (torch.utils.data.DataLoader, {})
        sampler = torch.utils.data.DistributedSampler(dataset, num_replicas=1, rank=0, shuffle=True)
        data_loader = Loader(dataset, sampler=sampler, batch_size=5, num_workers=0, pin_memory=True, drop_last=True, **extra)
        seen[which] = []
        for epoch in range(2):
            data_loader.sampler.set_epoch(epoch)
            seen[which].append(views_and_labels(list(data_loader)))
    for (fs, fl), (ts, tl) in zip(seen["fastload"], seen["torch"]):
        assert fs == ts == [[(5, 3, 224, 224)] * 2 + [(5, 3, 96, 96)] * 8] * 3
        assert fl == tl
    assert seen["torch"][0][1] != seen["torch"][1][1]  # set_epoch reorders
