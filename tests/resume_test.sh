#!/usr/bin/env bash
# Exact resume through the ctrax program (issue 3): a run of 200 steps with
# dropout on and shuffled data, and a run SIGKILLed at arbitrary points (so
# some kills land while a checkpoint is being written) and resumed each time
# until it reaches step 200, end with bitwise identical weights and
# optimizer slots.
#   resume_test.sh CTRAX CONFIG
set -uo pipefail
ctrax=$1
config=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2

"$ctrax" train "$config" --output-dir "$work/straight" >"$work/straight.log" 2>&1 ||
    { cat "$work/straight.log"; echo "resume_test: 0 passed, 1 failed"; exit 1; }
tail -n 2 "$work/straight.log"
# The operative config the run saved builds the model again: sample and eval read it.
"$ctrax" sample "$work/straight" --prompt 'A ' --length 20 --seed 1 >"$work/sample.txt" 2>"$work/sample.err" &&
    "$ctrax" eval "$work/straight" --steps 1 >"$work/eval.txt" 2>&1 ||
    { cat "$work/sample.err" "$work/eval.txt"; echo "resume_test: 0 passed, 1 failed"; exit 1; }
echo "sample from the run: $(head -c 40 "$work/sample.txt")"

# Kill each run once it has passed a target step (then after a short
# random delay, so some kills land inside a checkpoint write), resuming each
# time; the targets spread the kills over the run.
kills=0
latest() { sed -n 's/^model_\([0-9]*\)$/\1/p' "$work/killed/checkpoint" 2>/dev/null; }
for target in 20 60 100 140 180; do
    "$ctrax" train "$config" --output-dir "$work/killed" >>"$work/killed.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do  # at most 60 s
        step=$(latest)
        if [[ -n $step && $step -ge $target ]] || ! kill -0 "$pid" 2>/dev/null; then break; fi
        sleep 0.1
    done
    sleep "0.0$((RANDOM % 10))"
    if kill -9 "$pid" 2>/dev/null; then kills=$((kills + 1)); fi
    wait "$pid" 2>/dev/null
    echo "killed near step $target (newest checkpoint then: model_$(latest))"
done
# The last resume runs to the end.
"$ctrax" train "$config" --output-dir "$work/killed" >>"$work/killed.log" 2>&1 ||
    { tail -n 20 "$work/killed.log"; echo "resume_test: 0 passed, 1 failed"; exit 1; }
grep -o 'resuming from [^ ]* at step [0-9]*' "$work/killed.log" | sed 's|.*/||' | tr '\n' ' '
echo
echo "killed $kills times with SIGKILL"

fail=0
for f in weights.safetensors slots.safetensors; do
    if cmp -s "$work/straight/model_200/$f" "$work/killed/model_200/$f"; then
        echo "model_200/$f: bitwise identical ($(stat -c %s "$work/straight/model_200/$f") bytes)"
    else
        echo "FAIL: model_200/$f differs between the straight and the killed-and-resumed run"
        fail=1
    fi
done
if ((kills == 0)); then echo "FAIL: no run was killed (too fast?)"; fail=1; fi

# SIGINT and SIGTERM finish the step, write a checkpoint of it and exit
# 128 + the signal's number (130, 143): the run is not finished.
for sig in INT TERM; do
    want=$((128 + $(kill -l "$sig")))
    rm -rf "$work/signal"
    "$ctrax" train "$config" --output-dir "$work/signal" >"$work/signal.log" 2>&1 &
    pid=$!
    for _ in $(seq 600); do
        [[ -f $work/signal/checkpoint ]] && break
        sleep 0.1
    done
    kill -s "$sig" "$pid"
    wait "$pid"
    rc=$?
    stopped=$(sed -n 's/^stopped at step \([0-9]*\);.*/\1/p' "$work/signal.log")
    if ((rc != want)) || [[ -z $stopped ]] || [[ ! -f $work/signal/model_$stopped/state.json ]]; then
        echo "FAIL: SIG$sig: exit $rc (want $want), stopped at '${stopped}', checkpoint model_${stopped} missing?"
        tail -n 5 "$work/signal.log"
        fail=1
    else
        echo "SIG$sig: exit $rc, stopped at step $stopped with checkpoint model_$stopped"
        # The same command continues to the end, bit for bit the straight run,
        # with its metrics (all but the timings).
        "$ctrax" train "$config" --output-dir "$work/signal" >>"$work/signal.log" 2>&1
        rc=$?
        same=0
        for f in weights.safetensors slots.safetensors; do
            cmp -s "$work/straight/model_200/$f" "$work/signal/model_200/$f" && same=$((same + 1))
        done
        if ((rc == 0 && same == 2)) && cmp -s <(grep -v 'steps per second' "$work/straight/metrics.jsonl") \
            <(grep -v 'steps per second' "$work/signal/metrics.jsonl"); then
            echo "SIG$sig: resumed from step $stopped, model_200 and metrics.jsonl equal the straight run's"
        else
            echo "FAIL: SIG$sig: resumed from step $stopped: exit $rc, $same of 2 files equal, or metrics.jsonl differs"
            tail -n 3 "$work/signal.log"
            fail=1
        fi
    fi
done
if ((fail)); then echo "resume_test: 0 passed, 1 failed"; exit 1; fi
echo "resume_test: 1 passed, 0 failed"
