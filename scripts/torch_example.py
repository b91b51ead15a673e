"""A small ResNet-style network run with PyTorch's convolutions and with convgen's
(``codegen.torch.swap_convolutions``): outputs compared, time per forward pass for both, eager and
under ``torch.compile``.

When to use it: to see what swapping a model's convolutions for convgen's does to its outputs and
its speed, or (with --check-only, on a machine without a GPU) that every kernel it needs builds.
Examples:
    python scripts/torch_example.py                     # GPU: float32 with TF32 off on both sides
    python scripts/torch_example.py --dtype bf16        # GPU: bfloat16 against PyTorch's bfloat16
    python scripts/torch_example.py --math tf32         # GPU: TF32 on both sides (PyTorch's default)
    python scripts/torch_example.py --check-only        # no GPU needed: build every kernel it would launch

The network is written here (no torchvision): a 7x7 stride-2 stem, then three stages of two basic
blocks (3x3 convolutions, batch norm, ReLU, the residual add; a 1x1 stride-2 projection where a
stage halves the image), in channels_last memory format as PyTorch recommends for convolutions.
Results must agree within ``TOLERANCE`` of the output's norm: the network's error compounds over
its 15 convolutions, so the bound is a multiple of the precision's unit roundoff.
"""
from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time

TOLERANCE = {("float32", "fma"): 1e-5, ("float32", "tf32"): 2e-2, ("bfloat16", "fma"): 5e-2,
             ("float16", "fma"): 1e-2}
"""Relative error (L2) allowed between the two networks' outputs: 64 x the unit roundoff of the
operands (FP32 2^-24, TF32 2^-11, BF16 2^-8, FP16 2^-11) over 15 layers of accumulated rounding,
rounded up; both sides round, so the distance between them is what is bounded."""
DTYPES = ("fp32", "float32", "bf16", "bfloat16", "fp16", "float16")


def network():
    """Stem (7x7 stride 2, 3 to 64 channels), then stages of 64, 128 and 256 channels, each of two
    basic blocks (ResNet's: two 3x3 convolutions with batch norm and ReLU, and the residual add)."""
    import torch
    from torch import nn

    class BasicBlock(nn.Module):
        def __init__(self, channels_in: int, channels_out: int, stride: int):
            super().__init__()
            self.conv1 = nn.Conv2d(channels_in, channels_out, 3, stride, 1, bias=False)
            self.bn1 = nn.BatchNorm2d(channels_out)
            self.conv2 = nn.Conv2d(channels_out, channels_out, 3, 1, 1, bias=False)
            self.bn2 = nn.BatchNorm2d(channels_out)
            self.project = None
            if stride != 1 or channels_in != channels_out:
                self.project = nn.Sequential(nn.Conv2d(channels_in, channels_out, 1, stride, bias=False),
                                             nn.BatchNorm2d(channels_out))

        def forward(self, x):
            y = torch.relu(self.bn1(self.conv1(x)))
            y = self.bn2(self.conv2(y))
            return torch.relu(y + (x if self.project is None else self.project(x)))

    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU()]
    channels = 64
    for width, stride in ((64, 1), (128, 2), (256, 2)):
        layers += [BasicBlock(channels, width, stride), BasicBlock(width, width, 1)]
        channels = width
    return nn.Sequential(*layers)


def seconds_per_forward(model, x, repeats: int = 20, rounds: int = 5) -> float:
    """Median over ``rounds`` of the mean time of ``repeats`` back-to-back forward passes (CUDA
    events), after warm-up: the time a user sees per pass, host work included."""
    import torch

    for _ in range(3):
        model(x)
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(repeats):
            model(x)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1000 / repeats)
    return statistics.median(times)


def relative_error(ours, theirs) -> float:
    ours, theirs = ours.double(), theirs.double()
    return float((ours - theirs).norm() / theirs.norm())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dtype", default="fp32", choices=DTYPES, help="element type of the network")
    parser.add_argument("--math", default="fma", choices=("fma", "tf32"),
                        help="float32 only: fma (TF32 off on both sides) or tf32 (PyTorch's default)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=128, help="image height and width")
    parser.add_argument("--no-compile", action="store_true", help="skip the torch.compile runs")
    parser.add_argument("--cudnn-benchmark", action="store_true",
                        help="let cuDNN time its algorithms per layer (torch.backends.cudnn.benchmark; off by default "
                             "in PyTorch, and then cuDNN's heuristic picks)")
    parser.add_argument("--check-only", action="store_true",
                        help="no GPU: run the network on the CPU and build every kernel convgen would launch (for "
                             "the H100), without launching any")
    args = parser.parse_args(argv)
    try:
        import torch

        from codegen import torch as convgen_torch
    except ImportError as missing:
        print(f"torch_example: {missing}", file=sys.stderr)
        return 2
    dtype = {"fp32": torch.float32, "float32": torch.float32, "bf16": torch.bfloat16, "bfloat16": torch.bfloat16,
             "fp16": torch.float16, "float16": torch.float16}[args.dtype]
    math_mode = args.math if dtype == torch.float32 else "fma"
    torch.backends.cudnn.allow_tf32 = math_mode == "tf32"
    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    torch.manual_seed(0)
    reference = network().eval()
    ours = copy.deepcopy(reference)
    report = convgen_torch.swap_convolutions(ours, math=math_mode)
    print(report)
    device = "cpu" if args.check_only else "cuda"
    reference = reference.to(device, dtype, memory_format=torch.channels_last)
    ours = ours.to(device, dtype, memory_format=torch.channels_last)
    x = torch.randn(args.batch, 3, args.size, args.size, device=device, dtype=dtype)
    x = x.contiguous(memory_format=torch.channels_last)
    with torch.no_grad():
        if args.check_only:
            start = time.perf_counter()
            with convgen_torch.check_only("h100") as built:
                ours(x)
            for spec, kernel in built:
                print(f"  built {kernel.plan.family} ({kernel.plan.variant}) for {spec.describe()}")
            print(f"check-only: {len(built)} kernel(s) built for the H100 in {time.perf_counter() - start:.1f} s; "
                  "nothing launched")
            return 0
        expected, got = reference(x), ours(x)
        error = relative_error(got, expected)
        tolerance = TOLERANCE[(str(dtype).removeprefix("torch."), math_mode)]
        print(f"output: relative error {error:.2e} against PyTorch (tolerance {tolerance:.0e})")
        rows = [("eager", reference, ours)]
        if not args.no_compile:
            rows.append(("torch.compile", torch.compile(reference, fullgraph=True), torch.compile(ours, fullgraph=True)))
        print(f"{'mode':14s} {'PyTorch ms':>11s} {'convgen ms':>11s} {'speedup':>8s}")
        for mode, theirs_model, ours_model in rows:
            theirs_s, ours_s = seconds_per_forward(theirs_model, x), seconds_per_forward(ours_model, x)
            print(f"{mode:14s} {theirs_s * 1e3:11.3f} {ours_s * 1e3:11.3f} {theirs_s / ours_s:7.2f}x")
        return 0 if error <= tolerance else 1


if __name__ == "__main__":
    sys.exit(main())
