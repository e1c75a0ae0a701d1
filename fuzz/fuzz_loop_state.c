// The training loop's state reader (src/train/loop.c restore): state.json
// through ct_loop_new's resume, and ct_loop_checkpoint_seed (what ctrax train
// reads back for random_seed = None). At start the harness trains a tiny
// TransformerLM two steps with two train tasks (task 1 with an optimizer of
// its own, so state.json has task_optimizers and the checkpoint
// slots_task1.safetensors) and an additional eval task (its cursor in
// additional_eval_cursors), evaluates, and saves model_2; each input then
// replaces its state.json, and the harness rewrites the manifest's size and
// crc32 for it, so the input reaches the state reader instead of failing
// the checksum. Then a new loop resumes from it, and is freed.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <zlib.h>

#include <cjson/cJSON.h>

#include "ctrax/ctrax.h"
#include "core/fs.h"
#include "common.h"

enum { VOCAB = 6, LEN = 2, B = 2 };

static char run_dir[1024];
static cJSON *manifest;  // model_2's, as the loop wrote it
static ct_layer *model, *loss, *metric, *metric_more;  // a layer belongs to one net: one metric per eval task

static ct_stream *batches(uint64_t seed) {
    ct_copy_task t = {VOCAB, LEN, false, seed, 0};
    ct_stream *s;
    ct_error err;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = B;
    if (ct_copy_stream_new(&s, &t, &err) != CT_OK || ct_batch_stream_new(&s, s, &bp, &err) != CT_OK) {
        fprintf(stderr, "fuzz_loop_state: %s\n", err.msg);
        abort();
    }
    return s;
}

// The run's loop and the streams it reads (its tasks and evals), as setup
// wrote the checkpoint and every resume reads it.
typedef struct run {
    ct_stream *train[2], *eval, *more;
    ct_loop *loop;
} run;

static ct_status run_new(run *r, bool restore, ct_error *err) {
    float lr = ct_adam_default_params().learning_rate;
    r->train[0] = batches(1), r->train[1] = batches(3), r->eval = batches(2), r->more = batches(4);
    ct_train_task tasks[2] = {{r->train[0], loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", lr},
                              {r->train[1], loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", lr}};
    ct_eval_task ev = {.stream = r->eval, .n_metrics = 1, .n_batches = 1};
    ev.metrics[0] = metric;
    ev.metric_names[0] = "loss";
    ct_eval_task more = ev;
    more.stream = r->more;
    more.metrics[0] = metric_more;
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = run_dir;
    o.restore = restore;
    o.n_steps_per_checkpoint = 1000;
    o.additional_eval_tasks = &more;
    o.n_additional_eval_tasks = 1;
    return ct_loop_new(&r->loop, model, tasks, 2, &ev, &o, err);
}

static void run_free(run *r) {
    ct_loop_free(r->loop);
    ct_stream_free(r->train[0]), ct_stream_free(r->train[1]);
    ct_stream_free(r->eval), ct_stream_free(r->more);
}

// A loop resuming from run_dir, freed at once, and the seed a resume of a
// drawn-seed run would read: an error status is a normal outcome.
static void resume(void) {
    run r = {0};
    ct_error err;
    run_new(&r, true, &err);
    run_free(&r);
    bool found;
    uint64_t seed;
    ct_loop_checkpoint_seed(run_dir, NULL, &found, &seed, &err);
}

static void setup(void) {
    fuzz_path(run_dir, sizeof run_dir, "run");
    ct_transformer_lm_params p = ct_transformer_lm_default_params();
    p.vocab_size = VOCAB;
    p.d_model = 4;
    p.d_ff = 8;
    p.n_layers = 1;
    p.n_heads = 1;
    p.max_len = 2 * LEN + 2;
    model = ct_transformer_lm(p);
    loss = ct_weighted_category_cross_entropy();
    metric = ct_weighted_category_cross_entropy();
    metric_more = ct_weighted_category_cross_entropy();
    run r = {0};
    ct_error err;
    char path[1024], *text = NULL;
    size_t n;
    if (run_new(&r, false, &err) != CT_OK || ct_loop_run(r.loop, 2, &err) != CT_OK ||
        ct_loop_run_evals(r.loop, &err) != CT_OK || ct_loop_save_checkpoint(r.loop, &err) != CT_OK ||
        ct_fs_read(fuzz_path(path, sizeof path, "run/model_2/manifest.json"), &text, &n, &err) != CT_OK) {
        fprintf(stderr, "fuzz_loop_state: writing the checkpoint: %s\n", err.msg);
        abort();
    }
    run_free(&r);
    manifest = cJSON_Parse(text);
    free(text);
    // state.json as written, beside the run: the seed corpus's (FUZZ_KEEP_DIR).
    if (ct_fs_read(fuzz_path(path, sizeof path, "run/model_2/state.json"), &text, &n, &err) != CT_OK) abort();
    fuzz_write(path, sizeof path, "state.json", text, n);
    free(text);
    if (!manifest) abort();
}

// The manifest with state.json's entry describing data.
static void write_manifest(const uint8_t *data, size_t size) {
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(manifest, "files")) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, "state.json")) continue;
        char crc[9];
        snprintf(crc, sizeof crc, "%08lx", crc32(crc32(0L, Z_NULL, 0), data, (uInt)size));
        cJSON_ReplaceItemInObjectCaseSensitive((cJSON *)f, "bytes", cJSON_CreateNumber((double)size));
        cJSON_ReplaceItemInObjectCaseSensitive((cJSON *)f, "crc32", cJSON_CreateString(crc));
    }
    char *text = cJSON_Print(manifest), path[1024];
    fuzz_write(path, sizeof path, "run/model_2/manifest.json", text, strlen(text));
    cJSON_free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!run_dir[0]) setup();
    char path[1024];
    fuzz_write(path, sizeof path, "run/model_2/state.json", data, size);
    write_manifest(data, size);
    resume();
    // What the loop's summaries write on each resume.
    ct_fs_remove_tree(fuzz_path(path, sizeof path, "run/train"), NULL);
    ct_fs_remove_tree(fuzz_path(path, sizeof path, "run/eval"), NULL);
    return 0;
}
