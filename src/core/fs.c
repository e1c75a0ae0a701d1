// Durable file helpers: atomic writes, bounded reads, fsync, mkdir -p, rm -rf.
#define _GNU_SOURCE  // nftw
#include "core/fs.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

ct_status ct_fs_temp_name(char *buf, size_t cap, const char *path, ct_error *err) {
    const char *slash = strrchr(path, '/');
    int dir_len = slash ? (int)(slash - path + 1) : 0;
    const char *base = slash ? slash + 1 : path;
    if ((size_t)snprintf(buf, cap, "%.*s.%s.tmp-%ld", dir_len, path, base, (long)getpid()) >= cap)
        return ct_error_set(err, CT_ERR_ARG, "path too long: %s", path);
    return CT_OK;
}

ct_status ct_fs_sync_dir(const char *dir, ct_error *err) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot open directory: %s", dir, strerror(errno));
    int rc = fsync(fd);
    int e = errno;
    close(fd);
    // Some file systems cannot fsync a directory; that is not our failure.
    if (rc != 0 && e != EINVAL && e != EROFS)
        return ct_error_set(err, CT_ERR_IO, "%s: fsync failed: %s", dir, strerror(e));
    return CT_OK;
}

void ct_fs_parent_dir(char *dir, const char *path) {
    snprintf(dir, CT_FS_PATH_CAP, "%s", path);
    char *slash = strrchr(dir, '/');
    if (!slash) snprintf(dir, CT_FS_PATH_CAP, ".");
    else if (slash == dir) dir[1] = '\0';
    else *slash = '\0';
}

ct_status ct_fs_mkdirs(const char *path, ct_error *err) {
    char buf[CT_FS_PATH_CAP];
    if ((size_t)snprintf(buf, sizeof buf, "%s", path) >= sizeof buf)
        return ct_error_set(err, CT_ERR_ARG, "path too long: %s", path);
    if (!buf[0]) return ct_error_set(err, CT_ERR_ARG, "an empty path is no directory");  // the walk starts at buf[1]
    for (char *p = buf + 1;; p++) {
        bool last = *p == '\0';
        if (*p == '/' || last) {
            *p = '\0';
            if (mkdir(buf, 0755) == 0) {
                // The new directory's entry is durable once its parent is synced.
                char parent[CT_FS_PATH_CAP];
                ct_fs_parent_dir(parent, buf);
                CT_TRY(ct_fs_sync_dir(parent, err));
            } else if (errno != EEXIST) {
                return ct_error_set(err, CT_ERR_IO, "%s: cannot create directory: %s", buf, strerror(errno));
            }
            if (last) break;
            *p = '/';
        }
    }
    // mkdir says EEXIST for a symlink loop (or a dangling link) too: stat says why.
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ct_error_set(err, CT_ERR_IO, "%s: not a directory (%s)", path, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return ct_error_set(err, CT_ERR_IO, "%s: not a directory", path);
    return CT_OK;
}

ct_status ct_fs_write_from(int fd, const void *data, size_t n, size_t *done, const char *path, ct_error *err) {
    const char *p = data;
    while (*done < n) {
        size_t left = n - *done;
        ssize_t k = write(fd, p + *done, left < (1u << 30) ? left : (1u << 30));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return ct_error_set(err, CT_ERR_IO, "%s: write failed: %s", path, strerror(errno));
        // write(2) moving nothing with bytes left says no error, but retrying
        // would loop for ever.
        if (k == 0)
            return ct_error_set(err, CT_ERR_IO, "%s: write wrote nothing with %zu bytes left (device full?)", path,
                                left);
        *done += (size_t)k;
    }
    return CT_OK;
}

ct_status ct_fs_write_all(int fd, const void *data, size_t n, const char *path, ct_error *err) {
    size_t done = 0;
    return ct_fs_write_from(fd, data, n, &done, path, err);
}

ct_status ct_fs_close(int fd, const char *path, ct_status st, ct_error *err) {
    if (close(fd) != 0 && st == CT_OK) st = ct_error_set(err, CT_ERR_IO, "%s: close failed: %s", path, strerror(errno));
    return st;
}

// The rename of an atomic write would put a regular file in place of
// whatever is at path: /dev/null (as root), a fifo a reader waits on, a
// symlink to a device. Only a regular file (or a new path) is replaced.
static ct_status check_replaceable(const char *path, ct_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0 || S_ISREG(sb.st_mode)) return CT_OK;
    return ct_error_set(err, CT_ERR_IO, "%s: exists and is not a regular file (%s): not writing over it", path,
                        S_ISDIR(sb.st_mode)                         ? "a directory"
                        : S_ISCHR(sb.st_mode) || S_ISBLK(sb.st_mode) ? "a device"
                        : S_ISFIFO(sb.st_mode)                       ? "a fifo"
                                                                     : "a socket or other special file");
}

ct_status ct_fs_atomic_begin(const char *path, int *fd, char *tmp, ct_error *err) {
    *fd = -1;
    CT_TRY(check_replaceable(path, err));
    CT_TRY(ct_fs_temp_name(tmp, CT_FS_PATH_CAP, path, err));
    // A leftover of this pid's is ours to replace; O_EXCL | O_NOFOLLOW then
    // makes sure the data goes to a new file, never through a planted link.
    if (unlink(tmp) != 0 && errno != ENOENT)
        return ct_error_set(err, CT_ERR_IO, "%s: cannot remove the old temporary file: %s", tmp, strerror(errno));
    *fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (*fd < 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot create: %s", tmp, strerror(errno));
    return CT_OK;
}

ct_status ct_fs_atomic_end(const char *path, int fd, const char *tmp, ct_status st, ct_error *err) {
    if (st == CT_OK && fsync(fd) != 0) st = ct_error_set(err, CT_ERR_IO, "%s: fsync failed: %s", tmp, strerror(errno));
    st = ct_fs_close(fd, tmp, st, err);
    if (st == CT_OK && rename(tmp, path) != 0)
        st = ct_error_set(err, CT_ERR_IO, "%s: rename failed: %s", path, strerror(errno));
    if (st != CT_OK) {
        unlink(tmp);
        return st;
    }
    // The directory entry is durable only once the directory is synced.
    char dir[CT_FS_PATH_CAP];
    ct_fs_parent_dir(dir, path);
    return ct_fs_sync_dir(dir, err);
}

ct_status ct_fs_write_atomic_parts(const char *path, const ct_fs_part *parts, int n_parts, ct_error *err) {
    char tmp[CT_FS_PATH_CAP];
    int fd;
    CT_TRY(ct_fs_atomic_begin(path, &fd, tmp, err));
    ct_status st = CT_OK;
    for (int i = 0; i < n_parts && st == CT_OK; i++) st = ct_fs_write_all(fd, parts[i].data, parts[i].n, tmp, err);
    return ct_fs_atomic_end(path, fd, tmp, st, err);
}

ct_status ct_fs_write_atomic(const char *path, const void *data, size_t n, ct_error *err) {
    ct_fs_part part = {data, n};
    return ct_fs_write_atomic_parts(path, &part, 1, err);
}

ct_status ct_fs_open_regular(const char *path, int *fd, struct stat *sb, ct_error *err) {
    // O_NONBLOCK: opening a fifo must not wait for a writer (it is refused below).
    *fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
    if (*fd < 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    ct_status st = CT_OK;
    if (fstat(*fd, sb) != 0) st = ct_error_set(err, CT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    else if (!S_ISREG(sb->st_mode))
        st = ct_error_set(err, CT_ERR_IO, "%s: not a regular file (a directory, device or fifo): refusing to read it",
                          path);
    if (st != CT_OK) {
        close(*fd);
        *fd = -1;
    }
    return st;
}

ct_status ct_fs_read_all(int fd, void *buf, size_t n, size_t *got, const char *path, ct_error *err) {
    *got = 0;
    while (*got < n) {
        ssize_t k = read(fd, (char *)buf + *got, n - *got);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return ct_error_set(err, CT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (k == 0) break;  // the end of the file
        *got += (size_t)k;
    }
    return CT_OK;
}

ct_status ct_fs_read_max(const char *path, size_t max, char **data, size_t *n, ct_error *err) {
    *data = NULL;
    if (n) *n = 0;
    int fd;
    struct stat sb;
    CT_TRY(ct_fs_open_regular(path, &fd, &sb, err));
    ct_status st = CT_OK;
    if (sb.st_size < 0 || (uint64_t)sb.st_size > max)
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: %lld bytes, more than the %zu such a file may hold", path,
                          (long long)sb.st_size, max);
    // The size comes from the file: a failed allocation is an error, not an abort.
    size_t cap = st == CT_OK ? (size_t)sb.st_size : 0, len = 0;
    char *buf = st == CT_OK ? malloc(cap + 1) : NULL;
    if (st == CT_OK && !buf) st = ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory for %zu bytes", path, cap);
    // Read what fstat reported; a file that grew meanwhile is read up to that
    // size (and shows up as a size or checksum mismatch where one is known).
    if (st == CT_OK) st = ct_fs_read_all(fd, buf, cap, &len, path, err);
    close(fd);
    if (st != CT_OK) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    *data = buf;
    if (n) *n = len;
    return CT_OK;
}

ct_status ct_fs_read(const char *path, char **data, size_t *n, ct_error *err) {
    return ct_fs_read_max(path, CT_FS_READ_MAX, data, n, err);
}

static int remove_entry(const char *fpath, const struct stat *sb, int type, struct FTW *ftw) {
    (void)sb;
    (void)type;
    (void)ftw;
    return remove(fpath) != 0 && errno != ENOENT ? -1 : 0;
}

ct_status ct_fs_remove_tree(const char *path, ct_error *err) {
    struct stat sb;
    if (lstat(path, &sb) != 0) {
        if (errno == ENOENT) return CT_OK;
        return ct_error_set(err, CT_ERR_IO, "%s: cannot stat: %s", path, strerror(errno));
    }
    if (nftw(path, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        return ct_error_set(err, CT_ERR_IO, "%s: cannot remove: %s", path, strerror(errno));
    return CT_OK;
}

ct_status ct_fs_lines_next(ct_fs_lines *r, const char **line, size_t *len, bool *nl, bool *more, ct_error *err) {
    bool skipping = false;
    *more = true;
    for (;;) {
        char *p = memchr(r->buf + r->start, '\n', r->end - r->start);
        if (p || (r->eof && (r->start < r->end || skipping))) {
            *len = p ? (size_t)(p - (r->buf + r->start)) : r->end - r->start;
            *line = skipping ? NULL : r->buf + r->start;
            *nl = p != NULL;
            r->start += *len + (p ? 1 : 0);
            return CT_OK;
        }
        if (r->eof) {
            *more = false;
            return CT_OK;
        }
        if (r->end - r->start == r->cap) skipping = true;  // too long: read on to its end
        if (skipping) r->start = r->end = 0;
        else if (r->start > 0) {
            memmove(r->buf, r->buf + r->start, r->end - r->start);
            r->end -= r->start;
            r->start = 0;
        }
        ssize_t k = read(r->fd, r->buf + r->end, r->cap - r->end);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return ct_error_set(err, CT_ERR_IO, "%s: read failed: %s", r->path, strerror(errno));
        if (k == 0) r->eof = true;
        r->end += (size_t)k;
    }
}
