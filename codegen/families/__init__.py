"""The kernel families: one module and one template each."""
from __future__ import annotations

from codegen.families import col2im, direct, im2col, im2col_gemm, im2win, implicit_gemm
from codegen.families.base import Family
from codegen.spec import ConvSpec, SpecError

FAMILIES: dict[str, Family] = {f.name: f for f in (im2col.FAMILY, col2im.FAMILY, direct.FAMILY, implicit_gemm.FAMILY,
                                                   im2win.FAMILY, im2col_gemm.FAMILY)}


def get_family(name: str, spec: ConvSpec | None = None) -> Family:
    """The family called ``name``; with ``spec``, the one of its kernels that runs that spec's dtype
    and math mode (implicit_gemm's tensor-core kernel for float16, bfloat16, tf32 and 3xtf32)."""
    try:
        family = FAMILIES[name]
    except (KeyError, TypeError):
        raise SpecError("family", name, f"must be one of {', '.join(FAMILIES)}") from None
    return family if spec is None else family.for_spec(spec)
