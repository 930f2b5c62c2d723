#!/usr/bin/env bash
# The README's test command: installs what is missing, builds (warnings are
# errors, the CUDA code included when nvcc is there), runs every suite, then
# the unit and fuzz-regression suites again under ASan/UBSan. Ends with one
# "N passed, N failed, N skipped" line over all runs. GPU tests exit 77
# (skipped) without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

deploy/install-deps.sh || { echo "install-deps failed"; exit 1; }

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
export OMPI_MCA_btl_vader_single_copy_mechanism=none
export OMPI_MCA_rmaps_base_oversubscribe=1

build=${DITD_TEST_BUILD:-build-test}
asan=${DITD_TEST_ASAN_BUILD:-build-asan}
jobs=$(nproc)

setup() { # dir, extra args...
  local dir=$1; shift
  if [ -f "$dir/build.ninja" ]; then
    meson configure "$dir" "$@" >/dev/null
  else
    meson setup "$dir" "$@" >/dev/null
  fi
}

rm -f "$build/meson-logs/testlog.json" "$asan/meson-logs/testlog.json"
fail=0
setup "$build" -Dwerror=true -Dbuildtype=release || fail=1
[ $fail -eq 0 ] && { ninja -C "$build" -j "$jobs" >"$build.log" 2>&1 || { tail -50 "$build.log"; fail=1; }; }
if [ $fail -ne 0 ]; then
  echo "build failed"
  echo "0 passed, 1 failed"
  exit 1
fi
# The http suite's Python clients (openai, jsonschema) live in a virtualenv
# cached in the build folder; made here once so the suite's time is its own.
tests/http/venv.sh "$build/http-venv" >/dev/null || echo "http tests: no virtualenv (they will skip)"
tests/deploy/venv.sh "$build/deploy-venv" >/dev/null || echo "deploy_k8s: no virtualenv (it will skip)"
meson test -C "$build" --num-processes 1 --print-errorlogs "$@"
rc1=$?

rc2=0
if [ -z "${DITD_SKIP_ASAN:-}" ]; then
  setup "$asan" -Dwerror=true -Dbuildtype=debugoptimized -Db_sanitize=address,undefined \
    -Db_lundef=false -Dcuda=disabled || rc2=1
  if [ $rc2 -eq 0 ]; then
    ninja -C "$asan" -j "$jobs" >"$asan.log" 2>&1 || { tail -50 "$asan.log"; rc2=1; }
  fi
  if [ $rc2 -eq 0 ]; then
    UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 ASAN_OPTIONS=detect_leaks=1 \
      meson test -C "$asan" --suite unit --suite fuzz --num-processes 1 --print-errorlogs
    rc2=$?
  fi
fi

python3 - "$build" "$asan" "$rc2" <<'PY'
import json, os, sys
passed = failed = skipped = 0
for d in sys.argv[1:3]:
    log = os.path.join(d, "meson-logs", "testlog.json")
    if not os.path.exists(log):
        continue
    for line in open(log):
        r = json.loads(line).get("result")
        if r in ("OK", "EXPECTEDFAIL"): passed += 1
        elif r == "SKIP": skipped += 1
        else: failed += 1
if sys.argv[3] != "0" and failed == 0:
    failed = 1  # the sanitizer build itself failed
print(f"{passed} passed, {failed} failed, {skipped} skipped")
PY
[ $rc1 -eq 0 ] && [ $rc2 -eq 0 ]
