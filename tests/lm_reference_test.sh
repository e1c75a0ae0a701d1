#!/usr/bin/env bash
# TransformerLM and ReformerLM end to end against tests/lm_reference.py, a
# float64 numpy reference written from Trax's source:
#
#   tests/lm_reference_test.sh LM_REFERENCE
#
# LM_REFERENCE (tests/lm_reference.c) trains each model a few steps, writes
# its checkpoint, a batch, ctrax's eval loss on it and the gradient; the
# reference reads the weights from the checkpoint by layer path and checks
# the loss and the gradient within the tolerances its docstring gives. One
# case, one pass or failure; a program that fails or a case that prints no
# verdict is a failure too. Ends with "lm_reference_test: N passed, M failed".
set -uo pipefail
prog=$1
py=/usr/bin/python3
source "$(dirname "$0")/cli_common.sh" lm_reference_test

"$prog" "$work" >"$work/c.log" 2>&1
rc=$?
cat "$work/c.log"
if ((rc != 0)); then
    bad "$prog exited with status $rc"
    cli_done
    exit
fi
files=("$work"/*.safetensors)
out=$("$py" "$(dirname "$0")/lm_reference.py" "${files[@]}" 2>&1)
status=$?
echo "$out"
pass=$(grep -c '^ok ' <<<"$out")
fail=$(grep -c '^FAIL ' <<<"$out")
if ((pass + fail != ${#files[@]} || ${#files[@]} != 2)); then
    bad "${#files[@]} cases written (2 expected), $((pass + fail)) verdicts (status $status)"
elif ((status != 0 && fail == 0)); then
    bad "lm_reference.py exited with status $status"
fi
cli_done
