"""One epoch's producer and its hand-off: the thread that drives DALI, its bounded queue, and the CUDA-stream hand-off to the consumer.

:func:`start_epoch` ends a core's current run and starts an :class:`EpochRun`: one
background thread that runs the core's DALI pipeline and turns its outputs into torch
tensors. On CUDA it copies on the core's side stream and records an event per batch;
the consumer's current stream waits on that event before the batch is handed over, and
the tensors are marked with ``record_stream`` so the allocator never reuses them early.
Any error in the background (a corrupt record, a failed decode) reaches the consumer's
``__next__`` (:class:`EpochIterator`) with the sample index and its source path; it
never hangs. An iterator that is dropped stops its thread.
"""

from __future__ import annotations

import collections
import dataclasses
import contextlib
import queue
import threading
import weakref
from typing import Any, Callable, Iterator

import numpy as np
import torch

from .core import CLOSED, SUPERSEDED, Core
from .errors import FastloadError, LoaderError
from .host import PackedCrops, finish_crops
from .pipeline import cpu_samples, packed_samples
from .sampler import Batch, EpochSampler
from .threads import cannot_start, start_threads

#: How many batches ahead of DALI's requests each batch's stage inputs are sent to the pool (EpochRun._drawn_ahead).
DRAWS_AHEAD = 2

_END = object()


def node_plan(plan: Any, epoch: int, start: int) -> dict[str, Any]:
    """The keywords by which a URL's node cache learns the batches of the node's other ranks
    (``peers``: rank -> the same stretch of ``epoch`` as that rank reads it); none for a plan
    that cannot give another rank's batches (a user's sampler)."""
    if not isinstance(plan, EpochSampler) or plan.world_size <= 1:
        return {}
    return {"peers": lambda r: plan.batches(epoch, start, rank=r), "rank": plan.rank, "world_size": plan.world_size}


class _Failure:
    def __init__(self, exc: BaseException) -> None:
        self.exc = exc


def start_epoch(core: Core, epoch: int, start: int) -> "EpochRun":
    """End ``core``'s current run (if any) and start producing ``epoch`` from batch ``start``."""
    with core.lock:
        core.stop_locked(SUPERSEDED)
        core.read_ahead.start()  # here, not first inside DALI's callback: a thread refused is an error of iter()
        if core.pipe is None:
            core.pipe = core.build()
        run = EpochRun(core, epoch, start)
        core.run = run  # before the thread starts: DALI's callback reads it
        try:
            run.start()
        except LoaderError:  # its thread could not start: no run is left behind
            core.run = None
            raise
        return run


def _crops(tl: Any) -> Any:
    """DALI's decoded CPU crops for the host finish: packed in one buffer (no per-image Python), else as views."""
    packed = packed_samples(tl)
    return PackedCrops(*packed) if packed is not None else cpu_samples(tl)


@dataclasses.dataclass
class _Staged:
    """A CPU training batch finished on the host, for the stage graph: its ``inputs`` (uint8 NHWC crops then the
    stage's feed; per view, for a multi-view transform), its batch and labels."""

    inputs: tuple
    batch: Batch
    labels: np.ndarray


class EpochRun:
    """One epoch's producer: a thread that drives DALI into a bounded queue.

    It holds the :class:`~fastload.core.Core`, never the loader or the iterator the user holds.
    """

    def __init__(self, core: Core, epoch: int, start: int) -> None:
        self.core = core
        self.epoch = epoch
        self.first = start
        self.yielded = start
        self.finished = False
        self.ended_by: str | None = None  # why it was stopped before the end of its epoch (core.SUPERSEDED...)
        follow = getattr(core.dataset, "follow_epoch", None)  # a URL's dataset downloads in the epoch's order
        batches = core.plan.batches(epoch, start)
        ra = core.read_ahead
        if follow is None:
            self._plan = ra.ahead(batches)
        else:
            self._plan = follow(batches, ra.ahead, hold=ra.depth + 2, **node_plan(core.plan, epoch, start))
        self.feeds: dict[int, Any] = {}  # batch number -> the future of its stage inputs (Core.stage_feed_job)
        if core.draws_ahead:
            self._plan = self._drawn_ahead(self._plan)
        self._inflight: collections.deque[Batch] = collections.deque()
        self.read_buffer: np.ndarray | None = None  # Dataset.read_batch's, reused by DALI's callback
        self.flips: collections.deque[tuple[np.ndarray, dict, Any]] = collections.deque()  # host_finish: flips, reduced-scale jobs, stage feed
        self.errors: dict[int, LoaderError] = {}  # batch number -> the error to raise at its turn
        self._queue: queue.Queue = queue.Queue(maxsize=core.prefetch)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._produce, name=f"fastload-epoch{epoch}", daemon=True)

    def start(self) -> None:
        err = start_threads([self._thread])
        if err is not None:
            raise cannot_start("the epoch thread", err)

    def _drawn_ahead(self, batches: Iterator[Batch]) -> Iterator[Batch]:
        """``batches`` unchanged, each one's stage inputs sent to the pool :data:`DRAWS_AHEAD` batches before DALI
        asks for it (:attr:`feeds`)."""
        window: collections.deque[Batch] = collections.deque()
        for b in batches:
            self.feeds[b.number] = self.core.stage_feed_job(self.epoch, b.positions)
            window.append(b)
            if len(window) > DRAWS_AHEAD:
                yield window.popleft()
        yield from window

    def drawn(self, job: Any) -> list:
        """A batch's stage inputs from its future (:meth:`_drawn_ahead`), for DALI's callback: StopIteration (the
        callback's end) when this run stops first; a draw that failed, as a LoaderError."""
        if not self._awaited(job):
            raise StopIteration
        try:
            return job.result()
        except FastloadError:
            raise
        except Exception as e:  # noqa: BLE001 - said as what it is: the draws, not a sample's decode
            raise LoaderError(f"the augmentation draws of epoch {self.epoch} failed: {type(e).__name__}: {str(e)[:300]}") from e

    # ---- called by DALI (producer thread)
    def next_plan(self) -> Batch:
        """The next batch of the epoch's plan (DALI's callback asks); StopIteration at the end or when stopping."""
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
            else:  # this thread's torch calls (the host finish) on one core: DALI's threads have the others
                torch.set_num_threads(1)  # (OpenMP's thread count is per thread: the caller's is left as it is)

            staged: _Staged | None = None  # a host-finished batch in the stage graph (core.augment_pipe), not yet out
            while True:
                try:
                    outs = pipe.run(stream) if stream is not None else pipe.run()
                except StopIteration:
                    pipe.reset()
                    break
                batch = self._inflight.popleft()
                if self._stop.is_set():
                    staged = self._collect(staged, put=False)
                    continue  # drain what DALI already scheduled
                if batch.number in self.errors:
                    self._collect(staged)  # the batch before it is handed on first
                    raise self.errors.pop(batch.number)
                item = self._convert(outs if core.views is not None else outs[0], batch)
                if isinstance(item, _Staged):
                    self._collect(staged)
                    core.augment_feed = item.inputs
                    core.augment_pipe.schedule_run()  # DALI's threads augment it while the loop goes on
                    staged = item
                    continue
                self._hand_on(item, batch)
            self._collect(staged, put=not self._stop.is_set())
            if not self._stop.is_set():
                self._put(_END)
        except BaseException as e:  # noqa: BLE001 - every failure must reach the consumer
            core.pipe = None  # a failed DALI pipeline is not reusable: rebuild next epoch
            if isinstance(e, LoaderError):
                err: BaseException = e
            elif isinstance(e, FastloadError):
                err = LoaderError(str(e))
            elif isinstance(e, (OSError, MemoryError)):  # the machine, not a sample: said as it is
                err = LoaderError(f"the FastLoader background thread failed: {type(e).__name__}: {str(e)[:300]}")
                err.__cause__ = e
            else:
                pending = [int(i) for b in self._inflight for i in b.indices]
                err = core.locate_decode_error(pending, e)
                err.__cause__ = e
            self._put(_Failure(err))

    def _hand_on(self, item: Any, batch: Batch) -> None:
        """Put a converted batch on the queue (with its typed fields under ``FastLoader(fields=...)``)."""
        core = self.core
        if item is not None and core.fields is not None:
            item = (*item, core.dataset.field_values(batch.indices) if core.fields.stored else [{}] * len(batch.indices))
        self._put(item)

    def _collect(self, staged: _Staged | None, *, put: bool = True) -> None:
        """Wait for the stage graph's batch ``staged`` (if any) and hand it on (``put``) or drop it; returns None."""
        if staged is None:
            return None
        outs = self.core.augment_pipe.outputs()
        if put:
            views = self.core.views
            if views is None:
                images = self._to_torch(outs[0].as_tensor())
            else:
                images = [self._to_torch(t.as_tensor(), a.out_dtype) for t, a in zip(outs, views)]
            self._hand_on((images, torch.from_numpy(staged.labels), None), staged.batch)
        return None

    def _finished_on_host(self, tl, batch: Batch, labels_np: np.ndarray):
        """A CPU training batch: DALI's decoded crops resized, flipped and normalised on the host."""
        core = self.core
        flips, jobs, feed = self.flips.popleft()
        if core.views is not None:
            return self._views_on_host(tl, flips, feed, batch, labels_np)
        finished = {}
        for k, job in jobs.items():  # reduced-scale decodes, in the pool since DALI asked for the batch
            if not self._awaited(job):
                return None  # stopping: nothing is handed on
            try:
                finished[k] = job.result()
            except Exception as e:  # noqa: BLE001 - named with its sample, as DALI's failures are
                why = "PIL cannot identify it as an image" if type(e).__name__ == "UnidentifiedImageError" else str(e)
                where = core.dataset.where(int(batch.indices[k]))
                raise LoaderError(f"{where} failed to decode: {(why or type(e).__name__)[:200]}") from e
        staged = core.stage is not None  # uint8 NHWC crops for the stage's graph, which normalises
        images = finish_crops(
            _crops(tl), flips, crop=core.crop, mean=None if staged else core.mean, std=None if staged else core.std,
            dtype=torch.uint8 if staged else core.dtype, channels_last=staged or core.channels_last, finished=finished,
            interpolation=core.interpolation,
        )  # fmt: skip
        if staged:  # its stage graph runs while the next batch is decoded and finished (see _produce)
            if not self._awaited(feed):  # the stage's inputs, drawn in the pool (Core.stage_feed_job)
                return None
            return _Staged((images.permute(0, 2, 3, 1).numpy(), *self.drawn(feed)), batch, labels_np)
        return images, torch.from_numpy(labels_np), None

    def _views_on_host(self, tls: list, flips: list, feed: Any, batch: Batch, labels_np: np.ndarray) -> _Staged | None:
        """A multi-view CPU training batch: each view's windows resized and flipped on the host (uint8 NHWC), for
        the stage graph, which augments and normalises every view."""
        inputs: list = []
        for tl, f, a in zip(tls, flips, self.core.views):
            images = finish_crops(_crops(tl), f, crop=a.crop, mean=None, std=None, dtype=torch.uint8, channels_last=True,
                                  interpolation=a.interpolation)  # fmt: skip
            inputs.append(images.permute(0, 2, 3, 1).numpy())
        if not self._awaited(feed):  # the views' stage inputs, drawn in the pool
            return None
        return _Staged(tuple(x for img, fed in zip(inputs, self.drawn(feed)) for x in (img, *fed)), batch, labels_np)

    def _awaited(self, job: Any) -> bool:
        """Wait for a pool future; False when this run stops first (never blocked for good: a finaliser closing
        this run may hold the pool's thread)."""
        from concurrent.futures import wait as futures_wait

        while not job.done():
            if self._stop.is_set():
                return False
            futures_wait((job,), timeout=0.05)
        return True

    def _to_torch(self, dali_tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
        """A dense DALI batch as the loader's torch tensor (NCHW, or its channels-last view), on its side stream;
        ``dtype``: a view's own output dtype (default the loader's).

        On the CPU the tensor is DALI's own output buffer, shared through DLPack and not copied: the pipelines
        run DALI's dynamic executor (``exec_dynamic=True``, :mod:`fastload.pipeline`), whose outputs are
        reference-counted, so DALI never reuses a buffer a tensor still holds (measured: the copy cost 46 ms a
        batch of 64 float crops, a quarter of the epoch thread's time). On a GPU the batch is copied on the
        side stream, ordered by it."""
        core = self.core
        dtype = core.dtype if dtype is None else dtype
        if core.stream is None:
            images = torch.from_dlpack(dali_tensor)
        else:
            from nvidia.dali.plugin.pytorch import feed_ndarray

            torch_dtype = torch.uint8 if dtype == torch.uint8 else (torch.float16 if dtype == torch.float16 else torch.float32)
            images = torch.empty(dali_tensor.shape(), dtype=torch_dtype, device=core.device)
            feed_ndarray(dali_tensor, images, cuda_stream=core.stream)
        if dtype == torch.bfloat16:
            images = images.to(torch.bfloat16)
        if core.channels_last:
            images = images.permute(0, 3, 1, 2)  # NHWC storage == channels_last NCHW view
        return images

    def _convert(self, tl, batch: Batch):
        core = self.core
        labels_np = core.labels[batch.indices]
        if core.host_finish:
            done = self._finished_on_host(tl, batch, labels_np)
            if done is None:  # stopping
                return None
            return done
        def images_of(tl: Any) -> Any:
            if core.views is None:
                return self._to_torch(tl.as_tensor())
            return [self._to_torch(t.as_tensor(), a.out_dtype) for t, a in zip(tl, core.views)]  # one tensor per view

        if core.stream is None:
            return images_of(tl), torch.from_numpy(labels_np), None
        stream = core.stream
        with torch.cuda.stream(stream):
            images = images_of(tl)
            labels = torch.from_numpy(labels_np).pin_memory().to(core.device, non_blocking=True)
            event = torch.cuda.Event()
            event.record(stream)
        return images, labels, event

    def _put(self, item: Any) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.05)
                return True
            except queue.Full:
                continue
        return False

    # ---- consumer side (called by EpochIterator)
    def get(self) -> Any:
        """The next item of the queue; None if the thread stopped without one."""
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
        if self._thread.ident is None:  # never started
            self.finished = True
            return
        while self._thread.is_alive():
            try:
                self._queue.get(timeout=0.05)
            except queue.Empty:
                pass
        self._thread.join()
        with contextlib.suppress(Exception):
            self._plan.close()  # drops the read-ahead requests not yet started
        self.finished = True


class EpochIterator:
    """What ``iter(loader)`` returns: the consumer end of one :class:`EpochRun`.

    It keeps its loader alive while it is used (as a DataLoader's iterator does), and when it
    is dropped before the end of its epoch, its producer thread is stopped.

    Args:
        run: the producer.
        owner: the loader, held while the iterator lives.
        device: where the batches are (the consumer's current stream there waits for each).
        on_end: called with ``run`` when the epoch was read to its end.
        is_closed: whether the loader was closed (a run stopped by ``close()``).
        length: the loader's batches per epoch.
        collate: a user's ``collate_fn``, called on each batch as a list of ``(image, label)`` pairs
            (images: views of the batch, on its device; labels: ints, as an ImageFolder gives them).
    """

    def __init__(
        self, run: EpochRun, *, owner: Any, device: torch.device, on_end: Callable[[EpochRun], None],
        is_closed: Callable[[], bool], length: Callable[[], int], collate: Callable[[list], Any] | None = None,
    ) -> None:  # fmt: skip
        self._loader = owner
        self._collate = collate
        self._run = run
        self._device = device
        self._on_end, self._is_closed, self._length = on_end, is_closed, length
        self._told = False  # the error saying why the run ended early was raised
        weakref.finalize(self, run.request_stop)

    def __iter__(self) -> "EpochIterator":
        return self

    def _ended_early(self) -> LoaderError | None:
        """The error for a run stopped before its end: every time after ``close()``, once otherwise."""
        why = self._run.ended_by
        if why is None and self._is_closed():
            why = CLOSED
        if why is None or (self._told and why is not CLOSED):
            return None
        self._told = True
        return LoaderError(why)

    def __next__(self) -> Any:
        run = self._run
        if run.ended_by is not None:
            err = self._ended_early()
            if err is not None:
                raise err
            raise StopIteration
        if run.finished:
            raise StopIteration
        item = run.get()
        if item is None:
            run.finished = True
            err = self._ended_early()
            if err is not None:
                raise err
            raise LoaderError("the FastLoader background thread stopped without a result")
        if item is _END:
            run.finished = True
            run.join()
            self._on_end(run)
            raise StopIteration
        if isinstance(item, _Failure):
            run.finished = True
            run.join()
            raise item.exc
        images, labels, event, *fields = item
        if event is not None:
            current = torch.cuda.current_stream(self._device)
            current.wait_event(event)
            for t in images if isinstance(images, list) else [images]:
                t.record_stream(current)
            labels.record_stream(current)
        run.yielded += 1
        if fields:  # FastLoader(fields=...): a FieldBatch in the order asked for
            return run.core.fields.collate(images, labels, fields[0], self._device)
        if self._collate is not None:  # as a DataLoader calls it: on the (image, label) items
            if isinstance(images, list):  # a multi-view transform's: each item's image is its list of views
                return self._collate(list(zip(map(list, zip(*(v.unbind(0) for v in images))), labels.tolist())))
            return self._collate(list(zip(images.unbind(0), labels.tolist())))
        return [images, labels]  # a list, as DataLoader's default collation of (image, label) items gives

    def __len__(self) -> int:
        return self._length() - self._run.yielded
