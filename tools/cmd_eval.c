// ctrax eval: the eval metrics of a checkpoint on the config's eval stream.
//
// Read-only: nothing is written to the output directory. The Loop is created
// without an output directory (so it opens no summaries, writes no
// config.gin and no checkpoint) and the checkpoint's weights and state are
// loaded into its trainer strictly by name; then ct_loop_run_evals runs the
// config's metrics over the first N batches of a fresh eval stream (the same
// batches for every checkpoint, so checkpoints compare fairly). The train
// stream is needed only because ct_loop_new reads the batch shapes from it;
// the optimizer is a plain SGD since no step is taken.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ctrax/config/config.h"
#include "ctrax/data/stream.h"
#include "ctrax/optim/optimizer.h"
#include "ctrax/train/loop.h"
#include "ctrax/train/summary.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrax eval OUTPUT_DIR [--steps N] [--name NAME]\n"
            "\n"
            "Evaluates the newest checkpoint of a training run (or a checkpoint directory\n"
            "given instead) on the eval stream of the config it was trained with: the\n"
            "loss (train.loss_fn) and each of train.metrics, averaged over the first N\n"
            "batches of the eval stream and weighted as in training. Writes nothing.\n"
            "\n"
            "options:\n"
            "  --steps N     eval batches [the config's train.eval_steps]\n"
            "  --name NAME   use checkpoint NAME of OUTPUT_DIR instead of the newest\n"
            "  -h, --help    show this help\n");
}

typedef struct eval_opts {
    const char *path, *name;
    int64_t steps;  // 0: the config's
} eval_opts;

static int fail(const char *what, const ct_error *err) {
    fprintf(stderr, "ctrax eval: %s: %s\n", what, err->msg);
    return CTRAX_EXIT_ERROR;
}

static int evaluate(const eval_opts *o) {
    ct_checkpoint *c = NULL;
    char *dir = NULL;
    ct_config *cfg = NULL;
    ct_layer *model = NULL, *loss = NULL;
    ct_stream *train = NULL, *eval = NULL;
    ct_loop *loop = NULL;
    ct_eval_task ev = {0};
    ct_tensor_request *reqs = NULL;
    ct_error err = {0};
    int rc = ctrax_open_checkpoint("eval", o->path, o->name, &c, &dir);
    if (rc) return rc;
    rc = CTRAX_EXIT_ERROR;

    if (!(cfg = ctrax_checkpoint_parse_config("eval", c, dir))) goto done;

    // What train used: model, loss, metrics, inputs, batch size, seed, eval steps.
    const char *model_name = NULL, *loss_name = NULL, *inputs_name = NULL;
    int64_t batch_size = 0, seed = 0, eval_steps = 0;
    if (ct_config_get_reference(cfg, "train", "model", NULL, &model_name, &err) != CT_OK ||
        ct_config_get_reference(cfg, "train", "loss_fn", "WeightedCategoryCrossEntropy", &loss_name, &err) != CT_OK ||
        ct_config_get_reference(cfg, "train", "inputs", NULL, &inputs_name, &err) != CT_OK ||
        ct_config_get_int(cfg, "train", "batch_size", 32, &batch_size, &err) != CT_OK ||
        ct_config_get_int(cfg, "train", "random_seed", 0, &seed, &err) != CT_OK ||
        ct_config_get_int(cfg, "train", "eval_steps", 10, &eval_steps, &err) != CT_OK) {
        fail("the checkpoint's config", &err);
        goto done;
    }
    const char *missing = !model_name    ? "train.model"
                          : !loss_name   ? "train.loss_fn"
                          : !inputs_name ? "train.inputs"
                                         : NULL;
    if (missing) {
        fprintf(stderr, "ctrax eval: the config of %s/%s binds no %s\n", dir, ct_checkpoint_name(c), missing);
        goto done;
    }
    if (o->steps > 0) eval_steps = o->steps;
    if (eval_steps < 1) eval_steps = 1;
    if (ct_config_build_inputs(cfg, inputs_name, batch_size, (uint64_t)seed, &train, &eval, &err) != CT_OK) {
        fail("building the inputs", &err);
        goto done;
    }
    if (!eval || !train) {
        fprintf(stderr, "ctrax eval: the inputs %s give no %s stream\n", inputs_name, !eval ? "eval" : "train");
        goto done;
    }

    // The model, the loss (twice: the trainer's, and the first eval metric)
    // and the metrics.
    if (!(model = ct_config_build_model(cfg, model_name, &err)) ||
        !(loss = ct_config_build_layer(cfg, loss_name, &err))) {
        fail("building the model", &err);
        goto done;
    }
    ev.stream = eval;
    ev.n_batches = (int)eval_steps;
    if (ctrax_eval_metrics(cfg, loss_name, &ev, &err) != CT_OK) {
        fail("building the metrics", &err);
        goto done;
    }

    ct_train_task task = {.stream = train, .loss = loss, .optimizer = ct_sgd_new(ct_sgd_default_params())};
    ct_loop_options lo = ct_loop_default_options();
    lo.output_dir = NULL;  // read-only: no summaries, no checkpoints
    lo.restore = false;
    lo.seed = (uint64_t)seed;
    if (ct_loop_new(&loop, model, &task, 1, &ev, &lo, &err) != CT_OK) {
        fail("setting up the loop", &err);
        goto done;
    }
    // The checkpoint's weights and state, every one by name, into the trainer's net.
    const ct_net *net = ct_loop_net(loop);
    int n_req = net->n_params + net->n_state_params;
    reqs = calloc((size_t)n_req + 1, sizeof *reqs);
    for (int i = 0; i < net->n_params; i++) {
        ct_tensor t = net->params[i]->sig;
        t.data = net->weights + net->params[i]->offset;
        reqs[i] = (ct_tensor_request){"weights.safetensors", net->params[i]->full_name, t, 0};
    }
    for (int i = 0; i < net->n_state_params; i++) {
        ct_tensor t = net->state_params[i]->sig;
        t.data = net->state + net->state_params[i]->offset;
        reqs[net->n_params + i] = (ct_tensor_request){"weights.safetensors", net->state_params[i]->full_name, t, 0};
    }
    if (ct_checkpoint_load(c, reqs, n_req, CT_LOAD_STRICT, &err) != CT_OK) {
        fail("loading the weights", &err);
        goto done;
    }
    char desc[512];
    fprintf(stderr, "evaluating %s/%s (step %lld) on %lld batch(es) of %lld: %s\n", dir, ct_checkpoint_name(c),
            (long long)ct_checkpoint_step(c), (long long)eval_steps, (long long)batch_size,
            ct_stream_describe(eval, desc, sizeof desc));
    if (ct_loop_run_evals(loop, &err) != CT_OK) {
        fail("evaluating", &err);
        goto done;
    }
    int width = 0;
    for (int m = 0; m < ev.n_metrics; m++)
        if ((int)strlen(ev.metric_names[m]) > width) width = (int)strlen(ev.metric_names[m]);
    for (int m = 0; m < ev.n_metrics; m++) {
        char tag[96], line[256];
        snprintf(tag, sizeof tag, "metrics/%s", ev.metric_names[m]);
        ct_format_step_line(line, sizeof line, ct_checkpoint_step(c), "eval", ev.metric_names[m], width,
                            ct_loop_last_value(loop, "eval", tag));
        printf("%s\n", line);
    }
    rc = fflush(stdout) == 0 ? CTRAX_EXIT_OK : CTRAX_EXIT_ERROR;
done:
    ct_loop_free(loop);
    for (int m = 0; m < CT_EVAL_MAX_METRICS; m++) ct_layer_free(ev.metrics[m]);
    ct_layer_free(model);
    ct_layer_free(loss);
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
    free(reqs);
    ct_checkpoint_close(c);
    free(dir);
    return rc;
}

int ctrax_cmd_eval(int argc, char **argv) {
    eval_opts o = {0};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return CTRAX_EXIT_OK;
        }
        int r;
        if ((r = ctrax_opt_value("eval", argc, argv, &i, "--steps", &v))) {
            if (r < 0 || ctrax_parse_int("eval", "--steps", v, 1, 1 << 24, &o.steps)) return CTRAX_EXIT_USAGE;
            continue;
        }
        if ((r = ctrax_opt_value("eval", argc, argv, &i, "--name", &v))) {
            if (r < 0) return CTRAX_EXIT_USAGE;
            o.name = v;
            continue;
        }
        if (a[0] == '-' && a[1]) return ctrax_usage_error("eval", "unknown option '%s'", a);
        if (o.path) return ctrax_usage_error("eval", "one output directory at a time ('%s' and '%s')", o.path, a);
        o.path = a;
    }
    if (!o.path) return ctrax_usage_error("eval", "missing OUTPUT_DIR");
    return evaluate(&o);
}
