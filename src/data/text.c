// Corpus sources: byte-level text and binary token files, cut into chunks of
// fixed length, with a deterministic train/eval split by hash of the chunk
// index. ct_token_stream_new (tokens.c) shares this code.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <zlib.h>

#include "core/fs.h"
#include "ctrax/core/memory.h"
#include "data/stream_internal.h"

typedef struct corpus_file {
    char *path;
    const uint8_t *data;  // mapped read-only, or read (a small file)
    bool mapped;
    size_t size;          // bytes
    int64_t first;        // index of its first token in the concatenation
    int64_t n_tokens;
} corpus_file;

typedef struct corpus {
    corpus_file *files;
    int n_files;
    int token_bytes;
    int64_t vocab_size;  // > 0: checked
    char *vocab_source;  // where vocab_size was set, or NULL
    int seq_len;
    bool shifted;
    int64_t chunk_len;  // seq_len + shifted
    ct_data_split split;
    double eval_fraction;
    int64_t n_total;  // chunks in the whole corpus
    int64_t *chunks;  // chunk indices of this split, ascending
    int64_t n_chunks;
    int64_t total_tokens;
    int32_t *tokens;  // chunk_len, then (in the same block)
    float *weights;   // seq_len ones
} corpus;

ct_corpus_params ct_corpus_default_params(void) {
    ct_corpus_params p = {0};
    p.seq_len = 128;
    p.split = CT_DATA_SPLIT_ALL;
    p.eval_fraction = 0.05;
    p.skip_binary = true;
    p.token_bytes = 2;
    return p;
}

static const char *kind_name(int token_bytes) {
    return token_bytes == 1 ? "text" : token_bytes == 2 ? "uint16 tokens" : "uint32 tokens";
}

// The file holding token t (files[i].first <= t < files[i].first + n).
static int file_of(const corpus *c, int64_t t) {
    int lo = 0, hi = c->n_files - 1;
    while (lo < hi) {
        int mid = (lo + hi + 1) / 2;
        if (c->files[mid].first <= t)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

static ct_status read_chunk(corpus *c, int64_t chunk, ct_error *err) {
    int64_t t = chunk * c->chunk_len;
    int f = file_of(c, t);
    for (int64_t i = 0; i < c->chunk_len; i++, t++) {
        while (t >= c->files[f].first + c->files[f].n_tokens) f++;
        const corpus_file *cf = &c->files[f];
        size_t at = (size_t)(t - cf->first) * (size_t)c->token_bytes;
        const uint8_t *p = cf->data + at;
        uint32_t v = c->token_bytes == 1 ? p[0]
                     : c->token_bytes == 2
                         ? (uint32_t)p[0] | (uint32_t)p[1] << 8
                         : (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
        // Ids are int32 whatever vocab_size is: past that, the error names no vocab_size (which may be unset).
        if (v > INT32_MAX)
            return ct_error_set(err, CT_ERR_FORMAT,
                                "%s: token %u at byte %zu is above %d, the largest id an int32 holds (%s)", cf->path, v,
                                at, INT32_MAX, kind_name(c->token_bytes));
        // Met while training, far from the config: the setting is named where the caller knows it.
        if (c->vocab_size > 0 && (int64_t)v >= c->vocab_size)
            return ct_error_set(err, CT_ERR_FORMAT, "%s: token %u at byte %zu is not below vocab_size %lld (%s%s%s)",
                                cf->path, v, at, (long long)c->vocab_size, kind_name(c->token_bytes),
                                c->vocab_source ? "; vocab_size from " : "",
                                c->vocab_source ? c->vocab_source : "");
        c->tokens[i] = (int32_t)v;
    }
    return CT_OK;
}

static ct_status corpus_next(ct_stream *s, ct_batch *out, ct_error *err) {
    corpus *c = s->impl;
    if (s->position >= c->n_chunks) return CT_OK;
    CT_TRY(read_chunk(c, c->chunks[s->position], err));
    int T = c->seq_len;
    out->n = 3;
    out->t[0] = ct_tensor_1d(CT_DTYPE_I32, T, c->tokens);
    out->t[1] = ct_tensor_1d(CT_DTYPE_I32, T, c->tokens + (c->shifted ? 1 : 0));
    out->t[2] = ct_tensor_1d(CT_DTYPE_F32, T, c->weights);
    return CT_OK;
}

static void corpus_free(ct_stream *s) {
    corpus *c = s->impl;
    for (int i = 0; i < c->n_files; i++) {
        if (c->files[i].mapped)
            munmap((void *)c->files[i].data, c->files[i].size);
        else
            ct_free((void *)c->files[i].data);
        ct_free(c->files[i].path);
    }
    ct_free(c->files);
    ct_free(c->chunks);
    ct_free(c->tokens);
    ct_free(c->vocab_source);
    ct_free(c);
}

static void corpus_describe(const ct_stream *s, char *buf, size_t len) {
    const corpus *c = s->impl;
    const char *split = c->split == CT_DATA_SPLIT_ALL ? "all" : c->split == CT_DATA_SPLIT_TRAIN ? "train" : "eval";
    snprintf(buf, len, "%s(%d file%s, %lld tokens; %s split: %lld of %lld chunks of %lld)", kind_name(c->token_bytes),
             c->n_files, c->n_files == 1 ? "" : "s", (long long)c->total_tokens, split, (long long)c->n_chunks,
             (long long)c->n_total, (long long)c->chunk_len);
}

static const ct_stream_ops corpus_ops = {"corpus", corpus_next, NULL, corpus_free, corpus_describe};

// Files smaller than this are read, not mapped: a mapping each would reach
// the kernel's limit on mappings (vm.max_map_count, 65530 by default) in a
// directory of 10^5 small files, and each costs a page anyway.
#define CORPUS_READ_BELOW (64 * 1024)

// Maps file f, or reads it when small (*read_bytes counts what the corpus's
// small files take in memory: 10^6 files of 60 KiB are 60 GB).
static ct_status map_file(corpus_file *f, int token_bytes, double *read_bytes, ct_error *err) {
    // O_NONBLOCK: opening a fifo must not wait for a writer (it is refused below).
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (fd < 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot open: %s", f->path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int e = errno;
        close(fd);
        return ct_error_set(err, CT_ERR_IO, "%s: cannot stat: %s", f->path, strerror(e));
    }
    // Only a regular file's size is what mapping it gives: a device (a link to
    // /dev/zero) or a fifo is refused, not read as an empty or endless corpus.
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return ct_error_set(err, CT_ERR_IO, "%s: not a regular file (a device or fifo): refusing to read it (%s)",
                            f->path, kind_name(token_bytes));
    }
    f->size = (size_t)st.st_size;
    if (f->size % (size_t)token_bytes != 0) {
        close(fd);
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: size %zu bytes is not a multiple of %d (%s): the file is truncated or holds "
                            "another token width; the last %zu bytes at byte %zu are a partial token",
                            f->path, f->size, token_bytes, kind_name(token_bytes), f->size % (size_t)token_bytes,
                            f->size - f->size % (size_t)token_bytes);
    }
    f->n_tokens = (int64_t)(f->size / (size_t)token_bytes);
    if (f->size == 0) {
        close(fd);
        return CT_OK;
    }
    if (f->size < CORPUS_READ_BELOW) {
        *read_bytes += (double)f->size;
        ct_status room = ct_host_check_room(*read_bytes, "a corpus's files under 64 KiB, read into memory,", err);
        if (room != CT_OK) {
            close(fd);
            return ct_error_prefix(err, "%s", f->path);
        }
        uint8_t *buf = ct_malloc(f->size);
        size_t got;
        ct_status st = ct_fs_read_all(fd, buf, f->size, &got, f->path, err);
        close(fd);
        if (st == CT_OK && got < f->size)
            st = ct_error_set(err, CT_ERR_IO, "%s: %zu of its %zu bytes read: the file shrank while it was read",
                              f->path, got, f->size);
        if (st != CT_OK) {
            ct_free(buf);
            return st;
        }
        f->data = buf;
        return CT_OK;
    }
    void *p = mmap(NULL, f->size, PROT_READ, MAP_PRIVATE, fd, 0);
    int e = errno;
    close(fd);
    if (p == MAP_FAILED)
        return ct_error_set(err, CT_ERR_IO, "%s: cannot map %zu bytes: %s%s", f->path, f->size, strerror(e),
                            e == ENOMEM ? " (or past the kernel's limit on a process's mappings, vm.max_map_count)" : "");
    f->data = p;
    f->mapped = true;
    return CT_OK;
}

// Maps every file and counts the chunks of the whole corpus.
static ct_status corpus_map(corpus *c, const char *kind, ct_error *err) {
    double read_bytes = 0;
    for (int i = 0; i < c->n_files; i++) {
        CT_TRY(map_file(&c->files[i], c->token_bytes, &read_bytes, err));
        c->files[i].first = c->total_tokens;
        c->total_tokens += c->files[i].n_tokens;
    }
    c->n_total = c->total_tokens / c->chunk_len;
    if (c->n_total == 0)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: %d file%s (%s%s) hold %lld tokens, fewer than one example of %lld",
                            kind, c->n_files, c->n_files == 1 ? "" : "s", c->files[0].path,
                            c->n_files > 1 ? ", ..." : "", (long long)c->total_tokens, (long long)c->chunk_len);
    // The chunk index is 8 bytes a chunk, and the epochs stage orders at most
    // 2^32: a huge (or sparse) file with a short seq_len is refused here,
    // before the index is allocated.
    if (c->n_total > UINT32_MAX)
        return ct_error_set(err, CT_ERR_ARG,
                            "%s: %d file%s (%s%s) hold %lld tokens: %lld examples of %lld, more than 2^32; "
                            "a longer seq_len makes fewer",
                            kind, c->n_files, c->n_files == 1 ? "" : "s", c->files[0].path,
                            c->n_files > 1 ? ", ..." : "", (long long)c->total_tokens, (long long)c->n_total,
                            (long long)c->chunk_len);
    char what[64];
    snprintf(what, sizeof what, "%s: the index of %lld examples", kind, (long long)c->n_total);
    return ct_host_check_room((double)c->n_total * (double)sizeof *c->chunks, what, err);
}

// The chunks of p's split: chunk k is eval when its hash falls below
// eval_fraction * 2^32.
static ct_status corpus_split(corpus *c, const ct_corpus_params *p, const char *kind, ct_error *err) {
    uint64_t threshold = (uint64_t)floor(p->eval_fraction * 4294967296.0);
    c->chunks = ct_malloc((size_t)c->n_total * sizeof *c->chunks);
    for (int64_t k = 0; k < c->n_total; k++) {
        bool eval = ct_stream_hash(p->split_seed, (uint32_t)k, (uint32_t)((uint64_t)k >> 32)) < threshold;
        if (p->split == CT_DATA_SPLIT_ALL || eval == (p->split == CT_DATA_SPLIT_EVAL)) c->chunks[c->n_chunks++] = k;
    }
    if (c->n_chunks == 0) {
        if (p->empty_split) *p->empty_split = true;
        return ct_error_set(err, CT_ERR_ARG, "%s: the %s split of %s%s is empty (eval_fraction %g of %lld chunks of %lld)",
                            kind, p->split == CT_DATA_SPLIT_EVAL ? "eval" : "train", c->files[0].path,
                            c->n_files > 1 ? ", ..." : "", p->eval_fraction, (long long)c->n_total,
                            (long long)c->chunk_len);
    }
    return CT_OK;
}

// A CRC-32 of a file's content, sampled: the whole file up to
// CORPUS_SAMPLES blocks of CORPUS_SAMPLE_BYTES, else that many blocks spread
// evenly from its first byte to its last. The same few pages whatever the
// file's size, so a corpus of any size starts at once; it tells a replaced or
// regenerated file of the same size from the one a cursor was saved with,
// though not an edit that falls between the blocks.
#define CORPUS_SAMPLES 64
#define CORPUS_SAMPLE_BYTES 4096
static uint32_t sampled_crc(const corpus_file *f) {
    uLong crc = crc32(0L, Z_NULL, 0);
    if (f->size <= (size_t)CORPUS_SAMPLES * CORPUS_SAMPLE_BYTES) return (uint32_t)crc32(crc, f->data, (uInt)f->size);
    // Block i starts at i/(SAMPLES-1) of the way to the last block's start
    // (the file's size less a block: the last block ends at its last byte).
    size_t last = f->size - CORPUS_SAMPLE_BYTES, q = last / (CORPUS_SAMPLES - 1), r = last % (CORPUS_SAMPLES - 1);
    for (int i = 0; i < CORPUS_SAMPLES; i++) {
        size_t at = (size_t)i * q + (size_t)i * r / (CORPUS_SAMPLES - 1);  // i * last / 63, without overflow
        crc = crc32(crc, f->data + at, CORPUS_SAMPLE_BYTES);
    }
    return (uint32_t)crc;
}

// The item buffers, the signature and the fingerprint of a loaded corpus.
static void corpus_finish(ct_stream *s, const ct_corpus_params *p) {
    corpus *c = s->impl;
    size_t tokens = (size_t)c->chunk_len * sizeof *c->tokens;
    char *at = ct_malloc(ct_round16(tokens) + (size_t)c->seq_len * sizeof *c->weights);
    c->tokens = ct_carve(&at, tokens);
    c->weights = ct_carve(&at, (size_t)c->seq_len * sizeof *c->weights);
    for (int i = 0; i < c->seq_len; i++) c->weights[i] = 1.0f;
    s->n_out = 3;
    s->sigs[0] = ct_tensor_1d(CT_DTYPE_I32, c->seq_len, NULL);
    s->sigs[1] = ct_tensor_1d(CT_DTYPE_I32, c->seq_len, NULL);
    s->sigs[2] = ct_tensor_1d(CT_DTYPE_F32, c->seq_len, NULL);
    s->length = c->n_chunks;
    // The fingerprint covers what decides the items: the files' sizes and
    // sampled contents (not their paths, so a moved corpus still resumes),
    // widths and the split.
    ct_stream_mix(s, (uint64_t)c->token_bytes);
    ct_stream_mix(s, (uint64_t)c->n_files);
    for (int i = 0; i < c->n_files; i++) {
        ct_stream_mix(s, (uint64_t)c->files[i].size);
        ct_stream_mix(s, sampled_crc(&c->files[i]));
    }
    ct_stream_mix(s, (uint64_t)c->seq_len);
    ct_stream_mix(s, c->shifted);
    ct_stream_mix(s, (uint64_t)c->split);
    uint64_t frac_bits;
    memcpy(&frac_bits, &p->eval_fraction, sizeof frac_bits);
    ct_stream_mix(s, frac_bits);
    ct_stream_mix(s, p->split_seed);
    ct_stream_mix(s, (uint64_t)c->vocab_size);
}

ct_status ct_corpus_stream_new(ct_stream **out, const ct_corpus_params *p, int token_bytes, ct_error *err) {
    *out = NULL;
    if (p->empty_split) *p->empty_split = false;
    const char *kind = kind_name(token_bytes);
    CT_STREAM_CHECK(token_bytes == 1 || token_bytes == 2 || token_bytes == 4, err,
                    "token files: token_bytes is %d; expected 2 (uint16) or 4 (uint32)", token_bytes);
    CT_STREAM_CHECK(p->seq_len > 0, err, "%s: seq_len is %d; expected > 0", kind, p->seq_len);
    CT_STREAM_CHECK(p->split == CT_DATA_SPLIT_ALL || p->split == CT_DATA_SPLIT_TRAIN || p->split == CT_DATA_SPLIT_EVAL,
                    err, "%s: unknown split %d", kind, (int)p->split);
    CT_STREAM_CHECK(p->eval_fraction >= 0 && p->eval_fraction <= 1, err, "%s: eval_fraction is %g; expected 0..1", kind,
                    p->eval_fraction);
    // 0 is unchecked; a negative one is a slip, not a wish to check nothing.
    CT_STREAM_CHECK(token_bytes == 1 || p->vocab_size >= 0, err, "%s: vocab_size is %lld; expected > 0, or 0 (unchecked)",
                    kind, (long long)p->vocab_size);
    char **paths;
    int n_files;
    CT_TRY(ct_data_collect_files(p->paths, p->n_paths, token_bytes == 1 && p->skip_binary, &paths, &n_files, err));
    corpus *c = ct_calloc(1, sizeof *c);
    c->files = ct_calloc((size_t)n_files, sizeof *c->files);
    c->n_files = n_files;
    for (int i = 0; i < n_files; i++) c->files[i].path = paths[i];
    ct_free(paths);  // the strings now belong to c->files
    ct_stream *s = ct_stream_alloc(&corpus_ops, NULL, c);
    c->token_bytes = token_bytes;
    c->vocab_size = token_bytes == 1 ? 0 : p->vocab_size;
    if (c->vocab_size > 0 && p->vocab_size_source) c->vocab_source = ct_strdup(p->vocab_size_source);
    c->seq_len = p->seq_len;
    c->shifted = p->shifted;
    c->chunk_len = (int64_t)p->seq_len + (p->shifted ? 1 : 0);  // INT_MAX + 1 fits
    c->split = p->split;
    c->eval_fraction = p->eval_fraction;
    ct_status st = corpus_map(c, kind, err);
    if (st == CT_OK) st = corpus_split(c, p, kind, err);
    if (st != CT_OK) {
        ct_stream_free(s);
        return st;
    }
    corpus_finish(s, p);
    *out = s;
    return CT_OK;
}

ct_status ct_text_stream_new(ct_stream **out, const ct_corpus_params *p, ct_error *err) {
    return ct_corpus_stream_new(out, p, 1, err);
}

int ct_corpus_n_files(const ct_stream *s) {
    return s && s->ops == &corpus_ops ? ((const corpus *)s->impl)->n_files : 0;
}

const char *ct_corpus_file(const ct_stream *s, int i) {
    if (!s || s->ops != &corpus_ops) return NULL;
    const corpus *c = s->impl;
    return i >= 0 && i < c->n_files ? c->files[i].path : NULL;
}
