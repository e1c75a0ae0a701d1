// Two layers of your own: ScaleShift, with weights (layer_author.h's
// vtable), and Swish, without (ct_fn). Their gradients are checked against
// finite differences (ct_gradcheck), then both train in first_model.c's MLP.
#include <ctrax/ctrax.h>
#include <ctrax/layers/layer_author.h>  // not in ctrax.h: only layer authors need it
#include <math.h>
#include <stdio.h>

// ---- ScaleShift: (..., D) -> (..., D), y = x * scale + shift ------------

static ct_status scale_shift_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                                  ct_error *err) {
    CT_TRY(ct_layer_check_input(l, in, 0, CT_DTYPE_F32, -1, err));  // f32, rank >= 1; the error names l
    ct_tensor d = ct_tensor_1d(CT_DTYPE_F32, in[0].shape[in[0].ndim - 1], NULL);
    // Weights are numbered in declaration order (ct_weight(c, l, 0) is scale);
    // their names make the checkpoint names ".../ScaleShift[1]/scale".
    ct_layer_declare_weight(l, ic, "scale", d, (ct_initializer){CT_INIT_ONES, 0}, ct_key_split(key, 0));
    ct_layer_declare_weight(l, ic, "shift", d, (ct_initializer){CT_INIT_ZEROS, 0}, ct_key_split(key, 1));
    out[0] = ct_tensor_sig(&in[0]);  // init must write all n_out output signatures
    return CT_OK;
}

static ct_status scale_shift_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                     ct_error *err) {
    (void)key;
    out[0] = ct_tensor_sig(&in[0]);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));  // outputs come from the step's arena
    int64_t d = in[0].shape[in[0].ndim - 1], rows = ct_tensor_numel(&in[0]) / d;
    const float *x = ct_f32(&in[0]), *scale = ct_weight(c, l, 0), *shift = ct_weight(c, l, 1);
    float *y = ct_f32(&out[0]);
    for (int64_t i = 0; i < rows * d; i++) y[i] = x[i] * scale[i % d] + shift[i % d];
    // Backward needs x for the gradient of scale: save it (a descriptor; the
    // data lives to the end of the step). Only pushes when c->record.
    return ct_tape_push(c, &in[0], err);
}

static ct_status scale_shift_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                      ct_key key, ct_error *err) {
    (void)key;
    ct_tensor x = ct_tape_pop(c);  // pop exactly what forward pushed, in reverse
    ct_tensor g = grad_out[0];
    CT_TRY(ct_ctx_grad_or_zeros(c, &g, err));  // a NULL gradient means zeros
    grad_in[0] = ct_tensor_sig(&x);
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    int64_t d = x.shape[x.ndim - 1], rows = ct_tensor_numel(&x) / d;
    const float *xs = ct_f32(&x), *gy = ct_f32(&g), *scale = ct_weight(c, l, 0);
    float *gx = ct_f32(&grad_in[0]), *gscale = ct_weight_grad(c, l, 0), *gshift = ct_weight_grad(c, l, 1);
    for (int64_t i = 0; i < rows * d; i++) {
        gx[i] = gy[i] * scale[i % d];
        // += never =: a layer used twice adds both uses' gradients.
        gscale[i % d] += gy[i] * xs[i];
        gshift[i % d] += gy[i];
    }
    return CT_OK;
}

static const ct_layer_vtable scale_shift_vt = {
    .type = "ScaleShift", .init = scale_shift_init, .forward = scale_shift_forward, .backward = scale_shift_backward};

static ct_layer *scale_shift(void) { return ct_layer_new(&scale_shift_vt, NULL, 1, 1, NULL, NULL, 0); }

// ---- Swish: y = x sigmoid(x), a weightless layer from two functions -----

static void swish_forward(const ct_tensor *in, ct_tensor *out, const void *user) {
    (void)user;
    for (int64_t i = 0; i < ct_tensor_numel(&in[0]); i++) {
        float x = ct_f32(&in[0])[i];
        ct_f32(&out[0])[i] = x / (1 + expf(-x));
    }
}

static void swish_backward(const ct_tensor *in, const ct_tensor *out, const ct_tensor *grad_out, ct_tensor *grad_in,
                           const void *user) {
    (void)out, (void)user;
    for (int64_t i = 0; i < ct_tensor_numel(&in[0]); i++) {
        float x = ct_f32(&in[0])[i], s = 1 / (1 + expf(-x));
        ct_f32(&grad_in[0])[i] += ct_f32(&grad_out[0])[i] * (s + x * s * (1 - s));  // grad_in arrives zeroed
    }
}

static const ct_fn_spec swish_spec = {.name = "Swish", .n_in = 1, .n_out = 1, .forward = swish_forward,
                                      .backward = swish_backward};

// ---- Gradient checks: the one ctrax's own layers pass ----------------------

// Checks l's gradients on a (4, 3) input against finite differences
// (ct_gradcheck, gradcheck.h): every input and weight, that backward adds
// into the weight gradients, reads nothing it did not write and takes back
// its tape. Each check's error goes to stdout. Frees l.
static bool gradient_ok(ct_layer *l) {
    float xd[12];
    ct_random_uniform(ct_key_from_seed(1), xd, 12, -1, 1);
    ct_tensor x = ct_tensor_2d(CT_DTYPE_F32, 4, 3, xd);
    ct_gradcheck_opts o = ct_gradcheck_defaults();
    o.log = stdout;
    o.weight_noise = 0.5f;  // scale 1 and shift 0, as init leaves them, would hide a backward that forgot them
    double worst;
    ct_error err;
    ct_status st = ct_gradcheck(l, &x, 1, o, &worst, &err);
    if (st != CT_OK) printf("%s\n", err.msg);  // init, forward or backward failed, or a rule was broken
    else printf("%s gradient: largest error %.2e (bound %.0e)\n", ct_layer_name(l), worst, CT_GRADCHECK_TOL);
    ct_layer_free(l);
    return st == CT_OK && worst < CT_GRADCHECK_TOL;
}

// ---- Training: first_model.c's task, with both layers in the MLP ----------

enum { B = 64 };

int main(void) {
    if (!gradient_ok(scale_shift()) || !gradient_ok(ct_fn(&swish_spec))) return 1;

    float x[B * 2], w[B];
    int32_t y[B];
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, B, 2, x), ct_tensor_1d(CT_DTYPE_I32, B, y),
                          ct_tensor_1d(CT_DTYPE_F32, B, w)};
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(32), scale_shift(), ct_fn(&swish_spec), ct_dense(2)));
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_device cpu = ct_device_cpu();
    ct_trainer *trainer;
    ct_error err;
    if (ct_trainer_new(&trainer, model, loss, batch, 3, ct_adam_new(ct_adam_default_params()), ct_key_from_seed(0),
                       &cpu, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ct_step_stats stats;
    for (int step = 1; step <= 500; step++) {
        ct_random_uniform(ct_key_from_seed((uint64_t)step), x, B * 2, -1, 1);
        for (int i = 0; i < B; i++) y[i] = x[2 * i] * x[2 * i + 1] > 0, w[i] = 1;
        if (ct_trainer_one_step(trainer, batch, ct_key_from_seed(0), step, 0.01f, &stats, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        if (step % 100 == 0) printf("step %3d: loss %.4f\n", step, stats.loss);
    }
    ct_trainer_free(trainer);
    ct_layer_free(model);
    ct_layer_free(loss);
    return stats.loss < 0.2f ? 0 : 1;
}
