"""Implicit-GEMM convolution on Hopper's warpgroup MMA (``wgmma.mma_async``, sm_90a): float16,
bfloat16 and float32 with math tf32 on channels-last data whose channel runs allow 16-byte copies;
the variant ``wgmma`` of implicit_gemm's tensor-core kernel (``mma_gemm``), which owns the tiles and
the family.

The GEMM is mma_gemm's: M output pixels, N output channels, K = C x taps in the filter's own order,
A(m, k) the input pixel that pixel m reads for column k (zero in the padding), B(n, k) = w[n *
GEMM_K + k]. A persistent CTA (one per SM) walks its tiles with one producer warpgroup and one or
two consumer warpgroups. The producer fills a ring of ``stages`` k-slices (``block_k`` elements a
row, 128 bytes where C allows, else 64 or 32: ``SLICE_CHOICES``; A and B both k-major) in the swizzle
of the row's width (16-byte chunk j of row r at j ^ (r x width / 128 mod width / 16)): its first thread copies B's slice with one tiled TMA copy (zeros past N and K) and,
where each slice is one tap's channels (``a_by_tma``), A's with one im2col TMA copy (zeros in the
padding and past M), expecting their bytes on the slice's "full" mbarrier; elsewhere every producer
thread copies A with 16-byte ``cp.async`` copies, zero-filled where a tap lies in the padding or
past M or K, and arrives on "full" once they have landed. Each consumer warpgroup owns warp_m rows
of the block_m x block_n tile: it waits on "full", orders cp.async's writes before its MMAs
(``fence.proxy.async``: wgmma reads shared memory through the async proxy, cp.async writes through
the generic one; TMA writes through the async proxy and needs none), issues m64n{block_n}k16
(16-bit) or k8 (TF32) MMAs from two shared-memory descriptors, and releases the slice on its
"empty" mbarrier once the next slice's MMAs are issued and this one's retired. The FP32
accumulators are rounded once (16-bit outputs), in the epilogue, and stored from registers while
the producer already fills the next tile's slices; with ``pingpong`` the two consumer warpgroups
take alternate tiles whole, with ``split_k`` a tile's k-slices are split into work units whose FP32
partial tiles go to a workspace that a second kernel adds up in range order (deterministic,
rounded once for 16-bit outputs: CUTLASS's "parallel" split-K), and with ``cluster_m`` the blocks
of a thread-block cluster take neighbouring M tiles of a unit, each multicasting its share of B's
rows to all, and release each stage on every block's "empty" mbarrier.

TF32 operands reach the tensor cores as the float32 bits copied (TMA or cp.async): wgmma reads
them from shared memory and drops the low 13 mantissa bits (truncation), as CUTLASS's sm_90 TF32
kernels on float data do.  Rounding them to nearest would take a pass over every slice in shared memory, as
many bytes again as the MMAs read; the error bound takes the truncation instead
(``KernelPlan.tf32_truncated``).

With A by cp.async, a pixel's base offset and padded-axis origins are computed once per tile into a
shared table (``pixel_entry_bytes``): the producer's few registers (``REGISTER_SPLIT``) could not
hold them for the 16 rows a thread copies.

3xTF32 (``promotes``; CUTLASS's "fast accurate FP32") needs each operand as a TF32 big part and a TF32
small part, both rounded to nearest, and three MMAs a k-step: a_big b_big + a_big b_small + a_small b_big.
A first kernel splits the filter once into a big and a small plane (a workspace of twice the filter);
TMA copies each slice's B parts from them, and A (by TMA only) raw. The consumers load each k-step's A
fragments from shared memory into registers (ldmatrix), split them there and issue the MMAs with A from
registers: A is read from shared memory once rather than three times, and the ring holds it once. The
tensor cores truncate what they add, so each slice's products are summed from zero in a second
accumulator set and added to the FP32 sums once the slice's MMAs retire: that caps the tiles at
``PROMOTED_ACCUMULATORS`` a thread (128x128 tiles take four stages: B twice, A once).
"""
from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any

from codegen import index, launch_limits
from codegen.device import Device, as_device
from codegen.families import epilogue
from codegen.families.base import (Buffer, ConvolutionContext, KernelPlan, Launch, TensorMap,
                                   convolution_selftest_context, kernel_name)
from codegen.families.gemm_tiles import check_im2col_map, k_split
from codegen.spec import ConvSpec, DType, MathMode, SpecError
from codegen.terms.gemm import gemm_sizes, gemm_terms
from codegen.terms.implicit_gemm import im2col_map_terms

VARIANT = "wgmma"
ARCH = 90
"""wgmma exists on sm_90a alone (Blackwell's tensor cores take other instructions)."""
SLICE_CHOICES = (128, 64, 32)
"""Bytes of a k-slice row (``block_k`` elements), each in the swizzle of its own width, whose 8-row atoms the MMA
descriptors walk. A narrower slice makes every slice one tap's channels where C is a multiple of it and not of
128 bytes, so that A comes by TMA (cuDNN runs C 96 in BF16 in 32-element slices); the heuristic takes 64 bytes
on shared tiles only (``NARROW_SLICE``)."""
NARROW_SLICE = 64
"""The narrower slice the heuristic takes, on shared tiles, with clusters of 2 (``_narrowed``). H100, against the
128-byte slices by cp.async it replaced: BF16 conv5 (C 96, 128x256) 526 -> 580 TFLOP/s (64 bytes alone 516-536,
128 bytes with a cluster 531), unet3d_l1 198 -> 205, unseen g_seg_32_64_160 148 -> 163; TF32 (C 16) g_gnet_5x5_16_32
45 -> 48, g_seg_16_16_256 38 -> 39. 64-byte slices on ping-pong tiles ran 10-12 % slower (g_gnet_5x5_32_96,
g3_dil2_32), and 32-byte slices (C 16, BF16) 28-30 % slower, so the heuristic takes neither."""
MAX_STAGES = 24
"""Ring stages: the tuner's 5 stages of 128-byte slices are 20 of 32-byte ones."""
SWIZZLE_MODES = {128: 1, 64: 2, 32: 3}
"""The layout type (bits 62-63) of a wgmma shared-memory descriptor for each swizzle width."""
CHUNK_BYTES = 16
PRODUCER_THREADS = 128
WARPGROUP = 128
MMA_ROWS = 64
"""The M of one wgmma: a consumer warpgroup's rows are 1 or 2 such blocks."""
MMA_K_BYTES = 32
"""The k of one wgmma (16 16-bit or 8 TF32 elements), as a step of the descriptor's start address."""
MAX_ACCUMULATORS = 128
"""FP32 accumulators per consumer thread (a warpgroup's 64x256 or 128x128 tile)."""
PROMOTED_ACCUMULATORS = 64
"""3xTF32's accumulators per consumer thread in each of its two sets (a warpgroup's 64x128 or 128x64 tile): the
unit's sums, and a slice's products (``promote``)."""
PROMOTED_MIN_CHANNELS = 64
"""3xTF32 specs with at least these output channels take WGMMA (``preferred``)."""
PROMOTED_MIN_SLICE = 64
"""... and so do those whose A comes in slices of at least these bytes (C a multiple of 16); the others keep
mma.sync."""
FILTER_SPLIT_THREADS = 256
FILTER_SPLIT_BLOCKS_PER_SM = 8
"""The filter's split kernel: a grid-stride loop, at most this many blocks of ``FILTER_SPLIT_THREADS`` per SM."""
MAX_CONSUMERS = 2
CLUSTER_CHOICES = (1, 2)
"""CTAs of a cluster sharing B (``cluster_m``): each multicasts half the slice's rows. Clusters of 4
ran correctly, but a grid of 33 of them did not fit the H100 at once (30 did), which ran 45 % slower
(TC v5): 4 waits for a grid sized by the driver's count of clusters that fit."""
BLOCK_N_CHOICES = (32, 64, 128, 256)
"""Output-channel tiles: powers of two up to wgmma's largest N (256), from 32 so that the tuner's
space stays small and a cluster block's share of B's rows is a whole 8-row swizzle atom."""
TUNING_STAGES = (2, 3, 4, 5)
"""Stages the tuner tries: on the prototype 5 ran no faster than 4 with shared tiles; ping-pong's
smaller tiles gained from 4 to 5 (conv12, 64x256: 455 to 462 TFLOP/s in BF16)."""
PINGPONG_WIDTH = 128
"""16-bit shared tiles of this many channels run as ping-pong's 128-row tiles (``heuristic_fields``)."""
WAVE_GAIN = 1.25
"""Shared tiles 128 channels wide or more give way to ping-pong's 128x128 where those fill the SMs' rounds
of work by this much more (``_wave_share``). H100: conv11 (144 tiles of 128x256 on 132 SMs, 1.33x the share)
ran 435 -> 552 TFLOP/s BF16 and 217 -> 274 TF32; unseen g_alexnet_c2 (1.29x) 498 -> 511 and 276 -> 365;
conv5 (1.14x, left as it was) 529 -> 508 BF16, 309 -> 350 TF32. Narrower tiles lost as ping-pong's 128x32
(g_sr_64_12_b4: -6 % BF16, -10 % TF32), as they did before (docs/perf-history.md, TC v5)."""
PINGPONG_STAGES = 5
"""Ping-pong's stages: 5 against 4 ran conv8's 128x128 tiles 5 % faster in both precisions and
conv12's 64x256 2-4 % faster (conv12's 128x128 1 % slower in BF16); 6 ran no faster than 5."""
REGISTER_SPLIT = (56, 224)
"""``setmaxnreg`` registers of a producer and a consumer thread with two consumer warpgroups
(384 threads, 64,512 of the 65,536): at 40 the producer spilled 4 bytes on 256-channel tiles."""
TABLE_REGISTERS = 32
"""Registers a producer thread gives the table entries it loads before their copies (of its 56)."""
PIXEL_ENTRY_ALIGNMENT = 16
"""A pixel's table entry is 16-byte aligned, so that one shared load reads it."""
MMA_TYPES = {DType.float16: "f16", DType.bfloat16: "bf16", DType.float32: "tf32"}
"""wgmma's operand type for each dtype (float32 with math tf32 only)."""
TUNING_SPLITS = (1, 2, 4, 8, 16)
MAX_SPLIT_K = 16
MAX_TAIL_SPLIT = 32
"""Ranges a tile of the last round may be split into (``tail_split``): 132 SMs over 4 tail tiles give 33."""
MIN_TAIL_SPLIT = 4
MAX_TAIL_ROUNDS = 3
"""The heuristic splits the last round's tiles in at least ``MIN_TAIL_SPLIT`` ranges, after at most
``MAX_TAIL_ROUNDS`` whole rounds (``_tail_split``). H100, A/B against no split: BF16 conv5 (3 rounds, 9 ranges)
574 -> 672 TFLOP/s, conv11 (2, 5) 553 -> 602; TF32 conv5 (3, 15) 304 -> 371, conv11 (2, 5) 276 -> 331. After more
rounds the last is a small share of the time and the second pass cost more than it saved (conv9, 11 rounds: -3 %;
conv10, 5: -3 %); in 2-3 ranges the last round still took half a round or more (unseen g3_temporal_128 TF32 -19 %,
g_dil_asym_64 BF16 -13 %; g_7x7_64_64_56 BF16 +12 % was the exception)."""
MIN_SPLIT_SLICES = 4
SPLIT_SM_SHARE = 4
"""Split-K where the tiles fill at most a quarter of the SMs (``_split_k``)."""
REDUCE_THREADS = 256
"""Threads of a block of the split-K reduction, which sums each output's partials in split order."""
ORDER_BARRIER = 2
"""The first of ping-pong's two named barriers (0 is __syncthreads', 1 the producer's)."""
DEFAULT_STAGES = 4
"""H100, BF16 256x128 tiles: 4 stages ran conv8 8 % faster than 3 (c3d_conv2 3 % slower)."""


def covers(spec: ConvSpec) -> bool:
    """Channels-last float16 or bfloat16 with C and the pitch multiples of 8, or float32 with math
    tf32 or 3xtf32 and multiples of 4, so that every 16-byte copy is channels of one pixel at one
    tap, and every filter row 16-byte aligned; 3xtf32 where A also comes by TMA (the only way its
    kernel loads A, whose fragments its consumers read from the slices TMA lands)."""
    unit = CHUNK_BYTES // spec.dtype.itemsize
    precision = (spec.dtype in (DType.float16, DType.bfloat16)
                 or (spec.dtype is DType.float32 and spec.math in (MathMode.tf32, MathMode.three_tf32)))
    aligned = precision and spec.layout.channels_last and spec.c % unit == 0 and spec.pitch % unit == 0
    return aligned and (spec.math is not MathMode.three_tf32 or tma_slice_bytes(spec) is not None)


def promotes(spec: ConvSpec) -> bool:
    """3xTF32: B from the filter split once into TF32 big and small planes, A's fragments split in the
    consumers' registers, three MMAs a k-step, and each slice's products promoted into FP32 sums. As with
    every 3xTF32 (CUTLASS's, mma.sync's), an infinite operand gives NaN (its small part is inf - inf),
    and so does a finite one within a TF32 unit of the float32 maximum (its big part rounds to inf)."""
    return spec.math is MathMode.three_tf32


def preferred(spec: ConvSpec) -> bool:
    """Whether the heuristic takes this kernel for a spec it covers: a 3xTF32 spec where its output channels are at
    least ``PROMOTED_MIN_CHANNELS`` or A's slices at least ``PROMOTED_MIN_SLICE`` bytes wide. H100 against mma.sync's
    3xTF32 (docs/perf-history.md, TC v11): the 35 channels-last layers of 64 output channels or more ran 1.33-7.6x
    (geometric mean 2.43x); of the six with 12-32, the five with C a multiple of 16 ran 0.99-1.98x, the one with C 8
    (32-byte slices) 0.66x."""
    return not promotes(spec) or spec.k >= PROMOTED_MIN_CHANNELS or (tma_slice_bytes(spec) or 0) >= PROMOTED_MIN_SLICE


def accumulator_limit(spec: ConvSpec) -> int:
    return PROMOTED_ACCUMULATORS if promotes(spec) else MAX_ACCUMULATORS


def a_by_tma(spec: ConvSpec, block_k: int) -> bool:
    """A's slices of ``block_k`` channels through TMA's im2col mode, one copy a slice (CUTLASS's and
    cuDNN's sm_90 implicit GEMM): where each k-slice is channels of one tap (C a multiple of the
    slice) and the map can encode the spec's strides and padding; else the producer warpgroup's
    cp.async copies."""
    return spec.c % block_k == 0 and _im2col_encodable(spec)


@functools.lru_cache(maxsize=4096)
def _im2col_encodable(spec: ConvSpec) -> bool:
    """Kept per spec: the map's symbolic terms cost about half a millisecond, and the sizing of
    shared memory asks for every tile the heuristic and the tuner weigh."""
    try:
        check_im2col_map(spec)
        terms = im2col_map_terms(index.IndexAlgebra(spec))
        launch_limits.check_tensor_map("x", terms["dims"], terms["strides"])
    except SpecError:
        return False
    return True


def runs_on(device: Device) -> bool:
    return device.capability == ARCH


def slice_k(spec: ConvSpec, width: int = SLICE_CHOICES[0]) -> int:
    """Elements of a k-slice row of ``width`` bytes."""
    return width // spec.dtype.itemsize


def slice_bytes(spec: ConvSpec, tiles) -> int:
    return tiles.block_k * spec.dtype.itemsize


def tma_slice_bytes(spec: ConvSpec) -> int | None:
    """The widest slice of ``SLICE_CHOICES`` that takes A by TMA, or None."""
    return next((width for width in SLICE_CHOICES if a_by_tma(spec, slice_k(spec, width))), None)


def consumers(tiles) -> int:
    """Consumer warpgroups: ping-pong's two, each with whole tiles; else one per warp_m rows of the tile."""
    return MAX_CONSUMERS if tiles.pingpong else tiles.block_m // tiles.warp_m


def threads(tiles) -> int:
    return PRODUCER_THREADS + WARPGROUP * consumers(tiles)


def check_geometry(tiles) -> None:
    """What any spec needs of WGMMA tiles (``mma_gemm.MmaTiles`` with wgmma set): a consumer
    warpgroup's warp_m rows are whole 64-row MMAs, and it spans the tile's block_n columns."""
    if tiles.warp_m not in (MMA_ROWS, 2 * MMA_ROWS):
        raise SpecError("tiles.warp_m", tiles.warp_m, f"must be {MMA_ROWS} or {2 * MMA_ROWS} with wgmma (the rows of a "
                        f"consumer warpgroup, in {MMA_ROWS}-row MMAs)")
    if tiles.block_n not in BLOCK_N_CHOICES:
        raise SpecError("tiles.block_n", tiles.block_n, f"must be one of {BLOCK_N_CHOICES} with wgmma")
    if tiles.warp_n != tiles.block_n:
        raise SpecError("tiles.warp_n", tiles.warp_n, f"must equal block_n ({tiles.block_n}) with wgmma: each consumer "
                        "warpgroup spans the tile's output channels")
    if tiles.pingpong and tiles.block_m != tiles.warp_m:
        raise SpecError("tiles.block_m", tiles.block_m, f"must equal warp_m ({tiles.warp_m}) with pingpong: each "
                        "consumer warpgroup takes whole tiles")
    if tiles.block_m % tiles.warp_m or not 1 <= consumers(tiles) <= MAX_CONSUMERS:
        raise SpecError("tiles.block_m", tiles.block_m, f"must be 1 or {MAX_CONSUMERS} times warp_m ({tiles.warp_m}) "
                        "with wgmma: one consumer warpgroup per warp_m rows")
    if tiles.cluster_m not in CLUSTER_CHOICES:
        raise SpecError("tiles.cluster_m", tiles.cluster_m, f"must be one of {CLUSTER_CHOICES} with wgmma")
    if tiles.warp_m * tiles.warp_n // WARPGROUP > MAX_ACCUMULATORS:
        raise SpecError("tiles.warp_n", tiles.warp_n, f"with warp_m {tiles.warp_m} gives each consumer thread "
                        f"{tiles.warp_m * tiles.warp_n // WARPGROUP} accumulators; at most {MAX_ACCUMULATORS}")


def check_spec(spec: ConvSpec, device: Device) -> None:
    """Refuse, naming the tile field, a spec or target the WGMMA kernel cannot run."""
    if not runs_on(device):
        raise SpecError("tiles.wgmma", True, f"needs sm_{ARCH} (wgmma is an sm_{ARCH}a instruction); the target "
                        f"{device.name} is {device.arch}: leave wgmma off for the portable mma.sync kernel")
    if not covers(spec):
        math = f" math={spec.math.value}" if spec.dtype is DType.float32 else ""
        raise SpecError("tiles.wgmma", True, "takes channels-last float16, bfloat16, or float32 with math tf32 or "
                        "3xtf32, with C and the channel pitch multiples of 8 (16-bit) or 4 (float32) for 16-byte "
                        "copies (3xtf32: and A by TMA, C a multiple of 8); this spec "
                        f"is {spec.layout.value} {spec.dtype.value}{math} with C {spec.c}, pitch {spec.pitch}")


def check_tiles(spec: ConvSpec, tiles, device: Device) -> None:
    check_spec(spec, device)
    limit = accumulator_limit(spec)
    if tiles.warp_m * tiles.warp_n // WARPGROUP > limit:
        raise SpecError("tiles.warp_n", tiles.warp_n, f"with warp_m {tiles.warp_m} gives each consumer thread "
                        f"{tiles.warp_m * tiles.warp_n // WARPGROUP} accumulators; 3xtf32 takes at most {limit} with "
                        "wgmma (its sums and a slice's products both live in registers)")
    if promotes(spec) and not a_by_tma(spec, tiles.block_k):
        raise SpecError("tiles.block_k", tiles.block_k, f"must divide C ({spec.c}) with wgmma 3xtf32, so that A comes "
                        f"by TMA (the only way the 3xTF32 kernel loads it): {slice_k(spec, tma_slice_bytes(spec))} does")
    k_split(spec, tiles)
    schedule(spec, tiles, device)   # tail_split within the k-slices
    allowed = tuple(slice_k(spec, width) for width in SLICE_CHOICES)
    if tiles.block_k not in allowed:
        raise SpecError("tiles.block_k", tiles.block_k, f"must be one of {allowed} with wgmma {spec.dtype.value} "
                        f"(slice rows of {' / '.join(map(str, SLICE_CHOICES))} bytes, each in the swizzle of its width, "
                        "which the MMA descriptors read)")
    m_tiles = -(-gemm_sizes(index.IndexAlgebra(spec))[0] // tiles.block_m)
    if tiles.cluster_m > m_tiles:
        raise SpecError("tiles.cluster_m", tiles.cluster_m, f"must be at most the {m_tiles} M tile(s) of "
                        f"{tiles.block_m} rows (a cluster's blocks take neighbouring M tiles)")
    needed = shared_bytes(spec, tiles)
    if needed > device.shared_per_block:
        raise SpecError("tiles.stages", tiles.stages, f"gives {needed} bytes of shared memory per block; "
                        f"{device.name} allows {device.shared_per_block} (fewer stages or smaller tiles)")


def index_type(spec: ConvSpec, tiles) -> str:
    alg = index.IndexAlgebra(spec)
    return alg.index_type(_padded_rows(alg, tiles), False)


def _padded_rows(alg: index.IndexAlgebra, tiles) -> int:
    """GEMM M rounded up to whole clusters of tiles: the pixel rows the kernel's index arithmetic
    reaches."""
    rows = tiles.block_m * tiles.cluster_m
    return -(-alg.cols // rows) * rows


def _slots(spec: ConvSpec, tiles) -> int:
    """A pixel's int slots: its origin on each padded axis, or where no axis is padded but the tile
    rows (in whole clusters of tiles) pass M, one saying whether the pixel exists."""
    alg = index.IndexAlgebra(spec)
    return sum(1 for p in spec.padding if p > 0) or (1 if _padded_rows(alg, tiles) != alg.cols else 0)


def pixel_entry_bytes(spec: ConvSpec, tiles) -> int:
    """A pixel's table entry: its base offset (4 or 8 bytes) and its slots, 16-byte aligned."""
    size = (8 if index_type(spec, tiles) == "long long" else 4) + 4 * _slots(spec, tiles)
    return -(-size // PIXEL_ENTRY_ALIGNMENT) * PIXEL_ENTRY_ALIGNMENT


def table_batch(spec: ConvSpec, tiles) -> int:
    """Entries a producer thread loads before issuing their copies: as many of its rows as
    ``TABLE_REGISTERS`` hold (a power of two, so that they divide the rows)."""
    rows = tiles.block_m // (PRODUCER_THREADS * CHUNK_BYTES // slice_bytes(spec, tiles))
    entry_registers = (2 if index_type(spec, tiles) == "long long" else 1) + _slots(spec, tiles)
    return min(rows, 1 << ((TABLE_REGISTERS // entry_registers).bit_length() - 1))


def shared_bytes(spec: ConvSpec, tiles) -> int:
    """Up to 1 KB to reach the swizzle's 1024-byte period, the stages of A and B (3xTF32: B twice,
    its big and small parts), the pixel table (A by cp.async) and the full and empty mbarriers."""
    table = 0 if a_by_tma(spec, tiles.block_k) else tiles.block_m * pixel_entry_bytes(spec, tiles)
    b_parts = 2 if promotes(spec) else 1
    return (1024 + tiles.stages * (tiles.block_m + b_parts * tiles.block_n) * slice_bytes(spec, tiles) + table
            + 16 * tiles.stages)


def _tile_count(gemm_m: int, gemm_n: int, block_m: int, block_n: int) -> int:
    return -(-gemm_m // block_m) * -(-gemm_n // block_n)


def heuristic_fields(spec: ConvSpec, device: Device | str | None = None) -> dict[str, Any]:
    """A first rule, from H100 timings (BF16, docs/perf.md): the largest tile no wider than K needs
    that still gives every SM a tile, largest area first and at equal area the wider one (A, the
    im2col operand, is then read for fewer channel tiles); where none does, the smallest.  256x128
    ran conv8 and c3d_conv2 at 386 and 410 TFLOP/s (128x128: 360, 397; 256x64: 277, 266); on
    c3d_conv3 (K 256) 128x256 ran 566 against 441 for 256x128.  Two consumer warpgroups where the
    tile has 128 rows or more; ``DEFAULT_STAGES`` stages or as many as fit.

    Where that leaves a 64-row tile, one consumer warpgroup, the two take alternate tiles instead
    (``pingpong``), with ``PINGPONG_STAGES`` stages, of the warpgroup tile that leaves the busiest
    SM the least work (tiles per SM, rounded up, times the tile's area), at equal work the largest
    and then the widest, among tiles at least half the largest's area (smaller ones multiply less
    per byte of shared memory their MMAs read, which the count of work leaves out): on conv12 (3200
    x 512 x 4608) every shape leaves one 16384-element tile's work, and 64x256 ran 462 TFLOP/s in
    BF16 (128x128 437, 64x128 367, shared 64x128 tiles 299; TF32 276, 262, 201, 165). Where tiles
    are many, ping-pong ran conv8 7 % faster in BF16 but conv8 in TF32 and c3d_conv2 and c3d_conv3
    1-21 % slower, so the consumers share tiles there. With A by TMA, 16-bit shared tiles 128
    channels wide ran slower than ping-pong's 128x128 on every layer tried (TC v5: conv10 389 -> 483
    TFLOP/s BF16, conv8 425 -> 462, c3d_conv2 577 -> 607, and two unseen layers), so 16-bit with A
    by TMA takes ping-pong there; narrower tiles and TF32 stayed mixed (conv4 BF16 -6 %, c3d_conv2
    TF32 -6 %), and A by cp.async was not measured, so they keep shared tiles. K is split where the
    tiles are very few (``_split_k``). Shared tiles 128 channels wide or more whose last round of
    work leaves many SMs idle take ping-pong's 128x128 where that fills the rounds ``WAVE_GAIN``
    times better, with A by TMA or by cp.async (conv11, TMA; unseen g_alexnet_c2, cp.async)."""
    device = as_device(device)
    if promotes(spec):
        return _promoted_fields(spec, device)
    gemm_m, gemm_n, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
    block_k = slice_k(spec)
    widest = min(BLOCK_N_CHOICES[-1], max(BLOCK_N_CHOICES[0], 1 << (gemm_n - 1).bit_length()))

    def largest_filling(largest: int, rows: tuple[int, ...]) -> tuple[int, int]:
        shapes = sorted(((block_m, block_n) for block_n in BLOCK_N_CHOICES if block_n <= widest
                         for block_m in rows if block_m * block_n <= largest),
                        key=lambda shape: (-shape[0] * shape[1], -shape[1]))
        return next((shape for shape in shapes if _tile_count(gemm_m, gemm_n, *shape) >= device.sm_count),
                    shapes[-1])

    block_m, block_n = largest_filling(MAX_CONSUMERS * WARPGROUP * MAX_ACCUMULATORS, (256, 128, 64))
    if block_m == MMA_ROWS:
        shapes = [(rows, cols) for cols in BLOCK_N_CHOICES if cols <= widest
                  for rows in (2 * MMA_ROWS, MMA_ROWS) if rows * cols <= WARPGROUP * MAX_ACCUMULATORS]
        largest = max(rows * cols for rows, cols in shapes)
        block_m, block_n = min((shape for shape in shapes if 2 * shape[0] * shape[1] >= largest),
                               key=lambda shape: (-(-_tile_count(gemm_m, gemm_n, *shape) // device.sm_count)
                                                  * shape[0] * shape[1], -shape[0] * shape[1], -shape[1]))
        fields = {"block_m": block_m, "block_n": block_n, "block_k": block_k, "warp_m": block_m,
                  "warp_n": block_n, "wgmma": True, "pingpong": True}
    elif block_n == PINGPONG_WIDTH and spec.dtype is not DType.float32 and a_by_tma(spec, block_k):
        fields = {"block_m": 2 * MMA_ROWS, "block_n": block_n, "block_k": block_k, "warp_m": 2 * MMA_ROWS,
                  "warp_n": block_n, "wgmma": True, "pingpong": True}
    elif (block_n >= PINGPONG_WIDTH
          and _wave_share(_tile_count(gemm_m, gemm_n, 2 * MMA_ROWS, PINGPONG_WIDTH), device.sm_count)
          >= WAVE_GAIN * _wave_share(_tile_count(gemm_m, gemm_n, block_m, block_n), device.sm_count)):
        fields = {"block_m": 2 * MMA_ROWS, "block_n": PINGPONG_WIDTH, "block_k": block_k, "warp_m": 2 * MMA_ROWS,
                  "warp_n": PINGPONG_WIDTH, "wgmma": True, "pingpong": True}
    else:
        fields = _narrowed(spec, {"block_m": block_m, "block_n": block_n, "block_k": block_k,
                                  "warp_m": block_m // MAX_CONSUMERS, "warp_n": block_n, "wgmma": True}, gemm_m)
    return _fitted(spec, fields, device)


def _promoted_fields(spec: ConvSpec, device: Device) -> dict[str, Any]:
    """3xTF32's tiles: 128 rows shared by two consumer warpgroups of 64, up to 128 channels wide
    (``PROMOTED_ACCUMULATORS`` a thread in each set), or where those tiles leave SMs idle, ping-pong's
    64-row tiles; A by TMA in the widest slice that takes it (64-byte slices in clusters of 2, as
    ``_narrowed``); stages and splits as ``_fitted`` takes them. H100, A from registers (TC v11, conv8,
    c3d_conv2, c3d_conv3, conv4): 128x64 shared ran 16-22 % and 64x128 ping-pong 24-32 % slower than
    128x128 shared, 3 stages within 1-3 % of 4, clusters of 2 within 1-6 %; on conv4 (64 channels: 128x64
    shared) 5 and 6 stages within 4 % of 4 and ping-pong 64x64 26-29 % slower."""
    gemm_m, gemm_n, _ = gemm_sizes(index.IndexAlgebra(spec))
    block_n = min(PINGPONG_WIDTH, max(BLOCK_N_CHOICES[0], 1 << (gemm_n - 1).bit_length()))
    fields = {"block_m": 2 * MMA_ROWS, "block_n": block_n, "block_k": slice_k(spec, tma_slice_bytes(spec)),
              "warp_m": MMA_ROWS, "warp_n": block_n, "wgmma": True}
    if _tile_count(gemm_m, gemm_n, 2 * MMA_ROWS, block_n) < device.sm_count:
        fields.update(block_m=MMA_ROWS, pingpong=True)
    else:
        fields = _narrowed(spec, fields, gemm_m)
    return _fitted(spec, fields, device)


def _narrowed(spec: ConvSpec, fields: dict[str, Any], gemm_m: int) -> dict[str, Any]:
    """Shared tiles in ``NARROW_SLICE``-byte slices with A by TMA, in clusters of 2 that multicast B, where C
    takes A by TMA in those slices but not in 128-byte ones and there are M tiles to pair: the narrower
    slices issue twice B's copies, and the cluster halves them again."""
    if tma_slice_bytes(spec) != NARROW_SLICE or -(-gemm_m // fields["block_m"]) < CLUSTER_CHOICES[-1]:
        return fields
    return {**fields, "block_k": slice_k(spec, NARROW_SLICE), "cluster_m": CLUSTER_CHOICES[-1]}


def _wave_share(tiles: int, sm_count: int) -> float:
    """The share of the SMs' rounds of work that the tiles fill: a last wave of 12 tiles on 132 SMs
    costs a whole round (CUTLASS and cuBLAS weigh this wave quantisation when they pick a tile)."""
    return tiles / (-(-tiles // sm_count) * sm_count)


def _fitted(spec: ConvSpec, fields: dict[str, Any], device: Device, kept=()) -> dict[str, Any]:
    """``fields`` with the stages, split_k and tail_split the heuristic takes for their tile, but those
    named in ``kept``: the schedule's stages (``PINGPONG_STAGES`` or ``DEFAULT_STAGES``) or as many as
    fit, the split of ``_split_k`` (none where a tail split is asked for) and the last round's of
    ``_tail_split`` (none with split-K); all counted in 128-byte slices, so that a narrower slice keeps
    as many bytes in flight and splits K at the same lengths."""
    fields = dict(fields)
    width = fields["block_k"] * spec.dtype.itemsize
    narrowing = SLICE_CHOICES[0] // width if width in SLICE_CHOICES else 1   # else check_tiles refuses block_k
    if "stages" not in kept:
        fields["stages"] = (PINGPONG_STAGES if fields.get("pingpong") else DEFAULT_STAGES) * narrowing
        while fields["stages"] > 2 and shared_bytes(spec, _shape(fields)) > device.shared_per_block:
            fields["stages"] -= 1
    gemm_m, gemm_n, _ = gemm_sizes(index.IndexAlgebra(spec))
    wide_slices = _wide_slices(spec)
    if "split_k" not in kept:
        fields.pop("split_k", None)
        split = _split_k(_tile_count(gemm_m, gemm_n, fields["block_m"], fields["block_n"]), wide_slices,
                         device.sm_count)
        if split > 1 and not ("tail_split" in kept and fields.get("tail_split") != 1):
            fields["split_k"] = split
    if "tail_split" not in kept:
        fields.pop("tail_split", None)
        tail = _tail_split(*_work(gemm_m, gemm_n, fields["block_m"], fields["block_n"], fields.get("cluster_m", 1),
                                  device.sm_count), wide_slices)
        if tail > 1 and fields.get("split_k", 1) == 1:
            fields["tail_split"] = tail
    return fields


def _split_k(tiles: int, k_tiles: int, sm_count: int) -> int:
    """Split-K where the tiles fill at most 1 / ``SPLIT_SM_SHARE`` of the SMs: the most ranges
    that still take one wave of work units, at most ``MAX_SPLIT_K``, each range at least
    ``MIN_SPLIT_SLICES`` slices.  H100 (docs/perf-history.md, TC v3-v4): with 4 and 8 tiles splitting
    ran up to 2.7x faster (g_3x3_512_b1 BF16 9.9 -> 26.9 TFLOP/s with 16, TF32 5.5 -> 24.1); with
    69-100 tiles a split leaves the busiest SM two units, and 2-16 ranges ran up to 71 % slower
    (conv12 BF16: 468 TFLOP/s unsplit, 342 in 2, 143 in 16). With 49-64 tiles 2 ranges ran 8 %
    slower to 23 % faster (three layers, not enough to fit a rule on)."""
    if SPLIT_SM_SHARE * tiles > sm_count:
        return 1
    return max(1, min(MAX_SPLIT_K, sm_count // tiles, k_tiles // MIN_SPLIT_SLICES))


def _work(gemm_m: int, gemm_n: int, block_m: int, block_n: int, cluster: int, sm_count: int) -> tuple[int, int]:
    """(work units, slots): the output tiles in clusters of ``cluster`` M tiles, and the blocks (or
    clusters) of the persistent grid that take them a round at a time."""
    return -(-gemm_m // (block_m * cluster)) * -(-gemm_n // block_n), max(1, sm_count // cluster)


def _wide_slices(spec: ConvSpec) -> int:
    """K in 128-byte slices, the unit the split rules count in whatever the slice's width."""
    return -(-gemm_sizes(index.IndexAlgebra(spec))[2] * spec.dtype.itemsize // SLICE_CHOICES[0])


def _tail_split(units: int, slots: int, k_tiles: int) -> int:
    """Ranges for each tile of the last round where 1 to ``MAX_TAIL_ROUNDS`` whole rounds come before it
    and at least ``MIN_TAIL_SPLIT`` ranges fit the slots (blocks, or clusters) it leaves: as many as fill
    the round, each at least ``MIN_SPLIT_SLICES`` 128-byte slices; else 1."""
    tail = units % slots
    if not tail or not 1 <= units // slots <= MAX_TAIL_ROUNDS:
        return 1
    ranges = min(MAX_TAIL_SPLIT, slots // tail, k_tiles // MIN_SPLIT_SLICES)
    return ranges if ranges >= MIN_TAIL_SPLIT else 1


@dataclass(frozen=True)
class Schedule:
    """How the persistent blocks walk their work: ``units`` whole output tiles (in clusters of ``cluster_m``
    M tiles), the first ``whole_units`` of them whole and the ``tail_tiles`` after them (the last round's)
    each split into ``tail_splits`` K ranges of ``tail_k_per_split`` slices; ``units_total`` work units
    (times split_k's ranges where K is split)."""

    m_tiles: int
    n_tiles: int
    units: int
    slots: int
    whole_units: int
    tail_tiles: int
    tail_splits: int
    tail_k_per_split: int
    units_total: int
    grid_blocks: int
    tail_first_row: int
    """The first GEMM row of the last round's tiles: the partial tiles hold rows from it to M."""


def schedule(spec: ConvSpec, tiles, device: Device) -> Schedule:
    """The walk of ``tiles`` on ``device``'s SMs: a last round split only where whole rounds come
    before it (``tail_split`` ranges of whole slices, as ``split_k``'s); refused, naming the field,
    where tail_split passes the k-slices."""
    gemm_m, gemm_n, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
    m_tiles, n_tiles = -(-gemm_m // tiles.block_m), -(-gemm_n // tiles.block_n)
    cluster = tiles.cluster_m
    units, slots = _work(gemm_m, gemm_n, tiles.block_m, tiles.block_n, cluster, device.sm_count)
    splits, _ = k_split(spec, tiles)
    tail_tiles, tail_splits, per_range = 0, 1, 0
    if tiles.tail_split > 1:
        k_tiles = -(-gemm_k // tiles.block_k)
        if tiles.tail_split > k_tiles:
            raise SpecError("tiles.tail_split", tiles.tail_split, f"must be at most the {k_tiles} k-slices of "
                            f"{tiles.block_k} that K = {gemm_k} makes")
        tail_tiles = units % slots if units > slots else 0
        per_range = -(-k_tiles // tiles.tail_split)
        tail_splits = -(-k_tiles // per_range) if tail_tiles else 1
    if tail_splits == 1:
        tail_tiles, per_range = 0, 0
    whole_units = units - tail_tiles
    units_total = units * splits + tail_tiles * (tail_splits - 1)
    first_row = whole_units // n_tiles * cluster * tiles.block_m if tail_tiles else 0
    return Schedule(m_tiles, n_tiles, units, slots, whole_units, tail_tiles, tail_splits, per_range, units_total,
                    min(units_total, slots) * cluster, first_row)


def split_filter_bytes(spec: ConvSpec) -> int:
    """Bytes of 3xTF32's split filter (its big and small planes, float32); 0 for any other spec."""
    if not promotes(spec):
        return 0
    _, gemm_n, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
    return 2 * gemm_n * gemm_k * DType.float32.itemsize


def workspace_bytes(spec: ConvSpec, fields: dict[str, Any], device: Device | str | None = None) -> int:
    """Bytes of workspace: 3xTF32's split filter, and the partial tiles split-K stores (splits x M x N
    float32) or the last round's split tiles (ranges x the rows from its first tile's to M x N)."""
    shape = _shape(fields)
    splits, _ = k_split(spec, shape)
    gemm_m, gemm_n, _ = gemm_sizes(index.IndexAlgebra(spec))
    filter_bytes = split_filter_bytes(spec)
    if splits > 1:
        return filter_bytes + splits * gemm_m * gemm_n * 4
    if shape.tail_split == 1:
        return filter_bytes
    walk = schedule(spec, shape, as_device(device))
    return filter_bytes + (walk.tail_splits * (gemm_m - walk.tail_first_row) * gemm_n * 4 if walk.tail_tiles else 0)


def split_within(spec: ConvSpec, fields: dict[str, Any], limit: int,
                 device: Device | str | None = None) -> dict[str, Any]:
    """``fields`` with split_k and tail_split lowered to the most ranges whose workspace (``workspace_bytes``) fits
    ``limit`` bytes (unsplit where none do, or where the last round would take fewer ranges than the
    heuristic splits it into), as cuDNN's algorithm choice holds to a workspace limit."""
    fields = dict(fields)
    for name, fewest in (("split_k", 2), ("tail_split", MIN_TAIL_SPLIT)):
        while fields.get(name, 1) > 1 and workspace_bytes(spec, fields, device) > limit:
            fields[name] = fields[name] - 1 if fields[name] > fewest else 1
        if fields.get(name, 1) == 1:
            fields.pop(name, None)
    return fields


def complete_fields(spec: ConvSpec, requested: dict, device: Device | str | None = None) -> dict[str, Any]:
    """The WGMMA tiles a user asked for, the rest from the heuristic fitted to them: a consumer
    warpgroup spans block_n; with pingpong (the heuristic's unless block_m or warp_m is asked for
    without it, or its rows cannot span the block_n asked for) it takes whole tiles of 64 or 128
    rows, else half of block_m from 128 rows up; stages, split_k and tail_split not asked for are
    chosen again for the completed tile, as the heuristic chooses them."""
    device = as_device(device)
    base = heuristic_fields(spec, device)
    limit = accumulator_limit(spec)
    rows_asked = any(isinstance(requested.get(name), int) for name in ("block_m", "warp_m"))
    fields = {**base, "pingpong": requested.get("pingpong", base.get("pingpong", False) and not rows_asked)}
    if isinstance(requested.get("block_n"), int) and "warp_n" not in requested:
        fields["warp_n"] = requested["block_n"]
    block_m, warp_m = requested.get("block_m"), requested.get("warp_m")
    if fields["pingpong"] is True:
        rows = next((r for r in (block_m, warp_m) if isinstance(r, int)),
                    base["block_m"] if base.get("pingpong") else base["warp_m"])
        if "pingpong" not in requested and rows * fields["warp_n"] > WARPGROUP * limit:
            fields["pingpong"] = False   # the heuristic's rows cannot span the width asked for: shared tiles
        elif rows not in (MMA_ROWS, 2 * MMA_ROWS):
            raise SpecError("tiles.block_m", rows, f"must be {MMA_ROWS} or {2 * MMA_ROWS} with pingpong: each consumer "
                            "warpgroup takes whole tiles of block_m = warp_m rows")
        else:
            fields["block_m"] = fields["warp_m"] = rows
    if fields["pingpong"] is not True and not isinstance(warp_m, int):
        rows = block_m if isinstance(block_m, int) else fields["block_m"]
        fields["warp_m"] = rows // (MAX_CONSUMERS if rows >= 2 * MMA_ROWS else 1)
    elif fields["pingpong"] is not True and not isinstance(block_m, int) and fields["block_m"] % warp_m:
        fields["block_m"] = warp_m   # the heuristic's rows are not whole consumers of those asked for: one consumer
    fields.update(requested)
    if not all(isinstance(fields[name], int) for name in ("block_m", "block_n", "block_k", "warp_m")):
        return fields   # MmaTiles refuses the field, naming it
    if not {"block_k", "cluster_m"} & requested.keys():   # the slice and cluster the heuristic takes for this tile
        fields.update(block_k=slice_k(spec, tma_slice_bytes(spec) if promotes(spec) else SLICE_CHOICES[0]), cluster_m=1)
        if fields["pingpong"] is not True:
            fields = _narrowed(spec, fields, gemm_sizes(index.IndexAlgebra(spec))[0])
    return _fitted(spec, fields, device, kept=requested)


def tuning_fields(spec: ConvSpec, device: Device) -> list[dict[str, Any]]:
    """Every WGMMA tile the tuner may try: each block_n up to the one K needs, one or two consumer
    warpgroups of 64 or 128 rows sharing each tile or two taking alternate tiles (ping-pong),
    ``TUNING_STAGES`` stages (in 128-byte slices), where they fit; split-K in ``TUNING_SPLITS``
    where the tiles are fewer than the SMs; 128-byte slices and, where C takes A by TMA only in
    narrower ones, those, alone and in clusters of 2 (``_narrowed``); each unsplit tile also with
    its last round split as the heuristic would split it (``_tail_split``)."""
    gemm_m, gemm_n, _ = gemm_sizes(index.IndexAlgebra(spec))
    wide_slices = _wide_slices(spec)
    widest = min(BLOCK_N_CHOICES[-1], max(BLOCK_N_CHOICES[0], 1 << (gemm_n - 1).bit_length()))
    space = []
    widths = sorted({SLICE_CHOICES[0], tma_slice_bytes(spec) or SLICE_CHOICES[0]}, reverse=True)
    for width, block_n in ((width, n) for width in widths for n in BLOCK_N_CHOICES if n <= widest):
        for warp_m in (MMA_ROWS, 2 * MMA_ROWS):
            for count, pingpong in ((1, False), (2, False), (1, True)):
                few = _tile_count(gemm_m, gemm_n, warp_m * count, block_n) < device.sm_count
                splits = TUNING_SPLITS if few else (1,)
                for stages, split in ((stages, split) for stages in TUNING_STAGES for split in splits):
                    fields = {"block_m": warp_m * count, "block_n": block_n, "block_k": slice_k(spec, width),
                              "warp_m": warp_m, "warp_n": block_n, "stages": stages * (SLICE_CHOICES[0] // width),
                              "wgmma": True, **({"pingpong": True} if pingpong else {}),
                              **({"split_k": split} if split > 1 else {})}
                    clusters = CLUSTER_CHOICES if width < SLICE_CHOICES[0] else CLUSTER_CHOICES[:1]
                    for cluster in clusters:
                        clustered = {**fields, **({"cluster_m": cluster} if cluster > 1 else {})}
                        work = _work(gemm_m, gemm_n, warp_m * count, block_n, cluster, device.sm_count)
                        tail = 1 if split > 1 else _tail_split(*work, wide_slices)
                        for candidate in (clustered, {**clustered, "tail_split": tail}) if tail > 1 else (clustered,):
                            try:
                                shape = _Shape(**candidate)
                                check_geometry(shape)
                                check_tiles(spec, shape, device)
                            except SpecError:
                                continue
                            space.append(candidate)
    return space


def _shape(fields: dict[str, Any]) -> "_Shape":
    """The tile fields of ``fields`` as a ``_Shape``; any other key is left for ``MmaTiles`` to
    refuse by name."""
    return _Shape(**{f.name: fields[f.name] for f in dataclasses.fields(_Shape) if f.name in fields})


@dataclass(frozen=True)
class _Shape:
    """The tile fields alone, for the checks and sizes before a ``MmaTiles`` exists."""

    block_m: int
    block_n: int
    block_k: int
    warp_m: int
    warp_n: int
    stages: int
    wgmma: bool = True
    pingpong: bool = False
    split_k: int = 1
    cluster_m: int = 1
    tail_split: int = 1


@dataclass(frozen=True, kw_only=True)
class WgmmaContext(ConvolutionContext):
    """What ``implicit_gemm_wgmma.cu.j2`` reads.  Sizes are in elements unless named bytes."""

    kernel: str
    variant: str
    mma: str
    """f16, bf16 or tf32: the operand type of the MMA (and of the epilogue's rounding, 16-bit)."""
    mma_k: int
    """The k of one MMA: 16 for 16-bit operands, 8 for TF32."""
    element: DType
    element_bytes: int
    BM: int
    BN: int
    BK: int
    WM: int
    consumers: int
    pingpong: bool
    """Each consumer warpgroup takes every other tile whole, in turn with the other (named barriers
    ``order_barrier`` + 0 and + 1), rather than its rows of every tile."""
    order_barrier: int
    m_blocks: int
    """64-row MMAs of a consumer warpgroup."""
    k_steps: int
    """MMA steps of a k-slice (``mma_k`` elements each)."""
    threads: int
    stages: int
    register_split: tuple[int, int] | None
    """``setmaxnreg`` registers of producer and consumer threads, or None (one consumer warpgroup)."""
    slice_bytes: int
    """Bytes of a k-slice row: the swizzle's width (128, 64 or 32)."""
    swizzle_mode: int
    """The MMA descriptors' layout type for that swizzle (``SWIZZLE_MODES``)."""
    chunk_elements: int
    """Elements of one 16-byte copy."""
    producer_threads: int
    chunks_per_row: int
    rows_per_pass: int
    """Rows the producer's threads copy together (thread t: chunk t % chunks_per_row of row t / chunks_per_row)."""
    table_batch: int
    """Pixel-table entries a producer thread loads before issuing their copies."""
    a_stage_bytes: int
    b_stage_bytes: int
    pixel_entry_bytes: int
    shared_bytes: int
    GEMM_M: int
    GEMM_N: int
    GEMM_K: int
    k_tiles: int
    n_tiles: int
    tiles_total: int
    splits: int
    """Work units an output tile's K range is split into (``split_k``; 1: whole tiles)."""
    k_per_split: int
    a_tma: bool
    """A's slices by one im2col TMA copy each (``a_by_tma``), else by the producer's cp.async copies."""
    im2col_rank: int
    origin: list[str]
    """The input coordinates (innermost first) of an A tile's first pixel at tap 0 (TMA A)."""
    tap_offsets: list[str]
    """A k-slice's tap offsets (innermost first) from its tap kk (TMA A)."""
    c_chunks: int
    """k-slices of a tap (TMA A: C / block_k)."""
    cluster_m: int
    """Blocks of a cluster: they take neighbouring M tiles of one work unit and share its B slices."""
    b_box_rows: int
    """B rows of a slice that each block of a cluster copies and multicasts."""
    m_tiles: int
    units_total: int
    """Output tiles (in clusters of ``cluster_m`` along M) times splits, or with a tail split the whole
    units and the last round's ranges: what the persistent blocks, cluster by cluster, take in turn."""
    tail: bool
    """The last round's tiles split into K ranges (``tail_split``): units from ``whole_units`` on store
    FP32 partial tiles that the reduction kernel adds up."""
    whole_units: int
    tail_splits: int
    tail_k_per_split: int
    tail_first_row: int
    partial_rows: int
    """Rows of each range's partial output: M with split_k, M - tail_first_row with a tail split."""
    partial_store_mode: str
    partial_store_group: int
    grid_blocks: int
    m_tail: bool
    """Tile rows past M: the last tile's, or a cluster's tiles past the last one."""
    n_tail: bool
    k_tail: bool
    a_base: str
    a_delta_c: str
    a_origin: list[str]
    a_checked: list[dict]
    pixel_flag: bool
    """No padded axis to check but a tile past M: the table's first slot says whether the pixel exists."""
    pair_store: bool
    store_mode: str
    """How the epilogue stores 16 bytes a lane: "quad" (16-bit outputs: a quad's 4x4 transpose of its pairs),
    "pair" (FP32 outputs and partials: lanes 1 apart swap pairs), or "" (K too odd: the MMA layout's pairs)."""
    store_group: int
    """Channels of a row one group of a quad's 16-byte stores covers (``epilogue.group_channels``)."""
    reduce_threads: int
    reduce_width: int
    """Elements a thread of the split-K reduction sums: a channel pair where the output channels are
    even, else one."""
    partial_index_type: str
    """The C type of offsets into the partial tiles (splits x M x N float32 sums)."""
    promote: bool
    """3xTF32: B's big and small parts come from the split filter, A raw; the consumers load A's fragments into
    registers and split them there, issue a_big b_big, a_big b_small and a_small b_big MMAs, and each slice's
    products are summed from zero and promoted into FP32 sums."""
    b_tile_bytes: int
    """Bytes of one part of a stage's B (block_n rows of a slice): with ``promote`` the small part follows the big."""
    filter_split_threads: int
    """Threads of a block of the filter's split kernel (3xTF32)."""
    filter_split_index_type: str


def plan(family, spec: ConvSpec, tiles, device: Device | str | None = None) -> KernelPlan:
    """The persistent WGMMA kernel of ``spec`` with ``tiles`` on ``device`` (its SM count sizes the grid)."""
    device = as_device(device)
    check_tiles(spec, tiles, device)
    alg = index.IndexAlgebra(spec)
    gemm_m, gemm_n, gemm_k = gemm_sizes(alg)
    terms = gemm_terms(alg, "image")
    walk = schedule(spec, tiles, device)
    m_tiles, n_tiles = walk.m_tiles, walk.n_tiles
    tiles_total = m_tiles * n_tiles
    splits, k_per_split = k_split(spec, tiles)
    cluster = tiles.cluster_m
    tail = walk.tail_tiles > 0
    partial_rows = gemm_m - walk.tail_first_row if tail else gemm_m
    name = kernel_name(family.name, VARIANT, spec, tiles,
                       f"whole units {walk.whole_units} of {walk.units}" if tail else "")   # the split depends on the SMs
    needed = shared_bytes(spec, tiles)
    itemsize = spec.dtype.itemsize
    parts = 2 if promotes(spec) else 1
    pair_store = gemm_n % 2 == 0
    store_mode = epilogue.store_mode(gemm_n, stores_float=splits > 1 or spec.dtype is DType.float32,
                                     span=tiles.block_n, channels_last=True)
    partial_store_mode = epilogue.store_mode(gemm_n, stores_float=True, span=tiles.block_n, channels_last=True)
    reduce_width = 2 if pair_store else 1
    # B(n, k) = w[n * GEMM_K + k]: a [N][GEMM_K] matrix, read in boxes of one slice row's elements by a
    # cluster block's share of the tile's rows, in the swizzle the MMA descriptors read.
    width = slice_bytes(spec, tiles)
    if promotes(spec):   # the split filter's big and small planes, a copy each
        w_map = TensorMap("w_split", (gemm_k, gemm_n, 2), (gemm_k * itemsize, gemm_k * gemm_n * itemsize),
                          (tiles.block_k, tiles.block_n // cluster, 1), swizzle=width, dtype=spec.dtype)
    else:
        w_map = TensorMap("w", (gemm_k, gemm_n), (gemm_k * itemsize,), (tiles.block_k, tiles.block_n // cluster),
                          swizzle=width, dtype=spec.dtype)
    output = ("partials",) if splits > 1 else ("y", "partials") if tail else ("y",)
    a_tma = a_by_tma(spec, tiles.block_k)
    if a_tma:   # A: block_m pixels of one tap's block_k channels a copy, in the same swizzle
        im2col = im2col_map_terms(alg)
        x_map = TensorMap("x", im2col["dims"], im2col["strides"], (tiles.block_k, tiles.block_m), swizzle=width,
                          corners=(im2col["lower"], im2col["upper"]), element_strides=im2col["element_strides"],
                          dtype=spec.dtype)
        maps, args = (w_map, x_map), output
    else:
        im2col = {"origin": [], "tap_offsets": []}
        maps, args = (w_map,), ("x", *output)
    main = Launch(name, (walk.grid_blocks, 1, 1), (threads(tiles), 1, 1), needed, args=args, tensor_maps=maps,
                  persistent=True)
    if splits > 1 or tail:
        launches = (main, Launch(name + "_reduce", (-(-partial_rows * gemm_n // (reduce_width * REDUCE_THREADS)), 1, 1),
                                 (REDUCE_THREADS, 1, 1), args=("partials", "y")))
    else:
        launches = (main,)
    split_quads = gemm_n * gemm_k // 4
    if promotes(spec):
        split_blocks = min(-(-split_quads // FILTER_SPLIT_THREADS), FILTER_SPLIT_BLOCKS_PER_SM * device.sm_count)
        launches = (Launch(name + "_split_filter", (split_blocks, 1, 1), (FILTER_SPLIT_THREADS, 1, 1),
                           args=("w", "w_split")), *launches)
    m_tail = _padded_rows(alg, tiles) != gemm_m
    chunk_elements = CHUNK_BYTES // itemsize
    context = WgmmaContext(
        **index.template_context(alg, _padded_rows(alg, tiles), column_matrix=False),
        **convolution_selftest_context(alg),
        kernel=name, variant=VARIANT, mma=MMA_TYPES[spec.dtype], mma_k=MMA_K_BYTES // itemsize, element=spec.dtype,
        element_bytes=itemsize, BM=tiles.block_m, BN=tiles.block_n, BK=tiles.block_k, WM=tiles.warp_m,
        consumers=consumers(tiles), pingpong=tiles.pingpong, order_barrier=ORDER_BARRIER,
        m_blocks=tiles.warp_m // MMA_ROWS, k_steps=width // MMA_K_BYTES,
        threads=threads(tiles), stages=tiles.stages,
        register_split=REGISTER_SPLIT if consumers(tiles) == MAX_CONSUMERS else None,
        slice_bytes=width, swizzle_mode=SWIZZLE_MODES[width], chunk_elements=chunk_elements,
        producer_threads=PRODUCER_THREADS, chunks_per_row=width // CHUNK_BYTES,
        rows_per_pass=PRODUCER_THREADS * CHUNK_BYTES // width,
        table_batch=table_batch(spec, tiles),
        a_stage_bytes=tiles.block_m * width, b_stage_bytes=parts * tiles.block_n * width,
        pixel_entry_bytes=pixel_entry_bytes(spec, tiles), shared_bytes=needed, GEMM_M=gemm_m, GEMM_N=gemm_n,
        GEMM_K=gemm_k,
        k_tiles=-(-gemm_k // tiles.block_k), n_tiles=n_tiles, tiles_total=tiles_total, splits=splits,
        k_per_split=k_per_split, a_tma=a_tma, im2col_rank=spec.dims + 2, origin=im2col["origin"],
        tap_offsets=im2col["tap_offsets"], c_chunks=spec.c // tiles.block_k, cluster_m=cluster,
        b_box_rows=tiles.block_n // cluster, m_tiles=m_tiles,
        units_total=walk.units_total, grid_blocks=walk.grid_blocks, tail=tail, whole_units=walk.whole_units,
        tail_splits=walk.tail_splits, tail_k_per_split=walk.tail_k_per_split, tail_first_row=walk.tail_first_row,
        partial_rows=partial_rows,
        m_tail=m_tail, n_tail=gemm_n % tiles.block_n != 0, k_tail=gemm_k % tiles.block_k != 0,
        **{key: terms[key] for key in ("a_base", "a_delta_c", "a_origin", "a_checked")},
        pixel_flag=m_tail and not terms["a_checked"], pair_store=pair_store, store_mode=store_mode,
        store_group=epilogue.group_channels(store_mode), partial_store_mode=partial_store_mode,
        partial_store_group=epilogue.group_channels(partial_store_mode),
        reduce_threads=REDUCE_THREADS, reduce_width=reduce_width,
        partial_index_type="long long" if max(splits, walk.tail_splits) * gemm_m * gemm_n > index.INT32_MAX else "int",
        promote=promotes(spec), b_tile_bytes=tiles.block_n * width,
        filter_split_threads=FILTER_SPLIT_THREADS,
        filter_split_index_type="long long" if 2 * split_quads > index.INT32_MAX else "int",
    )
    buffers = (Buffer("x", alg.image_shape, "in", CHUNK_BYTES, spec.dtype),
               Buffer("w", alg.filter_shape, "in", CHUNK_BYTES, spec.dtype),
               Buffer("y", alg.output_shape, "out",
                      epilogue.STORE_BYTES if store_mode and splits == 1 else itemsize * reduce_width, spec.dtype))
    if promotes(spec):
        buffers += (Buffer("w_split", (2, gemm_n, gemm_k), "workspace", CHUNK_BYTES),)
    if splits > 1 or tail:
        buffers += (Buffer("partials", (max(splits, walk.tail_splits), partial_rows, gemm_n), "workspace",
                           epilogue.STORE_BYTES if partial_store_mode else 4 * reduce_width),)
    return KernelPlan(family.name, VARIANT, spec, tiles, buffers, launches, context, min_arch=ARCH, arch_specific=True,
                      tensor_cores=True, tf32_truncated=spec.dtype is DType.float32 and not promotes(spec),
                      min_arch_reason="wgmma and setmaxnreg, sm_90a instructions; leave wgmma off for the portable "
                      "mma.sync kernel (sm_80+)", template="implicit_gemm_wgmma.cu.j2")

