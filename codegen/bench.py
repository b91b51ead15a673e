"""Benchmarks: CUDA events, warm-up, median of repeats, the peers measured in the same run.

im2col and col2im are memory-bound, so each is reported as bytes moved (input read once plus
output written once) over time, next to a device-to-device copy (the ceiling) and PyTorch's
unfold/fold (the peer), all measured in this run.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import statistics
import sys
import time
import warnings
from importlib import resources
from pathlib import Path

import numpy as np

from codegen.clocks import describe, sampler_for_current_device
from codegen.families.direct import VARIANTS as DIRECT_VARIANTS
from codegen.spec import ConvSpec, SpecError

BATCH = 128
COLUMN_BUDGET_BYTES = 4 << 30


def load_shapes() -> dict:
    return json.loads(resources.files("codegen").joinpath("shapes.json").read_text())


LAYER_SIZES = {2: ("N", "C", "H", "W", "K", "R", "S"), 3: ("N", "C", "D", "H", "W", "K", "T", "R", "S")}
LAYER_GEOMETRY = {"stride": 1, "padding": 0, "dilation": 1}
"""A layer's stride, padding and dilation, with PyTorch's defaults where a --shapes file leaves one out."""


def benchmark_layers(groups: tuple[str, ...], path: Path | None = None) -> list[dict]:
    """The layers a benchmark runs, each tagged with its group: those of ``groups`` in the
    package's shapes.json, or every layer of a ``--shapes`` file (``read_shapes_file``)."""
    if path is not None:
        return read_shapes_file(path)
    shapes = load_shapes()
    return [dict(layer, group=group) for group in groups for layer in shapes[group]]


def read_shapes_file(path: Path) -> list[dict]:
    """Every layer of a file of the package's shapes.json form: an object of lists of layers (other
    values, such as a note, are skipped), or a bare list of layers.  Each layer is checked field by
    field and then as a spec, so a typo is named with its layer before any GPU work."""
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise SpecError("--shapes", str(path), "no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise SpecError("--shapes", str(path), f"must be a readable JSON file ({err})") from None
    groups = {"layers": data} if isinstance(data, list) else (
        {group: value for group, value in data.items() if isinstance(value, list)} if isinstance(data, dict) else {})
    layers = [dict(_checked_layer(layer, Path(path).name, f"{group}[{i}]"), group=group)
              for group, entries in groups.items() for i, layer in enumerate(entries)]
    if not layers:
        raise SpecError("--shapes", str(path), "holds no layers: give a list of layers, or an object of such lists "
                        "as codegen/shapes.json does")
    names = [layer["name"] for layer in layers]
    repeated = next((name for name in names if names.count(name) > 1), None)
    if repeated:
        raise SpecError(f"{Path(path).name}: name", repeated, "names a layer twice; each layer needs its own name")
    return layers


def _checked_layer(layer, source: str, position: str) -> dict:
    """``layer`` with its geometry as one value per dimension, or a SpecError that names the file
    (``source``) and the layer: by its name where it has one, else by ``position``."""
    if not isinstance(layer, dict):
        raise SpecError(f"{source}: {position}", layer, "a layer is an object, e.g. {\"name\": \"res2a\", \"N\": 32, "
                        "\"C\": 64, ...}")
    name = layer.get("name")
    where = f"{source}: {name if isinstance(name, str) and name else position}"
    dims = 3 if "D" in layer or "T" in layer else 2
    sizes = LAYER_SIZES[dims]
    allowed = ("name", *sizes, *LAYER_GEOMETRY)
    unknown = [key for key in layer if key not in allowed]
    if unknown:
        raise SpecError(f"{where}.{unknown[0]}", layer[unknown[0]], f"not a field of a {dims}D layer; those are "
                        f"{', '.join(allowed)}")
    for key in ("name", *sizes):
        if key not in layer:
            raise SpecError(f"{where}.{key}", None, f"missing; a {dims}D layer gives name, {', '.join(sizes)}")
    if not isinstance(name, str) or not name:
        raise SpecError(f"{where}.name", name, "must be a non-empty string")
    for key in sizes:
        if isinstance(layer[key], bool) or not isinstance(layer[key], int) or layer[key] < 1:
            raise SpecError(f"{where}.{key}", layer[key], "must be a whole number >= 1")
    checked = {key: layer[key] for key in ("name", *sizes)}
    for key, default in LAYER_GEOMETRY.items():
        value = layer.get(key, default)
        values = [value] * dims if isinstance(value, int) and not isinstance(value, bool) else value
        if (not isinstance(values, list) or len(values) != dims
                or any(isinstance(v, bool) or not isinstance(v, int) for v in values)):
            raise SpecError(f"{where}.{key}", value, f"must be one whole number or a list of {dims}, one per "
                            "spatial dimension, outermost first")
        checked[key] = values
    try:
        layer_spec(checked, "NCDHW" if dims == 3 else "NCHW", checked["N"])
    except SpecError as err:
        raise SpecError(f"{where}: {err.field}", err.value, err.allowed) from None
    return checked


def layer_spec(layer: dict, layout: str, n: int) -> ConvSpec:
    dims = 3 if "D" in layer else 2
    sizes = (layer["D"], layer["H"], layer["W"]) if dims == 3 else (layer["H"], layer["W"])
    filters = (layer["T"], layer["R"], layer["S"]) if dims == 3 else (layer["R"], layer["S"])
    return ConvSpec(dims=dims, layout=layout, n=n, c=layer["C"], k=layer["K"], input_size=sizes,
                    filter_size=filters, stride=tuple(layer["stride"]), padding=tuple(layer["padding"]),
                    dilation=tuple(layer["dilation"]))


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

    from codegen.families import get_family

    inputs = [cupy.asarray(x) for x in get_family(kernel.plan.family).make_inputs(kernel.spec, np.random.default_rng(0))]
    out = cupy.empty(kernel.plan.output.shape, dtype=cupy.float32)
    return median_seconds(lambda: kernel.launch(inputs, out), repeats)


def chunk_batch(spec_for_one: ConvSpec) -> int:
    """The largest power-of-two batch slice of BATCH whose column matrix fits the budget."""
    from codegen.index import IndexAlgebra

    per_image = IndexAlgebra(spec_for_one).rows * IndexAlgebra(spec_for_one).cols * 4
    chunk = BATCH
    while chunk > 1 and chunk * per_image > COLUMN_BUDGET_BYTES:
        chunk //= 2
    return chunk


def _torch_peer(family: str, spec: ConvSpec, x_torch, col_torch, chunk: int, chunks: int):
    import torch.nn.functional as F

    kwargs = dict(kernel_size=spec.filter_size, dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    if family == "im2col":
        return lambda: [F.unfold(x_torch[i * chunk:(i + 1) * chunk], **kwargs) for i in range(chunks)]
    return lambda: [F.fold(col_torch, output_size=spec.input_size, **kwargs) for _ in range(chunks)]


def torch_difference(family: str, spec: ConvSpec, kernel, image, col, x_torch, col_torch) -> float:
    """Max |ours - PyTorch| on the first batch chunk: a second, independent oracle in the benchmark.

    PyTorch orders rows (c, taps); channels-last rows are (taps, c), so theirs is transposed to match."""
    import cupy
    import torch
    import torch.nn.functional as F

    kwargs = dict(kernel_size=spec.filter_size, dilation=spec.dilation, padding=spec.padding, stride=spec.stride)
    taps = math.prod(spec.filter_size)
    to_ours = (0, *range(2, 2 + spec.dims), 1) if spec.layout.channels_last else tuple(range(2 + spec.dims))
    if family == "im2col":
        image[: spec.n] = cupy.from_dlpack(x_torch[: spec.n].permute(*to_ours).contiguous())
        kernel.launch([image[: spec.n]], col)
        theirs = F.unfold(x_torch[: spec.n], **kwargs).permute(1, 0, 2).reshape(spec.c, taps, -1)
        if spec.layout.channels_last:
            theirs = theirs.transpose(0, 1)
        return float((torch.from_dlpack(col).reshape(theirs.shape) - theirs).abs().max())
    kernel.launch([col], image[: spec.n])
    theirs = F.fold(col_torch, output_size=spec.input_size, **kwargs).permute(*to_ours)
    return float((torch.from_dlpack(image[: spec.n]) - theirs).abs().max())


def bench_layer(family: str, layer: dict, layout: str, copy_bps: float, repeats: int) -> dict:
    import cupy
    import torch

    from codegen.api import build
    from codegen.index import IndexAlgebra

    chunk = chunk_batch(layer_spec(layer, layout, 1))
    chunks = BATCH // chunk
    spec = layer_spec(layer, layout, chunk)
    kernel = build(family, spec)
    alg = IndexAlgebra(spec)
    full_image_shape = (BATCH, *alg.image_shape[1:])
    rng = cupy.random.default_rng(1)
    image = rng.uniform(-1, 1, full_image_shape, dtype=cupy.float32)
    col = rng.uniform(-1, 1, alg.col_shape, dtype=cupy.float32)
    x_torch = torch.rand(BATCH, spec.c, *spec.input_size, device="cuda") * 2 - 1
    if spec.layout.channels_last:
        x_torch = x_torch.to(memory_format=torch.channels_last if spec.dims == 2 else torch.channels_last_3d)
    # PyTorch's (chunk, C*taps, L) view of the same column matrix, for fold.
    if spec.layout.channels_last:
        col_torch = torch.from_dlpack(col).reshape(alg.taps, spec.c, chunk, -1).permute(2, 1, 0, 3)
    else:
        col_torch = torch.from_dlpack(col).reshape(spec.c, alg.taps, chunk, -1).permute(2, 0, 1, 3)
    col_torch = col_torch.reshape(chunk, spec.c * alg.taps, -1).contiguous()
    check = torch_difference(family, spec, kernel, image, col, x_torch, col_torch)
    if family == "im2col":
        ours = lambda: [kernel.launch([image[i * chunk:(i + 1) * chunk]], col) for i in range(chunks)]
    else:
        ours = lambda: [kernel.launch([col], image[i * chunk:(i + 1) * chunk]) for i in range(chunks)]
    nbytes = (math.prod(full_image_shape) + alg.rows * alg.cols * chunks) * 4
    seconds = median_seconds(ours, repeats)
    same_bytes = copy_bandwidth(nbytes // 2, repeats)
    torch_seconds = median_seconds(_torch_peer(family, spec, x_torch, col_torch, chunk, chunks), repeats)
    result = {
        "family": family, "variant": kernel.plan.variant, "layer": layer["name"], "layout": layout,
        "batch": BATCH, "chunk": chunk, "bytes": nbytes, "ms": seconds * 1e3,
        "tbps": nbytes / seconds / 1e12, "copy_tbps": copy_bps / 1e12, "ratio_copy": nbytes / seconds / copy_bps,
        "copy_same_bytes_tbps": same_bytes / 1e12, "ratio_copy_same_bytes": nbytes / seconds / same_bytes,
        "torch_ms": torch_seconds * 1e3, "torch_tbps": nbytes / torch_seconds / 1e12,
        "speedup_vs_torch": torch_seconds / seconds, "max_abs_diff_vs_torch": check,
    }
    del image, col, x_torch, col_torch
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return result


@contextlib.contextmanager
def clocked(results: list[dict], sampler):
    """Give the rows appended to ``results`` inside the block the SM clock sampled meanwhile."""
    first, started = len(results), time.monotonic()
    yield
    clock = sampler.window(started, time.monotonic())
    for row in results[first:]:
        row["clock"] = clock


def select_layers(shapes: list[dict], layers) -> list[dict]:
    """The layers named in ``layers`` (all when empty), refusing names the benchmark does not have."""
    if not layers:
        return shapes
    known = [l["name"] for l in shapes]
    unknown = [name for name in layers if name not in known]
    if unknown:
        raise SpecError("--layers", unknown[0], f"must be among {', '.join(known)}")
    return [l for l in shapes if l["name"] in layers]


def bench_memory_family(family: str, layouts=("NCHW", "NHWC"), layers=None, out_dir: Path = Path("bench-out"),
                        repeats: int = 10) -> list[dict]:
    shapes = select_layers(load_shapes()["conv2d_mec"], layers)
    copy_bps = copy_bandwidth()
    results = []
    total = len(shapes) * len(layouts)
    start = time.perf_counter()
    with sampler_for_current_device() as sampler:
        for layer in shapes:
            for layout in layouts:
                with clocked(results, sampler):
                    results.append(bench_layer(family, layer, layout, copy_bps, repeats))
                r = results[-1]
                print(f"[{len(results)}/{total}] {family} {r['layer']} {layout}: {r['ms']:.3f} ms, "
                      f"{r['ratio_copy']:.2f} of copy, {r['speedup_vs_torch']:.1f}x torch "
                      f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        print(describe(sampler.overall()), file=sys.stderr, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / f"{family}.json").write_text(json.dumps(results, indent=1))
    plot(results, out_dir / f"{family}.png")
    return results


def format_table(results: list[dict]) -> str:
    head = (f"{'layer':8} {'layout':6} {'variant':26} {'chunk':>5} {'ms':>9} {'TB/s':>6} {'/copy':>6} {'/same':>6} "
            f"{'torch ms':>9} {'vs torch':>8} {'|d| torch':>9}")
    lines = [head, "-" * len(head)]
    for r in results:
        lines.append(f"{r['layer']:8} {r['layout']:6} {r['variant']:26} {r['chunk']:5d} {r['ms']:9.3f} {r['tbps']:6.2f} "
                     f"{r['ratio_copy']:6.2f} {r['ratio_copy_same_bytes']:6.2f} {r['torch_ms']:9.3f} "
                     f"{r['speedup_vs_torch']:7.1f}x {r['max_abs_diff_vs_torch']:9.1e}")
    if results:
        lines.append(f"/copy: share of a 1 GiB device copy measured in this run ({results[0]['copy_tbps']:.2f} TB/s, "
                     "read + write); /same: of a copy moving the layer's own byte count")
    return "\n".join(lines)


def plot(results: list[dict], path: Path) -> bool:
    """Bar chart of the share of copy bandwidth per layer (ours and PyTorch); False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    layouts = list(dict.fromkeys(r["layout"] for r in results))
    layers = list(dict.fromkeys(r["layer"] for r in results))
    fig, ax = plt.subplots(figsize=(12, 4.5))
    width = 0.8 / (2 * len(layouts))
    for j, layout in enumerate(layouts):
        rows = {r["layer"]: r for r in results if r["layout"] == layout}
        xs = np.arange(len(layers))
        ours = [rows[l]["ratio_copy"] if l in rows else 0 for l in layers]
        theirs = [rows[l]["torch_tbps"] / rows[l]["copy_tbps"] if l in rows else 0 for l in layers]
        ax.bar(xs + (2 * j) * width, ours, width, label=f"convgen {layout}")
        ax.bar(xs + (2 * j + 1) * width, theirs, width, label=f"PyTorch {layout}", alpha=0.6)
    family = results[0]["family"]
    target = 0.85 if family == "im2col" else 0.6
    ax.axhline(target, color="k", linestyle="--", linewidth=1, label=f"target {target}")
    ax.set_xticks(np.arange(len(layers)) + 0.4 - width / 2)
    ax.set_xticklabels(layers)
    ax.set_ylabel("share of device-to-device copy bandwidth")
    ax.set_title(f"{family}, batch {BATCH}, fp32 (bytes read once + written once)")
    ax.legend(ncol=3, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def cudnn_fp32(spec: ConvSpec, x_torch, w_torch):
    import torch
    import torch.nn.functional as F

    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
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
    """One spec's uniform random inputs (seed 11) and output buffer on the GPU, cuDNN fp32 on the
    same memory (channels-last data seen by PyTorch through permuted views), and its output in
    float64, which a kernel's output is compared with through ``as_torch``."""

    def __init__(self, spec: ConvSpec):
        import cupy

        from codegen.index import IndexAlgebra

        alg = IndexAlgebra(spec)
        rng = cupy.random.default_rng(11)
        self.x = rng.uniform(-1, 1, alg.image_shape, dtype=cupy.float32)
        self.w = rng.uniform(-1, 1, alg.filter_shape, dtype=cupy.float32)
        self.y = cupy.empty(alg.output_shape, dtype=cupy.float32)
        self._last = (0, spec.dims + 1, *range(1, spec.dims + 1)) if spec.layout.channels_last else None
        self.run_cudnn = cudnn_fp32(spec, self.as_torch(self.x), self.as_torch(self.w))
        self.expected = self.run_cudnn().double()

    def as_torch(self, array):
        """A CuPy array as the (N, C, spatial) tensor PyTorch convolves, without a copy."""
        import torch

        tensor = torch.from_dlpack(array)
        return tensor.permute(*self._last) if self._last else tensor

    def relative_error(self) -> float:
        """||y - cuDNN|| / ||cuDNN|| in float64 for the output buffer as it stands."""
        norm = float(self.expected.norm())
        return float((self.as_torch(self.y).double() - self.expected).norm()) / (norm or 1.0)


def bench_direct_spec(spec: ConvSpec, label: str, variants, repeats: int, copy_bps: float) -> list[dict]:
    """Every requested direct variant and cuDNN fp32 on one spec; variants the spec refuses are noted."""
    import cupy
    import torch

    from codegen.api import build
    from codegen.index import IndexAlgebra

    alg = IndexAlgebra(spec)
    flops = 2 * spec.n * spec.k * math.prod(alg.out_size) * spec.c * alg.taps
    nbytes = (alg.image_elements + math.prod(alg.filter_shape) + math.prod(alg.output_shape)) * 4
    rng = cupy.random.default_rng(5)
    x = rng.uniform(-1, 1, alg.image_shape, dtype=cupy.float32)
    w = rng.uniform(-1, 1, alg.filter_shape, dtype=cupy.float32)
    y = cupy.empty(alg.output_shape, dtype=cupy.float32)
    x_torch = torch.from_dlpack(x)
    w_torch = torch.from_dlpack(w)
    if spec.layout.channels_last:
        last = (0, spec.dims + 1, *range(1, spec.dims + 1))
        x_torch, w_torch = x_torch.permute(*last), w_torch.permute(*last)
    cudnn_seconds = median_seconds(cudnn_fp32(spec, x_torch, w_torch), repeats)
    theirs = cudnn_fp32(spec, x_torch, w_torch)()
    rows = []
    for variant in variants:
        row = {"family": "direct", "layer": label, "layout": spec.layout.value, "variant": variant,
               "flops": flops, "bytes": nbytes, "copy_tbps": copy_bps / 1e12,
               "cudnn_ms": cudnn_seconds * 1e3, "cudnn_tflops": flops / cudnn_seconds / 1e12}
        try:
            kernel = build("direct", spec, tiles_for(spec, variant))
        except SpecError as err:
            rows.append({**row, "skipped": str(err)})
            continue
        seconds = median_seconds(lambda: kernel.launch([x, w], y), repeats)
        ours = torch.from_dlpack(y)
        if spec.layout.channels_last:
            ours = ours.permute(0, spec.dims + 1, *range(1, spec.dims + 1))
        rows.append({**row, "ms": seconds * 1e3, "tflops": flops / seconds / 1e12,
                     "tbps": nbytes / seconds / 1e12, "ratio_copy": nbytes / seconds / copy_bps,
                     "speedup_vs_cudnn": cudnn_seconds / seconds,
                     "max_abs_diff_vs_cudnn": float((ours - theirs).abs().max())})
    del x, w, y, x_torch, w_torch, theirs
    cupy.get_default_memory_pool().free_all_blocks()
    torch.cuda.empty_cache()
    return rows


def tiles_for(spec: ConvSpec, variant: str) -> dict:
    """The family's tile heuristic for ``variant``."""
    from codegen.families import get_family

    return get_family("direct").complete_tiles(spec, {"variant": variant}).to_dict()


def bench_direct(out_dir: Path = Path("bench-out"), repeats: int = 10, sets=("filter2d", "conv2d_mec", "conv3d"),
                 variants=DIRECT_VARIANTS, layers=None) -> list[dict]:
    chosen = select_layers(benchmark_layers(sets), layers)
    copy_bps = copy_bandwidth()
    results = []
    start = time.perf_counter()
    with sampler_for_current_device() as sampler:
        for layer in chosen:
            group = layer["group"]
            layout = "NCDHW" if group == "conv3d" else "NCHW"
            spec = layer_spec(layer, layout, layer["N"])
            layer_repeats = repeats if group == "filter2d" else max(3, repeats // 3)
            first = len(results)
            with clocked(results, sampler):
                results.extend(bench_direct_spec(spec, layer["name"], variants, layer_repeats, copy_bps))
            rows = results[first:]
            timed = [r for r in rows if "ms" in r]
            best = min(timed, key=lambda r: r["ms"]) if timed else None
            print(f"[{len(results)}] direct {layer['name']}: best {best['variant'] if best else '-'} "
                  f"{best['ms'] if best else float('nan'):.3f} ms, cuDNN {rows[0]['cudnn_ms']:.3f} ms "
                  f"({time.perf_counter() - start:.0f} s)", file=sys.stderr, flush=True)
        print(describe(sampler.overall()), file=sys.stderr, flush=True)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "direct.json").write_text(json.dumps(results, indent=1))
    plot_direct(results, out_dir / "direct.png")
    return results


def format_direct_table(results: list[dict]) -> str:
    lines = [f"{'layer':12} {'variant':12} {'ms':>9} {'TFLOP/s':>8} {'/copy':>6} {'cuDNN ms':>9} {'vs cuDNN':>8} {'|d|':>8}",
             "-" * 80]
    for r in results:
        if "ms" not in r:
            lines.append(f"{r['layer']:12} {r['variant']:12} refused: {r['skipped'][:58]}")
            continue
        lines.append(f"{r['layer']:12} {r['variant']:12} {r['ms']:9.3f} {r['tflops']:8.2f} {r['ratio_copy']:6.2f} "
                     f"{r['cudnn_ms']:9.3f} {r['speedup_vs_cudnn']:7.2f}x {r['max_abs_diff_vs_cudnn']:8.1e}")
    if results:
        lines.append(f"/copy: (input + filter + output bytes) / time over the {results[0]['copy_tbps']:.2f} TB/s copy; "
                     "cuDNN fp32, TF32 off, cudnn.benchmark on")
    return "\n".join(lines)


def plot_direct(results: list[dict], path: Path) -> bool:
    """Share of copy bandwidth of each variant and cuDNN on the single-channel filters."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    rows = [r for r in results if r["layer"].startswith("filter_") and "ms" in r]
    if not rows:
        return False
    layers = list(dict.fromkeys(r["layer"] for r in rows))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / (len(variants) + 1)
    xs = np.arange(len(layers))
    for j, variant in enumerate(variants):
        values = {r["layer"]: r["ratio_copy"] for r in rows if r["variant"] == variant}
        ax.bar(xs + j * width, [values.get(l, 0) for l in layers], width, label=variant)
    cudnn = {r["layer"]: r["bytes"] / (r["cudnn_ms"] / 1e3) / (r["copy_tbps"] * 1e12) for r in rows}
    ax.bar(xs + len(variants) * width, [cudnn[l] for l in layers], width, label="cuDNN", color="grey")
    ax.axhline(0.8, color="k", linestyle="--", linewidth=1, label="target 0.8")
    ax.set_xticks(xs + 0.4 - width / 2)
    ax.set_xticklabels(layers)
    ax.set_ylabel("share of copy bandwidth")
    ax.set_title("direct convolution, single channel 8192x8192, fp32")
    ax.legend(fontsize=8, ncol=3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True

