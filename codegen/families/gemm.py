"""The GEMM core shared by ``implicit_gemm`` and ``im2win``: tile geometry, its checks, the
heuristic, and the template context of the main loop (``templates/common/gemm.cu.j2``).

The convolution is the GEMM y[M x N] = A[M x K] * B[K x N] with M = N*OD*OH*OW output pixels,
N = K output channels and K = C*T*R*S column-matrix rows (seed 003).  A is never stored: each
family says where A(m, row) lives (the image for implicit GEMM, the im2win tensor for im2win)
through ``index.gemm_terms``.  B is the filter in its own memory order, y the output.

The kernel is CUTLASS's SIMT structure: a CTA tile block_m x block_n advanced over K in
block_k slices, ``stages`` shared-memory buffers filled by ``cp.async`` (or by registers when
``async_copy`` is off) so the next slices load while this one is multiplied, warps owning
warp_m x warp_n sub-tiles and threads thread_m x thread_n outer products (the micro-kernel).
The cp.async stages hand over through a full and an empty mbarrier each (``barrier_bytes``), so
warps wait for the data they need rather than for each other at every slice.
With ``split_k`` > 1 several CTAs share an output tile's K range and add their partial tiles
into the zeroed output atomically (CUTLASS's serial split-K), for outputs with few tiles.
Shared memory is dynamic (up to 227 KB on sm_90, opted into by the launchers above 48 KB).
Both operands sit in shared memory as k-slices of contiguous rows ([block_k][block_m + 4]), as in
CUTLASS's SIMT kernels: a thread owns groups of four adjacent pixels and channels, so one float4
read gives a fragment group for one k-step (16 registers of fragments for an 8x8 micro-tile), and
the +4 pad puts the k-slices written by k-major loaders on different banks.  Lanes sit in the warp
in pairs that read one fragment (``index.warp_lane_layout``), as in CUTLASS's interleaved lane
layout, so those float4 reads take two shared-memory wavefronts instead of four.
Padding is tested per A element by one bit of a per-pixel tap mask (``index.tap_mask_bits``)
where the table is used and the filter has at most 64 taps, by a range test per padded axis
otherwise.
"""
from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass
from typing import ClassVar

from codegen import index
from codegen.spec import ConvSpec, SpecError
from codegen.device import Device, as_device
from codegen.tiles import DYNAMIC_SHARED_LIMIT, TileParam, Tiles, check_block

SMEM_PAD = 4
REGISTER_LIMIT = 255
REGISTER_FILE = 65536
SPLIT_K_CTAS_PER_SM = 8
"""CTAs per SM below which the heuristic splits K (1056 on the H100's 132 SMs): conv12's 400
output tiles ran 1.14x faster in 3 splits (1200 CTAs), conv6's 800 1.06x in 2; c3d_conv3's 1568
lost 11 % in 2."""
SPLIT_K_MIN_SLICES = 16
"""k-slices each split keeps at least, so the pipeline still has a loop to overlap."""
MICRO_TILES = ((4, 4), (4, 8), (8, 4), (8, 8), (4, 12), (8, 12), (12, 8), (16, 8), (8, 16))
"""Thread micro-tiles (thread_m, thread_n) of the tuning space."""
WIDE_TILES = ((128, 128, 64, 64, 16, 8), (256, 64, 128, 32, 16, 8), (256, 64, 64, 64, 8, 16),
              (128, 128, 64, 64, 8, 16))
"""(block_m, block_n, warp_m, warp_n, thread_m, thread_n) of the tuner's seeds: 128 threads of
16x8 or 8x16 outputs."""
CONSTANT_BANK_BYTES = 65536
"""A module's ``__constant__`` data (sm_50 and later): the row table goes there when it fits."""
NARROW_TILE = 48
"""The CTA tile width, in output channels, that the heuristic takes where its usual tile would pad
K to at least 4/3 of what 48-wide tiles pad it to (K = 33-48 and 129-144): 128x48 tiles of 4x12 micro-tiles ran
1.26-1.45x faster than the 64-wide ones on K = 40, 48 and 144 (6 of 6 layer-layouts), and
0.59-1.01x as fast where K fills the usual 64- or 96-wide tiles (docs/perf-history.md GEMM v28)."""
TABLE_MAX_ROWS = 1 << 16
"""The most column-matrix rows (C x taps) a kernel may carry a per-row table for (``precomp``'s row
offsets, the TMA kernel's slice offsets): the generator writes such a table into the source, one
entry a row, so past this bound it would render and compile megabytes of initialisers.  The
benchmark layers have at most 6912 rows."""
REGISTER_OVERHEAD = 40
"""Registers the estimate adds for addresses, loop counters and loader state (ptxas -v on the
benchmark layers: 30-45 beyond accumulators and fragments)."""


@dataclass(frozen=True)
class GemmTiles(Tiles):
    block_m: int = 128
    block_n: int = 128
    block_k: int = 8
    warp_m: int = 64
    warp_n: int = 32
    thread_m: int = 8
    thread_n: int = 8
    stages: int = 3
    async_copy: bool = True
    vector_load: bool = True
    vector_smem: bool = True
    precomp: bool = True
    split_k: int = 1
    tma: bool = False

    PARAMS: ClassVar = (
        TileParam("block_m", "CTA tile along GEMM M (output pixels; above 256 only with tma=True)", minimum=1, maximum=512),
        TileParam("block_n", "CTA tile along GEMM N (output channels)", minimum=1, maximum=256),
        TileParam("block_k", "K slice per pipeline stage", choices=(4, 8, 16, 32)),
        TileParam("warp_m", "warp tile along M", minimum=1, maximum=256),
        TileParam("warp_n", "warp tile along N", minimum=1, maximum=256),
        TileParam("thread_m", "thread micro-tile along M (outer-product rows)", choices=(1, 2, 4, 8, 12, 16)),
        TileParam("thread_n", "thread micro-tile along N (outer-product columns)", choices=(1, 2, 4, 8, 12, 16)),
        TileParam("stages", "shared-memory buffers: 1 = no double buffering or prefetch", choices=(1, 2, 3, 4, 5, 6)),
        TileParam("async_copy", "fill shared memory with cp.async (sm_80+) instead of through registers",
                  choices=(True, False)),
        TileParam("vector_load", "load A and B four k-steps per thread where the channel count and pitch "
                  "allow (float4 global loads with register staging; four 4-byte cp.async otherwise, since "
                  "cp.async cannot transpose)", choices=(True, False)),
        TileParam("vector_smem", "float4 fragment reads from shared memory (four adjacent pixels or channels per read)",
                  choices=(True, False)),
        TileParam("precomp", "read each column-matrix row's offset from a precomputed table (cuDNN's "
                  "'precomp') instead of dividing it out in the kernel; with padding and at most 64 taps the "
                  "table also names the row's tap, tested against per-pixel tap masks", choices=(True, False)),
        TileParam("split_k", "CTAs that share one output tile's K range (CUTLASS's split-K), summing their "
                  "partial tiles into the zeroed output with atomic adds: more CTAs where the output has "
                  "few tiles and K is long", minimum=1, maximum=16),
        TileParam("tma", "implicit_gemm, sm_90: persistent warp-specialised blocks in which one producer thread "
                  "loads A with TMA's im2col mode (channels-last; channels-first, the producer warps gather A with "
                  "cp.async) and B (the filter, transposed per call into a taps x C x K workspace) as TMA boxes, "
                  "for block_m/warp_m x block_n/64 consumer warps of "
                  "thread_m x 8 micro-tiles (thread_m 8 or 16, warp_m = 4 * thread_m); fixes block_k 32, no row "
                  "table, no split-K; 8 consumer warps, or 16-row micro-tiles, make the producer a warpgroup that "
                  "hands its registers to the consumers (setmaxnreg, compiled for sm_90a)",
                  choices=(False, True)),
    )

    @property
    def consumer_warps(self) -> int:
        return (self.block_m // self.warp_m) * (self.block_n // self.warp_n)

    @property
    def producer_warps(self) -> int:
        """The TMA kernel's producer: one warp, or a whole warpgroup where its registers are handed
        to the consumers (``setmaxnreg`` works on warpgroups)."""
        if not self.tma:
            return 0
        return 4 if tma_register_split(self) else 1

    @property
    def threads(self) -> int:
        return (self.consumer_warps + self.producer_warps) * 32


def _loader(rows: int, groups: int, threads: int, m_fastest: bool, field: str, tiles: GemmTiles) -> dict:
    """How ``threads`` share a rows x groups tile (groups: k-slices of 1 or 4 floats): thread t
    takes row t % across (m_fastest) or group t % across, then strides by the threads along the
    other axis.  Only splits where every thread keeps the same rows across slots are allowed, so
    per-row address state is computed once per thread.  ``guard_from``: the first slot along the
    strided axis that some thread would take past the tile (the slots before it need no test)."""
    first, second = (rows, groups) if m_fastest else (groups, rows)
    if threads % first == 0:
        across, along, first_slots = first, threads // first, 1
        second_slots = -(-second // along)
        guard = second % along != 0
    elif first % threads == 0:
        across, along, first_slots, second_slots, guard = threads, 1, first // threads, second, False
    else:
        raise SpecError(field, getattr(tiles, field.split(".")[-1]),
                        f"{threads} threads cannot share a {rows}x{groups} load tile evenly: the tile's "
                        f"{'rows' if m_fastest else 'k-groups'} ({first}) must divide or be a multiple of the thread count")
    guard_from = second // along if guard else second_slots
    if m_fastest:
        return {"row_threads": across, "group_threads": along, "row_slots": first_slots,
                "group_slots": second_slots, "guard_rows": False, "guard_groups": guard, "m_fastest": True,
                "guard_from": guard_from}
    return {"row_threads": along, "group_threads": across, "row_slots": second_slots,
            "group_slots": first_slots, "guard_rows": guard, "guard_groups": False, "m_fastest": False,
            "guard_from": guard_from}


def pixels_split_evenly(block_m: int, threads: int) -> bool:
    """Whether ``threads`` can load a channels-first A tile pixel-fastest (``_loader``'s rule along
    pixels); thread counts like 192 split no 128-pixel tile, so the tile is loaded along k instead
    (less coalesced, still right)."""
    return threads % block_m == 0 or block_m % threads == 0


TMA_FIXED = {"block_k": 32, "warp_n": 64, "thread_n": 8, "split_k": 1, "precomp": False,
             "async_copy": True, "vector_load": True, "vector_smem": True}
"""The tiles the TMA kernel is written for: a k-slice is 32 channels (one 128-byte swizzled
shared-memory row per pixel), warps own 64 output channels in micro-tiles of 8 channels read as
float4, the im2col walk replaces the row table, and there is no split-K."""
TMA_REGISTERS = 168
"""Registers a TMA thread is launched with (8x8 micro-tile: 64 accumulators, 48 fragment registers,
addresses; a 17-warp block held to 96 spilled 460 bytes).  9 to 12 warps put 3 on some scheduler,
whose quarter of the register file (16,384) then allows 170 a lane."""
TMA_THREAD_ROWS = (8, 16)
TMA_BOX_PIXELS = 256
"""Most pixels one im2col copy takes (its pixels-per-column, like a tiled box's 256 per axis): a
512-pixel A tile is two copies."""
TMA_REGISTER_SPLIT = (40, 232)
"""``setmaxnreg`` counts of the producer warpgroup and the consumers: per scheduler one producer
warp at 40 and two consumer warps at 232 fit the 512 registers a lane that 3 warps at 168 held.
A 16-row micro-tile needs them (128 accumulators; about 205 registers), and the 8x8 kernel of 8
consumer warps ran 0.2-3.6 % faster with them (docs/perf-history.md, GEMM v15)."""


TMA_ALIGNMENT = 1024
"""Bytes of dynamic shared memory a TMA block keeps spare to start its tiles on the 1024-byte
boundary the 128-byte swizzle needs (the dynamic allocation is only 16-byte aligned)."""


def tma_shared_bytes(tiles: GemmTiles) -> int:
    """The alignment slack, ``stages`` A tiles (block_m pixels x 32 channels) and B tiles (32
    channels x block_n), then a full and an empty mbarrier per stage."""
    return TMA_ALIGNMENT + tiles.stages * (tiles.block_m + tiles.block_n) * TMA_FIXED["block_k"] * 4 + 16 * tiles.stages


def tma_register_split(tiles: GemmTiles) -> tuple[int, int] | None:
    """The register split of a TMA kernel, or None where a single producer warp is kept (fewer
    than 8 consumer warps of 8x8, where a warpgroup would cost a second resident block)."""
    if tiles.tma and (tiles.consumer_warps == 8 or tiles.thread_m == 16):
        return TMA_REGISTER_SPLIT
    return None


def _check_tma_geometry(tiles: GemmTiles) -> None:
    for name, fixed in TMA_FIXED.items():
        if getattr(tiles, name) != fixed:
            raise SpecError(f"tiles.{name}", getattr(tiles, name), f"must be {fixed!r} with tma=True (the TMA kernel "
                            "reads 32-channel slices into warp tiles 64 channels wide of 8-channel micro-tiles, "
                            "without a row table or split-K)")
    if tiles.thread_m not in TMA_THREAD_ROWS:
        raise SpecError("tiles.thread_m", tiles.thread_m, f"must be one of {TMA_THREAD_ROWS} with tma=True")
    if tiles.warp_m != 4 * tiles.thread_m:
        raise SpecError("tiles.warp_m", tiles.warp_m, f"must be 4 * thread_m = {4 * tiles.thread_m} with tma=True "
                        "(a warp's lanes form 4 rows by 8 columns of micro-tiles)")
    for name, multiple in (("block_m", tiles.warp_m), ("block_n", 64)):
        if getattr(tiles, name) % multiple:
            raise SpecError(f"tiles.{name}", getattr(tiles, name), f"must be a multiple of {multiple} with tma=True "
                            f"(one consumer warp per {tiles.warp_m}x64 outputs)")
    if tiles.block_m > TMA_BOX_PIXELS and tiles.block_m % TMA_BOX_PIXELS:
        raise SpecError("tiles.block_m", tiles.block_m, f"must be a multiple of {TMA_BOX_PIXELS} above {TMA_BOX_PIXELS} "
                        f"with tma=True (the A tile is loaded as im2col boxes of {TMA_BOX_PIXELS} pixels)")
    if tiles.thread_m == 16 and tiles.consumer_warps not in (4, 8):
        raise SpecError("tiles.block_m/block_n", (tiles.block_m, tiles.block_n), f"gives {tiles.consumer_warps} consumer "
                        "warps of 64x64; with thread_m 16 there must be 4 or 8 (whole warpgroups, which setmaxnreg "
                        "resizes, and at most 2 per scheduler at 232 registers)")
    if tiles.stages < 2:
        raise SpecError("tiles.stages", tiles.stages, "must be at least 2 with tma=True (the producer fills one stage "
                        "while the consumers multiply another)")
    check_block(tiles.threads, "tiles.block_m/block_n", (tiles.block_m, tiles.block_n))
    if tiles.threads * TMA_REGISTERS > REGISTER_FILE:
        raise SpecError("tiles.block_m/block_n", (tiles.block_m, tiles.block_n), f"gives {tiles.consumer_warps} consumer "
                        f"warps; with the producer's, {tiles.threads} threads of {TMA_REGISTERS} registers need more "
                        f"than the {REGISTER_FILE} an SM has (at most {REGISTER_FILE // (32 * TMA_REGISTERS)} warps "
                        "a block)")
    shared = tma_shared_bytes(tiles)
    if shared > DYNAMIC_SHARED_LIMIT:
        raise SpecError("tiles.stages", tiles.stages, f"{tiles.stages} stages of {tiles.block_m}x32 and 32x{tiles.block_n} "
                        f"floats need {shared} bytes of shared memory with the alignment slack and barriers; at most "
                        f"{DYNAMIC_SHARED_LIMIT} are allowed (sm_90 opt-in dynamic shared memory)")


def check_geometry(tiles: GemmTiles) -> None:
    """Every divisibility and size rule of the tile hierarchy, each failure naming its field."""
    if tiles.tma:
        _check_tma_geometry(tiles)
        return
    if tiles.block_m > 256:
        raise SpecError("tiles.block_m", tiles.block_m, "must be at most 256 without tma (larger tiles are for the "
                        "TMA kernel's 16-row micro-tiles)")
    pairs = (("block_m", "warp_m"), ("block_n", "warp_n"), ("warp_m", "thread_m"), ("warp_n", "thread_n"))
    for outer, inner in pairs:
        if getattr(tiles, outer) % getattr(tiles, inner):
            raise SpecError(f"tiles.{outer}", getattr(tiles, outer), f"must be a multiple of tiles.{inner} "
                            f"({getattr(tiles, inner)})")
    lanes = (tiles.warp_m // tiles.thread_m) * (tiles.warp_n // tiles.thread_n)
    if lanes != 32:
        raise SpecError("tiles.warp_m/warp_n", (tiles.warp_m, tiles.warp_n),
                        f"a warp tile must hold 32 thread tiles of {tiles.thread_m}x{tiles.thread_n}; this one holds {lanes}")
    check_block(tiles.threads, "tiles.block_m/block_n", (tiles.block_m, tiles.block_n))
    if tiles.stages > 4:
        raise SpecError("tiles.stages", tiles.stages, "must be at most 4 for the cp.async kernel (5 and 6 are for "
                        "tma=True)")
    if tiles.stages > 2 and not tiles.async_copy:
        raise SpecError("tiles.stages", tiles.stages, "more than 2 stages need async_copy (register staging "
                        "double-buffers only)")
    shared = shared_bytes(tiles)
    if shared > DYNAMIC_SHARED_LIMIT:
        raise SpecError("tiles.stages", tiles.stages, f"{tiles.stages} stages of {tiles.block_k}x"
                        f"({tiles.block_m}+{tiles.block_n}+{2 * SMEM_PAD}) floats and their barriers need {shared} bytes of shared memory; at most "
                        f"{DYNAMIC_SHARED_LIMIT} are allowed (sm_90 opt-in dynamic shared memory)")
    registers = register_estimate(tiles)
    if registers > REGISTER_LIMIT:
        raise SpecError("tiles.thread_m/thread_n", (tiles.thread_m, tiles.thread_n),
                        f"the micro-tile needs about {registers} registers per thread; at most {REGISTER_LIMIT} exist")


def barrier_bytes(tiles: GemmTiles) -> int:
    """The mbarrier pairs (full, empty; 16 bytes a stage, so the tiles after them stay 16-byte
    aligned) of a multi-stage cp.async pipeline, first in dynamic shared memory so that the opt-in
    limit counts them."""
    return 16 * tiles.stages if tiles.async_copy and tiles.stages > 1 else 0


def shared_bytes(tiles: GemmTiles) -> int:
    """The barriers, then the larger of the pipeline's stages and the epilogue's transposed tile
    (which reuses them); the TMA kernel's layout is ``tma_shared_bytes``."""
    if tiles.tma:
        return tma_shared_bytes(tiles)
    pipeline = tiles.stages * (tiles.block_m + tiles.block_n + 2 * SMEM_PAD) * tiles.block_k * 4
    epilogue = tiles.block_m * tiles.block_n * 4 + max(tiles.block_m, tiles.block_n) * SMEM_PAD * 4
    return barrier_bytes(tiles) + max(pipeline, epilogue)


def register_estimate(tiles: GemmTiles) -> int:
    """Accumulators, two k-steps of A and B fragments (the unrolled loop loads the next while it
    multiplies this one), plus a fixed overhead; ptxas has the last word (the compile tier checks
    its report), this catches hopeless choices before compiling."""
    return tiles.thread_m * tiles.thread_n + (tiles.thread_m + tiles.thread_n) * 2 + REGISTER_OVERHEAD


def min_blocks(tiles: GemmTiles, loader_registers: int) -> int:
    """The CTAs per SM that ``__launch_bounds__`` promises ptxas: as many as the register estimate
    (with the loaders' state and a quarter for slack) allows.  Without it ptxas aims at its own
    occupancy target and spills accumulators."""
    per_thread = -(-(register_estimate(tiles) + loader_registers) * 5 // 4 // 8) * 8
    return max(1, REGISTER_FILE // (tiles.threads * min(per_thread, REGISTER_LIMIT + 1)))


def loader_registers(tiles: GemmTiles, a_load: dict, b_load: dict, a_vec: int, b_vec: int, checked: int) -> int:
    """Per-thread loader state: each A row slot keeps a base and ``checked`` words for its bounds
    test (an origin per padded axis, or its tap mask), each B row slot a base; register staging
    also holds a whole slice."""
    state = a_load["row_slots"] * (2 + checked) + b_load["row_slots"] * 2
    if not tiles.async_copy:
        state += (a_load["row_slots"] * a_load["group_slots"] * a_vec + b_load["row_slots"] * b_load["group_slots"] * b_vec)
    return state


def tile_count(gemm_m: int, gemm_n: int, block_m: int, block_n: int) -> int:
    """CTA tiles that cover the M x N output, partial tiles included."""
    return -(-gemm_m // block_m) * -(-gemm_n // block_n)


def heuristic(spec: ConvSpec, table_fits: bool = True, device: Device | str | None = None) -> GemmTiles:
    """A sound tile choice without tuning, distilled from tuning the 16 benchmark layers on an
    H100 (docs/perf-history.md, GEMM v5, "heuristic v3"), in the way CUTLASS's default configurations are picked:

    - block_n covers the output channels tightly (32, 64, 96 or 128); above 128 channels 64-wide
      tiles won (twice the CTAs on layers whose pixel count is small); where that tile pads K
      to at least 4/3 of what ``NARROW_TILE``-wide tiles pad it to, 48-wide tiles of 4x12
      micro-tiles (K = 40, 48 and 144 of docs/shapes/unseen.json: 1.26-1.45x);
    - block_m is 128 (256 when block_n is 32 and pixels abound), halved (down to 32) until the
      grid has two CTAs per SM;
    - 8x8 micro-tiles (64 FMAs per 16 floats read from shared memory) in 4x8-lane warps, the
      shape most winners had; small tiles shrink the micro-tile to keep 32 lanes per warp;
    - 8x12 micro-tiles on the 96-channel tiles: one warp spans the 96 channels, so a 128x96 tile
      is 128 threads of 96 outputs (3 CTAs per SM at 168 registers) instead of 192 threads of 64,
      the longer runs of independent FMAs that cuBLAS's SIMT kernels use (conv1 +11 %, conv2
      +8 % in a same-run A/B, docs/perf-history.md, GEMM v9; 12-wide tiles lost on the 64- and 128-channel
      layers); with it every heuristic tile's threads split its pixels evenly, so channels-first
      A tiles load along pixels;
    - block_k 16 (8 when K = C*taps is below 64, where half a slice would be padding), 3 cp.async
      stages in dynamic shared memory (the launchers opt in above 48 KB);
    - one float a copy (``vector_load`` off) in every layout, precomputed row offsets always: a
      slice lands k-major in shared memory, so cp.async copies are 4 bytes either way, and one
      channel a thread makes a slice's 16 channels of a pixel (or filter row) 16 adjacent lanes,
      64 contiguous bytes, where four a thread spread one warp copy over 16 sectors (channels-last
      layers 1.08-1.44x, docs/perf-history.md GEMM v22);
    - split-K (CUTLASS's serial reduction through atomic adds) when the output has fewer than
      ``SPLIT_K_CTAS_PER_SM`` tiles per SM: enough splits to reach it, each keeping
      ``SPLIT_K_MIN_SLICES``.
    SM counts are ``device``'s (a ``Device``, an arch or a target name; the H100 by default).
    """
    device = as_device(device)
    alg = index.IndexAlgebra(spec)
    gemm_m, gemm_n, gemm_k = index.gemm_sizes(alg)
    block_n = _channel_tile(gemm_n)
    block_m = 256 if block_n == 32 else 128
    while block_m > 32 and tile_count(gemm_m, gemm_n, block_m, block_n) < 2 * device.sm_count:
        block_m //= 2
    block_k = 16 if gemm_k >= 64 else 8
    while True:
        thread_m, thread_n = _micro_tile(block_m, block_n)
        warp_m, warp_n = _warp_shape(block_m, block_n, thread_m, thread_n)
        split_k = heuristic_split_k(tile_count(gemm_m, gemm_n, block_m, block_n), -(-gemm_k // block_k),
                                    device.sm_count)
        tiles = fit_device(GemmTiles(block_m=block_m, block_n=block_n, block_k=block_k, warp_m=warp_m,
                                     warp_n=warp_n, thread_m=thread_m, thread_n=thread_n, stages=3, vector_load=False,
                                     split_k=split_k, precomp=table_fits), device)
        if shared_bytes(tiles) <= device.shared_per_block or block_m == 32:
            return tiles
        block_m //= 2     # the epilogue's output tile alone passes the card's shared memory


def wide_tiles(base: GemmTiles, gemm_n: int) -> GemmTiles:
    """``base`` as 128 threads of 16x8 micro-tiles, 8-deep slices, K unsplit: 128x128 tiles where
    ``gemm_n`` is a multiple of 128, else 256x64 (the shape of ``WIDE_TILES`` that won every
    channels-first layer the tuner was run on, docs/perf-history.md GEMM v32)."""
    block_m, block_n = (128, 128) if gemm_n % 128 == 0 else (256, 64)
    warp_m, warp_n = _warp_shape(block_m, block_n, 16, 8)
    return GemmTiles(**{**base.to_dict(), "block_m": block_m, "block_n": block_n, "block_k": 8, "warp_m": warp_m,
                        "warp_n": warp_n, "thread_m": 16, "thread_n": 8, "split_k": 1})


def heuristic_split_k(ctas: int, k_tiles: int, sm_count: int) -> int:
    """The heuristic's split-K for an output of ``ctas`` tiles and a K range of ``k_tiles`` slices:
    enough splits to reach ``SPLIT_K_CTAS_PER_SM`` CTAs a SM (at most 16 splits), each keeping
    ``SPLIT_K_MIN_SLICES``."""
    enough = SPLIT_K_CTAS_PER_SM * sm_count
    if ctas >= enough:
        return 1
    return max(1, min(16, -(-enough // ctas), k_tiles // SPLIT_K_MIN_SLICES))


def _micro_tile(block_m: int, block_n: int) -> tuple[int, int]:
    """The heuristic's thread micro-tile for a block_m x block_n CTA tile (its docstring says why)."""
    if block_n == NARROW_TILE:
        return 4, 12
    if block_m == 32 or block_n == 32:
        return (4, 8) if block_n >= 64 else (8, 4) if block_m >= 64 else (4, 4)
    return 8, 12 if block_n == 96 else 8


SHAPE_FIELDS = ("warp_m", "warp_n", "thread_m", "thread_n")


def complete(base: dict, requested: dict) -> dict:
    """``requested`` tiles over ``base`` (a heuristic's).  Where the request resizes the CTA tile,
    names no warp or thread tile and the heuristic's no longer divide it (block_n=64 on a layer
    the heuristic gives 96- or 48-wide tiles), those come from the heuristic's own rule for the
    requested tile instead, rather than refusing a choice the user never made."""
    merged = {**base, **requested}
    blocks_are_sizes = all(isinstance(merged[f], int) and merged[f] > 0 for f in ("block_m", "block_n"))
    if merged.get("tma") or any(field in requested for field in SHAPE_FIELDS) or not blocks_are_sizes:
        return merged   # TileParam and check_geometry name what is wrong with these
    if merged["block_m"] % merged["warp_m"] == 0 and merged["block_n"] % merged["warp_n"] == 0:
        return merged
    thread_m, thread_n = _micro_tile(merged["block_m"], merged["block_n"])
    try:
        warp_m, warp_n = _warp_shape(merged["block_m"], merged["block_n"], thread_m, thread_n)
    except SpecError:
        return merged
    return {**merged, "warp_m": warp_m, "warp_n": warp_n, "thread_m": thread_m, "thread_n": thread_n}


def pads_by_a_third(padded: int, needed: int) -> bool:
    """Whether ``padded`` is at least 4/3 of ``needed``: the heuristics' line for turning down a
    tile or box that leaves a quarter of its work on padding (``_channel_tile``, the implicit GEMM's
    TMA channel boxes; docs/perf-history.md GEMM v28, v30)."""
    return 3 * padded >= 4 * needed


def _channel_tile(gemm_n: int) -> int:
    """block_n for ``gemm_n`` output channels: the tightest of 32-128 (64 above 128), or
    ``NARROW_TILE`` where the channels that tile pads to are at least 4/3 of those 48-wide tiles pad to."""
    block_n = 64 if gemm_n > 128 else next(b for b in (32, 64, 96, 128) if gemm_n <= b)
    padded = {width: -(-gemm_n // width) * width for width in (block_n, NARROW_TILE)}
    return NARROW_TILE if pads_by_a_third(padded[block_n], padded[NARROW_TILE]) else block_n


def tuning_space(spec: ConvSpec, a_vector_ok: bool, device: Device | str | None = None) -> list[dict]:
    """Every tile configuration the tuner may try: CTA tiles 32-256 (block_n no wider than the
    channels need), block_k 8-32, the micro-tiles of ``MICRO_TILES``, four warp shapes, 2-4 stages, with and
    without the row table, with and without four-float loads where A allows them, split-K 1, 2 or 4
    where the output has fewer than ``SPLIT_K_CTAS_PER_SM`` tiles per SM of ``device``; kept only if
    ``check_geometry`` accepts it."""
    enough = SPLIT_K_CTAS_PER_SM * as_device(device).sm_count
    gemm_m, gemm_n, gemm_k = index.gemm_sizes(index.IndexAlgebra(spec))
    widest = max(32, -(-gemm_n // 32) * 32)
    vector_choices = (False, True) if a_vector_ok else (False,)
    space = []
    for block_m in (32, 64, 128, 256):
        for block_n in (b for b in (32, NARROW_TILE, 64, 96, 128, 256) if b <= widest):
            few_tiles = tile_count(gemm_m, gemm_n, block_m, block_n) < enough
            for block_k in (8, 16, 32):
                for thread_m, thread_n in MICRO_TILES:
                    for lanes_m in (2, 4, 8, 16):
                        for stages in (2, 3, 4):
                            for precomp, vector_load in itertools.product((True, False), vector_choices):
                                for split_k in (1, 2, 4) if few_tiles else (1,):
                                    tiles = dict(block_m=block_m, block_n=block_n, block_k=block_k,
                                                 warp_m=lanes_m * thread_m, warp_n=(32 // lanes_m) * thread_n,
                                                 thread_m=thread_m, thread_n=thread_n, stages=stages, async_copy=True,
                                                 vector_load=vector_load, vector_smem=True, precomp=precomp,
                                                 split_k=split_k, tma=False)
                                    try:
                                        check_geometry(GemmTiles(**tiles))
                                    except SpecError:
                                        continue
                                    if split_k <= -(-gemm_k // block_k):
                                        space.append(tiles)
    return space


def tuning_seeds(spec: ConvSpec) -> list[dict]:
    """``WIDE_TILES`` at block_k 8 and 16, otherwise as the heuristic: the 16x8 micro-tiles (128
    threads) of cuBLAS's and cuDNN's fp32 kernels on this GPU.  In a space of thousands, random
    sampling seldom draws them and one-parameter steps from an 8x8 winner cannot reach them (the
    warp tile must change with the micro-tile); measured on an H100 they won c3d_conv3 by 8%,
    conv8 by 4% and c3d_conv2 by 3% over the heuristic, and were up to 62% slower on conv4."""
    base = heuristic(spec).to_dict()
    return [{**base, **dict(zip(("block_m", "block_n", "warp_m", "warp_n", "thread_m", "thread_n"), shape)),
             "block_k": block_k, "split_k": 1}
            for shape in WIDE_TILES for block_k in (8, 16)]


def _warp_shape(block_m: int, block_n: int, thread_m: int, thread_n: int) -> tuple[int, int]:
    """The 32-lane warp layout (lanes_m x lanes_n) whose tile divides the block, 4x8 first."""
    for lanes_m, lanes_n in ((4, 8), (8, 4), (2, 16), (16, 2)):
        warp_m, warp_n = lanes_m * thread_m, lanes_n * thread_n
        if block_m % warp_m == 0 and block_n % warp_n == 0:
            return warp_m, warp_n
    raise SpecError("tiles.block_m/block_n", (block_m, block_n), "no 32-lane warp layout divides this block")


def context(spec: ConvSpec, tiles: GemmTiles, terms: dict, a_vector_ok: bool, a_m_fastest: bool) -> dict:
    """Template context of the GEMM main loop for one spec and tile choice."""
    if tiles.tma:
        raise SpecError("tiles.tma", True, "applies to implicit_gemm only (its TMA kernel loads A with the im2col "
                        "mode straight from the image); leave it False here")
    check_geometry(tiles)
    alg = index.IndexAlgebra(spec)
    gemm_m, gemm_n, gemm_k = index.gemm_sizes(alg)
    lane_m, lane_n = index.warp_lane_layout(tiles.warp_m // tiles.thread_m, tiles.warp_n // tiles.thread_n)
    a_vec = 4 if tiles.vector_load and a_vector_ok else 1
    b_vec = 4 if tiles.vector_load and gemm_k % 4 == 0 else 1
    threads = tiles.threads
    m_fastest = a_m_fastest and a_vec == 1 and pixels_split_evenly(tiles.block_m, threads)
    a_load = _loader(tiles.block_m, tiles.block_k // a_vec, threads, m_fastest, "tiles.block_m", tiles)
    b_load = _loader(tiles.block_n, tiles.block_k // b_vec, threads, False, "tiles.block_n", tiles)
    k_tiles = -(-gemm_k // tiles.block_k)
    splits, k_per_split = k_split(spec, tiles)
    if tiles.precomp and gemm_k > TABLE_MAX_ROWS:
        raise SpecError("tiles.precomp", True, f"would write a table of {gemm_k} row offsets (C x taps) into the "
                        f"source; at most {TABLE_MAX_ROWS}: use precomp=False")
    mask_bits = index.tap_mask_bits(alg, terms) if tiles.precomp else 0
    table_width = 2 if mask_bits else 1 + len(terms["a_checked"])  # ints per row, stored as int, int2 or int4
    table = index.row_table(alg, terms, tap_masks=bool(mask_bits)) if tiles.precomp else []
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
        "a_select": not index.unselected_addresses_inside(alg, terms) or (gemm_k % tiles.block_k != 0
                                                                           and not tiles.precomp),
        "a_vec": a_vec, "b_vec": b_vec, "a_load": a_load, "b_load": b_load,
        "table": [(0,) * len(table[0])] * (table_rows - gemm_k) + table if table else [],
        "table_width": table_width,
        "table_slots": table_slots,
        "table_in_constant": table_in_constant(a_load, table_rows * table_slots * 4),
        "mask_bits": mask_bits,
        "mask_factors": index.tap_mask_patterns(alg, terms) if mask_bits else [],
        **{key: value for key, value in terms.items() if key not in ("a_delta", "exprs")},
        "row_coords": [index.to_c(e) for e in alg.row_coords],
    }


def async_copy_arch(tiles: GemmTiles) -> dict:
    """The plan's oldest target: cp.async and its mbarriers need sm_80; register staging runs on
    every target NVRTC builds for."""
    if not tiles.async_copy:
        return {}
    return {"min_arch": 80, "min_arch_reason": "cp.async; async_copy=False with stages <= 2 runs on older targets"}


def fit_device(tiles: GemmTiles, device: Device) -> GemmTiles:
    """``tiles`` as ``device`` runs them: staged through registers (double-buffered) before sm_80,
    which has no cp.async, and with fewer stages, then thinner k-slices, while their shared memory
    passes its limit per block (the H100's 227 KB takes every heuristic tile as it is)."""
    if device.capability < 80 and tiles.async_copy:
        tiles = dataclasses.replace(tiles, async_copy=False, stages=min(tiles.stages, 2))
    while shared_bytes(tiles) > device.shared_per_block:
        if tiles.stages > 2:
            tiles = dataclasses.replace(tiles, stages=tiles.stages - 1)
        elif tiles.block_k > 8:
            tiles = dataclasses.replace(tiles, block_k=tiles.block_k // 2)
        else:
            break
    return tiles


def row_table_fits(alg: index.IndexAlgebra, terms: dict) -> bool:
    """Whether ``precomp``'s row table can be made: at most ``TABLE_MAX_ROWS`` rows, each offset
    within 32 bits (the table stores ints); the heuristic computes the offsets otherwise."""
    if alg.rows > TABLE_MAX_ROWS:
        return False
    return max(abs(v) for row in index.row_table(alg, terms) for v in row) <= index.INT32_MAX


def table_in_constant(a_load: dict, table_bytes: int) -> bool:
    """Whether the row table can live in constant memory: it must fit the constant bank, and every
    warp must read one row at a time, as it does when the A loader runs along pixels in whole
    warps (the constant cache serves one address per warp per cycle and serialises the rest).
    Its loads then leave the L1 path that the tile copies and fragment reads share: same-run A/B
    on an H100 against the table in global memory, conv4 +3.6 %, conv8 +2.7 %, unet3d_l1 +4.2 %,
    conv9 +1.9 %, conv1 +1.2 %, c3d_conv2 and conv3 +0.4 %."""
    return a_load["m_fastest"] and a_load["row_threads"] % 32 == 0 and 0 < table_bytes <= CONSTANT_BANK_BYTES


def grid(spec: ConvSpec, tiles: GemmTiles) -> tuple[int, int, int]:
    """x: M tiles times N tiles, N fastest (see the kernel's comment); y: the K splits."""
    gemm_m, gemm_n, _ = index.gemm_sizes(index.IndexAlgebra(spec))
    return (tile_count(gemm_m, gemm_n, tiles.block_m, tiles.block_n), k_split(spec, tiles)[0], 1)


def k_split(spec: ConvSpec, tiles: GemmTiles) -> tuple[int, int]:
    """(CTAs per output tile, k-slices each takes): ``split_k`` ranges of whole slices, none empty."""
    _, _, gemm_k = index.gemm_sizes(index.IndexAlgebra(spec))
    k_tiles = -(-gemm_k // tiles.block_k)
    if tiles.split_k > k_tiles:
        raise SpecError("tiles.split_k", tiles.split_k, f"must be at most the {k_tiles} k-slices of "
                        f"{tiles.block_k} that K = {gemm_k} makes")
    per_split = -(-k_tiles // tiles.split_k)
    return -(-k_tiles // per_split), per_split


def flops(spec: ConvSpec) -> int:
    """2*M*N*K: the multiply-adds of the convolution, padding taps included (as cuDNN counts)."""
    gemm_m, gemm_n, gemm_k = index.gemm_sizes(index.IndexAlgebra(spec))
    return 2 * gemm_m * gemm_n * gemm_k

