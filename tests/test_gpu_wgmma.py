"""GPU tier of implicit_gemm's WGMMA kernel (codegen.families.wgmma_gemm, sm_90 only): channels-last
float16 and bfloat16 with 16-byte channel runs, on random normal inputs rounded to the storage type
(bfloat16 as uint16 bits), outputs NaN-poisoned before each launch (and the channel pitch's padding
NaN, so a read of it shows), each output within ``codegen.precision.error_bound`` of the float64
convolution of the stored inputs.  PyTorch at the same precision is the second oracle."""
import subprocess

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codegen import precision
from codegen.api import build, compile_plan
from codegen.compile import device_arch
from codegen.device import present
from codegen.emit import build_flags, emit
from codegen.families import wgmma_gemm
from codegen.families.mma_gemm import FAMILY, MmaTiles, check_tiles
from codegen.fuzz import specs
from codegen.index import IndexAlgebra
from codegen.spec import ConvSpec, DType, Layout, SpecError, replace

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(device_arch() not in (None, "sm_90"), reason="wgmma runs on sm_90 GPUs only")]
GPU = settings.get_profile("gpu")
NAN_BITS = {DType.float16: np.float16(np.nan), DType.bfloat16: np.uint16(0x7FC0)}
MAX_ELEMENTS = 1 << 16


def _inputs(spec: ConvSpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal x and w rounded to the storage type; the channel pitch's padding is NaN."""
    rng = np.random.default_rng(seed)
    alg = IndexAlgebra(spec)
    x = precision.to_storage(rng.standard_normal(alg.image_shape), spec.dtype)
    x[..., spec.c:] = NAN_BITS[spec.dtype]
    return x, precision.to_storage(rng.standard_normal(alg.filter_shape), spec.dtype)


def _run(spec: ConvSpec, x: np.ndarray, w: np.ndarray, tiles: MmaTiles) -> np.ndarray:
    """The WGMMA kernel's output on x and w (poisoned with NaN before the launch), as float64."""
    import cupy

    assert tiles.wgmma
    kernel = compile_plan(FAMILY.plan(spec, tiles, present()), device_arch())
    out = cupy.full(kernel.plan.output.shape, NAN_BITS[spec.dtype], dtype=NAN_BITS[spec.dtype].dtype)
    kernel(cupy.asarray(x), cupy.asarray(w), out=out)
    return precision.from_storage(cupy.asnumpy(out), spec.dtype)


def _assert_within_bound(spec: ConvSpec, result: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    expected = FAMILY.reference(spec, x, w)
    bound = precision.error_bound(spec, x, w)
    excess = np.abs(result - expected) - bound
    unwritten = int(np.isnan(result).sum())
    assert not unwritten, f"{spec.describe()}: {unwritten} output(s) never written (NaN)"
    if (excess > 0).any():
        at = np.unravel_index(int(np.argmax(excess)), excess.shape)
        pytest.fail(f"{spec.describe()}: {int((excess > 0).sum())} output(s) outside the error bound, worst at "
                    f"{tuple(map(int, at))}: got {result[at]!r}, expected {expected[at]!r}, bound {bound[at]!r}")


@st.composite
def covered_specs(draw) -> ConvSpec:
    """Channels-last 2D and 3D specs of every geometry with C and the pitch multiples of 8 and up to
    300 output channels (tails along every GEMM axis, several channel tiles of 256)."""
    base = draw(specs(layouts=(Layout.NHWC, Layout.NDHWC), max_k=300, max_elements=MAX_ELEMENTS, max_filter=5))
    c = 8 * draw(st.integers(1, 6))
    spec = replace(base, c=c, dpitch=c + 8 * draw(st.integers(0, 1)),
                   dtype=draw(st.sampled_from(("float16", "bfloat16"))))
    assume(IndexAlgebra(spec).image_elements <= MAX_ELEMENTS)
    return spec


@st.composite
def wgmma_tiles(draw, spec: ConvSpec) -> MmaTiles:
    """Valid WGMMA tiles of every shape: one or two consumer warpgroups of 64 or 128 rows, each
    block_n, 2-4 stages."""
    warp_m = draw(st.sampled_from((64, 128)))
    block_n = draw(st.sampled_from(wgmma_gemm.BLOCK_N_CHOICES))
    try:
        tiles = MmaTiles(block_m=warp_m * draw(st.sampled_from((1, 2))), block_n=block_n,
                         block_k=wgmma_gemm.slice_k(spec), warp_m=warp_m, warp_n=block_n,
                         stages=draw(st.sampled_from((2, 3, 4))), wgmma=True)
        check_tiles(spec, tiles, present())
    except SpecError:
        assume(False)
    return tiles


@GPU
@given(spec=covered_specs(), seed=st.integers(0, 2**16))
def test_heuristic_tiles_within_the_error_bound(spec, seed):
    tiles = FAMILY.heuristic_tiles(spec, present())
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w, tiles), x, w)


@GPU
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_any_tiles_within_the_error_bound(data, seed):
    spec = data.draw(covered_specs())
    tiles = data.draw(wgmma_tiles(spec))
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w, tiles), x, w)


ODD_CASES = {  # (spec, tiles as (block_m, block_n, warp_m, stages) or None for the heuristic)
    "m-n-k-tails-stride-dilation": (ConvSpec(dims=2, layout="NHWC", n=3, c=40, k=75, input_size=(17, 23),
                                             filter_size=3, stride=2, padding=1, dilation=(1, 2), dpitch=48,
                                             dtype="bfloat16"), (128, 64, 64, 3)),
    "odd-k-single-stores": (ConvSpec(dims=2, layout="NHWC", n=2, c=16, k=37, input_size=(13, 11), filter_size=(3, 5),
                                     padding=(1, 2), dtype="float16"), None),
    "3d-padded-strided": (ConvSpec(dims=3, layout="NDHWC", n=2, c=16, k=40, input_size=(5, 9, 11), filter_size=3,
                                   stride=(1, 2, 1), padding=1, dtype="bfloat16"), (256, 64, 128, 4)),
    "3d-unpadded-m-tail": (ConvSpec(dims=3, layout="NDHWC", n=1, c=8, k=24, input_size=(3, 7, 9),
                                    filter_size=(1, 3, 2), dtype="float16"), (64, 32, 64, 2)),
    "many-tiles-per-block": (ConvSpec(dims=2, layout="NHWC", n=4, c=32, k=96, input_size=(64, 64), filter_size=3,
                                      dtype="bfloat16"), (64, 32, 64, 2)),
    "wide-256-two-channel-tiles": (ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=300, input_size=(20, 20),
                                            filter_size=3, padding=1, dtype="bfloat16"), (128, 256, 64, 4)),
    "one-by-one": (ConvSpec(dims=2, layout="NHWC", n=2, c=128, k=256, input_size=(13, 13), filter_size=1,
                            dtype="float16"), None),
}


@pytest.mark.parametrize("name", ODD_CASES)
def test_odd_shapes_within_the_error_bound(name):
    spec, shape = ODD_CASES[name]
    tiles = FAMILY.heuristic_tiles(spec, present()) if shape is None else MmaTiles(
        block_m=shape[0], block_n=shape[1], block_k=wgmma_gemm.slice_k(spec), warp_m=shape[2], warp_n=shape[1],
        stages=shape[3], wgmma=True)
    x, w = _inputs(spec, seed=11)
    _assert_within_bound(spec, _run(spec, x, w, tiles), x, w)


def test_build_runs_the_wgmma_kernel_on_the_h100():
    import cupy

    spec = ODD_CASES["3d-padded-strided"][0]
    kernel = build("implicit_gemm", spec)
    assert kernel.plan.variant == "wgmma"
    x, w = _inputs(spec, seed=3)
    y = precision.from_storage(cupy.asnumpy(kernel(cupy.asarray(x), cupy.asarray(w))), spec.dtype)
    _assert_within_bound(spec, y, x, w)


@settings(GPU, max_examples=min(GPU.max_examples, 20))
@given(spec=covered_specs(), seed=st.integers(0, 2**16))
def test_against_torch_at_the_same_precision(spec, seed):
    """Both results lie within the bound of the exact one, so they differ by at most twice it."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    x, w = _inputs(spec, seed)
    ours = _run(spec, x, w, FAMILY.heuristic_tiles(spec, present()))
    dtype = torch.float16 if spec.dtype is DType.float16 else torch.bfloat16
    inputs = [torch.from_numpy(precision.from_storage(a, spec.dtype)).to("cuda")[..., : spec.c].movedim(-1, 1)
              .to(dtype).contiguous() for a in (x, w)]
    conv = F.conv2d if spec.dims == 2 else F.conv3d
    theirs = conv(*inputs, stride=spec.stride, padding=spec.padding, dilation=spec.dilation).movedim(1, -1)
    excess = np.abs(ours - theirs.double().cpu().numpy()) - 2 * precision.error_bound(spec, x, w)
    assert not (excess > 0).any(), f"{spec.describe()}: {int((excess > 0).sum())} output(s) differ from PyTorch's"


@pytest.mark.parametrize("name", ["m-n-k-tails-stride-dilation", "3d-padded-strided"])
def test_emitted_selftest_passes_on_the_gpu(name, tmp_path):
    """The standalone file, built with plain nvcc for sm_90a, checks itself against its CPU reference."""
    path = emit("implicit_gemm", ODD_CASES[name][0], tmp_path / "kernel.cu", target="h100")
    built = subprocess.run(["nvcc", *build_flags(path.read_text()), "-DCONVGEN_SELFTEST", str(path), "-o",
                            str(tmp_path / "selftest")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(tmp_path / "selftest")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("PASS"), run.stdout + run.stderr
