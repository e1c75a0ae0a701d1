// Data streams: sources and transforms that yield examples or batches, with
// an explicit cursor that a checkpoint saves and a resumed run sets back.
//
// A stream yields items; an item is a small tuple of tensors (ct_batch).
// Sources yield single examples, e.g. for a language model
//   (inputs int32 (T), targets int32 (T), weights f32 (T))
// for IDX images
//   (image f32 (rows, cols), label int32 (), weight f32 ());
// and for arrays in memory (ct_arrays_stream_new) the i-th slices of the
// arrays, e.g. (features f32 (D), label int32 ());
// the batch transform stacks B of them into (B, T) / (B, rows, cols) / (B,).
// Constructors follow the rule of ctrax/ctrax.h: *out is NULL on failure and
// nothing is left allocated. A chain is built from the source up; each
// transform takes ownership of the stream it wraps on every path (when it
// fails, whether on an argument or later, it has freed that stream and every
// stream below it), so a chain needs no cleanup on its error paths:
//
//   ct_stream *s;
//   CT_TRY(ct_text_stream_new(&s, &text_params, err));
//   CT_TRY(ct_epochs_stream_new(&s, s, true, seed, 0, err));
//   CT_TRY(ct_batch_stream_new(&s, s, &batch_params, err));
//   CT_TRY(ct_prefetch_stream_new(&s, s, 2, err));
//   ...
//   ct_stream_free(s);  // frees the whole chain
//
// The cursor and exact resume. Every stream can seek: set itself to the state
// it has after yielding `position` items. A stream's cursor is that position
// (plus a fingerprint of the chain, to catch a cursor restored into a
// different pipeline). Setting a cursor seeks the outermost stream, which
// seeks the one it wraps to the position it needs, and so on down: every
// stage's state is a deterministic function of (its parameters, its seeds,
// its position), so a stream restored to position n yields exactly the items
// an uninterrupted stream yields after its n-th. What a seek costs:
//   sources             O(1) (synthetic examples are pure functions of
//                       (seed, index); files are indexed at open; arrays
//                       are in memory)
//   epochs + shuffle    O(N) to build the permutation of the epoch (N items,
//                       8 bytes each)
//   shuffle buffer      about K ln K hash evaluations (at most the position)
//                       to find which K items the buffer holds, then K reads
//                       of the wrapped stream, in its order
//   batch               one seek of the wrapped stream, then B items read
//                       (with bucketing, one window: W*B items)
//   prefetch            stops and joins its thread, seeks the wrapped stream;
//                       the thread restarts at the next call of next
// Nothing is replayed from the start of the stream. After a failed seek (an
// I/O error) a stream must be seeked again before use.
//
// Errors name the file and the byte (or line) where something is wrong, e.g.
//   "data/train-images-idx3-ubyte.gz: bad magic 0x00000802 at byte 0,
//    expected 0x00000803 (IDX images)".
// Streams are not thread-safe; one thread uses a stream at a time (prefetch
// runs the stream it wraps on its own thread and hands over whole batches).
#ifndef CTRAX_DATA_STREAM_H
#define CTRAX_DATA_STREAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "ctrax/core/error.h"
#include "ctrax/core/tensor.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CT_BATCH_MAX_TENSORS 4

// An item: up to CT_BATCH_MAX_TENSORS tensors. The data belongs to the stream
// that yielded it and stays valid until that stream's next call of next,
// seek, set_cursor or free.
typedef struct ct_batch {
    int n;  // 0: the stream is exhausted (finite streams only)
    ct_tensor t[CT_BATCH_MAX_TENSORS];
} ct_batch;

typedef struct ct_stream ct_stream;

// ---- using a stream ----------------------------------------------------------

// The next item. At the end of a finite stream, returns CT_OK with out->n == 0
// (and keeps doing so).
ct_status ct_stream_next(ct_stream *s, ct_batch *out, ct_error *err);
// Frees the stream and every stream it wraps. NULL is fine.
void ct_stream_free(ct_stream *s);

// The cursor: JSON-friendly integers (both below 2^53, so a JSON number holds
// them exactly). position is the number of items the stream has yielded;
// fingerprint hashes the chain's stages, parameters and sources (their
// sizes; for text and token files also a CRC-32 of sampled blocks, for IDX
// files the labels and first image, for arrays a CRC-32 of all their data).
typedef struct ct_stream_cursor {
    int64_t position;
    int64_t fingerprint;
} ct_stream_cursor;

ct_stream_cursor ct_stream_get_cursor(const ct_stream *s);
// Puts the stream where the cursor says. A fingerprint that is not this
// stream's is an error (CT_ERR_STATE): the cursor came from another pipeline.
ct_status ct_stream_set_cursor(ct_stream *s, ct_stream_cursor cursor, ct_error *err);
// The same without the fingerprint check: the state after `position` items.
ct_status ct_stream_seek(ct_stream *s, int64_t position, ct_error *err);

// Items the stream yields in all, or -1 for an endless stream.
int64_t ct_stream_length(const ct_stream *s);
// The signatures of the items (data NULL); a dim of -1 varies from item to
// item (a sequence length before padding). Returns the number of tensors.
int ct_stream_signature(const ct_stream *s, ct_tensor sigs[CT_BATCH_MAX_TENSORS]);
// A one-line description of the chain, outermost stage first, e.g.
// "prefetch(2) <- batch(8) <- epochs(forever, shuffled, seed 1) <- text(43
// files, 2576674 tokens; train split: 19104 of 20130 chunks of 128)".
// Returns buf.
char *ct_stream_describe(const ct_stream *s, char *buf, size_t len);

// ---- sources -------------------------------------------------------------------
// Synthetic tasks (copy, reverse, addition) are declared in
// ctrax/data/synthetic.h.

// Which part of a corpus a stream reads. A corpus is cut into chunks (one
// example each); chunk c goes to eval when the 32 bits threefry(split_seed,
// c) fall below eval_fraction * 2^32, else to train. The split depends only on
// (split_seed, chunk index), not on the shuffle seed, so train and eval are
// disjoint and complementary whatever else a run changes.
typedef enum ct_data_split {
    CT_DATA_SPLIT_ALL = 0,
    CT_DATA_SPLIT_TRAIN = 1,
    CT_DATA_SPLIT_EVAL = 2,
} ct_data_split;

// A corpus of sequence files: byte-level text, or binary token files.
//
// paths lists files and directories; a directory stands for every file under
// it (recursively, names sorted bytewise, names starting with '.' skipped);
// the files are concatenated in that order into one stream of tokens. A file
// reached twice (a symlink to a file already listed) is read once; empty
// files are skipped. The stream is cut into chunks of seq_len tokens (or
// seq_len + 1 with shifted), back to back from token 0; a tail shorter than a
// chunk is dropped. Each chunk is one example:
//   shifted = false: (inputs = targets = the seq_len tokens, weights = 1),
//                    for models that shift right themselves, as Trax's LMs
//                    (TransformerLM, ReformerLM) do;
//   shifted = true:  inputs = tokens [0, seq_len), targets = [1, seq_len].
// All int32 (seq_len), weights f32 (seq_len). Files are memory-mapped (those
// under 64 KiB are read into memory, so that a directory of 10^5 small files
// does not pass the system's limit on mappings); a stream keeps the index of
// its chunks (8 bytes each).
typedef struct ct_corpus_params {
    const char *const *paths;
    int n_paths;
    int seq_len;           // T, tokens per example
    bool shifted;          // see above
    ct_data_split split;   // CT_DATA_SPLIT_ALL, _TRAIN or _EVAL
    double eval_fraction;  // share of chunks in the eval split
    uint64_t split_seed;   // the split's hash key
    bool skip_binary;      // text: skip files with a NUL byte in their first 8 KiB
                           // (e.g. fortune's .dat index files), like grep
    int token_bytes;       // token files: 2 (uint16) or 4 (uint32), little-endian
    int64_t vocab_size;    // token files: > 0 checks every token is below it
    const char *vocab_size_source;  // if not NULL: where vocab_size was set (a config line),
                                    // for the error a token past it gives, met while training
    bool *empty_split;     // out, if not NULL: set to whether the stream failed because its
                           // split holds no chunk (eval_fraction's doing, not the files'),
                           // for a caller that names the setting to change
} ct_corpus_params;

// seq_len 128, not shifted, CT_DATA_SPLIT_ALL, eval_fraction 0.05, split_seed 0,
// skip_binary true, token_bytes 2, vocab_size 0 (unchecked); no paths, no
// vocab_size_source, no empty_split.
ct_corpus_params ct_corpus_default_params(void);
// Byte-level text (vocabulary 256; token_bytes and vocab_size are ignored).
ct_status ct_text_stream_new(ct_stream **out, const ct_corpus_params *p, ct_error *err);
// Binary token files, tokenized elsewhere (skip_binary is ignored). A file
// whose size is not a multiple of token_bytes is an error.
ct_status ct_token_stream_new(ct_stream **out, const ct_corpus_params *p, ct_error *err);
// The files a corpus stream reads, in order (for logs). NULL for any other
// stream; i in [0, n).
int ct_corpus_n_files(const ct_stream *s);
const char *ct_corpus_file(const ct_stream *s, int i);

// IDX images and labels (MNIST, Fashion-MNIST), gzip-compressed (.gz, through
// zlib) or plain. The images file must be IDX ubyte with 3 dims (magic
// 0x00000803), the labels file IDX ubyte with 1 dim (0x00000801), both the
// same count. Examples: (image f32 (rows, cols) = pixel / 255 (or the raw
// value without scale), label int32 (), weight f32 () = 1). Everything is read
// and checked at open (magic, dims, sizes, trailing bytes, label range).
typedef struct ct_idx_params {
    const char *images_path;
    const char *labels_path;
    int n_classes;  // > 0: every label must be below it
    bool scale;     // pixels / 255 (true) or 0..255 (false)
    bool *labels_failed;  // out, if not NULL: set to whether the stream failed on the
                          // labels file (else on the images or the arguments), for a
                          // caller that names the setting behind the file
} ct_idx_params;

// n_classes 10, scale true; no paths, no labels_failed.
ct_idx_params ct_idx_default_params(void);
ct_status ct_idx_stream_new(ct_stream **out, const ct_idx_params *p, ct_error *err);

// Arrays in memory, as tf.data's Dataset.from_tensor_slices or torch's
// TensorDataset: n (1..CT_BATCH_MAX_TENSORS) f32 or i32 tensors of rank >= 1
// sharing their leading dim N (features (N, D), tokens (N, T), labels (N)).
// Item i is (arrays[0][i], ..., arrays[n-1][i]), each of rank one less: a
// rank-1 array of labels gives labels of rank 0, as the IDX source's. The
// stream is finite (N items) and counts no epochs: wrap it in epochs to
// repeat and shuffle it. ct_epochs_stream_new takes N up to 2^32 (more is
// refused) and counts in 64 bits: n_epochs up to INT64_MAX / N, or forever
// (positions are int64_t: 2^63 - 1 items), each epoch's order drawn from
// the seed and its whole epoch number (epoch 2^32 + e has an order of its
// own, not epoch e's). It seeks in O(1), and yields views into the data
// (no copy per item): an item is read-only (writing into one changes the
// arrays, and so every later epoch and a resumed run's data; the stages of
// stream.h only read).
// Ownership of the data:
//   copy = true   the arrays are copied into the stream (one block of about
//                 their size); the caller may change or free them as soon
//                 as this returns.
//   copy = false  the stream BORROWS the data: the caller keeps every
//                 array's memory alive and unchanged until the stream (and
//                 every stage wrapped around it) is freed. Each array's data
//                 must be aligned to its element size (4 bytes).
// Either way each array's shape must describe its memory: all of it is
// read here. The fingerprint covers the dtypes, the shapes and a CRC-32 of
// every byte (one pass over the data, here), so a checkpoint's cursor saved
// on other data is refused. Fails with CT_ERR_ARG naming the array: n out of
// range, arrays NULL, data NULL, rank 0 or above CT_MAX_DIMS, a dim below 1
// (N = 0 included), leading dims that differ, a dtype other than f32/i32, a
// size that overflows; CT_ERR_MEMORY when the copy cannot be allocated.
// The values are not checked: labels and token ids out of a model's range
// are the model's loss's or embedding's to refuse.
ct_status ct_arrays_stream_new(ct_stream **out, const ct_tensor *arrays, int n, bool copy, ct_error *err);

// ---- transforms ------------------------------------------------------------------
// Each takes ownership of inner on every path: on success the new stage frees
// it with itself; on failure it is freed before the call returns, and *out
// is NULL. inner must not be NULL (a programmer error: CT_ASSERT). The new
// stage borrows nothing.

// Repeats a finite stream of N items for n_epochs (0: forever); with shuffle,
// each epoch is its own permutation, drawn from (seed, epoch) by Fisher-Yates.
// Item p is item perm_{p / N}[p % N] of inner. Seeks inner for every item, so
// inner should seek cheaply (a source, or truncate of one).
ct_status ct_epochs_stream_new(ct_stream **out, ct_stream *inner, bool shuffle, uint64_t seed, int64_t n_epochs,
                               ct_error *err);

// A seeded shuffle buffer of buffer_size items, as tf.data's shuffle: the
// buffer starts with inner's first buffer_size items; item t is taken from
// slot threefry(seed, t) mod (items in the buffer), and the next item of inner
// takes its place; when inner ends the buffer drains. Which inner item sits in
// each slot after t steps follows from the hashes alone, so a seek finds the
// slots' items by hashing backwards (O(K log K)) and reads just those.
ct_status ct_shuffle_stream_new(ct_stream **out, ct_stream *inner, int buffer_size, uint64_t seed, ct_error *err);

// Cuts every tensor of rank >= 1 to at most max_len along dim 0.
ct_status ct_truncate_stream_new(ct_stream **out, ct_stream *inner, int64_t max_len, ct_error *err);

// Batching, padding and bucketing by length.
//
// Stacks batch_size examples into one batch (a new leading dim). A tensor
// whose dim 0 varies between examples (a -1 in the signature) is padded with
// zeros to, in this order of preference: length (if > 0; a longer example is
// an error: truncate first), the smallest boundary >= the longest example (if
// boundaries are given; longer than the last is an error), or the longest
// example rounded up to a multiple of pad_to_multiple. Weights padded with 0
// mask the padding out of weighted losses.
//
// bucket_window W > 0 buckets by length: W*batch_size consecutive examples
// are sorted by length (stably), cut into W batches of similar length, and
// the W batches come out in an order drawn from (seed, window index). This is
// exact and cheap to seek (one window), unlike Trax's bucket_by_length, whose
// buckets hold items over the whole stream.
//
// At the end of a finite stream a partial batch is dropped, or with
// pad_remainder filled up with all-zero rows (weight 0), so an eval pass sees
// every example once with a fixed batch shape.
typedef struct ct_batch_params {
    int batch_size;
    int64_t length;             // > 0: pad variable dims to exactly this
    const int64_t *boundaries;  // ascending pad lengths (bucket boundaries)
    int n_boundaries;
    int pad_to_multiple;  // > 1: round the padded length up to a multiple
    int bucket_window;    // > 0: bucket by length over this many batches
    uint64_t seed;        // order of the batches within a window
    bool pad_remainder;   // fill a final partial batch with zero rows
} ct_batch_params;

// batch_size 32, no length, no boundaries, pad_to_multiple 1, no bucketing,
// seed 0, drop the remainder.
ct_batch_params ct_batch_default_params(void);
ct_status ct_batch_stream_new(ct_stream **out, ct_stream *inner, const ct_batch_params *p, ct_error *err);

// Loss weights, as Trax's add_loss_weights: an item (inputs, targets) gets
// weights = 1 shaped like targets; an item (inputs, targets, weights) keeps
// its weights. With mask_id >= 0 the weights are then multiplied by
// (targets != mask_id), so padding tokens carry no loss.
ct_status ct_weights_stream_new(ct_stream **out, ct_stream *inner, int mask_id, ct_error *err);

// Runs inner on a background thread (pthreads), n_ahead items ahead of the
// caller. It yields exactly the items inner would, in the same order, and its
// cursor counts the items the caller has taken (not those produced ahead).
// An error in inner comes out at the item where it happened. The thread
// starts at the first next and is stopped and joined by a seek and by free.
ct_status ct_prefetch_stream_new(ct_stream **out, ct_stream *inner, int n_ahead, ct_error *err);

#ifdef __cplusplus
}
#endif
#endif
