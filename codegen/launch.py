"""Running a compiled plan on device pointers: the one launch path of ``api.Kernel``, for CuPy
arrays and PyTorch tensors alike.

A model calls each layer's kernel once per forward pass, so the host time of a call matters as
much as the kernel on small layers.  Each launch therefore goes straight to ``cuLaunchKernel``
from a per-launch recipe (function handle, grid, block, shared memory, which pointer and byte
offset each parameter is) made the first time that launch runs on a device, with its parameters
written into memory the recipe keeps per thread.  Pointers travel as a list in call order (the
inputs, then the output), not by name.  Workspaces come from the caller's allocator (CuPy's pool,
or PyTorch's caching allocator, which CUDA graph capture requires), so nothing here allocates.
"""
from __future__ import annotations

import ctypes
import threading
from collections.abc import Callable, Sequence
from typing import Any

from codegen.families.base import BlasGemm, Buffer, KernelPlan, Launch, TensorMap
from codegen.tiles import STATIC_SHARED_LIMIT

Allocate = Callable[[Buffer, int], tuple[Any, int]]
"""Workspace allocator: (a buffer, the device id) -> (an object that keeps its memory alive, its
device address)."""

MAX_ENCODED_MAPS = 256
"""Tensor maps kept encoded per launcher (one per buffer address): a long run over many buffers
starts over rather than growing."""


def buffer_bytes(buffer: Buffer) -> int:
    return buffer.elements * buffer.dtype.itemsize


class ParameterBlock:
    """One thread's parameter memory for one launch: the values, and the array of their addresses
    (after the tensor maps' addresses) that ``cuLaunchKernel`` reads.  Reused call after call:
    the driver has copied the parameters by the time ``cuLaunchKernel`` returns.  ``mapped`` is
    the buffer addresses whose encoded maps ``maps`` holds (and ``addresses`` points at), so that
    a call on the same buffers as the last one looks nothing up."""

    def __init__(self, maps: int, count: int):
        self.values = (ctypes.c_uint64 * count)()
        self.addresses = (ctypes.c_void_p * (maps + count))()
        base = ctypes.addressof(self.values)
        self.addresses[maps:] = [base + 8 * i for i in range(count)]
        self.address = ctypes.addressof(self.addresses)
        self.mapped: tuple[int, ...] | None = None
        self.maps: list = []


class LaunchRecipe:
    """What a ``Launch`` needs per call, resolved once per device: each parameter is a (pointer
    index, byte offset) pair after the launch's tensor maps, each map a (map, pointer index) pair.
    ``takes_call_pointers``: the parameters are the call's pointers as they come, in order, so a
    launch copies them without indexing.  Parameter memory is per thread (``ParameterBlock``), so
    threads may launch the same kernel at once."""

    def __init__(self, function: int, grid: tuple[int, int, int], block: tuple[int, int, int], shared_bytes: int,
                 tensor_maps: tuple[tuple[TensorMap, int], ...], parameters: tuple[tuple[int, int], ...],
                 takes_call_pointers: bool = False):
        self.function, self.grid, self.block, self.shared_bytes = function, grid, block, shared_bytes
        self.tensor_maps = tensor_maps
        self.parameters = parameters
        self.takes_call_pointers = takes_call_pointers
        self.driver_arguments = (function, *grid, *block, shared_bytes)
        """cuLaunchKernel's arguments before the stream, in its order."""
        self._per_thread = threading.local()

    def parameter_block(self) -> ParameterBlock:
        """This thread's parameter memory, made on its first launch."""
        try:
            return self._per_thread.block
        except AttributeError:
            block = self._per_thread.block = ParameterBlock(len(self.tensor_maps), len(self.parameters))
            return block

    def launch(self, pointers: Sequence[int], stream: int, encode_map: Callable[[TensorMap, int], Any]) -> None:
        """Pack ``pointers`` into this thread's parameter memory and launch on ``stream``;
        ``encode_map`` gives a tensor map's encoded bytes for a pointer."""
        try:
            block = self._per_thread.block   # parameter_block() without the cost of a call
        except AttributeError:
            block = self.parameter_block()
        if self.takes_call_pointers:
            block.values[:] = pointers
        else:
            block.values[:] = [pointers[index] + offset for index, offset in self.parameters]
        if self.tensor_maps:
            mapped = tuple([pointers[index] for _, index in self.tensor_maps])
            if mapped != block.mapped:
                block.maps = [encode_map(tensor_map, pointer)
                              for (tensor_map, _), pointer in zip(self.tensor_maps, mapped)]
                block.addresses[:len(block.maps)] = [ctypes.addressof(m) for m in block.maps]
                block.mapped = mapped
        launch_kernel(*self.driver_arguments, stream, block.address, 0)


class Launcher:
    """A plan's cubin loaded per device, and the recipes of its launches.

    ``run`` takes the pointers of the call's buffers (``call_names``: the inputs, then the
    output); a plan's workspaces follow them in the list its recipes index."""

    def __init__(self, plan: KernelPlan, cubin: bytes):
        self.plan = plan
        self.cubin = cubin
        self.call_names = tuple(b.name for b in (*plan.inputs, plan.output))
        self._workspaces = plan.workspaces
        self._index = {name: i for i, name in enumerate((*self.call_names, *(b.name for b in self._workspaces)))}
        self._modules: dict[int, Any] = {}
        self._recipes: dict[tuple[int, int], LaunchRecipe] = {}
        self._plain_recipes: dict[int, tuple[LaunchRecipe, ...]] = {}
        """Per device, a plain plan's recipes in order: its every call is these launches alone."""
        self._workspace_recipes: dict[int, tuple[LaunchRecipe, ...]] = {}
        """Per device, the recipes in order of a plan that is plain but for its workspaces (split-K's
        partial tiles): its every call is their allocation and these launches."""
        self._encoded_maps: dict[tuple, Any] = {}
        self._constant_addresses: dict[tuple[int, str], int] = {}
        named = {b.name: b for b in plan.buffers}
        self._zeroed = (self._index[plan.output.name], buffer_bytes(plan.output)) if plan.zero_output else None
        self._constants = tuple((symbol, self._index[name], buffer_bytes(named[name])) for symbol, name in plan.constants)
        self._steps = None if plan.chunks > 1 else tuple(plan.schedule)
        """A one-chunk plan's steps, kept; a chunked plan's are made as they run (there may be many)."""
        launches_only = (self._steps is not None and not (self._zeroed or self._constants)
                         and not any(isinstance(step, BlasGemm) for step in self._steps))
        self._plain = launches_only and not self._workspaces
        """One chunk of kernel launches on the call's buffers alone: a model's common case."""
        self._workspaces_only = launches_only and bool(self._workspaces)

    def function(self, device_id: int, name: str):
        """The CuPy ``Function`` of kernel ``name``, its module loaded on ``device_id`` once."""
        import cupy

        if device_id not in self._modules:
            with cupy.cuda.Device(device_id):
                module = cupy.cuda.function.Module()
                module.load(self.cubin)
            self._modules[device_id] = module
        return self._modules[device_id].get_function(name)

    def run(self, device_id: int, pointers: Sequence[int], stream: int, allocate: Allocate) -> None:
        """Run the plan on ``pointers`` (the device address of each call buffer, in call order)
        on the stream whose handle is ``stream``, on ``device_id``, which must be current."""
        recipes = self._plain_recipes.get(device_id)
        if recipes is not None:
            for recipe in recipes:
                recipe.launch(pointers, stream, self._tensor_map)
            return
        recipes = self._workspace_recipes.get(device_id)
        if recipes is None:
            self._run_steps(device_id, pointers, stream, allocate)
            return
        kept = [allocate(buffer, device_id) for buffer in self._workspaces]
        pointers = [*pointers, *(pointer for _, pointer in kept)]
        for recipe in recipes:
            recipe.launch(pointers, stream, self._tensor_map)
        del kept   # the memory returns to the allocator's pool, stream-ordered after these launches

    def _run_steps(self, device_id: int, pointers: Sequence[int], stream: int, allocate: Allocate) -> None:
        """A plain plan's first call on a device (its recipes kept for the next), a first call of a
        plan plain but for its workspaces (its recipes kept too), or any call of a plan with a zeroed
        output, constants, cuBLAS steps or batch chunks."""
        if self._plain or self._workspaces_only:
            recipes = self._plain_recipes if self._plain else self._workspace_recipes
            recipes[device_id] = tuple(self._recipe(device_id, step) for step in self._steps)
            self.run(device_id, pointers, stream, allocate)
            return
        from cupy.cuda import runtime

        kept = [allocate(buffer, device_id) for buffer in self._workspaces]
        pointers = [*pointers, *(pointer for _, pointer in kept)]
        if self._zeroed:
            index, nbytes = self._zeroed
            runtime.memsetAsync(pointers[index], 0, nbytes, stream)
        for symbol, index, nbytes in self._constants:
            runtime.memcpyAsync(self._constant(device_id, symbol), pointers[index], nbytes,
                                runtime.memcpyDeviceToDevice, stream)
        for step in self._steps or self.plan.schedule:
            if isinstance(step, BlasGemm):
                blas_gemm(step, dict(zip(self._index, pointers)), stream)
            else:
                self._recipe(device_id, step).launch(pointers, stream, self._tensor_map)
        del kept   # the memory returns to the allocator's pool, stream-ordered after these launches

    def _recipe(self, device_id: int, step: Launch) -> LaunchRecipe:
        key = (device_id, id(step))
        recipe = self._recipes.get(key)
        if recipe is None:
            function = self.function(device_id, step.kernel)
            if step.shared_bytes > STATIC_SHARED_LIMIT:
                self._opt_in_shared(device_id, function, step.shared_bytes)
            buffers = self.plan.launch_args(step)
            offsets = step.offsets or (0,) * len(buffers)
            parameters = tuple((self._index[b.name], offset * b.dtype.itemsize) for b, offset in zip(buffers, offsets))
            maps = tuple((m, self._index[m.buffer]) for m in step.tensor_maps)
            in_call_order = parameters == tuple((i, 0) for i in range(len(self.call_names)))
            recipe = LaunchRecipe(function.ptr, step.launch_grid, step.block, step.shared_bytes, maps, parameters,
                                  takes_call_pointers=self._plain and in_call_order)
            if self._steps is not None:   # kept steps live as long as this launcher: their ids stay theirs
                self._recipes[key] = recipe
        return recipe

    def _tensor_map(self, tensor_map: TensorMap, pointer: int):
        """The encoded map for a buffer at ``pointer``, encoded once per address: encoding costs
        tens of microseconds of host time, which every call would otherwise pay."""
        from codegen import tma

        key = (tensor_map, pointer)
        encoded = self._encoded_maps.get(key)
        if encoded is None:
            if len(self._encoded_maps) >= MAX_ENCODED_MAPS:
                self._encoded_maps.clear()
            encoded = self._encoded_maps[key] = tma.encode(tensor_map, pointer)
        return encoded

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
