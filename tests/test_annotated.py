"""torchvision's CocoDetection, VOCSegmentation and VOCDetection through FastLoader: every item compared with the dataset object's own.

The expected values are what the torchvision dataset objects return (``dataset[i]``) on a COCO
annotation file written in pycocotools' JSON layout (non-contiguous category ids, a crowd RLE, a
degenerate box, an image without annotations, non-square images) and on a VOC tree (palette PNG
masks with a 255 border, XML annotations). Each refusal's advice is followed to a working loader.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

pytest.importorskip("pycocotools")
from PIL import Image  # noqa: E402
from torchvision.datasets import CocoDetection, VOCDetection, VOCSegmentation, wrap_dataset_for_transforms_v2  # noqa: E402
from torchvision.transforms import v2  # noqa: E402

import fastload  # noqa: E402
from fastload.errors import ConfigError  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from coco_fixture import IMAGES, write_coco  # noqa: E402
from item_checks import same  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def pairs(batch):
    """The detection references' collate_fn."""
    return tuple(zip(*batch))



@pytest.fixture(scope="module")
def coco(tmp_path_factory):
    root = tmp_path_factory.mktemp("coco")
    img, ann, _ = write_coco(root)
    return root, str(img), str(ann)


def load(ds, root, **kw):
    kw.setdefault("collate_fn", pairs)
    return fastload.FastLoader(ds, cache_dir=root / "cache", progress=False, num_threads=2, **kw)


def served(loader):
    return [item for images, targets in loader for item in zip(images, targets)]


def test_coco_detection_items_are_the_datasets_own(coco):
    root, img, ann = coco
    ds = CocoDetection(img, ann)
    got = served(load(ds, root, batch_size=4))
    assert len(got) == len(ds) == len(IMAGES)
    for i, (image, target) in enumerate(got):
        want_image, want_target = ds[i]
        assert same(image, want_image), i
        assert target == want_target, i  # category ids, crowd RLEs, area, segmentation, the degenerate box: as given
    crowd = [a for _, t in got for a in t if a["iscrowd"]]
    assert crowd and isinstance(crowd[0]["segmentation"], dict)  # kept, as the dataset gives it
    assert {a["category_id"] for _, t in got for a in t} == {3, 7, 11}  # COCO's ids, not 1..K


def test_coco_subset_of_a_v2_wrapped_dataset_with_transforms(coco):
    root, img, ann = coco
    convert = v2.Compose([v2.ToImage(), v2.ToDtype(torch.float32, scale=True)])
    keys = {"image_id", "boxes", "labels", "masks", "area", "iscrowd"}
    wrapped = wrap_dataset_for_transforms_v2(CocoDetection(img, ann, transforms=convert), target_keys=keys)
    order = [3, 1, 2, 5, 4]  # image 0's degenerate annotation has no polygon: torchvision's own wrapper fails on it
    sub = torch.utils.data.Subset(wrapped, order)
    got = served(load(sub, root, batch_size=2))
    assert len(got) == len(order)
    for p, (image, target) in zip(order, got):
        want_image, want_target = wrapped[p]
        assert same(image, want_image) and same(target, want_target), p
    assert type(got[0][1]["boxes"]).__name__ == "BoundingBoxes" and got[0][1]["boxes"].format.name == "XYXY"
    assert got[0][1]["image_id"] == 100 + 7 * 3


def test_default_wrapper_and_nested_subsets(coco):
    root, img, ann = coco
    wrapped = wrap_dataset_for_transforms_v2(CocoDetection(img, ann))
    sub = torch.utils.data.Subset(torch.utils.data.Subset(wrapped, [5, 4, 3, 2, 1, 0]), [1, 3, 0])
    got = served(load(sub, root, batch_size=3))
    for k, (image, target) in enumerate(got):
        assert same(image, sub[k][0]) and same(target, sub[k][1]), k


class Grouped(torch.utils.data.Sampler):
    """The references' GroupedBatchSampler in small: batches of images of one aspect group (wide or not)."""

    def __init__(self, groups, batch_size):
        self.groups, self.batch_size = groups, batch_size

    def __iter__(self):
        for g in sorted(set(self.groups)):
            idx = [i for i, x in enumerate(self.groups) if x == g]
            for s in range(0, len(idx), self.batch_size):
                yield idx[s : s + self.batch_size]

    def __len__(self):
        return sum(-(-self.groups.count(g) // self.batch_size) for g in set(self.groups))


def test_batch_sampler_and_collate_fn_are_honoured(coco):
    root, img, ann = coco
    ds = CocoDetection(img, ann)
    groups = [int(w > h) for (h, w), _ in IMAGES]
    calls = []

    def collate(batch):
        calls.append(len(batch))
        return [ds.ids.index(t[0]["image_id"]) if t else None for _, t in batch]

    sampler = Grouped(groups, 2)
    loader = load(ds, root, batch_sampler=sampler, collate_fn=collate)
    want = list(sampler)
    assert len(loader) == len(want) and loader.batch_sampler is sampler
    got = list(loader)
    assert calls == [len(b) for b in want]
    assert got == [[i if ds[i][1] else None for i in b] for b in want]
    with pytest.raises(ConfigError, match="mutually exclusive"):
        load(ds, root, batch_sampler=sampler, batch_size=4)


def test_shuffle_is_a_seeded_permutation_of_every_item(coco):
    root, img, ann = coco
    ds = CocoDetection(img, ann)
    a = load(ds, root, batch_size=2, shuffle=True, seed=3)
    ids = lambda loader: [t[0]["image_id"] if t else -1 for _, t in served(loader)]  # noqa: E731
    first, second = ids(a), ids(a)
    assert sorted(first) == sorted(t[0]["image_id"] if t else -1 for _, t in (ds[i] for i in range(len(ds))))
    assert first != second  # the next epoch, a new order
    a.set_epoch(0)
    assert ids(a) == first


def test_default_collate_is_dataloaders(coco):
    """collate_fn=None: DataLoader's default_collate, which fails on COCO's annotation lists as a DataLoader's does."""
    root, img, ann = coco
    ds = CocoDetection(img, ann, transform=v2.Compose([v2.ToImage(), v2.Resize((32, 32))]))  # Resize: run as it is
    with pytest.raises(Exception) as theirs:
        list(torch.utils.data.DataLoader(ds, batch_size=2, collate_fn=None))
    with pytest.raises(type(theirs.value)) as mine:
        list(load(ds, root, batch_size=2, collate_fn=None))
    assert str(mine.value) == str(theirs.value)


def test_a_random_step_is_refused_by_name_and_the_route_works(coco):
    root, img, ann = coco
    rotate = v2.RandomRotation(degrees=(30, 30))  # random in kind (not translated), fixed in value here
    transforms = v2.Compose([v2.ToImage(), rotate, v2.ToDtype(torch.float32, scale=True)])
    ds = wrap_dataset_for_transforms_v2(CocoDetection(img, ann, transforms=transforms))
    with pytest.raises(ConfigError) as e:
        load(ds, root, batch_size=2)
    msg = str(e.value)
    assert f"step 2 of 3, {rotate!r}" in msg and "TransformsCollate(transforms, collate_fn)" in msg
    assert " at 0x" not in msg
    # the route: the dataset without the step, the transforms in collate_fn
    plain = wrap_dataset_for_transforms_v2(CocoDetection(img, ann))
    got = served(load(plain, root, batch_size=2, collate_fn=fastload.TransformsCollate(transforms)))
    for i, (image, target) in enumerate(got):
        want_image, want_target = ds[i]  # a fixed angle: the dataset's own rotation is deterministic
        assert same(image, want_image) and same(target, want_target), i


def test_target_transform_and_subclasses_are_refused_with_a_working_route(coco):
    root, img, ann = coco
    f = lambda t: [a for a in t if not a["iscrowd"]]  # noqa: E731
    with pytest.raises(ConfigError, match=r"target_transform .*TransformsCollate") as e:
        load(CocoDetection(img, ann, target_transform=f), root, batch_size=2)
    assert " at 0x" not in str(e.value)
    got = served(load(CocoDetection(img, ann), root, batch_size=3, collate_fn=fastload.TransformsCollate(lambda im, t: (im, f(t)))))
    assert [t for _, t in got] == [f(CocoDetection(img, ann)[i][1]) for i in range(len(got))]

    class Own(CocoDetection):  # as the references' v1 coco_utils.CocoDetection: its own __getitem__
        def __getitem__(self, i):
            im, t = super().__getitem__(i)
            return im, {"image_id": self.ids[i], "annotations": t}

    with pytest.raises(ConfigError, match=r"Own.__getitem__ overrides torchvision's CocoDetection.*TransformsCollate") as e:
        load(Own(img, ann), root, batch_size=2)
    assert " at 0x" not in str(e.value)
    plain = CocoDetection(img, ann)
    add = fastload.TransformsCollate(lambda im, t: (im, {"image_id": t[0]["image_id"] if t else None, "annotations": t}))
    got = served(load(plain, root, batch_size=2, collate_fn=add))
    own = Own(img, ann)
    assert [t["annotations"] for _, t in got] == [own[i][1]["annotations"] for i in range(len(own))]


def test_other_fastloader_keywords_are_refused(coco):
    root, img, ann = coco
    with pytest.raises(ConfigError, match=r"mean=.*does not apply.*give the dataset the transforms"):
        load(CocoDetection(img, ann), root, batch_size=2, mean=(0.5, 0.5, 0.5))


# ----------------------------------------------------------------------------- VOC

VOC_SIZES = [(60, 90), (75, 50), (40, 40)]
VOC_NAMES = ["aeroplane", "bicycle", "bird"]


def write_voc(root: Path) -> Path:
    """A VOC2012 tree: JPEG images, palette PNG masks (classes 0..20 and a 255 border), XML annotations."""
    base = root / "VOCdevkit" / "VOC2012"
    for d in ("JPEGImages", "SegmentationClass", "Annotations", "ImageSets/Segmentation", "ImageSets/Main"):
        (base / d).mkdir(parents=True)
    rng = np.random.default_rng(0)
    palette = [int(v) for v in rng.integers(0, 256, 768)]
    names = []
    for k, (h, w) in enumerate(VOC_SIZES):
        name = f"2012_{k:06d}"
        names.append(name)
        Image.fromarray(rng.integers(0, 256, (h, w, 3), dtype=np.uint8)).save(base / "JPEGImages" / f"{name}.jpg", quality=95)
        mask = np.zeros((h, w), np.uint8)
        mask[h // 4 : h // 2, w // 4 : w // 2] = k + 1
        mask[h // 4 - 1, w // 4 - 1 : w // 2 + 1] = 255  # the border VOC marks "ignore"
        pim = Image.fromarray(mask, mode="P")
        pim.putpalette(palette)
        pim.save(base / "SegmentationClass" / f"{name}.png")
        objs = "".join(
            f"<object><name>{VOC_NAMES[j]}</name><difficult>{j % 2}</difficult><bndbox><xmin>{1 + j}</xmin><ymin>2</ymin>"
            f"<xmax>{w - 1}</xmax><ymax>{h - 2 - j}</ymax></bndbox></object>"
            for j in range(k + 1)
        )
        xml = f"<annotation><filename>{name}.jpg</filename><size><width>{w}</width><height>{h}</height><depth>3</depth></size>{objs}</annotation>"
        (base / "Annotations" / f"{name}.xml").write_text(xml)
    for d in ("Segmentation", "Main"):
        (base / "ImageSets" / d / "train.txt").write_text("\n".join(names) + "\n")
    return root


def test_voc_segmentation_masks_keep_their_palette_and_255_border(tmp_path):
    root = write_voc(tmp_path)
    ds = VOCSegmentation(str(root), year="2012", image_set="train")
    got = served(load(ds, tmp_path, batch_size=2))
    assert len(got) == len(VOC_SIZES)
    for i, (image, mask) in enumerate(got):
        want_image, want_mask = ds[i]
        assert same(image, want_image) and same(mask, want_mask), i
        assert mask.mode == "P" and 255 in np.asarray(mask)
    wrapped = wrap_dataset_for_transforms_v2(VOCSegmentation(str(root), year="2012", image_set="train", transforms=v2.ToImage()))
    got = served(load(torch.utils.data.Subset(wrapped, [2, 0]), tmp_path, batch_size=2))
    for p, (image, mask) in zip([2, 0], got):
        assert same(image, wrapped[p][0]) and same(mask, wrapped[p][1]) and type(mask).__name__ == "Mask"


def test_voc_detection_targets_are_the_parsed_xml(tmp_path):
    root = write_voc(tmp_path)
    ds = VOCDetection(str(root), year="2012", image_set="train")
    got = served(load(ds, tmp_path, batch_size=3))
    for i, (image, target) in enumerate(got):
        assert same(image, ds[i][0]) and target == ds[i][1], i
    wrapped = wrap_dataset_for_transforms_v2(ds)
    got = served(load(wrapped, tmp_path, batch_size=3))
    for i, (image, target) in enumerate(got):
        assert same(image, wrapped[i][0]) and same(target, wrapped[i][1]), i


def test_an_annotation_file_edited_gives_a_new_entry(tmp_path):
    root = tmp_path / "c"
    img, ann, _ = write_coco(root)
    first = served(load(CocoDetection(str(img), str(ann)), tmp_path, batch_size=6))
    data = json.loads(ann.read_text())
    data["annotations"][0]["category_id"] = 11
    ann.write_text(json.dumps(data))
    ds = CocoDetection(str(img), str(ann))
    second = served(load(ds, tmp_path, batch_size=6))
    assert first[0][1][0]["category_id"] == 7 and second[0][1] == ds[0][1] and second[0][1][0]["category_id"] == 11
    assert len(list((tmp_path / "cache").glob("*-cocodetection-*[!k]"))) == 2


class PairCompose:
    """The detection references' Compose: steps in .transforms, called on (image, target)."""

    def __init__(self, transforms):
        self.transforms = transforms

    def __call__(self, image, target):
        for t in self.transforms:
            image, target = t(image, target)
        return image, target


def test_a_two_argument_transform_is_named_as_one_and_its_route_works(coco):
    """A joint (image, target) transform given as an image transform is not said to 'do more than its .transforms'."""
    from fastload.transforms import translate

    joint = PairCompose([v2.ToImage(), v2.RandomHorizontalFlip(p=1.0)])
    with pytest.raises(ConfigError) as e:
        translate(joint)
    msg = str(e.value)
    assert "takes (image, target) pairs" in msg and "does more than" not in msg and " at 0x" not in msg
    assert "collate_fn=fastload.TransformsCollate(it, collate_fn)" in msg
    root, img, ann = coco
    got = served(load(CocoDetection(img, ann), root, batch_size=2, collate_fn=fastload.TransformsCollate(joint)))
    own = CocoDetection(img, ann, transforms=joint)
    for i, (image, target) in enumerate(got):
        assert same(image, own[i][0]) and target == own[i][1], i
    with pytest.raises(ConfigError, match=r"step 1 of 1, PairCompose\(\.\.\.\), is not run.*TransformsCollate"):
        load(own, root, batch_size=2)


class BoxPairs(torch.utils.data.Dataset):
    """A script's own detection dataset: (PIL image, {"boxes", "labels"}) items."""

    def __init__(self):
        rng = np.random.default_rng(1)
        self.images = [Image.fromarray(rng.integers(0, 256, (40, 60, 3), dtype=np.uint8)) for _ in range(3)]
        self.boxes = [np.array([[2, 3, 20 + k, 30]], np.float32).repeat(k + 1, 0) for k in range(3)]

    def __len__(self):
        return 3

    def __getitem__(self, i):
        return self.images[i], {"boxes": torch.from_numpy(self.boxes[i]), "labels": torch.arange(1, i + 2)}


def test_a_custom_pair_dataset_is_told_a_route_that_works(tmp_path):
    ds = BoxPairs()
    with pytest.raises(ConfigError) as e:
        fastload.FastLoader(ds, batch_size=2)
    msg = e.value.details  # the whole text (the line is capped at fastload.errors.MAX_MESSAGE)
    assert "(image, target) pairs with a dict target" in msg and " at 0x" not in msg
    assert "fields={'boxes': 'float32[][4]', 'labels': 'int64[]'}" in msg
    # the route, as the message writes it
    items = [{"image": np.asarray(im), "boxes": t["boxes"].numpy(), "labels": t["labels"].numpy()} for im, t in (ds[i] for i in range(3))]
    fastload.pack_dataset(items, tmp_path / "out", fields={"boxes": "float32[][4]", "labels": "int64[]"}, workers=1, progress=False)
    loader = fastload.FastLoader(tmp_path / "out", 3, fields=("image", "boxes", "labels"), min_size=40, max_size=1000, device="cpu")
    images, targets = next(iter(loader))
    for i, t in enumerate(targets):  # min_size = the shorter side: scale 1, boxes as packed
        assert torch.equal(t["boxes"], ds[i][1]["boxes"]) and torch.equal(t["labels"], ds[i][1]["labels"])


def test_png_palette_and_gray_images_decode_as_the_dataset_loads_them(tmp_path):
    """Images that are not RGB JPEGs (RGBA, palette, 16-bit gray PNGs) come back as Image.open(f).convert("RGB") gives them."""
    root = tmp_path / "c"
    img, ann, _ = write_coco(root)
    data = json.loads(ann.read_text())
    rng = np.random.default_rng(5)
    kinds = {0: lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w, 4), dtype=np.uint8), "RGBA"),
             1: lambda h, w: Image.fromarray(rng.integers(0, 256, (h, w), dtype=np.uint8)).convert("P"),
             2: lambda h, w: Image.fromarray(rng.integers(0, 65536, (h, w), dtype=np.uint16))}  # fmt: skip
    for k, make in kinds.items():
        im = data["images"][k]
        name = f"odd_{k}.png"
        make(im["height"], im["width"]).save(img / name)
        im["file_name"] = name
    ann.write_text(json.dumps(data))
    ds = CocoDetection(str(img), str(ann))
    got = served(load(ds, tmp_path, batch_size=3))
    for i, (image, target) in enumerate(got):
        assert same(image, ds[i][0]) and target == ds[i][1], i


def test_a_distributed_sampler_is_read_as_given_with_its_epoch(coco):
    root, img, ann = coco
    ds = CocoDetection(img, ann)
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=2, rank=1, shuffle=True, seed=4)
    loader = load(ds, root, batch_size=2, sampler=sampler)
    image_id = lambda t: t[0]["image_id"] if t else None  # noqa: E731
    for epoch in (0, 3):
        loader.set_epoch(epoch)
        got = [image_id(t) for _, t in served(loader)]
        sampler.set_epoch(epoch)
        assert got == [image_id(ds[i][1]) for i in sampler], epoch
