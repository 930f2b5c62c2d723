# tests/gpu/run_lib.sh: the step runner of tests/gpu/run.sh, sourced (by
# run.sh, and by tests/gpu/test_run_lib.sh with a fake clock).
#
# One global deadline for the whole run: each step asks for WANT seconds and
# needs at least MIN; it runs under `timeout` for min(WANT, what is left of
# the deadline less the reserve kept for the summary), or is skipped
# ("not run") when less than MIN is left. Every step's output goes to
# <out>/<name>.log; a step that fails prints its log's tail. kit_summary
# prints the table last (and writes <out>/summary.md), also when the run is
# interrupted (kit_trap).
#
# What it is not: nothing here knows about GPUs or ditd; run.sh does.
#
# Results: PASS (exit 0), FAIL (other exits), TIMEOUT (its time ran out),
# SKIP (exit 77: the step itself found nothing to run), NOT-RUN (the deadline
# left too little), INTERRUPTED (a signal ended the run inside it).

# Seconds since the epoch; KIT_CLOCK_FILE (tests) holds a fake one.
kit_now() {
    if [ -n "${KIT_CLOCK_FILE:-}" ]; then cat "$KIT_CLOCK_FILE"; else date +%s; fi
}

# kit_init OUT_DIR DEADLINE_S RESERVE_S
kit_init() {
    KIT_OUT=$1
    KIT_T0=$(kit_now)
    KIT_DEADLINE=$((KIT_T0 + $2))
    KIT_BUDGET=$2
    KIT_RESERVE=$3
    KIT_NAME=() KIT_RESULT=() KIT_SECS=() KIT_LIMIT=() KIT_NOTE=()
    KIT_CHILD="" KIT_CUR="" KIT_CUR_T0=0 KIT_DONE=0
    mkdir -p "$KIT_OUT"
}

# Seconds a step may still take (the reserve kept back); may be negative.
kit_left() {
    echo $((KIT_DEADLINE - $(kit_now) - KIT_RESERVE))
}

# kit_record NAME RESULT SECS LIMIT NOTE
kit_record() {
    KIT_NAME+=("$1") KIT_RESULT+=("$2") KIT_SECS+=("$3") KIT_LIMIT+=("$4") KIT_NOTE+=("$5")
    printf '[%4ds] %-14s %-11s %4ss  %s\n' $(($(kit_now) - KIT_T0)) "$1" "$2" "$3" "$5"
}

# kit_note NAME TEXT: replaces the note of NAME's last record.
kit_note() {
    local i
    for ((i = ${#KIT_NAME[@]} - 1; i >= 0; i--)); do
        if [ "${KIT_NAME[$i]}" = "$1" ]; then KIT_NOTE[$i]=$2; return 0; fi
    done
    return 1
}

# kit_result NAME: the result of NAME's last record ("" if none).
kit_result() {
    local i
    for ((i = ${#KIT_NAME[@]} - 1; i >= 0; i--)); do
        if [ "${KIT_NAME[$i]}" = "$1" ]; then echo "${KIT_RESULT[$i]}"; return 0; fi
    done
    echo ""
}

# kit_step NAME WANT_S MIN_S CMD...: runs CMD under the deadline. Returns
# CMD's exit status (124 timed out), or 254 when not run.
kit_step() {
    local name=$1 want=$2 min=$3 left limit t0 rc result note
    shift 3
    left=$(kit_left)
    if [ "$left" -lt "$min" ]; then
        kit_record "$name" NOT-RUN 0 0 "deadline: ${left}s left, needs ${min}s"
        return 254
    fi
    limit=$((want < left ? want : left))
    t0=$(kit_now)
    KIT_CUR=$name KIT_CUR_T0=$t0
    # in the background so that a signal reaches kit_trap at once
    timeout --kill-after=5 "$limit" "$@" >"$KIT_OUT/$name.log" 2>&1 </dev/null &
    KIT_CHILD=$!
    wait "$KIT_CHILD"
    rc=$?
    KIT_CHILD="" KIT_CUR=""
    note=$(grep -v '^[[:space:]]*$' "$KIT_OUT/$name.log" 2>/dev/null | tail -n 1 | cut -c1-70)
    case $rc in
    0) result=PASS ;;
    77) result=SKIP ;;
    124 | 137) result=TIMEOUT note="no end after ${limit}s; last: $note" ;;
    *) result=FAIL note="exit $rc; $note" ;;
    esac
    kit_record "$name" "$result" $(($(kit_now) - t0)) "$limit" "$note"
    if [ "$result" = FAIL ] || [ "$result" = TIMEOUT ]; then
        tail -n 15 "$KIT_OUT/$name.log" 2>/dev/null | sed 's/^/    | /'
    fi
    return "$rc"
}

# kit_count RESULT: how many records have it.
kit_count() {
    local n=0 r
    for r in "${KIT_RESULT[@]}"; do [ "$r" = "$1" ] && n=$((n + 1)); done
    echo "$n"
}

# The table, last; also to <out>/summary.md. Once per run.
kit_summary() {
    local i
    [ "$KIT_DONE" -eq 1 ] && return 0
    KIT_DONE=1
    {
        echo
        echo "== summary: $(($(kit_now) - KIT_T0))s of a ${KIT_BUDGET}s deadline; logs in $KIT_OUT"
        echo "| step | result | s | limit s | note |"
        echo "|---|---|---|---|---|"
        for ((i = 0; i < ${#KIT_NAME[@]}; i++)); do
            echo "| ${KIT_NAME[$i]} | ${KIT_RESULT[$i]} | ${KIT_SECS[$i]} | ${KIT_LIMIT[$i]} | ${KIT_NOTE[$i]//|//} |"
        done
        echo "gpu kit: $(kit_count PASS) passed, $(($(kit_count FAIL) + $(kit_count TIMEOUT) + $(kit_count INTERRUPTED))) failed," \
             "$(kit_count SKIP) skipped, $(kit_count NOT-RUN) not run (deadline)"
    } | tee "$KIT_OUT/summary.md"
}

# 0 when no step failed, timed out or was interrupted; else 1.
kit_status() {
    [ $(($(kit_count FAIL) + $(kit_count TIMEOUT) + $(kit_count INTERRUPTED))) -eq 0 ]
}

# Installed by run.sh: on SIGINT/SIGTERM the step in flight is stopped and
# recorded, and the summary still printed.
kit_on_signal() {
    if [ -n "$KIT_CHILD" ]; then
        kill -TERM "$KIT_CHILD" 2>/dev/null
        wait "$KIT_CHILD" 2>/dev/null
        kit_record "$KIT_CUR" INTERRUPTED $(($(kit_now) - KIT_CUR_T0)) 0 "stopped by a signal"
        KIT_CHILD=""
    fi
    kit_summary
    exit 130
}

kit_trap() {
    trap kit_on_signal INT TERM
}
