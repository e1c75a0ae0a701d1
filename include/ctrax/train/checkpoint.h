// Checkpoints: directories of safetensors files (safetensors.h) written
// atomically and checked on every load.
//
// A checkpoint is a directory <output_dir>/<name>/ that holds
//
//   weights.safetensors, slots.safetensors, ...   any number of tensor files
//   state.json                                    the run's state, as the caller built it
//   manifest.json                                 every other file with its byte size and
//                                                 crc32, the step, and the format version
//
// and <output_dir>/checkpoint is a one-line text file naming the newest
// complete checkpoint. The file set is written into <output_dir>/.tmp-<name>-<pid>/,
// every file and the directory are fsynced, the directory is renamed into place
// (atomically exchanged with an older checkpoint of the same name), the parent
// is fsynced, and only then is the pointer replaced (temporary file, fsync,
// rename, fsync). A process killed at any moment leaves either the old or the
// new checkpoint complete, and the pointer names a complete one or, in the one
// window between the two renames of a replacement on a file system without
// RENAME_EXCHANGE (NFS), a missing one, which ct_checkpoint_open_latest falls
// back from; the old one then waits in .old-<name>-<pid> and the next writer
// puts it back (ct_checkpoint_clean_tmp). An old copy is removed only after
// the directory that no longer names it is fsynced.
//
// Loading never writes a byte into a destination before everything is known to
// be good: every file's size and checksum, every safetensors header, and every
// requested tensor's presence, dtype and shape. A truncated, corrupted or
// mismatched checkpoint is an error that names the file and the tensor.
//
// manifest.json (format version 1):
//
//   {"format": "ctrax-checkpoint", "version": 1, "name": "model_200", "step": 200,
//    "keep": false, "checksum": "crc32",
//    "files": [{"name": "weights.safetensors", "bytes": 5160, "crc32": "1c291ca3",
//               "tensors": {"MLP/Dense[0]/kernel": "9a0b8f1e", ...}},
//              {"name": "state.json", "bytes": 812, "crc32": "0d4c5a77"}]}
//
// crc32 is zlib's (the IEEE 802.3 / gzip polynomial), as 8 lower-case hex
// digits. A safetensors file also gets one crc32 per tensor (over its data
// bytes), so that a checksum mismatch can say which tensor was damaged.
//
// All functions are for one writer per output directory (the chief process);
// readers may run at any time.
#ifndef CTRAX_TRAIN_CHECKPOINT_H
#define CTRAX_TRAIN_CHECKPOINT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"
#include "ctrax/train/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

// ---- writing a checkpoint -------------------------------------------------

#define CT_CHECKPOINT_NAME_MAX 128
#define CT_CHECKPOINT_FORMAT_VERSION 1

typedef struct ct_checkpoint_options {
    int64_t step;         // recorded in the manifest; orders checkpoints (newest = largest step)
    bool keep;            // never removed by ct_checkpoint_prune (permanent, lowest_*, highest_*)
    bool update_pointer;  // make <output_dir>/checkpoint name this one on commit; false: a copy
                          // (a best checkpoint), never resumed from (manifest "resume_point")
} ct_checkpoint_options;

// step 0, keep false, update_pointer true.
ct_checkpoint_options ct_checkpoint_default_options(void);

typedef struct ct_checkpoint_writer ct_checkpoint_writer;

// CT_OK if name can name a checkpoint (1..CT_CHECKPOINT_NAME_MAX-1
// characters, no '/', no leading '.', not "checkpoint"), else CT_ERR_ARG
// with a message saying so.
ct_status ct_checkpoint_check_name(const char *name, ct_error *err);

// Starts the checkpoint <output_dir>/<name>: creates output_dir if needed,
// removes temporary directories that dead writers left there, and makes the
// temporary directory. A name is 1..CT_CHECKPOINT_NAME_MAX-1 characters, has
// no '/', does not start with '.' and is not "checkpoint". opts NULL means the
// defaults.
ct_status ct_checkpoint_writer_begin(ct_checkpoint_writer **out, const char *output_dir, const char *name,
                                     const ct_checkpoint_options *opts, ct_error *err);
// Writes a safetensors file of the checkpoint now (and fsyncs it), so the
// tensors' memory may change as soon as this returns. A file name is a plain
// name (no '/', no leading '.') used once per checkpoint; "manifest.json" is
// taken.
ct_status ct_checkpoint_writer_add_tensors(ct_checkpoint_writer *w, const char *file, const ct_named_tensor *tensors,
                                           int n, const ct_kv *meta, int n_meta, ct_error *err);
// Writes any other file of the checkpoint.
ct_status ct_checkpoint_writer_add_bytes(ct_checkpoint_writer *w, const char *file, const void *data, size_t n,
                                         ct_error *err);
// Writes state.json; json must parse as JSON.
ct_status ct_checkpoint_writer_set_state(ct_checkpoint_writer *w, const char *json, ct_error *err);
// Writes the manifest, fsyncs, renames the checkpoint into place (replacing
// a checkpoint of the same name; a directory of that name without a manifest
// is an error and stays as it is), and updates the pointer if the options say so. Frees
// w whatever the outcome; on failure the temporary directory is removed and
// the previous checkpoints are as they were.
ct_status ct_checkpoint_writer_commit(ct_checkpoint_writer *w, ct_error *err);
// Gives up: removes the temporary directory and frees w. NULL is a no-op.
void ct_checkpoint_writer_abort(ct_checkpoint_writer *w);

// ---- reading a checkpoint -------------------------------------------------

// An opened checkpoint. Opening reads the manifest and checks every file it
// lists: size, crc32, and for .safetensors files the whole header. So once
// open succeeds, loading can fail only on what the caller asks for.
typedef struct ct_checkpoint ct_checkpoint;

ct_status ct_checkpoint_open(ct_checkpoint **out, const char *output_dir, const char *name, ct_error *err);
// Opens the newest complete checkpoint: the one the pointer names if it opens;
// otherwise (a warning through ct_log says why and which one is used instead)
// the complete checkpoint with the largest step among the resume points (not
// the copies written with update_pointer false). *out is NULL with CT_OK when
// output_dir holds no checkpoint at all (or does not exist); it is an error
// when it holds checkpoints and none of them opens.
ct_status ct_checkpoint_open_latest(ct_checkpoint **out, const char *output_dir, ct_error *err);
void ct_checkpoint_close(ct_checkpoint *c);

const char *ct_checkpoint_name(const ct_checkpoint *c);
int64_t ct_checkpoint_step(const ct_checkpoint *c);
bool ct_checkpoint_kept(const ct_checkpoint *c);
// state.json's text, NUL-terminated; NULL if the checkpoint has none.
const char *ct_checkpoint_state(const ct_checkpoint *c);
// A safetensors file of the checkpoint (already checked), NULL if absent.
const ct_safetensors *ct_checkpoint_tensors(const ct_checkpoint *c, const char *file);
// The bytes of a file that is not a safetensors file (NUL-terminated; n may
// be NULL), NULL if absent or a safetensors file.
const char *ct_checkpoint_file_bytes(const ct_checkpoint *c, const char *file, size_t *n);
// Number of files and the i-th file's name (manifest order).
int ct_checkpoint_file_count(const ct_checkpoint *c);
const char *ct_checkpoint_file_name(const ct_checkpoint *c, int i);

// What happened to one requested tensor.
typedef enum ct_load_result {
    CT_LOAD_PENDING = 0,  // matched but not copied (another request failed a strict load)
    CT_LOAD_LOADED,       // copied into dest
    CT_LOAD_MISSING,      // the file or the tensor is not in the checkpoint
    CT_LOAD_MISMATCH,     // present, with another dtype or shape
} ct_load_result;

// A tensor to load: from file (e.g. "weights.safetensors") the tensor called
// name, which must have dest's dtype and shape; its bytes go to dest.data.
typedef struct ct_tensor_request {
    const char *file;
    const char *name;
    ct_tensor dest;
    ct_load_result result;  // set by the load
    // A cache the model recomputes (LSHSelfAttention's buckets, sized for
    // one device's rows): found with another shape, it is left as dest
    // holds it (result CT_LOAD_MISMATCH) instead of failing the load, so a
    // run resumes on another device or process count.
    bool cache;
} ct_tensor_request;

typedef enum ct_load_mode {
    // Resume: every request matches, and every tensor of every file requested
    // from is requested (a tensor nobody asked for means the model changed).
    CT_LOAD_EXACT = 0,
    // Every request matches; the files may hold more.
    CT_LOAD_STRICT,
    // Fine-tuning: loads the requests that match by name, dtype and shape,
    // skips the rest (result says why; a warning lists missing, mismatched and
    // unused tensors). It is an error only if nothing matches.
    CT_LOAD_BY_NAME,
} ct_load_mode;

// Checks every request first and copies only when the mode's conditions all
// hold, so a failed load leaves every destination as it was. The error names
// the checkpoint, the file, the tensor and both signatures.
ct_status ct_checkpoint_load(const ct_checkpoint *c, ct_tensor_request *reqs, int n, ct_load_mode mode, ct_error *err);

// open + load + close. When state_json is not NULL it receives a malloc'ed
// copy of state.json (NULL if there is none); free() it.
ct_status ct_checkpoint_read(const char *output_dir, const char *name, ct_tensor_request *reqs, int n,
                             ct_load_mode mode, char **state_json, ct_error *err);

// The name of the checkpoint ct_checkpoint_open_latest opens (verified the
// same way); "" if there is none.
ct_status ct_checkpoint_find_latest(const char *output_dir, char *name, size_t name_cap, ct_error *err);

// ---- listing and retention ------------------------------------------------

typedef struct ct_checkpoint_info {
    char name[CT_CHECKPOINT_NAME_MAX];
    int64_t step;
    bool keep;          // marked kept when written
    bool resume_point;  // written with update_pointer (a run may resume from it)
    bool complete;      // every listed file present with its size (checksums are not read here)
} ct_checkpoint_info;

// The checkpoints in output_dir (directories with a ctrax manifest; dot
// directories are skipped), by step, then name. *infos is malloc'ed (free());
// a missing output_dir gives none.
ct_status ct_checkpoint_list(const char *output_dir, ct_checkpoint_info **infos, int *n, ct_error *err);

// Return true to keep a checkpoint (e.g. the permanent ones by step).
typedef bool (*ct_checkpoint_keep_fn)(const ct_checkpoint_info *info, void *ctx);

// Removes old checkpoints. Kept: those marked keep when written, those keep()
// accepts (keep may be NULL), the one the pointer names, and the regular
// complete ones with the largest steps up to keep_last in all, the
// pointer's counted among them when it is regular and complete (keep_last <
// 0 keeps all). A pointer that
// does not read keeps them all (a warning; CT_OK): which one it named is not
// known until a commit rewrites it. A checkpoint is removed by renaming it
// to a dot directory first, so a crash never leaves a half-deleted
// checkpoint under its name.
ct_status ct_checkpoint_prune(const char *output_dir, int keep_last, ct_checkpoint_keep_fn keep, void *ctx,
                              ct_error *err);

// Removes the checkpoint <output_dir>/<name> (the same way prune does). A
// missing one is fine; a directory without a manifest is an error and stays.
ct_status ct_checkpoint_remove(const char *output_dir, const char *name, ct_error *err);

// Removes what interrupted writers left in output_dir: the dot directories
// .tmp-<name>-<pid> and .old-<name>-<pid> and the dot files .<file>.tmp-<pid>
// of processes no longer running; but a complete .old-<name>-<pid> whose
// <name> is missing (its writer died between the two renames of a
// replacement, or while pruning it) goes back under <name>.
// ct_checkpoint_writer_begin calls it, and so does a resume of `ctrax
// train` on the chief (one that writes no checkpoint would keep them).
// own_too: this process has written nothing in output_dir yet (a run's
// start, the directory locked), so leftovers under its own pid are an
// earlier process's that had the same pid (in a container every run may be
// pid 1); else they are skipped (the caller's own writes).
ct_status ct_checkpoint_clean_tmp(const char *output_dir, bool own_too, ct_error *err);
// The put-back alone of ct_checkpoint_clean_tmp (same own_too), removing
// nothing: `ctrax train` calls it on the chief before it looks for a
// checkpoint to resume, so a checkpoint a dead writer had set aside is found.
ct_status ct_checkpoint_put_back(const char *output_dir, bool own_too, ct_error *err);

#ifdef __cplusplus
}
#endif
#endif
