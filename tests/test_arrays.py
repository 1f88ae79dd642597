"""Array datasets served by FastLoader(dataset): torchvision's own CIFAR10/100, MNIST, FashionMNIST, SVHN, STL10 over files the tests write.

The files are the ones those classes read (CIFAR's pickled batches, MNIST's idx files, SVHN's .mat,
STL10's binaries), their pixels seeded noise with each image's index in its first pixels. Batches
are compared with a DataLoader over the same dataset object: labels exactly, pixels exactly where
nothing is random; RandomCrop's windows are matched against torchvision's own RandomCrop at every
offset, and its law (uniform offsets) checked with a chi-square bound.
"""

from __future__ import annotations

import struct
from pathlib import Path

import re

import numpy as np
import pytest
import torch

import fastload
from fastload.errors import ConfigError

from array_files import index_images, write_cifar, write_mnist

tv = pytest.importorskip("torchvision")
import torchvision.transforms as T
import torchvision.transforms.v2 as T2
from torchvision.datasets import CIFAR10, CIFAR100, MNIST, STL10, SVHN, FashionMNIST, VisionDataset

NORM = T.Normalize((0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616))


def _loader(ds, tmp_path: Path, batch_size: int = 16, **kw):
    return fastload.FastLoader(ds, batch_size=batch_size, cache_dir=tmp_path / "cache", progress=False, num_threads=1, **kw)


def _same_batches(ds, tmp_path: Path, *, exact: bool, batch_size: int = 16) -> int:
    """FastLoader's batches against DataLoader's over ``ds``: labels equal, pixels equal (float: within 1e-6)."""
    n = 0
    fl = _loader(ds, tmp_path, batch_size)
    dl = torch.utils.data.DataLoader(ds, batch_size=batch_size)
    for (a, la), (b, lb) in zip(fl, dl, strict=True):
        assert torch.equal(la, lb)
        assert a.shape == b.shape and a.dtype == b.dtype
        if exact:
            assert torch.equal(a, b)
        else:
            assert (a - b).abs().max().item() <= 1e-6
        n += len(la)
    return n


@pytest.fixture
def cifar(tmp_path, monkeypatch):
    """CIFAR-10 files of 5 x 12 training and 20 test images, and the class's file list naming their MD5s."""
    for k, v in write_cifar(tmp_path / "data", n_batch=12, n_test=20).items():
        monkeypatch.setattr(CIFAR10, k, v)
    return tmp_path / "data"


class Strips(VisionDataset):
    """A dataset of the kind the brief names: non-square HWC uint8 ``.data`` and ``.targets``, items as CIFAR10's."""

    def __init__(self, n: int, transform=None, h: int = 24, w: int = 40) -> None:
        super().__init__("strips", transform=transform)
        self.data = index_images(n, (h, w, 3), seed=7)
        self.targets = [i % 3 for i in range(n)]
        self.classes = ["a", "b", "c"]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i):
        from PIL import Image

        img = Image.fromarray(self.data[i])
        return (self.transform(img) if self.transform is not None else img), self.targets[i]


def test_cifar10_evaluation_without_a_crop_is_the_dataloaders(cifar, tmp_path):
    ds = CIFAR10(str(cifar), train=False, transform=T.Compose([T.ToTensor(), NORM]), download=False)
    assert _same_batches(ds, tmp_path, exact=False) == 20
    ds = CIFAR10(str(cifar), train=True, transform=T2.Compose([T2.PILToTensor()]), download=False)
    assert _same_batches(ds, tmp_path, exact=True) == 60
    # the cache holds the images without their transform: a new transform reuses the entry
    entries = sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir())
    ds.transform = T.Compose([T.PILToTensor()])
    _same_batches(ds, tmp_path, exact=True)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.is_dir()) == entries


def test_cifar100_under_random_split_and_concat(tmp_path, monkeypatch):
    for k, v in write_cifar(tmp_path / "data", n_batch=8, n_test=10, hundred=True).items():
        monkeypatch.setattr(CIFAR100, k, v)
    train = CIFAR100(str(tmp_path / "data"), train=True, transform=T.PILToTensor(), download=False)
    test = CIFAR100(str(tmp_path / "data"), train=False, transform=T.PILToTensor(), download=False)
    part, _ = torch.utils.data.random_split(train, [25, 15], generator=torch.Generator().manual_seed(3))
    assert _same_batches(torch.utils.data.ConcatDataset([part, test]), tmp_path, exact=True, batch_size=7) == 35


@pytest.mark.parametrize("cls", [MNIST, FashionMNIST])
def test_grayscale_batches_keep_one_channel(cls, tmp_path):
    write_mnist(tmp_path / "data", cls.__name__, n_train=30, n_test=18)
    ds = cls(str(tmp_path / "data"), train=False, transform=T.Compose([T.ToTensor(), T.Normalize((0.1307,), (0.3081,))]))
    assert _same_batches(ds, tmp_path, exact=False, batch_size=8) == 18
    images, _ = next(iter(_loader(ds, tmp_path, 8)))
    assert images.shape == (8, 1, 28, 28)
    raw = ds.data[:8].float().div(255).sub(0.1307).div(0.3081)  # the idx file's pixels, by the formula
    assert (images[:, 0] - raw).abs().max().item() <= 1e-5


def test_svhn_and_stl10_channels_first_arrays(tmp_path, monkeypatch):
    sio = pytest.importorskip("scipy.io")
    x = index_images(21, (32, 32, 3), seed=5)
    sio.savemat(str(tmp_path / "test_32x32.mat"), {"X": x.transpose(1, 2, 3, 0), "y": (np.arange(21) % 10 + 1)[:, None]})
    monkeypatch.setitem(SVHN.split_list, "test", ["", "test_32x32.mat", None])
    svhn = SVHN(str(tmp_path), split="test", transform=T.PILToTensor())
    assert svhn.data.shape == (21, 3, 32, 32)
    assert _same_batches(svhn, tmp_path, exact=True, batch_size=8) == 21

    folder = tmp_path / "stl" / "stl10_binary"
    folder.mkdir(parents=True)
    chw = index_images(10, (3, 96, 96), seed=6)
    (folder / "test_X.bin").write_bytes(chw.transpose(0, 1, 3, 2).tobytes())  # the file is column-major
    (folder / "test_y.bin").write_bytes((np.arange(10) % 10 + 1).astype(np.uint8).tobytes())
    for name in ("train_X.bin", "train_y.bin", "unlabeled_X.bin"):
        (folder / name).write_bytes(b"")
    monkeypatch.setattr(STL10, "train_list", [[n, None] for n in ("train_X.bin", "train_y.bin", "unlabeled_X.bin")])
    monkeypatch.setattr(STL10, "test_list", [["test_X.bin", None], ["test_y.bin", None]])
    stl = STL10(str(tmp_path / "stl"), split="test", transform=T.Compose([T.ToTensor(), NORM]))
    assert _same_batches(stl, tmp_path, exact=False, batch_size=4) == 10


def _windows(padded: np.ndarray, side: int) -> np.ndarray:
    """Every ``side x side`` window of a padded HWC image, and its mirror: ``[rows, cols, 2, side, side, C]``."""
    rows, cols = padded.shape[0] - side + 1, padded.shape[1] - side + 1
    w = np.stack([np.stack([padded[i : i + side, j : j + side] for j in range(cols)]) for i in range(rows)])
    return np.stack([w, w[..., ::-1, :]], axis=2)


def _padded_by_torchvision(img, crop: T.RandomCrop, monkeypatch) -> np.ndarray:
    """torchvision's own RandomCrop with its window set to the whole padded image."""
    with monkeypatch.context() as m:
        m.setattr(T.RandomCrop, "get_params", staticmethod(lambda im, size: (0, 0, im.size[1], im.size[0])))
        return np.asarray(crop(img))


CROPS = [
    ("cifar", T.RandomCrop(32, padding=4, fill=(10, 20, 30))),
    ("cifar", T.RandomCrop(32, padding=4, padding_mode="edge")),
    ("cifar", T.RandomCrop(32, padding=(3, 5), padding_mode="reflect")),
    ("strips", T.RandomCrop(20, padding=(1, 2, 3, 4), padding_mode="symmetric")),
    ("strips", T.RandomCrop(44, pad_if_needed=True, padding_mode="reflect")),
    ("strips", T.RandomCrop(30, padding=2, pad_if_needed=True)),
    ("mnist", T.RandomCrop(28, padding=2)),
]


@pytest.mark.parametrize("kind,crop", CROPS, ids=[f"{k}-{c.padding_mode}-{c.size[0]}" for k, c in CROPS])
def test_random_crop_windows_are_torchvisions(kind, crop, cifar, tmp_path, monkeypatch):
    """Each image is torchvision's own RandomCrop at one offset (and flip); the offsets are uniform."""
    tf = T.Compose([crop, T.RandomHorizontalFlip(), T.PILToTensor()])
    if kind == "cifar":
        ds = CIFAR10(str(cifar), train=True, transform=tf, download=False)
    elif kind == "mnist":
        write_mnist(tmp_path / "m", n_train=60, n_test=1)
        ds = MNIST(str(tmp_path / "m"), train=True, transform=tf)
    else:
        ds = Strips(60, transform=tf)
    plain = [ds.__class__.__getitem__(_without(ds), i)[0] for i in range(len(ds))]
    side = crop.size[0]
    padded = [_padded_by_torchvision(img, crop, monkeypatch) for img in plain]
    windows = [_windows(p[..., None] if p.ndim == 2 else p, side) for p in padded]
    seen = []
    for seed in range(6):
        got = torch.cat([b for b, _ in _loader(ds, tmp_path, 16, seed=seed)]).permute(0, 2, 3, 1).numpy()
        for i, img in enumerate(plain):
            hits = np.argwhere((windows[i] == got[i]).all(axis=(3, 4, 5)))
            assert len(hits) == 1, f"image {i}: {len(hits)} windows of torchvision's padded image match"
            top, left, flip = hits[0]
            # torchvision's RandomCrop at that offset gives that window
            with monkeypatch.context() as m:
                m.setattr(T.RandomCrop, "get_params", staticmethod(lambda im, size, t=top, x=left: (t, x, side, side)))
                want = np.asarray(crop(img))
            want = want[..., None] if want.ndim == 2 else want
            np.testing.assert_array_equal(got[i], want[:, ::-1] if flip else want)
            seen.append((top, left, flip, windows[i].shape[0], windows[i].shape[1]))
    seen = np.array(seen)
    for col, cells in ((0, seen[0, 3]), (1, seen[0, 4])):  # each offset uniform over its cells (torch.randint)
        counts = np.bincount(seen[:, col], minlength=cells)
        assert len(counts) == cells and counts.min() > 0, (col, counts)
        if cells > 1:
            expected, df = len(seen) / cells, cells - 1
            chi2 = float(((counts - expected) ** 2 / expected).sum())
            # the chi-square's 99.9th percentile (Wilson-Hilferty): a uniform law fails 1 run in 1000
            assert chi2 < df * (1 - 2 / (9 * df) + 3.09 * np.sqrt(2 / (9 * df))) ** 3, (col, counts)
    assert abs(seen[:, 2].mean() - 0.5) < 4 * 0.5 / np.sqrt(len(seen))


def _without(ds):
    """A copy of ``ds`` without its transform (what torchvision hands the transform)."""
    import copy

    plain = copy.copy(ds)
    plain.transform = None
    return plain


def test_random_crop_padding_and_fill_as_torchvision_reads_them():
    from fastload.transforms import translate

    # torchvision's documentation: 2 numbers are left/right and top/bottom, 4 are left, top, right, bottom
    for api in (T, T2):
        for padding, want in ((3, (3, 3, 3, 3)), ((1, 2), (1, 2, 1, 2)), ((1, 2, 3, 4), (1, 2, 3, 4))):
            a = translate(api.Compose([api.RandomCrop(32, padding=padding), api.PILToTensor()]))
            assert a.train and a.crop == 32 and a.pad_crop.padding == want
    # on a tensor the fill is a value of the tensor: 1.0 after ToTensor() is the pixel 255
    a = translate(T.Compose([T.ToTensor(), T.RandomCrop(32, padding=4, fill=1.0)]))
    assert a.pad_crop.fill == (255.0, 255.0, 255.0)
    with pytest.raises(ConfigError, match=r"fill 0.5 is not a pixel value.*or put it before ToTensor\(\)") as e:
        translate(T.Compose([T.ToTensor(), T.RandomCrop(32, padding=4, fill=0.5)]))
    assert "RandomCrop(" in str(e.value)
    # the advice followed: before ToTensor(), the PIL image's fill
    a = translate(T.Compose([T.RandomCrop(32, padding=4, fill=128), T.ToTensor()]))
    assert a.pad_crop.fill == (128.0, 128.0, 128.0)
    # a fill torchvision does not use (another padding mode, no padding) is not read
    for crop in (T.RandomCrop(32, padding=4, padding_mode="reflect"), T.RandomCrop(24)):
        assert translate(T.Compose([T.ToTensor(), NORM, crop])).pad_crop.fill == (0.0, 0.0, 0.0)


def test_non_square_image_without_a_crop_is_refused_and_the_advice_works(tmp_path):
    ds = Strips(20, transform=T.ToTensor())
    with pytest.raises(ConfigError, match=r"keep their 24x40 size.*add CenterCrop\(24\)"):
        _loader(ds, tmp_path)
    ds.transform = T.Compose([T.CenterCrop(24), T.ToTensor()])  # the advice
    assert _same_batches(ds, tmp_path, exact=False, batch_size=6) == 20


class NumpyItems(CIFAR10):
    """A CIFAR10 whose items are NumPy arrays: not the PIL images the cache stores."""

    def __getitem__(self, i):
        img, target = super().__getitem__(i)
        return (np.asarray(img) if self.transform is None else img), target


class Short(CIFAR10):
    """A CIFAR10 whose length is not its array's."""

    def __len__(self):
        return 15


class Relabelled(CIFAR10):
    """A CIFAR10 whose item 5 has another label than its label array's."""

    def __getitem__(self, i):
        img, target = super().__getitem__(i)
        return img, (target + 1) % 10 if i == 5 else target


@pytest.mark.parametrize(
    "cls,error,why",
    [
        (NumpyItems, ConfigError, r"\[0\] without its transform is a ndarray, not a PIL image"),
        (Short, ConfigError, r"len\(dataset\) is 15 but .data holds 20 images"),
        (Relabelled, fastload.PackError, r"\[5\] without its transform: its label \d is not the label array's \d.*every item must be"),
    ],
)
def test_items_the_cache_cannot_store_are_refused_and_the_advice_works(cls, error, why, cifar, tmp_path):
    tf = T.Compose([T.ToTensor(), NORM])
    ds = cls(str(cifar), train=False, transform=tf, download=False)
    with pytest.raises(error) as e:
        _loader(ds, tmp_path)
    assert re.search(why, e.value.details), e.value.details  # the whole text (the line is capped)
    assert "fastload.pack_dataset(dataset, OUT) after setting dataset.transform = None" in str(e.value)
    ds.transform = None  # the advice, followed
    fastload.pack_dataset(ds, tmp_path / "out", workers=1, progress=False)
    fl = fastload.FastLoader(tmp_path / "out", batch_size=5, transform=tf, progress=False, num_threads=1)
    ds.transform = tf
    for (a, la), (b, lb) in zip(fl, torch.utils.data.DataLoader(ds, batch_size=5), strict=True):
        assert torch.equal(la, lb)
        assert a.shape == b.shape  # stored as JPEG by pack_dataset: the same noise, blurred
        assert np.corrcoef(a.mean(1).flatten().numpy(), b.mean(1).flatten().numpy())[0, 1] > 0.8  # another image: about 0


def test_four_channel_arrays_are_refused_and_the_advice_works(tmp_path):
    ds = Strips(6, transform=T.Compose([T.CenterCrop(24), T.PILToTensor()]))
    ds.data = np.concatenate([ds.data, np.full(ds.data.shape[:3] + (1,), 255, np.uint8)], axis=3)  # RGBA
    with pytest.raises(ConfigError, match=r"is a RGBA image.*keep the dataset's .data as RGB"):
        _loader(ds, tmp_path)
    ds.data = ds.data[..., :3]  # the advice
    assert _same_batches(ds, tmp_path, exact=True, batch_size=3) == 6


def test_changed_arrays_are_packed_again(tmp_path):
    ds = Strips(12, transform=T.Compose([T.CenterCrop(24), T.PILToTensor()]))
    first = next(iter(_loader(ds, tmp_path, 12)))[0]
    ds.data = ds.data.copy()
    ds.data[0] = 255 - ds.data[0]
    second = next(iter(_loader(ds, tmp_path, 12)))[0]
    assert torch.equal(second, torch.utils.data.default_collate([ds[i][0] for i in range(12)]))
    assert torch.equal(second[1:], first[1:]) and not torch.equal(second[0], first[0])
    assert len([p for p in (tmp_path / "cache").iterdir() if p.is_dir()]) == 2


@pytest.mark.parametrize("crop", [T.RandomCrop(32, padding=4, fill=(10, 20, 30)), T.RandomCrop(32, padding=(3, 5), padding_mode="reflect")])
def test_loader_dataset_items_are_the_batches_images(crop, cifar, tmp_path):
    """``loader.dataset[i]`` (processed on the host) is the loader's image i of the epoch, window and flip alike."""
    ds = CIFAR10(str(cifar), train=True, transform=T.Compose([crop, T.RandomHorizontalFlip(), T.PILToTensor()]), download=False)
    fl = _loader(ds, tmp_path, 12, seed=5)
    items = {i: fl.dataset[i][0] for i in range(0, 60, 7)}  # the epoch about to run
    images = torch.cat([b for b, _ in fl])
    for i, item in items.items():
        assert torch.equal(item.to(images.dtype), images[i])
    write_mnist(tmp_path / "m", n_train=20, n_test=1)
    mnist = MNIST(str(tmp_path / "m"), train=True, transform=T.Compose([T.RandomCrop(28, padding=2), T.PILToTensor()]))
    fl = _loader(mnist, tmp_path, 10, seed=1)
    items = {i: fl.dataset[i][0] for i in range(0, 20, 3)}
    images = torch.cat([b for b, _ in fl])
    assert images.shape == (20, 1, 28, 28)
    for i, item in items.items():
        assert torch.equal(item.to(images.dtype), images[i])


def _is_window_of(got: np.ndarray, img, crop: T.RandomCrop, monkeypatch) -> bool:
    """Whether the HWC ``got`` is one of torchvision's RandomCrop windows of ``img`` (flipped or not)."""
    padded = _padded_by_torchvision(img, crop, monkeypatch)
    windows = _windows(padded[..., None] if padded.ndim == 2 else padded, crop.size[0])
    return len(np.argwhere((windows == got).all(axis=(3, 4, 5)))) >= 1  # a reflection's window may be another's mirror


def test_refused_random_crops_and_their_advice_followed(cifar, tmp_path, monkeypatch):
    def cifar_with(crop):
        return CIFAR10(str(cifar), train=True, transform=T.Compose([crop, T.PILToTensor()]), download=False)

    with pytest.raises(ConfigError, match=r"a padding of 40 pixels is more than the 31 .*use a padding of at most 31"):
        _loader(cifar_with(T.RandomCrop(32, padding=40, padding_mode="reflect")), tmp_path)
    crop = T.RandomCrop(32, padding=31, padding_mode="reflect")  # the advice
    ds = cifar_with(crop)
    got = next(iter(_loader(ds, tmp_path, 6)))[0].permute(0, 2, 3, 1).numpy()
    assert all(_is_window_of(got[i], _without(ds)[i][0], crop, monkeypatch) for i in range(6))

    with pytest.raises(ConfigError, match=r"padded, are 32x32, smaller than the 36x36 window.*pad_if_needed=True"):
        _loader(cifar_with(T.RandomCrop(36)), tmp_path)
    crop = T.RandomCrop(36, pad_if_needed=True)  # the advice
    ds = cifar_with(crop)
    got = next(iter(_loader(ds, tmp_path, 6)))[0].permute(0, 2, 3, 1).numpy()
    assert all(_is_window_of(got[i], _without(ds)[i][0], crop, monkeypatch) for i in range(6))


def test_packed_images_of_several_sizes_with_random_crop(tmp_path, monkeypatch):
    """A packed dataset of two sizes: what a per-image padding cannot build is refused, with advice that works."""
    images = [index_images(1, (24, 30, 3), seed=k)[0] if k % 2 else index_images(1, (36, 28, 3), seed=k)[0] for k in range(8)]
    from PIL import Image

    from fastload.packing.run import pack_like_pil_loader

    items = [(Image.fromarray(im), k % 2) for k, im in enumerate(images)]
    pack_like_pil_loader(items, tmp_path / "out", classes=["a", "b"], workers=1, progress=False)  # lossless
    tf = T.Compose([T.RandomCrop(40, pad_if_needed=True, padding_mode="reflect"), T.PILToTensor()])
    with pytest.raises(ConfigError, match=r"need different padding; use padding_mode='constant'"):
        fastload.FastLoader(tmp_path / "out", batch_size=4, transform=tf, progress=False, num_threads=1)
    crop = T.RandomCrop(40, pad_if_needed=True)  # the advice
    fl = fastload.FastLoader(tmp_path / "out", batch_size=4, transform=T.Compose([crop, T.PILToTensor()]), progress=False, num_threads=1, shuffle=False)
    got = torch.cat([b for b, _ in fl]).permute(0, 2, 3, 1).numpy()
    assert all(_is_window_of(got[i], items[i][0], crop, monkeypatch) for i in range(8))

    fl = fastload.FastLoader(tmp_path / "out", batch_size=4, transform=T.Compose([T.RandomCrop(30), T.PILToTensor()]),
                             progress=False, num_threads=1)  # fmt: skip
    with pytest.raises(fastload.LoaderError, match=r"its (30x24|28x36) image, padded, is smaller than RandomCrop's 30x30 window.*pad_if_needed=True"):
        list(fl)
    crop = T.RandomCrop(30, pad_if_needed=True)  # the advice
    fl = fastload.FastLoader(tmp_path / "out", batch_size=4, transform=T.Compose([crop, T.PILToTensor()]), progress=False, num_threads=1, shuffle=False)
    got = torch.cat([b for b, _ in fl]).permute(0, 2, 3, 1).numpy()
    assert all(_is_window_of(got[i], items[i][0], crop, monkeypatch) for i in range(8))


def test_unlabelled_and_badly_labelled_arrays_are_refused_and_the_advice_works(tmp_path, monkeypatch):
    folder = tmp_path / "stl10_binary"
    folder.mkdir()
    (folder / "unlabeled_X.bin").write_bytes(index_images(4, (3, 96, 96), seed=1).tobytes())
    (folder / "test_X.bin").write_bytes(index_images(4, (3, 96, 96), seed=2).tobytes())
    (folder / "test_y.bin").write_bytes(bytes([1, 2, 3, 4]))
    for name in ("train_X.bin", "train_y.bin"):
        (folder / name).write_bytes(b"")
    monkeypatch.setattr(STL10, "train_list", [[n, None] for n in ("train_X.bin", "train_y.bin", "unlabeled_X.bin")])
    monkeypatch.setattr(STL10, "test_list", [["test_X.bin", None], ["test_y.bin", None]])
    tf = T.PILToTensor()
    with pytest.raises(ConfigError, match=r"STL10\(.*\)\.labels: label -1 is not a class index.*use a labelled split"):
        _loader(STL10(str(tmp_path), split="unlabeled", transform=tf), tmp_path)
    assert _same_batches(STL10(str(tmp_path), split="test", transform=tf), tmp_path, exact=True, batch_size=4) == 4

    ds = Strips(6, transform=T.Compose([T.CenterCrop(24), tf]))
    ds.targets = [float(t) for t in ds.targets]
    with pytest.raises(ConfigError, match=r"\.targets: float64 \(6,\), where FastLoader needs 6 integer class indices"):
        _loader(ds, tmp_path)
    ds.targets = [int(t) for t in ds.targets]  # the advice
    assert _same_batches(ds, tmp_path, exact=True, batch_size=3) == 6


@pytest.mark.parametrize("channels", [1, 3])
def test_grayscale_steps_on_a_grayscale_dataset(channels, tmp_path):
    """MNIST's L images through Grayscale(n): n channels, as torchvision gives them."""
    write_mnist(tmp_path / "data", n_train=1, n_test=12)
    tf = T.Compose([T.Grayscale(channels), T.ToTensor(), T.Normalize((0.5,), (0.25,))])
    ds = MNIST(str(tmp_path / "data"), train=False, transform=tf)
    assert _same_batches(ds, tmp_path, exact=False, batch_size=6) == 12
    assert next(iter(_loader(ds, tmp_path, 6)))[0].shape == (6, channels, 28, 28)


def test_a_packed_dataset_without_recorded_sizes_and_the_advice_followed(tmp_path, monkeypatch):
    import json

    from PIL import Image

    from fastload.packing.run import pack_like_pil_loader

    items = [(Image.fromarray(im), k % 2) for k, im in enumerate(index_images(6, (20, 20, 3), seed=4))]
    pack_like_pil_loader(items, tmp_path / "out", classes=["a", "b"], workers=1, progress=False)
    manifest = tmp_path / "out" / "manifest.json"
    m = json.loads(manifest.read_text())
    del m["stats"]["width"], m["stats"]["height"]  # as a dataset packed without them
    manifest.write_text(json.dumps(m))
    crop = T.RandomCrop(20, padding=3, padding_mode="symmetric")
    kw = dict(batch_size=3, transform=T.Compose([crop, T.PILToTensor()]), progress=False, num_threads=1, shuffle=False)
    with pytest.raises(ConfigError, match=r"records no image sizes .*pack it again"):
        fastload.FastLoader(tmp_path / "out", **kw)
    fastload.pack_dataset(items, tmp_path / "again", classes=["a", "b"], workers=1, progress=False)  # the advice
    batches = list(fastload.FastLoader(tmp_path / "again", **kw))
    assert torch.cat([y for _, y in batches]).tolist() == [k % 2 for k in range(6)]
    assert torch.cat([x for x, _ in batches]).shape == (6, 3, 20, 20)
    # (pack_dataset stores JPEGs: the windows' pixels are checked on a lossless pack)
    pack_like_pil_loader(items, tmp_path / "lossless", classes=["a", "b"], workers=1, progress=False)
    got = torch.cat([b for b, _ in fastload.FastLoader(tmp_path / "lossless", **kw)]).permute(0, 2, 3, 1).numpy()
    assert all(_is_window_of(got[i], items[i][0], crop, monkeypatch) for i in range(6))


def test_a_random_crop_assigned_later_is_translated_or_refused_leaving_the_loader_as_it_was(cifar, tmp_path):
    ds = CIFAR10(str(cifar), train=True, transform=T.PILToTensor(), download=False)
    fl = _loader(ds, tmp_path, 20)
    with pytest.raises(ConfigError, match=r"a padding of 40 pixels is more than the 31"):
        fl.dataset.transform = T.Compose([T.RandomCrop(32, padding=40, padding_mode="reflect"), T.PILToTensor()])
    assert fl.augment.pad_crop is None and torch.equal(next(iter(fl))[0], torch.from_numpy(ds.data[:20]).permute(0, 3, 1, 2))
    crop = T.RandomCrop(32, padding=4, padding_mode="edge")
    fl.dataset.transform = T.Compose([crop, T.PILToTensor()])
    assert fl.augment.pad_crop.mode == "edge" and next(iter(fl))[0].shape == (20, 3, 32, 32)


def test_random_crop_on_the_normalised_tensor_is_torchvisions(cifar, tmp_path, monkeypatch):
    """RandomCrop after ToTensor() and Normalize (torchvision pads the tensor): the same windows, in float."""
    crop = T.RandomCrop(32, padding=4, padding_mode="reflect")
    tensor_tf = T.Compose([T.ToTensor(), NORM, crop, T.RandomHorizontalFlip()])
    ds = CIFAR10(str(cifar), train=True, transform=tensor_tf, download=False)
    got = next(iter(_loader(ds, tmp_path, 10, seed=9)))[0]
    ds.transform = T.Compose([crop, T.RandomHorizontalFlip(), T.PILToTensor()])  # the same draws, in uint8
    raw = next(iter(_loader(ds, tmp_path, 10, seed=9)))[0].permute(0, 2, 3, 1).numpy()
    plain = _without(ds)
    for i in range(10):
        img = plain[i][0]
        padded = _padded_by_torchvision(img, crop, monkeypatch)
        (top, left, flip), *_ = np.argwhere((_windows(padded, 32) == raw[i]).all(axis=(3, 4, 5)))
        with monkeypatch.context() as m:  # torchvision's own tensor path at that offset
            m.setattr(T.RandomCrop, "get_params", staticmethod(lambda im, size, t=top, x=left: (t, x, 32, 32)))
            want = T.Compose([T.ToTensor(), NORM, crop])(img)
        want = want.flip(-1) if flip else want
        assert (got[i] - want).abs().max().item() <= 1e-5
