#!/usr/bin/env bash
# TransformerLM and ReformerLM (full SelfAttention; LSHSelfAttention with
# axial positions; the same chunked, through the memory-efficient trainer;
# the same with factored n_buckets; TransformerLM and ReformerLM with their
# whole residual stream small, so that every LayerNorm's epsilon counts)
# end to end against tests/lm_reference.py, a float64 numpy reference
# written from Trax's source:
#
#   tests/lm_reference_test.sh LM_REFERENCE
#
# LM_REFERENCE (tests/lm_reference.c) trains each model a few steps, writes
# its checkpoint, a batch, ctrax's eval loss on it and the gradient; the
# reference reads the weights from the checkpoint by layer path and checks
# the loss and the gradient within the tolerances its docstring gives; in
# the transformer, reformer and reformer_lsh_r1[_chunked] cases (the last
# LSHSelfAttention with one hash round, axial positions; chunked: the
# feed-forward and the loss per chunk, the memory-efficient trainer) also
# one training step at dropout 0.1, with the masks ctrax drew applied at
# Trax's dropout sites. One case, one pass or failure; a program that
# fails or a case that prints no verdict is a failure too. Ends with "lm_reference_test: N passed, M failed".
set -uo pipefail
source "$(dirname "$0")/cli_common.sh" lm_reference_test
reference_cases "$1" "$(dirname "$0")/lm_reference.py" 9
cli_done
