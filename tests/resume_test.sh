#!/usr/bin/env bash
# Exact resume through the ctrax program (issue 3): a run of 200 steps with
# dropout on and shuffled data, and a run SIGKILLed at arbitrary points (so
# some kills land while a checkpoint is being written) and resumed each time
# until it reaches step 200, end with bitwise identical weights and
# optimizer slots, and the same metrics.jsonl. Each kill must leave a newest
# checkpoint that reads (ctrax info opens it, checking every byte), and each
# start must resume from that checkpoint: a program that started over at
# step 0, or from an older checkpoint, reaches the same weights and would
# otherwise pass. Both trainers: the standard one on one device, the
# memory-efficient one on two local devices.
#   resume_test.sh CTRAX CONFIG
set -uo pipefail
ctrax=$1
config=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=2
fail=0
# metrics.jsonl of two runs, timing rows aside.
same_metrics() { cmp -s <(grep -v 'steps per second' "$1/metrics.jsonl") <(grep -v 'steps per second' "$2/metrics.jsonl"); }

# check_trainer NAME ARGS...: the straight, killed and signalled runs of
# CONFIG with ARGS, in $work/NAME-*.
check_trainer() {
    local name=$1 dir
    shift
    local args=("$@") straight=$work/$name-straight killed=$work/$name-killed
    echo "== $name"
    "$ctrax" train "$config" "${args[@]}" --output-dir "$straight" >"$straight.log" 2>&1 ||
        { cat "$straight.log"; echo "FAIL: $name: the straight run failed"; fail=1; return; }
    tail -n 2 "$straight.log"

    # Kill each run once it has passed a target step and the checkpoint it
    # resumed from (then after a short random delay, so some kills land
    # inside a checkpoint write), resuming each time; the targets spread the
    # kills over the run.
    local kills=0 cut=0 target pid step want after info
    latest() { sed -n 's/^model_\([0-9]*\)$/\1/p' "$killed/checkpoint" 2>/dev/null; }
    for target in 20 60 100 140 180; do
        want=$(latest)  # the newest checkpoint: where this start must resume
        "$ctrax" train "$config" "${args[@]}" --output-dir "$killed" >"$killed.seg" 2>&1 &
        pid=$!
        for _ in $(seq 6000); do  # at most 60 s
            step=$(latest)
            if [[ -n $step && $step -ge $target && $step -gt ${want:-0} ]] || ! kill -0 "$pid" 2>/dev/null; then break; fi
            sleep 0.01
        done
        sleep "0.00$((RANDOM % 10))"
        if kill -9 "$pid" 2>/dev/null; then kills=$((kills + 1)); fi
        wait "$pid" 2>/dev/null
        cat "$killed.seg" >>"$killed.log"
        if [[ -n $want ]] && ! grep -q "resuming from $killed/model_$want at step $want\$" "$killed.seg"; then
            echo "FAIL: $name: the start after model_$want was written did not resume from it:" \
                "$(grep -o 'resuming from .*' "$killed.seg" || echo 'no resume line')"
            fail=1
        fi
        after=$(latest)
        compgen -G "$killed/.tmp-*-$pid" >/dev/null && cut=$((cut + 1))  # its own write, cut short
        # The newest checkpoint after the kill reads (every byte checked
        # against its manifest's crc32s), with no fallback to an older one.
        if [[ -z $after ]] || ! info=$("$ctrax" info "$killed" 2>&1) ||
            [[ $(head -n 1 <<<"$info") != "checkpoint   $killed/model_$after" ]]; then
            echo "FAIL: $name: after the kill near step $target the newest checkpoint 'model_$after' does not read:"
            head -n 3 <<<"$info"
            fail=1
        fi
        echo "killed near step $target (resumed at model_${want:-(none)}; newest checkpoint then: model_$after, reads)"
    done
    # The last resume runs to the end.
    want=$(latest)
    "$ctrax" train "$config" "${args[@]}" --output-dir "$killed" >"$killed.seg" 2>&1 ||
        { tail -n 20 "$killed.seg"; echo "FAIL: $name: the last resume failed"; fail=1; return; }
    cat "$killed.seg" >>"$killed.log"
    grep -q "resuming from $killed/model_$want at step $want\$" "$killed.seg" ||
        { echo "FAIL: $name: the last start did not resume from model_$want"; fail=1; }
    grep -o 'resuming from [^ ]* at step [0-9]*' "$killed.log" | sed 's|.*/||' | tr '\n' ' '
    echo
    echo "killed $kills times with SIGKILL ($cut in a checkpoint write)"

    local f
    for f in weights.safetensors slots.safetensors; do
        if cmp -s "$straight/model_200/$f" "$killed/model_200/$f"; then
            echo "model_200/$f: bitwise identical ($(stat -c %s "$straight/model_200/$f") bytes)"
        else
            echo "FAIL: $name: model_200/$f differs between the straight and the killed-and-resumed run"
            fail=1
        fi
    done
    if same_metrics "$straight" "$killed"; then
        echo "metrics.jsonl: equal ($(grep -vc 'steps per second' "$straight/metrics.jsonl") rows, timing aside)"
    else
        echo "FAIL: $name: metrics.jsonl differs between the straight and the killed-and-resumed run"
        fail=1
    fi
    if ((kills == 0)); then echo "FAIL: $name: no run was killed (too fast?)"; fail=1; fi

    # SIGINT and SIGTERM finish the step, write a checkpoint of it and exit
    # 128 + the signal's number (130, 143): the run is not finished.
    local sig rc stopped same sigdir=$work/$name-signal
    for sig in INT TERM; do
        local want_rc=$((128 + $(kill -l "$sig")))
        rm -rf "$sigdir"
        "$ctrax" train "$config" "${args[@]}" --output-dir "$sigdir" >"$sigdir.log" 2>&1 &
        pid=$!
        for _ in $(seq 600); do
            [[ -f $sigdir/checkpoint ]] && break
            sleep 0.01
        done
        kill -s "$sig" "$pid"
        wait "$pid"
        rc=$?
        stopped=$(sed -n 's/^stopped at step \([0-9]*\);.*/\1/p' "$sigdir.log")
        if ((rc != want_rc)) || [[ -z $stopped ]] || [[ ! -f $sigdir/model_$stopped/state.json ]]; then
            echo "FAIL: $name: SIG$sig: exit $rc (want $want_rc), stopped at '${stopped}', checkpoint model_${stopped} missing?"
            tail -n 5 "$sigdir.log"
            fail=1
            continue
        fi
        echo "SIG$sig: exit $rc, stopped at step $stopped with checkpoint model_$stopped"
        # The same command continues to the end, bit for bit the straight run,
        # with its metrics (all but the timings).
        "$ctrax" train "$config" "${args[@]}" --output-dir "$sigdir" >>"$sigdir.log" 2>&1
        rc=$?
        same=0
        for f in weights.safetensors slots.safetensors; do
            cmp -s "$straight/model_200/$f" "$sigdir/model_200/$f" && same=$((same + 1))
        done
        if ((rc == 0 && same == 2)) && grep -q "resuming from $sigdir/model_$stopped at step $stopped\$" "$sigdir.log" &&
            same_metrics "$straight" "$sigdir"; then
            echo "SIG$sig: resumed from step $stopped, model_200 and metrics.jsonl equal the straight run's"
        else
            echo "FAIL: $name: SIG$sig: resumed from step $stopped: exit $rc, $same of 2 files equal," \
                "no resume from model_$stopped, or metrics.jsonl differs"
            tail -n 3 "$sigdir.log"
            fail=1
        fi
    done
}

check_trainer standard
# The operative config the run saved builds the model again: sample and eval read it.
"$ctrax" sample "$work/standard-straight" --prompt 'A ' --length 20 --seed 1 >"$work/sample.txt" 2>"$work/sample.err" &&
    "$ctrax" eval "$work/standard-straight" --steps 1 >"$work/eval.txt" 2>&1 ||
    { cat "$work/sample.err" "$work/eval.txt"; fail=1; }
echo "sample from the run: $(head -c 40 "$work/sample.txt")"
# The reversible trainer keeps its weights, slots and per-device state in
# slabs of its own, each saved and restored on its own path.
check_trainer memory-efficient --set train.use_memory_efficient_trainer=True --devices 2
grep -q "memory-efficient trainer, 2 device(s) x 1 process(es)" "$work/memory-efficient-straight.log" ||
    { echo "FAIL: the memory-efficient run did not say it ran that trainer on 2 devices"; fail=1; }
if ((fail)); then echo "resume_test: 0 passed, 1 failed"; exit 1; fi
echo "resume_test: 1 passed, 0 failed"
