"""Standalone ``.cu`` emission: kernels, a plain C launcher and a self-test, for plain ``nvcc``."""
from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

from codegen.api import check_arch, plan as make_plan
from codegen.compile import DEFAULT_ARCH
from codegen.families import get_family
from codegen.families.gemm import flops as convolution_flops
from codegen.render import render
from codegen.spec import ConvSpec, SpecError
from codegen.tiles import Tiles


SELFTEST_BUDGET = 1 << 29
"""Multiply-adds the self-test's host reference may spend (seconds in an unoptimised host build):
beyond it the self-test compares a sample of the output with the reference (every element is still
checked for the NaN poison), where comparing all of im2win's c3d_conv3 output took 205 s at -O3."""


def selftest_stride(outputs: int, terms: int) -> int:
    """1 (compare every output) within ``SELFTEST_BUDGET``, else the odd step that keeps the
    reference's work near it: odd, so the sample meets every residue of the power-of-two periods
    that layouts have."""
    cost = outputs * terms
    return 1 if cost <= SELFTEST_BUDGET else -(-cost // SELFTEST_BUDGET) | 1


def emit_source(family: str, spec: ConvSpec, tiles: Tiles | dict | None = None, launcher: str | None = None,
                file_name: str = "kernel.cu", arch: str = DEFAULT_ARCH, workspace_limit: int | None = None) -> str:
    """The text of a standalone file; ``launcher`` names its ``extern "C"`` entry point."""
    kernel_plan = make_plan(family, spec, tiles, arch, workspace_limit)
    check_arch(kernel_plan, arch)
    if kernel_plan.steps:
        raise SpecError("family", family, "runs host steps (a cuBLAS GEMM) between launches and cannot be emitted "
                        "as a standalone file; emit its kernels' family (im2col) and call cublasSgemm")
    name = launcher or kernel_plan.context["kernel"].replace(f"_{kernel_plan.variant}_", "_") + "_launch"
    terms = kernel_plan.context.get("reference_terms", 1)
    outputs = kernel_plan.output.elements
    return render(kernel_plan, "standalone.cu.j2", launcher=name, file_name=file_name,
                  arch_flags=nvcc_arch_flags(kernel_plan.compile_arch(arch)),
                  output_name=kernel_plan.output.name, output_elements=outputs,
                  selftest_stride=selftest_stride(outputs, terms), selftest_cost=outputs * terms,
                  **bench_work(kernel_plan))


def bench_work(kernel_plan) -> dict:
    """What the ``-DCONVGEN_BENCH`` timer divides by the median time: a convolution's FLOPs, else
    the bytes of every input read once and the output written once, as ``convgen bench`` reports
    the memory-bound families (im2col, col2im)."""
    if get_family(kernel_plan.family).convolution:
        return {"bench_flops": convolution_flops(kernel_plan.spec), "bench_bytes": 0}
    return {"bench_flops": 0, "bench_bytes": sum(b.elements for b in kernel_plan.buffers if b.role != "workspace") * 4}


def nvcc_arch_flags(arch: str) -> str:
    """nvcc's architecture flags for ``arch``: ``-arch=sm_90``, or for an arch-specific target
    (sm_90a) the one -gencode pair, since ``-arch=sm_90a`` also builds a compute_90 PTX, where
    sm_90a instructions (setmaxnreg) do not assemble."""
    if arch.endswith("a"):
        return f"-gencode arch=compute_{arch[3:]},code={arch}"
    return f"-arch={arch}"


def build_flags(text: str) -> list[str]:
    """The nvcc architecture flags an emitted file's self-test build line names."""
    found = re.search(r"^//   nvcc (.+) -DCONVGEN_SELFTEST ", text, re.MULTILINE)
    if found is None:
        raise ValueError("not an emitted convgen file: no 'nvcc ... -DCONVGEN_SELFTEST' build line")
    return found.group(1).split()


def write_if_changed(path: Path, text: str) -> bool:
    """Write atomically, and only when the content differs; returns whether it wrote."""
    path = Path(path)
    if path.exists() and path.read_text(encoding="utf-8") == text:
        return False
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temp = tempfile.mkstemp(prefix=".emit-", dir=path.parent)
    with os.fdopen(handle, "w", encoding="utf-8") as out:
        out.write(text)
    os.replace(temp, path)
    return True


def emit(family: str, spec: ConvSpec, path: str | os.PathLike, tiles: Tiles | dict | None = None,
         launcher: str | None = None, arch: str = DEFAULT_ARCH, workspace_limit: int | None = None) -> Path:
    """Write the standalone file for ``family`` and ``spec`` to ``path``."""
    path = Path(path)
    write_if_changed(path, emit_source(family, spec, tiles, launcher, path.name, arch, workspace_limit))
    return path
