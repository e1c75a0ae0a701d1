#!/usr/bin/env bash
# Trax's trainer_main command line on `ctrax train` (issue 14): several
# --config_file and --config flags, read as gin's
# parse_config_files_and_bindings (the files in order, a positional CONFIG
# first, then the bindings in order), --output_dir, `--flag=value` and
# `--flag value`, errors that name the flag; and the same run as ctrax's own
# spellings (positional CONFIG, --set, --output-dir) gives the same
# operative config.gin and the same losses. Also --threads and
# train.n_threads (the count in the start-up log, the replicas check).
#   cli_trainer_main_test.sh CTRAX
set -uo pipefail
ctrax=$1
source "$(dirname "$0")/cli_common.sh" cli_trainer_main_test

# A small run: the copy task and a one-layer TransformerLM, evals off.
cat >"$work/base.gin" <<'EOF'
train.model = @TransformerLM
train.inputs = @sequence_copy_inputs
train.optimizer = @Adam
train.lr_schedule_fn = None
train.batch_size = 4
train.steps = 7
train.eval_steps = 0
train.random_seed = 3
Loop.n_steps_per_checkpoint = 1000
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
EOF
printf 'train.steps = 3\n' >"$work/three.gin"
printf 'train.steps = 2\n' >"$work/two.gin"

# steps NAME WANT ARGS...: `ctrax train ARGS` exits 0 and trains WANT steps.
steps() {
    local name=$1 want=$2
    shift 2
    local out rc got
    out=$("$ctrax" train "$@" 2>&1)
    rc=$?
    got=$(sed -n 's/^done: step \([0-9]*\).*/\1/p' <<<"$out")
    if ((rc == 0)) && [[ $got == "$want" ]]; then
        ok "$name: $want steps"
    else
        bad "$name: exit $rc, trained '$got' steps, want $want; output:"
        echo "$out" | tail -n 5
    fi
}
# fails NAME EXIT PATTERN ARGS...: `ctrax train ARGS` exits EXIT saying PATTERN.
fails() {
    local name=$1 want=$2 pattern=$3
    shift 3
    local out rc
    out=$("$ctrax" train "$@" 2>&1)
    rc=$?
    if ((rc == want)) && grep -qF -- "$pattern" <<<"$out"; then
        ok "$name: exit $rc: $(grep -F -- "$pattern" <<<"$out" | head -n 1)"
    else
        bad "$name: exit $rc (want $want), no '$pattern' in:"
        echo "$out" | head -n 5
    fi
}

# ---- order: files in order, then bindings in order -----------------------------
b=$work/base.gin
steps "one file" 7 --config_file="$b" --output_dir="$work/o1"
steps "a later file wins" 3 --config_file="$b" --config_file="$work/three.gin" --output_dir="$work/o2"
steps "file order kept" 7 --config_file="$work/three.gin" --config_file="$b" --output_dir="$work/o3"
steps "a binding after the files" 2 --config_file="$b" --config_file="$work/three.gin" --config='train.steps = 2' \
    --output_dir="$work/o4"
steps "a binding given before a file still comes after it" 2 --config='train.steps=2' --config_file="$b" \
    --config_file="$work/three.gin" --output_dir="$work/o5"
steps "a later binding wins" 4 --config_file "$b" --config 'train.steps=6' --config 'train.steps=4' \
    --output_dir "$work/o6"
steps "the positional file first" 2 "$work/three.gin" --config_file="$b" --config_file="$work/two.gin" \
    --output_dir="$work/o7"
steps "positional then --config_file" 3 "$b" --config_file="$work/three.gin" --output_dir="$work/o8"
steps "--set wins over --config" 5 "$b" --set 'train.steps=5' --config 'train.steps=2' --output-dir "$work/o9"
steps "several bindings in one --config" 2 --config_file="$b" --config='train.steps=3
train.steps=2' --output_dir="$work/o10"

# --dataset, --data_dir and --model: bindings after every --config (Trax's order).
steps "--model after --config" 7 --config_file="$b" --model TransformerLM --config='train.model=@MLP' \
    --output_dir="$work/m1"
grep -q '^train.model = @TransformerLM$' "$work/m1/config.gin" && ok "--model wins over --config" ||
    bad "--model after --config: $(grep train.model "$work/m1/config.gin")"
out=$("$ctrax" train --config_file="$b" --model=TransformerLMM --output_dir="$work/m2" 2>&1)
grep -q -- "--model:1:15: unknown configurable 'TransformerLMM'" <<<"$out" && ok "--model's error names --model" ||
    bad "--model=TransformerLMM: $out"
steps "--model TransformerLM" 7 --config_file="$b" --model=TransformerLM --output_dir="$work/m3"
grep -q '^train.model = @TransformerLM$' "$work/m3/config.gin" && ok "--model in config.gin" ||
    bad "--model: $(grep train.model "$work/m3/config.gin")"
fails "--data_dir with a quote" 2 "--data_dir expects a name without quotes" --config_file="$b" --data_dir="a'b"
fails "--dataset with a newline" 2 "--dataset expects a name without quotes, backslashes or newlines" \
    --config_file="$b" --dataset=$'mnist\ntrain.steps = 1'
# Each binds its own setting, named in the error (Trax's mlp_mnist.gin reads both).
mnist=$(dirname "$0")/data/trax_mlp_mnist.gin
fails "--dataset binds data_streams.dataset_name" 1 "--dataset:1:29: data_streams.dataset_name = 'cifar10': ctrax reads no TFDS" \
    --config_file="$mnist" --dataset=cifar10 --output_dir="$work/ds"
fails "--data_dir binds data_streams.data_dir" 1 "--data_dir:1:25: data_streams.data_dir = '$work/none' holds no train-images-idx3-ubyte" \
    --config_file="$mnist" --data_dir="$work/none" --output_dir="$work/dd"

# ---- the same run as ctrax's spellings -------------------------------------------
"$ctrax" train --config_file="$b" --config_file="$work/three.gin" --config='train.batch_size=8' \
    --output_dir="$work/trax" >"$work/trax.log" 2>&1
rc1=$?
"$ctrax" train "$b" --set 'train.steps=3' --set 'train.batch_size=8' --output-dir "$work/ctrax" \
    >"$work/ctrax.log" 2>&1
rc2=$?
if ((rc1 == 0 && rc2 == 0)) && cmp -s "$work/trax/config.gin" "$work/ctrax/config.gin"; then
    ok "Trax's and ctrax's spellings: the same config.gin"
else
    bad "Trax's and ctrax's spellings (exit $rc1, $rc2): config.gin differs:"
    diff "$work/trax/config.gin" "$work/ctrax/config.gin" | head -n 10
fi
grep -q 'train.batch_size = 8' "$work/trax/config.gin" && ok "--config's binding in config.gin" ||
    bad "--config's binding train.batch_size = 8 not in config.gin"
# Same seed, same config: the same training losses, step by step.
l1=$(grep '"metric": "metrics/loss"' "$work/trax/metrics.jsonl")
l2=$(grep '"metric": "metrics/loss"' "$work/ctrax/metrics.jsonl")
if [[ -n $l1 && $l1 == "$l2" ]]; then ok "Trax's and ctrax's spellings: the same train losses"; else
    bad "train losses differ: $(diff <(echo "$l1") <(echo "$l2") | head -n 4)"
fi

# ---- errors name the flag ---------------------------------------------------------
fails "--config_file without a value" 2 "--config_file needs a value" --config_file
fails "--config_file=''" 2 "--config_file needs a file name" --config_file=
# The positional CONFIG as '' (an unset shell variable): bad usage, as --config_file=''.
fails "a positional ''" 2 "CONFIG needs a file name, got ''" "" --output_dir="$work/e0"
fails "--config without a value" 2 "--config needs a value" --config_file="$b" --config
fails "--output_dir without a value" 2 "--output_dir needs a value" --config_file="$b" --output_dir
fails "a missing --config_file" 1 "$work/none.gin" --config_file="$b" --config_file="$work/none.gin" \
    --output_dir="$work/e1"
fails "a bad --config binding" 1 "--config:1" --config_file="$b" --config='train.steps = oops' --output_dir="$work/e2"
fails "a --config binding of an unknown name" 1 "--config:1" --config_file="$b" --config='TransformerLMM.d_model = 8' \
    --output_dir="$work/e3"
fails "no config at all" 2 "which config?" --config='train.steps=1'
fails "two positional configs" 2 "--config_file=FILE" "$b" "$work/three.gin"
fails "a misspelt flag" 2 "unknown option '--config_files=x'" --config_files=x
fails "--threads 0" 2 "--threads expects an integer in [1, 4096], got '0'" "$b" --threads 0
# strtoll alone takes leading blanks and a '+' (a quoting slip passed as 2)
fails "--threads ' 2'" 2 "--threads expects an integer in [1, 4096], got ' 2'" "$b" --threads ' 2'
fails "--threads +2" 2 "--threads expects an integer in [1, 4096], got '+2'" "$b" --threads +2
# --devices 0 is no replica count: refused, not taken as no --devices at all
# (which trains with the config's train.n_devices).
fails "--devices 0" 2 "--devices expects an integer in [1, " "$b" --devices 0 --output-dir "$work/dev0"
help=$("$ctrax" train --help)
for flag in --config_file --config --output_dir --dataset --data_dir --model --threads --set --output-dir; do
    grep -qe "^  $flag " <<<"$help" && ok "--help lists $flag" || bad "--help does not list $flag"
done

# ---- threads ----------------------------------------------------------------------
threads_logged() {
    local name=$1 want=$2
    shift 2
    local out
    out=$("$ctrax" train "$@" 2>&1)
    if grep -q "^threads: $want for ctrax's loops and the GEMM" <<<"$out"; then ok "$name: threads $want logged"; else
        bad "$name: no 'threads: $want' line:"
        echo "$out" | head -n 8
    fi
}
threads_logged "--threads 1" 1 "$b" --threads 1 --steps 1 --output-dir "$work/t1"
# A user's own GOMP_SPINCOUNT (with no OMP_WAIT_POLICY) is left alone, not
# replaced by ctrax's 300000.
out=$(env -u OMP_WAIT_POLICY GOMP_SPINCOUNT=1234 "$ctrax" train "$b" --steps 1 --output-dir "$work/spin" 2>&1)
grep -q "^threads: .*OMP_WAIT_POLICY=(unset) GOMP_SPINCOUNT=1234 say" <<<"$out" && ok "GOMP_SPINCOUNT=1234 kept" ||
    bad "GOMP_SPINCOUNT=1234: $(grep '^threads:' <<<"$out")"
threads_logged "--threads=3" 3 "$b" --threads=3 --steps 1 --output-dir "$work/t2"
threads_logged "train.n_threads" 1 "$b" --set train.n_threads=1 --steps 1 --output-dir "$work/t3"
threads_logged "--threads over train.n_threads" 2 "$b" --set train.n_threads=1 --threads 2 --steps 1 \
    --output-dir "$work/t4"
OMP_NUM_THREADS=1 threads_logged "OMP_NUM_THREADS when nothing is set" 1 "$b" --steps 1 --output-dir "$work/t5"
# A config whose name gives runs/ itself or runs/.. as the output directory.
cp "$b" "$work/..gin"
cp "$b" "$work/.gin"
fails "a config named ..gin" 1 "..gin: its name gives no output directory (runs/.): give --output-dir DIR" "$work/..gin"
fails "a config named .gin" 1 ".gin: its name gives no output directory (runs/): give --output-dir DIR" "$work/.gin"
# Cut to its first 4,095 bytes it would be another directory than asked for.
long_dir=$(printf "$work/%04100d" 0)
fails "a 4,1xx-byte --output_dir" 1 "--output_dir is $((${#work} + 4101)) bytes long (at most 4095)" "$b" \
    --output_dir="$long_dir"
fails "--output-dir ''" 2 "--output-dir needs a directory, got ''" "$b" --output-dir ""
# Exactly 4,096 bytes: one too many for the buffer (cut to 4,095, it would be
# another directory).
long_dir=$(printf "$work/%0$((4096 - ${#work} - 1))d" 0)
fails "a 4,096-byte --output_dir" 1 "--output_dir is 4096 bytes long (at most 4095)" "$b" --output_dir="$long_dir"
# 64 config files and 64 bindings at most: one more is bad usage (each is kept
# in a fixed array), the positional CONFIG counted with the --config_file ones.
many=()
for _ in $(seq 64); do many+=(--config_file="$b"); done
fails "65 --config_file" 2 "more than 64 config files" "${many[@]}" --config_file="$b"
fails "64 --config_file and a positional CONFIG" 2 "more than 64 config files" "$b" "${many[@]}"
sets=()
for _ in $(seq 64); do sets+=(--set train.steps=1); done
fails "65 --set" 2 "more than 64 --set options" "$b" "${sets[@]}" --set train.steps=1
fails "65 --config" 2 "more than 64 --config options" "$b" "${sets[@]}" --config=train.steps=1
fails "more replicas than threads" 1 "--devices 2 replicas are 2 threads, more than --threads 1 allows" \
    "$b" --devices 2 --threads 1 --output-dir "$work/t6"
fails "more replicas than train.n_threads" 1 "train.n_devices = 2 replicas are 2 threads, more than --set:1:1: train.n_threads = 1" \
    "$b" --set train.n_devices=2 --set train.n_threads=1 --output-dir "$work/t6"
# --devices 2 on a model whose state has a batch axis (LSHSelfAttention's
# buckets, for one device's rows): the evals, in training and in `ctrax
# eval`, run the rows in the trainer's two pieces; config.gin records it.
out=$("$ctrax" train "$(dirname "$0")/../configs/copy_lsh.gin" --devices 2 --steps 2 --set train.eval_steps=1 \
    --set ReformerLM.n_layers=1 --output-dir "$work/d2" 2>&1)
if grep -q "eval  *loss" <<<"$out" && grep -qx "train.n_devices = 2" "$work/d2/config.gin"; then
    ok "--devices 2 with LSHSelfAttention: evals run, config.gin records train.n_devices = 2"
else
    bad "--devices 2 with LSHSelfAttention: $(tail -n 2 <<<"$out")"
fi
out=$("$ctrax" eval "$work/d2" 2>&1)
grep -q "eval *loss" <<<"$out" && ok "ctrax eval of a --devices 2 run" || bad "ctrax eval of a --devices 2 run: $(tail -n 2 <<<"$out")"
# The same run on one device: the replicas number their examples in the
# global batch for LSH's rotations, and the eval pieces hash with the batch's
# key, so the weights and the evals are one device's (the replicas drew the
# rotations of rows 0..B/2-1 twice: 4.5e-5 apart after 2 steps, eval loss
# 3.48465 against 3.48617).
"$ctrax" train "$(dirname "$0")/../configs/copy_lsh.gin" --steps 2 --set train.eval_steps=1 \
    --set ReformerLM.n_layers=1 --output-dir "$work/d1" >/dev/null 2>&1
if why=$(/usr/bin/python3 - "$work/d1" "$work/d2" <<'PY'
import json, struct, sys
import numpy as np
def weights(p):
    raw = open(p, "rb").read(); n = struct.unpack("<Q", raw[:8])[0]; h = json.loads(raw[8:8 + n]); d = raw[8 + n:]
    state = set(h.pop("__metadata__", {}).get("state_tensors", "").split("\n"))
    return {k: np.frombuffer(d[v["data_offsets"][0]:v["data_offsets"][1]], np.float32).astype(np.float64)
            for k, v in h.items() if k not in state}
def evals(run):
    return [json.loads(l)["value"] for l in open(run + "/metrics.jsonl") if '"eval"' in l and '"metrics/loss"' in l]
a, b = (weights(r + "/model_2/weights.safetensors") for r in sys.argv[1:3])
rel = (sum(((a[k] - b[k]) ** 2).sum() for k in a) / sum((a[k] ** 2).sum() for k in a)) ** 0.5
ea, eb = evals(sys.argv[1]), evals(sys.argv[2])
worst = max(abs(x - y) / abs(x) for x, y in zip(ea, eb)) if ea and len(ea) == len(eb) else 1.0
print("weights %.2e apart, eval losses %.2e" % (rel, worst))
sys.exit(0 if rel < 1e-6 and worst < 1e-6 else 1)
PY
); then ok "copy_lsh on 2 devices against 1: $why"; else bad "copy_lsh on 2 devices against 1: $why"; fi
# Evals of longer examples than training's: LSH hashes an eval batch into
# its own memory, any B and T (the state sized by training's T 48 refused
# the eval's 64 after step 1's training).
grep -v '^ReformerLM.pos_' "$(dirname "$0")/../configs/copy_lsh.gin" >"$work/lsh_long.gin"
out=$("$ctrax" train "$work/lsh_long.gin" --steps 1 --set train.eval_steps=1 --set ReformerLM.n_layers=1 \
    --set ReformerLM.max_len=64 --set sequence_copy_inputs.eval_min_length=24 \
    --set sequence_copy_inputs.eval_max_length=25 --output-dir "$work/lsh_long" 2>&1)
if grep -q "eval  *loss" <<<"$out" && grep -q "^done: step 1" <<<"$out"; then
    ok "LSH evals of length 64 after training at 48"
else
    bad "LSH evals of length 64 after training at 48: $(tail -n 1 <<<"$out")"
fi
# A run on 2 devices resumes on 1 (and back): LSH's buckets, sized for a
# device's rows, are a cache the next forward recomputes, so a checkpoint
# holding them at another size keeps the fresh zeros (the resume failed on
# "tensor '.../buckets' is (..) in the checkpoint, expected (..)").
cp -r "$work/d2" "$work/d2to1"
out=$("$ctrax" train "$(dirname "$0")/../configs/copy_lsh.gin" --steps 3 --set train.eval_steps=1 \
    --set ReformerLM.n_layers=1 --output-dir "$work/d2to1" 2>&1)
out2=$("$ctrax" train "$(dirname "$0")/../configs/copy_lsh.gin" --steps 4 --set train.eval_steps=1 \
    --set ReformerLM.n_layers=1 --devices 2 --output-dir "$work/d2to1" 2>&1)
if grep -q "^done: step 3" <<<"$out" && grep -q "^done: step 4" <<<"$out2"; then
    ok "an LSH run on 2 devices resumes on 1, and back on 2"
else
    bad "an LSH run on 2 devices resumed on 1 / 2: $(tail -n 1 <<<"$out") / $(tail -n 1 <<<"$out2")"
fi
# `ctrax eval` of model_1 runs the first eval batches, as the run's first
# eval: the same loss as logged, within float printing (same_loss DIR OUT).
same_loss() {
    /usr/bin/python3 - "$1/metrics.jsonl" "$2" <<'PY'
import json, re, sys
logged = [json.loads(l)["value"] for l in open(sys.argv[1])
          if '"eval"' in l and '"metrics/loss"' in l and json.loads(l)["step"] == 1]
printed = re.findall(r"eval +loss \| +([0-9.]+)", sys.argv[2])
ok = logged and printed and abs(float(printed[0]) - logged[0]) <= 1e-6 * abs(logged[0])
print("%s %s" % (logged[0] if logged else "?", printed[0] if printed else "?"))
sys.exit(0 if ok else 1)
PY
}
# eval/ bindings build the eval model (Trax's eval_model) in `ctrax eval` as
# in training (it used the model itself before).
"$ctrax" train "$b" --steps 1 --set train.eval_steps=1 --set 'eval/TransformerLM.n_heads=1' \
    --output-dir "$work/evscope" >/dev/null 2>&1
out=$("$ctrax" eval "$work/evscope" 2>&1)
if both=$(same_loss "$work/evscope" "$out"); then ok "ctrax eval with eval/ bindings: logged, printed $both"; else
    bad "ctrax eval with eval/ bindings: logged, printed $both"
fi
# The evals leave the LSH state as it was (its hash counter), so `ctrax eval`
# of the LSH run's model_1 repeats its first eval too.
out=$("$ctrax" eval "$work/d2" --name model_1 2>&1)
if both=$(same_loss "$work/d2" "$out"); then ok "ctrax eval of LSH model_1: logged, printed $both"; else
    bad "ctrax eval of LSH model_1: logged, printed $both"
fi
# `ctrax info` counts LSHSelfAttention's state (buckets, hash counter) apart
# from the weights, by weights.safetensors' "state_tensors" metadata; the
# counts are the header's, read here by Python.
counts=$(/usr/bin/python3 - "$work/d2/model_2/weights.safetensors" <<'PY'
import json, math, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n]); state = set(h.pop("__metadata__", {}).get("state_tensors", "").split("\n")) - {""}
size = lambda names: f"{sum(math.prod(h[k]['shape']) for k in names):,}"
weights = [k for k in h if k not in state]
print(size(weights), len(weights), size(state), len(state))
PY
)
read -r n_w t_w n_s t_s <<<"$counts"
out=$("$ctrax" info "$work/d2" 2>&1)
if [[ $t_s -ge 2 ]] && grep -qE "^parameters +$n_w in $t_w tensors" <<<"$out" && grep -qE "^state +$n_s in $t_s tensors" <<<"$out"; then
    ok "ctrax info: $n_w parameters in $t_w tensors, state $n_s in $t_s"
else
    bad "ctrax info: expected parameters $n_w in $t_w tensors, state $n_s in $t_s: $(grep -e ^parameters -e ^state <<<"$out")"
fi
# With a schedule, info shows the rate it set (the last logged, as
# metrics.jsonl has it), not the optimizer's learning_rate, which no step used.
lr=$(/usr/bin/python3 -c '
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if "\"training/learning_rate\"" in l]
print("%.6g at step %d" % (rows[-1]["value"], rows[-1]["step"]))' "$work/d2/metrics.jsonl")
if grep -qxF "schedule     warmup_and_rsqrt_decay sets the learning rate each step: $lr (the last logged)" <<<"$out" &&
    grep -qE "^optimizer +Adam: b1 " <<<"$out"; then
    ok "ctrax info with a schedule: $lr"
else
    bad "ctrax info with a schedule ($lr logged): $(grep -e ^optimizer -e ^schedule <<<"$out")"
fi
# A model with no max_len (an RNNLM) samples with a window of 1024 bytes
# unless --context says (each byte ran every byte before it again: 4,000
# bytes took 211 s); the start line says so before any byte is made.
"$ctrax" train "$(dirname "$0")/../configs/gru_copy.gin" --steps 1 --set train.eval_steps=1 \
    --output-dir "$work/gru" >/dev/null 2>&1
line=$(timeout 5 "$ctrax" sample "$work/gru" --length 100000 --raw 2>&1 >/dev/null | head -n 1)
if grep -q "RNNLM, .* context 1024," <<<"$line"; then ok "sample of an RNNLM: context 1024 by default"; else
    bad "sample of an RNNLM: $line"
fi
out=$(env -u OMP_WAIT_POLICY -u GOMP_SPINCOUNT "$ctrax" train "$b" --steps 1 --output-dir "$work/t8" 2>&1)
if grep -q "idle threads spin, then sleep (GOMP_SPINCOUNT=300000)" <<<"$out"; then
    ok "idle threads spin, then sleep by default"
else
    bad "no 'idle threads spin, then sleep' line when no wait policy is set: $(grep threads: <<<"$out")"
fi
# Without one (train.lr_schedule_fn = None), the optimizer's learning_rate.
info=$("$ctrax" info "$work/t8" 2>&1)
if grep -qE "^optimizer +Adam: learning_rate 0.0001, " <<<"$info" && ! grep -q "^schedule" <<<"$info"; then
    ok "ctrax info without a schedule: the optimizer's learning_rate"
else
    bad "ctrax info without a schedule: $(grep -e ^optimizer -e ^schedule <<<"$info")"
fi
# --steps is a binding: config.gin says how far the run was asked to go.
if grep -qx "train.steps = 1" "$work/t8/config.gin"; then ok "--steps 1 recorded as train.steps = 1"; else
    bad "config.gin of a --steps 1 run: $(grep 'train.steps' "$work/t8/config.gin")"
fi
# The start-up log says what the GEMM measures on the run's threads.
gflops=$(sed -nE 's/^sgemm: ([0-9.]+) GFLOP\/s \(M 512, K 256, N 256, [0-9]+ threads?, 0.1 s\)$/\1/p' <<<"$out")
if [[ -n $gflops ]] && awk -v g="$gflops" 'BEGIN { exit !(g > 0) }'; then ok "start-up sgemm $gflops GFLOP/s"; else
    bad "no 'sgemm: N GFLOP/s (..., 0.1 s)' line at start-up: $(grep -e '^sgemm' -e '^blas' <<<"$out")"
fi
out=$(OMP_WAIT_POLICY=active "$ctrax" train "$b" --steps 1 --output-dir "$work/t9" 2>&1)
if grep -q "OMP_WAIT_POLICY=active" <<<"$out"; then ok "a user's OMP_WAIT_POLICY is kept"; else
    bad "a user's OMP_WAIT_POLICY=active is not what the log says: $(grep threads: <<<"$out")"
fi

# ---- a loss's parameter through the checkpoint's config --------------------------------
# WeightedCategoryCrossEntropy.label_smoothing (Trax's) as a --config binding:
# config.gin says it, and `ctrax eval` of the step-1 checkpoint (built from
# the config saved with it) prints the Loop's step-1 eval loss to every digit
# (both from the start of the eval stream). At learning rate 1e-30 (0 is
# refused) step 1 moves no weight by more than about 1e-30, so the smoothed
# and the plain run's losses differ by the smoothing alone.
eval_loss() { sed -n 's/^Step  *1: eval  *loss | *\([0-9.]*\)$/\1/p' "$1"; }
ls_args=(--config_file="$b" --config='train.eval_steps = 2' --config='train.steps = 1'
    --config='Adam.learning_rate = 1e-30')
"$ctrax" train "${ls_args[@]}" --config='WeightedCategoryCrossEntropy.label_smoothing = 0.1' \
    --output_dir="$work/ls1" >"$work/ls1.log" 2>&1
rc1=$?
"$ctrax" train "${ls_args[@]}" --output_dir="$work/ls0" >"$work/ls0.log" 2>&1
rc0=$?
"$ctrax" eval "$work/ls1" --name model_1 >"$work/ls1.eval" 2>&1
rce=$?
loop1=$(eval_loss "$work/ls1.log") loop0=$(eval_loss "$work/ls0.log") eval1=$(eval_loss "$work/ls1.eval")
if ((rc1 == 0 && rc0 == 0 && rce == 0)) && [[ -n $loop1 && -n $loop0 && $loop1 == "$eval1" && $loop1 != "$loop0" ]] &&
    grep -qx "WeightedCategoryCrossEntropy.label_smoothing = 0.1" "$work/ls1/config.gin" &&
    grep -qx "WeightedCategoryCrossEntropy.label_smoothing = 0.1" "$work/ls1/model_1/config.gin" &&
    grep -qx "WeightedCategoryCrossEntropy.label_smoothing = 0.0" "$work/ls0/config.gin"; then
    ok "label_smoothing 0.1: eval loss $loop1 in the Loop and in ctrax eval (no smoothing: $loop0)"
else
    bad "label_smoothing round trip: exits $rc1 $rc0 $rce; Loop $loop1, ctrax eval $eval1, unsmoothed $loop0;" \
        "config.gin: $(grep label_smoothing "$work/ls1/config.gin")"
fi

# Another process keeps a core busy: the count drops below --threads (every
# core) within the run; with --fixed-threads it stays.
cores=$(nproc)
big=(--set TransformerLM.d_model=64 --set TransformerLM.d_ff=256 --set TransformerLM.n_layers=2
    --set train.batch_size=32 --set sequence_copy_inputs.train_length=17 --set TransformerLM.max_len=40
    --steps 150 --threads "$cores")
bash -c 'while :; do :; done' &
hog=$!
out=$("$ctrax" train "$b" "${big[@]}" --output-dir "$work/f1" 2>&1)
fixed=$("$ctrax" train "$b" "${big[@]}" --steps 40 --fixed-threads --output-dir "$work/f2" 2>&1)
kill "$hog"
wait "$hog" 2>/dev/null
line=$(grep -m 1 "^threads: [0-9]* of $cores at step" <<<"$out")
if [[ -n $line ]] && (($(sed 's/^threads: \([0-9]*\).*/\1/' <<<"$line") < cores)); then
    ok "a busy core lowers the count: $line"
else
    bad "one core busy, --threads $cores: no lower count logged: $(grep -E '^threads|^done' <<<"$out")"
fi
if grep -q "^done: step 40" <<<"$fixed" && ! grep -q "^threads: [0-9]* of" <<<"$fixed"; then
    ok "--fixed-threads keeps the count"
else
    bad "--fixed-threads: $(grep -E '^threads|^done' <<<"$fixed")"
fi

cli_done
