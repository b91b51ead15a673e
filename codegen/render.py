"""Rendering: a ``KernelPlan`` through the family's Jinja2 template into CUDA source.

StrictUndefined makes a missing context value an error at render time instead of an empty
string in the kernel; the same plan always renders byte-identical source.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from codegen import __version__
from codegen.families.base import KernelPlan

TEMPLATE_DIR = Path(__file__).resolve().parent / "templates"


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=False,
        lstrip_blocks=False,
        autoescape=False,
    )


@dataclass(frozen=True)
class KernelSource:
    plan: KernelPlan
    code: str


def _context(plan: KernelPlan) -> dict:
    return {
        **plan.context,
        "version": __version__,
        "family": plan.family,
        "family_template": f"{plan.family}.cu.j2",
        "spec_line": plan.spec.describe(),
        "tiles_line": plan.tiles.describe(),
        "launches": plan.launches,
        "batch_chunks": plan.chunks,
        "chunk_advance": plan.chunk_advance,
        "chunk_images": plan.spec.n // plan.chunks,
        "buffers": plan.buffers,
        "zero_output": plan.zero_output,
        "constants": plan.constants,
    }


def _tidy(code: str) -> str:
    lines = [line.rstrip() for line in code.splitlines()]
    tidy: list[str] = []
    for line in lines:
        if line == "" and tidy and tidy[-1] == "":
            continue
        tidy.append(line)
    return "\n".join(tidy).strip("\n") + "\n"


def render(plan: KernelPlan, template: str = "kernel.cu.j2", **extra) -> str:
    """Render ``template`` for ``plan``; ``extra`` adds context (the emitter's launcher names)."""
    code = environment().get_template(template).render(**_context(plan), **extra)
    return _tidy(code)


def render_kernels(plan: KernelPlan) -> KernelSource:
    return KernelSource(plan, render(plan))
