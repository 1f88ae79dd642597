"""Subsets, random_split, ConcatDataset and ImageNet: read as torch reads them, packed once.

The oracle is torch itself: for every construction, what ``dataset[p]`` of the torch object
gives (and what ``torch.utils.data.DataLoader`` over it yields, in order) is what the view
(:mod:`fastload.composite`, made by :func:`fastload.datasets.resolve_dataset`) and FastLoader
give. Images are solid colours encoding (label, index in their folder) (conftest).
"""

from __future__ import annotations

import io
import os
import pickle

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils.data import ConcatDataset, DataLoader, Dataset as TorchDataset, IterableDataset, Subset, random_split

import fastload
from fastload import ConfigError, FastLoader, LoaderError
from fastload.cache import cache_entry
from fastload.datasets import plan_dataset, resolve_dataset
from fastload.composite import DatasetView, PartBuffers, concat, subset
from fastload.errors import CorruptDataError
from fastload.reader import ReadAhead

from conftest import decode_batch, encode_color, write_image

tv = pytest.importorskip("torchvision")
from torchvision import transforms as T  # noqa: E402
from torchvision.datasets import ImageFolder, ImageNet  # noqa: E402

EVAL = T.Compose([T.Resize(32), T.CenterCrop(32), T.PILToTensor()])


def _pixels(payload) -> np.ndarray:
    with Image.open(io.BytesIO(bytes(payload))) as im:
        return np.asarray(im.convert("RGB"))


def _assert_reads_like_torch(view, obj) -> None:
    """Every position: the label and the exact pixels torch's ``obj[p]`` gives (no transform)."""
    assert len(view) == len(obj)
    assert [int(y) for y in view.labels] == [int(obj[p][1]) for p in range(len(obj))]
    for p in range(len(obj)):
        payload, label = view[p]
        img, target = obj[p]
        assert label == target, p
        assert np.array_equal(_pixels(payload), np.asarray(img)), p


def _entries(cache) -> list[str]:
    return sorted(n for n in os.listdir(cache) if not n.endswith(".lock"))


@pytest.fixture
def folder(make_folder):
    return make_folder(classes=3, per_class=5, size=(64, 48))


def _constructions(ds: ImageFolder, other: ImageFolder) -> dict:
    a, b = random_split(ds, [9, 6], generator=torch.Generator().manual_seed(7))
    g = torch.Generator().manual_seed(3)
    return {
        "subset": Subset(ds, [14, 0, 3, 3, -1, 7]),  # repeated and negative indices, as torch reads them
        "subset_tensor": Subset(ds, torch.tensor([2, 5, 11])),
        "random_split": a,
        "random_split_other": b,
        "random_split_fractions": random_split(ds, [0.6, 0.4], generator=g)[1],
        "concat": ConcatDataset([ds, other]),
        "concat_of_splits": ConcatDataset([b, a]),
        "nested": Subset(Subset(ConcatDataset([a, Subset(other, range(0, 15, 2))]), [10, 2, 0, 5, 1]), [4, 0, 2]),
        "subset_of_concat_of_the_same": Subset(ConcatDataset([ds, ds]), [29, 0, 15, 14]),
    }


# ----------------------------------------------------------------------------- the view, against torch


@pytest.mark.parametrize("kind", ["subset", "subset_tensor", "random_split", "random_split_other", "random_split_fractions",
                                  "concat", "concat_of_splits", "nested", "subset_of_concat_of_the_same"])  # fmt: skip
def test_the_view_gives_torchs_items_in_torchs_order(folder, make_folder, tmp_path, kind):
    ds, other = ImageFolder(str(folder)), ImageFolder(str(make_folder(classes=3, per_class=5, size=(40, 56))))
    obj = _constructions(ds, other)[kind]
    r = resolve_dataset(obj, cache_dir=tmp_path / "c", progress=False)
    assert isinstance(r.dataset, DatasetView) and isinstance(r.dataset, fastload.Dataset)
    _assert_reads_like_torch(r.dataset, obj)
    assert r.dataset.classes == ds.classes
    # the torch object's own (path, target) per position, for the loader's dataset view
    want = [(obj[p][1], None) for p in range(len(obj))]
    assert [t for _p, t in r.plan.samples] == [t for t, _ in want]
    rb = r.dataset.read_batch(np.arange(len(obj))[::-1])
    assert not rb.errors
    for q, p in enumerate(range(len(obj))[::-1]):
        assert bytes(rb.payloads[q]) == r.dataset[p][0]
        assert (rb.widths[q], rb.heights[q]) == obj[p][0].size


def test_an_image_folder_alone_is_todays_entry_and_every_subset_reuses_it(folder, tmp_path):
    ds = ImageFolder(str(folder))
    plain = resolve_dataset(ds, cache_dir=tmp_path / "c", progress=False).dataset
    assert type(plain) is fastload.Dataset and plain.path == cache_entry(ds, cache_dir=tmp_path / "c")
    made = [_entries(tmp_path / "c")]
    a, b = random_split(ds, [10, 5], generator=torch.Generator().manual_seed(0))
    for obj in (Subset(ds, [1, 2]), a, b, ConcatDataset([a, b, ds]), Subset(Subset(a, [0, 1]), [1])):
        view = resolve_dataset(obj, cache_dir=tmp_path / "c", progress=False).dataset
        assert [p.path for p in view.parts] == [plain.path]  # one part: the ImageFolder's entry
        made.append(_entries(tmp_path / "c"))
    assert all(m == [plain.path.name] for m in made)  # one entry, however many subsets use it


def test_a_concatenation_of_two_folders_reads_from_both_and_reuses_each_parts_buffer(folder, make_folder, tmp_path):
    train, val = ImageFolder(str(folder)), ImageFolder(str(make_folder(classes=3, per_class=2, size=(40, 56))))
    obj = ConcatDataset([train, val])
    view = resolve_dataset(obj, cache_dir=tmp_path / "c", progress=False).dataset
    assert len(view.parts) == 2 and len(_entries(tmp_path / "c")) == 2
    assert view.manifest.num_samples == 21 and view.manifest.class_counts == [7, 7, 7]
    assert view.manifest.options["max_pixels"] == max(p.manifest.max_pixels for p in view.parts)
    assert view.manifest.stats["width"]["max"] == 64 and view.manifest.stats["width"]["min"] == 40
    order = [20, 0, 16, 3, 15]
    rb = view.read_batch(order)
    assert isinstance(rb.buffer, PartBuffers) and sorted(rb.buffer.held) == [0, 1]
    again = view.read_batch(order, buffer=rb.buffer)
    assert {k: b.ctypes.data for k, b in again.buffer.held.items()} == {k: b.ctypes.data for k, b in rb.buffer.held.items()}
    for q, p in enumerate(order):
        assert np.array_equal(_pixels(again.payloads[q]), np.asarray(obj[p][0]))
    view.prefetch(order)
    view.evict(order)
    with ReadAhead(view, threads=2, depth=2) as ra:  # what FastLoader's core builds on its dataset
        assert [list(b) for b in ra.ahead([[0, 20], [5]])] == [[0, 20], [5]]


def test_views_of_views_flatten_and_pickle(folder, tmp_path):
    packed = fastload.Dataset(fastload.cache.cached_pack(ImageFolder(str(folder)), cache_dir=tmp_path / "c", progress=False))
    v = subset(concat([subset(packed, [4, 3]), packed]), [0, 16, 1])
    assert len(v.parts) == 1 and v.index_in_part.tolist() == [4, 14, 3]
    copy = pickle.loads(pickle.dumps(v))
    assert [copy[p] for p in range(3)] == [packed[4], packed[14], packed[3]]
    with pytest.raises(IndexError, match="sample index 3 out of range"):
        v[3]
    with pytest.raises(ConfigError, match=r"indices\[1\] is 99, out of range for a dataset of 15 samples"):
        subset(packed, [0, 99])


def test_a_subset_of_a_packed_dataset_is_a_view_of_it(folder, tmp_path):
    """What the refusal of a custom dataset advises: pack it, then Subset(fastload.Dataset(OUT), indices)."""
    fastload.pack_dataset(ImageFolder(str(folder)), tmp_path / "out", progress=False, workers=1)
    packed = fastload.Dataset(tmp_path / "out")
    obj = Subset(packed, [3, 0, 14])
    r = resolve_dataset(ConcatDataset([obj, packed]), cache_dir=tmp_path / "c", progress=False)
    assert r.transform is None and r.plan.samples is None and not os.path.exists(tmp_path / "c")
    assert [r.dataset[p] for p in range(3)] == [packed[3], packed[0], packed[14]] and len(r.dataset) == 18
    assert r.dataset.parts == (packed,)


def test_the_user_index_and_the_source_path_name_a_corrupted_record(folder, tmp_path):
    ds = ImageFolder(str(folder))
    obj = Subset(ds, [9, 4, 12])
    view = resolve_dataset(obj, cache_dir=tmp_path / "c", progress=False, check=True).dataset
    shard, off, n = view.locate(1)  # position 1: the folder's sample 4
    raw = bytearray(open(shard, "rb").read())
    raw[off + n - 10] ^= 0x01
    with open(shard, "wb") as f:
        f.write(bytes(raw))
    src = os.path.abspath(ds.samples[4][0])
    fresh = resolve_dataset(obj, cache_dir=tmp_path / "c", progress=False, check=True).dataset
    with pytest.raises(CorruptDataError) as e:
        fresh[1]
    msg = str(e.value)
    assert msg.startswith(f"sample 1 of Subset(ImageFolder({folder})) ({src}); stored as ") and "sample 4" in msg
    assert "checksum mismatch" in msg
    rb = fresh.read_batch([0, 1, 2])
    assert list(rb.errors) == [1] and str(rb.errors[1]) == msg and rb.payloads[0] is not None
    assert fresh.where(1).startswith(f"sample 1 of Subset(ImageFolder({folder})) ({src})")


# ----------------------------------------------------------------------------- ImageNet


def _fake_imagenet(root, split: str = "val") -> None:
    """What torchvision's ImageNet reads once its archives are parsed: meta.bin and <split>/<wnid>/*.JPEG."""
    wnids = ["n01440764", "n01443537", "n01484850"]
    names = {"n01440764": ("tench", "Tinca tinca"), "n01443537": ("goldfish", "Carassius auratus"),
             "n01484850": ("great white shark", "white shark")}  # fmt: skip
    root.mkdir(parents=True)
    torch.save((names, [wnids[k % 3] for k in range(9)]), root / "meta.bin")
    for k, w in enumerate(wnids):
        for j in range(3):
            write_image(root / split / w / f"ILSVRC2012_{split}_{3 * k + j:08d}.JPEG", encode_color(k, 3 * k + j), quality=95)


def test_imagenet_is_read_as_torchvision_reads_it(tmp_path):
    _fake_imagenet(tmp_path / "imagenet")
    inet = ImageNet(str(tmp_path / "imagenet"), split="val")
    assert inet.classes[0] == ("tench", "Tinca tinca")  # tuples of names; targets index the wnids
    r = resolve_dataset(inet, cache_dir=tmp_path / "c", progress=False)
    assert type(r.dataset) is fastload.Dataset and r.dataset.classes == inet.wnids
    assert r.plan.classes == inet.classes and r.plan.class_to_idx == inet.class_to_idx
    assert r.plan.root == inet.root and r.plan.samples == inet.samples
    _assert_reads_like_torch(r.dataset, inet)
    part = Subset(inet, [8, 0, 4])
    view = resolve_dataset(part, cache_dir=tmp_path / "c", progress=False).dataset
    _assert_reads_like_torch(view, part)
    assert _entries(tmp_path / "c") == [r.dataset.path.name]


# ----------------------------------------------------------------------------- refusals


class Pets(TorchDataset):
    """A dataset building its items in Python (accelerate's cv_example keeps one)."""

    def __init__(self, paths):
        self.paths = paths

    def __len__(self):
        return len(self.paths)

    def __getitem__(self, i):
        return {"image": Image.open(self.paths[i]).convert("RGB"), "label": 0}


class Stream(IterableDataset):
    def __iter__(self):
        return iter([])


class Shifted(Subset):
    def __getitem__(self, i):
        return super().__getitem__(i + 1)

    def __getitems__(self, indices):  # torch requires both
        return [self[i] for i in indices]


def test_what_cannot_be_reproduced_is_refused_naming_the_class_the_method_and_what_to_do(folder, tmp_path):
    ds = ImageFolder(str(folder))
    pets = Pets([p for p, _ in ds.samples])
    with pytest.raises(ConfigError) as e:
        resolve_dataset(Subset(pets, [0, 1]), cache_dir=tmp_path / "c", progress=False)
    msg = str(e.value)
    assert "Pets.__getitem__ builds each item in Python" in msg and "fastload.pack_dataset(dataset, OUT)" in msg
    assert msg.startswith("Subset(Pets(...)).dataset: ")
    with pytest.raises(ConfigError, match=r"ConcatDataset\(ImageFolder\(.*\), Pets\(\.\.\.\)\)\.datasets\[1\]: Pets\.__getitem__"):
        plan_dataset(ConcatDataset([ds, pets]))
    with pytest.raises(ConfigError, match=r"Stream\.__iter__ yields its items in Python"):
        plan_dataset(Subset(Stream(), []))
    with pytest.raises(ConfigError, match=r"Shifted\.__getitem__ overrides Subset\.__getitem__"):
        plan_dataset(Shifted(ds, [0]))
    custom = ImageFolder(str(folder), loader=lambda p: Image.open(p).convert("L"))
    with pytest.raises(ConfigError, match=r"^Subset\(ImageFolder\(.*\)\)\.dataset: ImageFolder\(.*\): loads its files with a custom loader"):
        plan_dataset(Subset(custom, [0]))
    with pytest.raises(ConfigError, match=r"\.indices\[1\] is 15, out of range for a dataset of 15 samples"):
        plan_dataset(Subset(ds, [0, 15]))
    assert not os.path.exists(tmp_path / "c")  # nothing packed by a refusal


def test_a_concatenation_of_different_classes_is_refused_naming_both_lists(folder, make_folder, tmp_path):
    a, b = ImageFolder(str(folder)), ImageFolder(str(make_folder(classes=2, per_class=2)))
    with pytest.raises(ConfigError) as e:
        plan_dataset(ConcatDataset([a, b]))
    msg = str(e.value)
    assert "['class_0', 'class_1', 'class_2'] (3)" in msg and "['class_0', 'class_1'] (2)" in msg
    assert ".datasets[0] has the classes" in msg and ".datasets[1]" in msg and "differ at index 2" in msg
    p0 = fastload.Dataset(fastload.cache.cached_pack(a, cache_dir=tmp_path / "c", progress=False))
    p1 = fastload.Dataset(fastload.cache.cached_pack(b, cache_dir=tmp_path / "c", progress=False))
    with pytest.raises(ConfigError, match=r"cannot concatenate them: datasets\[0\] .* has the classes .* and datasets\[1\]"):
        concat([p0, p1])


def test_a_concatenation_of_different_transforms_is_refused_naming_them(folder, make_folder):
    a = ImageFolder(str(folder), transform=EVAL)
    b = ImageFolder(str(make_folder(classes=3, per_class=1)), transform=T.Compose([T.Resize(40), T.CenterCrop(32), T.PILToTensor()]))
    want = r"\.datasets\[0\] has the transform Compose\(.*Resize\(size=32.*and .*\.datasets\[1\] Compose\(.*size=40.*the same one"
    with pytest.raises(ConfigError, match=want):
        plan_dataset(ConcatDataset([a, b]))
    same = ImageFolder(str(make_folder(classes=3, per_class=1)), transform=T.Compose([T.Resize(32), T.CenterCrop(32), T.PILToTensor()]))
    plan = plan_dataset(ConcatDataset([a, Subset(same, [0])]))  # another object, the same steps
    assert plan.transform is EVAL and plan.target_transform is None
    with pytest.raises(ConfigError, match="target_transform"):
        plan_dataset(ConcatDataset([a, ImageFolder(str(folder), transform=EVAL, target_transform=lambda y: y + 1)]))


# ----------------------------------------------------------------------------- through FastLoader
# (FastLoader routes Subset/ConcatDataset/ImageNet through fastload.cache.resolve_dataset)


def _compare_with_dataloader(obj, tmp_path, batch_size=4):
    want = list(DataLoader(obj, batch_size, shuffle=False))
    with FastLoader(obj, batch_size, device="cpu", shuffle=False, cache_dir=tmp_path / "c", progress=False) as ld:
        got = list(ld)
        assert len(ld.dataset) == len(obj)
    assert len(got) == len(want)
    for (x, y), (u, v) in zip(got, want):
        assert x.dtype == u.dtype == torch.uint8 and x.shape == u.shape
        assert torch.equal(y, v)
        assert decode_batch(x.numpy()) == decode_batch(u.numpy())  # the same images, in the same order
        assert (x.int() - u.int()).abs().max() <= 2


def test_fastloader_reads_a_view_of_two_entries_given_directly(folder, make_folder, tmp_path):
    """A view is a fastload.Dataset: FastLoader, its core and its read-ahead read it as one (no wiring needed)."""
    a = fastload.Dataset(fastload.cache.cached_pack(ImageFolder(str(folder)), cache_dir=tmp_path / "c", progress=False))
    other = make_folder(classes=3, per_class=2, size=(40, 56))
    b = fastload.Dataset(fastload.cache.cached_pack(ImageFolder(str(other)), cache_dir=tmp_path / "c", progress=False))
    view = subset(concat([a, b]), [20, 0, 16, 5, 15, 3, 19])
    both = ConcatDataset([ImageFolder(str(folder), transform=EVAL), ImageFolder(str(other), transform=EVAL)])
    obj = Subset(both, [20, 0, 16, 5, 15, 3, 19])
    want = list(DataLoader(obj, 3, shuffle=False))
    with FastLoader(view, 3, device="cpu", shuffle=False, train=False, resize=32, crop=32, mean=None, std=None) as ld:
        got = list(ld)
        assert ld.dataset.targets == [int(obj[p][1]) for p in range(len(obj))]
    for (x, y), (u, v) in zip(got, want, strict=True):
        assert torch.equal(y, v) and decode_batch(x.numpy()) == decode_batch(u.numpy())


@pytest.mark.parametrize("kind", ["subset", "random_split", "concat", "concat_of_splits", "nested"])
def test_fastloader_yields_what_a_dataloader_yields(folder, make_folder, tmp_path, kind):
    ds = ImageFolder(str(folder), transform=EVAL)
    other = ImageFolder(str(make_folder(classes=3, per_class=5, size=(40, 56))), transform=EVAL)
    _compare_with_dataloader(_constructions(ds, other)[kind], tmp_path)
    assert len(_entries(tmp_path / "c")) == (2 if kind in ("concat", "nested") else 1)


def test_fastloader_reads_imagenet_and_its_subsets_as_a_dataloader(tmp_path):
    _fake_imagenet(tmp_path / "imagenet")
    inet = ImageNet(str(tmp_path / "imagenet"), split="val", transform=EVAL)
    _compare_with_dataloader(inet, tmp_path)
    _compare_with_dataloader(Subset(inet, [8, 0, 4, 5, 1]), tmp_path)


def test_fastloader_names_the_position_and_file_of_a_corrupted_record(folder, tmp_path):
    ds = ImageFolder(str(folder), transform=EVAL)
    obj = Subset(ds, [9, 4, 12, 0])
    view = resolve_dataset(obj, cache_dir=tmp_path / "c", progress=False).dataset
    shard, off, n = view.locate(1)
    raw = bytearray(open(shard, "rb").read())
    raw[off + n - 10] ^= 0x01
    with open(shard, "wb") as f:
        f.write(bytes(raw))
    with FastLoader(obj, 4, device="cpu", shuffle=False, cache_dir=tmp_path / "c", progress=False, check=True) as ld:
        with pytest.raises(LoaderError) as e:
            list(ld)
    assert f"sample 1 of Subset(ImageFolder({folder})) ({os.path.abspath(ds.samples[4][0])})" in str(e.value)


def test_fastloader_refuses_a_subset_of_a_custom_dataset_saying_what_to_do(folder, tmp_path):
    pets = Pets([p for p, _ in ImageFolder(str(folder)).samples])
    with pytest.raises(ConfigError, match=r"Pets\.__getitem__ builds each item in Python.*fastload\.pack_dataset\(dataset, OUT\)"):
        FastLoader(Subset(pets, [0, 1]), 2, device="cpu", cache_dir=tmp_path / "c", progress=False)
