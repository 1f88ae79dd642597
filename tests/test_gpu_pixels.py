"""The CUDA loader's pixels, image by image: against the reference, against the CPU path, and under a slow consumer.

What ``tests/test_pixels.py`` checks on the CPU, on the GPU graph (nvJPEG decoding of the
crop window, DALI's GPU resize, ``crop_mirror_normalize`` with ``mirror``): crops and flips
against the reference, evaluation against PIL, the EXIF-rotated samples, and each CUDA
image against the CPU path's. Plus stream safety: a consumer whose stream is held back
with ``torch.cuda._sleep`` before it reads each batch must read the same bytes as a
consumer that synchronises, so the loader's event wait and ``record_stream`` must hold.
Tolerances (``reference.CUDA``) are justified in ``tests/reference.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from PIL import Image, ImageOps

import fastload
from fastload import IMAGENET_MEAN, IMAGENET_STD, FastLoader

from conftest import ROTATED_ORIENTATIONS, pattern_label
from reference import CUDA, ROTATED, Reference, as_hwc255, assert_close, difference, eval_image

pytestmark = pytest.mark.gpu

CROP = 48
BATCH = 5
#: GPU clock cycles the consumer's stream spins before it reads a batch (tens of ms on any current GPU).
SLEEP_CYCLES = 50_000_000


@pytest.fixture(scope="module")
def ref(pixel_dataset) -> Reference:
    return Reference(pixel_dataset.packed)


def _loader(pixel_dataset, device: str = "cuda", **kw) -> FastLoader:
    kw = {"crop": CROP, **kw}
    return FastLoader(pixel_dataset.packed, kw.pop("batch_size", BATCH), device=device, **kw)


def _flipped(im: np.ndarray) -> bool:
    return bool(im[:, -1, 0].mean() < im[:, 0, 0].mean())


@pytest.mark.parametrize("normalised, channels_last", [(False, True), (True, False)], ids=["uint8-nhwc", "normalised-nchw"])
def test_cuda_training_crops_and_flips_match_the_reference(pixel_dataset, ref, normalised, channels_last):
    norm = {} if normalised else {"mean": None, "std": None}
    mean, std = (IMAGENET_MEAN, IMAGENET_STD) if normalised else (None, None)
    with _loader(pixel_dataset, seed=17, channels_last=channels_last, **norm) as loader:
        loader.set_epoch(3)
        got = [(x, y) for x, y in loader]
    want = ref.train_epoch(batch_size=BATCH, seed=17, epoch=3, crop=CROP)
    assert len(got) == len(want)
    flips = 0
    for b, ((x, y), exp) in enumerate(zip(got, want)):
        assert x.device.type == "cuda" and x.shape == (len(exp.indices), 3, CROP, CROP)
        assert y.device.type == "cuda" and y.tolist() == exp.labels
        for k, r in enumerate(exp.images):
            im = as_hwc255(x[k], mean, std)
            what = f"batch {b} image {k} (sample {exp.indices[k]}, flip {exp.flips[k]})"
            assert_close(im, r, CUDA, what=what)
            assert difference(im, r[:, ::-1]).mean > 2 * CUDA[1], f"{what}: as close to its mirror image"
            assert _flipped(im) == bool(exp.flips[k]) and pattern_label(im) == exp.labels[k], what
            flips += int(exp.flips[k])
    assert 0 < flips < len(ref)


@pytest.mark.parametrize("resize, crop", [(56, 48), (64, 56)])
def test_cuda_evaluation_matches_pil(pixel_dataset, ref, resize, crop):
    with _loader(pixel_dataset, train=False, shuffle=False, resize=resize, crop=crop, mean=None, std=None) as loader:
        got = [(x.cpu(), y.cpu()) for x, y in loader]
    want = ref.eval_epoch(batch_size=BATCH, resize=resize, crop=crop)
    assert len(got) == len(want)
    for (x, y), exp in zip(got, want):
        assert y.tolist() == exp.labels
        for k, r in enumerate(exp.images):
            assert_close(as_hwc255(x[k]), r, CUDA, what=f"sample {exp.indices[k]}")


def test_cuda_exif_rotated_samples_come_out_upright(rotated_dataset):
    ds = fastload.Dataset(rotated_dataset.packed)
    with FastLoader(rotated_dataset.packed, 3, device="cuda", train=False, shuffle=False, resize=56, crop=48, mean=None, std=None) as loader:
        x, y = next(iter(loader))
    assert y.tolist() == list(range(len(ROTATED_ORIENTATIONS)))
    # ROTATED plus the CUDA decoder's own rounding
    tolerance = (ROTATED[0] + CUDA[0], ROTATED[1] + CUDA[1])
    for i, orientation in enumerate(ROTATED_ORIENTATIONS):
        with Image.open(rotated_dataset.src / ds.source_path(i)) as im:
            raw = np.asarray(im.convert("RGB"))
            upright = np.asarray(ImageOps.exif_transpose(im).convert("RGB"))
        got = as_hwc255(x[i])
        assert_close(got, eval_image(upright, resize=56, crop=48), tolerance, what=f"orientation {orientation}")
        for t in Image.Transpose:
            wrong = np.asarray(Image.fromarray(raw).transpose(t))
            if wrong.shape == upright.shape and not np.array_equal(wrong, upright):
                assert difference(got, eval_image(wrong, resize=56, crop=48)).mean > 2 * tolerance[1], (orientation, t)


@pytest.mark.parametrize("train", [True, False], ids=["train", "eval"])
def test_cuda_output_matches_the_cpu_path_per_image(pixel_dataset, train):
    def run(device):
        with _loader(pixel_dataset, device=device, seed=6, train=train, resize=56, mean=None, std=None) as loader:
            loader.set_epoch(1)
            return [(x.cpu(), y.cpu()) for x, y in loader]

    cpu, cuda = run("cpu"), run("cuda")
    assert len(cpu) == len(cuda)
    for b, ((x1, y1), (x2, y2)) in enumerate(zip(cpu, cuda)):
        assert torch.equal(y1, y2)  # the same samples in the same order
        for k in range(len(x1)):
            assert_close(as_hwc255(x2[k]), as_hwc255(x1[k]), CUDA, what=f"batch {b} image {k}")


def _checksums(x: torch.Tensor) -> torch.Tensor:
    """Per image, an exact position-weighted sum of its bytes (int64, computed on the current stream)."""
    weights = (torch.arange(x[0].numel(), device=x.device, dtype=torch.int64) % 251 + 1).view(x.shape[1:])
    return (x.to(torch.int64) * weights).sum(dim=(1, 2, 3))


@pytest.mark.parametrize("consumer", ["default-stream", "side-stream"])
def test_a_delayed_consumer_stream_reads_the_same_batches(pixel_dataset, consumer):
    """Each batch is read only after the consumer's stream has spun for a while, and dropped at
    once: without the loader's event wait or ``record_stream``, its memory would be reused by
    the next batches before the delayed read and the checksums would differ."""
    epochs = 3

    def run(delay: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
        out = []
        with _loader(pixel_dataset, seed=12, batch_size=4, prefetch=2, mean=None, std=None) as loader:
            stream = torch.cuda.Stream() if consumer == "side-stream" else torch.cuda.current_stream()
            with torch.cuda.stream(stream):
                for _ in range(epochs):
                    for x, y in loader:
                        if delay:
                            torch.cuda._sleep(SLEEP_CYCLES)  # the consumer's stream is busy ...
                        else:
                            stream.synchronize()
                        out.append((_checksums(x), y.to(torch.int64) * 1))  # ... then reads the batch
                        del x, y  # nothing else holds the batch: only record_stream keeps its memory
            stream.synchronize()
        return [(s.cpu(), y.cpu()) for s, y in out]

    calm, delayed = run(False), run(True)
    assert len(calm) == len(delayed) == epochs * -(-len(pixel_dataset.labels) // 4)
    for k, ((s1, y1), (s2, y2)) in enumerate(zip(calm, delayed)):
        assert torch.equal(y1, y2), f"batch {k}: labels differ"
        assert torch.equal(s1, s2), f"batch {k}: pixels differ under a delayed consumer"
