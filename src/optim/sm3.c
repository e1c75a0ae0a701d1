// SM3 as Trax's newest version (see optimizer.h for the math).
#include <assert.h>
#include <stddef.h>
#include <string.h>

#include "ctrax/optim/optimizer.h"
#include "kernels/cpu/optim.h"
#include "optim/internal.h"

static_assert(sizeof(ct_sm3_momentum_type) == sizeof(int), "momentum_type is read and written as an int");

// The params plus what Trax decides once in its constructor: whether there is
// a momentum slot and whether to graft. They fix the slot layout, so later
// changes of momentum or second_moment_averaging do not change them (as in
// Trax, where only opt_params change).
typedef struct sm3_state {
    ct_sm3_params p;  // first, so offsetof(ct_sm3_params, ...) addresses it
    bool has_momentum;
    bool graft;
} sm3_state;

// Floats of one set of accumulators: the covers (sum of the dims) for rank
// >= 2, a full diagonal otherwise.
static size_t cover_floats(const ct_tensor *sig) {
    if (sig->ndim <= 1) return (size_t)ct_tensor_numel(sig);
    size_t k = 0;
    for (int d = 0; d < sig->ndim; d++) k += (size_t)sig->shape[d];
    return k;
}

// Slots: m (n, with momentum), v (covers), u (covers, with grafting), then
// for rank >= 2 scratch as big as v and u together.
static size_t sm3_slot_floats(const ct_optimizer *o, const ct_tensor *sig) {
    const sm3_state *s = o->params;
    size_t n = (size_t)ct_tensor_numel(sig), k = cover_floats(sig);
    size_t sets = s->graft ? 2 : 1;
    return (s->has_momentum ? n : 0) + sets * k + (sig->ndim >= 2 ? sets * k : 0);
}

static void sm3_update(const ct_optimizer *o, int64_t step, float lr, const ct_tensor *sig, float *w, const float *g,
                       float *slots) {
    (void)step;  // Trax's SM3 ignores the step
    const sm3_state *s = o->params;
    size_t n = (size_t)ct_tensor_numel(sig), k = cover_floats(sig);
    if (n == 0) return;
    float *m = s->has_momentum ? slots : NULL;
    float *v = slots + (s->has_momentum ? n : 0);
    float *u = s->graft ? v + k : NULL;
    float *scratch = v + (s->graft ? 2 : 1) * k;
    ct_sm3_update(w, g, m, v, u, scratch, sig->shape, sig->ndim, lr, s->p.momentum, (int)s->p.momentum_type,
                  s->p.second_moment_averaging, s->p.weight_decay);
}

static const char *sm3_slot_layout(const ct_optimizer *o) {
    const sm3_state *s = o->params;
    static const char *const words[2][2] = {
        {"no momentum slot, no grafting accumulators", "no momentum slot, grafting accumulators"},
        {"momentum slot, no grafting accumulators", "momentum slot, grafting accumulators"}};
    return words[s->has_momentum][s->graft];
}

// A checkpoint without slot_layout: its momentum or second_moment_averaging
// that would make the other layout, whose slots cannot be read as this run's
// (the sizes may even agree).
static const char *sm3_layout_change(const ct_optimizer *o, const char *name, float saved) {
    const sm3_state *s = o->params;
    if (!strcmp(name, "momentum") && (saved > 0.0f) != s->has_momentum)
        return s->has_momentum ? "no momentum slot" : "a momentum slot";
    if (!strcmp(name, "second_moment_averaging") && (saved != 1.0f) != s->graft)
        return s->graft ? "no grafting accumulators" : "grafting accumulators";
    return NULL;
}

CT_OPTIMIZER(sm3, "SM3", CT_SM3_PARAMS, .slot_floats = sm3_slot_floats, .update = sm3_update,
             .slot_layout = sm3_slot_layout, .layout_change = sm3_layout_change)

ct_optimizer *ct_sm3_new(ct_sm3_params p) {
    CT_ASSERT(p.momentum_type >= CT_SM3_MOMENTUM_EMA && p.momentum_type <= CT_SM3_MOMENTUM_NESTEROV);
    sm3_state s = {.p = p, .has_momentum = p.momentum > 0.0f, .graft = p.second_moment_averaging != 1.0f};
    return ct_optimizer_wrap(&sm3_vt, &s, sizeof s);
}
