"""The DALI-facing core of a loader: its pipeline, the callback that feeds it, and the sample a failed batch names.

A :class:`Core` is what the epoch thread (:mod:`fastload.epochs`) and DALI's callback
hold: the dataset, the settings, the pipeline and the current run. Never the
``FastLoader``, so that a loader nobody references is collected; its finaliser then
calls :meth:`Core.close`, and so does an exit hook for the cores still alive, registered
right after DALI is imported: atexit runs hooks last-in first-out, so ours runs before
DALI's own shutdown of its pipelines, while no fastload thread may still be running one.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import dataclasses
import os
import threading
import weakref
from typing import Any, Sequence

import numpy as np
import torch

from .augment import eval_params, train_params, view_seed
from .errors import FastloadError, FormatError, LoaderError
from .format import DEFAULT_MAX_PIXELS
from .augment.stage import GraphStage, note_gpu_hue
from .pipeline import GraphSpec, build_augment_pipeline, build_pipeline, decoder_sizing, encoded_batch, import_dali
from .reader import Dataset, ReadAhead
from .augment.settings import Augment
from .threads import probe

_LIVE_CORES: "weakref.WeakSet[Core]" = weakref.WeakSet()
_EXIT_HOOK: list[bool] = []
#: In a forked child: the parent's cores, kept and never closed. Their threads do not exist here, and
#: shutting down or freeing their DALI pipelines (DALI's own exit hook does both) crashes the child.
_ABANDONED: list["Core"] = []


def _abandon(pipe: Any) -> None:
    """Leave a parent's DALI pipeline alone in a forked child: out of DALI's exit hook, and never freed."""
    registry = getattr(type(pipe), "_pipes", None)  # nvidia.dali.Pipeline's weak set, shut down at exit
    if isinstance(registry, set):
        registry.discard(weakref.ref(pipe))
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(pipe))  # not even interpreter teardown frees it


def _after_fork_in_child() -> None:
    for core in list(_LIVE_CORES):
        if core.pipe is not None:
            _abandon(core.pipe)
        _ABANDONED.append(core)
    _LIVE_CORES.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _close_live_cores() -> None:
    for core in list(_LIVE_CORES):
        with contextlib.suppress(Exception):
            core.close()


def register_exit_hook() -> None:
    """Import DALI (a DependencyError if it fails), then close every live core at interpreter exit, before
    DALI's own exit hooks run (see the module docstring)."""
    import_dali()
    if not _EXIT_HOOK:
        atexit.register(_close_live_cores)
        _EXIT_HOOK.append(True)


def _stage(augment: Augment) -> GraphStage | None:
    """The training graph's augmentation stage for ``augment``, or None when it has nothing to do."""
    stage = GraphStage(augment)
    return stage if stage.active else None


def _normalisation(augment: Augment) -> tuple[list[float] | None, list[float] | None, str]:
    """The graph's mean and std (0..255 units; None for uint8) and output dtype name of ``augment``."""
    if augment.mean is None:
        return None, None, "uint8"
    mean = [m * 255.0 for m in augment.mean]
    std = [s * 255.0 for s in augment.std]  # type: ignore[union-attr]
    return mean, std, "float16" if augment.out_dtype == torch.float16 else "float32"


#: The most pixels an evaluation resize may produce for one image (format.DEFAULT_MAX_PIXELS, PIL's bomb limit).
MAX_RESIZE_PIXELS = DEFAULT_MAX_PIXELS

#: Why an iterator ended before its epoch did: what its next ``next()`` raises (a LoaderError).
SUPERSEDED = (
    "this FastLoader iterator was ended by a newer iter() of the same loader (one live iterator "
    "per loader): iterate it from one place, or make one FastLoader per consumer"
)
CLOSED = "this FastLoader was closed while it was being iterated: its epoch was not read to its end"
RESUMED = (
    "this FastLoader iterator was ended by load_state_dict(), which moved the loader to the saved position: "
    "call iter(loader) again to read on from there"
)
RETRANSFORMED = (
    "this FastLoader iterator was ended when its dataset's transform was replaced: call iter(loader) "
    "again to read with the new transform"
)
REBOUND = (
    "this FastLoader iterator was ended when the loader took its rank from the process group that was "
    "initialised after iter(): call iter(loader) again (or create the process group before iterating)"
)


class Core:
    """What the background thread and DALI's callback hold: settings, dataset, pipeline, current run.

    Args:
        dataset: the packed dataset read.
        plan: the epoch plan (:class:`fastload.sampler.EpochSampler` or a user's sampler's plan).
        max_batch: the largest batch the plan gives (the pipeline's batch size).
        labels: every sample's label, as the loader yields them.
        device: where batches are made.
        augment: what is done to each image.
        num_threads, prefetch, seed, hw_decoder_load: the loader's settings of those names.
        views: a multi-view transform's :class:`~fastload.multiview.MultiView` (``augment`` its first view's), or
            None: one output per view, each view's draws from :func:`~fastload.augment.draws.view_seed`.
    """

    #: ``FastLoader(fields=...)``'s :class:`fastload.fieldbatch.FieldRequest`, or None (batches ``[images, labels]``)
    fields: Any = None

    def __init__(
        self, *, dataset: Dataset, plan: Any, max_batch: int, labels: np.ndarray, device: torch.device,
        augment: Augment, num_threads: int, prefetch: int, seed: int, hw_decoder_load: float | None,
        views: Any = None,
    ) -> None:  # fmt: skip
        self.dataset, self.plan, self.max_batch, self.labels = dataset, plan, max_batch, labels
        self.device, self.augment = device, augment
        self.num_threads, self.prefetch, self.seed, self.hw_decoder_load = num_threads, prefetch, seed, hw_decoder_load
        self.train, self.crop, self.resize = augment.train, augment.crop, augment.resize_side
        self.mean, self.std, self.dtype = augment.mean, augment.std, augment.out_dtype
        self.channels_last = augment.channels_last
        self.interpolation = augment.interpolation
        # CPU training batches are resized and normalised on the host (faster than DALI's CPU resize)
        self.views: tuple[Augment, ...] | None = None if views is None else tuple(views.views)
        self.stages = None if self.views is None else [_stage(a) for a in self.views]
        self.stage = _stage(augment) if self.train and self.views is None else None
        if device.type == "cuda":
            note_gpu_hue([self.stage, *(self.stages or [])])
        # CPU training crops are resized (and flipped) on the host, in one GIL-free call per batch
        # (fastload.host.finish_crops: torch's port of pillow-simd's resize, PIL's pixels, 7x cheaper than
        # DALI's CPU resize); then normalised there, or, when augmented, through the stage's own CPU graph
        self.host_finish = self.device.type == "cpu" and self.train and augment.pad_crop is None
        self.augment_pipe: Any = None  # host_finish with a stage or views: the stage's CPU graph (build_augment_pipeline)
        self.augment_feed: tuple | None = None  # its next batch (augment_source)
        self.pads = (0, 0, 0, 0)  # what the graph pads a RandomCrop's image by (its non-constant modes)
        if augment.pad_crop is not None and augment.pad_crop.mode != "constant":
            from .augment.padcrop import static_pads

            self.pads = static_pads(augment.pad_crop, self.crop, self.dataset.manifest.stats or {})
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.pipe: Any = None
        self.run: Any = None  # the fastload.epochs.EpochRun producing now
        # the records of the next batches are asked for from a few threads, ahead of DALI (cold data)
        # (records fetched one by one from a store are dropped from the node cache once read)
        drop = getattr(getattr(self.dataset, "remote", None), "fetch", None) == "records"
        self.read_ahead = ReadAhead(self.dataset, threads=4, depth=max(2, self.prefetch + 2), evict=drop)
        self.decode_pool: Any = None  # fastload.host.DecodePool
        self.decode_pool_pid = 0
        # each training batch's stage inputs are drawn in the decode pool, a few batches before DALI asks for it
        # (EpochRun.feeds): off the epoch thread, which on a GPU feeds DALI and on the CPU finishes the crops
        self.draws_ahead = self.train and (self.stage is not None or self.views is not None)
        if self.host_finish or self.draws_ahead:
            self._start_decode_pool()
        self.closed = False
        self.lock = threading.Lock()
        self.pid = os.getpid()  # the process whose threads and pipeline these are
        _LIVE_CORES.add(self)

    @property
    def forked(self) -> bool:
        """Whether this is a forked child's copy of a parent's core (nothing of it works here)."""
        return self.pid != os.getpid()

    def _start_decode_pool(self) -> None:
        """The pool that draws each augmented batch's stage inputs (``draws_ahead``, any device) and decodes CPU
        training crops far larger than the output at reduced scale.

        For the decodes, only when the dataset's largest images are big enough for one. They take DALI's
        decoding of those samples over, so it has as many threads as DALI's CPU decoder (which decodes
        16x16 placeholders for them meanwhile).
        """
        from PIL import Image

        from .host import REDUCED_SCALE_RATIO, DecodePool

        # PIL's plugins imported now, not first in a background thread: their namedtuples are
        # made with eval(), which resets CPython's note of an uncaught Ctrl-C (exit 1, not 130)
        Image.preinit()
        # The pool's threads start here, never in the epoch thread: a new thread may run the
        # collector, and so this core's finaliser, before start() returns to its starter.
        st = self.dataset.manifest.stats if isinstance(self.dataset.manifest.stats, dict) else {}
        sides = [st.get(k, {}).get("max") if isinstance(st.get(k), dict) else None for k in ("width", "height")]
        # an augmented recipe's pool (on every device) also draws each batch's stage inputs (stage_feed_job)
        if self.stage is not None or self.views is not None or all(v is None or v >= REDUCED_SCALE_RATIO * self.crop for v in sides):
            self.decode_pool, self.decode_pool_pid = DecodePool(self.num_threads), os.getpid()

    def stop(self, why: str) -> None:
        """End the current run, if any; its iterator's next ``next()`` raises a LoaderError saying ``why``."""
        if self.forked:
            return  # the parent's run: its thread does not exist here
        with self.lock:
            self.stop_locked(why)

    def stop_locked(self, why: str) -> None:
        """:meth:`stop` with :attr:`lock` held by the caller."""
        run, self.run = self.run, None
        if run is not None:
            if not run.finished:
                run.ended_by = why
            run.shutdown()

    def close(self) -> None:
        """Stop the thread, free the pipeline and the stream. Idempotent; run by the finaliser.

        In a forked child it does nothing: the parent's core is kept as it is (see ``_ABANDONED``).
        """
        if self.forked:
            return
        with self.lock:
            if self.closed:
                return
            self.closed = True
            self.stop_locked(CLOSED)
            self.read_ahead.close()
            pool, self.decode_pool = self.decode_pool, None
            if pool is not None:  # not waited for: the finaliser may run in one of its threads
                pool.close()
            self.pipe = self.augment_pipe = None  # DALI frees its buffers (and GPU memory) with the pipeline
            if self.stream is not None:
                with contextlib.suppress(Exception):
                    self.stream.synchronize()  # this stream only: the copies in flight
                self.stream = None

    def graph_spec(self) -> GraphSpec:
        """What :meth:`build` builds the DALI pipeline from: these settings on this core's device."""
        gpu = self.device.type == "cuda"
        mean, std, out = _normalisation(self.augment)
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
            interpolation=self.interpolation,
            stage=self.stage,
            pad_crop=self.augment.pad_crop,
            pads=self.pads,
            channels=self.augment.channels,
            # the mixed decoder's buffers, sized from the dataset's recorded image sizes
            **decoder_sizing(self.dataset.manifest.stats, max_pixels=self.dataset.manifest.max_pixels).fields(),
        )
        if self.views is not None:  # one spec per view: its crop, filter, normalisation and stage
            spec = dataclasses.replace(spec, views=tuple(
                dataclasses.replace(spec, crop=a.crop, interpolation=a.interpolation, stage=st, **dict(zip(("mean", "std", "out_dtype"), _normalisation(a))))
                for a, st in zip(self.views, self.stages)
            ))  # fmt: skip
        return spec

    def build(self):
        """The DALI pipeline for these settings, fed by :meth:`source`."""
        spec = self.graph_spec()
        # DALI aborts the process when it cannot start a thread: ask for as many first (measured: a
        # CPU pipeline of N threads starts 2N + 3; the epoch thread and a margin on top)
        probe(2 * self.num_threads + 8, what=f"the DALI pipeline ({self.num_threads} CPU threads)")
        try:
            if self.host_finish and (self.stage is not None or self.views is not None):
                self.augment_pipe = build_augment_pipeline(spec, self.augment_source)
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
            enc[k] = placeholder_jpeg()
            widths[k], heights[k] = PLACEHOLDER_SIDE, PLACEHOLDER_SIDE
        if not self.train:
            sizes, corners = eval_params(widths, heights, resize=self.resize, crop=self.crop)
            self._refuse_huge_resizes(run, batch, enc, widths, heights, sizes, corners)
            return (encoded_batch(enc), sizes, corners)
        feed = run.feeds.pop(batch.number, None)  # its stage inputs' future (draws_ahead), else None
        if self.views is not None and self.host_finish:  # the windows to DALI; flips and stage inputs to the host
            windows, flips = self._views_windows(run.epoch, batch.positions, widths, heights)
            run.flips.append((flips, {}, feed))
            return (encoded_batch(enc), *windows)
        if self.views is not None:
            return (encoded_batch(enc), *self._views_feed(run.epoch, batch.positions, widths, heights, run.drawn(feed)))
        a = self.augment
        if a.pad_crop is not None:
            return self._pad_crop_feed(run, batch, enc, widths, heights, feed)
        boxes, flips = train_params(
            widths, heights, seed=self.seed, epoch=run.epoch, positions=batch.positions,
            scale=a.scale, ratio=a.ratio, flip=a.flip,
        )  # fmt: skip
        # The per-sample parameters go to DALI as dense [n, k] arrays (one batch, one conversion),
        # not lists of n small arrays: DALI checks each list item in Python (about 6 us each).
        anchors, shapes = np.ascontiguousarray(boxes[:, :2]), np.ascontiguousarray(boxes[:, 2:])
        if self.host_finish:
            run.flips.append((flips, self._submit_reduced(enc, boxes, widths, heights, anchors, shapes, rb.errors), feed))
            return (encoded_batch(enc), anchors, shapes)
        if self.stage is not None:
            return (encoded_batch(enc), anchors, shapes, flips, *run.drawn(feed))
        return (encoded_batch(enc), anchors, shapes, flips)

    def _pad_crop_feed(self, run: Any, batch: Any, enc: list, widths, heights, feed: Any) -> tuple:
        """A RandomCrop batch's inputs: the windows' corners (:func:`~fastload.augment.padcrop.pad_crop_params`)."""
        from .augment.padcrop import pad_crop_params

        a = self.augment
        corners, flips, small = pad_crop_params(
            widths, heights, pc=a.pad_crop, crop=self.crop, seed=self.seed, epoch=run.epoch, positions=batch.positions,
            flip=a.flip,
        )  # fmt: skip
        for k in np.flatnonzero(small).tolist():  # torchvision raises there: so does the batch, at its turn
            if batch.number not in run.errors:
                run.errors[batch.number] = LoaderError(
                    f"{self.dataset.where(int(batch.indices[k]))}: its {int(widths[k])}x{int(heights[k])} image, padded, "
                    f"is smaller than RandomCrop's {self.crop}x{self.crop} window (torchvision raises too); give "
                    "RandomCrop pad_if_needed=True"
                )
        shapes = np.full((len(flips), 2), float(self.crop), dtype=np.float32)
        if self.stage is not None:
            return (encoded_batch(enc), corners, shapes, flips, *run.drawn(feed))
        return (encoded_batch(enc), corners, shapes, flips)

    def _view_boxes(self, v: int, epoch: int, positions: np.ndarray, widths: np.ndarray, heights: np.ndarray) -> tuple:
        """View ``v``'s crop windows (anchors ``[n, 2]``, shapes ``[n, 2]``) and flips, drawn from its own seed."""
        a = self.views[v]
        boxes, flips = train_params(widths, heights, seed=view_seed(self.seed, v), epoch=epoch, positions=positions,
                                    scale=a.scale, ratio=a.ratio, flip=a.flip)  # fmt: skip
        return np.ascontiguousarray(boxes[:, :2]), np.ascontiguousarray(boxes[:, 2:]), flips

    def _views_feed(self, epoch: int, positions: np.ndarray, widths: np.ndarray, heights: np.ndarray, fed: list) -> list:
        """Per view: its crop windows and flips, drawn from its own seed (view 0's: the loader's), then its stage
        inputs (``fed``: :meth:`stage_feed`'s per-view lists)."""
        out: list = []
        for v, inputs in enumerate(fed):
            out += [*self._view_boxes(v, epoch, positions, widths, heights), *inputs]
        return out

    def _views_windows(self, epoch: int, positions: np.ndarray, widths: np.ndarray, heights: np.ndarray) -> tuple:
        """For the host finish: every view's windows (anchors, shapes, in view order) and its flips (one array each)."""
        windows: list = []
        flips: list = []
        for v in range(len(self.views)):
            anchors, shapes, f = self._view_boxes(v, epoch, positions, widths, heights)
            windows += [anchors, shapes]
            flips.append(f)
        return windows, flips

    def augment_source(self) -> tuple:
        """The stage graph's callback: the host-finished batch the epoch thread set before its ``run()``."""
        feed, self.augment_feed = self.augment_feed, None
        if feed is None:
            raise StopIteration
        return feed

    def stage_feed_job(self, epoch: int, positions: np.ndarray) -> Any:
        """:meth:`stage_feed` as a future from the decode pool, drawn while the epoch thread drives DALI (and, on the
        CPU, finishes crops): beside a training loop that holds the GIL the draws' GIL hand-offs cost more than the
        draws, and DeiT's pixel noise alone takes 18 ms a batch of 256; computed here, done, where there is no pool."""
        from concurrent.futures import Future

        if not (self.closed or self.decode_pool is None or self.decode_pool_pid != os.getpid()):
            with contextlib.suppress(RuntimeError):  # closed meanwhile: drawn here
                return self.decode_pool.submit(self.stage_feed, epoch, np.array(positions))
        done: Future = Future()
        done.set_result(self.stage_feed(epoch, positions))
        return done

    def stage_feed(self, epoch: int, positions: np.ndarray) -> list:
        """The augmentation stage's inputs for one batch (:meth:`fastload.augment.stage.GraphStage.feed`); for views,
        one list per view (empty for a view without a stage), each drawn from the view's seed."""
        layout = "HWC" if self.channels_last else "CHW"
        if self.views is not None:
            return [[] if st is None else st.feed(seed=view_seed(self.seed, v), epoch=epoch, positions=positions, layout=layout)
                    for v, st in enumerate(self.stages)]  # fmt: skip
        return self.stage.feed(seed=self.seed, epoch=epoch, positions=positions, layout=layout)

    def _refuse_huge_resizes(self, run: Any, batch: Any, enc: list, widths, heights, sizes, corners) -> None:
        """Evaluation resizes of more than :data:`MAX_RESIZE_PIXELS` fail alone, named, at their turn.

        (A 65000x1 strip would ask DALI for a 16,640,000 x 256 resize: 12.8 GB.) ``pack`` refuses such
        images now; datasets packed before may hold them.
        """
        pixels = sizes[:, 0].astype(np.float64) * sizes[:, 1]
        for k in np.flatnonzero(pixels > MAX_RESIZE_PIXELS).tolist():
            i = int(batch.indices[k])
            if batch.number not in run.errors:
                run.errors[batch.number] = LoaderError(
                    f"{self.dataset.where(i)}: its {int(widths[k])}x{int(heights[k])} image would be resized to "
                    f"{int(sizes[k, 1])}x{int(sizes[k, 0])} for evaluation, over {MAX_RESIZE_PIXELS:,} pixels; "
                    "repack it with `fastload pack --max-size`, or leave such strips out"
                )
            enc[k] = placeholder_jpeg()
            widths[k] = heights[k] = PLACEHOLDER_SIDE
            sizes[k] = (self.resize, self.resize)
            corners[k] = (int(round((self.resize - self.crop) / 2.0)),) * 2

    def _submit_reduced(self, enc: list, boxes: np.ndarray, widths, heights, anchors, shapes, failed) -> dict[int, Any]:
        """Send the crops to decode at reduced scale to the pool; DALI decodes a placeholder for each.

        Returns position -> the future of its finished crop (:func:`fastload.host.reduced_crop`).
        The payload is copied first: its buffer is the next batch's.
        """
        from .host import reduced_crop, reduced_scales

        jobs: dict[int, Any] = {}
        if self.closed or self.decode_pool is None or self.decode_pool_pid != os.getpid():
            return jobs  # no pool (closed, images too small to need one, another process): full scale
        if self.interpolation == "nearest":
            return jobs  # a reduced-scale decode averages pixels, where nearest neighbour must pick them
        scales = reduced_scales(boxes, widths, heights, crop=self.crop)
        scales[list(failed)] = 1  # unreadable: a placeholder already, its error raised at its turn
        # only a JPEG decodes at reduced scale: any other payload would be decoded whole in the pool, and PIL's
        # resize of its window would read pixels beyond it at the edges (torchvision crops first)
        big = [k for k in np.flatnonzero(scales > 1).tolist() if bytes(enc[k][:2]) == b"\xff\xd8"]
        if not big:
            return jobs
        interp = {} if self.interpolation == "bilinear" else {"interpolation": self.interpolation}
        for k in big:
            try:
                jobs[k] = self.decode_pool.submit(
                    reduced_crop, bytes(enc[k]), boxes[k].tolist(), scale=int(scales[k]), crop=self.crop, **interp
                )  # fmt: skip
            except RuntimeError:  # closed by close(): DALI decodes the rest at full scale
                break
            enc[k] = placeholder_jpeg()
            anchors[k] = 0.0
            shapes[k] = float(PLACEHOLDER_SIDE)
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


#: The side of the JPEG fed to DALI in place of an unreadable record or a reduced-scale crop.
PLACEHOLDER_SIDE = 16
_PLACEHOLDER: list[np.ndarray] = []


def placeholder_jpeg() -> np.ndarray:
    """A small valid JPEG that stands in for an unreadable record until its error is raised."""
    if not _PLACEHOLDER:
        import io

        from PIL import Image

        buf = io.BytesIO()
        Image.new("RGB", (PLACEHOLDER_SIDE, PLACEHOLDER_SIDE), (128, 128, 128)).save(buf, "JPEG")
        _PLACEHOLDER.append(np.frombuffer(buf.getvalue(), dtype=np.uint8))
    return _PLACEHOLDER[0]
