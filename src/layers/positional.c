// Positional encodings, (B, T, D) -> (B, T, D), each out = x + pe:
//   PositionalEncoding   pe[:T] for T <= max_len, either a learned weight
//                        "embedding" (max_len, D) started at N(0, 0.02^2)
//                        or at the sinusoids of Vaswani et al. (Trax's), or
//                        those sinusoids fixed (no weights; computed once at
//                        init and kept with the layer). Trax's dropout on the
//                        learned table: in training, pe[:, d] x keep_d / (1 -
//                        rate), one (1, 1, D) mask from the step key (channel
//                        d kept iff ct_random_bits(key, d) >= rate 2^32), so
//                        whole channels drop for every example and position;
//   AxialPositionalEncoding and FixedBasePositionalEncoding, Trax's, below.
#include <stdio.h>
#include <string.h>

#include "ctrax/layers/core.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "layers/internal.h"

typedef struct positional_hp {
    int max_len;
    bool learned;
    float dropout;  // on the learned table, in training
    ct_initializer init;  // the learned table's start
    float *sinusoids;  // (max_len, D), set by init when !learned; owned
    int64_t d;         // D, set by init
} positional_hp;

static ct_status positional_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    const positional_hp *hp = l->hp;
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 3)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 (B, T, D)",
                             ct_tensor_sig_str(x, s, sizeof s));
    if (x->shape[1] > hp->max_len)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s is longer than max_len %d",
                             ct_tensor_sig_str(x, s, sizeof s), hp->max_len);
    if (hp->d > 0 && x->shape[2] != hp->d)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s does not fit encodings (%d,%lld)",
                             ct_tensor_sig_str(x, s, sizeof s), hp->max_len, (long long)hp->d);
    return CT_OK;
}

static ct_status positional_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out,
                                 ct_key key, ct_error *err) {
    positional_hp *hp = l->hp;
    hp->d = 0;  // D is whatever this init sees (a layer may join a new net)
    CT_TRY(positional_check(l, &in[0], "init", err));
    hp->d = in[0].shape[2];
    if (hp->learned) {
        ct_layer_declare_weight(l, ic, "embedding", ct_tensor_2d(CT_DTYPE_F32, hp->max_len, hp->d, NULL), hp->init,
                                key);
    } else {
        ct_free(hp->sinusoids);
        hp->sinusoids = NULL;
        // The fixed table is host memory outside the weight slab, so the
        // net's size check does not see it: D comes from the input's
        // signature, and max_len x D floats may pass this machine or size_t.
        char what[96];
        snprintf(what, sizeof what, "the (%d,%lld) sinusoid table", hp->max_len, (long long)hp->d);
        ct_tensor table = ct_tensor_2d(CT_DTYPE_F32, hp->max_len, hp->d, NULL);  // numel INT64_MAX on overflow
        if (ct_host_check_room((double)hp->max_len * (double)hp->d * sizeof(float), what, err) == CT_OK)
            hp->sinusoids = ct_calloc_checked((size_t)ct_tensor_numel(&table), sizeof(float), err, "%s", what);
        if (!hp->sinusoids) return ct_error_prefix(err, "layer %s (init)", l->path ? l->path : l->name);
        ct_positional_sinusoids(hp->sinusoids, hp->max_len, hp->d);
    }
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

static const float *positional_table(const ct_layer *l, const ct_ctx *c) {
    const positional_hp *hp = l->hp;
    return hp->learned ? ct_weight(c, l, 0) : hp->sinusoids;
}

static bool dropping(const ct_layer *l, const ct_ctx *c) {
    return c->train && ((const positional_hp *)l->hp)->dropout > 0.0f;
}

// The table's dropout scale of each channel in this training step: keep_d
// / (1 - rate) or 0, into scale (D).
static void channel_scales(const ct_layer *l, ct_key key, float *scale, int64_t D) {
    const float rate = ((const positional_hp *)l->hp)->dropout;
    uint64_t threshold = ct_dropout_threshold(rate);
    for (int64_t d = 0; d < D; d++) scale[d] = ct_random_bits(key, (uint32_t)d) >= threshold ? 1.0f / (1.0f - rate) : 0.0f;
}

static ct_status positional_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out,
                                    ct_key key, ct_error *err) {
    const ct_tensor *x = &in[0];
    CT_TRY(positional_check(l, x, "forward", err));
    const int64_t T = x->shape[1], D = x->shape[2];
    out[0] = ct_tensor_sig(x);
    // Elementwise, and backward needs only x's shape: over x when donated.
    if (ct_arena_donated(c->arena, x->data)) out[0].data = x->data;
    else CT_TRY(ct_ctx_alloc(c, &out[0], err));
    // Rows t < T of a (max_len, D) table are its first T * D floats.
    const float *pe = positional_table(l, c);
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    if (dropping(l, c)) {
        ct_tensor scaled = ct_tensor_2d(CT_DTYPE_F32, T + 1, D, NULL);  // T rows, then the D channel scales
        CT_TRY(ct_ctx_alloc(c, &scaled, err));
        float *table = scaled.data, *scale = table + T * D;
        channel_scales(l, key, scale, D);
        for (int64_t i = 0; i < T * D; i++) table[i] = pe[i] * scale[i % D];
        pe = table;
    }
    ct_positional_forward(out[0].data, x->data, pe, x->shape[0], T * D);
    ct_arena_reset_to(c->arena, mark);
    return ct_tape_push_sig(c, x, err);
}

static ct_status positional_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                     ct_key key, ct_error *err) {
    if (!ct_tape_pop_input_sig(c, grad_out, grad_in)) return CT_OK;
    // x + table: x's gradient is the output's, passed through (not a copy:
    // zeroing one and adding the output's to it took two passes a step).
    grad_in[0] = grad_out[0];
    if (!((const positional_hp *)l->hp)->learned) return CT_OK;
    const int64_t *shape = grad_in[0].shape;  // the input's (B, T, D)
    const int64_t T = shape[1], D = shape[2];
    float *dpe = ct_weight_grad(c, l, 0);
    if (!dropping(l, c)) {
        ct_positional_backward(dpe, grad_out[0].data, shape[0], T * D);
        return CT_OK;
    }
    // The dropped table: its gradient takes the same channel scales.
    ct_tensor work = ct_tensor_2d(CT_DTYPE_F32, T + 1, D, NULL);  // the table's gradient, then the scales
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    CT_TRY(ct_ctx_zeros(c, &work, err));
    float *dtable = work.data, *scale = dtable + T * D;
    channel_scales(l, key, scale, D);
    ct_positional_backward(dtable, grad_out[0].data, shape[0], T * D);
    for (int64_t i = 0; i < T * D; i++) dpe[i] += dtable[i] * scale[i % D];
    ct_arena_reset_to(c->arena, mark);
    return CT_OK;
}

static void positional_destroy(ct_layer *l) {
    positional_hp *hp = l->hp;
    ct_free(hp->sinusoids);
    ct_free(hp);
}

static const ct_layer_vtable positional_vt = {
    .type = "PositionalEncoding", .init = positional_init, .forward = positional_forward,
    .backward = positional_backward, .destroy = positional_destroy};

static ct_layer *positional_new(int max_len, bool learned, ct_initializer init, float dropout) {
    CT_ASSERT(max_len > 0 && dropout >= 0.0f && dropout < 1.0f);
    positional_hp hp = {.max_len = max_len, .learned = learned, .dropout = dropout, .init = init};
    return ct_layer_new_hp(&positional_vt, 1, 1, &hp, sizeof hp);
}

ct_layer *ct_positional_encoding_learned(int max_len) {
    return positional_new(max_len, true, (ct_initializer){CT_INIT_NORMAL, 0.02f}, 0.0f);
}
ct_layer *ct_positional_encoding_trainable_sinusoidal(int max_len, float dropout) {
    return positional_new(max_len, true, (ct_initializer){CT_INIT_SINUSOID, 0.0f}, dropout);
}
ct_layer *ct_positional_encoding_sinusoidal(int max_len) {
    return positional_new(max_len, false, (ct_initializer){CT_INIT_ZEROS, 0.0f}, 0.0f);
}

// ---- AxialPositionalEncoding: (B, T, D) -> (B, T, D) ------------------------
//
// Trax's AxialPositionalEncoding (REFORMER.md section 5). Position t, written
// in row-major digits (i_0, ..., i_{K-1}) of shape (n_0, ..., n_{K-1}), gets
// PE[t] = concat_k E_k[i_k], so K small tables (n_k, d_k) stand for a
// (prod n_k, D) one. T must equal prod n_k (Trax does not crop). Training
// dropout scales PE by keep / (1 - rate) with keep drawn over the noise shape
// (B, n_0, ..., n_{K-1}, D) where the broadcast dims have size 1: with dims
// 1..K (ReformerLM's) one (B, D) mask serves every position.

typedef struct axial_hp {
    int n_axes;                        // K
    int shape[CT_AXIAL_MAX_AXES];      // n_k
    int d_embs[CT_AXIAL_MAX_AXES];     // d_k
    float dropout;
    bool broadcast[CT_AXIAL_MAX_AXES + 2];  // per noise axis: B, n_0.., D
} axial_hp;

// "(64, 64)" for the n values of a list, into buf.
static const char *int_list_str(const int *v, int n, char *buf, size_t len) {
    size_t at = (size_t)snprintf(buf, len, "(");
    for (int k = 0; k < n && at < len; k++) at += (size_t)snprintf(buf + at, len - at, k ? ", %d" : "%d", v[k]);
    if (at < len) snprintf(buf + at, len - at, ")");
    return buf;
}

static ct_status axial_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    const axial_hp *hp = l->hp;
    char s[CT_SIG_STR_MAX], a[128];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 3)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 (B, T, D)",
                             ct_tensor_sig_str(x, s, sizeof s));
    int64_t T = 1, D = 0;
    bool too_long = false;  // shape multiplies past int64 (8 axes of up to 2^31 can)
    for (int k = 0; k < hp->n_axes; k++) too_long |= __builtin_mul_overflow(T, hp->shape[k], &T), D += hp->d_embs[k];
    if (too_long)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "shape %s multiplies past 2^63 but the input %s has length %lld",
                             int_list_str(hp->shape, hp->n_axes, a, sizeof a), ct_tensor_sig_str(x, s, sizeof s),
                             (long long)x->shape[1]);
    if (x->shape[1] != T)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "shape %s multiplies to %lld but the input %s has length %lld",
                             int_list_str(hp->shape, hp->n_axes, a, sizeof a), (long long)T,
                             ct_tensor_sig_str(x, s, sizeof s), (long long)x->shape[1]);
    if (x->shape[2] != D)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "d_embs %s sum to %lld but d_model is %lld (input %s)",
                             int_list_str(hp->d_embs, hp->n_axes, a, sizeof a), (long long)D,
                             (long long)x->shape[2], ct_tensor_sig_str(x, s, sizeof s));
    // Mask element j is drawn from counter j, a uint32.
    if (ct_tensor_numel(x) > (int64_t)UINT32_MAX + 1)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s has more than 2^32 elements",
                             ct_tensor_sig_str(x, s, sizeof s));
    return CT_OK;
}

static ct_status axial_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                            ct_error *err) {
    const axial_hp *hp = l->hp;
    CT_TRY(axial_check(l, &in[0], "init", err));
    // Trax's weight k is (1, 1..n_k..1, d_k); squeezed to (n_k, d_k), drawn
    // from N(0, 1) with split(key, K)[k].
    for (int k = 0; k < hp->n_axes; k++) {
        char name[CT_NAME_MAX];
        snprintf(name, sizeof name, "axis_%d", k);
        ct_layer_declare_weight(l, ic, name, ct_tensor_2d(CT_DTYPE_F32, hp->shape[k], hp->d_embs[k], NULL),
                                (ct_initializer){CT_INIT_NORMAL, 1.0f}, ct_key_split(key, (uint32_t)k));
    }
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

// Where position t's axis-k row and the noise strides come from: digit[k]
// of t (row-major), and the stride of each noise axis (0 when broadcast).
typedef struct axial_walk {
    int64_t digit[CT_AXIAL_MAX_AXES];
    int64_t stride[CT_AXIAL_MAX_AXES + 2];  // noise strides of B, n_0.., D
} axial_walk;

static void axial_strides(const axial_hp *hp, int64_t B, int64_t D, axial_walk *w) {
    int64_t n = 1;
    for (int j = hp->n_axes + 1; j >= 0; j--) {
        int64_t size = j == 0 ? B : j == hp->n_axes + 1 ? D : hp->shape[j - 1];
        w->stride[j] = hp->broadcast[j] ? 0 : n;
        if (!hp->broadcast[j]) n *= size;
    }
}

static void axial_digits(const axial_hp *hp, int64_t t, axial_walk *w) {
    for (int k = hp->n_axes - 1; k >= 0; k--) w->digit[k] = t % hp->shape[k], t /= hp->shape[k];
}

// The noise index of (b, t's digits, channel 0).
static int64_t axial_noise_base(const axial_hp *hp, const axial_walk *w, int64_t b) {
    int64_t j = b * w->stride[0];
    for (int k = 0; k < hp->n_axes; k++) j += w->digit[k] * w->stride[k + 1];
    return j;
}

typedef struct axial_drop {
    bool on;
    ct_key key;
    uint64_t threshold;
    float scale;
} axial_drop;

// A channel's multiplier: keep / (1 - rate) for noise element j, or 1
// without dropout.
static float axial_mult(const axial_drop *dr, int64_t j) {
    if (!dr->on) return 1.0f;
    return ct_random_bits(dr->key, (uint32_t)j) >= dr->threshold ? dr->scale : 0.0f;
}

// Forward (gx NULL): out = x + PE * mask. Backward (out NULL): gx = g and
// gE_k[i_k] += g * mask over the rows of axis k's block. x, g, out, gx:
// (B, T, D); E[k], gE[k]: (n_k, d_k).
static void axial_apply(const axial_hp *hp, const axial_drop *dr, float *const *E, float *const *gE,
                        const float *x, float *out, int64_t B, int64_t T, int64_t D) {
    axial_walk w;
    axial_strides(hp, B, D, &w);
    for (int64_t t = 0; t < T; t++) {
        axial_digits(hp, t, &w);
        for (int64_t b = 0; b < B; b++) {
            int64_t row = (b * T + t) * D, j0 = axial_noise_base(hp, &w, b), d = 0;
            for (int k = 0; k < hp->n_axes; k++)
                for (int64_t e = 0; e < hp->d_embs[k]; e++, d++) {
                    float m = axial_mult(dr, j0 + d * w.stride[hp->n_axes + 1]);
                    if (out) out[row + d] = x[row + d] + E[k][w.digit[k] * hp->d_embs[k] + e] * m;
                    else gE[k][w.digit[k] * hp->d_embs[k] + e] += x[row + d] * m;
                }
        }
    }
}

static axial_drop axial_dropout(const ct_layer *l, const ct_ctx *c, ct_key key) {
    const axial_hp *hp = l->hp;
    bool on = c->train && hp->dropout > 0.0f;
    return (axial_drop){on, key, on ? ct_dropout_threshold(hp->dropout) : 0, 1.0f / (1.0f - hp->dropout)};
}

static ct_status axial_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                               ct_error *err) {
    const axial_hp *hp = l->hp;
    const ct_tensor *x = &in[0];
    CT_TRY(axial_check(l, x, "forward", err));
    out[0] = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    float *E[CT_AXIAL_MAX_AXES];
    for (int k = 0; k < hp->n_axes; k++) E[k] = ct_weight(c, l, k);
    axial_drop dr = axial_dropout(l, c, key);
    axial_apply(hp, &dr, E, NULL, x->data, out[0].data, x->shape[0], x->shape[1], x->shape[2]);
    return ct_tape_push_sig(c, x, err);
}

static ct_status axial_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                ct_key key, ct_error *err) {
    (void)err;
    const axial_hp *hp = l->hp;
    if (!ct_tape_pop_input_sig(c, grad_out, grad_in)) return CT_OK;
    grad_in[0] = grad_out[0];  // x + PE: the input's gradient passes through
    float *gE[CT_AXIAL_MAX_AXES];
    for (int k = 0; k < hp->n_axes; k++) gE[k] = ct_weight_grad(c, l, k);
    axial_drop dr = axial_dropout(l, c, key);
    const int64_t *s = grad_out[0].shape;
    axial_apply(hp, &dr, NULL, gE, grad_out[0].data, NULL, s[0], s[1], s[2]);
    return CT_OK;
}

static const ct_layer_vtable axial_vt = {
    .type = "AxialPositionalEncoding", .init = axial_init, .forward = axial_forward, .backward = axial_backward};

ct_layer *ct_axial_positional_encoding(int n_axes, const int *shape, const int *d_embs, float dropout,
                                       int n_broadcast_dims, const int *broadcast_dims) {
    CT_ASSERT(n_axes >= 1 && n_axes <= CT_AXIAL_MAX_AXES && dropout >= 0.0f && dropout < 1.0f);
    axial_hp hp = {.n_axes = n_axes, .dropout = dropout};
    for (int k = 0; k < n_axes; k++) {
        CT_ASSERT(shape[k] > 0 && d_embs[k] > 0);
        hp.shape[k] = shape[k], hp.d_embs[k] = d_embs[k];
    }
    // Noise axes are (B, n_0, ..., n_{K-1}, D); negative dims count from
    // the end, as Python's noise_shape[dim] does.
    for (int i = 0; i < n_broadcast_dims; i++) {
        int j = broadcast_dims[i] < 0 ? broadcast_dims[i] + n_axes + 2 : broadcast_dims[i];
        CT_ASSERT(j >= 0 && j < n_axes + 2);
        hp.broadcast[j] = true;
    }
    return ct_layer_new_hp(&axial_vt, 1, 1, &hp, sizeof hp);
}

// ---- FixedBasePositionalEncoding: (B, T, D) -> (B, T, D) --------------------
//
// Trax's FixedBasePositionalEncoding (trax/layers/research/position_encodings.py),
// what ReformerLM's pos_type='fixed-base' builds with its defaults: bases
// (11, 13, 14, 15), 8 digits, start_from_zero_one_in 100,
// base_dropout_one_in 100. Position p's digit i in base r is
// (p / r^i) mod r; D is split in n_digits blocks of d_w = D / n_digits, and
// block i of PE[p] = sum over bases r of digit_i^r(p) * W[r][i] (d_w
// weights each, U(+-1e-4)); position 0 also adds start_vec (D). In training
// each example's positions start at a random offset in [0, max_pos - T)
// (max_pos = min(bases)^n_digits), or at 0 one time in
// start_from_zero_one_in, and one time in base_dropout_one_in the example's
// digit embeddings are zeroed (one draw for all bases, as Trax's shared
// rng3). Keys: init W[r][i] from split(split(key, 0), i) -- the same for
// every base, as Trax -- and start_vec from split(key, 1); a step's draws
// for example b from split(key, 0..2) counters (2b, 2b + 1). The draws are
// ctrax's threefry bits, not JAX's randint.

typedef struct fixed_base_hp {
    int n_bases, n_digits;
    int bases[CT_FIXED_BASE_MAX_BASES];
    int start_from_zero_one_in, base_dropout_one_in;
    int64_t max_pos;  // min(bases)^n_digits
} fixed_base_hp;

static ct_status fixed_base_check(const ct_layer *l, const ct_tensor *x, const char *op, ct_error *err) {
    const fixed_base_hp *hp = l->hp;
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 3)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 (B, T, D)",
                             ct_tensor_sig_str(x, s, sizeof s));
    if (x->shape[2] % hp->n_digits != 0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "d_model %lld of input %s is not a multiple of n_digits %d",
                             (long long)x->shape[2], ct_tensor_sig_str(x, s, sizeof s), hp->n_digits);
    if (x->shape[1] >= hp->max_pos)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s has length %lld, not below max_pos %lld",
                             ct_tensor_sig_str(x, s, sizeof s), (long long)x->shape[1], (long long)hp->max_pos);
    return CT_OK;
}

static ct_status fixed_base_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                                 ct_error *err) {
    const fixed_base_hp *hp = l->hp;
    CT_TRY(fixed_base_check(l, &in[0], "init", err));
    int64_t D = in[0].shape[2];
    ct_initializer u = {CT_INIT_UNIFORM, 1e-4f};
    for (int r = 0; r < hp->n_bases; r++)
        for (int i = 0; i < hp->n_digits; i++) {
            char name[CT_NAME_MAX];
            snprintf(name, sizeof name, "base%d_digit%d", hp->bases[r], i);
            ct_layer_declare_weight(l, ic, name, ct_tensor_1d(CT_DTYPE_F32, D / hp->n_digits, NULL), u,
                                    ct_key_split(ct_key_split(key, 0), (uint32_t)i));
        }
    ct_layer_declare_weight(l, ic, "start_vec", ct_tensor_1d(CT_DTYPE_F32, D, NULL), u, ct_key_split(key, 1));
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

// A uniform integer in [0, n) for example b from 64 random bits of k.
static int64_t fixed_base_randint(ct_key k, int64_t b, int64_t n) {
    uint64_t hi = ct_random_bits(k, (uint32_t)(2 * b)), lo = ct_random_bits(k, (uint32_t)(2 * b + 1));
    return (int64_t)(((hi << 32) | lo) % (uint64_t)n);
}

// Example b's first position and whether its digit embeddings are kept.
static int64_t fixed_base_start(const fixed_base_hp *hp, bool train, ct_key key, int64_t b, int64_t T,
                                float *keep) {
    *keep = 1.0f;
    if (!train) return 0;
    if (fixed_base_randint(ct_key_split(key, 2), b, hp->base_dropout_one_in) == 0) *keep = 0.0f;
    if (fixed_base_randint(ct_key_split(key, 0), b, hp->start_from_zero_one_in) == 0) return 0;
    return fixed_base_randint(ct_key_split(key, 1), b, hp->max_pos - T);
}

// Forward (gW NULL): y = x + PE. Backward (y NULL): gW += the digits times
// x (the output gradient) and gstart += x at position 0; the input gradient
// is x itself. W[r * n_digits + i]: (d_w); x, y: (B, T, D).
static void fixed_base_apply(const fixed_base_hp *hp, bool train, ct_key key, float *const *W, float *const *gW,
                             const float *x, float *y, int64_t B, int64_t T, int64_t D) {
    int64_t dw = D / hp->n_digits;
    int nw = hp->n_bases * hp->n_digits;
    for (int64_t b = 0; b < B; b++) {
        float keep;
        int64_t start = fixed_base_start(hp, train, key, b, T, &keep);
        for (int64_t t = 0; t < T; t++) {
            const float *xr = x + (b * T + t) * D;
            if (y) memcpy(y + (b * T + t) * D, xr, (size_t)D * sizeof(float));
            for (int r = 0; r < hp->n_bases && keep != 0.0f; r++) {
                int64_t p = start + t;
                for (int i = 0; i < hp->n_digits; i++, p /= hp->bases[r]) {
                    float digit = (float)(p % hp->bases[r]);
                    int w = r * hp->n_digits + i;
                    for (int64_t e = 0; e < dw; e++) {
                        if (y) y[(b * T + t) * D + i * dw + e] += digit * W[w][e];
                        else gW[w][e] += digit * xr[i * dw + e];
                    }
                }
            }
            for (int64_t d = 0; t == 0 && d < D; d++) {  // start_vec marks the first position
                if (y) y[b * T * D + d] += W[nw][d];
                else gW[nw][d] += xr[d];
            }
        }
    }
}

static ct_status fixed_base_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                    ct_error *err) {
    const fixed_base_hp *hp = l->hp;
    const ct_tensor *x = &in[0];
    CT_TRY(fixed_base_check(l, x, "forward", err));
    out[0] = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    float *W[CT_FIXED_BASE_MAX_BASES * CT_FIXED_BASE_MAX_DIGITS + 1];
    for (int w = 0; w < l->n_weights; w++) W[w] = ct_weight(c, l, w);
    fixed_base_apply(hp, c->train, key, W, NULL, x->data, out[0].data, x->shape[0], x->shape[1], x->shape[2]);
    return ct_tape_push_sig(c, x, err);
}

static ct_status fixed_base_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                                     ct_key key, ct_error *err) {
    (void)err;
    if (!ct_tape_pop_input_sig(c, grad_out, grad_in)) return CT_OK;
    grad_in[0] = grad_out[0];  // x + PE: the input's gradient passes through
    float *gW[CT_FIXED_BASE_MAX_BASES * CT_FIXED_BASE_MAX_DIGITS + 1];
    for (int w = 0; w < l->n_weights; w++) gW[w] = ct_weight_grad(c, l, w);
    const int64_t *s = grad_out[0].shape;
    fixed_base_apply(l->hp, c->train, key, NULL, gW, grad_out[0].data, NULL, s[0], s[1], s[2]);
    return CT_OK;
}

static const ct_layer_vtable fixed_base_vt = {.type = "FixedBasePositionalEncoding",
                                              .init = fixed_base_init,
                                              .forward = fixed_base_forward,
                                              .backward = fixed_base_backward};

ct_layer *ct_fixed_base_positional_encoding(int n_bases, const int *bases, int n_digits, int start_from_zero_one_in,
                                            int base_dropout_one_in) {
    CT_ASSERT(n_bases >= 1 && n_bases <= CT_FIXED_BASE_MAX_BASES && n_digits >= 1 &&
              n_digits <= CT_FIXED_BASE_MAX_DIGITS && start_from_zero_one_in >= 1 && base_dropout_one_in >= 1);
    fixed_base_hp hp = {.n_bases = n_bases, .n_digits = n_digits, .start_from_zero_one_in = start_from_zero_one_in,
                        .base_dropout_one_in = base_dropout_one_in, .max_pos = 1};
    int min_base = bases[0];
    for (int r = 0; r < n_bases; r++) {
        CT_ASSERT(bases[r] >= 2);
        hp.bases[r] = bases[r];
        if (bases[r] < min_base) min_base = bases[r];
    }
    // max_pos stays below 2^62 so positions and the start draw fit int64.
    for (int i = 0; i < n_digits; i++) {
        CT_ASSERT(hp.max_pos <= ((int64_t)1 << 62) / min_base);
        hp.max_pos *= min_base;
    }
    return ct_layer_new_hp(&fixed_base_vt, 1, 1, &hp, sizeof hp);
}

ct_layer *ct_fixed_base_positional_encoding_trax(void) {
    return ct_fixed_base_positional_encoding(4, (const int[]){11, 13, 14, 15}, 8, 100, 100);
}
