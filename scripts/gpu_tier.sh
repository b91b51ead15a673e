#!/usr/bin/env bash
# One device call: the GPU test tier, a compute-sanitizer pass, the demo and the benchmarks.
# Full logs go to $OUT (or ./gpu-out); a short summary table is printed last.
# Usage (repo root): bash scripts/gpu_tier.sh [quick|full]   (full: 300 examples per property test)
set -u
mode=${1:-full}
out=${OUT:-gpu-out}
mkdir -p "$out"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CONVGEN_CACHE_DIR=${CONVGEN_CACHE_DIR:-/tmp/convgen-cache}
examples=300; [ "$mode" = quick ] && examples=30
export CONVGEN_GPU_EXAMPLES=$examples
summary=()
step() {  # step NAME LOGFILE COMMAND...: run, keep the log, remember status and wall time
    local name=$1 log=$2; shift 2
    local start=$SECONDS
    "$@" >"$out/$log" 2>&1
    local rc=$?
    summary+=("$(printf '%-34s rc=%-3s %5ss  %s' "$name" "$rc" "$((SECONDS - start))" "$(tail -n 1 "$out/$log" | cut -c1-90)")")
    return $rc
}
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv >"$out/device.txt" 2>&1
step "pytest -m gpu ($examples ex.)" gpu-tests.log python3 -m pytest -m gpu -q -p no:cacheprovider tests/test_gpu.py --hypothesis-show-statistics
step "compute-sanitizer memcheck" memcheck.log compute-sanitizer --tool memcheck --error-exitcode 9 \
    python3 -m codegen demo --out /tmp/demo-san
step "demo" demo.log python3 -m codegen demo --out /tmp/demo
step "emitted self-tests (nvcc)" selftest.log bash -c 'for f in /tmp/demo/*.cu; do nvcc -arch=sm_90 -DCONVGEN_SELFTEST "$f" -o /tmp/st && /tmp/st || exit 1; done'
if [ "$mode" != quick ]; then
    step "bench im2col" bench-im2col.log python3 -m codegen bench im2col --out "$out"
    step "bench col2im gather" bench-col2im.log python3 -m codegen bench col2im --out "$out"
fi
echo; echo "== demo"; cat "$out/demo.log"
for f in bench-im2col.log bench-col2im.log; do
    [ -f "$out/$f" ] && { echo; echo "== $f"; grep -v '^\[' "$out/$f"; }
done
echo; echo "== GPU tier summary ($mode)"; cat "$out/device.txt"
printf '%s\n' "${summary[@]}"
