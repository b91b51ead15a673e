"""``convgen bench conv``: the convolution families against cuDNN on the twelve layers and
the 3D layers, in one run (the im2win paper's Figures 2, 3 and 4 on our GPU), or on the layers
of a ``--shapes`` file.

Per layer: implicit GEMM (and, on layers it takes, its sm_90 TMA kernel), im2win,
im2col + cuBLAS GEMM, the best direct kernel and cuDNN fp32
(TF32 off, ``cudnn.benchmark`` on); with ``dtype``/``math`` the tensor-core implicit GEMM against
cuDNN at the same precision (bf16, fp16, tf32; 3xtf32 against cuDNN fp32 and our FMA kernel, the
accuracy it matches).  Each is checked against cuDNN's output, then timed with CUDA
events (warm-up, median of repeats) in rounds that take each in turn (the median of the rounds
is reported), with its effective TFLOP/s (2*N*K*C*taps*outputs / time) and its peak
extra device memory: the workspaces of our plans (exact, from the plan) and, for cuDNN, the
peak of PyTorch's allocator during the call minus the output.  cuDNN's algorithm is read from
the names of the kernels it launches (``cudnn.launched_kernels``), so the table says which layers
the issue's speed target covers (those where cuDNN sums the taps as a GEMM, neither FFT nor
Winograd) from this run instead of from an earlier one.  im2win runs again held to cuDNN's
extra memory on the layer (``workspace_limit``: a smaller batch chunk), so the table shows where
that target is reachable and what it costs.  The ablation reruns im2win with one optimisation
removed at a time.  While each layer is timed, ``codegen.bench.clocks`` samples the
SM clock and the power cap: on the compute-bound layers the card runs at its power limit, and a
figure is only comparable with the clock it ran at.
"""
from __future__ import annotations

import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

from codegen.bench import CONV_FAMILIES
from codegen.bench.clocks import ClockSampler, describe, sampler_for_current_device
from codegen.bench.cudnn import CudnnCase, cudnn_algorithm, cudnn_extra_bytes, launched_kernels, peer_precision
from codegen.bench.direct import tiles_for
from codegen.bench.layers import benchmark_layers, layer_spec
from codegen.bench.timing import median_seconds
from codegen.precision import NAN
from codegen.spec import ConvSpec, DType, MathMode, uses_tensor_cores
from codegen.spec import replace as replace_spec

DIRECT_CANDIDATES = ("tiled_tma", "tiled_register", "tiled_halo", "basic")
FP32_PEAK_TFLOPS = 67.0
"""H100 SXM fp32 FMA datasheet peak; the target is 75% of it (50 TFLOP/s)."""
WITHIN_CUDNN = "within cuDNN"
"""The variant of im2win held to cuDNN's extra memory on the layer."""
MEASURED = ("tiles", "extra_bytes", "relative_error_vs_cudnn", "ms", "tflops", "speedup_vs_cudnn", "skipped")


def extra_bytes(plan) -> int:
    """Device memory a plan needs beyond inputs and output: workspaces plus the precomputed row
    table baked into the module."""
    table = getattr(plan.context, "table", None) or []      # only the GEMM families have a row table
    return plan.workspace_bytes + len(table) * 4 * getattr(plan.context, "table_slots", 1)


ROUNDS = 3
"""Timing rounds per layer: cuDNN and every kernel are timed once per round, in turn, and each
reports the median of its rounds, so a drift of the clock (or of cuDNN's own time) while a layer
is measured weighs on all of them alike instead of on whichever ran during it."""


def bench_layer(spec: ConvSpec, label: str, repeats: int, families=CONV_FAMILIES, ablation: bool = True,
                tuned: bool = False, sampler: ClockSampler | None = None) -> list[dict]:
    """Every family (and the im2win ablation) and cuDNN on one layer, with the heuristic's tiles;
    ``tuned`` adds the tuning database's configuration of the GEMM families next to them.  Each
    kernel is checked against cuDNN's output first, then all are timed in ``ROUNDS`` interleaved
    rounds; with a running ``sampler`` every row also gets the SM clock during those rounds."""
    import cupy
    import torch

    from codegen.api import build
    from codegen.device import resolve as resolve_device
    from codegen.families import gemm_heuristic, get_family, im2win
    from codegen.tuning_db import tuned_tiles
    from codegen.families.gemm_tiles import flops as gemm_flops
    from codegen.index import IndexAlgebra
    from codegen.spec import SpecError

    alg = IndexAlgebra(spec)
    flops = gemm_flops(spec)
    case = CudnnCase(spec)
    x, w, y = case.x, case.w, case.y
    cudnn_extra = cudnn_extra_bytes(case.run_cudnn, math.prod(alg.output_shape) * spec.dtype.itemsize)
    cudnn_kernels = launched_kernels(case.run_cudnn)
    tensor_cores = uses_tensor_cores(spec.dtype, spec.math)
    if tensor_cores:     # only the implicit GEMM has tensor-core kernels; the FP32 families refuse the spec
        families, ablation = tuple(f for f in families if f == "implicit_gemm"), False
    common = {"layer": label, "layout": spec.layout.value, "spec": spec.describe(), "flops": flops,
              "precision": spec.math.value if spec.math is not MathMode.fma else spec.dtype.short_name,
              "cudnn_precision": peer_precision(spec),
              "cudnn_extra_bytes": cudnn_extra, "cudnn_kernels": cudnn_kernels,
              "cudnn_algorithm": cudnn_algorithm(cudnn_kernels)}
    timed: list[tuple[dict, object, int]] = []   # (row, launch, repeats) of every kernel that built
    here = resolve_device(None, None)
    built_by_default = {family: get_family(family, spec).heuristic_tiles(spec, here).to_dict()
                        for family in families if family != "direct"}

    def prepare(family: str, variant: str, tiles, ablated: str | None = None, run_spec: ConvSpec = spec) -> dict:
        row = {**common, "family": family, "variant": variant, "ablation": ablated,
               "build_choice": variant in ("heuristic", "tma", "wgmma") and tiles == built_by_default.get(family)}
        try:
            kernel = build(family, run_spec, tiles)
        except SpecError as err:
            return {**row, "skipped": str(err)}
        y.fill(NAN[spec.dtype])
        kernel.launch([x, w], y)
        row.update(tiles=kernel.plan.tiles.describe(), extra_bytes=extra_bytes(kernel.plan),
                   relative_error_vs_cudnn=case.relative_error())
        timed.append((row, lambda: kernel.launch([x, w], y), repeats if family != "direct" else max(2, repeats // 3)))
        return row

    def within_cudnn() -> dict:
        """im2win held to cuDNN's extra memory (workspace plus its row table), or why it cannot be:
        the heuristic's own row again (marked ``same_as_heuristic``) where it already fits."""
        row = {**common, "family": "im2win", "variant": WITHIN_CUDNN, "ablation": None, "build_choice": False}
        heuristic = im2win.FAMILY.default_tiles(spec)
        whole = im2win.FAMILY.plan(spec, heuristic)
        table = extra_bytes(whole) - whole.workspace_bytes
        row["least_extra_bytes"] = im2win.window_bytes_per_image(spec) + table
        if extra_bytes(whole) <= cudnn_extra:
            return {**row, "same_as_heuristic": True}
        try:
            tiles = im2win.FAMILY.tiles_within(spec, max(0, cudnn_extra - table))
        except SpecError as err:
            return {**row, "skipped": str(err)}
        prepared = prepare("im2win", WITHIN_CUDNN, tiles.to_dict())
        prepared["least_extra_bytes"] = row["least_extra_bytes"]
        return prepared

    groups: list[list[dict]] = []   # one row per group in the result; the direct group keeps its fastest
    for family in families:
        if family == "direct":
            groups.append([prepare("direct", v, tiles_for(spec, v)) for v in DIRECT_CANDIDATES])
            continue
        groups.append([prepare(family, "heuristic", get_family(family, spec).default_tiles(spec).to_dict())])
        if family == "im2win":
            groups.append([within_cudnn()])
        if family == "implicit_gemm" and not tensor_cores and gemm_heuristic.tma_suits(spec):
            groups.append([prepare(family, "tma", gemm_heuristic.tma_tiles(spec).to_dict())])
        if family == "implicit_gemm" and built_by_default[family].get("wgmma"):
            groups.append([prepare(family, "wgmma", built_by_default[family])])
        if tuned and family in ("implicit_gemm", "im2win"):
            recorded = tuned_tiles(family, spec)
            groups.append([prepare(family, "tuned", recorded) if recorded else
                           {**common, "family": family, "variant": "tuned", "ablation": None,
                            "skipped": "no tuned entry for this GPU and version (run convgen tune)"}])
    if tensor_cores and spec.dtype is DType.float32 and "implicit_gemm" in families:
        fma = replace_spec(spec, math="fma")     # tf32 and 3xtf32 beside the FMA kernel they are faster than
        groups.append([prepare("implicit_gemm", "fma", None, run_spec=fma)])
    if ablation and "im2win" in families:
        base = im2win.FAMILY.default_tiles(spec)
        for removed in im2win.ABLATIONS:
            groups.append([prepare("im2win", f"without {removed}", im2win.ablation(base, removed).to_dict(), removed)])

    cudnn_rounds, kernel_rounds = [], [[] for _ in timed]
    started = time.monotonic()
    for _ in range(ROUNDS):
        cudnn_rounds.append(median_seconds(case.run_cudnn, repeats))
        for samples, (_, launch, count) in zip(kernel_rounds, timed):
            samples.append(median_seconds(launch, count, warmup=1))
    cudnn_seconds = statistics.median(cudnn_rounds)
    clock = sampler.window(started, time.monotonic()) if sampler else None
    for samples, (row, _, _) in zip(kernel_rounds, timed):
        seconds = statistics.median(samples)
        row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, speedup_vs_cudnn=cudnn_seconds / seconds)
    rows = []
    for group in groups:
        measured = [r for r in group if "ms" in r]
        rows.append(min(measured, key=lambda r: r["ms"]) if measured else group[0])
        rows[-1].update(cudnn_ms=cudnn_seconds * 1e3, cudnn_tflops=flops / cudnn_seconds / 1e12, clock=clock)
    heuristic = next((r for r in rows if r["family"] == "im2win" and r["variant"] == "heuristic"), {})
    for row in rows:
        if row.get("same_as_heuristic"):
            row.update({key: heuristic[key] for key in MEASURED if key in heuristic})
    del x, w, y, case
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return rows


LAYER_GROUPS = ("conv2d_mec", "conv3d")
"""The groups of shapes.json that ``bench conv`` runs by default: the twelve layers and the 3D ones."""


def bench_conv(out_dir: Path = Path("bench-out"), repeats: int = 10, layouts=("NCHW", "NCDHW"), layers=None,
               families=CONV_FAMILIES, ablation: bool = True, tuned: bool = False, name: str = "conv",
               source: str = "shapes.json", dtype: str = "float32", math_mode: str = "fma") -> list[dict]:
    """``layers``: the layer dicts to run (``layers.benchmark_layers``; default every layer of
    ``LAYER_GROUPS``), named in the plot's title by ``source``, the file they came from; ``dtype``
    and ``math_mode`` the precision every layer runs at."""
    results: list[dict] = []
    start = time.perf_counter()
    chosen = benchmark_layers(LAYER_GROUPS) if layers is None else layers
    with sampler_for_current_device() as sampler:
        for index, layer in enumerate(chosen, 1):
            dims = 3 if "D" in layer else 2
            for layout in [l for l in layouts if len(l) - 2 == dims]:
                spec = replace_spec(layer_spec(layer, layout, layer.get("N", 128)), dtype=dtype, math=math_mode)
                rows = bench_layer(spec, layer["name"], repeats, families, ablation, tuned, sampler)
                results.extend(rows)
                best = min((r for r in rows if "ms" in r and not r["ablation"]), key=lambda r: r["ms"], default=None)
                clock = rows[0]["clock"]
                clock_note = f"; SM clock median {clock['sm_mhz_median']:.0f} MHz" if clock else ""
                print(f"[{index}/{len(chosen)}] {layer['name']} {layout}: cuDNN ({rows[0]['cudnn_algorithm']}) "
                      f"{rows[0]['cudnn_ms']:.3f} ms; best "
                      f"{best['family'] if best else '-'} {best['ms'] if best else float('nan'):.3f} ms{clock_note} "
                      f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        print(describe(sampler.overall()), file=sys.stderr, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
    plot(results, out_dir / f"{name}.png", source)
    return results


SERIES = ("heuristic", "tma", "wgmma", "fma", "tuned", WITHIN_CUDNN)
"""The rows a family can have per layer, in column order: its heuristic kernel, the implicit GEMM's
TMA kernel (layers it takes, channels-first ones with A gathered), its WGMMA kernel (16-bit
channels-last layers on sm_90, where build() takes it), the FMA kernel beside a tf32 or
3xtf32 run, the tuning database's choice,
and im2win held to cuDNN's extra memory."""
HEADINGS = {"heuristic": "{family}", "tma": "(tma)", "wgmma": "(wgmma)", "fma": "(fp32 fma)", "tuned": "(tuned)",
            WITHIN_CUDNN: "(<=cuDNN MiB)"}
ALGORITHM_CELLS = {"GEMM": "gemm", "FFT": "fft", "Winograd": "wino", "unknown": "?"}
"""``cudnn.cudnn_algorithm``'s answers as the table's ``alg`` column shows them."""


def _series(row: dict) -> str:
    return row["variant"] if row["variant"] in SERIES else "heuristic"


def format_table(results: list[dict]) -> str:
    """One line per layer: TFLOP/s and ratio to cuDNN of each family ("(tma)" and "(tuned)"
    columns after a family's own when there are such rows), extra memory in MiB."""
    families = [f for f in CONV_FAMILIES if any(r["family"] == f for r in results)]
    families = [(f, v) for f in families for v in SERIES if any(
        r["family"] == f and _series(r) == v and not r["ablation"] for r in results)]
    has_clock = any(r.get("clock") for r in results)
    has_algorithm = any("cudnn_algorithm" in r for r in results)
    width = max([11] + [len(r["layer"]) for r in results])
    family_columns = "".join(f" {HEADINGS[v].format(family=f):>13}" for f, v in families)
    columns = f"{'layer':{width}} {'layout':6} {'cuDNN':>6}"
    head = columns + (f" {'alg':>4}" if has_algorithm else "") + family_columns + (
        f" {'MHz':>5} {'cap':>4}" if has_clock else "")
    ours, theirs = results[0].get("precision", "fp32"), results[0].get("cudnn_precision", "fp32")
    lines = [f"TFLOP/s of {ours} kernels (ratio to cuDNN {theirs} in the same run)", head, "-" * len(head)]
    memory = ["extra device memory, MiB", columns + family_columns, "-" * len(columns + family_columns)]
    keyed = {}
    for r in results:
        if not r["ablation"]:
            keyed[(r["layer"], r["layout"], r["family"], _series(r))] = r
    for layer, layout in dict.fromkeys((r["layer"], r["layout"]) for r in results):
        first = next(r for r in results if r["layer"] == layer and r["layout"] == layout)
        cells, mem = [], []
        for f, v in families:
            r = keyed.get((layer, layout, f, v))
            if r is None or "ms" not in r:
                cells.append(f" {_missing(r):>13}")
                mem.append(f" {'-':>13}")
                continue
            marker = "*" if _starred(r) else ""
            cells.append(f"{r['tflops']:.1f} ({r['speedup_vs_cudnn']:.2f}){marker}".rjust(14))
            mem.append(f" {r['extra_bytes'] / 2**20:13.1f}")
        clock = first.get("clock")
        clock_cells = (f" {clock['sm_mhz_median']:5.0f} {100 * clock['power_capped_share']:3.0f}%" if clock
                       else f" {'-':>5} {'-':>4}") if has_clock else ""
        algorithm = f" {ALGORITHM_CELLS[first.get('cudnn_algorithm', 'unknown')]:>4}" if has_algorithm else ""
        lines.append(f"{layer:{width}} {layout:6} {first['cudnn_tflops']:6.1f}{algorithm}" + "".join(cells) + clock_cells)
        memory.append(f"{layer:{width}} {layout:6} {first['cudnn_extra_bytes'] / 2**20:6.1f}" + "".join(mem))
    ablation = [r for r in results if r["ablation"] and "ms" in r]
    if any(_starred(r) for r in results):
        lines.append("*: the kernel build() runs without tiles on this GPU (its heuristic_tiles), where that is not "
                     "the family's first column")
    if has_algorithm:
        lines.append("alg: cuDNN's algorithm, from the names of the kernels it launched (gemm: the taps summed as a "
                     "GEMM, implicit or explicit; fft; wino: Winograd; ?: not traced)")
    if has_clock:
        lines.append("MHz: median SM clock while the layer was timed; cap: share of those samples with the power "
                     "cap holding the clock down")
    text = "\n".join(lines + _speed_summary(results) + [""] + memory + _within_cudnn_summary(results))
    if ablation:
        base = {(r["layer"], r["layout"]): r for r in results
            if r["family"] == "im2win" and r["variant"] == "heuristic" and "ms" in r}
        text += "\n\nim2win ablation: TFLOP/s with one optimisation removed (full im2win in the first column)\n"
        text += f"{'layer':{width}} {'layout':6} {'full':>6} {'-micro':>7} {'-vector':>8} {'-prefetch':>9}\n"
        for key, full in base.items():
            values = {r["ablation"]: r["tflops"] for r in ablation if (r["layer"], r["layout"]) == key}
            text += (f"{key[0]:{width}} {key[1]:6} {full['tflops']:6.1f} {values.get('micro_kernel', math.nan):7.1f} "
                     f"{values.get('vectorized', math.nan):8.1f} {values.get('prefetch', math.nan):9.1f}\n")
    return text


def _starred(row: dict) -> bool:
    """Whether the row is the kernel build() runs but not its family's first column."""
    return bool(row.get("build_choice")) and _series(row) != "heuristic"


def _missing(row: dict | None) -> str:
    """The cell of a kernel without a time: no such row, no tuned record, what one image of im2win
    needs where no chunk fits cuDNN's memory, or a refusal."""
    if row is None:
        return "-"
    if row["skipped"].startswith("no tuned"):
        return "not tuned"
    if row["variant"] == WITHIN_CUDNN and not row.get("same_as_heuristic"):
        mib = row["least_extra_bytes"] / 2**20
        return f"needs {mib:.0f} MiB" if mib >= 10 else f"needs {mib:.1f} MiB"
    return "refused"


def _as_built(results: list[dict], family: str) -> list[dict]:
    """A family's timed rows of the kernel ``build()`` runs without tiles or a tuning record on the
    GPU of the run (the implicit GEMM's TMA kernel where its ``heuristic_tiles`` takes it); direct's
    fastest variant; the first column for results saved before rows said which that is (a row
    without the key among rows with it is not the choice)."""
    rows = [r for r in results if r["family"] == family and not r["ablation"] and "ms" in r]
    if family != "direct" and any("build_choice" in r for r in rows):
        return [r for r in rows if r.get("build_choice")]
    return [r for r in rows if _series(r) == "heuristic"]


def _speed_summary(results: list[dict]) -> list[str]:
    """Each family as ``build()`` runs it without tuning (``_as_built``) against cuDNN, in one line:
    on how many layers it is at least as fast, the geometric mean of its ratios, and its slowest
    layer."""
    lines = []
    for family in CONV_FAMILIES:
        rows = _as_built(results, family)
        if not rows:
            continue
        ratios = [r["speedup_vs_cudnn"] for r in rows]
        worst = min(rows, key=lambda r: r["speedup_vs_cudnn"])
        mean = math.exp(statistics.fmean(math.log(ratio) for ratio in ratios))
        summed = [r["speedup_vs_cudnn"] for r in rows if r.get("cudnn_algorithm") == "GEMM"]
        where_gemm = (f"; {sum(ratio >= 1 for ratio in summed)} of {len(summed)} where cuDNN ran a GEMM (neither FFT "
                      f"nor Winograd)") if summed else ""
        lines.append(f"{family}: at least cuDNN's speed on {sum(ratio >= 1 for ratio in ratios)} of {len(rows)}, "
                     f"geometric mean {mean:.2f}x, slowest {worst['speedup_vs_cudnn']:.2f}x "
                     f"({worst['layer']} {worst['layout']}){where_gemm}")
    return lines


def _within_cudnn_summary(results: list[dict]) -> list[str]:
    """The memory target in words: on how many layers im2win's extra memory is at or below cuDNN's
    as the heuristic runs it, on how many more held to it, at what speed, and what the rest need."""
    within = [r for r in results if r["variant"] == WITHIN_CUDNN]
    if not within:
        return []
    fits = [r for r in within if r.get("same_as_heuristic")]
    held = [r for r in within if "ms" in r and not r.get("same_as_heuristic")]
    base = {(r["layer"], r["layout"]): r for r in results if r["family"] == "im2win" and r["variant"] == "heuristic"
            and "ms" in r}
    ratios = [r["tflops"] / base[(r["layer"], r["layout"])]["tflops"] for r in held if (r["layer"], r["layout"]) in base]
    span = sorted({f"{ratio:.2f}" for ratio in (min(ratios), max(ratios))}) if ratios else []
    speed = f" at {'-'.join(span)}x the heuristic's speed" if ratios else ""
    rest = len(within) - len(fits) - len(held)
    return ["", f"(<=cuDNN MiB): im2win at or below cuDNN's extra memory on {len(fits)} of {len(within)} layers as "
            f"the heuristic runs it, on {len(held)} more with a smaller batch chunk{speed}; on {rest} even one "
            f"image's window tensor needs more (the 'needs' figure)"]


def plot(results: list[dict], path: Path, source: str = "shapes.json") -> bool:
    """TFLOP/s per layer and family with cuDNN (Figure 2), extra memory (Figure 3), ablation (Figure 4);
    a layer where cuDNN ran FFT or Winograd says so under its name."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    main = [r for r in results if not r["ablation"] and r["variant"] != "tuned" and "ms" in r]
    if not main:
        return False
    keys = list(dict.fromkeys((r["layer"], r["layout"]) for r in main))
    algorithm = {(r["layer"], r["layout"]): r.get("cudnn_algorithm", "unknown") for r in results}
    labels = [f"{layer}\n{layout}" + ("" if algorithm[layer, layout] in ("GEMM", "unknown")
                                      else f"\ncuDNN {algorithm[layer, layout]}") for layer, layout in keys]
    families = [(f, v) for f in CONV_FAMILIES for v in ("heuristic", "tma", "wgmma", "fma", WITHIN_CUDNN)
                if any(r["family"] == f and _series(r) == v for r in main)]
    ablation = [r for r in results if r["ablation"] and "ms" in r]
    panels = 3 if ablation else 2          # --no-ablation: no Figure 4 panel
    fig, axes = plt.subplots(panels, 1, figsize=(max(10, len(keys) * 0.9), 11 * panels / 3))
    width = 0.8 / (len(families) + 1)
    xs = np.arange(len(keys))
    cudnn = {(r["layer"], r["layout"]): r for r in results}
    for j, (family, variant) in enumerate(families):
        values = {(r["layer"], r["layout"]): r for r in main if r["family"] == family and _series(r) == variant}
        label = family if variant == "heuristic" else f"{family} ({variant})"
        axes[0].bar(xs + j * width, [values[k]["tflops"] if k in values else 0 for k in keys], width, label=label)
        axes[1].bar(xs + j * width, [values[k]["extra_bytes"] / 2**20 if k in values else 0 for k in keys], width,
                    label=label)
    ours, theirs = main[0].get("precision", "fp32"), main[0].get("cudnn_precision", "fp32")
    axes[0].bar(xs + len(families) * width, [cudnn[k]["cudnn_tflops"] for k in keys], width, label=f"cuDNN {theirs}",
                color="grey")
    axes[1].bar(xs + len(families) * width, [cudnn[k]["cudnn_extra_bytes"] / 2**20 for k in keys], width,
                label=f"cuDNN {theirs}", color="grey")
    if ours == "fp32":
        axes[0].axhline(0.75 * FP32_PEAK_TFLOPS, color="k", linestyle="--", linewidth=1, label="75% of fp32 peak")
    axes[0].set_ylabel("effective TFLOP/s")
    axes[1].set_ylabel("extra memory, MiB")
    axes[1].set_yscale("symlog")
    if ablation:
        full = {(r["layer"], r["layout"]): r["tflops"] for r in main if r["family"] == "im2win" and _series(r) == "heuristic"}
        removed_kinds = list(dict.fromkeys(r["ablation"] for r in ablation))
        axes[2].bar(xs, [full.get(k, 0) for k in keys], 0.8 / (len(removed_kinds) + 1), label="im2win (all)")
        for j, removed in enumerate(removed_kinds, 1):
            values = {(r["layer"], r["layout"]): r["tflops"] for r in ablation if r["ablation"] == removed}
            axes[2].bar(xs + j * 0.8 / (len(removed_kinds) + 1), [values.get(k, 0) for k in keys],
                        0.8 / (len(removed_kinds) + 1), label=f"without {removed}")
        axes[2].set_ylabel("im2win TFLOP/s")
    for ax in axes:
        ax.set_xticks(xs + 0.4 - width / 2)
        ax.set_xticklabels(labels, fontsize=7)
        ax.legend(fontsize=7, ncol=4)
    axes[0].set_title(f"{ours} convolution, batch as in {source}, H100 (same run)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
