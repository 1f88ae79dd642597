"""Detection batches: images resized (and flipped) with their boxes, as torchvision's detection models take them.

:class:`DetectionLoader` reads a packed dataset with a ``boxes`` field (``fastload pack IMAGES
OUT --annotations instances.json``, :func:`fastload.pack_coco`) and yields
``(images, targets)``: ``images`` one ``[B, 3, H, W]`` float tensor (0..1) when every image
of the batch has one size, else a list of ``[3, H, W]`` tensors; ``targets`` a list of dicts
``{"boxes": FloatTensor[N, 4], "labels": Int64Tensor[N], ...}`` on the loader's device,
exactly what ``fasterrcnn_*``, ``retinanet_*`` and ``ssd*`` accept in training and
evaluation. Decoding and the transforms run on the CPU (PIL, threads); see
``docs/detection.md`` for what is not there yet. Masks packed with ``--masks`` are cropped,
resized (nearest neighbour) and flipped with the pixels.

The transforms, in torchvision's detection terms:

* **crop** (``crop="iou"``: ``RandomIoUCrop``; ``crop="resized"``: ``RandomResizedCrop``'s
  window), boxes shifted into the window and clipped to it (:mod:`fastload.boxcrops`);
* **resize** keeping the aspect ratio (``GeneralizedRCNNTransform``): the scale is
  ``min(min_size / shorter side, max_size / longer side)``, the new size
  ``floor(side * scale)``, the boxes multiplied by ``new / old`` on each axis; or to a fixed
  ``size=(h, w)``;
* **sanitize** (``SanitizeBoundingBoxes``, on by default with a crop): boxes narrower or lower
  than ``min_box_size`` output pixels dropped with their labels and masks;
* **horizontal flip** with probability ``flip`` (``RandomHorizontalFlip``): pixels mirrored,
  each box ``x1, x2 -> W - x2, W - x1``. Each sample's draw is a pure function of
  ``(seed, epoch, sample index)`` (:func:`fastload.augment.uniforms`), as FastLoader's are.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import reprlib
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Iterator, Sequence

import numpy as np
import torch

from .augment import uniforms
from .boxcrops import CropSpec, Window, crop_boxes, crop_spec, sanitize_mask, window
from .dlcompat import rank_and_world
from .errors import ConfigError, CorruptDataError, as_int
from .imaging import pil_settings
from .reader import Dataset
from .augment.settings import MAX_SIDE
from .resume import Shape, make_state, resume_position
from .sampler import MAX_SEED, EpochSampler

#: Fields a target dict may hold besides ``boxes``: one row per box, or one value per image.
_PER_BOX_KINDS = ("ragged",)
_PER_IMAGE_KINDS = ("int", "label")


def resized_size(height: int, width: int, *, min_size: int, max_size: int) -> tuple[int, int]:
    """``(new_height, new_width)`` of an image resized as ``GeneralizedRCNNTransform`` resizes it."""
    scale = min(min_size / min(height, width), max_size / max(height, width))
    # torch's interpolate(scale_factor=s, recompute_scale_factor=True) takes floor(side * s)
    return max(1, math.floor(height * scale)), max(1, math.floor(width * scale))


def transform_boxes(boxes: np.ndarray, size: tuple[int, int], new_size: tuple[int, int], flip: bool) -> np.ndarray:
    """XYXY ``boxes`` of an image of ``size`` (h, w) moved to the image resized to ``new_size`` and
    mirrored if ``flip``."""
    (h, w), (nh, nw) = size, new_size
    out = boxes.astype(np.float32, copy=True)
    out[:, 0::2] *= np.float32(nw / w)
    out[:, 1::2] *= np.float32(nh / h)
    if flip:
        out[:, [0, 2]] = nw - out[:, [2, 0]]
    return out




@dataclasses.dataclass(frozen=True)
class Plan:
    """One sample's geometry, decided on the host before any pixel is touched.

    ``window`` (None: the whole image) is cut from the stored image, resized to ``new`` (h, w)
    and mirrored if ``flip``; ``boxes`` are the sample's boxes on the output, all of them, and
    ``keep`` which of them the target holds (None: all).
    """

    window: Window | None
    new: tuple[int, int]
    flip: bool
    boxes: np.ndarray
    keep: np.ndarray | None
    valid: np.ndarray | None = None


def fixed_size(size: Any) -> tuple[int, int] | None:
    """``size=`` as ``(height, width)``: an int is a square, as ``RandomResizedCrop(size)``'s."""
    if size is None:
        return None
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return as_int("size[0]", size[0], lo=1, hi=MAX_SIDE, hint=" (height)"), as_int("size[1]", size[1], lo=1, hi=MAX_SIDE, hint=" (width)")
    if isinstance(size, (list, tuple)):
        raise ConfigError(f"size must be an int or (height, width), got {reprlib.repr(size)}")
    s = as_int("size", size, lo=1, hi=MAX_SIDE, hint=" (pixels) or (height, width)")
    return s, s


def pil_geometry(im: Any, plan: Plan, resample: int) -> Any:
    """A PIL image cut to ``plan``'s window, resized to its output size with ``resample`` and mirrored."""
    from PIL import Image

    if plan.window is not None:
        w = plan.window
        im = im.crop((w.left, w.top, w.left + w.width, w.top + w.height))
    if (im.height, im.width) != plan.new:
        im = im.resize((plan.new[1], plan.new[0]), resample)
    if plan.flip:
        im = im.transpose(Image.FLIP_LEFT_RIGHT)
    return im


class DetectionLoader:
    """``(images, targets)`` batches of a packed detection dataset, boxes kept on their pixels.

    Args:
        dataset: a packed dataset directory with a ``boxes`` field (``float32[][4]``).
        batch_size: images per batch.
        fields: ``"image"``, ``"boxes"`` and any other fields to put in each target dict:
            per-box ``ragged`` fields (``labels``, ``iscrowd``: one row per box) and per-image
            ``int`` fields (``image_id``), and ``mask`` (packed with ``--masks``): ``masks``
            ``uint8 [N, H, W]`` for instance masks, ``mask`` ``int64 [H, W]`` for a semantic one.
            ``labels`` is always included when the dataset has it.
        shuffle: a new permutation of the samples every epoch (seeded by ``seed`` and the epoch).
        drop_last: leave out the last, smaller batch.
        min_size, max_size: the resize (``GeneralizedRCNNTransform``'s 800 and 1333 by default).
        size: resize to exactly ``(height, width)`` instead (an int: a square), as
            ``RandomResizedCrop(size)`` and SSD's 300x300 do; the aspect ratio is not kept.
        flip: probability of a horizontal flip (0.0 for evaluation).
        crop: None, ``"iou"`` (SSD's ``RandomIoUCrop``) or ``"resized"`` (``RandomResizedCrop``'s
            window), before the resize (:mod:`fastload.boxcrops`).
        scale, ratio: the crop's ranges: ``RandomIoUCrop``'s ``(min_scale, max_scale)`` and
            ``(min_aspect_ratio, max_aspect_ratio)``, default ``(0.3, 1.0)``, ``(0.5, 2.0)``;
            ``RandomResizedCrop``'s ``scale``, ``ratio``, default ``(0.08, 1.0)``, ``(3/4, 4/3)``.
        iou_options, iou_trials: ``RandomIoUCrop``'s ``sampler_options`` and ``trials``.
        sanitize: drop the boxes ``SanitizeBoundingBoxes(min_size=min_box_size)`` drops, with
            their labels, iscrowd and masks (default: with a crop). False keeps every box and adds
            ``valid`` (bool ``[N]``, what sanitizing would keep) to the target.
        min_box_size: the sanitizing's ``min_size`` in output pixels (``>= 1``, as torchvision's).
        backend: ``"pil"`` (decode and transform in threads) or ``"dali"``: the window decoded and
            resized by a DALI graph (:mod:`fastload.detdali`; ``mixed`` decoding on CUDA), boxes
            and masks moved on the host by the same numbers.
        seed: seeds the order, the crops and the flips.
        device: where the tensors go (``"cpu"``, ``"cuda"``, ``"cuda:N"``).
        num_threads: decoding threads (default: the cores, at most 8).
        rank, world_size: this process's share of each epoch (default: from torch.distributed):
            the epoch's order padded by its first samples to a multiple of ``world_size``, then
            every ``world_size``-th sample from ``rank``, as ``DistributedSampler`` shares it.

    Raises:
        ConfigError: an argument out of range, a field the dataset lacks, a dataset without boxes.

    The next batch is decoded in the threads while the current one is used (one batch ahead).
    """

    def __init__(
        self,
        dataset: str | os.PathLike,
        batch_size: int = 1,
        *,
        fields: Sequence[str] = ("image", "boxes"),
        shuffle: bool = False,
        drop_last: bool = False,
        min_size: int = 800,
        max_size: int = 1333,
        size: int | tuple[int, int] | None = None,
        flip: float = 0.0,
        crop: str | None = None,
        scale: tuple[float, float] | None = None,
        ratio: tuple[float, float] | None = None,
        iou_options: Sequence[float] | None = None,
        iou_trials: int | None = None,
        sanitize: bool | None = None,
        min_box_size: float = 1.0,
        backend: str = "pil",
        seed: int = 0,
        device: str | torch.device = "cpu",
        num_threads: int | None = None,
        rank: int | None = None,
        world_size: int | None = None,
    ) -> None:
        self.batch_size = as_int("batch_size", batch_size, lo=1)
        self.min_size = as_int("min_size", min_size, lo=1, hi=MAX_SIDE)
        self.max_size = as_int("max_size", max_size, lo=1, hi=MAX_SIDE)
        if self.max_size < self.min_size:
            raise ConfigError(f"max_size={self.max_size} is below min_size={self.min_size}; the longer side caps the shorter")
        self.size = fixed_size(size)
        if isinstance(flip, bool) or not isinstance(flip, (int, float)) or not 0.0 <= flip <= 1.0:
            raise ConfigError(f"flip must be a probability in [0, 1], got {reprlib.repr(flip)}")
        for name, v in (("shuffle", shuffle), ("drop_last", drop_last)):
            if not isinstance(v, bool):
                raise ConfigError(f"{name} must be True or False, got {reprlib.repr(v)}")
        self.crop: CropSpec | None = crop_spec(crop, scale=scale, ratio=ratio, iou_options=iou_options, iou_trials=iou_trials)
        if sanitize is not None and not isinstance(sanitize, bool):
            raise ConfigError(f"sanitize must be True, False or None (with a crop), got {reprlib.repr(sanitize)}")
        self.sanitize = self.crop is not None if sanitize is None else sanitize
        self.flag_valid = sanitize is False
        if isinstance(min_box_size, bool) or not isinstance(min_box_size, (int, float)) or not 1.0 <= min_box_size < math.inf:
            raise ConfigError(f"min_box_size must be a number >= 1 (output pixels, as SanitizeBoundingBoxes' min_size), got {reprlib.repr(min_box_size)}")
        self.min_box_size = float(min_box_size)
        self.seed = as_int("seed", seed, lo=0, hi=MAX_SEED)
        try:
            self.device = torch.device(device)
        except (RuntimeError, TypeError):
            raise ConfigError(f"device: {reprlib.repr(device)} is not a torch device (use 'cpu', 'cuda' or 'cuda:N')") from None
        self.num_threads = min(8, os.cpu_count() or 1) if num_threads is None else as_int("num_threads", num_threads, lo=1)
        self.flip, self.shuffle, self.drop_last = float(flip), shuffle, drop_last
        self.rank, self.world_size = rank_and_world(rank, world_size)
        self.dataset = Dataset(dataset.path if isinstance(dataset, Dataset) else dataset, check=True)
        self.targets = self._check_fields(fields)
        if backend not in ("pil", "dali"):
            raise ConfigError(f"backend must be 'pil' or 'dali', got {reprlib.repr(backend)}")
        self.backend = backend
        self._dali = None
        if backend == "dali":
            from .detdali import DaliImages

            m = self.dataset.manifest
            self._dali = DaliImages(batch_size=self.batch_size, num_threads=self.num_threads, device=self.device, stats=m.stats, max_pixels=m.max_pixels)
        # the order, its shares among ranks and the resume state are FastLoader's own (fastload.sampler, fastload.resume)
        self._plan = EpochSampler(num_samples=len(self.dataset), batch_size=self.batch_size, shuffle=shuffle,
                                  drop_last=drop_last, seed=self.seed, rank=self.rank, world_size=self.world_size)  # fmt: skip
        self.epoch = 0
        self._done = 0  # batches of self.epoch served
        self._resume_batch = 0  # where the next iteration starts (load_state_dict), as FastLoader's

    def _check_fields(self, fields: Any) -> tuple[str, ...]:
        schema = self.dataset.schema
        have = ", ".join(schema.names)
        coco = self.dataset.manifest.options.get("coco") if isinstance(self.dataset.manifest.options, dict) else None
        self.mask_mode = coco.get("masks") if isinstance(coco, dict) else None
        if isinstance(fields, str) or not isinstance(fields, (list, tuple)):
            raise ConfigError(f"fields must be a tuple of field names such as ('image', 'boxes'), got {reprlib.repr(fields)}")
        if "boxes" not in schema.names or schema["boxes"].kind != "ragged" or schema["boxes"].shape != (4,):
            raise ConfigError(f"dataset {self.dataset.path} has no 'boxes' field of kind float32[][4] (it has {have}); pack it with --annotations")
        for n in ("image", "boxes"):
            if n not in fields:
                raise ConfigError(f"fields must include {n!r} (got {tuple(fields)})")
        names = [n for n in fields if n != "image"]
        if "labels" in schema.names and "labels" not in names:
            names.append("labels")
        for n in names:
            if not isinstance(n, str) or n not in schema.names:
                raise ConfigError(f"fields: {reprlib.repr(n)} is not a field of this dataset (it has {have})")
            if names.count(n) > 1:
                raise ConfigError(f"fields: {n!r} is asked for twice")
            if n == "mask":
                if self.mask_mode not in ("instance", "semantic"):
                    raise ConfigError(f"fields: 'mask' is not a mask this loader knows (the dataset's options.coco.masks is {self.mask_mode!r}); pack with --masks")
                continue
            if schema[n].kind not in _PER_BOX_KINDS + _PER_IMAGE_KINDS:
                raise ConfigError(f"fields: {n!r} is a {schema[n].spec} field; a target holds per-box ragged fields and per-image ints only")
        return tuple(names)

    def set_epoch(self, epoch: int) -> None:
        """Use epoch ``epoch``'s order, crops and flips on the next iteration, from its start (as
        ``DistributedSampler.set_epoch``)."""
        self.epoch = as_int("epoch", epoch, lo=0)
        self._done = self._resume_batch = 0
        self._plan.resume(None)

    def __len__(self) -> int:
        return len(self._plan)

    def order(self, epoch: int) -> np.ndarray:
        """This rank's sample indices of one epoch (from its start), in the order they are served."""
        return np.concatenate([b.indices for b in self._plan.batches(epoch)] or [np.empty(0, dtype=np.int64)])

    def _shape(self) -> Shape:
        return Shape(seed=self.seed, num_samples=len(self.dataset), shuffle=self.shuffle, order="global", block_size=None,
                     window=None, batch_size=self.batch_size, world_size=self.world_size, drop_last=self.drop_last, pad=True)  # fmt: skip

    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as FastLoader's :meth:`~fastload.FastLoader.state_dict` says it (the same
        layout, ``fastload.resume``): taken inside a loop after batch ``k`` was handed out, ``batches_done`` is
        ``k + 1``; after a whole epoch it is the next epoch with 0 done. The crops and flips are functions of
        ``(seed, epoch, sample)``, so the position alone says what the rest of the epoch holds."""
        return make_state(self._plan, self._shape(), epoch=self.epoch, done=self._done)

    def load_state_dict(self, state: Any) -> None:
        """Resume where ``state`` stood, on this world size and batch size or others, as FastLoader resumes.

        Raises:
            ConfigError: not a state of this layout, or one saved by a loader whose order differs
                (seed, dataset size, shuffle), naming the field.
        """
        at = resume_position(state, self._plan, self._shape(), sampler_name="")
        self._plan.resume(at.epoch, at.consumed)
        self.epoch, self._done = at.epoch, at.batch
        self._resume_batch = at.batch

    def __iter__(self) -> Iterator[tuple[Any, list[dict[str, torch.Tensor]]]]:
        """A new pass over the current epoch, from its start (or where :meth:`load_state_dict` put it), as
        FastLoader's: an iterator dropped early does not move the next one's start."""
        epoch, skip = self.epoch, self._resume_batch
        self._resume_batch = 0
        return self._batches(epoch, skip)

    def _batches(self, epoch: int, skip: int) -> Iterator[tuple[Any, list[dict[str, torch.Tensor]]]]:
        planned = list(self._plan.batches(epoch, skip))
        with ThreadPoolExecutor(self.num_threads, thread_name_prefix="fastload-detect") as pool, ThreadPoolExecutor(
            1, thread_name_prefix="fastload-detect-graph"
        ) as graph, pil_settings():

            def submit(b: Any) -> Callable[[], list]:
                idx = b.indices.tolist()
                fl = [bool(f) for f in uniforms(self.seed, epoch, b.indices, 1)[:, 0] < self.flip]
                if self._dali is not None:
                    return graph.submit(self._dali_batch, pool, idx, fl, epoch).result
                futs: list[Future] = [pool.submit(self._sample, i, epoch, f) for i, f in zip(idx, fl)]
                return lambda: [f.result() for f in futs]

            pending = submit(planned[0]) if planned else None
            for k, b in enumerate(planned):
                ahead = submit(planned[k + 1]) if k + 1 < len(planned) else None  # the next batch decodes while this one is used
                batch = self._collate(pending())
                self._done = b.number + 1
                yield batch
                pending = ahead
        self._plan.resume(None)
        self.epoch, self._done = epoch + 1, 0

    def plan(self, boxes: np.ndarray, size: tuple[int, int], index: int, epoch: int, flip: bool) -> Plan:
        """Sample ``index``'s crop window, output size and boxes in ``epoch`` (an image of ``size``, h, w)."""
        win = window(self.crop, boxes, *size, seed=self.seed, epoch=epoch, index=index)
        cut = size if win is None else (win.height, win.width)
        b = boxes if win is None else crop_boxes(boxes, win)
        new = self.size or resized_size(*cut, min_size=self.min_size, max_size=self.max_size)
        out = transform_boxes(b, cut, new, flip)
        if not (self.sanitize or self.flag_valid):
            return Plan(win, new, flip, out, None)
        # ClampBoundingBoxes: a box clipped to the window's edge, scaled in float32, can end an ulp
        # past the output's edge (39 * (80 / 39) = 80.00001), which the sanitizing would drop
        np.clip(out[:, 0::2], 0, new[1], out=out[:, 0::2])
        np.clip(out[:, 1::2], 0, new[0], out=out[:, 1::2])
        ok = sanitize_mask(out, new, min_size=self.min_box_size)
        return Plan(win, new, flip, out, ok if self.sanitize else None, None if self.sanitize else ok)

    def _read(self, index: int, epoch: int, flip: bool) -> tuple[dict[str, Any], Plan, tuple[int, int], str]:
        """Sample ``index``'s field values and plan, its size taken from the record header (DALI path)."""
        values = self.dataset.fields(index, ("image", *self.targets))
        header = self.dataset.header(index)
        size = (int(header.height), int(header.width))
        return values, self.plan(values["boxes"], size, index, epoch, flip), size, self.dataset.where(index)

    def _dali_batch(self, pool: ThreadPoolExecutor, idx: list[int], flips: list[bool], epoch: int) -> list[tuple[torch.Tensor, dict[str, torch.Tensor]]]:
        """One batch's images through the DALI graph and its targets on the host threads."""
        items = list(pool.map(self._read, idx, [epoch] * len(idx), flips))
        wins = []
        for _, plan, (h, w), _ in items:
            win = plan.window
            wins.append((0, 0, w, h) if win is None else (win.left, win.top, win.width, win.height))
        payloads = [np.frombuffer(v["image"], np.uint8) for v, _, _, _ in items]
        try:
            images = self._dali.run(payloads, wins, [p.new for _, p, _, _ in items], flips)
        except RuntimeError as e:
            where = "; ".join(w for _, _, _, w in items)
            raise CorruptDataError(f"a batch did not decode through DALI ({where}): {str(e).splitlines()[0] if str(e) else type(e).__name__}") from None
        targets = list(pool.map(lambda it: self.target(it[0], it[1], it[2], it[3]), items))
        return list(zip(images, targets))

    def _sample(self, index: int, epoch: int, flip: bool) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One sample decoded, cropped, resized and flipped, with its target (on the CPU)."""
        from PIL import Image

        values = self.dataset.fields(index, ("image", *self.targets))
        where = self.dataset.where(index)
        try:
            with Image.open(io.BytesIO(values["image"])) as im:
                rgb = im.convert("RGB")
        except Exception as e:  # noqa: BLE001 - an image that passed packing but no longer decodes
            raise CorruptDataError(f"{where}: the image does not decode ({type(e).__name__}: {e})") from None
        size = (rgb.height, rgb.width)
        plan = self.plan(values["boxes"], size, index, epoch, flip)
        rgb = pil_geometry(rgb, plan, Image.BILINEAR)
        image = torch.from_numpy(np.asarray(rgb).copy()).permute(2, 0, 1)
        return image, self.target(values, plan, size, where)

    def target(self, values: dict[str, Any], plan: Plan, size: tuple[int, int], where: str) -> dict[str, torch.Tensor]:
        """The target dict of one sample's field ``values`` moved as ``plan`` moves its pixels."""
        n_boxes = values["boxes"].shape[0]
        keep = plan.keep
        target = {"boxes": torch.from_numpy(plan.boxes if keep is None else plan.boxes[keep])}
        for n in self.targets:
            if n == "mask":
                target.update(self._mask(values[n], size, plan, n_boxes, where))
                continue
            if n == "boxes":
                continue
            v = values[n]
            if isinstance(v, np.ndarray):
                if v.shape[0] != n_boxes:
                    raise CorruptDataError(f"{where}: field {n!r} has {v.shape[0]} rows for {n_boxes} boxes")
                v = v if keep is None else v[keep]
                target[n] = torch.from_numpy(v.astype(np.int64) if v.dtype.kind in "iu" else v)
            else:
                target[n] = torch.tensor(int(v), dtype=torch.int64)
        if plan.valid is not None:
            target["valid"] = torch.from_numpy(plan.valid)
        return target

    def _mask(self, png: bytes, size: tuple[int, int], plan: Plan, n_boxes: int, where: str) -> dict[str, torch.Tensor]:
        """The sample's label image cropped, resized (nearest neighbour) and flipped as its pixels:
        ``masks`` ``uint8 [N, H, W]`` (instance, the kept boxes') or ``mask`` ``int64 [H, W]`` (semantic)."""
        from PIL import Image

        try:
            with Image.open(io.BytesIO(png)) as im:
                im.load()
                lab = im
        except Exception as e:  # noqa: BLE001
            raise CorruptDataError(f"{where}: the mask does not decode ({type(e).__name__}: {e})") from None
        if (lab.height, lab.width) != size:
            raise CorruptDataError(f"{where}: the mask is {lab.width}x{lab.height}, the image {size[1]}x{size[0]}")
        arr = np.asarray(pil_geometry(lab, plan, Image.NEAREST)).astype(np.int64)
        if self.mask_mode == "semantic":
            return {"mask": torch.from_numpy(arr)}
        ids = np.arange(1, n_boxes + 1) if plan.keep is None else np.flatnonzero(plan.keep) + 1
        masks = arr[None, :, :] == ids[:, None, None]
        return {"masks": torch.from_numpy(masks.astype(np.uint8))}

    def _collate(self, samples: list[tuple[torch.Tensor, dict[str, torch.Tensor]]]) -> tuple[Any, list[dict[str, torch.Tensor]]]:
        images = [im.to(self.device).float().div_(255) for im, _ in samples]
        targets = [{k: v.to(self.device) for k, v in t.items()} for _, t in samples]
        if len({tuple(im.shape) for im in images}) == 1:
            return torch.stack(images), targets
        return images, targets

    def __repr__(self) -> str:
        return (
            f"DetectionLoader({os.fspath(self.dataset.path)!r}, {self.batch_size}, min_size={self.min_size}, "
            f"max_size={self.max_size}, flip={self.flip}, crop={None if self.crop is None else self.crop.kind!r}, "
            f"shuffle={self.shuffle}, device='{self.device}')"
        )


#: FastLoader keywords a detection loader takes (the rest are refused, naming them).
_TAKEN = ("fields", "shuffle", "drop_last", "min_size", "max_size", "size", "flip", "crop", "scale", "ratio", "iou_options",
          "iou_trials", "sanitize", "min_box_size", "backend", "seed", "device", "num_threads", "rank", "world_size")



def detection_loader(dataset: Any, batch_size: int = 1, shuffle: bool | None = None, *args: Any, **kwargs: Any) -> DetectionLoader:
    """The :class:`DetectionLoader` that ``FastLoader(dataset, batch_size, fields=(..., "boxes"), ...)`` gives.

    Takes FastLoader's ``shuffle``, ``drop_last``, ``seed``, ``device`` (None: CUDA if present),
    ``num_threads``, ``flip``, ``crop`` (``"iou"`` or ``"resized"`` with boxes), ``scale`` and ``ratio``,
    plus :class:`DetectionLoader`'s ``min_size``, ``max_size``, ``size``, ``iou_options``,
    ``iou_trials``, ``sanitize`` and ``min_box_size``.

    Raises:
        ConfigError: a positional argument after ``shuffle``, or a FastLoader keyword the detection
            path does not have yet (crops, normalisation, samplers: ``docs/detection.md``).
    """
    if args:
        raise ConfigError("FastLoader(fields=(..., 'boxes')): give sampler, collate_fn and the rest by keyword (the detection path takes dataset, batch_size, shuffle)")
    given = {k: v for k, v in kwargs.items() if v is not None and k not in _TAKEN}
    if given:
        raise ConfigError(
            f"FastLoader(fields=(..., 'boxes')): {', '.join(f'{k}={reprlib.repr(v)}' for k, v in given.items())} "
            f"not supported with boxes yet; the detection path takes {', '.join(_TAKEN)} (docs/detection.md)"
        )
    if isinstance(dataset, Dataset):
        dataset = dataset.path
    opts = {k: v for k, v in kwargs.items() if v is not None}
    if opts.get("device") is None:
        opts["device"] = "cuda" if torch.cuda.is_available() else "cpu"
    return DetectionLoader(dataset, batch_size, shuffle=False if shuffle is None else shuffle, **opts)


__all__ = ["DetectionLoader", "Plan", "detection_loader", "fixed_size", "pil_geometry", "resized_size", "transform_boxes"]
