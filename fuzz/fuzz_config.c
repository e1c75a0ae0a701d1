// The gin config parser, the way `ctrax train` reads a config file
// (tools/ctrax.c build_run): parse the file, validate, read the train and
// Loop settings, check the memory budget, build the model, loss, optimizer
// and schedule the config names (not the inputs, which read data files),
// then write the operative config, which must parse back. The input is the
// config file.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/config/config.h"
#include "ctrax/core/memory.h"
#include "common.h"

// What build_run does after validating: read every train and Loop setting,
// check the memory budget, build model, loss, optimizer and schedule (not
// the inputs). A failure ends it (an error status is a normal outcome).
static ct_status train_settings(ct_config *c, ct_error *err) {
    ct_train_settings t;
    ct_loop_settings l;
    CT_TRY(ct_config_read_train(c, &t, err));
    CT_TRY(ct_config_read_loop(c, &l, err));
    if (!t.model || !t.inputs) return CT_OK;
    ct_config_run_shape shape = {.model = t.model, .optimizer = t.optimizer, .inputs = t.inputs,
                                 .batch_size = t.batch_size, .n_devices = (int)t.n_devices, .n_processes = 1,
                                 .memory_efficient = t.use_memory_efficient_trainer};
    ct_config_memory mem;
    CT_TRY(ct_config_check_memory(c, &shape, &mem, err));
    ct_layer *model = NULL, *loss = NULL;
    ct_optimizer *opt = NULL;
    ct_schedule *schedule = NULL;
    ct_status st = ct_config_build_model(c, t.model, &model, err);
    if (st == CT_OK) st = ct_config_build_layer(c, t.loss_fn, &loss, err);
    if (st == CT_OK) st = ct_config_build_optimizer(c, t.optimizer, &opt, err);
    if (st == CT_OK && t.lr_schedule_fn) st = ct_config_build_schedule(c, t.lr_schedule_fn, &schedule, err);
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
