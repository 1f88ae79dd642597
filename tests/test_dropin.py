"""FastLoader as a DataLoader: its arguments, attributes, samplers, dataset view, epochs and copies.

Compared against the real ``torch.utils.data`` classes wherever a DataLoader's behaviour
is the reference.
"""

from __future__ import annotations

import copy
import inspect
import pickle

import numpy as np
import pytest
import torch
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    DistributedSampler,
    SequentialSampler,
    Subset,
    SubsetRandomSampler,
    WeightedRandomSampler,
    default_collate,
)

import fastload
from fastload import ConfigError, FastLoader

from conftest import decode_batch, encode_color, write_image

N = 30  # samples; sample i (ImageFolder order) has label i // 10 and its colour encodes (label, i)
MEAN, STD = fastload.IMAGENET_MEAN, fastload.IMAGENET_STD


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("dropin")
    for i in range(N):
        write_image(root / "src" / f"class_{i // 10}" / f"{i:03d}.jpg", encode_color(i // 10, i), size=(48, 40), quality=95)
    fastload.pack(root / "src", root / "packed", progress=False, workers=1)
    return root / "packed"


def _read(loader) -> list[list[int]]:
    """Dataset indices of every batch of one epoch, decoded from the pixels."""
    return [[i for _label, i in decode_batch(x.numpy(), MEAN, STD)] for x, _y in loader]


def _eval(packed, *args, **kw) -> FastLoader:
    kw.setdefault("device", "cpu")
    kw.setdefault("train", False)
    kw.setdefault("crop", 16)
    return FastLoader(packed, *args, **kw)


# ----------------------------------------------------------------------------- the argument list


def test_every_dataloader_parameter_is_accepted_in_the_same_position():
    dl = list(inspect.signature(DataLoader.__init__).parameters.values())[1:]
    fl = inspect.signature(FastLoader.__init__).parameters
    names = list(fl)[1:]
    for k, p in enumerate(dl):
        assert p.name in fl, f"FastLoader lacks DataLoader's {p.name}"
        if p.kind is p.POSITIONAL_OR_KEYWORD:
            assert names[k] == p.name, f"{p.name} is positional #{k} in DataLoader"


def test_ignored_arguments_show_what_a_dataloader_shows(packed):
    kw = dict(num_workers=4, pin_memory=True, timeout=5.0, worker_init_fn=print, prefetch_factor=3,
              persistent_workers=True, pin_memory_device="cuda", in_order=False, drop_last=True)  # fmt: skip
    ref = DataLoader(list(range(N)), 4, **kw)
    loader = _eval(packed, 4, **kw)
    for name in (*kw, "batch_size", "multiprocessing_context", "generator"):
        assert getattr(loader, name) == getattr(ref, name), name
    assert loader.collate_fn is ref.collate_fn is default_collate
    assert len(loader) == len(ref) == N // 4
    loader.close()


def test_positional_arguments_mean_what_they_mean_for_a_dataloader(packed):
    loader = FastLoader(packed, 7, False, device="cpu", train=False, crop=16)  # DataLoader(ds, 7, False)
    assert [len(b) for b in _read(loader)] == [7, 7, 7, 7, 2]
    assert sum(_read(loader), []) == list(range(N))  # no shuffle: dataset order
    loader.close()


def test_a_custom_collate_fn_is_called_on_the_batch_items_as_a_dataloader_calls_it(packed):
    """(It was refused before issue 20; tests/test_dropin2.py holds the MixUp/CutMix scripts.)"""
    plain = _eval(packed, 4)
    items = _eval(packed, 4, collate_fn=lambda batch: batch)
    assert items.collate_fn is not default_collate
    for (x, y), batch in zip(plain, items):
        assert isinstance(batch, list) and len(batch) == len(y)
        assert all(torch.equal(img, x[k]) and lab == int(y[k]) and type(lab) is int for k, (img, lab) in enumerate(batch))
    with pytest.raises(ConfigError, match="collate_fn must be a function"):
        _eval(packed, 4, collate_fn=3)
    _eval(packed, 4, collate_fn=default_collate).close()


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"sampler": [0, 1], "shuffle": True}, "mutually exclusive with shuffle"),
        ({"batch_sampler": [[0, 1]], "batch_size": 4}, "mutually exclusive"),
        ({"batch_sampler": [[0, 1]], "drop_last": True}, "mutually exclusive"),
        ({"batch_size": None}, "batch_size=None"),
        ({"sampler": [0, N]}, f"index {N}, outside"),
        ({"sampler": [0, -1]}, "index -1, outside"),
        ({"generator": 3}, "generator"),
        ({"sampler": iter([1, 2])}, "no len"),
    ],
)
def test_argument_combinations_a_dataloader_refuses(packed, kw, match):
    kw = {"batch_size": 4, **kw} if "batch_sampler" not in kw else kw
    with pytest.raises(ConfigError, match=match):
        list(_eval(packed, **kw))


# ----------------------------------------------------------------------------- samplers


def test_the_loaders_own_sampler_and_batch_sampler_describe_what_it_reads(packed):
    loader = _eval(packed, 4, shuffle=True, rank=1, world_size=2)
    assert isinstance(loader.sampler, torch.utils.data.Sampler)
    assert len(loader.sampler) == N // 2 and len(loader.batch_sampler) == len(loader) == 4
    assert loader.batch_sampler.sampler is loader.sampler and loader.batch_sampler.batch_size == 4
    loader.sampler.set_epoch(3)
    assert loader.epoch == 3
    planned = list(loader.batch_sampler)
    assert _read(loader) == planned  # exactly the indices the batch sampler lists
    loader.batch_sampler.set_epoch(4)
    assert loader.epoch == 4 and list(loader.batch_sampler) != planned
    loader.close()


def test_a_distributed_sampler_is_read_exactly_with_its_set_epoch(packed):
    loaders = []
    for rank in (0, 1):
        s = DistributedSampler(list(range(N)), num_replicas=2, rank=rank, shuffle=True, seed=5)
        s.set_epoch(2)
        loaders.append((s, _eval(packed, 4, sampler=s)))
    seen = []
    for s, loader in loaders:
        assert loader.sampler is s and len(loader) == -(-len(s) // 4)
        got = sum(_read(loader), [])
        assert got == list(s)  # exactly its indices, in its order
        seen += got
        s.set_epoch(3)
        assert sum(_read(loader), []) == list(s) != got
        loader.close()
    assert sorted(seen) == list(range(N))


@pytest.mark.parametrize(
    "make",
    [
        lambda: WeightedRandomSampler([0.0] * 10 + [1.0] * 20, 25, generator=torch.Generator().manual_seed(1)),
        lambda: SubsetRandomSampler([3, 5, 7, 11], generator=torch.Generator().manual_seed(2)),
        lambda: [9, 2, 2, 17],
        lambda: np.array([4, 0, 29]),
        lambda: range(5, 12),
    ],
)
def test_any_sampler_or_index_list_is_read_in_its_order(packed, make):
    sampler = make()
    loader = _eval(packed, 3, sampler=sampler)
    expect = [int(i) for i in (sampler if not isinstance(sampler, WeightedRandomSampler | SubsetRandomSampler) else [])]
    got = sum(_read(loader), [])
    if expect:
        assert got == expect
    else:  # random samplers: the loader consumed one epoch of the same generator state
        assert len(got) == len(sampler)
        if isinstance(sampler, WeightedRandomSampler):
            assert all(i >= 10 for i in got)  # weight 0 never drawn
        else:
            assert sorted(got) == [3, 5, 7, 11]
    loader.close()


def test_a_batch_sampler_gives_the_batches(packed):
    bs = BatchSampler(SequentialSampler(range(11)), 4, drop_last=False)
    loader = _eval(packed, batch_sampler=bs)
    assert loader.batch_size is None and loader.batch_sampler is bs and len(loader) == 3
    assert _read(loader) == [list(b) for b in bs]
    custom = [[1, 2], [3, 4, 5, 6, 7], [0]]  # uneven, no batch_size attribute
    loader2 = _eval(packed, batch_sampler=custom)
    assert _read(loader2) == custom
    loader.close()
    loader2.close()


def test_generator_seeds_the_order(packed):
    a = _eval(packed, 5, shuffle=True, generator=torch.Generator().manual_seed(11))
    b = _eval(packed, 5, shuffle=True, generator=torch.Generator().manual_seed(11))
    c = _eval(packed, 5, shuffle=True, generator=torch.Generator().manual_seed(12))
    assert a.seed == 11 and _read(a) == _read(b) != _read(c)
    for x in (a, b, c):
        x.close()


# ----------------------------------------------------------------------------- loader.dataset


def test_dataset_is_image_folder_like(packed):
    from torchvision.datasets import ImageFolder

    loader = _eval(packed, 4)
    view = loader.dataset
    ref = ImageFolder(str(packed.parent / "src"))
    assert view.classes == ref.classes and view.class_to_idx == ref.class_to_idx
    assert view.targets == ref.targets and len(view) == len(ref)
    assert [(p.rsplit("/", 2)[-2:], y) for p, y in view.samples] == [(p.rsplit("/", 2)[-2:], y) for p, y in ref.samples]
    assert view.imgs[5] == view.samples[5] and view.samples[5][0].endswith(ref.samples[5][0].split("/src/")[1])
    x, y = view[7]
    assert isinstance(x, torch.Tensor) and tuple(x.shape) == (3, 16, 16) and x.dtype == torch.float32
    assert y == view.targets[7] and decode_batch(x[None].numpy(), MEAN, STD) == [(y, 7)]
    loader.close()


def test_subset_of_the_dataset_in_a_plain_dataloader(packed):
    """pytorch/examples' distributed validation evaluates the remainder this way."""
    loader = _eval(packed, 4, rank=0, world_size=4, drop_last=True)
    rest = Subset(loader.dataset, range(len(loader.sampler) * 4, len(loader.dataset)))
    assert len(rest) == N - (N // 4) * 4
    got = []
    for x, y in DataLoader(rest, batch_size=2, num_workers=2):
        got += [(int(a), b) for a, (_l, b) in zip(y, decode_batch(x.numpy(), MEAN, STD))]
    assert got == [(i // 10, i) for i in rest.indices]
    loader.close()


def test_target_transform_applies_to_the_labels(packed):
    loader = _eval(packed, 8, target_transform=lambda y: 10 + y)
    labels = torch.cat([y for _x, y in loader])
    assert sorted(set(labels.tolist())) == [10, 11, 12] and loader.dataset.targets == [10 + i // 10 for i in range(N)]
    loader.close()
    with pytest.raises(ConfigError, match="target_transform"):
        _eval(packed, 8, target_transform=str)


# ----------------------------------------------------------------------------- exact evaluation, drop_last


@pytest.mark.parametrize("n_ranks", [2, 3, 4, 7])
def test_unpadded_shares_read_every_sample_exactly_once(packed, n_ranks):
    seen, lengths = [], []
    for r in range(n_ranks):
        loader = _eval(packed, 4, rank=r, world_size=n_ranks, pad=False, shuffle=True)
        got = sum(_read(loader), [])
        assert len(loader.sampler) == len(got)
        seen += got
        lengths.append(len(got))
        loader.close()
    assert sorted(seen) == list(range(N))  # no duplicate, none missing
    assert max(lengths) - min(lengths) <= 1


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("world_size, batch_size", [(1, 4), (2, 4), (4, 7), (7, 2), (3, 10)])
def test_drop_last_means_distributed_sampler_plus_dataloader(packed, world_size, batch_size, drop_last):
    for rank in range(world_size):
        ds = DistributedSampler(list(range(N)), num_replicas=world_size, rank=rank, shuffle=False, drop_last=drop_last)
        ref = DataLoader(list(range(N)), batch_size, sampler=ds, drop_last=drop_last)
        loader = _eval(packed, batch_size, rank=rank, world_size=world_size, drop_last=drop_last, shuffle=False)
        assert len(loader.sampler) == len(ds) and len(loader) == len(ref)
        assert _read(loader) == [b.tolist() for b in ref]  # without shuffling, the very same indices
        loader.close()


# ----------------------------------------------------------------------------- epochs and copies


def test_a_peek_does_not_move_the_epoch(packed):
    loader = _eval(packed, 4, shuffle=True)
    loader.set_epoch(5)
    next(iter(loader))  # a client's probe
    assert loader.epoch == 5
    first = _read(loader)
    assert loader.epoch == 6  # a finished epoch moves on
    loader.set_epoch(5)
    assert _read(loader) == first
    loader.close()


@pytest.mark.parametrize("how", ["pickle", "deepcopy"])
def test_a_loader_pickles_and_deep_copies(packed, how):
    loader = FastLoader(packed, 4, device="cpu", crop=16, seed=3)
    loader.set_epoch(2)
    twin = pickle.loads(pickle.dumps(loader)) if how == "pickle" else copy.deepcopy(loader)
    assert twin is not loader and twin.epoch == 2 and len(twin) == len(loader)
    a = [x for x, _ in loader]
    b = [x for x, _ in twin]
    assert all(torch.equal(p, q) for p, q in zip(a, b)) and len(a) == len(b)  # same crops, flips, order
    loader.close()
    twin.close()


# ----------------------------------------------------------------------------- the evaluation transform


def test_evaluation_output_is_torchvisions_resize_and_center_crop(tmp_path):
    """Gradients make every pixel position visible: a crop one pixel off, a truncation
    rounded instead of cut, or another filter shows. Sizes with odd margins on each side."""
    import io

    import torchvision.transforms as T
    from PIL import Image

    sizes = [(500, 375), (375, 500), (341, 256), (257, 255), (300, 300), (333, 251)]
    for k, (w, h) in enumerate(sizes):
        y, x = np.mgrid[0:h, 0:w]
        a = np.stack([x * 255 // (w - 1), y * 255 // (h - 1), (x + y) * 255 // (w + h)], -1).astype(np.uint8)
        (tmp_path / "src" / "a").mkdir(parents=True, exist_ok=True)
        Image.fromarray(a).save(tmp_path / "src" / "a" / f"{k}.png")
    fastload.pack(tmp_path / "src", tmp_path / "packed", progress=False, workers=1)
    ds = fastload.Dataset(tmp_path / "packed")
    reference = T.Compose([T.Resize(256), T.CenterCrop(224), T.ToTensor(), T.Normalize(MEAN, STD)])
    loader = FastLoader(tmp_path / "packed", len(sizes), device="cpu", train=False, resize=256, crop=224, shuffle=False)
    images, _ = next(iter(loader))
    scale = torch.tensor(STD).view(3, 1, 1) * 255  # back to 0..255 units
    for i in range(len(sizes)):
        ref = reference(Image.open(io.BytesIO(ds[i][0])).convert("RGB"))
        diff = ((images[i] - ref) * scale).abs()
        # DALI's linear resampling rounds differently from PIL's: at most one level per pixel
        assert diff.max() <= 1.0 + 1e-3 and diff.mean() < 0.25, (sizes[i], float(diff.max()), float(diff.mean()))
        view = ((loader.dataset[i][0] - ref) * scale).abs()
        assert view.max() <= 1e-3, (sizes[i], float(view.max()))  # the view resizes with PIL: exact
    loader.close()


def test_a_torchvision_dataset_keeps_its_own_root_samples_and_indices(packed, tmp_path):
    import torchvision.transforms as T
    from torchvision.datasets import ImageFolder

    ref = ImageFolder(str(packed.parent / "src"), T.Compose([T.Resize(20), T.CenterCrop(16), T.ToTensor(), T.Normalize(MEAN, STD)]))
    loader = FastLoader(ref, 4, cache_dir=tmp_path / "cache", device="cpu", progress=False)
    view = loader.dataset
    assert view.root == ref.root and view.samples == ref.samples and view.imgs == ref.imgs and view.targets == ref.targets
    assert view.transform is ref.transform and (loader.train, loader.resize, loader.crop) == (False, 20, 16)
    assert sum(_read(loader), []) == list(range(N))  # the dataset's own indices, in order (shuffle=False)
    loader.close()
