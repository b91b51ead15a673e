"""im2col: image to column matrix, in three variants chosen from the spec.

Column matrix: ``rows x cols`` row-major, ``cols = N*OD*OH*OW`` (n, od, oh, ow); rows are
(c, kd, kh, kw) for channels-first layouts (the Composable Kernel example's ``[C*KH*KW, N*OH*OW]``)
and (kd, kh, kw, c) for channels-last ones (DECX).  Padding taps read zeros.

Variants:
- ``channels_first``: a thread per (c, column), looping over the taps; writes coalesce along columns.
- ``channels_last``: a 2D block (columns x channels); reads stay in the block's cache lines and
  writes coalesce along columns.
- ``vec<dpitch>`` / ``vec_generic`` (DECX, seed 000): channels-last data whose channel pitch is a
  multiple of 4.  Each thread loads the float4s covering its pixel's channels (pitch 4..16 gets a
  kernel of its own; larger pitches split the channels into 16-wide chunks, one per block row of
  the grid), the block transposes through shared memory padded by 4 floats against bank
  conflicts, and whole warps store rows with float4 stores.  Padding lanes (c >= C) never reach
  the output, and float4s made only of padding lanes are not even loaded.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codegen import index
from codegen.device import Device
from codegen.families.base import Buffer, Family, IndexContext, KernelPlan, Launch, grid_for, kernel_name
from codegen.reference import column_matrix_reference
from codegen.spec import ConvSpec, SpecError
from codegen.tiles import TileParam, Tiles, check_block, check_shared

VECTOR_CHUNK = 16
SPLIT_TAPS = 16
SMEM_PAD = 4


class Im2colVariant(str, enum.Enum):
    """The kernel ``plan`` picks; the float4 kernels of pitch 4..16 are one kernel each."""

    CHANNELS_FIRST = "channels_first"
    CHANNELS_LAST = "channels_last"
    VEC4 = "vec4"
    VEC8 = "vec8"
    VEC12 = "vec12"
    VEC16 = "vec16"
    VEC_GENERIC = "vec_generic"

    @property
    def vectorized(self) -> bool:
        return self.value.startswith("vec")


@dataclass(frozen=True)
class Im2colTiles(Tiles):
    threads: int = 256
    vectorized: bool = True
    pixels: int = 128
    split_outer_tap: bool = False

    PARAMS: ClassVar = (
        TileParam("threads", "threads per block", minimum=32, maximum=1024, multiple_of=32),
        TileParam("vectorized", "use the DECX float4 kernel when the channel pitch is a multiple of 4",
                  choices=(True, False)),
        TileParam("pixels", "columns per block of the float4 kernel (DECX uses 128)",
                  minimum=32, maximum=512, multiple_of=32),
        TileParam("split_outer_tap", "channels-first: one thread per (channel, outermost filter tap, column) "
                  "instead of per (channel, column), for large filters", choices=(True, False)),
    )


@dataclass(frozen=True, kw_only=True)
class Im2colContext(IndexContext):
    variant: Im2colVariant
    kernel: str
    block_threads: int
    reference_terms: int = 1
    """Input reads of the self-test's host reference per output: one (a copy)."""
    vector_store: bool = False
    """The float4 kernel stores whole float4s (the columns are a multiple of 4)."""
    # The float4 kernels:
    rows_per_block: int | None = None
    """Taps a block transposes (its threads' y extent)."""
    chunk: int | None = None
    """Channels a block row loads (at most VECTOR_CHUNK)."""
    chunks: int | None = None
    smem_pad: int | None = None
    row_blocks: int | None = None
    """Blocks over the rows of one column block: tap groups times channel chunks."""
    pixels: int | None = None
    partial_chunk: bool | None = None
    """The last channel chunk is not full, so the float4 loop breaks early."""
    # channels_first:
    split: bool = False
    """A thread per (channel, outermost tap, column) instead of per (channel, column)."""
    outer_taps: int | None = None
    inner_taps: int | None = None
    split_thread_coords: list[str] | None = None
    """(c, k0, col) of thread t."""
    inner_tap_coords: list[str] | None = None
    """The inner filter axes' taps of ``kk``."""


def vector_eligible(spec: ConvSpec) -> bool:
    return spec.layout.channels_last and spec.pitch % 4 == 0


class Im2col(Family):
    name = "im2col"
    template = "im2col.cu.j2"
    tiles_type = Im2colTiles
    summary = "image -> column matrix (incl. the DECX dpitch float4 kernels)"
    convolution = False

    def default_tiles(self, spec: ConvSpec, *, device: Device | str | None = None) -> Im2colTiles:
        """float4 kernel whenever the pitch allows; large channels-first filters (more than 16 taps,
        e.g. 7x7 or 11x11) spread their outermost filter axis over threads, giving each thread
        fewer sequential stores and the grid more blocks to balance."""
        taps = math.prod(spec.filter_size)
        return Im2colTiles(vectorized=vector_eligible(spec),
                           split_outer_tap=not spec.layout.channels_last and taps > SPLIT_TAPS)

    def variant(self, spec: ConvSpec, tiles: Im2colTiles) -> Im2colVariant:
        if spec.layout.channels_last and tiles.vectorized:
            if not vector_eligible(spec):
                raise SpecError(
                    "tiles.vectorized", True,
                    f"needs a channel pitch that is a multiple of 4 (this spec has pitch {spec.pitch}); "
                    "set dpitch to a multiple of 4 or vectorized=False")
            return Im2colVariant(f"vec{spec.pitch}") if spec.pitch <= VECTOR_CHUNK else Im2colVariant.VEC_GENERIC
        return Im2colVariant.CHANNELS_LAST if spec.layout.channels_last else Im2colVariant.CHANNELS_FIRST

    def plan(self, spec: ConvSpec, tiles: Im2colTiles, device: Device | str | None = None) -> KernelPlan:
        alg = self.algebra(spec)
        variant = self.variant(spec, tiles)
        variant_fields: dict = {}
        if variant.vectorized:
            rows_per_block = tiles.threads // tiles.pixels
            if rows_per_block < 1:
                raise SpecError("tiles.pixels", tiles.pixels, f"must not exceed tiles.threads ({tiles.threads})")
            chunk = min(-(-spec.c // 4) * 4, VECTOR_CHUNK)
            shared = rows_per_block * chunk * (tiles.pixels + SMEM_PAD) * 4
            check_shared(shared, "tiles.threads", tiles.threads)
            block = (tiles.pixels, rows_per_block, 1)
            chunks = -(-spec.c // chunk)
            # 1D grid, (tap group, chunk) fastest: the blocks that read the same pixels run together,
            # so each pixel comes from DRAM once and from L2 after that.
            row_blocks = grid_for(alg.taps, rows_per_block) * chunks
            grid = (grid_for(alg.cols, tiles.pixels) * row_blocks, 1, 1)
            variant_fields.update(rows_per_block=rows_per_block, chunk=chunk, chunks=chunks, smem_pad=SMEM_PAD,
                                  row_blocks=row_blocks,
                                  vector_store=alg.cols % 4 == 0, pixels=tiles.pixels,
                                  partial_chunk=spec.c % chunk != 0)
        elif variant is Im2colVariant.CHANNELS_LAST:
            channel_threads = min(8, spec.c)
            block = (max(32, tiles.threads // channel_threads // 32 * 32), channel_threads, 1)
            grid = (grid_for(alg.cols, block[0]), 1, 1)
        else:
            outer = spec.filter_size[0] if tiles.split_outer_tap else 1
            block = (tiles.threads, 1, 1)
            grid = (grid_for(spec.c * outer * alg.cols, tiles.threads), 1, 1)
            inner = spec.filter_size[1:]
            variant_fields.update(
                split=tiles.split_outer_tap, outer_taps=outer, inner_taps=math.prod(inner),
                split_thread_coords=[index.to_c(e) for e in index.decompose(alg.t, (spec.c, outer, alg.cols))],
                inner_tap_coords=[index.to_c(e) for e in index.decompose(alg.kk, inner)])
        check_block(block[0] * block[1], "tiles.threads", tiles.threads)
        launch = Launch(kernel_name(self.name, variant.value, spec, tiles), grid, block)
        context = Im2colContext(**index.template_context(alg, launch.threads), **variant_fields, variant=variant,
                                kernel=launch.kernel, block_threads=block[0] * block[1])
        buffers = (
            Buffer("x", alg.image_shape, "in", 16 if variant.vectorized else 4),
            Buffer("col", alg.col_shape, "out", 16 if context.vector_store else 4),
        )
        return KernelPlan(self.name, variant.value, spec, tiles, buffers, (launch,), context)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        (x,) = inputs
        return column_matrix_reference(spec, x)


FAMILY = Im2col()
