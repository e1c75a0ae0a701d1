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
# A setting the Loop holds in a C int: 2^32 was 0 there, and the run kept one
# checkpoint instead of all of them.
expect keep_checkpoints_int 1 "keep_checkpoints_int.gin:7:1: train.keep_checkpoints must be <= 2147483647" "$base
train.keep_checkpoints = 4294967296"
# Includes that multiply (each of six files includes the next 20 times:
# 20^6 parses) stop after 1000 in all.
for n in 1 2 3 4 5; do
    for _ in $(seq 20); do echo "include 'inc$((n + 1)).gin'"; done >"$work/inc$n.gin"
done
echo "train.steps = 1" >"$work/inc6.gin"
expect includes_multiply 1 "more than 1000 includes in all" "$(for _ in $(seq 20); do echo "include 'inc1.gin'"; done)"
expect missing_include 1 "missing_include.gin:1" "include 'no_such_file.gin'
$base"
expect missing_data_file 1 "missing_data_file.gin:3" "train.model = @TransformerLM
train.inputs = @TextInputs
TextInputs.paths = ['/no/such/corpus']"

# Budgets before allocation: a model or batch that cannot fit exits 1 within
# seconds, naming the setting and the bytes, before anything big is built.
# It runs under a 3 GiB memory guard, so a real attempt would die otherwise
# (killed, or "out of memory"): `ulimit -v`, or under AddressSanitizer (whose
# shadow memory needs terabytes of address space) its hard RSS limit.
guard_kb=$((3 * 1024 * 1024))
# (The probe's subshell waits for the program, so a crash is reported to /dev/null.)
if (ulimit -v $guard_kb && "$ctrax" --help; r=$?; exit $r) >/dev/null 2>&1; then asan=0; else asan=1; fi
run_guarded() {
    if ((asan)); then
        ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}hard_rss_limit_mb=3072" timeout 30 "$ctrax" "$@"
    else
        (ulimit -v $guard_kb && timeout 30 "$ctrax" "$@")
    fi
}
# expect_budget NAME PATTERN CONFIG [ARGS...]
expect_budget() {
    local name=$1 pattern=$2 config=$3
    shift 3
    local start=$SECONDS
    out=$(run_guarded train "$config" --output-dir "$work/out" "$@" 2>&1)
    rc=$?
    local took=$((SECONDS - start))
    if ((rc == 1 && took <= 10)) && grep -qF -- "$pattern" <<<"$out" &&
        grep -qE '[0-9.]+ (KiB|MiB|GiB|TiB|PiB|EiB)' <<<"$out" && ! grep -qiE 'out of memory|Sanitizer' <<<"$out"; then
        pass=$((pass + 1))
        echo "ok   $name: exit $rc in ${took}s: $(grep -F -- "$pattern" <<<"$out" | head -n 1)"
    else
        fail=$((fail + 1))
        echo "FAIL $name: exit $rc in ${took}s (want 1 within 10 s), no '$pattern' and a byte figure in:"
        echo "$out" | head -n 5
    fi
}
copy="$(dirname "$0")/../configs/copy.gin"
printf '%s\n' "train.model = @ReformerLM" "train.inputs = @sequence_copy_inputs" "sequence_copy_inputs.vocab_size = 8" \
    "sequence_copy_inputs.train_length = 5" "sequence_copy_inputs.eval_min_length = 4" \
    "sequence_copy_inputs.eval_max_length = 5" "ReformerLM.n_layers = 100000000" >"$work/reformer_layers.gin"
expect_budget reformer_layers "reformer_layers.gin:7:1: ReformerLM.n_layers = 100000000: the model's weights, gradients" \
    "$work/reformer_layers.gin"
expect_budget batch_size "--set:1:1: train.batch_size = 16777216: one step's activations need about" "$copy" \
    --set 'train.batch_size=16777216'
expect_budget max_len "--set:1:1: TransformerLM.max_len = 2147483647: the model's weights" "$copy" \
    --set 'TransformerLM.max_len = 2147483647'
expect_budget example_length "--set:1:1: sequence_copy_inputs.train_length = 1000000: one example's activations" \
    "$copy" --set 'sequence_copy_inputs.train_length = 1000000' --set 'train.batch_size = 1' \
    --set 'TransformerLM.d_model = 1024' --set 'TransformerLM.d_ff = 4096'
# Text inputs with no eval split, and evals asked for: both settings named.
printf 'one line of text, and another line of text\n%.0s' {1..20} >"$work/corpus.txt"
expect eval_fraction 1 "eval_fraction.gin:3:1: TextInputs.eval_fraction = 0 holds out no eval data, but" \
    "train.model = @TransformerLM
train.inputs = @TextInputs
TextInputs.eval_fraction = 0
TextInputs.paths = ['$work/corpus.txt']
TextInputs.seq_len = 8
train.eval_steps = 2
TransformerLM.max_len = 8"
grep -qF "eval_fraction.gin:6:1: train.eval_steps = 2 asks for evals" <<<"$out" ||
    { fail=$((fail + 1)); echo "FAIL eval_fraction: train.eval_steps not named"; }

# train.permanent_checkpoint_frequency (Trax's) is the Loop's permanent period:
# bound to two different periods it is refused naming both bindings; alone,
# it writes a permanent checkpoint every N steps (model_2 below exists only
# through it: the regular period is 100).
expect permanent_both 1 "permanent_both.gin:7:1: train.permanent_checkpoint_frequency = 2 and" "$base
train.permanent_checkpoint_frequency = 2
Loop.n_steps_per_permanent_checkpoint = 3"
grep -qF "permanent_both.gin:8:1: Loop.n_steps_per_permanent_checkpoint = 3 set the same period differently" <<<"$out" ||
    { fail=$((fail + 1)); echo "FAIL permanent_both: Loop.n_steps_per_permanent_checkpoint not named"; }
printf '%s\n' "$base" "train.permanent_checkpoint_frequency = 2" "train.steps = 4" "train.eval_steps = 0" \
    "TransformerLM.d_model = 8" "TransformerLM.d_ff = 8" "TransformerLM.n_layers = 1" "TransformerLM.n_heads = 1" \
    >"$work/permanent.gin"
if "$ctrax" train "$work/permanent.gin" --output-dir "$work/permanent" >"$work/out.txt" 2>&1 &&
    [[ -d $work/permanent/model_2 && -d $work/permanent/model_4 ]] &&
    grep -qx "train.permanent_checkpoint_frequency = 2" "$work/permanent/config.gin"; then
    pass=$((pass + 1)); echo "ok   permanent_checkpoint_frequency: model_2 kept"
else
    fail=$((fail + 1)); echo "FAIL permanent_checkpoint_frequency:"; ls "$work/permanent"; tail -n 5 "$work/out.txt"
fi

# ReformerLM's attention types in Trax's forms: a string is refused with the
# reference to write; an attention type's settings bound while the model
# builds another type are reported as never read.
reformer="$base
train.model = @ReformerLM"
expect attention_string 1 "attention_string.gin:8:1: ReformerLM.attention_type = 'SelfAttention' is not an attention type (a string: write @SelfAttention" "$reformer
ReformerLM.attention_type = 'SelfAttention'"
expect lsh_predict 1 "lsh_predict.gin:9:1: LSHSelfAttention.mode = 'predict' is not supported" "$reformer
ReformerLM.attention_type = @trax.layers.LSHSelfAttention
LSHSelfAttention.mode = 'predict'"
printf '%s\n' "$reformer" "ReformerLM.d_model = 8" "ReformerLM.d_ff = 8" "ReformerLM.n_layers = 1" "ReformerLM.n_heads = 2" \
    "train.steps = 1" "train.eval_steps = 0" "LSHSelfAttention.n_hashes = 2" >"$work/unread.gin"
if "$ctrax" train "$work/unread.gin" --output-dir "$work/unread" >"$work/out.txt" 2>&1 &&
    grep -qF "unread.gin:14: LSHSelfAttention.n_hashes is bound but this program never reads it" "$work/out.txt"; then
    pass=$((pass + 1)); echo "ok   unread attention binding: warned"
else
    fail=$((fail + 1)); echo "FAIL unread attention binding:"; tail -n 5 "$work/out.txt"
fi

# Trax's own reformer_copy.gin (tests/data, unedited but for its data_streams
# lines) reads, builds its model, inputs and trainer, and trains a step; its
# sizes are made small with --set only. Its operative config reads back.
trax_copy="$(dirname "$0")/data/trax_reformer_copy.gin"
if "$ctrax" train "$trax_copy" --steps 1 --output-dir "$work/trax_copy" --set 'sequence_copy_inputs.batch_size = 2' \
    --set 'ReformerLM.d_model = 16' --set 'ReformerLM.d_ff = 16' --set 'train.eval_steps = 1' >"$work/out.txt" 2>&1 &&
    grep -qF "data: batch(2, length 128)" "$work/out.txt" && grep -qE "^Step      1: train +loss \|" "$work/out.txt" &&
    grep -qF "trax_reformer_copy.gin:50:1: LSHSelfAttention.attention_dropout = 0.0 is overridden by ReformerLM, which passes dropout = 0.05" "$work/out.txt" &&
    grep -qx "ReformerLM.pos_type = 'fixed-base'" "$work/trax_copy/config.gin" &&
    grep -qx "ReformerLM.ff_use_sru = 1" "$work/trax_copy/config.gin" &&
    grep -qx "LSHSelfAttention.n_hashes = 2" "$work/trax_copy/config.gin" &&
    "$ctrax" train "$work/trax_copy/config.gin" --steps 1 --output-dir "$work/trax_copy2" >>"$work/out.txt" 2>&1; then
    pass=$((pass + 1)); echo "ok   Trax's reformer_copy.gin: builds and trains a step; its operative config reads back"
else
    fail=$((fail + 1)); echo "FAIL Trax's reformer_copy.gin:"; grep -v "never reads" "$work/out.txt" | tail -n 8
fi

# Trax's own reformer_enwik8.gin (tests/data, unedited but for two added
# lines: train.inputs = @TextInputs and its seq_len): its batcher and
# data_streams lines (max_eval_length, input_name) read and are reported
# unread, as Trax never calls batcher then: its batch sizes too
# (batch_size_per_device 1, eval_batch_size 8: Trax's train calls
# train.inputs alone, so they set nothing), the batches being
# train.batch_size's 2; train.save_graphs and
# LSHSelfAttention.predict_mem_len (no effect) are not; it trains a step on
# a text file, made small with --set only. Without train.inputs (Trax's
# config as shipped) the error names its TFDS dataset and what to bind.
trax_enwik8="$(dirname "$0")/data/trax_reformer_enwik8.gin"
printf 'one line of text, and another line of text\n%.0s' {1..200} >"$work/enwik8.txt"
if "$ctrax" train "$trax_enwik8" --steps 1 --output-dir "$work/trax_enwik8" --set "TextInputs.paths = ['$work/enwik8.txt']" \
    --set 'TextInputs.seq_len = 128' --set 'ReformerLM.axial_pos_shape = (8, 16)' \
    --set 'ReformerLM.d_axial_pos_embs = (8, 8)' --set 'ReformerLM.d_model = 16' --set 'ReformerLM.d_ff = 16' \
    --set 'ReformerLM.n_layers = 4' --set 'SelfAttention.chunk_len = 32' --set 'LSHSelfAttention.chunk_len = 32' \
    --set 'train.eval_steps = 1' --set 'train.batch_size = 2' >"$work/out.txt" 2>&1 &&
    grep -qE "^Step      1: train +loss \|" "$work/out.txt" &&
    grep -qF "trax_reformer_enwik8.gin:47: batcher.batch_size_per_device is bound but this program never reads it" "$work/out.txt" &&
    grep -qF "trax_reformer_enwik8.gin:48: batcher.eval_batch_size is bound but this program never reads it" "$work/out.txt" &&
    grep -q "^data: batch(2) <- " "$work/out.txt" &&
    grep -qF "trax_reformer_enwik8.gin:49: batcher.max_eval_length is bound but this program never reads it" "$work/out.txt" &&
    grep -qF "trax_reformer_enwik8.gin:55: data_streams.input_name is bound but this program never reads it" "$work/out.txt" &&
    ! grep -qE "(save_graphs|predict_mem_len|predict_drop_len|n_parallel_heads) is bound but" "$work/out.txt" &&
    grep -qx "train.save_graphs = False" "$work/trax_enwik8/config.gin"; then
    pass=$((pass + 1)); echo "ok   Trax's reformer_enwik8.gin: trains a step on TextInputs (batch 2, train.batch_size's); batcher lines, its batch sizes too, unread"
else
    fail=$((fail + 1)); echo "FAIL Trax's reformer_enwik8.gin:"; tail -n 8 "$work/out.txt"
fi
"$ctrax" train "$trax_enwik8" --steps 1 --output-dir "$work/trax_enwik8_tfds" --set 'train.inputs = None' >"$work/out.txt" 2>&1
rc=$?
if ((rc == 1)) && grep -qF "trax_reformer_enwik8.gin:54:29: data_streams.dataset_name = 't2t_enwik8_l65k': ctrax reads no TFDS" "$work/out.txt" &&
    grep -qF "bind train.inputs = @TextInputs or @TokenInputs" "$work/out.txt"; then
    pass=$((pass + 1)); echo "ok   Trax's reformer_enwik8.gin as shipped: exit 1, names its TFDS dataset and what to bind"
else
    fail=$((fail + 1)); echo "FAIL Trax's reformer_enwik8.gin as shipped: exit $rc"; tail -n 3 "$work/out.txt"
fi

# Loop.history_max reaches the Loop: the history in state.json holds fewer
# rows than max(2 x history_max, history_max + 2 x its metrics), against
# every row with -1 (Trax's).
count_history() {
    /usr/bin/python3 -c 'import json, sys; h = json.load(open(sys.argv[1]))["history"]; print(len(h), len({(r[0], r[1]) for r in h}))' "$1"
}
for hm in 1 -1; do
    printf '%s\n' "$base" "train.steps = 6" "train.eval_frequency = 1" "train.eval_steps = 1" "TransformerLM.d_model = 8" \
        "TransformerLM.d_ff = 8" "TransformerLM.n_layers = 1" "TransformerLM.n_heads = 1" "Loop.history_max = $hm" \
        >"$work/history$hm.gin"
    "$ctrax" train "$work/history$hm.gin" --output-dir "$work/history$hm" >"$work/out$hm.txt" 2>&1
done
read -r n1 k1 < <(count_history "$work/history1/model_6/state.json" 2>/dev/null || echo "-1 -1")
read -r nall kall < <(count_history "$work/history-1/model_6/state.json" 2>/dev/null || echo "-1 -1")
if ((n1 > 0 && n1 < 1 + 2 * k1 && nall == 6 * kall && n1 < nall)) && grep -qx "Loop.history_max = 1" "$work/history1/config.gin"; then
    pass=$((pass + 1)); echo "ok   Loop.history_max = 1: $n1 history rows ($k1 metrics) in state.json; -1: $nall"
else
    fail=$((fail + 1)); echo "FAIL Loop.history_max: $n1 rows ($k1 metrics) with 1, $nall ($kall) with -1"
    tail -n 3 "$work/out1.txt" "$work/out-1.txt"; ls "$work/history1"
fi

# Trax's own gru_copy.gin (tests/data, unedited): RNNLM with
# rnn_cell = @trax.layers.GRUCell trains; train.inputs is bound, so its
# data_streams lines are never read (as in Trax, where the inputs win) and
# the run says so. Its operative config reads back.
trax_gru="$(dirname "$0")/data/trax_gru_copy.gin"
if "$ctrax" train "$trax_gru" --set train.steps=3 --set 'sequence_copy_inputs.batch_size = 8' --set 'train.eval_steps = 1' \
    --output-dir "$work/trax_gru" >"$work/out.txt" 2>&1 &&
    grep -qF "trax_gru_copy.gin: RNNLM, 205600 weights" "$work/out.txt" &&
    grep -qF "data: batch(8, length 32) <- copy(vocab 32, w of 1..15 tokens" "$work/out.txt" &&
    grep -qF "trax_gru_copy.gin:28: data_streams.dataset_name is bound but this program never reads it" "$work/out.txt" &&
    grep -qE "^Step      3: train +loss \|" "$work/out.txt" &&
    grep -qx "RNNLM.rnn_cell = @GRUCell" "$work/trax_gru/config.gin" &&
    "$ctrax" train "$work/trax_gru/config.gin" --steps 1 --output-dir "$work/trax_gru2" >>"$work/out.txt" 2>&1; then
    pass=$((pass + 1)); echo "ok   Trax's gru_copy.gin: RNNLM(GRUCell) trains 3 steps; data_streams unread; its operative config reads back"
else
    fail=$((fail + 1)); echo "FAIL Trax's gru_copy.gin:"; tail -n 8 "$work/out.txt"
fi

# Trax's own mlp_mnist.gin (tests/data, unedited: batcher / data_streams,
# the older MLP.d_hidden and train.lr_schedule = @lr_schedules.constant())
# runs with data_streams.data_dir pointed at MNIST-format files (Debian's
# Fashion-MNIST); without it, the error says what to set.
trax_mlp="$(dirname "$0")/data/trax_mlp_mnist.gin"
"$ctrax" train "$trax_mlp" --output-dir "$work/trax_mlp0" >"$work/out.txt" 2>&1
rc=$?
if ((rc == 1)) && grep -qF "trax_mlp_mnist.gin:31:25: data_streams.data_dir = None: ctrax reads 'mnist' from local IDX files" "$work/out.txt"; then
    pass=$((pass + 1)); echo "ok   Trax's mlp_mnist.gin without data_dir: exit 1, says what to set"
else
    fail=$((fail + 1)); echo "FAIL Trax's mlp_mnist.gin without data_dir: exit $rc"; tail -n 3 "$work/out.txt"
fi
fmnist=/usr/share/datasets/fashion-mnist
if [[ -f $fmnist/train-images-idx3-ubyte.gz ]]; then
    # An eval batch (100) other than the step's (256): `ctrax eval` says the
    # eval batches' size.
    if "$ctrax" train "$trax_mlp" --steps 3 --output-dir "$work/trax_mlp" --set "data_streams.data_dir='$fmnist'" \
        --set 'train.eval_steps = 1' --set 'batcher.eval_batch_size = 100' >"$work/out.txt" 2>&1 &&
        "$ctrax" eval "$work/trax_mlp" --steps 1 >>"$work/out.txt" 2>&1 &&
        grep -qF "(step 3) on 1 batch(es) of 100: batch(100) <- " "$work/out.txt" &&
        grep -qF "MLP, 669706 weights" "$work/out.txt" && grep -qF "data: batch(256) <- epochs(forever, shuffled" "$work/out.txt" &&
        grep -qE "^Step      1: eval +accuracy \|" "$work/out.txt" && grep -qE "^Step      3: train +loss \|" "$work/out.txt" &&
        ! grep -q "never reads" "$work/out.txt" &&
        grep -qx "train.lr_schedule_fn = @constant()" "$work/trax_mlp/config.gin" &&
        grep -qx "train.batch_size = 256" "$work/trax_mlp/config.gin" &&
        grep -qx "Loop.n_steps_per_checkpoint = 200" "$work/trax_mlp/config.gin" &&
        "$ctrax" train "$work/trax_mlp/config.gin" --steps 1 --output-dir "$work/trax_mlp2" >>"$work/out.txt" 2>&1; then
        pass=$((pass + 1)); echo "ok   Trax's mlp_mnist.gin with data_dir: trains 3 steps on $fmnist; its operative config reads back"
    else
        fail=$((fail + 1)); echo "FAIL Trax's mlp_mnist.gin with data_dir:"; tail -n 8 "$work/out.txt"
    fi
else
    echo "skip Trax's mlp_mnist.gin run: no $fmnist (Debian's dataset-fashion-mnist)"
fi

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
