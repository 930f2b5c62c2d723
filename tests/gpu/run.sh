#!/usr/bin/env bash
# tests/gpu/run.sh: the GPU check of the CUDA backend, in one window of
# about 10 minutes (docs/cuda.md, "The bring-up kit").
#
#   ditd-gpu-bundle/run.sh            prebuilt: the bundle this script sits in
#   tests/gpu/run.sh --prebuilt DIR   prebuilt: an unpacked bundle
#                                     (tests/gpu/bundle.sh makes it)
#   tests/gpu/run.sh --source         builds here first (needs meson, ninja,
#                                     nvcc and ditd's development libraries)
#   options: --out DIR (default $OUT, else ./gpu-logs), --deadline S (600)
#
# Steps, in this order, under one deadline (a step that does not fit is not
# run; the summary table is printed last whatever happens):
#   env           nvidia-smi; the CUDA libraries the bundle needs (toolkit,
#                 ldconfig, the Python nvidia-* wheels: libnccl.so.2 is in
#                 nvidia/nccl/lib); ldd of every binary; glibc (older than
#                 the bundle's: the binaries start through its own loader)
#   ops           test_cuda_ops (every op vs the CPU; failing arrays as .npy
#                 in <out>/ops); after a sticky fault once more with
#                 CUDA_LAUNCH_BLOCKING=1
#   memcheck      compute-sanitizer memcheck on test_cuda_ops (another seed)
#   model         test_cuda_model (fixture forwards vs float64 Diffusers,
#                 samplings vs the CPU)
#   flux          test_cuda_flux (rope and rmsnorm_heads vs the CPU; the FLUX
#                 fixtures' weights bf16 on the device; their forwards vs the
#                 CPU backend and float64 Diffusers)
#   sd3           test_cuda_sd3 (the SD3 fixtures' forwards on the device vs
#                 the CPU's bf16-weight table and float64 Diffusers)
#   memcheck-flux compute-sanitizer memcheck on test_cuda_flux
#   nccl1         test_nccl_one (a one-rank NCCL communicator: splits, every
#                 collective, send/recv to self, fail-stop, finalize)
#   gen-graphs, gen-nographs, graphs-cmp
#                 ditd generate on a fixture with CUDA graphs on and off:
#                 the latents must be identical (cmp) and the graphs used
#   bench-xl      one ditd bench process: DiT-XL/2, 1024 tokens, batch 2
#   bench-kernels bench_cuda: GEMM vs plain cuBLAS, attention TFLOP/s
#   bench-flux    bench_cuda_flux: FLUX.1-dev-width blocks at 1024x1024 (4096
#                 image + 512 text tokens): ms per double / single block and
#                 a projection of the full model
#   racecheck     compute-sanitizer racecheck on the kernels with shared
#                 memory (attention, merge, layernorm), if time is left
#
# Exit: 0 all passed; 1 a step failed; 77 no GPU here (the environment step
# still runs and says why, in seconds).
set -uo pipefail

self=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
# shellcheck source=run_lib.sh
. "$self/run_lib.sh"

mode="" bundle="" out=${OUT:-$PWD/gpu-logs} deadline=${DITD_GPU_DEADLINE:-600}
while [ $# -gt 0 ]; do
    case $1 in
    --prebuilt)
        mode=prebuilt
        shift
        if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then bundle=$1; shift; fi ;;
    --source) mode=source; shift ;;
    --out) out=$2; shift 2 ;;
    --deadline) deadline=$2; shift 2 ;;
    -h | --help) sed -n '2,42p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "run.sh: unknown argument '$1' (--prebuilt [DIR], --source, --out DIR, --deadline S)" >&2; exit 2 ;;
    esac
done
if [ -z "$mode" ]; then
    if [ -x "$self/bin/ditd" ]; then mode=prebuilt; else mode=source; fi
fi
[ "$mode" = prebuilt ] && [ -z "$bundle" ] && bundle=$self
mkdir -p "$out" && out=$(cd "$out" && pwd)
kit_init "$out" "$deadline" 15
kit_trap
echo "ditd GPU check: $mode mode, deadline ${deadline}s, logs in $out"

# ---- where the binaries are ----
here=$(cd "$self/../.." 2>/dev/null && pwd)
if [ "$mode" = prebuilt ]; then
    bundle=$(cd "$bundle" 2>/dev/null && pwd) || { echo "run.sh: no bundle folder '$bundle'" >&2; exit 2; }
    [ -x "$bundle/bin/ditd" ] || { echo "run.sh: $bundle/bin/ditd missing: not a bundle (tests/gpu/bundle.sh)" >&2; exit 2; }
    bin=$bundle/bin fix=$bundle/fixtures own_lib=$bundle/lib
else
    # source mode: build on this machine (it has the development libraries)
    build=${DITD_GPU_BUILD:-$here/build-gpu}
    export PATH=$PATH:/usr/local/cuda/bin
    missing=""
    for t in meson ninja pkg-config nvcc; do command -v "$t" >/dev/null || missing="$missing $t"; done
    for p in jansson libpng libjpeg libwebp libuv libmicrohttpd libprotobuf-c; do
        pkg-config --exists "$p" 2>/dev/null || missing="$missing $p"
    done
    if [ -n "$missing" ]; then
        kit_record build FAIL 0 0 "missing:$missing; use the bundle: tests/gpu/bundle.sh, run.sh --prebuilt"
        kit_summary
        exit 1
    fi
    if [ -f "$build/build.ninja" ]; then cfg=(meson configure "$build"); else cfg=(meson setup "$build" "$here"); fi
    kit_step setup 120 10 "${cfg[@]}" -Dcuda=enabled -Dwerror=true
    if [ "$(kit_result setup)" != PASS ]; then kit_summary; exit 1; fi
    targets=()
    for t in ditd tests/gpu/test_cuda_ops tests/gpu/test_cuda_model tests/gpu/test_cuda_flux tests/gpu/test_cuda_sd3 tests/gpu/bench_cuda tests/gpu/bench_cuda_flux tests/gpu/test_nccl_one; do
        ninja -C "$build" -t query "$t" >/dev/null 2>&1 && targets+=("$t") # test_nccl_one: with NCCL
    done
    kit_step build 300 30 ninja -C "$build" "${targets[@]}"
    if [ "$(kit_result build)" != PASS ]; then kit_summary; exit 1; fi
    bin=$out/bin fix=$here/tests/fixtures own_lib=""
    mkdir -p "$bin"
    for t in "${targets[@]}"; do ln -sf "$build/$t" "$bin/"; done
fi

# ---- env ----
# The folders holding the CUDA libraries a binary needs: LD_LIBRARY_PATH,
# ldconfig, the toolkit, the Python wheels (nvidia/<pkg>/lib).
find_cuda_lib() { # NAME -> a folder, or nothing
    local name=$1 d sp
    local IFS=:
    for d in ${LD_LIBRARY_PATH:-}; do [ -n "$d" ] && [ -e "$d/$name" ] && { echo "$d"; return; }; done
    unset IFS
    d=$(ldconfig -p 2>/dev/null | awk -v n="$name" '$1 == n { print $NF; exit }')
    [ -n "$d" ] && { dirname "$d"; return; }
    for d in ${CUDA_HOME:-} ${CUDA_PATH:-} /usr/local/cuda /usr/local/cuda-* /opt/nvidia/cuda*; do
        for sub in lib64 lib targets/x86_64-linux/lib targets/sbsa-linux/lib; do
            [ -e "$d/$sub/$name" ] && { echo "$d/$sub"; return; }
        done
    done
    for sp in $(python3 -c 'import site, sys
print("\n".join(site.getsitepackages() + [site.getusersitepackages()] + sys.path))' 2>/dev/null | sort -u) \
              /usr/local/lib/python3*/dist-packages /usr/lib/python3/dist-packages /opt/conda/lib/python3*/site-packages; do
        [ -d "$sp" ] || continue
        d=$(find "$sp" -maxdepth 4 -name "$name" -path '*/lib/*' 2>/dev/null | head -n 1)
        [ -n "$d" ] && { dirname "$d"; return; }
    done
}

env_step() {
    local t0 lib dir needs miss="" host_glibc need_glibc gpu note
    t0=$(kit_now)
    echo "== environment ($(date -u +%Y-%m-%dT%H:%M:%SZ), $(uname -srm), $(nproc) CPUs)"
    [ -f "${bundle:-/nonexistent}/MANIFEST" ] && sed 's/^/  manifest: /' "$bundle/MANIFEST"
    # the GPU
    gpu=""
    if ! command -v nvidia-smi >/dev/null; then
        NO_GPU="nvidia-smi not found: no NVIDIA driver on this machine"
    elif ! nvidia-smi; then
        NO_GPU="nvidia-smi fails: no usable NVIDIA GPU"
    else
        gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total,compute_cap --format=csv,noheader 2>/dev/null | head -n 1)
        [ -n "$gpu" ] || NO_GPU="nvidia-smi lists no GPU"
    fi
    # CUDA 13's runtime needs a driver of the 580 series or later
    local driver
    driver=$(echo "$gpu" | awk -F', *' '{ print $2 }')
    if [ -n "$driver" ] && [ "${driver%%.*}" -lt 580 ] 2>/dev/null; then
        OLD_DRIVER="driver $driver is older than CUDA 13 needs (580 or later)"
        echo "$OLD_DRIVER"
    fi
    # glibc: older than the bundle's -> its own loader
    host_glibc=$(ldd --version 2>/dev/null | head -n 1 | grep -o '[0-9]\+\.[0-9]\+$')
    need_glibc=$(sed -n 's/^needs glibc: //p' "${bundle:-/nonexistent}/MANIFEST" 2>/dev/null)
    RUN=()
    if [ -n "$need_glibc" ] && [ -n "$host_glibc" ] &&
       [ "$(printf '%s\n%s\n' "$host_glibc" "$need_glibc" | sort -V | head -n 1)" != "$need_glibc" ]; then
        echo "glibc $host_glibc here, the bundle needs $need_glibc: binaries start through lib/glibc/"
        USE_LOADER=1
    else
        echo "glibc ${host_glibc:-?} (the bundle needs ${need_glibc:-n/a})"
        USE_LOADER=0
    fi
    # the CUDA libraries
    needs=$(sed -n 's/^needs from the GPU machine: //p' "${bundle:-/nonexistent}/MANIFEST" 2>/dev/null)
    [ -n "$needs" ] || needs=$(for f in "$bin"/*; do ldd "$f" 2>/dev/null; done | awk '{print $1}' |
        grep -E '^lib(cudart|cublas|cublasLt|nccl)\.so' | sort -u)
    CUDA_DIRS=""
    for lib in $needs; do
        dir=$(find_cuda_lib "$lib")
        if [ -z "$dir" ]; then miss="$miss $lib"; echo "$lib: NOT FOUND"; continue; fi
        echo "$lib: $dir ($(basename "$(readlink -f "$dir/$lib")"))"
        case ":$CUDA_DIRS:" in *":$dir:"*) ;; *) CUDA_DIRS=${CUDA_DIRS:+$CUDA_DIRS:}$dir ;; esac
    done
    # Only our binaries get the bundle's libraries (its libstdc++ may need a
    # newer glibc than compute-sanitizer's host; the sanitizer starts `env`,
    # which sets them and execs the binary under it)
    LDP=${own_lib:+$own_lib:}$CUDA_DIRS${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
    if [ "$USE_LOADER" = 1 ]; then
        RUN=("$bundle/lib/glibc/ld-linux-x86-64.so.2" --library-path "$bundle/lib/glibc:$LDP")
    else
        RUN=(env LD_LIBRARY_PATH="$LDP")
    fi
    echo "library path of the binaries: $LDP"
    # every binary resolves (ldd with the same library path)
    local unresolved
    unresolved=$(for f in "$bin"/*; do
        if [ "$USE_LOADER" = 1 ]; then
            LD_TRACE_LOADED_OBJECTS=1 "${RUN[@]}" "$f" 2>&1
        else
            LD_LIBRARY_PATH=$LDP ldd "$f" 2>&1
        fi | awk -v f="${f##*/}" '/not found/ { print f ": " $1 }'
    done | sort -u)
    [ -n "$unresolved" ] && printf 'unresolved:\n%s\n' "$unresolved"
    # the sanitizer
    SAN=$(command -v compute-sanitizer || true)
    for d in ${CUDA_HOME:-} /usr/local/cuda /usr/local/cuda-*; do
        [ -z "$SAN" ] && [ -x "$d/bin/compute-sanitizer" ] && SAN=$d/bin/compute-sanitizer
        [ -z "$SAN" ] && [ -x "$d/compute-sanitizer/compute-sanitizer" ] && SAN=$d/compute-sanitizer/compute-sanitizer
    done
    echo "compute-sanitizer: ${SAN:-not found}"
    command -v nvcc >/dev/null && nvcc --version | tail -n 2
    # verdict
    if [ -n "$miss" ] || [ -n "$unresolved" ] || [ -n "$OLD_DRIVER" ]; then
        ENV_RESULT=FAIL
        note="${OLD_DRIVER:+$OLD_DRIVER; }${miss:+missing:$miss }$(echo "$unresolved" | tr '\n' ' ')"
    elif [ -n "${NO_GPU:-}" ]; then
        ENV_RESULT=SKIP note=$NO_GPU
    else
        ENV_RESULT=PASS note="$gpu; glibc ${host_glibc:-?}$([ "$USE_LOADER" = 1 ] && echo ' (bundled loader)')"
    fi
    [ -n "${NO_GPU:-}" ] && [ "$ENV_RESULT" = FAIL ] && note="$NO_GPU; $note"
    ENV_NOTE=$note ENV_SECS=$(($(kit_now) - t0))
}

NO_GPU="" OLD_DRIVER="" ENV_RESULT="" ENV_NOTE="" ENV_SECS=0 RUN=() SAN="" USE_LOADER=0 LDP=""
env_step >"$out/env.log" 2>&1
sed 's/^/  /' "$out/env.log"
kit_record env "$ENV_RESULT" "$ENV_SECS" 0 "$ENV_NOTE"
if [ "$ENV_RESULT" != PASS ]; then
    kit_summary
    if [ -n "$NO_GPU" ]; then
        echo "run.sh: skipped: $NO_GPU (exit 77)"
        exit 77
    fi
    echo "run.sh: the environment is not usable: $ENV_NOTE"
    exit 1
fi

# ---- on the GPU ----
seed=${DITD_TEST_SEED:-$(date +%s)}
echo "seed $seed (DITD_TEST_SEED=$seed repeats the ops run)"
# each binary, through the bundled loader where the glibc is older
ops=("${RUN[@]}" "$bin/test_cuda_ops") model=("${RUN[@]}" "$bin/test_cuda_model")
flux=("${RUN[@]}" "$bin/test_cuda_flux") benchf=("${RUN[@]}" "$bin/bench_cuda_flux")
sd3=("${RUN[@]}" "$bin/test_cuda_sd3")
ditd=("${RUN[@]}" "$bin/ditd") benchk=("${RUN[@]}" "$bin/bench_cuda") nccl1=("${RUN[@]}" "$bin/test_nccl_one")

kit_step ops 150 20 env DITD_TEST_SEED="$seed" DITD_TEST_OUT="$out/ops" "${ops[@]}"
if [ "$(kit_result ops)" != PASS ] && grep -q 'sticky' "$out/ops.log"; then
    kit_step ops-blocking 150 30 env CUDA_LAUNCH_BLOCKING=1 DITD_TEST_SEED="$seed" \
        DITD_TEST_OUT="$out/ops-blocking" "${ops[@]}"
fi
if [ -n "$SAN" ]; then
    kit_step memcheck 240 60 env DITD_TEST_SEED=$((seed + 1)) DITD_TEST_OUT="$out/memcheck" \
        "$SAN" --tool memcheck --target-processes all --leak-check no --error-exitcode 9 --print-limit 100 "${ops[@]}"
else
    kit_record memcheck SKIP 0 0 "compute-sanitizer not found"
fi
kit_step model 180 30 env DITD_FIXTURES="$fix" DITD_TEST_OUT="$out/model" "${model[@]}"
kit_step flux 120 20 env DITD_FIXTURES="$fix" DITD_TEST_SEED="$seed" "${flux[@]}"
kit_step sd3 60 10 env DITD_FIXTURES="$fix" "${sd3[@]}"
if [ -x "$bin/test_nccl_one" ]; then
    kit_step nccl1 60 15 "${nccl1[@]}"
else
    kit_record nccl1 SKIP 0 0 "test_nccl_one not built (no NCCL at build time)"
fi
gen=(generate --device cuda --model "$fix/models/tiny-p4-c1-h3" --steps 10 -n 2 --seed 7 -q)
kit_step gen-graphs 60 15 "${ditd[@]}" "${gen[@]}" --save-latents "$out/latents-graphs.npy"
kit_step gen-nographs 60 15 env DITD_CUDA_GRAPHS=0 "${ditd[@]}" "${gen[@]}" \
    --save-latents "$out/latents-nographs.npy"
if [ "$(kit_result gen-graphs)" = PASS ] && [ "$(kit_result gen-nographs)" = PASS ]; then
    # the same bits, and the graphs really replayed (no "graphs off" line)
    kit_step graphs-cmp 20 1 bash -c '! grep -H "CUDA graphs off" "$1" && cmp "$2" "$3" && echo identical' _ \
        "$out/gen-graphs.log" "$out/latents-graphs.npy" "$out/latents-nographs.npy"
else
    kit_record graphs-cmp SKIP 0 0 "nothing to compare: a generate run failed"
fi
if [ -n "$SAN" ]; then
    kit_step memcheck-flux 180 40 env DITD_FIXTURES="$fix" DITD_TEST_SEED=$((seed + 3)) \
        "$SAN" --tool memcheck --target-processes all --leak-check no --error-exitcode 9 --print-limit 100 "${flux[@]}"
else
    kit_record memcheck-flux SKIP 0 0 "compute-sanitizer not found"
fi
if kit_step bench-xl 120 45 "${ditd[@]}" bench --device cuda --config DiT-XL/2 --tokens 1024 --batch 2 \
        --iters 10 --warmup 2 --no-gemm; then
    ms=$(awk -F'|' '$3 ~ /cuda/ { gsub(/ /, "", $8); print $8; exit }' "$out/bench-xl.log")
    kit_note bench-xl "DiT-XL/2 1024 tokens batch 2: ${ms:-?} ms/forward (median)"
fi
kit_step bench-kernels 90 60 "${benchk[@]}"
if kit_step bench-flux 150 60 "${benchf[@]}"; then
    kit_note bench-flux "$(grep -o 'projection.*' "$out/bench-flux.log" | head -n 1)"
fi
if [ -n "$SAN" ]; then
    kit_step racecheck 300 120 env DITD_TEST_SEED=$((seed + 2)) DITD_OPS_FILTER=attention,layernorm,merge \
        DITD_TEST_OUT="$out/racecheck" "$SAN" --tool racecheck --target-processes all --error-exitcode 9 "${ops[@]}"
else
    kit_record racecheck SKIP 0 0 "compute-sanitizer not found"
fi

kit_summary
kit_status
