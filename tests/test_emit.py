"""Standalone emission: the catalogue in generated/ is fresh, and every emitted file builds with nvcc."""
import os
import re
import shutil
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from codegen import catalogue, render
from codegen.api import plan
from codegen.compile import compiler_fingerprint, options_for
from codegen.emit import SELFTEST_BUDGET, build_flags, emit, emit_source, selftest_stride
from codegen.spec import ConvSpec

NVCC = shutil.which("nvcc")
needs_nvcc = pytest.mark.skipif(NVCC is None, reason="nvcc not installed")
NVCC_FLAGS = ["-Werror", "all-warnings", "-DCONVGEN_SELFTEST", "-DCONVGEN_BENCH", "-c"]


def test_catalogue_is_fresh():
    stale = catalogue.stale_files()
    assert not stale, f"generated/ is stale ({len(stale)} files, e.g. {stale[0]}): run 'convgen catalogue'"


def test_catalogue_covers_every_benchmark_layer_and_layout():
    names = {(e.family, e.name) for e in catalogue.entries()}
    tma = {name for family, name in names if name.endswith("_tma") and family == "implicit_gemm"}
    assert len(names) == 12 * 2 * 3 + 4 * 6 + 4 * 2 + 16 * 2 + 16 + len(tma)
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


@needs_nvcc
def test_every_catalogue_file_builds_with_nvcc_without_warnings(tmp_path):
    paths = [entry.path for entry in catalogue.entries()]
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 2) as pool:
        results = list(pool.map(lambda p: _nvcc(p, tmp_path), paths))
    failed = [(str(p), err) for p, rc, err in results if rc != 0 or err.strip()]
    assert not failed, failed[0]


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
