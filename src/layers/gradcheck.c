// Finite-difference gradient check of a layer (include/ctrax/layers/gradcheck.h).
#include "ctrax/layers/gradcheck.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/core/memory.h"
#include "ctrax/layers/layer_author.h"

// The floor of the checks that compare two analytic gradients (the second
// pass against the first): their noise is summation order only.
#define PASS_FLOOR 0.05

ct_gradcheck_opts ct_gradcheck_defaults(void) {
    return (ct_gradcheck_opts){.eps = 1e-2, .max_elems = 48, .train = true, .seed = 1, .floor = 0.05};
}

ct_gradcheck_opts ct_gradcheck_model_defaults(double eps) {
    ct_gradcheck_opts o = ct_gradcheck_defaults();
    o.eps = eps;
    o.floor = CT_GRADCHECK_MODEL_FLOOR;
    return o;
}

typedef struct gc_run {
    ct_gradcheck_opts o;
    const char *label;
    ct_net net;
    ct_arena arena;
    ct_ctx ctx;
    ct_key key;
    int n_in;
    ct_tensor in[CT_LAYER_MAX_IO];      // f32 ones are private copies, perturbed
    float *proj[CT_LAYER_MAX_IO];       // r_i, one per f32 output (NULL for others)
    float *proj_copy[CT_LAYER_MAX_IO];  // to see that backward leaves them alone
} gc_run;

// n floats (sized by the caller's tensors: the checked path, which counts a
// size that overflows as too much and never returns malloc(0)'s NULL).
static void *alloc_floats(size_t n, ct_error *err) {
    return ct_calloc_checked(n, sizeof(float), err, "gradcheck: %zu floats", n);
}

// One line of the log: the check's label, what was checked, its error.
static void log_line(const gc_run *r, const char *what, double rel, const char *extra) {
    if (r->o.log) fprintf(r->o.log, "  %-28s %-40s rel err %.2e%s\n", r->label, what, rel, extra);
}

// An error that is NaN (a NaN gradient or loss) as +inf: NaN compares false
// with every bound, so it would pass a caller's check and drop out of the
// largest error.
static double not_nan(double rel) { return isnan(rel) ? INFINITY : rel; }

// ||a - b|| / max(||a|| + ||b||, floor) from the three sums of squares.
static double rel_error(double dd, double aa, double bb, double floor) {
    double denom = sqrt(aa) + sqrt(bb);
    return not_nan(sqrt(dd) / (denom > floor ? denom : floor));
}

// That each f32 output of a forward (what says which) has the shape init
// declared: the projections r_i, and the gradients built from them, are
// sized by init's.
static ct_status check_outputs(const gc_run *r, const ct_tensor *out, const char *what, ct_error *err) {
    for (int i = 0; i < r->net.n_out; i++)
        if ((out[i].dtype == CT_DTYPE_F32 || r->proj[i]) && !ct_tensor_same_sig(&out[i], &r->net.out_sigs[i]))
            return ct_error_set(err, CT_ERR_SHAPE,
                                "gradcheck %s: output %d of the %s has another shape or dtype than init declared",
                                r->label, i, what);
    return CT_OK;
}

// L = sum_i <r_i, out_i> in double, in forward-only mode.
static ct_status loss_at(gc_run *r, double *loss, ct_error *err) {
    ct_tensor out[CT_LAYER_MAX_IO];
    r->ctx.record = false;
    ct_status st = ct_layer_forward(r->net.root, &r->ctx, r->in, out, r->key, err);
    r->ctx.record = true;
    if (st != CT_OK) {
        ct_arena_reset(&r->arena);
        return ct_error_prefix(err, "gradcheck %s: forward without the tape", r->label);
    }
    if ((st = check_outputs(r, out, "forward without the tape", err)) != CT_OK) {
        ct_arena_reset(&r->arena);
        return st;
    }
    double s = 0;
    for (int i = 0; i < r->net.n_out; i++) {
        if (out[i].dtype != CT_DTYPE_F32) continue;
        const float *o = out[i].data;
        for (int64_t k = 0; k < ct_tensor_numel(&out[i]); k++) s += (double)o[k] * r->proj[i][k];
    }
    ct_arena_reset(&r->arena);
    *loss = s;
    return CT_OK;
}

// The numeric gradient at element k of x, via central differences over the
// steps the floats took.
static ct_status numeric_at(gc_run *r, float *x, int64_t k, double *g, ct_error *err) {
    float saved = x[k];
    double lp, lm;
    x[k] = (float)(saved + r->o.eps);
    double up = (double)x[k] - saved;
    ct_status st = loss_at(r, &lp, err);
    x[k] = (float)(saved - r->o.eps);
    double down = saved - (double)x[k];
    if (st == CT_OK) st = loss_at(r, &lm, err);
    x[k] = saved;
    if (st == CT_OK) *g = (lp - lm) / (up + down);
    return st;
}

// The analytic gradient ga of x against numeric ones at sampled elements.
static ct_status compare(gc_run *r, const char *what, float *x, const float *ga, int64_t n, double *rel,
                         ct_error *err) {
    double dd = 0, aa = 0, nn = 0;
    int m = n < r->o.max_elems ? (int)n : r->o.max_elems;
    for (int s = 0; s < m; s++) {
        int64_t k = n <= r->o.max_elems
                        ? s
                        : (int64_t)(ct_random_bits(ct_key_from_seed(r->o.seed + 99), (uint32_t)s) % (uint64_t)n);
        double g, a = ga ? ga[k] : 0.0;
        CT_TRY(numeric_at(r, x, k, &g, err));
        dd += (a - g) * (a - g);
        aa += a * a;
        nn += g * g;
    }
    // The floor keeps a gradient that is truly zero (numeric noise only) from
    // reading as a 100% error; a wrong gradient of norm above floor * tol
    // (5e-5 for one layer) still fails.
    *rel = rel_error(dd, aa, nn, r->o.floor);
    char extra[48];
    snprintf(extra, sizeof extra, "  (|grad| %.3e)", sqrt(aa));
    log_line(r, what, *rel, extra);
    return CT_OK;
}

// The derivative along a random direction v of every element of x (|v| =
// 1) against central differences along it: (L(x + eps v) - L(x - eps v)) /
// 2 eps by sum_k ga_k v_k, over the steps the floats took. compare perturbs
// at most max_elems elements, drawn with replacement (of 96, 39 distinct and
// never element 0), so a gradient wrong only at the others passed; here
// every element counts. A wrong element k shows as |delta_k v_k| against
// |<ga, v>| (|ga| / sqrt(n) on average): a backward that left element 0 of
// 96 without its gradient read 2.2e-7 in compare and 0.2 here.
static ct_status compare_direction(gc_run *r, const char *what, float *x, const float *ga, int64_t n,
                                   uint64_t seed, double *rel, ct_error *err) {
    *rel = 0;
    if (n == 0) return CT_OK;
    float *saved = alloc_floats((size_t)n, err), *v = saved ? alloc_floats((size_t)n, err) : NULL;
    if (!v) {
        free(saved);
        return CT_ERR_MEMORY;
    }
    memcpy(saved, x, (size_t)n * sizeof(float));
    ct_random_uniform(ct_key_from_seed(seed), v, (size_t)n, -1.0f, 1.0f);
    // |v| = 1: a step of eps in norm, as compare's one element takes. With
    // every element at +-eps the step is ~0.6 eps sqrt(n) long, and the
    // truncation error grows with its square (1.2e-3 on a kernel of 36 in
    // 16 Residual(Dense, Tanh)).
    double vv = 0;
    for (int64_t k = 0; k < n; k++) vv += (double)v[k] * v[k];
    for (int64_t k = 0; k < n && vv > 0; k++) v[k] = (float)(v[k] / sqrt(vv));
    double lp = 0, lm = 0, a = 0, gg = 0;
    for (int64_t k = 0; k < n; k++) x[k] = (float)(saved[k] + r->o.eps * v[k]);
    ct_status st = loss_at(r, &lp, err);
    for (int64_t k = 0; k < n; k++) {
        double up = (double)x[k] - saved[k], gk = ga ? ga[k] : 0.0;
        x[k] = (float)(saved[k] - r->o.eps * v[k]);
        a += gk * (up + (saved[k] - (double)x[k]));
        gg += gk * gk;
    }
    if (st == CT_OK) st = loss_at(r, &lm, err);
    memcpy(x, saved, (size_t)n * sizeof(float));
    free(saved);
    free(v);
    CT_TRY(st);
    // Both as derivatives along v (per unit of eps), so the floor means what
    // it means in compare. <ga, v> is |ga| / sqrt(n) on average but may be
    // near 0 by chance, where numeric noise alone would read as a large
    // error (1.2e-3 on a projection of 5e-3 in 10 nested Residuals): the
    // denominator is at least that average.
    a /= 2 * r->o.eps;
    double g = (lp - lm) / (2 * r->o.eps);
    double denom = fmax(fabs(a) + fabs(g), sqrt(gg / (double)n));
    double e = not_nan(fabs(a - g) / (denom > r->o.floor ? denom : r->o.floor));
    char along[96], extra[64];
    snprintf(along, sizeof along, "%s, all %lld along v", what, (long long)n);
    snprintf(extra, sizeof extra, "  (<grad, v> %.3e; held to twice the bound)", a);
    log_line(r, along, e, extra);
    // Every output's float noise enters one difference here, against the
    // one projection: on correct code it read up to 5.5e-4 with AVX-512
    // kernels and 9.4e-4 with AVX2 ones (DotProductCausalAttention(T 131)'s
    // input, qemu -cpu Haswell), against CT_GRADCHECK_TOL 1e-3. So it counts
    // half: held to twice the bound, where the defects it is for read 100
    // times that (0.2, 0.029).
    *rel = e / 2;
    return CT_OK;
}

// One forward with the tape and one backward from dL/dout_i = r_i, adding
// into the gradient slab; gin gets the input gradients (in the arena).
static ct_status backward_pass(gc_run *r, ct_tensor *gin, ct_error *err) {
    ct_tensor out[CT_LAYER_MAX_IO], gout[CT_LAYER_MAX_IO];
    // A backward that never sets grad_in[i] leaves it as is: no gradient
    // (zeros, which the comparison fails), not the stack's stale contents
    // or the first pass's.
    memset(gin, 0, CT_LAYER_MAX_IO * sizeof *gin);
    if (ct_layer_forward(r->net.root, &r->ctx, r->in, out, r->key, err) != CT_OK)
        return ct_error_prefix(err, "gradcheck %s: forward", r->label);
    CT_TRY(check_outputs(r, out, "forward", err));
    for (int i = 0; i < r->net.n_out; i++) {
        gout[i] = ct_tensor_sig(&out[i]);
        gout[i].data = r->proj[i];  // NULL for an output that is not f32: no gradient
    }
    if (ct_layer_backward(r->net.root, &r->ctx, gout, gin, r->key, err) != CT_OK)
        return ct_error_prefix(err, "gradcheck %s: backward", r->label);
    if (r->ctx.tape_len != 0)
        return ct_error_set(err, CT_ERR_STATE, "gradcheck %s: %d tape record(s) left after backward",
                            r->label, r->ctx.tape_len);
    // Gradients may alias each other, so no layer writes into a grad_out.
    for (int i = 0; i < r->net.n_out; i++)
        if (r->proj[i] && memcmp(r->proj[i], r->proj_copy[i], ct_tensor_nbytes(&r->net.out_sigs[i])) != 0)
            return ct_error_set(err, CT_ERR_STATE,
                                "gradcheck %s: backward wrote into the gradient of output %d it was given "
                                "(a layer must leave its grad_out alone)",
                                r->label, i);
    for (int i = 0; i < r->n_in; i++)
        if (r->in[i].dtype == CT_DTYPE_F32 && gin[i].data && !ct_tensor_same_sig(&gin[i], &r->in[i]))
            return ct_error_set(err, CT_ERR_SHAPE,
                                "gradcheck %s: the gradient of input %d has another shape or dtype than "
                                "the input",
                                r->label, i);
    return CT_OK;
}

// After two passes from g0 the slab must hold g0 + 2 g, where g = wgrad is
// what the first pass added: the error per weight as compare's, the largest
// logged with its weight's name.
static double accumulation_error(const gc_run *r, const float *g0, const float *wgrad) {
    double worst = 0;
    const char *worst_name = "";
    for (int p = 0; p < r->net.n_params; p++) {
        const ct_param *pp = r->net.params[p];
        double dd = 0, aa = 0, bb = 0;
        for (int64_t k = (int64_t)pp->offset; k < (int64_t)pp->offset + ct_tensor_numel(&pp->sig); k++) {
            double got = (double)r->net.grads[k] - g0[k], want = 2.0 * wgrad[k];
            dd += (got - want) * (got - want);
            aa += got * got;
            bb += want * want;
        }
        double rel = rel_error(dd, aa, bb, PASS_FLOOR);
        if (rel >= worst) worst = rel, worst_name = pp->full_name;
    }
    char what[256];
    snprintf(what, sizeof what, "weights: 2 backwards add 2 g (worst %s)", worst_name);
    log_line(r, what, worst, "");
    return worst;
}

// Fills the arena's memory with NaNs (all bits set) and frees it: a layer
// that reads arena memory it did not write (adds into ct_ctx_alloc'ed
// memory, or reads a buffer given back while still needed) finds NaNs there
// in the second pass instead of the zeros of a fresh arena.
static void poison_arena(ct_arena *a) {
    size_t n = ct_arena_capacity(a);
    void *p = n ? ct_arena_alloc(a, n, NULL) : NULL;
    if (p) memset(p, 0xff, n);
    ct_arena_reset(a);
}

// The second pass's gradient of input i (over the poisoned arena) against
// the first's, as compare's error (NULL data: zeros); logged.
static double repeat_error(const gc_run *r, int i, const float *first, const float *second, int64_t n) {
    double dd = 0, aa = 0, bb = 0;
    for (int64_t k = 0; k < n; k++) {
        double a = first ? first[k] : 0.0, b = second ? second[k] : 0.0;
        dd += (a - b) * (a - b);
        aa += a * a;
        bb += b * b;
    }
    double rel = rel_error(dd, aa, bb, PASS_FLOOR);
    char what[64];
    snprintf(what, sizeof what, "input %d: pass 2 (NaN arena) = pass 1", i);
    log_line(r, what, rel, "");
    return rel;
}

static ct_status check_args(const ct_layer *layer, const ct_tensor *inputs, int n_in, ct_gradcheck_opts o,
                            const double *worst, ct_error *err) {
    if (!layer || !worst || (n_in > 0 && !inputs))
        return ct_error_set(err, CT_ERR_ARG, "gradcheck: layer, inputs and worst must not be NULL");
    if (n_in < 1 || n_in > CT_LAYER_MAX_IO)
        return ct_error_set(err, CT_ERR_ARG, "gradcheck: %d inputs; a layer takes 1 to %d", n_in,
                            CT_LAYER_MAX_IO);
    if (!(o.eps > 0) || !isfinite(o.eps) || o.max_elems < 1 || !(o.floor > 0) || !isfinite(o.floor))
        return ct_error_set(err, CT_ERR_ARG,
                            "gradcheck: eps %g, max_elems %d, floor %g: each must be finite and above 0",
                            o.eps, o.max_elems, o.floor);
    if (!(o.weight_noise >= 0) || !isfinite(o.weight_noise))
        return ct_error_set(err, CT_ERR_ARG, "gradcheck: weight_noise %g must be finite and at least 0",
                            (double)o.weight_noise);
    for (int i = 0; i < n_in; i++) {
        // The shape sizes the copy of the input: a negative dim would make
        // its element count negative (a huge size_t), one past int64 reads
        // as INT64_MAX.
        const ct_tensor *t = &inputs[i];
        if (t->ndim < 0 || t->ndim > CT_MAX_DIMS)
            return ct_error_set(err, CT_ERR_ARG, "gradcheck: input %d has rank %d; expected 0..%d (CT_MAX_DIMS)", i,
                                t->ndim, CT_MAX_DIMS);
        for (int d = 0; d < t->ndim; d++)
            if (t->shape[d] < 0)
                return ct_error_set(err, CT_ERR_ARG, "gradcheck: input %d: dim %d is %lld; expected >= 0", i, d,
                                    (long long)t->shape[d]);
        if (ct_tensor_numel(t) == INT64_MAX)
            return ct_error_set(err, CT_ERR_ARG, "gradcheck: input %d is too large: its element count overflows", i);
        if (!t->data && ct_tensor_numel(t) > 0)
            return ct_error_set(err, CT_ERR_ARG, "gradcheck: input %d has no data", i);
    }
    return CT_OK;
}

// The checks after the analytic gradients are in: gin_first is the first
// pass's input gradients (copies), wgrad what it added to each weight.
static ct_status check_all(gc_run *r, float **gin_first, const float *wgrad, const float *g0, double *worst,
                           ct_error *err) {
    ct_tensor gin[CT_LAYER_MAX_IO];
    ct_arena_reset(&r->arena);
    poison_arena(&r->arena);
    CT_TRY(backward_pass(r, gin, err));

    if (r->o.log) fprintf(r->o.log, "gradcheck %s:\n", r->label);
    if (r->net.n_params) *worst = fmax(*worst, accumulation_error(r, g0, wgrad));
    for (int i = 0; i < r->n_in; i++)
        if (r->in[i].dtype == CT_DTYPE_F32)
            *worst = fmax(*worst, repeat_error(r, i, gin_first[i], gin[i].data, ct_tensor_numel(&r->in[i])));
    ct_arena_reset(&r->arena);
    double e;
    for (int i = 0; i < r->n_in; i++) {
        if (r->in[i].dtype != CT_DTYPE_F32) continue;
        char what[64];
        snprintf(what, sizeof what, "input %d", i);
        int64_t n = ct_tensor_numel(&r->in[i]);
        CT_TRY(compare(r, what, r->in[i].data, gin_first[i], n, &e, err));
        *worst = fmax(*worst, e);
        CT_TRY(compare_direction(r, what, r->in[i].data, gin_first[i], n, r->o.seed + 3000 + (uint64_t)i, &e, err));
        *worst = fmax(*worst, e);
    }
    for (int p = 0; p < r->net.n_params; p++) {
        const ct_param *pp = r->net.params[p];
        float *w = r->net.weights + pp->offset;
        const float *g = wgrad + pp->offset;
        int64_t n = ct_tensor_numel(&pp->sig);
        CT_TRY(compare(r, pp->full_name, w, g, n, &e, err));
        *worst = fmax(*worst, e);
        CT_TRY(compare_direction(r, pp->full_name, w, g, n, r->o.seed + 4000 + (uint64_t)p, &e, err));
        *worst = fmax(*worst, e);
    }
    return CT_OK;
}

ct_status ct_gradcheck(ct_layer *layer, const ct_tensor *inputs, int n_in, ct_gradcheck_opts o, double *worst,
                       ct_error *err) {
    CT_TRY(check_args(layer, inputs, n_in, o, worst, err));
    *worst = 0;
    gc_run *r = calloc(1, sizeof *r);
    if (!r) return ct_error_set(err, CT_ERR_MEMORY, "gradcheck: out of memory");
    r->o = o;
    r->label = o.label ? o.label : ct_layer_name(layer);
    r->n_in = n_in;
    r->key = ct_key_from_seed(o.seed + 7);
    ct_device dev = ct_device_cpu();
    ct_tensor sigs[CT_LAYER_MAX_IO];
    float *gin_first[CT_LAYER_MAX_IO] = {0}, *wgrad = NULL, *g0 = NULL;
    ct_tensor gin[CT_LAYER_MAX_IO];
    bool net_live = false;
    ct_status st = CT_OK;
    for (int i = 0; i < n_in; i++) {
        sigs[i] = ct_tensor_sig(&inputs[i]);
        r->in[i] = inputs[i];
        if (inputs[i].dtype != CT_DTYPE_F32) continue;
        // A private copy of each f32 input, to perturb.
        if (!(r->in[i].data = alloc_floats((size_t)ct_tensor_numel(&inputs[i]), err))) {
            st = CT_ERR_MEMORY;
            goto done;
        }
        // An empty input may have no data: memcpy from NULL is undefined even for 0 bytes.
        if (inputs[i].data) memcpy(r->in[i].data, inputs[i].data, ct_tensor_nbytes(&inputs[i]));
    }
    if ((st = ct_net_init(&r->net, layer, sigs, n_in, ct_key_from_seed(o.seed), &dev, err)) != CT_OK) {
        ct_error_prefix(err, "gradcheck %s: init", r->label);
        goto done;
    }
    net_live = true;
    if (o.weight_noise > 0) {
        float *noise = alloc_floats(r->net.n_weights, err);
        if (!noise) {
            st = CT_ERR_MEMORY;
            goto done;
        }
        ct_random_uniform(ct_key_from_seed(o.seed + 5000), noise, r->net.n_weights, -o.weight_noise, o.weight_noise);
        for (size_t k = 0; k < r->net.n_weights; k++) r->net.weights[k] += noise[k];
        free(noise);
    }
    ct_arena_init(&r->arena, &dev);
    ct_ctx_init(&r->ctx, &r->arena);
    ct_net_bind(&r->net, &r->ctx, o.train);
    r->ctx.record = true;
    for (int i = 0; i < r->net.n_out; i++) {
        const ct_tensor *s = &r->net.out_sigs[i];
        if (s->dtype != CT_DTYPE_F32) continue;
        size_t n = (size_t)ct_tensor_numel(s);
        if (!(r->proj[i] = alloc_floats(n, err)) || !(r->proj_copy[i] = alloc_floats(n, err))) {
            st = CT_ERR_MEMORY;
            goto done;
        }
        ct_random_uniform(ct_key_from_seed(o.seed + 1000 + (uint64_t)i), r->proj[i], n, -1.0f, 1.0f);
        memcpy(r->proj_copy[i], r->proj[i], n * sizeof(float));
    }

    // Analytic gradients. The gradient slab starts at known random values g0,
    // not at zero: backward adds into it (fan-out and shared weights rely on
    // +=), so a layer that writes its gradient with = leaves g - g0 where the
    // numeric check expects g. A second forward and backward (check_all)
    // must then add g once more.
    if (!(wgrad = alloc_floats(r->net.n_weights, err)) || !(g0 = alloc_floats(r->net.n_weights, err))) {
        st = CT_ERR_MEMORY;
        goto done;
    }
    ct_random_uniform(ct_key_from_seed(o.seed + 2000), g0, r->net.n_weights, -1.0f, 1.0f);
    if (r->net.n_weights) memcpy(r->net.grads, g0, r->net.n_weights * sizeof(float));
    if ((st = backward_pass(r, gin, err)) != CT_OK) goto done;
    for (int i = 0; i < n_in; i++) {
        if (inputs[i].dtype != CT_DTYPE_F32 || !gin[i].data) continue;
        if (!(gin_first[i] = alloc_floats((size_t)ct_tensor_numel(&inputs[i]), err))) {
            st = CT_ERR_MEMORY;
            goto done;
        }
        memcpy(gin_first[i], gin[i].data, ct_tensor_nbytes(&inputs[i]));
    }
    for (size_t k = 0; k < r->net.n_weights; k++) wgrad[k] = (float)((double)r->net.grads[k] - g0[k]);
    st = check_all(r, gin_first, wgrad, g0, worst, err);

done:
    for (int i = 0; i < CT_LAYER_MAX_IO; i++) {
        free(gin_first[i]);
        if (i < n_in && inputs[i].dtype == CT_DTYPE_F32) free(r->in[i].data);
        free(r->proj[i]);
        free(r->proj_copy[i]);
    }
    free(wgrad);
    free(g0);
    if (net_live) {
        ct_ctx_free(&r->ctx);
        ct_arena_free(&r->arena);
        ct_net_free(&r->net);
    }
    free(r);
    return st;
}
