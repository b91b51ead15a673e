"""The im2win window tensor (``codegen.families.im2win``): its shape and offsets, and the transform
that fills it; the GEMM core reads it through ``codegen.terms.gemm.gemm_terms(..., "window")``.
"""
from __future__ import annotations

import math

import sympy

from codegen.index import IndexAlgebra, decompose, linearize, symbol, to_c


def window_tensor_shape(algebra: IndexAlgebra) -> tuple[int, ...]:
    """The im2win tensor (the im2win paper's equation 2, generalised): for each output position of
    the outer axes, the input rows its windows read, flattened window-order along W.

    Channels-first (N, C, O0[, O1], Wwin, T) and channels-last (N, O0[, O1], Wwin, T, C), where
    T is the product of the outer filter sizes (KH in 2D) and Wwin = (OW-1)*s + (KW-1)*d + 1 the
    padded input columns the windows touch.  Padding is stored, so the convolution reads it
    without bounds checks."""
    spec = algebra.spec
    outer = algebra.out_size[:-1]
    taps_outer = math.prod(spec.filter_size[:-1])
    if spec.layout.channels_last:
        return (spec.n, *outer, window_width(algebra), taps_outer, spec.c)
    return (spec.n, spec.c, *outer, window_width(algebra), taps_outer)


def window_width(algebra: IndexAlgebra) -> int:
    spec = algebra.spec
    return (algebra.out_size[-1] - 1) * spec.stride[-1] + (spec.filter_size[-1] - 1) * spec.dilation[-1] + 1


def window_offset(algebra: IndexAlgebra, wcol: sympy.Expr, outer_tap: sympy.Expr) -> sympy.Expr:
    """Offset in the im2win tensor of (n, c, o_outer..., wcol, outer_tap)."""
    spec = algebra.spec
    shape = window_tensor_shape(algebra)
    outer = list(algebra.o[:-1])
    if spec.layout.channels_last:
        return linearize([algebra.n, *outer, wcol, outer_tap, algebra.c], shape)
    return linearize([algebra.n, algebra.c, *outer, wcol, outer_tap], shape)


def window_transform_exprs(algebra: IndexAlgebra) -> dict:
    """The im2win transform, one thread per tensor element ``t``, as sympy: the names and
    expressions of its coordinates, and the input coordinates i0.. it copies."""
    spec = algebra.spec
    wcol, to = symbol("wcol"), symbol("to")
    outer = [f"o{j}" for j in range(spec.dims - 1)]
    names = ["n", *outer, "wcol", "to", "c"] if spec.layout.channels_last else ["n", "c", *outer, "wcol", "to"]
    outer_taps = decompose(to, spec.filter_size[:-1])
    last = spec.dims - 1
    sources = [algebra.in_coord[j].subs(algebra.k[j], outer_taps[j]) for j in range(last)]
    sources.append(wcol - spec.padding[last])
    return {"names": names, "coords": decompose(algebra.t, window_tensor_shape(algebra)), "sources": sources}


def window_transform_terms(algebra: IndexAlgebra) -> dict:
    """``window_transform_exprs`` printed as C, with the bounds check (padding cells are written
    as zeros; axes without padding are proven inside)."""
    spec = algebra.spec
    shape = window_tensor_shape(algebra)
    exprs = window_transform_exprs(algebra)
    checks = [f"i{j} >= 0 && i{j} < {size}" for j, size in enumerate(spec.input_size) if spec.padding[j] > 0]
    return {
        "window_shape": list(shape),
        "window_elements": math.prod(shape),
        "window_names": exprs["names"],
        "window_coords": [to_c(e) for e in exprs["coords"]],
        "window_sources": [to_c(e) for e in exprs["sources"]],
        "window_bounds": " && ".join(checks) or "true",
    }
