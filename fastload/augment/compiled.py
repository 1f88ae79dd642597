"""The compiled step and finish as DALI CPU operators: PIL's arithmetic for every per-sample operation a CPU graph
runs, and the normalisation and erasing after them.

The kernels (:mod:`fastload.augment.kernels`) work on one uint8 HWC image and write an output of its shape; the
step (``kernels.steps``) runs the one each sample's code names, so a round of a policy, whatever each sample drew,
is one operator, and rounds in a row are one too (:func:`rounds`). The finish (:func:`finish`) normalises as
``crop_mirror_normalize`` does and lays the erasing rectangles, in one pass. Their C entry points
(:mod:`fastload.augment.kernels.entry`) are compiled once and cached on disk, and DALI's ``numba_function`` (CPU)
runs them per sample in its thread pool without the GIL, given the cached entry points' addresses, so building an
operator compiles nothing (``numba_function`` itself would compile fresh wrappers in every process: seconds per
operator). A round as DALI's conditional ``select`` over one branch per operation cost DALI's executor about 200
operators a round (measured: timm's RandAugment), each run every batch whether a sample took it or not.
"""

from __future__ import annotations

import functools
import logging
import threading
from typing import Any, Sequence

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
        log.info("loading fastload's compiled CPU kernels (compiled the first time on a machine, about 20 s; cached after)")
    try:
        from .kernels.entry import ENTRIES
    except ImportError as e:  # numba missing or broken: say which, and what needs it
        from ..errors import DependencyError

        raise DependencyError(
            f"numba is not importable ({e}): a CPU loader runs its augmentations (PIL's "
            "arithmetic) as numba kernels in DALI's threads; pip install 'numba>=0.57'"
        ) from None

    types = import_dali()[2]
    run, setup, inputs, out = ENTRIES[entry]
    log.debug("loading the compiled %s kernel for DALI's CPU threads", entry)
    in_types = [types.UINT8, *(getattr(types, t) for t, _ in inputs)]
    return _operator_class()(run.address, setup.address, in_types, [3, *(n for _, n in inputs)], getattr(types, out))


def step(img: Any, codes: Sequence[int], p: Any, at: Any = None) -> Any:
    """One round of the compiled step on the uint8 HWC CPU DataNode ``img``: each sample runs ``codes[at]``
    (``kernels.layout``'s codes) with the step's float32 parameters ``p`` (a ``[ARGS]`` DataNode, or None where no
    code reads any); ``at`` an int32 ``[1]`` DataNode, or None with one code for every sample."""
    return rounds(img, [codes], p, at)


def rounds(img: Any, tables: Sequence[Sequence[int]], p: Any, at: Any = None) -> Any:
    """Rounds of the compiled step in one operator: in round ``r`` each sample runs ``tables[r][at[r]]`` with
    ``p[r]`` (``at`` an int32 ``[rounds]`` DataNode, or None where every table has one code; ``p`` a float32
    ``[rounds, ARGS]`` DataNode, ``[ARGS]`` for one round, or None where no code reads any). Laid out HWC as the
    image (numba_function's output carries no layout, and a conditional's branches must agree)."""
    import numpy as np

    from ..pipeline import import_dali

    _, fn, types = import_dali()
    width = max(len(t) for t in tables)
    codes = np.full((len(tables), width), -1, dtype=np.int32)
    for r, t in enumerate(tables):
        codes[r, : len(t)] = t
    at = types.Constant(np.zeros(len(tables), dtype=np.int32)) if at is None else at
    p = types.Constant(np.zeros(len(tables), dtype=np.float32)) if p is None else fn.reshape(p, shape=[-1])
    return fn.reshape(image_op("rounds")(img, at, types.Constant(codes.ravel()), p), layout="HWC")


def finish(img: Any, *, mean: Sequence[float], std: Sequence[float], layout: str, rects: Any, noise: Any,
           value: Sequence[float] | None) -> Any:  # fmt: skip
    """The uint8 HWC (RGB) CPU DataNode ``img`` normalised as ``crop_mirror_normalize`` does it (``mean``, ``std`` in
    levels; float32 in ``layout``, ``"CHW"`` or ``"HWC"``), then erased: ``rects`` a float32 ``[slots * 4]`` DataNode
    (top, left, height, width per slot) or None, filled with ``value`` (one per channel, or one for all) or, where
    ``value`` is None, with ``noise`` (a float32 DataNode, each slot's patch end to end in ``layout``)."""
    import numpy as np

    from ..pipeline import import_dali
    from .kernels.layout import INV, MEAN, NOISE, VALUE

    _, fn, types = import_dali()
    spec = np.zeros(VALUE + 3, dtype=np.float32)
    spec[NOISE] = 1.0 if value is None else 0.0
    spec[MEAN : MEAN + 3] = np.float32(mean)
    spec[INV : INV + 3] = np.float32(1.0) / np.float32(std)
    if value is not None:
        spec[VALUE : VALUE + 3] = np.broadcast_to(np.float32(value), (3,))
    rects = types.Constant(np.zeros(4, dtype=np.float32)) if rects is None else rects
    noise = types.Constant(np.zeros(1, dtype=np.float32)) if noise is None else noise
    op = image_op("finish_chw" if layout == "CHW" else "finish_hwc")
    return fn.reshape(op(img, types.Constant(spec), rects, noise), layout=layout)
