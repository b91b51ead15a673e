"""``convgen bench``: the kernels timed on the GPU against their peers, kept out of the generator.

The generator (spec, plan, render, compile, launch, emit) does not import it: it measures what the
generator builds.  The tuner, the demo and ``convgen run`` take its timing, and the catalogue and
``convgen tune --layer`` its layer tables.  Its modules:

- ``layers``: the benchmark layers, from the package's shapes.json or a ``--shapes`` file, as specs.
- ``timing``: CUDA-event timing: ``median_seconds``, ``interleaved_medians``, ``copy_bandwidth``,
  ``time_kernel``.
- ``clocks``: the SM clock, power draw and clock-limiting reasons sampled while a benchmark runs.
- ``cudnn``: the cuDNN fp32 peer: ``CudnnCase``, the algorithm it ran, its extra memory.
- ``memory``: ``bench im2col`` and ``bench col2im``, against a device copy and PyTorch.
- ``direct``: ``bench direct``, every direct variant against cuDNN.
- ``conv``: ``bench conv``, the convolution families against cuDNN.

This module imports nothing, so that the command line can offer ``CONV_FAMILIES`` without loading
the benchmarks.
"""

CONV_FAMILIES = ("implicit_gemm", "im2win", "im2col_gemm", "direct")
"""The families ``bench conv`` runs (all by default; ``--families`` picks among them), in its columns' order."""
