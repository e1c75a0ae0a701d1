// Synthetic sources: copy, reverse and addition. Example i draws from the key
// fold_in(fold_in(key(seed), low 32 bits of i), high 32 bits of i): element j
// of that key's stream is the example's j-th random draw.
#include "ctrax/data/synthetic.h"

#include <stdio.h>

#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "data/stream_internal.h"

static ct_key example_key(uint64_t seed, uint64_t i) {
    return ct_key_fold_in(ct_key_fold_in(ct_key_from_seed(seed), (uint32_t)i), (uint32_t)(i >> 32));
}

// A uniform integer in [0, n) from draw j of key.
static int draw(ct_key key, uint32_t *j, int n) {
    return (int)ct_stream_below(ct_random_bits(key, (*j)++), (uint32_t)n);
}

// ---- copy and reverse --------------------------------------------------------------

// Writes example i (2n + 2 tokens and weights); returns its length.
static int copy_example(const ct_copy_task *t, uint64_t i, int32_t *seq, float *w) {
    ct_key key = example_key(t->seed, i);
    uint32_t j = 0;
    int n = t->length;
    // Draw 0 is the length, drawn even when fixed, so a task's w does not
    // depend on min_length.
    int len_draw = draw(key, &j, t->length - (t->min_length > 0 ? t->min_length : t->length) + 1);
    if (t->min_length > 0) n = t->min_length + len_draw;
    int len = 2 * n + 2;
    seq[0] = 0;
    seq[n + 1] = 0;
    for (int k = 0; k < n; k++) seq[1 + k] = 1 + draw(key, &j, t->vocab_size - 1);
    for (int k = 0; k < n; k++) seq[n + 2 + k] = seq[1 + (t->reverse ? n - 1 - k : k)];
    for (int k = 0; k < len; k++) w[k] = k >= n + 2 ? 1.0f : 0.0f;
    return len;
}

void ct_copy_task_batch(const ct_copy_task *t, uint64_t index, int batch, int32_t *tokens, float *weights) {
    // Batch `index` draws from its own key (element b * n + i is token i of
    // row b), so batches are independent of the order they are asked for in.
    // This is the scheme `ctrax train` has used from the start; the copy
    // stream below draws per example instead, so it can be shuffled and
    // batched in any way.
    CT_ASSERT(t->min_length == 0 || t->min_length == t->length);
    ct_key key = example_key(t->seed, index);
    int n = t->length, len = ct_copy_task_seq_len(t);
    for (int b = 0; b < batch; b++) {
        int32_t *seq = tokens + (int64_t)b * len;
        float *w = weights + (int64_t)b * len;
        seq[0] = 0;
        seq[n + 1] = 0;
        for (int i = 0; i < n; i++) {
            // The counter in uint32 (b * n as int overflowed past 2^31).
            uint32_t bits = ct_random_bits(key, (uint32_t)b * (uint32_t)n + (uint32_t)i);
            seq[1 + i] = 1 + (int32_t)(bits % (uint32_t)(t->vocab_size - 1));
        }
        for (int i = 0; i < n; i++) seq[n + 2 + i] = seq[1 + (t->reverse ? n - 1 - i : i)];
        for (int i = 0; i < len; i++) w[i] = i >= n + 2 ? 1.0f : 0.0f;
    }
}

typedef struct synth {
    ct_copy_task copy;
    ct_addition_task add;
    int32_t *seq;  // the current example: tokens,
    float *w;      // its loss weights
    int *scratch;  // addition's digits
} synth;

// A synthetic source of examples of at most max_len tokens (all of exactly
// max_len when fixed), with n_scratch ints of scratch; impl and arrays are
// one block. The caller mixes its task into the fingerprint.
static ct_stream *synth_new(const ct_stream_ops *ops, int max_len, bool fixed, size_t n_scratch, synth **x) {
    size_t head = ct_round16(sizeof **x), seq = ct_round16((size_t)max_len * sizeof(int32_t));
    char *at = ct_calloc(1, head + 2 * seq + ct_round16(n_scratch * sizeof(int)));
    *x = (synth *)at;
    at += head;
    (*x)->seq = ct_carve(&at, (size_t)max_len * sizeof(int32_t));
    (*x)->w = ct_carve(&at, (size_t)max_len * sizeof(float));
    (*x)->scratch = ct_carve(&at, n_scratch * sizeof(int));
    ct_stream *s = ct_stream_alloc(ops, NULL, *x);
    int64_t L = fixed ? max_len : -1;
    s->n_out = 3;
    s->sigs[0] = ct_tensor_1d(CT_DTYPE_I32, L, NULL);
    s->sigs[1] = ct_tensor_1d(CT_DTYPE_I32, L, NULL);
    s->sigs[2] = ct_tensor_1d(CT_DTYPE_F32, L, NULL);
    return s;
}

static void emit(ct_batch *out, synth *x, int len) {
    out->n = 3;
    out->t[0] = ct_tensor_1d(CT_DTYPE_I32, len, x->seq);
    out->t[1] = ct_tensor_1d(CT_DTYPE_I32, len, x->seq);
    out->t[2] = ct_tensor_1d(CT_DTYPE_F32, len, x->w);
}

static ct_status copy_next(ct_stream *s, ct_batch *out, ct_error *err) {
    (void)err;
    synth *x = s->impl;
    int len = copy_example(&x->copy, (uint64_t)s->position, x->seq, x->w);
    emit(out, x, len);
    return CT_OK;
}

static void copy_describe(const ct_stream *s, char *buf, size_t len) {
    const ct_copy_task *t = &((const synth *)s->impl)->copy;
    if (t->min_length > 0 && t->min_length < t->length)
        snprintf(buf, len, "%s(vocab %d, w of %d..%d tokens, seed %llu)", t->reverse ? "reverse" : "copy",
                 t->vocab_size, t->min_length, t->length, (unsigned long long)t->seed);
    else
        snprintf(buf, len, "%s(vocab %d, w of %d tokens, seed %llu)", t->reverse ? "reverse" : "copy", t->vocab_size,
                 t->length, (unsigned long long)t->seed);
}

static const ct_stream_ops copy_ops = {"copy", copy_next, NULL, NULL, copy_describe};

ct_status ct_copy_stream_new(ct_stream **out, const ct_copy_task *t, ct_error *err) {
    *out = NULL;
    CT_STREAM_CHECK(t->vocab_size >= 2, err, "copy task: vocab_size is %d; expected >= 2", t->vocab_size);
    // 2 * length + 2 tokens an example (an int): bounded like addition's max_length.
    CT_STREAM_CHECK(t->length >= 1 && t->length <= (1 << 24), err, "copy task: length is %d; expected 1..2^24",
                    t->length);
    CT_STREAM_CHECK(t->min_length >= 0 && t->min_length <= t->length, err,
                    "copy task: min_length is %d; expected 0 (fixed) or 1..length (%d)", t->min_length, t->length);
    synth *x;
    bool fixed = t->min_length == 0 || t->min_length == t->length;
    ct_stream *s = synth_new(&copy_ops, ct_copy_task_seq_len(t), fixed, 0, &x);
    x->copy = *t;
    ct_stream_mix(s, (uint64_t)t->vocab_size);
    ct_stream_mix(s, (uint64_t)t->length);
    ct_stream_mix(s, t->reverse);
    ct_stream_mix(s, t->seed);
    ct_stream_mix(s, (uint64_t)t->min_length);
    *out = s;
    return CT_OK;
}

// ---- addition -------------------------------------------------------------------------

// n digits little-endian in base, the top one non-zero unless n == 1 (Trax's
// random_number_lower_endian).
static void random_number(ct_key key, uint32_t *j, int n, int base, int *digits) {
    if (n == 1) {
        digits[0] = draw(key, j, base);
        return;
    }
    for (int k = 0; k < n - 1; k++) digits[k] = draw(key, j, base);
    digits[n - 1] = draw(key, j, base - 1) + 1;
}

// scratch holds 3 * (max_length + 1) ints.
static int addition_example(const ct_addition_task *t, uint64_t i, int32_t *seq, float *w, int *scratch) {
    ct_key key = example_key(t->seed, i);
    uint32_t j = 0;
    int base = t->vocab_size - 3, max_length = t->max_length;
    int add_len = (t->min_length - 1) / 2;
    int l1 = draw(key, &j, (max_length - add_len + 1) / 2) + add_len;
    int l2 = draw(key, &j, max_length - l1 - 1) + 1;
    int *a = scratch, *b = scratch + (max_length + 1), *sum = scratch + 2 * (max_length + 1);
    random_number(key, &j, l1, base, a);
    random_number(key, &j, l2, base, b);
    int ls = 0, carry = 0;
    for (int k = 0; k < (l1 > l2 ? l1 : l2); k++) {
        // In 64 bits: two digits of a base near 2^31 (vocab_size up to
        // INT_MAX) overflowed an int.
        int64_t d = (int64_t)(k < l1 ? a[k] : 0) + (k < l2 ? b[k] : 0) + carry;
        sum[ls++] = (int)(d % base);
        carry = (int)(d / base);
    }
    if (carry) sum[ls++] = carry;
    while (ls > 1 && sum[ls - 1] == 0) ls--;  // 0 + 0 = [0]
    int n = 0;
    seq[n++] = base + 2;  // <S>
    for (int k = 0; k < l1; k++) seq[n++] = a[k] + 1;
    seq[n++] = base + 1;  // "+"
    for (int k = 0; k < l2; k++) seq[n++] = b[k] + 1;
    seq[n++] = base + 2;
    int answer = n;
    for (int k = 0; k < ls; k++) seq[n++] = sum[k] + 1;
    for (int k = 0; k < n; k++) w[k] = k >= answer ? 1.0f : 0.0f;
    return n;
}

static ct_status addition_next(ct_stream *s, ct_batch *out, ct_error *err) {
    (void)err;
    synth *x = s->impl;
    int len = addition_example(&x->add, (uint64_t)s->position, x->seq, x->w, x->scratch);
    emit(out, x, len);
    return CT_OK;
}

static void addition_describe(const ct_stream *s, char *buf, size_t len) {
    const ct_addition_task *t = &((const synth *)s->impl)->add;
    snprintf(buf, len, "addition(vocab %d = base %d + 3, lengths %d..%d, seed %llu)", t->vocab_size, t->vocab_size - 3,
             t->min_length, t->max_length, (unsigned long long)t->seed);
}

static const ct_stream_ops addition_ops = {"addition", addition_next, NULL, NULL, addition_describe};

ct_status ct_addition_stream_new(ct_stream **out, const ct_addition_task *t, ct_error *err) {
    *out = NULL;
    CT_STREAM_CHECK(t->vocab_size >= 5, err, "addition task: vocab_size is %d; expected >= 5 (base >= 2, plus 3)",
                    t->vocab_size);
    CT_STREAM_CHECK(t->min_length >= 3 && t->max_length >= t->min_length, err,
                    "addition task: lengths %d..%d; expected 3 <= min_length <= max_length", t->min_length,
                    t->max_length);
    CT_STREAM_CHECK(t->max_length <= 100000, err, "addition task: max_length %d is too long", t->max_length);
    synth *x;
    ct_stream *s = synth_new(&addition_ops, 2 * t->max_length + 1, false, 3 * ((size_t)t->max_length + 1), &x);
    x->add = *t;
    ct_stream_mix(s, (uint64_t)t->vocab_size);
    ct_stream_mix(s, (uint64_t)t->min_length);
    ct_stream_mix(s, (uint64_t)t->max_length);
    ct_stream_mix(s, t->seed);
    *out = s;
    return CT_OK;
}
