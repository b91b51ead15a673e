"""Rendering: a ``KernelPlan`` through the family's Jinja2 template into CUDA source.

StrictUndefined makes a missing context value an error at render time instead of an empty
string in the kernel; the same plan always renders byte-identical source.
"""
from __future__ import annotations

import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import jinja2

from codegen.version import __version__
from codegen.launch_limits import block_index
from codegen.families.base import KernelPlan, format_bytes

PACKAGE_TEMPLATES = Path(__file__).resolve().parent / "templates"
TEMPLATE_DIR = PACKAGE_TEMPLATES
"""Where templates are read from: the package's, or inside ``templates_from`` an edited copy."""


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


def edited_templates(root: Path, name: str, edit: Callable[[str], str], template: str = "implicit_gemm.cu.j2") -> Path:
    """A copy of the package's templates in ``root / name`` whose ``template`` reads ``edit(text)``,
    for an A/B script's variant of a kernel (made once; a later call returns the copy)."""
    target = Path(root) / name
    if not target.exists():
        shutil.copytree(PACKAGE_TEMPLATES, target)
        path = target / template
        path.write_text(edit(path.read_text()))
    return target


@contextmanager
def templates_from(directory: Path) -> Iterator[None]:
    """Render from ``directory`` (an ``edited_templates`` copy) inside the block, the package's
    templates again after it."""
    global TEMPLATE_DIR
    TEMPLATE_DIR = Path(directory)
    environment.cache_clear()
    try:
        yield
    finally:
        TEMPLATE_DIR = PACKAGE_TEMPLATES
        environment.cache_clear()


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
        "block_index": {launch.kernel: block_index(launch.fold) for launch in plan.launches},
        "batch_chunks": plan.chunks,
        "chunk_advance": plan.chunk_advance,
        "chunk_images": plan.spec.n // plan.chunks,
        "buffers": plan.buffers,
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


def render(plan: KernelPlan, template: str = "kernel.cu.j2", **extra) -> str:
    """Render ``template`` for ``plan``; ``extra`` adds context (the emitter's launcher names)."""
    code = environment().get_template(template).render(**_context(plan), **extra)
    return _tidy(code)


def render_kernels(plan: KernelPlan) -> KernelSource:
    return KernelSource(plan, render(plan))
