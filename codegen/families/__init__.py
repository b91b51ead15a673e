"""The kernel families: one module and one template each."""
from __future__ import annotations

from codegen.families import col2im, direct, im2col
from codegen.families.base import Family
from codegen.spec import SpecError

FAMILIES: dict[str, Family] = {f.name: f for f in (im2col.FAMILY, col2im.FAMILY, direct.FAMILY)}


def get_family(name: str) -> Family:
    try:
        return FAMILIES[name]
    except KeyError:
        raise SpecError("family", name, f"must be one of {', '.join(FAMILIES)}") from None
