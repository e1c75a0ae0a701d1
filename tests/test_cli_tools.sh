#!/usr/bin/env bash
# The subcommands info, plot, sample and eval (tools/cmd_*.c), through
# tests/cli_driver.c:
#
#   tests/test_cli_tools.sh CLI_DRIVER SOURCE_DIR [CTRAX]
#
# (CTRAX, the program, for what only its main() does: `ctrax --help`,
# `ctrax train --help`.)
#
# Trains two small runs first (copy-task TransformerLMs, vocabulary 10 and
# 256, checkpoints every 2 steps), then checks what each command prints and
# its exit code: 0 done, 1 error, 2 bad usage with a message on stderr.
# Ends with "test_cli_tools: N passed, N failed".
set -uo pipefail
driver=$1
src=$2
ctrax=${3:-}
py=/usr/bin/python3
tmp=$(mktemp -d /tmp/ctrax_test_cli_XXXXXX)
trap 'rm -rf "$tmp"' EXIT
passed=0
failed=0

ok() { passed=$((passed + 1)); }
bad() {
    failed=$((failed + 1))
    echo "FAIL: $*"
}
# check DESCRIPTION COMMAND...: the command must succeed.
check() {
    local what=$1
    shift
    if "$@"; then ok; else bad "$what"; fi
}
# expect_exit CODE STDERR_PATTERN ARGS...: the driver exits with CODE and,
# unless the pattern is empty, says something matching it on stderr.
expect_exit() {
    local code=$1 pattern=$2 rc
    shift 2
    "$driver" "$@" >"$tmp/out" 2>"$tmp/err"
    rc=$?
    if [[ $rc != "$code" ]]; then
        bad "'$*' exited $rc, expected $code; stderr: $(cat "$tmp/err")"
    elif [[ -n $pattern ]] && ! grep -qE -- "$pattern" "$tmp/err"; then
        bad "'$*' stderr does not match /$pattern/: $(cat "$tmp/err")"
    else
        ok
    fi
}
# has FILE PATTERN: a line of FILE matches the extended regex.
has() {
    if grep -qE -- "$2" "$1"; then ok; else bad "$1 has no line matching /$2/"; fi
}

# edit_checkpoint SRC_CHECKPOINT DST_CHECKPOINT FILE PYTHON_EXPR: a copy of
# the checkpoint whose FILE holds PYTHON_EXPR's bytes (of `data`, the old
# ones), with the manifest's size and checksum made to match, as a hostile
# writer would.
edit_checkpoint() {
    "$py" - "$@" <<'EOF'
import json, shutil, sys, zlib
src, dst, name, expr = sys.argv[1:5]
shutil.copytree(src, dst)
data = open(f"{dst}/{name}", "rb").read()
data = eval(expr)
open(f"{dst}/{name}", "wb").write(data)
m = json.load(open(f"{dst}/manifest.json"))
for f in m["files"]:
    if f["name"] == name:
        f["bytes"], f["crc32"] = len(data), "%08x" % zlib.crc32(data)
json.dump(m, open(f"{dst}/manifest.json", "w"))
EOF
}

# ---- two small runs --------------------------------------------------------------
run10=$tmp/run10
run256=$tmp/run256
"$driver" make-run "$run10" 10 6 | tee "$tmp/run10.log"
check "make-run vocab 10" test "${PIPESTATUS[0]}" = 0
"$driver" make-run "$run256" 256 4 | tee "$tmp/run256.log"
check "make-run vocab 256" test "${PIPESTATUS[0]}" = 0

# ---- --help for each: usage on stdout, exit 0 -----------------------------------------
for cmd in info plot sample eval; do
    expect_exit 0 "" "$cmd" --help
    has "$tmp/out" "^usage: ctrax $cmd "
    # Every option the help names is one the command reads (--system runs
    # a 1-second measurement: not here).
    for opt in $(grep -oE -- '(^| |\[)--?[a-z][a-z-]*' "$tmp/out" | tr -d ' [' | sort -u); do
        [[ $opt == --help || $opt == --system ]] && continue
        "$driver" "$cmd" "$tmp/nowhere" "$opt" >/dev/null 2>"$tmp/err"
        if ! grep -q "unknown option" "$tmp/err"; then ok; else bad "$cmd --help names $opt: $(cat "$tmp/err")"; fi
    done
done

# ---- info ----------------------------------------------------------------------------
expect_exit 0 "" info "$run10"
cp "$tmp/out" "$tmp/info"
has "$tmp/info" "^checkpoint +.*/run10/model_6$"
has "$tmp/info" "^step +6$"
has "$tmp/info" "^optimizer +Adam: learning_rate 0.01"
has "$tmp/info" "^ +F32 +\[10, 16\] +160 +TransformerLM/Embedding\[1\]/embedding$"
has "$tmp/info" "^ +F32 +\[16, 10\] +160 +TransformerLM/Dense\[6\]/kernel$"
has "$tmp/info" "^config \(config.gin\):$"
has "$tmp/info" "^  train.model = @TransformerLM$"
has "$tmp/info" "^last metrics train loss = "
has "$tmp/info" "eval +accuracy = "
# The parameter count and tensor count are those of the safetensors header.
read -r n_params n_tensors < <("$py" - "$run10/model_6/weights.safetensors" <<'EOF'
import json, struct, sys
raw = open(sys.argv[1], "rb").read()
(n,) = struct.unpack("<Q", raw[:8])
h = json.loads(raw[8:8 + n]); h.pop("__metadata__", None)
total = 0
for v in h.values():
    k = 1
    for d in v["shape"]: k *= d
    total += k
print(f"{total:,}", len(h))
EOF
)
has "$tmp/info" "^parameters +$n_params in $n_tensors tensors"
n_rows=$(grep -cE '^  F32 ' "$tmp/info")
if [[ $n_rows == "$n_tensors" ]]; then ok; else bad "info lists $n_rows tensors, the file has $n_tensors"; fi
echo "info: $n_params parameters in $n_tensors tensors, all listed"
# A checkpoint directory, and --name.
expect_exit 0 "" info "$run10/model_4/"
has "$tmp/out" "^step +4$"
expect_exit 0 "" info "$run10" --name model_2
has "$tmp/out" "^step +2$"
has "$tmp/out" "model_2 \(step 2, shown here\)"
# --name is a checkpoint of the directory given, even when that is a checkpoint itself.
expect_exit 1 "model_4/model_2: no such checkpoint" info "$run10/model_4" --name model_2
# A directory with one checkpoint lists no others.
mkdir "$tmp/one_run"
cp -r "$run10/model_6" "$tmp/one_run/"
expect_exit 0 "" info "$tmp/one_run"
if ! grep -q "^checkpoints" "$tmp/out"; then ok; else bad "info of one checkpoint listed: $(grep "^checkpoints" "$tmp/out")"; fi
# With a schedule, the optimizer's learning_rate is not the rate it ran at:
# the schedule line says it instead, and the other hyperparameters stay.
edit_checkpoint "$run10/model_6" "$tmp/sched_run/model_6" config.gin 'data + b"train.lr_schedule_fn = @multifactor\n"'
expect_exit 0 "" info "$tmp/sched_run/model_6"
has "$tmp/out" "^optimizer +Adam: b1 0.9, b2 0.999"
has "$tmp/out" "^schedule +multifactor sets the learning rate each step"
if ! grep -q "learning_rate 0.01" "$tmp/out"; then ok; else bad "info with a schedule shows Adam's learning_rate"; fi
# Last metrics: metrics/* only (not 'metricsx/y', whose name has no "metrics/").
edit_checkpoint "$run10/model_6" "$tmp/hist_run/model_6" state.json \
    'json.dumps(dict(json.loads(data), history=[["train", "metricsx/y", 6, 1.5], ["eval", "metrics/loss", 4, 3.5],
                                                 ["eval", "metrics/loss", 6, 2.5]])).encode()'
expect_exit 0 "" info "$tmp/hist_run/model_6"
has "$tmp/out" "^last metrics eval +loss = 2.5 \(step 6\)$"
if ! grep -q "metricsx\|= 1.5" "$tmp/out"; then ok; else bad "info showed a metric that is not metrics/*"; fi
# A metric logged twice is shown once, at its last value (not its first, 3.5).
n=$(grep -c "loss = " "$tmp/out")
if [[ $n == 1 ]]; then ok; else bad "info showed eval loss $n times: $(grep "loss = " "$tmp/out")"; fi
# A hostile checkpoint's escape sequences (in the config, a metric's name and
# mode, a hyperparameter's name) never reach the terminal: each control
# character is a '?'.
edit_checkpoint "$run10/model_6" "$tmp/esc1/model_6" config.gin 'data + b"# \x1b]0;title\x07\x1b[2J \xc2\x9b31m\n"'
edit_checkpoint "$tmp/esc1/model_6" "$tmp/esc_run/model_6" state.json \
    'json.dumps(dict(json.loads(data), history=[["\x1b[2J", "metrics/\x1b[31m", 6, 1.5]],
                     optimizer={"name": "Adam\x1b[0m", "params": {"b1\x07": 0.9}})).encode()'
expect_exit 0 "" info "$tmp/esc_run/model_6"
if ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]\|\xc2[\x80-\x9f]' "$tmp/out"; then ok; else
    bad "info wrote control characters: $(LC_ALL=C grep -a $'[\x01-\x08\x0b-\x1f\x7f]' "$tmp/out" | od -c | head -3)"
fi
has "$tmp/out" '^  # \?\]0;title\?\?\[2J \?\?31m$'
has "$tmp/out" '^last metrics \?\[2J +\?\[31m = 1.5 \(step 6\)$'
has "$tmp/out" '^optimizer +Adam: b1\? 0.9'  # the name: slots.safetensors'
# The names of an output directory's checkpoints are anyone's too: the list
# and the newest's name show each control character as '?'.
cp -r "$run10" "$tmp/escname_run"
"$py" - "$tmp/escname_run" <<'EOF'
import json, os, sys
d, new = sys.argv[1], "model_\x1b]0;x\x07"
for old in ("model_2", "model_6"):
    name = new + old[-1]
    os.rename(f"{d}/{old}", f"{d}/{name}")
    m = json.load(open(f"{d}/{name}/manifest.json"))
    m["name"] = name
    json.dump(m, open(f"{d}/{name}/manifest.json", "w"))
EOF
expect_exit 0 "" info "$tmp/escname_run"
if ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$tmp/out"; then ok; else
    bad "info wrote a checkpoint name's control characters: $(grep -a checkpoint "$tmp/out" | od -c | head -3)"
fi
has "$tmp/out" '^checkpoint +.*/escname_run/model_\?\]0;x\?6$'
has "$tmp/out" '^checkpoints +model_\?\]0;x\?2 \(step 2\), model_4 \(step 4\), model_\?\]0;x\?6 \(step 6, shown here\)$'
# The same names after a --name that is not there, escaped too.
expect_exit 1 "no such checkpoint" info "$tmp/escname_run" --name model_9
if ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$tmp/err"; then ok; else
    bad "info --name wrote a checkpoint name's control characters: $(LC_ALL=C grep -a holds "$tmp/err" | od -c | head -3)"
fi
has "$tmp/err" '^  .*/escname_run holds model_\?\]0;x\?2, model_4, model_\?\]0;x\?6$'
# eval and sample name the checkpoint they read on stderr, escaped too (and
# the library's warning that the pointer's checkpoint is gone).
for cmd in eval sample; do
    expect_exit 0 "" "$cmd" "$tmp/escname_run" $([[ $cmd == sample ]] && echo --length 2)
    if ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]' "$tmp/err"; then ok; else
        bad "$cmd wrote a checkpoint name's control characters: $(LC_ALL=C grep -a model_ "$tmp/err" | od -c | head -3)"
    fi
    has "$tmp/err" "escname_run/model_\?\]0;x\?6 \(step 6\)"
done
# Errors (1) and bad usage (2).
expect_exit 1 "no such checkpoint" info "$run10" --name model_9
# ... followed by the checkpoints the directory does hold (model_1 of a
# finished run is pruned: the names show what --name can take).
has "$tmp/err" "^  .*/run10 holds model_2, model_4, model_6$"
expect_exit 1 "no such checkpoint" eval "$run10" --name model_1
has "$tmp/err" "^  .*/run10 holds model_2, model_4, model_6$"
# At most 8 names; the rest counted.
cp -r "$run10" "$tmp/many_run"
"$py" - "$tmp/many_run" <<'EOF2'
import json, shutil, sys
d = sys.argv[1]
for k in range(10, 17):
    name = f"model_{k}"
    shutil.copytree(f"{d}/model_6", f"{d}/{name}")
    m = json.load(open(f"{d}/{name}/manifest.json"))
    m["name"], m["step"] = name, k
    json.dump(m, open(f"{d}/{name}/manifest.json", "w"))
EOF2
expect_exit 1 "no such checkpoint" sample "$tmp/many_run" --name model_1
has "$tmp/err" "^  .*/many_run holds model_2, model_4, model_6, model_10, model_11, model_12, model_13, model_14 and 2 more \\(ctrax info lists them\\)$"
# A checkpoint name that is a file, or a link to itself: said as such.
cp -r "$run10" "$tmp/odd_run"
touch "$tmp/odd_run/model_7"
ln -s model_8 "$tmp/odd_run/model_8"
expect_exit 1 "model_7: not a checkpoint: not a directory" info "$tmp/odd_run" --name model_7
expect_exit 1 "model_8: no such checkpoint \(Too many levels of symbolic links\)" info "$tmp/odd_run" --name model_8
expect_exit 1 "no such directory" info "$tmp/nowhere"
expect_exit 1 "holds no checkpoint" info "$tmp"
expect_exit 2 "missing CHECKPOINT_DIR" info
expect_exit 2 "the directory argument is empty \\(''\\)" info ""
expect_exit 2 "unknown option '--bogus'" info "$run10" --bogus
expect_exit 2 "one checkpoint at a time" info "$run10" "$run256"
# '-' alone is an operand, not an option.
expect_exit 1 "info: -: no such directory" info -
expect_exit 2 "--name needs a value" info "$run10" --name
# A name no checkpoint can have is bad usage, for each command that takes one.
for cmd in info eval sample; do
    expect_exit 2 "--name: invalid checkpoint name '../run256'" "$cmd" "$run10" --name ../run256
done
expect_exit 2 "--name: invalid checkpoint name 'checkpoint'" info "$run10" --name checkpoint
# --name's value is a name even when it is spelled --system (it was read as
# the --system option: "--system takes no other argument").
expect_exit 1 "/--system: no such checkpoint" info "$run10" --name --system
# --threads is --system's (a checkpoint's info computes nothing).
expect_exit 2 "--threads goes with --system" info "$run10" --threads 2
expect_exit 2 "--threads goes with --system" info "$run10" --threads=2
# A damaged checkpoint is an error that names the file.
mkdir "$tmp/damaged"
cp -r "$run10/model_6" "$tmp/damaged/"
size=$(stat -c %s "$tmp/damaged/model_6/weights.safetensors")
printf 'x' | dd of="$tmp/damaged/model_6/weights.safetensors" bs=1 seek=$((size - 10)) conv=notrunc status=none
expect_exit 1 "weights.safetensors" info "$tmp/damaged/model_6"
echo "info of a damaged checkpoint: $(cat "$tmp/err")"

# ---- plot --------------------------------------------------------------------------
expect_exit 0 "" plot "$run10"
has "$tmp/out" "^wrote .*/run10/metrics.svg: 3 panel"
check "plot of run10 matches metrics.jsonl" \
    "$py" "$src/tests/check_svg.py" "$run10/metrics.svg" "$run10/metrics.jsonl" \
    metrics/loss,metrics/accuracy,metrics/sequence_accuracy
expect_exit 0 "" plot "$run10/metrics.jsonl" --metrics loss -o "$tmp/loss.svg"
check "plot --metrics loss" "$py" "$src/tests/check_svg.py" "$tmp/loss.svg" "$run10/metrics.jsonl" metrics/loss
# To stdout.
expect_exit 0 "wrote the SVG to stdout" plot "$run10" -o - --metrics accuracy,training/gradients_l2
check "plot -o -" "$py" "$src/tests/check_svg.py" "$tmp/out" "$run10/metrics.jsonl" \
    metrics/accuracy,training/gradients_l2
# A file with what a real one may hold: a null (NaN) value, a step written
# twice (the last counts), a line cut short, markup characters in a name,
# another mode, and many points.
"$py" - "$tmp/odd.jsonl" <<'EOF'
import json, math, sys
with open(sys.argv[1], "w") as f:
    w = lambda **o: f.write(json.dumps(o) + "\n")
    for s in range(0, 3001, 10):
        w(step=s, mode="train", metric="metrics/loss", value=3 * math.exp(-s / 900) + 0.5)
        if s % 250 == 0:
            w(step=s, mode="eval", metric="metrics/loss", value=None if s == 1000 else 3 * math.exp(-s / 900) + 0.7)
            w(step=s, mode="eval", metric="metrics/a<b&\"c']]>", value=s / 3000)
            w(step=s, mode="holdout", metric="metrics/loss", value=3.5 - s / 3000)
    w(step=500, mode="eval", metric="metrics/loss", value=4.0)
    f.write('{"step": 2000, "mode": "train", "metric": "metrics/loss", "value": 1e999}\n')  # inf: not finite
    f.write('{"step": 3010, "mode": "tr')
EOF
# Files no run writes: 100 metrics are more panels than a page holds (the
# caller chooses), 2,000 distinct series are not a run's metrics at all.
"$py" -c 'import json, sys
for n, name in ((100, "wide"), (2000, "many")):
    with open(f"{sys.argv[1]}/{name}.jsonl", "w") as f:
        for i in range(n): f.write(json.dumps({"step": 1, "mode": "train", "metric": f"metrics/m{i}", "value": 1.0}) + "\n")' "$tmp"
expect_exit 1 "100 metrics to draw, at most 64 panels" plot "$tmp/wide.jsonl" -o "$tmp/wide.svg"
# A directory whose metrics.jsonl's path passes 4095 bytes: refused, not
# read (and written beside) under a path cut short.
long=$tmp
while ((${#long} < 4090)); do long+=/.; done
expect_exit 1 "the path is longer than 4095 bytes" plot "$long"
expect_exit 0 "" plot "$tmp/wide.jsonl" -o "$tmp/wide.svg" --metrics m1,m99
expect_exit 1 "more than 1024 \(metric, mode\) series" plot "$tmp/many.jsonl" -o "$tmp/many.svg"
expect_exit 0 "skipped 1 line" plot "$tmp/odd.jsonl" -o "$tmp/odd.svg"
check "plot of odd.jsonl" "$py" "$src/tests/check_svg.py" "$tmp/odd.svg" "$tmp/odd.jsonl" "metrics/loss,metrics/a<b&\"c']]>"
has "$tmp/odd.svg" 'class="nonfinite"'
if command -v rsvg-convert >/dev/null; then
    check "rsvg-convert renders the plot" rsvg-convert "$tmp/odd.svg" -o "$tmp/odd.png"
    echo "plot: rendered by rsvg-convert"
else
    echo "plot: rsvg-convert not installed, rendering not checked"
fi
# Zeros where a crash left a line (or a NUL inside one): skipped with the
# warning, not read as a blank line (or as the line's first object alone).
{ head -n 2 "$run10/metrics.jsonl"; head -c 64 /dev/zero; echo; head -n 1 "$run10/metrics.jsonl" | tr -d '\n'
  printf '\0'; head -n 1 "$run10/metrics.jsonl"; } >"$tmp/zeros.jsonl"
expect_exit 0 "skipped 2 line\(s\) .*\(the first: line 3: " plot "$tmp/zeros.jsonl" -o "$tmp/zeros.svg"
expect_exit 1 "has no metric 'nope'; it has: metrics/loss" plot "$run10" --metrics nope
expect_exit 1 "cannot open" plot "$tmp/nowhere.jsonl"
printf '%s\n' '{"step": 1, "mode": "train", "metric": "training/loss", "value": 1}' \
    '{"step": 1, "mode": "train", "metric": "metricsx/y", "value": 1}' >"$tmp/nometrics.jsonl"
expect_exit 1 "no metrics/\* values" plot "$tmp/nometrics.jsonl" -o "$tmp/x.svg"
expect_exit 2 "missing METRICS_JSONL" plot
expect_exit 2 "names separated by commas" plot "$run10" --metrics loss,
expect_exit 2 "names separated by commas" plot "$run10" --metrics loss,,accuracy
# A short option takes its value apart only ("-o=x" would be a file "=x").
expect_exit 2 "unknown option '-o=" plot "$run10" -o="$tmp/eq.svg"
expect_exit 0 "" plot "$run10" --output="$tmp/eq.svg" --metrics loss
has "$tmp/out" "^wrote $tmp/eq.svg: 1 panel"
# An option given twice: the last one wins (commands.h's ctrax_option), as a
# script that appends its own -o to a user's expects; the first is not written.
expect_exit 0 "" plot "$run10" --metrics loss -o "$tmp/first.svg" --metrics accuracy -o "$tmp/last.svg"
has "$tmp/out" "^wrote $tmp/last.svg: 1 panel"
has "$tmp/out" "^  metrics/accuracy: "
if [[ ! -e $tmp/first.svg ]]; then ok; else bad "plot -o A -o B wrote A"; fi
# -o naming the metrics file it reads is refused (the SVG would replace it).
cp "$run10/metrics.jsonl" "$tmp/metrics_before"
expect_exit 1 "is the metrics file it reads" plot "$run10" -o "$run10/metrics.jsonl"
check "plot -o metrics.jsonl left it alone" cmp -s "$tmp/metrics_before" "$run10/metrics.jsonl"
# 64 panels are the most, and fit; the loss comes first wherever it is in
# the file; a step beyond 2^53 is no step (skipped, with the warning).
"$py" -c 'import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(64): f.write(json.dumps({"step": 1, "mode": "train", "metric": f"metrics/m{i}", "value": 1.0}) + "\n")
with open(sys.argv[2], "w") as f:
    for m in ("metrics/accuracy", "metrics/loss"): f.write(json.dumps({"step": 1, "mode": "eval", "metric": m, "value": 0.5}) + "\n")
    f.write(json.dumps({"step": 1e19, "mode": "eval", "metric": "metrics/loss", "value": 0.25}) + "\n")' \
    "$tmp/p64.jsonl" "$tmp/order.jsonl"
expect_exit 0 "" plot "$tmp/p64.jsonl" -o "$tmp/p64.svg"
has "$tmp/out" "^wrote .*: 64 panel"
expect_exit 0 "skipped 1 line\(s\) .*\(the first: line 3: not a metrics line\)" plot "$tmp/order.jsonl" -o "$tmp/order.svg"
if [[ $(sed -n 2p "$tmp/out") == "  metrics/loss: eval 1 point(s), steps 1 to 1" ]]; then ok; else
    bad "plot: the loss is not the first panel, or has more points: $(cat "$tmp/out")"
fi
# A panel's series are separated by '; ', with nothing after the last.
printf '%s\n' '{"step": 1, "mode": "train", "metric": "metrics/loss", "value": 1.0}' \
    '{"step": 2, "mode": "train", "metric": "metrics/loss", "value": 0.5}' \
    '{"step": 2, "mode": "eval", "metric": "metrics/loss", "value": 0.75}' >"$tmp/two.jsonl"
expect_exit 0 "" plot "$tmp/two.jsonl" -o "$tmp/two.svg"
want="  metrics/loss: train 2 point(s), steps 1 to 2; eval 1 point(s), steps 2 to 2"
if [[ $(sed -n 2p "$tmp/out") == "$want" ]]; then ok; else bad "plot: a panel of two series: $(cat "$tmp/out")"; fi
# A hostile metrics.jsonl's escape sequences (in a metric's name and a
# mode) never reach the terminal: the summary on stdout and the list of
# names on stderr show each control character as '?', as info does.
"$py" -c 'import json, sys
print(json.dumps({"step": 1, "mode": "tr\x1b[2Jain", "metric": "metrics/\x1b]0;t\x07l\u009b1m", "value": 1.0}))' \
    >"$tmp/esc.jsonl"
expect_exit 0 "" plot "$tmp/esc.jsonl" -o "$tmp/esc.svg"
cat "$tmp/out" "$tmp/err" >"$tmp/esc_all"
expect_exit 1 "has no metric 'nope'" plot "$tmp/esc.jsonl" -o "$tmp/esc.svg" --metrics nope
cat "$tmp/out" "$tmp/err" >>"$tmp/esc_all"
if ! LC_ALL=C grep -q $'[\x01-\x08\x0b-\x1f\x7f]\|\xc2[\x80-\x9f]' "$tmp/esc_all"; then ok; else
    bad "plot wrote control characters: $(od -c "$tmp/esc_all" | head -5)"
fi
has "$tmp/esc_all" '^  metrics/\?\]0;t\?l\?\?1m: tr\?\[2Jain 1 point\(s\), steps 1 to 1$'
has "$tmp/esc_all" "it has: metrics/\?\]0;t\?l\?\?1m$"
# 40 modes of one metric: a curve for each (32 were drawn, the summary
# listing all 40).
"$py" -c 'import json, sys
for i in range(40): print(json.dumps({"step": i, "mode": f"m{i}", "metric": "metrics/loss", "value": 1.0 + i}))' \
    >"$tmp/modes.jsonl"
expect_exit 0 "" plot "$tmp/modes.jsonl" -o "$tmp/modes.svg"
check "plot of 40 modes" "$py" "$src/tests/check_svg.py" "$tmp/modes.svg" "$tmp/modes.jsonl" metrics/loss
# The SVG of esc.jsonl is XML (no control characters, no bytes that are
# not UTF-8: each a '?').
printf '{"step": 1, "mode": "train", "metric": "metrics/a\xff\xc3b\x01c\x7f", "value": 1}\n' >"$tmp/inv.jsonl"
for f in esc inv; do
    expect_exit 0 "" plot "$tmp/$f.jsonl" -o "$tmp/$f.svg"
    check "$f.svg is XML" "$py" -c 'import sys, xml.etree.ElementTree as E; E.parse(sys.argv[1])' "$tmp/$f.svg"
done
has "$tmp/inv.svg" 'class="panel-title"[^>]*>metrics/a\?\?b\?c\?</text>'
# Values at the ends of a double: every point and tick on the page.
"$py" -c 'import json
for s, v in ((1, -1.7e308), (2, 0.0), (3, 1.7e308)): print(json.dumps({"step": s, "mode": "train", "metric": "metrics/loss", "value": v}))' \
    >"$tmp/extreme.jsonl"
expect_exit 0 "" plot "$tmp/extreme.jsonl" -o "$tmp/extreme.svg"
check "plot of +-1.7e308" "$py" "$src/tests/check_svg.py" "$tmp/extreme.svg" "$tmp/extreme.jsonl" metrics/loss
# Ticks from -0.3 by 0.1 reach 5.55e-17, not 0, in doubles: labelled "0.0".
"$py" -c 'import json
for s, v in ((1, -0.3), (2, 0.0), (3, 0.3)): print(json.dumps({"step": s, "mode": "train", "metric": "metrics/loss", "value": v}))' \
    >"$tmp/zero.jsonl"
expect_exit 0 "" plot "$tmp/zero.jsonl" -o "$tmp/zero.svg"
check "plot of -0.3..0.3" "$py" "$src/tests/check_svg.py" "$tmp/zero.svg" "$tmp/zero.jsonl" metrics/loss
# 1,024 series are the most, and one metric may have all of them as modes;
# a line of one character is a line skipped, not a blank one.
"$py" -c 'import json, sys
for n in (1024, 1025):
    with open(f"{sys.argv[1]}/s{n}.jsonl", "w") as f:
        for i in range(n): f.write(json.dumps({"step": i, "mode": f"m{i}", "metric": "metrics/loss", "value": i}) + "\n")
        f.write("x\n")' "$tmp"
expect_exit 1 "more than 1024 \(metric, mode\) series" plot "$tmp/s1025.jsonl" -o "$tmp/s1025.svg"
expect_exit 0 "skipped 1 line\(s\) .*\(the first: line 1025: " plot "$tmp/s1024.jsonl" -o "$tmp/s1024.svg"
check "plot of 1024 modes" "$py" "$src/tests/check_svg.py" "$tmp/s1024.svg" "$tmp/s1024.jsonl" metrics/loss
has "$tmp/s1024.svg" '>\+[0-9]+ more</text>'
# A mode named with 200 characters and a long metric name: the legend stays
# inside the panel (check_svg), the name cut with "...".
"$py" -c 'import json
for s in (1, 2): print(json.dumps({"step": s, "mode": "m" * 200, "metric": "metrics/" + "x" * 40, "value": s}))' \
    >"$tmp/long_mode.jsonl"
expect_exit 0 "" plot "$tmp/long_mode.jsonl" -o "$tmp/long_mode.svg"
check "plot of a 200-character mode" "$py" "$src/tests/check_svg.py" "$tmp/long_mode.svg" "$tmp/long_mode.jsonl" \
    "metrics/$(printf 'x%.0s' {1..40})"
# A long run: 200,000 lines (a train curve of 180,000 steps with a spike,
# a dip, a run of NaNs and a spike written again without it, an eval curve
# of 18,000) are read a line at a time and drawn through at most 4 points a
# pixel column: the SVG stays small, and check_svg finds the curve's ends
# and extremes where the scale puts them (every point drawn: 2.4 MB).
"$py" - "$tmp/long.jsonl" <<'EOF'
import json, math, sys
with open(sys.argv[1], "w") as f:
    w = lambda s, mode, v: f.write(json.dumps({"step": s, "mode": mode, "metric": "metrics/loss", "value": v}) + "\n")
    for s in range(180000):
        v = 3 * math.exp(-s / 40000) + 0.5 + 0.05 * ((s * 7919) % 101) / 101
        v = {123457: 9.5, 170001: -1.0, 60001: 12.0}.get(s, v)
        w(s, "train", None if 50000 <= s < 50100 or s == 90000 else v)
        if s % 10 == 0:
            w(s, "eval", v + 0.1 if s != 123450 else 8.0)
    w(60001, "train", 2.0)  # the spike of 12 written again: gone
EOF
expect_exit 0 "" plot "$tmp/long.jsonl" -o "$tmp/long.svg"
has "$tmp/out" "metrics/loss: train 180000 point\(s\), steps 0 to 179999; eval 18000 point\(s\), steps 0 to 179990$"
check "plot of 200,000 lines" "$py" "$src/tests/check_svg.py" "$tmp/long.svg" "$tmp/long.jsonl" metrics/loss
size=$(stat -c %s "$tmp/long.svg")
if ((size < 60000)); then ok; else bad "the SVG of 200,000 lines is $size bytes, more than 60,000"; fi
echo "plot: 200,000 lines drawn in $size bytes"
expect_exit 2 "-o expects a file name" plot "$run10" -o ""
expect_exit 2 "-o needs a value" plot "$run10" -o
expect_exit 2 "unknown option '--bogus'" plot "$run10" --bogus

# ---- sample ------------------------------------------------------------------------
# Requested length, and the same text for the same seed.
expect_exit 0 "sampling 30 bytes" sample "$run10" --length 30 --seed 5
cp "$tmp/out" "$tmp/s5a"
expect_exit 0 "" sample "$run10" --length 30 --seed 5
cp "$tmp/out" "$tmp/s5b"
expect_exit 0 "" sample "$run10" --length 30 --seed 6
cp "$tmp/out" "$tmp/s6"
n=$(wc -c <"$tmp/s5a")
if [[ $n == 31 ]]; then ok; else bad "sample --length 30 wrote $n bytes, expected 31 (with the newline)"; fi
check "sample is deterministic for a seed" cmp -s "$tmp/s5a" "$tmp/s5b"
if ! cmp -s "$tmp/s5a" "$tmp/s6"; then ok; else bad "seeds 5 and 6 gave the same 30 bytes"; fi
# Greedy does not depend on the seed.
expect_exit 0 "temperature 0" sample "$run10" --length 20 --temperature 0 --seed 1
cp "$tmp/out" "$tmp/g1"
expect_exit 0 "" sample "$run10" --length 20 --temperature 0 --seed 2
check "greedy sampling ignores the seed" cmp -s "$tmp/g1" "$tmp/out"
# --top-k 1 and a temperature near 0 are greedy too (--raw: the bytes of a
# vocabulary of 10 are control characters, shown as '?'); --top-k 0 (all)
# and the largest K are accepted.
expect_exit 0 "" sample "$run10" --length 20 --temperature 0 --raw
cp "$tmp/out" "$tmp/g1raw"
expect_exit 0 "" sample "$run10" --length 20 --raw --seed 3
if ! cmp -s "$tmp/g1raw" "$tmp/out"; then ok; else bad "sampling at temperature 1 gave the greedy bytes"; fi
expect_exit 0 "top-k 1" sample "$run10" --length 20 --top-k 1 --seed 3 --raw
check "top-k 1 is greedy" cmp -s "$tmp/g1raw" "$tmp/out"
expect_exit 0 "temperature 1e-06" sample "$run10" --length 20 --temperature 1e-6 --seed 4 --raw
check "temperature 1e-6 is greedy" cmp -s "$tmp/g1raw" "$tmp/out"
expect_exit 0 "top-k 0" sample "$run10" --length 1 --top-k 0
expect_exit 0 "top-k 16777216" sample "$run10" --length 1 --top-k 16777216
# A byte model with a text prompt; --raw; top-k; a context that slides.
expect_exit 0 "top-k 5" sample "$run256" --prompt "Hello, world" --length 40 --seed 3 --top-k 5
n=$(wc -c <"$tmp/out")
if [[ $n == 53 ]]; then ok; else bad "prompt 12 + 40 + newline: $n bytes"; fi
has "$tmp/out" "^Hello, world"
expect_exit 0 "" sample "$run256" --prompt "Hello, world" --length 40 --seed 3 --top-k 5 --raw
n=$(wc -c <"$tmp/out")
if [[ $n == 52 ]]; then ok; else bad "--raw: $n bytes, expected 52"; fi
expect_exit 0 "context 4" sample "$run256" --prompt "abcdefgh" --length 25 --context 4 --top-k 1
n=$(wc -c <"$tmp/out")
if [[ $n == 34 ]]; then ok; else bad "--context 4: $n bytes, expected 34"; fi
# --context 1: each byte is predicted from the placeholder alone, so greedy
# gives, after any prompt, the byte an empty prompt's first is, over and
# over; a prompt and length of 2 bytes in all run a window of 1, not 2.
expect_exit 0 "" sample "$run256" --length 1 --temperature 0 --raw
first=$(od -An -tx1 "$tmp/out" | tr -d ' \n')
expect_exit 0 "context 1," sample "$run256" --prompt "h" --length 1 --context 1 --temperature 0 --raw
got=$(od -An -tx1 "$tmp/out" | tr -d ' \n')
if [[ $got == "68$first" ]]; then ok; else bad "--context 1, 2 bytes: $got, expected 68$first"; fi
expect_exit 0 "context 1," sample "$run256" --prompt "abc" --length 4 --context 1 --temperature 0 --raw
got=$(od -An -tx1 "$tmp/out" | tr -d ' \n')
if [[ $got == "616263$first$first$first$first" ]]; then ok; else bad "--context 1: $got, expected 616263 then $first x 4"; fi
# A prompt that reads like --threads is the prompt (the --threads of eval,
# sample and info --system was once taken out of argv before the command
# read it); --threads after it still applies.
expect_exit 0 "" sample "$run256" --prompt "--threads=1" --length 3 --seed 3 --raw --threads 1
n=$(wc -c <"$tmp/out")
if [[ $n == 14 && $(head -c 11 "$tmp/out") == --threads=1 ]]; then ok; else bad "--prompt --threads=1: $(cat "$tmp/out")"; fi
expect_exit 2 "--threads expects" sample "$run256" --prompt x --threads 0
expect_exit 2 "--threads expects" eval "$run256" --threads=0
expect_exit 0 "sampling 0 bytes" sample "$run256" --prompt "just this" --length 0
has "$tmp/out" "^just this$"
# Text output passes valid UTF-8 only (RFC 3629): an overlong E0 80 80 and
# a surrogate ED A0 80 are shown as '?' byte for byte; U+00E9 and U+10000 pass.
expect_exit 0 "" sample "$run256" --prompt "$(printf 'a\xe0\x80\x80b\xed\xa0\x80c\xc3\xa9\xf0\x90\x80\x80')" --length 0
if [[ $(od -An -tx1 "$tmp/out" | tr -d ' \n') == "613f3f3f623f3f3f63c3a9f09080800a" ]]; then ok; else
    bad "sample text of invalid UTF-8: $(od -An -tx1 "$tmp/out")"
fi
# The overlong leads C0 and C1, DEL, past U+10FFFF (F4 90 80 80, and F5 80
# 80 80): '?' byte for byte; U+10FFFF (F4 8F BF BF) passes.
# An overlong F0 80 80 80: '?' byte for byte; a tab and U+20AC (E2 82 AC) pass.
expect_exit 0 "" sample "$run256" --prompt "$(printf '\xc0\xaf\xc1\xbf\x7f\xf4\x90\x80\x80\xf5\x80\x80\x80\xf4\x8f\xbf\xbf\xf0\x80\x80\x80\t\xe2\x82\xac')" \
    --length 0
if [[ $(od -An -tx1 "$tmp/out" | tr -d ' \n') == "3f3f3f3f3f3f3f3f3f3f3f3f3ff48fbfbf3f3f3f3f09e282ac0a" ]]; then ok; else
    bad "sample text of invalid UTF-8 (2): $(od -An -tx1 "$tmp/out")"
fi
echo "sample: $(head -c 53 "$tmp/s5a" | od -An -c | head -1 | tr -s ' ')..."
# --prompt-file: any bytes, 0 included (the copy task's separator), which an
# argument cannot hold; --raw writes them back as they are.
printf '\x01\x00\x02' >"$tmp/prompt0"
expect_exit 0 "sampling 3 bytes" sample "$run10" --prompt-file "$tmp/prompt0" --length 3 --raw --seed 1
got=$(od -An -tx1 "$tmp/out" | tr -d ' \n')
if [[ ${got:0:6} == 010002 && ${#got} == 12 ]]; then ok; else bad "sample --prompt-file wrote $got"; fi
expect_exit 2 "--prompt and --prompt-file are two prompts" sample "$run10" --prompt-file "$tmp/prompt0" --prompt x
expect_exit 1 "--prompt-file: .*/nowhere: cannot open" sample "$run10" --prompt-file "$tmp/nowhere"
expect_exit 1 "--prompt-file: /dev/zero: not a regular file" sample "$run10" --prompt-file /dev/zero
truncate -s 17M "$tmp/prompt_big"
expect_exit 1 "--prompt-file: .*prompt_big" sample "$run10" --prompt-file "$tmp/prompt_big"
echo "sample --prompt-file of 17 MiB: $(cat "$tmp/err")"
# Errors and bad usage.
expect_exit 1 "prompt byte 0 \(0x68\) is not in the model's vocabulary of 10" sample "$run10" --prompt hi
# The first byte past the vocabulary (10, a newline).
expect_exit 1 "prompt byte 1 \(0x0a\) is not in the model's vocabulary of 10" sample "$run10" --prompt "$(printf '\001\n\002')"
expect_exit 1 "longer than the model's max_len 10" sample "$run10" --context 11
expect_exit 1 "no such directory" sample "$tmp/nowhere"
expect_exit 2 "missing OUTPUT_DIR" sample
expect_exit 2 "the directory argument is empty \\(''\\)" sample ""
expect_exit 2 "--length expects an integer" sample "$run10" --length -1
expect_exit 2 "--temperature expects a number" sample "$run10" --temperature warm
expect_exit 2 "--temperature expects a number in \[0, 1e\+06\], got '1e400'" sample "$run10" --temperature 1e400
expect_exit 2 "--temperature expects a number" sample "$run10" --temperature nan
expect_exit 2 "--temperature expects a number in \[0, 1e\+06\], got ' 1'" sample "$run10" --temperature ' 1'
expect_exit 2 "--length expects an integer in \[0, 16777216\], got '\+4'" sample "$run10" --length +4
# A subnormal is in [0, 1e6] (strtod's ERANGE once refused it, saying so).
expect_exit 0 "temperature 9.99989e-321" sample "$run10" --length 3 --temperature 1e-320
# A number may start with its point, as strtod reads it: .5 is 0.5.
expect_exit 0 "temperature 0.5," sample "$run10" --length 3 --temperature .5
expect_exit 2 "--top-k expects an integer" sample "$run10" --top-k 1.5
expect_exit 2 "--top-k expects an integer in \[0, 16777216\], got '-1'" sample "$run10" --top-k -1
expect_exit 2 "--seed expects an integer in \[0, 9223372036854775807\], got '-1'" sample "$run10" --seed -1
expect_exit 2 "--context expects an integer in \[1, 16777216\], got '0'" sample "$run10" --context 0
# A vocabulary past the 256 byte values is refused before any weight is read.
edit_checkpoint "$run256/model_4" "$tmp/v257_run/model_4" config.gin 'data + b"TransformerLM.vocab_size = 257\n"'
expect_exit 1 "TransformerLM has a vocabulary of 257 tokens; byte-level text needs at most 256" sample "$tmp/v257_run"
expect_exit 2 "--seed needs a value" sample "$run10" --seed
expect_exit 2 "unknown option '--bogus'" sample "$run10" --bogus

# ---- eval ----------------------------------------------------------------------------
expect_exit 2 "missing OUTPUT_DIR" eval
expect_exit 2 "the directory argument is empty \\(''\\)" eval ""
expect_exit 2 "--steps expects an integer" eval "$run10" --steps 0
expect_exit 2 "unknown option '--bogus'" eval "$run10" --bogus
expect_exit 1 "no such directory" eval "$tmp/nowhere"
# eval of the newest checkpoint prints what the Loop's own eval printed at
# that step (the Loop evaluated only there, from the start of the same eval
# stream), to every digit; a second eval prints the same again.
expect_exit 0 "" eval "$run10"
cp "$tmp/out" "$tmp/eval10"
cat "$tmp/eval10"
for metric in loss accuracy sequence_accuracy; do
    want=$(sed -n "s/^loop eval: .*\b$metric  *\(-\?[0-9.]*\).*/\1/p" "$tmp/run10.log")
    got=$(sed -n "s/^Step .*: eval  *$metric | *\(-\?[0-9.]*\)$/\1/p" "$tmp/eval10")
    if [[ -n $want && $want == "$got" ]]; then ok; else bad "eval $metric: '$got', the Loop's: '$want'"; fi
done
expect_exit 0 "" eval "$run10"
if cmp -s "$tmp/out" "$tmp/eval10"; then ok; else bad "eval is not deterministic"; fi
# --steps N: N eval batches, not the config's 2 (train.eval_steps).
expect_exit 0 "\(step 6\) on 1 batch\(es\) of " eval "$run10" --steps 1
if ! cmp -s "$tmp/out" "$tmp/eval10"; then ok; else bad "eval --steps 1 printed the 2 batches' numbers"; fi
expect_exit 0 "\(step 6\) on 3 batch\(es\) of " eval "$run10" --steps 3
# An earlier checkpoint has other weights: other numbers.
expect_exit 0 "" eval "$run10" --name model_2
if ! cmp -s "$tmp/out" "$tmp/eval10"; then ok; else bad "eval of model_2 printed model_6's numbers"; fi
# A config's train.eval_steps beyond an int is refused, naming it (2^31
# once became 1 batch while the log said 2147483648).
edit_checkpoint "$run10/model_6" "$tmp/steps_run/model_6" config.gin 'data + b"train.eval_steps = 2147483648\n"'
expect_exit 1 "config.gin:[0-9]+:1: train.eval_steps must be <= 2147483647, got 2147483648" \
    eval "$tmp/steps_run/model_6"
# A run trained without evals (train.eval_steps = 0) is evaluated on one
# batch, as --steps 1, not on none (an average over no batch).
edit_checkpoint "$run10/model_6" "$tmp/noeval_run/model_6" config.gin 'data + b"train.eval_steps = 0\n"'
expect_exit 0 "\(step 6\) on 1 batch\(es\) of " eval "$tmp/noeval_run/model_6"
cp "$tmp/out" "$tmp/eval_noeval"
expect_exit 0 "" eval "$run10" --steps 1
if cmp -s "$tmp/out" "$tmp/eval_noeval"; then ok; else
    bad "eval with train.eval_steps = 0: $(cat "$tmp/eval_noeval"), with --steps 1: $(cat "$tmp/out")"
fi
# A config.gin with a NUL byte (bindings after it would be silently lost:
# "binds no train.model", and info showed the text cut short with exit 0):
# each command refuses it, naming the file and where the NUL is.
edit_checkpoint "$run10/model_6" "$tmp/nul_run/model_6" config.gin 'data[:20] + b"\0" + data[20:]'
for cmd in info eval sample; do
    expect_exit 1 "^ctrax $cmd: $tmp/nul_run/model_6/config.gin: a NUL byte at offset 20: not a config's text$" \
        "$cmd" "$tmp/nul_run/model_6"
done
# A config that binds no train.model, in a directory whose name has an
# escape sequence: the error names it escaped (it was printed raw).
edit_checkpoint "$run10/model_6" "$tmp/esc"$'\e[31m'"_run/model_6" config.gin \
    'b"".join(l for l in data.splitlines(True) if not l.startswith(b"train.model"))'
for cmd in eval sample; do
    expect_exit 1 "^ctrax $cmd: the config of $tmp/esc\\?\\[31m_run/model_6 binds no train.model$" \
        "$cmd" "$tmp/esc"$'\e[31m'"_run/model_6"
done
# Each line: the checkpoint's step, the names right-aligned to the longest
# ('|' in one column), each metric once however many of train.metrics
# report under its name.
has "$tmp/eval10" "^Step +6: eval +loss \| "
n=$(awk -F'|' '{print length($1)}' "$tmp/eval10" | sort -u | wc -l)
if [[ $n == 1 && $(wc -l <"$tmp/eval10") == 3 ]]; then ok; else bad "eval's columns: $(cat "$tmp/eval10")"; fi
edit_checkpoint "$run10/model_6" "$tmp/twice_run/model_6" config.gin \
    'data + b"train.metrics = [@WeightedCategoryAccuracy, @CategoryAccuracy, @SequenceAccuracy]\n"'
expect_exit 0 "" eval "$tmp/twice_run/model_6"
n=$(grep -c " accuracy |" "$tmp/out")
if [[ $n == 1 ]]; then ok; else bad "eval printed accuracy $n times: $(cat "$tmp/out")"; fi

# ---- stdout on a full disk --------------------------------------------------------
# Each command exits 1 saying so: a lost result must not look done (plot's
# SVG and sample --raw's bytes failed inside fputs and the per-byte
# flushes, leaving the last fflush nothing to fail on; info never checked).
if [[ -c /dev/full ]]; then
    # plot -o FILE: the SVG is written, the summary on stdout is lost. --help:
    # the usage is the output.
    for args in "info $run10" "eval $run10" "plot $run10 -o -" "sample $run10 --length 30 --raw" \
        "sample $run256 --prompt-file $tmp/prompt0 --length 0 --raw" "plot $run10 -o $tmp/full.svg" \
        "info --help" "info --system --help" "plot --help" "sample --help" "eval --help"; do
        # shellcheck disable=SC2086 # the words of args
        "$driver" $args >/dev/full 2>"$tmp/err"
        rc=$?
        if [[ $rc == 1 ]] && grep -q "writing to stdout failed" "$tmp/err"; then ok; else
            bad "'$args' >/dev/full exited $rc: $(cat "$tmp/err")"
        fi
    done
    # sample stops at the first failed write: 2^24 bytes would take minutes
    # (it once generated them all, then said the output was lost).
    timeout 60 "$driver" sample "$run10" --length 16777216 --raw >/dev/full 2>"$tmp/err"
    rc=$?
    if [[ $rc == 1 ]] && grep -q "writing to stdout failed" "$tmp/err"; then ok; else
        bad "sample --length 16777216 >/dev/full exited $rc: $(tail -1 "$tmp/err")"
    fi
    if [[ -n $ctrax ]]; then
        for args in "--help" "train --help"; do
            # shellcheck disable=SC2086 # the words of args
            "$ctrax" $args >/dev/full 2>"$tmp/err"
            rc=$?
            if [[ $rc == 1 ]] && grep -q "writing to stdout failed" "$tmp/err"; then ok; else
                bad "'ctrax $args' >/dev/full exited $rc: $(cat "$tmp/err")"
            fi
        done
    fi
fi

echo "test_cli_tools: $passed passed, $failed failed"
((failed == 0))
