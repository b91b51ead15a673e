"""What the cp.async GEMM main loop (``templates/common/gemm.cu.j2``) reads, for implicit_gemm and
im2win: ``GemmLoopContext``, and ``loop_fields``, its values for one spec and tile choice.

A is never stored: each family says where A(m, row) lives (the image for implicit GEMM, the im2win
tensor for im2win) through ``terms.gemm.gemm_terms``; B is the filter in its own memory order, y
the output.  Both operands sit in shared memory as k-slices of contiguous rows ([block_k][block_m +
4]), as in CUTLASS's SIMT kernels: a thread owns groups of four adjacent pixels and channels, so
one float4 read gives a fragment group for one k-step (16 registers of fragments for an 8x8
micro-tile), and the +4 pad puts the k-slices written by k-major loaders on different banks.
Lanes sit in the warp in pairs that read one fragment (``warp_lane_layout``), as in CUTLASS's
interleaved lane layout, so those float4 reads take two shared-memory wavefronts instead of four.
The cp.async stages hand over through a full and an empty mbarrier each (``barrier_bytes``), so
warps wait for the data they need rather than for each other at every slice.  Padding is tested
per A element by one bit of a per-pixel tap mask (``tap_mask_bits``) where the table is used and
the filter has at most 64 taps, by a range test per padded axis otherwise.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from codegen import index
from codegen.families.base import ConvolutionContext
from codegen.families.gemm_tiles import (SMEM_PAD, TABLE_MAX_ROWS, GemmTiles, GemmVariant, barrier_bytes,
                                         check_geometry, k_split, loader, loader_registers, min_blocks,
                                         pixels_split_evenly, shared_bytes)
from codegen.spec import ConvSpec, SpecError
from codegen.terms.gemm import (gemm_sizes, row_table, tap_mask_bits, tap_mask_patterns, unselected_addresses_inside,
                                warp_lane_layout)

CONSTANT_BANK_BYTES = 65536
"""A module's ``__constant__`` data (sm_50 and later): the row table goes there when it fits."""


@dataclass(frozen=True, kw_only=True)
class GemmLoopContext(ConvolutionContext):
    """The main loop's template context: the whole of implicit_gemm's cp.async kernel, and what
    im2win's GEMM reads besides its transform.  Sizes are in elements unless named bytes."""

    kernel: str
    variant: GemmVariant
    table_name: str
    """The row table's symbol (``precomp``)."""
    BM: int
    BN: int
    BK: int
    BMP: int
    """A k-slice's row of A in shared memory: block_m plus the bank pad."""
    BNP: int
    VM: int
    """Pixels one fragment read takes from shared memory (4: a float4)."""
    VN: int
    TM: int
    TN: int
    WM: int
    WN: int
    lanes_m: int
    lanes_n: int
    lane_m: str
    """The lane's row of micro-tiles in its warp tile, a C expression of ``lane``."""
    lane_n: str
    warps_m: int
    stages: int
    async_copy: bool
    precomp: bool
    threads: int
    shared_bytes: int
    barrier_floats: int
    min_blocks: int
    """The CTAs per SM ``__launch_bounds__`` promises ptxas."""
    GEMM_M: int
    GEMM_N: int
    GEMM_K: int
    k_tiles: int
    splits: int
    """CTAs sharing an output tile's K range (split-K)."""
    k_per_split: int
    n_tiles: int
    pixels_fast: bool
    """The output's pixels are contiguous (channels-first), so the epilogue writes along them."""
    m_tail: bool
    n_tail: bool
    k_tail: bool
    k_pad: int
    """Padding rows before the first (partial) k-slice."""
    a_select: bool
    """A's address needs a select for elements not loaded (it could leave the source)."""
    a_vec: int
    b_vec: int
    a_load: dict[str, Any]
    """How the threads share the A tile (``gemm_tiles.loader``)."""
    b_load: dict[str, Any]
    table: list[tuple[int, ...]]
    """The row table, the partial slice's padding rows first; empty without ``precomp``."""
    table_width: int
    table_slots: int
    table_in_constant: bool
    mask_bits: int
    """Width of the per-pixel tap mask (0: none)."""
    mask_factors: list[dict[str, Any]]
    a_base: str
    a_delta_c: str
    a_origin: list[str]
    a_checked: list[dict[str, Any]]
    y_base: str
    y_oc_stride: int


def loop_fields(spec: ConvSpec, tiles: GemmTiles, terms: dict, a_vector_ok: bool, a_m_fastest: bool) -> dict[str, Any]:
    """``GemmLoopContext``'s main-loop fields for one spec and tile choice (the family adds the index
    maps and the names), from the A-address ``terms`` of ``gemm_terms``."""
    if tiles.tma:
        raise SpecError("tiles.tma", True, "applies to implicit_gemm only (its TMA kernel loads A with the im2col "
                        "mode straight from the image); leave it False here")
    check_geometry(tiles)
    alg = index.IndexAlgebra(spec)
    gemm_m, gemm_n, gemm_k = gemm_sizes(alg)
    lane_m, lane_n = warp_lane_layout(tiles.warp_m // tiles.thread_m, tiles.warp_n // tiles.thread_n)
    a_vec = 4 if tiles.vector_load and a_vector_ok else 1
    b_vec = 4 if tiles.vector_load and gemm_k % 4 == 0 else 1
    threads = tiles.threads
    m_fastest = a_m_fastest and a_vec == 1 and pixels_split_evenly(tiles.block_m, threads)
    a_load = loader(tiles.block_m, tiles.block_k // a_vec, threads, m_fastest, "tiles.block_m", tiles)
    b_load = loader(tiles.block_n, tiles.block_k // b_vec, threads, False, "tiles.block_n", tiles)
    k_tiles = -(-gemm_k // tiles.block_k)
    splits, k_per_split = k_split(spec, tiles)
    if tiles.precomp and gemm_k > TABLE_MAX_ROWS:
        raise SpecError("tiles.precomp", True, f"would write a table of {gemm_k} row offsets (C x taps) into the "
                        f"source; at most {TABLE_MAX_ROWS}: use precomp=False")
    mask_bits = tap_mask_bits(alg, terms) if tiles.precomp else 0
    table_width = 2 if mask_bits else 1 + len(terms["a_checked"])  # ints per row, stored as int, int2 or int4
    table = row_table(alg, terms, tap_masks=bool(mask_bits)) if tiles.precomp else []
    if table and max(abs(v) for row in table for v in row) > index.INT32_MAX:
        raise SpecError("tiles.precomp", True, "row offsets pass 32 bits; use precomp=False")
    table_slots = 1 if table_width == 1 else 2 if table_width == 2 else 4
    table_rows = k_tiles * tiles.block_k if table else 0
    return {
        "BM": tiles.block_m, "BN": tiles.block_n, "BK": tiles.block_k,
        "BMP": tiles.block_m + SMEM_PAD, "BNP": tiles.block_n + SMEM_PAD,
        "VM": min(4, tiles.thread_m) if tiles.vector_smem else 1, "VN": min(4, tiles.thread_n) if tiles.vector_smem else 1,
        "TM": tiles.thread_m, "TN": tiles.thread_n,
        "lanes_m": tiles.warp_m // tiles.thread_m, "lanes_n": tiles.warp_n // tiles.thread_n,
        "lane_m": index.to_c(lane_m), "lane_n": index.to_c(lane_n),
        "warps_m": tiles.block_m // tiles.warp_m, "WM": tiles.warp_m, "WN": tiles.warp_n,
        "stages": tiles.stages, "async_copy": tiles.async_copy,
        "precomp": tiles.precomp, "threads": threads, "shared_bytes": shared_bytes(tiles),
        "barrier_floats": barrier_bytes(tiles) // 4,
        "min_blocks": min_blocks(tiles, loader_registers(tiles, a_load, b_load, a_vec, b_vec,
                                                         mask_bits // 32 if mask_bits else len(terms["a_checked"]))),
        "GEMM_M": gemm_m, "GEMM_N": gemm_n, "GEMM_K": gemm_k, "k_tiles": k_tiles,
        "splits": splits, "k_per_split": k_per_split,
        "n_tiles": -(-gemm_n // tiles.block_n), "pixels_fast": terms["y_oc_stride"] != 1,
        "m_tail": gemm_m % tiles.block_m != 0, "n_tail": gemm_n % tiles.block_n != 0,
        "k_tail": gemm_k % tiles.block_k != 0, "k_pad": k_tiles * tiles.block_k - gemm_k,
        # Computed offsets (no table) of the residue slice's padding rows (rows below 0) point outside
        # the image, so they keep the select too.
        "a_select": not unselected_addresses_inside(alg, terms) or (gemm_k % tiles.block_k != 0
                                                                     and not tiles.precomp),
        "a_vec": a_vec, "b_vec": b_vec, "a_load": a_load, "b_load": b_load,
        "table": [(0,) * len(table[0])] * (table_rows - gemm_k) + table if table else [],
        "table_width": table_width,
        "table_slots": table_slots,
        "table_in_constant": table_in_constant(a_load, table_rows * table_slots * 4),
        "mask_bits": mask_bits,
        "mask_factors": tap_mask_patterns(alg, terms) if mask_bits else [],
        **{key: value for key, value in terms.items() if key not in ("a_delta", "exprs")},
    }


def table_in_constant(a_load: dict, table_bytes: int) -> bool:
    """Whether the row table can live in constant memory: it must fit the constant bank, and every
    warp must read one row at a time, as it does when the A loader runs along pixels in whole
    warps (the constant cache serves one address per warp per cycle and serialises the rest).
    Its loads then leave the L1 path that the tile copies and fragment reads share (docs/perf.md,
    "The heuristics' rules": GEMM v10)."""
    return a_load["m_fastest"] and a_load["row_threads"] % 32 == 0 and 0 < table_bytes <= CONSTANT_BANK_BYTES
