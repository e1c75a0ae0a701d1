#!/usr/bin/env bash
# Issue 6's benchmarks, in one run:
#   1. allreduce bandwidth: ctrax comm vs raw MPI_Allreduce, 1 MB to 256 MB
#   2. training throughput of the default LM: 1 process x 2 threads,
#      1 process x 2 local devices, mpirun -np 2 x 1 thread; with the
#      standard trainer (TransformerLM) and the memory-efficient one (ReformerLM)
# Usage: bash bench/run_dist.sh [BUILD_DIR] (default build/; run `make` first).
# Environment: STEPS, training steps per layout [200].
set -euo pipefail
case ${1:-} in
    -h | --help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "bench/run_dist.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
esac
build=${1:-build}
for b in bench_allreduce bench_dist_throughput; do
    if [[ ! -x $build/$b ]]; then
        echo "bench/run_dist.sh: $build/$b not found: build it first (make -C $build $b)" >&2
        exit 2
    fi
done
steps=${STEPS:-200}
mpirun=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader,tcp)

echo "== allreduce bandwidth (2 processes)"
OMP_NUM_THREADS=1 "${mpirun[@]}" -np 2 "$build/bench_allreduce"

echo
# Runs one layout, shows its line, and leaves its tokens/s in $rate.
measure() {
    local out
    out=$("$@")
    echo "$out"
    rate=$(sed -n 's/^tokens\/s \([0-9.]*\).*/\1/p' <<<"$out" | tail -n 1)
}
for trainer in standard memory-efficient; do
    echo
    echo "== training throughput, $trainer trainer, global batch 32, $steps steps"
    measure env OMP_NUM_THREADS=2 "$build/bench_dist_throughput" 1 "$steps" $trainer; threads=$rate
    measure env OMP_NUM_THREADS=2 "$build/bench_dist_throughput" 2 "$steps" $trainer; devices=$rate
    measure env OMP_NUM_THREADS=1 "${mpirun[@]}" -np 2 "$build/bench_dist_throughput" 1 "$steps" $trainer; mpi=$rate
    echo
    awk -v t="$threads" -v d="$devices" -v m="$mpi" -v tr="$trainer" 'BEGIN {
        printf "%-50s %12s %8s\n", "layout (" tr " trainer)", "tokens/s", "ratio"
        printf "%-50s %12.0f %8.3f\n", "1 process x 2 threads", t, 1
        printf "%-50s %12.0f %8.3f\n", "1 process x 2 local devices", d, d / t
        printf "%-50s %12.0f %8.3f\n", "mpirun -np 2 x 1 thread", m, m / t
    }'
done
