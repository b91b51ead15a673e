"""im2win held to cuDNN's extra memory by a smaller batch chunk, and what that costs (docs/perf-history.md,
GEMM v26).

Issue 4 asks for im2win's extra memory at or below cuDNN fp32's on every layer.  im2win's
workspace is the window tensor of ``batch_chunk`` images, and the heuristic picks the largest chunk
within ``im2win.WINDOW_BUDGET``.  For each layer and layout this script measures cuDNN's extra
memory (as ``bench conv`` does), takes the largest divisor of N whose window tensor fits under it
(larger than the heuristic's chunk where cuDNN's workspace is large), and times im2win at that
chunk against the heuristic's chunk and cuDNN, interleaved, after checking each against cuDNN on
a NaN-poisoned output.  Where not even one image's tensor fits, it says so.  Prints a table and
writes im2win-within-cudnn-memory.json under --out.

When to use it: after a change to im2win's window tensor or to its batch-chunk heuristic, to see
on which layers im2win can meet cuDNN's memory and at what speed (``convgen bench conv`` shows the
same in its "(<=cuDNN MiB)" column, for the chunk ``tiles_within`` picks).

Needs a CUDA GPU, PyTorch (for cuDNN) and the convgen package installed; runs from any folder.

example:
  python scripts/im2win_within_cudnn_memory.py --layouts NCHW NHWC --rounds 5 conv4 conv8
"""
import argparse
import json
import math
import sys
from pathlib import Path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layers", nargs="*", metavar="LAYER",
                        help="layers among shapes.json's twelve 2D and four 3D ones (default: all)")
    parser.add_argument("--layouts", nargs="+", default=["NCHW", "NCDHW", "NHWC", "NDHWC"],
                        help="layouts to run, each on the layers of its dimensions (default: all four)")
    parser.add_argument("--rounds", type=int, default=3,
                        help="interleaved timing rounds; each kernel reports the median of its rounds (default 3)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="folder for im2win-within-cudnn-memory.json (default bench-out)")
    args = parser.parse_args()

    import cupy
    import torch

    from codegen import index
    from codegen.api import build
    from codegen.bench.conv import extra_bytes
    from codegen.bench.cudnn import CudnnCase, cudnn_extra_bytes
    from codegen.bench.layers import layer_spec, load_shapes, select_layers
    from codegen.bench.timing import interleaved_medians
    from codegen.families import im2win
    from codegen.families.gemm_tiles import flops as gemm_flops
    from codegen.spec import replace
    from codegen.terms.im2win import window_tensor_shape

    shapes = load_shapes()
    results = []
    for layer in select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers or None):
        dims = 3 if "D" in layer else 2
        for layout in [l for l in args.layouts if len(l) - 2 == dims]:
            spec = layer_spec(layer, layout, layer["N"])
            case = CudnnCase(spec)
            cudnn_bytes = cudnn_extra_bytes(case.run_cudnn, case.y.nbytes)
            per_image = math.prod(window_tensor_shape(index.IndexAlgebra(replace(spec, n=1)))) * 4
            heuristic = im2win.FAMILY.default_tiles(spec)
            fitting = [d for d in range(1, spec.n + 1) if spec.n % d == 0 and d * per_image <= cudnn_bytes]
            row = {"layer": layer["name"], "layout": layout, "cudnn_extra_mib": cudnn_bytes / 2**20,
                   "one_image_mib": per_image / 2**20, "heuristic_chunk": heuristic.batch_chunk,
                   "fitting_chunk": max(fitting) if fitting else None}
            chunks = {"heuristic": heuristic.batch_chunk}
            if fitting and max(fitting) != heuristic.batch_chunk:
                chunks["within cuDNN"] = max(fitting)
            runs = {"cuDNN": case.run_cudnn}
            for name, chunk in chunks.items():
                kernel = build("im2win", spec, {**heuristic.to_dict(), "batch_chunk": chunk})
                case.y.fill(float("nan"))
                kernel.launch([case.x, case.w], case.y)
                row[f"{name} extra_mib"] = extra_bytes(kernel.plan) / 2**20
                row[f"{name} relative_error"] = case.relative_error()
                runs[name] = lambda k=kernel, c=case: k.launch([c.x, c.w], c.y)
            times = interleaved_medians(runs, args.rounds)
            flops = gemm_flops(spec)
            for name, seconds in times.items():
                row[f"{name} tflops"] = flops / seconds / 1e12
            results.append(row)
            print(f"[{layer['name']} {layout}] " + ", ".join(f"{k} {v:.3g}" for k, v in row.items()
                                                             if isinstance(v, float)), file=sys.stderr, flush=True)
            del case, runs
            cupy.get_default_memory_pool().free_all_blocks()
            torch.cuda.empty_cache()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "im2win-within-cudnn-memory.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':11} {'layout':6} {'cuDNN MiB':>9} {'1 image':>8} {'chunk':>5} {'MiB':>7} {'TFLOP/s':>7} "
          f"{'fit':>4} {'MiB':>7} {'TFLOP/s':>7} {'ratio':>6} {'cuDNN TFLOP/s':>13}")
    for r in results:
        if r["fitting_chunk"] is None:
            fit = f"{'none: one image exceeds cuDNN':>34}"
        elif "within cuDNN tflops" in r:
            fit = (f"{r['fitting_chunk']:4d} {r['within cuDNN extra_mib']:7.1f} {r['within cuDNN tflops']:7.1f} "
                   f"{r['within cuDNN tflops'] / r['heuristic tflops']:6.3f}")
        else:
            fit = f"{'heuristic chunk already fits':>34}"
        print(f"{r['layer']:11} {r['layout']:6} {r['cudnn_extra_mib']:9.1f} {r['one_image_mib']:8.2f} "
              f"{r['heuristic_chunk']:5d} {r['heuristic extra_mib']:7.1f} {r['heuristic tflops']:7.1f} {fit} "
              f"{r['cuDNN tflops']:13.1f}")
    met = sum(r["fitting_chunk"] is not None for r in results)
    print(f"im2win within cuDNN's extra memory: {met} of {len(results)} layer-layouts with the right chunk; "
          f"{sum((r['fitting_chunk'] or 0) >= r['heuristic_chunk'] for r in results)} with the heuristic's")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
