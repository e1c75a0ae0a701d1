#!/usr/bin/env bash
# Bad configs make `ctrax train` exit 1 with the file and line of the problem
# (and bad usage exits 2), before any training.
#   cli_config_errors_test.sh CTRAX
set -uo pipefail
ctrax=$1
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
# expect NAME EXIT PATTERN CONFIG-TEXT
expect() {
    local name=$1 want=$2 pattern=$3 text=$4
    printf '%s\n' "$text" >"$work/$name.gin"
    out=$("$ctrax" train "$work/$name.gin" --output-dir "$work/out" 2>&1)
    rc=$?
    if ((rc == want)) && grep -qF -- "$pattern" <<<"$out"; then
        pass=$((pass + 1))
        echo "ok   $name: exit $rc: $(grep -F -- "$pattern" <<<"$out" | head -n 1)"
    else
        fail=$((fail + 1))
        echo "FAIL $name: exit $rc (want $want), no '$pattern' in:"
        echo "$out" | head -n 5
    fi
}
base="train.model = @TransformerLM
train.inputs = @sequence_copy_inputs
sequence_copy_inputs.vocab_size = 8
sequence_copy_inputs.train_length = 5
sequence_copy_inputs.eval_min_length = 4
sequence_copy_inputs.eval_max_length = 5"
expect unknown_binding 1 "unknown_binding.gin:7" "$base
TransformerLM.d_modle = 32"
expect unknown_name 1 "unknown_name.gin:7" "$base
TransformerLMM.d_model = 32"
expect wrong_type 1 "wrong_type.gin:7" "$base
TransformerLM.n_layers = 'two'"
expect syntax_error 1 "syntax_error.gin:7" "$base
TransformerLM.d_model == 32"
expect missing_include 1 "missing_include.gin:1" "include 'no_such_file.gin'
$base"
expect missing_data_file 1 "missing_data_file.gin:3" "train.model = @TransformerLM
train.inputs = @TextInputs
TextInputs.paths = ['/no/such/corpus']"
"$ctrax" train "$work/no_such_config.gin" >"$work/out.txt" 2>&1
rc=$?
if ((rc == 1)) && grep -q "no_such_config.gin" "$work/out.txt"; then pass=$((pass + 1)); echo "ok   missing config file: exit 1"; else fail=$((fail + 1)); echo "FAIL missing config: exit $rc"; cat "$work/out.txt"; fi
"$ctrax" train >"$work/out.txt" 2>&1
rc=$?
if ((rc == 2)); then pass=$((pass + 1)); echo "ok   no config: exit 2"; else fail=$((fail + 1)); echo "FAIL no config: exit $rc"; fi
"$ctrax" train "$work/wrong_type.gin" --steps many >"$work/out.txt" 2>&1
rc=$?
if ((rc == 2)); then pass=$((pass + 1)); echo "ok   bad option value: exit 2"; else fail=$((fail + 1)); echo "FAIL bad option: exit $rc"; fi
echo "cli_config_errors_test: $pass passed, $fail failed"
((fail == 0))
