// The harnesses' scratch directory and helpers (common.h).
#include "common.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "ctrax/core/log.h"
#include "core/fs.h"
#include "ctrax/train/checkpoint.h"

static char dir[512];

static void remove_dir(void) {
    if (dir[0]) ct_fs_remove_tree(dir, NULL);
}

const char *fuzz_dir(void) {
    if (dir[0]) return dir;
    const char *base = getenv("TMPDIR");
    struct stat st;
    if (!base || !base[0]) base = stat("/dev/shm", &st) == 0 && S_ISDIR(st.st_mode) ? "/dev/shm" : "/tmp";
    snprintf(dir, sizeof dir, "%s/ctrax-fuzz-XXXXXX", base);
    if (!mkdtemp(dir)) {
        perror(dir);
        abort();
    }
    if (getenv("FUZZ_KEEP_DIR")) fprintf(stderr, "fuzz: scratch directory %s (kept)\n", dir);
    else atexit(remove_dir);
    ct_log_set_level(CT_LOG_ERROR);
    return dir;
}

char *fuzz_path(char *buf, size_t cap, const char *name) {
    if ((size_t)snprintf(buf, cap, "%s/%s", fuzz_dir(), name) >= cap) {
        fprintf(stderr, "fuzz: path %s/%s too long\n", fuzz_dir(), name);
        abort();
    }
    return buf;
}

char *fuzz_write(char *buf, size_t cap, const char *name, const void *data, size_t n) {
    fuzz_path(buf, cap, name);
    int fd = open(buf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0 && errno == ENOENT) {  // a file in a subdirectory: make it
        char parent[1024];
        snprintf(parent, sizeof parent, "%s", buf);
        char *slash = strrchr(parent, '/');
        *slash = '\0';
        if (ct_fs_mkdirs(parent, NULL) == CT_OK) fd = open(buf, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    }
    if (fd < 0) {
        perror(buf);
        abort();
    }
    const char *p = data;
    while (n > 0) {
        ssize_t w = write(fd, p, n);
        if (w <= 0) {
            perror(buf);
            abort();
        }
        p += w;
        n -= (size_t)w;
    }
    close(fd);
    return buf;
}

uint32_t fuzz_take(const uint8_t **data, size_t *size, int n) {
    uint32_t v = 0;
    for (int i = 0; i < n; i++) {
        if (*size == 0) break;
        v |= (uint32_t)**data << (8 * i);
        (*data)++;
        (*size)--;
    }
    return v;
}

unsigned fuzz_touch(const void *p, size_t n) {
    const volatile unsigned char *b = p;
    unsigned s = 0;
    for (size_t i = 0; i < n; i++) s += b[i];
    return s;
}
