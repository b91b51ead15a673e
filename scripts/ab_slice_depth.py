"""A/B of the portable implicit GEMM's slice depth (docs/perf.md, GEMM v33), on the GPU: the
heuristic's cp.async tiles with block_k 16 and with block_k 8, everything else alike.  8-deep
slices won on every layer measured where C % 16 == 8 (v31, v33), and two explanations fit: on
channels-last data 16 channels of a slice straddle two taps, or, in every layout, a K = C x taps
with K % 16 == 8 leaves a partial last slice, whose bound check every copy of every slice pays.
Measured as ``ab_harness`` does (checked against cuDNN, interleaved rounds).

    PYTHONPATH=$PWD python3 scripts/ab_slice_depth.py [--shapes F] [--layouts L ...] [--out DIR] [LAYER ...]
"""
import argparse
import json
import sys
from pathlib import Path

from ab_harness import layer_specs, measure, print_table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", help="layers of the shapes file (default: all)")
    parser.add_argument("--shapes", type=Path, help="a shapes file (default: shapes.json's 2D and 3D layers)")
    parser.add_argument("--layouts", nargs="+", default=["NCHW", "NHWC"],
                        help="2D layers run in the 2D layouts given, 3D layers in the matching 3D ones")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()

    from codegen.families import gemm

    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for layer, spec in layer_specs(args.shapes, args.layers, args.layouts):
        tiles = gemm.heuristic(spec).to_dict()
        results += measure(layer["name"], spec, {"bk16": {**tiles, "block_k": 16}, "bk8": {**tiles, "block_k": 8}},
                           args.rounds, "bk16")
        (args.out / "ab-slice-depth.json").write_text(json.dumps(results, indent=1))
    print_table(results, "bk16")
    return 0


if __name__ == "__main__":
    sys.exit(main())
