"""Index algebra, derived once with sympy.

Every index map a kernel uses is built here as a sympy expression over named integer symbols
(``n``, ``c``, ``o0..``, ``k0..``, ``i0..``, ``col``, ``row`` ...), with the spec's constants folded
in.  Templates receive the expressions printed as C; tests receive the same expressions lambdified
to numpy.  Nothing downstream re-derives index arithmetic by hand.

This module is the core that every family shares: the printers, the ``IndexAlgebra`` of a spec,
the proofs on it (index width, which bounds checks can fail), the template context every family
starts from, and exact evaluation.  What one family's kernels need beyond that is composed from it
in ``codegen.terms``, which this module never imports.

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

from codegen.spec import ConvSpec

INT32_MAX = 2**31 - 1


def symbol(name: str) -> sympy.Symbol:
    """An index variable: a non-negative integer, which is what lets the printers divide in C."""
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
        return symbol("n")

    @cached_property
    def c(self):
        return symbol("c")

    @cached_property
    def o(self) -> tuple[sympy.Symbol, ...]:
        return tuple(symbol(f"o{j}") for j in range(self.spec.dims))

    @cached_property
    def k(self) -> tuple[sympy.Symbol, ...]:
        return tuple(symbol(f"k{j}") for j in range(self.spec.dims))

    @cached_property
    def i(self) -> tuple[sympy.Symbol, ...]:
        # Input coordinates may be negative (padding) before the bounds check: plain integers.
        return tuple(sympy.Symbol(f"i{j}", integer=True) for j in range(self.spec.dims))

    @cached_property
    def col(self):
        return symbol("col")

    @cached_property
    def row(self):
        return symbol("row")

    @cached_property
    def kk(self):
        return symbol("kk")

    @cached_property
    def pix(self):
        return symbol("pix")

    @cached_property
    def t(self):
        return symbol("t")

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

    def image_coords_in_groups(self, group: int) -> tuple[sympy.Expr, ...]:
        """(n, c, i0, i1[, i2]) of channels-first element group ``t``: the channels taken ``group`` at a
        time (the last group short where C is not a multiple), ``c`` the group's first channel."""
        s = self.spec
        n, channel_group, *i = decompose(self.t, (s.n, -(-s.c // group), *s.input_size))
        return (n, channel_group * group, *i)

    @cached_property
    def col_offset(self) -> sympy.Expr:
        return self.row * self.cols + self.col

    # -- convolution (direct family) -------------------------------------------------------
    @cached_property
    def oc(self):
        """Output channel (filter index)."""
        return symbol("oc")

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


# -- the template context every family shares (col2im's gather ranges ride in it: the typed
# IndexContext of codegen.families.base declares them for every family) -------------------
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
