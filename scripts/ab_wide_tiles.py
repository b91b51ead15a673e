"""A/B of 128-thread CTA tiles of 16x8 micro-tiles on channels-first data (docs/perf.md, GEMM v33),
on the GPU: the shape of cuBLAS's and cuDNN's fp32 SIMT kernels, and of every tuned winner on the
channels-first layers where the heuristic fell under cuDNN (GEMM v32: 128x128 tiles where K = 128,
256x64 where K = 64, 8-deep slices, split-K 1).  Each layer whose K is a multiple of 64 runs the
heuristic, the heuristic with 8-deep slices, and the wide tiles with 8- and 16-deep slices, as
16x8 and 8x16 micro-tiles, and with the heuristic's split-K rule where it would split; measured as
``ab_harness`` does (checked against cuDNN, interleaved rounds).  Rows are written to
``ab-wide-tiles.json`` after every layer, so a run cut short keeps what it measured.

    PYTHONPATH=$PWD python3 scripts/ab_wide_tiles.py [--shapes F] [--layouts L ...] [--out DIR] [LAYER ...]
"""
import argparse
import json
import sys
from pathlib import Path

from ab_harness import layer_specs, measure, print_table


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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", help="layers of the shapes file (default: all)")
    parser.add_argument("--shapes", type=Path, help="a shapes file (default: shapes.json's 2D and 3D layers)")
    parser.add_argument("--layouts", nargs="+", default=["NCHW"],
                        help="2D layers run in the 2D layouts given, 3D layers in the matching 3D ones")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for layer, spec in layer_specs(args.shapes, args.layers, args.layouts):
        configs = candidate_tiles(spec)
        if configs:
            results += measure(layer["name"], spec, configs, args.rounds, "heuristic")
            (args.out / "ab-wide-tiles.json").write_text(json.dumps(results, indent=1))
    print_table(results, "heuristic")
    return 0


if __name__ == "__main__":
    sys.exit(main())
