"""``convgen bench im2col`` and ``convgen bench col2im``: the memory-bound transforms on the twelve
layers, at batch ``BATCH``, in float32, float16 or bfloat16 (``--dtype``).

Each is reported as bytes moved (input read once plus output written once) over time, next to a
device-to-device copy (the ceiling) and PyTorch's unfold/fold in the same dtype (the peer), all
measured in this run; PyTorch's output is also a second, independent check of ours.  The share of
the copy's bandwidth is the figure that compares dtypes: a 16-bit kernel moves half the bytes.
"""
from __future__ import annotations

import json
import math
import sys
import time
from pathlib import Path

import numpy as np

from codegen.bench.clocks import clocked, describe, sampler_for_current_device
from codegen.bench.layers import BATCH, layer_spec, load_shapes, select_layers
from codegen.bench.timing import copy_bandwidth, median_seconds
from codegen.spec import ConvSpec, DType, replace

COLUMN_BUDGET_BYTES = 4 << 30


def chunk_batch(spec_for_one: ConvSpec) -> int:
    """The largest power-of-two batch slice of BATCH whose column matrix fits the budget."""
    from codegen.index import IndexAlgebra

    per_image = IndexAlgebra(spec_for_one).rows * IndexAlgebra(spec_for_one).cols * spec_for_one.dtype.itemsize
    chunk = BATCH
    while chunk > 1 and chunk * per_image > COLUMN_BUDGET_BYTES:
        chunk //= 2
    return chunk


def _torch_peer(family: str, spec: ConvSpec, x_torch, col_torch, chunk: int, chunks: int):
    import torch.nn.functional as F

    kwargs = dict(kernel_size=spec.filter_size, dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    if family == "im2col":
        return lambda: [F.unfold(x_torch[i * chunk:(i + 1) * chunk], **kwargs) for i in range(chunks)]
    return lambda: [F.fold(col_torch, output_size=spec.input_size, **kwargs) for _ in range(chunks)]


def as_torch(array):
    """A CuPy array as a PyTorch tensor on the same memory (uint16 arrays as the bfloat16 they hold)."""
    import cupy
    import torch

    if array.dtype == cupy.uint16:
        return torch.from_dlpack(array.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(array)


def as_cupy(tensor):
    """A PyTorch tensor as a CuPy array on the same memory (bfloat16 as its uint16 bits)."""
    import cupy
    import torch

    if tensor.dtype == torch.bfloat16:
        return cupy.from_dlpack(tensor.view(torch.int16)).view(cupy.uint16)
    return cupy.from_dlpack(tensor)


TORCH_DTYPES = {DType.float32: "float32", DType.float16: "float16", DType.bfloat16: "bfloat16"}


def torch_difference(family: str, spec: ConvSpec, kernel, image, col, x_torch, col_torch) -> float:
    """Max |ours - PyTorch| on the first batch chunk: a second, independent oracle in the benchmark.

    PyTorch orders rows (c, taps); channels-last rows are (taps, c), so theirs is transposed to match."""
    import torch.nn.functional as F

    kwargs = dict(kernel_size=spec.filter_size, dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    taps = math.prod(spec.filter_size)
    to_ours = (0, *range(2, 2 + spec.dims), 1) if spec.layout.channels_last else tuple(range(2 + spec.dims))
    if family == "im2col":
        image[: spec.n] = as_cupy(x_torch[: spec.n].permute(*to_ours).contiguous())
        kernel.launch([image[: spec.n]], col)
        theirs = F.unfold(x_torch[: spec.n], **kwargs).permute(1, 0, 2).reshape(spec.c, taps, -1)
        if spec.layout.channels_last:
            theirs = theirs.transpose(0, 1)
        return float((as_torch(col).reshape(theirs.shape).double() - theirs.double()).abs().max())
    kernel.launch([col], image[: spec.n])
    theirs = F.fold(col_torch, output_size=spec.input_size, **kwargs).permute(*to_ours)
    return float((as_torch(image[: spec.n]).double() - theirs.double()).abs().max())


def bench_layer(family: str, layer: dict, layout: str, copy_bps: float, repeats: int,
                dtype: DType = DType.float32, tiles: dict | None = None) -> dict:
    import cupy
    import torch

    from codegen.api import build
    from codegen.index import IndexAlgebra

    chunk = chunk_batch(replace(layer_spec(layer, layout, 1), dtype=dtype))
    chunks = BATCH // chunk
    spec = replace(layer_spec(layer, layout, chunk), dtype=dtype)
    kernel = build(family, spec, tiles)
    alg = IndexAlgebra(spec)
    full_image_shape = (BATCH, *alg.image_shape[1:])
    generator = torch.Generator("cuda").manual_seed(1)
    element = getattr(torch, TORCH_DTYPES[spec.dtype])

    def uniform(*shape):
        return (torch.rand(*shape, device="cuda", generator=generator) * 2 - 1).to(element)

    image, col = as_cupy(uniform(*full_image_shape)), as_cupy(uniform(*alg.col_shape))
    x_torch = uniform(BATCH, spec.c, *spec.input_size)
    if spec.layout.channels_last:
        x_torch = x_torch.to(memory_format=torch.channels_last if spec.dims == 2 else torch.channels_last_3d)
    # PyTorch's (chunk, C*taps, L) view of the same column matrix, for fold.
    if spec.layout.channels_last:
        col_torch = as_torch(col).reshape(alg.taps, spec.c, chunk, -1).permute(2, 1, 0, 3)
    else:
        col_torch = as_torch(col).reshape(spec.c, alg.taps, chunk, -1).permute(2, 0, 1, 3)
    col_torch = col_torch.reshape(chunk, spec.c * alg.taps, -1).contiguous()
    check = torch_difference(family, spec, kernel, image, col, x_torch, col_torch)
    if family == "im2col":
        ours = lambda: [kernel.launch([image[i * chunk:(i + 1) * chunk]], col) for i in range(chunks)]
    else:
        ours = lambda: [kernel.launch([col], image[i * chunk:(i + 1) * chunk]) for i in range(chunks)]
    nbytes = (math.prod(full_image_shape) + alg.rows * alg.cols * chunks) * spec.dtype.itemsize
    seconds = median_seconds(ours, repeats)
    same_bytes = copy_bandwidth(nbytes // 2, repeats)
    torch_seconds = median_seconds(_torch_peer(family, spec, x_torch, col_torch, chunk, chunks), repeats)
    result = {
        "family": family, "variant": kernel.plan.variant, "tiles": kernel.plan.tiles.describe(),
        "layer": layer["name"], "layout": layout,
        "dtype": spec.dtype.value, "batch": BATCH, "chunk": chunk, "bytes": nbytes, "ms": seconds * 1e3,
        "tbps": nbytes / seconds / 1e12, "copy_tbps": copy_bps / 1e12, "ratio_copy": nbytes / seconds / copy_bps,
        "copy_same_bytes_tbps": same_bytes / 1e12, "ratio_copy_same_bytes": nbytes / seconds / same_bytes,
        "torch_ms": torch_seconds * 1e3, "torch_tbps": nbytes / torch_seconds / 1e12,
        "speedup_vs_torch": torch_seconds / seconds, "max_abs_diff_vs_torch": check,
    }
    del image, col, x_torch, col_torch
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return result


def bench_memory_family(family: str, layouts=("NCHW", "NHWC"), layers=None, out_dir: Path = Path("bench-out"),
                        repeats: int = 10, dtype: DType | str = DType.float32, tiles: dict | None = None) -> list[dict]:
    """Every layer in every layout, with ``tiles`` over what build() takes; the JSON and the plot are
    named by the family, by the dtype where it is not float32, and by ``tiles`` where given."""
    dtype = DType(dtype)
    shapes = select_layers(load_shapes()["conv2d_mec"], layers)
    copy_bps = copy_bandwidth()
    results = []
    total = len(shapes) * len(layouts)
    start = time.perf_counter()
    with sampler_for_current_device() as sampler:
        for layer in shapes:
            for layout in layouts:
                with clocked(results, sampler):
                    results.append(bench_layer(family, layer, layout, copy_bps, repeats, dtype, tiles))
                r = results[-1]
                print(f"[{len(results)}/{total}] {family} {r['layer']} {layout}: {r['ms']:.3f} ms, "
                      f"{r['ratio_copy']:.2f} of copy, {r['speedup_vs_torch']:.1f}x torch "
                      f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        print(describe(sampler.overall()), file=sys.stderr, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    name = family if dtype is DType.float32 else f"{family}-{dtype.short_name}"
    name += "".join(f"-{key}{value}" for key, value in sorted((tiles or {}).items()))
    (out_dir / f"{name}.json").write_text(json.dumps(results, indent=1))
    plot(results, out_dir / f"{name}.png")
    return results


def format_table(results: list[dict]) -> str:
    head = (f"{'layer':8} {'layout':6} {'variant':26} {'chunk':>5} {'ms':>9} {'TB/s':>6} {'/copy':>6} {'/same':>6} "
            f"{'torch ms':>9} {'vs torch':>8} {'|d| torch':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r['layer']:8} {r['layout']:6} {r['variant']:26} {r['chunk']:5d} {r['ms']:9.3f} {r['tbps']:6.2f} "
                     f"{r['ratio_copy']:6.2f} {r['ratio_copy_same_bytes']:6.2f} {r['torch_ms']:9.3f} "
                     f"{r['speedup_vs_torch']:7.1f}x {r['max_abs_diff_vs_torch']:9.1e}")
    if results:
        lines.append(f"/copy: share of a 1 GiB device copy measured in this run ({results[0]['copy_tbps']:.2f} TB/s, "
                     "read + write); /same: of a copy moving the layer's own byte count")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> bool:
    """Bar chart of the share of copy bandwidth per layer (ours and PyTorch); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    layouts = list(dict.fromkeys(r["layout"] for r in results))
    layers = list(dict.fromkeys(r["layer"] for r in results))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / (2 * len(layouts))
    for j, layout in enumerate(layouts):
        rows = {r["layer"]: r for r in results if r["layout"] == layout}
        xs = np.arange(len(layers))
        ours = [rows[l]["ratio_copy"] if l in rows else 0 for l in layers]
        theirs = [rows[l]["torch_tbps"] / rows[l]["copy_tbps"] if l in rows else 0 for l in layers]
        ax.bar(xs + (2 * j) * width, ours, width, label=f"convgen {layout}")
        ax.bar(xs + (2 * j + 1) * width, theirs, width, label=f"PyTorch {layout}", alpha=0.6)
    family = results[0]["family"]
    target = 0.85 if family == "im2col" else 0.6
    ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xticks(np.arange(len(layers)) + 0.4 - width / 2)
    ax.set_xticklabels(layers)
    ax.set_ylabel("share of device-to-device copy bandwidth")
    ax.set_title(f"{family}, batch {BATCH}, {DType(results[0]['dtype']).short_name} (bytes read once + written once)")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True
