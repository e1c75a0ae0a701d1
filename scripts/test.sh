#!/usr/bin/env bash
# The test suite, as `make test` runs it: configure, build and ctest twice,
#   Release with -Werror              in build/
#   -O2 -g with ASan + UBSan, -Werror in build-asan/  (leak checking on; the
#   same optimized, vectorized floating point as Release, so numerical
#   bounds are checked on the arithmetic users run)
# then the fuzz harnesses for a few seconds each (clang, build-fuzz/, see
# scripts/fuzz.sh; FUZZ_SECONDS per harness, 8 by default), and a last line
# "make test: N passed, N failed" that adds up the two ctest runs and the
# fuzzing (one test; a configuration that does not build counts as one
# failure). Exits 1 if anything failed. Every stage runs even when one before
# it fails.
#
#   bash scripts/test.sh          (no arguments; JOBS: build parallelism [nproc],
#                                  FUZZ_SECONDS: seconds per fuzz harness [8])
set -uo pipefail
# Any argument (--help, a typo) prints the header above instead of starting
# the whole suite.
if (($#)); then
    sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'
    [[ $1 == -h || $1 == --help ]] && exit 0
    echo "scripts/test.sh: takes no arguments, got '$1'" >&2
    exit 2
fi
cd "$(dirname "$0")/.." || exit 1

jobs=${JOBS:-$(nproc)}
passed=0
failed=0
status=0

# suite NAME DIR CMAKE_ARGS...
suite() {
    local name=$1 dir=$2
    shift 2
    echo "== $name: configure and build in $dir/"
    if ! cmake -S . -B "$dir" "$@" || ! cmake --build "$dir" -j "$jobs"; then
        echo "== $name: build FAILED"
        failed=$((failed + 1))
        status=1
        return
    fi
    echo "== $name: ctest"
    local log rc line
    log=$(mktemp)
    (cd "$dir" && ctest --output-on-failure --no-tests=error) 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    # ctest ends with "100% tests passed, 0 tests failed out of 2".
    line=$(grep -E '[0-9]+ tests? failed out of [0-9]+' "$log" | tail -n 1)
    rm -f "$log"
    if [[ $line =~ ([0-9]+)\ tests?\ failed\ out\ of\ ([0-9]+) ]]; then
        passed=$((passed + BASH_REMATCH[2] - BASH_REMATCH[1]))
        failed=$((failed + BASH_REMATCH[1]))
    elif ((rc != 0)); then
        failed=$((failed + 1))  # ctest itself failed (no tests found, ...)
    fi
    ((rc == 0)) || status=1
}

# Read only by the sanitized build.
export ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=print_stacktrace=1

suite release build -DCMAKE_BUILD_TYPE=Release -DCTRAX_SANITIZE=OFF -DCTRAX_WERROR=ON
suite asan build-asan -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCTRAX_SANITIZE=ON -DCTRAX_WERROR=ON

# Fuzzing: each libFuzzer harness of fuzz/ for a few seconds (about a minute
# in all), built with clang in build-fuzz/ (scripts/fuzz.sh); one test, which
# fails on any finding or when the harnesses do not build.
echo "== fuzz: ${FUZZ_SECONDS:-8}s per harness"
if FUZZ_JOBS=$jobs bash scripts/fuzz.sh "${FUZZ_SECONDS:-8}"; then
    passed=$((passed + 1))
else
    failed=$((failed + 1))
    status=1
fi

echo "make test: $passed passed, $failed failed"
exit "$status"
