#!/bin/bash
# bench/lm_speed (issue 13, item 4): the same TransformerLM trained in ctrax
# (build/bench_lm_speed, bench/lm_speed.c) and in PyTorch
# (bench/torch_lm_speed.py) -- same architecture, Adam, batch, dropout 0 --
# at each thread count, runs alternating, with the sgemm rate of the model's
# dense shapes measured in the same run; one table at the end per config:
# tokens/s (median and spread), model FLOPs per token, the sgemm rate, MFU,
# peak RSS, each side's best thread count, the ratio, and PASS/FAIL against
# issue 13's targets.
#
#   bash bench/lm_speed.sh [--configs A,B] [--repeats 2] [--threads 1,2]
#       [--steps N] [--build build] [--wait-policy own|passive|active]
#       [--busy-core] [--no-torch] [--out FILE]
#
# Configs (issue 13): A d_model 256, 4 layers, 4 heads, d_ff 1024, T 128,
# batch 16; B d_model 512, 6 layers, 8 heads, d_ff 2048, T 256, batch 8;
# C d_model 256, 2 layers, 4 heads, d_ff 1024, T 2048, batch 2. Vocabulary
# 256, dropout 0, a fixed batch of random bytes.
#
# Each run is its own process (its own peak RSS). Per repeat and config: the
# sgemm rate at each thread count (1 s each), then for each thread count
# ctrax and PyTorch back to back, the side that goes first swapping every
# repeat, so both see the same load on a shared machine. --steps (default:
# 20 for A, 8 for B and C) counts the warm-up step, which is not timed.
#
# The BLAS kernel and the threads, for both sides alike (the one mechanism):
#   OPENBLAS_CORETYPE  Debian's OpenBLAS 0.3.21 does not know newer CPUs and
#       falls back to a generic SSE3 kernel; the script exports the widest
#       kernel the CPU's features run (bench_lm_speed --vector-core, i.e.
#       ct_blas_vector_core(), the choice `ctrax` makes when it re-executes
#       itself) when the kernel OpenBLAS would run, by its own choice or an
#       OPENBLAS_CORETYPE already set, is narrower; else it leaves it.
#       PyTorch (python3-torch) does its float GEMMs in the same system
#       OpenBLAS (libblas.so.3 -> openblas-openmp), so it gets that kernel
#       too; each JSON line names the kernel that ran.
#   OMP_NUM_THREADS=N  ctrax's OpenMP loops and OpenBLAS (OpenMP build);
#       PyTorch also gets torch.set_num_threads(N).
#   How OpenMP's idle threads wait: by default each side as its users get
#       it (--wait-policy own): ctrax with the GOMP_SPINCOUNT `ctrax` sets
#       (bench_lm_speed --spincount, CT_OMP_SPINCOUNT: libgomp's spin, then
#       sleep), PyTorch with OpenMP's default (both variables unset).
#       CT_OMP_SPINCOUNT is libgomp's own default, so the two wait alike:
#       OMP_DISPLAY_ENV=verbose shows GOMP_SPINCOUNT = '300000' in both
#       processes. PyTorch runs many more, smaller parallel loops than
#       ctrax: with threads that sleep at once (OMP_WAIT_POLICY=passive) its
#       config B ran 20-30% slower, so forcing passive on both sides (what
#       this script did before) understated it. --wait-policy passive or
#       active sets that OMP_WAIT_POLICY for both sides instead.
# --busy-core keeps one core busy with a shell loop for the whole bench (the
# oversubscribed case of issue 13, item 2). The JSON lines of every run go
# to --out (default: a file under /tmp).
set -euo pipefail

ROOT=$(cd "$(dirname "$0")/.." && pwd)
CONFIGS=A,B
REPEATS=2
THREADS=1,2
STEPS=
BUILD=build
WAIT=own
BUSY=0
TORCH=1
OUT=
while [ $# -gt 0 ]; do
    case "$1" in
        --configs) CONFIGS=$2; shift 2 ;;
        --repeats) REPEATS=$2; shift 2 ;;
        --threads) THREADS=$2; shift 2 ;;
        --steps) STEPS=$2; shift 2 ;;
        --build) BUILD=$2; shift 2 ;;
        --wait-policy) WAIT=$2; shift 2 ;;
        --busy-core) BUSY=1; shift ;;
        --no-torch) TORCH=0; shift ;;
        --out) OUT=$2; shift 2 ;;
        -h|--help) sed -n '/^set /q; 2,$p' "$0"; exit 0 ;;
        *) echo "lm_speed.sh: unknown option '$1' (--help lists them)" >&2; exit 2 ;;
    esac
done
case "$BUILD" in /*) ;; *) BUILD="$ROOT/$BUILD" ;; esac
BIN="$BUILD/bench_lm_speed"
OUT=${OUT:-$(mktemp /tmp/lm_speed.XXXXXX.jsonl)}
: > "$OUT"

if [ ! -x "$BIN" ] || [ "$ROOT/bench/lm_speed.c" -nt "$BIN" ]; then
    cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=Release > /dev/null
    cmake --build "$BUILD" -j2 --target bench_lm_speed
fi

CORE=$("$BIN" --vector-core)
if [ -n "$CORE" ]; then export OPENBLAS_CORETYPE=$CORE; fi
unset OMP_WAIT_POLICY GOMP_SPINCOUNT
case "$WAIT" in
    own) CTRAX_WAIT=(GOMP_SPINCOUNT="$("$BIN" --spincount)"); TORCH_WAIT=() ;;
    passive|active) CTRAX_WAIT=(OMP_WAIT_POLICY=$WAIT); TORCH_WAIT=(OMP_WAIT_POLICY=$WAIT) ;;
    *) echo "lm_speed.sh: --wait-policy is own, passive or active, not '$WAIT'" >&2; exit 2 ;;
esac
echo "OpenBLAS kernel: ${OPENBLAS_CORETYPE:-as OpenBLAS chose}; idle threads: ctrax ${CTRAX_WAIT[*]:-(OpenMP's default)}," \
     "PyTorch ${TORCH_WAIT[*]:-(OpenMP's default)}; $(nproc) cores; load average $(cut -d' ' -f1-3 /proc/loadavg)" >&2

BUSY_PID=
if [ "$BUSY" = 1 ]; then
    bash -c 'while :; do :; done' &
    BUSY_PID=$!
    trap 'kill "$BUSY_PID" 2>/dev/null || true' EXIT
    echo "a busy loop (pid $BUSY_PID) keeps one core busy" >&2
fi

run_ctrax() {  # config threads steps
    echo "== ctrax, config $1, $2 thread(s)" >&2
    env "${CTRAX_WAIT[@]}" OMP_NUM_THREADS="$2" "$BIN" --config "$1" --steps "$3" | grep '^{' >> "$OUT" ||
        echo "   (failed)" >&2
}
run_torch() {
    [ "$TORCH" = 1 ] || return 0
    echo "== torch, config $1, $2 thread(s)" >&2
    env "${TORCH_WAIT[@]}" OMP_NUM_THREADS="$2" /usr/bin/python3 "$ROOT/bench/torch_lm_speed.py" --config "$1" \
        --threads "$2" --steps "$3" | grep '^{' >> "$OUT" || echo "   (failed)" >&2
}

started=$(date +%s)
for rep in $(seq 1 "$REPEATS"); do
    for cfg in ${CONFIGS//,/ }; do
        case "$cfg" in A) steps=${STEPS:-20} ;; B|C) steps=${STEPS:-8} ;;
            *) echo "lm_speed.sh: unknown config '$cfg' (A, B or C)" >&2; exit 2 ;; esac
        for n in ${THREADS//,/ }; do
            echo "== repeat $rep, config $cfg: sgemm, $n thread(s)" >&2
            env "${CTRAX_WAIT[@]}" OMP_NUM_THREADS="$n" "$BIN" --config "$cfg" --sgemm --seconds 1 >> "$OUT"
        done
        for n in ${THREADS//,/ }; do
            if [ $((rep % 2)) = 1 ]; then
                run_ctrax "$cfg" "$n" "$steps"; run_torch "$cfg" "$n" "$steps"
            else
                run_torch "$cfg" "$n" "$steps"; run_ctrax "$cfg" "$n" "$steps"
            fi
        done
    done
done
echo "($(( $(date +%s) - started )) s in all; load average now $(cut -d' ' -f1-3 /proc/loadavg);" \
     "JSON lines in $OUT)"
/usr/bin/python3 "$ROOT/bench/torch_lm_speed.py" --table "$OUT"
