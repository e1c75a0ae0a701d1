#!/usr/bin/env bash
# `ctrax eval` of an LSH model prints the eval the run logged at the
# checkpoint's step (README: "ctrax eval DIR --name model_1 prints the step-1
# eval the run logged"), to every printed digit, and the same again when run
# twice. LSHSelfAttention hashes with rotations drawn in eval too, from its
# "hash" state (a key and a count of forwards, REFORMER.md section 2), not
# from the eval key: ctrax eval repeats the Loop's eval only when it loads
# that state from the checkpoint as the Loop's eval found it (the Loop puts
# the state back after each eval, so the checkpoint holds it). The eval key
# itself (ct_loop_eval_key) reaches no layer ctrax configures in eval mode,
# so no run of `ctrax eval` can tell it; tests/test_loop.c checks the Loop's.
#   cli_eval_test.sh CTRAX SOURCE_DIR
set -uo pipefail
ctrax=$1
src=$2
source "$(dirname "$0")/cli_common.sh" cli_eval_test

# configs/copy_lsh.gin made small (about a second in all): d_model 16, 2
# heads of 8, 3 steps of batch 4, evals of 2 batches.
small=(--set train.steps=3 --set train.batch_size=4 --set train.eval_steps=2 --set ReformerLM.d_model=16
    --set ReformerLM.d_ff=16 --set ReformerLM.n_heads=2 --set ReformerLM.d_attention_key=8
    --set ReformerLM.d_attention_value=8 --set 'ReformerLM.pos_d_axial_embs=(8, 8)')

# same_eval NAME DIR STEP [EVAL_ARGS...]: `ctrax eval DIR EVAL_ARGS` prints
# the run's logged "Step STEP: eval" lines (in DIR.log) line for line, and a
# second `ctrax eval` prints the same bytes.
same_eval() {
    local name=$1 dir=$2 step=$3
    shift 3
    local want got again
    want=$(grep -E "^Step +$step: eval " "$dir.log")
    if [[ -z $want ]]; then
        bad "$name: the run logged no step-$step eval: $(tail -n 3 "$dir.log")"
        return
    fi
    got=$("$ctrax" eval "$dir" "$@" 2>"$dir.eval.err") || {
        bad "$name: ctrax eval exited $?: $(cat "$dir.eval.err")"
        return
    }
    [[ $got == "$want" ]] && ok "$name: ctrax eval prints the run's step-$step eval: $(tr '\n' ' ' <<<"$got")" ||
        bad "$name: ctrax eval printed"$'\n'"$got"$'\n'"the run logged"$'\n'"$want"
    again=$("$ctrax" eval "$dir" "$@" 2>/dev/null)
    [[ $again == "$got" ]] && ok "$name: a second ctrax eval prints the same" ||
        bad "$name: a second ctrax eval printed"$'\n'"$again"$'\n'"the first"$'\n'"$got"
}

# The standard trainer, its seed drawn (ctrax eval takes it from the
# checkpoint's config.gin), one eval at step 3: the newest checkpoint's
# eval, after three forwards have moved each layer's hash state.
if "$ctrax" train "$src/configs/copy_lsh.gin" "${small[@]}" --config 'train.random_seed = None' \
    --config 'Loop.eval_at = [3]' --output-dir "$work/standard" >"$work/standard.log" 2>&1; then
    same_eval standard "$work/standard" 3
else
    bad "standard: ctrax train exited $?: $(tail -n 3 "$work/standard.log")"
fi

# The memory-efficient trainer, the step-1 eval by name (a later checkpoint
# is the newest), as the README gives it.
if "$ctrax" train "$src/configs/copy_lsh.gin" "${small[@]}" --set train.use_memory_efficient_trainer=True \
    --set train.random_seed=7 --output-dir "$work/reversible" >"$work/reversible.log" 2>&1; then
    same_eval reversible "$work/reversible" 1 --name model_1
else
    bad "reversible: ctrax train exited $?: $(tail -n 3 "$work/reversible.log")"
fi

cli_done
