// The order of a checkpoint write's durable steps, seen through the calls
// themselves (linked with --wrap=fsync,rename,renameat2,remove,write): every file
// is synced before it is renamed into place, a directory after an entry of
// it changed and before anything depends on that, and an old copy is
// removed only once its replacement is durable. Also the replacement
// without RENAME_EXCHANGE (NFS and other file systems refuse it), and a
// writer killed between its two renames: the previous checkpoint of that
// name survives. And a tensor the disk gave back different is an error.
// The summaries (metrics.jsonl, TensorBoard event files) fsync each flush.
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check.h"
#include "scratch.h"
#include "core/fs.h"
#include "ctrax/core/log.h"
#include "ctrax/train/checkpoint.h"
#include "ctrax/train/summary.h"
#include "ctrax/train/tensorboard.h"

// ---- the wrapped calls -----------------------------------------------------------------

typedef enum { EV_FSYNC, EV_RENAME, EV_EXCHANGE, EV_REMOVE } ev_kind;
typedef struct event {
    ev_kind kind;
    char a[1024], b[1024];  // fsync, remove: a; rename, exchange: a to b
} event;

static event g_ev[4096];
static int g_n_ev;
static bool g_no_exchange;      // renameat2(RENAME_EXCHANGE) fails with EINVAL, as on NFS
static const char *g_die_at;    // _exit(9) instead of the g_die_after-th rename onto this path
static int g_die_after;
static const char *g_fail_fsync;  // fsync of this path fails with EIO
static size_t g_corrupt_size;   // a write of exactly this many bytes has its last byte's low bit flipped
static int g_eintr_writes;      // this many writes fail with EINTR before any data moves
static int g_short_writes;      // this many writes move at most 2 bytes
static bool g_zero_writes;      // every write returns 0 (writes nothing, no error)

int __real_fsync(int fd);
int __real_rename(const char *from, const char *to);
int __real_renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags);
int __real_remove(const char *path);
ssize_t __real_write(int fd, const void *buf, size_t n);

static event *add_event(ev_kind kind, const char *a, const char *b) {
    if (g_n_ev == (int)(sizeof g_ev / sizeof *g_ev)) return NULL;
    event *e = &g_ev[g_n_ev++];
    e->kind = kind;
    snprintf(e->a, sizeof e->a, "%s", a);
    snprintf(e->b, sizeof e->b, "%s", b ? b : "");
    return e;
}

int __wrap_fsync(int fd) {
    char link[64], path[1024];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, path, sizeof path - 1);
    path[n > 0 ? n : 0] = '\0';
    add_event(EV_FSYNC, path, NULL);
    if (g_fail_fsync && !strcmp(path, g_fail_fsync)) {
        errno = EIO;
        return -1;
    }
    return __real_fsync(fd);
}

int __wrap_rename(const char *from, const char *to) {
    if (g_die_at && !strcmp(to, g_die_at) && --g_die_after == 0) _exit(9);
    add_event(EV_RENAME, from, to);
    return __real_rename(from, to);
}

int __wrap_renameat2(int fd1, const char *from, int fd2, const char *to, unsigned flags) {
    if (g_no_exchange && (flags & RENAME_EXCHANGE)) {
        errno = EINVAL;
        return -1;
    }
    add_event(EV_EXCHANGE, from, to);
    return __real_renameat2(fd1, from, fd2, to, flags);
}

ssize_t __wrap_write(int fd, const void *buf, size_t n) {
    if (n > 0 && g_eintr_writes > 0) {
        g_eintr_writes--;
        errno = EINTR;
        return -1;
    }
    if (n > 0 && g_zero_writes) return 0;
    if (n > 2 && g_short_writes > 0) {
        g_short_writes--;
        return __real_write(fd, buf, 2);
    }
    if (n == 0 || n != g_corrupt_size) return __real_write(fd, buf, n);
    unsigned char copy[256];
    if (n > sizeof copy) return __real_write(fd, buf, n);
    memcpy(copy, buf, n);
    copy[n - 1] ^= 1;
    return __real_write(fd, copy, n);
}

int __wrap_remove(const char *path) {
    add_event(EV_REMOVE, path, NULL);
    return __real_remove(path);
}

// ---- checks on the recorded events -------------------------------------------------------

// The first event at or after from of kind whose a (or, for a rename, b) is path; -1 if none.
static int find(int from, ev_kind kind, const char *path, bool by_target) {
    for (int i = from; i < g_n_ev; i++)
        if (g_ev[i].kind == kind && !strcmp(by_target ? g_ev[i].b : g_ev[i].a, path)) return i;
    return -1;
}

// Every rename of the recorded span: its source was synced before it, and
// the target's directory after it (before the span's next rename or remove
// of something else that depends on it is checked by the callers).
static void check_renames(const char *what) {
    for (int i = 0; i < g_n_ev; i++) {
        if (g_ev[i].kind != EV_RENAME) continue;
        const event *r = &g_ev[i];
        struct stat sb;
        // Files are synced before they are renamed (a directory's entries were synced with it).
        if (stat(r->b, &sb) == 0 && S_ISREG(sb.st_mode)) {
            int k = -1;
            for (int j = i - 1; j >= 0 && k < 0; j--)
                if (g_ev[j].kind == EV_FSYNC && !strcmp(g_ev[j].a, r->a)) k = j;
            CHECK_MSG(k >= 0, "%s: %s renamed to %s without an fsync before", what, r->a, r->b);
        }
        char dir[CT_FS_PATH_CAP];
        ct_fs_parent_dir(dir, r->b);
        CHECK_MSG(find(i + 1, EV_FSYNC, dir, false) > i, "%s: %s renamed to %s, and %s never synced after", what,
                  r->a, r->b, dir);
    }
}

static void write_one(const char *dir, const char *name, int64_t step, bool pointer, float value) {
    float w[3] = {value, value + 1, value + 2};
    ct_named_tensor t[] = {{"w", ct_tensor_1d(CT_DTYPE_F32, 3, w)}};
    ct_checkpoint_options o = ct_checkpoint_default_options();
    o.step = step;
    o.keep = !pointer;
    o.update_pointer = pointer;
    ct_checkpoint_writer *cw;
    ct_error err = {0};
    CHECK_OK(ct_checkpoint_writer_begin(&cw, dir, name, &o, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(cw, "weights.safetensors", t, 1, NULL, 0, &err), &err);
    CHECK_OK(ct_checkpoint_writer_set_state(cw, "{}", &err), &err);
    CHECK_OK(ct_checkpoint_writer_commit(cw, &err), &err);
}

// The value checkpoint name's tensor w starts with, or -1 if it does not open.
static float first_value(const char *dir, const char *name) {
    ct_checkpoint *c;
    ct_error err;
    if (ct_checkpoint_open(&c, dir, name, &err) != CT_OK) {
        printf("  %s/%s does not open: %s\n", dir, name, err.msg);
        return -1;
    }
    float w[3] = {0};
    ct_tensor_request r = {.file = "weights.safetensors", .name = "w", .dest = ct_tensor_1d(CT_DTYPE_F32, 3, w)};
    ct_status s = ct_checkpoint_load(c, &r, 1, CT_LOAD_EXACT, &err);
    ct_checkpoint_close(c);
    return s == CT_OK ? w[0] : -1;
}

// A new checkpoint: its files synced, then renamed; the temporary directory
// synced, renamed into place, the output directory synced, then the pointer.
static void test_new_checkpoint(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("new"));
    ct_error err;
    g_n_ev = 0;
    CHECK_OK(ct_fs_mkdirs(dir, &err), &err);
    CHECK_MSG(find(0, EV_FSYNC, g_tmp, false) >= 0, "a new directory's parent %s is synced", g_tmp);
    g_n_ev = 0;
    write_one(dir, "model_1", 1, true, 1);
    check_renames("model_1");
    char final[2048], pointer[2048];
    snprintf(final, sizeof final, "%s/model_1", dir);
    snprintf(pointer, sizeof pointer, "%s/checkpoint", dir);
    int placed = find(0, EV_RENAME, final, true), named = find(0, EV_RENAME, pointer, true);
    int synced = placed >= 0 ? find(placed + 1, EV_FSYNC, dir, false) : -1;
    CHECK_MSG(placed >= 0 && named > placed, "model_1 placed (event %d) before the pointer names it (event %d)", placed,
              named);
    CHECK_MSG(synced > placed && synced < named, "%s synced (event %d) between model_1's rename (%d) and the pointer's (%d)",
              dir, synced, placed, named);
    // The temporary directory's entries are durable before it is renamed.
    int tmp_synced = placed >= 0 ? find(0, EV_FSYNC, g_ev[placed].a, false) : -1;
    CHECK_MSG(tmp_synced >= 0 && tmp_synced < placed, "the temporary directory synced (event %d) before its rename (%d)",
              tmp_synced, placed);
    printf("  model_1: %d durable steps in order\n", g_n_ev);
}

// A checkpoint of a name that exists (lowest_loss, written at each new
// best): the old copy goes only after the output directory is synced, with
// RENAME_EXCHANGE and without it.
static void test_replace(bool exchange) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path(exchange ? "replace_exchange" : "replace_two_renames"));
    write_one(dir, "lowest_loss", 1, false, 1);
    g_no_exchange = !exchange;
    g_n_ev = 0;
    write_one(dir, "lowest_loss", 2, false, 2);
    g_no_exchange = false;
    check_renames(exchange ? "replace (exchange)" : "replace (two renames)");
    char final[2048];
    snprintf(final, sizeof final, "%s/lowest_loss", dir);
    int placed = find(0, exchange ? EV_EXCHANGE : EV_RENAME, final, true);
    // The first rename onto it is refused (it exists); without the exchange,
    // the second, after the old one is moved aside, puts the new one there.
    if (!exchange)
        placed = placed >= 0 ? find(placed + 1, EV_RENAME, final, true) : -1;
    CHECK_MSG(placed >= 0, "the new lowest_loss was put in place (%s)", exchange ? "exchange" : "rename");
    int first_remove = -1;
    for (int i = placed + 1; placed >= 0 && i < g_n_ev && first_remove < 0; i++)
        if (g_ev[i].kind == EV_REMOVE) first_remove = i;
    int synced = placed >= 0 ? find(placed + 1, EV_FSYNC, dir, false) : -1;
    CHECK_MSG(first_remove > placed && synced > placed && synced < first_remove,
              "%s: the old copy's first removal (event %d, %s) comes after %s is synced (event %d)",
              exchange ? "exchange" : "two renames", first_remove, first_remove >= 0 ? g_ev[first_remove].a : "-", dir,
              synced);
    CHECK(first_value(dir, "lowest_loss") == 2);
}

// A writer without RENAME_EXCHANGE killed between moving the old
// lowest_loss aside and renaming the new one into place: the next writer
// (which cleans up after dead ones) must leave a lowest_loss that opens.
static void test_killed_between_renames(void) {
    char dir[1024], final[2048];
    snprintf(dir, sizeof dir, "%s", tmp_path("killed_between"));
    snprintf(final, sizeof final, "%s/lowest_loss", dir);
    write_one(dir, "model_1", 1, true, 1);
    write_one(dir, "lowest_loss", 1, false, 5);
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        ct_log_set_level(CT_LOG_OFF);
        g_no_exchange = true;
        // The first rename onto it (of the new one, refused: it exists) is let
        // through, and so is the old one's move aside; the second is never made.
        g_die_at = final;
        g_die_after = 2;
        float w[3] = {6, 7, 8};
        ct_named_tensor t[] = {{"w", ct_tensor_1d(CT_DTYPE_F32, 3, w)}};
        ct_checkpoint_options o = ct_checkpoint_default_options();
        o.step = 2;
        o.keep = true;
        o.update_pointer = false;
        ct_checkpoint_writer *cw;
        if (ct_checkpoint_writer_begin(&cw, dir, "lowest_loss", &o, NULL) != CT_OK ||
            ct_checkpoint_writer_add_tensors(cw, "weights.safetensors", t, 1, NULL, 0, NULL) != CT_OK ||
            ct_checkpoint_writer_set_state(cw, "{}", NULL) != CT_OK)
            _exit(3);
        ct_checkpoint_writer_commit(cw, NULL);
        _exit(0);
    }
    int status;
    CHECK(waitpid(pid, &status, 0) == pid);
    CHECK_MSG(WIFEXITED(status) && WEXITSTATUS(status) == 9, "the writer died between its renames (status %d)", status);
    printf("  after the kill: lowest_loss %s\n", access(final, F_OK) == 0 ? "in place" : "moved aside");
    // The next checkpoint's writer cleans up after the dead one.
    ct_log_set_level(CT_LOG_OFF);
    write_one(dir, "model_2", 2, true, 2);
    ct_log_set_level(CT_LOG_WARN);
    float v = first_value(dir, "lowest_loss");
    CHECK_MSG(v == 5 || v == 6, "the best checkpoint survives a writer killed between its renames (w[0] = %g)",
              (double)v);
}

// The writer reads each tensor back: one that the disk returns different
// from memory (a bit flipped on its way) fails the checkpoint, by name.
static void test_read_back(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("read_back"));
    float w[3] = {1, 2, 3};
    ct_named_tensor t[] = {{"w", ct_tensor_1d(CT_DTYPE_F32, 3, w)}};
    ct_checkpoint_options o = ct_checkpoint_default_options();
    ct_checkpoint_writer *cw;
    ct_error err = {0};
    CHECK_OK(ct_checkpoint_writer_begin(&cw, dir, "model_1", &o, &err), &err);
    g_corrupt_size = sizeof w;
    ct_status st = ct_checkpoint_writer_add_tensors(cw, "weights.safetensors", t, 1, NULL, 0, &err);
    g_corrupt_size = 0;
    CHECK_MSG(st == CT_ERR_IO && strstr(err.msg, "weights.safetensors") && strstr(err.msg, "'w' reads back different"),
              "a tensor written wrong: %s", st == CT_OK ? "accepted" : err.msg);
    ct_checkpoint_writer_abort(cw);
}

// An output directory that cannot be synced (EIO) fails the commit, naming
// it, and the pointer still names the previous checkpoint.
static void test_dir_fsync_fails(void) {
    char dir[1024];
    snprintf(dir, sizeof dir, "%s", tmp_path("fsync_fails"));
    write_one(dir, "model_1", 1, true, 1);
    float w[3] = {2, 3, 4};
    ct_named_tensor t[] = {{"w", ct_tensor_1d(CT_DTYPE_F32, 3, w)}};
    ct_checkpoint_options o = ct_checkpoint_default_options();
    o.step = 2;
    ct_checkpoint_writer *cw;
    ct_error err = {0};
    CHECK_OK(ct_checkpoint_writer_begin(&cw, dir, "model_2", &o, &err), &err);
    CHECK_OK(ct_checkpoint_writer_add_tensors(cw, "weights.safetensors", t, 1, NULL, 0, &err), &err);
    g_fail_fsync = dir;
    ct_status st = ct_checkpoint_writer_commit(cw, &err);
    g_fail_fsync = NULL;
    CHECK_MSG(st == CT_ERR_IO && strstr(err.msg, dir) && strstr(err.msg, "fsync failed"),
              "a directory fsync that fails: %s", st == CT_OK ? "accepted" : err.msg);
    char name[CT_CHECKPOINT_NAME_MAX];
    ct_log_set_level(CT_LOG_OFF);
    CHECK_OK(ct_checkpoint_find_latest(dir, name, sizeof name, &err), &err);
    ct_log_set_level(CT_LOG_WARN);
    CHECK_MSG(!strcmp(name, "model_1"), "the pointer names %s", name);
}

// A flush of the summaries is durable or an error: an fsync that fails
// (EIO) fails the flush, naming the file.
static void test_summary_fsync_fails(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/fsync_metrics.jsonl", g_tmp);
    ct_error err = {0};
    ct_metrics_writer *m;
    CHECK_OK(ct_metrics_writer_open(&m, path, &err), &err);
    if (m) {
        CHECK_OK(ct_metrics_writer_add(m, 1, "train", "metrics/loss", 0.5, &err), &err);
        g_fail_fsync = path;
        ct_status st = ct_metrics_writer_flush(m, &err);
        g_fail_fsync = NULL;
        CHECK_MSG(st == CT_ERR_IO && strstr(err.msg, path) && strstr(err.msg, "fsync failed"),
                  "a metrics.jsonl fsync that fails: %s", st == CT_OK ? "accepted" : err.msg);
        CHECK_OK(ct_metrics_writer_close(m, &err), &err);
    }
    // Closing a metrics writer flushes it: an fsync that fails there fails
    // the close.
    snprintf(path, sizeof path, "%s/fsync_close.jsonl", g_tmp);
    CHECK_OK(ct_metrics_writer_open(&m, path, &err), &err);
    if (m) {
        CHECK_OK(ct_metrics_writer_add(m, 1, "train", "metrics/loss", 0.5, &err), &err);
        g_fail_fsync = path;
        ct_status st = ct_metrics_writer_close(m, &err);
        g_fail_fsync = NULL;
        CHECK_MSG(st == CT_ERR_IO && strstr(err.msg, path) && strstr(err.msg, "fsync failed"),
                  "closing a metrics.jsonl that cannot be synced: %s", st == CT_OK ? "accepted" : err.msg);
    }
    snprintf(path, sizeof path, "%s/fsync_tb", g_tmp);
    ct_tb_writer *w;
    CHECK_OK(ct_tb_writer_open(&w, path, &err), &err);
    if (w) {
        CHECK_OK(ct_tb_writer_scalar(w, "metrics/loss", 1, 0.5f, &err), &err);
        g_fail_fsync = ct_tb_writer_path(w);
        ct_status st = ct_tb_writer_flush(w, &err);
        g_fail_fsync = NULL;
        CHECK_MSG(st == CT_ERR_IO && strstr(err.msg, ct_tb_writer_path(w)) && strstr(err.msg, "fsync failed"),
                  "an event file fsync that fails: %s", st == CT_OK ? "accepted" : err.msg);
        CHECK_OK(ct_tb_writer_close(w, &err), &err);
    }
    // Closing a run's summaries flushes the event files: an fsync that
    // fails there fails the close, naming the file.
    snprintf(path, sizeof path, "%s/fsync_run", g_tmp);
    ct_summary *s;
    CHECK_OK(ct_summary_open(&s, path, 0, &err), &err);
    if (!s) return;
    CHECK_OK(ct_summary_scalar(s, CT_SUMMARY_TRAIN, 1, "metrics/loss", 0.5, &err), &err);
    char dir[1200], file[1500] = "";
    snprintf(dir, sizeof dir, "%s/train", path);
    DIR *d = opendir(dir);
    CHECK(d != NULL);
    for (struct dirent *de; d && (de = readdir(d));)
        if (strstr(de->d_name, "tfevents")) snprintf(file, sizeof file, "%s/%s", dir, de->d_name);
    if (d) closedir(d);
    g_fail_fsync = file;
    ct_status st = ct_summary_close(s, &err);
    g_fail_fsync = NULL;
    CHECK_MSG(st == CT_ERR_IO && file[0] && strstr(err.msg, file) && strstr(err.msg, "fsync failed"),
              "closing summaries whose event file cannot be synced: %s", st == CT_OK ? "accepted" : err.msg);
    // ... and so does one whose metrics.jsonl cannot be synced.
    snprintf(path, sizeof path, "%s/fsync_run_metrics", g_tmp);
    CHECK_OK(ct_summary_open(&s, path, 0, &err), &err);
    if (!s) return;
    CHECK_OK(ct_summary_scalar(s, CT_SUMMARY_TRAIN, 1, "metrics/loss", 0.5, &err), &err);
    snprintf(file, sizeof file, "%s/metrics.jsonl", path);
    g_fail_fsync = file;
    st = ct_summary_close(s, &err);
    g_fail_fsync = NULL;
    CHECK_MSG(st == CT_ERR_IO && strstr(err.msg, file) && strstr(err.msg, "fsync failed"),
              "closing summaries whose metrics.jsonl cannot be synced: %s", st == CT_OK ? "accepted" : err.msg);
}

// ct_fs_write_all through interrupted and short writes writes everything; a
// write that moves nothing without an error (a device that is full in a way
// write(2) does not report) is an error naming the file, not an endless loop.
static void test_write_all(void) {
    char path[1100];
    snprintf(path, sizeof path, "%s/write_all", g_tmp);
    static const char text[] = "0123456789abcdef";
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    CHECK(fd >= 0);
    ct_error err = {0};
    g_eintr_writes = 2, g_short_writes = 3;
    CHECK_OK(ct_fs_write_all(fd, text, 16, path, &err), &err);
    CHECK_MSG(g_eintr_writes == 0 && g_short_writes == 0, "the injected faults were not all met (%d EINTR, %d short left)",
              g_eintr_writes, g_short_writes);
    g_eintr_writes = g_short_writes = 0;
    g_zero_writes = true;
    ct_status st = ct_fs_write_all(fd, text, 16, path, &err);
    g_zero_writes = false;
    CHECK_MSG(st == CT_ERR_IO && strstr(err.msg, path) && strstr(err.msg, "16 bytes"), "a write of 0 bytes: %s",
              st == CT_OK ? "no error" : err.msg);
    if (st != CT_OK) printf("a write that moves nothing: %s\n", err.msg);
    close(fd);
    char *back = NULL;
    size_t len = 0;
    CHECK_OK(ct_fs_read(path, &back, &len, &err), &err);
    CHECK_MSG(back && len == 16 && !memcmp(back, text, 16), "read back %zu bytes", len);
    free(back);
}

int main(void) {
    scratch_init("test_durability");
    // Paths are compared with what /proc/self/fd says: no link in them.
    char *real = realpath(g_tmp, NULL);
    if (real) snprintf(g_tmp, sizeof g_tmp, "%s", real);
    free(real);
    printf("scratch directory %s\n", g_tmp);
    test_new_checkpoint();
    test_replace(true);
    test_replace(false);
    test_killed_between_renames();
    test_read_back();
    test_dir_fsync_fails();
    test_write_all();
    test_summary_fsync_fails();
    ct_error err;
    if (!check_failed_) ct_fs_remove_tree(g_tmp, &err);
    return check_summary("test_durability");
}
