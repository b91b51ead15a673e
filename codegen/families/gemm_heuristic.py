"""Which tiles a GEMM layer gets, and why: every rule of the implicit_gemm and im2win heuristics,
read top-down from ``choose_tiles``.  Each rule says in a line why it holds; the measurements
behind it (H100) are in docs/perf.md, "The heuristics' rules", and the runs in
docs/perf-history.md under the GEMM vN labels cited here.  Counts "per SM" read the SMs, shared
memory and registers of the ``Device`` the tiles are for (the H100 by default): on another card
they are the same rules, not measured there.

- ``choose_tiles``: implicit_gemm on a target (``build`` without tiles): the sm_90 TMA kernel where
  ``tma_choice`` takes it (its tiles from ``tma_tiles``), else ``portable_tiles``.
- ``portable_tiles``: the cp.async kernel, which runs everywhere: ``core_tiles`` with three changes.
- ``core_tiles``: the rules implicit_gemm's cp.async kernel shares with im2win.
- ``gather_pays``: where the channels-first TMA kernel, taken only on request, beats the cp.async one.
- ``takes_stream_k``, ``tail_in_own_launch``: how the TMA plan shares out its last round of tiles.
- ``complete``: the tiles a user names, the rest from these rules.
"""
from __future__ import annotations

import dataclasses
import math

from codegen import index
from codegen.device import Device, as_device
from codegen.families.gemm_tiles import (TABLE_MAX_ROWS, TMA_FIXED, GemmTiles, check_tma_spec, data_parallel_rounds,
                                         shared_bytes, tile_count, tma_counts_fit, tma_grid, tma_shared_bytes)
from codegen.spec import ConvSpec, SpecError
from codegen.terms.gemm import gemm_sizes, gemm_terms, row_table


def choose_tiles(spec: ConvSpec, device: Device | str | None = None) -> GemmTiles:
    """implicit_gemm's tiles on ``device``: the TMA kernel where its rules take it, the portable
    cp.async kernel otherwise."""
    device = as_device(device)
    return tma_choice(spec, device) or portable_tiles(spec, device)


TMA_MIN_TILES_PER_SM = 4
"""Below this many tiles per SM the persistent TMA kernel, which has no split-K, lost to the
cp.async kernel's split-K tiles (GEMM v14, v15)."""
TMA_MIN_STREAM_K_TILES_PER_SM = 2
"""With a stream-K tail, which keeps the blocks of a ragged last round busy, the TMA kernel still won
down to about 2 tiles per SM (GEMM v15)."""
TMA_MIN_GEMM_K = 512
"""C x taps below which the TMA kernel won only with 16-row micro-tiles: with 8x8 ones it lost on
most such layers (pointwise layers, small filters) and from here up it won on all (GEMM v30)."""
TMA_ONE_ROUND_MIN_GEMM_K = 1024
"""C x taps from which a stream-K TMA kernel with fewer than ``TMA_MIN_STREAM_K_TILES_PER_SM`` tiles
per SM is still taken, if its tiles fill one round at full size (block_m not halved): it won on
every such layer measured, and lost wherever ``tma_tiles`` had halved block_m (GEMM v33)."""
TMA_STAGES = 6
"""Most stages the TMA kernel gets (the prototype gained from 4 to 6; GEMM v11)."""


def tma_choice(spec: ConvSpec, device: Device) -> GemmTiles | None:
    """The TMA kernel's tiles (``tma_tiles``) where it pays on ``device``, else None.

    - sm_90 and newer, where TMA and ``setmaxnreg`` exist;
    - channels-last only: channels-first data keeps the cp.async kernel, which needs no workspace,
      where the gathered kernel's transposed filter would pass cuDNN's extra memory (GEMM v17);
    - the kernel takes the spec (``tma_suits``) and fills its output-channel tiles: K a multiple of
      64, or K = 32, where the compiler drops a 64-wide tile's idle half (GEMM v14);
    - C padded to the 32-channel boxes less than 4/3 of C (``pads_by_a_third``): each tap's last box
      is part padding, wasted FMAs (GEMM v30);
    - C x taps at least ``TMA_MIN_GEMM_K`` unless the micro-tiles have 16 rows;
    - at least ``TMA_MIN_TILES_PER_SM`` tiles per SM, ``TMA_MIN_STREAM_K_TILES_PER_SM`` with a
      stream-K tail, or with a tail one round of full-size tiles where C x taps reaches
      ``TMA_ONE_ROUND_MIN_GEMM_K``."""
    if device.capability < 90 or not spec.layout.channels_last or not tma_suits(spec) or not (
            spec.k % 64 == 0 or spec.k == 32):
        return None
    tiles = tma_tiles(spec, device=device)
    gemm_k = gemm_sizes(index.IndexAlgebra(spec))[2]
    boxed_c = -(-spec.c // tiles.block_k) * tiles.block_k
    if pads_by_a_third(boxed_c, spec.c) or (gemm_k < TMA_MIN_GEMM_K and tiles.thread_m != 16):
        return None
    count, blocks = tma_grid(spec, tiles, device)
    if not tma_counts_fit(spec, count, blocks):
        return None
    stream_k = takes_stream_k(tiles, count, blocks)
    least = TMA_MIN_STREAM_K_TILES_PER_SM if stream_k else TMA_MIN_TILES_PER_SM
    one_full_round = (stream_k and count >= device.sm_count and gemm_k >= TMA_ONE_ROUND_MIN_GEMM_K
                      and tiles.block_m == tma_full_block_m(tiles.thread_m, tiles.block_n))
    return tiles if count >= least * device.sm_count or one_full_round else None


def tma_tiles(spec: ConvSpec, thread_m: int | None = None, device: Device | str | None = None) -> GemmTiles:
    """The TMA kernel's tiles (GEMM v11, v15), 128 output channels wide above 64 channels, else 64.

    - 16-row micro-tiles (8 consumer warps of 64x64: 256x128 or 512x64 tiles) where K is a multiple
      of 64 and they give at least ``TMA_MIN_TILES_PER_SM`` tiles per SM: fewer shared loads per FMA,
      and a rolled slice loop that fits the instruction cache; at K = 32 the unrolled 8x8 loop,
      which drops the idle half's FMAs, won;
    - otherwise 8x8 micro-tiles: 128x128, or 256x64, block_m halved while the grid has fewer tiles
      than SMs, so that every SM has one;
    - as many stages as shared memory holds, up to ``TMA_STAGES``.
    ``thread_m`` asks for one micro-tile."""
    device = as_device(device)
    gemm_m, gemm_n, _ = gemm_sizes(index.IndexAlgebra(spec))
    block_n = 128 if gemm_n > 64 else 64
    if thread_m is None:
        wide_m = tma_full_block_m(16, block_n)
        enough = tile_count(gemm_m, gemm_n, wide_m, block_n) >= TMA_MIN_TILES_PER_SM * device.sm_count
        thread_m = 16 if enough and gemm_n % 64 == 0 else 8
    block_m = tma_full_block_m(thread_m, block_n)
    while thread_m == 8 and block_m > 32 and tile_count(gemm_m, gemm_n, block_m, block_n) < device.sm_count:
        block_m //= 2
    tiles = GemmTiles(block_m=block_m, block_n=block_n, warp_m=4 * thread_m, thread_m=thread_m, stages=2,
                      tma=True, **TMA_FIXED)
    for stages in range(TMA_STAGES, 2, -1):
        candidate = GemmTiles(**{**tiles.to_dict(), "stages": stages})
        if tma_shared_bytes(candidate) <= device.shared_per_block:
            return candidate
    return tiles


def tma_full_block_m(thread_m: int, block_n: int) -> int:
    """The TMA kernel's block_m before ``tma_tiles`` halves it to give every SM a tile: 8 consumer
    warps of 64x64 with 16-row micro-tiles, else 128 (256 where the tiles are 64 channels wide)."""
    if thread_m == 16:
        return 8 * 64 * 64 // block_n
    return 128 if block_n == 128 else 256


def tma_suits(spec: ConvSpec) -> bool:
    """Whether the TMA kernel takes ``spec`` (``gemm_tiles.check_tma_spec`` passes)."""
    try:
        check_tma_spec(spec)
    except SpecError:
        return False
    return True


TMA_MIN_GATHER_TILES_PER_SM = 3
"""Fewest tiles per SM at which the gathered (channels-first) TMA kernel beat the cp.async kernel,
whose split-K tiles keep more blocks busy than the persistent kernel's few tiles (GEMM v17)."""


def gather_pays(spec: ConvSpec, device: Device | str | None = None) -> bool:
    """Whether the TMA kernel's gathered A tile pays on channels-first data (the catalogue ships its
    file for these layers; ``tma=True`` asks for it):
    - full 32-channel slices: a C = 3 image would fill 3 of each slice's 32 rows;
    - K other than 64: the 64-wide output-channel tile makes the producer warps gather twice the
      pixels per FMA that they do at 128 (at K = 32 the cp.async kernel's own tiles are thin too);
    - ``TMA_MIN_GATHER_TILES_PER_SM`` tiles per SM (GEMM v17)."""
    if spec.c % 32 or spec.k == 64 or not tma_suits(spec):
        return False
    device = as_device(device)
    count, _ = tma_grid(spec, tma_tiles(spec, device=device), device)
    return count >= TMA_MIN_GATHER_TILES_PER_SM * device.sm_count


STREAM_K_16X8_MIN_LOSS = 0.02
STREAM_K_16X8_MAX_TAIL = 0.1
"""The 16x8 kernels stream their tail only where whole tiles idle at least this share of the
block-time and the tail is at most this share of the tiles: its loop, in a launch of its own,
runs slower than the whole-tile loop (GEMM v16)."""


def takes_stream_k(tiles: GemmTiles, count: int, blocks: int) -> bool:
    """Stream-K for 8x8 micro-tiles whose last round leaves any block idle: the tail's equal shares
    keep every block busy to the end (GEMM v16).  16x8 micro-tiles, whose FMA loop is sensitive to
    ptxas' register allocation, stream only within the ``STREAM_K_16X8_*`` bounds, with the tail in
    a launch of its own (``tail_in_own_launch``)."""
    loss = round_loss(count, blocks)
    if tiles.thread_m == 8:
        return loss > 0
    tail = count - data_parallel_rounds(count, blocks) * blocks
    return loss >= STREAM_K_16X8_MIN_LOSS and tail <= STREAM_K_16X8_MAX_TAIL * count


def round_loss(tiles: int, blocks: int) -> float:
    """The share of block-time idle when ``blocks`` persistent blocks take ``tiles`` whole tiles."""
    return 1.0 - tiles / (blocks * -(-tiles // blocks))


def tail_in_own_launch(tiles: GemmTiles) -> bool:
    """Whether a stream-K tail runs in a second launch of the kernel after its rounds of whole
    tiles: for the 16x8 kernels, whose whole-tile loop ptxas allocated worse beside the tail's loop
    in one kernel (GEMM v16).  The 8x8 kernels keep one launch."""
    return tiles.thread_m == 16


WIDE_BLOCKS_PER_SM = 2
"""Blocks of ``wide_tiles`` resident per SM: 128 threads at 190-200 registers (ptxas -v)."""
WIDE_MIN_WAVE_FILL = 0.9
"""How full the last wave of wide tiles must be for ``portable_tiles`` to take them: they won on
every layer measured from 0.93 up, and lost on 31 of 35 from 0.87 down (GEMM v33)."""
SHALLOW_CHANNELS = 8
"""Channels-last inputs with at most this many channels take 8-deep slices: A is loaded
channel-fastest, one k-row per lane, so a thread's per-slice copy state grows with the slice depth
(C = 4: 254 registers at 16 deep, 139 at 8; GEMM v34)."""


def portable_tiles(spec: ConvSpec, device: Device | str | None = None) -> GemmTiles:
    """implicit_gemm's cp.async kernel (``default_tiles``): ``core_tiles``, with three changes.

    - ``few_tile_tiles`` where the grid has too few tiles for ``core_tiles`` to keep 4 warps a CTA.
    - Where it splits K and K is a multiple of 64, the 128-thread tiles of 16x8 micro-tiles of
      ``wide_tiles`` instead, unsplit, wherever their grid fills its last wave of
      ``WIDE_BLOCKS_PER_SM`` blocks per SM to ``WIDE_MIN_WAVE_FILL`` (GEMM v32, v33).
    - 8-deep slices on channels-last inputs of at most ``SHALLOW_CHANNELS`` channels (GEMM v34)."""
    device = as_device(device)
    alg = index.IndexAlgebra(spec)
    core = core_tiles(spec, row_table_fits(alg, gemm_terms(alg, "image")), device)
    tiles = few_tile_tiles(spec, core, device) or core
    gemm_m, gemm_n, _ = gemm_sizes(alg)
    if tiles.split_k > 1 and gemm_n % 64 == 0:
        wide = fit_device(wide_tiles(tiles, gemm_n), device)
        waves = tile_count(gemm_m, gemm_n, wide.block_m, wide.block_n) / (WIDE_BLOCKS_PER_SM * device.sm_count)
        if waves / math.ceil(waves) >= WIDE_MIN_WAVE_FILL and shared_bytes(wide) <= device.shared_per_block:
            return wide
    if spec.layout.channels_last and spec.c <= SHALLOW_CHANNELS and tiles.block_k == 16:
        return GemmTiles(**{**tiles.to_dict(), "block_k": 8})
    return tiles


FEW_TILE_MIN_WARPS = 4
"""Warps a CTA keeps on a grid of few tiles (``few_tile_tiles``)."""
FEW_TILE_MIN_SLICES = 8
"""k-slices each split keeps at least in ``few_tile_tiles``, whose larger tiles need split-K sooner."""


def few_tile_tiles(spec: ConvSpec, core: GemmTiles, device: Device) -> GemmTiles | None:
    """Where ``core_tiles`` halved block_m to a CTA of fewer than ``FEW_TILE_MIN_WARPS`` warps to
    give each SM two CTAs: the tile at the last halving that keeps those warps, with split-K down to
    ``FEW_TILE_MIN_SLICES`` slices a split making up the CTAs, if that tile fits in the pixels
    and the splits give every SM a CTA, and the card's shared memory holds it (else None).  Tiles of 1-3
    warps spend their few k-slices on per-CTA setup and pipeline fill; on the 130 layer-layouts of
    the shapes files where this changes the tiles it ran 1.03x faster in geometric mean, and took
    the slowest GEMM layer of docs/shapes/generalisation.json from 0.76x to 1.08x cuDNN FP32 (GEMM v37)."""
    alg = index.IndexAlgebra(spec)
    gemm_m, gemm_n, gemm_k = gemm_sizes(alg)
    block_n = core.block_n
    block_m = _halved_block_m(gemm_m, gemm_n, block_n, device, 32 * FEW_TILE_MIN_WARPS)
    tiles = tile_count(gemm_m, gemm_n, block_m, block_n)
    split_k = heuristic_split_k(tiles, -(-gemm_k // core.block_k), device.sm_count, FEW_TILE_MIN_SLICES)
    if block_m == core.block_m or block_m > gemm_m or tiles * split_k < device.sm_count:
        return None   # the pixels would pad the tile, or SMs would idle: the halved tile stands
    thread_m, thread_n = _micro_tile(block_m, block_n)
    warp_m, warp_n = _warp_shape(block_m, block_n, thread_m, thread_n)
    held = fit_device(dataclasses.replace(core, block_m=block_m, warp_m=warp_m, warp_n=warp_n, thread_m=thread_m,
                                          thread_n=thread_n, split_k=split_k), device)
    return held if shared_bytes(held) <= device.shared_per_block else None


def wide_tiles(base: GemmTiles, gemm_n: int) -> GemmTiles:
    """``base`` as 128 threads of 16x8 micro-tiles, 8-deep slices, K unsplit: 128x128 tiles where
    ``gemm_n`` is a multiple of 128, else 256x64 (the shapes of ``gemm_tuning.WIDE_TILES`` that won
    every channels-first layer the tuner was run on, GEMM v32)."""
    block_m, block_n = (128, 128) if gemm_n % 128 == 0 else (256, 64)
    warp_m, warp_n = _warp_shape(block_m, block_n, 16, 8)
    return GemmTiles(**{**base.to_dict(), "block_m": block_m, "block_n": block_n, "block_k": 8, "warp_m": warp_m,
                        "warp_n": warp_n, "thread_m": 16, "thread_n": 8, "split_k": 1})


SPLIT_K_CTAS_PER_SM = 8
"""CTAs per SM below which ``core_tiles`` splits K (1056 on the H100's 132 SMs): outputs of few
tiles leave SMs idle, and split ones ran faster down to this line (GEMM v6)."""
SPLIT_K_MIN_SLICES = 16
"""k-slices each split keeps at least, so the pipeline still has a loop to overlap."""
NARROW_TILE = 48
"""The CTA tile width, in output channels, that ``core_tiles`` takes where its usual tile would pad
K to at least 4/3 of what 48-wide tiles pad it to (K = 33-48 and 129-144): a quarter of the usual
tile's FMAs would be padding (GEMM v28)."""


def core_tiles(spec: ConvSpec, table_fits: bool = True, device: Device | str | None = None) -> GemmTiles:
    """The cp.async kernel's tiles, which im2win shares, distilled from tuning the 16 benchmark
    layers (GEMM v5) in the way CUTLASS's default configurations are picked:

    - block_n covers the output channels tightly (32, 64, 96 or 128), since padded channels are
      wasted FMAs; above 128 channels 64-wide tiles, twice the CTAs where pixels are few; 48-wide
      tiles of 4x12 micro-tiles where the usual tile pads by a third (``NARROW_TILE``);
    - block_m is 128 (256 when block_n is 32 and pixels abound), halved (down to 32) until the grid
      has two CTAs per SM;
    - 8x8 micro-tiles (64 FMAs per 16 floats read from shared memory) in 4x8-lane warps, the shape
      most tuned winners had; small tiles shrink the micro-tile to keep 32 lanes per warp;
    - 8x12 micro-tiles on the 96-channel tiles: one warp spans the 96 channels, so a 128x96 tile is
      128 threads of 96 outputs with the longer runs of independent FMAs of cuBLAS's SIMT kernels
      (GEMM v9); every tile then splits its pixels evenly over its threads, so channels-first A
      tiles load along pixels;
    - block_k 16 (8 when K = C*taps is below 64, where half a slice would be padding), 3 cp.async
      stages in dynamic shared memory (the launchers opt in above 48 KB);
    - one float a copy (``vector_load`` off) in every layout: a slice lands k-major in shared memory,
      so cp.async copies are 4 bytes either way, and one channel a thread makes a slice's 16
      channels of a pixel 16 adjacent lanes, 64 contiguous bytes (GEMM v22);
    - the row table (``precomp``) wherever ``table_fits`` (``row_table_fits``);
    - split-K (CUTLASS's serial reduction through atomic adds) below ``SPLIT_K_CTAS_PER_SM`` tiles per
      SM (``heuristic_split_k``);
    - ``fit_device`` for cards with less shared memory or without cp.async, and block_m halved where
      the epilogue's tile alone passes the card's shared memory."""
    device = as_device(device)
    alg = index.IndexAlgebra(spec)
    gemm_m, gemm_n, gemm_k = gemm_sizes(alg)
    block_n = _channel_tile(gemm_n)
    block_m = _halved_block_m(gemm_m, gemm_n, block_n, device)
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


def _halved_block_m(gemm_m: int, gemm_n: int, block_n: int, device: Device, min_threads: int = 0) -> int:
    """``core_tiles``' block_m: 128 (256 for 32-wide tiles), halved down to 32 while the grid has
    fewer than two CTAs per SM, stopping before a halving whose CTA would have fewer than
    ``min_threads`` threads (``few_tile_tiles``)."""
    block_m = 256 if block_n == 32 else 128
    while block_m > 32 and tile_count(gemm_m, gemm_n, block_m, block_n) < 2 * device.sm_count:
        thread_m, thread_n = _micro_tile(block_m // 2, block_n)
        if (block_m // 2) * block_n // (thread_m * thread_n) < min_threads:
            break
        block_m //= 2
    return block_m


def _channel_tile(gemm_n: int) -> int:
    """block_n for ``gemm_n`` output channels: the tightest of 32-128 (64 above 128), or
    ``NARROW_TILE`` where the channels that tile pads to are at least 4/3 of those 48-wide tiles pad to."""
    block_n = 64 if gemm_n > 128 else next(b for b in (32, 64, 96, 128) if gemm_n <= b)
    padded = {width: -(-gemm_n // width) * width for width in (block_n, NARROW_TILE)}
    return NARROW_TILE if pads_by_a_third(padded[block_n], padded[NARROW_TILE]) else block_n


def pads_by_a_third(padded: int, needed: int) -> bool:
    """Whether ``padded`` is at least 4/3 of ``needed``: the line at which a tile or box leaves a
    quarter of its work on padding (``_channel_tile``, ``tma_choice``'s channel boxes; GEMM v28, v30)."""
    return 3 * padded >= 4 * needed


def _micro_tile(block_m: int, block_n: int) -> tuple[int, int]:
    """The thread micro-tile for a block_m x block_n CTA tile (``core_tiles`` says why)."""
    if block_n == NARROW_TILE:
        return 4, 12
    if block_m == 32 or block_n == 32:
        return (4, 8) if block_n >= 64 else (8, 4) if block_m >= 64 else (4, 4)
    return 8, 12 if block_n == 96 else 8


def _warp_shape(block_m: int, block_n: int, thread_m: int, thread_n: int) -> tuple[int, int]:
    """The 32-lane warp layout (lanes_m x lanes_n) whose tile divides the block, 4x8 first."""
    for lanes_m, lanes_n in ((4, 8), (8, 4), (2, 16), (16, 2)):
        warp_m, warp_n = lanes_m * thread_m, lanes_n * thread_n
        if block_m % warp_m == 0 and block_n % warp_n == 0:
            return warp_m, warp_n
    raise SpecError("tiles.block_m/block_n", (block_m, block_n), "no 32-lane warp layout divides this block")


def heuristic_split_k(ctas: int, k_tiles: int, sm_count: int, min_slices: int = SPLIT_K_MIN_SLICES) -> int:
    """Split-K for an output of ``ctas`` tiles and a K range of ``k_tiles`` slices: enough splits to
    reach ``SPLIT_K_CTAS_PER_SM`` CTAs a SM (at most 16 splits), each keeping ``min_slices``."""
    enough = SPLIT_K_CTAS_PER_SM * sm_count
    if ctas >= enough:
        return 1
    return max(1, min(16, -(-enough // ctas), k_tiles // min_slices))


def row_table_fits(alg: index.IndexAlgebra, terms: dict) -> bool:
    """Whether ``precomp``'s row table can be made: at most ``TABLE_MAX_ROWS`` rows, each offset
    within 32 bits (the table stores ints); the heuristic computes the offsets otherwise."""
    if alg.rows > TABLE_MAX_ROWS:
        return False
    return max(abs(v) for row in row_table(alg, terms) for v in row) <= index.INT32_MAX


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
