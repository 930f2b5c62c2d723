#!/usr/bin/env bash
# tests/gpu/run.sh: the one GPU check of the CUDA backend (issue 6).
#
#   tests/gpu/run.sh            (from anywhere; builds in $DITD_GPU_BUILD,
#                                default <repo>/build-gpu)
#
# 1. builds with the CUDA backend (meson setup -Dcuda=enabled -Dwerror=true,
#    ninja);
# 2. runs the meson suite 'gpu': every CUDA op against the CPU backend on
#    fresh random inputs (bounds in tests/gpu/test_cuda_ops.c), the fixture
#    models' forwards against Diffusers float64 and their sampling against
#    the CPU backend (tests/gpu/test_cuda_model.c);
# 2b. runs `ditd generate --device cuda` on a fixture with CUDA graphs on
#    and off (the latents must be bit-identical) and, with 2+ GPUs and
#    mpirun, a --tp-degree 2 group over NCCL;
# 3. prints the tables: DiT-XL/2 forward ms at 256, 1024 and 4096 tokens,
#    batch 1 and 2 (`ditd bench --device cuda`); GEMM TFLOP/s beside plain
#    cuBLAS and attention TFLOP/s (bench_cuda); Diffusers
#    DiTTransformer2DModel bf16 SDPA with and without torch.compile where
#    torch and diffusers import (bench_diffusers.py).
#
# Under 8 minutes on one H200: each step has its own timeout, and a step
# that fails or times out is reported and the later steps still run (the
# exit status is that of the first failure). Needs: an NVIDIA GPU and
# driver, CUDA 13 (nvcc), meson, ninja, pkg-config and the CPU build's
# libraries (README). Logs: $DITD_GPU_BUILD/gpu-logs/.
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=${DITD_GPU_BUILD:-$here/build-gpu}
logs=$build/gpu-logs
status=0
t_start=$(date +%s)

say() { printf '\n== %s (%ds)\n' "$*" "$(( $(date +%s) - t_start ))"; }
die() { echo "run.sh: $*" >&2; exit 1; }
# step NAME SECONDS CMD...: runs CMD under a timeout, logs to $logs/NAME.log,
# remembers the first failure; returns CMD's status (124 = timed out).
step() {
    local name=$1 secs=$2 rc
    shift 2
    set +e
    timeout --foreground --kill-after=10 "$secs" "$@" 2>&1 | tee "$logs/$name.log"
    rc=${PIPESTATUS[0]}
    set -e
    if [ "$rc" -eq 124 ]; then
        echo "run.sh: step '$name' timed out after ${secs}s" >&2
    elif [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
        echo "run.sh: step '$name' failed (exit $rc), log: $logs/$name.log" >&2
    fi
    if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ] && [ "$status" -eq 0 ]; then
        status=$rc
    fi
    return "$rc"
}

# ---- 0. what is here ----
command -v nvidia-smi >/dev/null || die "nvidia-smi not found: this needs an NVIDIA GPU and driver"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader ||
    die "nvidia-smi sees no GPU"
export PATH=$PATH:/usr/local/cuda/bin
command -v nvcc >/dev/null || die "nvcc not found (PATH, /usr/local/cuda/bin): install CUDA 13"
for t in meson ninja pkg-config timeout; do
    command -v "$t" >/dev/null || die "$t not found (the build needs meson, ninja, pkg-config)"
done
missing=""
for p in jansson libpng libuv libmicrohttpd libprotobuf-c; do
    pkg-config --exists "$p" || missing="$missing $p"
done
[ -z "$missing" ] || die "development packages missing:$missing (see README, 'Building')"
mkdir -p "$logs"
nvcc --version | tail -n 2

# ---- 1. build ----
say "build ($build)"
if [ -f "$build/build.ninja" ]; then
    step setup 120 meson setup --reconfigure -Dcuda=enabled -Dwerror=true "$build" "$here" >/dev/null ||
        die "meson setup failed: $logs/setup.log"
else
    step setup 120 meson setup -Dcuda=enabled -Dwerror=true "$build" "$here" >/dev/null ||
        die "meson setup failed: $logs/setup.log"
fi
step build 300 ninja -C "$build" || die "build failed: $logs/build.log"

# ---- 2. the gpu suite ----
say "meson test --suite gpu"
step gpu-suite 240 meson test -C "$build" --suite gpu --print-errorlogs --num-processes 1 || true
cp "$build/meson-logs/testlog.txt" "$logs/gpu-testlog.txt" 2>/dev/null || true
# the tests' own lines (meson keeps their stdout in the test log)
grep -E '^(ok  |FAIL)' "$logs/gpu-testlog.txt" 2>/dev/null || true

# ---- 2b. the commands on the GPU: ditd generate --device cuda ----
# graphs on and off must give the same bits (the same kernels, replayed);
# with 2+ GPUs and mpirun, a tp x ulysses group over NCCL must finish.
say "ditd generate --device cuda (graphs on/off; NCCL group when 2+ GPUs)"
fix=$here/tests/fixtures/models/tiny-p4-c1-h3
if step gen-graphs 60 "$build/ditd" generate --device cuda --model "$fix" --steps 10 -n 2 -q \
        --save-latents "$logs/gen-graphs.npy" &&
   step gen-nographs 60 env DITD_CUDA_GRAPHS=0 "$build/ditd" generate --device cuda --model "$fix" \
        --steps 10 -n 2 -q --save-latents "$logs/gen-nographs.npy"; then
    if cmp -s "$logs/gen-graphs.npy" "$logs/gen-nographs.npy"; then
        echo "ok   graph replay == op by op (bit-identical latents)"
    else
        echo "FAIL graph replay differs from op by op ($logs/gen-*.npy)"
        [ "$status" -ne 0 ] || status=1
    fi
fi
ngpu=$(nvidia-smi -L | grep -c '^GPU' || true)
if [ "$ngpu" -ge 2 ] && command -v mpirun >/dev/null; then
    step gen-nccl 120 mpirun --oversubscribe -np 2 "$build/ditd" generate --device cuda \
        --model "$fix" --steps 10 --tp-degree 2 -q --comm-timeout-ms 20000 \
        --save-latents "$logs/gen-nccl.npy" || true
else
    echo "(fewer than 2 GPUs or no mpirun: the NCCL group run is skipped)"
fi

# ---- 3. tables ----
say "DiT-XL/2 forward, ditd --device cuda (random weights)"
declare -A fwd_ms
for n in 256 1024 4096; do
    for b in 1 2; do
        if step "bench-$n-$b" 90 "$build/ditd" bench --device cuda --config DiT-XL/2 \
            --tokens "$n" --batch "$b" --iters 10 --warmup 2 --no-gemm >/dev/null; then
            # | model | backend | tokens | batch | threads | params | ms (median) | ...
            fwd_ms[$n,$b]=$(awk -F'|' '$3 ~ /cuda/ { gsub(/ /, "", $8); print $8; exit }' \
                "$logs/bench-$n-$b.log")
        else
            fwd_ms[$n,$b]="failed"
        fi
    done
done

say "GEMM and attention TFLOP/s (bench_cuda)"
step bench-cuda 150 "$build/tests/gpu/bench_cuda" || true

say "Diffusers DiTTransformer2DModel, bf16 SDPA, eager and torch.compile"
diff_rc=0
step diffusers 260 env PYTHONUNBUFFERED=1 python3 "$here/tests/gpu/bench_diffusers.py" --budget 170 ||
    diff_rc=$?
[ "$diff_rc" -ne 77 ] || echo "(torch or diffusers not importable: no Diffusers rows)"

say "summary"
echo "| DiT-XL/2 forward | tokens | batch | ms (median) |"
echo "|---|---|---|---|"
for n in 256 1024 4096; do
    for b in 1 2; do
        echo "| ditd cuda (bf16, cuBLASLt + own flash attention) | $n | $b | ${fwd_ms[$n,$b]:-?} |"
    done
done
if [ -f "$logs/diffusers.log" ]; then
    grep -E '^\| Diffusers' "$logs/diffusers.log" || true
fi
echo
echo "gpu suite: $(grep -cE '^ok  ' "$logs/gpu-testlog.txt" 2>/dev/null || true) checks ok," \
     "$(grep -cE '^FAIL' "$logs/gpu-testlog.txt" 2>/dev/null || true) failed" \
     "(details: $logs/gpu-suite.log, $logs/gpu-testlog.txt)"
echo "total $(( $(date +%s) - t_start ))s, exit $status"
exit "$status"
