// The ownership rule of ctrax/ctrax.h, checked: every kind of object is built
// through its public constructor and made to fail late (a device too small
// for its slabs, a bad path, a bad argument found after allocation, a file
// that turns out wrong halfway through), and an allocation tracker shows
// that nothing leaks and nothing is freed twice, whoever owned it.
//
// This executable is linked with -Wl,--wrap for the allocator (see
// CMakeLists.txt), so every allocation and free made by ctrax's code (the
// static library linked into it) and by this file goes through the tracker
// below: a table of the live pointers. A free of a pointer not in it is a
// double free (or a free of memory ctrax never allocated); the wrapper
// counts it and does not pass it on. Pointers are stored hidden (xor a
// constant), so LeakSanitizer still sees a leaked block as unreachable.
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "core/fs.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/train/safetensors.h"
#include "ctrax/train/tensorboard.h"

// ---- the allocation tracker ------------------------------------------------------

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t size);
void *__real_realloc(void *p, size_t n);
void *__real_aligned_alloc(size_t align, size_t n);
void __real_free(void *p);
char *__real_strdup(const char *s);
char *__real_realpath(const char *path, char *resolved);

#define TRACK_BITS 21
#define TRACK_N (1u << TRACK_BITS)
#define HIDE ((uintptr_t)0xa5a5a5a5a5a5a5a5ull)

static uintptr_t track_key[TRACK_N];  // pointer ^ HIDE; 0: empty
static uint64_t track_seq[TRACK_N];   // when it was allocated
static size_t track_bytes[TRACK_N];
static pthread_mutex_t track_mu = PTHREAD_MUTEX_INITIALIZER;
static long n_live, n_bad_frees;
static uint64_t n_seq;

static uint32_t track_slot(uintptr_t key) {
    return (uint32_t)(((key >> 4) * UINT64_C(0x9E3779B97F4A7C15)) >> (64 - TRACK_BITS));
}

static void track_add(void *p, size_t bytes) {
    if (!p) return;
    uintptr_t key = (uintptr_t)p ^ HIDE;
    pthread_mutex_lock(&track_mu);
    if (n_live >= (long)(TRACK_N / 4 * 3)) {
        pthread_mutex_unlock(&track_mu);
        fprintf(stderr, "test_ownership: the tracker is full\n");
        abort();
    }
    uint32_t i = track_slot(key);
    while (track_key[i]) i = (i + 1) & (TRACK_N - 1);
    track_key[i] = key;
    track_seq[i] = n_seq++;
    track_bytes[i] = bytes;
    n_live++;
    pthread_mutex_unlock(&track_mu);
}

// Removes p (linear probing, backward-shift deletion); false if unknown.
static bool track_remove(void *p) {
    uintptr_t key = (uintptr_t)p ^ HIDE;
    pthread_mutex_lock(&track_mu);
    uint32_t i = track_slot(key);
    while (track_key[i] && track_key[i] != key) i = (i + 1) & (TRACK_N - 1);
    if (!track_key[i]) {
        n_bad_frees++;
        pthread_mutex_unlock(&track_mu);
        return false;
    }
    for (uint32_t j = i;;) {
        j = (j + 1) & (TRACK_N - 1);
        if (!track_key[j]) break;
        uint32_t home = track_slot(track_key[j]);
        bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
        if (stays) continue;
        track_key[i] = track_key[j];
        track_seq[i] = track_seq[j];
        track_bytes[i] = track_bytes[j];
        i = j;
    }
    track_key[i] = 0;
    n_live--;
    pthread_mutex_unlock(&track_mu);
    return true;
}

void *__wrap_malloc(size_t n) {
    void *p = __real_malloc(n);
    track_add(p, n);
    return p;
}
void *__wrap_calloc(size_t n, size_t size) {
    void *p = __real_calloc(n, size);
    track_add(p, n * size);
    return p;
}
void *__wrap_aligned_alloc(size_t align, size_t n) {
    void *p = __real_aligned_alloc(align, n);
    track_add(p, n);
    return p;
}
void *__wrap_realloc(void *p, size_t n) {
    if (p) track_remove(p);
    void *q = __real_realloc(p, n);
    if (q)
        track_add(q, n);
    else if (p && n)
        track_add(p, n);  // failed: p is still there
    return q;
}
void __wrap_free(void *p) {
    if (p && track_remove(p)) __real_free(p);
}
// What libc allocates for ctrax and ctrax frees with free(). (cJSON
// allocates through the hooks core/json.c installs, malloc and free, which
// this file's wrappers already see.)
char *__wrap_strdup(const char *s) {
    char *p = __real_strdup(s);
    track_add(p, p ? strlen(p) + 1 : 0);
    return p;
}
char *__wrap_realpath(const char *path, char *resolved) {
    char *p = __real_realpath(path, resolved);
    if (p && !resolved) track_add(p, strlen(p) + 1);
    return p;
}
// ---- cases -------------------------------------------------------------------

static ct_device dev;      // reset for each case; a case may give it a limit
static char dir[64];       // a fresh directory for each case's files
static const char *g_case;  // for messages

static const char *path_in(const char *name) {
    static char buf[8][256];
    static int k;
    k = (k + 1) % 8;
    snprintf(buf[k], sizeof buf[k], "%s/%s", dir, name);
    return buf[k];
}

static void write_bytes(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f && fwrite(data, 1, n, f) == n, "%s: cannot write %s", g_case, path);
    if (f) fclose(f);
}

// Runs one case and checks that it left nothing behind: no live allocation
// made since it began, no free of an unknown pointer, no device byte.
static void run_case(const char *name, void (*fn)(void)) {
    g_case = name;
    dev = ct_device_cpu();
    snprintf(dir, sizeof dir, "/tmp/ct_ownership_XXXXXX");
    CHECK(mkdtemp(dir) != NULL);
    pthread_mutex_lock(&track_mu);
    long live0 = n_live, bad0 = n_bad_frees;
    uint64_t seq0 = n_seq;
    pthread_mutex_unlock(&track_mu);
    fn();
    pthread_mutex_lock(&track_mu);
    long leaked = n_live - live0, bad = n_bad_frees - bad0;
    if (leaked > 0) {
        int shown = 0;
        for (uint32_t i = 0; i < TRACK_N && shown < 8; i++)
            if (track_key[i] && track_seq[i] >= seq0) {
                fprintf(stderr, "  %s: leaked block #%llu of %zu bytes\n", name,
                        (unsigned long long)(track_seq[i] - seq0), track_bytes[i]);
                shown++;
            }
    }
    pthread_mutex_unlock(&track_mu);
    CHECK_MSG(leaked == 0, "%s: %ld allocations leaked", name, leaked);
    CHECK_MSG(bad == 0, "%s: %ld frees of memory not allocated or already freed", name, bad);
    CHECK_MSG(dev.current_bytes == 0, "%s: %zu device bytes not given back", name, dev.current_bytes);
    ct_fs_remove_tree(dir, NULL);
    printf("ok   %-72s (%ld live, %ld bad frees)\n", name, leaked, bad);
}

// A failed constructor: the status, and *out left NULL.
#define CHECK_FAILS(expr, out, code)                                                                              \
    do {                                                                                                          \
        ct_error e_;                                                                                              \
        ct_error_clear(&e_);                                                                                      \
        ct_status st_ = (expr);                                                                                   \
        CHECK_MSG(st_ == (code), "%s: %s gave %s (%s), expected %s", g_case, #expr, ct_status_name(st_), e_.msg, \
                  ct_status_name(code));                                                                          \
        CHECK_MSG((out) == NULL, "%s: %s left its out pointer set", g_case, #expr);                             \
    } while (0)

// ---- the tracker itself can fail ------------------------------------------------

static long probe_live(void) {
    pthread_mutex_lock(&track_mu);
    long n = n_live;
    pthread_mutex_unlock(&track_mu);
    return n;
}

static void tracker_sees_leaks_and_double_frees(void) {
    long live0 = probe_live(), bad0 = n_bad_frees;
    void *p = ct_malloc(24);
    CHECK_MSG(probe_live() == live0 + 1, "the malloc wrapper is not active");
    ct_free(p);
    CHECK(probe_live() == live0);
    ct_free(p);  // the second free is caught, not passed on
    CHECK_MSG(n_bad_frees == bad0 + 1, "a double free went unseen");
    n_bad_frees = bad0;
    char *s = ct_strdup("x");
    CHECK(probe_live() == live0 + 1);
    ct_free(s);
}

// ---- streams -------------------------------------------------------------------

static void text_too_short(void) {
    write_bytes(path_in("a.txt"), "abcde", 5);
    const char *paths[] = {path_in("a.txt")};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = 16;
    ct_stream *s = (ct_stream *)1;
    CHECK_FAILS(ct_text_stream_new(&s, &p, &e_), s, CT_ERR_FORMAT);
}

static void text_empty_split(void) {
    char text[400];
    for (int i = 0; i < 400; i++) text[i] = (char)('a' + i % 26);
    write_bytes(path_in("a.txt"), text, sizeof text);
    const char *paths[] = {dir};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = 16;
    p.split = CT_DATA_SPLIT_EVAL;
    p.eval_fraction = 0;  // found empty after the files are mapped and the chunks indexed
    ct_stream *s = (ct_stream *)1;
    CHECK_FAILS(ct_text_stream_new(&s, &p, &e_), s, CT_ERR_ARG);
}

static void tokens_partial_token(void) {
    char data[64] = {0};
    CHECK(mkdir(path_in("tok"), 0700) == 0);
    write_bytes(path_in("tok/a.bin"), data, 64);
    write_bytes(path_in("tok/b.bin"), data, 33);  // mapped after a.bin: half a token at its end
    const char *paths[] = {path_in("tok")};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = 4;
    p.token_bytes = 2;
    ct_stream *s = (ct_stream *)1;
    CHECK_FAILS(ct_token_stream_new(&s, &p, &e_), s, CT_ERR_FORMAT);
}

static void text_fifo_listed(void) {
    write_bytes(path_in("a.txt"), "abcdefgh", 8);
    CHECK(mkfifo(path_in("fifo"), 0600) == 0);
    const char *paths[] = {path_in("a.txt"), path_in("fifo")};  // a.txt is collected first
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 2;
    p.seq_len = 2;
    ct_stream *s = (ct_stream *)1;
    CHECK_FAILS(ct_text_stream_new(&s, &p, &e_), s, CT_ERR_IO);
}

// IDX files of n 2x2 images and m labels (each label = its index).
static void write_idx(int n, int m) {
    uint8_t im[16 + 4 * 16] = {0, 0, 8, 3, 0, 0, 0, (uint8_t)n, 0, 0, 0, 2, 0, 0, 0, 2};
    uint8_t lb[8 + 16] = {0, 0, 8, 1, 0, 0, 0, (uint8_t)m};
    for (int i = 0; i < 4 * n; i++) im[16 + i] = (uint8_t)(i * 7);
    for (int i = 0; i < m; i++) lb[8 + i] = (uint8_t)i;
    write_bytes(path_in("images"), im, 16 + 4 * (size_t)n);
    write_bytes(path_in("labels"), lb, 8 + (size_t)m);
}

static void idx_label_count(void) {
    write_idx(3, 4);  // the labels are read after the images
    ct_idx_params p = ct_idx_default_params();
    p.images_path = path_in("images");
    p.labels_path = path_in("labels");
    ct_stream *s = (ct_stream *)1;
    CHECK_FAILS(ct_idx_stream_new(&s, &p, &e_), s, CT_ERR_FORMAT);
}

static void idx_label_range(void) {
    write_idx(8, 8);
    ct_idx_params p = ct_idx_default_params();
    p.images_path = path_in("images");
    p.labels_path = path_in("labels");
    p.n_classes = 5;  // labels 5..7 are found out of range after both files are read
    ct_stream *s = (ct_stream *)1;
    CHECK_FAILS(ct_idx_stream_new(&s, &p, &e_), s, CT_ERR_FORMAT);
}

static ct_stream *copy_source(void) {
    ct_copy_task t = {11, 3, false, 3, 0};  // examples of 2 * 3 + 2 = T tokens
    ct_stream *s = NULL;
    ct_error err;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    return s;
}

// A finite source with a chain on it: text -> epochs -> shuffle -> truncate.
static ct_stream *finite_chain(void) {
    char text[512];
    for (int i = 0; i < 512; i++) text[i] = (char)('a' + (i * 7) % 26);
    write_bytes(path_in("c.txt"), text, sizeof text);
    const char *paths[] = {path_in("c.txt")};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = 8;
    ct_stream *s = NULL;
    ct_error err;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK_OK(ct_epochs_stream_new(&s, s, true, 1, 0, &err), &err);
    CHECK_OK(ct_shuffle_stream_new(&s, s, 7, 2, &err), &err);
    CHECK_OK(ct_truncate_stream_new(&s, s, 6, &err), &err);
    return s;
}

// Each transform refused on an argument frees the stream it was given.
static void transforms_own_inner(void) {
    ct_stream *s = (ct_stream *)1;
    ct_copy_task bad = {1, 5, false, 3, 0};
    CHECK_FAILS(ct_copy_stream_new(&s, &bad, &e_), s, CT_ERR_ARG);
    CHECK_FAILS(ct_epochs_stream_new(&s, copy_source(), false, 0, 0, &e_), s, CT_ERR_ARG);  // endless
    CHECK_FAILS(ct_epochs_stream_new(&s, finite_chain(), false, 0, -1, &e_), s, CT_ERR_ARG);
    CHECK_FAILS(ct_shuffle_stream_new(&s, finite_chain(), 0, 0, &e_), s, CT_ERR_ARG);
    CHECK_FAILS(ct_truncate_stream_new(&s, copy_source(), 0, &e_), s, CT_ERR_ARG);
    ct_batch_params bp = ct_batch_default_params();
    int64_t descending[] = {8, 4};
    bp.boundaries = descending;
    bp.n_boundaries = 2;
    CHECK_FAILS(ct_batch_stream_new(&s, finite_chain(), &bp, &e_), s, CT_ERR_ARG);
    CHECK_FAILS(ct_prefetch_stream_new(&s, finite_chain(), 0, &e_), s, CT_ERR_ARG);
    ct_error err;
    ct_stream *w = finite_chain();
    CHECK_OK(ct_weights_stream_new(&w, w, 0, &err), &err);
    CHECK_FAILS(ct_prefetch_stream_new(&s, w, 2000, &e_), s, CT_ERR_ARG);
}

// A whole chain, its prefetch thread running ahead, freed in mid-stream.
static void chain_freed_while_prefetching(void) {
    ct_error err;
    ct_stream *s = finite_chain();
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 3;
    bp.bucket_window = 2;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    CHECK_OK(ct_weights_stream_new(&s, s, 0, &err), &err);
    CHECK_OK(ct_prefetch_stream_new(&s, s, 3, &err), &err);
    ct_batch b;
    for (int i = 0; i < 5; i++) CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK_OK(ct_stream_seek(s, 2, &err), &err);
    for (int i = 0; i < 2; i++) CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 3);
    ct_stream_free(s);
}

// ---- comms, optimizers, schedules ------------------------------------------------

static void comms(void) {
    ct_comm *group[4] = {NULL};  // n out of range: out[] is not written
    CHECK_FAILS(ct_comm_local_new(group, 0, &e_), group[0], CT_ERR_ARG);
    CHECK_FAILS(ct_comm_local_new(group, CT_COMM_LOCAL_MAX + 1, &e_), group[0], CT_ERR_ARG);
    ct_error err;
    CHECK_OK(ct_comm_local_new(group, 4, &err), &err);
    for (int i = 3; i >= 0; i--) ct_comm_free(group[i]);  // the group goes with the last handle
    ct_comm_free(ct_comm_single_new());
}

static void optimizers_and_schedules(void) {
    ct_optimizer_free(ct_sgd_new(ct_sgd_default_params()));
    ct_optimizer_free(ct_adam_new(ct_adam_default_params()));
    ct_optimizer_free(ct_momentum_new(ct_momentum_default_params()));
    ct_optimizer_free(ct_rmsprop_new(ct_rmsprop_default_params()));
    ct_optimizer_free(ct_adafactor_new(ct_adafactor_default_params()));
    ct_optimizer_free(ct_sm3_new(ct_sm3_default_params()));
    // (Schedules leave *out as it was on failure, not NULL: reported to
    // their owner; checked here for the status and for leaks.)
    ct_schedule *sch = NULL;
    ct_multifactor_params mp = ct_multifactor_default_params();
    mp.factors = "constant * linear_warmup * no_such_factor";  // found after two factors were parsed
    CHECK_FAILS(ct_schedule_multifactor(&mp, &sch, &e_), sch, CT_ERR_ARG);
    mp.factors = "constant * linear_warmup";
    mp.warmup_steps = 0;
    CHECK_FAILS(ct_schedule_multifactor(&mp, &sch, &e_), sch, CT_ERR_ARG);
    CHECK_FAILS(ct_schedule_warmup(-1, 1.0, &sch, &e_), sch, CT_ERR_ARG);
    ct_error err;
    mp = ct_multifactor_default_params();
    CHECK_OK(ct_schedule_multifactor(&mp, &sch, &err), &err);
    ct_schedule_free(sch);
}

// ---- layers, nets, trainers, the Loop ----------------------------------------------

enum { V = 11, T = 8, B = 4 };

static ct_layer *small_lm(void) {
    ct_transformer_lm_params mp = ct_transformer_lm_default_params();
    mp.vocab_size = V;
    mp.d_model = 16;
    mp.d_ff = 32;
    mp.n_layers = 2;
    mp.n_heads = 2;
    mp.max_len = T;
    mp.dropout = 0.1f;
    return ct_transformer_lm(mp);
}

static ct_layer *small_reformer(void) {
    ct_reformer_lm_params mp = ct_reformer_lm_default_params();
    mp.vocab_size = V;
    mp.d_model = 16;
    mp.d_ff = 32;
    mp.n_layers = 2;
    mp.n_heads = 2;
    mp.max_len = T;
    return ct_reformer_lm(mp);
}

static void batch_sigs(ct_tensor sigs[3], ct_dtype token_dtype) {
    sigs[0] = ct_tensor_2d(token_dtype, B, T, NULL);
    sigs[1] = ct_tensor_2d(CT_DTYPE_I32, B, T, NULL);
    sigs[2] = ct_tensor_2d(CT_DTYPE_F32, B, T, NULL);
}

static void nets(void) {
    ct_layer *model = small_lm();
    ct_tensor in = ct_tensor_2d(CT_DTYPE_I32, B, T, NULL);
    ct_net net;
    ct_error err;
    CHECK_OK(ct_net_init(&net, model, &in, 1, ct_key_from_seed(1), &dev, &err), &err);
    size_t need = dev.current_bytes;
    ct_net_free(&net);
    // The init pass has run over every layer before the slabs are refused.
    dev.limit_bytes = need / 2;
    memset(&net, 0, sizeof net);
    ct_status st = ct_net_init(&net, model, &in, 1, ct_key_from_seed(1), &dev, &err);
    CHECK_MSG(st == CT_ERR_MEMORY, "%s: a net of %zu bytes on a device of %zu: %s", g_case, need, need / 2,
              ct_status_name(st));
    dev.limit_bytes = 0;
    // A bad input found by a layer in the middle of the init pass.
    in = ct_tensor_2d(CT_DTYPE_F32, B, T, NULL);
    memset(&net, 0, sizeof net);
    st = ct_net_init(&net, model, &in, 1, ct_key_from_seed(1), &dev, &err);
    CHECK_MSG(st != CT_OK, "%s: a TransformerLM took f32 tokens", g_case);
    // A layer already in a live net is refused by a second one.
    in = ct_tensor_2d(CT_DTYPE_I32, B, T, NULL);
    CHECK_OK(ct_net_init(&net, model, &in, 1, ct_key_from_seed(1), &dev, &err), &err);
    ct_net other;
    memset(&other, 0, sizeof other);
    ct_layer *wrapped = ct_serial(CT_LAYERS(ct_layer_ref(model), ct_log_softmax()));
    st = ct_net_init(&other, wrapped, &in, 1, ct_key_from_seed(1), &dev, &err);
    CHECK_MSG(st == CT_ERR_STATE, "%s: a layer of a live net went into a second one: %s", g_case, ct_status_name(st));
    ct_net_free(&net);
    ct_layer_free(wrapped);
    ct_layer_free(model);
}

// Builds a trainer of the given kind on a device of `limit` bytes (0: none).
// Returns its status; frees whatever it built.
static ct_status trainer_at(bool memory_efficient, bool reformer, size_t limit, ct_dtype token_dtype,
                            size_t *peak) {
    ct_layer *model = reformer ? small_reformer() : small_lm(), *loss = ct_weighted_category_cross_entropy();
    ct_tensor sigs[3];
    batch_sigs(sigs, token_dtype);
    ct_trainer_options o = ct_trainer_default_options();
    o.memory_efficient = memory_efficient;
    dev = ct_device_cpu();
    dev.limit_bytes = limit;
    ct_trainer *tr = (ct_trainer *)1;
    ct_error err;
    ct_error_clear(&err);
    ct_status st = ct_trainer_new(&tr, model, loss, sigs, 3, ct_adam_new(ct_adam_default_params()),
                                  ct_key_from_seed(2), &dev, &o, &err);
    if (st == CT_OK) {
        // The memory-efficient trainer takes its device memory in the first
        // step: a device too small fails there, and the trainer is freed after.
        int32_t tokens[B * T] = {0};
        float weights[B * T];
        for (int i = 0; i < B * T; i++) weights[i] = 1.0f;
        ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, B, T, tokens), ct_tensor_2d(CT_DTYPE_I32, B, T, tokens),
                              ct_tensor_2d(CT_DTYPE_F32, B, T, weights)};
        ct_step_stats stats;
        st = ct_trainer_one_step(tr, batch, ct_key_from_seed(3), 1, 1e-3f, &stats, &err);
        ct_trainer_free(tr);
    } else {
        CHECK_MSG(tr == NULL, "%s: a failed ct_trainer_new left *out set (%s)", g_case, err.msg);
    }
    if (peak) *peak = dev.peak_bytes;
    ct_layer_free(model);  // the trainer's references are its own
    ct_layer_free(loss);
    return st;
}

// Fails the trainer at several points of its construction and first step:
// device limits at fractions of what a successful build and step peak at,
// and a bad batch.
static void trainer_sweep(bool memory_efficient, bool reformer) {
    size_t peak = 0;
    CHECK(trainer_at(memory_efficient, reformer, 0, CT_DTYPE_I32, &peak) == CT_OK);
    int failed = 0;
    const double fractions[] = {0.01, 0.2, 0.4, 0.6, 0.8, 0.9, 0.97, 0.995};
    for (size_t i = 0; i < sizeof fractions / sizeof *fractions; i++) {
        size_t limit = (size_t)((double)peak * fractions[i]) + 1;
        ct_status st = trainer_at(memory_efficient, reformer, limit, CT_DTYPE_I32, NULL);
        CHECK_MSG(st == CT_OK || st == CT_ERR_MEMORY, "%s: limit %zu: %s", g_case, limit, ct_status_name(st));
        failed += st != CT_OK;
    }
    CHECK_MSG(failed >= 3, "%s: only %d of the smaller devices made the trainer fail", g_case, failed);
    CHECK(trainer_at(memory_efficient, reformer, 0, CT_DTYPE_F32, NULL) != CT_OK);
}
static void standard_trainer(void) { trainer_sweep(false, false); }
static void memory_efficient_trainer(void) { trainer_sweep(true, true); }

// A Loop over a copy-task stream; output_dir and the device limit vary.
static ct_status loop_at(const char *output_dir, size_t limit, bool memory_efficient) {
    ct_error err;
    ct_stream *train = copy_source(), *eval = copy_source();
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = B;
    CHECK_OK(ct_batch_stream_new(&train, train, &bp, &err), &err);
    CHECK_OK(ct_batch_stream_new(&eval, eval, &bp, &err), &err);
    ct_layer *model = memory_efficient ? small_reformer() : small_lm(), *loss = ct_weighted_category_cross_entropy();
    ct_layer *acc = ct_weighted_category_accuracy(), *eval_loss = ct_weighted_category_cross_entropy();
    ct_schedule *sch;
    CHECK_OK(ct_schedule_warmup(5, 1e-3, &sch, &err), &err);
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), sch, "loss", 0};
    ct_eval_task ev = {.stream = eval, .n_metrics = 2, .n_batches = 1};
    ev.metrics[0] = eval_loss;
    ev.metrics[1] = acc;
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = output_dir;
    o.device = &dev;
    o.trainer.memory_efficient = memory_efficient;
    dev = ct_device_cpu();
    dev.limit_bytes = limit;
    ct_loop *loop = (ct_loop *)1;
    ct_status st = ct_loop_new(&loop, model, &task, 1, &ev, &o, &err);
    if (st == CT_OK) {
        st = ct_loop_run(loop, 2, &err);  // a device too small may fail here, in the first step
        if (st != CT_OK && getenv("OWNERSHIP_VERBOSE")) fprintf(stderr, "  run: %s\n", err.msg);
        ct_loop_free(loop);
    } else {
        CHECK_MSG(loop == NULL, "%s: a failed ct_loop_new left *out set (%s)", g_case, err.msg);
        if (getenv("OWNERSHIP_VERBOSE")) fprintf(stderr, "  loop_at(%s, %zu): %s\n", output_dir, limit, err.msg);
    }
    ct_stream_free(train);  // streams and schedules are borrowed
    ct_stream_free(eval);
    ct_schedule_free(sch);
    ct_layer_free(model);
    ct_layer_free(loss);
    ct_layer_free(acc);
    ct_layer_free(eval_loss);
    return st;
}

static void loops(void) {
    // An output directory that is a file: found after the trainer is built.
    write_bytes(path_in("file"), "x", 1);
    CHECK(loop_at(path_in("file"), 0, false) != CT_OK);
    CHECK(loop_at(path_in("file/sub"), 0, true) != CT_OK);
    // Devices too small, for either trainer.
    CHECK(loop_at(NULL, 4096, false) == CT_ERR_MEMORY);
    CHECK(loop_at(NULL, 4096, true) == CT_ERR_MEMORY);
    // And a Loop that runs, checkpoints and is freed.
    CHECK(loop_at(path_in("run"), 0, false) == CT_OK);
    CHECK(loop_at(path_in("run2"), 0, true) == CT_OK);
}

// Resuming a checkpoint of another model: found after the trainer is built,
// while the checkpoint is read.
static void loop_resumes_wrong_model(void) {
    CHECK(loop_at(path_in("run"), 0, false) == CT_OK);
    CHECK(loop_at(path_in("run"), 0, true) != CT_OK);
}

// ---- checkpoints, safetensors, summaries ------------------------------------------

static void checkpoints(void) {
    write_bytes(path_in("file"), "x", 1);
    ct_checkpoint_writer *w = (ct_checkpoint_writer *)1;
    CHECK_FAILS(ct_checkpoint_writer_begin(&w, path_in("file/out"), "model_1", NULL, &e_), w, CT_ERR_IO);
    w = (ct_checkpoint_writer *)1;
    CHECK_FAILS(ct_checkpoint_writer_begin(&w, path_in("out"), "a/b", NULL, &e_), w, CT_ERR_ARG);
    float x[6] = {1, 2, 3, 4, 5, 6};
    ct_named_tensor t = {"w", ct_tensor_2d(CT_DTYPE_F32, 2, 3, x)};
    ct_error err;
    // A bad file name after the temporary directory exists, then abort.
    CHECK_OK(ct_checkpoint_writer_begin(&w, path_in("out"), "model_1", NULL, &err), &err);
    CHECK(ct_checkpoint_writer_add_tensors(w, "../x.safetensors", &t, 1, NULL, 0, &err) != CT_OK);
    ct_checkpoint_writer_abort(w);
    // A commit that fails (the directory is gone) frees the writer.
    CHECK_OK(ct_checkpoint_writer_begin(&w, path_in("out"), "model_1", NULL, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(w, "weights.safetensors", &t, 1, NULL, 0, &err), &err);
    CHECK_OK(ct_fs_remove_tree(path_in("out"), &err), &err);
    CHECK(ct_checkpoint_writer_commit(w, &err) != CT_OK);
    // A good checkpoint, then one file of it damaged: open fails after the manifest.
    CHECK_OK(ct_checkpoint_writer_begin(&w, path_in("out"), "model_2", NULL, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(w, "weights.safetensors", &t, 1, NULL, 0, &err), &err);
    CHECK_OK(ct_checkpoint_writer_set_state(w, "{\"step\": 2}", &err), &err);
    CHECK_OK(ct_checkpoint_writer_commit(w, &err), &err);
    ct_checkpoint *c = NULL;
    CHECK_OK(ct_checkpoint_open(&c, path_in("out"), "model_2", &err), &err);
    ct_checkpoint_close(c);
    CHECK(truncate(path_in("out/model_2/weights.safetensors"), 40) == 0);
    c = (ct_checkpoint *)1;
    CHECK_FAILS(ct_checkpoint_open(&c, path_in("out"), "model_2", &e_), c, CT_ERR_FORMAT);
}

static void safetensors(void) {
    float x[6] = {1, 2, 3, 4, 5, 6};
    ct_named_tensor t[2] = {{"a", ct_tensor_2d(CT_DTYPE_F32, 2, 3, x)}, {"b", ct_tensor_1d(CT_DTYPE_F32, 6, x)}};
    ct_kv meta = {"k", "v"};
    ct_error err;
    CHECK_OK(ct_safetensors_write(path_in("a.safetensors"), t, 2, &meta, 1, &err), &err);
    ct_safetensors *st = NULL;
    CHECK_OK(ct_safetensors_open(&st, path_in("a.safetensors"), &err), &err);
    ct_safetensors_close(st);
    // Cut inside the data: the header (names, metadata) is parsed before the size check.
    FILE *f = fopen(path_in("a.safetensors"), "rb");
    char buf[4096];
    size_t n = f ? fread(buf, 1, sizeof buf, f) : 0;
    if (f) fclose(f);
    write_bytes(path_in("cut.safetensors"), buf, n - 4);
    st = (ct_safetensors *)1;
    CHECK_FAILS(ct_safetensors_open(&st, path_in("cut.safetensors"), &e_), st, CT_ERR_FORMAT);
    ct_status ws = ct_safetensors_write(path_in("no/dir/x.safetensors"), t, 2, NULL, 0, &err);
    CHECK_MSG(ws == CT_ERR_IO, "%s: a write into a missing directory: %s", g_case, ct_status_name(ws));
}

static void summaries(void) {
    write_bytes(path_in("file"), "x", 1);
    ct_summary *s = (ct_summary *)1;
    CHECK_FAILS(ct_summary_open(&s, path_in("file"), 0, &e_), s, CT_ERR_IO);
    ct_metrics_writer *m = (ct_metrics_writer *)1;
    CHECK_FAILS(ct_metrics_writer_open(&m, path_in("file/metrics.jsonl"), &e_), m, CT_ERR_IO);
    ct_tb_writer *tb = (ct_tb_writer *)1;
    CHECK_FAILS(ct_tb_writer_open(&tb, path_in("file"), &e_), tb, CT_ERR_IO);
    ct_error err;
    CHECK_OK(ct_summary_open(&s, path_in("run"), 0, &err), &err);
    CHECK_OK(ct_summary_scalar(s, CT_SUMMARY_TRAIN, 1, "metrics/loss", 2.5, &err), &err);
    CHECK_OK(ct_summary_close(s, &err), &err);
    // Reopened for a resume at step 0: the files are read and cut back.
    CHECK_OK(ct_summary_open(&s, path_in("run"), 0, &err), &err);
    CHECK_OK(ct_summary_close(s, &err), &err);
}

int main(void) {
    ct_log_set_level(CT_LOG_ERROR);
    run_case("the tracker sees a leak and a double free", tracker_sees_leaks_and_double_frees);
    run_case("text: too few tokens (after collecting and mapping)", text_too_short);
    run_case("text: an empty eval split (after indexing the chunks)", text_empty_split);
    run_case("tokens: half a token in the second file (after mapping the first)", tokens_partial_token);
    run_case("text: a fifo among the paths (after collecting the first)", text_fifo_listed);
    run_case("idx: label count (after reading the images)", idx_label_count);
    run_case("idx: label range (after reading both files)", idx_label_range);
    run_case("transforms: refused arguments free the chain they were given", transforms_own_inner);
    run_case("a chain freed while its prefetch thread runs", chain_freed_while_prefetching);
    run_case("comms: local groups, single", comms);
    run_case("optimizers and schedules", optimizers_and_schedules);
    run_case("nets: slabs too big, a bad input, a layer in two nets", nets);
    run_case("standard trainer: devices too small at 8 points, bad batch", standard_trainer);
    run_case("memory-efficient trainer: devices too small at 8 points, bad batch", memory_efficient_trainer);
    run_case("Loop: output_dir a file, devices too small, runs of both trainers", loops);
    run_case("Loop: resuming another model's checkpoint", loop_resumes_wrong_model);
    run_case("checkpoints: bad dir, bad name, failed commit, damaged file", checkpoints);
    run_case("safetensors: cut file, missing directory", safetensors);
    run_case("summaries: output_dir a file; open, write, resume", summaries);
    return check_summary("test_ownership");
}
