#!/usr/bin/env bash
# A rank that dies or hangs ends the job with a clear message in under 60 s,
# in the blocking allreduce (the watchdog) and in the bucketed one (the
# wait's own deadline).
#   mpi_failure_test.sh MPI_FAILURE_BINARY MPIRUN [MPIRUN ARGS...]
set -uo pipefail
bin=$1
shift
fail=0
for mode in kill hang hang_buckets; do
    start=$(date +%s)
    # The outer timeout only guards the test itself against a real hang.
    out=$(timeout 120 "$@" -np 2 "$bin" "$mode" 10 2>&1)
    rc=$?
    elapsed=$(($(date +%s) - start))
    echo "== $mode: exit $rc after ${elapsed}s"
    echo "$out" | grep -v '^$' | head -20
    if ((rc == 0 || rc == 124)) || ((elapsed >= 60)); then
        echo "FAIL: $mode: the job must fail, and within 60 s (exit $rc, ${elapsed}s)"
        fail=1
    fi
    case $mode in
    kill) want='exited on signal 9' ;;
    hang) want='MPI allreduce on rank 0 of 2 did not finish within 10 s: another rank died or hangs' ;;
    hang_buckets) want='MPI allreduce (buckets) on rank 0 of 2 did not finish within 10 s: another rank died or hangs' ;;
    esac
    if ! grep -q "$want" <<<"$out"; then
        echo "FAIL: $mode: no message '$want'"
        fail=1
    fi
    # After a bucket wait gives up, its requests may still be in flight:
    # the comm refuses the next collective.
    after='after it: MPI comm on rank 0 of 2 is unusable after an earlier collective failed (MPI allreduce (buckets) on rank 0 of 2 did not finish within 10 s'
    if [[ $mode == hang_buckets ]] && ! grep -qF "$after" <<<"$out"; then
        echo "FAIL: $mode: no message '$after'"
        fail=1
    fi
done
if ((fail)); then echo "mpi_failure_test: 0 passed, 1 failed"; exit 1; fi
echo "mpi_failure_test: 1 passed, 0 failed"
