"""The kernel families: one module and one template each."""
from __future__ import annotations

from codegen.families import col2im, direct, im2col, im2col_gemm, im2win, implicit_gemm
from codegen.families.base import Family
from codegen.spec import SpecError

FAMILIES: dict[str, Family] = {f.name: f for f in (im2col.FAMILY, col2im.FAMILY, direct.FAMILY, implicit_gemm.FAMILY,
                                                   im2win.FAMILY, im2col_gemm.FAMILY)}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except (KeyError, TypeError):
        raise SpecError("family", name, f"must be one of {', '.join(FAMILIES)}") from None
