"""``convgen bench direct``: every direct variant against cuDNN at the same precision (fp32, or the
16-bit ``--dtype``) on the single-channel filters, the twelve layers and the 3D layers, with each
one's share of the copy bandwidth, the figure that compares dtypes (16-bit moves half the bytes).
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from codegen.bench.clocks import clocked, describe, sampler_for_current_device
from codegen.bench.cudnn import CudnnCase
from codegen.bench.layers import benchmark_layers, layer_spec, select_layers
from codegen.bench.timing import copy_bandwidth, median_seconds
from codegen.families.direct import VARIANTS as DIRECT_VARIANTS
from codegen.spec import ConvSpec, DType, SpecError, replace


def bench_direct_spec(spec: ConvSpec, label: str, variants, repeats: int, copy_bps: float) -> list[dict]:
    """Every requested direct variant and cuDNN at the spec's precision on one spec; variants the
    spec refuses are noted."""
    import cupy
    import torch

    from codegen.api import build
    from codegen.index import IndexAlgebra

    alg = IndexAlgebra(spec)
    flops = 2 * spec.n * spec.k * math.prod(alg.out_size) * spec.c * alg.taps
    nbytes = (alg.image_elements + math.prod(alg.filter_shape) + math.prod(alg.output_shape)) * spec.dtype.itemsize
    case = CudnnCase(spec)
    cudnn_seconds = median_seconds(case.run_cudnn, repeats)
    rows = []
    for variant in variants:
        row = {"family": "direct", "layer": label, "layout": spec.layout.value, "variant": variant,
               "dtype": spec.dtype.value, "flops": flops, "bytes": nbytes, "copy_tbps": copy_bps / 1e12,
               "cudnn_ms": cudnn_seconds * 1e3, "cudnn_tflops": flops / cudnn_seconds / 1e12}
        try:
            kernel = build("direct", spec, tiles_for(spec, variant))
        except SpecError as err:
            rows.append({**row, "skipped": str(err)})
            continue
        seconds = median_seconds(lambda: kernel.launch([case.x, case.w], case.y), repeats)
        rows.append({**row, "ms": seconds * 1e3, "tflops": flops / seconds / 1e12,
                     "tbps": nbytes / seconds / 1e12, "ratio_copy": nbytes / seconds / copy_bps,
                     "speedup_vs_cudnn": cudnn_seconds / seconds,
                     "max_abs_diff_vs_cudnn": float((case.as_torch(case.y).double() - case.expected).abs().max())})
    del case
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return rows


def tiles_for(spec: ConvSpec, variant: str) -> dict:
    """The family's tile heuristic for ``variant``."""
    from codegen.families import get_family

    return get_family("direct").complete_tiles(spec, {"variant": variant}).to_dict()


def bench_direct(out_dir: Path = Path("bench-out"), repeats: int = 10, sets=("filter2d", "conv2d_mec", "conv3d"),
                 variants=DIRECT_VARIANTS, layers=None, dtype: DType | str = DType.float32) -> list[dict]:
    """Every layer in every variant; the JSON and the plot are named by the dtype where it is not float32."""
    dtype = DType(dtype)
    chosen = select_layers(benchmark_layers(sets), layers)
    copy_bps = copy_bandwidth()
    results = []
    start = time.perf_counter()
    with sampler_for_current_device() as sampler:
        for layer in chosen:
            group = layer["group"]
            layout = "NCDHW" if group == "conv3d" else "NCHW"
            spec = replace(layer_spec(layer, layout, layer["N"]), dtype=dtype)
            layer_repeats = repeats if group == "filter2d" else max(3, repeats // 3)
            first = len(results)
            with clocked(results, sampler):
                results.extend(bench_direct_spec(spec, layer["name"], variants, layer_repeats, copy_bps))
            rows = results[first:]
            timed = [r for r in rows if "ms" in r]
            best = min(timed, key=lambda r: r["ms"]) if timed else None
            print(f"[{len(results)}] direct {layer['name']}: best {best['variant'] if best else '-'} "
                  f"{best['ms'] if best else float('nan'):.3f} ms, cuDNN {rows[0]['cudnn_ms']:.3f} ms "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        print(describe(sampler.overall()), file=sys.stderr, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = "direct" if dtype is DType.float32 else f"direct-{dtype.short_name}"
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
    plot_direct(results, out_dir / f"{name}.png")
    return results


def format_direct_table(results: list[dict]) -> str:
    lines = [f"{'layer':12} {'variant':12} {'ms':>9} {'TFLOP/s':>8} {'/copy':>6} {'cuDNN ms':>9} {'vs cuDNN':>8} {'|d|':>8}",
             "-" * 80]
    for r in results:
        if "ms" not in r:
            lines.append(f"{r['layer']:12} {r['variant']:12} refused: {r['skipped'][:58]}")
            continue
        lines.append(f"{r['layer']:12} {r['variant']:12} {r['ms']:9.3f} {r['tflops']:8.2f} {r['ratio_copy']:6.2f} "
                     f"{r['cudnn_ms']:9.3f} {r['speedup_vs_cudnn']:7.2f}x {r['max_abs_diff_vs_cudnn']:8.1e}")
    if results:
        spec_dtype = DType(results[0]["dtype"])
        peer = "cuDNN fp32, TF32 off" if spec_dtype is DType.float32 else f"cuDNN {spec_dtype.short_name}"
        lines.append(f"/copy: (input + filter + output bytes) / time over the {results[0]['copy_tbps']:.2f} TB/s copy; "
                     f"{peer}, cudnn.benchmark on")
    return "\n".join(lines)


def plot_direct(results: list[dict], path: Path) -> bool:
    """Share of copy bandwidth of each variant and cuDNN on the single-channel filters."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results if r["layer"].startswith("filter_") and "ms" in r]
    if not rows:
        return False
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / (len(variants) + 1)
    xs = np.arange(len(layers))
    for j, variant in enumerate(variants):
        values = {r["layer"]: r["ratio_copy"] for r in rows if r["variant"] == variant}
        ax.bar(xs + j * width, [values.get(l, 0) for l in layers], width, label=variant)
    cudnn = {r["layer"]: r["bytes"] / (r["cudnn_ms"] / 1e3) / (r["copy_tbps"] * 1e12) for r in rows}
    ax.bar(xs + len(variants) * width, [cudnn[l] for l in layers], width, label="cuDNN", color="grey")
    ax.axhline(0.8, color="k", linestyle="--", linewidth=1, label="target 0.8")
    ax.set_xticks(xs + 0.4 - width / 2)
    ax.set_xticklabels(layers)
    ax.set_ylabel("share of copy bandwidth")
    ax.set_title(f"direct convolution, single channel 8192x8192, {DType(rows[0]['dtype']).short_name}")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
