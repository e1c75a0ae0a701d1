#!/usr/bin/env bash
# `ctrax info --system` (issue 13): the CPU, its vector features, the GEMM
# backend and kernel, the threads and a sgemm measurement; and the kernel is
# never a generic one on a CPU that has AVX2 (ctrax replaces OpenBLAS's
# generic fallback with the kernel the CPU's features run). The check is
# also run on a generic kernel forced through OPENBLAS_CORETYPE (ctrax keeps
# a user's choice), where it must find it generic: the test can fail.
#   cli_system_test.sh CTRAX
set -uo pipefail
ctrax=$1
source "$(dirname "$0")/cli_common.sh" cli_system_test

# OpenBLAS's x86-64 vector kernels (AVX2 or AVX-512); every other name is generic.
vector_kernel() { [[ $1 =~ ^(Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids)$ ]]; }
# The kernel named on the "gemm kernel" line of `ctrax info --system`'s output $1.
kernel_of() { sed -n 's/^gemm kernel  *\([A-Za-z0-9_]*\).*/\1/p' <<<"$1"; }

out=$("$ctrax" info --system 2>&1)
rc=$?
echo "$out"
((rc == 0)) && ok "info --system exits 0" || bad "info --system exited $rc"
for field in cpu features "gemm backend" "gemm kernel" threads sgemm; do
    grep -q "^$field " <<<"$out" && ok "a '$field' line" || bad "no '$field' line"
done
model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -n 1)
if [[ -z $model ]] || grep -qF -- "$model" <<<"$out"; then ok "the CPU's model name"; else bad "no '$model' in the cpu line"; fi
gflops=$(sed -n 's/^sgemm  *\([0-9.]*\) GFLOP\/s.*/\1/p' <<<"$out")
if [[ -n $gflops ]] && awk -v g="$gflops" 'BEGIN { exit !(g > 0) }'; then ok "sgemm $gflops GFLOP/s"; else
    bad "no positive GFLOP/s on the sgemm line"
fi
flags=$(grep -m 1 '^flags' /proc/cpuinfo)
kernel=$(kernel_of "$out")
for f in avx2 avx512f; do
    name=$([[ $f = avx2 ]] && echo AVX2 || echo AVX-512F)
    has_flag=$([[ " $flags " == *" $f "* ]] && echo 1 || echo 0)
    shown=$(grep '^features ' <<<"$out" | sed 's/; not:.*//' | grep -qw -- "$name" && echo 1 || echo 0)
    [[ $has_flag == "$shown" ]] && ok "features: $name $([[ $has_flag = 1 ]] && echo present || echo absent)" ||
        bad "features line says $name is $([[ $shown = 1 ]] && echo present || echo absent), /proc/cpuinfo disagrees"
done
if [[ " $flags " == *" avx2 "* ]]; then
    vector_kernel "$kernel" && ok "AVX2 CPU: vector kernel $kernel" ||
        bad "this CPU has AVX2 but the GEMM kernel is the generic '$kernel'"
else
    echo "skip the kernel check: this CPU has no AVX2 (kernel $kernel)"
fi
# The check itself finds a generic kernel (a user's OPENBLAS_CORETYPE is kept).
forced=$(OPENBLAS_CORETYPE=Prescott "$ctrax" info --system 2>&1)
fk=$(kernel_of "$forced")
if [[ $fk == Prescott ]] && ! vector_kernel "$fk" && grep -q "^gemm kernel  Prescott (generic)" <<<"$forced"; then
    ok "a forced generic kernel is named generic (the check can fail)"
else
    bad "OPENBLAS_CORETYPE=Prescott: kernel '$fk', line: $(grep '^gemm kernel' <<<"$forced")"
fi

out=$("$ctrax" info --system --threads 1 2>&1)
grep -q "^threads      1 for ctrax's loops and the GEMM together" <<<"$out" && ok "--threads 1" ||
    bad "--threads 1: $(grep '^threads' <<<"$out")"
grep -q "(M 2048, K 512, N 512, 1 thread, 1 s)" <<<"$out" && ok "sgemm on 1 thread" ||
    bad "--threads 1: $(grep '^sgemm' <<<"$out")"
"$ctrax" info --system extra >/dev/null 2>"${TMPDIR:-/tmp}/cli_system_err.$$"
rc=$?
((rc == 2)) && grep -q -- "--system takes no other argument, got 'extra'" "${TMPDIR:-/tmp}/cli_system_err.$$" &&
    ok "--system with a checkpoint: exit 2" || bad "--system extra: exit $rc"
"$ctrax" info --system --threads 0 >/dev/null 2>"${TMPDIR:-/tmp}/cli_system_err.$$"
rc=$?
((rc == 2)) && grep -q -- "--threads expects" "${TMPDIR:-/tmp}/cli_system_err.$$" && ok "--threads 0: exit 2" ||
    bad "--threads 0: exit $rc"
rm -f "${TMPDIR:-/tmp}/cli_system_err.$$"
"$ctrax" info --help | grep -q -- "--system" && ok "info --help lists --system" || bad "info --help lacks --system"

cli_done
