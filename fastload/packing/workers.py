"""The worker pool: tasks in, records out in source order, whatever the number of workers."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import signal
import sys
import threading
import time
import warnings
from typing import Any, Iterator

from ..errors import PackError
from ..imaging import pil_settings
from .images import ImageOptions, fast_file, process_task
from .sources import Task

#: Tasks per chunk sent to a worker process.
CHUNKSIZE = 16


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

    def watch() -> None:  # exit when the parent dies (a killed pack must not leave orphans)
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, daemon=True).start()


def _work_chunk(tasks: list[Task]) -> list[bytes | tuple]:
    assert _WORKER_OPTS is not None
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
        self._ctx = pil_settings()
        self._ctx.__enter__()
        self._window = max(256, workers * CHUNKSIZE * 4)
        if workers > 1:
            from concurrent.futures import ProcessPoolExecutor

            methods = mp.get_all_start_methods()
            ctx = mp.get_context("fork" if sys.platform.startswith("linux") and "fork" in methods else "spawn")
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(opts, os.getpid()))

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
                    fut = pool.submit(_work_chunk, tasks)
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
                return fut.result()[k]
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
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                with contextlib.suppress(Exception):
                    proc.terminate()
            pool.shutdown(wait=True, cancel_futures=True)
