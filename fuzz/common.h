// What the libFuzzer harnesses (fuzz/fuzz_*.c) share: a scratch directory
// per process, where a harness writes the input as the file the reader
// under test opens.
#ifndef CTRAX_FUZZ_COMMON_H
#define CTRAX_FUZZ_COMMON_H

#include <stddef.h>
#include <stdint.h>

// The process's scratch directory, made on first use under $TMPDIR (else
// /dev/shm, where fsync costs nothing, else /tmp) and removed at exit
// (kept, and its path printed, when FUZZ_KEEP_DIR is set: to look at what a
// harness wrote, or take seeds from it).
// Silences ct_log below errors: a warning per rejected input is noise.
const char *fuzz_dir(void);
// <fuzz_dir>/<name> into buf (cap bytes); returns buf. Aborts if it does not fit.
char *fuzz_path(char *buf, size_t cap, const char *name);
// Writes n bytes to <fuzz_dir>/<name> (replacing it); returns the path in buf.
// Aborts on failure: that is the harness's problem, not a finding.
char *fuzz_write(char *buf, size_t cap, const char *name, const void *data, size_t n);
// Reads the first n bytes of the data a harness got, as a little-endian
// integer, advancing *data and *size (0 past the end): the harness's own
// knobs (a mode, a length), kept in front of the file's bytes.
uint32_t fuzz_take(const uint8_t **data, size_t *size, int n);
// Touches every byte of p (so ASan checks the whole range); returns a sum
// the caller can ignore.
unsigned fuzz_touch(const void *p, size_t n);

#endif
