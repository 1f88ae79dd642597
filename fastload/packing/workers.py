"""The worker pool: tasks in, records out in source order, whatever the number of workers.

Threads and processes that cannot start (a pids cgroup of a few tasks, ``ulimit -u``,
systemd's ``TasksMax``): every thread ``pack`` starts goes through
:func:`fastload.packing.journal.start_thread`,
which turns Python's ``RuntimeError: can't start new thread`` into a :class:`PackError`
naming the thread and the way out (:data:`LIMIT_HINT`); the helper threads whose work can
be done without them (the shard writer's, a worker's watchdog) do it inline instead. The
pool's own threads and processes start inside ``concurrent.futures``: a failure to start
them in ``submit`` is that same error, and one inside the pool's manager thread (which
starts the call queue's feeder thread) ends that thread, which :class:`Results` notices
while it waits (never a wait without a timeout on a pool whose manager is gone), naming
what the manager could not start.
"""

from __future__ import annotations

import concurrent.futures
import concurrent.futures.process
import contextlib
import logging
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from typing import Any, Callable, Iterator

from ..errors import PackError, short_message
from ..imaging import pil_settings
from .images import ImageOptions, fast_file, process_task
from .journal import LIMIT_HINT, cannot_start
from .sources import Task

log = logging.getLogger(__name__)

#: Tasks per chunk sent to a worker process.
CHUNKSIZE = 16
#: Seconds between two looks at the pool's manager thread while a result is awaited.
POLL = 0.5
# ---------------------------------------------------------------------------- the pool's manager thread

#: Pools of a live :class:`Results`: an exception ending one's manager thread is recorded
#: (and reported by the pack as a PackError) instead of printed as a thread traceback.
_POOLS: "weakref.WeakSet[Any]" = weakref.WeakSet()
_MANAGER_ERRORS: "weakref.WeakKeyDictionary[Any, BaseException]" = weakref.WeakKeyDictionary()
_previous_hook: Any = None


def _manager_of(thread: Any) -> Any:
    ref = getattr(thread, "executor_reference", None)
    try:
        return ref() if callable(ref) else None
    except Exception:  # pragma: no cover
        return None


def _excepthook(args: Any) -> None:
    pool = _manager_of(args.thread)
    if pool is not None and pool in _POOLS:
        _MANAGER_ERRORS[pool] = args.exc_value
        log.debug("the worker pool's manager thread stopped", exc_info=(args.exc_type, args.exc_value, args.exc_traceback))
        return
    (_previous_hook or threading.__excepthook__)(args)


def _watch_pool(pool: Any) -> None:
    """Record what ends ``pool``'s manager thread (the hook chains to the one it replaces)."""
    global _previous_hook
    _POOLS.add(pool)
    if threading.excepthook is not _excepthook:
        _previous_hook = threading.excepthook
        threading.excepthook = _excepthook


def _manager(pool: Any) -> threading.Thread | None:
    return getattr(pool, "_executor_manager_thread", None) or getattr(pool, "_queue_management_thread", None)


# ---------------------------------------------------------------------------- worker pool

_WORKER_OPTS: ImageOptions | None = None


def _init_worker(opts: ImageOptions, parent: int) -> None:
    global _WORKER_OPTS
    from PIL import Image, ImageFile

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's business
    _WORKER_OPTS = opts
    Image.MAX_IMAGE_PIXELS = None
    ImageFile.LOAD_TRUNCATED_IMAGES = False
    warnings.simplefilter("ignore")

    global _PARENT
    _PARENT = parent

    def watch() -> None:  # exit when the parent dies (a killed pack must not leave orphans)
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    try:
        threading.Thread(target=watch, daemon=True).start()
    except RuntimeError:  # no thread to spare: _work_chunk looks at the parent before each chunk
        pass


_PARENT: int | None = None


def _work_chunk(tasks: list[Task]) -> list[bytes | tuple]:
    assert _WORKER_OPTS is not None
    if _PARENT is not None and os.getppid() != _PARENT:
        os._exit(1)  # the pack is gone (an idle worker's queue read ends when its pipe closes)
    return [process_task(t, _WORKER_OPTS) for t in tasks]


class Results:
    """Ordered results of processing ``tasks``.

    Plain JPEG files take the fast path right here in the main process (reading the
    file is all the work there is; sending it through a pipe would cost more). Every
    other task goes, in chunks of :data:`CHUNKSIZE`, to a pool of ``workers`` processes
    (``workers <= 1``: processed inline). Results come out in task order, at most
    ``window`` tasks ahead, so the output does not depend on the number of workers.
    A worker that dies (a decoder crash, the OOM killer) is a :class:`PackError`
    naming the images it had, never a hang. Any other failure to hand a task to a
    worker or to get its result back (a task that cannot be pickled, ...) has that
    task processed here instead: one image's trouble is its skip reason, never the
    pack's end.
    """

    def __init__(self, tasks: Iterator[Task], opts: ImageOptions, workers: int) -> None:
        self._tasks = tasks
        self._opts = opts
        self._pool: Any = None
        self._workers = workers
        self._ctx = pil_settings()
        self._ctx.__enter__()
        self._window = max(256, workers * CHUNKSIZE * 4)
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            methods = mp.get_all_start_methods()
            ctx = mp.get_context("fork" if sys.platform.startswith("linux") and "fork" in methods else "spawn")
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(opts, os.getpid()))
            _watch_pool(self._pool)

    def _what(self) -> str:
        return f"the worker pool ({self._workers} processes and the threads that feed them)"

    def _submit(self, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future:
        """``pool.submit``; a thread or process it cannot start is a :class:`PackError`."""
        try:
            return self._pool.submit(fn, *args)
        except concurrent.futures.process.BrokenProcessPool:
            raise
        except (RuntimeError, OSError) as e:  # can't start new thread; fork: EAGAIN, ENOMEM, EMFILE
            raise cannot_start(self._what(), e) from None

    def _result(self, fut: concurrent.futures.Future) -> Any:
        """``fut.result()``, but never waiting on a pool whose manager thread is gone."""
        while True:
            try:
                return fut.result(timeout=POLL)
            except concurrent.futures.TimeoutError:
                pass
            manager = _manager(self._pool)
            if manager is not None and not manager.is_alive() and not fut.done():
                e = _MANAGER_ERRORS.get(self._pool)
                if e is None:
                    raise PackError(f"pack: the worker pool's manager thread stopped without a result; {LIMIT_HINT}")
                if isinstance(e, RuntimeError) and "thread" in str(e):
                    what = "a thread of the worker pool (its manager could not start the queue's feeder thread)"
                else:
                    what = "the worker pool (its manager thread stopped)"
                raise cannot_start(what, e)

    def __iter__(self) -> Iterator[bytes | bytearray | tuple]:
        from collections import deque
        from concurrent.futures import Future
        from concurrent.futures.process import BrokenProcessPool

        opts, pool = self._opts, self._pool
        window: deque[list] = deque()  # [result] | [None, task] (queued) | [future, k, tasks] (sent)
        chunk: list[list] = []

        def send() -> None:
            nonlocal chunk
            if chunk:
                tasks = [e[1] for e in chunk]
                try:
                    fut = self._submit(_work_chunk, tasks)
                except BrokenProcessPool as e:  # reported in order, when this chunk's turn comes
                    fut = Future()
                    fut.set_exception(e)
                for k, e in enumerate(chunk):
                    e[:] = [fut, k, tasks]
                chunk = []

        def take(e: list) -> bytes | bytearray | tuple:
            if len(e) == 1:
                return e[0]
            if e[0] is None:
                send()
            fut, k, tasks = e
            try:
                return self._result(fut)[k]
            except PackError:
                raise
            except BrokenProcessPool:
                raise PackError(
                    f"a worker process died while converting {tasks[0][4]} .. {tasks[-1][4]} "
                    "(a decoder crash or out of memory); find the image with --workers 1, then --resume"
                ) from None
            except Exception:  # the chunk could not travel (pickling, ...): convert this task here
                return process_task(tasks[k], opts)

        for task in self._tasks:
            r = fast_file(task, opts) if task[0] == "file" else None
            if r is None and pool is None:
                r = process_task(task, opts)
            if r is not None:
                window.append([r])
            else:
                e = [None, task]
                chunk.append(e)
                window.append(e)
                if len(chunk) >= CHUNKSIZE:
                    send()
            while window and (len(window[0]) == 1 or (window[0][0] is not None and window[0][0].done())):
                yield take(window.popleft())
            while len(window) >= self._window:
                yield take(window.popleft())
        while window:
            yield take(window.popleft())

    def close(self) -> None:
        self._ctx.__exit__(None, None, None)
        if self._pool is not None:
            pool, self._pool = self._pool, None
            procs = list((getattr(pool, "_processes", None) or {}).values())
            for proc in procs:
                with contextlib.suppress(Exception):
                    proc.terminate()
            manager = _manager(pool)
            if manager is not None and not manager.is_alive():
                # never started, or stopped: shutdown(wait=True) would join a thread that never ran
                for proc in procs:
                    with contextlib.suppress(Exception):
                        proc.join(5.0)
                with contextlib.suppress(Exception):
                    pool.shutdown(wait=False, cancel_futures=True)
            else:
                pool.shutdown(wait=True, cancel_futures=True)
            _POOLS.discard(pool)
