"""A/B of the gathered TMA kernel's producer addressing on channels-first data (docs/perf.md,
GEMM v24 and v25), on the GPU, each variant the package's tma=True kernel with later steps hidden:

- ``per copy``: one 64-bit address a copy (v17 to v23);
- ``shared``: one address a channel for all of a thread's pixels where pixels are contiguous (v24);
- ``pairs``: besides, a thread's pixels in pairs 2j, 2j + 1 from one address a channel, as two
  4-byte copies, each slice's tap decoded in the loop (v25);
- ``table``: besides, each slice's offset and wide flag from a constant table, and a pair one
  8-byte copy at the taps whose W offset is even (v25, as shipped).

The portable cp.async kernel and the channels-last TMA kernel on the same layer are yardsticks.
Each is built through the package, checked against cuDNN on NaN-poisoned outputs and timed in
interleaved rounds with cuDNN's fp32 in the same process.

    PYTHONPATH=$PWD python3 scripts/ab_gather_addressing.py [--out DIR] [--rounds N] [LAYER ...]
"""
import argparse
import contextlib
import json
import sys
from pathlib import Path

REFERENCE = "per copy"
"""The variant the ratios are taken against."""
VARIANTS = {  # name: (pixels_contiguous, pairs_in_rows, slice table) left as the index algebra finds them
    "per copy": (False, False, False),
    "shared": (True, False, False),
    "pairs": (True, True, False),
    "table": (True, True, True),
}


@contextlib.contextmanager
def hidden(contiguous: bool, pairs: bool, table: bool):
    """Plan with the index algebra's ``pixels_contiguous``/``pairs_in_rows`` turned off where
    False, and without the slice table where ``table`` is False."""
    from codegen import index
    from codegen.families import implicit_gemm

    gather_terms, limit = index.gather_terms, implicit_gemm.SLICE_TABLE_LIMIT

    def terms(alg):
        found = gather_terms(alg)
        return {**found, "pixels_contiguous": found["pixels_contiguous"] and contiguous,
                "pairs_in_rows": found["pairs_in_rows"] and pairs}
    index.gather_terms = terms
    implicit_gemm.SLICE_TABLE_LIMIT = limit if table else -1
    try:
        yield
    finally:
        index.gather_terms, implicit_gemm.SLICE_TABLE_LIMIT = gather_terms, limit


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv8", "c3d_conv2", "c3d_conv3", "unet3d_l1"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=7)
    args = parser.parse_args()

    import cupy

    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    layers = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers)
    results = []
    for layer in layers:
        rows, runs = [], {}
        first, last = ("NCDHW", "NDHWC") if "D" in layer else ("NCHW", "NHWC")
        for layout in (first, last):
            spec = layer_spec(layer, layout, layer["N"])
            case = CudnnCase(spec)
            runs[("cuDNN", layout)] = case.run_cudnn
            variants = ([("cp.async", None, VARIANTS["table"])]
                        + [(name, {"tma": True}, hide) for name, hide in VARIANTS.items()]
                        if layout == first else [("tma", {"tma": True}, VARIANTS["table"])])
            for name, tiles, hide in variants:
                with hidden(*hide):
                    kernel = build("implicit_gemm", spec, tiles)
                case.y.fill(float("nan"))
                kernel.launch([case.x, case.w], case.y)
                main_kernel = kernel.compiled.resources[kernel.plan.launches[-1].kernel]
                context = kernel.plan.context
                runs[(name, layout)] = lambda k=kernel, c=case: k.launch([c.x, c.w], c.y)
                rows.append({"layer": layer["name"], "layout": layout, "variant": name,
                             "addressing": "/".join(flag for flag, on in (
                                 ("shared", context.get("shared_row_address")), ("pairs", context.get("gather_pairs")),
                                 ("wide-" + str(context.get("gather_wide")), context.get("gather_pairs")),
                                 ("table", context.get("slice_table"))) if on) or "-",
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
    (args.out / "ab-gather-addressing.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':11} {'layout':6} {'variant':9} {'addressing':28} {'regs':>4} {'spill':>5} {'ms':>8} {'TFLOP/s':>8} "
          f"{'vs copy':>7} {'cuDNN':>6} {'vs cuDNN':>8} {'rel.err':>8} nan")
    for r in results:
        print(f"{r['layer']:11} {r['layout']:6} {r['variant']:9} {r['addressing']:28} {r['registers']!s:>4} "
              f"{r['spill_bytes']!s:>5} {r['ms']:8.3f} {r['tflops']:8.2f} {r['vs_reference']:7.3f} {r['cudnn_tflops']:6.1f} "
              f"{r['vs_cudnn']:8.2f} {r['relative_error_vs_cudnn']:8.1e} {r['nan_left']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
