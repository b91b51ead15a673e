"""Host time a call: what a model pays per layer before the GPU does any work.

    python -m codegen.bench.host            # the issue's layer, NCHW and NHWC, float32

Times ``CALLS`` calls with ``time.perf_counter`` while the GPU is held busy by a sleeping kernel,
so that the calls only enqueue work and never wait for the GPU: the figure is the Python and
driver work of one call, whatever the kernel's own time: ``F.conv2d`` (cuDNN, through PyTorch's dispatcher), a built kernel
called on tensors (``Kernel.__call__``, with and without ``out=``), the ``codegen.torch.conv``
functional, and the custom op ``torch.ops.convgen.conv`` called directly.  Median of rounds,
the calls' rounds interleaved; then what parts of a call cost alone.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

CALLS = 200
"""Calls a round: few enough that their launches fit CUDA's queue behind the sleeping kernel."""
ROUNDS = 15
SLEEP_CYCLES = 60_000_000
"""The sleeping kernel's length, about 30 ms at 2 GHz: longer than ``CALLS`` calls at 100 us."""


def per_call_seconds(runs: dict, calls: int = CALLS, rounds: int = ROUNDS) -> dict[str, float]:
    """Per name in ``runs``, the median over ``rounds`` of the host time of one call among
    ``calls`` issued behind a kernel that keeps the GPU busy past their end.  Each round times
    every run in turn, so that a slow spell of the host (a virtual machine's, shared) falls on all
    of them alike rather than on whichever ran then."""
    import torch

    for fn in runs.values():
        for _ in range(50):
            fn()
    torch.cuda.synchronize()
    samples: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            torch.cuda._sleep(SLEEP_CYCLES)
            start = time.perf_counter()
            for _ in range(calls):
                fn()
            samples[name].append((time.perf_counter() - start) / calls)
            torch.cuda.synchronize()
    return {name: statistics.median(values) for name, values in samples.items()}


def measure(channels_last: bool, dtype: str = "float32") -> dict[str, float]:
    """Microseconds a call for each way of running the layer (8 x 17 x 61 x 59, 33 filters 3x3)."""
    import torch
    import torch.nn.functional as F

    from codegen import torch as convgen_torch
    from codegen.api import build

    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = True
    element = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    x = torch.randn(8, 17, 61, 59, device="cuda", dtype=element)
    w = torch.randn(33, 17, 3, 3, device="cuda", dtype=element)
    if channels_last:
        x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    spec, _ = convgen_torch.spec_for(x, w, ((1, 1), (1, 1), (1, 1)))
    kernel = build("implicit_gemm", spec)
    print(f"{spec.layout.value}: {kernel.plan.variant} kernel, {len(kernel.plan.launches)} launch(es)"
          f"{', output zeroed first (split-K)' if kernel.plan.zero_output else ''}", file=sys.stderr)
    order = (0, 2, 3, 1) if channels_last else (0, 1, 2, 3)
    xk, wk = x.permute(*order), w.permute(*order)
    out = kernel(xk, wk)
    op_config = convgen_torch.op_config(((1, 1), (1, 1), (1, 1)), 1, "fma", "implicit_gemm", None)
    y = F.conv2d(x, w, padding=1)
    assert (convgen_torch.conv(x, w, padding=1).double() - y.double()).norm() <= 1e-4 * y.double().norm()
    runs = {
        "F.conv2d (cuDNN)": lambda: F.conv2d(x, w, padding=1),
        "Kernel(x, w)": lambda: kernel(xk, wk),
        "Kernel(x, w, out=y)": lambda: kernel(xk, wk, out=out),
        "codegen.torch.conv": lambda: convgen_torch.conv(x, w, padding=1, math="fma"),
        "torch.ops.convgen.conv": lambda: torch.ops.convgen.conv(x, w, op_config),
    }
    pointers = [xk.data_ptr(), wk.data_ptr(), out.data_ptr()]
    stream = torch._C._cuda_getCurrentRawStream(0)

    def allocate(buffer, device_id):
        workspace = torch.empty(buffer.elements * buffer.dtype.itemsize, dtype=torch.uint8, device="cuda")
        return workspace, workspace.data_ptr()

    from codegen.launch import launch_kernel

    kernel._launcher.run(0, pointers, stream, allocate)
    recipes = kernel._launcher._plain_recipes.get(0, ())
    single = recipes[0] if len(recipes) == 1 and not recipes[0].tensor_maps else None

    block = single.parameter_block() if single else None

    def driver_only():
        launch_kernel(*single.driver_arguments, stream, block.address, 0)

    geometry = ((1, 1), (1, 1), (1, 1))
    parts = {
        "  of which: Launcher.run": lambda: kernel._launcher.run(0, pointers, stream, allocate),
        **({"  of which: cuLaunchKernel": driver_only} if single else {}),
        "  of which: output alloc": lambda: x.new_empty_strided(y.shape, y.stride()),
        "  of which: stream, device": lambda: (torch._C._cuda_getCurrentRawStream(0), torch._C._cuda_getDevice()),
        "  of which: Kernel's key": lambda: tuple([(t.shape, t.is_contiguous(), t.dtype, t.device, t.data_ptr() % a)
                                                   for t, a in zip((xk, wk, out), kernel._call_alignments)]),
        "  of which: conv's key": lambda: convgen_torch._call_key(x, w, x.data_ptr(), w.data_ptr(), geometry, 1, "fma",
                                                                  "implicit_gemm", None),
    }
    return {name: seconds * 1e6 for name, seconds in per_call_seconds({**runs, **parts}).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16", "float16"))
    args = parser.parse_args(argv)
    import torch

    if not torch.cuda.is_available():
        print("bench host: needs a CUDA GPU", file=sys.stderr)
        return 2
    results = {layout: measure(layout == "NHWC", args.dtype) for layout in ("NCHW", "NHWC")}
    print(f"host time a call, us ({torch.cuda.get_device_name()}, {args.dtype}, 8x17x61x59, 33 filters 3x3)")
    print(f"{'call':26s} {'NCHW':>8s} {'NHWC':>8s}")
    for name in results["NCHW"]:
        cells = [f"{results[layout][name]:8.1f}" if name in results[layout] else f"{'-':>8s}" for layout in results]
        print(f"{name:26s} {' '.join(cells)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
