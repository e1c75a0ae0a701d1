#!/usr/bin/env bash
# The short soak (issue 10): scripts/soak.sh with 5 random SIGKILLs over a
# 100-step run of tests/configs/soak.gin, then weights, slots, state.json,
# metrics.jsonl and the TensorBoard scalars compared with an uninterrupted run.
# The delays are random (seed from the clock, printed: SOAK_SEED repeats them).
#   soak_test.sh CTRAX CONFIG
set -uo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
seed=${SOAK_SEED:-$(($(date +%s%N) / 1000 % 1000000))}
CTRAX=$1 SOAK_CONFIG=$2 SOAK_STEPS=100 bash "$root/scripts/soak.sh" 5 "$seed"
rc=$?
if ((rc != 0)); then echo "soak_test: 0 passed, 1 failed (SOAK_SEED=$seed)"; exit 1; fi
echo "soak_test: 1 passed, 0 failed"
