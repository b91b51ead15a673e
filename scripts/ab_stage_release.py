"""How a TMA consumer warp releases a ring stage (docs/perf.md, GEMM v17), on the GPU.

With `__syncwarp()` and one lane's `mbarrier.arrive`, the channels-first implicit GEMM (whose
producer warps refill a stage with cp.async copies that land within a few hundred cycles) read
overwritten data: 0.01-1 % of its output tiles came out wrong, in a different place every run.
Every lane arriving (32 arrivals a warp) made it rarer but not gone (an emitted unet3d_l1 file
still failed its self-test); a `__threadfence_block()` on every lane before the release, which
the package now has in every TMA kernel, passed everything.  The variants: the release before
v17, the package's, and every lane arriving, the first and last as edits of a scratch copy of
the templates; built through the package for the layers in both layouts and both micro-tiles,
checked against cuDNN in several runs on NaN-poisoned outputs (elements off by more than 1 % of
the mean output count as wrong), and timed in interleaved rounds with cuDNN's fp32 in the same
process.  ``--direct``: the direct family's tiled_tma kernel on the single-channel filters.

    PYTHONPATH=$PWD python3 scripts/ab_stage_release.py [--out DIR] [--runs N] [--layouts both|first|last] [LAYER ...]
    PYTHONPATH=$PWD python3 scripts/ab_stage_release.py --direct [--out DIR]
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

FENCED = "            __threadfence_block();\n            __syncwarp();\n"
RELEASES = {  # template: (one lane's arrive, the empty barriers' arrival count)
    "implicit_gemm.cu.j2": ("            if (lane == 0) convgen_barrier_arrive(&empty[stage]);",
                            "convgen_barrier_init(&empty[s], {{ consumers }});"),
    "direct.cu.j2": ("            if (tid % 32 == 0) convgen_barrier_arrive(&empty[s]);",
                     "convgen_barrier_init(&empty[s], {{ consumer_warps }});"),
}


def without_fence(template: str) -> str:
    """The stage release before v17: a warp barrier, then one lane arrives."""
    assert template.count(FENCED) == 1, "the fenced stage release moved: update FENCED"
    return template.replace(FENCED, "            __syncwarp();\n")


def every_lane(name: str):
    """An edit of template ``name``: every lane arrives (32 arrivals a warp), no fence."""
    arrive, count = RELEASES[name]

    def edit(template: str) -> str:
        assert template.count(FENCED + arrive) == 1 and template.count(count) == 1, "the stage release moved"
        return (template.replace(FENCED + arrive, "            " + arrive.split(") ", 1)[1])
                .replace(count, count.replace(" }}", " * 32 }}")))
    return edit


VARIANTS = {"one lane": without_fence, "fence, one lane": None, "every lane": every_lane("implicit_gemm.cu.j2")}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "c3d_conv2"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--runs", type=int, default=3, help="checked runs per kernel")
    parser.add_argument("--layouts", choices=("both", "first", "last"), default="both",
                        help="channels-first (16x8 and 8x8 micro-tiles), channels-last (the heuristic's), or both")
    parser.add_argument("--direct", action="store_true",
                        help="instead: the direct family's tiled_tma kernel on filter_r1..r4")
    args = parser.parse_args()
    if args.direct:
        return direct(args)

    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families import implicit_gemm
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    scratch = Path(tempfile.mkdtemp(prefix="ab-release-"))
    results = []
    for layer in select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers):
        layouts = ("NCDHW", "NDHWC") if "D" in layer else ("NCHW", "NHWC")
        for layout in {"both": layouts, "first": layouts[:1], "last": layouts[1:]}[args.layouts]:
            spec = layer_spec(layer, layout, layer["N"])
            case = CudnnCase(spec)
            x, w, y = case.x, case.w, case.y
            scale = float(case.expected.abs().mean())
            runs = {"cuDNN": case.run_cudnn}
            rows = []
            for thread_m in (16, 8) if not spec.layout.channels_last else (None,):
                tiles = implicit_gemm.FAMILY.tma_tiles(spec, thread_m).to_dict()
                for variant, edit in VARIANTS.items():
                    directory = (render.edited_templates(scratch, variant.replace(" ", "_").replace(",", ""), edit)
                                 if edit else render.PACKAGE_TEMPLATES)
                    with render.templates_from(directory):
                        kernel = build("implicit_gemm", spec, tiles)
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
    """The direct tiled_tma kernel's release, fenced (the package) against one lane and every lane,
    on the single-channel filters (ms, interleaved rounds, cuDNN in the same process)."""
    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, tiles_for

    scratch = Path(tempfile.mkdtemp(prefix="ab-release-direct-"))
    variants = {"fence, one lane": render.PACKAGE_TEMPLATES,
                "one lane": render.edited_templates(scratch, "one_lane", without_fence, template="direct.cu.j2"),
                "every lane": render.edited_templates(scratch, "every_lane", every_lane("direct.cu.j2"),
                                                      template="direct.cu.j2")}
    results = []
    for layer in load_shapes()["filter2d"]:
        spec = layer_spec(layer, "NCHW", layer["N"])
        case = CudnnCase(spec)
        x, w, y = case.x, case.w, case.y
        runs = {"cuDNN": case.run_cudnn}
        rows = []
        for variant, directory in variants.items():
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
    print(f"{'layer':10} {'config':16} {'ms':>7} {'cuDNN ms':>8} {'rel.err':>8}")
    for r in results:
        print(f"{r['layer']:10} {r['config']:16} {r['ms']:7.3f} {r['cudnn_ms']:8.3f} {r['relative_error_vs_cudnn']:8.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
