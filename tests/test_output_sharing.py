"""CPU batches are DALI's own output buffers, shared with torch through DLPack (no copy): a batch a caller
keeps holds its values while the loader runs on, after it is closed and after the pipeline is gone.

Each image's pixels encode its index (a flat grey level), so a batch whose buffer DALI reused for a later
batch would show that batch's levels. The expected values are a second loader's batches, cloned as they
come; the axes that change the path are crossed: the stage graph (a recipe with TrivialAugmentWide and
erasing, finished on the host) or the plain evaluation graph, NCHW or channels-last, float32 or bfloat16.
"""

from __future__ import annotations

import gc

import numpy as np
import pytest
import torch
from PIL import Image

import fastload

T = pytest.importorskip("torchvision.transforms")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


@pytest.fixture(scope="module")
def levels(tmp_path_factory):
    """40 images, image i a flat grey of level 5 * i (PNG: exact), packed."""
    base = tmp_path_factory.mktemp("sharing")
    for i in range(40):
        d = base / "src" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(np.full((36 + i % 5, 44, 3), 5 * i, np.uint8)).save(d / f"{i:03d}.png")
    fastload.pack(base / "src", base / "packed", workers=1, progress=False)
    return base / "packed"


def _augmented():
    return T.Compose([T.RandomResizedCrop(24), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.ToTensor(),
                      T.Normalize(MEAN, STD), T.RandomErasing(0.5)])  # fmt: skip


def _plain():
    return T.Compose([T.Resize(28), T.CenterCrop(24), T.ToTensor(), T.Normalize(MEAN, STD)])


def _loader(packed, transform, **kw):
    return fastload.FastLoader(packed, 8, device="cpu", transform=transform, shuffle=True, seed=11, num_threads=2,
                               prefetch=2, **kw)  # fmt: skip


@pytest.mark.parametrize("recipe", [_augmented, _plain], ids=["stage-graph", "plain"])
@pytest.mark.parametrize("layout", [{}, {"channels_last": True}, {"dtype": torch.bfloat16}], ids=["nchw", "nhwc", "bf16"])
def test_a_kept_batch_keeps_its_values_after_later_batches_and_the_loader(levels, recipe, layout):
    with _loader(levels, recipe(), **layout) as ld:
        expected = [(x.clone(), y.clone()) for x, y in ld]  # epoch 0, cloned as each batch comes
    ld = _loader(levels, recipe(), **layout)
    kept = [(x, y) for x, y in ld]  # epoch 0 again, each batch held uncopied while the next ones are made
    second = [x.clone() for x, _ in ld]  # a further epoch through the same pipeline and its buffers
    ld.close()
    del ld
    gc.collect()
    assert len(kept) == len(expected) == 5 and len(second) == 5
    for (x, y), (ex, ey) in zip(kept, expected):
        assert x.dtype == ex.dtype and x.shape == ex.shape
        assert torch.equal(y, ey) and torch.equal(x, ex)
    # the batches differ from one another (else aliasing would go unseen): distinct images, distinct levels
    assert len({float(x.float().mean()) for x, _ in kept}) == 5
    assert not all(torch.equal(a, b) for (a, _), b in zip(kept, second))  # epoch 1 is another draw


def test_a_kept_batch_is_the_callers_to_write(levels):
    with _loader(levels, _augmented()) as ld:
        it = iter(ld)
        first, _ = next(it)
        before = [x.clone() for x, _ in it]
        first.add_(1.0)  # in place, as a training script may normalise
    assert torch.isfinite(first).all()
    with _loader(levels, _augmented()) as ld:
        again = [x for x, _ in ld]
    assert torch.equal(again[0] + 1.0, first)
    assert all(torch.equal(a, b) for a, b in zip(again[1:], before))
