// Trax's RNNLM (models/rnn.py).
#include <string.h>

#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/layers/rnn.h"
#include "ctrax/models/models.h"

ct_rnnlm_params ct_rnnlm_default_params(void) { return (ct_rnnlm_params){CT_RNNLM_PARAMS(CT_PARAM_DEFAULT)}; }

static bool cell_is(const ct_rnnlm_params *p, const char *name) { return p->rnn_cell && strcmp(p->rnn_cell, name) == 0; }

ct_status ct_rnnlm_check(const ct_rnnlm_params *p, ct_error *err) {
    if (p->vocab_size < 1 || p->d_model < 1 || p->n_layers < 1 || p->rnn_cell_d_state_multiplier < 1)
        return ct_error_set(err, CT_ERR_ARG,
                            "RNNLM: vocab_size %d, d_model %d, n_layers %d and rnn_cell_d_state_multiplier %d must "
                            "be >= 1",
                            p->vocab_size, p->d_model, p->n_layers, p->rnn_cell_d_state_multiplier);
    if (!(p->dropout >= 0.0f && p->dropout < 1.0f))
        return ct_error_set(err, CT_ERR_ARG, "RNNLM.dropout = %g must be in [0, 1)", (double)p->dropout);
    bool lstm = cell_is(p, "LSTMCell");
    if (!lstm && !cell_is(p, "GRUCell"))
        return ct_error_set(err, CT_ERR_ARG, "RNNLM.rnn_cell = '%s' is not supported: 'LSTMCell' or 'GRUCell'",
                            p->rnn_cell ? p->rnn_cell : "None");
    // Trax builds the model and fails at init with the cell's shape error;
    // said here with the setting to change.
    int want = lstm ? 2 : 1;
    if (p->rnn_cell_d_state_multiplier != want)
        return ct_error_set(err, CT_ERR_ARG,
                            "RNNLM.rnn_cell_d_state_multiplier = %d gives each %s a state of %d x d_model, but a %s's "
                            "state is %d x d_model (n_units = d_model %d): set it to %d",
                            p->rnn_cell_d_state_multiplier, p->rnn_cell, p->rnn_cell_d_state_multiplier, p->rnn_cell,
                            want, p->d_model, want);
    return CT_OK;
}

// Trax's MultiRNNCell: (x, s (B, L S)) -> (x', s' (B, L S)):
//   Parallel([], Split(L)), then per cell k: cell (x, s_k) -> (x', s_k')
//   and Select moving s_k' to the bottom (SerialWithSideOutputs), so the
//   states end in order s_0' .. s_{L-1}'; Parallel([], Concatenate(L)).
static ct_layer *multi_rnn_cell(const ct_rnnlm_params *p) {
    int L = p->n_layers;
    ct_layer **layers = ct_malloc((size_t)(2 * L + 2) * sizeof *layers);
    int *move_back = ct_malloc((size_t)(L + 1) * sizeof *move_back);
    // (x', s_k', rest of L - 1) -> (x', rest, s_k')
    move_back[0] = 0;
    for (int i = 1; i < L; i++) move_back[i] = i + 1;
    move_back[L] = 1;
    int n = 0;
    if (L > 1) layers[n++] = ct_parallel(CT_LAYERS(ct_select(1, (int[]){0}, 1), ct_split(L, -1)));
    for (int k = 0; k < L; k++) {
        layers[n++] = cell_is(p, "LSTMCell") ? ct_lstm_cell(p->d_model) : ct_gru_cell(p->d_model);
        if (L > 1) layers[n++] = ct_select(L + 1, move_back, L + 1);
    }
    if (L > 1) layers[n++] = ct_parallel(CT_LAYERS(ct_select(1, (int[]){0}, 1), ct_concatenate(L, -1)));
    ct_layer *cell = ct_layer_rename(ct_serial(n, layers), "MultiRNNCell");
    ct_free(move_back);
    ct_free(layers);
    return cell;
}

ct_layer *ct_rnnlm(ct_rnnlm_params p) {
    ct_error err;
    if (ct_rnnlm_check(&p, &err) != CT_OK) ct_abort(__FILE__, __LINE__, "%s", err.msg);
    int mult = p.n_layers * p.rnn_cell_d_state_multiplier;
    ct_layer *zero_state = ct_branch(CT_LAYERS(ct_select(1, (int[]){0}, 1), ct_make_zero_state(mult)));
    ct_layer *model = ct_serial(CT_LAYERS(ct_shift_right(1), ct_embedding(p.vocab_size, p.d_model),
                                          ct_dropout(p.dropout), zero_state, ct_scan(multi_rnn_cell(&p), 1, 1),
                                          ct_select(1, (int[]){0}, 2), ct_dense(p.vocab_size)));
    return ct_layer_rename(model, "RNNLM");
}
