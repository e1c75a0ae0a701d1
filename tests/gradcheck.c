#include "gradcheck.h"

#include <stdio.h>

double gradcheck(const char *label, ct_layer *layer, const ct_tensor *inputs, int n_in, ct_gradcheck_opts opts) {
    ct_error err;
    double worst;
    opts.label = label;
    opts.log = stdout;
    if (ct_gradcheck(layer, inputs, n_in, opts, &worst, &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return -1;
    }
    return worst;
}

void gradcheck_fill(ct_tensor *t, uint64_t seed, float lo, float hi) {
    ct_random_uniform(ct_key_from_seed(seed), t->data, (size_t)ct_tensor_numel(t), lo, hi);
}
