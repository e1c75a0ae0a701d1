#!/usr/bin/env bash
# `ctrax train`'s command line at its edges: --steps 0 (a run of no steps,
# not the config's train.steps), a resume exactly at train.steps, and the
# setting-aside of an earlier run's files (memory_plan.json and a temporary
# checkpoint among them; a previous-<UTC time> name already taken).
#   cli_train_test.sh CTRAX
set -uo pipefail
ctrax=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")  # absolute: one run is started elsewhere
config="$(cd "$(dirname "$0")/.." && pwd)/configs/copy.gin"
source "$(dirname "$0")/cli_common.sh" cli_train_test

# --steps 0 binds train.steps = 0 (copy.gin says 1000): no step runs, the
# initial weights are the checkpoint, and the operative config says 0.
"$ctrax" train "$config" --steps 0 --output-dir "$work/zero" >"$work/zero.log" 2>&1
rc=$?
if ((rc == 0)) && grep -q '^done: step 0;' "$work/zero.log" && [[ -d $work/zero/model_0 && ! -d $work/zero/model_1 ]] &&
    grep -q '^train.steps = 0$' "$work/zero/config.gin"; then
    ok "--steps 0: no step, model_0 written, train.steps = 0 in config.gin"
else
    bad "--steps 0: exit $rc: $(tail -n 1 "$work/zero.log"); $(ls "$work/zero" | tr '\n' ' ')"
fi
# copy.gin's train.random_seed = 0 is a seed like any other, not None: none
# is drawn, and the operative config keeps 0.
if ! grep -q '^random seed:' "$work/zero.log" && grep -q '^train.random_seed = 0$' "$work/zero/config.gin"; then
    ok "train.random_seed = 0 is kept, not drawn"
else
    bad "train.random_seed = 0: $(grep '^random seed' "$work/zero.log"); $(grep random_seed "$work/zero/config.gin")"
fi

# --profile: after the run, where its steps' time went, by layer name, the
# optimizer update and the rest (the shares are of the step's time).
"$ctrax" train "$config" --steps 3 --profile --output-dir "$work/profile" >"$work/profile.log" 2>&1
rc=$?
if ((rc == 0)) && grep -q '^profile of 3 training steps, ' "$work/profile.log" &&
    grep -Eq '^  Dense +26\.0 ' "$work/profile.log" && grep -Eq '^  \(optimizer update\) +1\.0 ' "$work/profile.log" &&
    grep -Eq '^  \(rest of the step\) +[0-9.]+ +[0-9.]+%$' "$work/profile.log"; then
    ok "--profile prints the steps' time by layer (Dense: 13 forwards and 13 backwards a step)"
else
    bad "--profile: exit $rc: $(grep -A4 '^profile' "$work/profile.log" | tr '\n' ' ')"
fi

# A resume at exactly train.steps trains nothing, and says so. What a run
# stopped while writing a checkpoint left (a second Ctrl-C) goes at its
# start all the same, the writer's pid being dead; a live process's
# temporaries (a program sharing the directory by mistake) stay.
"$ctrax" train "$config" --steps 2 --output-dir "$work/two" >"$work/two.log" 2>&1
dead=$(bash -c 'echo $$')  # a pid that has exited
sleep 60 &
live=$!
mkdir "$work/two/.tmp-model_2-$dead" "$work/two/.tmp-model_2-$live"
touch "$work/two/.tmp-model_2-$dead/weights.safetensors" "$work/two/.metrics.jsonl.tmp-$dead"
"$ctrax" train "$config" --steps 2 --output-dir "$work/two" >"$work/two.log" 2>&1
if grep -q '^nothing to train: the run is at step 2, train.steps is 2 ' "$work/two.log"; then
    ok "a resume at train.steps says it trains nothing"
else
    bad "a resume at train.steps: $(tail -n 2 "$work/two.log" | tr '\n' ' ')"
fi
if [[ ! -e $work/two/.tmp-model_2-$dead && ! -e $work/two/.metrics.jsonl.tmp-$dead &&
    -d $work/two/.tmp-model_2-$live ]]; then
    ok "a resume that writes no checkpoint removes a dead writer's temporaries, not a live one's"
else
    bad "temporaries after a resume at train.steps: $(ls -A "$work/two" | tr '\n' ' ')"
fi
kill "$live"
wait "$live" 2>/dev/null
rm -rf "$work/two/.tmp-model_2-$live"

# A resume with another model (d_model 32 over a run of 64) is refused with
# the tensor, and the two ways on are said; the run there is left as it was.
before=$(ls -R "$work/two" | md5sum)
"$ctrax" train "$config" --steps 3 --output-dir "$work/two" --set TransformerLM.d_model=32 >"$work/other.log" 2>&1
rc=$?
if ((rc == 1)) && grep -q "in the checkpoint, expected (16,32) f32" "$work/other.log" &&
    grep -qxF "ctrax train: to start over instead, --restart sets the run in $work/two aside (into previous-<time>/); or train elsewhere with --output-dir DIR" "$work/other.log" &&
    [[ $(ls -R "$work/two" | md5sum) == "$before" ]]; then
    ok "a resume with another model: exit 1, the tensor named, --restart and --output-dir said"
else
    bad "a resume with another model: exit $rc: $(tail -n 2 "$work/other.log" | tr '\n' ' ')"
fi

# Without --output-dir the run writes runs/<the config's name without its
# extension> under the working directory, as the README's runs/copy.
mkdir -p "$work/cwd"
(cd "$work/cwd" && "$ctrax" train "$config" --steps 1 >"$work/cwd.log" 2>&1)
if [[ -f $work/cwd/runs/copy/model_1/manifest.json ]] && grep -q '; output runs/copy$' "$work/cwd.log"; then
    ok "no --output-dir: runs/copy"
else
    bad "no --output-dir: $(ls "$work/cwd/runs" 2>&1 | tr '\n' ' '); $(tail -n 1 "$work/cwd.log")"
fi

# --restart sets every file of the earlier run aside: memory_plan.json (the
# new run would write over it) and a temporary checkpoint a killed run left.
# The previous-<UTC time> names of the next seconds are taken already (a
# user's, or runs restarted within one second): the run takes the next free
# previous-<time>-<k>.
dir=$work/two
mkdir -p "$dir/.tmp-model_3-99"
echo '{"weights": 1}' >"$dir/memory_plan.json"
now=$(date -u +%s)
for s in 0 1 2 3 4 5; do mkdir -p "$dir/previous-$(date -u -d "@$((now + s))" +%Y%m%d-%H%M%S)"; done
"$ctrax" train "$config" --steps 1 --restart --output-dir "$dir" >"$work/restart.log" 2>&1
rc=$?
prev=$(sed -n 's|.* are now in \(.*\)$|\1|p' "$work/restart.log")
if ((rc == 0)) && [[ $prev =~ /previous-[0-9]{8}-[0-9]{6}-1$ ]] && [[ -d $prev/.tmp-model_3-99 && -d $prev/model_2 ]] &&
    [[ $(cat "$prev/memory_plan.json") == '{"weights": 1}' && ! -e $dir/.tmp-model_3-99 ]]; then
    ok "--restart sets memory_plan.json and .tmp-* aside, into $(basename "$prev")"
else
    bad "--restart: exit $rc, set aside into '$prev': $(ls -A "$prev" 2>/dev/null | tr '\n' ' '); $(tail -n 1 "$work/restart.log")"
fi

# Ctrl-C on a terminal: the live progress line (stderr, redrawn with '\r') is
# erased before the loop's "stopped at step N" line, which then starts a line
# of its own (it was written after the progress text, on the same line). A
# batch of 256 makes each step longer than the line's 0.1 s redraw period, so
# the step the stop comes after has drawn it.
if command -v script >/dev/null; then
    script -qc "sh -c '\"$ctrax\" train \"$config\" --steps 50 --set train.batch_size=256 --output-dir \"$work/tty\" &
        p=\$!; for _ in \$(seq 300); do grep -q \"step 2/50\" \"$work/tty.log\" && break; sleep 0.1; done
        kill -INT \$p; wait \$p'" /dev/null >"$work/tty.log" 2>&1
    # The stop's lines as the terminal shows them: the terminal's CR before
    # each LF dropped, then each other '\r' returns to the line's start, and
    # ESC[K erases what is right of the cursor.
    shown=$(sed 's/\r$//' "$work/tty.log" | tr '\r' '\n' | sed 's/\x1b\[K//g')
    stop_line=$(grep 'stopped at step [0-9]* on request' <<<"$shown")
    next_line=$(grep -A1 'stopped at step [0-9]* on request' <<<"$shown" | tail -n 1)
    if [[ $stop_line == "[ctrax info] stopped at step "* ]]; then
        ok "Ctrl-C on a terminal: the stop's line starts a line: $stop_line"
    else
        bad "Ctrl-C on a terminal: the stop's line shares the progress line: '$(cat -v <<<"$stop_line")'"
    fi
    # The progress line, erased, is not ended with a newline: no blank line.
    if [[ $next_line == "stopped at step "*"; checkpoint written."* ]]; then
        ok "Ctrl-C on a terminal: no blank line after the stop's line"
    else
        bad "Ctrl-C on a terminal: after the stop's line: '$(cat -v <<<"$next_line")'"
    fi
else
    ok "Ctrl-C on a terminal: no script(1) here (skipped)"
fi

# stderr and stdout closed (2>&- >&-): the run's lock file must not take their
# descriptors, or the log goes into .ctrax-lock (it did: "[ctrax info]
# resuming from ..." there), which must hold only the owner's pid.
"$ctrax" train "$config" --steps 2 --output-dir "$work/closed" >&- 2>&-
"$ctrax" train "$config" --steps 3 --output-dir "$work/closed" >&- 2>&-
rc=$?
lock=$(cat "$work/closed/.ctrax-lock" 2>/dev/null)
if ((rc == 0)) && [[ $lock =~ ^[0-9]+$ ]] && [[ -d $work/closed/model_3 ]]; then
    ok "stdout and stderr closed: the run resumed to step 3; .ctrax-lock holds '$lock'"
else
    bad "stdout and stderr closed: exit $rc; .ctrax-lock holds '$(head -c 200 <<<"$lock" | tr '\n' '|')'"
fi

# A stale lock (its owner gone; here a pid longer than any real one): taken
# over, and then the file holds the new owner's pid alone.
mkdir -p "$work/stale"
printf '99999999999999999\n' >"$work/stale/.ctrax-lock"
"$ctrax" train "$config" --steps 1 --output-dir "$work/stale" >"$work/stale.log" 2>&1 &
pid=$!
wait $pid
rc=$?
lock=$(cat "$work/stale/.ctrax-lock")
if ((rc == 0)) && [[ $lock == "$pid" ]]; then ok "a stale lock: taken over; .ctrax-lock holds '$lock'"; else
    bad "a stale lock: exit $rc; .ctrax-lock holds '$(tr '\n' '|' <<<"$lock")', want '$pid'; $(tail -n 1 "$work/stale.log")"
fi

# memory_plan.json that cannot be written whole (here a link to /dev/full, as
# a full disk): the run says so and goes on. It was written through stdio,
# and the failed close went unchecked: no word, a cut-short file.
"$ctrax" train "$config" --steps 1 --output-dir "$work/plan" >/dev/null 2>&1
rm -f "$work/plan/memory_plan.json" && ln -s /dev/full "$work/plan/memory_plan.json"
"$ctrax" train "$config" --steps 2 --output-dir "$work/plan" >"$work/plan.log" 2>&1
rc=$?
if ((rc == 0)) && grep -q "the memory plan is not written: .*memory_plan.json" "$work/plan.log" && [[ -d $work/plan/model_2 ]]; then
    ok "memory_plan.json not writable: $(grep 'memory plan is not written' "$work/plan.log")"
else
    bad "memory_plan.json not writable: exit $rc: $(grep -i 'memory' "$work/plan.log" | head -n 2)"
fi

# A disk that fills up mid-run (a 3 MiB tmpfs; mounting one needs root, else
# skipped): the checkpoint write fails with the file and ENOSPC, no
# temporary directory is left, the newest whole checkpoint is named, and the
# same command resumes from it once there is room.
full=$work/full
mkdir -p "$full"
if mount -t tmpfs -o size=3M tmpfs "$full" 2>/dev/null; then
    full_train() {
        "$ctrax" train "$config" --steps 400 --output-dir "$full/run" --set 'Loop.n_steps_per_checkpoint=20' \
            --set 'train.keep_checkpoints=100' --set 'train.eval_steps=0' >"$work/full.log" 2>&1
    }
    full_train
    rc=$?
    newest=$(cat "$full/run/checkpoint" 2>/dev/null)
    if ((rc == 1)) && grep -q "writing checkpoint .*No space left on device" "$work/full.log" &&
        grep -qxF "ctrax train: $full/run/$newest, the newest checkpoint, is whole: once the cause is mended, the same command resumes from it" "$work/full.log" &&
        ! compgen -G "$full/run/.tmp-*" >/dev/null && "$ctrax" info "$full/run" >/dev/null 2>&1; then
        ok "a full disk: exit 1, $(grep -c . <<<"$(ls -d "$full/run"/model_*)") checkpoints whole, $newest named"
    else
        bad "a full disk: exit $rc, newest '$newest': $(tail -n 2 "$work/full.log"); $(ls -a "$full/run" | tr '\n' ' ')"
    fi
    find "$full/run" -maxdepth 1 -name 'model_*' ! -name "$newest" -exec rm -rf {} +
    step=${newest#model_}
    full_train
    if grep -qF "resuming from $full/run/$newest at step $step" "$work/full.log"; then
        ok "a full disk, room made: resumed from $newest"
    else
        bad "a full disk, room made: $(grep -m 1 -E 'resum|ctrax train' "$work/full.log")"
    fi
    umount "$full"
else
    echo "skip a full disk: cannot mount a tmpfs here (not root)"
fi

cli_done
