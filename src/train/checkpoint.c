// Checkpoint directories: atomic writes, checked reads, the pointer, retention.
#define _GNU_SOURCE  // renameat2 (RENAME_EXCHANGE)
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "core/fs.h"
#include "core/json.h"
#include "ctrax/core/log.h"
#include "ctrax/core/memory.h"
#include "ctrax/train/checkpoint.h"

#define PATH_CAP CT_FS_PATH_CAP
#define MANIFEST "manifest.json"
#define STATE "state.json"
#define POINTER "checkpoint"
#define FORMAT_NAME "ctrax-checkpoint"
// Read limits per kind of file: far above what ctrax writes, far below what
// would exhaust memory. The pointer holds one name; a manifest lists a few
// files with a crc32 per tensor.
#define POINTER_MAX 4096
#define MANIFEST_MAX ((size_t)64 << 20)
// ... and at most this many JSON values (ct_json_values_bound), counted
// before parsing: a few per file and one per tensor name, where checkpoints
// hold thousands of tensors.
#define MANIFEST_VALUES_MAX (1u << 20)
// A manifest lists the files of one checkpoint (ctrax writes four).
#define MANIFEST_FILES_MAX 1024

// ---- small helpers --------------------------------------------------------

// snprintf where cutting a long message short is fine.
__attribute__((format(printf, 3, 4))) static void sfmt(char *buf, size_t cap, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, cap, fmt, ap);
    va_end(ap);
}

static ct_status join(char *buf, const char *a, const char *b, ct_error *err) {
    if ((size_t)snprintf(buf, PATH_CAP, "%s/%s", a, b) >= PATH_CAP)
        return ct_error_set(err, CT_ERR_ARG, "path too long: %s/%s", a, b);
    return CT_OK;
}

// crc32_z takes a size_t length (crc32 an unsigned int: 4 GiB at most).
static uint32_t crc_update(uint32_t crc, const void *data, size_t n) { return (uint32_t)crc32_z(crc, data, n); }

static uint32_t crc_bytes(const void *data, size_t n) { return crc_update((uint32_t)crc32(0L, Z_NULL, 0), data, n); }

static ct_status crc_file(const char *path, uint32_t *crc, ct_error *err) {
    int fd;
    struct stat sb;
    CT_TRY(ct_fs_open_regular(path, &fd, &sb, err));
    static const size_t cap = 1 << 20;
    unsigned char *buf = ct_malloc(cap);  // a fixed size: bookkeeping (memory.h)
    uint32_t c = crc_bytes(NULL, 0);
    ct_status st = CT_OK;
    for (;;) {
        ssize_t k = read(fd, buf, cap);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) st = ct_error_set(err, CT_ERR_IO, "%s: read failed: %s", path, strerror(errno));
        if (k <= 0) break;
        c = crc_update(c, buf, (size_t)k);
    }
    ct_free(buf);
    close(fd);
    *crc = c;
    return st;
}

static void crc_hex(char out[9], uint32_t crc) { snprintf(out, 9, "%08" PRIx32, crc); }

static bool crc_parse(const cJSON *j, uint32_t *crc) {
    if (!cJSON_IsString(j) || strlen(j->valuestring) != 8) return false;
    char *end;
    unsigned long v = strtoul(j->valuestring, &end, 16);
    if (*end) return false;
    *crc = (uint32_t)v;
    return true;
}

static bool json_u64(const cJSON *j, uint64_t *v) {
    if (!cJSON_IsNumber(j)) return false;
    double d = j->valuedouble;
    if (!(d >= 0 && d < 9007199254740992.0) || d != (double)(uint64_t)d) return false;
    *v = (uint64_t)d;
    return true;
}

// A checkpoint or file name: a plain, visible directory entry.
static bool plain_name(const char *s) {
    size_t n = s ? strlen(s) : 0;
    return n > 0 && n < CT_CHECKPOINT_NAME_MAX && s[0] != '.' && !strchr(s, '/');
}

ct_status ct_checkpoint_check_name(const char *name, ct_error *err) {
    if (!plain_name(name) || !strcmp(name, POINTER))
        return ct_error_set(err, CT_ERR_ARG,
                            "invalid checkpoint name '%s' (1..%d characters, no '/', no leading '.', not \"" POINTER
                            "\")",
                            name ? name : "(null)", CT_CHECKPOINT_NAME_MAX - 1);
    return CT_OK;
}

// ---- the manifest -----------------------------------------------------------

typedef struct mfile {
    char *name;
    uint64_t bytes;
    uint32_t crc;
    int n_tensors;
    char **tensor_names;  // per-tensor checksums of a safetensors file
    uint32_t *tensor_crcs;
} mfile;

typedef struct manifest {
    char name[CT_CHECKPOINT_NAME_MAX];
    int64_t step;
    bool keep;
    bool resume_point;
    int n_files;
    mfile *files;
} manifest;

static void manifest_free(manifest *m) {
    for (int i = 0; i < m->n_files; i++) {
        mfile *f = &m->files[i];
        free(f->name);
        for (int t = 0; t < f->n_tensors; t++) free(f->tensor_names[t]);
        free(f->tensor_names);
        free(f->tensor_crcs);
    }
    free(m->files);
    memset(m, 0, sizeof *m);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t a = strlen(s), b = strlen(suffix);
    return a >= b && !strcmp(s + a - b, suffix);
}

// The manifest has no checksum of its own, and the fields it may leave out
// ("keep", "resume_point", "tensors") read as defaults: a bit flipped in one's
// key ("keep" -> "keeq") would turn a permanent checkpoint into one that
// pruning removes. Every other single-bit flip already fails to parse or
// fails a check (a value's syntax, a file's size or crc32, the name, the
// step), so a key no manifest holds is refused too: the checkpoint then
// reads as damaged, which pruning leaves alone. The first key of obj not in
// keys (which ends with NULL), or NULL when there is none.
static const char *unknown_key(const cJSON *obj, const char *const *keys) {
    const cJSON *item;
    cJSON_ArrayForEach(item, obj) {
        const char *const *k = keys;
        while (*k && strcmp(*k, item->string)) k++;
        if (!*k) return item->string;
    }
    return NULL;
}

static ct_status manifest_parse_file(const cJSON *j, mfile *f, const char *path, ct_error *err) {
    static const char *const keys[] = {"name", "bytes", "crc32", "tensors", NULL};
    if (!cJSON_IsObject(j)) return ct_error_set(err, CT_ERR_FORMAT, "%s: a file entry is not an object", path);
    const char *unknown = unknown_key(j, keys);
    if (unknown)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: a file entry's key \"%s\" is not one ctrax writes: damaged",
                            path, unknown);
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(j, "name");
    if (!cJSON_IsString(name) || !plain_name(name->valuestring) || !strcmp(name->valuestring, MANIFEST))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: a file entry has no valid \"name\"", path);
    f->name = ct_strdup(name->valuestring);  // a plain name, under CT_CHECKPOINT_NAME_MAX: bookkeeping
    if (!json_u64(cJSON_GetObjectItemCaseSensitive(j, "bytes"), &f->bytes) ||
        !crc_parse(cJSON_GetObjectItemCaseSensitive(j, "crc32"), &f->crc))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: file '%s' has no valid \"bytes\" or \"crc32\"", path, f->name);
    const cJSON *tensors = cJSON_GetObjectItemCaseSensitive(j, "tensors");
    if (!tensors) return CT_OK;
    if (!cJSON_IsObject(tensors))
        return ct_error_set(err, CT_ERR_FORMAT, "%s: file '%s': \"tensors\" is not an object", path, f->name);
    int n = cJSON_GetArraySize(tensors);
    f->tensor_names = ct_calloc_checked((size_t)n + 1, sizeof *f->tensor_names, err, "%s: %d tensor names of '%s'",
                                        path, n, f->name);
    f->tensor_crcs = f->tensor_names ? ct_calloc_checked((size_t)n + 1, sizeof *f->tensor_crcs, err,
                                                         "%s: %d tensor crcs of '%s'", path, n, f->name)
                                     : NULL;
    if (!f->tensor_crcs) return CT_ERR_MEMORY;
    const cJSON *t;
    cJSON_ArrayForEach(t, tensors) {
        CT_ASSERT(f->n_tensors < n);
        uint32_t c;
        if (!crc_parse(t, &c))
            return ct_error_set(err, CT_ERR_FORMAT, "%s: file '%s': tensor '%s' has no valid crc32", path, f->name,
                                t->string);
        if (!(f->tensor_names[f->n_tensors] = ct_strdup_checked(t->string, err, "%s: a tensor name", path)))
            return CT_ERR_MEMORY;
        f->tensor_crcs[f->n_tensors++] = c;
    }
    return CT_OK;
}

// Reads <ckpt_dir>/manifest.json.
static ct_status manifest_read(const char *ckpt_dir, manifest *m, ct_error *err) {
    memset(m, 0, sizeof *m);
    char path[PATH_CAP];
    CT_TRY(join(path, ckpt_dir, MANIFEST, err));
    char *text = NULL;
    size_t len;
    ct_status st = ct_fs_read_max(path, MANIFEST_MAX, &text, &len, err);
    if (st != CT_OK) {
        ct_error_prefix(err, "incomplete checkpoint (no manifest)");
        return st;
    }
    uint64_t values = ct_json_values_bound(text, len);
    if (values > MANIFEST_VALUES_MAX) {
        free(text);
        return ct_error_set(err, CT_ERR_FORMAT, "%s: holds up to %" PRIu64 " JSON values, more than the %u a manifest "
                            "would: damaged, refused before parsing", path, values, MANIFEST_VALUES_MAX);
    }
    ct_error jerr;
    cJSON *root = ct_json_parse(text, len, path, &jerr);
    free(text);
    if (!root) {
        if (err) *err = jerr;
        return jerr.code;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return ct_error_set(err, CT_ERR_FORMAT, "%s: not a JSON object", path);
    }
    const cJSON *format = cJSON_GetObjectItemCaseSensitive(root, "format");
    const cJSON *version = cJSON_GetObjectItemCaseSensitive(root, "version");
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(root, "name");
    const cJSON *step = cJSON_GetObjectItemCaseSensitive(root, "step");
    const cJSON *files = cJSON_GetObjectItemCaseSensitive(root, "files");
    const cJSON *keep = cJSON_GetObjectItemCaseSensitive(root, "keep");
    const cJSON *resume = cJSON_GetObjectItemCaseSensitive(root, "resume_point");
    const cJSON *checksum = cJSON_GetObjectItemCaseSensitive(root, "checksum");
    static const char *const keys[] = {"format", "version", "name",     "step",
                                       "keep",   "files",   "checksum", "resume_point", NULL};
    const char *unknown = unknown_key(root, keys);
    uint64_t v = 0, s = 0;
    if (unknown)
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: key \"%s\" is not one ctrax writes: damaged", path, unknown);
    else if (!cJSON_IsString(format) || strcmp(format->valuestring, FORMAT_NAME))
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: \"format\" is not \"" FORMAT_NAME "\"", path);
    else if (!json_u64(version, &v) || v < 1) st = ct_error_set(err, CT_ERR_FORMAT, "%s: no valid \"version\"", path);
    else if (v > CT_CHECKPOINT_FORMAT_VERSION)
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: format version %" PRIu64 " is newer than this ctrax reads (%d)",
                          path, v, CT_CHECKPOINT_FORMAT_VERSION);
    else if (!cJSON_IsString(name) || !plain_name(name->valuestring))
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: no valid \"name\"", path);
    else if (!json_u64(step, &s)) st = ct_error_set(err, CT_ERR_FORMAT, "%s: no valid \"step\"", path);
    // "keep" may be absent (manifests before permanent checkpoints: not
    // kept); anything but a boolean would silently read as false and let
    // ct_checkpoint_prune remove a checkpoint someone marked by hand.
    else if (keep && !cJSON_IsBool(keep))
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: \"keep\" is not true or false", path);
    // "resume_point" may be absent (manifests before it: every checkpoint was one).
    else if (resume && !cJSON_IsBool(resume))
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: \"resume_point\" is not true or false", path);
    // Every manifest ctrax wrote says "crc32" (the one checksum it computes).
    else if (checksum && (!cJSON_IsString(checksum) || strcmp(checksum->valuestring, "crc32")))
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: \"checksum\" is not \"crc32\"", path);
    else if (!cJSON_IsArray(files)) st = ct_error_set(err, CT_ERR_FORMAT, "%s: no \"files\" array", path);
    else if (cJSON_GetArraySize(files) > MANIFEST_FILES_MAX)
        st = ct_error_set(err, CT_ERR_FORMAT, "%s: \"files\" lists %d files, more than %d", path,
                          cJSON_GetArraySize(files), MANIFEST_FILES_MAX);
    if (st == CT_OK) {
        snprintf(m->name, sizeof m->name, "%s", name->valuestring);
        m->step = (int64_t)s;
        m->keep = cJSON_IsTrue(keep);
        m->resume_point = !resume || cJSON_IsTrue(resume);
        int n = cJSON_GetArraySize(files);
        if (!(m->files = ct_calloc_checked((size_t)n + 1, sizeof *m->files, err, "%s: %d file entries", path, n)))
            st = CT_ERR_MEMORY;
        const cJSON *f;
        cJSON_ArrayForEach(f, files) {
            if (st != CT_OK) break;
            CT_ASSERT(m->n_files < n);
            st = manifest_parse_file(f, &m->files[m->n_files++], path, err);
        }
        // One name, one file: the checks and the loads must see the same one.
        for (int i = 0; st == CT_OK && i < m->n_files; i++)
            for (int k = 0; st == CT_OK && k < i; k++)
                if (!strcmp(m->files[i].name, m->files[k].name))
                    st = ct_error_set(err, CT_ERR_FORMAT, "%s: file '%s' is listed twice", path, m->files[i].name);
    }
    cJSON_Delete(root);
    if (st != CT_OK) manifest_free(m);
    return st;
}

// ---- writing -------------------------------------------------------------

struct ct_checkpoint_writer {
    char output_dir[PATH_CAP];
    char name[CT_CHECKPOINT_NAME_MAX];
    char tmp_dir[PATH_CAP];
    ct_checkpoint_options opts;
    cJSON *files;  // the manifest's "files" array
};

ct_checkpoint_options ct_checkpoint_default_options(void) {
    return (ct_checkpoint_options){.step = 0, .keep = false, .update_pointer = true};
}

ct_status ct_checkpoint_writer_begin(ct_checkpoint_writer **out, const char *output_dir, const char *name,
                                     const ct_checkpoint_options *opts, ct_error *err) {
    CT_ASSERT(out && output_dir);
    *out = NULL;
    CT_TRY(ct_checkpoint_check_name(name, err));
    CT_TRY(ct_fs_mkdirs(output_dir, err));
    ct_error clean_err;
    if (ct_checkpoint_clean_tmp(output_dir, false, &clean_err) != CT_OK)
        ct_log(CT_LOG_WARN, "checkpoint: %s", clean_err.msg);
    ct_checkpoint_writer *w = ct_calloc(1, sizeof *w);  // a fixed size: bookkeeping (memory.h)
    if (!(w->files = cJSON_CreateArray())) {
        ct_free(w);
        return ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory starting checkpoint '%s'", output_dir, name);
    }
    w->opts = opts ? *opts : ct_checkpoint_default_options();
    snprintf(w->output_dir, sizeof w->output_dir, "%s", output_dir);
    snprintf(w->name, sizeof w->name, "%s", name);
    char base[PATH_CAP];
    snprintf(base, sizeof base, ".tmp-%s-%ld", name, (long)getpid());
    ct_status st = join(w->tmp_dir, output_dir, base, err);
    if (st == CT_OK) st = ct_fs_remove_tree(w->tmp_dir, err);  // our own earlier attempt
    if (st == CT_OK && mkdir(w->tmp_dir, 0755) != 0)
        st = ct_error_set(err, CT_ERR_IO, "%s: cannot create: %s", w->tmp_dir, strerror(errno));
    if (st != CT_OK) {
        cJSON_Delete(w->files);
        ct_free(w);
        return st;
    }
    *out = w;
    return CT_OK;
}

static ct_status writer_file_path(ct_checkpoint_writer *w, const char *file, char *path, ct_error *err) {
    if (!plain_name(file) || !strcmp(file, MANIFEST))
        return ct_error_set(err, CT_ERR_ARG, "checkpoint %s: invalid file name '%s'", w->name, file ? file : "(null)");
    const cJSON *f;
    cJSON_ArrayForEach(f, w->files) {
        if (!strcmp(cJSON_GetObjectItemCaseSensitive(f, "name")->valuestring, file))
            return ct_error_set(err, CT_ERR_ARG, "checkpoint %s: file '%s' added twice", w->name, file);
    }
    return join(path, w->tmp_dir, file, err);
}

static cJSON *file_entry(const char *file, uint64_t bytes, uint32_t crc) {
    char hex[9];
    crc_hex(hex, crc);
    cJSON *e = cJSON_CreateObject();
    if (!e) return NULL;
    cJSON_AddStringToObject(e, "name", file);
    cJSON_AddItemToObject(e, "bytes", ct_json_int((int64_t)bytes));
    cJSON_AddStringToObject(e, "crc32", hex);
    return e;
}

ct_status ct_checkpoint_writer_add_tensors(ct_checkpoint_writer *w, const char *file, const ct_named_tensor *tensors,
                                           int n, const ct_kv *meta, int n_meta, ct_error *err) {
    CT_ASSERT(w);
    char path[PATH_CAP];
    CT_TRY(writer_file_path(w, file, path, err));
    CT_TRY(ct_safetensors_write(path, tensors, n, meta, n_meta, err));
    // Read the file back: its checksums come from what is on disk, and each
    // tensor's must equal the checksum of the memory it was written from.
    ct_safetensors *st;
    CT_TRY(ct_safetensors_open(&st, path, err));
    size_t size;
    const void *bytes = ct_safetensors_bytes(st, &size);
    cJSON *e = file_entry(file, size, crc_bytes(bytes, size));
    cJSON *tcrc = e ? cJSON_AddObjectToObject(e, "tensors") : NULL;
    ct_status s = tcrc ? CT_OK : ct_error_set(err, CT_ERR_MEMORY, "out of memory");
    for (int i = 0; i < n && s == CT_OK; i++) {
        ct_tensor t = ct_safetensors_tensor(st, ct_safetensors_find(st, tensors[i].name));
        uint32_t on_disk = crc_bytes(t.data, ct_tensor_nbytes(&t));
        if (on_disk != crc_bytes(tensors[i].tensor.data, ct_tensor_nbytes(&tensors[i].tensor))) {
            s = ct_error_set(err, CT_ERR_IO, "%s: tensor '%s' reads back different from what was written", path,
                             tensors[i].name);
            break;
        }
        char hex[9];
        crc_hex(hex, on_disk);
        cJSON_AddStringToObject(tcrc, tensors[i].name, hex);
    }
    ct_safetensors_close(st);
    if (s != CT_OK) {
        cJSON_Delete(e);
        return s;
    }
    cJSON_AddItemToArray(w->files, e);
    return CT_OK;
}

ct_status ct_checkpoint_writer_add_bytes(ct_checkpoint_writer *w, const char *file, const void *data, size_t n,
                                         ct_error *err) {
    CT_ASSERT(w && (data || n == 0));
    char path[PATH_CAP];
    CT_TRY(writer_file_path(w, file, path, err));
    CT_TRY(ct_fs_write_atomic(path, data, n, err));
    cJSON *e = file_entry(file, n, crc_bytes(data, n));
    if (!e) return ct_error_set(err, CT_ERR_MEMORY, "out of memory");
    cJSON_AddItemToArray(w->files, e);
    return CT_OK;
}

ct_status ct_checkpoint_writer_set_state(ct_checkpoint_writer *w, const char *json, ct_error *err) {
    CT_ASSERT(w && json);
    // What ct_checkpoint_open will accept: one parser for writing and reading.
    ct_error jerr;
    cJSON *j = ct_json_parse(json, strlen(json), STATE, &jerr);
    if (!j) return ct_error_set(err, CT_ERR_ARG, "checkpoint %s: the state: %s", w->name, jerr.msg);
    cJSON_Delete(j);
    return ct_checkpoint_writer_add_bytes(w, STATE, json, strlen(json), err);
}

void ct_checkpoint_writer_abort(ct_checkpoint_writer *w) {
    if (!w) return;
    ct_error e;
    if (ct_fs_remove_tree(w->tmp_dir, &e) != CT_OK) ct_log(CT_LOG_WARN, "checkpoint: %s", e.msg);
    cJSON_Delete(w->files);
    free(w);
}

// A directory that holds a manifest: something a writer may replace or prune
// may remove (never a directory of the user's that happens to share a name).
static bool is_checkpoint_dir(const char *dir) {
    char path[PATH_CAP];
    return join(path, dir, MANIFEST, NULL) == CT_OK && access(path, F_OK) == 0;
}

// Puts the complete directory tmp at final, replacing what is there.
static ct_status move_into_place(const char *output_dir, const char *name, const char *tmp, const char *final,
                                 ct_error *err) {
    if (rename(tmp, final) == 0) return CT_OK;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return ct_error_set(err, CT_ERR_IO, "%s: rename from %s failed: %s", final, tmp, strerror(errno));
    if (!is_checkpoint_dir(final))
        return ct_error_set(err, CT_ERR_IO, "%s exists and is not a checkpoint (no " MANIFEST "): not replacing it",
                            final);
    // An older checkpoint of this name: swap the two in one step; tmp then
    // holds the old one, which goes once the swap is durable (else a crash
    // could leave the old name on a half-removed directory).
    if (renameat2(AT_FDCWD, tmp, AT_FDCWD, final, RENAME_EXCHANGE) == 0) {
        CT_TRY(ct_fs_sync_dir(output_dir, err));
        return ct_fs_remove_tree(tmp, err);
    }
    if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
        return ct_error_set(err, CT_ERR_IO, "%s: exchange with %s failed: %s", final, tmp, strerror(errno));
    // No RENAME_EXCHANGE here (NFS): two renames. In between, the name is
    // absent and readers fall back to the newest other checkpoint; a writer
    // that dies there leaves the old one aside, and the next writer puts it
    // back (ct_checkpoint_clean_tmp).
    char old[PATH_CAP], base[PATH_CAP];
    snprintf(base, sizeof base, ".old-%s-%ld", name, (long)getpid());
    CT_TRY(join(old, output_dir, base, err));
    CT_TRY(ct_fs_remove_tree(old, err));
    if (rename(final, old) != 0) return ct_error_set(err, CT_ERR_IO, "%s: rename failed: %s", final, strerror(errno));
    if (rename(tmp, final) != 0) {
        int e = errno;
        if (rename(old, final) != 0) ct_log(CT_LOG_ERROR, "checkpoint: could not restore %s from %s", final, old);
        return ct_error_set(err, CT_ERR_IO, "%s: rename from %s failed: %s", final, tmp, strerror(e));
    }
    CT_TRY(ct_fs_sync_dir(output_dir, err));
    return ct_fs_remove_tree(old, err);
}

ct_status ct_checkpoint_writer_commit(ct_checkpoint_writer *w, ct_error *err) {
    CT_ASSERT(w);
    cJSON *root = cJSON_CreateObject();
    ct_status st = root ? CT_OK : ct_error_set(err, CT_ERR_MEMORY, "out of memory");
    char *text = NULL;
    if (st == CT_OK) {
        cJSON_AddStringToObject(root, "format", FORMAT_NAME);
        cJSON_AddItemToObject(root, "version", ct_json_int(CT_CHECKPOINT_FORMAT_VERSION));
        cJSON_AddStringToObject(root, "name", w->name);
        cJSON_AddItemToObject(root, "step", ct_json_int(w->opts.step));
        cJSON_AddBoolToObject(root, "keep", w->opts.keep);
        cJSON_AddBoolToObject(root, "resume_point", w->opts.update_pointer);
        cJSON_AddStringToObject(root, "checksum", "crc32");
        cJSON_AddItemToObject(root, "files", w->files);
        w->files = NULL;
        text = cJSON_Print(root);
        cJSON_Delete(root);
        if (!text) st = ct_error_set(err, CT_ERR_MEMORY, "out of memory");
    }
    char path[PATH_CAP], final[PATH_CAP];
    if (st == CT_OK) st = join(path, w->tmp_dir, MANIFEST, err);
    if (st == CT_OK) st = ct_fs_write_atomic(path, text, strlen(text), err);  // fsyncs tmp_dir too
    free(text);
    if (st == CT_OK) st = join(final, w->output_dir, w->name, err);
    if (st == CT_OK) st = move_into_place(w->output_dir, w->name, w->tmp_dir, final, err);
    if (st == CT_OK) st = ct_fs_sync_dir(w->output_dir, err);
    if (st == CT_OK && w->opts.update_pointer) {
        char line[CT_CHECKPOINT_NAME_MAX + 2];
        int len = snprintf(line, sizeof line, "%s\n", w->name);
        st = join(path, w->output_dir, POINTER, err);
        if (st == CT_OK) st = ct_fs_write_atomic(path, line, (size_t)len, err);
    }
    if (st != CT_OK) {
        ct_error_prefix(err, "checkpoint %s", w->name);
        ct_fs_remove_tree(w->tmp_dir, NULL);
    }
    cJSON_Delete(w->files);
    free(w);
    return st;
}

// ---- reading -------------------------------------------------------------

typedef struct cfile {
    char *name;
    ct_safetensors *st;  // for .safetensors files
    char *data;          // the bytes of any other file (NUL-terminated)
    size_t n;
} cfile;

struct ct_checkpoint {
    char dir[PATH_CAP];
    char name[CT_CHECKPOINT_NAME_MAX];
    int64_t step;
    bool keep;
    int n_files;
    cfile *files;
    const char *state;  // the data of state.json, if any
};

const char *ct_checkpoint_name(const ct_checkpoint *c) { return c->name; }
int64_t ct_checkpoint_step(const ct_checkpoint *c) { return c->step; }
bool ct_checkpoint_kept(const ct_checkpoint *c) { return c->keep; }
const char *ct_checkpoint_state(const ct_checkpoint *c) { return c->state; }
int ct_checkpoint_file_count(const ct_checkpoint *c) { return c->n_files; }

const char *ct_checkpoint_file_name(const ct_checkpoint *c, int i) {
    CT_ASSERT(i >= 0 && i < c->n_files);
    return c->files[i].name;
}

static const cfile *find_file(const ct_checkpoint *c, const char *file) {
    for (int i = 0; i < c->n_files; i++)
        if (!strcmp(c->files[i].name, file)) return &c->files[i];
    return NULL;
}

const ct_safetensors *ct_checkpoint_tensors(const ct_checkpoint *c, const char *file) {
    const cfile *f = find_file(c, file);
    return f ? f->st : NULL;
}

const char *ct_checkpoint_file_bytes(const ct_checkpoint *c, const char *file, size_t *n) {
    const cfile *f = find_file(c, file);
    if (n) *n = f && f->data ? f->n : 0;
    return f ? f->data : NULL;
}

void ct_checkpoint_close(ct_checkpoint *c) {
    if (!c) return;
    for (int i = 0; i < c->n_files; i++) {
        free(c->files[i].name);
        ct_safetensors_close(c->files[i].st);
        free(c->files[i].data);
    }
    free(c->files);
    free(c);
}

// The checksum of st's file did not match: say which tensors hold the damage.
static ct_status corrupt_tensors(const ct_safetensors *st, const mfile *f, uint32_t crc, ct_error *err) {
    char names[256] = "";
    size_t len = 0;
    int bad = 0;
    for (int i = 0; i < f->n_tensors; i++) {
        int k = ct_safetensors_find(st, f->tensor_names[i]);
        bool damaged = k < 0;
        if (!damaged) {
            ct_tensor t = ct_safetensors_tensor(st, k);
            damaged = crc_bytes(t.data, ct_tensor_nbytes(&t)) != f->tensor_crcs[i];
        }
        if (!damaged) continue;
        if (bad++ < 3 && len < sizeof names)
            len += (size_t)snprintf(names + len, sizeof names - len, "%s'%s'", bad > 1 ? ", " : "", f->tensor_names[i]);
    }
    const char *path = ct_safetensors_path(st);
    if (bad == 0)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: crc32 %08" PRIx32 " does not match the manifest's %08" PRIx32
                            ": the header is corrupt (every tensor's data checks)",
                            path, crc, f->crc);
    return ct_error_set(err, CT_ERR_FORMAT,
                        "%s: crc32 %08" PRIx32 " does not match the manifest's %08" PRIx32
                        ": corrupt data in tensor %s%s",
                        path, crc, f->crc, names, bad > 3 ? " and more" : "");
}

static ct_status open_safetensors_file(cfile *cf, const mfile *f, const char *path, ct_error *err) {
    struct stat sb;
    if (stat(path, &sb) != 0)
        return ct_error_set(err, CT_ERR_IO, "%s: listed in the manifest but missing: %s", path, strerror(errno));
    ct_status s = ct_safetensors_open(&cf->st, path, err);
    if ((uint64_t)sb.st_size != f->bytes) {
        char detail[CT_ERROR_MSG_MAX] = "";
        if (s != CT_OK) sfmt(detail, sizeof detail, " (%s)", err ? err->msg : "");
        return ct_error_set(err, CT_ERR_FORMAT, "%s: %lld bytes but the manifest says %" PRIu64 ": %s%s", path,
                            (long long)sb.st_size, f->bytes,
                            (uint64_t)sb.st_size < f->bytes ? "truncated" : "the file changed", detail);
    }
    if (s != CT_OK) {
        uint32_t crc = 0;
        ct_error e2;
        if (err && crc_file(path, &crc, &e2) == CT_OK && crc != f->crc) {
            char msg[CT_ERROR_MSG_MAX];
            memcpy(msg, err->msg, sizeof msg);
            ct_error_set(err, s,
                         "%s (crc32 %08" PRIx32 " does not match the manifest's %08" PRIx32 ": the file is corrupt)",
                         msg, crc, f->crc);
        }
        return s;
    }
    size_t n;
    const void *bytes = ct_safetensors_bytes(cf->st, &n);
    uint32_t crc = crc_bytes(bytes, n);
    if (crc != f->crc) return corrupt_tensors(cf->st, f, crc, err);
    return CT_OK;
}

static ct_status open_plain_file(cfile *cf, const mfile *f, const char *path, ct_error *err) {
    // Never more than the manifest says: a size that differs is reported as
    // such, before anything is allocated.
    struct stat sb;
    if (stat(path, &sb) == 0 && S_ISREG(sb.st_mode) && (uint64_t)sb.st_size != f->bytes)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: %lld bytes but the manifest says %" PRIu64 ": %s", path,
                            (long long)sb.st_size, f->bytes,
                            (uint64_t)sb.st_size < f->bytes ? "truncated" : "the file changed");
    CT_TRY(ct_fs_read_max(path, f->bytes < CT_FS_READ_MAX ? (size_t)f->bytes : CT_FS_READ_MAX, &cf->data, &cf->n,
                          err));
    uint32_t crc = crc_bytes(cf->data, cf->n);
    if (cf->n != f->bytes)
        return ct_error_set(err, CT_ERR_FORMAT, "%s: %zu bytes but the manifest says %" PRIu64 ": %s", path, cf->n,
                            f->bytes, cf->n < f->bytes ? "truncated" : "the file changed");
    if (crc != f->crc)
        return ct_error_set(err, CT_ERR_FORMAT,
                            "%s: crc32 %08" PRIx32 " does not match the manifest's %08" PRIx32 ": corrupt", path, crc,
                            f->crc);
    return CT_OK;
}

ct_status ct_checkpoint_open(ct_checkpoint **out, const char *output_dir, const char *name, ct_error *err) {
    CT_ASSERT(out && output_dir);
    *out = NULL;
    CT_TRY(ct_checkpoint_check_name(name, err));
    ct_checkpoint *c = ct_calloc(1, sizeof *c);  // a fixed size: bookkeeping (memory.h)
    ct_status s = join(c->dir, output_dir, name, err);
    manifest m = {0};
    struct stat sb;
    if (s == CT_OK && stat(c->dir, &sb) != 0)
        s = ct_error_set(err, CT_ERR_IO, "%s: no such checkpoint (%s)", c->dir, strerror(errno));
    else if (s == CT_OK && !S_ISDIR(sb.st_mode))
        s = ct_error_set(err, CT_ERR_IO, "%s: not a checkpoint: not a directory", c->dir);
    if (s == CT_OK) s = manifest_read(c->dir, &m, err);
    if (s == CT_OK && strcmp(m.name, name))
        s = ct_error_set(err, CT_ERR_FORMAT, "%s: the manifest names checkpoint '%s'", c->dir, m.name);
    if (s == CT_OK) {
        snprintf(c->name, sizeof c->name, "%s", name);
        c->step = m.step;
        c->keep = m.keep;
        if (!(c->files = ct_calloc_checked((size_t)m.n_files + 1, sizeof *c->files, err, "%s: %d files", c->dir,
                                           m.n_files)))
            s = CT_ERR_MEMORY;
    }
    for (int i = 0; s == CT_OK && i < m.n_files; i++) {
        const mfile *f = &m.files[i];
        cfile *cf = &c->files[c->n_files++];
        char path[PATH_CAP];
        cf->name = ct_strdup(f->name);  // a plain name (manifest_parse_file): bookkeeping
        s = join(path, c->dir, f->name, err);
        if (s == CT_OK)
            s = ends_with(f->name, ".safetensors") ? open_safetensors_file(cf, f, path, err)
                                                   : open_plain_file(cf, f, path, err);
    }
    if (s == CT_OK) {
        // state.json is parsed by several readers (resume, info, eval): it
        // must say the same thing to each, so duplicate keys are refused here.
        size_t n = 0;
        c->state = ct_checkpoint_file_bytes(c, STATE, &n);
        char path[PATH_CAP];
        ct_error jerr;
        cJSON *j = NULL;
        if (c->state && (s = join(path, c->dir, STATE, err)) == CT_OK && !(j = ct_json_parse(c->state, n, path, &jerr))) {
            if (err) *err = jerr;
            s = jerr.code;
        }
        cJSON_Delete(j);
    }
    manifest_free(&m);
    if (s != CT_OK) {
        ct_checkpoint_close(c);
        return s;
    }
    *out = c;
    return CT_OK;
}

// One request's problem, or "" when it matches.
static ct_load_result check_request(const ct_checkpoint *c, const ct_tensor_request *r, int *st_index,
                                    const cfile **file, char *why, size_t cap) {
    *file = find_file(c, r->file);
    *st_index = -1;
    if (!*file || !(*file)->st) {
        sfmt(why, cap, "%s/%s: no such tensor file (wanted tensor '%s')", c->dir, r->file, r->name);
        return CT_LOAD_MISSING;
    }
    int k = ct_safetensors_find((*file)->st, r->name);
    *st_index = k;
    if (k < 0) {
        sfmt(why, cap, "%s/%s: tensor '%s' is not in the checkpoint", c->dir, r->file, r->name);
        return CT_LOAD_MISSING;
    }
    ct_tensor t = ct_safetensors_tensor((*file)->st, k);
    if (!ct_tensor_same_sig(&t, &r->dest)) {
        char want[CT_SIG_STR_MAX], have[CT_SIG_STR_MAX];
        sfmt(why, cap, "%s/%s: tensor '%s' is %s in the checkpoint, expected %s", c->dir, r->file, r->name,
             ct_tensor_sig_str(&t, have, sizeof have), ct_tensor_sig_str(&r->dest, want, sizeof want));
        return CT_LOAD_MISMATCH;
    }
    return CT_LOAD_PENDING;
}

ct_status ct_checkpoint_load(const ct_checkpoint *c, ct_tensor_request *reqs, int n, ct_load_mode mode, ct_error *err) {
    CT_ASSERT(c && (reqs || n == 0));
    int *index = ct_calloc_checked((size_t)n + 1, sizeof *index, err, "%s: loading %d tensors", c->dir, n);
    // used[f] marks the tensors of file f that were requested (for EXACT).
    bool **used = index ? ct_calloc_checked((size_t)c->n_files + 1, sizeof *used, err, "%s: %d files", c->dir,
                                            c->n_files)
                        : NULL;
    ct_status s = index && used ? CT_OK : CT_ERR_MEMORY;
    int problems = 0, matched = 0;
    char first[CT_ERROR_MSG_MAX] = "", why[CT_ERROR_MSG_MAX];
    for (int i = 0; i < n && s == CT_OK; i++) {
        ct_tensor_request *r = &reqs[i];
        CT_ASSERT(r->file && r->name);
        if (!r->dest.data && ct_tensor_numel(&r->dest) > 0) {
            s = ct_error_set(err, CT_ERR_ARG, "%s: request for tensor '%s' has no destination", c->dir, r->name);
            break;
        }
        const cfile *f;
        r->result = check_request(c, r, &index[i], &f, why, sizeof why);
        if (index[i] >= 0) {  // found by name (a mismatch is reported as such, not as unused)
            int fi = (int)(f - c->files);
            if (!used[fi] && !(used[fi] = ct_calloc_checked((size_t)ct_safetensors_count(f->st) + 1, sizeof **used, err,
                                                            "%s/%s: %d tensors", c->dir, r->file,
                                                            ct_safetensors_count(f->st)))) {
                s = CT_ERR_MEMORY;
                break;
            }
            used[fi][index[i]] = true;
        }
        if (r->result == CT_LOAD_PENDING) {
            matched++;
            continue;
        }
        if (r->result == CT_LOAD_MISMATCH && r->cache) continue;  // recomputed: kept as it is
        if (problems++ == 0) snprintf(first, sizeof first, "%s", why);
        if (mode == CT_LOAD_BY_NAME) ct_log(CT_LOG_WARN, "fine-tuning load: skipped: %s", why);
    }
    // Tensors in the files read from that nobody asked for.
    int unused = 0;
    for (int fi = 0; fi < c->n_files && s == CT_OK; fi++) {
        if (!used[fi]) continue;
        const ct_safetensors *st = c->files[fi].st;
        for (int k = 0; k < ct_safetensors_count(st); k++) {
            if (used[fi][k]) continue;
            unused++;
            sfmt(why, sizeof why, "%s/%s: tensor '%s' is in the checkpoint but was not asked for (the model changed?)",
                 c->dir, c->files[fi].name, ct_safetensors_name(st, k));
            if (mode == CT_LOAD_BY_NAME) ct_log(CT_LOG_WARN, "fine-tuning load: unused: %s", why);
            if (mode == CT_LOAD_EXACT && problems++ == 0) snprintf(first, sizeof first, "%s", why);
        }
    }
    if (s == CT_OK && mode != CT_LOAD_BY_NAME && problems > 0) {
        if (problems > 1) s = ct_error_set(err, CT_ERR_SHAPE, "%s (and %d more problems)", first, problems - 1);
        else s = ct_error_set(err, CT_ERR_SHAPE, "%s", first);
    }
    if (s == CT_OK && mode == CT_LOAD_BY_NAME && n > 0 && matched == 0)
        s = ct_error_set(err, CT_ERR_SHAPE, "%s: none of the %d requested tensors matches (first: %s)", c->dir, n,
                         first);
    if (s == CT_OK) {
        // Everything checked: now, and only now, copy.
        for (int i = 0; i < n; i++) {
            if (reqs[i].result != CT_LOAD_PENDING) continue;
            const cfile *f = find_file(c, reqs[i].file);
            ct_tensor t = ct_safetensors_tensor(f->st, index[i]);
            if (ct_tensor_nbytes(&t) > 0) memcpy(reqs[i].dest.data, t.data, ct_tensor_nbytes(&t));
            reqs[i].result = CT_LOAD_LOADED;
        }
        if (mode == CT_LOAD_BY_NAME && (problems > 0 || unused > 0))
            ct_log(CT_LOG_WARN, "fine-tuning load from %s: %d tensors loaded, %d skipped, %d in the checkpoint unused",
                   c->dir, matched, problems, unused);
    }
    for (int fi = 0; used && fi < c->n_files; fi++) free(used[fi]);
    free(used);
    free(index);
    return s;
}

ct_status ct_checkpoint_read(const char *output_dir, const char *name, ct_tensor_request *reqs, int n,
                             ct_load_mode mode, char **state_json, ct_error *err) {
    if (state_json) *state_json = NULL;
    ct_checkpoint *c;
    CT_TRY(ct_checkpoint_open(&c, output_dir, name, err));
    ct_status s = ct_checkpoint_load(c, reqs, n, mode, err);
    if (s == CT_OK && state_json && c->state &&
        !(*state_json = ct_strdup_checked(c->state, err, "%s/%s", c->dir, STATE)))
        s = CT_ERR_MEMORY;
    ct_checkpoint_close(c);
    return s;
}

// ---- the newest complete checkpoint ---------------------------------------

// The name in <output_dir>/checkpoint; "" if there is no pointer.
static ct_status read_pointer(const char *output_dir, char name[CT_CHECKPOINT_NAME_MAX], ct_error *err) {
    name[0] = '\0';
    char path[PATH_CAP];
    CT_TRY(join(path, output_dir, POINTER, err));
    char *text;
    size_t n;
    if (access(path, F_OK) != 0) return CT_OK;
    CT_TRY(ct_fs_read_max(path, POINTER_MAX, &text, &n, err));
    while (n > 0 && (text[n - 1] == '\n' || text[n - 1] == '\r' || text[n - 1] == ' ')) text[--n] = '\0';
    ct_status s = CT_OK;
    if (ct_checkpoint_check_name(text, NULL) != CT_OK)
        s = ct_error_set(err, CT_ERR_FORMAT, "%s: does not hold a checkpoint name", path);
    else snprintf(name, CT_CHECKPOINT_NAME_MAX, "%s", text);
    free(text);
    return s;
}

// Appends "; msg" to a list of reasons.
static void add_reason(char *buf, size_t cap, const char *msg) {
    size_t len = strlen(buf);
    if (len + 1 < cap) sfmt(buf + len, cap - len, "%s%s", len ? "; " : "", msg);
}

ct_status ct_checkpoint_open_latest(ct_checkpoint **out, const char *output_dir, ct_error *err) {
    CT_ASSERT(out && output_dir);
    *out = NULL;
    char pointer[CT_CHECKPOINT_NAME_MAX], reasons[CT_ERROR_MSG_MAX] = "";
    ct_error e;
    if (read_pointer(output_dir, pointer, &e) != CT_OK) add_reason(reasons, sizeof reasons, e.msg);
    if (pointer[0]) {
        if (ct_checkpoint_open(out, output_dir, pointer, &e) == CT_OK) return CT_OK;
        add_reason(reasons, sizeof reasons, e.msg);
    }
    ct_checkpoint_info *infos;
    int n;
    CT_TRY(ct_checkpoint_list(output_dir, &infos, &n, err));
    int tried = pointer[0] ? 1 : 0;
    for (int i = n - 1; i >= 0; i--) {  // newest first
        // A best checkpoint (lowest_*, highest_*) is a copy, written before
        // its step's own checkpoint: resuming there would skip that one.
        // A checkpoint whose manifest does not read (step -1) is tried too:
        // skipping it would start a fresh run over a damaged one, unreported.
        if (!strcmp(infos[i].name, pointer) || (infos[i].step >= 0 && !infos[i].resume_point)) continue;
        tried++;
        if (ct_checkpoint_open(out, output_dir, infos[i].name, &e) != CT_OK) {
            add_reason(reasons, sizeof reasons, e.msg);
            continue;
        }
        if (pointer[0])
            ct_log(CT_LOG_WARN,
                   "checkpoint: %s/" POINTER " names '%s', which does not load (%s); using '%s' (step %" PRId64
                   ") instead",
                   output_dir, pointer, reasons, infos[i].name, infos[i].step);
        else
            ct_log(CT_LOG_WARN,
                   "checkpoint: %s/" POINTER
                   " is missing or unreadable%s%s; using the newest complete checkpoint '%s' (step %" PRId64 ")",
                   output_dir, reasons[0] ? ": " : "", reasons, infos[i].name, infos[i].step);
        free(infos);
        return CT_OK;
    }
    free(infos);
    if (tried == 0) return CT_OK;  // nothing there: a fresh run
    return ct_error_set(err, CT_ERR_FORMAT, "%s: no checkpoint loads (%d tried): %s", output_dir, tried, reasons);
}

ct_status ct_checkpoint_find_latest(const char *output_dir, char *name, size_t name_cap, ct_error *err) {
    CT_ASSERT(name && name_cap > 0);
    name[0] = '\0';
    ct_checkpoint *c;
    CT_TRY(ct_checkpoint_open_latest(&c, output_dir, err));
    if (!c) return CT_OK;
    ct_status s = CT_OK;
    if ((size_t)snprintf(name, name_cap, "%s", c->name) >= name_cap) {
        name[0] = '\0';
        s = ct_error_set(err, CT_ERR_ARG, "checkpoint name '%s' does not fit in %zu bytes", c->name, name_cap);
    }
    ct_checkpoint_close(c);
    return s;
}

// ---- listing and retention ------------------------------------------------

// Every file the manifest of dir lists is there, of the size it says.
static bool files_present(const char *dir, const manifest *m) {
    for (int i = 0; i < m->n_files; i++) {
        char path[PATH_CAP];
        struct stat sb;
        if (join(path, dir, m->files[i].name, NULL) != CT_OK || stat(path, &sb) != 0 ||
            (uint64_t)sb.st_size != m->files[i].bytes)
            return false;
    }
    return true;
}

static int cmp_info(const void *a, const void *b) {
    const ct_checkpoint_info *x = a, *y = b;
    if (x->step != y->step) return x->step < y->step ? -1 : 1;
    return strcmp(x->name, y->name);
}

ct_status ct_checkpoint_list(const char *output_dir, ct_checkpoint_info **infos, int *n, ct_error *err) {
    CT_ASSERT(output_dir && infos && n);
    *infos = NULL;
    *n = 0;
    DIR *d = opendir(output_dir);
    if (!d) {
        if (errno == ENOENT) return CT_OK;
        return ct_error_set(err, CT_ERR_IO, "%s: cannot list: %s", output_dir, strerror(errno));
    }
    int cap = 0;
    ct_status s = CT_OK;
    struct dirent *de;
    while (s == CT_OK && (de = readdir(d))) {
        if (de->d_name[0] == '.' || ct_checkpoint_check_name(de->d_name, NULL) != CT_OK) continue;
        char dir[PATH_CAP], mpath[PATH_CAP];
        struct stat sb;
        if (join(dir, output_dir, de->d_name, NULL) != CT_OK || join(mpath, dir, MANIFEST, NULL) != CT_OK) continue;
        if (stat(dir, &sb) != 0 || !S_ISDIR(sb.st_mode) || access(mpath, F_OK) != 0) continue;
        if (*n == cap) {
            // As many as the directory holds: the checked path (memory.h).
            size_t bytes = (size_t)(cap ? 2 * cap : 16) * sizeof **infos;
            ct_checkpoint_info *p = cap < INT_MAX / 2 ? realloc(*infos, bytes) : NULL;
            if (!p) {
                s = ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory listing %d checkpoints", output_dir, *n);
                break;
            }
            cap = cap ? 2 * cap : 16;
            *infos = p;
        }
        ct_checkpoint_info *info = &(*infos)[(*n)++];
        memset(info, 0, sizeof *info);
        sfmt(info->name, sizeof info->name, "%s", de->d_name);
        info->step = -1;
        manifest m;
        if (manifest_read(dir, &m, NULL) != CT_OK) continue;  // listed, not complete
        info->step = m.step;
        info->keep = m.keep;
        info->resume_point = m.resume_point;
        info->complete = files_present(dir, &m);
        manifest_free(&m);
    }
    closedir(d);
    if (s != CT_OK) {
        free(*infos);
        *infos = NULL;
        *n = 0;
        return s;
    }
    if (*n > 0) qsort(*infos, (size_t)*n, sizeof **infos, cmp_info);
    return CT_OK;
}

ct_status ct_checkpoint_remove(const char *output_dir, const char *name, ct_error *err) {
    CT_TRY(ct_checkpoint_check_name(name, err));
    char path[PATH_CAP], old[PATH_CAP], base[PATH_CAP];
    CT_TRY(join(path, output_dir, name, err));
    if (access(path, F_OK) != 0) return CT_OK;
    if (!is_checkpoint_dir(path))
        return ct_error_set(err, CT_ERR_IO, "%s is not a checkpoint (no " MANIFEST "): not removing it", path);
    snprintf(base, sizeof base, ".old-%s-%ld", name, (long)getpid());
    CT_TRY(join(old, output_dir, base, err));
    CT_TRY(ct_fs_remove_tree(old, err));
    if (rename(path, old) != 0) {
        if (errno == ENOENT) return CT_OK;
        return ct_error_set(err, CT_ERR_IO, "%s: cannot remove (rename failed: %s)", path, strerror(errno));
    }
    CT_TRY(ct_fs_sync_dir(output_dir, err));
    return ct_fs_remove_tree(old, err);
}

ct_status ct_checkpoint_prune(const char *output_dir, int keep_last, ct_checkpoint_keep_fn keep, void *ctx,
                              ct_error *err) {
    if (keep_last < 0) return CT_OK;
    char pointer[CT_CHECKPOINT_NAME_MAX];
    // A pointer that does not read (damaged, a directory) names no checkpoint
    // to keep, and a run resumed past it (ct_checkpoint_open_latest falls
    // back) writes its best checkpoints before the next one that rewrites
    // it: failing here failed that write, and every rerun the same way.
    // Nothing is removed until the pointer reads again.
    ct_error perr;
    if (read_pointer(output_dir, pointer, &perr) != CT_OK) {
        ct_log(CT_LOG_WARN, "checkpoint: no checkpoint pruned: %s (the next checkpoint to resume from rewrites it)",
               perr.msg);
        return CT_OK;
    }
    ct_checkpoint_info *infos;
    int n;
    CT_TRY(ct_checkpoint_list(output_dir, &infos, &n, err));
    ct_status s = CT_OK;
    int regular_kept = 0;
    // Newest first; a checkpoint whose manifest does not parse (step -1) may
    // not be ours and stays.
    for (int i = n - 1; i >= 0 && s == CT_OK; i--) {
        const ct_checkpoint_info *info = &infos[i];
        if (info->step < 0 || info->keep || (keep && keep(info, ctx))) continue;
        // The pointer's checkpoint always stays, and counts among the
        // keep_last (Trax keeps exactly that many) when it is complete. An
        // incomplete one (a run resumed past it: ct_checkpoint_open_latest
        // falls back) counted, and the checkpoint the run resumed from, the
        // newest that loads, was pruned in its place at the run's next best
        // checkpoint.
        if (!strcmp(info->name, pointer)) {
            if (info->complete) regular_kept++;
            continue;
        }
        if (info->complete && regular_kept < keep_last) {
            regular_kept++;
            continue;
        }
        s = ct_checkpoint_remove(output_dir, info->name, err);
    }
    free(infos);
    return s;
}

// "<prefix...>-<pid>" or ".<file>.tmp-<pid>": the writer's pid, or 0 if the
// entry is not one of ours.
static long leftover_pid(const char *entry) {
    bool ours = !strncmp(entry, ".tmp-", 5) || !strncmp(entry, ".old-", 5) || strstr(entry, ".tmp-");
    if (entry[0] != '.' || !ours) return 0;
    const char *dash = strrchr(entry, '-');
    if (!dash || !dash[1]) return 0;
    char *end;
    long pid = strtol(dash + 1, &end, 10);
    return *end || pid <= 0 ? 0 : pid;
}

// A dead writer's ".old-<name>-<pid>" while <name> is gone: it died between
// moving the old checkpoint aside and renaming the new one in (a file system
// without RENAME_EXCHANGE), or while pruning it. A complete one goes back
// under its name, so the previous good checkpoint is never lost (a pruned
// one is pruned again). Whether it went back.
static bool put_back(const char *output_dir, const char *entry, const char *path) {
    const char *dash = strrchr(entry, '-');
    int len = (int)(dash - entry) - 5;
    char name[CT_CHECKPOINT_NAME_MAX], final[PATH_CAP];
    if (strncmp(entry, ".old-", 5) || len <= 0 || len >= (int)sizeof name) return false;
    snprintf(name, sizeof name, "%.*s", len, entry + 5);
    struct stat sb;
    if (ct_checkpoint_check_name(name, NULL) != CT_OK || join(final, output_dir, name, NULL) != CT_OK ||
        lstat(final, &sb) == 0 || errno != ENOENT)
        return false;
    manifest m;
    if (manifest_read(path, &m, NULL) != CT_OK) return false;
    bool whole = !strcmp(m.name, name) && files_present(path, &m);
    manifest_free(&m);
    if (!whole || rename(path, final) != 0) return false;
    // A pruned one comes back too, and is pruned again: not worth a warning.
    ct_log(CT_LOG_INFO, "checkpoint: %s put back from %s (its writer died replacing or removing it)", final, path);
    return true;
}

// A dead writer's leftovers in output_dir: a set-aside checkpoint goes back
// under its name where it can (put_back); with remove, the rest are removed.
static ct_status sweep_leftovers(const char *output_dir, bool own_too, bool remove, ct_error *err) {
    DIR *d = opendir(output_dir);
    if (!d) {
        if (errno == ENOENT) return CT_OK;
        return ct_error_set(err, CT_ERR_IO, "%s: cannot list: %s", output_dir, strerror(errno));
    }
    ct_status s = CT_OK;
    bool put = false;
    struct dirent *de;
    while ((de = readdir(d))) {
        long pid = leftover_pid(de->d_name);
        const bool own = pid == (long)getpid();
        if (pid == 0 || (own && !own_too)) continue;
        if (!own && (kill((pid_t)pid, 0) == 0 || errno != ESRCH)) continue;  // its writer still runs
        char path[PATH_CAP];
        if (join(path, output_dir, de->d_name, err) != CT_OK) continue;
        if (put_back(output_dir, de->d_name, path)) {
            put = true;
            continue;
        }
        if (!remove) continue;
        ct_status r = ct_fs_remove_tree(path, err);
        if (r != CT_OK) s = r;
    }
    closedir(d);
    if (put && s == CT_OK) s = ct_fs_sync_dir(output_dir, err);
    return s;
}

ct_status ct_checkpoint_clean_tmp(const char *output_dir, bool own_too, ct_error *err) {
    return sweep_leftovers(output_dir, own_too, true, err);
}

ct_status ct_checkpoint_put_back(const char *output_dir, bool own_too, ct_error *err) {
    return sweep_leftovers(output_dir, own_too, false, err);
}
