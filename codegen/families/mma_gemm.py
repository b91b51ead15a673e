"""Implicit-GEMM convolution on tensor cores (sm_80+, ``mma.sync``): float16 and bfloat16, and
float32 with math tf32 or 3xtf32, every layout.

The GEMM is the FMA kernel's (``implicit_gemm``): M = N*OD*OH*OW output pixels, N = K output
channels, K = C*T*R*S, A(m, k) the input pixel that output pixel m reads for column k (zero in the
padding), B(n, k) = w[n * GEMM_K + k], the filter in its own memory order, and y(m, n) at
``y_offset``.  Both operands are k-contiguous ("TN"), which is what ``mma.sync ... .row.col``
takes: m16n8k16 for float16 and bfloat16, m16n8k8 for TF32, all accumulating in FP32 registers.
The sum is rounded to the output type once, in the epilogue.

A CTA of 1-8 warps owns a block_m x block_n output tile, each warp a warp_m x warp_n part of it
made of 16x8 MMA atoms.  Operands pass through ``stages`` shared-memory stages of
[rows][block_k + 16 bytes] (k-contiguous; the 16-byte pad makes every row start on another bank
group, so ldmatrix and 32-bit fragment loads are conflict-free).  16-bit fragments come through
``ldmatrix.x4``; TF32 ones through 32-bit shared loads and ``cvt.rna.tf32.f32``, and for 3xTF32
each operand is split into big = tf32(a) and small = tf32(a - big), the product being
a_small*b_big + a_big*b_small + a_big*b_big (CUTLASS's "fast accurate FP32").  3xTF32 sums each
MMA step's three products from zero and adds them to the accumulators on the FP32 pipe: tensor
cores truncate what they add, and chaining every MMA into the accumulators lost 2-6 bits (on the
H100, relative errors of 1.2e-6 to 1.6e-5 against 2.2e-7 to 3.0e-7 for the FMA kernel on the same
inputs; summed from zero, 1.3e-7 to 3.3e-7).

Loads (``OperandLoad``): where channels-last data and its pitch make 16-byte runs of channels, A
comes in 16-byte ``cp.async`` copies (zero-filled where the tap is in the padding or past M or K);
elsewhere element by element, through 4-byte ``cp.async`` for float32 and through registers for
16-bit types (cp.async has no 2-byte copy), with lanes along M on channels-first data so that a
warp's loads coalesce.  B likewise: 16-byte copies where GEMM_K rows keep 16-byte alignment.  A
thread's pixels (base offset, origin per padded axis) are computed once per CTA; each k column is
decomposed into (channel, tap) once per k-slice and serves all of the thread's pixels.

With ``wgmma`` the plan is Hopper's kernel instead (``wgmma_gemm``: warpgroup MMAs, sm_90a), for
channels-last float16, bfloat16 and TF32 with 16-byte channel runs, and channels-last 3xTF32 whose
input comes by TMA; the heuristic takes it wherever the target is sm_90 and the spec is one of those
(3xTF32 from 64 output channels or C a multiple of 16, ``wgmma_gemm.preferred``), and mma.sync everywhere else.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codegen import index, precision
from codegen.device import Device, as_device, present
from codegen.families.base import (Buffer, ConvolutionContext, Family, KernelPlan, Launch,
                                   convolution_selftest_context, kernel_name)
from codegen.families import epilogue, wgmma_gemm
from codegen.families.direct import convolution_reference
from codegen.spec import ConvSpec, DType, MathMode, SpecError, uses_tensor_cores
from codegen.terms.gemm import gemm_sizes, gemm_terms
from codegen.tiles import TileParam, Tiles

COPY_BYTES = 16
"""The widest cp.async copy, and the shared-memory row pad that staggers rows across bank groups."""
MAX_WARPS = 8
"""Warps of a CTA (256 threads): the loaders' and epilogue's index arithmetic assumes no more."""
MAX_ACCUMULATORS = 128
"""FP32 accumulators per thread (a 64x64 warp tile), what the register file holds beside the
fragments and the loaders' state."""
MAX_ACCUMULATORS_3XTF32 = 64
"""3xTF32 holds each operand twice (big and small) and a partial sum per MMA step: at 128
accumulators (64x64 warps) ptxas spilled 20-64 bytes on sm_90, at 64 (64x32) it used 133-186
registers."""
PIXELS_PER_THREAD = 4
"""Pixels whose base offset and origins a thread keeps for the element-wise A loads: more lanes
along k coalesce better, more pixels cost registers."""
MAX_ELEMENT_COPIES = 32
"""Element-wise copies (4-byte cp.async, or 16-bit loads staged through registers) a thread makes
per slice, A and B together: ptxas computes every copy's 64-bit address and predicate up front, and
a staged value lives on until its store after the MMAs.  At 64 it spilled (a 256x32 TF32 tile of
4 warps with 32-deep slices: 12 bytes; one warp's 64x16 float16 tile: 16 bytes), at 144 244 bytes."""
MAX_ASYNC_ELEMENT_COPIES_IN_FLIGHT = 96
"""4-byte cp.async copies a thread keeps in flight over all stages (element copies a slice x stages)
on float32 data: ptxas holds registers for each stage's copies, so at 32 copies a slice 3 stages
took 190-196 registers on sm_80 and 4 stages spilled 4-36 bytes at 255 (TF32 and 3xTF32 tiles of
one and two warps)."""
MAX_WARP_N = 128
"""A warp's widest tile along N (the 256 of ``MmaTiles``' choices is a wgmma warpgroup's)."""
DEFAULT_STAGES = 3
MMA_SYNC_MAX_STAGES = 6
VARIANT = "mma"
"""The plan's variant: implicit_gemm's kernel on tensor cores."""


def _powers_of_two(low: int, high: int) -> tuple[int, ...]:
    return tuple(1 << e for e in range(low.bit_length() - 1, high.bit_length()))


@dataclass(frozen=True)
class MmaTiles(Tiles):
    """The tensor-core kernel's tiles: CTA tile, warp tile (whose ratio sets the warps) and pipeline
    depth; powers of two throughout, so that every loader's lanes divide its rows evenly."""

    block_m: int = 128
    block_n: int = 128
    block_k: int = 32
    warp_m: int = 64
    warp_n: int = 64
    stages: int = DEFAULT_STAGES

    PARAMS: ClassVar = (
        TileParam("block_m", "CTA tile along GEMM M (output pixels)", choices=_powers_of_two(16, 256)),
        TileParam("block_n", "CTA tile along GEMM N (output channels)", choices=_powers_of_two(8, 256)),
        TileParam("block_k", "K slice per pipeline stage: a multiple of the MMA's k (16 for float16 and "
                  "bfloat16, 8 for TF32)", choices=(8, 16, 32, 64)),
        TileParam("warp_m", "warp tile along M, in 16-row MMA atoms", choices=(16, 32, 64, 128)),
        TileParam("warp_n", "warp tile along N, in 8-column MMA atoms (16-bit types load two at once: a "
                  "multiple of 16); with wgmma, block_n", choices=(8, 16, 32, 64, 128, 256)),
        TileParam("stages", "shared-memory stages of the pipeline (slices in flight while one is multiplied): "
                  f"up to {MMA_SYNC_MAX_STAGES} with mma.sync, up to {wgmma_gemm.MAX_STAGES} with wgmma (whose "
                  "64- and 32-byte slices take more of them for the same bytes in flight)",
                  minimum=2, maximum=wgmma_gemm.MAX_STAGES),
        TileParam("wgmma", "sm_90 only: Hopper's warpgroup MMA (channels-last float16, bfloat16, and float32 with "
                  "math tf32, with 16-byte channel runs); warp_m x warp_n is then a consumer warpgroup's share of "
                  "the tile (64 or 128 rows, block_n columns), block_k a slice of 128 bytes (or 64 or 32, each in its own swizzle)", choices=(False, True)),
        TileParam("pingpong", "with wgmma: two consumer warpgroups take alternate block_m x block_n tiles whole "
                  "(block_m = warp_m), so that one's epilogue runs under the other's MMAs (CUTLASS's ping-pong "
                  "schedule); off, the consumer warpgroups share each tile", choices=(False, True)),
        TileParam("split_k", "with wgmma: work units that share one output tile's K range (CUTLASS's parallel "
                  "split-K), each storing its FP32 partial tile into a workspace (splits x M x N float32) that a "
                  "second kernel adds up in range order, the same bits every run, and rounds once: more work where "
                  "the output has few tiles and K is long; ranges are whole k-slices, none empty, so a split past "
                  "what the slices allow evenly gives fewer units (16 on 18 slices: 9 ranges of 2)",
                  minimum=1, maximum=16),
        TileParam("tail_split", "with wgmma and without split_k: the K ranges each tile of the last, partial round "
                  "of work is split into (their FP32 partial tiles go to a workspace that a second kernel adds up in "
                  "range order, the same bits every run), so that a round holding a few tiles takes a fraction of a "
                  "round's time (the split of CUTLASS's data-parallel + split-K hybrid): at most the k-slices allow, "
                  "as split_k", minimum=1, maximum=wgmma_gemm.MAX_TAIL_SPLIT),
        TileParam("cluster_m", "with wgmma: CTAs of a thread-block cluster on neighbouring M tiles that share each "
                  "filter slice, one TMA copy of it multicast into all of them (CUTLASS's and cuDNN's cluster "
                  "multicast): the filter is read from L2 once per cluster rather than once per tile",
                  choices=wgmma_gemm.CLUSTER_CHOICES),
    )
    wgmma: bool = False
    pingpong: bool = False
    split_k: int = 1
    cluster_m: int = 1
    tail_split: int = 1

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.pingpong and not self.wgmma:
            raise SpecError("tiles.pingpong", True, "schedules wgmma's consumer warpgroups: set wgmma too, or leave "
                            "pingpong off")
        if self.split_k != 1 and not self.wgmma:
            raise SpecError("tiles.split_k", self.split_k, "must be 1 without wgmma (the mma.sync kernel does not "
                            "split K)")
        if self.tail_split != 1 and (not self.wgmma or self.split_k != 1):
            raise SpecError("tiles.tail_split", self.tail_split, "must be 1 without wgmma or with split_k (split-K "
                            "already splits every tile, the last round's too)")
        if self.cluster_m != 1 and not self.wgmma:
            raise SpecError("tiles.cluster_m", self.cluster_m, "must be 1 without wgmma (the mma.sync kernel runs no "
                            "clusters)")
        if self.wgmma:
            wgmma_gemm.check_geometry(self)
        else:
            if self.stages > MMA_SYNC_MAX_STAGES:
                raise SpecError("tiles.stages", self.stages, f"must be at most {MMA_SYNC_MAX_STAGES} without wgmma "
                                "(the range the mma.sync kernel is built and tested for)")
            check_geometry(self)

    def to_dict(self) -> dict:
        """The fields, wgmma, pingpong, split_k, cluster_m and tail_split only where set: the kernels keep the tuning
        records, kernel names (a hash of ``describe``) and catalogue files they had before those fields
        existed."""
        fields = super().to_dict()
        for name, unset in (("wgmma", False), ("pingpong", False), ("split_k", 1), ("cluster_m", 1), ("tail_split", 1)):
            if getattr(self, name) == unset:
                del fields[name]
        return fields

    @property
    def warps_m(self) -> int:
        return self.block_m // self.warp_m

    @property
    def warps_n(self) -> int:
        return self.block_n // self.warp_n

    @property
    def threads(self) -> int:
        return wgmma_gemm.threads(self) if self.wgmma else 32 * self.warps_m * self.warps_n


def check_geometry(tiles: MmaTiles) -> None:
    """What any spec needs of the mma.sync tiles, each refusal naming the field."""
    if tiles.warp_n > MAX_WARP_N:
        raise SpecError("tiles.warp_n", tiles.warp_n, f"must be at most {MAX_WARP_N} without wgmma (wider tiles are a "
                        "warpgroup's)")
    if tiles.block_m % tiles.warp_m:
        raise SpecError("tiles.block_m", tiles.block_m, f"must be a multiple of warp_m ({tiles.warp_m})")
    if tiles.block_n % tiles.warp_n:
        raise SpecError("tiles.block_n", tiles.block_n, f"must be a multiple of warp_n ({tiles.warp_n})")
    warps = tiles.warps_m * tiles.warps_n
    if warps > MAX_WARPS:
        raise SpecError("tiles.block_m", tiles.block_m, f"with block_n {tiles.block_n} gives {warps} warps of "
                        f"{tiles.warp_m}x{tiles.warp_n}; at most {MAX_WARPS} (enlarge warp_m or warp_n)")
    if tiles.warp_m * tiles.warp_n // 32 > MAX_ACCUMULATORS:
        raise SpecError("tiles.warp_n", tiles.warp_n, f"with warp_m {tiles.warp_m} gives each thread "
                        f"{tiles.warp_m * tiles.warp_n // 32} accumulators; at most {MAX_ACCUMULATORS}")


def mma_k(spec: ConvSpec) -> int:
    """The k of one MMA: m16n8k16 for 16-bit operands, m16n8k8 for TF32."""
    return 8 if spec.dtype is DType.float32 else 16


def check_tiles(spec: ConvSpec, tiles: MmaTiles, device: Device) -> None:
    """What ``spec``'s MMA and ``device``'s shared memory (and, with wgmma, its arch) need of the tiles."""
    if tiles.wgmma:
        wgmma_gemm.check_tiles(spec, tiles, device)
        return
    if tiles.block_k % mma_k(spec):
        raise SpecError("tiles.block_k", tiles.block_k, f"must be a multiple of {mma_k(spec)} for {spec.dtype.value} "
                        f"(the k of one MMA)")
    if spec.dtype is not DType.float32 and tiles.warp_n % 16:
        raise SpecError("tiles.warp_n", tiles.warp_n, f"must be a multiple of 16 for {spec.dtype.value} (ldmatrix.x4 "
                        "loads the B fragments of two 8-column atoms)")
    if spec.math is MathMode.three_tf32 and tiles.warp_m * tiles.warp_n // 32 > MAX_ACCUMULATORS_3XTF32:
        raise SpecError("tiles.warp_n", tiles.warp_n, f"with warp_m {tiles.warp_m} gives each thread "
                        f"{tiles.warp_m * tiles.warp_n // 32} accumulators; 3xtf32 takes at most "
                        f"{MAX_ACCUMULATORS_3XTF32} (its split operands need the registers)")
    copies = sum(load.rows * load.units for load in (a_load(spec, tiles), b_load(spec, tiles)) if not load.vector)
    if copies > MAX_ELEMENT_COPIES:
        raise SpecError("tiles.block_k", tiles.block_k, f"makes each thread copy {copies} elements one by one a slice "
                        f"(this spec's loads cannot take 16-byte copies); at most {MAX_ELEMENT_COPIES}: shallower "
                        "slices or more warps")
    if spec.dtype is DType.float32 and copies * tiles.stages > MAX_ASYNC_ELEMENT_COPIES_IN_FLIGHT:
        raise SpecError("tiles.stages", tiles.stages, f"keeps {copies} element copies a slice in flight in each "
                        f"stage ({copies * tiles.stages} in all); at most {MAX_ASYNC_ELEMENT_COPIES_IN_FLIGHT}: fewer "
                        "stages, shallower slices or more warps")
    needed = shared_bytes(spec, tiles)
    if needed > device.shared_per_block:
        raise SpecError("tiles.stages", tiles.stages, f"gives {needed} bytes of shared memory per block; "
                        f"{device.name} allows {device.shared_per_block} (fewer stages or smaller tiles)")


def shared_pitch(spec: ConvSpec, tiles: MmaTiles) -> int:
    """Elements of one shared-memory row: block_k plus the 16-byte pad."""
    return tiles.block_k + COPY_BYTES // spec.dtype.itemsize


def shared_bytes(spec: ConvSpec, tiles: MmaTiles) -> int:
    return tiles.stages * (tiles.block_m + tiles.block_n) * shared_pitch(spec, tiles) * spec.dtype.itemsize


def a_vector_ok(spec: ConvSpec) -> bool:
    """16-byte copies of A need 16-byte runs of channels of one pixel at one tap, 16-byte aligned:
    channels-last, with C and the pitch multiples of 16 bytes' elements."""
    vector = COPY_BYTES // spec.dtype.itemsize
    return spec.layout.channels_last and spec.c % vector == 0 and spec.pitch % vector == 0


def b_vector_ok(spec: ConvSpec) -> bool:
    """16-byte copies of B need every filter row (GEMM_K elements) to keep 16-byte alignment."""
    gemm_k = spec.c * math.prod(spec.filter_size)
    return gemm_k % (COPY_BYTES // spec.dtype.itemsize) == 0


@dataclass(frozen=True)
class OperandLoad:
    """How a CTA's threads share one operand's k-slice of ``rows`` x block_k elements.

    The slice is copied in units of ``unit`` elements (16 bytes on the vector path, else one);
    ``lanes_k`` threads share a row's units, so thread t copies units u + j * lanes_k of rows
    r + i * row_step (j < ``units``, i < ``rows``), with (r, u) = (t % row_step, t / row_step)
    where ``m_fastest`` (consecutive lanes on consecutive rows) and (t / lanes_k, t % lanes_k)
    otherwise."""

    vector: bool
    unit: int
    asynchronous: bool
    """cp.async copies; otherwise loads into registers, stored to shared memory after the MMAs."""
    lanes_k: int
    m_fastest: bool
    row_step: int
    rows: int
    units: int
    guard_rows: bool
    """More threads than the tile has rows: the last row slot of some threads lies past the tile."""
    element_bytes: int

    @property
    def copy_bytes(self) -> int:
        return self.unit * self.element_bytes


def operand_load(spec: ConvSpec, tiles: MmaTiles, rows: int, vector: bool, m_fastest: bool,
                 lanes_k: int | None) -> OperandLoad:
    """The loader of a ``rows`` x block_k slice; ``lanes_k`` None: every unit of a row across lanes."""
    itemsize = spec.dtype.itemsize
    unit = COPY_BYTES // itemsize if vector else 1
    units_per_row = tiles.block_k // unit
    lanes = min(units_per_row, tiles.threads, lanes_k or units_per_row)
    row_step = tiles.threads // lanes
    return OperandLoad(vector=vector, unit=unit, asynchronous=vector or spec.dtype is DType.float32, lanes_k=lanes,
                       m_fastest=m_fastest, row_step=row_step, rows=max(1, rows // row_step),
                       units=units_per_row // lanes, guard_rows=row_step > rows, element_bytes=itemsize)


def a_load(spec: ConvSpec, tiles: MmaTiles) -> OperandLoad:
    """A's loader: 16-byte chunks along k where ``a_vector_ok``, else elements with about
    ``PIXELS_PER_THREAD`` pixels a thread, lanes along M on channels-first data (consecutive
    pixels are consecutive addresses) and along k on channels-last data (consecutive channels)."""
    if a_vector_ok(spec):
        return operand_load(spec, tiles, tiles.block_m, True, False, None)
    lanes_k = max(1, PIXELS_PER_THREAD * tiles.threads // tiles.block_m)
    return operand_load(spec, tiles, tiles.block_m, False, not spec.layout.channels_last, lanes_k)


def b_load(spec: ConvSpec, tiles: MmaTiles) -> OperandLoad:
    """B's loader: filter rows are k-contiguous, so lanes run along k, a whole slice row across them."""
    return operand_load(spec, tiles, tiles.block_n, b_vector_ok(spec), False, None)


def mma_kind(spec: ConvSpec) -> str:
    """The MMA the kernel issues: f16, bf16, tf32 or 3xtf32."""
    if spec.dtype is DType.float16:
        return "f16"
    if spec.dtype is DType.bfloat16:
        return "bf16"
    return "3xtf32" if spec.math is MathMode.three_tf32 else "tf32"


def _tile_count(gemm_m: int, gemm_n: int, block_m: int, block_n: int) -> int:
    return -(-gemm_m // block_m) * -(-gemm_n // block_n)


def heuristic_tiles(spec: ConvSpec, device: Device | str | None = None) -> MmaTiles:
    """A first rule, not yet tuned: 128x128 CTA tiles of 4 warps (2x2 where N allows) of 64x64,
    8 warps of 64x32 for 3xTF32 (``MAX_ACCUMULATORS_3XTF32``); block_k 32 for 16-bit types and 16
    for TF32 (16 where a 16-bit operand is staged through registers, whose staging registers grow
    with it; never past GEMM_K rounded up to the MMA's k), ``DEFAULT_STAGES`` stages.  Narrower
    output-channel tiles where K is small, and block_m halved (down to one atom per warp) while the
    grid has fewer tiles than ``device`` has SMs or the tile is taller than M needs."""
    device = as_device(device)
    gemm_m, gemm_n, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
    atom_n = 8 if spec.dtype is DType.float32 else 16
    block_n = max(atom_n, min(128, 1 << (gemm_n - 1).bit_length()))
    warps_m = 2 if block_n >= 2 * atom_n else 4
    warps_n = 4 // warps_m
    if spec.math is MathMode.three_tf32:
        warps_n = max(warps_n, block_n // 32)
    staged = spec.dtype is not DType.float32 and not (a_vector_ok(spec) and b_vector_ok(spec))
    block_k = 16 if spec.dtype is DType.float32 or staged else 32
    block_k = max(mma_k(spec), min(block_k, 1 << (gemm_k - 1).bit_length()))
    block_m = 128
    smallest_m = 16 * warps_m
    while block_m > smallest_m and (block_m // 2 >= gemm_m or
                                    _tile_count(gemm_m, gemm_n, block_m, block_n) < device.sm_count):
        block_m //= 2
    block_m = max(block_m, smallest_m)
    tiles = MmaTiles(block_m=block_m, block_n=block_n, block_k=block_k, warp_m=block_m // warps_m,
                     warp_n=block_n // warps_n, stages=DEFAULT_STAGES)
    while tiles.stages > 2 and shared_bytes(spec, tiles) > device.shared_per_block:
        tiles = MmaTiles(**{**tiles.to_dict(), "stages": tiles.stages - 1})
    return tiles


TUNING_SEEDS = ((128, 128, 64, 64, 3), (128, 256, 64, 64, 3), (256, 128, 64, 64, 3), (128, 64, 64, 32, 4),
                (64, 128, 32, 64, 4), (64, 64, 32, 32, 4))
"""(block_m, block_n, warp_m, warp_n, stages) of the tuner's seeds, at 64-byte slices (block_k 32 for
16-bit types, 16 for TF32): CUTLASS's sm_80 tensor-op tile shapes, where the spec and target take them."""


def tuning_space(spec: ConvSpec, device: Device | str | None = None) -> list[dict]:
    """Every tile configuration the tuner may try for ``spec`` on ``device``: CTA tiles of 32-256
    (no taller or wider than M and N need, and for K under 32 also the one narrow tile that covers
    it), warp tiles of 16-128 x 8-128 giving 1-8 warps, slices of one to four MMA steps (no deeper
    than GEMM_K needs), 2-4 stages; each passes ``check_geometry`` and ``check_tiles``."""
    device = as_device(device)
    gemm_m, gemm_n, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
    atom_n = 8 if spec.dtype is DType.float32 else 16
    narrow = max(atom_n, _power_of_two_above(gemm_n))
    widths = [b for b in (32, 64, 128, 256) if b <= max(32, narrow)]
    widths = ([narrow] if narrow < 32 else []) + widths
    heights = [b for b in (32, 64, 128, 256) if b <= max(32, _power_of_two_above(gemm_m))]
    depths = [k for k in (8, 16, 32, 64) if k % mma_k(spec) == 0 and k <= max(mma_k(spec), _power_of_two_above(gemm_k))]
    space = []
    for block_m in heights:
        for block_n in widths:
            for warp_m in (w for w in (16, 32, 64, 128) if w <= block_m):
                for warp_n in (w for w in (8, 16, 32, 64, 128) if atom_n <= w <= block_n):
                    for block_k in depths:
                        for stages in (2, 3, 4):
                            try:
                                tiles = MmaTiles(block_m=block_m, block_n=block_n, block_k=block_k, warp_m=warp_m,
                                                 warp_n=warp_n, stages=stages)
                                check_tiles(spec, tiles, device)
                            except SpecError:
                                continue
                            space.append(tiles.to_dict())
    return space


def _power_of_two_above(n: int) -> int:
    """The least power of two >= ``n`` (1 for n <= 1)."""
    return 1 << (max(1, n) - 1).bit_length()


def tuning_seeds(spec: ConvSpec, device: Device | str | None = None) -> list[dict]:
    """``TUNING_SEEDS`` that are members of ``tuning_space``."""
    space = tuning_space(spec, device)
    seeds = [MmaTiles(**dict(zip(("block_m", "block_n", "warp_m", "warp_n", "stages"), shape)),
                      block_k=64 // spec.dtype.itemsize).to_dict() for shape in TUNING_SEEDS]
    return [seed for seed in seeds if seed in space]


@dataclass(frozen=True, kw_only=True)
class MmaContext(ConvolutionContext):
    """What ``implicit_gemm_mma.cu.j2`` reads.  Sizes are in elements unless named bytes."""

    kernel: str
    variant: str
    """The plan's variant, named in the file header."""
    mma: str
    """f16, bf16, tf32 or 3xtf32 (``mma_kind``)."""
    element: DType
    element_bytes: int
    BM: int
    BN: int
    BK: int
    WM: int
    WN: int
    warps_m: int
    threads: int
    stages: int
    k_step: int
    """The k of one MMA."""
    atoms_m: int
    """16-row MMA atoms along a warp's M."""
    atoms_n: int
    """8-column MMA atoms along a warp's N."""
    a_pitch: int
    """Elements of one shared-memory row of A (block_k plus the pad); likewise B."""
    b_pitch: int
    a_stage_bytes: int
    b_stage_bytes: int
    shared_bytes: int
    GEMM_M: int
    GEMM_N: int
    GEMM_K: int
    k_tiles: int
    n_tiles: int
    m_tail: bool
    n_tail: bool
    k_tail: bool
    a_load: OperandLoad
    b_load: OperandLoad
    a_base: str
    a_delta_c: str
    a_origin: list[str]
    a_checked: list[dict]
    y_base: str
    y_oc_stride: int
    pair_store: bool
    """Adjacent output channels are adjacent in y and K is even: the epilogue stores pairs."""
    store_mode: str
    """The epilogue's 16-byte stores (codegen.families.epilogue): "quad", "pair" or "" (pairs or single
    elements as the MMA leaves them)."""
    store_group: int
    """Channels of a row one group of a quad's 16-byte stores covers (``epilogue.group_channels``)."""


class TensorCoreGemm(Family):
    name = "implicit_gemm"
    template = "implicit_gemm_mma.cu.j2"
    tiles_type = MmaTiles
    summary = ("implicit-GEMM convolution on tensor cores (sm_80+, mma.sync): float16, bfloat16, and float32 "
               "with math tf32 or 3xtf32; FP32 accumulation, cp.async pipeline; wgmma=True: Hopper's warpgroup MMA "
               "(sm_90, channels-last float16, bfloat16, tf32 and 3xtf32)")

    def check_precision(self, spec: ConvSpec) -> None:
        """Only tensor-core specs: float32 with math fma runs on the FMA kernel."""
        if not uses_tensor_cores(spec.dtype, spec.math):
            raise SpecError("math", spec.math.value, "runs on the FMA pipe (implicit_gemm's FP32 kernel); the "
                            "tensor-core kernel takes float16, bfloat16, or float32 with math tf32 or 3xtf32")

    def default_tiles(self, spec: ConvSpec, *, device: Device | str | None = None) -> MmaTiles:
        """The portable mma.sync kernel's tiles (``heuristic_tiles``)."""
        return heuristic_tiles(spec, device)

    def heuristic_tiles(self, spec: ConvSpec, device: Device | str | None = None) -> MmaTiles:
        """The WGMMA kernel where ``device`` is sm_90 and the spec one it covers and prefers
        (``wgmma_gemm.preferred``), else mma.sync's."""
        device = as_device(device)
        if wgmma_gemm.runs_on(device) and wgmma_gemm.covers(spec) and wgmma_gemm.preferred(spec):
            return MmaTiles(**wgmma_gemm.heuristic_fields(spec, device))
        return heuristic_tiles(spec, device)

    def complete_tiles(self, spec: ConvSpec, requested: dict, device: Device | str | None = None) -> MmaTiles:
        """The tiles a user asked for, the rest from the heuristic (the WGMMA kernel's where wgmma is
        asked for: the spec and target are checked first); a CTA tile asked for without its warp tile
        keeps the heuristic's warp tile where it fits, else takes the whole CTA tile; with wgmma,
        ``wgmma_gemm.complete_fields``."""
        if requested.get("wgmma") is True:
            wgmma_gemm.check_spec(spec, as_device(device))
            return MmaTiles.from_dict(wgmma_gemm.complete_fields(spec, requested, device))
        base = heuristic_tiles(spec, device).to_dict()
        for block, warp in (("block_m", "warp_m"), ("block_n", "warp_n")):
            if block in requested and warp not in requested and isinstance(requested[block], int):
                base[warp] = min(base[warp], requested[block])
        return MmaTiles.from_dict({**base, **requested})

    def tiles_within(self, spec: ConvSpec, limit: int, device: Device | str | None = None) -> MmaTiles:
        """The heuristic's tiles with split-K's workspace (the WGMMA kernel's partial tiles) held
        to ``limit`` bytes: the most ranges that fit, or none; mma.sync needs no workspace, and runs
        3xTF32 where the WGMMA kernel's split filter does not fit."""
        device = as_device(device)
        if (wgmma_gemm.runs_on(device) and wgmma_gemm.covers(spec) and wgmma_gemm.preferred(spec)
                and wgmma_gemm.split_filter_bytes(spec) <= limit):
            return MmaTiles(**wgmma_gemm.split_within(spec, wgmma_gemm.heuristic_fields(spec, device), limit, device))
        return heuristic_tiles(spec, device)

    def tuning_space(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """``tuning_space`` for this machine's GPU (else the H100), and on sm_90 the WGMMA kernel's
        tiles where it covers the spec, those that split K only where their partial tiles fit
        ``workspace_limit``."""
        device = as_device(present())
        space = tuning_space(spec, device)
        if wgmma_gemm.runs_on(device) and wgmma_gemm.covers(spec):
            space += [fields for fields in wgmma_gemm.tuning_fields(spec, device)
                      if workspace_limit is None or wgmma_gemm.workspace_bytes(spec, fields, device) <= workspace_limit]
        return space

    def tuning_seeds(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        return tuning_seeds(spec, present())

    def plan(self, spec: ConvSpec, tiles: MmaTiles, device: Device | str | None = None) -> KernelPlan:
        self.check_precision(spec)
        if tiles.wgmma:
            return wgmma_gemm.plan(self, spec, tiles, device)
        check_tiles(spec, tiles, as_device(device))
        alg = self.algebra(spec)
        gemm_m, gemm_n, gemm_k = gemm_sizes(alg)
        terms = gemm_terms(alg, "image")
        m_tiles, n_tiles = -(-gemm_m // tiles.block_m), -(-gemm_n // tiles.block_n)
        name = kernel_name(self.name, VARIANT, spec, tiles)
        launch = Launch(name, (m_tiles * n_tiles, 1, 1), (tiles.threads, 1, 1), shared_bytes(spec, tiles))
        loads = {"a_load": a_load(spec, tiles), "b_load": b_load(spec, tiles)}
        pitch = shared_pitch(spec, tiles)
        itemsize = spec.dtype.itemsize
        pair_store = terms["y_oc_stride"] == 1 and gemm_n % 2 == 0
        store_mode = epilogue.store_mode(gemm_n, stores_float=spec.dtype is DType.float32, span=tiles.warp_n,
                                             channels_last=terms["y_oc_stride"] == 1)
        context = MmaContext(
            **index.template_context(alg, max(launch.threads, m_tiles * tiles.block_m), column_matrix=False),
            **convolution_selftest_context(alg),
            kernel=name, variant=VARIANT, mma=mma_kind(spec), element=spec.dtype, element_bytes=itemsize,
            BM=tiles.block_m, BN=tiles.block_n, BK=tiles.block_k, WM=tiles.warp_m, WN=tiles.warp_n,
            warps_m=tiles.warps_m, threads=tiles.threads, stages=tiles.stages, k_step=mma_k(spec),
            atoms_m=tiles.warp_m // 16, atoms_n=tiles.warp_n // 8, a_pitch=pitch, b_pitch=pitch,
            a_stage_bytes=tiles.block_m * pitch * itemsize, b_stage_bytes=tiles.block_n * pitch * itemsize,
            shared_bytes=launch.shared_bytes, GEMM_M=gemm_m, GEMM_N=gemm_n, GEMM_K=gemm_k,
            k_tiles=-(-gemm_k // tiles.block_k), n_tiles=n_tiles, m_tail=gemm_m % tiles.block_m != 0,
            n_tail=gemm_n % tiles.block_n != 0, k_tail=gemm_k % tiles.block_k != 0, **loads,
            **{key: terms[key] for key in ("a_base", "a_delta_c", "a_origin", "a_checked", "y_base", "y_oc_stride")},
            pair_store=pair_store, store_mode=store_mode, store_group=epilogue.group_channels(store_mode),
        )
        buffers = (Buffer("x", alg.image_shape, "in", loads["a_load"].copy_bytes, spec.dtype),
                   Buffer("w", alg.filter_shape, "in", loads["b_load"].copy_bytes, spec.dtype),
                   Buffer("y", alg.output_shape, "out",
                          epilogue.STORE_BYTES if store_mode else itemsize * (2 if pair_store else 1), spec.dtype))
        return KernelPlan(self.name, VARIANT, spec, tiles, buffers, (launch,), context, min_arch=80, tensor_cores=True,
                          min_arch_reason="mma.sync on TF32 and bfloat16, ldmatrix and cp.async; float32 with "
                          "math fma runs on older targets", template=self.template)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        """Float64 convolution of the stored inputs (bfloat16 as uint16 bits)."""
        x, w = (precision.from_storage(a, spec.dtype) for a in inputs)
        return convolution_reference(spec, x, w)

    def make_inputs(self, spec: ConvSpec, rng: np.random.Generator) -> list[np.ndarray]:
        """Uniform inputs in [-1, 1) as the kernel stores them (bfloat16 as uint16 bits)."""
        alg = self.algebra(spec)
        return [precision.to_storage(rng.uniform(-1.0, 1.0, size=shape), spec.dtype)
                for shape in (alg.image_shape, alg.filter_shape)]


FAMILY = TensorCoreGemm()
