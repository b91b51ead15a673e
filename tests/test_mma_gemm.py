"""implicit_gemm's tensor-core kernel without a GPU: its plans and tiles, NVRTC compiles for sm_80 and
sm_90 (no warning, no spill), and the number formats and error bound of ``codegen.precision``."""
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codegen import precision
from codegen.api import check_arch, compile_plan
from codegen.device import TARGETS, Device
from codegen.families.mma_gemm import FAMILY, MmaTiles, a_load, b_load, check_tiles, heuristic_tiles, mma_k
from codegen.fuzz import GEMM_RANGES, specs
from codegen.render import render_kernels
from codegen.spec import ConvSpec, DType, MathMode, SpecError, replace

MODES = (("float16", "fma"), ("bfloat16", "fma"), ("float32", "tf32"), ("float32", "3xtf32"))
SPECS = {  # each load path: m-fastest elements, 16-byte copies, k-fastest elements; tails along M, N and K
    "2d-nchw-c3": ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=5, input_size=(9, 8), filter_size=(3, 2),
                           stride=(2, 1), padding=1, dilation=(1, 2)),
    "2d-nhwc-vector": ConvSpec(dims=2, layout="NHWC", n=2, c=16, k=40, input_size=(9, 8), filter_size=3, padding=1,
                               dpitch=24),
    "3d-ncdhw": ConvSpec(dims=3, layout="NCDHW", n=1, c=5, k=33, input_size=(4, 5, 6), filter_size=(2, 3, 3),
                         stride=(1, 2, 2), padding=(0, 1, 1)),
    "3d-ndhwc-odd-pitch": ConvSpec(dims=3, layout="NDHWC", n=1, c=7, k=17, input_size=(4, 5, 6), filter_size=3,
                                   padding=1, dilation=(2, 1, 1), dpitch=9),
}
CASES = [(name, dtype, math_mode) for name in SPECS for dtype, math_mode in MODES]


def _mode(spec: ConvSpec, dtype: str, math_mode: str) -> ConvSpec:
    return replace(spec, dtype=dtype, math=math_mode)


CARDS = {"sm_80": TARGETS["a100"], "sm_90": TARGETS["h100"]}


def _compiles_clean(spec: ConvSpec, tiles: MmaTiles, arch: str) -> None:
    kernel = compile_plan(FAMILY.plan(spec, tiles, CARDS[arch]), arch)
    assert kernel.compiled.warnings == [], kernel.compiled.warnings
    for resources in kernel.compiled.resources.values():
        assert resources.spill_stores == 0 and resources.stack_bytes == 0, (tiles.describe(), spec.describe())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name, dtype, math_mode", CASES, ids=[f"{n}-{d}-{m}" for n, d, m in CASES])
def test_heuristic_kernels_compile_without_warnings_or_spills(name, dtype, math_mode, arch, cache_dir):
    spec = _mode(SPECS[name], dtype, math_mode)
    _compiles_clean(spec, heuristic_tiles(spec, arch), arch)


@pytest.mark.parametrize("dtype, math_mode", MODES)
def test_full_size_tiles_compile_without_spills(dtype, math_mode, cache_dir):
    """The heuristic's largest tiles (128x128, 64x64 warps; 64x32 for 3xTF32) on a layer big enough
    to take them, with 16-byte copies and with element-wise loads."""
    for layout, c in (("NHWC", 64), ("NCHW", 3)):
        spec = ConvSpec(dims=2, layout=layout, n=8, c=c, k=256, input_size=(56, 56), filter_size=3, padding=1,
                        dtype=dtype, math=math_mode)
        tiles = heuristic_tiles(spec, "h100")
        assert (tiles.block_m, tiles.block_n) == (128, 128)
        _compiles_clean(spec, tiles, "sm_90")


@st.composite
def mma_tiles(draw, spec: ConvSpec, card: Device) -> MmaTiles:
    """Valid tiles for ``spec``'s MMA on ``card``: 1-8 warps of 16-64 rows and 8-64 columns, one to
    four MMA steps a slice, 2-4 stages (the GPU tier draws the same)."""
    atom_n = 8 if spec.dtype is DType.float32 else 16
    warp_m = draw(st.sampled_from((16, 32, 64)))
    warp_n = draw(st.sampled_from(tuple(n for n in (8, 16, 32, 64) if n >= atom_n)))
    try:
        tiles = MmaTiles(block_m=warp_m * draw(st.sampled_from((1, 2, 4))), block_n=warp_n * draw(st.sampled_from((1, 2))),
                         block_k=mma_k(spec) * draw(st.sampled_from((1, 2, 4))), warp_m=warp_m, warp_n=warp_n,
                         stages=draw(st.sampled_from((2, 3, 4))))
        check_tiles(spec, tiles, card)
    except SpecError:
        assume(False)
    return tiles


@settings(max_examples=6)
@given(data=st.data(), mode=st.sampled_from(MODES), arch=st.sampled_from(("sm_80", "sm_90")))
def test_random_specs_and_tiles_compile_without_warnings(data, mode, arch):
    spec = _mode(data.draw(specs(**GEMM_RANGES)), *mode)
    _compiles_clean(spec, data.draw(mma_tiles(spec, CARDS[arch])), arch)


@settings(max_examples=60)
@given(spec=specs(**GEMM_RANGES), mode=st.sampled_from(MODES), target=st.sampled_from(("h100", "a100", "a10")))
def test_heuristic_tiles_are_valid_and_fit_the_target(spec, mode, target):
    spec = _mode(spec, *mode)
    tiles = heuristic_tiles(spec, target)
    check_tiles(spec, tiles, TARGETS[target])
    assert tiles.threads in (128, 256)
    render_kernels(FAMILY.plan(spec, tiles, target))


def test_heuristic_reads_the_sm_count_of_its_target():
    """block_m halves while the grid has fewer tiles than the target has SMs."""
    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=64, k=128, input_size=(70, 128), filter_size=3, padding=1,
                    dtype="float16")
    assert heuristic_tiles(spec, "h100").block_m == 64           # 70 tiles of 128 rows < 132 SMs: 140 of 64
    assert heuristic_tiles(spec, "h100,sm_count=40").block_m == 128


@pytest.mark.parametrize("tiles, field", [
    ({"block_m": 64, "warp_m": 128}, "tiles.block_m"),
    ({"block_n": 32, "warp_n": 64}, "tiles.block_n"),
    ({"block_m": 256, "block_n": 256, "warp_m": 16, "warp_n": 64}, "tiles.block_m"),
    ({"warp_m": 128, "warp_n": 128, "block_m": 128, "block_n": 128}, "tiles.warp_n"),
    ({"block_k": 12}, "tiles.block_k"),
    ({"stages": 7}, "tiles.stages"),
])
def test_tile_geometry_errors_name_the_field(tiles, field):
    with pytest.raises(SpecError) as error:
        MmaTiles.from_dict({**MmaTiles().to_dict(), **tiles})
    assert error.value.field == field


@pytest.mark.parametrize("name, dtype, math_mode, tiles, field", [
    ("2d-nhwc-vector", "float16", "fma", {"block_k": 8}, "tiles.block_k"),
    ("2d-nhwc-vector", "bfloat16", "fma", {"warp_n": 8, "block_n": 16}, "tiles.warp_n"),
    ("2d-nhwc-vector", "float32", "3xtf32", {}, "tiles.warp_n"),
    ("2d-nhwc-vector", "float16", "fma", {"stages": 6, "block_k": 64}, "tiles.stages"),
    ("3d-ncdhw", "bfloat16", "fma", {"block_m": 16, "warp_m": 16, "block_k": 64}, "tiles.block_k"),   # 144 copies
    ("3d-ncdhw", "float32", "tf32", {"block_m": 256, "block_n": 32, "warp_n": 32}, "tiles.block_k"),  # 64 + 8
])
def test_tiles_the_spec_cannot_take_are_refused_naming_the_field(name, dtype, math_mode, tiles, field):
    spec = _mode(SPECS[name], dtype, math_mode)
    with pytest.raises(SpecError) as error:
        FAMILY.plan(spec, MmaTiles.from_dict({**MmaTiles().to_dict(), **tiles}), "a10")
    assert error.value.field == field


def test_a_requested_cta_tile_gets_a_warp_tile_that_fits_it():
    spec = _mode(SPECS["2d-nhwc-vector"], "float16", "fma")
    tiles = FAMILY.complete_tiles(spec, {"block_m": 32, "block_n": 16}, "h100")
    assert (tiles.warp_m, tiles.warp_n) == (min(32, heuristic_tiles(spec, "h100").warp_m), 16)
    with pytest.raises(SpecError) as error:
        FAMILY.complete_tiles(spec, {"block_m": 48}, "h100")
    assert error.value.field == "tiles.block_m"


def test_offsets_past_32_bits_take_a_64_bit_index(cache_dir):
    """An image of 2^32 elements: pixel bases, channel deltas and output rows in long long."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=4, k=8, input_size=(32768, 32768), filter_size=3, padding=1,
                    dtype="bfloat16")
    kernel_plan = FAMILY.plan(spec, heuristic_tiles(spec))
    assert kernel_plan.context.idx_t == "long long"
    _compiles_clean(spec, kernel_plan.tiles, "sm_90")


def test_float32_with_fma_math_is_not_a_tensor_core_spec():
    with pytest.raises(SpecError) as error:
        FAMILY.plan(SPECS["2d-nchw-c3"], MmaTiles())
    assert error.value.field == "math"


def test_plan_needs_sm80_and_types_its_buffers():
    spec = _mode(SPECS["2d-nhwc-vector"], "bfloat16", "fma")
    kernel_plan = FAMILY.plan(spec, heuristic_tiles(spec))
    assert kernel_plan.min_arch == 80 and kernel_plan.template == "implicit_gemm_mma.cu.j2"
    assert [(b.name, b.dtype) for b in kernel_plan.buffers] == [(n, DType.bfloat16) for n in ("x", "w", "y")]
    assert [b.alignment for b in kernel_plan.buffers] == [16, 16, 16]   # 16-byte copies and epilogue stores
    with pytest.raises(SpecError) as error:
        check_arch(kernel_plan, "sm_75")
    assert error.value.field == "arch"


@pytest.mark.parametrize("name, dtype, math_mode, warp_n, mode", [
    ("2d-nhwc-vector", "bfloat16", "fma", 32, "quad"),     # K 40: a quad's four pairs transposed, a group past N
    ("2d-nhwc-vector", "float32", "3xtf32", 16, "pair"),  # FP32 sums: pairs swapped between lanes 1 apart
    ("2d-nhwc-vector", "float16", "fma", 16, ""),          # a warp 16 channels wide: no whole group of 32
    ("2d-nchw-c3", "float16", "fma", 32, ""),              # channels-first: a channel's pixels are not a lane's
    ("3d-ndhwc-odd-pitch", "float32", "tf32", 32, ""),     # K 17: rows 68 bytes apart
])
def test_epilogue_stores_16_bytes_a_lane_where_rows_and_the_warp_allow(name, dtype, math_mode, warp_n, mode, cache_dir):
    spec = _mode(SPECS[name], dtype, math_mode)
    tiles = MmaTiles(**dict(heuristic_tiles(spec).to_dict(), block_n=32, warp_n=warp_n))
    kernel_plan = FAMILY.plan(spec, tiles)
    code = render_kernels(kernel_plan).code
    assert kernel_plan.context.store_mode == mode
    assert ("__shfl_xor_sync" in code) == bool(mode) and ("uint4" in code) == (mode == "quad")
    assert kernel_plan.output.alignment == (16 if mode else spec.dtype.itemsize * (1 + kernel_plan.context.pair_store))
    _compiles_clean(spec, tiles, "sm_80")


@pytest.mark.parametrize("name, dtype, vector, m_fastest", [
    ("2d-nhwc-vector", "float16", True, False), ("2d-nhwc-vector", "float32", True, False),
    ("2d-nchw-c3", "float32", False, True), ("3d-ndhwc-odd-pitch", "bfloat16", False, False),
])
def test_a_loads_sixteen_byte_runs_of_channels_or_coalesces_along_its_contiguous_axis(name, dtype, vector, m_fastest):
    spec = _mode(SPECS[name], dtype, "fma" if dtype != "float32" else "tf32")
    tiles = heuristic_tiles(spec)
    load = a_load(spec, tiles)
    assert (load.vector, load.m_fastest) == (vector, m_fastest)
    assert load.asynchronous == (vector or dtype == "float32")
    assert load.rows * min(load.row_step, tiles.block_m) == tiles.block_m
    assert load.units * load.lanes_k * load.unit == tiles.block_k
    assert b_load(spec, tiles).vector == (spec.c * math.prod(spec.filter_size) % (16 // spec.dtype.itemsize) == 0)


def test_more_loader_threads_than_rows_guard_the_extra_ones(cache_dir):
    """A 16-row tile of 4 warps loaded in two 16-byte chunks a row: 64 row slots for 16 rows."""
    spec = _mode(SPECS["2d-nhwc-vector"], "float16", "fma")
    tiles = MmaTiles(block_m=16, block_n=64, block_k=16, warp_m=16, warp_n=16, stages=2)
    load = a_load(spec, tiles)
    assert load.guard_rows and load.row_step == 64 and load.rows == 1
    code = render_kernels(FAMILY.plan(spec, tiles)).code
    assert "a_pixel[i] = row_local < 16;" in code and "if (a_row < 16) {" in code
    _compiles_clean(spec, tiles, "sm_80")


def test_generated_source_states_the_spec_and_the_mma():
    spec = _mode(SPECS["3d-ncdhw"], "float32", "3xtf32")
    code = render_kernels(FAMILY.plan(spec, heuristic_tiles(spec))).code
    assert f"//   spec:  {spec.describe()}" in code
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in code and "convgen_split_tf32" in code
    sixteen = render_kernels(FAMILY.plan(_mode(SPECS["3d-ncdhw"], "bfloat16", "fma"), MmaTiles(
        block_m=64, block_n=32, block_k=16, warp_m=32, warp_n=16))).code
    assert "m16n8k16.row.col.f32.bf16.bf16.f32" in sixteen and "ldmatrix.sync.aligned.m8n8.x4" in sixteen


def test_reference_and_inputs_take_bfloat16_bits():
    spec = _mode(SPECS["2d-nchw-c3"], "bfloat16", "fma")
    x, w = FAMILY.make_inputs(spec, np.random.default_rng(0))
    assert x.dtype == np.uint16 and w.dtype == np.uint16
    as_float = replace(spec, dtype="float32", math="tf32")
    decoded = [precision.from_bfloat16_bits(a) for a in (x, w)]
    np.testing.assert_array_equal(FAMILY.reference(spec, x, w), FAMILY.reference(as_float, *decoded))


# -- precision ------------------------------------------------------------------------------------
def _f32(bits: int) -> np.float32:
    return np.array([bits], dtype=np.uint32).view(np.float32)[0]


@pytest.mark.parametrize("bits, rounded", [
    (0x3F801000, 0x3F802000),   # exactly half a TF32 unit above 1: ties go away from zero
    (0xBF801000, 0xBF802000),   # likewise below -1
    (0x3F803000, 0x3F804000),   # a tie from an odd last bit: away, as from an even one (not to even)
    (0x3F800FFF, 0x3F800000),   # below half a unit: down
    (0x3F801001, 0x3F802000),   # above half a unit: up
    (0x3FFFF000, 0x40000000),   # the carry reaches the exponent
    (0x7F7FFFFF, 0x7F800000),   # the largest float overflows to infinity
    (0x7F800000, 0x7F800000),   # infinity stays
    (0x80000000, 0x80000000),   # -0 stays
    (0x00001000, 0x00002000),   # subnormals round the same way
    (0x00000FFF, 0x00000000),
])
def test_round_tf32_is_round_to_nearest_ties_away_as_cvt_rna(bits, rounded):
    result = precision.round_tf32(_f32(bits))
    assert result.view(np.uint32) == rounded


def test_round_tf32_keeps_nan_and_ten_mantissa_bits():
    assert np.isnan(precision.round_tf32(np.float32(np.nan)))
    assert np.isnan(precision.round_tf32(_f32(0x7F800001)))         # a NaN whose payload is all in the low bits
    values = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    rounded = precision.round_tf32(values)
    assert not (rounded.view(np.uint32) & 0x1FFF).any()
    assert (np.abs(rounded - values) <= 2.0**-11 * np.abs(values)).all()


def test_bfloat16_bits_round_to_nearest_even_and_round_trip():
    assert precision.bfloat16_bits(_f32(0x3F808000)) == 0x3F80        # tie, even last bit: stays
    assert precision.bfloat16_bits(_f32(0x3F818000)) == 0x3F82        # tie, odd last bit: to even
    assert precision.bfloat16_bits(_f32(0x3F808001)) == 0x3F81
    assert precision.bfloat16_bits(np.float32(np.inf)) == 0x7F80
    assert np.isnan(precision.from_bfloat16_bits(precision.bfloat16_bits(np.float32(np.nan))))
    bits = np.arange(1 << 16, dtype=np.uint16)
    finite = ~np.isnan(precision.from_bfloat16_bits(bits))
    np.testing.assert_array_equal(precision.bfloat16_bits(precision.from_bfloat16_bits(bits))[finite], bits[finite])
    values = np.random.default_rng(1).standard_normal(1000).astype(np.float32)
    assert (np.abs(precision.round_bfloat16(values) - values) <= 2.0**-8 * np.abs(values)).all()


@pytest.mark.parametrize("dtype", list(DType))
def test_storage_round_trips(dtype):
    values = np.random.default_rng(2).standard_normal((3, 5))
    stored = precision.to_storage(values, dtype)
    assert stored.dtype == {DType.float32: np.float32, DType.float16: np.float16, DType.bfloat16: np.uint16}[dtype]
    np.testing.assert_array_equal(precision.to_storage(precision.from_storage(stored, dtype), dtype), stored)


def test_unit_roundoffs():
    tf32 = precision.unit_roundoff(DType.float32, MathMode.tf32)
    three = precision.unit_roundoff(DType.float32, MathMode.three_tf32)
    assert tf32.operand == 2.0**-11 and tf32.product > 2.0**-10 and three.product < tf32.product / 1000
    assert three.products_per_term == 3
    assert precision.unit_roundoff(DType.float16, MathMode.fma).output == 2.0**-11
    assert precision.unit_roundoff(DType.bfloat16, MathMode.fma).output == 2.0**-8
    assert precision.unit_roundoff(DType.float32, MathMode.fma).product == 0.0


@pytest.mark.parametrize("dtype, math_mode", MODES)
def test_error_bound_is_positive_and_grows_with_the_reduction(dtype, math_mode):
    """Per output, the bound grows with L = C x taps: more channels at the same inputs' scale."""
    rng = np.random.default_rng(3)
    bounds = []
    for c in (4, 16, 64):
        spec = ConvSpec(dims=2, layout="NCHW", n=1, c=c, k=2, input_size=(6, 6), filter_size=3, padding=1,
                        dtype=dtype, math=math_mode)
        x, w = (precision.to_storage(rng.standard_normal(shape), spec.dtype)
                for shape in ((1, c, 6, 6), (2, c, 3, 3)))
        bound = precision.error_bound(spec, x, w)
        assert bound.shape == (1, 2, 6, 6) and (bound > 0).all()
        bounds.append(float(np.median(bound)))
    assert bounds[0] < bounds[1] < bounds[2]


def test_error_bound_holds_for_its_own_model():
    """The bound covers a float32 emulation of TF32: operands rounded with round_tf32, products
    summed in float32 in order."""
    rng = np.random.default_rng(4)
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=32, k=3, input_size=(5, 5), filter_size=3, padding=1,
                    dtype="float32", math="tf32")
    x = rng.standard_normal((1, 32, 5, 5)).astype(np.float32)
    w = rng.standard_normal((3, 32, 3, 3)).astype(np.float32)
    from codegen.families.im2col import column_matrix_reference

    col = precision.round_tf32(column_matrix_reference(spec, x).astype(np.float32))
    filters = precision.round_tf32(w.reshape(3, -1))
    emulated = np.zeros((3, col.shape[1]), dtype=np.float32)
    for k in range(col.shape[0]):
        emulated += filters[:, k:k + 1] * col[k]
    emulated = np.moveaxis(emulated.reshape(3, 1, 5, 5), 0, 1)
    exact = FAMILY.reference(spec, x, w)
    assert (np.abs(emulated - exact) <= precision.error_bound(spec, x, w)).all()
    assert np.abs(emulated - exact).max() > 1e-6        # the operand rounding is visible, and bounded


def test_truncated_bound_holds_for_operands_read_as_tf32_and_the_rounded_one_does_not():
    """wgmma reads float32 bits as TF32 (``truncate_tf32``): a float32 emulation of that lies within
    the truncated bound; with operands just past a rounding tie (1 + 3 x 2^-12 truncates to 1, rounds
    to 1 + 2^-10) it lies outside the rounded one, so the bounds are not interchangeable."""
    rng = np.random.default_rng(5)
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=16, k=2, input_size=(4, 4), filter_size=1, dtype="float32",
                    math="tf32")
    for x, w in ((rng.standard_normal((1, 16, 4, 4)), rng.standard_normal((2, 16, 1, 1))),
                 (np.full((1, 16, 4, 4), 1 + 3 * 2.0**-12), np.full((2, 16, 1, 1), 1 + 3 * 2.0**-12))):
        x, w = x.astype(np.float32), w.astype(np.float32)
        emulated = np.einsum("kc,nchw->nkhw", precision.truncate_tf32(w[:, :, 0, 0]).astype(np.float64),
                             precision.truncate_tf32(x).astype(np.float64))
        error = np.abs(emulated - FAMILY.reference(spec, x, w))
        assert (error <= precision.error_bound(spec, x, w, tf32_truncated=True)).all()
    assert (emulated == 16.0).all() and (error > precision.error_bound(spec, x, w)).all()
    assert precision.truncate_tf32(np.float32(-1 - 3 * 2.0**-12)) == -1.0 and np.isnan(precision.truncate_tf32(np.nan))
