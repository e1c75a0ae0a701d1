// The subcommands of the ctrax program, one file each (tools/cmd_<name>.c),
// and the few helpers they share (tools/cmd_common.c).
//
// Each command takes its own argv (argv[0] is the command's name, "info"),
// prints its usage to stdout and returns 0 for --help, and returns
//   CTRAX_EXIT_OK     0  done
//   CTRAX_EXIT_ERROR  1  an error (a missing or damaged checkpoint, a bad config, ...)
//   CTRAX_EXIT_USAGE  2  bad usage, with a message on stderr
// Results go to stdout, progress and errors to stderr.
#ifndef CTRAX_TOOLS_COMMANDS_H
#define CTRAX_TOOLS_COMMANDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "ctrax/config/config.h"
#include "ctrax/train/checkpoint.h"
#include "ctrax/train/loop.h"

#define CTRAX_EXIT_OK 0
#define CTRAX_EXIT_ERROR 1
#define CTRAX_EXIT_USAGE 2

// ctrax info CHECKPOINT_DIR_OR_OUTPUT_DIR [--name NAME] | --system [--threads N]
//   step, parameter count, tensors, optimizer, last metrics and config of a checkpoint.
int ctrax_cmd_info(int argc, char **argv);
// ctrax plot METRICS_JSONL_OR_OUTPUT_DIR [-o OUT.svg] [--metrics a,b]
//   an SVG of the train and eval curves in metrics.jsonl.
int ctrax_cmd_plot(int argc, char **argv);
// ctrax sample OUTPUT_DIR [--prompt TEXT | --prompt-file FILE] [--length N] [--temperature T] [--top-k K]
//                          [--seed S] [--context N] [--name NAME] [--raw] [--threads N]
//   text from a byte-level language model checkpoint.
int ctrax_cmd_sample(int argc, char **argv);
// ctrax eval OUTPUT_DIR [--steps N] [--name NAME] [--threads N]
//   the eval metrics of a checkpoint on the config's eval stream.
int ctrax_cmd_eval(int argc, char **argv);

// ---- helpers shared by the commands (tools/cmd_common.c) -----------------------

// One option of a command that takes a value: its spellings (alias NULL
// when it has one), where the value goes (the last one given wins), and an
// optional check, run when the option is read, that returns -1 after
// printing why the value is refused ("ctrax CMD: ...").
typedef struct ctrax_option {
    const char *name, *alias;
    const char **value;
    int (*check)(const char *cmd, const char *value);
} ctrax_option;

// A command's command line: its usage (for --help), its options, and the
// one operand it takes, named in the errors "one OPERAND_KIND at a time
// ('a' and 'b')" and "missing OPERAND_NAME".
typedef struct ctrax_args {
    const char *cmd;
    void (*usage)(FILE *f);
    const ctrax_option *options;
    int n_options;
    const char *operand_kind;  // "checkpoint"
    const char *operand_name;  // "CHECKPOINT_DIR_OR_OUTPUT_DIR"
} ctrax_args;

// Reads argv[1..argc) in order: -h/--help prints the usage to stdout, an
// option of a->options sets its value, anything else not starting with '-'
// is the operand (*operand). Returns -1 when the command is to go on, else
// its exit code: CTRAX_EXIT_OK after --help (CTRAX_EXIT_ERROR when the
// usage could not be written: ctrax_flush_stdout), CTRAX_EXIT_USAGE after a
// message on stderr (an unknown option, a missing or refused value, two
// operands or none).
int ctrax_parse_args(const ctrax_args *a, int argc, char **argv, const char **operand);

// Matches argv[*i] against an option that takes a value, written "--opt V" or
// "--opt=V" (short options only as "-o V"). Returns 1 with *value set (and *i
// moved past a separate value), 0 if argv[*i] is another option, -1 after
// printing "CMD: OPT needs a value" to stderr.
int ctrax_opt_value(const char *cmd, int argc, char **argv, int *i, const char *opt, const char **value);
// Parses an integer in [lo, hi] / a finite number in [lo, hi] given for opt;
// on failure prints "CMD: OPT expects ..." to stderr and returns -1.
int ctrax_parse_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out);
int ctrax_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out);
// Prints "CMD: MSG (see ctrax CMD --help)" to stderr; returns CTRAX_EXIT_USAGE.
int ctrax_usage_error(const char *cmd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

// A size that comes from input, allocated on a checked path (memory.h's
// policy): NULL after "ctrax CMD: out of memory for WHAT (N bytes)" on
// stderr when memory runs out.
void *ctrax_malloc(const char *cmd, size_t bytes, const char *what);
// Room for one more item in items (n used of *cap, each size bytes; NULL
// with *cap 0 to start): the array, moved or not, with *cap doubled from
// first_cap; NULL (items still valid, *cap unchanged) after ctrax_malloc's
// message.
void *ctrax_grow(const char *cmd, void *items, int n, int *cap, size_t size, int first_cap, const char *what);

// Opens a checkpoint given as a path: with a name, <path>/<name>; else path
// itself when it is a checkpoint directory (it holds manifest.json); else the
// newest complete checkpoint of the output directory path. On failure prints
// the reason to stderr ("CMD: ...") and returns CTRAX_EXIT_ERROR; the caller
// closes *out (ctrax_close_checkpoint). *output_dir (if not NULL) gets the
// directory the checkpoint lives in (malloc'ed; free()).
int ctrax_open_checkpoint(const char *cmd, const char *path, const char *name, ct_checkpoint **out,
                          char **output_dir);
// Closes what ctrax_open_checkpoint opened: the checkpoint and its directory
// (either may be NULL).
void ctrax_close_checkpoint(ct_checkpoint *c, char *output_dir);
// The config a checkpoint was trained with: its config.gin file, else
// state.json's "config". CTRAX_EXIT_OK with *text a malloc'ed copy (free()),
// or NULL if it has none, and *source (if not NULL) naming where it came
// from ("config.gin", "state.json"); CTRAX_EXIT_ERROR after a message when
// memory runs out or the config holds a NUL byte (naming
// DIR/<checkpoint>/config.gin, dir the directory it lives in).
int ctrax_checkpoint_config(const char *cmd, const ct_checkpoint *c, const char *dir, char **text,
                            const char **source);
// That config parsed and validated (errors name <dir>/<checkpoint>/config.gin
// and the line); NULL after a message on stderr. ct_config_free it.
ct_config *ctrax_checkpoint_parse_config(const char *cmd, const ct_checkpoint *c, const char *dir);
// n with thousands separators ("1,234,567") into buf; returns buf.
char *ctrax_format_count(int64_t n, char *buf, size_t cap);
// A byte count as "812 B", "5.0 KiB", "1.2 MiB" into buf; returns buf.
char *ctrax_format_bytes(double bytes, char *buf, size_t cap);

// The GEMM kernel and why it was chosen, for the start-up log and `ctrax
// info --system`, into buf ("SkylakeX (vector), chosen from this CPU's
// vector features (OpenBLAS's table of CPU models gave the generic
// Prescott)");
// returns buf. The program's start (tools/ctrax.c) sets OPENBLAS_CORETYPE
// and CTRAX_BLAS_REPLACED when it replaces OpenBLAS's choice by a wider one.
char *ctrax_blas_describe(char *buf, size_t cap);
// The thread count of ctrax's loops and the GEMM and how OpenMP's idle
// threads wait, into buf ("2 ...; idle threads spin, then sleep
// (GOMP_SPINCOUNT=300000)");
// returns buf.
char *ctrax_threads_describe(char *buf, size_t cap);
// The GEMM's speed on this run's threads: C (M, N) = A (M, K) B (K, N) for
// `seconds` (ct_blas_sgemm_gflops), into buf ("151.2 GFLOP/s (M 2048, K
// 512, N 512, 2 threads, 1 s)"); returns buf, or NULL when the operands
// cannot be allocated.
char *ctrax_sgemm_describe(int64_t M, int64_t K, int64_t N, double seconds, char *buf, size_t cap);
// Parses a --threads value (an integer in [1, CTRAX_MAX_THREADS]); -1 after
// "ctrax CMD: --threads expects ..." on stderr.
#define CTRAX_MAX_THREADS 4096
int ctrax_parse_threads(const char *cmd, const char *value, int *out);
// `--threads N` (or --threads=N) at argv[*i], for a command that computes
// (eval, sample, info --system): parsed and applied, the same count for
// ctrax's loops and the GEMM as train's. As ctrax_opt_value: 1 taken, 0
// another argument, -1 after a message. (Each command reads it in its own
// loop, so another option's value, a prompt say, is never taken for it.)
int ctrax_opt_threads(const char *cmd, int argc, char **argv, int *i);
// Writes text from a file someone else may have written (a checkpoint's
// names and config, metric names of metrics.jsonl) to f as it is, but each
// control character as '?' (ct_text_printable's rule, and a newline too):
// a hostile file's escape sequences must not reach the terminal. Returns
// the bytes written.
int ctrax_put_text(FILE *f, const char *s);
// The same rule on s itself, in place: for text kept to be written later
// (the second signal's message, written from the signal handler).
void ctrax_text_shown(char *s);
// Writes "DIR/NAME" of checkpoint c in directory dir to f, each through
// ctrax_put_text: the name is anyone's directory name.
void ctrax_put_checkpoint(FILE *f, const char *dir, const ct_checkpoint *c);
// Flushes stdout: CTRAX_EXIT_OK when everything written to it got out, else
// CTRAX_EXIT_ERROR after "ctrax CMD: writing to stdout failed" on stderr (a
// full disk must not look like complete output; ferror also catches a write
// that failed in an earlier flush, leaving nothing for this one to fail on).
int ctrax_flush_stdout(const char *cmd);

// ---- a memory-mapped file cut short (tools/cmd_sigbus.c) ---------------------------
// Installs the SIGBUS handler: a file mapped into memory that another
// process cut short ends ctrax with exit 1 and a message naming the file
// and the byte, found in /proc/self/maps.
void ctrax_catch_sigbus(void);
// The handler's parse, async-signal-safe: reads /proc/self/maps lines
// (`start-end perms offset dev inode path`) from fd in buf (cap bytes, the
// caller's: no allocation) and, for the file mapping that holds addr,
// writes "\nctrax: PATH was cut short ... byte N of it is gone" to stderr
// (each control character of PATH as '?') and returns 1; else 0. A line
// longer than cap - 1 bytes is looked at by its head (its path then ends in
// "..."); its rest is skipped, never taken for a line.
int ctrax_maps_report(int fd, uint64_t addr, char *buf, size_t cap);

// The eval metrics of a training config, the same for `train` and `eval`:
// the loss (train.loss_fn, reported as "loss"), then each of train.metrics
// (default [@WeightedCategoryAccuracy]) under Trax's name for it
// (WeightedCategoryAccuracy -> "accuracy", SequenceAccuracy ->
// "sequence_accuracy", ...), each once. Fills ev->metrics, metric_names and
// n_metrics; the caller frees the layers (on failure none are left).
ct_status ctrax_eval_metrics(ct_config *cfg, const char *loss_name, ct_eval_task *ev, ct_error *err);

// The name evals build the model by, as Trax's eval_model (train() builds the
// model again in eval mode): "eval/<model>" into buf when the config has
// eval/-scoped bindings (eval/TransformerLM.dropout = 0.0), else model.
// The same for `train`, `eval` and `sample`.
const char *ctrax_eval_model_name(const ct_config *cfg, const char *model, char *buf, size_t cap);

#endif
