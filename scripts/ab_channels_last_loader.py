"""A/B of the cp.async GEMM loaders on channels-last data (docs/perf.md, GEMM v22), on the GPU,
with the heuristic's other tiles: four channels a thread (``vector_load=True``, v21's heuristic:
four 4-byte copies from one address, a warp's copy spread over 16 sectors) against one channel a
thread (``vector_load=False``: a slice's 16 channels of a pixel or filter row are 16 adjacent
lanes, 64 contiguous bytes), each also with 32-deep slices, and register staging (float4 loads,
two stages); for the implicit GEMM and for im2win, whose window tensor is channel-dense too.
Each is built through the package, checked against cuDNN on NaN-poisoned outputs and timed in
interleaved rounds with cuDNN's fp32 in the same process.

    PYTHONPATH=$PWD python3 scripts/ab_channels_last_loader.py [--out DIR] [--rounds N] [LAYER ...]
"""
import argparse
import json
import sys
from pathlib import Path

VARIANTS = {
    "implicit_gemm": {
        "four": {"vector_load": True},
        "one": {"vector_load": False},
        "four bk32": {"vector_load": True, "block_k": 32},
        "one bk32": {"vector_load": False, "block_k": 32},
        "staged": {"vector_load": True, "async_copy": False, "stages": 2},
    },
    "im2win": {"four": {"vector_load": True}, "one": {"vector_load": False}},
}
REFERENCE = "four"
"""The variant the ratios are taken against: the loader v21's heuristic chose."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "conv9", "conv12", "c3d_conv2", "unet3d_down"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import cupy

    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.spec import SpecError
    from codegen.families import get_family
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    layers = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers)
    results = []
    for layer in layers:
        layout = "NDHWC" if "D" in layer else "NHWC"
        spec = layer_spec(layer, layout, layer["N"])
        case = CudnnCase(spec)
        x, w, y = case.x, case.w, case.y
        runs = {"cuDNN": case.run_cudnn}
        rows = []
        for family, variants in VARIANTS.items():
            base = get_family(family).default_tiles(spec).to_dict()
            for name, change in variants.items():
                try:
                    kernel = build(family, spec, {**base, **change})
                except SpecError as error:
                    print(f"[{layer['name']}] {family} {name}: refused ({error})", file=sys.stderr)
                    continue
                y.fill(float("nan"))
                kernel.launch([x, w], y)
                main_kernel = kernel.compiled.resources[kernel.plan.launches[-1].kernel]
                runs[(family, name)] = lambda k=kernel: k.launch([x, w], y)
                rows.append({"layer": layer["name"], "layout": layout, "family": family, "variant": name,
                             "tiles": kernel.plan.tiles.describe(), "registers": main_kernel.registers,
                             "spill_bytes": main_kernel.spill_stores, "nan_left": bool(cupy.isnan(y).any()),
                             "relative_error_vs_cudnn": case.relative_error()})
        times = interleaved_medians(runs, args.rounds)
        flops = gemm_flops(spec)
        for row in rows:
            seconds = times[(row["family"], row["variant"])]
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12,
                       vs_reference=times[(row["family"], REFERENCE)] / seconds,
                       vs_cudnn=times["cuDNN"] / seconds, cudnn_tflops=flops / times["cuDNN"] / 1e12)
        results += rows
        print(f"[{layer['name']}] cuDNN {flops / times['cuDNN'] / 1e12:.1f}, "
              + ", ".join(f"{r['family']} {r['variant']} {r['tflops']:.1f}" for r in rows), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-channels-last-loader.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':11} {'family':13} {'variant':9} {'regs':>4} {'spill':>5} {'ms':>8} {'TFLOP/s':>8} "
          f"{'vs ' + REFERENCE:>8} {'vs cuDNN':>8} {'rel.err':>8} nan")
    for r in results:
        print(f"{r['layer']:11} {r['family']:13} {r['variant']:9} {r['registers']!s:>4} {r['spill_bytes']!s:>5} {r['ms']:8.3f} "
              f"{r['tflops']:8.1f} {r['vs_reference']:8.3f} {r['vs_cudnn']:8.2f} {r['relative_error_vs_cudnn']:8.1e} "
              f"{r['nan_left']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
