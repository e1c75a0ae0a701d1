#!/usr/bin/env bash
# The C example in README.md (the first ```c block under "## A first model in
# C") must be examples/first_model.c, which builds and runs as a test; and
# README's two pkg-config link lines must be the ones tests/install_test.sh
# builds with (the same words, shared and static).
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
