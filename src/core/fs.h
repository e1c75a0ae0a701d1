// Durable file helpers (POSIX): atomic writes, bounded reads of regular
// files, directory fsync, mkdir -p, rm -rf. Used by checkpoints, safetensors,
// summaries, the Loop and the tools; internal to ctrax (src/ is on the include
// path of the library, the tools and the tests).
#ifndef CTRAX_CORE_FS_H
#define CTRAX_CORE_FS_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/stat.h>

#include "ctrax/core/error.h"

// Longest path the helpers build (a longer one is CT_ERR_ARG naming it).
#define CT_FS_PATH_CAP 4096

// One piece of a file written by ct_fs_write_atomic_parts.
typedef struct ct_fs_part {
    const void *data;
    size_t n;
} ct_fs_part;

// Writes path atomically: a new temporary file (ct_fs_temp_name; never one
// through a link), fsync, rename over path, fsync the directory. An existing
// path that is not a regular file (a directory, device, fifo, or a symlink to
// one) is refused (CT_ERR_IO): the rename would replace it with a file.
ct_status ct_fs_write_atomic(const char *path, const void *data, size_t n, ct_error *err);
// Same, the file being the n_parts pieces one after the other.
ct_status ct_fs_write_atomic_parts(const char *path, const ct_fs_part *parts, int n_parts, ct_error *err);
// The same write for a file too big to hold in memory, made piece by piece:
// begin creates the temporary file (*fd, open for writing; its name goes to
// tmp[CT_FS_PATH_CAP]); end, when st is CT_OK, fsyncs it, renames it over
// path and fsyncs the directory, and otherwise removes it. end always closes
// fd and returns the resulting status (st when that is an error).
ct_status ct_fs_atomic_begin(const char *path, int *fd, char *tmp, ct_error *err);
ct_status ct_fs_atomic_end(const char *path, int fd, const char *tmp, ct_status st, ct_error *err);
// read(2) of up to n bytes from fd into buf (retrying short reads and
// EINTR), stopping early only at the end of the file: *got says how many
// came. An error names path.
ct_status ct_fs_read_all(int fd, void *buf, size_t n, size_t *got, const char *path, ct_error *err);
// write(2) of all n bytes to fd (retrying short writes and EINTR); an error
// names path.
ct_status ct_fs_write_all(int fd, const void *data, size_t n, const char *path, ct_error *err);
// Same, from byte *done on, counting in *done what was written: after an
// error (a full disk may take half a write first) it says how far the file
// got, so that a writer that keeps its buffer retries with the rest and never
// writes a byte twice.
ct_status ct_fs_write_from(int fd, const void *data, size_t n, size_t *done, const char *path, ct_error *err);
// Closes fd. A failed close (data that did not reach the disk) becomes the
// error when st is CT_OK; returns the resulting status. For writers' close
// functions: s = ct_fs_close(fd, path, flush(...), err).
ct_status ct_fs_close(int fd, const char *path, ct_status st, ct_error *err);
// The temporary name used for path while it is written: <dir>/.<base>.tmp-<pid>
// (a dot file, removed by ct_checkpoint_clean_tmp once its writer is gone).
// Fails (CT_ERR_ARG) when it does not fit in cap.
ct_status ct_fs_temp_name(char *buf, size_t cap, const char *path, ct_error *err);
// The directory part of path ("." when it has none) into dir[CT_FS_PATH_CAP].
void ct_fs_parent_dir(char *dir, const char *path);
// fsyncs a directory (so renames and creations in it are durable).
ct_status ct_fs_sync_dir(const char *dir, ct_error *err);
// mkdir -p. An empty path is CT_ERR_ARG.
ct_status ct_fs_mkdirs(const char *path, ct_error *err);
// Opens path read-only and checks it is a regular file: /dev/zero (or a link
// to it) would be read until memory runs out, a fifo or a terminal forever,
// so only a regular file has a size to trust. *fd gets the open descriptor
// (close it) and sb its fstat; on failure nothing stays open.
ct_status ct_fs_open_regular(const char *path, int *fd, struct stat *sb, ct_error *err);
// Reads a whole regular file into a malloc'ed, NUL-terminated buffer
// (free()); n (may be NULL) gets its length. What is not a regular file is
// refused (CT_ERR_IO), and so is a file of more than max bytes
// (CT_ERR_FORMAT); the read is bounded by the size fstat reports.
// ct_fs_read's max is CT_FS_READ_MAX.
#define CT_FS_READ_MAX ((size_t)1 << 30)
ct_status ct_fs_read_max(const char *path, size_t max, char **data, size_t *n, ct_error *err);
ct_status ct_fs_read(const char *path, char **data, size_t *n, ct_error *err);
// A file read a line at a time through a buffer of a fixed size, whatever
// the file's (metrics.jsonl grows with a run past what memory holds). The
// caller opens fd (ct_fs_open_regular), sets path (for errors), buf and cap
// (its size), and the rest to zero; to read again from the start, seek fd
// to 0 and zero start, end and eof.
typedef struct ct_fs_lines {
    int fd;
    const char *path;
    char *buf;
    size_t cap;
    size_t start, end;  // buf[start, end): read, not yet returned
    bool eof;
} ct_fs_lines;
// The next line: *line and *len (without the '\n', not NUL-terminated; it
// stays valid until the next call); *line NULL for one of cap bytes or
// more, which is read on to its end without being held. *nl says whether
// it ended in a '\n' (the last line of a file may not). *more is false at
// the end of the file, with nothing returned.
ct_status ct_fs_lines_next(ct_fs_lines *r, const char **line, size_t *len, bool *nl, bool *more, ct_error *err);
// rm -rf (does not follow symlinks). A missing path is not an error.
ct_status ct_fs_remove_tree(const char *path, ct_error *err);

#endif
