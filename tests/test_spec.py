"""Validation: every class of bad input raises SpecError naming the field, the value and what is allowed."""
import json
import subprocess
import sys

import pytest

from codegen.api import plan
from codegen.spec import ConvSpec, Layout, SpecError

GOOD = dict(dims=2, layout="NHWC", n=2, c=3, k=8, input_size=(32, 32), filter_size=(3, 3), stride=1, padding=1,
            dilation=1, dpitch=None, dtype="float32")


def make(**changes):
    return ConvSpec(**{**GOOD, **changes})


BAD_SPECS = [
    ({"dims": 4}, "dims", "2 or 3"),
    ({"dims": True}, "dims", "2 or 3"),
    ({"layout": "NWHC"}, "layout", "one of"),
    ({"layout": "NDHWC"}, "layout", "2D spec takes NCHW or NHWC"),
    ({"dims": 3, "layout": "NHWC", "input_size": 8, "filter_size": 3}, "layout", "3D spec takes NCDHW or NDHWC"),
    ({"n": 0}, "n", ">= 1"),
    ({"c": -3}, "c", ">= 1"),
    ({"k": 2.5}, "k", "integer"),
    ({"input_size": (32, 0)}, "input_size[1]", ">= 1"),
    ({"input_size": (32, 32, 32)}, "input_size", "needs 2 entries"),
    ({"filter_size": (0, 3)}, "filter_size[0]", ">= 1"),
    ({"stride": 0}, "stride", ">= 1"),
    ({"padding": -1}, "padding", ">= 0"),
    ({"dilation": (1, 0)}, "dilation[1]", ">= 1"),
    ({"filter_size": (3, 40), "padding": 1}, "filter_size", "output would be empty"),
    ({"filter_size": 5, "dilation": 9, "padding": 0}, "filter_size", "dilated filter spans 37"),
    ({"dpitch": 2}, "dpitch", ">= c (3)"),
    ({"layout": "NCHW", "dpitch": 4}, "dpitch", "channels-last"),
    ({"dtype": "float64"}, "dtype", "one of"),
    ({"math": "tf16"}, "math", "one of"),
    ({"dtype": "float16", "math": "tf32"}, "math", "float32 only"),
    ({"dtype": "bfloat16", "math": "3xtf32"}, "math", "float32 only"),
]


@pytest.mark.parametrize("changes, field, allowed", BAD_SPECS, ids=[b[1] + ":" + b[2][:18] for b in BAD_SPECS])
def test_bad_spec_names_field_value_and_allowed(changes, field, allowed):
    with pytest.raises(SpecError) as info:
        make(**changes)
    assert info.value.field == field
    assert allowed in str(info.value)
    assert isinstance(info.value, ValueError)
    assert f"{field}=" in str(info.value)


def test_good_spec_normalises_and_round_trips():
    spec = make(stride=(2, 1), layout=Layout.NHWC, dpitch=4)
    assert spec.stride == (2, 1) and spec.padding == (1, 1) and spec.layout is Layout.NHWC
    assert spec.output_size == (16, 32)
    assert ConvSpec.from_dict(json.loads(json.dumps(spec.to_dict()))) == spec


def test_from_dict_rejects_unknown_and_missing_fields():
    with pytest.raises(SpecError, match="strides=1 is invalid: unknown field; the fields are c, dilation"):
        ConvSpec.from_dict({**GOOD, "strides": 1})
    data = dict(GOOD)
    del data["c"]
    with pytest.raises(SpecError, match="c=None is invalid: the field is required"):
        ConvSpec.from_dict(data)


def test_from_json_reports_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(SpecError, match="could not be read"):
        ConvSpec.from_json(str(tmp_path / "missing.json"))
    broken = tmp_path / "broken.json"
    broken.write_text("{not json")
    with pytest.raises(SpecError, match="not valid JSON"):
        ConvSpec.from_json(str(broken))
    listed = tmp_path / "list.json"
    listed.write_text("[1, 2]")
    with pytest.raises(SpecError, match="JSON object"):
        ConvSpec.from_json(str(listed))


BAD_TILES = [
    ("im2col", {"threads": 2048}, "tiles.threads", "[32, 1024]"),
    ("im2col", {"threads": 100}, "tiles.threads", "multiple of 32"),
    ("im2col", {"vectorized": "yes"}, "tiles.vectorized", "True, False"),
    ("im2col", {"unroll": 4}, "tiles.unroll", "unknown tile for this family"),
    ("col2im", {"algorithm": "atomic"}, "tiles.algorithm", "'gather', 'scatter'"),
    ("im2win", {"batch_chunk": 0}, "tiles.batch_chunk", "[1, 1048576]"),
    ("im2win", {"batch_chunk": 3}, "tiles.batch_chunk", "must divide n (2)"),
    ("im2col_gemm", {"batch_chunk": 3}, "tiles.batch_chunk", "must divide n (2)"),
    ("implicit_gemm", {"split_k": 16}, "tiles.split_k", "at most the 4 k-slices of 8 that K = 27 makes"),
    ("implicit_gemm", {"split_k": 0}, "tiles.split_k", "[1, 16]"),
    ("implicit_gemm", {"stages": 5}, "tiles.stages", "at most 4 for the cp.async kernel"),
    ("implicit_gemm", {"stages": 7}, "tiles.stages", "one of 1, 2, 3, 4, 5, 6"),
]


@pytest.mark.parametrize("family, tiles, field, allowed", BAD_TILES, ids=[b[2] + ":" + b[3][:12] for b in BAD_TILES])
def test_bad_tiles(family, tiles, field, allowed):
    with pytest.raises(SpecError) as info:
        plan(family, make(), tiles)
    assert info.value.field == field and allowed in str(info.value)


def test_tiles_over_the_shared_memory_limit_are_refused_before_compiling():
    spec = make(c=64, dpitch=64)
    with pytest.raises(SpecError, match="shared memory; at most 49152"):
        plan("im2col", spec, {"threads": 1024, "pixels": 64})


def test_direct_refusals_before_compiling():
    big = make(c=64, k=64, filter_size=(3, 3))  # 64*64*9*4 = 147456 bytes of filter
    with pytest.raises(SpecError, match="147456 bytes.*constant bank holds 65536"):
        plan("direct", big, {"variant": "constant"})
    with pytest.raises(SpecError, match="tiles.tile_h/tile_w.*threads per block"):
        plan("direct", make(filter_size=(5, 5)), {"variant": "tiled_halo", "tile_h": 40, "tile_w": 40})
    with pytest.raises(SpecError, match="tiles.variant='winograd'"):
        plan("direct", make(), {"variant": "winograd"})


def test_register_tile_refusals_name_the_field():
    register = {"variant": "tiled_register"}
    big = make(c=64, k=64, filter_size=(3, 3))
    with pytest.raises(SpecError, match="tiles.filter_memory='constant'.*147456 bytes.*constant bank"):
        plan("direct", big, {**register, "filter_memory": "constant"})
    with pytest.raises(SpecError, match="tiles.filter_memory='constant'.*tiled_register only"):
        plan("direct", make(), {"variant": "basic", "filter_memory": "constant"})
    with pytest.raises(SpecError, match="tiles.min_blocks=4.*tiled_register only"):
        plan("direct", make(), {"variant": "tiled_halo", "min_blocks": 4})
    with pytest.raises(SpecError, match="tiles.min_blocks=17.*\\[0, 16\\]"):
        plan("direct", make(), {**register, "min_blocks": 17})
    with pytest.raises(SpecError, match="tiles.tile_h=6.*multiple of tiles.rows_per_thread \\(4\\)"):
        plan("direct", make(), {**register, "tile_h": 6, "rows_per_thread": 4})
    with pytest.raises(SpecError, match="tiles.tile_w=6.*multiple of tiles.per_thread \\(4\\)"):
        plan("direct", make(), {**register, "tile_w": 6, "per_thread": 4})
    with pytest.raises(SpecError, match="tiles.stages=4.*\\[1, 3\\]"):
        plan("direct", make(), {**register, "stages": 4})
    wide = make(input_size=(512, 512), filter_size=(17, 17), padding=8)   # 3 stages of 80 x 272 floats
    with pytest.raises(SpecError, match="tiles.tile_h/tile_w/stages.*261120 bytes of shared memory; at most 232448"):
        plan("direct", wide, {**register, "tile_h": 64, "rows_per_thread": 2, "tile_w": 256, "per_thread": 8,
                              "stages": 3})


def test_tma_tile_refusals_name_the_field_and_what_is_allowed():
    """tiled_tma reads W-contiguous rows in TMA boxes: each shape it cannot take is refused before
    compiling, naming the field and pointing at tiled_register; an arch without TMA is refused by build."""
    from codegen.api import build
    from codegen.emit import emit_source

    tma = {"variant": "tiled_tma"}
    first = make(layout="NCHW")
    with pytest.raises(SpecError, match="tiles.variant='tiled_tma'.*channels-first layout.*not NHWC"):
        plan("direct", make(), tma)
    with pytest.raises(SpecError, match="tiles.variant='tiled_tma'.*stride 1 along H and W.*\\(1, 2\\)"):
        plan("direct", make(layout="NCHW", stride=(1, 2)), tma)
    with pytest.raises(SpecError, match="tiles.variant='tiled_tma'.*W a multiple of 4.*W = 30"):
        plan("direct", make(layout="NCHW", input_size=(32, 30)), tma)
    with pytest.raises(SpecError, match="tiles.tile_w/per_thread=\\(64, 4\\).*tile_w 128, per_thread 4"):
        plan("direct", first, {**tma, "tile_w": 64})
    with pytest.raises(SpecError, match="tiles.tile_h=34.*at most 16 \\(here 17\\)"):
        plan("direct", first, {**tma, "tile_h": 34, "rows_per_thread": 2})
    with pytest.raises(SpecError, match="filter_size=\\(3, 131\\).*260 columns.*at most 256"):
        plan("direct", make(layout="NCHW", input_size=(8, 256), filter_size=(3, 131), padding=0), tma)
    with pytest.raises(SpecError, match="tiles.resident_blocks=2.*tiled_tma only"):
        plan("direct", first, {"variant": "tiled_register", "resident_blocks": 2})
    with pytest.raises(SpecError, match="arch='sm_80'.*sm_90 instructions"):
        build("direct", first, tma, arch="sm_80")
    with pytest.raises(SpecError, match="arch='sm_86'.*sm_90 instructions"):
        emit_source("direct", first, tma, arch="sm_86")


def test_tma_plan_passes_the_image_as_a_tensor_map():
    """One persistent block per SM, 8 consumer warps plus a producer warp, and the map of the
    N x C x H x W image (innermost first) read in boxes of the 9x9 filter's 40 x 136 halo."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(8192, 8192), filter_size=9, padding=4)
    kernel_plan = plan("direct", spec, {"variant": "tiled_tma"})
    (launch,) = kernel_plan.launches
    (tensor_map,) = launch.tensor_maps
    assert (launch.grid, launch.block, launch.args) == ((132, 1, 1), (288, 1, 1), ("y",))
    assert (tensor_map.buffer, tensor_map.dims, tensor_map.box) == ("x", (8192, 8192, 1, 1), (136, 40, 1, 1))
    assert tensor_map.strides == (8192 * 4, 8192 * 8192 * 4, 8192 * 8192 * 4)
    assert kernel_plan.min_arch == 90 and kernel_plan.context.tiles_total == 64 * 256
    assert launch.shared_bytes == 128 + 4 * 40 * 136 * 4      # barriers, then 4 buffers of one box


def test_tma_implicit_gemm_refusals_name_the_field_and_what_is_allowed():
    """The TMA implicit GEMM takes what TMA's im2col mode (channels-last) and its fixed warp tiles
    take; every other choice is refused before compiling, naming the field, and im2win (same tiles)
    refuses tma.  Channels-first images are gathered, so their strides and padding are free."""
    from codegen.api import build

    tma = {"tma": True}
    last = make(c=8, k=40)
    gathered = plan("implicit_gemm", make(layout="NCHW", input_size=(32, 40), stride=(1, 9), padding=(129, 0)), tma)
    assert gathered.context.gather and [m.buffer for m in gathered.launches[-1].tensor_maps] == ["wt"]
    with pytest.raises(SpecError, match="dpitch=3.*multiple of 4 with tma=True"):
        plan("implicit_gemm", make(), tma)
    with pytest.raises(SpecError, match="stride\\[1\\]=9.*at most 8"):
        plan("implicit_gemm", make(c=8, input_size=(32, 40), stride=(1, 9)), tma)
    with pytest.raises(SpecError, match="padding\\[0\\]=129.*corners \\(-129, 127\\).*\\[-128, 127\\]"):
        plan("implicit_gemm", make(c=8, padding=(129, 0), filter_size=(3, 3)), tma)
    deep = ConvSpec(dims=3, layout="NDHWC", n=1, c=8, k=8, input_size=(4, 40, 40), filter_size=(1, 9, 1),
                    dilation=(1, 3, 1), padding=(0, 4, 0))
    with pytest.raises(SpecError, match="padding\\[1\\]=4.*corners \\(-4, -20\\).*\\[-16, 15\\]"):
        plan("implicit_gemm", deep, tma)
    with pytest.raises(SpecError, match="tiles.block_k=16.*must be 32 with tma=True"):
        plan("implicit_gemm", last, {**tma, "block_k": 16})
    with pytest.raises(SpecError, match="tiles.split_k=2.*must be 1 with tma=True"):
        plan("implicit_gemm", last, {**tma, "split_k": 2})
    with pytest.raises(SpecError, match="tiles.block_n=96.*multiple of 64 with tma=True"):
        plan("implicit_gemm", last, {**tma, "block_n": 96})
    with pytest.raises(SpecError, match="tiles.stages=1.*at least 2"):
        plan("implicit_gemm", last, {**tma, "stages": 1})
    with pytest.raises(SpecError, match="tiles.stages=6.*246880 bytes.*at most 232448"):
        plan("implicit_gemm", last, {**tma, "block_m": 64, "block_n": 256, "stages": 6})
    with pytest.raises(SpecError, match="tiles.block_m/block_n=\\(256, 128\\).*16 consumer warps.*544 threads"):
        plan("implicit_gemm", last, {**tma, "block_m": 256, "block_n": 128, "stages": 2})
    with pytest.raises(SpecError, match="tiles.block_m/block_n=\\(256, 256\\).*1056 threads"):
        plan("implicit_gemm", last, {**tma, "block_m": 256, "block_n": 256})
    with pytest.raises(SpecError, match="tiles.tma=True.*implicit_gemm only"):
        plan("im2win", last, {"tma": True})
    with pytest.raises(SpecError, match="arch='sm_80'.*implicit_gemm variant tma uses sm_90 instructions"):
        build("implicit_gemm", last, tma, arch="sm_80")


def test_tma_implicit_gemm_plan_transposes_the_filter_then_passes_two_tensor_maps():
    """conv8 in NHWC: the filter transposed into a 9 x 64 x 128 workspace, then one persistent
    block per SM of 8 consumer warps (16x8 micro-tiles, 256x128 tiles) and a producer warpgroup
    that hands its registers to them (sm_90a), given the image as an im2col map (channels
    innermost, 128-byte swizzle, corners -p and p - d*(f-1), traversal strides from the stride)
    and the workspace as a tiled map read in 128 x 32 boxes."""
    spec = ConvSpec(dims=2, layout="NHWC", n=128, c=64, k=128, input_size=(112, 112), filter_size=3)
    kernel_plan = plan("implicit_gemm", spec, {"tma": True})
    transpose, main = kernel_plan.launches
    x_map, w_map = main.tensor_maps
    assert transpose.args == ("w", "wt") and transpose.grid == (-(-9 * 64 * 128 // 256), 1, 1)
    assert (main.grid, main.block, main.args) == ((132, 1, 1), (384, 1, 1), ("y",))
    assert kernel_plan.workspace_bytes == 9 * 64 * 128 * 4 and kernel_plan.min_arch == 90
    assert kernel_plan.compile_arch("sm_90") == "sm_90a"
    assert (x_map.dims, x_map.strides, x_map.box) == ((64, 112, 112, 128), (256, 256 * 112, 256 * 112 * 112), (32, 256))
    assert (x_map.corners, x_map.element_strides, x_map.swizzle) == (((0, 0), (-2, -2)), (1, 1, 1, 1), 128)
    assert (w_map.buffer, w_map.dims, w_map.strides, w_map.box) == ("wt", (128, 64, 9), (512, 512 * 64), (128, 32, 1))
    strided = ConvSpec(dims=3, layout="NDHWC", n=2, c=36, k=40, input_size=(5, 7, 9), filter_size=(2, 3, 3),
                       stride=(1, 2, 1), padding=(0, 1, 1), dilation=(2, 1, 1), dpitch=40)
    x_map, w_map = plan("implicit_gemm", strided, {"tma": True}).launches[-1].tensor_maps
    assert x_map.dims == (36, 9, 7, 5, 2) and x_map.strides == (160, 160 * 9, 160 * 63, 160 * 315)
    assert x_map.corners == ((-1, -1, 0), (-1, -1, -2)) and x_map.element_strides == (1, 1, 2, 1, 1)
    assert w_map.dims == (40, 36, 18) and w_map.strides == (160, 160 * 36)


def test_vectorised_im2col_needs_a_pitch_multiple_of_four():
    with pytest.raises(SpecError, match="multiple of 4.*pitch 3"):
        plan("im2col", make(), {"vectorized": True})


def test_unknown_family_and_bad_arch():
    from codegen.compile import resolve_arch

    with pytest.raises(SpecError, match="family='conv'.*im2col, col2im"):
        plan("conv", make())
    with pytest.raises(SpecError, match="arch='90'"):
        resolve_arch("90")


def test_cli_prints_one_line_and_exits_2_without_traceback():
    result = subprocess.run([sys.executable, "-m", "codegen", "generate", "im2col", "--c", "3", "--dpitch", "2"],
                            capture_output=True, text=True)
    assert result.returncode == 2
    assert result.stderr.strip() == "convgen: error: dpitch=2 is invalid: must be >= c (3)"
    assert "Traceback" not in result.stderr


def test_a_family_plan_refuses_a_precision_its_kernel_does_not_run():
    """A family's plan() called directly (not through api.plan) cannot hand back an FP32 kernel for a
    bfloat16 or tf32 spec: the plan itself checks its kernel against the spec's precision (direct's
    FMA kernels take bfloat16 data, not tf32 math)."""
    from codegen.families import direct, implicit_gemm

    for changes, field, families in (({"dtype": "bfloat16"}, "dtype", (implicit_gemm.FAMILY,)),
                                     ({"math": "tf32"}, "math", (implicit_gemm.FAMILY, direct.FAMILY))):
        spec = ConvSpec(dims=2, layout="NHWC", n=1, c=8, k=8, input_size=8, filter_size=3, **changes)
        for family in families:
            fp32 = ConvSpec.from_dict({**spec.to_dict(), "dtype": "float32", "math": "fma"})
            with pytest.raises(SpecError) as info:
                family.plan(spec, family.default_tiles(fp32))
            assert info.value.field == field


def test_a_chooser_must_return_the_routed_kernels_tiles():
    from codegen.api import plan
    from codegen.families import implicit_gemm

    bf16 = ConvSpec(dims=2, layout="NHWC", n=1, c=8, k=8, input_size=8, filter_size=3, dtype="bf16")
    fp32_tiles = implicit_gemm.FAMILY.default_tiles(ConvSpec.from_dict({**bf16.to_dict(), "dtype": "float32"}))
    with pytest.raises(SpecError, match="MmaTiles") as info:
        plan("implicit_gemm", bf16, chooser=lambda family, spec, device, limit: fp32_tiles)
    assert info.value.field == "chooser"
    with pytest.raises(TypeError, match="ConvSpec"):
        plan("implicit_gemm", bf16.to_dict())
