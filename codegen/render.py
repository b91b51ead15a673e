"""Rendering: a ``KernelPlan`` through the family's Jinja2 template into CUDA source.

StrictUndefined makes a missing context value an error at render time instead of an empty
string in the kernel; the same plan always renders byte-identical source.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

import jinja2

from codegen.version import __version__
from codegen.launch_limits import block_index
from codegen.families.base import KernelPlan, format_bytes

PACKAGE_TEMPLATES = Path(__file__).resolve().parent / "templates"


@cache
def environment(directory: Path = PACKAGE_TEMPLATES) -> jinja2.Environment:
    """The environment that reads templates from ``directory``, one per directory: each render
    names its directory, so renders from different directories can run side by side (the tuner
    builds its candidates in threads)."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(directory)),
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
        **plan.context.variables(),
        "version": __version__,
        "family": plan.family,
        "family_template": plan.template,
        "spec_line": plan.spec.describe(),
        "tiles_line": plan.tiles.describe(),
        "launches": plan.launches,
        "block_index": {launch.kernel: block_index(launch.fold) for launch in plan.launches},
        "batch_chunks": plan.chunks,
        "chunk_advance": plan.chunk_advance,
        "chunk_images": plan.spec.n // plan.chunks,
        "buffers": plan.buffers,
        "checked_alignments": [b for b in plan.buffers if b.alignment > b.dtype.itemsize],
        "workspace_bytes": plan.workspace_bytes,
        "workspace_size": format_bytes(plan.workspace_bytes),
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


def render(plan: KernelPlan, template: str = "kernel.cu.j2", templates: Path = PACKAGE_TEMPLATES, **extra) -> str:
    """Render ``template`` of the directory ``templates`` (the package's by default) for ``plan``;
    ``extra`` adds context (the emitter's launcher names)."""
    code = environment(Path(templates)).get_template(template).render(**_context(plan), **extra)
    return _tidy(code)


def render_kernels(plan: KernelPlan, templates: Path = PACKAGE_TEMPLATES) -> KernelSource:
    """The kernels' source of ``plan``, from the templates in ``templates`` (the package's by default)."""
    return KernelSource(plan, render(plan, templates=templates))
