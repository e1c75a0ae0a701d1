// Devices, the step arena, and allocation accounting.
//
// Every byte a step needs comes from one of three owners: the parameter slabs
// (weights, gradients, optimizer slots, state: one allocation each, laid out
// once at init), the step arena (activations, bump-allocated and reset after
// each step), or the caller. All of them are allocated through a ct_device,
// which counts current and peak bytes, so "device memory" is a measured number
// on every backend. A device can be given a byte limit: an allocation past it
// fails with CT_ERR_MEMORY instead of succeeding.
#ifndef CTRAX_CORE_MEMORY_H
#define CTRAX_CORE_MEMORY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include "ctrax/core/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum ct_device_kind { CT_DEVICE_CPU = 0 } ct_device_kind;

// The counters are updated atomically: threads may share a device.
typedef struct ct_device {
    ct_device_kind kind;
    size_t current_bytes;  // bytes allocated now
    size_t peak_bytes;     // most bytes ever allocated at once
    size_t limit_bytes;    // 0 = no limit
    uint64_t n_allocs;     // allocations made so far (never decreases)
} ct_device;

// A CPU device with zeroed counters and no limit.
ct_device ct_device_cpu(void);

// Allocates bytes (64-byte aligned, zeroed) on dev and counts them. Fails with
// CT_ERR_MEMORY, naming what and the bytes, before calling malloc if the
// device's total would pass its limit or the machine's physical memory (a
// CPU device lives in RAM: more than all of it can only end in swapping or
// the kernel's OOM killer, since the memory is zeroed, so touched, at once),
// and if malloc fails.
ct_status ct_device_alloc(ct_device *dev, size_t bytes, const char *what, void **out, ct_error *err);

// Can dev take `bytes` more (its limit, the machine's memory)? CT_OK, or
// CT_ERR_MEMORY with a message naming what and the bytes, as
// ct_device_alloc's. For callers that make several allocations together
// (a net's slabs) and want to refuse all of them before the first.
ct_status ct_device_check_room(const ct_device *dev, double bytes, const char *what, ct_error *err);

// The machine's physical memory (MemTotal of /proc/meminfo, read once), in
// bytes; 0 if unknown. Budgets compare against it rather than MemAvailable:
// it does not move with the page cache or other processes, so a run that
// fits today fits tomorrow, and nothing larger can ever be held at once.
size_t ct_machine_memory_bytes(void);
// Can the process hold `bytes` more on the host at all (the machine's
// memory)? CT_OK, or CT_ERR_MEMORY: "<what> needs <size>; this machine has
// <size>". For an allocation whose size comes from outside (a file, a
// setting), before making it.
ct_status ct_host_check_room(double bytes, const char *what, ct_error *err);
// MemAvailable of /proc/meminfo now (what the kernel can give without
// swapping), in bytes; 0 if unknown. For warnings, not refusals.
size_t ct_machine_available_bytes(void);
// bytes as "812 B", "5.0 KiB", "12.3 TiB" (binary units, one decimal) into
// buf; returns buf. Any double, however large.
char *ct_format_bytes(double bytes, char *buf, size_t len);
// Frees memory from ct_device_alloc; bytes must be the size it was asked for.
void ct_device_free(ct_device *dev, void *ptr, size_t bytes);
void ct_device_reset_peak(ct_device *dev);

// The step arena: a bump allocator on a device. Unplanned, it grows during
// the first step by chaining blocks, and ct_arena_reset then merges them
// into one block as big as the step's high-water mark, so later steps of the
// same shapes allocate nothing (but the first holds the chain and peaks up
// to twice as high). Planned (the trainers: ct_arena_measure_begin, a
// planning pass, ct_arena_measure_end, ct_arena_reserve), it is that one
// block from the start. Alignment is 64 bytes.
typedef struct ct_arena_block ct_arena_block;
typedef struct ct_arena {
    ct_device *dev;
    ct_arena_block *head;  // current block; older blocks follow ->prev
    size_t used;           // bytes in use over all blocks
    size_t high_water;     // most bytes in use since the last reset
    size_t peak;           // most bytes ever in use
    // Measuring (ct_arena_measure_begin): allocations come from one region
    // of reserved address space instead of blocks; the device counts only
    // the bytes handed out (the pages touched), so a planning pass peaks at
    // what it uses, not at a chain of doubling blocks.
    unsigned char *measure_base;
    size_t measure_reserved;  // bytes of address space reserved
    size_t measure_counted;   // bytes counted on the device
    size_t measure_max;       // the most bytes in use at once while measuring
    // Buffer donation (ct_arena_donate): what the next layer to run may
    // overwrite, and what the running one may.
    const void *donate_next;
    const void *donated;
} ct_arena;

typedef struct ct_arena_mark {
    ct_arena_block *block;
    size_t block_used;
    size_t used;
} ct_arena_mark;

void ct_arena_init(ct_arena *a, ct_device *dev);
void ct_arena_free(ct_arena *a);
// Returns 64-byte aligned, uninitialized memory (in sanitizer builds, 0xff
// bytes: NaN as floats, so a read before a write shows), or NULL with err set.
void *ct_arena_alloc(ct_arena *a, size_t bytes, ct_error *err);
// Like ct_arena_alloc, then zeroed.
void *ct_arena_calloc(ct_arena *a, size_t bytes, ct_error *err);
ct_arena_mark ct_arena_get_mark(const ct_arena *a);
// Frees everything allocated after the mark.
void ct_arena_reset_to(ct_arena *a, ct_arena_mark mark);
// Keeps some of what was allocated since the mark and frees the rest
// (the Serial walks: after each sublayer, what the stack and the new tape
// records point to is all that is still needed of what the walk
// allocated). The n regions
// [*data[i], *data[i] + bytes[i]) that lie in memory handed out since the
// mark move down to it, in address order and each by a multiple of the
// alignment; regions that overlap move together, so a view stays a view of
// its tensor; *data[i] is updated. Regions outside that memory (allocated
// before the mark, or not the arena's) and NULL data stay as they are.
// Everything else since the mark is freed. Nothing happens, and it returns
// 0, when there is nothing to free, when it would free fewer than min_gain
// times the bytes it copies (a copy is time: the caller says what a freed
// byte is worth), or when the arena chained a new block since the mark (an
// unplanned first step). Returns the bytes freed. n <= CT_ARENA_KEEP_MAX;
// allocates nothing.
#define CT_ARENA_KEEP_MAX 64
// Whether [p, p + bytes) lies in memory handed out since the mark (false
// also when the arena chained a new block since).
bool ct_arena_since(const ct_arena *a, ct_arena_mark mark, const void *p, size_t bytes);
size_t ct_arena_keep(ct_arena *a, ct_arena_mark mark, void **const *data, const size_t *bytes, int n,
                     size_t min_gain);

// Buffer donation, as JAX's donate_argnums: the owner of a tensor that
// nobody reads after the next layer runs (a Serial walk, for a sublayer's
// input that the stack and the tape no longer hold) donates its memory,
// and that layer may write its output over it instead of allocating
// (ct_arena_donated(a, in[k].data)): Relu over its Dense's output, Add over
// the residual branch's. Backward the same for a dead output gradient
// (ct_arena_donated(a, grad_out[k].data)): the activations' and
// LayerNorm's input gradient over it, a Select's sum of a residual's two
// gradients (ct_ctx_sum). The layer writes over it only where it returns
// that memory through no other result: a ReversibleHalfResidual passes its
// context (the accumulator's gradient) on, and its f may hand that back, so
// it sums over a donated accumulator (context gradient) only.
// ct_layer_forward (ct_layer_backward) hands a donation to the layer it
// runs alone: ct_arena_take_donation when it starts (the layers it runs in
// turn see none), ct_arena_end_donation when it returns.
static inline void ct_arena_donate(ct_arena *a, const void *p) { a->donate_next = p; }
static inline bool ct_arena_donated(const ct_arena *a, const void *p) { return p && p == a->donated; }
// Makes the pending donation the running layer's; returns the one it
// replaces, for ct_arena_end_donation.
static inline const void *ct_arena_take_donation(ct_arena *a) {
    const void *outer = a->donated;
    a->donated = a->donate_next;
    a->donate_next = NULL;
    return outer;
}
static inline void ct_arena_end_donation(ct_arena *a, const void *outer) { a->donated = outer; }
// Frees everything; merges blocks into one sized for the high-water mark.
void ct_arena_reset(ct_arena *a);
// Capacity reserved on the device by the arena, in bytes.
size_t ct_arena_capacity(const ct_arena *a);
// Bytes the arena's blocks hold on the device (capacity plus block headers,
// padded as ct_device_alloc pads): what it adds to dev->current_bytes.
size_t ct_arena_device_bytes(const ct_arena *a);

// Planning a step's arena before the step (the trainers' planning pass):
// ct_arena_measure_begin frees the arena's blocks and switches it to
// measuring; allocations then work as usual (real, writable memory) but come
// from reserved address space, counted on the device as they are handed out
// (its limit applies: past it, ct_arena_alloc fails with CT_ERR_MEMORY);
// resets keep the most bytes in use at once. ct_arena_measure_end gives the
// space back and returns that most (0 when nothing was allocated).
ct_status ct_arena_measure_begin(ct_arena *a, ct_error *err);
size_t ct_arena_measure_end(ct_arena *a);
// Makes the arena one block of at least bytes (the planned high-water
// mark), so a step that needs no more allocates nothing and the device
// never holds a chain of growing blocks. CT_ERR_MEMORY, naming the bytes,
// when the device cannot take it.
ct_status ct_arena_reserve(ct_arena *a, size_t bytes, ct_error *err);

// The out-of-memory policy, one for all of ctrax:
//  - Bookkeeping (structs, names, lists, small buffers whose size the
//    library chooses or the caller's code fixes): ct_malloc, ct_calloc,
//    ct_realloc, ct_strdup. They abort through the abort handler when
//    memory runs out, since no caller could go on without them.
//  - Memory whose size comes from outside input or from a model (file data,
//    headers and lists read from files, slabs, arenas, batches): a checked
//    path that returns CT_ERR_MEMORY with a message naming what and the
//    bytes (ct_device_alloc, ct_arena_alloc, or malloc + ct_error_set), and
//    sizes are checked against limits before the allocation.
// A raw malloc outside the second case is a bug.
// The checked path for the second case, off any device: calloc of n items
// of size bytes (a product that overflows counts as too much), or NULL with
// CT_ERR_MEMORY in err: "<what>: out of memory for N bytes", what formatted
// from fmt ("x.safetensors: the header's 12 entries").
void *ct_calloc_checked(size_t n, size_t size, ct_error *err, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
// A copy of s on the same checked path.
char *ct_strdup_checked(const char *s, ct_error *err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
void *ct_malloc(size_t bytes);             // aborts on failure
void *ct_calloc(size_t n, size_t size);    // aborts on failure
void *ct_realloc(void *p, size_t bytes);   // aborts on failure
void ct_free(void *p);
char *ct_strdup(const char *s);

#ifdef __cplusplus
}
#endif
#endif
