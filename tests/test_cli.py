"""The convgen command line, as a user types it."""
import json
import subprocess
import sys

import numpy as np
import pytest

from codegen.cli import main
from codegen.spec import ConvSpec


def run(*args, env=None):
    return subprocess.run([sys.executable, "-m", "codegen", *args], capture_output=True, text=True, env=env)


def test_help_teaches_with_examples():
    result = run("--help")
    assert result.returncode == 0
    for word in ("generate", "emit", "compile", "run", "fuzz", "bench", "cache", "examples:", "convgen demo"):
        assert word in result.stdout
    sub = run("emit", "--help")
    assert "--dpitch" in sub.stdout and "--tile NAME=VALUE" in sub.stdout and "examples:" in sub.stdout


def test_generate_prints_source_for_flags_and_for_a_json_spec(tmp_path, capsys):
    assert main(["generate", "im2col", "--layout", "NCHW", "--c", "4", "--input", "10", "12", "--filter", "3",
                 "--stride", "2", "1"]) == 0
    from_flags = capsys.readouterr().out
    assert "2D NCHW n=2 c=4 k=8 input=10x12 filter=3x3 stride=2,1" in from_flags
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"dims": 2, "layout": "NCHW", "n": 2, "c": 4, "k": 8, "input_size": [10, 12],
                                     "filter_size": [3, 3], "stride": [2, 1], "dilation": 1}))
    assert main(["generate", "im2col", "--spec", str(spec_file)]) == 0
    assert capsys.readouterr().out == from_flags      # padding left out is 0 in a spec file and on the command line
    assert "padding=0,0" in from_flags


def test_compile_reports_key_hit_size_and_resources(cache_dir, capsys):
    args = ["compile", "col2im", "--tile", "algorithm=scatter", "--arch", "sm_90"]
    assert main(args) == 0
    first = capsys.readouterr().out
    assert "cache    miss" in first and "registers" in first and "cubin" in first
    result = run(*args, env={**__import__("os").environ, "CONVGEN_CACHE_DIR": str(cache_dir)})
    assert "cache    disk" in result.stdout
    assert main(["cache", "info"]) == 0
    assert "entries    1" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert "removed 1" in capsys.readouterr().out


def test_emit_writes_a_file(tmp_path, capsys):
    out = tmp_path / "k.cu"
    assert main(["emit", "im2col", "--dpitch", "4", "-o", str(out), "--name", "my_launcher"]) == 0
    assert "my_launcher" in out.read_text()
    assert "nvcc -arch=sm_90 -DCONVGEN_SELFTEST" in capsys.readouterr().out


@pytest.mark.parametrize("args, message", [
    (["generate", "im2col", "--tile", "threads"], "--tile='threads' is invalid: must be NAME=VALUE"),
    (["generate", "im2col", "--tile", "threads=33"], "tiles.threads=33 is invalid"),
    (["generate", "conv", "--c", "3"], "family='conv' is invalid"),
    (["compile", "im2col", "--arch", "hopper"], "arch='hopper' is invalid"),
    (["generate", "im2col", "--dims", "3", "--layout", "nhwc"], "a 3D spec takes NCDHW or NDHWC"),
    (["generate", "im2col", "--input", "4", "--filter", "9", "--padding", "0"], "output would be empty"),
])
def test_user_errors_are_one_line_exit_2(args, message):
    result = run(*args)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


def test_gpu_commands_say_they_need_a_gpu():
    from codegen.api import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present")
    result = run("run", "im2col")
    assert result.returncode == 2 and "needs a CUDA GPU" in result.stderr


def test_fuzz_without_gpu_checks_the_index_maps(capsys):
    from codegen.api import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present: fuzz checks kernels")
    assert main(["fuzz", "col2im", "--examples", "15", "--seed", "1"]) == 0
    out = capsys.readouterr().out
    assert "index maps on the CPU" in out and "no failing spec in 15 checked; seed 1" in out


def test_fuzz_reports_the_smallest_failing_spec_as_a_command(monkeypatch, capsys):
    """A planted bug (a wrong value whenever the image is wider than 2) shrinks to width 3."""
    from codegen import fuzz

    def planted(family, spec, seed=0):
        return fuzz.Mismatch("planted") if spec.input_size[-1] > 2 else None

    monkeypatch.setattr(fuzz, "check_index_maps", planted)
    report = fuzz.fuzz("im2col", 200, on_gpu=False, seed=3)
    assert report.failure is not None and report.shrunk
    spec, mismatch = report.failure
    assert spec.input_size[-1] == 3 and spec.n == 1 and spec.c == 1
    command = fuzz.spec_command("im2col", spec)
    assert command.startswith("convgen run im2col --dims")
    result = run(*command.split()[1:2], *command.split()[2:], "--help")
    assert result.returncode == 0


def _record_checked(monkeypatch) -> list:
    from codegen import fuzz

    seen = []
    monkeypatch.setattr(fuzz, "check_index_maps", lambda family, spec, seed=0: seen.append(spec))
    return seen


@pytest.mark.parametrize("flags", [["--dtype", "bf16"], ["--math", "3xtf32"], ["--dtype", "fp16", "--layout", "NCDHW"]])
def test_fuzz_on_the_cpu_checks_tensor_core_specs_and_reports_as_for_float32(flags, monkeypatch, capsys):
    """Without a GPU a tensor-core spec is planned (its own tiles' checks refuse some draws), rendered,
    and its address terms, which the FMA kernel's index maps share, give the float64 reference's
    numbers on the stored inputs decoded from their 16-bit storage."""
    from codegen import fuzz
    from codegen.api import has_gpu

    if has_gpu():
        pytest.skip("a GPU is present: fuzz checks kernels")
    honest, seen = fuzz.check_index_maps, []

    def recorded(family, spec, seed=0):
        seen.append(spec)
        return honest(family, spec, seed)

    monkeypatch.setattr(fuzz, "check_index_maps", recorded)
    assert main(["fuzz", "implicit_gemm", *flags, "--examples", "4", "--seed", "2"]) == 0
    out = capsys.readouterr().out
    assert "index maps on the CPU" in out and "no failing spec in 4 checked; seed 2" in out
    assert len(seen) == 4 and all(fuzz.uses_tensor_cores(s.dtype, s.math) for s in seen)


def test_the_cpu_check_of_a_tensor_core_spec_sees_a_wrong_address_term(monkeypatch):
    """bfloat16 bits decoded, the index maps agree with the reference; a term that drops the last
    output channel from K = 3 on is found and shrunk to K = 3, as for float32."""
    from codegen import fuzz, maps
    from codegen.spec import DType

    honest = maps.gemm_by_maps

    def planted(alg, x, w, source):
        assert x.dtype == np.float64 and np.abs(x).max() <= 1.0      # decoded values, not uint16 bits
        y = honest(alg, x, w, source)
        if alg.spec.k >= 3:
            y[..., -1] += 1.0
        return y

    monkeypatch.setattr(maps, "gemm_by_maps", planted)
    report = fuzz.fuzz("implicit_gemm", 30, on_gpu=False, seed=6, pinned={"layout": "NHWC", "dtype": "bfloat16"})
    spec, mismatch = report.failure
    assert spec.k == 3 and spec.dtype is DType.bfloat16 and "wrong value" in str(mismatch)


@pytest.mark.parametrize("changes", [{"dtype": "bfloat16"}, {"dtype": "float16"}, {"math": "tf32"},
                                     {"math": "3xtf32"}, {}])
def test_spec_command_carries_dtype_and_math_and_reads_back_as_the_spec(changes):
    from codegen import fuzz
    from codegen.cli import build_parser, spec_from_args

    spec = ConvSpec(dims=2, layout="NHWC", n=1, c=5, k=3, input_size=(6, 7), filter_size=3, padding=1, dpitch=8,
                    **changes)
    command = fuzz.spec_command("implicit_gemm", spec, {"block_k": 16})
    assert f"--dtype {spec.dtype.value}" in command
    assert (f"--math {spec.math.value}" in command) == ("math" in changes)
    assert spec_from_args(build_parser().parse_args(command.split()[1:])) == spec


def test_within_error_bound_passes_the_reference_and_names_what_is_outside():
    from codegen import fuzz, precision
    from codegen.spec import DType

    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=4, k=3, input_size=(5, 5), filter_size=3, dtype="bfloat16")
    from codegen.families import get_family

    family = get_family("implicit_gemm", spec)
    x, w = family.make_inputs(spec, np.random.default_rng(0))
    assert x.dtype == np.uint16
    expected = family.reference(spec, x, w)
    rounded = precision.from_storage(precision.to_storage(expected, DType.bfloat16), DType.bfloat16)
    assert fuzz.check_result(spec, rounded, expected, [x, w]) is None      # one rounding to bfloat16 is inside
    wrong = rounded.copy()
    wrong[0, 1, 2, 1] += 1.0
    found = str(fuzz.check_result(spec, wrong, expected, [x, w]))
    assert "1 element(s) outside the error bound, worst at (0, 1, 2, 1)" in found
    wrong[0, 0, 0, 0] = np.nan
    assert "never written (NaN), first at (0, 0, 0, 0)" in str(fuzz.check_result(spec, wrong, expected, [x, w]))
    fp32 = ConvSpec(dims=2, layout="NCHW", n=1, c=4, k=3, input_size=(5, 5), filter_size=3)
    assert "wrong value" in str(fuzz.check_result(fp32, expected + 1e-3, expected, []))   # FMA: compare's tolerance
    assert precision.from_storage(np.array([fuzz.NAN[DType.bfloat16]]), DType.bfloat16)[0] != 0
    assert all(np.isnan(precision.from_storage(np.array([fuzz.NAN[d]]), d)[0]) for d in DType)


def test_generate_and_compile_take_dtype_and_math(cache_dir, capsys):
    assert main(["generate", "implicit_gemm", "--layout", "NCHW", "--c", "8", "--dtype", "bf16"]) == 0
    out = capsys.readouterr().out
    assert "implicit_gemm / mma" in out and "bfloat16" in out and "__nv_bfloat16" in out
    assert main(["compile", "implicit_gemm", "--c", "16", "--k", "32", "--math", "tf32", "--arch", "sm_80"]) == 0
    out = capsys.readouterr().out
    assert "implicit_gemm / mma" in out and "float32 math=tf32" in out and "spills 0/0 B" in out


def test_fuzz_keeps_the_spec_flags_given_and_varies_the_rest(monkeypatch, capsys):
    seen = _record_checked(monkeypatch)
    assert main(["fuzz", "im2col", "--layout", "nchw", "--c", "5", "--stride", "2", "1", "--examples", "30",
                 "--seed", "4"]) == 0
    assert len(seen) == 30
    assert {(s.layout.value, s.c, s.stride) for s in seen} == {("NCHW", 5, (2, 1))}
    assert len({s.input_size for s in seen}) > 5 and len({s.filter_size for s in seen}) > 3
    assert "fields kept: layout=NCHW, c=5, stride=(2, 1)" in capsys.readouterr().out


def test_fuzz_with_one_seed_checks_the_same_specs_again(monkeypatch):
    from codegen import fuzz

    seen = _record_checked(monkeypatch)
    fuzz.fuzz("im2col", 12, on_gpu=False, seed=9)
    first = list(seen)
    seen.clear()
    assert fuzz.fuzz("im2col", 12, on_gpu=False, seed=9).seed == 9
    assert seen == first


def test_fuzz_counts_refused_specs_apart_and_checks_the_tma_plan_on_the_cpu(capsys):
    """tma=True refuses channels-last pitches that are not multiples of 4: those draws are reported
    with their reasons and do not count, and the specs checked (channels-first ones too, whose A
    tile the producer warps gather) run the TMA plan model."""
    from codegen import fuzz

    report = fuzz.fuzz("implicit_gemm", 8, on_gpu=False, tiles={"tma": True}, seed=5)
    assert report.failure is None and report.checked == 8
    assert any(reason.startswith("dpitch") for reason in report.refused)
    assert "x dpitch" in report.refusal_summary()
    first = fuzz.fuzz("implicit_gemm", 6, on_gpu=False, tiles={"tma": True}, seed=5, pinned={"layout": "NCHW"})
    assert first.failure is None and first.checked == 6 and not first.refused


def test_fuzz_that_checked_fewer_specs_than_asked_says_which_flags_would_search_further(monkeypatch, capsys):
    """Tiles that refuse most draws (wgmma=true takes C a multiple of 8) leave Hypothesis few specs:
    the report says so and how to pin the fields the refusals name."""
    from collections import Counter

    from codegen import fuzz

    refused = Counter({"tiles.wgmma: takes channels-last float16, bfloat16, or float32 with math tf32": 613})
    monkeypatch.setattr(fuzz, "fuzz", lambda *args, **kwargs: fuzz.FuzzReport(checked=5, refused=refused, seed=7))
    assert main(["fuzz", "implicit_gemm", "--examples", "40", "--dtype", "bf16", "--tile", "wgmma=true"]) == 0
    out = capsys.readouterr().out
    assert "613 drawn specs, commonest: 613 x tiles.wgmma" in out
    assert "no failing spec in 5 checked (only 5: the rest were refused; pin the fields the refusals name" in out


def test_fuzz_finds_a_planted_error_in_the_tma_plan_without_a_gpu(monkeypatch):
    """The CPU check of tma=True goes through maps.tma_gemm_by_terms: an error planted there (the
    last output channel wrong from K = 3 on) is found and shrunk to K = 3."""
    from codegen import fuzz, maps

    honest = maps.tma_gemm_by_terms

    def planted(spec, tiles, x, w):
        y = honest(spec, tiles, x, w)
        if spec.k >= 3:
            y[..., -1] += 1.0
        return y

    monkeypatch.setattr(maps, "tma_gemm_by_terms", planted)
    report = fuzz.fuzz("implicit_gemm", 40, on_gpu=False, tiles={"tma": True}, seed=6, pinned={"layout": "NHWC"})
    spec, mismatch = report.failure
    assert spec.k == 3 and spec.layout.value == "NHWC" and "wrong value" in str(mismatch)


def test_fuzz_takes_any_other_exception_as_a_failure_and_shrinks_it(monkeypatch):
    from codegen import fuzz, render

    honest = render.render_kernels

    def crashes_on_wide(kernel_plan):
        if kernel_plan.spec.input_size[-1] > 3:
            raise RuntimeError("planted renderer bug")
        return honest(kernel_plan)

    monkeypatch.setattr(render, "render_kernels", crashes_on_wide)
    report = fuzz.fuzz("im2col", 50, on_gpu=False, seed=7)
    spec, mismatch = report.failure
    assert spec.input_size[-1] == 4 and str(mismatch) == "raised RuntimeError: planted renderer bug"


def test_fuzz_stops_at_a_device_fault_without_shrinking(monkeypatch):
    """A CUDA error may leave the context unusable: the search stops at the spec that raised it."""
    from codegen import fuzz

    class CUDARuntimeError(RuntimeError):
        pass

    def faults(family, spec, tiles=None, seed=0):
        if spec.c > 1:
            raise CUDARuntimeError("cudaErrorIllegalAddress: an illegal memory access was encountered")
        return None

    monkeypatch.setattr(fuzz, "check_on_gpu", faults)
    report = fuzz.fuzz("im2col", 50, on_gpu=True, seed=8)
    spec, mismatch = report.failure
    assert spec.c > 1 and not report.shrunk and str(mismatch).startswith("device fault, CUDARuntimeError")


@pytest.mark.parametrize("argv, words", [
    (["--tile", "variant=tiled_tma", "--layout", "NHWC"], "no spec was checked: direct refused every spec drawn"),
    (["--layout", "NCHW", "--dpitch", "4"], "dpitch=4 is invalid: applies only to channels-last layouts"),
    (["--layout", "NDHWC", "--dims", "2"], "layout='NDHWC' is invalid: a 2D spec takes"),
    (["--input", "3", "4", "5", "--filter", "3", "3"], "input_size=(3, 4, 5) is invalid: needs 2 entries"),
    (["--spec", "spec.json"], "fuzz draws its specs, so it takes no --spec file"),
])
def test_fuzz_refuses_what_it_cannot_search(argv, words, capsys):
    assert main(["fuzz", "direct", "--examples", "5", "--seed", "1", *argv]) == 2
    assert words in capsys.readouterr().err


def test_catalogue_check_passes_on_a_fresh_tree():
    result = run("catalogue", "--check")
    assert result.returncode == 0, result.stdout


def test_catalogue_writes_what_changed_and_deletes_strays(tmp_path, monkeypatch, capsys):
    from codegen import catalogue

    kept = next(e for e in catalogue.entries() if e.family == "im2col")
    monkeypatch.setattr(catalogue, "GENERATED", tmp_path)
    monkeypatch.setattr(catalogue, "entries", lambda: [kept])
    stray = tmp_path / "implicit_gemm" / "conv12_nchw_tma.cu"
    stray.parent.mkdir()
    stray.write_text("// a file the catalogue no longer ships\n")
    assert main(["catalogue"]) == 0
    out = capsys.readouterr().out
    assert f"deleted: {stray} (no longer in the catalogue)" in out
    assert "1 file(s) rewritten, 1 deleted, 1 in the catalogue" in out
    assert not stray.exists() and kept.path.read_text() == kept.source()
    assert main(["catalogue"]) == 0 and "0 file(s) rewritten, 0 deleted" in capsys.readouterr().out


def test_demo_without_gpu_generates_compiles_and_emits(tmp_path, cache_dir):
    from codegen.api import has_gpu

    result = run("demo", "--out", str(tmp_path), env={**__import__("os").environ, "CONVGEN_CACHE_DIR": str(cache_dir)})
    assert result.returncode == 0, result.stderr
    assert len(list(tmp_path.glob("*.cu"))) == 14          # every case but im2col_gemm (a cuBLAS step)
    assert "implicit_gemm" in result.stdout and "(cuBLAS step)" in result.stdout
    assert "nhwc_bf16       mma" in result.stdout and (tmp_path / "implicit_gemm_nhwc_bf16.cu").exists()
    assert (tmp_path / "implicit_gemm_nhwc_pitch4_tma.cu").exists() and (tmp_path / "direct_nchw_tiled_tma.cu").exists()
    assert ("PASS" in result.stdout) == has_gpu()


def test_a_variant_alone_takes_that_variants_tile_heuristic(capsys):
    assert main(["generate", "direct", "--layout", "NCHW", "--tile", "variant=tiled_register"]) == 0
    assert "tiled_register" in capsys.readouterr().out


def test_families_lists_the_gemm_families_and_their_switches(capsys):
    assert main(["families"]) == 0
    out = capsys.readouterr().out
    for word in ("implicit_gemm", "im2win", "im2col_gemm", "block_k", "async_copy", "precomp", "batch_chunk"):
        assert word in out
    gemm = out[out.index("implicit_gemm:"):out.index("im2win:")]
    tensor_cores = gemm[gemm.index("with --dtype float16 or bfloat16, or --math tf32 or 3xtf32"):]
    assert "mma.sync" in tensor_cores and "thread_m" not in tensor_cores
    for name in ("block_m", "block_n", "block_k", "warp_m", "warp_n", "stages"):
        assert f"    --tile {name}=" in tensor_cores
    assert out.count("with --dtype float16") == 1          # only implicit_gemm has a tensor-core kernel


def test_help_shows_a_tensor_core_example():
    result = run("--help")
    example = "convgen run implicit_gemm --layout NHWC --c 64 --k 64 --input 56 56 --padding 1 --dtype bf16"
    assert example in result.stdout


def test_compile_an_implicit_gemm_kernel_without_a_gpu(cache_dir, capsys):
    assert main(["compile", "implicit_gemm", "--layout", "NHWC", "--c", "16", "--k", "32", "--arch", "sm_90",
                 "--tile", "block_k=32", "--tile", "stages=4"]) == 0
    out = capsys.readouterr().out
    assert "block_k=32" in out and "stages=4" in out and "spills 0/0 B" in out


def test_emitting_im2col_gemm_is_refused_with_the_reason(tmp_path, capsys):
    assert main(["emit", "im2col_gemm", "-o", str(tmp_path / "x.cu")]) == 2
    assert "cuBLAS" in capsys.readouterr().err


def test_bad_gemm_tiles_name_the_field(capsys):
    assert main(["generate", "implicit_gemm", "--tile", "warp_m=48"]) == 2
    assert "tiles.warp_m" in capsys.readouterr().err


def test_tune_show_export_import(tmp_path, capsys):
    from codegen import tune
    from codegen.spec import ConvSpec

    db_path = tmp_path / "tuning.json"
    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=3, k=4, input_size=(8, 8), filter_size=3)
    device = ("NVIDIA H100 80GB HBM3", "sm_90")
    tune.TuningDB(db_path).record("implicit_gemm", spec, device, {"stages": 2}, ms=1.0,
                                  kernel=tune.kernel_fingerprint("implicit_gemm", spec, {"stages": 2}))
    tune.TuningDB(db_path).record("im2win", spec, device, {"stages": 2}, ms=1.0)
    tune.TuningDB(db_path).record("implicit_gemm", spec, device, {"stages": 3}, 64 << 20, ms=1.0,
                                  kernel=tune.kernel_fingerprint("implicit_gemm", spec, {"stages": 3}))
    assert main(["tune", "--show", "--db", str(db_path)]) == 0
    shown = capsys.readouterr().out
    assert "implicit_gemm" in shown and shown.count("[stale: timed other kernel code") == 1
    assert shown.index("[stale") > shown.index("im2win")
    assert shown.count("for builds with --workspace-limit 64 MiB") == 1
    limited = shown.index("--workspace-limit")
    assert shown[limited:].splitlines()[1].strip() == "stages=3"
    assert main(["tune", "--export", str(tmp_path / "out.json"), "--db", str(db_path)]) == 0
    assert main(["tune", "--import", str(tmp_path / "out.json"), "--db", str(tmp_path / "other.json")]) == 0
    assert "merged 3 entries" in capsys.readouterr().out


def test_tune_without_a_gpu_says_so(capsys):
    from codegen.api import has_gpu

    if has_gpu():
        pytest.skip("a GPU is visible")
    assert main(["tune", "implicit_gemm", "--layer", "conv8"]) == 2
    assert "needs a CUDA GPU" in capsys.readouterr().err


def test_tune_checks_its_workspace_limit_before_asking_for_a_gpu(capsys):
    assert main(["tune", "im2win", "--layer", "conv9", "--workspace-limit", "190MB"]) == 2
    err = capsys.readouterr().err
    assert "--workspace-limit" in err and "190MB" in err and "MiB" in err


def test_tune_layer_takes_the_other_spec_flags_as_overrides(tmp_path):
    """--layer used to drop every spec flag but --layout without a word."""
    from codegen.cli import Fail, build_parser, tune_spec

    def spec_of(*argv):
        return tune_spec(build_parser().parse_args(["tune", "implicit_gemm", *argv]))

    plain = spec_of("--layer", "c3d_conv2")
    assert (plain.layout.value, plain.n, plain.c, plain.k, plain.input_size) == ("NCDHW", 8, 64, 128, (16, 56, 56))
    custom = spec_of("--layer", "conv8", "--layout", "nhwc", "--n", "8", "--dpitch", "68")
    assert (custom.layout.value, custom.n, custom.c, custom.k, custom.dpitch) == ("NHWC", 8, 64, 128, 68)
    assert custom.input_size == spec_of("--layer", "conv8").input_size
    with pytest.raises(Fail, match="--layer or --spec"):
        spec_of("--layer", "conv8", "--spec", str(tmp_path / "spec.json"))


def test_bench_layers_are_checked_before_any_gpu_work():
    from codegen.bench.layers import load_shapes, select_layers
    from codegen.spec import SpecError

    shapes = load_shapes()["filter2d"]
    assert [l["name"] for l in select_layers(shapes, ["filter_r4", "filter_r1"])] == ["filter_r1", "filter_r4"]
    assert select_layers(shapes, None) == shapes
    with pytest.raises(SpecError, match="--layers='filter_r5'.*filter_r1, filter_r2"):
        select_layers(shapes, ["filter_r5"])


LAYER = {"name": "res2a", "N": 2, "C": 3, "H": 8, "W": 8, "K": 4, "R": 3, "S": 3}


@pytest.mark.parametrize("content, words", [
    ({"layers": [{**LAYER, "stirde": 2}]}, "shapes.json: res2a.stirde=2 is invalid: not a field of a 2D layer; "
                                           "those are name, N, C, H, W, K, R, S, stride, padding, dilation"),
    ([{key: value for key, value in LAYER.items() if key != "K"}], "res2a.K=None is invalid: missing"),
    ([{**LAYER, "D": 4}], "res2a.T=None is invalid: missing; a 3D layer gives name, N, C, D, H, W, K, T, R, S"),
    ([{**LAYER, "stride": [1, 1, 1]}], "res2a.stride=[1, 1, 1] is invalid: must be one whole number or a list of 2"),
    ([{**LAYER, "C": 0}], "res2a.C=0 is invalid: must be a whole number >= 1"),
    ([{**LAYER, "C": 2.5}], "res2a.C=2.5 is invalid"),
    ([{**LAYER, "H": 2}], "res2a: filter_size=(3, 3) is invalid: the dilated filter spans 3 along H"),
    ([{**LAYER, "name": ""}], "layers[0].name='' is invalid: must be a non-empty string"),
    ([LAYER, LAYER], "name='res2a' is invalid: names a layer twice"),
    ([3], "layers[0]=3 is invalid: a layer is an object"),
    ({"note": "nothing else"}, "holds no layers"),
    ("{not json", "must be a readable JSON file"),
])
def test_a_shapes_file_is_checked_before_any_gpu_work(content, words, tmp_path, capsys):
    """Each field of each layer of a --shapes file, named with the file and the layer, on a
    machine without a GPU (the GPU check comes after)."""
    path = tmp_path / "shapes.json"
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    assert main(["bench", "conv", "--shapes", str(path)]) == 2
    assert words in capsys.readouterr().err


def test_shapes_files_give_every_layer_with_its_geometry_per_dimension(tmp_path):
    """The package's own shapes.json and docs/shapes/unseen.json read as --shapes files; stride,
    padding and dilation default to PyTorch's and broadcast over the dimensions; the layers are
    what --layers selects from, and they become the specs the benchmark runs."""
    from pathlib import Path

    from codegen.bench.layers import benchmark_layers, layer_spec, load_shapes, read_shapes_file, select_layers

    root = Path(__file__).resolve().parent.parent
    package = load_shapes()
    assert len(read_shapes_file(root / "codegen" / "shapes.json")) == sum(
        len(group) for group in package.values() if isinstance(group, list))
    unseen = read_shapes_file(root / "docs" / "shapes" / "unseen.json")
    assert len(unseen) == 32 and {layer["group"] for layer in unseen} == {"resnet50_b32", "other_nets"}
    path = tmp_path / "mine.json"
    path.write_text(json.dumps([LAYER, {**LAYER, "name": "down", "D": 4, "T": 1, "stride": 2, "padding": [0, 1, 1]}]))
    flat, deep = select_layers(benchmark_layers(("conv2d_mec",), path), ["down", "res2a"])
    assert (flat["stride"], flat["padding"], flat["dilation"], flat["group"]) == ([1, 1], [0, 0], [1, 1], "layers")
    assert (deep["stride"], deep["padding"]) == ([2, 2, 2], [0, 1, 1])
    spec = layer_spec(deep, "NDHWC", deep["N"])
    assert (spec.input_size, spec.filter_size, spec.stride, spec.padding) == ((4, 8, 8), (1, 3, 3), (2, 2, 2), (0, 1, 1))
    assert [l["name"] for l in benchmark_layers(("conv3d",))] == [l["name"] for l in package["conv3d"]]


@pytest.mark.parametrize("argv, words", [
    (["bench", "im2col", "--shapes", "x.json"], "--shapes is taken by 'bench conv' only"),
    (["bench", "direct", "--families", "im2win"], "--families is taken by 'bench conv' only"),
    (["tune", "implicit_gemm", "--shapes", "docs/shapes/unseen.json"], "--shapes is the file --layer picks from"),
    (["tune", "implicit_gemm", "--shapes", "docs/shapes/unseen.json", "--layer", "conv4"],
     "--layer='conv4' is invalid: must be one of r50_stem"),
    (["bench", "conv", "--shapes", "docs/shapes/unseen.json", "--layers", "conv4"],
     "--layers='conv4' is invalid: must be among r50_stem"),
])
def test_shapes_and_families_are_refused_where_they_do_not_apply(argv, words, capsys, monkeypatch):
    from pathlib import Path

    monkeypatch.chdir(Path(__file__).resolve().parent.parent)
    assert main(argv) == 2
    assert words in capsys.readouterr().err


@pytest.mark.parametrize("argv, words", [
    (["bench", "col2im", "--tile", "channels=3"], "--tile on conv1 NCHW: tiles.channels=3 is invalid: one of 1, 2, 4, 8"),
    (["bench", "col2im", "--tile", "algorithm=scatter", "--tile", "channels=2", "--layers", "conv8"],
     "--tile on conv8 NCHW: tiles.channels=2 is invalid: groups the channels of a gather thread"),
    (["bench", "im2col", "--tile", "threads"], "--tile='threads' is invalid: must be NAME=VALUE"),
    (["bench", "conv", "--tile", "block_m=64"], "--tile is taken by 'bench im2col' and 'bench col2im' only"),
    (["bench", "direct", "--tile", "variant=basic"], "--tile is taken by 'bench im2col' and 'bench col2im' only"),
])
def test_bench_tiles_are_checked_on_every_layer_before_any_gpu_work(argv, words, capsys):
    assert main(argv) == 2
    assert words in capsys.readouterr().err


def test_bench_col2im_takes_the_tiles_to_every_layer(monkeypatch):
    """--tile reaches the memory benchmark (which builds every layer with those tiles over build()'s)."""
    from codegen import cli
    from codegen.bench import memory

    taken = {}
    monkeypatch.setattr(cli, "_require_gpu", lambda what: None)
    monkeypatch.setattr(memory, "bench_memory_family", lambda family, **kwargs: taken.update(kwargs, family=family) or [])
    monkeypatch.setattr(memory, "format_table", lambda results: "")
    assert main(["bench", "col2im", "--dtype", "bf16", "--tile", "channels=4", "--layers", "conv1"]) == 0
    assert taken["family"] == "col2im" and taken["tiles"] == {"channels": 4} and taken["layers"] == ["conv1"]


def test_bench_conv_families_flag_offers_every_family_the_benchmark_runs():
    """--families offers the families bench conv runs by default, each one the generator's, and the
    command line has the list without loading the benchmarks themselves."""
    import inspect

    from codegen.bench import CONV_FAMILIES, conv
    from codegen.families import FAMILIES

    assert inspect.signature(conv.bench_conv).parameters["families"].default == CONV_FAMILIES
    assert set(CONV_FAMILIES) <= set(FAMILIES)
    loaded = subprocess.run([sys.executable, "-c", "import sys, codegen.cli; "
                             "print(sorted(m for m in sys.modules if m.startswith('codegen.bench')))"],
                            capture_output=True, text=True, check=True).stdout
    assert loaded.split() == ["['codegen.bench']"]


def test_bench_conv_table_counts_where_each_family_meets_cudnn():
    """One line per family as build() runs it (the heuristic row, direct's fastest variant): how
    often at least cuDNN's speed, the geometric mean ratio, the slowest layer; TMA, tuned and
    ablation rows do not count; long layer names keep the columns aligned."""
    from codegen.bench.conv import format_table

    def row(layer, family, variant, ratio, ablation=None):
        return {"family": family, "variant": variant, "layer": layer, "layout": "NCHW", "ablation": ablation,
                "ms": 1.0, "tflops": 40 * ratio, "speedup_vs_cudnn": ratio, "extra_bytes": 0,
                "cudnn_tflops": 40.0, "cudnn_extra_bytes": 0}

    text = format_table([row("r2plus1d_spatial", "implicit_gemm", "heuristic", 1.44),
                         row("r2plus1d_spatial", "implicit_gemm", "tma", 0.5),
                         row("r2plus1d_spatial", "direct", "tiled_halo", 0.2),
                         row("conv9", "implicit_gemm", "heuristic", 0.9), row("conv9", "implicit_gemm", "tuned", 2.0),
                         row("conv9", "im2win", "without prefetch", 0.1, "prefetch")])
    lines = text.splitlines()
    assert "implicit_gemm: at least cuDNN's speed on 1 of 2, geometric mean 1.14x, slowest 0.90x (conv9 NCHW)" in lines
    assert "direct: at least cuDNN's speed on 0 of 1, geometric mean 0.20x, slowest 0.20x (r2plus1d_spatial NCHW)" in lines
    assert not any(line.startswith("im2win:") for line in lines)
    assert lines[1].index("layout") == lines[3].index("NCHW") == lines[4].index("NCHW") == len("r2plus1d_spatial") + 1


def test_bench_conv_summary_counts_the_kernel_build_runs_on_this_gpu():
    """Where build() without tiles takes the implicit GEMM's TMA kernel (channels-last on sm_90),
    the family's line counts that row, not the portable kernel's, and its cell is starred and
    explained; results saved before rows said so still count the first column."""
    from codegen.bench.conv import format_table

    def row(layer, variant, tflops, built):
        return {"family": "implicit_gemm", "variant": variant, "layer": layer, "layout": "NHWC", "ablation": None,
                "ms": 1.0, "tflops": tflops, "speedup_vs_cudnn": tflops / 40, "extra_bytes": 0,
                "cudnn_tflops": 40.0, "cudnn_extra_bytes": 0, "build_choice": built}

    results = [row("conv4", "heuristic", 46.0, False), row("conv4", "tma", 50.0, True),
               row("r50_l1_reduce", "heuristic", 40.0, False), row("r50_l1_reduce", "tma", 30.0, True),
               row("conv1", "heuristic", 44.0, True)]
    lines = format_table(results).splitlines()
    assert lines[3].split()[3:] == ["46.0", "(1.15)", "50.0", "(1.25)*"]
    assert len(lines[3]) == len(lines[4]) == len(lines[5]) == len(lines[2])
    assert lines[6].startswith("*: the kernel build() runs without tiles on this GPU")
    assert lines[7] == ("implicit_gemm: at least cuDNN's speed on 2 of 3, geometric mean 1.01x, slowest 0.75x "
                        "(r50_l1_reduce NHWC)")
    legacy = [{k: v for k, v in r.items() if k != "build_choice"} for r in results]
    assert "at least cuDNN's speed on 3 of 3, geometric mean 1.08x" in format_table(legacy)


def test_bench_conv_table_takes_im2win_rows_that_already_fit_cudnns_memory():
    """Where im2win's heuristic already fits cuDNN's extra memory (cuDNN's FFT layers), the
    'within cuDNN' row repeats the heuristic's timing; it is not build()'s choice and must not
    break the summary (it raised KeyError: 'build_choice' on the H100's full run)."""
    from codegen.bench.conv import WITHIN_CUDNN, format_table

    def row(variant, **extra):
        return {"family": "im2win", "variant": variant, "layer": "conv5", "layout": "NCHW", "ablation": None,
                "ms": 1.5, "tflops": 42.0, "speedup_vs_cudnn": 0.3, "extra_bytes": 118 << 20,
                "cudnn_tflops": 138.0, "cudnn_extra_bytes": 308 << 20, **extra}

    results = [row("heuristic", build_choice=True),
               row(WITHIN_CUDNN, same_as_heuristic=True, least_extra_bytes=931200)]
    lines = format_table(results).splitlines()
    assert "im2win: at least cuDNN's speed on 0 of 1, geometric mean 0.30x, slowest 0.30x (conv5 NCHW)" in lines


def test_bench_conv_table_names_every_column_in_full():
    """The TMA and tuned columns follow their family's and say so; no family name is cut to fit;
    a layer without a TMA row (channels-first) shows a dash there."""
    from codegen.bench.conv import format_table

    def row(family, variant, tflops, layout="NHWC"):
        return {"family": family, "variant": variant, "layer": "conv8", "layout": layout, "ablation": None,
                "ms": 1.0, "tflops": tflops, "speedup_vs_cudnn": tflops / 40, "extra_bytes": 0,
                "cudnn_tflops": 40.0, "cudnn_extra_bytes": 0}

    text = format_table([row("implicit_gemm", "heuristic", 43.0), row("implicit_gemm", "tma", 48.0),
                         row("implicit_gemm", "tuned", 45.0), row("im2col_gemm", "heuristic", 37.0),
                         row("implicit_gemm", "heuristic", 49.0, "NCHW")])
    lines = text.splitlines()
    assert lines[1].split() == ["layer", "layout", "cuDNN", "implicit_gemm", "(tma)", "(tuned)", "im2col_gemm"]
    assert lines[3].split()[3:] == ["43.0", "(1.07)", "48.0", "(1.20)", "45.0", "(1.12)", "37.0", "(0.93)"]
    assert lines[4].split()[3:] == ["49.0", "(1.23)", "-", "-", "-"]


def test_bench_conv_table_shows_the_clock_each_layer_ran_at():
    """With clock samples the TFLOP/s table gains the layer's median SM clock and power-cap share,
    explained under the table; the memory table keeps its columns."""
    from codegen.bench.conv import format_table

    clock = {"sm_mhz_median": 1935.0, "power_capped_share": 0.6}
    row = {"family": "implicit_gemm", "variant": "heuristic", "layer": "conv4", "layout": "NCHW", "ablation": None,
           "ms": 1.0, "tflops": 48.7, "speedup_vs_cudnn": 2.14, "extra_bytes": 0, "cudnn_tflops": 22.8,
           "cudnn_extra_bytes": 0, "clock": clock}
    lines = format_table([row, {**row, "layer": "conv8", "clock": None}]).splitlines()
    assert lines[1].split()[-2:] == ["MHz", "cap"]
    assert lines[3].split()[-2:] == ["1935", "60%"]
    assert lines[4].split()[-2:] == ["-", "-"]
    assert lines[5].startswith("MHz: median SM clock")
    assert "MHz" not in lines[8]


def test_cudnns_algorithm_is_named_by_its_kernels():
    """FFT and Winograd kernels say so in their names; any other traced kernel sums the taps as a
    GEMM; nothing traced is unknown, never guessed."""
    from codegen.bench.cudnn import cudnn_algorithm

    assert cudnn_algorithm(["fft2d_r2c_16x16", "sm80_xmma_gemm_f32f32", "fft2d_c2r_16x16"]) == "FFT"
    assert cudnn_algorithm(["void cudnn::winograd_nonfused::winogradForwardData4x4<float, float>"]) == "Winograd"
    assert cudnn_algorithm(["nchwToNhwcKernel", "sm80_xmma_fprop_implicit_gemm_f32f32_tilesize256x64x8"]) == "GEMM"
    assert cudnn_algorithm(["void precomputed_convolve_sgemm<float, 1024, 5, 5, 4, 3, 3, 1, false>"]) == "GEMM"
    assert cudnn_algorithm([]) == "unknown"


def test_bench_conv_table_says_which_algorithm_cudnn_ran_and_counts_the_gemm_layers():
    """An ``alg`` column after cuDNN's figure (explained under the table), and each family's line
    also counts the layers the issue's speed target covers: those where cuDNN ran a GEMM."""
    from codegen.bench.conv import format_table

    def row(layer, ratio, algorithm):
        return {"family": "implicit_gemm", "variant": "heuristic", "layer": layer, "layout": "NCHW",
                "ablation": None, "ms": 1.0, "tflops": 40 * ratio, "speedup_vs_cudnn": ratio, "extra_bytes": 0,
                "cudnn_tflops": 40.0, "cudnn_extra_bytes": 0, "cudnn_algorithm": algorithm}

    lines = format_table([row("conv4", 2.1, "GEMM"), row("conv5", 0.6, "FFT"), row("conv6", 0.9, "GEMM"),
                          row("conv10", 0.5, "Winograd"), row("conv12", 1.2, "unknown")]).splitlines()
    assert lines[1].split() == ["layer", "layout", "cuDNN", "alg", "implicit_gemm"]
    assert [line.split()[3] for line in lines[3:8]] == ["gemm", "fft", "gemm", "wino", "?"]
    assert lines[8].startswith("alg: cuDNN's algorithm")
    assert lines[9] == ("implicit_gemm: at least cuDNN's speed on 2 of 5, geometric mean 0.93x, slowest 0.50x "
                        "(conv10 NCHW); 1 of 2 where cuDNN ran a GEMM (neither FFT nor Winograd)")
    memory = lines.index("extra device memory, MiB")
    assert lines[memory + 1].split() == ["layer", "layout", "cuDNN", "implicit_gemm"]


def test_tune_refresh_reports_what_each_stale_entry_keeps(tmp_path, monkeypatch, capsys):
    """The report names both timings and the choice; the re-timing itself is test_tune's."""
    from codegen import cli, tune
    from codegen.spec import ConvSpec

    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=3, k=4, input_size=(8, 8), filter_size=3)
    old = {"family": "implicit_gemm", "tiles": {"stages": 2}, "ms": 1.5}
    trials = [tune.Trial({"stages": 3}, seconds=1e-3, status="ok"), tune.Trial({"stages": 2}, seconds=2e-3, status="ok")]
    result = tune.TuneResult("implicit_gemm", spec, trials[0], trials[0], trials, 1.0, 2)
    monkeypatch.setattr(cli, "_require_gpu", lambda what: None)
    monkeypatch.setattr(tune, "refresh", lambda db: [(old, result)])
    assert main(["tune", "--refresh", "--db", str(tmp_path / "tuning.json")]) == 0
    out = capsys.readouterr().out
    assert "was 1.500 ms; now heuristic 1.000 ms, recorded 2.000 ms -> keeps the heuristic" in out
    monkeypatch.setattr(tune, "refresh", lambda db: [])
    assert main(["tune", "--refresh", "--db", str(tmp_path / "tuning.json")]) == 0
    assert "no stale entries" in capsys.readouterr().out


def test_tune_records_its_winner_and_exits_1_when_a_candidate_did_not_compile(tmp_path, monkeypatch, capsys):
    """A candidate NVRTC rejected leaves the winner recorded, is named after the table, and makes
    the exit status 1, so that a script running the tuner sees the bug."""
    from codegen import cli, tune
    from codegen.spec import ConvSpec

    spec = ConvSpec(dims=2, layout="NCHW", n=1, c=3, k=4, input_size=(8, 8), filter_size=3)
    ok = tune.Trial({"stages": 3}, seconds=1e-3, status="ok")
    broken = tune.Trial({"stages": 4}, status="compile error", detail="NVRTC failed on x.cu:\nline 1; error   : bad")
    monkeypatch.setattr(cli, "_require_gpu", lambda what: None)
    for trials, status in (([ok], 0), ([ok, broken], 1)):
        monkeypatch.setattr(tune, "tune", lambda *a, **k: tune.TuneResult("implicit_gemm", spec, ok, ok, trials, 1.0, 2))
        assert main(["tune", "implicit_gemm", "--db", str(tmp_path / "tuning.json")]) == status
        out = capsys.readouterr().out
        assert "recorded in" in out and ("did not compile" in out) == (status == 1)


def test_interleaved_medians_take_turns_and_keep_each_runs_median(monkeypatch):
    """Interleaved A/B timing: every round times each variant once, in order, and each variant
    gets the median of its own rounds (a drift that slows round 2 for all does not pick a winner)."""
    from codegen.bench import timing

    calls = []
    seconds = {"a": iter([1.0, 9.0, 2.0]), "b": iter([3.0, 8.0, 4.0])}

    def fake_median(run, repeats, warmup):
        calls.append(run())
        return next(seconds[calls[-1]])

    monkeypatch.setattr(timing, "median_seconds", fake_median)
    times = timing.interleaved_medians({"a": lambda: "a", "b": lambda: "b"}, rounds=3)
    assert calls == ["a", "b"] * 3
    assert times == {"a": 2.0, "b": 4.0}


def test_tma_stress_covers_every_tma_kernel_of_the_benchmark_layers():
    """scripts/stress_tma.py, the race detector run on the GPU: both micro-tiles of the implicit
    GEMM's TMA kernel in both layouts wherever it takes a layer, and the direct tiled_tma filters."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "scripts" / "stress_tma.py"
    module_spec = importlib.util.spec_from_file_location("stress_tma", path)
    stress = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(stress)
    found = {(name, spec.layout.value, label) for name, label, _, spec in stress.cases([])}
    assert len(found) == 60
    for layout in ("NCHW", "NHWC"):
        assert {("conv8", layout, f"implicit_gemm {m}x8") for m in (16, 8)} <= found
    assert ("unet3d_l1", "NCDHW", "implicit_gemm 8x8") in found and ("conv1", "NHWC", "implicit_gemm 8x8") not in found
    assert {(f"filter_r{r}", "NCHW", "direct tiled_tma") for r in range(1, 5)} <= found
    assert {name for name, _, _, _ in stress.cases(["conv4"])} == {"conv4"}


def test_every_script_teaches_its_use_from_any_folder_without_a_gpu(tmp_path):
    """Each script under scripts/ answers --help with what it does, when to use it and an example,
    run as a user runs it: from a folder outside the repository, with the installed package and no
    PYTHONPATH, on a machine without a GPU.  One that no longer imports, imports from the tree
    only, or runs on whatever arguments it is given would otherwise be found out only in a device
    call."""
    import os
    from concurrent.futures import ThreadPoolExecutor
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    scripts = sorted([*(root / "scripts").glob("*.py"), *(root / "scripts").glob("*.sh")])
    env = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}

    def usage(path):
        command = ["bash", str(path)] if path.suffix == ".sh" else [sys.executable, str(path)]
        return subprocess.run([*command, "--help"], capture_output=True, text=True, env=env, cwd=tmp_path,
                              timeout=120)

    with ThreadPoolExecutor(4) as pool:
        results = dict(zip(scripts, pool.map(usage, scripts)))
    assert {path.suffix for path in scripts} == {".py", ".sh"} and len(scripts) >= 6
    for path, result in results.items():
        assert result.returncode == 0, (path.name, result.stderr[-500:])
        assert "When to use it:" in result.stdout and "xample" in result.stdout, path.name
        assert path.suffix != ".py" or result.stdout.startswith("usage:"), path.name


def test_gpu_tier_fuzz_cases_cover_every_family_and_switch_and_each_checks_specs(capsys):
    """The fuzz step of scripts/gpu_tier.sh: every family, every direct variant, col2im's two
    algorithms, the TMA implicit GEMM in all four layouts and the WGMMA kernel with ping-pong and
    split-K (tiles the default tiles would not take together); and each case draws specs its kernel
    takes, checked here on the CPU rather than found out as a failed step after a device call."""
    import re
    import shlex
    from pathlib import Path

    from codegen.families import FAMILIES, direct

    script = (Path(__file__).resolve().parent.parent / "scripts" / "gpu_tier.sh").read_text()
    cases = [shlex.split(line) for line in re.search(r'FUZZ_CASES="([^"]*)"', script).group(1).splitlines()]
    assert {case[0] for case in cases} == set(FAMILIES)
    tiles = {(case[0], arg) for case in cases for arg in case if "=" in arg}
    assert {("direct", f"variant={v}") for v in direct.VARIANTS} <= tiles
    assert {("col2im", f"algorithm={a}") for a in ("gather", "scatter")} <= tiles
    tma_layouts = {case[case.index("--layout") + 1] for case in cases if "tma=true" in case}
    assert tma_layouts == {"NCHW", "NHWC", "NCDHW", "NDHWC"}
    assert {("implicit_gemm", f) for f in ("wgmma=true", "pingpong=true", "split_k=3")} <= tiles
    for case in cases:
        assert main(["fuzz", *case, "--examples", "2", "--seed", "0"]) == 0, case
        assert "no failing spec in 2 checked;" in capsys.readouterr().out, case


def test_run_reports_tflops_for_convolutions_and_gb_per_second_for_transforms():
    from codegen.api import plan
    from codegen.cli import rate

    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=4, k=8, input_size=10, filter_size=3, padding=1)
    flops = 2 * (2 * 10 * 10) * 8 * (4 * 9)
    assert rate(plan("implicit_gemm", spec), 1e-6) == f"{flops / 1e-6 / 1e12:.2f} TFLOP/s (2 x multiply-adds, padding taps included)"
    assert rate(plan("direct", spec), 1e-6).endswith("TFLOP/s (2 x multiply-adds, padding taps included)")
    moved = (2 * 10 * 10 * 4 + 36 * 200) * 4
    assert rate(plan("im2col", spec), 1e-6) == f"{moved / 1e-6 / 1e9:.1f} GB/s (bytes read once + written once)"


def test_bench_conv_table_says_where_im2win_meets_cudnns_memory():
    """The im2win column held to cuDNN's extra memory: the heuristic's own figure where it fits,
    the held kernel's where a smaller chunk does, what one image needs where nothing does, and a
    summary line that counts them."""
    from codegen.bench.conv import format_table

    def row(layer, variant, tflops, extra, **more):
        return {"family": "im2win", "variant": variant, "layer": layer, "layout": "NHWC", "ablation": None,
                "ms": 1.0, "tflops": tflops, "speedup_vs_cudnn": tflops / 40, "extra_bytes": extra << 20,
                "cudnn_tflops": 40.0, "cudnn_extra_bytes": 200 << 20, **more}

    text = format_table([
        row("conv5", "heuristic", 30.0, 100), row("conv5", "within cuDNN", 30.0, 100, same_as_heuristic=True),
        row("conv9", "heuristic", 30.0, 284), row("conv9", "within cuDNN", 27.2, 142),
        row("conv4", "heuristic", 32.0, 332),
        {key: value for key, value in row("conv4", "within cuDNN", 0, 0).items()
         if key not in ("ms", "tflops", "speedup_vs_cudnn", "extra_bytes")}
        | {"skipped": "im2win needs at least 297 MiB", "least_extra_bytes": 297 << 20}])
    assert "needs 297 MiB" in text
    lines = text.splitlines()
    assert lines[1].split() == ["layer", "layout", "cuDNN", "im2win", "(<=cuDNN", "MiB)"]
    assert lines[3].split()[3:] == ["30.0", "(0.75)", "30.0", "(0.75)"]
    assert lines[4].split()[3:] == ["30.0", "(0.75)", "27.2", "(0.68)"]
    assert lines[5].split()[3:] == ["32.0", "(0.80)", "needs", "297", "MiB"]
    memory = lines[lines.index("extra device memory, MiB") + 3:][:3]
    assert [m.split()[3:] for m in memory] == [["100.0", "100.0"], ["284.0", "142.0"], ["332.0", "-"]]
    assert lines[-1] == ("(<=cuDNN MiB): im2win at or below cuDNN's extra memory on 1 of 3 layers as the heuristic "
                         "runs it, on 1 more with a smaller batch chunk at 0.91x the heuristic's speed; on 1 even "
                         "one image's window tensor needs more (the 'needs' figure)")
