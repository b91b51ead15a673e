"""Launch one GEMM-family kernel on a benchmark layer three times, for a profiler to read.

When to use it: to read a kernel's hardware counters (warp stalls, memory and shared-memory
traffic) with Nsight Compute, on a layer of the package's shapes.json with the tiles you name over
the heuristic's.  The script only builds the kernel, prints its spec and tiles on stderr, and
launches it on random inputs; the profiler does the measuring.

Needs a CUDA GPU and the convgen package installed; runs from any folder.

example:
  ncu --clock-control none --section WarpStateStats -k regex:convgen \\
      python scripts/profile_gemm.py implicit_gemm conv8 NCHW block_k=16 stages=2
"""
import argparse
import sys

from codegen.cli import _parse_value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("family", help="implicit_gemm, im2win or im2col_gemm")
    parser.add_argument("layer", help="a layer of shapes.json (conv1 ... unet3d_down)")
    parser.add_argument("layout", help="NCHW or NHWC (2D layers), NCDHW or NDHWC (3D)")
    parser.add_argument("tiles", nargs="*", metavar="NAME=VALUE",
                        help="tile parameters over the heuristic's ('convgen families' lists them)")
    args = parser.parse_args()

    import cupy

    from codegen.api import build
    from codegen.bench.layers import benchmark_layers, layer_spec, select_layers

    layer, = select_layers(benchmark_layers(("conv2d_mec", "conv3d")), [args.layer])
    spec = layer_spec(layer, args.layout, layer["N"])
    requested = {name: _parse_value(value) for name, value in (t.split("=", 1) for t in args.tiles)}
    kernel = build(args.family, spec, requested or None)
    print(spec.describe(), "|", kernel.plan.tiles.describe(), file=sys.stderr)
    inputs = [cupy.random.default_rng(0).uniform(-1, 1, b.shape, dtype=cupy.float32) for b in kernel.plan.inputs]
    out = cupy.empty(kernel.plan.output.shape, dtype=cupy.float32)
    for _ in range(3):
        kernel.launch(inputs, out)
    cupy.cuda.Device().synchronize()
    return 0


if __name__ == "__main__":
    sys.exit(main())
