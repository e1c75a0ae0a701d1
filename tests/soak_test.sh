#!/usr/bin/env bash
# The short soak (issue 10): scripts/soak.sh with 5 random SIGKILLs over a
# 200-step run of tests/configs/soak.gin, then weights, slots, state.json,
# metrics.jsonl and the TensorBoard scalars compared with an uninterrupted run.
# The delays are random (seed from the clock, printed: SOAK_SEED repeats them).
# Then a control that the comparisons can fail: a 20-step soak through a
# ctrax whose killed-and-resumed run trains at another learning rate must
# report all six comparisons as FAIL.
#   soak_test.sh CTRAX CONFIG
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
ctrax=$1
config=$2
seed=${SOAK_SEED:-$(($(date +%s%N) / 1000 % 1000000))}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
unset SOAK_WORK SOAK_KEEP SOAK_TIMING

CTRAX=$ctrax SOAK_CONFIG=$config SOAK_STEPS=200 bash "$root/scripts/soak.sh" 5 "$seed"
rc=$?
if ((rc != 0)); then echo "soak_test: 0 passed, 1 failed (SOAK_SEED=$seed)"; exit 1; fi

# The control: the second run (the soak's killed/ directory) gets another
# learning rate from its first start on, whether or not a kill lands.
cat >"$tmp/ctrax" <<EOF
#!/usr/bin/env bash
for arg in "\$@"; do
    if [[ \$arg == */killed ]]; then exec "$ctrax" "\$@" --set warmup.max_value=0.002; fi
done
exec "$ctrax" "\$@"
EOF
chmod +x "$tmp/ctrax"
CTRAX=$tmp/ctrax SOAK_CONFIG=$config SOAK_STEPS=20 bash "$root/scripts/soak.sh" 1 "$seed" >"$tmp/control.log" 2>&1
rc=$?
failed=$(grep -cE '^FAIL (model_20/(weights|slots)\.safetensors|model_20/state\.json|metrics\.jsonl|TensorBoard (train|eval)/):' \
    "$tmp/control.log")
if ((rc != 1 || failed != 6)); then
    cat "$tmp/control.log"
    echo "FAIL: the control (a resumed run at another learning rate) exited $rc with $failed of 6 comparisons failed"
    echo "soak_test: 0 passed, 1 failed (SOAK_SEED=$seed)"
    exit 1
fi
echo "control: a resumed run at another learning rate fails all 6 comparisons"
echo "soak_test: 1 passed, 0 failed"
