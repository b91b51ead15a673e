"""CPU tier of the memory-bound families in float16 and bfloat16 (issue 36, item 3): im2col, col2im
(gather) and direct store 16-bit data and compute in FP32; each refusal names its field; every
variant compiles with NVRTC without spills or warnings (bfloat16 on sm_75 too, where cvt has no
bf16); the plan, the cache key and the index maps take the dtype; emitted files build with nvcc and
their self-test's oracle and bound are codegen/precision.py's."""
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen import precision
from codegen.api import compile_plan, plan
from codegen.cli import main
from codegen.emit import build_flags, emit, emit_source
from codegen.families import get_family
from codegen.families.col2im import image_reference
from codegen.fuzz import check_on_cpu, check_result, specs
from codegen.render import render_kernels
from codegen.spec import ConvSpec, DType, Layout, SpecError

SIXTEEN_BIT = ("float16", "bfloat16")
MEMORY_BOUND = ("im2col", "col2im", "direct")
NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")

CASES = {
    # family, tiles: every 16-bit kernel, with the vector widths each takes.
    "im2col channels_first": ("im2col", None),
    "im2col channels_first split": ("im2col", {"split_outer_tap": True}),
    "im2col channels_last": ("im2col", {"vectorized": False}),
    "im2col vector": ("im2col", {"vectorized": True}),
    "col2im gather": ("col2im", {"algorithm": "gather"}),
    "col2im gather channel groups": ("col2im", {"algorithm": "gather", "channels": 4}),
    "direct basic": ("direct", {"variant": "basic"}),
    "direct constant": ("direct", {"variant": "constant"}),
    "direct tiled_halo": ("direct", {"variant": "tiled_halo"}),
    "direct tiled_cache": ("direct", {"variant": "tiled_cache"}),
    "direct tiled_register": ("direct", {"variant": "tiled_register"}),
    "direct tiled_register constant": ("direct", {"variant": "tiled_register", "filter_memory": "constant",
                                                  "stages": 2}),
}
"""Each 16-bit kernel: (family, tiles)."""


def _spec(layout: str = "NCHW", dtype: str = "bfloat16", **changes) -> ConvSpec:
    """A small spec with padding, a stride and 4- and 8-aligned widths where the layout allows."""
    dims = Layout(layout).dims
    fields = dict(dims=dims, layout=layout, n=2, c=8, k=3, input_size=(9, 16) if dims == 2 else (4, 6, 16),
                  filter_size=3, padding=1, dtype=dtype)
    return ConvSpec(**{**fields, **changes})


def _kernel_case(name: str, layout: str, dtype: str):
    family, tiles = CASES[name]
    if name.startswith("im2col channels_first"):
        layout = "NCHW" if Layout(layout).dims == 2 else "NCDHW"
    if name in ("im2col channels_last", "im2col vector"):
        layout = "NHWC" if Layout(layout).dims == 2 else "NDHWC"
    return family, tiles, _spec(layout, dtype)


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize("name", CASES)
def test_every_kernel_plans_its_buffers_in_the_dtype(name, dtype):
    family, tiles, spec = _kernel_case(name, "NCHW", dtype)
    kernel_plan = plan(family, spec, tiles)
    assert not kernel_plan.tensor_cores
    assert {b.dtype for b in kernel_plan.buffers} == {DType(dtype)}
    code = render_kernels(kernel_plan).code
    assert "typedef unsigned short convgen_element;" in code and "const float* __restrict__" not in code
    assert f"#include <{'cuda_fp16.h' if dtype == 'float16' else 'cuda_bf16.h'}>" in code


@pytest.mark.parametrize("arch", ["sm_90", "sm_80", "sm_75"])
@pytest.mark.parametrize("layout", ["NCHW", "NHWC", "NCDHW"])
@pytest.mark.parametrize("name", CASES)
def test_every_kernel_compiles_without_spills_or_warnings(name, layout, arch):
    """bfloat16 on every target (before sm_80 its rounding is integer code), float16 on sm_90."""
    for dtype in ("bfloat16",) if arch != "sm_90" else SIXTEEN_BIT:
        family, tiles, spec = _kernel_case(name, layout, dtype)
        try:
            kernel_plan = plan(family, spec, tiles, arch=arch)
        except SpecError as refused:   # a variant this layout has no kernel for (as in float32)
            assert refused.field.startswith("tiles."), refused
            continue
        kernel = compile_plan(kernel_plan, arch)
        assert not kernel.compiled.warnings, kernel.compiled.log
        for function, used in kernel.compiled.resources.items():
            assert (used.spill_stores, used.spill_loads, used.stack_bytes) == (0, 0, 0), (function, used)


@settings(max_examples=15, deadline=None)
@given(spec=specs(max_size=40, max_channels=12, pinned={"dtype": "bfloat16"}),
       family=st.sampled_from(MEMORY_BOUND))
def test_heuristic_kernels_of_drawn_specs_compile_clean(spec, family):
    kernel = compile_plan(plan(family, spec), "sm_90")
    assert not kernel.compiled.warnings, kernel.compiled.log
    assert all(not (r.spill_stores or r.stack_bytes) for r in kernel.compiled.resources.values())


@settings(max_examples=30, deadline=None)
@given(spec=specs(pinned={"dtype": "float16"}) | specs(pinned={"dtype": "bfloat16"}),
       family=st.sampled_from(MEMORY_BOUND), seed=st.integers(0, 2**16))
def test_index_maps_of_16_bit_plans_match_the_reference(spec, family, seed):
    """The plans render, and their index maps reproduce the reference on the stored inputs decoded."""
    assert check_on_cpu(family, spec, seed=seed) is None


def test_the_dtype_is_in_the_kernel_and_so_in_the_cache_key():
    sources = {dtype: render_kernels(plan("direct", _spec(dtype=dtype), {"variant": "tiled_register"})).code
               for dtype in ("float32", *SIXTEEN_BIT)}
    assert len(set(sources.values())) == 3
    names = {plan("im2col", _spec(dtype=dtype)).launches[0].kernel for dtype in ("float32", *SIXTEEN_BIT)}
    assert len(names) == 3


@pytest.mark.parametrize("family", MEMORY_BOUND)
@pytest.mark.parametrize("math_mode", ["tf32", "3xtf32"])
def test_math_modes_are_refused_naming_the_field(family, math_mode):
    with pytest.raises(SpecError) as refused:
        plan(family, _spec(dtype="float32", math=math_mode))
    assert refused.value.field == "math" and "math=fma" in refused.value.allowed
    assert "implicit_gemm" in refused.value.allowed


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_im2win_refuses_16_bit_naming_its_fp32_gemm(dtype):
    with pytest.raises(SpecError) as refused:
        plan("im2win", _spec(dtype=dtype))
    assert refused.value.field == "dtype" and refused.value.value == dtype
    assert "GEMM core" in refused.value.allowed and "implicit_gemm" in refused.value.allowed


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
def test_scatter_and_tma_are_refused_in_16_bit_naming_the_tile(dtype):
    with pytest.raises(SpecError) as scatter:
        plan("col2im", _spec(dtype=dtype), {"algorithm": "scatter"})
    assert scatter.value.field == "tiles.algorithm" and "gather" in scatter.value.allowed
    with pytest.raises(SpecError) as tma:
        plan("direct", _spec(dtype=dtype, input_size=(16, 32)), {"variant": "tiled_tma"})
    assert tma.value.field == "tiles.variant" and "tiled_register" in tma.value.allowed


def test_16_bit_tiled_register_needs_no_cp_async():
    """It loads through registers, so it runs before sm_80; float32 still needs cp.async."""
    assert plan("direct", _spec(), {"variant": "tiled_register"}).min_arch == 0
    assert plan("direct", _spec(dtype="float32"), {"variant": "tiled_register"}).min_arch == 80


@pytest.mark.parametrize("dtype, loads", [("bfloat16", 8), ("float16", 8), ("float32", 4)])
def test_vector_kernels_move_16_bytes_where_the_pitch_allows(dtype, loads):
    wide = plan("im2col", _spec("NHWC", dtype, c=16, input_size=(8, 16)))
    assert (wide.variant, wide.context.load_elements) == ("vec16", loads)
    assert wide.context.store_elements == 16 // DType(dtype).itemsize and wide.output.alignment == 16
    narrow = plan("im2col", _spec("NHWC", dtype, c=12, input_size=(8, 16)))
    assert narrow.context.load_elements == 4 and narrow.inputs[0].alignment == 4 * DType(dtype).itemsize
    odd = plan("im2col", _spec("NHWC", dtype, n=1, c=3, input_size=(7, 7)))   # 49 columns: one a store
    assert odd.variant == "channels_last" and odd.output.alignment == DType(dtype).itemsize
    register = plan("direct", _spec(dtype=dtype, input_size=(16, 64)), {"variant": "tiled_register"})
    assert register.context.vector_load and register.inputs[0].alignment == 16
    misaligned = plan("direct", _spec(dtype=dtype, input_size=(16, 68)), {"variant": "tiled_register"})
    assert misaligned.context.vector_load is (dtype == "float32")   # 68 columns: 4-aligned, not 8


def test_channels_first_16_bit_im2col_gathers_unit_stride_columns_for_one_wide_store():
    wide = plan("im2col", _spec("NCHW", c=3, input_size=(8, 8), padding=1))   # 128 columns
    assert wide.context.columns_per_thread == 8 and "convgen_store8(" in render_kernels(wide).code
    odd = plan("im2col", _spec("NCHW", c=3, input_size=(7, 7), padding=1))   # 98 columns
    assert odd.context.columns_per_thread == 2 and "convgen_store2(" in render_kernels(odd).code
    strided = plan("im2col", _spec("NCHW", c=3, input_size=(8, 16), padding=1, stride=(1, 2)))
    assert strided.context.columns_per_thread == 1 and "convgen_store_bits(col_out" in render_kernels(strided).code
    pixels = plan("im2col", _spec("NHWC", c=3, input_size=(8, 8), padding=1))   # channels-last, unvectorised
    assert pixels.variant == "channels_last" and pixels.context.columns_per_thread == 1


@pytest.mark.parametrize("dtype", SIXTEEN_BIT)
@pytest.mark.parametrize("family", MEMORY_BOUND)
def test_inputs_are_stored_in_the_dtype_and_never_zero(family, dtype):
    spec = _spec(dtype=dtype)
    inputs = get_family(family, spec).make_inputs(spec, np.random.default_rng(0))
    for stored in inputs:
        assert stored.dtype == (np.uint16 if dtype == "bfloat16" else np.float16)
        assert (precision.from_storage(stored, spec.dtype) != 0).all()


def test_im2col_is_held_to_equality_and_col2im_to_one_rounding():
    spec = _spec(dtype="bfloat16")
    (x,) = get_family("im2col").make_inputs(spec, np.random.default_rng(1))
    expected = get_family("im2col").reference(spec, x)
    assert check_result(spec, expected, expected, [x], "im2col") is None
    nudged = expected.copy()
    nudged.flat[7] += 2.0**-20
    assert "outside the error bound" in str(check_result(spec, nudged, expected, [x], "im2col"))

    (col,) = get_family("col2im").make_inputs(spec, np.random.default_rng(2))
    exact = get_family("col2im").reference(spec, col)
    rounded = precision.from_storage(precision.to_storage(exact, DType.bfloat16), DType.bfloat16)
    assert check_result(spec, rounded, exact, [col], "col2im") is None
    bound = get_family("col2im").error_bound(spec, [col])
    assert (bound > 0).all() and (bound < 2.0**-7 * (np.abs(exact) + 1e-30) + 1e-3).all()
    wrong = rounded.copy()
    wrong.flat[5] += 4 * bound.flat[5]
    assert "outside the error bound" in str(check_result(spec, wrong, exact, [col], "col2im"))


def test_16_bit_fuzz_runs_from_the_command_line(capsys):
    assert main(["fuzz", "col2im", "--dtype", "bf16", "--examples", "4", "--seed", "3"]) == 0
    assert "dtype=bf16" in capsys.readouterr().out
    assert main(["fuzz", "direct", "--dtype", "fp16", "--tile", "variant=tiled_register", "--examples", "3",
                 "--seed", "3"]) == 0


def test_emitted_files_state_their_precision():
    text = emit_source("im2col", _spec("NHWC", c=8, input_size=(8, 16)), launcher="unfold")
    assert 'extern "C" cudaError_t unfold(const __nv_bfloat16* x, __nv_bfloat16* col, cudaStream_t stream)' in text
    assert "// Precision: bfloat16 x and col; a copy of the elements' bits, exact" in text
    assert "static double convgen_bound(double, double)" in text and "return 0.0;" in text
    gather = emit_source("col2im", _spec(dtype="float16"))
    assert "// Precision: float16 col and image;" in gather and "L = 9" in gather
    assert "static const double convgen_u_out = 0.00048828125;" in gather
    direct = emit_source("direct", _spec(), {"variant": "tiled_register"})
    assert "BF16 products on the FMA pipe (exact in FP32)" in direct and "tensor cores" not in direct
    assert "each accumulated term's (twice FP32's unit roundoff)" in direct


def _emitted(tmp_path):
    """One file of each family and dtype, with the kernels' vector paths and their scalar fallbacks."""
    files = []
    for dtype in SIXTEEN_BIT:
        for name, (family, tiles) in CASES.items():
            layout = "NHWC" if name in ("im2col channels_last", "im2col vector") else "NCHW"
            files.append(emit(family, _spec(layout, dtype), tmp_path / f"{name.replace(' ', '_')}_{dtype}.cu", tiles))
        files.append(emit("im2col", _spec("NDHWC", dtype, c=5, dpitch=12, input_size=(3, 5, 7)),
                          tmp_path / f"im2col_3d_{dtype}.cu"))
        files.append(emit("col2im", _spec("NHWC", dtype, c=40, input_size=(5, 6)), tmp_path / f"col2im_tiled_{dtype}.cu"))
    files.append(emit("direct", _spec(), tmp_path / "direct_sm75.cu", {"variant": "tiled_register"}, arch="sm_75"))
    return files


@needs_nvcc
def test_emitted_16_bit_files_build_with_nvcc_without_warnings(tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    def build(path):
        flags = build_flags(path.read_text())
        return path, subprocess.run([NVCC, *flags, "-Werror", "all-warnings", "-DCONVGEN_SELFTEST", "-DCONVGEN_BENCH",
                                     "-c", str(path), "-o", str(path.with_suffix(".o"))], capture_output=True, text=True)

    with ThreadPoolExecutor(max_workers=8) as pool:
        results = list(pool.map(build, _emitted(tmp_path)))
    failed = [(str(path), done.stderr) for path, done in results if done.returncode or done.stderr.strip()]
    assert not failed, failed[0]


DRIVER = """#define main convgen_selftest_main
#include "kernel.cu"
#undef main
#include <cstdio>
// Prints reference_at() and convgen_bound() of every output for the input in in.bin (float32 values of
// the stored input): the self-test's oracle, run on the host without a GPU.
int main()
{{
    std::vector<float> input({size});
    std::FILE* file = std::fopen("in.bin", "rb");
    if (std::fread(input.data(), sizeof(float), input.size(), file) != input.size()) return 1;
    std::fclose(file);
    for (long long e = 0; e < {outputs}LL; ++e) {{
        double magnitude = 0.0;
        const double want = reference_at(input.data(), e, &magnitude);
        std::printf("%.17g %.17g\\n", want, convgen_bound(want, magnitude));
    }}
    return 0;
}}
"""


@needs_nvcc
@pytest.mark.parametrize("family, dtype", [("im2col", "bfloat16"), ("col2im", "bfloat16"), ("col2im", "float16")])
def test_selftest_oracle_and_bound_are_the_family_s(tmp_path, family, dtype):
    """A transform's self-test, built with nvcc and run on the host, gives the family's reference and
    error bound for the same stored input (zero for im2col's copy)."""
    spec = _spec("NHWC", dtype, c=5, stride=2)
    path = emit(family, spec, tmp_path / "kernel.cu")
    fam = get_family(family, spec)
    (stored,) = fam.make_inputs(spec, np.random.default_rng(7))
    precision.from_storage(stored, spec.dtype).astype(np.float32).tofile(tmp_path / "in.bin")
    outputs = plan(family, spec).output.elements
    (tmp_path / "driver.cu").write_text(DRIVER.format(size=stored.size, outputs=outputs))
    built = subprocess.run([NVCC, *build_flags(path.read_text()), "-DCONVGEN_SELFTEST", "driver.cu", "-o", "driver"],
                           cwd=tmp_path, capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run(["./driver"], cwd=tmp_path, capture_output=True, text=True, check=True)
    printed = np.array([[float(v) for v in line.split()] for line in run.stdout.splitlines()])
    np.testing.assert_allclose(printed[:, 0], fam.reference(spec, stored).ravel(), rtol=1e-12, atol=1e-15)
    np.testing.assert_allclose(printed[:, 1], fam.error_bound(spec, [stored]).ravel(), rtol=1e-12, atol=0)


def test_col2im_bound_is_the_sum_model():
    """E = e_acc L S with L = taps, then one rounding: checked against its parts."""
    spec = _spec(dtype="float16", c=2)
    (col,) = get_family("col2im").make_inputs(spec, np.random.default_rng(4))
    values = precision.from_storage(col, spec.dtype)
    magnitude = image_reference(spec, np.abs(values))
    accumulated = 2.0**-23 * 9 * magnitude
    expected = accumulated + 2.0**-11 * (np.abs(image_reference(spec, values)) + accumulated) + 2.0**-25
    np.testing.assert_array_equal(get_family("col2im").error_bound(spec, [col]), expected)


@settings(max_examples=40, deadline=None)
@given(spec=specs(layouts=(Layout.NCHW, Layout.NCDHW)), group=st.sampled_from((1, 2, 3, 4, 8)))
def test_col2im_channel_groups_cover_every_image_element_once(spec, group):
    """The channels-first gather's groups (``image_coords_in_groups``): thread t's first channel c and the group's
    channels c + j below C reach every element's offset exactly once."""
    from codegen import index
    from codegen.index import IndexAlgebra

    alg = IndexAlgebra(spec)
    t = np.arange(spec.n * -(-spec.c // group) * int(np.prod(spec.input_size)))
    names = ["n", "c"] + [f"i{j}" for j in range(spec.dims)]
    coords = {name: index.evaluate(expr, {"t": t}) for name, expr in zip(names, alg.image_coords_in_groups(group))}
    assert (coords["c"] % group == 0).all()
    reached = np.zeros(alg.image_elements, dtype=int)
    for j in range(group):
        inside = coords["c"] + j < spec.c
        offsets = index.evaluate(alg.x_offset, {**coords, "c": coords["c"] + j})
        np.add.at(reached, offsets[inside], 1)
    assert (reached == 1).all()


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_col2im_channel_groups_step_rows_as_row_of_does(layout):
    """A group's next channel is one column-matrix row on channels-last, taps rows on channels-first: the step the
    template adds per channel (cols or taps x cols elements) is row_of's."""
    from codegen.index import IndexAlgebra, evaluate

    spec = _spec(layout, c=5)
    alg = IndexAlgebra(spec)
    kk = np.arange(alg.taps)
    rows = [evaluate(alg.row_of, {"kk": kk, "c": np.full_like(kk, c)}) for c in (0, 1, 3)]
    step = 1 if spec.layout.channels_last else alg.taps
    assert (rows[1] - rows[0] == step).all() and (rows[2] - rows[0] == 3 * step).all()


def test_col2im_16_bit_strided_gathers_take_four_channels_a_thread():
    """The default: four channels a thread where a 16-bit gather has a stride above 1; one at unit stride and in
    float32 (whose kernels stay as they were)."""
    family = get_family("col2im")
    for dtype in SIXTEEN_BIT:
        assert family.default_tiles(_spec(dtype=dtype, stride=2)).channels == 4
        assert family.default_tiles(_spec("NHWC", dtype=dtype, stride=(1, 2))).channels == 4
        assert family.default_tiles(_spec(dtype=dtype)).channels == 1
    assert family.default_tiles(_spec(dtype="float32", stride=2)).channels == 1


def test_col2im_scatter_refuses_channel_groups():
    with pytest.raises(SpecError, match="tiles.channels"):
        plan("col2im", _spec(dtype="float32"), {"algorithm": "scatter", "channels": 2})


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("layout, c", [("NCHW", 5), ("NCDHW", 3), ("NHWC", 5), ("NDHWC", 3), ("NHWC", 40)])
@pytest.mark.parametrize("channels", [2, 8])
def test_col2im_channel_groups_with_a_short_last_group_compile_clean(layout, c, channels, dtype):
    """Groups past C (the last one short, channels-last padding lanes written as zeros), and the 32x32 tiles'
    shared arithmetic from a pitch of 32: the kernels say so and compile without warnings."""
    spec = _spec(layout, dtype, c=c, stride=2)
    kernel_plan = plan("col2im", spec, {"algorithm": "gather", "channels": channels})
    code = render_kernels(kernel_plan).code
    alg = get_family("col2im").algebra(spec)
    if kernel_plan.variant == "gather_channels_last_tiled":
        assert "Channels c, c + 8, c + 16 and c + 24 share the window arithmetic." in code
        assert f"(idx_t)j * {8 * alg.cols}]" in code or f"(idx_t)j * {8 * alg.cols})" in code
    else:
        step = alg.cols if spec.layout.channels_last else alg.taps * alg.cols
        assert f"float sum[{channels}];" in code and f"c + j < {c}" in code
        assert f"(idx_t)j * {step}]" in code or f"(idx_t)j * {step})" in code
    assert compile_plan(kernel_plan, "sm_90").compiled.warnings == []
