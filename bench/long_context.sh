#!/bin/bash
# bench/long_context (issue 12): ctrax's memory-efficient trainer on Trax's
# reformer test model at T = 4K, 16K, 64K next to PyTorch with full attention
# and torch.utils.checkpoint; one table at the end (torch_long_context.py
# --table) with issue 12's acceptance verdict.
#
#   bash bench/long_context.sh [--seqs 4096,16384,65536] [--repeats 2]
#       [--steps 3] [--torch-steps 2] [--torch-repeats N] [--budget-gib 12]
#       [--loss-chunk N] [--build build] [--no-torch] [--out FILE]
#
# Builds build/bench_long_context if needed (Release). Each (side, T) runs in
# its own process, so each peak RSS is its own; the sides alternate T by T
# (ctrax T, torch T, ctrax next T, ...) and the whole list repeats, so both
# see the same load on a shared machine. PyTorch runs a T only if its
# predicted need fits --budget-gib (and 60% of MemAvailable); otherwise the
# table shows the prediction. The JSON lines of every run go to --out
# (default: a file under /tmp), the per-step lines to stderr. --torch-repeats
# (default: --repeats) runs PyTorch only in the first N repeats: its 16K step
# takes minutes. --loss-chunk N runs the ctrax side a second time per T with
# loss_chunk_size N (its own rows in the table, 'ctrax lcN').
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
SEQS=4096,16384,65536
REPEATS=2
STEPS=3
TORCH_STEPS=2
TORCH_REPEATS=
BUDGET=12
BUILD=build
TORCH=1
LOSS_CHUNK=0
OUT=
while [ $# -gt 0 ]; do
    case "$1" in
        --seqs) SEQS=$2; shift 2 ;;
        --repeats) REPEATS=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --torch-steps) TORCH_STEPS=$2; shift 2 ;;
        --torch-repeats) TORCH_REPEATS=$2; shift 2 ;;
        --budget-gib) BUDGET=$2; shift 2 ;;
        --build) BUILD=$2; shift 2 ;;
        --no-torch) TORCH=0; shift ;;
        --loss-chunk) LOSS_CHUNK=$2; shift 2 ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '/^set /q; 2,$p' "$0"; exit 0 ;;
        *) echo "long_context.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
done
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BIN="$BUILD/bench_long_context"
TORCH_REPEATS=${TORCH_REPEATS:-$REPEATS}
OUT=${OUT:-$(mktemp /tmp/long_context.XXXXXX.jsonl)}
: > "$OUT"

if [ ! -x "$BIN" ] || [ "$ROOT/bench/long_context.c" -nt "$BIN" ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release > /dev/null
    cmake --build "$BUILD" -j2 --target bench_long_context
fi

# Passive OpenMP waiting keeps CPU time a measure of work on a shared machine.
export OMP_NUM_THREADS=2 OMP_WAIT_POLICY=passive
started=$(date +%s)
for rep in $(seq 1 "$REPEATS"); do
    for T in ${SEQS//,/ }; do
        echo "== repeat $rep, T $T: ctrax" >&2
        # The binary exits 1 when a T fails; the error is in its JSON line.
        "$BIN" --seqs "$T" --steps "$STEPS" --json | grep '^{' >> "$OUT" || true
        if [ "$LOSS_CHUNK" != 0 ]; then
            echo "== repeat $rep, T $T: ctrax, loss_chunk_size $LOSS_CHUNK" >&2
            "$BIN" --seqs "$T" --steps "$STEPS" --loss-chunk "$LOSS_CHUNK" --json | grep '^{' >> "$OUT" || true
        fi
        if [ "$TORCH" = 1 ] && [ "$rep" -le "$TORCH_REPEATS" ]; then
            echo "== repeat $rep, T $T: torch" >&2
            /usr/bin/python3 "$ROOT/bench/torch_long_context.py" --seq "$T" --steps "$TORCH_STEPS" \
                --threads 2 --budget-gib "$BUDGET" | grep '^{' >> "$OUT" || true
        fi
    done
done
echo "($(( $(date +%s) - started )) s in all; JSON lines in $OUT)"
/usr/bin/python3 "$ROOT/bench/torch_long_context.py" --table "$OUT"
