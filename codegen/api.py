"""The Python API: build a kernel for a spec, then call it on device arrays.

``build`` runs the whole flow (plan, render, compile/cache) once; the returned ``Kernel`` checks
every argument (kind, device, dtype, shape, contiguity, alignment) before it launches, so a wrong
array fails with a sentence instead of a wrong answer or a crash; PyTorch tensors of a signature
already checked in full (``Kernel._call_torch``) skip the repeat.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codegen.compile import CompileError, CompiledKernel, compile_source, compute_capability, device_arch, resolve_arch
from codegen.families import get_family
from codegen.families.base import Buffer, Family, KernelPlan, format_bytes
from codegen.launch import Launcher, buffer_bytes
from codegen.render import KernelSource, render_kernels
from codegen.spec import ConvSpec, DType, SpecError
from codegen.device import Device, max_shared_per_block
from codegen.device import resolve as resolve_device
from codegen.tiles import Tiles
from codegen.tuning_db import tuned_or_heuristic


class LaunchError(ValueError):
    """An argument does not fit the kernel it was passed to."""


def has_gpu() -> bool:
    return device_arch() is not None


Chooser = Callable[[Family, ConvSpec, Device, "int | None"], Tiles]
"""Picks the tiles of a build that names none: (family, spec, device, workspace limit) -> tiles."""


def plan(family: str, spec: ConvSpec, tiles: Tiles | dict | None = None, arch: str | None = None,
         workspace_limit: int | None = None, chooser: Chooser = tuned_or_heuristic,
         target: Device | str | None = None) -> KernelPlan:
    """Validate ``tiles`` for ``family`` (None: ``chooser``'s pick, by default the tuned
    configuration for this GPU if ``convgen tune`` recorded one, else the heuristic) and return the
    family's plan, chosen for ``target`` (a ``Device`` or a name such as ``a100``; None: this
    machine's GPU, else the reference card of ``arch``, else the H100; ``codegen.device.resolve``).

    ``workspace_limit`` caps the plan's workspace (device memory beyond inputs and output, in
    bytes), as cuDNN's algorithm choice takes a workspace limit: tiles chosen here are held under
    it (a smaller batch chunk, the TMA kernel's transposed filter left out); tiles passed in are
    refused with the largest choice that fits; a family that cannot get under it says what it
    needs at least."""
    if not isinstance(spec, ConvSpec):
        raise TypeError(f"spec must be a codegen.ConvSpec (make one with ConvSpec(...) or ConvSpec.from_dict(...)); "
                        f"got {type(spec).__module__}.{type(spec).__name__}")
    fam = get_family(family, spec)
    fam.check_precision(spec)
    kernel = family if fam is get_family(family) else (f"{family}'s tensor-core kernel (dtype={spec.dtype.value}, "
                                                       f"math={spec.math.value})")
    device = resolve_device(target, arch)
    check_workspace_limit(workspace_limit)
    chosen_here = tiles is None
    if tiles is None:
        tiles = chooser(fam, spec, device, workspace_limit)
        if not isinstance(tiles, fam.tiles_type):
            raise SpecError("chooser", type(tiles).__name__, f"must return {fam.tiles_type.__name__}, the tiles of "
                            f"{kernel}")
    elif isinstance(tiles, dict):
        tiles = fam.complete_tiles(spec, tiles, device)
    elif not isinstance(tiles, fam.tiles_type):
        raise SpecError("tiles", type(tiles).__name__, f"{kernel} takes {fam.tiles_type.__name__} or a dict")
    kernel_plan = fam.plan(spec, tiles, device)
    if workspace_limit is None or kernel_plan.workspace_bytes <= workspace_limit:
        return kernel_plan
    lighter = fam.tiles_within(spec, workspace_limit, device)
    if not chosen_here:
        raise SpecError("workspace_limit", workspace_limit,
                        f"{family} with tiles {tiles.describe()} needs {format_bytes(kernel_plan.workspace_bytes)} of "
                        f"workspace ({', '.join(b.name for b in kernel_plan.workspaces)}), over the limit of "
                        f"{format_bytes(workspace_limit)}; raise the limit or pass tiles "
                        f"that need less, e.g. {_difference(tiles, lighter)} (the heuristic's choice under this limit)")
    return fam.plan(spec, lighter, device)


def check_workspace_limit(limit) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise SpecError("workspace_limit", limit, "must be a whole number of bytes >= 0, or None for no limit")


def _difference(tiles: Tiles, other: Tiles) -> str:
    """The fields of ``other`` that differ from ``tiles``, as NAME=VALUE: every field, including
    those ``to_dict`` leaves out at their defaults (wgmma=False, split_k=1), so that the
    suggestion applied on top of ``tiles`` gives ``other``."""
    ours = dataclasses.asdict(tiles)
    changed = [f"{k}={v}" for k, v in dataclasses.asdict(other).items() if ours.get(k) != v]
    return " ".join(changed) or other.describe()


MAX_ACCEPTED_SIGNATURES = 64
"""Argument signatures a kernel remembers as checked (``Kernel.__call__``); past this it starts over."""


@dataclass
class Kernel:
    """A compiled kernel for one (family, spec, tiles); call it like a function on device arrays.

    PyTorch tensors: the first call with arguments of a given signature (each tensor's shape,
    whether it is C-contiguous, its dtype and device, and its address's residue modulo the
    alignment its buffer needs) checks them in full; later calls with that signature skip to the
    launch, so a model calling a layer pays a few microseconds of host time rather than the checks'
    tens.  Shape and contiguity stand for the strides: a check's verdict depends on no more of
    them.  Other arrays are checked in full on every call."""

    plan: KernelPlan
    source: KernelSource
    compiled: CompiledKernel
    _launcher: Launcher = field(init=False, repr=False)
    _call_buffers: tuple[Buffer, ...] = field(init=False, repr=False)
    """The buffers a call passes, in order: the inputs, then the output."""
    _call_names: tuple[str, ...] = field(init=False, repr=False)
    _call_alignments: tuple[int, ...] = field(init=False, repr=False)
    _output_strides: tuple[int, ...] = field(init=False, repr=False)
    """The C-contiguous strides, in elements, of an output this kernel allocates."""
    _accepted: dict = field(default_factory=dict, repr=False)
    """Signatures checked in full, each with the device index its tensors are on."""

    def __post_init__(self) -> None:
        self._launcher = Launcher(self.plan, self.compiled.cubin)
        self._call_buffers = (*self.plan.inputs, self.plan.output)
        self._call_names = self._launcher.call_names
        self._call_alignments = tuple(b.alignment for b in self._call_buffers)
        shape = self.plan.output.shape
        self._output_strides = tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))

    @property
    def spec(self) -> ConvSpec:
        return self.plan.spec

    def __call__(self, *inputs: Any, out: Any = None) -> Any:
        if len(inputs) != len(self._call_names) - 1:
            names = ", ".join(self._call_names[:-1])
            raise LaunchError(f"{self.plan.family} takes {len(self._call_names) - 1} input(s) ({names}); got {len(inputs)}")
        if _all_torch_tensors(inputs, out):
            return self._call_torch(inputs, out)
        if _kind(inputs[0]) != "torch":
            return self._call_cupy(inputs, out)
        import cupy
        import torch

        result = self._call_cupy(inputs, out, cupy.cuda.ExternalStream(torch.cuda.current_stream().cuda_stream))
        return _as_torch(result) if out is None else result

    def _call_cupy(self, inputs: tuple, out: Any, stream=None) -> Any:
        """Any device arrays (a tensor among other kinds too), checked in full each call."""
        import cupy

        arrays = [_as_cupy(x, b) for x, b in zip(inputs, self.plan.inputs)]
        device_id = arrays[0].device.id
        for array, buffer in zip(arrays, self.plan.inputs):
            _check(array, buffer, device_id)
        with cupy.cuda.Device(device_id):
            if out is None:
                result = cupy.empty(self.plan.output.shape, dtype=array_dtype(self.plan.output.dtype))
            else:
                result = _as_cupy(out, self.plan.output)
                _check(result, self.plan.output, device_id)
            self.launch(arrays, result, stream)
        return out if out is not None else result

    def _call_torch(self, inputs: tuple, out: Any) -> Any:
        """PyTorch tensors, launched on PyTorch's current stream, with the output and any workspace
        from PyTorch's caching allocator (what CUDA graph capture needs)."""
        first = inputs[0]
        if out is None:
            if not first.is_cuda:
                _as_cupy(first, self.plan.inputs[0])   # says what is wrong with it
            out = first.new_empty_strided(self.plan.output.shape, self._output_strides,
                                          dtype=torch_dtype(self.plan.output.dtype))
        tensors = (*inputs, out)
        pointers = [t.data_ptr() for t in tensors]
        signature = tuple([(t.shape, t.is_contiguous(), t.dtype, t.device, pointer % alignment)
                           for t, pointer, alignment in zip(tensors, pointers, self._call_alignments)])
        device_index = self._accepted.get(signature)
        if device_index is None:
            self._check_torch(inputs, out)
            device_index = first.get_device()
            if all(entry[1] for entry in signature):    # kept only as contiguous, as the checks require
                if len(self._accepted) >= MAX_ACCEPTED_SIGNATURES:
                    self._accepted.clear()
                self._accepted[signature] = device_index
        self.launch_tensors(pointers, device_index)
        return out

    def launch_tensors(self, pointers: list[int], device_index: int) -> None:
        """Launch on the device addresses of PyTorch tensors (inputs, then the output, in call
        order) on CUDA device ``device_index``, on PyTorch's current stream there, workspaces from
        its caching allocator.  Nothing is checked: for callers that checked these tensors
        themselves (``codegen.torch`` keys them by shape, strides, dtype, device and alignment)."""
        torch_c = sys.modules["torch"]._C   # PyTorch's cheap device and raw-stream queries
        stream = torch_c._cuda_getCurrentRawStream(device_index)
        if device_index == torch_c._cuda_getDevice():
            self._launcher.run(device_index, pointers, stream, _torch_workspace)
        else:
            import torch

            with torch.cuda.device(device_index):
                self._launcher.run(device_index, pointers, stream, _torch_workspace)

    def _check_torch(self, inputs: tuple, out: Any) -> None:
        """The full checks of a CuPy call, on CuPy views of the tensors (no copy)."""
        arrays = [_as_cupy(x, b) for x, b in zip((*inputs, out), self._call_buffers)]
        for array, buffer in zip(arrays, self._call_buffers):
            _check(array, buffer, arrays[0].device.id)

    def launch(self, arrays: list, result, stream=None) -> None:
        """Launch on already-checked CuPy arrays (the benchmark's hot path) on ``stream`` (default
        CuPy's current one), on the arrays' device; workspaces come from CuPy's pool there, so
        repeated calls reuse its memory.  A ``stream`` given is made current while a plan with
        workspaces runs: CuPy's pool hands memory back to the stream it was taken on, and a
        workspace taken on another stream could be reused there while these launches still read it."""
        import cupy

        if stream is not None and self.plan.workspaces:
            with stream:
                self.launch(arrays, result)
            return
        stream = stream or cupy.cuda.get_current_stream()
        pointers = [*(a.data.ptr for a in arrays), result.data.ptr]
        device_id = result.device.id
        if device_id == cupy.cuda.runtime.getDevice():
            self._launcher.run(device_id, pointers, stream.ptr, _cupy_workspace)
        else:
            with cupy.cuda.Device(device_id):    # the module, the workspace and the launch on the arrays' device
                self._launcher.run(device_id, pointers, stream.ptr, _cupy_workspace)


_STREAM_WORKSPACES: dict[tuple[int, int, str], tuple[Any, int, int]] = {}
"""Per (device, stream handle, workspace name): the workspace tensor every kernel's calls on that stream share,
its address and its bytes (``_torch_workspace``). A plan's workspaces have distinct names (3xTF32's split
filter and split-K's partial tiles), so that none of them shares memory with another of the same call."""


def _torch_workspace(buffer: Buffer, device_id: int):
    """A workspace from PyTorch's caching allocator on ``device_id`` (current). Outside CUDA graph
    capture, the one kept for the current stream, grown when a call needs more: calls on one stream
    run in order, so no two of them use it at once, and a call is spared the allocation, as
    PyTorch keeps cuBLAS's workspace per handle and stream (``release_workspaces`` gives them
    back). Under capture, a fresh one from the graph's private pool, which the graph owns."""
    torch = sys.modules["torch"]
    nbytes = buffer_bytes(buffer)
    if torch._C._cuda_isCurrentStreamCapturing():
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_id))
        return workspace, workspace.data_ptr()
    key = (device_id, torch._C._cuda_getCurrentRawStream(device_id), buffer.name)
    kept = _STREAM_WORKSPACES.get(key)
    if kept is None or kept[2] < nbytes:
        workspace = torch.empty(nbytes, dtype=torch.uint8, device=torch.device("cuda", device_id))
        kept = _STREAM_WORKSPACES[key] = (workspace, workspace.data_ptr(), nbytes)
    return kept[0], kept[1]


def release_workspaces() -> None:
    """Give the workspaces kept per stream (split-K's partial tiles, PyTorch tensors) back to
    PyTorch's caching allocator."""
    _STREAM_WORKSPACES.clear()


def _cupy_workspace(buffer: Buffer, device_id: int):
    """A workspace from CuPy's pool on the current device (``device_id``)."""
    import cupy

    workspace = cupy.empty(buffer.shape, dtype=array_dtype(buffer.dtype))
    return workspace, workspace.data.ptr


def check_arch(kernel_plan: KernelPlan, arch: str) -> None:
    """The one check of a target that build, compile, tune and emit share, before anything
    compiles: an arch NVRTC builds for, no older than the plan's instructions need (cp.async: sm_80,
    TMA: sm_90), with the shared memory each launch asks for within the target's per-block limit."""
    arch = resolve_arch(arch)
    capability = compute_capability(arch)
    if kernel_plan.min_arch and capability < kernel_plan.min_arch:
        why = f" ({kernel_plan.min_arch_reason})" if kernel_plan.min_arch_reason else ""
        raise SpecError("arch", arch, f"{kernel_plan.family} variant {kernel_plan.variant} uses "
                        f"sm_{kernel_plan.min_arch} instructions{why}; build it for sm_{kernel_plan.min_arch} or newer")
    limit = max_shared_per_block(capability)
    for launch in kernel_plan.launches:
        if launch.shared_bytes > limit:
            raise SpecError("arch", arch, f"{kernel_plan.family} kernel {launch.kernel} asks for {launch.shared_bytes} "
                            f"bytes of shared memory per block, and sm_{capability} allows at most {limit}; pick "
                            "smaller tiles (fewer stages) for this target or build for a newer one")


def build(family: str, spec: ConvSpec, tiles: Tiles | dict | None = None, arch: str | None = None,
          workspace_limit: int | None = None, target: Device | str | None = None) -> Kernel:
    """Plan, render and compile (through the cache) the ``family`` kernel for ``spec``.

    ``tiles=None`` picks the family's heuristic; ``target`` and ``arch`` the card it is chosen and
    compiled for (None: the current device, or sm_90 on a machine without a GPU, where the kernel
    can be compiled but not launched; see ``plan``); ``workspace_limit`` caps the workspace in
    bytes."""
    device = resolve_device(target, arch)
    return compile_plan(plan(family, spec, tiles, device.arch, workspace_limit, target=device), device.arch)


def compile_plan(kernel_plan: KernelPlan, arch: str) -> Kernel:
    """Render a plan and compile it (through the cache) for target ``arch``: refused first where
    the target is older than its instructions, and built for the target's "a" variant where its
    kernels need one (``KernelPlan.compile_arch``).  The one way from a plan to a kernel, so that
    ``build()`` and the tuner cannot compile the same plan differently.  A CompileError where
    ptxas's report lacks a launched kernel: the spill checks would pass on nothing."""
    check_arch(kernel_plan, arch)
    source = render_kernels(kernel_plan)
    try:
        compiled = compile_source(source.code, f"{kernel_plan.family}.cu", kernel_plan.compile_arch(arch))
    except CompileError as err:
        raise CompileError(f"{kernel_plan.family} ({kernel_plan.variant}) for {kernel_plan.spec.describe()} with tiles "
                           f"{kernel_plan.tiles.describe()}, {kernel_plan.compile_arch(arch)}: this is a convgen bug, "
                           f"please report it with this message\n{err}") from None
    unreported = [launch.kernel for launch in kernel_plan.launches if launch.kernel not in compiled.resources]
    if unreported:
        raise CompileError(f"ptxas reported no registers or spills for {unreported[0]} (compile log: "
                           f"{compiled.log.strip()[:200] or 'empty'}); the checks on them cannot run")
    return Kernel(kernel_plan, source, compiled)


def _kind(obj: Any) -> str:
    module = type(obj).__module__
    if module.startswith("torch"):
        return "torch"
    return "cupy"


def _as_cupy(obj: Any, buffer: Buffer):
    import cupy

    if isinstance(obj, cupy.ndarray):
        return obj
    if getattr(obj, "requires_grad", False):
        obj = obj.detach()   # PyTorch refuses to export a tensor that requires grad; no copy is made
    if _kind(obj) == "torch" and str(getattr(obj, "dtype", "")) == "torch.bfloat16" and obj.is_cuda:
        import torch   # bfloat16 has no __cuda_array_interface__ typestr: pass its bits, as CuPy takes them

        return cupy.from_dlpack(obj.view(torch.int16)).view(cupy.uint16)
    if hasattr(obj, "__cuda_array_interface__"):
        return cupy.asarray(obj)
    if hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__"):
        device_type, _ = obj.__dlpack_device__()
        if device_type == 2:  # kDLCUDA
            return cupy.from_dlpack(obj)
    raise LaunchError(
        f"{buffer.name} must be a CUDA device array (CuPy, PyTorch or anything with "
        f"__cuda_array_interface__ or DLPack); got {type(obj).__module__}.{type(obj).__name__}"
        + (" in host memory: move it to the GPU first (cupy.asarray)" if type(obj).__module__ == "numpy" else ""))


def _check(array, buffer: Buffer, device_id: int) -> None:
    if array.dtype != array_dtype(buffer.dtype):
        raise LaunchError(f"{buffer.name} has dtype {array.dtype}; this kernel takes {buffer.dtype.value}"
                          + (" (as uint16 arrays of bfloat16 bits: CuPy has no bfloat16 type; "
                             "codegen.precision.bfloat16_bits makes them)" if buffer.dtype is DType.bfloat16 else ""))
    if tuple(array.shape) != buffer.shape:
        raise LaunchError(f"{buffer.name} has shape {tuple(array.shape)}; this kernel takes {buffer.shape}")
    if not array.flags.c_contiguous:
        raise LaunchError(f"{buffer.name} has strides {array.strides}; this kernel takes a C-contiguous array "
                          "(channel pitch is part of the shape: use dpitch in the spec)")
    if array.device.id != device_id:
        raise LaunchError(f"{buffer.name} is on device {array.device.id}; the other arrays are on {device_id}")
    if array.data.ptr % buffer.alignment:
        raise LaunchError(f"{buffer.name} starts at an address not aligned to {buffer.alignment} bytes, "
                          "which this vectorised kernel needs")


def array_dtype(dtype: DType):
    """The CuPy dtype of arrays holding ``dtype``: bfloat16 travels as uint16 bits, since CuPy has
    no bfloat16 type (as in DLPack consumers without one)."""
    import cupy

    return {DType.float32: cupy.float32, DType.float16: cupy.float16, DType.bfloat16: cupy.uint16}[dtype]


@functools.cache
def torch_dtype(dtype: DType):
    """The PyTorch dtype of tensors holding ``dtype`` (bfloat16 as itself: PyTorch has the type)."""
    import torch

    return {DType.float32: torch.float32, DType.float16: torch.float16, DType.bfloat16: torch.bfloat16}[dtype]


def _all_torch_tensors(inputs: tuple, out: Any) -> bool:
    """Whether a call passes PyTorch tensors alone (``out`` too, where given); none can exist
    before PyTorch is imported."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    tensor = torch.Tensor
    return all([isinstance(t, tensor) for t in inputs]) and (out is None or isinstance(out, tensor))


def _as_torch(result) -> Any:
    """A CuPy result as a PyTorch tensor without a copy (uint16 bits as bfloat16)."""
    import cupy
    import torch

    if result.dtype == cupy.uint16:
        return torch.from_dlpack(result.view(cupy.int16)).view(torch.bfloat16)
    return torch.from_dlpack(result)
