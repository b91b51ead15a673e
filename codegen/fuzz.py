"""Shape fuzzing: Hypothesis strategies over valid specs, and the check that a kernel is right.

The same strategies drive the test suite and ``convgen fuzz``; Hypothesis shrinks a failure to
the smallest spec that still fails, which is what a bug report needs.
"""
from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

from codegen import precision
from codegen.precision import NAN
from codegen.index import IndexAlgebra
from codegen.spec import ConvSpec, DType, Layout, SpecError, uses_tensor_cores


PINNABLE = ("dims", "layout", "n", "c", "k", "input_size", "filter_size", "stride", "padding", "dilation", "dpitch",
            "dtype", "math")


@st.composite
def specs(draw, dims: int | None = None, layouts: tuple[Layout, ...] | None = None, max_size: int = 12,
          max_channels: int = 9, vector_pitch: bool | None = None, max_elements: int = 1 << 18,
          max_k: int = 4, max_filter: int | None = None, min_k: int = 1, pinned: dict | None = None) -> ConvSpec:
    """Valid small specs: sizes of 1, padding, dilation, strides larger than the filter, odd pitches.

    ``vector_pitch=True`` draws channels-last specs whose pitch is a multiple of 4 (the DECX kernels);
    False draws pitches that are not; None either.  ``pinned`` holds fields (of ``PINNABLE``; per-
    dimension ones as one value or one per dimension) that every spec keeps while the rest vary;
    pinned sizes lift the cap on elements, since the user asked for them."""
    pinned = pinned or {}
    if "layout" in pinned:
        layouts = (Layout(pinned["layout"]),)
    dims = dims or pin_dims(pinned) or draw(st.sampled_from((2, 3)))
    allowed = [l for l in (layouts or tuple(Layout)) if l.dims == dims]
    if vector_pitch is not None or "dpitch" in pinned:
        allowed = [l for l in allowed if l.channels_last]
    layout = draw(st.sampled_from(allowed))

    def per_dim(name: str, values: st.SearchStrategy) -> tuple[int, ...]:
        if name in pinned:
            value = pinned[name]
            return tuple(value) if isinstance(value, (tuple, list)) else (value,) * dims
        return tuple(draw(values) for _ in range(dims))

    def one(name: str, values: st.SearchStrategy):
        return pinned[name] if name in pinned else draw(values)

    size_cap = max_size if dims == 2 else max(4, max_size // 2)
    sizes = per_dim("input_size", st.integers(1, size_cap))
    filters = per_dim("filter_size", st.integers(1, max_filter or (4 if dims == 3 else 5)))
    dilation = per_dim("dilation", st.integers(1, 3))
    padding = per_dim("padding", st.integers(0, 3))
    stride = per_dim("stride", st.integers(1, 4))
    c = one("c", st.integers(1, min(max_channels, pinned.get("dpitch") or max_channels)))
    dpitch = pinned.get("dpitch")
    if layout.channels_last and "dpitch" not in pinned:
        if vector_pitch is True:
            dpitch = draw(st.sampled_from((4, 8, 12, 16, 20, 24, 36)).filter(lambda p: p >= c) if c <= 36 else st.just(-(-c // 4) * 4))
        elif vector_pitch is False:
            dpitch = draw(st.integers(c, c + 3).filter(lambda p: p % 4 != 0))
        else:
            dpitch = draw(st.one_of(st.none(), st.integers(c, c + 5)))
    n = one("n", st.integers(1, 3))
    assume(all(d * (f - 1) + 1 <= size + 2 * p for size, f, p, d in zip(sizes, filters, padding, dilation)))
    spec = ConvSpec(dims=dims, layout=layout, n=n, c=c, k=one("k", st.integers(min_k, max_k)), input_size=sizes,
                    filter_size=filters, stride=stride, padding=padding, dilation=dilation, dpitch=dpitch,
                    dtype=pinned.get("dtype", "float32"), math=pinned.get("math", "fma"))
    alg = IndexAlgebra(spec)
    if "input_size" not in pinned:
        assume(alg.rows * alg.cols <= max_elements and alg.image_elements <= max_elements)
    return spec


def check_pins(pinned: dict, family: str | None = None) -> ConvSpec:
    """Refuse pins no spec can hold, naming the field, before a search that could never start:
    an unknown field, one ConvSpec refuses with the other fields at their mildest (unit filter,
    stride and dilation, no padding, a large input), or a dtype or math mode ``family`` has no
    kernel for.  Returns that mildest spec (its dtype and math pick the kernel, ``get_family``)."""
    unknown = sorted(set(pinned) - set(PINNABLE))
    if unknown:
        raise SpecError(unknown[0], pinned[unknown[0]], f"cannot be pinned; pinnable fields: {', '.join(PINNABLE)}")
    dims = pin_dims(pinned) or 2
    mildest = {"dims": dims, "layout": "NHWC" if dims == 2 else "NDHWC", "n": 1, "c": 1, "k": 1, "input_size": 64,
               "filter_size": 1, "stride": 1, "padding": 0, "dilation": 1, "dpitch": None, "dtype": "float32",
               "math": "fma"}
    spec = ConvSpec.from_dict({**mildest, **pinned})
    if family is not None:
        from codegen.families import get_family

        get_family(family, spec).check_precision(spec)
    return spec


def pin_dims(pinned: dict) -> int | None:
    """The spatial dimensions the pins imply: the layout's, the dims pin, or a per-dimension pin's length."""
    if "layout" in pinned:
        try:
            return Layout(pinned["layout"]).dims
        except ValueError:
            raise SpecError("layout", pinned["layout"], f"must be one of {', '.join(l.value for l in Layout)}") from None
    if "dims" in pinned:
        return pinned["dims"]
    lengths = {len(v) for k, v in pinned.items() if isinstance(v, (tuple, list))}
    return lengths.pop() if len(lengths) == 1 else None


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
    from codegen.families.gemm_tiles import GemmTiles, check_geometry

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


def _shape_or_unwritten(result: np.ndarray, expected: np.ndarray) -> Mismatch | None:
    """The mismatches both comparisons report before any tolerance: a wrong shape, or NaN left in
    the poisoned output (elements never written)."""
    if result.shape != expected.shape:
        return Mismatch(f"shape {result.shape}, expected {expected.shape}")
    unwritten = int(np.isnan(result).sum())
    if unwritten:
        first = np.unravel_index(int(np.argmax(np.isnan(result))), result.shape)
        return Mismatch(f"{unwritten} element(s) never written (NaN), first at {tuple(map(int, first))}")
    return None


def compare(result: np.ndarray, expected: np.ndarray, rtol: float = 1e-5, atol: float = 1e-4) -> Mismatch | None:
    """None when ``result`` matches; NaN (an unwritten, poisoned element) never matches.

    Index bugs move whole elements (errors of order 1); the tolerance only absorbs float32
    rounding of col2im's sums."""
    result = np.asarray(result, dtype=np.float64)
    unfit = _shape_or_unwritten(result, expected)
    if unfit:
        return unfit
    error = np.abs(result - expected)
    excess = error - (atol + rtol * np.abs(expected))
    if (excess > 0).any():
        where = np.unravel_index(int(np.argmax(excess)), error.shape)
        return Mismatch(f"wrong value at {tuple(map(int, where))}: got {result[where]!r}, "
                        f"expected {expected[where]!r}", float(error.max()))
    return None


def within_error_bound(result: np.ndarray, expected: np.ndarray, bound: np.ndarray) -> Mismatch | None:
    """``compare`` for the tensor-core kernels: None when every element of ``result`` lies within
    its ``bound`` (``precision.error_bound``) of the float64 ``expected``; NaN never does."""
    result = np.asarray(result, dtype=np.float64)
    unfit = _shape_or_unwritten(result, expected)
    if unfit:
        return unfit
    error = np.abs(result - expected)
    excess = error - bound
    if (excess > 0).any():
        where = np.unravel_index(int(np.argmax(excess / np.maximum(bound, np.finfo(np.float64).tiny))), error.shape)
        return Mismatch(f"{int((excess > 0).sum())} element(s) outside the error bound, worst at "
                        f"{tuple(map(int, where))}: got {result[where]!r}, expected {expected[where]!r}, "
                        f"bound {bound[where]!r}", float(error.max()))
    return None


def check_result(spec: ConvSpec, result: np.ndarray, expected: np.ndarray, inputs,
                 family: str = "implicit_gemm", plan=None) -> Mismatch | None:
    """A kernel's ``result`` (decoded to float values) against the float64 ``expected`` of the
    stored ``inputs``: elementwise within ``family``'s error bound for the kernel ``plan`` that made
    it (``Family.error_bound``, by default the convolution's ``precision.error_bound``) where the
    spec is not plain FP32 (16-bit types, tf32, 3xtf32), ``compare``'s fixed tolerance for FP32 on
    the FMA pipe."""
    from codegen.families import get_family

    if uses_tensor_cores(spec.dtype, spec.math):
        return within_error_bound(result, expected, get_family(family, spec).error_bound(spec, inputs, plan))
    return compare(result, expected)


def launch_on_gpu(family: str, spec: ConvSpec, tiles=None, seed: int = 0,
                  kernel=None) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
    """Run the kernel on the family's random inputs (``make_inputs``: stored as the kernel takes
    them, bfloat16 as uint16 bits) with its output poisoned with NaN in the output's own type;
    return (result, float64 reference, inputs), a 16-bit result decoded to float64."""
    import cupy

    from codegen.api import array_dtype, build
    from codegen.families import get_family

    fam = get_family(family, spec)
    kernel = kernel or build(family, spec, tiles)
    inputs = fam.make_inputs(spec, np.random.default_rng(seed))
    device_inputs = [cupy.asarray(x) for x in inputs]
    output = kernel.plan.output
    out = cupy.full(output.shape, NAN[output.dtype], dtype=array_dtype(output.dtype))
    kernel(*device_inputs, out=out)
    result = cupy.asnumpy(out)
    if output.dtype is not DType.float32:
        result = precision.from_storage(result, output.dtype)
    return result, fam.reference(spec, *inputs), inputs


def run_on_gpu(family: str, spec: ConvSpec, tiles=None, seed: int = 0, kernel=None) -> tuple[np.ndarray, np.ndarray]:
    """Run the kernel on random inputs with a NaN-poisoned output; return (result, float64
    reference), a 16-bit result decoded to float64 (``launch_on_gpu``)."""
    result, expected, _ = launch_on_gpu(family, spec, tiles, seed, kernel)
    return result, expected


def cancellation(family: str, spec: ConvSpec, seed: int = 0) -> float:
    """How much the outputs on the inputs of ``seed`` cancel: ||conv(|x|, |w|)|| over
    sqrt(C * taps) * ||conv(x, w)||.  Float32 rounding grows with the sum of the products' sizes,
    the output's norm shrinks with cancellation, so a relative-error bound tuned on ordinary outputs
    (where this is about 0.7) scales by it on a few outputs that nearly cancel."""
    from codegen.families import get_family

    fam = get_family(family, spec)
    x, w = (precision.from_storage(a, spec.dtype) for a in fam.make_inputs(spec, np.random.default_rng(seed)))
    magnitude = float(np.linalg.norm(fam.reference(spec, np.abs(x), np.abs(w))))
    scale = float(np.linalg.norm(fam.reference(spec, x, w))) or 1.0
    return magnitude / (math.sqrt(spec.c * math.prod(spec.filter_size)) * scale)


def check_on_gpu(family: str, spec: ConvSpec, tiles=None, seed: int = 0, kernel=None) -> Mismatch | None:
    """Run the kernel (``launch_on_gpu``) and check it as ``check_result`` does."""
    from codegen.api import build

    kernel = kernel or build(family, spec, tiles)
    result, expected, inputs = launch_on_gpu(family, spec, tiles, seed, kernel)
    return check_result(spec, result, expected, inputs, family, kernel.plan)


def check_on_cpu(family: str, spec: ConvSpec, tiles=None, seed: int = 0) -> Mismatch | None:
    """What a run without a GPU checks of one spec: the family plans it with ``tiles`` (a SpecError
    is a refusal, not a failure), the plan renders, and the plan's index algebra gives the
    reference's numbers: the TMA implicit GEMM's through ``maps.tma_gemm_by_terms`` (tensor maps,
    producer coordinates, transposed filter), every other kernel's through its sympy index maps.
    implicit_gemm's tensor-core kernel prints the same address terms as its FMA kernel
    (``terms.gemm.gemm_terms``: row coordinates, per-pixel base and origins, per-column delta,
    output offsets), so its specs go through those maps, on the stored inputs decoded to float64."""
    from codegen.api import plan
    from codegen.families import get_family
    from codegen.maps import tma_gemm_by_terms
    from codegen.render import render_kernels

    kernel_plan = plan(family, spec, tiles)
    render_kernels(kernel_plan)
    if family == "implicit_gemm" and getattr(kernel_plan.tiles, "tma", False):
        fam = get_family(family, spec)
        x, w = fam.make_inputs(spec, np.random.default_rng(seed))
        return compare(tma_gemm_by_terms(spec, kernel_plan.tiles, x, w), fam.reference(spec, x, w))
    return check_index_maps(family, spec, seed)


def check_index_maps(family: str, spec: ConvSpec, seed: int = 0) -> Mismatch | None:
    """CPU check: evaluate the sympy index maps with numpy over every output element and compare
    with the family's reference."""
    from codegen.families import get_family
    from codegen.maps import evaluate

    fam = get_family(family, spec)
    inputs = fam.make_inputs(spec, np.random.default_rng(seed))
    if spec.dtype is not DType.float32:
        inputs = [precision.from_storage(a, spec.dtype) for a in inputs]
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
    parts.append(f"--dtype {spec.dtype.value}")
    if spec.math.value != "fma":
        parts.append(f"--math {spec.math.value}")
    if tiles:
        parts.extend(f"--tile {k}={v}" for k, v in (tiles.to_dict() if hasattr(tiles, "to_dict") else tiles).items())
    return " ".join(parts)


GEMM_RANGES = {"max_channels": 40, "max_k": 70, "max_elements": 1 << 16, "max_filter": 5}
"""Spec ranges a search of the GEMM families draws from: their tiles run over 32-channel slices and
64-128 output channels, so channel and output-channel tails and several tiles must occur."""
FAMILY_RANGES = {"implicit_gemm": GEMM_RANGES, "im2win": GEMM_RANGES, "im2col_gemm": GEMM_RANGES}


class DeviceFault(Exception):
    """A CUDA error during a check: the context may be lost, so the search stops at this spec."""

    def __init__(self, spec: ConvSpec, error: Exception):
        super().__init__(f"{type(error).__name__}: {error}")
        self.spec = spec


@dataclass
class FuzzReport:
    """What a search did: specs checked (shrinking included), drawn specs the kernel refused by
    reason (the refusal's field and its words before the first parenthesis, which hold this
    spec's values), the seed that repeats it, and the smallest failing spec found (``shrunk``
    False when a device fault stopped the search at the spec that raised it)."""

    checked: int
    refused: Counter
    seed: int
    failure: tuple[ConvSpec, Mismatch] | None = None
    shrunk: bool = True

    def refusal_summary(self, most: int = 3) -> str:
        """The commonest refusals, e.g. '310 x layout: ... ; 12 x dpitch: ...'."""
        return "; ".join(f"{count} x {reason}" for reason, count in self.refused.most_common(most))


def _is_device_fault(error: Exception) -> bool:
    return type(error).__name__ in ("CUDADriverError", "CUDARuntimeError")


def fuzz(family: str, examples: int, on_gpu: bool, tiles=None, seed: int | None = None, progress=None,
         pinned: dict | None = None) -> FuzzReport:
    """Search for a spec on which ``family`` (with ``tiles``) is wrong, among specs keeping the
    ``pinned`` fields, and shrink it.  A spec the kernel refuses (SpecError) does not count towards
    ``examples``; any other exception is a failure, as in a property test.  ``progress(checked,
    refused)`` is called after every spec."""
    from hypothesis import HealthCheck, Phase, find, settings
    from hypothesis.errors import NoSuchExample, Unsatisfiable

    pinned = pinned or {}
    check_pins(pinned, family)
    seed = random.randrange(2**32) if seed is None else seed
    report = FuzzReport(checked=0, refused=Counter(), seed=seed)

    def attempt(spec: ConvSpec) -> Mismatch | None:
        try:
            return check_on_gpu(family, spec, tiles) if on_gpu else check_on_cpu(family, spec, tiles)
        except SpecError:
            raise
        except Exception as error:
            if on_gpu and _is_device_fault(error):
                raise DeviceFault(spec, error) from error
            return Mismatch(f"raised {type(error).__name__}: {error}")

    def wrong(spec: ConvSpec) -> bool:
        mismatch, refused = None, False
        try:
            mismatch = attempt(spec)
            report.checked += 1
        except SpecError as error:
            report.refused[f"{error.field}: {error.allowed.split('(')[0].strip(' ,;:')}"] += 1
            refused = True
        if progress:
            progress(report.checked, sum(report.refused.values()))
        assume(not refused)
        return mismatch is not None

    kwargs = {"database": None, "max_examples": examples, "deadline": None,
              "suppress_health_check": list(HealthCheck),
              "phases": [Phase.generate, Phase.shrink]}
    try:
        found = find(specs(pinned=pinned, **FAMILY_RANGES.get(family, {})), wrong, settings=settings(**kwargs), random=random.Random(seed))
        report.failure = (found, attempt(found) or Mismatch("fails intermittently (a race?)"))
    except (NoSuchExample, Unsatisfiable):
        pass
    except DeviceFault as fault:
        report.failure, report.shrunk = (fault.spec, Mismatch(f"device fault, {fault}")), False
    return report
