"""A/B of the implicit GEMM on channels-first data (docs/perf.md, GEMM v17), on the GPU: the
portable cp.async kernel (the heuristic's tiles) against the TMA kernel whose producer warps
gather A with cp.async (``tma=True`` on NCHW/NCDHW; B still comes through TMA), with 16x8 and
8x8 micro-tiles; measured as ``ab_harness`` does (checked against cuDNN, interleaved rounds).

    PYTHONPATH=$PWD python3 scripts/ab_channels_first.py [--out DIR] [--rounds N] [LAYER ...]
"""
import sys

from ab_harness import run


def candidate_tiles(spec) -> dict[str, dict]:
    """The portable kernel's tiles and the TMA kernel's with 16x8 and 8x8 micro-tiles."""
    from codegen.families import implicit_gemm

    return {"cp.async": implicit_gemm.FAMILY.default_tiles(spec).to_dict(),
            "tma 16x8": implicit_gemm.FAMILY.tma_tiles(spec, 16).to_dict(),
            "tma 8x8": implicit_gemm.FAMILY.tma_tiles(spec, 8).to_dict()}


if __name__ == "__main__":
    sys.exit(run(__doc__, candidate_tiles, "cp.async", "ab-channels-first.json",
                 layers=("conv4", "conv8", "c3d_conv2"), rounds=5))
