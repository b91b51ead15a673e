"""Standalone ``.cu`` emission: kernels, a plain C launcher and a self-test, for plain ``nvcc``."""
from __future__ import annotations

import math
import os
import re
from pathlib import Path

from codegen.api import check_arch, plan as make_plan
from codegen.compile import DEFAULT_ARCH
from codegen.device import Device
from codegen.device import resolve as resolve_device
from codegen.files import write_error, write_if_changed
from codegen.families import get_family
from codegen.families.gemm_tiles import flops as convolution_flops
from codegen.render import render
from codegen.spec import ConvSpec, DType, MathMode, SpecError, uses_tensor_cores
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
LIBRARY_NAMES = frozenset("""
    printf fprintf sprintf snprintf vprintf puts putchar getchar fopen fclose fread fwrite fflush fputs fgets
    perror remove rename malloc calloc realloc free exit abort atexit getenv system atoi atol atof strtol strtoul
    strtod rand srand qsort bsearch abs labs div memcpy memmove memset memcmp memchr strcpy strncpy strcat strcmp
    strncmp strlen strchr strrchr strstr strtok strerror sqrt exp log log2 log10 pow sin cos tan floor ceil fabs
    fmin fmax fma round trunc isnan isinf time clock assert std size_t ptrdiff_t nullptr_t
""".split())
"""Names the headers an emitted file includes declare with C linkage: a launcher of the same name
clashes with them ("more than one instance ... has C linkage")."""


def check_launcher_name(name, kernel_plan, file_text: str = "") -> None:
    """The launcher's name goes into the C source as it is, so it must be a C identifier, not a
    keyword, not reserved to the compiler (a leading double underscore or underscore and capital),
    not a name of the C library or the CUDA APIs (cuda*, cu*) the file includes, and not an
    identifier the file already uses (``file_text``: its kernels, helpers, buffers, self-test)."""
    if name is None:
        return
    field = "launcher"
    if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", name):
        raise SpecError(field, name, "must be a C identifier (letters, digits and _, not starting with a digit)")
    if name in C_KEYWORDS:
        raise SpecError(field, name, "is a C/C++ keyword; pick another name")
    if name.startswith("__") or re.match(r"_[A-Z]", name):
        raise SpecError(field, name, "is reserved to the compiler (leading __ or _ and a capital); pick another name")
    if name in LIBRARY_NAMES or re.match(r"(cuda|cu|CU)[A-Z_]", name):
        raise SpecError(field, name, "is a name of the C library or the CUDA APIs the file includes; pick another name")
    code = re.sub(r'//[^\n]*|"(?:\\.|[^"\\])*"', " ", file_text)    # comments and strings name nothing
    if name in set(re.findall(r"\b[A-Za-z_]\w*\b", code)):
        raise SpecError(field, name, "is a name the file already uses (a kernel, helper, buffer or variable of its "
                        "self-test); pick another name")
def selftest_stride(outputs: int, terms: int) -> int:
    """1 (compare every output) within ``SELFTEST_BUDGET``, else the odd step that keeps the
    reference's work near it: odd, so the sample meets every residue of the power-of-two periods
    that layouts have."""
    cost = outputs * terms
    return 1 if cost <= SELFTEST_BUDGET else -(-cost // SELFTEST_BUDGET) | 1


def emit_source(family: str, spec: ConvSpec, tiles: Tiles | dict | None = None, launcher: str | None = None,
                file_name: str = "kernel.cu", arch: str | None = None, workspace_limit: int | None = None,
                target: Device | str | None = None) -> str:
    """The text of a standalone file; ``launcher`` names its ``extern "C"`` entry point.  The
    file is chosen and built for ``target`` (a Device or a name such as ``a100``) with ``arch``;
    with neither, sm_90 (the file is built elsewhere; build()'s default is this machine's device)."""
    device = resolve_device(target, DEFAULT_ARCH if target is None and arch is None else arch)
    arch = device.arch
    kernel_plan = make_plan(family, spec, tiles, arch, workspace_limit, target=device)
    check_arch(kernel_plan, arch)
    if kernel_plan.steps:
        raise SpecError("family", family, "runs host steps (a cuBLAS GEMM) between launches and cannot be emitted "
                        "as a standalone file; emit its kernels' family (im2col) and call cublasSgemm")
    default = kernel_plan.context.kernel.replace(f"_{kernel_plan.variant}_", "_") + "_launch"
    terms = kernel_plan.context.reference_terms
    outputs = kernel_plan.output.elements

    def standalone(name: str) -> str:
        return render(kernel_plan, "standalone.cu.j2", launcher=name, file_name=file_name,
                      arch_flags=nvcc_arch_flags(kernel_plan.compile_arch(arch)),
                      output_name=kernel_plan.output.name, output_elements=outputs,
                      selftest_stride=selftest_stride(outputs, terms), selftest_cost=outputs * terms,
                      precision=selftest_precision(kernel_plan), **bench_work(kernel_plan))

    text = standalone(default)
    if launcher is None or launcher == default:
        return text
    check_launcher_name(launcher, kernel_plan, text)
    return standalone(launcher)


STORAGE = {
    DType.float16: {"header": "cuda_fp16.h", "from_float": "__float2half_rn", "to_float": "__half2float"},
    DType.bfloat16: {"header": "cuda_bf16.h", "from_float": "__float2bfloat16_rn", "to_float": "__bfloat162float"},
}
"""The toolkit header that declares a 16-bit storage type, and its host and device conversions
(round to nearest even from float; exact to float)."""
PRODUCTS = {
    (DType.float16, MathMode.fma): "FP16 products on tensor cores (exact in FP32)",
    (DType.bfloat16, MathMode.fma): "BF16 products on tensor cores (exact in FP32)",
    (DType.float32, MathMode.tf32): "TF32 products on tensor cores (each operand rounded to TF32, 10 mantissa bits, "
                                    "to nearest with ties away)",
    (DType.float32, MathMode.three_tf32): "3xTF32 products on tensor cores (each operand split into TF32 big + small, "
                                          "three products a term)",
}
"""How a tensor-core kernel multiplies, for the header's precision line."""
TRUNCATED_TF32_PRODUCTS = ("TF32 products on tensor cores (each operand's float32 bits read as TF32: the low 13 "
                           "mantissa bits dropped, toward zero)")


def c_double(value: float) -> str:
    """``value`` as a C double literal that parses back to the same double."""
    return repr(float(value))


def powers_of_two(value: float) -> str:
    """``value`` as a sum of powers of two where it is one of at most three (2^-10 + 2^-22), else
    its decimal repr: how the error model's constants read in the emitted file's comments."""
    if value == 0:
        return "0"
    terms, rest = [], float(value)
    while rest > 0 and len(terms) < 3:
        exponent = math.frexp(rest)[1] - 1
        terms.append(exponent)
        rest -= 2.0**exponent
    if rest:
        return repr(float(value))
    return " + ".join(f"2^{e}" for e in terms)


def selftest_precision(kernel_plan) -> dict | None:
    """What the self-test of a kernel on other than plain FP32 needs beyond the FP32 one (None for
    float32 with math fma, whose self-test keeps its fixed relative tolerance): the storage type and
    its conversions, and ``codegen.precision``'s error model for the spec's dtype and math mode (the
    family's: ``Family.roundoff``), its constants rendered into the file so that the file and the
    GPU tests hold outputs to one bound."""
    spec = kernel_plan.spec
    if not uses_tensor_cores(spec.dtype, spec.math):
        return None
    family = get_family(kernel_plan.family, spec)
    roundoff = family.roundoff(spec, kernel_plan)
    constants = {"e_mul": roundoff.product, "e_acc": roundoff.accumulation, "u_out": roundoff.output,
                 "eta_out": roundoff.output_absolute}
    storage = STORAGE.get(spec.dtype)
    return {
        "dtype": spec.dtype.value,
        "math": spec.math.value,
        "c_type": spec.dtype.c_type,
        "sixteen_bit": storage is not None,
        **(storage or {"header": None, "from_float": None, "to_float": None}),
        "tensor_cores": kernel_plan.tensor_cores,
        "convolution": family.convolution,
        "exact": not any(constants.values()),
        "products": (TRUNCATED_TF32_PRODUCTS if kernel_plan.tf32_truncated
                     else PRODUCTS[spec.dtype, spec.math] if kernel_plan.tensor_cores
                     else f"{spec.dtype.short_name.upper()} products on the FMA pipe (exact in FP32)"),
        "terms": kernel_plan.context.reference_terms,
        "products_per_term": roundoff.products_per_term,
        "constants": {name: c_double(value) for name, value in constants.items()},
        "powers": {name: powers_of_two(value) for name, value in constants.items()},
    }


def bench_work(kernel_plan) -> dict:
    """What the ``-DCONVGEN_BENCH`` timer divides by the median time: a convolution's FLOPs, else
    the bytes of every input read once and the output written once, as ``convgen bench`` reports
    the memory-bound families (im2col, col2im)."""
    if get_family(kernel_plan.family).convolution:
        return {"bench_flops": convolution_flops(kernel_plan.spec), "bench_bytes": 0}
    return {"bench_flops": 0, "bench_bytes": sum(b.elements * b.dtype.itemsize for b in kernel_plan.buffers
                                             if b.role != "workspace")}


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
         launcher: str | None = None, arch: str | None = None, workspace_limit: int | None = None,
         target: Device | str | None = None) -> Path:
    """Write the standalone file for ``family`` and ``spec`` to ``path``."""
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"emit's path must be a file path (str or os.PathLike); got {type(path).__name__}")
    if os.fspath(path) == "":
        raise write_error("", "an empty path")
    path = Path(path)
    write_if_changed(path, emit_source(family, spec, tiles, launcher, path.name, arch, workspace_limit, target))
    return path
