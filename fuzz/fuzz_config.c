// The gin config parser, the way `ctrax train` reads a config file
// (tools/ctrax.c build_run): parse the file, validate, query the train
// settings, build the model, loss, optimizer and schedule the config names
// (not the inputs, which read data files), then write the operative config,
// which must parse back. The input is the config file.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/config/config.h"
#include "ctrax/core/memory.h"
#include "common.h"

// What build_run queries, in its order; a failed query ends it (an error
// status is a normal outcome).
static ct_status train_settings(ct_config *c, ct_error *err) {
    const char *model_name, *loss_name, *opt_name, *sched_name, *inputs_name, *high, *low;
    int64_t i64;
    double f;
    bool b;
    CT_TRY(ct_config_get_reference(c, "train", "model", NULL, &model_name, err));
    CT_TRY(ct_config_get_reference(c, "train", "loss_fn", "WeightedCategoryCrossEntropy", &loss_name, err));
    CT_TRY(ct_config_get_reference(c, "train", "optimizer", "Adam", &opt_name, err));
    CT_TRY(ct_config_get_reference(c, "train", "lr_schedule_fn", NULL, &sched_name, err));
    CT_TRY(ct_config_get_reference(c, "train", "inputs", NULL, &inputs_name, err));
    CT_TRY(ct_config_get_int(c, "train", "steps", 1000, &i64, err));
    CT_TRY(ct_config_get_int(c, "train", "batch_size", 32, &i64, err));
    CT_TRY(ct_config_get_int(c, "train", "eval_frequency", 100, &i64, err));
    CT_TRY(ct_config_get_int(c, "train", "eval_steps", 10, &i64, err));
    CT_TRY(ct_config_get_int(c, "train", "random_seed", 0, &i64, err));
    CT_TRY(ct_config_get_int(c, "train", "n_devices", 1, &i64, err));
    CT_TRY(ct_config_get_bool(c, "train", "adasum", false, &b, err));
    CT_TRY(ct_config_get_bool(c, "train", "use_memory_efficient_trainer", false, &b, err));
    CT_TRY(ct_config_get_float(c, "train", "clip_grad_norm", 0.0, &f, err));
    CT_TRY(ct_config_get_int(c, "train", "keep_checkpoints", 2, &i64, err));
    CT_TRY(ct_config_get_string(c, "train", "checkpoint_highest", NULL, &high, err));
    CT_TRY(ct_config_get_string(c, "train", "checkpoint_lowest", NULL, &low, err));
    CT_TRY(ct_config_get_int(c, "Loop", "n_steps_per_checkpoint", 100, &i64, err));
    CT_TRY(ct_config_get_int(c, "Loop", "n_steps_per_permanent_checkpoint", 0, &i64, err));

    ct_layer *model = NULL, *loss = NULL;
    ct_optimizer *opt = NULL;
    ct_schedule *schedule = NULL;
    ct_status st = CT_OK;
    if (model_name) st = ct_config_build_model(c, model_name, &model, err);
    if (st == CT_OK) st = ct_config_build_layer(c, loss_name, &loss, err);
    if (st == CT_OK) st = ct_config_build_optimizer(c, opt_name, &opt, err);
    if (st == CT_OK && sched_name) st = ct_config_build_schedule(c, sched_name, &schedule, err);
    ct_layer_free(model);
    ct_layer_free(loss);
    ct_optimizer_free(opt);
    ct_schedule_free(schedule);
    return st;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[1024];
    fuzz_write(path, sizeof path, "config.gin", data, size);
    ct_config *cfg = ct_config_new();
    ct_error err;
    if (ct_config_parse_file(cfg, path, &err) == CT_OK && ct_config_validate(cfg, &err) == CT_OK &&
        train_settings(cfg, &err) == CT_OK) {
        for (int i = 0; i < ct_config_n_bindings(cfg); i++) ct_config_binding_at(cfg, i);
        // The operative config is gin that parses back (config.h).
        char *text = ct_config_operative_text(cfg);
        ct_config *back = ct_config_new();
        if (ct_config_parse_text(back, text, strlen(text), "<operative>", &err) != CT_OK ||
            ct_config_validate(back, &err) != CT_OK) {
            fprintf(stderr, "the operative config does not parse back: %s\n%s\n", err.msg, text);
            abort();
        }
        ct_config_free(back);
        ct_free(text);
    }
    ct_config_free(cfg);
    return 0;
}
