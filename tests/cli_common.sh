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
