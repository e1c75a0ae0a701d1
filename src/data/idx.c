// IDX image and label files (MNIST, Fashion-MNIST), plain or gzip (zlib).
//
// The format (yann.lecun.com/exdb/mnist): a big-endian magic 0x0000TTNN (TT
// the element type, 0x08 = unsigned byte; NN the number of dims), NN
// big-endian uint32 dims, then the elements row-major. Both files are read
// and checked whole at open.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "ctrax/core/memory.h"
#include "data/stream_internal.h"

#define IDX_IMAGES_MAGIC 0x00000803u
#define IDX_LABELS_MAGIC 0x00000801u

typedef struct idx_data {
    int64_t n, rows, cols;
    uint8_t *images;  // n * rows * cols
    uint8_t *labels;  // n
    bool scale;
    int n_classes;
    float *image;  // rows * cols, the current example
    int32_t label;
    float weight;
} idx_data;

ct_idx_params ct_idx_default_params(void) {
    ct_idx_params p = {0};
    p.n_classes = 10;
    p.scale = true;
    return p;
}

// One opened file: tracks the (uncompressed) byte offset for messages.
// A gzip file is inflated here rather than through gzread: gzread skips
// whatever follows the last gzip member when it is not another member, so
// junk appended to a .gz would pass where the same bytes after a plain file
// are refused, and it took a member cut short in its trailer (CRC-32 and
// length unchecked) for a whole one.
typedef struct idx_file {
    const char *path;
    const char *what;  // "IDX images" or "IDX labels"
    int fd;
    size_t offset;
    bool compressed;
    uint64_t file_size;  // on disk (compressed or not)
    // gzip only:
    z_stream z;
    bool z_ready;        // inflateInit2 succeeded: inflateEnd at close
    unsigned char *in;   // IDX_IN_SIZE bytes of compressed input
    uint64_t in_pos;     // file bytes read into in so far
    bool in_eof;         // read() has returned 0
    bool member_done;    // inflate finished a member: another or the file's end follows
    bool at_end;         // nothing more comes out
    bool truncated;      // the file ended inside a member
} idx_file;

// Deflate's best case is about 1032 bytes out per byte in (zlib's FAQ): a
// gzip file cannot hold more than this many times its size.
#define GZIP_MAX_RATIO 1032
// Data is read into memory in pieces of at most this, so that what a header
// declares is allocated only as far as the file really holds it.
#define IDX_READ_PIECE ((size_t)64 << 20)
// Compressed input is read in pieces of this.
#define IDX_IN_SIZE ((size_t)128 << 10)

// read(2) into buf until n bytes or the end of the file.
static ct_status idx_read_raw(idx_file *x, void *buf, size_t n, size_t *got, ct_error *err) {
    *got = 0;
    while (*got < n) {
        ssize_t r = read(x->fd, (uint8_t *)buf + *got, n - *got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return ct_error_set(err, CT_ERR_IO, "%s: read failed: %s (%s)", x->path, strerror(errno), x->what);
        if (r == 0) break;
        *got += (size_t)r;
    }
    return CT_OK;
}

// The next piece of compressed input, once inflate has taken the last.
static ct_status idx_fill(idx_file *x, ct_error *err) {
    size_t r;
    CT_TRY(idx_read_raw(x, x->in, IDX_IN_SIZE, &r, err));
    x->in_eof = r < IDX_IN_SIZE;
    x->in_pos += r;
    x->z.next_in = x->in;
    x->z.avail_in = (uInt)r;
    return CT_OK;
}

// The next member of a gzip file, or its end. Zero bytes after a member
// are padding (a tape block's), skipped as gzip(1) and Python's gzip module
// skip them; anything else after a member is junk, refused as bytes after
// the data of a plain file are (Python's gzip refuses it too).
static ct_status idx_next_member(idx_file *x, ct_error *err) {
    for (;;) {
        while (x->z.avail_in && *x->z.next_in == 0) x->z.next_in++, x->z.avail_in--;
        if (x->z.avail_in || x->in_eof) break;
        CT_TRY(idx_fill(x, err));
    }
    uint64_t at = x->in_pos - x->z.avail_in;  // the file offset of the first byte not yet inflated
    uint8_t b[2];
    ssize_t r;
    do r = pread(x->fd, b, 2, (off_t)at);
    while (r < 0 && errno == EINTR);
    if (r < 0) return ct_error_set(err, CT_ERR_IO, "%s: read failed: %s (%s)", x->path, strerror(errno), x->what);
    if (r == 0) {
        x->at_end = true;
        return CT_OK;
    }
    if (r < 2 || b[0] != 0x1f || b[1] != 0x8b) {
        uint64_t junk = x->file_size > at ? x->file_size - at : (uint64_t)r;
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: %llu byte%s after the gzip data ends at byte %llu, not another gzip member: junk "
                            "appended to the file? (%s)",
                            x->path, (unsigned long long)junk, junk == 1 ? "" : "s", (unsigned long long)at, x->what);
    }
    if (inflateReset(&x->z) != Z_OK)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: cannot restart inflate at byte %llu (%s)", x->path,
                            (unsigned long long)at, x->what);
    x->member_done = false;
    return CT_OK;
}

// Up to n bytes of the (uncompressed) data into dst; *got < n only at the
// end of the file (x->truncated says whether it came inside a gzip member).
static ct_status idx_pull(idx_file *x, uint8_t *dst, size_t n, size_t *got, ct_error *err) {
    if (!x->compressed) {
        CT_TRY(idx_read_raw(x, dst, n, got, err));
        x->offset += *got;
        return CT_OK;
    }
    *got = 0;
    while (*got < n && !x->at_end) {
        if (x->z.avail_in == 0 && !x->in_eof) CT_TRY(idx_fill(x, err));
        if (x->member_done) {
            CT_TRY(idx_next_member(x, err));
            continue;
        }
        size_t want = n - *got > (1u << 30) ? (1u << 30) : n - *got;
        x->z.next_out = dst + *got;
        x->z.avail_out = (uInt)want;
        int ret = inflate(&x->z, Z_NO_FLUSH);
        size_t out = want - x->z.avail_out;
        *got += out;
        x->offset += out;
        if (ret == Z_STREAM_END) x->member_done = true;
        else if (ret == Z_MEM_ERROR)
            return ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory inflating gzip data (%s)", x->path, x->what);
        else if (ret != Z_OK && ret != Z_BUF_ERROR)
            return ct_error_set(err, CT_ERR_FORMAT, "%s: corrupt gzip data after byte %zu (uncompressed): %s", x->path,
                                x->offset, x->z.msg ? x->z.msg : "inflate failed");
        else if (x->z.avail_in == 0 && x->in_eof && out == 0) {
            // Nothing left to read and no progress: the file ends inside a member.
            x->truncated = true;
            x->at_end = true;
        }
    }
    return CT_OK;
}

// Reads exactly n bytes, or fails naming where the file ended.
static ct_status idx_read(idx_file *x, void *dst, size_t n, const char *needed_for, ct_error *err) {
    size_t got;
    CT_TRY(idx_pull(x, dst, n, &got, err));
    if (got < n)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: truncated at byte %zu%s: %zu more bytes expected for %s (%s)",
                            x->path, x->offset, x->compressed ? " (uncompressed)" : "", n - got, needed_for, x->what);
    return CT_OK;
}

static uint32_t be32(const uint8_t *b) {
    return (uint32_t)b[0] << 24 | (uint32_t)b[1] << 16 | (uint32_t)b[2] << 8 | (uint32_t)b[3];
}

// Opens path, checks the magic and reads the dims.
static ct_status idx_open(idx_file *x, const char *path, const char *what, uint32_t magic, uint32_t *dims,
                          ct_error *err) {
    x->path = path;
    x->what = what;
    x->offset = 0;
    // A regular file only: its size bounds what is read (/dev/zero would
    // not end; O_NONBLOCK keeps a fifo's open from waiting for a writer).
    x->fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (x->fd < 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot open: %s (%s)", path, strerror(errno), what);
    struct stat sb;
    if (fstat(x->fd, &sb) != 0 || !S_ISREG(sb.st_mode))
        return ct_error_set(err, CT_ERR_IO, "%s: not a regular file (a directory, device or fifo): refusing it (%s)",
                            path, what);
    x->file_size = (uint64_t)sb.st_size;
    // gzip by its magic, as gzread decides (the name is not asked).
    uint8_t b[4];
    ssize_t r;
    do r = pread(x->fd, b, 2, 0);
    while (r < 0 && errno == EINTR);
    x->compressed = r == 2 && b[0] == 0x1f && b[1] == 0x8b;
    if (x->compressed) {
        x->in = ct_malloc(IDX_IN_SIZE);
        // 16 + MAX_WBITS: gzip members only (a zlib or raw stream is not a .gz).
        int zr = inflateInit2(&x->z, 16 + MAX_WBITS);
        if (zr != Z_OK)
            return ct_error_set(err, zr == Z_MEM_ERROR ? CT_ERR_MEMORY : CT_ERR_IO, "%s: cannot start inflate (%s)",
                                path, what);
        x->z_ready = true;
    }
    CT_TRY(idx_read(x, b, 4, "the magic number", err));
    uint32_t m = be32(b);
    if (m != magic)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: bad magic 0x%08x at byte 0, expected 0x%08x (%s: type 0x08 = unsigned byte, %u dim%s)",
                            path, m, magic, what, magic & 0xff, (magic & 0xff) == 1 ? "" : "s");
    int ndim = (int)(magic & 0xff);
    for (int i = 0; i < ndim; i++) {
        size_t at = x->offset;
        CT_TRY(idx_read(x, b, 4, "the header's dims", err));
        dims[i] = be32(b);
        if (dims[i] == 0)
            return ct_error_set(err, CT_ERR_FORMAT, "%s: dim %d is 0 at byte %zu (%s)", path, i, at, what);
    }
    return CT_OK;
}

// Whether the file can hold n data bytes after its header: exactly for a
// plain file, within deflate's best ratio for a gzip one. Checked before any
// allocation: a 16-byte header may declare 800 GB of images.
static ct_status idx_check_size(const idx_file *x, uint64_t n, const char *desc, ct_error *err) {
    uint64_t header = x->offset;  // the header has been read: offset is its length
    // The same words as when the read itself finds the end or more data.
    if (!x->compressed && x->file_size < header + n)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: truncated at byte %llu: %llu more bytes expected for %s (%s)",
                            x->path, (unsigned long long)x->file_size,
                            (unsigned long long)(header + n - x->file_size), desc, x->what);
    if (!x->compressed && x->file_size > header + n)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: unexpected data at byte %llu, after the %s its header declares (%s)",
                            x->path, (unsigned long long)(header + n), desc, x->what);
    if (x->compressed && (n + header) / GZIP_MAX_RATIO > x->file_size)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: the header declares %s (%llu bytes), more than a %llu-byte gzip file can hold "
                            "(deflate gives at most %dx): truncated or corrupt (%s)",
                            x->path, desc, (unsigned long long)n, (unsigned long long)x->file_size, GZIP_MAX_RATIO,
                            x->what);
    return CT_OK;
}

// Reads n data bytes into *dst (ct_malloc'ed here, growing as the data
// arrives: a gzip file is checked only as it is inflated) and checks that
// nothing follows.
static ct_status idx_read_data(idx_file *x, uint8_t **dst, size_t n, const char *desc, ct_error *err) {
    CT_TRY(idx_check_size(x, n, desc, err));
    size_t have = 0, cap = n < IDX_READ_PIECE ? n : IDX_READ_PIECE;
    *dst = ct_malloc(cap);
    while (have < n) {
        if (have == cap) {
            cap = n - cap < cap ? n : 2 * cap;
            *dst = ct_realloc(*dst, cap);
        }
        size_t piece = cap - have;
        CT_TRY(idx_read(x, *dst + have, piece, desc, err));
        have += piece;
    }
    uint8_t extra;
    size_t got;
    CT_TRY(idx_pull(x, &extra, 1, &got, err));
    if (got > 0)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: unexpected data at byte %zu%s, after the %s its header declares (%s)", x->path,
                            x->offset - 1, x->compressed ? " (uncompressed)" : "", desc, x->what);
    if (x->truncated)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: gzip stream truncated after byte %zu (uncompressed) (%s)",
                            x->path, x->offset, x->what);
    return CT_OK;
}

static void idx_close(idx_file *x) {
    if (x->z_ready) inflateEnd(&x->z);
    x->z_ready = false;
    ct_free(x->in);
    x->in = NULL;
    if (x->fd >= 0) close(x->fd);
    x->fd = -1;
}

static ct_status idx_next(ct_stream *s, ct_batch *out, ct_error *err) {
    (void)err;
    idx_data *d = s->impl;
    int64_t i = s->position;
    if (i >= d->n) return CT_OK;
    int64_t px = d->rows * d->cols;
    const uint8_t *src = d->images + i * px;
    float div = d->scale ? 255.0f : 1.0f;
    for (int64_t i = 0; i < px; i++) d->image[i] = (float)src[i] / div;
    d->label = d->labels[i];
    d->weight = 1.0f;
    out->n = 3;
    out->t[0] = ct_tensor_2d(CT_DTYPE_F32, d->rows, d->cols, d->image);
    out->t[1] = ct_tensor_make(CT_DTYPE_I32, 0, NULL, &d->label);
    out->t[2] = ct_tensor_make(CT_DTYPE_F32, 0, NULL, &d->weight);
    return CT_OK;
}

static void idx_describe(const ct_stream *s, char *buf, size_t len) {
    const idx_data *d = s->impl;
    snprintf(buf, len, "idx(%lld images of %lldx%lld, %s)", (long long)d->n, (long long)d->rows, (long long)d->cols,
             d->scale ? "scaled to [0,1]" : "0..255");
}

static void idx_free(ct_stream *s) {
    idx_data *d = s->impl;
    ct_free(d->images);
    ct_free(d->labels);
    ct_free(d->image);
    ct_free(d);
}

static const ct_stream_ops idx_ops = {"idx", idx_next, NULL, idx_free, idx_describe};

static ct_status idx_load(idx_data *d, const ct_idx_params *p, ct_error *err) {
    idx_file im = {.fd = -1}, lb = {.fd = -1};
    uint32_t idims[3], ldims[1];
    ct_status st = idx_open(&im, p->images_path, "IDX images", IDX_IMAGES_MAGIC, idims, err);
    if (st == CT_OK) {
        d->n = idims[0];
        d->rows = idims[1];
        d->cols = idims[2];
        char desc[96];
        snprintf(desc, sizeof desc, "%lld images of %lldx%lld", (long long)d->n, (long long)d->rows,
                 (long long)d->cols);
        // Dims are below 2^32 each; the product of three can pass 2^64.
        if ((double)d->n * (double)d->rows * (double)d->cols > 1e12)
            st = ct_error_set(err, CT_ERR_FORMAT, "%s: the header declares %s, more than 10^12 bytes (IDX images)",
                              p->images_path, desc);
        if (st == CT_OK) st = idx_read_data(&im, &d->images, (size_t)(d->n * d->rows * d->cols), desc, err);
    }
    idx_close(&im);
    if (st != CT_OK) return st;
    if (p->labels_failed) *p->labels_failed = true;  // from here on, any error is the labels file's
    st = idx_open(&lb, p->labels_path, "IDX labels", IDX_LABELS_MAGIC, ldims, err);
    if (st == CT_OK && (int64_t)ldims[0] != d->n)
        st = ct_error_set(err, CT_ERR_FORMAT, "%s holds %u labels but %s holds %lld images", p->labels_path, ldims[0],
                          p->images_path, (long long)d->n);
    if (st == CT_OK) {
        char desc[64];
        snprintf(desc, sizeof desc, "%lld labels", (long long)d->n);
        st = idx_read_data(&lb, &d->labels, (size_t)d->n, desc, err);
    }
    idx_close(&lb);
    for (int64_t i = 0; st == CT_OK && p->n_classes > 0 && i < d->n; i++)
        if (d->labels[i] >= p->n_classes)
            st = ct_error_set(err, CT_ERR_FORMAT, "%s: label %u at byte %lld is not below n_classes %d (IDX labels)",
                              p->labels_path, d->labels[i], (long long)(8 + i), p->n_classes);
    return st;
}

ct_status ct_idx_stream_new(ct_stream **out, const ct_idx_params *p, ct_error *err) {
    *out = NULL;
    if (p->labels_failed) *p->labels_failed = false;
    CT_STREAM_CHECK(p->images_path && p->images_path[0], err, "idx: no images_path given");
    CT_STREAM_CHECK(p->labels_path && p->labels_path[0], err, "idx: no labels_path given");
    CT_STREAM_CHECK(p->n_classes >= 0 && p->n_classes <= 256, err, "idx: n_classes is %d; expected 0..256",
                    p->n_classes);
    idx_data *d = ct_calloc(1, sizeof *d);
    ct_stream *s = ct_stream_alloc(&idx_ops, NULL, d);
    d->scale = p->scale;
    d->n_classes = p->n_classes;
    ct_status st = idx_load(d, p, err);
    if (st != CT_OK) {
        ct_stream_free(s);
        return st;
    }
    d->image = ct_malloc((size_t)(d->rows * d->cols) * sizeof *d->image);
    s->n_out = 3;
    s->sigs[0] = ct_tensor_2d(CT_DTYPE_F32, d->rows, d->cols, NULL);
    s->sigs[1] = ct_tensor_make(CT_DTYPE_I32, 0, NULL, NULL);
    s->sigs[2] = ct_tensor_make(CT_DTYPE_F32, 0, NULL, NULL);
    s->length = d->n;
    // The fingerprint covers the shapes and a hash of the labels and the first
    // image, so MNIST and Fashion-MNIST (same sizes) differ.
    ct_stream_mix(s, (uint64_t)d->n);
    ct_stream_mix(s, (uint64_t)d->rows);
    ct_stream_mix(s, (uint64_t)d->cols);
    ct_stream_mix(s, d->scale);
    ct_stream_mix(s, (uint64_t)d->n_classes);
    uint64_t h = 0;
    for (int64_t i = 0; i < d->n; i++) h = h * 31 + d->labels[i];
    for (int64_t i = 0; i < d->rows * d->cols; i++) h = h * 31 + d->images[i];
    ct_stream_mix(s, h);
    *out = s;
    return CT_OK;
}
