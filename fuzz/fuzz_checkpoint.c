// Checkpoints (src/train/checkpoint.c): manifest.json through the open and
// load path. At start the harness writes one real checkpoint, model_1 (two
// safetensors files, config.gin, state.json, the pointer); each input then
// replaces its manifest.json. A manifest that opens must list files that are
// present and intact, so every tensor it names loads; the harness loads them
// all (exact mode, into buffers of the size the header says), then by name,
// then lists the output directory and finds the latest checkpoint.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ctrax/core/memory.h"
#include "core/fs.h"
#include "ctrax/train/checkpoint.h"
#include "common.h"

static char run_dir[1024];

// The checkpoint every input's manifest describes (or fails to).
static void write_checkpoint(void) {
    fuzz_path(run_dir, sizeof run_dir, "run");
    float w[6] = {1, 2, 3, 4, 5, 6}, b[3] = {0.5f, -1, 2};
    int32_t count[1] = {7};
    uint16_t half[4] = {0x3f80, 0x4000, 0x4040, 0x4080};
    ct_named_tensor weights[] = {{"dense/kernel", ct_tensor_2d(CT_DTYPE_F32, 2, 3, w)},
                                 {"dense/bias", ct_tensor_1d(CT_DTYPE_F32, 3, b)},
                                 {"bf16", ct_tensor_1d(CT_DTYPE_BF16, 4, half)}};
    ct_named_tensor slots[] = {{"adam/count", ct_tensor_1d(CT_DTYPE_I32, 1, count)},
                               {"empty", ct_tensor_1d(CT_DTYPE_F32, 0, NULL)}};
    ct_kv meta[] = {{"optimizer", "Adam"}};
    ct_checkpoint_options o = ct_checkpoint_default_options();
    o.step = 1;
    ct_checkpoint_writer *wr;
    ct_error err;
    const char *gin = "train.steps = 1\n";
    if (ct_checkpoint_writer_begin(&wr, run_dir, "model_1", &o, &err) != CT_OK ||
        ct_checkpoint_writer_add_tensors(wr, "weights.safetensors", weights, 3, NULL, 0, &err) != CT_OK ||
        ct_checkpoint_writer_add_tensors(wr, "slots.safetensors", slots, 2, meta, 1, &err) != CT_OK ||
        ct_checkpoint_writer_add_bytes(wr, "config.gin", gin, strlen(gin), &err) != CT_OK ||
        ct_checkpoint_writer_set_state(wr, "{\"step\": 1}", &err) != CT_OK ||
        ct_checkpoint_writer_commit(wr, &err) != CT_OK) {
        fprintf(stderr, "fuzz_checkpoint: writing the checkpoint: %s\n", err.msg);
        abort();
    }
    // The manifest as written, beside the run: the seed corpus's (FUZZ_KEEP_DIR).
    char path[1024], *text;
    size_t n;
    if (ct_fs_read(fuzz_path(path, sizeof path, "run/model_1/manifest.json"), &text, &n, &err) != CT_OK) abort();
    fuzz_write(path, sizeof path, "manifest.json", text, n);
    free(text);
}

// Requests for every tensor of every safetensors file, then loads them.
static void load_all(const ct_checkpoint *c) {
    int n = 0;
    for (int f = 0; f < ct_checkpoint_file_count(c); f++) {
        const ct_safetensors *st = ct_checkpoint_tensors(c, ct_checkpoint_file_name(c, f));
        if (st) n += ct_safetensors_count(st);
    }
    ct_tensor_request *reqs = ct_calloc((size_t)n + 1, sizeof *reqs);
    int k = 0;
    for (int f = 0; f < ct_checkpoint_file_count(c); f++) {
        const char *file = ct_checkpoint_file_name(c, f);
        const ct_safetensors *st = ct_checkpoint_tensors(c, file);
        if (!st) {
            size_t len;
            const char *bytes = ct_checkpoint_file_bytes(c, file, &len);
            if (bytes) fuzz_touch(bytes, len + 1);
            continue;
        }
        for (int i = 0; i < ct_safetensors_count(st); i++) {
            ct_tensor t = ct_safetensors_tensor(st, i);
            t.data = ct_malloc(ct_tensor_nbytes(&t) + 1);
            reqs[k++] = (ct_tensor_request){.file = file, .name = ct_safetensors_name(st, i), .dest = t};
        }
    }
    ct_error err;
    ct_checkpoint_load(c, reqs, n, CT_LOAD_EXACT, &err);
    ct_checkpoint_load(c, reqs, n, CT_LOAD_BY_NAME, &err);
    if (n > 0) {
        reqs[0].dest.shape[0]++;  // one mismatch
        ct_checkpoint_load(c, reqs, n, CT_LOAD_BY_NAME, &err);
        reqs[0].dest.shape[0]--;
    }
    for (int i = 0; i < n; i++) ct_free(reqs[i].dest.data);
    ct_free(reqs);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!run_dir[0]) write_checkpoint();
    char path[1024];
    fuzz_write(path, sizeof path, "run/model_1/manifest.json", data, size);
    ct_checkpoint *c;
    ct_error err;
    if (ct_checkpoint_open(&c, run_dir, "model_1", &err) == CT_OK) {
        const char *state = ct_checkpoint_state(c);
        if (state) fuzz_touch(state, strlen(state));
        ct_checkpoint_step(c);
        ct_checkpoint_kept(c);
        load_all(c);
        ct_checkpoint_close(c);
    }
    ct_checkpoint_info *infos = NULL;
    int n = 0;
    if (ct_checkpoint_list(run_dir, &infos, &n, &err) == CT_OK) free(infos);
    char name[CT_CHECKPOINT_NAME_MAX];
    ct_checkpoint_find_latest(run_dir, name, sizeof name, &err);
    return 0;
}
