"""A/B of the TMA kernel's stream-K tail (docs/perf.md, GEMM v15 and v16), on the GPU.

v15 measured the 16x8 kernels 6-9 % slower with the stream-K tail and left the cause open; v16
found it with this script.  The configurations, on the heuristic's 16x8 tiles (8x8 with
--thread-m 8): whole tiles only; the hybrid stream-K tail (forced on, whatever the package would
choose), in the kernel or in a second launch after the rounds of whole tiles; the hybrid with
plain stores where shared tiles take atomic adds (an edit of a scratch copy of the templates,
wrong by design and its error shows it: timing only, to price the atomics).  ``--timeline``
(with ``--profile``) instead prints, for every block, the global timer when it started, when it
reached the first tile past the data-parallel rounds, and when it finished: where the time goes,
rounds or tail.  Beside the benchmark layers, ``even`` is a conv8-like spec (33 images of
130x130) whose 2,112 tiles fill 16 rounds on 132 SMs exactly: the hybrid has no tail there, and
with no tail steps the compiler drops the tail's code.  Each kernel is checked against cuDNN on
a NaN-poisoned output and timed in interleaved rounds with cuDNN's channels-last fp32 in the
same process.

    PYTHONPATH=$PWD python3 scripts/ab_stream_k.py [LAYER ...] [--thread-m 8] [--out DIR] [--only NAME ...]
    PYTHONPATH=$PWD ncu --clock-control none -k regex:implicit_gemm_tma python3 scripts/ab_stream_k.py --profile NAME LAYER
    PYTHONPATH=$PWD python3 scripts/ab_stream_k.py --profile NAME --timeline LAYER
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

SHARED_TILE_STORE = "if (oc < {{ GEMM_N }} && whole)"
TIMER = 'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));'
EDITS = {  # scratch-template edit: [(text, replacement), ...]
    "no atomics": [(SHARED_TILE_STORE, "if (oc < {{ GEMM_N }})")],
    # Each block's consumer warp 0 prints when it started, when it reached the first tile past the
    # data-parallel rounds, and when it finished (nanoseconds of the global timer).
    "timeline": [
        ("    float acc[{{ TM }}][8];\n",
         "    float acc[{{ TM }}][8];\n    unsigned long long now, began, tail_began = 0;\n    " + TIMER + "\n    began = now;\n"),
        ("            for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;\n        }\n",
         "            for (int j = 0; j < 8; ++j) acc[i][j] = 0.0f;\n        }\n"
         "        if (!tail_began && tile >= {{ dp_rounds * grid_blocks }}) { " + TIMER + " tail_began = now; }\n"),
        ("{%- endif %}\n}\n{%- endmacro %}\n\n{#- The TMA kernel (tiles.tma)",
         "{%- endif %}\n    " + TIMER + "\n"
         '    if (threadIdx.x == 0) printf("timeline %d %llu %llu %llu\\n", blockIdx.x, began, tail_began, now);\n'
         "}\n{%- endmacro %}\n\n{#- The TMA kernel (tiles.tma)"),
    ],
}
CONFIGS = {  # name: (stream-K forced on, tail in a launch of its own, scratch-template edit or None)
    "whole tiles": (False, False, None),
    "hybrid": (True, False, None),
    "hybrid, tail launch": (True, True, None),
    "hybrid, no atomics": (True, False, "no atomics"),
}
EVEN = {"name": "even", "N": 33, "C": 64, "H": 130, "W": 130, "K": 128, "R": 3, "S": 3,
        "stride": [1, 1], "padding": [0, 0], "dilation": [1, 1]}


def edited(template: str, edit: str) -> str:
    """``template`` with the replacements of ``EDITS[edit]``, each of whose texts it holds once."""
    for text, replacement in EDITS[edit]:
        assert template.count(text) == 1, f"the template text of '{edit}' moved: update EDITS"
        template = template.replace(text, replacement)
    return template


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "even"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--thread-m", type=int, choices=(8, 16), default=16, help="micro-tile rows (default 16)")
    parser.add_argument("--only", nargs="+", choices=list(CONFIGS), help="configurations to run (default all)")
    parser.add_argument("--profile", choices=list(CONFIGS), help="launch this configuration three times, no timing (for ncu)")
    parser.add_argument("--timeline", action="store_true", help="with --profile: print each block's start, tail start and "
                        "end from the global timer (a scratch edit that replaces the configuration's own)")
    args = parser.parse_args()

    import cupy

    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families import implicit_gemm
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    layers = select_layers(shapes["conv2d_mec"] + shapes["conv3d"] + [EVEN], args.layers)
    chosen = [args.profile] if args.profile else [c for c in CONFIGS if not args.only or c in args.only]
    results = []
    keep_choice = implicit_gemm.takes_stream_k, implicit_gemm.tail_in_own_launch
    scratch = Path(tempfile.mkdtemp(prefix="ab-stream-k-"))
    for layer in layers:
        layout = "NDHWC" if "D" in layer else "NHWC"
        spec = layer_spec(layer, layout, layer["N"])
        case = CudnnCase(spec)
        x, w, y = case.x, case.w, case.y
        runs = {} if args.profile else {"cuDNN": case.run_cudnn}
        rows = []
        for name in chosen:
            forced, own_launch, edit = CONFIGS[name]
            if args.timeline:
                edit = "timeline"
            directory = (render.edited_templates(scratch, edit.replace(" ", "-"), lambda text, e=edit: edited(text, e))
                         if edit else render.PACKAGE_TEMPLATES)
            implicit_gemm.takes_stream_k = lambda tiles, count, blocks, on=forced: on
            implicit_gemm.tail_in_own_launch = lambda tiles, on=own_launch: on
            try:
                with render.templates_from(directory):
                    kernel = build("implicit_gemm", spec, implicit_gemm.FAMILY.tma_tiles(spec, args.thread_m).to_dict())
            finally:
                implicit_gemm.takes_stream_k, implicit_gemm.tail_in_own_launch = keep_choice
            context = kernel.plan.context
            y.fill(float("nan"))
            kernel.launch([x, w], y)
            if args.profile:
                for _ in range(2):
                    kernel.launch([x, w], y)
                cupy.cuda.Device().synchronize()
                continue
            main_kernel = kernel.compiled.resources[context["kernel"]]
            runs[name] = lambda k=kernel: k.launch([x, w], y)
            rows.append({"layer": layer["name"], "config": name, "tiles": kernel.plan.tiles.describe(),
                         "stream_k": context["stream_k"], "dp_rounds": context["dp_rounds"],
                         "tiles_total": context["tiles_total"], "shared_tiles": context["split_tiles"],
                         "registers": main_kernel.registers, "spill_bytes": main_kernel.spill_stores,
                         "nan_left": bool(cupy.isnan(y).any()), "relative_error_vs_cudnn": case.relative_error()})
        if args.profile:
            continue
        times = interleaved_medians(runs, args.rounds)
        flops = gemm_flops(spec)
        cudnn_seconds = times["cuDNN"]
        whole = times[chosen[0]]
        for row in rows:
            seconds = times[row["config"]]
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, vs_first=whole / seconds,
                       vs_cudnn=cudnn_seconds / seconds, cudnn_tflops=flops / cudnn_seconds / 1e12)
        results += rows
        print(f"[{layer['name']}] cuDNN {flops / cudnn_seconds / 1e12:.1f}, "
              + ", ".join(f"{r['config']} {r['tflops']:.1f}" for r in rows), file=sys.stderr, flush=True)
    if args.profile:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-stream-k.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':8} {'config':26} {'rounds':>6} {'shared':>6} {'regs':>4} {'spill':>5} {'ms':>8} {'TFLOP/s':>8} "
          f"{'vs 1st':>7} {'vs cuDNN':>8} {'rel.err':>8} nan")
    for r in results:
        print(f"{r['layer']:8} {r['config']:26} {r['dp_rounds']:>6} {r['shared_tiles']:>6} {r['registers']!s:>4} "
              f"{r['spill_bytes']!s:>5} {r['ms']:8.3f} {r['tflops']:8.1f} {r['vs_first']:7.3f} {r['vs_cudnn']:8.2f} "
              f"{r['relative_error_vs_cudnn']:8.1e} {r['nan_left']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
