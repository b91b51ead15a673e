"""Direct convolution (seed 002), generalised from the single-channel 2D filter to N, C, K, 2D/3D,
every layout, stride, padding and dilation.  ``y = conv(x, w)``: x in the spec's layout (with its
channel pitch), w K x C x (T x) R x S channels-first or K x (T x) R x S x C channels-last, y in the
spec's layout with K channels.  Six variants, chosen by the ``variant`` tile:

- ``basic``: one thread per output element, input and filter from global memory, ghost cells by
  bounds checks.
- ``constant``: the same with the filter in a ``__constant__`` array sized for the spec (refused
  when it passes the 64 KB bank); the launcher uploads it before each launch.  Threads run
  output-channel-major so that a warp reads one filter element at a time (a broadcast).
- ``tiled_halo``: blocks sized to the *input* tile (output tile plus halo) on the last two axes;
  every thread loads one input into shared memory, the edge threads then stay idle.
- ``tiled_cache``: blocks sized to the *output* tile; only the tile's own inputs go to shared
  memory, halo cells are read from global memory and left to L1/L2.
- ``tiled_register`` (beyond the seed), the layout of hand-written stencil kernels: the block
  copies its input tile to shared memory with ``cp.async`` (16-byte copies from an aligned
  column when W is contiguous and the tile allows); each thread then computes a
  ``rows_per_thread`` x ``per_thread`` block of outputs, walking its input rows once: a row's
  window goes to registers (float4 shared reads when the W stride is 1) and feeds every
  (output row, filter row) pair that uses it, so one shared-memory word feeds up to
  rows_per_thread * per_thread FMAs.  The filter comes from global memory with block-uniform
  addresses or, with ``filter_memory=constant``, from a ``__constant__`` copy.  A block walks
  ``tiles_per_block`` output tiles down H and, for each, the input channels (and depth taps),
  one slice per step with ``stages`` slices in flight, as in a GEMM main loop.
- ``tiled_tma`` (sm_90+, beyond the seed): the same register tile in warp-specialised
  persistent blocks.  One producer thread copies each input slice's box with one TMA
  instruction (the tensor memory accelerator writes zeros for ghost cells) into a ring of
  ``stages`` shared buffers, signalling an mbarrier; 8 consumer warps wait on it, compute and
  release the buffer on a second mbarrier, so they issue no copies and pass no block-wide
  barrier.  Channels-first layouts, stride 1 along H and W, W a multiple of 4.

Tile sizes, filter size, stride, padding and dilation are compile-time constants of the kernel.

float16 and bfloat16 (``Direct.dtypes``) run in every variant but tiled_tma: inputs and filter are
widened to FP32 as they are read, the sums accumulate in FP32 and each output is rounded once.
tiled_register loads its input rows through registers, 16 bytes (8 elements) at a time where W
allows, widening them into its FP32 shared tiles (cp.async copies 4 bytes at least and cannot
widen); its 4-output stores are 8 bytes.  tiled_tma's boxes are FP32 tensor-map copies.
"""
from __future__ import annotations

import dataclasses
import enum
import itertools
import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from codegen import index, precision
from codegen.device import Device, as_device
from codegen.families.base import (Buffer, ConvolutionContext, Family, KernelPlan, Launch, TensorMap,
                                   convolution_selftest_context, grid_for, kernel_name)
from codegen.reference import convolution_reference
from codegen.spec import ConvSpec, DType, SpecError
from codegen.terms.direct import tile_terms
from codegen.tiles import STATIC_SHARED_LIMIT, TileParam, Tiles, check_block, check_shared


class DirectVariant(str, enum.Enum):
    """The ``variant`` tile (kept a string there, as the CLI and the tuning database spell it)."""

    BASIC = "basic"
    CONSTANT = "constant"
    TILED_HALO = "tiled_halo"
    TILED_CACHE = "tiled_cache"
    TILED_REGISTER = "tiled_register"
    TILED_TMA = "tiled_tma"


class FilterMemory(str, enum.Enum):
    """The ``filter_memory`` tile: where tiled_register and tiled_tma read the filter."""

    GLOBAL = "global"
    CONSTANT = "constant"


CONSTANT_BANK_BYTES = 64 * 1024
VARIANTS = tuple(v.value for v in DirectVariant)
TMA_BOX_LIMIT = 256
"""Elements per dimension of one TMA box."""
TMA_BARRIER_BYTES = 128
"""tiled_tma keeps its 2 x 8 mbarriers at the head of dynamic shared memory (so the launch's opt-in
above 48 KB counts every byte), the boxes 128-byte aligned after them."""


@dataclass(frozen=True)
class DirectTiles(Tiles):
    variant: str = DirectVariant.TILED_HALO.value
    threads: int = 256
    tile_h: int = 16
    tile_w: int = 16
    per_thread: int = 8
    rows_per_thread: int = 1
    filter_memory: str = FilterMemory.GLOBAL.value
    stages: int = 1
    tiles_per_block: int = 1
    min_blocks: int = 0
    resident_blocks: int = 1

    PARAMS: ClassVar = (
        TileParam("variant", "which direct kernel", choices=VARIANTS),
        TileParam("threads", "threads per block (basic, constant)", minimum=32, maximum=1024, multiple_of=32),
        TileParam("tile_h", "output tile rows (tiled variants; the H axis)", minimum=1, maximum=64),
        TileParam("tile_w", "output tile columns (tiled variants; the W axis)", minimum=1, maximum=256),
        TileParam("per_thread", "tiled_register: consecutive outputs per thread along W (tile_w must be a "
                  "multiple; tiled_tma takes 4)", choices=(1, 2, 4, 8)),
        TileParam("rows_per_thread", "tiled_register, tiled_tma: consecutive outputs per thread along H (tile_h "
                  "must be a multiple; for tiled_tma tile_h / rows_per_thread is its consumer warps)",
                  minimum=1, maximum=16),
        TileParam("filter_memory", "tiled_register, tiled_tma: where the filter is read from (constant: a "
                  "__constant__ copy, at most 64 KB)", choices=tuple(m.value for m in FilterMemory)),
        TileParam("stages", "tiled_register: shared-memory input tiles in flight (2-3: the next slice is copied "
                  "while the current one is computed); tiled_tma: buffers in the producer/consumer ring (2-8)",
                  minimum=1, maximum=8),
        TileParam("tiles_per_block", "tiled_register: consecutive output tiles along H that one block computes "
                  "(so its pipeline runs across tiles, not only across channels)", minimum=1, maximum=64),
        TileParam("min_blocks", "tiled_register: blocks per SM promised to ptxas by __launch_bounds__, which caps "
                  "registers at 65536 / (threads * min_blocks) (0: ptxas chooses)", minimum=0, maximum=16),
        TileParam("resident_blocks", "tiled_tma: persistent blocks per SM (the grid is the target's SMs times this; each "
                  "block walks the tiles)", minimum=1, maximum=8),
    )


def _filter_bytes(alg: index.IndexAlgebra) -> int:
    """What a ``__constant__`` copy of the filter takes (the bank holds CONSTANT_BANK_BYTES)."""
    return math.prod(alg.filter_shape) * alg.spec.dtype.itemsize


def _fit_tile(out: int, tile: int) -> int:
    """No larger than the output itself, so tiny outputs do not launch idle threads."""
    return max(1, min(tile, out))


@dataclass(frozen=True)
class StageCopy:
    """How tiled_register's threads share a stage copy of rows x units copies: ``lanes`` threads
    across a row (thread tid takes units tid % lanes + j * lanes), ``rows_per_round`` rows at once
    (rows tid / lanes + i * rows_per_round).  A thread's column, its bounds test and its offsets
    are then fixed across the rows it copies, where dividing a flat copy index cost a division,
    a remainder and a fresh address per copy."""

    lanes: int
    rows_per_round: int
    unit_rounds: int
    row_rounds: int
    idle_threads: bool
    """Threads past the last whole round of rows copy nothing."""
    unit_tail: bool
    """The last round across a row passes its units, so it is guarded."""
    row_tail: bool
    """The last round down the rows passes them, so it is guarded."""


def copy_split(units: int, rows: int, threads: int) -> StageCopy:
    lanes = min(units, threads)
    rows_per_round = threads // lanes
    return StageCopy(lanes=lanes, rows_per_round=rows_per_round, unit_rounds=-(-units // lanes),
                     row_rounds=-(-rows // rows_per_round), idle_threads=threads % lanes != 0,
                     unit_tail=units % lanes != 0, row_tail=rows % rows_per_round != 0)


@dataclass(frozen=True, kw_only=True)
class DirectContext(ConvolutionContext):
    """The fields past ``constant_filter`` belong to some variants only (None in the others)."""

    variant: DirectVariant
    kernel: str
    block_threads: int
    dtype: DType
    constant_filter: bool
    """The filter is read from a ``__constant__`` copy (variant constant, or filter_memory constant)."""
    filter_symbol: str | None = None
    """That copy's symbol, which the launcher uploads."""
    vector_load: bool = False
    """16-byte copies of the input rows."""
    vector_store: bool = False
    """Stores of 4 outputs at once (a float4; 8 bytes in 16-bit)."""
    # The tiled variants: the tile terms (``tile_terms``) and the block's coordinates.
    axes: list[dict[str, Any]] | None = None
    """Per tiled axis (H, then W), its tile terms."""
    plane_taps: int | None = None
    plane_coords: list[str] | None = None
    halo_bounds: str | None = None
    depth_bounds: str | None = None
    block_names: list[str] | None = None
    block_coords: list[str] | None = None
    # tiled_register and tiled_tma (``Direct._register_geometry``):
    row_units: int | None = None
    """Copies per stage row (16 bytes each with ``vector_load``: 4 floats, 8 16-bit elements)."""
    row_pitch: int | None = None
    """Floats per stage row in shared memory."""
    vector_window: bool | None = None
    window_offset: int | None = None
    window_start_shift: int | None = None
    window_loads: int | None = None
    stage_floats: int | None = None
    slices: int | None = None
    """Pipeline steps per output tile: channels (times depth taps)."""
    per_thread: int | None = None
    rows_per_thread: int | None = None
    stages: int | None = None
    # tiled_register:
    tiles_per_block: int | None = None
    min_blocks: int | None = None
    copy: StageCopy | None = None
    # tiled_tma:
    box: tuple[int, int] | None = None
    """The TMA box: (row_pitch, halo rows)."""
    resident_blocks: int | None = None
    consumer_threads: int | None = None
    consumer_warps: int | None = None
    threads_across: int | None = None
    tensor_rank: int | None = None
    barrier_floats: int | None = None
    tiles_total: int | None = None
    """Output tiles the persistent blocks walk."""


class Direct(Family):
    name = "direct"
    template = "direct.cu.j2"
    tiles_type = DirectTiles
    summary = ("direct convolution: basic, constant-memory filter, shared-memory halo, halo from cache, register "
               "tiles fed by cp.async or (sm_90) TMA")
    dtypes = tuple(DType)

    def default_tiles(self, spec: ConvSpec, *, device: Device | str | None = None) -> DirectTiles:
        """Tiled with the halo in shared memory, the seed's fastest for a single-channel filter, with
        an output tile whose input tile stays within 32 x 32 threads."""
        alg = index.IndexAlgebra(spec)
        sizes = []
        for j in (spec.dims - 2, spec.dims - 1):
            room = (32 - (spec.filter_size[j] - 1) * spec.dilation[j] - 1) // spec.stride[j] + 1
            sizes.append(_fit_tile(alg.out_size[j], max(1, room)))
        halo_fits = all((t - 1) * s + (f - 1) * d + 1 <= 32
                        for t, s, f, d in zip(sizes, spec.stride[-2:], spec.filter_size[-2:], spec.dilation[-2:]))
        variant = DirectVariant.TILED_HALO if halo_fits else DirectVariant.BASIC
        return DirectTiles(variant=variant.value, tile_h=sizes[0], tile_w=sizes[1])

    def register_tiles(self, spec: ConvSpec) -> DirectTiles:
        """tiled_register geometry, from timing the 8192^2 filters and the benchmark layers on an
        H100 (docs/perf-history.md, direct v4 and v5).

        - 8 x 4 outputs per thread (4 along W for float4 copies and stores, 8 along H so each
          input row read from shared memory feeds up to 8 filter rows), 32 threads across and 8
          down: a 64 x 128 output tile; outputs under 64 rows take 4 rows per thread (a 32 x 128
          tile).  (Before the stage copy kept each thread's columns fixed, the 9x9 filter ran 7 %
          faster with 4 rows per thread; with it, 8 rows win on every radius: 9x9 0.254 ms
          against 0.269.)
        - Along an axis with stride s neighbouring outputs share fewer inputs and each output
          widens the input tile by s, so a thread takes 4/s outputs there (1 from stride 4 on).
        - The tile shrinks to the output, then loses rows of threads and then columns until its
          input tile fits in 48 KB (conv1, 11x11 stride 4, blocked 4 x 4, was left 14 threads
          and ran 15x slower than one output per thread).
        - One stage and one tile per block: many small resident blocks hid the copies better
          than a deeper pipeline in fewer blocks (9x9: 0.254 ms against 0.275-0.33 for 2-3
          stages over 2-8 tiles per block), and the pipeline's effect on the layers was mixed
          (-9 % to +7 %), so it is left to the tuner, with ``min_blocks``.
        - The filter stays in global memory: ptxas loads a block-uniform filter once into
          uniform registers, which the FMAs read as the constant bank's would (9x9 with 8 rows
          per thread: 0.254 ms against 0.262-0.283 from the constant bank)."""
        alg = index.IndexAlgebra(spec)
        out_h, out_w = alg.out_size[-2:]
        tall = out_h >= 64
        per = (4 if out_w >= 16 else 1) // min(4, spec.stride[-1]) or 1
        rows = (8 if tall else 4 if out_h >= 16 else 1) // min(4, spec.stride[-2]) or 1
        across = min(32, -(-out_w // per))
        down = max(1, min(256 // across, -(-out_h // rows), 64 // rows))
        while True:
            tiles = DirectTiles(variant=DirectVariant.TILED_REGISTER.value, tile_h=rows * down, tile_w=per * across,
                                per_thread=per, rows_per_thread=rows, filter_memory=FilterMemory.GLOBAL.value, stages=1,
                                tiles_per_block=1)
            if self._register_geometry(spec, tiles)["stage_bytes"] <= STATIC_SHARED_LIMIT:
                return tiles
            if down > 1:
                down //= 2
            elif across > 1:
                across //= 2
            elif rows > 1:
                rows //= 2
            else:
                return tiles

    def tma_tiles(self, spec: ConvSpec) -> DirectTiles:
        """tiled_tma geometry, from the prototype's timing of the 8192^2 filters on an H100
        (docs/perf-history.md, direct v8): 8 consumer warps of 4 x 4 outputs (a 32 x 128 tile; 1 row per
        thread below 32 output rows), 4 buffers, one persistent block per SM (more blocks split
        the same DRAM stream into shorter pipelines: radius 4 0.211 ms at one, 0.238 at two), and
        the filter in constant memory where it fits."""
        alg = index.IndexAlgebra(spec)
        rows = 4 if alg.out_size[-2] >= 32 else 1
        memory = FilterMemory.CONSTANT if _filter_bytes(alg) <= CONSTANT_BANK_BYTES else FilterMemory.GLOBAL
        return DirectTiles(variant=DirectVariant.TILED_TMA.value, tile_h=8 * rows, tile_w=128, per_thread=4,
                           rows_per_thread=rows, filter_memory=memory.value, stages=4, resident_blocks=1)

    def tuning_space(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """Both one-thread-per-output variants at three block sizes, the tiled variants at square
        and wide tiles, the register-blocked one at 4-8 x 4-8 outputs per thread, 1-3 stages, 1-4
        tiles per block, both filter memories, with and without min_blocks=4, and the TMA one at
        1-8 rows per thread, 2-6 buffers and 1-2 blocks per SM (refused by the plan where the spec
        does not suit TMA)."""
        space = [DirectTiles(variant=v.value, threads=t).to_dict()
                 for v in (DirectVariant.BASIC, DirectVariant.CONSTANT) for t in (128, 256, 512)]
        for variant in (DirectVariant.TILED_HALO, DirectVariant.TILED_CACHE):
            space += [DirectTiles(variant=variant.value, tile_h=h, tile_w=w).to_dict()
                      for h, w in ((8, 8), (16, 16), (8, 32))]
        heuristic = self.register_tiles(spec)
        fits = _filter_bytes(index.IndexAlgebra(spec)) <= CONSTANT_BANK_BYTES
        memories = tuple(m.value for m in FilterMemory) if fits else (FilterMemory.GLOBAL.value,)
        for per, rows, down, stages, group, memory, blocks in itertools.product((4, 8), (4, 8), (4, 8), (1, 2, 3),
                                                                                (1, 2, 4), memories, (0, 4)):
            space.append(dataclasses.replace(heuristic, tile_h=rows * down, tile_w=32 * per, per_thread=per,
                                             rows_per_thread=rows, stages=stages, tiles_per_block=group,
                                             filter_memory=memory, min_blocks=blocks).to_dict())
        tma = self.tma_tiles(spec)
        for rows, stages, resident in itertools.product((1, 2, 4, 8), (2, 4, 6), (1, 2)):
            space.append(dataclasses.replace(tma, tile_h=8 * rows, rows_per_thread=rows, stages=stages,
                                             resident_blocks=resident).to_dict())
        return space

    def _register_geometry(self, spec: ConvSpec, tiles: DirectTiles) -> dict:
        """Where tiled_register's shared tile, windows and vector accesses fall.

        16-byte global copies need W contiguous (channels-first), W a multiple of the elements in 16
        bytes (4 floats, 8 16-bit elements) and tile_w*s a multiple of it too, so that every tile's
        aligned first column is a multiple of it and each group of that many columns is either
        wholly inside the image or wholly outside it.  float4 reads of the window need the W stride
        1 and per_thread a multiple of 4; stores of 4 outputs need OW a multiple of 4 as well."""
        alg = index.IndexAlgebra(spec)
        per, rows = tiles.per_thread, tiles.rows_per_thread
        for field, size, step, name in (("tiles.tile_w", tiles.tile_w, per, "per_thread"),
                                        ("tiles.tile_h", tiles.tile_h, rows, "rows_per_thread")):
            if size % step:
                raise SpecError(field, size, f"must be a multiple of tiles.{name} ({step})")
        stride_w = spec.stride[-1]
        contiguous_w = not spec.layout.channels_last
        unit = 16 // spec.dtype.itemsize
        vector_load = contiguous_w and spec.input_size[-1] % unit == 0 and tiles.tile_w * stride_w % unit == 0
        terms = tile_terms(alg, (tiles.tile_h, tiles.tile_w), (rows, per), unit if vector_load else 1, windows=True)
        rows_axis, cols_axis = terms["axes"]
        lead = cols_axis["lead"]
        width = lead + cols_axis["halo_extent"]
        # Rows hold whole float4s for the window reads, and whole 16-byte copies' floats.
        pitch_multiple = unit if vector_load else 4
        pitch = -(-width // pitch_multiple) * pitch_multiple
        vector_window = stride_w == 1 and per % 4 == 0
        window_floats = (lead if vector_window else 0) + cols_axis["window_extent"]
        return {
            "terms": terms,
            "vector_load": vector_load,
            "row_units": -(-width // unit) if vector_load else cols_axis["halo_extent"],
            "row_pitch": pitch,
            "vector_window": vector_window,
            "window_offset": lead if vector_window else 0,
            "window_start_shift": 0 if vector_window else lead,
            "window_loads": -(-window_floats // 4),
            "vector_store": contiguous_w and vector_window and alg.out_size[-1] % 4 == 0,
            "stage_floats": rows_axis["halo_extent"] * pitch,
            "stage_bytes": rows_axis["halo_extent"] * pitch * 4,
            "slices": spec.c * (spec.filter_size[0] if spec.dims == 3 else 1),
        }

    def _tma_geometry(self, spec: ConvSpec, tiles: DirectTiles) -> dict:
        """tiled_tma's refusals, then tiled_register's geometry with the TMA box: ``row_pitch``
        columns (128 outputs plus the filter's reach, from the aligned column before the halo)
        by the halo's rows, each buffer starting 128-byte aligned."""
        variant = ("tiles.variant", "tiled_tma")
        if spec.dtype is not DType.float32:
            raise SpecError(*variant, f"copies float32 TMA boxes into the shared tiles, so it runs float32 only "
                            f"(not {spec.dtype.value}); tiled_register runs {spec.dtype.value}, widening its rows "
                            "to FP32 as it loads them")
        if spec.layout.channels_last:
            raise SpecError(*variant, "copies W-contiguous rows as TMA boxes, so it needs a channels-first layout "
                            f"(NCHW, NCDHW), not {spec.layout.value}; tiled_register takes channels-last")
        if tuple(spec.stride[-2:]) != (1, 1):
            raise SpecError(*variant, f"needs stride 1 along H and W (the spec has {tuple(spec.stride[-2:])}); "
                            "tiled_register takes other strides")
        if spec.input_size[-1] % 4:
            raise SpecError(*variant, f"needs W a multiple of 4, so that TMA rows start on 16-byte boundaries "
                            f"(W = {spec.input_size[-1]}); tiled_register takes any W")
        if (tiles.tile_w, tiles.per_thread) != (128, 4):
            raise SpecError("tiles.tile_w/per_thread", (tiles.tile_w, tiles.per_thread),
                            "tiled_tma takes 32 threads of 4 outputs across W: tile_w 128, per_thread 4")
        geometry = self._register_geometry(spec, tiles)
        warps = tiles.tile_h // tiles.rows_per_thread
        if warps > 16:
            raise SpecError("tiles.tile_h", tiles.tile_h, f"tile_h / rows_per_thread is the number of consumer warps; "
                            f"at most 16 (here {warps})")
        rows_axis, _ = geometry["terms"]["axes"]
        box = (geometry["row_pitch"], rows_axis["halo_extent"])
        if box[0] > TMA_BOX_LIMIT:
            raise SpecError("filter_size", spec.filter_size, f"a tile's input row spans {box[0]} columns (128 outputs "
                            f"plus the filter's reach); one TMA box holds at most {TMA_BOX_LIMIT}")
        if box[1] > TMA_BOX_LIMIT:
            raise SpecError("tiles.tile_h", tiles.tile_h, f"the tile's input spans {box[1]} rows; one TMA box holds "
                            f"at most {TMA_BOX_LIMIT}")
        stage_floats = -(-box[0] * box[1] // 32) * 32
        return {**geometry, "box": box, "stage_floats": stage_floats, "stage_bytes": stage_floats * 4}

    @staticmethod
    def _input_map(alg: index.IndexAlgebra, box: tuple[int, int]) -> TensorMap:
        """The channels-first image as N x C x (D x) H x W, innermost first, read in boxes of one
        (depth,) channel and image."""
        shape = alg.image_shape[::-1]
        strides, step = [], 4
        for size in shape[:-1]:
            step *= size
            strides.append(step)
        return TensorMap("x", tuple(shape), tuple(strides), (*box, *(1,) * (len(shape) - 2)))

    def complete_tiles(self, spec: ConvSpec, requested: dict, device: Device | str | None = None) -> DirectTiles:
        """Unset tiles come from the heuristic of the requested variant."""
        base = {DirectVariant.TILED_REGISTER: self.register_tiles, DirectVariant.TILED_TMA: self.tma_tiles}.get(
            requested.get("variant"), self.default_tiles)(spec)
        return DirectTiles.from_dict({**base.to_dict(), **requested})

    def plan(self, spec: ConvSpec, tiles: DirectTiles, device: Device | str | None = None) -> KernelPlan:
        alg = self.algebra(spec)
        variant = DirectVariant(tiles.variant)
        memory = FilterMemory(tiles.filter_memory)
        filter_bytes = _filter_bytes(alg)
        variant_fields: dict = {}
        constants: tuple[tuple[str, str], ...] = ()
        if memory is FilterMemory.CONSTANT and variant not in (DirectVariant.TILED_REGISTER, DirectVariant.TILED_TMA):
            raise SpecError("tiles.filter_memory", "constant", "applies to tiled_tma and tiled_register only; "
                            "variant constant always reads a __constant__ filter")
        if tiles.min_blocks and variant is not DirectVariant.TILED_REGISTER:
            raise SpecError("tiles.min_blocks", tiles.min_blocks, "applies to variant tiled_register only (leave it 0)")
        if tiles.stages > 3 and variant is DirectVariant.TILED_REGISTER:
            raise SpecError("tiles.stages", tiles.stages, "must be in [1, 3] for tiled_register (more buffers only "
                            "lower its resident blocks); tiled_tma takes up to 8")
        if tiles.resident_blocks != 1 and variant is not DirectVariant.TILED_TMA:
            raise SpecError("tiles.resident_blocks", tiles.resident_blocks, "applies to variant tiled_tma only (leave it 1)")
        constant_filter = variant is DirectVariant.CONSTANT or memory is FilterMemory.CONSTANT
        dynamic_shared = 0
        if constant_filter and filter_bytes > CONSTANT_BANK_BYTES:
            field, value = (("tiles.variant", "constant") if variant is DirectVariant.CONSTANT
                            else ("tiles.filter_memory", "constant"))
            raise SpecError(field, value,
                            f"the filter takes {filter_bytes} bytes (K*C*taps*{spec.dtype.itemsize}) but the constant bank holds "
                            f"{CONSTANT_BANK_BYTES}; use another variant or fewer channels")
        name = kernel_name(self.name, variant.value, spec, tiles)
        if constant_filter:
            variant_fields["filter_symbol"] = f"{name}_filter"
            constants = ((variant_fields["filter_symbol"], "w"),)
        if variant in (DirectVariant.BASIC, DirectVariant.CONSTANT):
            total = spec.n * spec.k * math.prod(alg.out_size)
            block = (tiles.threads, 1, 1)
            grid = (grid_for(total, tiles.threads), 1, 1)
        else:
            tile = (tiles.tile_h, tiles.tile_w)
            if variant is DirectVariant.TILED_REGISTER:
                geometry = self._register_geometry(spec, tiles)
                terms, stage_bytes = geometry.pop("terms"), geometry.pop("stage_bytes")
                block = (tiles.tile_w // tiles.per_thread, tiles.tile_h // tiles.rows_per_thread, 1)
                dynamic_shared = stage_bytes * tiles.stages
                shared_check = (dynamic_shared, "tiles.tile_h/tile_w/stages", (*tile, tiles.stages), True)
                variant_fields.update(geometry, per_thread=tiles.per_thread, rows_per_thread=tiles.rows_per_thread,
                                      stages=tiles.stages, tiles_per_block=tiles.tiles_per_block,
                                      min_blocks=tiles.min_blocks,
                                      copy=copy_split(geometry["row_units"], terms["axes"][0]["halo_extent"],
                                                      block[0] * block[1]))
                first, per_block = "group", tiles.tiles_per_block
            elif variant is DirectVariant.TILED_TMA:
                geometry = self._tma_geometry(spec, tiles)
                terms, stage_bytes = geometry.pop("terms"), geometry.pop("stage_bytes")
                consumers = tiles.tile_w // tiles.per_thread * (tiles.tile_h // tiles.rows_per_thread)
                block = (consumers + 32, 1, 1)
                dynamic_shared = TMA_BARRIER_BYTES + stage_bytes * tiles.stages
                shared_check = (dynamic_shared, "tiles.tile_h/stages", (tiles.tile_h, tiles.stages), True)
                variant_fields.update(geometry, per_thread=tiles.per_thread, rows_per_thread=tiles.rows_per_thread,
                                      stages=tiles.stages, resident_blocks=tiles.resident_blocks,
                                      consumer_threads=consumers, consumer_warps=consumers // 32,
                                      threads_across=tiles.tile_w // tiles.per_thread, tensor_rank=spec.dims + 2,
                                      barrier_floats=TMA_BARRIER_BYTES // 4)
                first, per_block = "tile", 1
            else:
                terms = tile_terms(alg, tile)
                if variant is DirectVariant.TILED_HALO:
                    block = (terms["axes"][1]["halo_extent"], terms["axes"][0]["halo_extent"], 1)
                else:
                    block = (tiles.tile_w, tiles.tile_h, 1)
                shared_check = (block[0] * block[1] * 4, "tiles.tile_h/tile_w", tile, False)
                first, per_block = "tile", 1
            check_block(block[0] * block[1], "tiles.tile_h/tile_w", tile)
            check_shared(*shared_check)
            rows_axis, cols_axis = terms["axes"]
            outer = (spec.n, spec.k, *alg.out_size[: spec.dims - 2], -(-rows_axis["tiles"] // per_block), cols_axis["tiles"])
            grid = (math.prod(outer), 1, 1)
            if variant is DirectVariant.TILED_TMA:
                variant_fields["tiles_total"] = grid[0]
                grid = (min(grid[0], as_device(device).sm_count * tiles.resident_blocks), 1, 1)
            names = (["n", "oc"] + [f"o{j}" for j in range(spec.dims - 2)]
                     + [f"{first}{rows_axis['axis']}", f"tile{cols_axis['axis']}"])
            variant_fields.update(terms, block_names=names,
                                  block_coords=[index.to_c(e) for e in index.decompose(alg.t, outer)])
        check_block(block[0] * block[1], "tiles.threads", tiles.threads)
        if variant is DirectVariant.TILED_TMA:
            launch = Launch(name, grid, block, dynamic_shared, args=("y",) if constant_filter else ("w", "y"),
                            tensor_maps=(self._input_map(alg, variant_fields["box"]),), persistent=True)
        else:
            launch = Launch(name, grid, block, dynamic_shared, args=("x", "y") if constant_filter else None)
        context = DirectContext(**index.template_context(alg, launch.threads, column_matrix=False),
                                **convolution_selftest_context(alg), **variant_fields, variant=variant, kernel=name,
                                block_threads=block[0] * block[1], dtype=spec.dtype, constant_filter=constant_filter)
        itemsize = spec.dtype.itemsize
        buffers = (Buffer("x", alg.image_shape, "in", 16 if context.vector_load else itemsize, spec.dtype),
                   Buffer("w", alg.filter_shape, "in", itemsize, spec.dtype),
                   Buffer("y", alg.output_shape, "out", 4 * itemsize if context.vector_store else itemsize, spec.dtype))
        # 16-bit tiled_register loads through registers, without cp.async.
        asynchronous = variant is DirectVariant.TILED_REGISTER and spec.dtype is DType.float32
        return KernelPlan(self.name, variant.value, spec, tiles, buffers, (launch,), context, constants=constants,
                          min_arch=90 if variant is DirectVariant.TILED_TMA else 80 if asynchronous else 0,
                          min_arch_reason="TMA and mbarriers" if variant is DirectVariant.TILED_TMA else (
                              "cp.async; variants basic, constant, tiled_halo and tiled_cache, and tiled_register "
                              "in float16 and bfloat16, run on older targets") if asynchronous else "")

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        """Float64 convolution of the stored inputs (bfloat16 as uint16 bits)."""
        x, w = (precision.from_storage(a, spec.dtype) for a in inputs)
        return convolution_reference(spec, x, w)


FAMILY = Direct()
