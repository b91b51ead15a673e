"""Implicit-GEMM convolution (seed 003, CUTLASS's formulation), 2D and 3D, every layout.

The convolution is run as the GEMM y = A * B without ever storing A: the CTA's loader forms
A(m, row), the input pixel that output pixel m reads for column-matrix row (channel, tap), from
the image on the fly, with zeros for padding.  Address arithmetic is split as CUTLASS's
iterators do: a per-pixel base (computed once per thread) plus a per-row delta, either divided
out in the kernel or read from a table precomputed by the generator (``precomp``, cuDNN's
IMPLICIT_PRECOMP_GEMM).  Tiles, pipeline and micro-kernel: ``codegen/families/gemm.py``.
No workspace: the extra device memory is the row table (16 bytes per row at most).  The TMA
kernel below needs one, for the transposed filter.

With ``tma`` (channels-last, sm_90) the kernel is Hopper's instead (docs/perf-history.md, GEMM v11):
persistent blocks whose producer thread loads each k-slice, one filter tap by 32 channels, with
two TMA copies (A through the im2col mode, which walks the tile's pixels across rows and images
and reads zeros for padding; B as a box of the filter, transposed per call into a taps x C x K
workspace so that B fragments run along output channels), on a ring of mbarrier stages that
consumer warps drain with only shared loads and FMAs.  Micro-tiles of 8x8 or 16x8 (v15: the
producer becomes a warpgroup that hands its registers to the consumers, sm_90a), and where the
last round of tiles is ragged a stream-K tail (``takes_stream_k``: 8x8 kernels, and 16x8 ones on
long grids, there in a launch of its own).  On channels-first data (v17) the producer warps
gather A themselves with 4-byte cp.async copies (``index.gather_terms``), B as before; only on
request, since its workspace would pass cuDNN's extra memory there.
"""
from __future__ import annotations

import math

import numpy as np

from codegen import index
from codegen.families import gemm
from codegen.families.base import (Buffer, Family, KernelPlan, Launch, TensorMap, convolution_selftest_context,
                                   grid_for, kernel_name)
from codegen.families.direct import convolution_reference
from codegen.spec import ConvSpec, SpecError
from codegen.device import Device, as_device, present

SLICE_TABLE_LIMIT = 2048
"""Most k-slices whose offsets the gathered TMA kernel takes from a constant table (at most 16 KB
of the 64 KB of constant memory, at 8 bytes an entry); longer filters decode each slice's tap."""

BLOCK_RESERVED = 1024
"""Shared memory the driver reserves for each resident block on top of its own."""
TMA_STAGES = 6
"""Most stages the heuristic gives the TMA kernel (the prototype gained 1-2 % from 4 to 6 on
c3d_conv2)."""
TMA_MIN_TILES_PER_SM = 4
"""Below this many tiles per SM the persistent TMA kernel, which has no split-K, lost to the
cp.async kernel's split-K tiles (conv11 0.96x at 2.2 tiles per SM, conv12 0.78x, unet3d_down
0.62x; conv6 1.03x at 3.0)."""
TMA_MIN_STREAM_K_TILES_PER_SM = 2
"""With stream-K the TMA kernel beat the cp.async kernel down to 2.2 tiles per SM (conv11 45.3
against 36.4 TFLOP/s) but not at 1.5 (conv12 24.7 against 26.5)."""
TMA_MIN_GEMM_K = 512
"""Below this C x taps the heuristic takes the TMA kernel only with its 16-row micro-tiles.  On the
H100 (GEMM v30), of the channels-last layers the older rule gave it: with 8x8 micro-tiles it ran
0.32-1.00x the cp.async kernel on 19 of 22 (pointwise layers of 64-320 channels, small filters;
1.01-1.04x on the other 3), with 16-row ones 1.17-1.78x on the 8 whose channels fill the boxes,
and at 512 and above it won on all 23 (1.06-1.50x)."""
TMA_ONE_ROUND_MIN_GEMM_K = 1024
"""C x taps from which the heuristic also takes the TMA kernel with a stream-K tail and fewer than
``TMA_MIN_STREAM_K_TILES_PER_SM`` tiles per SM, provided they are at least one round of tiles at
full size (block_m not halved): on the H100 (GEMM v33) it ran 1.03-1.27x the cp.async kernel on
all 13 such layers (6 held out), and 0.86-1.10x on the 6 measured below 1024 (faster on 2).  Where
``tma_tiles`` had halved block_m to fill the SMs it lost on all 9 measured (0.45-0.70x)."""
TMA_MIN_GATHER_TILES_PER_SM = 3
"""Fewest tiles per SM at which the gathered (channels-first) TMA kernel beat the cp.async kernel on
the H100 (GEMM v17: conv5 1.07x at 6.1, conv6 1.03x at 3.0; conv11 0.98x at 2.2, unet3d_down
0.39x at 1.9, conv12 0.62x at 1.5), stream-K tail or not: the cp.async kernel's split-K tiles keep
more blocks busy than the persistent kernel's few tiles."""
TRANSPOSE_THREADS = 256
WIDE_BLOCKS_PER_SM = 2
"""Blocks of ``gemm.wide_tiles`` resident per SM: 128 threads at 190-200 registers (ptxas -v)."""
WIDE_MIN_WAVE_FILL = 0.9
"""How full the last wave of wide tiles must be for ``default_tiles`` to take them: on the H100 they
won at 0.93-1.00 (13 of 13 layers) and lost at 0.85-0.87 (conv10 0.95x, two held-out layers 0.89x
and 0.97x); below that, on 28 of 32."""
SHALLOW_CHANNELS = 8
"""Channels-last inputs with at most this many channels take 8-deep slices in ``default_tiles``.
On the H100 (GEMM v34) 8-deep slices ran 1.03-1.23x the 16-deep ones on all 11 such layers
measured (C = 1-8; 7 of them held out, predicted first), and 0.91-1.03x from C = 12 up (0.99x at
12).  Channels-last A is loaded channel-fastest, one k-row per lane, so a thread's per-slice copy
state grows with the slice depth: at C = 4 the 16-deep kernel took 254 registers, the 8-deep one
139.  Channels-first layers with C <= 8 gave no rule (0.93-1.05x)."""


def image_vector_ok(spec: ConvSpec) -> bool:
    """float4 loads of A need four consecutive rows to be four consecutive channels of one pixel."""
    return spec.layout.channels_last and spec.c % 4 == 0 and spec.pitch % 4 == 0


class ImplicitGemm(Family):
    name = "implicit_gemm"
    template = "implicit_gemm.cu.j2"
    tiles_type = gemm.GemmTiles
    summary = ("implicit-GEMM convolution: cp.async pipeline, warp and thread tiles, precomputed offsets; "
               "tma=True: the sm_90 TMA kernel (channels-first: A gathered by its producer warps)")

    def default_tiles(self, spec: ConvSpec, *, device: Device | str | None = None) -> gemm.GemmTiles:
        """``gemm.heuristic``, with two changes measured on the H100 (docs/perf-history.md).  GEMM v33: where
        the heuristic splits K, the 128-thread tiles of 16x8 micro-tiles of ``gemm.wide_tiles``
        instead, unsplit, wherever their grid fills its last wave of ``WIDE_BLOCKS_PER_SM`` blocks
        per SM to ``WIDE_MIN_WAVE_FILL``: 1.04-1.23x on all 13 such channels-first layers (5 of
        them held out) and 1.09-1.16x on all 4 channels-last ones (where ``heuristic_tiles`` turns
        the TMA kernel down).  On the 35 channels-first split layers with emptier last waves they
        were slower on 31 (0.07-0.99x) and faster on 4; on 4 such channels-last ones, 0.78-0.91x.

        8-deep slices on channels-last inputs of at most ``SHALLOW_CHANNELS`` channels (GEMM v34).
        v33 also took them where C x taps % 16 == 8, because the half-empty last slice's bound
        check then guarded every copy; since v34 the partial slice comes first and only the
        prologue checks it, and 16-deep slices ran 0.99-1.09x the 8-deep ones on those 14
        layer-layouts, so that rule went.  SM counts are ``device``'s (the H100 by default)."""
        device = as_device(device)
        alg = self.algebra(spec)
        tiles = gemm.heuristic(spec, gemm.row_table_fits(alg, index.gemm_terms(alg, "image")), device)
        gemm_m, gemm_n, _ = index.gemm_sizes(self.algebra(spec))
        if tiles.split_k > 1 and gemm_n % 64 == 0:
            wide = gemm.fit_device(gemm.wide_tiles(tiles, gemm_n), device)
            waves = gemm.tile_count(gemm_m, gemm_n, wide.block_m, wide.block_n) / (WIDE_BLOCKS_PER_SM * device.sm_count)
            if waves / math.ceil(waves) >= WIDE_MIN_WAVE_FILL and gemm.shared_bytes(wide) <= device.shared_per_block:
                return wide
        if spec.layout.channels_last and spec.c <= SHALLOW_CHANNELS and tiles.block_k == 16:
            return gemm.GemmTiles(**{**tiles.to_dict(), "block_k": 8})
        return tiles

    def heuristic_tiles(self, spec: ConvSpec, device: Device | str | None = None) -> gemm.GemmTiles:
        """On sm_90 and newer, the TMA kernel where it takes the spec, its output-channel tiles are
        full (K a multiple of 64, or K = 32, where the compiler drops a 64-wide tile's idle half)
        and it has at least ``TMA_MIN_TILES_PER_SM`` tiles per SM, or ``TMA_MIN_STREAM_K_TILES_PER_SM``
        where it shares out its tail (stream-K); the portable cp.async kernel otherwise.  Measured
        on the H100 (docs/perf-history.md, GEMM v14 and v15): 1.09-1.76x the cp.async kernel on the ten
        channels-last layers this takes, 0.62-0.93x on the two it turns away.  Two more conditions
        from 81 channels-last layers (GEMM v30): C x taps at least ``TMA_MIN_GEMM_K`` unless the
        tiles have 16-row micro-tiles, and C padded to the kernel's 32-channel boxes less than 4/3
        of C (each tap's last box is part padding: C = 16 wastes half its FMAs, 0.70-0.71x; C = 80
        a sixth, and the kernel still won, 1.16x).  With a stream-K tail it also takes one round of
        full-size tiles where C x taps reaches ``TMA_ONE_ROUND_MIN_GEMM_K`` (GEMM v33).  Channels-first data
        keeps the cp.async kernel, which needs no workspace: the gathered TMA kernel (``tma=True``)
        ran 1.02-1.14x on the layers where ``gather_pays`` (GEMM v17) but its transposed filter
        (0.1-4.5 MiB) would put the implicit GEMM above cuDNN's extra memory there (0-1 MiB)."""
        device = as_device(device)
        return self._tma_heuristic(spec, device) or self.default_tiles(spec, device=device)

    def _tma_heuristic(self, spec: ConvSpec, device: Device) -> gemm.GemmTiles | None:
        """The TMA kernel's tiles where ``heuristic_tiles``' rules take it on ``device``, else None."""
        if device.capability < 90 or not spec.layout.channels_last or not tma_suits(spec) or not (
                spec.k % 64 == 0 or spec.k == 32):
            return None
        tiles = self.tma_tiles(spec, device=device)
        gemm_k = index.gemm_sizes(self.algebra(spec))[2]
        boxed_c = -(-spec.c // tiles.block_k) * tiles.block_k
        if gemm.pads_by_a_third(boxed_c, spec.c) or (gemm_k < TMA_MIN_GEMM_K and tiles.thread_m != 16):
            return None
        count, blocks = self._tma_grid(spec, tiles, device)
        if not tma_counts_fit(spec, count, blocks):
            return None
        stream_k = takes_stream_k(tiles, count, blocks)
        least = TMA_MIN_STREAM_K_TILES_PER_SM if stream_k else TMA_MIN_TILES_PER_SM
        one_full_round = (stream_k and count >= device.sm_count and gemm_k >= TMA_ONE_ROUND_MIN_GEMM_K
                          and tiles.block_m == tma_full_block_m(tiles.thread_m, tiles.block_n))
        return tiles if count >= least * device.sm_count or one_full_round else None

    def tiles_within(self, spec: ConvSpec, limit: int, device: Device | str | None = None) -> gemm.GemmTiles:
        """The portable cp.async kernel, which needs no workspace (the TMA kernel's is its
        transposed filter)."""
        return self.default_tiles(spec, device=device)

    def tma_tiles(self, spec: ConvSpec, thread_m: int | None = None,
                  device: Device | str | None = None) -> gemm.GemmTiles:
        """The TMA kernel's tiles (docs/perf-history.md, GEMM v11 and v15), 128 output channels wide above
        64 channels, else 64.  16-row micro-tiles (8 consumer warps of 64x64: 256x128 or 512x64
        tiles) where K is a multiple of 64 and they give at least ``TMA_MIN_TILES_PER_SM`` tiles
        per SM: on the H100 they ran 1-4 % faster than 8x8 with the same register split (fewer
        shared loads per FMA, a rolled slice loop that fits the instruction cache), but 6 % slower
        at K = 32, where the unrolled 8x8 loop drops the idle half's FMAs.  Otherwise 8x8
        micro-tiles: 128x128, or 256x64, halved along M while the grid has fewer tiles than SMs.
        As many stages as shared memory holds, up to ``TMA_STAGES``.  ``thread_m`` asks for one
        micro-tile; SM counts and shared memory are ``device``'s (the H100 by default)."""
        device = as_device(device)
        gemm_m, gemm_n, _ = index.gemm_sizes(self.algebra(spec))
        block_n = 128 if gemm_n > 64 else 64
        if thread_m is None:
            wide_m = tma_full_block_m(16, block_n)
            enough = gemm.tile_count(gemm_m, gemm_n, wide_m, block_n) >= TMA_MIN_TILES_PER_SM * device.sm_count
            thread_m = 16 if enough and gemm_n % 64 == 0 else 8
        block_m = tma_full_block_m(thread_m, block_n)
        while thread_m == 8 and block_m > 32 and gemm.tile_count(gemm_m, gemm_n, block_m, block_n) < device.sm_count:
            block_m //= 2
        tiles = gemm.GemmTiles(block_m=block_m, block_n=block_n, warp_m=4 * thread_m, thread_m=thread_m, stages=2,
                               tma=True, **gemm.TMA_FIXED)
        for stages in range(TMA_STAGES, 2, -1):
            candidate = gemm.GemmTiles(**{**tiles.to_dict(), "stages": stages})
            if gemm.tma_shared_bytes(candidate) <= device.shared_per_block:
                return candidate
        return tiles

    def complete_tiles(self, spec: ConvSpec, requested: dict, device: Device | str | None = None) -> gemm.GemmTiles:
        """Unset tiles come from the TMA kernel's heuristic when ``tma`` is asked for, else as
        ``gemm.complete`` fills them."""
        base = self.tma_tiles(spec, device=device) if requested.get("tma") else self.default_tiles(spec, device=device)
        return gemm.GemmTiles.from_dict(gemm.complete(base.to_dict(), requested))

    def tuning_space(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """The GEMM core's space, plus the TMA kernel's tiles (8x8 and 16x8 micro-tiles, block_m
        64-512, block_n 64-256 but no wider than the channels need, 3-6 stages that fit) where the
        spec suits it and its transposed filter fits ``workspace_limit``."""
        return gemm.tuning_space(spec, image_vector_ok(spec), present()) + self._tma_space(spec, workspace_limit)

    def tuning_seeds(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """The GEMM core's seeds, plus the TMA heuristic where the spec suits it and the limit allows."""
        seeds = gemm.tuning_seeds(spec)
        return seeds + ([self.tma_tiles(spec, device=present()).to_dict()] if self._tma_within(spec, workspace_limit)
                        else [])

    def _tma_within(self, spec: ConvSpec, workspace_limit: int | None) -> bool:
        """Whether the TMA kernel takes ``spec`` and its workspace (the transposed filter, whatever
        the tiles) fits ``workspace_limit``."""
        if not tma_suits(spec):
            return False
        shape = index.transposed_filter_terms(self.algebra(spec))["shape"]
        return workspace_limit is None or math.prod(shape) * 4 <= workspace_limit

    def _tma_space(self, spec: ConvSpec, workspace_limit: int | None) -> list[dict]:
        if not self._tma_within(spec, workspace_limit):
            return []
        widest = max(64, -(-spec.k // 64) * 64)
        space = []
        for thread_m in gemm.TMA_THREAD_ROWS:
            base = self.tma_tiles(spec, thread_m, present()).to_dict()
            for block_m in (64, 128, 256, 512):
                for block_n in (b for b in (64, 128, 256) if b <= widest):
                    for stages in (3, 4, 5, 6):
                        tiles = gemm.GemmTiles(**{**base, "block_m": block_m, "block_n": block_n, "stages": stages})
                        try:
                            gemm.check_geometry(tiles)
                        except SpecError:
                            continue
                        space.append(tiles.to_dict())
        return space

    def plan(self, spec: ConvSpec, tiles: gemm.GemmTiles, device: Device | str | None = None) -> KernelPlan:
        if tiles.tma:
            return self._tma_plan(spec, tiles, as_device(device))
        alg = self.algebra(spec)
        terms = index.gemm_terms(alg, "image")
        vector = image_vector_ok(spec)
        context = gemm.context(spec, tiles, terms, vector, a_m_fastest=not spec.layout.channels_last)
        variant = "precomp" if tiles.precomp else "analytic"
        name = kernel_name(self.name, variant, spec, tiles)
        launch = Launch(name, gemm.grid(spec, tiles), (tiles.threads, 1, 1), gemm.shared_bytes(tiles))
        # The column matrix is never formed, so only the image, filter, output and the padded
        # pixel count bound the index type (conv4's 4.8e9-element column matrix kept it 64-bit).
        padded_pixels = launch.grid[0] // context["n_tiles"] * tiles.block_m
        context.update(index.template_context(alg, max(launch.threads, padded_pixels), column_matrix=False))
        context.update(convolution_selftest_context(alg))
        context.update(kernel=name, variant=variant, table_name=f"{name}_rows", tma=False)
        buffers = (Buffer("x", alg.image_shape, "in", 16 if vector and tiles.vector_load else 4),
                   Buffer("w", alg.filter_shape, "in", 16 if context["b_vec"] == 4 else 4),
                   Buffer("y", alg.output_shape, "out"))
        return KernelPlan(self.name, variant, spec, tiles, buffers, (launch,), context, zero_output=context["splits"] > 1,
                          **gemm.async_copy_arch(tiles))

    def _tma_grid(self, spec: ConvSpec, tiles: gemm.GemmTiles, device: Device) -> tuple[int, int]:
        """The TMA kernel's CTA tiles and its persistent blocks: every SM of ``device`` times the
        blocks that fit on one, or fewer when there are fewer tiles."""
        gemm_m, gemm_n, _ = index.gemm_sizes(self.algebra(spec))
        count = gemm.tile_count(gemm_m, gemm_n, tiles.block_m, tiles.block_n)
        return count, min(count, device.sm_count * tma_resident_blocks(tiles, device))

    def _tma_plan(self, spec: ConvSpec, tiles: gemm.GemmTiles, device: Device) -> KernelPlan:
        """The filter transposed into the workspace, with stream-K the shared tiles zeroed, then
        the persistent TMA kernel (``_tma_grid``)."""
        check_tma_spec(spec)
        gemm.check_geometry(tiles)
        alg = self.algebra(spec)
        gemm_m, gemm_n, _ = index.gemm_sizes(alg)
        transposed = index.transposed_filter_terms(alg)
        block_k = gemm.TMA_FIXED["block_k"]
        w_map = TensorMap("wt", transposed["dims"], transposed["byte_strides"], (tiles.block_n, block_k, 1))
        if spec.layout.channels_last:   # A through the im2col map, stored (pixels, K)
            im2col = index.im2col_map_terms(alg)
            box_m = min(tiles.block_m, gemm.TMA_BOX_PIXELS)
            x_map = TensorMap("x", im2col["dims"], im2col["strides"], (block_k, box_m), swizzle=128,
                              corners=(im2col["lower"], im2col["upper"]), element_strides=im2col["element_strides"])
            a_context = dict(gather=False, box_m=box_m, boxes=tiles.block_m // box_m, im2col_rank=spec.dims + 2,
                             origin=im2col["origin"], tap_offsets=im2col["tap_offsets"])
            image = {"tensor_maps": (x_map, w_map), "args": ("y",)}
            vector_store = gemm_n % 4 == 0
        else:                           # A gathered by the producer warps, stored channels-first
            a_context = {"gather": True, **self._gather_context(alg, tiles)}
            image = {"tensor_maps": (w_map,), "args": ("x", "y")}
            vector_store = math.prod(alg.out_size) % 4 == 0
        m_tiles, n_tiles = -(-gemm_m // tiles.block_m), -(-gemm_n // tiles.block_n)
        shared = gemm.tma_shared_bytes(tiles)
        count, blocks = self._tma_grid(spec, tiles, device)
        if not tma_counts_fit(spec, count, blocks):
            raise SpecError("tiles.block_m", tiles.block_m, f"gives the TMA kernel {count} output tiles of "
                            f"{tma_slices(spec)} k-slices, whose steps it counts in 32 bits (at most "
                            f"{index.INT32_MAX}); use larger tiles or tma=False")
        name = kernel_name(self.name, "tma", spec, tiles)
        slices = alg.taps * -(-spec.c // block_k)
        stream_k = takes_stream_k(tiles, count, blocks)
        split = shared_tiles(count, slices, blocks) if stream_k else set()
        rounds = data_parallel_rounds(count, blocks)
        tail_kernel = f"{name}_tail" if stream_k and rounds and tail_in_own_launch(tiles) else None
        launches = (
            Launch(f"{name}_filter", (grid_for(transposed["elements"], TRANSPOSE_THREADS), 1, 1),
                   (TRANSPOSE_THREADS, 1, 1), args=("w", "wt")),
            *((Launch(f"{name}_zero", (blocks - 1, 1, 1), (TRANSPOSE_THREADS, 1, 1), args=("y",), persistent=True),)
              if split else ()),
            *(Launch(kernel, (blocks, 1, 1), (tiles.threads, 1, 1), shared, persistent=True, **image)
              for kernel in (name, tail_kernel) if kernel),
        )
        context = index.template_context(alg, max(launches[-1].threads, m_tiles * tiles.block_m), column_matrix=False)
        context.update(convolution_selftest_context(alg))
        context.update(
            tma=True, kernel=name, transpose_kernel=f"{name}_filter", zero_kernel=f"{name}_zero", variant="tma",
            tail_kernel=tail_kernel,
            slices=slices, grid_blocks=blocks, split_tiles=len(split), stream_k=stream_k,
            dp_rounds=rounds, dp_tiles=rounds * blocks if stream_k else count, dp_steps=rounds * blocks * slices,
            tail_steps=(count - rounds * blocks) * slices,
            BM=tiles.block_m, BN=tiles.block_n, BK=block_k, TM=tiles.thread_m, WM=tiles.warp_m,
            stages=tiles.stages, threads=tiles.threads,
            warps_m=tiles.block_m // tiles.warp_m, warps_n=tiles.block_n // tiles.warp_n,
            register_split=gemm.tma_register_split(tiles),
            consumers=tiles.consumer_warps, resident_blocks=tma_resident_blocks(tiles, device), shared_bytes=shared,
            alignment=gemm.TMA_ALIGNMENT, GEMM_M=gemm_m, GEMM_N=gemm_n, n_tiles=n_tiles,
            tiles_total=count, c_chunks=-(-spec.c // block_k), vector_store=vector_store,
            transpose={key: value for key, value in transposed.items() if key != "exprs"}, **a_context,
        )
        x_alignment = 16 if spec.layout.channels_last else 8 if a_context.get("gather_wide", "never") != "never" else 4
        buffers = (Buffer("x", alg.image_shape, "in", x_alignment),
                   Buffer("w", alg.filter_shape, "in"),
                   Buffer("y", alg.output_shape, "out", 16 if vector_store else 4),
                   Buffer("wt", transposed["shape"], "workspace", 16))
        return KernelPlan(self.name, "tma", spec, tiles, buffers, launches, context, min_arch=90,
                          min_arch_reason="TMA, mbarriers and warp specialisation; tma=False runs on sm_80",
                          arch_specific=context["register_split"] is not None)

    @staticmethod
    def _gather_context(alg: index.IndexAlgebra, tiles: gemm.GemmTiles) -> dict:
        """How the producer warps share a channels-first A tile of block_m pixels x 32 channels:
        thread t copies its pixels (from tile position ``gather_first``, at ``gather_offsets``) of
        channels t / columns + ``row_step`` * v, so that a warp's copies run along consecutive pixels.
        ``c_short`` (C < 32): the rows past C are zeroed once, not copied in every slice (C = 3 had
        29 zero-size copies a pixel, and their predicates spilled the producer's 40 registers).

        A copy is a cp.async plus a 64-bit address, unless copies share an address and differ by
        the instruction's immediate offset.  So where C fills whole slices, a thread's pixels (at
        least two) come in ``gather_groups``, each addressed from its anchor pixel's base:
        - ``shared_row_address``: where pixels are contiguous and no tile crosses an image, one
          address a channel serves all of a thread's pixels (docs/perf-history.md, GEMM v24);
        - else ``gather_pairs`` (``index.gather_terms``' ``pairs_in_rows``): a thread copies pixel
          pairs 2j, 2j + 1, which read elements ``pair_step`` apart; where ``pairs_aligned`` and
          the slice's tap allows (``gather_wide``), a pair is one 8-byte copy (GEMM v25).  Not
          where the shared address serves: a warp's 4-byte copies of pairs write every other
          word, two to a bank, which cost unet3d_l1 4 % on the H100.
        ``slice_table``: each slice's tap offset (doubled, plus its wide flag, where the flag
        varies) as a constant table, where it fits ``SLICE_TABLE_LIMIT``, instead of decoding the
        tap in every slice."""
        block_k = gemm.TMA_FIXED["block_k"]
        threads = 32 * tiles.producer_warps
        gemm_m, _, _ = index.gemm_sizes(alg)
        terms = index.gather_terms(alg)
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
        slices = index.gather_slices(alg, block_k)
        table = len(slices) <= SLICE_TABLE_LIMIT
        wide_taps = {wide for _, wide in slices} if pairs and terms["pairs_aligned"] else {False}
        wide = "always" if wide_taps == {True} else "slice" if len(wide_taps) == 2 and table else "never"
        return {
            **terms,
            "gather_threads": threads, "gather_columns": columns, "gather_pixels": count,
            "gather_row_step": threads // columns, "gather_rows": block_k * columns // threads,
            "gather_first": "2 * column" if pairs else "column", "gather_offsets": offsets,
            "gather_offset": f"u % 2 + u / 2 * {2 * columns}" if pairs else f"u * {columns}",
            "gather_pairs": pairs, "gather_groups": groups, "gather_wide": wide,
            "slice_table": ([2 * offset + flag for offset, flag in slices] if wide == "slice"
                            else [offset for offset, _ in slices]) if table else None,
            "slice_type": "int" if all(abs(2 * offset) < 2**31 - 1 for offset, _ in slices) else "long long",
            "m_tail": gemm_m % tiles.block_m != 0, "c_tail": c_tail, "c_short": c_short,
            "shared_row_address": shared_row_address,
        }

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs
        return convolution_reference(spec, x, w)


def tma_resident_blocks(tiles: gemm.GemmTiles, device: Device) -> int:
    """TMA blocks that fit on one SM of ``device``, by shared memory and by registers (at least one)."""
    return max(1, min(device.shared_per_sm // (gemm.tma_shared_bytes(tiles) + BLOCK_RESERVED),
                      device.registers_per_sm // (tiles.threads * gemm.TMA_REGISTERS)))


def tma_slices(spec: ConvSpec) -> int:
    """The TMA kernel's k-slices per output tile: every tap times C in 32-channel boxes."""
    return math.prod(spec.filter_size) * -(-spec.c // gemm.TMA_FIXED["block_k"])


def tma_counts_fit(spec: ConvSpec, count: int, blocks: int) -> bool:
    """Whether the TMA kernel's 32-bit counters hold its tiles and steps (tiles x slices, the
    stream-K tail's positions) and a tile index advanced by one grid of persistent blocks."""
    return count * tma_slices(spec) <= index.INT32_MAX and count + blocks <= index.INT32_MAX


def round_loss(tiles: int, blocks: int) -> float:
    """The share of block-time idle when ``blocks`` persistent blocks take ``tiles`` whole tiles."""
    return 1.0 - tiles / (blocks * -(-tiles // blocks))


STREAM_K_16X8_MIN_LOSS = 0.02
STREAM_K_16X8_MAX_TAIL = 0.1
"""The 16x8 kernels stream their tail only where whole tiles idle at least this share of the
block-time and the tail is at most this share of the tiles: its loop, in a launch of its own,
runs slower than the whole-tile loop (docs/perf-history.md, GEMM v16)."""


def tma_full_block_m(thread_m: int, block_n: int) -> int:
    """The TMA kernel's block_m before ``tma_tiles`` halves it to give every SM a tile: 8 consumer
    warps of 64x64 with 16-row micro-tiles, else 128 (256 where the tiles are 64 channels wide)."""
    if thread_m == 16:
        return 8 * 64 * 64 // block_n
    return 128 if block_n == 128 else 256


def takes_stream_k(tiles: gemm.GemmTiles, count: int, blocks: int) -> bool:
    """Stream-K for 8x8 micro-tiles whose last round leaves any block idle.  Measured on the H100
    against whole tiles (docs/perf-history.md, GEMM v16): conv5 +15 %, conv6 +28 %, conv10 +14 %,
    conv11 +34 %, c3d_conv3 and unet3d_l1 +2-3 % (where whole tiles idle 1 % and 3 %).  For 16x8
    micro-tiles, whose FMA loop is sensitive to ptxas' register allocation, with the tail in its
    own launch (``tail_in_own_launch``) and only within the ``STREAM_K_16X8_*`` bounds: conv4 +1.2 %
    (2 % idle, tail 7 % of the tiles), where conv8 and c3d_conv2 (0.4 % and 1 % idle) lost 1-2 %
    and conv9 (tail 28 % of the tiles) 2.5 %."""
    loss = round_loss(count, blocks)
    if tiles.thread_m == 8:
        return loss > 0
    tail = count - data_parallel_rounds(count, blocks) * blocks
    return loss >= STREAM_K_16X8_MIN_LOSS and tail <= STREAM_K_16X8_MAX_TAIL * count


def tail_in_own_launch(tiles: gemm.GemmTiles) -> bool:
    """Whether a stream-K tail runs in a second launch of the kernel after its rounds of whole
    tiles: for the 16x8 kernels, whose whole-tile loop ptxas allocated worse beside the tail's loop
    in one kernel (conv8 10 % slower: docs/perf-history.md, GEMM v16).  The 8x8 kernels keep one launch."""
    return tiles.thread_m == 16


def data_parallel_rounds(tiles: int, blocks: int) -> int:
    """Rounds of whole tiles each block takes (tile = block + round * blocks) before the stream-K
    tail: all of them when the tiles fill every round, else all but the last full one, so that
    the tail (the partly filled wave plus one full wave) is shared out in equal steps, as
    CUTLASS's data-parallel + stream-K hybrid does (stream-K over every tile measured about the
    same: docs/perf-history.md, GEMM v15)."""
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


def gather_pays(spec: ConvSpec, device: Device | str | None = None) -> bool:
    """Whether the TMA kernel's gathered A tile pays on channels-first data (the catalogue ships
    its file for these layers; ``tma=True`` asks for it): full 32-channel slices (a C = 3 image
    would fill 3 of each slice's 32 rows), K other than 64, and ``TMA_MIN_GATHER_TILES_PER_SM``
    tiles per SM.  At K = 64 the output-channel tile is 64 wide, so the producer warps gather twice
    the pixels per FMA that they do at 128, and the cp.async kernel stayed ahead (conv4 0.97x, conv9
    0.93x NCHW); at K = 32 the cp.async kernel's own tiles are thin and the TMA kernel won
    (unet3d_l1 1.14x; docs/perf-history.md, GEMM v17)."""
    if spec.c % 32 or spec.k == 64 or not tma_suits(spec):
        return False
    device = as_device(device)
    count, _ = FAMILY._tma_grid(spec, FAMILY.tma_tiles(spec, device=device), device)
    return count >= TMA_MIN_GATHER_TILES_PER_SM * device.sm_count


def tma_suits(spec: ConvSpec) -> bool:
    """Whether the TMA kernel takes ``spec`` (``check_tma_spec`` passes)."""
    try:
        check_tma_spec(spec)
    except SpecError:
        return False
    return True


def check_tma_spec(spec: ConvSpec) -> None:
    """What TMA's im2col mode takes from a channels-last image, each refusal naming the field:
    16-byte pixel strides, strides up to 8, and corners (-p and p - d*(f - 1)) in the 8-bit (2D)
    or 5-bit (3D) range the map encodes.  A channels-first image is gathered by the producer
    warps instead, which takes every spec."""
    slices = tma_slices(spec)
    if slices > gemm.TABLE_MAX_ROWS:
        raise SpecError("c", spec.c, f"gives the TMA kernel {slices} k-slices (taps x C/32), whose offsets it "
                        f"tabulates; at most {gemm.TABLE_MAX_ROWS} (tma=True): use tma=False")
    if not spec.layout.channels_last:
        return
    if spec.pitch % 4:
        raise SpecError("dpitch", spec.pitch, "must be a multiple of 4 with tma=True (TMA row strides are multiples of "
                        "16 bytes); pad the channels with dpitch")
    for j, stride in enumerate(spec.stride):
        if stride > index.TMA_ELEMENT_STRIDE_LIMIT:
            raise SpecError(f"stride[{j}]", stride, f"must be at most {index.TMA_ELEMENT_STRIDE_LIMIT} with tma=True "
                            "(the largest traversal stride of a TMA map)")
    limit = index.IM2COL_CORNER_LIMIT[spec.dims]
    terms = index.im2col_map_terms(index.IndexAlgebra(spec))
    for inner, corners in enumerate(zip(terms["lower"], terms["upper"])):
        j = spec.dims - 1 - inner           # the map's spatial axes run innermost first
        if not all(-limit <= corner < limit for corner in corners):
            raise SpecError(f"padding[{j}]", spec.padding[j], f"with filter {spec.filter_size[j]} and dilation "
                            f"{spec.dilation[j]} gives im2col corners {corners}, outside [-{limit}, {limit - 1}], the "
                            f"range a {spec.dims + 2}-D TMA map encodes (tma=True)")


FAMILY = ImplicitGemm()
