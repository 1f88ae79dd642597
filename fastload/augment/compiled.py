"""Per-sample numba kernels as DALI CPU operators: the road of the operations DALI has no exact operator for.

A kernel (:mod:`fastload.augment.kernels`) works on one uint8 HWC image and writes an output of its shape; its C
entry point (:mod:`fastload.augment.kernels.entry`) is compiled once and cached on disk. :func:`image_op` makes
the DALI operator that calls it: DALI's ``numba_function`` (CPU), which runs it per sample in DALI's thread pool
without the GIL. That operator is given the cached entry points' addresses, so building one compiles nothing
(``numba_function`` itself would compile fresh wrappers in every process: seconds per operator).
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any

log = logging.getLogger(__name__)

_BUILT: dict[str, Any] = {}
_LOCK = threading.Lock()


def image_op(entry: str) -> Any:
    """The DALI CPU operator of the kernel entry point ``entry`` (a key of ``kernels.entry.ENTRIES``) on a uint8 HWC
    image and its inputs: made on the first call for each ``entry`` in a process, that one returned after."""
    from nvidia.dali.pipeline import do_not_convert  # a graph with conditionals must not rewrite the kernels' code

    with _LOCK:
        if entry not in _BUILT:
            _BUILT[entry] = do_not_convert(_build)(entry)
        return _BUILT[entry]


@functools.lru_cache(maxsize=None)
def _operator_class() -> type:
    """``numba_function``'s operator, given compiled entry points instead of Python functions to compile."""
    from nvidia.dali.plugin.numba import NumbaFunction

    class Compiled(NumbaFunction):  # type: ignore[misc, valid-type]
        def __init__(self, run: int, setup: int, in_types: list, ins_ndim: list, out_type: Any) -> None:
            super(NumbaFunction, self).__init__(device="cpu")  # the operator itself: nothing compiled here
            self.run_fn, self.setup_fn, self.batch_processing = run, setup, False
            self.in_types, self.ins_ndim, self.out_types, self.outs_ndim = in_types, ins_ndim, [out_type], [3]
            self.num_outputs, self._preserve, self.blocks, self.threads_per_block = 1, True, None, None

    return Compiled


def _build(entry: str) -> Any:
    import sys

    from ..pipeline import import_dali

    if "fastload.augment.kernels.entry" not in sys.modules:
        log.info("loading fastload's compiled CPU kernels (compiled the first time on a machine, about 15 s; cached after)")
    try:
        from .kernels.entry import ENTRIES, same_shape
    except ImportError as e:  # numba missing or broken: say which, and what needs it
        from ..errors import DependencyError

        raise DependencyError(
            f"numba is not importable ({e}): a CPU loader runs PIL's geometry, equalize, blends and ColorJitter as "
            "numba kernels in DALI's threads; pip install 'numba>=0.57'"
        ) from None

    types = import_dali()[2]
    run, inputs = ENTRIES[entry]
    log.debug("loading the compiled %s kernel for DALI's CPU threads", entry)
    in_types = [types.UINT8, *(getattr(types, t) for t, _ in inputs)]
    return _operator_class()(run.address, same_shape.address, in_types, [3, *(n for _, n in inputs)], types.UINT8)


def apply(op: Any, img: Any, *inputs: Any) -> Any:
    """``op`` (an :func:`image_op`) on the uint8 HWC CPU DataNode ``img``: its output, laid out HWC as the image
    (numba_function's output carries no layout, and a conditional's branches must agree)."""
    from ..pipeline import import_dali

    fn = import_dali()[1]
    return fn.reshape(op(img, *inputs), layout="HWC")
