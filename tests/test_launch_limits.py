"""Launch limits proved like index widths (issue 35): grids past CUDA's limits are laid over z and
every virtual block runs once; sizes past what 32- and 64-bit integers hold are refused by field;
no search in the generator is linear in a size the user types; one arch check for every path."""
import shutil
import subprocess
import time

import pytest

from codegen import ConvSpec, SpecError, build, emit, plan
from codegen.emit import build_flags, emit_source
from codegen.families import get_family
from codegen.families.base import largest_batch_chunk
from codegen.launch_limits import GRID_X_MAX, GRID_YZ_MAX, GridFold, block_index, fold_grid, launch_grid
from codegen.render import render_kernels

NVCC = shutil.which("nvcc")


def test_a_grid_within_the_limits_is_launched_as_it_is():
    for grid in ((1, 1, 1), (GRID_X_MAX, GRID_YZ_MAX, GRID_YZ_MAX), (132, 16, 1)):
        assert fold_grid("k", grid) is None and launch_grid(grid, None) == grid
    assert block_index(None) == {"x": "blockIdx.x", "y": "blockIdx.y", "prologue": ""}


@pytest.mark.parametrize("blocks", [GRID_X_MAX + 1, 5_000_000_000, 3 * GRID_X_MAX, 3 * GRID_X_MAX + 1,
                                    GRID_X_MAX * GRID_YZ_MAX])
def test_an_x_extent_past_2_31_is_laid_over_z_and_each_virtual_block_runs_once(blocks):
    fold = fold_grid("k", (blocks, 5, 1))
    grid = launch_grid((blocks, 5, 1), fold)
    assert fold.axis == "x" and grid == (fold.width, 5, fold.layers)
    assert grid[0] <= GRID_X_MAX and grid[2] <= GRID_YZ_MAX
    # block_x = blockIdx.z * width + blockIdx.x covers 0..blocks-1 once; the rest return at once
    assert fold.width * fold.layers >= blocks > fold.width * (fold.layers - 1)
    assert fold.width * fold.layers - blocks < fold.layers   # the idle blocks are fewer than one per layer
    prologue = block_index(fold)["prologue"]
    assert f"(long long)blockIdx.z * {fold.width} + blockIdx.x;" in prologue and f">= {blocks}LL) return;" in prologue


def test_a_y_extent_past_65535_is_laid_over_z():
    fold = fold_grid("k", (7, 70_000, 1))
    assert fold == GridFold("y", 70_000, 35_000, 2) and launch_grid((7, 70_000, 1), fold) == (7, 35_000, 2)
    assert block_index(fold)["y"] == "block_y" and block_index(fold)["x"] == "blockIdx.x"


@pytest.mark.parametrize("grid", [(GRID_X_MAX + 1, GRID_YZ_MAX + 1, 1), (GRID_X_MAX + 1, 1, 2),
                                  (GRID_X_MAX * GRID_YZ_MAX + 1, 1, 1), (1, 1, GRID_YZ_MAX + 1), (0, 1, 1)])
def test_a_grid_no_fold_makes_legal_is_refused_by_name(grid):
    with pytest.raises(SpecError) as err:
        fold_grid("k", grid)
    assert err.value.field == "grid"


HUGE = {  # family, spec fields, tiles: each plan's virtual grid passes 2^31 - 1 blocks along x
    "direct tiled_halo (the 20 GB problem of issue 35)": (
        "direct", dict(dims=2, layout="NCHW", n=5000, c=1, k=1_000_000, input_size=(1, 1), filter_size=(1, 1)),
        None),
    "direct basic": ("direct", dict(dims=2, layout="NCHW", n=1000, c=3, k=8, input_size=(100_000, 100_000),
                                    filter_size=3, padding=1), {"variant": "basic"}),
    "im2col channels_first": ("im2col", dict(dims=2, layout="NCHW", n=1000, c=3, k=8,
                                             input_size=(100_000, 100_000), filter_size=3, padding=1), None),
    "im2col vec4": ("im2col", dict(dims=2, layout="NHWC", n=1000, c=3, k=8, input_size=(100_000, 100_000),
                                   filter_size=3, padding=1, dpitch=4), None),
    "col2im gather": ("col2im", dict(dims=2, layout="NCHW", n=1000, c=3, k=8, input_size=(100_000, 100_000),
                                     filter_size=3, padding=1), {"algorithm": "gather"}),
    "implicit_gemm": ("implicit_gemm", dict(dims=2, layout="NCHW", n=1000, c=3, k=8,
                                            input_size=(100_000, 100_000), filter_size=3, padding=1), None),
    "im2win transform": ("im2win", dict(dims=2, layout="NCHW", n=1000, c=3, k=8, input_size=(100_000, 100_000),
                                        filter_size=3, padding=1), {"batch_chunk": 1000}),
}


@pytest.mark.parametrize("case", sorted(HUGE))
def test_every_family_folds_a_huge_grid_and_its_kernel_compiles(case, cache_dir):
    family, fields, tiles = HUGE[case]
    kernel = build(family, ConvSpec(**fields), tiles, arch="sm_90")
    folded = [launch for launch in kernel.plan.launches if launch.fold is not None]
    assert folded, [launch.grid for launch in kernel.plan.launches]
    for launch in kernel.plan.launches:
        x, y, z = launch.launch_grid
        assert x <= GRID_X_MAX and y <= GRID_YZ_MAX and z <= GRID_YZ_MAX
    for launch in folded:
        assert launch.grid[0] > GRID_X_MAX and f"if (block_x >= {launch.grid[0]}LL) return;" in kernel.source.code
        assert f"grid ({', '.join(map(str, launch.launch_grid))})" in kernel.source.code   # the header says so
    assert "typedef long long idx_t;" in kernel.source.code
    assert not kernel.compiled.warnings


def test_a_channel_grid_past_65535_folds_its_y_axis(cache_dir):
    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=2_200_000, k=1, input_size=(2, 2), filter_size=1)
    kernel = build("col2im", spec, {"algorithm": "gather"})
    (launch,) = kernel.plan.launches
    assert launch.fold.axis == "y" and launch.grid[1] > GRID_YZ_MAX >= launch.launch_grid[1]
    assert "const int first_channel = block_y * 32;" in kernel.source.code
    assert f"if (block_y >= {launch.grid[1]}LL) return;" in kernel.source.code


def test_kernels_whose_grids_fit_render_as_before():
    """A fold changes only kernels that need one: every fitting kernel's source has no prologue and
    reads blockIdx directly (the catalogue test holds the benchmark layers byte-identical)."""
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=8, input_size=(16, 16), filter_size=3, padding=1)
    for family in ("im2col", "col2im", "direct", "implicit_gemm", "im2win"):
        code = render_kernels(plan(family, spec)).code
        assert "block_x" not in code and "blockIdx.z" not in code and "blockIdx.x" in code


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
def test_a_folded_emitted_file_builds_with_nvcc_and_launches_the_folded_grid(tmp_path):
    family, fields, tiles = HUGE["direct tiled_halo (the 20 GB problem of issue 35)"]
    path = emit(family, ConvSpec(**fields), tmp_path / "huge.cu", tiles)
    text = path.read_text()
    assert "<<<dim3(1666666667, 1, 3)" in text
    result = subprocess.run([NVCC, *build_flags(text), "-Werror", "all-warnings", "-DCONVGEN_SELFTEST", "-c",
                             str(path), "-o", str(tmp_path / "huge.o")], capture_output=True, text=True)
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr


@pytest.mark.parametrize("fields, field", [
    (dict(n=99999999999999999999999), "n"),
    (dict(n=2**31), "n"),
    (dict(k=2**40), "k"),
    (dict(c=2**31, dpitch=None), "c"),
    (dict(input_size=(2**31, 8)), "input_size[0]"),
    (dict(stride=2**31), "stride"),
    (dict(padding=(0, 2**31)), "padding[1]"),
    (dict(n=2**31 - 1, k=2**31 - 1, input_size=(2**10, 2**10), filter_size=1), "n"),   # 2^82 outputs
    (dict(n=1, c=1, input_size=(2**31 - 1, 2**31 - 1), filter_size=1), "input_size"),   # 2^62 inputs
    (dict(c=2**20, input_size=(100, 100), filter_size=(64, 64)), "c"),   # C x taps = 2^32
])
def test_sizes_past_32_bit_fields_or_64_bit_offsets_are_refused_by_field(fields, field):
    base = dict(dims=2, layout="NCHW", n=2, c=3, k=4, input_size=(8, 8), filter_size=3)
    with pytest.raises(SpecError) as err:
        ConvSpec(**{**base, **fields})
    assert err.value.field == field


def test_numpy_integers_are_sizes_and_numpy_floats_are_not():
    np = pytest.importorskip("numpy")
    spec = ConvSpec(dims=np.int64(2), layout="NHWC", n=np.int64(2), c=np.int32(3), k=np.uint8(4),
                    input_size=(np.int64(8), 8), filter_size=np.int16(3), stride=np.int64(1), dpitch=np.int64(4))
    assert spec == ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=4, input_size=(8, 8), filter_size=3, dpitch=4)
    assert all(type(v) is int for v in (spec.dims, spec.n, spec.c, spec.k, spec.dpitch, *spec.input_size))
    with pytest.raises(SpecError, match="must be an integer"):
        ConvSpec(dims=2, layout="NHWC", n=np.float64(2.0), c=3, k=4, input_size=8, filter_size=3)


def test_the_batch_chunk_search_is_not_linear_in_the_batch():
    start = time.perf_counter()
    assert largest_batch_chunk(2**31 - 1, 1, 10**6) == 1                 # a prime: only 1 fits
    assert largest_batch_chunk(2**31 - 2, 1, 10**6) == 926_838           # 2 * 3^2 * 7 * 11 * 31 * 151 * 331
    assert largest_batch_chunk(128, 10, 640) == 64 and largest_batch_chunk(128, 10, 10**9) == 128
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("family", ["im2win", "im2col_gemm", "implicit_gemm"])
def test_planning_a_batch_of_2_31_images_takes_no_time(family):
    spec = ConvSpec(dims=2, layout="NCHW", n=2**31 - 1, c=3, k=8, input_size=(4, 4), filter_size=3, padding=1)
    start = time.perf_counter()
    plan(family, spec)
    assert time.perf_counter() - start < 10.0


def test_a_table_linear_in_c_x_taps_is_not_written_past_its_bound():
    """precomp's row table and the TMA kernel's slice table go into the source one entry a row: the
    heuristic leaves them out past gemm_tiles.TABLE_MAX_ROWS rows, and tiles asking for them are refused."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=70_000, k=8, input_size=(4, 4), filter_size=1)
    tiles = get_family("implicit_gemm").heuristic_tiles(spec, "sm_90")
    assert not tiles.precomp
    with pytest.raises(SpecError) as err:
        plan("implicit_gemm", spec, {"precomp": True})
    assert err.value.field == "tiles.precomp"
    wide = ConvSpec(dims=2, layout="NCHW", n=1, c=4096, k=8, input_size=(32, 32), filter_size=(25, 25))
    with pytest.raises(SpecError) as err:
        plan("implicit_gemm", wide, {"tma": True})
    assert err.value.field == "c"


@pytest.mark.parametrize("family, tiles, arch, needed", [
    ("implicit_gemm", {"tma": False, "async_copy": True}, "sm_75", 80),
    ("im2win", {"async_copy": True}, "sm_75", 80),
    ("direct", {"variant": "tiled_register"}, "sm_75", 80),
    ("implicit_gemm", {"tma": True}, "sm_89", 90),
    ("direct", {"variant": "tiled_tma"}, "sm_86", 90),
])
def test_build_compile_and_emit_refuse_the_same_old_targets(family, tiles, arch, needed, tmp_path):
    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=4, k=8, input_size=(16, 16), filter_size=3, padding=1)
    if family == "direct" and tiles["variant"] == "tiled_tma":
        spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(64, 256), filter_size=3, padding=1)
    for attempt in (lambda: build(family, spec, tiles, arch=arch),
                    lambda: emit(family, spec, tmp_path / "k.cu", tiles, arch=arch)):
        with pytest.raises(SpecError) as err:
            attempt()
        assert err.value.field == "arch" and f"sm_{needed} or newer" in str(err.value)
    assert not (tmp_path / "k.cu").exists()


@pytest.mark.parametrize("family", ["implicit_gemm", "im2win", "direct", "im2col", "col2im"])
def test_the_heuristic_builds_for_the_oldest_target_nvrtc_takes(family, cache_dir):
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=4, k=8, input_size=(16, 16), filter_size=3, padding=1)
    kernel = build(family, spec, arch="sm_75")
    assert kernel.compiled.arch == "sm_75" and kernel.plan.min_arch <= 75
    assert "sm_75" in emit_source(family, spec, arch="sm_75")


@pytest.mark.parametrize("arch", ["sm_999", "sm_60", "90", "sm90", 90, "", "sm_90x"])
def test_an_arch_nvrtc_cannot_build_for_is_refused_everywhere(arch, tmp_path):
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=4, k=8, input_size=(16, 16), filter_size=3)
    for attempt in (lambda: build("im2col", spec, arch=arch), lambda: plan("im2col", spec, arch=arch),
                    lambda: emit("im2col", spec, tmp_path / "k.cu", arch=arch)):
        with pytest.raises(SpecError) as err:
            attempt()
        assert err.value.field == "arch"
    assert not (tmp_path / "k.cu").exists()


def test_shared_memory_past_the_targets_per_block_limit_is_refused_before_compiling():
    """227 KB tiles fit sm_90 but not sm_86 (99 KB a block): refused by name, not at launch."""
    spec = ConvSpec(dims=2, layout="NCHW", n=8, c=64, k=128, input_size=(32, 32), filter_size=3, padding=1)
    tiles = {"block_m": 128, "block_n": 128, "block_k": 32, "stages": 4}
    kernel_plan = plan("implicit_gemm", spec, tiles, arch="sm_90")
    assert 99 << 10 < kernel_plan.launches[0].shared_bytes <= 227 << 10
    with pytest.raises(SpecError) as err:
        build("implicit_gemm", spec, tiles, arch="sm_86")
    assert err.value.field == "arch" and "at most 101376" in str(err.value)


@pytest.mark.parametrize("name", ['a b; system("rm")', "int", "1abc", "", "class", "__x", "_X", "main", "convgen_min", "x", "col", "stream", "printf", "memcpy", "cudaMalloc",
                                  "x-y", "café", 7])
def test_a_launcher_name_must_be_a_free_c_identifier(name, tmp_path):
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=4, k=8, input_size=(16, 16), filter_size=3)
    with pytest.raises(SpecError) as err:
        emit("im2col", spec, tmp_path / "k.cu", launcher=name)
    assert err.value.field == "launcher" and not (tmp_path / "k.cu").exists()
    assert 'extern "C" cudaError_t my_im2col_2(' in emit_source("im2col", spec, launcher="my_im2col_2")


def test_api_entry_points_refuse_wrong_argument_types_with_a_sentence():
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=4, k=8, input_size=(16, 16), filter_size=3)
    with pytest.raises(TypeError, match="spec must be a codegen.ConvSpec"):
        build("im2col", spec.to_dict())
    with pytest.raises(SpecError) as err:
        build(["im2col"], spec)
    assert err.value.field == "family"
    with pytest.raises(TypeError, match="emit's path must be a file path"):
        emit("im2col", spec, None)


def test_a_workspace_limit_keeps_the_old_targets_register_staging(cache_dir):
    """Tiles held under a workspace limit are chosen for the target too (cp.async only from sm_80)."""
    spec = ConvSpec(dims=2, layout="NCHW", n=8, c=16, k=16, input_size=(32, 32), filter_size=3, padding=1)
    need = plan("im2win", spec, arch="sm_75").workspace_bytes
    kernel = build("im2win", spec, arch="sm_75", workspace_limit=need // 4)
    assert not kernel.plan.tiles.async_copy and kernel.plan.workspace_bytes <= need // 4


def test_the_tma_kernels_step_counters_are_proved_to_fit_32_bits():
    """Tiles x k-slices are the stream-K tail's positions, counted in int: a spec whose steps pass
    2^31 is refused for tma=True and the heuristic takes the cp.async kernel."""
    spec = ConvSpec(dims=2, layout="NHWC", n=8, c=4096, k=4096, input_size=(448, 448), filter_size=7, padding=3)
    tiles = {"tma": True, "thread_m": 8, "warp_m": 32, "block_m": 128, "block_n": 128}
    with pytest.raises(SpecError) as err:
        plan("implicit_gemm", spec, tiles)
    assert err.value.field == "tiles.block_m" and "32 bits" in str(err.value)
    assert plan("implicit_gemm", spec, target="h100").variant == "tma"      # its own 256 x 128 tiles fit
    doubled = ConvSpec(dims=2, layout="NHWC", n=16, c=4096, k=4096, input_size=(448, 448), filter_size=7, padding=3)
    assert not get_family("implicit_gemm").heuristic_tiles(doubled, "sm_90").tma


@pytest.mark.parametrize("fields, family, field", [
    (dict(layout="NCHW", n=1, c=1, k=1, input_size=(65536, 65536), filter_size=1), "im2col_gemm", "input_size"),
    (dict(layout="NCHW", n=4, c=1, k=1, input_size=(40000, 40000), filter_size=1), "im2col_gemm",
     "tiles.batch_chunk"),
])
def test_im2col_gemm_refuses_what_cublas_32_bit_sizes_cannot_count(fields, family, field):
    spec = ConvSpec(dims=2, **fields)
    tiles = {"batch_chunk": 4} if field == "tiles.batch_chunk" else None
    with pytest.raises(SpecError) as err:
        plan(family, spec, tiles)
    assert err.value.field == field
    if tiles:
        assert plan(family, spec).tiles.batch_chunk == 1     # the heuristic's chunk fits


@pytest.mark.parametrize("fields, field", [
    (dict(input_size=(2**31 - 2, 8), padding=(1, 0)), "input_size[0]"),
    (dict(input_size=(8, 8), padding=(2**30, 0)), "padding[0]"),
    (dict(layout="NHWC", c=1, dpitch=2**31 - 1, n=2**31 - 2, input_size=(1, 1), filter_size=1), "dpitch"),
])
def test_padded_extents_and_pitched_tensors_are_refused_by_the_field_that_drives_them(fields, field):
    base = dict(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(8, 8), filter_size=1)
    with pytest.raises(SpecError) as err:
        ConvSpec(**{**base, **fields})
    assert err.value.field == field


def test_a_register_window_past_a_threads_registers_is_refused_quickly():
    """The register tile unrolls its window: a filter spanning thousands of inputs is refused by
    name, and the cache and halo variants plan such filters in a second (the window lists are only
    made where used)."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(8, 40000), filter_size=(1, 20000))
    with pytest.raises(SpecError) as err:
        plan("direct", spec, {"variant": "tiled_register"})
    assert err.value.field == "filter_size"
    start = time.perf_counter()
    plan("direct", spec, {"variant": "tiled_cache"})
    assert time.perf_counter() - start < 5.0
