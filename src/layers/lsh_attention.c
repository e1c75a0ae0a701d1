// LSHSelfAttention (Trax's): projections, hashing with the buckets kept in
// state, the per-(b, h) LSH kernel, the output projection summed over heads
// and the two dropouts. See include/ctrax/layers/lsh_attention.h (the state
// and how a recompute sees the same buckets).
//
// Tape (forward, recording): x, the mask input (masked), q (B,H,T,dk), v, o
// (B,H,T,dv), lse_r (B,H,R,T), buckets (B,H,R T): linear in T. Each round's
// output o_r (R,T,dv) lives only in a thread's work area: backward does
// not need it (kernels/cpu/lsh_attention.c, combine_backward). The buckets
// are copied to the tape so that backward never reads the state (another
// forward may have hashed since).
#include "ctrax/layers/lsh_attention.h"

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "ctrax/core/blas.h"
#include "ctrax/layers/layer_author.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/chunked_attention.h"
#include "kernels/cpu/lsh_attention.h"
#include "layers/attention_internal.h"
#include "layers/internal.h"

// The "hash" state: the hash key (two words), the forward count, the step
// key the stored buckets were hashed under (two words) and their T; each
// 32-bit word as two exact 16-bit floats.
enum { HASH_KEY = 0, HASH_COUNT = 4, HASH_TAG_KEY = 6, HASH_TAG_T = 10, HASH_N = 11 };

typedef struct lsh_hp {
    ct_lsh_self_attention_params p;
    // Set by init: D, the state's B and its length Lb (max_length_for_buckets,
    // or init's T when that is 0): the longest T a forward takes.
    int64_t d_model, init_B, len_buckets;
    int wq, wv, wo, s_buckets, s_hash;
    ct_key hash_base;  // split(init key, 4): the hash key before the first forward
} lsh_hp;

ct_lsh_self_attention_params ct_lsh_self_attention_default_params(void) {
    return (ct_lsh_self_attention_params){.n_heads = 2, .d_qk = 64, .d_v = 64, .chunk_len = 128,
                                          .n_chunks_before = 1, .n_hashes = 1};
}

static ct_status lsh_check_params(const ct_layer *l, ct_error *err) {
    const ct_lsh_self_attention_params *p = &((const lsh_hp *)l->hp)->p;
    if (p->n_heads <= 0 || p->d_qk <= 0 || p->d_v <= 0 || p->n_hashes <= 0 || p->chunk_len <= 0)
        return ct_layer_fail(l, err, CT_ERR_ARG, "init",
                             "n_heads %d, d_qk %d, d_v %d, n_hashes %d and chunk_len %d must be positive", p->n_heads,
                             p->d_qk, p->d_v, p->n_hashes, p->chunk_len);
    if (p->n_chunks_before < 0 || p->n_chunks_after < 0 || p->max_length_for_buckets < 0)
        return ct_layer_fail(l, err, CT_ERR_ARG, "init",
                             "n_chunks_before %d, n_chunks_after %d and max_length_for_buckets %d must not be negative",
                             p->n_chunks_before, p->n_chunks_after, p->max_length_for_buckets);
    for (int j = 0; j < CT_LSH_MAX_BUCKET_FACTORS; j++)
        if (p->n_buckets[j] < 0 || p->n_buckets[j] % 2 != 0 || (j > 0 && p->n_buckets[j] && !p->n_buckets[j - 1]))
            return ct_layer_fail(l, err, CT_ERR_ARG, "init",
                                 "n_buckets[%d] = %d: each factor must be even and positive, the unused entries 0 "
                                 "after them (all 0: from the length)",
                                 j, p->n_buckets[j]);
    return ct_attention_check_dropouts(l, p->attention_dropout, p->output_dropout, err);
}

// The bucket factors f (n_f of them) for length T: the parameter, or Trax's
// nb = 2 max(1, T / m), factored as [2^ceil(log2(sqrt(nb))), 2 (nb / (2 f1))]
// when over 128.
static int bucket_factors(const ct_lsh_self_attention_params *p, int64_t T, int f[CT_LSH_MAX_BUCKET_FACTORS]) {
    if (p->n_buckets[0]) {
        int n = 0;
        while (n < CT_LSH_MAX_BUCKET_FACTORS && p->n_buckets[n]) f[n] = p->n_buckets[n], n++;
        return n;
    }
    int64_t nb = 2 * (T / p->chunk_len > 1 ? T / p->chunk_len : 1);
    if (nb <= 128) {
        f[0] = (int)nb;
        return 1;
    }
    f[0] = 1 << (int)ceil(log2(sqrt((double)nb)));
    f[1] = (int)(2 * (nb / (2 * f[0])));
    return 2;
}

// The kernel's dimensions for x (B, T, D), after checking x against the
// layer and the state. f/n_f: the bucket factors.
static ct_status lsh_dims(const ct_layer *l, const ct_ctx *c, const ct_tensor *x, const char *op, ct_lsh_dims *d,
                          int f[CT_LSH_MAX_BUCKET_FACTORS], int *n_f, ct_error *err) {
    const lsh_hp *hp = l->hp;
    const ct_lsh_self_attention_params *p = &hp->p;
    char s[CT_SIG_STR_MAX];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 3)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input is %s, expected f32 (B, T, D)",
                             ct_tensor_sig_str(x, s, sizeof s));
    if (hp->d_model > 0 && x->shape[2] != hp->d_model)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "input %s does not fit the layer (D %lld)",
                             ct_tensor_sig_str(x, s, sizeof s), (long long)hp->d_model);
    const int64_t T = x->shape[1], R = p->n_hashes;
    // An eval forward hashes into its own memory (step_buckets): any B and T.
    // A training forward keeps its buckets in the state, which holds R Lb
    // per (b, h) of init's B: at init (d_model 0) Lb is still to be set from
    // max_length_for_buckets (T itself when 0).
    const bool stored = !c || c->train;
    if (stored && hp->d_model > 0 && x->shape[0] != hp->init_B)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "training input %s does not fit the buckets state, sized for init's B %lld (evals take "
                             "any B)",
                             ct_tensor_sig_str(x, s, sizeof s), (long long)hp->init_B);
    const int64_t Lb = hp->d_model > 0 ? hp->len_buckets : p->max_length_for_buckets ? p->max_length_for_buckets : T;
    if (stored && T > Lb) {
        if (p->max_length_for_buckets)
            return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                                 "length T=%lld of training input %s is over max_length_for_buckets %d (the buckets "
                                 "state's length; evals take any T)",
                                 (long long)T, ct_tensor_sig_str(x, s, sizeof s), p->max_length_for_buckets);
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "length T=%lld of training input %s is over init's T=%lld, the buckets state's length "
                             "(max_length_for_buckets 0; set it for longer inputs; evals take any T)",
                             (long long)T, ct_tensor_sig_str(x, s, sizeof s), (long long)Lb);
    }
    // A (b, h)'s R T rows are sorted with 32-bit indices (the kernel's perm).
    if (R * T > INT32_MAX)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "n_hashes %d x length T=%lld of input %s is over 2^31 - 1 rows (the sort's indices are "
                             "32-bit)",
                             p->n_hashes, (long long)T, ct_tensor_sig_str(x, s, sizeof s));
    if ((R * T) % p->chunk_len != 0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op,
                             "n_hashes %d x length T=%lld of input %s is not a multiple of chunk_len %d", p->n_hashes,
                             (long long)T, ct_tensor_sig_str(x, s, sizeof s), p->chunk_len);
    CT_TRY(ct_attention_check_window(l, R * T / p->chunk_len, p->n_chunks_before, p->n_chunks_after, op, err));
    *n_f = bucket_factors(p, T, f);
    // masked: Trax's extra bucket for padding, after the hashed ones.
    int64_t NB = 1;
    bool even = true;
    for (int j = 0; j < *n_f; j++) {
        even &= f[j] > 0 && f[j] % 2 == 0;
        NB = NB < (1 << 24) ? NB * f[j] : NB;
    }
    NB += p->masked ? 1 : 0;
    if (!even || NB * R >= (1 << 24))
        return ct_layer_fail(l, err, CT_ERR_ARG, op,
                             "%d bucket factors (the first %d) must be even, with n_hashes x their product under 2^24",
                             *n_f, f[0]);
    *d = (ct_lsh_dims){.T = T, .dk = p->d_qk, .dv = p->d_v, .R = R, .NB = NB, .m = p->chunk_len,
                       .before = p->n_chunks_before, .after = p->n_chunks_after, .causal = p->causal,
                       .dropout = c && c->train ? p->attention_dropout : 0.0f};
    double mask = (double)d->m * (double)d->m * (double)(1 + d->before + d->after);
    if (d->dropout > 0.0f && mask > 4294967296.0)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, op, "attention dropout mask (chunk_len %lld) over 2^32 elements",
                             (long long)d->m);
    return CT_OK;
}

static ct_status lsh_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                          ct_error *err) {
    lsh_hp *hp = l->hp;
    const ct_lsh_self_attention_params *p = &hp->p;
    hp->d_model = 0;
    CT_TRY(lsh_check_params(l, err));
    ct_lsh_dims d;
    int f[CT_LSH_MAX_BUCKET_FACTORS], n_f;
    CT_TRY(lsh_dims(l, NULL, &in[0], "init", &d, f, &n_f, err));
    if (p->masked) CT_TRY(ct_attention_check_mask(l, &in[0], &in[1], "init", err));
    int64_t D = hp->d_model = in[0].shape[2], H = p->n_heads;
    hp->init_B = in[0].shape[0];
    hp->len_buckets = p->max_length_for_buckets ? p->max_length_for_buckets : in[0].shape[1];
    float lim_qk = (float)sqrt(6.0 / (double)(D + p->d_qk * H)), lim_v = (float)sqrt(6.0 / (double)(D + p->d_v * H));
    hp->wq = ct_attention_declare_heads(l, ic, "Wq", p->n_heads, D, p->d_qk, lim_qk, key, 0);
    hp->wv = ct_attention_declare_heads(l, ic, "Wv", p->n_heads, D, p->d_v, lim_v, key, 2);
    hp->wo = ct_attention_declare_heads(l, ic, "Wo", p->n_heads, p->d_v, D, lim_v, key, 3);
    ct_initializer zeros = {CT_INIT_ZEROS, 0.0f};
    // The buckets are a cache of the last forward's hashing (tagged with its
    // key and length), sized for one device's rows.
    hp->s_buckets = ct_layer_declare_cache(
        l, ic, "buckets", ct_tensor_2d(CT_DTYPE_F32, hp->init_B * H, p->n_hashes * hp->len_buckets, NULL));
    hp->s_hash = ct_layer_declare_state(l, ic, "hash", ct_tensor_1d(CT_DTYPE_F32, HASH_N, NULL), zeros, key);
    hp->hash_base = ct_key_split(key, 4);
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}

// A 32-bit word as two exact 16-bit floats, and back.
static void put_u32(float *s, uint32_t v) { s[0] = (float)(v & 0xffffu), s[1] = (float)(v >> 16); }
static uint32_t get_u32(const float *s) { return (uint32_t)s[0] | ((uint32_t)s[1] << 16); }

// Whether the stored buckets were computed under this step key for this T.
static bool tag_matches(const float *hs, ct_key key, int64_t T) {
    return hs[HASH_TAG_T] == (float)T && get_u32(hs + HASH_TAG_KEY) == key.w[0] &&
           get_u32(hs + HASH_TAG_KEY + 2) == key.w[1];
}

// Hashes q (B,H,T,dk) with the count's rotations (padding, where mask
// (B,T) is 0, into the extra bucket) into sb, row floats per (b, h) (zero
// past R T), then advances the count. stored: sb is the state's buckets,
// tagged with key and T.
static ct_status hash_buckets(ct_layer *l, ct_ctx *c, float *sb, int64_t row, bool stored, const float *q,
                              const float *mask, int64_t B, const ct_lsh_dims *d, const int *f, int n_f, ct_key key,
                              ct_error *err) {
    const lsh_hp *hp = l->hp;
    float *hs = ct_state(c, l, hp->s_hash);
    const int64_t H = hp->p.n_heads;
    int64_t n_rot = 0;  // the rotations' width: half of each factor
    for (int j = 0; j < n_f; j++) n_rot += f[j] / 2;
    // Trax's (next, sub) = split(state key): sub draws the rotations, next
    // is stored. A zero count means the state holds no key yet (it starts
    // as zeros): the init key's split(4) is the first.
    uint32_t count = get_u32(hs + HASH_COUNT);
    ct_key key_now = count ? (ct_key){{get_u32(hs + HASH_KEY), get_u32(hs + HASH_KEY + 2)}} : hp->hash_base;
    ct_key hk = ct_key_split(key_now, 1), next = ct_key_split(key_now, 0);
    // One rotation (dk, R, n_rot) per (example, head), drawn from its own
    // key, so the pairs hash in parallel with the same bits at any thread
    // count; examples are numbered in the global batch (c->first_row), so
    // data-parallel replicas draw what one device draws for the whole batch.
    const int64_t first = c->first_row * H;
    const int64_t per = d->dk * d->R * n_rot;
    ct_tensor rot = ct_tensor_1d(CT_DTYPE_F32, B * H * per, NULL);
    CT_TRY(ct_ctx_alloc(c, &rot, err));
#pragma omp parallel for schedule(static)
    for (int64_t s = 0; s < B * H; s++) {
        float *rs = (float *)rot.data + s * per;
        ct_random_normal(ct_key_split(hk, (uint32_t)(first + s)), rs, (size_t)per, 1.0f);
        memset(sb + s * row, 0, (size_t)row * sizeof(float));  // zero past R T
        ct_lsh_hash(sb + s * row, q + s * d->T * d->dk, mask ? mask + s / H * d->T : NULL, rs, d->T, d->dk, d->R, f,
                    n_f);
    }
    put_u32(hs + HASH_KEY, next.w[0]);
    put_u32(hs + HASH_KEY + 2, next.w[1]);
    put_u32(hs + HASH_COUNT, count + 1);
    if (stored) {
        put_u32(hs + HASH_TAG_KEY, key.w[0]);
        put_u32(hs + HASH_TAG_KEY + 2, key.w[1]);
        hs[HASH_TAG_T] = (float)d->T;
    }
    return CT_OK;
}

static float out_rate(const ct_layer *l, const ct_ctx *c) {
    return c->train ? ((const lsh_hp *)l->hp)->p.output_dropout : 0.0f;
}

// The tensors of one forward, in tape order after x (and the mask).
enum { T_Q, T_V, T_O, T_LSER, T_BK, T_N };

static ct_status alloc_heads(ct_ctx *c, int64_t B, int64_t H, const ct_lsh_dims *d, ct_tensor *t, ct_error *err) {
    const int64_t T = d->T, R = d->R;
    t[T_Q] = ct_tensor_make(CT_DTYPE_F32, 4, (int64_t[]){B, H, T, d->dk}, NULL);
    t[T_V] = ct_tensor_make(CT_DTYPE_F32, 4, (int64_t[]){B, H, T, d->dv}, NULL);
    t[T_O] = ct_tensor_make(CT_DTYPE_F32, 4, (int64_t[]){B, H, T, d->dv}, NULL);
    t[T_LSER] = ct_tensor_make(CT_DTYPE_F32, 4, (int64_t[]){B, H, R, T}, NULL);
    t[T_BK] = ct_tensor_3d(CT_DTYPE_F32, B, H, R * T, NULL);
    for (int i = 0; i < T_N; i++) CT_TRY(ct_ctx_alloc(c, &t[i], err));
    return CT_OK;
}

// Thread slots for the (b, h) loop (ct_blas_thread_slots, at most B H) and
// their work area (floats each).
static int n_slots(int64_t BH) {
    int64_t n = ct_blas_thread_slots();
    return (int)(n > BH ? (BH > 0 ? BH : 1) : n);
}

// The buckets of this step into t[T_BK]. Training: the stored ones when
// the tag matches, else freshly hashed into the state. Eval: hashed
// straight into t[T_BK], whatever B and T, the state's buckets untouched
// (only a training step reruns a forward on one key, for backward's
// recomputation; an eval forward runs once). The rotations come from the
// state's hash key in both modes, as Trax's, not from the key passed in.
// mask: (B,T) or NULL.
static ct_status step_buckets(ct_layer *l, ct_ctx *c, ct_tensor *t, const float *mask, int64_t B,
                              const ct_lsh_dims *d, const int *f, int n_f, ct_key key, ct_error *err) {
    const lsh_hp *hp = l->hp;
    const int64_t BH = B * hp->p.n_heads, row = d->R * hp->len_buckets, RT = d->R * d->T;
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    if (!c->train) {
        CT_TRY(hash_buckets(l, c, t[T_BK].data, RT, false, t[T_Q].data, mask, B, d, f, n_f, key, err));
        ct_arena_reset_to(c->arena, mark);
        return CT_OK;
    }
    if (!tag_matches(ct_state(c, l, hp->s_hash), key, d->T)) {
        CT_TRY(hash_buckets(l, c, ct_state(c, l, hp->s_buckets), row, true, t[T_Q].data, mask, B, d, f, n_f, key,
                            err));
        ct_arena_reset_to(c->arena, mark);
    }
    const float *sb = ct_state(c, l, hp->s_buckets);
    for (int64_t s = 0; s < BH; s++) memcpy((float *)t[T_BK].data + s * RT, sb + s * row, (size_t)RT * sizeof(float));
    return CT_OK;
}

// The LSH kernel over every (b, h): lse_r and the combined o. mask: (B,T)
// or NULL.
static ct_status heads_attend(ct_ctx *c, ct_tensor *t, const float *mask, int64_t H, int64_t BH, ct_key key,
                              const ct_lsh_dims *d, ct_error *err) {
    const int ns = n_slots(BH);
    // Each slot: the kernel's work, R floats for the rounds' weights, then
    // the rounds' outputs o_r (R, T, dv); slots start at multiples of 16
    // floats (the work begins with int64s).
    const int64_t T = d->T, R = d->R, wf = ct_lsh_work_floats(d, false);
    const int64_t per = (wf + R + R * T * d->dv + 15) / 16 * 16;
    ct_tensor work = ct_tensor_1d(CT_DTYPE_F32, ns * per, NULL);
    CT_TRY(ct_ctx_alloc(c, &work, err));
#pragma omp parallel for schedule(static) num_threads(ct_blas_slot_threads(ns))
    for (int64_t s = 0; s < BH; s++) {
        float *w = (float *)work.data + (int64_t)omp_get_thread_num() * per;
        float *o_r = w + wf + R, *lse_r = (float *)t[T_LSER].data + s * R * T;
        ct_lsh_forward(o_r, lse_r, (float *)t[T_Q].data + s * T * d->dk, (float *)t[T_V].data + s * T * d->dv,
                       mask ? mask + s / H * T : NULL, (float *)t[T_BK].data + s * R * T, w, key, d);
        ct_lsh_combine((float *)t[T_O].data + s * T * d->dv, o_r, lse_r, w + wf, d);
    }
    return CT_OK;
}

static ct_status lsh_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                             ct_error *err) {
    const lsh_hp *hp = l->hp;
    const ct_tensor *x = &in[0], *mask = hp->p.masked ? &in[1] : NULL;
    ct_lsh_dims d;
    int f[CT_LSH_MAX_BUCKET_FACTORS], n_f;
    CT_TRY(lsh_dims(l, c, x, "forward", &d, f, &n_f, err));
    if (mask) CT_TRY(ct_attention_check_mask(l, x, mask, "forward", err));
    const int64_t B = x->shape[0], T = d.T, D = hp->d_model, H = hp->p.n_heads;
    out[0] = ct_tensor_sig(x);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    ct_arena_mark before_heads = ct_arena_get_mark(c->arena);
    ct_tensor t[T_N], mf = {0};
    if (mask) CT_TRY(ct_attention_mask_f32(c, mask, &mf, err));
    CT_TRY(alloc_heads(c, B, H, &d, t, err));
    ct_arena_mark after_heads = ct_arena_get_mark(c->arena);
    ct_heads_project_forward(t[T_Q].data, x->data, ct_weight(c, l, hp->wq), NULL, B, T, D, H, d.dk);
    ct_heads_project_forward(t[T_V].data, x->data, ct_weight(c, l, hp->wv), NULL, B, T, D, H, d.dv);
    CT_TRY(step_buckets(l, c, t, mf.data, B, &d, f, n_f, key, err));
    if (T > 0) CT_TRY(heads_attend(c, t, mf.data, H, B * H, ct_key_split(key, 0), &d, err));
    ct_arena_reset_to(c->arena, after_heads);
    ct_heads_merge_forward(out[0].data, t[T_O].data, ct_weight(c, l, hp->wo), B, T, D, H, d.dv);
    if (out_rate(l, c) > 0.0f)
        ct_attention_channel_dropout(out[0].data, B * T, D, ct_key_split(key, 1), out_rate(l, c));
    return ct_attention_tape_push(c, x, mask, t, T_N, before_heads, err);
}

// do (B,H,T,dv) -> dq (B,H,T,dk), dv (B,H,T,dv), both fresh. mask: (B,T)
// or NULL.
static ct_status heads_backward(ct_ctx *c, const ct_tensor *t, const float *mask, const ct_tensor *dO, ct_tensor *g,
                                ct_key key, const ct_lsh_dims *d, ct_error *err) {
    g[0] = ct_tensor_sig(&t[T_Q]), g[1] = ct_tensor_sig(&t[T_V]);
    CT_TRY(ct_ctx_zeros(c, &g[0], err));
    CT_TRY(ct_ctx_zeros(c, &g[1], err));
    const int64_t H = t[T_Q].shape[1], BH = t[T_Q].shape[0] * H, T = d->T, R = d->R;
    if (T == 0) return CT_OK;
    const int ns = n_slots(BH);
    const int64_t per = (ct_lsh_work_floats(d, true) + 15) / 16 * 16;  // int64-aligned slots
    ct_arena_mark mark = ct_arena_get_mark(c->arena);
    ct_tensor work = ct_tensor_1d(CT_DTYPE_F32, ns * per, NULL);
    CT_TRY(ct_ctx_alloc(c, &work, err));
#pragma omp parallel for schedule(static) num_threads(ct_blas_slot_threads(ns))
    for (int64_t s = 0; s < BH; s++) {
        float *w = (float *)work.data + (int64_t)omp_get_thread_num() * per;
        const int64_t qo = s * T * d->dk, vo = s * T * d->dv, ro = s * R * T;
        ct_lsh_backward((float *)g[0].data + qo, (float *)g[1].data + vo, (const float *)dO->data + vo,
                        (const float *)t[T_O].data + vo, (const float *)t[T_LSER].data + ro,
                        (const float *)t[T_Q].data + qo, (const float *)t[T_V].data + vo,
                        mask ? mask + s / H * T : NULL, (const float *)t[T_BK].data + ro, w, key, d);
    }
    ct_arena_reset_to(c->arena, mark);
    return CT_OK;
}

static ct_status lsh_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                              ct_error *err) {
    const lsh_hp *hp = l->hp;
    ct_tensor t[T_N];
    ct_tensor x, mask = {0}, mf = {0};
    if (!ct_attention_tape_pop(c, t, T_N, &x, hp->p.masked ? &mask : NULL, grad_out, grad_in))
        return CT_OK;  // no gradient flows
    ct_lsh_dims d;
    int f[CT_LSH_MAX_BUCKET_FACTORS], n_f;
    CT_TRY(lsh_dims(l, c, &x, "backward", &d, f, &n_f, err));
    if (hp->p.masked) CT_TRY(ct_attention_mask_f32(c, &mask, &mf, err));
    const int64_t B = x.shape[0], T = d.T, D = hp->d_model, H = hp->p.n_heads;
    ct_tensor dO, g[2];
    CT_TRY(ct_attention_backward_output(l, c, hp->wo, out_rate(l, c), &grad_out[0], &t[T_O], &dO,
                                        ct_key_split(key, 1), err));
    CT_TRY(heads_backward(c, t, mf.data, &dO, g, ct_key_split(key, 0), &d, err));
    CT_TRY(ct_ctx_zeros(c, &grad_in[0], err));
    float *dx = grad_in[0].data;
    ct_heads_project_backward(dx, ct_weight_grad(c, l, hp->wq), NULL, g[0].data, x.data, ct_weight(c, l, hp->wq), B,
                              T, D, H, d.dk);
    ct_heads_project_backward(dx, ct_weight_grad(c, l, hp->wv), NULL, g[1].data, x.data, ct_weight(c, l, hp->wv), B,
                              T, D, H, d.dv);
    return CT_OK;
}

static const ct_layer_vtable lsh_vt = {
    .type = "LSHSelfAttention", .init = lsh_init, .forward = lsh_forward, .backward = lsh_backward};

ct_layer *ct_lsh_self_attention(ct_lsh_self_attention_params p) {
    // The parameters are checked at init, where errors can name the layer.
    lsh_hp hp = {.p = p, .wq = -1, .wv = -1, .wo = -1, .s_buckets = -1, .s_hash = -1};
    return ct_layer_new_hp(&lsh_vt, p.masked ? 2 : 1, 1, &hp, sizeof hp);
}
