"""Starting threads: one that cannot start is a LoaderError naming what needed it, never a raw error, a hang or an abort.

A process can be refused a new thread (``ulimit -u``, a container's ``pids.max``): Python
then raises ``RuntimeError: can't start new thread``, and DALI's C++ thread pools abort the
whole process (``terminate called without an active exception``). :func:`probe` asks for
the threads DALI will need before DALI does, so that the refusal comes back as an error.
"""

from __future__ import annotations

import threading
from typing import Sequence

from .errors import LoaderError

HINT = (
    "this process may not have more threads (`ulimit -u`, a container's pids.max): raise that limit, "
    "or ask for fewer threads (FastLoader(num_threads=...))"
)


def start_threads(threads: Sequence[threading.Thread]) -> RuntimeError | None:
    """Start each of ``threads`` in turn: None, or the error of the first that could not start.

    The threads before it are running then; the caller ends them (it knows how).
    """
    for t in threads:
        try:
            t.start()
        except RuntimeError as e:  # "can't start new thread"
            return e
    return None


def cannot_start(what: str, err: BaseException) -> LoaderError:
    """The error for ``what`` (e.g. ``"the epoch thread"``) refused a thread with ``err``."""
    return LoaderError(f"could not start {what}: {err}; {HINT}")


def probe(n: int, *, what: str) -> None:
    """Start ``n`` idle threads together, then end them: a LoaderError if this process cannot have ``n`` more.

    Raises:
        LoaderError: naming ``what`` needed them, how many, and what to change.
    """
    release = threading.Event()
    threads = [threading.Thread(target=release.wait, name=f"fastload-probe-{k}", daemon=True) for k in range(n)]
    err = start_threads(threads)
    release.set()
    for t in threads:
        if t.ident is not None:
            t.join()
    if err is not None:
        started = sum(t.ident is not None for t in threads)
        raise LoaderError(f"{what} needs about {n} threads, but this process could start only {started} more ({err}); {HINT}")
