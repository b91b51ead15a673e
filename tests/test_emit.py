"""Standalone emission: the catalogue in generated/ is fresh, and every emitted file builds with nvcc."""
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from codegen import catalogue, precision, render
from codegen.api import plan
from codegen.compile import compiler_fingerprint, options_for
from codegen.families import get_family
from codegen.families.direct import convolution_reference
from codegen.emit import SELFTEST_BUDGET, build_flags, emit, emit_source, powers_of_two, selftest_stride
from codegen.spec import ConvSpec, DType, SpecError, replace

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
NVCC_FLAGS = ["-Werror", "all-warnings", "-DCONVGEN_SELFTEST", "-DCONVGEN_BENCH", "-c"]


def test_catalogue_is_fresh():
    stale = catalogue.stale_files()
    assert not stale, f"generated/ is stale ({len(stale)} files, e.g. {stale[0]}): run 'convgen catalogue'"


def entry_named(entries, name: str):
    return next(e for e in entries if e.name == name)


def test_catalogue_covers_every_benchmark_layer_and_layout():
    names = {(e.family, e.name) for e in catalogue.entries()}
    tma = {name for family, name in names if name.endswith("_tma") and family == "implicit_gemm"}
    tensor = {name for family, name in names if name.endswith(("_bf16", "_tf32")) and family == "implicit_gemm"}
    wgmma = {name for family, name in names if name.endswith("_wgmma") and family == "implicit_gemm"}
    assert len(names) == 12 * 2 * 3 + 4 * 6 + 4 * 2 + 16 * 2 + 16 + len(tma) + len(tensor) + len(wgmma)
    assert len(tensor) == 16 * 2 and {"conv4_nhwc_bf16", "conv4_nhwc_tf32", "c3d_conv2_ndhwc_bf16"} <= tensor
    # the WGMMA variant where it takes the layer: every channels-last one but the C = 3 stems (conv1-3, conv7)
    stems = ("conv1_", "conv2_", "conv3_", "conv7_")
    assert wgmma == {f"{name}_wgmma" for name in tensor if not name.startswith(stems)} and len(wgmma) == 12 * 2
    assert entry_named(catalogue.entries(), "conv12_nhwc_tf32_wgmma").tiles["pingpong"]
    assert all("_nhwc_" in name or "_ndhwc_" in name for name in tensor)   # channels-last only
    specs = {e.name: e.spec for e in catalogue.entries() if e.family == "implicit_gemm"}
    assert specs["conv4_nhwc_bf16"] == replace(specs["conv4_nhwc"], dtype="bfloat16")
    assert specs["conv4_nhwc_tf32"] == replace(specs["conv4_nhwc"], math="tf32")
    assert {"conv8_nhwc_tma", "conv4_nhwc_tma", "c3d_conv2_ndhwc_tma"} <= tma and len(tma) == 12 + 7  # C a multiple of 4
    # gather_pays: the seven channels-first layers where the gathered kernel won on the H100 (GEMM v17)
    assert {f"{name}_nchw_tma" for name in ("conv5", "conv6", "conv8", "conv10")} <= tma
    assert {f"{name}_ncdhw_tma" for name in ("c3d_conv2", "c3d_conv3", "unet3d_l1")} <= tma
    assert not {"conv4_nchw_tma", "conv9_nchw_tma", "conv11_nchw_tma", "conv12_nchw_tma", "unet3d_down_ncdhw_tma"} & tma
    assert ("implicit_gemm", "c3d_conv2_ndhwc") in names and ("im2win", "conv4_nchw") in names
    assert ("im2col", "conv4_nchw") in names and ("col2im", "conv12_nhwc_scatter") in names
    assert ("direct", "filter_r4_constant") in names and ("direct", "c3d_conv2_ndhwc") in names
    assert ("direct", "filter_r4_tiled_tma") in names


def test_emitted_file_is_self_describing(tmp_path):
    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=3, k=1, input_size=(8, 8), filter_size=3, padding=1, dpitch=4)
    path = emit("im2col", spec, tmp_path / "a.cu", launcher="my_im2col")
    text = path.read_text()
    assert spec.describe() in text
    assert 'extern "C" cudaError_t my_im2col(const float* x, float* col, cudaStream_t stream)' in text
    assert "#ifdef CONVGEN_SELFTEST" in text and "int main()" in text
    assert "#include <cuda_runtime.h>" in text and text.count("#include") == 6
    assert emit_source("im2col", spec, launcher="my_im2col", file_name="a.cu") == text


def test_bench_timer_counts_flops_for_convolutions_and_bytes_for_transforms():
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=3, k=4, input_size=(9, 8), filter_size=3, padding=1)
    conv = emit_source("implicit_gemm", spec, file_name="c.cu")
    flops = 2 * 2 * 4 * 9 * 8 * 3 * 9     # 2 * N*K*OH*OW * C*R*S
    assert f"%.2f TFLOP/s ({flops} FLOPs)" in conv and f"{flops}.0 / (median * 1e9)" in conv
    transform = emit_source("im2col", spec, file_name="t.cu")
    moved = (2 * 3 * 9 * 8 + 27 * 2 * 9 * 8) * 4   # image read once, column matrix written once
    assert f"%.1f GB/s ({moved} bytes)" in transform and "TFLOP/s" not in transform
    for text in (conv, transform):
        assert text.index("#ifdef CONVGEN_BENCH") > text.index("#ifdef CONVGEN_SELFTEST")
        timer = text.index("    if (!failures) {")   # timed only once the check passed,
        assert text.index("elements wrong") < timer < text.index("cudaFree(")   # after its verdict is printed


def _nvcc(path, out_dir):
    result = subprocess.run([NVCC, *build_flags(path.read_text()), *NVCC_FLAGS, str(path), "-o", str(out_dir / (path.stem + ".o"))],
                            capture_output=True, text=True)
    return path, result.returncode, result.stderr


def _build_all(paths, tmp_path) -> None:
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda p: _nvcc(p, tmp_path), paths))
    failed = [(str(p), err) for p, rc, err in results if rc != 0 or err.strip()]
    assert not failed, failed[0]


def kernel_paths(entries: list) -> list:
    """One catalogue entry per way through the templates: family, layout, precision and the tiles'
    switches (variants, tma, precomp, ...); the entries beside it differ only in sizes."""
    first = {}
    for entry in entries:
        switches = tuple(sorted((k, v) for k, v in (entry.tiles or {}).items() if isinstance(v, (bool, str))))
        first.setdefault((entry.family, entry.spec.layout, entry.spec.dtype, entry.spec.math, switches), entry)
    return list(first.values())


@needs_nvcc
def test_a_catalogue_file_of_each_kernel_path_builds_with_nvcc_without_warnings(tmp_path):
    """The CPU tier's share of the catalogue build (28 of some 200 files, each path through the
    templates once); --run-slow builds every file."""
    chosen = kernel_paths(catalogue.entries())
    assert {e.family for e in chosen} == {e.family for e in catalogue.entries()} and len(chosen) >= 20
    _build_all([entry.path for entry in chosen], tmp_path)


@needs_nvcc
@pytest.mark.slow
def test_every_catalogue_file_builds_with_nvcc_without_warnings(tmp_path):
    _build_all([entry.path for entry in catalogue.entries()], tmp_path)


@needs_nvcc
@pytest.mark.parametrize("family, tiles", [("im2col", None), ("im2col", {"vectorized": False}),
                                           ("col2im", {"algorithm": "gather"}), ("col2im", {"algorithm": "scatter"})])
def test_3d_and_pitched_emission_builds(tmp_path, family, tiles):
    spec = ConvSpec(dims=3, layout="NDHWC", n=1, c=5, k=1, input_size=(4, 6, 7), filter_size=(2, 3, 3),
                    stride=(1, 2, 1), padding=1, dilation=(2, 1, 1), dpitch=8)
    path = emit(family, spec, tmp_path / "k3d.cu", tiles)
    _, rc, err = _nvcc(path, tmp_path)
    assert rc == 0 and not err.strip(), err


@needs_nvcc
def test_tma_implicit_gemm_emission_encodes_both_maps_and_builds_with_its_selftest(tmp_path):
    """The launcher encodes the image's im2col map (corners, traversal strides, 128-byte swizzle) and
    the workspace's tiled map per call, transposes the filter into the caller's workspace, then
    launches the TMA kernel; the file and its self-test build without warnings."""
    spec = ConvSpec(dims=3, layout="NDHWC", n=2, c=36, k=41, input_size=(5, 7, 9), filter_size=(2, 3, 3),
                    stride=(1, 2, 1), padding=(0, 1, 1), dilation=(2, 1, 1), dpitch=40)
    path = emit("implicit_gemm", spec, tmp_path / "tma.cu", {"tma": True})
    text = path.read_text()
    assert "float* y, float* wt, cudaStream_t stream)" in text
    assert "const int lower[] = {-1, -1, 0};" in text and "const int upper[] = {-1, -1, -2};" in text
    assert "const cuuint32_t element_strides[] = {1, 1, 2, 1, 1};" in text
    assert "cuTensorMapEncodeIm2col" in text and "CU_TENSOR_MAP_SWIZZLE_128B" in text
    launches = [line.split("<<<")[0].strip() for line in text.splitlines() if "<<<" in line]
    assert len(launches) == 2 and launches[0] == launches[-1] + "_filter"
    assert text.index("convgen_encode_im2col_map(&x_map") < text.index("convgen_encode_map(&wt_map") < text.index("<<<")
    _, rc, err = _nvcc(path, tmp_path)
    assert rc == 0 and not err.strip(), err


@needs_nvcc
def test_channels_first_tma_emission_passes_the_image_and_builds_with_its_selftest(tmp_path):
    """Channels-first, the TMA kernel gathers A itself: the launcher encodes only the workspace's
    tiled map and passes the image pointer after it; the file and its self-test build without
    warnings."""
    spec = ConvSpec(dims=2, layout="NCHW", n=2, c=40, k=70, input_size=(11, 13), filter_size=3, stride=(2, 1),
                    padding=(1, 2))
    path = emit("implicit_gemm", spec, tmp_path / "gather.cu", {"tma": True})
    text = path.read_text()
    assert "cuTensorMapEncodeIm2col" not in text and "convgen_encode_map(&wt_map" in text
    assert "(wt_map, x, y)" in text and "cp.async.mbarrier.arrive.noinc" in text
    _, rc, err = _nvcc(path, tmp_path)
    assert rc == 0 and not err.strip(), err


def _innermost_fma_loops(ptx: str) -> list[list[str]]:
    """The bodies of the PTX loops that hold FMAs and no inner loop, registers and labels unnumbered."""
    lines = [line.strip() for line in ptx.splitlines() if not line.strip().startswith(".loc")]
    starts = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\$L__BB\d+_\d+:", line)}
    loops = []
    for end, line in enumerate(lines):
        target = re.search(r"bra(?:\.uni)?\s+(\$L__BB\d+_\d+);", line)
        if target and starts.get(target.group(1), end) < end:
            loops.append((starts[target.group(1)], end))
    innermost = [(a, b) for a, b in loops if not any(a < c and d < b for c, d in loops)]
    return [[re.sub(r"%(r|rd|f|p)\d+", r"%\1", re.sub(r"\$L__BB\d+_\d+", "L", line)) for line in lines[a:b + 1]]
            for a, b in innermost if sum("fma.rn.f32" in line for line in lines[a:b + 1]) >= 64]


def _nvcc_release() -> str:
    return re.search(r"V(\d+\.\d+\.\d+)", subprocess.run([NVCC, "--version"], capture_output=True, text=True).stdout).group(1)


@needs_nvcc
def test_tma_main_loop_is_the_same_ptx_from_nvcc_as_from_nvrtc(tmp_path):
    """The TMA kernel addresses shared memory by 32-bit shared addresses (GEMM v21). Through pointers,
    nvcc formed those addresses in 32 bits and NVRTC in 64, ptxas allocated the FMA loop's registers
    differently, and the emitted conv4 NHWC file built with nvcc ran 8 % slower than the package's
    NVRTC build of the same kernel. Now both compilers hand ptxas the same main loop."""
    from cupy_backends.cuda.libs import nvrtc

    release = _nvcc_release()
    if not compiler_fingerprint().endswith(release):
        pytest.skip(f"nvcc {release} and {compiler_fingerprint()} differ: their PTX may differ for other reasons")
    entry = next(e for e in catalogue.entries() if e.family == "implicit_gemm" and e.name == "conv4_nhwc_tma")
    program = nvrtc.createProgram(render.render_kernels(plan(entry.family, entry.spec, entry.tiles, "sm_90a")).code,
                                  "package.cu", [], [])
    try:
        nvrtc.compileProgram(program, list(options_for("sm_90a")))   # exactly as the package compiles it
        package = nvrtc.getPTX(program).rstrip(b"\0").decode()
    finally:
        nvrtc.destroyProgram(program)
    emitted = tmp_path / "emitted.ptx"
    subprocess.run([NVCC, *build_flags(entry.path.read_text()), "-ptx", str(entry.path), "-o", str(emitted)], check=True)
    assert not re.search(r"ld\.shared\S*\s+\{[^}]*\},\s*\[%rd", package)   # no 64-bit shared address
    package_loops, emitted_loops = _innermost_fma_loops(package), _innermost_fma_loops(emitted.read_text())
    assert len(package_loops) == 2   # the whole tiles' kernel and the stream-K tail's
    assert package_loops == emitted_loops


@needs_nvcc
def test_register_split_emission_names_sm_90a_and_builds(tmp_path):
    """A TMA kernel whose producer warpgroup hands its registers to the consumers (setmaxnreg) is
    arch-specific: the emitted file's build line names sm_90a (one -gencode pair) for an sm_90
    target, and it builds so, with two im2col copies per slice for its 512-pixel tile."""
    spec = ConvSpec(dims=2, layout="NHWC", n=2, c=16, k=64, input_size=(20, 20), filter_size=3, padding=1)
    tiles = {"tma": True, "thread_m": 16, "warp_m": 64, "block_m": 512, "block_n": 64, "stages": 3}
    path = emit("implicit_gemm", spec, tmp_path / "split.cu", tiles, arch="sm_90")
    text = path.read_text()
    assert build_flags(text) == ["-gencode", "arch=compute_90a,code=sm_90a"]
    assert "nvcc -gencode arch=compute_90a,code=sm_90a -DCONVGEN_SELFTEST" in text
    assert "setmaxnreg.dec.sync.aligned.u32 40" in text and "setmaxnreg.inc.sync.aligned.u32 232" in text
    assert "for (int box = 0; box < 2; ++box)" in text
    _, rc, err = _nvcc(path, tmp_path)
    assert rc == 0 and not err.strip(), err


@needs_nvcc
def test_chunked_im2win_emits_a_launch_loop_that_builds(tmp_path):
    spec = ConvSpec(dims=2, layout="NCHW", n=6, c=3, k=5, input_size=(11, 9), filter_size=3, stride=2, padding=1)
    path = emit("im2win", spec, tmp_path / "chunked.cu", {"batch_chunk": 2})
    text = path.read_text()
    assert "for (unsigned long long chunk = 0; chunk < 3ULL; ++chunk)" in text
    assert "x + chunk * 594ULL" in text and "y + chunk * 300ULL" in text
    assert "run 3 times, once per batch chunk of 2 images" in text
    _, rc, err = _nvcc(path, tmp_path)
    assert rc == 0 and not err.strip(), err


def test_selftest_stride_keeps_the_reference_within_budget():
    assert selftest_stride(1000, 1) == 1
    assert selftest_stride(SELFTEST_BUDGET, 1) == 1
    stride = selftest_stride(12_845_056, 128 * 27)     # im2win c3d_conv3: 4.4e10 multiply-adds
    assert stride % 2 == 1 and stride == 83
    assert 12_845_056 * 3456 / stride <= SELFTEST_BUDGET
    assert selftest_stride(SELFTEST_BUDGET + 1, 1) == 3  # odd, never 2


def test_large_selftest_samples_the_reference_but_checks_every_element_was_written():
    large = ConvSpec(dims=3, layout="NCDHW", n=8, c=128, k=256, input_size=(8, 28, 28), filter_size=3, padding=1)
    text = emit_source("implicit_gemm", large)
    assert "if ((begin + j) % 83)" in text and "std::isnan(got[j])" in text
    assert "compares 1 in 83 output elements" in text and "44,392,513,536 multiply-adds" in text
    small = ConvSpec(dims=2, layout="NCHW", n=1, c=3, k=4, input_size=(9, 9), filter_size=3)
    small_text = emit_source("implicit_gemm", small)
    assert "% 83" not in small_text and "compared with the reference" not in small_text
    assert "compares every output element with reference_at()" in small_text


TENSOR_CORE_PRECISIONS = [("bfloat16", "fma"), ("float16", "fma"), ("float32", "tf32"), ("float32", "3xtf32")]
POINTER_TYPES = {"bfloat16": "__nv_bfloat16", "float16": "__half", "float32": "float"}
HEADERS = {"bfloat16": "cuda_bf16.h", "float16": "cuda_fp16.h"}


def _tensor_core_spec(layout: str, dtype: str, math_mode: str) -> ConvSpec:
    """A small spec with padding, a stride, tails on every GEMM axis and element-wise loads (C = 5)."""
    return ConvSpec(dims=2, layout=layout, n=2, c=5, k=12, input_size=(11, 13), filter_size=3, stride=(2, 1),
                    padding=1, dtype=dtype, math=math_mode)


def _constants(text: str) -> dict:
    return {name: float(value) for name, value in re.findall(r"static const double convgen_(\w+) = ([^;]+);", text)}


@pytest.mark.parametrize("dtype, math_mode", TENSOR_CORE_PRECISIONS)
@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
def test_tensor_core_file_takes_its_element_type_and_states_its_precision(layout, dtype, math_mode):
    """The launcher takes pointers of the dtype's C type (with its toolkit header), the header says the
    precision, and the self-test holds outputs to precision.py's bound with precision.py's constants."""
    spec = _tensor_core_spec(layout, dtype, math_mode)
    text = emit_source("implicit_gemm", spec, launcher="conv", file_name="t.cu")
    c_type = POINTER_TYPES[dtype]
    assert c_type == DType(dtype).c_type
    signature = f'extern "C" cudaError_t conv(const {c_type}* x, const {c_type}* w, {c_type}* y, cudaStream_t stream)'
    assert signature in text
    assert f"// Host API: conv(const {c_type}* x, const {c_type}* w, {c_type}* y, cudaStream_t stream)" in text
    if dtype in HEADERS:
        assert f"#include <cuda_runtime.h>\n#include <{HEADERS[dtype]}>\n" in text
        assert f"C-contiguous {dtype} ({c_type} of {HEADERS[dtype]}) arrays" in text
    else:
        assert "cuda_bf16.h" not in text and "cuda_fp16.h" not in text and "C-contiguous float32 arrays" in text
    precision_line = next(line for line in text.splitlines() if line.startswith("// Precision: "))
    assert f"{dtype} x, w and y" in precision_line and "accumulated in FP32" in precision_line
    assert "E + u_out (|y*| + E) + eta_out" in precision_line and "E = (e_mul + e_acc P L) S" in precision_line
    roundoff = precision.unit_roundoff(spec.dtype, spec.math)
    assert _constants(text) == {"e_mul": roundoff.product, "e_acc": roundoff.accumulation,
                                "products_per_term": roundoff.products_per_term, "terms": 5 * 9,
                                "u_out": roundoff.output, "eta_out": roundoff.output_absolute}
    assert "1e-4f * (1.0f + std::fabs(want))" not in text and "convgen_bound(want, magnitude)" in text
    assert "sizeof(float)" not in text if dtype != "float32" else "sizeof(__" not in text


def test_float32_fma_files_keep_their_fixed_tolerance():
    spec = _tensor_core_spec("NHWC", "float32", "fma")
    text = emit_source("implicit_gemm", spec, launcher="conv")
    assert "1e-4f * (1.0f + std::fabs(want))" in text
    assert "// Precision:" not in text and "convgen_bound" not in text and "convgen_e_mul" not in text


def test_error_model_constants_read_as_powers_of_two():
    assert powers_of_two(2.0**-23) == "2^-23" and powers_of_two(0.0) == "0"
    assert powers_of_two(2.0**-10 + 2.0**-22) == "2^-10 + 2^-22"
    assert powers_of_two(0.1) == "0.1"


@pytest.mark.parametrize("arch", ["sm_75"])
def test_tensor_core_files_are_refused_before_sm_80(arch):
    spec = _tensor_core_spec("NHWC", "bfloat16", "fma")
    with pytest.raises(SpecError) as refused:
        emit_source("implicit_gemm", spec, arch=arch)
    assert refused.value.field == "arch" and "sm_80" in str(refused.value)
    assert build_flags(emit_source("implicit_gemm", spec, arch="sm_80")) == ["-arch=sm_80"]


@needs_nvcc
def test_tensor_core_files_build_with_nvcc_without_warnings(tmp_path):
    """Every dtype and math mode, both layout kinds (element-wise and 16-byte loads), and a 3D
    channels-last spec; the self-test and the timer included, for sm_80 and sm_90."""
    paths = []
    for layout in ("NCHW", "NHWC"):
        for dtype, math_mode in TENSOR_CORE_PRECISIONS:
            spec = _tensor_core_spec(layout, dtype, math_mode)
            paths.append(emit("implicit_gemm", spec, tmp_path / f"{layout}_{dtype}_{math_mode}.cu"))
    wide = ConvSpec(dims=3, layout="NDHWC", n=2, c=16, k=24, input_size=(4, 6, 7), filter_size=(2, 3, 3),
                    padding=1, dtype="bfloat16")
    paths.append(emit("implicit_gemm", wide, tmp_path / "ndhwc_bf16_sm80.cu", arch="sm_80"))
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda p: _nvcc(p, tmp_path), paths))
    failed = [(str(p), err) for p, rc, err in results if rc != 0 or err.strip()]
    assert not failed, failed[0]


DRIVER = """#define main convgen_selftest_main
#include "{name}"
#undef main
#include <cstdio>
// Prints reference_at() and convgen_bound() of every output for the inputs in x.bin and w.bin (float32
// values of the stored inputs): the self-test's oracle, run on the host without a GPU.
int main()
{{
    std::vector<float> x({x}), w({w});
    std::FILE* file = std::fopen("x.bin", "rb");
    if (std::fread(x.data(), sizeof(float), x.size(), file) != x.size()) return 1;
    std::fclose(file);
    file = std::fopen("w.bin", "rb");
    if (std::fread(w.data(), sizeof(float), w.size(), file) != w.size()) return 1;
    std::fclose(file);
    for (long long e = 0; e < {y}LL; ++e) {{
        double magnitude = 0.0;
        const double want = reference_at(x.data(), w.data(), e, &magnitude);
        std::printf("%.17g %.17g\\n", want, convgen_bound(want, magnitude));
    }}
    return 0;
}}
"""


def _oracle(tmp_path, dtype, math_mode):
    spec = _tensor_core_spec("NCHW" if dtype == "float32" else "NHWC", dtype, math_mode)
    folder = tmp_path / f"{dtype}_{math_mode}"
    folder.mkdir()
    path = emit("implicit_gemm", spec, folder / "kernel.cu")
    x, w = get_family("implicit_gemm", spec).make_inputs(spec, np.random.default_rng(7))
    for name, stored in (("x", x), ("w", w)):
        precision.from_storage(stored, spec.dtype).astype(np.float32).tofile(folder / f"{name}.bin")
    (folder / "driver.cu").write_text(DRIVER.format(name=path.name, x=x.size, w=w.size,
                                                    y=plan("implicit_gemm", spec).output.elements))
    built = subprocess.run([NVCC, *build_flags(path.read_text()), "-DCONVGEN_SELFTEST", "driver.cu", "-o", "driver"],
                           cwd=folder, capture_output=True, text=True)
    if built.returncode:
        return spec, x, w, None, built.stderr
    run = subprocess.run(["./driver"], cwd=folder, capture_output=True, text=True)
    return spec, x, w, run.stdout, run.stderr


@needs_nvcc
def test_selftest_oracle_and_bound_are_precision_py_s(tmp_path):
    """The emitted self-test's host reference and bound, built with nvcc and run on the host, give
    precision.py's exact sums and error_bound for the same stored inputs: one error model."""
    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(lambda mode: _oracle(tmp_path, *mode), TENSOR_CORE_PRECISIONS))
    for spec, x, w, out, err in results:
        assert out is not None, err
        printed = np.array([[float(v) for v in line.split()] for line in out.splitlines()])
        x64, w64 = precision.from_storage(x, spec.dtype), precision.from_storage(w, spec.dtype)
        exact = convolution_reference(spec, x64, w64).ravel()
        bound = precision.error_bound(spec, x, w).ravel()
        np.testing.assert_allclose(printed[:, 0], exact, rtol=1e-12, atol=1e-15)
        np.testing.assert_allclose(printed[:, 1], bound, rtol=1e-12, atol=0)
        assert (bound > 0).all()
