"""Spatial tiles of the direct family's tiled kernels (``codegen.families.direct``): halo origins,
shared-memory extents and the register windows of register-blocked threads.
"""
from __future__ import annotations

import math

import sympy

from codegen.index import IndexAlgebra, axis_bounds, decompose, symbol, to_c
from codegen.spec import SpecError


WINDOW_LIMIT = 255
"""The longest register window a thread may walk along one axis (the registers a thread has): the
register-tiled kernels unroll it, so past this the source would grow with the filter's extent."""


def tile_terms(algebra: IndexAlgebra, tile: tuple[int, int], per_thread: tuple[int, int] = (1, 1),
               align: int = 1, windows: bool = False) -> dict:
    """Spatial tiling of the last two axes (H, W) for the tiled direct kernels.

    With tile index ``tile<j>`` and a thread's local output ``l<j>`` on axis j: the tile's first
    output is tile*T; the first input its window reads is in_coord(o = tile*T, k = 0); and the
    input that local output l reads at tap k sits at l*s + k*d from there.  The cache variant keeps
    in shared memory the T inputs starting at tile*T*s (the tile's "own" inputs: for stride 1
    and padding r these are the inputs at the outputs' own coordinates, as in the seed).

    Register blocking: a thread owns ``per_thread[j]`` consecutive outputs on axis j (local
    index u on H, v on W), so its window starts at input l*per*s and output u (v) reads element
    ``window_index`` = u*s + k*d of it at tap k, ``window_extent`` elements in all;
    ``window_taps[e]`` lists the (u, k) pairs that read element e.  With ``align`` > 1 the
    W axis is stored from the aligned input column below the halo's origin (``lead`` columns
    earlier), which holds for every tile when T*s is a multiple of ``align``."""
    spec = algebra.spec
    axes = []
    for position, j in enumerate(range(spec.dims - 2, spec.dims)):
        tile_index = symbol(f"tile{j}")
        local = symbol(f"l{j}")
        per = per_thread[position]
        first_output = tile_index * tile[position]
        halo_origin = algebra.in_coord[j].subs({algebra.o[j]: first_output, algebra.k[j]: 0})
        local_input = sympy.expand(algebra.in_coord[j].subs(algebra.o[j], first_output + local) - halo_origin)
        extent = (per - 1) * spec.stride[j] + (spec.filter_size[j] - 1) * spec.dilation[j] + 1
        window_taps = None
        if windows:
            if extent > WINDOW_LIMIT:
                raise SpecError("filter_size", spec.filter_size, f"gives the register tile a window of {extent} inputs "
                                f"along axis {j} ({per} outputs a thread, stride {spec.stride[j]}, dilation "
                                f"{spec.dilation[j]}), more than the {WINDOW_LIMIT} registers of a thread; use "
                                "variant tiled_halo, tiled_cache or basic")
            window_taps = [[] for _ in range(extent)]
            for v in range(per):
                for k in range(spec.filter_size[j]):
                    window_taps[int(local_input.subs({local: v, algebra.k[j]: k}))].append((v, k))
        lead = int(halo_origin.subs(tile_index, 0)) % align if position == 1 else 0
        axes.append({
            "axis": j,
            "tile": tile[position],
            "tiles": -(-algebra.out_size[j] // tile[position]),
            "first_output": to_c(first_output),
            "halo_origin": to_c(halo_origin),
            "aligned_origin": to_c(halo_origin - lead),
            "lead": lead,
            "own_origin": to_c(sympy.expand(first_output * spec.stride[j])),
            "local_input": to_c(local_input),
            "halo_extent": (tile[position] - 1) * spec.stride[j] + (spec.filter_size[j] - 1) * spec.dilation[j] + 1,
            "window_start": to_c(sympy.expand(local_input.subs({local: local * per, algebra.k[j]: 0}))),
            "window_index": to_c(local_input.subs(local, symbol("uv"[position]))),
            "window_extent": extent,
            "window_taps": window_taps,
        })
    plane = symbol("plane")
    inner = spec.filter_size[-2:]
    return {
        "axes": axes,
        "plane_taps": math.prod(inner),
        "plane_coords": [to_c(e) for e in decompose(plane, inner)],
        "halo_bounds": " && ".join(f"i{a['axis']} >= 0 && i{a['axis']} < {spec.input_size[a['axis']]}" for a in axes),
        "depth_bounds": axis_bounds(algebra)[0] if spec.dims == 3 else "true",
    }
