"""The kernels' C entry points in the calling convention of DALI's ``numba_function`` (CPU, one sample a call),
compiled once and cached on disk, so a process builds its operators without compiling anything.

DALI calls a sample's entry point with, for its outputs then its inputs: an array of data addresses, an array of
addresses of each one's shape (int64), the dimension counts (int32) and their number; the setup entry point gets
every sample's shape addresses (``outputs x samples``, then the same for the inputs) and the sample count, and
writes the output shapes. Each operator here has one output, of its first input's (an image's) height and width.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import carray, cfunc, types
from numba.core import cgutils

from .finish import finish
from .steps import rounds

#: A sample's entry point: (outputs, their shapes, their ndims, count, inputs, their shapes, their ndims, count).
RUN = types.void(types.uint64, types.uint64, types.uint64, types.int32, types.uint64, types.uint64, types.uint64, types.int32)
#: The setup entry point: (output shapes, ndims, count, input shapes, ndims, count, samples).
SETUP = types.void(types.uint64, types.uint64, types.int32, types.uint64, types.uint64, types.int32, types.int32)


@numba.extending.intrinsic
def _pointer(typingctx: Any, address: Any) -> Any:
    """An integer address as a ``void*`` (what ``carray`` takes)."""

    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        return builder.inttoptr(args[0], cgutils.voidptr_t)

    return types.voidptr(address), codegen


@numba.njit(cache=True, nogil=True, inline="always")
def _address(table: int, k: int) -> int:
    return carray(_pointer(table), k + 1, dtype=np.uint64)[k]


@numba.njit(cache=True, nogil=True, inline="always")
def _image(data: int, shapes: int, k: int) -> Any:
    """The ``k``-th array of a call as a uint8 HWC array."""
    s = carray(_pointer(_address(shapes, k)), 3, dtype=np.int64)
    return carray(_pointer(_address(data, k)), (s[0], s[1], s[2]), dtype=np.uint8)


@numba.njit(cache=True, nogil=True, inline="always")
def _planes(data: int, shapes: int, k: int) -> Any:
    """The ``k``-th array of a call as a float32 3-D array."""
    s = carray(_pointer(_address(shapes, k)), 3, dtype=np.int64)
    return carray(_pointer(_address(data, k)), (s[0], s[1], s[2]), dtype=np.float32)


@numba.njit(cache=True, nogil=True, inline="always")
def _floats(data: int, shapes: int, k: int) -> Any:
    """The ``k``-th array of a call as a 1-D float32 array."""
    n = carray(_pointer(_address(shapes, k)), 1, dtype=np.int64)[0]
    return carray(_pointer(_address(data, k)), n, dtype=np.float32)


@numba.njit(cache=True, nogil=True, inline="always")
def _ints(data: int, shapes: int, k: int) -> Any:
    """The ``k``-th array of a call as a 1-D int32 array."""
    n = carray(_pointer(_address(shapes, k)), 1, dtype=np.int64)[0]
    return carray(_pointer(_address(data, k)), n, dtype=np.int32)


@cfunc(SETUP, cache=True, nopython=True)
def same_shape(out_shapes: int, out_ndims: int, n_out: int, in_shapes: int, in_ndims: int, n_in: int, samples: int) -> None:
    for i in range(samples):  # output 0 of sample i takes input 0's shape (both at index i: 0 * samples + i)
        o = carray(_pointer(_address(out_shapes, i)), 3, dtype=np.int64)
        s = carray(_pointer(_address(in_shapes, i)), 3, dtype=np.int64)
        o[0], o[1], o[2] = s[0], s[1], s[2]


@cfunc(RUN, cache=True, nopython=True)
def run_rounds(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    """Inputs: the image, the sample's position in each round's table (int32 ``[rounds]``), the tables' codes end to
    end (int32) and each round's parameters end to end (float32): ``steps.rounds``."""
    rounds(_image(o, os, 0), _image(i, is_, 0), _ints(i, is_, 1), _ints(i, is_, 2), _floats(i, is_, 3))


@cfunc(SETUP, cache=True, nopython=True)
def planes_shape(out_shapes: int, out_ndims: int, n_out: int, in_shapes: int, in_ndims: int, n_in: int, samples: int) -> None:
    for i in range(samples):  # output 0 of sample i: input 0's (H, W, C) as (C, H, W)
        o = carray(_pointer(_address(out_shapes, i)), 3, dtype=np.int64)
        s = carray(_pointer(_address(in_shapes, i)), 3, dtype=np.int64)
        o[0], o[1], o[2] = s[2], s[0], s[1]


@cfunc(RUN, cache=True, nopython=True)
def run_finish_chw(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    """Inputs: the image, ``finish``'s spec, the rectangles and the noise (float32 each)."""
    finish(_planes(o, os, 0), _image(i, is_, 0), _floats(i, is_, 1), _floats(i, is_, 2), _floats(i, is_, 3), True)


@cfunc(RUN, cache=True, nopython=True)
def run_finish_hwc(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    finish(_planes(o, os, 0), _image(i, is_, 0), _floats(i, is_, 1), _floats(i, is_, 2), _floats(i, is_, 3), False)


#: Each operator's entry point, its setup, its inputs after the image as (DALI type name, ndim), and its output's type.
ENTRIES: dict[str, tuple[Any, Any, tuple[tuple[str, int], ...], str]] = {
    "rounds": (run_rounds, same_shape, (("INT32", 1), ("INT32", 1), ("FLOAT", 1)), "UINT8"),
    "finish_chw": (run_finish_chw, planes_shape, (("FLOAT", 1), ("FLOAT", 1), ("FLOAT", 1)), "FLOAT"),
    "finish_hwc": (run_finish_hwc, same_shape, (("FLOAT", 1), ("FLOAT", 1), ("FLOAT", 1)), "FLOAT"),
}
