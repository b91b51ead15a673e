"""The launcher without a GPU: what each launch hands ``cuLaunchKernel`` (every parameter's pointer
and byte offset, tensor maps first, on the caller's stream), read back from the parameter memory
as the driver would read it, on a first call and on the calls after it; and parameter memory kept
per thread."""
import ctypes
import gc
import threading
from types import SimpleNamespace

import pytest

from codegen import launch
from codegen.api import plan
from codegen.spec import ConvSpec

NCHW = ConvSpec(dims=2, layout="NCHW", n=2, c=8, k=8, input_size=(16, 16), filter_size=(3, 3), padding=1)
NHWC = ConvSpec(dims=2, layout="NHWC", n=2, c=32, k=32, input_size=(16, 16), filter_size=(3, 3), padding=1)
NHWC_BF16 = ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=32, input_size=(16, 16), filter_size=(3, 3), padding=1,
                     dtype="bfloat16")
MAP_MARK = 1 << 60
"""The stand-in tensor map of a buffer at address p holds MAP_MARK | p."""
STREAM = 0x5_0000


class Driver:
    """``cuLaunchKernel``'s stand-in: each launch's kernel, stream and parameter values, read back
    through the address array it is handed, when it is handed it."""

    def __init__(self, kernel_plan, monkeypatch, stub_maps: bool = True):
        self.kernels = sorted({step.kernel for step in kernel_plan.launches})
        self.counts = {step.kernel: len(step.tensor_maps) + len(kernel_plan.launch_args(step))
                       for step in kernel_plan.launches}
        self.launches = []
        self.encoded = []
        monkeypatch.setattr(launch, "launch_kernel", self.launch)
        monkeypatch.setattr(launch.Launcher, "function",
                            lambda _, device_id, name: SimpleNamespace(ptr=self.kernels.index(name) + 1))
        monkeypatch.setattr(launch.Launcher, "_opt_in_shared", staticmethod(lambda *arguments: None))
        if stub_maps:
            monkeypatch.setattr(launch.Launcher, "_tensor_map", lambda _, tensor_map, pointer: self.encode(pointer))

    def encode(self, pointer: int) -> ctypes.c_uint64:
        self.encoded.append(pointer)
        return ctypes.c_uint64(MAP_MARK | pointer)

    def launch(self, function, gx, gy, gz, bx, by, bz, shared, stream, parameters, extra):
        kernel = self.kernels[function - 1]
        addresses = (ctypes.c_void_p * self.counts[kernel]).from_address(parameters)
        self.launches.append((kernel, stream, [ctypes.c_uint64.from_address(a).value for a in addresses]))


def expected_launches(kernel_plan, named: dict[str, int]) -> list:
    """What each step of the plan should be handed, from the plan alone."""
    expected = []
    for step in kernel_plan.schedule:
        buffers = kernel_plan.launch_args(step)
        offsets = step.offsets or (0,) * len(buffers)
        values = [MAP_MARK | named[m.buffer] for m in step.tensor_maps]
        values += [named[b.name] + offset * b.dtype.itemsize for b, offset in zip(buffers, offsets)]
        expected.append((step.kernel, STREAM, values))
    return expected


@pytest.mark.parametrize("family, spec, tiles, limit", [
    ("implicit_gemm", NCHW, None, None),            # one launch on the call's buffers: the plain path
    ("implicit_gemm", NHWC, {"tma": True}, None),   # tensor maps, a workspace, two launches
    ("im2win", NCHW, None, 28_000),                 # batch chunks: offsets that move per chunk
    ("implicit_gemm", NHWC_BF16, {"wgmma": True, "split_k": 1}, None),   # WGMMA: maps of w and x, y a pointer
    ("implicit_gemm", NHWC_BF16, {"wgmma": True, "split_k": 3}, None),   # ... and the partial tiles' workspace
], ids=["plain", "tma", "chunked", "wgmma", "wgmma-split-k"])
def test_each_launch_is_handed_its_buffers_at_their_offsets(monkeypatch, family, spec, tiles, limit):
    kernel_plan = plan(family, spec, tiles, target="h100", workspace_limit=limit)
    driver = Driver(kernel_plan, monkeypatch)
    launcher = launch.Launcher(kernel_plan, b"")
    workspaces = {b.name: 0x9_0000 + 0x1_0000 * i for i, b in enumerate(kernel_plan.workspaces)}

    def allocate(buffer, device_id):
        return None, workspaces[buffer.name]

    for base in (0x10_0000, 0x70_0000):   # a first call, then one that takes the kept recipes
        pointers = [base + 0x1_0000 * i for i in range(len(launcher.call_names))]
        driver.launches.clear()
        launcher.run(0, pointers, STREAM, allocate)
        assert driver.launches == expected_launches(kernel_plan, {**dict(zip(launcher.call_names, pointers)),
                                                                  **workspaces})


def test_maps_are_looked_up_only_when_their_buffers_move(monkeypatch):
    """A call on the buffers of the last one reuses its encoded maps without a lookup; a call on
    other buffers looks them up (the launcher encodes each address once) and launches with them."""
    kernel_plan = plan("implicit_gemm", NHWC_BF16, {"wgmma": True, "split_k": 1}, target="h100")
    driver = Driver(kernel_plan, monkeypatch)
    launcher = launch.Launcher(kernel_plan, b"")
    mapped = [m.buffer for m in kernel_plan.launches[0].tensor_maps]
    assert mapped == ["w", "x"]
    for base, encoded in ((0x10_0000, 2), (0x10_0000, 0), (0x70_0000, 2), (0x10_0000, 2)):
        pointers = [base + 0x1_0000 * i for i in range(len(launcher.call_names))]
        driver.launches.clear()
        driver.encoded.clear()
        launcher.run(0, pointers, STREAM, None)
        named = dict(zip(launcher.call_names, pointers))
        assert len(driver.encoded) == encoded
        assert driver.launches == expected_launches(kernel_plan, named)


def test_a_memoised_map_outlives_the_launcher_s_cache_being_cleared(monkeypatch):
    """The encoded-map cache empties itself at MAX_ENCODED_MAPS; a thread's last maps stay alive and
    are still the ones its next launch on the same buffers hands the driver."""
    kernel_plan = plan("implicit_gemm", NHWC_BF16, {"wgmma": True, "split_k": 1}, target="h100")
    driver = Driver(kernel_plan, monkeypatch, stub_maps=False)   # the real map cache, over a stand-in encoder
    monkeypatch.setattr("codegen.tma.encode", lambda tensor_map, pointer: driver.encode(pointer))
    launcher = launch.Launcher(kernel_plan, b"")
    pointers = [0x10_0000 + 0x1_0000 * i for i in range(len(launcher.call_names))]
    launcher.run(0, pointers, STREAM, None)
    for i in range(launch.MAX_ENCODED_MAPS + 1):   # other addresses, until the cache clears
        launcher._tensor_map(kernel_plan.launches[0].tensor_maps[0], 0x100_0000 + 0x100 * i)
    gc.collect()
    driver.launches.clear()
    launcher.run(0, pointers, STREAM, None)
    assert driver.launches == expected_launches(kernel_plan, dict(zip(launcher.call_names, pointers)))


def test_a_plan_plain_but_for_its_workspaces_keeps_its_recipes(monkeypatch):
    """Split-K's calls after the first allocate the partial tiles and launch the kept recipes, on a
    fresh workspace each call, without walking the plan's steps again."""
    kernel_plan = plan("implicit_gemm", NHWC_BF16, {"wgmma": True, "split_k": 3}, target="h100")
    driver = Driver(kernel_plan, monkeypatch)
    launcher = launch.Launcher(kernel_plan, b"")
    pointers = [0x10_0000 + 0x1_0000 * i for i in range(len(launcher.call_names))]
    launcher.run(0, pointers, STREAM, lambda buffer, device_id: (None, 0x9_0000))
    monkeypatch.setattr(launcher, "_run_steps", None)   # a second walk would fail to call
    for workspace in (0xA_0000, 0xB_0000):
        driver.launches.clear()
        launcher.run(0, pointers, STREAM, lambda buffer, device_id: (None, workspace))
        assert driver.launches == expected_launches(kernel_plan, {**dict(zip(launcher.call_names, pointers)),
                                                                  "partials": workspace})


def test_threads_pack_their_parameters_in_memory_of_their_own(monkeypatch):
    kernel_plan = plan("implicit_gemm", NCHW, target="h100")
    Driver(kernel_plan, monkeypatch)
    launcher = launch.Launcher(kernel_plan, b"")
    launcher.run(0, [0x1000, 0x2000, 0x3000], STREAM, None)
    (recipe,) = launcher._plain_recipes[0]
    assert recipe.takes_call_pointers
    here = recipe.parameter_block()
    there = []
    thread = threading.Thread(target=lambda: there.append(recipe.parameter_block()))
    thread.start()
    thread.join()
    assert recipe.parameter_block() is here and there[0] is not here
    assert there[0].address != here.address
