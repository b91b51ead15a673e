"""The ``convgen`` command line."""
from __future__ import annotations

import argparse
import sys
import textwrap
import time
from pathlib import Path

from codegen.version import __version__
from codegen.bench import CONV_FAMILIES
from codegen.device import TARGETS
from codegen.spec import ConvSpec, SpecError

EPILOG = """\
examples:
  convgen demo                                      generate, compile, emit (and on a GPU run and check) the default spec
  convgen generate im2col --layout NCHW --c 64 --input 56 56 --filter 3 3 --padding 1
  convgen emit im2col --layout NHWC --c 3 --dpitch 4 -o im2col_nhwc.cu
  convgen compile col2im --tile algorithm=scatter --arch sm_90
  convgen run im2col --dims 3 --layout NDHWC --input 8 16 16 --filter 3 3 3 --stride 2
  convgen run implicit_gemm --layout NHWC --c 64 --k 64 --input 56 56 --padding 1 --dtype bf16
                                                    tensor cores: bfloat16 in and out, FP32 sums
  convgen fuzz col2im --examples 300
  convgen fuzz implicit_gemm --tile tma=true --layout NHWC --examples 50
  convgen bench im2col --layouts NCHW NHWC --out bench-out
  convgen bench conv --layouts NHWC NDHWC --layers conv4 conv8 c3d_conv2
  convgen cache info

spec flags (every command that takes a spec): sizes are given outermost first, (H W) in 2D and
(D H W) in 3D; --stride/--padding/--dilation take one value for all dimensions or one per
dimension; --spec FILE.json reads the same fields (dims, layout, n, c, k, input_size,
filter_size, stride, padding, dilation, dpitch, dtype, math) and flags given as well override it.
Precision: --dtype float32 (default), float16 (fp16) or bfloat16 (bf16), inputs, filter and output
in that type with FP32 accumulation; for float32, --math fma (default, the FMA pipe), tf32 (operands
rounded to TF32 on tensor cores, PyTorch's default for convolutions) or 3xtf32 (FP32-level accuracy
on tensor cores).  16-bit types and tf32/3xtf32 run in implicit_gemm on sm_80 and newer; 16-bit types
also in im2col, col2im (gather) and direct (FP32 sums, one rounding).
"""

DEFAULTS = {"dims": 2, "n": 2, "c": 3, "k": 8, "input_size": None, "filter_size": None,
            "stride": 1, "padding": 0, "dilation": 1, "dpitch": None, "dtype": "float32",
            "math": "fma"}
"""What a flag left out means; padding 0 as in a spec file, ConvSpec and torch.nn.Conv2d."""


class Fail(Exception):
    """A user error to print as one line (no traceback) with exit status 2."""


def add_spec_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("spec")
    group.add_argument("--spec", metavar="FILE.json", help="read the spec from a JSON file")
    group.add_argument("--dims", type=int, choices=(2, 3), help="spatial dimensions (default 2)")
    group.add_argument("--layout", help="NCHW or NHWC (2D), NCDHW or NDHWC (3D); default channels-last")
    group.add_argument("--n", type=int, help="batch (default 2)")
    group.add_argument("--c", type=int, help="input channels (default 3)")
    group.add_argument("--k", type=int, help="output channels / filters (default 8)")
    group.add_argument("--input", type=int, nargs="+", metavar="SIZE", help="input size, e.g. 32 32 (default 32 per dim)")
    group.add_argument("--filter", type=int, nargs="+", metavar="SIZE", help="filter size, e.g. 3 3 (default 3 per dim)")
    group.add_argument("--stride", type=int, nargs="+", help="stride (default 1)")
    group.add_argument("--padding", type=int, nargs="+", help="zero padding (default 0, as in a --spec file and "
                       "torch.nn.Conv2d; --padding 1 keeps a 3x3 filter's output the input's size)")
    group.add_argument("--dilation", type=int, nargs="+", help="dilation (default 1)")
    group.add_argument("--dpitch", type=int, help="channel pitch of channels-last data, >= c (default c)")
    group.add_argument("--dtype", help="element type of input, filter and output: float32 (default), float16 "
                       "(fp16) or bfloat16 (bf16); sums accumulate in FP32")
    group.add_argument("--math", help="how float32 multiplies: fma (default, full FP32), tf32 (tensor cores, "
                       "operands rounded to TF32, as PyTorch's default) or 3xtf32 (tensor cores, FP32-level accuracy)")
    parser.add_argument("--tile", action="append", default=[], metavar="NAME=VALUE",
                        help="set a tile parameter (repeatable); see 'convgen families'")


def _one_or_many(values):
    if values is None:
        return None
    return values[0] if len(values) == 1 else tuple(values)


def given_fields(args) -> dict:
    """The spec fields the flags give (those left out are absent), layout in capitals."""
    flags = {"dims": args.dims, "layout": args.layout.upper() if args.layout is not None else None, "n": args.n,
             "c": args.c,
             "k": args.k, "input_size": _one_or_many(args.input), "filter_size": _one_or_many(args.filter),
             "stride": _one_or_many(args.stride), "padding": _one_or_many(args.padding),
             "dilation": _one_or_many(args.dilation), "dpitch": args.dpitch, "dtype": args.dtype,
             "math": args.math}
    return {k: v for k, v in flags.items() if v is not None}


def spec_from_args(args, base: ConvSpec | None = None) -> ConvSpec:
    """The spec of the flags, over ``base`` (a benchmark layer) or the --spec file, over the defaults."""
    data = dict(DEFAULTS)
    if base is not None:
        data.update(base.to_dict())
    if args.spec:
        data.update(ConvSpec.from_json(args.spec).to_dict())
    data.update(given_fields(args))
    dims = data["dims"]
    data.setdefault("layout", None)
    if data.get("layout") is None:
        data["layout"] = "NHWC" if dims == 2 else "NDHWC"
    if isinstance(data["layout"], str):
        data["layout"] = data["layout"].upper()
    if data["input_size"] is None:
        data["input_size"] = 32 if dims == 2 else 16
    if data["filter_size"] is None:
        data["filter_size"] = 3
    return ConvSpec.from_dict(data)


def tiles_from_args(args) -> dict | None:
    if not args.tile:
        return None
    tiles = {}
    for item in args.tile:
        if "=" not in item:
            raise SpecError("--tile", item, "must be NAME=VALUE, e.g. threads=256")
        name, value = item.split("=", 1)
        tiles[name] = _parse_value(value)
    return tiles


SIZE_UNITS = {"": 1, "b": 1, "kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30}


def parse_size(text: str) -> int:
    """Bytes from '4096', '64MiB', '1.5 GiB' (binary units only: 'MB' is refused as ambiguous)."""
    number = text.strip().rstrip("BbIiKkMmGg ")
    unit = text.strip()[len(number):].strip().lower()
    if unit in ("k", "m", "g", "kb", "mb", "gb"):
        raise SpecError("--workspace-limit", text, "say KiB, MiB or GiB (powers of 2) or give plain bytes")
    try:
        value = float(number)
    except ValueError:
        value = -1.0
    if unit not in SIZE_UNITS or not 0 <= value < float("inf"):
        raise SpecError("--workspace-limit", text, "must be bytes, e.g. 4096, 64MiB or 1.5GiB")
    if SIZE_UNITS[unit] == 1 and not value.is_integer():
        raise SpecError("--workspace-limit", text, "a byte count is a whole number; for fractions give a unit (1.5KiB)")
    return int(value * SIZE_UNITS[unit])


def _parse_value(text: str):
    lowered = text.lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    try:
        return int(text)
    except ValueError:
        return text


def workspace_limit_from_args(args) -> int | None:
    return parse_size(args.workspace_limit) if args.workspace_limit is not None else None


def cmd_generate(args) -> int:
    from codegen.api import plan
    from codegen.render import render_kernels

    kernel_plan = plan(args.family, spec_from_args(args), tiles_from_args(args),
                       workspace_limit=workspace_limit_from_args(args), target=args.target)
    print(render_kernels(kernel_plan).code, end="")
    return 0


def cmd_emit(args) -> int:
    from codegen.emit import build_flags, emit

    path = emit(args.family, spec_from_args(args), args.output, tiles_from_args(args), args.name,
                args.arch, workspace_limit_from_args(args), args.target)
    print(f"wrote {path}  (build: nvcc {' '.join(build_flags(path.read_text()))} -DCONVGEN_SELFTEST {path} -o selftest)")
    return 0


def _report_compile(kernel) -> None:
    from codegen.families.base import format_bytes

    compiled = kernel.compiled
    print(f"family   {kernel.plan.family} / {kernel.plan.variant}")
    print(f"spec     {kernel.spec.describe()}")
    print(f"tiles    {kernel.plan.tiles.describe()}")
    print(f"arch     {compiled.arch}")
    print(f"key      {compiled.key}")
    timing = f" ({compiled.compile_seconds * 1e3:.0f} ms)" if compiled.source_hit == "miss" else ""
    print(f"cache    {compiled.source_hit}{timing}")
    print(f"cubin    {len(compiled.cubin)} bytes")
    workspaces = ", ".join(f"{b.name} {format_bytes(b.elements * b.dtype.itemsize)}" for b in kernel.plan.workspaces)
    print(f"memory   workspace {format_bytes(kernel.plan.workspace_bytes)}{f' ({workspaces})' if workspaces else ''}")
    dynamic = {launch.kernel: launch.shared_bytes for launch in kernel.plan.launches}
    for name, res in compiled.resources.items():
        shared = (f"{res.shared_bytes} B static + {dynamic[name]} B dynamic shared" if dynamic.get(name)
                  else f"{res.shared_bytes} B shared")
        print(f"kernel   {name}: {res.registers} registers, {shared}, "
              f"{res.stack_bytes} B stack, spills {res.spill_stores}/{res.spill_loads} B")
    for warning in compiled.warnings:
        print(f"warning  {warning}")


def cmd_compile(args) -> int:
    from codegen.api import build

    _report_compile(build(args.family, spec_from_args(args), tiles_from_args(args), args.arch,
                          workspace_limit_from_args(args), args.target))
    return 0


def _require_gpu(what: str) -> None:
    from codegen.api import has_gpu

    if not has_gpu():
        raise Fail(f"{what} needs a CUDA GPU and none is visible; 'convgen compile' and 'convgen emit' work without one")


def cmd_run(args) -> int:
    from codegen.families import get_family

    spec = spec_from_args(args)
    get_family(args.family, spec).check_precision(spec)   # a spec no kernel of the family takes, before the GPU
    _require_gpu("convgen run")
    from codegen.api import build
    from codegen.bench.timing import time_kernel
    from codegen.fuzz import check_on_gpu

    kernel = build(args.family, spec, tiles_from_args(args), workspace_limit=workspace_limit_from_args(args))
    _report_compile(kernel)
    mismatch = check_on_gpu(args.family, spec, kernel=kernel)
    print(f"check    {'PASS' if mismatch is None else 'FAIL: ' + str(mismatch)} ({check_words(spec)})")
    median = time_kernel(kernel)
    print(f"time     {median * 1e3:.4f} ms median, {rate(kernel.plan, median)}")
    return 0 if mismatch is None else 1


def check_words(spec: ConvSpec) -> str:
    """How ``fuzz.check_result`` judged a run of ``spec``, for the check line."""
    from codegen.spec import uses_tensor_cores

    if uses_tensor_cores(spec.dtype, spec.math):
        return (f"each output within the {spec.dtype.value}{'' if spec.math.value == 'fma' else ' ' + spec.math.value} "
                "error bound of the float64 reference of the stored inputs, NaN-poisoned output")
    return "vs float64 numpy reference, NaN-poisoned output"


def rate(kernel_plan, seconds: float) -> str:
    """A convolution's TFLOP/s, a transform's GB/s: what the emitted files' timers report too."""
    from codegen.emit import bench_work

    work = bench_work(kernel_plan)
    if work["bench_flops"]:
        return f"{work['bench_flops'] / seconds / 1e12:.2f} TFLOP/s (2 x multiply-adds, padding taps included)"
    return f"{work['bench_bytes'] / seconds / 1e9:.1f} GB/s (bytes read once + written once)"


def cmd_fuzz(args) -> int:
    from codegen.api import has_gpu
    from codegen.families import get_family
    from codegen.fuzz import check_pins, fuzz, spec_command

    if args.spec:
        raise Fail("fuzz draws its specs, so it takes no --spec file: pin the fields to keep with the spec flags "
                   "(e.g. --layout NHWC --c 64 --stride 1), or check one spec with 'convgen run --spec FILE'")
    if args.examples < 1:
        raise SpecError("--examples", args.examples, "must be at least 1 (the specs to check)")
    get_family(args.family)
    pinned = given_fields(args)
    family = get_family(args.family, check_pins(pinned, args.family))   # the pinned dtype and math pick the kernel
    on_gpu = has_gpu()
    tiles = tiles_from_args(args)
    if tiles:
        family.tiles_type.check_fields(tiles)   # names and values before drawing; the rest come per spec
    what = "kernels on the GPU" if on_gpu else "plans and index maps on the CPU (no GPU visible)"
    kept = ", ".join(f"{k}={v}" for k, v in pinned.items()) or "none"
    chosen = " (tiles: " + ", ".join(f"{k}={v}" for k, v in tiles.items()) + ")" if tiles else ""
    print(f"fuzzing {args.family}{chosen}: {args.examples} examples, checking the {what}; fields kept: {kept}",
          flush=True)
    start = time.perf_counter()

    def progress(checked, refused):
        if sys.stderr.isatty() or (checked + refused) % 25 == 0:
            print(f"\r  {checked} specs checked, {refused} refused, {time.perf_counter() - start:.0f} s", end="",
                  file=sys.stderr, flush=True)

    report = fuzz(args.family, args.examples, on_gpu, tiles, args.seed, progress, pinned)
    print(file=sys.stderr)
    if report.refused:
        print(f"refused by the kernel's checks (not counted as examples): {sum(report.refused.values())} drawn "
              f"specs, commonest: {report.refusal_summary()}")
    if report.failure is None:
        if report.checked == 0:
            raise Fail(f"no spec was checked: {args.family} refused every spec drawn; pin the fields its "
                       f"refusals name (spec flags such as --layout, --stride, --dpitch) or change --tile")
        short = (f" (only {report.checked}: the rest were refused; pin the fields the refusals name, such as --c, to "
                 f"search where the kernel runs)" if report.checked < args.examples else "")
        print(f"no failing spec in {report.checked} checked{short}; seed {report.seed} repeats this search")
        return 0
    spec, mismatch = report.failure
    how = "the smallest spec found" if report.shrunk else "the spec that raised it (not shrunk: the device may be lost)"
    print(f"FAIL on {how}: {spec.describe()}\n  {mismatch}\nreproduce with:\n  {spec_command(args.family, spec, tiles)}"
          f"\n(seed {report.seed} repeats this search)")
    return 1


def _check_bench_tiles(args, dtype) -> None:
    """--tile of a memory-bound benchmark, planned on every layer and layout it will run, so that a tile
    no layer takes is refused, naming the layer, before any GPU work."""
    from codegen.api import plan
    from codegen.bench.layers import layer_spec, load_shapes, select_layers
    from codegen.spec import replace

    tiles = tiles_from_args(args)
    for layer in select_layers(load_shapes()["conv2d_mec"], args.layers):
        for layout in args.layouts or ("NCHW", "NHWC"):
            try:
                plan(args.family, replace(layer_spec(layer, layout, 1), dtype=dtype), tiles)
            except SpecError as error:
                raise Fail(f"--tile on {layer['name']} {layout}: {error}") from None


def cmd_bench(args) -> int:
    from codegen.bench.layers import benchmark_layers, select_layers

    if args.family in ("conv", "direct") and args.tile:
        raise Fail(f"--tile is taken by 'bench im2col' and 'bench col2im' only; 'bench {args.family}' runs "
                   "each family with the tiles build() takes (bench conv --tuned adds the tuning database's)")
    if args.family != "conv":
        given = next((flag for flag, value in (("--shapes", args.shapes), ("--families", args.families),
                                               ("--math", args.math != "fma")) if value), None)
        if given:
            raise Fail(f"{given} is taken by 'bench conv' only; 'bench {args.family}' runs the layers of the "
                       "package's shapes.json" + (" (math modes pick how tensor cores multiply; the memory-bound "
                                                  "families take --dtype)" if given == "--math" else ""))
        dtype = ConvSpec.from_dict({"dims": 2, "layout": "NCHW", "n": 1, "c": 1, "k": 1, "input_size": 1,
                                    "filter_size": 1, "dtype": args.dtype}).dtype     # refuse a bad --dtype now
        if args.tile:
            _check_bench_tiles(args, dtype)
        _require_gpu("convgen bench")
    if args.family == "direct":
        from codegen.bench.direct import bench_direct, format_direct_table

        results = bench_direct(out_dir=Path(args.out), repeats=args.repeats, layers=args.layers, dtype=dtype)
        print(format_direct_table(results))
        return 0
    if args.family == "conv":
        from codegen.bench import conv
        from codegen.bench.layers import layer_spec

        layers = select_layers(benchmark_layers(conv.LAYER_GROUPS, args.shapes), args.layers)
        precision = ConvSpec.from_dict({**layer_spec(layers[0], "NCDHW" if "D" in layers[0] else "NCHW", 1).to_dict(),
                                        "dtype": args.dtype, "math": args.math})     # refuse a bad --dtype/--math now
        if args.families and "implicit_gemm" not in args.families and (precision.dtype.value, precision.math.value) != (
                "float32", "fma"):
            raise Fail(f"--families {' '.join(args.families)} has no kernel for --dtype {precision.dtype.value} "
                       f"--math {precision.math.value}: only implicit_gemm runs on tensor cores")
        _require_gpu("convgen bench")
        layouts = tuple(args.layouts or ("NCHW", "NCDHW"))
        name = "-".join(["conv"] + ([Path(args.shapes).stem] if args.shapes else [])
                        + ([l.lower() for l in layouts] if layouts != ("NCHW", "NCDHW") else []))
        if (precision.dtype.value, precision.math.value) != ("float32", "fma"):
            name += f"-{precision.math.value if precision.math.value != 'fma' else precision.dtype.short_name}"
        results = conv.bench_conv(out_dir=Path(args.out), repeats=args.repeats, layouts=layouts, layers=layers,
                                  families=tuple(args.families or CONV_FAMILIES),
                                  ablation=not args.no_ablation, tuned=args.tuned, name=name,
                                  source=Path(args.shapes).name if args.shapes else "shapes.json",
                                  dtype=precision.dtype.value, math_mode=precision.math.value)
        print(conv.format_table(results))
        return 0
    from codegen.bench import memory

    tiles = tiles_from_args(args)
    results = memory.bench_memory_family(args.family, layouts=args.layouts or ("NCHW", "NHWC"), layers=args.layers,
                                         out_dir=Path(args.out), repeats=args.repeats, dtype=dtype, tiles=tiles)
    print(memory.format_table(results))
    return 0


def cmd_tune(args) -> int:
    from codegen import tune
    from codegen.families.base import format_bytes

    db = tune.TuningDB(args.db)
    if args.show:
        entries = db.entries()
        if not entries:
            print(f"no tuned entries in {db.path}")
        for entry in entries.values():
            spec = ConvSpec.from_dict(entry["spec"])
            base = f", heuristic {entry['heuristic_ms']:.3f} ms" if entry.get("heuristic_ms") else ""
            state = "" if tune.is_current(entry) else " [stale: timed other kernel code, not used; tune again]"
            held = (f", for builds with --workspace-limit {format_bytes(entry['workspace_limit'])}"
                    if entry.get("workspace_limit") is not None else "")
            print(f"{entry['family']:13} {spec.describe()}\n    {entry['gpu']} {entry['arch']} convgen "
                  f"{entry['version']}: {entry.get('ms', float('nan')):.3f} ms{base}{held}{state}\n    "
                  + " ".join(f"{k}={v}" for k, v in entry["tiles"].items()))
        return 0
    if args.export:
        print(f"wrote {db.export(args.export)} entries to {args.export}")
        return 0
    if args.import_:
        print(f"merged {db.import_(args.import_)} entries into {db.path}")
        return 0
    if args.refresh:
        _require_gpu("convgen tune --refresh")
        refreshed = tune.refresh(db)
        if not refreshed:
            print(f"no stale entries for this GPU in {db.path}")
        for old, result in refreshed:
            kept = "recorded tiles" if result.best and result.best.tiles == old["tiles"] else "heuristic"
            timed = {("recorded" if t.tiles == old["tiles"] else "heuristic"):
                     (f"{t.seconds * 1e3:.3f} ms" if t.status == "ok" else t.status) for t in result.trials}
            print(f"{old['family']:13} {result.spec.describe()}\n    was {old.get('ms', float('nan')):.3f} ms; now "
                  + ", ".join(f"{k} {v}" for k, v in timed.items()) + f" -> keeps the {kept}")
        return 0
    if not args.family:
        raise Fail("tune needs a FAMILY (or --show, --export, --import, --refresh)")
    if args.tile:
        raise Fail("tune searches the tiles itself; drop --tile")
    limit = workspace_limit_from_args(args)
    spec = tune_spec(args)
    from codegen.families import get_family

    get_family(args.family, spec).check_precision(spec)   # a dtype or math mode it has no kernel for, before the GPU
    _require_gpu("convgen tune")
    result = tune.tune(args.family, spec, budget=args.budget, max_configs=args.max_configs, seed=args.seed, db=db,
                       workspace_limit=limit)
    print(tune.format_result(result, args.top))
    if result.best is None:
        print("no configuration passed the reference check; nothing recorded", file=sys.stderr)
        return 1
    print(f"recorded in {db.path}")
    return 1 if tune.compile_errors(result) else 0


def tune_spec(args) -> ConvSpec:
    """The spec to tune: --layer's from shapes.json (channels-first unless --layout says otherwise),
    with any other spec flag given overriding the layer's field, as flags override a --spec file."""
    if not args.layer:
        if args.shapes:
            raise Fail("--shapes is the file --layer picks from; give --layer too")
        return spec_from_args(args)
    if args.spec:
        raise Fail("give --layer or --spec, not both")
    from codegen.bench.layers import benchmark_layers, layer_spec

    layers = {l["name"]: l for l in benchmark_layers(("conv2d_mec", "conv3d", "filter2d"), args.shapes)}
    if args.layer not in layers:
        raise SpecError("--layer", args.layer, f"must be one of {', '.join(layers)}")
    layer = layers[args.layer]
    dims = 3 if "D" in layer else 2
    layout = (args.layout or ("NCHW" if dims == 2 else "NCDHW")).upper()
    return spec_from_args(args, base=layer_spec(layer, layout, layer["N"]))


def cmd_cache(args) -> int:
    from codegen.compile import default_cache

    cache = default_cache()
    if args.action == "clear":
        print(f"removed {cache.clear()} entries from {cache.directory} (other files there are left alone)")
    else:
        info = cache.info()
        print(f"directory  {info['directory']}\nentries    {info['entries']}\nbytes      {info['bytes']}\n"
              f"other      {info['foreign']} file(s) not convgen's (left alone by 'cache clear')")
    return 0


TENSOR_CORE_SPEC = ConvSpec(dims=2, layout="NHWC", n=1, c=1, k=1, input_size=1, filter_size=1, dtype="bfloat16")
"""A spec whose dtype sends a family to its tensor-core kernel, if it has one (``Family.for_spec``)."""


def cmd_families(args) -> int:
    from codegen.families import FAMILIES

    for family in FAMILIES.values():
        print(f"{family.name}: {family.summary}")
        for param in family.tiles_type.PARAMS:
            print(f"  --tile {param.name}=...  {param.doc}; {param.allowed()}")
        tensor_cores = family.for_spec(TENSOR_CORE_SPEC)
        if tensor_cores is not family:
            print(f"  with --dtype float16 or bfloat16, or --math tf32 or 3xtf32: {tensor_cores.summary}; its tiles "
                  "instead of the above:")
            for param in tensor_cores.tiles_type.PARAMS:
                print(f"    --tile {param.name}=...  {param.doc}; {param.allowed()}")
    return 0


def cmd_catalogue(args) -> int:
    from codegen import catalogue

    stale = catalogue.stale_files()
    if args.check:
        for path in stale:
            print(f"stale: {path}")
        return 1 if stale else 0
    written, deleted = catalogue.write_all()
    for path in deleted:
        print(f"deleted: {path} (no longer in the catalogue)")
    print(f"{len(written)} file(s) rewritten, {len(deleted)} deleted, {len(catalogue.entries())} in the catalogue")
    return 0


def cmd_demo(args) -> int:
    from codegen import demo
    from codegen.files import check_output_folder

    check_output_folder(Path(args.out))
    return demo.run(Path(args.out))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="convgen", description="Render convolution specs into specialised CUDA kernels: generate, "
        "compile (NVRTC, cached by hash), run and check, emit standalone .cu files, fuzz shapes.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version", version=f"convgen {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    def family_command(name, helptext, func, builds=True):
        cmd = sub.add_parser(name, help=helptext, description=helptext, epilog=EPILOG,
                             formatter_class=argparse.RawDescriptionHelpFormatter)
        cmd.add_argument("family", help="kernel family: im2col, col2im, direct, implicit_gemm, im2win or "
                         "im2col_gemm (see 'convgen families')")
        add_spec_flags(cmd)
        if builds:
            cmd.add_argument("--workspace-limit", metavar="SIZE", help="most device memory the kernel may use beyond "
                             "inputs and output, e.g. 64MiB (as cuDNN's workspace limit): the heuristic picks a "
                             "smaller batch chunk (im2win, im2col_gemm) or the implicit GEMM without the TMA "
                             "kernel's transposed filter; tiles given with --tile that need more are refused")
        cmd.set_defaults(func=func)
        return cmd

    generate_cmd = family_command("generate", "print the rendered CUDA source of a kernel", cmd_generate)
    emit_cmd = family_command("emit", "write a standalone .cu file (kernel, C launcher, self-test)", cmd_emit)
    emit_cmd.add_argument("-o", "--output", required=True, metavar="FILE.cu")
    emit_cmd.add_argument("--name", help="name of the extern \"C\" launcher")
    emit_cmd.add_argument("--arch", help="architecture named in the build line (default: --target's, else sm_90)")
    compile_cmd = family_command("compile", "compile with NVRTC (no GPU needed); report cache key, hit or miss, "
                                 "cubin size, workspace, registers, shared memory, spills", cmd_compile)
    compile_cmd.add_argument("--arch", help="architecture, e.g. sm_90 (default: --target's, else the device's, "
                             "else sm_90)")
    for command in (generate_cmd, emit_cmd, compile_cmd):
        command.add_argument("--target", metavar="CARD", help="the card the tiles are chosen for, on a machine "
                             f"without it: {', '.join(TARGETS)}, or CARD,FIELD=N,... to change its numbers "
                             "(e.g. h100,sm_count=114); default: this machine's GPU, else the reference card of "
                             "--arch (sm_80: a100, sm_89: l40s, ...), else h100")
    family_command("run", "run on the GPU, check against the float64 reference, and time", cmd_run)
    fuzz_cmd = family_command("fuzz", "search random specs for one where the kernel is wrong; print the "
                              "smallest as a command", cmd_fuzz, builds=False)
    fuzz_cmd.description = textwrap.fill(
        "Search random small specs for one where the kernel is wrong and shrink it to the smallest (Hypothesis). "
        "With a GPU each spec's kernel runs on NaN-poisoned outputs against the float64 reference (tensor-core "
        "specs, --dtype float16/bfloat16 or --math tf32/3xtf32, each output within the error bound of "
        "codegen.precision); without one the family plans and renders each spec and its index algebra is checked "
        "against the reference (the TMA implicit GEMM's tensor maps included; the tensor-core kernel's address terms "
        "are the FMA kernel's). Spec flags given here are kept in every spec and the other fields "
        "vary (--layout NHWC --stride 1 searches channels-last, stride-1 specs; their defaults do not apply); "
        "specs the kernel refuses for its tiles are counted apart, with their reasons, and do not count as "
        "examples.", 100)
    fuzz_cmd.add_argument("--examples", type=int, default=100, help="specs to check (default 100)")
    fuzz_cmd.add_argument("--seed", type=int, help="random seed, for a repeatable search")

    bench_cmd = sub.add_parser(
        "bench", help="benchmark a family on the layers of shapes.json against its peers (GPU)",
        epilog="examples:\n  convgen bench conv --layers conv4 conv8 c3d_conv2\n"
        "  convgen bench conv --layouts NHWC NDHWC --no-ablation\n"
        "  convgen bench conv --layouts NHWC NDHWC --layers conv8 c3d_conv2 --dtype bf16   (tensor cores vs cuDNN bf16)\n"
        "  convgen bench conv --shapes my_net.json --families implicit_gemm --no-ablation\n"
        "      (your layers, in the form of codegen/shapes.json: {\"layers\": [{\"name\": \"res2a\", \"N\": 32, "
        "\"C\": 64, \"H\": 56,\n       \"W\": 56, \"K\": 64, \"R\": 3, \"S\": 3, \"padding\": 1}]}; "
        "3D layers add D and T; stride, padding\n       and dilation default to 1, 0, 1)\n"
        "  convgen bench im2col --layouts NCHW NHWC --out bench-out\n"
        "  convgen bench col2im --dtype bf16 --tile channels=4   (col2im-bf16-channels4.json: 4 channels a thread)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    bench_cmd.add_argument("family", choices=("im2col", "col2im", "direct", "conv"),
                           help="conv: implicit_gemm, im2win, im2col_gemm and the best direct kernel against cuDNN, "
                           "and im2win again held to cuDNN's extra memory on the layer ('(<=cuDNN MiB)': its speed, "
                           "or what one image needs where no batch chunk fits); its table also gives cuDNN's "
                           "algorithm on each layer ('alg', from the names of the kernels it launched: gemm, fft or "
                           "wino), stars the kernel build() runs where that is not a family's first column, and "
                           "gives each layer's median SM clock and how often the power cap held it down (sampled "
                           "with nvidia-smi; an H100 reaches its 700 W cap near 50 TFLOP/s)")
    bench_cmd.add_argument("--layouts", nargs="+", help="default NCHW NHWC (im2col, col2im); NCHW NCDHW (conv: "
                           "2D layers run in the 2D layouts given, 3D layers in the 3D ones; other layouts write "
                           "conv-<layouts>.json and .png, e.g. conv-nhwc-ndhwc; every layout also runs the implicit "
                           "GEMM's TMA kernel where it takes the layer)")
    bench_cmd.add_argument("--no-ablation", action="store_true", help="conv: skip the im2win ablation")
    bench_cmd.add_argument("--tuned", action="store_true", help="conv: also run the tuning database's "
                           "configurations (tuned against heuristic against cuDNN)")
    bench_cmd.add_argument("--layers", nargs="+", help="layer names of shapes.json or of --shapes (default all the "
                           "family runs on; 'direct' also takes filter_r1..filter_r4)")
    bench_cmd.add_argument("--shapes", metavar="FILE.json", help="conv: run the layers of FILE.json instead of "
                           "shapes.json (every layer in it, 2D and 3D; each layer's N is its batch); writes "
                           "conv-<FILE>[-<layouts>].json and .png")
    bench_cmd.add_argument("--families", nargs="+", choices=CONV_FAMILIES, metavar="FAMILY",
                           help=f"conv: the families to run (default all: {', '.join(CONV_FAMILIES)}); cuDNN "
                           "always runs")
    bench_cmd.add_argument("--repeats", type=int, default=10, help="timed launches per median (default 10); conv "
                           "takes that median in 3 rounds that time cuDNN and every kernel in turn, and reports "
                           "the median round")
    bench_cmd.add_argument("--out", default="bench-out", help="folder for the JSON and PNG (default bench-out)")
    bench_cmd.add_argument("--dtype", default="float32", help="element type of every layer, float32 (default), "
                           "float16/fp16 or bfloat16/bf16: conv, the tensor-core implicit GEMM against cuDNN at the "
                           "same precision; im2col, col2im and direct, their 16-bit kernels (share of copy bandwidth)")
    bench_cmd.add_argument("--math", default="fma", help="conv, float32: fma (default), tf32 (against cuDNN TF32) or "
                           "3xtf32 (against cuDNN FP32, beside our FMA kernel)")
    bench_cmd.add_argument("--tile", action="append", default=[], metavar="NAME=VALUE",
                           help="im2col, col2im: a tile parameter for every layer (repeatable; the rest as build() "
                           "takes them), e.g. --tile channels=4 for col2im's channel groups; the JSON and PNG "
                           "names end in the tiles; see 'convgen families'")
    bench_cmd.set_defaults(func=cmd_bench)

    tune_cmd = sub.add_parser(
        "tune", help="autotune a family's tiles for a spec on this GPU and record the winner",
        description="Search the family's tile space (limits and the compiler's resource report prune it "
        "first), check every candidate against a reference, time it with CUDA events and record the fastest "
        "in the tuning database, which build() then uses for this spec, GPU and convgen version as long as the "
        "kernel code it timed is unchanged (a template edit retires the record). A candidate the compiler "
        "rejects is a convgen bug: the search goes on without it, names it after the table and exits with "
        "status 1 (the winner is still recorded).",
        epilog="examples:\n  convgen tune implicit_gemm --layer conv8 --budget 60\n"
        "  convgen tune implicit_gemm --layer conv8 --layout NHWC --dtype bf16   (the tensor-core kernel's tiles; "
        "the record serves bfloat16 builds only)\n"
        "  convgen tune im2win --layout NHWC --n 32 --c 64 --k 64 --input 56 56\n  convgen tune --show\n"
        "  convgen tune --export tuned.json   (then on another machine: convgen tune --import tuned.json)\n"
        "  convgen tune --refresh   (after a template change: re-time the retired entries, seconds each)\n"
        "  convgen tune im2win --layer conv9 --layout NHWC --workspace-limit 190MiB\n"
        "      (search only tiles within 190 MiB of workspace; builds with the same --workspace-limit use the record)",
        formatter_class=argparse.RawDescriptionHelpFormatter)
    tune_cmd.add_argument("family", nargs="?", help="implicit_gemm, im2win, im2col_gemm or direct")
    add_spec_flags(tune_cmd)
    tune_cmd.add_argument("--layer", help="take the spec from shapes.json (e.g. conv4, c3d_conv2); spec flags given "
                          "as well override its fields (--layout NHWC --dpitch 64, --n 32)")
    tune_cmd.add_argument("--shapes", metavar="FILE.json", help="the file --layer picks from instead of shapes.json "
                          "(the form 'convgen bench --help' shows)")
    tune_cmd.add_argument("--budget", type=float, default=60.0, help="seconds of tuning (default 60)")
    tune_cmd.add_argument("--max-configs", type=int, default=200, help="configurations to try at most (default 200)")
    tune_cmd.add_argument("--seed", type=int, default=0, help="seed of the random sample (default 0)")
    tune_cmd.add_argument("--top", type=int, default=10, help="configurations in the final table (default 10)")
    tune_cmd.add_argument("--db", help="tuning database (default $CONVGEN_TUNING_DB or <cache dir>/tuning.json)")
    tune_cmd.add_argument("--workspace-limit", metavar="SIZE", help="search only tiles that need at most SIZE of "
                          "workspace (e.g. 64MiB), from the heuristic held to it; the record serves builds with the "
                          "same limit (a record tuned without a limit serves them too, where it fits)")
    tune_cmd.add_argument("--show", action="store_true", help="list the database's entries and exit")
    tune_cmd.add_argument("--export", metavar="FILE", help="write the database's entries to FILE and exit")
    tune_cmd.add_argument("--import", dest="import_", metavar="FILE", help="merge FILE's entries and exit")
    tune_cmd.add_argument("--refresh", action="store_true", help="re-time every stale entry of this GPU (a template "
                          "edit retired it) against the heuristic, keep the faster with today's code, and exit")
    tune_cmd.set_defaults(func=cmd_tune)

    cache_cmd = sub.add_parser("cache", help="show or clear the on-disk kernel cache ($CONVGEN_CACHE_DIR)")
    cache_cmd.add_argument("action", choices=("info", "clear"))
    cache_cmd.set_defaults(func=cmd_cache)

    sub.add_parser("families", help="list kernel families and their tile parameters").set_defaults(func=cmd_families)

    cat_cmd = sub.add_parser("catalogue", help="re-emit generated/ (the benchmark layers) or --check it is fresh")
    cat_cmd.add_argument("--check", action="store_true")
    cat_cmd.set_defaults(func=cmd_catalogue)

    demo_cmd = sub.add_parser("demo", help="the main job on the default spec: generate, compile, emit, and on a "
                              "GPU run and check every family")
    demo_cmd.add_argument("--out", default="convgen-demo", help="folder for the emitted files")
    demo_cmd.set_defaults(func=cmd_demo)
    return parser


def main(argv: list[str] | None = None) -> int:
    from codegen.api import LaunchError
    from codegen.compile import CacheError, CompileError
    from codegen.files import EmitError
    from codegen.tuning_db import DatabaseError

    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args)
    except (SpecError, LaunchError, CompileError, CacheError, EmitError, DatabaseError, Fail) as err:
        print(f"convgen: error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
