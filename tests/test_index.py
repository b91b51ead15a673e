"""The sympy index maps, evaluated with numpy, against the slicing references (no GPU)."""
import itertools
import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from codegen import index, maps
from codegen.fuzz import check_index_maps, specs, tma_specs
from codegen.index import IndexAlgebra, bounds_check
from codegen.spec import ConvSpec, Layout
from codegen.terms.gemm import (gemm_terms, row_table, tap_mask_bits, tap_mask_patterns, unselected_addresses_inside,
                                warp_lane_layout)
from codegen.terms.im2win import window_tensor_shape
from codegen.terms.implicit_gemm import gather_slices, gather_terms, im2col_map_terms


@given(spec=specs(dims=2), seed=st.integers(0, 2**16))
def test_im2col_maps_2d(spec, seed):
    assert check_index_maps("im2col", spec, seed) is None


@given(spec=specs(dims=3, max_size=10), seed=st.integers(0, 2**16))
def test_im2col_maps_3d(spec, seed):
    assert check_index_maps("im2col", spec, seed) is None


@given(spec=specs(dims=2), seed=st.integers(0, 2**16))
def test_col2im_maps_2d(spec, seed):
    assert check_index_maps("col2im", spec, seed) is None


@given(spec=specs(dims=3, max_size=10), seed=st.integers(0, 2**16))
def test_col2im_maps_3d(spec, seed):
    assert check_index_maps("col2im", spec, seed) is None


@given(spec=specs(max_size=9), seed=st.integers(0, 2**16))
def test_direct_maps(spec, seed):
    assert check_index_maps("direct", spec, seed) is None


EDGE_SPECS = [
    ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(1, 1), filter_size=(1, 1)),
    ConvSpec(dims=2, layout="NHWC", n=1, c=1, k=1, input_size=(1, 1), filter_size=(3, 3), padding=1),
    ConvSpec(dims=2, layout="NCHW", n=2, c=2, k=1, input_size=(9, 7), filter_size=(2, 2), stride=(5, 3)),
    ConvSpec(dims=3, layout="NDHWC", n=1, c=3, k=1, input_size=(1, 4, 5), filter_size=(1, 2, 3), stride=(1, 3, 4),
             padding=(0, 2, 1), dilation=(1, 2, 1), dpitch=7),
    ConvSpec(dims=3, layout="NCDHW", n=2, c=2, k=1, input_size=(3, 3, 3), filter_size=(3, 3, 3), padding=2,
             dilation=2),
]


@pytest.mark.parametrize("spec", EDGE_SPECS, ids=lambda s: s.describe())
@pytest.mark.parametrize("family", ["im2col", "col2im", "direct"])
def test_edge_cases_sizes_of_one_and_strides_larger_than_the_filter(family, spec):
    assert check_index_maps(family, spec) is None


def brute_output_size(size, f, s, p, d):
    return sum(1 for o in range(size + 2 * p + 1) if o * s + d * (f - 1) <= size + 2 * p - 1)


@given(size=st.integers(1, 40), f=st.integers(1, 6), s=st.integers(1, 5), p=st.integers(0, 4), d=st.integers(1, 4))
def test_output_size_matches_counting_windows(size, f, s, p, d):
    if d * (f - 1) + 1 > size + 2 * p:
        return
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(size, 1), filter_size=(f, 1), stride=(s, 1),
                    padding=(p, 0), dilation=(d, 1))
    assert spec.output_size[0] == brute_output_size(size, f, s, p, d)


@given(spec=specs(dims=2, max_size=9))
def test_pruned_bounds_checks_are_sound(spec):
    """Every bounds-check side left out of the C condition really can never fail."""
    alg = IndexAlgebra(spec)
    condition = bounds_check(alg)
    for j in range(spec.dims):
        coords = [o * spec.stride[j] - spec.padding[j] + k * spec.dilation[j]
                  for o, k in itertools.product(range(alg.out_size[j]), range(spec.filter_size[j]))]
        if f"i{j} >= 0" not in condition:
            assert min(coords) >= 0
        if f"i{j} < {spec.input_size[j]}" not in condition:
            assert max(coords) < spec.input_size[j]


def test_index_type_is_proved_from_the_largest_index():
    small = ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=1, input_size=(32, 32), filter_size=(3, 3), padding=1)
    assert IndexAlgebra(small).index_type() == "int"
    assert IndexAlgebra(small).largest_index() == 27 * 2048 - 1
    # conv4 of the benchmark at batch 128: a 3136 x 1,520,768 column matrix (4.8e9 elements).
    large = ConvSpec(dims=2, layout="NCHW", n=128, c=64, k=64, input_size=(224, 224), filter_size=(7, 7), stride=2)
    alg = IndexAlgebra(large)
    assert alg.rows * alg.cols > 2**31
    assert alg.largest_index() == alg.rows * alg.cols - 1
    assert alg.index_type() == "long long"


def test_direct_kernels_prove_their_index_type_without_the_column_matrix():
    """The 9x9 filter on 8192^2: its column matrix has 81 x 2^26 > 2^31 elements, which im2col
    addresses and the direct kernels never form, so they keep 32-bit arithmetic."""
    from codegen.api import plan

    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(8192, 8192), filter_size=(9, 9), padding=4)
    assert plan("im2col", spec).context.idx_t == "long long"
    for variant in ("basic", "tiled_halo", "tiled_register"):
        context = plan("direct", spec, {"variant": variant}).context
        assert context.idx_t == "int" and context.largest_index < 2**31


def test_implicit_gemm_proves_its_index_type_without_the_column_matrix():
    """conv4's column matrix (4.8e9 elements) is never formed by implicit GEMM, so its kernel
    keeps 32-bit offsets; an image past 2^31 elements still needs 64 bits, and so does a pixel
    count that passes 2^31 once rounded up to whole tiles of 96 pixels."""
    from codegen.api import plan

    conv4 = ConvSpec(dims=2, layout="NCHW", n=128, c=64, k=64, input_size=(224, 224), filter_size=(7, 7), stride=2)
    assert plan("im2col", conv4).context.idx_t == "long long"
    assert plan("implicit_gemm", conv4).context.idx_t == "int"
    huge_image = ConvSpec(dims=2, layout="NCHW", n=9, c=1, k=1, input_size=(16384, 16384), filter_size=(1, 1))
    assert plan("implicit_gemm", huge_image).context.idx_t == "long long"
    long_row = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(1, 2**31 - 1), filter_size=(1, 1))
    assert plan("implicit_gemm", long_row).context.idx_t == "int"
    tiles_of_96 = {"block_m": 96, "block_n": 32, "warp_m": 48, "warp_n": 32, "thread_m": 12, "thread_n": 4}
    context = plan("implicit_gemm", long_row, tiles_of_96).context
    assert context.idx_t == "long long" and context.largest_index >= 2**31


def test_index_type_counts_the_padded_thread_grid():
    """A buffer just under 2^31 elements still needs 64 bits when the rounded-up grid passes 2^31."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(1, 2**31 - 1), filter_size=(1, 1))
    alg = IndexAlgebra(spec)
    assert alg.index_type() == "int"
    assert alg.index_type(padded_threads=2**31 + 255) == "long long"


def test_max_over_box_refuses_what_it_cannot_prove():
    import sympy

    x = sympy.Symbol("x", integer=True, nonnegative=True)
    assert index.max_over_box(3 * x + 2, {x: 4}) == 14
    with pytest.raises(ValueError, match="negative coefficients"):
        index.max_over_box(5 - x, {x: 4})


def test_printed_c_uses_integer_division_and_folded_constants():
    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=1, input_size=(8, 10), filter_size=(3, 3), stride=2,
                    padding=1, dpitch=4)
    alg = IndexAlgebra(spec)
    assert [index.to_c(e) for e in alg.col_coords] == ["((col) / 20)", "((((col) / 5)) % 4)", "((col) % 5)"]
    assert index.to_c(alg.x_offset) == "c + 40*i0 + 4*i1 + 320*n"
    assert index.to_c(alg.row_of) == "c + 3*kk"
    assert "." not in "".join(index.to_c(e) for e in alg.col_coords + alg.tap_coords)


def test_lambdified_maps_agree_with_python_integer_arithmetic():
    spec = ConvSpec(dims=3, layout="NCDHW", n=2, c=3, k=1, input_size=(4, 5, 6), filter_size=(2, 2, 3), stride=(1, 2, 1))
    alg = IndexAlgebra(spec)
    coords = [index.lambdify([alg.col], e) for e in alg.col_coords]
    extents = (spec.n, *alg.out_size)
    for col in range(alg.cols):
        expected = np.unravel_index(col, extents)
        assert [int(f(col)) for f in coords] == [int(v) for v in expected]
    assert alg.cols == math.prod(extents)


@given(spec=specs(max_size=14, max_filter=11, max_channels=5, max_k=6), seed=st.integers(0, 2**16),
       family=st.sampled_from(("implicit_gemm", "im2win")))
def test_gemm_maps_with_large_filters(spec, seed, family):
    """The GEMM view (per-pixel base + per-row delta, the precomputed table, the im2win tensor)
    against the slicing reference, with filters up to 11 taps per axis."""
    assert check_index_maps(family, spec, seed) is None


def test_row_table_is_exact_where_float_division_rounds_down():
    """floor(49/49) evaluated as floor(49 * (1/49)) is 0: the table must use integer division."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=3, k=1, input_size=(20, 20), filter_size=(7, 7), stride=2)
    alg = IndexAlgebra(spec)
    table = row_table(alg, gemm_terms(alg, "image"))
    expected = [c * 400 + r * 20 + s for c in range(3) for r in range(7) for s in range(7)]
    assert [entry[0] for entry in table] == expected


@pytest.mark.parametrize("filter_size, padding, bits", [((3, 3), 0, 0), ((3, 3), 1, 32), ((1, 5), (0, 2), 32),
                                                        ((7, 7), 3, 64), ((9, 9), 4, 0)])
def test_tap_mask_width_follows_the_taps_and_the_padding(filter_size, padding, bits):
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=2, k=1, input_size=(12, 12), filter_size=filter_size, padding=padding)
    alg = IndexAlgebra(spec)
    assert tap_mask_bits(alg, gemm_terms(alg, "image")) == bits


def _pixels(alg):
    """(n, o...) of every output pixel, column-matrix order."""
    col = np.arange(alg.cols)
    pixel = {"n": index.evaluate(alg.col_coords[0], {"col": col})}
    pixel.update({f"o{j}": index.evaluate(e, {"col": col}) for j, e in enumerate(alg.col_coords[1:])})
    return pixel


@pytest.mark.parametrize("spec", [
    ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=2, input_size=(9, 11), filter_size=(7, 7), padding=(3, 2), dilation=(1, 2)),
    ConvSpec(dims=3, layout="NDHWC", n=1, c=2, k=3, input_size=(5, 6, 7), filter_size=(3, 2, 3), stride=(2, 1, 3),
             padding=(1, 0, 2), dilation=(2, 1, 1)),
])
def test_tap_masks_agree_with_the_per_axis_bounds_checks(spec):
    """Mask bits above 31 included (49 taps): gemm_by_maps raises when the two tests disagree."""
    alg = IndexAlgebra(spec)
    terms = gemm_terms(alg, "image")
    pixel = _pixels(alg)
    masked = maps.inside_by_tap_masks(alg, terms, pixel)
    assert masked.shape == (alg.cols, alg.rows) and 0 < masked.sum() < masked.size
    assert check_index_maps("implicit_gemm", spec, 0) is None


def test_tap_mask_factors_name_each_filter_position_of_each_padded_axis():
    """A 2 x 3 filter, dilation (1, 2), both axes padded: taps run (r, s) with s fastest, so
    position r = 1 is taps 3-5 and position s = 2 (displacement 4) is taps 2 and 5."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(6, 9), filter_size=(2, 3), padding=1,
                    dilation=(1, 2))
    alg = IndexAlgebra(spec)
    factors = tap_mask_patterns(alg, gemm_terms(alg, "image"))
    assert factors == [
        {"axis": 0, "size": 6, "positions": [{"disp": 0, "bits": 0b000111}, {"disp": 1, "bits": 0b111000}]},
        {"axis": 1, "size": 9, "positions": [{"disp": 0, "bits": 0b001001}, {"disp": 2, "bits": 0b010010},
                                             {"disp": 4, "bits": 0b100100}]}]


@given(spec=specs(max_size=10, max_filter=5, max_channels=2, max_k=1))
def test_factored_tap_masks_equal_the_per_tap_bounds_test(spec):
    """The AND over padded axes of the positions that land inside gives, for every pixel and tap,
    what testing each tap on each axis gives (taps up to 64, 3D included)."""
    alg = IndexAlgebra(spec)
    terms = gemm_terms(alg, "image")
    assume(tap_mask_bits(alg, terms))
    pixel = _pixels(alg)
    kk = np.arange(alg.taps)
    inside = np.ones((alg.cols, alg.taps), dtype=bool)
    for check in terms["a_checked"]:
        j = check["axis"]
        origin = index.evaluate(terms["exprs"]["a_origin"][j], pixel)
        coordinate = origin[:, None] + index.evaluate(alg.tap_coords[j], {"kk": kk})[None, :] * spec.dilation[j]
        inside &= (coordinate >= 0) & (coordinate < check["size"])
    row_taps = np.array(row_table(alg, terms, tap_masks=True))[:, 1]
    assert np.array_equal(maps.inside_by_tap_masks(alg, terms, pixel), inside[:, row_taps])


@given(spec=specs(max_size=12, max_filter=7), seed=st.integers(0, 2**16))
def test_im2win_transform_maps_match_slicing(spec, seed):
    """The im2win tensor through the transform's maps equals the one cut from a padded image."""
    from codegen.families.im2win import window_tensor_reference
    from codegen.maps import window_tensor_by_maps

    alg = IndexAlgebra(spec)
    x = np.random.default_rng(seed).uniform(-1, 1, alg.image_shape)
    expected = window_tensor_reference(spec, x)
    assert expected.shape == window_tensor_shape(alg)
    assert np.array_equal(window_tensor_by_maps(alg, x), expected)


@given(spec=specs(max_size=10, max_filter=5, max_channels=3, max_k=3), chunk=st.integers(1, 2),
       chunks=st.integers(2, 3), seed=st.integers(0, 2**16))
def test_im2win_chunks_cover_the_batch(spec, chunk, chunks, seed):
    """A chunked im2win plan, run step by step through its schedule's offsets on the CPU, writes
    every output once and right; its workspace holds one chunk's im2win tensor."""
    from codegen.api import plan as make_plan
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import im2win_chunks_by_maps
    from codegen.spec import replace

    spec = replace(spec, n=chunk * chunks)
    plan = make_plan("im2win", spec, {"batch_chunk": chunk})
    assert plan.chunks == chunks and len(list(plan.schedule)) == 2 * chunks
    assert plan.workspaces[0].shape == window_tensor_shape(IndexAlgebra(replace(spec, n=chunk)))
    family = get_family("im2win")
    x, w = family.make_inputs(spec, np.random.default_rng(seed))
    assert compare(im2win_chunks_by_maps(plan, x, w), family.reference(spec, x, w)) is None


REGISTER_TILES = st.fixed_dictionaries({
    "variant": st.just("tiled_register"), "per_thread": st.sampled_from((1, 2, 4, 8)),
    "rows_per_thread": st.integers(1, 4), "threads_across": st.integers(1, 3), "threads_down": st.integers(1, 3)})


@given(spec=specs(max_size=12, max_channels=3, max_k=2), drawn=REGISTER_TILES, seed=st.integers(0, 2**16))
def test_register_tile_algebra(spec, drawn, seed):
    """tiled_register's copy origins, alignment, windows and (output row, filter row) pairs, run
    thread by thread on the CPU, against the slicing reference."""
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import register_tiles_by_terms

    tiles = {"variant": "tiled_register", "per_thread": drawn["per_thread"], "rows_per_thread": drawn["rows_per_thread"],
             "tile_w": drawn["per_thread"] * drawn["threads_across"],
             "tile_h": drawn["rows_per_thread"] * drawn["threads_down"]}
    family = get_family("direct")
    x, w = family.make_inputs(spec, np.random.default_rng(seed))
    assert compare(register_tiles_by_terms(spec, tiles, x, w), family.reference(spec, x, w)) is None


@settings(max_examples=40, deadline=None)
@given(spec=st.sampled_from((2, 3)).flatmap(lambda dims: tma_specs(dims, max_h=16)), rows=st.integers(1, 3),
       warps=st.sampled_from((1, 2)), seed=st.integers(0, 2**16))
def test_tma_tile_algebra(spec, rows, warps, seed):
    """tiled_tma's box (origin, 16-byte-aligned first column, rows x pitch, zeros outside the
    image), windows and (output row, filter row) pairs, run thread by thread on the CPU, against
    the slicing reference: the geometry the GPU tests exercise, checked in CI without a GPU."""
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import register_tiles_by_terms

    tiles = {"variant": "tiled_tma", "rows_per_thread": rows, "tile_h": rows * warps}
    family = get_family("direct")
    x, w = family.make_inputs(spec, np.random.default_rng(seed))
    assert compare(register_tiles_by_terms(spec, tiles, x, w), family.reference(spec, x, w)) is None


TMA_GEMM_TILES = st.sampled_from(((32, 64, 8), (64, 64, 8), (128, 64, 8), (256, 64, 8), (32, 128, 8), (64, 128, 8),
                                  (128, 128, 8), (32, 256, 8), (64, 256, 8), (256, 64, 16), (256, 128, 16),
                                  (512, 64, 16))).map(
    lambda b: {"block_m": b[0], "block_n": b[1], "thread_m": b[2], "warp_m": 4 * b[2], "stages": 3})


@settings(max_examples=60, deadline=None)
@given(spec=specs(vector_pitch=True, max_channels=40, max_k=70, max_size=12), drawn=TMA_GEMM_TILES,
       seed=st.integers(0, 2**16))
def test_tma_implicit_gemm_algebra(spec, drawn, seed):
    """The TMA implicit GEMM's plan on the CPU: the filter transposed by the printed offsets, each
    slice's A tile walked through the im2col map (dims, byte strides, corners, traversal strides)
    from the producer's coordinates and tap offsets as the driver API documents the mode, B read
    through the tiled map, tiles stored where the output has them; against the slicing reference.
    Stride, padding, dilation, channel tails (C not a multiple of 32) and K tails all occur, and
    512-pixel tiles loaded as two im2col boxes."""
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import tma_gemm_by_terms

    family = get_family("implicit_gemm")
    x, w = family.make_inputs(spec, np.random.default_rng(seed))
    assert compare(tma_gemm_by_terms(spec, drawn, x, w), family.reference(spec, x, w)) is None


@settings(max_examples=60, deadline=None)
@given(spec=specs(layouts=(Layout.NCHW, Layout.NCDHW), max_channels=40, max_k=70, max_size=12), drawn=TMA_GEMM_TILES,
       seed=st.integers(0, 2**16))
def test_tma_implicit_gemm_gather_algebra(spec, drawn, seed):
    """The TMA implicit GEMM on channels-first data, on the CPU: each slice's A tile gathered by the
    printed pixel bases, origins, tap delta and channel stride, with zeros for pixels past the
    output, taps in the padding and channels past C; against the slicing reference."""
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import tma_gemm_by_terms

    family = get_family("implicit_gemm")
    x, w = family.make_inputs(spec, np.random.default_rng(seed))
    assert compare(tma_gemm_by_terms(spec, drawn, x, w), family.reference(spec, x, w)) is None


@st.composite
def same_padded_specs(draw):
    """Channels-first, unit-stride specs whose output keeps the input's extent on every axis but the
    outermost (odd filters under padding d * (f - 1) / 2 there), so that pixels are contiguous."""
    dims = draw(st.sampled_from((2, 3)))
    filters = [draw(st.sampled_from((1, 3, 5))) for _ in range(dims)]
    dilation = [draw(st.integers(1, 2)) for _ in range(dims)]
    same = [d * (f - 1) // 2 for f, d in zip(filters, dilation)]
    padding = [draw(st.one_of(st.just(same[0]), st.integers(0, 2)))] + same[1:]
    sizes = [draw(st.one_of(st.sampled_from((8, 16)), st.sampled_from((8, 16)), st.integers(1, 9))) for _ in range(dims)]
    assume(all(d * (f - 1) + 1 <= size + 2 * p for size, f, d, p in zip(sizes, filters, dilation, padding)))
    return ConvSpec(dims=dims, layout="NCHW" if dims == 2 else "NCDHW", n=draw(st.integers(1, 2)),
                    c=draw(st.sampled_from((32, 64))), k=draw(st.integers(1, 70)), input_size=tuple(sizes),
                    filter_size=tuple(filters), padding=tuple(padding), dilation=tuple(dilation))


@settings(max_examples=40, deadline=None)
@given(spec=same_padded_specs(), block_m=st.sampled_from((256, 512)), seed=st.integers(0, 2**16))
def test_tma_gather_shares_one_address_among_contiguous_pixels(spec, block_m, seed):
    """Where pixels are contiguous and no tile crosses an image, a producer thread addresses its
    pixels u from its first pixel's base plus u * columns: pixels_contiguous says when that is
    the printed base of each pixel, and the CPU model, addressing as the kernel does, matches the
    slicing reference; elsewhere the flag stays off."""
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import tma_gemm_by_terms

    alg = index.IndexAlgebra(spec)
    terms = gather_terms(alg)
    assert terms["pixels_contiguous"]
    pixels = math.prod(alg.out_size)
    col = np.arange(alg.cols)
    base = index.evaluate(terms["exprs"]["a_base"], dict(zip(["n", *(f"o{j}" for j in range(spec.dims))],
                                                             (index.evaluate(e, {"col": col}) for e in alg.col_coords))))
    same_image = col % pixels != 0
    assert np.array_equal(np.diff(base)[same_image[1:]], np.ones(int(same_image[1:].sum()), dtype=np.int64))
    tiles = {"block_m": block_m, "block_n": 64, "thread_m": 16, "warp_m": 64, "stages": 3}
    family = get_family("implicit_gemm")
    shared = family.plan(spec, family.complete_tiles(spec, {**tiles, "tma": True})).context.shared_row_address
    assert shared == (pixels % block_m == 0)
    x, w = family.make_inputs(spec, np.random.default_rng(seed))
    assert compare(tma_gemm_by_terms(spec, tiles, x, w), family.reference(spec, x, w)) is None
    wider = ConvSpec(**{**spec.to_dict(), "padding": (spec.padding[0], *(p + 1 for p in spec.padding[1:]))})
    assert not gather_terms(index.IndexAlgebra(wider))["pixels_contiguous"]


@st.composite
def paired_specs(draw):
    """Channels-first specs whose output rows have an even length and whose channels fill the
    32-channel slices: the gathered A tile's producer threads copy pixel pairs."""
    dims = draw(st.sampled_from((2, 3)))
    filters = [draw(st.integers(1, 4)) for _ in range(dims)]
    stride = [draw(st.integers(1, 2)) for _ in range(dims)]
    dilation = [draw(st.integers(1, 2)) for _ in range(dims)]
    padding = [draw(st.integers(0, 2)) for _ in range(dims)]
    sizes = [draw(st.integers(1, 12)) for _ in range(dims)]
    out = [(size + 2 * p - d * (f - 1) - 1) // s + 1 for size, f, s, p, d in zip(sizes, filters, stride, padding, dilation)]
    assume(min(out) > 0 and out[-1] % 2 == 0)
    return ConvSpec(dims=dims, layout="NCHW" if dims == 2 else "NCDHW", n=draw(st.integers(1, 2)),
                    c=draw(st.sampled_from((32, 64))), k=draw(st.integers(1, 70)), input_size=tuple(sizes),
                    filter_size=tuple(filters), stride=tuple(stride), padding=tuple(padding), dilation=tuple(dilation))


def _gather_plan(spec, block_m):
    from codegen.families import get_family

    tiles = {"block_m": block_m, "block_n": 64, "thread_m": 16 if block_m > 128 else 8,
             "warp_m": 64 if block_m > 128 else 32, "stages": 3}
    family = get_family("implicit_gemm")
    return tiles, family.plan(spec, family.complete_tiles(spec, {**tiles, "tma": True})).context


@settings(max_examples=40, deadline=None)
@given(spec=paired_specs(), block_m=st.sampled_from((128, 256, 512)), seed=st.integers(0, 2**16))
def test_tma_gather_copies_pixel_pairs_from_one_address(spec, block_m, seed):
    """Where output rows have an even length (and one address cannot serve all of a thread's
    pixels), a producer thread copies pixel pairs (2j, 2j + 1) from one address a channel, the
    second pixel pair_step elements on; where W's stride is 1, the input rows even and a tap's W
    offset even, a pair is one 8-byte copy.  The slice table holds each slice's offset and that
    flag; the CPU model, addressing as the kernel does (and checking every 8-byte copy's
    alignment), matches the slicing reference."""
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import tma_gemm_by_terms

    alg = index.IndexAlgebra(spec)
    terms = gather_terms(alg)
    tiles, context = _gather_plan(spec, block_m)
    shared = terms["pixels_contiguous"] and math.prod(alg.out_size) % block_m == 0
    assert context.shared_row_address == shared and context.gather_pairs == (not shared)
    assert terms["pair_step"] == spec.stride[-1] and len(context.gather_groups[0]["members"]) >= 2
    slices = gather_slices(alg, 32)
    w_even = [((kk % spec.filter_size[-1]) * spec.dilation[-1] - spec.padding[-1]) % 2 == 0
              for kk in range(alg.taps) for _ in range(spec.c // 32)]
    assert [wide for _, wide in slices] == w_even
    assert context.slice_table == ([2 * offset + wide for offset, wide in slices] if context.gather_wide == "slice"
                                      else [offset for offset, _ in slices])
    aligned = spec.stride[-1] == 1 and spec.input_size[-1] % 2 == 0
    expected_wide = ("never" if shared or not aligned or not any(w_even) else "always" if all(w_even) else "slice")
    assert context.gather_wide == expected_wide
    family = get_family("implicit_gemm")
    x, w = family.make_inputs(spec, np.random.default_rng(seed))
    assert compare(tma_gemm_by_terms(spec, tiles, x, w), family.reference(spec, x, w)) is None


def test_tma_gather_model_catches_a_wrong_pair_offset_or_a_misaligned_pair_copy(monkeypatch):
    """The CPU model addresses pixel pairs from the plan's groups and checks each 8-byte copy, so
    a pair whose second pixel reads the first one's element, or a pair copied whole at a tap whose W offset is odd, fails."""
    from codegen.families import get_family, implicit_gemm
    from codegen.fuzz import compare
    from codegen.maps import tma_gemm_by_terms

    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=32, k=8, input_size=(6, 10), filter_size=3)
    family = get_family("implicit_gemm")
    x, w = family.make_inputs(spec, np.random.default_rng(0))
    tiles = {"block_m": 256, "block_n": 64, "thread_m": 16, "warp_m": 64, "stages": 3}
    assert compare(tma_gemm_by_terms(spec, tiles, x, w), family.reference(spec, x, w)) is None
    fields = implicit_gemm.gather_fields

    def shifted(alg, tiles):
        found = fields(alg, tiles)
        return {**found, "gather_groups": [{"anchor": g["anchor"], "members": [(u, o - (u % 2)) for u, o in g["members"]]}
                                           for g in found["gather_groups"]]}
    monkeypatch.setattr(implicit_gemm, "gather_fields", shifted)
    assert compare(tma_gemm_by_terms(spec, tiles, x, w), family.reference(spec, x, w)) is not None
    monkeypatch.setattr(implicit_gemm, "gather_fields",
                        lambda alg, tiles: {**fields(alg, tiles), "gather_wide": implicit_gemm.GatherWide.ALWAYS})
    with pytest.raises(AssertionError, match="odd element"):
        tma_gemm_by_terms(spec, tiles, x, w)


def test_cpu_models_refuse_tma_copies_from_an_unaligned_innermost_coordinate():
    """TMA copies must start 16-byte aligned along the innermost dimension (an illegal instruction
    on the H100 otherwise, which no map encoding catches), so the CPU models (tma_gemm_by_terms,
    register_tiles_by_terms) hold every copy they make to the rule."""
    from codegen.maps import check_box_start

    for innermost in (-8, -4, 0, 4, 64):
        check_box_start("x", innermost)
    for innermost in (-1, 1, 2, 6):
        with pytest.raises(AssertionError, match="not 16-byte aligned"):
            check_box_start("x", innermost)


@given(spec=specs(layouts=(Layout.NCHW, Layout.NCDHW), max_channels=9, max_size=9))
def test_gather_terms_split_the_image_offset_into_pixel_tap_and_channel(spec):
    """base(pixel) + tap_delta(tap) + c * channel_stride is x_offset of the input pixel the output
    pixel reads at that tap, for every pixel, tap and channel."""
    alg = index.IndexAlgebra(spec)
    terms = gather_terms(alg)
    col = np.arange(alg.cols)
    coords = dict(zip(["n", *(f"o{j}" for j in range(spec.dims))], (index.evaluate(e, {"col": col}) for e in alg.col_coords)))
    base = index.evaluate(terms["exprs"]["a_base"], coords)
    for kk in range(alg.taps):
        taps = {f"k{j}": index.evaluate(e, {"kk": np.int64(kk)}) for j, e in enumerate(alg.tap_coords)}
        at = {str(i): index.evaluate(e, {**coords, **taps}) for i, e in zip(alg.i, alg.in_coord)}
        for c in range(spec.c):
            expected = index.evaluate(alg.x_offset, {**coords, **at, "c": np.int64(c)})
            got = base + index.evaluate(terms["exprs"]["tap_delta"], taps) + c * terms["channel_stride"]
            assert np.array_equal(np.broadcast_to(got, col.shape), np.broadcast_to(expected, col.shape))


def test_stream_k_tail_covers_every_step_once_in_near_equal_shares():
    """Data-parallel rounds (tile = block + round * blocks) then the tail in equal step spans:
    together every (tile, slice) step once; a tile is shared exactly when two blocks' work meets
    inside it."""
    from codegen.families.gemm_tiles import data_parallel_rounds, shared_tiles, stream_k_span

    for tiles, slices, blocks in ((2971, 98, 132), (137, 9, 132), (264, 9, 132), (7, 5, 7), (200, 27, 132),
                                  (6050, 18, 132)):
        rounds = data_parallel_rounds(tiles, blocks)
        spans = [stream_k_span(b, tiles, slices, blocks) for b in range(blocks)]
        covered = sorted([step for b in range(blocks) for r in range(rounds)
                          for step in range((b + r * blocks) * slices, (b + r * blocks + 1) * slices)]
                         + [step for begin, end in spans for step in range(begin, end)])
        assert covered == list(range(tiles * slices))
        assert max(e - b for b, e in spans) - min(e - b for b, e in spans) <= 1
        assert tiles - rounds * blocks < 2 * blocks
        shared = shared_tiles(tiles, slices, blocks)
        assert shared == {t for t in range(tiles)
                          if sum(b < (t + 1) * slices and e > t * slices for b, e in spans) > 1}
    assert not shared_tiles(264, 9, 132) and not shared_tiles(7, 5, 7)   # whole rounds: none shared


def test_tma_stream_k_sums_shared_tiles_on_the_cpu():
    """137 tiles of 256x64 for 132 blocks (one a SM): blocks share tiles, which the model zeroes
    first and sums; against the slicing reference (a wrong span, a missed zeroing or a store
    instead of an add fails)."""
    from codegen.families import get_family
    from codegen.fuzz import compare
    from codegen.maps import tma_gemm_by_terms

    tiles = {"block_m": 256, "block_n": 64, "stages": 3}
    family = get_family("implicit_gemm")
    for layout in ("NHWC", "NCHW"):
        spec = ConvSpec(dims=2, layout=layout, n=2, c=8, k=64, input_size=(132, 132), filter_size=3, padding=1)
        context = family.plan(spec, family.complete_tiles(spec, {**tiles, "tma": True})).context
        assert context.tiles_total == 137 and context.grid_blocks == 132
        assert context.stream_k and context.split_tiles > 0
        x, w = family.make_inputs(spec, np.random.default_rng(7))
        assert compare(tma_gemm_by_terms(spec, tiles, x, w), family.reference(spec, x, w)) is None


def test_im2col_walk_wraps_rows_and_images_inside_the_corners():
    """A 2 x 3 output grid of a 4 x 5 image (filter 2 x 3, padding (0, 1), stride (2, 2)): the walk
    from pixel (n 0, h 0, w -1) visits w -1, 1, 3 then wraps to the next output row (h 2), then to
    image 1, each shifted by the tap's offsets."""
    from codegen.families.base import TensorMap

    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=4, k=1, input_size=(4, 5), filter_size=(2, 3), stride=2,
                    padding=(0, 1))
    terms = im2col_map_terms(IndexAlgebra(spec))
    assert index.output_size(spec) == (2, 3)
    tensor_map = TensorMap("x", terms["dims"], terms["strides"], (32, 7), corners=(terms["lower"], terms["upper"]),
                           element_strides=terms["element_strides"])
    assert maps.im2col_walk(tensor_map, (0, -1, 0, 0), (2, 1), 7) == [
        (0, 1, 1), (0, 3, 1), (0, 5, 1), (0, 1, 3), (0, 3, 3), (0, 5, 3), (1, 1, 1)]


@pytest.mark.parametrize("threads", (1, 3, 7, 32, 64, 96, 256, 1024))
def test_stage_copy_split_covers_every_cell(threads):
    """Whatever the thread count against the row's units (fewer, more, not a multiple), the
    fetch's split copies every cell of the stage and none outside it."""
    from codegen.families.direct import copy_split
    from codegen.maps import stage_copies

    for units, rows in itertools.product((1, 2, 3, 5, 17, 34, 35, 36), (1, 2, 3, 9, 16, 72)):
        cells = set(stage_copies(copy_split(units, rows, threads), units, rows, 4, threads))
        assert cells == set(itertools.product(range(rows), range(4 * units))), (units, rows, threads)


def test_register_tiles_copy_16_bytes_from_an_aligned_column():
    """W = 16, padding 1: the tile's copies start 3 columns before the halo, at a multiple of 4."""
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=1, k=1, input_size=(8, 16), filter_size=3, padding=1)
    context = index_plan(spec, {"variant": "tiled_register", "per_thread": 4, "tile_w": 8, "rows_per_thread": 2,
                                "tile_h": 4})
    cols = context.axes[1]
    assert context.vector_load and context.vector_window and context.vector_store
    assert (cols["lead"], cols["aligned_origin"]) == (3, "8*tile1 - 4")
    assert context.row_units == 4 and context.row_pitch == 16      # columns 8*tile1 - 4 .. 8*tile1 + 11
    assert context.axes[0]["window_taps"][2] == [(0, 2), (1, 1)]


def index_plan(spec, tiles):
    from codegen.api import plan

    return plan("direct", spec, tiles).context


def test_cancellation_is_below_one_on_ordinary_outputs_and_above_where_they_cancel():
    """The GPU tests' float32 bound stays 1e-6 on ordinary outputs and widens only on outputs
    that nearly cancel (this 25-output case measured 1.15e-6 on the GPU)."""
    from codegen.fuzz import cancellation

    ordinary = ConvSpec(dims=2, layout="NHWC", n=2, c=20, k=40, input_size=(9, 9), filter_size=7, padding=3, dpitch=23)
    assert all(cancellation("implicit_gemm", ordinary, seed) < 0.8 for seed in range(3))
    cancelling = ConvSpec(dims=2, layout="NCHW", n=1, c=11, k=1, input_size=(5, 5), filter_size=(6, 6),
                          padding=(3, 1), dilation=(2, 1))
    assert cancellation("im2win", cancelling, 25833) > 2


def test_unselected_addresses_are_inside_only_without_padding():
    """The rule that lets GEMM kernels drop the pointer select: without padding every base + delta
    (and base alone, the table's padding rows of the residue slice) is inside the image; with padding some are not."""
    def formed(spec):
        alg = IndexAlgebra(spec)
        terms = gemm_terms(alg, "image")
        delta = np.array([entry[0] for entry in row_table(alg, terms)])
        base = index.evaluate(terms["exprs"]["a_base"], _pixels(alg))
        offsets = np.concatenate([(base[:, None] + delta[None, :]).ravel(), base])
        return unselected_addresses_inside(alg, terms), offsets.min(), offsets.max(), alg.image_elements

    unpadded = ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=1, input_size=(23, 23), filter_size=(11, 11), stride=4)
    inside, low, high, size = formed(unpadded)
    assert inside and low >= 0 and high < size
    padded = ConvSpec.from_dict({**unpadded.to_dict(), "padding": (2, 0)})
    inside, low, high, size = formed(padded)
    assert not inside and low < 0


@pytest.mark.parametrize("lanes_m", [1, 2, 4, 8, 16, 32])
def test_warp_lane_layout_places_each_lane_once_and_pairs_fragment_reads(lanes_m):
    """Each of the 32 lanes gets its own place in the warp tile, and wherever a warp is at least
    two lanes wide both ways, lanes 2i and 2i+1 share an A fragment and lanes i and i^2 a B
    fragment (the pairs that let a float4 shared-memory read return in two wavefronts)."""
    lanes_n = 32 // lanes_m
    lane = np.arange(32)
    lane_m, lane_n = (index.evaluate(e, {"lane": lane}) for e in warp_lane_layout(lanes_m, lanes_n))
    assert sorted(zip(lane_m.tolist(), lane_n.tolist())) == list(itertools.product(range(lanes_m), range(lanes_n)))
    if lanes_m > 1 and lanes_n > 1:
        assert (lane_m == lane_m[lane ^ 1]).all()
        assert (lane_n == lane_n[lane ^ 2]).all()
