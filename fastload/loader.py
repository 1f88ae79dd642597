"""FastLoader: a drop-in for ``torch.utils.data.DataLoader`` over a packed dataset.

The loader owns epochs, ranks, streams and threads; it asks :mod:`fastload.sampler`
which samples to read, :mod:`fastload.augment` how to crop them, reads them through
:class:`fastload.Dataset`, and runs the DALI graph of :mod:`fastload.pipeline`.

One background thread per epoch drives DALI and turns its outputs into torch
tensors. On CUDA it copies on a side stream and records an event per batch; the
consumer's current stream waits on that event before the batch is handed over, and
the tensors are marked with ``record_stream`` so the allocator never reuses them early.
Any error in the background (a corrupt record, a failed decode) is raised from
``__next__`` with the sample index and its source path; it never hangs.
"""

from __future__ import annotations

import collections
import logging
import math
import os
import queue
import threading
from pathlib import Path
from typing import Any, Iterator, Sequence

import numpy as np
import torch

from .augment import train_params
from .errors import ConfigError, FastloadError, FormatError, LoaderError
from .pipeline import GraphSpec, build_pipeline, import_dali
from .reader import Dataset
from .sampler import Batch, EpochSampler

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

STATE_VERSION = 1
_END = object()


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


def _check_pair(name: str, value: Any, *, lo: float, hi: float | None = None) -> tuple[float, float]:
    try:
        a, b = (float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be a pair of numbers (min, max), got {value!r}") from None
    if not (lo <= a <= b) or (hi is not None and b > hi) or not (math.isfinite(a) and math.isfinite(b)):
        bound = f"{lo} <= min <= max" + (f" <= {hi}" if hi is not None else "")
        raise ConfigError(f"{name} must satisfy {bound}, got {value!r}")
    return a, b


def _check_triple(name: str, value: Any, *, positive: bool) -> tuple[float, float, float]:
    try:
        t = tuple(float(v) for v in value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name} must be 3 numbers (one per RGB channel) or None, got {value!r}") from None
    if len(t) != 3 or not all(math.isfinite(v) for v in t) or (positive and min(t) <= 0):
        need = "3 positive numbers" if positive else "3 numbers"
        raise ConfigError(f"{name} must be {need} (0..1 units, like torchvision) or None, got {value!r}")
    return t  # type: ignore[return-value]


def _resolve_device(device: Any) -> torch.device:
    if device is None:
        return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError):
        raise ConfigError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {device!r}") from None
    if dev.type == "cpu":
        return dev
    if dev.type != "cuda":
        raise ConfigError(f"device must be None, 'cpu', 'cuda' or 'cuda:N', got {device!r}")
    if not torch.cuda.is_available():
        raise ConfigError(f"device={device!r} but no CUDA device is available; use device='cpu' (DALI's CPU pipeline)")
    index = torch.cuda.current_device() if dev.index is None else dev.index
    if index >= torch.cuda.device_count():
        raise ConfigError(f"device={device!r} but only {torch.cuda.device_count()} CUDA device(s) exist")
    return torch.device("cuda", index)


def _dist_defaults(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is None and world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ConfigError(f"give both rank and world_size or neither, got rank={rank!r}, world_size={world_size!r}")
    if not isinstance(world_size, int) or isinstance(world_size, bool) or world_size < 1:
        raise ConfigError(f"world_size must be an int >= 1, got {world_size!r}")
    if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
        raise ConfigError(f"rank must be an int in [0, world_size={world_size}), got {rank!r}")
    return rank, world_size


class FastLoader:
    """Iterate ``(images, labels)`` batches of a packed dataset, decoded by DALI.

    Args:
        path: a directory written by :func:`fastload.pack` (or an open :class:`fastload.Dataset`).
        batch_size: samples per batch on this rank.
        shuffle: a seeded global permutation of all samples each epoch.
        drop_last: drop the last incomplete batch (and the tail that does not divide among ranks).
        train: random-resized crop + flip (True) or resize + center crop (False).
        crop: output side in pixels.
        scale, ratio: random-resized-crop area fraction and aspect ratio ranges (torchvision semantics).
        flip: probability of a horizontal flip when training.
        resize: shorter side before the evaluation center crop (default ``round(crop / 0.875)``).
        mean, std: per-channel normalisation in 0..1 units; both None gives uint8 images.
        dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16`` (ignored for uint8 output).
        channels_last: return images in channels-last memory format.
        device: ``"cuda"``/``"cuda:N"`` (GPU decoding), ``"cpu"`` (DALI's CPU pipeline), None (CUDA if present).
        num_threads: DALI CPU threads (default: this process's share of the cores).
        prefetch: batches in flight ahead of the consumer.
        seed: seeds the epoch order, crops and flips.
        rank, world_size: this process's share of each epoch (default: from torch.distributed).
        hw_decoder_load: share of JPEGs sent to the GPU's hardware decoder (DALI's default if None).
        check: verify each record's CRC-32 before decoding (reports altered bytes with the sample).
    """

    def __init__(
        self,
        path: str | os.PathLike | Dataset,
        batch_size: int,
        *,
        shuffle: bool = True,
        drop_last: bool = False,
        train: bool = True,
        crop: int = 224,
        scale: Sequence[float] = (0.08, 1.0),
        ratio: Sequence[float] = (3 / 4, 4 / 3),
        flip: float = 0.5,
        resize: int | None = None,
        mean: Sequence[float] | None = IMAGENET_MEAN,
        std: Sequence[float] | None = IMAGENET_STD,
        dtype: torch.dtype = torch.float32,
        channels_last: bool = False,
        device: str | torch.device | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
        seed: int = 0,
        rank: int | None = None,
        world_size: int | None = None,
        hw_decoder_load: float | None = None,
        check: bool = True,
    ) -> None:
        # ---- validate everything before touching the disk or DALI
        if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
            raise ConfigError(f"batch_size must be a positive int, got {batch_size!r}")
        if not isinstance(crop, int) or isinstance(crop, bool) or crop < 1:
            raise ConfigError(f"crop must be a positive int (pixels), got {crop!r}")
        if resize is None:
            resize = int(round(crop / 0.875))
        if not isinstance(resize, int) or isinstance(resize, bool) or resize < crop:
            raise ConfigError(f"resize must be an int >= crop ({crop}), got {resize!r}")
        scale_t = _check_pair("scale", scale, lo=0.0, hi=1.0)
        if scale_t[1] <= 0:
            raise ConfigError(f"scale must have max > 0, got {scale!r}")
        ratio_t = _check_pair("ratio", ratio, lo=1e-6)
        try:
            flip_f = float(flip)
        except (TypeError, ValueError):
            raise ConfigError(f"flip must be a probability in [0, 1], got {flip!r}") from None
        if not 0.0 <= flip_f <= 1.0:
            raise ConfigError(f"flip must be a probability in [0, 1], got {flip!r}")
        if (mean is None) != (std is None):
            raise ConfigError(f"give both mean and std, or neither for uint8 output; got mean={mean!r}, std={std!r}")
        mean_t = None if mean is None else _check_triple("mean", mean, positive=False)
        std_t = None if std is None else _check_triple("std", std, positive=True)
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ConfigError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
        if not isinstance(prefetch, int) or isinstance(prefetch, bool) or prefetch < 1:
            raise ConfigError(f"prefetch must be an int >= 1, got {prefetch!r}")
        if num_threads is not None and (not isinstance(num_threads, int) or isinstance(num_threads, bool) or num_threads < 1):
            raise ConfigError(f"num_threads must be a positive int or None, got {num_threads!r}")
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ConfigError(f"seed must be an int, got {seed!r}")
        if hw_decoder_load is not None:
            try:
                hw = float(hw_decoder_load)
            except (TypeError, ValueError):
                raise ConfigError(f"hw_decoder_load must be in [0, 1] or None, got {hw_decoder_load!r}") from None
            if not 0.0 <= hw <= 1.0:
                raise ConfigError(f"hw_decoder_load must be in [0, 1] or None, got {hw_decoder_load!r}")
            hw_decoder_load = hw
        self.device = _resolve_device(device)
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        import_dali()  # DependencyError with an install hint, before any work

        self.dataset = path if isinstance(path, Dataset) else Dataset(path, check=check)
        if len(self.dataset) == 0:
            raise ConfigError(f"path {str(self.dataset.path)!r} holds no samples")
        self.batch_size = batch_size
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.train = bool(train)
        self.crop, self.resize = crop, resize
        self.scale, self.ratio, self.flip = scale_t, ratio_t, flip_f
        self.mean, self.std = mean_t, std_t
        self.dtype = dtype if mean_t is not None else torch.uint8
        self.channels_last = bool(channels_last)
        self.prefetch = prefetch
        self.seed = seed
        self.hw_decoder_load = hw_decoder_load
        if num_threads is None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
            num_threads = max(1, _cores() // max(1, local))
        self.num_threads = num_threads
        self.sampler = EpochSampler(
            num_samples=len(self.dataset),
            batch_size=batch_size,
            shuffle=self.shuffle,
            drop_last=self.drop_last,
            seed=seed,
            rank=self.rank,
            world_size=self.world_size,
        )
        if len(self.sampler) == 0:
            raise ConfigError(
                f"batch_size={batch_size} with drop_last=True leaves no batch: this rank gets "
                f"{self.sampler.per_rank} of {len(self.dataset)} samples"
            )
        self._epoch = 0
        self._resume_batch = 0
        self._pipe = None
        self._run: _EpochRun | None = None
        self._closed = False
        self._stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        # CPU training batches are resized and normalised by torch (faster than DALI's CPU resize)
        self._host_finish = self.device.type == "cpu" and self.train
        self._labels = self.dataset.labels

    # ------------------------------------------------------------------ DataLoader surface
    @property
    def classes(self) -> list[str]:
        """Class names in label order."""
        return self.dataset.classes

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will read."""
        return self._epoch

    def __len__(self) -> int:
        """Batches this rank yields per epoch."""
        return len(self.sampler)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration reads (as ``DistributedSampler.set_epoch``)."""
        if not isinstance(epoch, int) or isinstance(epoch, bool) or epoch < 0:
            raise ConfigError(f"epoch must be an int >= 0, got {epoch!r}")
        self._epoch = epoch
        self._resume_batch = 0

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        if self._closed:
            raise LoaderError("this FastLoader is closed")
        self._stop_run()
        epoch, start = self._epoch, self._resume_batch
        self._epoch, self._resume_batch = epoch + 1, 0
        if self._pipe is None:
            self._pipe = self._build()
        run = _EpochRun(self, epoch, start)
        self._run = run
        run.start()
        return run

    def state_dict(self) -> dict[str, Any]:
        """Where the loader stands: resume with :meth:`load_state_dict` to read exactly the rest."""
        run = self._run
        if run is not None and not run.finished:
            epoch, done = run.epoch, run.yielded
        else:
            epoch, done = self._epoch, self._resume_batch
        return {
            "format": "fastload.FastLoader",
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches_done": done,
            "seed": self.seed,
            "num_samples": len(self.dataset),
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "rank": self.rank,
            "shuffle": self.shuffle,
            "drop_last": self.drop_last,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`: the next iteration yields exactly the remaining batches."""
        if not isinstance(state, dict) or state.get("format") != "fastload.FastLoader":
            raise ConfigError(f"state is not a FastLoader state_dict: {state!r:.80}")
        if state.get("version") != STATE_VERSION:
            raise ConfigError(f"state version {state.get('version')!r} is not supported (expected {STATE_VERSION})")
        for k in ("seed", "num_samples", "batch_size", "world_size", "shuffle", "drop_last"):
            mine = getattr(self, k, None) if k != "num_samples" else len(self.dataset)
            if state.get(k) != mine:
                raise ConfigError(f"state has {k}={state.get(k)!r} but this loader has {k}={mine!r}; resume needs the same")
        epoch, done = int(state["epoch"]), int(state["batches_done"])
        if epoch < 0 or not 0 <= done <= len(self):
            raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done}")
        self._stop_run()
        if done == len(self):
            epoch, done = epoch + 1, 0
        self._epoch, self._resume_batch = epoch, done

    def close(self) -> None:
        """Stop the background thread and free the DALI pipeline (and its GPU memory)."""
        if self._closed:
            return
        self._closed = True
        self._stop_run()
        self._pipe = None
        if self._stream is not None:
            torch.cuda.synchronize(self.device)
            self._stream = None

    def __enter__(self) -> "FastLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # pragma: no cover - best effort at interpreter shutdown
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        return (
            f"FastLoader({str(self.dataset.path)!r}, batch_size={self.batch_size}, device={str(self.device)!r}, "
            f"train={self.train}, batches={len(self)}, rank={self.rank}/{self.world_size})"
        )

    # ------------------------------------------------------------------ internals
    def _stop_run(self) -> None:
        run, self._run = self._run, None
        if run is not None:
            run.shutdown()

    def _build(self):
        gpu = self.device.type == "cuda"
        if self.mean is None:
            mean = std = None
            out = "uint8"
        else:
            mean = [m * 255.0 for m in self.mean]
            std = [s * 255.0 for s in self.std]  # type: ignore[union-attr]
            out = "float16" if self.dtype == torch.float16 else "float32"
        spec = GraphSpec(
            batch_size=self.batch_size,
            num_threads=self.num_threads,
            device_id=self.device.index if gpu else None,
            train=self.train,
            crop=self.crop,
            resize=self.resize,
            mean=mean,
            std=std,
            out_dtype=out,
            channels_last=self.channels_last,
            prefetch=self.prefetch,
            hw_decoder_load=self.hw_decoder_load,
            host_finish=self._host_finish,
        )
        try:
            return build_pipeline(spec, self._source)
        except FastloadError:
            raise
        except Exception as e:  # DALI's own errors
            raise LoaderError(f"could not build the DALI pipeline for {self.device}: {e}") from e

    def _source(self) -> tuple:
        """DALI's external_source callback: the next planned batch, read and parameterised."""
        run = self._run
        if run is None:
            raise StopIteration
        batch = run.next_plan()  # raises StopIteration at the end or when stopping
        enc: list[np.ndarray] = []
        widths = np.empty(len(batch.indices), dtype=np.int64)
        heights = np.empty(len(batch.indices), dtype=np.int64)
        ds = self.dataset
        for k, i in enumerate(batch.indices):
            try:
                header, payload = ds.record(int(i))
            except FormatError as e:
                # DALI asks for batches ahead of the consumer: remember the error with its batch,
                # feed a placeholder, and raise when this batch's turn comes (after the good ones).
                if batch.number not in run.errors:
                    msg, prefix = str(e), f"{ds.location(int(i))}: "
                    reason = msg[len(prefix) :] if msg.startswith(prefix) else msg
                    run.errors[batch.number] = LoaderError(f"{ds.where(int(i))}: {reason}")
                enc.append(_placeholder_jpeg())
                widths[k], heights[k] = _PLACEHOLDER_SIDE, _PLACEHOLDER_SIDE
                continue
            enc.append(np.frombuffer(payload, dtype=np.uint8))
            widths[k], heights[k] = header.width, header.height
        if not self.train:
            return (enc,)
        boxes, flips = train_params(
            widths,
            heights,
            seed=self.seed,
            epoch=run.epoch,
            positions=batch.positions,
            scale=self.scale,
            ratio=self.ratio,
            flip=self.flip,
        )
        if self._host_finish:
            run.flips.append(flips)
            return (enc, list(boxes[:, :2]), list(boxes[:, 2:]))
        return (enc, list(boxes[:, :2]), list(boxes[:, 2:]), list(flips))

    def _locate_decode_error(self, indices: Sequence[int], err: BaseException) -> LoaderError:
        """Find which sample of a failed batch does not decode, to name it in the error.

        DALI reports a failed batch, not the sample: decode the candidates one at a time
        with DALI's CPU decoder (the error path only) and name the first that fails.
        """
        lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
        detail = next((ln for ln in lines if "failure" in ln or "rror" in ln and "Critical" not in ln), None)
        detail = (detail or (lines[-1] if lines else type(err).__name__))[:200]
        bad = _first_undecodable(self.dataset, indices)
        if bad is not None:
            i, why = bad
            return LoaderError(f"{self.dataset.where(i)} failed to decode: {why}")
        lo, hi = (int(min(indices)), int(max(indices))) if len(indices) else (-1, -1)
        return LoaderError(f"DALI failed on a batch holding samples {lo}..{hi} of {self.dataset.path}: {detail}")


def _first_undecodable(ds: Dataset, indices: Sequence[int]) -> tuple[int, str] | None:
    """The first of ``indices`` that DALI's CPU decoder rejects, with the reason; None if all decode."""
    dali, fn, types = import_dali()
    payloads: list[np.ndarray] = []

    @dali.pipeline_def(batch_size=1, num_threads=1, device_id=None, exec_dynamic=False, exec_pipelined=False, exec_async=False)
    def probe():
        return fn.decoders.image(fn.external_source(source=lambda: [payloads[-1]], batch=True), device="cpu")

    pipe = probe()
    pipe.build()
    for i in indices:
        try:
            payload, _ = ds[int(i)]
        except FormatError as e:
            return int(i), str(e)
        payloads.append(np.frombuffer(payload, dtype=np.uint8))
        try:
            pipe.run()
        except Exception as e:  # noqa: BLE001 - the reason is reported to the user
            lines = [ln.strip() for ln in str(e).splitlines() if "failure" in ln or "Error" in ln]
            return int(i), (lines[-1] if lines else "DALI could not decode it")[:200]
    return None


_PLACEHOLDER_SIDE = 16
_PLACEHOLDER: list[np.ndarray] = []


def _placeholder_jpeg() -> np.ndarray:
    """A small valid JPEG that stands in for an unreadable record until its error is raised."""
    if not _PLACEHOLDER:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (_PLACEHOLDER_SIDE, _PLACEHOLDER_SIDE), (128, 128, 128)).save(buf, "JPEG")
        _PLACEHOLDER.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    return _PLACEHOLDER[0]


def _host_finish(
    crops,
    flips: np.ndarray,
    *,
    crop: int,
    mean: tuple[float, float, float] | None,
    std: tuple[float, float, float] | None,
    dtype: torch.dtype,
    channels_last: bool,
) -> torch.Tensor:
    """Resize DALI's decoded CPU crops to ``crop``x``crop``, flip, normalise: one batch tensor.

    pillow-simd's SIMD bilinear resize (antialiased, the filter torchvision's PIL path
    uses) and NumPy: both single-threaded and GIL-free, so this thread never competes
    with DALI's workers through a second thread pool. DALI's buffers are read in place.
    """
    from PIL import Image

    n = len(crops)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    out_dtype = torch.uint8 if mean is None else torch.float32
    images = torch.empty((n, 3, crop, crop), dtype=out_dtype, memory_format=fmt)
    dst_all = images.numpy()  # (n, 3, crop, crop) view, strided when channels_last
    if mean is not None:
        scale = np.array([1.0 / (255.0 * s) for s in std], dtype=np.float32).reshape(3, 1, 1)  # type: ignore[union-attr]
        shift = np.array([m / s for m, s in zip(mean, std)], dtype=np.float32).reshape(3, 1, 1)  # type: ignore[arg-type]
    for i in range(n):
        hwc = np.ascontiguousarray(crops[i])  # DALI's buffer, no copy
        src = Image.frombuffer("RGB", (hwc.shape[1], hwc.shape[0]), hwc, "raw", "RGB", 0, 1)
        chw = np.asarray(src.resize((crop, crop), Image.BILINEAR)).transpose(2, 0, 1)
        if flips[i]:
            chw = chw[:, :, ::-1]  # a view: the flip happens in the write below
        dst = dst_all[i]
        if mean is None:
            dst[...] = chw
        else:  # normalise while the image is still in cache
            np.multiply(chw, scale, out=dst)
            np.subtract(dst, shift, out=dst)
    return images if dtype in (torch.float32, torch.uint8) else images.to(dtype)


class _EpochRun:
    """One epoch's iterator: a producer thread that drives DALI, and a bounded queue."""

    def __init__(self, loader: FastLoader, epoch: int, start: int) -> None:
        self.loader = loader
        self.epoch = epoch
        self.yielded = start
        self.finished = False
        self._plan = loader.sampler.batches(epoch, start)
        self._inflight: collections.deque[Batch] = collections.deque()
        self.flips: collections.deque[np.ndarray] = collections.deque()  # host_finish only
        self.errors: dict[int, LoaderError] = {}  # batch number -> the error to raise at its turn
        self._queue: queue.Queue = queue.Queue(maxsize=loader.prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=f"fastload-epoch{epoch}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ---- called by DALI (producer thread)
    def next_plan(self) -> Batch:
        if self._stop.is_set():
            raise StopIteration
        batch = next(self._plan)  # StopIteration at the end of the epoch
        self._inflight.append(batch)
        return batch

    # ---- producer thread
    def _produce(self) -> None:
        loader = self.loader
        pipe = loader._pipe
        stream = loader._stream
        try:
            if stream is not None:
                torch.cuda.set_device(loader.device)

            while True:
                try:
                    outs = pipe.run(stream) if stream is not None else pipe.run()
                except StopIteration:
                    pipe.reset()
                    break
                batch = self._inflight.popleft()
                if self._stop.is_set():
                    continue  # drain what DALI already scheduled
                if batch.number in self.errors:
                    raise self.errors.pop(batch.number)
                item = self._convert(outs[0], batch)
                if not self._put(item):
                    continue
            if not self._stop.is_set():
                self._put(_END)
        except BaseException as e:  # noqa: BLE001 - every failure must reach the consumer
            loader._pipe = None  # a failed DALI pipeline is not reusable: rebuild next epoch
            if isinstance(e, LoaderError):
                err: BaseException = e
            elif isinstance(e, FastloadError):
                err = LoaderError(str(e))
            else:
                pending = [int(i) for b in self._inflight for i in b.indices]
                err = loader._locate_decode_error(pending, e)
                err.__cause__ = e
            self._put(_Failure(err))

    def _convert(self, tl, batch: Batch):
        loader = self.loader
        labels_np = loader._labels[batch.indices]
        if loader._host_finish:
            images = _host_finish(
                tl, self.flips.popleft(), crop=loader.crop, mean=loader.mean, std=loader.std,
                dtype=loader.dtype, channels_last=loader.channels_last,
            )
            return images, torch.from_numpy(labels_np), None
        dali_tensor = tl.as_tensor()
        shape = dali_tensor.shape()
        torch_dtype = torch.uint8 if loader.dtype == torch.uint8 else (
            torch.float16 if loader.dtype == torch.float16 else torch.float32
        )
        from nvidia.dali.plugin.pytorch import feed_ndarray

        if loader._stream is None:
            images = torch.empty(shape, dtype=torch_dtype)
            feed_ndarray(dali_tensor, images)
            if loader.dtype == torch.bfloat16:
                images = images.to(torch.bfloat16)
            labels = torch.from_numpy(labels_np)
            event = None
        else:
            stream = loader._stream
            with torch.cuda.stream(stream):
                images = torch.empty(shape, dtype=torch_dtype, device=loader.device)
                feed_ndarray(dali_tensor, images, cuda_stream=stream)
                if loader.dtype == torch.bfloat16:
                    images = images.to(torch.bfloat16)
                labels = torch.from_numpy(labels_np).pin_memory().to(loader.device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
        if loader.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC storage == channels_last NCHW view
        return images, labels, event

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    # ---- consumer
    def __iter__(self) -> "_EpochRun":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.finished:
            raise StopIteration
        while True:
            try:
                item = self._queue.get(timeout=0.5)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self.finished = True
                    raise LoaderError("the FastLoader background thread stopped without a result") from None
        if item is _END:
            self.finished = True
            self._thread.join()
            raise StopIteration
        if isinstance(item, _Failure):
            self.finished = True
            self._thread.join()
            raise item.exc
        images, labels, event = item
        if event is not None:
            current = torch.cuda.current_stream(self.loader.device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
        self.yielded += 1
        return images, labels

    def __len__(self) -> int:
        return len(self.loader) - self.yielded

    def shutdown(self) -> None:
        """Stop producing, drain DALI's scheduled batches, and join the thread."""
        self._stop.set()
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        self.finished = True
