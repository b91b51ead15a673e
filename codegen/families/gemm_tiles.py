"""GEMM tiles and what a choice of them implies, for implicit_gemm and im2win: the tile parameters
(``GemmTiles``), the rules every choice must pass (``check_geometry``; ``check_tma_spec`` for the
specs the TMA kernel takes), and what it costs: shared memory, registers, the grid and K split, the
TMA kernel's persistent grid and stream-K schedule.  Which tiles a layer gets is
``gemm_heuristic``'s; what the tuner tries, ``gemm_tuning``'s; what the main loop's template reads,
``gemm_loop``'s.

The convolution is the GEMM y[M x N] = A[M x K] * B[K x N] with M = N*OD*OH*OW output pixels,
N = K output channels and K = C*T*R*S column-matrix rows (seed 003).  The cp.async kernel is
CUTLASS's SIMT structure: a CTA tile block_m x block_n advanced over K in block_k slices,
``stages`` shared-memory buffers filled by ``cp.async`` (or by registers when ``async_copy`` is
off) so the next slices load while this one is multiplied, warps owning warp_m x warp_n sub-tiles
and threads thread_m x thread_n outer products (the micro-kernel).  With ``split_k`` > 1 several
CTAs share an output tile's K range and add their partial tiles into the zeroed output atomically
(CUTLASS's serial split-K).  Shared memory is dynamic (up to 227 KB on sm_90, opted into by the
launchers above 48 KB).  With ``tma`` the tiles describe the sm_90 kernel of
``implicit_gemm_tma.cu.j2`` instead (``TMA_FIXED``).
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass
from typing import ClassVar

from codegen import index
from codegen.device import Device
from codegen.spec import ConvSpec, SpecError
from codegen.terms.gemm import gemm_sizes
from codegen.terms.implicit_gemm import IM2COL_CORNER_LIMIT, TMA_ELEMENT_STRIDE_LIMIT, im2col_map_terms
from codegen.tiles import DYNAMIC_SHARED_LIMIT, TileParam, Tiles, check_block

SMEM_PAD = 4
REGISTER_LIMIT = 255
REGISTER_FILE = 65536
REGISTER_OVERHEAD = 40
"""Registers the estimate adds for addresses, loop counters and loader state (ptxas -v on the
benchmark layers: 30-45 beyond accumulators and fragments)."""
TABLE_MAX_ROWS = 1 << 16
"""The most column-matrix rows (C x taps) a kernel may carry a per-row table for (``precomp``'s row
offsets, the TMA kernel's slice offsets): the generator writes such a table into the source, one
entry a row, so past this bound it would render and compile megabytes of initialisers.  The
benchmark layers have at most 6912 rows."""


class GemmVariant(str, enum.Enum):
    """The kernel a GEMM plan renders, named in its kernels and its file header."""

    ANALYTIC = "analytic"
    """cp.async kernel dividing each column-matrix row's offset out in the kernel."""
    PRECOMP = "precomp"
    """cp.async kernel reading the row offsets from a table the generator writes (cuDNN's name)."""
    TMA = "tma"
    """implicit_gemm's sm_90 kernel (``implicit_gemm_tma.cu.j2``)."""


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
    def variant(self) -> GemmVariant:
        """The kernel these tiles render."""
        if self.tma:
            return GemmVariant.TMA
        return GemmVariant.PRECOMP if self.precomp else GemmVariant.ANALYTIC

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


def loader(rows: int, groups: int, threads: int, m_fastest: bool, field: str, tiles: GemmTiles) -> dict:
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
    """Whether ``threads`` can load a channels-first A tile pixel-fastest (``loader``'s rule along
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
warp at 40 and two consumer warps at 232 fit the 512 registers a lane that 3 warps at 168 held."""
TMA_ALIGNMENT = 1024
"""Bytes of dynamic shared memory a TMA block keeps spare to start its tiles on the 1024-byte
boundary the 128-byte swizzle needs (the dynamic allocation is only 16-byte aligned)."""
BLOCK_RESERVED = 1024
"""Shared memory the driver reserves for each resident block on top of its own."""


def tma_shared_bytes(tiles: GemmTiles) -> int:
    """The alignment slack, ``stages`` A tiles (block_m pixels x 32 channels) and B tiles (32
    channels x block_n), then a full and an empty mbarrier per stage."""
    return TMA_ALIGNMENT + tiles.stages * (tiles.block_m + tiles.block_n) * TMA_FIXED["block_k"] * 4 + 16 * tiles.stages


def tma_register_split(tiles: GemmTiles) -> tuple[int, int] | None:
    """The register split of a TMA kernel: 16-row micro-tiles need it (about 205 registers), and 8
    consumer warps of 8x8 ran faster with it (docs/perf.md, 'The heuristics' rules'); None where a
    single producer warp is kept (fewer than 8 consumer warps of 8x8, where a warpgroup would cost
    a second resident block)."""
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


def grid(spec: ConvSpec, tiles: GemmTiles) -> tuple[int, int, int]:
    """x: M tiles times N tiles, N fastest (see the kernel's comment); y: the K splits."""
    gemm_m, gemm_n, _ = gemm_sizes(index.IndexAlgebra(spec))
    return (tile_count(gemm_m, gemm_n, tiles.block_m, tiles.block_n), k_split(spec, tiles)[0], 1)


def k_split(spec: ConvSpec, tiles: Tiles) -> tuple[int, int]:
    """(CTAs or work units per output tile, k-slices each takes): ``split_k`` ranges of whole slices,
    none empty; of any tiles with block_k and split_k (the FMA kernel's, the WGMMA kernel's)."""
    _, _, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
    k_tiles = -(-gemm_k // tiles.block_k)
    if tiles.split_k > k_tiles:
        raise SpecError("tiles.split_k", tiles.split_k, f"must be at most the {k_tiles} k-slices of "
                        f"{tiles.block_k} that K = {gemm_k} makes")
    per_split = -(-k_tiles // tiles.split_k)
    return -(-k_tiles // per_split), per_split


def flops(spec: ConvSpec) -> int:
    """2*M*N*K: the multiply-adds of the convolution, padding taps included (as cuDNN counts)."""
    gemm_m, gemm_n, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
    return 2 * gemm_m * gemm_n * gemm_k


def async_copy_arch(tiles: GemmTiles) -> dict:
    """The plan's oldest target: cp.async and its mbarriers need sm_80; register staging runs on
    every target NVRTC builds for."""
    if not tiles.async_copy:
        return {}
    return {"min_arch": 80, "min_arch_reason": "cp.async; async_copy=False with stages <= 2 runs on older targets"}


def check_tma_spec(spec: ConvSpec) -> None:
    """What TMA's im2col mode takes from a channels-last image, each refusal naming the field:
    16-byte pixel strides, strides up to 8, and corners (-p and p - d*(f - 1)) in the 8-bit (2D)
    or 5-bit (3D) range the map encodes.  A channels-first image is gathered by the producer
    warps instead, which takes every spec."""
    slices = tma_slices(spec)
    if slices > TABLE_MAX_ROWS:
        raise SpecError("c", spec.c, f"gives the TMA kernel {slices} k-slices (taps x C/32), whose offsets it "
                        f"tabulates; at most {TABLE_MAX_ROWS} (tma=True): use tma=False")
    if not spec.layout.channels_last:
        return
    if spec.pitch % 4:
        raise SpecError("dpitch", spec.pitch, "must be a multiple of 4 with tma=True (TMA row strides are multiples of "
                        "16 bytes); pad the channels with dpitch")
    check_im2col_map(spec)


def check_im2col_map(spec: ConvSpec) -> None:
    """What an im2col map of a channels-last image takes beyond 16-byte pixel strides, each refusal
    naming the field: traversal strides up to 8 and corners in the range the map's rank encodes."""
    for j, stride in enumerate(spec.stride):
        if stride > TMA_ELEMENT_STRIDE_LIMIT:
            raise SpecError(f"stride[{j}]", stride, f"must be at most {TMA_ELEMENT_STRIDE_LIMIT} with tma=True "
                            "(the largest traversal stride of a TMA map)")
    limit = IM2COL_CORNER_LIMIT[spec.dims]
    terms = im2col_map_terms(index.IndexAlgebra(spec))
    for inner, corners in enumerate(zip(terms["lower"], terms["upper"])):
        j = spec.dims - 1 - inner           # the map's spatial axes run innermost first
        if not all(-limit <= corner < limit for corner in corners):
            raise SpecError(f"padding[{j}]", spec.padding[j], f"with filter {spec.filter_size[j]} and dilation "
                            f"{spec.dilation[j]} gives im2col corners {corners}, outside [-{limit}, {limit - 1}], the "
                            f"range a {spec.dims + 2}-D TMA map encodes (tma=True)")


def tma_slices(spec: ConvSpec) -> int:
    """The TMA kernel's k-slices per output tile: every tap times C in 32-channel boxes."""
    return math.prod(spec.filter_size) * -(-spec.c // TMA_FIXED["block_k"])


def tma_resident_blocks(tiles: GemmTiles, device: Device) -> int:
    """TMA blocks that fit on one SM of ``device``, by shared memory and by registers (at least one)."""
    return max(1, min(device.shared_per_sm // (tma_shared_bytes(tiles) + BLOCK_RESERVED),
                      device.registers_per_sm // (tiles.threads * TMA_REGISTERS)))


def tma_grid(spec: ConvSpec, tiles: GemmTiles, device: Device) -> tuple[int, int]:
    """The TMA kernel's CTA tiles and its persistent blocks: every SM of ``device`` times the
    blocks that fit on one, or fewer when there are fewer tiles."""
    gemm_m, gemm_n, _ = gemm_sizes(index.IndexAlgebra(spec))
    count = tile_count(gemm_m, gemm_n, tiles.block_m, tiles.block_n)
    return count, min(count, device.sm_count * tma_resident_blocks(tiles, device))


def tma_counts_fit(spec: ConvSpec, count: int, blocks: int) -> bool:
    """Whether the TMA kernel's 32-bit counters hold its tiles and steps (tiles x slices, the
    stream-K tail's positions) and a tile index advanced by one grid of persistent blocks."""
    return count * tma_slices(spec) <= index.INT32_MAX and count + blocks <= index.INT32_MAX


def data_parallel_rounds(tiles: int, blocks: int) -> int:
    """Rounds of whole tiles each block takes (tile = block + round * blocks) before the stream-K
    tail: all of them when the tiles fill every round, else all but the last full one, so that
    the tail (the partly filled wave plus one full wave) is shared out in equal steps, as
    CUTLASS's data-parallel + stream-K hybrid does (docs/perf-history.md, GEMM v15)."""
    if tiles % blocks == 0:
        return tiles // blocks
    return max(0, tiles // blocks - 1)


def stream_k_span(block: int, tiles: int, slices: int, blocks: int) -> tuple[int, int]:
    """The (tile, slice) steps [begin, end) of the stream-K tail that persistent block ``block``
    of ``blocks`` takes: equal shares in order, after the data-parallel rounds."""
    first = data_parallel_rounds(tiles, blocks) * blocks * slices
    tail = tiles * slices - first
    return first + block * tail // blocks, first + (block + 1) * tail // blocks


def shared_tiles(tiles: int, slices: int, blocks: int) -> set[int]:
    """Tiles whose slices two or more blocks share: those with a block's first tail step inside them."""
    begins = (stream_k_span(block, tiles, slices, blocks)[0] for block in range(1, blocks))
    return {begin // slices for begin in begins if begin % slices}
