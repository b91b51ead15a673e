"""A/B of the gathered TMA kernel's producer addressing on channels-first data (docs/perf.md,
GEMM v24), on the GPU: one 64-bit address a copy (v17) against one a channel shared by a thread's
pixels (``shared_row_address``, where pixels are contiguous), with the package's tma=True tiles,
the portable cp.async kernel and the channels-last TMA kernel on the same layer as yardsticks.
Each is built through the package (the old addressing by hiding ``pixels_contiguous`` from the
plan), checked against cuDNN on NaN-poisoned outputs and timed in interleaved rounds with cuDNN's
fp32 in the same process.

    PYTHONPATH=$PWD python3 scripts/ab_shared_row_address.py [--out DIR] [--rounds N] [LAYER ...]
"""
import argparse
import json
import sys
from pathlib import Path

REFERENCE = "per copy"
"""The variant the ratios are taken against: the addressing tma=True built before v24."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["c3d_conv2", "unet3d_l1", "conv8"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import cupy

    from codegen import index
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    layers = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers)
    gather_terms = index.gather_terms
    results = []
    for layer in layers:
        rows, runs = [], {}
        first, last = ("NCDHW", "NDHWC") if "D" in layer else ("NCHW", "NHWC")
        for layout in (first, last):
            spec = layer_spec(layer, layout, layer["N"])
            case = CudnnCase(spec)
            runs[("cuDNN", layout)] = case.run_cudnn
            variants = ([("cp.async", None, False), (REFERENCE, {"tma": True}, True), ("shared", {"tma": True}, False)]
                        if layout == first else [("tma", {"tma": True}, False)])
            for name, tiles, hidden in variants:
                index.gather_terms = ((lambda alg: {**gather_terms(alg), "pixels_contiguous": False}) if hidden
                                      else gather_terms)
                try:
                    kernel = build("implicit_gemm", spec, tiles)
                finally:
                    index.gather_terms = gather_terms
                case.y.fill(float("nan"))
                kernel.launch([case.x, case.w], case.y)
                main_kernel = kernel.compiled.resources[kernel.plan.launches[-1].kernel]
                runs[(name, layout)] = lambda k=kernel, c=case: k.launch([c.x, c.w], c.y)
                rows.append({"layer": layer["name"], "layout": layout, "variant": name,
                             "shared_row_address": bool(kernel.plan.context.get("shared_row_address")),
                             "tiles": kernel.plan.tiles.describe(), "registers": main_kernel.registers,
                             "spill_bytes": main_kernel.spill_stores, "nan_left": bool(cupy.isnan(case.y).any()),
                             "relative_error_vs_cudnn": case.relative_error()})
        times = interleaved_medians(runs, args.rounds)
        flops = gemm_flops(spec)
        for row in rows:
            seconds = times[(row["variant"], row["layout"])]
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, vs_reference=times[(REFERENCE, first)] / seconds,
                       vs_cudnn=times[("cuDNN", row["layout"])] / seconds,
                       cudnn_tflops=flops / times[("cuDNN", row["layout"])] / 1e12)
        results += rows
        print(f"[{layer['name']}] " + ", ".join(f"{r['layout']} {r['variant']} {r['tflops']:.2f}" for r in rows),
              file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-shared-row-address.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':11} {'layout':6} {'variant':9} {'shared':6} {'regs':>4} {'spill':>5} {'ms':>8} {'TFLOP/s':>8} "
          f"{'vs old':>7} {'cuDNN':>6} {'vs cuDNN':>8} {'rel.err':>8} nan")
    for r in results:
        print(f"{r['layer']:11} {r['layout']:6} {r['variant']:9} {r['shared_row_address']!s:6} {r['registers']!s:>4} "
              f"{r['spill_bytes']!s:>5} {r['ms']:8.3f} {r['tflops']:8.2f} {r['vs_reference']:7.3f} {r['cudnn_tflops']:6.1f} "
              f"{r['vs_cudnn']:8.2f} {r['relative_error_vs_cudnn']:8.1e} {r['nan_left']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
