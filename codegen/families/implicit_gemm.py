"""Implicit-GEMM convolution (seed 003, CUTLASS's formulation), 2D and 3D, every layout.

The convolution is run as the GEMM y = A * B without ever storing A: the CTA's loader forms
A(m, row), the input pixel that output pixel m reads for column-matrix row (channel, tap), from
the image on the fly, with zeros for padding.  Address arithmetic is split as CUTLASS's
iterators do: a per-pixel base (computed once per thread) plus a per-row delta, either divided
out in the kernel or read from a table precomputed by the generator (``precomp``, cuDNN's
IMPLICIT_PRECOMP_GEMM).  Tiles, pipeline and micro-kernel: ``codegen/families/gemm.py``.
No workspace: the extra device memory is the row table (16 bytes per row at most).
"""
from __future__ import annotations

import numpy as np

from codegen import index
from codegen.families import gemm
from codegen.families.base import Buffer, Family, KernelPlan, Launch, convolution_selftest_context, kernel_name
from codegen.families.direct import convolution_reference
from codegen.spec import ConvSpec


def image_vector_ok(spec: ConvSpec) -> bool:
    """float4 loads of A need four consecutive rows to be four consecutive channels of one pixel."""
    return spec.layout.channels_last and spec.c % 4 == 0 and spec.pitch % 4 == 0


class ImplicitGemm(Family):
    name = "implicit_gemm"
    template = "implicit_gemm.cu.j2"
    tiles_type = gemm.GemmTiles
    summary = "implicit-GEMM convolution: cp.async pipeline, warp and thread tiles, precomputed offsets"

    def default_tiles(self, spec: ConvSpec) -> gemm.GemmTiles:
        return gemm.heuristic(spec, image_vector_ok(spec))

    def tuning_space(self, spec: ConvSpec) -> list[dict]:
        return gemm.tuning_space(spec, image_vector_ok(spec))

    def tuning_seeds(self, spec: ConvSpec) -> list[dict]:
        return gemm.tuning_seeds(spec, image_vector_ok(spec))

    def plan(self, spec: ConvSpec, tiles: gemm.GemmTiles) -> KernelPlan:
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
        context.update(kernel=name, variant=variant, table_name=f"{name}_rows")
        buffers = (Buffer("x", alg.image_shape, "in", 16 if vector and tiles.vector_load else 4),
                   Buffer("w", alg.filter_shape, "in", 16 if context["b_vec"] == 4 else 4),
                   Buffer("y", alg.output_shape, "out"))
        return KernelPlan(self.name, variant, spec, tiles, buffers, (launch,), context, zero_output=context["splits"] > 1)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs
        return convolution_reference(spec, x, w)


FAMILY = ImplicitGemm()
