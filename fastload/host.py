"""Finishing images on the host with pillow-simd and NumPy: resize, flip, normalise into batches.

The CPU training path finishes DALI's decoded crops here (faster than DALI's CPU resize),
and ``loader.dataset[i]`` processes one sample the same way. A crop window much larger than
the output is decoded here instead, at reduced scale (:func:`reduced_crop`), and joins the
batch already finished.
"""

from __future__ import annotations

import dataclasses
import io
import os
import queue
import threading
import warnings
from concurrent.futures import Future
from typing import Any, Callable, List, Mapping, Optional

import numpy as np
import torch

from .threads import cannot_start, start_threads
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
    interpolation: str = "bilinear",
) -> torch.Tensor:
    """Resize DALI's decoded CPU crops to ``crop``x``crop``, flip, normalise: one batch tensor.

    ``crops`` is a sequence of HWC uint8 RGB arrays (views of DALI's buffer: read in
    place). ``finished`` maps positions in the batch to crops already resized (HWC uint8
    ``crop``x``crop``, unflipped, e.g. from :func:`reduced_crop`): those are taken as they
    are and ``crops[i]`` is not read there.

    Bilinear and bicubic (:data:`TORCH_MODES`) go through one TorchScript call for the whole
    batch (:func:`batch_finish`: torch's uint8 antialiased resize, pillow-simd's pixels), GIL-free
    and, in the loader's thread, on one torch thread, so it never competes with DALI's workers
    through a second pool; ``mean=None`` keeps uint8 (the stage graph normalises). The
    arithmetic is torchvision's ``ToTensor`` + ``Normalize`` in float32:
    ``x * (1 / (255 std)) - mean / std``. Nearest and lanczos use pillow-simd and NumPy:

    Small outputs (at most :data:`SMALL_CROP_BYTES`) are finished :data:`CHUNK` images at a
    time: each is resized through PIL's C image calls straight into a cell of one array
    (:class:`_Canvas`) and a chunk is normalised with two NumPy calls. For them the Python
    that runs per image, which holds the GIL a training loop also wants, costs more than
    the pixels. Larger ones are normalised image by image while still in the cache (a chunk
    of them no longer fits it; a whole-batch normalisation made four passes over 38 MB and
    ran 13 % slower beside DALI's decoding threads). Both give the same pixels.
    """
    n = len(crops)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out_dtype = torch.uint8 if mean is None else torch.float32
    images = torch.empty((n, 3, crop, crop), dtype=out_dtype, memory_format=fmt)
    dst_all = images.numpy()  # (n, 3, crop, crop) view, strided when channels_last
    affine = None if mean is None else tuple(a.reshape(3, 1, 1) for a in _affine(mean, std))
    done = finished or {}
    for i, hwc in done.items():
        if hwc.shape != (crop, crop, 3) or hwc.dtype != np.uint8:
            raise ValueError(f"finished crop {i} is {hwc.dtype} {hwc.shape}, not uint8 ({crop}, {crop}, 3)")
    resample = PIL_FILTERS[interpolation]
    script = batch_finish() if interpolation in TORCH_MODES else None
    if script is not None:
        flat, shapes, starts, sources, at = _script_inputs(crops, done)
        scale, shift = (None, None) if affine is None else (torch.from_numpy(affine[0]), torch.from_numpy(affine[1]))
        flipped = torch.from_numpy(np.ascontiguousarray(flips, dtype=bool))
        script(flat, shapes, starts, sources, at, flipped, images, scale, shift, TORCH_MODES[interpolation])
        return images if dtype in (torch.float32, torch.uint8) else images.to(dtype)
    crops = crops.views() if isinstance(crops, PackedCrops) else crops
    if crop * crop * 3 <= SMALL_CROP_BYTES and core_ops() is not None:
        _finish_chunked(crops, flips, crop, dst_all, affine, done, resample)
    else:
        _finish_each(crops, flips, crop, dst_all, affine, done, resample)
    return images if dtype in (torch.float32, torch.uint8) else images.to(dtype)


#: Outputs of at most this many bytes (``crop * crop * 3``: 97 px and below) are finished a
#: chunk at a time (:func:`finish_crops`). Measured on 2 cores, us per image, image by image
#: against a chunk at a time, crops up to 1.15x the output: 28.0 / 17.5 at 56x56, 36.3 / 25.0
#: at 80x80, 45.7 / 34.4 at 96x96, then 155 / 147 at 128x128 and 422 / 421 at 224x224; with
#: ``channels_last`` 146 / 111 at 96x96 but 785 / 866 at 224x224, where the chunk's writes
#: leave the cache.
SMALL_CROP_BYTES = 28 * 1024

#: Images per chunk when finishing small crops: 16 to 32 measured alike; 16 keeps a chunk of
#: float32 output within 2 MB.
CHUNK = 16


#: The interpolations whose antialiased resize in torch is PIL's (pillow-simd's) pixel for pixel, as torch
#: names them: torch's uint8 kernels are a port of pillow-simd's (checked in tests/test_host.py on random
#: sizes up and down). PIL's NEAREST and LANCZOS have no such twin and keep the PIL path.
TORCH_MODES = {"bilinear": "bilinear", "bicubic": "bicubic"}


@dataclasses.dataclass(frozen=True)
class PackedCrops:
    """HWC uint8 RGB crops laid end to end in one buffer (DALI's CPU output batch, read in place).

    ``flat``: 1-D uint8; ``shapes``: int64 ``(n, 3)``; crop ``i`` is the ``shapes[i]`` array starting at
    ``starts[i]``. What the loader's thread hands :func:`finish_crops`, with no per-image Python.
    """

    flat: np.ndarray
    shapes: np.ndarray

    @property
    def starts(self) -> np.ndarray:
        sizes = self.shapes.prod(axis=1)
        return np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int64)

    def __len__(self) -> int:
        return len(self.shapes)

    def views(self) -> list[np.ndarray]:
        """The crops as NumPy views (what the PIL paths read)."""
        return [self.flat[a : a + int(np.prod(sh))].reshape(sh) for a, sh in zip(self.starts.tolist(), self.shapes.tolist())]


def _tensor(a: np.ndarray) -> torch.Tensor:
    """A torch view of the array (read, never written: a read-only buffer is not copied)."""
    with warnings.catch_warnings():  # torch warns of read-only arrays, which this never writes to
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.ascontiguousarray(a))


def _script_inputs(crops, done: Mapping[int, np.ndarray]) -> tuple:
    """:func:`_finish_batch`'s crops: a :class:`PackedCrops` as its buffer, shapes and starts; a list as tensors."""
    n = len(crops)
    at = np.full(n, -1, dtype=np.int64)
    keys = sorted(done)
    extra = [_tensor(done[i]) for i in keys]
    at[keys] = np.arange(len(keys))
    if isinstance(crops, PackedCrops):
        return _tensor(crops.flat), _tensor(crops.shapes.astype(np.int64)), _tensor(crops.starts), extra, _tensor(at)
    listed = [i for i in range(n) if i not in done]
    at[listed] = len(extra) + np.arange(len(listed))
    extra += [_tensor(crops[i]) for i in listed]  # not the loader's thread: dataset[i], tests
    empty = torch.zeros((0,), dtype=torch.int64)
    return torch.zeros((0,), dtype=torch.uint8), empty.view(0, 3), empty, extra, _tensor(at)


def _finish_batch(flat: torch.Tensor, shapes: torch.Tensor, starts: torch.Tensor, crops: List[torch.Tensor],
                  at: torch.Tensor, flips: torch.Tensor, out: torch.Tensor, scale: Optional[torch.Tensor],
                  shift: Optional[torch.Tensor], mode: str) -> None:  # fmt: skip
    """Each HWC uint8 crop resized to ``out``'s size (antialiased ``mode``), mirrored where ``flips``, written
    into ``out[i]`` (``(n, 3, c, c)``), normalised as ``x * scale - shift`` when both are given. Crop ``i`` is
    ``crops[at[i]]`` where ``at[i] >= 0``, else the ``shapes[i]`` array at ``starts[i]`` of ``flat``."""
    c = out.shape[-1]
    for i in range(out.shape[0]):
        j = int(at[i])
        if j >= 0:
            x = crops[j]
        else:
            h, w, s = int(shapes[i, 0]), int(shapes[i, 1]), int(starts[i])
            x = flat[s : s + h * w * 3].view(h, w, 3)
        x = x.permute(2, 0, 1)
        if x.shape[1] != c or x.shape[2] != c:
            x = torch.nn.functional.interpolate(x.unsqueeze(0), size=[c, c], mode=mode, antialias=True)[0]
        if bool(flips[i]):
            x = x.flip(2)
        if scale is not None and shift is not None:
            torch.mul(x, scale.view(3, 1, 1), out=out[i])
            out[i].sub_(shift.view(3, 1, 1))
        else:
            out[i].copy_(x)


_SCRIPT: list = []  # [the compiled _finish_batch or None] once tried
_SCRIPTING: list = []  # [True] once this process began to compile it


def _after_fork_in_child() -> None:
    """A forked child: a thread of the parent may have held a lock at the fork that no thread here will release.
    This module's lock is made anew, and the compiled finish is not used once the parent began to compile it (a
    child's epoch thread that called it hung in it, inside TorchScript's executor: measured, under load): the PIL
    paths, the same pixels."""
    global _CORE_LOCK
    _CORE_LOCK = threading.Lock()
    if _SCRIPTING:
        _SCRIPT[:] = [None]


def batch_finish() -> Callable[..., None] | None:
    """:func:`_finish_batch` compiled by TorchScript, or None where torch cannot script it.

    One call finishes a whole batch and runs without the GIL: the per-image loop is TorchScript's, not
    Python's. Beside a training loop that holds the GIL, a Python loop over the batch waits up to the
    interpreter's switch interval (5 ms) each time a C call hands the GIL back (measured on 2 cores: PIL
    18 ms an image, torch's eager calls 5.9 ms, this 0.54 ms).
    """
    with _CORE_LOCK:
        if not _SCRIPT:
            _SCRIPTING.append(True)
            try:
                with warnings.catch_warnings():  # torch.jit.script says it is deprecated; it is what runs GIL-free
                    warnings.simplefilter("ignore")
                    _SCRIPT.append(torch.jit.script(_finish_batch))
            except Exception:  # noqa: BLE001 - no TorchScript here: the PIL paths
                _SCRIPT.append(None)
        return _SCRIPT[0]


def _finish_each(crops, flips, crop: int, dst_all: np.ndarray, affine, done: Mapping[int, np.ndarray], resample: int) -> None:
    from PIL import Image

    resize, frombuffer = Image.Image.resize, Image.frombuffer
    for i in range(len(dst_all)):
        if i in done:
            chw = done[i].transpose(2, 0, 1)
        else:
            hwc = np.ascontiguousarray(crops[i])  # DALI's buffer, no copy
            src = frombuffer("RGB", (hwc.shape[1], hwc.shape[0]), hwc, "raw", "RGB", 0, 1)
            chw = np.asarray(resize(src, (crop, crop), resample)).transpose(2, 0, 1)
        if flips[i]:
            chw = chw[:, :, ::-1]  # a view: the flip happens in the write below
        _write(dst_all[i], chw, affine)


def _finish_chunked(crops, flips, crop: int, dst_all: np.ndarray, affine, done: Mapping[int, np.ndarray], resample: int) -> None:
    n = len(dst_all)
    canvas = _Canvas(crop, min(CHUNK, n), core_ops(), resample=resample)
    for s in range(0, n, CHUNK):
        k = min(CHUNK, n - s)
        for j in range(k):
            i = s + j
            canvas.put(j, done[i] if i in done else crops[i], flip=bool(flips[i]))
        _write(dst_all[s : s + k], canvas.cells[:k].transpose(0, 3, 1, 2), affine)


class _Canvas:
    """``rows`` cells of ``crop`` x ``crop`` RGB pixels in one NumPy array, each an image resized into it.

    The array is also a PIL image (``RGBX`` over the same memory, 4 bytes a pixel as PIL
    stores RGB), and :meth:`put` works through PIL's C image objects (``PIL.Image.core``,
    where ``Image.frombuffer``, ``resize`` and ``paste`` end): an HWC crop is unpacked
    into a PIL image, resized with the antialiased bilinear filter and pasted straight
    into its cell, with no ``tobytes`` copy out. ``ops`` is ``(Image.core.new,
    Image.core.raw_decoder)``; only used where :func:`core_ops` found those calls to give
    the public calls' pixels.
    """

    def __init__(self, crop: int, rows: int, ops: tuple[Callable[..., Any], Callable[..., Any]] | None, *, resample: int = 2) -> None:
        from PIL import Image

        self.resample = resample
        if ops is None:
            raise RuntimeError("PIL's C image calls are not usable here (see fastload.host.core_ops)")
        self.new, self.decoder = ops
        self.crop = crop
        self.pixels = np.empty((rows, crop, crop, 4), dtype=np.uint8)
        self.cells = self.pixels[..., :3]  # (rows, crop, crop, 3) view: RGB without the pad byte
        self.words = self.pixels.view(np.uint32)[..., 0]  # (rows, crop, crop): a pixel a word
        self.image = Image.frombuffer("RGBX", (crop, crop * rows), self.pixels, "raw", "RGBX", 0, 1).im

    def put(self, j: int, hwc: np.ndarray, *, flip: bool = False) -> None:
        """Resize HWC uint8 RGB ``hwc`` into cell ``j`` (mirrored left-right if ``flip``)."""
        c = self.crop
        hwc = np.ascontiguousarray(hwc)  # DALI's (contiguous) crops are not copied
        h, w = hwc.shape[:2]
        im = self.new("RGB", (w, h))
        d = self.decoder("RGB", "RGB", 0, 1)
        d.setimage(im)
        status = d.decode(hwc)
        if status[0] >= 0 or status[1] != 0:  # as Image.frombytes: too few bytes, or a decoder error
            raise ValueError(f"cannot read a {w}x{h} RGB crop")
        if (w, h) != (c, c):
            im = im.resize((c, c), self.resample, (0, 0, w, h))
        self.image.paste(im, (0, c * j, c, c * j + c))
        if flip:  # in place, in the cache (PIL's transpose costs ~8 us an image)
            cell = self.words[j]  # pixels as 32-bit words: 1.5 us a 56x56 cell, 12.7 as bytes
            cell[...] = cell[:, ::-1]


_BILINEAR = 2  # PIL.Image.Resampling.BILINEAR
#: PIL's resampling filter of each interpolation name (fastload.augment.settings.INTERPOLATIONS): what
#: torchvision's PIL path passes for InterpolationMode.NEAREST/BILINEAR/BICUBIC/LANCZOS.
PIL_FILTERS = {"nearest": 0, "bilinear": 2, "bicubic": 3, "lanczos": 1}
_CORE: list = []  # [ops or None] once checked
_CORE_LOCK = threading.Lock()
os.register_at_fork(after_in_child=_after_fork_in_child)


def core_ops() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    """``(new, raw_decoder)`` of ``PIL.Image.core`` if crops resized through them into a
    :class:`_Canvas` equal the public calls' (``Image.frombuffer(...).resize(...)``), pixel
    for pixel, flipped or not; None otherwise. Checked once per process."""
    with _CORE_LOCK:
        if not _CORE:
            _CORE.append(_checked_core_ops())
        return _CORE[0]


def _checked_core_ops() -> tuple[Callable[..., Any], Callable[..., Any]] | None:
    from PIL import Image

    try:
        ops = (Image.core.new, Image.core.raw_decoder)
        src = (np.arange(23 * 37 * 3, dtype=np.int64) * 7919 % 251).astype(np.uint8).reshape(23, 37, 3)
        canvas = _Canvas(16, 2, ops)
        canvas.put(0, src)
        canvas.put(1, src, flip=True)
        want = np.asarray(Image.fromarray(src).resize((16, 16), Image.BILINEAR))
        if np.array_equal(canvas.cells[0], want) and np.array_equal(canvas.cells[1], want[:, ::-1]):
            return ops
    except Exception:  # noqa: BLE001 - anything different in PIL's internals: the public calls
        pass
    return None


def _write(dst: np.ndarray, src: np.ndarray, affine) -> None:
    """``dst[...] = src``, normalised when ``affine`` is ``(scale, shift)``: ``src * scale - shift``."""
    if affine is None:
        dst[...] = src
    else:
        np.multiply(src, affine[0], out=dst)
        np.subtract(dst, affine[1], out=dst)


def _affine(mean: tuple[float, float, float], std: tuple[float, float, float] | None) -> tuple[np.ndarray, np.ndarray]:
    """float32 ``(1 / (255 std), mean / std)`` per channel: normalised = uint8 * scale - shift."""
    scale = np.array([1.0 / (255.0 * s) for s in std], dtype=np.float32)  # type: ignore[union-attr]
    shift = np.array([m / s for m, s in zip(mean, std)], dtype=np.float32)  # type: ignore[arg-type]
    return scale, shift


def eval_crop(image: np.ndarray, *, resize: int, crop: int, interpolation: str = "bilinear") -> np.ndarray:
    """torchvision's ``Resize(resize)`` + ``CenterCrop(crop)`` of an HWC uint8 RGB image (PIL's filter of ``interpolation``)."""
    from PIL import Image

    h, w = image.shape[:2]
    (nh, nw), (left, top) = (v.astype(int).tolist() for v in (a[0] for a in eval_params([w], [h], resize=resize, crop=crop)))
    src = Image.frombuffer("RGB", (w, h), np.ascontiguousarray(image), "raw", "RGB", 0, 1)
    out = np.asarray(src.resize((nw, nh), PIL_FILTERS[interpolation]))
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


def reduced_crop(payload: bytes, box, *, scale: int, crop: int, interpolation: str = "bilinear") -> np.ndarray:
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
        out = im.resize((crop, crop), PIL_FILTERS[interpolation], box=src)
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
        err = start_threads(self._threads)
        if err is not None:
            self.close(0.0)  # the threads that did start end
            raise cannot_start(f"the decode pool's {threads} threads", err)

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
                if t is not threading.current_thread() and t.ident is not None:  # started
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


__all__ = ["finish_crops", "SMALL_CROP_BYTES", "CHUNK", "core_ops", "eval_crop", "reduced_scales", "reduced_crop", "DecodePool", "REDUCED_SCALE_RATIO", "DCT_SCALES"]
