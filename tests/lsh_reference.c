// LSHSelfAttention forward values for tests/lsh_reference.py, which
// recomputes them in float64 from REFORMER.md section 2 (run both through
// tests/lsh_reference_test.sh):
//
//   lsh_reference OUT_DIR
//
// writes OUT_DIR/<case>.safetensors per case below: the layer's parameters
// as __metadata__ strings; x (B, T, D) and, masked, mask (B, T) (f32, 0 =
// padding); the weights stacked over heads, Wq (H, D, dk), Wv (H, D, dv),
// Wo (H, dv, D); a training forward's output y_train (B, T, D) (both
// dropouts 0), the buckets it left in the state, buckets_train (B H, R T)
// (round offsets included, exact integers in f32), and its rotations
// rot_train (B H, dk, R, n_rot), n_rot = the sum of f / 2 over the bucket
// factors f; then an eval forward's y_eval and rot_eval.
//
// The rotations are drawn here as lsh_attention.h says the layer draws
// them (the reference checks that by hashing with rot_train into
// buckets_train): a forward hashes with split(sub, b H + h), where (next,
// sub) = (split(k, 0), split(k, 1)) of the hash key k, which is split(init
// key, 4) before the first forward and next after it.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"

typedef struct lsh_case {
    const char *name, *what;
    int B, T, D;
    ct_lsh_self_attention_params p;
    const int *pad;  // masked: (example, position) pairs of padding, ended by -1
} lsh_case;

static ct_lsh_self_attention_params params(int H, int dk, int dv, bool causal, int m, int before, int after, int R,
                                           int nb0, int nb1, bool masked) {
    ct_lsh_self_attention_params p = ct_lsh_self_attention_default_params();
    p.n_heads = H, p.d_qk = dk, p.d_v = dv, p.causal = causal, p.chunk_len = m;
    p.n_chunks_before = before, p.n_chunks_after = after, p.n_hashes = R;
    p.n_buckets[0] = nb0, p.n_buckets[1] = nb1, p.masked = masked;
    return p;
}

// p with a third bucket factor.
static ct_lsh_self_attention_params params3(ct_lsh_self_attention_params p, int nb2) {
    p.n_buckets[2] = nb2;
    return p;
}

// Half the rotation width, sum of f / 2 over the bucket factors, with
// n_buckets all 0 resolved from T as REFORMER.md section 2 says (nb = 2
// max(1, T / m), factored as [2^ceil(log2 sqrt nb), 2 (nb / (2 f1))] over
// 128); the reference checks the factors through the buckets.
static int half_rotation(const ct_lsh_self_attention_params *p, int T) {
    if (p->n_buckets[0]) {
        int sum = 0;
        for (int j = 0; j < CT_LSH_MAX_BUCKET_FACTORS; j++) sum += p->n_buckets[j];
        return sum / 2;
    }
    int nb = 2 * (T / p->chunk_len > 1 ? T / p->chunk_len : 1);
    if (nb <= 128) return nb / 2;
    int f1 = 1;
    while (f1 * f1 < nb) f1 *= 2;
    return (f1 + 2 * (nb / (2 * f1))) / 2;
}

static float *state_of(const ct_net *net, const char *name) {
    for (int i = 0; i < net->n_state_params; i++)
        if (strcmp(net->state_params[i]->name, name) == 0) return net->state + net->state_params[i]->offset;
    return NULL;
}

// The heads' weights name[h] (rows, cols), copied into one (H, rows, cols).
static float *stack_heads(const ct_net *net, const char *name, int H, int64_t per_head) {
    float *w = malloc(sizeof(float) * (size_t)(H * per_head));
    for (int h = 0; h < H; h++) {
        char full[64];
        snprintf(full, sizeof full, "LSHSelfAttention/%s[%d]", name, h);
        const ct_param *p = ct_net_find_param(net, full);
        CHECK_MSG(p && ct_tensor_numel(&p->sig) == per_head, "weight %s", full);
        if (p) memcpy(w + h * per_head, net->weights + p->offset, sizeof(float) * (size_t)per_head);
    }
    return w;
}

// The rotations of hashing number `count` (0: the first forward), for every
// (b, h): (B H, dk, R, n_rot).
static float *rotations(ct_key init_key, uint32_t count, int BH, int64_t per) {
    ct_key k = ct_key_split(init_key, 4);
    for (uint32_t i = 0; i < count; i++) k = ct_key_split(k, 0);
    ct_key sub = ct_key_split(k, 1);
    float *rot = malloc(sizeof(float) * (size_t)(BH * per));
    for (int s = 0; s < BH; s++) ct_random_normal(ct_key_split(sub, (uint32_t)s), rot + s * per, (size_t)per, 1.0f);
    return rot;
}

static void run_case(const lsh_case *cs, const char *dir) {
    const ct_lsh_self_attention_params *p = &cs->p;
    const int B = cs->B, T = cs->T, D = cs->D, H = p->n_heads, R = p->n_hashes, BH = B * H;
    const int64_t n_x = (int64_t)B * T * D, n_rot = half_rotation(p, T), per_rot = p->d_qk * R * n_rot;
    const ct_key init_key = ct_key_from_seed(3);
    float *x = malloc(sizeof(float) * n_x), *mask = malloc(sizeof(float) * B * T);
    float *y_train = malloc(sizeof(float) * n_x), *y_eval = malloc(sizeof(float) * n_x);
    ct_tensor in[2] = {ct_tensor_3d(CT_DTYPE_F32, B, T, D, x), ct_tensor_2d(CT_DTYPE_F32, B, T, mask)};
    ct_random_uniform(ct_key_from_seed(7), x, (size_t)n_x, -1.0f, 1.0f);
    for (int i = 0; i < B * T; i++) mask[i] = 1.0f;
    for (const int *pad = cs->pad; pad && *pad >= 0; pad += 2) mask[pad[0] * T + pad[1]] = 0.0f;

    ct_layer *l = ct_lsh_self_attention(*p);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_tensor sigs[2] = {ct_tensor_sig(&in[0]), ct_tensor_sig(&in[1])};
    CHECK_OK(ct_net_init(&net, l, sigs, p->masked ? 2 : 1, init_key, &dev, &err), &err);
    ct_arena arena;
    ct_arena_init(&arena, &dev);
    ct_ctx c;
    ct_ctx_init(&c, &arena);
    // The step keys choose only dropout masks (both rates are 0 here):
    // hashing follows the init key and the count of forwards.
    ct_tensor out[1];
    ct_net_bind(&net, &c, true);
    CHECK_OK(ct_layer_forward(net.root, &c, in, out, ct_key_from_seed(11), &err), &err);
    memcpy(y_train, out[0].data, sizeof(float) * n_x);
    ct_arena_reset(&arena);
    ct_net_bind(&net, &c, false);
    CHECK_OK(ct_layer_forward(net.root, &c, in, out, ct_key_from_seed(12), &err), &err);
    memcpy(y_eval, out[0].data, sizeof(float) * n_x);
    ct_arena_reset(&arena);

    // The state's buckets are (B H, R T) here: init's T is the forward's.
    float *buckets = state_of(&net, "buckets");
    if (!buckets) {
        fprintf(stderr, "%s: the layer has no \"buckets\" state\n", cs->name);
        exit(1);
    }
    float *wq = stack_heads(&net, "Wq", H, (int64_t)D * p->d_qk), *wv = stack_heads(&net, "Wv", H, (int64_t)D * p->d_v);
    float *wo = stack_heads(&net, "Wo", H, (int64_t)p->d_v * D);
    float *rot_train = rotations(init_key, 0, BH, per_rot), *rot_eval = rotations(init_key, 1, BH, per_rot);

    enum { N_INT = 9 };
    const char *keys[N_INT] = {"n_heads",        "d_qk",     "d_v",   "causal", "chunk_len", "n_chunks_before",
                               "n_chunks_after", "n_hashes", "masked"};
    const int ints[N_INT] = {H, p->d_qk, p->d_v, p->causal, p->chunk_len, p->n_chunks_before, p->n_chunks_after, R,
                             p->masked};
    char text[N_INT][16], path[1024], factors[64] = "";
    ct_kv meta[N_INT + 2];
    for (int i = 0; i < N_INT; i++) {
        snprintf(text[i], sizeof text[i], "%d", ints[i]);
        meta[i] = (ct_kv){keys[i], text[i]};
    }
    // n_buckets as its factors, comma-separated ("" for None).
    for (int j = 0, n = 0; j < CT_LSH_MAX_BUCKET_FACTORS && p->n_buckets[j]; j++)
        n += snprintf(factors + n, sizeof factors - (size_t)n, "%s%d", j ? "," : "", p->n_buckets[j]);
    meta[N_INT] = (ct_kv){"n_buckets", factors};
    meta[N_INT + 1] = (ct_kv){"what", cs->what};
    int64_t rshape[4] = {BH, p->d_qk, R, n_rot};
    ct_named_tensor t[] = {
        {"x", in[0]},
        {"Wq", ct_tensor_3d(CT_DTYPE_F32, H, D, p->d_qk, wq)},
        {"Wv", ct_tensor_3d(CT_DTYPE_F32, H, D, p->d_v, wv)},
        {"Wo", ct_tensor_3d(CT_DTYPE_F32, H, p->d_v, D, wo)},
        {"y_train", ct_tensor_3d(CT_DTYPE_F32, B, T, D, y_train)},
        {"y_eval", ct_tensor_3d(CT_DTYPE_F32, B, T, D, y_eval)},
        {"buckets_train", ct_tensor_2d(CT_DTYPE_F32, BH, (int64_t)R * T, buckets)},
        {"rot_train", ct_tensor_make(CT_DTYPE_F32, 4, rshape, rot_train)},
        {"rot_eval", ct_tensor_make(CT_DTYPE_F32, 4, rshape, rot_eval)},
        {"mask", in[1]},
    };
    snprintf(path, sizeof path, "%s/%s.safetensors", dir, cs->name);
    CHECK_OK(ct_safetensors_write(path, t, p->masked ? 10 : 9, meta, N_INT + 2, &err), &err);
    printf("%s: (B %d, T %d, D %d), %s\n", cs->name, B, T, D, cs->what);

    free(wq), free(wv), free(wo), free(rot_train), free(rot_eval);
    ct_ctx_free(&c);
    ct_arena_free(&arena);
    ct_net_free(&net);
    ct_layer_free(l);
    free(x), free(mask), free(y_train), free(y_eval);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: lsh_reference OUT_DIR\n");
        return 2;
    }
    static const int pad_d[] = {0, 13, 0, 14, 0, 15, 0, 16, 0, 17, 1, 0, 1, 1, 1, 9, 1, 16, 1, 17, -1};
    static const int pad_e[] = {0, 8, 0, 9, 0, 10, 0, 11, 1, 0, 1, 5, -1};
    const lsh_case cases[] = {
        {"nb_from_T", "n_buckets None = 12 (T 24 / m 4), R 1, causal, before 1, 6 chunks", 2, 24, 8,
         params(2, 4, 5, true, 4, 1, 0, 1, 0, 0, false), NULL},
        {"factored_R2", "n_buckets [4, 6], R 2, non-causal, before 1 after 1, 8 chunks", 2, 20, 8,
         params(2, 6, 4, false, 5, 1, 1, 2, 4, 6, false), NULL},
        {"R3_straddle", "n_buckets None = 4, R 3, causal, before 2 after 1, chunk 6 of R T 42 (chunks straddle rounds)",
         1, 14, 6, params(3, 4, 3, true, 6, 2, 1, 3, 0, 0, false), NULL},
        {"masked_R2",
         "masked (example 0: padding from 13; 1: at 0, 1, 9, 16, 17; 2: none), n_buckets 6, R 2, non-causal, before 1",
         3, 18, 8, params(2, 4, 4, false, 6, 1, 0, 2, 6, 0, true), pad_d},
        {"masked_causal_R3",
         "masked (example 0: padding from 8; 1: at 0 and 5), n_buckets [2, 4], R 3, causal, before 1 after 1", 2, 12, 6,
         params(2, 5, 3, true, 4, 1, 1, 3, 2, 4, true), pad_e},
        {"nb_from_T_factored",
         "n_buckets None = 136 (T 272 / m 4) factored [16, 8] (product 128), R 2, causal, before 1, 136 chunks", 1, 272,
         8, params(1, 8, 4, true, 4, 1, 0, 2, 0, 0, false), NULL},
        {"window_repeats",
         "3 chunks (R T 24 / m 8), before 4: j = -4 and -3 give the own chunk, as Trax's slicing a[j:] ++ a[:j] "
         "does for |j| >= N ((c + j) mod N would give c - 1 for j = -4), R 2, n_buckets 4, non-causal",
         2, 12, 4, params(2, 3, 3, false, 8, 4, 0, 2, 4, 0, false), NULL},
        {"no_adjacent", "before 0 after 0, R 2, n_buckets 8, non-causal, 8 chunks", 2, 16, 6,
         params(2, 4, 4, false, 4, 0, 0, 2, 8, 0, false), NULL},
        {"nb_at_128",
         "n_buckets None = 128 (T 128 / m 2): at Trax's bound of 128, one factor of 128, not factored (into [16, 8]); "
         "R 1, causal, before 1, 64 chunks",
         1, 128, 6, params(1, 4, 3, true, 2, 1, 0, 1, 0, 0, false), NULL},
        {"three_factors", "n_buckets [2, 4, 2] (16 buckets), R 2, causal, before 1, 8 chunks", 2, 16, 6,
         params3(params(2, 4, 4, true, 4, 1, 0, 2, 2, 4, false), 2), NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], argv[1]);
    return check_summary("lsh_reference");
}
