// ctrax eval: the eval metrics of a checkpoint on the config's eval stream.
//
// Read-only: nothing is written to the output directory. An evaluator (no
// trainer, no optimizer, no Loop) gets a net for the model alone, shaped by
// the eval stream's batches; the checkpoint's weights and state are loaded
// into it strictly by name; then it runs the config's metrics over the first
// N batches of a fresh eval stream (the same batches for every checkpoint,
// so checkpoints compare fairly), averaged exactly as the Loop's evals.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "commands.h"
#include "ctrax/config/config.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/data/stream.h"
#include "ctrax/train/evaluator.h"
#include "ctrax/train/trainer.h"
#include "train/summary_internal.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrax eval OUTPUT_DIR [--steps N] [--name NAME] [--threads N]\n"
            "\n"
            "Evaluates the newest checkpoint of a training run (or a checkpoint directory\n"
            "given instead) on the eval stream of the config it was trained with: the\n"
            "loss (train.loss_fn) and each of train.metrics, averaged over the first N\n"
            "batches of the eval stream and weighted as in training. Writes nothing.\n"
            "\n"
            "options:\n"
            "  --steps N     eval batches [the config's train.eval_steps]\n"
            "  --name NAME   use checkpoint NAME of OUTPUT_DIR instead of the newest\n"
            "  --threads N   threads for ctrax's loops and the GEMM together\n"
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

// The evaluator on the model alone (no trainer, no optimizer): the
// checkpoint's weights and state loaded strictly by name, the metrics over
// the eval batches, one line each on stdout.
static int run_evaluator(const ct_checkpoint *c, ct_layer *model, const ct_eval_task *ev, uint64_t seed) {
    ct_evaluator *evaluator = NULL;
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err = {0};
    int rc = CTRAX_EXIT_ERROR;
    double values[CT_EVAL_MAX_METRICS];
    if (ct_evaluator_new(&evaluator, model, ev, NULL, &dev, &err) != CT_OK) return fail("setting up the evaluator", &err);
    if (ct_evaluator_model_net(evaluator, &net, ct_key_split(ct_key_from_seed(seed), 0), &err) != CT_OK) {
        ct_evaluator_free(evaluator);
        return fail("setting up the evaluator", &err);
    }
    if (ct_net_load_checkpoint(&net, c, CT_LOAD_STRICT, &err) != CT_OK) rc = fail("loading the weights", &err);
    else if (ct_evaluator_run(evaluator, &net, ct_loop_eval_key(ct_key_from_seed(seed), ct_checkpoint_step(c), 0),
                              values, &err) != CT_OK)
        rc = fail("evaluating", &err);
    else rc = CTRAX_EXIT_OK;
    int width = 0;
    for (int m = 0; m < ev->n_metrics && rc == CTRAX_EXIT_OK; m++)
        if ((int)strlen(ev->metric_names[m]) > width) width = (int)strlen(ev->metric_names[m]);
    for (int m = 0; m < ev->n_metrics && rc == CTRAX_EXIT_OK; m++) {
        char line[256];
        ct_format_step_line(line, sizeof line, ct_checkpoint_step(c), "eval", ev->metric_names[m], width, values[m]);
        printf("%s\n", line);
    }
    ct_net_free(&net);
    ct_evaluator_free(evaluator);
    return rc;
}

static int evaluate(const eval_opts *o) {
    ct_checkpoint *c = NULL;
    char *dir = NULL;
    ct_config *cfg = NULL;
    ct_layer *model = NULL;
    ct_stream *train = NULL, *eval = NULL;
    ct_eval_task ev = {0};
    ct_error err = {0};
    int rc = ctrax_open_checkpoint("eval", o->path, o->name, &c, &dir);
    if (rc) return rc;
    rc = CTRAX_EXIT_ERROR;

    if (!(cfg = ctrax_checkpoint_parse_config("eval", c, dir))) goto done;

    // What train used: model, loss, metrics, inputs, batch size, seed, eval steps.
    ct_train_settings ts;  // the registry's defaults where the config binds nothing
    if (ct_config_read_train(cfg, &ts, &err) != CT_OK) {
        fail("the checkpoint's config", &err);
        goto done;
    }
    const char *model_name = ts.model, *loss_name = ts.loss_fn, *inputs_name = ts.inputs;
    int64_t batch_size = ts.batch_size, seed = ts.random_seed, eval_steps = ts.eval_steps;
    const char *missing = !model_name    ? "train.model"
                          : !loss_name   ? "train.loss_fn"
                          : !inputs_name ? "train.inputs"
                                         : NULL;
    if (missing) {
        fputs("ctrax eval: the config of ", stderr);
        ctrax_put_checkpoint(stderr, dir, c);
        fprintf(stderr, " binds no %s\n", missing);
        goto done;
    }
    if (o->steps > 0) eval_steps = o->steps;
    if (eval_steps < 1) eval_steps = 1;
    // A checkpoint's config may be anyone's: a model or batch that cannot fit
    // is refused from the settings, naming them, as `ctrax train` refuses it,
    // before the inputs allocate the batch. Here one process on one device
    // evaluates the whole batch; no optimizer slots.
    ct_config_run_shape shape = {.model = model_name, .inputs = inputs_name, .batch_size = batch_size,
                                 .memory_efficient = ts.use_memory_efficient_trainer,
                                 .loss_chunk_size = ts.loss_chunk_size};
    if (ct_config_check_memory(cfg, &shape, NULL, &err) != CT_OK) {
        fail("the checkpoint's config", &err);
        goto done;
    }
    if (ct_config_build_inputs(cfg, inputs_name, batch_size, (uint64_t)seed, &train, &eval, &err) != CT_OK) {
        fail("building the inputs", &err);
        goto done;
    }
    if (!eval) {
        fprintf(stderr, "ctrax eval: the inputs %s give no eval stream\n", inputs_name);
        goto done;
    }

    // The model and the metrics (the loss first).
    char eval_name[300];  // the eval model, as training evaluated with
    if (ct_config_build_model(cfg, ctrax_eval_model_name(cfg, model_name, eval_name, sizeof eval_name), &model, &err) !=
        CT_OK) {
        fail("building the model", &err);
        goto done;
    }
    ev.stream = eval;
    ev.n_batches = (int)eval_steps;
    if (ctrax_eval_metrics(cfg, loss_name, &ev, &err) != CT_OK) {
        fail("building the metrics", &err);
        goto done;
    }

    // The eval batches' own size: the batcher's eval_batch_size is not the
    // step's batch.
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    int64_t eval_batch = ct_stream_signature(eval, sigs) > 0 && sigs[0].ndim > 0 ? sigs[0].shape[0] : batch_size;
    char desc[512];
    fputs("evaluating ", stderr);
    ctrax_put_checkpoint(stderr, dir, c);
    fprintf(stderr, " (step %lld) on %lld batch(es) of %lld: ", (long long)ct_checkpoint_step(c),
            (long long)eval_steps, (long long)eval_batch);
    ctrax_put_text(stderr, ct_stream_describe(eval, desc, sizeof desc));
    fputc('\n', stderr);
    if (run_evaluator(c, model, &ev, (uint64_t)seed) != CTRAX_EXIT_OK) goto done;
    rc = ctrax_flush_stdout("eval");
done:
    for (int m = 0; m < CT_EVAL_MAX_METRICS; m++) ct_layer_free(ev.metrics[m]);
    ct_layer_free(model);
    ct_stream_free(train);
    ct_stream_free(eval);
    ct_config_free(cfg);
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
            return ctrax_flush_stdout("eval");
        }
        int r;
        if ((r = ctrax_opt_threads("eval", argc, argv, &i))) {
            if (r < 0) return CTRAX_EXIT_USAGE;
            continue;
        }
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
