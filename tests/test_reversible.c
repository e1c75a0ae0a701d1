// Reversible layers: gradient checks of forward/backward (also of an f
// that hands back a donated operand the half passes on); reverse rebuilds
// the inputs and reverse_and_grad gives the inputs, input gradients and
// weight gradients of forward + backward (same key, dropout on); inputs
// without gradients pass through; a 64-block ReversibleSerial rebuilds its
// inputs within 1e-4 (error printed per depth); reverse and
// reverse_and_grad's arena peak does not grow with depth; init errors.
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ctrax/layers/reversible.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/models/models.h"
#include "gradcheck.h"

static void check_grad_opts(const char *label, ct_layer *l, const ct_tensor *in, int n_in, ct_gradcheck_opts o,
                            double tol) {
    double e = gradcheck(label, l, in, n_in, o);
    CHECK_MSG(e >= 0 && e < tol, "%s: rel err %g", label, e);
    printf("  => %s: max rel err %.2e\n", label, e);
}

static void check_grad(const char *label, ct_layer *l, const ct_tensor *in, int n_in) {
    check_grad_opts(label, l, in, n_in, ct_gradcheck_defaults(), CT_GRADCHECK_TOL);
}

// Stacks of blocks with LayerNorm and CausalAttention carry a model's float
// noise (gradcheck.h).
static void check_model_grad(const char *label, ct_layer *l, const ct_tensor *in, int n_in) {
    check_grad_opts(label, l, in, n_in, ct_gradcheck_model_defaults(ct_gradcheck_defaults().eps), CT_GRADCHECK_MODEL_TOL);
}

static double max_abs_diff(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > m || d != d) m = d != d ? INFINITY : d;
    }
    return m;
}

static float *copy_of(const ct_tensor *t) {
    if (!t->data) return NULL;
    float *c = malloc(ct_tensor_nbytes(t));
    memcpy(c, t->data, ct_tensor_nbytes(t));
    return c;
}

// The layers under test, each built fresh (a layer belongs to one net).
static ct_layer *half_dense(int d) { return ct_reversible_half_residual(CT_LAYERS(ct_dense(d))); }

// f(x, ids) = Dense(x) + Embedding(ids): a context item that takes no gradient.
static ct_layer *half_with_ids(int d, int vocab) {
    return ct_reversible_half_residual(
        CT_LAYERS(ct_parallel(CT_LAYERS(ct_dense(d), ct_embedding(vocab, d))), ct_add()));
}

static ct_layer *reformer_block_layers(int d, int d_ff, int heads, float dropout, ct_layer **out) {
    out[0] = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), ct_causal_attention(d, heads, dropout)));
    out[1] = ct_reversible_swap();
    out[2] = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), ct_dense(d_ff), ct_dropout(dropout),
                                                   ct_gelu(), ct_dense(d), ct_dropout(dropout)));
    out[3] = ct_reversible_swap();
    return out[0];
}

static ct_layer *reformer_serial(int n_blocks, int d, int d_ff, int heads, float dropout) {
    ct_layer **l = malloc((size_t)(4 * n_blocks) * sizeof *l);
    for (int b = 0; b < n_blocks; b++) reformer_block_layers(d, d_ff, heads, dropout, l + 4 * b);
    ct_layer *s = ct_reversible_serial(4 * n_blocks, l);
    free(l);
    return s;
}

static void test_gradients(void) {
    enum { N = 4, D = 6 };
    float a[N * D], b[N * D];
    int32_t ids[N] = {0, 3, 6, 3};
    ct_tensor acc = ct_tensor_2d(CT_DTYPE_F32, N, D, a), ctx = ct_tensor_2d(CT_DTYPE_F32, N, D, b);
    gradcheck_fill(&acc, 1, -1, 1);
    gradcheck_fill(&ctx, 2, -1, 1);
    ct_tensor two[2] = {acc, ctx};
    ct_tensor three[3] = {acc, ctx, ct_tensor_1d(CT_DTYPE_I32, N, ids)};

    ct_layer *l = half_dense(D);
    check_grad("HalfResidual(Dense)", l, two, 2);
    ct_layer_free(l);
    l = ct_reversible_half_residual(CT_LAYERS(ct_dense(D), ct_dropout(0.3f)));
    check_grad("HalfResidual(Dense, Dropout)", l, two, 2);
    ct_layer_free(l);
    l = half_with_ids(D, 7);
    check_grad("HalfResidual(int context)", l, three, 3);
    ct_layer_free(l);
    // f leaves two outputs; the second is dropped (and gets a zero gradient).
    l = ct_reversible_half_residual(CT_LAYERS(ct_branch(CT_LAYERS(ct_dense(D), ct_dense(3)))));
    check_grad("HalfResidual(dropped output)", l, two, 2);
    ct_layer_free(l);
    // The context output is dropped (a zero gradient): its input gradient
    // is f's alone.
    l = ct_serial(CT_LAYERS(half_dense(D), ct_select(1, (int[]){0}, 2)));
    check_grad("HalfResidual(Dense), context dropped", l, two, 2);
    ct_layer_free(l);
    l = ct_reversible_swap();
    check_grad("ReversibleSwap", l, two, 2);
    ct_layer_free(l);
    // Halves of two widths, (4,6) and (4,3): init must give the layer after
    // the swap the (4,3) half as its first input, as forward does.
    float n3[N * 3];
    ct_tensor unequal[2] = {acc, ct_tensor_2d(CT_DTYPE_F32, N, 3, n3)};
    gradcheck_fill(&unequal[1], 5, -1, 1);
    l = ct_serial(CT_LAYERS(ct_reversible_swap(), ct_dense(2)));
    check_grad("ReversibleSwap of (4,6) and (4,3), Dense", l, unequal, 2);
    ct_layer_free(l);
    l = ct_reversible_serial(CT_LAYERS(half_dense(D), ct_reversible_swap(),
                                       ct_reversible_half_residual(CT_LAYERS(ct_dense(D), ct_dropout(0.2f))),
                                       ct_reversible_swap()));
    check_grad("ReversibleSerial(2 halves)", l, two, 2);
    ct_layer_free(l);

    // Attention as the residual function, on (B, T, D).
    float x[2 * 5 * 8], y[2 * 5 * 8];
    ct_tensor seq[2] = {ct_tensor_3d(CT_DTYPE_F32, 2, 5, 8, x), ct_tensor_3d(CT_DTYPE_F32, 2, 5, 8, y)};
    gradcheck_fill(&seq[0], 3, -1, 1);
    gradcheck_fill(&seq[1], 4, -1, 1);
    l = ct_reversible_half_residual(CT_LAYERS(ct_layer_norm(1e-6f), ct_causal_attention(8, 2, 0.1f)));
    check_grad("HalfResidual(LayerNorm, CausalAttention)", l, seq, 2);
    ct_layer_free(l);
    l = reformer_serial(2, 8, 16, 2, 0.1f);
    check_model_grad("ReversibleSerial(2 Reformer blocks)", l, seq, 2);
    ct_layer_free(l);
}

// An f that hands back what the half also passes on, inside a Serial, so
// the walk donates the half an operand (buffer donation, core/memory.h):
// an identity f returns the context (forward: the donated context, the
// Dense's output, goes on as out[1]) or the accumulator's gradient
// (backward: the donated one, from the Dense after it, goes on as
// grad_in[0]); an Add in f gives both contexts that gradient. The half's
// sum must not be written over it (with it written over: rel err 0.4-0.5).
static void test_gradients_f_aliases(void) {
    enum { N = 4, D = 6 };
    float a[N * D], b[N * D], e[N * D];
    ct_tensor two[2] = {ct_tensor_2d(CT_DTYPE_F32, N, D, a), ct_tensor_2d(CT_DTYPE_F32, N, D, b)};
    ct_tensor three[3] = {two[0], two[1], ct_tensor_2d(CT_DTYPE_F32, N, D, e)};
    for (int i = 0; i < 3; i++) gradcheck_fill(&three[i], 11 + (uint64_t)i, -1, 1);
    ct_layer *l = ct_serial(CT_LAYERS(ct_parallel(CT_LAYERS(ct_serial(0, NULL), ct_dense(D))),
                                      ct_reversible_half_residual(0, NULL)));
    check_grad("Parallel(Serial(), Dense), HalfResidual()", l, two, 2);
    ct_layer_free(l);
    l = ct_serial(CT_LAYERS(ct_reversible_half_residual(0, NULL), ct_parallel(CT_LAYERS(ct_dense(D), ct_dense(D)))));
    check_grad("HalfResidual(), Parallel(Dense, Dense)", l, two, 2);
    ct_layer_free(l);
    l = ct_serial(CT_LAYERS(ct_reversible_half_residual(CT_LAYERS(ct_add())),
                            ct_parallel(CT_LAYERS(ct_dense(D), ct_dense(D), ct_dense(D)))));
    check_grad("HalfResidual(Add), Parallel(3 Dense)", l, three, 3);
    ct_layer_free(l);
    // The same in a reversible stack's ordinary backward: the swap hands
    // the first half the second's context gradient (a sum, donated).
    l = ct_reversible_serial(CT_LAYERS(ct_reversible_half_residual(CT_LAYERS(ct_add())), ct_reversible_swap(),
                                       half_dense(D)));
    check_grad("ReversibleSerial(HalfResidual(Add), Swap, HalfResidual(Dense))", l, three, 3);
    ct_layer_free(l);
}

// l's net on dev, initialized for the n_in items of in (seed), with an
// arena and a context bound to it (recording); unbind_net frees them.
static void bind_net(ct_net *net, ct_arena *arena, ct_ctx *c, ct_device *dev, ct_layer *l, const ct_tensor *in,
                     int n_in, uint64_t seed) {
    ct_error err;
    ct_tensor sigs[CT_LAYER_MAX_IO];
    for (int i = 0; i < n_in; i++) sigs[i] = ct_tensor_sig(&in[i]);
    CHECK_OK(ct_net_init(net, l, sigs, n_in, ct_key_from_seed(seed), dev, &err), &err);
    ct_arena_init(arena, dev);
    ct_ctx_init(c, arena);
    ct_net_bind(net, c, true);
}

static void unbind_net(ct_net *net, ct_arena *arena, ct_ctx *c) {
    ct_ctx_free(c);
    ct_arena_free(arena);
    ct_net_free(net);
}

// forward (tape) + backward with random output gradients, then reverse and
// reverse_and_grad (called with recording off, and a donation held by the
// caller) from the outputs: inputs, input gradients and weight gradients
// must agree, and the output gradients stay as they were.
static void check_reverse(const char *label, ct_layer *l, const ct_tensor *in, int n_in) {
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_arena arena;
    ct_ctx c;
    ct_error err;
    bind_net(&net, &arena, &c, &dev, l, in, n_in, 5);
    ct_key key = ct_key_from_seed(9);
    int n_out = net.n_out;

    ct_tensor out[CT_LAYER_MAX_IO], gout[CT_LAYER_MAX_IO], gin[CT_LAYER_MAX_IO];
    CHECK_OK(ct_layer_forward(l, &c, in, out, key, &err), &err);
    float *gbuf[CT_LAYER_MAX_IO] = {0}, *gin_ref[CT_LAYER_MAX_IO] = {0};
    for (int i = 0; i < n_out; i++) {
        gout[i] = ct_tensor_sig(&out[i]);
        if (out[i].dtype != CT_DTYPE_F32) continue;
        gbuf[i] = malloc(ct_tensor_nbytes(&out[i]));
        ct_random_uniform(ct_key_from_seed(100 + (uint64_t)i), gbuf[i], (size_t)ct_tensor_numel(&out[i]), -1, 1);
        gout[i].data = gbuf[i];
    }
    ct_net_zero_grads(&net);
    CHECK_OK(ct_layer_backward(l, &c, gout, gin, key, &err), &err);
    CHECK(c.tape_len == 0);
    for (int i = 0; i < n_in; i++) gin_ref[i] = copy_of(&gin[i]);
    float *wgrad_ref = malloc(net.n_weights * sizeof(float) + 4);
    if (net.n_weights) memcpy(wgrad_ref, net.grads, net.n_weights * sizeof(float));

    // reverse: inputs from outputs (recording on: it leaves the tape as it
    // found it).
    ct_tensor rin[CT_LAYER_MAX_IO], rin2[CT_LAYER_MAX_IO], rgin[CT_LAYER_MAX_IO];
    CHECK_OK(ct_layer_reverse(l, &c, out, rin, key, &err), &err);
    CHECK_MSG(c.tape_len == 0, "%s: reverse left %d tape entries", label, c.tape_len);
    double e_in = 0, e_in2 = 0, e_gin = 0, e_w;
    for (int i = 0; i < n_in; i++) {
        CHECK(ct_tensor_same_sig(&rin[i], &in[i]));
        if (in[i].dtype == CT_DTYPE_F32) {
            double e = max_abs_diff(rin[i].data, in[i].data, ct_tensor_numel(&in[i]));
            if (e > e_in) e_in = e;
        } else {
            CHECK(memcmp(rin[i].data, in[i].data, ct_tensor_nbytes(&in[i])) == 0);
        }
    }
    // reverse_and_grad: inputs, input gradients, weight gradients. With
    // recording off: it sets c->record for its recomputation and restores
    // it (reversible.h), so the caller need not record. The caller holds a
    // donation of the last output gradient (as a layer running inside a
    // walk may): it must not reach l, whose context-gradient sums would be
    // written over it (ct_ctx_sum_keep_b), and it is the caller's again
    // after.
    ct_net_zero_grads(&net);
    c.record = false;
    int held = n_out - 1;
    float *held_copy = copy_of(&gout[held]);
    arena.donated = gout[held].data;
    CHECK_OK(ct_layer_reverse_and_grad(l, &c, out, gout, rin2, rgin, key, &err), &err);
    CHECK_MSG(arena.donated == gout[held].data, "%s: the caller's donation was not given back", label);
    arena.donated = NULL;
    CHECK_MSG(!held_copy || memcmp(held_copy, gout[held].data, ct_tensor_nbytes(&gout[held])) == 0,
              "%s: reverse_and_grad wrote over output gradient %d, donated to its caller", label, held);
    free(held_copy);
    CHECK(c.tape_len == 0);
    CHECK_MSG(!c.record, "%s: reverse_and_grad left recording on", label);
    c.record = true;
    for (int i = 0; i < n_in; i++) {
        if (in[i].dtype == CT_DTYPE_F32) {
            double e = max_abs_diff(rin2[i].data, in[i].data, ct_tensor_numel(&in[i]));
            if (e > e_in2) e_in2 = e;
            CHECK_MSG(rgin[i].data && gin_ref[i], "%s: input %d has no gradient", label, i);
            if (rgin[i].data && gin_ref[i]) {
                e = max_abs_diff(rgin[i].data, gin_ref[i], ct_tensor_numel(&in[i]));
                if (e > e_gin) e_gin = e;
            }
        } else {
            CHECK_MSG(!rgin[i].data && !gin_ref[i], "%s: int input %d got a gradient", label, i);
            CHECK(ct_tensor_same_sig(&rgin[i], &in[i]));
        }
    }
    e_w = max_abs_diff(net.grads, wgrad_ref, (int64_t)net.n_weights);
    // Rebuilt inputs differ from the originals by rounding, and gradients
    // computed from them by as much relative to their size.
    double scale = 1.0;
    for (size_t i = 0; i < net.n_weights; i++) scale = fmax(scale, fabs(wgrad_ref[i]));
    printf("reverse %-40s |x - reverse(f(x))| %.2e, reverse_and_grad: inputs %.2e, input grads %.2e, "
           "weight grads %.2e (max |weight grad| %.1f)\n",
           label, e_in, e_in2, e_gin, e_w, scale);
    CHECK_MSG(e_in <= 1e-5 && e_in2 <= 1e-5, "%s: inputs rebuilt with error %g / %g", label, e_in, e_in2);
    CHECK_MSG(e_gin <= 1e-5 * scale && e_w <= 1e-5 * scale, "%s: gradients differ by %g / %g", label, e_gin, e_w);

    for (int i = 0; i < CT_LAYER_MAX_IO; i++) {
        free(gbuf[i]);
        free(gin_ref[i]);
    }
    free(wgrad_ref);
    unbind_net(&net, &arena, &c);
    ct_layer_free(l);
    CHECK(dev.current_bytes == 0);
}

static void test_reverse(void) {
    enum { N = 4, D = 6 };
    float a[N * D], b[N * D];
    int32_t ids[N] = {1, 2, 0, 6};
    ct_tensor two[2] = {ct_tensor_2d(CT_DTYPE_F32, N, D, a), ct_tensor_2d(CT_DTYPE_F32, N, D, b)};
    gradcheck_fill(&two[0], 1, -1, 1);
    gradcheck_fill(&two[1], 2, -1, 1);
    ct_tensor three[3] = {two[0], two[1], ct_tensor_1d(CT_DTYPE_I32, N, ids)};
    check_reverse("HalfResidual(Dense)", half_dense(D), two, 2);
    check_reverse("HalfResidual(Dense, Dropout)",
                  ct_reversible_half_residual(CT_LAYERS(ct_dense(D), ct_dropout(0.4f))), two, 2);
    check_reverse("HalfResidual(int context)", half_with_ids(D, 7), three, 3);
    check_reverse("HalfResidual(dropped output)",
                  ct_reversible_half_residual(CT_LAYERS(ct_branch(CT_LAYERS(ct_dense(D), ct_dense(3))))), two, 2);
    check_reverse("ReversibleSwap", ct_reversible_swap(), two, 2);
    float x[2 * 6 * 8], y[2 * 6 * 8];
    ct_tensor seq[2] = {ct_tensor_3d(CT_DTYPE_F32, 2, 6, 8, x), ct_tensor_3d(CT_DTYPE_F32, 2, 6, 8, y)};
    gradcheck_fill(&seq[0], 3, -1, 1);
    gradcheck_fill(&seq[1], 4, -1, 1);
    check_reverse("ReversibleSerial(3 Reformer blocks)", reformer_serial(3, 8, 16, 2, 0.2f), seq, 2);
    // An int item carried through a ReversibleSerial: [acc, x, ids] ->
    // [acc + f(x, ids), x, ids] -> swap -> [x + g(acc', ids), acc', ids].
    check_reverse("ReversibleSerial(int item carried)",
                  ct_reversible_serial(CT_LAYERS(half_with_ids(D, 7), ct_reversible_swap(), half_with_ids(D, 7))),
                  three, 3);
}

// A ReversibleSerial of 64 Reformer blocks (attention and feed-forward
// halves, dropout on) rebuilds its inputs from its outputs; the error is
// measured for stacks of 1, 2, 4, ..., 64 blocks. Each half-residual
// rounds once at the size of the activations (|x| grows to about 20 here,
// where a float's ulp is 2e-6), and the residual functions carry those
// errors on, so the error grows with depth and with activation size: at
// (B,T,D) = (2,16,16) the 64-block error is 1.2e-4, here it is below 1e-4.
// It depends on rounding: over seven input/weight seeds it ranged 4.4e-5 to
// 9.2e-5 when built at -O2 (as both test builds are), and 6.5e-5 to 1.2e-4
// at -O0, which rounds differently (no fused multiply-adds, no vectors).
static void test_deep_reconstruction(void) {
    enum { NB = 64, B = 2, T = 64, D = 32 };
    ct_layer *rs = reformer_serial(NB, D, 2 * D, 2, 0.1f);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    float x1[B * T * D], x2[B * T * D];
    ct_tensor in[2] = {ct_tensor_3d(CT_DTYPE_F32, B, T, D, x1), ct_tensor_3d(CT_DTYPE_F32, B, T, D, x2)};
    gradcheck_fill(&in[0], 21, -1, 1);
    gradcheck_fill(&in[1], 22, -1, 1);
    ct_arena arena;
    ct_ctx c;
    bind_net(&net, &arena, &c, &dev, rs, in, 2, 1);
    c.record = false;
    ct_key key = ct_key_from_seed(2);

    // Forward block by block (sublayer i gets split(key, i), as inside the
    // ReversibleSerial), keeping the stack after each block.
    const int64_t n = B * T * D;
    float *after = malloc((size_t)(NB + 1) * 2 * (size_t)n * sizeof(float));
    memcpy(after, x1, (size_t)n * sizeof(float));
    memcpy(after + n, x2, (size_t)n * sizeof(float));
    ct_tensor stack[2] = {in[0], in[1]}, next[2];
    for (int i = 0; i < 4 * NB; i++) {
        CHECK_OK(ct_layer_forward(rs->sub[i], &c, stack, next, ct_key_split(key, (uint32_t)i), &err), &err);
        stack[0] = next[0];
        stack[1] = next[1];
        if (i % 4 == 3) {
            float *dst = after + (size_t)(i / 4 + 1) * 2 * (size_t)n;
            memcpy(dst, stack[0].data, (size_t)n * sizeof(float));
            memcpy(dst + n, stack[1].data, (size_t)n * sizeof(float));
        }
    }
    // The whole ReversibleSerial gives the same outputs, and its reverse the
    // same inputs as the walk below.
    ct_tensor whole[2], back[2];
    CHECK_OK(ct_layer_forward(rs, &c, in, whole, key, &err), &err);
    CHECK(memcmp(whole[0].data, after + (size_t)NB * 2 * (size_t)n, (size_t)n * sizeof(float)) == 0);
    CHECK_OK(ct_layer_reverse(rs, &c, whole, back, key, &err), &err);
    double whole_err = fmax(max_abs_diff(back[0].data, x1, n), max_abs_diff(back[1].data, x2, n));
    ct_arena_reset(&arena);

    double magnitude = 0;
    for (int64_t i = 0; i < 2 * n; i++) magnitude = fmax(magnitude, fabs(after[(size_t)NB * 2 * (size_t)n + (size_t)i]));
    printf("64-block ReversibleSerial, (B,T,D) = (%d,%d,%d) x 2, dropout 0.1; max |activation| at the top %.2f\n",
           B, T, D, magnitude);
    printf("  depth  max |x - rebuilt x|\n");
    for (int depth = 1; depth <= NB; depth *= 2) {
        // Reverse blocks depth-1 .. 0 from the stack after `depth` blocks.
        ct_tensor s[2] = {ct_tensor_3d(CT_DTYPE_F32, B, T, D, after + (size_t)depth * 2 * (size_t)n),
                          ct_tensor_3d(CT_DTYPE_F32, B, T, D, after + ((size_t)depth * 2 + 1) * (size_t)n)};
        for (int i = 4 * depth - 1; i >= 0; i--) {
            ct_tensor prev[2];
            CHECK_OK(ct_layer_reverse(rs->sub[i], &c, s, prev, ct_key_split(key, (uint32_t)i), &err), &err);
            s[0] = prev[0];
            s[1] = prev[1];
        }
        double e = fmax(max_abs_diff(s[0].data, x1, n), max_abs_diff(s[1].data, x2, n));
        printf("  %5d  %.3e\n", depth, e);
        CHECK_MSG(e <= 1e-4, "depth %d: inputs rebuilt with max abs error %g", depth, e);
        if (depth == NB) CHECK_MSG(e == whole_err, "ReversibleSerial.reverse %g vs walk %g", whole_err, e);
        ct_arena_reset(&arena);
    }
    free(after);
    unbind_net(&net, &arena, &c);
    ct_layer_free(rs);
}

// reverse and reverse_and_grad through a ReversibleSerial give back each
// sublayer's values (and gradients) once the next sublayer has consumed
// them, as the Serial walks do, so their arena peak does not grow with the
// depth -- the point of a reversible stack. Measured on a planned arena
// (where ct_arena_keep works) for 4 and 16 blocks of [Dense half-residual,
// swap]; before, each sublayer's inputs and input gradients stayed to the
// end (4 -> 16 blocks: 20,480 -> 69,632 bytes for reverse, 65,536 ->
// 262,144 for reverse_and_grad). Below 4 blocks the peak is lower: the
// caller's outputs, outside the arena, are still on the stack.
static double rebuilt_error(const ct_tensor *back, float x[2][1024], int64_t n) {
    return fmax(max_abs_diff(back[0].data, x[0], n), max_abs_diff(back[1].data, x[1], n));
}

static void reverse_peaks(int n_blocks, size_t *reverse_peak, size_t *grad_peak) {
    enum { N = 16, D = 64, MAX_BLOCKS = 16 };
    ct_layer *subs[2 * MAX_BLOCKS];
    CHECK(n_blocks <= MAX_BLOCKS);
    for (int i = 0; i < n_blocks; i++) subs[2 * i] = half_dense(D), subs[2 * i + 1] = ct_reversible_swap();
    ct_layer *rs = ct_reversible_serial(2 * n_blocks, subs);
    static float x[2][N * D], y[2][N * D], g[2][N * D];
    ct_tensor in[2] = {ct_tensor_2d(CT_DTYPE_F32, N, D, x[0]), ct_tensor_2d(CT_DTYPE_F32, N, D, x[1])};
    gradcheck_fill(&in[0], 31, -1, 1);
    gradcheck_fill(&in[1], 32, -1, 1);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_arena arena;
    ct_ctx c;
    bind_net(&net, &arena, &c, &dev, rs, in, 2, 3);
    c.record = false;
    ct_key key = ct_key_from_seed(4);
    ct_tensor out[2], back[2], gin[2];
    CHECK_OK(ct_layer_forward(rs, &c, in, out, key, &err), &err);
    // The outputs and their gradients outside the arena: measuring frees it.
    ct_tensor top[2] = {ct_tensor_2d(CT_DTYPE_F32, N, D, y[0]), ct_tensor_2d(CT_DTYPE_F32, N, D, y[1])};
    ct_tensor gtop[2] = {ct_tensor_2d(CT_DTYPE_F32, N, D, g[0]), ct_tensor_2d(CT_DTYPE_F32, N, D, g[1])};
    for (int i = 0; i < 2; i++) {
        memcpy(y[i], out[i].data, sizeof y[i]);
        gradcheck_fill(&gtop[i], 40 + (uint64_t)i, -1, 1);
    }
    // Each half-residual rounds at the size of the activations, which the
    // Dense residuals grow with depth.
    double size = 1.0;
    for (int i = 0; i < N * D; i++) size = fmax(size, fmax(fabsf(y[0][i]), fabsf(y[1][i])));
    CHECK_OK(ct_arena_measure_begin(&arena, &err), &err);
    CHECK_OK(ct_layer_reverse(rs, &c, top, back, key, &err), &err);
    CHECK_MSG(rebuilt_error(back, x, N * D) <= 1e-5 * size, "%d blocks: rebuilt with error %g (max |y| %g)", n_blocks,
              rebuilt_error(back, x, N * D), size);
    *reverse_peak = ct_arena_measure_end(&arena);
    c.record = true;
    CHECK_OK(ct_arena_measure_begin(&arena, &err), &err);
    CHECK_OK(ct_layer_reverse_and_grad(rs, &c, top, gtop, back, gin, key, &err), &err);
    CHECK(c.tape_len == 0);
    CHECK_MSG(rebuilt_error(back, x, N * D) <= 1e-5 * size, "%d blocks: rebuilt with error %g (max |y| %g)", n_blocks,
              rebuilt_error(back, x, N * D), size);
    *grad_peak = ct_arena_measure_end(&arena);
    unbind_net(&net, &arena, &c);
    ct_layer_free(rs);
    CHECK(dev.current_bytes == 0);
}

static void test_reverse_memory(void) {
    size_t rev4, grad4, rev16, grad16;
    reverse_peaks(4, &rev4, &grad4);
    reverse_peaks(16, &rev16, &grad16);
    printf("ReversibleSerial arena peak, 4 -> 16 blocks: reverse %zu -> %zu bytes, reverse_and_grad %zu -> %zu\n",
           rev4, rev16, grad4, grad16);
    CHECK_MSG(rev16 == rev4 && rev4 > 0, "reverse's peak grew with depth: %zu -> %zu bytes", rev4, rev16);
    CHECK_MSG(grad16 == grad4 && grad4 > 0, "reverse_and_grad's peak grew with depth: %zu -> %zu bytes", grad4, grad16);
}

static void test_errors(void) {
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_tensor sigs[2] = {ct_tensor_2d(CT_DTYPE_F32, 4, 6, NULL), ct_tensor_2d(CT_DTYPE_F32, 4, 6, NULL)};
    // A residual of the wrong width.
    ct_layer *l = ct_reversible_half_residual(CT_LAYERS(ct_dense(5)));
    CHECK(ct_net_init(&net, l, sigs, 2, ct_key_from_seed(1), &dev, &err) == CT_ERR_SHAPE);
    printf("half-residual error: %s\n", err.msg);
    CHECK(strstr(err.msg, "ReversibleHalfResidual") && strstr(err.msg, "(4,6) f32") && strstr(err.msg, "(4,5) f32"));
    ct_layer_free(l);
    // A ReversibleSerial with a layer that cannot run in reverse.
    l = ct_reversible_serial(CT_LAYERS(half_dense(6), ct_swap()));
    CHECK(ct_net_init(&net, l, sigs, 2, ct_key_from_seed(1), &dev, &err) == CT_ERR_ARG);
    printf("reversible serial error: %s\n", err.msg);
    CHECK(strstr(err.msg, "sublayer 1 (Swap) is not reversible") != NULL);
    ct_layer_free(l);
    // reverse and reverse_and_grad from an accumulator of the wrong shape:
    // refused naming the layer, with the tape as it was (the recomputation
    // of f pushed onto it before the check).
    float a[4 * 6], b[4 * 6], g[4 * 6];
    ct_tensor in[2] = {ct_tensor_2d(CT_DTYPE_F32, 4, 6, a), ct_tensor_2d(CT_DTYPE_F32, 4, 6, b)};
    gradcheck_fill(&in[0], 1, -1, 1);
    gradcheck_fill(&in[1], 2, -1, 1);
    memcpy(g, a, sizeof g);
    l = half_dense(6);
    ct_arena arena;
    ct_ctx c;
    bind_net(&net, &arena, &c, &dev, l, in, 2, 1);
    ct_tensor out[2] = {ct_tensor_2d(CT_DTYPE_F32, 4, 5, a), in[1]};
    ct_tensor gout[2] = {ct_tensor_2d(CT_DTYPE_F32, 4, 5, g), in[1]};
    ct_tensor rin[2], rgin[2];
    // A good reverse gives back what f allocated: only the rebuilt
    // accumulator stays in the arena.
    ct_tensor fwd[2], one = ct_tensor_sig(&in[0]);
    CHECK_OK(ct_layer_forward(l, &c, in, fwd, ct_key_from_seed(2), &err), &err);
    ct_net_zero_grads(&net);
    c.tape_len = 0;
    size_t used = arena.used;
    CHECK_OK(ct_ctx_alloc(&c, &one, &err), &err);
    size_t one_bytes = arena.used - used;
    used = arena.used;
    CHECK_OK(ct_layer_reverse(l, &c, fwd, rin, ct_key_from_seed(2), &err), &err);
    CHECK_MSG(arena.used - used == one_bytes, "reverse kept %zu bytes in the arena, the accumulator takes %zu",
              arena.used - used, one_bytes);
    ct_arena_reset(&arena);
    for (int op = 0; op < 2; op++) {
        ct_status st = op ? ct_layer_reverse_and_grad(l, &c, out, gout, rin, rgin, ct_key_from_seed(2), &err)
                          : ct_layer_reverse(l, &c, out, rin, ct_key_from_seed(2), &err);
        printf("%s, accumulator (4,5): %s\n", op ? "reverse_and_grad" : "reverse", err.msg);
        CHECK(st == CT_ERR_SHAPE && strstr(err.msg, "ReversibleHalfResidual") &&
              strstr(err.msg, op ? "reverse_and_grad" : "reverse") && strstr(err.msg, "(4,5) f32"));
        CHECK_MSG(c.tape_len == 0, "%d tape entries left", c.tape_len);
        ct_arena_reset(&arena);
    }
    unbind_net(&net, &arena, &c);
    ct_layer_free(l);
    // Arity.
    l = half_with_ids(6, 7);
    CHECK(l->n_in == 3 && l->n_out == 3 && ct_layer_is_reversible(l));
    ct_layer_free(l);
    l = ct_reversible_serial(CT_LAYERS(half_dense(6), ct_reversible_swap()));
    CHECK(l->n_in == 2 && l->n_out == 2 && ct_layer_is_reversible(l));
    ct_layer_free(l);
    l = ct_dense(3);
    CHECK(!ct_layer_is_reversible(l));
    ct_layer_free(l);
    CHECK(dev.current_bytes == 0);
}

// ReformerLM: Trax's layer order, arity, names, and gradients through the
// whole model (tokens in, logits out).
static void test_reformer_lm(void) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = 7;
    p.d_model = 8;
    p.d_ff = 12;
    p.n_layers = 2;
    p.n_heads = 2;
    p.max_len = 8;
    p.dropout = 0.1f;
    p.d_attention_key = p.d_attention_value = 4;  // d_model / n_heads (Trax's default 64 would dwarf d_model)
    ct_layer *m = ct_reformer_lm(p);
    CHECK(m->n_in == 1 && m->n_out == 1 && strcmp(m->name, "ReformerLM") == 0);
    const char *order[] = {"ShiftRight", "Embedding", "Dropout", "PositionalEncoding", "Dup", "ReversibleSerial",
                           "Concatenate", "LayerNorm", "Dropout", "Dense"};
    CHECK(m->n_sub == 10);
    for (int i = 0; i < m->n_sub && i < 10; i++)
        CHECK_MSG(strncmp(m->sub[i]->name, order[i], strlen(order[i])) == 0, "sublayer %d is %s", i, m->sub[i]->name);
    ct_layer *rs = m->sub[5];
    CHECK(rs->n_sub == 4 * p.n_layers && ct_layer_is_reversible(rs));
    CHECK(strcmp(rs->sub[0]->name, "ReversibleHalfResidualAttn") == 0);
    CHECK(strcmp(rs->sub[2]->name, "ReversibleHalfResidualFF") == 0);
    CHECK(strcmp(rs->sub[3]->vt->type, "ReversibleSwap") == 0);

    int32_t tokens[2 * 6] = {1, 2, 3, 4, 5, 6, 6, 5, 4, 3, 2, 1};
    ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, 2, 6, tokens);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_tensor sig = ct_tensor_sig(&in);
    CHECK_OK(ct_net_init(&net, m, &sig, 1, ct_key_from_seed(1), &dev, &err), &err);
    CHECK(net.out_sigs[0].ndim == 3 && net.out_sigs[0].shape[2] == 7);
    CHECK(ct_net_find_param(&net, "ReformerLM/ReversibleSerial[5]/ReversibleHalfResidualAttn[0]/Serial[0]/"
                                  "SelfAttention[1]/Wq[1]") != NULL);
    CHECK(ct_net_find_param(&net, "ReformerLM/Dense[9]/kernel")->sig.shape[0] == 2 * p.d_model);
    ct_net_free(&net);
    check_model_grad("ReformerLM(2 layers)", m, &in, 1);
    ct_layer_free(m);
    CHECK(dev.current_bytes == 0);
}

int main(void) {
    test_errors();
    test_reformer_lm();
    test_gradients();
    test_gradients_f_aliases();
    test_reverse();
    test_deep_reconstruction();
    test_reverse_memory();
    return check_summary("test_reversible");
}
