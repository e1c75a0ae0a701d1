// Not a command: ctrax's SIGBUS handler (tools/ctrax.c installs it), here
// with its parse of /proc/self/maps so tests/cli_driver.c can run that
// parse on lines a test writes.
//
// Text and token corpora, and a checkpoint's tensors while they are read,
// are mapped into memory. Another process that cuts such a file short (or a
// disk that fails under it) makes the next read of a page past its new end
// fault with SIGBUS, which would end ctrax with no word of why. The handler
// finds the mapping of the faulting address in /proc/self/maps, says which
// file and byte, and exits 1: checkpoints are written whole (a temporary
// directory renamed), so every one on disk is still good. Only
// async-signal-safe calls (open, read, write, _exit, and the string
// functions POSIX.1-2016 lists) and no allocation.
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"

// Writes s to stderr.
static void sigbus_put(const char *s) {
    size_t n = strlen(s);
    while (n > 0) {
        ssize_t w = write(STDERR_FILENO, s, n);
        if (w <= 0) return;
        s += w;
        n -= (size_t)w;
    }
}

// Writes the path s to stderr, each control character as '?' (as
// ctrax_put_text: a file's name is anyone's, its escape sequences must not
// reach the terminal).
static void sigbus_put_path(const char *s) {
    char chunk[256];
    size_t n = 0;
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        chunk[n++] = c < 0x20 || c == 0x7f ? '?' : (char)c;
        if (n == sizeof chunk - 1 || !s[1]) {
            chunk[n] = '\0';
            sigbus_put(chunk);
            n = 0;
        }
    }
}

// Writes v in decimal to stderr.
static void sigbus_put_u64(uint64_t v) {
    char buf[24], *p = buf + sizeof buf;
    *--p = '\0';
    do *--p = (char)('0' + v % 10); while ((v /= 10) > 0);
    sigbus_put(p);
}

// The hex number at *p (moving past it).
static uint64_t sigbus_hex(const char **p) {
    uint64_t v = 0;
    for (;; (*p)++) {
        char c = **p;
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return v;
        v = v * 16 + (uint64_t)d;
    }
}

// If the /proc/self/maps line `start-end perms offset dev inode path`
// maps addr from a file, writes its path and the byte of it, and returns 1.
// A line cut short (the head of one longer than the buffer) is named by the
// start of its path and "...": the fields before the path are whole when
// the path's '/' is reached.
static int sigbus_line(const char *line, uint64_t addr, bool cut) {
    const char *p = line;
    uint64_t start = sigbus_hex(&p);
    if (*p++ != '-') return 0;
    uint64_t end = sigbus_hex(&p);
    if (addr < start || addr >= end) return 0;
    for (int field = 0; field < 2; field++) {  // to perms, to the offset
        while (*p && *p != ' ') p++;
        while (*p == ' ') p++;
    }
    uint64_t offset = sigbus_hex(&p);
    for (int field = 0; field < 3; field++) {  // to dev, to inode, to the path
        while (*p && *p != ' ') p++;
        while (*p == ' ') p++;
    }
    if (*p != '/') return 0;
    sigbus_put("\nctrax: ");
    sigbus_put_path(p);
    if (cut) sigbus_put("...");
    sigbus_put(" was cut short (or became unreadable) while ctrax read it through a memory map: byte ");
    sigbus_put_u64(addr - start + offset);
    sigbus_put(" of it is gone");
    return 1;
}

int ctrax_maps_report(int fd, uint64_t addr, char *buf, size_t cap) {
    size_t have = 0;
    bool rest = false;  // in the rest of a line longer than buf, its head already looked at
    for (;;) {
        ssize_t n = read(fd, buf + have, cap - 1 - have);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return 0;
        have += (size_t)n;
        buf[have] = '\0';
        char *line = buf, *nl;
        while ((nl = strchr(line, '\n')) != NULL) {
            *nl = '\0';
            if (!rest && sigbus_line(line, addr, false)) return 1;
            rest = false;
            line = nl + 1;
        }
        have -= (size_t)(line - buf);  // the partial last line goes to the front
        memmove(buf, line, have);
        if (have == cap - 1) {
            // A line longer than buf: its head holds the address range; the
            // rest, read next, is no line of its own (a path's bytes).
            if (!rest && sigbus_line(buf, addr, true)) return 1;
            rest = true;
            have = 0;
        }
    }
}

static void on_sigbus(int sig, siginfo_t *info, void *context) {
    (void)sig;
    (void)context;
    // si_code <= 0: sent by a process (kill, sigqueue), not a fault; si_addr is not an address then.
    if (info->si_code <= 0) {
        sigbus_put("\nctrax: stopped by a SIGBUS that process ");
        sigbus_put_u64((uint64_t)info->si_pid);
        sigbus_put(" sent (no fault: no file was cut short). Checkpoints on disk are whole: a run resumes from "
                   "its newest.\n");
        _exit(1);
    }
    uint64_t addr = (uint64_t)(uintptr_t)info->si_addr;
    char buf[8192];  // a line of /proc/self/maps (a path is at most PATH_MAX); on the stack: two threads may fault
    int found = 0, fd = open("/proc/self/maps", O_RDONLY | O_CLOEXEC);
    if (fd >= 0) {
        found = ctrax_maps_report(fd, addr, buf, sizeof buf);
        close(fd);
    }
    if (!found) sigbus_put("\nctrax: a file mapped into memory was cut short or became unreadable while in use");
    sigbus_put(" (SIGBUS): stopped. Checkpoints on disk are whole: a run resumes from its newest.\n");
    _exit(1);
}

void ctrax_catch_sigbus(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGBUS, &sa, NULL);
}
