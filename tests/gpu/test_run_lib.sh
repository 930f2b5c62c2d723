#!/usr/bin/env bash
# Unit test of tests/gpu/run_lib.sh (suite 'bundle'): the global deadline
# (limits, steps not run), the results, the summary table and counts, the
# summary on a signal. A fake clock (KIT_CLOCK_FILE) that fake steps move
# forward; one real timeout of 1 s. Needs no GPU.
set -uo pipefail
here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
tmp=$(mktemp -d "${TMPDIR:-/tmp}/ditd-test-runlib-XXXXXX")
trap 'rm -rf "$tmp"' EXIT
fails=0 checks=0
check() { # check WHAT COND...
    local what=$1
    shift
    checks=$((checks + 1))
    if "$@"; then echo "ok   $what"; else echo "FAIL $what"; fails=$((fails + 1)); fi
}
eq() { [ "$1" = "$2" ] || { echo "  got '$1', want '$2'" >&2; return 1; }; }
has() { grep -qF -- "$2" "$1" || { echo "  '$2' not in $1:" >&2; sed 's/^/  | /' "$1" >&2; return 1; }; }

# a step that takes ADV fake seconds and exits RC
cat >"$tmp/fake.sh" <<'EOF'
#!/usr/bin/env bash
echo "fake step: +$1 s, exit $2"
echo $(( $(cat "$KIT_CLOCK_FILE") + $1 )) >"$KIT_CLOCK_FILE"
exit "$2"
EOF
chmod +x "$tmp/fake.sh"
export KIT_CLOCK_FILE=$tmp/clock
echo 1000 >"$KIT_CLOCK_FILE"

# shellcheck source=run_lib.sh
. "$here/run_lib.sh"
kit_init "$tmp/out" 600 10 >/dev/null  # deadline 1600, steps until 1590

kit_step a 120 20 "$tmp/fake.sh" 100 0 >"$tmp/a.txt"
check "a passes with its own limit 120" eq "${KIT_RESULT[0]} ${KIT_LIMIT[0]} ${KIT_SECS[0]}" "PASS 120 100"
check "a's log is in the output folder" has "$tmp/out/a.log" "fake step: +100 s, exit 0"

kit_step b 300 20 "$tmp/fake.sh" 300 3 >"$tmp/b.txt"
rc=$?
check "b fails with its exit status, note and log tail" \
    eq "$rc ${KIT_RESULT[1]} ${KIT_LIMIT[1]} ${KIT_NOTE[1]}" "3 FAIL 300 exit 3; fake step: +300 s, exit 3"
check "b's log tail is printed" has "$tmp/b.txt" "| fake step: +300 s, exit 3"

# now 1400: 190 s left before the reserve
kit_step c 300 60 "$tmp/fake.sh" 150 77 >/dev/null
check "c is cut to what is left (190) and skips on 77" eq "${KIT_RESULT[2]} ${KIT_LIMIT[2]}" "SKIP 190"

# now 1550: 40 s left
kit_step d 100 60 "$tmp/fake.sh" 1 0 >/dev/null
rc=$?
check "d needs 60 s, 40 are left: not run" eq "$rc ${KIT_RESULT[3]} ${KIT_NOTE[3]}" \
    "254 NOT-RUN deadline: 40s left, needs 60s"
check "d did not run" eq "$(cat "$KIT_CLOCK_FILE")" 1550
check "d wrote no log" eq "$(ls "$tmp/out" | grep -c '^d\.log$')" 0

kit_step e 100 30 "$tmp/fake.sh" 5 0 >/dev/null
check "e runs in the 40 s left" eq "${KIT_RESULT[4]} ${KIT_LIMIT[4]}" "PASS 40"
kit_note e "12.5 ms"
check "kit_note replaces the note" eq "${KIT_NOTE[4]}" "12.5 ms"
check "kit_result finds the last record" eq "$(kit_result b) $(kit_result zz)" "FAIL "

# a real timeout (the clock's limit is what timeout gets)
echo 1000 >"$KIT_CLOCK_FILE"
kit_init "$tmp/out2" 600 10 >/dev/null
t0=$(date +%s)
kit_step slow 1 1 sleep 20 >"$tmp/slow.txt"
rc=$?
check "a step past its limit is TIMEOUT (124) within seconds" \
    eq "$rc ${KIT_RESULT[0]} $(( $(date +%s) - t0 < 8 ))" "124 TIMEOUT 1"

# the summary of the first run
KIT_NAME=(a b c d e) KIT_RESULT=(PASS FAIL SKIP NOT-RUN PASS) KIT_SECS=(100 300 150 0 5)
KIT_LIMIT=(120 300 190 0 40) KIT_NOTE=("x" "exit 3; y|z" "s" "deadline" "12.5 ms")
KIT_OUT=$tmp/out KIT_DONE=0
kit_summary >"$tmp/sum.txt"
check "summary: header" has "$tmp/sum.txt" "| step | result | s | limit s | note |"
check "summary: a row, '|' in a note becomes '/'" has "$tmp/sum.txt" "| b | FAIL | 300 | 300 | exit 3; y/z |"
check "summary: counts last" eq "$(tail -n 1 "$tmp/sum.txt")" \
    "gpu kit: 2 passed, 1 failed, 1 skipped, 1 not run (deadline)"
check "summary: rows in order" eq "$(grep -o '^| [a-e] ' "$tmp/sum.txt" | tr -d '| \n')" "abcde"
check "summary.md written" has "$tmp/out/summary.md" "| e | PASS | 5 | 40 | 12.5 ms |"
kit_summary >"$tmp/sum2.txt"
check "summary printed once" eq "$(wc -c <"$tmp/sum2.txt")" 0
check "status 1 with a failure" eval '! kit_status'
KIT_RESULT=(PASS PASS SKIP NOT-RUN PASS)
check "status 0 without" kit_status

# a signal in the middle of a step: the step is recorded, the summary printed
unset KIT_CLOCK_FILE
cat >"$tmp/sig.sh" <<EOF
. "$here/run_lib.sh"
kit_init "$tmp/out3" 600 10
kit_trap
kit_step first 10 1 true
kit_step long 100 1 sleep 30
kit_step never 10 1 true
EOF
t0=$(date +%s)
bash "$tmp/sig.sh" >"$tmp/sig.txt" 2>&1 &
pid=$!
sleep 2
kill -TERM "$pid"
wait "$pid"
rc=$?
check "TERM: exit 130 within seconds" eq "$rc $(( $(date +%s) - t0 < 10 ))" "130 1"
check "TERM: the step in flight is INTERRUPTED" has "$tmp/sig.txt" "| long | INTERRUPTED |"
check "TERM: the summary counts it as failed" has "$tmp/sig.txt" "gpu kit: 1 passed, 1 failed, 0 skipped, 0 not run"
check "TERM: later steps do not run" eval "! grep -q never '$tmp/sig.txt'"

echo "$checks checks, $fails failed"
[ "$checks" -ge 24 ] || { echo "FAIL only $checks checks ran"; exit 1; }
[ "$fails" -eq 0 ]
