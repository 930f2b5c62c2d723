#!/usr/bin/env bash
# CI check of the GPU bring-up bundle (suite 'bundle'), on a machine without
# a GPU:
#   - tests/gpu/bundle.sh builds it (-Dnative=false, reusing BUILD's nvcc
#     output) and checks it; the archive is under 40 MiB;
#   - unpacked elsewhere, it passes the check again (with lib/ first, ldd
#     resolves every non-CUDA library inside it), and fails it, naming the
#     library, once a bundled library is removed;
#   - its run.sh (prebuilt mode) goes through the environment step and exits
#     77 in seconds, saying why, with the summary last; with a glibc "newer"
#     than the machine's in MANIFEST it takes the bundled loader and the
#     binaries still resolve.
#
#   test_bundle.sh BUILD      (BUILD: the meson build dir with the CUDA kernels)
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$(cd "$1" && pwd)
work=$build/gpu-bundle
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ditd-test-bundle-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0 checks=0
check() { # check WHAT COND...
    local what=$1
    shift
    checks=$((checks + 1))
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
quiet() { "$@" >/dev/null; }
has() { grep -qF -- "$2" "$1" || { echo "  '$2' not in $1:" >&2; sed 's/^/  | /' "$1" >&2; return 1; }; }

t0=$(date +%s)
check "bundle.sh builds and checks the bundle" \
    "$here/tests/gpu/bundle.sh" --build "$work" --reuse-kernels "$build" --out "$work"
echo "  ($(($(date +%s) - t0)) s)"
tarball=$work/ditd-gpu-bundle.tar.gz
[ -f "$tarball" ] || { echo "FAIL no $tarball"; exit 1; }
check "the archive is under 40 MiB" test "$(stat -c %s "$tarball")" -lt $((40 * 1024 * 1024))

tar -C "$tmp" -xzf "$tarball"
b=$tmp/ditd-gpu-bundle
for f in bin/ditd bin/test_cuda_ops bin/test_cuda_model bin/test_cuda_flux bin/test_cuda_sd3 bin/bench_cuda bin/bench_cuda_flux bin/test_nccl_one run.sh run_lib.sh MANIFEST \
         lib/libopenblas.so.0 lib/libjansson.so.4 lib/libmpi.so.40 lib/glibc/ld-linux-x86-64.so.2 \
         fixtures/models/tiny-p4-c1-h3/model_index.json fixtures/flux/tiny-c4/config.json fixtures/sd3/sd35-tiny/config.json; do
    check "the bundle has $f" test -e "$b/$f"
done
check "no CUDA library is bundled" test -z "$(ls "$b/lib" | grep -E '^lib(cuda|cudart|cublas|cublasLt|nccl)\.so')"
check "unpacked, it passes the check" quiet "$here/tests/gpu/bundle.sh" --check "$b"

cp -a "$b" "$tmp/broken"
rm "$tmp/broken/lib/libpng16.so.16"
"$here/tests/gpu/bundle.sh" --check "$tmp/broken" >"$tmp/broken.txt" 2>&1
check "a bundle without libpng fails the check, naming it" has "$tmp/broken.txt" \
    "bin/ditd needs libpng16.so.16, resolved outside the bundle"

# run.sh on this machine: no GPU. A failing nvidia-smi first on PATH makes
# that so on any machine.
mkdir -p "$tmp/fakebin"
printf '#!/bin/sh\necho "NVIDIA-SMI has failed (test stand-in)" >&2\nexit 9\n' >"$tmp/fakebin/nvidia-smi"
chmod +x "$tmp/fakebin/nvidia-smi"
t0=$(date +%s)
PATH=$tmp/fakebin:$PATH OUT=$tmp/out "$b/run.sh" >"$tmp/run.txt" 2>&1
rc=$?
took=$(($(date +%s) - t0))
check "run.sh exits 77 without a GPU (got $rc)" test "$rc" -eq 77
check "run.sh is done in seconds ($took s)" test "$took" -lt 30
check "run.sh says why" has "$tmp/run.txt" "run.sh: skipped: nvidia-smi fails: no usable NVIDIA GPU (exit 77)"
check "run.sh runs in prebuilt mode" has "$tmp/run.txt" "ditd GPU check: prebuilt mode, deadline 600s"
check "the environment step resolved the CUDA libraries" has "$tmp/out/env.log" "libcublasLt.so.13: /"
check "the environment step found nothing unresolved" test -z "$(grep -E 'NOT FOUND|unresolved' "$tmp/out/env.log")"
check "the summary is last" test "$(tail -n 2 "$tmp/run.txt" | head -n 1)" = \
    "gpu kit: 0 passed, 0 failed, 1 skipped, 0 not run (deadline)"
check "summary.md is in \$OUT" has "$tmp/out/summary.md" "| env | SKIP |"

# an older glibc here than the bundle's: the bundled loader resolves them
sed -i 's/^needs glibc: .*/needs glibc: 99.0/' "$b/MANIFEST"
PATH=$tmp/fakebin:$PATH "$b/run.sh" --out "$tmp/out2" >"$tmp/run2.txt" 2>&1
rc=$?
check "with an older glibc: still 77 (got $rc)" test "$rc" -eq 77
check "with an older glibc: the bundled loader" has "$tmp/out2/env.log" "the bundle needs 99.0: binaries start through lib/glibc/"
check "with an older glibc: nothing unresolved" test -z "$(grep -E 'NOT FOUND|unresolved' "$tmp/out2/env.log")"

# a stand-in GPU (nvidia-smi answers; the binaries find no device), still
# through the bundled loader (MANIFEST above): every step runs in its
# order, the summary is last, and a short deadline skips the steps that
# need more than is left
printf '#!/bin/sh\necho "Stand-in GPU, 580.00, 143771 MiB, 9.0"\n' >"$tmp/fakebin/nvidia-smi"
# a compute-sanitizer stand-in: drops its "--option value" pairs, runs the rest
printf '#!/bin/sh\nwhile [ "${1#--}" != "$1" ]; do shift 2; done\nexec "$@"\n' >"$tmp/fakebin/compute-sanitizer"
chmod +x "$tmp/fakebin/compute-sanitizer"
PATH=$tmp/fakebin:$PATH "$b/run.sh" --out "$tmp/out3" >"$tmp/run3.txt" 2>&1
rc=$?
check "stand-in GPU: exit 1 (the binaries find no device; got $rc)" test "$rc" -eq 1
steps=$(sed -n '/^| step /,$p' "$tmp/run3.txt" | awk -F'|' 'NR > 2 && NF > 3 { gsub(/ /, "", $2); printf "%s ", $2 }')
check "stand-in GPU: the steps in order" test "$steps" = \
    "env ops memcheck model flux sd3 nccl1 gen-graphs gen-nographs graphs-cmp memcheck-flux bench-xl bench-kernels bench-flux racecheck "
check "stand-in GPU: the summary is last" has <(tail -n 1 "$tmp/run3.txt") "gpu kit: "
check "stand-in GPU: memcheck reaches test_cuda_ops" has "$tmp/out3/memcheck.log" "no CUDA device: skipped"
check "stand-in GPU: memcheck-flux reaches test_cuda_flux" has "$tmp/out3/memcheck-flux.log" "no CUDA device: skipped"
check "stand-in GPU: racecheck runs the filtered checks" has "$tmp/out3/racecheck.log" "no CUDA device: skipped"
PATH=$tmp/fakebin:$PATH "$b/run.sh" --out "$tmp/out4" --deadline 40 >"$tmp/run4.txt" 2>&1
check "deadline 40 s: ops runs (needs 20 of the <= 25 left)" grep -qE '^\| ops \| SKIP \| [0-9]+ \| 2[0-5] \|' "$tmp/out4/summary.md"
check "deadline 40 s: the model tests are not run (need 30)" grep -qE \
    '^\| model \| NOT-RUN \| 0 \| 0 \| deadline: [0-9]+s left, needs 30s \|' "$tmp/out4/summary.md"

# a driver older than CUDA 13 needs: the environment step fails, naming it
printf '#!/bin/sh\necho "Old GPU, 550.54.15, 81559 MiB, 9.0"\n' >"$tmp/fakebin/nvidia-smi"
PATH=$tmp/fakebin:$PATH "$b/run.sh" --out "$tmp/out5" >"$tmp/run5.txt" 2>&1
rc=$?
check "driver 550: exit 1 at the environment step (got $rc)" test "$rc" -eq 1
check "driver 550: said so" has "$tmp/run5.txt" "driver 550.54.15 is older than CUDA 13 needs (580 or later)"

echo "$checks checks, $fails failed"
[ "$checks" -ge 30 ] || { echo "FAIL only $checks checks ran"; exit 1; }
[ "$fails" -eq 0 ]
