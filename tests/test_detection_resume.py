"""DetectionLoader's state_dict / load_state_dict: a mid-epoch resume serves exactly the rest of the epoch.

The oracle is an uninterrupted run of the same loader settings: the batches after the point
where the state was taken (images pixel for pixel, boxes, labels, masks, ids) must be the ones
the resumed loader serves, in order, with the crops and flips of that run. The state goes
through JSON on the way, as a checkpoint would carry it.
"""

from __future__ import annotations

import json

import pytest
import torch

import fastload
from fastload.detection import DetectionLoader
from fastload.errors import ConfigError

from coco_fixture import IMAGES, pack_painted


@pytest.fixture(scope="module")
def packed(tmp_path_factory):
    root = tmp_path_factory.mktemp("resume")
    out = root / "packed"
    pack_painted(root, out)
    return out


def _batches(loader, limit=None):
    """Each batch as plain data: image tensors and target dicts (copied out)."""
    out = []
    for images, targets in loader:
        ims = list(images) if isinstance(images, list) else list(images.unbind(0))
        out.append(([im.clone() for im in ims], [{k: v.clone() for k, v in t.items()} for t in targets]))
        if limit is not None and len(out) == limit:
            break
    return out


def _same(a, b):
    assert len(a) == len(b)
    for (ia, ta), (ib, tb) in zip(a, b):
        assert len(ia) == len(ib)
        for x, y in zip(ia, ib):
            torch.testing.assert_close(x, y, rtol=0, atol=0)
        for x, y in zip(ta, tb):
            assert x.keys() == y.keys()
            for k in x:
                torch.testing.assert_close(x[k], y[k], rtol=0, atol=0)


SETTINGS = [
    # (batch_size, shuffle, crop, flip, rank, world_size, stop after k batches)
    (2, True, "iou", 0.5, None, None, 1),
    (2, True, "resized", 0.5, None, None, 2),
    (1, False, "iou", 1.0, None, None, 5),
    (2, True, None, 0.5, 1, 2, 1),
    (2, True, "resized", 0.5, 0, 2, 1),
    (3, True, "iou", 0.5, None, None, 0),
]


@pytest.mark.parametrize("batch,shuffle,crop,flip,rank,world,k", SETTINGS)
def test_mid_epoch_resume_serves_exactly_the_rest_of_the_epoch(packed, batch, shuffle, crop, flip, rank, world, k):
    """Kills: the state counting the batch decoded ahead (a batch lost), load_state_dict not
    skipping (batches served twice), a resume starting another epoch's order, crops or flips
    that depend on the batch's position instead of (seed, epoch, sample)."""
    kw = dict(fields=("image", "boxes", "image_id", "iscrowd", "mask"), shuffle=shuffle, crop=crop, flip=flip, seed=7,
              min_size=48, max_size=80, rank=rank, world_size=world)  # fmt: skip
    whole = DetectionLoader(packed, batch, **kw)
    whole.set_epoch(3)
    want = _batches(whole)
    assert len(want) == len(whole) and k < len(want)

    first = DetectionLoader(packed, batch, **kw)
    first.set_epoch(3)
    _same(_batches(first, limit=k) if k else [], want[:k])
    state = json.loads(json.dumps(first.state_dict()))  # plain data through a checkpoint's JSON
    assert state["epoch"] == 3 and state["batches_done"] == k and state["version"] == 2

    resumed = DetectionLoader(packed, batch, **kw)
    resumed.load_state_dict(state)
    _same(_batches(resumed), want[k:])
    # and the epoch after it is the uninterrupted loader's next epoch, whole
    assert resumed.state_dict()["epoch"] == 4 and resumed.state_dict()["batches_done"] == 0
    _same(_batches(resumed), _batches(whole))


def test_state_after_an_epoch_is_the_next_epoch_from_its_start(packed):
    loader = DetectionLoader(packed, 2, shuffle=True, crop="iou", min_size=48, max_size=80, seed=1)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["batches_done"] == 0
    for _ in loader:
        pass
    state = loader.state_dict()
    assert (state["epoch"], state["batches_done"]) == (1, 0)
    other = DetectionLoader(packed, 2, shuffle=True, crop="iou", min_size=48, max_size=80, seed=1)
    other.load_state_dict(state)
    _same(_batches(other), _batches(loader))
    loader.set_epoch(0)  # set_epoch restarts an epoch from its start
    assert loader.state_dict()["batches_done"] == 0


def test_fastloader_with_boxes_has_the_state_methods(packed):
    loader = fastload.FastLoader(packed, 2, fields=("image", "boxes"), shuffle=True, crop="resized", min_size=48, max_size=80, device="cpu")
    it = iter(loader)
    next(it)
    state = loader.state_dict()
    it.close()
    assert state["format"] == "fastload.FastLoader" and state["batches_done"] == 1  # FastLoader's own layout
    assert json.loads(json.dumps(state)) == state


def test_a_state_of_other_settings_is_refused_naming_the_field(packed):
    loader = DetectionLoader(packed, 2, shuffle=True, seed=1, min_size=48, max_size=80)
    state = loader.state_dict()
    with pytest.raises(ConfigError, match=r"state has seed=1 but this loader has seed=2; resume needs the same"):
        DetectionLoader(packed, 2, shuffle=True, seed=2).load_state_dict(state)
    with pytest.raises(ConfigError, match=r"state version 9 is not supported"):
        loader.load_state_dict({**state, "version": 9})
    with pytest.raises(ConfigError, match=r"state is not a FastLoader state_dict"):
        loader.load_state_dict({"format": "fastload.DetectionLoader", "version": 1})
    with pytest.raises(ConfigError, match=r"state has an invalid position: epoch=0, batches_done=4 \(0\.\.3\)"):
        loader.load_state_dict({**state, "batches_done": len(IMAGES) // 2 + 1})
    with pytest.raises(ConfigError, match=r"epoch"):
        loader.load_state_dict({**state, "epoch": "x"})


def test_a_state_resumes_on_another_batch_size_and_world_as_fastloaders_does(packed):
    """The state is FastLoader's (one implementation): what one batch size consumed, the other does not serve
    again, and together they serve the epoch once."""
    kw = dict(fields=("image", "boxes", "image_id"), shuffle=True, seed=4, min_size=48, max_size=80)
    first = DetectionLoader(packed, 2, **kw)
    seen = [int(t["image_id"]) for _, ts in _batches(first, limit=1) for t in ts]
    rest = DetectionLoader(packed, 3, **kw)
    rest.load_state_dict(first.state_dict())
    seen += [int(t["image_id"]) for _, ts in _batches(rest) for t in ts]
    assert sorted(seen) == sorted(int(t["image_id"]) for _, ts in _batches(DetectionLoader(packed, 3, **kw)) for t in ts)


def test_a_first_batch_peeked_then_a_loop_serves_the_whole_epoch(packed):
    """``next(iter(loader))`` (a script's shape check) then ``for b in loader``: the loop gets the epoch whole,
    as a DataLoader's (and FastLoader's) does; the peeked iterator does not move it."""
    kw = dict(shuffle=True, seed=3, min_size=48, max_size=80)
    loader = DetectionLoader(packed, 2, **kw)
    next(iter(loader))
    _same(_batches(loader), _batches(DetectionLoader(packed, 2, **kw)))


@pytest.mark.parametrize("seed", [2**32, 2**32 + 1, 2**63 + 5])
def test_every_bit_of_the_seed_and_the_epoch_decides_the_order(packed, seed):
    """Seeds that agree in their low 32 bits, and epochs 0 and 2**32, give other orders (a 32-bit seed repeated them)."""
    low = DetectionLoader(packed, 2, shuffle=True, seed=seed % 2**32)
    high = DetectionLoader(packed, 2, shuffle=True, seed=seed)
    orders = {tuple(low.order(0)), tuple(high.order(0)), tuple(high.order(2**32))}
    assert len(orders) == 3
    with pytest.raises(ConfigError, match=r"seed must be an int in \[0, 18446744073709551615\], got 1180591620717411303424"):
        DetectionLoader(packed, 2, seed=2**70)
