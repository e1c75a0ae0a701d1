// Helpers the ctrax subcommands share: options, numbers, checkpoints.
#include <cjson/cJSON.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/json.h"
#include "commands.h"

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

int ctrax_parse_int(const char *cmd, const char *opt, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (errno || end == s || *end || v < lo || v > hi) {
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
    if (errno || end == s || *end || !(v >= lo && v <= hi)) {
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

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int ctrax_open_checkpoint(const char *cmd, const char *path, const char *name, ct_checkpoint **out,
                          char **output_dir) {
    *out = NULL;
    if (output_dir) *output_dir = NULL;
    ct_error err = {0};
    struct stat sb;
    if (stat(path, &sb) != 0 || !S_ISDIR(sb.st_mode)) {
        fprintf(stderr, "ctrax %s: %s: %s\n", cmd, path,
                access(path, F_OK) != 0 ? "no such directory" : "not a directory");
        return CTRAX_EXIT_ERROR;
    }
    // dir and base: where the checkpoint lives and its name (base NULL: the newest).
    size_t len = strlen(path);
    char *dir = malloc(len + 1);
    memcpy(dir, path, len + 1);
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
            dir = realloc(dir, n + 2);
            memmove(dir + 1, dir, n + 1);
            slash = dir + 1;
        }
        *slash = '\0';
        base = slash + 1;
    }
    ct_status st = base ? ct_checkpoint_open(out, dir, base, &err) : ct_checkpoint_open_latest(out, dir, &err);
    if (st != CT_OK) {
        fprintf(stderr, "ctrax %s: %s\n", cmd, err.msg);
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

char *ctrax_checkpoint_config(const ct_checkpoint *c, const char **source) {
    size_t n = 0;
    const char *text = ct_checkpoint_file_bytes(c, "config.gin", &n);
    if (text) {
        if (source) *source = "config.gin";
        char *copy = malloc(n + 1);
        memcpy(copy, text, n);
        copy[n] = '\0';
        return copy;
    }
    size_t state_len = 0;
    const char *state = ct_checkpoint_file_bytes(c, "state.json", &state_len);
    cJSON *root = state ? ct_json_parse(state, state_len, "state.json", NULL) : NULL;
    const cJSON *cfg = cJSON_GetObjectItemCaseSensitive(root, "config");
    char *copy = cJSON_IsString(cfg) ? strdup(cfg->valuestring) : NULL;
    cJSON_Delete(root);
    if (source) *source = copy ? "state.json" : NULL;
    return copy;
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

ct_status ctrax_eval_metrics(ct_config *cfg, const char *loss_name, ct_eval_task *ev, ct_error *err) {
    const ct_config_value *list = NULL;
    CT_TRY(ct_config_get_list(cfg, "train", "metrics", "[@WeightedCategoryAccuracy]", &list, err));
    ev->n_metrics = 0;
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

ct_config *ctrax_checkpoint_parse_config(const char *cmd, const ct_checkpoint *c, const char *dir) {
    const char *source;
    char *text = ctrax_checkpoint_config(c, &source);
    if (!text) {
        fprintf(stderr, "ctrax %s: checkpoint %s/%s holds no config, so the model and data are unknown\n", cmd, dir,
                ct_checkpoint_name(c));
        return NULL;
    }
    // Errors name the file as "<dir>/<checkpoint>/config.gin:line:col"
    // (the config keeps its own copy of the name).
    size_t len = strlen(dir) + strlen(ct_checkpoint_name(c)) + strlen(source) + 3;
    char *name = malloc(len);
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
