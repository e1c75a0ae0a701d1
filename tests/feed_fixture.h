// Feed, for gradient checks of losses: targets and weights are data and get
// no gradient by design (losses.c), but gradcheck perturbs every f32 input
// and would compare their zero gradients with nonzero differences. So a
// loss is checked inside Serial(Feed, Loss), where Feed passes the model
// output (and int32 targets) through and appends fixed f32 targets/weights,
// which are then not inputs of the checked layer.
#ifndef CTRAX_TESTS_FEED_FIXTURE_H
#define CTRAX_TESTS_FEED_FIXTURE_H

#include <string.h>

#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"

// [x(, targets)] -> [x(, targets), fixed tensors...]
typedef struct feed {
    int n_pass;      // inputs passed through
    int n_fixed;     // fixed tensors appended
    ct_tensor fixed[2];
} feed;

static inline ct_status feed_shape(const ct_tensor *in, ct_tensor *out, const void *user, ct_error *err) {
    (void)err;
    const feed *f = user;
    for (int i = 0; i < f->n_pass; i++) out[i] = ct_tensor_sig(&in[i]);
    for (int j = 0; j < f->n_fixed; j++) out[f->n_pass + j] = ct_tensor_sig(&f->fixed[j]);
    return CT_OK;
}
static inline void feed_forward(const ct_tensor *in, ct_tensor *out, const void *user) {
    const feed *f = user;
    for (int i = 0; i < f->n_pass; i++) memcpy(out[i].data, in[i].data, ct_tensor_nbytes(&in[i]));
    for (int j = 0; j < f->n_fixed; j++)
        memcpy(out[f->n_pass + j].data, f->fixed[j].data, ct_tensor_nbytes(&f->fixed[j]));
}
static inline void feed_backward(const ct_tensor *in, const ct_tensor *out, const ct_tensor *g, ct_tensor *gin,
                                 const void *user) {
    (void)out;
    const feed *f = user;
    for (int i = 0; i < f->n_pass; i++) {
        if (in[i].dtype != CT_DTYPE_F32) continue;
        for (int64_t k = 0; k < ct_tensor_numel(&in[i]); k++) ct_f32(&gin[i])[k] += ct_f32(&g[i])[k];
    }
}

// Serial(Feed f, loss), taking the reference to loss; f must outlive it.
static inline ct_layer *with_feed(const feed *f, ct_layer *loss) {
    ct_fn_spec spec = {"Feed", f->n_pass, f->n_pass + f->n_fixed, feed_shape, feed_forward, feed_backward, f};
    return ct_serial(CT_LAYERS(ct_fn(&spec), loss));
}

#endif
