// safetensors: writer and a reader that checks everything it maps.
#define _GNU_SOURCE  // qsort_r
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/fs.h"
#include "core/json.h"
#include "ctrax/core/memory.h"
#include "ctrax/train/checkpoint.h"

// The data is written and mapped as it is in memory.
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "safetensors I/O assumes a little-endian host");

// Larger headers are refused, as Hugging Face's reader does (100 MB).
#define ST_HEADER_MAX (100u * 1000u * 1000u)
// cJSON takes some 80 bytes per value: a 100 MB header holding a shape of
// 50M zeros parsed to 3.9 GB before a check could refuse it. A header's
// values are counted first and more than this many refused: about 87,000
// tensors' worth (an entry is at most 12: object, dtype, shape and six dims,
// data_offsets and two), where checkpoints hold thousands.
#define ST_VALUES_MAX (1u << 20)
// Integers in the header go through doubles (cJSON); beyond 2^53 they are not exact.
#define ST_INT_MAX ((double)(1ull << 53))

static const char *st_dtype_name(ct_dtype d) {
    switch (d) {
        case CT_DTYPE_F32:
            return "F32";
        case CT_DTYPE_I32:
            return "I32";
        case CT_DTYPE_BF16:
            return "BF16";
    }
    return NULL;
}

static bool st_dtype_parse(const char *s, ct_dtype *d) {
    if (!strcmp(s, "F32")) *d = CT_DTYPE_F32;
    else if (!strcmp(s, "I32")) *d = CT_DTYPE_I32;
    else if (!strcmp(s, "BF16")) *d = CT_DTYPE_BF16;
    else return false;
    return true;
}

// ---- writing ----------------------------------------------------------------

static int cmp_str_ptr(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static ct_status check_tensors(const char *path, const ct_named_tensor *t, int n, ct_error *err) {
    for (int i = 0; i < n; i++) {
        const char *name = t[i].name;
        if (!name || !name[0] || !strcmp(name, "__metadata__"))
            return ct_error_set(err, CT_ERR_ARG, "%s: tensor %d has an invalid name '%s'", path, i,
                                name ? name : "(null)");
        // The header is UTF-8 JSON (other readers refuse anything else).
        if (!ct_utf8_valid(name))
            return ct_error_set(err, CT_ERR_ARG, "%s: tensor %d's name is not valid UTF-8", path, i);
        const ct_tensor *x = &t[i].tensor;
        if (!st_dtype_name(x->dtype) || x->ndim < 0 || x->ndim > CT_MAX_DIMS)
            return ct_error_set(err, CT_ERR_ARG, "%s: tensor '%s' has an invalid dtype or rank", path, name);
        for (int d = 0; d < x->ndim; d++)
            if (x->shape[d] < 0) return ct_error_set(err, CT_ERR_ARG, "%s: tensor '%s' has a negative dim", path, name);
        if (!x->data && ct_tensor_numel(x) > 0)
            return ct_error_set(err, CT_ERR_ARG, "%s: tensor '%s' has no data", path, name);
    }
    const char **names = ct_calloc_checked((size_t)n, sizeof *names, err, "%s: checking %d tensor names", path, n);
    if (!names) return CT_ERR_MEMORY;
    for (int i = 0; i < n; i++) names[i] = t[i].name;
    qsort(names, (size_t)n, sizeof *names, cmp_str_ptr);
    ct_status st = CT_OK;
    for (int i = 1; i < n && st == CT_OK; i++)
        if (!strcmp(names[i - 1], names[i]))
            st = ct_error_set(err, CT_ERR_ARG, "%s: tensor name '%s' is used twice", path, names[i]);
    free(names);
    return st;
}

// The header JSON, padded with spaces so that 8 + its length is a multiple
// of 8. order[] is the file order of the tensors; offsets are filled in.
static char *build_header(const ct_named_tensor *t, int n, const int *order, const ct_kv *meta, int n_meta,
                          size_t *len) {
    cJSON *root = cJSON_CreateObject();
    if (!root) return NULL;
    bool ok = true;
    if (n_meta > 0) {
        cJSON *m = cJSON_AddObjectToObject(root, "__metadata__");
        for (int i = 0; m && i < n_meta; i++) ok = ok && cJSON_AddStringToObject(m, meta[i].key, meta[i].value);
        ok = ok && m;
    }
    uint64_t off = 0;
    for (int k = 0; k < n && ok; k++) {
        const ct_named_tensor *x = &t[order[k]];
        cJSON *e = cJSON_AddObjectToObject(root, x->name);
        cJSON *shape = cJSON_CreateArray(), *offs = cJSON_CreateArray();
        ok = e && shape && offs;
        if (!ok) {
            cJSON_Delete(shape);
            cJSON_Delete(offs);
            break;
        }
        cJSON_AddStringToObject(e, "dtype", st_dtype_name(x->tensor.dtype));
        for (int d = 0; d < x->tensor.ndim; d++) cJSON_AddItemToArray(shape, ct_json_int(x->tensor.shape[d]));
        cJSON_AddItemToObject(e, "shape", shape);
        uint64_t end = off + ct_tensor_nbytes(&x->tensor);
        cJSON_AddItemToArray(offs, ct_json_int((int64_t)off));
        cJSON_AddItemToArray(offs, ct_json_int((int64_t)end));
        cJSON_AddItemToObject(e, "data_offsets", offs);
        off = end;
    }
    char *json = ok ? cJSON_PrintUnformatted(root) : NULL;
    cJSON_Delete(root);
    if (!json) return NULL;
    size_t jl = strlen(json), padded = jl + (8 - (8 + jl) % 8) % 8;
    char *h = realloc(json, padded + 1);  // a size from the model: checked (the caller says so)
    if (!h) {
        free(json);
        return NULL;
    }
    memset(h + jl, ' ', padded - jl);
    h[padded] = '\0';
    *len = padded;
    return h;
}

ct_status ct_safetensors_write(const char *path, const ct_named_tensor *tensors, int n, const ct_kv *meta, int n_meta,
                               ct_error *err) {
    CT_ASSERT(path && n >= 0 && (tensors || n == 0) && n_meta >= 0 && (meta || n_meta == 0));
    CT_TRY(check_tensors(path, tensors, n, err));
    for (int i = 0; i < n_meta; i++) {
        if (!meta[i].key || !meta[i].value)
            return ct_error_set(err, CT_ERR_ARG, "%s: metadata entry %d has a NULL key or value", path, i);
        if (!ct_utf8_valid(meta[i].key) || !ct_utf8_valid(meta[i].value))
            return ct_error_set(err, CT_ERR_ARG, "%s: metadata entry %d is not valid UTF-8", path, i);
        // A key twice would make a header this library's reader refuses.
        for (int j = 0; j < i; j++)
            if (!strcmp(meta[j].key, meta[i].key))
                return ct_error_set(err, CT_ERR_ARG, "%s: metadata key '%s' is given twice", path, meta[i].key);
    }

    // Wider dtypes first keeps every tensor aligned to its element size
    // without gaps (the data starts 8-aligned); otherwise the caller's order.
    int *order = ct_calloc_checked((size_t)n, sizeof *order, err, "%s: the order of %d tensors", path, n);
    if (!order) return CT_ERR_MEMORY;
    int k = 0;
    for (size_t width = 8; width >= 1; width /= 2)
        for (int i = 0; i < n; i++)
            if (ct_dtype_size(tensors[i].tensor.dtype) == width) order[k++] = i;
    CT_ASSERT(k == n);

    size_t hlen = 0;
    char *header = build_header(tensors, n, order, meta, n_meta, &hlen);
    if (!header) {
        free(order);
        return ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory building the header", path);
    }

    // The file is the header's length, the header, then the data: one
    // atomic write of 2 + n pieces.
    uint64_t le_len = hlen;  // little-endian host
    ct_fs_part *parts = ct_calloc_checked((size_t)n + 2, sizeof *parts, err, "%s: the parts of %d tensors", path, n);
    ct_status st = parts ? CT_OK : CT_ERR_MEMORY;
    if (st == CT_OK) {
        parts[0] = (ct_fs_part){&le_len, 8};
        parts[1] = (ct_fs_part){header, hlen};
        for (int i = 0; i < n; i++) {
            const ct_tensor *x = &tensors[order[i]].tensor;
            parts[2 + i] = (ct_fs_part){x->data, ct_tensor_nbytes(x)};
        }
        st = ct_fs_write_atomic_parts(path, parts, n + 2, err);
    }
    free(parts);
    free(order);
    free(header);
    return st;
}

// ---- reading ------------------------------------------------------------------

typedef struct st_entry {
    char *name;
    ct_dtype dtype;
    int ndim;
    int64_t shape[CT_MAX_DIMS];
    uint64_t begin, end;  // relative to the data
} st_entry;

struct ct_safetensors {
    char *path;
    unsigned char *map;
    size_t size;
    const unsigned char *data;  // map + 8 + header length
    int n;
    st_entry *e;   // by offset
    int *by_name;  // indices into e, sorted by name
    int n_meta;
    char **meta_kv;  // key, value, key, value, ...
};

const char *ct_safetensors_path(const ct_safetensors *st) { return st->path; }
int ct_safetensors_count(const ct_safetensors *st) { return st->n; }

const char *ct_safetensors_name(const ct_safetensors *st, int i) {
    CT_ASSERT(i >= 0 && i < st->n);
    return st->e[i].name;
}

ct_tensor ct_safetensors_tensor(const ct_safetensors *st, int i) {
    CT_ASSERT(i >= 0 && i < st->n);
    const st_entry *e = &st->e[i];
    return ct_tensor_make(e->dtype, e->ndim, e->shape, (void *)(st->data + e->begin));
}

int ct_safetensors_find(const ct_safetensors *st, const char *name) {
    int lo = 0, hi = st->n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        int c = strcmp(name, st->e[st->by_name[mid]].name);
        if (c == 0) return st->by_name[mid];
        if (c < 0) hi = mid - 1;
        else lo = mid + 1;
    }
    return -1;
}

const char *ct_safetensors_metadata(const ct_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta_kv[2 * i], key)) return st->meta_kv[2 * i + 1];
    return NULL;
}

const void *ct_safetensors_bytes(const ct_safetensors *st, size_t *n_bytes) {
    if (n_bytes) *n_bytes = st->size;
    return st->map;
}

void ct_safetensors_close(ct_safetensors *st) {
    if (!st) return;
    if (st->map) munmap(st->map, st->size);
    for (int i = 0; i < st->n; i++) free(st->e[i].name);
    for (int i = 0; i < 2 * st->n_meta; i++) free(st->meta_kv[i]);
    free(st->meta_kv);
    free(st->e);
    free(st->by_name);
    free(st->path);
    free(st);
}

// A non-negative integer below 2^53 held exactly by a JSON number.
static bool json_uint(const cJSON *j, uint64_t *v) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < ST_INT_MAX) || d != (double)(uint64_t)d) return false;
    *v = (uint64_t)d;
    return true;
}

static ct_status parse_entry(ct_safetensors *st, const cJSON *j, st_entry *e, ct_error *err) {
    const char *name = j->string;
    if (!name[0]) return ct_error_set(err, CT_ERR_FORMAT, "%s: a tensor has an empty name", st->path);
    if (!cJSON_IsObject(j))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': header entry is not an object", st->path, name);
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': no \"dtype\" string", st->path, name);
    if (!st_dtype_parse(dt->valuestring, &e->dtype))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': dtype \"%s\" is not one ctrax reads (F32, I32, BF16)",
                            st->path, name, dt->valuestring);
    if (!cJSON_IsArray(shape))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': no \"shape\" array", st->path, name);
    int ndim = cJSON_GetArraySize(shape);
    if (ndim > CT_MAX_DIMS)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': rank %d is above %d", st->path, name, ndim,
                            CT_MAX_DIMS);
    e->ndim = ndim;
    uint64_t numel = 1;
    for (int d = 0; d < ndim; d++) {
        uint64_t v;
        if (!json_uint(cJSON_GetArrayItem(shape, d), &v))
            return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': shape[%d] is not a non-negative integer",
                                st->path, name, d);
        e->shape[d] = (int64_t)v;
        if (__builtin_mul_overflow(numel, v, &numel) || numel >= (1ull << 62))
            return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': shape is too large", st->path, name);
    }
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !json_uint(cJSON_GetArrayItem(offs, 0), &e->begin) ||
        !json_uint(cJSON_GetArrayItem(offs, 1), &e->end))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': \"data_offsets\" is not [begin, end]", st->path,
                            name);
    if (e->end < e->begin)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64 "] are reversed",
                            st->path, name, e->begin, e->end);
    uint64_t need = numel * ct_dtype_size(e->dtype);
    if (e->end - e->begin != need) {
        char sig[CT_SIG_STR_MAX];
        ct_tensor t = ct_tensor_make(e->dtype, e->ndim, e->shape, NULL);
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: tensor '%s': shape %s needs %" PRIu64 " bytes but data_offsets [%" PRIu64 ", %" PRIu64
                            "] span %" PRIu64,
                            st->path, name, ct_tensor_sig_str(&t, sig, sizeof sig), need, e->begin, e->end,
                            e->end - e->begin);
    }
    e->name = ct_strdup_checked(name, err, "%s: a tensor name", st->path);
    return e->name ? CT_OK : CT_ERR_MEMORY;
    return CT_OK;
}

static ct_status parse_metadata(ct_safetensors *st, const cJSON *m, ct_error *err) {
    if (!cJSON_IsObject(m)) return ct_error_set(err, CT_ERR_FORMAT, "%s: \"__metadata__\" is not an object", st->path);
    // ct_json_parse refuses a second "__metadata__"; meta_kv is sized for one.
    if (st->meta_kv)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: \"__metadata__\" appears twice in the header", st->path);
    int n = cJSON_GetArraySize(m);
    st->meta_kv =
        ct_calloc_checked((size_t)(2 * n + 1), sizeof *st->meta_kv, err, "%s: %d metadata entries", st->path, n);
    if (!st->meta_kv) return CT_ERR_MEMORY;
    const cJSON *kv;
    cJSON_ArrayForEach(kv, m) {
        if (!cJSON_IsString(kv))
            return ct_error_set(err, CT_ERR_FORMAT, "%s: \"__metadata__\" value of '%s' is not a string", st->path,
                                kv->string);
        CT_ASSERT(st->n_meta < n);
        int i = st->n_meta++;
        if (!(st->meta_kv[2 * i] = ct_strdup_checked(kv->string, err, "%s: a metadata key", st->path)) ||
            !(st->meta_kv[2 * i + 1] = ct_strdup_checked(kv->valuestring, err, "%s: a metadata value", st->path)))
            return CT_ERR_MEMORY;
    }
    return CT_OK;
}

static int cmp_by_offset(const void *a, const void *b) {
    const st_entry *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end;
}

static int cmp_by_name(const void *a, const void *b, void *ctx) {
    const st_entry *e = ctx;
    return strcmp(e[*(const int *)a].name, e[*(const int *)b].name);
}

// Offsets must tile [0, data_len) exactly, in the order sorted by offset.
static ct_status check_layout(ct_safetensors *st, uint64_t data_len, ct_error *err) {
    qsort(st->e, (size_t)st->n, sizeof *st->e, cmp_by_offset);
    uint64_t pos = 0;
    for (int i = 0; i < st->n; i++) {
        const st_entry *e = &st->e[i];
        if (e->end > data_len)
            return ct_error_set(err, CT_ERR_FORMAT,
                                "%s: tensor '%s': data_offsets [%" PRIu64 ", %" PRIu64
                                "] run past the end of the data (%" PRIu64 " bytes): the file is truncated",
                                st->path, e->name, e->begin, e->end, data_len);
        if (e->begin < pos)
            return ct_error_set(err, CT_ERR_FORMAT, "%s: tensors '%s' and '%s' overlap", st->path, st->e[i - 1].name,
                                e->name);
        if (e->begin > pos)
            return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s': %" PRIu64 " unreferenced bytes before it",
                                st->path, e->name, e->begin - pos);
        pos = e->end;
    }
    if (pos != data_len) {
        if (st->n == 0)
            return ct_error_set(err, CT_ERR_FORMAT, "%s: %" PRIu64 " bytes of data but no tensor", st->path, data_len);
        return ct_error_set(err, CT_ERR_FORMAT, "%s: %" PRIu64 " unreferenced bytes after the last tensor '%s'",
                            st->path, data_len - pos, st->e[st->n - 1].name);
    }
    st->by_name = ct_calloc_checked((size_t)st->n, sizeof *st->by_name, err, "%s: the index of %d tensors", st->path,
                                    st->n);
    if (!st->by_name) return CT_ERR_MEMORY;
    for (int i = 0; i < st->n; i++) st->by_name[i] = i;
    qsort_r(st->by_name, (size_t)st->n, sizeof *st->by_name, cmp_by_name, st->e);
    for (int i = 1; i < st->n; i++)
        if (!strcmp(st->e[st->by_name[i - 1]].name, st->e[st->by_name[i]].name))
            return ct_error_set(err, CT_ERR_FORMAT, "%s: tensor '%s' appears twice in the header", st->path,
                                st->e[st->by_name[i]].name);
    return CT_OK;
}

static ct_status parse_header(ct_safetensors *st, ct_error *err) {
    if (st->size < 8)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: %zu bytes, shorter than the 8-byte header length: truncated or not a safetensors file",
                            st->path, st->size);
    uint64_t hlen;
    memcpy(&hlen, st->map, 8);
    if (hlen > st->size - 8)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: header length %" PRIu64
                            " runs past the end of the file (%zu bytes): truncated or not a safetensors file",
                            st->path, hlen, st->size);
    if (hlen > ST_HEADER_MAX || hlen < 2)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: header length %" PRIu64 " is not plausible", st->path, hlen);
    const char *h = (const char *)st->map + 8;
    // UTF-8, as the format says: Hugging Face's reader refuses anything else,
    // and ct_safetensors_write would refuse such a name.
    for (uint64_t i = 0; i < hlen;) {
        size_t k = ct_utf8_len((const unsigned char *)h + i, (size_t)(hlen - i));
        if (k == 0)
            return ct_error_set(err, CT_ERR_FORMAT, "%s: the header is not UTF-8 (byte %" PRIu64 " of the file)",
                                st->path, 8 + i);
        i += k;
    }
    uint64_t values = ct_json_values_bound(h, (size_t)hlen);
    if (values > ST_VALUES_MAX)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: the header holds up to %" PRIu64 " JSON values, more than the %u a checkpoint of "
                            "some 87,000 tensors would: refused before parsing",
                            st->path, values, ST_VALUES_MAX);
    // Duplicate keys are refused: one tensor name must not mean two tensors.
    ct_error jerr;
    cJSON *root = ct_json_parse(h, (size_t)hlen, st->path, &jerr);
    if (!root) {
        if (err) *err = jerr;
        return jerr.code;
    }
    ct_status s = CT_OK;
    if (s == CT_OK && !cJSON_IsObject(root))
        s = ct_error_set(err, CT_ERR_FORMAT, "%s: the header is not a JSON object", st->path);
    if (s == CT_OK) {
        int n = cJSON_GetArraySize(root);
        if (!(st->e = ct_calloc_checked((size_t)n, sizeof *st->e, err, "%s: the header's %d entries", st->path, n)))
            s = CT_ERR_MEMORY;
        const cJSON *j;
        cJSON_ArrayForEach(j, root) {
            if (s != CT_OK) break;
            if (!strcmp(j->string, "__metadata__")) s = parse_metadata(st, j, err);
            else {
                CT_ASSERT(st->n < n);  // st->e holds one entry per member
                s = parse_entry(st, j, &st->e[st->n], err);
                if (s == CT_OK) st->n++;
            }
        }
    }
    cJSON_Delete(root);
    if (s != CT_OK) return s;
    st->data = st->map + 8 + hlen;
    return check_layout(st, st->size - 8 - hlen, err);
}

ct_status ct_safetensors_open(ct_safetensors **out, const char *path, ct_error *err) {
    CT_ASSERT(out && path);
    *out = NULL;
    int fd;
    struct stat sb;
    CT_TRY(ct_fs_open_regular(path, &fd, &sb, err));
    ct_safetensors *st = ct_calloc(1, sizeof *st);
    st->path = ct_strdup(path);
    ct_status s = CT_OK;
    st->size = (size_t)sb.st_size;
    if (st->size > 0) {
        void *m = mmap(NULL, st->size, PROT_READ, MAP_PRIVATE, fd, 0);
        if (m == MAP_FAILED) s = ct_error_set(err, CT_ERR_IO, "%s: cannot map: %s", path, strerror(errno));
        else st->map = m;
    }
    close(fd);
    if (s == CT_OK) s = parse_header(st, err);
    if (s != CT_OK) {
        ct_safetensors_close(st);
        return s;
    }
    *out = st;
    return CT_OK;
}
