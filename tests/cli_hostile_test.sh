#!/usr/bin/env bash
# Hostile files through the program (issue 10): a damaged checkpoint (with
# its manifest made consistent, so the reader gets past the checksums), a
# link to /dev/zero where a file is read, an IDX header declaring 800 GB, and
# `plot -o` aimed at a device, a fifo or a directory. Each must exit 1 with a
# message naming the file (and key or field), without a sanitizer report,
# leaving every checkpoint byte for byte as it was.
#   cli_hostile_test.sh CTRAX
set -uo pipefail
ctrax=$1
src=$(cd "$(dirname "$0")/.." && pwd)
py=/usr/bin/python3
source "$(dirname "$0")/cli_common.sh" cli_hostile_test

# The checkpoints of a run: every regular file's sha256 and every link's
# target (a link to /dev/zero is not read).
ckpt_state() {
    (cd "$1" && find . -path './model_*' -o -name checkpoint | sort | while read -r f; do
        if [[ -L $f ]]; then echo "link $f -> $(readlink "$f")"
        elif [[ -f $f ]]; then sha256sum "$f"
        fi
    done)
}

# expect NAME DIR WANT_EXIT PATTERN... -- COMMAND...: COMMAND exits WANT_EXIT,
# its output has every PATTERN (fixed strings), no sanitizer report, and DIR's
# checkpoints are unchanged.
expect() {
    local name=$1 dir=$2 want=$3
    shift 3
    local patterns=()
    while [[ $1 != -- ]]; do patterns+=("$1"); shift; done
    shift
    local before after out rc
    before=$(ckpt_state "$dir")
    out=$(timeout 120 "$@" 2>&1)
    rc=$?
    after=$(ckpt_state "$dir")
    local why=""
    ((rc == want)) || why="exit $rc, want $want"
    for p in "${patterns[@]}"; do
        grep -qF -- "$p" <<<"$out" || why="$why; no '$p'"
    done
    if grep -qE "AddressSanitizer|LeakSanitizer|runtime error:|UndefinedBehaviorSanitizer" <<<"$out"; then
        why="$why; a sanitizer report"
    fi
    [[ $before == "$after" ]] || why="$why; the checkpoints changed"
    if [[ -z $why ]]; then
        ok "$name: exit $rc: $(grep -F -- "${patterns[0]}" <<<"$out" | head -n 1 | cut -c1-240)"
    else
        bad "$name: $why; output:"
        echo "$out" | tail -n 8
    fi
}

# ---- a small run, and one copy of it per case with only its newest checkpoint ------
cfg=$src/tests/configs/copy_run.gin
if ! "$ctrax" train "$cfg" --output-dir "$work/base" --steps 2 >"$work/base.log" 2>&1; then
    bad "training the base run"
    cat "$work/base.log"
    echo "cli_hostile_test: $pass passed, $fail failed"
    exit 1
fi
latest=$(head -n 1 "$work/base/checkpoint")
# A copy whose only checkpoint is the newest: resuming cannot fall back to an
# older one, so a damaged newest one must stop the run.
fresh() {
    local d=$work/$1
    cp -a "$work/base" "$d"
    for c in "$d"/model_*; do [[ $(basename "$c") == "$latest" ]] || rm -rf "$c"; done
    echo "$d"
}
# fix_manifest CKPT_DIR FILE: the manifest's bytes and crc32 of FILE match what is there now.
fix_manifest() {
    "$py" - "$1" "$2" <<'EOF'
import json, sys, zlib
d, name = sys.argv[1], sys.argv[2]
data = open(f"{d}/{name}", "rb").read()
m = json.load(open(f"{d}/manifest.json"))
for f in m["files"]:
    if f["name"] == name:
        f["bytes"] = len(data)
        f["crc32"] = "%08x" % (zlib.crc32(data) & 0xffffffff)
        f.pop("tensors", None)
open(f"{d}/manifest.json", "w").write(json.dumps(m, indent=2))
EOF
}
# Resuming: `"${resume[@]}" DIR`.
resume=("$ctrax" train "$cfg" --steps 4 --output-dir)

# 1. The 64-byte safetensors file with "__metadata__" twice (it wrote past an array).
d=$(fresh dup_meta)
"$py" - "$d/$latest/slots.safetensors" <<'EOF'
import struct, sys
h = b'{"__metadata__":{"a":"b"},"__metadata__":{"c":"d"}}'
h += b" " * (0x38 - len(h))
open(sys.argv[1], "wb").write(struct.pack("<Q", len(h)) + h)
EOF
fix_manifest "$d/$latest" slots.safetensors
expect "info: __metadata__ twice" "$d" 1 "slots.safetensors" "'__metadata__' appears twice" -- "$ctrax" info "$d"
expect "train: __metadata__ twice" "$d" 1 "slots.safetensors" "'__metadata__' appears twice" -- "${resume[@]}" "$d"

# 2. state.json with optimizer "params": [1] (NULL into strcmp).
d=$(fresh params_array)
"$py" - "$d/$latest/state.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
s["optimizer"]["params"] = [1]
open(sys.argv[1], "w").write(json.dumps(s))
EOF
fix_manifest "$d/$latest" state.json
expect "info: optimizer.params [1]" "$d" 1 "$latest/state.json" "optimizer.params" -- "$ctrax" info "$d"
expect "train: optimizer.params [1]" "$d" 1 "state.json" "optimizer.params" -- "${resume[@]}" "$d"

# 3. state.json with a key twice: every reader must see one state.
d=$(fresh dup_state)
"$py" - "$d/$latest/state.json" <<'EOF'
import sys
t = open(sys.argv[1]).read()
i = t.index("{") + 1
open(sys.argv[1], "w").write(t[:i] + '"step": 1e300, ' + t[i:])
EOF
fix_manifest "$d/$latest" state.json
expect "info: state.json key twice" "$d" 1 "$latest/state.json" "'step' appears twice" -- "$ctrax" info "$d"
expect "train: state.json key twice" "$d" 1 "$latest/state.json" "'step' appears twice" -- "${resume[@]}" "$d"

# 3b. state.json fields out of range (a step of -1 or 1e300 once reached an
# out-of-range float-to-integer conversion and an assertion): each refused,
# naming the field. edit_state DIR PYTHON-STATEMENT (on the dict s).
edit_state() {
    "$py" -c 'import json, sys
s = json.load(open(sys.argv[1]))
exec(sys.argv[2])
open(sys.argv[1], "w").write(json.dumps(s))' "$1/$latest/state.json" "$2"
    fix_manifest "$1/$latest" state.json
}
while IFS='|' read -r case edit field; do
    d=$(fresh "state_$case")
    edit_state "$d" "$edit"
    # info shows the manifest's step and reads none of these fields: it must
    # just not trip over them.
    expect "info: state.json $case" "$d" 0 "step" -- "$ctrax" info "$d"
    expect "train: state.json $case" "$d" 1 "state.json" "$field" -- "${resume[@]}" "$d"
done <<'CASES'
step_negative|s["step"] = -1|"step"
step_huge|s["step"] = 1e300|"step"
step_fraction|s["step"] = 2.5|"step"
key_range|s["key"] = [2**33, 0]|"key"
key_short|s["key"] = [1]|"key"
history_row|s["history"] = [["train", "metrics/loss", -5, 1.0]]|history[0]
loss_count|s["train_since_log"]["loss_count"] = 10**6|"train_since_log"
param_huge|s["optimizer"]["params"]["learning_rate"] = 1e300|optimizer.params.learning_rate
cursor|s["train_cursors"] = [{"position": "-3", "fingerprint": "1"}]|train cursor
cursor_huge|s["train_cursors"][0]["position"] = "4611686018427387904"|over 2^48
CASES

# 4. state.json, config.gin and manifest.json as links to /dev/zero: refused, not read.
for f in state.json config.gin manifest.json; do
    d=$(fresh "zero_${f%%.*}")
    rm -f "$d/$latest/$f"
    ln -s /dev/zero "$d/$latest/$f"
    expect "info: $f -> /dev/zero" "$d" 1 "$latest/$f" "not a regular file" -- "$ctrax" info "$d"
    expect "train: $f -> /dev/zero" "$d" 1 "$latest/$f" "not a regular file" -- "${resume[@]}" "$d"
done
# The pointer as a link to /dev/zero: the newest checkpoint is found without it.
d=$(fresh zero_pointer)
rm -f "$d/checkpoint"
ln -s /dev/zero "$d/checkpoint"
expect "info: pointer -> /dev/zero" "$d" 0 "$latest" -- "$ctrax" info "$d"

# 4b. config.gin binding a batch no machine holds (a checkpoint may be
# anyone's): eval refuses it from the settings, naming them, before the
# inputs allocate it (under a 16 GB limit it filled 9.6 GB in 31 s, then
# aborted in an allocation: exit 134).
d=$(fresh eval_batch)
sed -i 's/^train.batch_size = .*/train.batch_size = 16777216/' "$d/$latest/config.gin"
fix_manifest "$d/$latest" config.gin
expect "eval: config.gin train.batch_size = 2^24" "$d" 1 "$latest/config.gin" "(16777216 x" "activations need about" -- \
    "$ctrax" eval "$d"

# 5. plot: /dev/zero as the metrics file, and outputs that are not regular files.
expect "plot /dev/zero" "$work/base" 1 "/dev/zero" "not a regular file" -- "$ctrax" plot /dev/zero -o "$work/z.svg"
ln -s /dev/null "$work/null.svg"
expect "plot -o link to /dev/null" "$work/base" 1 "null.svg" "not a regular file" -- "$ctrax" plot "$work/base" -o "$work/null.svg"
if [[ -L $work/null.svg && $(readlink "$work/null.svg") == /dev/null && -c /dev/null ]]; then ok "the link and /dev/null are as they were"; else bad "null.svg or /dev/null changed"; fi
mkfifo "$work/out.fifo"
expect "plot -o fifo" "$work/base" 1 "out.fifo" "fifo" -- "$ctrax" plot "$work/base" -o "$work/out.fifo"
if [[ -p $work/out.fifo ]]; then ok "the fifo is still a fifo"; else bad "out.fifo was replaced"; fi
mkdir "$work/out.dir"
expect "plot -o directory" "$work/base" 1 "out.dir" "directory" -- "$ctrax" plot "$work/base" -o "$work/out.dir"
# A regular file is still replaced (by a new file renamed over it).
echo old >"$work/old.svg"
expect "plot -o regular file" "$work/base" 0 "wrote $work/old.svg" -- "$ctrax" plot "$work/base" -o "$work/old.svg"
if grep -q "<svg" "$work/old.svg"; then ok "old.svg holds the SVG"; else bad "old.svg was not written"; fi
# The metrics file it reads, by its name or a link: refused, the metrics kept
# (the SVG replaced the run's metrics.jsonl).
cp "$work/base/metrics.jsonl" "$work/metrics_before.jsonl"
expect "plot -o its metrics file" "$work/base" 1 "is the metrics file it reads" -- \
    "$ctrax" plot "$work/base" -o "$work/base/metrics.jsonl"
ln -s base/metrics.jsonl "$work/metrics_link.svg"
expect "plot -o a link to its metrics file" "$work/base" 1 "is the metrics file it reads" -- \
    "$ctrax" plot "$work/base/metrics.jsonl" -o "$work/metrics_link.svg"
if cmp -s "$work/base/metrics.jsonl" "$work/metrics_before.jsonl"; then ok "metrics.jsonl is as it was"; else
    bad "plot replaced metrics.jsonl"
fi

# 6. An IDX header declaring 200 x 65536 x 65536 images in 16 bytes of file.
"$py" - "$work/huge-images" "$work/labels" <<'EOF'
import struct, sys
open(sys.argv[1], "wb").write(struct.pack(">IIII", 0x803, 200, 65536, 65536))
open(sys.argv[2], "wb").write(struct.pack(">II", 0x801, 200) + bytes(200))
EOF
cat >"$work/idx.gin" <<EOF
train.model = @MLP
train.inputs = @IDXInputs
train.steps = 2
train.batch_size = 2
MLP.layer_widths = [4, 10]
MLP.flatten = True
IDXInputs.train_images = '$work/huge-images'
IDXInputs.train_labels = '$work/labels'
IDXInputs.eval_images = '$work/huge-images'
IDXInputs.eval_labels = '$work/labels'
EOF
# Into a run directory that holds a checkpoint: the error comes before anything is touched.
d=$(fresh idx_run)
expect "train: IDX 800 GB header" "$d" 1 "huge-images" "200 images of 65536x65536" -- "$ctrax" train "$work/idx.gin" --output-dir "$d"

# 6b. A labels file with a label over n_classes: the error names the labels
# setting (it named the images one).
"$py" - "$work/small-images" "$work/bad-labels" <<'EOF'
import struct, sys
open(sys.argv[1], "wb").write(struct.pack(">IIII", 0x803, 4, 2, 2) + bytes(16))
open(sys.argv[2], "wb").write(struct.pack(">II", 0x801, 4) + bytes([1, 2, 200, 3]))
EOF
sed -e "s|$work/huge-images|$work/small-images|" -e "s|IDXInputs.train_labels = .*|IDXInputs.train_labels = '$work/bad-labels'|" \
    "$work/idx.gin" >"$work/idx_labels.gin"
expect "train: IDX label 200" "$work/base" 1 "idx_labels.gin:8:26: IDXInputs.train_labels" "bad-labels" -- \
    "$ctrax" train "$work/idx_labels.gin" --output-dir "$work/idx_labels"

# 6c. A shuffle buffer of 2^24 examples of 1,024 bytes (about 200 GiB):
# refused before it is allocated, naming the setting.
head -c 300000 /dev/urandom | base64 >"$work/corpus.txt"
expect "train: shuffle buffer 2^24" "$work/base" 1 "TextInputs.shuffle_buffer = 16777216" "examples needs" -- \
    "$ctrax" train "$src/configs/fortunes_reformer.gin" --set "TextInputs.paths=['$work/corpus.txt']" \
    --set TextInputs.shuffle_buffer=16777216 --output-dir "$work/shuffle"
# 6d. A sparse 8 GiB token file read one token an example: 2^32 examples,
# whose index (32 GiB) aborted in malloc; refused before, naming seq_len.
# And a seq_len longer than the corpus names the --set that made it so.
truncate -s 8G "$work/sparse_tokens.bin"
expect "train: 2^32 examples" "$work/base" 1 \
    "(with --set:1:1: TokenInputs.seq_len = 1, TokenInputs.token_bytes = 2 (its default))" "more than 2^32" -- \
    "$ctrax" train "$src/configs/copy.gin" --set train.inputs=@TokenInputs \
    --set "TokenInputs.paths=['$work/sparse_tokens.bin']" --set TokenInputs.seq_len=1 --output-dir "$work/sparse"
rm -f "$work/sparse_tokens.bin"
expect "train: seq_len past the corpus" "$work/base" 1 "(with --set:1:1: TextInputs.seq_len = 600000)" \
    "fewer than one example of 600000" -- \
    "$ctrax" train "$src/configs/copy.gin" --set train.inputs=@TextInputs --set train.batch_size=1 \
    --set "TextInputs.paths=['$work/corpus.txt']" --set TextInputs.seq_len=600000 --output-dir "$work/long_seq"

# 6e. Evals of examples far longer than training's (a copy task's
# eval_max_length): refused at start, naming the setting, not at the first
# eval after 16 GB were taken.
expect "train: eval_max_length 10^6" "$work/base" 1 "sequence_copy_inputs.eval_max_length = 1000000" \
    "an eval step's activations need about" -- \
    "$ctrax" train "$src/configs/copy.gin" --set sequence_copy_inputs.eval_max_length=1000000 \
    --set sequence_copy_inputs.eval_min_length=999999 --set TransformerLM.max_len=2000002 --output-dir "$work/evmem"

# 7. OMP_NUM_THREADS in the tens of thousands (OpenMP reads it before any
# check), or one libgomp passes over with a warning (then running a thread
# per core): exit 2 naming it, as --threads out of range.
OMP_NUM_THREADS=100000 expect "OMP_NUM_THREADS=100000" "$work/base" 2 "OMP_NUM_THREADS='100000' is out of range" \
    "1 to 4096" -- "$ctrax" train "$cfg" --steps 1 --output-dir "$work/omp"
OMP_NUM_THREADS=abc expect "OMP_NUM_THREADS=abc" "$work/base" 2 "OMP_NUM_THREADS='abc' is not a thread count" -- \
    "$ctrax" train "$cfg" --steps 1 --output-dir "$work/omp"
OMP_NUM_THREADS=0 expect "OMP_NUM_THREADS=0" "$work/base" 2 "OMP_NUM_THREADS='0' is out of range" -- \
    "$ctrax" sample "$work/base" --length 1
OMP_NUM_THREADS='1,1' expect "OMP_NUM_THREADS=1,1 (a list per nesting level)" "$work/base" 0 "" -- \
    "$ctrax" info "$work/base"
# 8. A metrics list with something that is not a layer after one that is:
# refused when the config is read, naming the item and where it is written.
expect "train.metrics with an optimizer" "$work/base" 1 "--set:1:1: train.metrics expects a list of references to" \
    "item 1 is @Adam (an optimizer) at --set:1:43" -- \
    "$ctrax" train "$cfg" --steps 1 --set 'train.metrics=[@WeightedCategoryAccuracy, @Adam]' --output-dir "$work/lk"

# 9. Weights that are all NaN (a checkpoint's bytes are anyone's; its crc32s
# made to match): sample has no finite logit to draw from and says so, not
# byte 0 as if the model had chosen it.
d=$(fresh nan_weights)
"$py" - "$d/$latest/weights.safetensors" <<'EOF'
import struct, sys
data = bytearray(open(sys.argv[1], "rb").read())
start = 8 + struct.unpack("<Q", data[:8])[0]
data[start:] = struct.pack("<f", float("nan")) * ((len(data) - start) // 4)
open(sys.argv[1], "wb").write(data)
EOF
fix_manifest "$d/$latest" weights.safetensors
expect "sample: NaN weights" "$d" 1 "logits for byte 0 are all NaN or infinite" -- "$ctrax" sample "$d" --length 3

# 10. A corpus cut short by another process while training reads it through
# a memory map: SIGBUS, which ended ctrax with no word; now exit 1 naming the
# file, and the checkpoints written before are whole (info reads the newest).
head -c 3000000 /dev/urandom | base64 >"$work/cut_corpus.txt"
"$ctrax" train "$src/configs/copy.gin" --set train.inputs=@TextInputs --set "TextInputs.paths=['$work/cut_corpus.txt']" \
    --set TextInputs.seq_len=32 --set train.batch_size=4 --set train.eval_steps=0 --set TransformerLM.vocab_size=256 --steps 100000000 \
    --output-dir "$work/cut" >"$work/cut.log" 2>&1 &
pid=$!
for _ in $(seq 600); do [[ -f $work/cut/checkpoint ]] && break; sleep 0.1; done  # the first checkpoint: step 1
truncate -s 0 "$work/cut_corpus.txt"
for _ in $(seq 600); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -9 "$pid" 2>/dev/null
wait "$pid"
rc=$?
want="$work/cut_corpus.txt was cut short (or became unreadable) while ctrax read it through a memory map: byte "
if ((rc == 1)) && grep -qF -- "$want" "$work/cut.log" && ! grep -qE "Sanitizer|runtime error:" "$work/cut.log"; then
    ok "a corpus cut short while training: exit 1: $(grep -F -- "$want" "$work/cut.log" | cut -c1-200)"
else
    bad "a corpus cut short while training: exit $rc, want 1 and '$want'; the log ends:"
    tail -n 5 "$work/cut.log"
fi
expect "info after the corpus was cut" "$work/cut" 0 "checkpoint   $work/cut/model_" -- "$ctrax" info "$work/cut"

cli_done
