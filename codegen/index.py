"""Index algebra, derived once with sympy.

Every index map a kernel uses is built here as a sympy expression over named integer symbols
(``n``, ``c``, ``o0..``, ``k0..``, ``i0..``, ``col``, ``row`` ...), with the spec's constants folded
in.  Templates receive the expressions printed as C; tests receive the same expressions lambdified
to numpy.  Nothing downstream re-derives index arithmetic by hand.

Spatial axes are numbered 0..dims-1, outermost first (D, H, W in 3D; H, W in 2D).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import sympy
from sympy.printing.c import C99CodePrinter
from sympy.printing.numpy import NumPyPrinter

from codegen.spec import ConvSpec, SpecError

INT32_MAX = 2**31 - 1


def _sym(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, integer=True, nonnegative=True)


class IndexPrinter(C99CodePrinter):
    """Prints integer index expressions: floor(a/b) as C division, Mod as %, no float literals.

    Valid because every expression printed here divides non-negative integers."""

    def _print_floor(self, expr):
        arg = expr.args[0]
        num, den = sympy.fraction(sympy.together(arg))
        if den == 1:
            return self._print(num)
        return f"(({self._print(num)}) / {self._print(den)})"

    def _print_Mod(self, expr):
        a, b = expr.args
        return f"(({self._print(a)}) % {self._print(b)})"

    def _print_Pow(self, expr):
        base, exp = expr.args
        if exp.is_Integer and exp > 0:
            return "(" + " * ".join([self._print(base)] * int(exp)) + ")"
        return super()._print_Pow(expr)


_PRINTER = IndexPrinter()


def to_c(expr: sympy.Expr) -> str:
    return _PRINTER.doprint(sympy.sympify(expr))


def decompose(linear: sympy.Expr, extents: tuple[int, ...]) -> list[sympy.Expr]:
    """Coordinates of a row-major linear index over ``extents`` (outermost first)."""
    coords = []
    inner = 1
    for position in range(len(extents) - 1, -1, -1):
        quotient = sympy.floor(linear / inner) if inner > 1 else linear
        coords.append(quotient if position == 0 else sympy.Mod(quotient, extents[position]))
        inner *= extents[position]
    coords.reverse()
    return coords


def linearize(coords: list[sympy.Expr], extents: tuple[int, ...]) -> sympy.Expr:
    """Row-major linear index of ``coords`` over ``extents`` (outermost first)."""
    linear = sympy.Integer(0)
    for coord, extent in zip(coords, extents):
        linear = linear * extent + coord
    return sympy.expand(linear)


def output_size(spec: ConvSpec) -> tuple[int, ...]:
    return spec.output_size


def max_over_box(expr: sympy.Expr, bounds: dict[sympy.Symbol, int]) -> int:
    """The largest value of a polynomial with non-negative coefficients over a box [0, bound].

    Such a polynomial is non-decreasing in every variable on the box, so its maximum sits at the
    upper corner; the coefficient check is what makes this a proof rather than a guess."""
    expr = sympy.expand(expr)
    symbols = sorted(expr.free_symbols, key=str)
    if symbols:
        poly = sympy.Poly(expr, *symbols)
        negative = [coef for coef in poly.coeffs() if coef < 0]
        if negative:
            raise ValueError(f"cannot bound {expr}: it has negative coefficients")
    return int(expr.subs({s: bounds[s] for s in symbols}))


@dataclass(frozen=True)
class IndexAlgebra:
    """The index maps of one spec; every field is a sympy expression or a tuple of them."""

    spec: ConvSpec

    # -- symbols -------------------------------------------------------------------------
    @cached_property
    def n(self):
        return _sym("n")

    @cached_property
    def c(self):
        return _sym("c")

    @cached_property
    def o(self) -> tuple[sympy.Symbol, ...]:
        return tuple(_sym(f"o{j}") for j in range(self.spec.dims))

    @cached_property
    def k(self) -> tuple[sympy.Symbol, ...]:
        return tuple(_sym(f"k{j}") for j in range(self.spec.dims))

    @cached_property
    def i(self) -> tuple[sympy.Symbol, ...]:
        # Input coordinates may be negative (padding) before the bounds check: plain integers.
        return tuple(sympy.Symbol(f"i{j}", integer=True) for j in range(self.spec.dims))

    @cached_property
    def col(self):
        return _sym("col")

    @cached_property
    def row(self):
        return _sym("row")

    @cached_property
    def kk(self):
        return _sym("kk")

    @cached_property
    def pix(self):
        return _sym("pix")

    @cached_property
    def t(self):
        return _sym("t")

    # -- sizes ---------------------------------------------------------------------------
    @cached_property
    def out_size(self) -> tuple[int, ...]:
        return output_size(self.spec)

    @cached_property
    def taps(self) -> int:
        """Filter positions (KD*KH*KW)."""
        return math.prod(self.spec.filter_size)

    @cached_property
    def rows(self) -> int:
        return self.spec.c * self.taps

    @cached_property
    def cols(self) -> int:
        return self.spec.n * math.prod(self.out_size)

    @cached_property
    def pixels(self) -> int:
        """Input pixels over the whole batch (N*D*H*W)."""
        return self.spec.n * math.prod(self.spec.input_size)

    @cached_property
    def image_shape(self) -> tuple[int, ...]:
        s = self.spec
        if s.layout.channels_last:
            return (s.n, *s.input_size, s.pitch)
        return (s.n, s.c, *s.input_size)

    @cached_property
    def image_elements(self) -> int:
        return math.prod(self.image_shape)

    @cached_property
    def col_shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    # -- forward maps ------------------------------------------------------------------
    @cached_property
    def col_coords(self) -> tuple[sympy.Expr, ...]:
        """(n, o0, o1[, o2]) of a column index: columns run over (n, od, oh, ow)."""
        return tuple(decompose(self.col, (self.spec.n, *self.out_size)))

    @cached_property
    def col_linear(self) -> sympy.Expr:
        return linearize([self.n, *self.o], (self.spec.n, *self.out_size))

    @cached_property
    def tap_coords(self) -> tuple[sympy.Expr, ...]:
        """(k0, k1[, k2]) of a flattened filter position ``kk``."""
        return tuple(decompose(self.kk, self.spec.filter_size))

    @cached_property
    def tap_linear(self) -> sympy.Expr:
        return linearize(list(self.k), self.spec.filter_size)

    @cached_property
    def in_coord(self) -> tuple[sympy.Expr, ...]:
        """Input coordinate read by output ``o`` at filter tap ``k``: o*s - p + k*d."""
        s = self.spec
        return tuple(o * st - p + k * d for o, k, st, p, d in zip(self.o, self.k, s.stride, s.padding, s.dilation))

    @cached_property
    def row_of(self) -> sympy.Expr:
        """Column-matrix row of channel ``c`` at tap ``kk``: (c, taps) channels-first, (taps, c) channels-last."""
        if self.spec.layout.channels_last:
            return self.kk * self.spec.c + self.c
        return self.c * self.taps + self.kk

    @cached_property
    def row_coords(self) -> tuple[sympy.Expr, sympy.Expr]:
        """(c, kk) of a row index: the inverse of ``row_of``."""
        if self.spec.layout.channels_last:
            kk, c = decompose(self.row, (self.taps, self.spec.c))
        else:
            c, kk = decompose(self.row, (self.spec.c, self.taps))
        return c, kk

    @cached_property
    def pixel_linear(self) -> sympy.Expr:
        """Linear pixel index (n, i0, i1[, i2]) of channels-last data; times the pitch gives the offset."""
        return linearize([self.n, *self.i], (self.spec.n, *self.spec.input_size))

    @cached_property
    def pixel_coords(self) -> tuple[sympy.Expr, ...]:
        """(n, i0, i1[, i2]) of a pixel index ``pix``."""
        return tuple(decompose(self.pix, (self.spec.n, *self.spec.input_size)))

    @cached_property
    def x_offset(self) -> sympy.Expr:
        """Element offset of (n, c, i...) in the image, honouring layout and channel pitch."""
        s = self.spec
        if s.layout.channels_last:
            return sympy.expand(self.pixel_linear * s.pitch + self.c)
        return linearize([self.n, self.c, *self.i], (s.n, s.c, *s.input_size))

    @cached_property
    def image_coords(self) -> tuple[sympy.Expr, ...]:
        """(n, c, i0, i1[, i2]) of a channels-first image element ``t``."""
        s = self.spec
        n, c, *i = decompose(self.t, (s.n, s.c, *s.input_size))
        return (n, c, *i)

    @cached_property
    def col_offset(self) -> sympy.Expr:
        return self.row * self.cols + self.col

    # -- convolution (direct family) -------------------------------------------------------
    @cached_property
    def oc(self):
        """Output channel (filter index)."""
        return _sym("oc")

    @cached_property
    def output_shape(self) -> tuple[int, ...]:
        s = self.spec
        if s.layout.channels_last:
            return (s.n, *self.out_size, s.k)
        return (s.n, s.k, *self.out_size)

    @cached_property
    def filter_shape(self) -> tuple[int, ...]:
        """K x C x (T x) R x S channels-first, K x (T x) R x S x C channels-last (cuDNN, CUTLASS)."""
        s = self.spec
        if s.layout.channels_last:
            return (s.k, *s.filter_size, s.c)
        return (s.k, s.c, *s.filter_size)

    @cached_property
    def output_coords(self) -> tuple[sympy.Expr, ...]:
        """(n, oc, o0, o1[, o2]) of thread ``t``: threads run output-channel-major, space fastest, so a
        warp shares one filter (what the constant-memory variant needs) whatever the layout."""
        s = self.spec
        return tuple(decompose(self.t, (s.n, s.k, *self.out_size)))

    @cached_property
    def y_offset(self) -> sympy.Expr:
        s = self.spec
        if s.layout.channels_last:
            return linearize([self.n, *self.o, self.oc], (s.n, *self.out_size, s.k))
        return linearize([self.n, self.oc, *self.o], (s.n, s.k, *self.out_size))

    @cached_property
    def w_offset(self) -> sympy.Expr:
        s = self.spec
        if s.layout.channels_last:
            return linearize([self.oc, self.kk, self.c], (s.k, self.taps, s.c))
        return linearize([self.oc, self.c, self.kk], (s.k, s.c, self.taps))

    # -- inverse map (col2im gather) -----------------------------------------------------
    @cached_property
    def window_numerator(self) -> tuple[sympy.Expr, ...]:
        """o*s for the window whose tap k covers input coordinate i, solved from i = o*s - p + k*d."""
        numerators = []
        for j, (coord, o, st) in enumerate(zip(self.in_coord, self.o, self.spec.stride)):
            solution = sympy.solve(sympy.Eq(self.i[j], coord), o)[0]
            numerators.append(sympy.expand(solution * st))
        return tuple(numerators)

    # -- bounds ---------------------------------------------------------------------------
    def largest_index(self, padded_threads: int = 0, column_matrix: bool = True) -> int:
        """Proven largest linear index any kernel of this spec forms (buffer offsets and thread ids);
        ``column_matrix=False`` for kernels that never address the column matrix (the direct
        family), whose offsets can pass 2^31 long before the image's do (81 taps x 8192^2)."""
        s = self.spec
        box = {self.n: s.n - 1, self.c: max(s.c, s.pitch) - 1, self.row: self.rows - 1, self.col: self.cols - 1}
        box.update({i: size - 1 for i, size in zip(self.i, s.input_size)})
        image_max = max_over_box(self.x_offset, box)
        if s.layout.channels_last:
            image_max = max(image_max, self.image_elements - 1)
        col_max = max_over_box(self.col_offset, box) if column_matrix else 0
        convolution_max = max(math.prod(self.output_shape), math.prod(self.filter_shape)) - 1
        return max(image_max, col_max, convolution_max, padded_threads - 1)

    def index_type(self, padded_threads: int = 0, column_matrix: bool = True) -> str:
        """``int`` when every index provably fits in 32 bits, else ``long long``."""
        return "int" if self.largest_index(padded_threads, column_matrix) <= INT32_MAX else "long long"


class IntegerNumPyPrinter(NumPyPrinter):
    """Prints floor(a/b) as ``a // b`` and Mod as ``%``: numpy then divides integers exactly, as
    the C kernels do.  Without it, floor(row/49) becomes floor((1/49)*row), and the float
    product of 49 and 1/49 is just under 1 (which once corrupted a precomputed row table)."""

    def _print_floor(self, expr):
        num, den = sympy.fraction(sympy.together(expr.args[0]))
        if den == 1:
            return self._print(num)
        return f"(({self._print(num)}) // ({self._print(den)}))"

    def _print_Mod(self, expr):
        a, b = expr.args
        return f"(({self._print(a)}) % ({self._print(b)}))"


def lambdify(symbols, expr):
    """The same expression as a numpy callable on integer arrays, for the maps and tables."""
    return sympy.lambdify(symbols, expr, modules="numpy", printer=IntegerNumPyPrinter)


def axis_bounds(algebra: IndexAlgebra) -> list[str]:
    """Per axis, the C condition that input coordinate i<j> lies inside the image, with the sides
    that the spec proves can never fail left out (no padding: no lower check; no overhang: no
    upper one); "true" when both are proven."""
    spec = algebra.spec
    conditions = []
    box = {o: extent - 1 for o, extent in zip(algebra.o, algebra.out_size)}
    box.update({k: f - 1 for k, f in zip(algebra.k, spec.filter_size)})
    for j, (expr, size) in enumerate(zip(algebra.in_coord, spec.input_size)):
        low = int(expr.subs({s: 0 for s in expr.free_symbols}))
        high = int(expr.subs(box))
        terms = ([f"i{j} >= 0"] if low < 0 else []) + ([f"i{j} < {size}"] if high > size - 1 else [])
        conditions.append(" && ".join(terms) if terms else "true")
    return conditions


def bounds_check(algebra: IndexAlgebra) -> str:
    """C condition that every input coordinate lies inside the image (see ``axis_bounds``)."""
    terms = [c for c in axis_bounds(algebra) if c != "true"]
    return " && ".join(terms) if terms else "true"


def window_terms(algebra: IndexAlgebra) -> tuple[list[str], list[str], str]:
    """For col2im gather over all taps (every stride 1): names ``w0..`` with their C expressions (o*s of the window whose tap k
    covers input coordinate i), the output coordinates o = w/s, and the C condition that such a
    window exists.  Sides of the condition that the spec proves always true are left out."""
    spec = algebra.spec
    numerators, outputs, terms = [], [], []
    for j, expr in enumerate(algebra.window_numerator):
        size, f, s, p, d = (spec.input_size[j], spec.filter_size[j], spec.stride[j], spec.padding[j],
                            spec.dilation[j])
        w = sympy.Symbol(f"w{j}", integer=True)
        numerators.append(to_c(expr))
        outputs.append(to_c(sympy.floor(w / s)))
        low = p - (f - 1) * d
        high = size - 1 + p
        if low < 0:
            terms.append(f"w{j} >= 0")
        if s > 1:
            terms.append(f"w{j} % {s} == 0")
        if high > (algebra.out_size[j] - 1) * s:
            terms.append(f"w{j} <= {(algebra.out_size[j] - 1) * s}")
    return numerators, outputs, " && ".join(terms) if terms else "true"


def window_ranges(algebra: IndexAlgebra) -> list[dict]:
    """For col2im gather, per spatial axis: the range of output coordinates o whose window covers
    input coordinate i, and the tap k that does it, solved from i = o*s - p + k*d.

    0 <= k <= K-1 gives i + p - (K-1)*d <= o*s <= i + p, so o runs from ceil(lo/s) to floor(hi/s),
    clamped to [0, O-1]; k = (i + p - o*s)/d must divide exactly when d > 1.  Clamps the spec
    proves unnecessary are left out.  Each entry holds C expressions over i<j> and o<j>."""
    spec = algebra.spec
    axes = []
    for j, coord in enumerate(algebra.in_coord):
        size, f, s, p, d = (spec.input_size[j], spec.filter_size[j], spec.stride[j], spec.padding[j],
                            spec.dilation[j])
        tap = sympy.solve(sympy.Eq(algebra.i[j], coord), algebra.k[j])[0]
        tap_numerator = sympy.expand(tap * d)
        lo = sympy.expand(sympy.solve(sympy.Eq(tap, f - 1), algebra.o[j])[0] * s)
        hi = sympy.expand(sympy.solve(sympy.Eq(tap, 0), algebra.o[j])[0] * s)
        last = algebra.out_size[j] - 1
        lo_c, hi_c = to_c(lo), to_c(hi)
        if p - (f - 1) * d >= 0:  # lo >= 0 for every i: no clamp at 0
            first = f"(({lo_c}) + {s - 1}) / {s}" if s > 1 else lo_c
        else:
            first = f"(({lo_c}) > 0 ? (({lo_c}) + {s - 1}) / {s} : 0)" if s > 1 else f"(({lo_c}) > 0 ? ({lo_c}) : 0)"
        top = f"(({hi_c}) / {s})" if s > 1 else f"({hi_c})"
        if (size - 1 + p) // s > last:
            top = f"convgen_min((idx_t){last}, (idx_t){top})"
        axes.append({"first": first, "last": top, "tap_numerator": to_c(tap_numerator), "dilation": d})
    return axes


def template_context(alg: IndexAlgebra, padded_threads: int, column_matrix: bool = True) -> dict:
    """The index maps every template may use, printed as C with the spec's constants folded in."""
    spec = alg.spec
    return {
        "idx_t": alg.index_type(padded_threads, column_matrix),
        "largest_index": alg.largest_index(padded_threads, column_matrix),
        "dims": spec.dims,
        "channels_last": spec.layout.channels_last,
        "C": spec.c,
        "pitch": spec.pitch,
        "rows": alg.rows,
        "cols": alg.cols,
        "taps": alg.taps,
        "pixels_total": alg.pixels,
        "image_elements": alg.image_elements,
        "col_coords": [to_c(e) for e in alg.col_coords],
        "tap_coords": [to_c(e) for e in alg.tap_coords],
        "in_coord": [to_c(e) for e in alg.in_coord],
        "in_bounds": bounds_check(alg),
        "x_offset": to_c(alg.x_offset),
        "pixel_offset": to_c(alg.pixel_linear * spec.pitch),
        "pixel_channel_offset": to_c(alg.pix * spec.pitch + alg.c),
        "row_of": to_c(alg.row_of),
        "row_of_taps": to_c(alg.row_of.subs(alg.kk, alg.tap_linear)),
        "row_coords": [to_c(e) for e in alg.row_coords],
        "pixel_coords": [to_c(e) for e in alg.pixel_coords],
        "image_coords": [to_c(e) for e in alg.image_coords],
        "window_axes": window_ranges(alg),
        "window_taps": dict(zip(("numerators", "outputs", "valid"), window_terms(alg))),
        "unit_stride": all(s == 1 for s in spec.stride),
        "tap_linear": to_c(alg.tap_linear),
        "col_linear": to_c(alg.col_linear),
        "thread_coords": [to_c(e) for e in decompose(alg.t, (spec.c, alg.cols))],
        "pixel_channel": [to_c(e) for e in decompose(alg.t, (alg.pixels, spec.pitch))],
        "output_coords": [to_c(e) for e in alg.output_coords],
        "y_offset": to_c(alg.y_offset),
        "w_offset": to_c(alg.w_offset),
        "K": spec.k,
        "out_size": list(alg.out_size),
        "filter_size": list(spec.filter_size),
        "total_outputs": math.prod(alg.output_shape),
    }


WINDOW_LIMIT = 255
"""The longest register window a thread may walk along one axis (the registers a thread has): the
register-tiled kernels unroll it, so past this the source would grow with the filter's extent."""


def tile_terms(algebra: IndexAlgebra, tile: tuple[int, int], per_thread: tuple[int, int] = (1, 1),
               align: int = 1, windows: bool = False) -> dict:
    """Spatial tiling of the last two axes (H, W) for the tiled direct kernels.

    With tile index ``tile<j>`` and a thread's local output ``l<j>`` on axis j: the tile's first
    output is tile*T; the first input its window reads is in_coord(o = tile*T, k = 0); and the
    input that local output l reads at tap k sits at l*s + k*d from there.  The cache variant keeps
    in shared memory the T inputs starting at tile*T*s (the tile's "own" inputs: for stride 1
    and padding r these are the inputs at the outputs' own coordinates, as in the seed).

    Register blocking: a thread owns ``per_thread[j]`` consecutive outputs on axis j (local
    index u on H, v on W), so its window starts at input l*per*s and output u (v) reads element
    ``window_index`` = u*s + k*d of it at tap k, ``window_extent`` elements in all;
    ``window_taps[e]`` lists the (u, k) pairs that read element e.  With ``align`` > 1 the
    W axis is stored from the aligned input column below the halo's origin (``lead`` columns
    earlier), which holds for every tile when T*s is a multiple of ``align``."""
    spec = algebra.spec
    axes = []
    for position, j in enumerate(range(spec.dims - 2, spec.dims)):
        tile_index = _sym(f"tile{j}")
        local = _sym(f"l{j}")
        per = per_thread[position]
        first_output = tile_index * tile[position]
        halo_origin = algebra.in_coord[j].subs({algebra.o[j]: first_output, algebra.k[j]: 0})
        local_input = sympy.expand(algebra.in_coord[j].subs(algebra.o[j], first_output + local) - halo_origin)
        extent = (per - 1) * spec.stride[j] + (spec.filter_size[j] - 1) * spec.dilation[j] + 1
        window_taps = None
        if windows:
            if extent > WINDOW_LIMIT:
                raise SpecError("filter_size", spec.filter_size, f"gives the register tile a window of {extent} inputs "
                                f"along axis {j} ({per} outputs a thread, stride {spec.stride[j]}, dilation "
                                f"{spec.dilation[j]}), more than the {WINDOW_LIMIT} registers of a thread; use "
                                "variant tiled_halo, tiled_cache or basic")
            window_taps = [[] for _ in range(extent)]
            for v in range(per):
                for k in range(spec.filter_size[j]):
                    window_taps[int(local_input.subs({local: v, algebra.k[j]: k}))].append((v, k))
        lead = int(halo_origin.subs(tile_index, 0)) % align if position == 1 else 0
        axes.append({
            "axis": j,
            "tile": tile[position],
            "tiles": -(-algebra.out_size[j] // tile[position]),
            "first_output": to_c(first_output),
            "halo_origin": to_c(halo_origin),
            "aligned_origin": to_c(halo_origin - lead),
            "lead": lead,
            "own_origin": to_c(sympy.expand(first_output * spec.stride[j])),
            "local_input": to_c(local_input),
            "halo_extent": (tile[position] - 1) * spec.stride[j] + (spec.filter_size[j] - 1) * spec.dilation[j] + 1,
            "window_start": to_c(sympy.expand(local_input.subs({local: local * per, algebra.k[j]: 0}))),
            "window_index": to_c(local_input.subs(local, _sym("uv"[position]))),
            "window_extent": extent,
            "window_taps": window_taps,
        })
    plane = _sym("plane")
    inner = spec.filter_size[-2:]
    return {
        "axes": axes,
        "plane_taps": math.prod(inner),
        "plane_coords": [to_c(e) for e in decompose(plane, inner)],
        "halo_bounds": " && ".join(f"i{a['axis']} >= 0 && i{a['axis']} < {spec.input_size[a['axis']]}" for a in axes),
        "depth_bounds": axis_bounds(algebra)[0] if spec.dims == 3 else "true",
    }


# -- GEMM view of the convolution (implicit_gemm, im2win) -------------------------------------
def warp_lane_layout(lanes_m: int, lanes_n: int) -> tuple[sympy.Expr, sympy.Expr]:
    """(lane_m, lane_n): where lane ``lane`` of a lanes_m x lanes_n warp sits in the warp tile.

    Lanes pair up as in CUTLASS's interleaved SIMT lane layout: lanes 2i and 2i+1 share an A
    fragment, lanes i and i^2 a B fragment.  A float4 shared-memory read whose lanes pair up so
    takes two wavefronts instead of four (NVIDIA: shared memory returns 128 bytes a cycle, and a
    pair reading one address returns as one), which halves the A reads' cost.  A warp one lane
    wide along M or N has no pairs to form and keeps the plain layout."""
    lane = _sym("lane")
    if lanes_n == 1:
        return lane, sympy.Integer(0)
    if lanes_m == 1:
        return sympy.Integer(0), lane
    return sympy.Mod(sympy.floor(lane / 2), lanes_m), sympy.Mod(lane, 2) + 2 * sympy.floor(lane / (2 * lanes_m))


def gemm_sizes(algebra: IndexAlgebra) -> tuple[int, int, int]:
    """(GEMM_M, GEMM_N, GEMM_K) = (N*OD*OH*OW, K, C*T*R*S): rows of A are output pixels, its
    columns the column-matrix rows (so B is the filter read in its own memory order)."""
    return algebra.cols, algebra.spec.k, algebra.rows


def window_tensor_shape(algebra: IndexAlgebra) -> tuple[int, ...]:
    """The im2win tensor (the im2win paper's equation 2, generalised): for each output position of
    the outer axes, the input rows its windows read, flattened window-order along W.

    Channels-first (N, C, O0[, O1], Wwin, T) and channels-last (N, O0[, O1], Wwin, T, C), where
    T is the product of the outer filter sizes (KH in 2D) and Wwin = (OW-1)*s + (KW-1)*d + 1 the
    padded input columns the windows touch.  Padding is stored, so the convolution reads it
    without bounds checks."""
    spec = algebra.spec
    outer = algebra.out_size[:-1]
    taps_outer = math.prod(spec.filter_size[:-1])
    if spec.layout.channels_last:
        return (spec.n, *outer, window_width(algebra), taps_outer, spec.c)
    return (spec.n, spec.c, *outer, window_width(algebra), taps_outer)


def window_width(algebra: IndexAlgebra) -> int:
    spec = algebra.spec
    return (algebra.out_size[-1] - 1) * spec.stride[-1] + (spec.filter_size[-1] - 1) * spec.dilation[-1] + 1


def window_offset(algebra: IndexAlgebra, wcol: sympy.Expr, outer_tap: sympy.Expr) -> sympy.Expr:
    """Offset in the im2win tensor of (n, c, o_outer..., wcol, outer_tap)."""
    spec = algebra.spec
    shape = window_tensor_shape(algebra)
    outer = list(algebra.o[:-1])
    if spec.layout.channels_last:
        return linearize([algebra.n, *outer, wcol, outer_tap, algebra.c], shape)
    return linearize([algebra.n, algebra.c, *outer, wcol, outer_tap], shape)


def window_transform_exprs(algebra: IndexAlgebra) -> dict:
    """The im2win transform, one thread per tensor element ``t``, as sympy: the names and
    expressions of its coordinates, and the input coordinates i0.. it copies."""
    spec = algebra.spec
    wcol, to = _sym("wcol"), _sym("to")
    outer = [f"o{j}" for j in range(spec.dims - 1)]
    names = ["n", *outer, "wcol", "to", "c"] if spec.layout.channels_last else ["n", "c", *outer, "wcol", "to"]
    outer_taps = decompose(to, spec.filter_size[:-1])
    last = spec.dims - 1
    sources = [algebra.in_coord[j].subs(algebra.k[j], outer_taps[j]) for j in range(last)]
    sources.append(wcol - spec.padding[last])
    return {"names": names, "coords": decompose(algebra.t, window_tensor_shape(algebra)), "sources": sources}


def window_transform_terms(algebra: IndexAlgebra) -> dict:
    """``window_transform_exprs`` printed as C, with the bounds check (padding cells are written
    as zeros; axes without padding are proven inside)."""
    spec = algebra.spec
    shape = window_tensor_shape(algebra)
    exprs = window_transform_exprs(algebra)
    checks = [f"i{j} >= 0 && i{j} < {size}" for j, size in enumerate(spec.input_size) if spec.padding[j] > 0]
    return {
        "window_shape": list(shape),
        "window_elements": math.prod(shape),
        "window_names": exprs["names"],
        "window_coords": [to_c(e) for e in exprs["coords"]],
        "window_sources": [to_c(e) for e in exprs["sources"]],
        "window_bounds": " && ".join(checks) or "true",
    }


def gemm_terms(algebra: IndexAlgebra, source: str) -> dict:
    """Address terms of the implicit GEMM's A operand, split so that the kernel adds a per-row
    part (output pixel m) to a per-column part (column-matrix row), as CUTLASS's iterators do:

    - ``source="image"``: A(m, row) = x[base(n, o) + delta(c, k)] when every input coordinate
      origin_j(o) + disp_j(k) lies inside the image, else 0 (padding); only axes with padding
      are checked, the others are proven inside by the output size.
    - ``source="window"``: A(m, row) = win[base(n, o) + delta(c, k)] in the im2win tensor, which
      stores padding, so nothing is checked.

    ``delta`` stays a sympy expression: the precomputed-offset table evaluates it per row."""
    spec = algebra.spec
    disp = [_sym(f"g{j}") for j in range(spec.dims)]
    zero_taps = {k: 0 for k in algebra.k}
    if source == "image":
        origin = [sympy.expand(e.subs(zero_taps)) for e in algebra.in_coord]
        full = sympy.expand(algebra.x_offset.subs({algebra.i[j]: origin[j] + disp[j] for j in range(spec.dims)}))
        base = full.subs({algebra.c: 0, **{g: 0 for g in disp}})
        delta = sympy.expand(full - base).subs({g: k * d for g, k, d in zip(disp, algebra.k, spec.dilation)})
        checked = [j for j in range(spec.dims) if spec.padding[j] > 0]
    elif source == "window":
        last = spec.dims - 1
        wcol = algebra.o[last] * spec.stride[last] + algebra.k[last] * spec.dilation[last]
        outer_tap = linearize(list(algebra.k[:-1]), spec.filter_size[:-1])
        full = sympy.expand(window_offset(algebra, wcol, outer_tap))
        base = full.subs({algebra.c: 0, **zero_taps})
        delta = sympy.expand(full - base)
        origin, checked = [], []
    else:
        raise ValueError(f"unknown A source {source!r}")
    y_full = sympy.expand(algebra.y_offset)
    y_base = y_full.subs(algebra.oc, 0)
    return {
        "a_base": to_c(base),
        "a_delta": delta,
        "a_delta_c": to_c(delta),
        "a_origin": [to_c(e) for e in origin],
        "a_checked": [{"axis": j, "size": spec.input_size[j], "disp": to_c(algebra.k[j] * spec.dilation[j])}
                      for j in checked],
        "y_base": to_c(y_base),
        "y_oc_stride": int(sympy.expand(y_full - y_base).coeff(algebra.oc)),
        "exprs": {"a_base": base, "a_origin": origin, "y_base": y_base},
    }


IM2COL_CORNER_LIMIT = {2: 128, 3: 16}
"""The corners of a TMA im2col map lie in [-limit, limit - 1], by spatial rank (cuda.h: [-128, 127]
for 4-D tensors, [-16, 15] for 5-D)."""
TMA_ELEMENT_STRIDE_LIMIT = 8
"""Largest traversal stride of a TMA map along one dimension (cuda.h, elementStrides)."""


def im2col_map_terms(algebra: IndexAlgebra) -> dict:
    """The channels-last image as a TMA *im2col* map, and what a kernel passes to each copy.

    The map is the tensor (C, W, H[, D], N), innermost first, with byte strides from the channel
    pitch.  One copy loads a run of channels for each of a run of consecutive output pixels at
    one filter tap: the copy names the input coordinates of its first pixel at tap 0 (``origin``: o*s
    - p per spatial axis, innermost first, from ``in_coord``) and the tap's offsets (k*d, from
    ``tap_coords``); the hardware walks on through rows and images with the traversal strides (the
    convolution stride) inside the box between the corners, -p and p - d*(f - 1) per axis, and
    reads zeros outside the image.  The corners are what bound the walk to the output grid: a
    row holds (size + 2p - d*(f - 1) - 1) // s + 1 pixels, the output size."""
    spec = algebra.spec
    if not spec.layout.channels_last:
        raise ValueError("an im2col map needs a channels-last image")
    inner_first = list(range(spec.dims - 1, -1, -1))
    dims = (spec.c, *(spec.input_size[j] for j in inner_first), spec.n)
    strides, step = [], 4 * spec.pitch
    for j in inner_first:
        strides.append(step)
        step *= spec.input_size[j]
    strides.append(step)
    zero_taps = {k: 0 for k in algebra.k}
    origin = [sympy.expand(algebra.in_coord[j].subs(zero_taps)) for j in inner_first]
    offsets = [algebra.tap_coords[j] * spec.dilation[j] for j in inner_first]
    return {
        "dims": dims,
        "strides": tuple(strides),
        "lower": tuple(-spec.padding[j] for j in inner_first),
        "upper": tuple(spec.padding[j] - spec.dilation[j] * (spec.filter_size[j] - 1) for j in inner_first),
        "element_strides": (1, *(spec.stride[j] for j in inner_first), 1),
        "origin": [to_c(e) for e in origin],
        "tap_offsets": [to_c(e) for e in offsets],
        "exprs": {"origin": origin, "tap_offsets": offsets},
    }


def gather_terms(algebra: IndexAlgebra) -> dict:
    """The channels-first image as the TMA kernel's producer warps gather it, one 4-byte cp.async
    per element: ``gemm_terms``' per-pixel base, origins and padded axes, plus the offset of a
    k-slice's tap at channel 0 (``tap_delta``, of k0, k1[, k2]) and the stride between channels,
    so that channel c of the slice's tap is base + tap_delta + c * channel_stride.  The output
    terms (``y_base``, ``y_oc_stride``) place the tile's pixels in the channels-first output.
    ``pixels_contiguous``: pixels g apart in one image read elements g apart (unit strides, and
    every axis but the outermost as long in the output as in the input, as under 'same' padding),
    so that base(col + g) = base(col) + g while col and col + g lie in one image.
    ``pairs_in_rows``: output rows have an even length, so that pixels 2j and 2j + 1 share a row
    and read elements ``pair_step`` apart (W's stride) at every tap.  ``pairs_aligned``: besides,
    the pair's two elements are adjacent and every stride of x but W's is even, so that where a
    tap's W offset is even (``gather_slices``) the pair is one 8-byte-aligned pair of elements,
    inside the image or outside it together."""
    if algebra.spec.layout.channels_last:
        raise ValueError("the gathered A operand is for channels-first images (channels-last ones use an im2col map)")
    spec = algebra.spec
    terms = gemm_terms(algebra, "image")
    delta = terms["a_delta"]
    channel_stride = int(delta.coeff(algebra.c))
    tap_delta = sympy.expand(delta - channel_stride * algebra.c)
    pair_step = int(sympy.expand(terms["exprs"]["a_base"]).coeff(algebra.o[-1]))
    pairs_in_rows = algebra.out_size[-1] % 2 == 0
    return {
        **{key: terms[key] for key in ("a_base", "a_origin", "a_checked", "y_base", "y_oc_stride")},
        "tap_delta": to_c(tap_delta),
        "channel_stride": channel_stride,
        "pixels_contiguous": all(s == 1 for s in spec.stride) and spec.input_size[1:] == algebra.out_size[1:],
        "pairs_in_rows": pairs_in_rows,
        "pair_step": pair_step,
        "pairs_aligned": pairs_in_rows and pair_step == 1 and spec.input_size[-1] % 2 == 0,
        "exprs": {**terms["exprs"], "tap_delta": tap_delta},
    }


def gather_slices(algebra: IndexAlgebra, block_k: int) -> list[tuple[int, bool]]:
    """Per k-slice of the gathered A tile (tap kk = k // chunks, channels from c0 = k % chunks *
    ``block_k``): the offset of channel c0 at that tap from a pixel's base (tap_delta + c0 *
    channel_stride), and whether the tap's W offset (k * dilation - padding) is even, so that where
    ``pairs_aligned`` holds a pair of pixels from an even column reads an aligned element pair."""
    spec = algebra.spec
    terms = gather_terms(algebra)
    chunks = -(-spec.c // block_k)
    kk, chunk = np.divmod(np.arange(algebra.taps * chunks, dtype=np.int64), chunks)
    taps = {str(k): evaluate(e, {"kk": kk}) for k, e in zip(algebra.k, algebra.tap_coords)}
    offsets = evaluate(terms["exprs"]["tap_delta"], {"kk": kk, **taps}) + chunk * block_k * terms["channel_stride"]
    w_offsets = evaluate(algebra.in_coord[-1].subs(algebra.o[-1], 0), {"kk": kk, **taps})
    return [(int(offset), bool(w % 2 == 0)) for offset, w in zip(offsets, w_offsets)]


def transposed_filter_terms(algebra: IndexAlgebra, pitch_multiple: int = 4) -> dict:
    """The channels-last filter K x taps x C rewritten as taps x C x K, with K padded to a multiple
    of ``pitch_multiple`` (TMA row strides must be multiples of 16 bytes), as a TMA tensor of
    ``dims`` (innermost first) with ``byte_strides``: read along output
    channels, a k-step's B fragment is four adjacent channels, so a micro-tile's accumulators
    each meet a B register of one parity (see docs/perf-history.md, GEMM v11).  One thread per filter
    element ``t``, output channels fastest so that the writes coalesce."""
    spec = algebra.spec
    k_pitch = -(-spec.k // pitch_multiple) * pitch_multiple
    shape = (algebra.taps, spec.c, k_pitch)
    kk, c, oc = decompose(algebra.t, (algebra.taps, spec.c, spec.k))
    source = sympy.expand(algebra.w_offset.subs({algebra.oc: oc, algebra.kk: kk, algebra.c: c}))
    destination = linearize([kk, c, oc], shape)
    return {
        "shape": shape,
        "elements": algebra.taps * spec.c * spec.k,
        "source": to_c(source),
        "destination": to_c(destination),
        "dims": (spec.k, spec.c, algebra.taps),
        "byte_strides": (4 * k_pitch, 4 * k_pitch * spec.c),
        "exprs": {"source": source, "destination": destination},
    }


def unselected_addresses_inside(algebra: IndexAlgebra, terms: dict) -> bool:
    """Whether A's address base(pixel) + delta(row) lies inside its source for every pixel and
    row, and base(pixel) alone too (delta 0, the precomputed table's padding rows of the residue
    slice): true when no axis is padded, since the output size keeps every tap of every pixel
    inside.  A kernel then forms the address of an element it does not load (a padding row of
    the residue slice, a pixel past M) without a select; on a padded axis a tap can fall outside
    the source."""
    return not terms["a_checked"]


TAP_MASK_BITS = 64
"""Filters up to this many taps get per-pixel tap masks (one 64-bit word at most)."""


def tap_mask_bits(algebra: IndexAlgebra, terms: dict) -> int:
    """Width of the per-pixel tap mask (32 or 64), or 0 where none is used: no padded axis to
    check, or more taps than ``TAP_MASK_BITS``.  Bit kk of a pixel's mask says whether filter tap
    kk lands inside the image on every padded axis, so a kernel tests one bit per A element
    instead of one range per padded axis (CUTLASS's precomputed filter-position predicates)."""
    if not terms["a_checked"] or algebra.taps > TAP_MASK_BITS:
        return 0
    return 32 if algebra.taps <= 32 else 64


def tap_mask_patterns(algebra: IndexAlgebra, terms: dict) -> list[dict]:
    """The tap mask factored by padded axis, so that a kernel forms it with one range test per
    filter position of each padded axis instead of one per tap and axis: for checked axis j and
    filter position v, ``disp`` = v * dilation_j and ``bits`` = the taps whose position on axis j
    is v.  A pixel's mask is the AND over the checked axes of the OR of the ``bits`` whose
    ``origin_j + disp`` lies in [0, size_j)."""
    taps = np.arange(algebra.taps)
    factors = []
    for check in terms["a_checked"]:
        j = check["axis"]
        position = evaluate(algebra.tap_coords[j], {"kk": taps})
        factors.append({"axis": j, "size": check["size"], "positions": [
            {"disp": v * algebra.spec.dilation[j], "bits": int(sum(1 << int(kk) for kk in taps[position == v]))}
            for v in range(algebra.spec.filter_size[j])]})
    return factors


def row_table(algebra: IndexAlgebra, terms: dict, tap_masks: bool = False) -> list[tuple[int, ...]]:
    """Per column-matrix row, for the precomputed-offset ("precomp") kernels: (delta, disp_j of
    each checked axis), or (delta, tap kk) with ``tap_masks``; evaluated from the same sympy
    expressions the analytic kernels print."""
    rows = np.arange(algebra.rows)
    c_expr, kk_expr = algebra.row_coords
    values = {"row": rows}
    c = evaluate(c_expr, values)
    kk = evaluate(kk_expr, values)
    taps = {f"k{j}": evaluate(e, {"kk": kk}) for j, e in enumerate(algebra.tap_coords)}
    delta = evaluate(terms["a_delta"], {"c": c, **taps})
    if tap_masks:
        columns = [delta, kk]
    else:
        columns = [delta] + [taps[f"k{a['axis']}"] * algebra.spec.dilation[a["axis"]] for a in terms["a_checked"]]
    return [tuple(int(v) for v in entry) for entry in zip(*columns)]


@lru_cache(maxsize=4096)
def _compiled(expr: sympy.Expr):
    symbols = sorted(expr.free_symbols, key=str)
    return symbols, lambdify(symbols, expr)


def evaluate(expr, values: dict[str, np.ndarray]) -> np.ndarray:
    """An index expression over integer arrays (broadcast to the first array's shape), exactly:
    the maps and the precomputed tables use it, compiled once per expression."""
    symbols, function = _compiled(sympy.sympify(expr))
    result = np.asarray(function(*[values[str(s)] for s in symbols]))
    if not np.issubdtype(result.dtype, np.integer):   # a rational coefficient left a float: round it back
        result = np.floor(result.astype(np.float64) + 0.5).astype(np.int64)
    return result.astype(np.int64) * np.ones_like(next(iter(values.values())), dtype=np.int64)
