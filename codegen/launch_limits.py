"""CUDA's launch limits, proved for every launch as the index algebra proves index widths.

A family states the grid its kernels are written for (the *virtual* grid: one block per tile or per
``block`` threads of elements, however many that is).  CUDA allows at most 2^31 - 1 blocks along x
and 65535 along y and z; a launch past them fails or, worse, has its x extent truncated to 32 bits by
a launcher that converts it (a direct kernel once left 86 % of a 20 GB output unwritten that way).
Where the virtual grid fits, it is launched as it is and the kernel source is unchanged.  Where it
does not, the axis that overflows is laid out over ``blockIdx.z`` in layers (``GridFold``): the
kernel rebuilds its virtual block index as ``blockIdx.z * width + blockIdx.<axis>`` and the blocks
of the last layer past the virtual extent return at once.  One virtual block per physical block, as
CUTLASS's threadblock swizzles map tiles over the grid's axes, so kernels that share memory between
the threads of a block need no loop-carried barrier, and every virtual block still runs exactly once.
"""
from __future__ import annotations

from dataclasses import dataclass

from codegen.spec import SpecError

GRID_X_MAX = 2**31 - 1
GRID_YZ_MAX = 65535
BLOCK_DIMS_MAX = (1024, 1024, 64)
TENSOR_MAP_DIM_MAX = 2**32
TENSOR_MAP_STRIDE_LIMIT = 2**40
"""cuTensorMapEncode's bounds: each dimension at most 2^32 elements, each byte stride below 2^40."""


@dataclass(frozen=True)
class GridFold:
    """A virtual ``axis`` ('x' or 'y') of ``blocks`` blocks laid out as ``layers`` layers (grid z) of
    ``width`` blocks; the last layer's blocks at or past ``blocks`` return at once."""

    axis: str
    blocks: int
    width: int
    layers: int

    @property
    def variable(self) -> str:
        """The C name of the rebuilt virtual block index."""
        return f"block_{self.axis}"


def _fold(axis: str, blocks: int, limit: int) -> GridFold:
    layers = -(-blocks // limit)
    return GridFold(axis, blocks, -(-blocks // layers), layers)


def fold_grid(kernel: str, grid: tuple[int, int, int]) -> GridFold | None:
    """How the virtual ``grid`` of ``kernel`` is launched: None where it fits CUDA's limits as it is,
    else the fold of its one overflowing axis over z.  A grid that no fold makes legal (two axes
    over their limits, z in use, or more than 65535 layers) is refused before anything compiles."""
    x, y, z = grid
    if min(grid) < 1:
        raise SpecError("grid", grid, f"kernel {kernel} was planned with an empty grid; this is a convgen bug")
    over = [axis for axis, extent, limit in (("x", x, GRID_X_MAX), ("y", y, GRID_YZ_MAX)) if extent > limit]
    if not over and z <= GRID_YZ_MAX:
        return None
    fold = _fold("x", x, GRID_X_MAX) if over == ["x"] else _fold("y", y, GRID_YZ_MAX) if over == ["y"] else None
    if fold is None or z != 1 or fold.layers > GRID_YZ_MAX:
        raise SpecError("grid", grid, f"kernel {kernel} needs {x} x {y} x {z} blocks, past what one CUDA launch "
                        f"can address even with its x extent laid over z ({GRID_X_MAX} x {GRID_YZ_MAX} x "
                        f"{GRID_YZ_MAX}); split the batch (a smaller n) or use larger tiles")
    return fold


def launch_grid(grid: tuple[int, int, int], fold: GridFold | None) -> tuple[int, int, int]:
    """The grid actually launched: the virtual one, or with its folded axis laid over z."""
    if fold is None:
        return grid
    x, y, _ = grid
    return (fold.width, y, fold.layers) if fold.axis == "x" else (x, fold.width, fold.layers)


def block_index(fold: GridFold | None) -> dict[str, str]:
    """What a kernel's template writes for its block index along x and y, and the prologue that
    rebuilds a folded one (empty where nothing is folded, so such kernels render as before)."""
    names = {"x": "blockIdx.x", "y": "blockIdx.y", "prologue": ""}
    if fold is not None:
        names[fold.axis] = fold.variable
        names["prologue"] = (
            f"\n    // {fold.blocks} virtual blocks along {fold.axis}, past CUDA's limit of one launch: laid out as "
            f"{fold.layers} layers (blockIdx.z) of {fold.width}."
            f"\n    const long long {fold.variable} = (long long)blockIdx.z * {fold.width} + blockIdx.{fold.axis};"
            f"\n    if ({fold.variable} >= {fold.blocks}LL) return;")
    return names


def check_block_dims(kernel: str, block: tuple[int, int, int]) -> None:
    """Each block dimension within CUDA's (1024, 1024, 64); the product is the families' check."""
    for axis, extent, limit in zip("xyz", block, BLOCK_DIMS_MAX):
        if not 1 <= extent <= limit:
            raise SpecError("block", block, f"kernel {kernel} was planned with {extent} threads along {axis}; "
                            f"CUDA allows 1 to {limit}: this is a convgen bug")


def check_tensor_map(buffer: str, dims: tuple[int, ...], strides: tuple[int, ...]) -> None:
    """Refuse a TMA map the driver would not encode (a tensor of a terabyte or more between two
    consecutive indices of one dimension): the kernels without TMA take such tensors."""
    for extent in dims:
        if extent > TENSOR_MAP_DIM_MAX:
            raise SpecError("tma", dims, f"the tensor map of {buffer} would have a dimension of {extent} elements, "
                            f"more than the {TENSOR_MAP_DIM_MAX} TMA addresses; take a kernel without TMA "
                            "(implicit_gemm tma=False, direct variant tiled_register)")
    for stride in strides:
        if stride >= TENSOR_MAP_STRIDE_LIMIT:
            raise SpecError("tma", strides, f"the tensor map of {buffer} would step {stride} bytes along one "
                            f"dimension, TMA's limit being 2^40; take a kernel without TMA (implicit_gemm "
                            "tma=False, direct variant tiled_register)")
