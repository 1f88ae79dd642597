"""Per-sample numba kernels as DALI CPU operators: the road of the operations DALI has no exact operator for.

A kernel here is a numba ``njit`` function ``kernel(out, image, *inputs)`` over one uint8 HWC image, writing an
output of the image's shape. :func:`image_op` wraps it in DALI's ``numba_function`` (CPU), which calls it per
sample in DALI's thread pool without the GIL. Building that operator compiles its entry points (about a second), so
each is built once per process and called for every step of every graph that needs it.
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)


def _same_shape(outs: Any, ins: Any) -> None:
    """numba_function's setup: each output sample has its image's shape."""
    out0 = outs[0]
    in0 = ins[0]
    for i in range(len(out0)):
        for d in range(3):
            out0[i][d] = in0[i][d]


_BUILT: dict[str, Any] = {}
_LOCK = threading.Lock()


def image_op(name: str, make_run: Callable[[], Callable[..., None]], inputs: Sequence[tuple[str, int]]) -> Any:
    """The DALI CPU operator named ``name`` that runs ``make_run()`` (a plain function ``run(out, image, *inputs)``
    calling a compiled kernel) on a uint8 HWC image and ``inputs``, each ``(DALI type name, ndim)``: built on the
    first call for each ``name`` in a process, that one returned after."""
    from nvidia.dali.pipeline import do_not_convert  # a graph with conditionals must not rewrite the kernels' code

    with _LOCK:
        if name not in _BUILT:
            _BUILT[name] = do_not_convert(_build)(name, make_run, inputs)
        return _BUILT[name]


def _build(name: str, make_run: Callable[[], Callable[..., None]], inputs: Sequence[tuple[str, int]]) -> Any:
    from nvidia.dali.plugin.numba import NumbaFunction

    from ..pipeline import import_dali

    types = import_dali()[2]
    log.debug("compiling %s for DALI's CPU threads", name)
    return NumbaFunction(
        run_fn=make_run(), setup_fn=_same_shape, device="cpu", batch_processing=False,
        in_types=[types.UINT8, *(getattr(types, t) for t, _ in inputs)], ins_ndim=[3, *(n for _, n in inputs)],
        out_types=[types.UINT8], outs_ndim=[3],
    )  # fmt: skip


def apply(op: Any, img: Any, *inputs: Any) -> Any:
    """``op`` (an :func:`image_op`) on the uint8 HWC CPU DataNode ``img``: its output, laid out HWC as the image
    (numba_function's output carries no layout, and a conditional's branches must agree)."""
    from ..pipeline import import_dali

    fn = import_dali()[1]
    return fn.reshape(op(img, *inputs), layout="HWC")
