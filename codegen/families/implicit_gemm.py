"""Implicit-GEMM convolution (seed 003, CUTLASS's formulation), 2D and 3D, every layout: the plans
and their template contexts.  The tiles, their checks and costs are ``gemm_tiles``'; which tiles a
layer gets, and why, ``gemm_heuristic``'s; what the tuner tries, ``gemm_tuning``'s.

The convolution is run as the GEMM y = A * B without ever storing A: the CTA's loader forms
A(m, row), the input pixel that output pixel m reads for column-matrix row (channel, tap), from
the image on the fly, with zeros for padding.  Address arithmetic is split as CUTLASS's
iterators do: a per-pixel base (computed once per thread) plus a per-row delta, either divided
out in the kernel or read from a table precomputed by the generator (``precomp``, cuDNN's
IMPLICIT_PRECOMP_GEMM).  The cp.async kernel is the GEMM main loop that im2win shares
(``templates/common/gemm.cu.j2``, context ``gemm_loop.GemmLoopContext``).  No workspace: the extra
device memory is the row table (16 bytes per row at most).  The TMA kernel needs one, for the
transposed filter.

With ``tma`` (sm_90) the kernel is Hopper's instead (``templates/implicit_gemm_tma.cu.j2``, context
``TmaContext``; docs/perf-history.md, GEMM v11-v17): persistent blocks whose producer thread loads
each k-slice, one filter tap by 32 channels, with two TMA copies (A through the im2col mode, which
walks the tile's pixels across rows and images and reads zeros for padding; B as a box of the
filter, transposed per call into a taps x C x K workspace so that B fragments run along output
channels), on a ring of mbarrier stages that consumer warps drain with only shared loads and FMAs.
Micro-tiles of 8x8 or 16x8 (the 16x8 producer is a warpgroup that hands its registers to the
consumers, sm_90a), and where the last round of tiles is ragged a stream-K tail.  On channels-first
data the producer warps gather A themselves with 4-byte cp.async copies (``gather_terms``), B as
before; only on request, since its workspace would pass cuDNN's extra memory there.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from codegen import index
from codegen.device import Device, as_device, present
from codegen.families import gemm_heuristic, gemm_loop, gemm_tuning, mma_gemm
from codegen.families.base import (Buffer, ConvolutionContext, Family, KernelPlan, Launch, TensorMap,
                                   convolution_selftest_context, grid_for, kernel_name)
from codegen.families.direct import convolution_reference
from codegen.families.gemm_tiles import (TMA_ALIGNMENT, TMA_BOX_PIXELS, TMA_FIXED, GemmTiles, GemmVariant,
                                         async_copy_arch, check_geometry, check_tma_spec, data_parallel_rounds, grid,
                                         shared_bytes, shared_tiles, tma_counts_fit, tma_grid, tma_register_split,
                                         tma_resident_blocks, tma_shared_bytes, tma_slices)
from codegen.spec import ConvSpec, SpecError, uses_tensor_cores
from codegen.terms.gemm import gemm_sizes, gemm_terms
from codegen.terms.implicit_gemm import gather_slices, gather_terms, im2col_map_terms, transposed_filter_terms

SLICE_TABLE_LIMIT = 2048
"""Most k-slices whose offsets the gathered TMA kernel takes from a constant table (at most 16 KB
of the 64 KB of constant memory, at 8 bytes an entry); longer filters decode each slice's tap."""
TRANSPOSE_THREADS = 256


class GatherWide(str, enum.Enum):
    """Which slices of a gathered A tile copy each pixel pair as one 8-byte copy (``gather_fields``)."""

    ALWAYS = "always"
    """Every slice: every tap's W offset is even."""
    SLICE = "slice"
    """The slices the slice table flags (their tap's W offset is even)."""
    NEVER = "never"
    """None: every element is a 4-byte copy."""


@dataclass(frozen=True, kw_only=True)
class TmaContext(ConvolutionContext):
    """What ``implicit_gemm_tma.cu.j2`` reads however A is loaded; the A side is
    ``TmaIm2colContext``'s (channels-last) or ``TmaGatherContext``'s (channels-first)."""

    kernel: str
    variant: GemmVariant
    transpose_kernel: str
    zero_kernel: str
    """Zeroes the tiles that blocks share before the stream-K tail adds into them."""
    tail_kernel: str | None
    """The stream-K tail's own launch of the kernel (``gemm_heuristic.tail_in_own_launch``), or None."""
    slices: int
    """k-slices per tile: taps x ``c_chunks``."""
    grid_blocks: int
    split_tiles: int
    stream_k: bool
    dp_rounds: int
    """Rounds of whole tiles before the stream-K tail (``gemm_tiles.data_parallel_rounds``)."""
    dp_tiles: int
    dp_steps: int
    tail_steps: int
    BM: int
    BN: int
    BK: int
    TM: int
    WM: int
    stages: int
    threads: int
    warps_m: int
    register_split: tuple[int, int] | None
    """``setmaxnreg`` counts of producer and consumers (``gemm_tiles.tma_register_split``), or None."""
    consumers: int
    resident_blocks: int
    shared_bytes: int
    alignment: int
    GEMM_M: int
    GEMM_N: int
    n_tiles: int
    tiles_total: int
    c_chunks: int
    """32-channel boxes per tap."""
    vector_store: bool
    transpose: dict[str, Any]
    """The filter transpose's terms (``transposed_filter_terms``)."""
    gather: bool = field(default=False, init=False)
    """A is gathered by the producer warps (channels-first), not copied through an im2col map."""


@dataclass(frozen=True, kw_only=True)
class TmaIm2colContext(TmaContext):
    """Channels-last A: ``boxes`` im2col copies of ``box_m`` pixels per slice."""

    box_m: int
    boxes: int
    im2col_rank: int
    origin: list[str]
    """A box's first input coordinates at tap 0, innermost first (``im2col_map_terms``)."""
    tap_offsets: list[str]


@dataclass(frozen=True, kw_only=True)
class TmaGatherContext(TmaContext):
    """Channels-first A, gathered by the producer warps (``gather_fields`` says how)."""

    gather: bool = field(default=True, init=False)
    a_base: str
    a_origin: list[str]
    a_checked: list[dict[str, Any]]
    y_base: str
    y_oc_stride: int
    tap_delta: str
    channel_stride: int
    pair_step: int
    gather_threads: int
    gather_columns: int
    gather_pixels: int
    gather_row_step: int
    gather_rows: int
    gather_first: str
    gather_offsets: list[int]
    gather_offset: str
    gather_pairs: bool
    gather_groups: list[dict[str, Any]]
    gather_wide: GatherWide
    slice_table: list[int] | None
    slice_type: str
    m_tail: bool
    c_tail: bool
    c_short: bool
    shared_row_address: bool


def image_vector_ok(spec: ConvSpec) -> bool:
    """float4 loads of A need four consecutive rows to be four consecutive channels of one pixel."""
    return spec.layout.channels_last and spec.c % 4 == 0 and spec.pitch % 4 == 0


class ImplicitGemm(Family):
    name = "implicit_gemm"
    template = "implicit_gemm.cu.j2"
    tma_template = "implicit_gemm_tma.cu.j2"
    tiles_type = GemmTiles
    summary = ("implicit-GEMM convolution: cp.async pipeline, warp and thread tiles, precomputed offsets; "
               "tma=True: the sm_90 TMA kernel (channels-first: A gathered by its producer warps)")

    def for_spec(self, spec: ConvSpec) -> Family:
        """The tensor-core kernel (``mma_gemm``) for float16, bfloat16, tf32 and 3xtf32; this FMA
        family for float32 with math fma."""
        return mma_gemm.FAMILY if uses_tensor_cores(spec.dtype, spec.math) else self

    def default_tiles(self, spec: ConvSpec, *, device: Device | str | None = None) -> GemmTiles:
        """The portable cp.async kernel's tiles (``gemm_heuristic.portable_tiles``)."""
        return gemm_heuristic.portable_tiles(spec, device)

    def heuristic_tiles(self, spec: ConvSpec, device: Device | str | None = None) -> GemmTiles:
        """The TMA kernel where its rules take it on ``device``, else the cp.async kernel
        (``gemm_heuristic.choose_tiles``)."""
        return gemm_heuristic.choose_tiles(spec, device)

    def tiles_within(self, spec: ConvSpec, limit: int, device: Device | str | None = None) -> GemmTiles:
        """The portable cp.async kernel, which needs no workspace (the TMA kernel's is its
        transposed filter)."""
        return self.default_tiles(spec, device=device)

    def complete_tiles(self, spec: ConvSpec, requested: dict, device: Device | str | None = None) -> GemmTiles:
        """Unset tiles come from the TMA kernel's heuristic when ``tma`` is asked for, else as
        ``gemm_heuristic.complete`` fills them."""
        base = (gemm_heuristic.tma_tiles(spec, device=device) if requested.get("tma")
                else self.default_tiles(spec, device=device))
        return GemmTiles.from_dict(gemm_heuristic.complete(base.to_dict(), requested))

    def tuning_space(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """The cp.async kernel's space, plus the TMA kernel's where the spec suits it and its
        transposed filter fits ``workspace_limit``."""
        return (gemm_tuning.tuning_space(spec, image_vector_ok(spec), present())
                + gemm_tuning.tma_space(spec, workspace_limit))

    def tuning_seeds(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """The cp.async kernel's seeds, plus the TMA heuristic where the spec suits it and the limit allows."""
        return gemm_tuning.tuning_seeds(spec) + gemm_tuning.tma_seeds(spec, workspace_limit)

    def plan(self, spec: ConvSpec, tiles: GemmTiles, device: Device | str | None = None) -> KernelPlan:
        if tiles.tma:
            return self._tma_plan(spec, tiles, as_device(device))
        alg = self.algebra(spec)
        vector = image_vector_ok(spec)
        fields = gemm_loop.loop_fields(spec, tiles, gemm_terms(alg, "image"), vector,
                                       a_m_fastest=not spec.layout.channels_last)
        variant = tiles.variant
        name = kernel_name(self.name, variant.value, spec, tiles)
        launch = Launch(name, grid(spec, tiles), (tiles.threads, 1, 1), shared_bytes(tiles))
        # The column matrix is never formed, so only the image, filter, output and the padded
        # pixel count bound the index type (conv4's 4.8e9-element column matrix kept it 64-bit).
        padded_pixels = launch.grid[0] // fields["n_tiles"] * tiles.block_m
        context = gemm_loop.GemmLoopContext(
            **index.template_context(alg, max(launch.threads, padded_pixels), column_matrix=False),
            **convolution_selftest_context(alg), **fields, kernel=name, variant=variant, table_name=f"{name}_rows")
        buffers = (Buffer("x", alg.image_shape, "in", 16 if vector and tiles.vector_load else 4),
                   Buffer("w", alg.filter_shape, "in", 16 if context.b_vec == 4 else 4),
                   Buffer("y", alg.output_shape, "out"))
        return KernelPlan(self.name, variant.value, spec, tiles, buffers, (launch,), context,
                          zero_output=context.splits > 1, atomic_sums=context.splits > 1, **async_copy_arch(tiles))

    def _tma_plan(self, spec: ConvSpec, tiles: GemmTiles, device: Device) -> KernelPlan:
        """The filter transposed into the workspace, with stream-K the shared tiles zeroed, then
        the persistent TMA kernel (``gemm_tiles.tma_grid``)."""
        check_tma_spec(spec)
        check_geometry(tiles)
        alg = self.algebra(spec)
        gemm_m, gemm_n, _ = gemm_sizes(alg)
        transposed = transposed_filter_terms(alg)
        block_k = TMA_FIXED["block_k"]
        w_map = TensorMap("wt", transposed["dims"], transposed["byte_strides"], (tiles.block_n, block_k, 1))
        if spec.layout.channels_last:   # A through the im2col map, stored (pixels, K)
            im2col = im2col_map_terms(alg)
            box_m = min(tiles.block_m, TMA_BOX_PIXELS)
            x_map = TensorMap("x", im2col["dims"], im2col["strides"], (block_k, box_m), swizzle=128,
                              corners=(im2col["lower"], im2col["upper"]), element_strides=im2col["element_strides"])
            context_type: type[TmaContext] = TmaIm2colContext
            a_side = dict(box_m=box_m, boxes=tiles.block_m // box_m, im2col_rank=spec.dims + 2,
                          origin=im2col["origin"], tap_offsets=im2col["tap_offsets"])
            x_alignment = 16
            image = {"tensor_maps": (x_map, w_map), "args": ("y",)}
            vector_store = gemm_n % 4 == 0
        else:                           # A gathered by the producer warps, stored channels-first
            context_type = TmaGatherContext
            a_side = gather_fields(alg, tiles)
            x_alignment = 8 if a_side["gather_wide"] != GatherWide.NEVER else 4
            image = {"tensor_maps": (w_map,), "args": ("x", "y")}
            vector_store = math.prod(alg.out_size) % 4 == 0
        m_tiles, n_tiles = -(-gemm_m // tiles.block_m), -(-gemm_n // tiles.block_n)
        shared = tma_shared_bytes(tiles)
        count, blocks = tma_grid(spec, tiles, device)
        if not tma_counts_fit(spec, count, blocks):
            raise SpecError("tiles.block_m", tiles.block_m, f"gives the TMA kernel {count} output tiles of "
                            f"{tma_slices(spec)} k-slices, whose steps it counts in 32 bits (at most "
                            f"{index.INT32_MAX}); use larger tiles or tma=False")
        name = kernel_name(self.name, GemmVariant.TMA.value, spec, tiles)
        slices = alg.taps * -(-spec.c // block_k)
        stream_k = gemm_heuristic.takes_stream_k(tiles, count, blocks)
        split = shared_tiles(count, slices, blocks) if stream_k else set()
        rounds = data_parallel_rounds(count, blocks)
        tail_kernel = f"{name}_tail" if stream_k and rounds and gemm_heuristic.tail_in_own_launch(tiles) else None
        launches = (
            Launch(f"{name}_filter", (grid_for(transposed["elements"], TRANSPOSE_THREADS), 1, 1),
                   (TRANSPOSE_THREADS, 1, 1), args=("w", "wt")),
            *((Launch(f"{name}_zero", (blocks - 1, 1, 1), (TRANSPOSE_THREADS, 1, 1), args=("y",), persistent=True),)
              if split else ()),
            *(Launch(kernel, (blocks, 1, 1), (tiles.threads, 1, 1), shared, persistent=True, **image)
              for kernel in (name, tail_kernel) if kernel),
        )
        context = context_type(
            **index.template_context(alg, max(launches[-1].threads, m_tiles * tiles.block_m), column_matrix=False),
            **convolution_selftest_context(alg),
            kernel=name, variant=GemmVariant.TMA, transpose_kernel=f"{name}_filter", zero_kernel=f"{name}_zero",
            tail_kernel=tail_kernel,
            slices=slices, grid_blocks=blocks, split_tiles=len(split), stream_k=stream_k,
            dp_rounds=rounds, dp_tiles=rounds * blocks if stream_k else count, dp_steps=rounds * blocks * slices,
            tail_steps=(count - rounds * blocks) * slices,
            BM=tiles.block_m, BN=tiles.block_n, BK=block_k, TM=tiles.thread_m, WM=tiles.warp_m,
            stages=tiles.stages, threads=tiles.threads, warps_m=tiles.block_m // tiles.warp_m,
            register_split=tma_register_split(tiles),
            consumers=tiles.consumer_warps, resident_blocks=tma_resident_blocks(tiles, device), shared_bytes=shared,
            alignment=TMA_ALIGNMENT, GEMM_M=gemm_m, GEMM_N=gemm_n, n_tiles=n_tiles,
            tiles_total=count, c_chunks=-(-spec.c // block_k), vector_store=vector_store,
            transpose={key: value for key, value in transposed.items() if key != "exprs"}, **a_side,
        )
        buffers = (Buffer("x", alg.image_shape, "in", x_alignment),
                   Buffer("w", alg.filter_shape, "in"),
                   Buffer("y", alg.output_shape, "out", 16 if vector_store else 4),
                   Buffer("wt", transposed["shape"], "workspace", 16))
        return KernelPlan(self.name, GemmVariant.TMA.value, spec, tiles, buffers, launches, context, min_arch=90,
                          atomic_sums=bool(split),
                          min_arch_reason="TMA, mbarriers and warp specialisation; tma=False runs on sm_80",
                          arch_specific=context.register_split is not None, template=self.tma_template)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs
        return convolution_reference(spec, x, w)


def gather_fields(alg: index.IndexAlgebra, tiles: GemmTiles) -> dict[str, Any]:
    """``TmaGatherContext``'s A side: how the producer warps share a channels-first A tile of
    block_m pixels x 32 channels.  Thread t copies its pixels (from tile position ``gather_first``,
    at ``gather_offsets``) of channels t / columns + ``row_step`` * v, so that a warp's copies run
    along consecutive pixels.  ``c_short`` (C < 32): the rows past C are zeroed once, not copied in
    every slice (C = 3 had 29 zero-size copies a pixel, and their predicates spilled the producer's
    40 registers).

    A copy is a cp.async plus a 64-bit address, unless copies share an address and differ by
    the instruction's immediate offset.  So where C fills whole slices, a thread's pixels (at
    least two) come in ``gather_groups``, each addressed from its anchor pixel's base:
    - ``shared_row_address``: where pixels are contiguous and no tile crosses an image, one
      address a channel serves all of a thread's pixels (docs/perf-history.md, GEMM v24);
    - else ``gather_pairs`` (``gather_terms``' ``pairs_in_rows``): a thread copies pixel
      pairs 2j, 2j + 1, which read elements ``pair_step`` apart; where ``pairs_aligned`` and
      the slice's tap allows (``gather_wide``), a pair is one 8-byte copy (GEMM v25).  Not
      where the shared address serves: a warp's 4-byte copies of pairs write every other
      word, two to a bank, which cost unet3d_l1 4 % on the H100.
    ``slice_table``: each slice's tap offset (doubled, plus its wide flag, where the flag
    varies) as a constant table, where it fits ``SLICE_TABLE_LIMIT``, instead of decoding the
    tap in every slice."""
    block_k = TMA_FIXED["block_k"]
    threads = 32 * tiles.producer_warps
    gemm_m, _, _ = gemm_sizes(alg)
    terms = gather_terms(alg)
    c_tail, c_short = alg.spec.c % block_k != 0, alg.spec.c < block_k
    shared_row_address = (terms["pixels_contiguous"] and math.prod(alg.out_size) % tiles.block_m == 0
                          and not c_tail)
    pairs = terms["pairs_in_rows"] and not c_tail and not shared_row_address
    width = 2 if pairs else 1
    columns = min(tiles.block_m // (2 if pairs or shared_row_address else 1), threads)
    count = tiles.block_m // columns
    offsets = [u % width + u // width * width * columns for u in range(count)]
    if shared_row_address:
        groups = [{"anchor": 0, "members": [(u, offsets[u]) for u in range(count)]}]
    elif pairs:
        groups = [{"anchor": u, "members": [(u, 0), (u + 1, terms["pair_step"])]} for u in range(0, count, 2)]
    else:
        groups = []
    slices = gather_slices(alg, block_k)
    table = len(slices) <= SLICE_TABLE_LIMIT
    wide_taps = {wide for _, wide in slices} if pairs and terms["pairs_aligned"] else {False}
    wide = (GatherWide.ALWAYS if wide_taps == {True} else GatherWide.SLICE if len(wide_taps) == 2 and table
            else GatherWide.NEVER)
    return {
        **{key: terms[key] for key in ("a_base", "a_origin", "a_checked", "y_base", "y_oc_stride", "tap_delta",
                                       "channel_stride", "pair_step")},
        "gather_threads": threads, "gather_columns": columns, "gather_pixels": count,
        "gather_row_step": threads // columns, "gather_rows": block_k * columns // threads,
        "gather_first": "2 * column" if pairs else "column", "gather_offsets": offsets,
        "gather_offset": f"u % 2 + u / 2 * {2 * columns}" if pairs else f"u * {columns}",
        "gather_pairs": pairs, "gather_groups": groups, "gather_wide": wide,
        "slice_table": ([2 * offset + flag for offset, flag in slices] if wide is GatherWide.SLICE
                        else [offset for offset, _ in slices]) if table else None,
        "slice_type": "int" if all(abs(2 * offset) < 2**31 - 1 for offset, _ in slices) else "long long",
        "m_tail": gemm_m % tiles.block_m != 0, "c_tail": c_tail, "c_short": c_short,
        "shared_row_address": shared_row_address,
    }


FAMILY = ImplicitGemm()
