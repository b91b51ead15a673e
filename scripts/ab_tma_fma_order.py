"""A/B of the TMA implicit-GEMM kernel's FMA order (docs/perf.md, v13 and v14), on the GPU.

ptxas places the consumer's 256 FMAs per 32-channel slice and decides the register-bank
conflicts that v11 found among the stalls; v13 counted them in SASS for source orders that the
CPU could not time.  This script renders the kernel with each order (the template's FMA block
replaced in a scratch copy of the templates), checks each against cuDNN, and times them in
interleaved rounds on the compute-bound layers.

    PYTHONPATH=$PWD python3 scripts/ab_tma_fma_order.py [--out DIR] [LAYER ...]
"""
import argparse
import json
import sys
import tempfile
from pathlib import Path

ORDER_START = "                // Serpentine order"
ORDER_END = "{%- else %}\n                // Rows outermost, so that a row's A float4"

A_VALUE = "const float a_value = q == 0 ? a[i].x : q == 1 ? a[i].y : q == 2 ? a[i].z : a[i].w;"
B_VALUE = ["const float4 group = b[q][j / 4];",
           "const float b_value = j % 4 == 0 ? group.x : j % 4 == 1 ? group.y : j % 4 == 2 ? group.z : group.w;",
           "acc[i][j] = fmaf(a_value, b_value, acc[i][j]);"]


def loops(headers: list[str], body: list[str]) -> str:
    """Nested unrolled loops around ``body`` (lines indented relative to the innermost loop), at
    the template's indentation."""
    text, pad = "", " " * 16
    for header in headers:
        text += f"#pragma unroll\n{pad}{header} {{\n"
        pad += " " * 4
    text += "".join(f"{pad}{line}\n" if not line.startswith("#") else f"{line}\n" for line in body)
    for _ in headers:
        pad = pad[:-4]
        text += f"{pad}}}\n"
    return text


ORDERS = {
    "rows": "// Rows outermost: one pixel row's 32 FMAs (4 k-steps x 8 channels) in a row.\n" + loops(
        ["for (int i = 0; i < 8; ++i)", "for (int q = 0; q < 4; ++q)"],
        [A_VALUE, "#pragma unroll", "for (int jj = 0; jj < 8; ++jj) {", "    const int j = q % 2 ? 7 - jj : jj;",
         *("    " + line for line in B_VALUE), "}"]),
    "columns": "// Columns outermost per k-step: each B value meets the 8 rows in a row.\n" + loops(
        ["for (int q = 0; q < 4; ++q)", "for (int j = 0; j < 8; ++j)", "for (int i = 0; i < 8; ++i)"],
        [A_VALUE, *B_VALUE]),
}


def with_order(template: str, order: str) -> str:
    """The template with the TMA kernel's 8x8 FMA block in ``order``."""
    start, end = template.index(ORDER_START), template.index(ORDER_END)
    return template[:start] + " " * 16 + ORDERS[order] + template[end:]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("layers", nargs="*", default=["conv4", "conv8", "c3d_conv2"])
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    from codegen import render
    from codegen.api import build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.families import implicit_gemm
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    layers = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], args.layers)
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        variants = {"serpentine": render.PACKAGE_TEMPLATES,
                    **{name: render.edited_templates(Path(tmp), name, lambda text, o=name: with_order(text, o))
                       for name in ORDERS}}
        for layer in layers:
            layout = "NDHWC" if "D" in layer else "NHWC"
            spec = layer_spec(layer, layout, layer["N"])
            case = CudnnCase(spec)
            x, w, y = case.x, case.w, case.y
            tiles = implicit_gemm.FAMILY.tma_tiles(spec, 8).to_dict()   # the orders are the 8x8 kernel's
            kernels = {}
            for name, directory in variants.items():
                with render.templates_from(directory):
                    kernel = build("implicit_gemm", spec, tiles)
                y.fill(float("nan"))
                kernel.launch([x, w], y)
                kernels[name] = kernel
                main_kernel = kernel.compiled.resources[kernel.plan.launches[-1].kernel]
                results.append({"layer": layer["name"], "layout": layout, "order": name, "tiles": kernel.plan.tiles.describe(),
                                "registers": main_kernel.registers, "spill_bytes": main_kernel.spill_stores,
                                "relative_error_vs_cudnn": case.relative_error()})
            times = interleaved_medians({name: lambda k=kernel: k.launch([x, w], y) for name, kernel in kernels.items()},
                                        args.rounds)
            flops = gemm_flops(spec)
            for row in results[-len(kernels):]:
                seconds = times[row["order"]]
                row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, vs_serpentine=times["serpentine"] / seconds)
            print(f"[{layer['name']}] " + ", ".join(f"{r['order']} {r['tflops']:.1f}" for r in results[-len(kernels):]),
                  file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-tma-fma-order.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':10} {'order':11} {'regs':>4} {'spill':>5} {'ms':>8} {'TFLOP/s':>8} {'vs serp.':>8} {'rel.err':>9}")
    for r in results:
        print(f"{r['layer']:10} {r['order']:11} {r['registers']!s:>4} {r['spill_bytes']!s:>5} {r['ms']:8.3f} "
              f"{r['tflops']:8.1f} {r['vs_serpentine']:8.3f} {r['relative_error_vs_cudnn']:9.1e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
