#!/usr/bin/env bash
# LSHSelfAttention's forward values against tests/lsh_reference.py, a float64
# numpy reference written from REFORMER.md section 2:
#
#   tests/lsh_reference_test.sh LSH_REFERENCE
#
# LSH_REFERENCE (tests/lsh_reference.c) writes one file per case, the
# reference checks each: its buckets exactly, its training and eval outputs
# within the tolerances its docstring gives. One case, one pass or failure;
# a program that fails or a case that prints no verdict is a failure too.
# Ends with "lsh_reference_test: N passed, M failed".
set -uo pipefail
prog=$1
py=/usr/bin/python3
source "$(dirname "$0")/cli_common.sh" lsh_reference_test

"$prog" "$work" >"$work/c.log" 2>&1
rc=$?
if ((rc != 0)); then
    cat "$work/c.log"
    bad "$prog exited with status $rc"
    cli_done
    exit
fi
files=("$work"/*.safetensors)
out=$("$py" "$(dirname "$0")/lsh_reference.py" "${files[@]}" 2>&1)
status=$?
echo "$out"
pass=$(grep -c '^ok ' <<<"$out")
fail=$(grep -c '^FAIL ' <<<"$out")
if ((pass + fail != ${#files[@]})); then
    bad "${#files[@]} cases written, $((pass + fail)) verdicts (status $status)"
elif ((status != 0 && fail == 0)); then
    bad "lsh_reference.py exited with status $status"
fi
cli_done
