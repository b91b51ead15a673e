"""im2win convolution (seed 004), generalised to stride, padding, dilation, 3D and channels-last.

Two kernels.  The transform copies the input into the im2win tensor (``window_tensor_shape``):
per output row, the input rows its windows read, stored window-order along W with the padding
written out, so consecutive windows of a row overlap in memory instead of being copied again as
im2col does.  The convolution is then the GEMM main loop of ``codegen/families/gemm_loop.py`` reading
A(m, row) = win[base(m) + delta(row)] with no bounds checks.

The paper's optimisations are tile switches, so its ablation (Figure 4) can be rerun by removing
one at a time (``ABLATIONS``): the micro-kernel (thread_m x thread_n outer products; 1x1 without),
vectorised loads (float4 global loads and float4 fragment reads), and double buffering with
prefetch (``stages`` >= 2; 1 without).

Extra memory: the im2win tensor (workspace ``win``) of ``batch_chunk`` images.  The plan runs the
transform and the GEMM once per chunk of the batch, reusing one chunk's tensor, as PyTorch's
unfold path and our ``im2col_gemm`` bound their column matrix; the whole batch's tensor is 3.5x
the input for 7x7 stride-2 filters (5.3 GB on conv4).

float32 only (``Im2win.check_precision``): the GEMM core multiplies FP32 operands from an FP32 window
tensor and writes FP32 outputs.  A 16-bit transform would only feed that core widened data, and a
16-bit spec's filter and output would still need a 16-bit GEMM; float16 and bfloat16 convolutions
run in implicit_gemm (tensor cores) and direct.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codegen import index
from codegen.device import Device
from codegen.families import gemm_heuristic, gemm_loop, gemm_tiles, gemm_tuning
from codegen.families.base import (Buffer, Family, KernelPlan, Launch, chunk_spec, convolution_selftest_context,
                                   grid_for, kernel_name, largest_batch_chunk)
from codegen.families.direct import convolution_reference
from codegen.spec import ConvSpec, DType, SpecError, replace
from codegen.terms.gemm import gemm_terms
from codegen.terms.im2win import window_tensor_shape, window_transform_terms, window_width
from codegen.tiles import TileParam

TRANSFORM_THREADS = 256
WINDOW_BUDGET = 512 << 20
"""im2win-tensor bytes the heuristic allows per batch chunk: half of ``im2col_gemm``'s column
budget, since one chunk's GEMM must still fill the GPU (conv4: 8 images, 742 CTAs)."""


@dataclass(frozen=True)
class Im2winTiles(gemm_tiles.GemmTiles):
    batch_chunk: int = 1

    PARAMS: ClassVar = gemm_tiles.GemmTiles.PARAMS + (
        TileParam("batch_chunk", "images per transform + GEMM round (must divide N); the workspace holds "
                  "their im2win tensor", minimum=1, maximum=1 << 20),
    )


@dataclass(frozen=True, kw_only=True)
class Im2winContext(gemm_loop.GemmLoopContext):
    """The GEMM main loop's context (reading A from the window tensor) and the transform's."""

    transform_kernel: str
    transform_threads: int
    window_shape: list[int]
    """The im2win tensor of one batch chunk (``window_tensor_shape``)."""
    window_elements: int
    window_names: list[str]
    """The tensor's coordinate names in memory order."""
    window_coords: list[str]
    """Those coordinates of transform thread ``t``."""
    window_sources: list[str]
    """The input coordinates i0.. that element copies."""
    window_bounds: str
    """The C condition that the input lies inside the image (else the element is padding, a zero)."""


def window_bytes_per_image(spec: ConvSpec) -> int:
    return math.prod(window_tensor_shape(index.IndexAlgebra(replace(spec, n=1)))) * 4


def batch_chunk(spec: ConvSpec, budget: int = WINDOW_BUDGET) -> int:
    """The largest divisor of N whose im2win tensor fits ``budget`` (at least 1)."""
    return largest_batch_chunk(spec.n, window_bytes_per_image(spec), budget)


def _per_chunk(spec: ConvSpec, gemm_configs, chunk: int) -> list[dict]:
    """The GEMM core's configurations (``gemm_tuning.tuning_space`` or ``gemm_tuning.tuning_seeds``) for one
    chunk's GEMM, each with that chunk."""
    return [dict(tiles, batch_chunk=chunk) for tiles in gemm_configs(replace(spec, n=chunk))]


def window_vector_ok(spec: ConvSpec) -> bool:
    """The im2win tensor is channel-dense, so channels-last A rows vectorise when C is a multiple of 4."""
    return spec.layout.channels_last and spec.c % 4 == 0


def ablation(tiles: Im2winTiles, removed: str) -> Im2winTiles:
    """``tiles`` with one of the paper's optimisations removed (``ABLATIONS``)."""
    data = tiles.to_dict()
    if removed == "prefetch":
        data.update(stages=1)
    elif removed == "vectorized":
        data.update(vector_load=False, vector_smem=False)
    elif removed == "micro_kernel":
        lanes_m, lanes_n = tiles.warp_m // tiles.thread_m, tiles.warp_n // tiles.thread_n
        data.update(thread_m=1, thread_n=1, warp_m=lanes_m, warp_n=lanes_n,
                    block_m=lanes_m * 2, block_n=lanes_n * 2)
    else:
        raise ValueError(f"unknown ablation {removed!r}; one of {', '.join(ABLATIONS)}")
    return Im2winTiles(**data)


ABLATIONS = ("micro_kernel", "vectorized", "prefetch")


class Im2win(Family):
    name = "im2win"
    template = "im2win.cu.j2"
    tiles_type = Im2winTiles
    summary = "im2win convolution: window-order transform, then a tiled, double-buffered micro-kernel GEMM, in batch chunks"

    def check_precision(self, spec: ConvSpec) -> None:
        """float32 with math fma only, naming why: the window tensor feeds an FP32 FMA GEMM core."""
        if spec.dtype is not DType.float32:
            raise SpecError("dtype", spec.dtype.value, "im2win runs float32 only: its GEMM core multiplies FP32 "
                            "operands read from an FP32 window tensor; float16 and bfloat16 run in implicit_gemm "
                            "(tensor cores, sm_80 and newer) and direct")
        super().check_precision(spec)

    def default_tiles(self, spec: ConvSpec, budget: int = WINDOW_BUDGET, *,
                      device: Device | str | None = None) -> Im2winTiles:
        """``gemm_heuristic.core_tiles`` for one chunk's GEMM on ``device``, the chunk from ``batch_chunk``."""
        chunk = batch_chunk(spec, budget)
        part = replace(spec, n=chunk)
        alg = index.IndexAlgebra(part)
        core = gemm_heuristic.core_tiles(part, gemm_heuristic.row_table_fits(alg, gemm_terms(alg, "window")), device)
        return Im2winTiles(**core.to_dict(), batch_chunk=chunk)

    def complete_tiles(self, spec: ConvSpec, requested: dict, device: Device | str | None = None) -> Im2winTiles:
        """Unset tiles as ``gemm_heuristic.complete`` fills them from the heuristic."""
        return Im2winTiles.from_dict(gemm_heuristic.complete(self.default_tiles(spec, device=device).to_dict(), requested))

    def tiles_within(self, spec: ConvSpec, limit: int, device: Device | str | None = None) -> Im2winTiles:
        """The heuristic with the largest batch chunk whose window tensor fits ``limit``."""
        shape = window_tensor_shape(index.IndexAlgebra(replace(spec, n=1)))
        return self.chunk_within(spec, limit, math.prod(shape) * 4, f"one image's window tensor {shape}",
                                 WINDOW_BUDGET, device)

    def tuning_space(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """The GEMM core's space for the heuristic's batch chunk (held to ``workspace_limit``), and
        ``_shrunk_heuristic``."""
        chunk = self._chunk(spec, workspace_limit)
        space = _per_chunk(spec, lambda part: gemm_tuning.tuning_space(part, window_vector_ok(spec)), chunk)
        return space + [tiles for tiles in self._shrunk_heuristic(spec, chunk) if tiles not in space]

    def tuning_seeds(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        chunk = self._chunk(spec, workspace_limit)
        return self._shrunk_heuristic(spec, chunk) + _per_chunk(spec, gemm_tuning.tuning_seeds, chunk)

    def _chunk(self, spec: ConvSpec, workspace_limit: int | None) -> int:
        tiles = self.default_tiles(spec) if workspace_limit is None else self.tiles_within(spec, workspace_limit)
        return tiles.batch_chunk

    def _shrunk_heuristic(self, spec: ConvSpec, chunk: int) -> list[dict]:
        """The heuristic's tiles for its own batch chunk, run at a smaller ``chunk`` (a workspace
        limit's).  On the H100 they beat the heuristic re-derived for the smaller chunk on 6 of 10
        layers (up to 1.16x, where the re-derived split-K is too deep) and lost on 2 (0.79x on
        conv12), docs/perf-history.md GEMM v27: so the tuner times both, this one right after the heuristic."""
        full = self.default_tiles(spec)
        return [] if full.batch_chunk == chunk else [dict(full.to_dict(), batch_chunk=chunk)]

    def plan(self, spec: ConvSpec, tiles: Im2winTiles, device: Device | str | None = None) -> KernelPlan:
        """Kernels for one chunk of ``batch_chunk`` images; images are outermost in every layout,
        so chunk c is the same kernels on x and y advanced by c chunks of images."""
        chunk = tiles.batch_chunk
        part = chunk_spec(spec, chunk)
        alg, whole = self.algebra(part), self.algebra(spec)
        terms = gemm_terms(alg, "window")
        vector = window_vector_ok(spec)
        fields = gemm_loop.loop_fields(part, tiles, terms, vector, a_m_fastest=not spec.layout.channels_last)
        window = window_transform_terms(alg)
        window_elements = window["window_elements"]
        variant = tiles.variant
        name = kernel_name(self.name, variant.value, spec, tiles)
        chunks = spec.n // chunk
        x_step, y_step = (chunk * math.prod(shape[1:]) for shape in (alg.image_shape, alg.output_shape))
        transform = Launch(f"{name}_transform", (grid_for(window_elements, TRANSFORM_THREADS), 1, 1),
                           (TRANSFORM_THREADS, 1, 1), args=("x", "win"), chunk_strides=(x_step, 0) if chunks > 1 else None)
        conv = Launch(name, gemm_tiles.grid(part, tiles), (tiles.threads, 1, 1), gemm_tiles.shared_bytes(tiles),
                      args=("win", "w", "y"), chunk_strides=(0, 0, y_step) if chunks > 1 else None)
        padded = max(transform.threads, conv.threads, window_elements)
        context = Im2winContext(**index.template_context(alg, padded), **convolution_selftest_context(whole), **fields,
                                **window, kernel=name, variant=variant, table_name=f"{name}_rows",
                                transform_kernel=transform.kernel, transform_threads=TRANSFORM_THREADS)
        buffers = (Buffer("x", whole.image_shape, "in"),
                   Buffer("w", alg.filter_shape, "in", 16 if context.b_vec == 4 else 4),
                   Buffer("win", window_tensor_shape(alg), "workspace", 16 if vector else 4),
                   Buffer("y", whole.output_shape, "out"))
        return KernelPlan(self.name, variant.value, spec, tiles, buffers, (transform, conv), context, chunks=chunks,
                          zero_output=context.splits > 1, atomic_sums=context.splits > 1,
                          **gemm_tiles.async_copy_arch(tiles))

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs
        return convolution_reference(spec, x, w)


def window_tensor_reference(spec: ConvSpec, x: np.ndarray) -> np.ndarray:
    """The im2win tensor by slicing a zero-padded image (not through the index algebra)."""
    alg = index.IndexAlgebra(spec)
    x = np.asarray(x, dtype=np.float64)
    if spec.layout.channels_last:
        x = np.moveaxis(x[..., : spec.c], -1, 1)
    pads = [(0, 0), (0, 0)] + [(p, p) for p in spec.padding]
    padded = np.pad(x, pads)
    width = window_width(alg)
    outer_taps = list(np.ndindex(*spec.filter_size[:-1]))
    planes = []
    for taps in outer_taps:
        slices = [slice(None), slice(None)]
        for j, k in enumerate(taps):
            start = k * spec.dilation[j]
            slices.append(slice(start, start + (alg.out_size[j] - 1) * spec.stride[j] + 1, spec.stride[j]))
        slices.append(slice(0, width))
        planes.append(padded[tuple(slices)])
    win = np.stack(planes, axis=-1)                  # (N, C, O_outer..., Wwin, T)
    if spec.layout.channels_last:
        win = np.moveaxis(win, 1, -1)
    return win


FAMILY = Im2win()
