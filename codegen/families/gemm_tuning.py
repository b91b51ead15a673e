"""What the tuner may try for the GEMM families (``Family.tuning_space``) and what it measures first
after the heuristic (``Family.tuning_seeds``): the cp.async kernel's tiles, which implicit_gemm and
im2win share, and implicit_gemm's TMA kernel's.  Every member passes ``gemm_tiles.check_geometry``;
the compiler's limits prune the rest when the tuner builds them.
"""
from __future__ import annotations

import itertools
import math

from codegen import index
from codegen.device import Device, as_device, present
from codegen.families.gemm_heuristic import NARROW_TILE, SPLIT_K_CTAS_PER_SM, core_tiles, tma_suits, tma_tiles
from codegen.families.gemm_tiles import TMA_THREAD_ROWS, GemmTiles, check_geometry, tile_count
from codegen.spec import ConvSpec, SpecError
from codegen.terms.gemm import gemm_sizes
from codegen.terms.implicit_gemm import transposed_filter_terms

MICRO_TILES = ((4, 4), (4, 8), (8, 4), (8, 8), (4, 12), (8, 12), (12, 8), (16, 8), (8, 16))
"""Thread micro-tiles (thread_m, thread_n) of the tuning space."""
WIDE_TILES = ((128, 128, 64, 64, 16, 8), (256, 64, 128, 32, 16, 8), (256, 64, 64, 64, 8, 16),
              (128, 128, 64, 64, 8, 16))
"""(block_m, block_n, warp_m, warp_n, thread_m, thread_n) of the tuner's seeds: 128 threads of
16x8 or 8x16 outputs."""


def tuning_space(spec: ConvSpec, a_vector_ok: bool, device: Device | str | None = None) -> list[dict]:
    """Every cp.async tile configuration the tuner may try: CTA tiles 32-256 (block_n no wider than
    the channels need), block_k 8-32, the micro-tiles of ``MICRO_TILES``, four warp shapes, 2-4
    stages, with and without the row table, with and without four-float loads where A allows them,
    split-K 1, 2 or 4 where the output has fewer than ``SPLIT_K_CTAS_PER_SM`` tiles per SM of
    ``device``."""
    enough = SPLIT_K_CTAS_PER_SM * as_device(device).sm_count
    gemm_m, gemm_n, gemm_k = gemm_sizes(index.IndexAlgebra(spec))
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
    """``WIDE_TILES`` at block_k 8 and 16, otherwise as ``core_tiles``: the 16x8 micro-tiles (128
    threads) of cuBLAS's and cuDNN's fp32 kernels.  In a space of thousands, random sampling seldom
    draws them and one-parameter steps from an 8x8 winner cannot reach them (the warp tile must
    change with the micro-tile); they won three benchmark layers by 3-8 % and lost conv4 (GEMM v7)."""
    base = core_tiles(spec).to_dict()
    return [{**base, **dict(zip(("block_m", "block_n", "warp_m", "warp_n", "thread_m", "thread_n"), shape)),
             "block_k": block_k, "split_k": 1}
            for shape in WIDE_TILES for block_k in (8, 16)]


def tma_within(spec: ConvSpec, workspace_limit: int | None) -> bool:
    """Whether the TMA kernel takes ``spec`` and its workspace (the transposed filter, whatever
    the tiles) fits ``workspace_limit``."""
    if not tma_suits(spec):
        return False
    shape = transposed_filter_terms(index.IndexAlgebra(spec))["shape"]
    return workspace_limit is None or math.prod(shape) * 4 <= workspace_limit


def tma_space(spec: ConvSpec, workspace_limit: int | None) -> list[dict]:
    """The TMA kernel's tiles where ``tma_within``: 8x8 and 16x8 micro-tiles, block_m 64-512,
    block_n 64-256 but no wider than the channels need, 3-6 stages that fit."""
    if not tma_within(spec, workspace_limit):
        return []
    widest = max(64, -(-spec.k // 64) * 64)
    space = []
    for thread_m in TMA_THREAD_ROWS:
        base = tma_tiles(spec, thread_m, present()).to_dict()
        for block_m in (64, 128, 256, 512):
            for block_n in (b for b in (64, 128, 256) if b <= widest):
                for stages in (3, 4, 5, 6):
                    tiles = GemmTiles(**{**base, "block_m": block_m, "block_n": block_n, "stages": stages})
                    try:
                        check_geometry(tiles)
                    except SpecError:
                        continue
                    space.append(tiles.to_dict())
    return space


def tma_seeds(spec: ConvSpec, workspace_limit: int | None) -> list[dict]:
    """The TMA kernel's heuristic tiles for this machine, where ``tma_within``."""
    return [tma_tiles(spec, device=present()).to_dict()] if tma_within(spec, workspace_limit) else []
