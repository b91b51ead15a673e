"""A/B of the implicit GEMM on channels-first data (docs/perf.md, GEMM v17), on the GPU: the
portable cp.async kernel (the heuristic's tiles) against the TMA kernel whose producer warps
gather A with cp.async (``tma=True`` on NCHW/NCDHW; B still comes through TMA), with 16x8 and
8x8 micro-tiles; measured as ``ab_harness`` does (checked against cuDNN, interleaved rounds).

    PYTHONPATH=$PWD python3 scripts/ab_channels_first.py [--out DIR] [--rounds N] [LAYER ...]
"""
import argparse
import json
import sys
from pathlib import Path

from ab_harness import layer_specs, measure, print_table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "c3d_conv2"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from codegen.families import implicit_gemm

    results = []
    for layer, spec in layer_specs(None, args.layers, ["NCHW"]):
        configs = {"cp.async": implicit_gemm.FAMILY.default_tiles(spec).to_dict(),
                   "tma 16x8": implicit_gemm.FAMILY.tma_tiles(spec, 16).to_dict(),
                   "tma 8x8": implicit_gemm.FAMILY.tma_tiles(spec, 8).to_dict()}
        results += measure(layer["name"], spec, configs, args.rounds, "cp.async")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-channels-first.json").write_text(json.dumps(results, indent=1))
    print_table(results, "cp.async")
    return 0


if __name__ == "__main__":
    sys.exit(main())
