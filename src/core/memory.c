#include "ctrax/core/memory.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/bulk.h"

#define CT_ALIGN 64
#define CT_ARENA_MIN_BLOCK ((size_t)1 << 20)

static size_t round_up(size_t n, size_t to) { return (n + to - 1) / to * to; }

ct_device ct_device_cpu(void) {
    ct_device dev;
    memset(&dev, 0, sizeof dev);
    dev.kind = CT_DEVICE_CPU;
    return dev;
}

// ---- the machine's memory ---------------------------------------------------

// The value of a "Key:   123 kB" line of /proc/meminfo, in bytes; 0 if
// unknown. read(2) into a stack buffer, no stdio: it runs inside
// ct_device_alloc, which must not allocate anything else (test_noalloc).
static size_t meminfo_bytes(const char *key) {
    char buf[8192];
    int fd = open("/proc/meminfo", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return 0;
    size_t n = 0;
    for (;;) {
        ssize_t r = read(fd, buf + n, sizeof buf - 1 - n);
        if (r <= 0) break;
        n += (size_t)r;
        if (n == sizeof buf - 1) break;
    }
    close(fd);
    buf[n] = '\0';
    size_t klen = strlen(key);
    for (const char *line = buf; *line;) {
        if (!strncmp(line, key, klen) && line[klen] == ':') {
            unsigned long long kb = strtoull(line + klen + 1, NULL, 10);
            return kb > SIZE_MAX / 1024 ? SIZE_MAX : (size_t)kb * 1024;
        }
        const char *nl = strchr(line, '\n');
        if (!nl) break;
        line = nl + 1;
    }
    return 0;
}

size_t ct_machine_memory_bytes(void) {
    // Read once: MemTotal does not change while a process runs. Threads may
    // race to fill it; they all store the same value.
    static size_t cached = SIZE_MAX;
    size_t v = __atomic_load_n(&cached, __ATOMIC_RELAXED);
    if (v == SIZE_MAX) {
        v = meminfo_bytes("MemTotal");
        __atomic_store_n(&cached, v, __ATOMIC_RELAXED);
    }
    return v;
}

size_t ct_machine_available_bytes(void) { return meminfo_bytes("MemAvailable"); }

char *ct_format_bytes(double bytes, char *buf, size_t len) {
    static const char *const units[] = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB", "ZiB", "YiB"};
    if (!(bytes >= 1024.0)) {  // also NaN and negatives
        snprintf(buf, len, "%.0f B", bytes);
        return buf;
    }
    int u = -1;
    while (bytes >= 1024.0 && u < 7) {
        bytes /= 1024.0;
        u++;
    }
    if (bytes >= 10000.0) snprintf(buf, len, "%.3g %s", bytes, units[u]);  // past YiB
    else snprintf(buf, len, "%.1f %s", bytes, units[u]);
    return buf;
}

ct_status ct_host_check_room(double bytes, const char *what, ct_error *err) {
    size_t machine = ct_machine_memory_bytes();
    char need[32], have[32];
    if (machine && bytes > (double)machine)
        return ct_error_set(err, CT_ERR_MEMORY, "%s needs %s; this machine has %s", what,
                            ct_format_bytes(bytes, need, sizeof need),
                            ct_format_bytes((double)machine, have, sizeof have));
    return CT_OK;
}

ct_status ct_device_check_room(const ct_device *dev, double bytes, const char *what, ct_error *err) {
    double used = (double)__atomic_load_n(&dev->current_bytes, __ATOMIC_RELAXED);
    char need[32], have[32];
    ct_format_bytes(bytes, need, sizeof need);
    if (dev->limit_bytes && used + bytes > (double)dev->limit_bytes)
        return ct_error_set(err, CT_ERR_MEMORY, "device memory limit: %s needs %s (%.0f bytes), %.0f of %zu in use",
                            what, need, bytes, used, dev->limit_bytes);
    size_t machine = ct_machine_memory_bytes();
    if (machine && used + bytes > (double)machine)
        return ct_error_set(err, CT_ERR_MEMORY, "%s needs %s (%.0f bytes)%s; this machine has %s", what, need, bytes,
                            used > 0 ? ", on top of what the device holds" : "",
                            ct_format_bytes((double)machine, have, sizeof have));
    return CT_OK;
}

// ---- devices -----------------------------------------------------------------

// Replica threads allocate from one device at once (their arenas grow during
// the first step), so the counters are updated atomically.
// Counts padded bytes more on dev, or fails (nothing counted) when its
// limit or the machine's memory would be passed.
static ct_status device_take(ct_device *dev, size_t padded, const char *what, ct_error *err) {
    size_t now = __atomic_add_fetch(&dev->current_bytes, padded, __ATOMIC_RELAXED);
    if (dev->limit_bytes && now > dev->limit_bytes) {
        __atomic_sub_fetch(&dev->current_bytes, padded, __ATOMIC_RELAXED);
        return ct_error_set(err, CT_ERR_MEMORY, "device memory limit: %s needs %zu bytes, %zu of %zu in use", what,
                            padded, now - padded, dev->limit_bytes);
    }
    size_t machine = ct_machine_memory_bytes();
    if (machine && (now > machine || now < padded)) {
        __atomic_sub_fetch(&dev->current_bytes, padded, __ATOMIC_RELAXED);
        char need[32], have[32];
        return ct_error_set(err, CT_ERR_MEMORY,
                            "%s needs %s (%zu bytes), %zu in use on the device; this machine has %s", what,
                            ct_format_bytes((double)padded, need, sizeof need), padded, now - padded,
                            ct_format_bytes((double)machine, have, sizeof have));
    }
    size_t peak = __atomic_load_n(&dev->peak_bytes, __ATOMIC_RELAXED);
    while (now > peak &&
           !__atomic_compare_exchange_n(&dev->peak_bytes, &peak, now, 1, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
    }
    return CT_OK;
}

ct_status ct_device_alloc(ct_device *dev, size_t bytes, const char *what, void **out, ct_error *err) {
    *out = NULL;
    if (bytes == 0) return CT_OK;
    if (bytes > SIZE_MAX - CT_ALIGN)
        return ct_error_set(err, CT_ERR_MEMORY, "%s needs %zu bytes, more than an address space holds", what, bytes);
    size_t padded = round_up(bytes, CT_ALIGN);
    CT_TRY(device_take(dev, padded, what, err));
    void *p = aligned_alloc(CT_ALIGN, padded);
    if (!p) {
        __atomic_sub_fetch(&dev->current_bytes, padded, __ATOMIC_RELAXED);
        return ct_error_set(err, CT_ERR_MEMORY, "out of memory allocating %zu bytes for %s", padded, what);
    }
    memset(p, 0, padded);
    __atomic_add_fetch(&dev->n_allocs, 1, __ATOMIC_RELAXED);
    *out = p;
    return CT_OK;
}

void ct_device_free(ct_device *dev, void *ptr, size_t bytes) {
    if (!ptr) return;
    size_t padded = round_up(bytes, CT_ALIGN);
    size_t before = __atomic_fetch_sub(&dev->current_bytes, padded, __ATOMIC_RELAXED);
    CT_ASSERT(before >= padded);
    free(ptr);
}

void ct_device_reset_peak(ct_device *dev) { dev->peak_bytes = dev->current_bytes; }

// ---- arena ----------------------------------------------------------------

struct ct_arena_block {
    ct_arena_block *prev;
    size_t cap;   // bytes of data
    size_t used;  // bytes handed out from data
    size_t alloc_bytes;
    unsigned char *data;
};

static ct_status block_new(ct_arena *a, size_t cap, ct_arena_block **out, ct_error *err) {
    void *mem;
    size_t header = round_up(sizeof(ct_arena_block), CT_ALIGN);
    if (cap > SIZE_MAX / 2)  // header + cap would wrap around to a small block
        return ct_error_set(err, CT_ERR_MEMORY, "step arena: %zu bytes, more than an address space holds", cap);
    CT_TRY(ct_device_alloc(a->dev, header + cap, "step arena", &mem, err));
    ct_arena_block *b = mem;
    b->prev = NULL;
    b->cap = cap;
    b->used = 0;
    b->alloc_bytes = header + cap;
    b->data = (unsigned char *)mem + header;
    *out = b;
    return CT_OK;
}

static void block_free(ct_arena *a, ct_arena_block *b) { ct_device_free(a->dev, b, b->alloc_bytes); }

void ct_arena_init(ct_arena *a, ct_device *dev) {
    memset(a, 0, sizeof *a);
    a->dev = dev;
}

void ct_arena_free(ct_arena *a) {
    if (a->measure_base) ct_arena_measure_end(a);
    while (a->head) {
        ct_arena_block *prev = a->head->prev;
        block_free(a, a->head);
        a->head = prev;
    }
    a->used = a->high_water = 0;
}

// Measuring: the next n bytes of the reserved region; the device counts
// the bytes in use beyond what it counted already.
static void *measure_alloc(ct_arena *a, size_t n, ct_error *err) {
    if (n > a->measure_reserved - a->used) {
        ct_error_set(err, CT_ERR_MEMORY, "step arena (planning): needs more than the %zu bytes reserved",
                     a->measure_reserved);
        return NULL;
    }
    if (a->used + n > a->measure_counted) {
        size_t more = a->used + n - a->measure_counted;
        if (device_take(a->dev, more, "step arena (planned)", err) != CT_OK) return NULL;
        a->measure_counted += more;
    }
    void *p = a->measure_base + a->used;
    a->used += n;
    if (a->used > a->high_water) a->high_water = a->used;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

static void *arena_alloc(ct_arena *a, size_t bytes, ct_error *err);

void *ct_arena_alloc(ct_arena *a, size_t bytes, ct_error *err) {
    void *p = arena_alloc(a, bytes, err);
#ifdef __SANITIZE_ADDRESS__
    // ASan cannot see a read of arena memory no one wrote (it is all one
    // allocation): in sanitizer builds it reads as NaN (0xff bytes), so a
    // backward that adds into a gradient it did not zero goes non-finite
    // and the trainer names it.
    if (p) memset(p, 0xff, bytes);
#endif
    return p;
}

static void *arena_alloc(ct_arena *a, size_t bytes, ct_error *err) {
    // Past half the address space, the rounding up below and a block's
    // header would wrap around to a small size.
    if (bytes > SIZE_MAX / 2) {
        ct_error_set(err, CT_ERR_MEMORY, "step arena: %zu bytes, more than an address space holds", bytes);
        return NULL;
    }
    size_t n = round_up(bytes ? bytes : 1, CT_ALIGN);
    if (a->measure_base) return measure_alloc(a, n, err);
    ct_arena_block *b = a->head;
    if (!b || n > b->cap - b->used) {
        size_t cap = CT_ARENA_MIN_BLOCK;
        if (b && 2 * b->cap > cap) cap = 2 * b->cap;
        if (n > cap) cap = n;
        ct_arena_block *nb;
        if (block_new(a, cap, &nb, err) != CT_OK) return NULL;
        nb->prev = b;
        a->head = b = nb;
    }
    void *p = b->data + b->used;
    b->used += n;
    a->used += n;
    if (a->used > a->high_water) a->high_water = a->used;
    if (a->used > a->peak) a->peak = a->used;
    return p;
}

void *ct_arena_calloc(ct_arena *a, size_t bytes, ct_error *err) {
    void *p = ct_arena_alloc(a, bytes, err);
    if (p) ct_bulk_zero(p, bytes);
    return p;
}

ct_arena_mark ct_arena_get_mark(const ct_arena *a) {
    ct_arena_mark m = {a->head, a->head ? a->head->used : 0, a->used};
    return m;
}

void ct_arena_reset_to(ct_arena *a, ct_arena_mark mark) {
    // Blocks chained after the mark only exist while the arena is still
    // growing (the first step); give them back.
    while (a->head != mark.block) {
        CT_ASSERT(a->head);
        ct_arena_block *prev = a->head->prev;
        block_free(a, a->head);
        a->head = prev;
    }
    if (a->head) a->head->used = mark.block_used;
    a->used = mark.used;
}

// The memory handed out since mark, when it is one range: [*base, *top).
static bool since_range(const ct_arena *a, ct_arena_mark mark, unsigned char **base, unsigned char **top) {
    if (a->measure_base) {
        *base = a->measure_base + mark.used;
        *top = a->measure_base + a->used;
        return mark.block == NULL && mark.used <= a->used;
    }
    if (!a->head) return false;
    if (a->head == mark.block) *base = a->head->data + mark.block_used;
    else if (!mark.block && !a->head->prev) *base = a->head->data;  // empty at the mark, one block since
    else return false;
    *top = a->head->data + a->head->used;
    return *base <= *top;
}

bool ct_arena_since(const ct_arena *a, ct_arena_mark mark, const void *p, size_t bytes) {
    unsigned char *base, *top;
    const unsigned char *q = p;
    return q && since_range(a, mark, &base, &top) && q >= base && q < top && bytes <= (size_t)(top - q);
}

// One run of kept bytes, as offsets from the mark: [lo, hi).
typedef struct keep_run {
    size_t lo, hi;
} keep_run;

size_t ct_arena_keep(ct_arena *a, ct_arena_mark mark, void **const *data, const size_t *bytes, int n,
                     size_t min_gain) {
    CT_ASSERT(n >= 0 && n <= CT_ARENA_KEEP_MAX);
    unsigned char *base, *top;
    if (!since_range(a, mark, &base, &top) || top == base) return 0;
    size_t span = (size_t)(top - base);
    // The kept regions as aligned runs (every allocation starts aligned
    // from the mark, so rounding out stays inside what was handed out),
    // sorted by start and merged where they overlap or touch.
    keep_run runs[CT_ARENA_KEEP_MAX];
    int n_runs = 0;
    for (int i = 0; i < n; i++) {
        unsigned char *p = *data[i];
        if (!p || p < base || p >= top) continue;
        size_t lo = (size_t)(p - base) / CT_ALIGN * CT_ALIGN, hi = round_up((size_t)(p - base) + bytes[i], CT_ALIGN);
        CT_ASSERT(hi <= span);  // a region past the top is not something the arena handed out
        int k = n_runs++;
        while (k > 0 && runs[k - 1].lo > lo) {
            runs[k] = runs[k - 1];
            k--;
        }
        runs[k] = (keep_run){lo, hi};
    }
    int merged = 0;
    for (int k = 0; k < n_runs; k++) {
        if (merged > 0 && runs[k].lo <= runs[merged - 1].hi) {
            if (runs[k].hi > runs[merged - 1].hi) runs[merged - 1].hi = runs[k].hi;
        } else {
            runs[merged++] = runs[k];
        }
    }
    size_t kept = 0, moved = 0;
    for (int k = 0; k < merged; k++) {
        if (runs[k].lo != kept) moved += runs[k].hi - runs[k].lo;
        kept += runs[k].hi - runs[k].lo;
    }
    size_t freed = span - kept;
    if (freed == 0 || moved > freed / (min_gain ? min_gain : 1)) return 0;
    // Runs move down in address order, so a destination never overlaps a
    // run still to move; each pointer moves with the run that holds it.
    size_t dest = 0;
    for (int k = 0; k < merged; k++) {
        size_t len = runs[k].hi - runs[k].lo, shift = runs[k].lo - dest;
        if (shift) {
            if (shift >= len) ct_bulk_copy(base + dest, base + runs[k].lo, len);  // apart: the threads copy it
            else memmove(base + dest, base + runs[k].lo, len);
            for (int i = 0; i < n; i++) {
                unsigned char *p = *data[i];
                if (p && p >= base + runs[k].lo && p < base + runs[k].hi) *data[i] = p - shift;
            }
        }
        dest += len;
    }
    a->used -= freed;
    if (!a->measure_base) a->head->used -= freed;
    return freed;
}

void ct_arena_reset(ct_arena *a) {
    if (a->measure_base) {
        if (a->high_water > a->measure_max) a->measure_max = a->high_water;
        a->used = a->high_water = 0;
        return;
    }
    if ((a->head && a->head->prev) || ct_arena_capacity(a) < a->high_water) {
        // The step needed more than one block (perhaps since given back by
        // ct_arena_reset_to): replace them with one block that holds the
        // whole high-water mark, so the next step of the same shapes
        // allocates nothing.
        size_t need = a->high_water;
        ct_arena_free(a);
        ct_arena_block *b;
        if (block_new(a, need, &b, NULL) == CT_OK) a->head = b;
    }
    if (a->head) a->head->used = 0;
    a->used = 0;
    a->high_water = 0;
}

size_t ct_arena_capacity(const ct_arena *a) {
    size_t n = 0;
    for (const ct_arena_block *b = a->head; b; b = b->prev) n += b->cap;
    return n;
}

size_t ct_arena_device_bytes(const ct_arena *a) {
    size_t n = 0;
    for (const ct_arena_block *b = a->head; b; b = b->prev) n += round_up(b->alloc_bytes, CT_ALIGN);
    return n + a->measure_counted;
}

ct_status ct_arena_measure_begin(ct_arena *a, ct_error *err) {
    CT_ASSERT(!a->measure_base);
    ct_arena_free(a);
    // Address space only (MAP_NORESERVE): pages become memory when touched,
    // so the region can be as large as anything the device could hold.
    size_t room = a->dev->limit_bytes ? a->dev->limit_bytes : ct_machine_memory_bytes();
    if (!room) room = (size_t)1 << 40;
    room = round_up(room, 4096);
    void *p = mmap(NULL, room, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED)
        return ct_error_set(err, CT_ERR_MEMORY, "step arena (planning): cannot reserve %zu bytes of address space",
                            room);
    a->measure_base = p;
    a->measure_reserved = room;
    a->measure_counted = a->measure_max = 0;
    return CT_OK;
}

size_t ct_arena_measure_end(ct_arena *a) {
    if (!a->measure_base) return 0;
    size_t most = a->high_water > a->measure_max ? a->high_water : a->measure_max;
    munmap(a->measure_base, a->measure_reserved);
    size_t before = __atomic_fetch_sub(&a->dev->current_bytes, a->measure_counted, __ATOMIC_RELAXED);
    CT_ASSERT(before >= a->measure_counted);
    a->measure_base = NULL;
    a->measure_reserved = a->measure_counted = a->measure_max = 0;
    a->used = a->high_water = 0;
    return most;
}

ct_status ct_arena_reserve(ct_arena *a, size_t bytes, ct_error *err) {
    CT_ASSERT(!a->measure_base && a->used == 0);
    if (bytes == 0 || (a->head && !a->head->prev && a->head->cap >= bytes)) return CT_OK;
    ct_arena_free(a);
    ct_arena_block *b;
    CT_TRY(block_new(a, bytes, &b, err));
    a->head = b;
    return CT_OK;
}

// ---- bookkeeping allocations ---------------------------------------------

void *ct_malloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) ct_abort(__FILE__, __LINE__, "out of memory allocating %zu bytes", bytes);
    return p;
}

void *ct_calloc(size_t n, size_t size) {
    void *p = calloc(n ? n : 1, size ? size : 1);
    if (!p) ct_abort(__FILE__, __LINE__, "out of memory allocating %zu x %zu bytes", n, size);
    return p;
}

void *ct_realloc(void *p, size_t bytes) {
    void *q = realloc(p, bytes ? bytes : 1);
    if (!q) ct_abort(__FILE__, __LINE__, "out of memory reallocating %zu bytes", bytes);
    return q;
}

void ct_free(void *p) { free(p); }

// err gets "<what>: out of memory for N bytes", what from fmt and ap.
static void checked_fail(ct_error *err, double bytes, const char *fmt, va_list ap) {
    char what[CT_ERROR_MSG_MAX / 2];
    vsnprintf(what, sizeof what, fmt, ap);
    ct_error_set(err, CT_ERR_MEMORY, "%s: out of memory for %.0f bytes", what, bytes);
}

void *ct_calloc_checked(size_t n, size_t size, ct_error *err, const char *fmt, ...) {
    void *p = n && size > SIZE_MAX / n ? NULL : calloc(n ? n : 1, size ? size : 1);
    if (!p) {
        va_list ap;
        va_start(ap, fmt);
        checked_fail(err, (double)n * (double)size, fmt, ap);
        va_end(ap);
    }
    return p;
}

char *ct_strdup_checked(const char *s, ct_error *err, const char *fmt, ...) {
    size_t n = strlen(s) + 1;
    char *d = malloc(n);
    if (!d) {
        va_list ap;
        va_start(ap, fmt);
        checked_fail(err, (double)n, fmt, ap);
        va_end(ap);
        return NULL;
    }
    memcpy(d, s, n);
    return d;
}

char *ct_strdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *d = ct_malloc(n);
    memcpy(d, s, n);
    return d;
}
