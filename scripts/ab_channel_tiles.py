"""A/B of the implicit GEMM's CTA tile width along the output channels (docs/perf.md, GEMM v28),
on the GPU: on layers whose channel count K is not a multiple of 64, the heuristic's 64-wide
tiles leave part of every last tile idle (K = 144: a quarter of the work; K = 40: 37 %).  Each
layer runs the heuristic and tiles 32, 48, 64, 96, 128 and 144 channels wide (8x12 micro-tiles on
widths that are multiples of 48, and 4x12) at several block_m, split-K by the heuristic's own rule;
measured as ``ab_harness`` does (checked against cuDNN, interleaved rounds).

    PYTHONPATH=$PWD python3 scripts/ab_channel_tiles.py [--shapes F] [--layouts L ...] [--out DIR] [LAYER ...]
"""
import itertools
import sys
from pathlib import Path

from ab_harness import run

WIDTHS = (32, 48, 64, 96, 128, 144)
BLOCK_M = (64, 128, 256)


def candidate_tiles(spec) -> dict[str, dict]:
    """The heuristic and every width x block_m whose geometry checks, named like '128x48'."""
    from codegen import index
    from codegen.families import gemm
    from codegen.spec import SpecError

    gemm_m, gemm_n, gemm_k = index.gemm_sizes(index.IndexAlgebra(spec))
    configs = {"heuristic": gemm.heuristic(spec).to_dict()}
    for block_n in (w for w in WIDTHS if w < gemm_n + 32):
        micro = ((8, 12), (4, 12)) if block_n % 48 == 0 else ((8, 4),) if block_n == 32 else ((8, 8),)
        for (thread_m, thread_n), block_m in itertools.product(micro, BLOCK_M):
            try:
                warp_m, warp_n = gemm._warp_shape(block_m, block_n, thread_m, thread_n)
                split_k = gemm.heuristic_split_k(gemm.tile_count(gemm_m, gemm_n, block_m, block_n), -(-gemm_k // 16))
                tiles = gemm.GemmTiles(block_m=block_m, block_n=block_n, block_k=16, warp_m=warp_m, warp_n=warp_n,
                                       thread_m=thread_m, thread_n=thread_n, stages=3, vector_load=False,
                                       split_k=split_k)
                gemm.check_geometry(tiles)
            except SpecError:
                continue
            suffix = f"/{thread_m}x{thread_n}" if len(micro) > 1 else ""
            configs.setdefault(f"{block_m}x{block_n}{suffix}", tiles.to_dict())
    return configs


if __name__ == "__main__":
    sys.exit(run(__doc__, candidate_tiles, "heuristic", "ab-channel-tiles.json", layouts=("NCHW", "NHWC"),
                 shapes=Path("docs/shapes/unseen.json")))
