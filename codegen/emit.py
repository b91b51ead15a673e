"""Standalone ``.cu`` emission: kernels, a plain C launcher and a self-test, for plain ``nvcc``."""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

from codegen.api import check_arch, plan as make_plan
from codegen.compile import DEFAULT_ARCH
from codegen.render import render
from codegen.spec import ConvSpec, SpecError
from codegen.tiles import Tiles


def emit_source(family: str, spec: ConvSpec, tiles: Tiles | dict | None = None, launcher: str | None = None,
                file_name: str = "kernel.cu", arch: str = DEFAULT_ARCH) -> str:
    """The text of a standalone file; ``launcher`` names its ``extern "C"`` entry point."""
    kernel_plan = make_plan(family, spec, tiles)
    check_arch(kernel_plan, arch)
    if kernel_plan.steps:
        raise SpecError("family", family, "runs host steps (a cuBLAS GEMM) between launches and cannot be emitted "
                        "as a standalone file; emit its kernels' family (im2col) and call cublasSgemm")
    name = launcher or kernel_plan.launches[-1].kernel.replace(f"_{kernel_plan.variant}_", "_") + "_launch"
    return render(kernel_plan, "standalone.cu.j2", launcher=name, file_name=file_name, arch=arch,
                  output_name=kernel_plan.output.name, output_elements=kernel_plan.output.elements)


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
         launcher: str | None = None, arch: str = DEFAULT_ARCH) -> Path:
    """Write the standalone file for ``family`` and ``spec`` to ``path``."""
    path = Path(path)
    write_if_changed(path, emit_source(family, spec, tiles, launcher, path.name, arch))
    return path
