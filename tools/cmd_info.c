// ctrax info: what a checkpoint holds.
#define _GNU_SOURCE  // sched_getaffinity, CPU_COUNT
#include <cjson/cJSON.h>
#include <math.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/json.h"
#include "commands.h"
#include "ctrax/core/blas.h"
#include "ctrax/core/memory.h"
#include "ctrax/core/tensor.h"

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrax info CHECKPOINT_DIR_OR_OUTPUT_DIR [--name NAME]\n"
            "       ctrax info --system [--threads N]\n"
            "\n"
            "Shows what a checkpoint holds: its step, parameter count, every tensor\n"
            "(name, dtype, shape), the optimizer and its hyperparameters (with a\n"
            "learning-rate schedule: the schedule and the last rate logged), the last\n"
            "metrics and the config it was trained with. Given a training run's output\n"
            "directory, shows its newest complete checkpoint and lists the others.\n"
            "\n"
            "options:\n"
            "  --name NAME   the checkpoint NAME of the output directory (model_200,\n"
            "                lowest_loss, ...) instead of the newest\n"
            "  --system      instead: this machine's CPU, its vector features, the GEMM\n"
            "                backend and kernel, the thread count and a 1-second sgemm\n"
            "                measurement (M 2048, K 512, N 512) in GFLOP/s\n"
            "  --threads N   threads for --system's sgemm (default OMP_NUM_THREADS, else\n"
            "                every core)\n"
            "  -h, --help    show this help\n");
}

// "[10, 16]"
static char *shape_str(const ct_tensor *t, char *buf, size_t cap) {
    size_t o = (size_t)snprintf(buf, cap, "[");
    for (int d = 0; d < t->ndim && o < cap; d++)
        o += (size_t)snprintf(buf + o, cap - o, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (o < cap) snprintf(buf + o, cap - o, "]");
    return buf;
}

// The safetensors name of a dtype.
static const char *st_dtype(ct_dtype d) {
    switch (d) {
    case CT_DTYPE_F32: return "F32";
    case CT_DTYPE_I32: return "I32";
    case CT_DTYPE_BF16: return "BF16";
    }
    return "?";
}

static int64_t total_elements(const ct_safetensors *st, size_t *bytes) {
    int64_t n = 0;
    *bytes = 0;
    for (int i = 0; st && i < ct_safetensors_count(st); i++) {
        ct_tensor t = ct_safetensors_tensor(st, i);
        n += ct_tensor_numel(&t);
        *bytes += ct_tensor_nbytes(&t);
    }
    return n;
}

// The tensors weights.safetensors' "state_tensors" metadata names (one per
// line; the layers' state, not trained): their count, elements and bytes.
// Names the file lacks, or names twice, count once or not at all.
static int state_elements(const ct_safetensors *w, int64_t *n, size_t *bytes) {
    *n = 0, *bytes = 0;
    const char *names = ct_safetensors_metadata(w, "state_tensors");
    if (!names) return 0;
    bool *seen = ct_calloc((size_t)ct_safetensors_count(w) + 1, sizeof *seen);
    int count = 0;
    char *list = ct_strdup(names), *save = NULL;
    for (char *name = strtok_r(list, "\n", &save); name; name = strtok_r(NULL, "\n", &save)) {
        int i = ct_safetensors_find(w, name);
        if (i < 0 || seen[i]) continue;
        seen[i] = true;
        ct_tensor t = ct_safetensors_tensor(w, i);
        *n += ct_tensor_numel(&t), *bytes += ct_tensor_nbytes(&t), count++;
    }
    ct_free(list);
    ct_free(seen);
    return count;
}

// The learning-rate schedule the run's config binds (train.lr_schedule_fn:
// ctrax train's operative config always does), or NULL: None, unbound (a
// program's own Loop may pass any config text), or no config that parses
// (the config section below then says why). text: the checkpoint's config
// from source (NULL: none). The name lives in a static buffer.
static const char *run_schedule(const char *text, const char *source) {
    static char name[128];
    if (!text) return NULL;
    ct_config *cfg = ct_config_new();
    ct_error err = {0};
    const char *sched = NULL;
    char where[300] = "";
    if (ct_config_parse_text(cfg, text, strlen(text), source, &err) == CT_OK && ct_config_validate(cfg, &err) == CT_OK)
        ct_config_where(cfg, "train", "lr_schedule_fn", where, sizeof where);
    if (where[0] && ct_config_get_reference(cfg, "train", "lr_schedule_fn", NULL, &sched, &err) == CT_OK && sched)
        snprintf(name, sizeof name, "%s", sched);
    ct_config_free(cfg);
    return sched ? name : NULL;
}

// The last training/learning_rate row of state.json's history, or NULL.
static const cJSON *last_learning_rate(const cJSON *state) {
    const cJSON *row, *last = NULL;
    cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(state, "history")) {
        const cJSON *metric = cJSON_GetArrayItem(row, 1);
        if (cJSON_IsString(metric) && !strcmp(metric->valuestring, "training/learning_rate") &&
            cJSON_IsNumber(cJSON_GetArrayItem(row, 2)) && cJSON_IsNumber(cJSON_GetArrayItem(row, 3)))
            last = row;
    }
    return last;
}

// The optimizer and its hyperparameters. With a schedule, the optimizer's
// learning_rate is not the rate it ran at (the schedule sets the rate every
// step): that line says the schedule and the last rate logged instead.
static void print_optimizer(const ct_checkpoint *c, const cJSON *state, const char *config, const char *source) {
    const ct_safetensors *slots = ct_checkpoint_tensors(c, "slots.safetensors");
    const char *name = slots ? ct_safetensors_metadata(slots, "optimizer") : NULL;
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(state, "optimizer");
    const cJSON *oname = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (!name && cJSON_IsString(oname)) name = oname->valuestring;
    printf("optimizer    ");
    ctrax_put_text(stdout, name ? name : "(not recorded)");
    const char *schedule = run_schedule(config, source);
    const cJSON *p, *params = cJSON_GetObjectItemCaseSensitive(o, "params");
    int k = 0;
    // Only an object's members have names ("params": [1] has none).
    if (cJSON_IsObject(params))
        cJSON_ArrayForEach(p, params) {
            if (cJSON_IsNumber(p) && !(schedule && !strcmp(p->string, "learning_rate"))) {
                printf("%s", k++ ? ", " : ": ");
                ctrax_put_text(stdout, p->string);
                printf(" %.6g", p->valuedouble);
            }
        }
    if (slots) {
        size_t bytes;
        char a[32], b[32];
        int64_t n = total_elements(slots, &bytes);
        printf("; slots %s floats in %d tensors (%s)", ctrax_format_count(n, a, sizeof a),
               ct_safetensors_count(slots), ctrax_format_bytes((double)bytes, b, sizeof b));
    }
    printf("\n");
    if (schedule) {
        const cJSON *lr = last_learning_rate(state);
        printf("schedule     %s sets the learning rate each step", schedule);
        if (lr)
            printf(": %.6g at step %.0f (the last logged)", cJSON_GetArrayItem(lr, 3)->valuedouble,
                   cJSON_GetArrayItem(lr, 2)->valuedouble);
        printf("\n");
    }
}

// The last value of each (mode, metric) of state.json's history, metrics/* only.
#define MAX_SHOWN 64
static void print_last_metrics(const cJSON *state) {
    const cJSON *last[MAX_SHOWN];  // the last row of each (mode, metric), in order of first appearance
    int n = 0;
    const cJSON *row;
    cJSON_ArrayForEach(row, cJSON_GetObjectItemCaseSensitive(state, "history")) {
        const cJSON *mode = cJSON_GetArrayItem(row, 0), *metric = cJSON_GetArrayItem(row, 1);
        if (!cJSON_IsString(mode) || !cJSON_IsString(metric) || !cJSON_IsNumber(cJSON_GetArrayItem(row, 2)) ||
            strncmp(metric->valuestring, "metrics/", 8) != 0)
            continue;
        int k = 0;
        while (k < n && (strcmp(cJSON_GetArrayItem(last[k], 0)->valuestring, mode->valuestring) ||
                         strcmp(cJSON_GetArrayItem(last[k], 1)->valuestring, metric->valuestring)))
            k++;
        if (k == n && n == MAX_SHOWN) continue;
        if (k == n) n++;
        last[k] = row;
    }
    for (int k = 0; k < n; k++) {
        const cJSON *value = cJSON_GetArrayItem(last[k], 3);
        printf("%s ", k ? "            " : "last metrics");
        int w = ctrax_put_text(stdout, cJSON_GetArrayItem(last[k], 0)->valuestring);
        printf("%*s ", w < 5 ? 5 - w : 0, "");
        ctrax_put_text(stdout, cJSON_GetArrayItem(last[k], 1)->valuestring + 8);
        printf(" = ");
        if (cJSON_IsNumber(value)) printf("%.6g", value->valuedouble);
        else printf("nan");
        printf(" (step %.0f)\n", cJSON_GetArrayItem(last[k], 2)->valuedouble);  // a double: any value prints
    }
}

static void print_checkpoint_list(const char *dir, const char *current) {
    ct_checkpoint_info *infos = NULL;
    int n = 0;
    ct_error err;
    if (ct_checkpoint_list(dir, &infos, &n, &err) != CT_OK || n <= 1) {
        free(infos);
        return;
    }
    // The names are the directory's: anyone's (escape sequences as '?').
    printf("checkpoints ");
    for (int i = 0; i < n; i++) {
        putchar(' ');
        ctrax_put_text(stdout, infos[i].name);
        printf(" (step %lld%s%s%s)%s", (long long)infos[i].step, infos[i].keep ? ", kept" : "",
               infos[i].complete ? "" : ", INCOMPLETE", strcmp(infos[i].name, current) ? "" : ", shown here",
               i + 1 < n ? "," : "\n");
    }
    free(infos);
}

// The optimizer part of state.json as ctrax writes it: {"name": string,
// "params": {name: number, ...}}. NULL if it is, else the field that is not.
static const char *bad_optimizer_field(const cJSON *state) {
    const cJSON *o = cJSON_GetObjectItemCaseSensitive(state, "optimizer");
    if (!o) return NULL;  // an older or foreign state: nothing to show
    if (!cJSON_IsObject(o)) return "optimizer";
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(o, "name");
    if (name && !cJSON_IsString(name)) return "optimizer.name";
    const cJSON *params = cJSON_GetObjectItemCaseSensitive(o, "params"), *p;
    if (!params) return NULL;
    if (!cJSON_IsObject(params)) return "optimizer.params";
    cJSON_ArrayForEach(p, params) {
        if (!cJSON_IsNumber(p)) return "optimizer.params (a value that is not a number)";
    }
    return NULL;
}

// The files of the checkpoint and their sizes, on one line.
static void print_files(const ct_checkpoint *c) {
    char b[32];
    printf("files       ");
    for (int i = 0; i < ct_checkpoint_file_count(c); i++) {
        const char *f = ct_checkpoint_file_name(c, i);
        const ct_safetensors *st = ct_checkpoint_tensors(c, f);
        size_t n = 0;
        if (st) ct_safetensors_bytes(st, &n);
        else ct_checkpoint_file_bytes(c, f, &n);
        printf(" %s (%s)%s", f, ctrax_format_bytes((double)n, b, sizeof b),
               i + 1 < ct_checkpoint_file_count(c) ? "," : "");
    }
    printf("\n");
}

// Every tensor of every safetensors file but the slots (one flat tensor per
// weight, named like it: the optimizer line sums them).
static void print_tensors(const ct_checkpoint *c) {
    for (int f = 0; f < ct_checkpoint_file_count(c); f++) {
        const char *file = ct_checkpoint_file_name(c, f);
        const ct_safetensors *st = ct_checkpoint_tensors(c, file);
        if (!st || !strcmp(file, "slots.safetensors")) continue;
        int n = ct_safetensors_count(st);
        printf("\ntensors (%s): %d\n", file, n);
        printf("  %-5s  %-16s  %10s  %s\n", "dtype", "shape", "elements", "name");
        for (int i = 0; i < n; i++) {
            ct_tensor t = ct_safetensors_tensor(st, i);
            char s[CT_SIG_STR_MAX], a[32];
            printf("  %-5s  %-16s  %10s  ", st_dtype(t.dtype), shape_str(&t, s, sizeof s),
                   ctrax_format_count(ct_tensor_numel(&t), a, sizeof a));
            ctrax_put_text(stdout, ct_safetensors_name(st, i));
            printf("\n");
        }
    }
}

// The config the checkpoint was trained with (from source; NULL: none),
// indented line by line. Writes its lines over config.
static void print_config(char *config, const char *source) {
    if (!config) {
        printf("\nconfig: none saved (the run gave the Loop no config text)\n");
        return;
    }
    printf("\nconfig (%s):\n", source);
    for (char *line = config, *next; line && *line; line = next) {
        next = strchr(line, '\n');
        if (next) *next++ = '\0';
        if (*line) printf("  ");
        ctrax_put_text(stdout, line);
        printf("\n");
    }
}

// Step, parameters, optimizer, seed, devices and last metrics.
static void print_summary(const ct_checkpoint *c, const char *dir, const cJSON *state, const char *config,
                          const char *source) {
    printf("checkpoint   ");
    ctrax_put_checkpoint(stdout, dir, c);  // the newest of the directory: anyone's name
    printf("\n");
    printf("step         %lld\n", (long long)ct_checkpoint_step(c));
    if (ct_checkpoint_kept(c)) printf("kept         yes (permanent or best: never pruned)\n");
    print_checkpoint_list(dir, ct_checkpoint_name(c));
    const ct_safetensors *w = ct_checkpoint_tensors(c, "weights.safetensors");
    if (w) {
        size_t bytes;
        char a[32], b[32];
        int64_t n = total_elements(w, &bytes), n_state;
        size_t state_bytes;
        int state = state_elements(w, &n_state, &state_bytes);
        printf("parameters   %s in %d tensors (%s)\n", ctrax_format_count(n - n_state, a, sizeof a),
               ct_safetensors_count(w) - state, ctrax_format_bytes((double)(bytes - state_bytes), b, sizeof b));
        if (state)
            printf("state        %s in %d tensors (%s; the layers' state, not trained)\n",
                   ctrax_format_count(n_state, a, sizeof a), state,
                   ctrax_format_bytes((double)state_bytes, b, sizeof b));
    } else {
        printf("parameters   (no weights.safetensors)\n");
    }
    print_optimizer(c, state, config, source);
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(state, "seed");
    const cJSON *devices = cJSON_GetObjectItemCaseSensitive(state, "devices");
    if (cJSON_IsNumber(seed)) printf("seed         %.0f\n", seed->valuedouble);
    if (cJSON_IsNumber(devices)) printf("devices      %.0f (over all processes)\n", devices->valuedouble);
    print_last_metrics(state);
}

static int info(const char *path, const char *name) {
    ct_checkpoint *c;
    char *dir;
    int rc = ctrax_open_checkpoint("info", path, name, &c, &dir);
    if (rc) return rc;
    // ct_checkpoint_open has checked that state.json parses (keys unique).
    size_t state_len = 0;
    const char *state_text = ct_checkpoint_file_bytes(c, "state.json", &state_len);
    cJSON *state = state_text ? ct_json_parse(state_text, state_len, "state.json", NULL) : NULL;
    const char *bad = bad_optimizer_field(state), *source = NULL;
    char *config = NULL;
    if (bad) {
        // A damaged checkpoint is an error, as `ctrax train` would find on resuming.
        fputs("ctrax info: ", stderr);
        ctrax_put_checkpoint(stderr, dir, c);
        fprintf(stderr, "/state.json: %s is not what ctrax writes\n", bad);
        rc = CTRAX_EXIT_ERROR;
    } else if ((rc = ctrax_checkpoint_config("info", c, dir, &config, &source)) == CTRAX_EXIT_OK) {
        print_summary(c, dir, state, config, source);
        print_files(c);
        print_tensors(c);
        print_config(config, source);
    }
    free(config);
    cJSON_Delete(state);
    ctrax_close_checkpoint(c, dir);
    return rc == CTRAX_EXIT_OK ? ctrax_flush_stdout("info") : rc;
}

// ---- --system ------------------------------------------------------------------------

// The vector features GEMM kernels use, by their /proc/cpuinfo names.
static const char *const vector_flags[][2] = {
    {"sse4_2", "SSE4.2"},     {"avx", "AVX"},           {"avx2", "AVX2"},         {"fma", "FMA"},
    {"avx512f", "AVX-512F"},  {"avx512bw", "AVX-512BW"}, {"avx512dq", "AVX-512DQ"}, {"avx512vl", "AVX-512VL"},
    {"amx_tile", "AMX-TILE"}, {"amx_bf16", "AMX-BF16"}, {"amx_int8", "AMX-INT8"},
};

// The value of the first "key : value" line of /proc/cpuinfo into buf
// (newline dropped); false if there is none (not Linux, not x86).
static bool cpuinfo_field(const char *key, char *buf, size_t cap) {
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return false;
    size_t n = strlen(key), len = 0;
    char *line = NULL;
    bool found = false;
    while (!found && getline(&line, &len, f) > 0) {
        if (strncmp(line, key, n) || (line[n] != ' ' && line[n] != '\t' && line[n] != ':')) continue;
        char *colon = strchr(line, ':');
        if (!colon) continue;
        colon += 1 + (colon[1] == ' ');
        colon[strcspn(colon, "\n")] = '\0';
        snprintf(buf, cap, "%s", colon);
        found = true;
    }
    free(line);
    fclose(f);
    return found;
}

// Is word one of the space-separated words of list?
static bool has_word(const char *list, const char *word) {
    size_t n = strlen(word);
    for (const char *p = list; (p = strstr(p, word)) != NULL; p += n)
        if ((p == list || p[-1] == ' ') && (p[n] == ' ' || p[n] == '\0')) return true;
    return false;
}

static int system_info(void) {
    static char flags[16384];  // /proc/cpuinfo's flags line is ~1.5 KB today
    char model[256], blas[512], threads[256];
    if (!cpuinfo_field("model name", model, sizeof model)) snprintf(model, sizeof model, "(unknown: no /proc/cpuinfo)");
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    // Under taskset or a container's CPU set, fewer than those are ours.
    cpu_set_t mine;
    int usable = sched_getaffinity(0, sizeof mine, &mine) == 0 ? CPU_COUNT(&mine) : (int)cores;
    if (usable < cores) printf("cpu          %s (%ld cores online, %d for this process)\n", model, cores, usable);
    else printf("cpu          %s (%ld cores online)\n", model, cores);
    bool have_flags = cpuinfo_field("flags", flags, sizeof flags);
    printf("features    ");
    int missing = 0;
    for (size_t i = 0; have_flags && i < sizeof vector_flags / sizeof *vector_flags; i++)
        if (has_word(flags, vector_flags[i][0])) printf(" %s", vector_flags[i][1]);
        else missing++;
    if (!have_flags) printf(" (unknown: no flags in /proc/cpuinfo)");
    if (missing) {
        printf("; not:");
        for (size_t i = 0; i < sizeof vector_flags / sizeof *vector_flags; i++)
            if (!has_word(flags, vector_flags[i][0])) printf(" %s", vector_flags[i][1]);
    }
    printf("\n");
    printf("gemm backend %s\n", ct_blas_config());
    printf("gemm kernel  %s\n", ctrax_blas_describe(blas, sizeof blas));
    printf("threads      %s\n", ctrax_threads_describe(threads, sizeof threads));
    fflush(stdout);
    // A TransformerLM's shape: tokens x d_model by d_model x d_ff.
    char sgemm[160];
    if (!ctrax_sgemm_describe(2048, 512, 512, 1.0, sgemm, sizeof sgemm)) {
        fprintf(stderr, "ctrax info: out of memory for the sgemm measurement's operands\n");
        return CTRAX_EXIT_ERROR;
    }
    printf("sgemm        %s\n", sgemm);
    return ctrax_flush_stdout("info");
}

int ctrax_cmd_info(int argc, char **argv) {
    const char *path, *name = NULL;
    const ctrax_option options[] = {{"--name", NULL, &name, NULL}};
    const ctrax_args args = {"info", usage, options, 1, "checkpoint", "CHECKPOINT_DIR_OR_OUTPUT_DIR"};
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--name")) {  // its value, even one spelled --system, is a name
            i++;
            continue;
        }
        if (strcmp(argv[i], "--system")) continue;
        // --system describes the machine: no checkpoint, no --name; --threads
        // sets its sgemm's threads.
        for (int k = 1; k < argc; k++) {
            if (!strcmp(argv[k], "-h") || !strcmp(argv[k], "--help")) {
                usage(stdout);
                return ctrax_flush_stdout("info");
            }
            int r = k == i ? 0 : ctrax_opt_threads("info", argc, argv, &k);
            if (r < 0) return CTRAX_EXIT_USAGE;
            if (k != i && r == 0) return ctrax_usage_error("info", "--system takes no other argument, got '%s'", argv[k]);
        }
        return system_info();
    }
    // A checkpoint's info computes nothing: --threads would do nothing.
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--threads") || !strncmp(argv[i], "--threads=", 10))
            return ctrax_usage_error("info", "--threads goes with --system (its sgemm's threads): a checkpoint's info "
                                             "computes nothing");
    int rc = ctrax_parse_args(&args, argc, argv, &path);
    return rc >= 0 ? rc : info(path, name);
}
