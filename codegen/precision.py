"""The number formats of the tensor-core kernels on the host: rounding to TF32, bfloat16 and float16
as the kernels round, bfloat16 as the uint16 bits it travels in, and the error bound that the GPU
tests hold every output to.

CuPy has no bfloat16 dtype, so bfloat16 tensors are uint16 arrays of their bits (``bfloat16_bits``
makes them, ``from_bfloat16_bits`` reads them); float16 is numpy's own.

Error model.  An output y of the convolution of the stored inputs x and w (already rounded to the
storage type) is a sum of L = C x taps products; taps in the padding add exact zeros.  With
S = sum_i |x_i w_i| and y* = sum_i x_i w_i, both exact (float64), the kernel's result satisfies

    |y - y*| <= E + u_out * (|y*| + E) + eta_out,    E = (e_mul + e_acc * P * L) * S

- e_mul, one product's relative error from rounding its operands: 0 for float16 and bfloat16
  (their products are exact in FP32) and for FP32 FMA (exact inside the fused multiply-add);
  2^-10 + 2^-22 for TF32 (each operand rounded to 10 mantissa bits, 2^-11 relative), and
  2^-9 + 2^-20 where the tensor cores read FP32 bits as TF32 (wgmma from shared memory drops the
  low 13 mantissa bits: truncation, 2^-10 relative);
  2^-20 for 3xTF32 (each operand is big + small to 2^-22, and the dropped small x small product is
  below 2^-22 |x w|: 3 x 2^-22, rounded up).
- e_acc = 2^-23 per accumulated product, twice FP32's unit roundoff: the tensor cores align an
  MMA's products by truncation rather than rounding.  P = 3 products a term for 3xTF32, else 1.
- u_out, the rounding of the FP32 sum to the output type: 2^-11 for float16, 2^-8 for bfloat16,
  0 for float32; eta_out, half the output type's smallest subnormal (2^-25 for float16), where
  relative rounding stops.

The bound is a worst case (rounding errors of one sign): random data lands orders of magnitude
inside it, while an index bug, a lost tap or an unwritten element lands far outside it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from codegen.reference import convolution_reference
from codegen.spec import ConvSpec, DType, MathMode

NAN = {DType.float32: np.float32(np.nan), DType.float16: np.float16(np.nan), DType.bfloat16: np.uint16(0x7FC0)}
"""NaN as a buffer of each dtype stores it (bfloat16: a quiet NaN's uint16 bits), to poison outputs with."""

TF32_MANTISSA_BITS = 10
"""Explicit mantissa bits of TF32 (and of float16); bfloat16 has 7, float32 23."""


def _float32_bits(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def round_tf32(a) -> np.ndarray:
    """``a`` (as float32) rounded to TF32 as ``cvt.rna.tf32.f32`` rounds it: to nearest with ties
    away from zero (not to even), as float32 values whose low 13 bits are zero.  Adding half a
    TF32 unit to the magnitude bits and truncating is exactly that rounding, subnormals and the
    overflow to infinity included; NaN stays NaN."""
    return _tf32_bits(a, 1 << (22 - TF32_MANTISSA_BITS))


def truncate_tf32(a) -> np.ndarray:
    """``a`` (as float32) as the tensor cores read float32 bits as TF32 (wgmma from shared memory):
    the low 13 mantissa bits dropped, toward zero; NaN stays NaN."""
    return _tf32_bits(a, 0)


def _tf32_bits(a, added: int) -> np.ndarray:
    """``a``'s float32 bits plus ``added``, with the mantissa bits TF32 lacks cleared, as float32;
    NaN becomes a quiet NaN."""
    bits = _float32_bits(a)
    kept = (bits + np.uint32(added)) & np.uint32(~((1 << (23 - TF32_MANTISSA_BITS)) - 1) & 0xFFFFFFFF)
    nan = np.isnan(bits.view(np.float32))
    return np.where(nan, bits | np.uint32(0x7FC00000), kept).astype(np.uint32).view(np.float32)


def bfloat16_bits(a) -> np.ndarray:
    """The bfloat16 bits (uint16) of ``a`` (as float32) rounded to nearest even, as
    ``cvt.rn.bf16.f32`` and ``__float2bfloat16_rn`` round; NaN becomes a quiet NaN."""
    bits = _float32_bits(a)
    lsb = (bits >> np.uint32(16)) & np.uint32(1)
    rounded = (bits + np.uint32(0x7FFF) + lsb) >> np.uint32(16)
    nan = np.isnan(bits.view(np.float32))
    return np.where(nan, (bits >> np.uint32(16)) | np.uint32(0x0040), rounded).astype(np.uint16)


def from_bfloat16_bits(bits) -> np.ndarray:
    """The float32 values of bfloat16 bits (exact: bfloat16 is float32's upper half)."""
    return (np.asarray(bits, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(np.float32)


def round_bfloat16(a) -> np.ndarray:
    """``a`` rounded to bfloat16, as float32."""
    return from_bfloat16_bits(bfloat16_bits(a))


def to_storage(a, dtype: DType) -> np.ndarray:
    """``a`` as a kernel of ``dtype`` stores it: float32, float16, or bfloat16 bits (uint16).
    float64 values round to float32 first (then to the 16-bit type)."""
    if dtype is DType.bfloat16:
        return bfloat16_bits(a)
    return np.asarray(a, dtype=np.float32).astype(np.float16 if dtype is DType.float16 else np.float32)


def from_storage(a, dtype: DType) -> np.ndarray:
    """Stored values as float64: bfloat16 bits (uint16) decoded, any float array taken as it is."""
    a = np.asarray(a)
    if dtype is DType.bfloat16 and a.dtype == np.uint16:
        a = from_bfloat16_bits(a)
    return a.astype(np.float64)


@dataclass(frozen=True)
class Roundoff:
    """The unit roundoffs of one dtype and math mode (module docstring: the error model)."""

    operand: float
    """Relative error of rounding one stored operand to what the multiplier takes."""
    product: float
    """e_mul: relative error of one product from its operands' rounding."""
    accumulation: float
    """e_acc: relative error each accumulated product adds, of the sum of magnitudes."""
    products_per_term: int
    """P: tensor-core products accumulated per term (3 for 3xTF32)."""
    output: float
    """u_out: relative error of rounding the FP32 sum to the output type."""
    output_absolute: float
    """eta_out: the absolute error below which the output's subnormals stop relative rounding."""


ACCUMULATION = 2.0**-23
OUTPUT_ROUNDING = {DType.float32: (0.0, 0.0), DType.float16: (2.0**-11, 2.0**-25), DType.bfloat16: (2.0**-8, 2.0**-134)}
"""(u_out, eta_out) by output type: half a unit in the last place, and half the smallest subnormal."""


def unit_roundoff(dtype: DType, math_mode: MathMode, tf32_truncated: bool = False) -> Roundoff:
    """The roundoffs of a kernel storing ``dtype`` and multiplying as ``math_mode``; with
    ``tf32_truncated``, of a TF32 kernel whose tensor cores drop the operands' low bits rather than
    the kernel rounding them to nearest (``KernelPlan.tf32_truncated``)."""
    dtype, math_mode = DType(dtype), MathMode(math_mode)
    output, output_absolute = OUTPUT_ROUNDING[dtype]
    if dtype is DType.float32 and math_mode is MathMode.tf32:
        operand = 2.0**-(TF32_MANTISSA_BITS + (0 if tf32_truncated else 1))
        return Roundoff(operand, 2 * operand + operand**2, ACCUMULATION, 1, output, output_absolute)
    if dtype is DType.float32 and math_mode is MathMode.three_tf32:
        return Roundoff(2.0**-22, 2.0**-20, ACCUMULATION, 3, output, output_absolute)
    return Roundoff(0.0, 0.0, ACCUMULATION, 1, output, output_absolute)


def error_bound(spec: ConvSpec, x, w, tf32_truncated: bool = False) -> np.ndarray:
    """The bound on |y - y*| of every output (module docstring), for the stored inputs ``x`` and
    ``w`` (float32, float16, or bfloat16 bits), in the output's shape; ``tf32_truncated`` as
    ``unit_roundoff`` takes it."""
    x64, w64 = from_storage(x, spec.dtype), from_storage(w, spec.dtype)
    exact = convolution_reference(spec, x64, w64)
    magnitude = convolution_reference(spec, np.abs(x64), np.abs(w64))
    roundoff = unit_roundoff(spec.dtype, spec.math, tf32_truncated)
    terms = spec.c * math.prod(spec.filter_size)
    accumulated = (roundoff.product + roundoff.accumulation * roundoff.products_per_term * terms) * magnitude
    return accumulated + roundoff.output * (np.abs(exact) + accumulated) + roundoff.output_absolute
