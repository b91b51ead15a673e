"""Standalone ``.cu`` emission: kernels, a plain C launcher and a self-test, for plain ``nvcc``."""
from __future__ import annotations

import os
import re
from pathlib import Path

from codegen.api import check_arch, plan as make_plan
from codegen.compile import DEFAULT_ARCH
from codegen.files import write_error, write_if_changed
from codegen.families import get_family
from codegen.families.gemm import flops as convolution_flops
from codegen.render import render
from codegen.spec import ConvSpec, SpecError
from codegen.tiles import Tiles


SELFTEST_BUDGET = 1 << 29
"""Multiply-adds the self-test's host reference may spend (seconds in an unoptimised host build):
beyond it the self-test compares a sample of the output with the reference (every element is still
checked for the NaN poison), where comparing all of im2win's c3d_conv3 output took 205 s at -O3."""


C_KEYWORDS = frozenset("""
    alignas alignof and and_eq asm auto bitand bitor bool break case catch char char8_t char16_t char32_t class
    compl concept const consteval constexpr constinit const_cast continue co_await co_return co_yield decltype
    default delete do double dynamic_cast else enum explicit export extern false float for friend goto if inline
    int long mutable namespace new noexcept not not_eq nullptr operator or or_eq private protected public register
    reinterpret_cast requires restrict return short signed sizeof static static_assert static_cast struct switch
    template this thread_local throw true try typedef typeid typename union unsigned using virtual void volatile
    wchar_t while xor xor_eq _Alignas _Alignof _Atomic _Bool _Complex _Generic _Imaginary _Noreturn
    _Static_assert _Thread_local
""".split())
"""C and C++ keywords: a launcher may not take one."""


def check_launcher_name(name, kernel_plan) -> None:
    """The launcher's name goes into the C source as it is, so it must be a C identifier, not a
    keyword, not reserved to the compiler (a leading double underscore or underscore and capital)
    and not a name the file already defines (its kernels)."""
    if name is None:
        return
    field = "launcher"
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise SpecError(field, name, "must be a C identifier (letters, digits and _, not starting with a digit)")
    if name in C_KEYWORDS:
        raise SpecError(field, name, "is a C/C++ keyword; pick another name")
    if name.startswith("__") or re.match(r"_[A-Z]", name):
        raise SpecError(field, name, "is reserved to the compiler (leading __ or _ and a capital); pick another name")
    if name == "main" or name in _names_defined(kernel_plan):
        raise SpecError(field, name, "clashes with a name the file defines (its convgen_... kernels and helpers, "
                        "the self-test's main); pick another name")


def _names_defined(kernel_plan) -> set[str]:
    """The convgen_ names a standalone file of ``kernel_plan`` defines: its kernels, constants and
    helpers (read from the kernels' source and from the standalone template's text)."""
    from codegen.render import PACKAGE_TEMPLATES, render_kernels

    standalone = (PACKAGE_TEMPLATES / "standalone.cu.j2").read_text(encoding="utf-8")
    return set(re.findall(r"\bconvgen_\w+", render_kernels(kernel_plan).code + standalone))


def selftest_stride(outputs: int, terms: int) -> int:
    """1 (compare every output) within ``SELFTEST_BUDGET``, else the odd step that keeps the
    reference's work near it: odd, so the sample meets every residue of the power-of-two periods
    that layouts have."""
    cost = outputs * terms
    return 1 if cost <= SELFTEST_BUDGET else -(-cost // SELFTEST_BUDGET) | 1


def emit_source(family: str, spec: ConvSpec, tiles: Tiles | dict | None = None, launcher: str | None = None,
                file_name: str = "kernel.cu", arch: str | None = DEFAULT_ARCH,
                workspace_limit: int | None = None) -> str:
    """The text of a standalone file; ``launcher`` names its ``extern "C"`` entry point; ``arch``
    None is sm_90, for the file is built elsewhere (build()'s None is this machine's device)."""
    arch = DEFAULT_ARCH if arch is None else arch
    kernel_plan = make_plan(family, spec, tiles, arch, workspace_limit)
    check_arch(kernel_plan, arch)
    check_launcher_name(launcher, kernel_plan)
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


def emit(family: str, spec: ConvSpec, path: str | os.PathLike, tiles: Tiles | dict | None = None,
         launcher: str | None = None, arch: str | None = DEFAULT_ARCH, workspace_limit: int | None = None) -> Path:
    """Write the standalone file for ``family`` and ``spec`` to ``path``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"emit's path must be a file path (str or os.PathLike); got {type(path).__name__}")
    if os.fspath(path) == "":
        raise write_error("", "an empty path")
    path = Path(path)
    write_if_changed(path, emit_source(family, spec, tiles, launcher, path.name, arch, workspace_limit))
    return path
