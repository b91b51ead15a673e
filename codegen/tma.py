"""Host side of the TMA kernels: encode a tensor map (``cuTensorMapEncodeTiled`` or
``cuTensorMapEncodeIm2col`` from the CUDA driver, through ctypes) into the 128-byte value a kernel
takes by ``__grid_constant__`` parameter.

The driver library is loaded on first use, so nothing here needs a GPU until a TMA kernel runs.
"""
from __future__ import annotations

import ctypes
import functools

from codegen.families.base import TensorMap
from codegen.spec import DType

TENSOR_MAP_BYTES = 128
DATA_TYPES = {DType.float32: 7, DType.float16: 6, DType.bfloat16: 9}
"""CUtensorMapDataType of each element type (cuda.h: FLOAT32, FLOAT16, BFLOAT16)."""
INTERLEAVE_NONE, L2_PROMOTION_128B, FILL_ZEROS = 0, 2, 0
"""CUtensorMapInterleave, CUtensorMapL2promotion and CUtensorMapFloatOOBfill values (cuda.h) of the
maps convgen encodes."""
SWIZZLE = {0: 0, 32: 1, 64: 2, 128: 3}
"""CUtensorMapSwizzle value of each swizzle width in bytes (NONE, 32B, 64B, 128B)."""


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def encode(tensor_map: TensorMap, pointer: int) -> ctypes.Array:
    """The map of ``tensor_map``'s geometry over its tensor at device address ``pointer``:
    tiled (``cuTensorMapEncodeTiled``) or, with corners, im2col (``cuTensorMapEncodeIm2col``), as
    the 128 bytes whose address a launch passes among its parameters."""
    rank = len(tensor_map.dims)
    encoded = (ctypes.c_ubyte * TENSOR_MAP_BYTES)()
    dims = (ctypes.c_uint64 * rank)(*tensor_map.dims)
    strides = (ctypes.c_uint64 * (rank - 1))(*tensor_map.strides)
    element_strides = (ctypes.c_uint32 * rank)(*tensor_map.traversal_strides)
    data_type = DATA_TYPES[tensor_map.dtype]
    tail = (INTERLEAVE_NONE, SWIZZLE[tensor_map.swizzle], L2_PROMOTION_128B, FILL_ZEROS)
    if tensor_map.corners:
        lower, upper = ((ctypes.c_int * (rank - 2))(*corner) for corner in tensor_map.corners)
        channels, pixels = tensor_map.box
        function = "cuTensorMapEncodeIm2col"
        status = _driver().cuTensorMapEncodeIm2col(ctypes.byref(encoded), data_type, rank, ctypes.c_void_p(pointer), dims,
                                                   strides, lower, upper, channels, pixels, element_strides, *tail)
    else:
        function = "cuTensorMapEncodeTiled"
        status = _driver().cuTensorMapEncodeTiled(ctypes.byref(encoded), data_type, rank, ctypes.c_void_p(pointer), dims,
                                                  strides, (ctypes.c_uint32 * rank)(*tensor_map.box), element_strides, *tail)
    if status != 0:
        corners = f", corners {tensor_map.corners}" if tensor_map.corners else ""
        raise RuntimeError(f"{function} failed (CUresult {status}) for buffer {tensor_map.buffer!r}: dims "
                           f"{tensor_map.dims}, byte strides {tensor_map.strides}, box {tensor_map.box}{corners}, "
                           f"address {pointer:#x} (it must be 16-byte aligned)")
    return encoded
