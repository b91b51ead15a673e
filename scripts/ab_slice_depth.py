"""A/B of the portable implicit GEMM's slice depth (docs/perf.md, GEMM v33 and v34), on the GPU:
the heuristic's cp.async tiles with block_k 16 and with block_k 8, everything else alike.  v33 used
it to tell why 8-deep slices won where C % 16 == 8 (a partial last slice, not taps straddled by a
slice's channels); v34 on docs/shapes/slice_depth.json, the held-out check of the rule that
channels-last inputs of at most 8 channels take 8-deep slices.  Measured as ``ab_harness`` does
(checked against cuDNN, interleaved rounds).

    PYTHONPATH=$PWD python3 scripts/ab_slice_depth.py [--shapes F] [--layouts L ...] [--out DIR] [LAYER ...]
"""
import sys

from ab_harness import run


def candidate_tiles(spec) -> dict[str, dict]:
    """The heuristic's portable tiles at block_k 16 and 8."""
    from codegen.families import gemm

    tiles = gemm.heuristic(spec).to_dict()
    return {"bk16": {**tiles, "block_k": 16}, "bk8": {**tiles, "block_k": 8}}


if __name__ == "__main__":
    sys.exit(run(__doc__, candidate_tiles, "bk16", "ab-slice-depth.json", layouts=("NCHW", "NHWC")))
