"""The float64 references the kernels are checked against, written with numpy slicing rather than
the index algebra's maps, so that they check them: im2col's column matrix and the convolution.
They sit below the families and ``codegen.precision`` (whose error bound is a convolution's), so
that both can use them.
"""
from __future__ import annotations

import numpy as np

from codegen import index
from codegen.spec import ConvSpec


def column_matrix_reference(spec: ConvSpec, x: np.ndarray) -> np.ndarray:
    """im2col in float64 by slicing a zero-padded image, one strided slice per tap."""
    x = np.asarray(x, dtype=np.float64)
    if spec.layout.channels_last:
        x = np.moveaxis(x[..., : spec.c], -1, 1)
    pad = [(0, 0), (0, 0)] + [(p, p) for p in spec.padding]
    xp = np.pad(x, pad)
    out = index.output_size(spec)
    taps = []
    for tap in np.ndindex(*spec.filter_size):
        window = tuple(
            slice(k * d, k * d + (o - 1) * s + 1, s)
            for k, d, o, s in zip(tap, spec.dilation, out, spec.stride)
        )
        taps.append(xp[(slice(None), slice(None)) + window])
    stacked = np.stack(taps, axis=2)
    stacked = stacked.reshape(spec.n, spec.c, len(taps), -1)
    if spec.layout.channels_last:
        matrix = stacked.transpose(2, 1, 0, 3)
    else:
        matrix = stacked.transpose(1, 2, 0, 3)
    return matrix.reshape(spec.c * len(taps), -1)


def convolution_reference(spec: ConvSpec, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 convolution as filter matrix x column matrix (the slicing im2col, not the sympy maps)."""
    alg = index.IndexAlgebra(spec)
    col = column_matrix_reference(spec, x)
    w = np.asarray(w, dtype=np.float64)
    if spec.layout.channels_last:
        matrix = w.reshape(spec.k, alg.taps * spec.c)          # rows of col: (taps, c)
    else:
        matrix = w.reshape(spec.k, spec.c * alg.taps)          # rows of col: (c, taps)
    out = (matrix @ col).reshape(spec.k, spec.n, *alg.out_size)
    if spec.layout.channels_last:
        return np.moveaxis(out, 0, -1)
    return np.moveaxis(out, 0, 1)
