"""The TMA implicit GEMM's operands (``codegen.families.implicit_gemm``): the channels-last image as
a TMA im2col map, the channels-first image as the producer warps gather it, and the filter
transposed for the B tiles; built on the A terms of ``codegen.terms.gemm``.
"""
from __future__ import annotations

import numpy as np
import sympy

from codegen.index import IndexAlgebra, decompose, evaluate, linearize, to_c
from codegen.terms.gemm import gemm_terms


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
    strides, step = [], spec.dtype.itemsize * spec.pitch
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
