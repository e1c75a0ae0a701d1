// Data streams: each source against hand-built expectations, the
// transforms, clear errors for bad files, the prefetch thread, and exact
// resume: a stream restored from a cursor yields the batches the
// uninterrupted stream yields (every source, with shuffling and prefetch).
// Arrays in memory also feed a Loop that is stopped and resumed.
// Ends with a smoke test on Debian's fortunes and Fashion-MNIST packages.
#define _GNU_SOURCE
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/rng.h"
#include "ctrax/ctrax.h"
#include "ctrax/data/stream.h"
#include "ctrax/data/synthetic.h"
#include "data/stream_internal.h"

static char tmpdir[256];

static const char *tmp_path(const char *name) {
    static char bufs[8][512];
    static int next;
    char *b = bufs[next++ % 8];
    snprintf(b, 512, "%s/%s", tmpdir, name);
    return b;
}

static void write_file(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK_MSG(f != NULL, "cannot write %s", path);
    if (!f) return;
    if (n) fwrite(data, 1, n, f);
    fclose(f);
}

static void write_gz(const char *path, const void *data, size_t n) {
    gzFile f = gzopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    if (n) gzwrite(f, data, (unsigned)n);
    gzclose(f);
}

static int rm_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

// ---- recording batches ------------------------------------------------------------------

// A deep copy of an item, to compare streams.
typedef struct rec {
    ct_batch b;
    void *data[CT_BATCH_MAX_TENSORS];
} rec;

static rec rec_copy(const ct_batch *b) {
    rec r;
    memset(&r, 0, sizeof r);
    r.b = *b;
    for (int i = 0; i < b->n; i++) {
        size_t n = ct_tensor_nbytes(&b->t[i]);
        r.data[i] = malloc(n ? n : 1);
        if (n) memcpy(r.data[i], b->t[i].data, n);
        r.b.t[i].data = r.data[i];
    }
    return r;
}

static void rec_free(rec *r) {
    for (int i = 0; i < CT_BATCH_MAX_TENSORS; i++) free(r->data[i]);
}

static bool rec_equal(const rec *a, const rec *b) {
    if (a->b.n != b->b.n) return false;
    for (int i = 0; i < a->b.n; i++) {
        if (!ct_tensor_same_sig(&a->b.t[i], &b->b.t[i])) return false;
        if (memcmp(a->data[i], b->data[i], ct_tensor_nbytes(&a->b.t[i])) != 0) return false;
    }
    return true;
}

// Takes n items into recs (which may be NULL); returns how many there were.
static int take(ct_stream *s, int n, rec *recs) {
    ct_error err;
    for (int i = 0; i < n; i++) {
        ct_batch b;
        ct_status st = ct_stream_next(s, &b, &err);
        CHECK_MSG(st == CT_OK, "%s", err.msg);
        if (st != CT_OK || b.n == 0) return i;
        if (recs) recs[i] = rec_copy(&b);
    }
    return n;
}

// ---- building chains ---------------------------------------------------------------------

typedef ct_stream *(*build_fn)(void);

// The stream *sp after the call that returned st (read only once st is known).
static ct_stream *must(ct_status st, ct_stream **sp, const ct_error *err) {
    CHECK_MSG(st == CT_OK, "%s", err->msg);
    return st == CT_OK ? *sp : NULL;
}

// Exact resume: take n items, save the cursor, take m more; a fresh stream
// set to the cursor yields the same m items. Also: seeking the first stream
// back to the cursor, and restoring a cursor of position 0.
static void check_resume(const char *label, build_fn build, int n, int m) {
    ct_error err;
    ct_stream *a = build();
    CHECK_MSG(a != NULL, "%s: build failed", label);
    if (!a) return;
    rec *first = calloc((size_t)n, sizeof *first), *want = calloc((size_t)m, sizeof *want),
        *got = calloc((size_t)m, sizeof *got);
    int na = take(a, n, first);
    CHECK_MSG(na == n, "%s: only %d of %d items", label, na, n);
    ct_stream_cursor c = ct_stream_get_cursor(a);
    CHECK(c.position == n);
    CHECK(c.fingerprint >= 0 && c.fingerprint < (INT64_C(1) << 53));
    int nm = take(a, m, want);
    CHECK_MSG(nm == m, "%s: only %d of %d items after the cursor", label, nm, m);

    ct_stream *b = build();
    CHECK_OK(ct_stream_set_cursor(b, c, &err), &err);
    int nb = take(b, m, got);
    CHECK(nb == m);
    int same = 0;
    for (int i = 0; i < nm && i < nb; i++) same += rec_equal(&want[i], &got[i]);
    CHECK_MSG(same == m, "%s: %d of %d items after restoring position %d are the same", label, same, m, n);
    for (int i = 0; i < nb; i++) rec_free(&got[i]);

    // The same stream, seeked back.
    CHECK_OK(ct_stream_set_cursor(a, c, &err), &err);
    nb = take(a, m, got);
    same = 0;
    for (int i = 0; i < nm && i < nb; i++) same += rec_equal(&want[i], &got[i]);
    CHECK_MSG(same == m, "%s: %d of %d items after seeking back to %d are the same", label, same, m, n);
    for (int i = 0; i < nb; i++) rec_free(&got[i]);

    // Back to the start.
    ct_stream_cursor zero = {0, c.fingerprint};
    CHECK_OK(ct_stream_set_cursor(b, zero, &err), &err);
    rec *again = calloc((size_t)n, sizeof *again);
    int n0 = take(b, n, again), same0 = 0;
    for (int i = 0; i < n0 && i < na; i++) same0 += rec_equal(&first[i], &again[i]);
    CHECK_MSG(same0 == n, "%s: %d of %d items after restoring position 0 are the same", label, same0, n);
    for (int i = 0; i < n0; i++) rec_free(&again[i]);
    free(again);
    printf("  resume %-40s %d items, cursor {position %lld, fingerprint %lld}: %d of %d identical\n", label, n,
           (long long)c.position, (long long)c.fingerprint, same, m);
    for (int i = 0; i < na; i++) rec_free(&first[i]);
    for (int i = 0; i < nm; i++) rec_free(&want[i]);
    free(first);
    free(want);
    free(got);
    ct_stream_free(a);
    ct_stream_free(b);
}

// Every position: a fresh stream restored to position n (n = 0, step, 2
// step, ... < total) yields the items n, n+1, n+2 of one uninterrupted run.
static void check_positions(const char *label, build_fn build, int total, int step) {
    ct_error err;
    ct_stream *a = build();
    if (!a) return;
    rec *all = calloc((size_t)total + 3, sizeof *all);
    int n = take(a, total + 3, all), tried = 0, same = 0;
    ct_stream_cursor c = ct_stream_get_cursor(a);
    ct_stream_free(a);
    for (int pos = 0; pos < total; pos += step) {
        ct_stream *b = build();
        c.position = pos;
        CHECK_OK(ct_stream_set_cursor(b, c, &err), &err);
        rec got[3];
        int k = take(b, 3, got);
        int ok = 1;
        for (int i = 0; i < 3; i++) ok &= pos + i < n ? i < k && rec_equal(&all[pos + i], &got[i]) : i >= k;
        for (int i = 0; i < k; i++) rec_free(&got[i]);
        tried++;
        same += ok;
        ct_stream_free(b);
    }
    CHECK_MSG(same == tried, "%s: %d of %d restored positions right", label, same, tried);
    printf("  positions %-37s %d restored positions of %d items: %d right\n", label, tried, n, same);
    for (int i = 0; i < n; i++) rec_free(&all[i]);
    free(all);
}

// ---- synthetic sources --------------------------------------------------------------------

static void test_copy(void) {
    ct_error err;
    ct_copy_task t = {12, 5, false, 7, 0};
    ct_stream *s = NULL;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    CHECK(ct_stream_signature(s, sigs) == 3);
    CHECK(sigs[0].ndim == 1 && sigs[0].shape[0] == 12 && sigs[2].dtype == CT_DTYPE_F32);
    CHECK(ct_stream_length(s) == -1);
    // Example 3, built by hand from the documented scheme: key fold_in(
    // fold_in(key(seed), 3), 0); draw 0 is the length, draw 1 + k token k.
    CHECK_OK(ct_stream_seek(s, 3, &err), &err);
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    ct_key key = ct_key_fold_in(ct_key_fold_in(ct_key_from_seed(7), 3), 0);
    int32_t want[12];
    want[0] = want[6] = 0;
    for (int k = 0; k < 5; k++) {
        uint32_t bits = ct_random_bits(key, (uint32_t)(1 + k));
        want[1 + k] = want[7 + k] = 1 + (int32_t)(((uint64_t)bits * 11) >> 32);
    }
    CHECK(b.n == 3 && b.t[0].shape[0] == 12);
    CHECK(memcmp(ct_i32(&b.t[0]), want, sizeof want) == 0);
    CHECK(memcmp(ct_i32(&b.t[1]), want, sizeof want) == 0);
    for (int i = 0; i < 12; i++) CHECK(ct_f32(&b.t[2])[i] == (i >= 7 ? 1.0f : 0.0f));
    // ct_copy_task_batch: batch 1 draws from key fold_in(fold_in(key(seed), 1), 0),
    // token k of row b from element 5 b + k, as tokens 1 + bits % (vocab - 1).
    int32_t tokens[2 * 12];
    float weights[2 * 12];
    ct_copy_task_batch(&t, 1, 2, tokens, weights);
    ct_key bkey = ct_key_fold_in(ct_key_fold_in(ct_key_from_seed(7), 1), 0);
    int rows_ok = 1;
    for (int r = 0; r < 2; r++)
        for (int k = 0; k < 5; k++) {
            int32_t tok = 1 + (int32_t)(ct_random_bits(bkey, (uint32_t)(5 * r + k)) % 11);
            rows_ok &= tokens[12 * r + 1 + k] == tok && tokens[12 * r + 7 + k] == tok;
        }
    CHECK(rows_ok && tokens[12] == 0 && tokens[18] == 0);
    CHECK(weights[12 + 7] == 1.0f && weights[12 + 6] == 0.0f);
    ct_stream_free(s);

    // Reverse, variable length: "0 w 0 reverse(w)", lengths in [2, 6].
    ct_copy_task r = {9, 6, true, 1, 2};
    CHECK_OK(ct_copy_stream_new(&s, &r, &err), &err);
    CHECK(ct_stream_signature(s, sigs) == 3 && sigs[0].shape[0] == -1);
    int seen[7] = {0}, bad = 0;
    for (int e = 0; e < 200; e++) {
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        int len = (int)b.t[0].shape[0], n = (len - 2) / 2;
        if (len % 2 || n < 2 || n > 6) {
            bad++;
            continue;
        }
        seen[n]++;
        const int32_t *x = ct_i32(&b.t[0]);
        const float *w = ct_f32(&b.t[2]);
        if (x[0] != 0 || x[n + 1] != 0) bad++;
        for (int k = 0; k < n; k++) {
            if (x[1 + k] < 1 || x[1 + k] >= 9 || x[n + 2 + k] != x[n - k]) bad++;
            if (w[1 + k] != 0.0f || w[n + 2 + k] != 1.0f) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d malformed reverse examples", bad);
    for (int n = 2; n <= 6; n++) CHECK_MSG(seen[n] > 10, "w length %d seen %d times of 200", n, seen[n]);
    ct_stream_free(s);

    // A cursor saved by copy(seed 7) is refused by another seed and by reverse.
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    ct_stream_cursor cur = ct_stream_get_cursor(s);
    ct_stream_free(s);
    ct_copy_task others[2] = {{12, 5, false, 8, 0}, {12, 5, true, 7, 0}};
    for (int i = 0; i < 2; i++) {
        CHECK_OK(ct_copy_stream_new(&s, &others[i], &err), &err);
        CHECK_MSG(ct_stream_set_cursor(s, cur, &err) == CT_ERR_STATE, "copy task %d took another's cursor", i);
        ct_stream_free(s);
    }
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK_OK(ct_stream_set_cursor(s, cur, &err), &err);
    ct_stream_free(s);

    // Example 2^32 + 3 draws from fold_in(fold_in(key(seed), 3), 1): the
    // high 32 bits of the index are folded in as they are.
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK_OK(ct_stream_seek(s, (INT64_C(1) << 32) + 3, &err), &err);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    key = ct_key_fold_in(ct_key_fold_in(ct_key_from_seed(7), 3), 1);
    for (int k = 0; k < 5; k++) {
        uint32_t bits = ct_random_bits(key, (uint32_t)(1 + k));
        want[1 + k] = want[7 + k] = 1 + (int32_t)(((uint64_t)bits * 11) >> 32);
    }
    CHECK(b.n == 3 && memcmp(ct_i32(&b.t[0]), want, sizeof want) == 0);
    ct_stream_free(s);
    CHECK(ct_copy_stream_new(&s, &(ct_copy_task){12, 5, false, 7, 6}, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "copy task: min_length is 6; expected 0 (fixed) or 1..length (5)"), "%s", err.msg);

    CHECK(ct_copy_stream_new(&s, &(ct_copy_task){1, 5, false, 0, 0}, &err) == CT_ERR_ARG);
    CHECK(strstr(err.msg, "vocab_size is 1") != NULL);
    CHECK(s == NULL);
}

// Decodes the little-endian number of the tokens [from, to) (digit d is token d + 1).
static uint64_t decode(const int32_t *x, int from, int to, int base, int *bad) {
    uint64_t v = 0, p = 1;
    for (int i = from; i < to; i++) {
        if (x[i] < 1 || x[i] > base) (*bad)++;
        v += (uint64_t)(x[i] - 1) * p;
        p *= (uint64_t)base;
    }
    if (to - from > 1 && x[to - 1] == 1) (*bad)++;  // a leading zero
    return v;
}

static void test_addition(void) {
    ct_error err;
    ct_addition_task t = {13, 3, 9, 5};  // base 10: "+" = 11, <S> = 12
    ct_stream *s;
    CHECK_OK(ct_addition_stream_new(&s, &t, &err), &err);
    int bad = 0, longest = 0, single_zero = 0;
    int l1_seen[10] = {0}, l2_seen[10] = {0};
    for (int e = 0; e < 500; e++) {
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        const int32_t *x = ct_i32(&b.t[0]);
        const float *w = ct_f32(&b.t[2]);
        int len = (int)b.t[0].shape[0];
        if (len > longest) longest = len;
        int plus = -1, sep = -1;
        for (int i = 1; i < len; i++) {
            if (x[i] == 11 && plus < 0) plus = i;
            if (x[i] == 12 && sep < 0) sep = i;
        }
        if (x[0] != 12 || plus < 2 || sep < plus + 2 || sep >= len - 1) {
            bad++;
            continue;
        }
        int l1 = plus - 1, l2 = sep - plus - 1;
        // Trax: a = (min-1)/2 = 1; l1 in [1, 1 + (9-1+1)/2) = [1, 5); l2 in [1, 9 - l1 - 1].
        if (l1 < 1 || l1 > 4 || l2 < 1 || l2 > 9 - l1 - 1) bad++;
        l1_seen[l1]++;
        l2_seen[l2 < 10 ? l2 : 9]++;
        // Trax: only a one-digit number may be 0.
        single_zero += (l1 == 1 && x[1] == 1) + (l2 == 1 && x[plus + 1] == 1);
        uint64_t a = decode(x, 1, plus, 10, &bad), c = decode(x, plus + 1, sep, 10, &bad),
                 sum = decode(x, sep + 1, len, 10, &bad);
        if (a + c != sum) bad++;
        for (int i = 0; i < len; i++)
            if (w[i] != (i > sep ? 1.0f : 0.0f)) bad++;
        if (memcmp(x, ct_i32(&b.t[1]), (size_t)len * 4) != 0) bad++;
    }
    CHECK_MSG(bad == 0, "%d malformed addition examples", bad);
    CHECK(longest <= 2 * 9 + 1);
    for (int l = 1; l <= 4; l++) CHECK_MSG(l1_seen[l] > 0, "l1 = %d never drawn", l);
    CHECK(l2_seen[1] > 0 && l2_seen[7] > 0);
    CHECK_MSG(single_zero > 0, "no one-digit 0 in 500 examples");
    // The seed decides the examples: a cursor saved with seed 5 is refused
    // with seed 6.
    ct_stream_cursor cur = ct_stream_get_cursor(s);
    ct_stream_free(s);
    CHECK_OK(ct_addition_stream_new(&s, &(ct_addition_task){13, 3, 9, 6}, &err), &err);
    CHECK(ct_stream_set_cursor(s, cur, &err) == CT_ERR_STATE);
    ct_stream_free(s);
    // An even min_length: Trax's a = (4 - 1) // 2 = 1, so with lengths 4..4
    // l1 is drawn from [1, 1 + (4 - 1 + 1) // 2) = {1, 2} and l2 from [1, 4 - l1 - 1].
    CHECK_OK(ct_addition_stream_new(&s, &(ct_addition_task){13, 4, 4, 6}, &err), &err);
    int l1_count[3] = {0}, odd = 0;
    for (int e = 0; e < 100; e++) {
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        const int32_t *x = ct_i32(&b.t[0]);
        int plus = -1, sep = -1;
        for (int i = 1; i < b.t[0].shape[0]; i++) {
            if (x[i] == 11 && plus < 0) plus = i;
            if (x[i] == 12 && sep < 0) sep = i;
        }
        int l1 = plus - 1, l2 = sep - plus - 1;
        if (l1 < 1 || l1 > 2 || l2 < 1 || l2 > 4 - l1 - 1) {
            odd++;
            continue;
        }
        l1_count[l1]++;
    }
    CHECK_MSG(odd == 0 && l1_count[1] > 0 && l1_count[2] > 0, "lengths 4..4: %d odd, l1 = 1 %d times, l1 = 2 %d times",
              odd, l1_count[1], l1_count[2]);
    ct_stream_free(s);
    // Trax's own check: lengths below 3 are an error.
    CHECK(ct_addition_stream_new(&s, &(ct_addition_task){13, 2, 9, 0}, &err) == CT_ERR_ARG);
    // Base 1 (vocab_size 4) has no digits to draw.
    CHECK(ct_addition_stream_new(&s, &(ct_addition_task){4, 3, 9, 0}, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "addition task: vocab_size is 4; expected >= 5"), "%s", err.msg);
    // The largest vocab_size: base 2^31 - 4, whose two digits summed
    // overflowed an int (negative sum digits). Lengths 3..3: one-digit x and
    // y, so the sum fits a uint64 whatever the digits.
    CHECK_OK(ct_addition_stream_new(&s, &(ct_addition_task){INT32_MAX, 3, 3, 2}, &err), &err);
    int wrong = 0, carries = 0;
    const int big_base = INT32_MAX - 3;
    for (int e = 0; e < 100; e++) {
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        const int32_t *x = ct_i32(&b.t[0]);
        int len = (int)b.t[0].shape[0];
        // <S> a + c <S> sum: 5 tokens, then 1 or 2 digits of the sum.
        if (len < 6 || len > 7 || x[0] != big_base + 2 || x[2] != big_base + 1 || x[4] != big_base + 2) {
            wrong++;
            continue;
        }
        carries += len == 7;
        uint64_t a = decode(x, 1, 2, big_base, &wrong), c = decode(x, 3, 4, big_base, &wrong);
        if (a + c != decode(x, 5, len, big_base, &wrong)) wrong++;
    }
    CHECK_MSG(wrong == 0 && carries > 0, "base 2^31 - 4: %d wrong sums, %d of 100 with a carry", wrong, carries);
    ct_stream_free(s);
}

// ---- text and token files --------------------------------------------------------------------

static void test_text(void) {
    ct_error err;
    mkdir(tmp_path("text"), 0700);
    mkdir(tmp_path("text/sub"), 0700);
    write_file(tmp_path("text/a.txt"), "abcdefghij", 10);
    write_file(tmp_path("text/sub/b.txt"), "0123456789", 10);
    write_file(tmp_path("text/.hidden"), "zzz", 3);
    write_file(tmp_path("text/bin.dat"), "\x00\x00\x00\x02", 4);
    write_file(tmp_path("text/empty"), "", 0);
    CHECK(symlink("a.txt", tmp_path("text/c.txt")) == 0);  // the same file again: read once

    const char *dir[] = {tmp_path("text")};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = dir;
    p.n_paths = 1;
    p.seq_len = 4;
    ct_stream *s;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK(ct_corpus_n_files(s) == 2);
    CHECK(ct_corpus_file(s, 0) && strstr(ct_corpus_file(s, 0), "text/a.txt"));
    CHECK(ct_corpus_file(s, 1) && strstr(ct_corpus_file(s, 1), "text/sub/b.txt"));
    // "abcdefghij" + "0123456789" (.hidden, bin.dat, empty and the link
    // skipped) in chunks of 4: 5 chunks.
    const char *want[] = {"abcd", "efgh", "ij01", "2345", "6789"};
    CHECK(ct_stream_length(s) == 5);
    int ok = 0;
    for (int i = 0; i < 5; i++) {
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        int good = b.n == 3 && b.t[0].shape[0] == 4;
        for (int k = 0; good && k < 4; k++)
            good = ct_i32(&b.t[0])[k] == want[i][k] && ct_i32(&b.t[1])[k] == want[i][k] && ct_f32(&b.t[2])[k] == 1.0f;
        ok += good;
    }
    CHECK(ok == 5);
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 0);  // finite: the end
    // The end is no item: the cursor stays at 5 however often it is asked for.
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 0 && ct_stream_get_cursor(s).position == 5);
    char desc[256];
    printf("  %s\n", ct_stream_describe(s, desc, sizeof desc));
    ct_stream_free(s);

    // Shifted: chunks of 3 + 1 = 4 bytes; inputs [0, 3), targets [1, 4).
    p.seq_len = 3;
    p.shifted = true;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK(ct_stream_length(s) == 5);
    CHECK_OK(ct_stream_seek(s, 2, &err), &err);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.t[0].shape[0] == 3 && b.t[1].shape[0] == 3);
    CHECK(ct_i32(&b.t[0])[0] == 'i' && ct_i32(&b.t[0])[2] == '0' && ct_i32(&b.t[1])[0] == 'j' &&
          ct_i32(&b.t[1])[2] == '1');
    ct_stream_free(s);

    // A list of files, in the order given; a binary file named explicitly is kept.
    const char *list[] = {tmp_path("text/sub/b.txt"), tmp_path("text/a.txt")};
    p.paths = list;
    p.n_paths = 2;
    p.seq_len = 10;
    p.shifted = false;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(ct_i32(&b.t[0])[0] == '0' && ct_i32(&b.t[0])[9] == '9');
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(ct_i32(&b.t[0])[0] == 'a');
    ct_stream_free(s);
    const char *with_binary[] = {tmp_path("text/bin.dat"), tmp_path("text/a.txt")};
    p.paths = with_binary;
    p.seq_len = 2;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK(ct_corpus_n_files(s) == 2 && ct_stream_length(s) == 7);  // (4 + 10) / 2
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(ct_i32(&b.t[0])[0] == 0 && ct_i32(&b.t[0])[1] == 0);
    // A position past the end is the end: the cursor says where it stopped.
    CHECK_OK(ct_stream_seek(s, 12, &err), &err);
    CHECK(ct_stream_get_cursor(s).position == 7);
    CHECK_OK(ct_stream_seek(s, 8, &err), &err);  // one past the end, too
    CHECK(ct_stream_get_cursor(s).position == 7);
    CHECK(ct_stream_seek(s, -1, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "corpus stream: cannot seek to position -1"), "%s", err.msg);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 0);
    ct_stream_free(s);
    p.seq_len = 10;

    // Errors: a missing file, a directory with nothing in it, too little text.
    const char *missing[] = {tmp_path("text/nope.txt")};
    p.paths = missing;
    p.n_paths = 1;
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_IO);
    CHECK_MSG(strstr(err.msg, "text/nope.txt: cannot open: No such file or directory") != NULL, "%s", err.msg);
    printf("  missing file: %s\n", err.msg);
    mkdir(tmp_path("text/void"), 0700);
    const char *empty_dir[] = {tmp_path("text/void")};
    p.paths = empty_dir;
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_IO);
    CHECK_MSG(strstr(err.msg, "text/void: no non-empty text files") != NULL, "%s", err.msg);
    // Text ignores vocab_size (its vocabulary is the 256 bytes); an
    // eval_fraction past 1 is refused.
    p.paths = dir;
    p.vocab_size = 10;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 3 && ct_i32(&b.t[0])[0] == 'a');
    ct_stream_free(s);
    p.vocab_size = 0;
    p.eval_fraction = 1.5;
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "text: eval_fraction is 1.5; expected 0..1"), "%s", err.msg);
    p.eval_fraction = 0.05;
    p.seq_len = 100;
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "hold 20 tokens, fewer than one example of 100") != NULL, "%s", err.msg);
}

// Fingerprints mix strings with a terminator: ("ab", "c") and ("a", "bc")
// differ.
static void test_fingerprint_strings(void) {
    static const ct_stream_ops ops = {"test", NULL, NULL, NULL, NULL};
    ct_stream *x = ct_stream_alloc(&ops, NULL, NULL), *y = ct_stream_alloc(&ops, NULL, NULL);
    ct_stream_mix_str(x, "ab");
    ct_stream_mix_str(x, "c");
    ct_stream_mix_str(y, "a");
    ct_stream_mix_str(y, "bc");
    CHECK(ct_stream_get_cursor(x).fingerprint != ct_stream_get_cursor(y).fingerprint);
    ct_stream_free(x);
    ct_stream_free(y);
}

// What a directory walk takes: a NUL anywhere in the first 8 KiB makes a
// file binary (skipped), one past it does not; a fifo or socket found in a
// directory is skipped (named on its own it is an error: test_hostile).
static void test_collect(void) {
    ct_error err;
    mkdir(tmp_path("walk"), 0700);
    char *text = malloc(9000);
    memset(text, 'x', 9000);
    text[8191] = 0;
    write_file(tmp_path("walk/a_nul_at_8191"), text, 9000);
    text[8191] = 'x';
    text[8192] = 0;
    write_file(tmp_path("walk/b_nul_at_8192"), text, 9000);
    free(text);
    CHECK(mkfifo(tmp_path("walk/c_fifo"), 0600) == 0);
    const char *dir[] = {tmp_path("walk")};
    char **files = NULL;
    int n = 0;
    CHECK_OK(ct_data_collect_files(dir, 1, true, &files, &n, &err), &err);
    CHECK_MSG(n == 1 && strstr(files[0], "walk/b_nul_at_8192"), "%d files, the first %s", n, n ? files[0] : "-");
    ct_data_free_files(files, n);
    // Without skip_binary both files are taken, in name order.
    CHECK_OK(ct_data_collect_files(dir, 1, false, &files, &n, &err), &err);
    CHECK(n == 2 && strstr(files[0], "a_nul_at_8191") && strstr(files[1], "b_nul_at_8192"));
    ct_data_free_files(files, n);
    // An empty path (a config's "") is named as such, not looked up.
    const char *with_empty[] = {tmp_path("walk"), ""};
    CHECK(ct_data_collect_files(with_empty, 2, true, &files, &n, &err) == CT_ERR_ARG && files == NULL && n == 0);
    CHECK_MSG(strstr(err.msg, "data path 1 is empty"), "%s", err.msg);
}

// A corpus whose chunk k (8 bytes) reads "%7d\n" % k, so an example names its chunk.
static const char *numbered_corpus(int n_chunks) {
    const char *path = tmp_path("numbered.txt");
    char *text = malloc((size_t)n_chunks * 8 + 1);
    for (int k = 0; k < n_chunks; k++) snprintf(text + 8 * k, 9, "%7d\n", k % 10000000);
    write_file(path, text, (size_t)n_chunks * 8);
    free(text);
    return path;
}

static int chunk_of(const ct_batch *b, int row) {
    char s[9];
    const int32_t *x = ct_i32(&b->t[0]) + (int64_t)row * 8;
    for (int i = 0; i < 8; i++) s[i] = (char)x[i];
    s[8] = 0;
    return atoi(s);
}

// Every setting that decides a corpus's items is in its fingerprint: a
// cursor saved with p is refused by a stream that differs in any one of them
// and taken by one built with p again.
static void check_corpus_settings(const ct_corpus_params *p) {
    ct_error err;
    ct_stream *s;
    CHECK_OK(ct_text_stream_new(&s, p, &err), &err);
    ct_stream_cursor c = ct_stream_get_cursor(s);
    ct_stream_free(s);
    ct_corpus_params q[5];
    const char *what[5] = {"seq_len", "shifted", "split", "eval_fraction", "split_seed"};
    for (int i = 0; i < 5; i++) q[i] = *p;
    q[0].seq_len = 2 * p->seq_len;
    q[1].shifted = !p->shifted;
    q[2].split = p->split == CT_DATA_SPLIT_TRAIN ? CT_DATA_SPLIT_EVAL : CT_DATA_SPLIT_TRAIN;
    q[3].eval_fraction = p->eval_fraction / 2;
    q[4].split_seed = p->split_seed + 1;
    for (int i = 0; i < 5; i++) {
        CHECK_OK(ct_text_stream_new(&s, &q[i], &err), &err);
        CHECK_MSG(ct_stream_set_cursor(s, c, &err) == CT_ERR_STATE, "a cursor crossed a change of %s", what[i]);
        ct_stream_free(s);
    }
    CHECK_OK(ct_text_stream_new(&s, p, &err), &err);
    CHECK_OK(ct_stream_set_cursor(s, c, &err), &err);
    ct_stream_free(s);
}

static void test_split(void) {
    ct_error err;
    enum { N = 1000 };
    const char *path[] = {numbered_corpus(N)};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = path;
    p.n_paths = 1;
    p.seq_len = 8;
    p.eval_fraction = 0.2;
    p.split_seed = 11;
    int owner[N];
    memset(owner, 0, sizeof owner);
    int64_t counts[3] = {0};
    for (int split = 1; split <= 2; split++) {
        p.split = (ct_data_split)split;
        ct_stream *s;
        CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
        counts[split] = ct_stream_length(s);
        ct_batch b;
        int prev = -1, sorted = 1;
        for (;;) {
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            if (b.n == 0) break;
            int k = chunk_of(&b, 0);
            sorted &= k > prev;
            prev = k;
            if (k >= 0 && k < N) owner[k] |= split;
        }
        CHECK(sorted);
        ct_stream_free(s);
    }
    int both = 0, none = 0;
    for (int k = 0; k < N; k++) {
        both += owner[k] == 3;
        none += owner[k] == 0;
    }
    CHECK_MSG(both == 0, "%d chunks in both train and eval", both);
    CHECK_MSG(none == 0, "%d chunks in neither", none);
    CHECK(counts[1] + counts[2] == N);
    // Chunk k is eval when word 0 of threefry-2x32 under key(split_seed) at
    // counter (k, 0) is below floor(0.2 * 2^32) (the documented rule).
    int misplaced = 0;
    for (int k = 0; k < N; k++) {
        uint32_t h[2];
        ct_threefry2x32(ct_key_from_seed(11), (uint32_t)k, 0, h);
        misplaced += owner[k] != (h[0] < 858993459u ? 2 : 1);  // floor(0.2 * 2^32)
    }
    CHECK_MSG(misplaced == 0, "%d of %d chunks in the wrong split", misplaced, N);
    CHECK_MSG(counts[2] > 150 && counts[2] < 250, "eval holds %lld of %d chunks at fraction 0.2", (long long)counts[2],
              N);
    printf("  split of %d chunks at eval_fraction 0.2: train %lld, eval %lld, overlap %d\n", N, (long long)counts[1],
           (long long)counts[2], both);
    // eval_fraction 0 leaves the eval split empty: an error that says so.
    p.split = CT_DATA_SPLIT_EVAL;
    p.eval_fraction = 0;
    ct_stream *s;
    bool empty = false;
    p.empty_split = &empty;
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "the eval split of") && strstr(err.msg, "is empty"), "%s", err.msg);
    // empty_split tells that failure from the others (the config layer names
    // eval_fraction for it, seq_len for a corpus too short), not the words.
    CHECK(empty);
    p.seq_len = 100000;
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "fewer than one example") && !empty, "%s", err.msg);
    p.seq_len = 8;
    p.eval_fraction = 0.2;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK(!empty);
    // The split seed decides which chunks a stream holds: a cursor saved with
    // another is refused (at the same position, of the same length).
    ct_stream_cursor c = ct_stream_get_cursor(s);
    ct_stream_free(s);
    p.split_seed = 12;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK(ct_stream_set_cursor(s, c, &err) == CT_ERR_STATE);
    CHECK_MSG(strstr(err.msg, "was saved by a different stream"), "%s", err.msg);
    ct_stream_free(s);
    p.split_seed = 11;
    check_corpus_settings(&p);
}

static void put16(uint8_t *p, uint16_t v) {
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static void test_tokens(void) {
    ct_error err;
    uint8_t buf[4 * 40];
    for (int i = 0; i < 40; i++) put16(buf + 2 * i, (uint16_t)(1000 + 7 * i));
    write_file(tmp_path("tok16.bin"), buf, 80);
    for (int i = 0; i < 40; i++) {
        uint32_t v = 70000u + (uint32_t)i;
        for (int k = 0; k < 4; k++) buf[4 * i + k] = (uint8_t)(v >> (8 * k));
    }
    write_file(tmp_path("tok32.bin"), buf, 160);

    const char *p16[] = {tmp_path("tok16.bin")}, *p32[] = {tmp_path("tok32.bin")};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = p16;
    p.n_paths = 1;
    p.seq_len = 5;
    p.token_bytes = 2;
    ct_stream *s;
    CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
    CHECK(ct_stream_length(s) == 8);
    CHECK_OK(ct_stream_seek(s, 3, &err), &err);
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    int ok = 1;
    for (int k = 0; k < 5; k++) ok &= ct_i32(&b.t[0])[k] == 1000 + 7 * (15 + k);
    CHECK(ok);
    ct_stream_free(s);

    p.paths = p32;
    p.token_bytes = 4;
    p.shifted = true;
    CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
    CHECK(ct_stream_length(s) == 6);  // 40 tokens / 6
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(ct_i32(&b.t[0])[0] == 70000 && ct_i32(&b.t[1])[0] == 70001 && ct_i32(&b.t[1])[4] == 70005);
    ct_stream_free(s);

    // The same 160 bytes as uint16 tokens, or with a vocab_size: other
    // streams, whose cursors do not cross.
    {
        CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
        ct_stream_cursor c32 = ct_stream_get_cursor(s);
        ct_stream_free(s);
        ct_corpus_params q = p;
        q.token_bytes = 2;
        CHECK_OK(ct_token_stream_new(&s, &q, &err), &err);
        CHECK(ct_stream_set_cursor(s, c32, &err) == CT_ERR_STATE);
        ct_stream_free(s);
        q = p;
        q.vocab_size = 80000;
        CHECK_OK(ct_token_stream_new(&s, &q, &err), &err);
        CHECK(ct_stream_set_cursor(s, c32, &err) == CT_ERR_STATE);
        ct_stream_free(s);
    }

    // A vocabulary that the file breaks: token 70012 is chunk 2's first input.
    p.vocab_size = 70012;
    CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
    CHECK(take(s, 2, NULL) == 2);
    ct_status st = ct_stream_next(s, &b, &err);
    CHECK(st == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "tok32.bin: token 70012 at byte 48 is not below vocab_size 70012") != NULL, "%s",
              err.msg);
    printf("  bad token: %s\n", err.msg);
    ct_stream_free(s);
    // A caller that knows where vocab_size was set has the error name it.
    p.vocab_size = 1000;  // token 0 is 70000
    p.vocab_size_source = "v.gin:7:1: TokenInputs.vocab_size = 1000";
    CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
    CHECK(s && ct_stream_next(s, &b, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "is not below vocab_size 1000 (uint32 tokens; vocab_size from v.gin:7:1: "
                              "TokenInputs.vocab_size = 1000)"),
              "%s", err.msg);
    ct_stream_free(s);
    p.vocab_size_source = NULL;
    // Without a vocab_size a uint32 token must still fit an int32 id; the
    // error does not speak of a vocab_size no one set.
    buf[8] = 0xff, buf[9] = 0xff, buf[10] = 0xff, buf[11] = 0x7f;  // token 2 is 2^31 - 1: an id
    write_file(tmp_path("tok32max.bin"), buf, 160);
    const char *max_id[] = {tmp_path("tok32max.bin")};
    p.paths = max_id;
    p.vocab_size = 0;
    CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 3 && ct_i32(&b.t[0])[2] == INT32_MAX);
    ct_stream_free(s);
    buf[8] = 0, buf[9] = 0, buf[10] = 0, buf[11] = 0x80;  // token 2 is 2^31
    write_file(tmp_path("tok32big.bin"), buf, 160);
    const char *big[] = {tmp_path("tok32big.bin")};
    p.paths = big;
    p.vocab_size = 0;
    CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
    CHECK(ct_stream_next(s, &b, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "tok32big.bin: token 2147483648 at byte 8 is above 2147483647, the largest id an int32 "
                              "holds (uint32 tokens)"),
              "%s", err.msg);
    ct_stream_free(s);
    p.paths = p32;

    // An odd size: 81 bytes of uint16 tokens.
    buf[0] = 1;
    write_file(tmp_path("odd.bin"), buf, 81);
    const char *odd[] = {tmp_path("odd.bin")};
    p.paths = odd;
    p.token_bytes = 2;
    p.vocab_size = 0;
    CHECK(ct_token_stream_new(&s, &p, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "odd.bin: size 81 bytes is not a multiple of 2 (uint16 tokens)") != NULL, "%s", err.msg);
    printf("  odd token file: %s\n", err.msg);
    p.token_bytes = 3;
    CHECK(ct_token_stream_new(&s, &p, &err) == CT_ERR_ARG);
    p.token_bytes = 1;  // bytes are text's, not a token width
    CHECK(ct_token_stream_new(&s, &p, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "token_bytes is 1; expected 2 (uint16) or 4 (uint32)"), "%s", err.msg);
    // A negative vocab_size is refused, not taken as 0 (unchecked).
    p.token_bytes = 2;
    p.vocab_size = -5;
    CHECK(ct_token_stream_new(&s, &p, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "uint16 tokens: vocab_size is -5; expected > 0, or 0 (unchecked)"), "%s", err.msg);
}

// ---- IDX ------------------------------------------------------------------------------------------

static void be32(uint8_t *p, uint32_t v) {
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

// n images of 2x3 (pixel (i, r, c) = 10 i + 3 r + c) and labels i % 4.
static size_t idx_images(uint8_t *buf, int n) {
    be32(buf, 0x803);
    be32(buf + 4, (uint32_t)n);
    be32(buf + 8, 2);
    be32(buf + 12, 3);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 6; k++) buf[16 + 6 * i + k] = (uint8_t)(10 * i + k);
    return 16 + 6 * (size_t)n;
}

static size_t idx_labels(uint8_t *buf, int n) {
    be32(buf, 0x801);
    be32(buf + 4, (uint32_t)n);
    for (int i = 0; i < n; i++) buf[8 + i] = (uint8_t)(i % 4);
    return 8 + (size_t)n;
}

static ct_status open_idx(const char *images, const char *labels, ct_stream **s, ct_error *err) {
    ct_idx_params p = ct_idx_default_params();
    p.images_path = images;
    p.labels_path = labels;
    return ct_idx_stream_new(s, &p, err);
}

static void test_idx(void) {
    ct_error err;
    uint8_t im[16 + 6 * 5], lb[8 + 5];
    size_t nim = idx_images(im, 5), nlb = idx_labels(lb, 5);
    write_file(tmp_path("im"), im, nim);
    write_file(tmp_path("lb"), lb, nlb);
    write_gz(tmp_path("im.gz"), im, nim);
    write_gz(tmp_path("lb.gz"), lb, nlb);
    for (int gz = 0; gz < 2; gz++) {
        ct_stream *s;
        CHECK_OK(open_idx(tmp_path(gz ? "im.gz" : "im"), tmp_path(gz ? "lb.gz" : "lb"), &s, &err), &err);
        if (!s) continue;
        CHECK(ct_stream_length(s) == 5);
        ct_tensor sigs[CT_BATCH_MAX_TENSORS];
        CHECK(ct_stream_signature(s, sigs) == 3 && sigs[0].ndim == 2 && sigs[0].shape[1] == 3 && sigs[1].ndim == 0);
        int ok = 0;
        for (int i = 0; i < 5; i++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            int good = b.n == 3 && *ct_i32(&b.t[1]) == i % 4 && *ct_f32(&b.t[2]) == 1.0f;
            for (int k = 0; k < 6; k++) good &= ct_f32(&b.t[0])[k] == (float)(10 * i + k) / 255.0f;
            ok += good;
        }
        CHECK(ok == 5);
        ct_stream_free(s);
    }

    ct_stream *s = NULL;
    // Missing file.
    CHECK(open_idx(tmp_path("nothere-idx3-ubyte.gz"), tmp_path("lb"), &s, &err) == CT_ERR_IO);
    CHECK_MSG(strstr(err.msg, "nothere-idx3-ubyte.gz: cannot open: No such file or directory (IDX images)"), "%s",
              err.msg);
    // Labels where images belong: bad magic.
    CHECK(open_idx(tmp_path("lb.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "lb.gz: bad magic 0x00000801 at byte 0, expected 0x00000803 (IDX images"), "%s", err.msg);
    printf("  bad magic: %s\n", err.msg);
    // Truncated: the last image is 4 bytes short, plain and gzip.
    write_file(tmp_path("short"), im, nim - 4);
    CHECK(open_idx(tmp_path("short"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "short: truncated at byte 42: 4 more bytes expected for 5 images of 2x3 (IDX images)"),
              "%s", err.msg);
    printf("  truncated: %s\n", err.msg);
    write_gz(tmp_path("short.gz"), im, nim - 4);
    CHECK(open_idx(tmp_path("short.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "short.gz: truncated at byte 42 (uncompressed)"), "%s", err.msg);
    // A gzip file cut in the middle of its compressed data.
    {
        FILE *f = fopen(tmp_path("im.gz"), "rb");
        uint8_t gz[512];
        size_t n = f ? fread(gz, 1, sizeof gz, f) : 0;
        if (f) fclose(f);
        write_file(tmp_path("cut.gz"), gz, n - 12);
        CHECK(open_idx(tmp_path("cut.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        CHECK_MSG(strstr(err.msg, "cut.gz:") && (strstr(err.msg, "truncated") || strstr(err.msg, "corrupt")), "%s",
                  err.msg);
        printf("  cut gzip: %s\n", err.msg);
    }
    // A header declaring an empty dim; a file that starts as gzip's magic
    // does but is not gzip (read as plain: a bad magic, not corrupt gzip
    // data); a directory.
    uint8_t flat[16];
    memcpy(flat, im, 16);
    be32(flat + 8, 0);
    write_file(tmp_path("flat"), flat, 16);
    CHECK(open_idx(tmp_path("flat"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT && s == NULL);
    CHECK_MSG(strstr(err.msg, "flat: dim 1 is 0 at byte 8 (IDX images)"), "%s", err.msg);
    flat[0] = 0x1f;
    write_file(tmp_path("flat"), flat, 16);
    CHECK(open_idx(tmp_path("flat"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT && s == NULL);
    CHECK_MSG(strstr(err.msg, "flat: bad magic 0x1f000803 at byte 0"), "%s", err.msg);
    CHECK(open_idx(tmpdir, tmp_path("lb"), &s, &err) == CT_ERR_IO && s == NULL);
    CHECK_MSG(strstr(err.msg, ": not a regular file (a directory, device or fifo): refusing it (IDX images)"), "%s",
              err.msg);
    // A header cut short.
    write_file(tmp_path("hdr"), im, 10);
    CHECK(open_idx(tmp_path("hdr"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "hdr: truncated at byte 10: 2 more bytes expected for the header's dims"), "%s", err.msg);
    // Bytes after the data.
    uint8_t longer[sizeof im + 3];
    memcpy(longer, im, nim);
    write_file(tmp_path("long"), longer, nim + 3);
    CHECK(open_idx(tmp_path("long"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "long: unexpected data at byte 46"), "%s", err.msg);
    // The same in a gzip file: past the data inside the uncompressed stream,
    // and as junk after the gzip member (zlib's gzread skips that silently).
    write_gz(tmp_path("long.gz"), longer, nim + 3);
    CHECK(open_idx(tmp_path("long.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "long.gz: unexpected data at byte 46 (uncompressed), after the 5 images of 2x3"), "%s",
              err.msg);
    {
        FILE *f = fopen(tmp_path("im.gz"), "rb");
        uint8_t gz[512 + 5];
        size_t n = f ? fread(gz, 1, 512, f) : 0;
        if (f) fclose(f);
        memcpy(gz + n, "junk\n", 5);
        write_file(tmp_path("junk.gz"), gz, n + 5);
        CHECK(open_idx(tmp_path("junk.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        char want[128];
        snprintf(want, sizeof want, "junk.gz: 5 bytes after the gzip data ends at byte %zu", n);
        CHECK_MSG(strstr(err.msg, want) && strstr(err.msg, "(IDX images)"), "%s", err.msg);
        printf("  junk after gzip: %s\n", err.msg);
        // Only the trailer (CRC-32, length) cut off, or its CRC wrong: the
        // data is all there but the member is not whole.
        write_file(tmp_path("junk.gz"), gz, n - 8);
        CHECK(open_idx(tmp_path("junk.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        CHECK_MSG(strstr(err.msg, "junk.gz: gzip stream truncated after byte 46 (uncompressed)"), "%s", err.msg);
        gz[n - 8] ^= 1;
        write_file(tmp_path("junk.gz"), gz, n);
        CHECK(open_idx(tmp_path("junk.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        CHECK_MSG(strstr(err.msg, "junk.gz: corrupt gzip data after byte 46 (uncompressed): incorrect data check"), "%s",
                  err.msg);
        gz[n - 8] ^= 1;
        // Zero padding (a tape block's) is skipped, as gzip(1) and Python's
        // gzip module skip it, before the file's end or another member; junk
        // after it is not, nor is a lone 0x1f.
        memset(gz + n, 0, 5);
        write_file(tmp_path("junk.gz"), gz, n + 5);
        CHECK_OK(open_idx(tmp_path("junk.gz"), tmp_path("lb"), &s, &err), &err);
        ct_stream_free(s);
        s = NULL;
        gz[n + 4] = 'j';
        write_file(tmp_path("junk.gz"), gz, n + 5);
        CHECK(open_idx(tmp_path("junk.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        snprintf(want, sizeof want, "junk.gz: 1 byte after the gzip data ends at byte %zu", n + 4);
        CHECK_MSG(strstr(err.msg, want), "%s", err.msg);
        gz[n] = 0x1f;
        write_file(tmp_path("junk.gz"), gz, n + 1);
        CHECK(open_idx(tmp_path("junk.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        snprintf(want, sizeof want, "junk.gz: 1 byte after the gzip data ends at byte %zu", n);
        CHECK_MSG(strstr(err.msg, want), "%s", err.msg);
        // A member starts with both bytes of the magic, 0x1f 0x8b: 0x1f and
        // another byte are junk.
        gz[n + 1] = 'j';
        write_file(tmp_path("junk.gz"), gz, n + 2);
        CHECK(open_idx(tmp_path("junk.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        snprintf(want, sizeof want, "junk.gz: 2 bytes after the gzip data ends at byte %zu", n);
        CHECK_MSG(strstr(err.msg, want), "%s", err.msg);
        // Two gzip members back to back are one stream (gzip -c a b > ab):
        // read as one, refused only when together they hold too much.
        uint8_t two[2 * 512];
        write_gz(tmp_path("head.gz"), im, 20);
        write_gz(tmp_path("tail.gz"), im + 20, nim - 20);
        size_t n1 = 0, n2 = 0;
        if ((f = fopen(tmp_path("head.gz"), "rb"))) n1 = fread(two, 1, 512, f), fclose(f);
        if ((f = fopen(tmp_path("tail.gz"), "rb"))) n2 = fread(two + n1, 1, 512, f), fclose(f);
        write_file(tmp_path("two.gz"), two, n1 + n2);
        CHECK_OK(open_idx(tmp_path("two.gz"), tmp_path("lb"), &s, &err), &err);
        ct_stream_free(s);
        s = NULL;
        // Zero padding between the members is skipped too.
        uint8_t padded[2 * 512 + 7];
        memcpy(padded, two, n1);
        memset(padded + n1, 0, 7);
        memcpy(padded + n1 + 7, two + n1, n2);
        write_file(tmp_path("two.gz"), padded, n1 + 7 + n2);
        CHECK_OK(open_idx(tmp_path("two.gz"), tmp_path("lb"), &s, &err), &err);
        ct_stream_free(s);
        s = NULL;
        write_gz(tmp_path("tail.gz"), longer + 20, nim + 3 - 20);
        if ((f = fopen(tmp_path("tail.gz"), "rb"))) n2 = fread(two + n1, 1, 512, f), fclose(f);
        write_file(tmp_path("two.gz"), two, n1 + n2);
        CHECK(open_idx(tmp_path("two.gz"), tmp_path("lb"), &s, &err) == CT_ERR_FORMAT);
        CHECK_MSG(strstr(err.msg, "two.gz: unexpected data at byte 46 (uncompressed)"), "%s", err.msg);
    }
    // Counts that disagree.
    uint8_t lb4[8 + 4];
    write_file(tmp_path("lb4"), lb4, idx_labels(lb4, 4));
    CHECK(open_idx(tmp_path("im"), tmp_path("lb4"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "lb4 holds 4 labels but") && strstr(err.msg, "holds 5 images"), "%s", err.msg);
    // More labels than images: the counts are named, not the sixth label
    // called data after what its header declares (its header says 6).
    uint8_t lb6[8 + 6];
    write_file(tmp_path("lb6"), lb6, idx_labels(lb6, 6));
    CHECK(open_idx(tmp_path("im"), tmp_path("lb6"), &s, &err) == CT_ERR_FORMAT && s == NULL);
    CHECK_MSG(strstr(err.msg, "lb6 holds 6 labels but") && strstr(err.msg, "holds 5 images"), "%s", err.msg);
    // A label out of range.
    lb[8 + 3] = 10;
    write_file(tmp_path("lb10"), lb, nlb);
    CHECK(open_idx(tmp_path("im"), tmp_path("lb10"), &s, &err) == CT_ERR_FORMAT);
    CHECK_MSG(strstr(err.msg, "lb10: label 10 at byte 11 is not below n_classes 10"), "%s", err.msg);
    CHECK(s == NULL);
    // Labels are bytes: n_classes 256 takes any of them, 257 is refused.
    // And both paths must be given.
    ct_idx_params p = ct_idx_default_params();
    p.images_path = tmp_path("im");
    CHECK(ct_idx_stream_new(&s, &p, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "idx: no labels_path given"), "%s", err.msg);
    p.images_path = "";
    p.labels_path = tmp_path("lb10");
    CHECK(ct_idx_stream_new(&s, &p, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "idx: no images_path given"), "%s", err.msg);
    p.images_path = tmp_path("im");
    p.labels_path = tmp_path("lb10");
    p.n_classes = 256;
    CHECK_OK(ct_idx_stream_new(&s, &p, &err), &err);
    ct_stream_free(s);
    p.n_classes = 257;
    CHECK(ct_idx_stream_new(&s, &p, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "idx: n_classes is 257; expected 0..256"), "%s", err.msg);
}

// A gzip file larger than the compressed input ctrax reads at a time (128
// KiB, idx.c): the member is inflated across several reads, and the offsets
// that a junk message names, and zero padding, go on across them too (the
// files of test_idx fit in one read). Fashion-MNIST in test_real_files is
// one such file, but it is not installed everywhere.
static void test_idx_large(void) {
    enum { N = 400, PX = 28 * 28, IN = 128 << 10 };  // about 310 KiB of noise: as much compressed
    ct_error err;
    uint8_t *im = malloc(16 + (size_t)N * PX), lb[8 + N];
    CHECK(im != NULL);
    if (!im) return;
    be32(im, 0x803);
    be32(im + 4, N);
    be32(im + 8, 28);
    be32(im + 12, 28);
    uint64_t r = 12345;
    for (size_t i = 0; i < (size_t)N * PX; i++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        im[16 + i] = (uint8_t)(r >> 56);
    }
    be32(lb, 0x801);
    be32(lb + 4, N);
    for (int i = 0; i < N; i++) lb[8 + i] = (uint8_t)(i % 10);
    write_file(tmp_path("lb_large"), lb, sizeof lb);
    write_gz(tmp_path("im_large.gz"), im, 16 + (size_t)N * PX);
    // The compressed file, with room for padding past the third read.
    size_t cap = 3 * (size_t)IN + 64, n = 0;
    uint8_t *gz = calloc(1, cap);
    FILE *f = fopen(tmp_path("im_large.gz"), "rb");
    if (f && gz) n = fread(gz, 1, cap, f), fclose(f);
    CHECK_MSG(n > 2 * (size_t)IN && n < 3 * (size_t)IN, "%zu compressed bytes: not in a third read", n);
    if (!gz || n <= 2 * (size_t)IN || n >= 3 * (size_t)IN) {
        free(im), free(gz);
        return;
    }
    ct_stream *s = NULL;
    CHECK_OK(open_idx(tmp_path("im_large.gz"), tmp_path("lb_large"), &s, &err), &err);
    if (s) {
        int ok = 0;
        for (int i = 0; i < N; i++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            int good = b.n == 3 && *ct_i32(&b.t[1]) == i % 10;
            for (int k = 0; k < PX; k += 97) good &= ct_f32(&b.t[0])[k] == (float)im[16 + (size_t)i * PX + k] / 255.0f;
            ok += good;
        }
        CHECK_MSG(ok == N, "%d of %d images read back", ok, N);
        ct_stream_free(s);
        s = NULL;
    }
    // Junk after it names the byte where the member ended, which is in the
    // last read.
    memcpy(gz + n, "junk", 4);
    write_file(tmp_path("im_large.gz"), gz, n + 4);
    CHECK(open_idx(tmp_path("im_large.gz"), tmp_path("lb_large"), &s, &err) == CT_ERR_FORMAT);
    char want[160];
    snprintf(want, sizeof want, "im_large.gz: 4 bytes after the gzip data ends at byte %zu", n);
    CHECK_MSG(strstr(err.msg, want), "%s", err.msg);
    // Zero padding that runs on past the end of a read (3 * 128 KiB) is
    // skipped to the file's end; junk after it is named at its own byte.
    memset(gz + n, 0, cap - n);
    write_file(tmp_path("im_large.gz"), gz, cap);
    CHECK_OK(open_idx(tmp_path("im_large.gz"), tmp_path("lb_large"), &s, &err), &err);
    ct_stream_free(s);
    s = NULL;
    gz[cap - 1] = 'j';
    write_file(tmp_path("im_large.gz"), gz, cap);
    CHECK(open_idx(tmp_path("im_large.gz"), tmp_path("lb_large"), &s, &err) == CT_ERR_FORMAT);
    snprintf(want, sizeof want, "im_large.gz: 1 byte after the gzip data ends at byte %zu", cap - 1);
    CHECK_MSG(strstr(err.msg, want), "%s", err.msg);
    CHECK(s == NULL);

    // The fingerprint tells two image files with the same labels apart by
    // their first image: a cursor from one is refused by the other.
    ct_stream *a = NULL, *other = NULL;
    write_file(tmp_path("im_plain"), im, 16 + (size_t)N * PX);
    im[16] ^= 1;
    write_file(tmp_path("im_other"), im, 16 + (size_t)N * PX);
    CHECK_OK(open_idx(tmp_path("im_plain"), tmp_path("lb_large"), &a, &err), &err);
    CHECK_OK(open_idx(tmp_path("im_other"), tmp_path("lb_large"), &other, &err), &err);
    if (a && other) {
        CHECK(ct_stream_set_cursor(other, ct_stream_get_cursor(a), &err) == CT_ERR_STATE);
        CHECK_MSG(strstr(err.msg, "was saved by a different stream"), "%s", err.msg);
    }
    ct_stream_free(a);
    ct_stream_free(other);
    // Headers that declare more than any file holds are refused before
    // anything is allocated: 2^22 images of 2^21 x 2^21 (2^64 bytes, 0 in
    // 64 bits), and 60000 images of 28 x 28 in a gzip file of a few bytes.
    be32(im + 4, 1u << 22);
    be32(im + 8, 1u << 21);
    be32(im + 12, 1u << 21);
    write_file(tmp_path("im_huge"), im, 16);
    CHECK(open_idx(tmp_path("im_huge"), tmp_path("lb_large"), &s, &err) == CT_ERR_FORMAT && s == NULL);
    CHECK_MSG(strstr(err.msg, "im_huge: the header declares 4194304 images of 2097152x2097152, more than 10^12 bytes"),
              "%s", err.msg);
    be32(im + 4, 60000);
    be32(im + 8, 28);
    be32(im + 12, 28);
    write_gz(tmp_path("im_huge.gz"), im, 16);
    CHECK(open_idx(tmp_path("im_huge.gz"), tmp_path("lb_large"), &s, &err) == CT_ERR_FORMAT && s == NULL);
    CHECK_MSG(strstr(err.msg, "im_huge.gz: the header declares 60000 images of 28x28 (47040000 bytes), more than a") &&
                  strstr(err.msg, "-byte gzip file can hold (deflate gives at most 1032x)"),
              "%s", err.msg);
    free(im);
    free(gz);

    // More images than one piece of the read (64 MiB, idx.c): the buffer
    // grows to exactly what the header declares, and the last image is the
    // file's last bytes. 90000 images of 28x28 (70.56 MB) whose pixel k of
    // the whole file is k mod 251 (a period deflate shrinks about 100x).
    enum { BIG = 90000 };
    size_t big = 16 + (size_t)BIG * PX;
    uint8_t *ramp = malloc(big), *lbig = malloc(8 + (size_t)BIG);
    CHECK(ramp && lbig);
    if (ramp && lbig) {
        for (size_t k = 0; k < (size_t)BIG * PX; k++) ramp[16 + k] = (uint8_t)(k % 251);
        be32(ramp, 0x803);
        be32(ramp + 4, BIG);
        be32(ramp + 8, 28);
        be32(ramp + 12, 28);
        be32(lbig, 0x801);
        be32(lbig + 4, BIG);
        for (int i = 0; i < BIG; i++) lbig[8 + i] = (uint8_t)(i % 10);
        write_gz(tmp_path("im_big.gz"), ramp, big);
        write_file(tmp_path("lb_big"), lbig, 8 + (size_t)BIG);
        CHECK_OK(open_idx(tmp_path("im_big.gz"), tmp_path("lb_big"), &s, &err), &err);
        if (s) {
            ct_batch b;
            CHECK_OK(ct_stream_seek(s, BIG - 1, &err), &err);
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            size_t last = (size_t)(BIG - 1) * PX;  // the last image's first pixel, in the data
            int good = b.n == 3 && *ct_i32(&b.t[1]) == (BIG - 1) % 10;
            for (int k = 0; k < PX; k++) good &= ct_f32(&b.t[0])[k] == (float)((last + (size_t)k) % 251) / 255.0f;
            CHECK_MSG(good, "the last of %d images (past the first 64 MiB) read back wrong", BIG);
        }
        ct_stream_free(s);
    }
    free(ramp);
    free(lbig);
}

// ---- transforms -----------------------------------------------------------------------------------

static ct_stream *numbered_stream(int n_chunks) {
    ct_error err;
    static const char *path[1];
    path[0] = numbered_corpus(n_chunks);
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = path;
    p.n_paths = 1;
    p.seq_len = 8;
    ct_stream *s;
    return must(ct_text_stream_new(&s, &p, &err), &s, &err);
}

// The settings of each transform over a numbered corpus of 40 chunks.
typedef struct stage_settings {
    bool shuffle;
    uint64_t epoch_seed, shuffle_seed;
    int64_t n_epochs, max_len;
    int buffer, mask_id;
    ct_batch_params bp;
} stage_settings;

// epochs -> shuffle -> truncate -> batch -> loss_weights, with g's settings.
static ct_stream *stage_pipeline(const stage_settings *g) {
    ct_error err;
    ct_stream *s = numbered_stream(40);
    if (s) s = must(ct_epochs_stream_new(&s, s, g->shuffle, g->epoch_seed, g->n_epochs, &err), &s, &err);
    if (s) s = must(ct_shuffle_stream_new(&s, s, g->buffer, g->shuffle_seed, &err), &s, &err);
    if (s) s = must(ct_truncate_stream_new(&s, s, g->max_len, &err), &s, &err);
    if (s) s = must(ct_batch_stream_new(&s, s, &g->bp, &err), &s, &err);
    if (s) s = must(ct_weights_stream_new(&s, s, g->mask_id, &err), &s, &err);
    return s;
}

// Every setting of a transform that decides its items is in its
// fingerprint: a cursor saved by the pipeline is refused when any one
// setting changed (a run resumed with another shuffle seed or buffer would
// go on in another data order, unreported) and taken by the same pipeline.
static void test_stage_settings(void) {
    ct_error err;
    ct_batch b;
    static const int64_t boundary[] = {8};
    stage_settings g = {.shuffle = true, .epoch_seed = 3, .shuffle_seed = 5, .n_epochs = 2, .max_len = 6,
                        .buffer = 8, .mask_id = -1, .bp = ct_batch_default_params()};
    g.bp.batch_size = 4;
    ct_stream *s = stage_pipeline(&g);
    if (!s) return;
    for (int i = 0; i < 3; i++) CHECK_OK(ct_stream_next(s, &b, &err), &err);
    ct_stream_cursor c = ct_stream_get_cursor(s);
    ct_stream_free(s);
    enum { N_SETTINGS = 14 };
    static const char *const what[N_SETTINGS] = {
        "epochs' shuffle", "epochs' seed",      "n_epochs",      "shuffle's buffer_size",
        "shuffle's seed",  "truncate's max_len", "batch_size",   "batch length",
        "pad_to_multiple", "bucket_window",     "bucketing seed", "pad_remainder",
        "boundaries",      "mask_id"};
    for (int i = 0; i < N_SETTINGS; i++) {
        stage_settings q = g;
        switch (i) {
            case 0: q.shuffle = false; break;
            case 1: q.epoch_seed++; break;
            case 2: q.n_epochs++; break;
            case 3: q.buffer++; break;
            case 4: q.shuffle_seed++; break;
            case 5: q.max_len--; break;
            case 6: q.bp.batch_size = 2; break;
            case 7: q.bp.length = 8; break;
            case 8: q.bp.pad_to_multiple = 4; break;
            case 9: q.bp.bucket_window = 2; break;
            case 10: q.bp.seed++; break;
            case 11: q.bp.pad_remainder = true; break;
            case 12: q.bp.boundaries = boundary, q.bp.n_boundaries = 1; break;
            default: q.mask_id = 0; break;
        }
        if (!(s = stage_pipeline(&q))) continue;
        CHECK_MSG(ct_stream_set_cursor(s, c, &err) == CT_ERR_STATE, "a cursor crossed a change of %s", what[i]);
        CHECK_MSG(strstr(err.msg, "was saved by a different stream"), "%s: %s", what[i], err.msg);
        ct_stream_free(s);
    }
    if ((s = stage_pipeline(&g))) {
        CHECK_OK(ct_stream_set_cursor(s, c, &err), &err);
        ct_stream_free(s);
    }
}

static void test_epochs_and_shuffle(void) {
    ct_error err;
    enum { N = 50 };
    ct_stream *s = numbered_stream(N);
    CHECK_OK(ct_epochs_stream_new(&s, s, true, 3, 2, &err), &err);
    CHECK(ct_stream_length(s) == 2 * N);
    int order[2][N], count[2][N];
    memset(count, 0, sizeof count);
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < N; i++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            order[e][i] = chunk_of(&b, 0);
            if (order[e][i] >= 0 && order[e][i] < N) count[e][order[e][i]]++;
        }
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 0);
    int perm = 1, moved = 0, differ = 0;
    for (int e = 0; e < 2; e++)
        for (int k = 0; k < N; k++) perm &= count[e][k] == 1;
    for (int i = 0; i < N; i++) {
        moved += order[0][i] != i;
        differ += order[0][i] != order[1][i];
    }
    CHECK_MSG(perm, "an epoch is not a permutation");
    CHECK(moved > N / 2 && differ > N / 2);
    ct_stream_free(s);

    // The shuffle buffer over a finite stream: a permutation, drain included.
    for (int k = 1; k <= 64; k *= 4) {
        s = numbered_stream(N);
        CHECK_OK(ct_shuffle_stream_new(&s, s, k, 9, &err), &err);
        int seen[N], displaced = 0, n = 0;
        memset(seen, 0, sizeof seen);
        for (;;) {
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            if (b.n == 0) break;
            int c = chunk_of(&b, 0);
            if (c >= 0 && c < N) seen[c]++;
            displaced += c != n;
            n++;
        }
        int all = n == N;
        for (int i = 0; i < N; i++) all &= seen[i] == 1;
        CHECK_MSG(all, "shuffle buffer %d: not a permutation of the %d items (%d out)", k, N, n);
        CHECK(k == 1 ? displaced == 0 : displaced > N / 3);
        ct_stream_free(s);
    }

    // Truncate: cut dim 0.
    ct_copy_task t = {10, 8, false, 1, 0};
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK_OK(ct_truncate_stream_new(&s, s, 5, &err), &err);
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    ct_stream_signature(s, sigs);
    CHECK(sigs[0].shape[0] == 5);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.t[0].shape[0] == 5 && b.t[2].shape[0] == 5 && ct_i32(&b.t[0])[0] == 0);
    ct_stream_free(s);

    // Transforms that cannot be built free what they were given (ASan checks).
    s = numbered_stream(N);
    CHECK(ct_shuffle_stream_new(&s, s, 0, 1, &err) == CT_ERR_ARG && s == NULL);
    CHECK(ct_copy_stream_new(&s, &t, &err) == CT_OK);
    CHECK(ct_epochs_stream_new(&s, s, true, 1, 0, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "epochs: the copy stream is endless"), "%s", err.msg);
    // So many epochs that the stream's length would overflow: refused (it
    // read as a negative length and yielded nothing).
    s = numbered_stream(N);
    CHECK(ct_epochs_stream_new(&s, s, false, 1, INT64_MAX / 8, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "epochs: n_epochs is 1152921504606846975; expected 0 (forever) to"), "%s", err.msg);
    s = numbered_stream(N);
    CHECK_OK(ct_epochs_stream_new(&s, s, false, 1, INT64_MAX / N, &err), &err);
    CHECK(ct_stream_length(s) == INT64_MAX / N * N);
    ct_stream_free(s);

    // Each epoch is a Fisher-Yates permutation (j uniform in [0, k]), so an
    // item can stay where it was: a uniform permutation of 50 keeps at least
    // one item in place with probability 1 - 1/e, and in 20 epochs some epoch
    // does. Sattolo's variant (j in [0, k)) draws only single cycles, which
    // never do.
    s = numbered_stream(N);
    CHECK_OK(ct_epochs_stream_new(&s, s, true, 5, 20, &err), &err);
    int fixed_points = 0;
    for (int i = 0; i < 20 * N; i++) {
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        fixed_points += b.n > 0 && chunk_of(&b, 0) == i % N;
    }
    CHECK_MSG(fixed_points > 0, "20 shuffled epochs of %d items left no item in its place: not Fisher-Yates", N);
    ct_stream_free(s);
    // An epoch of more than 2^32 items is refused (the permutation draws
    // 32-bit indices): 2^31 epochs of 4 items are 2^33.
    s = numbered_stream(4);
    CHECK_OK(ct_epochs_stream_new(&s, s, false, 1, INT64_C(1) << 31, &err), &err);
    CHECK(ct_stream_length(s) == INT64_C(1) << 33);
    CHECK(ct_epochs_stream_new(&s, s, false, 1, 0, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "epochs: the epochs stream has 8589934592 items, more than 2^32"), "%s", err.msg);
    // The shuffle buffer holds at most 2^24 items; truncate keeps at least 1.
    s = numbered_stream(4);
    CHECK(ct_shuffle_stream_new(&s, s, (1 << 24) + 1, 1, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "shuffle: buffer_size is 16777217; expected 1..2^24"), "%s", err.msg);
    s = numbered_stream(4);
    CHECK(ct_truncate_stream_new(&s, s, 0, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "truncate: max_len is 0; expected >= 1"), "%s", err.msg);
}

static void test_batch(void) {
    ct_error err;
    // Variable lengths padded to a multiple of 8; padding carries weight 0.
    ct_copy_task t = {10, 6, false, 4, 1};
    ct_stream *ex, *s;
    CHECK_OK(ct_copy_stream_new(&ex, &t, &err), &err);
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 4;
    bp.pad_to_multiple = 8;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    ct_stream_signature(s, sigs);
    CHECK(sigs[0].ndim == 2 && sigs[0].shape[0] == 4 && sigs[0].shape[1] == -1);
    int bad = 0, pads = 0;
    for (int i = 0; i < 5; i++) {
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        int64_t L = b.t[0].shape[1];
        int64_t longest = 0;
        for (int r = 0; r < 4; r++) {
            ct_batch e;
            CHECK_OK(ct_stream_next(ex, &e, &err), &err);
            int64_t len = e.t[0].shape[0];
            if (len > longest) longest = len;
            for (int64_t k = 0; k < L; k++) {
                int32_t tok = ct_i32(&b.t[0])[r * L + k];
                float w = ct_f32(&b.t[2])[r * L + k];
                if (k < len)
                    bad += tok != ct_i32(&e.t[0])[k] || w != ct_f32(&e.t[2])[k];
                else {
                    bad += tok != 0 || w != 0.0f;
                    pads++;
                }
            }
        }
        bad += L % 8 != 0 || L < longest || L >= longest + 8;
    }
    CHECK_MSG(bad == 0, "%d wrong values in padded batches", bad);
    CHECK(pads > 0);
    ct_stream_free(s);
    ct_stream_free(ex);

    // A fixed length; boundaries.
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    bp.length = 20;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    ct_stream_signature(s, sigs);
    CHECK(sigs[0].shape[1] == 20 && sigs[2].shape[1] == 20 && sigs[2].dtype == CT_DTYPE_F32);
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.t[0].shape[1] == 20);
    ct_stream_free(s);
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    bp.length = 8;  // examples reach 14 tokens
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    ct_status st = CT_OK;
    for (int i = 0; i < 10 && st == CT_OK; i++) st = ct_stream_next(s, &b, &err);
    CHECK(st == CT_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "longer than length 8 (truncate first)"), "%s", err.msg);
    ct_stream_free(s);
    // One token too long is too long (w of 1..3: examples of 4, 6 or 8).
    ct_copy_task up_to_8 = {10, 3, false, 4, 1};
    CHECK_OK(ct_copy_stream_new(&s, &up_to_8, &err), &err);
    bp.length = 7;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    st = CT_OK;
    for (int i = 0; i < 20 && st == CT_OK; i++) st = ct_stream_next(s, &b, &err);
    CHECK(st == CT_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "batch: an example of length 8 is longer than length 7 (truncate first)"), "%s",
              err.msg);
    ct_stream_free(s);
    bp.length = 8;
    // Examples of one fixed length (min_length 0) longer than length: refused
    // when the batcher is made (they went through at their own length,
    // against the batch's signature).
    ct_copy_task too_long = {10, 9, false, 4, 0};  // 2 x 9 + 2 = 20 tokens each
    CHECK_OK(ct_copy_stream_new(&s, &too_long, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &bp, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "batch: tensor 0 of the copy stream is 20 long, longer than length 8 (truncate first)"),
              "%s", err.msg);
    // Shorter ones are padded to the fixed length (a copy task padded to
    // pad_to_multiple), with zero tokens and zero weights.
    ct_copy_task fixed = t;
    fixed.min_length = 0;
    int fixed_len = ct_copy_task_seq_len(&fixed);
    CHECK_OK(ct_copy_stream_new(&s, &fixed, &err), &err);
    bp.length = fixed_len + 6;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    ct_stream_signature(s, sigs);
    CHECK(sigs[0].shape[1] == fixed_len + 6 && sigs[2].shape[1] == fixed_len + 6);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK_MSG(b.t[0].shape[1] == fixed_len + 6, "fixed-length examples batched to %lld, not padded to %d",
              (long long)b.t[0].shape[1], fixed_len + 6);
    int pad_bad = 0;
    for (int64_t r = 0; r < b.t[0].shape[0]; r++)
        for (int64_t k = fixed_len; k < fixed_len + 6; k++)
            pad_bad += ct_i32(&b.t[0])[r * (fixed_len + 6) + k] != 0 || ct_f32(&b.t[2])[r * (fixed_len + 6) + k] != 0;
    CHECK(pad_bad == 0);
    ct_stream_free(s);
    // Examples exactly as long as length are taken as they are (only a
    // longer one must be truncated first).
    CHECK_OK(ct_copy_stream_new(&s, &fixed, &err), &err);
    bp.length = fixed_len;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    if (s) {
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(b.n == 3 && b.t[0].shape[1] == fixed_len);
    }
    ct_stream_free(s);
    // A negative length is refused, not read as 0 (no fixed length).
    bp.length = -1;
    CHECK_OK(ct_copy_stream_new(&s, &fixed, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &bp, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "batch: length is -1; expected >= 0 (0: no fixed length)"), "%s", err.msg);
    int64_t bounds[] = {6, 10, 14};
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    bp.length = 0;
    bp.boundaries = bounds;
    bp.n_boundaries = 3;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    int shapes_ok = 1;
    for (int i = 0; i < 20; i++) {
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        int64_t L = b.t[0].shape[1];
        shapes_ok &= L == 6 || L == 10 || L == 14;
    }
    CHECK(shapes_ok);
    ct_stream_free(s);
    // Boundaries not ascending, and a boundary or fixed length no machine
    // can hold: refused when the batcher is made, with the stream it was
    // given freed (a boundary of 2^40 aborted in malloc at the first batch).
    int64_t flat[] = {6, 6}, huge[] = {6, INT64_C(1) << 40};
    bp.boundaries = flat;
    bp.n_boundaries = 2;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &bp, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "batch: boundaries must be positive and ascending (boundary 1 is 6)"), "%s", err.msg);
    // A batch whose first example's position passes 2^63 cannot be sought.
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    ct_batch_params four = ct_batch_default_params();
    four.batch_size = 4;
    CHECK_OK(ct_batch_stream_new(&s, s, &four, &err), &err);
    CHECK(ct_stream_seek(s, INT64_MAX / 4 + 1, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "batch: cannot seek to batch 2305843009213693952: its examples' position overflows"),
              "%s", err.msg);
    CHECK_OK(ct_stream_seek(s, INT64_MAX / 4, &err), &err);
    ct_stream_free(s);
    int64_t from_zero[] = {0, 8};
    bp.boundaries = from_zero;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &bp, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "batch: boundaries must be positive and ascending (boundary 0 is 0)"), "%s", err.msg);
    // Negative windows and multiples are refused, not read as 0.
    ct_batch_params negative = ct_batch_default_params();
    negative.bucket_window = -1;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &negative, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "batch: batch_size 32 x bucket_window -1 is out of range"), "%s", err.msg);
    negative = ct_batch_default_params();
    negative.pad_to_multiple = -1;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &negative, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "batch: pad_to_multiple is -1; expected >= 0"), "%s", err.msg);
    bp.boundaries = huge;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &bp, &err) == CT_ERR_MEMORY && s == NULL);
    CHECK_MSG(strstr(err.msg, "batch: a window of 1 x 4 examples padded to length 1099511627776 needs"), "%s", err.msg);
    bp.boundaries = NULL;
    bp.n_boundaries = 0;
    bp.length = INT64_C(1) << 40;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK(ct_batch_stream_new(&s, s, &bp, &err) == CT_ERR_MEMORY && s == NULL);
    CHECK_MSG(strstr(err.msg, "padded to length 1099511627776 needs"), "%s", err.msg);

    // The remainder of a finite stream: dropped, or padded with weight-0 rows.
    for (int pad = 0; pad < 2; pad++) {
        s = numbered_stream(10);
        bp = ct_batch_default_params();
        bp.batch_size = 4;
        bp.pad_remainder = pad;
        CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
        CHECK(ct_stream_length(s) == (pad ? 3 : 2));
        int n = take(s, 10, NULL);
        CHECK(n == (pad ? 3 : 2));
        if (pad) {
            CHECK_OK(ct_stream_seek(s, 2, &err), &err);
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            CHECK(chunk_of(&b, 0) == 8 && chunk_of(&b, 1) == 9);
            float wsum = 0;
            int zero_tokens = 1;
            for (int k = 0; k < 32; k++) wsum += ct_f32(&b.t[2])[k];
            for (int k = 16; k < 32; k++) zero_tokens &= ct_i32(&b.t[0])[k] == 0;
            CHECK(wsum == 16.0f && zero_tokens);
        }
        ct_stream_free(s);
    }

    // Bucketing: each window's examples come out once, in batches of similar length.
    ct_stream *plain;
    CHECK_OK(ct_copy_stream_new(&plain, &t, &err), &err);
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    bp = ct_batch_default_params();
    bp.batch_size = 4;
    bp.bucket_window = 5;
    bp.seed = 2;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    int lengths_in_window[20], got_lengths[7 * 3] = {0}, want_lengths[7 * 3] = {0};
    int64_t spread = 0, unbucketed_spread = 0, descending = 0;
    for (int w = 0; w < 3; w++) {
        for (int i = 0; i < 20; i++) {
            CHECK_OK(ct_stream_next(plain, &b, &err), &err);
            lengths_in_window[i] = (int)(b.t[0].shape[0] - 2) / 2;
            want_lengths[w * 7 + lengths_in_window[i]]++;
        }
        for (int i = 0; i < 5; i++) {
            int lo = 99, hi = 0, ulo = 99, uhi = 0, prev = 0;
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            for (int r = 0; r < 4; r++) {
                // The row's w length: its weights count it.
                int n = 0;
                for (int64_t k = 0; k < b.t[2].shape[1]; k++) n += ct_f32(&b.t[2])[r * b.t[2].shape[1] + k] == 1.0f;
                got_lengths[w * 7 + n]++;
                descending += n < prev;  // sorted ascending: a row is no shorter than the one before
                prev = n;
                lo = n < lo ? n : lo;
                hi = n > hi ? n : hi;
                int u = lengths_in_window[4 * i + r];
                ulo = u < ulo ? u : ulo;
                uhi = u > uhi ? u : uhi;
            }
            spread += hi - lo;
            unbucketed_spread += uhi - ulo;
        }
    }
    CHECK_MSG(memcmp(got_lengths, want_lengths, sizeof want_lengths) == 0, "bucketed windows lost or gained examples");
    CHECK_MSG(descending == 0, "bucketing: %lld rows shorter than the row before them", (long long)descending);
    CHECK_MSG(spread * 2 < unbucketed_spread, "bucketing: length spread %lld vs %lld without", (long long)spread,
              (long long)unbucketed_spread);
    printf("  bucketing: summed length spread within batches %lld (unbucketed %lld)\n", (long long)spread,
           (long long)unbucketed_spread);
    ct_stream_free(s);
    ct_stream_free(plain);

    // Examples of one length: the sort is stable (each batch is 4 examples
    // in stream order) and a window's 5 batches come out in an order drawn
    // from the seed, not always in the stream's.
    s = numbered_stream(40);
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    int in_order = 1, reordered = 0, seen_batch[10] = {0};
    for (int w = 0; w < 2; w++) {
        int prev = -1;
        for (int i = 0; i < 5; i++) {
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            int first = chunk_of(&b, 0);
            for (int r = 0; r < 4; r++) in_order &= chunk_of(&b, r) == first + r;
            in_order &= first % 4 == 0 && first / 20 == w;
            if (first % 4 == 0 && first >= 0 && first < 40) seen_batch[first / 4]++;
            reordered += first < prev;
            prev = first;
        }
    }
    int each_once = 1;
    for (int i = 0; i < 10; i++) each_once &= seen_batch[i] == 1;
    CHECK_MSG(in_order && each_once, "bucketing examples of one length: batches not consecutive runs of the window");
    CHECK_MSG(reordered > 0, "bucketing: the batches of both windows came out in stream order");
    // The seed decides the order of a window's batches: a cursor saved with
    // one seed is refused by a stream with another.
    ct_stream *other = numbered_stream(40);
    bp.seed = 3;
    CHECK_OK(ct_batch_stream_new(&other, other, &bp, &err), &err);
    bp.seed = 2;
    if (other) {
        CHECK(ct_stream_set_cursor(other, ct_stream_get_cursor(s), &err) == CT_ERR_STATE);
        CHECK_MSG(strstr(err.msg, "was saved by a different stream"), "%s", err.msg);
    }
    ct_stream_free(other);
    ct_stream_free(s);

    // A window's order is a Fisher-Yates permutation: with 3 batches a window
    // keeps its first batch first with probability 1/3, and of 30 windows
    // some do (Sattolo's single 3-cycles never would).
    s = numbered_stream(360);
    bp.bucket_window = 3;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    // Each window draws its own order (from the seed and its index).
    int first_stays = 0, orders_seen[3] = {0};
    for (int w = 0; w < 30; w++)
        for (int i = 0; i < 3; i++) {
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            first_stays += i == 0 && b.n > 0 && chunk_of(&b, 0) == 12 * w;
            int k = b.n > 0 ? (chunk_of(&b, 0) - 12 * w) / 4 : -1;
            if (i == 0 && k >= 0 && k < 3) orders_seen[k] = 1;
        }
    CHECK_MSG(first_stays > 0, "bucketing: no window of 30 kept its first batch first: not Fisher-Yates");
    CHECK_MSG(orders_seen[0] + orders_seen[1] + orders_seen[2] == 3,
              "bucketing: over 30 windows the first batch out was always among the same ones");
    ct_stream_free(s);

    // Padding to a multiple: the width is the longest example rounded up, no
    // more (w of 1..3 tokens: examples of 4, 6 or 8; with 4, 8 stays 8 and 6
    // becomes 8; with 1 the width is the longest itself).
    for (int m = 1; m <= 4; m += 3) {
        ct_copy_task short_w = {10, 3, false, 6, 1};
        CHECK_OK(ct_copy_stream_new(&ex, &short_w, &err), &err);
        CHECK_OK(ct_copy_stream_new(&s, &short_w, &err), &err);
        bp = ct_batch_default_params();
        bp.batch_size = 2;
        bp.pad_to_multiple = m;
        CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
        int wrong_width = 0, at_multiple = 0;
        for (int i = 0; i < 20; i++) {
            int64_t longest = 0;
            for (int r = 0; r < 2; r++) {
                ct_batch e;
                CHECK_OK(ct_stream_next(ex, &e, &err), &err);
                if (e.t[0].shape[0] > longest) longest = e.t[0].shape[0];
            }
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            int64_t want = (longest + m - 1) / m * m;
            wrong_width += b.t[0].shape[1] != want || b.t[2].shape[1] != want;
            at_multiple += longest % m == 0;
        }
        CHECK_MSG(wrong_width == 0, "pad_to_multiple %d: %d of 20 batches not padded to the longest rounded up", m,
                  wrong_width);
        CHECK(at_multiple > 0);
        ct_stream_free(s);
        ct_stream_free(ex);
    }
    // Multiple 2 rounds odd lengths up too (copy examples are all even;
    // addition examples are both).
    CHECK_OK(ct_addition_stream_new(&ex, &(ct_addition_task){13, 3, 9, 5}, &err), &err);
    CHECK_OK(ct_addition_stream_new(&s, &(ct_addition_task){13, 3, 9, 5}, &err), &err);
    bp = ct_batch_default_params();
    bp.batch_size = 1;
    bp.pad_to_multiple = 2;
    CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
    int wrong_width = 0, odd = 0;
    for (int i = 0; i < 20 && s && ex; i++) {
        ct_batch e;
        CHECK_OK(ct_stream_next(ex, &e, &err), &err);
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        int64_t len = e.t[0].shape[0];
        odd += len % 2;
        wrong_width += b.t[0].shape[1] != (len + 1) / 2 * 2;
    }
    CHECK_MSG(wrong_width == 0 && odd > 0, "pad_to_multiple 2: %d of 20 widths wrong (%d odd lengths)", wrong_width, odd);
    ct_stream_free(s);
    ct_stream_free(ex);
}

// A source of one item that no library source yields: targets of the given
// dtype (4) and weights of n_weights, to reach the weights stage's checks.
typedef struct odd_item {
    int32_t tokens[4];
    float weights[4];
} odd_item;

static ct_status odd_next(ct_stream *s, ct_batch *out, ct_error *err) {
    (void)err;
    odd_item *it = s->impl;
    *out = (ct_batch){3, {s->sigs[0], s->sigs[1], s->sigs[2]}};
    out->t[0].data = out->t[1].data = it->tokens;
    out->t[2].data = it->weights;
    return CT_OK;
}

static const ct_stream_ops odd_ops = {"odd", odd_next, NULL, NULL, NULL};

static ct_stream *odd_stream(ct_dtype targets, int n_weights) {
    ct_stream *s = ct_stream_alloc(&odd_ops, NULL, ct_calloc(1, sizeof(odd_item)));
    s->n_out = 3;
    s->sigs[0] = ct_tensor_1d(CT_DTYPE_I32, 4, NULL);
    s->sigs[1] = ct_tensor_1d(targets, 4, NULL);
    s->sigs[2] = ct_tensor_1d(CT_DTYPE_F32, n_weights, NULL);
    return s;
}

static void test_weights(void) {
    ct_error err;
    // Weights that do not match the targets, and a mask id over float
    // targets, are errors (not a read past the weights, not a float compared
    // as an int).
    ct_stream *odd = odd_stream(CT_DTYPE_I32, 3);
    CHECK_OK(ct_weights_stream_new(&odd, odd, -1, &err), &err);
    ct_batch ob;
    CHECK(ct_stream_next(odd, &ob, &err) == CT_ERR_SHAPE);
    CHECK_MSG(strstr(err.msg, "loss weights: weights") && strstr(err.msg, "do not match targets"), "%s", err.msg);
    ct_stream_free(odd);
    odd = odd_stream(CT_DTYPE_F32, 4);
    CHECK(ct_weights_stream_new(&odd, odd, 0, &err) == CT_ERR_ARG && odd == NULL);
    CHECK_MSG(strstr(err.msg, "loss weights: mask_id 0 needs int32 targets; they are"), "%s", err.msg);
    // mask_id 0 zeroes the weights of 0 targets (the copy task's separators);
    // the item's own weights are kept (0 on "0 w 0", 1 on the second w):
    // the first w's targets are not 0, so only the kept weights zero them.
    ct_copy_task t = {10, 3, false, 1, 0};
    ct_stream *s;
    CHECK_OK(ct_copy_stream_new(&s, &t, &err), &err);
    CHECK_OK(ct_weights_stream_new(&s, s, 0, &err), &err);
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    const float *w = ct_f32(&b.t[2]);
    const float want_w[8] = {0, 0, 0, 0, 0, 1, 1, 1};
    CHECK(b.n == 3 && ct_tensor_numel(&b.t[2]) == 8 && !memcmp(w, want_w, sizeof want_w));
    CHECK(ct_i32(&b.t[1])[1] != 0 && ct_i32(&b.t[1])[3] != 0);
    ct_stream_free(s);

    // The copy task's weights are already 0 at its separators; a token file
    // has weights 1 everywhere, so only the mask can zero them. With mask id
    // 0 (the padding id), a weight is 0 exactly where the target is 0; with
    // -1 nothing is masked; with 5 exactly the 5s are.
    enum { T = 6, N_EX = 4 };
    uint8_t buf[2 * T * N_EX];
    int32_t tok[T * N_EX];
    for (int i = 0; i < T * N_EX; i++) {
        tok[i] = i % 3 == 1 || i == T * N_EX - 1 ? 0 : 1 + (5 * i) % 9;
        put16(buf + 2 * i, (uint16_t)tok[i]);
    }
    write_file(tmp_path("pad0.bin"), buf, sizeof buf);
    const char *paths[] = {tmp_path("pad0.bin")};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = T;
    p.token_bytes = 2;
    const int mask_ids[] = {0, -1, 5};
    for (int m = 0; m < 3; m++) {
        CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
        ct_batch_params bp = ct_batch_default_params();
        bp.batch_size = N_EX;
        CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
        CHECK_OK(ct_weights_stream_new(&s, s, mask_ids[m], &err), &err);
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(b.n == 3 && ct_tensor_numel(&b.t[2]) == T * N_EX);
        int wrong = 0, first = -1, zeros = 0;
        for (int i = 0; i < T * N_EX; i++) {
            float want = mask_ids[m] >= 0 && tok[i] == mask_ids[m] ? 0.0f : 1.0f;
            zeros += want == 0;
            if (ct_i32(&b.t[1])[i] != tok[i] || ct_f32(&b.t[2])[i] != want) wrong++, first = first < 0 ? i : first;
        }
        CHECK_MSG(wrong == 0, "mask id %d: %d of %d weights wrong, the first at %d (target %d, weight %g)", mask_ids[m],
                  wrong, T * N_EX, first, first >= 0 ? tok[first] : 0, first >= 0 ? ct_f32(&b.t[2])[first] : 0.0);
        CHECK(mask_ids[m] < 0 ? zeros == 0 : zeros > 0);
        ct_stream_free(s);
    }
}

// ---- resume ------------------------------------------------------------------------------------------

static ct_stream *chain_copy(void) {
    ct_error err;
    ct_stream *s;
    ct_copy_task t = {16, 5, false, 3, 0};
    if (ct_copy_stream_new(&s, &t, &err) != CT_OK) return NULL;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 3;
    return must(ct_batch_stream_new(&s, s, &bp, &err), &s, &err);
}

static ct_stream *chain_reverse_shuffled(void) {
    ct_error err;
    ct_stream *s;
    ct_copy_task t = {16, 7, true, 5, 2};
    if (ct_copy_stream_new(&s, &t, &err) != CT_OK) return NULL;
    if (ct_shuffle_stream_new(&s, s, 16, 1, &err) != CT_OK) return NULL;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 4;
    bp.length = 16;
    if (ct_batch_stream_new(&s, s, &bp, &err) != CT_OK) return NULL;
    return must(ct_prefetch_stream_new(&s, s, 3, &err), &s, &err);
}

static ct_stream *chain_addition_bucketed(void) {
    ct_error err;
    ct_stream *s;
    ct_addition_task t = {13, 3, 12, 8};
    if (ct_addition_stream_new(&s, &t, &err) != CT_OK) return NULL;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 4;
    bp.bucket_window = 3;
    bp.pad_to_multiple = 4;
    bp.seed = 5;
    return must(ct_batch_stream_new(&s, s, &bp, &err), &s, &err);
}

// The LM chain on text: train split, shuffled epochs, a shuffle buffer, batches, prefetch.
static ct_stream *chain_text(void) {
    ct_error err;
    static const char *path[1];
    path[0] = tmp_path("numbered.txt");
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = path;
    p.n_paths = 1;
    p.seq_len = 8;
    p.split = CT_DATA_SPLIT_TRAIN;
    p.eval_fraction = 0.1;
    ct_stream *s;
    if (ct_text_stream_new(&s, &p, &err) != CT_OK) return NULL;
    if (ct_epochs_stream_new(&s, s, true, 21, 0, &err) != CT_OK) return NULL;
    if (ct_shuffle_stream_new(&s, s, 32, 22, &err) != CT_OK) return NULL;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 8;
    if (ct_batch_stream_new(&s, s, &bp, &err) != CT_OK) return NULL;
    return must(ct_prefetch_stream_new(&s, s, 2, &err), &s, &err);
}

// One epoch through a shuffle buffer: restores inside the drain.
static ct_stream *chain_text_draining(void) {
    ct_error err;
    static const char *path[1];
    path[0] = tmp_path("numbered.txt");
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = path;
    p.n_paths = 1;
    p.seq_len = 8;
    ct_stream *s;
    if (ct_text_stream_new(&s, &p, &err) != CT_OK) return NULL;
    if (ct_epochs_stream_new(&s, s, false, 0, 1, &err) != CT_OK) return NULL;
    return must(ct_shuffle_stream_new(&s, s, 64, 4, &err), &s, &err);
}

static ct_stream *chain_tokens(void) {
    ct_error err;
    static const char *path[1];
    path[0] = tmp_path("tok16.bin");
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = path;
    p.n_paths = 1;
    p.seq_len = 3;
    p.token_bytes = 2;
    ct_stream *s;
    if (ct_token_stream_new(&s, &p, &err) != CT_OK) return NULL;
    if (ct_epochs_stream_new(&s, s, true, 1, 0, &err) != CT_OK) return NULL;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 5;
    return must(ct_batch_stream_new(&s, s, &bp, &err), &s, &err);
}

// Two files (a chunk spans them), shifted, two unshuffled epochs, prefetch
// right over them: a finite stream, restored up to and past its end.
static ct_stream *chain_text_files(void) {
    ct_error err;
    static const char *paths[2];
    paths[0] = tmp_path("text/a.txt");
    paths[1] = tmp_path("text/sub/b.txt");
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 2;
    p.seq_len = 2;
    p.shifted = true;
    ct_stream *s;
    if (ct_text_stream_new(&s, &p, &err) != CT_OK) return NULL;
    if (ct_epochs_stream_new(&s, s, false, 0, 2, &err) != CT_OK) return NULL;
    return must(ct_prefetch_stream_new(&s, s, 1, &err), &s, &err);
}

static ct_stream *chain_idx(void) {
    ct_error err;
    ct_stream *s;
    if (open_idx(tmp_path("im.gz"), tmp_path("lb.gz"), &s, &err) != CT_OK) return NULL;
    if (ct_epochs_stream_new(&s, s, true, 6, 0, &err) != CT_OK) return NULL;
    if (ct_shuffle_stream_new(&s, s, 3, 7, &err) != CT_OK) return NULL;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 2;
    if (ct_batch_stream_new(&s, s, &bp, &err) != CT_OK) return NULL;
    return must(ct_prefetch_stream_new(&s, s, 2, &err), &s, &err);
}

static void test_resume(void) {
    numbered_corpus(300);
    check_resume("copy, batch", chain_copy, 7, 9);
    check_resume("reverse, shuffle buffer, batch, prefetch", chain_reverse_shuffled, 13, 20);
    check_resume("addition, bucketed batches", chain_addition_bucketed, 5, 11);  // mid-window
    check_resume("text, epochs, shuffle, batch, prefetch", chain_text, 40, 50);  // past an epoch
    check_resume("text, one epoch, shuffle buffer draining", chain_text_draining, 270, 30);
    check_resume("tokens, epochs, batch", chain_tokens, 6, 8);
    check_resume("idx, epochs, shuffle, batch, prefetch", chain_idx, 11, 12);
    check_positions("text, epochs, shuffle, batch, prefetch", chain_text, 90, 1);
    check_positions("text, one epoch, shuffle buffer draining", chain_text_draining, 300, 1);
    check_positions("addition, bucketed batches", chain_addition_bucketed, 40, 1);
    check_positions("idx, epochs, shuffle, batch, prefetch", chain_idx, 30, 1);
    check_positions("tokens, epochs, batch", chain_tokens, 30, 1);
    check_positions("copy, batch", chain_copy, 20, 1);
    check_positions("reverse, shuffle buffer, batch, prefetch", chain_reverse_shuffled, 20, 1);
    check_positions("text, 2 files, 2 epochs, prefetch", chain_text_files, 16, 1);  // 12 items

    // A cursor from a different pipeline is refused.
    ct_error err;
    ct_stream *a = chain_copy(), *b = chain_text();
    if (a && b) {
        ct_stream_cursor c = ct_stream_get_cursor(a);
        CHECK(ct_stream_set_cursor(b, c, &err) == CT_ERR_STATE);
        CHECK_MSG(strstr(err.msg, "was saved by a different stream"), "%s", err.msg);
    }
    ct_stream_free(a);
    ct_stream_free(b);

    // A corpus file rewritten with other bytes of the same size refuses the
    // cursor; the same bytes at another path take it. numbered.txt's 2,400
    // bytes are hashed whole; big.txt (300 KiB) in sampled blocks, one of
    // which covers its last byte.
    {
        ct_stream *before = chain_text();
        ct_stream_cursor saved = ct_stream_get_cursor(before);
        ct_stream_free(before);
        FILE *f = fopen(tmp_path("numbered.txt"), "r+b");
        CHECK(f && fseek(f, 100, SEEK_SET) == 0 && fputc('x', f) == 'x');
        if (f) fclose(f);
        ct_stream *edited = chain_text();
        CHECK(edited && ct_stream_set_cursor(edited, saved, &err) == CT_ERR_STATE);
        ct_stream_free(edited);
        numbered_corpus(300);  // the original bytes again
        ct_stream *again = chain_text();
        CHECK(again && ct_stream_set_cursor(again, saved, &err) == CT_OK);
        ct_stream_free(again);

        enum { BIG = 300 * 1024 };
        char *text = malloc(BIG);
        for (int i = 0; i < BIG; i++) text[i] = (char)('a' + i % 26);
        static const char *big_path[1], *moved_path[1];
        big_path[0] = tmp_path("big.txt");
        moved_path[0] = tmp_path("big_moved.txt");
        write_file(big_path[0], text, BIG);
        write_file(moved_path[0], text, BIG);
        ct_corpus_params p = ct_corpus_default_params();
        p.n_paths = 1;
        p.seq_len = 64;
        ct_stream *big = NULL, *moved = NULL, *changed = NULL;
        p.paths = big_path;
        CHECK_OK(ct_text_stream_new(&big, &p, &err), &err);
        p.paths = moved_path;
        CHECK_OK(ct_text_stream_new(&moved, &p, &err), &err);
        text[BIG - 1] = '!';  // the last byte: in the last sampled block
        write_file(big_path[0], text, BIG);
        p.paths = big_path;
        CHECK_OK(ct_text_stream_new(&changed, &p, &err), &err);
        ct_stream_cursor c_big = ct_stream_get_cursor(big);
        CHECK(ct_stream_set_cursor(moved, c_big, &err) == CT_OK);
        CHECK(ct_stream_set_cursor(changed, c_big, &err) == CT_ERR_STATE);
        CHECK_MSG(strstr(err.msg, "was saved by a different stream"), "%s", err.msg);
        // 63 * 26 bytes longer: each of the 64 sampled blocks starts 26 i
        // bytes later, at the same letter, so the sampled CRC is the same;
        // the size tells the files apart.
        enum { LONGER = BIG + 63 * 26 };
        char *longer = malloc(LONGER);
        for (int i = 0; i < LONGER; i++) longer[i] = (char)('a' + i % 26);
        write_file(moved_path[0], longer, LONGER);
        free(longer);
        ct_stream_free(moved);
        p.paths = moved_path;
        CHECK_OK(ct_text_stream_new(&moved, &p, &err), &err);
        CHECK(ct_stream_set_cursor(moved, c_big, &err) == CT_ERR_STATE);
        ct_stream_free(big);
        ct_stream_free(moved);
        ct_stream_free(changed);
        free(text);
    }

    // Prefetch changes nothing: the same items as the chain without it, and
    // a cursor taken with prefetch restores into the chain without it.
    ct_stream *with = chain_text(), *without;
    {
        // Build the chain again without prefetch.
        static const char *path[1];
        path[0] = tmp_path("numbered.txt");
        ct_corpus_params p = ct_corpus_default_params();
        p.paths = path;
        p.n_paths = 1;
        p.seq_len = 8;
        p.split = CT_DATA_SPLIT_TRAIN;
        p.eval_fraction = 0.1;
        CHECK_OK(ct_text_stream_new(&without, &p, &err), &err);
        CHECK_OK(ct_epochs_stream_new(&without, without, true, 21, 0, &err), &err);
        CHECK_OK(ct_shuffle_stream_new(&without, without, 32, 22, &err), &err);
        ct_batch_params bp = ct_batch_default_params();
        bp.batch_size = 8;
        CHECK_OK(ct_batch_stream_new(&without, without, &bp, &err), &err);
    }
    enum { M = 60 };
    rec x[M], y[M];
    int nx = take(with, M, x), ny = take(without, M, y), same = 0;
    for (int i = 0; i < M && i < nx && i < ny; i++) same += rec_equal(&x[i], &y[i]);
    CHECK_MSG(same == M, "prefetch changed items: %d of %d the same", same, M);
    ct_stream_cursor c = ct_stream_get_cursor(with);
    ct_stream *fresh = chain_text();
    CHECK_OK(ct_stream_set_cursor(without, c, &err), &err);
    CHECK_OK(ct_stream_set_cursor(fresh, c, &err), &err);
    for (int i = 0; i < nx; i++) rec_free(&x[i]);
    for (int i = 0; i < ny; i++) rec_free(&y[i]);
    nx = take(fresh, 10, x);
    ny = take(without, 10, y);
    same = 0;
    for (int i = 0; i < 10 && i < nx && i < ny; i++) same += rec_equal(&x[i], &y[i]);
    CHECK(same == 10);
    for (int i = 0; i < nx; i++) rec_free(&x[i]);
    for (int i = 0; i < ny; i++) rec_free(&y[i]);
    printf("  prefetch: %d batches identical with and without it; cursor moves between them\n", M);
    ct_stream_free(with);
    ct_stream_free(without);
    ct_stream_free(fresh);
}

// The prefetch thread: an error arrives at the item it belongs to; freeing
// with the ring full, while the worker waits, and right after a seek exits
// cleanly (ASan and leak checks; TSan in a thread-sanitizer build).
static void test_prefetch(void) {
    ct_error err;
    const char *path[] = {tmp_path("tok32.bin")};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = path;
    p.n_paths = 1;
    p.seq_len = 4;
    p.token_bytes = 4;
    p.vocab_size = 70020;  // chunk 5 (tokens 70020..) is bad
    ct_stream *s;
    CHECK_OK(ct_token_stream_new(&s, &p, &err), &err);
    CHECK_OK(ct_prefetch_stream_new(&s, s, 4, &err), &err);
    int n = 0;
    ct_status st = CT_OK;
    ct_batch b;
    while (n < 20) {
        st = ct_stream_next(s, &b, &err);
        if (st != CT_OK || b.n == 0) break;
        n++;
    }
    CHECK(st == CT_ERR_FORMAT && n == 5);
    CHECK_MSG(strstr(err.msg, "token 70020 at byte 80"), "%s", err.msg);
    CHECK(ct_stream_get_cursor(s).position == 5);
    err.msg[0] = 0;
    CHECK(ct_stream_next(s, &b, &err) == CT_ERR_FORMAT);  // it stays failed, with the same message
    CHECK_MSG(strstr(err.msg, "token 70020 at byte 80"), "repeated error: \"%s\"", err.msg);
    CHECK_OK(ct_stream_seek(s, 2, &err), &err);  // until a seek
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(ct_i32(&b.t[0])[0] == 70008);
    ct_stream_free(s);

    // Free while the worker waits on a full ring, many times.
    for (int i = 0; i < 20; i++) {
        ct_copy_task t = {10, 4, false, (uint64_t)i, 0};
        CHECK(ct_copy_stream_new(&s, &t, &err) == CT_OK);
        CHECK(ct_prefetch_stream_new(&s, s, 1 + i % 3, &err) == CT_OK);
        take(s, i % 4, NULL);
        if (i % 2) CHECK(ct_stream_seek(s, 100, &err) == CT_OK);
        ct_stream_free(s);
    }
    // An end: a finite stream through prefetch ends where it would.
    s = numbered_stream(7);
    CHECK_OK(ct_prefetch_stream_new(&s, s, 3, &err), &err);
    CHECK(take(s, 20, NULL) == 7);
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    CHECK(b.n == 0);
    ct_stream_free(s);
    CHECK(ct_prefetch_stream_new(&s, numbered_stream(3), 0, &err) == CT_ERR_ARG);
    // n_ahead items ahead of the one held: the description says n_ahead.
    CHECK_OK(ct_prefetch_stream_new(&s, numbered_stream(3), 3, &err), &err);
    char desc[256];
    CHECK_MSG(!strncmp(ct_stream_describe(s, desc, sizeof desc), "prefetch(3) <- text(", 20), "%s", desc);
    ct_stream_free(s);

    // The item handed out stays as it was while the worker runs ahead: given
    // time to fill every free slot, the worker leaves the held one alone.
    s = numbered_stream(40);
    CHECK_OK(ct_prefetch_stream_new(&s, s, 1, &err), &err);
    int intact = 0;
    for (int i = 0; i < 8; i++) {
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        usleep(20000);
        intact += b.n > 0 && chunk_of(&b, 0) == i;
    }
    CHECK_MSG(intact == 8, "prefetch: %d of 8 items held by the caller were overwritten", 8 - intact);
    ct_stream_free(s);
}

// ---- the Debian packages -----------------------------------------------------------------------

static void test_real_files(void) {
    ct_error err;
    const char *fortunes = "/usr/share/games/fortunes";
    struct stat st;
    if (stat(fortunes, &st) != 0) {
        printf("  SKIPPED fortunes: %s is missing (scripts/install-deps.sh installs the fortunes package)\n", fortunes);
    } else {
        const char *dir[] = {fortunes};
        ct_corpus_params p = ct_corpus_default_params();
        p.paths = dir;
        p.n_paths = 1;
        p.seq_len = 128;
        int64_t n[3] = {0};
        for (int split = 0; split <= 2; split++) {
            p.split = (ct_data_split)split;
            ct_stream *s;
            CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
            if (!s) continue;
            n[split] = ct_stream_length(s);
            if (split == CT_DATA_SPLIT_TRAIN) {
                int dat = 0, u8 = 0;
                for (int i = 0; i < ct_corpus_n_files(s); i++) {
                    const char *f = ct_corpus_file(s, i);
                    dat += strlen(f) > 4 && strcmp(f + strlen(f) - 4, ".dat") == 0;
                    u8 += strlen(f) > 3 && strcmp(f + strlen(f) - 3, ".u8") == 0;
                }
                CHECK_MSG(dat == 0 && u8 == 0, "%d .dat index files and %d .u8 links read as text", dat, u8);
                CHECK(ct_corpus_n_files(s) >= 10);
                CHECK_OK(ct_epochs_stream_new(&s, s, true, 1, 0, &err), &err);
                ct_batch_params bp = ct_batch_default_params();
                bp.batch_size = 8;
                CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
                CHECK_OK(ct_prefetch_stream_new(&s, s, 2, &err), &err);
                ct_batch b;
                CHECK_OK(ct_stream_next(s, &b, &err), &err);
                int64_t letters = 0, total = ct_tensor_numel(&b.t[0]);
                for (int64_t k = 0; k < total; k++) {
                    int32_t c = ct_i32(&b.t[0])[k];
                    letters += (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == ' ';
                }
                CHECK_MSG(letters * 10 > total * 7, "only %lld of %lld bytes are letters or spaces", (long long)letters,
                          (long long)total);
                char desc[512];
                printf("  fortunes: %s\n", ct_stream_describe(s, desc, sizeof desc));
                printf("  fortunes sample: \"");
                for (int k = 0; k < 60; k++) {
                    int32_t c = ct_i32(&b.t[0])[k];
                    putchar(c == '\n' ? '|' : c >= 32 && c < 127 ? c : '?');
                }
                printf("\"\n");
            }
            ct_stream_free(s);
        }
        CHECK(n[1] + n[2] == n[0] && n[2] > 0);
        printf("  fortunes: %lld chunks of 128 bytes, train %lld, eval %lld\n", (long long)n[0], (long long)n[1],
               (long long)n[2]);
    }

    const char *images = "/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz",
               *labels = "/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz";
    if (stat(images, &st) != 0) {
        printf("  SKIPPED fashion-mnist: %s is missing (scripts/install-deps.sh installs dataset-fashion-mnist)\n",
               images);
        return;
    }
    ct_stream *s;
    CHECK_OK(open_idx(images, labels, &s, &err), &err);
    if (!s) return;
    CHECK(ct_stream_length(s) == 10000);
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    ct_stream_signature(s, sigs);
    CHECK(sigs[0].shape[0] == 28 && sigs[0].shape[1] == 28);
    int per_class[10] = {0};
    double mean = 0;
    for (int i = 0; i < 10000; i++) {
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        int l = *ct_i32(&b.t[1]);
        if (l >= 0 && l < 10) per_class[l]++;
        if (i < 100)
            for (int k = 0; k < 784; k++) mean += ct_f32(&b.t[0])[k];
    }
    int balanced = 1;
    for (int c = 0; c < 10; c++) balanced &= per_class[c] == 1000;
    CHECK_MSG(balanced, "Fashion-MNIST's test set has 1000 images per class");
    mean /= 100 * 784;
    CHECK(mean > 0.1 && mean < 0.6);
    printf("  fashion-mnist t10k: 10000 images of 28x28, 1000 per class, mean pixel %.3f\n", mean);
    ct_stream_free(s);
}

// ---- arrays in memory -----------------------------------------------------------------------

// The arrays the tests below read: AN items of features x f32 (AN, 3, 2)
// (item i holds 100 i + j), tokens t i32 (AN, 4) (1000 i + j) and labels
// y i32 (AN) (i % 3).
enum { AN = 10 };
static float arr_x[AN * 6];
static int32_t arr_t[AN * 4], arr_y[AN];

static void arrays_fill(void) {
    for (int i = 0; i < AN; i++) {
        for (int j = 0; j < 6; j++) arr_x[i * 6 + j] = 100.0f * (float)i + (float)j;
        for (int j = 0; j < 4; j++) arr_t[i * 4 + j] = 1000 * i + j;
        arr_y[i] = i % 3;
    }
}

static void arrays_tensors(ct_tensor a[3]) {
    a[0] = ct_tensor_3d(CT_DTYPE_F32, AN, 3, 2, arr_x);
    a[1] = ct_tensor_2d(CT_DTYPE_I32, AN, 4, arr_t);
    a[2] = ct_tensor_1d(CT_DTYPE_I32, AN, arr_y);
}

static ct_stream *arrays_source(bool copy) {
    ct_error err;
    ct_tensor a[3];
    arrays_tensors(a);
    ct_stream *s;
    return must(ct_arrays_stream_new(&s, a, 3, copy, &err), &s, &err);
}

// Whether row r of the (batched, if batched) item b is item i of the arrays.
static bool is_slice(const ct_batch *b, bool batched, int r, int i) {
    int lead = batched ? 1 : 0;
    if (b->n != 3 || i < 0 || i >= AN) return false;
    const ct_tensor *x = &b->t[0], *t = &b->t[1], *y = &b->t[2];
    if (x->dtype != CT_DTYPE_F32 || x->ndim != 2 + lead || x->shape[lead] != 3 || x->shape[lead + 1] != 2) return false;
    if (t->dtype != CT_DTYPE_I32 || t->ndim != 1 + lead || t->shape[lead] != 4) return false;
    if (y->dtype != CT_DTYPE_I32 || y->ndim != lead) return false;
    return memcmp(ct_f32(x) + r * 6, arr_x + i * 6, 6 * sizeof(float)) == 0 &&
           memcmp(ct_i32(t) + r * 4, arr_t + i * 4, 4 * sizeof(int32_t)) == 0 && ct_i32(y)[r] == arr_y[i];
}

static ct_stream *chain_arrays_source(void) { return arrays_source(false); }

static ct_stream *chain_arrays(void) {
    ct_error err;
    ct_stream *s = arrays_source(true);
    if (!s) return NULL;
    if (ct_epochs_stream_new(&s, s, true, 5, 0, &err) != CT_OK) return NULL;
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 4;
    if (ct_batch_stream_new(&s, s, &bp, &err) != CT_OK) return NULL;
    return must(ct_prefetch_stream_new(&s, s, 2, &err), &s, &err);
}

// A failed ct_arrays_stream_new: *out NULL, CT_ERR_ARG and the message.
static void check_arrays_refused(const ct_tensor *a, int n, bool copy, const char *want) {
    ct_error err;
    ct_stream *s = (ct_stream *)&err;  // not NULL: the call must set it
    ct_status st = ct_arrays_stream_new(&s, a, n, copy, &err);
    CHECK_MSG(st == CT_ERR_ARG && s == NULL, "wanted the error \"%s\", got status %d", want, (int)st);
    if (st == CT_OK) ct_stream_free(s);
    else CHECK_MSG(strstr(err.msg, want), "wanted \"%s\" in \"%s\"", want, err.msg);
    // With no ct_error to fill, the status alone.
    s = (ct_stream *)&err;
    st = ct_arrays_stream_new(&s, a, n, copy, NULL);
    CHECK(st == CT_ERR_ARG && s == NULL);
    if (st == CT_OK) ct_stream_free(s);
}

static void test_arrays(void) {
    ct_error err;
    arrays_fill();

    // Items are the slices, with one dim less (labels of rank 0), borrowed or
    // copied; then the end, for good.
    for (int copy = 0; copy < 2; copy++) {
        ct_stream *s = arrays_source(copy);
        if (!s) return;
        CHECK(ct_stream_length(s) == AN);
        ct_tensor sigs[CT_BATCH_MAX_TENSORS];
        CHECK(ct_stream_signature(s, sigs) == 3);
        CHECK(sigs[0].ndim == 2 && sigs[0].shape[0] == 3 && sigs[0].shape[1] == 2 && sigs[0].dtype == CT_DTYPE_F32);
        CHECK(sigs[1].ndim == 1 && sigs[1].shape[0] == 4 && sigs[1].dtype == CT_DTYPE_I32);
        CHECK(sigs[2].ndim == 0 && sigs[2].dtype == CT_DTYPE_I32 && !sigs[0].data);
        int right = 0, views = 0;
        for (int i = 0; i < AN; i++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            right += is_slice(&b, false, 0, i);
            views += b.t[0].data == arr_x + 6 * i && b.t[2].data == arr_y + i;
        }
        CHECK_MSG(right == AN, "%s: %d of %d items are the arrays' slices", copy ? "copied" : "borrowed", right, AN);
        // Borrowed items are views into the caller's arrays, copied ones not.
        CHECK_MSG(views == (copy ? 0 : AN), "%s: %d of %d items point into the caller's arrays",
                  copy ? "copied" : "borrowed", views, AN);
        for (int k = 0; k < 2; k++) {
            ct_batch b;
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            CHECK(b.n == 0);
        }
        // Seek: to an item, back to the start, to the end and past it.
        CHECK_OK(ct_stream_seek(s, 7, &err), &err);
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(is_slice(&b, false, 0, 7));
        CHECK_OK(ct_stream_seek(s, 0, &err), &err);
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(is_slice(&b, false, 0, 0));
        CHECK_OK(ct_stream_seek(s, AN + 5, &err), &err);
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(b.n == 0 && ct_stream_get_cursor(s).position == AN);
        char desc[256];
        ct_stream_describe(s, desc, sizeof desc);
        const char *want = copy ? "arrays(10 items of (3,2) f32, (4) i32, () i32; copied, 440 bytes)"
                                : "arrays(10 items of (3,2) f32, (4) i32, () i32; borrowed)";
        CHECK_MSG(!strcmp(desc, want), "describe: \"%s\", wanted \"%s\"", desc, want);
        ct_stream_free(s);
    }
    // Repeated by epochs, no epoch count wraps at 2^32 (the doc): epoch
    // 2^32 + 1 is a permutation of the items of its own, not epoch 1's (its
    // order draws from the whole 64-bit epoch number), and a stream of
    // 2^31 epochs seeks to its last item.
    {
        ct_stream *s = arrays_source(false);
        CHECK_OK(ct_epochs_stream_new(&s, s, true, 3, 0, &err), &err);
        int order[2][AN], seen[2] = {0, 0};
        const int64_t epochs[2] = {1, (INT64_C(1) << 32) + 1};
        for (int e = 0; e < 2; e++) {
            CHECK_OK(ct_stream_seek(s, epochs[e] * AN, &err), &err);
            for (int k = 0; k < AN; k++) {
                ct_batch b;
                CHECK_OK(ct_stream_next(s, &b, &err), &err);
                order[e][k] = -1;
                for (int i = 0; i < AN; i++)
                    if (is_slice(&b, false, 0, i)) order[e][k] = i, seen[e]++;
            }
        }
        CHECK_MSG(seen[0] == AN && seen[1] == AN, "epochs 1 and 2^32 + 1: %d and %d of %d items", seen[0], seen[1], AN);
        CHECK_MSG(memcmp(order[0], order[1], sizeof order[0]) != 0, "epoch 2^32 + 1 has epoch 1's order");
        ct_stream_free(s);
        s = arrays_source(false);
        CHECK_OK(ct_epochs_stream_new(&s, s, true, 3, INT64_C(1) << 31, &err), &err);
        CHECK_OK(ct_stream_seek(s, (INT64_C(1) << 31) * AN - 1, &err), &err);
        ct_batch b;
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(b.n == 3);
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(b.n == 0);
        ct_stream_free(s);
    }
    // A copy does not see the caller's arrays change (or go away) after it.
    {
        ct_stream *s = arrays_source(true);
        arr_x[6 * 2 + 1] = -1.0f;
        arr_y[2] = 99;
        ct_batch b;
        CHECK_OK(ct_stream_seek(s, 2, &err), &err);
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(ct_f32(&b.t[0])[1] == 201.0f && ct_i32(&b.t[2])[0] == 2);
        arrays_fill();
        ct_stream_free(s);
    }
    // Data whose floats are not 4-byte aligned (packed in a byte buffer):
    // refused borrowed (its items would be misaligned views), taken copied.
    {
        static unsigned char packed[1 + AN * 2 * sizeof(float)];
        for (int i = 0; i < 2 * AN; i++) {
            float v = (float)i / 4;
            memcpy(packed + 1 + i * sizeof v, &v, sizeof v);
        }
        ct_tensor a = ct_tensor_2d(CT_DTYPE_F32, AN, 2, packed + 1);
        check_arrays_refused(&a, 1, false, "arrays: array 0 (10,2) f32: its data at ");
        check_arrays_refused(&a, 1, false, "is not aligned to 4 bytes (its elements); align it or pass copy = true");
        ct_stream *s;
        CHECK_OK(ct_arrays_stream_new(&s, &a, 1, true, &err), &err);
        ct_batch b;
        CHECK_OK(ct_stream_seek(s, 3, &err), &err);
        CHECK_OK(ct_stream_next(s, &b, &err), &err);
        CHECK(b.n == 1 && b.t[0].ndim == 1 && ct_f32(&b.t[0])[0] == 1.5f && ct_f32(&b.t[0])[1] == 1.75f);
        ct_stream_free(s);
    }

    // Exact resume, alone and under epochs(shuffle), batch and prefetch.
    check_resume("arrays (borrowed)", chain_arrays_source, 4, 5);
    check_resume("arrays (copied), epochs, shuffle, batch, prefetch", chain_arrays, 7, 9);  // past an epoch
    check_positions("arrays (borrowed)", chain_arrays_source, AN + 1, 1);
    check_positions("arrays (copied), epochs, shuffle, batch, prefetch", chain_arrays, 20, 1);

    // Epochs with shuffle, then batches: epoch e is the permutation drawn
    // from (seed, e), whatever the source, so a numbered corpus of AN chunks
    // under the same epochs gives the order; the batches are its slices,
    // rows of x, t and y from the same item.
    {
        enum { B = 5, EPOCHS = 3 };
        ct_stream *s = arrays_source(false), *ref = numbered_stream(AN);
        CHECK_OK(ct_epochs_stream_new(&s, s, true, 3, EPOCHS, &err), &err);
        CHECK_OK(ct_epochs_stream_new(&ref, ref, true, 3, EPOCHS, &err), &err);
        ct_batch_params bp = ct_batch_default_params();
        bp.batch_size = B;
        CHECK_OK(ct_batch_stream_new(&s, s, &bp, &err), &err);
        CHECK(ct_stream_length(s) == EPOCHS * AN / B);
        int order[EPOCHS * AN], rows = 0, right = 0, moved = 0;
        for (int i = 0; i < EPOCHS * AN; i++) {
            ct_batch r;
            CHECK_OK(ct_stream_next(ref, &r, &err), &err);
            order[i] = r.n ? chunk_of(&r, 0) : -1;
            moved += order[i] != i % AN;
        }
        for (;;) {
            ct_batch b;
            CHECK_OK(ct_stream_next(s, &b, &err), &err);
            if (b.n == 0) break;
            CHECK(b.t[0].shape[0] == B && b.t[2].ndim == 1 && b.t[2].shape[0] == B);
            for (int r = 0; r < B && rows < EPOCHS * AN; r++, rows++) right += is_slice(&b, true, r, order[rows]);
        }
        int perm = 1;
        for (int e = 0; e < EPOCHS; e++) {
            int seen[AN] = {0};
            for (int i = 0; i < AN; i++)
                if (order[e * AN + i] >= 0 && order[e * AN + i] < AN) seen[order[e * AN + i]]++;
            for (int i = 0; i < AN; i++) perm &= seen[i] == 1;
        }
        CHECK_MSG(perm && moved > AN, "the reference order is not %d shuffled epochs (%d items moved)", EPOCHS, moved);
        CHECK_MSG(rows == EPOCHS * AN && right == rows,
                  "%d of %d batch rows are the slices of the shuffled epochs' items (%d rows in all)", right,
                  EPOCHS * AN, rows);
        printf("  arrays, epochs(shuffle), batch(%d): %d of %d rows are the permuted slices\n", B, right, EPOCHS * AN);
        ct_stream_free(s);
        ct_stream_free(ref);
    }

    // The fingerprint follows the data: the same arrays borrowed or copied
    // take each other's cursors; one element changed, the same bytes in
    // another shape, or fewer items refuse them.
    {
        ct_stream *borrowed = arrays_source(false), *copied = arrays_source(true);
        CHECK_OK(ct_stream_seek(borrowed, 3, &err), &err);
        ct_stream_cursor c = ct_stream_get_cursor(borrowed);
        CHECK_OK(ct_stream_set_cursor(copied, c, &err), &err);
        ct_stream_free(borrowed);
        ct_stream_free(copied);
        arr_t[AN * 4 - 1] ^= 1;  // the last element of the middle array
        ct_stream *edited = arrays_source(true);
        arrays_fill();
        err.msg[0] = 0;
        CHECK(edited && ct_stream_set_cursor(edited, c, &err) == CT_ERR_STATE);
        CHECK_MSG(strstr(err.msg, "was saved by a different stream"), "%s", err.msg);
        ct_stream_free(edited);
        ct_tensor a[3];
        arrays_tensors(a);
        a[0] = ct_tensor_2d(CT_DTYPE_F32, AN, 6, arr_x);
        ct_stream *reshaped;
        CHECK_OK(ct_arrays_stream_new(&reshaped, a, 3, false, &err), &err);
        CHECK(ct_stream_set_cursor(reshaped, c, &err) == CT_ERR_STATE);
        ct_stream_free(reshaped);
        arrays_tensors(a);
        for (int k = 0; k < 3; k++) a[k].shape[0] = AN - 1;
        ct_stream *fewer;
        CHECK_OK(ct_arrays_stream_new(&fewer, a, 3, false, &err), &err);
        CHECK(ct_stream_set_cursor(fewer, c, &err) == CT_ERR_STATE);
        ct_stream_free(fewer);
        ct_stream *again = arrays_source(false);
        CHECK_OK(ct_stream_set_cursor(again, c, &err), &err);
        ct_stream_free(again);
    }

    // Hostile arguments, each refused naming the array and what is wrong.
    ct_tensor a[CT_BATCH_MAX_TENSORS + 1];
    arrays_tensors(a);
    check_arrays_refused(a, 0, false, "arrays: n is 0; expected 1..4 arrays (CT_BATCH_MAX_TENSORS)");
    a[3] = a[4] = a[2];
    check_arrays_refused(a, 5, true, "arrays: n is 5; expected 1..4 arrays");
    check_arrays_refused(NULL, 2, false, "arrays: the arrays pointer is NULL (n is 2)");
    arrays_tensors(a);
    a[1].data = NULL;
    check_arrays_refused(a, 3, true, "arrays: array 1 (10,4) i32 has no data (data is NULL)");
    arrays_tensors(a);
    a[2] = ct_tensor_1d(CT_DTYPE_I32, AN - 1, arr_y);
    check_arrays_refused(a, 3, false,
                         "arrays: array 2 (9) i32 has 9 items (its leading dim) but array 0 (10,3,2) f32 has 10; "
                         "every array needs the same N");
    arrays_tensors(a);
    for (int k = 0; k < 3; k++) a[k].shape[0] = 0;
    check_arrays_refused(a, 3, true, "arrays: array 0 has N = 0 items (its leading dim is 0): nothing to yield");
    arrays_tensors(a);
    a[1] = ct_tensor_make(CT_DTYPE_I32, 0, NULL, arr_t);
    check_arrays_refused(a, 2, false,
                         "arrays: array 1 has rank 0 (a scalar); each array needs a leading dim N, the number of items");
    arrays_tensors(a);
    a[0].ndim = CT_MAX_DIMS + 1;
    check_arrays_refused(a, 1, true, "arrays: array 0 has rank 7; expected 1..6 (CT_MAX_DIMS)");
    a[0].ndim = -1;
    check_arrays_refused(a, 1, true, "arrays: array 0 has rank -1; expected 1..6");
    arrays_tensors(a);
    a[0].shape[2] = -3;
    check_arrays_refused(a, 1, false, "arrays: array 0: dim 2 is -3; expected >= 1");
    arrays_tensors(a);
    a[1].dtype = CT_DTYPE_BF16;
    check_arrays_refused(a, 2, true, "arrays: array 1 is bf16 (dtype 2); expected f32 or i32");
    a[1].dtype = (ct_dtype)9;
    check_arrays_refused(a, 2, true, "arrays: array 1 is ? (dtype 9); expected f32 or i32");
    // Sizes: elements past int64, bytes past what one object can hold, and
    // arrays too large together; refused before anything is read.
    int64_t huge = INT64_C(1) << 40;
    a[0] = ct_tensor_2d(CT_DTYPE_F32, huge, huge, arr_x);
    check_arrays_refused(a, 1, true,
                         "arrays: array 0 (1099511627776,1099511627776) f32 is too large: its size overflows");
    a[0] = ct_tensor_1d(CT_DTYPE_F32, INT64_C(1) << 61, arr_x);
    check_arrays_refused(a, 1, false, "arrays: array 0 (2305843009213693952) f32 is too large: its size overflows");
    for (int k = 0; k < 3; k++) a[k] = ct_tensor_1d(CT_DTYPE_I32, INT64_C(1) << 60, arr_t);
    check_arrays_refused(a, 3, true, "arrays: the 3 arrays are too large together: their sizes overflow");
}

// ---- a Loop trained on arrays in memory -----------------------------------------------------

// 2-d points labelled [x0 * x1 > 0] (examples/first_model.c's task).
enum { LN = 96 };
static float loop_x[LN * 2];
static int32_t loop_y[LN];

static volatile sig_atomic_t loop_stop_flag;
static void loop_stop_at_5(int64_t step, void *user) {
    (void)user;
    if (step == 5) loop_stop_flag = 1;
}

// Trains in dir up to n_steps (stop: stopping after step 5 first) on arrays
// -> epochs(shuffle) -> batch -> weights, with an eval on other arrays.
// Returns the weights then the optimizer slots, concatenated (malloc'd), or
// NULL with the error in err.
static float *arrays_loop(const char *dir, int64_t n_steps, bool stop, size_t *n, char *restored, ct_error *err) {
    ct_tensor train_a[2] = {ct_tensor_2d(CT_DTYPE_F32, LN, 2, loop_x), ct_tensor_1d(CT_DTYPE_I32, LN, loop_y)};
    // The eval set: the first 32 points, mirrored (x0 -> -x0), labels flipped.
    float ex[32 * 2];
    int32_t ey[32];
    for (int i = 0; i < 32; i++) ex[2 * i] = -loop_x[2 * i], ex[2 * i + 1] = loop_x[2 * i + 1], ey[i] = !loop_y[i];
    ct_tensor eval_a[2] = {ct_tensor_2d(CT_DTYPE_F32, 32, 2, ex), ct_tensor_1d(CT_DTYPE_I32, 32, ey)};
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = 8;
    ct_stream *train = NULL, *eval = NULL;
    ct_loop *loop = NULL;
    float *out = NULL;
    if (ct_arrays_stream_new(&train, train_a, 2, false, err) || ct_epochs_stream_new(&train, train, true, 11, 0, err) ||
        ct_batch_stream_new(&train, train, &bp, err) || ct_weights_stream_new(&train, train, -1, err))
        goto done;
    // Copied: ex and ey go when this function returns, the stream stays.
    if (ct_arrays_stream_new(&eval, eval_a, 2, true, err) || ct_epochs_stream_new(&eval, eval, false, 0, 0, err) ||
        ct_batch_stream_new(&eval, eval, &bp, err) || ct_weights_stream_new(&eval, eval, -1, err))
        goto done;
    ct_layer *model = ct_mlp(2, (int[]){16, 2}, ct_relu, false, false), *loss = ct_weighted_category_cross_entropy(),
             *acc = ct_weighted_category_accuracy();
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", 0.01f};
    ct_eval_task ev = {.stream = eval, .n_metrics = 1, .n_batches = 2};
    ev.metrics[0] = acc;
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = dir;
    o.n_steps_per_checkpoint = 4;
    o.seed = 3;
    loop_stop_flag = 0;
    if (stop) {
        o.stop = &loop_stop_flag;
        o.callbacks[0] = (ct_loop_callback){.on_step_end = loop_stop_at_5};
        o.n_callbacks = 1;
    }
    ct_status st = ct_loop_new(&loop, model, &task, 1, &ev, &o, err);
    ct_layer_free(model);
    ct_layer_free(loss);
    ct_layer_free(acc);
    if (st) goto done;
    snprintf(restored, 64, "%s", ct_loop_restored_from(loop));
    if (ct_loop_run(loop, n_steps, err)) goto done;
    const ct_net *net = ct_loop_net(loop);
    size_t nw = ct_net_n_weights(net), ns = 0;
    const float *slots = ct_trainer_slots(ct_loop_trainer(loop), &ns);
    out = malloc((nw + ns) * sizeof *out);
    size_t at = 0;
    for (int i = 0; i < ct_net_weight_count(net); i++) {
        ct_tensor w = ct_net_weight(net, i);
        memcpy(out + at, w.data, ct_tensor_nbytes(&w));
        at += (size_t)ct_tensor_numel(&w);
    }
    if (ns) memcpy(out + at, slots, ns * sizeof *out);
    *n = at + ns;
    CHECK(at == nw && ct_loop_step(loop) == (stop ? 5 : n_steps));
done:
    ct_loop_free(loop);
    ct_stream_free(train);
    ct_stream_free(eval);
    return out;
}

static void test_arrays_loop(void) {
    ct_error err;
    ct_key key = ct_key_from_seed(42);
    ct_random_uniform(key, loop_x, LN * 2, -1, 1);
    for (int i = 0; i < LN; i++) loop_y[i] = loop_x[2 * i] * loop_x[2 * i + 1] > 0;
    char straight_dir[512], resumed_dir[512], restored[64];
    snprintf(straight_dir, sizeof straight_dir, "%s", tmp_path("arrays_loop_straight"));
    snprintf(resumed_dir, sizeof resumed_dir, "%s", tmp_path("arrays_loop_resumed"));
    // 12 steps straight; 5, stopped, then resumed to 12. 12 steps of 8 are
    // one epoch of 96 and the resumed run restarts in its middle.
    size_t n1 = 0, n2 = 0;
    float *straight = arrays_loop(straight_dir, 12, false, &n1, restored, &err);
    CHECK_MSG(straight, "%s", err.msg);
    float *first = arrays_loop(resumed_dir, 12, true, &n2, restored, &err);
    CHECK_MSG(first, "%s", err.msg);
    free(first);
    float *resumed = arrays_loop(resumed_dir, 12, false, &n2, restored, &err);
    CHECK_MSG(resumed, "%s", err.msg);
    CHECK_MSG(!strcmp(restored, "model_5"), "resumed from '%s', not model_5", restored);
    bool same = straight && resumed && n1 == n2 && n1 > 0 && !memcmp(straight, resumed, n1 * sizeof *straight);
    CHECK_MSG(same, "a Loop on arrays, stopped at 5 and resumed to 12, differs from 12 steps straight");
    printf("  loop on arrays: 12 steps straight vs 5 + resumed 7: weights and slots %s (%zu floats)\n",
           same ? "bitwise equal" : "DIFFER", n1);
    free(straight);
    free(resumed);
    // The same run over other data refuses the checkpoint's data cursor.
    loop_x[0] += 1.0f;
    float *other = arrays_loop(resumed_dir, 12, false, &n2, restored, &err);
    CHECK_MSG(!other && err.code == CT_ERR_STATE && strstr(err.msg, "was saved by a different stream"),
              "a resume on changed arrays: %s", other ? "taken" : err.msg);
    if (!other) printf("  loop on changed arrays: %.120s...\n", err.msg);
    free(other);
}

// Sizes at the ends of their ranges: no signed overflow (UBSan), clear errors.
static void test_size_limits(void) {
    ct_error err;
    ct_stream *s = NULL;
    // A copy task so long that 2 * length + 2 overflowed an int (and asked
    // calloc for ~2^64 bytes) is refused.
    ct_copy_task t = {10, 1 << 30, false, 1, 0};
    CHECK(ct_copy_stream_new(&s, &t, &err) == CT_ERR_ARG && s == NULL);
    CHECK_MSG(strstr(err.msg, "copy task: length is 1073741824; expected 1..2^24"), "%s", err.msg);
    // seq_len INT_MAX, shifted: chunks of 2^31 tokens (seq_len + 1 overflowed
    // an int and the error said "fewer than one example of -2147483648").
    const char *path[] = {tmp_path("limits.txt")};
    write_file(path[0], "hello world\n", 12);
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = path;
    p.n_paths = 1;
    p.seq_len = 2147483647;
    p.shifted = true;
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_FORMAT && s == NULL);
    CHECK_MSG(strstr(err.msg, "hold 12 tokens, fewer than one example of 2147483648"), "%s", err.msg);
    // A shuffle buffer over an endless stream, seeked so far that its inner
    // position (fill + steps) would pass INT64_MAX: an error naming shuffle
    // (it overflowed and the copy stage refused a negative position).
    ct_copy_task c = {9, 4, false, 1, 0};
    CHECK_OK(ct_copy_stream_new(&s, &c, &err), &err);
    CHECK_OK(ct_shuffle_stream_new(&s, s, 8, 3, &err), &err);
    CHECK(ct_stream_seek(s, INT64_MAX - 4, &err) == CT_ERR_ARG);
    CHECK_MSG(strstr(err.msg, "shuffle: cannot seek to item 9223372036854775803"), "%s", err.msg);
    CHECK_OK(ct_stream_seek(s, INT64_MAX - 8, &err), &err);
    ct_stream_free(s);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/ctrax_test_data_XXXXXX");
    if (!mkdtemp(tmpdir)) {
        perror("mkdtemp");
        return 1;
    }
    printf("copy and reverse\n");
    test_copy();
    printf("addition\n");
    test_addition();
    printf("text\n");
    test_text();
    test_collect();
    test_fingerprint_strings();
    printf("train/eval split\n");
    test_split();
    printf("token files\n");
    test_tokens();
    printf("idx\n");
    test_idx();
    test_idx_large();
    printf("epochs, shuffle buffer, truncate\n");
    test_epochs_and_shuffle();
    test_stage_settings();
    printf("batch, padding, bucketing\n");
    test_batch();
    printf("loss weights\n");
    test_weights();
    printf("resume\n");
    test_resume();
    printf("prefetch\n");
    test_prefetch();
    printf("arrays in memory\n");
    test_arrays();
    test_arrays_loop();
    printf("size limits\n");
    test_size_limits();
    printf("Debian's fortunes and Fashion-MNIST\n");
    test_real_files();
    nftw(tmpdir, rm_entry, 16, FTW_DEPTH | FTW_PHYS);
    return check_summary("test_data");
}
