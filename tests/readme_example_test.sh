#!/usr/bin/env bash
# The C example in README.md (the first ```c block under "## A first model in
# C") must be examples/first_model.c, which builds and runs as a test; and
# README's two pkg-config link lines must be the ones tests/install_test.sh
# builds with (the same words, shared and static); and every script of
# scripts/ and bench/ (which README.md tells readers to run with bash) must
# answer --help with its usage and exit 0, running nothing.
set -euo pipefail
root=$1
block=$(awk '/^## A first model in C/{s=1} s&&/^```c$/{c=1;next} c&&/^```$/{exit} c' "$root/README.md")
if ! diff <(printf '%s\n' "$block") "$root/examples/first_model.c"; then
    echo "README.md's C example differs from examples/first_model.c (diff above)"
    exit 1
fi
echo "README example matches examples/first_model.c"
# Each $(pkg-config ...) README's install section shows, with its sed, is in install_test.sh.
n=0
while IFS= read -r call; do
    if ! grep -qF -- "$call" "$root/tests/install_test.sh"; then
        echo "README.md's link line '$call' is not what tests/install_test.sh builds with"
        exit 1
    fi
    n=$((n + 1))
done < <(awk '/^make install PREFIX/{s=1} s&&/^```sh$/{c=1;next} c&&/^```$/{exit} c' "$root/README.md" |
    grep -o '\$(pkg-config [^)]*)')
if ((n < 3)); then
    echo "README.md's install section shows $n pkg-config calls, expected 3 (--cflags --libs; --cflags; --static --libs)"
    exit 1
fi
echo "README's $n pkg-config calls are install_test.sh's"
# `bash scripts/test.sh --help` started the whole suite, `bash bench/run_dist.sh
# --help` handed "--help/bench_allreduce" to mpirun: a reader's first try.
for script in "$root"/scripts/*.sh "$root"/bench/*.sh; do
    rel=${script#"$root"/}
    if ! out=$(timeout 20 bash "$script" --help </dev/null 2>&1); then
        echo "bash $rel --help did not print its usage and exit 0:"
        printf '%s\n' "$out" | tail -n 5
        exit 1
    fi
    if ! grep -qF "$rel" <<<"$out"; then
        echo "bash $rel --help does not show how to run $rel:"
        printf '%s\n' "$out" | tail -n 5
        exit 1
    fi
done
echo "every script of scripts/ and bench/ answers --help"
