#!/usr/bin/env bash
# The soak test (issue 10): trains a small model that checkpoints every few
# steps and evaluates often, killing `ctrax train` with SIGKILL at random
# moments at least KILLS times and resuming it each time until it finishes,
# then compares the result with an uninterrupted run of the same config:
#   - weights and optimizer slots of the final checkpoint, bit for bit;
#   - state.json of the final checkpoint (timing rows of its history aside);
#   - metrics.jsonl: the same rows in the same order, timing rows aside;
#   - TensorBoard (train/ and eval/): what each tag shows after TensorBoard's
#     SessionLog START semantics, timing tags aside.
# Prints where each kill landed and PASS/FAIL per comparison; exits 1 on any
# difference, 2 on bad usage.
#
#   scripts/soak.sh [KILLS] [SEED]      KILLS >= 1 (default 20); SEED seeds the
#                                       random steps and delays (default: the clock)
# Environment:
#   CTRAX        the ctrax program [build/ctrax]
#   SOAK_CONFIG  the gin config [tests/configs/soak.gin]
#   SOAK_STEPS   train until this step (--steps) instead of the config's train.steps
#   SOAK_WORK    a directory for the runs (must not exist) [a temporary one]
#   SOAK_KEEP=1  keep the runs' directory at the end
#   SOAK_TIMING  a Python regex: the metrics it matches are timing rows [per.second|secs?\b|seconds|elapsed]
#   PYTHON       a Python 3 with numpy [/usr/bin/python3]
#
# Where the kills land: each start picks a random step t past the newest
# checkpoint (up to twice the steps left shared among the kills left, plus
# two shares, and never so late that the kill could land after the end:
# lag_steps below), waits for
# the first checkpoint at or past t, then sleeps a random delay of up to one
# checkpoint interval's worth of time (as the uninterrupted run took it), so
# the kill lands anywhere in the next interval: steps, an eval, the metric
# flush, the next checkpoint write. One start in eight is instead killed a
# random moment into its startup (restore, metrics.jsonl truncation, first
# steps). Progress is counted in steps, not seconds, so a machine that gets
# faster or slower under the soak (it is shared) changes nothing.
set -uo pipefail

usage() {
    echo "usage: scripts/soak.sh [KILLS] [SEED]   (KILLS >= 1, default 20; SEED an integer)" >&2
    exit 2
}
if [[ ${1:-} == -h || ${1:-} == --help ]]; then
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    exit 0
fi
(($# <= 2)) || usage
wanted=${1:-20}
seed=${2:-$(($(date +%s%N) / 1000 % 1000000))}
if ! [[ $wanted =~ ^[0-9]{1,4}$ ]] || ((wanted < 1)); then usage; fi
[[ $seed =~ ^[0-9]{1,9}$ ]] || usage

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ctrax=${CTRAX:-$root/build/ctrax}
config=${SOAK_CONFIG:-$root/tests/configs/soak.gin}
python=${PYTHON:-/usr/bin/python3}
timing=${SOAK_TIMING:-'per.second|secs?\b|seconds|elapsed'}
[[ -x $ctrax ]] || { echo "soak: $ctrax is not an executable ctrax (set CTRAX)" >&2; exit 2; }
[[ -f $config ]] || { echo "soak: config $config not found (SOAK_CONFIG)" >&2; exit 2; }
"$python" -c 'import numpy' 2>/dev/null || { echo "soak: $python has no numpy (set PYTHON)" >&2; exit 2; }
steps_args=()
if [[ -n ${SOAK_STEPS:-} ]]; then
    [[ $SOAK_STEPS =~ ^[1-9][0-9]{0,6}$ ]] || { echo "soak: SOAK_STEPS=$SOAK_STEPS is not a step count (1 or more)" >&2; exit 2; }
    steps_args=(--steps "$SOAK_STEPS")
fi
if [[ -n ${SOAK_WORK:-} ]]; then
    mkdir "$SOAK_WORK" || { echo "soak: SOAK_WORK=$SOAK_WORK: cannot create (must not exist)" >&2; exit 2; }
    work=$(cd "$SOAK_WORK" && pwd)
else
    work=$(mktemp -d "${TMPDIR:-/tmp}/ctrax-soak.XXXXXX")
fi
pid=
cleanup() {
    if [[ -n $pid ]]; then kill -9 "$pid" 2>/dev/null && wait "$pid" 2>/dev/null; fi
    if [[ ${SOAK_KEEP:-0} == 1 ]]; then echo "soak: runs kept in $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM
# One thread: the same arithmetic in both runs however loaded the machine is
# (OpenMP threads that spin on a busy machine also make the timing erratic).
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
RANDOM=$seed
now_ms() { echo $(($(date +%s%N) / 1000000)); }
secs() { printf '%d.%03d' $(($1 / 1000)) $(($1 % 1000)); }
echo "soak: $ctrax train $config ${steps_args[*]}; at least $wanted kills, seed $seed, OMP_NUM_THREADS=$OMP_NUM_THREADS"

# ---- the uninterrupted run, and how long a start takes --------------------------------------
t0=$(now_ms)
"$ctrax" train "$config" --output-dir "$work/straight" "${steps_args[@]}" >"$work/straight.log" 2>&1 ||
    { tail -n 20 "$work/straight.log"; echo "soak: FAIL: the uninterrupted run failed"; exit 1; }
straight_ms=$(($(now_ms) - t0))
last=$(sed -n 's/^done: step \([0-9]*\);.*/\1/p' "$work/straight.log")
[[ -n $last && $last -ge 1 && -d $work/straight/model_$last ]] ||
    { tail -n 5 "$work/straight.log"; echo "soak: FAIL: no final checkpoint in the uninterrupted run"; exit 1; }
t0=$(now_ms)
"$ctrax" train "$config" --output-dir "$work/probe" --steps 1 >"$work/probe.log" 2>&1 ||
    { tail -n 20 "$work/probe.log"; echo "soak: FAIL: a one-step run failed"; exit 1; }
start_ms=$(($(now_ms) - t0))
rm -rf "$work/probe"
step_us=$(((straight_ms > start_ms ? straight_ms - start_ms : 1) * 1000 / last))
((step_us > 0)) || step_us=1
gap=$(sed -n 's/^Loop\.n_steps_per_checkpoint = \([0-9]*\)$/\1/p' "$work/straight/config.gin")
[[ $gap =~ ^[0-9]+$ ]] && ((gap >= 1)) || gap=1
# How late a kill lands: the polling that sees a checkpoint and the commands
# between the planned moment and the kill start processes (sleep, date, ls),
# tens of milliseconds in all: 10 steps of a 4 ms step on a 2-core machine,
# which let a kill planned near the end land after the run had finished.
# Measured here on that same path, three times; the largest, doubled for a
# machine that slows under the soak, in steps (lag_steps) keeps each kill's
# window that far from the end.
lag_ms=0
for _ in 1 2 3; do
    t0=$(now_ms)
    read -r _ 2>/dev/null <"$work/straight/checkpoint"
    sleep 0.01
    sleep "$(secs 0)"
    fds=$(ls -l "/proc/$$/fd" 2>/dev/null)
    t0=$(($(now_ms) - t0))
    ((t0 > lag_ms)) && lag_ms=$t0
done
lag_steps=$(((2 * lag_ms * 1000 + step_us - 1) / step_us))
echo "uninterrupted: $last steps in $(secs "$straight_ms") s, a checkpoint every $gap;" \
    "a start (and one step) takes $(secs "$start_ms") s; a kill lands up to $(secs "$lag_ms") s late ($lag_steps steps, doubled)"

# ---- the run killed at random ---------------------------------------------------------------
run=$work/killed
latest() { sed -n 's/^model_\([0-9]*\)$/\1/p' "$run/checkpoint" 2>/dev/null; }
# Rows metrics.jsonl / log lines of the uninterrupted run hold at a step.
straight_rows() { grep -c "^{\"step\": $1," "$work/straight/metrics.jsonl"; }
straight_lines() { grep -c "^Step *$1: " "$work/straight.log"; }

# The first of its arguments that exists (an unmatched glob stays as written).
first() {
    local f
    for f in "$@"; do
        if [[ -e $f ]]; then
            echo "$f"
            return
        fi
    done
}

# where PID LOG RESUMED FDS: where the kill of PID landed, from what it left
# behind (temporary files of its writes and pruning, the newest checkpoint, metrics.jsonl,
# its log) and the files it had open just before the kill. Sets reached, kind
# and phase.
where() {
    local p=$1 log=$2 resumed=$3 fds=$4 ckpt tmp n lines rows
    ckpt=$(latest)
    ckpt=${ckpt:-0}
    reached=$((ckpt > resumed ? ckpt : resumed))
    n=$(sed -n 's/^Step *\([0-9]*\): .*/\1/p' "$log" | tail -n 1)
    if [[ -n $n ]] && ((n > reached)); then reached=$n; fi
    tmp=$(first "$run"/.tmp-*-"$p")
    if [[ -n $tmp ]]; then
        tmp=${tmp##*/.tmp-}
        tmp=${tmp%-"$p"}
        kind="checkpoint write"; phase="checkpoint write ($tmp)"
        n=${tmp##*_}
        if [[ $n =~ ^[0-9]+$ ]] && ((n > reached)); then reached=$n; fi
        return
    fi
    tmp=$(first "$run"/.old-*-"$p")
    if [[ -n $tmp ]]; then
        tmp=${tmp##*/.old-}
        kind="checkpoint write"
        phase="checkpoint pruning (removing ${tmp%-"$p"})"
        return
    fi
    tmp=$(first "$run"/.*.tmp-"$p")
    if [[ -n $tmp ]]; then
        tmp=${tmp##*/.}
        tmp=${tmp%.tmp-"$p"}
        case $tmp in
            checkpoint) kind="checkpoint write"; phase="checkpoint write (the checkpoint pointer)" ;;
            metrics.jsonl) kind="startup"; phase="startup (truncating metrics.jsonl)" ;;
            *) kind="startup"; phase="startup (writing $tmp)" ;;
        esac
        return
    fi
    if ! grep -q 'metrics.jsonl' <<<"$fds"; then
        kind="startup"
        phase="startup (restoring model_$resumed, summaries not open yet)"
        return
    fi
    if [[ -n $n ]] && ((n == reached && n > ckpt)); then
        lines=$(grep -c "^Step *$n: " "$log")
        rows=$(grep -c "^{\"step\": $n," "$run/metrics.jsonl")
        if ((lines < $(straight_lines "$n"))); then
            kind="eval"
            phase="eval at step $n"
        elif ((rows < $(straight_rows "$n"))); then
            kind="metrics flush"
            phase="metrics flush at step $n ($rows of $(straight_rows "$n") rows written)"
        else
            kind="metrics flush"
            phase="after the metrics flush at step $n, before its checkpoint"
        fi
        return
    fi
    if grep -q '\.tmp-' <<<"$fds"; then
        kind="checkpoint write"
        phase="end of the checkpoint write of model_$ckpt (complete when the kill landed)"
        return
    fi
    kind="training steps"
    phase="training steps after model_$ckpt"
}

# wait_for_checkpoint STEP: waits until run $pid has a checkpoint at or past
# STEP (returns 0 then, with its step in seen, or when the run has exited:
# the caller reads its status), at most patience_ms; 1 if it made no such
# progress in that time.
patience_ms=$((60000 + 20 * straight_ms))
wait_for_checkpoint() {
    local line until=$(($(now_ms) + patience_ms))
    while kill -0 "$pid" 2>/dev/null; do
        line=
        read -r line 2>/dev/null <"$run/checkpoint"
        line=${line#model_}
        if [[ $line =~ ^[0-9]+$ ]] && ((line >= $1)); then
            seen=$line
            return 0
        fi
        if (($(now_ms) > until)); then return 1; fi
        sleep 0.01
    done
    return 0
}

kills=0
attempts=0
declare -A phases
max_attempts=$((wanted * 10 + 50))
while :; do
    attempts=$((attempts + 1))
    if ((attempts > max_attempts)); then
        echo "soak: FAIL: $attempts starts without reaching step $last"
        exit 1
    fi
    log=$work/run_$attempts.log
    ckpt=$(latest)
    ckpt=${ckpt:-0}
    if ((kills >= wanted)); then
        "$ctrax" train "$config" --output-dir "$run" "${steps_args[@]}" >"$log" 2>&1
        rc=$?
        ((rc == 0)) || { tail -n 20 "$log"; echo "soak: FAIL: the last resume exited $rc"; exit 1; }
        break
    fi
    # A step to wait for: up to twice the steps left shared among the kills
    # left (and two more shares), early enough that the kill, up to a
    # checkpoint interval after the checkpoint it waits for, a delay of
    # another interval and lag_steps late, lands before the end.
    share=$(((last - ckpt) / (wanted - kills + 2)))
    span=$((2 * share - gap))
    ((span >= 1)) || span=1
    target=$((ckpt + 1 + ((RANDOM << 15) | RANDOM) % span))
    latest_target=$((last - 2 * gap - lag_steps))
    if ((target > latest_target)); then target=$latest_target; fi
    if ((target <= ckpt || RANDOM % 8 == 0)); then
        target=  # killed in its startup
        delay=$((((RANDOM << 15) | RANDOM) % (start_ms + 1)))
    else
        delay=$((((RANDOM << 15) | RANDOM) % (gap * step_us / 1000 + 1)))
    fi
    t0=$(now_ms)
    seen=
    "$ctrax" train "$config" --output-dir "$run" "${steps_args[@]}" >"$log" 2>&1 &
    pid=$!
    if [[ -n $target ]] && ! wait_for_checkpoint "$target"; then
        echo "soak: FAIL: run $attempts got no checkpoint at or past step $target in $((patience_ms / 1000)) s"
        exit 1
    fi
    sleep "$(secs "$delay")"
    fds=$(ls -l "/proc/$pid/fd" 2>/dev/null)
    kill -9 "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    rc=$?
    alive=$(($(now_ms) - t0))
    # A run killed before it printed where it resumed restored the newest
    # checkpoint there was when it started.
    resumed=$(sed -n 's/.*resuming from .* at step \([0-9]*\).*/\1/p' "$log" | head -n 1)
    resumed=${resumed:-$ckpt}
    if ((rc == 137)); then
        kills=$((kills + 1))
        where "$pid" "$log" "$resumed" "$fds"
        # Between checkpoints, the clock tells more: the checkpoint seen,
        # then the delay at the uninterrupted run's pace (within the interval).
        if [[ $kind == "training steps" && -z $target ]]; then
            kind="startup"
            phase="startup or the first steps after model_$reached (summaries open)"
        elif [[ $kind == "training steps" && -n $seen ]]; then
            est=$((seen + delay * 1000 / step_us))
            ((est > reached)) || est=$((reached + 1))
            ((est <= reached + gap)) || est=$((reached + gap))
            phase="$phase (about step $est by the clock)"
        fi
        phases[$kind]=$((${phases[$kind]:-0} + 1))
        printf 'kill %2d after %s s: resumed at step %d, reached step %d: %s\n' "$kills" "$(secs "$alive")" \
            "$resumed" "$reached" "$phase"
    elif ((rc == 0)); then
        pid=
        echo "run $attempts finished (step $last) before its kill, after $kills kills"
        break
    else
        pid=
        tail -n 20 "$log"
        echo "soak: FAIL: run $attempts (resumed at step $resumed) exited $rc, not killed"
        exit 1
    fi
    pid=
done
echo "resumed from, start by start (- for a fresh start): $(for ((i = 1; i <= attempts; i++)); do
    from=$(sed -n 's|.*resuming from .*/\([^/ ]*\) at step .*|\1|p' "$work/run_$i.log" | head -n 1)
    echo "${from:--}"
done | tr '\n' ' ')"
echo "kills landed: $kills in $attempts starts (wanted >= $wanted), by phase:"
for p in "${!phases[@]}"; do printf '  %3d  %s\n' "${phases[$p]}" "$p"; done | sort -k1,1nr

# ---- comparisons ------------------------------------------------------------------------------
"$python" - "$root/tests" "$work/straight" "$run" "$last" "$timing" <<'EOF'
import json
import re
import sys

sys.path.insert(0, sys.argv[1])
import read_safetensors  # noqa: E402
import read_tfevents  # noqa: E402

straight, killed, last, timing = sys.argv[2], sys.argv[3], int(sys.argv[4]), re.compile(sys.argv[5])
failures = 0


def report(name, diffs, ok_text):
    global failures
    if diffs:
        failures += 1
        print(f"FAIL {name}: {len(diffs)} difference(s)")
        for d in diffs[:8]:
            print(f"       {d}")
    else:
        print(f"PASS {name}: {ok_text}")


def guarded(name, fn):
    # The readers exit on a malformed file: that is this comparison's FAIL.
    try:
        fn()
    except SystemExit:
        report(name, ["a file did not read (above)"], "")
    except (OSError, ValueError, KeyError) as e:
        report(name, [f"{type(e).__name__}: {e}"], "")


def tensors(f):
    def run():
        a, b = f"{straight}/model_{last}/{f}", f"{killed}/model_{last}/{f}"
        with open(a, "rb") as x, open(b, "rb") as y:
            same = x.read() == y.read()
        n = len(read_safetensors.read(a)[0])
        report(f"model_{last}/{f}", read_safetensors.bitwise_diff(a, b),
               f"{n} tensors bitwise equal" + (" (files byte for byte identical)" if same else ""))
    guarded(f"model_{last}/{f}", run)


def state():
    def load(d):
        with open(f"{d}/model_{last}/state.json") as f:
            s = json.load(f)
        if isinstance(s.get("history"), list):
            s["history"] = [h for h in s["history"] if not (isinstance(h, list) and len(h) > 1
                                                             and timing.search(str(h[1])))]
        return s
    def first_difference(path, x, y):
        if isinstance(x, dict) and isinstance(y, dict):
            for k in sorted(set(x) | set(y)):
                if x.get(k) != y.get(k):
                    return first_difference(f"{path}.{k}", x.get(k), y.get(k))
        if isinstance(x, list) and isinstance(y, list) and x != y:
            for i, (u, v) in enumerate(zip(x, y)):
                if u != v:
                    return first_difference(f"{path}[{i}]", u, v)
            return f"{path}: {len(x)} entries uninterrupted, {len(y)} killed and resumed"
        return f"{path}: uninterrupted {json.dumps(x)[:100]} != killed {json.dumps(y)[:100]}"

    a, b = load(straight), load(killed)
    diffs = [first_difference(k, a.get(k), b.get(k)) for k in sorted(set(a) | set(b)) if a.get(k) != b.get(k)]
    report(f"model_{last}/state.json", diffs, f"equal ({len(a)} fields; timing rows of the history aside)")


def metrics():
    def rows(d):
        out = []
        with open(f"{d}/metrics.jsonl") as f:
            for i, line in enumerate(f, 1):
                try:
                    r = json.loads(line)
                except ValueError:
                    out.append(("unparsable line", i, line.strip()[:80]))
                    continue
                if not timing.search(str(r.get("metric"))):
                    out.append((r.get("step"), r.get("mode"), r.get("metric"), r.get("value"), r.get("nonfinite")))
        return out
    a, b = rows(straight), rows(killed)
    diffs = [f"row {i + 1}: uninterrupted {x} != killed {y}" for i, (x, y) in enumerate(zip(a, b)) if x != y]
    if len(a) != len(b):
        diffs.append(f"{len(a)} rows uninterrupted, {len(b)} killed and resumed")
    report("metrics.jsonl", diffs, f"{len(a)} rows equal, in order (timing rows aside)")


def tensorboard(mode):
    a, sa = read_tfevents.tensorboard_scalars(f"{straight}/{mode}")
    b, sb = read_tfevents.tensorboard_scalars(f"{killed}/{mode}")
    diffs = []
    for tag in sorted(set(a) | set(b)):
        if timing.search(tag):
            continue
        x, y = a.get(tag, []), b.get(tag, [])
        if x != y:
            bad = next((i for i, (u, v) in enumerate(zip(x, y)) if u != v), min(len(x), len(y)))
            diffs.append(f"{tag}: {len(x)} vs {len(y)} points; first difference at point {bad}: "
                         f"{x[bad] if bad < len(x) else None} != {y[bad] if bad < len(y) else None}")
    n = sum(len(v) for t, v in a.items() if not timing.search(t))
    report(f"TensorBoard {mode}/", diffs,
           f"{n} scalars of {len([t for t in a if not timing.search(t)])} tags equal; the killed run wrote "
           f"{sb['files']} files, {sb['starts']} START events discarded {sb['purged']} orphaned scalars"
           + (f", {sb['truncated']} files end in a cut record" if sb["truncated"] else ""))


tensors("weights.safetensors")
tensors("slots.safetensors")
guarded(f"model_{last}/state.json", state)
guarded("metrics.jsonl", metrics)
guarded("TensorBoard train/", lambda: tensorboard("train"))
guarded("TensorBoard eval/", lambda: tensorboard("eval"))
sys.exit(1 if failures else 0)
EOF
cmp_rc=$?
if ((kills < wanted)); then
    echo "FAIL kills: only $kills of the $wanted wanted landed before the run finished (rerun; the machine sped up?)"
    cmp_rc=1
fi
if ((cmp_rc != 0)); then
    echo "soak: FAIL ($kills kills, seed $seed)"
    exit 1
fi
echo "soak: PASS ($kills kills, seed $seed)"
