"""How the compute-bound kernels fare under sustained load: TFLOP/s and SM clock after seconds of
back-to-back launches, next to the short bursts that ``convgen bench conv`` times.

When to use it: to tell a kernel's speed from the card's power state, before comparing figures
near 50 TFLOP/s across runs or cards (docs/perf-history.md, GEMM v26).  ``convgen bench conv`` times each
kernel in short bursts (10 calls, each behind a sync), during which the H100 keeps its 1980 MHz
clock.  Run back to back for seconds, the kernels near 50 TFLOP/s draw the card's whole 700 W
power limit and the clock falls.

What it runs: for each kernel of ``KERNELS`` (the implicit GEMM, heuristic and TMA, on conv4, conv8
and c3d_conv2) this script idles the GPU (so each starts from the same state), then launches it
back to back for ``--seconds``, timing each ``--batch`` of launches with CUDA events while
``codegen.bench.clocks`` samples the SM clock and power cap; it reports the first batch's TFLOP/s
and the median of the last third of the batches, each with the clock it ran at.  cuDNN fp32 runs
the same way on the first layout of each layer, as the peer.  Prints a table and writes
sustained-clock.json under --out.

Needs a CUDA GPU, PyTorch (for cuDNN), nvidia-smi (for the clock) and the convgen package
installed; runs from any folder.

example:
  python scripts/sustained_clock.py --seconds 20 --idle 10 --out bench-out
"""
import argparse
import json
import statistics
import sys
import time
from pathlib import Path

KERNELS = (  # layer, layout, tiles (None: the heuristic's)
    ("conv4", "NCHW", None),
    ("conv4", "NHWC", {"tma": True}),
    ("conv8", "NCHW", {"tma": True}),
    ("conv8", "NHWC", {"tma": True}),
    ("c3d_conv2", "NCDHW", {"tma": True}),
    ("c3d_conv2", "NDHWC", {"tma": True}),
)


def sustain(run, flops: float, seconds: float, batch: int, sampler) -> list[dict]:
    """Launch ``run`` back to back for ``seconds``; one record (TFLOP/s, clock) per batch."""
    import cupy

    batches = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        start, end = cupy.cuda.Event(), cupy.cuda.Event()
        started = time.monotonic()
        start.record()
        for _ in range(batch):
            run()
        end.record()
        end.synchronize()
        elapsed = cupy.cuda.get_elapsed_time(start, end) / 1e3
        clock = sampler.window(started, time.monotonic())
        batches.append({"tflops": flops * batch / elapsed / 1e12,
                        "sm_mhz": clock["sm_mhz_median"] if clock else None,
                        "power_capped": clock["power_capped_share"] if clock else None})
    return batches


def summary(batches: list[dict]) -> dict:
    tail = batches[len(batches) * 2 // 3:]
    known = [b["sm_mhz"] for b in tail if b["sm_mhz"] is not None]
    capped = [b["power_capped"] for b in tail if b["power_capped"] is not None]
    return {"first_tflops": batches[0]["tflops"], "first_mhz": batches[0]["sm_mhz"],
            "steady_tflops": statistics.median(b["tflops"] for b in tail),
            "steady_mhz": statistics.median(known) if known else None,
            "steady_capped": statistics.mean(capped) if capped else None, "batches": len(batches)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=12.0, help="back-to-back launching per kernel (default 12)")
    parser.add_argument("--idle", type=float, default=8.0, help="idle seconds before each kernel (default 8)")
    parser.add_argument("--batch", type=int, default=20, help="launches per timed batch (default 20)")
    parser.add_argument("--out", type=Path, default=Path("bench-out"),
                        help="folder for sustained-clock.json (default bench-out)")
    args = parser.parse_args()

    from codegen.api import build
    from codegen.bench.clocks import describe, sampler_for_current_device
    from codegen.bench.cudnn import CudnnCase
    from codegen.bench.layers import layer_spec, load_shapes, select_layers
    from codegen.families.gemm_tiles import flops as gemm_flops

    shapes = load_shapes()
    results = []
    with sampler_for_current_device() as sampler:
        for layer_name, layout, tiles in KERNELS:
            layer = select_layers(shapes["conv2d_mec"] + shapes["conv3d"], [layer_name])[0]
            spec = layer_spec(layer, layout, layer["N"])
            case = CudnnCase(spec)
            kernel = build("implicit_gemm", spec, tiles)
            case.y.fill(float("nan"))
            kernel.launch([case.x, case.w], case.y)
            error = case.relative_error()
            flops = gemm_flops(spec)
            runs = [("implicit_gemm" + (" (tma)" if tiles else ""), lambda k=kernel, c=case: k.launch([c.x, c.w], c.y))]
            if layout in ("NCHW", "NCDHW"):
                runs.append(("cuDNN", case.run_cudnn))
            for name, run in runs:
                time.sleep(args.idle)
                row = {"layer": layer_name, "layout": layout, "kernel": name, "relative_error_vs_cudnn": error,
                       **summary(sustain(run, flops, args.seconds, args.batch, sampler))}
                results.append(row)
                print(f"[{layer_name} {layout} {name}] first {row['first_tflops']:.2f} TFLOP/s at {row['first_mhz']} MHz, "
                      f"steady {row['steady_tflops']:.2f} at {row['steady_mhz']} MHz", file=sys.stderr, flush=True)
        overall = sampler.overall()
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "sustained-clock.json").write_text(json.dumps({"rows": results, "clock": overall}, indent=1))
    print(describe(overall))
    print(f"{'layer':10} {'layout':6} {'kernel':20} {'first':>7} {'MHz':>5} {'steady':>7} {'MHz':>5} {'cap':>4} "
          f"{'steady/first':>12} {'rel.err':>8}")
    def mhz(value):
        return f"{value:5.0f}" if value is not None else f"{'-':>5}"

    for r in results:
        cap = f"{100 * r['steady_capped']:3.0f}%" if r["steady_capped"] is not None else f"{'-':>4}"
        print(f"{r['layer']:10} {r['layout']:6} {r['kernel']:20} {r['first_tflops']:7.2f} {mhz(r['first_mhz'])} "
              f"{r['steady_tflops']:7.2f} {mhz(r['steady_mhz'])} {cap} {r['steady_tflops'] / r['first_tflops']:12.3f} "
              f"{r['relative_error_vs_cudnn']:8.1e}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
