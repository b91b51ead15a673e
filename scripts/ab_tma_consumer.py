"""A/B of the TMA implicit-GEMM consumer's shape (docs/perf.md, GEMM v15), on the GPU.

v14's profile left the 8x8 kernel at 2.25 warps per scheduler, 10 % of its issue slots not FMAs
and 2.5 % of cycles without an instruction fetched (a 32-channel slice unrolled is 36 KB of
SASS).  The configurations here: the heuristic; the 8x8 kernel with a single producer warp
instead of a producer warpgroup that hands its registers to the consumers (``setmaxnreg``,
sm_90a); 16x8 micro-tiles (half the shared loads per FMA, about 205 registers) with the slice's
chunk loop rolled, as the template has it, or unrolled (an edit of a scratch copy of the
templates); for 64-channel layers 16x8 tiles of 256 x 64 (4 consumer warps) beside the
heuristic's 512 x 64 (8 warps, two im2col boxes).  Each is built through the package, checked against cuDNN on NaN-poisoned
outputs and timed in interleaved rounds with cuDNN's channels-last fp32 in the same process.

    PYTHONPATH=$PWD python3 scripts/ab_tma_consumer.py [--out DIR] [--only NAME ...] [LAYER ...]
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

ROLLED = "#pragma unroll 1\n"
ROWS16 = {"thread_m": 16, "warp_m": 64}
CONFIGS = {  # name: (micro-tile rows for tma_tiles, tile changes, 16-row chunk loop unrolled, register split kept)
    "heuristic": (None, {}, False, True),
    "8x8": (8, {}, False, True),
    "8x8 one producer": (8, {}, False, False),
    "16x8": (16, {}, False, True),
    "16x8 unrolled": (16, {}, True, True),
    "16x8 256x64": (16, {"block_m": 256, "block_n": 64, "stages": 5}, False, True),
}


def unrolled(template: str) -> str:
    """The template with the 16-row consumer's chunk loop unrolled."""
    assert template.count(ROLLED) == 1, "the 16-row chunk loop moved: update ROLLED"
    return template.replace(ROLLED, "#pragma unroll\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "c3d_conv2"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="configurations to run (default all)")
    args = parser.parse_args()

    import cupy

    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families import gemm, implicit_gemm
    from codegen.families.gemm import flops as gemm_flops
    from codegen.spec import SpecError

    shapes = load_shapes()
    layers = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers)
    results = []
    keep_split = gemm.tma_register_split
    scratch = Path(tempfile.mkdtemp(prefix="ab-tma-"))
    for layer in layers:
        layout = "NDHWC" if "D" in layer else "NHWC"
        spec = layer_spec(layer, layout, layer["N"])
        case = CudnnCase(spec)
        x, w, y = case.x, case.w, case.y
        runs = {"cuDNN": case.run_cudnn}
        rows = []
        for name, (thread_rows, change, unroll, split) in CONFIGS.items():
            if args.only and name not in args.only and name != "heuristic":
                continue
            directory = render.edited_templates(scratch, "unrolled", unrolled) if unroll else render.PACKAGE_TEMPLATES
            try:
                if not split:
                    gemm.tma_register_split = lambda tiles: None
                base = implicit_gemm.FAMILY.tma_tiles(spec, thread_rows).to_dict()
                with render.templates_from(directory):
                    kernel = build("implicit_gemm", spec, {**base, **change})
            except SpecError as error:
                print(f"[{layer['name']}] {name}: refused ({error})", file=sys.stderr)
                continue
            finally:
                gemm.tma_register_split = keep_split
            y.fill(float("nan"))
            kernel.launch([x, w], y)
            main_kernel = kernel.compiled.resources[kernel.plan.launches[-1].kernel]
            runs[name] = lambda k=kernel: k.launch([x, w], y)
            rows.append({"layer": layer["name"], "layout": layout, "config": name, "tiles": kernel.plan.tiles.describe(),
                         "arch": kernel.compiled.arch, "registers": main_kernel.registers,
                         "spill_bytes": main_kernel.spill_stores, "nan_left": bool(cupy.isnan(y).any()),
                         "relative_error_vs_cudnn": case.relative_error()})
        times = interleaved_medians(runs, args.rounds)
        flops = gemm_flops(spec)
        cudnn_seconds = times["cuDNN"]
        heuristic = times["heuristic"]
        for row in rows:
            seconds = times[row["config"]]
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, vs_heuristic=heuristic / seconds,
                       vs_cudnn=cudnn_seconds / seconds, cudnn_tflops=flops / cudnn_seconds / 1e12)
        results += rows
        print(f"[{layer['name']}] cuDNN {flops / cudnn_seconds / 1e12:.1f}, "
              + ", ".join(f"{r['config']} {r['tflops']:.1f}" for r in rows), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-tma-consumer.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':10} {'config':16} {'arch':6} {'regs':>4} {'spill':>5} {'ms':>8} {'TFLOP/s':>8} {'vs heur':>7} "
          f"{'vs cuDNN':>8} {'rel.err':>8} nan")
    for r in results:
        print(f"{r['layer']:10} {r['config']:16} {r['arch']:6} {r['registers']!s:>4} {r['spill_bytes']!s:>5} "
              f"{r['ms']:8.3f} {r['tflops']:8.1f} {r['vs_heuristic']:7.3f} {r['vs_cudnn']:8.2f} "
              f"{r['relative_error_vs_cudnn']:8.1e} {r['nan_left']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
