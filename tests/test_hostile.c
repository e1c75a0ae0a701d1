// Hostile files (issue 10): each input an attacker used against the readers
// gets a clear error that names the file (and the key, field or tensor), and
// nothing crashes, allocates what the file does not hold, reads forever or
// writes over something that is not a regular file.
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "check.h"
#include "core/fs.h"
#include "core/json.h"
#include "ctrax/data/stream.h"
#include "ctrax/optim/optimizer.h"
#include "optim/internal.h"
#include "ctrax/train/checkpoint.h"
#include "scratch.h"

static void write_raw(const char *path, const void *data, size_t n) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    CHECK(fwrite(data, 1, n, f) == n);
    fclose(f);
}

// A safetensors file: the header length, the JSON header padded with spaces
// to a multiple of 8 bytes, then data_bytes zero bytes.
static void write_safetensors(const char *path, const char *json, size_t data_bytes) {
    size_t n = strlen(json), padded = (n + 7) / 8 * 8;
    unsigned char *f = calloc(1, 8 + padded + data_bytes);
    uint64_t header = padded;
    memcpy(f, &header, 8);
    memset(f + 8, ' ', padded);
    memcpy(f + 8, json, n);
    write_raw(path, f, 8 + padded + data_bytes);
    free(f);
}

// a/b into buf (a test path: never too long, but the compiler cannot know).
static void pjoin(char *buf, size_t cap, const char *a, const char *b) {
    if ((size_t)snprintf(buf, cap, "%s/%s", a, b) >= cap) abort();
}

// The message holds every one of the (up to 3) strings.
static void expect_msg(const ct_error *err, const char *a, const char *b, const char *c) {
    const char *must[3] = {a, b, c};
    for (int i = 0; i < 3; i++)
        if (must[i]) CHECK_MSG(strstr(err->msg, must[i]) != NULL, "message lacks \"%s\": %s", must[i], err->msg);
    printf("  error as expected: %s\n", err->msg);
}

// ---- the JSON parser ---------------------------------------------------------------

static void expect_json_fails(const char *text, const char *must1, const char *must2) {
    ct_error err = {0};
    cJSON *j = ct_json_parse(text, strlen(text), "some/file.json", &err);
    CHECK_MSG(j == NULL, "parsed: %s", text);
    cJSON_Delete(j);
    CHECK(err.code == CT_ERR_FORMAT);
    expect_msg(&err, "some/file.json", must1, must2);
}

static void test_json(void) {
    ct_error err = {0};
    const char *good = "{\"a\": {\"x\": 1, \"y\": [1, {\"x\": 2}]}, \"b\": \"a\"}  \n";
    cJSON *j = ct_json_parse(good, strlen(good), "good.json", &err);
    CHECK_MSG(j != NULL, "%s", err.msg);
    CHECK(cJSON_GetObjectItemCaseSensitive(cJSON_GetObjectItemCaseSensitive(j, "a"), "x")->valueint == 1);
    cJSON_Delete(j);
    // Not NUL-terminated: only len bytes are looked at.
    char buf[8] = {'[', '1', ']', 'X', 'X', 'X', 'X', 'X'};
    j = ct_json_parse(buf, 3, "buf", &err);
    CHECK_MSG(j != NULL && cJSON_IsArray(j), "%s", err.msg);
    cJSON_Delete(j);

    // The same key twice: at the top, nested in an object, in an array.
    expect_json_fails("{\"__metadata__\":{\"a\":\"b\"},\"__metadata__\":{\"c\":\"d\"}}", "'__metadata__' appears twice",
                      "top-level");
    expect_json_fails("{\"optimizer\": {\"params\": {\"b1\": 0.9, \"b2\": 0.99, \"b1\": 0.5}}}", "'b1' appears twice",
                      "optimizer.params");
    expect_json_fails("{\"history\": [[1], {\"k\": 1, \"k\": 2}]}", "'k' appears twice", "history[1]");
    // Many keys, the duplicate far apart (the check sorts; it must still find it).
    {
        size_t cap = 200000, o = 0;
        char *big = malloc(cap);
        o += (size_t)snprintf(big + o, cap - o, "{\"dup\": 0");
        for (int i = 0; i < 5000; i++) o += (size_t)snprintf(big + o, cap - o, ", \"k%d\": %d", i, i);
        o += (size_t)snprintf(big + o, cap - o, ", \"dup\": 1}");
        expect_json_fails(big, "'dup' appears twice", NULL);
        free(big);
    }
    // A NUL in a string, escaped or raw: cJSON's strings end at it, so
    // "a\u0000b" would read as the key "a" (two such keys as one).
    expect_json_fails("{\"a\\u0000b\": 1, \"a\\u0000c\": 2}", "key at line 1, column 2", "NUL");
    expect_json_fails("{\"x\": 1,\n \"w\": {\"dtype\": \"F32\\u0000junk\"}}", "string value at line 2, column 17", "NUL");
    {
        const char raw[] = "{\"a\0b\": 1}";
        ct_error e = {0};
        CHECK(ct_json_parse(raw, sizeof raw - 1, "raw.json", &e) == NULL);
        CHECK_MSG(strstr(e.msg, "raw.json: the key at line 1, column 2 holds a NUL"), "%s", e.msg);
    }
    // An escaped backslash before "u0000" is no NUL.
    const char *bs = "{\"a\\\\u0000\": \"\\\\u0000\"}";
    j = ct_json_parse(bs, strlen(bs), "bs.json", &err);
    CHECK_MSG(j != NULL && cJSON_GetObjectItemCaseSensitive(j, "a\\u0000") != NULL, "%s", err.msg);
    cJSON_Delete(j);
    // Other \u escapes are no NUL, "\u0000" alone is: \u0041 and \u00e9 (a
    // key and a value) parse, \u0001 too.
    const char *esc = "{\"a\\u0041\": \"\\u00e9\\u0001\"}";
    j = ct_json_parse(esc, strlen(esc), "esc.json", &err);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, "aA");
    CHECK_MSG(cJSON_IsString(v) && !strcmp(v->valuestring, "\xc3\xa9\x01"), "%s", j ? "key or value wrong" : err.msg);
    cJSON_Delete(j);
    // Whitespace (of every kind JSON allows) between a key and its ':' still
    // makes it a key.
    expect_json_fails("{\"k\\u0000\" \t\r\n : 1}", "the key at line 1, column 2", "NUL");
    // Not JSON, and JSON followed by more: where is said.
    expect_json_fails("{\"a\": 1,\n \"b\": }", "not valid JSON", "line 2");
    expect_json_fails("{\"a\": 1} {\"b\": 2}", "more after the JSON value", NULL);
    expect_json_fails("", "not valid JSON", NULL);
    CHECK(ct_json_parse("{\"a\":1,\"a\":2}", 13, "x", NULL) == NULL);  // a NULL err is fine
}

// ---- safetensors: the 64-byte file that overflowed __metadata__ --------------------------

static void test_safetensors_duplicate_metadata(void) {
    const char *path = tmp_path("dup_meta.safetensors");
    // The JSON is 51 bytes; spaces pad it to the 0x38 the report gave.
    const char *json = "{\"__metadata__\":{\"a\":\"b\"},\"__metadata__\":{\"c\":\"d\"}}     ";
    unsigned char file[64];
    uint64_t hlen = strlen(json);
    CHECK(hlen == 0x38 && 8 + hlen == sizeof file);
    memcpy(file, &hlen, 8);  // little-endian host (safetensors.c asserts it)
    memcpy(file + 8, json, hlen);
    write_raw(path, file, sizeof file);
    ct_safetensors *st = NULL;
    ct_error err = {0};
    CHECK(ct_safetensors_open(&st, path, &err) == CT_ERR_FORMAT);
    CHECK(st == NULL);
    expect_msg(&err, path, "'__metadata__' appears twice", NULL);
    ct_safetensors_close(st);

    // A tensor name twice with different shapes: refused as well (the
    // lookups and the layout check must see the same tensor).
    const char *j2 = "{\"w\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                     "\"w\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    write_safetensors(path, j2, 8);
    CHECK(ct_safetensors_open(&st, path, &err) == CT_ERR_FORMAT);
    expect_msg(&err, path, "'w' appears twice", NULL);
    ct_safetensors_close(st);

    // A tensor name with an escaped NUL: cJSON would read "w\u0000x" as "w".
    const char *j3 = "{\"w\\u0000x\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}";
    write_safetensors(path, j3, 4);
    CHECK(ct_safetensors_open(&st, path, &err) == CT_ERR_FORMAT);
    CHECK(st == NULL);
    expect_msg(&err, path, "the key at line 1, column 2 holds a NUL", NULL);
    ct_safetensors_close(st);
}

// ---- the optimizer part of state.json ---------------------------------------------------

static void expect_restore_fails(ct_optimizer *o, const char *json, const char *field) {
    cJSON *j = cJSON_Parse(json);
    CHECK(j != NULL);
    float lr_before = 0, lr_after = 1;
    ct_optimizer_get_param(o, "learning_rate", &lr_before, NULL);
    ct_error err = {0};
    CHECK_MSG(ct_optimizer_check_json(o, j, "run/model_2/state.json", true, &err) != CT_OK, "accepted: %s", json);
    expect_msg(&err, "run/model_2/state.json", field, NULL);
    // o keeps its values.
    ct_optimizer_get_param(o, "learning_rate", &lr_after, NULL);
    CHECK(lr_before == lr_after);
    cJSON_Delete(j);
}

static void test_optimizer_state(void) {
    ct_optimizer *o = ct_adam_new(ct_adam_default_params());
    // A member of an array has no name: find_param got NULL and crashed in strcmp.
    ct_error err = {0};
    CHECK(ct_optimizer_set_param(o, NULL, 1.0f, &err) == CT_ERR_ARG);
    expect_msg(&err, "without a name", NULL, NULL);
    float v;
    CHECK(ct_optimizer_get_param(o, NULL, &v, &err) == CT_ERR_ARG);

    expect_restore_fails(o, "{\"name\": \"Adam\", \"params\": [1]}", "optimizer.params");
    expect_restore_fails(o, "{\"name\": \"Adam\", \"params\": {\"learning_rate\": 0.5, \"b1\": \"x\"}}",
                         "optimizer.params.b1");
    expect_restore_fails(o, "{\"name\": \"Adam\", \"params\": {\"learning_rate\": 0.5, \"b1\": 1e300}}",
                         "optimizer.params.b1");
    expect_restore_fails(o, "{\"name\": \"Adam\", \"params\": {\"learning_rate\": 0.5, \"b1\": null}}",
                         "optimizer.params.b1");
    expect_restore_fails(o, "{\"name\": \"Adam\", \"params\": {\"learning_rate\": 0.5, \"nope\": 1}}",
                         "optimizer.params.nope");
    expect_restore_fails(o, "{\"name\": \"SGD\", \"params\": {}}", "optimizer.name");
    expect_restore_fails(o, "{\"name\": 3, \"params\": {}}", "optimizer.name");
    expect_restore_fails(o, "{\"params\": {}}", "optimizer.name");
    expect_restore_fails(o, "[1]", "\"optimizer\"");
    // Values are checked as set_param checks them: in range, and a fixed one
    // (Adafactor's factored: it decided the slots' layout) the run's own.
    expect_restore_fails(o, "{\"name\": \"Adam\", \"params\": {\"b1\": 1.5}}", "optimizer.params.b1");
    ct_optimizer *af = ct_adafactor_new(ct_adafactor_default_params());
    expect_restore_fails(af, "{\"name\": \"Adafactor\", \"params\": {\"factored\": 0}}",
                         "optimizer.params.factored");
    ct_optimizer_free(af);

    // A good one passes, and o keeps its own values (the run's config, as
    // Trax: a resume may change them).
    cJSON *j = cJSON_Parse("{\"name\": \"Adam\", \"params\": {\"learning_rate\": 0.25, \"b1\": 0.5}}");
    CHECK_OK(ct_optimizer_check_json(o, j, "state.json", true, &err), &err);
    CHECK(ct_optimizer_get_param(o, "learning_rate", &v, NULL) == CT_OK && v == ct_adam_default_params().learning_rate);
    CHECK(ct_optimizer_get_param(o, "b1", &v, NULL) == CT_OK && v == ct_adam_default_params().b1);
    cJSON_Delete(j);
    ct_optimizer_free(o);

    // SM3's slot layout follows momentum (zero or not) and
    // second_moment_averaging (1 or not), which a resume may change: a
    // checkpoint's value that made the other layout is refused, naming it
    // (SM3(0.9, 1) and SM3(0, 0.9) have slots of the same size for some
    // shapes, so a size check alone would read momentum as accumulators).
    o = ct_sm3_new(ct_sm3_default_params());  // momentum 0.9, averaging 1
    expect_restore_fails(o, "{\"name\": \"SM3\", \"params\": {\"momentum\": 0}}", "optimizer.params.momentum = 0");
    expect_restore_fails(o, "{\"name\": \"SM3\", \"params\": {\"second_moment_averaging\": 0.9}}",
                         "gave SM3 grafting accumulators");
    j = cJSON_Parse("{\"name\": \"SM3\", \"params\": {\"momentum\": 0.5, \"second_moment_averaging\": 1}}");
    CHECK_OK(ct_optimizer_check_json(o, j, "state.json", false, &err), &err);  // same layout: fine
    cJSON_Delete(j);

    // The layout an SM3 was made with stays when its values change later
    // (as Trax's, whose constructor fixes it): the checkpoint says which
    // (slot_layout), and that is what a resume compares, not the values.
    // A run made as SM3(0.9, 1) that set averaging 0.9 resumes as SM3(0.9, 1);
    // SM3(0, 0.9), whose slots have the same size for rank 1, is refused.
    ct_optimizer *changed = ct_sm3_new(ct_sm3_default_params());
    CHECK_OK(ct_optimizer_set_param(changed, "second_moment_averaging", 0.9f, &err), &err);
    const char *layout = ct_optimizer_slot_layout(changed);
    CHECK(layout && !strcmp(layout, ct_optimizer_slot_layout(o)));
    char text[512];
    snprintf(text, sizeof text,
             "{\"name\": \"SM3\", \"slot_layout\": \"%s\", \"params\": {\"momentum\": 0.9, "
             "\"second_moment_averaging\": 0.9}}",
             layout ? layout : "");
    j = cJSON_Parse(text);
    CHECK_OK(ct_optimizer_check_json(o, j, "state.json", true, &err), &err);
    cJSON_Delete(j);
    ct_sm3_params other = ct_sm3_default_params();
    other.momentum = 0.0f, other.second_moment_averaging = 0.9f;
    ct_optimizer *o2 = ct_sm3_new(other);
    expect_restore_fails(o2, text, "optimizer.slot_layout");
    expect_restore_fails(o2, "{\"name\": \"SM3\", \"slot_layout\": 7, \"params\": {}}", "optimizer.slot_layout");
    ct_optimizer_free(o2);
    ct_optimizer_free(changed);
    ct_optimizer_free(o);
    // An optimizer whose layout follows no value has none to compare.
    o = ct_adam_new(ct_adam_default_params());
    CHECK(ct_optimizer_slot_layout(o) == NULL);
    expect_restore_fails(o, "{\"name\": \"Adam\", \"slot_layout\": \"m, v\", \"params\": {}}",
                         "optimizer.slot_layout");
    ct_optimizer_free(o);
}

// ---- IDX: sizes from the header against the file ------------------------------------------

static void put_be32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24);
    p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8);
    p[3] = (unsigned char)v;
}

static void test_idx_huge_header(void) {
    // 200 x 65536 x 65536 images (800 GB) declared by 16 bytes of file.
    unsigned char im[16], lb[8 + 2];
    put_be32(im, 0x803);
    put_be32(im + 4, 200);
    put_be32(im + 8, 65536);
    put_be32(im + 12, 65536);
    put_be32(lb, 0x801);
    put_be32(lb + 4, 2);
    lb[8] = lb[9] = 0;
    write_raw(tmp_path("huge-images"), im, sizeof im);
    write_raw(tmp_path("labels"), lb, sizeof lb);
    ct_idx_params p = ct_idx_default_params();
    p.images_path = tmp_path("huge-images");
    p.labels_path = tmp_path("labels");
    ct_stream *s = NULL;
    ct_error err = {0};
    CHECK(ct_idx_stream_new(&s, &p, &err) == CT_ERR_FORMAT);
    CHECK(s == NULL);
    expect_msg(&err, "huge-images", "200 images of 65536x65536", "truncated");

    // The same header gzip-compressed: more than deflate can hold in a file
    // that small.
    gzFile gz = gzopen(tmp_path("huge-images.gz"), "wb");
    CHECK(gz != NULL);
    if (gz) {
        CHECK(gzwrite(gz, im, sizeof im) == (int)sizeof im);
        gzclose(gz);
    }
    p.images_path = tmp_path("huge-images.gz");
    CHECK(ct_idx_stream_new(&s, &p, &err) == CT_ERR_FORMAT);
    expect_msg(&err, "huge-images.gz", "200 images of 65536x65536", "gzip");

    // A size deflate could hold but the data does not: read as far as it
    // goes (4 x 2048 x 2048 = 16 MiB declared, 20,000 incompressible bytes).
    put_be32(im + 4, 4);
    put_be32(im + 8, 2048);
    put_be32(im + 12, 2048);
    gz = gzopen(tmp_path("short-images.gz"), "wb");
    if (gz) {
        gzwrite(gz, im, sizeof im);
        static unsigned char noise[20000];
        uint32_t x = 12345;
        for (size_t i = 0; i < sizeof noise; i++) {
            x = x * 1664525u + 1013904223u;
            noise[i] = (unsigned char)(x >> 24);
        }
        gzwrite(gz, noise, sizeof noise);
        gzclose(gz);
    }
    p.images_path = tmp_path("short-images.gz");
    CHECK(ct_idx_stream_new(&s, &p, &err) == CT_ERR_FORMAT);
    expect_msg(&err, "short-images.gz", "truncated", NULL);

    // Images through a link to /dev/zero: refused, not read.
    unlink(tmp_path("zero-images"));
    CHECK(symlink("/dev/zero", tmp_path("zero-images")) == 0);
    p.images_path = tmp_path("zero-images");
    CHECK(ct_idx_stream_new(&s, &p, &err) == CT_ERR_IO);
    expect_msg(&err, "zero-images", "not a regular file", NULL);
}

// ---- whole-file reads and atomic writes -----------------------------------------------------

static void test_fs_read(void) {
    char *data = NULL;
    size_t n = 0;
    ct_error err = {0};
    // A link to /dev/zero: read until memory ran out.
    CHECK(symlink("/dev/zero", tmp_path("zero.json")) == 0);
    CHECK(ct_fs_read(tmp_path("zero.json"), &data, &n, &err) == CT_ERR_IO);
    CHECK(data == NULL);
    expect_msg(&err, tmp_path("zero.json"), "not a regular file", NULL);
    // A fifo nobody writes to: must not block.
    CHECK(mkfifo(tmp_path("fifo.json"), 0600) == 0);
    CHECK(ct_fs_read(tmp_path("fifo.json"), &data, &n, &err) == CT_ERR_IO);
    expect_msg(&err, tmp_path("fifo.json"), "not a regular file", NULL);
    // A directory.
    CHECK(ct_fs_read(g_tmp, &data, &n, &err) == CT_ERR_IO);
    expect_msg(&err, g_tmp, "not a regular file", NULL);
    // More than the kind of file may hold.
    write_raw(tmp_path("big.txt"), "0123456789", 10);
    CHECK(ct_fs_read_max(tmp_path("big.txt"), 9, &data, &n, &err) == CT_ERR_FORMAT);
    expect_msg(&err, tmp_path("big.txt"), "10 bytes", "9");
    CHECK_OK(ct_fs_read_max(tmp_path("big.txt"), 10, &data, &n, &err), &err);
    CHECK(n == 10 && data && !strcmp(data, "0123456789"));
    free(data);
}

static void test_fs_write_atomic(void) {
    ct_error err = {0};
    struct stat sb;
    // A link to /dev/null (as root the rename replaced /dev/null itself
    // when the target was /dev/null): refused, the link stays a link.
    CHECK(symlink("/dev/null", tmp_path("null.svg")) == 0);
    CHECK(ct_fs_write_atomic(tmp_path("null.svg"), "x", 1, &err) == CT_ERR_IO);
    expect_msg(&err, tmp_path("null.svg"), "not a regular file", "device");
    CHECK(lstat(tmp_path("null.svg"), &sb) == 0 && S_ISLNK(sb.st_mode));
    CHECK(stat("/dev/null", &sb) == 0 && S_ISCHR(sb.st_mode));
    // A fifo and a directory.
    CHECK(mkfifo(tmp_path("out.fifo"), 0600) == 0);
    CHECK(ct_fs_write_atomic(tmp_path("out.fifo"), "x", 1, &err) == CT_ERR_IO);
    expect_msg(&err, tmp_path("out.fifo"), "fifo", NULL);
    CHECK(lstat(tmp_path("out.fifo"), &sb) == 0 && S_ISFIFO(sb.st_mode));
    CHECK(mkdir(tmp_path("out.dir"), 0755) == 0);
    CHECK(ct_fs_write_atomic(tmp_path("out.dir"), "x", 1, &err) == CT_ERR_IO);
    expect_msg(&err, tmp_path("out.dir"), "directory", NULL);
    CHECK(lstat(tmp_path("out.dir"), &sb) == 0 && S_ISDIR(sb.st_mode));
    // No temporary file left behind by the refusals.
    char tmp_name[4096];
    CHECK_OK(ct_fs_temp_name(tmp_name, sizeof tmp_name, tmp_path("null.svg"), &err), &err);
    CHECK(access(tmp_name, F_OK) != 0);

    // A regular file is still replaced by a new file renamed over it (a
    // reader holding the old one keeps its bytes), and a new path is made.
    write_raw(tmp_path("out.txt"), "old", 3);
    struct stat before;
    CHECK(stat(tmp_path("out.txt"), &before) == 0);
    int fd = open(tmp_path("out.txt"), O_RDONLY);
    CHECK_OK(ct_fs_write_atomic(tmp_path("out.txt"), "new!", 4, &err), &err);
    char buf[8] = {0};
    CHECK(fd >= 0 && read(fd, buf, sizeof buf) == 3 && !memcmp(buf, "old", 3));
    if (fd >= 0) close(fd);
    CHECK(stat(tmp_path("out.txt"), &sb) == 0 && sb.st_size == 4 && sb.st_ino != before.st_ino);
    CHECK_OK(ct_fs_write_atomic(tmp_path("new.txt"), "n", 1, &err), &err);
    CHECK(stat(tmp_path("new.txt"), &sb) == 0 && S_ISREG(sb.st_mode) && sb.st_size == 1);
    // A leftover temporary name planted as a link is not written through.
    char tmp[4096];
    CHECK_OK(ct_fs_temp_name(tmp, sizeof tmp, tmp_path("planted.txt"), &err), &err);
    write_raw(tmp_path("victim"), "keep", 4);
    CHECK(symlink(tmp_path("victim"), tmp) == 0);
    CHECK_OK(ct_fs_write_atomic(tmp_path("planted.txt"), "data", 4, &err), &err);
    char *v = NULL;
    CHECK_OK(ct_fs_read(tmp_path("victim"), &v, NULL, &err), &err);
    CHECK(v && !strcmp(v, "keep"));
    free(v);
}

// ---- checkpoint files that are not what the manifest says -------------------------------

static void make_checkpoint(const char *dir, const char *name, const char *state) {
    float w[4] = {1, 2, 3, 4};
    int64_t shape[1] = {4};
    ct_named_tensor t = {"w", ct_tensor_make(CT_DTYPE_F32, 1, shape, w)};
    ct_checkpoint_options co = ct_checkpoint_default_options();
    co.step = 2;
    ct_checkpoint_writer *cw;
    ct_error err = {0};
    CHECK_OK(ct_checkpoint_writer_begin(&cw, dir, name, &co, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(cw, "weights.safetensors", &t, 1, NULL, 0, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_bytes(cw, "config.gin", "a.b = 1\n", 8, &err), &err);
    CHECK_OK(ct_checkpoint_writer_set_state(cw, state, &err), &err);
    CHECK_OK(ct_checkpoint_writer_commit(cw, &err), &err);
}

static void expect_ckpt_fails(const char *dir, const char *name, const char *must1, const char *must2) {
    ct_checkpoint *c = NULL;
    ct_error err = {0};
    CHECK(ct_checkpoint_open(&c, dir, name, &err) != CT_OK);
    CHECK(c == NULL);
    expect_msg(&err, must1, must2, NULL);
    ct_checkpoint_close(c);
}

// The manifest's bytes and crc32 of file made to match what is there now
// (so the reader gets past the checksums to the content).
static void fix_manifest(const char *ckpt_dir, const char *file) {
    char path[2048], mpath[2048];
    pjoin(path, sizeof path, ckpt_dir, file);
    pjoin(mpath, sizeof mpath, ckpt_dir, "manifest.json");
    char *data = NULL, *mtext = NULL;
    size_t n = 0;
    ct_error err;
    CHECK_OK(ct_fs_read(path, &data, &n, &err), &err);
    CHECK_OK(ct_fs_read(mpath, &mtext, NULL, &err), &err);
    cJSON *m = cJSON_Parse(mtext);
    cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(m, "files")) {
        if (strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, file)) continue;
        char hex[9];
        snprintf(hex, sizeof hex, "%08lx", crc32(crc32(0L, Z_NULL, 0), (const Bytef *)data, (uInt)n));
        cJSON_ReplaceItemInObjectCaseSensitive(f, "bytes", cJSON_CreateNumber((double)n));
        cJSON_ReplaceItemInObjectCaseSensitive(f, "crc32", cJSON_CreateString(hex));
    }
    char *out = cJSON_Print(m);
    write_raw(mpath, out, strlen(out));
    cJSON_free(out);
    cJSON_Delete(m);
    free(mtext);
    free(data);
}

static void test_checkpoint_files(void) {
    const char *run = tmp_path("run");
    char run_dir[2048], ck[2048], p[2048];
    snprintf(run_dir, sizeof run_dir, "%s", run);
    const char *state = "{\"format\": \"x\", \"optimizer\": {\"name\": \"Adam\", \"params\": {\"b1\": 0.9}}}";

    // state.json with a key twice (checksums consistent): refused at open,
    // naming the file and the key, so no reader sees one value or the other.
    make_checkpoint(run_dir, "dup_state", state);
    pjoin(ck, sizeof ck, run_dir, "dup_state");
    pjoin(p, sizeof p, ck, "state.json");
    const char *dup = "{\"format\": \"x\", \"optimizer\": {\"name\": \"Adam\", \"params\": {\"b1\": 0.9, \"b1\": 7}}}";
    write_raw(p, dup, strlen(dup));
    fix_manifest(ck, "state.json");
    expect_ckpt_fails(run_dir, "dup_state", "dup_state/state.json", "'b1' appears twice");

    // state.json, config.gin and manifest.json as links to /dev/zero: refused
    // by name, without reading.
    const char *files[3] = {"state.json", "config.gin", "manifest.json"};
    for (int i = 0; i < 3; i++) {
        char name[32];
        snprintf(name, sizeof name, "zero_%d", i);
        make_checkpoint(run_dir, name, state);
        pjoin(ck, sizeof ck, run_dir, name);
        pjoin(p, sizeof p, ck, files[i]);
        CHECK(unlink(p) == 0 && symlink("/dev/zero", p) == 0);
        char want[256];
        pjoin(want, sizeof want, name, files[i]);
        expect_ckpt_fails(run_dir, name, want, i == 2 ? "not a regular file" : NULL);
    }
    // A manifest that declares a file far larger than it is: the size is
    // compared first, nothing of that size is allocated.
    make_checkpoint(run_dir, "big_state", state);
    pjoin(ck, sizeof ck, run_dir, "big_state");
    pjoin(p, sizeof p, ck, "manifest.json");
    char *mtext = NULL;
    ct_error err;
    CHECK_OK(ct_fs_read(p, &mtext, NULL, &err), &err);
    cJSON *m = cJSON_Parse(mtext);
    cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(m, "files")) {
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, "state.json"))
            cJSON_ReplaceItemInObjectCaseSensitive(f, "bytes", cJSON_CreateNumber(4e15));
    }
    char *out = cJSON_Print(m);
    write_raw(p, out, strlen(out));
    cJSON_free(out);
    cJSON_Delete(m);
    free(mtext);
    expect_ckpt_fails(run_dir, "big_state", "big_state/state.json", "truncated");

    // The pointer as a link to /dev/zero: the newest checkpoint that opens is
    // used, with the pointer's problem said in the log (not read forever).
    pjoin(p, sizeof p, run_dir, "checkpoint");
    unlink(p);
    CHECK(symlink("/dev/zero", p) == 0);
    char latest[CT_CHECKPOINT_NAME_MAX];
    ct_status s = ct_checkpoint_find_latest(run_dir, latest, sizeof latest, &err);
    CHECK(s != CT_OK);  // every checkpoint here is broken
    expect_msg(&err, "checkpoint: not a regular file", NULL, NULL);
}

// ---- text and token files ---------------------------------------------------------------

static void test_corpus_files(void) {
    ct_corpus_params p = ct_corpus_default_params();
    const char *paths[1] = {"/dev/zero"};
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = 4;
    ct_stream *s = NULL;
    ct_error err = {0};
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_IO);
    CHECK(s == NULL);
    expect_msg(&err, "/dev/zero", "not a regular file", NULL);
    CHECK(ct_token_stream_new(&s, &p, &err) == CT_ERR_IO);
    expect_msg(&err, "/dev/zero", "not a regular file", NULL);
    // A fifo named directly: refused without blocking on it.
    paths[0] = tmp_path("fifo.txt");
    CHECK(mkfifo(paths[0], 0600) == 0);
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_IO);
    expect_msg(&err, "fifo.txt", "not a regular file", NULL);
    // A link back to a directory above is a cycle walked once; a link to
    // itself cannot be opened, and the error names it.
    CHECK(mkdir(tmp_path("cycle"), 0700) == 0 && mkdir(tmp_path("cycle/sub"), 0700) == 0);
    write_raw(tmp_path("cycle/sub/a.txt"), "0123456789", 10);
    CHECK(symlink("..", tmp_path("cycle/sub/up")) == 0);
    char cycle[2048];
    snprintf(cycle, sizeof cycle, "%s", tmp_path("cycle"));
    paths[0] = cycle;
    CHECK_OK(ct_text_stream_new(&s, &p, &err), &err);
    CHECK(s && ct_corpus_n_files(s) == 1 && ct_stream_length(s) == 2);
    ct_stream_free(s);
    CHECK(symlink("self", tmp_path("cycle/sub/self")) == 0);
    CHECK(ct_text_stream_new(&s, &p, &err) == CT_ERR_IO && s == NULL);
    expect_msg(&err, "cycle/sub/self", "cannot open", "symbolic links");
}

// The mappings this process holds (lines of /proc/self/maps), -1 if unknown.
static int count_mappings(void) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    int n = 0, c;
    while ((c = fgetc(f)) != EOF) n += c == '\n';
    fclose(f);
    return n;
}

// A directory of many one-byte files. Each file mapped on its own, 10^5 of
// them passed the kernel's limit on mappings (vm.max_map_count, 65530 by
// default) and failed at file 65,497 with "cannot map 2 bytes: Cannot
// allocate memory". 2,000 files show it without making 10^5: small files
// are read, so opening the corpus adds (almost) no mappings, and the files
// make one corpus in name order.
static void test_corpus_many_files(void) {
    enum { N = 2000 };
    char dir[2048];
    snprintf(dir, sizeof dir, "%s", tmp_path("many"));
    CHECK(mkdir(dir, 0700) == 0);
    for (int i = 0; i < N; i++) {
        char name[2100];
        snprintf(name, sizeof name, "%s/f%06d", dir, i);
        char c = (char)('a' + i % 26);
        write_raw(name, &c, 1);
    }
    const char *paths[1] = {dir};
    ct_corpus_params p = ct_corpus_default_params();
    p.paths = paths;
    p.n_paths = 1;
    p.seq_len = 4;
    ct_stream *s = NULL;
    ct_error err = {0};
    int before = count_mappings();
    ct_status st = ct_text_stream_new(&s, &p, &err);
    int added = count_mappings() - before;
    CHECK_MSG(st == CT_OK, "%s", err.msg);
    if (st != CT_OK) return;
    CHECK_MSG(before < 0 || added < 100, "a corpus of %d small files added %d mappings", N, added);
    CHECK(ct_corpus_n_files(s) == N && ct_stream_length(s) == N / 4);
    // Chunk k holds files 4k..4k+3: bytes 'a' + (4k + i) % 26.
    int64_t k = 449;
    CHECK_OK(ct_stream_seek(s, k, &err), &err);
    ct_batch b;
    CHECK_OK(ct_stream_next(s, &b, &err), &err);
    int ok = b.n == 3;
    for (int i = 0; ok && i < 4; i++) ok = ct_i32(&b.t[0])[i] == 'a' + (4 * k + i) % 26;
    CHECK_MSG(ok, "chunk %lld of %d one-byte files is wrong", (long long)k, N);
    printf("  %d one-byte files: %lld chunks of 4, %d mappings added\n", N, (long long)ct_stream_length(s), added);
    ct_stream_free(s);
}

int main(void) {
    scratch_init("hostile");
    test_json();
    test_safetensors_duplicate_metadata();
    test_optimizer_state();
    test_idx_huge_header();
    test_fs_read();
    test_fs_write_atomic();
    test_checkpoint_files();
    test_corpus_files();
    test_corpus_many_files();
    int rc = check_summary("test_hostile");
    if (rc == 0) {
        char cmd[2048];
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_tmp);
        if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_tmp);
    }
    return rc;
}
