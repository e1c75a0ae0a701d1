// safetensors and checkpoints: round trips, an independent reader
// (tests/read_safetensors.py, numpy), every kind of damage a file can take,
// writers killed mid-write, the pointer's fallback, and retention.
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include "capture.h"
#include "check.h"
#include "scratch.h"
#include "ctrax/core/log.h"
#include "core/fs.h"
#include "ctrax/train/checkpoint.h"

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fwrite(data, 1, n, f);
    fclose(f);
}

static bool exists(const char *path) { return access(path, F_OK) == 0; }

static int python(const char *script, const char *a, const char *b) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/%s' '%s' '%s'", g_tests_dir, script, a, b);
    fflush(stdout);
    int rc = system(cmd);
    return rc == -1 ? -1 : WEXITSTATUS(rc);
}

// Flips one bit of the byte at offset (from the end when offset < 0).
static void flip_byte(const char *path, long offset) {
    int fd = open(path, O_RDWR);
    CHECK(fd >= 0);
    struct stat sb;
    fstat(fd, &sb);
    off_t at = offset >= 0 ? offset : sb.st_size + offset;
    unsigned char c;
    CHECK(pread(fd, &c, 1, at) == 1);
    c ^= 0x10;
    CHECK(pwrite(fd, &c, 1, at) == 1);
    close(fd);
}

static void truncate_by(const char *path, long n) {
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    CHECK(truncate(path, sb.st_size - n) == 0);
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return (uint16_t)(u >> 16);  // the test's values are exact in bf16
}

// ---- a standard checkpoint -----------------------------------------------------

typedef struct tspec {
    const char *file, *name;
    ct_dtype dtype;
    int ndim;
    int64_t shape[3];
    double start, step;  // value i is start + version + step * i
} tspec;

static const tspec SPEC[] = {
    {"weights.safetensors", "Serial/Dense[0]/kernel", CT_DTYPE_F32, 2, {4, 3}, -1.0, 0.5},
    {"weights.safetensors", "Serial/Dense[0]/bias", CT_DTYPE_F32, 1, {3}, 0.25, 0.25},
    {"weights.safetensors", "Serial/Embedding/table", CT_DTYPE_BF16, 2, {3, 3}, 1.0, 1.0},
    {"weights.safetensors", "state/Dropout/counter", CT_DTYPE_I32, 1, {1}, 7.0, 0.0},
    {"weights.safetensors", "Serial/Dense[1]/kernel", CT_DTYPE_F32, 2, {3, 5}, 2.0, -0.25},
    {"slots.safetensors", "Serial/Dense[0]/kernel/m", CT_DTYPE_F32, 2, {4, 3}, 0.0, 0.125},
    {"slots.safetensors", "Serial/Dense[0]/kernel/v", CT_DTYPE_F32, 2, {4, 3}, 3.0, 1.0},
};
#define N_SPEC ((int)(sizeof SPEC / sizeof SPEC[0]))

static int64_t spec_numel(const tspec *s) {
    int64_t n = 1;
    for (int d = 0; d < s->ndim; d++) n *= s->shape[d];
    return n;
}

static void fill(void *buf, const tspec *s, int version, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        double v = s->start + version + s->step * (double)i;
        if (s->dtype == CT_DTYPE_F32) ((float *)buf)[i] = (float)v;
        else if (s->dtype == CT_DTYPE_I32) ((int32_t *)buf)[i] = (int32_t)v;
        else ((uint16_t *)buf)[i] = to_bf16((float)v);
    }
}

// The arrays of SPEC with a version's values (and room for one big tensor).
typedef struct tset {
    void *data[N_SPEC + 1];
    ct_tensor t[N_SPEC + 1];
} tset;

static void tset_make(tset *s, int version) {
    for (int i = 0; i < N_SPEC; i++) {
        const tspec *sp = &SPEC[i];
        int64_t n = spec_numel(sp);
        s->data[i] = calloc((size_t)n, ct_dtype_size(sp->dtype));
        fill(s->data[i], sp, version, n);
        s->t[i] = ct_tensor_make(sp->dtype, sp->ndim, sp->shape, s->data[i]);
    }
    s->data[N_SPEC] = NULL;
}

static void tset_free(tset *s) {
    for (int i = 0; i <= N_SPEC; i++) free(s->data[i]);
}

// Writes the standard checkpoint `name` holding version's values; big > 0
// adds a tensor "big" of that many floats to weights.safetensors.
static ct_status make_ckpt(const char *dir, const char *name, int64_t step, int version, bool keep, bool pointer,
                           int64_t big, ct_error *err) {
    tset s;
    tset_make(&s, version);
    ct_named_tensor w[N_SPEC + 1], sl[N_SPEC];
    int nw = 0, ns = 0;
    for (int i = 0; i < N_SPEC; i++) {
        if (!strcmp(SPEC[i].file, "weights.safetensors")) w[nw++] = (ct_named_tensor){SPEC[i].name, s.t[i]};
        else sl[ns++] = (ct_named_tensor){SPEC[i].name, s.t[i]};
    }
    if (big > 0) {
        float *b = malloc((size_t)big * sizeof *b);
        for (int64_t i = 0; i < big; i++) b[i] = (float)(version + i % 1000);
        s.data[N_SPEC] = b;
        w[nw++] = (ct_named_tensor){"big", ct_tensor_1d(CT_DTYPE_F32, big, b)};
    }
    ct_checkpoint_options o = ct_checkpoint_default_options();
    o.step = step;
    o.keep = keep;
    o.update_pointer = pointer;
    ct_checkpoint_writer *cw;
    char state[128];
    snprintf(state, sizeof state, "{\"step\": %lld, \"version\": %d}", (long long)step, version);
    ct_kv meta[] = {{"format", "ctrax"}};
    ct_status st = ct_checkpoint_writer_begin(&cw, dir, name, &o, err);
    if (st == CT_OK) {
        st = ct_checkpoint_writer_add_tensors(cw, "weights.safetensors", w, nw, meta, 1, err);
        if (st == CT_OK) st = ct_checkpoint_writer_add_tensors(cw, "slots.safetensors", sl, ns, NULL, 0, err);
        if (st == CT_OK) st = ct_checkpoint_writer_set_state(cw, state, err);
        if (st == CT_OK) st = ct_checkpoint_writer_commit(cw, err);
        else ct_checkpoint_writer_abort(cw);
    }
    tset_free(&s);
    return st;
}

#define SENTINEL (-12345.0f)

// Requests for every SPEC tensor into freshly allocated destinations filled
// with a sentinel.
typedef struct rset {
    ct_tensor_request r[N_SPEC];
    void *buf[N_SPEC];
} rset;

static void rset_make(rset *rs) {
    for (int i = 0; i < N_SPEC; i++) {
        const tspec *sp = &SPEC[i];
        int64_t n = spec_numel(sp);
        size_t bytes = (size_t)n * ct_dtype_size(sp->dtype);
        rs->buf[i] = malloc(bytes);
        float s = SENTINEL;
        for (size_t k = 0; k + 4 <= bytes; k += 4) memcpy((char *)rs->buf[i] + k, &s, 4);
        if (bytes % 4) memset((char *)rs->buf[i] + bytes - bytes % 4, 0xAB, bytes % 4);
        rs->r[i] = (ct_tensor_request){.file = sp->file, .name = sp->name,
            .dest = ct_tensor_make(sp->dtype, sp->ndim, sp->shape, rs->buf[i]), .result = CT_LOAD_PENDING};
    }
}

static void rset_free(rset *rs) {
    for (int i = 0; i < N_SPEC; i++) free(rs->buf[i]);
}

// Every destination still holds the sentinel.
static bool rset_untouched(const rset *rs) {
    for (int i = 0; i < N_SPEC; i++) {
        int64_t n = spec_numel(&SPEC[i]);
        size_t bytes = (size_t)n * ct_dtype_size(SPEC[i].dtype);
        for (size_t k = 0; k + 4 <= bytes; k += 4) {
            float v;
            memcpy(&v, (char *)rs->buf[i] + k, 4);
            if (v != SENTINEL) return false;
        }
    }
    return true;
}

// Destination i holds version's values.
static bool rset_holds(const rset *rs, int i, int version) {
    const tspec *sp = &SPEC[i];
    int64_t n = spec_numel(sp);
    size_t bytes = (size_t)n * ct_dtype_size(sp->dtype);
    void *want = malloc(bytes);
    fill(want, sp, version, n);
    bool ok = memcmp(want, rs->buf[i], bytes) == 0;
    free(want);
    return ok;
}

static bool rset_holds_all(const rset *rs, int version) {
    for (int i = 0; i < N_SPEC; i++)
        if (!rset_holds(rs, i, version)) return false;
    return true;
}

// A failed read of dir/name: the status, the message naming what it must, and
// every destination untouched.
static void expect_read_fails(const char *dir, const char *name, ct_load_mode mode, ct_tensor_request *extra,
                              const char *must1, const char *must2, const char *must3) {
    rset rs;
    rset_make(&rs);
    ct_error err = {0};
    ct_status st;
    if (extra) {
        ct_tensor_request all[N_SPEC + 1];
        memcpy(all, rs.r, sizeof rs.r);
        all[N_SPEC] = *extra;
        st = ct_checkpoint_read(dir, name, all, N_SPEC + 1, mode, NULL, &err);
    } else st = ct_checkpoint_read(dir, name, rs.r, N_SPEC, mode, NULL, &err);
    CHECK_MSG(st != CT_OK, "read of %s/%s should fail", dir, name);
    const char *must[] = {must1, must2, must3};
    for (int i = 0; i < 3; i++)
        if (must[i]) CHECK_MSG(strstr(err.msg, must[i]) != NULL, "message lacks \"%s\": %s", must[i], err.msg);
    CHECK_MSG(rset_untouched(&rs), "a failed read wrote into a destination (%s)", err.msg);
    printf("  error as expected: %s\n", err.msg);
    rset_free(&rs);
}

// ---- safetensors ---------------------------------------------------------------

static void test_safetensors_roundtrip(void) {
    // Odd element counts everywhere, so alignment depends on the layout.
    float a[6], sc = 42.0f, z[7];
    int32_t b[5];
    uint16_t c[3];
    for (int i = 0; i < 6; i++) a[i] = -1.0f + 0.5f * (float)i;
    for (int i = 0; i < 5; i++) b[i] = -7 + 3 * i;
    for (int i = 0; i < 3; i++) c[i] = to_bf16(1.0f + 2.0f * (float)i);
    for (int i = 0; i < 7; i++) z[i] = 100.0f + (float)i;
    ct_named_tensor t[] = {
        {"c/bf16", ct_tensor_1d(CT_DTYPE_BF16, 3, c)},  // first in the list, last in the file
        {"a", ct_tensor_2d(CT_DTYPE_F32, 2, 3, a)},
        {"b", ct_tensor_1d(CT_DTYPE_I32, 5, b)},
        {"scalar", ct_tensor_make(CT_DTYPE_F32, 0, NULL, &sc)},
        {"empty", ct_tensor_2d(CT_DTYPE_F32, 0, 4, NULL)},
        {"z \"quoted\"", ct_tensor_1d(CT_DTYPE_F32, 7, z)},
    };
    ct_kv meta[] = {{"format", "ctrax"}, {"note", "a \"quoted\" value"}};
    const char *path = tmp_path("t.safetensors");
    ct_error err = {0};
    CHECK_OK(ct_safetensors_write(path, t, 6, meta, 2, &err), &err);

    ct_safetensors *st;
    CHECK_OK(ct_safetensors_open(&st, path, &err), &err);
    if (!st) return;
    CHECK(ct_safetensors_count(st) == 6);
    CHECK(!strcmp(ct_safetensors_metadata(st, "format"), "ctrax"));
    CHECK(!strcmp(ct_safetensors_metadata(st, "note"), "a \"quoted\" value"));
    CHECK(ct_safetensors_metadata(st, "nope") == NULL);
    CHECK(ct_safetensors_find(st, "nope") < 0);
    size_t size;
    const unsigned char *bytes = ct_safetensors_bytes(st, &size);
    uint64_t hlen;
    memcpy(&hlen, bytes, 8);
    CHECK((8 + hlen) % 8 == 0);
    for (int i = 0; i < 6; i++) {
        int k = ct_safetensors_find(st, t[i].name);
        CHECK_MSG(k >= 0, "tensor %s", t[i].name);
        if (k < 0) continue;
        CHECK(!strcmp(ct_safetensors_name(st, k), t[i].name));
        ct_tensor r = ct_safetensors_tensor(st, k);
        CHECK(ct_tensor_same_sig(&r, &t[i].tensor));
        CHECK_MSG(((uintptr_t)r.data - (uintptr_t)bytes) % ct_dtype_size(r.dtype) == 0, "%s is aligned", t[i].name);
        if (ct_tensor_nbytes(&r)) CHECK(memcmp(r.data, t[i].tensor.data, ct_tensor_nbytes(&r)) == 0);
    }
    // File order: 4-byte dtypes first, in the caller's order, then bf16.
    CHECK(!strcmp(ct_safetensors_name(st, 0), "a"));
    CHECK(!strcmp(ct_safetensors_name(st, ct_safetensors_count(st) - 1), "c/bf16"));
    ct_safetensors_close(st);

    const char *spec = tmp_path("t.spec.json");
    write_text(spec,
               "{\"exact\": true, \"metadata\": {\"format\": \"ctrax\", \"note\": \"a \\\"quoted\\\" value\"},"
               " \"tensors\": {"
               "\"a\": {\"dtype\": \"F32\", \"shape\": [2, 3], \"start\": -1, \"step\": 0.5},"
               "\"b\": {\"dtype\": \"I32\", \"shape\": [5], \"start\": -7, \"step\": 3},"
               "\"c/bf16\": {\"dtype\": \"BF16\", \"shape\": [3], \"start\": 1, \"step\": 2},"
               "\"scalar\": {\"dtype\": \"F32\", \"shape\": [], \"start\": 42, \"step\": 0},"
               "\"empty\": {\"dtype\": \"F32\", \"shape\": [0, 4], \"start\": 0, \"step\": 0},"
               "\"z \\\"quoted\\\"\": {\"dtype\": \"F32\", \"shape\": [7], \"start\": 100, \"step\": 1}}}");
    CHECK_MSG(python("read_safetensors.py", path, spec) == 0, "numpy reads %s", path);

    // Bad arguments.
    ct_named_tensor dup[] = {{"x", ct_tensor_1d(CT_DTYPE_F32, 1, a)}, {"x", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    CHECK(ct_safetensors_write(tmp_path("dup.safetensors"), dup, 2, NULL, 0, &err) == CT_ERR_ARG);
    CHECK(strstr(err.msg, "'x'") != NULL);
    ct_named_tensor meta_name[] = {{"__metadata__", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    CHECK(ct_safetensors_write(tmp_path("m.safetensors"), meta_name, 1, NULL, 0, &err) == CT_ERR_ARG);
    ct_named_tensor noname[] = {{"", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    CHECK(ct_safetensors_write(tmp_path("e.safetensors"), noname, 1, NULL, 0, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "tensor 0 has an invalid name ''"), "%s", err.msg);
    ct_named_tensor negative[] = {{"x", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    negative[0].tensor.shape[0] = -1;
    CHECK(ct_safetensors_write(tmp_path("e.safetensors"), negative, 1, NULL, 0, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "tensor 'x' has a negative dim"), "%s", err.msg);
    ct_named_tensor rank7[] = {{"x", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    rank7[0].tensor.ndim = CT_MAX_DIMS + 1;
    CHECK(ct_safetensors_write(tmp_path("e.safetensors"), rank7, 1, NULL, 0, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "tensor 'x' has an invalid dtype or rank"), "%s", err.msg);
    CHECK(!exists(tmp_path("e.safetensors")));
    ct_named_tensor nodata[] = {{"x", ct_tensor_1d(CT_DTYPE_F32, 3, NULL)}};
    CHECK(ct_safetensors_write(tmp_path("n.safetensors"), nodata, 1, NULL, 0, &err) == CT_ERR_ARG);
    nodata[0].tensor = ct_tensor_1d(CT_DTYPE_F32, 1, NULL);  // one element needs data too
    CHECK(ct_safetensors_write(tmp_path("n.safetensors"), nodata, 1, NULL, 0, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "tensor 'x' has no data"), "%s", err.msg);
    CHECK(!exists(tmp_path("dup.safetensors")) && !exists(tmp_path("n.safetensors")));
    // The header is UTF-8 JSON with unique keys: a name or metadata that is
    // not UTF-8 (Python's json refuses the file), or a metadata key twice
    // (this library's reader refuses it), is not written.
    ct_named_tensor bad_name[] = {{"w\xff", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    CHECK(ct_safetensors_write(tmp_path("u.safetensors"), bad_name, 1, NULL, 0, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "tensor 0's name is not valid UTF-8"), "%s", err.msg);
    ct_named_tensor one[] = {{"x", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    ct_kv twice[] = {{"a", "1"}, {"a", "2"}}, overlong[] = {{"k", "\xc0\xaf"}};
    CHECK(ct_safetensors_write(tmp_path("u.safetensors"), one, 1, twice, 2, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "metadata key 'a' is given twice"), "%s", err.msg);
    CHECK(ct_safetensors_write(tmp_path("u.safetensors"), one, 1, overlong, 1, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "metadata entry 0 is not valid UTF-8"), "%s", err.msg);
    CHECK(!exists(tmp_path("u.safetensors")));
    // The header is padded with spaces to the next multiple of 8 (with the
    // 8 bytes of its length), and no further: names of 1 to 8 bytes give
    // every remainder.
    for (int k = 1; k <= 8; k++) {
        char name[9] = "nnnnnnnn";
        name[k] = '\0';
        ct_named_tensor pad[] = {{name, ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
        CHECK_OK(ct_safetensors_write(tmp_path("p.safetensors"), pad, 1, NULL, 0, &err), &err);
        ct_safetensors *ps = NULL;
        CHECK_OK(ct_safetensors_open(&ps, tmp_path("p.safetensors"), &err), &err);
        if (!ps) continue;
        size_t n_bytes;
        const char *raw = ct_safetensors_bytes(ps, &n_bytes);
        uint64_t h;
        memcpy(&h, raw, 8);
        size_t spaces = 0;
        while (spaces < h && raw[8 + h - 1 - spaces] == ' ') spaces++;
        CHECK_MSG((8 + h) % 8 == 0 && spaces < 8 && raw[8 + h - 1 - spaces] == '}',
                  "name of %d bytes: header of %llu bytes, %zu spaces at its end", k, (unsigned long long)h, spaces);
        ct_safetensors_close(ps);
    }
    // UTF-8 of every length is written (and read back by name).
    ct_named_tensor utf8[] = {{"caf\xc3\xa9/\xe2\x82\xac/\xf0\x9f\x98\x80", ct_tensor_1d(CT_DTYPE_F32, 1, a)}};
    CHECK_OK(ct_safetensors_write(tmp_path("u.safetensors"), utf8, 1, NULL, 0, &err), &err);
    ct_safetensors *f = NULL;
    CHECK_OK(ct_safetensors_open(&f, tmp_path("u.safetensors"), &err), &err);
    CHECK(f && ct_safetensors_find(f, utf8[0].name) == 0);
    ct_safetensors_close(f);
    // A tensor of the largest rank, CT_MAX_DIMS, is written and read back.
    int64_t shape6[CT_MAX_DIMS] = {1, 2, 1, 3, 1, 1};
    ct_named_tensor rank6[] = {{"r6", ct_tensor_make(CT_DTYPE_F32, CT_MAX_DIMS, shape6, a)}};
    CHECK_OK(ct_safetensors_write(tmp_path("r6.safetensors"), rank6, 1, NULL, 0, &err), &err);
    CHECK_OK(ct_safetensors_open(&f, tmp_path("r6.safetensors"), &err), &err);
    if (f) {
        ct_tensor r = ct_safetensors_tensor(f, 0);
        CHECK(ct_tensor_same_sig(&r, &rank6[0].tensor) && !memcmp(r.data, a, sizeof a));
        ct_safetensors_close(f);
    }
}

// A file from a header text and n data bytes.
static void write_st(const char *path, const char *header, size_t data_bytes) {
    uint64_t hlen = strlen(header);
    size_t n = 8 + hlen + data_bytes;
    unsigned char *buf = calloc(n, 1);
    memcpy(buf, &hlen, 8);
    memcpy(buf + 8, header, hlen);
    write_raw(path, buf, n);
    free(buf);
}

static void expect_open_fails(const char *path, const char *must1, const char *must2) {
    ct_safetensors *st = NULL;
    ct_error err = {0};
    ct_status s = ct_safetensors_open(&st, path, &err);
    CHECK_MSG(s == CT_ERR_FORMAT, "%s should not open (status %d)", path, (int)s);
    CHECK(st == NULL);
    CHECK_MSG(strstr(err.msg, path) != NULL, "message names the file: %s", err.msg);
    if (must1) CHECK_MSG(strstr(err.msg, must1) != NULL, "message lacks \"%s\": %s", must1, err.msg);
    if (must2) CHECK_MSG(strstr(err.msg, must2) != NULL, "message lacks \"%s\": %s", must2, err.msg);
    printf("  error as expected: %s\n", err.msg);
    ct_safetensors_close(st);
}

static void test_safetensors_damage(void) {
    const char *p = tmp_path("bad.safetensors");
    write_raw(p, "abc", 3);
    expect_open_fails(p, "shorter", NULL);
    write_raw(p, "\x02\0\0\0\0\0\0", 7);  // one byte short of the length
    expect_open_fails(p, "7 bytes, shorter", NULL);
    uint64_t huge = 1000;
    write_raw(p, &huge, 8);
    expect_open_fails(p, "header length", "truncated");
    write_st(p, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]", 8);
    expect_open_fails(p, "not valid JSON", NULL);
    write_st(p, "[1, 2]", 0);
    expect_open_fails(p, "not a JSON object", NULL);
    write_st(p, "{\"w\": {\"dtype\": \"F64\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8);
    expect_open_fails(p, "'w'", "F64");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [3], \"data_offsets\": [0, 8]}}", 8);
    expect_open_fails(p, "'w'", "needs 12 bytes");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 8]}}", 8);
    expect_open_fails(p, "'w'", "needs 4 bytes");  // a span longer than the tensor
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [-2], \"data_offsets\": [0, 8]}}", 8);
    expect_open_fails(p, "'w'", "shape[0]");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [8, 0]}}", 8);
    expect_open_fails(p, "'w'", "reversed");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2]}}", 8);
    expect_open_fails(p, "'w'", "data_offsets");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8, 8]}}", 8);
    expect_open_fails(p, "'w'", "\"data_offsets\" is not [begin, end]");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": \"2\", \"data_offsets\": [0, 4]}}", 4);
    expect_open_fails(p, "'w'", "no \"shape\" array");
    write_st(p, "{\"w\": 3}", 0);
    expect_open_fails(p, "'w'", "header entry is not an object");
    write_st(p,
             "{\"u\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]},"
             " \"v\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [4, 12]}}",
             12);
    expect_open_fails(p, "'u' and 'v' overlap", NULL);
    write_st(p,
             "{\"u\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
             " \"v\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [8, 12]}}",
             12);
    expect_open_fails(p, "'v'", "unreferenced");
    write_st(p, "{\"u\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 8);
    expect_open_fails(p, "after the last tensor 'u'", NULL);
    write_st(p,
             "{\"u\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
             " \"u\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [4, 8]}}",
             8);
    expect_open_fails(p, "'u' appears twice", NULL);
    write_st(p, "{\"\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fails(p, "empty name", NULL);  // ct_safetensors_write refuses one too
    write_st(p, "{\"__metadata__\": {\"k\": 3}}", 0);
    expect_open_fails(p, "__metadata__", NULL);
    // An empty tensor at the offset where the next one starts is no
    // overlap, in whichever order the header lists them.
    write_st(p,
             "{\"z\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]},"
             " \"e\": {\"dtype\": \"F32\", \"shape\": [0], \"data_offsets\": [0, 0]}}",
             4);
    ct_safetensors *ok = NULL;
    ct_error ok_err = {0};
    CHECK_OK(ct_safetensors_open(&ok, p, &ok_err), &ok_err);
    CHECK(ok && ct_safetensors_count(ok) == 2 && !strcmp(ct_safetensors_name(ok, 0), "e"));
    ct_safetensors_close(ok);
    // The header is UTF-8 (Hugging Face's reader refuses anything else, and
    // ct_safetensors_write would refuse the name).
    write_st(p, "{\"w\xff\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fails(p, "not UTF-8", "byte 11");
    // Limits a crafted header must not get past: a length that runs 1 to 8
    // bytes past the end (the 8 bytes of the length itself), a length under
    // 2, a rank above CT_MAX_DIMS, 2^62 elements (whose byte count wraps to
    // 0 in 64 bits, matching data_offsets [0, 0]) and a dimension of 2^53
    // (no longer exact through a double).
    unsigned char past[16] = {12};  // a 12-byte header in a 16-byte file
    memcpy(past + 8, "{}      ", 8);
    write_raw(p, past, sizeof past);
    expect_open_fails(p, "header length 12", "runs past the end");
    unsigned char tiny[9] = {1, 0, 0, 0, 0, 0, 0, 0, '{'};
    write_raw(p, tiny, sizeof tiny);
    expect_open_fails(p, "header length 1 ", "not plausible");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fails(p, "'w'", "rank 7 is above 6");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [2147483648, 2147483648], \"data_offsets\": [0, 0]}}", 0);
    expect_open_fails(p, "'w'", "shape is too large");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [9007199254740992], \"data_offsets\": [0, 0]}}", 0);
    expect_open_fails(p, "'w'", "shape[0] is not a non-negative integer");
    // 2^96 elements: the product wraps 64 bits (to 0) before it passes 2^62.
    write_st(p,
             "{\"w\": {\"dtype\": \"F32\", \"shape\": [4294967296, 4294967296, 4294967296], \"data_offsets\": [0, 0]}}",
             0);
    expect_open_fails(p, "'w'", "shape is too large");
    write_st(p, "{\"w\": {\"dtype\": \"F32\", \"shape\": [1.5], \"data_offsets\": [0, 4]}}", 4);
    expect_open_fails(p, "'w'", "shape[0] is not a non-negative integer");
    write_st(p, "{}", 8);
    expect_open_fails(p, "8 bytes of data but no tensor", NULL);
    // A header of many values (a shape of 2^21 zeros, 4 MB) is refused by
    // their count before cJSON (some 80 bytes a value) takes them: the 100
    // MB one of 50M zeros took 3.9 GB of RSS to parse. The count skips
    // strings, escaped quotes included: a name full of commas is one value.
    {
        const char *head = "{\"w\": {\"dtype\": \"F32\", \"shape\": [";
        const char *tail = "], \"data_offsets\": [0, 0]}}";
        size_t n_zeros = (size_t)1 << 21, len = strlen(head) + 2 * n_zeros + strlen(tail);
        char *big = malloc(len + 1);
        char *q = big + sprintf(big, "%s", head);
        for (size_t i = 0; i < n_zeros; i++) q += sprintf(q, i ? ",0" : "0");
        sprintf(q, "%s", tail);
        write_st(p, big, 0);
        expect_open_fails(p, "the header holds up to 2097159 JSON values", "refused before parsing");
        // 2^21 commas inside a name (with an escaped quote before them) and
        // the rank-7 shape after them: a string's commas count for nothing.
        q = big + sprintf(big, "{\"w\\\"");
        for (size_t i = 0; i < n_zeros; i++) *q++ = ',';
        sprintf(q, "\": {\"dtype\": \"F32\", \"shape\": [1, 1, 1, 1, 1, 1, 1], \"data_offsets\": [0, 4]}}");
        write_st(p, big, 4);
        expect_open_fails(p, "rank 7 is above 6", NULL);
        free(big);
    }
    // A header over Hugging Face's 100 MB limit (a sparse file long enough to
    // hold it) is refused by its length, before a byte of it is read.
    uint64_t over = 100u * 1000u * 1000u + 1;
    write_raw(p, &over, 8);
    CHECK(truncate(p, (off_t)(8 + over)) == 0);
    expect_open_fails(p, "header length 100000001", "not plausible");
    // ... and one of exactly 100 MB is not: one tensor's JSON padded with
    // spaces (the format allows them after the object) to 10^8 bytes, then
    // its 4 data bytes, opens and reads back. Written once (100 MB on disk,
    // removed at once): about 0.3 s (0.5 s under ASan).
    {
        const char *json = "{\"w\": {\"dtype\": \"F32\", \"shape\": [1], \"data_offsets\": [0, 4]}}";
        const uint64_t at_max = 100u * 1000u * 1000u;
        const char *edge_path = tmp_path("edge.safetensors");
        FILE *f = fopen(edge_path, "wb");
        CHECK(f != NULL);
        static char spaces[1 << 20];
        memset(spaces, ' ', sizeof spaces);
        uint64_t left = at_max - strlen(json);
        bool wrote = f && fwrite(&at_max, 8, 1, f) == 1 && fputs(json, f) >= 0;
        while (wrote && left > 0) {
            size_t k = left < sizeof spaces ? (size_t)left : sizeof spaces;
            wrote = fwrite(spaces, 1, k, f) == k;
            left -= k;
        }
        const float value = 2.5f;
        wrote = wrote && fwrite(&value, 4, 1, f) == 1;
        if (f) wrote = fclose(f) == 0 && wrote;
        CHECK_MSG(wrote, "%s: could not write the 100 MB file", edge_path);
        ct_safetensors *st = NULL;
        ct_error edge_err = {0};
        ct_status s = ct_safetensors_open(&st, edge_path, &edge_err);
        CHECK_MSG(s == CT_OK, "a header of exactly 100000000 bytes was refused: %s", edge_err.msg);
        if (s == CT_OK) {
            ct_tensor w = ct_safetensors_tensor(st, 0);
            CHECK(ct_safetensors_count(st) == 1 && !strcmp(ct_safetensors_name(st, 0), "w") && w.shape[0] == 1 &&
                  ((const float *)w.data)[0] == value);
            printf("  a header of exactly 100000000 bytes opens: 1 tensor, w = %g\n", ((const float *)w.data)[0]);
        }
        ct_safetensors_close(st);
        CHECK(unlink(edge_path) == 0);
    }

    // A good file cut short: the tensor it cuts is named.
    float x[4] = {1, 2, 3, 4}, y[4] = {5, 6, 7, 8};
    ct_named_tensor t[] = {{"first", ct_tensor_1d(CT_DTYPE_F32, 4, x)}, {"second", ct_tensor_1d(CT_DTYPE_F32, 4, y)}};
    ct_error err = {0};
    CHECK_OK(ct_safetensors_write(p, t, 2, NULL, 0, &err), &err);
    truncate_by(p, 6);
    expect_open_fails(p, "'second'", "truncated");
    CHECK_OK(ct_safetensors_write(p, t, 2, NULL, 0, &err), &err);
    truncate_by(p, 1);  // the last tensor one byte short
    expect_open_fails(p, "'second'", "truncated");
}

// ---- checkpoints ---------------------------------------------------------------

static void test_checkpoint_roundtrip(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("run1"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_1", 1, 1, false, true, 0, &err), &err);

    // The files, the manifest and the pointer as another program sees them.
    char *text;
    CHECK_OK(ct_fs_read(tmp_path("run1/checkpoint"), &text, NULL, &err), &err);
    CHECK(text && !strcmp(text, "model_1\n"));
    free(text);
    CHECK_OK(ct_fs_read(tmp_path("run1/model_1/manifest.json"), &text, NULL, &err), &err);
    cJSON *m = cJSON_Parse(text);
    free(text);
    CHECK(m != NULL);
    CHECK(!strcmp(cJSON_GetObjectItem(m, "format")->valuestring, "ctrax-checkpoint"));
    CHECK(cJSON_GetObjectItem(m, "version")->valuedouble == 1);
    CHECK(cJSON_GetObjectItem(m, "step")->valuedouble == 1);
    int nfiles = 0;
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(m, "files")) {
        nfiles++;
        char path[2048];
        snprintf(path, sizeof path, "%s/model_1/%s", dir, cJSON_GetObjectItem(f, "name")->valuestring);
        char *data;
        size_t n;
        CHECK_OK(ct_fs_read(path, &data, &n, &err), &err);
        // zlib's crc32 of the file, computed here apart from the writer.
        char hex[16];
        snprintf(hex, sizeof hex, "%08lx", crc32(crc32(0, Z_NULL, 0), (const Bytef *)data, (uInt)n));
        CHECK_MSG(!strcmp(hex, cJSON_GetObjectItem(f, "crc32")->valuestring), "crc32 of %s", path);
        CHECK(cJSON_GetObjectItem(f, "bytes")->valuedouble == (double)n);
        free(data);
    }
    CHECK(nfiles == 3);
    cJSON_Delete(m);

    // Read back by name, all of it.
    rset rs;
    rset_make(&rs);
    char *state = NULL;
    CHECK_OK(ct_checkpoint_read(dir, "model_1", rs.r, N_SPEC, CT_LOAD_EXACT, &state, &err), &err);
    CHECK(rset_holds_all(&rs, 1));
    for (int i = 0; i < N_SPEC; i++) CHECK(rs.r[i].result == CT_LOAD_LOADED);
    CHECK(state && !strcmp(state, "{\"step\": 1, \"version\": 1}"));
    free(state);
    rset_free(&rs);

    // The handle API.
    ct_checkpoint *c;
    CHECK_OK(ct_checkpoint_open(&c, dir, "model_1", &err), &err);
    if (c) {
        CHECK(ct_checkpoint_step(c) == 1 && !ct_checkpoint_kept(c) && !strcmp(ct_checkpoint_name(c), "model_1"));
        CHECK(ct_checkpoint_file_count(c) == 3);
        const ct_safetensors *w = ct_checkpoint_tensors(c, "weights.safetensors");
        CHECK(w && ct_safetensors_count(w) == 5 && !strcmp(ct_safetensors_metadata(w, "format"), "ctrax"));
        CHECK(ct_checkpoint_tensors(c, "state.json") == NULL && ct_checkpoint_tensors(c, "nope") == NULL);
        ct_checkpoint_close(c);
    }
    char name[CT_CHECKPOINT_NAME_MAX];
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    CHECK(!strcmp(name, "model_1"));
    CHECK(!exists(tmp_path("run1/.tmp-model_1-0")));

    // numpy finds every tensor by name with its values.
    const char *spec = tmp_path("run1.spec.json");
    write_text(spec,
               "{\"exact\": true, \"metadata\": {\"format\": \"ctrax\"}, \"tensors\": {"
               "\"Serial/Dense[0]/kernel\": {\"dtype\": \"F32\", \"shape\": [4, 3], \"start\": 0, \"step\": 0.5},"
               "\"Serial/Dense[0]/bias\": {\"dtype\": \"F32\", \"shape\": [3], \"start\": 1.25, \"step\": 0.25},"
               "\"Serial/Embedding/table\": {\"dtype\": \"BF16\", \"shape\": [3, 3], \"start\": 2, \"step\": 1},"
               "\"state/Dropout/counter\": {\"dtype\": \"I32\", \"shape\": [1], \"start\": 8, \"step\": 0},"
               "\"Serial/Dense[1]/kernel\": {\"dtype\": \"F32\", \"shape\": [3, 5], \"start\": 3, \"step\": -0.25}}}");
    CHECK_MSG(python("read_safetensors.py", tmp_path("run1/model_1/weights.safetensors"), spec) == 0,
              "numpy reads the checkpoint's weights");

    // Writing the same name again replaces it whole.
    CHECK_OK(make_ckpt(dir, "model_1", 1, 5, false, true, 0, &err), &err);
    rset_make(&rs);
    CHECK_OK(ct_checkpoint_read(dir, "model_1", rs.r, N_SPEC, CT_LOAD_EXACT, NULL, &err), &err);
    CHECK(rset_holds_all(&rs, 5));
    rset_free(&rs);
    ct_checkpoint_info *infos;
    int n;
    CHECK_OK(ct_checkpoint_list(dir, &infos, &n, &err), &err);
    CHECK(n == 1 && infos[0].complete && infos[0].step == 1);
    free(infos);
}

static void test_writer_arguments(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("args"));
    ct_checkpoint_writer *w = NULL;
    ct_error err = {0};
    const char *bad[] = {"", ".hidden", "a/b", "checkpoint", "../up"};
    for (int i = 0; i < 5; i++) {
        CHECK_MSG(ct_checkpoint_writer_begin(&w, dir, bad[i], NULL, &err) == CT_ERR_ARG, "name '%s'", bad[i]);
        CHECK(w == NULL);
    }
    CHECK_OK(ct_checkpoint_writer_begin(&w, dir, "ok", NULL, &err), &err);
    CHECK(ct_checkpoint_writer_set_state(w, "{not json", &err) == CT_ERR_ARG);
    CHECK(ct_checkpoint_writer_add_bytes(w, "manifest.json", "x", 1, &err) == CT_ERR_ARG);
    CHECK(ct_checkpoint_writer_add_bytes(w, "../x", "x", 1, &err) == CT_ERR_ARG);
    CHECK_OK(ct_checkpoint_writer_add_bytes(w, "notes.txt", "hello", 5, &err), &err);
    CHECK(ct_checkpoint_writer_add_bytes(w, "notes.txt", "again", 5, &err) == CT_ERR_ARG);
    ct_checkpoint_writer_abort(w);
    char tmp[2048];
    snprintf(tmp, sizeof tmp, "%s/.tmp-ok-%ld", dir, (long)getpid());
    CHECK(!exists(tmp));
    ct_checkpoint_info *infos;
    int n;
    CHECK_OK(ct_checkpoint_list(dir, &infos, &n, &err), &err);
    CHECK(n == 0);  // aborted: nothing, and no temporary directory either
    free(infos);

    // A directory of the same name that is not a checkpoint is never replaced
    // nor removed (TensorBoard's train/ lives beside the checkpoints).
    char tb[1100];
    snprintf(tb, sizeof tb, "%s/train", dir);
    mkdir(tb, 0755);
    snprintf(tb, sizeof tb, "%s/train/events.out.tfevents.1.host", dir);
    write_text(tb, "x");
    CHECK_OK(ct_checkpoint_writer_begin(&w, dir, "train", NULL, &err), &err);
    CHECK(ct_checkpoint_writer_commit(w, &err) == CT_ERR_IO && strstr(err.msg, "not a checkpoint"));
    printf("  error as expected: %s\n", err.msg);
    CHECK(ct_checkpoint_remove(dir, "train", &err) == CT_ERR_IO);
    CHECK(exists(tb));
    snprintf(tmp, sizeof tmp, "%s/.tmp-train-%ld", dir, (long)getpid());
    CHECK(!exists(tmp));

    // Empty and scalar tensors round-trip through a checkpoint (no destination
    // is needed for no bytes).
    {
        float one = 3.5f, got = 0;
        ct_named_tensor t[] = {{"empty", ct_tensor_2d(CT_DTYPE_F32, 0, 3, NULL)},
                               {"scalar", ct_tensor_make(CT_DTYPE_F32, 0, NULL, &one)}};
        CHECK_OK(ct_checkpoint_writer_begin(&w, dir, "tiny", NULL, &err), &err);
        CHECK_OK(ct_checkpoint_writer_add_tensors(w, "weights.safetensors", t, 2, NULL, 0, &err), &err);
        CHECK_OK(ct_checkpoint_writer_commit(w, &err), &err);
        ct_tensor_request r[] = {
            {.file = "weights.safetensors", .name = "empty", .dest = ct_tensor_2d(CT_DTYPE_F32, 0, 3, NULL)},
            {.file = "weights.safetensors", .name = "scalar", .dest = ct_tensor_make(CT_DTYPE_F32, 0, NULL, &got)}};
        CHECK_OK(ct_checkpoint_read(dir, "tiny", r, 2, CT_LOAD_EXACT, NULL, &err), &err);
        CHECK(got == 3.5f && r[0].result == CT_LOAD_LOADED);
    }

    // Any file, read back as bytes; a checkpoint without tensors or state.
    CHECK_OK(ct_checkpoint_writer_begin(&w, dir, "notes", NULL, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_bytes(w, "notes.txt", "hello", 5, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_bytes(w, "empty.bin", NULL, 0, &err), &err);
    CHECK_OK(ct_checkpoint_writer_commit(w, &err), &err);
    ct_checkpoint *c;
    CHECK_OK(ct_checkpoint_open(&c, dir, "notes", &err), &err);
    if (c) {
        size_t len = 0;
        const char *b = ct_checkpoint_file_bytes(c, "notes.txt", &len);
        CHECK(b && len == 5 && !strcmp(b, "hello"));
        b = ct_checkpoint_file_bytes(c, "empty.bin", &len);
        CHECK(b && len == 0);
        CHECK(ct_checkpoint_state(c) == NULL && ct_checkpoint_file_bytes(c, "nope", &len) == NULL && len == 0);
        ct_checkpoint_close(c);
    }
}

static void test_load_errors(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("bad"));
    ct_error err = {0};
    const char *names[] = {"m_shape", "m_trunc", "m_flip", "m_hdr", "m_meta", "m_state", "m_nomanifest", "m_trunc2"};
    for (int i = 0; i < 8; i++) CHECK_OK(make_ckpt(dir, names[i], i + 1, 0, false, true, 0, &err), &err);

    // Wrong shape, wrong dtype, missing tensor, missing file: the bad request
    // comes last, so a loader copying as it goes would have written the others.
    float buf[64];
    for (int i = 0; i < 64; i++) buf[i] = SENTINEL;
    ct_tensor_request shape = {.file = "weights.safetensors", .name = "Serial/Dense[0]/kernel",
        .dest = ct_tensor_2d(CT_DTYPE_F32, 3, 4, buf)};
    expect_read_fails(dir, "m_shape", CT_LOAD_STRICT, &shape, "weights.safetensors", "'Serial/Dense[0]/kernel'",
                      "(3,4)");
    ct_tensor_request dtype = {.file = "weights.safetensors", .name = "Serial/Dense[0]/bias",
        .dest = ct_tensor_1d(CT_DTYPE_I32, 3, buf)};
    expect_read_fails(dir, "m_shape", CT_LOAD_STRICT, &dtype, "weights.safetensors", "'Serial/Dense[0]/bias'", "i32");
    ct_tensor_request missing = {.file = "weights.safetensors", .name = "Serial/Dense[7]/kernel",
        .dest = ct_tensor_1d(CT_DTYPE_F32, 3, buf)};
    expect_read_fails(dir, "m_shape", CT_LOAD_STRICT, &missing, "weights.safetensors", "'Serial/Dense[7]/kernel'",
                      "not in the checkpoint");
    ct_tensor_request nofile = {.file = "other.safetensors", .name = "x", .dest = ct_tensor_1d(CT_DTYPE_F32, 3, buf)};
    expect_read_fails(dir, "m_shape", CT_LOAD_STRICT, &nofile, "other.safetensors", "'x'", NULL);
    for (int i = 0; i < 64; i++) CHECK(buf[i] == SENTINEL);
    // A cache found with another shape is left as it is, not an error (EXACT:
    // the tensor counts as asked for).
    shape.cache = true;
    CHECK_OK(ct_checkpoint_read(dir, "m_shape", &shape, 1, CT_LOAD_STRICT, NULL, &err), &err);
    CHECK(shape.result == CT_LOAD_MISMATCH);
    for (int i = 0; i < 64; i++) CHECK(buf[i] == SENTINEL);

    // EXACT with one wrong shape: one problem (not also "not asked for").
    {
        rset rs;
        rset_make(&rs);
        rs.r[6].dest.shape[0] = 5;
        ct_status s = ct_checkpoint_read(dir, "m_shape", rs.r, N_SPEC, CT_LOAD_EXACT, NULL, &err);
        CHECK(s == CT_ERR_SHAPE &&
              strstr(err.msg, "'Serial/Dense[0]/kernel/v' is (4,3) f32 in the checkpoint, expected (5,3) f32"));
        CHECK_MSG(!strstr(err.msg, "more problems"), "%s", err.msg);
        CHECK(rset_untouched(&rs));
        rset_free(&rs);
    }
    // EXACT: a tensor in the file that the model does not have.
    {
        rset rs;
        rset_make(&rs);
        ct_status s = ct_checkpoint_read(dir, "m_shape", rs.r, N_SPEC - 1, CT_LOAD_EXACT, NULL, &err);
        CHECK(s != CT_OK && strstr(err.msg, "'Serial/Dense[0]/kernel/v'") && strstr(err.msg, "not asked for"));
        CHECK(rset_untouched(&rs));
        printf("  error as expected: %s\n", err.msg);
        // STRICT takes the subset.
        CHECK_OK(ct_checkpoint_read(dir, "m_shape", rs.r, N_SPEC - 1, CT_LOAD_STRICT, NULL, &err), &err);
        for (int i = 0; i < N_SPEC - 1; i++) CHECK(rset_holds(&rs, i, 0));
        rset_free(&rs);
    }

    // Truncated: the file and the tensor that is cut.
    truncate_by(tmp_path("bad/m_trunc/weights.safetensors"), 10);
    expect_read_fails(dir, "m_trunc", CT_LOAD_STRICT, NULL, "m_trunc/weights.safetensors", "truncated",
                      "'Serial/Embedding/table'");
    // Truncated in the header.
    truncate(tmp_path("bad/m_trunc2/slots.safetensors"), 100);
    expect_read_fails(dir, "m_trunc2", CT_LOAD_STRICT, NULL, "m_trunc2/slots.safetensors", "truncated", NULL);
    // One flipped bit in a tensor's data: the checksum names the tensor.
    flip_byte(tmp_path("bad/m_flip/weights.safetensors"), -3);
    expect_read_fails(dir, "m_flip", CT_LOAD_STRICT, NULL, "m_flip/weights.safetensors", "crc32",
                      "corrupt data in tensor 'Serial/Embedding/table'");
    // A flipped bit that breaks the header's JSON ('{' at byte 8 becomes 'k').
    flip_byte(tmp_path("bad/m_hdr/slots.safetensors"), 8);
    expect_read_fails(dir, "m_hdr", CT_LOAD_STRICT, NULL, "m_hdr/slots.safetensors", "not valid JSON", "corrupt");
    // A flipped bit in the header that still parses ("ctrax" -> "ctbax").
    {
        char *data;
        size_t n;
        CHECK_OK(ct_fs_read(tmp_path("bad/m_meta/weights.safetensors"), &data, &n, &err), &err);
        char *at = memmem(data, n, "ctrax", 5);
        CHECK(at != NULL);
        long off = at ? (long)(at - data) + 2 : 0;
        free(data);
        flip_byte(tmp_path("bad/m_meta/weights.safetensors"), off);
        expect_read_fails(dir, "m_meta", CT_LOAD_STRICT, NULL, "m_meta/weights.safetensors", "header is corrupt", NULL);
    }
    // The state file.
    flip_byte(tmp_path("bad/m_state/state.json"), 3);
    expect_read_fails(dir, "m_state", CT_LOAD_STRICT, NULL, "m_state/state.json", "crc32", NULL);
    // No manifest: incomplete.
    CHECK(unlink(tmp_path("bad/m_nomanifest/manifest.json")) == 0);
    expect_read_fails(dir, "m_nomanifest", CT_LOAD_STRICT, NULL, "m_nomanifest", "incomplete", NULL);
    expect_read_fails(dir, "m_none", CT_LOAD_STRICT, NULL, "m_none", "no such checkpoint", NULL);
}

static void test_load_by_name(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("ft"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "base", 100, 3, false, true, 0, &err), &err);
    rset rs;
    rset_make(&rs);
    // The fine-tuned model: Dense[1] has another shape, one tensor was renamed.
    rs.r[4].dest.shape[1] = 7;
    rs.r[1].name = "Serial/Dense[0]/bias_renamed";
    capture cap;
    capture_begin(&cap);
    ct_status s = ct_checkpoint_read(dir, "base", rs.r, N_SPEC, CT_LOAD_BY_NAME, NULL, &err);
    char *log = capture_end(&cap);
    CHECK_OK(s, &err);
    CHECK(rs.r[0].result == CT_LOAD_LOADED && rset_holds(&rs, 0, 3));
    CHECK(rs.r[1].result == CT_LOAD_MISSING);
    CHECK(rs.r[4].result == CT_LOAD_MISMATCH);
    CHECK(rs.r[2].result == CT_LOAD_LOADED && rs.r[6].result == CT_LOAD_LOADED && rset_holds(&rs, 6, 3));
    float v;
    memcpy(&v, rs.buf[4], 4);
    CHECK(v == SENTINEL);  // skipped: untouched
    CHECK_MSG(strstr(log, "bias_renamed") && strstr(log, "Serial/Dense[1]/kernel") && strstr(log, "unused"),
              "the warning lists what was skipped: %s", log);
    printf("  fine-tuning load logged:\n%s", log);
    free(log);
    rset_free(&rs);

    // Nothing matches: an error.
    float buf[4];
    ct_tensor_request none = {.file = "weights.safetensors", .name = "nothing",
        .dest = ct_tensor_1d(CT_DTYPE_F32, 4, buf)};
    capture_begin(&cap);
    s = ct_checkpoint_read(dir, "base", &none, 1, CT_LOAD_BY_NAME, NULL, &err);
    free(capture_end(&cap));
    CHECK(s != CT_OK && strstr(err.msg, "none of the 1 requested"));
}

// The newest checkpoint that loads, and its contents agree with its step.
static void check_latest_consistent(const char *dir, int64_t min_step) {
    ct_error err = {0};
    ct_checkpoint *c = NULL;
    capture cap;
    capture_begin(&cap);
    ct_status s = ct_checkpoint_open_latest(&c, dir, &err);
    char *log = capture_end(&cap);
    CHECK_OK(s, &err);
    CHECK(c != NULL);
    if (!c) {
        free(log);
        return;
    }
    int64_t step = ct_checkpoint_step(c);
    CHECK(step >= min_step);
    rset rs;
    rset_make(&rs);
    // The big tensor of the stress test is left out: STRICT.
    CHECK_OK(ct_checkpoint_load(c, rs.r, N_SPEC, CT_LOAD_STRICT, &err), &err);
    CHECK_MSG(rset_holds_all(&rs, (int)step), "checkpoint %s holds step %lld's values", ct_checkpoint_name(c),
              (long long)step);
    printf("  latest after the kill: %s (step %lld)%s%s", ct_checkpoint_name(c), (long long)step, log[0] ? "; " : "\n",
           log);
    rset_free(&rs);
    ct_checkpoint_close(c);
    free(log);
}

static void test_interrupted_writer(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("kill"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_1", 1, 1, false, true, 0, &err), &err);

    // A child that dies after the first file of model_2: SIGKILL, then _exit.
    for (int how = 0; how < 2; how++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            ct_checkpoint_writer *w;
            ct_checkpoint_options o = ct_checkpoint_default_options();
            o.step = 2;
            float x[3] = {1, 2, 3};
            ct_named_tensor t[] = {{"x", ct_tensor_1d(CT_DTYPE_F32, 3, x)}};
            if (ct_checkpoint_writer_begin(&w, dir, how ? "model_1" : "model_2", &o, NULL) != CT_OK) _exit(3);
            if (ct_checkpoint_writer_add_tensors(w, "weights.safetensors", t, 1, NULL, 0, NULL) != CT_OK) _exit(4);
            if (how == 0) raise(SIGKILL);
            _exit(0);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK(how == 0 ? WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL
                       : WIFEXITED(status) && WEXITSTATUS(status) == 0);
        char tmpdir[2048];
        snprintf(tmpdir, sizeof tmpdir, "%s/.tmp-%s-%ld", dir, how ? "model_1" : "model_2", (long)pid);
        CHECK_MSG(exists(tmpdir), "the dead writer left %s", tmpdir);
        char name[CT_CHECKPOINT_NAME_MAX];
        CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
        CHECK(!strcmp(name, "model_1"));
        check_latest_consistent(dir, 1);
        // The next writer removes what the dead one left.
        CHECK_OK(ct_checkpoint_clean_tmp(dir, false, &err), &err);
        CHECK(!exists(tmpdir));
    }

    // Kill writers at arbitrary moments while they write one checkpoint after
    // another (with retention), each holding a 1 MiB tensor.
    const int delays_ms[] = {5, 23, 61, 150};
    for (int k = 0; k < 4; k++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            ct_log_set_level(CT_LOG_OFF);
            for (int step = 2 + 100 * k;; step++) {
                char name[64];
                snprintf(name, sizeof name, "model_%d", step);
                if (make_ckpt(dir, name, step, step, false, true, 1 << 18, NULL) != CT_OK) _exit(3);
                if (ct_checkpoint_prune(dir, 2, NULL, NULL, NULL) != CT_OK) _exit(4);
            }
        }
        usleep((useconds_t)delays_ms[k] * 1000);
        kill(pid, SIGKILL);
        int status;
        CHECK(waitpid(pid, &status, 0) == pid);
        CHECK_MSG(WIFSIGNALED(status), "writer %d was killed (status %d)", k, status);
        check_latest_consistent(dir, 1);
    }
}

// ct_fs_write_atomic replaces a file, never rewrites it: a reader that opened
// the old file keeps reading the old bytes, the path then names another
// inode, and a writer that dies midway (killed by SIGXFSZ at a file size
// limit, or failing with EFBIG) leaves the old file whole.
static void test_atomic_replace(void) {
    char path[1024];
    snprintf(path, sizeof path, "%s", tmp_path("atomic.bin"));
    ct_error err = {0};
    static const char old[] = "the old contents, which must survive\n";
    size_t n_old = sizeof old - 1, n_new = 1 << 20;
    unsigned char *big = malloc(n_new);
    for (size_t i = 0; i < n_new; i++) big[i] = (unsigned char)(i * 2654435761u >> 24);
    CHECK_OK(ct_fs_write_atomic(path, old, n_old, &err), &err);

    struct stat before, after, held;
    CHECK(stat(path, &before) == 0);
    int fd = open(path, O_RDONLY);
    CHECK(fd >= 0);
    CHECK_OK(ct_fs_write_atomic(path, big, n_new, &err), &err);
    CHECK(stat(path, &after) == 0);
    CHECK_MSG(after.st_ino != before.st_ino, "%s was rewritten in place (inode %llu before and after)", path,
              (unsigned long long)after.st_ino);
    char back[sizeof old];
    CHECK(fstat(fd, &held) == 0);
    ssize_t k = pread(fd, back, sizeof back, 0);
    CHECK_MSG(held.st_size == (off_t)n_old && k == (ssize_t)n_old && memcmp(back, old, n_old) == 0,
              "a reader of the old %s saw it change (%lld bytes now)", path, (long long)held.st_size);
    close(fd);
    char *text;
    size_t n;
    CHECK_OK(ct_fs_read(path, &text, &n, &err), &err);
    CHECK(n == n_new && memcmp(text, big, n_new) == 0);
    free(text);

    CHECK_OK(ct_fs_write_atomic(path, old, n_old, &err), &err);
    for (int how = 0; how < 2; how++) {
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) {
            // The writer may write 64 KiB of the 1 MiB, then dies (SIGXFSZ) or
            // gets EFBIG (SIGXFSZ ignored).
            struct rlimit lim = {1 << 16, 1 << 16};
            if (setrlimit(RLIMIT_FSIZE, &lim) != 0) _exit(3);
            if (how == 1) signal(SIGXFSZ, SIG_IGN);
            ct_error e = {0};
            _exit(ct_fs_write_atomic(path, big, n_new, &e) == CT_OK ? 0 : 2);
        }
        int status;
        CHECK(waitpid(pid, &status, 0) == pid);
        if (how == 0)
            CHECK_MSG(WIFSIGNALED(status) && WTERMSIG(status) == SIGXFSZ, "the writer was not killed by SIGXFSZ (status %d)",
                      status);
        else
            CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 2, "the writer did not fail (status %d)", status);
        // (Not CHECK_OK: a writer that removed the target is this failure too.)
        ct_status rs = ct_fs_read(path, &text, &n, &err);
        CHECK_MSG(rs == CT_OK && n == n_old && memcmp(text, old, n_old) == 0,
                  "after a writer %s midway, %s holds %zu bytes, not the old %zu (%s)", how ? "failed" : "died", path,
                  n, n_old, rs == CT_OK ? "read back" : err.msg);
        free(text);
        // What the dead writer left is its temporary file, never the target.
        char tmp[1100];
        snprintf(tmp, sizeof tmp, "%s/.atomic.bin.tmp-%ld", g_tmp, (long)pid);
        if (how == 1) CHECK_MSG(!exists(tmp), "the failed writer left %s", tmp);
        unlink(tmp);
    }
    free(big);
    unlink(path);
}

static void test_pointer_fallback(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("fallback"));
    ct_error err = {0};
    ct_checkpoint *c = NULL;
    // Nothing there: no checkpoint, no error (also for a missing directory).
    CHECK_OK(ct_checkpoint_open_latest(&c, tmp_path("does-not-exist"), &err), &err);
    CHECK(c == NULL);
    CHECK_OK(make_ckpt(dir, "model_1", 1, 1, false, true, 0, &err), &err);
    CHECK_OK(make_ckpt(dir, "model_2", 2, 2, false, true, 0, &err), &err);
    CHECK_OK(make_ckpt(dir, "model_3", 3, 3, false, true, 0, &err), &err);
    char name[CT_CHECKPOINT_NAME_MAX];
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    CHECK(!strcmp(name, "model_3"));

    // The pointer's checkpoint is corrupt: the newest other one, with a warning.
    flip_byte(tmp_path("fallback/model_3/slots.safetensors"), -1);
    capture cap;
    capture_begin(&cap);
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    char *log = capture_end(&cap);
    CHECK(!strcmp(name, "model_2"));
    CHECK_MSG(strstr(log, "'model_3'") && strstr(log, "'model_2'") && strstr(log, "corrupt data in tensor"),
              "the warning says which and why: %s", log);
    printf("  fallback logged: %s", log);
    free(log);

    // The pointer names a checkpoint that is gone.
    write_text(tmp_path("fallback/checkpoint"), "model_9\n");
    capture_begin(&cap);
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    free(capture_end(&cap));
    CHECK(!strcmp(name, "model_2"));
    // No pointer at all.
    unlink(tmp_path("fallback/checkpoint"));
    capture_begin(&cap);
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    log = capture_end(&cap);
    CHECK(!strcmp(name, "model_2") && strstr(log, "missing"));
    free(log);
    // A best checkpoint (written without moving the pointer) is newer, but a
    // copy written before its step's own checkpoint: not resumed from.
    CHECK_OK(make_ckpt(dir, "lowest_loss", 4, 4, true, false, 0, &err), &err);
    unlink(tmp_path("fallback/checkpoint"));
    capture_begin(&cap);
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    free(capture_end(&cap));
    CHECK_MSG(!strcmp(name, "model_2"), "resumes from %s, not model_2", name);
    ct_fs_remove_tree(tmp_path("fallback/lowest_loss"), NULL);
    // Nothing loads: an error that lists why.
    truncate_by(tmp_path("fallback/model_2/weights.safetensors"), 1);
    flip_byte(tmp_path("fallback/model_1/state.json"), 0);
    capture_begin(&cap);
    ct_status s = ct_checkpoint_find_latest(dir, name, sizeof name, &err);
    free(capture_end(&cap));
    CHECK(s == CT_ERR_FORMAT && name[0] == '\0' && strstr(err.msg, "no checkpoint loads (3 tried)"));
    printf("  error as expected: %s\n", err.msg);

    // No pointer and the only checkpoint's manifest damaged: an error, not
    // "nothing there" (which would start a fresh run over it).
    char dir2[1024];
    snprintf(dir2, sizeof dir2, "%s", tmp_path("fallback_manifest"));
    CHECK_OK(make_ckpt(dir2, "model_5", 5, 5, false, true, 0, &err), &err);
    unlink(tmp_path("fallback_manifest/checkpoint"));
    flip_byte(tmp_path("fallback_manifest/model_5/manifest.json"), 0);
    capture_begin(&cap);
    s = ct_checkpoint_find_latest(dir2, name, sizeof name, &err);
    free(capture_end(&cap));
    CHECK_MSG(s == CT_ERR_FORMAT && name[0] == '\0' && strstr(err.msg, "no checkpoint loads (1 tried)") &&
                  strstr(err.msg, "manifest.json"),
              "a damaged manifest without a pointer: %s", s == CT_OK ? "no error" : err.msg);
}

static bool keep_every_third(const ct_checkpoint_info *info, void *ctx) {
    (void)ctx;
    return info->step % 3 == 0;
}

static bool set_is(const char *dir, const char *const *want, int n_want) {
    ct_checkpoint_info *infos;
    int n;
    ct_error err;
    if (ct_checkpoint_list(dir, &infos, &n, &err) != CT_OK) return false;
    bool ok = n == n_want;
    printf("  kept:");
    for (int i = 0; i < n; i++) {
        printf(" %s", infos[i].name);
        ok = ok && !strcmp(infos[i].name, want[i]);  // by step, then name
    }
    printf("\n");
    free(infos);
    return ok;
}

// dir (cap bytes) = tmp_path(sub), holding model_1 .. model_n at steps 1 ..
// n, each a resume point, so the pointer names model_n.
static void make_models(char *dir, size_t cap, const char *sub, int n) {
    ct_error err = {0};
    snprintf(dir, cap, "%s", tmp_path(sub));
    for (int i = 1; i <= n; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "model_%d", i);
        CHECK_OK(make_ckpt(dir, nm, i, i, false, true, 0, &err), &err);
    }
}

static void test_retention(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("keep"));
    ct_error err = {0};
    for (int i = 1; i <= 6; i++) {
        char name[32];
        snprintf(name, sizeof name, "model_%d", i);
        CHECK_OK(make_ckpt(dir, name, i, i, i == 2, true, 0, &err), &err);  // model_2 marked kept
    }
    CHECK_OK(make_ckpt(dir, "lowest_loss", 4, 4, true, false, 0, &err), &err);
    mkdir(tmp_path("keep/not_a_checkpoint"), 0755);  // no manifest: never touched
    // Regular: 1, 4, 5 (2 is marked, 3 and 6 every third); keep the last 1.
    CHECK_OK(ct_checkpoint_prune(dir, 1, keep_every_third, NULL, &err), &err);
    const char *want1[] = {"model_2", "model_3", "lowest_loss", "model_5", "model_6"};
    CHECK(set_is(dir, want1, 5));
    CHECK(exists(tmp_path("keep/not_a_checkpoint")));
    char name[CT_CHECKPOINT_NAME_MAX];
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    CHECK(!strcmp(name, "model_6"));

    // The pointer's checkpoint is kept even when it is not among the last K.
    char dir2[1024];
    snprintf(dir2, sizeof dir2, "%s", tmp_path("keep2"));
    for (int i = 1; i <= 6; i++) {
        char nm[32];
        snprintf(nm, sizeof nm, "a_%d", i);
        CHECK_OK(make_ckpt(dir2, nm, i, i, false, i <= 4, 0, &err), &err);  // pointer stays at a_4
    }
    CHECK_OK(ct_checkpoint_prune(dir2, 1, NULL, NULL, &err), &err);
    const char *want2[] = {"a_4", "a_6"};
    CHECK(set_is(dir2, want2, 2));
    CHECK_OK(ct_checkpoint_prune(dir2, 0, NULL, NULL, &err), &err);
    const char *want3[] = {"a_4"};
    CHECK(set_is(dir2, want3, 1));
    // keep_last < 0 keeps everything.
    CHECK_OK(make_ckpt(dir2, "a_7", 7, 7, false, false, 0, &err), &err);
    CHECK_OK(ct_checkpoint_prune(dir2, -1, NULL, NULL, &err), &err);
    const char *want4[] = {"a_4", "a_7"};
    CHECK(set_is(dir2, want4, 2));
    // The pointer's checkpoint counts among the keep_last: exactly K regular
    // ones stay (Trax's keep_checkpoints), not K plus the newest.
    char dir3[1024];
    make_models(dir3, sizeof dir3, "keep3", 7);
    CHECK_OK(ct_checkpoint_prune(dir3, 2, NULL, NULL, &err), &err);
    const char *want5[] = {"model_6", "model_7"};
    CHECK(set_is(dir3, want5, 2));
    // An incomplete checkpoint is listed as such.
    truncate_by(tmp_path("keep2/a_7/slots.safetensors"), 4);
    ct_checkpoint_info *infos;
    int n;
    CHECK_OK(ct_checkpoint_list(dir2, &infos, &n, &err), &err);
    CHECK(n == 2 && infos[0].complete && !infos[1].complete);
    free(infos);
    CHECK_OK(ct_checkpoint_remove(dir2, "a_7", &err), &err);
    CHECK(set_is(dir2, want3, 1));

    // A pointer that does not read: a run resumes past it (the newest that
    // loads) and writes a best checkpoint before one that rewrites it; the
    // prune after that write removed nothing and failed it, so every rerun
    // stopped there. Now nothing is pruned until the pointer reads again.
    char dir4[1024];
    make_models(dir4, sizeof dir4, "keep4", 3);
    write_text(tmp_path("keep4/checkpoint"), "not/a name\n");
    CHECK_OK(make_ckpt(dir4, "lowest_loss", 3, 3, true, false, 0, &err), &err);
    CHECK_OK(ct_checkpoint_prune(dir4, 1, NULL, NULL, &err), &err);
    const char *want6[] = {"model_1", "model_2", "lowest_loss", "model_3"};
    CHECK(set_is(dir4, want6, 4));
    // The next resume point rewrites the pointer, and pruning goes on.
    CHECK_OK(make_ckpt(dir4, "model_4", 4, 4, false, true, 0, &err), &err);
    CHECK_OK(ct_checkpoint_prune(dir4, 1, NULL, NULL, &err), &err);
    const char *want7[] = {"lowest_loss", "model_4"};
    CHECK(set_is(dir4, want7, 2));

    // A pointer naming an incomplete checkpoint: that one stays but is not
    // counted among the keep_last, so the newest complete one (the one a
    // resume falls back to) stays too. Counted, it took model_2's place: a
    // run resumed from model_2 lost its only resume point at its next best
    // checkpoint.
    char dir5[1024];
    make_models(dir5, sizeof dir5, "keep5", 3);
    truncate_by(tmp_path("keep5/model_3/weights.safetensors"), 4);
    CHECK_OK(make_ckpt(dir5, "lowest_loss", 2, 2, true, false, 0, &err), &err);
    CHECK_OK(ct_checkpoint_prune(dir5, 1, NULL, NULL, &err), &err);
    const char *want8[] = {"lowest_loss", "model_2", "model_3"};
    CHECK(set_is(dir5, want8, 3));
}

// manifest.json of dir/name with field set to the JSON raw (NULL: removed).
static void edit_manifest(const char *dir, const char *name, const char *field, const char *raw) {
    char path[1200], *text = NULL;
    ct_error err;
    snprintf(path, sizeof path, "%s/%s/manifest.json", dir, name);
    CHECK_OK(ct_fs_read(path, &text, NULL, &err), &err);
    cJSON *m = cJSON_Parse(text);
    free(text);
    if (!m) return;
    if (!raw) cJSON_DeleteItemFromObjectCaseSensitive(m, field);
    else if (cJSON_GetObjectItemCaseSensitive(m, field)) cJSON_ReplaceItemInObjectCaseSensitive(m, field, cJSON_Parse(raw));
    else cJSON_AddItemToObject(m, field, cJSON_Parse(raw));
    text = cJSON_Print(m);
    write_text(path, text);
    cJSON_free(text);
    cJSON_Delete(m);
}

// A manifest edited by hand: "keep" absent (manifests before permanent
// checkpoints) is not kept; a "keep" other than true or false, or a step
// that is negative, huge, fractional or a string, is refused naming the
// file and the field, and the checkpoint is then not complete, so pruning
// leaves it alone (a "keep": "yes" read as false was removed).
static void test_manifest_edits(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("manifest_edits"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_1", 1, 1, false, false, 0, &err), &err);
    CHECK_OK(make_ckpt(dir, "model_2", 2, 2, true, false, 0, &err), &err);
    CHECK_OK(make_ckpt(dir, "model_3", 3, 3, false, true, 0, &err), &err);
    edit_manifest(dir, "model_1", "keep", NULL);
    ct_checkpoint *c = NULL;
    CHECK_OK(ct_checkpoint_open(&c, dir, "model_1", &err), &err);
    CHECK(c && !ct_checkpoint_kept(c));
    ct_checkpoint_close(c);

    static const struct {
        const char *field, *raw;
    } bad[] = {{"keep", "\"yes\""}, {"keep", "1"},    {"keep", "null"},  {"step", "-2"},
               {"step", "1e300"},    {"step", "2.5"}, {"step", "\"2\""}, {"resume_point", "0"}};
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++) {
        edit_manifest(dir, "model_2", bad[k].field, bad[k].raw);
        c = NULL;
        ct_status st = ct_checkpoint_open(&c, dir, "model_2", &err);
        char want[32];
        snprintf(want, sizeof want, "\"%s\"", bad[k].field);
        CHECK_MSG(st == CT_ERR_FORMAT && strstr(err.msg, "model_2/manifest.json") && strstr(err.msg, want),
                  "manifest %s: %s: %s", bad[k].field, bad[k].raw, st == CT_OK ? "accepted" : err.msg);
        if (k == 0) printf("manifest \"keep\": %s: %s\n", bad[k].raw, err.msg);
        ct_checkpoint_close(c);
        // keep_last 0: only the pointer's (model_3) and what cannot be read stay.
        CHECK_OK(ct_checkpoint_prune(dir, 0, NULL, NULL, &err), &err);
        char path[1200];
        snprintf(path, sizeof path, "%s/model_2/manifest.json", dir);
        CHECK(exists(path));
        edit_manifest(dir, "model_2", bad[k].field, !strcmp(bad[k].field, "step") ? "2" : "true");
    }
    // A format newer than this ctrax reads is refused as such.
    char newer[32];
    snprintf(newer, sizeof newer, "%d", CT_CHECKPOINT_FORMAT_VERSION + 1);
    edit_manifest(dir, "model_2", "version", newer);
    c = NULL;
    ct_status st = ct_checkpoint_open(&c, dir, "model_2", &err);
    CHECK_MSG(st == CT_ERR_FORMAT && strstr(err.msg, "model_2/manifest.json") && strstr(err.msg, "is newer than"),
              "manifest version %s: %s", newer, st == CT_OK ? "accepted" : err.msg);
    ct_checkpoint_close(c);
    // A manifest of 2^21 values (4 MB; cJSON takes some 80 bytes a value) is
    // refused by their count, before parsing.
    char path[1200];
    snprintf(path, sizeof path, "%s/model_2/manifest.json", dir);
    size_t n_zeros = (size_t)1 << 21;
    char *big = malloc(2 * n_zeros + 16), *q = big + sprintf(big, "{\"x\": [");
    for (size_t i = 0; i < n_zeros; i++) q += sprintf(q, i ? ",0" : "0");
    q += sprintf(q, "]}");
    write_raw(path, big, (size_t)(q - big));
    free(big);
    c = NULL;
    st = ct_checkpoint_open(&c, dir, "model_2", &err);
    CHECK_MSG(st == CT_ERR_FORMAT && strstr(err.msg, "model_2/manifest.json: holds up to 2097154 JSON values"),
              "a manifest of 2^21 values: %s", st == CT_OK ? "accepted" : err.msg);
    ct_checkpoint_close(c);
    snprintf(path, sizeof path, "%s/model_1", dir);
    CHECK(!exists(path));
    // "resume_point" absent (manifests written before it): every checkpoint
    // was one, so with no pointer the newest is resumed from. Read as false,
    // a run over such checkpoints found none to resume and started afresh.
    char dir3[1024], name[CT_CHECKPOINT_NAME_MAX];
    snprintf(dir3, sizeof dir3, "%s", tmp_path("no_resume_point"));
    CHECK_OK(make_ckpt(dir3, "model_1", 1, 1, false, false, 0, &err), &err);
    edit_manifest(dir3, "model_1", "resume_point", NULL);
    capture cap;
    capture_begin(&cap);
    CHECK_OK(ct_checkpoint_find_latest(dir3, name, sizeof name, &err), &err);
    free(capture_end(&cap));
    CHECK_MSG(!strcmp(name, "model_1"), "a manifest without \"resume_point\": resumes from '%s', not model_1", name);
}

// The manifest has no checksum of its own, so every single-bit flip of a
// permanent checkpoint's manifest.json is tried: the checkpoint must then
// either read as damaged (step -1 in the listing, which pruning leaves
// alone) or still be kept. "keep" -> "keeq" once read as a manifest without
// "keep" (not kept), and pruning removed it. A checkpoint that still opens
// after a flip says the same name and kept, and an unknown key is refused
// naming the file and the key.
static void test_manifest_bit_flips(void) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("manifest_flips"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_4", 4, 4, true, true, 0, &err), &err);
    snprintf(path, sizeof path, "%s/model_4/manifest.json", dir);
    char *orig = NULL;
    size_t len = 0;
    CHECK_OK(ct_fs_read(path, &orig, &len, &err), &err);
    if (!orig) return;
    int flips = 0, damaged = 0, opened = 0, bad = 0;
    for (size_t at = 0; at < len; at++) {
        for (int bit = 0; bit < 8; bit++) {
            orig[at] ^= (char)(1 << bit);
            write_raw(path, orig, len);
            orig[at] ^= (char)(1 << bit);
            flips++;
            ct_checkpoint_info *infos = NULL;
            int n = 0;
            CHECK_OK(ct_checkpoint_list(dir, &infos, &n, &err), &err);
            bool ok = n == 1 && (infos[0].step < 0 || infos[0].keep);
            if (n == 1 && infos[0].step < 0) damaged++;
            free(infos);
            ct_checkpoint *c = NULL;
            if (ct_checkpoint_open(&c, dir, "model_4", &err) == CT_OK) {
                opened++;
                ok = ok && ct_checkpoint_kept(c) && !strcmp(ct_checkpoint_name(c), "model_4");
            }
            ct_checkpoint_close(c);
            if (!ok && bad++ < 5) printf("FAIL byte %zu ('%c') bit %d: no longer kept\n", at, orig[at], bit);
        }
    }
    CHECK_MSG(bad == 0, "%d of %d single-bit flips of a kept manifest made it prunable", bad, flips);
    printf("manifest bit flips: %d, %d read as damaged, %d still opened as kept, %d prunable\n", flips, damaged,
           opened, bad);
    // "keep" renamed, and a checksum other than crc32: refused by name.
    static const char *const edits[][2] = {{"\"keep\"", "\"keeq\""}, {"\"crc32\",", "\"crc33\","}};
    for (int k = 0; k < 2; k++) {
        char *text = strdup(orig), *hit = strstr(text, edits[k][0]);
        CHECK(hit != NULL);
        if (hit) memcpy(hit, edits[k][1], strlen(edits[k][1]));
        write_text(path, text);
        free(text);
        ct_checkpoint *c = NULL;
        ct_status st = ct_checkpoint_open(&c, dir, "model_4", &err);
        CHECK_MSG(st == CT_ERR_FORMAT && strstr(err.msg, "model_4/manifest.json") &&
                      strstr(err.msg, k == 0 ? "\"keeq\"" : "\"checksum\""),
                  "%s: %s", edits[k][1], st == CT_OK ? "accepted" : err.msg);
        if (st != CT_OK) printf("%s: %s\n", edits[k][1], err.msg);
        ct_checkpoint_close(c);
    }
    write_raw(path, orig, len);
    free(orig);
}

// A file's "crc32" in the manifest is 8 hex digits: one of another length is
// refused as such, not read as a number that may happen to match.
static void test_manifest_crc_field(void) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("manifest_crc"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_1", 1, 1, false, true, 0, &err), &err);
    snprintf(path, sizeof path, "%s/model_1/manifest.json", dir);
    char *text = NULL;
    CHECK_OK(ct_fs_read(path, &text, NULL, &err), &err);
    cJSON *m = cJSON_Parse(text);
    free(text);
    cJSON *f = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(m, "files"), 0);
    const cJSON *crc = cJSON_GetObjectItemCaseSensitive(f, "crc32");
    CHECK(cJSON_IsString(crc) && strlen(crc->valuestring) == 8);
    char shorter[8];
    snprintf(shorter, sizeof shorter, "%s", crc->valuestring + 1);  // 7 digits
    cJSON_ReplaceItemInObjectCaseSensitive(f, "crc32", cJSON_CreateString(shorter));
    text = cJSON_Print(m);
    write_text(path, text);
    cJSON_free(text);
    cJSON_Delete(m);
    ct_checkpoint *c = NULL;
    ct_status st = ct_checkpoint_open(&c, dir, "model_1", &err);
    CHECK_MSG(st == CT_ERR_FORMAT && strstr(err.msg, "model_1/manifest.json") && strstr(err.msg, "\"crc32\""),
              "a 7-digit crc32: %s", st == CT_OK ? "accepted" : err.msg);
    ct_checkpoint_close(c);
}

// Removing a checkpoint removes its directory, never what a link in it
// points to.
static void test_remove_keeps_link_targets(void) {
    char dir[1024], victim[1200], link[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("remove_links"));
    snprintf(victim, sizeof victim, "%s", tmp_path("remove_links_victim"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_1", 1, 1, false, false, 0, &err), &err);
    CHECK(mkdir(victim, 0755) == 0);
    char keep[1300];
    snprintf(keep, sizeof keep, "%s/precious.txt", victim);
    write_text(keep, "keep me\n");
    snprintf(link, sizeof link, "%s/model_1/notes", dir);
    CHECK(symlink(victim, link) == 0);
    CHECK_OK(ct_checkpoint_remove(dir, "model_1", &err), &err);
    snprintf(link, sizeof link, "%s/model_1", dir);
    CHECK(!exists(link));
    CHECK_MSG(exists(keep), "%s was removed through a link in the checkpoint", keep);
}

// A manifest's "files": a name listed twice, or more than 1024 entries, is
// refused naming the manifest (before any of them is opened).
static void test_manifest_files_list(void) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("manifest_files"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_1", 1, 1, false, true, 0, &err), &err);
    snprintf(path, sizeof path, "%s/model_1/manifest.json", dir);
    char *orig = NULL;
    CHECK_OK(ct_fs_read(path, &orig, NULL, &err), &err);
    for (int how = 0; how < 2; how++) {
        cJSON *m = cJSON_Parse(orig);
        cJSON *files = cJSON_GetObjectItemCaseSensitive(m, "files");
        const cJSON *first = cJSON_GetArrayItem(files, 0);
        if (how == 0) cJSON_AddItemToArray(files, cJSON_Duplicate(first, true));
        for (int i = 0; how == 1 && cJSON_GetArraySize(files) <= 1024; i++) {
            cJSON *e = cJSON_Duplicate(first, true);
            char name[32];
            snprintf(name, sizeof name, "extra_%d.bin", i);
            cJSON_ReplaceItemInObjectCaseSensitive(e, "name", cJSON_CreateString(name));
            cJSON_AddItemToArray(files, e);
        }
        char *text = cJSON_Print(m);
        write_text(path, text);
        cJSON_free(text);
        cJSON_Delete(m);
        ct_checkpoint *c = NULL;
        ct_status st = ct_checkpoint_open(&c, dir, "model_1", &err);
        const char *want = how == 0 ? "is listed twice" : "more than 1024";
        CHECK_MSG(st == CT_ERR_FORMAT && strstr(err.msg, "model_1/manifest.json") && strstr(err.msg, want),
                  "manifest files %s: %s", want, st == CT_OK ? "accepted" : err.msg);
        ct_checkpoint_close(c);
    }
    write_text(path, orig);
    free(orig);
}

// A file larger than its manifest says is reported as changed, by size; and
// damage in many tensors names the first three, then "and more".
static void test_damage_reports(void) {
    char dir[1024], path[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("damage_reports"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "grown", 1, 1, false, false, 0, &err), &err);
    snprintf(path, sizeof path, "%s/grown/weights.safetensors", dir);
    FILE *f = fopen(path, "ab");
    CHECK(f && fwrite("12345678", 1, 8, f) == 8);
    if (f) fclose(f);
    ct_checkpoint *c = NULL;
    ct_status st = ct_checkpoint_open(&c, dir, "grown", &err);
    CHECK_MSG(st == CT_ERR_FORMAT && strstr(err.msg, "grown/weights.safetensors") &&
                  strstr(err.msg, "but the manifest says") && strstr(err.msg, "the file changed"),
              "8 bytes appended: %s", st == CT_OK ? "accepted" : err.msg);
    ct_checkpoint_close(c);
    // Not complete either, for pruning: only the sizes the manifest says are.
    ct_checkpoint_info *infos;
    int n_infos;
    CHECK_OK(ct_checkpoint_list(dir, &infos, &n_infos, &err), &err);
    CHECK_MSG(n_infos == 1 && !infos[0].complete, "a grown file leaves its checkpoint incomplete (%d listed)", n_infos);
    free(infos);

    // One bit of each of weights.safetensors' 5 tensors flipped.
    CHECK_OK(make_ckpt(dir, "damaged", 1, 1, false, false, 0, &err), &err);
    snprintf(path, sizeof path, "%s/damaged/weights.safetensors", dir);
    ct_safetensors *s;
    CHECK_OK(ct_safetensors_open(&s, path, &err), &err);
    int n = ct_safetensors_count(s);
    long offsets[8];
    const unsigned char *base = ct_safetensors_bytes(s, NULL);
    for (int i = 0; i < n && i < 8; i++) offsets[i] = (long)((const unsigned char *)ct_safetensors_tensor(s, i).data - base);
    ct_safetensors_close(s);
    CHECK(n == 5);
    for (int i = 0; i < n && i < 8; i++) flip_byte(path, offsets[i]);
    st = ct_checkpoint_open(&c, dir, "damaged", &err);
    int quotes = 0;
    for (const char *p = err.msg; st != CT_OK && (p = strstr(p, "'Serial/")) != NULL; p++) quotes++;
    for (const char *p = err.msg; st != CT_OK && (p = strstr(p, "'state/")) != NULL; p++) quotes++;
    CHECK_MSG(st == CT_ERR_FORMAT && quotes == 3 && strstr(err.msg, " and more"),
              "5 damaged tensors: the first 3 named, then \"and more\": %s", st == CT_OK ? "accepted" : err.msg);
    ct_checkpoint_close(c);
}

// Two writers of one process at once (a best checkpoint written while a
// regular one is open): the second's cleanup leaves the first's temporary
// directory alone.
static void test_two_writers(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("two_writers"));
    float x[2] = {1, 2};
    ct_named_tensor t[] = {{"x", ct_tensor_1d(CT_DTYPE_F32, 2, x)}};
    ct_checkpoint_options o = ct_checkpoint_default_options();
    ct_checkpoint_writer *a, *b;
    ct_error err = {0};
    CHECK_OK(ct_checkpoint_writer_begin(&a, dir, "model_1", &o, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(a, "weights.safetensors", t, 1, NULL, 0, &err), &err);
    o.update_pointer = false;
    CHECK_OK(ct_checkpoint_writer_begin(&b, dir, "lowest_loss", &o, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(b, "weights.safetensors", t, 1, NULL, 0, &err), &err);
    CHECK_OK(ct_checkpoint_writer_commit(b, &err), &err);
    ct_status st = ct_checkpoint_writer_commit(a, &err);
    CHECK_MSG(st == CT_OK, "the first writer's commit after the second's: %s", st == CT_OK ? "ok" : err.msg);
    char name[CT_CHECKPOINT_NAME_MAX];
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    CHECK(!strcmp(name, "model_1"));
}

// A leftover whose writer is alive but another user's process (kill gives
// EPERM, not ESRCH) is not removed: pid 1 stands for that writer, seen by a
// child that is not root.
static void test_clean_tmp_other_user(void) {
    char dir[1024], left[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("other_user"));
    snprintf(left, sizeof left, "%s/.tmp-model_9-1", dir);
    CHECK(mkdir(dir, 0777) == 0 && chmod(dir, 0777) == 0 && mkdir(left, 0777) == 0 && chmod(left, 0777) == 0);
    CHECK(chmod(g_tmp, 0711) == 0);  // the child may pass through the scratch directory
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        if (geteuid() == 0 && setuid(65534) != 0) _exit(3);
        ct_error e;
        _exit(ct_checkpoint_clean_tmp(dir, false, &e) == CT_OK ? 0 : 4);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK(chmod(g_tmp, 0700) == 0);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 0, "the cleaning child ended with status %d", status);
    CHECK_MSG(exists(left), "%s, of a live writer of another user, was removed", left);
}

// A dead writer's ".old-<name>-<pid>" goes back under <name> only when it is
// a whole checkpoint: one that pruning had begun to remove is removed.
static void test_clean_tmp_partial_old(void) {
    char dir[1024], aside[1200], file[1300];
    snprintf(dir, sizeof dir, "%s", tmp_path("partial_old"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_7", 7, 7, false, false, 0, &err), &err);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) _exit(0);
    CHECK(waitpid(pid, NULL, 0) == pid);  // a pid nobody has now
    char final[1100];
    snprintf(final, sizeof final, "%s/model_7", dir);
    snprintf(aside, sizeof aside, "%s/.old-model_7-%ld", dir, (long)pid);
    CHECK(rename(final, aside) == 0);
    snprintf(file, sizeof file, "%s/weights.safetensors", aside);
    CHECK(unlink(file) == 0);
    CHECK_OK(ct_checkpoint_clean_tmp(dir, false, &err), &err);
    CHECK_MSG(!exists(final) && !exists(aside), "a half-removed checkpoint was %s",
              exists(final) ? "put back" : "left");
}

// Leftovers under this process's own pid: a writer skips them (its own
// writes), a run's start (own_too) takes them as an earlier process's that
// had the same pid, as every run may be pid 1 in a container: its
// .old-model_5-<pid> goes back under model_5, its .tmp-model_6-<pid> goes.
static void test_clean_tmp_own_pid(void) {
    char dir[1024], final[1100], aside[1200], tmp[1200];
    snprintf(dir, sizeof dir, "%s", tmp_path("own_pid"));
    ct_error err = {0};
    CHECK_OK(make_ckpt(dir, "model_5", 5, 5, false, false, 0, &err), &err);
    snprintf(final, sizeof final, "%s/model_5", dir);
    snprintf(aside, sizeof aside, "%s/.old-model_5-%ld", dir, (long)getpid());
    snprintf(tmp, sizeof tmp, "%s/.tmp-model_6-%ld", dir, (long)getpid());
    CHECK(rename(final, aside) == 0 && mkdir(tmp, 0700) == 0);
    CHECK_OK(ct_checkpoint_clean_tmp(dir, false, &err), &err);
    CHECK_MSG(exists(aside) && exists(tmp) && !exists(final), "a writer took its own pid's leftovers");
    CHECK_OK(ct_checkpoint_clean_tmp(dir, true, &err), &err);
    printf("own pid's leftovers at a run's start: model_5 %s, .tmp-model_6 %s\n",
           exists(final) ? "put back" : "MISSING", exists(tmp) ? "LEFT" : "removed");
    CHECK(exists(final) && !exists(aside) && !exists(tmp));
}

int main(void) {
    scratch_init("test_checkpoint");
    printf("scratch directory %s\n", g_tmp);
    test_safetensors_roundtrip();
    test_safetensors_damage();
    test_checkpoint_roundtrip();
    test_writer_arguments();
    test_load_errors();
    test_load_by_name();
    test_interrupted_writer();
    test_atomic_replace();
    test_pointer_fallback();
    test_retention();
    test_manifest_edits();
    test_manifest_crc_field();
    test_manifest_bit_flips();
    test_manifest_files_list();
    test_remove_keeps_link_targets();
    test_damage_reports();
    test_two_writers();
    test_clean_tmp_other_user();
    test_clean_tmp_partial_old();
    test_clean_tmp_own_pid();
    ct_error err;
    if (!check_failed_) ct_fs_remove_tree(g_tmp, &err);
    return check_summary("test_checkpoint");
}
