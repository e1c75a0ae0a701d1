// TransformerLM and ReformerLM end to end for tests/lm_reference.py, which
// recomputes Trax's forward pass and WeightedCategoryCrossEntropy in float64
// from the checkpoint's weights (run both through tests/lm_reference_test.sh):
//
//   lm_reference OUT_DIR
//
// Per case: the model (dropout 0.1) is trained 4 steps with Adam on copy-task
// batches (so that biases, LayerNorm scales and the position table have left
// their initial values); its embedding and position table are then scaled
// down (so that LayerNorm's epsilon matters, see run_case), and its
// checkpoint is written as the Loop writes it (ct_trainer_checkpoint_tensors
// into weights.safetensors) under OUT_DIR/<case>/. Then on a batch of random
// tokens with uneven loss weights (0, 0.25 .. 2): ctrax's eval loss
// (ct_trainer_eval_loss, dropout off), and the gradient of the loss
// (ct_trainer_tensor CT_PART_GRAD) from a second trainer, the same model at
// dropout 0, that loads that checkpoint and steps once with learning rate 0;
// and the same tokens at loss weights 1 through ct_evaluator_run on a net
// loaded from the checkpoint, as `ctrax eval` runs it.
// OUT_DIR/<case>.safetensors holds inputs and targets (B, T) i32, weights
// (B, T) f32, loss_eval (1) f32, loss_evaluator (1) f32, "grad/<weight
// name>" for every weight, and the model's settings as __metadata__ strings
// (model, vocab_size, d_model, ...; checkpoint: the checkpoint's directory).
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"

enum { B = 3, N_COPY = 4, T = 2 * N_COPY + 2, VOCAB = 11, TRAIN_STEPS = 4 };

typedef struct lm_case {
    const char *name;
    ct_layer *(*build)(float dropout);
    const char *meta[16][2];  // the settings the reference needs, ended by {NULL}
} lm_case;

// 2 layers, 4 heads of 4, d_ff != d_model.
static ct_layer *transformer(float dropout) {
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = VOCAB, p.d_model = 16, p.d_ff = 24, p.n_layers = 2, p.n_heads = 4, p.max_len = 32;
    p.dropout = dropout;
    return ct_transformer_lm(p);
}

// Trax's default attention (SelfAttention, full: chunk_len None) with causal
// masking, d_qk != d_v, FastGelu, the trainable position table.
static ct_layer *reformer(float dropout) {
    ct_reformer_lm_params p = ct_reformer_lm_default_params();
    p.vocab_size = VOCAB, p.d_model = 8, p.d_ff = 20, p.n_layers = 2, p.n_heads = 2, p.max_len = 32;
    p.d_attention_key = 4, p.d_attention_value = 6;
    p.dropout = dropout;
    return ct_reformer_lm(p);
}

static const lm_case cases[] = {
    {"transformer", transformer,
     {{"model", "TransformerLM"}, {"vocab_size", "11"}, {"d_model", "16"}, {"d_ff", "24"}, {"n_layers", "2"},
      {"n_heads", "4"}, {"max_len", "32"}, {NULL, NULL}}},
    {"reformer", reformer,
     {{"model", "ReformerLM"}, {"vocab_size", "11"}, {"d_model", "8"}, {"d_ff", "20"}, {"n_layers", "2"},
      {"n_heads", "2"}, {"max_len", "32"}, {"d_attention_key", "4"}, {"d_attention_value", "6"},
      {"ff_activation", "FastGelu"}, {NULL, NULL}}},
};

static ct_trainer *new_trainer(ct_layer *model, const ct_tensor *batch, ct_optimizer *opt, ct_device *dev) {
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_trainer_options o = ct_trainer_default_options();
    ct_trainer *tr = NULL;
    ct_error err;
    CHECK_OK(ct_trainer_new(&tr, model, loss, batch, 3, opt, ct_key_from_seed(5), dev, &o, &err), &err);
    ct_layer_free(loss);
    return tr;
}

static void run_case(const char *out_dir, const lm_case *c) {
    int32_t tokens[B * T];
    float weights[B * T];
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, B, T, tokens), ct_tensor_2d(CT_DTYPE_I32, B, T, tokens),
                          ct_tensor_2d(CT_DTYPE_F32, B, T, weights)};
    ct_device dev = ct_device_cpu();
    ct_error err;
    char dir[1024], path[1100];
    snprintf(dir, sizeof dir, "%s/%s", out_dir, c->name);

    // A few steps, so that no weight is at its initializer's value.
    ct_layer *model = c->build(0.1f);
    ct_adam_params ap = ct_adam_default_params();
    ct_trainer *tr = new_trainer(model, batch, ct_adam_new(ap), &dev);
    ct_copy_task copy = {VOCAB, N_COPY, false, 7, 0};
    ct_step_stats stats = {0};
    for (int step = 1; step <= TRAIN_STEPS; step++) {
        ct_copy_task_batch(&copy, (uint64_t)step, B, tokens, weights);
        CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_fold_in(ct_key_from_seed(6), (uint32_t)step), step, 3e-2f,
                                     &stats, &err),
                 &err);
    }
    // The first LayerNorm's input at a variance near its epsilon (embedding
    // and positions (B, T, D) at about 3e-3 where training left them at 0.5),
    // so that the epsilon and its place matter to the loss: at the trained
    // scale, TransformerLM with an epsilon of 1e-5 for Trax's 1e-6 was 8e-8
    // (relative) from the reference, here 1.5e-3.
    for (int i = 0; i < 2; i++) {
        static const char *const small[] = {"Embedding[1]/embedding", "PositionalEncoding[3]/embedding"};
        char name[128];
        snprintf(name, sizeof name, "%s/%s", c->meta[0][1], small[i]);
        ct_tensor t;
        CHECK_OK(ct_trainer_tensor(tr, CT_PART_WEIGHT, name, &t, &err), &err);
        for (int64_t k = 0; k < ct_tensor_numel(&t); k++) ((float *)t.data)[k] *= 6e-3f;
    }
    ct_checkpoint_options co = ct_checkpoint_default_options();
    co.step = TRAIN_STEPS;
    ct_checkpoint_writer *w = NULL;
    int nw, ns;
    ct_named_tensor *wt, *st;
    ct_trainer_checkpoint_tensors(tr, &wt, &nw, &st, &ns);
    CHECK_OK(ct_checkpoint_writer_begin(&w, dir, "model_4", &co, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(w, "weights.safetensors", wt, nw, NULL, 0, &err), &err);
    CHECK_OK(ct_checkpoint_writer_set_state(w, "{}", &err), &err);
    CHECK_OK(ct_checkpoint_writer_commit(w, &err), &err);
    ct_free(wt), ct_free(st);

    // The reference batch: random tokens (targets = inputs: the model shifts
    // right itself), loss weights k / 4 for k in 0..8, so that the mean is
    // over weighted tokens and not over all of them.
    float u[B * T];
    ct_random_uniform(ct_key_from_seed(11), u, B * T, 0.0f, 1.0f);
    for (int i = 0; i < B * T; i++) tokens[i] = (int32_t)(u[i] * VOCAB) % VOCAB;
    ct_random_uniform(ct_key_from_seed(12), u, B * T, 0.0f, 1.0f);
    for (int i = 0; i < B * T; i++) weights[i] = (float)((int)(u[i] * 9) % 9) / 4.0f;
    float loss_eval = NAN;
    CHECK_OK(ct_trainer_eval_loss(tr, batch, ct_key_from_seed(13), &loss_eval, &err), &err);
    ct_trainer_free(tr);
    ct_layer_free(model);

    // The same tokens (loss weights 1) through the evaluator of `ctrax eval`
    // and the Loop's evals: a model net loaded from the checkpoint, a token
    // file cut into B sequences of T.
    float loss_evaluator = NAN;
    {
        uint16_t raw[B * T];
        for (int i = 0; i < B * T; i++) raw[i] = (uint16_t)tokens[i];  // little-endian hosts only, as ctrax
        snprintf(path, sizeof path, "%s/%s.tokens", out_dir, c->name);
        FILE *f = fopen(path, "wb");
        CHECK(f && fwrite(raw, sizeof raw, 1, f) == 1 && fclose(f) == 0);
        const char *paths[1] = {path};
        ct_corpus_params cp = ct_corpus_default_params();
        cp.paths = paths, cp.n_paths = 1, cp.seq_len = T;
        ct_batch_params bp = ct_batch_default_params();
        bp.batch_size = B;
        ct_stream *s = NULL;
        CHECK_OK(ct_token_stream_new(&s, &cp, &err), &err);
        CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
        model = c->build(0.1f);
        ct_layer *metric = ct_weighted_category_cross_entropy();
        ct_eval_task task = {.stream = s, .n_metrics = 1, .n_batches = 1, .metrics = {metric}};
        ct_evaluator *ev = NULL;
        ct_net net;
        ct_checkpoint *ck = NULL;
        double v = NAN;
        CHECK_OK(ct_checkpoint_open_latest(&ck, dir, &err), &err);
        CHECK_OK(ct_evaluator_new(&ev, model, &task, NULL, &dev, &err), &err);
        CHECK_OK(ct_evaluator_model_net(ev, &net, ct_key_from_seed(15), &err), &err);
        CHECK_OK(ct_net_load_checkpoint(&net, ck, CT_LOAD_STRICT, &err), &err);
        CHECK_OK(ct_evaluator_run(ev, &net, ct_key_from_seed(16), &v, &err), &err);
        loss_evaluator = (float)v;
        ct_evaluator_free(ev);
        ct_net_free(&net);
        ct_checkpoint_close(ck);
        ct_stream_free(s);
        ct_layer_free(metric);
        ct_layer_free(model);
    }

    // The gradient at those weights: dropout 0, so that a training step's
    // forward is the eval forward; learning rate 0 keeps the weights.
    ct_checkpoint *ck = NULL;
    CHECK_OK(ct_checkpoint_open_latest(&ck, dir, &err), &err);
    model = c->build(0.0f);
    tr = new_trainer(model, batch, ct_sgd_new(ct_sgd_default_params()), &dev);
    CHECK_OK(ct_trainer_load_checkpoint(tr, ck, CT_LOAD_EXACT, &err), &err);
    ct_checkpoint_close(ck);
    CHECK_OK(ct_trainer_one_step(tr, batch, ct_key_from_seed(14), 1, 0.0f, &stats, &err), &err);
    const ct_net *net = ct_trainer_net(tr);
    int n_out = 5 + ct_net_weight_count(net);
    ct_named_tensor *out = calloc((size_t)n_out, sizeof *out);
    char **names = calloc((size_t)ct_net_weight_count(net), sizeof *names);
    out[0] = (ct_named_tensor){"inputs", batch[0]};
    out[1] = (ct_named_tensor){"targets", batch[1]};
    out[2] = (ct_named_tensor){"weights", batch[2]};
    out[3] = (ct_named_tensor){"loss_eval", ct_tensor_1d(CT_DTYPE_F32, 1, &loss_eval)};
    out[4] = (ct_named_tensor){"loss_evaluator", ct_tensor_1d(CT_DTYPE_F32, 1, &loss_evaluator)};
    for (int i = 0; i < ct_net_weight_count(net); i++) {
        const char *name = ct_net_weight_name(net, i);
        names[i] = malloc(strlen(name) + 6);
        sprintf(names[i], "grad/%s", name);
        CHECK_OK(ct_trainer_tensor(tr, CT_PART_GRAD, name, &out[5 + i].tensor, &err), &err);
        out[5 + i].name = names[i];
    }
    ct_kv meta[18];
    int n_meta = 0;
    for (; c->meta[n_meta][0]; n_meta++) meta[n_meta] = (ct_kv){c->meta[n_meta][0], c->meta[n_meta][1]};
    meta[n_meta++] = (ct_kv){"checkpoint", dir};
    snprintf(path, sizeof path, "%s/%s.safetensors", out_dir, c->name);
    CHECK_OK(ct_safetensors_write(path, out, n_out, meta, n_meta, &err), &err);
    printf("%s: eval loss %.7f, evaluator's at weights 1 %.7f (train-mode loss at dropout 0: %.7f)\n", c->name,
           loss_eval, loss_evaluator, stats.loss);
    for (int i = 0; i < ct_net_weight_count(net); i++) free(names[i]);
    free(names), free(out);
    ct_trainer_free(tr);
    ct_layer_free(model);
    CHECK(dev.current_bytes == 0);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: lm_reference OUT_DIR\n");
        return 2;
    }
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(argv[1], &cases[i]);
    return check_summary("lm_reference");
}
