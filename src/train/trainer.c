// The single-device Trainer (see trainer.h).
#include "ctrax/train/trainer.h"

#include <math.h>
#include <string.h>

#include "ctrax/layers/combinators.h"

struct ct_trainer {
    ct_net net;         // Serial(model, loss) bound to its slabs
    ct_layer *model;    // one reference
    ct_optimizer *opt;  // owned
    ct_device *dev;
    float *slots;             // optimizer slot slab
    size_t n_slot_floats;
    size_t *slot_offsets;     // per net.params[i], into slots
    ct_arena arena;           // training step activations
    ct_ctx ctx;
    ct_arena eval_arena;      // predict's activations, kept until the next predict
    ct_ctx eval_ctx;
    float one;                // d loss / d loss, the gradient backward starts from
};

ct_status ct_trainer_new(ct_trainer **out, ct_layer *model, ct_layer *loss, const ct_tensor *batch_sigs, int n_batch,
                         ct_optimizer *opt, ct_key init_key, ct_device *dev, ct_error *err) {
    *out = NULL;
    ct_trainer *t = ct_calloc(1, sizeof *t);
    t->opt = opt;
    t->dev = dev;
    t->model = ct_layer_ref(model);
    t->one = 1.0f;
    ct_arena_init(&t->arena, dev);
    ct_arena_init(&t->eval_arena, dev);
    ct_ctx_init(&t->ctx, &t->arena);
    ct_ctx_init(&t->eval_ctx, &t->eval_arena);

    ct_layer *root = ct_serial(CT_LAYERS(ct_layer_ref(model), ct_layer_ref(loss)));
    ct_status st = ct_net_init(&t->net, root, batch_sigs, n_batch, init_key, dev, err);
    ct_layer_free(root);  // the net holds its own reference
    if (st != CT_OK) goto fail;
    if (t->net.n_out != 1 || t->net.out_sigs[0].ndim != 0 || t->net.out_sigs[0].dtype != CT_DTYPE_F32) {
        st = ct_error_set(err, CT_ERR_SHAPE, "trainer: the loss layer %s must leave one f32 scalar on the stack",
                          loss->name);
        goto fail;
    }

    // The slot slab: each weight's slots in slab order.
    t->slot_offsets = ct_calloc((size_t)t->net.n_params + 1, sizeof *t->slot_offsets);
    for (int i = 0; i < t->net.n_params; i++) {
        t->slot_offsets[i] = t->n_slot_floats;
        t->n_slot_floats += ct_optimizer_slot_floats(opt, &t->net.params[i]->sig);
    }
    st = ct_device_alloc(dev, t->n_slot_floats * sizeof(float), "optimizer slots", (void **)&t->slots, err);
    if (st != CT_OK) goto fail;
    for (int i = 0; i < t->net.n_params; i++)
        ct_optimizer_init_slots(opt, &t->net.params[i]->sig, t->slots + t->slot_offsets[i]);
    ct_net_bind(&t->net, &t->ctx, true);
    ct_net_bind(&t->net, &t->eval_ctx, false);
    *out = t;
    return CT_OK;
fail:
    ct_trainer_free(t);
    return st;
}

void ct_trainer_free(ct_trainer *t) {
    if (!t) return;
    ct_device_free(t->dev, t->slots, t->n_slot_floats * sizeof(float));
    ct_free(t->slot_offsets);
    ct_ctx_free(&t->ctx);
    ct_ctx_free(&t->eval_ctx);
    ct_arena_free(&t->arena);
    ct_arena_free(&t->eval_arena);
    ct_net_free(&t->net);
    ct_layer_free(t->model);
    ct_optimizer_free(t->opt);
    ct_free(t);
}

// sqrt(sum x^2) over n floats, accumulated in double in a fixed order.
static double sum_squares(const float *x, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)x[i] * x[i];
    return s;
}

ct_status ct_trainer_one_step(ct_trainer *t, const ct_tensor *batch, ct_key key, int64_t step, float learning_rate,
                              ct_step_stats *stats, ct_error *err) {
    ct_net *net = &t->net;
    ct_tensor loss_out, grad_out, grad_in[CT_LAYER_MAX_IO];
    for (int i = 0; i < net->n_in; i++) {
        if (batch[i].dtype != net->in_sigs[i].dtype || batch[i].ndim != net->in_sigs[i].ndim) {
            char a[CT_SIG_STR_MAX], b[CT_SIG_STR_MAX];
            return ct_error_set(err, CT_ERR_SHAPE, "trainer: batch item %d is %s, the trainer was built for %s", i,
                                ct_tensor_sig_str(&batch[i], a, sizeof a),
                                ct_tensor_sig_str(&net->in_sigs[i], b, sizeof b));
        }
    }
    ct_net_zero_grads(net);
    t->ctx.tape_len = 0;
    ct_status st = ct_layer_forward(net->root, &t->ctx, batch, &loss_out, key, err);
    if (st == CT_OK) {
        grad_out = ct_tensor_sig(&loss_out);
        grad_out.data = &t->one;
        st = ct_layer_backward(net->root, &t->ctx, &grad_out, grad_in, key, err);
    }
    if (st != CT_OK) {
        ct_arena_reset(&t->arena);
        return st;
    }
    CT_ASSERT(t->ctx.tape_len == 0);  // every push was popped
    float loss = *ct_f32(&loss_out);
    ct_arena_reset(&t->arena);

    double g2 = sum_squares(net->grads, net->n_weights);
    double w2 = sum_squares(net->weights, net->n_weights);
    for (int i = 0; i < net->n_params; i++) {
        const ct_param *p = net->params[i];
        ct_optimizer_update(t->opt, step, learning_rate, &p->sig, net->weights + p->offset, net->grads + p->offset,
                            t->slots + t->slot_offsets[i]);
    }
    if (stats) {
        stats->loss = loss;
        stats->gradients_l2 = (float)sqrt(g2);
        stats->weights_l2 = (float)sqrt(w2);
    }
    return CT_OK;
}

ct_status ct_trainer_predict(ct_trainer *t, const ct_tensor *inputs, ct_tensor *outputs, ct_error *err) {
    ct_arena_reset(&t->eval_arena);
    t->eval_ctx.tape_len = 0;
    return ct_layer_forward(t->model, &t->eval_ctx, inputs, outputs, ct_key_from_seed(0), err);
}

const ct_net *ct_trainer_net(const ct_trainer *t) { return &t->net; }
ct_layer *ct_trainer_model(const ct_trainer *t) { return t->model; }

float *ct_trainer_slots(const ct_trainer *t, size_t *n_floats) {
    if (n_floats) *n_floats = t->n_slot_floats;
    return t->slots;
}

size_t ct_trainer_arena_bytes(const ct_trainer *t) { return ct_arena_capacity(&t->arena); }
