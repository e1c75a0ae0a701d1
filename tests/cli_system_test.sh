#!/usr/bin/env bash
# `ctrax info --system` (issue 13): the CPU, its vector features, the GEMM
# backend and kernel, the threads and a sgemm measurement; and the kernel is
# never a generic one on a CPU that has AVX2, nor an AVX2 one on a CPU with
# AVX-512 (ctrax replaces OpenBLAS's choice by the widest kernel the CPU's
# features run). These run without OPENBLAS_CORETYPE, which ctrax leaves
# to a user who sets it (some machines set it for every program: Haswell
# on an AVX-512 Zen 5 here). The checks are also run on a generic kernel
# and an AVX2 one forced through OPENBLAS_CORETYPE, where they must find
# the narrower kernel and name the wider one: the test can fail.
#   cli_system_test.sh CTRAX
set -uo pipefail
ctrax=$1
source "$(dirname "$0")/cli_common.sh" cli_system_test

# OpenBLAS's x86-64 vector kernels (AVX2 or AVX-512); every other name is generic.
vector_kernel() { [[ $1 =~ ^(Haswell|Zen|SkylakeX|Cooperlake|SapphireRapids)$ ]]; }
avx512_kernel() { [[ $1 =~ ^(SkylakeX|Cooperlake|SapphireRapids)$ ]]; }
# The kernel named on the "gemm kernel" line of `ctrax info --system`'s output $1.
kernel_of() { sed -n 's/^gemm kernel  *\([A-Za-z0-9_]*\).*/\1/p' <<<"$1"; }

out=$(env -u OPENBLAS_CORETYPE "$ctrax" info --system 2>&1)
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
has() { for f; do [[ " $flags " == *" $f "* ]] || return 1; done; }
if has avx2 fma; then
    vector_kernel "$kernel" && ok "AVX2 CPU: vector kernel $kernel" ||
        bad "this CPU has AVX2 but the GEMM kernel is the generic '$kernel'"
else
    echo "skip the kernel check: this CPU has no AVX2 (kernel $kernel)"
fi
if has avx512f avx512bw avx512dq avx512vl; then
    avx512_kernel "$kernel" && ok "AVX-512 CPU: AVX-512 kernel $kernel" ||
        bad "this CPU has AVX-512 but the GEMM kernel is '$kernel'"
    wider=SkylakeX
else
    echo "skip the AVX-512 kernel check: this CPU has no AVX-512 (kernel $kernel)"
    wider=Haswell
fi
# A user's OPENBLAS_CORETYPE is kept; the check finds a forced generic
# kernel, and on an AVX-512 CPU a forced AVX2 one, and the line names the
# kernel this CPU could run.
for narrow in Prescott Haswell; do
    [[ $narrow == Haswell && $wider == Haswell ]] && continue
    has avx2 fma || continue
    forced=$(OPENBLAS_CORETYPE=$narrow "$ctrax" info --system 2>&1)
    fk=$(kernel_of "$forced")
    line=$(grep '^gemm kernel' <<<"$forced")
    if [[ $fk == "$narrow" ]] && ! avx512_kernel "$fk" && { [[ $narrow == Haswell ]] || ! vector_kernel "$fk"; } &&
        grep -qF "this CPU could run $wider; set OPENBLAS_CORETYPE=$wider" <<<"$line"; then
        ok "a forced $narrow kernel is kept, found narrower and $wider named (the check can fail)"
    else
        bad "OPENBLAS_CORETYPE=$narrow: kernel '$fk', line: $line"
    fi
done
# A name OpenBLAS does not have: it picks a kernel itself, saying nothing;
# the kernel line says so (case aside, a name it has is not flagged).
forced=$(OPENBLAS_CORETYPE=NoSuchCore "$ctrax" info --system --threads 1 2>&1)
line=$(grep '^gemm kernel' <<<"$forced")
fk=$(kernel_of "$forced")
grep -qF ": OPENBLAS_CORETYPE=NoSuchCore names no kernel this OpenBLAS has; it chose $fk itself" <<<"$line" &&
    ok "an unknown OPENBLAS_CORETYPE is said: $line" || bad "OPENBLAS_CORETYPE=NoSuchCore: $line"
forced=$(OPENBLAS_CORETYPE=$(tr '[:upper:]' '[:lower:]' <<<"$kernel") "$ctrax" info --system --threads 1 2>&1)
line=$(grep '^gemm kernel' <<<"$forced")
! grep -q "names no kernel" <<<"$line" && ok "OPENBLAS_CORETYPE=${kernel,,}: $line" ||
    bad "OPENBLAS_CORETYPE=${kernel,,}: $line"

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
# Under taskset the cpu line says how many cores are this process's.
if command -v taskset >/dev/null && (($(nproc --all) >= 2)); then
    out=$(taskset -c 0 "$ctrax" info --system --threads 1 2>&1)
    grep -q "^cpu .* cores online, 1 for this process)" <<<"$out" && ok "taskset -c 0: 1 core for this process" ||
        bad "taskset -c 0: $(grep '^cpu' <<<"$out")"
fi
# stdout on a full disk: exit 1 saying so, not a listing that looks complete.
if [[ -c /dev/full ]]; then
    "$ctrax" info --system --threads 1 >/dev/full 2>"${TMPDIR:-/tmp}/cli_system_err.$$"
    rc=$?
    ((rc == 1)) && grep -q "writing to stdout failed" "${TMPDIR:-/tmp}/cli_system_err.$$" &&
        ok "--system >/dev/full: exit 1" || bad "--system >/dev/full: exit $rc"
fi
rm -f "${TMPDIR:-/tmp}/cli_system_err.$$"
"$ctrax" info --help | grep -q -- "--system" && ok "info --help lists --system" || bad "info --help lacks --system"

cli_done
