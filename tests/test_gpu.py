"""GPU tier: every kernel variant against the float64 numpy reference and PyTorch, outputs
NaN-poisoned before each launch.  Examples per test: $CONVGEN_GPU_EXAMPLES (300 in a full run)."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codegen.fuzz import compare, gemm_tiles, run_on_gpu, specs, tma_specs
from codegen.spec import ConvSpec, Layout

pytestmark = pytest.mark.gpu
GPU = settings.get_profile("gpu")


def _assert_matches(family, spec, tiles=None, seed=0):
    result, expected = run_on_gpu(family, spec, tiles, seed)
    mismatch = compare(result, expected)
    assert mismatch is None, f"{family} {tiles} on {spec.describe()}: {mismatch}"


@GPU
@given(spec=specs(vector_pitch=False), seed=st.integers(0, 2**16))
def test_im2col_scalar_variants(spec, seed):
    _assert_matches("im2col", spec, {"vectorized": False}, seed)


@GPU
@given(spec=specs(layouts=(Layout.NCHW, Layout.NCDHW)), seed=st.integers(0, 2**16), split=st.booleans())
def test_im2col_channels_first(spec, seed, split):
    _assert_matches("im2col", spec, {"split_outer_tap": split}, seed)


@GPU
@given(spec=specs(vector_pitch=True, max_channels=40), seed=st.integers(0, 2**16),
       pixels=st.sampled_from((32, 64, 128)), threads=st.sampled_from((128, 256, 512)))
def test_im2col_dpitch_vectorised(spec, seed, pixels, threads):
    _assert_matches("im2col", spec, {"vectorized": True, "pixels": min(pixels, threads), "threads": threads}, seed)


@GPU
@given(spec=specs(), seed=st.integers(0, 2**16), threads=st.sampled_from((64, 256)), channels=st.sampled_from((1, 2, 4, 8)))
def test_col2im_gather(spec, seed, threads, channels):
    _assert_matches("col2im", spec, {"algorithm": "gather", "threads": threads, "channels": channels}, seed)


@GPU
@given(spec=specs(), seed=st.integers(0, 2**16))
def test_col2im_scatter(spec, seed):
    _assert_matches("col2im", spec, {"algorithm": "scatter"}, seed)


def _torch():
    return pytest.importorskip("torch")


def _torch_case(spec, seed):
    """Random x and w in PyTorch's NC(D)HW, laid out for ``spec`` (channels-last with its pitch),
    PyTorch's float64 convolution of them (the second oracle), and x and w as drawn."""
    torch = _torch()
    import torch.nn.functional as F

    generator = torch.Generator("cuda").manual_seed(seed)
    x = torch.rand(spec.n, spec.c, *spec.input_size, device="cuda", generator=generator) - 0.5
    w = torch.rand(spec.k, spec.c, *spec.filter_size, device="cuda", generator=generator) - 0.5
    conv = F.conv2d if spec.dims == 2 else F.conv3d
    theirs = conv(x.double(), w.double(), stride=spec.stride, padding=spec.padding, dilation=spec.dilation)
    if not spec.layout.channels_last:
        return x, w, theirs, (x, w)
    last = (0, *range(2, 2 + spec.dims), 1)
    ours_x = torch.zeros(spec.n, *spec.input_size, spec.pitch, device="cuda")
    ours_x[..., : spec.c] = x.permute(*last)
    return ours_x, w.permute(*last).contiguous(), theirs, (x, w)


def _cancellation(spec, x, w, theirs) -> float:
    """``codegen.fuzz.cancellation`` on PyTorch's inputs: ||conv(|x|, |w|)|| over
    sqrt(C * taps) * ||conv(x, w)||, about 0.7 unless the outputs nearly cancel."""
    import torch.nn.functional as F

    conv = F.conv2d if spec.dims == 2 else F.conv3d
    magnitude = conv(x.double().abs(), w.double().abs(), stride=spec.stride, padding=spec.padding, dilation=spec.dilation)
    products = spec.c * math.prod(spec.filter_size)
    return float(magnitude.norm() / (math.sqrt(products) * theirs.norm().clamp_min(1e-30)))

@GPU
@given(spec=specs(dims=2), seed=st.integers(0, 2**16))
def test_im2col_against_torch_unfold(spec, seed):
    torch = _torch()
    import torch.nn.functional as F

    from codegen.api import build

    x = torch.rand(spec.n, spec.c, *spec.input_size, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) - 0.5
    ours_in = x.permute(0, 2, 3, 1) if spec.layout.channels_last else x
    if spec.layout.channels_last and spec.pitch != spec.c:
        padded = torch.full((*ours_in.shape[:-1], spec.pitch), float("nan"), device="cuda")
        padded[..., : spec.c] = ours_in
        ours_in = padded
    col = build("im2col", spec)(ours_in.contiguous())
    assert isinstance(col, torch.Tensor)
    taps = math.prod(spec.filter_size)
    theirs = F.unfold(x, spec.filter_size, dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    theirs = theirs.permute(1, 0, 2).reshape(spec.c, taps, -1)
    if spec.layout.channels_last:
        theirs = theirs.transpose(0, 1)
    assert torch.equal(col.reshape(theirs.shape), theirs)


@GPU
@given(spec=specs(dims=2), seed=st.integers(0, 2**16), algorithm=st.sampled_from(("gather", "scatter")))
def test_col2im_against_torch_fold(spec, seed, algorithm):
    torch = _torch()
    import torch.nn.functional as F

    from codegen.api import build
    from codegen.index import IndexAlgebra

    alg = IndexAlgebra(spec)
    col = torch.rand(alg.rows, alg.cols, device="cuda", generator=torch.Generator("cuda").manual_seed(seed)) - 0.5
    image = build("col2im", spec, {"algorithm": algorithm})(col)
    if spec.layout.channels_last:
        theirs_col = col.reshape(alg.taps, spec.c, spec.n, -1).permute(2, 1, 0, 3)
        image = image[..., : spec.c].permute(0, 3, 1, 2)
    else:
        theirs_col = col.reshape(spec.c, alg.taps, spec.n, -1).permute(2, 0, 1, 3)
    theirs = F.fold(theirs_col.reshape(spec.n, spec.c * alg.taps, -1), spec.input_size, spec.filter_size,
                    dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    torch.testing.assert_close(image, theirs, rtol=1e-5, atol=1e-5)


def test_gather_is_bitwise_reproducible():
    import cupy

    from codegen.api import build

    spec = ConvSpec(dims=2, layout="NCHW", n=4, c=16, k=1, input_size=(33, 35), filter_size=(5, 5), stride=1,
                    padding=2, dilation=1)
    kernel = build("col2im", spec, {"algorithm": "gather"})
    col = cupy.random.default_rng(3).standard_normal(kernel.plan.inputs[0].shape, dtype=cupy.float32)
    first = kernel(col)
    for _ in range(5):
        assert cupy.array_equal(kernel(col), first)


def test_every_compile_of_a_program_reports_its_resources(tmp_path):
    """Where a GPU driver is present NVRTC keeps its own cache, which drops ptxas's report (GEMM
    v33): a program compiled again, past convgen's cache (a fresh one), must still report it."""
    from codegen.api import plan
    from codegen.compile import KernelCache, compile_source
    from codegen.render import render_kernels

    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=4, input_size=(9, 8), filter_size=3)
    kernel_plan = plan("implicit_gemm", spec)
    source = render_kernels(kernel_plan).code
    for attempt in range(3):
        compiled = compile_source(source, arch="sm_90", cache=KernelCache(tmp_path / str(attempt)))
        assert compiled.source_hit == "miss"
        assert kernel_plan.launches[-1].kernel in compiled.resources, compiled.log


def test_three_dimensional_layers_with_asymmetric_geometry():
    spec = ConvSpec(dims=3, layout="NDHWC", n=2, c=5, k=1, input_size=(6, 9, 11), filter_size=(2, 3, 4),
                    stride=(1, 2, 3), padding=(0, 1, 2), dilation=(2, 1, 1), dpitch=8)
    for tiles in ({"vectorized": True}, {"vectorized": False}):
        _assert_matches("im2col", spec, tiles)
    for algorithm in ("gather", "scatter"):
        _assert_matches("col2im", spec, {"algorithm": algorithm})


def test_launch_rejects_bad_arguments():
    import cupy

    from codegen.api import LaunchError, build

    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=1, input_size=(8, 8), filter_size=(3, 3), dpitch=4)
    kernel = build("im2col", spec)
    good = cupy.ones((2, 8, 8, 4), dtype=cupy.float32)
    with pytest.raises(LaunchError, match="shape"):
        kernel(cupy.ones((2, 8, 8, 3), dtype=cupy.float32))
    with pytest.raises(LaunchError, match="dtype"):
        kernel(good.astype(cupy.float64))
    with pytest.raises(LaunchError, match="host memory"):
        kernel(np.ones((2, 8, 8, 4), dtype=np.float32))
    with pytest.raises(LaunchError, match="C-contiguous"):
        kernel(cupy.ones((2, 8, 8, 8), dtype=cupy.float32)[..., ::2])
    with pytest.raises(LaunchError, match="aligned"):
        kernel(cupy.ones(2 * 8 * 8 * 4 + 1, dtype=cupy.float32)[1:].reshape(2, 8, 8, 4))
    with pytest.raises(LaunchError, match="takes 1 input"):
        kernel(good, good)
    assert kernel(good).shape == kernel.plan.output.shape


def test_large_spec_uses_64_bit_indexing_and_runs():
    """A column matrix over 2^31 elements: the kernel must index with 64 bits and still be right
    at the far end of the buffer."""
    import cupy

    from codegen.api import build

    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=2, k=1, input_size=(1024, 1040), filter_size=(33, 32),
                    stride=1, padding=16, dilation=1)
    kernel = build("im2col", spec)
    assert "typedef long long idx_t;" in kernel.source.code
    x = cupy.random.default_rng(0).uniform(-1, 1, kernel.plan.inputs[0].shape, dtype=cupy.float32)
    col = kernel(x)
    rows, cols = col.shape
    assert rows * cols > 2**31
    last_row = cupy.asnumpy(col[-1])
    # the last row is tap (32, 31) of channel 1: x[1, oh - 16 + 32, ow - 16 + 31], zero outside.
    oh, ow = np.divmod(np.arange(cols), 1041)  # OW = 1040 + 2*16 - 31
    xh = cupy.asnumpy(x[0, 1])
    ih, iw = oh + 16, ow + 15
    inside = (ih < 1024) & (iw < 1040)
    expected = np.where(inside, xh[np.minimum(ih, 1023), np.minimum(iw, 1039)], 0)
    assert np.array_equal(last_row, expected)


DIRECT_VARIANTS = ("basic", "constant", "tiled_halo", "tiled_cache", "tiled_register")


def _direct_tiles(spec, variant, tile_h, tile_w, per_thread=1):
    """A valid tile choice for the spec, or None (Hypothesis then skips the example)."""
    tiles = {"variant": variant, "tile_h": tile_h, "tile_w": tile_w * per_thread, "per_thread": per_thread}
    if variant == "tiled_register":
        tiles["rows_per_thread"] = 1
    return tiles if _direct_tiles_valid(spec, tiles) else None


@GPU
@given(spec=specs(max_channels=6), seed=st.integers(0, 2**16), variant=st.sampled_from(DIRECT_VARIANTS),
       tile_h=st.integers(1, 9), tile_w=st.integers(1, 9), per_thread=st.sampled_from((1, 2, 4, 8)))
def test_direct_variants(spec, seed, variant, tile_h, tile_w, per_thread):
    from hypothesis import assume

    tiles = _direct_tiles(spec, variant, tile_h, tile_w, per_thread if variant == "tiled_register" else 1)
    assume(tiles is not None)
    _assert_matches("direct", spec, tiles, seed)


@GPU
@given(spec=specs(max_channels=6), seed=st.integers(0, 2**16), variant=st.sampled_from(DIRECT_VARIANTS))
def test_direct_against_torch_conv(spec, seed, variant):
    from codegen.api import build

    assume_tiles = {"variant": variant} if variant == "tiled_register" else _direct_tiles(spec, variant, 8, 8)
    from hypothesis import assume

    assume(assume_tiles is not None)
    torch = _torch()
    ours_x, ours_w, theirs, _ = _torch_case(spec, seed)
    y = build("direct", spec, assume_tiles)(ours_x.contiguous(), ours_w.contiguous())
    if spec.layout.channels_last:
        y = y.permute(0, spec.dims + 1, *range(1, spec.dims + 1))
    torch.testing.assert_close(y.double(), theirs, rtol=1e-5, atol=1e-5)


@GPU
@pytest.mark.parametrize("dims", (2, 3))
@given(data=st.data(), seed=st.integers(0, 2**16), per_thread=st.sampled_from((1, 2, 4, 8)),
       rows=st.integers(1, 8), across=st.integers(1, 4), down=st.integers(1, 4), stages=st.integers(1, 3),
       tiles_per_block=st.integers(1, 3), filter_memory=st.sampled_from(("global", "constant")),
       min_blocks=st.sampled_from((0, 2, 8)))
def test_direct_register_switches(dims, data, seed, per_thread, rows, across, down, stages, tiles_per_block,
                                  filter_memory, min_blocks):
    """tiled_register with every switch: register tile, pipeline depth, tiles per block, filter
    memory, register cap; W sizes up to 20 reach the 16-byte copies and float4 windows and stores.  One test per
    dimensionality, so the GPU tier runs them side by side."""
    from hypothesis import assume

    spec = data.draw(specs(dims=dims, max_channels=5, max_size=20))

    tiles = {"variant": "tiled_register", "per_thread": per_thread, "tile_w": per_thread * across,
             "rows_per_thread": rows, "tile_h": rows * down, "stages": stages, "tiles_per_block": tiles_per_block,
             "filter_memory": filter_memory, "min_blocks": min_blocks}
    assume(_direct_tiles_valid(spec, tiles))
    _assert_matches("direct", spec, tiles, seed)


@GPU
@pytest.mark.parametrize("dims", (2, 3))
@given(data=st.data(), seed=st.integers(0, 2**16), rows=st.integers(1, 4), warps=st.sampled_from((1, 2, 8)),
       stages=st.integers(1, 5), filter_memory=st.sampled_from(("global", "constant")),
       resident_blocks=st.integers(1, 3))
def test_direct_tma_switches(dims, data, seed, rows, warps, stages, filter_memory, resident_blocks):
    """tiled_tma with every switch (rows per thread, consumer warps, ring depth, filter memory,
    persistent blocks per SM) against the float64 reference, output NaN-poisoned: ghost cells come
    from the TMA's zero fill, tails from the store guards."""
    spec = data.draw(tma_specs(dims))
    tiles = {"variant": "tiled_tma", "rows_per_thread": rows, "tile_h": rows * warps, "stages": stages,
             "filter_memory": filter_memory, "resident_blocks": resident_blocks}
    _assert_matches("direct", spec, tiles, seed)


@GPU
@given(spec=st.sampled_from((2, 3)).flatmap(tma_specs), seed=st.integers(0, 2**16))
def test_direct_tma_against_torch_conv(spec, seed):
    from codegen.api import build

    torch = _torch()
    ours_x, ours_w, theirs, _ = _torch_case(spec, seed)
    y = build("direct", spec, {"variant": "tiled_tma"})(ours_x.contiguous(), ours_w.contiguous())
    torch.testing.assert_close(y.double(), theirs, rtol=1e-5, atol=1e-5)


def _direct_tiles_valid(spec, tiles) -> bool:
    from codegen.api import plan
    from codegen.spec import SpecError

    try:
        plan("direct", spec, tiles)
    except SpecError:
        return False
    return True


def test_single_channel_filter_all_variants():
    """W = 257 takes the 4-byte copies, W = 260 the 16-byte copies and float4 stores (and TMA)."""
    for width in (257, 260):
        spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(300, width), filter_size=(9, 9), padding=4)
        for variant in DIRECT_VARIANTS + (("tiled_tma",) if width % 4 == 0 else ()):
            _assert_matches("direct", spec, {"variant": variant})


GEMM_FAMILIES = ("implicit_gemm", "im2win")
GEMM_SPECS = specs(max_channels=20, max_k=40, max_elements=1 << 16, max_filter=7)


def _assert_conv_matches(family, spec, tiles, seed):
    """Elementwise against the float64 reference (NaN = unwritten) and in norm (<< 1e-5)."""
    from codegen.fuzz import cancellation, relative_error
    from codegen.spec import SpecError

    try:
        result, expected = run_on_gpu(family, spec, tiles, seed)
    except SpecError as error:          # a tile the loader cannot split for this spec: not a bug
        from hypothesis import assume

        assume(not error.field.startswith("tiles."))
        raise
    mismatch = compare(result, expected)
    assert mismatch is None, f"{family} {tiles} on {spec.describe()}: {mismatch}"
    assert relative_error(result, expected) < 1e-6 * max(1.0, cancellation(family, spec, seed))


@GPU
@given(spec=GEMM_SPECS, tiles=gemm_tiles(), seed=st.integers(0, 2**16), family=st.sampled_from(GEMM_FAMILIES))
def test_gemm_families_every_switch(spec, tiles, seed, family):
    _assert_conv_matches(family, spec, tiles, seed)


@GPU
@given(spec=GEMM_SPECS, seed=st.integers(0, 2**16), family=st.sampled_from(GEMM_FAMILIES + ("im2col_gemm",)))
def test_gemm_families_heuristic_tiles(spec, seed, family):
    _assert_conv_matches(family, spec, None, seed)


@GPU
@given(spec=specs(max_channels=8, min_k=65, max_k=96, max_elements=1 << 15, max_filter=5), seed=st.integers(0, 2**16),
       family=st.sampled_from(GEMM_FAMILIES))
def test_gemm_heuristic_96_channel_tiles(spec, seed, family):
    """65-96 output channels: the heuristic's 8x12 micro-tiles (one warp across 96 channels),
    with and without a channel tail."""
    _assert_conv_matches(family, spec, None, seed)


@GPU
@given(spec=GEMM_SPECS, seed=st.integers(0, 2**16), removed=st.sampled_from(("micro_kernel", "vectorized", "prefetch")))
def test_im2win_ablations(spec, seed, removed):
    from codegen.families import im2win

    tiles = im2win.ablation(im2win.FAMILY.default_tiles(spec), removed)
    _assert_conv_matches("im2win", spec, tiles.to_dict(), seed)


@GPU
@given(spec=GEMM_SPECS, seed=st.integers(0, 2**16), chunk=st.integers(1, 3),
       family=st.sampled_from(("im2col_gemm", "im2win")))
def test_batch_chunks(spec, seed, chunk, family):
    from hypothesis import assume

    assume(spec.n % chunk == 0)
    _assert_conv_matches(family, spec, {"batch_chunk": chunk}, seed)


@GPU
@given(spec=GEMM_SPECS, seed=st.integers(0, 2**16), family=st.sampled_from(GEMM_FAMILIES + ("im2col_gemm",)))
def test_gemm_families_against_torch_conv(spec, seed, family):
    from codegen.api import build

    torch = _torch()
    ours_x, ours_w, theirs, (x, w) = _torch_case(spec, seed)
    y = build(family, spec)(ours_x.contiguous(), ours_w.contiguous())
    if spec.layout.channels_last:
        y = y.permute(0, spec.dims + 1, *range(1, spec.dims + 1))
    error = float((y.double() - theirs).norm() / theirs.norm().clamp_min(1e-30))
    assert error < 1e-6 * max(1.0, _cancellation(spec, x, w, theirs)), error
    torch.testing.assert_close(y.double(), theirs, rtol=1e-5, atol=1e-5)



TMA_GEMM_SPECS = st.one_of(specs(vector_pitch=True, max_channels=40, max_k=70, max_elements=1 << 16, max_filter=5),
                           specs(layouts=(Layout.NCHW, Layout.NCDHW), max_channels=40, max_k=70, max_elements=1 << 16,
                                 max_filter=5))
TMA_GEMM_TILES = st.fixed_dictionaries({"tma": st.just(True), "block_m": st.sampled_from((32, 64, 128, 256, 512)),
                                        "block_n": st.sampled_from((64, 128, 256)), "stages": st.integers(2, 6),
                                        "thread_m": st.sampled_from((8, 16))}).map(
    lambda tiles: {**tiles, "warp_m": 4 * tiles["thread_m"]})


@GPU
@given(spec=TMA_GEMM_SPECS, tiles=TMA_GEMM_TILES, seed=st.integers(0, 2**16))
def test_tma_implicit_gemm_every_switch(spec, tiles, seed):
    """The TMA kernel (sm_90; sm_90a for 16-row micro-tiles) for every CTA tile, micro-tile and ring
    depth on channels-last and channels-first specs with stride, padding, dilation, channel tails
    (C not a multiple of its 32-channel slices) and K tails, NaN-poisoned: padding comes from the
    im2col mode's zero fill or the gather's zero-size copies, tails from the store guards."""
    _assert_conv_matches("implicit_gemm", spec, tiles, seed)   # tiles over the register file or shared memory: assumed away


@GPU
@given(spec=TMA_GEMM_SPECS, seed=st.integers(0, 2**16))
def test_tma_implicit_gemm_against_torch_conv(spec, seed):
    from codegen.api import build

    torch = _torch()
    ours_x, ours_w, theirs, (x, w) = _torch_case(spec, seed)
    y = build("implicit_gemm", spec, {"tma": True})(ours_x.contiguous(), ours_w.contiguous())
    if spec.layout.channels_last:
        y = y.permute(0, spec.dims + 1, *range(1, spec.dims + 1))
    error = float((y.double() - theirs).norm() / theirs.norm().clamp_min(1e-30))
    assert error < 1e-6 * max(1.0, _cancellation(spec, x, w, theirs)), error
    torch.testing.assert_close(y.double(), theirs, rtol=1e-5, atol=1e-5)


def test_tma_implicit_gemm_on_edge_shapes(monkeypatch):
    """C = 4 (an 8th of a slice), K = 1 (scalar stores), sizes of 1, 3D with asymmetric stride,
    padding and dilation, stride 8 and wide padding (corners far from 0), and a grid with more
    tiles than blocks (the persistent loop carries the ring's stages and phases across tiles);
    each with the heuristic's tiles and with 512-pixel tiles of 16-row micro-tiles (two im2col
    boxes, the producer warpgroup's setmaxnreg); 137 tiles for 132 blocks, whose stream-K spans
    share tiles (zeroed, then summed with atomic adds); and 273 16x8 tiles with stream-K forced
    on (the package takes it for 16x8 only on long grids such as conv4's), whose tail runs in a
    second launch after one round of whole tiles.  Channels-first, the gathered A tile: the same
    edges, strides past TMA's limit of 8, and shared tiles with float4 and with scalar stores;
    and same-padded specs whose producer threads address all their pixels from one address a
    channel (their padding pixels' addresses fall outside x and must not be read); pixel pairs
    (even output rows) as two 4-byte copies or one 8-byte copy by tap, with and without the slice
    table."""
    edge = [
        ConvSpec(dims=2, layout="NHWC", n=1, c=4, k=1, input_size=(1, 1), filter_size=(1, 1)),
        ConvSpec(dims=2, layout="NHWC", n=3, c=4, k=67, input_size=(13, 11), filter_size=(3, 3), padding=1),
        ConvSpec(dims=2, layout="NHWC", n=2, c=12, k=1, input_size=(9, 17), filter_size=(5, 1), stride=(1, 3)),
        ConvSpec(dims=2, layout="NHWC", n=2, c=33, k=20, input_size=(40, 41), filter_size=(3, 5), stride=(8, 2),
                 padding=(20, 9), dilation=(1, 3), dpitch=36),
        ConvSpec(dims=3, layout="NDHWC", n=2, c=8, k=33, input_size=(5, 7, 9), filter_size=(3, 2, 3),
                 stride=(2, 1, 3), padding=(1, 0, 2), dilation=(1, 2, 1)),
        ConvSpec(dims=2, layout="NHWC", n=4, c=64, k=96, input_size=(64, 64), filter_size=3, padding=1),
        ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(1, 1), filter_size=(1, 1)),
        ConvSpec(dims=2, layout="NCHW", n=3, c=5, k=67, input_size=(13, 11), filter_size=(3, 3), padding=1),
        ConvSpec(dims=2, layout="NCHW", n=2, c=33, k=20, input_size=(40, 41), filter_size=(3, 5), stride=(9, 2),
                 padding=(20, 9), dilation=(1, 3)),
        ConvSpec(dims=3, layout="NCDHW", n=2, c=8, k=33, input_size=(5, 7, 9), filter_size=(3, 2, 3),
                 stride=(2, 1, 3), padding=(1, 0, 2), dilation=(1, 2, 1)),
        ConvSpec(dims=2, layout="NCHW", n=4, c=64, k=96, input_size=(64, 64), filter_size=3, padding=1),
    ]
    two_boxes = {"tma": True, "thread_m": 16, "warp_m": 64, "block_m": 512, "block_n": 64, "stages": 3}
    for spec in edge:
        _assert_conv_matches("implicit_gemm", spec, {"tma": True}, 0)
        _assert_conv_matches("implicit_gemm", spec, two_boxes, 0)
    tall = {"tma": True, "thread_m": 16, "warp_m": 64, "block_m": 256, "block_n": 64, "stages": 3}
    from codegen.api import plan

    for spec in (ConvSpec(dims=3, layout="NCDHW", n=2, c=64, k=40, input_size=(8, 8, 8), filter_size=3, padding=1),
                 ConvSpec(dims=2, layout="NCHW", n=3, c=32, k=64, input_size=(16, 32), filter_size=(3, 5),
                          padding=(1, 4), dilation=(1, 2))):
        for tiles in (tall, two_boxes):
            assert plan("implicit_gemm", spec, tiles).context.shared_row_address
            _assert_conv_matches("implicit_gemm", spec, tiles, 0)
    pairs = [  # even output rows: pixel pairs from one address a channel
        ConvSpec(dims=2, layout="NCHW", n=2, c=32, k=40, input_size=(9, 14), filter_size=3, padding=1),
        ConvSpec(dims=2, layout="NCHW", n=2, c=64, k=40, input_size=(9, 16), filter_size=3, stride=(1, 2), padding=1),
        ConvSpec(dims=3, layout="NCDHW", n=1, c=32, k=40, input_size=(4, 6, 12), filter_size=(2, 3, 3),
                 padding=(0, 1, 2), dilation=(1, 1, 2)),
        ConvSpec(dims=2, layout="NCHW", n=3, c=32, k=20, input_size=(7, 9), filter_size=(3, 2)),
    ]
    for spec, wide in zip(pairs, ("slice", "never", "always", "never")):
        for tiles in ({"tma": True}, tall, two_boxes):
            context = plan("implicit_gemm", spec, tiles).context
            assert context.gather_pairs and context.gather_wide == wide
            _assert_conv_matches("implicit_gemm", spec, tiles, 0)
    from codegen.families import gemm_heuristic, implicit_gemm

    with monkeypatch.context() as patch:
        patch.setattr(implicit_gemm, "SLICE_TABLE_LIMIT", 0)
        assert plan("implicit_gemm", pairs[0], {"tma": True}).context.slice_table is None
        _assert_conv_matches("implicit_gemm", pairs[0], {"tma": True}, 0)
    for layout, size in (("NHWC", 132), ("NCHW", 132), ("NCHW", 131)):
        shared = ConvSpec(dims=2, layout=layout, n=2, c=8, k=64, input_size=(size, size), filter_size=3, padding=1)
        _assert_conv_matches("implicit_gemm", shared, {"tma": True, "block_m": 256, "block_n": 64, "stages": 3}, 0)
    monkeypatch.setattr(gemm_heuristic, "takes_stream_k", lambda tiles, count, blocks: True)
    for layout in ("NHWC", "NCHW"):
        long_grid = ConvSpec(dims=2, layout=layout, n=8, c=8, k=64, input_size=(132, 132), filter_size=3, padding=1)
        assert plan("implicit_gemm", long_grid, two_boxes).context.tail_kernel
        _assert_conv_matches("implicit_gemm", long_grid, two_boxes, 0)


def test_heuristic_takes_the_tma_kernel_on_sm_90_and_it_is_right():
    """build(spec) without tiles on a channels-last spec of 563 tiles with K = 32 (the TMA tile's
    idle half that the compiler drops), a channel tail (100 channels: 4 in the last box), a padded
    pitch, padding and dilation: the TMA kernel on sm_90 and newer (docs/perf-history.md, GEMM v14, v30), the
    cp.async kernel before; against the float64 reference (NaN-poisoned) and F.conv2d."""
    from codegen.api import build
    from codegen.compile import compute_capability, device_arch

    torch = _torch()
    spec = ConvSpec(dims=2, layout="NHWC", n=40, c=100, k=32, input_size=(62, 62), filter_size=3, padding=1,
                    dilation=2, dpitch=104)
    kernel = build("implicit_gemm", spec)
    assert (kernel.plan.variant == "tma") == (compute_capability(device_arch()) >= 90), kernel.plan.variant
    _assert_conv_matches("implicit_gemm", spec, None, 3)
    ours_x, ours_w, theirs, _ = _torch_case(spec, 3)
    y = kernel(ours_x.contiguous(), ours_w.contiguous()).permute(0, 3, 1, 2)
    torch.testing.assert_close(y.double(), theirs, rtol=1e-5, atol=1e-5)


def test_gemm_families_on_edge_shapes():
    """C = 1, K = 1, sizes of 1, tile tails, and 3D with asymmetric stride, padding and dilation."""
    edge = [
        ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(1, 1), filter_size=(1, 1)),
        ConvSpec(dims=2, layout="NHWC", n=3, c=1, k=67, input_size=(13, 11), filter_size=(3, 3), padding=1),
        ConvSpec(dims=2, layout="NHWC", n=2, c=12, k=1, input_size=(9, 17), filter_size=(5, 1), stride=(1, 3)),
        ConvSpec(dims=3, layout="NDHWC", n=2, c=8, k=33, input_size=(5, 7, 9), filter_size=(3, 2, 3),
                 stride=(2, 1, 3), padding=(1, 0, 2), dilation=(1, 2, 1)),
        ConvSpec(dims=3, layout="NCDHW", n=1, c=5, k=130, input_size=(4, 6, 5), filter_size=(2, 3, 2),
                 stride=(1, 2, 1), padding=(0, 1, 1), dilation=(2, 1, 2)),
    ]
    for spec in edge:
        for family in GEMM_FAMILIES + ("im2col_gemm",):
            _assert_conv_matches(family, spec, None, 0)


def test_tuning_a_small_spec_keeps_its_budget_and_picks_a_correct_configuration(tmp_path):
    import time

    from codegen import tune, tuning_db
    from codegen.fuzz import relative_error

    spec = ConvSpec(dims=2, layout="NHWC", n=8, c=32, k=64, input_size=(28, 28), filter_size=(3, 3), padding=1)
    db = tune.TuningDB(tmp_path / "tuning.json")
    start = time.monotonic()
    result = tune.tune("implicit_gemm", spec, budget=20, max_configs=40, db=db, progress=False)
    assert time.monotonic() - start < 20 + 15          # one batch may finish past the deadline
    assert result.best is not None and result.best.status == "ok"
    assert db.lookup("implicit_gemm", spec, tuning_db.current_device()) == result.best.tiles
    out, expected = run_on_gpu("implicit_gemm", spec, result.best.tiles, 3)
    assert relative_error(out, expected) < 1e-6


def test_tuning_under_a_workspace_limit_times_only_what_fits_and_builds_under_it_use_it(tmp_path, monkeypatch):
    """im2win under a limit that halves its batch chunk: every timed candidate fits, the record
    is the one a build under the same limit takes (and runs correctly), a build without a limit
    does not take it."""
    from codegen import tune
    from codegen.api import plan
    from codegen.fuzz import relative_error

    monkeypatch.setenv("CONVGEN_TUNING_DB", str(tmp_path / "tuning.json"))
    spec = ConvSpec(dims=2, layout="NHWC", n=8, c=32, k=64, input_size=(28, 28), filter_size=(3, 3), padding=1)
    limit = plan("im2win", spec).workspace_bytes // 2
    result = tune.tune("im2win", spec, budget=20, max_configs=16, progress=False, workspace_limit=limit)
    assert result.best is not None and result.best.status == "ok"
    assert all(plan("im2win", spec, t.tiles).workspace_bytes <= limit for t in result.trials)
    held = plan("im2win", spec, workspace_limit=limit)
    assert held.tiles.to_dict() == result.best.tiles and held.workspace_bytes <= limit
    assert plan("im2win", spec).tiles.batch_chunk == 2 * held.tiles.batch_chunk
    out, expected = run_on_gpu("im2win", spec, result.best.tiles, 3)
    assert relative_error(out, expected) < 1e-6


def test_tuner_never_chooses_a_planted_wrong_candidate(tmp_path, monkeypatch):
    """Test-only switch: candidates with block_k=32 skip their last K slice (faster, wrong)."""
    from codegen import tune
    from codegen.families import gemm_loop, get_family

    spec = ConvSpec(dims=2, layout="NCHW", n=16, c=64, k=64, input_size=(28, 28), filter_size=(3, 3), padding=1)
    real_fields = gemm_loop.loop_fields

    def planted(spec_, tiles, *args, **kwargs):
        fields = real_fields(spec_, tiles, *args, **kwargs)
        if tiles.block_k == 32:
            fields["k_tiles"] -= 1
        return fields

    monkeypatch.setattr(gemm_loop, "loop_fields", planted)
    family = get_family("implicit_gemm")
    base = family.default_tiles(spec).to_dict()
    space = [base, dict(base, block_k=32, stages=2), dict(base, block_k=16)]
    monkeypatch.setattr(type(family), "tuning_space", lambda self, s, workspace_limit=None: space)
    result = tune.tune("implicit_gemm", spec, budget=60, max_configs=10, db=tune.TuningDB(tmp_path / "t.json"),
                       progress=False)
    statuses = {json_key(t.tiles): t.status for t in result.trials}
    assert statuses[json_key(space[1])] == "wrong"
    assert result.best.tiles != space[1]


def json_key(tiles):
    import json

    return json.dumps(tiles, sort_keys=True)


def test_cudnns_algorithm_is_read_from_the_kernels_it_launches():
    """bench conv labels each layer with cuDNN's algorithm from the profiler's kernel names: a
    traced call names at least one kernel (copies and memsets left out), so the label is known."""
    from codegen.bench.cudnn import CudnnCase, cudnn_algorithm, launched_kernels

    spec = ConvSpec(dims=2, layout="NCHW", n=8, c=32, k=64, input_size=(28, 28), filter_size=(3, 3), padding=1)
    names = launched_kernels(CudnnCase(spec).run_cudnn)
    assert names and not any(name.startswith(("Memcpy", "Memset")) for name in names)
    assert cudnn_algorithm(names) in ("GEMM", "FFT", "Winograd")


def test_bench_conv_layer_rows_print_as_a_table(monkeypatch):
    """bench conv end to end on one small layer: every row says whether it is build()'s kernel,
    and the table prints.  cuDNN's extra memory is taken as 1 GiB, so im2win's heuristic fits it
    and the 'within cuDNN' row repeats it: the row whose missing key crashed the summary of every
    full run from v29 to v34 after all the timing was done."""
    from codegen.bench import conv

    monkeypatch.setattr(conv, "cudnn_extra_bytes", lambda run, output_bytes: 1 << 30)
    spec = ConvSpec(dims=2, layout="NCHW", n=4, c=16, k=32, input_size=(20, 20), filter_size=(3, 3), padding=1)
    rows = conv.bench_layer(spec, "small", repeats=2, ablation=False)
    within = [r for r in rows if r["variant"] == conv.WITHIN_CUDNN]
    assert len(within) == 1 and within[0].get("same_as_heuristic") and "ms" in within[0]
    assert all("build_choice" in r for r in rows), [r["variant"] for r in rows if "build_choice" not in r]
    lines = conv.format_table(rows).splitlines()
    assert any(line.startswith("im2win: at least cuDNN's speed on") for line in lines)
    assert any("im2win at or below cuDNN's extra memory on 1 of 1 layers" in line for line in lines)
