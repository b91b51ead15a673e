"""Launch one GEMM-family kernel on a benchmark layer a few times, for ``ncu`` (hardware counters).

    ncu --clock-control none --section WarpStateStats -k regex:convgen python3 scripts/profile_gemm.py \\
        implicit_gemm conv8 NCHW block_k=16 stages=2
"""
import sys

import cupy

from codegen.api import build
from codegen.bench import layer_spec, load_shapes
from codegen.cli import _parse_value


def main(family: str, layer_name: str, layout: str, *tiles: str) -> None:
    shapes = load_shapes()
    layer = next(l for group in ("conv2d_mec", "conv3d") for l in shapes[group] if l["name"] == layer_name)
    spec = layer_spec(layer, layout, layer["N"])
    requested = {k: _parse_value(v) for k, v in (t.split("=", 1) for t in tiles)}
    kernel = build(family, spec, requested or None)
    print(spec.describe(), "|", kernel.plan.tiles.describe(), file=sys.stderr)
    inputs = [cupy.random.default_rng(0).uniform(-1, 1, b.shape, dtype=cupy.float32) for b in kernel.plan.inputs]
    out = cupy.empty(kernel.plan.output.shape, dtype=cupy.float32)
    for _ in range(3):
        kernel.launch(inputs, out)
    cupy.cuda.Device().synchronize()


if __name__ == "__main__":
    main(*sys.argv[1:])
