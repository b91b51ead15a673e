"""How a TMA implicit-GEMM consumer warp releases a ring stage (docs/perf.md, GEMM v17), on the GPU.

With `__syncwarp()` and one lane's `mbarrier.arrive`, the channels-first kernel (whose producer
warps refill a stage with cp.async copies that land within a few hundred cycles) read
overwritten data: 0.01-1 % of its output tiles came out wrong, in a different place every run.
The variants: the release as it was (an edit of a scratch copy of the templates); a
`__threadfence_block()` on every lane before it; every lane arriving (the empty barriers count 32
arrivals per consumer warp); the package takes the last for 8x8 micro-tiles and the fence for 16x8
(``implicit_gemm.releases_by_every_lane``, which the script overrides per variant).  Each is built through the
package for the layers in both layouts and both micro-tiles, checked against cuDNN in several
runs on NaN-poisoned outputs (elements off by more than 1 % of the mean output count as wrong),
and timed in interleaved rounds with cuDNN's fp32 in the same process.

    PYTHONPATH=$PWD python3 scripts/ab_stage_release.py [--out DIR] [--runs N] [LAYER ...]
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

FENCED = "            __threadfence_block();\n            __syncwarp();\n"


def without_fence(template: str) -> str:
    """The template with the fenced release's fence removed: the release before v17."""
    assert template.count(FENCED) == 1, "the fenced stage release moved: update FENCED"
    return template.replace(FENCED, "            __syncwarp();\n")


DIRECT_RELEASE = "            convgen_barrier_arrive(&empty[s]);"
DIRECT_COUNT = "convgen_barrier_init(&empty[s], {{ consumer_warps * 32 }});"


def direct_one_lane(template: str) -> str:
    """The direct tiled_tma template with the release before v17: a warp barrier, then one lane."""
    assert template.count(DIRECT_RELEASE) == 1 and template.count(DIRECT_COUNT) == 1, "the direct release moved"
    return (template.replace(DIRECT_RELEASE, "            __syncwarp();\n            if (tid % 32 == 0) convgen_barrier_arrive(&empty[s]);")
            .replace(DIRECT_COUNT, "convgen_barrier_init(&empty[s], {{ consumer_warps }});"))


VARIANTS = {  # name: (every lane arrives, template edit)
    "one lane": (False, without_fence),
    "fence, one lane": (False, None),
    "every lane": (True, None),
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "c3d_conv2"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3, help="checked runs per kernel")
    parser.add_argument("--layouts", choices=("both", "first", "last"), default="both",
                        help="channels-first (16x8 and 8x8 micro-tiles), channels-last (the heuristic's), or both")
    parser.add_argument("--direct", action="store_true",
                        help="instead: the direct family's tiled_tma kernel on filter_r1..r4, every lane against one lane")
    args = parser.parse_args()
    if args.direct:
        return direct(args)

    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families import implicit_gemm
    from codegen.families.gemm import flops as gemm_flops

    package_rule = implicit_gemm.releases_by_every_lane
    shapes = load_shapes()
    scratch = Path(tempfile.mkdtemp(prefix="ab-release-"))
    results = []
    for layer in select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers):
        three_d = "D" in layer
        layouts = ("NCDHW", "NDHWC") if three_d else ("NCHW", "NHWC")
        for layout in {"both": layouts, "first": layouts[:1], "last": layouts[1:]}[args.layouts]:
            spec = layer_spec(layer, layout, layer["N"])
            case = CudnnCase(spec)
            x, w, y = case.x, case.w, case.y
            scale = float(case.expected.abs().mean())
            runs = {"cuDNN": case.run_cudnn}
            rows = []
            micro_tiles = (16, 8) if not spec.layout.channels_last else (None,)
            for thread_m in micro_tiles:
                tiles = implicit_gemm.FAMILY.tma_tiles(spec, thread_m).to_dict()
                for variant, (every_lane, edit) in VARIANTS.items():
                    directory = (render.edited_templates(scratch, variant.replace(" ", "_").replace(",", ""), edit)
                                 if edit else render.PACKAGE_TEMPLATES)
                    implicit_gemm.releases_by_every_lane = lambda tiles, choice=every_lane: choice
                    try:
                        with render.templates_from(directory):
                            kernel = build("implicit_gemm", spec, tiles)
                    finally:
                        implicit_gemm.releases_by_every_lane = package_rule
                    wrong, errors = [], []
                    for _ in range(args.runs):
                        y.fill(float("nan"))
                        kernel.launch([x, w], y)
                        wrong.append(int(((case.as_torch(y).double() - case.expected).abs() > 0.01 * scale).sum()))
                        errors.append(case.relative_error())
                    name = f"{kernel.plan.tiles.thread_m}x8 {variant}"
                    runs[name] = lambda k=kernel: k.launch([x, w], y)
                    rows.append({"layer": layer["name"], "layout": layout, "config": name, "wrong_elements": wrong,
                                 "relative_error_vs_cudnn": max(errors), "tiles": kernel.plan.tiles.describe()})
            times = interleaved_medians(runs, args.rounds)
            flops = gemm_flops(spec)
            for row in rows:
                row.update(ms=times[row["config"]] * 1e3, tflops=flops / times[row["config"]] / 1e12,
                           cudnn_tflops=flops / times["cuDNN"] / 1e12)
            results += rows
            print(f"[{layer['name']} {layout}] " + ", ".join(f"{r['config']} {r['tflops']:.1f} {r['wrong_elements']}"
                                                           for r in rows), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-stage-release.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':10} {'layout':6} {'config':22} {'ms':>8} {'TFLOP/s':>8} {'cuDNN':>6} {'rel.err':>8}  wrong elements per run")
    for r in results:
        print(f"{r['layer']:10} {r['layout']:6} {r['config']:22} {r['ms']:8.3f} {r['tflops']:8.1f} {r['cudnn_tflops']:6.1f} "
              f"{r['relative_error_vs_cudnn']:8.1e}  {r['wrong_elements']}")
    return 0


def direct(args) -> int:
    """The direct tiled_tma kernel's release, every lane (the package) against one lane, on the
    single-channel filters (times in ms, interleaved, cuDNN in the same process)."""
    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, tiles_for

    scratch = Path(tempfile.mkdtemp(prefix="ab-release-direct-"))
    one_lane = render.edited_templates(scratch, "one_lane", direct_one_lane, template="direct.cu.j2")
    results = []
    for layer in load_shapes()["filter2d"]:
        spec = layer_spec(layer, "NCHW", layer["N"])
        case = CudnnCase(spec)
        x, w, y = case.x, case.w, case.y
        runs = {"cuDNN": case.run_cudnn}
        rows = []
        for variant, directory in (("every lane", render.PACKAGE_TEMPLATES), ("one lane", one_lane)):
            with render.templates_from(directory):
                kernel = build("direct", spec, tiles_for(spec, "tiled_tma"))
            y.fill(float("nan"))
            kernel.launch([x, w], y)
            runs[variant] = lambda k=kernel: k.launch([x, w], y)
            rows.append({"layer": layer["name"], "config": variant, "relative_error_vs_cudnn": case.relative_error()})
        times = interleaved_medians(runs, args.rounds)
        for row in rows:
            row.update(ms=times[row["config"]] * 1e3, cudnn_ms=times["cuDNN"] * 1e3)
        results += rows
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-stage-release-direct.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':10} {'config':11} {'ms':>7} {'cuDNN ms':>8} {'rel.err':>8}")
    for r in results:
        print(f"{r['layer']:10} {r['config']:11} {r['ms']:7.3f} {r['cudnn_ms']:8.3f} {r['relative_error_vs_cudnn']:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
