"""A/B of 128-thread CTA tiles of 16x8 micro-tiles (docs/perf.md, GEMM v33), on the GPU, on
channels-first data unless --layouts says otherwise: the shape of cuBLAS's and cuDNN's fp32 SIMT
kernels, and of every tuned winner on the channels-first layers where the heuristic fell under
cuDNN (GEMM v32: 128x128 tiles where K = 128, 256x64 where K = 64, 8-deep slices, split-K 1).  Each layer whose K is a multiple of 64 runs the
heuristic, the heuristic with 8-deep slices, and the wide tiles with 8- and 16-deep slices, as
16x8 and 8x16 micro-tiles, and with the heuristic's split-K rule where it would split; measured as
``ab_harness`` does (checked against cuDNN, interleaved rounds), into ``ab-wide-tiles.json``.

    PYTHONPATH=$PWD python3 scripts/ab_wide_tiles.py [--shapes F] [--layouts L ...] [--out DIR] [LAYER ...]
"""
import sys

from ab_harness import run


def candidate_tiles(spec) -> dict[str, dict]:
    """The heuristic, the heuristic at block_k 8, and the wide tiles; empty where K is not a
    multiple of 64 (no wide tile fits it without padding)."""
    from codegen import index
    from codegen.families import gemm, implicit_gemm

    gemm_m, gemm_n, gemm_k = index.gemm_sizes(index.IndexAlgebra(spec))
    if gemm_n % 64:
        return {}
    heuristic = implicit_gemm.FAMILY.default_tiles(spec).to_dict()
    configs = {"heuristic": heuristic, "heuristic bk8": {**heuristic, "block_k": 8}}
    block_m, block_n = (128, 128) if gemm_n % 128 == 0 else (256, 64)
    for thread_m, thread_n in ((16, 8), (8, 16)):
        warp_m, warp_n = gemm._warp_shape(block_m, block_n, thread_m, thread_n)
        shape = dict(block_m=block_m, block_n=block_n, warp_m=warp_m, warp_n=warp_n, thread_m=thread_m,
                     thread_n=thread_n, stages=3, vector_load=False, precomp=True)
        for block_k in (8, 16) if thread_m == 16 else (8,):
            configs[f"wide {thread_m}x{thread_n} bk{block_k}"] = {**shape, "block_k": block_k, "split_k": 1}
        split_k = gemm.heuristic_split_k(gemm.tile_count(gemm_m, gemm_n, block_m, block_n), -(-gemm_k // 8))
        if thread_m == 16 and split_k > 1:
            configs[f"wide 16x8 bk8 sk{split_k}"] = {**shape, "block_k": 8, "split_k": split_k}
    return configs


if __name__ == "__main__":
    sys.exit(run(__doc__, candidate_tiles, "heuristic", "ab-wide-tiles.json"))
