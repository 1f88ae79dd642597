"""Finishing images on the host with pillow-simd and NumPy: resize, flip, normalise into batches.

The CPU training path finishes DALI's decoded crops here (faster than DALI's CPU resize),
and ``loader.dataset[i]`` processes one sample the same way. A crop window much larger than
the output is decoded here instead, at reduced scale (:func:`reduced_crop`), and joins the
batch already finished.
"""

from __future__ import annotations

import io
import os
import queue
import threading
from concurrent.futures import Future
from typing import Any, Callable, Mapping

import numpy as np
import torch

from .augment import eval_params

#: A training crop window at least this many times the output size on both sides is decoded at
#: reduced scale (libjpeg-turbo's DCT scaling) rather than at full scale. 2 is the least ratio at
#: which the smallest scale, 1/2, keeps the window at least ``crop`` pixels on both sides, so the
#: final resize still only shrinks; windows that big gain (1.22x on 3000x2000 photos, 2 cores:
#: benchmarks/results/big-images-2cpu-amd-epyc.md). ``float("inf")`` decodes every crop at full
#: scale (the benchmark compares the two).
REDUCED_SCALE_RATIO = 2.0

#: The scales libjpeg-turbo decodes a JPEG at in its IDCT (PIL's ``draft``), as denominators.
DCT_SCALES = (8, 4, 2)


def finish_crops(
    crops,
    flips: np.ndarray,
    *,
    crop: int,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
    dtype: torch.dtype,
    channels_last: bool,
    finished: Mapping[int, np.ndarray] | None = None,
) -> torch.Tensor:
    """Resize DALI's decoded CPU crops to ``crop``x``crop``, flip, normalise: one batch tensor.

    ``finished`` maps positions in the batch to crops already resized (HWC uint8
    ``crop``x``crop``, unflipped, e.g. from :func:`reduced_crop`): those are taken as they
    are and ``crops[i]`` is not read there.

    pillow-simd's SIMD bilinear resize (antialiased, the filter torchvision's PIL path
    uses) and NumPy, image by image, each normalised into the batch while it is still in
    the cache (a whole-batch normalisation made four passes over 38 MB and ran 13 % slower
    beside DALI's decoding threads). Both are single-threaded and GIL-free, so this thread
    never competes with DALI's workers through a second thread pool. DALI's buffers are
    read in place. The arithmetic is torchvision's ``ToTensor`` + ``Normalize`` in float32:
    ``x * (1 / (255 std)) - mean / std``.
    """
    from PIL import Image

    n = len(crops)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out_dtype = torch.uint8 if mean is None else torch.float32
    images = torch.empty((n, 3, crop, crop), dtype=out_dtype, memory_format=fmt)
    dst_all = images.numpy()  # (n, 3, crop, crop) view, strided when channels_last
    if mean is not None:
        scale, shift = (a.reshape(3, 1, 1) for a in _affine(mean, std))
    resize, bilinear, frombuffer = Image.Image.resize, Image.BILINEAR, Image.frombuffer
    done = finished or {}
    for i in range(n):
        if i in done:
            hwc = done[i]
            if hwc.shape != (crop, crop, 3) or hwc.dtype != np.uint8:
                raise ValueError(f"finished crop {i} is {hwc.dtype} {hwc.shape}, not uint8 ({crop}, {crop}, 3)")
            chw = hwc.transpose(2, 0, 1)
        else:
            hwc = np.ascontiguousarray(crops[i])  # DALI's buffer, no copy
            src = frombuffer("RGB", (hwc.shape[1], hwc.shape[0]), hwc, "raw", "RGB", 0, 1)
            chw = np.asarray(resize(src, (crop, crop), bilinear)).transpose(2, 0, 1)
        if flips[i]:
            chw = chw[:, :, ::-1]  # a view: the flip happens in the write below
        dst = dst_all[i]
        if mean is None:
            dst[...] = chw
        else:  # normalise while the image is still in cache
            np.multiply(chw, scale, out=dst)
            np.subtract(dst, shift, out=dst)
    return images if dtype in (torch.float32, torch.uint8) else images.to(dtype)


def _affine(mean: tuple[float, float, float], std: tuple[float, float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``(1 / (255 std), mean / std)`` per channel: normalised = uint8 * scale - shift."""
    scale = np.array([1.0 / (255.0 * s) for s in std], dtype=np.float32)  # type: ignore[union-attr]
    shift = np.array([m / s for m, s in zip(mean, std)], dtype=np.float32)  # type: ignore[arg-type]
    return scale, shift


def eval_crop(image: np.ndarray, *, resize: int, crop: int) -> np.ndarray:
    """torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` of an HWC uint8 RGB image (bilinear, antialiased)."""
    from PIL import Image

    h, w = image.shape[:2]
    (nh, nw), (left, top) = (v.astype(int).tolist() for v in (a[0] for a in eval_params([w], [h], resize=resize, crop=crop)))
    src = Image.frombuffer("RGB", (w, h), np.ascontiguousarray(image), "raw", "RGB", 0, 1)
    out = np.asarray(src.resize((nw, nh), Image.BILINEAR))
    return out[top : top + crop, left : left + crop]


def reduced_scales(boxes: np.ndarray, widths: np.ndarray, heights: np.ndarray, *, crop: int) -> np.ndarray:
    """Per sample, the DCT scale denominator (1, 2, 4 or 8) to decode its crop window at.

    The largest of :data:`DCT_SCALES` that keeps the window (``boxes[:, 2:]``, full-scale
    pixels) at least ``crop`` on both sides, where the window is at least
    :data:`REDUCED_SCALE_RATIO` times ``crop`` on both sides; 1 (full scale) elsewhere, and
    for images PIL refuses to open as too large (``Image.MAX_IMAGE_PIXELS``).
    """
    from PIL import Image

    boxes = np.asarray(boxes, dtype=np.float64).reshape(-1, 4)
    side = np.minimum(boxes[:, 2], boxes[:, 3]) / float(crop)
    scales = np.ones(len(boxes), dtype=np.int64)
    for d in sorted(DCT_SCALES):  # a larger scale that fits overwrites a smaller one
        scales[side >= d] = d
    scales[side < REDUCED_SCALE_RATIO] = 1
    limit = Image.MAX_IMAGE_PIXELS
    if limit is not None:
        pixels = np.asarray(widths, dtype=np.int64) * np.asarray(heights, dtype=np.int64)
        scales[pixels > limit] = 1
    return scales


def reduced_crop(payload: bytes, box, *, scale: int, crop: int) -> np.ndarray:
    """Decode a JPEG at ``1/scale`` (libjpeg-turbo's DCT scaling) and resize its crop window: HWC uint8 ``crop``x``crop``.

    The window ``(x, y, w, h)`` is in full-scale pixels. libjpeg's scaled pixel ``i`` is
    the IDCT of full-scale pixels ``[i * scale, (i + 1) * scale)`` (the image is
    ``ceil(W / scale)`` wide), so the window is exactly ``(x, y, x + w, y + h) / scale`` there,
    in fractional pixels, which PIL's resize takes as its source box: the antialiased
    bilinear filter of :func:`finish_crops` over what the reduced decode averaged. Not
    flipped. Decoding and resizing release the GIL.

    Raises:
        OSError, ValueError, SyntaxError: PIL cannot decode ``payload``.
    """
    from PIL import Image

    x, y, w, h = (float(v) for v in box)
    with Image.open(io.BytesIO(payload)) as im:
        full_w, full_h = im.size
        if scale > 1:
            im.draft("RGB", (full_w // scale, full_h // scale))
        sw, sh = im.size
        if (sw, sh) == (-(-full_w // scale), -(-full_h // scale)):
            sx = sy = float(scale)
        else:  # not a JPEG PIL scales (never for a stored payload): whatever size it decoded to
            sx, sy = full_w / sw, full_h / sh
        if im.mode != "RGB":
            im = im.convert("RGB")
        src = (x / sx, y / sy, min((x + w) / sx, sw), min((y + h) / sy, sh))
        out = im.resize((crop, crop), Image.BILINEAR, box=src)
    return np.asarray(out)


class DecodePool:
    """A few daemon threads that run decodes (:func:`reduced_crop`) and return futures.

    Daemon threads, as :class:`fastload.ReadAhead`'s, rather than a ``ThreadPoolExecutor``,
    whose threads the interpreter joins at exit (a script interrupted mid-epoch would
    wait for them). The threads hold the queue, never the pool: a pool nobody references
    is collected, and :meth:`close` (or dropping it) ends its threads.
    """

    def __init__(self, threads: int, *, name: str = "fastload-decode") -> None:
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._threads = [threading.Thread(target=_work, args=(self._queue,), name=f"{name}-{k}", daemon=True) for k in range(threads)]
        self._closed = False
        self._pid = os.getpid()
        for t in self._threads:
            t.start()

    def submit(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Future:
        """Run ``fn(*args, **kwargs)`` in a thread; its result or exception comes in the future."""
        if self._closed:
            raise RuntimeError("the decode pool is closed")
        future: Future = Future()
        self._queue.put((future, fn, args, kwargs))
        return future

    def close(self, timeout: float = 5.0) -> None:
        """Cancel the decodes not started, end the threads and wait for them (each finishes the one it runs).

        Idempotent. A thread of the pool that closes it (a finaliser run there) is not waited for.
        """
        if self._closed:
            return
        self._closed = True
        while True:
            try:
                job = self._queue.get_nowait()
            except queue.Empty:
                break
            if job is not None:
                job[0].cancel()
        for _ in self._threads:
            self._queue.put(None)
        if os.getpid() == self._pid:  # a forked child has none of these threads
            for t in self._threads:
                if t is not threading.current_thread():
                    t.join(timeout)

    def __del__(self) -> None:
        self.close(0.0)


def _work(jobs: queue.SimpleQueue) -> None:
    while True:
        job = jobs.get()
        if job is None:
            return
        future, fn, args, kwargs = job
        if not future.set_running_or_notify_cancel():
            continue
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
            future.set_exception(e)
        else:
            future.set_result(result)
        del job, future, fn, args, kwargs


__all__ = ["finish_crops", "eval_crop", "reduced_scales", "reduced_crop", "DecodePool", "REDUCED_SCALE_RATIO", "DCT_SCALES"]
