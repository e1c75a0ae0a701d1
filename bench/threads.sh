#!/bin/bash
# bench/threads (issue 13, threads on a shared machine): ctrax training
# steps/s with 2 threads alone, 1 thread alone, and 2 threads while a second
# process keeps one core busy (`bash -c 'while :; do :; done'`):
#   default       idle OpenMP threads spin, then sleep (ctrax sets
#                 GOMP_SPINCOUNT=300000, CT_OMP_SPINCOUNT) and the count
#                 follows the cores other processes leave free (measured
#                 every 2 s, never above --threads)
#   fixed         threads that sleep at once (OMP_WAIT_POLICY=passive), the
#                 count fixed (ctrax train --fixed-threads)
#   before        as ctrax ran before: libgomp's spinning waits
#                 (GOMP_SPINCOUNT=300000) and a fixed count
#
#   bash bench/threads.sh [--steps 1000] [--before-steps 50] [--repeats 2]
#       [--config configs/copy.gin] [--build build] [--nice N]
#
# Each row is a separate `ctrax train` (evals off, output in a temporary
# directory); steps/s counts the steps after the first (start-up and the
# first step's page faults left out), from the train log's "Ran N train
# steps in S secs" lines. The "before" rows run --before-steps steps: they
# are 10-50x slower. The rows alternate inside each repeat so they see the
# same background load; the table gives the best and worst of the repeats,
# and the verdict of issue 13's acceptance: with one core busy, 2 threads as
# fast as 1 thread alone (no collapse): the best busy run at or above the
# worst of 1 thread alone, since the fitted count is then 1 thread and the
# two differ by noise only. On a machine other work is loading too,
# --nice -15 (root) runs ctrax and the busy loop ahead of it, so "alone"
# means what it says.
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
STEPS=1000
BEFORE_STEPS=50
REPEATS=2
NICE=0
CONFIG=$ROOT/configs/copy.gin
BUILD=build
while [[ $# -gt 0 ]]; do
    case $1 in
    --steps) STEPS=$2; shift 2 ;;
    --before-steps) BEFORE_STEPS=$2; shift 2 ;;
    --nice) NICE=$2; shift 2 ;;
    --repeats) REPEATS=$2; shift 2 ;;
    --config) CONFIG=$2; shift 2 ;;
    --build) BUILD=$2; shift 2 ;;
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "bench/threads.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    esac
done
CTRAX=$ROOT/$BUILD/ctrax
[[ $BUILD = /* ]] && CTRAX=$BUILD/ctrax
if [[ ! -x $CTRAX ]]; then
    echo "bench/threads.sh: no $CTRAX: build it (cmake --build $BUILD --target ctrax) or give --build DIR" >&2
    exit 1
fi
tmp=$(mktemp -d /tmp/ctrax_bench_threads_XXXXXX)
busy=
cleanup() {
    [[ -n $busy ]] && kill "$busy" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT

# run NAME THREADS MODE BUSY: one training run (MODE default, fixed or
# before); appends "NAME steps/s" to $tmp/results.
run() {
    local name=$1 threads=$2 mode=$3 with_busy=$4 log=$tmp/$1.log steps=$STEPS
    local -a env=(nice -n "$NICE" env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT -u OMP_NUM_THREADS) extra=()
    [[ $mode = before ]] && env+=(GOMP_SPINCOUNT=300000) && steps=$BEFORE_STEPS
    [[ $mode = fixed ]] && env+=(OMP_WAIT_POLICY=passive)
    [[ $mode != default ]] && extra+=(--fixed-threads)
    if [[ $with_busy = busy ]]; then
        nice -n "$NICE" bash -c 'while :; do :; done' &
        busy=$!
        sleep 0.2
    fi
    "${env[@]}" "$CTRAX" train "$CONFIG" --threads "$threads" "${extra[@]}" --steps "$steps" \
        --set train.eval_steps=0 --set 'Loop.n_steps_per_checkpoint=100000' --restart --output-dir "$tmp/out_$name" \
        >"$log" 2>&1 || {
        echo "bench/threads.sh: $name failed:" >&2
        tail -5 "$log" >&2
        exit 1
    }
    if [[ -n $busy ]]; then
        kill "$busy"
        wait "$busy" 2>/dev/null || true
        busy=
    fi
    grep '^threads: [0-9]* of' "$log" | sed "s/^/  $name: /" >&2 || true
    # Steps after the first, and their seconds.
    awk -v name="$name" '/Ran [0-9]+ train steps in/ {
            for (i = 1; i <= NF; i++) if ($i == "Ran") n = $(i + 1); else if ($i == "in") s = $(i + 1);
            if (!first) { first = 1; next } steps += n; secs += s }
        END { if (secs > 0) printf "%s %.2f\n", name, steps / secs; else printf "%s nan\n", name }' \
        "$log" >>"$tmp/results"
}

echo "bench/threads: $CONFIG, $STEPS steps a run ($BEFORE_STEPS before), $REPEATS repeats, nice $NICE; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)"
echo "$("$CTRAX" info --system --threads 1 | grep -E '^(cpu|gemm kernel)')"
for ((r = 0; r < REPEATS; r++)); do
    run 2t 2 default free
    run 1t 1 default free
    run 2t_busy 2 default busy
    run 2t_busy_fixed 2 fixed busy
    run 2t_before 2 before free
    run 2t_busy_before 2 before busy
done

printf '\n%-52s %16s %16s\n' "run" "steps/s (best)" "steps/s (worst)"
row() {
    awk -v name="$1" -v label="$2" '$1 == name { v = $2 + 0; if (!n || v > hi) hi = v; if (!n || v < lo) lo = v; n++ }
        END { printf "%-52s %16.2f %16.2f\n", label, hi, lo }' "$tmp/results"
}
row 2t "2 threads alone (default)"
row 1t "1 thread alone (default)"
row 2t_busy "2 threads, one core busy (default)"
row 2t_busy_fixed "2 threads, one core busy, sleeping, fixed count"
row 2t_before "2 threads alone, before (spinning, fixed)"
row 2t_busy_before "2 threads, one core busy, before (spinning, fixed)"
best() { awk -v name="$1" '$1 == name && $2 + 0 > hi { hi = $2 + 0 } END { print hi + 0 }' "$tmp/results"; }
worst() { awk -v name="$1" '$1 == name && (!n++ || $2 + 0 < lo) { lo = $2 + 0 } END { print lo + 0 }' "$tmp/results"; }
busy2=$(best 2t_busy)
alone1_best=$(best 1t)
alone1_worst=$(worst 1t)
# With one core busy the fitted count is 1 thread on the free core: at best
# what 1 thread alone does, so a strict "at least as fast" would be decided
# by noise. A collapse (5-20x slower) is what the check is for: PASS when the
# best busy run reaches the range 1 thread alone spans over the repeats.
verdict=$(awk -v a="$busy2" -v lo="$alone1_worst" 'BEGIN { print (a >= lo ? "PASS" : "FAIL") }')
ratio=$(awk -v a="$busy2" -v b="$alone1_best" 'BEGIN { printf "%.2f", (b > 0 ? a / b : 0) }')
echo
echo "issue 13: 2 threads with one core busy $busy2 steps/s (best) vs 1 thread alone $alone1_worst-$alone1_best steps/s" \
    "(ratio of the bests $ratio): $verdict"
