// The layer base: construction and references, the init pass with paths and
// shared-layer checks, the run context and tape, and the net (a layer tree
// bound to its slabs).
#include "ctrax/layers/layer_author.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/core/blas.h"
#include "kernels/cpu/activation.h"
#include "kernels/cpu/embedding.h"
#include "layers/internal.h"

#define CT_PATH_MAX 1024

struct ct_init_ctx {
    size_t n_weights;  // floats declared so far in the weight slab
    size_t n_state;    // floats declared so far in the state slab
    char path[CT_PATH_MAX];
    size_t path_len;
};

// ---- construction ----------------------------------------------------------

ct_layer *ct_layer_new(const ct_layer_vtable *vt, const char *name, int n_in, int n_out, void *hp,
                       ct_layer **sub, int n_sub) {
    CT_ASSERT(vt && n_in >= 0 && n_out >= 0 && n_in <= CT_LAYER_MAX_IO && n_out <= CT_LAYER_MAX_IO);
    ct_layer *l = ct_calloc(1, sizeof *l);
    l->vt = vt;
    snprintf(l->name, sizeof l->name, "%s", name ? name : vt->type);
    l->n_in = n_in;
    l->n_out = n_out;
    l->hp = hp;
    l->refcount = 1;
    if (n_sub > 0) {
        l->sub = ct_malloc((size_t)n_sub * sizeof *l->sub);
        for (int i = 0; i < n_sub; i++) {
            CT_ASSERT(sub[i]);
            l->sub[i] = sub[i];
        }
    }
    l->n_sub = n_sub;
    return l;
}

ct_layer *ct_layer_new_hp(const ct_layer_vtable *vt, int n_in, int n_out, const void *hp, size_t hp_size) {
    void *copy = NULL;
    if (hp_size) {
        copy = ct_malloc(hp_size);
        memcpy(copy, hp, hp_size);
    }
    return ct_layer_new(vt, NULL, n_in, n_out, copy, NULL, 0);
}

ct_layer *ct_layer_ref(ct_layer *l) {
    l->refcount++;
    return l;
}

static void free_params(ct_param *p, int n) {
    for (int i = 0; i < n; i++) ct_free(p[i].full_name);
    ct_free(p);
}

void ct_layer_free(ct_layer *l) {
    if (!l || --l->refcount > 0) return;
    for (int i = 0; i < l->n_sub; i++) ct_layer_free(l->sub[i]);
    ct_free(l->sub);
    if (l->vt->destroy) l->vt->destroy(l);
    else ct_free(l->hp);
    free_params(l->weights, l->n_weights);
    free_params(l->states, l->n_states);
    ct_free(l->path);
    ct_free(l);
}

ct_layer *ct_layer_rename(ct_layer *l, const char *name) {
    snprintf(l->name, sizeof l->name, "%s", name);
    return l;
}

// ---- errors ------------------------------------------------------------------

ct_status ct_layer_fail(const ct_layer *l, ct_error *err, ct_status code, const char *op,
                        const char *fmt, ...) {
    if (!err) return code;
    va_list ap;
    va_start(ap, fmt);
    ct_error_setv(err, code, fmt, ap);
    va_end(ap);
    return ct_error_prefix(err, "layer %s (%s)", l->path ? l->path : l->name, op);
}

ct_status ct_layer_check_input(const ct_layer *l, const ct_tensor *in_sigs, int i, ct_dtype dtype,
                               int ndim, ct_error *err) {
    const ct_tensor *t = &in_sigs[i];
    char s[CT_SIG_STR_MAX];
    if (t->dtype != dtype)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "input %d is %s, expected dtype %s", i,
                             ct_tensor_sig_str(t, s, sizeof s), ct_dtype_name(dtype));
    if (ndim >= 0 && t->ndim != ndim)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "input %d is %s, expected rank %d", i,
                             ct_tensor_sig_str(t, s, sizeof s), ndim);
    if (ndim < 0 && t->ndim < -ndim)
        return ct_layer_fail(l, err, CT_ERR_SHAPE, "init", "input %d is %s, expected rank >= %d", i,
                             ct_tensor_sig_str(t, s, sizeof s), -ndim);
    return CT_OK;
}

// ---- init --------------------------------------------------------------------

ct_status ct_layer_init(ct_layer *l, int index, ct_init_ctx *ic, const ct_tensor *in_sigs,
                        ct_tensor *out_sigs, ct_key key, ct_error *err) {
    // A root is named by its name alone, and so is a child of an unnamed
    // root (the trainer's Serial(model, loss) is unnamed, so the model's
    // weights have the same names there as in a net of their own).
    size_t saved_len = ic->path_len;
    int n = index < 0 || saved_len == 0
                ? snprintf(ic->path + saved_len, CT_PATH_MAX - saved_len, "%s%s",
                           saved_len ? "/" : "", l->name)
                : snprintf(ic->path + saved_len, CT_PATH_MAX - saved_len, "%s%s[%d]", "/",
                           l->name, index);
    if (n < 0 || (size_t)n >= CT_PATH_MAX - saved_len)
        return ct_error_set(err, CT_ERR_ARG, "layer path longer than %d characters: %s", CT_PATH_MAX,
                            ic->path);
    ic->path_len += (size_t)n;

    ct_status st = CT_OK;
    if (l->initialized) {
        // A shared layer: its weights exist; its inputs must look the same.
        for (int i = 0; i < l->n_in; i++) {
            if (!ct_tensor_same_sig(&in_sigs[i], &l->in_sigs[i])) {
                char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
                st = ct_error_set(err, CT_ERR_SHAPE,
                                  "layer %s (init): input %d is %s, but this layer is shared and "
                                  "was first used at %s with %s",
                                  ic->path, i, ct_tensor_sig_str(&in_sigs[i], a, sizeof a), l->path,
                                  ct_tensor_sig_str(&l->in_sigs[i], b, sizeof b));
                break;
            }
        }
        if (st == CT_OK)
            for (int i = 0; i < l->n_out; i++) out_sigs[i] = l->out_sigs[i];
    } else {
        ct_free(l->path);
        l->path = ct_strdup(ic->path);
        for (int i = 0; i < l->n_in; i++) l->in_sigs[i] = ct_tensor_sig(&in_sigs[i]);
        l->w_begin = ic->n_weights;
        l->s_begin = ic->n_state;
        // An output init leaves unwritten keeps this rank, which no tensor has.
        for (int i = 0; i < l->n_out; i++) out_sigs[i].ndim = -1;
        st = l->vt->init(l, ic, in_sigs, out_sigs, key, err);
        l->w_end = ic->n_weights;
        l->s_end = ic->n_state;
        for (int i = 0; st == CT_OK && i < l->n_out; i++)
            if (out_sigs[i].ndim < 0 || out_sigs[i].ndim > CT_MAX_DIMS)
                st = ct_error_set(err, CT_ERR_STATE,
                                  "layer %s (init): output signature %d of its %d (n_out, as ct_layer_new "
                                  "was given) was not written, or has rank %d",
                                  ic->path, i, l->n_out, out_sigs[i].ndim);
        if (st == CT_OK) {
            for (int i = 0; i < l->n_out; i++) l->out_sigs[i] = ct_tensor_sig(&out_sigs[i]);
            l->initialized = true;
        }
    }
    ic->path_len = saved_len;
    ic->path[saved_len] = '\0';
    return st;
}

static int declare(ct_layer *l, ct_init_ctx *ic, ct_param **list, int *count, size_t *cursor,
                   const char *name, ct_tensor sig, ct_initializer init, ct_key key) {
    CT_ASSERT(sig.dtype == CT_DTYPE_F32);
    *list = ct_realloc(*list, (size_t)(*count + 1) * sizeof **list);
    ct_param *p = &(*list)[*count];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s", name);
    size_t len = strlen(ic->path) + 1 + strlen(name) + 1;
    p->full_name = ct_malloc(len);
    snprintf(p->full_name, len, "%s/%s", ic->path, name);
    p->sig = ct_tensor_sig(&sig);
    p->offset = *cursor;
    p->init = init;
    p->key = key;
    *cursor += (size_t)ct_tensor_numel(&sig);
    (void)l;
    return (*count)++;
}

int ct_layer_declare_weight(ct_layer *l, ct_init_ctx *ic, const char *name, ct_tensor sig,
                            ct_initializer init, ct_key key) {
    return declare(l, ic, &l->weights, &l->n_weights, &ic->n_weights, name, sig, init, key);
}

int ct_layer_declare_state(ct_layer *l, ct_init_ctx *ic, const char *name, ct_tensor sig,
                           ct_initializer init, ct_key key) {
    return declare(l, ic, &l->states, &l->n_states, &ic->n_state, name, sig, init, key);
}

int ct_layer_declare_cache(ct_layer *l, ct_init_ctx *ic, const char *name, ct_tensor sig) {
    int i = ct_layer_declare_state(l, ic, name, sig, (ct_initializer){CT_INIT_ZEROS, 0.0f}, ct_key_from_seed(0));
    l->states[i].cache = true;
    return i;
}

// ---- running -----------------------------------------------------------------

void ct_ctx_init(ct_ctx *c, ct_arena *arena) {
    memset(c, 0, sizeof *c);
    c->arena = arena;
    c->record = true;
}

void ct_ctx_free(ct_ctx *c) {
    ct_free(c->tape);
    c->tape = NULL;
    c->tape_len = c->tape_cap = 0;
    ct_free(c->marks);
    c->marks = NULL;
    c->n_marks = c->marks_cap = 0;
}

void ct_layer_abort_index(const ct_layer *l, const char *what, int i, int n) {
    ct_abort(__FILE__, __LINE__, "layer %s asks for its %s %d, but its init declared %d (ct_layer_declare_%s)",
             l->path && l->path[0] ? l->path : l->name, what, i, n, what);
}

// ---- anomaly mode: the first non-finite value -------------------------------

// The first of t[0..n) (f32 with data) holding a NaN or Inf: its index, with
// the element in *at; -1 if none.
static int find_nonfinite(const ct_tensor *t, int n, int64_t *at) {
    for (int i = 0; i < n; i++) {
        if (t[i].dtype != CT_DTYPE_F32 || !t[i].data) continue;
        int64_t numel = ct_tensor_numel(&t[i]);
        *at = ct_f32_first_nonfinite(t[i].data, numel);
        if (*at < numel) return i;
    }
    return -1;
}

// A value for a message: NaN without its sign bit, which printf shows
// ("-nan") though it means nothing.
static double shown(float v) { return isnan(v) ? fabs((double)v) : (double)v; }

static const char *path_of(const ct_layer *l) { return l->path && l->path[0] ? l->path : l->name; }

// "<what> i of <l> (<note>): <value> at element k" for the first non-finite
// tensor of t[0..n), or CT_OK.
static ct_status check_tensors(const ct_layer *l, const char *what, const char *note, const ct_tensor *t, int n,
                               ct_error *err) {
    int64_t at = 0;
    int i = find_nonfinite(t, n, &at);
    if (i < 0) return CT_OK;
    return ct_error_set(err, CT_ERR_NONFINITE, "%s %d of %s (%s): %g at element %lld", what, i, path_of(l), note,
                        shown(ct_f32(&t[i])[at]), (long long)at);
}

// A layer's outputs went non-finite from finite inputs: its weights are the
// first suspect, so the message says whether they are finite.
static ct_status check_forward(const ct_layer *l, const ct_ctx *c, const ct_tensor *out, ct_error *err) {
    int64_t at = 0;
    if (find_nonfinite(out, l->n_out, &at) < 0) return CT_OK;
    char note[CT_ERROR_MSG_MAX / 2];
    snprintf(note, sizeof note, "inputs finite");
    for (int w = 0; w < l->n_weights; w++) {
        const ct_param *p = &l->weights[w];
        int64_t numel = ct_tensor_numel(&p->sig), bad = ct_f32_first_nonfinite(ct_weight(c, l, w), numel);
        if (bad < numel) {
            snprintf(note, sizeof note, "inputs finite; its weight %s is %g at element %lld", p->full_name,
                     shown(ct_weight(c, l, w)[bad]), (long long)bad);
            break;
        }
    }
    return check_tensors(l, "forward output", note, out, l->n_out, err);
}

// Backward: the layer's own weight gradients (added into by this use), then
// its input gradients.
ct_status ct_ctx_check_grads(const ct_ctx *c, const ct_layer *l, const ct_tensor *grad_in, ct_error *err) {
    if (!c->check_finite) return CT_OK;
    for (int w = 0; w < l->n_weights && c->grads; w++) {
        const ct_param *p = &l->weights[w];
        const float *g = ct_weight_grad(c, l, w);
        int64_t numel = ct_tensor_numel(&p->sig), bad = ct_f32_first_nonfinite(g, numel);
        if (bad < numel)
            return ct_error_set(err, CT_ERR_NONFINITE,
                                "backward: weight gradient of %s (output gradients finite): %g at element %lld",
                                p->full_name, shown(g[bad]), (long long)bad);
    }
    return check_tensors(l, "backward: input gradient", "output gradients finite", grad_in, l->n_in, err);
}

ct_status ct_layer_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                           ct_error *err) {
    // A donated input (ct_arena_donate) is l's to overwrite, not its
    // sublayers'.
    const void *outer = ct_arena_take_donation(c->arena);
    int begin = c->tape_len;
    // Marks past the tape's end are of forwards whose records a caller
    // dropped (tape_len set back by hand, as before ct_tape_truncate): they
    // can have no backward now.
    while (c->record && c->n_marks > 0 && c->marks[c->n_marks - 1].end > begin) c->n_marks--;
    double start = c->profile ? ct_profile_begin(c->profile) : 0.0;
    ct_status st = l->vt->forward(l, c, in, out, key, err);
    if (c->profile) ct_profile_end(c->profile, l->name, false, start);
    ct_arena_end_donation(c->arena, outer);
    CT_TRY(st);
    if (c->record) {
        // Grows during the first step only, as the tape does.
        if (c->n_marks == c->marks_cap) {
            c->marks_cap = c->marks_cap ? 2 * c->marks_cap : 64;
            c->marks = ct_realloc(c->marks, (size_t)c->marks_cap * sizeof *c->marks);
        }
        c->marks[c->n_marks++] = (struct ct_tape_mark){l, begin, c->tape_len};
    }
    return c->check_finite ? check_forward(l, c, out, err) : CT_OK;
}

void ct_tape_truncate(ct_ctx *c, int tape_len) {
    CT_ASSERT(tape_len >= 0 && tape_len <= c->tape_len);
    c->tape_len = tape_len;
    // A mark is pushed after its sublayers', so the marks of forwards that
    // pushed at or past tape_len are on top.
    while (c->n_marks > 0 && c->marks[c->n_marks - 1].end > tape_len) c->n_marks--;
}

ct_status ct_layer_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in,
                            ct_key key, ct_error *err) {
    // A donated output gradient (ct_stack_walk's) is l's to overwrite, as
    // forward's input is; taken first so that no path leaves it pending.
    const void *outer = ct_arena_take_donation(c->arena);
    // Backward takes back l's newest forward: the newest mark. Without it the
    // pops below would read another layer's records.
    if (c->n_marks == 0 || c->marks[c->n_marks - 1].layer != l) {
        ct_arena_end_donation(c->arena, outer);
        return ct_layer_fail(l, err, CT_ERR_STATE, "backward",
                             "no recorded forward of this layer to take back (backward runs after "
                             "ct_layer_forward with c->record, once per forward, newest first)%s%s",
                             c->n_marks ? "; the newest recorded forward is " : "",
                             c->n_marks ? path_of(c->marks[c->n_marks - 1].layer) : "");
    }
    struct ct_tape_mark m = c->marks[--c->n_marks];
    double start = c->profile ? ct_profile_begin(c->profile) : 0.0;
    ct_status st = l->vt->backward(l, c, grad_out, grad_in, key, err);
    if (c->profile) ct_profile_end(c->profile, l->name, true, start);
    ct_arena_end_donation(c->arena, outer);
    CT_TRY(st);
    if (c->tape_len != m.begin)
        return ct_layer_fail(l, err, CT_ERR_STATE, "backward",
                             "its forward pushed %d tape record(s) and its backward %s %d %s (a backward "
                             "pops each record its forward pushed, no more, no fewer)",
                             m.end - m.begin, c->tape_len > m.begin ? "left" : "popped",
                             abs(c->tape_len - m.begin),
                             c->tape_len > m.begin ? "of them on the tape" : "more, of layers before it");
    if (c->check_finite) CT_TRY(ct_ctx_check_grads(c, l, grad_in, err));
    if (c->on_weight_grads && l->n_weights > 0) c->on_weight_grads(c->on_weight_grads_user, l);
    return CT_OK;
}

ct_status ct_ctx_alloc(ct_ctx *c, ct_tensor *t, ct_error *err) {
    t->data = ct_arena_alloc(c->arena, ct_tensor_nbytes(t), err);
    return t->data ? CT_OK : err ? err->code : CT_ERR_MEMORY;
}

ct_status ct_ctx_zeros(ct_ctx *c, ct_tensor *t, ct_error *err) {
    t->data = ct_arena_calloc(c->arena, ct_tensor_nbytes(t), err);
    return t->data ? CT_OK : err ? err->code : CT_ERR_MEMORY;
}

ct_status ct_ctx_grad_or_zeros(ct_ctx *c, ct_tensor *g, ct_error *err) {
    if (g->data) return CT_OK;
    return ct_ctx_zeros(c, g, err);
}

ct_status ct_tape_push(ct_ctx *c, const ct_tensor *t, ct_error *err) {
    (void)err;
    if (!c->record) return CT_OK;
    if (c->tape_len == c->tape_cap) {
        // Grows during the first step only: later steps push as many.
        c->tape_cap = c->tape_cap ? 2 * c->tape_cap : 64;
        c->tape = ct_realloc(c->tape, (size_t)c->tape_cap * sizeof *c->tape);
    }
    c->tape[c->tape_len++] = *t;
    return CT_OK;
}

ct_tensor ct_tape_pop(ct_ctx *c) {
    CT_ASSERT(c->tape_len > 0);
    return c->tape[--c->tape_len];
}

ct_status ct_tape_push_sig(ct_ctx *c, const ct_tensor *t, ct_error *err) {
    ct_tensor sig = ct_tensor_sig(t);
    return ct_tape_push(c, &sig, err);
}

bool ct_tape_pop_input_sig(ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in) {
    grad_in[0] = ct_tape_pop(c);
    return grad_out[0].data != NULL;
}

static ct_status ctx_sum(ct_ctx *c, const ct_tensor *a, const ct_tensor *b, bool over_b, ct_tensor *sum,
                         ct_error *err) {
    ct_tensor s = ct_tensor_sig(a);
    if (ct_arena_donated(c->arena, a->data)) s.data = a->data;
    else if (over_b && ct_arena_donated(c->arena, b->data)) s.data = b->data;
    else CT_TRY(ct_ctx_alloc(c, &s, err));
    ct_add_forward(s.data, a->data, b->data, ct_tensor_numel(&s));
    *sum = s;  // last: sum may be a or b
    return CT_OK;
}

ct_status ct_ctx_sum(ct_ctx *c, const ct_tensor *a, const ct_tensor *b, ct_tensor *sum, ct_error *err) {
    return ctx_sum(c, a, b, true, sum, err);
}

ct_status ct_ctx_sum_keep_b(ct_ctx *c, const ct_tensor *a, const ct_tensor *b, ct_tensor *sum, ct_error *err) {
    return ctx_sum(c, a, b, false, sum, err);
}

// ---- net -----------------------------------------------------------------------

// Appends the params of every layer in the tree, each layer once.
static void collect(ct_layer *l, ct_param ***list, int *n, bool states, const ct_layer ***seen,
                    int *n_seen) {
    for (int i = 0; i < *n_seen; i++)
        if ((*seen)[i] == l) return;
    *seen = ct_realloc(*seen, (size_t)(*n_seen + 1) * sizeof **seen);
    (*seen)[(*n_seen)++] = l;
    ct_param *own = states ? l->states : l->weights;
    int n_own = states ? l->n_states : l->n_weights;
    if (n_own > 0) {
        *list = ct_realloc(*list, (size_t)(*n + n_own) * sizeof **list);
        for (int i = 0; i < n_own; i++) (*list)[(*n)++] = &own[i];
    }
    for (int i = 0; i < l->n_sub; i++) collect(l->sub[i], list, n, states, seen, n_seen);
}

static int by_offset(const void *a, const void *b) {
    size_t x = (*(ct_param *const *)a)->offset, y = (*(ct_param *const *)b)->offset;
    return (x > y) - (x < y);
}

static void fill(float *slab, const ct_param *p) {
    size_t n = (size_t)ct_tensor_numel(&p->sig);
    if (n == 0) return;  // a zero-width weight: the slab may be NULL (no memset(NULL, 0, 0))
    float *w = slab + p->offset;
    const ct_tensor *s = &p->sig;
    switch (p->init.kind) {
    case CT_INIT_ZEROS:
        memset(w, 0, n * sizeof *w);
        break;
    case CT_INIT_ONES:
        for (size_t i = 0; i < n; i++) w[i] = 1.0f;
        break;
    case CT_INIT_GLOROT_UNIFORM: {
        double fan_out = s->ndim ? (double)s->shape[s->ndim - 1] : 1.0;
        double fan_in = s->ndim ? (double)n / fan_out : 1.0;
        float a = p->init.scale * (float)sqrt(6.0 / (fan_in + fan_out));
        ct_random_uniform(p->key, w, n, -a, a);
        break;
    }
    case CT_INIT_NORMAL:
        ct_random_normal(p->key, w, n, p->init.scale);
        break;
    case CT_INIT_UNIFORM:
        ct_random_uniform(p->key, w, n, -p->init.scale, p->init.scale);
        break;
    case CT_INIT_SINUSOID:
        CT_ASSERT(s->ndim == 2);
        ct_positional_sinusoids(w, s->shape[0], s->shape[1]);
        break;
    }
}

// The first layer of the tree that is initialized, or NULL.
static const ct_layer *find_initialized(const ct_layer *l) {
    if (l->initialized) return l;
    for (int i = 0; i < l->n_sub; i++) {
        const ct_layer *found = find_initialized(l->sub[i]);
        if (found) return found;
    }
    return NULL;
}

// Forgets what init set, so the tree can join a new net.
static void uninit(ct_layer *l) {
    if (!l->initialized && !l->path) return;
    l->initialized = false;
    free_params(l->weights, l->n_weights);
    free_params(l->states, l->n_states);
    l->weights = l->states = NULL;
    l->n_weights = l->n_states = 0;
    ct_free(l->path);
    l->path = NULL;
    for (int i = 0; i < l->n_sub; i++) uninit(l->sub[i]);
}

ct_status ct_net_init(ct_net *net, ct_layer *root, const ct_tensor *in_sigs, int n_in, ct_key key,
                      ct_device *dev, ct_error *err) {
    memset(net, 0, sizeof *net);
    ct_cpu_flush_denormals();  // every model's steps at one speed (core/blas.h)
    if (n_in != root->n_in) {
        // Serial's n_in is its layers' reach into the stack: list them, so a
        // layer that pushes more or fewer items than meant shows (the
        // trainer's Serial(model, loss) has no name).
        char subs[CT_ERROR_MSG_MAX / 2] = "";
        size_t len = 0;
        for (int i = 0; i < root->n_sub && len < sizeof subs; i++)
            len += (size_t)snprintf(subs + len, sizeof subs - len, "%s%s %d -> %d", i ? ", " : " (its layers take -> push: ",
                                    root->sub[i]->name, root->sub[i]->n_in, root->sub[i]->n_out);
        if (root->n_sub && len < sizeof subs) snprintf(subs + len, sizeof subs - len, ")");
        return ct_error_set(err, CT_ERR_ARG, "layer %s takes %d inputs, got %d%s",
                            root->name[0] ? root->name : root->vt->type, root->n_in, n_in, subs);
    }
    // A layer's weights live in one net's slab: a layer in two nets at once
    // would read the other's slab.
    const ct_layer *taken = find_initialized(root);
    if (taken)
        return ct_error_set(err, CT_ERR_STATE,
                            "layer %s is already part of another net (free that net or trainer "
                            "first, or build a new layer)",
                            taken->path);
    net->root = ct_layer_ref(root);
    net->dev = dev;
    net->n_in = root->n_in;
    net->n_out = root->n_out;
    for (int i = 0; i < n_in; i++) net->in_sigs[i] = ct_tensor_sig(&in_sigs[i]);

    ct_init_ctx *ic = ct_calloc(1, sizeof *ic);
    ct_status st = ct_layer_init(root, -1, ic, net->in_sigs, net->out_sigs, key, err);
    net->n_weights = ic->n_weights;
    net->n_state = ic->n_state;
    ct_free(ic);
    if (st != CT_OK) goto fail;

    const ct_layer **seen = NULL;
    int n_seen = 0;
    collect(root, &net->params, &net->n_params, false, &seen, &n_seen);
    n_seen = 0;
    collect(root, &net->state_params, &net->n_state_params, true, &seen, &n_seen);
    ct_free(seen);

    // The slabs' budget, before any is allocated: the counts summed again in
    // double (a size_t sum that wrapped while layers declared their weights
    // would give slabs too small for them), then all three slabs checked
    // against the device's limit and the machine's memory together.
    double n_w = 0, n_s = 0;
    for (int i = 0; i < net->n_params; i++) n_w += (double)ct_tensor_numel(&net->params[i]->sig);
    for (int i = 0; i < net->n_state_params; i++) n_s += (double)ct_tensor_numel(&net->state_params[i]->sig);
    double slab_bytes = (2 * n_w + n_s) * sizeof(float);
    char what[200];
    snprintf(what, sizeof what, "model %.80s (%.0f weights; its weight, gradient and state slabs)", root->name, n_w);
    if (n_w != (double)net->n_weights || n_s != (double)net->n_state || slab_bytes > (double)(SIZE_MAX / 2)) {
        char b[32];
        st = ct_error_set(err, CT_ERR_MEMORY, "%s needs %s, more than an address space holds", what,
                          ct_format_bytes(slab_bytes, b, sizeof b));
        net->n_weights = net->n_state = 0;  // the slabs were never allocated: free none
        goto fail;
    }
    if ((st = ct_device_check_room(dev, slab_bytes, what, err)) != CT_OK) goto fail;
    // A random initializer draws one number per counter of its key: more
    // would be an assertion in fill, after the slabs were allocated.
    for (int i = 0; i < net->n_params + net->n_state_params; i++) {
        const ct_param *p = i < net->n_params ? net->params[i] : net->state_params[i - net->n_params];
        bool random = p->init.kind == CT_INIT_GLOROT_UNIFORM || p->init.kind == CT_INIT_NORMAL ||
                      p->init.kind == CT_INIT_UNIFORM;
        if (random && (uint64_t)ct_tensor_numel(&p->sig) > CT_RANDOM_MAX_N) {
            char s[CT_SIG_STR_MAX];
            st = ct_error_set(err, CT_ERR_ARG, "%s is %s: a random initializer draws at most 2^32 numbers",
                              p->full_name, ct_tensor_sig_str(&p->sig, s, sizeof s));
            goto fail;
        }
    }
    size_t wbytes = net->n_weights * sizeof(float), sbytes = net->n_state * sizeof(float);
    if ((st = ct_device_alloc(dev, wbytes, "weight slab", (void **)&net->weights, err)) != CT_OK ||
        (st = ct_device_alloc(dev, wbytes, "gradient slab", (void **)&net->grads, err)) != CT_OK ||
        (st = ct_device_alloc(dev, sbytes, "state slab", (void **)&net->state, err)) != CT_OK)
        goto fail;
    if (net->n_params) qsort(net->params, (size_t)net->n_params, sizeof *net->params, by_offset);
    if (net->n_state_params)
        qsort(net->state_params, (size_t)net->n_state_params, sizeof *net->state_params, by_offset);
    // Names are how checkpoints find weights: two the same would be ambiguous.
    for (int i = 0; i < net->n_params; i++)
        for (int j = i + 1; j < net->n_params; j++)
            if (strcmp(net->params[i]->full_name, net->params[j]->full_name) == 0) {
                st = ct_error_set(err, CT_ERR_ARG,
                                  "two weights are named %s: rename one of the layers (ct_layer_rename)",
                                  net->params[i]->full_name);
                goto fail;
            }
    for (int i = 0; i < net->n_params; i++) fill(net->weights, net->params[i]);
    for (int i = 0; i < net->n_state_params; i++) fill(net->state, net->state_params[i]);
    return CT_OK;
fail:
    ct_net_free(net);
    return st;
}

void ct_net_free(ct_net *net) {
    if (!net->root) return;
    size_t wbytes = net->n_weights * sizeof(float), sbytes = net->n_state * sizeof(float);
    ct_device_free(net->dev, net->weights, wbytes);
    ct_device_free(net->dev, net->grads, wbytes);
    ct_device_free(net->dev, net->state, sbytes);
    ct_free(net->params);
    ct_free(net->state_params);
    uninit(net->root);
    ct_layer_free(net->root);
    memset(net, 0, sizeof *net);
}

void ct_net_bind(const ct_net *net, ct_ctx *c, bool train) {
    c->weights = net->weights;
    c->grads = net->grads;
    c->state = net->state;
    c->train = train;
    c->record = train;
}

void ct_net_zero_grads(ct_net *net) {
    if (net->grads) memset(net->grads, 0, net->n_weights * sizeof(float));
}

const ct_param *ct_net_find_param(const ct_net *net, const char *full_name) {
    for (int i = 0; i < net->n_params; i++)
        if (strcmp(net->params[i]->full_name, full_name) == 0) return net->params[i];
    return NULL;
}

// ---- accessors (layer.h) ----------------------------------------------------

const char *ct_layer_name(const ct_layer *l) { return l->name; }
const char *ct_layer_type(const ct_layer *l) { return l->vt->type; }
const char *ct_layer_path(const ct_layer *l) { return path_of(l); }
int ct_layer_n_in(const ct_layer *l) { return l->n_in; }
int ct_layer_n_out(const ct_layer *l) { return l->n_out; }

size_t ct_net_n_weights(const ct_net *net) { return net->n_weights; }
size_t ct_net_n_state(const ct_net *net) { return net->n_state; }
const ct_layer *ct_net_root(const ct_net *net) { return net->root; }

static ct_tensor param_tensor(const ct_param *p, float *slab) {
    ct_tensor t = p->sig;
    t.data = slab + p->offset;
    return t;
}

int ct_net_weight_count(const ct_net *net) { return net->n_params; }
const char *ct_net_weight_name(const ct_net *net, int i) { return net->params[i]->full_name; }
ct_tensor ct_net_weight(const ct_net *net, int i) { return param_tensor(net->params[i], net->weights); }
int ct_net_state_count(const ct_net *net) { return net->n_state_params; }
const char *ct_net_state_name(const ct_net *net, int i) { return net->state_params[i]->full_name; }
ct_tensor ct_net_state(const ct_net *net, int i) { return param_tensor(net->state_params[i], net->state); }
