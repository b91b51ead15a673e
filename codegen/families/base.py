"""What every kernel family provides, and the plan it hands to rendering, compiling and launching.

A family turns (spec, tiles) into a ``KernelPlan``: which template variant to render, the buffers
the kernels take (in launch-argument order), the launches with their geometry, and the template
context.  Everything downstream (render, compile, launch, emit) reads only the plan.
"""
from __future__ import annotations

import dataclasses
import enum
import hashlib
import math
import types
import typing
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any, ClassVar

import numpy as np
import sympy

from codegen import index, launch_limits, precision
from codegen.device import Device
from codegen.index import IndexAlgebra
from codegen.spec import ConvSpec, DType, MathMode, SpecError, uses_tensor_cores
from codegen.spec import replace as replace_spec
from codegen.tiles import Tiles


@dataclass(frozen=True)
class Buffer:
    """One kernel argument: a dense array of ``shape`` that the kernels read (``in``), write
    (``out``), or use as scratch between launches (``workspace``, allocated by the caller)."""

    name: str
    shape: tuple[int, ...]
    role: str
    alignment: int = 4
    dtype: DType = DType.float32
    """Element type: the spec's for inputs and output; workspaces hold FP32 partial sums."""

    @property
    def elements(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class TensorMap:
    """A TMA tensor map of a buffer, passed by value before the buffer arguments: the tensor of
    ``dtype`` elements (TMA moves their bits: it only needs their size), ``dims`` of them
    (innermost first) with byte ``strides`` for every dimension but the innermost, read in boxes
    of ``box`` elements; elements outside the tensor read as zero.  The map holds the buffer's
    address, so the launcher encodes one per buffer address.

    ``swizzle`` (0, 32, 64 or 128 bytes) permutes the 16-byte chunks of each shared-memory row of
    that width (chunk j of row r lands at j ^ (r x width / 128 mod width / 16): r % 8 for 128), so
    that reads down a column spread over the banks.
    With ``corners`` the map is an *im2col* map (``terms.implicit_gemm.im2col_map_terms``): the lower and upper
    corners of the spatial axes, innermost first, ``box`` is (channels per pixel, pixels per
    column) and ``element_strides`` the traversal stride of every dimension."""

    buffer: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    swizzle: int = 0
    corners: tuple[tuple[int, ...], tuple[int, ...]] | None = None
    element_strides: tuple[int, ...] = ()
    dtype: DType = DType.float32

    def __post_init__(self) -> None:
        launch_limits.check_tensor_map(self.buffer, self.dims, self.strides)

    @property
    def traversal_strides(self) -> tuple[int, ...]:
        return self.element_strides or (1,) * len(self.dims)


@dataclass(frozen=True)
class Launch:
    """One kernel launch over the virtual ``grid`` (``launch_grid`` is what CUDA is given where it
    passes the launch limits); ``args`` names the buffers passed, in order (None: all of them),
    ``offsets`` (when given) the element offset into each, for launches over a slice, and
    ``chunk_strides`` (when given) how far each advances per batch chunk of a chunked plan;
    ``tensor_maps`` come first in the kernel's parameters."""

    kernel: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    args: tuple[str, ...] | None = None
    offsets: tuple[int, ...] | None = None
    chunk_strides: tuple[int, ...] | None = None
    tensor_maps: tuple[TensorMap, ...] = ()

    fold: launch_limits.GridFold | None = field(init=False, compare=False, default=None)
    """How a grid past CUDA's limits is laid over z (None: launched as it is), fixed when planned."""

    persistent: bool = False
    """The kernel walks its tiles with blockIdx.x and gridDim.x itself (a grid of a few blocks per
    SM), so it must never be folded."""

    def __post_init__(self) -> None:
        launch_limits.check_block_dims(self.kernel, self.block)
        object.__setattr__(self, "fold", launch_limits.fold_grid(self.kernel, self.grid))
        if self.persistent and self.fold is not None:
            raise SpecError("grid", self.grid, f"persistent kernel {self.kernel} would need its grid folded; "
                            "this is a convgen bug")

    @property
    def threads(self) -> int:
        """Threads of the virtual grid: what the kernel's index proof must cover."""
        return math.prod(self.grid) * math.prod(self.block)

    @property
    def launch_grid(self) -> tuple[int, int, int]:
        """The grid the launchers pass to CUDA (``grid`` is the one the kernel is written for)."""
        return launch_limits.launch_grid(self.grid, self.fold)


@dataclass(frozen=True)
class BlasGemm:
    """A cuBLAS ``sgemmStridedBatched`` call (column-major, as cuBLAS sees it) between launches:
    C = op(A) * op(B) on buffers named with element offsets, for the explicit im2col + GEMM path."""

    trans_a: bool
    trans_b: bool
    m: int
    n: int
    k: int
    a: tuple[str, int]
    lda: int
    stride_a: int
    b: tuple[str, int]
    ldb: int
    stride_b: int
    c: tuple[str, int]
    ldc: int
    stride_c: int
    batch: int = 1
    chunk_stride_c: int = 0
    """Elements C advances per batch chunk of a chunked plan (A and B stay: the workspace and filter)."""


class ContextError(TypeError):
    """A template context field holds a value of the wrong type: a bug in the family, not user input."""


def _matches(value: Any, annotation: Any) -> bool:
    """Whether ``value`` fits ``annotation``: classes, ``X | None`` unions, and the outer type of
    ``tuple[...]``, ``list[...]`` and ``dict[...]`` (elements are the family's own values)."""
    if annotation is Any:
        return True
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, option) for option in typing.get_args(annotation))
    if origin is not None:
        return isinstance(value, origin)
    if annotation is type(None):
        return value is None
    if annotation is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if annotation is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    return isinstance(value, annotation)


@dataclass(frozen=True)
class TemplateContext:
    """What a family's template reads, one typed field each: the contract between the family and its
    template is this class, checked when the plan is made, not a dict whose keys a comment lists.

    Each family subclasses it (frozen, typed fields); ``variables()`` is what the template sees,
    together with the plan-wide values that ``render`` adds."""

    def __post_init__(self) -> None:
        hints = typing.get_type_hints(type(self))
        for item in dataclasses.fields(self):
            value = getattr(self, item.name)
            if not _matches(value, hints[item.name]):
                raise ContextError(f"{type(self).__name__}.{item.name} = {value!r} is not {hints[item.name]}")

    def variables(self) -> dict[str, Any]:
        """The fields by name; enum members as their values, so templates compare plain strings."""
        return {item.name: _template_value(getattr(self, item.name)) for item in dataclasses.fields(self)}


def _template_value(value: Any) -> Any:
    return value.value if isinstance(value, enum.Enum) else value


@dataclass(frozen=True, kw_only=True)
class IndexContext(TemplateContext):
    """The index maps of ``index.template_context``, as C with the spec's constants folded in
    (coordinate lists name one C expression per coordinate)."""

    idx_t: str
    """The C index type: ``int`` while ``largest_index`` fits 31 bits, else ``long long``."""
    largest_index: int
    dims: int
    channels_last: bool
    C: int
    pitch: int
    rows: int
    cols: int
    taps: int
    pixels_total: int
    image_elements: int
    col_coords: list[str]
    tap_coords: list[str]
    in_coord: list[str]
    in_bounds: str
    """The C condition that every input coordinate lies inside the image."""
    x_offset: str
    pixel_offset: str
    pixel_channel_offset: str
    row_of: str
    """The column-matrix row of (c, kk)."""
    row_of_taps: str
    row_coords: list[str]
    pixel_coords: list[str]
    image_coords: list[str]
    window_axes: list[dict[str, Any]]
    """col2im gather, per spatial axis: the output range whose windows cover an input (``index.window_ranges``)."""
    window_taps: dict[str, Any]
    """col2im gather over every tap: window numerators, outputs and validity (``index.window_terms``)."""
    unit_stride: bool
    tap_linear: str
    col_linear: str
    thread_coords: list[str]
    pixel_channel: list[str]
    output_coords: list[str]
    y_offset: str
    w_offset: str
    K: int
    out_size: list[int]
    filter_size: list[int]
    total_outputs: int


@dataclass(frozen=True, kw_only=True)
class ConvolutionContext(IndexContext):
    """A convolution's index maps and what its self-test oracle reads (``convolution_selftest_context``)."""

    output_order: list[str]
    """The output's coordinate names in memory order."""
    output_coords_of_offset: list[str]
    """The coordinates of output offset ``e``, in ``output_order``."""
    reference_terms: int
    """Multiply-adds of the host reference per output (sizes the self-test's sample)."""


@dataclass(frozen=True)
class KernelPlan:
    family: str
    variant: str
    spec: ConvSpec
    tiles: Tiles
    buffers: tuple[Buffer, ...]
    launches: tuple[Launch, ...]
    context: TemplateContext = field(compare=False)
    zero_output: bool = False
    atomic_sums: bool = False
    """Some outputs are sums of parts that meet in atomic adds (split-K into a zeroed output, a
    stream-K tile shared between blocks, col2im's scatter): their order, and so the last bits,
    vary from run to run (what ``torch.use_deterministic_algorithms`` rules out)."""
    constants: tuple[tuple[str, str], ...] = ()
    """(``__constant__`` symbol, buffer name): buffers the launcher copies into constant memory."""
    steps: tuple[Launch | BlasGemm, ...] = ()
    """What runs for one batch chunk, in order, when it is more than ``launches`` once each (im2col
    then a cuBLAS GEMM)."""
    chunks: int = 1
    """The launches (or ``steps``) run this many times, once per batch chunk, each argument advanced
    by its launch's ``chunk_strides`` (a GEMM's output by ``chunk_stride_c``): a workspace sized for
    one chunk bounds the extra memory (im2win, im2col_gemm)."""
    min_arch: int = 0
    """The oldest compute capability (as 90 for sm_90) whose instructions the kernels use."""
    min_arch_reason: str = ""
    """Which instructions set ``min_arch`` and what runs on older targets, for the refusal."""
    arch_specific: bool = False
    """The kernels use architecture-specific instructions (``setmaxnreg``), so they are compiled
    for the target's "a" variant (sm_90a), whose code runs on that compute capability only."""
    template: str = ""
    """The template whose ``kernels()`` holds the plan's kernels; empty: ``<family>.cu.j2``.  A
    family whose kernels are of different kinds keeps each in its own (implicit_gemm's TMA kernel)."""
    tensor_cores: bool = False
    """The kernels multiply on tensor cores: what a tf32 or 3xtf32 spec needs, and the GEMM families'
    float16 and bfloat16; the memory-bound families run 16-bit data on the FMA pipe, widened to FP32."""
    tf32_truncated: bool = False
    """The tensor cores read the float32 operands' bits as TF32, dropping the low 13 mantissa bits
    (wgmma from shared memory, as CUTLASS's sm_90 TF32 kernels do), instead of the kernel rounding
    them to nearest: the error bound takes twice the operand error (``precision.unit_roundoff``)."""

    def __post_init__(self) -> None:
        if not self.template:
            object.__setattr__(self, "template", f"{self.family}.cu.j2")
        runs = (uses_tensor_cores(self.spec.dtype, self.spec.math) if self.tensor_cores
                else not self.spec.math.tensor_cores)
        if not runs:
            field_name, value = ("math", self.spec.math.value) if self.spec.dtype is DType.float32 else (
                "dtype", self.spec.dtype.value)
            raise SpecError(field_name, value, f"{self.family}'s {self.variant} kernel runs "
                            f"{'tensor-core' if self.tensor_cores else 'math=fma'} specs only")
        wrong = next((b for b in self.buffers if b.role != "workspace" and b.dtype is not self.spec.dtype), None)
        if wrong is not None:
            raise SpecError("dtype", self.spec.dtype.value, f"{self.family}'s buffer {wrong.name} holds "
                            f"{wrong.dtype.value}")
        named = {b.name: b for b in self.buffers}
        for tensor_map in (m for launch in self.launches for m in launch.tensor_maps):
            if tensor_map.dtype is not named[tensor_map.buffer].dtype:   # TMA would count the wrong bytes
                raise ValueError(f"{self.family}'s map of {tensor_map.buffer} is of {tensor_map.dtype.value}; the "
                                 f"buffer holds {named[tensor_map.buffer].dtype.value}")

    def compile_arch(self, arch: str) -> str:
        """The architecture to compile for when the target is ``arch``."""
        return arch + "a" if self.arch_specific and not arch.endswith("a") else arch

    @property
    def schedule(self) -> Iterator[Launch | BlasGemm]:
        """What runs, in order: made as it is launched, so that a plan of many chunks costs the
        generator nothing (a batch of 2^31 - 1 images in chunks of one is a plan like any other)."""
        per_chunk = self.steps or self.launches
        if self.chunks == 1:
            return iter(per_chunk)
        return (_advanced(step, chunk) for chunk in range(self.chunks) for step in per_chunk)

    @property
    def chunk_advance(self) -> dict[str, int]:
        """Elements each buffer that moves advances per batch chunk (empty when not chunked)."""
        advance = {}
        for launch in self.launches if self.chunks > 1 else ():
            for buffer, stride in zip(self.launch_args(launch), launch.chunk_strides):
                if stride:
                    advance[buffer.name] = stride
        for step in self.steps if self.chunks > 1 else ():
            if isinstance(step, BlasGemm) and step.chunk_stride_c:
                advance[step.c[0]] = step.chunk_stride_c
        return advance

    @property
    def workspaces(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.role == "workspace")

    @property
    def workspace_bytes(self) -> int:
        """Extra device memory beyond inputs and output, in bytes."""
        return sum(b.elements * b.dtype.itemsize for b in self.workspaces)

    def launch_args(self, launch: Launch) -> tuple[Buffer, ...]:
        if launch.args is None:
            return self.buffers
        named = {b.name: b for b in self.buffers}
        return tuple(named[name] for name in launch.args)

    @property
    def inputs(self) -> tuple[Buffer, ...]:
        return tuple(b for b in self.buffers if b.role == "in")

    @property
    def output(self) -> Buffer:
        (out,) = [b for b in self.buffers if b.role == "out"]
        return out


def _advanced(step: Launch | BlasGemm, chunk: int) -> Launch | BlasGemm:
    """``step`` as it runs for batch chunk ``chunk``."""
    if isinstance(step, BlasGemm):
        name, offset = step.c
        return replace(step, c=(name, offset + chunk * step.chunk_stride_c))
    return replace(step, offsets=tuple(chunk * s for s in step.chunk_strides), chunk_strides=None)


def kernel_name(family: str, variant: str, spec: ConvSpec, tiles: Tiles, schedule: str = "") -> str:
    """``convgen_<family>_<variant>_<tag>``: the tag hashes spec and tiles (and ``schedule``, what else
    the code depends on, such as the card's count of SMs), so kernels of several emitted files can be
    linked into one program without clashing."""
    key = f"{spec.describe()}|{tiles.describe()}" + (f"|{schedule}" if schedule else "")
    tag = hashlib.sha256(key.encode()).hexdigest()[:10]
    return f"convgen_{family}_{variant}_{tag}"


def grid_for(total: int, per_block: int) -> int:
    return max(1, -(-total // per_block))


def format_bytes(count: int) -> str:
    """Bytes for a person: B, KiB, MiB or GiB with three significant digits."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if count >= size:
            return f"{count / size:.3g} {unit}"
    return f"{count} B"


def largest_batch_chunk(n: int, per_image_bytes: int, budget: int) -> int:
    """The largest divisor of the batch ``n`` whose images' workspace fits ``budget`` (at least 1):
    the default ``batch_chunk`` of the families that stage a workspace per chunk.  The divisors come
    from n's factorisation, so the search is not linear in a batch size the user types."""
    most = budget // per_image_bytes if per_image_bytes > 0 else n
    if most >= n:
        return n
    return max((d for d in sympy.divisors(n) if d <= most), default=1)


def chunk_spec(spec: ConvSpec, chunk: int) -> ConvSpec:
    """``spec`` for one batch chunk of ``chunk`` images, refusing a chunk that does not divide N."""
    if spec.n % chunk:
        raise SpecError("tiles.batch_chunk", chunk, f"must divide n ({spec.n})")
    return replace_spec(spec, n=chunk)


def convolution_selftest_context(alg: IndexAlgebra) -> dict:
    """What ``common/conv_reference.cu.j2`` needs: the self-test walks the output buffer in memory
    order, so it decomposes an offset ``e`` in the layout's order; each output costs the reference
    ``reference_terms`` multiply-adds (every channel and tap)."""
    spec = alg.spec
    spatial = [f"o{j}" for j in range(spec.dims)]
    order = ["n", *spatial, "oc"] if spec.layout.channels_last else ["n", "oc", *spatial]
    offset = index.sympy.Symbol("e", integer=True, nonnegative=True)
    return {"output_order": order, "reference_terms": spec.c * alg.taps,
            "output_coords_of_offset": [index.to_c(e) for e in index.decompose(offset, alg.output_shape)]}


class Family:
    """Base of the family modules; subclasses set the class attributes and implement the hooks."""

    name: ClassVar[str]
    template: ClassVar[str]
    tiles_type: ClassVar[type[Tiles]]
    summary: ClassVar[str]
    convolution: ClassVar[bool] = True
    """Whether the output is the convolution (its speed is counted in FLOPs), not a transform."""
    dtypes: ClassVar[tuple[DType, ...]] = (DType.float32,)
    """The element types the family's FMA-pipe kernels store; they compute in FP32 whatever the type."""

    def for_spec(self, spec: ConvSpec) -> "Family":
        """The family object whose kernels run ``spec``: itself, unless a family keeps a separate
        kernel (with its own tiles) for some dtypes or math modes."""
        return self

    def check_precision(self, spec: ConvSpec) -> None:
        """Refuse, naming the field, a dtype or math mode this family has no kernel for (before any
        tile is chosen or source rendered).  The families run their ``dtypes`` on the FMA pipe only."""
        if spec.dtype not in self.dtypes:
            raise SpecError("dtype", spec.dtype.value, f"{self.name} runs float32 only; float16 and bfloat16 "
                            "run in implicit_gemm (tensor cores, sm_80 and newer)")
        if spec.math is not MathMode.fma:
            raise SpecError("math", spec.math.value, f"{self.name} runs math=fma only; tf32 and 3xtf32 run in "
                            "implicit_gemm (tensor cores, sm_80 and newer)")

    def default_tiles(self, spec: ConvSpec, *, device: Device | str | None = None) -> Tiles:
        """The portable heuristic for ``device`` (a ``codegen.device.Device``, an arch or a target
        name; None: the H100 its rules were measured on)."""
        raise NotImplementedError

    def heuristic_tiles(self, spec: ConvSpec, device: Device | str | None = None) -> Tiles:
        """The heuristic for a target (``build(spec)`` without tiles): the portable
        ``default_tiles`` unless the family has a kernel that only newer GPUs run."""
        return self.default_tiles(spec, device=device)

    def tiles_within(self, spec: ConvSpec, limit: int, device: Device | str | None = None) -> Tiles:
        """The heuristic's tiles held to ``limit`` bytes of workspace (``build(..., workspace_limit=)``
        when the heuristic's own need more), or a SpecError that names the least this family needs."""
        raise SpecError("workspace_limit", limit, f"{self.name} has no tile choice that needs less workspace "
                        f"for this spec")

    def chunk_within(self, spec: ConvSpec, limit: int, per_image: int, what: str, budget: int,
                     device: Device | str | None = None) -> Tiles:
        """``tiles_within`` for a family whose workspace holds ``per_image`` bytes (``what``) for each
        image of its batch chunk and whose ``default_tiles(spec, budget)`` takes the largest chunk
        within ``budget``: the heuristic's own budget or the limit, whichever is less."""
        if per_image > limit:
            raise SpecError("workspace_limit", limit, f"{self.name} needs at least {format_bytes(per_image)} of "
                            f"workspace here (the limit is {format_bytes(limit)}): {what}, the smallest batch "
                            f"chunk; implicit_gemm needs none")
        return self.default_tiles(spec, min(limit, budget), device=device)

    def tuning_space(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """Tile configurations the tuner may try (before the compiler's limits prune them), each
        within ``workspace_limit`` bytes of workspace where one is given; empty: not tunable.
        This base serves families without a workspace."""
        return []

    def tuning_seeds(self, spec: ConvSpec, workspace_limit: int | None = None) -> list[dict]:
        """Members of the space the tuner measures right after the heuristic, whatever the budget:
        shapes known to win that neither sampling nor one-parameter steps reliably reach."""
        return []

    def complete_tiles(self, spec: ConvSpec, requested: dict, device: Device | str | None = None) -> Tiles:
        """The tiles a user asked for, the rest from the heuristic."""
        return self.tiles_type.from_dict({**self.default_tiles(spec, device=device).to_dict(), **requested})

    def plan(self, spec: ConvSpec, tiles: Tiles, device: Device | str | None = None) -> KernelPlan:
        """The kernels of ``spec`` with ``tiles``; ``device`` sizes the grids of persistent kernels."""
        raise NotImplementedError

    def reference(self, spec: ConvSpec, *inputs: np.ndarray) -> np.ndarray:
        """Float64 numpy oracle, written without the index algebra so that it checks it."""
        raise NotImplementedError

    def make_inputs(self, spec: ConvSpec, rng: np.random.Generator) -> list[np.ndarray]:
        """Random (never zero) inputs of the plan's input shapes in [-1, 1), stored as the kernel
        takes them (bfloat16 as uint16 bits), for tests and benchmarks."""
        plan = self.plan(spec, self.default_tiles(spec))
        return [precision.to_storage(rng.uniform(-1.0, 1.0, size=b.shape), spec.dtype) for b in plan.inputs]

    def roundoff(self, spec: ConvSpec, plan: KernelPlan | None = None) -> precision.Roundoff:
        """The unit roundoffs that this family's outputs are held to where the spec is not plain
        FP32: the spec's dtype's and math mode's (and the kernel ``plan``'s way to TF32), unless the
        family computes nothing (a copy is exact)."""
        return precision.unit_roundoff(spec.dtype, spec.math, plan is not None and plan.tf32_truncated)

    def error_bound(self, spec: ConvSpec, inputs, plan: KernelPlan | None = None) -> np.ndarray:
        """The bound on |result - reference| of every output of a spec that is not plain FP32, for
        the stored ``inputs`` (``make_inputs``) and the kernel ``plan`` that made the result: the
        convolution's (``codegen.precision.error_bound``)."""
        return precision.error_bound(spec, *inputs[:2], plan is not None and plan.tf32_truncated)

    def algebra(self, spec: ConvSpec) -> IndexAlgebra:
        return IndexAlgebra(spec)
