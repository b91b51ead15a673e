"""Race stress for the TMA kernels on the GPU: each launched again and again on the benchmark
layers, every launch checked against cuDNN fp32.

When to use it: after a change to a TMA kernel (the implicit GEMM's sm_90 kernel, the direct
family's tiled_tma) or to the barriers of its pipeline, before trusting its timings; gpu_tier.sh
runs it as its stress-tma step.  A stage-release race shows up as a few output tiles wrong in some
runs and in different places each time (docs/perf-history.md, GEMM v17 and v18): the property tests' small
specs and single launches rarely meet it, the benchmark layers did.

What it runs: the implicit GEMM on every layer its TMA kernel takes, in both layouts (channels-
first: A gathered by the producer warps), with 16x8 and 8x8 micro-tiles; the direct family's
tiled_tma on the single-channel filters.  Every launch writes a NaN-poisoned output, checked
against cuDNN fp32 computed once in the same process; an element counts as wrong when it is NaN or
off by more than 1 % of the mean output magnitude, four orders of magnitude above fp32 rounding.
Kernels compile first in parallel processes into the disk cache.  Prints a table, writes
stress-tma.json under --out, and exits 1 if any run had a wrong element.

Needs a CUDA GPU, PyTorch (for cuDNN) and the convgen package installed; runs from any folder.

example:
  python scripts/stress_tma.py --runs 20 conv8 c3d_conv2
"""
import argparse
import json
import multiprocessing
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path


def cases(layer_names, shapes_file: Path | None = None) -> list[tuple[str, str, dict, object]]:
    """(layer, micro-tile label, tiles, spec) of every TMA kernel to stress, on the benchmark layers
    or on those of ``shapes_file``."""
    from codegen.bench.direct import tiles_for
    from codegen.bench.layers import benchmark_layers, layer_spec, load_shapes, select_layers
    from codegen.families import gemm_heuristic, implicit_gemm
    from codegen.spec import SpecError

    shapes = load_shapes()
    found = []
    for layer in select_layers(benchmark_layers(("conv2d_mec", "conv3d"), shapes_file), layer_names):
        for layout in ("NCDHW", "NDHWC") if "D" in layer else ("NCHW", "NHWC"):
            spec = layer_spec(layer, layout, layer["N"])
            if not gemm_heuristic.tma_suits(spec):
                continue
            for thread_m in (16, 8):
                try:
                    tiles = gemm_heuristic.tma_tiles(spec, thread_m)
                    implicit_gemm.FAMILY.plan(spec, tiles)
                except SpecError:
                    continue
                found.append((layer["name"], f"implicit_gemm {thread_m}x8", tiles.to_dict(), spec))
    if not layer_names and shapes_file is None:
        for layer in shapes["filter2d"]:
            spec = layer_spec(layer, "NCHW", layer["N"])
            found.append((layer["name"], "direct tiled_tma", tiles_for(spec, "tiled_tma"), spec))
    return found


def compile_one(case) -> str:
    """Build one case in a worker process, which leaves its cubin in the disk cache."""
    from codegen.api import build

    _, label, tiles, spec = case
    build(label.split()[0], spec, tiles)
    return label


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("layers", nargs="*", help="layers of shapes.json or of --shapes (default: all, and the "
                        "filters where no --shapes is given)")
    parser.add_argument("--shapes", type=Path, help="a shapes file of the package's form (default: shapes.json)")
    parser.add_argument("--runs", type=int, default=10, help="checked launches per kernel (default 10)")
    parser.add_argument("--jobs", type=int, default=12, help="compiling processes (default 12)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="folder for stress-tma.json (default bench-out)")
    args = parser.parse_args()

    from codegen.api import build
    from codegen.bench.cudnn import CudnnCase

    todo = cases(args.layers, args.shapes)
    start = time.perf_counter()
    with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        for done, _ in enumerate(pool.map(compile_one, todo), 1):
            print(f"\rcompiled {done}/{len(todo)}", end="", file=sys.stderr, flush=True)
    print(f" in {time.perf_counter() - start:.0f} s", file=sys.stderr)

    results, checked = [], {}
    for name, label, tiles, spec in todo:
        key = spec.describe()
        if key not in checked:
            checked.clear()         # one layer's buffers at a time
            checked[key] = CudnnCase(spec)
        case = checked[key]
        x, w, y = case.x, case.w, case.y
        scale = float(case.expected.abs().mean())
        kernel = build(label.split()[0], spec, tiles)
        wrong, errors = [], []
        for _ in range(args.runs):
            y.fill(float("nan"))
            kernel.launch([x, w], y)
            diff = (case.as_torch(y).double() - case.expected).abs()
            wrong.append(int((diff.isnan() | (diff > 0.01 * scale)).sum()))
            errors.append(case.relative_error())
        row = {"layer": name, "layout": spec.layout.value, "kernel": label, "tiles": kernel.plan.tiles.describe(),
               "runs": args.runs, "wrong_elements": wrong, "worst_relative_error": max(errors)}
        results.append(row)
        print(f"[{name} {spec.layout.value} {label}] wrong {wrong}, worst {max(errors):.1e}", file=sys.stderr, flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "stress-tma.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':12} {'layout':6} {'kernel':20} {'runs':>4} {'bad runs':>8} {'worst rel.err':>13}")
    for r in results:
        bad = sum(1 for n in r["wrong_elements"] if n)
        print(f"{r['layer']:12} {r['layout']:6} {r['kernel']:20} {r['runs']:4} {bad:8} {r['worst_relative_error']:13.1e}")
    failed = [r for r in results if any(r["wrong_elements"])]
    print(f"{len(results)} kernels x {args.runs} runs: {len(failed)} with wrong elements")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
