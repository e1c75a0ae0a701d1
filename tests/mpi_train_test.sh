#!/usr/bin/env bash
# Data-parallel training through the ctrax program with the memory-efficient
# trainer: one process, one process with 2 local devices, `mpirun -np 2`,
# and `mpirun -np 2` with 2 devices each (stopped at step 10 and resumed),
# and `mpirun -np 2` with half the batch bound per process on the inputs,
# end with the same weights (within 1e-7 relative); only rank 0 writes.
# The stopped and resumed `mpirun -np 2` on 2 devices each ends bit for bit
# as the same job run straight: weights, slots and metrics.jsonl.
# With train.random_seed unbound (None) `mpirun -np 2` draws one seed, the
# chief's (the one "random seed: N" line), and one process given N ends
# with the same weights (a rank on a seed of its own would train on other
# data from other initial weights).
#   mpi_train_test.sh CTRAX CONFIG MPIRUN [MPIRUN ARGS...]
set -uo pipefail
ctrax=$1
config=$2
shift 2
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
export OMP_NUM_THREADS=1
fail() { echo "FAIL: $*"; echo "mpi_train_test: 0 passed, 1 failed"; exit 1; }
run() {  # NAME COMMAND...: runs it, its output in NAME.log
    local name=$1
    shift
    "$@" >"$work/$name.log" 2>&1 || { cat "$work/$name.log"; fail "$name exited $?"; }
    grep -E "^Step +20:|trainer," "$work/$name.log" | head -4 | sed "s/^/  $name: /"
}
# Which trainer, on how many devices and processes, the program says it ran.
says() { grep -q "memory-efficient trainer, $2" "$work/$1.log" || fail "$1 did not run the memory-efficient trainer on $2"; }
run one "$ctrax" train "$config" --output-dir "$work/one"
run local2 "$ctrax" train "$config" --output-dir "$work/local2" --devices 2
run mpi2 "$@" -np 2 "$ctrax" train "$config" --output-dir "$work/mpi2"
run mpi2x2_half "$@" -np 2 "$ctrax" train "$config" --output-dir "$work/mpi2x2" --devices 2 --steps 10
run mpi2x2 "$@" -np 2 "$ctrax" train "$config" --output-dir "$work/mpi2x2" --devices 2
says one "1 device(s) x 1 process(es)"
says local2 "2 device(s) x 1 process(es)"
says mpi2 "1 device(s) x 2 process(es)"
says mpi2x2 "2 device(s) x 2 process(es)"
grep -q "resuming from $work/mpi2x2/model_10 at step 10$" "$work/mpi2x2.log" ||
    fail "the second mpi2x2 run did not resume from model_10: $(head -5 "$work/mpi2x2.log")"
# The same job straight: a resume under mpirun is exact, not merely close
# (the 1e-7 below is about summation orders across process counts).
run mpi2x2_straight "$@" -np 2 "$ctrax" train "$config" --output-dir "$work/mpi2x2_straight" --devices 2
for f in weights.safetensors slots.safetensors; do
    cmp -s "$work/mpi2x2_straight/model_20/$f" "$work/mpi2x2/model_20/$f" ||
        fail "mpi2x2 stopped at 10 and resumed: model_20/$f differs from the straight job's"
done
cmp -s <(grep -v 'steps per second' "$work/mpi2x2_straight/metrics.jsonl") \
    <(grep -v 'steps per second' "$work/mpi2x2/metrics.jsonl") ||
    fail "mpi2x2 stopped at 10 and resumed: metrics.jsonl differs from the straight job's"
echo "  mpi2x2 stopped at 10 and resumed: model_20 weights, slots and metrics.jsonl equal the straight job's"
run mpi2_drawn "$@" -np 2 "$ctrax" train "$config" --set 'train.random_seed=None' --output-dir "$work/mpi2_drawn"
says mpi2_drawn "1 device(s) x 2 process(es)"
seeds=$(grep -c '^random seed: ' "$work/mpi2_drawn.log")
seed=$(sed -n 's/^random seed: \([0-9]*\) (train.random_seed is None: drawn from the system)$/\1/p' \
    "$work/mpi2_drawn.log")
[[ $seeds == 1 && -n $seed ]] || fail "mpi2_drawn: $seeds 'random seed:' lines, not one drawn seed: $(grep 'random seed' "$work/mpi2_drawn.log")"
grep -q "^train.random_seed = $seed\$" "$work/mpi2_drawn/config.gin" ||
    fail "mpi2_drawn: config.gin records $(grep random_seed "$work/mpi2_drawn/config.gin"), the log seed $seed"
echo "  mpi2_drawn: one seed drawn, $seed"
run one_drawn "$ctrax" train "$config" --set "train.random_seed=$seed" --output-dir "$work/one_drawn"
# A batch size bound on the inputs is per process, as Trax's is per host:
# sequence_copy_inputs.batch_size = 4 on 2 processes trains on batches of 8
# (the same weights as one process with train.batch_size = 8), and the
# operative config records both.
sed 's/^train\.batch_size = 8$/sequence_copy_inputs.batch_size = 4/' "$config" >"$work/per_host.gin"
grep -q "^sequence_copy_inputs.batch_size = 4$" "$work/per_host.gin" || fail "per_host.gin: no per-host batch size"
run mpi2_per_host "$@" -np 2 "$ctrax" train "$work/per_host.gin" --output-dir "$work/mpi2_per_host"
grep -q "data: batch(8, " "$work/mpi2_per_host.log" || fail "mpi2_per_host: $(grep 'data:' "$work/mpi2_per_host.log")"
grep -qx "train.batch_size = 8" "$work/mpi2_per_host/config.gin" &&
    grep -qx "train.n_processes = 2" "$work/mpi2_per_host/config.gin" ||
    fail "mpi2_per_host/config.gin: $(grep -E 'batch_size|n_processes' "$work/mpi2_per_host/config.gin")"

# SIGTERM to mpirun (which passes it to every process): each says it heard
# it, they agree on the step to stop after, and the job ends with that
# step's checkpoint, from which it resumes. (mpirun itself exits 1 after a
# SIGTERM even when every process exits 0, so its status says nothing here.)
"$@" -np 2 "$ctrax" train "$config" --output-dir "$work/stop" --steps 100000000 >"$work/stop.log" 2>&1 &
job=$!
for _ in $(seq 600); do [[ -d $work/stop/model_10 ]] && break; sleep 0.1; done
kill -TERM "$job"
wait "$job"
rc=$?
stopped=$(sed -n 's/^stopped at step \([0-9]*\); checkpoint written.*/\1/p' "$work/stop.log")
[[ -n $stopped && -d $work/stop/model_$stopped ]] &&
    grep -q "ctrax (process 0 of 2): stopping after this step" "$work/stop.log" &&
    grep -q "ctrax (process 1 of 2): stopping after this step" "$work/stop.log" ||
    fail "SIGTERM to mpirun: exit $rc, stopped at '$stopped': $(tail -n 4 "$work/stop.log")"
run stop_resumed "$@" -np 2 "$ctrax" train "$config" --output-dir "$work/stop" --steps $((stopped + 2))
grep -q "^done: step $((stopped + 2))" "$work/stop_resumed.log" || fail "stop_resumed: $(tail -n 2 "$work/stop_resumed.log")"
echo "  SIGTERM to mpirun: stopped at step $stopped with its checkpoint; resumed to $((stopped + 2))"

# A process on another config (another model: gradient buckets of other
# sizes, a heap corruption in MPI; another batch or seed: other rows or
# other initial weights, silently) is refused at once, by name.
"$@" -np 1 "$ctrax" train "$config" --output-dir "$work/mismatch" --steps 2 : \
    -np 1 "$ctrax" train "$config" --output-dir "$work/mismatch" --steps 2 --set 'train.batch_size=4' >"$work/mismatch.log" 2>&1 && fail "mismatched configs ran"
grep -q "process 1 builds another trainer than process 0 (rows per device: 2 here, 4 on process 0)" "$work/mismatch.log" ||
    fail "mismatched configs: $(grep -v '^\[' "$work/mismatch.log" | tail -n 4)"
echo "  a process with another batch size: refused"

# Each REF:RUN pair: RUN's final weights against REF's.
/usr/bin/python3 - "$work" one:local2 one:mpi2 one:mpi2x2 one_drawn:mpi2_drawn one:mpi2_per_host <<'PY' || fail "weights differ"
import json, struct, sys
import numpy as np

def weights(run):
    with open(f"{sys.argv[1]}/{run}/model_20/weights.safetensors", "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    header.pop("__metadata__", None)
    data = raw[8 + n:]
    return {k: np.frombuffer(data[v["data_offsets"][0]:v["data_offsets"][1]], "<f4") for k, v in header.items()}

ok = True
for pair in sys.argv[2:]:
    base, run = pair.split(":")
    ref = weights(base)
    flat = np.concatenate([ref[k] for k in sorted(ref)])
    w = weights(run)
    if sorted(w) != sorted(ref):
        print(f"{run}: other tensor names than {base}"); ok = False; continue
    d = np.concatenate([w[k] - ref[k] for k in sorted(ref)])
    rel = float(np.linalg.norm(d.astype(np.float64)) / np.linalg.norm(flat.astype(np.float64)))
    print(f"  {run}: relative weight difference to {base} (one process, one device): {rel:.3g}")
    # Same arithmetic but for summation order: about 1e-8. (A gradient off
    # by the device count, under Adam, moves the weights by a few 1e-6.)
    ok &= rel <= 1e-7
sys.exit(0 if ok else 1)
PY
# Only rank 0 writes: one metrics line per eval, not one per rank.
evals=$(grep -c '"eval' "$work/mpi2/metrics.jsonl" || true)
evals_one=$(grep -c '"eval' "$work/one/metrics.jsonl" || true)
# At least one: two runs that wrote no eval line at all (none of rank 0's
# either) are equal too.
[[ $evals_one =~ ^[0-9]+$ ]] && ((evals_one > 0)) ||
    fail "metrics.jsonl of one process has '$evals_one' eval lines (train.eval_frequency = 10 over 20 steps: some)"
[[ $evals == "$evals_one" ]] || fail "metrics.jsonl has $evals eval lines under mpirun, $evals_one in one process"
echo "mpi_train_test: 1 passed, 0 failed"
