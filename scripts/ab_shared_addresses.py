"""A/B of the TMA implicit-GEMM kernel's shared-memory addressing (docs/perf.md, GEMM v21), on the GPU.

v20 found the emitted TMA files, built with nvcc, 2-8 % slower than the package's NVRTC build of
the same kernel source: nvcc forms shared-memory addresses in 32 bits, NVRTC in 64, and ptxas
allocates the FMA loops' registers differently for the two.  The templates now address shared
memory by 32-bit shared addresses throughout the TMA kernel.  This script times, per layer, the
kernel rendered from ``--old`` templates (a copy of the previous ones) and from the package's,
each as NVRTC builds it, and the package's emitted file built with nvcc (its cubin launched
through the package's path, so only the machine code differs), with cuDNN fp32 in the same
process; every variant is checked against cuDNN on a NaN-poisoned output first.

    git archive 8b099b6 templates | tar -x -C /tmp/old     # the templates before the change
    PYTHONPATH=$PWD python3 scripts/ab_shared_addresses.py --old /tmp/old/templates [--out DIR] [LAYER:LAYOUT ...]
"""
import argparse
import dataclasses
import json
import subprocess
import sys
import tempfile
from pathlib import Path

DEFAULT = ["conv4:NHWC", "conv8:NHWC", "c3d_conv2:NDHWC", "conv8:NCHW", "c3d_conv2:NCDHW", "conv5:NHWC", "conv10:NCHW"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", nargs="*", default=DEFAULT, help="LAYER:LAYOUT (default: %(default)s)")
    parser.add_argument("--old", type=Path, required=True, help="the previous templates directory")
    parser.add_argument("--out", type=Path, default=Path("bench-out"))
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()

    import cupy

    from codegen import render
    from codegen.api import Kernel, build
    from codegen.bench import CudnnCase, interleaved_medians, layer_spec, load_shapes, select_layers
    from codegen.emit import build_flags, emit_source
    from codegen.families import implicit_gemm
    from codegen.families.gemm import flops as gemm_flops

    shapes = load_shapes()
    scratch = Path(tempfile.mkdtemp(prefix="ab-shared-"))
    results = []
    for case_name in args.cases:
        name, layout = case_name.split(":")
        layer = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], [name])[0]
        spec = layer_spec(layer, layout, layer["N"])
        tiles = implicit_gemm.FAMILY.tma_tiles(spec).to_dict()
        case = CudnnCase(spec)
        x, w, y = case.x, case.w, case.y
        with render.templates_from(args.old):
            old = build("implicit_gemm", spec, tiles)
        new = build("implicit_gemm", spec, tiles)
        source = scratch / f"{name}_{layout}.cu"
        source.write_text(emit_source("implicit_gemm", spec, tiles, f"convgen_{name}", source.name))
        cubin = source.with_suffix(".cubin")
        subprocess.run(["nvcc", *build_flags(source.read_text()), "-O3", "-cubin", "-o", str(cubin), str(source)], check=True)
        emitted = Kernel(new.plan, new.source, dataclasses.replace(new.compiled, cubin=cubin.read_bytes()))
        variants = {"old NVRTC": old, "new NVRTC": new, "new nvcc": emitted}
        runs = {"cuDNN": case.run_cudnn}
        rows = []
        for label, kernel in variants.items():
            y.fill(float("nan"))
            kernel.launch([x, w], y)
            runs[label] = lambda k=kernel: k.launch([x, w], y)
            rows.append({"layer": name, "layout": layout, "variant": label, "tiles": kernel.plan.tiles.describe(),
                         "nan_left": bool(cupy.isnan(y).any()), "relative_error_vs_cudnn": case.relative_error()})
        times = interleaved_medians(runs, args.rounds)
        flops = gemm_flops(spec)
        for row in rows:
            seconds = times[row["variant"]]
            row.update(ms=seconds * 1e3, tflops=flops / seconds / 1e12, vs_old=times["old NVRTC"] / seconds,
                       vs_cudnn=times["cuDNN"] / seconds)
        results += rows
        print(f"[{name} {layout}] " + ", ".join(f"{r['variant']} {r['tflops']:.2f}" for r in rows), file=sys.stderr, flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ab-shared-addresses.json").write_text(json.dumps(results, indent=1))
    print(f"{'layer':10} {'layout':6} {'variant':10} {'ms':>8} {'TFLOP/s':>8} {'vs old':>6} {'vs cuDNN':>8} {'rel.err':>8} nan")
    for r in results:
        print(f"{r['layer']:10} {r['layout']:6} {r['variant']:10} {r['ms']:8.3f} {r['tflops']:8.2f} {r['vs_old']:6.3f} "
              f"{r['vs_cudnn']:8.2f} {r['relative_error_vs_cudnn']:8.1e} {r['nan_left']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
