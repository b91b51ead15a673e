"""Timing on the GPU: CUDA events, warm-up, the median of repeats, each call queued behind a short
spin kernel so that the figure is device time; variants timed in interleaved rounds; the
device-to-device copy that memory-bound kernels are measured against.
"""
from __future__ import annotations

import functools
import statistics

import numpy as np

HOLD_SECONDS = 200e-6
"""How long the GPU is held busy before each timed call (see ``median_seconds``): longer than the
host takes to enqueue any call measured here (20-40 us for a launch with uploads and a tensor map)."""


@functools.cache
def _hold_kernel():
    import cupy

    return cupy.RawKernel(r"""extern "C" __global__ void convgen_hold(unsigned long long ns)
{
    unsigned long long now, end;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(end));
    end += ns;
    do { asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now)); } while (now < end);
}""", "convgen_hold")


def _hold_gpu() -> None:
    """Enqueue a one-thread kernel that spins for HOLD_SECONDS of GPU time, so that the events
    and the call queued behind it run back to back on the GPU."""
    _hold_kernel()((1,), (1,), (np.uint64(HOLD_SECONDS * 1e9),))


def median_seconds(fn, repeats: int = 10, warmup: int = 2) -> float:
    """Median over ``repeats`` of fn() timed with CUDA events on the current stream.  Each timed
    call is queued behind a short spin kernel, so the start event fires on the GPU only when the
    call is already enqueued: the figure is device time, not the host's time to prepare the
    launch (otherwise a 0.2 ms kernel with a 25 us launch path reads 12 % slow; nvbench's
    blocking kernel does the same)."""
    import cupy

    for _ in range(warmup):
        fn()
    start, end = cupy.cuda.Event(), cupy.cuda.Event()
    times = []
    for _ in range(repeats):
        _hold_gpu()
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(cupy.cuda.get_elapsed_time(start, end) / 1e3)
    return statistics.median(times)


def interleaved_medians(runs: dict, rounds: int, repeats: int = 10) -> dict[str, float]:
    """Seconds of each of ``runs`` (name: callable), the median over ``rounds`` rounds that each
    time every run once (``median_seconds`` of ``repeats`` calls): an A/B whose variants take turns,
    so that clock and temperature drift fall on all of them alike."""
    samples = {name: [] for name in runs}
    for _ in range(rounds):
        for name, run in runs.items():
            samples[name].append(median_seconds(run, repeats, warmup=1))
    return {name: statistics.median(times) for name, times in samples.items()}


def copy_bandwidth(nbytes: int = 1 << 30, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written."""
    import cupy

    src = cupy.random.random(nbytes // 4, dtype=cupy.float32)
    dst = cupy.empty_like(src)
    seconds = median_seconds(lambda: dst.__setitem__(Ellipsis, src), repeats)
    return 2 * nbytes / seconds


def time_kernel(kernel, repeats: int = 20) -> float:
    """Median seconds of one launch of ``kernel`` on random inputs."""
    import cupy

    from codegen.api import array_dtype
    from codegen.families import get_family

    inputs = [cupy.asarray(x) for x in get_family(kernel.plan.family, kernel.spec).make_inputs(kernel.spec, np.random.default_rng(0))]
    out = cupy.empty(kernel.plan.output.shape, dtype=array_dtype(kernel.plan.output.dtype))
    return median_seconds(lambda: kernel.launch(inputs, out), repeats)
