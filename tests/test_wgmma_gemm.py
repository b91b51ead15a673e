"""implicit_gemm's WGMMA kernel (codegen.families.wgmma_gemm) without a GPU: the chooser, the tiles and
their refusals, NVRTC compiles for sm_90a (no warning, no spill), and the standalone file."""
import dataclasses
import shutil
import subprocess

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codegen import api
from codegen.api import check_arch, compile_plan
from codegen.device import TARGETS
from codegen.emit import build_flags, emit, emit_source
from codegen.families import wgmma_gemm
from codegen.families.mma_gemm import FAMILY, MmaTiles, check_tiles
from codegen.fuzz import GEMM_RANGES, specs
from codegen.index import IndexAlgebra
from codegen.render import render_kernels
from codegen.spec import ConvSpec, DType, Layout, SpecError, replace

H100 = TARGETS["h100"]
SPECS = {  # tails along M, N and K; padding, stride, dilation; a pitch past C; 3D; an odd K (single stores)
    "2d-nhwc-odd": ConvSpec(dims=2, layout="NHWC", n=3, c=40, k=75, input_size=(17, 23), filter_size=3, stride=2,
                            padding=1, dilation=(1, 2), dpitch=48, dtype="bfloat16"),
    "2d-nhwc-conv8": ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=128, input_size=(30, 30), filter_size=3,
                              dtype="float16"),
    "3d-ndhwc": ConvSpec(dims=3, layout="NDHWC", n=1, c=16, k=40, input_size=(5, 9, 11), filter_size=3,
                         stride=(1, 2, 1), padding=1, dtype="bfloat16"),
    "3d-ndhwc-unpadded-tail": ConvSpec(dims=3, layout="NDHWC", n=1, c=8, k=24, input_size=(3, 7, 9),
                                       filter_size=(1, 3, 2), dtype="float16"),
    "2d-nhwc-tf32-odd": ConvSpec(dims=2, layout="NHWC", n=3, c=20, k=75, input_size=(17, 23), filter_size=3, stride=2,
                                 padding=1, dilation=(1, 2), dpitch=24, dtype="float32", math="tf32"),
    "3d-ndhwc-tf32": ConvSpec(dims=3, layout="NDHWC", n=1, c=12, k=40, input_size=(5, 9, 11), filter_size=3,
                              stride=(1, 2, 1), padding=1, dtype="float32", math="tf32"),
    "3d-ndhwc-tma-a": ConvSpec(dims=3, layout="NDHWC", n=2, c=128, k=40, input_size=(5, 9, 11), filter_size=3,
                               stride=(1, 2, 1), padding=1, dpitch=136, dtype="bfloat16"),
    "2d-nhwc-tf32-tma-a": ConvSpec(dims=2, layout="NHWC", n=3, c=32, k=75, input_size=(17, 23), filter_size=3,
                                   stride=2, padding=1, dilation=(1, 2), dpitch=36, dtype="float32", math="tf32"),
}
SHAPES = [  # (block_m, block_n, warp_m, stages): each block_n, one and two consumer warpgroups of 64 and 128 rows
    (64, 32, 64, 2), (128, 32, 64, 3), (128, 64, 128, 4), (256, 128, 128, 4), (128, 256, 64, 4), (256, 64, 128, 5),
]


PINGPONG_SHAPES = [(64, 32, 64, 2), (128, 128, 128, 5), (64, 256, 64, 5), (128, 64, 128, 6)]


def _tiles(spec: ConvSpec, block_m: int, block_n: int, warp_m: int, stages: int, pingpong: bool = False,
           split_k: int = 1, cluster_m: int = 1) -> MmaTiles:
    return MmaTiles(block_m=block_m, block_n=block_n, block_k=wgmma_gemm.slice_k(spec), warp_m=warp_m,
                    warp_n=block_n, stages=stages, wgmma=True, pingpong=pingpong, split_k=split_k, cluster_m=cluster_m)


def _compiles_clean(spec: ConvSpec, tiles: MmaTiles) -> None:
    kernel = compile_plan(FAMILY.plan(spec, tiles, H100), "sm_90")
    assert kernel.compiled.arch == "sm_90a"
    assert kernel.compiled.warnings == [], kernel.compiled.warnings
    for resources in kernel.compiled.resources.values():
        assert resources.spill_stores == 0 and resources.stack_bytes == 0, (tiles.describe(), spec.describe())


@pytest.mark.parametrize("name", SPECS)
def test_heuristic_kernels_compile_for_sm_90a_without_warnings_or_spills(name, cache_dir):
    spec = SPECS[name]
    tiles = FAMILY.heuristic_tiles(spec, H100)
    assert tiles.wgmma
    _compiles_clean(spec, tiles)


@pytest.mark.parametrize("name", ["2d-nhwc-odd", "2d-nhwc-tf32-odd"])
@pytest.mark.parametrize("shape", SHAPES, ids=[f"{m}x{n}-wm{w}-s{s}" for m, n, w, s in SHAPES])
def test_every_tile_shape_compiles_without_warnings_or_spills(shape, name, cache_dir):
    _compiles_clean(SPECS[name], _tiles(SPECS[name], *shape))


@pytest.mark.parametrize("name", ["2d-nhwc-odd", "2d-nhwc-tf32-odd"])
@pytest.mark.parametrize("shape", PINGPONG_SHAPES, ids=[f"pingpong-{m}x{n}-s{s}" for m, n, _, s in PINGPONG_SHAPES])
def test_every_pingpong_shape_compiles_without_warnings_or_spills(shape, name, cache_dir):
    _compiles_clean(SPECS[name], _tiles(SPECS[name], *shape, pingpong=True))


def test_pingpong_source_alternates_the_consumers_on_named_barriers():
    """Each consumer warpgroup waits for the other's previous tile before its MMAs and lets the other
    start once its own have retired; one warpgroup's four warps release each stage."""
    spec = SPECS["2d-nhwc-conv8"]
    code = render_kernels(FAMILY.plan(spec, _tiles(spec, 128, 128, 128, 5, pingpong=True), H100)).code
    order = wgmma_gemm.ORDER_BARRIER
    assert f'"bar.sync %0, 256;" :: "r"({order} + group)' in code
    assert f'"bar.arrive %0, 256;" :: "r"({order} + 1 - group)' in code
    assert "convgen_barrier_init(empty + 8u * s, 4);" in code and "if (ordinal % 2 != group) {" in code
    shared = render_kernels(FAMILY.plan(spec, _tiles(spec, 256, 128, 128, 4), H100)).code
    assert "bar.arrive" not in shared and "convgen_barrier_init(empty + 8u * s, 8);" in shared


def test_pingpong_needs_wgmma_and_whole_tiles():
    with pytest.raises(SpecError) as error:
        MmaTiles(pingpong=True)
    assert error.value.field == "tiles.pingpong"
    with pytest.raises(SpecError) as error:
        _tiles(SPECS["2d-nhwc-odd"], 256, 128, 128, 4, pingpong=True)
    assert error.value.field == "tiles.block_m" and "pingpong" in error.value.allowed
    assert wgmma_gemm.threads(_tiles(SPECS["2d-nhwc-odd"], 64, 128, 64, 5, pingpong=True)) == 384


def test_heuristic_takes_pingpong_where_shared_tiles_would_leave_one_consumer():
    """conv12's 3200 x 512 GEMM fills the SMs only with 64-row shared tiles (one consumer
    warpgroup): ping-pong with 64x256 tiles instead. conv8's 256x128 shared tiles run as ping-pong's
    128x128 in 16-bit and stay shared in TF32; c3d_conv3's 256-channel tiles stay shared."""
    conv12 = ConvSpec(dims=2, layout="NHWC", n=128, c=512, k=512, input_size=(7, 7), filter_size=3, dtype="bfloat16")
    for spec in (conv12, replace(conv12, dtype="float32", math="tf32")):
        tiles = FAMILY.heuristic_tiles(spec, H100)
        assert (tiles.block_m, tiles.block_n, tiles.warp_m, tiles.stages, tiles.pingpong) == (64, 256, 64, 5, True)
    conv8 = ConvSpec(dims=2, layout="NHWC", n=128, c=64, k=128, input_size=(112, 112), filter_size=3, dtype="bfloat16")
    for spec in (conv8, replace(conv8, dtype="float16")):
        tiles = FAMILY.heuristic_tiles(spec, H100)
        assert (tiles.block_m, tiles.block_n, tiles.warp_m, tiles.stages, tiles.pingpong) == (128, 128, 128, 5, True)
    tiles = FAMILY.heuristic_tiles(replace(conv8, dtype="float32", math="tf32"), H100)
    assert (tiles.block_m, tiles.block_n, tiles.warp_m, tiles.pingpong) == (256, 128, 128, False)
    c3d_conv3 = ConvSpec(dims=3, layout="NDHWC", n=8, c=128, k=256, input_size=(8, 28, 28), filter_size=3, padding=1,
                         dtype="bfloat16")
    tiles = FAMILY.heuristic_tiles(c3d_conv3, H100)
    assert (tiles.block_m, tiles.block_n, tiles.pingpong) == (128, 256, False)


def test_heuristic_takes_pingpong_128_where_it_fills_the_sms_rounds_of_work_much_better():
    """conv11's 144 tiles of 128x256 leave the second round on 132 SMs 12 tiles: ping-pong's 288 of
    128x128 fill 1.33x the share, in both precisions. conv5's 400 (1.14x) and conv6's 200 (1.0x)
    keep their shared tiles; so do tiles narrower than 128, and any tile on a card where the shared
    ones fill the rounds (144 SMs: conv11's 144 tiles in one)."""
    conv11 = ConvSpec(dims=2, layout="NHWC", n=128, c=256, k=256, input_size=(14, 14), filter_size=3, dtype="bfloat16")
    for spec in (conv11, replace(conv11, dtype="float32", math="tf32")):
        tiles = FAMILY.heuristic_tiles(spec, H100)
        assert (tiles.block_m, tiles.block_n, tiles.warp_m, tiles.pingpong) == (128, 128, 128, True)
    wide_card = dataclasses.replace(H100, sm_count=144)
    assert not FAMILY.heuristic_tiles(conv11, wide_card).pingpong
    conv5 = ConvSpec(dims=2, layout="NHWC", n=128, c=96, k=256, input_size=(24, 24), filter_size=5, dtype="bfloat16")
    conv6 = ConvSpec(dims=2, layout="NHWC", n=128, c=256, k=512, input_size=(12, 12), filter_size=3, dtype="bfloat16")
    for spec in (conv5, conv6):
        tiles = FAMILY.heuristic_tiles(spec, H100)
        assert (tiles.block_m, tiles.block_n, tiles.pingpong) == (128, 256, False)
    widened = wgmma_gemm.complete_fields(conv11, {"wgmma": True, "block_n": 256}, H100)   # as before the rule
    assert (widened["block_m"], widened["warp_m"], widened["pingpong"]) == (128, 64, False)
    narrow = ConvSpec(dims=2, layout="NHWC", n=4, c=64, k=12, input_size=(128, 128), filter_size=3, padding=1,
                      dtype="bfloat16")   # 256 tiles of 256x32 on 132 SMs: 0.97 of two rounds
    assert not FAMILY.heuristic_tiles(narrow, H100).pingpong


def test_requested_rows_leave_pingpong_off_unless_asked_for():
    conv12 = ConvSpec(dims=2, layout="NHWC", n=128, c=512, k=512, input_size=(7, 7), filter_size=3, dtype="bfloat16")
    assert FAMILY.complete_tiles(conv12, {"wgmma": True}, H100).pingpong
    shared = FAMILY.complete_tiles(conv12, {"wgmma": True, "block_m": 256, "block_n": 128}, H100)
    assert (shared.block_m, shared.warp_m, shared.pingpong) == (256, 128, False)
    asked = FAMILY.complete_tiles(conv12, {"wgmma": True, "warp_m": 128, "block_n": 128, "pingpong": True}, H100)
    assert (asked.block_m, asked.warp_m, asked.pingpong) == (128, 128, True)
    conv8 = ConvSpec(dims=2, layout="NHWC", n=128, c=64, k=128, input_size=(112, 112), filter_size=3, dtype="bfloat16")
    whole = FAMILY.complete_tiles(conv8, {"wgmma": True, "pingpong": True}, H100)   # the shared tile's 128-row half
    assert (whole.block_m, whole.warp_m, whole.stages) == (128, 128, wgmma_gemm.PINGPONG_STAGES)
    with pytest.raises(SpecError) as error:
        FAMILY.complete_tiles(conv8, {"wgmma": True, "pingpong": True, "block_m": 256}, H100)
    assert error.value.field == "tiles.block_m" and "pingpong" in error.value.allowed


def test_completed_tiles_refit_stages_and_split_k_that_were_not_asked_for():
    """The batch-1 TF32 layer's heuristic is ping-pong 64x128 with 5 stages and split 16 (4 tiles):
    256-row shared tiles take the stages that fit, and 256 columns (2 tiles) their own split."""
    b1 = ConvSpec(dims=2, layout="NHWC", n=1, c=512, k=512, input_size=(7, 7), filter_size=3, padding=1,
                  dtype="float32", math="tf32")
    tall = FAMILY.complete_tiles(b1, {"wgmma": True, "block_m": 256}, H100)
    check_tiles(b1, tall, H100)
    assert (tall.warp_m, tall.stages, tall.pingpong) == (128, 4, False)
    wide = FAMILY.complete_tiles(b1, {"wgmma": True, "block_n": 256}, H100)
    assert wide.block_n == 256 and wide.split_k == wgmma_gemm._split_k(2, 144, H100.sm_count) == 16
    assert FAMILY.complete_tiles(b1, {"wgmma": True, "split_k": 3}, H100).split_k == 3


@pytest.mark.parametrize("name", ["2d-nhwc-tf32-odd", "2d-nhwc-odd"])
@pytest.mark.parametrize("pingpong", [False, True])
def test_split_k_stores_partial_tiles_that_a_second_kernel_adds_in_range_order(name, pingpong, cache_dir):
    """Each range's FP32 partial tile goes to the workspace; the reduction adds the ranges in split
    order (the same bits every run) and rounds once (16-bit): no atomic adds, no zeroed output."""
    spec = SPECS[name]
    tiles = _tiles(spec, 64, 64, 64, 4, pingpong=pingpong, split_k=3)
    plan = FAMILY.plan(spec, tiles, H100)
    _compiles_clean(spec, tiles)
    code = render_kernels(plan).code
    context = plan.context
    gemm, reduction = plan.launches
    assert "atomicAdd" not in code and not plan.zero_output and "kt_begin = (unit % 3) * 2" in code
    assert (context.splits, context.k_per_split, context.units_total) == (3, 2, 3 * context.tiles_total)
    assert gemm.grid[0] == min(3 * context.tiles_total, H100.sm_count) and gemm.args == ("x", "partials")
    assert [m.buffer for m in gemm.tensor_maps] == ["w"]
    assert reduction.kernel == gemm.kernel + "_reduce" and reduction.args == ("partials", "y")
    outputs = context.GEMM_M * context.GEMM_N
    assert plan.workspaces[0].shape == (3, context.GEMM_M, context.GEMM_N) and plan.workspace_bytes == 3 * 4 * outputs
    assert reduction.grid[0] * reduction.block[0] * context.reduce_width >= outputs
    assert "for (int split = 1; split < 3; ++split)" in code
    unsplit = FAMILY.plan(spec, _tiles(spec, 64, 64, 64, 4), H100)
    assert len(unsplit.launches) == 1 and not unsplit.workspaces


TAIL = ConvSpec(dims=2, layout="NHWC", n=8, c=256, k=200, input_size=(30, 30), filter_size=3, padding=1,
                dtype="bfloat16")   # 57 x 4 tiles of 128x64, 36 k-slices: on 112 SMs, 2 whole rounds and 4 tiles


def test_heuristic_splits_the_tiles_of_a_short_last_round():
    """After one to three whole rounds of work, the last round's tiles are split into the ranges that
    fill the round (each at least 4 128-byte slices), where that makes 4 or more; the plan's whole
    units store into y, the rest into partial tiles of the rows from the first last-round tile's on,
    which a second launch adds up. None on exact rounds, after more rounds, in fewer ranges, or with
    split-K."""
    shape = {"wgmma": True, "block_m": 128, "block_n": 64, "warp_m": 64, "pingpong": False, "stages": 4}
    card = api.resolve_device("h100,sm_count=112", None)
    fields = wgmma_gemm.complete_fields(TAIL, shape, card)
    assert fields["tail_split"] == min(112 // 4, 36 // wgmma_gemm.MIN_SPLIT_SLICES) == 9
    tiles = MmaTiles.from_dict(fields)
    plan = FAMILY.plan(TAIL, tiles, card)
    walk = wgmma_gemm.schedule(TAIL, tiles, card)
    assert (walk.whole_units, walk.tail_tiles, walk.tail_splits, walk.units_total) == (224, 4, 9, 224 + 36)
    assert walk.tail_first_row == 56 * 128 and plan.context.partial_rows == 7200 - 7168
    assert [b.shape for b in plan.workspaces] == [(9, 32, 200)] and len(plan.launches) == 2
    assert plan.launches[0].args == ("y", "partials") and plan.launches[1].args == ("partials", "y")
    assert wgmma_gemm.workspace_bytes(TAIL, fields, card) == 9 * 32 * 200 * 4
    code = render_kernels(plan).code
    assert "const bool whole = unit < 224;" in code and "if (!whole) {" in code
    assert "if ((row / 128) * 4 + (int)(e % 200) / 64 < 224) return;" in code   # whole tiles' outputs left alone
    _compiles_clean(TAIL, tiles)
    for target in ("h100,sm_count=114", "h100,sm_count=100", "h100,sm_count=40"):   # exact; 3 ranges; 5 rounds
        assert "tail_split" not in wgmma_gemm.complete_fields(TAIL, shape, api.resolve_device(target, None)), target
    assert "tail_split" not in wgmma_gemm.heuristic_fields(replace(SPECS["2d-nhwc-odd"], n=1), H100)
    conv5 = replace(CONV5, padding=0)          # the benchmark's conv5: 400 tiles of 128x256, 3.03 rounds
    assert wgmma_gemm.heuristic_fields(conv5, H100)["tail_split"] == 9
    assert {f.get("tail_split", 1) for f in wgmma_gemm.tuning_fields(conv5, H100)} == {1, 9}
    assert wgmma_gemm.split_within(TAIL, fields, 200_000, card)["tail_split"] == 7      # 7 x 25,600 bytes
    for limit in (100_000, 1 << 10):   # room for 3 ranges or none: fewer than the heuristic takes, so no split
        lowered = MmaTiles.from_dict(wgmma_gemm.split_within(TAIL, fields, limit, card))
        assert lowered.tail_split == 1 and lowered.split_k == 1
    other = FAMILY.plan(TAIL, tiles, api.resolve_device("h100,sm_count=113", None))   # 2 rounds and 2 tiles
    assert other.launches[0].kernel != plan.launches[0].kernel      # the split is compiled in: the name says which
    few = ConvSpec(dims=2, layout="NHWC", n=1, c=512, k=512, input_size=(7, 7), filter_size=3, padding=1,
                   dtype="bfloat16")
    assert wgmma_gemm.heuristic_fields(few, H100)["split_k"] == 16
    asked = wgmma_gemm.complete_fields(few, {"wgmma": True, "tail_split": 2}, H100)
    assert asked["tail_split"] == 2 and "split_k" not in asked        # not the heuristic's split-K with it


def test_tail_split_is_refused_with_split_k_off_wgmma_and_past_the_k_slices():
    with pytest.raises(SpecError, match="tiles.tail_split"):
        MmaTiles(tail_split=2)
    with pytest.raises(SpecError, match="tiles.tail_split"):
        MmaTiles.from_dict({**_tiles(TAIL, 128, 64, 64, 4, split_k=2).to_dict(), "tail_split": 2})
    with pytest.raises(SpecError) as error:
        narrow_k = replace(TAIL, c=64)
        check_tiles(narrow_k, dataclasses.replace(_tiles(narrow_k, 128, 64, 64, 4), tail_split=10), H100)
    assert error.value.field == "tiles.tail_split" and "9 k-slices" in error.value.allowed


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_emitted_tail_split_file_takes_its_workspace_and_builds_with_plain_nvcc(tmp_path):
    tiles = {"wgmma": True, "block_m": 128, "block_n": 64, "warp_m": 64, "pingpong": False, "tail_split": 2}
    path = emit("implicit_gemm", TAIL, tmp_path / "tail.cu", tiles, target="h100,sm_count=112")
    text = path.read_text()
    assert "float* partials, cudaStream_t stream)" in text and "(w_map, x_map, y, partials);" in text
    assert text.index("(w_map, x_map, y, partials);") < text.index("_reduce<<<") < text.index("(partials, y);")
    built = subprocess.run(["nvcc", *build_flags(text), "-Werror", "all-warnings", "-DCONVGEN_SELFTEST",
                            "-c", str(path), "-o", str(tmp_path / "tail.o")], capture_output=True, text=True)
    assert built.returncode == 0 and not built.stderr.strip(), built.stderr


def test_split_k_is_refused_past_the_k_slices_and_off_wgmma():
    with pytest.raises(SpecError) as error:
        MmaTiles(split_k=2)
    assert error.value.field == "tiles.split_k"
    with pytest.raises(SpecError) as error:           # 6 slices of 32 in K = 20 x 9
        FAMILY.plan(SPECS["2d-nhwc-tf32-odd"], _tiles(SPECS["2d-nhwc-tf32-odd"], 64, 64, 64, 4, split_k=7), H100)
    assert error.value.field == "tiles.split_k" and "6 k-slices" in error.value.allowed


def test_heuristic_splits_k_where_tiles_are_fewer_than_sms():
    """A batch-1 512-channel 3x3 layer has 4 output tiles and 144 k-slices (TF32) or 72 (BF16):
    split 16 ways in both; a layer with tiles for every SM never splits."""
    b1 = ConvSpec(dims=2, layout="NHWC", n=1, c=512, k=512, input_size=(7, 7), filter_size=3, padding=1,
                  dtype="float32", math="tf32")
    assert FAMILY.heuristic_tiles(b1, H100).split_k == 16
    assert FAMILY.heuristic_tiles(replace(b1, dtype="bfloat16", math="fma"), H100).split_k == 16
    conv8 = ConvSpec(dims=2, layout="NHWC", n=128, c=64, k=128, input_size=(112, 112), filter_size=3,
                     dtype="float32", math="tf32")
    assert FAMILY.heuristic_tiles(conv8, H100).split_k == 1
    assert [wgmma_gemm._split_k(*shape, 132) for shape in ((4, 144), (8, 32), (8, 40), (33, 144), (34, 144))] == [
        16, 8, 10, 4, 1]        # one wave of ranges of at least 4 slices, where tiles fill at most a quarter of the SMs
    assert wgmma_gemm._split_k(70, 144, 132) == wgmma_gemm._split_k(100, 144, 132) == 1   # slower on the H100
    space = wgmma_gemm.tuning_fields(b1, H100)
    assert {f.get("split_k", 1) for f in space} == set(wgmma_gemm.TUNING_SPLITS)
    bf16_space = wgmma_gemm.tuning_fields(replace(b1, dtype="bfloat16", math="fma"), H100)
    assert {f.get("split_k", 1) for f in bf16_space} == set(wgmma_gemm.TUNING_SPLITS)
    assert not any("split_k" in f for f in wgmma_gemm.tuning_fields(conv8, H100))


def test_sixty_four_bit_indices_compile_without_spills(cache_dir):
    """An image past 2^31 elements: the pixel table holds 64-bit base offsets."""
    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=64, input_size=(4096, 4100), filter_size=3, padding=1,
                    dtype="bfloat16")
    tiles = FAMILY.heuristic_tiles(spec, H100)
    assert FAMILY.plan(spec, tiles, H100).context.idx_t == "long long"
    _compiles_clean(spec, tiles)


def test_source_issues_warpgroup_mmas_from_swizzled_descriptors():
    spec = SPECS["2d-nhwc-conv8"]
    tiles = _tiles(spec, 256, 128, 128, 4)
    plan = FAMILY.plan(spec, tiles, H100)
    code = render_kernels(plan).code
    assert "implicit_gemm / wgmma" in code and "spec:  2D NHWC n=2 c=64 k=128" in code and tiles.describe() in code
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.f16.f16" in code and "(1ull << 62)" in code
    assert plan.arch_specific and plan.min_arch == 90 and plan.launches[0].persistent
    assert plan.launches[0].grid[0] == min(plan.context.tiles_total, H100.sm_count)


def test_a_comes_by_im2col_tma_where_each_slice_is_one_tap_and_by_cp_async_elsewhere():
    """C a multiple of the slice (64 16-bit channels): one im2col copy of A a slice, no pixel table, no
    proxy fence, x passed as a map of 16-bit elements; C 40: the producer's cp.async copies, ordered
    before the MMAs by the fence. Both take B by a tiled TMA copy in the MMAs' swizzle."""
    spec = SPECS["2d-nhwc-conv8"]
    plan = FAMILY.plan(spec, _tiles(spec, 256, 128, 128, 4), H100)
    code = render_kernels(plan).code
    w_map, x_map = plan.launches[0].tensor_maps
    assert plan.context.a_tma and plan.launches[0].args == ("y",)
    assert (w_map.buffer, w_map.dims, w_map.box, w_map.swizzle, w_map.dtype) == ("w", (576, 128), (64, 128), 128,
                                                                                    DType.float16)
    assert (x_map.buffer, x_map.box, x_map.swizzle, x_map.dtype, x_map.strides[0]) == ("x", (64, 256), 128,
                                                                                          DType.float16, 2 * 64)
    assert "convgen_im2col_copy(" in code and "convgen_tensor_copy(" in code
    assert "fence.proxy.async" not in code and "pixel_table" not in code and "cp.async.ca" not in code
    assert plan.context.shared_bytes == 1024 + 4 * (256 + 128) * 128 + 16 * 4
    odd = SPECS["2d-nhwc-odd"]
    plan = FAMILY.plan(odd, _tiles(odd, 128, 64, 64, 3), H100)
    code = render_kernels(plan).code
    assert not plan.context.a_tma and plan.launches[0].args == ("x", "y")
    assert [m.buffer for m in plan.launches[0].tensor_maps] == ["w"]
    assert "fence.proxy.async.shared::cta" in code and "cp.async.mbarrier.arrive.noinc" in code
    assert "convgen_im2col_copy" not in code and "convgen_tensor_copy(" in code


@pytest.mark.parametrize("cluster", [2])
def test_clusters_multicast_b_and_take_neighbouring_m_tiles(cluster):
    """Blocks of a cluster take neighbouring M tiles of one unit and each multicasts 1 / cluster of
    B's rows to all; the grid is whole clusters, stage releases go to every block's empty barrier,
    and a cluster's tiles past M (3 M tiles in clusters of 2) read zeros and store nothing."""
    spec = SPECS["2d-nhwc-odd"]          # M 324: 3 tiles of 128 rows; N 75: 3 tiles of 32 channels
    tiles = MmaTiles(block_m=128, block_n=32, block_k=64, warp_m=64, warp_n=32, stages=3, wgmma=True,
                     cluster_m=cluster)
    plan = FAMILY.plan(spec, tiles, H100)
    context, code = plan.context, render_kernels(plan).code
    assert (context.m_tiles, context.n_tiles, context.units_total) == (3, 3, -(-3 // cluster) * 3)
    assert context.m_tail and context.b_box_rows == 32 // cluster
    assert plan.launches[0].grid[0] == context.units_total * cluster
    assert plan.launches[0].tensor_maps[0].box == (64, 32 // cluster)
    assert f"__cluster_dims__({cluster}, 1, 1)" in code and ".multicast::cluster" in code
    assert f"(unsigned short){2 ** cluster - 1}" in code and f"if (lane < {cluster}) convgen_barrier_arrive_remote" in code
    assert "convgen_cluster_sync();" in code and f"* {cluster} + rank) * 128" in code
    assert f"convgen_barrier_init(empty + 8u * s, {2 * 4 * cluster});" in code
    _compiles_clean(spec, tiles)
    big = replace(spec, n=128)           # a persistent grid of whole clusters, one per `cluster` SMs
    assert FAMILY.plan(big, tiles, H100).launches[0].grid[0] == H100.sm_count // cluster * cluster


def test_cluster_needs_wgmma_a_listed_size_and_as_many_m_tiles():
    with pytest.raises(SpecError, match="tiles.cluster_m"):
        MmaTiles(cluster_m=2)
    for size in (3, 4):   # 4 ran correctly, but its grid did not fit the H100 at once
        with pytest.raises(SpecError, match="tiles.cluster_m"):
            MmaTiles(block_m=128, block_n=64, block_k=64, warp_m=64, warp_n=64, stages=3, wgmma=True, cluster_m=size)
    one_tile = replace(SPECS["2d-nhwc-odd"], n=1, input_size=(9, 9))     # 5 x 4 = 20 output pixels: one M tile
    with pytest.raises(SpecError, match="tiles.cluster_m.*1 M tile"):
        check_tiles(one_tile, _tiles(one_tile, 64, 64, 64, 3, cluster_m=2), H100)
    assert "cluster_m" not in FAMILY.heuristic_tiles(SPECS["2d-nhwc-conv8"], H100).to_dict()


@pytest.mark.parametrize("cluster", [1, 2])
@pytest.mark.parametrize("name", ["2d-nhwc-conv8", "3d-ndhwc-tma-a", "2d-nhwc-tf32-tma-a"])
@pytest.mark.parametrize("shape", [(256, 64, 128, 4), (64, 256, 64, 5, True), (128, 128, 128, 5, True),
                                   (128, 32, 64, 2)], ids=["256x64", "pingpong-64x256", "pingpong-128x128", "128x32"])
def test_tma_a_and_cluster_kernels_compile_without_warnings_or_spills(shape, name, cluster, cache_dir):
    spec = SPECS[name]
    tiles = MmaTiles(block_m=shape[0], block_n=shape[1], block_k=wgmma_gemm.slice_k(spec), warp_m=shape[2],
                     warp_n=shape[1], stages=shape[3], wgmma=True, pingpong=len(shape) > 4, cluster_m=cluster)
    assert wgmma_gemm.a_by_tma(spec, tiles.block_k)
    _compiles_clean(spec, tiles)


NARROW = {  # C a multiple of a 64- or 32-byte slice and not of 128 bytes: A by TMA in the narrower slice
    "c96-bf16": (replace(SPECS["2d-nhwc-conv8"], c=96, dtype="bfloat16"), 64),
    "c16-bf16-3d": (SPECS["3d-ndhwc"], 32),
    "c48-bf16": (replace(SPECS["2d-nhwc-odd"], c=48, dpitch=56), 32),
    "c16-tf32": (replace(SPECS["2d-nhwc-tf32-tma-a"], c=16, dpitch=20), 64),
    "c8-tf32-3d": (replace(SPECS["3d-ndhwc-tf32"], c=8), 32),
}
CONV5 = ConvSpec(dims=2, layout="NHWC", n=128, c=96, k=256, input_size=(24, 24), filter_size=5, padding=2,
                 dtype="bfloat16")


@pytest.mark.parametrize("name", NARROW)
def test_narrow_slices_take_a_by_tma_in_their_own_swizzle(name):
    """The widest slice whose channels divide C takes A by TMA, each slice one tap's channels; the
    descriptors and both maps take that width's swizzle, and the stages and the split of K the
    heuristic completes are counted in 128-byte slices. C that divides none keeps 128-byte
    slices by cp.async."""
    spec, width = NARROW[name]
    assert wgmma_gemm.tma_slice_bytes(spec) == width
    tiles = MmaTiles.from_dict(wgmma_gemm.complete_fields(spec, {"wgmma": True, "block_k": wgmma_gemm.slice_k(spec, width)},
                                                          H100))
    wide = MmaTiles.from_dict(wgmma_gemm.complete_fields(spec, {"wgmma": True, "block_k": wgmma_gemm.slice_k(spec)}, H100))
    plan = FAMILY.plan(spec, tiles, H100)
    assert plan.context.a_tma and not FAMILY.plan(spec, wide, H100).context.a_tma
    assert tiles.stages == wide.stages * 128 // width and tiles.split_k == wide.split_k
    assert [m.swizzle for m in plan.launches[0].tensor_maps] == [width, width]
    assert plan.context.k_steps == width // 32 and plan.context.c_chunks == spec.c // tiles.block_k
    code = render_kernels(plan).code
    assert f"({8 * width} >> 4) << 32) | ({wgmma_gemm.SWIZZLE_MODES[width]}ull << 62)" in code
    assert f"{width}-byte rows" in code and f"in the {width}-byte swizzle" in code
    for odd in (SPECS["2d-nhwc-odd"], SPECS["2d-nhwc-tf32-odd"], SPECS["3d-ndhwc-unpadded-tail"]):
        assert wgmma_gemm.tma_slice_bytes(odd) is None and not FAMILY.plan(
            odd, FAMILY.heuristic_tiles(odd, H100), H100).context.a_tma


def test_heuristic_narrows_shared_tiles_to_64_byte_slices_in_clusters_of_2():
    """C 96 in BF16 (conv5) runs shared 128x256 tiles in 64-byte slices, A by TMA, in clusters of 2;
    ping-pong tiles, 32-byte slices (C 16) and C that 128-byte slices divide keep 128-byte slices
    and no cluster, as do completed tiles of ping-pong; completed shared tiles narrow as the
    heuristic does; asked for block_k or cluster_m, the other is the heuristic's."""
    tiles = FAMILY.heuristic_tiles(CONV5, H100)
    assert (tiles.block_m, tiles.block_n, tiles.pingpong) == (128, 256, False)
    assert (tiles.block_k, tiles.cluster_m, tiles.stages) == (32, 2, 2 * wgmma_gemm.DEFAULT_STAGES)
    for spec in (replace(CONV5, n=8, c=32, k=96), replace(CONV5, c=16), replace(CONV5, c=128)):
        other = FAMILY.heuristic_tiles(spec, H100)
        assert other.block_k == 64 and other.cluster_m == 1, (spec.describe(), other.describe())
    assert FAMILY.heuristic_tiles(replace(CONV5, n=8, c=32, k=96), H100).pingpong
    pingpong = wgmma_gemm.complete_fields(CONV5, {"wgmma": True, "pingpong": True, "block_n": 128}, H100)
    assert (pingpong["block_k"], pingpong.get("cluster_m", 1), pingpong["stages"]) == (64, 1, wgmma_gemm.PINGPONG_STAGES)
    shared = wgmma_gemm.complete_fields(CONV5, {"wgmma": True, "block_n": 128}, H100)
    assert (shared["block_k"], shared["cluster_m"]) == (32, 2)
    kept = wgmma_gemm.complete_fields(CONV5, {"wgmma": True, "cluster_m": 1}, H100)
    assert (kept["block_k"], kept["cluster_m"], kept["stages"]) == (32, 1, 2 * wgmma_gemm.DEFAULT_STAGES)


@pytest.mark.parametrize("width", [64, 32])
@pytest.mark.parametrize("name", ["2d-nhwc-odd", "c96-bf16", "c16-tf32", "c8-tf32-3d"])
@pytest.mark.parametrize("shape", [(256, 64, 128, 8), (64, 256, 64, 10, True), (128, 128, 128, 10, True, 3),
                                   (128, 32, 64, 4, False, 1, 2)],
                         ids=["256x64", "pingpong-64x256", "pingpong-128x128-split-3", "128x32-cluster-2"])
def test_narrow_slices_compile_without_warnings_or_spills(shape, name, width, cache_dir):
    """64- and 32-byte slices with A by TMA (C a multiple of the slice) and by cp.async (C 40 in BF16,
    C 8 in TF32 in 64-byte slices: chunk j of row r at j ^ (r / 2 % 4), or j ^ (r / 4 % 2) in 32-byte
    ones), shared and ping-pong tiles, split-K, a cluster."""
    spec = NARROW[name][0] if name in NARROW else SPECS[name]
    block_k = wgmma_gemm.slice_k(spec, width)
    stages = shape[3] * 64 // width
    tiles = MmaTiles(block_m=shape[0], block_n=shape[1], block_k=block_k, warp_m=shape[2], warp_n=shape[1],
                     stages=stages, wgmma=True, pingpong=len(shape) > 4 and shape[4],
                     split_k=shape[5] if len(shape) > 5 else 1, cluster_m=shape[6] if len(shape) > 6 else 1)
    by_tma = spec.c % block_k == 0 and name != "2d-nhwc-odd"
    assert wgmma_gemm.a_by_tma(spec, block_k) == by_tma
    code = render_kernels(FAMILY.plan(spec, tiles, H100)).code
    if not by_tma:
        assert f"((chunk ^ ((row0 / {128 // width}) % {width // 16})) << 4)" in code
    _compiles_clean(spec, tiles)


def test_slice_widths_and_stages_are_refused_naming_the_field():
    spec = NARROW["c96-bf16"][0]
    with pytest.raises(SpecError) as error:
        check_tiles(spec, dataclasses.replace(FAMILY.heuristic_tiles(spec, H100), block_k=8), H100)
    assert error.value.field == "tiles.block_k" and "(64, 32, 16)" in error.value.allowed
    with pytest.raises(SpecError) as error:
        MmaTiles(stages=8)                                             # mma.sync keeps 2-6
    assert error.value.field == "tiles.stages" and "wgmma" in error.value.allowed
    with pytest.raises(SpecError) as error:
        MmaTiles(block_m=128, block_n=64, block_k=16, warp_m=64, warp_n=64, stages=25, wgmma=True)
    assert error.value.field == "tiles.stages"
    space = wgmma_gemm.tuning_fields(spec, H100)
    assert {f["block_k"] for f in space} == {64, 32}
    assert {f["stages"] for f in space if f["block_k"] == 32} <= {2 * s for s in wgmma_gemm.TUNING_STAGES}


def test_tf32_source_reads_float32_bits_with_k8_mmas_and_stores_floats():
    """TF32 takes k8 MMAs without the 16-bit transpose immediates, stores the FP32 sums unrounded,
    and its plan says the operands are truncated, which doubles the bound's product error."""
    spec = SPECS["2d-nhwc-tf32-odd"]
    plan = FAMILY.plan(spec, _tiles(spec, 128, 64, 64, 3), H100)
    code = render_kernels(plan).code
    assert "wgmma.mma_async.sync.aligned.m64n64k8.f32.tf32.tf32" in code and "p, 1, 1;" in code
    assert "typedef float convgen_element;" in code and "cvt.rn" not in code
    assert plan.tf32_truncated and plan.context.BK == 32 and plan.context.chunk_elements == 4
    assert not FAMILY.plan(SPECS["2d-nhwc-odd"], _tiles(SPECS["2d-nhwc-odd"], 128, 64, 64, 3), H100).tf32_truncated
    assert not FAMILY.plan(spec, FAMILY.default_tiles(spec, device=H100), H100).tf32_truncated   # mma.sync rounds
    truncated = FAMILY.roundoff(spec, plan)
    rounded = FAMILY.roundoff(spec, FAMILY.plan(spec, FAMILY.default_tiles(spec, device=H100), H100))
    assert truncated.operand == 2 * rounded.operand == 2.0**-10 and truncated.product > 1.9 * rounded.product


@pytest.mark.parametrize("name, split_k, mode, stored, y_alignment", [
    ("3d-ndhwc", 1, "quad", "uint4", 16),               # bf16, K 40: a quad's four pairs transposed
    ("3d-ndhwc-tf32", 1, "pair", "float4", 16),         # FP32 sums, K 40: pairs swapped between lanes 1 apart
    ("3d-ndhwc", 2, "pair", "float4", 4),               # split-K's FP32 partials; the reduction stores pairs in y
    ("2d-nhwc-odd", 1, "", "unsigned short*>(out + j * 8)", 2),  # K 75: rows 150 bytes apart, the MMA layout
    ("2d-nhwc-tf32-odd", 1, "", "out[j * 8]", 4),
])
def test_epilogue_stores_16_bytes_a_lane_where_every_output_row_is_aligned(name, split_k, mode, stored, y_alignment):
    spec = SPECS[name]
    plan = FAMILY.plan(spec, _tiles(spec, 128, 64, 64, 3, split_k=split_k), H100)
    code = render_kernels(plan).code
    assert plan.context.store_mode == mode and stored in code
    assert ("__shfl_xor_sync" in code) == bool(mode)
    alignments = {buffer.name: buffer.alignment for buffer in plan.buffers}
    assert alignments["y"] == y_alignment and alignments.get("partials", 16) == 16
    _compiles_clean(spec, plan.tiles)


@pytest.mark.parametrize("shape", SHAPES + [(*shape, True) for shape in PINGPONG_SHAPES], ids=str)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
def test_16_byte_stores_compile_without_spills_on_every_tile_shape(shape, dtype, cache_dir):
    """The exchanges hold a group's words in registers next to the accumulators: the widest tiles
    must still fit."""
    spec = replace(SPECS["2d-nhwc-conv8"], k=256, dtype=dtype, math="tf32" if dtype == "float32" else "fma")
    tiles = _tiles(spec, *shape)
    assert FAMILY.plan(spec, tiles, H100).context.store_mode == ("pair" if dtype == "float32" else "quad")
    _compiles_clean(spec, tiles)


def test_chooser_takes_wgmma_on_sm_90_and_mma_sync_elsewhere():
    covered = SPECS["2d-nhwc-odd"]
    three = replace(covered, dtype="float32", math="3xtf32")
    for spec in (covered, replace(covered, dtype="float32", math="tf32"), SPECS["2d-nhwc-tf32-odd"], three):
        assert api.plan("implicit_gemm", spec, target="h100").variant == "wgmma", spec.describe()
    assert api.plan("implicit_gemm", covered, target="a100").variant == "mma"
    assert api.plan("implicit_gemm", covered, target="b200").variant == "mma"   # wgmma is sm_90a's alone
    tf32 = SPECS["2d-nhwc-tf32-odd"]
    for uncovered in (replace(covered, layout="NCHW", dpitch=None), replace(covered, c=5, dpitch=None),
                      replace(covered, dpitch=44), replace(three, c=20, dpitch=None), replace(three, k=32),
                      replace(three, layout="NCHW", dpitch=None), replace(tf32, c=6, dpitch=None),
                      replace(tf32, dpitch=22)):
        assert api.plan("implicit_gemm", uncovered, target="h100").variant == "mma", uncovered.describe()
    assert FAMILY.default_tiles(covered, device=H100).wgmma is False   # the portable kernel stays the default


@settings(max_examples=40)
@given(spec=specs(layouts=(Layout.NHWC, Layout.NDHWC), max_k=300, max_elements=1 << 16, max_filter=5),
       dtype=st.sampled_from(("float16", "bfloat16")), c=st.integers(1, 6), extra=st.integers(0, 2),
       target=st.sampled_from(("h100", "h100-pcie", "h100,sm_count=16")))
def test_heuristic_tiles_are_valid_for_every_covered_spec(spec, dtype, c, extra, target):
    spec = replace(spec, c=8 * c, dpitch=8 * (c + extra), dtype=dtype)
    card = api.resolve_device(target, None)
    tiles = FAMILY.heuristic_tiles(spec, card)
    assert tiles.wgmma
    check_tiles(spec, tiles, card)
    plan = FAMILY.plan(spec, tiles, card)
    assert plan.launches[0].grid[0] <= card.sm_count
    render_kernels(plan)


def test_heuristic_fills_the_sms_before_growing_the_tile():
    conv8 = ConvSpec(dims=2, layout="NHWC", n=128, c=64, k=128, input_size=(112, 112), filter_size=3,
                     dtype="bfloat16")
    c3d_conv3 = ConvSpec(dims=3, layout="NDHWC", n=8, c=128, k=256, input_size=(8, 28, 28), filter_size=3,
                         padding=1, dtype="bfloat16")
    conv8_tf32 = replace(conv8, dtype="float32", math="tf32")   # 16-bit runs these rows as ping-pong's 128x128
    assert (FAMILY.heuristic_tiles(conv8_tf32, H100).block_m, FAMILY.heuristic_tiles(conv8_tf32, H100).block_n) == (256, 128)
    assert (FAMILY.heuristic_tiles(c3d_conv3, H100).block_m, FAMILY.heuristic_tiles(c3d_conv3, H100).block_n) == (128, 256)
    medium = ConvSpec(dims=2, layout="NHWC", n=8, c=64, k=128, input_size=(50, 50), filter_size=1, dtype="float32",
                      math="tf32")
    tiles = FAMILY.heuristic_tiles(medium, H100)     # 256x128 gives 79 tiles, 128x128 157
    assert (tiles.block_m, tiles.block_n, tiles.warp_m, tiles.pingpong) == (128, 128, 64, False)
    tiles = FAMILY.heuristic_tiles(replace(medium, dtype="bfloat16", math="fma"), H100)   # A by TMA: ping-pong
    assert (tiles.block_m, tiles.block_n, tiles.warp_m, tiles.pingpong) == (128, 128, 128, True)
    tiles = FAMILY.heuristic_tiles(replace(medium, c=40, dtype="bfloat16", math="fma"), H100)   # A by cp.async
    assert (tiles.block_m, tiles.block_n, tiles.warp_m, tiles.pingpong) == (128, 128, 64, False)


def test_tiles_name_wgmma_only_where_set():
    """The mma.sync kernels keep the records and names (a hash of the tiles' description) they had before the field."""
    assert "wgmma" not in MmaTiles().to_dict() and MmaTiles.from_dict(MmaTiles().to_dict()) == MmaTiles()
    assert "pingpong" not in _tiles(SPECS["2d-nhwc-odd"], 128, 64, 64, 3).to_dict()
    assert "split_k" not in _tiles(SPECS["2d-nhwc-odd"], 128, 64, 64, 3).to_dict()
    assert _tiles(SPECS["2d-nhwc-odd"], 128, 64, 128, 3, pingpong=True).describe().endswith("wgmma=True pingpong=True")
    assert MmaTiles().describe() == "block_m=128 block_n=128 block_k=32 warp_m=64 warp_n=64 stages=3"
    assert _tiles(SPECS["2d-nhwc-odd"], 128, 64, 64, 3).describe().endswith("wgmma=True")


@pytest.mark.parametrize("tiles, field", [
    ({"warp_m": 32}, "tiles.warp_m"),
    ({"block_n": 128, "warp_n": 64}, "tiles.warp_n"),
    ({"block_m": 256, "warp_m": 64}, "tiles.block_m"),
    ({"block_n": 16, "warp_n": 16}, "tiles.block_n"),
    ({"block_m": 256, "warp_m": 128, "block_n": 256, "warp_n": 256}, "tiles.warp_n"),
])
def test_tile_geometry_errors_name_the_field(tiles, field):
    base = {"block_m": 128, "block_n": 64, "block_k": 64, "warp_m": 64, "warp_n": 64, "stages": 3, "wgmma": True}
    with pytest.raises(SpecError) as error:
        MmaTiles.from_dict({**base, **tiles})
    assert error.value.field == field


def test_mma_sync_warps_refuse_a_warpgroup_s_width():
    with pytest.raises(SpecError) as error:
        MmaTiles(block_m=16, block_n=256, warp_m=16, warp_n=256)
    assert error.value.field == "tiles.warp_n"


@pytest.mark.parametrize("requested, field", [
    ({"block_k": 8}, "tiles.block_k"),
    ({"block_m": 256, "block_n": 128, "stages": 6}, "tiles.stages"),
    ({"block_m": 256, "block_n": 128, "block_k": 16, "stages": 24}, "tiles.stages"),
])
def test_spec_dependent_tile_errors_name_the_field(requested, field):
    with pytest.raises(SpecError) as error:
        api.plan("implicit_gemm", SPECS["2d-nhwc-conv8"], {"wgmma": True, **requested}, target="h100")
    assert error.value.field == field


@pytest.mark.parametrize("target", ["a100", "l40s", "b200"])
def test_wgmma_asked_for_below_or_beside_sm_90_is_refused_before_compiling(target):
    with pytest.raises(SpecError) as error:
        api.plan("implicit_gemm", SPECS["2d-nhwc-odd"], {"wgmma": True}, target=target)
    assert error.value.field == "tiles.wgmma" and error.value.value is True
    assert "sm_90" in error.value.allowed and "mma.sync" in error.value.allowed


@pytest.mark.parametrize("change", [{"layout": "NCHW", "dpitch": None}, {"c": 12, "dpitch": None},
                                    {"dtype": "float32", "math": "3xtf32", "c": 20, "dpitch": None},
                                    {"dtype": "float32", "math": "tf32", "c": 10, "dpitch": None}])
def test_wgmma_asked_for_on_a_spec_it_does_not_cover_is_refused(change):
    spec = replace(SPECS["2d-nhwc-odd"], **change)
    with pytest.raises(SpecError) as error:
        api.plan("implicit_gemm", spec, {"wgmma": True}, target="h100")
    assert error.value.field == "tiles.wgmma" and "channels-last" in error.value.allowed


def test_a_wgmma_plan_compiled_for_an_older_arch_is_refused():
    plan = FAMILY.plan(SPECS["2d-nhwc-odd"], FAMILY.heuristic_tiles(SPECS["2d-nhwc-odd"], H100), H100)
    with pytest.raises(SpecError) as error:
        check_arch(plan, "sm_80")
    assert error.value.field == "arch" and "sm_90" in error.value.allowed


def test_tuning_space_holds_valid_wgmma_tiles_on_sm_90():
    spec = SPECS["2d-nhwc-conv8"]
    wgmma = [t for t in FAMILY.tuning_space(spec) if t.get("wgmma")]
    assert {(t["block_m"], t["block_n"]) for t in wgmma} >= {(256, 128), (128, 128), (64, 64)}
    for fields in wgmma:
        check_tiles(spec, MmaTiles.from_dict(fields), H100)
    assert not [t for t in FAMILY.tuning_space(replace(spec, layout="NCHW", dpitch=None)) if t.get("wgmma")]


def test_emitted_file_names_sm_90a_and_its_variant():
    text = emit_source("implicit_gemm", SPECS["3d-ndhwc"], launcher="conv")
    assert build_flags(text) == ["-gencode", "arch=compute_90a,code=sm_90a"]
    assert "implicit_gemm / wgmma" in text and "wgmma.mma_async" in text
    assert 'extern "C" cudaError_t conv(const __nv_bfloat16* x, const __nv_bfloat16* w, __nv_bfloat16* y' in text


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["2d-nhwc-odd", "3d-ndhwc", "2d-nhwc-conv8", "2d-nhwc-tf32-odd"])
def test_emitted_file_builds_with_plain_nvcc_without_warnings(name, tmp_path):
    path = emit("implicit_gemm", SPECS[name], tmp_path / f"{name}.cu")
    built = subprocess.run(["nvcc", *build_flags(path.read_text()), "-Werror", "all-warnings", "-DCONVGEN_SELFTEST",
                            "-DCONVGEN_BENCH", "-c", str(path), "-o", str(tmp_path / f"{name}.o")],
                           capture_output=True, text=True)
    assert built.returncode == 0 and not built.stderr.strip(), built.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
@pytest.mark.parametrize("name", ["c96-bf16", "c8-tf32-3d"])
def test_emitted_narrow_slice_file_encodes_its_swizzle_and_builds_with_plain_nvcc(name, tmp_path):
    spec, width = NARROW[name]
    tiles = {"wgmma": True, "block_k": wgmma_gemm.slice_k(spec, width), "block_m": 64, "warp_m": 64, "block_n": 32,
             "cluster_m": 2}
    path = emit("implicit_gemm", spec, tmp_path / f"{name}.cu", tiles)
    text = path.read_text()
    assert text.count(f"CU_TENSOR_MAP_SWIZZLE_{width}B") == 2 and "CU_TENSOR_MAP_SWIZZLE_128B" not in text
    built = subprocess.run(["nvcc", *build_flags(text), "-Werror", "all-warnings", "-DCONVGEN_SELFTEST",
                            "-c", str(path), "-o", str(tmp_path / f"{name}.o")], capture_output=True, text=True)
    assert built.returncode == 0 and not built.stderr.strip(), built.stderr


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_emitted_split_k_file_takes_its_workspace_and_builds_with_plain_nvcc(tmp_path):
    """The launcher takes the partial tiles' workspace from the caller and runs the GEMM, then the
    reduction, on the caller's stream; the self-test allocates the workspace."""
    spec = SPECS["2d-nhwc-odd"]
    tiles = _tiles(spec, 64, 64, 64, 4, pingpong=True, split_k=3).to_dict()
    path = emit("implicit_gemm", spec, tmp_path / "split.cu", tiles)
    text = path.read_text()
    assert "float* partials, cudaStream_t stream)" in text and "cudaMemsetAsync" not in text
    assert text.index("(w_map, x, partials);") < text.index("_reduce<<<") < text.index("(partials, y);")
    built = subprocess.run(["nvcc", *build_flags(text), "-Werror", "all-warnings", "-DCONVGEN_SELFTEST",
                            "-c", str(path), "-o", str(tmp_path / "split.o")], capture_output=True, text=True)
    assert built.returncode == 0 and not built.stderr.strip(), built.stderr


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 4), size=st.tuples(st.integers(5, 40), st.integers(5, 40)), c=st.integers(1, 16),
       k=st.integers(8, 300), filt=st.integers(1, 3), three_d=st.booleans(), shape=st.sampled_from(SHAPES),
       cluster=st.sampled_from((1, 2)), tail_split=st.integers(2, 6), sm_count=st.integers(1, 12))
def test_the_schedule_covers_every_tile_and_k_slice_once(n, size, c, k, filt, three_d, shape, cluster, tail_split,
                                                         sm_count):
    """The work units of a plan with a tail split, walked as the kernel walks them: every (tile, k-slice)
    of the GEMM is one unit's, the last round's tiles in ranges of whole slices, none empty; its split
    tiles' rows lie in the partial tiles, and the grid is whole clusters of at most the card's SMs.
    Cards of 1-12 SMs, so that a few tiles make several rounds (about a quarter of the draws split
    a last round, clusters and several channel tiles among them)."""
    if three_d:
        spec = ConvSpec(dims=3, layout="NDHWC", n=n, c=8 * c, k=k, input_size=(4, *size), filter_size=filt,
                        padding=filt // 2, dtype="bfloat16")
    else:
        spec = ConvSpec(dims=2, layout="NHWC", n=n, c=8 * c, k=k, input_size=size, filter_size=filt,
                        stride=1 + k % 2, padding=filt // 2, dtype="bfloat16")
    card = dataclasses.replace(H100, sm_count=sm_count)
    try:
        tiles = dataclasses.replace(_tiles(spec, *shape, cluster_m=cluster), tail_split=tail_split)
        check_tiles(spec, tiles, card)
    except SpecError:
        assume(False)
    walk = wgmma_gemm.schedule(spec, tiles, card)
    plan = FAMILY.plan(spec, tiles, card)
    k_tiles = plan.context.k_tiles
    covered = {}
    for unit in range(walk.units_total):
        whole = unit < walk.whole_units
        tile = unit if whole else walk.whole_units + (unit - walk.whole_units) // walk.tail_splits
        begin = 0 if whole else (unit - walk.whole_units) % walk.tail_splits * walk.tail_k_per_split
        end = k_tiles if whole else min(begin + walk.tail_k_per_split, k_tiles)
        assert begin < end, (unit, walk)
        for kt in range(begin, end):
            assert (tile, kt) not in covered
            covered[tile, kt] = unit
        if not whole:
            assert (tile // walk.n_tiles) * cluster * tiles.block_m >= walk.tail_first_row
    assert len(covered) == walk.units * k_tiles
    assert walk.grid_blocks % cluster == 0 and walk.grid_blocks <= max(cluster, sm_count // cluster * cluster)
    if walk.tail_tiles:
        gemm_m = plan.context.GEMM_M
        assert walk.units > walk.slots and walk.tail_tiles == walk.units % walk.slots
        assert [b.shape for b in plan.workspaces] == [(walk.tail_splits, gemm_m - walk.tail_first_row, plan.context.GEMM_N)]
        assert len(plan.launches) == 2
    else:
        assert not plan.workspaces and len(plan.launches) == 1


@settings(max_examples=6)
@given(spec=specs(layouts=(Layout.NHWC, Layout.NDHWC), max_k=GEMM_RANGES["max_k"], max_elements=1 << 16,
                  max_filter=3), c=st.integers(1, 5), shape=st.sampled_from(SHAPES))
def test_random_specs_and_tiles_compile_without_warnings(spec, c, shape):
    spec = replace(spec, c=8 * c, dpitch=8 * c, dtype="bfloat16")
    tiles = _tiles(spec, *shape)
    try:
        check_tiles(spec, tiles, H100)
    except SpecError:
        assume(False)
    _compiles_clean(spec, tiles)


THREE = {  # 3xTF32: A by TMA in 128-, 64- and 32-byte slices; 2D and 3D; a pitch past C
    "conv8": ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=128, input_size=(30, 30), filter_size=3, dtype="float32",
                      math="3xtf32"),
    "odd-c48-3d": ConvSpec(dims=3, layout="NDHWC", n=2, c=48, k=96, input_size=(5, 9, 11), filter_size=3, padding=1,
                           dpitch=52, dtype="float32", math="3xtf32"),
    "odd-c40-strided": replace(SPECS["2d-nhwc-odd"], dtype="float32", math="3xtf32"),
}


@pytest.mark.parametrize("name", THREE)
def test_three_tf32_splits_the_filter_once_and_a_in_registers(name):
    """The plan runs the filter's split kernel, then the GEMM, whose B map reads the split filter's two planes and
    whose consumers load A's fragments with ldmatrix and split them in registers for MMAs with A from registers;
    operands are rounded, not truncated. TMA lands A, so no proxy fence is needed."""
    spec = THREE[name]
    tiles = FAMILY.heuristic_tiles(spec, H100)
    plan = FAMILY.plan(spec, tiles, H100)
    assert plan.variant == "wgmma" and not plan.tf32_truncated
    split, main = plan.launches[:2]
    assert split.kernel.endswith("_split_filter") and split.args == ("w", "w_split")
    assert {m.buffer for m in main.tensor_maps} == {"x", "w_split"}
    w_map = next(m for m in main.tensor_maps if m.buffer == "w_split")
    assert w_map.dims[2] == 2 and w_map.box[2] == 1
    alg = IndexAlgebra(spec)
    assert plan.workspace_bytes >= 2 * spec.k * spec.c * alg.taps * 4
    assert wgmma_gemm.workspace_bytes(spec, tiles.to_dict(), H100) == plan.workspace_bytes
    text = render_kernels(plan).code
    assert text.count("wgmma.mma_async") == 1 and "ldmatrix.sync.aligned.m8n8.x4.shared.b16" in text
    assert text.count("convgen_mma_registers(slices[mb]") == 3
    assert "asm(\"cvt.rna" not in text and "fence.proxy.async" not in text
    assert "float slices[" in text and "wgmma.wait_group.sync.aligned %0" in text
    a_part = tiles.block_m * tiles.block_k * 4
    assert plan.context.a_stage_bytes == a_part and plan.context.b_stage_bytes == 2 * tiles.block_n * tiles.block_k * 4


def test_three_tf32_takes_wgmma_from_64_output_channels_or_16_input_channels():
    """The heuristic's kernel for channels-last 3xTF32 on the H100: WGMMA where K >= 64 or C takes A in slices of 64
    bytes or more (C a multiple of 16); mma.sync where both are narrower (C 8, 24, 40: 32-byte slices)."""
    base = ConvSpec(dims=2, layout="NHWC", n=4, c=32, k=32, input_size=(20, 20), filter_size=3, dtype="float32",
                    math="3xtf32")
    expected = {(32, 32): "wgmma", (16, 32): "wgmma", (48, 32): "wgmma", (8, 64): "wgmma", (8, 32): "mma",
                (24, 32): "mma", (40, 16): "mma", (64, 12): "wgmma"}
    for (c, k), variant in expected.items():
        spec = replace(base, c=c, k=k)
        assert FAMILY.plan(spec, FAMILY.heuristic_tiles(spec, H100), H100).variant == variant, (c, k)


@pytest.mark.parametrize("name", THREE)
@pytest.mark.parametrize("shape", [None, (64, 128, 64, 3, True), (128, 64, 64, 4, False, 2), (64, 64, 64, 3, True, 1, 2),
                                   (64, 128, 64, 3, True, 1, 1, 3), (128, 64, 128, 3, True), (128, 64, 128, 3, False)],
                         ids=["heuristic", "pingpong", "split-k", "cluster", "tail", "two-blocks-pingpong",
                              "two-blocks-one-consumer"])
def test_three_tf32_kernels_compile_without_warnings_or_spills(name, shape, cache_dir):
    spec = THREE[name]
    if shape is None:
        tiles = FAMILY.heuristic_tiles(spec, H100)
    else:
        block_m, block_n, warp_m, stages, pingpong, *rest = shape
        width = wgmma_gemm.tma_slice_bytes(spec)
        try:
            tiles = MmaTiles(block_m=block_m, block_n=block_n, block_k=wgmma_gemm.slice_k(spec, width), warp_m=warp_m,
                             warp_n=block_n, stages=stages * (128 // width), wgmma=True, pingpong=pingpong,
                             split_k=rest[0] if rest else 1, cluster_m=rest[1] if len(rest) > 1 else 1,
                             tail_split=rest[2] if len(rest) > 2 else 1)
            check_tiles(spec, tiles, H100)
        except SpecError as error:
            pytest.skip(f"not a tile of this spec: {error}")
    _compiles_clean(spec, tiles)


def test_three_tf32_refuses_tiles_past_its_accumulators_and_a_by_cp_async():
    """Two accumulator sets a consumer thread (the sums and a slice's products) hold at most 64 each;
    A's fragments are loaded from what TMA lands, so block_k must take A by TMA."""
    spec = THREE["conv8"]
    with pytest.raises(SpecError) as error:
        check_tiles(spec, MmaTiles(block_m=128, block_n=256, block_k=32, warp_m=64, warp_n=256, stages=2, wgmma=True),
                    H100)
    assert error.value.field == "tiles.warp_n" and "3xtf32" in error.value.allowed
    odd = THREE["odd-c48-3d"]   # C 48: A by TMA in 64-byte slices, not in 128-byte ones
    with pytest.raises(SpecError) as error:
        check_tiles(odd, MmaTiles(block_m=128, block_n=64, block_k=32, warp_m=64, warp_n=64, stages=3, wgmma=True),
                    H100)
    assert error.value.field == "tiles.block_k" and "TMA" in error.value.allowed


def test_three_tf32_heuristic_tiles_keep_within_the_accumulators_and_fit_shared_memory():
    for spec in THREE.values():
        tiles = FAMILY.heuristic_tiles(spec, H100)
        assert tiles.wgmma and tiles.warp_m * tiles.warp_n // 128 <= wgmma_gemm.PROMOTED_ACCUMULATORS
        assert wgmma_gemm.a_by_tma(spec, tiles.block_k)
        assert wgmma_gemm.shared_bytes(spec, tiles) <= H100.shared_per_block
        fields = FAMILY.complete_tiles(spec, {"wgmma": True, "block_n": 64}, H100)
        check_tiles(spec, fields, H100)


@pytest.mark.parametrize("spec", [THREE["conv8"], SPECS["2d-nhwc-conv8"]], ids=["3xtf32", "fp16"])
def test_warp_rows_asked_for_alone_get_a_tile_of_whole_consumers(spec):
    """Where the heuristic takes ping-pong's 64-row tiles, 128-row warps asked for alone get a 128-row tile of
    one consumer warpgroup, not a refusal of the heuristic's 64 rows."""
    assert FAMILY.heuristic_tiles(spec, H100).pingpong
    tiles = FAMILY.complete_tiles(spec, {"wgmma": True, "warp_m": 128, "block_n": 64}, H100)
    assert (tiles.block_m, tiles.warp_m, tiles.block_n, tiles.pingpong) == (128, 128, 64, False)
    check_tiles(spec, tiles, H100)


def test_three_tf32_under_a_workspace_limit_below_the_split_filter_runs_mma_sync():
    spec = THREE["conv8"]
    assert FAMILY.tiles_within(spec, 0, H100).wgmma is False
    assert FAMILY.tiles_within(spec, wgmma_gemm.split_filter_bytes(spec), H100).wgmma


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_emitted_three_tf32_file_takes_the_split_filter_workspace_and_builds_with_plain_nvcc(tmp_path):
    path = emit("implicit_gemm", THREE["odd-c48-3d"], tmp_path / "three.cu")
    text = path.read_text()
    assert "float* w_split" in text and text.index("_split_filter<<<") < text.index("(w_split_map, x_map")
    built = subprocess.run(["nvcc", *build_flags(text), "-Werror", "all-warnings", "-DCONVGEN_SELFTEST",
                            "-c", str(path), "-o", str(tmp_path / "three.o")], capture_output=True, text=True)
    assert built.returncode == 0 and not built.stderr.strip(), built.stderr


def test_ptxas_serialising_the_mmas_counts_as_a_warning(cache_dir):
    """Reading a slice's sums before all its MMAs retire makes ptxas serialize every wgmma of the kernel, which it
    reports as "info" (C7514, C7518; C7517 for a wait it injects): the compile's warnings carry it, so the no-warning
    checks above catch it."""
    from codegen.compile import compile_source

    spec = THREE["conv8"]
    text = render_kernels(FAMILY.plan(spec, FAMILY.heuristic_tiles(spec, H100), H100)).code
    retire = "convgen_mma_wait<0>();\n#pragma unroll\n                for (int mb = 0;"
    assert retire in text
    early = text.replace(retire, "convgen_mma_wait<1>();\n#pragma unroll\n                for (int mb = 0;")
    warnings = compile_source(early, arch="sm_90a").warnings
    assert any("wgmma.mma_async instructions are serialized" in line for line in warnings), warnings
