"""The augmented batch path does per batch what it does whatever the batch size: its pixels are the graph's.

DeiT's recipe (timm RandAugment ``rand-m9-mstd0.5-inc1``, bicubic, pixel-noise erasing),
torchvision's ``ta_wide`` recipe and MoCo v2's two views (each view's windows finished on the host, one
call per view), run through ``FastLoader`` at batch 8 and batch 128. In the
producer thread, a ``TorchDispatchMode`` records every torch operation of the first batch's
conversion (the host finish, then the stage graph's output), and the per-image functions a Python
loop would call (PIL's image operations, torchvision's functional transforms, timm's operations)
are watched: the same torch operations at both batch sizes, none moving data between devices, and
none of the per-image functions. On the CPU the crops are resized in one TorchScript call per
batch (``fastload.host.batch_finish``), whose loop over the images is TorchScript's, not Python's:
the call is counted (once per batch, with all the batch's crops) and the operations inside it,
which are per image as DALI's per-sample kernels are, are held to the CPU but not counted.
"""

from __future__ import annotations

import collections
import threading

import numpy as np
import pytest
import torch
from PIL import Image
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

import fastload
from fastload import host
from fastload.epochs import EpochRun

T = pytest.importorskip("torchvision.transforms")
timm_data = pytest.importorskip("timm.data")

MEAN, STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


class Recorder(TorchDispatchMode):
    """Every aten operation dispatched, and the devices each one's tensors are on."""

    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []
        self.devices: list[set] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        seen = {a.device.type for a in torch.utils._pytree.tree_leaves((args, kwargs, out)) if isinstance(a, torch.Tensor)}
        self.ops.append(str(func.overloadpacket))
        self.devices.append(seen)
        return out


@pytest.fixture(scope="module")
def many(tmp_path_factory):
    """136 small images of seeded noise (a batch of 128 needs that many), packed."""
    base = tmp_path_factory.mktemp("dispatch")
    rng = np.random.default_rng(0)
    for i in range(136):
        d = base / "src" / f"c{i % 2}"
        d.mkdir(parents=True, exist_ok=True)
        Image.fromarray(rng.integers(0, 256, (40 + i % 7, 48, 3), dtype=np.uint8)).save(d / f"{i:03d}.png")
    fastload.pack(base / "src", base / "packed", workers=1, progress=False)
    return base / "packed"


def _deit():
    return timm_data.create_transform(32, is_training=True, auto_augment="rand-m9-mstd0.5-inc1",
                                      interpolation="bicubic", re_prob=0.25, re_mode="pixel")  # fmt: skip


def _ta_wide():
    return T.Compose([T.RandomResizedCrop(32), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.PILToTensor(),
                      T.ConvertImageDtype(torch.float), T.Normalize(MEAN, STD), T.RandomErasing(0.25)])  # fmt: skip


class _TwoCrops:
    """MoCo v2's ``TwoCropsTransform``: two views of one base transform."""

    def __init__(self, base_transform):
        self.base_transform = base_transform

    def __call__(self, x):
        return [self.base_transform(x), self.base_transform(x)]


def _moco_v2():
    return _TwoCrops(T.Compose([T.RandomResizedCrop(32, scale=(0.2, 1.0)), T.RandomApply([T.ColorJitter(0.4, 0.4, 0.4, 0.1)], p=0.8),
                                T.RandomGrayscale(p=0.2), T.RandomHorizontalFlip(), T.ToTensor(), T.Normalize(MEAN, STD)]))  # fmt: skip


#: What a per-image Python loop over a batch would call: PIL's operations, torchvision's and timm's functions.
WATCHED = [
    (Image.Image, "transform"), (Image.Image, "rotate"), (Image.Image, "filter"), (Image.Image, "point"),
    (Image, "fromarray"), (Image, "blend"),
]


def _first_batch(packed, batch: int, transform, monkeypatch) -> tuple[Recorder, collections.Counter]:
    import torchvision.transforms.functional as F
    from PIL import ImageEnhance, ImageOps
    from timm.data import auto_augment

    from fastload.host import core_ops

    core_ops()  # the host finish's one-time self-check of PIL's resize, before anything is watched
    calls: collections.Counter = collections.Counter()
    producer: list[threading.Thread] = []
    watched = list(WATCHED) + [(ImageOps, n) for n in ("equalize", "autocontrast", "solarize", "posterize", "invert")]
    watched += [(ImageEnhance._Enhance, "enhance")] + [(F, n) for n in ("affine", "rotate", "adjust_brightness", "equalize")]
    watched += [(auto_augment, n) for n in ("rotate", "shear_x", "translate_x_abs", "color", "solarize")]
    for owner, name in watched:
        orig = getattr(owner, name)

        def spy(*a, __orig=orig, __name=name, **k):
            if threading.current_thread() in producer:
                calls[__name] += 1
            return __orig(*a, **k)

        monkeypatch.setattr(owner, name, spy)
    rec, inside = Recorder(), Recorder()
    convert, collect = EpochRun._convert, EpochRun._collect
    finish = host.batch_finish()
    sizes: list[int] = []  # crops per batch_finish call
    recording: list[str] = []  # the methods recorded so far (the first batch only: how many more the thread
    # converts ahead depends on timing)

    def finished(*a):
        sizes.append(len(a[5]))  # its flips: one per crop
        with _disable_current_modes(), inside:  # TorchScript's per-image operations, held apart
            return finish(*a)

    def recorded(method, name):
        def run(self, *a, **k):
            producer[:] = [threading.current_thread()]
            if name in recording or (name == "_collect" and a[0] is None):
                return method(self, *a, **k)
            recording.append(name)
            with rec:
                return method(self, *a, **k)

        return run

    monkeypatch.setattr(host, "batch_finish", lambda: finished)
    monkeypatch.setattr(EpochRun, "_convert", recorded(convert, "_convert"))
    monkeypatch.setattr(EpochRun, "_collect", recorded(collect, "_collect"))
    with fastload.FastLoader(packed, batch, device="cpu", transform=transform, seed=5, num_threads=2) as ld:
        x, y = next(iter(ld))
    for view in x if isinstance(x, list) else [x]:  # a multi-view transform: one tensor per view
        assert view.shape == (batch, 3, 32, 32) and view.dtype == torch.float32
    assert recording == ["_convert", "_collect"]  # the stage graph's batch was collected, and recorded
    assert inside.ops and all(d <= {"cpu"} for d in inside.devices)
    assert sizes[0] == batch and set(sizes) <= {batch, 136 % batch}  # one call per batch (and view), with all its crops
    return rec, calls


@pytest.mark.parametrize("recipe", [_deit, _ta_wide, _moco_v2], ids=["deit", "ta_wide", "moco_v2"])
def test_the_batch_path_dispatches_the_same_work_at_batch_8_and_128(many, recipe, monkeypatch):
    with monkeypatch.context() as m:
        small, small_calls = _first_batch(many, 8, recipe(), m)
    with monkeypatch.context() as m:
        big, big_calls = _first_batch(many, 128, recipe(), m)
    assert small.ops and small.ops == big.ops  # the same torch operations, however many images
    assert all(d <= {"cpu"} for d in small.devices + big.devices)  # nothing crosses devices on the batch path
    assert not small_calls and not big_calls, (small_calls, big_calls)  # no per-image PIL/torchvision/timm call


def test_the_spies_see_a_per_image_loop(many, monkeypatch):
    """The check above can fail: the same spies catch a per-image PIL loop run in the producer thread."""
    hand_on = EpochRun._hand_on

    def with_a_loop(self, item, b):
        for img in item[0]:
            u8 = (img.clamp(-2, 2) * 50 + 128).to(torch.uint8).permute(1, 2, 0).contiguous().numpy()
            Image.fromarray(u8).rotate(10)
        return hand_on(self, item, b)

    monkeypatch.setattr(EpochRun, "_hand_on", with_a_loop)
    rec, calls = _first_batch(many, 8, _ta_wide(), monkeypatch)
    # every batch the thread converted (it runs ahead of the consumer): 8 images each
    assert calls["rotate"] >= 8 and calls["rotate"] % 8 == 0 and calls["fromarray"] == calls["rotate"]


@pytest.mark.parametrize("recipe", [None, _ta_wide], ids=["crop_flip", "ta_wide"])
def test_the_loader_thread_keeps_torch_to_one_core_and_the_caller_keeps_its_own(many, recipe):
    """The producer pins its own torch calls (the host finish) to one thread, leaving DALI's threads the other
    cores; ``torch.set_num_threads`` is per thread, so the training loop's count is what it set.
    Kills: the pin dropped (the finish spreads over every core), or made in the caller's thread."""
    before = torch.get_num_threads()
    inner: list[int] = []
    finish = host.batch_finish()

    def counted(*a):
        inner.append(torch.get_num_threads())
        return finish(*a)

    with pytest.MonkeyPatch.context() as m:
        m.setattr(host, "batch_finish", lambda: counted)
        torch.set_num_threads(2)
        try:
            kw = {} if recipe is None else {"transform": recipe()}
            with fastload.FastLoader(many, 8, device="cpu", seed=5, num_threads=2, **kw) as ld:
                for _ in ld:
                    assert torch.get_num_threads() == 2
        finally:
            torch.set_num_threads(before)
    assert inner and set(inner) == {1}


@pytest.mark.parametrize(
    "transform",
    [
        lambda: fastload.Augment(grayscale=1.0),  # the params-free operations only
        lambda: T.Compose([T.RandomResizedCrop(24), T.RandomGrayscale(0.5), T.ColorJitter(0.4), T.ToTensor()]),
        lambda: T.Compose([T.RandomResizedCrop(24), T.ToTensor(), T.RandomErasing(0.5)]),  # erasing alone: no steps
        _ta_wide,
    ],
    ids=["grayscale", "gray-then-jitter", "erasing", "ta_wide"],
)
def test_every_input_fed_to_the_graph_is_used(many, transform):
    """DALI warns (and still copies) where an ``external_source`` output feeds nothing: the stage feeds its per-step
    params only where one of its operations reads them. Kills: the params always fed (grayscale warns)."""
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with fastload.FastLoader(many, 8, device="cpu", seed=5, num_threads=2, transform=transform()) as ld:
            x, _ = next(iter(ld))
    assert x.shape[0] == 8
    assert not [str(w.message) for w in seen if "is not used" in str(w.message)]


def _cifar_ta():
    """A padded RandomCrop (decoded whole, no host finish: its stage inputs go to DALI as on a GPU) + TrivialAugment."""
    return T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.TrivialAugmentWide(), T.ToTensor(),
                      T.Normalize(MEAN, STD)])  # fmt: skip


@pytest.mark.parametrize("recipe", [_ta_wide, _cifar_ta, _moco_v2], ids=["host-finished", "graph-fed", "views"])
def test_the_stage_inputs_are_drawn_in_the_pool_ahead_of_dali(many, recipe, monkeypatch):
    """Beside a training loop that holds the GIL, each GIL hand-off of the draws costs the epoch thread a switch
    interval, and DeiT's pixel noise takes 18 ms a batch of 256: each batch's draws run in the decode pool,
    sent there ``DRAWS_AHEAD`` batches before DALI asks for the batch, whether the host finishes the crops or
    the graph takes the inputs (the GPU's road). Kills: the draws computed in the epoch thread
    (``Core.stage_feed_job`` computing in place), or sent when DALI asks and not before."""
    from fastload.core import Core
    from fastload.epochs import DRAWS_AHEAD

    where: list[str] = []
    events: list[tuple[str, int]] = []
    draw, ask, submit = Core.stage_feed, EpochRun.next_plan, Core.stage_feed_job

    def spied(self, epoch, positions):
        where.append(threading.current_thread().name)
        return draw(self, epoch, positions)

    def asked(self):
        b = ask(self)
        events.append(("ask", int(b.positions[0]) // 8))
        return b

    def submitted(self, epoch, positions):
        events.append(("draw", int(positions[0]) // 8))
        return submit(self, epoch, positions)

    monkeypatch.setattr(Core, "stage_feed", spied)
    monkeypatch.setattr(Core, "stage_feed_job", submitted)
    monkeypatch.setattr(EpochRun, "next_plan", asked)
    with fastload.FastLoader(many, 8, device="cpu", seed=5, num_threads=2, transform=recipe()) as ld:
        n = sum(len(y) for _, y in ld)
    assert n == 136 and len(where) == 17
    assert all(name.startswith("fastload-decode") for name in where), where
    assert DRAWS_AHEAD >= 1
    drawn: set[int] = set()
    for kind, b in events:
        if kind == "draw":
            drawn.add(b)
        else:  # when DALI asks for batch b, the draws of the next DRAWS_AHEAD batches are already on their way
            assert set(range(b, min(b + DRAWS_AHEAD, 16) + 1)) <= drawn, (b, sorted(drawn))


@pytest.mark.parametrize("recipe", [_ta_wide, _cifar_ta], ids=["host-finished", "graph-fed"])
def test_a_failed_draw_in_the_pool_reaches_the_consumer(many, recipe, monkeypatch):
    """A draw that raises in the pool ends the epoch with an error naming the draws: no hang, no batch without its
    inputs, and no sample blamed for it."""
    from fastload.core import Core

    def broken(self, epoch, positions):
        raise ValueError("draw broke at epoch %d" % epoch)

    monkeypatch.setattr(Core, "stage_feed", broken)
    with fastload.FastLoader(many, 8, device="cpu", seed=5, num_threads=2, transform=recipe()) as ld:
        with pytest.raises(fastload.FastloadError, match="augmentation draws of epoch 0 failed: ValueError: draw broke at epoch 0"):
            next(iter(ld))
