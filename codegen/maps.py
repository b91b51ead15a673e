"""The sympy index maps evaluated with numpy over whole tensors.

This is the kernels' index arithmetic run on the CPU: comparing it with the slicing references
in the family modules checks the algebra without a GPU (CPU test tier, GPU-less ``convgen fuzz``).
"""
from __future__ import annotations

import numpy as np

from codegen import index
from codegen.families.direct import StageCopy
from codegen.families.implicit_gemm import GatherWide, TmaGatherContext, TmaIm2colContext
from codegen.index import IndexAlgebra, decompose
from codegen.spec import replace as spec_replace
from codegen.terms.gemm import gemm_terms, row_table, tap_mask_bits, tap_mask_patterns, unselected_addresses_inside
from codegen.terms.im2win import window_tensor_shape, window_transform_exprs
from codegen.terms.implicit_gemm import gather_terms, im2col_map_terms, transposed_filter_terms


def _eval(expr, **values) -> np.ndarray:
    return index.evaluate(expr, values)


def _pixel(alg: IndexAlgebra, col) -> dict:
    """The output pixel (n, o0, o1[, o2]) of column-matrix column(s) ``col``, by ``col_coords``."""
    return {name: _eval(expr, col=col) for name, expr in zip(["n", *(f"o{j}" for j in range(alg.spec.dims))],
                                                             alg.col_coords)}


def im2col_by_maps(alg: IndexAlgebra, x: np.ndarray) -> np.ndarray:
    """Every column-matrix element through row_coords, tap_coords, col_coords, in_coord, x_offset."""
    spec = alg.spec
    row, col = np.meshgrid(np.arange(alg.rows), np.arange(alg.cols), indexing="ij")
    c = _eval(alg.row_coords[0], row=row)
    kk = _eval(alg.row_coords[1], row=row)
    values = {"c": c, "kk": kk, "col": col}
    for j, expr in enumerate(alg.tap_coords):
        values[f"k{j}"] = _eval(expr, kk=kk)
    values.update(_pixel(alg, col))
    inside = np.ones(row.shape, dtype=bool)
    for j, expr in enumerate(alg.in_coord):
        values[f"i{j}"] = _eval(expr, **values)
        inside &= (values[f"i{j}"] >= 0) & (values[f"i{j}"] < spec.input_size[j])
    offset = _eval(alg.x_offset, **values)
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    return np.where(inside, flat[np.where(inside, offset, 0)], 0.0)


def col2im_by_maps(alg: IndexAlgebra, col_matrix: np.ndarray) -> np.ndarray:
    """Every image element gathered through the inverse (window) maps, taps in kernel order."""
    spec = alg.spec
    flat_col = np.asarray(col_matrix, dtype=np.float64).reshape(-1)
    t = np.arange(alg.image_elements)
    values: dict[str, np.ndarray] = {}
    if spec.layout.channels_last:
        pix, c = (_eval(expr, t=t) for expr in decompose(alg.t, (alg.pixels, spec.pitch)))
        values["pix"] = pix
        for name, expr in zip(["n"] + [f"i{j}" for j in range(spec.dims)], alg.pixel_coords):
            values[name] = _eval(expr, pix=pix)
    else:
        for name, expr in zip(["n", "c"] + [f"i{j}" for j in range(spec.dims)], alg.image_coords):
            values[name] = _eval(expr, t=t)
        c = values["c"]
    values["c"] = c
    image = np.zeros(alg.image_elements)
    real_channel = c < spec.c
    for kk in range(alg.taps):
        tap = dict(values, kk=np.full_like(t, kk))
        for j, expr in enumerate(alg.tap_coords):
            tap[f"k{j}"] = _eval(expr, kk=tap["kk"])
        valid = real_channel.copy()
        for j, expr in enumerate(alg.window_numerator):
            w = _eval(expr, **tap)
            s = spec.stride[j]
            valid &= (w >= 0) & (w % s == 0) & (w // s < alg.out_size[j])
            tap[f"o{j}"] = np.where(valid, w // s, 0)
        column = _eval(alg.col_linear, **tap)
        row = _eval(alg.row_of, **tap)
        offset = np.where(valid, row * alg.cols + column, 0)
        image += np.where(valid, flat_col[offset], 0.0)
    return image.reshape(alg.image_shape)


def direct_by_maps(alg: IndexAlgebra, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Convolution through the maps: im2col by maps, the filter gathered by w_offset, the product
    scattered by y_offset."""
    spec = alg.spec
    col = im2col_by_maps(alg, x)
    oc, row = np.meshgrid(np.arange(spec.k), np.arange(alg.rows), indexing="ij")
    c = _eval(alg.row_coords[0], row=row)
    kk = _eval(alg.row_coords[1], row=row)
    filters = np.asarray(w, dtype=np.float64).reshape(-1)[_eval(alg.w_offset, oc=oc, c=c, kk=kk)]
    product = filters @ col
    oc, column = np.meshgrid(np.arange(spec.k), np.arange(alg.cols), indexing="ij")
    values = {"oc": oc, **_pixel(alg, column)}
    y = np.full(int(np.prod(alg.output_shape)), np.nan)
    y[_eval(alg.y_offset, **values)] = product
    return y.reshape(alg.output_shape)


def window_tensor_by_maps(alg: IndexAlgebra, x: np.ndarray) -> np.ndarray:
    """The im2win transform through its maps: every tensor element's coordinates and source."""
    terms = window_transform_exprs(alg)
    t = np.arange(int(np.prod(window_tensor_shape(alg))))
    values = {name: _eval(expr, t=t) for name, expr in zip(terms["names"], terms["coords"])}
    inside = np.ones(t.shape, dtype=bool)
    for j, expr in enumerate(terms["sources"]):
        values[f"i{j}"] = _eval(expr, **values)
        inside &= (values[f"i{j}"] >= 0) & (values[f"i{j}"] < alg.spec.input_size[j])
    offset = _eval(alg.x_offset, **values)
    flat = np.asarray(x, dtype=np.float64).reshape(-1)
    return np.where(inside, flat[np.where(inside, offset, 0)], 0.0).reshape(window_tensor_shape(alg))


def gemm_by_maps(alg: IndexAlgebra, x: np.ndarray, w: np.ndarray, source: str) -> np.ndarray:
    """The implicit GEMM as its kernels form it: A(m, row) from a per-pixel base plus a per-row
    delta (both the precomputed table and the printed expression, which must agree), zero where a
    padded axis leaves the image, times B = the filter, scattered by the epilogue's offsets.  Where
    the kernels form addresses without a select, every address they can form must lie inside."""
    spec = alg.spec
    terms = gemm_terms(alg, source)
    table = np.array(row_table(alg, terms), dtype=np.int64).reshape(alg.rows, -1)
    row = np.arange(alg.rows)
    row_values = {"row": row, "c": _eval(alg.row_coords[0], row=row)}
    row_values["kk"] = _eval(alg.row_coords[1], row=row)
    for j, expr in enumerate(alg.tap_coords):
        row_values[f"k{j}"] = _eval(expr, kk=row_values["kk"])
    delta = _eval(terms["a_delta"], **row_values)
    if not np.array_equal(delta, table[:, 0]):
        raise AssertionError("precomputed row table disagrees with the printed delta")
    col = np.arange(alg.cols)
    pixel = _pixel(alg, col)
    base = _eval(terms["exprs"]["a_base"], **pixel)
    inside = np.ones((alg.cols, alg.rows), dtype=bool)
    for position, check in enumerate(terms["a_checked"]):
        j = check["axis"]
        origin = _eval(terms["exprs"]["a_origin"][j], **pixel)
        coordinate = origin[:, None] + table[None, :, 1 + position]
        inside &= (coordinate >= 0) & (coordinate < check["size"])
    if tap_mask_bits(alg, terms) and not np.array_equal(inside_by_tap_masks(alg, terms, pixel), inside):
        raise AssertionError("tap masks disagree with the per-axis bounds checks")
    src = window_tensor_by_maps(alg, x) if source == "window" else np.asarray(x, dtype=np.float64)
    flat = src.reshape(-1)
    offset = base[:, None] + delta[None, :]
    if unselected_addresses_inside(alg, terms):
        formed = np.concatenate([offset.ravel(), base])
        if formed.min() < 0 or formed.max() >= flat.size:
            raise AssertionError("an A address formed without a select leaves its source")
    a = np.where(inside, flat[np.where(inside, offset, 0)], 0.0)
    b = np.asarray(w, dtype=np.float64).reshape(spec.k, alg.rows).T
    product = a @ b
    y_base = _eval(terms["exprs"]["y_base"], **pixel)
    y = np.full(int(np.prod(alg.output_shape)), np.nan)
    y[y_base[:, None] + np.arange(spec.k)[None, :] * terms["y_oc_stride"]] = product
    return y.reshape(alg.output_shape)


def inside_by_tap_masks(alg: IndexAlgebra, terms: dict, pixel: dict) -> np.ndarray:
    """(pixel, row) in-image flags as the tap-mask kernels form them: each pixel's mask is the AND
    over the padded axes of the taps whose filter position on that axis lands inside
    (``tap_mask_patterns``), and each row tests the bit of the tap its table entry names."""
    mask = np.full(len(pixel["n"]), (1 << alg.taps) - 1, dtype=np.uint64)
    for factor in tap_mask_patterns(alg, terms):
        origin = _eval(terms["exprs"]["a_origin"][factor["axis"]], **pixel)
        inside = np.zeros_like(mask)
        for position in factor["positions"]:
            lands = (origin + position["disp"] >= 0) & (origin + position["disp"] < factor["size"])
            inside |= np.where(lands, np.uint64(position["bits"]), np.uint64(0))
        mask &= inside
    row_taps = np.array(row_table(alg, terms, tap_masks=True), dtype=np.int64)[:, 1].astype(np.uint64)
    return ((mask[:, None] >> row_taps[None, :]) & np.uint64(1)).astype(bool)


def im2win_chunks_by_maps(plan, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """A chunked im2win plan run on the CPU step by step: each transform takes the slice of x its
    offset selects, each GEMM (one chunk's maps) writes the slice of y its offset selects; NaN
    where no chunk writes, so wrong strides show as holes or overlaps."""
    part = IndexAlgebra(spec_replace(plan.spec, n=plan.spec.n // plan.chunks))
    image, output = int(np.prod(part.image_shape)), int(np.prod(part.output_shape))
    x_flat = np.asarray(x, dtype=np.float64).reshape(-1)
    y = np.full(plan.output.elements, np.nan)
    chunk_x = None
    for step in plan.schedule:
        at = dict(zip(step.args, step.offsets or (0,) * len(step.args)))
        if "x" in at:
            chunk_x = x_flat[at["x"]:at["x"] + image].reshape(part.image_shape)
        else:
            y[at["y"]:at["y"] + output] = gemm_by_maps(part, chunk_x, w, "window").reshape(-1)
    return y.reshape(plan.output.shape)


def stage_copies(split: StageCopy, units: int, rows: int, unit_floats: int, threads: int):
    """The (row, column) cells of a tiled_register stage that a block's threads copy, thread by
    thread as the kernel's fetch does (``direct.copy_split``); a bounds guard the kernel leaves
    out must never be needed."""
    for tid in range(threads):
        first_unit, first_row = tid % split.lanes, tid // split.lanes
        if split.idle_threads and first_row >= split.rows_per_round:
            continue
        for across in range(split.unit_rounds):
            unit = first_unit + across * split.lanes
            if unit >= units:
                assert split.unit_tail, f"thread {tid} copies unit {unit} of a {units}-unit row unguarded"
                break
            for down in range(split.row_rounds):
                row = first_row + down * split.rows_per_round
                if row >= rows:
                    assert split.row_tail, f"thread {tid} copies row {row} of {rows} unguarded"
                    break
                for col in range(unit * unit_floats, (unit + 1) * unit_floats):
                    yield row, col


def register_tiles_by_terms(spec, tiles, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The tiled_register (or tiled_tma) kernel's tile algebra run on the CPU, thread by thread:
    the shared tile is filled from the copy origin the kernel prints (NaN where the kernel copies
    nothing, zeros for ghost cells; tiled_tma's TMA box fills every cell of its rows x row pitch,
    and its first column must sit on a 16-byte boundary), each thread reads its windows at the
    printed offsets and applies the (output row, filter row) pairs the template lists.  Only the
    layout's x/y offsets are left to the GPU tests."""
    from codegen.families import get_family

    alg = IndexAlgebra(spec)
    family = get_family("direct")
    tiles = family.complete_tiles(spec, tiles if isinstance(tiles, dict) else tiles.to_dict())
    context = family.plan(spec, tiles).context
    rows_axis, cols_axis = context.axes
    a, b = rows_axis["axis"], cols_axis["axis"]
    window_floats = context.window_loads * 4 if context.vector_window else cols_axis["window_extent"]
    threads = (tiles.tile_h // tiles.rows_per_thread, tiles.tile_w // tiles.per_thread)
    x = np.asarray(x, dtype=np.float64)
    w = np.asarray(w, dtype=np.float64)
    if spec.layout.channels_last:
        x, w = np.moveaxis(x[..., :spec.c], -1, 1), np.moveaxis(w, -1, 1)
    size_a, size_b = spec.input_size[a], spec.input_size[b]

    evaluated: dict = {}

    def one(value: str, **values) -> int:
        """A printed index expression at integer values (memoised: the thread loops ask the same few)."""
        key = (value, tuple(sorted(values.items())))
        if key not in evaluated:
            evaluated[key] = int(_eval(value, **{k: np.int64(v) for k, v in values.items()}))
        return evaluated[key]

    if tiles.variant == "tiled_tma":
        assert context.box == (context.row_pitch, rows_axis["halo_extent"]), context.box
        copied = [(row, col) for row in range(rows_axis["halo_extent"]) for col in range(context.row_pitch)]
    else:
        copied = list(stage_copies(context.copy, context.row_units, rows_axis["halo_extent"],
                                   4 if context.vector_load else 1, threads[0] * threads[1]))

    def plane(xp: np.ndarray, wp: np.ndarray) -> np.ndarray:
        """One 2D convolution (N, C, H, W) * (K, C, R, S) the way the kernel's blocks compute it."""
        out = np.full((spec.n, spec.k, alg.out_size[a], alg.out_size[b]), np.nan)
        for ta in range(rows_axis["tiles"]):
            for tb in range(cols_axis["tiles"]):
                origin_a = one(rows_axis["halo_origin"], **{f"tile{a}": ta})
                origin_b = one(cols_axis["aligned_origin" if context.vector_load else "halo_origin"], **{f"tile{b}": tb})
                if context.vector_load and (origin_b % 4 or size_b % 4):
                    raise AssertionError(f"16-byte copies from column {origin_b} of a row of {size_b}: misaligned")
                if tiles.variant == "tiled_tma":   # the kernel's box starts at the aligned column
                    check_box_start("x", one(cols_axis["aligned_origin"], **{f"tile{b}": tb}))
                shared = np.full((spec.n, spec.c, rows_axis["halo_extent"], context.row_pitch), np.nan)
                for row, col in copied:
                    ia, ib = origin_a + row, origin_b + col
                    inside = 0 <= ia < size_a and 0 <= ib < size_b
                    shared[:, :, row, col] = xp[:, :, ia, ib] if inside else 0.0
                for la in range(threads[0]):
                    for lb in range(threads[1]):
                        first_row = one(rows_axis["window_start"], **{f"l{a}": la})
                        first_col = one(cols_axis["window_start"], **{f"l{b}": lb}) + context.window_start_shift
                        if context.vector_window and first_col % 4:
                            raise AssertionError(f"float4 window read at shared column {first_col}: misaligned")
                        if first_col + window_floats > context.row_pitch:
                            raise AssertionError(f"window of {window_floats} at column {first_col} passes the "
                                                 f"row pitch {context.row_pitch}")
                        acc = np.zeros((spec.n, spec.k, tiles.rows_per_thread, tiles.per_thread))
                        for r, taps in enumerate(rows_axis["window_taps"]):
                            window = shared[:, :, first_row + r, first_col:first_col + window_floats]
                            for u, ka in taps:
                                for kb in range(spec.filter_size[b]):
                                    for v in range(tiles.per_thread):
                                        e = context.window_offset + one(cols_axis["window_index"], v=v, **{f"k{b}": kb})
                                        acc[:, :, u, v] += window[:, :, e] @ wp[:, :, ka, kb].T
                        for u in range(tiles.rows_per_thread):
                            for v in range(tiles.per_thread):
                                oa = ta * tiles.tile_h + la * tiles.rows_per_thread + u
                                ob = tb * tiles.tile_w + lb * tiles.per_thread + v
                                if oa < out.shape[2] and ob < out.shape[3]:
                                    out[:, :, oa, ob] = acc[:, :, u, v]
        return out

    if spec.dims == 2:
        y = plane(x, w)
    else:
        y = np.zeros((spec.n, spec.k, *alg.out_size))
        for o0 in range(alg.out_size[0]):
            for k0 in range(spec.filter_size[0]):
                i0 = one(str(alg.in_coord[0]), o0=o0, k0=k0)
                if 0 <= i0 < spec.input_size[0]:
                    y[:, :, o0] += plane(x[:, :, i0], w[:, :, k0])
    return np.moveaxis(y, 1, -1) if spec.layout.channels_last else y


def check_box_start(buffer: str, innermost: int) -> None:
    """TMA's rule for the innermost coordinate of a copy: a multiple of 16 bytes (4 floats).  The
    driver cannot check it when it encodes a map, since it is the kernel that names coordinates;
    on the H100 a copy from column -1 stopped the kernel with an illegal instruction (docs/perf-history.md,
    direct v8 and GEMM v23).  The CPU models hold every copy they make to it."""
    if innermost % 4:
        raise AssertionError(f"TMA copy of {buffer} from innermost coordinate {innermost}: not 16-byte aligned")


def im2col_walk(tensor_map, coords: tuple[int, ...], offsets: tuple[int, ...], count: int) -> list[tuple[int, ...]]:
    """The pixels one TMA im2col copy visits, as the CUDA driver API and the PTX ISA describe the
    mode: along each spatial axis (innermost first) the bounding box runs from the lower corner to
    the axis size - 1 + the upper corner in steps of the traversal stride; the walk starts at the
    copy's coordinates, steps along the innermost axis, and on leaving the box wraps to the lower
    corner and steps the next axis out, then the image.  Each visited pixel is read at its
    coordinates plus the tap's offsets: (image, spatial coordinates innermost first)."""
    lower, upper = tensor_map.corners
    sizes = tensor_map.dims[1:-1]
    steps = tensor_map.traversal_strides[1:-1]
    position, image = list(coords[1:-1]), coords[-1]
    pixels = []
    for _ in range(count):
        pixels.append((image, *(p + o for p, o in zip(position, offsets))))
        for j in range(len(position)):
            position[j] += steps[j]
            if position[j] <= sizes[j] - 1 + upper[j]:
                break
            position[j] = lower[j]
        else:
            image += 1
    return pixels


def tma_gemm_by_terms(spec, tiles, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """The TMA implicit GEMM's plan run on the CPU, block by block over its whole tiles and, with
    stream-K, its span of (tile, slice) steps: the filter is transposed into its workspace by the
    printed source and destination offsets (NaN where nothing is written), the tiles that blocks
    share are zeroed, each slice's B tile and (channels-last) A tile are read through the tensor
    maps' dims, byte strides, corners and traversal strides (zeros outside a tensor) at the
    coordinates the producer computes (from the expressions it prints), or (channels-first) A is
    gathered by the printed offsets, and the tile's rows and channels that lie inside the output
    are stored, or added where the tile is shared (NaN where nothing is written).  The hardware's
    share is taken from its documentation (``im2col_walk``); the GPU tests check that reading of it."""
    from codegen.families import get_family
    from codegen.families.gemm_tiles import shared_tiles, stream_k_span

    family = get_family("implicit_gemm")
    tiles = family.complete_tiles(spec, {**(tiles if isinstance(tiles, dict) else tiles.to_dict()), "tma": True})
    plan = family.plan(spec, tiles)
    context = plan.context
    *x_maps, w_map = plan.launches[-1].tensor_maps
    alg = IndexAlgebra(spec)
    transpose = transposed_filter_terms(alg)
    flat_w = np.asarray(w, dtype=np.float64).reshape(-1)
    wt = np.full(int(np.prod(transpose["shape"])), np.nan)
    t = np.arange(transpose["elements"])
    wt[_eval(transpose["exprs"]["destination"], t=t)] = flat_w[_eval(transpose["exprs"]["source"], t=t)]
    flat_x = np.asarray(x, dtype=np.float64).reshape(-1)

    def read(flat: np.ndarray, tensor_map, coords: list[np.ndarray]) -> np.ndarray:
        """Elements at integer coordinate arrays (innermost first) through the map's byte strides."""
        inside = np.ones(np.broadcast(*coords).shape, dtype=bool)
        for c, d in zip(coords, tensor_map.dims):
            inside &= (c >= 0) & (c < d)
        offset = coords[0] * 4 + sum(c * s for c, s in zip(coords[1:], tensor_map.strides))
        return np.where(inside, flat[np.where(inside, offset // 4, 0)], 0.0)

    bm, bn, bk = context.BM, context.BN, context.BK
    gemm_m, gemm_n = context.GEMM_M, context.GEMM_N
    if context.gather:
        assert not context.vector_store or gemm_m // spec.n % 4 == 0, "float4 stores would cross an image"
    else:
        assert not context.vector_store or gemm_n % 4 == 0, "float4 stores of a channel group would pass K"
    y = np.full(gemm_m * gemm_n, np.nan)
    slices = context.slices

    def tile_rows(tile: int):
        """(flat output slice, tile row, channel count) of each of the tile's rows inside the output."""
        col, n_tile = tile // context.n_tiles * bm, tile % context.n_tiles * bn
        stored = range(n_tile, min(n_tile + bn, gemm_n))
        return [(slice((col + i) * gemm_n + stored.start, (col + i) * gemm_n + stored.stop), i, len(stored))
                for i in range(bm) if col + i < gemm_m]

    blocks = context.grid_blocks
    for tile in shared_tiles(context.tiles_total, slices, blocks) if context.stream_k else ():  # the zeroing launch
        for flat, _, _ in tile_rows(tile):
            y[flat] = 0.0

    def work(block: int):
        """(tile, first slice, end slice) in the order the block takes them."""
        if not context.stream_k:
            yield from ((tile, 0, slices) for tile in range(block, context.tiles_total, blocks))
            return
        for round_ in range(context.dp_rounds):
            yield block + round_ * blocks, 0, slices
        step, end = stream_k_span(block, context.tiles_total, slices, blocks)
        while step < end:
            tile = step // slices
            k_first = step - tile * slices
            k_last = min(slices, k_first + end - step)
            step += k_last - k_first
            yield tile, k_first, k_last

    if context.gather:
        a_tile = _gathered_a_tile(spec, context, flat_x)
    else:
        a_tile = _im2col_a_tile(spec, context, flat_x, x_maps[0], read)
    for block in range(blocks):
        for tile, k_first, k_last in work(block):
            col = tile // context.n_tiles * bm
            n_tile = tile % context.n_tiles * bn
            check_box_start(w_map.buffer, n_tile)      # every B box of the tile starts at n_tile
            load = a_tile(col)
            acc = np.zeros((bm, bn))
            for k in range(k_first, k_last):
                kk, c0 = k // context.c_chunks, k % context.c_chunks * bk
                channels = c0 + np.arange(bk)[None, :]
                b = read(wt, w_map, [n_tile + np.arange(bn)[None, :], channels.T, np.array(kk)])
                acc += load(kk, c0) @ b
            whole = k_first == 0 and k_last == slices
            for flat, i, count in tile_rows(tile):
                y[flat] = acc[i, :count] if whole else y[flat] + acc[i, :count]
    if context.gather:   # the rows above are (pixel, channel); the kernel stores channels-first
        y = y.reshape(spec.n, -1, gemm_n).transpose(0, 2, 1)
    return y.reshape(alg.output_shape)


def _im2col_a_tile(spec, context: TmaIm2colContext, flat_x: np.ndarray, x_map, read):
    """``a_tile(col)(kk, c0)``: the A tile of the pixels from ``col`` at tap kk, channels c0 on, as
    the producer's im2col copies load it (box origins from the printed expressions)."""
    alg = IndexAlgebra(spec)
    im2col = im2col_map_terms(alg)["exprs"]

    def a_tile(col: int):
        starts = []
        for box in range(context.boxes):
            pixel = {name: np.int64(v) for name, v in _pixel(alg, np.int64(col + box * context.box_m)).items()}
            starts.append((*(int(_eval(e, **pixel)) for e in im2col["origin"]), int(pixel["n"])))

        def load(kk: int, c0: int) -> np.ndarray:
            check_box_start(x_map.buffer, c0)
            offsets = tuple(int(_eval(e, kk=np.int64(kk))) for e in im2col["tap_offsets"])
            walk = np.array([pixel for start in starts
                             for pixel in im2col_walk(x_map, (c0, *start), offsets, context.box_m)])
            channels = c0 + np.arange(context.BK)[None, :]
            return read(flat_x, x_map, [channels, *(walk[:, j, None] for j in range(1, walk.shape[1])), walk[:, :1]])
        return load
    return a_tile


def _gathered_a_tile(spec, context: TmaGatherContext, flat_x: np.ndarray):
    """``a_tile(col)(kk, c0)``: the A tile of the pixels from ``col`` at tap kk, channels c0 on, as
    the producer warps gather it from a channels-first image: per pixel the printed base and
    origins, each pixel addressed as the kernel does (from its group's anchor pixel plus the
    member's offset, ``gather_groups``), per slice the offset from the constant table (or the
    tap's delta) plus channel times the channel stride, zeros (zero-size copies) for pixels past
    the output, taps in the padding and channels past C.  Where a slice copies pixel pairs as one
    8-byte copy, it checks that each pair is aligned and in or out of the image together, and
    gives both elements the first pixel's validity, as the kernel does."""
    alg = IndexAlgebra(spec)
    terms = gather_terms(alg)
    exprs = terms["exprs"]
    gemm_m, bk, bm = context.GEMM_M, context.BK, context.BM
    columns, offsets = context.gather_columns, context.gather_offsets
    width = 2 if context.gather_pairs else 1
    anchor, member_offset = np.arange(bm), np.zeros(bm, dtype=np.int64)
    for column in range(columns):
        for group in context.gather_groups:
            for u, offset in group["members"]:
                at = width * column + offsets[u]
                anchor[at], member_offset[at] = width * column + offsets[group["anchor"]], offset
    table = context.slice_table
    flagged = context.gather_wide is GatherWide.SLICE      # the table's entries: 2 * offset + wide

    def a_tile(col: int):
        cols = col + np.arange(bm, dtype=np.int64)
        inside = cols < gemm_m
        pixel = _pixel(alg, np.where(inside, cols, 0))
        base = np.broadcast_to(_eval(exprs["a_base"], **pixel), cols.shape)[anchor] + member_offset
        origins = {check["axis"]: _eval(exprs["a_origin"][check["axis"]], **pixel) for check in terms["a_checked"]}

        def load(kk: int, c0: int) -> np.ndarray:
            k = kk * context.c_chunks + c0 // bk
            taps = {f"k{j}": np.int64(_eval(e, kk=np.int64(kk))) for j, e in enumerate(alg.tap_coords)}
            valid = inside.copy()
            for check in terms["a_checked"]:
                at = origins[check["axis"]] + taps[f"k{check['axis']}"] * spec.dilation[check["axis"]]
                valid &= (at >= 0) & (at < check["size"])
            if table is None:
                slice_offset = _eval(exprs["tap_delta"], **taps) + c0 * terms["channel_stride"]
            else:
                slice_offset = table[k] >> 1 if flagged else table[k]
            channels = np.arange(bk)
            offset = base[:, None] + slice_offset + channels[None, :] * terms["channel_stride"]
            wide = context.gather_wide is GatherWide.ALWAYS or (flagged and table[k] & 1)
            if wide:
                first = np.arange(0, bm, 2)
                assert np.array_equal(valid[first], valid[first + 1]), "an 8-byte pair copy half in the padding"
                assert not (offset[first][valid[first]] % 2).any(), "an 8-byte pair copy from an odd element"
                valid[first + 1] = valid[first]
            present = valid[:, None] & (c0 + channels < spec.c)[None, :]
            return np.where(present, flat_x[np.where(present, offset, 0)], 0.0)
        return load
    return a_tile


def evaluate(family: str, spec, *inputs: np.ndarray) -> np.ndarray:
    alg = IndexAlgebra(spec)
    if family == "im2col":
        return im2col_by_maps(alg, inputs[0])
    if family == "col2im":
        return col2im_by_maps(alg, inputs[0])
    if family == "direct":
        return direct_by_maps(alg, *inputs)
    if family in ("implicit_gemm", "im2col_gemm"):
        return gemm_by_maps(alg, *inputs, source="image")
    if family == "im2win":
        return gemm_by_maps(alg, *inputs, source="window")
    raise ValueError(f"no map evaluation for family {family!r}")
