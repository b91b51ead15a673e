"""The Python API: build a kernel for a spec, then call it on device arrays.

``build`` runs the whole flow (plan, render, compile/cache) once; the returned ``Kernel`` checks
every argument (kind, device, dtype, shape, contiguity, alignment) before each launch, so a wrong
array fails with a sentence instead of a wrong answer or a crash.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codegen.compile import CompileError, CompiledKernel, compile_source, compute_capability, device_arch, resolve_arch
from codegen.families import get_family
from codegen.families.base import BlasGemm, Buffer, Family, KernelPlan, format_bytes
from codegen.render import KernelSource, render_kernels
from codegen.spec import ConvSpec, DType, SpecError
from codegen.device import Device, max_shared_per_block
from codegen.device import resolve as resolve_device
from codegen.tiles import STATIC_SHARED_LIMIT, Tiles
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
    """The fields of ``other`` that differ from ``tiles``, as NAME=VALUE."""
    ours = tiles.to_dict()
    changed = [f"{k}={v}" for k, v in other.to_dict().items() if ours.get(k) != v]
    return " ".join(changed) or other.describe()


@dataclass
class Kernel:
    """A compiled kernel for one (family, spec, tiles); call it like a function on device arrays."""

    plan: KernelPlan
    source: KernelSource
    compiled: CompiledKernel
    _functions: dict[int, dict[str, Any]] = field(default_factory=dict, repr=False)
    _encoded_maps: dict[tuple, Any] = field(default_factory=dict, repr=False)

    @property
    def spec(self) -> ConvSpec:
        return self.plan.spec

    def _function(self, device_id: int, name: str):
        import cupy

        if device_id not in self._functions:
            with cupy.cuda.Device(device_id):
                module = cupy.cuda.function.Module()
                module.load(self.compiled.cubin)
                self._functions[device_id] = {"module": module}
        loaded = self._functions[device_id]
        if name not in loaded:
            loaded[name] = loaded["module"].get_function(name)
        return loaded[name]

    def __call__(self, *inputs: Any, out: Any = None) -> Any:
        import cupy

        expected = self.plan.inputs
        if len(inputs) != len(expected):
            names = ", ".join(b.name for b in expected)
            raise LaunchError(f"{self.plan.family} takes {len(expected)} input(s) ({names}); got {len(inputs)}")
        kind = _kind(inputs[0])
        arrays = [_as_cupy(x, b) for x, b in zip(inputs, expected)]
        device_id = arrays[0].device.id
        for array, buffer in zip(arrays, expected):
            _check(array, buffer, device_id)
        with cupy.cuda.Device(device_id):
            if out is None:
                result = cupy.empty(self.plan.output.shape, dtype=array_dtype(self.plan.output.dtype))
            else:
                result = _as_cupy(out, self.plan.output)
                _check(result, self.plan.output, device_id)
            stream = _stream_for(kind)
            self.launch(arrays, result, stream)
        if out is not None:
            return out
        return _to_kind(result, kind)

    def launch(self, arrays: list, result, stream=None) -> None:
        """Launch on already-checked CuPy arrays (the benchmark's hot path); workspaces are
        allocated per call from CuPy's pool, so repeated calls reuse the same memory."""
        import cupy

        stream = stream or cupy.cuda.get_current_stream()
        device_id = result.device.id
        if self.plan.zero_output:
            cupy.cuda.runtime.memsetAsync(result.data.ptr, 0, result.nbytes, stream.ptr)
        by_name = {b.name: a for b, a in zip(self.plan.inputs, arrays)}
        by_name[self.plan.output.name] = result
        for buffer in self.plan.workspaces:
            by_name[buffer.name] = cupy.empty(buffer.shape, dtype=array_dtype(buffer.dtype))
        for symbol, buffer_name in self.plan.constants:
            source = by_name[buffer_name]
            cupy.cuda.runtime.memcpyAsync(self._global(device_id, symbol), source.data.ptr, source.nbytes,
                                          cupy.cuda.runtime.memcpyDeviceToDevice, stream.ptr)
        for step in self.plan.schedule:
            if isinstance(step, BlasGemm):
                _blas_gemm(step, by_name, stream)
                continue
            function = self._function(device_id, step.kernel)
            if step.shared_bytes > STATIC_SHARED_LIMIT:
                self._opt_in_shared(device_id, step)
            args = tuple(by_name[b.name] for b in self.plan.launch_args(step))
            if step.offsets:
                args = tuple(a.ravel()[offset:] for a, offset in zip(args, step.offsets))
            if step.tensor_maps:
                args = tuple(self._tensor_map(m, by_name[m.buffer].data.ptr) for m in step.tensor_maps) + args
            function(step.launch_grid, step.block, args, shared_mem=step.shared_bytes, stream=stream)

    def _tensor_map(self, tensor_map, pointer: int):
        """The encoded map for a buffer at ``pointer``, encoded once per address: encoding costs
        tens of microseconds of host time, which a timed launch would otherwise include."""
        from codegen import tma

        key = (tensor_map, pointer)
        if key not in self._encoded_maps:
            if len(self._encoded_maps) >= 256:  # a long run over many buffers: start over, stay small
                self._encoded_maps.clear()
            self._encoded_maps[key] = tma.encode(tensor_map, pointer)
        return self._encoded_maps[key]

    def _opt_in_shared(self, device_id: int, step) -> None:
        """Above 48 KB of dynamic shared memory a kernel must opt in, once per loaded module."""
        import cupy
        from cupy_backends.cuda.api import driver

        key = ("opted", step.kernel)
        loaded = self._functions[device_id]
        if key not in loaded:
            with cupy.cuda.Device(device_id):
                driver.funcSetAttribute(self._function(device_id, step.kernel).ptr,
                                        driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, step.shared_bytes)
            loaded[key] = True

    def _global(self, device_id: int, symbol: str):
        """The device address of a ``__constant__`` symbol of the loaded module."""
        self._function(device_id, self.plan.launches[0].kernel)
        return self._functions[device_id]["module"].get_global_var(symbol)


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


def _blas_gemm(step: BlasGemm, by_name: dict, stream) -> None:
    """One cuBLAS strided-batched SGEMM on the buffers' device pointers, on ``stream``."""
    import cupy
    import numpy as np
    from cupy_backends.cuda.libs import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    one, zero = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)

    def pointer(ref: tuple[str, int]) -> int:
        name, offset = ref
        return by_name[name].data.ptr + 4 * offset

    op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}
    with stream:
        cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
        cublas.sgemmStridedBatched(handle, op[step.trans_a], op[step.trans_b], step.m, step.n, step.k,
                                   one.ctypes.data, pointer(step.a), step.lda, step.stride_a,
                                   pointer(step.b), step.ldb, step.stride_b, zero.ctypes.data,
                                   pointer(step.c), step.ldc, step.stride_c, step.batch)


def _kind(obj: Any) -> str:
    module = type(obj).__module__
    if module.startswith("torch"):
        return "torch"
    return "cupy"


def _as_cupy(obj: Any, buffer: Buffer):
    import cupy

    if isinstance(obj, cupy.ndarray):
        return obj
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


def _stream_for(kind: str):
    import cupy

    if kind == "torch":
        import torch

        return cupy.cuda.Stream.from_external(torch.cuda.current_stream())
    return cupy.cuda.get_current_stream()


def _to_kind(result, kind: str):
    import cupy

    if kind == "torch":
        import torch

        tensor = torch.from_dlpack(result.view(cupy.int16) if result.dtype == cupy.uint16 else result)
        return tensor.view(torch.bfloat16) if result.dtype == cupy.uint16 else tensor
    return result
