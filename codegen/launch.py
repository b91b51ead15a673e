"""Running a compiled plan on device pointers: the one launch path of ``api.Kernel``, for CuPy
arrays and PyTorch tensors alike.

A model calls each layer's kernel once per forward pass, so the host time of a call matters as
much as the kernel on small layers.  Each launch therefore goes straight to ``cuLaunchKernel``
with its parameters packed in one ctypes array, from a per-launch recipe (function handle, grid,
block, shared memory, which buffer and byte offset each parameter is) made the first time that
launch runs on a device.  Workspaces come from the caller's allocator (CuPy's pool, or PyTorch's
caching allocator, which CUDA graph capture requires), so nothing here allocates.
"""
from __future__ import annotations

import ctypes
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from codegen.families.base import BlasGemm, Buffer, KernelPlan, Launch
from codegen.tiles import STATIC_SHARED_LIMIT

Allocate = Callable[[Buffer], tuple[Any, int]]
"""Workspace allocator: a buffer -> (an object that keeps its memory alive, its device address)."""

MAX_ENCODED_MAPS = 256
"""Tensor maps kept encoded per launcher (one per buffer address): a long run over many buffers
starts over rather than growing."""


def buffer_bytes(buffer: Buffer) -> int:
    return buffer.elements * buffer.dtype.itemsize


@dataclass(frozen=True)
class LaunchRecipe:
    """What a ``Launch`` needs per call, resolved once per device: parameters are (buffer name, byte
    offset) pairs after the launch's tensor maps; the ctypes array types that pack them are made
    here, once, since making a type costs more than filling one."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int
    tensor_maps: tuple
    parameters: tuple[tuple[str, int], ...]
    values_type: type = field(init=False, repr=False, compare=False)
    addresses_type: type = field(init=False, repr=False, compare=False)
    slots: tuple[int, ...] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        count = len(self.parameters)
        object.__setattr__(self, "values_type", ctypes.c_uint64 * count)
        object.__setattr__(self, "addresses_type", ctypes.c_void_p * (len(self.tensor_maps) + count))
        object.__setattr__(self, "slots", tuple(8 * i for i in range(count)))


class Launcher:
    """A plan's cubin loaded per device, and the recipes of its launches."""

    def __init__(self, plan: KernelPlan, cubin: bytes):
        self.plan = plan
        self.cubin = cubin
        self._modules: dict[int, Any] = {}
        self._recipes: dict[tuple[int, int], LaunchRecipe] = {}
        self._encoded_maps: dict[tuple, Any] = {}
        self._constant_addresses: dict[tuple[int, str], int] = {}
        named = {b.name: b for b in plan.buffers}
        self._workspaces = plan.workspaces
        self._zeroed = (plan.output.name, buffer_bytes(plan.output)) if plan.zero_output else None
        self._constants = tuple((symbol, name, buffer_bytes(named[name])) for symbol, name in plan.constants)
        self._steps = None if plan.chunks > 1 else tuple(plan.schedule)
        """A one-chunk plan's steps, kept; a chunked plan's are made as they run (there may be many)."""

    def function(self, device_id: int, name: str):
        """The CuPy ``Function`` of kernel ``name``, its module loaded on ``device_id`` once."""
        import cupy

        if device_id not in self._modules:
            with cupy.cuda.Device(device_id):
                module = cupy.cuda.function.Module()
                module.load(self.cubin)
            self._modules[device_id] = module
        return self._modules[device_id].get_function(name)

    def run(self, device_id: int, pointers: dict[str, int], stream: int, allocate: Allocate) -> None:
        """Run the plan on ``pointers`` (every input's and the output's device address, by buffer
        name) on the stream whose handle is ``stream``, on ``device_id``, which must be current."""
        if self._workspaces or self._zeroed or self._constants or self._steps is None:
            self._run_steps(device_id, pointers, stream, allocate)
            return
        for step in self._steps:   # one chunk of plain launches: a model's common case, kept short
            self._launch(self._recipes.get((device_id, id(step))) or self._recipe(device_id, step), pointers, stream)

    def _run_steps(self, device_id: int, pointers: dict[str, int], stream: int, allocate: Allocate) -> None:
        from cupy.cuda import runtime

        kept = [allocate(buffer) for buffer in self._workspaces]
        if kept:
            pointers = {**pointers, **{b.name: ptr for b, (_, ptr) in zip(self._workspaces, kept)}}
        if self._zeroed:
            runtime.memsetAsync(pointers[self._zeroed[0]], 0, self._zeroed[1], stream)
        for symbol, buffer_name, nbytes in self._constants:
            runtime.memcpyAsync(self._constant(device_id, symbol), pointers[buffer_name], nbytes,
                                runtime.memcpyDeviceToDevice, stream)
        for step in self._steps or self.plan.schedule:
            if isinstance(step, BlasGemm):
                blas_gemm(step, pointers, stream)
            else:
                self._launch(self._recipe(device_id, step), pointers, stream)
        del kept   # the memory returns to the allocator's pool, stream-ordered after these launches

    def _launch(self, recipe: LaunchRecipe, pointers: dict[str, int], stream: int) -> None:
        values = recipe.values_type(*[pointers[name] + offset for name, offset in recipe.parameters])
        base = ctypes.addressof(values)
        if recipe.tensor_maps:
            maps = [self._tensor_map(m, pointers[m.buffer]) for m in recipe.tensor_maps]
            parameters = recipe.addresses_type(*[ctypes.addressof(m) for m in maps],
                                               *[base + slot for slot in recipe.slots])
        else:
            parameters = recipe.addresses_type(*[base + slot for slot in recipe.slots])
        launch_kernel(recipe.function, *recipe.grid, *recipe.block, recipe.shared_bytes, stream,
                      ctypes.addressof(parameters), 0)

    def _recipe(self, device_id: int, step: Launch) -> LaunchRecipe:
        key = (device_id, id(step))
        recipe = self._recipes.get(key)
        if recipe is None:
            function = self.function(device_id, step.kernel)
            if step.shared_bytes > STATIC_SHARED_LIMIT:
                self._opt_in_shared(device_id, function, step.shared_bytes)
            buffers = self.plan.launch_args(step)
            offsets = step.offsets or (0,) * len(buffers)
            recipe = LaunchRecipe(function.ptr, step.launch_grid, step.block, step.shared_bytes, step.tensor_maps,
                                  tuple((b.name, offset * b.dtype.itemsize) for b, offset in zip(buffers, offsets)))
            if self._steps is not None:   # kept steps live as long as this launcher: their ids stay theirs
                self._recipes[key] = recipe
        return recipe

    def _tensor_map(self, tensor_map, pointer: int):
        """The encoded map for a buffer at ``pointer``, encoded once per address: encoding costs
        tens of microseconds of host time, which every call would otherwise pay."""
        from codegen import tma

        key = (tensor_map, pointer)
        if key not in self._encoded_maps:
            if len(self._encoded_maps) >= MAX_ENCODED_MAPS:
                self._encoded_maps.clear()
            self._encoded_maps[key] = tma.encode(tensor_map, pointer)
        return self._encoded_maps[key]

    @staticmethod
    def _opt_in_shared(device_id: int, function, shared_bytes: int) -> None:
        """Above 48 KB of dynamic shared memory a kernel must opt in, once per loaded module."""
        import cupy
        from cupy_backends.cuda.api import driver

        with cupy.cuda.Device(device_id):
            driver.funcSetAttribute(function.ptr, driver.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared_bytes)

    def _constant(self, device_id: int, symbol: str) -> int:
        """The device address of a ``__constant__`` symbol of the module loaded on ``device_id``."""
        key = (device_id, symbol)
        if key not in self._constant_addresses:
            self.function(device_id, self.plan.launches[0].kernel)
            self._constant_addresses[key] = int(self._modules[device_id].get_global_var(symbol))
        return self._constant_addresses[key]


def launch_kernel(*arguments) -> None:
    """``cuLaunchKernel`` through CuPy's binding, imported on first use (CuPy loads CUDA then)."""
    global launch_kernel
    from cupy_backends.cuda.api.driver import launchKernel

    launch_kernel = launchKernel
    launchKernel(*arguments)


def blas_gemm(step: BlasGemm, pointers: dict[str, int], stream: int) -> None:
    """One cuBLAS strided-batched SGEMM on the buffers' device addresses, on ``stream``."""
    import cupy
    import numpy as np
    from cupy_backends.cuda.libs import cublas

    handle = cupy.cuda.device.get_cublas_handle()
    one, zero = np.ones(1, dtype=np.float32), np.zeros(1, dtype=np.float32)

    def pointer(ref: tuple[str, int]) -> int:
        name, offset = ref
        return pointers[name] + 4 * offset

    op = {False: cublas.CUBLAS_OP_N, True: cublas.CUBLAS_OP_T}
    cublas.setStream(handle, stream)
    cublas.setPointerMode(handle, cublas.CUBLAS_POINTER_MODE_HOST)
    cublas.sgemmStridedBatched(handle, op[step.trans_a], op[step.trans_b], step.m, step.n, step.k,
                               one.ctypes.data, pointer(step.a), step.lda, step.stride_a,
                               pointer(step.b), step.ldb, step.stride_b, zero.ctypes.data,
                               pointer(step.c), step.ldc, step.stride_c, step.batch)
