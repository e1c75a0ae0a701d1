// Placeholder until the SRU layer lands (this session): aborts if built.
#include "ctrax/layers/rnn.h"
#include "ctrax/core/error.h"
ct_layer *ct_sru(int n_units) {
    (void)n_units;
    ct_abort(__FILE__, __LINE__, "SRU is not implemented yet");
    return NULL;
}
