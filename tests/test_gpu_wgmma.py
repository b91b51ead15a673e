"""GPU tier of implicit_gemm's WGMMA kernel (codegen.families.wgmma_gemm, sm_90 only): channels-last
float16, bfloat16 and float32 with math tf32 or 3xtf32, with 16-byte channel runs, on random normal inputs rounded to the storage type
(bfloat16 as uint16 bits), outputs NaN-poisoned before each launch (and the channel pitch's padding
NaN, so a read of it shows), each output within ``codegen.precision.error_bound`` of the float64
convolution of the stored inputs (for TF32, the bound of operands truncated to TF32, as the kernel's
plan says they are).  PyTorch at the same precision is the second oracle."""
import dataclasses
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
from codegen.spec import ConvSpec, DType, Layout, MathMode, SpecError, replace

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(device_arch() not in (None, "sm_90"), reason="wgmma runs on sm_90 GPUs only")]
GPU = settings.get_profile("gpu")
NAN_BITS = {DType.float16: np.float16(np.nan), DType.bfloat16: np.uint16(0x7FC0), DType.float32: np.float32(np.nan)}
PRECISIONS = ({"dtype": "float16"}, {"dtype": "bfloat16"}, {"dtype": "float32", "math": "tf32"},
              {"dtype": "float32", "math": "3xtf32"})
MAX_ELEMENTS = 1 << 16


def _inputs(spec: ConvSpec, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Standard normal x and w rounded to the storage type; the channel pitch's padding is NaN."""
    rng = np.random.default_rng(seed)
    alg = IndexAlgebra(spec)
    x = precision.to_storage(rng.standard_normal(alg.image_shape), spec.dtype)
    x[..., spec.c:] = NAN_BITS[spec.dtype]
    return x, precision.to_storage(rng.standard_normal(alg.filter_shape), spec.dtype)


def _run(spec: ConvSpec, x: np.ndarray, w: np.ndarray, tiles: MmaTiles, sm_count: int | None = None) -> np.ndarray:
    """The WGMMA kernel's output on x and w (poisoned with NaN before the launch), as float64;
    ``sm_count`` plans a grid of that many persistent blocks (so each takes several work units)."""
    import cupy

    assert tiles.wgmma
    device = present() if sm_count is None else dataclasses.replace(present(), sm_count=sm_count)
    kernel = compile_plan(FAMILY.plan(spec, tiles, device), device_arch())
    assert kernel.plan.tf32_truncated == (spec.math is MathMode.tf32)   # what _assert_within_bound assumes
    out = cupy.full(kernel.plan.output.shape, NAN_BITS[spec.dtype], dtype=NAN_BITS[spec.dtype].dtype)
    if kernel.plan.workspaces:   # split-K's partial tiles, NaN-poisoned too, so that one never written shows
        def poisoned(buffer, device_id):
            workspace = cupy.full(buffer.shape, np.nan, dtype=np.float32)
            return workspace, workspace.data.ptr

        arrays = (cupy.asarray(x), cupy.asarray(w), out)
        kernel._launcher.run(out.device.id, [a.data.ptr for a in arrays], cupy.cuda.get_current_stream().ptr,
                             poisoned)
    else:
        kernel(cupy.asarray(x), cupy.asarray(w), out=out)
    return precision.from_storage(cupy.asnumpy(out), spec.dtype)


def _assert_within_bound(spec: ConvSpec, result: np.ndarray, x: np.ndarray, w: np.ndarray) -> None:
    expected = FAMILY.reference(spec, x, w)
    bound = precision.error_bound(spec, x, w, tf32_truncated=spec.math is MathMode.tf32)
    excess = np.abs(result - expected) - bound
    unwritten = int(np.isnan(result).sum())
    assert not unwritten, f"{spec.describe()}: {unwritten} output(s) never written (NaN)"
    if (excess > 0).any():
        at = np.unravel_index(int(np.argmax(excess)), excess.shape)
        pytest.fail(f"{spec.describe()}: {int((excess > 0).sum())} output(s) outside the error bound, worst at "
                    f"{tuple(map(int, at))}: got {result[at]!r}, expected {expected[at]!r}, bound {bound[at]!r}")


@st.composite
def covered_specs(draw) -> ConvSpec:
    """Channels-last 2D and 3D specs of every geometry and precision with C and the pitch multiples
    of a 16-byte copy's elements and up to 300 output channels (tails along every GEMM axis, several
    channel tiles of 256); a third with C a multiple of the 128-byte slice, whose A comes by TMA. 3xtf32's
    C is a multiple of 8, so that A comes by TMA in some slice."""
    base = draw(specs(layouts=(Layout.NHWC, Layout.NDHWC), max_k=300, max_elements=MAX_ELEMENTS, max_filter=5))
    precision_fields = draw(st.sampled_from(PRECISIONS))
    unit = 4 if precision_fields.get("math") == "tf32" else 8
    if draw(st.integers(0, 2)) == 0:
        c = 8 * unit * draw(st.integers(1, 2))    # a slice is 32 float32 or 64 16-bit channels
    else:
        c = unit * draw(st.integers(1, 12 if unit == 4 else 6))
    spec = replace(base, c=c, dpitch=c + unit * draw(st.integers(0, 1)), **precision_fields)
    assume(IndexAlgebra(spec).image_elements <= MAX_ELEMENTS)
    return spec


@st.composite
def wgmma_tiles(draw, spec: ConvSpec) -> MmaTiles:
    """Valid WGMMA tiles of every shape: one or two consumer warpgroups of 64 or 128 rows sharing
    each tile, or two taking alternate tiles (ping-pong), each block_n, slices of 128, 64 or 32
    bytes, 2-6 stages (or as many 128-byte slices' worth of narrower ones), split-K into up to 7
    ranges, and clusters of 1 or 2 blocks sharing the filter's slices."""
    width = draw(st.sampled_from(wgmma_gemm.SLICE_CHOICES))
    warp_m = draw(st.sampled_from((64, 128)))
    block_n = draw(st.sampled_from(wgmma_gemm.BLOCK_N_CHOICES))
    pingpong = draw(st.booleans())
    split_k = draw(st.sampled_from((1, 2, 3, 7)))
    cluster_m = draw(st.sampled_from(wgmma_gemm.CLUSTER_CHOICES))
    try:
        tiles = MmaTiles(block_m=warp_m * (1 if pingpong else draw(st.sampled_from((1, 2)))), block_n=block_n,
                         block_k=wgmma_gemm.slice_k(spec, width), warp_m=warp_m, warp_n=block_n,
                         stages=draw(st.sampled_from((2, 3, 4, 5, 6))) * draw(st.sampled_from((1, 128 // width))),
                         wgmma=True, pingpong=pingpong,
                         split_k=split_k, cluster_m=cluster_m)
        check_tiles(spec, tiles, present())
    except SpecError:
        assume(False)
    return tiles


@GPU
@given(spec=covered_specs(), seed=st.integers(0, 2**16))
def test_heuristic_tiles_within_the_error_bound(spec, seed):
    assume(wgmma_gemm.preferred(spec))   # else the heuristic takes mma.sync
    tiles = FAMILY.heuristic_tiles(spec, present())
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w, tiles), x, w)


@GPU
@given(data=st.data(), seed=st.integers(0, 2**16), sm_count=st.sampled_from((2, 3, 5, 7, 11)),
       tail_split=st.sampled_from((2, 3, 7)))
def test_tail_split_on_small_grids_within_the_error_bound(data, seed, sm_count, tail_split):
    """The last round's tiles split into K ranges, every tile shape, on grids of a few blocks, so
    that the specs' few tiles leave a last round (where they do not, the plan has no tail)."""
    spec = data.draw(covered_specs())
    tiles = dataclasses.replace(data.draw(wgmma_tiles(spec)), split_k=1)
    try:
        tiles = dataclasses.replace(tiles, tail_split=tail_split)
        check_tiles(spec, tiles, present())
    except SpecError:
        assume(False)
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w, tiles, sm_count=sm_count), x, w)


@GPU
@given(data=st.data(), seed=st.integers(0, 2**16))
def test_any_tiles_within_the_error_bound(data, seed):
    spec = data.draw(covered_specs())
    tiles = data.draw(wgmma_tiles(spec))
    x, w = _inputs(spec, seed)
    _assert_within_bound(spec, _run(spec, x, w, tiles), x, w)


ODD_CASES = {  # (spec, tiles as (block_m, block_n, warp_m, stages[, pingpong[, split_k[, cluster_m[, slice bytes[,
    #             tail_split]]]]]) or None for the heuristic)
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
    "pingpong-many-tiles-per-block": (ConvSpec(dims=2, layout="NHWC", n=4, c=32, k=96, input_size=(64, 64),
                                               filter_size=3, padding=1, dtype="bfloat16"), (64, 32, 64, 3, True)),
    "pingpong-two-tiles-per-block-tf32": (ConvSpec(dims=2, layout="NHWC", n=8, c=20, k=75, input_size=(64, 66),
                                                          filter_size=3, padding=1, dilation=(1, 2), dpitch=24,
                                                          dtype="float32", math="tf32"), (128, 128, 128, 5, True)),
    "split-k-tf32-uneven-ranges-pingpong": (ConvSpec(dims=2, layout="NHWC", n=1, c=200, k=72, input_size=(9, 11),
                                                     filter_size=3, padding=1, dtype="float32", math="tf32"),
                                            (64, 128, 64, 4, True, 5)),
    "split-k-tf32-heuristic": (ConvSpec(dims=2, layout="NHWC", n=1, c=512, k=512, input_size=(7, 7), filter_size=3,
                                        padding=1, dtype="float32", math="tf32"), None),
    "split-k-bf16-heuristic": (ConvSpec(dims=2, layout="NHWC", n=1, c=512, k=512, input_size=(7, 7), filter_size=3,
                                        padding=1, dtype="bfloat16"), None),
    "split-k-bf16-uneven-ranges-pingpong": (ConvSpec(dims=2, layout="NHWC", n=1, c=200, k=72, input_size=(9, 11),
                                                     filter_size=3, padding=1, dpitch=208, dtype="bfloat16"),
                                            (64, 128, 64, 4, True, 5)),
    "split-k-fp16-odd-k-two-consumers": (ConvSpec(dims=3, layout="NDHWC", n=1, c=48, k=37, input_size=(4, 6, 5),
                                                  filter_size=3, padding=(0, 1, 1), dtype="float16"),
                                         (128, 64, 64, 3, False, 3)),
    "one-by-one": (ConvSpec(dims=2, layout="NHWC", n=2, c=128, k=256, input_size=(13, 13), filter_size=1,
                            dtype="float16"), None),
    "tf32-m-n-k-tails-stride-dilation": (ConvSpec(dims=2, layout="NHWC", n=3, c=20, k=75, input_size=(17, 23),
                                                  filter_size=3, stride=2, padding=1, dilation=(1, 2), dpitch=24,
                                                  dtype="float32", math="tf32"), (128, 64, 64, 3)),
    "tf32-3d-two-consumers": (ConvSpec(dims=3, layout="NDHWC", n=2, c=36, k=130, input_size=(5, 9, 11),
                                       filter_size=3, stride=(1, 2, 1), padding=1, dtype="float32", math="tf32"),
                              (256, 128, 128, 4)),
    "tf32-odd-k": (ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=37, input_size=(13, 11), filter_size=(3, 5),
                            padding=(1, 2), dtype="float32", math="tf32"), None),
    # 16-byte epilogue stores: a quad's transposed 16-bit pairs, FP32 pairs swapped; rows past M, groups past N
    "quad-stores-m-n-tails": (ConvSpec(dims=2, layout="NHWC", n=3, c=24, k=40, input_size=(17, 23), filter_size=3,
                                       stride=2, padding=1, dtype="float16"), (128, 64, 64, 3)),
    "pair-stores-tf32-m-n-tails": (ConvSpec(dims=2, layout="NHWC", n=3, c=20, k=44, input_size=(17, 23),
                                            filter_size=3, stride=2, padding=1, dpitch=24, dtype="float32",
                                            math="tf32"), (64, 64, 64, 3, True)),
    # clusters sharing B: 3 M tiles in clusters of 2 (the last cluster's second tile wholly past M), 3 channel tiles
    "cluster-2-tile-past-m-n-k-tails": (ConvSpec(dims=2, layout="NHWC", n=3, c=40, k=75, input_size=(17, 23),
                                                 filter_size=3, stride=2, padding=1, dilation=(1, 2), dpitch=48,
                                                 dtype="bfloat16"), (128, 32, 64, 3, False, 1, 2)),
    "cluster-2-pingpong-tf32": (ConvSpec(dims=2, layout="NHWC", n=8, c=20, k=75, input_size=(64, 66),
                                         filter_size=3, padding=1, dilation=(1, 2), dpitch=24,
                                         dtype="float32", math="tf32"), (64, 64, 64, 4, True, 1, 2)),
    "cluster-2-split-k-fp16": (ConvSpec(dims=3, layout="NDHWC", n=1, c=48, k=37, input_size=(4, 10, 9),
                                        filter_size=3, padding=(0, 1, 1), dtype="float16"),
                               (64, 64, 64, 3, False, 3, 2)),          # 3 M tiles: the second cluster's second past M
    "cluster-2-sixteen-row-boxes": (ConvSpec(dims=2, layout="NHWC", n=4, c=32, k=96, input_size=(64, 64),
                                             filter_size=3, dtype="bfloat16"), (64, 32, 64, 2, False, 1, 2)),
    "cluster-2-pingpong-many-units": (ConvSpec(dims=2, layout="NHWC", n=4, c=32, k=96, input_size=(64, 64),
                                               filter_size=3, padding=1, dtype="bfloat16"), (64, 32, 64, 3, True, 1, 2)),
    # A by TMA (C a multiple of the slice): tails, stride, dilation, a pitch past C, a tile past M in a cluster
    "tma-a-cluster-2-tile-past-m": (ConvSpec(dims=2, layout="NHWC", n=3, c=64, k=75, input_size=(17, 23),
                                             filter_size=3, stride=2, padding=1, dilation=(1, 2), dpitch=72,
                                             dtype="bfloat16"), (128, 32, 64, 3, False, 1, 2)),
    "tma-a-cluster-2-pingpong-split-k": (ConvSpec(dims=2, layout="NHWC", n=3, c=64, k=75, input_size=(17, 23),
                                                  filter_size=3, stride=2, padding=1, dilation=(1, 2), dpitch=72,
                                                  dtype="bfloat16"), (128, 64, 128, 3, True, 3, 2)),
    "tma-a-3d-strided": (ConvSpec(dims=3, layout="NDHWC", n=2, c=128, k=40, input_size=(5, 9, 11), filter_size=3,
                                  stride=(1, 2, 1), padding=1, dpitch=136, dtype="bfloat16"), None),
    "tma-a-3d-tf32-cluster-2-pingpong": (ConvSpec(dims=3, layout="NDHWC", n=2, c=32, k=70, input_size=(5, 9, 11),
                                                  filter_size=3, stride=(1, 2, 1), padding=1, dilation=(2, 1, 1),
                                                  dpitch=36, dtype="float32", math="tf32"), (64, 64, 64, 4, True, 1, 2)),
    # the last round's tiles split into K ranges (on the small grids of SMALL_GRIDS): tiles of several channel tiles, the
    # 16-byte stores and the MMA layout's (odd K), ping-pong, a cluster, A by cp.async and by TMA
    "tail-split-bf16-four-channel-tiles": (ConvSpec(dims=2, layout="NHWC", n=8, c=64, k=200, input_size=(30, 30),
                                                    filter_size=3, padding=1, dtype="bfloat16"),
                                           (128, 64, 64, 4, False, 1, 1, 128, 3)),
    "tail-split-fp16-odd-k-pingpong": (ConvSpec(dims=2, layout="NHWC", n=4, c=40, k=37, input_size=(23, 19),
                                                filter_size=3, stride=(1, 2), padding=1, dpitch=48, dtype="float16"),
                                       (64, 64, 64, 4, True, 1, 1, 128, 5)),
    "tail-split-tf32-cluster-2-pingpong": (ConvSpec(dims=2, layout="NHWC", n=8, c=32, k=96, input_size=(33, 31),
                                                    filter_size=3, padding=(0, 1), dilation=(2, 1), dtype="float32",
                                                    math="tf32"), (128, 32, 128, 5, True, 1, 2, 128, 4)),
    "tail-split-narrow-3d": (ConvSpec(dims=3, layout="NDHWC", n=2, c=96, k=64, input_size=(6, 10, 12), filter_size=3,
                                      padding=1, dtype="bfloat16"), (128, 64, 64, 8, False, 1, 2, 64, 7)),
    # 64- and 32-byte slices: A by TMA where C is a multiple of the slice, else by cp.async in the narrower swizzle
    "narrow-64-tma-c96-pingpong": (ConvSpec(dims=2, layout="NHWC", n=3, c=96, k=75, input_size=(17, 23), filter_size=3,
                                            stride=2, padding=1, dilation=(1, 2), dpitch=104, dtype="bfloat16"),
                                   (128, 128, 128, 10, True, 1, 1, 64)),
    "narrow-32-tma-c48-cluster-2-split-k": (ConvSpec(dims=2, layout="NHWC", n=3, c=48, k=75, input_size=(17, 23),
                                                     filter_size=3, stride=2, padding=1, dilation=(1, 2), dpitch=56,
                                                     dtype="bfloat16"), (64, 64, 64, 8, False, 3, 2, 32)),
    "narrow-64-tma-tf32-c16-3d": (ConvSpec(dims=3, layout="NDHWC", n=2, c=16, k=70, input_size=(5, 9, 11),
                                           filter_size=3, stride=(1, 2, 1), padding=1, dpitch=20, dtype="float32",
                                           math="tf32"), (256, 64, 128, 8, False, 1, 1, 64)),
    "narrow-32-cp-async-c40": (ConvSpec(dims=2, layout="NHWC", n=3, c=40, k=75, input_size=(17, 23), filter_size=3,
                                        stride=2, padding=1, dilation=(1, 2), dpitch=48, dtype="bfloat16"),
                               (128, 64, 64, 12, False, 1, 1, 32)),
    "narrow-64-cp-async-tf32-c20-pingpong": (ConvSpec(dims=2, layout="NHWC", n=3, c=20, k=75, input_size=(17, 23),
                                                      filter_size=3, stride=2, padding=1, dpitch=24, dtype="float32",
                                                      math="tf32"), (64, 64, 64, 8, True, 1, 1, 64)),
    "narrow-heuristic-tf32-c8": (ConvSpec(dims=2, layout="NHWC", n=2, c=8, k=40, input_size=(19, 21), filter_size=5,
                                          padding=2, dtype="float32", math="tf32"), None),
    "narrow-heuristic-bf16-c96-3d": (ConvSpec(dims=3, layout="NDHWC", n=2, c=96, k=64, input_size=(6, 10, 12),
                                              filter_size=3, padding=1, dtype="bfloat16"), None),
    "3xtf32-m-n-k-tails-two-consumers": (ConvSpec(dims=2, layout="NHWC", n=3, c=40, k=75, input_size=(17, 23),
                                                  filter_size=3, stride=2, padding=1, dilation=(1, 2), dpitch=48,
                                                  dtype="float32", math="3xtf32"), (128, 64, 64, 4, False, 1, 1, 32)),
    "3xtf32-odd-slices-pingpong": (ConvSpec(dims=2, layout="NHWC", n=4, c=96, k=70, input_size=(21, 19), filter_size=3,
                                            padding=1, dtype="float32", math="3xtf32"), (64, 128, 64, 3, True)),
    "3xtf32-cluster-2-narrow-3d": (ConvSpec(dims=3, layout="NDHWC", n=2, c=48, k=96, input_size=(5, 9, 11),
                                            filter_size=3, padding=1, dpitch=52, dtype="float32", math="3xtf32"),
                                   (128, 64, 64, 6, False, 1, 2, 64)),
    "3xtf32-split-k-uneven": (ConvSpec(dims=2, layout="NHWC", n=1, c=160, k=72, input_size=(9, 11), filter_size=3,
                                       padding=1, dtype="float32", math="3xtf32"), (64, 64, 64, 3, True, 3)),
    "3xtf32-tail-split-cluster-2": (ConvSpec(dims=2, layout="NHWC", n=8, c=32, k=96, input_size=(33, 31),
                                             filter_size=3, padding=1, dtype="float32", math="3xtf32"),
                                    (64, 128, 64, 3, True, 1, 2, 128, 4)),
    "3xtf32-heuristic": (ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=130, input_size=(20, 18), filter_size=3,
                                  padding=1, dtype="float32", math="3xtf32"), None),
    "3xtf32-two-blocks-a-thread-pingpong": (ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=70, input_size=(19, 21),
                                                     filter_size=3, padding=1, dtype="float32", math="3xtf32"),
                                            (128, 64, 128, 3, True)),
    "3xtf32-two-blocks-a-thread-one-consumer": (ConvSpec(dims=3, layout="NDHWC", n=1, c=32, k=64, input_size=(4, 9, 13),
                                                         filter_size=3, padding=1, dtype="float32", math="3xtf32"),
                                                (128, 64, 128, 3, False)),
}


def _odd_tiles(spec: ConvSpec, shape: tuple) -> MmaTiles:
    """An ODD_CASES tile tuple as WGMMA tiles."""
    width = shape[7] if len(shape) > 7 else wgmma_gemm.SLICE_CHOICES[0]
    return MmaTiles(block_m=shape[0], block_n=shape[1], block_k=wgmma_gemm.slice_k(spec, width), warp_m=shape[2],
                    warp_n=shape[1], stages=shape[3], wgmma=True, pingpong=shape[4] if len(shape) > 4 else False,
                    split_k=shape[5] if len(shape) > 5 else 1, cluster_m=shape[6] if len(shape) > 6 else 1,
                    tail_split=shape[8] if len(shape) > 8 else 1)


@pytest.mark.parametrize("name", ODD_CASES)
def test_odd_shapes_within_the_error_bound(name):
    spec, shape = ODD_CASES[name]
    tiles = FAMILY.heuristic_tiles(spec, present()) if shape is None else _odd_tiles(spec, shape)
    x, w = _inputs(spec, seed=11)
    _assert_within_bound(spec, _run(spec, x, w, tiles), x, w)


SMALL_GRIDS = {  # case: persistent blocks, so that each block takes several work units of uneven count
    "split-k-tf32-uneven-ranges-pingpong": 3,        # 10 units (2 tiles x ranges of 12, 12, 12, 12, 9 slices): 4, 3, 3
    "split-k-bf16-uneven-ranges-pingpong": 3,        # 10 units (2 tiles x ranges of 6, 6, 6, 6, 5 slices): 4, 3, 3
    "pingpong-two-tiles-per-block-tf32": 5,          # 256 tiles: 52 or 51 a block, even and odd
    "many-tiles-per-block": 7,                       # 723 tiles, one consumer warpgroup: 103 or 104 a block
    "cluster-2-pingpong-many-units": 5,              # 2 clusters of 2 blocks: 384 units of 2 M tiles, 192 a cluster
    "cluster-2-sixteen-row-boxes": 9,                # 4 clusters of 2 blocks: 363 units of 2 M tiles (1 past M in the last)
    "tma-a-3d-tf32-cluster-2-pingpong": 5,           # 2 clusters of 2 blocks, A by TMA, ping-pong
    "tail-split-bf16-four-channel-tiles": 100,       # 228 tiles: 200 whole, the last round's 28 in 3 ranges
    "tail-split-fp16-odd-k-pingpong": 11,            # 15 tiles: 11 whole, 4 in 3 ranges of 2 of the 6 slices
    "tail-split-tf32-cluster-2-pingpong": 8,         # 4 clusters: 87 units of 2 M tiles, 84 whole, 3 in 3 ranges
    "tail-split-narrow-3d": 10,                      # 5 clusters: 6 units of 2 M tiles, 5 whole, 1 in 7 ranges
    "3xtf32-odd-slices-pingpong": 5,                 # 25 tiles of 27 slices (odd: the last slice's sums in even)
    "3xtf32-tail-split-cluster-2": 10,               # 5 clusters: 64 units of 2 M tiles, 60 whole, 4 in 3 ranges of 3
}


@pytest.mark.parametrize("name", SMALL_GRIDS)
def test_odd_shapes_on_a_small_grid_within_the_error_bound(name):
    """The ring's phases and ping-pong's named barriers over many units a block: the kernel is
    persistent, so a grid planned for a few SMs runs as it would on a card with that many."""
    spec, shape = ODD_CASES[name]
    tiles = _odd_tiles(spec, shape)
    x, w = _inputs(spec, seed=13)
    _assert_within_bound(spec, _run(spec, x, w, tiles, sm_count=SMALL_GRIDS[name]), x, w)


@pytest.mark.parametrize("name", ["split-k-tf32-heuristic", "split-k-bf16-heuristic", "split-k-fp16-odd-k-two-consumers"])
def test_split_k_gives_the_same_bits_on_any_grid(name):
    """Split-K adds the ranges' partial tiles in range order, not in the order they finish: the
    output is bit for bit the same on every run and whichever blocks take the ranges (full grid,
    3 blocks, 1 block)."""
    spec, shape = ODD_CASES[name]
    tiles = FAMILY.heuristic_tiles(spec, present()) if shape is None else _odd_tiles(spec, shape)
    assert tiles.split_k > 1
    x, w = _inputs(spec, seed=17)
    runs = [_run(spec, x, w, tiles, sm_count=grid) for grid in (None, None, 3, 1)]
    assert all(np.array_equal(run, runs[0]) for run in runs[1:])
    _assert_within_bound(spec, runs[0], x, w)


def test_tf32_operands_are_truncated_as_the_plan_says():
    """Operands 1 + 3 x 2^-12, just past a TF32 rounding tie: read as TF32 by truncation they are 1,
    so every output is exactly C; rounded to nearest they would be 1 + 2^-10 (C x 1.00195...)."""
    import cupy

    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=16, k=32, input_size=(8, 8), filter_size=1, dtype="float32",
                    math="tf32")
    kernel = build("implicit_gemm", spec)
    assert kernel.plan.variant == "wgmma" and kernel.plan.tf32_truncated
    x, w = (cupy.full(shape, 1 + 3 * 2.0**-12, dtype=cupy.float32) for shape in ((1, 8, 8, 16), (32, 1, 1, 16)))
    assert (cupy.asnumpy(kernel(x, w)) == 16.0).all()


def test_three_tf32_is_accurate_where_tf32_is_not():
    """Operands 1 + 3 x 2^-12, between two TF32 values: 3xTF32's parts carry them whole (its products are within
    2^-24 of exact), so every output is C (1 + 3 x 2^-12)^2 to within its accumulation, where TF32 would be off by
    about 1e-3 (truncated to 1) or 5e-4 (rounded to 1 + 2^-10)."""
    import cupy

    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=64, k=64, input_size=(8, 8), filter_size=1, dtype="float32",
                    math="3xtf32")
    kernel = build("implicit_gemm", spec)
    assert kernel.plan.variant == "wgmma" and not kernel.plan.tf32_truncated
    value = 1 + 3 * 2.0**-12
    x, w = (cupy.full(shape, value, dtype=cupy.float32) for shape in ((1, 8, 8, 64), (64, 1, 1, 64)))
    exact = 64 * value * value
    assert np.abs(cupy.asnumpy(kernel(x, w)).astype(np.float64) - exact).max() <= 1e-5 * exact


def test_three_tf32_carries_nan_from_the_input_and_the_filter_to_the_output():
    """A NaN in x reaches every output of its pixel, one in w every output of its channel; the rest stay finite.
    The NaNs are those the split's integer rounding would lose: CUDA's canonical NaN (all mantissa bits set, the
    rounding carries out of it), a negative one, and one whose payload lies in the 13 bits below TF32's cut."""
    import cupy

    def nan(bits):
        return np.frombuffer(np.uint32(bits).tobytes(), dtype=np.float32)[0]

    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=64, k=64, input_size=(8, 8), filter_size=1, dtype="float32",
                    math="3xtf32")
    kernel = build("implicit_gemm", spec)
    assert kernel.plan.variant == "wgmma"
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((1, 8, 8, 64)).astype(np.float32), rng.standard_normal((64, 1, 1, 64)).astype(np.float32)
    x[0, 2, 3, 5], x[0, 5, 6, 60], x[0, 7, 0, 0] = nan(0x7FFFFFFF), nan(0x7F800001), np.float32(np.nan)
    w[7, 0, 0, 9], w[40, 0, 0, 63] = nan(0x7FFFFFFF), nan(0xFFFFFFFF)
    y = cupy.asnumpy(kernel(cupy.asarray(x), cupy.asarray(w)))
    expected = np.zeros(y.shape, dtype=bool)
    expected[0, 2, 3, :] = expected[0, 5, 6, :] = expected[0, 7, 0, :] = True
    expected[..., 7] = expected[..., 40] = True
    np.testing.assert_array_equal(np.isnan(y), expected)


def test_an_output_off_the_16_byte_stores_alignment_is_refused():
    """The 16-byte epilogue stores need y 16-byte aligned: a view 8 bytes in is refused at launch, not stored
    misaligned."""
    import cupy

    from codegen.api import LaunchError

    spec = ODD_CASES["quad-stores-m-n-tails"][0]
    kernel = build("implicit_gemm", spec, _odd_tiles(spec, ODD_CASES["quad-stores-m-n-tails"][1]))
    assert kernel.plan.context.store_mode == "quad"
    x, w = (cupy.asarray(a) for a in _inputs(spec, seed=5))
    shape = kernel.plan.output.shape
    y = cupy.empty(int(np.prod(shape)) + 4, dtype=cupy.float16)[4:].reshape(shape)
    with pytest.raises(LaunchError, match="aligned"):
        kernel(x, w, out=y)


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
    """Both results lie within the bound of the exact one, so they differ by at most twice it (3xtf32
    against cuDNN's FP32)."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F

    assume(wgmma_gemm.preferred(spec))   # else the heuristic takes mma.sync
    x, w = _inputs(spec, seed)
    ours = _run(spec, x, w, FAMILY.heuristic_tiles(spec, present()))
    dtype = {DType.float16: torch.float16, DType.bfloat16: torch.bfloat16, DType.float32: torch.float32}[spec.dtype]
    inputs = [torch.from_numpy(precision.from_storage(a, spec.dtype)).to("cuda")[..., : spec.c].movedim(-1, 1)
              .to(dtype).contiguous() for a in (x, w)]
    conv = F.conv2d if spec.dims == 2 else F.conv3d
    allowed = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = spec.math is MathMode.tf32      # TF32 as PyTorch's default; FP32 for 3xtf32
    try:
        theirs = conv(*inputs, stride=spec.stride, padding=spec.padding, dilation=spec.dilation).movedim(1, -1)
    finally:
        torch.backends.cudnn.allow_tf32 = allowed
    bound = precision.error_bound(spec, x, w, tf32_truncated=spec.math is MathMode.tf32)
    excess = np.abs(ours - theirs.double().cpu().numpy()) - 2 * bound
    assert not (excess > 0).any(), f"{spec.describe()}: {int((excess > 0).sum())} output(s) differ from PyTorch's"


@pytest.mark.parametrize("name", ["m-n-k-tails-stride-dilation", "3d-padded-strided", "tf32-m-n-k-tails-stride-dilation",
                                  "tma-a-3d-strided", "narrow-32-tma-c48-cluster-2-split-k", "3xtf32-heuristic",
                                  "3xtf32-cluster-2-narrow-3d"])
def test_emitted_selftest_passes_on_the_gpu(name, tmp_path):
    """The standalone file, built with plain nvcc for sm_90a, checks itself against its CPU reference
    (the heuristic's tiles; the case's own for narrow slices, whose maps take another swizzle)."""
    spec, shape = ODD_CASES[name]
    tiles = _odd_tiles(spec, shape).to_dict() if name.startswith("narrow") else None
    path = emit("implicit_gemm", spec, tmp_path / "kernel.cu", tiles, target="h100")
    built = subprocess.run(["nvcc", *build_flags(path.read_text()), "-DCONVGEN_SELFTEST", str(path), "-o",
                            str(tmp_path / "selftest")], capture_output=True, text=True)
    assert built.returncode == 0, built.stderr
    run = subprocess.run([str(tmp_path / "selftest")], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("PASS"), run.stdout + run.stderr
