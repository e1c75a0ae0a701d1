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
source "$(dirname "$0")/cli_common.sh" lsh_reference_test
reference_cases "$1" "$(dirname "$0")/lsh_reference.py"
cli_done
