"""The convolution as a GEMM (M output pixels, N output channels, K column-matrix rows) for the
GEMM core that implicit_gemm and im2win share (``codegen.families.gemm_tiles``, ``gemm_loop``):
A's address split into a per-pixel base and a per-row delta, the precomputed row tables and tap
masks, and the warp's lane layout.
"""
from __future__ import annotations

import numpy as np
import sympy

from codegen.index import IndexAlgebra, evaluate, linearize, symbol, to_c
from codegen.terms.im2win import window_offset


def gemm_sizes(algebra: IndexAlgebra) -> tuple[int, int, int]:
    """(GEMM_M, GEMM_N, GEMM_K) = (N*OD*OH*OW, K, C*T*R*S): rows of A are output pixels, its
    columns the column-matrix rows (so B is the filter read in its own memory order)."""
    return algebra.cols, algebra.spec.k, algebra.rows


def warp_lane_layout(lanes_m: int, lanes_n: int) -> tuple[sympy.Expr, sympy.Expr]:
    """(lane_m, lane_n): where lane ``lane`` of a lanes_m x lanes_n warp sits in the warp tile.

    Lanes pair up as in CUTLASS's interleaved SIMT lane layout: lanes 2i and 2i+1 share an A
    fragment, lanes i and i^2 a B fragment.  A float4 shared-memory read whose lanes pair up so
    takes two wavefronts instead of four (NVIDIA: shared memory returns 128 bytes a cycle, and a
    pair reading one address returns as one), which halves the A reads' cost.  A warp one lane
    wide along M or N has no pairs to form and keeps the plain layout."""
    lane = symbol("lane")
    if lanes_n == 1:
        return lane, sympy.Integer(0)
    if lanes_m == 1:
        return sympy.Integer(0), lane
    return sympy.Mod(sympy.floor(lane / 2), lanes_m), sympy.Mod(lane, 2) + 2 * sympy.floor(lane / (2 * lanes_m))


def gemm_terms(algebra: IndexAlgebra, source: str) -> dict:
    """Address terms of the implicit GEMM's A operand, split so that the kernel adds a per-row
    part (output pixel m) to a per-column part (column-matrix row), as CUTLASS's iterators do:

    - ``source="image"``: A(m, row) = x[base(n, o) + delta(c, k)] when every input coordinate
      origin_j(o) + disp_j(k) lies inside the image, else 0 (padding); only axes with padding
      are checked, the others are proven inside by the output size.
    - ``source="window"``: A(m, row) = win[base(n, o) + delta(c, k)] in the im2win tensor, which
      stores padding, so nothing is checked.

    ``delta`` stays a sympy expression: the precomputed-offset table evaluates it per row."""
    spec = algebra.spec
    disp = [symbol(f"g{j}") for j in range(spec.dims)]
    zero_taps = {k: 0 for k in algebra.k}
    if source == "image":
        origin = [sympy.expand(e.subs(zero_taps)) for e in algebra.in_coord]
        full = sympy.expand(algebra.x_offset.subs({algebra.i[j]: origin[j] + disp[j] for j in range(spec.dims)}))
        base = full.subs({algebra.c: 0, **{g: 0 for g in disp}})
        delta = sympy.expand(full - base).subs({g: k * d for g, k, d in zip(disp, algebra.k, spec.dilation)})
        checked = [j for j in range(spec.dims) if spec.padding[j] > 0]
    elif source == "window":
        last = spec.dims - 1
        wcol = algebra.o[last] * spec.stride[last] + algebra.k[last] * spec.dilation[last]
        outer_tap = linearize(list(algebra.k[:-1]), spec.filter_size[:-1])
        full = sympy.expand(window_offset(algebra, wcol, outer_tap))
        base = full.subs({algebra.c: 0, **zero_taps})
        delta = sympy.expand(full - base)
        origin, checked = [], []
    else:
        raise ValueError(f"unknown A source {source!r}")
    y_full = sympy.expand(algebra.y_offset)
    y_base = y_full.subs(algebra.oc, 0)
    return {
        "a_base": to_c(base),
        "a_delta": delta,
        "a_delta_c": to_c(delta),
        "a_origin": [to_c(e) for e in origin],
        "a_checked": [{"axis": j, "size": spec.input_size[j], "disp": to_c(algebra.k[j] * spec.dilation[j])}
                      for j in checked],
        "y_base": to_c(y_base),
        "y_oc_stride": int(sympy.expand(y_full - y_base).coeff(algebra.oc)),
        "exprs": {"a_base": base, "a_origin": origin, "y_base": y_base},
    }


def unselected_addresses_inside(algebra: IndexAlgebra, terms: dict) -> bool:
    """Whether A's address base(pixel) + delta(row) lies inside its source for every pixel and
    row, and base(pixel) alone too (delta 0, the precomputed table's padding rows of the residue
    slice): true when no axis is padded, since the output size keeps every tap of every pixel
    inside.  A kernel then forms the address of an element it does not load (a padding row of
    the residue slice, a pixel past M) without a select; on a padded axis a tap can fall outside
    the source."""
    return not terms["a_checked"]


TAP_MASK_BITS = 64
"""Filters up to this many taps get per-pixel tap masks (one 64-bit word at most)."""


def tap_mask_bits(algebra: IndexAlgebra, terms: dict) -> int:
    """Width of the per-pixel tap mask (32 or 64), or 0 where none is used: no padded axis to
    check, or more taps than ``TAP_MASK_BITS``.  Bit kk of a pixel's mask says whether filter tap
    kk lands inside the image on every padded axis, so a kernel tests one bit per A element
    instead of one range per padded axis (CUTLASS's precomputed filter-position predicates)."""
    if not terms["a_checked"] or algebra.taps > TAP_MASK_BITS:
        return 0
    return 32 if algebra.taps <= 32 else 64


def tap_mask_patterns(algebra: IndexAlgebra, terms: dict) -> list[dict]:
    """The tap mask factored by padded axis, so that a kernel forms it with one range test per
    filter position of each padded axis instead of one per tap and axis: for checked axis j and
    filter position v, ``disp`` = v * dilation_j and ``bits`` = the taps whose position on axis j
    is v.  A pixel's mask is the AND over the checked axes of the OR of the ``bits`` whose
    ``origin_j + disp`` lies in [0, size_j)."""
    taps = np.arange(algebra.taps)
    factors = []
    for check in terms["a_checked"]:
        j = check["axis"]
        position = evaluate(algebra.tap_coords[j], {"kk": taps})
        factors.append({"axis": j, "size": check["size"], "positions": [
            {"disp": v * algebra.spec.dilation[j], "bits": int(sum(1 << int(kk) for kk in taps[position == v]))}
            for v in range(algebra.spec.filter_size[j])]})
    return factors


def row_table(algebra: IndexAlgebra, terms: dict, tap_masks: bool = False) -> list[tuple[int, ...]]:
    """Per column-matrix row, for the precomputed-offset ("precomp") kernels: (delta, disp_j of
    each checked axis), or (delta, tap kk) with ``tap_masks``; evaluated from the same sympy
    expressions the analytic kernels print."""
    rows = np.arange(algebra.rows)
    c_expr, kk_expr = algebra.row_coords
    values = {"row": rows}
    c = evaluate(c_expr, values)
    kk = evaluate(kk_expr, values)
    taps = {f"k{j}": evaluate(e, {"kk": kk}) for j, e in enumerate(algebra.tap_coords)}
    delta = evaluate(terms["a_delta"], {"c": c, **taps})
    if tap_masks:
        columns = [delta, kk]
    else:
        columns = [delta] + [taps[f"k{a['axis']}"] * algebra.spec.dilation[a["axis"]] for a in terms["a_checked"]]
    return [tuple(int(v) for v in entry) for entry in zip(*columns)]
