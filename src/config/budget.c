// Memory budgets before allocation: what a model and a training step need,
// from the settings alone, checked against the device's limit and the
// machine's memory before anything is built. A model of 10^8 layers or a
// batch of 2^24 examples is refused here, naming the setting and the bytes,
// instead of running out of memory (or being killed by the kernel) halfway
// through building it.
//
// Everything is counted in double: products of settings (n_layers x d_model^2,
// batch x T^2 x heads) pass 2^64 long before they pass a double's range, and
// an estimate needs no more than a double's 15 digits.
//
// The counts follow the models' code (src/models/): tests/test_config.c
// builds small models and checks that the planned weights equal the net's,
// so a model that changes without its plan fails there.
#include <limits.h>
#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <string.h>

#include "config/internal.h"
#include "ctrax/core/memory.h"
#include "ctrax/models/models.h"
#include "ctrax/optim/optimizer.h"

#define PLAN_MAX_STRUCT_BYTES 512
#define F32 4.0  // bytes per float

// ---- Plans -----------------------------------------------------------------------------------

// count weights of shape (r) (c == 0) or (r, c); equal shapes share a group.
static void add_w(cfg_plan *p, int64_t r, int64_t c, double count) {
    int ndim = c ? 2 : 1;
    for (int i = 0; i < p->n_w; i++)
        if (p->w[i].ndim == ndim && p->w[i].shape[0] == r && p->w[i].shape[1] == c) {
            p->w[i].count += count;
            return;
        }
    CT_ASSERT(p->n_w < CFG_PLAN_MAX_GROUPS);
    p->w[p->n_w].ndim = ndim;
    p->w[p->n_w].shape[0] = r;
    p->w[p->n_w].shape[1] = c;
    p->w[p->n_w].count = count;
    p->n_w++;
}

static void layer_norm(cfg_plan *p, int64_t d, double n) { add_w(p, d, 0, 2 * n); }  // scale, bias
static void dense(cfg_plan *p, int64_t in, int64_t out, double n) {
    add_w(p, in, out, n);  // kernel
    add_w(p, out, 0, n);   // bias
}

// A decoder block's weights, both models: LayerNorm + CausalAttention (q, k,
// v and output Dense(d_model)), LayerNorm + Dense(d_ff) + Dense(d_model).
static void decoder_blocks(cfg_plan *p, int64_t d, int64_t ff, double n) {
    layer_norm(p, d, 2 * n);
    dense(p, d, d, 4 * n);
    dense(p, d, ff, n);
    dense(p, ff, d, n);
}

// What a block keeps per token for backward, counted from below: LayerNorm
// outputs, q, k, v, the attention output and its projection, the residual
// sum (8 x d_model), the two d_ff activations. Attention keeps no T x T
// probabilities (the tiled and chunked kernels recompute them in backward),
// only a logsumexp per head and token.
static double block_act_per_token(int64_t d, int64_t ff) { return 8.0 * (double)d + 2.0 * (double)ff; }

ct_status cfg_plan_transformer_lm(ct_config *cfg, const char *name, const void *vp, const ct_config_run_shape *run,
                                  cfg_plan *out, ct_error *err) {
    (void)cfg, (void)name, (void)err;
    // A TransformerLM has no reversible layers, so the memory-efficient
    // trainer runs it as one unit: all its activations at once either way.
    (void)run;
    const ct_transformer_lm_params *m = vp;
    memset(out, 0, sizeof *out);
    double layers = m->n_layers;
    add_w(out, m->vocab_size, m->d_model, 1);  // embedding
    if (!m->fixed_positions) add_w(out, m->max_len, m->d_model, 1);
    else out->host_floats = (double)m->max_len * (double)m->d_model;  // the fixed sinusoid table
    decoder_blocks(out, m->d_model, m->d_ff, layers);
    layer_norm(out, m->d_model, 1);
    dense(out, m->d_model, m->vocab_size, 1);
    // Embedding, positions, final LayerNorm; logits and their log-softmax.
    out->act_per_token = layers * (block_act_per_token(m->d_model, m->d_ff) + m->n_heads) + 3.0 * m->d_model +
                         2.0 * m->vocab_size;
    out->logits_per_token = 2.0 * m->vocab_size;
    out->act_per_token_sq = 0.0;
    out->uses_length = true;
    return CT_OK;
}

// ReformerLM's attention weights per block: CausalAttention's four
// Dense(d_model), or SelfAttention's per-head Wq, Wk (unless share_qk), Wv
// (D, d) and Wo (d_v, D), no biases.
static void reformer_attention_w(cfg_plan *out, const ct_reformer_lm_params *m, double layers) {
    int n = m->n_attention > 0 ? m->n_attention : 1;
    double per_type = layers / n;
    int64_t dk = m->d_attention_key ? m->d_attention_key : CT_REFORMER_D_ATTENTION;
    int64_t dv = m->d_attention_value ? m->d_attention_value : CT_REFORMER_D_ATTENTION;
    for (int i = 0; i < n && i < CT_REFORMER_MAX_ATTENTION; i++) {
        if (m->attention[i] == CT_REFORMER_CAUSAL_ATTENTION) {
            dense(out, m->d_model, m->d_model, 4 * per_type);
            continue;
        }
        double heads = per_type * m->n_heads;
        bool shared = m->attention[i] == CT_REFORMER_LSH_ATTENTION || m->self_attention.share_qk;
        add_w(out, m->d_model, dk, (shared ? 1 : 2) * heads);
        add_w(out, m->d_model, dv, heads);
        add_w(out, dv, m->d_model, heads);
    }
}

// LSHSelfAttention's state per layer: its buckets, (n_heads, n_hashes x L)
// per example with L = max_length_for_buckets or the length, and 11 hash
// counters (src/layers/lsh_attention.c).
static void reformer_lsh_state(cfg_plan *out, const ct_reformer_lm_params *m, double layers) {
    int n = m->n_attention > 0 ? m->n_attention : 1;
    const ct_lsh_self_attention_params *l = &m->lsh_attention;
    for (int i = 0; i < n && i < CT_REFORMER_MAX_ATTENTION; i++) {
        if (m->attention[i] != CT_REFORMER_LSH_ATTENTION) continue;
        double buckets = (double)m->n_heads * l->n_hashes * layers / n;
        out->state_floats += 11.0 * layers / n;
        if (l->max_length_for_buckets > 0) out->state_per_example += buckets * l->max_length_for_buckets;
        else out->state_per_token += buckets;
    }
}

// What one block's attention keeps per token for backward, averaged over
// the attention list: CausalAttention's q, k, v and output (4 d_model, its
// logsumexps counted apart); SelfAttention's q, k, v, o per head; LSH's q,
// v, o, each round's logsumexp and its buckets per head (not each round's
// o: src/layers/efficient_attention.c, lsh_attention.c).
static double reformer_attention_act(const ct_reformer_lm_params *m) {
    int n = m->n_attention > 0 ? m->n_attention : 1;
    double dk = m->d_attention_key ? m->d_attention_key : CT_REFORMER_D_ATTENTION;
    double dv = m->d_attention_value ? m->d_attention_value : CT_REFORMER_D_ATTENTION;
    double sum = 0.0, R = m->lsh_attention.n_hashes;
    for (int i = 0; i < n && i < CT_REFORMER_MAX_ATTENTION; i++) {
        if (m->attention[i] == CT_REFORMER_CAUSAL_ATTENTION) sum += 4.0 * m->d_model;
        else if (m->attention[i] == CT_REFORMER_SELF_ATTENTION) sum += m->n_heads * (2.0 * dk + 2.0 * dv);
        else sum += m->n_heads * (dk + 2.0 * dv + 2.0 * R);
    }
    return sum / n;
}

// Whether every attention layer keeps no T x T probabilities nor a
// logsumexp per head and row (SelfAttention keeps neither; LSHSelfAttention
// keeps its rounds' logsumexps, counted in the block as from below).
static bool reformer_attention_linear(const ct_reformer_lm_params *m) {
    for (int i = 0; i < m->n_attention && i < CT_REFORMER_MAX_ATTENTION; i++)
        if (m->attention[i] == CT_REFORMER_CAUSAL_ATTENTION) return false;
    return true;
}

// The positional encoding by pos_type: the trainable table (max_len,
// d_model), none, fixed-base's Trax defaults (4 bases x 8 digits of d_model
// / 8, and a start vector), or the axial tables.
static void reformer_positions(cfg_plan *out, const ct_reformer_lm_params *m) {
    const char *t = m->pos_type;
    if ((!t || !t[0]) && m->fixed_positions) {
        out->host_floats = (double)m->max_len * (double)m->d_model;  // the fixed sinusoid table
    } else if (!t || !t[0]) {
        add_w(out, m->max_len, m->d_model, 1);  // before the halves split
    } else if (!strcmp(t, "fixed-base")) {
        add_w(out, m->d_model / 8, 0, 4 * 8);
        add_w(out, m->d_model, 0, 1);
    } else if (!strcmp(t, "axial")) {
        out->exact_length = 1;
        for (int k = 0; k < m->pos_axial_n && k < CT_AXIAL_MAX_AXES; k++) {
            add_w(out, m->pos_axial_shape[k], m->pos_d_axial_embs[k], 1);
            out->exact_length *= m->pos_axial_shape[k];
        }
        out->exact_length_param = "pos_axial_shape";
    }
}

ct_status cfg_plan_reformer_lm(ct_config *cfg, const char *name, const void *vp, const ct_config_run_shape *run,
                               cfg_plan *out, ct_error *err) {
    (void)cfg, (void)name, (void)err;
    const ct_reformer_lm_params *m = vp;
    memset(out, 0, sizeof *out);
    double layers = m->n_layers;
    add_w(out, m->vocab_size, m->d_model, 1);
    reformer_positions(out, m);
    reformer_attention_w(out, m, layers);
    reformer_lsh_state(out, m, layers);
    // The feed-forward: LayerNorm, Dense(d_ff), Dense(d_model); or ff_use_sru
    // SRU(d_model) layers, each a Dense(3 d_model), and no LayerNorm.
    if (m->ff_use_sru > 0) {
        layer_norm(out, m->d_model, layers);
        dense(out, m->d_model, 3 * (int64_t)m->d_model, layers * m->ff_use_sru);
    } else {
        layer_norm(out, m->d_model, 2 * layers);
        dense(out, m->d_model, m->d_ff, layers);
        dense(out, m->d_ff, m->d_model, layers);
    }
    layer_norm(out, 2 * (int64_t)m->d_model, 1);  // over both halves, concatenated
    dense(out, 2 * (int64_t)m->d_model, m->vocab_size, 1);
    // The memory-efficient trainer holds one reversible layer's activations
    // at a time; the standard one keeps every layer's. From below: a chunked
    // feed-forward keeps none of its d_ff activations (it recomputes them),
    // and SelfAttention keeps no T x T probabilities (and no logsumexp).
    double held = run && run->memory_efficient ? 1.0 : layers;
    if (m->n_layers == 0) held = 0;
    // block_act_per_token's q, k, v and attention output (4 d_model) are the
    // attention's own here.
    double block = block_act_per_token(m->d_model, m->d_ff) - 4.0 * m->d_model + reformer_attention_act(m) -
                   (m->ff_chunk_size > 0 ? 2.0 * m->d_ff : 0.0);
    // An SRU keeps its Dense's (3 d_model) output and its cell states
    // (d_model) per token instead of the feed-forward's d_ff activations.
    if (m->ff_use_sru > 0) block += 4.0 * m->d_model * m->ff_use_sru - 2.0 * m->d_ff;
    bool self_attention = reformer_attention_linear(m);
    out->act_per_token = held * (block + (self_attention ? 0.0 : m->n_heads)) + 6.0 * m->d_model + 2.0 * m->vocab_size;
    out->logits_per_token = 2.0 * m->vocab_size;
    out->act_per_token_sq = 0.0;
    out->uses_length = true;
    return CT_OK;
}

// The MLP's input width is the data's: an IDX file's (rows, cols) from its
// header (28 x 28 for MNIST), flattened to rows x cols or, unflattened, a
// Dense over cols at each of the rows. Data of no known shape count as
// width 1, from below (token ids: the first Dense refuses them at init).
// Widths the builder would refuse leave the plan empty (the builder says
// why).
ct_status cfg_plan_mlp(ct_config *cfg, const char *name, const void *vp, const ct_config_run_shape *run,
                       cfg_plan *out, ct_error *err) {
    (void)vp;
    memset(out, 0, sizeof *out);
    int w[CFG_MLP_MAX_LAYERS], n;
    if (cfg_mlp_widths(cfg, name, w, &n, err) != CT_OK) return CT_OK;
    int64_t rows = 0, cols = 0;
    if (run && run->inputs) cfg_inputs_image_dims(cfg, run->inputs, &rows, &cols);
    const ct_config_value *flatten;
    bool flat = cfg_query_default(cfg, name, "flatten", &flatten, NULL) != CT_OK || flatten->b;
    int64_t prev = !rows ? 1 : flat ? rows * cols : cols;
    double positions = rows && !flat ? (double)rows : 1.0;  // the Dense's rows per example
    for (int i = 0; i < n; i++) {
        if (out->n_w + 2 > CFG_PLAN_MAX_GROUPS) {
            // Many distinct shapes: fold the rest into flat groups (the
            // optimizer's factored slots then count from above, by a little).
            add_w(out, prev * w[i] + w[i], 0, 1);
        } else {
            dense(out, prev, w[i], 1);
        }
        out->act_per_example += 2.0 * (double)w[i] * positions;  // Dense output, Relu output
        prev = w[i];
    }
    return CT_OK;
}

// RNNLM: the embedding (V, D), per layer a GRUCell's W1 (2D, 2D), b1, W2
// (2D, D), b2 or an LSTMCell's W (2D, 4D), b, and the Dense (D, V).
// Activations from below: embedding, dropout and the scan's stacked
// outputs (3D), per layer and step what a cell allocates (GRUCell: h' twice,
// [x | h], [u | r], [x | r h], c: 9D; LSTMCell: h', [c' | h'], [x | h], the
// 4 gates: 9D), the logits and their log-softmax; the scan keeps every
// step's tape (Trax's remat=False).
ct_status cfg_plan_rnnlm(ct_config *cfg, const char *name, const void *vp, const ct_config_run_shape *run,
                         cfg_plan *out, ct_error *err) {
    (void)cfg, (void)name, (void)err, (void)run;
    const ct_rnnlm_params *m = vp;
    memset(out, 0, sizeof *out);
    int64_t d = m->d_model;
    add_w(out, m->vocab_size, d, 1);
    bool lstm = m->rnn_cell && !strcmp(m->rnn_cell, "LSTMCell");
    if (lstm) {
        add_w(out, 2 * d, 4 * d, m->n_layers);
        add_w(out, 4 * d, 0, m->n_layers);
    } else {
        add_w(out, 2 * d, 2 * d, m->n_layers);
        add_w(out, 2 * d, 0, m->n_layers);
        add_w(out, 2 * d, d, m->n_layers);
        add_w(out, d, 0, m->n_layers);
    }
    dense(out, d, m->vocab_size, 1);
    out->act_per_token = 3.0 * (double)d + 9.0 * (double)d * m->n_layers + 2.0 * m->vocab_size;
    out->logits_per_token = 2.0 * m->vocab_size;
    out->uses_length = true;
    return CT_OK;
}

// ---- Totals ----------------------------------------------------------------------------------

typedef struct totals {
    double weights;  // floats
    double slots;    // floats
    double host;     // floats
    double state, state_per_example, state_per_token;  // one copy of the state slab (see cfg_plan)
} totals;

static totals plan_totals(const cfg_plan *p, const ct_optimizer *opt) {
    totals t = {0, 0, p->host_floats, p->state_floats, p->state_per_example, p->state_per_token};
    for (int i = 0; i < p->n_w; i++) {
        double numel = (double)p->w[i].shape[0] * (p->w[i].ndim == 2 ? (double)p->w[i].shape[1] : 1.0);
        t.weights += numel * p->w[i].count;
        // A shape past 2^62 floats (RNNLM's (2 d_model, 4 d_model) with
        // d_model near 2^31) is no tensor: its numel would overflow an
        // int64; its weights alone refuse the run, its slots count as none.
        if (opt && p->w[i].count > 0 && numel < 0x1p62) {
            ct_tensor sig = p->w[i].ndim == 2 ? ct_tensor_2d(CT_DTYPE_F32, p->w[i].shape[0], p->w[i].shape[1], NULL)
                                              : ct_tensor_1d(CT_DTYPE_F32, p->w[i].shape[0], NULL);
            t.slots += (double)ct_optimizer_slot_floats(opt, &sig) * p->w[i].count;
        }
    }
    return t;
}

// A device's share of the batch, in examples.
static double device_examples(const ct_config_run_shape *run) {
    int n_dev = run->n_devices > 0 ? run->n_devices : 1, n_proc = run->n_processes > 0 ? run->n_processes : 1;
    return ceil(ceil((double)run->batch_size / n_proc) / n_dev);
}

// The state slab's bytes (its copies together) for `examples` of T tokens.
static double state_bytes(const totals *t, const ct_config_run_shape *run, int64_t T, double examples) {
    double per_example = t->state_per_example + t->state_per_token * (double)T;
    return F32 * (t->state + per_example * examples) * (run->memory_efficient ? 3 : 2);
}

// What the run's trainer holds for the model on this process: weights, a
// gradient slab per local device (the memory-efficient trainer keeps one
// layer's gradients at a time: none counted), the optimizer's slots and the
// tables kept with the layers, and the state slab for a device's share of
// the batch: twice (the standard trainer keeps the state as the step found
// it, to put back after a non-finite step) or three times (the
// memory-efficient one keeps it around each layer's forward); other
// devices' copies are not counted (from below); T is the examples' length
// (0: the data decide it). Without a run (run == NULL, a builder's check):
// the weights, the gradient slab ct_net_init allocates beside them, and the
// tables.
static double model_bytes(const totals *t, const ct_config_run_shape *run, int64_t T) {
    if (!run) return F32 * (2 * t->weights + t->host);
    int n_dev = run->n_devices > 0 ? run->n_devices : 1;
    double grads = run->memory_efficient ? 0 : (double)n_dev * t->weights;
    return F32 * (t->weights + grads + t->slots + t->host) + state_bytes(t, run, T, device_examples(run));
}

// The plan of the model d (params struct p, NULL for a model built from the
// config directly) under run (NULL: as a builder sees it).
static ct_status model_need(ct_config *cfg, const char *name, const cfg_def *d, const void *p,
                            const ct_config_run_shape *run, const ct_optimizer *opt, cfg_plan *plan, double *bytes,
                            totals *tot, ct_error *err) {
    CT_TRY(d->plan(cfg, name, p, run, plan, err));
    totals t = plan_totals(plan, opt);
    if (tot) *tot = t;
    int64_t length = 0;
    const char *length_param;
    if (run && run->inputs) CT_TRY(cfg_inputs_length(cfg, run->inputs, false, &length, &length_param, err));
    *bytes = model_bytes(&t, run, length);
    return CT_OK;
}

// ---- Errors ----------------------------------------------------------------------------------

typedef struct limit {
    double bytes;  // 0: none
    bool device;   // the device's limit (else the machine's memory)
} limit;

// The smaller of the device's limit (when it applies) and the machine's memory.
static limit limit_for(const ct_config_run_shape *run, bool device_applies) {
    limit l = {(double)ct_machine_memory_bytes(), false};
    if (run && device_applies && run->device_limit_bytes &&
        (l.bytes == 0 || (double)run->device_limit_bytes < l.bytes)) {
        l.bytes = (double)run->device_limit_bytes;
        l.device = true;
    }
    return l;
}

static void limit_text(limit l, char *buf, size_t len) {
    char b[32];
    ct_format_bytes(l.bytes, b, sizeof b);
    if (l.device) snprintf(buf, len, "the device's limit is %s", b);
    else snprintf(buf, len, "this machine has %s", b);
}

// The setting behind the run's batch size: train.batch_size, or the
// inputs' batch_size (batch_size_per_device) where the config sets it there
// as Trax's configs do (per process, or per device: its value then differs
// from the step's batch, which is said too).
static void batch_size_text(ct_config *cfg, const ct_config_run_shape *run, char *buf, size_t len) {
    char v[32], where[300];
    snprintf(v, sizeof v, "%lld", (long long)run->batch_size);
    cfg_where(cfg, "train", "batch_size", where, sizeof where);
    const char *slash = run->inputs ? strrchr(run->inputs, '/') : NULL;
    char why[256];
    const cfg_def *d = where[0] || !run->inputs ? NULL : cfg_lookup(slash ? slash + 1 : run->inputs, why, sizeof why);
    static const char *const params[] = {"batch_size", "batch_size_per_device"};
    for (int i = 0; d && i < 2; i++) {
        const ct_config_value *bound;
        if (!cfg_def_param(d, params[i])) continue;
        cfg_where(cfg, run->inputs, params[i], where, sizeof where);
        if (!where[0] || cfg_query_default(cfg, run->inputs, params[i], &bound, NULL) != CT_OK) continue;
        cfg_setting_text(cfg, run->inputs, params[i], NULL, buf, len);
        size_t used = strlen(buf);
        if (bound->kind == CT_CONFIG_INT && bound->i != run->batch_size && used < len)
            snprintf(buf + used, len - used, " (a step's batch of %s)", v);
        return;
    }
    cfg_setting_text(cfg, "train", "batch_size", v, buf, len);
}

// The int parameter of the struct-backed model d whose binding makes the
// model big: the one that, put back to its default, shrinks it the most.
// NULL when no bound parameter does (the defaults themselves are big).
static const cfg_param *blame_model(ct_config *cfg, const char *name, const cfg_def *d, const void *p,
                                    const ct_config_run_shape *run, const ct_optimizer *opt, double bytes) {
    if (!p || !d->defaults) return NULL;
    CT_ASSERT(d->struct_size <= PLAN_MAX_STRUCT_BYTES);
    alignas(max_align_t) unsigned char def[PLAN_MAX_STRUCT_BYTES], alt[PLAN_MAX_STRUCT_BYTES];
    d->defaults(def);
    const cfg_param *best = NULL;
    double best_cut = 0;
    for (int i = 0; i < d->n_params; i++) {
        const cfg_param *q = &d->params[i];
        if (!q->has_field || q->type != CFG_INT) continue;
        char where[300];
        cfg_where(cfg, name, q->name, where, sizeof where);
        if (!where[0]) continue;  // a default is nobody's doing
        memcpy(alt, p, d->struct_size);
        memcpy(alt + q->field, def + q->field, q->field_size);
        cfg_plan plan;
        double alt_bytes;
        if (model_need(cfg, name, d, alt, run, opt, &plan, &alt_bytes, NULL, NULL) != CT_OK) continue;
        if (bytes - alt_bytes > best_cut) {
            best_cut = bytes - alt_bytes;
            best = q;
        }
    }
    return best;
}

// The error for a model of `bytes` over l.
static ct_status refuse_model(ct_config *cfg, const char *name, const cfg_def *d, const void *p,
                              const ct_config_run_shape *run, const ct_optimizer *opt, const totals *t, double bytes,
                              limit l, ct_error *err) {
    const cfg_param *q = blame_model(cfg, name, d, p, run, opt, bytes);
    char setting[400], lim[80], need[32];
    if (q) cfg_setting_text(cfg, name, q->name, NULL, setting, sizeof setting);
    else if (!p) cfg_setting_text(cfg, name, cfg_mlp_widths_param(cfg, name), NULL, setting, sizeof setting);
    else snprintf(setting, sizeof setting, "%s (its settings together)", name);
    limit_text(l, lim, sizeof lim);
    ct_format_bytes(bytes, need, sizeof need);
    const char *what = !run                  ? "weights, gradients"
                       : run->memory_efficient ? "weights, optimizer slots"
                                               : "weights, gradients, optimizer slots";
    // Name the positional table when it is what is big (max_len x d_model).
    char table[96] = "";
    if (F32 * t->host > bytes / 2) {
        char tb[32];
        snprintf(table, sizeof table, "; the positional table alone %s", ct_format_bytes(F32 * t->host, tb, sizeof tb));
    }
    // "weights, gradients, optimizer slots" -> "weights, gradients and
    // optimizer slots", or "... slots and positional table".
    char list[160];
    const char *last = strrchr(what, ',');
    if (t->host > 0) snprintf(list, sizeof list, "%s and positional table", what);
    else if (last) snprintf(list, sizeof list, "%.*s and%s", (int)(last - what), what, last + 1);
    else snprintf(list, sizeof list, "%s", what);
    return ct_error_set(err, CT_ERR_MEMORY, "%s: the model's %s need about %s (%.3g weights%s); %s", setting, list,
                        need, t->weights, table, lim);
}

ct_status cfg_check_model_memory(ct_config *cfg, const char *name, const cfg_def *d, const void *p, ct_error *err) {
    cfg_plan plan;
    totals t;
    double bytes;
    CT_TRY(model_need(cfg, name, d, p, NULL, NULL, &plan, &bytes, &t, err));
    limit l = limit_for(NULL, false);
    if (l.bytes > 0 && bytes > l.bytes) return refuse_model(cfg, name, d, p, NULL, NULL, &t, bytes, l, err);
    return CT_OK;
}

// ---- The run's budget --------------------------------------------------------------------------

// The error for a state slab (LSHSelfAttention's stored buckets, for a
// device's share of the batch) of `state` bytes that does not fit beside
// the model's `rest`: naming what makes one example's state big
// (max_length_for_buckets, else the examples' length) when one example's
// does not fit, else the batch size.
static ct_status refuse_state(ct_config *cfg, const ct_config_run_shape *run, const totals *t, int64_t length,
                              const char *length_param, double rest, double state, limit l, ct_error *err) {
    char setting[400], lim[80], b[32], m[32];
    double examples = device_examples(run);
    if (rest + state_bytes(t, run, length, 1) > l.bytes && t->state_per_example > 0) {
        cfg_setting_text(cfg, cfg_scoped_ref(cfg, run->model, "LSHSelfAttention"), "max_length_for_buckets", NULL,
                         setting, sizeof setting);
    } else if (rest + state_bytes(t, run, length, 1) > l.bytes && length_param) {
        cfg_setting_text(cfg, run->inputs, length_param, NULL, setting, sizeof setting);
    } else {
        batch_size_text(cfg, run, setting, sizeof setting);
    }
    limit_text(l, lim, sizeof lim);
    return ct_error_set(err, CT_ERR_MEMORY,
                        "%s: the state slab (LSHSelfAttention's stored buckets) for a device's %.0f example%s of "
                        "%lld tokens needs about %s on top of the model's %s; %s",
                        setting, examples, examples == 1 ? "" : "s", (long long)length,
                        ct_format_bytes(state, b, sizeof b),
                        ct_format_bytes(rest, m, sizeof m), lim);
}

// The axial table covers exactly its shape's product (Trax's too): an
// error naming the model's setting and the inputs' length setting.
static ct_status refuse_exact_length(ct_config *cfg, const ct_config_run_shape *run, const cfg_plan *plan,
                                     int64_t length, const char *length_param, ct_error *err) {
    char model_setting[400], input_setting[400];
    cfg_setting_text(cfg, run->model, plan->exact_length_param, NULL, model_setting, sizeof model_setting);
    if (!strcmp(plan->exact_length_param, "pos_axial_shape")) {
        // Trax's older spelling, when that is what the config wrote.
        char where[300];
        cfg_where(cfg, run->model, "axial_pos_shape", where, sizeof where);
        if (where[0]) cfg_setting_text(cfg, run->model, "axial_pos_shape", NULL, model_setting, sizeof model_setting);
    }
    cfg_setting_text(cfg, run->inputs, length_param ? length_param : "?", NULL, input_setting, sizeof input_setting);
    return ct_error_set(err, CT_ERR_ARG,
                        "%s multiplies to %lld, but the inputs' examples are %lld tokens long (%s): the axial "
                        "positions cover exactly that product",
                        model_setting, (long long)plan->exact_length, (long long)length, input_setting);
}

static ct_status check_run(ct_config *cfg, const ct_config_run_shape *run, const cfg_def *d, const void *p,
                           const ct_optimizer *opt, ct_config_memory *mem, ct_error *err) {
    // Every process, then every device, takes equal rows: said here, naming
    // the settings, rather than by the trainer at the first step.
    int n_proc = run->n_processes > 0 ? run->n_processes : 1, n_dev = run->n_devices > 0 ? run->n_devices : 1;
    if (run->batch_size > 0 && run->batch_size % ((int64_t)n_proc * n_dev) != 0) {
        char setting[400], dev[400], proc[400] = "", v[32];
        batch_size_text(cfg, run, setting, sizeof setting);
        snprintf(v, sizeof v, "%d", n_dev);
        cfg_setting_text(cfg, "train", "n_devices", v, dev, sizeof dev);
        if (n_proc > 1) {
            snprintf(v, sizeof v, "%d", n_proc);
            cfg_setting_text(cfg, "train", "n_processes", v, proc, sizeof proc);
        }
        return ct_error_set(err, CT_ERR_ARG, "%s does not split into equal rows over %s%s%s: make it a multiple of %lld",
                            setting, dev, proc[0] ? " x " : "", proc, (long long)n_proc * n_dev);
    }
    cfg_plan plan;
    totals t;
    double mbytes;
    CT_TRY(model_need(cfg, run->model, d, p, run, opt, &plan, &mbytes, &t, err));
    mem->weights = t.weights;
    mem->model_bytes = mbytes;
    // The model first: with the standard trainer it all sits on the device;
    // the memory-efficient one keeps it in host memory.
    limit lm = limit_for(run, !run->memory_efficient);
    int64_t length = 0;
    const char *length_param = NULL;
    if (run->inputs) CT_TRY(cfg_inputs_length(cfg, run->inputs, false, &length, &length_param, err));
    if (lm.bytes > 0 && mbytes > lm.bytes) {
        // The state slab grows with the batch and the examples' length: when
        // it is what does not fit, those are the settings, not the model's.
        double examples = device_examples(run), state = state_bytes(&t, run, length, examples);
        if (mbytes - state <= lm.bytes)
            return refuse_state(cfg, run, &t, length, length_param, mbytes - state, state, lm, err);
        return refuse_model(cfg, run->model, d, p, run, opt, &t, mbytes, lm, err);
    }

    // Then one step's activations, for this process's share of the batch.
    if (plan.exact_length > 0 && length > 0 && length != plan.exact_length)
        return refuse_exact_length(cfg, run, &plan, length, length_param, err);
    if (plan.uses_length && length <= 0) return CT_OK;  // the data decide T: nothing to estimate
    mem->example_length = plan.uses_length ? length : 0;
    double T = plan.uses_length ? (double)length : 0;
    double share = ceil((double)run->batch_size / n_proc);
    // The matrix products take their rows (a device's examples x T) as the
    // BLAS's int.
    double rows = ceil(share / n_dev) * (T > 0 ? T : 1);
    if (rows > INT_MAX) {
        char setting[400];
        batch_size_text(cfg, run, setting, sizeof setting);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s: a device's share of the batch is %.0f rows (%.0f examples x %.0f tokens) in one "
                            "matrix product, more than the BLAS's int holds (%d)",
                            setting, rows, ceil(share / n_dev), T > 0 ? T : 1, INT_MAX);
    }
    double per_example = F32 * (plan.act_per_token * T + plan.act_per_token_sq * T * T + plan.act_per_example);
    double act = share * per_example;
    if (run->loss_chunk_size > 0 && T > 0) {
        // The logits of one chunk of rows per device, not of every row.
        double chunked = F32 * plan.logits_per_token * fmin((double)run->loss_chunk_size, rows);
        act -= share * F32 * plan.logits_per_token * T;
        act += chunked * n_dev;
        per_example -= F32 * plan.logits_per_token * T;
    }
    mem->activation_bytes = act;
    // The memory-efficient trainer's device holds activations only; the
    // machine holds everything.
    limit la = limit_for(run, true);
    double need = run->memory_efficient && la.device ? act : mbytes + act;
    // Evals run batches of their own shape: longer examples (a copy task's
    // eval_max_length) or more of them (the batcher's eval_batch_size),
    // counted as a step's activations at that shape, so that a run that
    // cannot evaluate is refused now, not at its first eval.
    int64_t eval_length = length, eval_batch = 0;
    const char *eval_length_param = NULL, *eval_batch_param = NULL;
    if (run->inputs && la.bytes > 0) {
        if (plan.uses_length)
            CT_TRY(cfg_inputs_length(cfg, run->inputs, true, &eval_length, &eval_length_param, err));
        CT_TRY(cfg_inputs_eval_batch(cfg, run->inputs, &eval_batch, &eval_batch_param, err));
    }
    double eval_share = eval_batch > 0 ? ceil((double)eval_batch / n_proc) : share;
    if (eval_length > length || eval_share > share) {
        double Te = plan.uses_length ? (double)eval_length : 0;
        double eval_act =
            eval_share * F32 * (plan.act_per_token * Te + plan.act_per_token_sq * Te * Te + plan.act_per_example);
        double eval_need = need - act + eval_act;
        if (eval_need > la.bytes) {
            char setting[400], lim[80], b[32], m[32], shape[96];
            if (eval_share > share) cfg_setting_text(cfg, run->inputs, eval_batch_param, NULL, setting, sizeof setting);
            else cfg_setting_text(cfg, run->inputs, eval_length_param, NULL, setting, sizeof setting);
            if (Te > 0) snprintf(shape, sizeof shape, "%.0f x %.0f tokens", eval_share, Te);
            else snprintf(shape, sizeof shape, "%.0f examples", eval_share);
            limit_text(la, lim, sizeof lim);
            return ct_error_set(err, CT_ERR_MEMORY,
                                "%s: an eval step's activations need about %s (%s) on top of the model's %s; %s",
                                setting, ct_format_bytes(eval_act, b, sizeof b), shape,
                                ct_format_bytes(eval_need - eval_act, m, sizeof m), lim);
        }
    }
    if (la.bytes > 0 && need > la.bytes) {
        char setting[400], lim[80], b[32], m[32], tail[160] = "";
        limit_text(la, lim, sizeof lim);
        if (need > act) snprintf(tail, sizeof tail, " on top of the model's %s", ct_format_bytes(mbytes, m, sizeof m));
        double one = need - act + per_example;
        if (one > la.bytes && length_param) {
            // One example is already too big: its length is the setting.
            cfg_setting_text(cfg, run->inputs, length_param, NULL, setting, sizeof setting);
            return ct_error_set(err, CT_ERR_MEMORY,
                                "%s: one example's activations need about %s (%.0f tokens)%s; %s",
                                setting, ct_format_bytes(per_example, b, sizeof b), T, tail, lim);
        }
        batch_size_text(cfg, run, setting, sizeof setting);
        char shape[96];
        if (T > 0) snprintf(shape, sizeof shape, "%.0f x %.0f tokens", share, T);
        else snprintf(shape, sizeof shape, "%.0f examples", share);
        return ct_error_set(err, CT_ERR_MEMORY, "%s: one step's activations need about %s (%s)%s; %s", setting,
                            ct_format_bytes(act, b, sizeof b), shape, tail, lim);
    }
    return CT_OK;
}

ct_status ct_config_check_memory(ct_config *cfg, const ct_config_run_shape *run, ct_config_memory *out,
                                 ct_error *err) {
    ct_config_memory mem = {0};
    if (out) *out = mem;
    if (!run || !run->model) return ct_error_set(err, CT_ERR_ARG, "ct_config_check_memory: no model named");
    if (run->batch_size < 1)
        return ct_error_set(err, CT_ERR_ARG, "ct_config_check_memory: batch_size %lld is not positive",
                            (long long)run->batch_size);
    const char *slash = strrchr(run->model, '/');
    char why[CT_ERROR_MSG_MAX / 2];
    const cfg_def *d = cfg_lookup(slash ? slash + 1 : run->model, why, sizeof why);
    if (!d) return ct_error_set(err, CT_ERR_ARG, "%s", why);
    if (d->kind != CFG_MODEL)
        return ct_error_set(err, CT_ERR_ARG, "%s is %s, not a model", run->model, cfg_kind_name(d->kind));
    if (!d->plan) return CT_OK;  // no estimate for it: nothing refused
    alignas(max_align_t) unsigned char buf[PLAN_MAX_STRUCT_BYTES];
    const void *p = NULL;
    if (d->new_layer) {
        CT_ASSERT(d->struct_size <= sizeof buf);
        CT_TRY(cfg_fill_struct(cfg, run->model, d, buf, err));
        p = buf;
    }
    ct_optimizer *opt = NULL;
    if (run->optimizer) CT_TRY(ct_config_build_optimizer(cfg, run->optimizer, &opt, err));
    ct_status st = check_run(cfg, run, d, p, opt, &mem, err);
    ct_optimizer_free(opt);
    mem.limit_bytes = limit_for(run, true).bytes;
    if (out) *out = mem;
    return st;
}
