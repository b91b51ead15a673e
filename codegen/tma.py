"""Host side of the TMA kernels: encode a tensor map (``cuTensorMapEncodeTiled`` from the CUDA
driver, through ctypes) into the 128-byte value a kernel takes by ``__grid_constant__`` parameter.

The driver library is loaded on first use, so nothing here needs a GPU until a TMA kernel runs.
"""
from __future__ import annotations

import ctypes
import functools

import numpy as np

from codegen.families.base import TensorMap

TENSOR_MAP_BYTES = 128
FLOAT32, INTERLEAVE_NONE, SWIZZLE_NONE, L2_PROMOTION_128B, FILL_ZEROS = 7, 0, 0, 2, 0
"""CUtensorMapDataType, CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion and
CUtensorMapFloatOOBfill values (cuda.h) of the maps convgen encodes."""
TENSOR_MAP_TYPE = np.dtype([("words", np.uint64, (TENSOR_MAP_BYTES // 8,))])
"""A numpy structured scalar of this type is passed to a CuPy kernel by value, as the struct."""


@functools.cache
def _driver() -> ctypes.CDLL:
    return ctypes.CDLL("libcuda.so.1")


def encode(tensor_map: TensorMap, pointer: int) -> np.void:
    """The map of ``tensor_map``'s geometry over the fp32 tensor at device address ``pointer``."""
    rank = len(tensor_map.dims)
    encoded = (ctypes.c_ubyte * TENSOR_MAP_BYTES)()
    status = _driver().cuTensorMapEncodeTiled(
        ctypes.byref(encoded), FLOAT32, rank, ctypes.c_void_p(pointer),
        (ctypes.c_uint64 * rank)(*tensor_map.dims), (ctypes.c_uint64 * (rank - 1))(*tensor_map.strides),
        (ctypes.c_uint32 * rank)(*tensor_map.box), (ctypes.c_uint32 * rank)(*(1,) * rank),
        INTERLEAVE_NONE, SWIZZLE_NONE, L2_PROMOTION_128B, FILL_ZEROS)
    if status != 0:
        raise RuntimeError(f"cuTensorMapEncodeTiled failed (CUresult {status}) for buffer {tensor_map.buffer!r}: dims "
                           f"{tensor_map.dims}, byte strides {tensor_map.strides}, box {tensor_map.box}, address "
                           f"{pointer:#x} (it must be 16-byte aligned)")
    return np.frombuffer(bytes(encoded), dtype=TENSOR_MAP_TYPE)[0]
