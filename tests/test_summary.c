// Summaries: metrics.jsonl (parsed back line by line with cJSON, truncation
// on resume), TensorBoard event files (parsed back by tests/read_tfevents.py,
// a reader written apart from the writer), Trax's log line and the progress
// line (drawn on a pseudo-terminal, silent elsewhere).
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "capture.h"
#include "check.h"
#include "scratch.h"
#include "core/fs.h"
#include "ctrax/train/checkpoint.h"
#include "train/summary_internal.h"

static int python(const char *script, const char *a, const char *b) {
    char cmd[8192];
    snprintf(cmd, sizeof cmd, "/usr/bin/python3 '%s/%s' '%s' '%s'", g_tests_dir, script, a, b);
    fflush(stdout);
    int rc = system(cmd);
    return rc == -1 ? -1 : WEXITSTATUS(rc);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

// The event files in dir, sorted; returns how many (paths into out).
static int event_files(const char *dir, char out[][2048], int max) {
    DIR *d = opendir(dir);
    int n = 0;
    if (!d) return 0;
    struct dirent *de;
    while ((de = readdir(d)) && n < max)
        if (!strncmp(de->d_name, "events.out.tfevents.", 20)) snprintf(out[n++], 2048, "%s/%s", dir, de->d_name);
    closedir(d);
    qsort(out, (size_t)n, 2048, (int (*)(const void *, const void *))strcmp);
    return n;
}

// ---- formats ---------------------------------------------------------------

static void test_formats(void) {
    CHECK(ct_crc32c("123456789", 9) == 0xe3069283u);  // the CRC-32C check value
    CHECK(ct_crc32c("", 0) == 0);

    char buf[256];
    ct_format_step_line(buf, sizeof buf, 100, "train", "loss", 4, 2.3456);
    CHECK_MSG(!strcmp(buf, "Step    100: train loss |  2.34560000"), "[%s]", buf);
    // Trax pads the mode to 5 and right-justifies names to the longest.
    ct_format_step_line(buf, sizeof buf, 1, "eval", "accuracy", 12, -0.5);
    CHECK_MSG(!strcmp(buf, "Step      1: eval      accuracy | -0.50000000"), "[%s]", buf);
    // The space flag of "% 6d" puts a space before a positive number, as Python does.
    ct_format_step_line(buf, sizeof buf, 1234567, "train", "WeightedCategoryCrossEntropy", 4, 10.0);
    CHECK_MSG(!strcmp(buf, "Step  1234567: train WeightedCategoryCrossEntropy |  10.00000000"), "[%s]", buf);
    printf("  %s\n", buf);

    ct_metrics_format_line(buf, sizeof buf, 100, "train", "metrics/loss", (double)2.3456f);
    CHECK_MSG(!strcmp(buf, "{\"step\": 100, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 2.3456}\n"),
              "[%s]", buf);
    printf("  %s", buf);
    ct_metrics_format_line(buf, sizeof buf, 7, "eval", "a\"b\\c", 0.1);
    CHECK_MSG(!strcmp(buf, "{\"step\": 7, \"mode\": \"eval\", \"metric\": \"a\\\"b\\\\c\", \"value\": 0.1}\n"), "[%s]",
              buf);
    ct_metrics_format_line(buf, sizeof buf, 7, "eval", "x", 1.0 / 3.0);
    CHECK_MSG(strstr(buf, "\"value\": 0.3333333333333333") != NULL, "[%s]", buf);
    cJSON *j = cJSON_Parse(buf);
    CHECK(j && cJSON_GetObjectItem(j, "value")->valuedouble == 1.0 / 3.0);  // reads back exactly
    cJSON_Delete(j);
    ct_metrics_format_line(buf, sizeof buf, 7, "train", "loss", NAN);
    CHECK_MSG(
        !strcmp(buf,
                "{\"step\": 7, \"mode\": \"train\", \"metric\": \"loss\", \"value\": null, \"nonfinite\": \"nan\"}\n"),
        "[%s]", buf);
    ct_metrics_format_line(buf, sizeof buf, 7, "train", "loss", -INFINITY);
    CHECK(strstr(buf, "\"nonfinite\": \"-inf\"") != NULL);
    CHECK(ct_metrics_format_line(NULL, 0, 3000000000LL, "train", "x", 1e30) ==
          strlen("{\"step\": 3000000000, \"mode\": \"train\", \"metric\": \"x\", \"value\": 1e+30}\n"));
    // The shortest text that reads back, against Python's repr (numpy's for
    // float32): a float that needs all 9 digits, a double that needs 17.
    ct_metrics_format_line(buf, sizeof buf, 1, "train", "x", (double)10.1908455f);
    CHECK_MSG(strstr(buf, "\"value\": 10.1908455}") != NULL, "[%s]", buf);  // repr(np.float32(10.1908455))
    ct_metrics_format_line(buf, sizeof buf, 1, "train", "x", 0.1 + 0.2);
    CHECK_MSG(strstr(buf, "\"value\": 0.30000000000000004}") != NULL, "[%s]", buf);  // repr(0.1 + 0.2)

    ct_progress_format(buf, sizeof buf, 120, 1000, 2.34561, 8.5, 4350, 103);
    CHECK_MSG(!strcmp(buf, "step 120/1000 | loss 2.3456 | 8.50 steps/s | 4.35k tokens/s | ETA 1m43s"), "[%s]", buf);
    printf("  %s\n", buf);
    ct_progress_format(buf, sizeof buf, 1, 100000, 9.0, -1, -1, -1);
    CHECK_MSG(!strcmp(buf, "step 1/100000 | loss 9.0000 | - steps/s | - tokens/s | ETA -"), "[%s]", buf);
    ct_progress_format(buf, sizeof buf, 5, 100000, 1.0, 0.2, 2.5e6, 7322);
    CHECK_MSG(!strcmp(buf, "step 5/100000 | loss 1.0000 | 0.20 steps/s | 2.50M tokens/s | ETA 2h02m02s"), "[%s]", buf);
    // The unit boundaries: 3599.5 s rounds to an hour (1h00m00s, not
    // 60m00s), 59.5 s to a minute, 1000 tokens/s is 1.00k.
    ct_progress_format(buf, sizeof buf, 7, 9, 0.5, 2, 1e3, 3599.5);
    CHECK_MSG(strstr(buf, "| 1.00k tokens/s | ETA 1h00m00s") != NULL, "[%s]", buf);
    ct_progress_format(buf, sizeof buf, 7, 9, 0.5, 1, 1, 59.5);
    CHECK_MSG(strstr(buf, "| ETA 1m00s") != NULL, "[%s]", buf);
    // 1e6 tokens/s is 1.00M (not 1000.00k); a rate that is not finite and an
    // ETA past 1e9 s (a rate near 0) are shown as "-".
    ct_progress_format(buf, sizeof buf, 7, 9, 0.5, INFINITY, 1e6, 2e9);
    CHECK_MSG(!strcmp(buf, "step 7/9 | loss 0.5000 | - steps/s | 1.00M tokens/s | ETA -"), "[%s]", buf);
}

// ---- metrics.jsonl ----------------------------------------------------------

// Parses every line of path with cJSON; returns the number of lines, checks
// that each is an object with step, mode, metric and a value, and that the
// largest step is max_step.
static int parse_metrics(const char *path, int64_t max_step) {
    char *text;
    size_t n;
    ct_error err = {0};
    CHECK_OK(ct_fs_read(path, &text, &n, &err), &err);
    if (!text) return -1;
    CHECK(n == 0 || text[n - 1] == '\n');
    int lines = 0;
    int64_t top = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        cJSON *j = cJSON_Parse(line);
        CHECK_MSG(cJSON_IsObject(j), "line %d parses: %s", lines + 1, line);
        const cJSON *step = cJSON_GetObjectItem(j, "step"), *mode = cJSON_GetObjectItem(j, "mode");
        const cJSON *metric = cJSON_GetObjectItem(j, "metric"), *value = cJSON_GetObjectItem(j, "value");
        CHECK(cJSON_IsNumber(step) && cJSON_IsString(mode) && cJSON_IsString(metric) && cJSON_IsNumber(value));
        if (cJSON_IsNumber(step) && cJSON_IsString(mode) && cJSON_IsNumber(value)) {
            CHECK(!strcmp(mode->valuestring, "train") || !strcmp(mode->valuestring, "eval"));
            // The values the test writes: step / 8 for train, -step for eval.
            double want = !strcmp(mode->valuestring, "train") ? step->valuedouble / 8 : -step->valuedouble;
            CHECK_MSG(value->valuedouble == want, "line %d: %s", lines + 1, line);
            if ((int64_t)step->valuedouble > top) top = (int64_t)step->valuedouble;
        }
        cJSON_Delete(j);
        lines++;
    }
    CHECK_MSG(top == max_step, "largest step %lld, expected %lld", (long long)top, (long long)max_step);
    free(text);
    return lines;
}

// path holds exactly want (n bytes).
static void check_file_is(const char *path, const char *want, size_t n) {
    char *text = NULL;
    size_t len = 0;
    ct_error err = {0};
    CHECK_OK(ct_fs_read(path, &text, &len, &err), &err);
    CHECK_MSG(text && len == n && !memcmp(text, want, n), "%s: %zu bytes, expected %zu", path, len, n);
    free(text);
}

static void test_metrics(void) {
    const char *path = tmp_path("metrics.jsonl");
    ct_error err = {0};
    ct_metrics_writer *w;
    CHECK_OK(ct_metrics_writer_open(&w, path, &err), &err);
    for (int s = 1; s <= 10; s++) {
        CHECK_OK(ct_metrics_writer_add(w, s, "train", "metrics/loss", s / 8.0, &err), &err);
        if (s % 2 == 0) CHECK_OK(ct_metrics_writer_add(w, s, "eval", "metrics/accuracy", -s, &err), &err);
        if (s % 3 == 0) CHECK_OK(ct_metrics_writer_flush(w, &err), &err);
    }
    CHECK_OK(ct_metrics_writer_close(w, &err), &err);
    CHECK(parse_metrics(path, 10) == 15);
    // Appends.
    CHECK_OK(ct_metrics_writer_open(&w, path, &err), &err);
    CHECK_OK(ct_metrics_writer_add(w, 11, "train", "metrics/loss", 11 / 8.0, &err), &err);
    CHECK_OK(ct_metrics_writer_close(w, &err), &err);
    CHECK(parse_metrics(path, 11) == 16);

    // Resume from step 6: steps 7..11 go (5 train + 2 eval lines), whole
    // lines, so no warning of lines that do not parse.
    int64_t dropped = -1;
    capture cap;
    capture_begin(&cap);
    CHECK_OK(ct_metrics_truncate_after(path, 6, &dropped, &err), &err);
    char *said = capture_end(&cap);
    CHECK(dropped == 7);
    CHECK_MSG(!strstr(said, "do not parse"), "a warning for whole lines: %s", said);
    free(said);
    CHECK(parse_metrics(path, 6) == 9);
    // Nothing past the step: the file is left alone.
    CHECK_OK(ct_metrics_truncate_after(path, 6, &dropped, &err), &err);
    CHECK(dropped == 0);
    CHECK(parse_metrics(path, 6) == 9);
    // A line cut short by a crash is dropped (a warning says so)...
    FILE *f = fopen(path, "ab");
    fputs("{\"step\": 7, \"mode\": \"tr", f);
    fclose(f);
    capture_begin(&cap);
    CHECK_OK(ct_metrics_truncate_after(path, 100, &dropped, &err), &err);
    said = capture_end(&cap);
    CHECK(dropped == 1);
    CHECK_MSG(strstr(said, "dropped 1 line(s) that do not parse"), "the warning: %s", said);
    free(said);
    CHECK(parse_metrics(path, 6) == 9);
    // A step no int64 holds is no step ctrax wrote: the line is dropped as a
    // torn one, not cast (undefined; INT64_MIN on x86, which would keep it).
    f = fopen(path, "ab");
    fputs("{\"step\": 1e300, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 1}\n"
          "{\"step\": -1e300, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 1}\n",
          f);
    fclose(f);
    CHECK_OK(ct_metrics_truncate_after(path, 100, &dropped, &err), &err);
    CHECK_MSG(dropped == 2, "steps of +-1e300: dropped %lld", (long long)dropped);
    CHECK(parse_metrics(path, 6) == 9);
    // ... and a writer opened on such a file starts on a line of its own.
    f = fopen(path, "ab");
    fputs("{\"step\": 7, \"mo", f);
    fclose(f);
    CHECK_OK(ct_metrics_writer_open(&w, path, &err), &err);
    CHECK_OK(ct_metrics_writer_add(w, 7, "train", "metrics/loss", 7 / 8.0, &err), &err);
    CHECK_OK(ct_metrics_writer_close(w, &err), &err);
    CHECK_OK(ct_metrics_truncate_after(path, 100, &dropped, &err), &err);
    CHECK(dropped == 1);
    CHECK(parse_metrics(path, 7) == 10);
    // A file of one byte, not a newline, is a torn line too.
    const char *one = tmp_path("one.jsonl");
    write_text(one, "{");
    CHECK_OK(ct_metrics_writer_open(&w, one, &err), &err);
    if (w) {
        CHECK_OK(ct_metrics_writer_add(w, 1, "train", "metrics/loss", 0.125, &err), &err);
        CHECK_OK(ct_metrics_writer_close(w, &err), &err);
        const char *want = "{\n{\"step\": 1, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 0.125}\n";
        check_file_is(one, want, strlen(want));
    }
    // Blank lines (empty, or spaces and a '\r') are no lines to drop: not
    // counted, though the rewrite leaves them out.
    f = fopen(path, "ab");
    fputs("\n  \r\n{\"step\": 7, \"mode\": \"eval\", \"metric\": \"metrics/accuracy\", \"value\": -7}\n \n", f);
    fclose(f);
    CHECK_OK(ct_metrics_truncate_after(path, 100, &dropped, &err), &err);
    CHECK_MSG(dropped == 0, "blank lines: dropped %lld", (long long)dropped);
    CHECK(parse_metrics(path, 7) == 11);
    // The last line whole but for its newline: kept, and the file rewritten
    // with one (the next append would otherwise run on into it), though no
    // line is dropped.
    f = fopen(path, "ab");
    fputs("{\"step\": 8, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 1}", f);
    fclose(f);
    CHECK_OK(ct_metrics_truncate_after(path, 100, &dropped, &err), &err);
    CHECK(dropped == 0);
    CHECK(parse_metrics(path, 8) == 12);  // checks the file ends in '\n'
    // A missing file is fine.
    CHECK_OK(ct_metrics_truncate_after(tmp_path("nope.jsonl"), 1, &dropped, &err), &err);
    CHECK(dropped == 0 && access(tmp_path("nope.jsonl"), F_OK) != 0);
}

// The writer's buffer (4096 bytes at first) filled to its last byte: lines
// of 2048 + 2048 bytes, and after a torn line the newline it adds plus a
// line of 4095. Every byte of each line reaches the file.
static void test_metrics_buffer_full(void) {
    static char name[4096], line[8192], want[8192];
    // {"step": 1, "mode": "train", "metric": "xx...x", "value": 0.5}\n
    const char *fmt = "{\"step\": 1, \"mode\": \"train\", \"metric\": \"%s\", \"value\": 0.5}\n";
    size_t base = (size_t)snprintf(NULL, 0, fmt, "");
    const char *path = tmp_path("full.jsonl");
    ct_error err = {0};
    ct_metrics_writer *w;
    memset(name, 'x', 2048 - base);
    name[2048 - base] = '\0';
    snprintf(line, sizeof line, fmt, name);
    CHECK(strlen(line) == 2048);
    CHECK_OK(ct_metrics_writer_open(&w, path, &err), &err);
    if (!w) return;
    for (int i = 0; i < 2; i++) CHECK_OK(ct_metrics_writer_add(w, 1, "train", name, 0.5, &err), &err);
    CHECK_OK(ct_metrics_writer_close(w, &err), &err);
    snprintf(want, sizeof want, "%s%s", line, line);
    check_file_is(path, want, 4096);

    write_text(path, "{\"step\": 1, \"mo");  // torn: the writer starts a new line
    memset(name, 'x', 4095 - base);
    name[4095 - base] = '\0';
    snprintf(line, sizeof line, fmt, name);
    CHECK(strlen(line) == 4095);
    CHECK_OK(ct_metrics_writer_open(&w, path, &err), &err);
    if (!w) return;
    CHECK_OK(ct_metrics_writer_add(w, 1, "train", name, 0.5, &err), &err);
    CHECK_OK(ct_metrics_writer_close(w, &err), &err);
    int n = snprintf(want, sizeof want, "{\"step\": 1, \"mo\n%s", line);
    check_file_is(path, want, (size_t)n);
}

// The file's size and inode (a rewrite renames a new file into place).
static void file_id(const char *path, long long *size, long long *ino) {
    struct stat sb;
    CHECK(stat(path, &sb) == 0);
    *size = (long long)sb.st_size;
    *ino = (long long)sb.st_ino;
}

// metrics.jsonl grows with the run, past what a file may hold in memory
// (CT_FS_READ_MAX): truncation streams it, a line at a time.
static void test_metrics_large(void) {
    const char *path = tmp_path("large.jsonl");
    ct_error err = {0};
    int64_t dropped = -1;
    // The values parse_metrics expects: step / 8 for train, -step for eval.
    const char *kept = "{\"step\": 1, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 0.125}\n"
                       "{\"step\": 2, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 0.25}\n"
                       "{\"step\": 3, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 0.375}\n";
    char lines[1024];
    snprintf(lines, sizeof lines,
             "%s{\"step\": 9, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 1.125}\n", kept);
    write_text(path, lines);
    // A file past the cap costs no disk as a sparse file: the real lines,
    // then NUL bytes, one junk line of a GiB with no newline (what a crash
    // can leave where the file system had extended the file but not yet
    // written its data). It is dropped as a torn line is, with the line of
    // step 9.
    int fd = open(path, O_WRONLY);
    CHECK(fd >= 0 && ftruncate(fd, (off_t)CT_FS_READ_MAX + 4096) == 0);
    if (fd >= 0) close(fd);
    CHECK_OK(ct_metrics_truncate_after(path, 3, &dropped, &err), &err);
    CHECK_MSG(dropped == 2, "dropped %lld", (long long)dropped);
    CHECK(parse_metrics(path, 3) == 3);
    long long size, ino, size2, ino2;
    file_id(path, &size, &ino);
    CHECK_MSG(size == (long long)strlen(kept), "%lld bytes left", size);

    // Nothing to drop: the file is not rewritten.
    CHECK_OK(ct_metrics_truncate_after(path, 3, &dropped, &err), &err);
    file_id(path, &size2, &ino2);
    CHECK(dropped == 0 && size2 == size && ino2 == ino);

    // A line of a MiB or more is no line ctrax wrote: dropped as a torn one,
    // and the lines after it are read on.
    FILE *f = fopen(path, "ab");
    CHECK(f != NULL);
    if (!f) return;
    fputs("{\"step\": 2, \"junk\": \"", f);
    for (int i = 0; i < (1 << 20); i++) fputc('x', f);
    fputs("\"}\n{\"step\": 3, \"mode\": \"eval\", \"metric\": \"metrics/accuracy\", \"value\": -3}", f);
    fclose(f);
    CHECK_OK(ct_metrics_truncate_after(path, 3, &dropped, &err), &err);
    CHECK_MSG(dropped == 1, "dropped %lld", (long long)dropped);
    CHECK(parse_metrics(path, 3) == 4);
    // The last line had no newline: the rewrite gives it one.
    char *text = NULL;
    size_t n = 0;
    CHECK_OK(ct_fs_read(path, &text, &n, &err), &err);
    CHECK(n > 0 && text && text[n - 1] == '\n');
    free(text);

    // More kept lines than the output buffer holds (a MiB): written out in
    // pieces, each once, in order.
    f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    enum { MANY = 20000 };  // about 1.4 MiB
    long long kept_size = 0;
    for (int s = 1; s <= MANY; s++) {
        int k = fprintf(f, "{\"step\": %d, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": %.17g}\n", s,
                        s / 8.0);
        kept_size += k > 0 ? k : 0;
    }
    fprintf(f, "{\"step\": %d, \"mode\": \"train\", \"metric\": \"metrics/loss\", \"value\": 0}\n", MANY + 1);
    fclose(f);
    CHECK_OK(ct_metrics_truncate_after(path, MANY, &dropped, &err), &err);
    CHECK_MSG(dropped == 1, "dropped %lld", (long long)dropped);
    file_id(path, &size, &ino);
    CHECK_MSG(size == kept_size, "%lld bytes left, %lld kept", size, kept_size);
    CHECK(parse_metrics(path, MANY) == MANY);

    // Kept lines one byte more than the output buffer (a MiB and a byte)
    // holds: two lines of 2^19 bytes and their newlines, then one to drop.
    f = fopen(path, "wb");
    CHECK(f != NULL);
    if (!f) return;
    const char *fmt = "{\"step\": 1, \"mode\": \"train\", \"metric\": \"%s\", \"value\": 0.125}";
    size_t half = (size_t)1 << 19, base = (size_t)snprintf(NULL, 0, fmt, "");
    char *name = malloc(half);
    CHECK(name != NULL);
    if (!name) return;
    memset(name, 'x', half - base);
    name[half - base] = '\0';
    for (int i = 0; i < 2; i++) {
        fprintf(f, fmt, name);
        fputc('\n', f);
    }
    fputs("{\"step\": 2, \"mode\": \"train\", \"metric\": \"x\", \"value\": 0.25}\n", f);
    fclose(f);
    free(name);
    CHECK_OK(ct_metrics_truncate_after(path, 1, &dropped, &err), &err);
    CHECK_MSG(dropped == 1, "dropped %lld", (long long)dropped);
    file_id(path, &size, &ino);
    CHECK_MSG(size == (long long)(2 * (half + 1)), "%lld bytes left", size);
    CHECK(parse_metrics(path, 1) == 2);

    // What is not a regular file is refused, not read forever.
    CHECK(ct_metrics_truncate_after("/dev/zero", 3, &dropped, &err) == CT_ERR_IO);
}

// ---- TensorBoard ---------------------------------------------------------------

static void test_tensorboard(void) {
    const char *dir = tmp_path("tb/train");
    ct_error err = {0};
    ct_tb_writer *w;
    CHECK_OK(ct_tb_writer_open(&w, dir, &err), &err);
    if (!w) return;
    char path[2048];
    snprintf(path, sizeof path, "%s", ct_tb_writer_path(w));
    char host[256] = "";
    gethostname(host, sizeof host - 1);
    CHECK_MSG(strstr(path, "/tb/train/events.out.tfevents.") && strstr(path, host), "file name %s", path);
    // Scalars, a restart marker, a large step and a negative value.
    char expect[4096];
    size_t len = (size_t)snprintf(expect, sizeof expect, "{\"session_starts\": [4], \"scalars\": [");
    for (int s = 1; s <= 5; s++) {
        float v = 1.0f / (float)s;
        CHECK_OK(ct_tb_writer_scalar(w, "metrics/loss", s, v, &err), &err);
        CHECK_OK(ct_tb_writer_scalar(w, "training/learning_rate", s, 0.001f * (float)s, &err), &err);
        len += (size_t)snprintf(expect + len, sizeof expect - len,
                                "%s{\"tag\": \"metrics/loss\", \"step\": %d, \"value\": %.9g},"
                                "{\"tag\": \"training/learning_rate\", \"step\": %d, \"value\": %.9g}",
                                s > 1 ? "," : "", s, v, s, 0.001f * (float)s);
        if (s == 3) CHECK_OK(ct_tb_writer_session_start(w, 4, &err), &err);
    }
    // Step 127 is the largest one-byte varint, 128 the smallest of two.
    CHECK_OK(ct_tb_writer_scalar(w, "metrics/loss", 127, 0.25f, &err), &err);
    CHECK_OK(ct_tb_writer_scalar(w, "metrics/loss", 128, 0.125f, &err), &err);
    CHECK_OK(ct_tb_writer_scalar(w, "training/steps per second", 5000000000LL, -2.5f, &err), &err);
    len += (size_t)snprintf(expect + len, sizeof expect - len,
                            ",{\"tag\": \"metrics/loss\", \"step\": 127, \"value\": 0.25}"
                            ",{\"tag\": \"metrics/loss\", \"step\": 128, \"value\": 0.125}"
                            ",{\"tag\": \"training/steps per second\", \"step\": 5000000000, \"value\": -2.5}]}");
    CHECK_OK(ct_tb_writer_close(w, &err), &err);
    const char *exp_path = tmp_path("tb_expect.json");
    write_text(exp_path, expect);
    CHECK_MSG(python("read_tfevents.py", path, exp_path) == 0, "the event file reads back: %s", path);

    // Value.tag is a proto3 string, which must be UTF-8 (TensorBoard's
    // reader refuses the file otherwise): refused, naming the byte.
    CHECK_OK(ct_tb_writer_open(&w, tmp_path("tb/bad"), &err), &err);
    if (w) {
        ct_status st = ct_tb_writer_scalar(w, "metrics/acc\xe9" "e", 1, 1.0f, &err);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "tag 'metrics/acc\\xe9...'") && strstr(err.msg, "byte 11"),
                  "a tag that is not UTF-8: %s", st == CT_OK ? "accepted" : err.msg);
        CHECK_OK(ct_tb_writer_close(w, &err), &err);
    }

    // A second writer in the same second gets its own file, and the names
    // sort in the order the files were made: TensorBoard reads a
    // directory's event files in name order, and each run's SessionLog START
    // purges the steps at and after it from the files read before. (Twelve
    // writers: the eleventh's suffix has two digits.)
    enum { N_SAME = 12 };
    ct_tb_writer *same[N_SAME];
    for (int i = 0; i < N_SAME; i++) CHECK_OK(ct_tb_writer_open(&same[i], tmp_path("tb/eval"), &err), &err);
    for (int i = 1; i < N_SAME; i++)
        if (same[i - 1] && same[i])
            CHECK_MSG(strcmp(ct_tb_writer_path(same[i - 1]), ct_tb_writer_path(same[i])) < 0,
                      "writer %d's file %s sorts after writer %d's %s", i - 1, ct_tb_writer_path(same[i - 1]), i,
                      ct_tb_writer_path(same[i]));
    for (int i = 0; i < N_SAME; i++) ct_tb_writer_close(same[i], &err);
}

// A host name may hold a '/' (sethostname takes any bytes): the event file
// takes it as '_', in logdir itself. Tried in a child process with a host
// name of its own (a UTS namespace, which needs root: skipped without).
static void test_tensorboard_slash_host(void) {
    const char *dir = tmp_path("tb/slash");
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        static const char name[] = "ctrax/host";
        if (unshare(CLONE_NEWUTS) != 0 || sethostname(name, sizeof name - 1) != 0) _exit(77);
        ct_tb_writer *w = NULL;
        ct_error err = {0};
        if (ct_tb_writer_open(&w, dir, &err) != CT_OK) {
            printf("  %s\n", err.msg);
            fflush(stdout);
            _exit(1);
        }
        const char *base = strrchr(ct_tb_writer_path(w), '/');
        bool ok = base && strstr(base, ".ctrax_host") != NULL;
        if (!ok) printf("  event file %s\n", ct_tb_writer_path(w));
        fflush(stdout);
        ct_tb_writer_close(w, NULL);
        _exit(ok ? 0 : 1);
    }
    int status = 0;
    CHECK(pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status));
    if (WEXITSTATUS(status) == 77) {
        printf("  no UTS namespace here (not root?): the host name with a '/' is not tried\n");
        return;
    }
    CHECK_MSG(WEXITSTATUS(status) == 0, "an event file for the host name 'ctrax/host' (status %d)",
              WEXITSTATUS(status));
}

// ---- a run's summaries, resumed ------------------------------------------------

static void test_summary_resume(void) {
    const char *out = tmp_path("run");
    ct_error err = {0};
    ct_summary *s;
    CHECK_OK(ct_summary_open(&s, out, 0, &err), &err);
    if (!s) return;
    for (int step = 1; step <= 10; step++) {
        CHECK_OK(ct_summary_scalar(s, CT_SUMMARY_TRAIN, step, "metrics/loss", step / 8.0, &err), &err);
        if (step % 5 == 0) CHECK_OK(ct_summary_scalar(s, CT_SUMMARY_EVAL, step, "metrics/accuracy", -step, &err), &err);
        CHECK_OK(ct_summary_flush(s, &err), &err);
    }
    // Flushed, not yet closed: both files already hold every step.
    CHECK(parse_metrics(tmp_path("run/metrics.jsonl"), 10) == 12);
    char files[4][2048];
    CHECK(event_files(tmp_path("run/train"), files, 4) == 1);
    const char *exp = tmp_path("run_expect.json");
    char expect[4096];
    size_t len = (size_t)snprintf(expect, sizeof expect, "{\"session_starts\": [1], \"scalars\": [");
    for (int step = 1; step <= 10; step++)
        len += (size_t)snprintf(expect + len, sizeof expect - len,
                                "%s{\"tag\": \"metrics/loss\", \"step\": %d, \"value\": %.9g}", step > 1 ? "," : "",
                                step, step / 8.0);
    snprintf(expect + len, sizeof expect - len, "]}");
    write_text(exp, expect);
    CHECK(python("read_tfevents.py", files[0], exp) == 0);
    CHECK_OK(ct_summary_close(s, &err), &err);

    // The run died after step 10 and resumes from the checkpoint of step 5.
    sleep(1);  // a new event file name (one per second and host)
    CHECK_OK(ct_summary_open(&s, out, 5, &err), &err);
    if (!s) return;
    CHECK(parse_metrics(tmp_path("run/metrics.jsonl"), 5) == 6);
    CHECK_OK(ct_summary_scalar(s, CT_SUMMARY_TRAIN, 6, "metrics/loss", 6 / 8.0, &err), &err);
    CHECK_OK(ct_summary_scalar(s, CT_SUMMARY_EVAL, 6, "metrics/accuracy", -6, &err), &err);
    // A name that is not UTF-8 is refused before it reaches either file (the
    // checks below find neither a ninth line nor a second eval scalar).
    ct_status bad = ct_summary_scalar(s, CT_SUMMARY_EVAL, 6, "metrics/\xc3(", -6, &err);
    CHECK_MSG(bad == CT_ERR_ARG && strstr(err.msg, "metrics.jsonl: metric name 'metrics/\\xc3...'") &&
                  strstr(err.msg, "byte 8"),
              "a metric name that is not UTF-8: %s", bad == CT_OK ? "accepted" : err.msg);
    CHECK_OK(ct_summary_close(s, &err), &err);
    CHECK(parse_metrics(tmp_path("run/metrics.jsonl"), 6) == 8);
    CHECK(event_files(tmp_path("run/eval"), files, 4) == 2);
    write_text(exp,
               "{\"session_starts\": [6], \"scalars\": [{\"tag\": \"metrics/accuracy\", \"step\": 6, \"value\": -6}]}");
    CHECK(python("read_tfevents.py", files[1], exp) == 0);
}

// ---- a write that fails partway -------------------------------------------------

// Runs flush with the file size limit at limit bytes (EFBIG past it, the
// write before it cut short, as a full disk does), then lifts the limit.
static ct_status flush_limited(ct_status (*flush)(void *, ct_error *), void *w, off_t limit, ct_error *err) {
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = (rlim_t)limit;
    void (*was)(int) = signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    ct_status s = flush(w, err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, was);
    return s;
}

static ct_status tb_flush(void *w, ct_error *err) { return ct_tb_writer_flush(w, err); }
static ct_status metrics_flush(void *w, ct_error *err) { return ct_metrics_writer_flush(w, err); }

static off_t file_size(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 ? sb.st_size : -1;
}

// A flush that fails partway (disk full) and a later one that succeeds
// (space freed, or the flush of close) leave the file as if the first had
// never failed: what went out is not written a second time.
static void test_partial_write(void) {
    ct_error err = {0};
    ct_tb_writer *w;
    CHECK_OK(ct_tb_writer_open(&w, tmp_path("partial/tb"), &err), &err);
    if (!w) return;
    char path[2048], expect[4096];
    snprintf(path, sizeof path, "%s", ct_tb_writer_path(w));
    size_t len = (size_t)snprintf(expect, sizeof expect, "{\"scalars\": [");
    for (int s = 1; s <= 10; s++) {
        CHECK_OK(ct_tb_writer_scalar(w, "metrics/loss", s, 1.0f / (float)s, &err), &err);
        len += (size_t)snprintf(expect + len, sizeof expect - len,
                                "%s{\"tag\": \"metrics/loss\", \"step\": %d, \"value\": %.9g}", s > 1 ? "," : "", s,
                                1.0f / (float)s);
    }
    snprintf(expect + len, sizeof expect - len, "]}");
    off_t before = file_size(path);
    CHECK(flush_limited(tb_flush, w, before + 70, &err) == CT_ERR_IO);  // 70 bytes: inside the second record
    CHECK_MSG(file_size(path) == before + 70, "%lld bytes", (long long)file_size(path));
    CHECK_OK(ct_tb_writer_close(w, &err), &err);
    const char *exp_path = tmp_path("partial_expect.json");
    write_text(exp_path, expect);
    CHECK_MSG(python("read_tfevents.py", path, exp_path) == 0, "the event file reads back: %s", path);

    const char *mpath = tmp_path("partial/metrics.jsonl");
    ct_metrics_writer *m;
    CHECK_OK(ct_metrics_writer_open(&m, mpath, &err), &err);
    if (!m) return;
    for (int s = 1; s <= 10; s++) CHECK_OK(ct_metrics_writer_add(m, s, "train", "metrics/loss", s / 8.0, &err), &err);
    CHECK(flush_limited(metrics_flush, m, 100, &err) == CT_ERR_IO);
    CHECK(file_size(mpath) == 100);
    CHECK_OK(ct_metrics_writer_close(m, &err), &err);
    CHECK(parse_metrics(mpath, 10) == 10);
}

// ---- the progress line ---------------------------------------------------------

static void test_progress(void) {
    // Not a terminal, steps faster than the interval: nothing is written.
    FILE *f = tmpfile();
    ct_progress *p = ct_progress_new(f, 10, 60.0);
    CHECK(p && !ct_progress_active(p));
    for (int s = 1; s <= 10; s++) ct_progress_update(p, s, 1.0, 100);
    ct_progress_clear(p);
    ct_progress_finish(p);
    ct_progress_free(p);
    fflush(f);
    CHECK(ftell(f) == 0);
    fclose(f);

    // Not a terminal, an interval of 0.2 s and steps at least 0.25 s apart
    // (a sleep is never shorter; a slow machine only makes it longer): a
    // plain line (no '\r', no escape) at each of steps 2 to 4, none at step
    // 1 (where the clock starts) nor at 5, the last (the run's log says it).
    f = tmpfile();
    p = ct_progress_new(f, 5, 0.2);
    for (int s = 1; s <= 5; s++) {
        if (s > 1) usleep(250 * 1000);  // at least that long
        ct_progress_update(p, s, 0.5, 10);
    }
    ct_progress_clear(p);
    ct_progress_finish(p);
    ct_progress_free(p);
    char text[512] = "";
    rewind(f);
    size_t len = fread(text, 1, sizeof text - 1, f);
    text[len] = '\0';
    fclose(f);
    printf("  not a terminal, 0.2 s interval, steps 0.25 s apart:\n%s", text);
    CHECK_MSG(!strncmp(text, "step 2/5 | loss 0.5000 | ", 25) && strstr(text, "\nstep 3/5 | loss 0.5000 | ") &&
                  strstr(text, "\nstep 4/5 | ") && !strstr(text, "step 5/") && !strchr(text, '\r') &&
                  !strchr(text, '\033') && len > 0 && text[len - 1] == '\n',
              "got: %s", text);
    // The rate is over the steps since the first update: at most 4 steps/s.
    double sps = 0;
    CHECK(sscanf(text, "step 2/5 | loss 0.5000 | %lf steps/s", &sps) == 1 && sps > 0 && sps <= 4.001);
    // So are tokens (10 a step, the first update's not counted): 10 tokens
    // a step, each rate rounded to 0.01.
    double tps = 0;
    CHECK_MSG(sscanf(text, "step 2/5 | loss 0.5000 | %lf steps/s | %lf tokens/s", &sps, &tps) == 2 &&
                  fabs(tps - 10 * sps) < 0.1,
              "%.2f steps/s, %.2f tokens/s: not 10 tokens a step", sps, tps);

    // A pseudo-terminal: the line is drawn with '\r' and erased to the end.
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    if (master < 0 || grantpt(master) != 0 || unlockpt(master) != 0) {
        printf("  no pseudo-terminal here: the tty half of the progress test is skipped\n");
        if (master >= 0) close(master);
        return;
    }
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    CHECK(slave >= 0);
    struct termios tio;
    tcgetattr(slave, &tio);
    cfmakeraw(&tio);
    tcsetattr(slave, TCSANOW, &tio);
    FILE *tty = fdopen(slave, "w");
    p = ct_progress_new(tty, 10, 60.0);
    CHECK(ct_progress_active(p));
    for (int s = 1; s <= 10; s++) {
        ct_progress_update(p, s, 10.0 / s, 256);
        usleep(30 * 1000);
    }
    ct_progress_clear(p);
    ct_progress_update(p, 10, 1.0, 0);  // redrawn after a clear
    ct_progress_finish(p);
    ct_progress_free(p);
    fflush(tty);
    char out[8192];
    int flags = fcntl(master, F_GETFL);
    fcntl(master, F_SETFL, flags | O_NONBLOCK);
    ssize_t n = 0, k;
    while ((k = read(master, out + n, sizeof out - 1 - (size_t)n)) > 0) n += k;
    out[n > 0 ? n : 0] = '\0';
    CHECK_MSG(strstr(out, "\rstep 1/10 | loss 10.0000 | - steps/s | - tokens/s | ETA -\033[K") != NULL,
              "first draw: %s", out);
    CHECK_MSG(strstr(out, "\rstep 10/10 | loss 1.0000 | ") != NULL, "last draw: %s", out);
    CHECK(strstr(out, "tokens/s | ETA 0s\033[K") != NULL);
    CHECK(strstr(out, "\r\033[K\rstep 10/10") != NULL);  // clear, then redraw
    // The last step is drawn though the draw before it was under 0.1 s ago.
    CHECK_MSG(strstr(out, "ETA 0s\033[K\r\033[K\rstep 10/10") != NULL, "step 10 drawn before the clear: %s", out);
    CHECK(n > 0 && out[n - 1] == '\n');
    int draws = 0;
    for (const char *q = out; (q = strstr(q, "\rstep ")); q++) draws++;
    CHECK_MSG(draws >= 3 && draws <= 11, "%d draws for 11 updates (at most one per 0.1 s, and the last)", draws);
    printf("  %d draws on a pseudo-terminal; the last: %s", draws, strrchr(out, '\r') + 1);
    // The last step is drawn however soon after the draw before it.
    p = ct_progress_new(tty, 2, 60.0);
    ct_progress_update(p, 1, 2.0, 0);
    ct_progress_update(p, 2, 1.0, 0);
    ct_progress_finish(p);
    ct_progress_free(p);
    fflush(tty);
    n = 0;
    while ((k = read(master, out + n, sizeof out - 1 - (size_t)n)) > 0) n += k;
    out[n > 0 ? n : 0] = '\0';
    CHECK_MSG(strstr(out, "\rstep 2/2 | loss 1.0000") != NULL, "the last step drawn: %s", out);
    fclose(tty);
    close(master);
}

int main(void) {
    scratch_init("test_summary");
    test_formats();
    test_metrics();
    test_metrics_large();
    test_metrics_buffer_full();
    test_tensorboard();
    test_tensorboard_slash_host();
    test_summary_resume();
    test_partial_write();
    test_progress();
    ct_error err;
    if (!check_failed_) ct_fs_remove_tree(g_tmp, &err);
    return check_summary("test_summary");
}
