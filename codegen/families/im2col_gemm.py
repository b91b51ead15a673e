"""Explicit im2col + GEMM (the baseline of the im2win paper and PyTorch's fallback path): the
generated im2col kernel writes the column matrix of ``batch_chunk`` images into a workspace, and
cuBLAS (``sgemmStridedBatched`` through CuPy) multiplies it by the filter, chunk after chunk.

The GEMM writes the output in its layout directly: channels-last y[n, o, k] is col^T * w^T in
one call; channels-first y[n, k, o] is w * col_n for each image n of the chunk, batched.
Extra memory: the column matrix of one chunk (the workspace ``col``).  Runs only from Python;
emitting it as a standalone file is refused, since the GEMM is a cuBLAS call.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import sympy

from codegen import index
from codegen.device import Device
from codegen.families import im2col
from codegen.families.base import BlasGemm, Buffer, Family, KernelPlan, Launch, chunk_spec, largest_batch_chunk
from codegen.families.direct import convolution_reference
from codegen.spec import ConvSpec, SpecError
from codegen.tiles import TileParam, Tiles

WORKSPACE_BUDGET = 1 << 30
"""Column-matrix bytes the heuristic allows per chunk (PyTorch's unfold path uses one image)."""


@dataclass(frozen=True)
class Im2colGemmTiles(Tiles):
    batch_chunk: int = 1

    PARAMS: ClassVar = (
        TileParam("batch_chunk", "images per im2col + GEMM round (must divide N); the workspace holds "
                  "their column matrix", minimum=1, maximum=1 << 20),
    )


def column_bytes_per_image(spec: ConvSpec) -> int:
    alg = index.IndexAlgebra(spec)
    return alg.rows * math.prod(alg.out_size) * 4


class Im2colGemm(Family):
    name = "im2col_gemm"
    template = "im2col_gemm.cu.j2"
    tiles_type = Im2colGemmTiles
    summary = "explicit im2col into a workspace, then cuBLAS SGEMM, in batch chunks"

    def default_tiles(self, spec: ConvSpec, budget: int = WORKSPACE_BUDGET, *,
                      device: Device | str | None = None) -> Im2colGemmTiles:
        """The largest divisor of N whose column matrix fits ``budget`` (at least 1) and whose columns
        cuBLAS's 32-bit sizes can count."""
        per_image = column_bytes_per_image(spec)
        most_images = index.INT32_MAX // math.prod(index.output_size(spec))
        return Im2colGemmTiles(batch_chunk=largest_batch_chunk(spec.n, per_image, min(budget, most_images * per_image)))

    def tiles_within(self, spec: ConvSpec, limit: int, device: Device | str | None = None) -> Im2colGemmTiles:
        """The largest batch chunk whose column matrix fits ``limit``."""
        return self.chunk_within(spec, limit, column_bytes_per_image(spec), "one image's column matrix",
                                 WORKSPACE_BUDGET)

    def tuning_space(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """Every batch chunk that divides N and whose column matrix fits ``workspace_limit``."""
        if workspace_limit is not None:
            self.tiles_within(spec, workspace_limit)       # names the least it needs when nothing fits
        per_image = column_bytes_per_image(spec)
        return [{"batch_chunk": d} for d in sympy.divisors(spec.n)
                if workspace_limit is None or d * per_image <= workspace_limit]

    def plan(self, spec: ConvSpec, tiles: Im2colGemmTiles, device: Device | str | None = None) -> KernelPlan:
        chunk = tiles.batch_chunk
        pixels = math.prod(index.output_size(spec))
        if pixels > index.INT32_MAX:
            raise SpecError("input_size", spec.input_size, f"gives {pixels} output pixels an image, more than "
                            f"cuBLAS's 32-bit GEMM sizes ({index.INT32_MAX}); use implicit_gemm")
        if chunk * pixels > index.INT32_MAX:
            raise SpecError("tiles.batch_chunk", chunk, f"gives the GEMM {chunk * pixels} columns, more than cuBLAS's "
                            f"32-bit sizes ({index.INT32_MAX}); use at most {index.INT32_MAX // pixels} images a chunk")
        part = chunk_spec(spec, chunk)
        alg = self.algebra(spec)
        inner = im2col.FAMILY.plan(part, im2col.FAMILY.default_tiles(part))
        chunk_alg = index.IndexAlgebra(part)
        rows, cols = chunk_alg.col_shape
        pixels = math.prod(alg.out_size)
        x_step = chunk * math.prod(alg.image_shape[1:])
        y_step = chunk * math.prod(alg.output_shape[1:])
        (launch,) = inner.launches
        transform = Launch(launch.kernel, launch.grid, launch.block, launch.shared_bytes, args=("x", "col"),
                           chunk_strides=(x_step, 0))
        if spec.layout.channels_last:
            product = BlasGemm(True, True, spec.k, cols, rows, ("w", 0), rows, 0, ("col", 0), cols, 0,
                               ("y", 0), spec.k, 0, chunk_stride_c=y_step)
        else:
            product = BlasGemm(False, False, pixels, spec.k, rows, ("col", 0), cols, pixels, ("w", 0), rows, 0,
                               ("y", 0), pixels, spec.k * pixels, chunk, chunk_stride_c=y_step)
        buffers = (Buffer("x", alg.image_shape, "in", inner.buffers[0].alignment),
                   Buffer("w", alg.filter_shape, "in"),
                   Buffer("col", (rows, cols), "workspace", inner.buffers[1].alignment),
                   Buffer("y", alg.output_shape, "out"))
        return KernelPlan(self.name, inner.variant, spec, tiles, buffers, (transform,), inner.context,
                          steps=(transform, product), chunks=spec.n // chunk)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs
        return convolution_reference(spec, x, w)


FAMILY = Im2colGemm()
