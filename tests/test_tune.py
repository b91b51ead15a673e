"""The tuner without a GPU: the search space and its limits, the database (round trip, keying,
atomic writes, corrupt files) and the search strategy with a fake timer."""
import dataclasses
import json
import os
import warnings

import pytest

from codegen import tune, tuning_db
from codegen.api import plan
from codegen.families import gemm_heuristic, get_family
from codegen.families.gemm_tiles import check_geometry, register_estimate, shared_bytes
from codegen.spec import ConvSpec
from codegen.tiles import DYNAMIC_SHARED_LIMIT

SPEC = ConvSpec(dims=2, layout="NHWC", n=4, c=16, k=48, input_size=(14, 14), filter_size=(3, 3), padding=1)
DEVICE = ("NVIDIA H100 80GB HBM3", "sm_90")


def pretend_device(monkeypatch, device: tuple[str, str]) -> None:
    """This machine has ``device`` (name, arch), an H100 in all else, for the database and the chooser."""
    import dataclasses

    from codegen import device as devices

    monkeypatch.setattr(tuning_db, "current_device", lambda: device)
    monkeypatch.setattr(devices, "present", lambda: dataclasses.replace(devices.REFERENCE, name=device[0], arch=device[1]))


@pytest.mark.parametrize("family", ["implicit_gemm", "im2win"])
def test_space_respects_every_declared_limit(family):
    space = get_family(family).tuning_space(SPEC)
    assert len(space) > 100
    for tiles in space:
        t = get_family(family).tiles_type(**tiles)
        check_geometry(t)
        assert t.threads <= 1024 and shared_bytes(t) <= DYNAMIC_SHARED_LIMIT and register_estimate(t) <= 255
        assert (t.warp_m // t.thread_m) * (t.warp_n // t.thread_n) == 32
        assert t.block_n <= 64                           # no wider than the 48 channels need
    for tiles in space[:: max(1, len(space) // 25)]:     # and a sample plans completely
        plan(family, SPEC, tiles)


def test_database_round_trip_and_keying(tmp_path):
    db = tune.TuningDB(tmp_path / "tuning.json")
    tiles = {"block_m": 64, "block_n": 64}
    db.record("implicit_gemm", SPEC, DEVICE, tiles, ms=1.5, kernel=tune.kernel_fingerprint("implicit_gemm", SPEC, tiles))
    fresh = tune.TuningDB(tmp_path / "tuning.json")
    assert fresh.lookup("implicit_gemm", SPEC, DEVICE) == tiles
    assert fresh.lookup("implicit_gemm", SPEC, ("NVIDIA A100-SXM4-80GB", "sm_80")) is None
    assert fresh.lookup("implicit_gemm", SPEC, ("NVIDIA H200", "sm_90")) is None
    assert fresh.lookup("im2win", SPEC, DEVICE) is None
    other = ConvSpec(dims=2, layout="NHWC", n=4, c=16, k=48, input_size=(14, 14), filter_size=(3, 3), padding=0)
    assert fresh.lookup("implicit_gemm", other, DEVICE) is None
    key = tuning_db.entry_key("implicit_gemm", SPEC, DEVICE)
    assert key in fresh.entries() and tuning_db.entry_key("implicit_gemm", SPEC, DEVICE, "0.0.1") != key


def test_database_export_and_import(tmp_path):
    first = tune.TuningDB(tmp_path / "a.json")
    first.record("im2win", SPEC, DEVICE, {"stages": 2}, kernel=tune.kernel_fingerprint("im2win", SPEC, {"stages": 2}))
    assert first.export(tmp_path / "moved.json") == 1
    second = tune.TuningDB(tmp_path / "b.json")
    assert second.import_(tmp_path / "moved.json") == 1
    assert second.lookup("im2win", SPEC, DEVICE) == {"stages": 2}
    (tmp_path / "junk.json").write_text("{\"entries\": 3}")
    with pytest.raises(tune.SpecError, match="--import"):
        second.import_(tmp_path / "junk.json")


def test_database_writes_are_atomic(tmp_path, monkeypatch):
    db = tune.TuningDB(tmp_path / "tuning.json")
    db.record("implicit_gemm", SPEC, DEVICE, {"stages": 3})
    before = (tmp_path / "tuning.json").read_text()

    def broken_dump(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(tuning_db.json, "dump", broken_dump)
    with pytest.raises(OSError):
        db.record("implicit_gemm", SPEC, DEVICE, {"stages": 4})
    assert (tmp_path / "tuning.json").read_text() == before
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".tuning-")]


def test_corrupt_database_is_reported_never_breaks_a_build_and_is_set_aside_by_the_next_record(tmp_path, monkeypatch):
    """A read (a build, ``tune --show``) never moves a file: the database may be a path the user
    named; the first record moves the unreadable file aside rather than over it."""
    path = tmp_path / "tuning.json"
    path.write_text("{ not json")
    monkeypatch.setenv("CONVGEN_TUNING_DB", str(path))
    pretend_device(monkeypatch, DEVICE)
    with pytest.warns(UserWarning, match="unreadable"):
        kernel_plan = plan("implicit_gemm", SPEC)
    assert kernel_plan.tiles == get_family("implicit_gemm").default_tiles(SPEC)
    assert path.read_text() == "{ not json" and len(list(tmp_path.iterdir())) == 1
    db = tune.TuningDB()
    with pytest.warns(UserWarning):
        db.record("implicit_gemm", SPEC, DEVICE, {"stages": 4})
    aside = [p for p in tmp_path.iterdir() if p.name.startswith("tuning.json.corrupt-")]
    assert len(aside) == 1 and aside[0].read_text() == "{ not json" and "stages" in path.read_text()


def test_build_uses_the_tuned_configuration(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_TUNING_DB", str(tmp_path / "tuning.json"))
    pretend_device(monkeypatch, DEVICE)
    tuned = dict(get_family("implicit_gemm").default_tiles(SPEC).to_dict(), stages=2, precomp=False)
    tune.TuningDB().record("implicit_gemm", SPEC, DEVICE, tuned,
                           kernel=tune.kernel_fingerprint("implicit_gemm", SPEC, tuned))
    assert plan("implicit_gemm", SPEC).tiles.to_dict() == tuned
    pretend_device(monkeypatch, ("another GPU", "sm_90"))
    assert plan("implicit_gemm", SPEC).tiles == get_family("implicit_gemm").default_tiles(SPEC)


@pytest.mark.parametrize("kernel", ["0123456789abcdef", None])
def test_a_record_that_timed_other_kernel_code_is_not_used(tmp_path, monkeypatch, kernel):
    """A template edit since the record (another fingerprint), or a record without one: the
    heuristic is used and the user is told once."""
    monkeypatch.setenv("CONVGEN_TUNING_DB", str(tmp_path / "tuning.json"))
    pretend_device(monkeypatch, DEVICE)
    monkeypatch.setattr(tuning_db, "_WARNED_STALE", set())
    tuned = dict(get_family("implicit_gemm").default_tiles(SPEC).to_dict(), stages=2, precomp=False)
    tune.TuningDB().record("implicit_gemm", SPEC, DEVICE, tuned, **({"kernel": kernel} if kernel else {}))
    with pytest.warns(UserWarning, match="timed other kernel code"):
        assert plan("implicit_gemm", SPEC).tiles == get_family("implicit_gemm").default_tiles(SPEC)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plan("implicit_gemm", SPEC).tiles == get_family("implicit_gemm").default_tiles(SPEC)


def test_kernel_fingerprint_ignores_comments_and_name_tags_and_sees_code(monkeypatch):
    from codegen import render

    tiles = get_family("implicit_gemm").default_tiles(SPEC).to_dict()
    original = tune.kernel_fingerprint("implicit_gemm", SPEC, tiles)
    assert original != tune.kernel_fingerprint("implicit_gemm", SPEC, dict(tiles, stages=2))
    real = render.render_kernels

    def edited(change):
        def render_kernels(plan):
            source = real(plan)
            return dataclasses.replace(source, code=change(source.code))
        return render_kernels

    monkeypatch.setattr(render, "render_kernels", edited(lambda code: "// reworded\n\n" + code.replace("//", "// now ")))
    tuning_db._fingerprint.cache_clear()
    assert tune.kernel_fingerprint("implicit_gemm", SPEC, tiles) == original
    name = get_family("implicit_gemm").plan(SPEC, get_family("implicit_gemm").complete_tiles(SPEC, tiles)).launches[0].kernel
    renamed = name[:-10] + "0123456789"     # another tag, as a new tile field at its default gives
    monkeypatch.setattr(render, "render_kernels", edited(lambda code: code.replace(name, renamed)))
    tuning_db._fingerprint.cache_clear()
    assert tune.kernel_fingerprint("implicit_gemm", SPEC, tiles) == original
    monkeypatch.setattr(render, "render_kernels", edited(lambda code: code.replace("fmaf(", "__fmaf_rn(", 1)))
    tuning_db._fingerprint.cache_clear()
    assert tune.kernel_fingerprint("implicit_gemm", SPEC, tiles) != original
    tuning_db._fingerprint.cache_clear()


def _fake_space(size):
    return [{"a": a, "b": b} for a in range(size) for b in range(size)]


def _fake_evaluator(wrong=None):
    """Time (a-7)^2 + (b-3)^2 + 1 ms; ``wrong`` is faster than anything but fails its check."""
    def evaluate(batch):
        trials = []
        for tiles in batch:
            if tiles == wrong:
                trials.append(tune.Trial(tiles, seconds=1e-9, status="wrong"))
            else:
                trials.append(tune.Trial(tiles, seconds=((tiles["a"] - 7) ** 2 + (tiles["b"] - 3) ** 2 + 1) * 1e-3,
                                         status="ok"))
        return trials
    return evaluate


def test_search_exhaustive_when_the_space_fits():
    space = _fake_space(5)
    trials = tune.search(space, {"a": 0, "b": 0}, _fake_evaluator(), 100, float("inf"))
    assert len(trials) == 25 and trials[0].tiles == {"a": 0, "b": 0}
    assert min((t for t in trials if t.status == "ok"), key=lambda t: t.seconds).tiles == {"a": 4, "b": 3}


def test_search_samples_then_refines_and_never_picks_a_wrong_candidate():
    space = _fake_space(12)
    wrong = {"a": 6, "b": 3}
    trials = tune.search(space, {"a": 0, "b": 0}, _fake_evaluator(wrong), 40, float("inf"), seed=1)
    assert len(trials) <= 40
    ok = [t for t in trials if t.status == "ok"]
    best = min(ok, key=lambda t: t.seconds)
    assert best.tiles == {"a": 7, "b": 3}                 # refinement reaches the optimum from the sample
    assert all(t.tiles != wrong for t in ok)


def test_search_stops_at_the_deadline():
    ticks = iter(range(1000))
    trials = tune.search(_fake_space(12), {"a": 0, "b": 0}, _fake_evaluator(), 100, 3, clock=lambda: next(ticks))
    assert 1 <= len(trials) <= 8 * 3


def test_seeds_are_measured_right_after_the_heuristic_and_outside_members_are_dropped():
    seeds = [{"a": 9, "b": 9}, {"a": 99, "b": 0}, {"a": 0, "b": 0}, {"a": 11, "b": 11}, {"a": 9, "b": 9}]
    timed = []

    def evaluate(batch):
        timed.extend(batch)
        return _fake_evaluator()(batch)

    trials = tune.search(_fake_space(12), {"a": 0, "b": 0}, evaluate, 40, float("inf"), seed=1, seeds=seeds)
    assert [t.tiles for t in trials[:3]] == [{"a": 0, "b": 0}, {"a": 9, "b": 9}, {"a": 11, "b": 11}]
    assert all(t.tiles != {"a": 99, "b": 0} for t in trials)
    assert len(timed) == len(trials)                   # a seed that repeats the heuristic is timed once


@pytest.mark.parametrize("family", ["implicit_gemm", "im2win"])
@pytest.mark.parametrize("layer, inside", [("conv8", 8), ("c3d_conv3", 8), ("conv4", 4)])
def test_gemm_seeds_are_wide_micro_tiles_inside_the_space(family, layer, inside):
    """conv4 has 64 output channels: the 128-wide seeds lie outside its space (search drops them).
    The implicit GEMM also seeds its TMA kernel's heuristic tiles (A gathered on these
    channels-first layers), which lie in its space."""
    from codegen.bench.layers import layer_spec, load_shapes

    shape = next(l for group in load_shapes().values() if isinstance(group, list) for l in group
                 if isinstance(l, dict) and l.get("name") == layer)
    spec = layer_spec(shape, "NCDHW" if "D" in shape else "NCHW", shape["N"])
    fam = get_family(family)
    members = {json.dumps(c, sort_keys=True) for c in fam.tuning_space(spec)}
    seeds = [c for c in fam.tuning_seeds(spec) if not c.get("tma")]
    tma_seeds = [c for c in fam.tuning_seeds(spec) if c.get("tma")]
    assert len(tma_seeds) == (family == "implicit_gemm")
    assert all(json.dumps(c, sort_keys=True) in members for c in tma_seeds)
    assert len(seeds) == 8 and sum(json.dumps(c, sort_keys=True) in members for c in seeds) == inside
    assert {(c["thread_m"], c["thread_n"]) for c in seeds} == {(16, 8), (8, 16)}
    assert all(get_family(family).tiles_type.from_dict(c).threads == 128 for c in seeds)


def test_channels_last_space_holds_both_tma_micro_tiles_and_the_tma_seed():
    """The tuner can reach the 8x8 and the 16x8 TMA kernels (with the 512-pixel, two-box tiles),
    and the TMA heuristic it seeds with lies in the space."""
    from codegen.bench.layers import layer_spec, load_shapes

    shape = next(l for l in load_shapes()["conv2d_mec"] if l["name"] == "conv8")
    spec = layer_spec(shape, "NHWC", shape["N"])
    fam = get_family("implicit_gemm")
    tma = [c for c in fam.tuning_space(spec) if c["tma"]]
    assert {c["thread_m"] for c in tma} == {8, 16} and any(c["block_m"] == 512 for c in tma)
    members = {json.dumps(c, sort_keys=True) for c in tma}
    assert json.dumps(gemm_heuristic.tma_tiles(spec).to_dict(), sort_keys=True) in members


def test_the_tuner_compiles_a_register_split_candidate_for_sm_90a_as_build_does():
    """A TMA candidate whose producer hands its registers over (``setmaxnreg``, an sm_90a
    instruction) is compiled for sm_90a: the tuner once compiled candidates for plain sm_90 by its
    own path, and ptxas refused them, ending the whole tuning run (r50_l2_3x3 on the H100)."""
    from codegen.bench.layers import layer_spec, load_shapes
    from codegen.families.gemm_tiles import tma_register_split

    shape = next(l for l in load_shapes()["conv2d_mec"] if l["name"] == "conv8")
    spec = layer_spec(shape, "NHWC", shape["N"])
    tiles = gemm_heuristic.tma_tiles(spec)
    assert tma_register_split(tiles) is not None
    kernel = tune.compile_candidate("implicit_gemm", spec, tiles.to_dict(), "sm_90")
    assert not isinstance(kernel, tune.Trial), kernel.detail
    assert kernel.compiled.arch == "sm_90a" and "setmaxnreg" in kernel.source.code


def test_a_candidate_the_compiler_rejects_is_reported_and_the_search_goes_on(monkeypatch):
    """An NVRTC error is a generator bug: the candidate becomes a 'compile error' trial whose
    first error line and tiles close the result as a bug report, instead of ending the search."""
    from codegen import api
    from codegen.compile import CompileError

    def rejected(source, name, arch):
        raise CompileError("NVRTC failed on implicit_gemm.cu (NVRTC_ERROR_COMPILATION (6)):\nptxas application ptx "
                           "input, line 275; error   : Instruction 'setmaxnreg.dec' not supported on .target 'sm_90'\n"
                           "ptxas fatal   : Ptx assembly aborted due to errors\n")

    monkeypatch.setattr(api, "compile_source", rejected)
    tiles = get_family("implicit_gemm").default_tiles(SPEC).to_dict()
    trial = tune.compile_candidate("implicit_gemm", SPEC, tiles, "sm_90")
    assert isinstance(trial, tune.Trial) and trial.status == "compile error"
    ok = tune.Trial(dict(tiles, stages=2), seconds=1e-3, status="ok")
    result = tune.TuneResult("implicit_gemm", SPEC, best=ok, heuristic=ok, trials=[ok, trial], space_size=2)
    lines = tune.format_result(result).splitlines()
    assert "1 ok, 1 compile error" in lines[1]
    assert lines[-3].startswith("1 candidate(s) did not compile; this is a bug in convgen")
    assert lines[-2].strip().startswith("block_m=") and lines[-1].strip() == (
        "ptxas application ptx input, line 275; error   : Instruction 'setmaxnreg.dec' not supported on .target "
        "'sm_90'")


@pytest.mark.parametrize("family", ["implicit_gemm", "im2win"])
def test_channels_last_heuristic_copies_one_float_and_the_tuner_tries_both(family):
    """The heuristic copies one float a thread on channels-last data too (16 adjacent lanes read a
    pixel's 64 contiguous bytes; four floats a thread ran 0.69-0.93x, GEMM v22), and the tuner,
    which once searched only the four-float loader there, now reaches both; channels-first A
    offers only the one."""
    fam = get_family(family)
    assert fam.default_tiles(SPEC).vector_load is False
    assert all(c["vector_load"] is False for c in fam.tuning_seeds(SPEC) if not c.get("tma"))
    space = [c for c in fam.tuning_space(SPEC) if not c.get("tma")]
    assert {c["vector_load"] for c in space} == {False, True}
    channels_first = dataclasses.replace(SPEC, layout="NCHW")
    assert {c["vector_load"] for c in fam.tuning_space(channels_first) if not c.get("tma")} == {False}


def test_neighbours_change_one_parameter_by_one_step():
    space = _fake_space(4)
    assert sorted(map(json.dumps, tune.neighbours({"a": 1, "b": 0}, space))) == sorted(
        map(json.dumps, [{"a": 0, "b": 0}, {"a": 2, "b": 0}, {"a": 1, "b": 1}]))


def test_a_win_within_noise_keeps_the_heuristic():
    heuristic = {"a": 0, "b": 0}
    trials = [tune.Trial(heuristic, 1.000, "ok"), tune.Trial({"a": 1, "b": 0}, 0.990, "ok"),
              tune.Trial({"a": 2, "b": 0}, 0.5, "wrong")]
    assert tune.choose(trials, heuristic).tiles == heuristic
    trials.append(tune.Trial({"a": 3, "b": 0}, 0.97, "ok"))
    assert tune.choose(trials, heuristic).tiles == {"a": 3, "b": 0}


def test_refresh_re_times_only_stale_records_and_keeps_the_faster(tmp_path, monkeypatch):
    """A stale record is timed again against the heuristic and re-recorded with today's
    fingerprint (its tiles when they still win, the heuristic when they do not); a current record
    and another GPU's are left alone."""
    pretend_device(monkeypatch, DEVICE)
    db = tune.TuningDB(tmp_path / "tuning.json")
    heuristic = get_family("implicit_gemm").default_tiles(SPEC).to_dict()
    winner = dict(heuristic, stages=2, precomp=False)
    loser = dict(heuristic, stages=4)
    other = ConvSpec.from_dict({**SPEC.to_dict(), "k": 32})
    current = ConvSpec.from_dict({**SPEC.to_dict(), "k": 16})
    db.record("implicit_gemm", SPEC, DEVICE, winner, ms=1.0, kernel="stale", tried=40, space=900)
    db.record("implicit_gemm", other, DEVICE, loser, ms=1.0, kernel="stale")
    db.record("implicit_gemm", current, DEVICE, heuristic, ms=1.0,
              kernel=tune.kernel_fingerprint("implicit_gemm", current, heuristic))
    db.record("implicit_gemm", SPEC, ("another GPU", "sm_80"), winner, ms=1.0, kernel="stale")
    timed = []

    def evaluate_for(family, spec):
        default = get_family(family).default_tiles(spec).to_dict()

        def evaluate(batch):
            timed.extend((spec.k, t) for t in batch)
            return [tune.Trial(t, seconds=0.5e-3 if t == winner else 1e-3 if t == default else 2e-3, status="ok")
                    for t in batch]
        return evaluate

    refreshed = tune.refresh(db, evaluate_for, progress=False)
    assert sorted(old["spec"]["k"] for old, _ in refreshed) == [32, 48]
    assert sorted(k for k, _ in timed) == [32, 32, 48, 48]
    fresh = db.entries()
    assert db.lookup("implicit_gemm", SPEC, DEVICE) == winner
    assert db.lookup("implicit_gemm", other, DEVICE) == get_family("implicit_gemm").default_tiles(other).to_dict()
    kept = fresh[tuning_db.entry_key("implicit_gemm", SPEC, DEVICE)]
    assert kept["ms"] == 0.5 and kept["heuristic_ms"] == 1.0 and (kept["tried"], kept["space"]) == (40, 900)
    assert fresh[tuning_db.entry_key("implicit_gemm", SPEC, ("another GPU", "sm_80"))]["kernel"] == "stale"
    assert tune.refresh(db, evaluate_for, progress=False) == []


# -- tuning under a workspace limit ------------------------------------------------------------
def _layer(name: str, layout: str) -> ConvSpec:
    from codegen.bench.layers import layer_spec, load_shapes, select_layers

    found = select_layers(load_shapes()["conv2d_mec"] + load_shapes()["conv3d"], [name])[0]
    return layer_spec(found, layout, found["N"])


def _sample(space: list[dict], count: int = 12) -> list[dict]:
    return space[:: max(1, len(space) // count)] + space[-1:]


def test_the_space_under_a_limit_holds_only_configurations_within_it():
    """Each family's space under a limit: every member (a sample, planned) fits, and what the
    limit takes out is what needs the workspace: the TMA kernel (its transposed filter) and
    larger batch chunks."""
    gemm_spec = _layer("conv8", "NHWC")
    free = get_family("implicit_gemm").tuning_space(gemm_spec)
    held = get_family("implicit_gemm").tuning_space(gemm_spec, 0)
    assert any(t["tma"] for t in free) and not any(t["tma"] for t in held)
    assert held == [t for t in free if not t["tma"]]
    assert not any(t["tma"] for t in get_family("implicit_gemm").tuning_seeds(gemm_spec, 0))
    transposed = plan("implicit_gemm", gemm_spec, next(t for t in free if t["tma"])).workspace_bytes
    assert any(t["tma"] for t in get_family("implicit_gemm").tuning_space(gemm_spec, transposed))

    window_spec = _layer("conv9", "NHWC")
    limit = 150 << 20
    for family in ("im2win", "im2col_gemm"):
        space = get_family(family).tuning_space(window_spec, limit)
        assert space and all(plan(family, window_spec, t).workspace_bytes <= limit for t in _sample(space))
        assert max(t["batch_chunk"] for t in space) < max(t["batch_chunk"] for t in
                                                          get_family(family).tuning_space(window_spec))
    with pytest.raises(tune.SpecError, match="needs at least"):
        get_family("im2win").tuning_space(window_spec, 1 << 20)
    with pytest.raises(tune.SpecError, match="needs at least"):
        get_family("im2col_gemm").tuning_space(window_spec, 1 << 20)


def test_tuning_under_a_limit_tries_only_what_fits_and_records_for_that_limit(tmp_path, monkeypatch):
    """The search starts from build()'s choice under the limit, never times a configuration over
    it, and its record serves builds under the same limit only; a build without a limit keeps
    the heuristic."""
    monkeypatch.setenv("CONVGEN_TUNING_DB", str(tmp_path / "tuning.json"))
    pretend_device(monkeypatch, DEVICE)
    spec = _layer("conv9", "NHWC")
    limit = 150 << 20
    tried = []

    def evaluate(batch):
        tried.extend(batch)
        return [tune.Trial(t, seconds=1e-3 / (1 + t["stages"] + t["block_k"] / 8), status="ok") for t in batch]

    untuned = plan("im2win", spec, workspace_limit=limit).tiles.to_dict()
    result = tune.tune("im2win", spec, budget=60, max_configs=10, evaluate=evaluate, progress=False,
                       workspace_limit=limit)
    assert tried[0] == untuned and untuned["batch_chunk"] < plan("im2win", spec).tiles.batch_chunk
    assert len(tried) == 10 and all(plan("im2win", spec, t).workspace_bytes <= limit for t in tried)
    db = tune.TuningDB()
    assert db.lookup("im2win", spec, DEVICE, limit) == result.best.tiles != tried[0]
    assert db.lookup("im2win", spec, DEVICE) is None
    assert plan("im2win", spec, workspace_limit=limit).tiles.to_dict() == result.best.tiles
    assert plan("im2win", spec).tiles == get_family("im2win").default_tiles(spec)
    assert "workspace held to 150 MiB" in tune.format_result(result)


def test_a_build_under_a_limit_takes_its_record_then_the_unlimited_one_where_it_fits(tmp_path, monkeypatch):
    monkeypatch.setenv("CONVGEN_TUNING_DB", str(tmp_path / "tuning.json"))
    pretend_device(monkeypatch, DEVICE)
    spec = _layer("conv9", "NHWC")
    heuristic = get_family("im2win").default_tiles(spec).to_dict()
    unlimited = dict(heuristic, stages=2)
    small = dict(get_family("im2win").tiles_within(spec, 100 << 20).to_dict(), stages=4)
    db = tune.TuningDB()
    db.record("im2win", spec, DEVICE, unlimited, kernel=tune.kernel_fingerprint("im2win", spec, unlimited))
    db.record("im2win", spec, DEVICE, small, 100 << 20, kernel=tune.kernel_fingerprint("im2win", spec, small))
    need = plan("im2win", spec, unlimited).workspace_bytes
    assert plan("im2win", spec).tiles.to_dict() == unlimited
    assert plan("im2win", spec, workspace_limit=100 << 20).tiles.to_dict() == small
    assert plan("im2win", spec, workspace_limit=need).tiles.to_dict() == unlimited     # another limit, fits
    assert plan("im2win", spec, workspace_limit=need - 1).tiles == get_family("im2win").tiles_within(spec, need - 1)


def test_refresh_re_times_a_limited_record_against_the_heuristic_under_its_limit(tmp_path, monkeypatch):
    pretend_device(monkeypatch, DEVICE)
    db = tune.TuningDB(tmp_path / "tuning.json")
    spec = _layer("conv9", "NHWC")
    limit = 100 << 20
    recorded = dict(get_family("im2win").tiles_within(spec, limit).to_dict(), stages=4)
    db.record("im2win", spec, DEVICE, recorded, limit, ms=1.0, kernel="stale")
    timed = []

    def evaluate_for(family, spec):
        def evaluate(batch):
            timed.extend(batch)
            return [tune.Trial(t, seconds=1e-3, status="ok") for t in batch]
        return evaluate

    tune.refresh(db, evaluate_for, progress=False)
    assert timed == [get_family("im2win").tiles_within(spec, limit).to_dict(), recorded]
    entry = db.entries()[tuning_db.entry_key("im2win", spec, DEVICE, workspace_limit=limit)]
    assert entry["workspace_limit"] == limit and tune.is_current(entry)


def test_under_a_limit_im2win_also_tries_the_full_chunk_heuristic_at_the_smaller_chunk():
    """The heuristic's tiles for its own chunk, shrunk to the limit's, are a member of the space
    and the first seed (they beat the re-derived heuristic on 6 of 10 layers on the H100)."""
    spec = _layer("conv4", "NCHW")
    family = get_family("im2win")
    full = family.default_tiles(spec)
    limit = plan("im2win", spec).workspace_bytes // 4
    chunk = family.tiles_within(spec, limit).batch_chunk
    shrunk = dict(full.to_dict(), batch_chunk=chunk)
    assert chunk < full.batch_chunk and shrunk != family.tiles_within(spec, limit).to_dict()
    assert family.tuning_seeds(spec, limit)[0] == shrunk and shrunk in family.tuning_space(spec, limit)
    assert plan("im2win", spec, shrunk).workspace_bytes <= limit
    from codegen.families import gemm_tuning
    from codegen.spec import replace

    core_seeds = gemm_tuning.tuning_seeds(replace(spec, n=full.batch_chunk))
    assert family.tuning_seeds(spec) == [dict(t, batch_chunk=full.batch_chunk) for t in core_seeds]  # no limit


BF16 = ConvSpec(dims=2, layout="NHWC", n=2, c=64, k=64, input_size=(14, 14), filter_size=3, padding=1, dtype="bf16")


@pytest.mark.parametrize("spec", [BF16, dataclasses.replace(SPEC, math="3xtf32"),
                                  ConvSpec(dims=3, layout="NCDHW", n=1, c=5, k=40, input_size=(4, 6, 6),
                                           filter_size=3, dtype="float16"),
                                  dataclasses.replace(SPEC, layout="NCHW", dpitch=None, math="tf32")],
                         ids=["bf16-nhwc", "3xtf32-nhwc", "fp16-ncdhw", "tf32-nchw"])
def test_tensor_core_space_holds_only_tiles_the_spec_and_target_take(spec):
    """Every member passes the tile checks ``plan`` makes (geometry, the MMA's k, 16-bit warp_n,
    3xTF32's accumulators, element copies, shared memory on this target): a sample plans in full;
    the heuristic and the seeds are members. WGMMA stages count 128-byte slices: 3xtf32's C 16 takes
    64-byte ones, twice as many stages."""
    from codegen.device import as_device, present
    from codegen.families.mma_gemm import MmaTiles, check_tiles

    family = get_family("implicit_gemm", spec)
    space = family.tuning_space(spec)
    assert len(space) > 20 and family.tiles_type is MmaTiles
    assert len({json.dumps(t, sort_keys=True) for t in space}) == len(space)
    for tiles in space:
        t = MmaTiles(**tiles)
        check_tiles(spec, t, as_device(present()))
        wgmma_stages = tuple(s * 128 // (t.block_k * spec.dtype.itemsize) for s in (2, 3, 4, 5))  # in 128-byte slices
        assert 32 <= t.block_m <= 256 and t.stages in (wgmma_stages if t.wgmma else (2, 3, 4))
    for tiles in space[:: max(1, len(space) // 6)]:
        plan("implicit_gemm", spec, tiles)
    assert family.heuristic_tiles(spec).to_dict() in space
    assert all(seed in space for seed in family.tuning_seeds(spec))


def test_the_bf16_space_is_wide_and_seeded_with_cutlass_shapes():
    space = get_family("implicit_gemm", BF16).tuning_space(BF16)
    assert {t["block_n"] for t in space} == {32, 64}                 # no wider than the 64 channels
    assert {t["block_m"] for t in space} == {32, 64, 128, 256}
    assert {t["block_k"] for t in space} == {16, 32, 64} and {t["stages"] for t in space} == {2, 3, 4, 5}
    assert {t["stages"] for t in space if not t.get("wgmma")} == {2, 3, 4}
    assert any(t.get("pingpong") for t in space)
    assert all(t["warp_n"] % 16 == 0 for t in space)
    seeds = get_family("implicit_gemm", BF16).tuning_seeds(BF16)
    assert dict(block_m=128, block_n=64, block_k=32, warp_m=64, warp_n=32, stages=4) in seeds


def test_a_bfloat16_record_serves_bfloat16_builds_only(tmp_path, monkeypatch):
    """A record is keyed by the spec, dtype and math included: tuning the bfloat16 spec records
    MmaTiles for it, which its builds take, while the float32 build of the same shape (and its
    tf32 build) keep their heuristics, and a float32 record does not serve the bfloat16 build."""
    monkeypatch.setenv("CONVGEN_TUNING_DB", str(tmp_path / "tuning.json"))
    pretend_device(monkeypatch, DEVICE)
    fp32, tf32 = dataclasses.replace(BF16, dtype="float32"), dataclasses.replace(BF16, dtype="float32", math="tf32")
    tried = []

    def evaluate(batch):
        """Deep slices and many stages time fastest, mma.sync's ahead of the heuristic's WGMMA tiles (sm_90)."""
        tried.extend(batch)
        return [tune.Trial(t, seconds=1e-3 / (t["block_k"] * t["stages"]) * (2 if t.get("wgmma") else 1), status="ok")
                for t in batch]

    result = tune.tune("implicit_gemm", BF16, budget=60, max_configs=6, evaluate=evaluate, progress=False)
    heuristic = get_family("implicit_gemm", BF16).heuristic_tiles(BF16).to_dict()
    assert tried[0] == heuristic and result.best.tiles != heuristic and "thread_m" not in result.best.tiles
    db = tune.TuningDB()
    assert db.lookup("implicit_gemm", BF16, DEVICE) == result.best.tiles
    assert db.lookup("implicit_gemm", fp32, DEVICE) is None and db.lookup("implicit_gemm", tf32, DEVICE) is None
    assert plan("implicit_gemm", BF16).tiles.to_dict() == result.best.tiles
    assert plan("implicit_gemm", fp32).tiles == get_family("implicit_gemm").heuristic_tiles(fp32)
    assert plan("implicit_gemm", tf32).tiles == get_family("implicit_gemm", tf32).heuristic_tiles(tf32)
    fma = dict(get_family("implicit_gemm").default_tiles(fp32).to_dict(), stages=2)
    db.record("implicit_gemm", fp32, DEVICE, fma, kernel=tune.kernel_fingerprint("implicit_gemm", fp32, fma))
    assert plan("implicit_gemm", fp32).tiles.to_dict() == fma
    assert plan("implicit_gemm", BF16).tiles.to_dict() == result.best.tiles
    assert "bfloat16" in tune.format_result(result).splitlines()[0]


@pytest.mark.parametrize("changes", [{"dtype": "bfloat16"}, {"dtype": "float16"}, {"math": "tf32"},
                                     {"math": "3xtf32"}])
def test_the_tuners_bound_is_the_precision_modules(changes):
    """The tuner builds ``precision.error_bound`` on the device from two convolutions; on numpy
    arrays the same formula gives the same bound."""
    import numpy as np

    from codegen import precision
    from codegen.families.direct import convolution_reference

    spec = dataclasses.replace(SPEC, dpitch=None, **changes)
    x, w = get_family("implicit_gemm", spec).make_inputs(spec, np.random.default_rng(1))
    x64, w64 = precision.from_storage(x, spec.dtype), precision.from_storage(w, spec.dtype)
    ours = tune.error_bound_of(spec, convolution_reference(spec, x64, w64),
                               convolution_reference(spec, np.abs(x64), np.abs(w64)))
    np.testing.assert_allclose(ours, precision.error_bound(spec, x, w), rtol=1e-12, atol=0)
