#!/usr/bin/env bash
# The Loop's Trax semantics through `ctrax train` (issue 14, Deliver 2):
# train.permanent_checkpoint_frequency (with the step-1 checkpoint) and
# Loop.permanent_checkpoints_at kept whatever keep_checkpoints says;
# train.checkpoints_at and Loop.eval_at; train.random_seed unset drawn,
# logged, recorded in config.gin and state.json, and reused by a resume (the
# interrupted run ends bit-equal to an uninterrupted one started with the
# recorded seed); train.init_checkpoint (another run's weights, step 0) and
# its errors, which name the setting; eval/ bindings build the eval model;
# step lists with a step twice or below 1, a permanent period with a permanent
# list, and a manifest's "keep" edited to a non-boolean, each refused by name.
#   cli_loop_test.sh CTRAX
set -uo pipefail
ctrax=$1
source "$(dirname "$0")/cli_common.sh" cli_loop_test

# A small run: the copy task and a one-layer TransformerLM with dropout (so
# the seed matters to every step), no random_seed bound.
cat >"$work/base.gin" <<'EOF'
train.model = @TransformerLM
train.inputs = @sequence_copy_inputs
train.optimizer = @Adam
train.lr_schedule_fn = None
train.batch_size = 4
train.steps = 6
train.eval_steps = 1
train.keep_checkpoints = 1
Loop.n_steps_per_checkpoint = 2
sequence_copy_inputs.vocab_size = 8
sequence_copy_inputs.train_length = 5
sequence_copy_inputs.eval_min_length = 4
sequence_copy_inputs.eval_max_length = 5
sequence_copy_inputs.pad_to_multiple = 1
TransformerLM.vocab_size = 8
TransformerLM.d_model = 16
TransformerLM.d_ff = 32
TransformerLM.n_layers = 1
TransformerLM.n_heads = 2
TransformerLM.max_len = 16
TransformerLM.dropout = 0.1
EOF
b=$work/base.gin

# train NAME ARGS...: `ctrax train ARGS`, output in NAME.log; 0 when it exits 0.
train() {
    local name=$1
    shift
    "$ctrax" train "$@" >"$work/$name.log" 2>&1 && return 0
    bad "$name: exit $?: $(tail -n 3 "$work/$name.log")"
    return 1
}
# kept DIR NAME: "1" (marked kept), "0" (regular) or "-" (absent).
kept() {
    local m=$1/$2/manifest.json
    if [[ ! -f $m ]]; then echo -; elif grep -q '"keep":[[:space:]]*true' "$m"; then echo 1; else echo 0; fi
}

# refused NAME WANT ARGS...: `ctrax train base.gin ARGS` exits 1, says WANT (a fixed
# string) and writes no checkpoint.
refused() {
    local name=$1 want=$2
    shift 2
    "$ctrax" train "$b" --set 'train.random_seed=1' "$@" --output-dir "$work/$name" >"$work/$name.log" 2>&1
    local rc=$?
    ((rc == 1)) && grep -qF -- "$want" "$work/$name.log" && [[ ! -d $work/$name/model_1 ]] &&
        ok "$name: $(tail -n 1 "$work/$name.log" | cut -c1-160)" ||
        bad "$name: exit $rc: $(tail -n 2 "$work/$name.log")"
}

# ---- permanent checkpoints -----------------------------------------------------
if train perm "$b" --set 'train.random_seed=1' --set 'train.permanent_checkpoint_frequency=4' \
    --set 'train.steps=9' --output-dir "$work/perm"; then
    got="$(kept "$work/perm" model_1)$(kept "$work/perm" model_2)$(kept "$work/perm" model_4)"
    got+="$(kept "$work/perm" model_6)$(kept "$work/perm" model_8)$(kept "$work/perm" model_9)"
    # 1, 4, 8 permanent; 2 and 6 pruned (keep 1); 9 the newest regular one.
    [[ $got == "1-1-10" ]] && ok "permanent_checkpoint_frequency=4: model_1, model_4, model_8 kept, regular ones pruned" ||
        bad "permanent_checkpoint_frequency=4: model_1,2,4,6,8,9 are $got (want 1-1-10)"
fi
if train perm_at "$b" --set 'train.random_seed=1' --config 'Loop.permanent_checkpoints_at = [3, 5]' \
    --config 'train.checkpoints_at = [2, 4]' --output-dir "$work/perm_at"; then
    got=""
    for s in 1 2 3 4 5 6; do got+=$(kept "$work/perm_at" model_$s); done
    # Regular at 2 and 4 (and the final 6), one kept; permanent 3 and 5.
    [[ $got == "--1-10" ]] && ok "Loop.permanent_checkpoints_at=[3, 5], train.checkpoints_at=[2, 4]: $got" ||
        bad "permanent_checkpoints_at / checkpoints_at: model_1..6 are $got (want --1-10)"
fi
refused both "train.checkpoints_at and --config:1:1: Loop.checkpoints_at give different steps" \
    --config 'train.checkpoints_at = [2]' --config 'Loop.checkpoints_at = [3]'
refused zero "train.checkpoints_at[0] = 0: steps start at 1" --config 'train.checkpoints_at = [0]'
# A step twice (a typo for another step, most likely), a step 0 in Loop.eval_at, and a
# permanent period with a permanent list (Trax's train refuses both): each refused
# naming the setting and where it is bound.
refused twice "--config:1:1: train.checkpoints_at lists step 2 twice ([0] and [2])" \
    --config 'train.checkpoints_at = [2, 4, 2]'
refused perm_twice "Loop.permanent_checkpoints_at lists step 3 twice" --config 'Loop.permanent_checkpoints_at = [3, 3]'
refused eval_zero "--config:1:1: Loop.eval_at[0] = 0: steps start at 1" --config 'Loop.eval_at = [0, 2]'
refused eval_twice "Loop.eval_at lists step 5 twice" --config 'Loop.eval_at = [5, 5]'
refused perm_both "--set:1:1: train.permanent_checkpoint_frequency = 4 and --config:1:1: Loop.permanent_checkpoints_at are both bound" \
    --set 'train.permanent_checkpoint_frequency=4' --config 'Loop.permanent_checkpoints_at = [3]'

# ---- a manifest edited by hand ------------------------------------------------------
# "keep": "yes" is not read as false (and then pruned): the checkpoint does not
# load, and with no other to fall back on, the resume stops naming the file and field.
if train keep_edit "$b" --set 'train.random_seed=1' --set 'train.steps=2' --output-dir "$work/keep_edit"; then
    sed -i 's/"keep":[[:space:]]*false/"keep": "yes"/' "$work/keep_edit/model_2/manifest.json"
    "$ctrax" train "$b" --set 'train.random_seed=1' --set 'train.steps=3' --output-dir "$work/keep_edit" \
        >"$work/keep_edit2.log" 2>&1
    rc=$?
    ((rc == 1)) && grep -q 'model_2/manifest.json: "keep" is not true or false' "$work/keep_edit2.log" &&
        [[ -f $work/keep_edit/model_2/manifest.json && ! -d $work/keep_edit/model_3 ]] &&
        ok "manifest \"keep\": \"yes\": $(tail -n 1 "$work/keep_edit2.log" | cut -c1-160)" ||
        bad "manifest \"keep\": \"yes\": exit $rc: $(tail -n 2 "$work/keep_edit2.log")"
fi

# ---- Loop.eval_at --------------------------------------------------------------
if train eval_at "$b" --set 'train.random_seed=1' --config 'Loop.eval_at = [2, 5]' --output-dir "$work/eval_at"; then
    steps=$(grep '"mode": "eval"' "$work/eval_at/metrics.jsonl" | sed 's/.*"step": \([0-9]*\).*/\1/' | sort -un |
        tr '\n' ' ')
    [[ $steps == "2 5 " ]] && ok "Loop.eval_at = [2, 5]: evals at steps $steps" ||
        bad "Loop.eval_at = [2, 5]: evals at steps '$steps'"
fi

# train.eval_frequency = 0 disables evals (Trax's train(); ctrax evaluated at
# step 1 still); the last step's training log stays.
if train eval_off "$b" --set 'train.random_seed=1' --set 'train.eval_frequency=0' --output-dir "$work/eval_off"; then
    n_eval=$(grep -c '"mode": "eval"' "$work/eval_off/metrics.jsonl")
    last=$(grep '"metrics/loss"' "$work/eval_off/metrics.jsonl" | sed 's/.*"step": \([0-9]*\).*/\1/' | tr '\n' ' ')
    [[ $n_eval == 0 && $last == "6 " ]] && ok "train.eval_frequency = 0: no evals; the train loss logged at step 6" ||
        bad "train.eval_frequency = 0: $n_eval eval lines, train loss at steps '$last'"
fi

# ---- the eval model: eval/ bindings build the model again for the evals -----------
if train evm "$b" --set 'train.random_seed=1' --config 'eval/TransformerLM.dropout = 0.0' --output-dir "$work/evm"; then
    e1=$(grep '"mode": "eval"' "$work/evm/metrics.jsonl")
    if grep -q "^evals: the model as eval/TransformerLM, on the trained weights$" "$work/evm.log" &&
        ! grep -q "never reads it" "$work/evm.log"; then
        ok "eval/TransformerLM.dropout = 0.0: evals run the eval model (the binding is read)"
    else
        bad "eval/ binding: $(grep -E 'evals:|never reads' "$work/evm.log")"
    fi
    train evm_plain "$b" --set 'train.random_seed=1' --output-dir "$work/evm_plain" &&
        [[ -n $e1 && $e1 == "$(grep '"mode": "eval"' "$work/evm_plain/metrics.jsonl")" ]] &&
        ok "the eval model without dropout gives the evals of the model in eval mode" ||
        bad "eval model's evals differ from the model's: $(diff <(echo "$e1") <(grep '"mode": "eval"' \
            "$work/evm_plain/metrics.jsonl") | head -n 4)"
fi
refused evm_bad "eval/TransformerLM, built because the config has eval/ bindings: loop: the eval model" \
    --config 'eval/TransformerLM.d_model = 8'

# ---- random_seed unset: drawn, recorded, reused ---------------------------------
if train seed_a "$b" --steps 3 --output-dir "$work/seed"; then
    seed=$(sed -n 's/^random seed: \([0-9]*\) (train.random_seed is None: drawn from the system)$/\1/p' \
        "$work/seed_a.log")
    if [[ -n $seed ]] && grep -q "^train.random_seed = $seed\$" "$work/seed/config.gin" &&
        grep -q "\"seed_text\":[[:space:]]*\"$seed\"" "$work/seed/model_3/state.json"; then
        ok "unset random_seed: drew $seed, logged, in config.gin and state.json"
    else
        bad "unset random_seed: seed '$seed', config.gin: $(grep random_seed "$work/seed/config.gin")"
    fi
    if train seed_b "$b" --output-dir "$work/seed"; then
        grep -q "^random seed: $seed (train.random_seed is None: the one the run's checkpoint recorded)$" \
            "$work/seed_b.log" && ok "the resume reuses seed $seed" || bad "resume: $(grep 'random seed' "$work/seed_b.log")"
        if train seed_c "$b" --set "train.random_seed=$seed" --output-dir "$work/seed_straight" &&
            cmp -s "$work/seed/model_6/weights.safetensors" "$work/seed_straight/model_6/weights.safetensors" &&
            cmp -s "$work/seed/model_6/slots.safetensors" "$work/seed_straight/model_6/slots.safetensors"; then
            ok "3 steps with a drawn seed + resumed 3 = 6 steps with random_seed=$seed, bit for bit"
        else
            bad "the resumed run with a drawn seed differs from the run with random_seed=$seed"
        fi
    fi
    # Two fresh runs draw two seeds (2^-31 to fail by chance).
    if train seed_d "$b" --steps 1 --output-dir "$work/seed_d"; then
        other=$(sed -n 's/^random seed: \([0-9]*\) .*/\1/p' "$work/seed_d.log")
        [[ -n $other && $other != "$seed" ]] && ok "another run draws another seed ($other)" ||
            bad "two runs drew '$seed' and '$other'"
    fi
fi

# ---- init_checkpoint -----------------------------------------------------------
if [[ -d $work/perm/model_8 ]] && train init "$b" --set 'train.random_seed=2' --set 'train.steps=1' \
    --config "train.init_checkpoint = '$work/perm/model_8'" --output-dir "$work/init"; then
    grep -q "weights from $work/perm/model_8 (init_checkpoint); fresh optimizer slots, step 0" "$work/init.log" &&
        grep -q "^done: step 1" "$work/init.log" && ok "train.init_checkpoint: model_8's weights, trained from step 0" ||
        bad "init_checkpoint: $(grep -E 'weights from|done' "$work/init.log")"
fi
# Another model's checkpoint (d_model 8 against 16): refused naming the setting and a
# tensor, not trained on from mostly random weights.
[[ -d $work/perm/model_8 ]] && refused init_wide \
    "train.init_checkpoint = '$work/perm/model_8': loop: init_checkpoint '$work/perm/model_8': $work/perm/model_8/weights.safetensors: tensor" \
    --set 'TransformerLM.d_model=8' --config "train.init_checkpoint = '$work/perm/model_8'"
for path in "$work/none" "$work/base.gin" /dev/zero; do
    "$ctrax" train "$b" --set 'train.random_seed=2' --config "train.init_checkpoint = '$path'" \
        --output-dir "$work/init_bad" >"$work/init_bad.log" 2>&1
    rc=$?
    rm -rf "$work/init_bad"
    ((rc == 1)) && grep -q "^ctrax train: --config:1:1: train.init_checkpoint = '$path': loop: init_checkpoint" \
        "$work/init_bad.log" && ok "init_checkpoint '$path': $(tail -n 1 "$work/init_bad.log")" ||
        bad "init_checkpoint '$path': exit $rc: $(tail -n 2 "$work/init_bad.log")"
done

# A resume takes the optimizer's hyperparameters from its config, as Trax's
# Loop (its checkpoints hold none): --set Adam.b2 changes the next steps,
# is logged, and is what the next state.json records.
if train hp "$b" --set train.random_seed=5 --set train.steps=2 --output-dir "$work/hp"; then
    cp -r "$work/hp" "$work/hp_b2"
    train hp_same "$b" --set train.random_seed=5 --set train.steps=3 --output-dir "$work/hp" &&
        train hp_b2 "$b" --set train.random_seed=5 --set train.steps=3 --set Adam.b2=0.5 --output-dir "$work/hp_b2" &&
        if grep -q "resuming with Adam.b2 = 0.5; .*model_2/state.json had 0.999" "$work/hp_b2.log" &&
            grep -q '"b2":[[:space:]]*0.5' "$work/hp_b2/model_3/state.json" && grep -q '"b2":[[:space:]]*0.999' "$work/hp/model_3/state.json" &&
            ! cmp -s "$work/hp/model_3/weights.safetensors" "$work/hp_b2/model_3/weights.safetensors"; then
            ok "resume with --set Adam.b2=0.5: logged, recorded, other weights"
        else
            bad "resume with --set Adam.b2=0.5: $(grep -i b2 "$work/hp_b2.log" "$work/hp_b2/model_3/state.json" | head -n 3)"
        fi
fi

# --restart moves the previous run's files into previous-<time>/ (nothing
# deleted, nothing mixed with the new run's); other files stay.
if train rs1 "$b" --set train.random_seed=5 --set train.steps=4 --output-dir "$work/rs"; then
    echo note >"$work/rs/notes.txt"
    train rs2 "$b" --set train.random_seed=5 --set train.steps=2 --restart --output-dir "$work/rs" &&
        prev=$(ls -d "$work"/rs/previous-* 2>/dev/null) &&
        if [[ $(ls "$work/rs" | grep -c '^model_') == 1 && -d $work/rs/model_2 && -d $prev/model_4 &&
            -f $work/rs/notes.txt && $(ls "$work/rs/train" | wc -l) == 1 ]] &&
            grep -q '"step": 4' "$prev/metrics.jsonl" && ! grep -q '"step": 4' "$work/rs/metrics.jsonl" &&
            grep -qF "are now in $prev" "$work/rs2.log"; then
            ok "--restart: the previous run's files in $(basename "$prev")"
        else
            bad "--restart: $(ls "$work/rs" "$prev" | tr '\n' ' ')"
        fi
fi

# A best-checkpoint metric that the evals do not record (a typo) is refused
# at its binding: it kept no best checkpoint, silently.
refused best_typo "--set:1:1: train.checkpoint_highest: loop: checkpoint_high_metric 'acuracy' is not a metric of the eval task (loss, accuracy)" \
    --set "train.checkpoint_highest='acuracy'"

# A fresh run into a directory with files but no checkpoint (a user's, or a
# run stopped before its first checkpoint) sets them aside, not over them.
mkdir -p "$work/own"
echo mine >"$work/own/config.gin"
echo '{"my": 1}' >"$work/own/metrics.jsonl"
if train own "$b" --set train.random_seed=5 --set train.steps=1 --output-dir "$work/own"; then
    prev=$(ls -d "$work"/own/previous-* 2>/dev/null)
    [[ -n $prev && $(cat "$prev/config.gin") == mine && $(cat "$prev/metrics.jsonl") == '{"my": 1}' ]] &&
        grep -q "are now in" "$work/own.log" && ok "a fresh run sets aside the files it finds ($(basename "$prev"))" ||
        bad "a fresh run into a directory with files: $(ls "$work/own" | tr '\n' ' ')"
fi

# One run per output directory: a second one is refused while the first runs.
"$ctrax" train "$b" --set train.random_seed=5 --set train.steps=100000 --output-dir "$work/busy" >"$work/busy1.log" 2>&1 &
pid=$!
for _ in $(seq 100); do [[ -d $work/busy/model_1 ]] && break; sleep 0.1; done
"$ctrax" train "$b" --set train.random_seed=5 --set train.steps=100000 --output-dir "$work/busy" >"$work/busy2.log" 2>&1
rc=$?
kill -TERM $pid
wait $pid
((rc == 1)) && grep -q "is in use by another ctrax train (pid $pid)" "$work/busy2.log" &&
    ok "a second run in the same directory: $(grep 'in use' "$work/busy2.log")" ||
    bad "a second run in the same directory: exit $rc: $(tail -n 2 "$work/busy2.log")"

# A run into directory $1 (its output in $2) whose evals would take minutes,
# with the settings $4...: sent SIGTERM, and again a second later, 2 s after
# its start, or once its checkpoint pointer names $3 when $3 is given. rc:
# its exit status, or -1 when it still ran 5 s later (then killed).
second_sigterm() {
    "$ctrax" train "$b" --set train.random_seed=5 --set train.steps=1000 --set train.eval_steps=100000000 \
        "${@:4}" --output-dir "$1" >"$2" 2>&1 &
    local pid=$!
    if [[ -n $3 ]]; then
        for _ in $(seq 100); do [[ $(cat "$1/checkpoint" 2>/dev/null) == "$3" ]] && break; sleep 0.1; done
        sleep 0.5
    else
        sleep 2
    fi
    kill -TERM $pid
    sleep 1
    kill -TERM $pid
    for _ in $(seq 50); do kill -0 $pid 2>/dev/null || break; sleep 0.1; done
    if kill -0 $pid 2>/dev/null; then
        kill -KILL $pid
        wait $pid
        rc=-1
    else
        wait $pid
        rc=$?
    fi
}

# A second SIGTERM stops at once, during an eval that would take minutes
# (the first asks for a stop after the step).
second_sigterm "$work/sig2" "$work/sig2.log" ""
if ((rc < 0)); then
    bad "a second SIGTERM: still running 5 s later"
else
    # It says so, and what the same command then does (no checkpoint yet:
    # the step-1 eval never ended).
    want="ctrax: a second signal: stopped at once, before its first checkpoint: the same command starts over from step 0"
    ((rc == 143)) && grep -q "again: stop at once" "$work/sig2.log" && grep -qxF "$want" "$work/sig2.log" &&
        ok "a second SIGTERM stops at once (exit $rc): $want" ||
        bad "a second SIGTERM: exit $rc: $(tail -n 2 "$work/sig2.log")"
fi

# The same after checkpoints (steps 1 and 2; the eval at step 3 would take
# minutes): the message names the one the same command resumes from, and
# that command resumes there.
second_sigterm "$work/sig3" "$work/sig3.log" model_2 --set 'Loop.eval_at=[3]'
if ((rc < 0)); then
    bad "a second SIGTERM after checkpoints: still running 5 s later"
else
    want="ctrax: a second signal: stopped at once; the steps since the newest checkpoint are lost. The same command resumes from $work/sig3/model_2"
    "$ctrax" train "$b" --set train.random_seed=5 --set train.steps=4 --set 'Loop.eval_at=[3]' \
        --output-dir "$work/sig3" >"$work/sig3b.log" 2>&1
    rc2=$?
    ((rc == 143 && rc2 == 0)) && grep -qxF "$want" "$work/sig3.log" &&
        grep -q "resuming from $work/sig3/model_2 at step 2" "$work/sig3b.log" &&
        ok "a second SIGTERM after checkpoints: '$want', and the same command resumes there" ||
        bad "a second SIGTERM after checkpoints: exit $rc then $rc2: $(tail -n 2 "$work/sig3.log") / $(grep resuming "$work/sig3b.log")"
fi

# The same in an output directory whose name holds an escape sequence and a
# newline: the message shows each control character as '?', as ctrax shows
# every name it did not make (ctrax_put_text), on one line; so do the lines
# that name the directory when the run starts: no escape byte in the log.
second_sigterm "$work/sig4"$'\e[31m\nX' "$work/sig4.log" model_2 --set 'Loop.eval_at=[3]'
want="ctrax: a second signal: stopped at once; the steps since the newest checkpoint are lost. The same command resumes from $work/sig4?[31m?X/model_2"
((rc == 143)) && grep -qxF "$want" "$work/sig4.log" && ! grep -q $'\e' "$work/sig4.log" &&
    ok "a second SIGTERM, output directory with an escape sequence and a newline: '$want'" ||
    bad "a second SIGTERM, odd output directory: exit $rc: $(tail -n 3 "$work/sig4.log" | cat -v)"

# stdout on a full disk: the run trains and checkpoints, but its log is lost,
# and that must not look done (it exited 0 without a word).
if [[ -c /dev/full ]]; then
    "$ctrax" train "$b" --set train.random_seed=5 --steps 2 --output-dir "$work/full" >/dev/full 2>"$work/full.err"
    rc=$?
    ((rc == 1)) && grep -q "ctrax train: writing to stdout failed" "$work/full.err" &&
        ok "stdout on a full disk: exit 1, $(tail -n 1 "$work/full.err")" ||
        bad "stdout on a full disk: exit $rc: $(tail -n 2 "$work/full.err")"
fi

# The live progress line on a terminal (script(1) gives the run one): its
# tokens/s over its steps/s is the tokens of one step, copy.gin's 32 x 34 =
# 1088 (each update adds one step's tokens, not those since the last log).
if command -v script >/dev/null; then
    script -qc "'$ctrax' train '$(dirname "$0")/../configs/copy.gin' --steps 60 --output-dir '$work/tty'" /dev/null \
        >"$work/tty.log" 2>&1
    line=$(tr '\r' '\n' <"$work/tty.log" | grep '^step 60/60 ' | tail -n 1)
    per_step=$(awk -F' [|] ' '{ split($3, s, " "); split($4, t, " "); r = s[1]; k = t[1];
        m = (k ~ /k$/) ? 1e3 : (k ~ /M$/) ? 1e6 : 1; sub(/[kM]$/, "", k); if (r > 0) printf "%.0f", k * m / r }' <<<"$line")
    if [[ -n $per_step ]] && ((per_step > 1077 && per_step < 1099)); then
        ok "progress line: tokens/s / steps/s = $per_step tokens per step (1088)"
    else
        bad "progress line: tokens/s / steps/s = '$per_step', want 1088: '$line'"
    fi
else
    ok "progress line: no script(1) here (skipped)"
fi

cli_done
