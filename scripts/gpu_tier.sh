#!/usr/bin/env bash
# One device call: the GPU test tier, a compute-sanitizer pass, the demo, the emitted self-tests
# and the benchmarks.  Logs are packed into $OUT/logs.tgz (or ./gpu-out), benchmark JSON and PNG
# stay beside it, and a short summary is printed last.
# When to use it: on a machine with a GPU, after a change to a template, a family or the compile
# path, and before figures go into docs/perf.md.  Run it from the repository's root: it puts the
# tree on PYTHONPATH itself, so a copy of the tree works without installing the package.
# Example: OUT=gpu-out BENCHES="conv stress-tma" bash scripts/gpu_tier.sh quick
# Usage (repo root): bash scripts/gpu_tier.sh [quick|tests|bench|full|--help]
#   quick: 30 examples per property test, the benchmarks in $BENCHES only (default none);
#   tests: 300 examples, no benchmarks; bench: sanitizer, demo, self-tests and benchmarks only;
#   full: everything.  TESTS_K selects GPU tests (pytest -k); BENCHES lists the benchmarks to run
#   (im2col col2im direct conv conv-last stress-tma fuzz tune-refresh; conv-last is bench conv on
#   NHWC and NDHWC without the ablation, with the TMA implicit GEMM; stress-tma launches every TMA
#   kernel on the benchmark layers again and again, checked each time (scripts/stress_tma.py, a race
#   detector); fuzz runs `convgen fuzz` on every family and switch in FUZZ_CASES, $FUZZ_EXAMPLES
#   specs each (default 200), $JOBS at a time; tune-refresh re-times the records of
#   docs/tuning-h100.json that a template change retired, writes $OUT/tuning-h100.json and leaves
#   the refreshed database to the benchmarks listed after it); BENCH_ARGS are passed to every
#   `convgen bench`; TEST_TIMEOUT is
#   each GPU test's limit in seconds (default 420).  NVRTC compiles every example, so 300 examples
#   of the whole tier do not fit one 600-s device call: on the H100 with JOBS=16 all but the 3D
#   register-switch test finished in 570 s (the slowest 413 s); that one needs 440 s on its own
#   (TESTS_K='register_switches and 3').  Even at 120 examples the 2D one can outrun 420 s among 16
#   jobs (it took 320 s alone: TEST_TIMEOUT=560 TESTS_K='register_switches and 2').
set -u
mode=${1:-full}
case $mode in quick|tests|bench|full) ;; -h|--help) sed -n '2,/^set -u$/s/^# \{0,1\}//p' "$0"; exit 0 ;; *) echo "gpu_tier.sh: mode '$mode' is not one of quick, tests, bench, full" >&2; exit 2 ;; esac
out=${OUT:-gpu-out}
logs=${LOGS:-$(mktemp -d)}  # LOGS=$OUT/logs keeps partial logs when the call runs out of time
mkdir -p "$out" "$logs"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CONVGEN_CACHE_DIR=${CONVGEN_CACHE_DIR:-/tmp/convgen-cache}
examples=${CONVGEN_GPU_EXAMPLES:-300}; [ "$mode" = quick ] && examples=30
benches=${BENCHES-im2col col2im direct conv conv-last stress-tma fuzz}; [ "$mode" = quick ] && benches=${BENCHES:-}
export CONVGEN_GPU_EXAMPLES=$examples
summary=()
step() {  # step NAME LOGFILE COMMAND...: run, keep the log, remember status and wall time
    local name=$1 log=$2; shift 2
    local start=$SECONDS
    "$@" >"$logs/$log" 2>&1
    local rc=$?
    summary+=("$(printf '%-30s rc=%-3s %5ss  %s' "$name" "$rc" "$((SECONDS - start))" "$(tail -n 1 "$logs/$log" | cut -c1-100)")")
    return $rc
}
FUZZ_CASES="im2col
im2col --tile vectorized=false
col2im --tile algorithm=gather
col2im --tile algorithm=scatter
col2im --tile channels=4
col2im --dtype bf16 --stride 2
direct --tile variant=basic
direct --tile variant=constant
direct --tile variant=tiled_halo
direct --tile variant=tiled_cache
direct --tile variant=tiled_register
direct --tile variant=tiled_tma --stride 1
implicit_gemm
implicit_gemm --tile precomp=false
implicit_gemm --tile tma=true --layout NHWC
implicit_gemm --tile tma=true --layout NDHWC
implicit_gemm --tile tma=true --layout NCHW
implicit_gemm --tile tma=true --layout NCDHW
implicit_gemm --dtype bf16
implicit_gemm --dtype fp16
implicit_gemm --math tf32
implicit_gemm --math 3xtf32
implicit_gemm --math 3xtf32 --layout NDHWC --tile wgmma=true
implicit_gemm --dtype bf16 --layout NHWC --tile wgmma=true --tile pingpong=true
implicit_gemm --math tf32 --layout NDHWC --tile wgmma=true --tile split_k=3
implicit_gemm --dtype bf16 --layout NHWC --tile wgmma=true --tile split_k=3
implicit_gemm --dtype bf16 --layout NHWC --tile wgmma=true --tile cluster_m=2
implicit_gemm --dtype bf16 --layout NDHWC --tile wgmma=true --c 64
im2win
im2col_gemm"
fuzz_matrix() {  # `convgen fuzz` on every case of FUZZ_CASES, each its own process with its own log
    rm -f "$logs"/fuzz_*.log
    printf '%s\n' "$FUZZ_CASES" | xargs -P "${JOBS:-6}" -I{} sh -c 'python3 -m codegen fuzz $1 --examples '"${FUZZ_EXAMPLES:-200}"' \
        >"$2/fuzz_$(echo "$1" | tr -c "A-Za-z0-9_\n" "_").log" 2>&1' _ {} "$logs"
    local log clean=0 total=0
    for log in "$logs"/fuzz_*.log; do
        total=$((total + 1))
        head -n 1 "$log" | sed 's/: [0-9]* examples, checking the [^;]*;/;/'
        if grep -q '^no failing spec' "$log"; then clean=$((clean + 1)); tail -n 1 "$log" | sed 's/^/    /'
        else grep -A 4 -E '^FAIL|error:' "$log" | sed 's/^/    /' || tail -n 3 "$log"; fi
    done
    echo "$clean of $total fuzz searches found no failing spec (${FUZZ_EXAMPLES:-200} examples each)"
    [ "$clean" -eq "$total" ]
}
gpu_tests() {  # each GPU test in its own process, $JOBS (default 6) at a time: NVRTC compiles per example dominate
    rm -f "$logs"/gpu-tests_*.log  # a reused $LOGS must not count an earlier call's tests
    python3 -m pytest -m gpu -q --collect-only -p no:cacheprovider ${TESTS_K:+-k "$TESTS_K"} tests/test_gpu*.py \
        | grep '::' >"$logs/gpu-ids.txt"
    xargs -P "${JOBS:-6}" -I{} sh -c 'timeout '"${TEST_TIMEOUT:-420}"' python3 -m pytest -x -q -p no:cacheprovider --hypothesis-show-statistics "$1" \
        >"$2/gpu-$(echo "$1" | tr -c "A-Za-z0-9_\n" "_").log" 2>&1' _ {} "$logs" <"$logs/gpu-ids.txt"
    local passed failed timed_out
    passed=$(cat "$logs"/gpu-tests_*.log | grep -o -E '^[0-9]+ passed' | awk '{s+=$1} END {print s+0}')
    failed=$(grep -L -E "^[0-9]+ passed" "$logs"/gpu-tests_*.log | wc -l)
    timed_out=$(find "$logs" -name 'gpu-tests_*.log' -empty | wc -l)  # killed by timeout before pytest reported
    grep -h -E '^tests/|passing,' "$logs"/gpu-tests_*.log
    echo "$passed passed, $failed failed (tests; $timed_out of them timed out after ${TEST_TIMEOUT:-420} s)," \
        "$examples examples per property test"
    [ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$logs/device.txt" 2>&1
if [ "$mode" != bench ]; then
    step "pytest -m gpu" gpu-tests.log gpu_tests
fi
if [ "$mode" = full ] || [ "$mode" = bench ]; then
    step "compute-sanitizer memcheck" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 \
        python3 -m codegen demo --out /tmp/demo-san
    step "demo" demo.log python3 -m codegen demo --out /tmp/demo
    step "emitted self-tests (nvcc)" selftest.log bash -c \
        'for f in /tmp/demo/*.cu; do flags=$(sed -n "s|^//   nvcc \(.*\) -DCONVGEN_SELFTEST .*|\1|p" "$f")
             nvcc $flags -O3 -DCONVGEN_SELFTEST -DCONVGEN_BENCH "$f" -o /tmp/st && /tmp/st || exit 1; done'
fi
if [ "$mode" != tests ]; then
    for bench in $benches; do
        if [ "$bench" = tune-refresh ]; then
            export CONVGEN_TUNING_DB="$logs/tuning.json"
            step "tune --refresh" tune-refresh.log bash -c 'python3 -m codegen tune --import docs/tuning-h100.json \
                && python3 -m codegen tune --refresh && python3 -m codegen tune --export "$0/tuning-h100.json"' "$out"
            continue
        fi
        if [ "$bench" = fuzz ]; then
            step "fuzz every family" fuzz.log fuzz_matrix
            continue
        fi
        if [ "$bench" = stress-tma ]; then
            step "stress TMA kernels" stress-tma.log python3 scripts/stress_tma.py --out "$out"
            continue
        fi
        args=("$bench"); [ "$bench" = conv-last ] && args=(conv --layouts NHWC NDHWC --no-ablation)
        # shellcheck disable=SC2086
        step "bench $bench" "bench-$bench.log" python3 -m codegen bench "${args[@]}" --out "$out" ${BENCH_ARGS:-}
    done
fi
tar czf "$out/logs.tgz" -C "$logs" .
[ -f "$logs/demo.log" ] && { echo "== demo"; cat "$logs/demo.log"; }
for f in tune-refresh.log bench-im2col.log bench-col2im.log bench-direct.log bench-conv.log bench-conv-last.log stress-tma.log fuzz.log; do
    [ -f "$logs/$f" ] && { echo; echo "== $f"; grep -v '^\[' "$logs/$f"; }
done
echo; echo "== GPU tier summary ($mode)"; cat "$logs/device.txt"
printf '%s\n' "${summary[@]}"
