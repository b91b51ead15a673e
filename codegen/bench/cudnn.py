"""cuDNN at the spec's precision, the peer of the convolution families: the same inputs on the same
memory, which algorithm it ran (read from the names of the kernels it launched) and the extra
memory it took.
"""
from __future__ import annotations

import warnings

from codegen.spec import ConvSpec, DType, MathMode


def peer_precision(spec: ConvSpec) -> str:
    """What cuDNN runs as the spec's peer: fp32 (TF32 off) for math fma and 3xtf32 (cuDNN has no
    3xTF32: FP32 is the accuracy it matches), tf32 for math tf32, else the 16-bit dtype."""
    if spec.dtype is not DType.float32:
        return spec.dtype.short_name
    return "tf32" if spec.math is MathMode.tf32 else "fp32"


def cudnn_run(spec: ConvSpec, x_torch, w_torch):
    """One cuDNN call on ``x_torch`` and ``w_torch`` (already of the spec's dtype), TF32 allowed
    only for math tf32, ``cudnn.benchmark`` on (its fastest algorithm for the shape)."""
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = spec.math is MathMode.tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    conv = F.conv2d if spec.dims == 2 else F.conv3d
    return lambda: conv(x_torch, w_torch, stride=spec.stride, padding=spec.padding, dilation=spec.dilation)


def launched_kernels(run) -> list[str]:
    """The names of the CUDA kernels one call of ``run`` launches, in order, each once (PyTorch's
    profiler, CUDA activity only; copies and memsets left out).  cuDNN does not say which
    algorithm ``cudnn.benchmark`` chose, but its kernels' names do.  An empty list where the
    profiler cannot trace (no CUPTI): the algorithm is then unknown, not guessed."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*Profiler clears events")   # one traced cycle is all we keep
            with profile(activities=[ProfilerActivity.CUDA]) as trace:
                run()
                torch.cuda.synchronize()
            events = trace.events()
    except RuntimeError:
        return []
    names = [event.name for event in events if event.device_type == torch.autograd.DeviceType.CUDA
             and not event.name.startswith(("Memcpy", "Memset"))]
    return list(dict.fromkeys(names))


CUDNN_ALGORITHMS = (("FFT", "fft"), ("Winograd", "winograd"))
"""cuDNN's fast algorithms and the word each one's kernels carry in their names (``fft2d_r2c_16x16``,
``winograd_nonfused...``).  Every other algorithm sums the taps directly as a GEMM (implicit,
precomputed or explicit), the ones the issue's speed target compares against."""


def cudnn_algorithm(kernel_names: list[str]) -> str:
    """"FFT", "Winograd", "GEMM" (direct summation) or "unknown" (no names traced), from the
    kernels one cuDNN call launched."""
    if not kernel_names:
        return "unknown"
    lowered = " ".join(kernel_names).lower()
    return next((algorithm for algorithm, word in CUDNN_ALGORITHMS if word in lowered), "GEMM")


class CudnnCase:
    """One spec's uniform random inputs (seed 11) and output buffer on the GPU in the spec's dtype
    (bfloat16 as uint16 bits, as the kernels take it), cuDNN at the peer precision on the same
    memory (channels-last data seen by PyTorch through permuted views), and its output in float64,
    which a kernel's output is compared with through ``as_torch``."""

    def __init__(self, spec: ConvSpec):
        import cupy

        from codegen.api import array_dtype
        from codegen.index import IndexAlgebra

        alg = IndexAlgebra(spec)
        rng = cupy.random.default_rng(11)
        self.x, self.w = (self._stored(rng.uniform(-1, 1, shape, dtype=cupy.float32), spec.dtype)
                          for shape in (alg.image_shape, alg.filter_shape))
        self.y = cupy.empty(alg.output_shape, dtype=array_dtype(spec.dtype))
        self._last = (0, spec.dims + 1, *range(1, spec.dims + 1)) if spec.layout.channels_last else None
        self.run_cudnn = cudnn_run(spec, self.as_torch(self.x), self.as_torch(self.w))
        self.expected = self.run_cudnn().double()

    @staticmethod
    def _stored(values, dtype: DType):
        """``values`` (float32) rounded to ``dtype`` as the kernels store it."""
        import cupy
        import torch

        if dtype is DType.bfloat16:
            bits = torch.from_dlpack(values).to(torch.bfloat16).view(torch.int16)
            return cupy.from_dlpack(bits).view(cupy.uint16)
        return values.astype(cupy.float16) if dtype is DType.float16 else values

    def as_torch(self, array):
        """A CuPy array as the (N, C, spatial) tensor PyTorch convolves, without a copy (uint16
        arrays as the bfloat16 they hold)."""
        import cupy
        import torch

        if array.dtype == cupy.uint16:
            tensor = torch.from_dlpack(array.view(cupy.int16)).view(torch.bfloat16)
        else:
            tensor = torch.from_dlpack(array)
        return tensor.permute(*self._last) if self._last else tensor

    def relative_error(self) -> float:
        """||y - cuDNN|| / ||cuDNN|| in float64 for the output buffer as it stands."""
        norm = float(self.expected.norm())
        return float((self.as_torch(self.y).double() - self.expected).norm()) / (norm or 1.0)


def cudnn_extra_bytes(run, output_bytes: int) -> int:
    """The peak device memory one call of ``run`` (cuDNN through PyTorch) takes beyond its output
    of ``output_bytes``: its workspace, as PyTorch's allocator saw it."""
    import torch

    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    result = run()
    torch.cuda.synchronize()
    extra = torch.cuda.max_memory_allocated() - before - output_bytes
    del result
    return max(0, extra)
