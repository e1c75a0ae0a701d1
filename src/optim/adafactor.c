// Adafactor as Trax's (see optimizer.h for the math).
#include <math.h>
#include <stddef.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"

// A weight of rank >= 2 seen as B matrices of (R, C): the last two dims.
typedef struct mats {
    int64_t B, R, C;
} mats;

static mats as_mats(const ct_tensor *sig) {
    return (mats){ct_tensor_dims_product(sig, 0, sig->ndim - 2), sig->shape[sig->ndim - 2],
                  sig->shape[sig->ndim - 1]};
}

static bool is_factored(const ct_adafactor_params *p, const ct_tensor *sig) { return p->factored && sig->ndim >= 2; }

// Slots: vr (B,R) and vc (B,C) when factored, else v (n); then m (n) with
// do_momentum.
static size_t adafactor_slot_floats(const ct_optimizer *o, const ct_tensor *sig) {
    const ct_adafactor_params *p = o->params;
    size_t n = (size_t)ct_tensor_numel(sig), floats = n;
    if (is_factored(p, sig)) {
        mats mt = as_mats(sig);
        floats = (size_t)(mt.B * mt.R + mt.B * mt.C);
    }
    return floats + (p->do_momentum ? n : 0);
}

static void adafactor_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w,
                             const float *g, float *slots) {
    const ct_adafactor_params *p = o->params;
    int64_t n = ct_tensor_numel(sig);
    if (n == 0) return;
    // Trax: t = float32(step) + 1; decay = 1 - t^-decay_rate; mix = 1 - decay.
    float decay = 1.0f - powf((float)step + 1.0f, -p->decay_rate);
    float mix = 1.0f - decay;
    float scale = lr;
    if (p->multiply_by_parameter_scale) {
        float rms_w = (float)sqrt(ct_sum_squares(w, n) / (double)n);
        scale *= fmaxf(rms_w, p->epsilon2);
    }
    float *m = NULL;
    double y2;
    if (is_factored(p, sig)) {
        mats mt = as_mats(sig);
        float *vr = slots, *vc = slots + mt.B * mt.R;
        if (p->do_momentum) m = vc + mt.B * mt.C;
        ct_adafactor_factored_moments(vr, vc, g, mt.B, mt.R, mt.C, decay, mix);
        y2 = p->do_clipping ? ct_adafactor_factored_y_sumsq(g, vr, vc, mt.B, mt.R, mt.C, p->epsilon1) : 0.0;
        float denom = p->do_clipping ? fmaxf(1.0f, (float)sqrt(y2 / (double)n) / p->clipping_threshold) : 1.0f;
        ct_adafactor_factored_apply(w, m, g, vr, vc, mt.B, mt.R, mt.C, p->epsilon1, denom, scale, p->beta1,
                                    p->weight_decay_rate);
    } else {
        float *v = slots;
        if (p->do_momentum) m = v + n;
        ct_adafactor_moments(v, g, n, decay, mix);
        y2 = p->do_clipping ? ct_adafactor_y_sumsq(g, v, n, p->epsilon1) : 0.0;
        float denom = p->do_clipping ? fmaxf(1.0f, (float)sqrt(y2 / (double)n) / p->clipping_threshold) : 1.0f;
        ct_adafactor_apply(w, m, g, v, n, p->epsilon1, denom, scale, p->beta1, p->weight_decay_rate);
    }
}

CT_OPTIMIZER(adafactor, "Adafactor", CT_ADAFACTOR_PARAMS,
             .slot_floats = adafactor_slot_floats, .update = adafactor_update)

ct_optimizer *ct_adafactor_new(ct_adafactor_params p) { return ct_optimizer_wrap(&adafactor_vt, &p, sizeof p); }
