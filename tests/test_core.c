// Core: threefry known answers, keys, tensors, the arena, device accounting,
// errors.
#include <float.h>
#include <omp.h>
#include <setjmp.h>
#include <unistd.h>

#include "check.h"
#include "core/bulk.h"
#include "core/fs.h"
#include "core/json.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"

static void test_threefry(void) {
    // Known-answer vectors of Random123 (kat_vectors, threefry2x32_20).
    uint32_t out[2];
    ct_threefry2x32((ct_key){{0, 0}}, 0, 0, out);
    CHECK(out[0] == 0x6b200159u && out[1] == 0x99ba4efeu);
    ct_threefry2x32((ct_key){{0xffffffffu, 0xffffffffu}}, 0xffffffffu, 0xffffffffu, out);
    CHECK(out[0] == 0x1cb996fcu && out[1] == 0xbb002be7u);
    ct_threefry2x32((ct_key){{0x13198a2eu, 0x03707344u}}, 0x243f6a88u, 0x85a308d3u, out);
    CHECK(out[0] == 0xc4923a9cu && out[1] == 0x483df7a0u);
    // The vector form gives ct_random_bits's numbers, over whole lanes, a
    // tail, and counters that wrap past 2^32.
    ct_key key = ct_key_from_seed(7);
    const uint32_t starts[3] = {0u, 5u, 0xfffffff0u};
    const size_t lengths[4] = {0, 3, 16, 77};
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 4; b++) {
            uint32_t bits[77];
            ct_random_bits_block(key, starts[a], lengths[b], bits);
            int same = 0;
            for (size_t i = 0; i < lengths[b]; i++) same += bits[i] == ct_random_bits(key, starts[a] + (uint32_t)i);
            CHECK_MSG(same == (int)lengths[b], "block from %u, %zu long: %d of %zu equal", starts[a], lengths[b], same,
                      lengths[b]);
        }
}

// Keys and draws against an independent threefry-2x32 (Python, written
// from Random123's threefry.h; it reproduces the three Random123 answers
// above): split, fold_in, the uniform floats of [lo, hi) and Box-Muller's
// pairs (cos for even elements, sin for odd), element j from counter
// (j, 2). Key from_seed(42) = (0, 42).
static void test_rng_known_answers(void) {
    ct_key k = ct_key_from_seed(42);
    ct_key s = ct_key_split(k, 1), f = ct_key_fold_in(k, 3);
    CHECK_MSG(s.w[0] == 0x19a3f86fu && s.w[1] == 0xcfbc07f9u, "split(k, 1) = %08x %08x", s.w[0], s.w[1]);
    CHECK_MSG(f.w[0] == 0x82a487b6u && f.w[1] == 0xc9a0b595u, "fold_in(k, 3) = %08x %08x", f.w[0], f.w[1]);
    CHECK(ct_random_bits(s, 0) == 0xe7b9c81eu && ct_random_bits(s, 1) == 0x2fa5dcd2u &&
          ct_random_bits(s, 2) == 0x9050d93cu);
    float u[3];
    ct_random_uniform(s, u, 3, -1.0f, 1.0f);
    CHECK_MSG(u[0] == 0.8103570938110352f && u[1] == -0.6277508735656738f && u[2] == 0.12746727466583252f,
              "uniform %.9g %.9g %.9g", (double)u[0], (double)u[1], (double)u[2]);
    float z4[4] = {0, 0, 0, 12345.0f};
    ct_random_normal(s, z4, 3, 2.0f);  // an odd count: the last pair's sin is not written
    CHECK(z4[3] == 12345.0f);
    // Both sides are libm's log, sqrt and cos in double, rounded to float:
    // within a float's rounding (u1 = (bits + 1) / 2^24, not bits + 0.5).
    const double want[3] = {0.3487516939640045, 0.8218005895614624, -1.869166374206543};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(fabs(z4[i] - want[i]) <= 1e-7 * fabs(want[i]), "normal[%d] = %.9g, want %.9g", i, (double)z4[i],
                  want[i]);
}

static void test_keys(void) {
    ct_key k = ct_key_from_seed(42);
    CHECK(k.w[0] == 0 && k.w[1] == 42);
    ct_key a = ct_key_split(k, 0), b = ct_key_split(k, 1), c = ct_key_fold_in(k, 0);
    CHECK(memcmp(&a, &b, sizeof a) != 0 && memcmp(&a, &c, sizeof a) != 0);
    ct_key a2 = ct_key_split(k, 0);
    CHECK(memcmp(&a, &a2, sizeof a) == 0);
    float u[10000];
    ct_random_uniform(a, u, 10000, -1.0f, 1.0f);
    double mean = 0, lo = 1, hi = -1;
    for (int i = 0; i < 10000; i++) {
        mean += u[i] / 10000.0;
        if (u[i] < lo) lo = u[i];
        if (u[i] > hi) hi = u[i];
    }
    CHECK(lo >= -1.0 && hi < 1.0 && fabs(mean) < 0.03);
    // [lo, hi) also where lo + (hi - lo) * u rounds up to hi: in steps of
    // 1/16 near 1e6, every u past 1 - 1/32 did (some 3% of draws).
    int at_hi = 0;
    ct_random_uniform(a, u, 10000, 1000000.0f, 1000001.0f);
    for (int i = 0; i < 10000; i++) at_hi += !(u[i] >= 1000000.0f && u[i] < 1000001.0f);
    CHECK_MSG(at_hi == 0, "%d of 10000 draws outside [1e6, 1e6 + 1)", at_hi);
    // A range wider than FLT_MAX: hi - lo overflows float (inf * 0 is NaN,
    // inf * u is inf); every draw must still be finite and in [lo, hi).
    int outside = 0;
    double wide_mean = 0;
    ct_random_uniform(a, u, 10000, -FLT_MAX, FLT_MAX);
    for (int i = 0; i < 10000; i++) {
        outside += !(u[i] >= -FLT_MAX && u[i] < FLT_MAX);
        wide_mean += u[i] / FLT_MAX / 10000.0;
    }
    CHECK_MSG(outside == 0 && fabs(wide_mean) < 0.03, "%d of 10000 draws in [-FLT_MAX, FLT_MAX) not finite or "
              "outside; mean %g of FLT_MAX", outside, wide_mean);
    float nrm[10000];
    ct_random_normal(b, nrm, 10000, 2.0f);
    double m = 0, v = 0;
    for (int i = 0; i < 10000; i++) m += nrm[i] / 10000.0;
    for (int i = 0; i < 10000; i++) v += (nrm[i] - m) * (nrm[i] - m) / 10000.0;
    CHECK_MSG(fabs(m) < 0.08 && fabs(sqrt(v) - 2.0) < 0.08, "mean %g std %g", m, sqrt(v));
}

static void test_tensor(void) {
    ct_tensor t = ct_tensor_3d(CT_DTYPE_F32, 2, 3, 4, NULL);
    CHECK(ct_tensor_numel(&t) == 24 && ct_tensor_nbytes(&t) == 96);
    char s[CT_SIG_STR_MAX];
    CHECK(strcmp(ct_tensor_sig_str(&t, s, sizeof s), "(2,3,4) f32") == 0);
    ct_tensor scalar = ct_tensor_make(CT_DTYPE_I32, 0, NULL, NULL);
    CHECK(ct_tensor_numel(&scalar) == 1);
    CHECK(strcmp(ct_tensor_sig_str(&scalar, s, sizeof s), "() i32") == 0);
    // A buffer too small: cut short, terminated, nothing written past it.
    ct_tensor wide = ct_tensor_make(CT_DTYPE_F32, 6, (int64_t[]){123456789, 2, 3, 4, 5, 6}, NULL);
    char small[64];
    memset(small, 'Z', sizeof small);
    ct_tensor_sig_str(&wide, small, 8);
    bool untouched = true;
    for (size_t i = 8; i < sizeof small; i++) untouched = untouched && small[i] == 'Z';
    CHECK(strcmp(small, "(123456") == 0 && untouched);
    // Signatures compare dtype, rank and dims.
    ct_tensor ids = ct_tensor_3d(CT_DTYPE_I32, 2, 3, 4, NULL), flat = ct_tensor_2d(CT_DTYPE_F32, 6, 4, NULL);
    CHECK(ct_tensor_same_sig(&t, &t) && !ct_tensor_same_sig(&t, &ids) && !ct_tensor_same_sig(&t, &flat));
    ct_tensor lower = ct_tensor_2d(CT_DTYPE_F32, 2, 3, NULL);  // t's leading dims, one fewer
    CHECK(!ct_tensor_same_sig(&lower, &t) && !ct_tensor_same_sig(&t, &lower));
    CHECK(ct_dtype_size(CT_DTYPE_BF16) == 2);
    // Part 2 of 3 along axis 0 of a (6, 2) tensor: rows 4 and 5, a view.
    int32_t rows[12];
    for (int i = 0; i < 12; i++) rows[i] = i;
    ct_tensor whole = ct_tensor_2d(CT_DTYPE_I32, 6, 2, rows);
    ct_tensor part = ct_tensor_split_rows(&whole, 3, 2);
    CHECK(part.shape[0] == 2 && part.shape[1] == 2 && ct_i32(&part) == rows + 8 && ct_i32(&part)[3] == 11);
    ct_tensor sig = ct_tensor_sig(&whole);
    CHECK(ct_tensor_split_rows(&sig, 2, 1).data == NULL && ct_tensor_split_rows(&sig, 2, 1).shape[0] == 3);
}

static void test_arena(void) {
    ct_device dev = ct_device_cpu();
    ct_arena a;
    ct_arena_init(&a, &dev);
    ct_error err;
    // First "step": grows past one block.
    void *p = ct_arena_alloc(&a, 100, &err);
    CHECK(p && ((uintptr_t)p % 64) == 0);
    ct_arena_mark m = ct_arena_get_mark(&a);
    for (int i = 0; i < 5; i++) CHECK(ct_arena_alloc(&a, 700000, &err) != NULL);
    size_t high = a.high_water;
    ct_arena_reset_to(&a, m);
    CHECK(a.used == 128);
    ct_arena_reset(&a);
    // One block now holds the whole high-water mark: a second step of the
    // same sizes takes nothing more from the device.
    uint64_t allocs = dev.n_allocs;
    CHECK(ct_arena_capacity(&a) >= high);
    CHECK(ct_arena_alloc(&a, 100, &err) != NULL);
    for (int i = 0; i < 5; i++) CHECK(ct_arena_alloc(&a, 700000, &err) != NULL);
    CHECK(dev.n_allocs == allocs);
    ct_arena_free(&a);
    CHECK(dev.current_bytes == 0 && dev.peak_bytes > 0);
}

// ct_bulk_zero and ct_bulk_copy give memset's and memcpy's bytes, and touch
// nothing outside [0, n): sizes on both sides of the size where the threads
// share the work (256 KiB), odd ones and odd addresses, at 1, 2 and 3
// threads, and inside a parallel region (where the caller's thread does it).
static void bulk_case(size_t n, size_t offset, int threads, bool nested) {
    if (n > ((size_t)16 << 20) || offset > 64) {  // (and GCC then knows the buffers hold n + 7 bytes)
        CHECK_MSG(false, "bulk_case: %zu bytes at offset %zu is past what it allocates for", n, offset);
        return;
    }
    size_t total = n + offset + 128;
    unsigned char *a = malloc(total), *b = malloc(total), *src = malloc(total);
    for (size_t i = 0; i < total; i++) src[i] = (unsigned char)(i * 2654435761u >> 13), a[i] = b[i] = (unsigned char)~i;
    omp_set_num_threads(threads);
    if (nested) {
#pragma omp parallel num_threads(2)
        if (omp_get_thread_num() == 0) ct_bulk_copy(a + offset, src + 7, n);
    } else {
        ct_bulk_copy(a + offset, src + 7, n);
    }
    memcpy(b + offset, src + 7, n);
    CHECK_MSG(memcmp(a, b, total) == 0, "ct_bulk_copy of %zu bytes at offset %zu, %d threads%s", n, offset, threads,
              nested ? ", nested" : "");
    ct_bulk_zero(a + offset + 1, n);
    memset(b + offset + 1, 0, n);
    CHECK_MSG(memcmp(a, b, total) == 0, "ct_bulk_zero of %zu bytes at offset %zu, %d threads", n, offset + 1,
              threads);
    free(a), free(b), free(src);
}

static void test_bulk(void) {
    const size_t sizes[] = {0, 1, 63, 65, 4096, ((size_t)256 << 10) - 1, (size_t)256 << 10, ((size_t)256 << 10) + 1,
                            ((size_t)1 << 20) + 13, (size_t)3 << 20};
    int saved = omp_get_max_threads();
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (int threads = 1; threads <= 3; threads++) {
            bulk_case(sizes[i], 0, threads, false);
            bulk_case(sizes[i], 5, threads, false);
        }
    bulk_case((size_t)1 << 20, 3, 2, true);
    omp_set_num_threads(saved);
}

// Sizes that do not fit: a shape product past int64 (it was signed
// overflow, wrapping to 0 for (2^40, 2^30) so that ct_net_init accepted a
// kernel of 2^70 floats in a slab of none) and arena requests near SIZE_MAX
// (the rounding up wrapped: ct_arena_alloc(SIZE_MAX) returned memory,
// SIZE_MAX - 64 crashed in block_new, and ct_arena_reserve(SIZE_MAX - 10)
// made a 64-byte block of that capacity).
static void test_hostile_sizes(void) {
    ct_tensor t = ct_tensor_3d(CT_DTYPE_F32, (int64_t)1 << 40, (int64_t)1 << 20, (int64_t)1 << 10, NULL);
    CHECK(ct_tensor_numel(&t) == INT64_MAX && ct_tensor_nbytes(&t) == SIZE_MAX);
    ct_tensor big = ct_tensor_2d(CT_DTYPE_F32, (int64_t)1 << 31, (int64_t)1 << 31, NULL);  // fits int64, not bytes
    CHECK(ct_tensor_numel(&big) == (int64_t)1 << 62 && ct_tensor_nbytes(&big) == SIZE_MAX);
    // SIZE_MAX / 4 floats: SIZE_MAX - 3 bytes, which fits.
    ct_tensor edge = ct_tensor_1d(CT_DTYPE_F32, (int64_t)(SIZE_MAX / 4), NULL);
    CHECK(ct_tensor_nbytes(&edge) == SIZE_MAX - 3);
    ct_tensor empty = ct_tensor_3d(CT_DTYPE_F32, (int64_t)1 << 40, (int64_t)1 << 40, 0, NULL);
    CHECK(ct_tensor_numel(&empty) == 0 && ct_tensor_nbytes(&empty) == 0);

    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_tensor in = ct_tensor_2d(CT_DTYPE_F32, 2, (int64_t)1 << 40, NULL);
    ct_layer *dense = ct_dense(1 << 30);
    ct_net net;
    ct_status st = ct_net_init(&net, dense, &in, 1, ct_key_from_seed(0), &dev, &err);
    CHECK_MSG(st == CT_ERR_MEMORY, "a (2^40, 2^30) kernel: status %d", (int)st);
    if (st == CT_OK) ct_net_free(&net);
    ct_layer_free(dense);

    ct_arena a;
    ct_arena_init(&a, &dev);
    const size_t sizes[3] = {SIZE_MAX, SIZE_MAX - 64, SIZE_MAX / 2 + 1};
    for (int i = 0; i < 3; i++) {
        ct_error_clear(&err);
        CHECK(ct_arena_alloc(&a, sizes[i], &err) == NULL && err.code == CT_ERR_MEMORY);
        CHECK(ct_arena_calloc(&a, sizes[i], &err) == NULL);
    }
    CHECK(ct_arena_alloc(&a, 100, &err) != NULL);
    CHECK(ct_arena_alloc(&a, SIZE_MAX - 100, &err) == NULL && a.used == 128);
    ct_arena_free(&a);
    CHECK(ct_arena_reserve(&a, SIZE_MAX - 10, &err) == CT_ERR_MEMORY && ct_arena_capacity(&a) == 0);
    CHECK(ct_arena_measure_begin(&a, &err) == CT_OK);
    CHECK(ct_arena_alloc(&a, SIZE_MAX, &err) == NULL && err.code == CT_ERR_MEMORY && a.used == 0);
    ct_arena_measure_end(&a);
    ct_arena_free(&a);
    CHECK(dev.current_bytes == 0);
}

// A layer whose one state tensor, (65536, 65537) floats from N(0, 1), holds
// more numbers than the 2^32 counters of its key.
static ct_status big_state_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                                ct_error *err) {
    (void)err;
    ct_layer_declare_state(l, ic, "table", ct_tensor_2d(CT_DTYPE_F32, 65536, 65537, NULL),
                           (ct_initializer){CT_INIT_NORMAL, 1.0f}, key);
    out[0] = in[0];
    return CT_OK;
}

// A random initializer past its key's counters was an assertion in
// ct_random_normal (from 2^31 numbers on) once the slabs were allocated; now
// up to 2^32 are drawn and more refused before any slab. The state slab
// (16 GiB here) must pass the memory check first, so a smaller machine skips.
static void test_random_init_limit(void) {
    if (ct_machine_memory_bytes() < ((size_t)17 << 30)) {
        printf("test_random_init_limit: skipped (less than 17 GiB of memory)\n");
        return;
    }
    static const ct_layer_vtable vt = {.type = "BigState", .init = big_state_init};
    ct_layer *l = ct_layer_new(&vt, NULL, 1, 1, NULL, NULL, 0);
    ct_tensor in = ct_tensor_1d(CT_DTYPE_F32, 4, NULL);
    ct_device dev = ct_device_cpu();
    ct_net net;
    ct_error err;
    ct_status st = ct_net_init(&net, l, &in, 1, ct_key_from_seed(0), &dev, &err);
    CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "(65536,65537) f32: a random initializer draws at most 2^32"),
              "status %d, %s", (int)st, err.msg);
    CHECK(dev.n_allocs == 0);
    if (st == CT_OK) ct_net_free(&net);
    ct_layer_free(l);
}

// Leaves the stack below the caller's frame full of non-zero bytes.
__attribute__((noinline)) static void dirty_stack(void) {
    volatile char junk[16384];
    for (size_t i = 0; i < sizeof junk; i++) junk[i] = 'x';
}

// ct_fs_mkdirs("") walked from buf[1], past the path's terminator, through
// whatever the stack held (past the buffer: ASan's stack-buffer-overflow).
static void test_mkdirs_empty(void) {
    ct_error err;
    ct_error_clear(&err);
    dirty_stack();
    CHECK(ct_fs_mkdirs("", &err) == CT_ERR_ARG);
}

// ct_fs_parent_dir of a bare name, a file at the root and a nested one;
// ct_fs_temp_name at its exact length (the terminator must fit); and
// ct_fs_read_max takes a file of exactly max bytes, refuses one of max + 1.
static void test_fs_paths(void) {
    char dir[CT_FS_PATH_CAP];
    ct_fs_parent_dir(dir, "x");
    CHECK(strcmp(dir, ".") == 0);
    ct_fs_parent_dir(dir, "/x");
    CHECK(strcmp(dir, "/") == 0);
    ct_fs_parent_dir(dir, "a/b/c");
    CHECK(strcmp(dir, "a/b") == 0);
    char want[64], tmp[64];
    int len = snprintf(want, sizeof want, "d/.f.tmp-%ld", (long)getpid());
    ct_error err;
    CHECK(ct_fs_temp_name(tmp, (size_t)len + 1, "d/f", &err) == CT_OK && strcmp(tmp, want) == 0);
    CHECK(ct_fs_temp_name(tmp, (size_t)len, "d/f", &err) == CT_ERR_ARG);
    char path[] = "/tmp/ctrax_test_core_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0);
    if (fd < 0) return;
    CHECK(ct_fs_write_all(fd, "12345", 5, path, &err) == CT_OK && ct_fs_close(fd, path, CT_OK, &err) == CT_OK);
    char *data;
    size_t n;
    CHECK(ct_fs_read_max(path, 5, &data, &n, &err) == CT_OK && n == 5 && strcmp(data, "12345") == 0);
    free(data);
    CHECK(ct_fs_read_max(path, 4, &data, &n, &err) == CT_ERR_FORMAT && data == NULL);
    unlink(path);
    // A directory path that is a symlink to itself: mkdir says it exists;
    // the error says why it is no directory.
    char loop[64];
    snprintf(loop, sizeof loop, "/tmp/ctrax_test_core_loop_%ld", (long)getpid());
    CHECK(symlink(loop, loop) == 0);
    CHECK(ct_fs_mkdirs(loop, &err) == CT_ERR_IO);
    CHECK_MSG(strstr(err.msg, "not a directory (Too many levels of symbolic links)"), "%s", err.msg);
    unlink(loop);
}

// ct_json_int prints every int64 exactly (a double has 53 bits: 2^53 + 1
// and INT64_MAX would print rounded, the latter in exponent form), and
// ct_json_parse refuses anything but whitespace after the value.
static void test_json_edges(void) {
    static const int64_t v[3] = {((int64_t)1 << 53) + 1, INT64_MAX, INT64_MIN};
    static const char *want[3] = {"9007199254740993", "9223372036854775807", "-9223372036854775808"};
    for (int i = 0; i < 3; i++) {
        cJSON *j = ct_json_int(v[i]);
        char *text = cJSON_PrintUnformatted(j);
        CHECK_MSG(text && strcmp(text, want[i]) == 0, "ct_json_int(%s) printed %s", want[i], text ? text : "nothing");
        free(text);
        cJSON_Delete(j);
    }
    ct_error err;
    cJSON *ok = ct_json_parse("{\"a\": 1} \n\t", 11, "t.json", &err);
    CHECK(ok != NULL);
    cJSON_Delete(ok);
    static const char *trailing[3] = {"{} x", "{}{}", "1 2"};
    for (int i = 0; i < 3; i++) {
        cJSON *j = ct_json_parse(trailing[i], strlen(trailing[i]), "t.json", &err);
        CHECK_MSG(j == NULL && err.code == CT_ERR_FORMAT && strstr(err.msg, "more after the JSON value"),
                  "'%s' parsed", trailing[i]);
        cJSON_Delete(j);
    }
    // Parsing stops at its budget of cJSON's memory: 100,000 zeros (200 KB
    // of text, some 6 MB parsed) within 1 MiB are refused, within 64 MiB and
    // ct_json_parse's default they parse; allocations after a refused parse
    // are not counted.
    enum { ZEROS = 100000 };
    char *zeros = malloc(2 * ZEROS + 2), *q = zeros;
    *q++ = '[';
    for (int i = 0; i < ZEROS; i++) q += sprintf(q, i ? ",0" : "0");
    *q++ = ']';
    size_t n = (size_t)(q - zeros);
    cJSON *j = ct_json_parse_within(zeros, n, "zeros.json", (size_t)1 << 20, &err);
    CHECK_MSG(j == NULL && err.code == CT_ERR_FORMAT &&
                  strstr(err.msg, "zeros.json: parsing its 200001 bytes would take more than 1 MiB"),
              "100,000 zeros within 1 MiB: %s", j ? "parsed" : err.msg);
    cJSON_Delete(j);
    cJSON *big = cJSON_CreateArray();  // after the refusal: not counted
    for (int i = 0; i < ZEROS && big; i++) cJSON_AddItemToArray(big, cJSON_CreateNumber(0));
    CHECK(big && cJSON_GetArraySize(big) == ZEROS);
    cJSON_Delete(big);
    j = ct_json_parse_within(zeros, n, "zeros.json", (size_t)64 << 20, &err);
    CHECK(j && cJSON_GetArraySize(j) == ZEROS);
    cJSON_Delete(j);
    j = ct_json_parse(zeros, n, "zeros.json", &err);
    CHECK(j && cJSON_GetArraySize(j) == ZEROS);
    cJSON_Delete(j);
    free(zeros);
}

static void test_device_limit(void) {
    ct_device dev = ct_device_cpu();
    dev.limit_bytes = 1000;
    void *p;
    ct_error err;
    CHECK(ct_device_alloc(&dev, 512, "first", &p, &err) == CT_OK);
    CHECK(ct_device_alloc(&dev, 600, "second", (void **)&err, &err) == CT_ERR_MEMORY);
    CHECK(strstr(err.msg, "second needs 640 bytes") != NULL);
    ct_device_free(&dev, p, 512);
    CHECK(dev.current_bytes == 0 && dev.peak_bytes == 512);
}

static void test_errors(void) {
    ct_error err;
    CHECK(ct_error_set(&err, CT_ERR_IO, "file %s", "x.bin") == CT_ERR_IO);
    ct_error_prefix(&err, "loading %d", 3);
    CHECK(strcmp(err.msg, "loading 3: file x.bin") == 0);
    CHECK(ct_error_set(NULL, CT_ERR_ARG, "ignored") == CT_ERR_ARG);
    CHECK(strcmp(ct_status_name(CT_ERR_SHAPE), "shape error") == 0);
    // An outside name's control characters (a checkpoint directory named
    // with a terminal escape, a C1 CSI in UTF-8) come out as '?', in a
    // message and in its prefix; newline, tab and other UTF-8 stay.
    ct_error_set(&err, CT_ERR_IO, "checkpoint '%s'", "m\x1b]0;x\x07\xc2\x9b" "2J\x7f\t\xe2\x82\xac");
    ct_error_prefix(&err, "run\x1b[31m\n%d", 1);
    CHECK_MSG(strcmp(err.msg, "run?[31m\n1: checkpoint 'm?]0;x???2J?\t\xe2\x82\xac'") == 0, "[%s]", err.msg);
    // ct_log the same (stderr into a file for the line).
    FILE *f = tmpfile();
    int saved = dup(2);
    fflush(stderr);
    dup2(fileno(f), 2);
    ct_log_level level = ct_log_get_level();
    ct_log_set_level(CT_LOG_INFO);
    ct_log(CT_LOG_WARN, "name '%s'", "a\x1b[2Jb");
    ct_log_set_level(level);
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    char line[64] = "";
    rewind(f);
    CHECK(fgets(line, sizeof line, f) != NULL);
    fclose(f);
    CHECK_MSG(strcmp(line, "[ctrax warn] name 'a?[2Jb'\n") == 0, "[%s]", line);
}

// The checked allocation path (memory.h): a size too large for the address
// space fails with a message naming what; a fitting one is zeroed. And
// ct_error_prefix cuts a long message to fit, the prefix kept whole.
static void test_checked_alloc(void) {
    ct_error err;
    ct_error_clear(&err);
    void *p = ct_calloc_checked(SIZE_MAX / 2, 4, &err, "%s: the header's %d entries", "w.safetensors", 3);
    CHECK(p == NULL && err.code == CT_ERR_MEMORY);
    CHECK(strstr(err.msg, "w.safetensors: the header's 3 entries: out of memory for ") == err.msg);
    int *q = ct_calloc_checked(4, sizeof *q, &err, "four ints");
    CHECK(q && q[0] == 0 && q[3] == 0);
    ct_free(q);
    char *d = ct_strdup_checked("name", &err, "a name");
    CHECK(d && strcmp(d, "name") == 0);
    ct_free(d);
    char long_msg[2 * CT_ERROR_MSG_MAX];
    memset(long_msg, 'x', sizeof long_msg - 1);
    long_msg[sizeof long_msg - 1] = '\0';
    ct_error_set(&err, CT_ERR_IO, "%s", long_msg);
    CHECK(ct_error_prefix(&err, "file %d", 7) == CT_ERR_IO);
    CHECK(strncmp(err.msg, "file 7: xxx", 11) == 0 && strlen(err.msg) == CT_ERROR_MSG_MAX - 1);
}

// A message longer than CT_ERROR_MSG_MAX keeps its start and its end (the
// reason), " ... " for the middle (a long path), set or prefixed; a cut
// never splits a UTF-8 character.
static void test_error_long_message(void) {
    char path[3 * CT_ERROR_MSG_MAX];
    memset(path, 'd', sizeof path - 1);
    path[sizeof path - 1] = '\0';
    ct_error err;
    ct_error_set(&err, CT_ERR_IO, "%s: cannot open: %s", path, "No such file or directory");
    size_t n = strlen(err.msg);
    CHECK(n == CT_ERROR_MSG_MAX - 1 && strncmp(err.msg, "ddd", 3) == 0 && strstr(err.msg, "d ... d"));
    CHECK(n > 40 && strcmp(err.msg + n - 40, "ddd: cannot open: No such file or directory" + 3) == 0);
    ct_error_set(&err, CT_ERR_FORMAT, "bad value");
    CHECK(ct_error_prefix(&err, "config %s, line %d", path, 3) == CT_ERR_FORMAT);
    n = strlen(err.msg);
    CHECK(n == CT_ERROR_MSG_MAX - 1 && strncmp(err.msg, "config ddd", 10) == 0);
    CHECK(strcmp(err.msg + n - strlen("d, line 3: bad value"), "d, line 3: bad value") == 0);
    // Two-byte characters (U+00E9): every byte of the result is part of a whole one.
    char wide[2 * CT_ERROR_MSG_MAX + 1];
    for (int i = 0; i < CT_ERROR_MSG_MAX; i++) wide[2 * i] = (char)0xC3, wide[2 * i + 1] = (char)0xA9;
    wide[2 * CT_ERROR_MSG_MAX] = '\0';
    for (int shift = 0; shift < 2; shift++) {
        ct_error_set(&err, CT_ERR_ARG, "%.*s%s", shift, "x", wide);
        const unsigned char *m = (const unsigned char *)err.msg + shift;
        bool whole = true;
        for (size_t i = 0; m[i]; i++) {
            if (m[i] == 0xC3) whole = whole && m[i + 1] == 0xA9, i++;
            else if (m[i] == 0xA9) whole = false;
        }
        CHECK(whole && strstr(err.msg, " ... "));
    }
    // Three- and four-byte characters (U+20AC, U+1F600), cut at every
    // offset within one: valid UTF-8 after the cut, set or prefixed.
    static const char *chars[2] = {"\xe2\x82\xac", "\xf0\x9f\x98\x80"};
    for (int c = 0; c < 2; c++) {
        size_t w = strlen(chars[c]);
        char many[4 * CT_ERROR_MSG_MAX + 1] = "";
        for (size_t i = 0; i + w < sizeof many; i += w) memcpy(many + i, chars[c], w), many[i + w] = '\0';
        for (int shift = 0; shift < 4; shift++) {
            ct_error_set(&err, CT_ERR_ARG, "%.*s%s", shift, "xyz", many);
            bool ok = ct_utf8_valid(err.msg) && strstr(err.msg, " ... ");
            ct_error_set(&err, CT_ERR_ARG, "%s", many + w);
            ct_error_prefix(&err, "%.*s", shift, "xyz");
            ok = ok && ct_utf8_valid(err.msg);
            CHECK_MSG(ok, "a %zu-byte character, shifted %d: a cut split one", w, shift);
        }
    }
    // Exactly CT_ERROR_MSG_MAX characters, one more than the buffer holds:
    // cut as any longer message.
    char exact[CT_ERROR_MSG_MAX + 1];
    memset(exact, 'e', CT_ERROR_MSG_MAX);
    exact[CT_ERROR_MSG_MAX] = '\0';
    ct_error_set(&err, CT_ERR_IO, "%s", exact);
    CHECK(strnlen(err.msg, sizeof err.msg) == CT_ERROR_MSG_MAX - 1 && strstr(err.msg, "e ... e"));
    // A message that fits is as formatted.
    ct_error_set(&err, CT_ERR_IO, "%s: %d", "short", 5);
    CHECK(strcmp(err.msg, "short: 5") == 0);
}

static jmp_buf abort_jump;
static char abort_msg[256];

static void test_abort_handler_fn(const char *file, int line, const char *msg) {
    (void)file, (void)line;
    snprintf(abort_msg, sizeof abort_msg, "%s", msg);
    longjmp(abort_jump, 1);  // a handler must not return
}

static void test_abort_handler(void) {
    ct_set_abort_handler(test_abort_handler_fn);
    volatile int reached = 0;
    if (setjmp(abort_jump) == 0) {
        CT_ASSERT(1 + 1 == 3);
        reached = 1;
    }
    CHECK(!reached);
    CHECK(strcmp(abort_msg, "assertion failed: 1 + 1 == 3") == 0);
    ct_set_abort_handler(NULL);  // back to the default
}

static void test_log_level(void) {
    ct_log_level old = ct_log_get_level();
    CHECK(old == CT_LOG_INFO);
    ct_log_set_level(CT_LOG_OFF);
    CHECK(ct_log_get_level() == CT_LOG_OFF);
    ct_log(CT_LOG_ERROR, "not shown: the level is off");
    ct_log_set_level(old);
}

// ct_f32_first_nonfinite finds NaN, +Inf and -Inf at every position of
// blocks and tails, and passes the largest finite floats and subnormals.
static void test_first_nonfinite(void) {
    enum { N = 9000 };  // two 4096 blocks and a tail
    static float x[N];
    for (int i = 0; i < N; i++) x[i] = i % 3 == 0 ? 3.4028235e38f : (i % 3 == 1 ? -1e-45f : (float)i);
    CHECK(ct_f32_first_nonfinite(x, N) == N);
    CHECK(ct_f32_first_nonfinite(x, 0) == 0);
    const float bad[3] = {NAN, INFINITY, -INFINITY};
    const int at[5] = {0, 4095, 4096, 8191, N - 1};
    int wrong = 0;
    for (int b = 0; b < 3; b++)
        for (int k = 0; k < 5; k++) {
            float keep = x[at[k]];
            x[at[k]] = bad[b];
            wrong += ct_f32_first_nonfinite(x, N) != at[k];
            if (at[k] > 0) wrong += ct_f32_first_nonfinite(x, at[k]) != at[k];  // the bad one just past n
            x[at[k]] = keep;
        }
    CHECK_MSG(wrong == 0, "%d wrong answers", wrong);
}

// UTF-8 sequences by RFC 3629's table: each valid form at its edges, and
// the overlong, surrogate, past-U+10FFFF, stray and cut-short ones.
static void test_utf8(void) {
    static const struct {
        const char *s;
        size_t n, want;
    } cases[] = {
        {"a", 1, 1},                 {"\x7f", 1, 1},             {"\xc2\x80", 2, 2},
        {"\xdf\xbf", 2, 2},          {"\xe0\xa0\x80", 3, 3},     {"\xed\x9f\xbf", 3, 3},
        {"\xef\xbf\xbf", 3, 3},      {"\xf0\x90\x80\x80", 4, 4}, {"\xf4\x8f\xbf\xbf", 4, 4},
        {"\x80", 1, 0},              {"\xc0\x80", 2, 0},          {"\xc1\xbf", 2, 0},
        {"\xe0\x80\x80", 3, 0},      {"\xed\xa0\x80", 3, 0},     {"\xf0\x80\x80\x80", 4, 0},
        {"\xf4\x90\x80\x80", 4, 0}, {"\xf5\x80\x80\x80", 4, 0}, {"\xe2\x82", 2, 0},
        {"\xe2\x82\x41", 3, 0},      {"", 0, 0},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        size_t got = ct_utf8_len((const unsigned char *)cases[i].s, cases[i].n);
        CHECK_MSG(got == cases[i].want, "case %zu: length %zu, want %zu", i, got, cases[i].want);
    }
    CHECK(ct_utf8_valid("caf\xc3\xa9 \xe2\x82\xac") && ct_utf8_valid(""));
    CHECK(!ct_utf8_valid("caf\xc3") && !ct_utf8_valid("\xed\xa0\x80"));
}

int main(void) {
    test_utf8();
    test_first_nonfinite();
    test_abort_handler();
    test_log_level();
    test_threefry();
    test_rng_known_answers();
    test_keys();
    test_tensor();
    test_arena();
    test_bulk();
    test_hostile_sizes();
    test_random_init_limit();
    test_mkdirs_empty();
    test_fs_paths();
    test_json_edges();
    test_device_limit();
    test_errors();
    test_checked_alloc();
    test_error_long_message();
    return check_summary("test_core");
}
