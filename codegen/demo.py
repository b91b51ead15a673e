"""The main job on the default spec: what a first-time user runs to see the whole flow work.

Without a GPU it renders, compiles (NVRTC, cached) and emits every kernel variant; with one it
also runs each on random data against the float64 reference and reports the time.  On sm_80 and
newer (and without a GPU) that includes implicit_gemm's tensor-core kernel on bfloat16 data,
checked elementwise against the error bound of ``codegen.precision``.
"""
from __future__ import annotations

from pathlib import Path

from codegen.api import build, has_gpu
from codegen.emit import emit
from codegen.spec import ConvSpec, replace

DEFAULT_SPEC = ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=8, input_size=(32, 32), filter_size=(3, 3),
                        stride=1, padding=1, dilation=1)


def cases() -> list[tuple[str, str, ConvSpec, dict | None]]:
    nchw = replace(DEFAULT_SPEC, layout="NCHW")
    pitched = replace(DEFAULT_SPEC, dpitch=4)
    found = [
        ("im2col", "nhwc", DEFAULT_SPEC, None),
        ("im2col", "nhwc_dpitch4", pitched, None),
        ("im2col", "nchw", nchw, None),
        ("col2im", "nhwc_gather", DEFAULT_SPEC, {"algorithm": "gather"}),
        ("col2im", "nhwc_scatter", DEFAULT_SPEC, {"algorithm": "scatter"}),
        ("col2im", "nchw_gather", nchw, {"algorithm": "gather"}),
        ("direct", "nhwc_tiled_halo", DEFAULT_SPEC, {"variant": "tiled_halo"}),
        ("direct", "nchw_constant", nchw, {"variant": "constant"}),
        ("implicit_gemm", "nhwc", DEFAULT_SPEC, None),
        ("implicit_gemm", "nchw", nchw, None),
        ("im2win", "nchw", nchw, None),
        ("im2col_gemm", "nhwc", DEFAULT_SPEC, None),
    ]
    if _has_arch(80):     # tensor cores: bfloat16 in and out, FP32 sums
        found.append(("implicit_gemm", "nhwc_bf16", replace(DEFAULT_SPEC, dtype="bfloat16"), None))
    if _has_arch(90):
        found += [("direct", "nchw_tiled_tma", nchw, {"variant": "tiled_tma"}),
                  ("implicit_gemm", "nhwc_pitch4_tma", pitched, {"tma": True})]
    return found


def _has_arch(capability: int) -> bool:
    """Whether the device (or the sm_90 that a machine without a GPU compiles for) is sm_``capability``
    or newer: tensor cores with bfloat16 need sm_80, the TMA kernels sm_90."""
    from codegen.compile import compute_capability, resolve_arch

    return compute_capability(resolve_arch(None)) >= capability


def _heuristic(family: str, spec: ConvSpec) -> dict:
    """The demo shows the heuristic's kernels, whatever a tuning database on this machine says."""
    from codegen.families import get_family

    return get_family(family, spec).default_tiles(spec).to_dict()


def run(out_dir: Path) -> int:
    gpu = has_gpu()
    print(f"convgen demo: default spec {DEFAULT_SPEC.describe()}")
    print("GPU found: kernels are run and checked" if gpu else
          "no GPU: kernels are generated, compiled to cubin (sm_90) and emitted, not run")
    head = f"{'family':13} {'case':15} {'variant':22} {'cache':6} {'regs':>4} {'emitted':48} {'check':8} {'time':>10}"
    print(head + "\n" + "-" * len(head))
    failures = 0
    for family, name, spec, tiles in cases():
        kernel = build(family, spec, tiles if tiles is not None else _heuristic(family, spec))
        regs = max((r.registers for r in kernel.compiled.resources.values()), default=0)
        emitted = not kernel.plan.steps          # im2col_gemm calls cuBLAS between launches: not emitted
        path = emit(family, spec, out_dir / f"{family}_{name}.cu", kernel.plan.tiles) if emitted else "(cuBLAS step)"
        check, timing = "-", "-"
        if gpu:
            from codegen.bench.timing import time_kernel
            from codegen.fuzz import check_on_gpu

            mismatch = check_on_gpu(family, spec, kernel=kernel)   # 16-bit outputs: within the error bound
            check = "PASS" if mismatch is None else "FAIL"
            failures += mismatch is not None
            timing = f"{time_kernel(kernel) * 1e6:.1f} us"
        print(f"{family:13} {name:15} {kernel.plan.variant:22} {kernel.compiled.source_hit:6} {regs:4d} "
              f"{str(path):48} {check:8} {timing:>10}")
    print(f"\nemitted files build with: nvcc -arch=sm_90 -DCONVGEN_SELFTEST {out_dir}/<file>.cu -o selftest\n"
          "(or with the architecture flags a file's first lines name: sm_90a for setmaxnreg;\n"
          " add -O3 -DCONVGEN_BENCH to time the launcher once the self-test passes)")
    return 1 if failures else 0
