"""``workspace_limit``: the heuristic held under a cap on device memory beyond inputs and output,
tiles that need more refused, and a family that cannot get under it saying what it needs.  Sizes
are cross-checked against the numpy references' shapes, not the index algebra that plans them."""
import math

import numpy as np
import pytest

from codegen.api import plan
from codegen.bench.layers import layer_spec, load_shapes, select_layers
from codegen.cli import main, parse_size
from codegen.families.im2win import window_tensor_reference
from codegen.spec import ConvSpec, SpecError, replace

MIB = 1 << 20


def layer(name: str, layout: str) -> ConvSpec:
    found = select_layers(load_shapes()["conv2d_mec"] + load_shapes()["conv3d"], [name])[0]
    return layer_spec(found, layout, found["N"])


def window_bytes_of_one_image(spec: ConvSpec) -> int:
    one = replace(spec, n=1)
    image = np.zeros((1, spec.c, *spec.input_size) if not spec.layout.channels_last else
                     (1, *spec.input_size, spec.c), dtype=np.float32)
    return window_tensor_reference(one, image).size * 4


@pytest.mark.parametrize("name, layout", [("c3d_conv2", "NDHWC"), ("conv9", "NHWC"), ("conv4", "NCHW")])
def test_im2win_takes_the_largest_batch_chunk_under_the_limit(name, layout):
    spec = layer(name, layout)
    per_image = window_bytes_of_one_image(spec)
    free = plan("im2win", spec)
    limit = free.workspace_bytes - 1
    held = plan("im2win", spec, workspace_limit=limit)
    expected = max(d for d in range(1, spec.n + 1) if spec.n % d == 0 and d * per_image <= limit)
    assert held.tiles.batch_chunk == expected < free.tiles.batch_chunk
    assert held.workspace_bytes == expected * per_image <= limit
    assert plan("im2win", spec, workspace_limit=free.workspace_bytes).tiles == free.tiles


def test_a_limit_below_one_image_says_what_the_family_needs_at_least():
    spec = layer("c3d_conv2", "NDHWC")
    per_image = window_bytes_of_one_image(spec)
    with pytest.raises(SpecError) as err:
        plan("im2win", spec, workspace_limit=per_image - 1)
    assert err.value.field == "workspace_limit"
    assert "needs at least 114 MiB" in str(err.value) and "implicit_gemm needs none" in str(err.value)
    column_per_image = spec.c * math.prod(spec.filter_size) * math.prod(spec.input_size) * 4  # same-padded, stride 1
    assert plan("im2col_gemm", spec, workspace_limit=column_per_image).workspace_bytes == column_per_image
    with pytest.raises(SpecError, match="im2col_gemm needs at least 331 MiB"):
        plan("im2col_gemm", spec, workspace_limit=column_per_image - 1)


def test_tiles_passed_in_that_need_more_are_refused_with_the_choice_that_fits():
    spec = layer("c3d_conv2", "NDHWC")
    with pytest.raises(SpecError) as err:
        plan("im2win", spec, {"batch_chunk": 4}, workspace_limit=300 * MIB)
    assert "needs 457 MiB of workspace (win), over the limit of 300 MiB" in str(err.value)
    assert "batch_chunk=2" in str(err.value)
    assert plan("im2win", spec, {"batch_chunk": 2}, workspace_limit=300 * MIB).tiles.batch_chunk == 2


def test_implicit_gemm_leaves_the_tma_kernels_transposed_filter_out_under_a_limit():
    spec = layer("conv8", "NHWC")
    tma = plan("implicit_gemm", spec, arch="sm_90")
    assert tma.tiles.tma and tma.workspace_bytes == spec.k * spec.c * math.prod(spec.filter_size) * 4
    held = plan("implicit_gemm", spec, arch="sm_90", workspace_limit=0)
    assert not held.tiles.tma and held.workspace_bytes == 0
    with pytest.raises(SpecError, match="tma=False"):
        plan("implicit_gemm", spec, {"tma": True}, arch="sm_90", workspace_limit=tma.workspace_bytes - 1)


@pytest.mark.parametrize("dtype, math_mode", [("bfloat16", "fma"), ("float32", "tf32")])
def test_wgmma_split_k_holds_its_partial_tiles_to_the_limit(dtype, math_mode):
    """A batch-1 layer of 4 tiles splits K 16 ways: 16 ranges of TF32's 144 k-slices, 15 of BF16's
    72 (ranges of 5), each a 49 x 512 float32 partial tile; under a limit the WGMMA kernel keeps as
    many ranges as fit (one less: 15 of 10 slices in TF32, 12 of 6 in BF16), none at 0, and the
    tuner offers no split over it."""
    from codegen.families import wgmma_gemm
    from codegen.families.mma_gemm import FAMILY

    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=512, k=512, input_size=(7, 7), filter_size=3, padding=1,
                    dtype=dtype, math=math_mode)
    outputs = 49 * 512
    free = plan("implicit_gemm", spec, target="h100")
    ranges, fewer = (16, 15) if dtype == "float32" else (15, 12)
    assert free.variant == "wgmma" and free.tiles.split_k == 16 and free.context.splits == ranges
    assert free.workspace_bytes == ranges * 4 * outputs
    for limit, splits in ((0, 1), (4 * 4 * outputs, 4), (free.workspace_bytes - 1, fewer)):
        held = plan("implicit_gemm", spec, target="h100", workspace_limit=limit)
        assert held.variant == "wgmma" and held.context.splits == splits and held.workspace_bytes <= limit
    with pytest.raises(SpecError) as err:
        plan("implicit_gemm", spec, {"wgmma": True, "split_k": 8}, target="h100", workspace_limit=0)
    assert "(partials)" in str(err.value) and "split_k=1" in str(err.value)
    space = [f for f in FAMILY.tuning_space(spec, workspace_limit=0) if f.get("wgmma")]
    assert space and all(wgmma_gemm.workspace_bytes(spec, f) == 0 for f in space)


@pytest.mark.parametrize("limit", [-1, 1.5, True, "64MiB"])
def test_a_limit_that_is_not_a_byte_count_is_refused(limit):
    with pytest.raises(SpecError, match="workspace_limit.*whole number of bytes"):
        plan("implicit_gemm", ConvSpec(dims=2, layout="NHWC", n=1, c=4, k=4, input_size=8, filter_size=3),
             workspace_limit=limit)


@pytest.mark.parametrize("text, size", [("4096", 4096), ("64MiB", 64 * MIB), ("1.5GiB", 3 << 29), ("2 KiB", 2048),
                                        ("0", 0), ("512b", 512)])
def test_cli_sizes_take_binary_units(text, size):
    assert parse_size(text) == size


@pytest.mark.parametrize("text, message", [("64MB", "KiB, MiB or GiB"), ("2k", "KiB, MiB or GiB"),
                                           ("lots", "e.g. 4096"), ("-1MiB", "e.g. 4096"), ("inf", "e.g. 4096"),
                                           ("nan", "e.g. 4096"), ("3TiB", "e.g. 4096"), ("0.5", "whole number")])
def test_cli_sizes_refuse_what_they_cannot_read(text, message):
    with pytest.raises(SpecError, match=message):
        parse_size(text)


def test_cli_workspace_limit_reaches_the_plan_and_the_report(cache_dir, capsys):
    flags = ["--dims", "3", "--layout", "NDHWC", "--n", "4", "--c", "8", "--k", "8", "--input", "4", "8", "8",
             "--padding", "1"]
    assert main(["compile", "im2win", *flags, "--workspace-limit", "200KiB"]) == 0
    report = capsys.readouterr().out
    assert "batch_chunk=2" in report and "memory   workspace 180 KiB (win 180 KiB)" in report
    assert main(["generate", "im2win", *flags, "--workspace-limit", "50KiB"]) == 2
    assert "needs at least 90 KiB of workspace here (the limit is 50 KiB)" in capsys.readouterr().err
    assert main(["emit", "im2win", *flags, "--tile", "batch_chunk=4", "--workspace-limit", "200KiB",
                 "-o", "/nonexistent/never-written.cu"]) == 2
    assert "needs 360 KiB of workspace (win), over the limit of 200 KiB" in capsys.readouterr().err


def test_a_tuned_record_over_the_limit_gives_way_to_the_heuristic_under_it(monkeypatch):
    """A tuning-database record is the package's own choice, so a limit holds it like the heuristic."""
    from codegen import device, tuning_db

    spec = layer("c3d_conv2", "NDHWC")
    recorded = {**plan("im2win", spec).tiles.to_dict(), "batch_chunk": 4, "stages": 2}
    monkeypatch.setattr(device, "present", lambda: device.REFERENCE)        # records are this machine's GPU's
    monkeypatch.setattr(tuning_db, "current_device", lambda: (device.REFERENCE.name, device.REFERENCE.arch))
    monkeypatch.setattr(tuning_db, "tuned_tiles", lambda family, spec, workspace_limit=None:
                        recorded if workspace_limit is None else None)   # tuned without a limit only
    assert plan("im2win", spec).tiles.stages == 2
    held = plan("im2win", spec, workspace_limit=300 * MIB)
    assert held.tiles.batch_chunk == 2 and held.workspace_bytes <= 300 * MIB
