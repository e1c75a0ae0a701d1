// Trax's MLP (models/mlp.py).
#include "ctrax/layers/combinators.h"
#include "ctrax/layers/core.h"
#include "ctrax/models/models.h"

ct_layer *ct_mlp(int n_widths, const int *layer_widths, ct_activation_fn activation_fn, bool out_activation,
                 bool flatten) {
    CT_ASSERT(n_widths >= 1 && activation_fn);
    ct_layer **layers = ct_malloc((size_t)(2 * n_widths + 1) * sizeof *layers);
    int n = 0;
    if (flatten) layers[n++] = ct_flatten(1);
    for (int i = 0; i < n_widths; i++) {
        layers[n++] = ct_dense(layer_widths[i]);
        if (i < n_widths - 1 || out_activation) layers[n++] = activation_fn();
    }
    ct_layer *mlp = ct_layer_rename(ct_serial(n, layers), "MLP");
    ct_free(layers);
    return mlp;
}
