// The stream base: public wrappers, cursors, fingerprints, owned item copies,
// and collecting the files under a list of paths.
#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "data/stream_internal.h"

#define FINGERPRINT_MASK ((UINT64_C(1) << 53) - 1)

ct_stream *ct_stream_alloc(const ct_stream_ops *ops, ct_stream *inner, void *impl) {
    ct_stream *s = ct_calloc(1, sizeof *s);
    s->ops = ops;
    s->inner = inner;
    s->impl = impl;
    s->length = -1;
    s->fingerprint = UINT64_C(14695981039346656037);  // FNV-1a offset basis
    if (inner) ct_stream_mix(s, inner->fingerprint);
    ct_stream_mix_str(s, ops->name);
    return s;
}

ct_stream *ct_stream_wrap(const ct_stream_ops *ops, ct_stream *inner, void *impl) {
    ct_stream *s = ct_stream_alloc(ops, inner, impl);
    s->n_out = inner->n_out;
    memcpy(s->sigs, inner->sigs, sizeof s->sigs);
    s->length = inner->length;
    return s;
}

void ct_stream_mix(ct_stream *s, uint64_t value) {
    // FNV-1a over the 8 little-endian bytes of value.
    for (int i = 0; i < 8; i++) {
        s->fingerprint ^= (value >> (8 * i)) & 0xff;
        s->fingerprint *= UINT64_C(1099511628211);
    }
}

void ct_stream_mix_str(ct_stream *s, const char *str) {
    for (const unsigned char *c = (const unsigned char *)str; *c; c++) {
        s->fingerprint ^= *c;
        s->fingerprint *= UINT64_C(1099511628211);
    }
    ct_stream_mix(s, 0);  // a terminator, so ("ab", "c") != ("a", "bc")
}

uint32_t ct_stream_hash(uint64_t seed, uint32_t a, uint32_t b) {
    uint32_t out[2];
    ct_threefry2x32(ct_key_from_seed(seed), a, b, out);
    return out[0];
}

void ct_stream_free(ct_stream *s) {
    while (s) {
        ct_stream *inner = s->inner;
        if (s->ops->free_impl)
            s->ops->free_impl(s);
        else
            ct_free(s->impl);
        ct_free(s);
        s = inner;
    }
}

ct_status ct_stream_next(ct_stream *s, ct_batch *out, ct_error *err) {
    CT_ASSERT(s && out);
    memset(out, 0, sizeof *out);
    // Errors come from the stage that met them and name it (and the file).
    ct_status st = s->ops->next(s, out, err);
    if (st != CT_OK) {
        out->n = 0;
        return st;
    }
    if (out->n > 0) s->position++;
    return CT_OK;
}

ct_status ct_stream_seek(ct_stream *s, int64_t position, ct_error *err) {
    CT_ASSERT(s);
    if (position < 0)
        return ct_error_set(err, CT_ERR_ARG, "%s stream: cannot seek to position %lld", s->ops->name,
                            (long long)position);
    if (s->length >= 0 && position > s->length) position = s->length;
    if (s->ops->seek) CT_TRY(s->ops->seek(s, position, err));
    s->position = position;
    return CT_OK;
}

ct_stream_cursor ct_stream_get_cursor(const ct_stream *s) {
    ct_stream_cursor c = {s->position, (int64_t)(s->fingerprint & FINGERPRINT_MASK)};
    return c;
}

ct_status ct_stream_set_cursor(ct_stream *s, ct_stream_cursor cursor, ct_error *err) {
    int64_t mine = (int64_t)(s->fingerprint & FINGERPRINT_MASK);
    if (cursor.fingerprint != mine) {
        char desc[512];
        return ct_error_set(err, CT_ERR_STATE,
                            "data cursor (position %lld) was saved by a different stream (fingerprint %lld, this "
                            "stream's is %lld): the data pipeline or its files changed; this stream is %s",
                            (long long)cursor.position, (long long)cursor.fingerprint, (long long)mine,
                            ct_stream_describe(s, desc, sizeof desc));
    }
    return ct_stream_seek(s, cursor.position, err);
}

int64_t ct_stream_length(const ct_stream *s) { return s->length; }

int ct_stream_signature(const ct_stream *s, ct_tensor sigs[CT_BATCH_MAX_TENSORS]) {
    for (int i = 0; i < s->n_out; i++) sigs[i] = s->sigs[i];
    return s->n_out;
}

char *ct_stream_describe(const ct_stream *s, char *buf, size_t len) {
    if (len == 0) return buf;
    buf[0] = 0;
    size_t used = 0;
    for (const ct_stream *t = s; t && used + 1 < len; t = t->inner) {
        if (t != s) used += (size_t)snprintf(buf + used, len - used, " <- ");
        if (used + 1 >= len) break;
        if (t->ops->describe)
            t->ops->describe(t, buf + used, len - used);
        else
            snprintf(buf + used, len - used, "%s", t->ops->name);
        used += strlen(buf + used);
    }
    return buf;
}

// ---- owned item copies ------------------------------------------------------------

static void *item_buffer(ct_item *it, int i, size_t bytes) {
    if (bytes > it->cap[i]) {
        size_t cap = it->cap[i] ? it->cap[i] : 64;
        while (cap < bytes) cap *= 2;
        ct_free(it->mem[i]);
        it->mem[i] = ct_malloc(cap);
        it->cap[i] = cap;
    }
    return it->mem[i];
}

void ct_item_copy(ct_item *dst, const ct_batch *src) {
    dst->b.n = src->n;
    for (int i = 0; i < src->n; i++) {
        size_t bytes = ct_tensor_nbytes(&src->t[i]);
        void *mem = item_buffer(dst, i, bytes);
        if (bytes) memcpy(mem, src->t[i].data, bytes);
        dst->b.t[i] = src->t[i];
        dst->b.t[i].data = mem;
    }
}

void ct_item_shape(ct_item *dst, int n, const ct_tensor *sigs) {
    dst->b.n = n;
    for (int i = 0; i < n; i++) {
        size_t bytes = ct_tensor_nbytes(&sigs[i]);
        void *mem = item_buffer(dst, i, bytes);
        if (bytes) memset(mem, 0, bytes);
        dst->b.t[i] = sigs[i];
        dst->b.t[i].data = mem;
    }
}

void ct_item_free(ct_item *it) {
    for (int i = 0; i < CT_BATCH_MAX_TENSORS; i++) ct_free(it->mem[i]);
    memset(it, 0, sizeof *it);
}

// ---- collecting files ------------------------------------------------------------

typedef struct file_id {
    dev_t dev;
    ino_t ino;
    bool used;
} file_id;

typedef struct file_list {
    char **paths;
    int n, cap;
    // (device, inode) of every file and directory taken, to drop duplicates
    // and to stop symlink cycles: a hash set (open addressing, a power of 2
    // slots at most half full), since a directory of 10^5 files made a list
    // searched per file quadratic (seconds).
    file_id *seen;
    size_t cap_seen, n_seen;
} file_list;

static size_t file_id_slot(const file_list *l, dev_t dev, ino_t ino) {
    uint64_t h = ((uint64_t)dev * UINT64_C(0x9E3779B97F4A7C15)) ^ (uint64_t)ino;
    h *= UINT64_C(0xBF58476D1CE4E5B9);
    size_t i = (size_t)(h ^ (h >> 31)) & (l->cap_seen - 1);
    while (l->seen[i].used && !(l->seen[i].dev == dev && l->seen[i].ino == ino)) i = (i + 1) & (l->cap_seen - 1);
    return i;
}

static bool seen_before(file_list *l, const struct stat *st) {
    if (2 * (l->n_seen + 1) > l->cap_seen) {
        file_list grown = *l;
        grown.cap_seen = l->cap_seen ? 2 * l->cap_seen : 64;
        grown.seen = ct_calloc(grown.cap_seen, sizeof *grown.seen);
        for (size_t i = 0; i < l->cap_seen; i++)
            if (l->seen[i].used) grown.seen[file_id_slot(&grown, l->seen[i].dev, l->seen[i].ino)] = l->seen[i];
        ct_free(l->seen);
        *l = grown;
    }
    size_t i = file_id_slot(l, st->st_dev, st->st_ino);
    if (l->seen[i].used) return true;
    l->seen[i] = (file_id){st->st_dev, st->st_ino, true};
    l->n_seen++;
    return false;
}

static bool looks_binary(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return false;  // opening it later reports the error
    char buf[8192];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    return memchr(buf, 0, n) != NULL;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static ct_status add_path(file_list *l, const char *path, bool skip_binary, bool listed, ct_error *err) {
    struct stat st;
    if (stat(path, &st) != 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (S_ISREG(st.st_mode)) {
        if (seen_before(l, &st) || st.st_size == 0) return CT_OK;
        // A binary file named on its own is kept: the caller asked for it.
        if (skip_binary && !listed && looks_binary(path)) return CT_OK;
        if (l->n == l->cap) {
            l->cap = l->cap ? 2 * l->cap : 16;
            l->paths = ct_realloc(l->paths, (size_t)l->cap * sizeof *l->paths);
        }
        l->paths[l->n++] = ct_strdup(path);
        return CT_OK;
    }
    if (!S_ISDIR(st.st_mode)) {
        if (!listed) return CT_OK;  // sockets, fifos, devices found in a directory
        return ct_error_set(err, CT_ERR_IO, "%s: not a regular file or a directory", path);
    }
    if (seen_before(l, &st)) return CT_OK;
    DIR *d = opendir(path);
    if (!d) return ct_error_set(err, CT_ERR_IO, "%s: cannot open directory: %s", path, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        if (e->d_name[0] == '.') continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 32;
            names = ct_realloc(names, (size_t)cap * sizeof *names);
        }
        size_t len = strlen(path) + strlen(e->d_name) + 2;
        names[n] = ct_malloc(len);
        bool slash = path[0] && path[strlen(path) - 1] == '/';
        snprintf(names[n], len, "%s%s%s", path, slash ? "" : "/", e->d_name);
        n++;
    }
    closedir(d);
    if (n > 1) qsort(names, (size_t)n, sizeof *names, compare_names);
    ct_status st2 = CT_OK;
    for (int i = 0; i < n; i++) {
        if (st2 == CT_OK) st2 = add_path(l, names[i], skip_binary, false, err);
        ct_free(names[i]);
    }
    ct_free(names);
    return st2;
}

ct_status ct_data_collect_files(const char *const *paths, int n_paths, bool skip_binary, char ***files, int *n_files,
                                ct_error *err) {
    *files = NULL;
    *n_files = 0;
    if (n_paths <= 0 || !paths) return ct_error_set(err, CT_ERR_ARG, "no data files given (paths is empty)");
    file_list l = {0};
    ct_status st = CT_OK;
    for (int i = 0; i < n_paths && st == CT_OK; i++) {
        if (!paths[i] || !paths[i][0])
            st = ct_error_set(err, CT_ERR_ARG, "data path %d is empty", i);
        else
            st = add_path(&l, paths[i], skip_binary, true, err);
    }
    ct_free(l.seen);
    if (st == CT_OK && l.n == 0) {
        st = ct_error_set(err, CT_ERR_IO, "%s%s: no %sfiles with data found", paths[0],
                          n_paths > 1 ? " (and others)" : "", skip_binary ? "non-empty text " : "non-empty ");
    }
    if (st != CT_OK) {
        ct_data_free_files(l.paths, l.n);
        return st;
    }
    *files = l.paths;
    *n_files = l.n;
    return CT_OK;
}

void ct_data_free_files(char **files, int n_files) {
    for (int i = 0; i < n_files; i++) ct_free(files[i]);
    ct_free(files);
}
