#!/usr/bin/env bash
# The C example in README.md (the first ```c block under "## A first model in
# C") must be examples/first_model.c, which builds and runs as a test.
set -euo pipefail
root=$1
block=$(awk '/^## A first model in C/{s=1} s&&/^```c$/{c=1;next} c&&/^```$/{exit} c' "$root/README.md")
if ! diff <(printf '%s\n' "$block") "$root/examples/first_model.c"; then
    echo "README.md's C example differs from examples/first_model.c (diff above)"
    exit 1
fi
echo "README example matches examples/first_model.c"
