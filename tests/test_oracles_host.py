"""fastload.host's reduced-scale decode and its scale choice, against a full-scale decode and a hand table.

``reduced_crop`` decodes a JPEG at 1/2, 1/4 or 1/8 and resizes the crop window from there; its
oracle is PIL's full-scale decode of the same JPEG, the same window resized by the same filter. The
images here do not divide by the DCT scale (1001x1001, 500x375), and the windows touch the right and
bottom edges, where the last scaled pixel holds only part of a block: a window mapped with
``ceil(W / scale)`` as the scale lands a few pixels off and fails. ``reduced_scales`` against a table
of window sides written out by hand (the ratio bound at 2 and each scale's threshold on both sides).
``eval_crop`` against torchvision's ``Resize`` + ``CenterCrop``.
"""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from fastload import host


def gradient(w: int, h: int) -> np.ndarray:
    yy, xx = np.mgrid[0:h, 0:w]
    return np.stack([np.rint(xx * 255.0 / (w - 1)), np.rint(yy * 255.0 / (h - 1)),
                     np.rint(((xx // 7 + yy // 5) % 2) * 120 + 60)], axis=-1).astype(np.uint8)  # fmt: skip


def jpeg(a: np.ndarray) -> bytes:
    b = io.BytesIO()
    Image.fromarray(a).save(b, "JPEG", quality=100, subsampling=0)
    return b.getvalue()


def full_scale(payload: bytes, box, crop: int, interpolation: str = "bilinear") -> np.ndarray:
    x, y, w, h = box
    with Image.open(io.BytesIO(payload)) as im:
        return np.asarray(im.convert("RGB").resize((crop, crop), host.PIL_FILTERS[interpolation], box=(x, y, x + w, y + h)))


def diff(a, b) -> float:
    return float(np.abs(a.astype(np.int16) - b.astype(np.int16)).mean())


#: (image size, window, scale, the mean difference allowed from the full-scale window at crop 32).
#: Measured (libjpeg-turbo, pillow-simd 12.1): 0.02-0.19, and 1.10 where the window is exactly 32
#: scaled pixels; with the window mapped by ``ceil(W / scale)``'s ratio instead: 0.17-0.65 and 1.84.
CASES = [
    ((1001, 1001), (601, 601, 400, 400), 4, 0.2),  # touches the right and bottom edges: 1001 = 250 * 4 + 1
    ((1001, 1001), (0, 0, 1001, 1001), 8, 0.3),  # the whole image at 1/8: 126 pixels, the last 1/8 of one
    ((1001, 1001), (3, 500, 998, 501), 2, 0.08),
    ((500, 375), (100, 119, 400, 256), 4, 0.18),  # 375 = 93 * 4 + 3
    ((500, 375), (0, 0, 500, 375), 2, 0.2),
    ((375, 500), (119, 100, 256, 400), 8, 1.4),
]


@pytest.mark.parametrize("size, box, scale, tol", CASES)
def test_reduced_crop_is_the_full_scale_window(size, box, scale, tol):
    """Kills: the window divided by ``ceil(W / scale)``'s ratio instead of the scale (the window slides
    by up to a scaled pixel towards the far edges); the window not clipped to the scaled image; the
    draft asked at another scale."""
    crop = 32
    payload = jpeg(gradient(*size))
    got = host.reduced_crop(payload, box, scale=scale, crop=crop)
    assert got.shape == (crop, crop, 3) and got.dtype == np.uint8
    d = diff(got, full_scale(payload, box, crop))
    assert d <= tol, d
    x, y, w, h = box
    for dx, dy in ((-scale * 2, 0), (0, -scale * 2)):  # a window a couple of scaled pixels off is farther
        if x + dx >= 0 and y + dy >= 0:
            assert diff(got, full_scale(payload, (x + dx, y + dy, w, h), crop)) > d


def test_reduced_crop_honours_the_interpolation():
    payload = jpeg(gradient(1001, 1001))
    box = (601, 601, 400, 400)
    got = {m: host.reduced_crop(payload, box, scale=4, crop=32, interpolation=m) for m in ("bilinear", "bicubic", "nearest")}
    assert not np.array_equal(got["bilinear"], got["bicubic"]) and not np.array_equal(got["bilinear"], got["nearest"])


def test_reduced_crop_at_scale_1_is_the_full_scale_window_exactly():
    payload = jpeg(gradient(300, 200))
    box = (10, 20, 200, 150)
    assert np.array_equal(host.reduced_crop(payload, box, scale=1, crop=24), full_scale(payload, box, 24))


#: min(window side) / crop -> scale, crop 32: below 2 always 1; else the largest of 2, 4, 8 it reaches
SCALES = [(63, 1), (63.99, 1), (64, 2), (127, 2), (128, 4), (255.9, 4), (256, 8), (5000, 8)]


@pytest.mark.parametrize("side, scale", SCALES)
def test_reduced_scales_table(side, scale):
    """Kills: the ratio bound or a scale threshold off by one, ``>`` for ``>=``, the width alone read."""
    boxes = np.array([[0, 0, side, 9999], [0, 0, 9999, side], [0, 0, side, side]])
    got = host.reduced_scales(boxes, np.full(3, 9000), np.full(3, 9000), crop=32)  # 81 MP: PIL opens it
    assert got.tolist() == [scale] * 3 and got.dtype == np.int64


def test_reduced_scales_leave_images_pil_refuses_at_full_scale(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 1000 * 1000)
    boxes = np.array([[0, 0, 900, 900]] * 3)
    got = host.reduced_scales(boxes, np.array([1000, 1001, 2000]), np.array([1000, 1000, 2000]), crop=32)
    assert got.tolist() == [8, 1, 1]
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)
    assert host.reduced_scales(boxes, np.array([10**5] * 3), np.array([10**5] * 3), crop=32).tolist() == [8, 8, 8]


@pytest.mark.parametrize("hw", [(40, 64), (64, 40), (57, 57), (300, 17)])
@pytest.mark.parametrize("interpolation", ["bilinear", "nearest", "bicubic"])
def test_eval_crop_is_torchvisions_resize_and_center_crop(hw, interpolation):
    """Kills: the short side resized to another size, the crop off centre, the filter ignored."""
    from torchvision.transforms import CenterCrop, InterpolationMode, Resize

    h, w = hw
    a = gradient(w, h)
    got = host.eval_crop(a, resize=36, crop=32, interpolation=interpolation)
    mode = {"bilinear": InterpolationMode.BILINEAR, "nearest": InterpolationMode.NEAREST,
            "bicubic": InterpolationMode.BICUBIC}[interpolation]  # fmt: skip
    want = np.asarray(CenterCrop(32)(Resize(36, interpolation=mode)(Image.fromarray(a))))
    assert got.shape == want.shape == (32, 32, 3)
    assert np.abs(got.astype(int) - want.astype(int)).max() <= 1


# ----------------------------------------------------------------------------- the reduced decode's inputs


class DraftSpy:
    """Wraps PIL's ``JpegImageFile.draft``: records the image's size after each call (the decode's size)."""

    def __init__(self, monkeypatch) -> None:
        from PIL import JpegImagePlugin

        real = JpegImagePlugin.JpegImageFile.draft
        self.sizes: list[tuple[int, int]] = []

        def draft(im, mode, size):
            out = real(im, mode, size)
            self.sizes.append(im.size)
            return out

        monkeypatch.setattr(JpegImagePlugin.JpegImageFile, "draft", draft)


@pytest.mark.parametrize("scale", [2, 4, 8])
def test_reduced_crop_decodes_at_the_scale_asked(monkeypatch, scale):
    """libjpeg decodes ``ceil(1001 / scale)`` pixels a side (the docstring's law). Kills: scale 2 decoded at
    full scale (``scale > 2``), the draft asked with no size (a full-scale decode, which is closer to the
    full-scale oracle than the reduced one and so passes the tolerance tests)."""
    spy = DraftSpy(monkeypatch)
    payload = jpeg(gradient(1001, 1001))
    got = host.reduced_crop(payload, (601, 601, 400, 400), scale=scale, crop=32)
    assert got.shape == (32, 32, 3)
    side = -(-1001 // scale)
    assert spy.sizes == [(side, side)]


def test_reduced_crop_of_a_payload_pil_does_not_scale_is_the_full_scale_window():
    """A PNG has no DCT scaling: the window is mapped by the size PIL decoded at (1:1 here), so the result
    is the full-scale window exactly. Kills: the fallback ratio as ``full * decoded`` or ``None``."""
    b = io.BytesIO()
    Image.fromarray(gradient(300, 200)).save(b, "PNG")
    box = (10, 20, 200, 150)
    for scale in (2, 4, 8):
        assert np.array_equal(host.reduced_crop(b.getvalue(), box, scale=scale, crop=24), full_scale(b.getvalue(), box, 24))


@pytest.mark.parametrize("scale", [1, 4])
def test_reduced_crop_of_a_grayscale_jpeg_is_rgb(scale):
    """Kills: the RGB conversion skipped, inverted (``== "RGB"``), or asked for another mode: the output
    is HWC RGB whatever the JPEG's mode, three equal channels for a grayscale one."""
    b = io.BytesIO()
    Image.fromarray(gradient(500, 375)[..., 0]).save(b, "JPEG", quality=100)
    box = (100, 119, 400, 256)
    got = host.reduced_crop(b.getvalue(), box, scale=scale, crop=32)
    assert got.shape == (32, 32, 3) and got.dtype == np.uint8
    assert np.array_equal(got[..., 0], got[..., 1]) and np.array_equal(got[..., 0], got[..., 2])
    assert diff(got, full_scale(b.getvalue(), box, 32)) <= 0.2


def test_eval_crop_defaults_to_bilinear():
    """Kills: the default interpolation's name changed (no such filter)."""
    from torchvision.transforms import CenterCrop, Resize

    a = gradient(64, 40)
    want = np.asarray(CenterCrop(32)(Resize(36)(Image.fromarray(a))))
    assert np.abs(host.eval_crop(a, resize=36, crop=32).astype(int) - want.astype(int)).max() <= 1


# ----------------------------------------------------------------------------- finish_crops' paths and dtypes


def crops_of(n: int, seed: int, lo: int = 5, hi: int = 60) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, (h, w, 3), dtype=np.uint8) for h, w in rng.integers(lo, hi, (n, 2))]


@pytest.mark.parametrize("crop, chunked", [(8, True), (85, True), (97, True), (98, False), (130, False), (300, False)])
def test_outputs_of_at_most_97_px_are_finished_a_chunk_at_a_time(monkeypatch, crop, chunked):
    """The documented split (``crop * crop * 3 <= 28 KiB``: 97 px and below), as a table by hand.
    Kills: the byte count as ``crop * crop / 3``, ``crop / crop * 3`` or ``* 4`` (85 px a chunk at a time
    no more)."""
    monkeypatch.setattr(host, "_SCRIPT", [None])  # the PIL paths (what runs without TorchScript)
    seen = []
    for name in ("_finish_chunked", "_finish_each"):
        real = getattr(host, name)
        monkeypatch.setattr(host, name, lambda *a, real=real, name=name: (seen.append(name), real(*a))[1])
    finish_crops_args = dict(crop=crop, mean=None, std=None, dtype=torch.uint8, channels_last=False)
    host.finish_crops(crops_of(2, crop), np.zeros(2, bool), **finish_crops_args)
    assert seen == ["_finish_chunked" if chunked else "_finish_each"]


@pytest.mark.parametrize("interpolation, scripted", [("bilinear", True), ("bicubic", True), ("nearest", False), ("lanczos", False)])
@pytest.mark.parametrize("crop", [8, 224])
def test_bilinear_and_bicubic_go_to_the_one_call_per_batch(monkeypatch, interpolation, scripted, crop):
    """torch's resize is PIL's for bilinear and bicubic only: those batches are one TorchScript call, the
    others PIL's. Kills: a mode added to or dropped from ``TORCH_MODES``; the script bypassed."""
    calls = []
    real = host.batch_finish()
    monkeypatch.setattr(host, "batch_finish", lambda: lambda *a: (calls.append(a[9]), real(*a))[1])  # a[9]: the mode
    crops = crops_of(3, 1, 5, 400)  # smaller and larger than the output
    got = host.finish_crops(crops, np.array([True, False, True]), crop=crop, mean=None, std=None, dtype=torch.uint8,
                            channels_last=False, interpolation=interpolation)  # fmt: skip
    assert calls == ([interpolation] if scripted else [])
    for i, c in enumerate(crops):
        want = np.asarray(Image.fromarray(c).resize((crop, crop), host.PIL_FILTERS[interpolation]))
        assert np.array_equal(got[i].permute(1, 2, 0).numpy(), want[:, ::-1] if i != 1 else want), i


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("crop", [16, 112])
def test_other_float_dtypes_are_the_float32_batch_converted(dtype, crop):
    """Kills: the conversion to ``dtype`` skipped, inverted, or made to None."""
    crops, flips = crops_of(3, 1), np.array([False, True, False])
    kw = dict(crop=crop, mean=(0.5, 0.4, 0.3), std=(0.2, 0.25, 0.3), channels_last=False)
    f32 = host.finish_crops(crops, flips, dtype=torch.float32, **kw)
    got = host.finish_crops(crops, flips, dtype=dtype, **kw)
    assert got.dtype == dtype and torch.equal(got, f32.to(dtype))


@pytest.mark.parametrize("crop", [16, 112])
def test_normalisation_is_the_documented_float32_arithmetic_bit_for_bit(crop):
    """``x * (1 / (255 std)) - mean / std`` with both constants rounded to float32 and float32 arithmetic
    (written here in torch). Kills: either constant kept in float64 (426 of the 768 values of one channel
    sweep then differ in the last place)."""
    mean, std = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
    x = np.broadcast_to(np.arange(256, dtype=np.uint8).reshape(16, 16, 1), (16, 16, 3))
    crops = [np.ascontiguousarray(np.kron(x, np.ones((crop // 16, crop // 16, 1), np.uint8)))]  # exactly crop x crop
    got = host.finish_crops(crops, np.zeros(1, bool), crop=crop, mean=mean, std=std, dtype=torch.float32, channels_last=False)
    u8 = host.finish_crops(crops, np.zeros(1, bool), crop=crop, mean=None, std=None, dtype=torch.uint8, channels_last=False)
    scale = torch.tensor([1.0 / (255.0 * s) for s in std], dtype=torch.float32).view(1, 3, 1, 1)
    shift = torch.tensor([m / s for m, s in zip(mean, std)], dtype=torch.float32).view(1, 3, 1, 1)
    assert torch.equal(got, u8.float() * scale - shift)


@pytest.mark.parametrize("crop", [16, 40, 224])
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear", "bicubic", "lanczos"])
def test_small_crops_honour_the_interpolation(crop, interpolation):
    """Kills: the chunked path's canvas built without ``resample`` (bilinear whatever was asked)."""
    crops, flips = crops_of(5, 2, 10, 90), np.array([True, False, True, False, False])
    got = host.finish_crops(crops, flips, crop=crop, mean=None, std=None, dtype=torch.uint8, channels_last=False,
                            interpolation=interpolation)  # fmt: skip
    f = host.PIL_FILTERS[interpolation]
    for i, c in enumerate(crops):
        want = np.asarray(Image.fromarray(c).resize((crop, crop), f))
        assert np.array_equal(got[i].permute(1, 2, 0).numpy(), want[:, ::-1] if flips[i] else want), i


def test_the_canvas_refuses_missing_c_calls_and_short_crops():
    """Kills: the messages; a crop with too few bytes for its size let through (``and`` for ``or``, or the
    consumed-bytes test as ``> 0``: a 2-row crop of one channel consumes no whole RGB row)."""
    with pytest.raises(RuntimeError) as e:
        host._Canvas(8, 1, None)
    assert str(e.value) == "PIL's C image calls are not usable here (see fastload.host.core_ops)"
    canvas = host._Canvas(8, 1, host.core_ops())
    for h in (2, 6):
        with pytest.raises(ValueError) as e:
            canvas.put(0, np.zeros((h, 5, 1), np.uint8))
        assert str(e.value) == f"cannot read a 5x{h} RGB crop"


def test_c_calls_right_only_for_the_first_image_are_not_used(monkeypatch):
    """core_ops' check compares both cells: a decoder that swaps red and blue on its second use only (the
    flipped cell; the third use is the public calls' reference) is refused. Kills: the two comparisons joined by ``or``; a check image of one value (its channels equal)."""
    from PIL import Image as PILImage

    real = PILImage.core.raw_decoder
    calls = []

    def decoder(mode, rawmode, *args):
        calls.append(1)
        return real(mode, "BGR" if len(calls) == 2 else rawmode, *args)

    monkeypatch.setattr(PILImage.core, "raw_decoder", decoder)
    monkeypatch.setattr(host, "_CORE", [])
    assert host.core_ops() is None and len(calls) == 3


# ----------------------------------------------------------------------------- DecodePool


def pool_threads(name: str) -> list:
    import threading

    return sorted((t for t in threading.enumerate() if t.name.startswith(name + "-")), key=lambda t: t.name)


def test_decode_pool_runs_jobs_with_their_arguments_in_named_daemon_threads():
    """Kills: the threads not started, unnamed or not daemons, their count, the job's positional or keyword
    arguments dropped, its result or exception not handed to the future."""
    pool = host.DecodePool(2, name="pool-a")
    try:
        threads = pool_threads("pool-a")
        assert [t.name for t in threads] == ["pool-a-0", "pool-a-1"] and all(t.daemon and t.is_alive() for t in threads)
        f = pool.submit(lambda a, b, *, c: (a, b, c), 1, 2, c=3)
        assert f.result(timeout=10) == (1, 2, 3)
        err = KeyError("x")

        def fail():
            raise err

        assert pool.submit(fail).exception(timeout=10) is err
        assert [pool.submit(pow, k, 2).result(timeout=10) for k in range(5)] == [0, 1, 4, 9, 16]
    finally:
        pool.close()
    assert not any(t.is_alive() for t in threads)
    default = host.DecodePool(1)
    try:
        assert [t.name for t in pool_threads("fastload-decode")] == ["fastload-decode-0"]
    finally:
        default.close()


def test_decode_pool_close_cancels_what_has_not_started_and_refuses_more():
    """Kills: the pending jobs not cancelled (or the wrong element of the job cancelled), the threads left
    running (no sentinels, or not joined: ``getpid() != pid``, ``ident is None``), submit after close not
    refused, its message, the closed flag not set."""
    import threading

    pool = host.DecodePool(1, name="pool-b")
    threads = pool_threads("pool-b")
    release = threading.Event()
    started = threading.Event()

    def slow():
        started.set()
        release.wait(10)
        return "slow"

    first = pool.submit(slow)
    assert started.wait(10)
    later = [pool.submit(pow, 2, k) for k in range(3)]
    threading.Timer(0.3, release.set).start()
    pool.close()  # waits for the running job (0.3 s), cancels the rest
    assert first.result(timeout=0) == "slow" and all(f.cancelled() for f in later)
    assert not any(t.is_alive() for t in threads)
    with pytest.raises(RuntimeError) as e:
        pool.submit(pow, 2, 2)
    assert str(e.value) == "the decode pool is closed"
    pool.close()  # idempotent


def test_decode_pool_close_waits_at_most_its_timeout():
    """Kills: the join without the timeout (close would wait for the running decode)."""
    import threading
    import time

    pool = host.DecodePool(1, name="pool-c")
    release = threading.Event()
    f = pool.submit(release.wait, 20)
    time.sleep(0.05)
    t0 = time.monotonic()
    pool.close(0.05)
    took = time.monotonic() - t0
    release.set()
    assert took < 2.0 and f.result(timeout=10) is True


def test_decode_pool_closed_from_its_own_thread_and_when_dropped():
    """A pool closed by one of its own threads does not join that thread; a pool nobody references is
    closed without waiting. Kills: the current-thread test dropped or inverted (joining itself raises),
    the finaliser's close waiting (``close(None)``/``close(1.0)`` while a decode runs)."""
    import threading
    import time

    own = host.DecodePool(1, name="pool-d")
    f = own.submit(lambda: own.close())
    assert f.exception(timeout=10) is None
    pool = host.DecodePool(1, name="pool-e")
    threads = pool_threads("pool-e")
    release = threading.Event()
    busy = pool.submit(release.wait, 20)
    time.sleep(0.05)
    t0 = time.monotonic()
    del pool  # its threads hold its queue, never the pool: the last reference goes here
    took = time.monotonic() - t0
    release.set()
    assert took < 0.8 and busy.result(timeout=10) is True
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads)


def test_a_cancelled_job_does_not_stop_its_thread():
    """Kills: the worker leaving its loop on a cancelled job (``break`` for ``continue``), or running only
    cancelled ones (the test inverted)."""
    import threading

    pool = host.DecodePool(1, name="pool-f")
    try:
        release = threading.Event()
        first = pool.submit(release.wait, 20)
        gone = pool.submit(pow, 2, 3)
        after = pool.submit(pow, 2, 4)
        assert gone.cancel()
        release.set()
        assert first.result(timeout=10) is True and after.result(timeout=10) == 16 and gone.cancelled()
    finally:
        pool.close()


def test_a_decode_pool_that_cannot_start_all_its_threads_says_so_and_ends_the_others(monkeypatch):
    """Kills: the start error not checked or inverted, the error's text (what could not start, the cause),
    the threads that did start left running."""
    from fastload.errors import LoaderError
    from fastload.threads import HINT

    started = []

    def start_some(threads):
        threads[0].start()
        started.append(threads[0])
        return RuntimeError("can't start new thread")

    monkeypatch.setattr(host, "start_threads", start_some)
    with pytest.raises(LoaderError) as e:
        host.DecodePool(3, name="pool-g")
    assert str(e.value) == f"could not start the decode pool's 3 threads: can't start new thread; {HINT}"
    started[0].join(10)
    assert not started[0].is_alive()
