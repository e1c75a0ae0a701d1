#!/usr/bin/env bash
# A run whose loss goes NaN (SGD at a learning rate of 1e6, as a careless user
# would set it) stops with exit status 1 at the first non-finite step, naming
# that step and a layer path; every checkpoint it leaves is finite and none is
# of that step or later; run again, it resumes and stops at the same step with
# the same message, leaving the checkpoints byte for byte as they were.
#   cli_nonfinite_test.sh CTRAX SOURCE_DIR
set -uo pipefail
ctrax=$1
src=$2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
check() {  # check NAME CONDITION-STATUS DETAIL
    if (($2 == 0)); then
        pass=$((pass + 1))
        echo "ok   $1"
    else
        fail=$((fail + 1))
        echo "FAIL $1: $3"
    fi
}
run() {
    "$ctrax" train "$src/configs/copy.gin" --output-dir "$work/run" --set 'train.optimizer=@SGD' \
        --set 'train.lr_schedule_fn=None' --set 'SGD.learning_rate=1e6' --set 'train.steps=40' \
        --set 'train.eval_frequency=0' --set 'train.eval_steps=0' --set 'Loop.n_steps_per_checkpoint=1' \
        --set 'train.keep_checkpoints=2' >"$work/out" 2>&1
}

run
rc=$?
msg=$(grep -E 'step [0-9]+: non-finite' "$work/out" | head -n 1)
check "exit status 1" $((rc != 1)) "exit $rc: $(tail -n 3 "$work/out")"
step=$(sed -nE 's/.*step ([0-9]+): non-finite.*/\1/p' <<<"$msg")
[[ -n $step ]]
check "names the step: $msg" $? "no 'step N: non-finite' line in: $(tail -n 3 "$work/out")"
grep -qE 'of [A-Za-z]+(/[A-Za-z]+(\[[0-9]+\])?)+' <<<"$msg"
check "names a layer path" $? "$msg"

# The checkpoints left: all before the failing step, every weight and slot finite.
newest=$(cat "$work/run/checkpoint" 2>/dev/null)
[[ -n $step && $newest == "model_$((step - 1))" ]]
check "newest checkpoint is model_$((${step:-1} - 1))" $? "pointer names '$newest'"
grep -qxF "ctrax train: $work/run/$newest, the newest checkpoint, is whole: once the cause is mended, the same command resumes from it" "$work/out"
check "says the same command resumes from $newest" $? "$(tail -n 2 "$work/out")"
/usr/bin/python3 - "$work/run" <<'EOF'
import glob, json, struct, sys
import numpy as np
bad = []
dirs = sorted(glob.glob(sys.argv[1] + "/model_*"))
for d in dirs:
    for f in ("weights.safetensors", "slots.safetensors"):
        raw = open(f"{d}/{f}", "rb").read()
        (n,) = struct.unpack("<Q", raw[:8])
        for name, e in json.loads(raw[8 : 8 + n]).items():
            if name == "__metadata__" or e["dtype"] != "F32":
                continue
            b, end = e["data_offsets"]
            if not np.isfinite(np.frombuffer(raw[8 + n + b : 8 + n + end], "<f4")).all():
                bad.append(f"{d}/{f}:{name}")
print("checkpoints:", [d.rsplit("/", 1)[1] for d in dirs], "non-finite:", bad[:3])
sys.exit(1 if bad or not dirs else 0)
EOF
check "every checkpoint finite" $? "see above"

# Again: resumes from the newest checkpoint and stops at the same step, and
# the checkpoints are byte for byte as they were.
before=$(cd "$work/run" && find . -path './model_*' -type f -print0 | sort -z | xargs -0 sha256sum)
run
rc=$?
msg2=$(grep -E 'step [0-9]+: non-finite' "$work/out" | head -n 1)
[[ $rc == 1 && "$msg2" == "$msg" ]]
check "resumed run stops the same way" $? "exit $rc: '$msg2' vs '$msg'"
after=$(cd "$work/run" && find . -path './model_*' -type f -print0 | sort -z | xargs -0 sha256sum)
[[ "$before" == "$after" ]]
check "checkpoints unchanged by the second run" $? "$(diff <(echo "$before") <(echo "$after") | head -n 4)"

# With train.skip_nonfinite_steps on a terminal (script(1) gives the run one):
# the progress line of the step N that "step N skipped" names shows its loss
# as nan (it showed the step before's, 13058234368.0000 once).
if command -v script >/dev/null; then
    script -qc "'$ctrax' train '$src/configs/copy.gin' --output-dir '$work/skip' --set 'train.optimizer=@SGD' \
        --set 'train.lr_schedule_fn=None' --set 'SGD.learning_rate=1e6' --set 'train.steps=8' \
        --set 'train.eval_frequency=0' --set 'train.eval_steps=0' --set 'train.skip_nonfinite_steps=True'" \
        /dev/null >"$work/skip.log" 2>&1
    lines=$(tr '\r' '\n' <"$work/skip.log" | sed 's/\x1b\[K//g')
    skipped=$(sed -nE 's/.*step ([0-9]+) skipped.*/\1/p' <<<"$lines" | head -n 1)
    shown=$(grep -E "^step $skipped/" <<<"$lines" | head -n 1)  # drawn after the step, so after the warning
    [[ -n $skipped && $shown == *"| loss nan |"* ]]
    check "progress line of skipped step ${skipped:-?} shows loss nan" $? "'$shown'"
fi

echo "cli_nonfinite_test: $pass passed, $fail failed"
((fail == 0))
