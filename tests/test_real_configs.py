"""Public training scripts' data code, configuration by configuration, with only ``DataLoader(`` -> ``fastload.FastLoader(``.

Each case builds the dataset, transform and loader the way the published script builds them (a
few lines, citing the script's path; nothing copied) over small images the test makes, then
iterates a batch or two through ``torch.utils.data.DataLoader`` (the oracle) and through
``fastload.FastLoader`` in its place, and compares what the script would notice: the batch's
structure, shapes and dtypes, labels (position by position where both read one sampler, as a
multiset per epoch where each shuffles on its own), value ranges, and the evaluation's pixels.
Scripts that pin an old timm (MAE, ConvNeXt, DeiT: 0.3.2; DeiT also under 0.4.12) run in a subprocess with that
version first on ``PYTHONPATH`` (``real_configs_probe.py``; installed as ``test_timm_versions.py``
installs it). The detection and segmentation references are served with their own transforms (the references'
classes as tests/segmentation_reference.py writes them), checked against the DataLoader's batches.
docs/dropin.md, "Real scripts, configuration by configuration", is the table of these cases.
"""

from __future__ import annotations

import json
import logging
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

log = logging.getLogger(__name__)
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
    # evaluation is deterministic: the same pixels within a level (1/255 over the smallest std, normalised)
    assert out["val_diff"]["max"] <= 1.01 / 255 / min(IMAGENET_STD) and out["val_diff"]["mean"] < 1e-3, out["val_diff"]


def test_mae_finetune_with_its_timm_0_3_2(gradients, tmp_path):
    """MAE main_finetune.py + util/datasets.py (timm==0.3.2): RandAugment m9, pixel erasing 0.25, bicubic, at 224."""
    out = probe("0.3.2", "mae", gradients, tmp_path / "cache")
    check_classification(out, shape=(6, 3, 224, 224), batches=2, val_batches=[6, 3], same_order=False)


@pytest.mark.slow  # 8 s each under timm 0.3.2; MAE's case keeps that version fast
def test_convnext_imagenet_with_its_timm_0_3_2(gradients, tmp_path):
    """ConvNeXt main.py + datasets.py (timm==0.3.2), ``--data_set IMNET``: its DistributedSampler read as given."""
    out = probe("0.3.2", "convnext", gradients, tmp_path / "cache")
    check_classification(out, shape=(6, 3, 224, 224), batches=2, val_batches=[9], same_order=True)


@pytest.mark.slow  # 8 s each under timm 0.3.2; MAE's case keeps that version fast
def test_convnext_cifar100_with_its_timm_0_3_2(tmp_path):
    """ConvNeXt ``--data_set CIFAR --input_size 32``: CIFAR100 with timm's transform, its crop replaced by
    RandomCrop(32, padding=4); evaluation ToTensor + Normalize without a resize."""
    out = probe("0.3.2", "convnext-cifar", tmp_path / "data", tmp_path / "cache")
    check_classification(out, shape=(6, 3, 32, 32), batches=5, val_batches=[9, 6], same_order=True)


@pytest.mark.slow
@pytest.mark.parametrize("version", ["0.3.2", "0.4.12"])
def test_deit_with_its_pinned_timm(tmp_path, version):
    """DeiT main.py's defaults (but Mixup, whose targets these versions put on "cuda") under the timm its
    requirements.txt and README pin (0.3.2) and under 0.4.12 (the other pre-1.0 line scripts of its time
    pin), through its tests' script (deit_style.py): the same batches, samples, shapes and evaluation
    count, a falling loss."""
    from test_deit_swap import _colour
    from conftest import write_image

    i = 0
    for split, per in (("train", 10), ("val", 7)):
        for c in range(3):
            for j in range(per):
                write_image(tmp_path / "d" / split / f"c{c}" / f"{j}.jpg", _colour(c, i), size=(52 + 4 * c, 48), quality=95)
                i += 1
    out = probe(version, "deit", tmp_path / "d", tmp_path / "cache")
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


# ============================================================================ detection and segmentation references
# Built as torchvision's references/detection/train.py (get_dataset, get_transform; coco_utils.get_coco;
# presets.DetectionPresetTrain/Eval with --use-v2, backend pil) and references/segmentation/train.py build
# them. The references' own small pieces are written here in a few lines each (a preset keeps its steps in
# .transforms and is called on (image, target); the images-without-annotations filter; collate_fn).


class Preset:
    """The references' preset classes: the steps in ``.transforms``, called on ``(image, target)``."""

    def __init__(self, steps: list) -> None:
        from torchvision.transforms import v2

        self.transforms = v2.Compose(steps)

    def __call__(self, img, target):
        return self.transforms(img, target)


class DetectionPresetTrain(Preset):
    """references/detection/presets.py's training preset (named as the reference names it)."""


class DetectionPresetEval(Preset):
    """references/detection/presets.py's evaluation preset."""


class SegmentationPresetTrain(Preset):
    """references/segmentation/presets.py's training preset."""


def detection_preset(augmentation: str | None) -> Preset:
    """presets.py with use_v2=True, backend "pil": ``None`` is DetectionPresetEval; ``hflip`` (the default, Faster
    R-CNN) and ``ssdlite`` are DetectionPresetTrain's data augmentations."""
    from torchvision import tv_tensors
    from torchvision.transforms import v2 as T

    if augmentation is None:
        return DetectionPresetEval([T.ToImage(), T.ToDtype(torch.float, scale=True), T.ToPureTensor()])
    steps = {"hflip": [T.RandomHorizontalFlip(p=0.5)], "ssdlite": [T.RandomIoUCrop(), T.RandomHorizontalFlip(p=0.5)]}[augmentation]
    return DetectionPresetTrain([*steps, T.ToImage(), T.ToDtype(torch.float, scale=True),
                   T.ConvertBoundingBoxFormat(tv_tensors.BoundingBoxFormat.XYXY), T.SanitizeBoundingBoxes(), T.ToPureTensor()])  # fmt: skip


def detection_collate(batch):
    """references/detection/utils.py's collate_fn."""
    return tuple(zip(*batch))


def coco_train_subset(dataset, base, keep) -> torch.utils.data.Subset:
    """coco_utils' ``_coco_remove_images_without_annotations``: the images whose annotations pass ``keep``."""
    ids = [i for i, img_id in enumerate(base.ids) if keep(base.coco.loadAnns(base.coco.getAnnIds(imgIds=img_id)))]
    return torch.utils.data.Subset(dataset, ids)


def has_a_box(anns) -> bool:
    """detection: some annotation with a box wider and taller than one pixel."""
    return any(a["bbox"][2] > 1 and a["bbox"][3] > 1 for a in anns)


@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    pytest.importorskip("pycocotools")
    from coco_fixture import write_coco

    root = tmp_path_factory.mktemp("coco")
    img, ann, _ = write_coco(root)
    return root, str(img), str(ann)


def swap_or_route(dataset, plain, transforms_, make_kw, cache: Path) -> tuple[str, list]:
    """``FastLoader(dataset, **make_kw())`` as the script calls it. Refused: the message names the route and no
    address, and the route is followed (``plain``, the dataset built without ``transforms_``, with
    ``collate_fn=fastload.TransformsCollate(transforms_, collate_fn)``). Returns what happened and the batches."""
    kw = make_kw()
    try:
        loader = fastload.FastLoader(dataset, cache_dir=cache, progress=False, **kw)
        status = "served"
        log.info("served")
    except ConfigError as e:
        msg = str(e)
        assert "TransformsCollate" in msg and " at 0x" not in msg, msg
        kw["collate_fn"] = fastload.TransformsCollate(transforms_, kw["collate_fn"])
        loader = fastload.FastLoader(plain, cache_dir=cache, progress=False, **kw)
        status = "refused"
        log.info("refused, the route followed: %s", msg)
    return status, list(loader)


def dataloader_batches(dataset, make_kw) -> list:
    return list(torch.utils.data.DataLoader(dataset, **make_kw()))


def detection_datasets(coco, augmentation: str | None, train: bool):
    """get_coco(..., use_v2=True): CocoDetection with the preset, v2-wrapped with boxes, labels and image_id; the
    training set without images lacking annotations. Also the same dataset built without its transforms."""
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2

    _, img, ann = coco
    preset = detection_preset(augmentation)
    built = []
    for transforms_ in (preset, None):
        base = CocoDetection(img, ann, transforms=transforms_)
        ds = wrap_dataset_for_transforms_v2(base, target_keys=["boxes", "labels", "image_id"])
        built.append(coco_train_subset(ds, base, has_a_box) if train else ds)
    return built[0], built[1], preset


def train_kw(seed: int, dataset, batch_size: int, collate_fn):
    """train.py with ``--aspect-ratio-group-factor -1``: BatchSampler(RandomSampler(dataset), drop_last=True)
    (the sampler given a seeded generator, so that both loaders read one order)."""
    def make():
        sampler = torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed))
        return {"batch_sampler": torch.utils.data.BatchSampler(sampler, batch_size, drop_last=True), "num_workers": 4,
                "collate_fn": collate_fn}  # fmt: skip
    return make


def test_detection_reference_faster_rcnn_use_v2(coco, tmp_path):
    """Faster R-CNN's default ``--data-augmentation hflip --use-v2``: each item the DataLoader's image and boxes, or
    their horizontal mirror (both together), with its image_id and labels at every position."""
    dataset, plain, preset = detection_datasets(coco, "hflip", train=True)
    make = train_kw(5, dataset, 2, detection_collate)
    status, got = swap_or_route(dataset, plain, preset, make, tmp_path / "cache")
    want = dataloader_batches(dataset, make)
    assert status == "served" and len(got) == len(want) == 2  # 5 images with boxes, batches of 2
    for (gi, gt), (wi, wt) in zip(got, want, strict=True):
        for a, ta, b, tb in zip(gi, gt, wi, wt, strict=True):
            assert ta["image_id"] == tb["image_id"] and torch.equal(ta["labels"], tb["labels"])
            assert a.dtype == b.dtype == torch.float32 and a.shape == b.shape
            w = b.shape[-1]
            mirrored = torch.stack([w - tb["boxes"][:, 2], tb["boxes"][:, 1], w - tb["boxes"][:, 0], tb["boxes"][:, 3]], 1)
            if (a - b).abs().max() <= 2 / 255:
                assert torch.allclose(ta["boxes"], tb["boxes"], atol=1e-4)
            else:
                assert (a - b.flip(-1)).abs().max() <= 2 / 255
                assert torch.allclose(ta["boxes"], mirrored, atol=1e-4)


def test_detection_reference_ssdlite_use_v2(coco, tmp_path):
    """SSDlite's ``--data-augmentation ssdlite --use-v2`` (RandomIoUCrop, flip): at every position the DataLoader's
    image_id, a window of that image with boxes inside it, labels among that image's."""
    dataset, plain, preset = detection_datasets(coco, "ssdlite", train=True)
    make = train_kw(7, dataset, 2, detection_collate)
    status, got = swap_or_route(dataset, plain, preset, make, tmp_path / "cache")
    want = dataloader_batches(dataset, make)
    assert status == "served" and len(got) == len(want) == 2
    whole = {t["image_id"]: t for _, t in (plain[i] for i in range(len(plain)))}
    for (gi, gt), (wi, wt) in zip(got, want, strict=True):
        for a, ta, tb in zip(gi, gt, wt, strict=True):
            assert ta["image_id"] == tb["image_id"]
            full = whole[ta["image_id"]]
            h, w = full["boxes"].canvas_size
            assert a.dtype == torch.float32 and a.shape[0] == 3 and a.shape[1] <= h and a.shape[2] <= w
            boxes = ta["boxes"]
            assert bool((boxes[:, 0::2] >= 0).all() and (boxes[:, 0::2] <= a.shape[2]).all() and (boxes[:, 1::2] <= a.shape[1]).all())
            assert set(ta["labels"].tolist()) <= set(full["labels"].tolist())


def test_detection_reference_evaluation_use_v2(coco, tmp_path):
    """DetectionPresetEval with --use-v2, a SequentialSampler, batches of 1: every item the dataset's own."""
    dataset, plain, preset = detection_datasets(coco, None, train=False)

    def make():
        return {"batch_size": 1, "sampler": torch.utils.data.SequentialSampler(dataset), "num_workers": 4,
                "collate_fn": detection_collate}  # fmt: skip

    status, got = swap_or_route(dataset, plain, preset, make, tmp_path / "cache")
    assert status == "served" and len(got) == len(dataset) == 6
    for i, ((image,), (target,)) in enumerate(got):
        want_image, want_target = dataset[i]
        assert torch.equal(image, want_image) and target.keys() == want_target.keys()
        assert all(torch.equal(torch.as_tensor(target[k]), torch.as_tensor(want_target[k])) for k in target)


def segmentation_collate(batch):
    """references/segmentation/utils.py's collate_fn: images padded with 0 and masks with 255 to the largest."""
    def cat_list(xs, fill):
        size = tuple(max(s) for s in zip(*[x.shape for x in xs]))
        out = xs[0].new_full((len(xs), *size), fill)
        for x, o in zip(xs, out):
            o[..., : x.shape[-2], : x.shape[-1]].copy_(x)
        return out

    images, targets = zip(*batch)
    return cat_list(images, 0), cat_list(targets, 255)


def check_segmentation(got, want, allowed) -> None:
    """Both loaders' batches: (2, 3, 480, 480) float32 images, (2, 480, 480) int64 masks, each position's classes
    among those of the image the sampler put there (``allowed[i]``, with 0 and 255)."""
    assert len(got) == len(want) == len(allowed)
    for batches in (got, want):
        for (images, masks), classes in zip(batches, allowed):
            assert images.shape == (2, 3, 480, 480) and images.dtype == torch.float32
            assert masks.shape == (2, 480, 480) and masks.dtype == torch.int64
            for m, ok in zip(masks, classes):
                assert set(m.unique().tolist()) <= ok | {0, 255}, (set(m.unique().tolist()), ok)


def seg_kw(seed: int, dataset):
    """train.py: RandomSampler (seeded, so that both loaders read one order), batches of 2, drop_last=True."""
    def make():
        return {"batch_size": 2, "sampler": torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed)),
                "num_workers": 4, "collate_fn": segmentation_collate, "drop_last": True}  # fmt: skip
    return make


def order(dataset, seed: int) -> list[int]:
    return list(torch.utils.data.RandomSampler(dataset, generator=torch.Generator().manual_seed(seed)))


def test_segmentation_reference_coco_use_v2(coco, tmp_path):
    """references/segmentation with ``--dataset coco --use-v2``: get_coco wraps CocoDetection(transforms=
    Compose([CocoDetectionToVOCSegmentation(), SegmentationPresetTrain(base_size=520, crop_size=480)])) for masks and
    labels, training on images with more than 1000 pixels of VOC's categories."""
    from torchvision import tv_tensors
    from torchvision.datasets import CocoDetection, wrap_dataset_for_transforms_v2
    from torchvision.transforms import v2 as T

    root, img, ann = coco
    # (the fixture's degenerate annotation has an empty polygon list, which the wrapper's mask decoding cannot read
    # with either loader: the segmentation case reads the annotation file without it)
    content = json.loads(Path(ann).read_text())
    content["annotations"] = [a for a in content["annotations"] if a["segmentation"]]
    ann = root / "instances-segmentation.json"
    ann.write_text(json.dumps(content))
    from segmentation_reference import SegmentationPresetTrain as Preset, v2_extras

    preset = Preset(base_size=520, crop_size=480, use_v2=True)  # presets.py's --use-v2 form, PadIfSmaller and all
    transforms_ = T.Compose([v2_extras()[1](), preset])
    voc_ids = {0, 5, 2, 16, 9, 44, 6, 3, 17, 62, 21, 67, 18, 19, 4, 1, 64, 20, 63, 7, 72}

    def keep(anns):
        return sum(a["area"] for a in anns if a["category_id"] in voc_ids) > 1000

    built = []
    for t in (transforms_, None):
        base = CocoDetection(img, ann, transforms=t)
        built.append(coco_train_subset(wrap_dataset_for_transforms_v2(base, target_keys={"masks", "labels"}), base, keep))
    dataset, plain = built
    status, got = swap_or_route(dataset, plain, transforms_, seg_kw(3, dataset), tmp_path / "cache")
    want = dataloader_batches(dataset, seg_kw(3, dataset))
    assert status == "served"
    to_voc = {3: 7, 7: 19}  # the fixture's COCO ids in VOC's numbering (11 is not a VOC category)
    classes = [{to_voc[int(c)] for c in plain[i][1]["labels"] if int(c) in to_voc} for i in order(dataset, 3)]
    check_segmentation(got, want, [classes[k : k + 2] for k in range(0, len(classes) - 1, 2)])


def test_segmentation_reference_voc(tmp_path):
    """references/segmentation with ``--dataset voc`` (v1 only: train.py refuses --use-v2 beside VOC):
    VOCSegmentation(transforms=SegmentationPresetTrain(base_size=520, crop_size=480)), the preset's own v1 steps
    (random resize of both to 260..1040, flip, pad with 0 / 255 and a random 480 crop, tensors, normalise) written
    here with torchvision's functional calls."""
    from torchvision.datasets import VOCSegmentation

    from segmentation_reference import SegmentationPresetTrain as Preset
    from test_annotated import write_voc

    root = write_voc(tmp_path)
    preset = Preset(base_size=520, crop_size=480)  # the reference's v1 classes
    dataset = VOCSegmentation(root, year="2012", image_set="train", transforms=preset)
    plain = VOCSegmentation(root, year="2012", image_set="train")
    status, got = swap_or_route(dataset, plain, preset, seg_kw(1, dataset), tmp_path / "cache")
    want = dataloader_batches(dataset, seg_kw(1, dataset))
    assert status == "served"
    classes = [{k + 1} for k in order(dataset, 1)]  # image k of the fixture holds class k + 1
    check_segmentation(got, want, [classes[:2]])  # 3 images, batches of 2, the last dropped


# ============================================================================ DeiT's --ThreeAugment with its own classes


def deit_three_augment(img_size: int, color_jitter: float):
    """DeiT augment.py's ``new_data_aug_generator`` (``--src`` off): timm's RandomResizedCropAndInterpolation
    (bicubic), a flip, RandomChoice of its own gray_scale, Solarization and GaussianBlur (each p=1.0, the classes as
    augment.py writes them), ColorJitter, ToTensor, Normalize with tensor mean and std."""
    import random

    from PIL import ImageFilter, ImageOps
    from timm.data.transforms import RandomResizedCropAndInterpolation

    class GaussianBlur(object):
        def __init__(self, p=0.1, radius_min=0.1, radius_max=2.):
            self.prob = p
            self.radius_min = radius_min
            self.radius_max = radius_max

        def __call__(self, img):
            if not random.random() <= self.prob:
                return img
            return img.filter(ImageFilter.GaussianBlur(radius=random.uniform(self.radius_min, self.radius_max)))

    class Solarization(object):
        def __init__(self, p=0.2):
            self.p = p

        def __call__(self, img):
            return ImageOps.solarize(img) if random.random() < self.p else img

    class gray_scale(object):  # noqa: N801 - DeiT's name
        def __init__(self, p=0.2):
            self.p = p
            self.transf = transforms.Grayscale(3)

        def __call__(self, img):
            return self.transf(img) if random.random() < self.p else img

    primary = [RandomResizedCropAndInterpolation(img_size, scale=(0.08, 1.0), interpolation="bicubic"), transforms.RandomHorizontalFlip()]
    secondary = [transforms.RandomChoice([gray_scale(p=1.0), Solarization(p=1.0), GaussianBlur(p=1.0)]),
                 transforms.ColorJitter(color_jitter, color_jitter, color_jitter)]  # fmt: skip
    final = [transforms.ToTensor(), transforms.Normalize(mean=torch.tensor(IMAGENET_MEAN), std=torch.tensor(IMAGENET_STD))]
    return transforms.Compose(primary + secondary + final)


def test_deit_three_augment_with_its_own_classes(gradients, tmp_path):
    """DeiT main.py ``--ThreeAugment``: ``data_loader_train.dataset.transform = new_data_aug_generator(args)`` after the
    loader is built. Both loaders give every image once per epoch at the crop size, and a third of the images gray
    (RandomChoice of three; the jitter has no hue, so a gray image stays gray): a binomial count at alpha 0.001."""
    stats = pytest.importorskip("scipy.stats")
    from timm.data import create_transform

    dataset = datasets.ImageFolder(gradients / "train", transform=create_transform(32, is_training=True))
    m, s = torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), torch.tensor(IMAGENET_STD).view(1, 3, 1, 1)
    epochs, n = 6, len(dataset)
    lo, hi = stats.binom.ppf([0.0005, 0.9995], epochs * n, 1 / 3)
    for which in ("torch", "fastload"):
        Loader, extra = (fastload.FastLoader, fast_extra(tmp_path)) if which == "fastload" else (torch.utils.data.DataLoader, {})
        loader = Loader(dataset, sampler=torch.utils.data.RandomSampler(dataset), batch_size=6, drop_last=True, **extra)
        loader.dataset.transform = deit_three_augment(32, 0.3)
        gray = 0
        for _ in range(epochs):
            batches = list(loader)
            images = torch.cat([x for x, _ in batches])
            assert images.shape == (n, 3, 32, 32) and images.dtype == torch.float32, which
            assert Counter(torch.cat([y for _, y in batches]).tolist()) == Counter(dataset.targets), which
            pixels = images * s + m
            # gray: channels within 4 levels (the graph's jitter is within a level or two of torchvision's per
            # channel, documented; these colour gradients' channels differ by 50 levels and more)
            gray += int(((pixels.amax(1) - pixels.amin(1)).flatten(1).amax(1) < 4 / 255).sum())
        assert lo <= gray <= hi, (which, gray, lo, hi)


def test_an_unknown_class_made_in_a_function_is_refused_by_name_without_its_address():
    """A step inside RandomChoice that the reader does not know (here DeiT's gray_scale with one attribute more), its
    class made inside a function as scripts and tests do: the refusal names it and shows no address."""
    from fastload.transforms import translate

    t = deit_three_augment(32, 0.3)
    choice = t.transforms[2]
    choice.transforms[0].extra = 1  # no longer the class augment.py writes
    with pytest.raises(ConfigError) as e:
        translate(t)
    msg = str(e.value)
    assert "gray_scale()" in msg and " at 0x" not in msg, msg
