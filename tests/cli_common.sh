# Shared by the cli_*_test.sh scripts, sourced with the test's name:
#   source "$(dirname "$0")/cli_common.sh" cli_loop_test
# a scratch directory removed at exit ($work), the pass/fail counters with
# ok and bad (each prints one line), and cli_done, the summary line and the
# exit status, called last.
cli_name=$1
work=$(mktemp -d "/tmp/ctrax_${cli_name}_XXXXXX")
trap 'rm -rf "$work"' EXIT
pass=0
fail=0
ok() {
    pass=$((pass + 1))
    echo "ok   $*"
}
bad() {
    fail=$((fail + 1))
    echo "FAIL $*"
}
cli_done() {
    echo "$cli_name: $pass passed, $fail failed"
    ((fail == 0))
}

# reference_cases PROG SCRIPT [N]: runs PROG "$work" (a C driver writing one
# .safetensors file per case), then /usr/bin/python3 SCRIPT on those files
# (a float64 reference printing "ok CASE ..." or "FAIL CASE ..." per case)
# and counts its verdicts. PROG failing, a case with no verdict, or other
# than N cases (when given) counts as a failure.
reference_cases() {
    local prog=$1 script=$2 want=${3:-} rc out status n
    "$prog" "$work" >"$work/c.log" 2>&1
    rc=$?
    cat "$work/c.log"
    if ((rc != 0)); then
        bad "$prog exited with status $rc"
        return
    fi
    local files=("$work"/*.safetensors)
    out=$(/usr/bin/python3 "$script" "${files[@]}" 2>&1)
    status=$?
    echo "$out"
    pass=$(grep -c '^ok ' <<<"$out")
    fail=$(grep -c '^FAIL ' <<<"$out")
    n=${#files[@]}
    if ((pass + fail != n)) || [[ -n $want && $n != "$want" ]]; then
        bad "$n cases written${want:+ ($want expected)}, $((pass + fail)) verdicts (status $status)"
    elif ((status != 0 && fail == 0)); then
        bad "$(basename "$script") exited with status $status"
    fi
}
