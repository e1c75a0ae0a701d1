// The input builders the registry's input entries name: each reads its
// parameters from the config and chains the data streams of src/data into an
// endless train stream and an endless eval stream of batches.
//
//   synthetic   source(train seed) -> batch(B, padded to the longest length)
//               source(eval seed)  -> batch(B, padded to the longest length)
//   files       source(train split) -> epochs(forever, shuffled) -> batch(B)
//               (or epochs in order -> shuffle buffer(K) -> batch(B))
//               source(eval split)  -> epochs(forever, in order) -> batch(B)
//
// The train and eval seeds are drawn from the run's seed (so the two differ
// and both follow the seed); a file split depends only on split_seed.
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <zlib.h>

#include "config/internal.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/data/stream.h"
#include "ctrax/data/synthetic.h"

#define MAX_PATHS 4096

enum { SEED_TRAIN = 1, SEED_EVAL = 2 };

// The seed of one stream (SEED_TRAIN, SEED_EVAL) of a run with this seed.
static uint64_t stream_seed(uint64_t seed, uint32_t which) {
    ct_key k = ct_key_fold_in(ct_key_from_seed(seed), which);
    return ((uint64_t)k.w[0] << 32) | k.w[1];
}

// "file:line:col: " of a value written in a config, "" for a default (a
// registry default is parsed as gin, at "<default>:1:1").
static void value_where(const ct_config_value *v, char *buf, size_t len) {
    if (v->line > 0 && strcmp(v->file, "<default>")) snprintf(buf, len, "%s:%d:%d: ", v->file, v->line, v->col);
    else buf[0] = '\0';
}

// An int parameter (the registry's range keeps it within a C int).
static ct_status get_int(ct_config *cfg, const char *name, const char *param, int *out, ct_error *err) {
    const ct_config_value *v;
    CT_TRY(cfg_query_default(cfg, name, param, &v, err));
    *out = (int)v->i;
    return CT_OK;
}

static ct_status get_bool(ct_config *cfg, const char *name, const char *param, bool *out, ct_error *err) {
    const ct_config_value *v;
    CT_TRY(cfg_query_default(cfg, name, param, &v, err));
    *out = v->b;
    return CT_OK;
}

// A Trax parameter ctrax takes only at its default, bound to another value:
// "file:line:col: name.param = value is not supported by ctrax: why".
static ct_status not_supported(ct_config *cfg, const char *name, const char *param, const ct_config_value *v,
                               const char *why, ct_error *err) {
    char where[300];
    cfg_where(cfg, name, param, where, sizeof where);
    char *text = ct_config_value_to_gin(v);
    ct_status st =
        ct_error_set(err, CT_ERR_ARG, "%s%s.%s = %.60s is not supported by ctrax: %s", where, name, param, text, why);
    ct_free(text);
    return st;
}

// A path a config names, which must exist: else an error naming the file and
// the config line (what a stream would say has no config line).
static ct_status check_path(const ct_config_value *v, const char *name, const char *what, ct_error *err) {
    struct stat st;
    if (stat(v->s, &st) == 0) return CT_OK;
    int e = errno;
    char where[300];
    value_where(v, where, sizeof where);
    return ct_error_set(err, CT_ERR_IO, "%s%s.%s: '%s': %s", where, name, what, v->s, strerror(e));
}

static ct_status batch(ct_stream **s, int batch_size, int64_t length, ct_error *err) {
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = batch_size;
    bp.length = length;
    return ct_batch_stream_new(s, *s, &bp, err);
}

static int64_t round_up(int64_t n, int multiple) { return (n + multiple - 1) / multiple * multiple; }

// ---- synthetic ---------------------------------------------------------------------------

ct_status cfg_build_copy_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed, ct_stream **train,
                                ct_stream **eval, ct_error *err) {
    int vocab_size, train_length, train_min, eval_min, eval_max, pad;
    bool reverse;
    CT_TRY(get_int(cfg, name, "vocab_size", &vocab_size, err));
    CT_TRY(get_int(cfg, name, "train_length", &train_length, err));
    CT_TRY(get_int(cfg, name, "train_min_length", &train_min, err));
    CT_TRY(get_int(cfg, name, "eval_min_length", &eval_min, err));
    CT_TRY(get_int(cfg, name, "eval_max_length", &eval_max, err));
    CT_TRY(get_bool(cfg, name, "reverse", &reverse, err));
    CT_TRY(get_int(cfg, name, "pad_to_multiple", &pad, err));
    if (train_min >= train_length) {
        char where[300];
        cfg_where(cfg, name, "train_min_length", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG, "%s%s: train_min_length %d must be < train_length %d", where, name,
                            train_min, train_length);
    }
    if (eval_max <= eval_min) {
        char where[300];
        cfg_where(cfg, name, "eval_max_length", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s: eval_max_length %d must be > eval_min_length %d (eval w has eval_min_length.."
                            "eval_max_length-1 tokens, as in Trax)",
                            where, name, eval_max, eval_min);
    }
    // As Trax: training w has train_min_length (1 in Trax)..train_length-1
    // tokens, eval w eval_min_length..eval_max_length-1.
    ct_copy_task tt = {.vocab_size = vocab_size, .length = train_length - 1, .reverse = reverse,
                       .seed = stream_seed(seed, SEED_TRAIN), .min_length = train_min};
    ct_copy_task et = {.vocab_size = vocab_size, .length = eval_max - 1, .reverse = reverse,
                       .seed = stream_seed(seed, SEED_EVAL), .min_length = eval_min};
    ct_status st = ct_copy_stream_new(train, &tt, err);
    if (st == CT_OK) st = batch(train, batch_size, round_up(ct_copy_task_seq_len(&tt), pad), err);
    if (st == CT_OK) st = ct_copy_stream_new(eval, &et, err);
    if (st == CT_OK) st = batch(eval, batch_size, round_up(ct_copy_task_seq_len(&et), pad), err);
    return st == CT_OK ? CT_OK : ct_error_prefix(err, "%s", name);
}

ct_status cfg_build_addition_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed,
                                    ct_stream **train, ct_stream **eval, ct_error *err) {
    int vocab_size, train_length, eval_min, eval_max, pad;
    const ct_config_value *encdec;
    CT_TRY(cfg_query_default(cfg, name, "encdec", &encdec, err));
    if (encdec->b)
        return not_supported(cfg, name, "encdec", encdec,
                             "its (x + y, sum) pairs feed an encoder-decoder (Trax's Reformer2), and ctrax's models "
                             "are decoder-only: leave it False (one '<S> x + y <S> sum' sequence, loss on the sum)",
                             err);
    CT_TRY(get_int(cfg, name, "vocab_size", &vocab_size, err));
    CT_TRY(get_int(cfg, name, "train_length", &train_length, err));
    CT_TRY(get_int(cfg, name, "eval_min_length", &eval_min, err));
    CT_TRY(get_int(cfg, name, "eval_max_length", &eval_max, err));
    CT_TRY(get_int(cfg, name, "pad_to_multiple", &pad, err));
    if (eval_max < eval_min) {
        char where[300];
        cfg_where(cfg, name, "eval_max_length", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG, "%s%s: eval_max_length %d must be >= eval_min_length %d", where, name,
                            eval_max, eval_min);
    }
    // As Trax: training lengths 3..train_length.
    ct_addition_task tt = {.vocab_size = vocab_size, .min_length = 3, .max_length = train_length,
                           .seed = stream_seed(seed, SEED_TRAIN)};
    ct_addition_task et = {.vocab_size = vocab_size, .min_length = eval_min, .max_length = eval_max,
                           .seed = stream_seed(seed, SEED_EVAL)};
    ct_status st = ct_addition_stream_new(train, &tt, err);
    if (st == CT_OK) st = batch(train, batch_size, round_up(2 * (int64_t)train_length + 1, pad), err);
    if (st == CT_OK) st = ct_addition_stream_new(eval, &et, err);
    if (st == CT_OK) st = batch(eval, batch_size, round_up(2 * (int64_t)eval_max + 1, pad), err);
    return st == CT_OK ? CT_OK : ct_error_prefix(err, "%s", name);
}

// ---- example lengths (for the memory budget) ---------------------------------------------------

// Each length below is the one the builder above gives its train batches
// (eval false) or its eval batches (eval true; the synthetic ones pad every
// batch to the longest example).
ct_status cfg_inputs_length(ct_config *cfg, const char *name, bool eval, int64_t *length, const char **param,
                            ct_error *err) {
    *length = 0;
    *param = NULL;
    const char *slash = strrchr(name, '/');  // "scope/Name"
    const char *base = slash ? slash + 1 : name;
    char why[256];
    const cfg_def *d = cfg_lookup(base, why, sizeof why);
    if (!d || d->kind != CFG_INPUT) return CT_OK;  // the builder says what is wrong
    int longest, pad;
    bool copy = d->build_inputs == cfg_build_copy_inputs;
    if (copy || d->build_inputs == cfg_build_addition_inputs) {
        *param = eval ? "eval_max_length" : "train_length";
        CT_TRY(get_int(cfg, name, *param, &longest, err));
        CT_TRY(get_int(cfg, name, "pad_to_multiple", &pad, err));
        ct_copy_task t = {.length = longest - 1};  // w below the length
        *length = round_up(copy ? ct_copy_task_seq_len(&t) : 2 * (int64_t)longest + 1, pad);
    } else if (d->build_inputs == cfg_build_text_inputs || d->build_inputs == cfg_build_token_inputs) {
        int seq_len;
        CT_TRY(get_int(cfg, name, "seq_len", &seq_len, err));
        *length = seq_len;
        *param = "seq_len";
    }
    return CT_OK;
}

// ---- files -----------------------------------------------------------------------------------

// The train pipeline over a finite source: shuffled epochs, or epochs in
// order through a shuffle buffer.
static ct_status train_pipeline(ct_stream **s, bool shuffle, int shuffle_buffer, uint64_t seed, int batch_size,
                                ct_error *err) {
    uint64_t ts = stream_seed(seed, SEED_TRAIN);
    CT_TRY(ct_epochs_stream_new(s, *s, shuffle && shuffle_buffer == 0, ts, 0, err));
    if (shuffle && shuffle_buffer > 0) CT_TRY(ct_shuffle_stream_new(s, *s, shuffle_buffer, ts, err));
    return batch(s, batch_size, 0, err);
}

static ct_status eval_pipeline(ct_stream **s, int batch_size, ct_error *err) {
    CT_TRY(ct_epochs_stream_new(s, *s, false, 0, 0, err));
    return batch(s, batch_size, 0, err);
}

// TextInputs (text) and TokenInputs.
static ct_status corpus_inputs(ct_config *cfg, const char *name, bool text, int batch_size, uint64_t seed,
                               ct_stream **train, ct_stream **eval, ct_error *err) {
    const ct_config_value *paths, *frac, *split_seed, *vocab_size = NULL;
    int seq_len, shuffle_buffer, token_bytes = 1;
    bool shifted;
    CT_TRY(cfg_query_default(cfg, name, "paths", &paths, err));
    CT_TRY(get_int(cfg, name, "seq_len", &seq_len, err));
    CT_TRY(cfg_query_default(cfg, name, "eval_fraction", &frac, err));
    CT_TRY(cfg_query_default(cfg, name, "split_seed", &split_seed, err));
    CT_TRY(get_int(cfg, name, "shuffle_buffer", &shuffle_buffer, err));
    CT_TRY(get_bool(cfg, name, "shifted", &shifted, err));
    if (!text) {
        CT_TRY(get_int(cfg, name, "token_bytes", &token_bytes, err));
        CT_TRY(cfg_query_default(cfg, name, "vocab_size", &vocab_size, err));
        if (token_bytes != 2 && token_bytes != 4) {
            char where[300];
            cfg_where(cfg, name, "token_bytes", where, sizeof where);
            return ct_error_set(err, CT_ERR_ARG, "%s%s.token_bytes must be 2 (uint16) or 4 (uint32), got %d", where,
                                name, token_bytes);
        }
    }
    char where[300];
    value_where(paths, where, sizeof where);
    if (paths->n < 1 || paths->n > MAX_PATHS)
        return ct_error_set(err, CT_ERR_ARG, "%s%s.paths must list 1 to %d files or directories, got %d", where, name,
                            MAX_PATHS, paths->n);
    const char **list = ct_malloc((size_t)paths->n * sizeof *list);
    ct_status st = CT_OK;
    for (int i = 0; i < paths->n && st == CT_OK; i++) {
        const ct_config_value *it = &paths->items[i];
        if (it->kind != CT_CONFIG_STRING) {
            char iw[300];
            value_where(it, iw, sizeof iw);
            char *t = ct_config_value_to_gin(it);
            st = ct_error_set(err, CT_ERR_ARG, "%s%s.paths[%d] must be a string (a file or directory), got %.60s", iw,
                              name, i, t);
            ct_free(t);
            break;
        }
        char what[32];
        snprintf(what, sizeof what, "paths[%d]", i);
        st = check_path(it, name, what, err);
        list[i] = it->s;
    }
    if (st == CT_OK) {
        ct_corpus_params p = ct_corpus_default_params();
        p.paths = list;
        p.n_paths = paths->n;
        p.seq_len = seq_len;
        p.shifted = shifted;
        p.eval_fraction = frac->f;
        p.split_seed = (uint64_t)split_seed->i;
        p.token_bytes = token_bytes;
        p.vocab_size = vocab_size ? vocab_size->i : 0;
        char vocab_note[400];
        if (!text) {  // a token past vocab_size is met while training: its error names the setting
            cfg_setting_text(cfg, name, "vocab_size", NULL, vocab_note, sizeof vocab_note);
            p.vocab_size_source = vocab_note;
        }
        p.split = CT_DATA_SPLIT_TRAIN;
        bool empty_split = false;
        p.empty_split = &empty_split;
        // Each error names the settings behind it: the files with seq_len
        // (too few or too many examples; for token files with token_bytes
        // too, which also decides whether a file's size fits) or with
        // eval_fraction (an empty train split), the shuffle buffer, the eval split.
        char note[800], frac[400];
        cfg_setting_text(cfg, name, "seq_len", NULL, note, sizeof note);
        if (!text) {
            size_t used = strlen(note);
            snprintf(note + used, sizeof note - used, ", ");
            used += strlen(note + used);
            cfg_setting_text(cfg, name, "token_bytes", NULL, note + used, sizeof note - used);
        }
        cfg_setting_text(cfg, name, "eval_fraction", NULL, frac, sizeof frac);
        st = text ? ct_text_stream_new(train, &p, err) : ct_token_stream_new(train, &p, err);
        if (st != CT_OK) ct_error_prefix(err, "%s%s.paths (with %s)", where, name, empty_split ? frac : note);
        if (st == CT_OK) {
            st = train_pipeline(train, true, shuffle_buffer, seed, batch_size, err);
            if (st == CT_ERR_MEMORY) {  // the shuffle buffer
                char sw[300];
                cfg_where(cfg, name, "shuffle_buffer", sw, sizeof sw);
                ct_error_prefix(err, "%s%s.shuffle_buffer = %d", sw, name, shuffle_buffer);
            } else if (st != CT_OK) {
                ct_error_prefix(err, "%s%s", where, name);
            }
        }
        if (st == CT_OK && p.eval_fraction > 0) {
            p.split = CT_DATA_SPLIT_EVAL;
            st = text ? ct_text_stream_new(eval, &p, err) : ct_token_stream_new(eval, &p, err);
            if (st == CT_OK) st = eval_pipeline(eval, batch_size, err);
            if (st != CT_OK) ct_error_prefix(err, "%s%s.paths (with %s)", where, name, frac);
        }
    }
    ct_free(list);
    return st;
}

ct_status cfg_build_text_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed, ct_stream **train,
                                ct_stream **eval, ct_error *err) {
    return corpus_inputs(cfg, name, true, batch_size, seed, train, eval, err);
}

ct_status cfg_build_token_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed,
                                 ct_stream **train, ct_stream **eval, ct_error *err) {
    return corpus_inputs(cfg, name, false, batch_size, seed, train, eval, err);
}

// One IDX stream from the images and labels parameters named.
static ct_status idx_source(ct_config *cfg, const char *name, const char *images, const char *labels, int n_classes,
                            ct_stream **out, ct_error *err) {
    const ct_config_value *iv, *lv;
    CT_TRY(cfg_query_default(cfg, name, images, &iv, err));
    CT_TRY(cfg_query_default(cfg, name, labels, &lv, err));
    CT_TRY(check_path(iv, name, images, err));
    CT_TRY(check_path(lv, name, labels, err));
    ct_idx_params p = ct_idx_default_params();
    p.images_path = iv->s;
    p.labels_path = lv->s;
    p.n_classes = n_classes;
    bool about_labels = false;
    p.labels_failed = &about_labels;
    if (ct_idx_stream_new(out, &p, err) == CT_OK) return CT_OK;
    char where[300];
    value_where(about_labels ? lv : iv, where, sizeof where);
    return ct_error_prefix(err, "%s%s.%s", where, name, about_labels ? labels : images);
}

ct_status cfg_build_idx_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed, ct_stream **train,
                               ct_stream **eval, ct_error *err) {
    int n_classes;
    bool shuffle;
    CT_TRY(get_int(cfg, name, "n_classes", &n_classes, err));
    CT_TRY(get_bool(cfg, name, "shuffle", &shuffle, err));
    CT_TRY(idx_source(cfg, name, "train_images", "train_labels", n_classes, train, err));
    CT_TRY(train_pipeline(train, shuffle, 0, seed, batch_size, err));
    CT_TRY(idx_source(cfg, name, "eval_images", "eval_labels", n_classes, eval, err));
    return eval_pipeline(eval, batch_size, err);
}

// ---- Trax's batcher over data_streams ------------------------------------------------------
//
// Trax's default inputs, batcher(data_streams=@data_streams), read a TFDS
// dataset by name. ctrax has no TFDS: the names it has are the ones whose
// files this machine can hold in a standard format, read from data_dir:
//   'mnist', 'fashion_mnist'  the four IDX files (MNIST's names, .gz or
//                             plain): train-images-idx3-ubyte,
//                             train-labels-idx1-ubyte, t10k-images-idx3-ubyte,
//                             t10k-labels-idx1-ubyte (Fashion-MNIST's are
//                             in the same format under the same names).
// Any other name is an error that says so (with train.inputs bound, Trax
// never calls batcher and ctrax never reads data_streams: its bindings are
// said to be unread, as every unread binding is).

static const char *const idx_names[] = {"mnist", "fashion_mnist"};
static const char *const idx_files[4] = {"train-images-idx3-ubyte", "train-labels-idx1-ubyte",
                                         "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

// data_dir/base or data_dir/base.gz, whichever exists, into out.
static ct_status idx_file(const ct_config_value *dir, const char *streams, const char *base, char *out, size_t len,
                          ct_error *err) {
    struct stat st;
    snprintf(out, len, "%s/%s", dir->s, base);
    if (stat(out, &st) == 0) return CT_OK;
    snprintf(out, len, "%s/%s.gz", dir->s, base);
    if (stat(out, &st) == 0) return CT_OK;
    char where[300];
    value_where(dir, where, sizeof where);
    return ct_error_set(err, CT_ERR_IO, "%s%s.data_dir = '%s' holds no %s or %s.gz (MNIST's IDX file names)", where,
                        streams, dir->s, base, base);
}

// One IDX stream of data_dir's images and labels files.
static ct_status idx_pair(const char *images, const char *labels, ct_stream **out, ct_error *err) {
    ct_idx_params p = ct_idx_default_params();
    p.images_path = images;
    p.labels_path = labels;
    return ct_idx_stream_new(out, &p, err);
}

// Trax's batcher and data_streams parameters for variable-length TFDS
// examples, on ctrax's IDX data (one shape): those that only shape Trax's
// length buckets have no effect (read, so they are not reported unread);
// those that would change the batches or their weights are refused unless
// None.
static ct_status batcher_trax_params(ct_config *cfg, const char *name, const char *streams, ct_error *err) {
    static const char *const no_effect[] = {"bucket_length", "max_eval_length", "buckets_include_inputs_in_length",
                                            "strict_pad_on_len"};
    const ct_config_value *v;
    for (size_t i = 0; i < sizeof no_effect / sizeof *no_effect; i++)
        CT_TRY(cfg_query_default(cfg, name, no_effect[i], &v, err));
    static const struct {
        bool streams;  // a data_streams parameter (else batcher's)
        const char *param, *why;
    } only_none[] = {
        {false, "buckets", "explicit buckets give each length its own batch size; ctrax batches every step alike"},
        {false, "batch_shuffle_size", "ctrax shuffles the examples of each epoch, not batches"},
        {false, "id_to_mask", "Trax would give targets equal to it weight 0; ctrax's batcher weights every example 1"},
        {true, "input_name", "it names a TFDS feature; ctrax's IDX data are images and labels"},
        {true, "target_name", "it names a TFDS feature; ctrax's IDX data are images and labels"},
    };
    for (size_t i = 0; i < sizeof only_none / sizeof *only_none; i++) {
        const char *holder = only_none[i].streams ? streams : name;
        CT_TRY(cfg_query_default(cfg, holder, only_none[i].param, &v, err));
        if (v->kind != CT_CONFIG_NONE) return not_supported(cfg, holder, only_none[i].param, v, only_none[i].why, err);
    }
    return CT_OK;
}

ct_status cfg_build_batcher_inputs(ct_config *cfg, const char *name, int batch_size, uint64_t seed,
                                   ct_stream **train, ct_stream **eval, ct_error *err) {
    const ct_config_value *ref, *dataset, *dir, *holdout, *shuffle_size, *variable;
    int64_t eval_batch_size;
    const char *eval_param;
    CT_TRY(cfg_query_default(cfg, name, "data_streams", &ref, err));
    CT_TRY(cfg_inputs_eval_batch(cfg, name, &eval_batch_size, &eval_param, err));
    CT_TRY(cfg_query_default(cfg, name, "variable_shapes", &variable, err));  // fixed-shape data: no effect
    const char *slash = ref->kind == CT_CONFIG_REFERENCE ? strrchr(ref->s, '/') : NULL;
    const char *base = ref->kind == CT_CONFIG_REFERENCE ? (slash ? slash + 1 : ref->s) : "";
    if (strcmp(base, "data_streams") || ref->call) {
        char where[300];
        value_where(ref, where, sizeof where);
        char *text = ct_config_value_to_gin(ref);
        ct_status st = ct_error_set(err, CT_ERR_ARG,
                                    "%s%s.data_streams = %.60s: ctrax's batcher reads @data_streams (as Trax's "
                                    "configs write it, with no call)",
                                    where, name, text);
        ct_free(text);
        return st;
    }
    const char *streams = cfg_scoped_ref(cfg, name, ref->s);  // batcher calls it: in its scope
    CT_TRY(cfg_query_default(cfg, streams, "dataset_name", &dataset, err));
    CT_TRY(cfg_query_default(cfg, streams, "data_dir", &dir, err));
    CT_TRY(cfg_query_default(cfg, streams, "eval_holdout_size", &holdout, err));
    CT_TRY(cfg_query_default(cfg, streams, "shuffle_buffer_size", &shuffle_size, err));  // no effect
    char where[300];
    value_where(dataset, where, sizeof where);
    bool idx = false;
    for (size_t i = 0; dataset->kind == CT_CONFIG_STRING && i < sizeof idx_names / sizeof *idx_names; i++)
        idx = idx || !strcmp(dataset->s, idx_names[i]);
    if (!idx) {
        char *text = ct_config_value_to_gin(dataset);
        ct_status st = ct_error_set(
            err, CT_ERR_ARG,
            "%s%s.dataset_name = %.80s: ctrax reads no TFDS; the datasets it has on local files are 'mnist' and "
            "'fashion_mnist' (IDX files in data_dir); for text or token files bind train.inputs = @TextInputs or "
            "@TokenInputs, for Trax's synthetic tasks @sequence_copy_inputs or @addition_inputs",
            where, streams, text);
        ct_free(text);
        return st;
    }
    CT_TRY(batcher_trax_params(cfg, name, streams, err));
    if (holdout->i != 0) {
        char hw[300];
        value_where(holdout, hw, sizeof hw);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.eval_holdout_size = %lld is not supported for '%s': ctrax evaluates on its test "
                            "files (t10k-*), as Trax does with no holdout",
                            hw, streams, (long long)holdout->i, dataset->s);
    }
    if (dir->kind != CT_CONFIG_STRING) {
        char dw[300];
        value_where(dir, dw, sizeof dw);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.data_dir = None: ctrax reads '%s' from local IDX files; set data_dir to the "
                            "directory holding %s, %s, %s and %s (.gz or plain), e.g. --set \"%s.data_dir='DIR'\"",
                            dw, streams, dataset->s, idx_files[0], idx_files[1], idx_files[2], idx_files[3], streams);
    }
    char paths[4][4096 + 64];
    for (int i = 0; i < 4; i++) CT_TRY(idx_file(dir, streams, idx_files[i], paths[i], sizeof paths[i], err));
    ct_status st = idx_pair(paths[0], paths[1], train, err);
    if (st == CT_OK) st = train_pipeline(train, true, 0, seed, batch_size, err);
    if (st == CT_OK) st = idx_pair(paths[2], paths[3], eval, err);
    if (st == CT_OK) st = eval_pipeline(eval, (int)eval_batch_size, err);
    if (st != CT_OK) {
        char dw[300];
        value_where(dir, dw, sizeof dw);
        ct_error_prefix(err, "%s%s.data_dir", dw, streams);
    }
    return st;
}

// ---- example shapes (for the memory budget) ----------------------------------------------------

ct_status cfg_inputs_eval_batch(ct_config *cfg, const char *name, int64_t *batch, const char **param,
                                ct_error *err) {
    *batch = 0;
    *param = NULL;
    const char *slash = strrchr(name, '/');  // "scope/Name"
    char why[256];
    const cfg_def *d = cfg_lookup(slash ? slash + 1 : name, why, sizeof why);
    if (!d || d->build_inputs != cfg_build_batcher_inputs) return CT_OK;
    int eval_batch_size, n_devices, n_processes;
    CT_TRY(get_int(cfg, name, "eval_batch_size", &eval_batch_size, err));
    // As Trax's batch_fn: each host's eval batch is a multiple of its device
    // count (32 on 3 devices is 30), so that every device takes equal rows;
    // the eval batch is that from every process.
    CT_TRY(get_int(cfg, "train", "n_devices", &n_devices, err));
    CT_TRY(get_int(cfg, "train", "n_processes", &n_processes, err));
    eval_batch_size = (eval_batch_size / n_devices > 1 ? eval_batch_size / n_devices : 1) * n_devices;
    if ((int64_t)eval_batch_size * n_processes > (1 << 24)) {
        char where[300];
        cfg_where(cfg, name, "eval_batch_size", where, sizeof where);
        return ct_error_set(err, CT_ERR_ARG, "%s%s.eval_batch_size = %d x %d processes is over 2^24 examples", where,
                            name, eval_batch_size, n_processes);
    }
    *batch = (int64_t)eval_batch_size * n_processes;
    *param = "eval_batch_size";
    return CT_OK;
}

// The (rows, cols) an IDX images file's header gives, plain or gzip; 0, 0
// when it cannot be read or is no IDX images file (the stream says why) or
// is past 2^31 pixels (the stream refuses that much data).
static void idx_header_dims(const char *path, int64_t *rows, int64_t *cols) {
    *rows = *cols = 0;
    struct stat sb;  // a fifo would block the open (the stream refuses anything not regular)
    if (stat(path, &sb) != 0 || !S_ISREG(sb.st_mode)) return;
    gzFile f = gzopen(path, "rb");
    if (!f) return;
    unsigned char h[16];  // magic 0x00000803, then n, rows, cols (big-endian uint32)
    int got = gzread(f, h, sizeof h);
    gzclose(f);
    if (got != (int)sizeof h || h[0] || h[1] || h[2] != 0x08 || h[3] != 3) return;
    int64_t r = (int64_t)h[8] << 24 | h[9] << 16 | h[10] << 8 | h[11];
    int64_t c = (int64_t)h[12] << 24 | h[13] << 16 | h[14] << 8 | h[15];
    if (r < 1 || c < 1 || r * c > INT32_MAX) return;
    *rows = r;
    *cols = c;
}

void cfg_inputs_image_dims(ct_config *cfg, const char *name, int64_t *rows, int64_t *cols) {
    *rows = *cols = 0;
    const char *slash = strrchr(name, '/');
    char why[256];
    const cfg_def *d = cfg_lookup(slash ? slash + 1 : name, why, sizeof why);
    if (!d || d->kind != CFG_INPUT) return;
    const ct_config_value *v;
    if (d->build_inputs == cfg_build_idx_inputs) {
        if (cfg_query_default(cfg, name, "train_images", &v, NULL) == CT_OK && v->kind == CT_CONFIG_STRING)
            idx_header_dims(v->s, rows, cols);
    } else if (d->build_inputs == cfg_build_batcher_inputs) {
        // data_dir's train images, as cfg_build_batcher_inputs finds them.
        if (cfg_query_default(cfg, name, "data_streams", &v, NULL) != CT_OK || v->kind != CT_CONFIG_REFERENCE) return;
        const char *streams = cfg_scoped_ref(cfg, name, v->s);
        char path[4096 + 64];
        ct_error ignored = {0};
        if (cfg_query_default(cfg, streams, "data_dir", &v, NULL) == CT_OK && v->kind == CT_CONFIG_STRING &&
            idx_file(v, streams, idx_files[0], path, sizeof path, &ignored) == CT_OK)
            idx_header_dims(path, rows, cols);
    }
}
