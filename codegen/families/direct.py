"""Direct convolution (seed 002), generalised from the single-channel 2D filter to N, C, K, 2D/3D,
every layout, stride, padding and dilation.  ``y = conv(x, w)``: x in the spec's layout (with its
channel pitch), w K x C x (T x) R x S channels-first or K x (T x) R x S x C channels-last, y in the
spec's layout with K channels.  Four variants, chosen by the ``variant`` tile:

- ``basic``: one thread per output element, input and filter from global memory, ghost cells by
  bounds checks.
- ``constant``: the same with the filter in a ``__constant__`` array sized for the spec (refused
  when it passes the 64 KB bank); the launcher uploads it before each launch.  Threads run
  output-channel-major so that a warp reads one filter element at a time (a broadcast).
- ``tiled_halo``: blocks sized to the *input* tile (output tile plus halo) on the last two axes;
  every thread loads one input into shared memory, the edge threads then stay idle.
- ``tiled_cache``: blocks sized to the *output* tile; only the tile's own inputs go to shared
  memory, halo cells are read from global memory and left to L1/L2.
- ``tiled_register`` (beyond the seed): the block loads the input tile cooperatively, then each
  thread computes ``per_thread`` consecutive outputs of a row from a register window (float4 reads
  of shared memory when the W stride is 1), so each input read from shared memory feeds up to
  ``per_thread`` FMAs instead of one; the filter is read with block-uniform addresses (broadcast).

Tile sizes, filter size, stride, padding and dilation are compile-time constants of the kernel.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import numpy as np

from codegen import index
from codegen.families.base import (Buffer, Family, KernelPlan, Launch, convolution_selftest_context, grid_for,
                                   kernel_name)
from codegen.families.im2col import column_matrix_reference
from codegen.spec import ConvSpec, SpecError
from codegen.tiles import TileParam, Tiles, check_block, check_shared

CONSTANT_BANK_BYTES = 64 * 1024
VARIANTS = ("basic", "constant", "tiled_halo", "tiled_cache", "tiled_register")


@dataclass(frozen=True)
class DirectTiles(Tiles):
    variant: str = "tiled_halo"
    threads: int = 256
    tile_h: int = 16
    tile_w: int = 16
    per_thread: int = 8

    PARAMS: ClassVar = (
        TileParam("variant", "which direct kernel", choices=VARIANTS),
        TileParam("threads", "threads per block (basic, constant)", minimum=32, maximum=1024, multiple_of=32),
        TileParam("tile_h", "output tile rows (tiled variants; the H axis)", minimum=1, maximum=64),
        TileParam("tile_w", "output tile columns (tiled variants; the W axis)", minimum=1, maximum=256),
        TileParam("per_thread", "tiled_register: consecutive outputs per thread along W (tile_w must be a "
                  "multiple)", choices=(1, 2, 4, 8)),
    )


def convolution_reference(spec: ConvSpec, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """float64 convolution as filter matrix x column matrix (the slicing im2col, not the sympy maps)."""
    alg = index.IndexAlgebra(spec)
    col = column_matrix_reference(spec, x)
    w = np.asarray(w, dtype=np.float64)
    if spec.layout.channels_last:
        matrix = w.reshape(spec.k, alg.taps * spec.c)          # rows of col: (taps, c)
    else:
        matrix = w.reshape(spec.k, spec.c * alg.taps)          # rows of col: (c, taps)
    out = (matrix @ col).reshape(spec.k, spec.n, *alg.out_size)
    if spec.layout.channels_last:
        return np.moveaxis(out, 0, -1)
    return np.moveaxis(out, 0, 1)


def _fit_tile(out: int, tile: int) -> int:
    """No larger than the output itself, so tiny outputs do not launch idle threads."""
    return max(1, min(tile, out))


class Direct(Family):
    name = "direct"
    template = "direct.cu.j2"
    tiles_type = DirectTiles
    summary = "direct convolution: basic, constant-memory filter, shared-memory halo, halo from cache"

    def default_tiles(self, spec: ConvSpec) -> DirectTiles:
        """Tiled with the halo in shared memory, the seed's fastest for a single-channel filter, with
        an output tile whose input tile stays within 32 x 32 threads."""
        alg = index.IndexAlgebra(spec)
        sizes = []
        for j in (spec.dims - 2, spec.dims - 1):
            room = (32 - (spec.filter_size[j] - 1) * spec.dilation[j] - 1) // spec.stride[j] + 1
            sizes.append(_fit_tile(alg.out_size[j], max(1, room)))
        variant = "tiled_halo" if all(
            (t - 1) * s + (f - 1) * d + 1 <= 32
            for t, s, f, d in zip(sizes, spec.stride[-2:], spec.filter_size[-2:], spec.dilation[-2:])) else "basic"
        return DirectTiles(variant=variant, tile_h=sizes[0], tile_w=sizes[1])

    def register_tiles(self, spec: ConvSpec) -> DirectTiles:
        """tiled_register geometry: up to 8 outputs per thread along W, at most 32 threads across
        and 256 per block, and an output tile no larger than the output."""
        out_h, out_w = index.IndexAlgebra(spec).out_size[-2:]
        per = 8 if out_w >= 64 else 4 if out_w >= 16 else 1
        across = min(32, -(-out_w // per))
        rows = max(1, min(8, out_h, 256 // across))
        return DirectTiles(variant="tiled_register", tile_h=rows, tile_w=per * across, per_thread=per)

    def tuning_space(self, spec: ConvSpec) -> list[dict]:
        """Both one-thread-per-output variants at three block sizes, the tiled variants at square
        and wide tiles, and the register-blocked one at 2-8 outputs per thread."""
        space = [DirectTiles(variant=v, threads=t).to_dict() for v in ("basic", "constant") for t in (128, 256, 512)]
        for variant in ("tiled_halo", "tiled_cache"):
            space += [DirectTiles(variant=variant, tile_h=h, tile_w=w).to_dict() for h, w in ((8, 8), (16, 16), (8, 32))]
        for per in (2, 4, 8):
            for rows in (4, 8, 16):
                space.append(DirectTiles(variant="tiled_register", tile_h=rows, tile_w=32 * per // 2,
                                         per_thread=per).to_dict())
        return space

    def complete_tiles(self, spec: ConvSpec, requested: dict) -> DirectTiles:
        """Unset tiles come from the heuristic of the requested variant."""
        base = self.register_tiles(spec) if requested.get("variant") == "tiled_register" else self.default_tiles(spec)
        return DirectTiles.from_dict({**base.to_dict(), **requested})

    def plan(self, spec: ConvSpec, tiles: DirectTiles) -> KernelPlan:
        alg = self.algebra(spec)
        variant = tiles.variant
        filter_bytes = math.prod(alg.filter_shape) * 4
        context: dict = {}
        constants: tuple[tuple[str, str], ...] = ()
        if variant == "constant" and filter_bytes > CONSTANT_BANK_BYTES:
            raise SpecError("tiles.variant", "constant",
                            f"the filter takes {filter_bytes} bytes (K*C*taps*4) but the constant bank holds "
                            f"{CONSTANT_BANK_BYTES}; use another variant or fewer channels")
        name = kernel_name(self.name, variant, spec, tiles)
        if variant in ("basic", "constant"):
            total = spec.n * spec.k * math.prod(alg.out_size)
            block = (tiles.threads, 1, 1)
            grid = (grid_for(total, tiles.threads), 1, 1)
            if variant == "constant":
                context["filter_symbol"] = f"{name}_filter"
                constants = ((context["filter_symbol"], "w"),)
        else:
            tile = (tiles.tile_h, tiles.tile_w)
            terms = index.tile_terms(alg, tile)
            if variant == "tiled_halo":
                block = (terms["axes"][1]["halo_extent"], terms["axes"][0]["halo_extent"], 1)
                shared = block[0] * block[1] * 4
            elif variant == "tiled_register":
                per = tiles.per_thread
                if tiles.tile_w % per:
                    raise SpecError("tiles.tile_w", tiles.tile_w, f"must be a multiple of tiles.per_thread ({per})")
                terms = index.tile_terms(alg, tile, per)
                a, b = terms["axes"]
                window = (per - 1) * spec.stride[b["axis"]] + (spec.filter_size[-1] - 1) * spec.dilation[-1] + 1
                vector = spec.stride[b["axis"]] == 1 and per % 4 == 0
                pitch = -(-(b["halo_extent"] + 3) // 4) * 4
                block = (tiles.tile_w // per, tiles.tile_h, 1)
                shared = a["halo_extent"] * pitch * 4
                context.update(per_thread=per, window_size=window, vector_window=vector, row_pitch=pitch,
                               window_loads=-(-window // 4))
            else:
                block = (tiles.tile_w, tiles.tile_h, 1)
                shared = tiles.tile_w * tiles.tile_h * 4
            check_block(block[0] * block[1], "tiles.tile_h/tile_w", tile)
            check_shared(shared, "tiles.tile_h/tile_w", tile)
            outer = (spec.n, spec.k, *alg.out_size[: spec.dims - 2], *(a["tiles"] for a in terms["axes"]))
            blocks = math.prod(outer)
            grid = (blocks, 1, 1)
            names = ["n", "oc"] + [f"o{j}" for j in range(spec.dims - 2)] + [f"tile{a['axis']}" for a in terms["axes"]]
            context.update(terms, block_names=names,
                           block_coords=[index.to_c(e) for e in index.decompose(alg.t, outer)])
        check_block(block[0] * block[1], "tiles.threads", tiles.threads)
        launch = Launch(name, grid, block, args=("x", "y") if variant == "constant" else None)
        context.update(index.template_context(alg, launch.threads))
        context.update(variant=variant, kernel=name, block_threads=block[0] * block[1])
        context.update(convolution_selftest_context(alg))
        buffers = (Buffer("x", alg.image_shape, "in"), Buffer("w", alg.filter_shape, "in"),
                   Buffer("y", alg.output_shape, "out"))
        return KernelPlan(self.name, variant, spec, tiles, buffers, (launch,), context, constants=constants)

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        x, w = inputs
        return convolution_reference(spec, x, w)


FAMILY = Direct()
