#!/usr/bin/env bash
# tests/gpu/bundle.sh: the GPU bring-up bundle, built on a machine without a
# GPU, carried to one that has a GPU but none of ditd's development
# libraries (docs/cuda.md, "The bring-up kit").
#
#   tests/gpu/bundle.sh [--build DIR] [--reuse-kernels BUILD] [--out DIR]
#   tests/gpu/bundle.sh --check DIR     step 3 only, on an unpacked bundle
#
# 1. builds ditd, the GPU test programs and bench_cuda with -Dnative=false
#    (the GPU machine's CPU may lack this one's extensions) and
#    -Dcuda=enabled into DIR (default <repo>/build-bundle); with
#    --reuse-kernels it links BUILD's libditd_kernels_cuda.a instead of
#    running nvcc again (nvcc's flags do not depend on -Dnative);
# 2. stages ditd-gpu-bundle/: bin/, lib/ (every shared library ldd lists
#    except glibc's and the CUDA runtime, cuBLAS(Lt) and NCCL, which the GPU
#    machine has), lib/glibc/ (glibc and its loader, used only where the
#    machine's glibc is older than the one built against),
#    fixtures/models, run.sh + run_lib.sh, MANIFEST;
# 3. checks it: with lib/ first, ldd resolves every library of bin/ and
#    lib/ inside the bundle, except glibc's and the CUDA ones (which may be
#    missing here); ditd starts through the bundled loader; the archive is
#    under 40 MiB;
# 4. writes <out>/ditd-gpu-bundle.tar.gz (default <out> = the build dir).
#
# What it is not: it runs nothing on a GPU (run.sh --prebuilt does, there).
set -euo pipefail

here=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
build=$here/build-bundle
reuse=""
out=""
check_only=""
while [ $# -gt 0 ]; do
    case $1 in
    --build) build=$2; shift 2 ;;
    --reuse-kernels) reuse=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --check) check_only=$2; shift 2 ;;
    -h|--help) sed -n '2,22p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "bundle.sh: unknown argument '$1' (--build, --reuse-kernels, --out)" >&2; exit 2 ;;
    esac
done
out=${out:-$build}
max_bytes=$((40 * 1024 * 1024))
# Libraries the GPU machine provides: glibc's (the bundle's binaries need
# GLIBC_<= the version MANIFEST names) and CUDA's.
system_re='^(linux-vdso\.so|ld-linux[-a-z0-9_]*\.so|libc\.so|libm\.so|libpthread\.so|libdl\.so|librt\.so|libresolv\.so|libutil\.so)'
cuda_re='^(libcuda\.so|libcudart\.so|libcublas\.so|libcublasLt\.so|libnccl\.so)'
targets="ditd tests/gpu/test_cuda_ops tests/gpu/test_cuda_model tests/gpu/test_cuda_flux tests/gpu/test_cuda_sd3 tests/gpu/bench_cuda tests/gpu/bench_cuda_flux tests/gpu/test_nccl_one"

# ---- 3. the check: with lib/ first, every library resolves inside the
# bundle except glibc's and the CUDA ones; ditd starts through the bundled
# loader ----
check_stage() {
    local stage=$1 bad=0 who name path cuda_dirs
    while read -r who name path; do
        if [[ $name =~ $system_re ]]; then continue; fi
        if [[ $name =~ $cuda_re ]]; then continue; fi # the GPU machine's (may be missing here)
        case $path in
        "$stage"/lib/*) ;;
        *) echo "bundle.sh: $who needs $name, resolved outside the bundle: $path" >&2; bad=1 ;;
        esac
    done < <(for f in "$stage"/bin/* "$stage"/lib/*.so*; do
                 LD_LIBRARY_PATH=$stage/lib ldd "$f" 2>/dev/null |
                     awk -v who="${f#"$stage"/}" '$2 == "=>" { print who, $1, ($3 == "not" ? "not-found" : $3) }'
             done)
    [ "$bad" -eq 0 ] || { echo "bundle.sh: the bundle is not self-contained" >&2; return 1; }
    # the fallback for an older glibc: ditd starts through the bundled loader
    # with nothing of the machine's but the CUDA libraries (here: where ldconfig
    # finds them)
    cuda_dirs=$(ldd "$stage/bin/ditd" | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' |
        while read -r name path; do if [[ $name =~ $cuda_re ]]; then dirname "$path"; fi; done | sort -u | tr '\n' ':')
    if ! "$stage/lib/glibc/ld-linux-x86-64.so.2" --library-path "$stage/lib/glibc:$stage/lib:$cuda_dirs" \
            "$stage/bin/ditd" --version >/dev/null; then
        echo "bundle.sh: bin/ditd does not start through the bundled glibc loader" >&2
        return 1
    fi

    echo "bundle.sh: $stage: every library resolves inside the bundle (glibc and CUDA aside)"
}

if [ -n "$check_only" ]; then
    check_stage "$(cd "$check_only" && pwd)"
    exit
fi

# ---- 1. build ----
# The CPU reference kernels the GPU tests compare against use OpenBLAS there:
# oneDNN (40 MB) would not fit the bundle's 40 MiB and is not what is tested.
# no FFmpeg: the kit writes no MP4, and libavcodec's dependency tree (x265, codec2, librsvg, ...)
# would take the archive past its 40 MiB
opts=(-Dwerror=true -Dbuildtype=release -Dnative=false -Dcuda=enabled -Donednn=disabled -Dffmpeg=disabled)
if [ -n "$reuse" ]; then
    lib=$(cd "$reuse" && pwd)/kernels/cuda/libditd_kernels_cuda.a
    ninja -C "$reuse" kernels/cuda/libditd_kernels_cuda.a >/dev/null
    opts+=("-Dprebuilt_cuda_kernels=$lib")
else
    opts+=("-Dprebuilt_cuda_kernels=")
fi
if [ -f "$build/build.ninja" ]; then
    meson configure "$build" "${opts[@]}" >/dev/null
else
    meson setup "$build" "$here" "${opts[@]}" >/dev/null
fi
ninja -C "$build" build.ninja >/dev/null # regenerate first: the query below reads it
avail=""
for t in $targets; do # test_nccl_one only where NCCL was found
    if ninja -C "$build" -t query "$t" >/dev/null 2>&1; then avail="$avail $t"; fi
done
# shellcheck disable=SC2086
ninja -C "$build" $avail >"$build/bundle-build.log" 2>&1 || { tail -30 "$build/bundle-build.log"; exit 1; }

# ---- 2. stage ----
stage=$build/ditd-gpu-bundle
rm -rf "$stage"
mkdir -p "$stage/bin" "$stage/lib/glibc" "$stage/fixtures"
for t in $avail; do cp "$build/$t" "$stage/bin/"; done
cp -r "$here/tests/fixtures/models" "$here/tests/fixtures/flux" "$here/tests/fixtures/sd3" "$stage/fixtures/"
cp "$here/tests/gpu/run.sh" "$here/tests/gpu/run_lib.sh" "$stage/"
# ldd lists the whole closure; copy each library under its soname
ldd "$stage"/bin/* | awk '$2 == "=>" && $3 ~ /^\// { print $1, $3 }' | sort -u |
while read -r name path; do
    if [[ $name =~ $cuda_re ]]; then continue; fi
    if [[ $name =~ $system_re ]]; then
        # glibc too, aside: run.sh starts the binaries through this loader
        # only where the machine's glibc is older than MANIFEST's
        cp -L "$path" "$stage/lib/glibc/$name"
        continue
    fi
    cp -L "$path" "$stage/lib/$name"
done
loader=$(ldd "$stage/bin/ditd" | awk '$1 ~ /^\/.*ld-linux/ { print $1 }')
cp -L "$loader" "$stage/lib/glibc/$(basename "$loader")"
chmod -R u+w "$stage"
glibc_need=$(for f in "$stage"/bin/* "$stage"/lib/*.so*; do objdump -T "$f" 2>/dev/null; done |
    grep -o 'GLIBC_[0-9][0-9.]*' | sort -uV | tail -1)
{
    echo "ditd GPU bring-up bundle"
    echo "commit: $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$here" diff --quiet 2>/dev/null || echo '+dirty')"
    echo "built: $(date -u +%Y-%m-%dT%H:%M:%SZ) on $(uname -m), -Dnative=false"
    echo "nvcc: $(nvcc --version 2>/dev/null | grep -o 'release [0-9.]*' || echo '?')"
    echo "needs glibc: ${glibc_need#GLIBC_}"
    echo "needs from the GPU machine: $(ldd "$stage"/bin/* | awk '{print $1}' | grep -E "$cuda_re" | sort -u | tr '\n' ' ')"
    echo "bin: $(cd "$stage/bin" && echo *)"
    echo "lib: $(cd "$stage/lib" && echo *.so*)"
    echo "lib/glibc (used only where the machine's glibc is older): $(cd "$stage/lib/glibc" && echo *)"
    echo "loader: lib/glibc/$(basename "$loader")"
} >"$stage/MANIFEST"

check_stage "$stage" || exit 1

# ---- 4. archive ----
mkdir -p "$out"
tarball=$(cd "$out" && pwd)/ditd-gpu-bundle.tar.gz
tar -C "$build" -czf "$tarball" ditd-gpu-bundle
size=$(stat -c %s "$tarball")
if [ "$size" -ge "$max_bytes" ]; then
    echo "bundle.sh: $tarball is $size bytes, over the 40 MiB limit" >&2
    exit 1
fi
echo "bundle: $tarball ($((size / 1024)) KiB; unpacked $(du -sk "$stage" | cut -f1) KiB;" \
     "$(ls "$stage"/lib/*.so* | wc -l) libraries; glibc >= ${glibc_need#GLIBC_})"
