// Helpers the ctrax subcommands share: options, numbers, checkpoints.
#include <cjson/cJSON.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "commands.h"
#include "ctrax/core/blas.h"
#include "ctrax/core/memory.h"

int ctrax_opt_value(const char *cmd, int argc, char **argv, int *i, const char *opt, const char **value) {
    const char *a = argv[*i];
    size_t n = strlen(opt);
    if (strncmp(a, opt, n) != 0) return 0;
    if (a[n] == '=' && opt[1] == '-') {
        *value = a + n + 1;
        return 1;
    }
    if (a[n] != '\0') return 0;
    if (*i + 1 >= argc) {
        fprintf(stderr, "ctrax %s: %s needs a value (see ctrax %s --help)\n", cmd, opt, cmd);
        return -1;
    }
    *value = argv[++*i];
    return 1;
}

// strtoll and strtod skip leading white space and take a '+': "--steps ' 5'"
// (a quoting slip) or "+5" would pass as 5, so a value must start as a
// number is written: a digit, a '-', or for a number a '.'.
static bool starts_as_number(const char *s, bool real) {
    return isdigit((unsigned char)*s) || *s == '-' || (real && *s == '.');
}

int ctrax_parse_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!starts_as_number(s, false) || errno || end == s || *end || v < lo || v > hi) {
        fprintf(stderr, "ctrax %s: %s expects an integer in [%lld, %lld], got '%s'\n", cmd, opt, (long long)lo,
                (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int ctrax_parse_double(const char *cmd, const char *opt, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    // ERANGE also marks an underflow (1e-320, a subnormal): in range, so
    // only an overflow (inf) is refused.
    if (!starts_as_number(s, true) || end == s || *end || !isfinite(v) || !(v >= lo && v <= hi)) {
        fprintf(stderr, "ctrax %s: %s expects a number in [%g, %g], got '%s'\n", cmd, opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int ctrax_usage_error(const char *cmd, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "ctrax %s: ", cmd);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, " (see ctrax %s --help)\n", cmd);
    va_end(ap);
    return CTRAX_EXIT_USAGE;
}

// Reads the option of a->options that argv[*i] is, if any: 1 with its value
// stored (and checked), 0 if argv[*i] is none of them, -1 after a message.
static int read_option(const ctrax_args *a, int argc, char **argv, int *i) {
    for (int k = 0; k < a->n_options; k++) {
        const ctrax_option *o = &a->options[k];
        const char *v;
        int r = ctrax_opt_value(a->cmd, argc, argv, i, o->name, &v);
        if (!r && o->alias) r = ctrax_opt_value(a->cmd, argc, argv, i, o->alias, &v);
        if (!r) continue;
        if (r < 0 || (o->check && o->check(a->cmd, v) < 0)) return -1;
        *o->value = v;
        return 1;
    }
    return 0;
}

int ctrax_parse_args(const ctrax_args *a, int argc, char **argv, const char **operand) {
    *operand = NULL;
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            a->usage(stdout);
            return ctrax_flush_stdout(a->cmd);
        }
        int r = read_option(a, argc, argv, &i);
        if (r < 0) return CTRAX_EXIT_USAGE;
        if (r > 0) continue;
        if (arg[0] == '-' && arg[1]) return ctrax_usage_error(a->cmd, "unknown option '%s'", arg);
        if (*operand)
            return ctrax_usage_error(a->cmd, "one %s at a time ('%s' and '%s')", a->operand_kind, *operand, arg);
        *operand = arg;
    }
    if (!*operand) return ctrax_usage_error(a->cmd, "missing %s", a->operand_name);
    return -1;
}

void *ctrax_malloc(const char *cmd, size_t bytes, const char *what) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) {
        char b[32];
        fprintf(stderr, "ctrax %s: out of memory for %s (%s)\n", cmd, what,
                ct_format_bytes((double)bytes, b, sizeof b));
    }
    return p;
}

void *ctrax_grow(const char *cmd, void *items, int n, int *cap, size_t size, int first_cap, const char *what) {
    if (n < *cap) return items;
    if (*cap > INT_MAX / 2) {
        fprintf(stderr, "ctrax %s: more than %d items in %s\n", cmd, INT_MAX / 2, what);
        return NULL;
    }
    int new_cap = *cap ? 2 * *cap : first_cap;
    void *p = ctrax_malloc(cmd, (size_t)new_cap * size, what);
    if (!p) return NULL;
    if (n) memcpy(p, items, (size_t)n * size);
    free(items);
    *cap = new_cap;
    return p;
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

// After "DIR/NAME: no such checkpoint": the checkpoints DIR does hold, so
// that a --name that was pruned (model_1 of a finished run) or mistyped
// shows what to give instead. At most 8 names: a run with many permanent
// checkpoints would bury the error; `ctrax info DIR` lists them all.
static void put_checkpoints_held(FILE *f, const char *dir) {
    enum { SHOWN = 8 };
    ct_checkpoint_info *infos = NULL;
    int n = 0;
    ct_error err;
    if (ct_checkpoint_list(dir, &infos, &n, &err) != CT_OK) {
        free(infos);
        return;
    }
    fputs("  ", f);
    ctrax_put_text(f, dir);  // anyone's path and names: no escape sequences
    if (n == 0) fputs(" holds no checkpoint", f);
    else fputs(" holds ", f);
    for (int i = 0; i < n && i < SHOWN; i++) {
        if (i) fputs(", ", f);
        ctrax_put_text(f, infos[i].name);
    }
    if (n > SHOWN) fprintf(f, " and %d more (ctrax info lists them)", n - SHOWN);
    fputc('\n', f);
    free(infos);
}

int ctrax_open_checkpoint(const char *cmd, const char *path, const char *name, ct_checkpoint **out,
                          char **output_dir) {
    *out = NULL;
    if (output_dir) *output_dir = NULL;
    ct_error err = {0};
    // A name that cannot be a checkpoint's is a usage error, before any file.
    if (name && ct_checkpoint_check_name(name, &err) != CT_OK) return ctrax_usage_error(cmd, "--name: %s", err.msg);
    // An empty argument (an unset shell variable: "$RUN") names no directory.
    if (!*path) return ctrax_usage_error(cmd, "the directory argument is empty ('')");
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "ctrax %s: %s: %s\n", cmd, path,
                access(path, F_OK) != 0 ? "no such directory" : "not a directory");
        return CTRAX_EXIT_ERROR;
    }
    // dir and base: where the checkpoint lives and its name (base NULL: the newest).
    size_t len = strlen(path);
    char *dir = ct_strdup(path);  // a command-line argument: bookkeeping (memory.h)
    while (len > 1 && dir[len - 1] == '/') dir[--len] = '\0';
    const char *base = name;
    char manifest[4096];
    snprintf(manifest, sizeof manifest, "%s/manifest.json", dir);
    if (!name && is_file(manifest)) {
        // path is a checkpoint directory: split it into its parent and name.
        char *abs = realpath(dir, NULL);
        if (!abs) {
            fprintf(stderr, "ctrax %s: %s: %s\n", cmd, path, strerror(errno));
            free(dir);
            return CTRAX_EXIT_ERROR;
        }
        free(dir);
        dir = abs;
        char *slash = strrchr(dir, '/');
        if (slash == dir) {  // "/name": the parent is "/"
            size_t n = strlen(dir);
            dir = ct_realloc(dir, n + 2);
            memmove(dir + 1, dir, n + 1);
            slash = dir + 1;
        }
        *slash = '\0';
        base = slash + 1;
    }
    ct_status st = base ? ct_checkpoint_open(out, dir, base, &err) : ct_checkpoint_open_latest(out, dir, &err);
    if (st != CT_OK) {
        fprintf(stderr, "ctrax %s: %s\n", cmd, err.msg);
        if (name) {
            char want[4096];
            struct stat ws;
            snprintf(want, sizeof want, "%s/%s", dir, name);
            if (lstat(want, &ws) != 0 && errno == ENOENT) put_checkpoints_held(stderr, dir);
        }
        free(dir);
        return CTRAX_EXIT_ERROR;
    }
    if (!*out) {
        fprintf(stderr,
                "ctrax %s: %s holds no checkpoint (give a training run's output directory, or a checkpoint "
                "directory such as %s/model_100)\n",
                cmd, path, path);
        free(dir);
        return CTRAX_EXIT_ERROR;
    }
    if (output_dir) *output_dir = dir;
    else free(dir);
    return CTRAX_EXIT_OK;
}

void ctrax_close_checkpoint(ct_checkpoint *c, char *output_dir) {
    ct_checkpoint_close(c);
    free(output_dir);
}

// A NUL-terminated copy of the n bytes at text (a file's: checked).
static char *copy_text(const char *cmd, const char *text, size_t n, const char *what) {
    char *copy = ctrax_malloc(cmd, n + 1, what);
    if (copy) {
        memcpy(copy, text, n);
        copy[n] = '\0';
    }
    return copy;
}

int ctrax_checkpoint_config(const char *cmd, const ct_checkpoint *c, const char *dir, char **text,
                            const char **source) {
    const char *from = "config.gin";
    size_t n = 0;
    const char *bytes = ct_checkpoint_file_bytes(c, from, &n);
    cJSON *root = NULL;
    if (!bytes) {
        size_t state_len = 0;
        const char *state = ct_checkpoint_file_bytes(c, "state.json", &state_len);
        root = state ? ct_json_parse(state, state_len, "state.json", NULL) : NULL;
        const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
        from = "state.json";
        bytes = cJSON_IsString(cfg) ? cfg->valuestring : NULL;
        n = bytes ? strlen(bytes) : 0;
    }
    // A NUL would end the text there: the bindings after it silently lost
    // ("binds no train.model" for a model bound below it).
    const char *nul = bytes ? memchr(bytes, '\0', n) : NULL;
    if (nul) {
        fprintf(stderr, "ctrax %s: ", cmd);
        ctrax_put_checkpoint(stderr, dir, c);
        fprintf(stderr, "/%s: a NUL byte at offset %zu: not a config's text\n", from, (size_t)(nul - bytes));
        *text = NULL;
        if (source) *source = NULL;
        cJSON_Delete(root);
        return CTRAX_EXIT_ERROR;
    }
    *text = bytes ? copy_text(cmd, bytes, n, "the checkpoint's config") : NULL;
    cJSON_Delete(root);
    if (source) *source = *text ? from : NULL;
    return bytes && !*text ? CTRAX_EXIT_ERROR : CTRAX_EXIT_OK;
}

char *ctrax_format_count(int64_t n, char *buf, size_t cap) {
    char digits[32];
    snprintf(digits, sizeof digits, "%lld", (long long)(n < 0 ? -n : n));
    size_t nd = strlen(digits), o = 0;
    char tmp[48];
    if (n < 0) tmp[o++] = '-';
    for (size_t i = 0; i < nd; i++) {
        if (i > 0 && (nd - i) % 3 == 0) tmp[o++] = ',';
        tmp[o++] = digits[i];
    }
    tmp[o] = '\0';
    snprintf(buf, cap, "%s", tmp);
    return buf;
}

char *ctrax_format_bytes(double bytes, char *buf, size_t cap) {
    if (bytes < 1024) snprintf(buf, cap, "%.0f B", bytes);
    else if (bytes < 1024.0 * 1024) snprintf(buf, cap, "%.1f KiB", bytes / 1024);
    else if (bytes < 1024.0 * 1024 * 1024) snprintf(buf, cap, "%.1f MiB", bytes / (1024.0 * 1024));
    else snprintf(buf, cap, "%.2f GiB", bytes / (1024.0 * 1024 * 1024));
    return buf;
}

// The name an eval metric is reported under: Trax's names for the usual ones.
static const char *metric_name(const char *configurable) {
    static const char *const table[][2] = {
        {"WeightedCategoryAccuracy", "accuracy"}, {"CategoryAccuracy", "accuracy"},
        {"SequenceAccuracy", "sequence_accuracy"}, {"WeightedCategoryCrossEntropy", "cross_entropy"},
        {"CrossEntropyLoss", "cross_entropy"},     {"L2Loss", "l2_loss"},
    };
    const char *slash = strrchr(configurable, '/');  // "eval/Name": the name
    const char *base = slash ? slash + 1 : configurable;
    for (size_t i = 0; i < sizeof table / sizeof *table; i++)
        if (!strcmp(base, table[i][0])) return table[i][1];
    return base;
}

// Builds the metric layers into ev; on failure frees what it built (ev has none).
static ct_status eval_metrics(ct_config *cfg, const char *loss_name, ct_eval_task *ev, ct_error *err) {
    const ct_config_value *list = NULL;
    CT_TRY(ct_config_get_list(cfg, "train", "metrics", "[@WeightedCategoryAccuracy]", &list, err));
    // The loss again (a layer belongs to one net: a new instance), as "loss".
    CT_TRY(ct_config_build_layer(cfg, loss_name, &ev->metrics[0], err));
    ev->metric_names[0] = "loss";
    ev->n_metrics = 1;
    for (int i = 0; list && i < list->n; i++) {
        const ct_config_value *item = &list->items[i];
        if (item->kind != CT_CONFIG_REFERENCE)
            return ct_error_set(err, CT_ERR_ARG, "%s:%d:%d: train.metrics[%d] is %s, not a reference to a metric",
                                item->file, item->line, item->col, i, ct_config_kind_name(item->kind));
        const char *name = metric_name(item->s);
        bool seen = false;
        for (int m = 0; m < ev->n_metrics; m++) seen |= !strcmp(ev->metric_names[m], name);
        if (seen) continue;
        if (ev->n_metrics == CT_EVAL_MAX_METRICS)
            return ct_error_set(err, CT_ERR_ARG, "%s:%d: train.metrics: at most %d metrics", item->file, item->line,
                                CT_EVAL_MAX_METRICS - 1);
        CT_TRY(ct_config_build_layer(cfg, item->s, &ev->metrics[ev->n_metrics], err));
        ev->metric_names[ev->n_metrics++] = name;
    }
    return CT_OK;
}

const char *ctrax_eval_model_name(const ct_config *cfg, const char *model, char *buf, size_t cap) {
    for (int i = 0; i < ct_config_n_bindings(cfg); i++)
        if (!strncmp(ct_config_binding_at(cfg, i).name, "eval/", 5)) {
            snprintf(buf, cap, "eval/%s", model);
            return buf;
        }
    return model;
}

ct_status ctrax_eval_metrics(ct_config *cfg, const char *loss_name, ct_eval_task *ev, ct_error *err) {
    ev->n_metrics = 0;
    ct_status st = eval_metrics(cfg, loss_name, ev, err);
    if (st != CT_OK) {
        for (int m = 0; m < CT_EVAL_MAX_METRICS; m++) {
            ct_layer_free(ev->metrics[m]);
            ev->metrics[m] = NULL;
        }
        ev->n_metrics = 0;
    }
    return st;
}

ct_config *ctrax_checkpoint_parse_config(const char *cmd, const ct_checkpoint *c, const char *dir) {
    const char *source;
    char *text;
    if (ctrax_checkpoint_config(cmd, c, dir, &text, &source) != CTRAX_EXIT_OK) return NULL;
    if (!text) {
        fprintf(stderr, "ctrax %s: checkpoint ", cmd);
        ctrax_put_checkpoint(stderr, dir, c);
        fputs(" holds no config, so the model and data are unknown\n", stderr);
        return NULL;
    }
    // Errors name the file as "<dir>/<checkpoint>/config.gin:line:col"
    // (the config keeps its own copy of the name).
    size_t len = strlen(dir) + strlen(ct_checkpoint_name(c)) + strlen(source) + 3;
    char *name = ct_malloc(len);  // names: bookkeeping (memory.h)
    snprintf(name, len, "%s/%s/%s", dir, ct_checkpoint_name(c), source);
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    if (ct_config_parse_text(cfg, text, strlen(text), name, &err) != CT_OK || ct_config_validate(cfg, &err) != CT_OK) {
        fprintf(stderr, "ctrax %s: the checkpoint's config: %s\n", cmd, err.msg);
        ct_config_free(cfg);
        cfg = NULL;
    }
    free(name);
    free(text);
    return cfg;
}

char *ctrax_blas_describe(char *buf, size_t cap) {
    const char *core = ct_blas_core(), *replaced = getenv("CTRAX_BLAS_REPLACED"), *better = ct_blas_vector_core();
    const char *kind = ct_blas_core_is_vector(core) ? "vector" : "generic";
    const char *asked = getenv("OPENBLAS_CORETYPE");
    if (replaced && asked)
        snprintf(buf, cap, "%s (%s), chosen from this CPU's vector features (OpenBLAS's table of CPU models gave %s%s)",
                 core, kind, ct_blas_core_is_vector(replaced) ? "the narrower " : "the generic ", replaced);
    else if (asked && strcasecmp(asked, core))
        // OpenBLAS passes over a name it does not have without a word.
        snprintf(buf, cap, "%s (%s): OPENBLAS_CORETYPE=%.40s names no kernel this OpenBLAS has; it chose %s itself",
                 core, kind, asked, core);
    else if (better)
        snprintf(buf, cap, "%s (%s): this CPU could run %s; set OPENBLAS_CORETYPE=%s", core, kind, better, better);
    else snprintf(buf, cap, "%s (%s)", core, kind);
    return buf;
}

char *ctrax_threads_describe(char *buf, size_t cap) {
    const char *policy = getenv("OMP_WAIT_POLICY"), *spin = getenv("GOMP_SPINCOUNT");
    int n = snprintf(buf, cap, "%d for ctrax's loops and the GEMM together", ct_blas_threads());
    if (n < 0 || (size_t)n >= cap) return buf;
    if (policy && !strcasecmp(policy, "passive") && !spin)
        snprintf(buf + n, cap - (size_t)n, "; idle threads sleep (OMP_WAIT_POLICY=passive)");
    else if (!policy && spin && !strcmp(spin, CT_OMP_SPINCOUNT))
        snprintf(buf + n, cap - (size_t)n, "; idle threads spin, then sleep (GOMP_SPINCOUNT=%s)", spin);
    else if (policy || spin)
        snprintf(buf + n, cap - (size_t)n, "; idle threads wait as OMP_WAIT_POLICY=%s GOMP_SPINCOUNT=%s say",
                 policy ? policy : "(unset)", spin ? spin : "(unset)");
    else snprintf(buf + n, cap - (size_t)n, "; idle threads spin (OpenMP's default)");
    return buf;
}

char *ctrax_sgemm_describe(int64_t M, int64_t K, int64_t N, double seconds, char *buf, size_t cap) {
    double gflops = ct_blas_sgemm_gflops(M, N, K, seconds);
    if (gflops < 0) return NULL;
    int threads = ct_blas_threads();
    snprintf(buf, cap, "%.1f GFLOP/s (M %lld, K %lld, N %lld, %d thread%s, %g s)", gflops, (long long)M, (long long)K,
             (long long)N, threads, threads == 1 ? "" : "s", seconds);
    return buf;
}

int ctrax_parse_threads(const char *cmd, const char *value, int *out) {
    int64_t n;
    if (ctrax_parse_int(cmd, "--threads", value, 1, CTRAX_MAX_THREADS, &n) < 0) return -1;
    *out = (int)n;
    return 0;
}

void ctrax_text_shown(char *s) {
    ct_text_printable(s);  // the library's rule
    for (char *p = s; *p; p++)
        if (*p == '\n') *p = '?';  // and one name, one line
}

int ctrax_put_text(FILE *f, const char *s) {
    char *shown = ct_strdup(s);
    ctrax_text_shown(shown);
    fputs(shown, f);
    int n = (int)strlen(shown);
    ct_free(shown);
    return n;
}

void ctrax_put_checkpoint(FILE *f, const char *dir, const ct_checkpoint *c) {
    ctrax_put_text(f, dir);
    fputc('/', f);
    ctrax_put_text(f, ct_checkpoint_name(c));
}

int ctrax_flush_stdout(const char *cmd) {
    if (fflush(stdout) == 0 && !ferror(stdout)) return CTRAX_EXIT_OK;
    fprintf(stderr, "ctrax %s: writing to stdout failed\n", cmd);
    return CTRAX_EXIT_ERROR;
}

int ctrax_opt_threads(const char *cmd, int argc, char **argv, int *i) {
    const char *v;
    int r = ctrax_opt_value(cmd, argc, argv, i, "--threads", &v), n;
    if (r <= 0) return r;
    if (ctrax_parse_threads(cmd, v, &n)) return -1;
    ct_blas_set_threads(n);
    return 1;
}
