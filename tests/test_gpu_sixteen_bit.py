"""GPU tier of the memory-bound families in float16 and bfloat16: im2col, col2im (gather) and every
direct variant but tiled_tma, on drawn specs, against the float64 reference of the stored inputs.
Outputs are NaN-poisoned before each launch and a channel pitch's padding lanes are NaN, so an
unwritten output or a read of padding shows.  im2col must equal the image's elements exactly;
col2im and direct must lie within ``Family.error_bound`` (FP32 sums, one rounding).  PyTorch's
unfold in the same dtype is the second oracle of im2col.  Examples per test: $CONVGEN_GPU_EXAMPLES."""
import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codegen import precision
from codegen.api import LaunchError, array_dtype, build, plan
from codegen.emit import build_flags, emit
from codegen.families import get_family
from codegen.fuzz import check_result, specs
from codegen.precision import NAN
from codegen.spec import ConvSpec, Layout, SpecError

pytestmark = pytest.mark.gpu
GPU = settings.get_profile("gpu")
SIXTEEN_BIT = ("float16", "bfloat16")
NVCC = shutil.which("nvcc")


def sixteen_bit_specs(**options):
    """``fuzz.specs`` in float16 or bfloat16."""
    return st.sampled_from(SIXTEEN_BIT).flatmap(lambda dtype: specs(**options, pinned={"dtype": dtype}))


def _assert_right(family: str, spec: ConvSpec, tiles, seed: int) -> None:
    """The kernel on the family's stored inputs, the pitch's padding lanes NaN, the output NaN first."""
    import cupy

    fam = get_family(family, spec)
    kernel = build(family, spec, tiles)
    inputs = fam.make_inputs(spec, np.random.default_rng(seed))
    if family != "col2im" and spec.layout.channels_last and spec.pitch > spec.c:
        inputs[0][..., spec.c:] = NAN[spec.dtype]
    out = cupy.full(kernel.plan.output.shape, NAN[spec.dtype], dtype=array_dtype(spec.dtype))
    kernel(*(cupy.asarray(a) for a in inputs), out=out)
    result = precision.from_storage(cupy.asnumpy(out), spec.dtype)
    mismatch = check_result(spec, result, fam.reference(spec, *inputs), inputs, family)
    assert mismatch is None, f"{family} {kernel.plan.variant} {tiles} on {spec.describe()}: {mismatch}"


@GPU
@given(spec=sixteen_bit_specs(vector_pitch=False), seed=st.integers(0, 2**16))
def test_im2col_scalar_kernels(spec, seed):
    _assert_right("im2col", spec, {"vectorized": False}, seed)


@GPU
@given(spec=sixteen_bit_specs(layouts=(Layout.NCHW, Layout.NCDHW)), seed=st.integers(0, 2**16), split=st.booleans())
def test_im2col_channels_first(spec, seed, split):
    _assert_right("im2col", spec, {"split_outer_tap": split}, seed)


@GPU
@given(spec=sixteen_bit_specs(vector_pitch=True, max_channels=40), seed=st.integers(0, 2**16),
       pixels=st.sampled_from((32, 64, 128)), threads=st.sampled_from((128, 256, 512)))
def test_im2col_vector_kernels(spec, seed, pixels, threads):
    _assert_right("im2col", spec, {"vectorized": True, "pixels": min(pixels, threads), "threads": threads}, seed)


@GPU
@given(spec=sixteen_bit_specs(max_channels=40), seed=st.integers(0, 2**16), threads=st.sampled_from((64, 256)),
       channels=st.sampled_from((1, 2, 4, 8)))
def test_col2im_gather(spec, seed, threads, channels):
    """Every gather kernel: channels-first, channels-last, and the tiled one from a pitch of 32; channel groups of
    every size, C not always a multiple."""
    _assert_right("col2im", spec, {"algorithm": "gather", "threads": threads, "channels": channels}, seed)


DIRECT_TILES = ({"variant": "basic"}, {"variant": "constant"}, {"variant": "tiled_halo"}, {"variant": "tiled_cache"},
                {"variant": "tiled_register"}, {"variant": "tiled_register", "filter_memory": "constant"},
                {"variant": "tiled_register", "stages": 2, "tiles_per_block": 2},
                {"variant": "tiled_register", "per_thread": 8, "rows_per_thread": 2, "tile_w": 64, "tile_h": 8})


@GPU
@given(spec=sixteen_bit_specs(), seed=st.integers(0, 2**16), tiles=st.sampled_from(DIRECT_TILES))
def test_direct(spec, seed, tiles):
    try:
        plan("direct", spec, tiles)
    except SpecError:   # a tile choice this spec cannot take, as in float32
        assume(False)
    _assert_right("direct", spec, tiles, seed)


@st.composite
def wide_rows(draw):
    """Channels-first specs whose rows come in 16-byte loads: W a multiple of 8, stride 1 along W."""
    dims = draw(st.sampled_from((2, 3)))
    sizes = (*(draw(st.integers(1, 5)) for _ in range(dims - 2)), draw(st.integers(1, 24)), 8 * draw(st.integers(1, 24)))
    filters = tuple(draw(st.integers(1, 3 if j < dims - 2 else 5)) for j in range(dims))
    padding = tuple(draw(st.integers(0, 2)) for _ in range(dims))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(dims))
    stride = (*(draw(st.integers(1, 2)) for _ in range(dims - 1)), 1)
    assume(all(d * (f - 1) + 1 <= size + 2 * p for size, f, p, d in zip(sizes, filters, padding, dilation)))
    return ConvSpec(dims=dims, layout="NCHW" if dims == 2 else "NCDHW", n=draw(st.integers(1, 2)),
                    c=draw(st.integers(1, 3)), k=draw(st.integers(1, 3)), input_size=sizes, filter_size=filters,
                    stride=stride, padding=padding, dilation=dilation, dtype=draw(st.sampled_from(SIXTEEN_BIT)))


@GPU
@given(spec=wide_rows(), seed=st.integers(0, 2**16), memory=st.sampled_from(("global", "constant")))
def test_direct_register_tiles_load_16_bytes(spec, seed, memory):
    tiles = get_family("direct").complete_tiles(spec, {"variant": "tiled_register", "filter_memory": memory})
    assume(tiles.tile_w * spec.stride[-1] % 8 == 0)
    _assert_right("direct", spec, tiles.to_dict(), seed)


@GPU
@given(spec=sixteen_bit_specs(dims=2), seed=st.integers(0, 2**16))
def test_im2col_equals_torch_unfold_in_the_same_dtype(spec, seed):
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    element = torch.float16 if spec.dtype.value == "float16" else torch.bfloat16
    generator = torch.Generator("cuda").manual_seed(seed)
    x = (torch.rand(spec.n, spec.c, *spec.input_size, device="cuda", generator=generator) - 0.5).to(element)
    ours_in = x.permute(0, 2, 3, 1) if spec.layout.channels_last else x
    if spec.layout.channels_last and spec.pitch != spec.c:
        padded = torch.full((*ours_in.shape[:-1], spec.pitch), float("nan"), device="cuda", dtype=element)
        padded[..., : spec.c] = ours_in
        ours_in = padded
    col = build("im2col", spec)(ours_in.contiguous())
    assert col.dtype == element
    taps = int(np.prod(spec.filter_size))
    theirs = F.unfold(x, spec.filter_size, dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    theirs = theirs.permute(1, 0, 2).reshape(spec.c, taps, -1)
    if spec.layout.channels_last:
        theirs = theirs.transpose(0, 1)
    assert torch.equal(col.reshape(theirs.shape), theirs)


def test_arrays_of_another_dtype_are_refused_at_launch():
    import cupy

    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=2, k=2, input_size=8, filter_size=3, dtype="bfloat16")
    kernel = build("direct", spec)
    x, w = (cupy.asarray(a) for a in get_family("direct").make_inputs(spec, np.random.default_rng(0)))
    with pytest.raises(LaunchError, match="x has dtype float32; this kernel takes bfloat16"):
        kernel(x.astype(cupy.float32), w)
    with pytest.raises(LaunchError, match="w has dtype float16; this kernel takes bfloat16"):
        kernel(x, w.view(cupy.float16))
    half = build("im2col", ConvSpec(dims=2, layout="NCHW", n=1, c=2, k=1, input_size=8, filter_size=3, dtype="float16"))
    with pytest.raises(LaunchError, match="x has dtype uint16; this kernel takes float16"):
        half(x)


SELFTESTS = (("im2col", "NHWC", "bfloat16", None), ("im2col", "NCHW", "float16", None),
             ("col2im", "NHWC", "bfloat16", None), ("col2im", "NCHW", "float16", None),
             ("direct", "NCHW", "bfloat16", {"variant": "tiled_register"}),
             ("direct", "NCHW", "float16", {"variant": "constant"}))


@pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
@pytest.mark.parametrize("family, layout, dtype, tiles", SELFTESTS)
def test_emitted_selftests_pass_on_the_gpu(tmp_path, family, layout, dtype, tiles):
    """The emitted file's own self-test, built with nvcc and run: its tolerance is the dtype's bound."""
    c = 40 if family == "col2im" and layout == "NHWC" else 8
    spec = ConvSpec(dims=2, layout=layout, n=2, c=c, k=3, input_size=(10, 32), filter_size=3, padding=1, dtype=dtype)
    path = emit(family, spec, tmp_path / "kernel.cu", tiles)
    built = subprocess.run([NVCC, *build_flags(path.read_text()), "-DCONVGEN_SELFTEST", str(path), "-o",
                            str(tmp_path / "selftest")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(tmp_path / "selftest")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("PASS"), run.stdout + run.stderr
