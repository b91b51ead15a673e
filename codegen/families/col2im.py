"""col2im: column matrix back to an image, summing every window that covers each element.

The column matrix is the one im2col writes (see codegen/families/im2col.py).  Two algorithms:
- ``gather`` (default, deterministic): one thread per image element sums, in a fixed tap order,
  the entries of every window covering it, so results are bitwise identical run to run.
  Channels-last blocks are (pixels x channels) so that column reads coalesce across a warp; with
  a pitch of 32 or more the block stages a 32x32 tile in shared memory so that the image writes
  coalesce too (``gather_channels_last_tiled``; the ``threads`` tile does not apply to it).
- ``scatter``: one thread per (channel, column) adds its entries into the image with atomics;
  the launcher zeroes the image first.  Summation order varies from run to run.
Channels-last padding lanes (c >= C) come out as zeros from both.  A gather thread may sum several
channels of its pixel (``channels``), walking their windows once: where the stride is above 1 that
arithmetic, not the bytes, bounds the gather, most of all in 16-bit.

float16 and bfloat16 (``Col2im.dtypes``) run in the gather kernels: each element's entries are
widened to FP32, summed there and rounded once, so the result is within ``Col2im.error_bound`` of
the exact sum.  Scatter is refused for them: its atomics would round every partial sum.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codegen import index, precision
from codegen.device import Device
from codegen.families.base import Buffer, Family, IndexContext, KernelPlan, Launch, grid_for, kernel_name
from codegen.spec import ConvSpec, DType, SpecError
from codegen.tiles import TileParam, Tiles, check_block


TILED_PITCH = 32
SIXTEEN_BIT_CHANNELS = 4


class Col2imAlgorithm(str, enum.Enum):
    """The ``algorithm`` tile (kept a string there, as the CLI and the tuning database spell it)."""

    GATHER = "gather"
    SCATTER = "scatter"


class Col2imVariant(str, enum.Enum):
    SCATTER = "scatter"
    GATHER_CHANNELS_FIRST = "gather_channels_first"
    GATHER_CHANNELS_LAST = "gather_channels_last"
    GATHER_CHANNELS_LAST_TILED = "gather_channels_last_tiled"


@dataclass(frozen=True)
class Col2imTiles(Tiles):
    algorithm: str = Col2imAlgorithm.GATHER.value
    threads: int = 256
    channels: int = 1

    PARAMS: ClassVar = (
        TileParam("algorithm", "gather: deterministic, no atomics; scatter: atomicAdd into a zeroed image",
                  choices=tuple(a.value for a in Col2imAlgorithm)),
        TileParam("threads", "threads per block (2D blocks keep a whole warp of pixels)",
                  minimum=32, maximum=1024, multiple_of=32),
        TileParam("channels", "image channels a gather thread sums, sharing their window arithmetic; from a "
                  "channels-last pitch of 32 (32x32 tiles, 4 channels a thread, 8 apart) any value above 1 shares "
                  "it across the 4", choices=(1, 2, 4, 8)),
    )


@dataclass(frozen=True, kw_only=True)
class Col2imContext(IndexContext):
    variant: Col2imVariant
    kernel: str
    block_threads: int
    dtype: DType
    reference_terms: int
    """Column entries the self-test's host reference sums per image element: one per tap."""
    group: int
    """Channels a gather thread sums at once (``Col2imTiles.channels``; in the 32x32 tiles 4, 8 apart, or 1)."""
    group_coords: list[str]
    """(n, first channel, i...) of channels-first element group t."""
    groups_total: int
    """Threads of the channels-first gather: one per (n, channel group, pixel)."""
    spatial_elements: int
    """Image elements of one channel plane: channels-first offsets of neighbouring channels differ by it."""


def image_reference(spec: ConvSpec, col: np.ndarray) -> np.ndarray:
    """col2im in float64: add each tap's strided slice back into a zero-padded image, then crop."""
    out = index.output_size(spec)
    taps = int(np.prod(spec.filter_size))
    col = np.asarray(col, dtype=np.float64)
    if spec.layout.channels_last:
        blocks = col.reshape(taps, spec.c, spec.n, *out).transpose(2, 1, 0, *range(3, 3 + spec.dims))
    else:
        blocks = col.reshape(spec.c, taps, spec.n, *out).transpose(2, 0, 1, *range(3, 3 + spec.dims))
    padded = np.zeros((spec.n, spec.c, *[size + 2 * p for size, p in zip(spec.input_size, spec.padding)]))
    for t, tap in enumerate(np.ndindex(*spec.filter_size)):
        window = tuple(
            slice(k * d, k * d + (o - 1) * s + 1, s)
            for k, d, o, s in zip(tap, spec.dilation, out, spec.stride)
        )
        padded[(slice(None), slice(None)) + window] += blocks[:, :, t]
    crop = tuple(slice(p, p + size) for p, size in zip(spec.padding, spec.input_size))
    image = padded[(slice(None), slice(None)) + crop]
    if spec.layout.channels_last:
        image = np.moveaxis(image, 1, -1)
        lanes = np.zeros((*image.shape[:-1], spec.pitch))
        lanes[..., : spec.c] = image
        image = lanes
    return image


class Col2im(Family):
    name = "col2im"
    template = "col2im.cu.j2"
    tiles_type = Col2imTiles
    summary = "column matrix -> image: deterministic gather or atomic scatter"
    convolution = False
    dtypes = tuple(DType)

    def default_tiles(self, spec: ConvSpec, *, device: Device | str | None = None) -> Col2imTiles:
        """16-bit gathers with a stride above 1 take ``SIXTEEN_BIT_CHANNELS`` channels a thread: their window
        loops divide per covering window, and a 2-byte element halves the bytes that work is spread over.
        H100 (docs/perf-history.md, 16-bit memory-bound v2, bfloat16): 1.35-1.56x on the strided conv1-4 in
        both layouts; at unit stride 0.87-1.12x, so those keep one channel a thread."""
        strided = any(s > 1 for s in spec.stride)
        return Col2imTiles(channels=SIXTEEN_BIT_CHANNELS if spec.dtype is not DType.float32 and strided else 1)

    def plan(self, spec: ConvSpec, tiles: Col2imTiles, device: Device | str | None = None) -> KernelPlan:
        alg = self.algebra(spec)
        groups_total = spec.n * -(-spec.c // tiles.channels) * math.prod(spec.input_size)
        if Col2imAlgorithm(tiles.algorithm) is Col2imAlgorithm.SCATTER:
            if spec.dtype is not DType.float32:
                raise SpecError("tiles.algorithm", tiles.algorithm, f"adds into the image with atomics, which in "
                                f"{spec.dtype.value} would round every partial sum; gather (the default) sums each "
                                "element in FP32 and rounds it once")
            if tiles.channels != 1:
                raise SpecError("tiles.channels", tiles.channels, "groups the channels of a gather thread; scatter "
                                "takes one (channel, column) a thread: leave channels at 1")
            variant = Col2imVariant.SCATTER
            block = (tiles.threads, 1, 1)
            grid = (grid_for(spec.c * alg.cols, tiles.threads), 1, 1)
        elif spec.layout.channels_last and spec.pitch >= TILED_PITCH:
            variant = Col2imVariant.GATHER_CHANNELS_LAST_TILED
            block = (32, 8, 1)
            grid = (grid_for(alg.pixels, 32), grid_for(spec.pitch, 32), 1)
        elif spec.layout.channels_last:
            variant = Col2imVariant.GATHER_CHANNELS_LAST
            lane_groups = -(-spec.pitch // tiles.channels)
            channel_threads = min(8, 1 << (lane_groups - 1).bit_length())
            block = (max(32, tiles.threads // channel_threads // 32 * 32), channel_threads, 1)
            grid = (grid_for(alg.pixels, block[0]), grid_for(lane_groups, channel_threads), 1)
        else:
            variant = Col2imVariant.GATHER_CHANNELS_FIRST
            block = (tiles.threads, 1, 1)
            grid = (grid_for(groups_total, tiles.threads), 1, 1)
        check_block(block[0] * block[1], "tiles.threads", tiles.threads)
        launch = Launch(kernel_name(self.name, variant.value, spec, tiles), grid, block)
        group = (4 if tiles.channels > 1 else 1) if variant is Col2imVariant.GATHER_CHANNELS_LAST_TILED else tiles.channels
        context = Col2imContext(**index.template_context(alg, launch.threads), variant=variant, kernel=launch.kernel,
                                block_threads=block[0] * block[1], dtype=spec.dtype, reference_terms=alg.taps,
                                group=group, group_coords=[index.to_c(e) for e in alg.image_coords_in_groups(group)],
                                groups_total=groups_total, spatial_elements=math.prod(spec.input_size))
        itemsize = spec.dtype.itemsize
        buffers = (Buffer("col", alg.col_shape, "in", itemsize, spec.dtype),
                   Buffer("image", alg.image_shape, "out", itemsize, spec.dtype))
        return KernelPlan(self.name, variant.value, spec, tiles, buffers, (launch,), context,
                          zero_output=variant is Col2imVariant.SCATTER, atomic_sums=variant is Col2imVariant.SCATTER)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        (col,) = inputs
        return image_reference(spec, precision.from_storage(col, spec.dtype))

    def error_bound(self, spec: ConvSpec, inputs, plan: KernelPlan | None = None) -> np.ndarray:
        """``codegen.precision``'s model for a sum of at most L = taps entries, each exact in FP32:
        |y - y*| <= E + u_out (|y*| + E) + eta_out, E = e_acc L S, for the exact sum y* and the
        sum S of the entries' magnitudes."""
        col = precision.from_storage(inputs[0], spec.dtype)
        roundoff = self.roundoff(spec)
        accumulated = roundoff.accumulation * self.algebra(spec).taps * image_reference(spec, np.abs(col))
        return (accumulated + roundoff.output * (np.abs(image_reference(spec, col)) + accumulated)
                + roundoff.output_absolute)


FAMILY = Col2im()
