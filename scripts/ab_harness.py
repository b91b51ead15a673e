"""What the implicit-GEMM A/B scripts share (docs/perf.md): every tile configuration of a layer is
built through the package (compiled in parallel threads, as the tuner compiles its candidates),
launched once on a NaN-poisoned output and compared with cuDNN, then timed with cuDNN's fp32 in
interleaved rounds in the same process, so that clock drift falls on all of them alike.

Used as a module by the ``ab_*.py`` scripts beside it (run from the repo root with PYTHONPATH=$PWD).
"""
import argparse
import json
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

THREE_D_LAYOUT = {"NCHW": "NCDHW", "NHWC": "NDHWC"}
"""The 3D layout that stands for a 2D one in a script's ``--layouts``."""


def layer_specs(shapes: Path | None, names, layouts):
    """(layer, spec) for each layer of ``shapes`` (shapes.json's 2D and 3D sets where None) named in
    ``names`` (all where empty), in each of ``layouts``: 3D layers in the matching 3D layout."""
    from codegen.bench import benchmark_layers, layer_spec, select_layers

    groups = ("conv2d_mec", "conv3d") if shapes is None else ()
    for layer in select_layers(benchmark_layers(groups, shapes), names or None):
        for layout in dict.fromkeys(THREE_D_LAYOUT[x] if "D" in layer else x for x in layouts):
            yield layer, layer_spec(layer, layout, layer["N"])


def measure(layer_name: str, spec, configs: dict[str, dict], rounds: int, reference: str,
            jobs: int = 16, templates: dict[str, Path] | None = None) -> list[dict]:
    """One row per configuration of ``configs`` (name: tiles) on ``spec``: registers and spills,
    whether NaN was left, relative error to cuDNN, then median time, TFLOP/s, and the ratios to the
    ``reference`` configuration and to cuDNN.  ``templates`` names the configurations rendered from
    an edited copy of the templates (``render.edited_templates``), built one at a time since the
    template directory is global.  A configuration equal to an earlier one (tiles and templates)
    is left out: it is the same program, and timing it twice tells nothing."""
    import cupy

    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians
    from codegen.compile import resolve_arch
    from codegen.families.gemm import flops as gemm_flops

    arch = resolve_arch(None)
    templates = templates or {}
    distinct = {}
    for name, tiles in configs.items():
        if (tiles, templates.get(name)) not in [(t, templates.get(n)) for n, t in distinct.items()]:
            distinct[name] = tiles
    package = [name for name in distinct if name not in templates]
    with ThreadPoolExecutor(jobs) as pool:
        built = dict(zip(package, pool.map(lambda name: build("implicit_gemm", spec, distinct[name], arch), package)))
    for name in distinct:
        if name in templates:
            with render.templates_from(templates[name]):
                built[name] = build("implicit_gemm", spec, distinct[name], arch)
    kernels = {name: built[name] for name in distinct}
    case = CudnnCase(spec)
    x, w, y = case.x, case.w, case.y
    runs, rows = {"cuDNN": case.run_cudnn}, []
    for name, kernel in kernels.items():
        y.fill(float("nan"))
        kernel.launch([x, w], y)
        main_kernel = kernel.compiled.resources[kernel.plan.launches[-1].kernel]
        runs[name] = lambda k=kernel: k.launch([x, w], y)
        rows.append({"layer": layer_name, "layout": spec.layout.name, "config": name,
                     "tiles": kernel.plan.tiles.describe(), "registers": main_kernel.registers,
                     "spill_bytes": main_kernel.spill_stores, "stream_k": bool(kernel.plan.context.get("stream_k")),
                     "nan_left": bool(cupy.isnan(y).any()),
                     "relative_error_vs_cudnn": case.relative_error()})
    times = interleaved_medians(runs, rounds)
    flops = gemm_flops(spec)
    for row in rows:
        seconds = times[row["config"]]
        row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, vs_reference=times[reference] / seconds,
                   vs_cudnn=times["cuDNN"] / seconds, cudnn_tflops=flops / times["cuDNN"] / 1e12)
    best = max(rows, key=lambda r: r["tflops"])
    print(f"[{layer_name} {spec.layout.name}] cuDNN {rows[0]['cudnn_tflops']:.1f}, {reference} "
          f"{next(r['tflops'] for r in rows if r['config'] == reference):.1f}, best {best['config']} "
          f"{best['tflops']:.1f}", file=sys.stderr, flush=True)
    return rows


def print_table(rows: list[dict], reference: str) -> None:
    """The rows as one table (sk: the kernel has a stream-K tail), ratios to ``reference`` and to cuDNN."""
    width = max([len(r["layer"]) for r in rows] + [5])
    config_width = max([len(r["config"]) for r in rows] + [6])
    print(f"{'layer':{width}} {'layout':6} {'config':{config_width}} {'regs':>4} {'spill':>5} {'sk':>2} {'ms':>8} "
          f"{'TFLOP/s':>8} {'vs ' + reference:>{max(8, len(reference) + 3)}} {'vs cuDNN':>8} {'rel.err':>8} nan")
    for r in rows:
        print(f"{r['layer']:{width}} {r['layout']:6} {r['config']:{config_width}} {r['registers']:4d} "
              f"{r['spill_bytes']:5d} {int(r['stream_k']):2d} {r['ms']:8.3f} {r['tflops']:8.1f} "
              f"{r['vs_reference']:{max(8, len(reference) + 3)}.3f} {r['vs_cudnn']:8.2f} "
              f"{r['relative_error_vs_cudnn']:8.1e} {'NaN' if r['nan_left'] else '-'}")


def run(doc: str, candidates, reference: str, result_file: str, layouts=("NCHW",), shapes: Path | None = None,
        layers=(), rounds: int = 3, templates: dict[str, Path] | None = None) -> int:
    """The command line of an A/B over a shapes file (``doc``: the script's docstring, its first line
    the description; ``layouts``, ``shapes``, ``layers`` and ``rounds``: the defaults of its
    options): ``candidates(spec)`` names each layer's configurations, none to skip the layer
    (``templates``: as ``measure`` takes it); the rows go to ``result_file`` under --out after
    every layer, so a run cut short keeps what it measured, and as one table at the end."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=list(layers),
                        help=f"layers of the shapes file (default: {' '.join(layers) or 'all'})")
    parser.add_argument("--shapes", type=Path, default=shapes,
                        help=f"a shapes file (default: {shapes or 'shapes.json, its 2D and 3D layers'})")
    parser.add_argument("--layouts", nargs="+", default=list(layouts),
                        help="2D layers run in the 2D layouts given, 3D layers in the matching 3D ones")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=rounds)
    args = parser.parse_args()

    args.out.mkdir(parents=True, exist_ok=True)
    results = []
    for layer, spec in layer_specs(args.shapes, args.layers, args.layouts):
        configs = candidates(spec)
        if configs:
            results += measure(layer["name"], spec, configs, args.rounds, reference, templates=templates)
            (args.out / result_file).write_text(json.dumps(results, indent=1))
    print_table(results, reference)
    return 0
