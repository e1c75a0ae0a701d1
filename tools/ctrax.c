// ctrax: the command-line trainer.
//
//   ctrax train CONFIG [--set 'Name.param=value']... [--output-dir DIR] [--steps N]
//                      [--devices N] [--threads N] [--restart]
//   ctrax train --config_file=A.gin [--config_file=B.gin]... [--config='Name.param=value']...
//               [--output_dir=DIR] [--dataset=NAME] [--data_dir=DIR] [--model=NAME]  (Trax's trainer_main)
//
// Exit codes: 0 done, 1 error, 2 bad usage.
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "commands.h"
#include "core/fs.h"
#include "ctrax/core/blas.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/train/loop.h"

#define EXIT_USAGE CTRAX_EXIT_USAGE
#define MAX_SETS 64
#define MAX_CONFIGS 64

// Set by SIGINT/SIGTERM (to the signal's number): the loop finishes its
// step, writes a checkpoint and returns (a program global, not the
// library's), and ctrax train exits 128 + that number, as a shell reports a
// process the signal ended: the run is not finished, so a script's
// `ctrax train ... && next` or a scheduler must not take it as done.
static volatile sig_atomic_t stop_requested;

// The first SIGINT/SIGTERM asks the loop to stop after the step (with a
// checkpoint); a second one stops the process at once, for a step or eval
// that takes long (checkpoints are written atomically, so none is left
// half-written).
// Under mpirun the message says which process heard it, and that the stop
// waits for every process: mpirun also sends SIGTERM to the others when one
// of them fails, and those are then ended without a checkpoint.
static char stop_message[200] = "\nctrax: stopping after this step, with a checkpoint (again: stop at once)\n";
static size_t stop_message_len = sizeof "\nctrax: stopping after this step, with a checkpoint (again: stop at once)\n" - 1;

// The run's checkpoint pointer (<output dir>/checkpoint) and the directory
// as the second signal's message shows it (ctrax_text_shown: made before
// any signal, the handler only writes it); "" on processes other than the
// chief (the directory may not be theirs).
static char pointer_path[4200];
static char pointer_dir[4096];

static void say(const char *s) {
    ssize_t n = write(STDERR_FILENO, s, strlen(s));
    (void)n;
}

// A second signal ends the process at once: what is on disk is then what
// the pointer names (a checkpoint being written is never it), which the
// same command resumes from. Only async-signal-safe calls: open, read,
// close, write. The name is the directory's, so anyone's: bytes a
// checkpoint name does not hold are shown as '?', no escape sequence
// reaches the terminal.
static void say_stopped_at_once(void) {
    say("\nctrax: a second signal: stopped at once");
    if (!pointer_path[0]) {
        say("\n");
        return;
    }
    char name[CT_CHECKPOINT_NAME_MAX];
    int fd = open(pointer_path, O_RDONLY | O_CLOEXEC);
    ssize_t n = fd >= 0 ? read(fd, name, sizeof name - 1) : -1;
    if (fd >= 0) close(fd);
    while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ')) n--;
    if (n <= 0) {
        say(", before its first checkpoint: the same command starts over from step 0\n");
        return;
    }
    name[n] = '\0';
    for (ssize_t i = 0; i < n; i++) {
        char c = name[i];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                     c == '-' || c == '.';
        if (!plain) name[i] = '?';
    }
    say("; the steps since the newest checkpoint are lost. The same command resumes from ");
    say(pointer_dir);
    say("/");
    say(name);
    say("\n");
}

static void on_signal(int sig) {
    if (stop_requested) {
        say_stopped_at_once();
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    stop_requested = sig;
    ssize_t n = write(STDERR_FILENO, stop_message, stop_message_len);
    (void)n;
}

// ---- train ------------------------------------------------------------------------

// One binding from the command line, in the order given: --set (an
// override: wins over every file binding) or Trax's --config (parsed as gin
// text after all the files, as gin's parse_config_files_and_bindings).
typedef struct train_binding {
    const char *text;
    bool trax;  // --config
} train_binding;

typedef struct train_args {
    const char *configs[MAX_CONFIGS];  // the positional CONFIG first, then each --config_file, in order
    int n_configs;
    train_binding sets[MAX_SETS];
    int n_sets;
    const char *output_dir;
    const char *dataset, *data_dir, *model;  // Trax's --dataset, --data_dir, --model (NULL: not given)
    long steps;    // -1: the config's train.steps
    int devices;   // 0: none given; else bound as train.n_devices
    int threads;   // 0: the config's train.n_threads
    bool restart;        // ignore checkpoints in the output dir
    bool fixed_threads;  // keep the thread count when other processes keep cores busy
    bool profile;        // print where the steps' time went
} train_args;

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: ctrax train CONFIG [options]\n"
            "       ctrax train --config_file=A.gin [--config_file=B.gin]... [--config='Name.param=value']...\n"
            "                   [--output_dir=DIR] [options]\n"
            "\n"
            "Trains the model a gin config describes (configs/ has examples), with evals,\n"
            "checkpoints and summaries in the output directory. A directory that holds a\n"
            "checkpoint is resumed from its newest complete one, exactly where it stopped.\n"
            "Ctrl-C (or SIGTERM) finishes the current step, writes a checkpoint and exits\n"
            "with status 130 (143), as that signal would: the run is not finished.\n"
            "Under `mpirun -np M`, each process trains on its share of every batch.\n"
            "\n"
            "Trax's trainer_main flags work too: several config files and bindings, read as\n"
            "gin's parse_config_files_and_bindings does: the files in order (a positional\n"
            "CONFIG first), then the bindings in order, each replacing an earlier value.\n"
            "--set overrides win over every file binding. Every option takes its value as\n"
            "`--option value` or `--option=value`.\n"
            "\n"
            "options:\n"
            "  --config_file FILE        a gin file (Trax's flag; repeatable, read in order)\n"
            "  --config 'Name.param=v'   a gin binding read after every file (Trax's flag; repeatable)\n"
            "  --set 'Name.param=value'  override a binding (repeatable), e.g. --set 'train.steps=500'\n"
            "  --output-dir DIR          where checkpoints and metrics go [runs/<first config's name>]\n"
            "  --output_dir DIR          the same (Trax's spelling)\n"
            "  --dataset NAME            data_streams.dataset_name = 'NAME' (Trax's flag; after the --config bindings)\n"
            "  --data_dir DIR            data_streams.data_dir = 'DIR' (Trax's flag; after the --config bindings)\n"
            "  --model NAME              train.model = @NAME (Trax's flag; after the --config bindings)\n"
            "  --steps N                 train until step N (overrides train.steps)\n"
            "  --devices N               local replicas (threads) splitting each batch (train.n_devices)\n"
            "  --threads N               threads for ctrax's loops and the GEMM together (train.n_threads);\n"
            "                            default OMP_NUM_THREADS, else every core. Fewer while other\n"
            "                            processes keep cores busy (measured every 2 s), never more\n"
            "  --fixed-threads           keep the thread count whatever else runs\n"
            "  --profile                 at the end, print where the training steps' time went: each\n"
            "                            layer's own time (by name), the optimizer update, the rest\n"
            "  --restart                 start from step 0 even if DIR holds checkpoints; the previous\n"
            "                            run's files move to DIR/previous-<UTC time>/\n"
            "  --configurables           list every name a config can bind, with its parameters\n"
            "  -h, --help                show this help\n"
            "\n"
            "Output: runs/NAME/model_<step>/ (weights.safetensors, slots.safetensors, state.json,\n"
            "manifest.json, config.gin), checkpoint (the newest complete one), metrics.jsonl, train/ and\n"
            "eval/ TensorBoard event files, config.gin (the operative config), memory_plan.json.\n");
}

// Adds a config file (the positional CONFIG or --config_file's value).
static int add_config(train_args *a, const char *opt, const char *path) {
    if (!*path) return ctrax_usage_error("train", "%s needs a file name, got ''", opt);
    if (a->n_configs == MAX_CONFIGS) return ctrax_usage_error("train", "more than %d config files", MAX_CONFIGS);
    a->configs[a->n_configs++] = path;
    return 0;
}

static int add_binding(train_args *a, const char *opt, const char *text) {
    if (a->n_sets == MAX_SETS) return ctrax_usage_error("train", "more than %d %s options", MAX_SETS, opt);
    a->sets[a->n_sets++] = (train_binding){text, !strcmp(opt, "--config")};
    return 0;
}

// Reads the option with a value at argv[*i], if it is one: 1 read, 0 not an
// option with a value, -1 after a message.
static int train_value_option(train_args *a, int argc, char **argv, int *i) {
    static const char *const names[] = {"--config_file", "--config",  "--set",     "--output-dir", "--output_dir",
                                        "--steps",       "--devices", "--threads", "--dataset",    "--data_dir",
                                        "--model"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        const char *opt = names[k], *v;
        int r = ctrax_opt_value("train", argc, argv, i, opt, &v);
        if (r <= 0) {
            if (r < 0) return -1;
            continue;
        }
        int64_t n;
        switch (k) {
        case 0: return add_config(a, opt, v) ? -1 : 1;
        case 1:
        case 2: return add_binding(a, opt, v) ? -1 : 1;
        case 3:
        case 4:
            if (!*v) {
                ctrax_usage_error("train", "%s needs a directory, got ''", opt);
                return -1;
            }
            a->output_dir = v;
            return 1;
        case 5:
            if (ctrax_parse_int("train", opt, v, 0, 1LL << 40, &n)) return -1;
            a->steps = (long)n;
            return 1;
        case 6:
            if (ctrax_parse_int("train", opt, v, 1, CT_MAX_LOCAL_DEVICES, &n)) return -1;
            a->devices = (int)n;
            return 1;
        case 7: return ctrax_parse_threads("train", v, &a->threads) ? -1 : 1;
        default:
            // Put in a gin string or after '@' (Trax does not escape either).
            if (!*v || strpbrk(v, "'\"\\\n")) {
                ctrax_usage_error("train", "%s expects a name without quotes, backslashes or newlines, got '%s'", opt,
                                  v);
                return -1;
            }
            if (k == 8) a->dataset = v;
            else if (k == 9) a->data_dir = v;
            else a->model = v;
            return 1;
        }
    }
    return 0;
}

// 0 ok, 1 --help shown, EXIT_USAGE after a message.
static int parse_train_args(int argc, char **argv, train_args *a) {
    memset(a, 0, sizeof *a);
    a->steps = -1;
    const char *positional = NULL;
    for (int i = 0; i < argc; i++) {
        const char *s = argv[i];
        if (!strcmp(s, "-h") || !strcmp(s, "--help")) {
            train_usage(stdout);
            return 1;
        }
        if (!strcmp(s, "--configurables")) {
            char *text = ct_config_registry_text();
            fputs(text, stdout);
            ct_free(text);
            return 1;
        }
        if (!strcmp(s, "--restart")) {
            a->restart = true;
            continue;
        }
        if (!strcmp(s, "--fixed-threads")) {
            a->fixed_threads = true;
            continue;
        }
        if (!strcmp(s, "--profile")) {
            a->profile = true;
            continue;
        }
        if (s[0] != '-') {
            // '' (an unset shell variable) is bad usage, as --config_file=''.
            if (!*s) return ctrax_usage_error("train", "CONFIG needs a file name, got ''");
            if (positional)
                return ctrax_usage_error("train", "one positional config file, got '%s' and '%s' (more files: "
                                                  "--config_file=FILE, in order)",
                                         positional, s);
            positional = s;
            continue;
        }
        int r = train_value_option(a, argc, argv, &i);
        if (r < 0) return EXIT_USAGE;
        if (r == 0) return ctrax_usage_error("train", "unknown option '%s'", s);
    }
    if (positional) {
        // The positional file comes first, before every --config_file.
        if (a->n_configs == MAX_CONFIGS) return ctrax_usage_error("train", "more than %d config files", MAX_CONFIGS);
        memmove(a->configs + 1, a->configs, (size_t)a->n_configs * sizeof *a->configs);
        a->configs[0] = positional;
        a->n_configs++;
    }
    if (!a->n_configs)
        return ctrax_usage_error("train", "which config? (ctrax train CONFIG, or --config_file=FILE; configs/ has "
                                          "examples)");
    return 0;
}

// What the Loop's per-step predicate needs: the eval period, and the
// thread count fitted to the free cores between steps.
typedef struct step_hook {
    int64_t eval_frequency;
    // Loop.eval_at, a list of steps, instead of the period (eval_list).
    int64_t eval_steps[CT_LOOP_MAX_STEP_LIST];
    int n_eval_steps;
    bool eval_list;
    int max_threads;    // the count asked for (--threads, train.n_threads, OpenMP's default)
    bool fit_threads;   // one replica: its loops and GEMMs use the count
    bool log;           // the chief logs each change
    ct_thread_fit fit;  // the last measurement
} step_hook;

// Seconds between measurements of the cores other processes keep busy; the
// first, from the reading taken before the model is built, comes sooner (a
// core busy from the start slows every step until it is measured).
#define THREAD_FIT_INTERVAL_S 2.0
#define THREAD_FIT_FIRST_S 0.25

// Evals at step 1 and every train.eval_frequency steps (Trax's default).
// The Loop asks this between steps, on the thread that runs them: there the
// thread count follows the free cores (ct_blas_threads_fit), never above
// the count asked for.
static bool eval_every(int64_t step, void *user) {
    step_hook *h = user;
    if (h->fit_threads) {
        int before = h->fit.threads ? h->fit.threads : h->max_threads;
        int now = ct_blas_threads_fit(&h->fit, h->max_threads, h->fit.threads ? THREAD_FIT_INTERVAL_S : THREAD_FIT_FIRST_S);
        if (now != before && h->log) {
            // On a terminal the Loop's live progress line (stderr) is up:
            // cleared first, as the Loop clears it before its own lines.
            if (isatty(STDERR_FILENO)) fputs("\r\033[K", stderr);
            printf("threads: %d of %d at step %lld: other processes keep %.1f cores busy\n", now, h->max_threads,
                   (long long)step, h->fit.others);
            fflush(stdout);
        }
    }
    if (h->eval_list) {
        for (int i = 0; i < h->n_eval_steps; i++)
            if (h->eval_steps[i] == step) return true;
        return false;
    }
    // Trax's train(): an eval_frequency of 0 (or None) disables evals.
    int64_t every = h->eval_frequency;
    return every > 0 && (step == 1 || step % every == 0);
}

// Everything a training run builds, freed together.
typedef struct train_run {
    ct_config *cfg;
    ct_comm *comm;
    ct_layer *model, *loss;
    ct_layer *eval_model;  // the model built under the eval/ scope, when the config has eval/ bindings
    char eval_model_name[160];
    ct_optimizer *opt;
    ct_schedule *schedule;
    ct_stream *train, *eval;
    ct_layer *metrics[CT_EVAL_MAX_METRICS];
    const char *metric_names[CT_EVAL_MAX_METRICS];
    int n_metrics;
    int64_t eval_steps;
    step_hook hook;
    // train.checkpoints_at / permanent_checkpoints_at (or Loop's), when bound.
    int64_t ckpt_steps[CT_LOOP_MAX_STEP_LIST], perm_steps[CT_LOOP_MAX_STEP_LIST];
    int n_ckpt_steps, n_perm_steps;
    bool ckpt_list, perm_list;
    const char *perm_list_from;  // "train" or "Loop": where permanent_checkpoints_at is bound
    char init_where[300];  // where train.init_checkpoint is bound
    ct_loop *loop;
    char *config_text;
    char output_dir[4096];
    int lock_fd;  // output_dir/.ctrax-lock, held (flock) while this run writes there; -1: none
    ct_checkpoint *resume;  // the checkpoint the run resumes from, open until ct_loop_new
    ct_profile *profile;    // --profile: the trainer's timings
} train_run;

static void train_run_free(train_run *r) {
    ct_loop_free(r->loop);
    ct_checkpoint_close(r->resume);
    if (r->lock_fd >= 0) close(r->lock_fd);  // the lock goes with it
    for (int i = 0; i < r->n_metrics; i++) ct_layer_free(r->metrics[i]);
    ct_stream_free(r->train);
    ct_stream_free(r->eval);
    ct_schedule_free(r->schedule);
    ct_optimizer_free(r->opt);
    ct_layer_free(r->model);
    ct_layer_free(r->eval_model);
    ct_layer_free(r->loss);
    ct_free(r->config_text);
    ct_config_free(r->cfg);
    ct_comm_free(r->comm);
    ct_profile_free(r->profile);
}

// Trax's train.permanent_checkpoint_frequency is the Loop's
// n_steps_per_permanent_checkpoint: either may be bound; both, to different
// periods, is an error naming both.
static ct_status permanent_period(ct_config *c, const ct_train_settings *t, const ct_loop_settings *l, int64_t *out,
                                  ct_error *err) {
    int64_t a = t->permanent_checkpoint_frequency, b = l->n_steps_per_permanent_checkpoint;
    if (a && b && a != b) {
        char wa[300], wb[300];
        ct_config_where(c, "train", "permanent_checkpoint_frequency", wa, sizeof wa);
        ct_config_where(c, "Loop", "n_steps_per_permanent_checkpoint", wb, sizeof wb);
        return ct_error_set(err, CT_ERR_ARG,
                            "%strain.permanent_checkpoint_frequency = %lld and %sLoop.n_steps_per_permanent_checkpoint "
                            "= %lld set the same period differently: bind one of them",
                            wa, (long long)a, wb, (long long)b);
    }
    *out = a ? a : b;
    return CT_OK;
}

// The steps of a list bound as <name>.<param>: each from 1, none twice (a
// repeat is most likely a typo for another step). Errors say where it is bound.
static ct_status check_steps(ct_config *c, const char *name, const char *param, const int64_t *steps, int n,
                             ct_error *err) {
    for (int i = 0; i < n; i++) {
        int twice = -1;
        for (int j = 0; j < i && twice < 0; j++)
            if (steps[j] == steps[i]) twice = j;
        if (steps[i] >= 1 && twice < 0) continue;
        char w[300];
        ct_config_where(c, name, param, w, sizeof w);
        if (steps[i] < 1)
            return ct_error_set(err, CT_ERR_ARG, "%s%s.%s[%d] = %lld: steps start at 1", w, name, param, i,
                                (long long)steps[i]);
        return ct_error_set(err, CT_ERR_ARG, "%s%s.%s lists step %lld twice ([%d] and [%d])", w, name, param,
                            (long long)steps[i], twice, i);
    }
    return CT_OK;
}

// A list of steps from train.<param> or Loop.<loop_param> (either may be
// bound; both, to different lists, is an error naming both). *on: one is
// bound to a list (even an empty one: no such steps).
static ct_status step_list_setting(ct_config *c, const char *param, const char *loop_param, int64_t *out, int *n,
                                   bool *on, const char **from, ct_error *err) {
    const ct_config_value *tv, *lv;
    int64_t other[CT_LOOP_MAX_STEP_LIST];
    int n_other = 0;
    *n = 0;
    *on = false;
    CT_TRY(ct_config_get_list(c, "train", param, NULL, &tv, err));
    CT_TRY(ct_config_get_list(c, "Loop", loop_param, NULL, &lv, err));
    if (tv) CT_TRY(ct_config_get_int_list(c, "train", param, NULL, 0, out, CT_LOOP_MAX_STEP_LIST, n, err));
    if (lv) CT_TRY(ct_config_get_int_list(c, "Loop", loop_param, NULL, 0, other, CT_LOOP_MAX_STEP_LIST, &n_other, err));
    if (tv && lv && (*n != n_other || memcmp(out, other, (size_t)*n * sizeof *out))) {
        char wa[300], wb[300];
        ct_config_where(c, "train", param, wa, sizeof wa);
        ct_config_where(c, "Loop", loop_param, wb, sizeof wb);
        return ct_error_set(err, CT_ERR_ARG, "%strain.%s and %sLoop.%s give different steps: bind one of them", wa,
                            param, wb, loop_param);
    }
    if (lv && !tv) {
        memcpy(out, other, (size_t)n_other * sizeof *out);
        *n = n_other;
    }
    *on = tv || lv;
    *from = tv ? "train" : "Loop";
    return check_steps(c, tv ? "train" : "Loop", tv ? param : loop_param, out, *n, err);
}

// The step lists: regular and permanent checkpoints, and evals.
static ct_status read_step_lists(train_run *r, ct_error *err) {
    ct_config *c = r->cfg;
    const char *from;
    CT_TRY(step_list_setting(c, "checkpoints_at", "checkpoints_at", r->ckpt_steps, &r->n_ckpt_steps, &r->ckpt_list,
                             &from, err));
    CT_TRY(step_list_setting(c, "permanent_checkpoints_at", "permanent_checkpoints_at", r->perm_steps,
                             &r->n_perm_steps, &r->perm_list, &r->perm_list_from, err));
    const ct_config_value *ev;
    CT_TRY(ct_config_get_list(c, "Loop", "eval_at", NULL, &ev, err));
    r->hook.eval_list = ev != NULL;
    if (ev)
        CT_TRY(ct_config_get_int_list(c, "Loop", "eval_at", NULL, 0, r->hook.eval_steps, CT_LOOP_MAX_STEP_LIST,
                                      &r->hook.n_eval_steps, err));
    return check_steps(c, "Loop", "eval_at", r->hook.eval_steps, r->hook.n_eval_steps, err);
}

// Trax's random_seed = None (also when unbound): a seed drawn from the
// system; a run that resumes takes the one its newest checkpoint recorded,
// so it continues with the data order the run began with. The chief decides
// and tells the others. The seed is then bound as train.random_seed, so the
// operative config (config.gin, each checkpoint's) records it.
static ct_status resolve_seed(train_run *r, const train_args *a, ct_train_settings *t, ct_error *err) {
    int64_t v;
    CT_TRY(ct_config_get_int(r->cfg, "train", "random_seed", -1, &v, err));
    if (v >= 0) return CT_OK;
    uint64_t seed = 0;
    bool found = false;
    ct_status st = CT_OK;
    int rank = r->comm ? ct_comm_rank(r->comm) : 0;
    if (rank == 0) {
        // The checkpoint found stays open: the run resumes from it (has_checkpoint).
        if (!a->restart) st = ct_loop_checkpoint_seed(r->output_dir, &r->resume, &found, &seed, err);
        if (st == CT_OK && !found) st = ct_loop_system_seed(&seed, err);
    }
    if (r->comm && ct_comm_size(r->comm) > 1) {
        double ok = st == CT_OK;
        CT_TRY(ct_comm_allreduce_f64(r->comm, &ok, 1, err));
        if (st == CT_OK && ok < ct_comm_size(r->comm))
            return ct_error_set(err, CT_ERR_IO, "train.random_seed: the chief could not draw a seed");
        CT_TRY(st);
        uint64_t buf[2] = {seed, found};
        CT_TRY(ct_comm_broadcast(r->comm, buf, sizeof buf, 0, err));
        seed = buf[0], found = buf[1] != 0;
    }
    CT_TRY(st);
    char text[64];
    snprintf(text, sizeof text, "train.random_seed = %llu", (unsigned long long)seed);
    CT_TRY(ct_config_set(r->cfg, text, err));
    CT_TRY(ct_config_get_int(r->cfg, "train", "random_seed", 0, &v, err));
    t->random_seed = v;
    if (rank == 0)
        printf("random seed: %llu (train.random_seed is None: %s)\n", (unsigned long long)seed,
               found ? "the one the run's checkpoint recorded" : "drawn from the system");
    return CT_OK;
}

// The memory budget, from the settings alone, before anything big is built:
// a model or batch that cannot fit is refused here, naming the setting and
// the bytes, not by the kernel's OOM killer later.
static ct_status check_memory(train_run *r, const train_args *a, const ct_train_settings *t, ct_error *err) {
    ct_config_run_shape shape = {.model = t->model, .optimizer = t->optimizer, .inputs = t->inputs,
                                 .batch_size = t->batch_size, .n_devices = (int)t->n_devices,
                                 .n_processes = r->comm ? ct_comm_size(r->comm) : 1,
                                 .memory_efficient = t->use_memory_efficient_trainer,
                                 .loss_chunk_size = t->loss_chunk_size};
    ct_config_memory mem;
    CT_TRY(ct_config_check_memory(r->cfg, &shape, &mem, err));
    // Refusals compare with physical memory (it does not move); what is
    // free now only warns: the page cache gives way, other programs may not.
    double avail = (double)ct_machine_available_bytes(), need = mem.model_bytes + mem.activation_bytes;
    if (avail > 0 && need > avail) {
        char n[32], f[32];
        ct_log(CT_LOG_WARN, "%s: this run needs about %s; %s of memory is available now", a->configs[0],
               ct_format_bytes(need, n, sizeof n), ct_format_bytes(avail, f, sizeof f));
    }
    return CT_OK;
}

// Trax's eval_model (ctrax_eval_model_name): with eval/-scoped bindings the
// Loop runs the evals with it on a copy of the trained weights. Without
// them the evals run the model itself (in eval mode: the same values as
// Trax's eval model).
static ct_status build_eval_model(train_run *r, const ct_train_settings *t, ct_error *err) {
    if (ctrax_eval_model_name(r->cfg, t->model, r->eval_model_name, sizeof r->eval_model_name) == t->model)
        return CT_OK;
    if (ct_config_build_model(r->cfg, r->eval_model_name, &r->eval_model, err) != CT_OK)
        return ct_error_prefix(err, "the eval model %s (the config has eval/ bindings)", r->eval_model_name);
    return CT_OK;
}

// Builds model, loss, optimizer, schedule, streams and metrics.
static ct_status build_objects(train_run *r, const ct_train_settings *t, ct_error *err) {
    ct_config *c = r->cfg;
    CT_TRY(ct_config_build_model(c, t->model, &r->model, err));
    CT_TRY(build_eval_model(r, t, err));
    CT_TRY(ct_config_build_layer(c, t->loss_fn, &r->loss, err));
    CT_TRY(ct_config_build_optimizer(c, t->optimizer, &r->opt, err));
    if (t->lr_schedule_fn) CT_TRY(ct_config_build_schedule(c, t->lr_schedule_fn, &r->schedule, err));
    CT_TRY(ct_config_build_inputs(c, t->inputs, t->batch_size, (uint64_t)t->random_seed, &r->train, &r->eval, err));
    if (!r->eval && r->eval_steps > 0) {
        // Inputs with no held-out data (eval_fraction 0) and evals asked for.
        char wf[300], we[300];
        ct_config_where(c, t->inputs, "eval_fraction", wf, sizeof wf);
        ct_config_where(c, "train", "eval_steps", we, sizeof we);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.eval_fraction = 0 holds out no eval data, but %strain.eval_steps = %lld asks for "
                            "evals: set train.eval_steps = 0, or an eval_fraction above 0",
                            wf, t->inputs, we, (long long)r->eval_steps);
    }
    // Eval metrics, as `ctrax eval` reads them.
    ct_eval_task ev = {0};
    CT_TRY(ctrax_eval_metrics(c, t->loss_fn, &ev, err));
    for (int i = 0; i < ev.n_metrics; i++) {
        r->metrics[i] = ev.metrics[i];
        r->metric_names[i] = ev.metric_names[i];
    }
    r->n_metrics = ev.n_metrics;
    return CT_OK;
}

// The Loop's options from the settings and the command line.
static void loop_options(train_run *r, const train_args *a, const ct_train_settings *t, const ct_loop_settings *l,
                         int64_t permanent, ct_loop_options *o) {
    *o = ct_loop_default_options();
    o->output_dir = r->output_dir;
    o->n_steps_per_checkpoint = l->n_steps_per_checkpoint;
    o->n_steps_per_permanent_checkpoint = permanent;
    o->keep_last = (int)t->keep_checkpoints;
    o->history_max = (int)l->history_max;  // -1..INT_MAX, never 0 (the config's range and check)
    o->restore = !a->restart;
    o->seed = (uint64_t)t->random_seed;
    o->init_checkpoint = t->init_checkpoint;
    o->eval_model = r->eval_model;
    if (r->ckpt_list) o->checkpoints_at = r->ckpt_steps, o->n_checkpoints_at = r->n_ckpt_steps;
    if (r->perm_list) o->permanent_checkpoints_at = r->perm_steps, o->n_permanent_checkpoints_at = r->n_perm_steps;
    o->checkpoint_low_metric = t->checkpoint_lowest;
    o->checkpoint_high_metric = t->checkpoint_highest;
    o->trainer.n_devices = (int)t->n_devices;
    o->trainer.adasum = t->adasum;
    o->trainer.memory_efficient = t->use_memory_efficient_trainer;
    o->trainer.loss_chunk_size = t->loss_chunk_size;
    o->skip_nonfinite = t->skip_nonfinite_steps;
    o->trainer.clip_grad_norm = (float)t->clip_grad_norm;
    o->trainer.comm = r->comm;
    if (a->profile) o->trainer.profile = r->profile = ct_profile_new();
    o->stop = &stop_requested;
    o->config_text = r->config_text;
    o->log = stdout;
    o->progress = stderr;
    o->eval_at = eval_every;
    o->predicate_user = &r->hook;
}

// runs/<config name without its extension>, or --output-dir.
// --output-dir, else runs/<the first config's name without its extension>;
// a name that would be runs/ itself or another directory ('.gin', '..gin')
// is refused.
static ct_status output_dir(train_run *r, const train_args *a, ct_error *err) {
    // A longer name would be cut short here: another directory than asked for.
    if (a->output_dir) {  // never empty: parse refused it as bad usage
        if (strlen(a->output_dir) >= sizeof r->output_dir)
            return ct_error_set(err, CT_ERR_ARG, "--output_dir is %zu bytes long (at most %zu): '%.60s...'",
                                strlen(a->output_dir), sizeof r->output_dir - 1, a->output_dir);
        snprintf(r->output_dir, sizeof r->output_dir, "%s", a->output_dir);
        return CT_OK;
    }
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", a->configs[0]);
    char *base = basename(copy), *dot = strrchr(base, '.');
    if (dot) *dot = '\0';
    if (!base[0] || !strcmp(base, ".") || !strcmp(base, ".."))
        return ct_error_set(err, CT_ERR_ARG, "%s: its name gives no output directory (runs/%s): give --output-dir DIR",
                            a->configs[0], base);
    snprintf(r->output_dir, sizeof r->output_dir, "runs/%s", base);
    return CT_OK;
}

// Threads for ctrax's loops and the GEMM: --threads, else train.n_threads,
// else OpenMP's default (OMP_NUM_THREADS, else every core). Set before
// anything is built: kernels size per-thread scratch from the count. The
// replicas of train.n_devices are threads too (each runs its loops and
// GEMMs on one thread: OpenMP does not nest), so more replicas than an
// asked-for thread count is refused.
static ct_status apply_threads(ct_config *c, const train_args *a, const ct_train_settings *t, ct_error *err) {
    int threads = a->threads ? a->threads : (int)t->n_threads;
    if (!threads) return CT_OK;
    int devices = (int)t->n_devices;
    if (devices > threads) {
        char wd[300], wt[300], d[340], th[340];
        ct_config_where(c, "train", "n_devices", wd, sizeof wd);
        ct_config_where(c, "train", "n_threads", wt, sizeof wt);
        if (a->devices) snprintf(d, sizeof d, "--devices %d", devices);
        else snprintf(d, sizeof d, "%strain.n_devices = %d", wd, devices);
        if (a->threads) snprintf(th, sizeof th, "--threads %d", threads);
        else snprintf(th, sizeof th, "%strain.n_threads = %d", wt, threads);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s replicas are %d threads, more than %s allows: ask for at least %d threads, or at most "
                            "%d replicas",
                            d, devices, th, devices, threads);
    }
    ct_blas_set_threads(threads);
    return CT_OK;
}

// Reads the config and builds model, loss, optimizer, schedule, streams and
// metrics. Every setting is read here (ct_config_read_train/loop read each
// one the registry accepts), before training, so the operative config is
// complete and every config error shows before step 1.
static ct_status lock_output_dir(train_run *r, ct_error *err);

static ct_status build_run(train_run *r, const train_args *a, ct_loop_options *o, int64_t *steps, ct_error *err) {
    r->cfg = ct_config_new();
    for (int i = 0; i < a->n_configs; i++) CT_TRY(ct_config_parse_file(r->cfg, a->configs[i], err));
    for (int i = 0; i < a->n_sets; i++) {
        const train_binding *b = &a->sets[i];
        // --config is gin text read after the files (its errors say
        // "--config:line:col"); --set, an override.
        if (b->trax) CT_TRY(ct_config_parse_text(r->cfg, b->text, strlen(b->text), "--config", err));
        else CT_TRY(ct_config_set(r->cfg, b->text, err));
    }
    // Trax's trainer_main appends these to the --config bindings, in this order.
    const char *flags[][3] = {{"--dataset", "data_streams.dataset_name = '%s'", a->dataset},
                              {"--data_dir", "data_streams.data_dir = '%s'", a->data_dir},
                              {"--model", "train.model = @%s", a->model}};
    for (size_t i = 0; i < sizeof flags / sizeof *flags; i++) {
        if (!flags[i][2]) continue;
        char text[4200];
        int n = snprintf(text, sizeof text, flags[i][1], flags[i][2]);
        if (n < 0 || (size_t)n >= sizeof text)
            return ct_error_set(err, CT_ERR_ARG, "%s: a value of %zu bytes is too long", flags[i][0], strlen(flags[i][2]));
        CT_TRY(ct_config_parse_text(r->cfg, text, (size_t)n, flags[i][0], err));
    }
    // --devices and --steps are bindings too, so the operative config says
    // how the rows were split (`ctrax eval` runs them the same way: the
    // per-device batch is in the state of some layers) and how far the run
    // was asked to train.
    if (a->devices) {
        char text[64];
        snprintf(text, sizeof text, "train.n_devices = %d", a->devices);
        CT_TRY(ct_config_set(r->cfg, text, err));
    }
    if (a->steps >= 0) {
        char text[64];
        snprintf(text, sizeof text, "train.steps = %ld", a->steps);
        CT_TRY(ct_config_set(r->cfg, text, err));
    }
    // The processes are mpirun's: a batch size bound on the inputs is per
    // process (Trax's per host), and `ctrax eval` of the run's config.gin
    // makes the eval batches the run made.
    char bound[300];
    ct_config_where(r->cfg, "train", "n_processes", bound, sizeof bound);
    int n_processes = r->comm ? ct_comm_size(r->comm) : 1;
    if (n_processes > 1 || bound[0]) {
        char text[64];
        snprintf(text, sizeof text, "train.n_processes = %d", n_processes);
        CT_TRY(ct_config_set(r->cfg, text, err));
    }
    CT_TRY(ct_config_validate(r->cfg, err));

    ct_config *c = r->cfg;
    ct_train_settings t;
    ct_loop_settings l;
    int64_t permanent = 0;
    CT_TRY(ct_config_read_train(c, &t, err));
    CT_TRY(ct_config_read_loop(c, &l, err));
    CT_TRY(permanent_period(c, &t, &l, &permanent, err));
    CT_TRY(apply_threads(c, a, &t, err));
    r->hook.eval_frequency = t.eval_frequency;
    r->hook.max_threads = ct_blas_threads();
    r->hook.fit_threads = !a->fixed_threads && t.n_devices == 1;
    // The first reading now, so the first count is set by the first step
    // when the setup took THREAD_FIT_FIRST_S: with a core busy from the
    // start, steps before it run at a fraction of one thread's speed.
    if (r->hook.fit_threads) ct_blas_threads_fit(&r->hook.fit, r->hook.max_threads, 0);
    r->eval_steps = t.eval_steps;
    CT_TRY(read_step_lists(r, err));
    if (permanent && r->perm_list) {
        // Trax's train() raises a ValueError for both: which one wins is not obvious.
        char wa[300], wb[300];
        const char *period_name = t.permanent_checkpoint_frequency ? "train" : "Loop";
        const char *period = t.permanent_checkpoint_frequency ? "permanent_checkpoint_frequency"
                                                              : "n_steps_per_permanent_checkpoint";
        ct_config_where(c, period_name, period, wa, sizeof wa);
        ct_config_where(c, r->perm_list_from, "permanent_checkpoints_at", wb, sizeof wb);
        return ct_error_set(err, CT_ERR_ARG,
                            "%s%s.%s = %lld and %s%s.permanent_checkpoints_at are both bound: bind one of them (Trax's "
                            "train refuses both too)",
                            wa, period_name, period, (long long)permanent, wb, r->perm_list_from);
    }
    CT_TRY(output_dir(r, a, err));
    // The chief owns the directory from here: the seed's search below opens
    // the checkpoint the run then resumes from, so no other run may write
    // one in between. A checkpoint a dead writer had set aside to replace or
    // prune (.old-<name>-<pid>, <name> gone) goes back under its name before
    // anything looks for one (the seed's search, has_checkpoint): searched
    // for first, a run whose writer died between setting model_2 aside and
    // renaming the new one in resumed from model_1, or with none started
    // again at step 0. Only a dead writer's: a live pid (a program sharing
    // the directory by mistake) keeps its own.
    if (!r->comm || ct_comm_rank(r->comm) == 0) {
        CT_TRY(lock_output_dir(r, err));
        ct_error put_err;
        if (ct_checkpoint_put_back(r->output_dir, true, &put_err) != CT_OK)
            ct_log(CT_LOG_WARN, "putting back set-aside checkpoints: %s", put_err.msg);
    }
    CT_TRY(resolve_seed(r, a, &t, err));
    if (t.init_checkpoint) ct_config_where(c, "train", "init_checkpoint", r->init_where, sizeof r->init_where);
    if (!t.model) return ct_error_set(err, CT_ERR_ARG, "%s: no model: bind train.model = @SomeModel", a->configs[0]);
    if (!t.inputs) return ct_error_set(err, CT_ERR_ARG, "%s: no data: bind train.inputs = @SomeInputs", a->configs[0]);
    CT_TRY(check_memory(r, a, &t, err));
    CT_TRY(build_objects(r, &t, err));

    r->config_text = ct_config_operative_text(c);
    for (int i = 0; i < ct_config_n_bindings(c); i++) {
        ct_config_binding_info b = ct_config_binding_at(c, i);
        if (!b.used)
            ct_log(CT_LOG_WARN, "%s:%d: %s.%s is bound but this program never reads it", b.file, b.line, b.name,
                   b.param);
    }
    *steps = t.steps;
    loop_options(r, a, &t, &l, permanent, o);
    return CT_OK;
}


// Which OpenBLAS kernel the matrix products run and why, what it measures
// here, and the threads. The measurement takes 0.1 s, enough to show a
// generic kernel or a machine other work loads, on operands of 1.3 MB: the
// 2048 x 512 x 512 product of `ctrax info --system` raised a small model's
// peak RSS by a third (copy.gin: 25.6 -> 33.8 MiB; 26.2 MiB with this one).
static void print_blas(void) {
    char blas[512], threads[256], sgemm[160];
    printf("blas: OpenBLAS kernel %s\n", ctrax_blas_describe(blas, sizeof blas));
    if (ctrax_sgemm_describe(512, 256, 256, 0.1, sgemm, sizeof sgemm)) printf("sgemm: %s\n", sgemm);
    printf("threads: %s\n", ctrax_threads_describe(threads, sizeof threads));
}

// The trainer's memory plan: one line at start, and the same figures (bytes)
// in <output_dir>/memory_plan.json, recorded with the run.
static void print_memory_plan(const ct_memory_plan *p, const char *output_dir) {
    char line[512], path[4096], json[512];
    printf("%s\n", ct_memory_plan_format(p, line, sizeof line));
    int n = snprintf(path, sizeof path, "%s/memory_plan.json", output_dir);
    int len = snprintf(json, sizeof json,
                       "{\"weights\": %zu, \"gradients\": %zu, \"optimizer_slots\": %zu, \"state\": %zu, "
                       "\"activations\": %zu, \"stack\": %zu, \"scratch\": %zu, \"device_bytes\": %zu, "
                       "\"host_bytes\": %zu}\n",
                       p->weights, p->grads, p->slots, p->state, p->activations, p->stack, p->scratch, p->device_bytes,
                       p->host_bytes);
    // Atomic and checked to the end (a full disk left it cut short, unsaid).
    ct_error err;
    if (n <= 0 || (size_t)n >= sizeof path)
        ct_log(CT_LOG_WARN, "%s/memory_plan.json: path too long: the memory plan is not written", output_dir);
    else if (ct_fs_write_atomic(path, json, (size_t)len, &err) != CT_OK)
        ct_log(CT_LOG_WARN, "the memory plan is not written: %s", err.msg);
}

// A run that starts at step 0 in a directory an earlier run wrote (with
// --restart, or with no checkpoint to resume from): the earlier run's files
// (checkpoints and their pointer, best and temporary checkpoints, metrics,
// TensorBoard events, config.gin, memory_plan.json) move into
// DIR/previous-<UTC time>/, so the new run's are not mixed with them (a
// resume, `ctrax info` and TensorBoard would see both) and nothing is
// overwritten or deleted. Other files stay. A checkpoint a dead writer had
// set aside (.old-<name>-<pid>) is back under its name by then (build_run),
// so it goes with the rest; other .old- and .tmp- entries go too: left here,
// the new run's first checkpoint would put such a checkpoint back under
// <name> once its writer ended (ct_checkpoint_clean_tmp), an earlier run's
// checkpoint among the new run's.
static bool previous_run_file(const char *name) {
    static const char *const exact[] = {"checkpoint", "config.gin", "memory_plan.json", "metrics.jsonl",
                                        "metrics.svg", "train", "eval"};
    static const char *const prefixes[] = {"model_", "highest_", "lowest_", ".tmp-", ".old-"};
    for (size_t i = 0; i < sizeof exact / sizeof *exact; i++)
        if (!strcmp(name, exact[i])) return true;
    for (size_t i = 0; i < sizeof prefixes / sizeof *prefixes; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return true;
    return false;
}

static ct_status set_aside_previous_run(const char *dir, ct_error *err) {
    // The names first, then the moves: a directory changed while readdir
    // walks it may skip or repeat entries.
    DIR *d = opendir(dir);
    if (!d) return errno == ENOENT ? CT_OK : ct_error_set(err, CT_ERR_IO, "%s: cannot read: %s", dir, strerror(errno));
    char **names = NULL;
    int n = 0, cap = 0;
    for (struct dirent *e; (e = readdir(d));) {
        if (!previous_run_file(e->d_name)) continue;
        if (n == cap) names = ct_realloc(names, (size_t)(cap = cap ? 2 * cap : 16) * sizeof *names);
        names[n++] = ct_strdup(e->d_name);
    }
    closedir(d);
    ct_status st = CT_OK;
    char aside[4200] = "";
    if (n > 0) {
        time_t now = time(NULL);
        struct tm tm;
        char stamp[32];
        strftime(stamp, sizeof stamp, "%Y%m%d-%H%M%S", gmtime_r(&now, &tm));
        for (int k = 0; k < 100 && !aside[0] && st == CT_OK; k++) {
            if (k) snprintf(aside, sizeof aside, "%s/previous-%s-%d", dir, stamp, k);
            else snprintf(aside, sizeof aside, "%s/previous-%s", dir, stamp);
            if (mkdir(aside, 0755) == 0) break;
            if (errno != EEXIST) st = ct_error_set(err, CT_ERR_IO, "%s: cannot create: %s", aside, strerror(errno));
            aside[0] = '\0';
        }
        if (st == CT_OK && !aside[0]) st = ct_error_set(err, CT_ERR_IO, "%s: no free previous-%s name", dir, stamp);
    }
    for (int k = 0; k < n && st == CT_OK; k++) {
        char from[4400], to[4400];
        snprintf(from, sizeof from, "%s/%s", dir, names[k]);
        snprintf(to, sizeof to, "%s/%s", aside, names[k]);
        if (rename(from, to) != 0)
            st = ct_error_set(err, CT_ERR_IO, "cannot move %s aside to %s: %s", from, to, strerror(errno));
    }
    for (int k = 0; k < n; k++) ct_free(names[k]);
    ct_free(names);
    if (st == CT_OK && aside[0]) {
        st = ct_fs_sync_dir(dir, err);
        ct_log(CT_LOG_INFO, "this run starts at step 0: the files an earlier run left in %s are now in %s", dir, aside);
    }
    return st;
}

// One run writes an output directory at a time: two would resume the same
// checkpoint and overwrite each other's (and interleave metrics.jsonl). The
// lock is flock on DIR/.ctrax-lock, which holds the owner's pid for the
// message; the kernel lets it go when the process ends, however it ends.
static ct_status lock_output_dir(train_run *r, ct_error *err) {
    CT_TRY(ct_fs_mkdirs(r->output_dir, err));
    char path[4200];
    snprintf(path, sizeof path, "%s/.ctrax-lock", r->output_dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
    if (fd < 0) return ct_error_set(err, CT_ERR_IO, "%s: cannot open: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = '\0';
        pid[strcspn(pid, "\n")] = '\0';
        close(fd);
        if (e == EWOULDBLOCK)
            return ct_error_set(err, CT_ERR_STATE, "%s is in use by another ctrax train (pid %s): one run per output "
                                "directory", r->output_dir, pid[0] ? pid : "?");
        return ct_error_set(err, CT_ERR_IO, "%s: cannot lock: %s", path, strerror(e));
    }
    char pid[32];
    int len = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)len, 0) != len) {
        ct_status st = ct_error_set(err, CT_ERR_IO, "%s: cannot write: %s", path, strerror(errno));
        close(fd);
        return st;
    }
    r->lock_fd = fd;
    return CT_OK;
}

// Whether the loop will resume from dir (or refuse what is there): the
// loop's own search (ct_checkpoint_open_latest), so a run that starts at
// step 0 always sets the earlier run's files aside first. A name alone is
// not enough: a file like Trax's model_500.pkl.gz, an empty model_*
// directory or an unreadable pointer resumes nothing, and the new run would
// then cut metrics.jsonl to step 0 and replace config.gin.
// The checkpoint found stays open in *found, for the loop to resume from
// (ct_loop_options.restore_checkpoint) without a second search: each reads
// and checks every byte of the checkpoint. Its warnings (a pointer that
// does not load, the checkpoint used instead) are then this search's to
// give. A search that fails counts as a checkpoint: nothing is moved, and
// the loop searches again and reports it. One already open in *found (the
// search for the seed a run drew found it: resolve_seed) is not searched for
// again.
static bool has_checkpoint(const char *dir, ct_checkpoint **found) {
    if (*found) return true;
    ct_error err;
    ct_status st = ct_checkpoint_open_latest(found, dir, &err);
    return st != CT_OK || *found;
}

static int run_train(const train_args *a) {
    train_run r;
    memset(&r, 0, sizeof r);
    r.lock_fd = -1;
    ct_error err;
    ct_error_clear(&err);
    ct_loop_options o;
    int64_t steps = 0;
    int rc = 1, stopped_rc = 0;  // stopped_rc: 128 + the signal that stopped the run
    bool trained = false;        // ct_loop_run began
    bool resume_failed = false;  // the run in the output directory does not resume with these settings
    if (ct_comm_mpi_launched() && ct_comm_mpi_new(&r.comm, 0, &err) != CT_OK) goto done;
    int rank = r.comm ? ct_comm_rank(r.comm) : 0;
    if (rank != 0) ct_log_set_level(CT_LOG_ERROR);  // the chief speaks for the job
    if (build_run(&r, a, &o, &steps, &err) != CT_OK) goto done;
    if (rank != 0) o.log = o.progress = NULL;
    r.hook.log = rank == 0;
    ct_tensor sigs[CT_BATCH_MAX_TENSORS];
    int n_sig = ct_stream_signature(r.train, sigs);
    o.tokens_per_batch = n_sig > 0 ? ct_tensor_numel(&sigs[0]) : 0;

    // train and eval both log metrics/loss
    ct_train_task task = {.stream = r.train, .loss = r.loss, .optimizer = r.opt, .lr_schedule = r.schedule,
                          .loss_name = "loss"};
    // No schedule: every step at the optimizer's own learning rate.
    if (!r.schedule) ct_optimizer_get_param(r.opt, "learning_rate", &task.learning_rate, NULL);
    r.opt = NULL;  // the loop owns it
    ct_eval_task ev = {.stream = r.eval, .n_metrics = r.n_metrics, .n_batches = (int)r.eval_steps};
    for (int i = 0; i < r.n_metrics; i++) {
        ev.metrics[i] = r.metrics[i];
        ev.metric_names[i] = r.metric_names[i];
    }
    // The chief owns the directory (build_run locked it and put back what a
    // dead writer had set aside). A run that starts at step 0 (--restart, or
    // nothing to resume) sets aside what an earlier run left there
    // (config.gin, metrics.jsonl, events of a run stopped before its first
    // checkpoint, a killed writer's temporaries) instead of writing over it.
    // A resume removes what a run stopped while writing left (a checkpoint's
    // .tmp-<name>-<pid>, a file's .<file>.tmp-<pid>) now, not at its first
    // checkpoint: one that writes none (nothing to train) would keep them.
    if (rank == 0 && (a->restart || !has_checkpoint(r.output_dir, &r.resume))) {
        if (set_aside_previous_run(r.output_dir, &err) != CT_OK) goto done;
    } else if (rank == 0) {
        ct_error clean_err;
        if (ct_checkpoint_clean_tmp(r.output_dir, true, &clean_err) != CT_OK)
            ct_log(CT_LOG_WARN, "removing stale temporaries: %s", clean_err.msg);
    }
    o.restore_checkpoint = r.resume;
    if (r.comm && ct_comm_size(r.comm) > 1) {
        int n = snprintf(stop_message, sizeof stop_message,
                         "\nctrax (process %d of %d): stopping after this step, with a checkpoint, when every process "
                         "has finished it (again: stop at once)\n",
                         rank, ct_comm_size(r.comm));
        stop_message_len = n > 0 && (size_t)n < sizeof stop_message ? (size_t)n : strlen(stop_message);
    }
    if (rank == 0) {
        snprintf(pointer_dir, sizeof pointer_dir, "%s", r.output_dir);
        ctrax_text_shown(pointer_dir);  // anyone's name: no escape sequence or newline reaches the terminal
        snprintf(pointer_path, sizeof pointer_path, "%s/checkpoint", r.output_dir);
    }
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    ct_status made = ct_loop_new(&r.loop, r.model, &task, 1, r.eval_steps > 0 ? &ev : NULL, &o, &err);
    ct_checkpoint_close(r.resume);  // restored from (or not wanted): done with
    r.resume = NULL;
    if (made != CT_OK) {
        // The loop's message names init_checkpoint; this says where it is bound.
        if (o.init_checkpoint && !strncmp(err.msg, "loop: init_checkpoint", 21))
            ct_error_prefix(&err, "%strain.init_checkpoint = '%s'", r.init_where, o.init_checkpoint);
        const char *best = !strncmp(err.msg, "loop: checkpoint_low_metric", 27)    ? "checkpoint_lowest"
                           : !strncmp(err.msg, "loop: checkpoint_high_metric", 28) ? "checkpoint_highest"
                                                                                    : NULL;
        if (best) {
            char where[300];
            ct_config_where(r.cfg, "train", best, where, sizeof where);
            ct_error_prefix(&err, "%strain.%s", where, best);
        }
        if (o.eval_model && !strncmp(err.msg, "loop: the eval model", 20))
            ct_error_prefix(&err, "%s, built because the config has eval/ bindings", r.eval_model_name);
        resume_failed = !strncmp(err.msg, "loop: resuming from", 19);
        goto done;
    }
    if (rank == 0) {
        const ct_net *net = ct_loop_net(r.loop);
        char desc[512];
        ct_stream_describe(r.train, desc, sizeof desc);
        // The config's and the directory's names are anyone's (ctrax_put_text).
        ctrax_put_text(stdout, a->configs[0]);
        printf(": %s, %zu weights (%.2f MiB); %s trainer, %d device(s) x %d process(es); output ", r.model->name,
               net->n_weights, (double)net->n_weights * 4 / (1 << 20),
               o.trainer.memory_efficient ? "memory-efficient" : "standard", o.trainer.n_devices,
               r.comm ? ct_comm_size(r.comm) : 1);
        ctrax_put_text(stdout, r.output_dir);
        putchar('\n');
        printf("data: %s\n", desc);
        if (r.eval_model) printf("evals: the model as %s, on the trained weights\n", r.eval_model_name);
        print_blas();
        print_memory_plan(ct_trainer_memory_plan(ct_loop_trainer(r.loop)), r.output_dir);
        // Where the run resumes is the loop's to say (ct_loop_new logs it, as it
        // logs the hyperparameters a resume changes): every program using the
        // loop gets the line, and this one does not repeat it.
        if (ct_loop_step(r.loop) >= steps && steps > 0)
            printf("nothing to train: the run is at step %lld, train.steps is %lld (raise it, or --restart)\n",
                   (long long)ct_loop_step(r.loop), (long long)steps);
        fflush(stdout);
    }
    trained = true;
    if (ct_loop_run(r.loop, steps, &err) != CT_OK) goto done;
    if (rank == 0) {
        if (ct_loop_stopped(r.loop))
            printf("stopped at step %lld; checkpoint written. Run the same command to continue.\n",
                   (long long)ct_loop_step(r.loop));
        else {
            printf("done: step %lld; checkpoints, metrics.jsonl and TensorBoard files in ",
                   (long long)ct_loop_step(r.loop));
            ctrax_put_text(stdout, r.output_dir);
            putchar('\n');
        }
        if (r.profile) ct_profile_print(r.profile, stdout);
    }
    rc = 0;
    // Another process's signal stops this one too (under mpirun every one
    // hears SIGTERM).
    if (ct_loop_stopped(r.loop)) stopped_rc = 128 + (stop_requested ? (int)stop_requested : SIGTERM);
done:
    if (rc) {
        fprintf(stderr, "ctrax train: %s\n", err.msg);
        // A run that fails while training (a full disk, a non-finite loss)
        // keeps its checkpoints: say which one the same command resumes from.
        char latest[CT_CHECKPOINT_NAME_MAX];
        ct_error ignored;
        if (trained && rank == 0 &&
            ct_checkpoint_find_latest(r.output_dir, latest, sizeof latest, &ignored) == CT_OK && latest[0])
            fprintf(stderr, "ctrax train: %s/%s, the newest checkpoint, is whole: once the cause is mended, the same "
                    "command resumes from it\n", r.output_dir, latest);
        // Another model, optimizer or data than the run there was made with:
        // the two ways on, neither of which loses that run.
        if (resume_failed && rank == 0)
            fprintf(stderr, "ctrax train: to start over instead, --restart sets the run in %s aside (into "
                    "previous-<time>/); or train elsewhere with --output-dir DIR\n", r.output_dir);
        if (r.comm && ct_comm_size(r.comm) > 1) ct_comm_abort(r.comm, 1);  // the others cannot go on alone
    }
    train_run_free(&r);
    return rc ? rc : stopped_rc;
}

// ---- main --------------------------------------------------------------------------

static void usage(FILE *f) {
    fprintf(f,
            "usage: ctrax COMMAND [options]\n"
            "\n"
            "commands:\n"
            "  train CONFIG        train a model described by a gin config (configs/ has examples)\n"
            "  eval OUTPUT_DIR     metrics of a run's newest checkpoint on its eval data\n"
            "  sample OUTPUT_DIR   text from a byte-level language model's checkpoint\n"
            "  info PATH           what a checkpoint holds: step, parameters, tensors, config\n"
            "  info --system       the CPU, its vector features, the GEMM kernel, threads and sgemm GFLOP/s\n"
            "  plot PATH           an SVG of the loss and metric curves in metrics.jsonl\n"
            "\n"
            "ctrax COMMAND --help shows a command's options. train, eval, sample and info --system take\n"
            "--threads N: threads for ctrax's loops and the GEMM together (default OMP_NUM_THREADS, else\n"
            "every core). Exit codes: 0 done, 1 error, 2 bad usage.\n");
}

// The environment the OpenMP runtime and OpenBLAS read once, when they load,
// set before anything runs and applied by executing the program again, once
// (one mechanism for both):
// - OpenBLAS picks its kernel from a table of CPU models; on a CPU the table
//   does not know it falls back to a generic SSE3 kernel, 4-5x slower (an
//   AVX2 kernel on an AVX-512 CPU: 1.8x slower on a Zen 5).
//   Then the widest kernel the CPU's features run (ct_blas_vector_core)
//   goes in OPENBLAS_CORETYPE; CTRAX_BLAS_REPLACED keeps OpenBLAS's own
//   choice for the log.
// - OpenMP's idle threads spin (libgomp: about 300,000 polls) before they
//   sleep. On a core another process is using, a spinning thread takes the
//   time slices the thread doing work needs, and a training step waits for
//   the slowest thread at every barrier: 14x slower with 2 threads and one
//   core busy (bench/threads.sh). Sleeping at once (passive) costs a wake-up
//   at each of a step's parallel loops: 8% of config A's speed in
//   bench/lm_speed. So threads spin (GOMP_SPINCOUNT=CT_OMP_SPINCOUNT)
//   and the trainer keeps them off cores others use (ct_blas_threads_fit).
// A user's own OPENBLAS_CORETYPE, OMP_WAIT_POLICY or GOMP_SPINCOUNT is left
// alone. CTRAX_REEXEC marks the second run, so it never loops.
static void prepare_environment(char **argv) {
    if (getenv("CTRAX_REEXEC")) return;
    const char *core = getenv("OPENBLAS_CORETYPE") || getenv("CTRAX_BLAS_REPLACED") ? NULL : ct_blas_vector_core();
    bool wait = !getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT");
    if (!core && !wait) return;
    if (setenv("CTRAX_REEXEC", "1", 1)) return;
    if (core && (setenv("CTRAX_BLAS_REPLACED", ct_blas_core(), 1) || setenv("OPENBLAS_CORETYPE", core, 1))) core = NULL;
    if (wait && setenv("GOMP_SPINCOUNT", CT_OMP_SPINCOUNT, 1)) wait = false;
    if (core || wait) execv("/proc/self/exe", argv);
    // Could not run again: what this process runs is what the log says.
    unsetenv("OPENBLAS_CORETYPE");
    unsetenv("CTRAX_BLAS_REPLACED");
    if (wait) unsetenv("GOMP_SPINCOUNT");
}

// A standard stream closed by the caller (`2>&-`) would be taken by the
// next file opened, the run's .ctrax-lock, and the log written into it: each
// closed one is opened on /dev/null first (open takes the lowest free
// descriptor, so going up from 0 fills each in place).
static void open_standard_streams(void) {
    for (int fd = 0; fd <= 2; fd++)
        if (fcntl(fd, F_GETFD) < 0 && errno == EBADF) {
            int got = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
            if (got > fd) close(got);  // not reached: fd is the lowest free one
        }
}

// OpenMP read OMP_NUM_THREADS when it loaded: ctrax holds it to --threads's
// bounds (a count in the tens of thousands overflowed libgomp's stack), and
// refuses what libgomp would pass over with a warning (`abc`, `0`: it then
// runs a thread per core, not what the user asked). libgomp's form: a
// count, or a comma list of counts per nesting level (the first is
// ctrax's), spaces around. 0, or EXIT_USAGE said.
static int check_omp_num_threads(void) {
    const char *env = getenv("OMP_NUM_THREADS");
    if (!env) return 0;
    char *end;
    errno = 0;
    long long n = strtoll(env, &end, 10);
    end += strspn(end, " \t");
    bool count = end != env && (*end == '\0' || *end == ',') && errno == 0;
    if (count && n >= 1 && n <= CTRAX_MAX_THREADS) return 0;
    fprintf(stderr, "ctrax: OMP_NUM_THREADS='%.40s' is %s; ctrax runs 1 to %d threads (unset it, or use --threads N)\n",
            env, count ? "out of range" : "not a thread count", CTRAX_MAX_THREADS);
    return EXIT_USAGE;
}

int main(int argc, char **argv) {
    open_standard_streams();
    // Before running again (prepare_environment): libgomp's own warning
    // about the value is then said once.
    int omp = check_omp_num_threads();
    if (omp) return omp;
    prepare_environment(argv);
    ctrax_catch_sigbus();
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        usage(stdout);
        return ctrax_flush_stdout("--help");
    }
    if (!strcmp(cmd, "train")) {
        train_args a;
        int r = parse_train_args(argc - 2, argv + 2, &a);
        if (r == 1) return ctrax_flush_stdout("train");  // --help, --configurables
        if (r) return r;
        // The log lost (a full disk) must not look done, even when the
        // checkpoints were written.
        r = run_train(&a);
        return r ? r : ctrax_flush_stdout("train");
    }
    // eval, sample and info --system read --threads themselves.
    if (!strcmp(cmd, "eval")) return ctrax_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return ctrax_cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return ctrax_cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return ctrax_cmd_plot(argc - 1, argv + 1);
    fprintf(stderr, "ctrax: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}
