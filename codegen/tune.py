"""Autotuning of tile parameters, and the tuning database that ``build`` consults.

The search space comes from each family's declared tile parameters (``Family.tuning_space``),
pruned in three steps before anything runs: the declared limits (every candidate must plan
without a ``SpecError``: divisibility, threads, shared memory, the register estimate), then the
compiled kernel's real resources from ptxas's report (spills or stack frames disqualify), then
on the GPU a check of the candidate's output against an independent reference: a candidate that
is fast and wrong never wins.

Strategy (the space is hundreds to thousands of configurations; a budget allows dozens):
1. the heuristic's configuration first, so the result is never worse than the default, then the
   family's seeds (``Family.tuning_seeds``: shapes known to win elsewhere, as CUTLASS's profiler
   runs its fixed list of kernel instances);
2. if the space fits ``max_configs``, all of it (exhaustive); otherwise a seeded random sample
   of half the allowance, compiled in parallel threads (NVRTC releases the GIL);
3. local refinement: the best so far is perturbed one parameter at a time to its neighbouring
   values (hill climbing, as Kernel Tuner's and Triton's refinements do) until no neighbour
   improves or the budget or allowance runs out;
4. the winner must beat the heuristic by ``SIGNIFICANT`` (2%), else the heuristic is kept.
Timing: CUDA events, warm-up, median of repeats, inputs rotated through enough copies to defeat
the 50 MB L2 so that caches do not flatter small layers.

Precision: a spec's dtype and math pick the kernel (``get_family(family, spec)``: implicit_gemm's
tensor-core kernel for float16, bfloat16, tf32 and 3xtf32, with its own tiles and space), the
inputs are the family's (``make_inputs``, stored as the kernel takes them: bfloat16 as uint16 bits)
and so is the output buffer.  FP32 candidates must match the float64 reference to ``TOLERANCE`` in
norm; tensor-core candidates must put every output within ``precision.error_bound`` of it.  A
record is keyed by the spec, dtype and math included, so a bfloat16 record never serves a float32
build.

A record is only as good as the code it timed: each carries a fingerprint of the kernel code its
tiles rendered to (``kernel_fingerprint``), and a record whose code has changed since (a template
edit, or a record without one) is not used; ``build`` warns once and takes the heuristic, as
Triton's autotuning cache is keyed by the kernel's source.  ``refresh`` (``convgen tune --refresh``)
re-times such records against the heuristic instead of searching again.

Under a workspace limit (``convgen tune --workspace-limit``) the space holds only configurations
within it, the search starts from ``build``'s choice under it, and the record is keyed by the
limit too: it serves builds under that limit, and a build without one never takes a winner that
was held back by memory.
"""
from __future__ import annotations

import json
import math
import random
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from codegen import precision, tuning_db
from codegen.spec import ConvSpec, DType, SpecError, uses_tensor_cores
from codegen.tuning_db import TuningDB, is_current, kernel_fingerprint
from codegen.version import __version__

L2_BYTES = 50 << 20
TOLERANCE = 1e-5
SIGNIFICANT = 0.02
"""A candidate replaces the heuristic only when it is at least 2% faster: run-to-run noise of the
median on this card is about 1%, and a tie should keep the configuration users get untuned."""
REFRESH_BUDGET = 300.0
"""Seconds a refresh allows one record's two configurations (compiling both takes a few)."""


@dataclass
class Trial:
    tiles: dict
    seconds: float = math.nan
    status: str = "pending"
    """"ok", "wrong" (failed the reference check), "refused" (a limit), "spills" (ptxas report),
    "compile error" (NVRTC rejected the source: a generator bug, reported after the search)."""
    detail: str = ""


@dataclass
class TuneResult:
    family: str
    spec: ConvSpec
    best: Trial | None
    heuristic: Trial | None
    trials: list[Trial] = field(default_factory=list)
    seconds_spent: float = 0.0
    space_size: int = 0
    workspace_limit: int | None = None

    def top(self, count: int = 10) -> list[Trial]:
        return sorted((t for t in self.trials if t.status == "ok"), key=lambda t: t.seconds)[:count]


# -- search ------------------------------------------------------------------------------------
def neighbours(tiles: dict, space: list[dict]) -> list[dict]:
    """Configurations of ``space`` that differ from ``tiles`` in one parameter, by one step of that
    parameter's sorted values."""
    values = {key: sorted({c[key] for c in space}, key=lambda v: (str(type(v)), v)) for key in tiles}
    members = {json.dumps(c, sort_keys=True) for c in space}
    found = []
    for key, options in values.items():
        if tiles[key] not in options:
            continue
        position = options.index(tiles[key])
        for step in (-1, 1):
            if 0 <= position + step < len(options):
                candidate = {**tiles, key: options[position + step]}
                if json.dumps(candidate, sort_keys=True) in members:
                    found.append(candidate)
    return found


def search(space: list[dict], first: dict, evaluate: Callable[[list[dict]], list[Trial]], max_configs: int,
           deadline: float, seed: int = 0, progress: Callable[[Trial, Trial | None, int], None] | None = None,
           clock: Callable[[], float] = time.monotonic, seeds: list[dict] = ()) -> list[Trial]:
    """Run the strategy of the module docstring; ``evaluate`` compiles and measures a batch;
    ``seeds`` (members of the space) are measured right after ``first``."""
    trials: dict[str, Trial] = {}

    def run(batch: list[dict]) -> None:
        fresh = {json.dumps(c, sort_keys=True): c for c in batch}      # a seed may repeat the heuristic
        batch = [c for key, c in fresh.items() if key not in trials][: max_configs - len(trials)]
        for start in range(0, len(batch), 8):
            if clock() >= deadline:
                return
            for trial in evaluate(batch[start:start + 8]):
                trials[json.dumps(trial.tiles, sort_keys=True)] = trial
                if progress:
                    progress(trial, best(), len(trials))

    def best() -> Trial | None:
        ok = [t for t in trials.values() if t.status == "ok"]
        return min(ok, key=lambda t: t.seconds) if ok else None

    members = {json.dumps(c, sort_keys=True) for c in space}
    run([first] + [c for c in seeds if json.dumps(c, sort_keys=True) in members])
    if len(space) <= max_configs:
        run([c for c in space if c != first])
    else:
        rng = random.Random(seed)
        run(rng.sample(space, min(len(space), max(1, max_configs // 2))))
        while clock() < deadline and len(trials) < max_configs:
            current = best()
            fresh = [n for n in neighbours(current.tiles, space) if json.dumps(n, sort_keys=True) not in trials] \
                if current else []
            if not fresh:
                break
            run(fresh)
            if best() is current:
                break
    return list(trials.values())


# -- GPU measurement ---------------------------------------------------------------------------
def decoded(array, dtype: DType) -> Any:
    """A device array of stored ``dtype`` values (bfloat16 as uint16 bits) as float64."""
    import cupy

    if dtype is DType.bfloat16 and array.dtype == cupy.uint16:
        array = (array.astype(cupy.uint32) << 16).view(cupy.float32)
    return array.astype(cupy.float64)


def reference_output(family: str, spec: ConvSpec, inputs: list, absolute: bool = False) -> Any:
    """An independent reference on the device: PyTorch's float64 convolution when available,
    else the float64 numpy reference (small specs only); of the stored inputs decoded to float64,
    or with ``absolute`` of their magnitudes (what ``error_bound_of`` takes)."""
    import cupy

    from codegen.families import get_family

    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        host = [cupy.asnumpy(a) for a in inputs]
        if absolute:
            host = [np.abs(precision.from_storage(a, spec.dtype)) for a in host]
        return cupy.asarray(get_family(family, spec).reference(spec, *host))
    x, w = (torch.from_dlpack(decoded(a, spec.dtype)) for a in inputs[:2])
    if absolute:
        x, w = x.abs(), w.abs()
    if spec.layout.channels_last:
        x = x[..., : spec.c]
        last = (0, spec.dims + 1, *range(1, spec.dims + 1))
        x, w = x.permute(*last), w.permute(*last)
    conv = F.conv2d if spec.dims == 2 else F.conv3d
    y = conv(x, w, stride=spec.stride, padding=spec.padding, dilation=spec.dilation)
    if spec.layout.channels_last:
        y = y.permute(0, *range(2, 2 + spec.dims), 1)
    return cupy.from_dlpack(y.contiguous())


def error_bound_of(spec: ConvSpec, exact, magnitude, tf32_truncated: bool = False):
    """``precision.error_bound`` from the two convolutions it is made of, computed elsewhere (on the
    device): ``exact`` of the stored inputs and ``magnitude`` of their absolute values, float64,
    numpy or CuPy alike; ``tf32_truncated`` as ``precision.unit_roundoff`` takes it."""
    roundoff = precision.unit_roundoff(spec.dtype, spec.math, tf32_truncated)
    terms = spec.c * math.prod(spec.filter_size)
    accumulated = (roundoff.product + roundoff.accumulation * roundoff.products_per_term * terms) * magnitude
    return accumulated + roundoff.output * (abs(exact) + accumulated) + roundoff.output_absolute


def output_check(family: str, spec: ConvSpec, inputs: list, expected) -> Callable[..., str | None]:
    """The reference check of a candidate's output on ``inputs`` (device arrays, as stored), whose
    reference is ``expected`` (``reference_output``), given the candidate's plan: None where it
    passes, else why not.  FP32 on the FMA pipe: relative error in norm under ``TOLERANCE``;
    tensor cores: every output within ``precision.error_bound`` for that plan (NaN never is)."""
    import cupy

    if not uses_tensor_cores(spec.dtype, spec.math):
        scale = float(cupy.linalg.norm(expected)) or 1.0

        def relative(out, plan=None) -> str | None:
            error = float(cupy.linalg.norm(out - expected)) / scale
            return None if error < TOLERANCE else f"relative error {error:.2e} vs reference"
        return relative
    magnitude = reference_output(family, spec, inputs, absolute=True)
    bounds = {truncated: error_bound_of(spec, expected, magnitude, truncated)
              for truncated in ((False, True) if spec.dtype is DType.float32 else (False,))}
    precision_name = spec.math.value if spec.dtype is DType.float32 else spec.dtype.value

    def bounded(out, plan=None) -> str | None:
        got = decoded(out, spec.dtype)
        unwritten = int(cupy.count_nonzero(cupy.isnan(got)))
        if unwritten:
            return f"{unwritten} output(s) never written (NaN)"
        excess = cupy.abs(got - expected) - bounds[plan is not None and plan.tf32_truncated]
        outside = int(cupy.count_nonzero(excess > 0))
        return None if not outside else (f"{outside} output(s) outside the {precision_name} error bound of the "
                                         f"reference, up to {float(excess.max()):.2e} over")
    return bounded


def compile_candidate(family: str, spec: ConvSpec, tiles: dict, arch: str):
    """One candidate compiled as ``build()`` compiles it (``api.compile_plan``), or its Trial where
    a limit refuses it, ptxas reports spills or a stack frame, or NVRTC rejects the source.  The
    last is a bug in convgen, but one candidate's bug should not cost the search its other
    results: the search goes on and ``format_result`` names the candidate.  Needs no GPU."""
    from codegen.api import compile_plan, plan
    from codegen.compile import CompileError

    try:
        kernel = compile_plan(plan(family, spec, tiles, arch), arch)
    except SpecError as err:
        return Trial(tiles, status="refused", detail=str(err))
    except CompileError as err:
        return Trial(tiles, status="compile error", detail=str(err))
    bad = [f"{name}: {r.spill_stores} B spilled, {r.stack_bytes} B stack"
           for name, r in kernel.compiled.resources.items() if r.spill_stores or r.stack_bytes]
    return Trial(tiles, status="spills", detail="; ".join(bad)) if bad else kernel


def gpu_evaluator(family: str, spec: ConvSpec, repeats: int = 7, workers: int = 8):
    """A batch evaluator: compile in parallel, prune on ptxas's report, check, then time."""
    import cupy

    from codegen.api import array_dtype
    from codegen.bench.timing import median_seconds
    from codegen.compile import resolve_arch
    from codegen.families import get_family
    from codegen.precision import NAN

    fam = get_family(family, spec)
    host_inputs = fam.make_inputs(spec, np.random.default_rng(7))
    input_bytes = sum(a.nbytes for a in host_inputs)
    copies = max(2, min(8, math.ceil(2 * L2_BYTES / max(1, input_bytes))))
    sets = [[cupy.asarray(a) for a in host_inputs] for _ in range(copies)]
    expected = reference_output(family, spec, sets[0])
    check = output_check(family, spec, sets[0], expected)
    out = cupy.empty(expected.shape, dtype=array_dtype(spec.dtype))
    pool = ThreadPoolExecutor(max_workers=workers)
    arch = resolve_arch(None)

    def evaluate(batch: list[dict]) -> list[Trial]:
        trials = []
        for tiles, prepared in zip(batch, pool.map(lambda tiles: compile_candidate(family, spec, tiles, arch), batch)):
            if isinstance(prepared, Trial):
                trials.append(prepared)
                continue
            out.fill(NAN[spec.dtype])
            prepared.launch(sets[0], out)
            wrong = check(out, prepared.plan)
            if wrong:
                trials.append(Trial(tiles, status="wrong", detail=wrong))
                continue
            turn = [0]

            def step():
                turn[0] = (turn[0] + 1) % copies
                prepared.launch(sets[turn[0]], out)

            trials.append(Trial(tiles, seconds=median_seconds(step, repeats, warmup=2), status="ok"))
        return trials

    return evaluate


def tune(family: str, spec: ConvSpec, budget: float = 60.0, max_configs: int = 200, seed: int = 0,
         evaluate=None, db: TuningDB | None = None, record: bool = True, progress: bool = True,
         clock: Callable[[], float] = time.monotonic, only: list[dict] | None = None,
         workspace_limit: int | None = None) -> TuneResult:
    """Tune ``family`` for ``spec``; record the winner in the database (when ``record``).
    ``only``: measure these configurations against the heuristic instead of searching.
    ``workspace_limit``: search only configurations within that many bytes of workspace, from
    the heuristic held to it (``build(..., workspace_limit=)``'s choice), and record the winner
    for builds under the same limit."""
    from codegen.api import check_workspace_limit
    from codegen.device import resolve
    from codegen.families import get_family

    fam = get_family(family, spec)
    check_workspace_limit(workspace_limit)
    here = resolve(None, None)
    heuristic_tiles = fam.heuristic_tiles(spec, here)
    if workspace_limit is not None and fam.plan(spec, heuristic_tiles, here).workspace_bytes > workspace_limit:
        heuristic_tiles = fam.tiles_within(spec, workspace_limit, here)
    first = heuristic_tiles.to_dict()
    space = (fam.tuning_space(spec, workspace_limit) if only is None
             else [first] + [dict(c) for c in only if c != first])
    if not space:
        raise SpecError("family", family, "declares no tuning space")
    started = clock()
    evaluate = evaluate or gpu_evaluator(family, spec)
    bar = ProgressBar(min(max_configs, len(space)), budget) if progress else None
    trials = search(space, first, evaluate, max_configs, started + budget, seed,
                    bar.update if bar else None, clock, fam.tuning_seeds(spec, workspace_limit) if only is None else [])
    if bar:
        bar.close()
    best = choose(trials, first)
    heuristic = next((t for t in trials if t.tiles == first), None)
    result = TuneResult(family, spec, best, heuristic, trials, clock() - started, len(space), workspace_limit)
    if record and best is not None:
        device = tuning_db.current_device()
        if device is not None:
            _record(db or TuningDB(), device, result, tried=len(trials), space=len(space))
    return result


def _record(db: TuningDB, device: tuple[str, str], result: TuneResult, **facts: Any) -> None:
    """Record a result's winner with its time, the heuristic's and the fingerprint of its code."""
    heuristic = result.heuristic
    db.record(result.family, result.spec, device, result.best.tiles, result.workspace_limit,
              ms=result.best.seconds * 1e3,
              heuristic_ms=heuristic.seconds * 1e3 if heuristic and heuristic.status == "ok" else None,
              kernel=kernel_fingerprint(result.family, result.spec, result.best.tiles), **facts)


def refresh(db: TuningDB, evaluate_for: Callable[[str, ConvSpec], Callable] | None = None,
            progress: bool = True) -> list[tuple[dict, TuneResult]]:
    """Re-time every stale record of this GPU and version (its tiles no longer render to the code
    it timed): the recorded tiles against today's heuristic, recording the faster one (by
    ``choose``) with today's fingerprint.  A template edit retires every record it touches; this
    brings them back in a few seconds each where a new search takes its whole budget.  Returns
    (old entry, result) per stale record; records the templates no longer accept keep the
    heuristic."""
    device = tuning_db.current_device()
    refreshed = []
    for entry in list(db.entries().values()):
        if (entry["gpu"], entry["arch"]) != device or entry["version"] != __version__:
            continue
        if is_current(entry):
            continue
        family, spec = entry["family"], ConvSpec.from_dict(entry["spec"])
        evaluate = evaluate_for(family, spec) if evaluate_for else None
        result = tune(family, spec, budget=REFRESH_BUDGET, max_configs=2, evaluate=evaluate, record=False,
                      progress=progress, only=[entry["tiles"]], workspace_limit=entry.get("workspace_limit"))
        if result.best is not None:
            _record(db, device, result, tried=entry.get("tried"), space=entry.get("space"), refreshed=True)
        refreshed.append((entry, result))
    return refreshed


def choose(trials: list[Trial], heuristic_tiles: dict) -> Trial | None:
    """The fastest correct trial, unless it beats the heuristic's by less than ``SIGNIFICANT``."""
    ok = [t for t in trials if t.status == "ok"]
    if not ok:
        return None
    best = min(ok, key=lambda t: t.seconds)
    heuristic = next((t for t in ok if t.tiles == heuristic_tiles), None)
    if heuristic is not None and best.seconds > heuristic.seconds * (1 - SIGNIFICANT):
        return heuristic
    return best


class ProgressBar:
    """One stderr line: configurations tried, budget used, best time so far."""

    def __init__(self, total: int, budget: float):
        self.total, self.budget, self.start = total, budget, time.monotonic()

    def update(self, trial: Trial, best: Trial | None, done: int) -> None:
        width = 24
        filled = int(width * min(1.0, done / max(1, self.total)))
        best_text = f"best {best.seconds * 1e3:.3f} ms" if best else "no valid config yet"
        print(f"\r[{'#' * filled}{'.' * (width - filled)}] {done}/{self.total} configs, "
              f"{time.monotonic() - self.start:4.0f}/{self.budget:.0f} s, {best_text}   ",
              end="", file=sys.stderr, flush=True)

    def close(self) -> None:
        print(file=sys.stderr, flush=True)


def format_result(result: TuneResult, count: int = 10) -> str:
    from codegen.families.base import format_bytes

    held = "" if result.workspace_limit is None else f", workspace held to {format_bytes(result.workspace_limit)}"
    lines = [f"tuned {result.family} for {result.spec.describe()}{held}",
             f"space {result.space_size} configurations, tried {len(result.trials)} in {result.seconds_spent:.1f} s: "
             + ", ".join(f"{n} {s}" for s, n in _counts(result.trials).items())]
    if result.heuristic is not None and result.heuristic.status == "ok" and result.best is not None:
        lines.append(f"heuristic {result.heuristic.seconds * 1e3:.3f} ms -> tuned {result.best.seconds * 1e3:.3f} ms "
                     f"({result.heuristic.seconds / result.best.seconds:.2f}x)")
    lines.append(f"{'rank':>4} {'ms':>9}  tiles")
    for rank, trial in enumerate(result.top(count), 1):
        lines.append(f"{rank:>4} {trial.seconds * 1e3:9.3f}  " + " ".join(f"{k}={v}" for k, v in trial.tiles.items()))
    return "\n".join(lines + compile_errors(result))


def compile_errors(result: TuneResult) -> list[str]:
    """The candidates NVRTC rejected, each with the first error line of its log, as a bug report."""
    failed = [t for t in result.trials if t.status == "compile error"]
    if not failed:
        return []
    lines = [f"{len(failed)} candidate(s) did not compile; this is a bug in convgen {__version__}, please report "
             f"it with these lines:"]
    for trial in failed:
        log = trial.detail.strip().splitlines() or [""]   # the first line names the file, the rest is ptxas's
        first_error = next((line.strip() for line in log[1:] if "error" in line), log[0])
        lines += ["  " + " ".join(f"{k}={v}" for k, v in trial.tiles.items()), f"    {first_error}"]
    return lines


def _counts(trials: list[Trial]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for trial in trials:
        counts[trial.status] = counts.get(trial.status, 0) + 1
    return counts
