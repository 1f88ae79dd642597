"""The kernels' C entry points in the calling convention of DALI's ``numba_function`` (CPU, one sample a call),
compiled once and cached on disk, so a process builds its operators without compiling anything.

DALI calls a sample's entry point with, for its outputs then its inputs: an array of data addresses, an array of
addresses of each one's shape (int64), the dimension counts (int32) and their number; the setup entry point gets
every sample's shape addresses (``outputs x samples``, then the same for the inputs) and the sample count, and
writes the output shapes. Every operator here has one uint8 HWC output of its first input's shape.
"""

from __future__ import annotations

from typing import Any

import numba
import numpy as np
from numba import carray, cfunc, types
from numba.core import cgutils

from .affine import warp
from .enhance import enhance, jitter
from .histogram import autocontrast, equalize

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
def _floats(data: int, shapes: int, k: int) -> Any:
    """The ``k``-th array of a call as a 1-D float32 array."""
    n = carray(_pointer(_address(shapes, k)), 1, dtype=np.int64)[0]
    return carray(_pointer(_address(data, k)), n, dtype=np.float32)


@numba.njit(cache=True, nogil=True, inline="always")
def _doubles(data: int, shapes: int, k: int) -> Any:
    """The ``k``-th array of a call as a 1-D float64 array."""
    n = carray(_pointer(_address(shapes, k)), 1, dtype=np.int64)[0]
    return carray(_pointer(_address(data, k)), n, dtype=np.float64)


@cfunc(SETUP, cache=True, nopython=True)
def same_shape(out_shapes: int, out_ndims: int, n_out: int, in_shapes: int, in_ndims: int, n_in: int, samples: int) -> None:
    for i in range(samples):  # output 0 of sample i takes input 0's shape (both at index i: 0 * samples + i)
        o = carray(_pointer(_address(out_shapes, i)), 3, dtype=np.int64)
        s = carray(_pointer(_address(in_shapes, i)), 3, dtype=np.int64)
        o[0], o[1], o[2] = s[0], s[1], s[2]


@cfunc(RUN, cache=True, nopython=True)
def run_bilinear(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    warp(_image(o, os, 0), _image(i, is_, 0), _doubles(i, is_, 1), _floats(i, is_, 2), False)


@cfunc(RUN, cache=True, nopython=True)
def run_bicubic(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    warp(_image(o, os, 0), _image(i, is_, 0), _doubles(i, is_, 1), _floats(i, is_, 2), True)


@cfunc(RUN, cache=True, nopython=True)
def run_equalize(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    equalize(_image(o, os, 0), _image(i, is_, 0))


@cfunc(RUN, cache=True, nopython=True)
def run_autocontrast(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    autocontrast(_image(o, os, 0), _image(i, is_, 0))


@cfunc(RUN, cache=True, nopython=True)
def run_brightness(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    enhance(_image(o, os, 0), _image(i, is_, 0), _floats(i, is_, 1), 1)


@cfunc(RUN, cache=True, nopython=True)
def run_contrast(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    enhance(_image(o, os, 0), _image(i, is_, 0), _floats(i, is_, 1), 2)


@cfunc(RUN, cache=True, nopython=True)
def run_color(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    enhance(_image(o, os, 0), _image(i, is_, 0), _floats(i, is_, 1), 3)


@cfunc(RUN, cache=True, nopython=True)
def run_jitter(o: int, os: int, on: int, no: int, i: int, is_: int, in_: int, ni: int) -> None:
    jitter(_image(o, os, 0), _image(i, is_, 0), _floats(i, is_, 1))


#: Each operator's entry point and its inputs after the image, as (DALI type name, ndim).
ENTRIES: dict[str, tuple[Any, tuple[tuple[str, int], ...]]] = {
    "bilinear": (run_bilinear, (("FLOAT64", 1), ("FLOAT", 1))),
    "bicubic": (run_bicubic, (("FLOAT64", 1), ("FLOAT", 1))),
    "equalize": (run_equalize, ()),
    "autocontrast": (run_autocontrast, ()),
    "Brightness": (run_brightness, (("FLOAT", 1),)),
    "Contrast": (run_contrast, (("FLOAT", 1),)),
    "Color": (run_color, (("FLOAT", 1),)),
    "jitter": (run_jitter, (("FLOAT", 1),)),
}
