#!/bin/sh
# ditd generate --cache on the tiny SD3 folder: each block-hook method skips
# some steps and computes others (the counts the command prints), and an
# uncached run skips none. The Diffusers comparison is tests/golden/test_step_cache.c
# (docs/caching.md); this checks the command line end to end.
# usage: sd3_cache.sh DITD SD3_PIPELINE_DIR
set -u
ditd=$1 dir=$2/sd3 tmp=${TMPDIR:-/tmp}/sd3_cache.$$
fail=0 checked=0
check() { # spec min_skip
    out=$("$ditd" generate --model "$dir" --prompt "a cat" --size 64x64 --steps 8 --cache "$1" \
          -o "$tmp.png" --threads 1 2>&1) || { echo "FAIL $1: exit: $out"; fail=1; return; }
    sk=$(echo "$out" | sed -n 's/.*skipped \([0-9]*\) of \([0-9]*\) steps.*/\1/p')
    n=$(echo "$out" | sed -n 's/.*skipped \([0-9]*\) of \([0-9]*\) steps.*/\2/p')
    if [ -z "$sk" ] || [ "$sk" -lt 1 ] || [ "$sk" -ge "$n" ]; then
        echo "FAIL $1: skipped '$sk' of '$n' steps: $out"; fail=1
    else
        echo "ok $1: skipped $sk of $n"
    fi
    checked=$((checked + 1))
}
check first_block_cache:threshold=0.5
check mag_cache:threshold=0.5,mag_ratios=FLUX
rm -f "$tmp.png"
[ "$checked" -eq 2 ] || { echo "FAIL: $checked cases checked"; exit 1; }
exit $fail
