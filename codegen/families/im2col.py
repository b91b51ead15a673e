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

float16 and bfloat16 (``Im2col.dtypes``) are copied as their bits, so the column matrix equals the
image's elements exactly.  Their accesses are as wide as the alignment allows: the vector kernels
load 8 channels (16 bytes) where the pitch is a multiple of 8, else 4 (8 bytes), and store 8, 4 or
2 columns at once where the column count allows; the channels-first kernel gives each thread up to
8 consecutive columns where the W stride is 1 (``columns_per_thread``), gathered per tap and written
with one store.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codegen import index
from codegen.device import Device
from codegen import precision
from codegen.families.base import Buffer, Family, IndexContext, KernelPlan, Launch, grid_for, kernel_name
from codegen.reference import column_matrix_reference
from codegen.spec import ConvSpec, DType, SpecError
from codegen.tiles import TileParam, Tiles, check_block, check_shared

VECTOR_CHUNK = 16
SPLIT_TAPS = 16
SMEM_PAD_BYTES = 16
"""Padding of each shared-memory row of the vector kernels (4 floats, 8 16-bit elements): it keeps
rows 16-byte aligned while shifting their banks."""
VECTOR_BYTES = 16
"""The widest access of one thread."""


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
    dtype: DType = DType.float32
    reference_terms: int = 1
    """Input reads of the self-test's host reference per output: one (a copy)."""
    vector_store: bool = False
    """The vector kernel stores several columns at once (the columns are a multiple of 4; of 2 in 16-bit)."""
    store_elements: int = 1
    """Columns per store of the vector kernel: 4 (a float4) or 1 in float32; 8, 4, 2 or 1 in 16-bit."""
    load_elements: int = 4
    """Channels per load of the vector kernel: 4 (a float4) in float32; 8 or 4 in 16-bit."""
    columns_per_thread: int = 1
    """16-bit channels-first kernels over unit-stride rows: consecutive columns a thread gathers and
    stores at once (8, 4 or 2; 1 elsewhere, a thread per column)."""
    group_coords: list[str] | None = None
    """Several columns a thread: (c, group) or, split, (c, k0, group) of thread t."""
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


def columns_per_thread(spec: ConvSpec, cols: int) -> int:
    """Columns a thread of the channels-first kernel gathers and stores at once: in 16-bit, up to 8
    (16 bytes) where consecutive columns read consecutive input elements (W stride 1), so that a
    warp's loads of one column each stay in a few cache lines; else 1, as in float32.  With 8
    columns a thread over strided input, each load instruction of a warp spread over 8 times the
    lines of float32's, and conv1 (stride 4) ran at 0.54 of the copy's bandwidth against 0.74."""
    if spec.dtype is DType.float32 or spec.stride[-1] != 1:
        return 1
    return widest_dividing(cols, VECTOR_BYTES // spec.dtype.itemsize)


def widest_dividing(count: int, most: int) -> int:
    """The largest power of two up to ``most`` that divides ``count``: elements per access that
    keep every access of a row aligned."""
    width = most
    while count % width:
        width //= 2
    return width


class Im2col(Family):
    name = "im2col"
    template = "im2col.cu.j2"
    tiles_type = Im2colTiles
    summary = "image -> column matrix (incl. the DECX dpitch float4 kernels)"
    convolution = False
    dtypes = tuple(DType)

    def roundoff(self, spec: ConvSpec, plan: KernelPlan | None = None) -> precision.Roundoff:
        """All zero: a copy rounds nothing, so every element equals the image's."""
        return precision.Roundoff(0.0, 0.0, 0.0, 1, 0.0, 0.0)

    def error_bound(self, spec: ConvSpec, inputs, plan: KernelPlan | None = None) -> np.ndarray:
        """Zero: the column matrix holds the image's elements exactly."""
        return np.zeros(self.algebra(spec).col_shape)

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
        itemsize = spec.dtype.itemsize
        sixteen_bit = spec.dtype is not DType.float32
        variant_fields: dict = {}
        x_alignment = col_alignment = itemsize
        if variant.vectorized:
            rows_per_block = tiles.threads // tiles.pixels
            if rows_per_block < 1:
                raise SpecError("tiles.pixels", tiles.pixels, f"must not exceed tiles.threads ({tiles.threads})")
            loads = widest_dividing(spec.pitch, VECTOR_BYTES // itemsize)
            stores = widest_dividing(alg.cols, VECTOR_BYTES // itemsize) if sixteen_bit else 4 if alg.cols % 4 == 0 else 1
            chunk = min(-(-spec.c // loads) * loads, VECTOR_CHUNK)
            pad = SMEM_PAD_BYTES // itemsize
            shared = rows_per_block * chunk * (tiles.pixels + pad) * itemsize
            check_shared(shared, "tiles.threads", tiles.threads)
            block = (tiles.pixels, rows_per_block, 1)
            chunks = -(-spec.c // chunk)
            # 1D grid, (tap group, chunk) fastest: the blocks that read the same pixels run together,
            # so each pixel comes from DRAM once and from L2 after that.
            row_blocks = grid_for(alg.taps, rows_per_block) * chunks
            grid = (grid_for(alg.cols, tiles.pixels) * row_blocks, 1, 1)
            variant_fields.update(rows_per_block=rows_per_block, chunk=chunk, chunks=chunks, smem_pad=pad,
                                  row_blocks=row_blocks, vector_store=stores > 1, store_elements=stores,
                                  load_elements=loads, pixels=tiles.pixels, partial_chunk=spec.c % chunk != 0)
            x_alignment, col_alignment = loads * itemsize, stores * itemsize
        elif variant is Im2colVariant.CHANNELS_LAST:
            channel_threads = min(8, spec.c)
            block = (max(32, tiles.threads // channel_threads // 32 * 32), channel_threads, 1)
            grid = (grid_for(alg.cols, block[0]), 1, 1)
        else:
            columns = columns_per_thread(spec, alg.cols)
            groups = alg.cols // columns
            outer = spec.filter_size[0] if tiles.split_outer_tap else 1
            block = (tiles.threads, 1, 1)
            grid = (grid_for(spec.c * outer * groups, tiles.threads), 1, 1)
            inner = spec.filter_size[1:]
            variant_fields.update(
                split=tiles.split_outer_tap, outer_taps=outer, inner_taps=math.prod(inner),
                split_thread_coords=[index.to_c(e) for e in index.decompose(alg.t, (spec.c, outer, alg.cols))],
                inner_tap_coords=[index.to_c(e) for e in index.decompose(alg.kk, inner)])
            if columns > 1:
                per_thread = (spec.c, outer, groups) if tiles.split_outer_tap else (spec.c, groups)
                variant_fields.update(columns_per_thread=columns,
                                      group_coords=[index.to_c(e) for e in index.decompose(alg.t, per_thread)])
            col_alignment = columns * itemsize
        check_block(block[0] * block[1], "tiles.threads", tiles.threads)
        launch = Launch(kernel_name(self.name, variant.value, spec, tiles), grid, block)
        context = Im2colContext(**index.template_context(alg, launch.threads), **variant_fields, variant=variant,
                                kernel=launch.kernel, block_threads=block[0] * block[1], dtype=spec.dtype)
        buffers = (Buffer("x", alg.image_shape, "in", x_alignment, spec.dtype),
                   Buffer("col", alg.col_shape, "out", col_alignment, spec.dtype))
        return KernelPlan(self.name, variant.value, spec, tiles, buffers, (launch,), context)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        (x,) = inputs
        return column_matrix_reference(spec, precision.from_storage(x, spec.dtype))


FAMILY = Im2col()
