"""GPU tier of issue 35's launch limits: grids past CUDA's limits, laid over z, write every output
once and right.

Real grids: the direct kernel of the issue's 20 GB problem (5e9 blocks along x) and a col2im
whose channel axis needs 68750 blocks along y.  im2col and implicit GEMM cannot reach 2^31 blocks
on an 80 GB card: their blocks write at least 32 outputs each (im2col: 32 or more columns of a
32-thread block; implicit GEMM: a CTA tile of at least 32 outputs), so 2^31 blocks need 2^36
outputs, 256 GiB.  Their folded code is run with CUDA's limits patched small
(``folded_everywhere``): the same prologue and block index, on small problems, against the
float64 reference."""
import contextlib
from unittest import mock

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codegen import launch_limits
from codegen.fuzz import compare, gemm_tiles, run_on_gpu, specs
from codegen.spec import ConvSpec, Layout

pytestmark = pytest.mark.gpu
GPU = settings.get_profile("gpu")


@contextlib.contextmanager
def folded_everywhere(x_limit: int = 2):
    """CUDA's grid x limit patched so that every launch of more than ``x_limit`` blocks folds
    (restored after); y folds run for real in the col2im test."""
    with mock.patch.object(launch_limits, "GRID_X_MAX", x_limit):
        yield


def _free_bytes() -> int:
    import cupy

    return cupy.cuda.runtime.memGetInfo()[0]


def test_the_20_gb_direct_problem_of_issue_35_writes_every_output():
    """build()'s heuristic kernel (tiled_halo, one block per output) on 5000 x 1e6 outputs: 5e9
    blocks along x, laid out as 3 layers over z; every output is checked exactly (one product)."""
    import cupy

    spec = ConvSpec(dims=2, layout="NCHW", n=5000, c=1, k=1_000_000, input_size=(1, 1), filter_size=(1, 1))
    if _free_bytes() < 26 << 30:
        pytest.skip("needs 26 GB of free device memory")
    from codegen import build

    kernel = build("direct", spec)
    (launch,) = kernel.plan.launches
    assert launch.grid[0] == 5_000_000_000 and launch.fold is not None and launch.launch_grid[2] == 3
    rng = cupy.random.default_rng(35)
    x = rng.uniform(0.5, 1.5, size=(5000, 1, 1, 1), dtype=cupy.float32)
    w = rng.uniform(0.5, 1.5, size=(1_000_000, 1, 1, 1), dtype=cupy.float32)
    y = cupy.full((5000, 1_000_000, 1, 1), cupy.nan, dtype=cupy.float32)
    kernel(x, w, out=y)
    cupy.cuda.get_current_stream().synchronize()
    images, filters = x.reshape(-1), w.reshape(-1)
    wrong = 0
    for first in range(0, 5000, 250):
        rows = y[first:first + 250].reshape(250, -1)
        wrong += int(cupy.count_nonzero(rows != images[first:first + 250, None] * filters[None, :]))
    assert wrong == 0, f"{wrong} of 5e9 outputs wrong or unwritten"
    del y


def test_a_col2im_channel_grid_of_68750_blocks_along_y_writes_every_element():
    from codegen import plan

    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=2_200_000, k=1, input_size=(2, 2), filter_size=1)
    (launch,) = plan("col2im", spec, {"algorithm": "gather"}).launches
    assert launch.fold.axis == "y" and launch.grid[1] == 68_750
    for tiles in ({"algorithm": "gather"}, {"algorithm": "scatter"}):
        result, expected = run_on_gpu("col2im", spec, tiles, seed=3)
        assert compare(result, expected) is None


def _folded_matches(family: str, spec: ConvSpec, tiles, seed: int) -> None:
    """Under ``folded_everywhere``, the spec's kernels against the reference; only examples where some
    launch really folds count (hypothesis draws others again), and tiles the spec cannot take are
    not the subject here (the fuzz counts those apart)."""
    from codegen import plan
    from codegen.spec import SpecError

    with folded_everywhere():
        try:
            launches = plan(family, spec, tiles).launches
        except SpecError:
            assume(False)
        assume(any(launch.fold for launch in launches))
        result, expected = run_on_gpu(family, spec, tiles, seed)
    assert compare(result, expected) is None


@GPU
@given(spec=specs(), seed=st.integers(0, 2**16), vectorized=st.booleans(), threads=st.sampled_from((32, 64, 256)))
def test_im2col_folded(spec, seed, vectorized, threads):
    vectorized = vectorized and spec.layout.channels_last and spec.pitch % 4 == 0
    _folded_matches("im2col", spec, {"vectorized": vectorized, "threads": threads, "pixels": 32}, seed)


@GPU
@given(spec=specs(), seed=st.integers(0, 2**16), algorithm=st.sampled_from(("gather", "scatter")))
def test_col2im_folded(spec, seed, algorithm):
    _folded_matches("col2im", spec, {"algorithm": algorithm, "threads": 32}, seed)


@GPU
@given(spec=specs(max_k=5), seed=st.integers(0, 2**16),
       variant=st.sampled_from(("basic", "constant", "tiled_halo", "tiled_cache")))
def test_direct_folded(spec, seed, variant):
    _folded_matches("direct", spec, {"variant": variant, "threads": 32, "tile_h": 4, "tile_w": 4}, seed)


@GPU
@given(spec=specs(layouts=(Layout.NCHW, Layout.NCDHW), max_k=3), seed=st.integers(0, 2**16))
def test_direct_register_tile_folded(spec, seed):
    _folded_matches("direct", spec, {"variant": "tiled_register"}, seed)


@GPU
@given(spec=specs(max_k=40), seed=st.integers(0, 2**16), tiles=gemm_tiles())
def test_implicit_gemm_folded(spec, seed, tiles):
    _folded_matches("implicit_gemm", spec, tiles, seed)


@GPU
@given(spec=specs(max_k=20), seed=st.integers(0, 2**16), chunked=st.booleans())
def test_im2win_and_im2col_gemm_folded(spec, seed, chunked):
    _folded_matches("im2win", spec, {"batch_chunk": 1} if chunked else None, seed)
    _folded_matches("im2col_gemm", spec, {"batch_chunk": 1} if chunked else None, seed)


def test_folded_kernels_really_fold_under_the_patched_limits():
    """The patch reaches the plans the tests above build: without it these would test nothing."""
    from codegen import plan

    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=8, input_size=(16, 16), filter_size=3, padding=1)
    with folded_everywhere():
        for family in ("im2col", "col2im", "direct", "implicit_gemm", "im2win"):
            assert any(launch.fold for launch in plan(family, spec).launches), family
    assert not any(launch.fold for launch in plan("im2col", spec).launches)
