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

Lifetime: the thread and DALI's callback hold only a :class:`_Core` (the dataset, the
settings, the pipeline), never the :class:`FastLoader`, so a loader nobody references
is collected; ``weakref.finalize`` then stops its thread and frees its pipeline, and
does the same at interpreter exit for loaders still alive, so a script that breaks out
of a loop exits cleanly. An iterator that is dropped stops its thread the same way.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import logging
import math
import operator
import os
import queue
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from .augment import eval_params, train_params
from .dlcompat import DetachedEpoch, LoaderBatchSampler, RankSampler, SamplerPlan, check_collate_fn, note_ignored, user_batch_sampler
from .host import finish_crops
from .errors import ConfigError, FastloadError, FormatError, LoaderError, as_int
from .pipeline import GraphSpec, build_pipeline, cpu_samples, decoder_sizing, encoded_batch, import_dali
from .reader import Dataset, ReadAhead
from .sampler import ORDERS, Batch, EpochSampler, block_size_for, check_intervals, interval_mask
from .views import LoaderDataset

log = logging.getLogger(__name__)

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

STATE_VERSION = 2  # 2: the state describes the epoch (consumed positions), not one rank
_END = object()

# Every live loader's core, closed by an exit hook registered right after DALI is imported:
# atexit runs hooks last-in first-out, so ours runs before DALI's own shutdown of its
# pipelines, while no fastload thread may still be running one.
def _weakly(method: Callable[..., Any], otherwise: Callable[..., Any]) -> Callable[..., Any]:
    """``method`` (bound) called through a weak reference to its object; ``otherwise`` once that is gone.

    What a loader hands its own sampler: a strong bound method would make a cycle, and a loader
    in a cycle is freed (its thread and pipeline with it) only when the cyclic collector runs.
    """
    ref = weakref.WeakMethod(method)

    def call(*args: Any) -> Any:
        m = ref()
        return otherwise(*args) if m is None else m(*args)

    return call


_LIVE_CORES: "weakref.WeakSet[_Core]" = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []


def _close_live_cores() -> None:
    for core in list(_LIVE_CORES):
        with contextlib.suppress(Exception):
            core.close()


def _register_exit_hook() -> None:
    if not _EXIT_HOOK:
        atexit.register(_close_live_cores)
        _EXIT_HOOK.append(True)


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


#: The largest ``crop``/``resize`` side accepted: far above any training resolution, and
#: small enough that one image of a batch stays a bounded allocation (3 x 8192^2 x 4 B = 805 MB).
MAX_SIDE = 8192
#: The most DALI CPU threads one loader may ask for.
MAX_THREADS = 256


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


def _dist_defaults(rank: Any, world_size: Any) -> tuple[int, int]:
    if rank is None and world_size is None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return dist.get_rank(), dist.get_world_size()
        return 0, 1
    if rank is None or world_size is None:
        raise ConfigError(f"give both rank and world_size or neither, got rank={rank!r}, world_size={world_size!r}")
    ws = as_int("world_size", world_size, lo=1)
    try:
        r = as_int("rank", rank, lo=0, hi=ws - 1)
    except ConfigError:
        raise ConfigError(f"rank must be an int in [0, world_size={ws}), got {rank!r}") from None
    return r, ws


_UNSET: Any = object()  # "not given" for arguments whose None means something (mean, std)
#: FastLoader's own settings when neither the call nor a torchvision transform gives them.
_DEFAULTS: dict[str, Any] = {
    "train": True, "crop": 224, "scale": (0.08, 1.0), "ratio": (3 / 4, 4 / 3), "flip": 0.5, "resize": None,
    "mean": IMAGENET_MEAN, "std": IMAGENET_STD, "dtype": torch.float32,
}  # fmt: skip


class _Source:
    """Where a loader's images come from: a packed path, a Dataset, a loader's view, a torchvision dataset."""

    def __init__(self, kind: str, obj: Any, settings: dict[str, Any] | None = None, transform: Any = None, target_transform: Any = None) -> None:
        self.kind, self.obj = kind, obj
        self.settings = settings or {}
        self.transform, self.target_transform = transform, target_transform

    def open(self, *, check: bool, cache_dir: Any, progress: bool) -> Dataset:
        if self.kind == "dataset":
            return self.obj
        if self.kind == "view":
            return self.obj.packed
        if self.kind == "torchvision":
            from .cache import cached_pack

            return Dataset(cached_pack(self.obj, cache_dir=cache_dir, progress=progress), check=check)
        return Dataset(self.obj, check=check)


def _is_image_folder(obj: Any) -> bool:
    try:
        from torchvision.datasets import DatasetFolder
    except ImportError:  # pragma: no cover - torchvision is optional
        return False
    return isinstance(obj, DatasetFolder)


def _resolve_source(dataset: Any) -> _Source:
    if isinstance(dataset, (str, os.PathLike)):
        return _Source("path", dataset)
    if isinstance(dataset, Dataset):
        return _Source("dataset", dataset)
    if isinstance(dataset, LoaderDataset):
        return _Source("view", dataset, dict(dataset.settings), dataset.transform, dataset.target_transform)
    if _is_image_folder(dataset):
        from .transforms import translate

        settings = {} if dataset.transform is None else translate(dataset.transform)  # None: FastLoader's defaults
        return _Source("torchvision", dataset, settings, dataset.transform, dataset.target_transform)
    raise ConfigError(
        f"dataset must be a packed dataset directory, a fastload.Dataset or a torchvision ImageFolder/DatasetFolder "
        f"of image files, got {type(dataset).__name__}; pack other datasets once with "
        "fastload.pack_dataset(dataset, OUT) and pass OUT"
    )


def _transformed_labels(labels: np.ndarray, target_transform: Any) -> np.ndarray:
    """``target_transform`` applied to every label (once, at construction); the results must be ints."""
    table = {}
    for c in np.unique(labels).tolist():
        v = target_transform(c)
        try:
            table[c] = operator.index(v.item() if isinstance(v, (torch.Tensor, np.ndarray)) else v)
        except (TypeError, ValueError):
            raise ConfigError(f"target_transform({c}) returned {v!r}; FastLoader needs integer labels") from None
    out = np.vectorize(table.__getitem__, otypes=[np.int64])(labels) if len(labels) else labels.copy()
    out.setflags(write=False)
    return out


class FastLoader:
    """Iterate ``(images, labels)`` batches of a packed dataset, decoded by DALI: a ``DataLoader`` drop-in.

    The positional arguments and the DataLoader keywords are ``torch.utils.data.DataLoader``'s,
    so ``DataLoader(`` can become ``FastLoader(`` in a training script; ``docs/dropin.md``
    says what each one does here. The keywords after them are FastLoader's own.

    Args:
        dataset: a directory written by :func:`fastload.pack`, a :class:`fastload.Dataset`,
            another loader's ``.dataset``, or a torchvision ``ImageFolder``/``DatasetFolder`` of
            image files: packed once into a cache (``cache_dir``), its ``transform`` translated
            into the settings below (:mod:`fastload.transforms`), its ``target_transform``
            applied to the labels.
        batch_size: samples per batch on this rank.
        shuffle: a seeded global permutation of all samples each epoch. Default: as ``train``
            for a packed dataset; False (DataLoader's default) with a torchvision dataset, a
            ``sampler`` or a ``batch_sampler``.
        sampler: any ``Sampler`` or sequence of indices (a ``DistributedSampler`` the script
            calls ``set_epoch`` on, a ``WeightedRandomSampler``...): iterated each epoch, and
            exactly those indices are read, in that order (it does the sharding, not FastLoader).
        batch_sampler: yields lists of indices, one per batch (excludes batch_size, shuffle,
            sampler and drop_last, as in DataLoader).
        num_workers, pin_memory, timeout, worker_init_fn, multiprocessing_context,
            prefetch_factor, persistent_workers, pin_memory_device, in_order: accepted and
            shown as attributes; they do not apply (no worker processes).
        collate_fn: None or ``default_collate``; any other is a :class:`ConfigError`.
        drop_last: drop the last incomplete batch and the tail that does not divide among
            ranks: ``DistributedSampler(drop_last=...)`` + ``DataLoader(drop_last=...)``.
        generator: seeds the order (its ``initial_seed()``) when ``seed`` is not given.
        train: random-resized crop + flip (True) or resize + center crop (False).
        crop: output side in pixels.
        scale, ratio: random-resized-crop area fraction and aspect ratio ranges (torchvision semantics).
        flip: probability of a horizontal flip when training.
        resize: shorter side before the evaluation center crop (default ``round(crop / 0.875)``).
        mean, std: per-channel normalisation in 0..1 units; both None gives uint8 images.
        dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16`` (ignored for uint8 output).
        channels_last: return images in channels-last memory format.
        device: ``"cuda"``/``"cuda:N"`` (GPU decoding), ``"cpu"`` (DALI's CPU pipeline), None (CUDA if present).
        num_threads: DALI CPU threads (default: this process's share of the cores; a GPU
            pipeline uses at most :data:`fastload.pipeline.GPU_THREADS`, 4: see docs/gpu.md).
        prefetch: batches in flight ahead of the consumer.
        seed: seeds the epoch order, crops and flips (default 0, or the generator's seed).
        rank, world_size: this process's share of each epoch (default: from torch.distributed).
        pad: without ``drop_last``, pad ranks to equal shares like ``DistributedSampler``
            (default); False gives every sample to exactly one rank (exact evaluation; ranks
            may then differ by one batch).
        order: with ``shuffle``, ``"global"`` (a permutation of all samples each epoch) or
            ``"block"``: the block-shuffled order of :func:`fastload.sampler.block_order`, for
            datasets larger than memory (``docs/loader.md``, "Order").
        block_size: with ``order="block"``, samples per run (default: runs of about 8 MiB of
            records, :func:`fastload.sampler.block_size_for`).
        window: with ``order="block"``, runs shuffled together (default 16).
        hw_decoder_load: share of JPEGs sent to the GPU's hardware decoder (DALI's default if None).
        check: verify each record's payload checksum before decoding (XXH3, about 2 us per
            100 KB; CRC-32 in format-1 datasets), reporting altered bytes with the sample.
        target_transform: applied to every label once (a torchvision dataset's own is used by default).
        cache_dir: where a torchvision dataset is packed (default ``$FASTLOAD_CACHE`` or
            ``~/.cache/fastload``).
        progress: show a progress bar while a torchvision dataset is packed.
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Any = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        train: bool | None = None,
        crop: int | None = None,
        scale: Sequence[float] | None = None,
        ratio: Sequence[float] | None = None,
        flip: float | None = None,
        resize: int | None = None,
        mean: Sequence[float] | None | Any = _UNSET,
        std: Sequence[float] | None | Any = _UNSET,
        dtype: torch.dtype | None = None,
        channels_last: bool = False,
        device: str | torch.device | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        pad: bool = True,
        order: str = "global",
        block_size: int | None = None,
        window: int | None = None,
        hw_decoder_load: float | None = None,
        check: bool = True,
        target_transform: Any = None,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
    ) -> None:
        # ---- the DataLoader arguments that do not apply: kept as attributes, like a DataLoader's
        ignored = {
            "num_workers": num_workers, "pin_memory": pin_memory, "timeout": timeout,
            "worker_init_fn": worker_init_fn, "multiprocessing_context": multiprocessing_context,
            "prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers,
            "pin_memory_device": pin_memory_device, "in_order": in_order,
        }  # fmt: skip
        self.num_workers = as_int("num_workers", num_workers, lo=0)
        self.pin_memory, self.timeout, self.worker_init_fn = pin_memory, timeout, worker_init_fn
        self.multiprocessing_context, self.prefetch_factor = multiprocessing_context, prefetch_factor
        self.persistent_workers, self.pin_memory_device, self.in_order = persistent_workers, pin_memory_device, in_order
        note_ignored(ignored)
        self.collate_fn = check_collate_fn(collate_fn)
        self.generator = generator
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ConfigError(f"generator must be a torch.Generator or None, got {generator!r}")

        # ---- where the images come from, and the settings that come with them
        source = _resolve_source(dataset)
        given = {
            "train": train, "crop": crop, "scale": scale, "ratio": ratio, "flip": flip, "resize": resize,
            "dtype": dtype, **({} if mean is _UNSET else {"mean": mean}), **({} if std is _UNSET else {"std": std}),
        }  # fmt: skip
        settings = {**_DEFAULTS, **source.settings, **{k: v for k, v in given.items() if v is not None or k in ("mean", "std")}}
        if shuffle is None:  # DataLoader's default (False) wherever a DataLoader call is being replaced
            user_order = sampler is not None or batch_sampler is not None or source.kind == "torchvision"
            shuffle = False if user_order else bool(settings["train"])
        if seed is None:
            seed = generator.initial_seed() if generator is not None else 0

        # ---- validate everything before touching the disk or DALI
        if batch_sampler is None:
            if batch_size is None:
                raise ConfigError("batch_size=None (no batching) is not supported: FastLoader yields batches; give batch_size")
            batch_size = as_int("batch_size", batch_size, lo=1, hint=" (samples per batch)")
        crop = as_int("crop", settings["crop"], lo=1, hi=MAX_SIDE, hint=" (pixels)")
        resize = settings["resize"]
        if resize is None:
            resize = int(round(crop / 0.875))
        resize = as_int("resize", resize, lo=crop, hi=2 * MAX_SIDE, hint=f" (>= crop {crop})")
        scale = settings["scale"]
        scale_t = _check_pair("scale", scale, lo=0.0, hi=1.0)
        if scale_t[1] <= 0:
            raise ConfigError(f"scale must have max > 0, got {scale!r}")
        ratio_t = _check_pair("ratio", settings["ratio"], lo=1e-6)
        flip = settings["flip"]
        try:
            flip_f = float(flip)
        except (TypeError, ValueError):
            raise ConfigError(f"flip must be a probability in [0, 1], got {flip!r}") from None
        if not 0.0 <= flip_f <= 1.0:
            raise ConfigError(f"flip must be a probability in [0, 1], got {flip!r}")
        mean, std = settings["mean"], settings["std"]
        if (mean is None) != (std is None):
            raise ConfigError(f"give both mean and std, or neither for uint8 output; got mean={mean!r}, std={std!r}")
        mean_t = None if mean is None else _check_triple("mean", mean, positive=False)
        std_t = None if std is None else _check_triple("std", std, positive=True)
        dtype = settings["dtype"]
        if dtype not in (torch.float32, torch.float16, torch.bfloat16):
            raise ConfigError(f"dtype must be torch.float32, torch.float16 or torch.bfloat16, got {dtype!r}")
        prefetch = as_int("prefetch", prefetch, lo=1, hi=64, hint=" (batches in flight)")
        if num_threads is not None:
            num_threads = as_int("num_threads", num_threads, lo=1, hi=MAX_THREADS, hint=" or None")
        seed = as_int("seed", seed)
        if hw_decoder_load is not None:
            try:
                hw = float(hw_decoder_load)
            except (TypeError, ValueError):
                raise ConfigError(f"hw_decoder_load must be in [0, 1] or None, got {hw_decoder_load!r}") from None
            if not 0.0 <= hw <= 1.0:
                raise ConfigError(f"hw_decoder_load must be in [0, 1] or None, got {hw_decoder_load!r}")
            hw_decoder_load = hw
        user_batches = user_batch_sampler(
            sampler=sampler, batch_sampler=batch_sampler, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last
        )
        if not isinstance(order, str) or order not in ORDERS:
            raise ConfigError(f"order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}")
        if order != "block" and (block_size is not None or window is not None):
            raise ConfigError(f"block_size and window apply only with order='block', got order={order!r}")
        if order != "global" and user_batches is not None:
            raise ConfigError(f"order={order!r} is FastLoader's own order: it excludes sampler and batch_sampler")
        if block_size is not None:
            block_size = as_int("block_size", block_size, lo=1, hint=" (samples per run) or None")
        if order == "block":
            window = 16 if window is None else as_int("window", window, lo=1, hint=" (runs shuffled together) or None")
        self.device = _resolve_device(device)
        self.rank, self.world_size = _dist_defaults(rank, world_size)
        import_dali()  # DependencyError with an install hint, before any work
        _register_exit_hook()  # after DALI's own (see _LIVE_CORES)

        packed = source.open(check=check, cache_dir=cache_dir, progress=progress)
        self.packed = packed
        if len(packed) == 0:
            raise ConfigError(f"dataset {str(packed.path)!r} holds no samples")
        if self.world_size > len(packed) and user_batches is None:
            raise ConfigError(
                f"world_size={self.world_size} is larger than the dataset ({len(packed)} samples in "
                f"{str(packed.path)!r}): every rank needs at least one sample of its own"
            )
        if order == "block" and block_size is None:  # runs of about 8 MiB of records
            block_size = block_size_for(sum(sh.bytes for sh in packed.manifest.shards) / len(packed))
        self.order, self.block_size, self.window = order, block_size, window
        labels = packed.labels
        if target_transform is None:
            target_transform = source.target_transform
        if target_transform is not None:
            labels = _transformed_labels(labels, target_transform)
        self.batch_size = batch_size if batch_sampler is None else None
        self.shuffle = bool(shuffle)
        self.drop_last = bool(drop_last)
        self.pad = bool(pad)
        self.train = bool(settings["train"])
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
        # The epoch lives in a box that the loader's sampler and dataset view read without holding
        # the loader: no reference cycle, so a dropped loader is freed (and its threads end) at once.
        self._epoch_box = DetachedEpoch(0)
        self._resume_batch = 0
        self._user_batches = user_batches
        self._user_sampler = sampler if batch_sampler is None else getattr(batch_sampler, "sampler", None)
        # No rank given and no process group yet (Lightning's launchers, ddp_spawn's unpickling,
        # accelerate before Accelerator()): take the group's rank when it exists (_bind_ranks).
        dist = torch.distributed
        self._auto_ranks = rank is None and world_size is None and not (dist.is_available() and dist.is_initialized())
        self.sampler: Any = None
        self._make_plan()
        self._labels = labels
        self._init = {
            "dataset": str(packed.path), "batch_size": batch_size, "shuffle": shuffle, "sampler": sampler,
            "batch_sampler": batch_sampler, "drop_last": drop_last, "generator": generator, **ignored,
            "train": self.train, "crop": crop, "scale": scale_t, "ratio": ratio_t, "flip": flip_f, "resize": resize,
            "mean": mean_t, "std": std_t, "dtype": dtype, "channels_last": self.channels_last,
            "device": None if device is None else str(self.device), "num_threads": num_threads, "prefetch": prefetch,
            "seed": seed, "rank": rank, "world_size": world_size, "pad": pad, "order": order, "block_size": block_size,
            "window": window, "hw_decoder_load": hw_decoder_load,
            "check": check, "target_transform": target_transform,
        }  # fmt: skip
        self.dataset = LoaderDataset(
            packed, labels=labels, epoch=self._epoch_box.get, transform=source.transform, target_transform=target_transform,
            origin=source.obj if source.kind == "torchvision" else None,
            settings={"train": self.train, "crop": crop, "resize": resize, "scale": scale_t, "ratio": ratio_t,
                      "flip": flip_f, "mean": mean_t, "std": std_t, "seed": seed},
        )  # fmt: skip
        self._closed = False
        self._iter_lock = threading.Lock()
        self._core = _Core(self)
        if self.order == "block" and self.shuffle:  # ReadAhead reads each run once, sequentially
            self._core.read_ahead.runs = self.block_size
        # Stops the thread and frees the pipeline when the loader is collected, or at exit.
        self._finalizer = weakref.finalize(self, self._core.close)

    def _make_plan(self) -> None:
        """The epoch plan, samplers and batch bound for this rank and world size."""
        packed, batch_size, user_batches = self.packed, self.batch_size, self._user_batches
        if user_batches is None:
            plan: EpochSampler | SamplerPlan = EpochSampler(
                num_samples=len(packed), batch_size=batch_size, shuffle=self.shuffle, drop_last=self.drop_last,
                seed=self.seed, rank=self.rank, world_size=self.world_size, pad=self.pad, order=self.order,
                **({"block_size": self.block_size, "window": self.window} if self.order == "block" else {}),
            )  # fmt: skip
            old = getattr(self, "_plan", None)
            if old is not None and old.resumed is not None:  # a resumed epoch stays resumed on the new ranks
                plan.resume(*old.resumed)
            if len(plan) == 0:
                raise ConfigError(
                    f"batch_size={batch_size} with drop_last=True leaves no batch: this rank gets "
                    f"{plan.per_rank} of {len(packed)} samples"
                )
            if self.sampler is None:
                self.sampler = RankSampler(
                    plan, self._epoch_box.get, _weakly(self.set_epoch, self._epoch_box.set), bind=_weakly(self._bind_ranks, lambda: None)
                )
                self.batch_sampler: Any = LoaderBatchSampler(self.sampler, batch_size, self.drop_last)
            else:
                self.sampler.rebind(plan)  # the same objects: clients may hold them
            self._max_batch = max(1, min(batch_size, plan.per_rank))  # type: ignore[type-var]
        else:
            plan = SamplerPlan(user_batches, num_samples=len(packed), rank=self.rank, world_size=self.world_size)
            self.sampler = self._user_sampler
            self.batch_sampler = user_batches
            self._max_batch = plan.max_batch
        self._plan = plan

    @property
    def _epoch(self) -> int:
        return self._epoch_box.epoch

    @_epoch.setter
    def _epoch(self, epoch: int) -> None:
        self._epoch_box.epoch = epoch

    def _bind_ranks(self) -> None:
        """Take this process's rank from the process group, once it exists, if none was given."""
        if not self._auto_ranks:
            return
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        self._auto_ranks = False
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if (rank, world_size) == (self.rank, self.world_size):
            return
        if world_size > len(self.packed) and self._user_batches is None:
            raise ConfigError(
                f"world_size={world_size} is larger than the dataset ({len(self.packed)} samples in "
                f"{str(self.packed.path)!r}): every rank needs at least one sample of its own"
            )
        with self._iter_lock:
            self._core.stop()
            if self._resume_batch and isinstance(self._plan, EpochSampler):
                # a position restored on the old ranks becomes what it consumed, shared on the new ones
                self._plan.resume(self._epoch, self._plan.consumed_after(self._epoch, self._resume_batch))
                self._resume_batch = -1
            self.rank, self.world_size = rank, world_size
            self._make_plan()
            if self._resume_batch == -1:
                self._resume_batch = self._plan.first_batch(self._epoch)
            self._core.plan, self._core.max_batch, self._core.pipe = self._plan, self._max_batch, None
        log.debug("FastLoader: rank %d of %d from the process group", rank, world_size)

    # ------------------------------------------------------------------ DataLoader surface
    @property
    def classes(self) -> list[str]:
        """Class names in label order."""
        return self.dataset.classes

    @property
    def epoch(self) -> int:
        """The epoch the next iteration will read (it moves on when an epoch is read to its end)."""
        return self._epoch

    def __len__(self) -> int:
        """Batches this rank yields per epoch (an epoch resumed mid-way yields its last ones)."""
        self._bind_ranks()
        return len(self._plan)

    def set_epoch(self, epoch: int) -> None:
        """Choose the epoch the next iteration reads (as ``DistributedSampler.set_epoch``)."""
        epoch = as_int("epoch", epoch, lo=0)
        if epoch != self._epoch:  # the same epoch (DistributedSampler: a no-op) keeps a restored position
            resumed = self._plan.resumed
            if resumed is not None and resumed[0] == self._epoch:  # finishing it clears it
                log.warning(
                    "FastLoader: epoch %d, resumed from a checkpoint, is left before its end for epoch %d: "
                    "the rest of its samples are not read. A training loop that counts the epoch's steps "
                    "itself (Lightning) does this when world_size x batch_size grew since the checkpoint; "
                    "keep it the same or smaller (docs/loader.md, Resuming).",
                    self._epoch, epoch,
                )  # fmt: skip
            self._resume_batch = 0
            self._plan.resumed = None
        self._epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """A new epoch's iterator; it replaces the previous one, whose ``next()`` then raises.

        One loader drives one DALI pipeline, so one iterator is live at a time: starting
        another (from any thread) ends the previous one, and its next ``next()`` raises
        :class:`LoaderError` saying so instead of ending its epoch early in silence.
        """
        self._bind_ranks()
        with self._iter_lock:
            if self._closed:
                raise LoaderError("this FastLoader is closed")
            run = self._core.start(self._epoch, self._resume_batch)
            return _EpochIterator(self, run)

    def _epoch_finished(self, run: "_EpochRun") -> None:
        """An iterator reached the end of its epoch: the next one reads the following epoch.

        Only a finished epoch moves the loader on: ``next(iter(loader))`` to peek, or a
        ``break``, leaves the epoch that ``set_epoch`` (or the last finished one) chose.
        """
        with self._iter_lock:
            if (self._epoch, self._resume_batch) == (run.epoch, run.first):
                self._epoch, self._resume_batch = run.epoch + 1, 0
                self._plan.resumed = None

    def state_dict(self) -> dict[str, Any]:
        """Where the epoch stands: JSON-safe, the same on every rank that has read as many batches.

        It describes the epoch, not the rank: the epoch, what decides its order (seed, shuffle,
        order and block parameters, dataset size) and ``consumed``, the positions of the epoch's
        order that all ranks together have read (``[start, stop)`` intervals; ``samples_consumed``
        is their total), assuming every rank has read ``batches_done`` batches, as it has when the
        ranks checkpoint at the same step. :meth:`load_state_dict` resumes it on any world size and
        batch size (``docs/loader.md``, "Resuming"); :meth:`merge_states` combines the states of
        ranks that stand at different batches. With a ``sampler=`` of your own, ``sampler`` holds
        that sampler's own state at the start of the epoch (as it gives it), if it has one.
        """
        self._bind_ranks()
        run = self._core.run
        if run is not None and not run.finished:
            epoch, done = run.epoch, run.yielded
        else:
            epoch, done = self._epoch, self._resume_batch
        plan = self._plan
        state: dict[str, Any] = {
            "format": "fastload.FastLoader",
            "version": STATE_VERSION,
            "epoch": epoch,
            "batches_done": done,
            "consumed": [],
            "resumed_from": [],
            "samples_consumed": None,
            "seed": self.seed,
            "num_samples": len(self.dataset),
            "shuffle": self.shuffle,
            "order": "sampler" if self._user_batches is not None else self.order,
            "block_size": self.block_size,
            "window": self.window,
            "batch_size": self.batch_size,
            "world_size": self.world_size,
            "drop_last": self.drop_last,
            "pad": self.pad,
            "sampler": None,
        }
        if isinstance(plan, EpochSampler):
            consumed = plan.consumed_after(epoch, done)
            before = plan.resumed[1] if plan.resumed is not None and plan.resumed[0] == epoch else []
            state["consumed"] = consumed
            state["resumed_from"] = [[int(a), int(b)] for a, b in before]
            state["samples_consumed"] = sum(b - a for a, b in consumed)
        elif plan.stateful is not None:
            for held in (plan.epoch_start_state, plan.pending_state):
                if held is not None and held[0] == epoch:
                    state["sampler"] = held[1]
                    break
            else:  # the epoch has not started: the sampler stands at its start
                state["sampler"] = plan.stateful.state_dict()
        return state

    @staticmethod
    def merge_states(states: Sequence[dict[str, Any]]) -> dict[str, Any]:
        """One state from every rank's :meth:`state_dict`, in rank order (as
        ``torch.distributed.all_gather_object`` returns them), for ranks that stand at different
        batches of the same epoch: its ``consumed`` is exactly what each rank has read, so the
        resumed epoch reads every other sample once and none of those again.

        Raises:
            ConfigError: not one version-2 state per rank of the same loader and epoch, or the
                ranks of a loader with its own ``sampler=`` stand at different batches.
        """
        states = list(states)
        if not states or not all(isinstance(s, dict) and s.get("format") == "fastload.FastLoader" for s in states):
            raise ConfigError("merge_states needs a list of FastLoader state_dicts, one per rank in rank order")
        first = states[0]
        if any(s.get("version") != STATE_VERSION or isinstance(s.get("version"), bool) for s in states):
            raise ConfigError(f"merge_states needs version-{STATE_VERSION} states")
        missing = [k for k in _STATE_TYPES if k not in first]
        if missing:
            raise ConfigError(f"state lacks {', '.join(missing)}: not a complete FastLoader state_dict")
        if len(states) != first["world_size"]:
            raise ConfigError(f"merge_states got {len(states)} states for world_size={first['world_size']!r}: give one per rank")
        for r, s in enumerate(states[1:], 1):
            for k in _STATE_TYPES:
                if k not in ("batches_done", "consumed", "samples_consumed", "sampler") and s.get(k) != first[k]:
                    raise ConfigError(f"rank {r}'s state has {k}={s.get(k)!r:.60} but rank 0's has {first[k]!r:.60}")
        done = [s["batches_done"] for s in states]
        if len(set(done)) == 1:
            return dict(first)
        if first["order"] == "sampler":
            raise ConfigError(
                f"the ranks stand at batches {done} of a loader with its own sampler=: FastLoader cannot "
                "tell which samples that sampler gave them; checkpoint all ranks at the same step"
            )
        consumed = FastLoader._saved_plan(first).consumed_after(first["epoch"], done, consumed=first["resumed_from"])
        total = sum(b - a for a, b in consumed)
        return {**first, "batches_done": 0, "consumed": consumed, "resumed_from": consumed, "samples_consumed": total}

    @staticmethod
    def _saved_plan(state: dict[str, Any]) -> EpochSampler:
        """Rank 0's plan of the loader that saved ``state`` (FastLoader's own order)."""
        kw = {"block_size": state["block_size"], "window": state["window"]} if state["order"] == "block" else {}
        try:
            return EpochSampler(
                num_samples=state["num_samples"], batch_size=state["batch_size"], shuffle=state["shuffle"],
                drop_last=state["drop_last"], seed=state["seed"], world_size=state["world_size"], pad=state["pad"],
                order=state["order"], **kw,
            )  # fmt: skip
        except (ConfigError, TypeError) as e:
            raise ConfigError(f"state describes no loader FastLoader can make: {e}") from None

    def _upgrade_v1(self, state: dict[str, Any]) -> dict[str, Any]:
        """A version-1 state (one rank's batch count) as version 2: only on the same world and batch size."""
        for k in ("world_size", "batch_size"):
            if k in state and state[k] != getattr(self, k):
                raise ConfigError(
                    f"state is a version-1 state (saved by a fastload without elastic resume) with {k}={state[k]!r}, "
                    f"but this loader has {k}={getattr(self, k)!r}: a version-1 state resumes only on the same "
                    "world_size and batch_size; save it again with this version to change them"
                )
        missing = [k for k in _V1_KEYS if k not in state]
        if missing:
            raise ConfigError(f"state lacks {', '.join(missing)}: not a complete FastLoader state_dict")
        epoch, done = state["epoch"], state["batches_done"]
        plan = self._plan
        consumed: list[list[int]] = []
        own = isinstance(plan, EpochSampler)
        if own and all(type(v) is int for v in (epoch, done)) and 0 <= done <= len(plan) and epoch >= 0:
            consumed = plan.consumed_after(epoch, done, consumed=[])
        return {
            **{k: state[k] for k in _V1_KEYS}, "format": state["format"], "version": STATE_VERSION,
            "consumed": consumed, "resumed_from": [], "samples_consumed": sum(b - a for a, b in consumed),
            "order": self.order if own else "sampler", "block_size": self.block_size, "window": self.window,
            "pad": self.pad, "sampler": None,
        }  # fmt: skip

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from :meth:`state_dict`, on this world size and batch size or others.

        On the same ``world_size``, ``batch_size``, ``drop_last`` and ``pad`` the next iteration
        yields exactly the batches an uninterrupted run would have yielded next. Otherwise the
        samples of the epoch not yet consumed are shared among the ranks of this loader
        (``docs/loader.md``, "Resuming"); the epochs after it are those of an uninterrupted run
        on this world size. A version-1 state resumes only on its own world and batch size.

        Raises:
            ConfigError: ``state`` is not a FastLoader state, has a field of the wrong type or
                range, was saved by a loader whose order differs (seed, dataset size, shuffle,
                order, block parameters), or cannot be resumed here (a ``sampler=`` of your own
                on another world or batch size, or mid-epoch without state of its own).
        """
        self._bind_ranks()
        if not isinstance(state, dict) or state.get("format") != "fastload.FastLoader":
            raise ConfigError(f"state is not a FastLoader state_dict: {state!r:.80}")
        version = state.get("version")
        if isinstance(version, bool) or version not in (1, STATE_VERSION):
            raise ConfigError(f"state version {version!r} is not supported (expected {STATE_VERSION}, or 1)")
        if version == 1:
            state = self._upgrade_v1(state)
        missing = [k for k in _STATE_TYPES if k not in state]
        if missing:
            raise ConfigError(f"state lacks {', '.join(missing)}: not a complete FastLoader state_dict")
        for k, kinds in _STATE_TYPES.items():
            v = state[k]
            if not any(v is None if kind is None else kind is object or type(v) is kind for kind in kinds):
                expected = " or ".join("None" if kind is None else kind.__name__ for kind in kinds)
                raise ConfigError(f"state has {k}={v!r:.40} ({type(v).__name__}); expected {expected}")
        mine_order = "sampler" if self._user_batches is not None else self.order
        must_match = {"seed": self.seed, "num_samples": len(self.dataset), "shuffle": self.shuffle, "order": mine_order}
        if mine_order == "block":
            must_match.update(block_size=self.block_size, window=self.window)
        for k, mine in must_match.items():
            if state[k] != mine:
                raise ConfigError(f"state has {k}={state[k]!r} but this loader has {k}={mine!r}; resume needs the same")
        n = len(self.dataset)
        try:
            consumed = check_intervals("consumed", state["consumed"], n)
            before = check_intervals("resumed_from", state["resumed_from"], n)
        except ConfigError as e:
            raise ConfigError(f"state has an invalid {e}") from None
        if (interval_mask(before, n) & ~interval_mask(consumed, n)).any():
            raise ConfigError("state has resumed_from outside consumed: not a FastLoader state_dict")
        epoch, done = state["epoch"], state["batches_done"]
        if epoch < 0 or done < 0:
            raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done}")
        plan = self._plan
        if isinstance(plan, SamplerPlan):
            self._load_sampler_position(plan, state, epoch, done)
            return
        same = all(state[k] == getattr(self, k) for k in ("world_size", "batch_size", "drop_last", "pad"))
        base, start = consumed, plan.first_batch(epoch, consumed)
        if same:
            total = len(plan)
            if done > total:
                raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done} (0..{total})")
            if plan.consumed_after(epoch, done, consumed=before) == consumed.tolist():
                # the very plan the state was saved from, at its batch
                base, start = before, max(done, plan.first_batch(epoch, before))
        elif done:
            saved = len(self._saved_plan(state))
            if done > saved:
                raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done} (0..{saved})")
            if done == saved:  # the saving ranks finished that epoch: what they left out stays out
                base, start = np.empty((0, 2), dtype=np.int64), 0
                epoch += 1
        if start >= len(plan):  # nothing left of that epoch here
            epoch, base, start = epoch + 1, np.empty((0, 2), dtype=np.int64), 0
        with self._iter_lock:
            self._core.stop()
            plan.resume(epoch, base)
            self._epoch, self._resume_batch = epoch, start

    def _load_sampler_position(self, plan: SamplerPlan, state: dict[str, Any], epoch: int, done: int) -> None:
        """load_state_dict with a user's sampler: it shards, so only its own world and batch size resume."""
        for k in ("world_size", "batch_size"):
            if state[k] != getattr(self, k):
                raise ConfigError(
                    f"state has {k}={state[k]!r} but this loader has {k}={getattr(self, k)!r}: with a sampler= "
                    "of your own the sampler shares the epoch among the ranks, so FastLoader resumes it only on "
                    f"the same {k} (without sampler=, FastLoader's own order resumes on any)"
                )
        if done > len(plan):
            raise ConfigError(f"state has an invalid position: epoch={epoch}, batches_done={done} (0..{len(plan)})")
        mid = 0 < done < len(plan)
        name = type(self._user_sampler if self._user_sampler is not None else plan.batch_sampler).__name__
        if mid and plan.stateful is None and not plan.replayable:
            raise ConfigError(
                f"the sampler {name} has no state_dict()/load_state_dict(), and iterating it again may give "
                f"another order, so the rest of epoch {epoch} cannot be resumed exactly: give a sampler that "
                "has them (or a DistributedSampler, a SequentialSampler, a list of indices), or resume "
                "from a checkpoint taken at the end of an epoch"
            )
        if mid and plan.stateful is not None and state["sampler"] is None:
            raise ConfigError(f"state has sampler=None but the sampler {name} resumes from its own state")
        with self._iter_lock:
            self._core.stop()
            if done == len(plan):
                epoch, done = epoch + 1, 0
            plan.pending_state = (epoch, state["sampler"]) if done and plan.stateful is not None else None
            self._epoch, self._resume_batch = epoch, done

    def close(self) -> None:
        """Stop the background thread and free the DALI pipeline (and its GPU memory). Idempotent."""
        with self._iter_lock:
            self._closed = True
        self._finalizer()

    def __reduce__(self) -> tuple:
        """Pickle and ``copy.deepcopy`` as the arguments that make this loader plus its position;
        the copy reopens the dataset (a spawn-based launcher gets a working loader)."""
        plan = self._plan
        resumed = None if plan.resumed is None else (plan.resumed[0], plan.resumed[1].tolist())
        return (_rebuild, (self._init, self._epoch, self._resume_batch, resumed))

    def __enter__(self) -> "FastLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return (
            f"FastLoader({str(self.packed.path)!r}, batch_size={self.batch_size}, device={str(self.device)!r}, "
            f"train={self.train}, batches={len(self)}, rank={self.rank}/{self.world_size})"
        )



#: A state's fields and their types (None: may be None); ``sampler`` (any value) is required too.
_STATE_TYPES: dict[str, tuple] = {
    "epoch": (int,), "batches_done": (int,), "consumed": (list,), "resumed_from": (list,),
    "samples_consumed": (int, None), "seed": (int,), "num_samples": (int,), "shuffle": (bool,), "order": (str,),
    "block_size": (int, None), "window": (int, None), "batch_size": (int, None), "world_size": (int,),
    "drop_last": (bool,), "pad": (bool,), "sampler": (object,),
}  # fmt: skip
#: The fields of a version-1 state (one rank's position), still loaded on the same world and batch size.
_V1_KEYS = ("epoch", "batches_done", "seed", "num_samples", "batch_size", "world_size", "rank", "shuffle", "drop_last")


def _rebuild(init: dict[str, Any], epoch: int, resume_batch: int, resumed: tuple | None = None) -> FastLoader:
    loader = FastLoader(**init)
    loader._epoch, loader._resume_batch = epoch, resume_batch
    if resumed is not None:
        loader._plan.resume(*resumed)
    return loader


class _Core:
    """What the background thread and DALI's callback hold: settings, dataset, pipeline, current run.

    Never a reference to the :class:`FastLoader`, so that dropping the loader frees it.
    """

    def __init__(self, loader: FastLoader) -> None:
        self.dataset = loader.packed
        self.plan = loader._plan
        self.max_batch = loader._max_batch
        self.labels = loader._labels
        self.device = loader.device
        self.batch_size = loader.batch_size
        self.num_threads = loader.num_threads
        self.train = loader.train
        self.crop, self.resize = loader.crop, loader.resize
        self.scale, self.ratio, self.flip = loader.scale, loader.ratio, loader.flip
        self.mean, self.std = loader.mean, loader.std
        self.dtype = loader.dtype
        self.channels_last = loader.channels_last
        self.prefetch = loader.prefetch
        self.seed = loader.seed
        self.hw_decoder_load = loader.hw_decoder_load
        # CPU training batches are resized and normalised on the host (faster than DALI's CPU resize)
        self.host_finish = self.device.type == "cpu" and self.train
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.pipe: Any = None
        self.run: _EpochRun | None = None
        # the records of the next batches are asked for from a few threads, ahead of DALI (cold data)
        self.read_ahead = ReadAhead(self.dataset, threads=4, depth=max(2, self.prefetch + 2))
        # CPU training crops far larger than the output are decoded at reduced scale from this pool
        # (when the dataset's largest images are big enough for one). It takes DALI's decoding of
        # those samples over, so it has as many threads as DALI's CPU decoder (which decodes 16x16
        # placeholders for them meanwhile).
        self.decode_pool: Any = None  # fastload.host.DecodePool
        self.decode_pool_pid = 0
        if self.host_finish:
            from PIL import Image

            from .host import DecodePool, REDUCED_SCALE_RATIO

            # PIL's plugins imported now, not first in a background thread: their namedtuples are
            # made with eval(), which resets CPython's note of an uncaught Ctrl-C (exit 1, not 130)
            Image.preinit()
            # The pool's threads start here, never in the epoch thread: a new thread may run the
            # collector, and so this core's finaliser, before start() returns to its starter.
            st = self.dataset.manifest.stats if isinstance(self.dataset.manifest.stats, dict) else {}
            sides = [st.get(k, {}).get("max") if isinstance(st.get(k), dict) else None for k in ("width", "height")]
            if all(v is None or v >= REDUCED_SCALE_RATIO * self.crop for v in sides):
                self.decode_pool, self.decode_pool_pid = DecodePool(self.num_threads), os.getpid()
        self.closed = False
        self.lock = threading.Lock()
        _LIVE_CORES.add(self)

    def start(self, epoch: int, start: int) -> "_EpochRun":
        """End the current run (if any) and start producing ``epoch`` from batch ``start``."""
        with self.lock:
            self._stop_locked(superseded=True)
            if self.pipe is None:
                self.pipe = self.build()
            run = _EpochRun(self, epoch, start)
            self.run = run
            run.start()
            return run

    def stop(self) -> None:
        with self.lock:
            self._stop_locked(superseded=True)

    def _stop_locked(self, *, superseded: bool) -> None:
        run, self.run = self.run, None
        if run is not None:
            if superseded and not run.finished:
                run.superseded = True
            run.shutdown()

    def close(self) -> None:
        """Stop the thread, free the pipeline and the stream. Idempotent; run by the finaliser."""
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self._stop_locked(superseded=False)
            self.read_ahead.close()
            pool, self.decode_pool = self.decode_pool, None
            if pool is not None:  # not waited for: the finaliser may run in one of its threads
                pool.close()
            self.pipe = None  # DALI frees its buffers (and GPU memory) with the pipeline
            if self.stream is not None:
                with contextlib.suppress(Exception):
                    self.stream.synchronize()  # this stream only: the copies in flight
                self.stream = None

    def build(self):
        gpu = self.device.type == "cuda"
        if self.mean is None:
            mean = std = None
            out = "uint8"
        else:
            mean = [m * 255.0 for m in self.mean]
            std = [s * 255.0 for s in self.std]  # type: ignore[union-attr]
            out = "float16" if self.dtype == torch.float16 else "float32"
        spec = GraphSpec(
            batch_size=self.max_batch,  # never more than a batch can hold
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
            host_finish=self.host_finish,
            # the mixed decoder's buffers, sized from the dataset's recorded image sizes
            **decoder_sizing(self.dataset.manifest.stats, max_pixels=self.dataset.manifest.max_pixels).fields(),
        )
        try:
            return build_pipeline(spec, self.source)
        except FastloadError:
            raise
        except Exception as e:  # DALI's own errors
            raise LoaderError(f"could not build the DALI pipeline for {self.device}: {e}") from e

    def source(self) -> tuple:
        """DALI's external_source callback: the next planned batch, read and parameterised."""
        run = self.run
        if run is None:
            raise StopIteration
        batch = run.next_plan()  # raises StopIteration at the end or when stopping
        ds = self.dataset
        # The payloads are views of one buffer, reused batch after batch, handed over as one
        # TensorListCPU that wraps them: DALI copies what the callback returns before it calls
        # it again (measured faster than no_copy=True here, whose per-sample bookkeeping in
        # DALI's Python costs more than the copy saves).
        rb = ds.read_batch(batch.indices, buffer=run.read_buffer)
        run.read_buffer = rb.buffer
        enc, widths, heights = rb.payloads, rb.widths, rb.heights
        for k in sorted(rb.errors):
            # DALI asks for batches ahead of the consumer: remember the error with its batch,
            # feed a placeholder, and raise when this batch's turn comes (after the good ones).
            i = int(batch.indices[k])
            if batch.number not in run.errors:
                msg, prefix = str(rb.errors[k]), f"{ds.location(i)}: "
                reason = msg[len(prefix) :] if msg.startswith(prefix) else msg
                run.errors[batch.number] = LoaderError(f"{ds.where(i)}: {reason}")
            enc[k] = _placeholder_jpeg()
            widths[k], heights[k] = _PLACEHOLDER_SIDE, _PLACEHOLDER_SIDE
        if not self.train:
            sizes, corners = eval_params(widths, heights, resize=self.resize, crop=self.crop)
            return (encoded_batch(enc), sizes, corners)
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
        # The per-sample parameters go to DALI as dense [n, k] arrays (one batch, one conversion),
        # not lists of n small arrays: DALI checks each list item in Python (about 6 us each).
        anchors, shapes = np.ascontiguousarray(boxes[:, :2]), np.ascontiguousarray(boxes[:, 2:])
        if self.host_finish:
            run.flips.append((flips, self._submit_reduced(enc, boxes, widths, heights, anchors, shapes, rb.errors)))
            return (encoded_batch(enc), anchors, shapes)
        return (encoded_batch(enc), anchors, shapes, flips)

    def _submit_reduced(self, enc: list, boxes: np.ndarray, widths, heights, anchors, shapes, failed) -> dict[int, Any]:
        """Send the crops to decode at reduced scale to the pool; DALI decodes a placeholder for each.

        Returns position -> the future of its finished crop (:func:`fastload.host.reduced_crop`).
        The payload is copied first: its buffer is the next batch's.
        """
        from .host import reduced_crop, reduced_scales

        jobs: dict[int, Any] = {}
        if self.closed or self.decode_pool is None or self.decode_pool_pid != os.getpid():
            return jobs  # no pool (closed, images too small to need one, another process): full scale
        scales = reduced_scales(boxes, widths, heights, crop=self.crop)
        scales[list(failed)] = 1  # unreadable: a placeholder already, its error raised at its turn
        big = np.flatnonzero(scales > 1).tolist()
        if not big:
            return jobs
        for k in big:
            try:
                jobs[k] = self.decode_pool.submit(reduced_crop, bytes(enc[k]), boxes[k].tolist(), scale=int(scales[k]), crop=self.crop)
            except RuntimeError:  # closed by close(): DALI decodes the rest at full scale
                break
            enc[k] = _placeholder_jpeg()
            anchors[k] = 0.0
            shapes[k] = float(_PLACEHOLDER_SIDE)
        return jobs

    def locate_decode_error(self, indices: Sequence[int], err: BaseException) -> LoaderError:
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


class _EpochRun:
    """One epoch's producer: a thread that drives DALI into a bounded queue.

    It holds the :class:`_Core`, never the loader or the iterator the user holds.
    """

    def __init__(self, core: _Core, epoch: int, start: int) -> None:
        self.core = core
        self.epoch = epoch
        self.first = start
        self.yielded = start
        self.finished = False
        self.superseded = False  # a newer iter() of the same loader took over
        self._plan = core.read_ahead.ahead(core.plan.batches(epoch, start))
        self._inflight: collections.deque[Batch] = collections.deque()
        self.read_buffer: np.ndarray | None = None  # Dataset.read_batch's, reused by DALI's callback
        self.flips: collections.deque[tuple[np.ndarray, dict]] = collections.deque()  # host_finish: flips, reduced-scale jobs
        self.errors: dict[int, LoaderError] = {}  # batch number -> the error to raise at its turn
        self._queue: queue.Queue = queue.Queue(maxsize=core.prefetch)
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
        core = self.core
        pipe = core.pipe
        stream = core.stream
        try:
            if stream is not None:
                torch.cuda.set_device(core.device)

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
            core.pipe = None  # a failed DALI pipeline is not reusable: rebuild next epoch
            if isinstance(e, LoaderError):
                err: BaseException = e
            elif isinstance(e, FastloadError):
                err = LoaderError(str(e))
            else:
                pending = [int(i) for b in self._inflight for i in b.indices]
                err = core.locate_decode_error(pending, e)
                err.__cause__ = e
            self._put(_Failure(err))

    def _convert(self, tl, batch: Batch):
        core = self.core
        labels_np = core.labels[batch.indices]
        if core.host_finish:
            from concurrent.futures import wait as futures_wait

            flips, jobs = self.flips.popleft()
            finished = {}
            for k, job in jobs.items():  # reduced-scale decodes, in the pool since DALI asked for the batch
                while not job.done():  # never blocked for good: a finaliser closing this run may hold the pool's thread
                    if self._stop.is_set():
                        return None  # stopping: nothing is handed on
                    futures_wait((job,), timeout=0.05)
                try:
                    finished[k] = job.result()
                except Exception as e:  # noqa: BLE001 - named with its sample, as DALI's failures are
                    why = "PIL cannot identify it as an image" if type(e).__name__ == "UnidentifiedImageError" else str(e)
                    where = core.dataset.where(int(batch.indices[k]))
                    raise LoaderError(f"{where} failed to decode: {(why or type(e).__name__)[:200]}") from e
            images = finish_crops(
                cpu_samples(tl), flips, crop=core.crop, mean=core.mean, std=core.std,
                dtype=core.dtype, channels_last=core.channels_last, finished=finished,
            )  # fmt: skip
            return images, torch.from_numpy(labels_np), None
        dali_tensor = tl.as_tensor()
        shape = dali_tensor.shape()
        torch_dtype = torch.uint8 if core.dtype == torch.uint8 else (
            torch.float16 if core.dtype == torch.float16 else torch.float32
        )
        from nvidia.dali.plugin.pytorch import feed_ndarray

        if core.stream is None:
            images = torch.empty(shape, dtype=torch_dtype)
            feed_ndarray(dali_tensor, images)
            if core.dtype == torch.bfloat16:
                images = images.to(torch.bfloat16)
            labels = torch.from_numpy(labels_np)
            event = None
        else:
            stream = core.stream
            with torch.cuda.stream(stream):
                images = torch.empty(shape, dtype=torch_dtype, device=core.device)
                feed_ndarray(dali_tensor, images, cuda_stream=stream)
                if core.dtype == torch.bfloat16:
                    images = images.to(torch.bfloat16)
                labels = torch.from_numpy(labels_np).pin_memory().to(core.device, non_blocking=True)
                event = torch.cuda.Event()
                event.record(stream)
        if core.channels_last:
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

    # ---- consumer side (called by _EpochIterator)
    def get(self) -> Any:
        """The next item of the queue; raises LoaderError if the thread died without one."""
        while True:
            try:
                return self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._stop.is_set() or (not self._thread.is_alive() and self._queue.empty()):
                    return None

    def join(self) -> None:
        self._thread.join()

    def request_stop(self) -> None:
        """Ask the thread to stop; it drains DALI's scheduled batches and ends by itself."""
        self._stop.set()

    def shutdown(self) -> None:
        """Stop producing, drain DALI's scheduled batches, and join the thread."""
        self._stop.set()
        if threading.current_thread() is self._thread:
            return  # a finaliser run by the collector inside this very thread: it ends by itself
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        with contextlib.suppress(Exception):
            self._plan.close()  # drops the read-ahead requests not yet started
        self.finished = True


_SUPERSEDED = (
    "this FastLoader iterator was ended by a newer iter() of the same loader (one live iterator "
    "per loader): iterate it from one place, or make one FastLoader per consumer"
)


class _EpochIterator:
    """What ``iter(loader)`` returns: the consumer end of one :class:`_EpochRun`.

    It keeps its loader alive while it is used (as a DataLoader's iterator does); when
    it is dropped before the end of its epoch, its producer thread is stopped.
    """

    def __init__(self, loader: FastLoader, run: _EpochRun) -> None:
        self._loader = loader
        self._run = run
        self._device = loader.device
        self._told = False  # the "ended by a newer iter()" error was raised
        weakref.finalize(self, run.request_stop)

    def __iter__(self) -> "_EpochIterator":
        return self

    def __next__(self) -> tuple[torch.Tensor, torch.Tensor]:
        run = self._run
        if run.superseded and not self._told:
            self._told = True
            raise LoaderError(_SUPERSEDED)
        if run.finished:
            raise StopIteration
        item = run.get()
        if item is None:
            run.finished = True
            if run.superseded:
                self._told = True
                raise LoaderError(_SUPERSEDED)
            if self._loader._closed:
                raise LoaderError("this FastLoader was closed while it was being iterated")
            raise LoaderError("the FastLoader background thread stopped without a result")
        if item is _END:
            run.finished = True
            run.join()
            self._loader._epoch_finished(run)
            raise StopIteration
        if isinstance(item, _Failure):
            run.finished = True
            run.join()
            raise item.exc
        images, labels, event = item
        if event is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_event(event)
            images.record_stream(current)
            labels.record_stream(current)
        run.yielded += 1
        return images, labels

    def __len__(self) -> int:
        return len(self._loader) - self._run.yielded
