"""Shape fuzzing: Hypothesis strategies over valid specs, and the check that a kernel is right.

The same strategies drive the test suite and ``convgen fuzz``; Hypothesis shrinks a failure to
the smallest spec that still fails, which is what a bug report needs.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from codegen.index import IndexAlgebra
from codegen.spec import ConvSpec, Layout, SpecError


@st.composite
def specs(draw, dims: int | None = None, layouts: tuple[Layout, ...] | None = None, max_size: int = 12,
          max_channels: int = 9, vector_pitch: bool | None = None, max_elements: int = 1 << 18,
          max_k: int = 4, max_filter: int | None = None, min_k: int = 1) -> ConvSpec:
    """Valid small specs: sizes of 1, padding, dilation, strides larger than the filter, odd pitches.

    ``vector_pitch=True`` draws channels-last specs whose pitch is a multiple of 4 (the DECX kernels);
    False draws pitches that are not; None either."""
    dims = dims or draw(st.sampled_from((2, 3)))
    allowed = [l for l in (layouts or tuple(Layout)) if l.dims == dims]
    if vector_pitch is not None:
        allowed = [l for l in allowed if l.channels_last]
    layout = draw(st.sampled_from(allowed))
    size_cap = max_size if dims == 2 else max(4, max_size // 2)
    sizes = tuple(draw(st.integers(1, size_cap)) for _ in range(dims))
    filters = tuple(draw(st.integers(1, max_filter or (4 if dims == 3 else 5))) for _ in range(dims))
    dilation = tuple(draw(st.integers(1, 3)) for _ in range(dims))
    padding = tuple(draw(st.integers(0, 3)) for _ in range(dims))
    stride = tuple(draw(st.integers(1, 4)) for _ in range(dims))
    c = draw(st.integers(1, max_channels))
    dpitch = None
    if layout.channels_last:
        if vector_pitch is True:
            dpitch = draw(st.sampled_from((4, 8, 12, 16, 20, 24, 36)).filter(lambda p: p >= c) if c <= 36 else st.just(-(-c // 4) * 4))
        elif vector_pitch is False:
            dpitch = draw(st.integers(c, c + 3).filter(lambda p: p % 4 != 0))
        else:
            dpitch = draw(st.one_of(st.none(), st.integers(c, c + 5)))
    n = draw(st.integers(1, 3))
    assume(all(d * (f - 1) + 1 <= size + 2 * p for size, f, p, d in zip(sizes, filters, padding, dilation)))
    spec = ConvSpec(dims=dims, layout=layout, n=n, c=c, k=draw(st.integers(min_k, max_k)), input_size=sizes,
                    filter_size=filters, stride=stride, padding=padding, dilation=dilation, dpitch=dpitch)
    alg = IndexAlgebra(spec)
    assume(alg.rows * alg.cols <= max_elements and alg.image_elements <= max_elements)
    return spec


@st.composite
def tma_specs(draw, dims: int, max_h: int = 40, max_w: int = 160) -> ConvSpec:
    """Specs tiled_tma takes (channels-first, stride 1 along H and W, W a multiple of 4), all else
    free: padding, dilation, depth stride, N, C, K, and (by default) widths past one 128-column tile."""
    sizes = (*(draw(st.integers(1, 6)) for _ in range(dims - 2)), draw(st.integers(1, max_h)),
             4 * draw(st.integers(1, max_w // 4)))
    filters = tuple(draw(st.integers(1, 3 if j < dims - 2 else 5)) for j in range(dims))
    dilation = tuple(draw(st.integers(1, 2)) for _ in range(dims))
    padding = tuple(draw(st.integers(0, 3)) for _ in range(dims))
    stride = (*(draw(st.integers(1, 2)) for _ in range(dims - 2)), 1, 1)
    assume(all(d * (f - 1) + 1 <= size + 2 * p for size, f, p, d in zip(sizes, filters, padding, dilation)))
    return ConvSpec(dims=dims, layout="NCHW" if dims == 2 else "NCDHW", n=draw(st.integers(1, 2)),
                    c=draw(st.integers(1, 3)), k=draw(st.integers(1, 3)), input_size=sizes, filter_size=filters,
                    stride=stride, padding=padding, dilation=dilation)


@st.composite
def gemm_tiles(draw) -> dict:
    """Valid GEMM-core tile choices of every shape: warp layouts from 1x32 to 32x1, micro-tiles
    from 1x1 to 12x12 (12: three float4 fragment groups), 1 to 8 warps, every pipeline and load
    switch, split-K up to 3."""
    from codegen.families.gemm import GemmTiles, check_geometry

    lanes_m = draw(st.sampled_from((1, 2, 4, 8, 16, 32)))
    thread_m, thread_n = draw(st.sampled_from((1, 2, 4, 8, 12))), draw(st.sampled_from((1, 2, 4, 8, 12)))
    warp_m, warp_n = lanes_m * thread_m, (32 // lanes_m) * thread_n
    warps_m, warps_n = draw(st.sampled_from((1, 2, 4))), draw(st.sampled_from((1, 2)))
    async_copy = draw(st.booleans())
    tiles = {"block_m": warp_m * warps_m, "block_n": warp_n * warps_n, "block_k": draw(st.sampled_from((4, 8, 16))),
             "warp_m": warp_m, "warp_n": warp_n, "thread_m": thread_m, "thread_n": thread_n,
             "stages": draw(st.sampled_from((1, 2, 3) if async_copy else (1, 2))), "async_copy": async_copy,
             "vector_load": draw(st.booleans()), "vector_smem": draw(st.booleans()), "precomp": draw(st.booleans()),
             "split_k": draw(st.sampled_from((1, 1, 2, 3)))}
    try:
        check_geometry(GemmTiles(**tiles))
    except SpecError:
        assume(False)
    return tiles


def relative_error(result: np.ndarray, expected: np.ndarray) -> float:
    """||result - expected|| / ||expected|| in float64 (the issue's accuracy measure for fp32)."""
    expected = np.asarray(expected, dtype=np.float64)
    scale = float(np.linalg.norm(expected)) or 1.0
    return float(np.linalg.norm(np.asarray(result, dtype=np.float64) - expected)) / scale


@dataclass
class Mismatch:
    """What a failing check found, in words fit for a bug report."""

    reason: str
    max_abs_error: float = math.nan

    def __str__(self) -> str:
        return self.reason


def compare(result: np.ndarray, expected: np.ndarray, rtol: float = 1e-5, atol: float = 1e-4) -> Mismatch | None:
    """None when ``result`` matches; NaN (an unwritten, poisoned element) never matches.

    Index bugs move whole elements (errors of order 1); the tolerance only absorbs float32
    rounding of col2im's sums."""
    result = np.asarray(result, dtype=np.float64)
    if result.shape != expected.shape:
        return Mismatch(f"shape {result.shape}, expected {expected.shape}")
    unwritten = int(np.isnan(result).sum())
    if unwritten:
        first = np.unravel_index(int(np.argmax(np.isnan(result))), result.shape)
        return Mismatch(f"{unwritten} element(s) never written (NaN), first at {tuple(map(int, first))}")
    error = np.abs(result - expected)
    excess = error - (atol + rtol * np.abs(expected))
    if (excess > 0).any():
        where = np.unravel_index(int(np.argmax(excess)), error.shape)
        return Mismatch(f"wrong value at {tuple(map(int, where))}: got {result[where]!r}, "
                        f"expected {expected[where]!r}", float(error.max()))
    return None


def run_on_gpu(family: str, spec: ConvSpec, tiles=None, seed: int = 0, kernel=None) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel on random inputs with a NaN-poisoned output; return (result, float64 reference)."""
    import cupy

    from codegen.api import build
    from codegen.families import get_family

    fam = get_family(family)
    kernel = kernel or build(family, spec, tiles)
    inputs = fam.make_inputs(spec, np.random.default_rng(seed))
    device_inputs = [cupy.asarray(x) for x in inputs]
    out = cupy.full(kernel.plan.output.shape, cupy.nan, dtype=cupy.float32)
    kernel(*device_inputs, out=out)
    return cupy.asnumpy(out), fam.reference(spec, *inputs)


def cancellation(family: str, spec: ConvSpec, seed: int = 0) -> float:
    """How much the outputs on the inputs of ``seed`` cancel: ||conv(|x|, |w|)|| over
    sqrt(C * taps) * ||conv(x, w)||.  Float32 rounding grows with the sum of the products' sizes,
    the output's norm shrinks with cancellation, so a relative-error bound tuned on ordinary outputs
    (where this is about 0.7) scales by it on a few outputs that nearly cancel."""
    from codegen.families import get_family

    fam = get_family(family)
    x, w = fam.make_inputs(spec, np.random.default_rng(seed))
    magnitude = float(np.linalg.norm(fam.reference(spec, np.abs(x), np.abs(w))))
    scale = float(np.linalg.norm(fam.reference(spec, x, w))) or 1.0
    return magnitude / (math.sqrt(spec.c * math.prod(spec.filter_size)) * scale)


def check_on_gpu(family: str, spec: ConvSpec, tiles=None, seed: int = 0) -> Mismatch | None:
    result, expected = run_on_gpu(family, spec, tiles, seed)
    return compare(result, expected)


def check_index_maps(family: str, spec: ConvSpec, seed: int = 0) -> Mismatch | None:
    """CPU check: evaluate the sympy index maps with numpy over every output element and compare
    with the family's reference (what a GPU-less fuzz run can check)."""
    from codegen.families import get_family
    from codegen.maps import evaluate

    fam = get_family(family)
    inputs = fam.make_inputs(spec, np.random.default_rng(seed))
    return compare(evaluate(family, spec, *inputs), fam.reference(spec, *inputs))


def spec_command(family: str, spec: ConvSpec, tiles=None) -> str:
    """A ready-to-paste ``convgen run`` command that reproduces ``spec``."""
    parts = [f"convgen run {family}", f"--dims {spec.dims}", f"--layout {spec.layout.value}",
             f"--n {spec.n}", f"--c {spec.c}", f"--k {spec.k}",
             "--input " + " ".join(map(str, spec.input_size)),
             "--filter " + " ".join(map(str, spec.filter_size)),
             "--stride " + " ".join(map(str, spec.stride)),
             "--padding " + " ".join(map(str, spec.padding)),
             "--dilation " + " ".join(map(str, spec.dilation))]
    if spec.dpitch is not None:
        parts.append(f"--dpitch {spec.dpitch}")
    if tiles:
        parts.extend(f"--tile {k}={v}" for k, v in (tiles.to_dict() if hasattr(tiles, "to_dict") else tiles).items())
    return " ".join(parts)


def fuzz(family: str, examples: int, on_gpu: bool, tiles=None, seed: int | None = None,
         progress=None) -> tuple[ConvSpec, Mismatch] | None:
    """Search for a spec on which ``family`` is wrong; returns the shrunk (spec, mismatch) or None."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample

    check = check_on_gpu if on_gpu else check_index_maps
    tried = [0]

    def wrong(spec: ConvSpec) -> bool:
        tried[0] += 1
        if progress:
            progress(tried[0], spec)
        try:
            return (check(family, spec, tiles) if on_gpu else check(family, spec)) is not None
        except SpecError:
            return False

    kwargs = {"database": None, "max_examples": examples, "deadline": None,
              "suppress_health_check": list(HealthCheck),
              "phases": [Phase.generate, Phase.shrink]}
    try:
        found = find(specs(), wrong, settings=settings(**kwargs), random=_random(seed))
    except NoSuchExample:
        return None
    mismatch = check(family, found, tiles) if on_gpu else check(family, found)
    return found, mismatch or Mismatch("fails intermittently (a race?)")


def _random(seed: int | None):
    import random

    return random.Random(seed) if seed is not None else None
