"""FastLoader: a drop-in for ``torch.utils.data.DataLoader`` over a packed dataset (the public facade).

This module checks the arguments, resolves where the images come from (a packed path, a
:class:`fastload.Dataset`, another loader's view, a torchvision dataset through
:mod:`fastload.cache`), and answers the DataLoader surface (``len``, ``sampler``,
``batch_sampler``, ``dataset``, ``set_epoch``, ``__iter__``, ``close``). The work is done
below it: :mod:`fastload.augment.settings` checks what is done to each image, :mod:`fastload.sampler`
and :mod:`fastload.dlcompat` decide which samples each batch holds, :mod:`fastload.core`
runs the DALI graph of :mod:`fastload.pipeline`, :mod:`fastload.epochs` produces each epoch
in a background thread and hands its batches over on the consumer's CUDA stream, and
:mod:`fastload.resume` makes and checks the ``state_dict``.

Lifetime: the thread and DALI's callback hold only a :class:`fastload.core.Core`, never the
:class:`FastLoader`, so a loader nobody references is collected; ``weakref.finalize`` then
stops its thread and frees its pipeline, and does the same at interpreter exit for loaders
still alive, so a script that breaks out of a loop exits cleanly.
"""

from __future__ import annotations

import inspect
import logging
import operator
import os
import threading
import weakref
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import default_collate

from .core import REBOUND, RESUMED, RETRANSFORMED, Core, register_exit_hook
from .dlcompat import DetachedEpoch, LoaderBatchSampler, RankSampler, SamplerPlan, check_collate_fn, note_ignored, rank_and_world, user_batch_sampler
from .epochs import EpochIterator, EpochRun, start_epoch
from .errors import ConfigError, LoaderError, as_int
from .pipeline import find_dali
from .composite import DatasetView
from .reader import Dataset
from .resume import STATE_VERSION, Shape, make_state, merge_states, resume_position
from .sampler import MAX_BATCH, MAX_SEED, EpochSampler, check_order, choose_order, order_options
from .augment.settings import IMAGENET_MEAN, IMAGENET_STD, MAX_SIDE, Augment
from .views import LoaderDataset
from .inputs import Source, origin, remote_options, resolve_source, translated
from .multiview import item_settings, split_settings as _settings

__all__ = ["FastLoader", "IMAGENET_MEAN", "IMAGENET_STD", "MAX_SIDE", "MAX_THREADS", "STATE_VERSION"]

log = logging.getLogger(__name__)

#: The most DALI CPU threads one loader may ask for.
MAX_THREADS = 256

_UNSET: Any = object()  # "not given" for arguments whose None means something (mean, std)


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


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1


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



def _given(name: str, value: Any) -> bool:
    """Whether an image keyword was given (None means "not given", except for mean and std)."""
    return value is not _UNSET if name in ("mean", "std") else value is not None


def _gone(transform: Any) -> dict[str, Any]:
    raise LoaderError("the FastLoader of this dataset view is gone: its transform can no longer be changed")


def _check_generator(generator: Any) -> torch.Generator | None:
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ConfigError(f"generator must be a torch.Generator or None, got {generator!r}")
    return generator


def _check_batch_size(batch_size: Any, batch_sampler: Any) -> int | None:
    if batch_sampler is not None:
        return batch_size
    if batch_size is None:
        raise ConfigError("batch_size=None (no batching) is not supported: FastLoader yields batches; give batch_size")
    return as_int("batch_size", batch_size, lo=1, hint=" (samples per batch)")


def _check_runtime(prefetch: Any, num_threads: Any, seed: Any, hw_decoder_load: Any) -> tuple[int, int | None, int, float | None]:
    """The loader's own numbers: batches in flight, DALI threads, the seed, the hardware decoder's share."""
    prefetch = as_int("prefetch", prefetch, lo=1, hi=64, hint=" (batches in flight)")
    if num_threads is not None:
        num_threads = as_int("num_threads", num_threads, lo=1, hi=MAX_THREADS, hint=" or None")
    seed = as_int("seed", seed, lo=0, hi=MAX_SEED, hint=" (64 bits: every bit of it is used)")
    return prefetch, num_threads, seed, _check_hw_decoder_load(hw_decoder_load)


def _check_hw_decoder_load(value: Any) -> float | None:
    if value is None:
        return None
    try:
        hw = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"hw_decoder_load must be in [0, 1] or None, got {value!r}") from None
    if not 0.0 <= hw <= 1.0:
        raise ConfigError(f"hw_decoder_load must be in [0, 1] or None, got {value!r}")
    return hw


def _check_world(world_size: int, packed: Dataset) -> None:
    if world_size > len(packed):
        raise ConfigError(
            f"world_size={world_size} is larger than the dataset ({len(packed)} samples in "
            f"{str(packed.path)!r}): every rank needs at least one sample of its own"
        )


def _transformed_labels(labels: np.ndarray, target_transform: Any) -> np.ndarray:
    """``target_transform`` applied to every label (once, at construction); the results must be ints."""
    table = {}
    lo, hi = np.iinfo(np.int64).min, np.iinfo(np.int64).max
    for c in np.unique(labels).tolist():
        v = target_transform(c)
        try:
            if isinstance(v, (torch.Tensor, np.ndarray)):
                if v.size if isinstance(v, np.ndarray) else v.numel() != 1:
                    raise TypeError
                v = v.item()
            label = operator.index(v)
        except (TypeError, ValueError, RuntimeError):
            raise ConfigError(
                f"target_transform({c}) returned {v!r:.80}; FastLoader needs one integer label per sample "
                "(a one-hot or soft target: compute it from the label inside the training loop)"
            ) from None
        if not lo <= label <= hi:
            raise ConfigError(f"target_transform({c}) returned {label}, outside int64 labels ({lo}..{hi})")
        table[c] = label
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
        collate_fn: None or ``default_collate`` (batches ``[images, labels]``), or a function called on
            each batch as a list of ``(image, label)`` pairs, as a DataLoader calls it (MixUp/CutMix
            collates: ``lambda b: mixup_cutmix(*default_collate(b))``).
        drop_last: drop the last incomplete batch and the tail that does not divide among
            ranks: ``DistributedSampler(drop_last=...)`` + ``DataLoader(drop_last=...)``.
        generator: seeds the order (its ``initial_seed()``) when ``seed`` is not given.
        transform: a :class:`fastload.Augment`, or a torchvision transform translated into one
            (:func:`fastload.transforms.translate`): the image settings below in one object, for
            any dataset (it replaces a torchvision dataset's own ``transform``). The flat keywords
            below, where given, override its values. A multi-view transform (MoCo's, SimCLR's,
            DINO's: it returns a list of views), a list of one transform per view, or a
            :class:`fastload.multiview.MultiView` gives ``[views, labels]`` batches, ``views`` a list
            of one tensor per view (each image decoded once; the flat keywords are refused then).
        train: random-resized crop + flip (True) or resize + center crop (False).
        crop: output side in pixels.
        scale, ratio: random-resized-crop area fraction and aspect ratio ranges (torchvision semantics).
        flip: probability of a horizontal flip when training.
        resize: shorter side before the evaluation center crop (default ``round(crop / 0.875)``).
        mean, std: per-channel normalisation in 0..1 units; both None gives uint8 images.
        dtype: ``torch.float32``, ``torch.float16`` or ``torch.bfloat16`` (ignored for uint8 output).
        channels_last: return images in channels-last memory format.
        interpolation: the resampling filter of every resize: ``"bilinear"`` (default), ``"bicubic"``
            or ``"lanczos"`` (antialiased, torchvision's names; a transform's own is kept).
            (``RandomErasing``, ``ColorJitter``, ``RandomGrayscale``, ``TrivialAugmentWide``,
            ``RandAugment``/``AutoAugment`` (torchvision's, timm's) and ``RandomApply``/``RandomChoice``
            chains come through ``transform=``: a torchvision or timm transform, or an Augment's
            ``erasing``, ``jitter``, ``grayscale``, ``trivial`` and ``policy``.)
        device: ``"cuda"``/``"cuda:N"`` (GPU decoding), ``"cpu"`` (DALI's CPU pipeline), None (CUDA if present).
        num_threads: DALI CPU threads (default: this process's share of the cores; a GPU
            pipeline uses at most :data:`fastload.pipeline.GPU_THREADS`, 4: see docs/gpu.md).
        prefetch: batches in flight ahead of the consumer.
        seed: seeds the epoch order, crops and flips (default 0, or the generator's seed).
        rank, world_size: this process's share of each epoch (default: from torch.distributed).
        pad: without ``drop_last``, pad ranks to equal shares like ``DistributedSampler``
            (default); False gives every sample to exactly one rank (exact evaluation; ranks
            may then differ by one batch).
        order: with ``shuffle``, ``"global"`` (a permutation of all samples each epoch; the
            default), ``"block"`` (:func:`fastload.sampler.block_order`, for datasets larger than
            memory) or ``"shards"`` (:mod:`fastload.shuffle.shards`: the default for a URL whose
            dataset is larger than ``cache_limit``; ``docs/loader.md``, "Order").
        block_size: with ``order="block"``, samples per run (default: runs of about 8 MiB of
            records, :func:`fastload.sampler.block_size_for`).
        window: with ``order="block"``, runs shuffled together (default 16); with ``"shards"``,
            shards mixed together (default: the most ``cache_limit`` holds, else 16).
        hw_decoder_load: share of JPEGs sent to the GPU's hardware decoder (DALI's default if None).
        check: verify each record's payload checksum before decoding (XXH3, about 2 us per
            100 KB; CRC-32 in format-1 datasets), reporting altered bytes with the sample.
        target_transform: applied to every label once (a torchvision dataset's own is used by default).
        cache_dir: where a torchvision dataset is packed, and where a dataset URL's shards are
            downloaded (default ``$FASTLOAD_CACHE`` or ``~/.cache/fastload``).
        progress: show a progress bar while a torchvision dataset is packed.
        cache_limit, storage_options, retry_deadline, fetch: for a dataset URL (``s3://bucket/prefix``,
            ``gs://``, ``az://``, ``https://``): the node cache's size limit (bytes or ``"50GB"``),
            the object store's endpoint and credentials, the seconds a request is retried for
            (default 180), and ``fetch="shards"`` (whole shards, the default) or ``"records"``
            (range requests, for a global shuffle over more data than the cache holds); see
            ``docs/loader.md``, "Many nodes".
        fields: the fields each batch holds, in order, such as ``("image", "txt", "label")``, of a
            packed dataset with typed fields (``docs/fields.md``); each batch is then a
            :class:`fastload.FieldBatch` (a tuple in this order, ``batch["txt"]`` by name). Default:
            ``[images, labels]`` batches, as today. Naming ``"boxes"`` gives a
            :class:`fastload.DetectionLoader` instead (``(images, targets)`` batches, with
            ``min_size``, ``max_size`` and ``flip``: ``docs/detection.md``).
        pad_to: with ``fields``, pad (or truncate) ragged fields such as token ids to this many rows
            (an int, or a dict of field name -> int): one tensor per field, with the lengths in
            ``batch.lengths[name]``; default: a list of tensors per ragged field.
    """
    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        """``fields=`` naming ``"boxes"`` gives a :class:`fastload.DetectionLoader` instead: images resized
        (``min_size``/``max_size``) and flipped with their boxes, ``(images, targets)`` batches
        (``docs/detection.md``); a torchvision CocoDetection/VOCSegmentation/VOCDetection (plain, under
        Subset, v2-wrapped) gives a :class:`fastload.pairloader.AnnotatedLoader` of its own items; every
        other loader is a FastLoader."""
        plan = _annotated(args[0] if args else kwargs.get("dataset"))
        if plan is not None:
            from .pairloader import annotated_loader

            return annotated_loader(plan, *args[1:], **{k: v for k, v in kwargs.items() if k != "dataset"})
        if _names_boxes(kwargs.get("fields")):
            from .detection import detection_loader

            return detection_loader(*args, **kwargs)
        for k in ("min_size", "max_size"):
            if k in kwargs:
                raise ConfigError(f"{k}={kwargs[k]!r} applies to detection batches: name the boxes in fields=, e.g. fields=('image', 'boxes')")
        return super().__new__(cls)

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
        transform: Any = None,
        train: bool | None = None,
        crop: int | None = None,
        scale: Sequence[float] | None = None,
        ratio: Sequence[float] | None = None,
        flip: float | None = None,
        resize: int | None = None,
        mean: Sequence[float] | None | Any = _UNSET,
        std: Sequence[float] | None | Any = _UNSET,
        dtype: torch.dtype | None = None,
        channels_last: bool | None = None,
        interpolation: str | None = None,
        device: str | torch.device | None = None,
        num_threads: int | None = None,
        prefetch: int = 2,
        seed: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
        pad: bool = True,
        order: str | None = None,
        block_size: int | None = None,
        window: int | None = None,
        hw_decoder_load: float | None = None,
        check: bool = True,
        target_transform: Any = None,
        cache_dir: str | os.PathLike | None = None,
        progress: bool = True,
        cache_limit: int | str | None = None,
        storage_options: dict | None = None,
        retry_deadline: float | None = None, fetch: str | None = None,
        fields: Sequence[str] | None = None,
        pad_to: int | dict[str, int] | None = None,
    ) -> None:
        # 1. the DataLoader arguments that do not apply: kept as attributes, like a DataLoader's
        ignored = {
            "num_workers": num_workers, "pin_memory": pin_memory, "timeout": timeout,
            "worker_init_fn": worker_init_fn, "multiprocessing_context": multiprocessing_context,
            "prefetch_factor": prefetch_factor, "persistent_workers": persistent_workers,
            "pin_memory_device": pin_memory_device, "in_order": in_order,
        }  # fmt: skip
        self._keep_unused(ignored)
        self.collate_fn = check_collate_fn(collate_fn)
        self.generator = _check_generator(generator)

        # 2. where the images come from, and what is done to them; every value checked before
        #    the disk or DALI is touched
        source = resolve_source(dataset, transform)
        given = dict(train=train, crop=crop, scale=scale, ratio=ratio, flip=flip, resize=resize, mean=mean, std=std,
                     dtype=dtype, channels_last=channels_last, interpolation=interpolation)  # fmt: skip
        batch_size = _check_batch_size(batch_size, batch_sampler)
        augment, self._views = _settings(source.settings, {k: v for k, v in given.items() if _given(k, v)})
        if shuffle is None:  # DataLoader's default (False) wherever a DataLoader call is being replaced
            user_order = sampler is not None or batch_sampler is not None or source.kind == "torchvision"
            shuffle = False if user_order else augment.train
        if seed is None:
            seed = generator.initial_seed() if generator is not None else 0
        prefetch, num_threads, seed, hw_decoder_load = _check_runtime(prefetch, num_threads, seed, hw_decoder_load)
        user_batches = user_batch_sampler(
            sampler=sampler, batch_sampler=batch_sampler, batch_size=batch_size, shuffle=shuffle, drop_last=drop_last
        )
        order, block_size, window = check_order(order, block_size, window, user_batches)
        self.device = _resolve_device(device)
        self.rank, self.world_size = rank_and_world(rank, world_size)
        find_dali()  # DependencyError with an install hint, before any work (imported once downloads start)

        # 3. the dataset, its labels, and this rank's plan of each epoch
        remote = remote_options(dataset, cache_limit=cache_limit, storage_options=storage_options, retry_deadline=retry_deadline, fetch=fetch)
        packed = self._open(source, check=check, cache_dir=cache_dir, progress=progress, user_batches=user_batches, remote=remote)
        order, block_size, window = choose_order(order, block_size, window, packed, shuffle=shuffle and user_batches is None, rank_batch=(batch_size or 1) * self.world_size, prefetch=prefetch)  # fmt: skip
        if target_transform is None:
            target_transform = source.target_transform
        self._keep_settings(augment, batch_size=batch_size if batch_sampler is None else None, shuffle=shuffle,
                            drop_last=drop_last, pad=pad, prefetch=prefetch, seed=seed, hw_decoder_load=hw_decoder_load,
                            num_threads=num_threads, order=order, block_size=block_size, window=window)  # fmt: skip
        self._keep_samplers(sampler, batch_sampler, user_batches, rank=rank, world_size=world_size)
        self._labels = packed.labels if target_transform is None else _transformed_labels(packed.labels, target_transform)
        self._fields = self._check_fields(packed, fields, pad_to)
        self._start_fetching()  # a URL's first epoch downloads while DALI is imported and the pipeline built
        register_exit_hook()  # imports DALI, then our exit hook after DALI's (see fastload.core)
        self._init = {
            "dataset": packed if isinstance(packed, DatasetView) else (getattr(packed, "url", None) or str(packed.path)), "batch_size": batch_size, "shuffle": shuffle, "sampler": sampler,
            "batch_sampler": batch_sampler, "drop_last": drop_last, "generator": generator, **ignored,
            "collate_fn": collate_fn,
            "transform": self._views or augment, "device": None if device is None else str(self.device),
            "num_threads": self.num_threads, "prefetch": prefetch, "seed": seed, "rank": rank, "world_size": world_size,
            "pad": pad, "order": order, "block_size": block_size, "window": window, "hw_decoder_load": hw_decoder_load,
            "check": check, "target_transform": target_transform, **(packed.remote.options if getattr(packed, "remote", None) else {}), **({"fields": fields, "pad_to": pad_to} if fields is not None else {}),
        }  # fmt: skip
        self._given, self._image = {k: v for k, v in given.items() if _given(k, v)}, source.image  # for _retransform
        self.dataset = LoaderDataset(
            packed, labels=self._labels, epoch=self._epoch_box.get, transform=source.transform,
            target_transform=target_transform, origin=origin(source),
            settings=self._view_settings(), on_transform=_weakly(self._retransform, _gone),
        )  # fmt: skip

        # 4. the DALI core the background threads hold, freed with the loader
        self._closed = False
        self._iter_lock = threading.Lock()
        self._core = self._make_core()
        self._finalizer = weakref.finalize(self, self._core.close)  # stops its thread, frees its pipeline

    # ------------------------------------------------------------------ the constructor's steps
    def _start_fetching(self) -> None:
        """The first epoch's downloads ahead (a URL's dataset), given up when the loader is closed or
        collected, a loader whose construction fails after this point included."""
        stop = getattr(self.packed, "stop_fetching", None)
        self._stop_fetching = weakref.finalize(self, stop) if stop is not None else None
        self._fetch_ahead(started=False)

    def _keep_unused(self, ignored: dict[str, Any]) -> None:
        """The DataLoader arguments about worker processes, kept as a DataLoader keeps them."""
        self.num_workers = as_int("num_workers", ignored["num_workers"], lo=0)
        for k in ("pin_memory", "timeout", "worker_init_fn", "multiprocessing_context", "prefetch_factor",
                  "persistent_workers", "pin_memory_device", "in_order"):  # fmt: skip
            setattr(self, k, ignored[k])
        note_ignored(ignored)

    def _open(self, source: Source, *, check: bool, cache_dir: Any, progress: bool, user_batches: Any,
              remote: dict | None = None) -> Dataset:  # fmt: skip
        """The packed dataset ``source`` gives (packing a torchvision dataset into the cache first)."""
        packed = source.open(check=check, cache_dir=cache_dir, progress=progress, remote=remote)
        self.packed = packed
        if len(packed) == 0:
            raise ConfigError(f"dataset {str(packed.path)!r} holds no samples")
        if user_batches is None:
            _check_world(self.world_size, packed)
        return packed

    def _keep_settings(self, augment: Augment, *, num_threads: int | None, **settings: Any) -> None:
        """The checked settings as the loader's attributes (what clients and ``repr`` read)."""
        self._keep_augment(augment)
        self.batch_size = settings["batch_size"]
        self.shuffle, self.drop_last, self.pad = bool(settings["shuffle"]), bool(settings["drop_last"]), bool(settings["pad"])
        self.prefetch, self.seed, self.hw_decoder_load = settings["prefetch"], settings["seed"], settings["hw_decoder_load"]
        self.order, self.block_size, self.window = settings["order"], settings["block_size"], settings["window"]
        if num_threads is None:
            local = int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1)
            num_threads = max(1, _cores() // max(1, local))
        self.num_threads = num_threads

    def _keep_augment(self, augment: Augment) -> None:
        self.augment = augment
        self.train, self.crop, self.resize = augment.train, augment.crop, augment.resize_side
        self.scale, self.ratio, self.flip = augment.scale, augment.ratio, augment.flip
        self.mean, self.std = augment.mean, augment.std
        self.dtype = augment.out_dtype
        self.channels_last = augment.channels_last

    def _keep_samplers(self, sampler: Any, batch_sampler: Any, user_batches: Any, *, rank: Any, world_size: Any) -> None:
        """The epoch (in a box), the user's sampler if any, and this rank's plan with its samplers."""
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

    def _view_settings(self) -> dict[str, Any]:
        """The image settings ``loader.dataset`` processes its items with (a multi-view transform's: its first view's,
        and under ``"views"`` each view's, with the seed that view draws from)."""
        out = {"train": self.train, "crop": self.crop, "resize": self.resize, "scale": self.scale,
               "ratio": self.ratio, "flip": self.flip, "mean": self.mean, "std": self.std, "seed": self.seed,
               "interpolation": self.augment.interpolation, "pad_crop": self.augment.pad_crop,
               "channels": self.augment.channels}  # fmt: skip
        if self._views is not None:
            out["views"] = item_settings(self._views, self.seed)
        return out

    def _retransform(self, transform: Any) -> dict[str, Any]:
        """``loader.dataset.transform = transform``: run it from the next ``iter()`` on (a new pipeline).

        The flat keywords given to the constructor still override it, as they override a transform
        given there. Returns the view's new settings; a ConfigError leaves everything as it was.
        """
        augment, views = _settings(translated(transform, self._image) or Augment(), self._given)
        if views is not None and self._fields is not None:
            raise ConfigError("a multi-view transform with fields=: a FieldBatch holds one image per sample")
        if augment.pad_crop is not None and augment.pad_crop.mode != "constant":  # its refusal before any change
            from .augment.padcrop import static_pads

            static_pads(augment.pad_crop, augment.crop, self.packed.manifest.stats or {})
        with self._iter_lock:
            old = self._core
            self._keep_augment(augment)
            self._views = views
            self._init.update(transform=views or augment)
            self._finalizer.detach()
            self._core = self._make_core()
            self._finalizer = weakref.finalize(self, self._core.close)
        old.stop(RETRANSFORMED)
        old.close()
        log.debug("FastLoader: the dataset's transform was replaced; new settings %s", augment)
        return self._view_settings()

    def _make_core(self) -> Core:
        core = Core(
            dataset=self.packed, plan=self._plan, max_batch=self._max_batch, labels=self._labels, device=self.device,
            augment=self.augment, num_threads=self.num_threads, prefetch=self.prefetch, seed=self.seed,
            hw_decoder_load=self.hw_decoder_load, views=self._views,
        )  # fmt: skip
        if self.order == "block" and self.shuffle:  # ReadAhead reads each run once, sequentially
            core.read_ahead.runs = self.block_size
        core.fields = self._fields
        return core

    def _check_fields(self, packed: Dataset, fields: Any, pad_to: Any) -> Any:
        """``fields=`` and ``pad_to=`` checked against the dataset's schema (None: ``[images, labels]`` batches)."""
        if fields is not None and self._views is not None:
            raise ConfigError("fields= with a multi-view transform: a FieldBatch holds one image per sample; use one view's transform")
        if fields is None:
            if pad_to is not None:
                raise ConfigError(f"pad_to={pad_to!r} is given without fields=; name the ragged fields to pad, e.g. fields=('image', 'tokens')")
            return None
        from .fieldbatch import FieldRequest

        if isinstance(packed, DatasetView):
            raise ConfigError("fields= reads a packed dataset directly; a Subset/ConcatDataset of packed parts yields [images, labels] only")
        if self.collate_fn is not default_collate:
            raise ConfigError("fields= and collate_fn cannot be combined: a FieldBatch is already collated (apply your function to it in the loop)")
        return FieldRequest(packed.schema, fields, pad_to)

    def _make_plan(self) -> None:
        """The epoch plan, samplers and batch bound for this rank and world size."""
        packed, batch_size, user_batches = self.packed, self.batch_size, self._user_batches
        if user_batches is None:
            plan: EpochSampler | SamplerPlan = EpochSampler(
                num_samples=len(packed), batch_size=batch_size, shuffle=self.shuffle, drop_last=self.drop_last,
                seed=self.seed, rank=self.rank, world_size=self.world_size, pad=self.pad, order=self.order,
                **order_options(self.order, self.block_size, self.window, packed),
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
            if self._max_batch > MAX_BATCH:
                raise ConfigError(
                    f"batch_size={batch_size} gives batches of {self._max_batch} samples on this rank; at most "
                    f"{MAX_BATCH} fit one pipeline: use a smaller batch_size"
                )
        else:
            plan = SamplerPlan(user_batches, num_samples=len(packed), rank=self.rank, world_size=self.world_size)
            self.sampler = self._user_sampler
            self.batch_sampler = user_batches
            self._max_batch = plan.max_batch  # bounded by SamplerPlan
        self._plan = plan

    @property
    def _epoch(self) -> int:
        return self._epoch_box.epoch

    @_epoch.setter
    def _epoch(self, epoch: int) -> None:
        self._epoch_box.epoch = epoch

    def _bind_ranks(self) -> None:
        """Take this process's rank from the process group, once it exists, if none was given."""
        self._own_core()
        if not self._auto_ranks:
            return
        dist = torch.distributed
        if not (dist.is_available() and dist.is_initialized()):
            return
        self._auto_ranks = False
        rank, world_size = dist.get_rank(), dist.get_world_size()
        if (rank, world_size) == (self.rank, self.world_size):
            return
        if self._user_batches is None:
            _check_world(world_size, self.packed)
        with self._iter_lock:
            self._core.stop(REBOUND)
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
        self._fetch_ahead()

    def __iter__(self) -> Iterator[list[torch.Tensor]]:
        """A new epoch's iterator; it replaces the previous one, whose ``next()`` then raises.

        One loader drives one DALI pipeline, so one iterator is live at a time: starting
        another (from any thread) ends the previous one, and its next ``next()`` raises
        :class:`LoaderError` saying so instead of ending its epoch early in silence.
        """
        self._bind_ranks()  # and a core of this process (after a fork)
        self._draw_as_a_dataloader_does()
        with self._iter_lock:
            if self._closed:
                raise LoaderError("this FastLoader is closed")
            run = start_epoch(self._core, self._epoch, self._resume_batch)
            return EpochIterator(
                run, owner=self, device=self.device, on_end=self._epoch_finished, is_closed=self._is_closed,
                length=self.__len__, collate=None if self.collate_fn is default_collate else self.collate_fn,
            )

    def _draw_as_a_dataloader_does(self) -> None:
        """Take from torch's random state what a DataLoader's ``iter()`` takes: its workers' base seed,
        and with ``shuffle=True`` its RandomSampler's seed (FastLoader's own order does not use them).

        So the rest of a script's random stream (a MixUp collate, dropout, augmentation in the loop)
        is the one it has under a DataLoader with the same seed.
        """
        torch.empty((), dtype=torch.int64).random_(generator=self.generator)
        if self._user_batches is None and self.shuffle:
            if self.generator is None:  # RandomSampler seeds its own generator from the global one
                torch.empty((), dtype=torch.int64).random_()
            else:  # it draws from the generator given: a permutation, and one more for the (empty) rest
                for _ in range(2):  # (torch.utils.data.RandomSampler.__iter__, read to its end)
                    torch.randperm(len(self.packed), generator=self.generator)

    def _fetch_ahead(self, *, started: bool = True) -> None:
        """Before the first epoch: a URL's dataset fetches the next ``iter()``'s shards, in its order, while
        the script sets up. Only with the loader's own order and a known rank (given, from the process
        group, or no ``torchrun``): another rank's order would fetch shards this node may never read."""
        prefetch = getattr(self.packed, "prefetch_epoch", None)
        if prefetch is None or (started and self._core.run is not None) or not isinstance(self._plan, EpochSampler):
            return
        if not (self._auto_ranks and int(os.environ.get("WORLD_SIZE", "1") or 1) > 1):  # torchrun, no group yet
            prefetch(self._plan.batches(self._epoch, self._resume_batch))

    def _is_closed(self) -> bool:
        return self._closed

    def _own_core(self) -> None:
        """After a ``fork``: a core of this process in place of the parent's (whose threads are not here).

        On the CPU the child gets a new pipeline and threads, at the position the loader stood at
        when it forked. CUDA cannot be used in a forked child of a process that used it.
        """
        if not self._core.forked:
            return
        self._iter_lock = threading.Lock()  # a lock the parent's threads held at the fork stays held here
        if self.device.type == "cuda":
            raise LoaderError(
                f"this FastLoader was made in process {self._core.pid} and is used in its forked child "
                f"{os.getpid()}: CUDA cannot be used after fork; make the loader in the child, or start "
                "the child with the 'spawn' method (multiprocessing.set_start_method('spawn'))"
            )
        self._finalizer.detach()  # the parent's core is never closed here
        self._core = self._make_core()
        self._finalizer = weakref.finalize(self, self._core.close)
        log.debug("FastLoader: a new DALI pipeline in forked child %d", os.getpid())

    def _epoch_finished(self, run: EpochRun) -> None:
        """An iterator reached the end of its epoch: the next one reads the following epoch.

        Only a finished epoch moves the loader on: ``next(iter(loader))`` to peek, or a
        ``break``, leaves the epoch that ``set_epoch`` (or the last finished one) chose.
        """
        with self._iter_lock:
            if (self._epoch, self._resume_batch) == (run.epoch, run.first):
                self._epoch, self._resume_batch = run.epoch + 1, 0
                self._plan.resumed = None

    # ------------------------------------------------------------------ resuming (fastload.resume)
    def _shape(self) -> Shape:
        """What this loader's states record of it, and what a state must match to resume here."""
        return Shape(
            seed=self.seed, num_samples=len(self.dataset), shuffle=self.shuffle,
            order="sampler" if self._user_batches is not None else self.order, block_size=self.block_size,
            window=self.window, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last,
            pad=self.pad,
        )  # fmt: skip

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
        return make_state(self._plan, self._shape(), epoch=epoch, done=done)

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
        return merge_states(states)

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
        plan = self._plan
        sampler = self._user_sampler if self._user_sampler is not None else getattr(plan, "batch_sampler", None)
        at = resume_position(state, plan, self._shape(), sampler_name=type(sampler).__name__)
        with self._iter_lock:
            self._core.stop(RESUMED)
            if isinstance(plan, SamplerPlan):
                plan.pending_state = at.sampler_state
            else:
                plan.resume(at.epoch, at.consumed)
            self._epoch, self._resume_batch = at.epoch, at.batch
        self._fetch_ahead()

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Stop the background thread and free the DALI pipeline (and its GPU memory). Idempotent."""
        with self._iter_lock:
            self._closed = True
        self._finalizer()
        if self._stop_fetching is not None:
            self._stop_fetching()

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


# FastLoader(...)'s signature is __init__'s (help(), IDEs, the drop-in checks), not __new__'s *args, **kwargs
FastLoader.__new__.__signature__ = inspect.signature(FastLoader.__init__)  # type: ignore[attr-defined]


def _annotated(dataset: Any) -> Any:
    """The :class:`fastload.annotated.AnnotatedPlan` of a COCO/VOC dataset, else None."""
    if dataset is None or isinstance(dataset, (str, os.PathLike, Dataset)):
        return None
    from .annotated import annotated_plan

    return annotated_plan(dataset)


def _names_boxes(fields: Any) -> bool:
    """Whether ``fields=`` asks for a ``boxes`` field (detection batches)."""
    return isinstance(fields, (list, tuple)) and "boxes" in fields


def _rebuild(init: dict[str, Any], epoch: int, resume_batch: int, resumed: tuple | None = None) -> FastLoader:
    loader = FastLoader(**init)
    loader._epoch, loader._resume_batch = epoch, resume_batch
    if resumed is not None:
        loader._plan.resume(*resumed)
    return loader
