#!/bin/bash
# Every shipped config (configs/*.gin) reads, builds its model, inputs and
# trainer, and trains one step with one eval batch, and `ctrax eval` reads
# the run's operative config back (what eval and sample build the model
# from) and prints the run's step-1 eval again, and `ctrax sample` writes from each byte-level text model (4 + 2
# bytes, which no chunk length divides, and, for a max_len up to 4,096,
# 4 + 124 = 128, which they do, sampled through shorter windows): a config
# that no longer matches the code, an operative config that does not parse
# back, or a model sample cannot run, fails here, not in a user's hands. A config whose data
# this machine lacks is skipped, and says so.
# usage: configs_test.sh CTRAX SOURCE_DIR
set -u
ctrax=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0 fail=0 skip=0
for cfg in "$src"/configs/*.gin; do
    name=$(basename "$cfg" .gin)
    missing=""
    for f in $(grep -o "'/usr/share/[^']*'" "$cfg" | tr -d "'"); do
        [[ -e $f ]] || missing="$f"
    done
    if [[ -n $missing ]]; then
        echo "skip $name: $missing is not on this machine"
        skip=$((skip + 1))
        continue
    fi
    # A model whose positions take only its full length (axial: fortunes_long's
    # 16,384) samples every byte through that whole window: the 2-byte sample
    # covers it; 124 more bytes took over 5 minutes under ASan.
    max_len=$(grep -oE '^[A-Za-z]+\.max_len = [0-9]+' "$cfg" | grep -oE '[0-9]+$' || echo 0)
    # `ctrax eval` of the step-1 checkpoint prints the run's step-1 eval to
    # every digit (same batch, same weights, same key: LSH models hash with
    # it); the Loop's lines pad names less, so blanks are squeezed.
    if out=$("$ctrax" train "$cfg" --steps 1 --output-dir "$work/$name" --set 'train.eval_steps = 1' 2>&1) &&
        run_eval=$(grep "^Step      1: eval" <<<"$out" | tr -s ' ') &&
        out=$("$ctrax" eval "$work/$name" --steps 1 2>&1) && grep -q "^Step      1: eval" <<<"$out" &&
        { [[ $(grep "^Step      1: eval" <<<"$out" | tr -s ' ') == "$run_eval" ]] ||
            { out="ctrax eval printed:"$'\n'"$(grep "^Step      1: eval" <<<"$out")"$'\n'"the run's eval:"$'\n'"$run_eval"; false; }; } &&
        { ! grep -q "@TextInputs" "$cfg" || { out=$("$ctrax" sample "$work/$name" --prompt 'The ' --length 2 2>&1) &&
            { ((max_len > 4096)) || out=$("$ctrax" sample "$work/$name" --prompt 'The ' --length 124 2>&1); }; }; }; then
        echo "ok   $name"
        pass=$((pass + 1))
    else
        echo "FAIL $name:"
        tail -8 <<<"$out"
        fail=$((fail + 1))
    fi
done
echo "configs_test: $pass passed, $fail failed, $skip skipped"
((fail == 0 && pass > 0))
