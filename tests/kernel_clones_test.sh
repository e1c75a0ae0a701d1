#!/usr/bin/env bash
# The kernels' "default" clones. Each vector kernel is compiled three times
# (target_clones: AVX-512F, AVX2 and the x86-64 baseline, SSE2) and the CPU
# picks one when the program starts, so on the machines that run the suite
# (all with AVX2) the baseline clones never run. Here the tests that compare
# the kernels with their references run again under qemu-user emulating a
# Nehalem (SSE4.2, no AVX), where they must pick the baseline clones, and
# OpenBLAS its generic kernel.
#
#   tests/kernel_clones_test.sh QEMU_X86_64 TEST...
#
# Each TEST is one of the suite's test programs; it must say that it ran the
# default clones (test_kernels prints which) and end with "0 failed". The
# AVX2 clones are not run here: qemu 7.2 emulates AVX2 and FMA, but about a
# hundred times slower again (test_kernels ran past 7 CPU-minutes).
# Ends with "kernel_clones_test: N passed, M failed".
set -uo pipefail
qemu=$1
shift
source "$(dirname "$0")/cli_common.sh" kernel_clones_test

if [[ ! -x $qemu ]]; then
    bad "qemu-x86_64 not found ('$qemu'): install Debian's qemu-user (scripts/install-deps.sh does)"
    cli_done
    exit
fi
# Threads sleep when idle: spinning ones take the emulated CPU from the work.
export OMP_WAIT_POLICY=passive OMP_NUM_THREADS=2
# OpenBLAS must choose its kernel from the emulated CPU: a core type set in
# the environment (this suite's machines have had OPENBLAS_CORETYPE=Haswell
# there) makes it run AVX2 code the Nehalem has not (SIGILL).
unset OPENBLAS_CORETYPE
# The programs run two at a time (each alone takes about a CPU-minute).
run() { "$qemu" -cpu Nehalem "$1" >"$work/$(basename "$1").log" 2>&1; echo $? >"$work/$(basename "$1").rc"; }
for ((i = 0; i < $#; i += 2)); do
    args=("$@")
    run "${args[i]}" &
    ((i + 1 < $#)) && run "${args[i + 1]}" &
    wait
done
for prog; do
    name=$(basename "$prog")
    log=$work/$name.log
    rc=$(cat "$work/$name.rc")
    last=$(grep -v '^qemu-x86_64: warning' "$log" | tail -n 1)
    if ((rc == 0)) && [[ $last =~ ^$name:\ [0-9]+\ passed,\ 0\ failed$ ]]; then
        ok "$last (Nehalem)"
    else
        grep -v '^qemu-x86_64: warning' "$log" | grep -E 'FAIL|error' | head -n 20
        bad "$name under qemu -cpu Nehalem: exit status $rc, last line '$last'"
    fi
    if [[ $name == test_kernels ]]; then
        grep -q '^test_kernels: the default clones run' "$log" && ok "test_kernels ran the default clones" ||
            bad "test_kernels did not say it ran the default clones: $(grep '^test_kernels: the ' "$log")"
    fi
done
cli_done
