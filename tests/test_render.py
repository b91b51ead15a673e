"""Rendering: deterministic, self-describing, strict about missing context."""
import dataclasses
import subprocess
import sys
from typing import Any

import jinja2
import pytest

from codegen import __version__
from codegen.api import plan
from codegen.families.base import TemplateContext
from codegen.render import environment, render, render_kernels
from codegen.spec import ConvSpec

SPEC = ConvSpec(dims=3, layout="NDHWC", n=2, c=5, k=4, input_size=(4, 6, 7), filter_size=(2, 3, 3), stride=(1, 2, 1),
                padding=(0, 1, 1), dilation=(1, 1, 2), dpitch=8)


@pytest.mark.parametrize("family, tiles", [("im2col", None), ("im2col", {"vectorized": False}),
                                           ("col2im", {"algorithm": "gather"}), ("col2im", {"algorithm": "scatter"})])
def test_same_inputs_render_byte_identical_source(family, tiles):
    first = render_kernels(plan(family, SPEC, tiles)).code
    assert render_kernels(plan(family, SPEC, tiles)).code == first
    code = (f"from codegen.api import plan; from codegen.render import render_kernels; from codegen.spec import ConvSpec; "
            f"import sys; sys.stdout.write(render_kernels(plan({family!r}, ConvSpec.from_dict({SPEC.to_dict()!r}), "
            f"{tiles!r})).code)")
    other_process = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert other_process == first


def test_header_echoes_spec_tiles_version_and_index_type():
    kernel_plan = plan("im2col", SPEC)
    code = render_kernels(kernel_plan).code
    header = code.split("\n\n")[0]
    assert f"convgen {__version__}" in header
    assert SPEC.describe() in header
    assert kernel_plan.tiles.describe() in header
    assert "index type: int" in header
    assert kernel_plan.launches[0].kernel in header


def test_header_states_the_workspace_in_bytes_where_there_is_one():
    spec = ConvSpec(dims=2, layout="NCHW", n=4, c=8, k=8, input_size=12, filter_size=3, padding=1)
    windowed = plan("im2win", spec, {"batch_chunk": 2})
    header = render_kernels(windowed).code.split("\n\n")[0]
    assert f"//   workspace: {windowed.workspace_bytes:,} bytes (" in header
    assert windowed.workspace_bytes == 2 * 8 * 12 * 14 * 3 * 4   # chunk x C x OH x padded W x R, fp32
    assert "workspace:" not in render_kernels(plan("implicit_gemm", spec)).code.split("\n\n")[0]


def test_different_specs_render_different_kernel_names():
    other = ConvSpec.from_dict({**SPEC.to_dict(), "n": 3})
    assert plan("im2col", SPEC).launches[0].kernel != plan("im2col", other).launches[0].kernel


def test_missing_context_is_an_error_not_an_empty_string():
    """A template that reads a field its context class lacks fails to render (StrictUndefined)."""
    kernel_plan = plan("im2col", SPEC)
    kept = [item for item in dataclasses.fields(kernel_plan.context) if item.name != "cols"]
    lacking = dataclasses.make_dataclass("LackingCols", [(item.name, Any) for item in kept], bases=(TemplateContext,),
                                         frozen=True)
    context = lacking(**{item.name: getattr(kernel_plan.context, item.name) for item in kept})
    broken = dataclasses.replace(kernel_plan, context=context)
    with pytest.raises(jinja2.UndefinedError, match="cols"):
        render(broken)
    assert environment().undefined is jinja2.StrictUndefined


def test_a_plan_names_its_template_and_the_tma_kernel_has_its_own():
    """A plan renders ``<family>.cu.j2`` unless it names another: implicit_gemm's TMA kernel lives in
    its own template, and its context's enums reach the template as their strings."""
    from codegen.families.gemm_tiles import GemmVariant
    from codegen.families.implicit_gemm import GatherWide, TmaGatherContext, TmaIm2colContext

    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=32, k=64, input_size=(10, 10), filter_size=3, padding=1)
    portable, tma = plan("implicit_gemm", spec), plan("implicit_gemm", spec, {"tma": True})
    assert (portable.template, tma.template) == ("implicit_gemm.cu.j2", "implicit_gemm_tma.cu.j2")
    assert plan("im2col", spec).template == "im2col.cu.j2"
    assert portable.context.variant is GemmVariant.PRECOMP and tma.context.variant is GemmVariant.TMA
    assert isinstance(tma.context, TmaIm2colContext) and tma.context.variables()["variant"] == "tma" == tma.variant
    gathered = plan("implicit_gemm", ConvSpec.from_dict({**spec.to_dict(), "layout": "NCHW"}), {"tma": True}).context
    assert isinstance(gathered, TmaGatherContext) and isinstance(gathered.gather_wide, GatherWide)
    assert type(gathered.variables()["gather_wide"]) is str
    assert "convgen_im2col_copy(" in render_kernels(tma).code and "convgen_im2col_copy(" not in render_kernels(portable).code


def test_generated_source_is_tidy():
    code = render_kernels(plan("col2im", SPEC)).code
    assert "\n\n\n" not in code and code.endswith("\n") and not code.startswith("\n")
    assert all(line == line.rstrip() for line in code.splitlines())


@pytest.mark.parametrize("family", ["implicit_gemm", "im2win"])
def test_gemm_copy_switch_changes_the_kernel(family):
    """async_copy=False renders the register-staging loader (a template import once shadowed the
    switch, so both settings rendered cp.async)."""
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=8, k=8, input_size=(12, 12), filter_size=3)
    staged = render_kernels(plan(family, spec, {"async_copy": False, "stages": 2})).code
    copied = render_kernels(plan(family, spec, {"async_copy": True, "stages": 2})).code
    assert "cp.async" not in staged and "staged_a" in staged
    assert "cp.async" in copied and "staged_a" not in copied


def test_two_template_directories_render_side_by_side(tmp_path):
    """A copy of the package's templates with im2col's edited renders while the package's templates
    render in another thread, each from its own directory.  The copy's render is held at its start,
    before it loads im2col's template, until the other has finished: one template directory for the
    whole module, swapped for a render from another (as render.py once had for the A/B scripts), or
    one environment whose loader is swapped, would hand one of them the other's templates."""
    import shutil
    import threading

    from codegen.render import PACKAGE_TEMPLATES

    copy = tmp_path / "templates"
    shutil.copytree(PACKAGE_TEMPLATES, copy)
    (copy / "kernel.cu.j2").write_text("{{- hold() -}}\n" + (copy / "kernel.cu.j2").read_text())
    edited = copy / "im2col.cu.j2"
    edited.write_text(edited.read_text().replace('extern "C" __global__', '// EDITED\nextern "C" __global__'))
    kernel_plan = plan("im2col", SPEC)
    package = render_kernels(kernel_plan).code
    midway, finished = threading.Event(), threading.Event()
    results = {}

    def hold():
        midway.set()
        assert finished.wait(timeout=60), "the package's render did not finish"
        return ""

    def from_package():
        try:
            if midway.wait(timeout=60):
                results["package"] = render_kernels(kernel_plan).code
        finally:
            finished.set()

    other = threading.Thread(target=from_package)
    other.start()
    results["copy"] = render(kernel_plan, templates=copy, hold=hold)
    other.join(timeout=60)
    assert results["package"] == package
    assert "// EDITED" in results["copy"] and results["copy"].replace("// EDITED\n", "") == package


@pytest.mark.parametrize("block_m, thread_m, uniform", [(128, 8, True), (64, 4, False)])
def test_block_wide_pixel_loader_reads_the_row_table_at_constant_rows(block_m, thread_m, uniform):
    """Where one thread per pixel loads every row of the slice (128 threads, 128 pixels), the k
    slots are constants, so the table index is the same in every thread (a uniform load, 1-2 %
    faster: docs/perf-history.md, GEMM v19); with 64 pixels and 128 threads each thread takes every other row
    and the slot depends on the thread."""
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=8, k=64, input_size=(12, 12), filter_size=3)
    tiles = {"block_m": block_m, "block_n": 64, "block_k": 16, "warp_m": 32, "warp_n": 64 * thread_m // 8,
             "thread_m": thread_m, "thread_n": 8, "vector_load": False}
    kernel_plan = plan("implicit_gemm", spec, tiles)
    assert kernel_plan.context.a_load["m_fastest"] and kernel_plan.launches[0].block == (128, 1, 1)
    loader = render_kernels(kernel_plan).code.split("auto fetch")[1].split("&Bs[")[0]
    slots = [line.split("=")[1].strip(" ;") for line in loader.splitlines() if "const int k_local" in line]
    slots = [slot for slot in slots if "tid %" not in slot]  # B's first slot (k-fastest) comes before its copy
    if uniform:
        assert slots == [str(r) for r in range(16)]
    else:
        assert len(slots) == 8 and all("tid / 64" in slot for slot in slots)
