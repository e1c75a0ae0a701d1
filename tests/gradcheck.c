#include "gradcheck.h"

#define GRADCHECK_FLOOR 0.05

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

gradcheck_opts gradcheck_default_opts(void) {
    gradcheck_opts o = {1e-2, 48, true, 1, GRADCHECK_FLOOR};
    return o;
}

gradcheck_opts gradcheck_model_opts(double eps) {
    gradcheck_opts o = gradcheck_default_opts();
    o.eps = eps;
    o.floor = GRADCHECK_MODEL_FLOOR;
    return o;
}

void gradcheck_fill(ct_tensor *t, uint64_t seed, float lo, float hi) {
    ct_random_uniform(ct_key_from_seed(seed), t->data, (size_t)ct_tensor_numel(t), lo, hi);
}

typedef struct gc_run {
    ct_net net;
    ct_arena arena;
    ct_ctx ctx;
    ct_key key;
    int n_in;
    ct_tensor in[CT_LAYER_MAX_IO];
    float *proj[CT_LAYER_MAX_IO];       // r_i, one per f32 output (NULL for others)
    float *proj_copy[CT_LAYER_MAX_IO];  // to see that backward leaves them alone
} gc_run;

// L = sum_i <r_i, out_i> in double, in forward-only mode.
static int loss_at(gc_run *r, double *loss) {
    ct_tensor out[CT_LAYER_MAX_IO];
    ct_error err;
    r->ctx.record = false;
    ct_status st = ct_layer_forward(r->net.root, &r->ctx, r->in, out, r->key, &err);
    r->ctx.record = true;
    if (st != CT_OK) {
        fprintf(stderr, "gradcheck forward: %s\n", err.msg);
        ct_arena_reset(&r->arena);
        return -1;
    }
    double s = 0;
    for (int i = 0; i < r->net.n_out; i++) {
        if (out[i].dtype != CT_DTYPE_F32) continue;
        const float *o = out[i].data;
        for (int64_t k = 0; k < ct_tensor_numel(&out[i]); k++) s += (double)o[k] * r->proj[i][k];
    }
    ct_arena_reset(&r->arena);
    *loss = s;
    return 0;
}

// The numeric gradient at element k of x, via central differences.
static int numeric_at(gc_run *r, float *x, int64_t k, double eps, double *g) {
    float saved = x[k];
    double lp, lm;
    x[k] = (float)(saved + eps);
    double up = (double)x[k] - saved;
    if (loss_at(r, &lp)) return -1;
    x[k] = (float)(saved - eps);
    double down = saved - (double)x[k];
    if (loss_at(r, &lm)) return -1;
    x[k] = saved;
    *g = (lp - lm) / (up + down);
    return 0;
}

// An error that is NaN (a NaN gradient or loss) as +inf: NaN compares false
// with every bound, so it would pass the callers' checks and drop out of the
// largest error.
static double not_nan(double rel) { return isnan(rel) ? INFINITY : rel; }

// Compares analytic gradient ga with numeric ones at sampled elements of x.
static double compare(gc_run *r, const char *label, const char *what, float *x, const float *ga,
                      int64_t n, gradcheck_opts o) {
    double dd = 0, aa = 0, nn = 0;
    int m = n < o.max_elems ? (int)n : o.max_elems;
    for (int s = 0; s < m; s++) {
        int64_t k = n <= o.max_elems ? s : (int64_t)(ct_random_bits(ct_key_from_seed(o.seed + 99), (uint32_t)s) % (uint64_t)n);
        double g;
        if (numeric_at(r, x, k, o.eps, &g)) return -1;
        double a = ga ? ga[k] : 0.0;
        dd += (a - g) * (a - g);
        aa += a * a;
        nn += g * g;
    }
    // The floor keeps a gradient that is truly zero (numeric noise only) from
    // reading as a 100% error; a wrong gradient of norm above floor * tol
    // (5e-5 for one layer) still fails.
    double denom = sqrt(aa) + sqrt(nn);
    double rel = not_nan(sqrt(dd) / (denom > o.floor ? denom : o.floor));
    printf("  %-28s %-40s rel err %.2e  (|grad| %.3e)\n", label, what, rel, sqrt(aa));
    return rel;
}

// The derivative along a random direction v of every element of x (|v| =
// 1) against central differences along it: (L(x + eps v) - L(x - eps v)) /
// 2 eps by sum_k ga_k v_k, over the steps the floats took. compare perturbs
// at most max_elems elements, drawn with replacement (of 96, 39 distinct and
// never element 0), so a gradient wrong only at the others passed; here
// every element counts. A wrong element k shows as |delta_k v_k| against
// |<ga, v>| (|ga| / sqrt(n) on average): a backward that left element 0 of
// 96 without its gradient read 2.2e-7 in compare and 0.2 here.
static double compare_direction(gc_run *r, const char *label, const char *what, float *x, const float *ga,
                                int64_t n, uint64_t seed, gradcheck_opts o) {
    if (n == 0) return 0;
    float *saved = malloc((size_t)n * sizeof(float)), *v = malloc((size_t)n * sizeof(float));
    if (!saved || !v) {
        free(saved), free(v);
        return -1;
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
    double lp, lm, a = 0, gg = 0;
    for (int64_t k = 0; k < n; k++) x[k] = (float)(saved[k] + o.eps * v[k]);
    int bad = loss_at(r, &lp);
    for (int64_t k = 0; k < n; k++) {
        double up = (double)x[k] - saved[k], gk = ga ? ga[k] : 0.0;
        x[k] = (float)(saved[k] - o.eps * v[k]);
        a += gk * (up + (saved[k] - (double)x[k]));
        gg += gk * gk;
    }
    if (!bad) bad = loss_at(r, &lm);
    memcpy(x, saved, (size_t)n * sizeof(float));
    free(saved), free(v);
    if (bad) return -1;
    // Both as derivatives along v (per unit of eps), so the floor means what
    // it means in compare. <ga, v> is |ga| / sqrt(n) on average but may be
    // near 0 by chance, where numeric noise alone would read as a large
    // error (1.2e-3 on a projection of 5e-3 in 10 nested Residuals): the
    // denominator is at least that average.
    a /= 2 * o.eps;
    double g = (lp - lm) / (2 * o.eps);
    double denom = fmax(fabs(a) + fabs(g), sqrt(gg / (double)n));
    double rel = not_nan(fabs(a - g) / (denom > o.floor ? denom : o.floor));
    char along[96];
    snprintf(along, sizeof along, "%s, all %lld along v", what, (long long)n);
    printf("  %-28s %-40s rel err %.2e  (<grad, v> %.3e; held to twice the bound)\n", label, along, rel, a);
    // Every output's float noise enters one difference here, against the
    // one projection: on correct code it read up to 5.5e-4 with AVX-512
    // kernels and 9.4e-4 with AVX2 ones (DotProductCausalAttention(T 131)'s
    // input, qemu -cpu Haswell), against GRADCHECK_TOL 1e-3. So it counts
    // half: held to twice the bound, where the defects it is for read 100
    // times that (0.2, 0.029).
    return rel / 2;
}

// One forward with the tape and one backward from dL/dout_i = r_i, adding
// into the gradient slab; gin gets the input gradients (in the arena).
static int backward_pass(gc_run *r, const char *label, ct_tensor *gin) {
    ct_tensor out[CT_LAYER_MAX_IO], gout[CT_LAYER_MAX_IO];
    ct_error err;
    // A backward that never sets grad_in[i] leaves it as is: no gradient
    // (zeros, which the comparison fails), not the stack's stale contents
    // or the first pass's.
    memset(gin, 0, CT_LAYER_MAX_IO * sizeof *gin);
    if (ct_layer_forward(r->net.root, &r->ctx, r->in, out, r->key, &err) != CT_OK) {
        fprintf(stderr, "gradcheck %s: forward: %s\n", label, err.msg);
        return -1;
    }
    for (int i = 0; i < r->net.n_out; i++) {
        gout[i] = ct_tensor_sig(&out[i]);
        if (r->proj[i] && ct_tensor_same_sig(&out[i], &r->net.out_sigs[i])) gout[i].data = r->proj[i];
        else if (out[i].dtype == CT_DTYPE_F32) {
            fprintf(stderr, "gradcheck %s: output %d shape differs from init\n", label, i);
            return -1;
        }
    }
    if (ct_layer_backward(r->net.root, &r->ctx, gout, gin, r->key, &err) != CT_OK) {
        fprintf(stderr, "gradcheck %s: backward: %s\n", label, err.msg);
        return -1;
    }
    if (r->ctx.tape_len != 0) {
        fprintf(stderr, "gradcheck %s: tape not empty after backward (%d left)\n", label, r->ctx.tape_len);
        return -1;
    }
    // Gradients may alias each other, so no layer writes into a grad_out.
    for (int i = 0; i < r->net.n_out; i++)
        if (r->proj[i] && memcmp(r->proj[i], r->proj_copy[i], ct_tensor_nbytes(&r->net.out_sigs[i])) != 0) {
            fprintf(stderr, "gradcheck %s: backward wrote into the gradient of output %d\n", label, i);
            return -1;
        }
    return 0;
}

// After two passes from g0 the slab must hold g0 + 2 g, where g = wgrad is
// what the first pass added: the error per weight as compare's, the largest
// printed with its weight's name.
static double accumulation_error(const gc_run *r, const char *label, const float *g0, const float *wgrad) {
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
        double denom = sqrt(aa) + sqrt(bb);
        double rel = not_nan(sqrt(dd) / (denom > GRADCHECK_FLOOR ? denom : GRADCHECK_FLOOR));
        if (rel >= worst) worst = rel, worst_name = pp->full_name;
    }
    char what[256];
    snprintf(what, sizeof what, "weights: 2 backwards add 2 g (worst %s)", worst_name);
    printf("  %-28s %-40s rel err %.2e\n", label, what, worst);
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
// the first's, as compare's error (NULL data: zeros); printed.
static double repeat_error(const char *label, int i, const float *first, const float *second, int64_t n) {
    double dd = 0, aa = 0, bb = 0;
    for (int64_t k = 0; k < n; k++) {
        double a = first ? first[k] : 0.0, b = second ? second[k] : 0.0;
        dd += (a - b) * (a - b);
        aa += a * a;
        bb += b * b;
    }
    double denom = sqrt(aa) + sqrt(bb);
    double rel = not_nan(sqrt(dd) / (denom > GRADCHECK_FLOOR ? denom : GRADCHECK_FLOOR));
    char what[64];
    snprintf(what, sizeof what, "input %d: pass 2 (NaN arena) = pass 1", i);
    printf("  %-28s %-40s rel err %.2e\n", label, what, rel);
    return rel;
}

double gradcheck(const char *label, ct_layer *layer, const ct_tensor *inputs, int n_in,
                 gradcheck_opts o) {
    gc_run *r = calloc(1, sizeof *r);
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_tensor sigs[CT_LAYER_MAX_IO];
    double worst = 0;
    for (int i = 0; i < n_in; i++) {
        sigs[i] = ct_tensor_sig(&inputs[i]);
        r->in[i] = inputs[i];
        // A private copy of each f32 input, to perturb.
        if (inputs[i].dtype == CT_DTYPE_F32) {
            r->in[i].data = malloc(ct_tensor_nbytes(&inputs[i]));
            memcpy(r->in[i].data, inputs[i].data, ct_tensor_nbytes(&inputs[i]));
        }
    }
    r->n_in = n_in;
    r->key = ct_key_from_seed(o.seed + 7);
    if (ct_net_init(&r->net, layer, sigs, n_in, ct_key_from_seed(o.seed), &dev, &err) != CT_OK) {
        fprintf(stderr, "gradcheck %s: init: %s\n", label, err.msg);
        for (int i = 0; i < n_in; i++)
            if (inputs[i].dtype == CT_DTYPE_F32) free(r->in[i].data);
        free(r);
        return -1;
    }
    ct_arena_init(&r->arena, &dev);
    ct_ctx_init(&r->ctx, &r->arena);
    ct_net_bind(&r->net, &r->ctx, o.train);
    r->ctx.record = true;
    for (int i = 0; i < r->net.n_out; i++) {
        const ct_tensor *s = &r->net.out_sigs[i];
        if (s->dtype != CT_DTYPE_F32) continue;
        r->proj[i] = malloc(ct_tensor_nbytes(s) + 4);
        r->proj_copy[i] = malloc(ct_tensor_nbytes(s) + 4);
        ct_random_uniform(ct_key_from_seed(o.seed + 1000 + (uint64_t)i), r->proj[i],
                          (size_t)ct_tensor_numel(s), -1.0f, 1.0f);
        memcpy(r->proj_copy[i], r->proj[i], ct_tensor_nbytes(s));
    }

    // Analytic gradients. The gradient slab starts at known random values g0,
    // not at zero: backward adds into it (fan-out and shared weights rely on
    // +=), so a layer that writes its gradient with = leaves g - g0 where the
    // numeric check expects g. A second forward and backward must then add g
    // once more.
    ct_tensor gin[CT_LAYER_MAX_IO];
    float **gin_copy = calloc((size_t)n_in, sizeof *gin_copy);
    float *wgrad = malloc(r->net.n_weights * sizeof(float) + 4);
    float *g0 = malloc(r->net.n_weights * sizeof(float) + 4);
    ct_random_uniform(ct_key_from_seed(o.seed + 2000), g0, r->net.n_weights, -1.0f, 1.0f);
    if (r->net.n_weights) memcpy(r->net.grads, g0, r->net.n_weights * sizeof(float));
    if (backward_pass(r, label, gin)) goto failed_quiet;
    for (int i = 0; i < n_in; i++) {
        if (inputs[i].dtype != CT_DTYPE_F32 || !gin[i].data) continue;
        if (!ct_tensor_same_sig(&gin[i], &inputs[i])) {
            fprintf(stderr, "gradcheck %s: gradient of input %d has the wrong shape\n", label, i);
            goto failed_quiet;
        }
        gin_copy[i] = malloc(ct_tensor_nbytes(&inputs[i]));
        memcpy(gin_copy[i], gin[i].data, ct_tensor_nbytes(&inputs[i]));
    }
    for (size_t k = 0; k < r->net.n_weights; k++) wgrad[k] = (float)((double)r->net.grads[k] - g0[k]);
    ct_arena_reset(&r->arena);
    poison_arena(&r->arena);
    if (backward_pass(r, label, gin)) goto failed_quiet;

    printf("gradcheck %s:\n", label);
    if (r->net.n_params) {
        double e = accumulation_error(r, label, g0, wgrad);
        if (e > worst) worst = e;
    }
    for (int i = 0; i < n_in; i++) {
        if (inputs[i].dtype != CT_DTYPE_F32) continue;
        if (gin[i].data && !ct_tensor_same_sig(&gin[i], &inputs[i])) {
            fprintf(stderr, "gradcheck %s: gradient of input %d has the wrong shape in pass 2\n", label, i);
            goto failed_quiet;
        }
        double e = repeat_error(label, i, gin_copy[i], gin[i].data, ct_tensor_numel(&inputs[i]));
        if (e > worst) worst = e;
    }
    ct_arena_reset(&r->arena);
    for (int i = 0; i < n_in; i++) {
        if (inputs[i].dtype != CT_DTYPE_F32) continue;
        char what[64];
        snprintf(what, sizeof what, "input %d", i);
        double e = compare(r, label, what, r->in[i].data, gin_copy[i], ct_tensor_numel(&inputs[i]), o);
        if (e < 0) goto failed_quiet;
        if (e > worst) worst = e;
        e = compare_direction(r, label, what, r->in[i].data, gin_copy[i], ct_tensor_numel(&inputs[i]),
                              o.seed + 3000 + (uint64_t)i, o);
        if (e < 0) goto failed_quiet;
        if (e > worst) worst = e;
    }
    for (int p = 0; p < r->net.n_params; p++) {
        const ct_param *pp = r->net.params[p];
        double e = compare(r, label, pp->full_name, r->net.weights + pp->offset, wgrad + pp->offset,
                           ct_tensor_numel(&pp->sig), o);
        if (e < 0) goto failed_quiet;
        if (e > worst) worst = e;
        e = compare_direction(r, label, pp->full_name, r->net.weights + pp->offset, wgrad + pp->offset,
                              ct_tensor_numel(&pp->sig), o.seed + 4000 + (uint64_t)p, o);
        if (e < 0) goto failed_quiet;
        if (e > worst) worst = e;
    }
    goto done;
failed_quiet:
    worst = -1;
done:
    for (int i = 0; i < n_in; i++) {
        free(gin_copy[i]);
        if (inputs[i].dtype == CT_DTYPE_F32) free(r->in[i].data);
    }
    for (int i = 0; i < CT_LAYER_MAX_IO; i++) free(r->proj[i]), free(r->proj_copy[i]);
    free(gin_copy);
    free(wgrad);
    free(g0);
    ct_ctx_free(&r->ctx);
    ct_arena_free(&r->arena);
    ct_net_free(&r->net);
    free(r);
    return worst;
}
