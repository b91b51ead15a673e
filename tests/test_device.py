"""The device description (issue 37): every heuristic reads the card it chooses for, named or read
from the driver, instead of assuming the H100; its choices on described A100, L40S, T4 and RTX 4090
targets are valid for those cards and follow their SM counts."""
import dataclasses
import json
from pathlib import Path

import pytest

from codegen import ConvSpec, SpecError, build, plan
from codegen import device as devices
from codegen.api import check_arch
from codegen.emit import emit_source
from codegen.device import REFERENCE, TARGETS, Device, as_device, named, resolve
from codegen.families import gemm_heuristic, gemm_tiles

SHAPES = json.loads((Path(__file__).resolve().parent.parent / "codegen" / "shapes.json").read_text())


def benchmark_specs():
    """The benchmark layers of shapes.json in both layouts of their dimensionality."""
    for group, layers in SHAPES.items():
        if not isinstance(layers, list):
            continue
        for layer in layers:
            if "K" not in layer:
                continue
            dims = 3 if "D" in layer else 2
            sizes = tuple(layer[a] for a in ("D", "H", "W")[3 - dims:])
            filters = tuple(layer[a] for a in ("T", "R", "S")[3 - dims:])
            for layout in (("NCHW", "NHWC") if dims == 2 else ("NCDHW", "NDHWC")):
                yield f"{layer['name']}_{layout}", ConvSpec(
                    dims=dims, layout=layout, n=layer.get("N", 1), c=layer["C"], k=layer["K"], input_size=sizes,
                    filter_size=filters, stride=layer.get("stride", 1), padding=layer.get("padding", 0),
                    dilation=layer.get("dilation", 1))


SPECS = dict(benchmark_specs())


@pytest.fixture(autouse=True)
def no_gpu_here(monkeypatch):
    """These tests describe cards this machine does not have, whatever machine runs them."""
    monkeypatch.setattr(devices, "present", lambda: None)


def test_the_benchmark_layers_are_found():
    assert len(SPECS) >= 24 and "conv4_NCHW" in SPECS and "c3d_conv2_NDHWC" in SPECS


@pytest.mark.parametrize("target", ["a100", "l40s", "t4", "rtx4090", "h100-pcie", "b200"])
@pytest.mark.parametrize("family", ["implicit_gemm", "im2win", "direct", "im2col", "col2im"])
def test_the_heuristic_plans_every_benchmark_layer_for_each_described_card(target, family):
    """Unchanged code, another card: every choice plans and passes that card's checks (its arch, its
    shared memory per block), persistent grids are sized by its SMs, and nothing needs sm_90
    instructions below sm_90."""
    card = TARGETS[target]
    for name, spec in SPECS.items():
        kernel_plan = plan(family, spec, target=target)
        check_arch(kernel_plan, card.arch)
        assert kernel_plan.min_arch <= card.capability, name
        assert all(launch.shared_bytes <= card.shared_per_block for launch in kernel_plan.launches), name
        if kernel_plan.variant == "tma":
            persistent = kernel_plan.launches[-1].grid[0]
            assert persistent <= card.sm_count * kernel_plan.context.resident_blocks, name


@pytest.mark.parametrize("target", ["a100", "l40s", "t4"])
def test_a_sample_of_those_choices_compiles_for_the_card(target, cache_dir):
    card = TARGETS[target]
    for name in ("conv4_NCHW", "conv8_NHWC", "c3d_conv2_NDHWC"):
        for family in ("implicit_gemm", "im2win"):
            kernel = build(family, SPECS[name], target=target)
            assert kernel.compiled.arch == card.arch and not kernel.compiled.warnings


def test_split_k_follows_the_cards_sm_count():
    """An output of 900 128 x 64 tiles: under 8 CTAs a SM on the H100's 132 SMs (1056), so split
    there; over it on the A100's 108 (864), so not."""
    spec = ConvSpec(dims=2, layout="NCHW", n=18, c=64, k=64, input_size=(80, 80), filter_size=3, padding=1)
    h100, a100 = (gemm_heuristic.core_tiles(spec, device=TARGETS[t]) for t in ("h100", "a100"))
    assert (h100.block_m, h100.block_n) == (a100.block_m, a100.block_n) == (128, 64)
    assert gemm_tiles.tile_count(18 * 80 * 80, 64, 128, 64) == 900
    assert h100.split_k > 1 and a100.split_k == 1


def test_the_tma_kernel_is_chosen_only_where_the_card_has_it_and_sized_by_its_sms():
    spec = ConvSpec(dims=2, layout="NHWC", n=32, c=64, k=128, input_size=(56, 56), filter_size=3, padding=1)
    assert plan("implicit_gemm", spec, target="h100").variant == "tma"
    assert plan("implicit_gemm", spec, target="a100").variant != "tma"
    small = plan("implicit_gemm", spec, {"tma": True}, target="h100,sm_count=66")
    full = plan("implicit_gemm", spec, {"tma": True}, target="h100")
    blocks = full.context.resident_blocks
    assert small.launches[-1].grid[0] == 66 * blocks and full.launches[-1].grid[0] == 132 * blocks


def test_the_direct_tma_kernels_persistent_grid_is_the_cards():
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(2048, 2048), filter_size=3, padding=1)
    for target, sms in (("h100", 132), ("b200", 148), ("h100-pcie", 114)):
        (launch,) = plan("direct", spec, {"variant": "tiled_tma"}, target=target).launches
        assert launch.grid[0] == sms


def test_a_card_with_less_shared_memory_gets_tiles_that_fit_it():
    """The TMA kernel's stages are as many as the card's shared memory per block holds."""
    spec = ConvSpec(dims=2, layout="NHWC", n=32, c=64, k=128, input_size=(56, 56), filter_size=3, padding=1)
    roomy = gemm_heuristic.tma_tiles(spec, device="h100")
    tight = gemm_heuristic.tma_tiles(spec, device=dataclasses.replace(REFERENCE, shared_per_block=100 << 10))
    assert tight.stages < roomy.stages and gemm_tiles.tma_shared_bytes(tight) <= 100 << 10


def test_targets_resolve_from_names_arches_and_overrides():
    assert resolve(None, None) == REFERENCE
    assert resolve(None, "sm_80") == TARGETS["a100"] and resolve(None, "sm_89").name == "l40s"
    assert resolve(None, "sm_90a") == dataclasses.replace(REFERENCE, arch="sm_90a")
    assert resolve("a100", None) == TARGETS["a100"] and resolve("A100", "sm_80") == TARGETS["a100"]
    pcie = named("h100,sm_count=114,l2_bytes=52428800")
    assert (pcie.sm_count, pcie.l2_bytes, pcie.arch) == (114, 50 << 20, "sm_90")
    assert as_device("sm_75") == TARGETS["t4"] and as_device(None) == REFERENCE and as_device(pcie) is pcie
    custom = Device("my card", "sm_86", 30, 100 << 10, 99 << 10)
    assert resolve(custom, None) is custom


@pytest.mark.parametrize("target, arch, field", [
    ("a100", "sm_90", "arch"), ("v100", None, "target"), ("h100,sms=3", None, "target"),
    ("h100,sm_count=0", None, "target"), ("h100,sm_count=x", None, "target"), ("", None, "target"),
])
def test_a_bad_target_is_refused_by_field(target, arch, field):
    with pytest.raises(SpecError) as err:
        plan("im2col", ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=8, filter_size=3),
             target=target, arch=arch)
    assert err.value.field == field


def test_emit_builds_its_file_for_the_target():
    spec = ConvSpec(dims=2, layout="NHWC", n=8, c=64, k=128, input_size=(28, 28), filter_size=3, padding=1)
    for target, flag in (("a100", "-arch=sm_80"), ("l40s", "-arch=sm_89"), ("t4", "-arch=sm_75")):
        assert f"nvcc {flag} -DCONVGEN_SELFTEST" in emit_source("implicit_gemm", spec, target=target)
    assert "nvcc -arch=sm_90 -DCONVGEN_SELFTEST" in emit_source("im2col", spec)
