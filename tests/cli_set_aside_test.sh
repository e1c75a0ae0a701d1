#!/usr/bin/env bash
# A run that starts at step 0 sets an earlier run's files aside into
# previous-<UTC time>/ even when the directory holds names that look like
# checkpoints but resume nothing (Trax's model_<step>.pkl.gz, an empty
# model_* directory): nothing of the earlier run is cut or overwritten.
#   bash tests/cli_set_aside_test.sh build/ctrax
ctrax=${1:?usage: cli_set_aside_test.sh CTRAX}
source "$(dirname "$0")/cli_common.sh" cli_set_aside_test
config="$(dirname "$0")/../configs/copy.gin"

for odd in file dir; do
    dir=$work/$odd
    mkdir -p "$dir"
    echo '# the earlier run' >"$dir/config.gin"
    echo '{"step": 500, "mode": "train", "metric": "metrics/loss", "value": 1.5}' >"$dir/metrics.jsonl"
    if [[ $odd == file ]]; then echo pickle >"$dir/model_500.pkl.gz"; else mkdir "$dir/model_500"; fi
    if "$ctrax" train "$config" --steps 2 --output-dir "$dir" >"$work/out" 2>&1; then
        ok "$odd: the run trained"
    else
        bad "$odd: the run failed: $(tail -1 "$work/out")"
    fi
    prev=$(find "$dir" -maxdepth 1 -name 'previous-*' | head -1)
    if [[ -n $prev ]] && grep -q '"step": 500' "$prev/metrics.jsonl" 2>/dev/null &&
        grep -q '# the earlier run' "$prev/config.gin" 2>/dev/null; then
        ok "$odd: the earlier metrics.jsonl and config.gin are in previous-*/"
    else
        bad "$odd: the earlier run's files were not set aside: $(ls "$dir" | tr '\n' ' ')"
    fi
    if grep -q '"step": 500' "$dir/metrics.jsonl"; then
        bad "$odd: the new metrics.jsonl holds the earlier run's lines"
    else
        ok "$odd: the new metrics.jsonl is the new run's alone"
    fi
done

# A real checkpoint is still resumed, with nothing set aside, and the
# resume is announced once (the loop says it; the program does not repeat it).
dir=$work/file
"$ctrax" train "$config" --steps 3 --output-dir "$dir" >"$work/out" 2>&1
n=$(find "$dir" -maxdepth 1 -name 'previous-*' | wc -l)
said=$(grep -c 'resuming from' "$work/out")
if [[ $said == 1 && $n == 1 ]] && grep -q "resuming from $dir/model_2 at step 2\$" "$work/out"; then
    ok "a checkpoint is resumed (said once), nothing more set aside"
else
    bad "resume: $n previous-* directories, 'resuming from' said $said times:" \
        "$(grep 'resuming from' "$work/out" | tr '\n' ' ')"
fi

# A resume at or past train.steps trains nothing, and says so.
"$ctrax" train "$config" --steps 2 --output-dir "$dir" >"$work/out" 2>&1
if grep -q 'nothing to train: the run is at step 3, train.steps is 2' "$work/out"; then
    ok "a resume past train.steps says it trains nothing"
else
    bad "resume past train.steps: $(tail -2 "$work/out" | tr '\n' ' ')"
fi

# A resume with train.random_seed unbound (drawn, then read back from the
# checkpoint) opens its checkpoint once too: the search for the seed is the
# one the run resumes from. A pointer naming a checkpoint that does not load
# shows it: each search warns of it, so the warning comes once.
grep -v 'random_seed' "$config" >"$work/noseed.gin"
dir=$work/noseed
"$ctrax" train "$work/noseed.gin" --steps 2 --output-dir "$dir" >"$work/out" 2>&1
cp -r "$dir/model_2" "$dir/model_3"
head -c 100 "$dir/model_2/weights.safetensors" >"$dir/model_3/weights.safetensors"
echo model_3 >"$dir/checkpoint"
"$ctrax" train "$work/noseed.gin" --steps 3 --output-dir "$dir" >"$work/out" 2>&1
warned=$(grep -c "names 'model_3', which does not load" "$work/out")
if [[ $warned == 1 ]] && grep -q "resuming from $dir/model_2 at step 2\$" "$work/out"; then
    ok "a drawn seed's resume searches once (the broken pointer warned of once)"
else
    bad "drawn seed's resume: the broken pointer warned of $warned times; $(grep 'resuming from' "$work/out")"
fi
# A dead writer's .old-<name>-<pid> (its checkpoint set aside while being
# replaced or pruned, <name> gone) goes back under its name before the run
# looks for a checkpoint. Without --restart the run resumes from it (searched
# for first, the run resumed from an older checkpoint, here model_1, or with
# none started again at step 0); with --restart it is set aside with the rest, as
# model_2: left behind, the new run's first checkpoint put it back as
# model_2, the earlier run's checkpoint among the new run's.
dir=$work/old
"$ctrax" train "$config" --steps 2 --output-dir "$dir" >"$work/out" 2>&1
true & dead=$!  # a pid nobody has now
wait "$dead"
mv "$dir/model_2" "$dir/.old-model_2-$dead"
"$ctrax" train "$config" --steps 3 --output-dir "$dir" >"$work/out" 2>&1
n=$(find "$dir" -maxdepth 1 -name 'previous-*' | wc -l)
if [[ $n == 0 && -d $dir/model_3 && ! -e $dir/.old-model_2-$dead ]] &&
    grep -q "resuming from $dir/model_2 at step 2\$" "$work/out"; then
    ok "a dead writer's .old-model_2-<pid> goes back as model_2 and the run resumes from it"
else
    bad "resume over a dead writer's .old-model_2-<pid>: $n previous-*; $(ls -A "$dir" | tr '\n' ' ');" \
        "$(grep -E 'resuming|step 0' "$work/out" | tr '\n' ' ')"
fi
mv "$dir/model_3" "$dir/.old-model_3-$dead"
"$ctrax" train "$config" --steps 1 --restart --output-dir "$dir" >"$work/out" 2>&1
prev=$(find "$dir" -maxdepth 1 -name 'previous-*' | head -1)
if [[ ! -e $dir/model_3 && -n $prev && -f $prev/model_3/manifest.json && -z $(find "$dir" -name '.old-*') ]]; then
    ok "with --restart, a dead writer's .old-model_3-<pid> is set aside as model_3, not among the new run's"
else
    bad "--restart over a dead writer's .old-model_3-<pid>: $(ls -A "$dir" | tr '\n' ' ')"
fi
cli_done
