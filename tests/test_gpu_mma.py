"""GPU tier of implicit_gemm's tensor-core kernel (codegen.families.mma_gemm): float16, bfloat16, and
float32 as TF32 and 3xTF32, every layout, on random normal inputs rounded to the storage type
(bfloat16 as uint16 bits), outputs NaN-poisoned before each launch (and the channel pitch's padding
NaN, so a read of it shows), each output within ``codegen.precision.error_bound`` of the float64
convolution of the stored inputs.  PyTorch at the same precision is the second oracle."""
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codegen import precision
from codegen.api import build, compile_plan
from codegen.compile import device_arch
from codegen.device import present
from codegen.families.mma_gemm import FAMILY, MmaTiles, check_tiles, mma_k
from codegen.fuzz import GEMM_RANGES, relative_error, specs
from codegen.index import IndexAlgebra
from codegen.spec import ConvSpec, DType, Layout, SpecError, replace

pytestmark = pytest.mark.gpu
GPU = settings.get_profile("gpu")
MODES = (("float16", "fma"), ("bfloat16", "fma"), ("float32", "tf32"), ("float32", "3xtf32"))
NAN_BITS = {DType.float32: np.float32(np.nan), DType.float16: np.float16(np.nan), DType.bfloat16: np.uint16(0x7FC0)}


def _inputs(spec: ConvSpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal x and w rounded to the storage type; a channel pitch's padding is NaN."""
    rng = np.random.default_rng(seed)
    alg = IndexAlgebra(spec)
    x = precision.to_storage(rng.standard_normal(alg.image_shape), spec.dtype)
    if spec.layout.channels_last:
        x[..., spec.c:] = NAN_BITS[spec.dtype]
    return x, precision.to_storage(rng.standard_normal(alg.filter_shape), spec.dtype)


def _run(spec: ConvSpec, x: np.ndarray, w: np.ndarray, tiles: MmaTiles | None = None) -> np.ndarray:
    """The kernel's output on x and w (poisoned with NaN before the launch), as float64."""
    import cupy

    kernel = compile_plan(FAMILY.plan(spec, tiles or FAMILY.default_tiles(spec, device=present())), device_arch())
    out = cupy.full(kernel.plan.output.shape, NAN_BITS[spec.dtype], dtype=NAN_BITS[spec.dtype].dtype)
    kernel(cupy.asarray(x), cupy.asarray(w), out=out)
    return precision.from_storage(cupy.asnumpy(out), spec.dtype)


def _assert_within_bound(spec: ConvSpec, result: np.ndarray, x: np.ndarray, w: np.ndarray, scale: float = 1.0,
                         what: str = "the exact result") -> None:
    """Every output within ``scale`` times ``error_bound`` of the float64 reference (NaN never is)."""
    expected = FAMILY.reference(spec, x, w)
    bound = scale * precision.error_bound(spec, x, w)
    excess = np.abs(result - expected) - bound
    unwritten = int(np.isnan(result).sum())
    assert not unwritten, f"{spec.describe()}: {unwritten} output(s) never written (NaN)"
    if (excess > 0).any():
        at = np.unravel_index(int(np.argmax(excess)), excess.shape)
        pytest.fail(f"{spec.describe()}: {int((excess > 0).sum())} output(s) outside {scale} x the error bound of "
                    f"{what}, worst at {tuple(map(int, at))}: got {result[at]!r}, expected {expected[at]!r}, "
                    f"bound {bound[at]!r}")


@st.composite
def mma_tiles(draw, spec: ConvSpec) -> MmaTiles:
    """Valid tiles of every shape for ``spec``'s MMA: 1-8 warps of 16-128 rows and 8-128 columns,
    slices of one to four MMA steps, 2-4 stages."""
    atom_n = 8 if spec.dtype is DType.float32 else 16
    warp_m, warp_n = draw(st.sampled_from((16, 32, 64))), draw(st.sampled_from(tuple(n for n in (8, 16, 32, 64)
                                                                                  if n >= atom_n)))
    try:
        tiles = MmaTiles(block_m=warp_m * draw(st.sampled_from((1, 2, 4))), block_n=warp_n * draw(st.sampled_from((1, 2))),
                         block_k=mma_k(spec) * draw(st.sampled_from((1, 2, 4))), warp_m=warp_m, warp_n=warp_n,
                         stages=draw(st.sampled_from((2, 3, 4))))
        check_tiles(spec, tiles, present())
    except SpecError:
        assume(False)
    return tiles


@st.composite
def vector_specs(draw, dtype: DType) -> ConvSpec:
    """Channels-last specs whose C and pitch are multiples of 16 bytes' elements (A's 16-byte copies)."""
    unit = 16 // dtype.itemsize
    base = draw(specs(layouts=(Layout.NHWC, Layout.NDHWC), max_k=GEMM_RANGES["max_k"],
                      max_elements=GEMM_RANGES["max_elements"], max_filter=3))
    c = unit * draw(st.integers(1, 4))
    spec = replace(base, c=c, dpitch=c + unit * draw(st.integers(0, 1)), dtype=dtype.value)
    assume(IndexAlgebra(spec).image_elements <= GEMM_RANGES["max_elements"])
    return spec


def _mode(spec: ConvSpec, mode: tuple[str, str]) -> ConvSpec:
    return replace(spec, dtype=mode[0], math=mode[1])


@GPU
@given(spec=specs(**GEMM_RANGES), mode=st.sampled_from(MODES), seed=st.integers(0, 2**16))
def test_every_layout_and_precision_within_the_error_bound(spec, mode, seed):
    spec = _mode(spec, mode)
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w), x, w)


@GPU
@given(data=st.data(), mode=st.sampled_from(MODES), seed=st.integers(0, 2**16))
def test_any_tiles_within_the_error_bound(data, mode, seed):
    """Drawn tiles: guarded rows (more loader threads than rows), one-atom warps, 2-4 stages."""
    spec = _mode(data.draw(specs(**GEMM_RANGES)), mode)
    tiles = data.draw(mma_tiles(spec))
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w, tiles), x, w)


@GPU
@given(data=st.data(), mode=st.sampled_from(MODES), seed=st.integers(0, 2**16))
def test_sixteen_byte_copies_within_the_error_bound(data, mode, seed):
    spec = data.draw(vector_specs(DType(mode[0])))
    spec = _mode(spec, mode)
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w), x, w)


def _torch_convolution(spec: ConvSpec, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """PyTorch's convolution of the stored inputs at the kernel's precision (float16 and bfloat16
    tensors; float32 with TF32 allowed for tf32, without for 3xtf32), in the spec's layout."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    dtype = {DType.float16: torch.float16, DType.bfloat16: torch.bfloat16, DType.float32: torch.float32}[spec.dtype]
    inputs = []
    for array in (x, w):
        values = torch.from_numpy(precision.from_storage(array, spec.dtype)).to("cuda")
        if spec.layout.channels_last:
            values = values[..., : spec.c].movedim(-1, 1)
        inputs.append(values.to(dtype).contiguous())
    conv = F.conv2d if spec.dims == 2 else F.conv3d
    allowed = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = spec.math.value == "tf32"
    try:
        theirs = conv(*inputs, stride=spec.stride, padding=spec.padding, dilation=spec.dilation)
    finally:
        torch.backends.cudnn.allow_tf32 = allowed
    if spec.layout.channels_last:
        theirs = theirs.movedim(1, -1)
    return theirs.double().cpu().numpy()


@GPU
@given(spec=specs(**GEMM_RANGES), mode=st.sampled_from(MODES), seed=st.integers(0, 2**16))
def test_against_torch_at_the_same_precision(spec, mode, seed):
    """Both results lie within the bound of the exact one (cuDNN too accumulates in FP32 and rounds
    once), so they differ by at most twice it."""
    spec = _mode(spec, mode)
    x, w = _inputs(spec, seed)
    ours = _run(spec, x, w)
    theirs = _torch_convolution(spec, x, w)
    bound = precision.error_bound(spec, x, w)
    excess = np.abs(ours - theirs) - 2 * bound
    assert not (excess > 0).any(), (f"{spec.describe()}: {int((excess > 0).sum())} output(s) differ from PyTorch's "
                                     f"by more than twice the error bound; worst {float(excess.max())} over it")


ACCURACY_SPECS = {
    "2d-nhwc-vector": ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=96, input_size=(14, 14), filter_size=3, padding=1),
    "2d-nchw-long-k": ConvSpec(dims=2, layout="NCHW", n=1, c=96, k=40, input_size=(12, 12), filter_size=5, padding=2),
    "3d-ndhwc-odd-c": ConvSpec(dims=3, layout="NDHWC", n=1, c=7, k=33, input_size=(6, 8, 8), filter_size=3, padding=1),
}


@pytest.mark.parametrize("name", ACCURACY_SPECS)
def test_three_tf32_is_as_accurate_as_fp32_fma_and_far_more_than_tf32(name):
    """On the same float32 inputs, 3xTF32's error (relative, in norm) against the exact result is no
    larger than twice that of the FMA kernel (float32 multiply-adds: both are FP32 accumulations,
    and 3xTF32's products are within 2^-20 of exact), and TF32's is hundreds of times larger."""
    spec = ACCURACY_SPECS[name]
    x, w = _inputs(replace(spec, math="3xtf32"), seed=7)
    exact = FAMILY.reference(spec, x, w)
    errors = {mode: relative_error(_run(replace(spec, math=mode), x, w), exact) for mode in ("tf32", "3xtf32")}
    import cupy

    fma = build("implicit_gemm", spec)
    errors["fma"] = relative_error(cupy.asnumpy(fma(cupy.asarray(x), cupy.asarray(w))), exact)
    assert errors["3xtf32"] <= 2 * errors["fma"], errors
    assert errors["tf32"] >= 100 * errors["3xtf32"], errors
    assert errors["3xtf32"] < 2.0**-20 * math.sqrt(spec.c * math.prod(spec.filter_size)), errors
