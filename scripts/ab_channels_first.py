"""A/B of the implicit GEMM on channels-first data (docs/perf.md, GEMM v17), on the GPU: the
portable cp.async kernel (the heuristic's tiles) against the TMA kernel whose producer warps
gather A with cp.async (``tma=True`` on NCHW/NCDHW; B still comes through TMA), with 16x8 and
8x8 micro-tiles.  Each is built through the package, checked against cuDNN on NaN-poisoned
outputs and timed in interleaved rounds with cuDNN's fp32 in the same process.

    PYTHONPATH=$PWD python3 scripts/ab_channels_first.py [--out DIR] [--rounds N] [LAYER ...]
"""
import argparse
import json
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "c3d_conv2"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import cupy

    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families import implicit_gemm
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    layers = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers)
    results = []
    for layer in layers:
        layout = "NCDHW" if "D" in layer else "NCHW"
        spec = layer_spec(layer, layout, layer["N"])
        case = CudnnCase(spec)
        x, w, y = case.x, case.w, case.y
        configs = {"cp.async": implicit_gemm.FAMILY.default_tiles(spec).to_dict(),
                   "tma 16x8": implicit_gemm.FAMILY.tma_tiles(spec, 16).to_dict(),
                   "tma 8x8": implicit_gemm.FAMILY.tma_tiles(spec, 8).to_dict()}
        runs = {"cuDNN": case.run_cudnn}
        rows = []
        for name, tiles in configs.items():
            kernel = build("implicit_gemm", spec, tiles)
            y.fill(float("nan"))
            kernel.launch([x, w], y)
            main_kernel = kernel.compiled.resources[kernel.plan.launches[-1].kernel]
            runs[name] = lambda k=kernel: k.launch([x, w], y)
            rows.append({"layer": layer["name"], "layout": layout, "config": name, "tiles": kernel.plan.tiles.describe(),
                         "registers": main_kernel.registers, "spill_bytes": main_kernel.spill_stores,
                         "stream_k": bool(kernel.plan.context.get("stream_k")),
                         "nan_left": bool(cupy.isnan(y).any()), "relative_error_vs_cudnn": case.relative_error()})
        times = interleaved_medians(runs, args.rounds)
        flops = gemm_flops(spec)
        for row in rows:
            seconds = times[row["config"]]
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, vs_cp_async=times["cp.async"] / seconds,
                       vs_cudnn=times["cuDNN"] / seconds, cudnn_tflops=flops / times["cuDNN"] / 1e12)
        results += rows
        print(f"[{layer['name']}] cuDNN {flops / times['cuDNN'] / 1e12:.1f}, "
              + ", ".join(f"{r['config']} {r['tflops']:.1f}" for r in rows), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-channels-first.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':10} {'config':9} {'regs':>4} {'spill':>5} {'sk':>2} {'ms':>8} {'TFLOP/s':>8} {'vs cp.async':>11} "
          f"{'vs cuDNN':>8} {'rel.err':>8} nan  tiles")
    for r in results:
        print(f"{r['layer']:10} {r['config']:9} {r['registers']!s:>4} {r['spill_bytes']!s:>5} {int(r['stream_k']):>2} "
              f"{r['ms']:8.3f} {r['tflops']:8.1f} {r['vs_cp_async']:11.3f} {r['vs_cudnn']:8.2f} "
              f"{r['relative_error_vs_cudnn']:8.1e} {r['nan_left']}  {r['tiles']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
