// ctrax: the command-line trainer.
//
//   ctrax train CONFIG [--set 'Name.param=value']... [--output-dir DIR] [--steps N]
//                      [--devices N] [--restart]
//
// Exit codes: 0 done, 1 error, 2 bad usage.
#include <errno.h>
#include <libgen.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "commands.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "ctrax/train/loop.h"

#define EXIT_USAGE CTRAX_EXIT_USAGE
#define MAX_SETS 64

// Set by SIGINT/SIGTERM: the loop finishes its step, writes a checkpoint and
// returns (a program global, not the library's).
static volatile sig_atomic_t stop_requested;

static void on_signal(int sig) {
    (void)sig;
    stop_requested = 1;
}

// ---- train ------------------------------------------------------------------------

typedef struct train_args {
    const char *config;
    const char *sets[MAX_SETS];
    int n_sets;
    const char *output_dir;
    long steps;    // -1: the config's train.steps
    int devices;   // 0: the config's train.n_devices
    bool restart;  // ignore checkpoints in the output dir
} train_args;

static void train_usage(FILE *f) {
    fprintf(f,
            "usage: ctrax train CONFIG [options]\n"
            "\n"
            "Trains the model a gin config describes (configs/ has examples), with evals,\n"
            "checkpoints and summaries in the output directory. A directory that holds a\n"
            "checkpoint is resumed from its newest complete one, exactly where it stopped.\n"
            "Ctrl-C (or SIGTERM) finishes the current step, writes a checkpoint and exits.\n"
            "Under `mpirun -np M`, each process trains on its share of every batch.\n"
            "\n"
            "options:\n"
            "  --set 'Name.param=value'  override a binding (repeatable), e.g. --set 'train.steps=500'\n"
            "  --output-dir DIR          where checkpoints and metrics go [runs/<config name>]\n"
            "  --steps N                 train until step N (overrides train.steps)\n"
            "  --devices N               local replicas (threads) splitting each batch (train.n_devices)\n"
            "  --restart                 start from step 0 even if DIR holds checkpoints\n"
            "  --configurables           list every name a config can bind, with its parameters\n"
            "  -h, --help                show this help\n"
            "\n"
            "Output: runs/NAME/model_<step>/ (weights.safetensors, slots.safetensors, state.json),\n"
            "metrics.jsonl, train/ and eval/ TensorBoard event files, config.gin (the operative config).\n");
}

static int parse_long_arg(const char *opt, const char *s, long lo, long hi, long *out) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || *end || end == s || v < lo || v > hi) {
        fprintf(stderr, "ctrax train: %s expects an integer in [%ld, %ld], got '%s'\n", opt, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

// 0 ok, 1 --help shown, EXIT_USAGE after a message.
static int parse_train_args(int argc, char **argv, train_args *a) {
    memset(a, 0, sizeof *a);
    a->steps = -1;
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
        if (s[0] != '-') {
            if (a->config) {
                fprintf(stderr, "ctrax train: one config file, got '%s' and '%s'\n", a->config, s);
                return EXIT_USAGE;
            }
            a->config = s;
            continue;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "ctrax train: unknown option or missing value: '%s' (see ctrax train --help)\n", s);
            return EXIT_USAGE;
        }
        const char *v = argv[++i];
        long n;
        if (!strcmp(s, "--set")) {
            if (a->n_sets == MAX_SETS) {
                fprintf(stderr, "ctrax train: more than %d --set options\n", MAX_SETS);
                return EXIT_USAGE;
            }
            a->sets[a->n_sets++] = v;
        } else if (!strcmp(s, "--output-dir")) {
            a->output_dir = v;
        } else if (!strcmp(s, "--steps")) {
            if (parse_long_arg(s, v, 0, 1L << 40, &a->steps)) return EXIT_USAGE;
        } else if (!strcmp(s, "--devices")) {
            if (parse_long_arg(s, v, 1, CT_MAX_LOCAL_DEVICES, &n)) return EXIT_USAGE;
            a->devices = (int)n;
        } else {
            fprintf(stderr, "ctrax train: unknown option '%s' (see ctrax train --help)\n", s);
            return EXIT_USAGE;
        }
    }
    if (!a->config) {
        fprintf(stderr, "ctrax train: which config? (ctrax train CONFIG; configs/ has examples)\n");
        return EXIT_USAGE;
    }
    return 0;
}

// Evals at step 1 and every train.eval_frequency steps (Trax's default).
static bool eval_every(int64_t step, void *user) {
    int64_t every = *(const int64_t *)user;
    return step == 1 || (every > 0 && step % every == 0);
}

// Everything a training run builds, freed together.
typedef struct train_run {
    ct_config *cfg;
    ct_comm *comm;
    ct_layer *model, *loss;
    ct_optimizer *opt;
    ct_schedule *schedule;
    ct_stream *train, *eval;
    ct_layer *metrics[CT_EVAL_MAX_METRICS];
    const char *metric_names[CT_EVAL_MAX_METRICS];
    int n_metrics;
    int64_t eval_frequency, eval_steps;
    ct_loop *loop;
    char *config_text;
    char output_dir[4096];
} train_run;

static void train_run_free(train_run *r) {
    ct_loop_free(r->loop);
    for (int i = 0; i < r->n_metrics; i++) ct_layer_free(r->metrics[i]);
    ct_stream_free(r->train);
    ct_stream_free(r->eval);
    ct_schedule_free(r->schedule);
    ct_optimizer_free(r->opt);
    ct_layer_free(r->model);
    ct_layer_free(r->loss);
    ct_free(r->config_text);
    ct_config_free(r->cfg);
    ct_comm_free(r->comm);
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

// The memory budget, from the settings alone, before anything big is built:
// a model or batch that cannot fit is refused here, naming the setting and
// the bytes, not by the kernel's OOM killer later.
static ct_status check_memory(train_run *r, const train_args *a, const ct_train_settings *t, ct_error *err) {
    ct_config_run_shape shape = {.model = t->model, .optimizer = t->optimizer, .inputs = t->inputs,
                                 .batch_size = t->batch_size, .n_devices = a->devices ? a->devices : (int)t->n_devices,
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
        ct_log(CT_LOG_WARN, "%s: this run needs about %s; %s of memory is available now", a->config,
               ct_format_bytes(need, n, sizeof n), ct_format_bytes(avail, f, sizeof f));
    }
    return CT_OK;
}

// Builds model, loss, optimizer, schedule, streams and metrics.
static ct_status build_objects(train_run *r, const ct_train_settings *t, ct_error *err) {
    ct_config *c = r->cfg;
    CT_TRY(ct_config_build_model(c, t->model, &r->model, err));
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
    o->restore = !a->restart;
    o->seed = (uint64_t)t->random_seed;
    o->checkpoint_low_metric = t->checkpoint_lowest;
    o->checkpoint_high_metric = t->checkpoint_highest;
    o->trainer.n_devices = a->devices ? a->devices : (int)t->n_devices;
    o->trainer.adasum = t->adasum;
    o->trainer.memory_efficient = t->use_memory_efficient_trainer;
    o->trainer.loss_chunk_size = t->loss_chunk_size;
    o->skip_nonfinite = t->skip_nonfinite_steps;
    o->trainer.clip_grad_norm = (float)t->clip_grad_norm;
    o->trainer.comm = r->comm;
    o->stop = &stop_requested;
    o->config_text = r->config_text;
    o->log = stdout;
    o->progress = stderr;
    o->eval_at = eval_every;
    o->predicate_user = &r->eval_frequency;
}

// runs/<config name without its extension>, or --output-dir.
static void output_dir(train_run *r, const train_args *a) {
    if (a->output_dir) {
        snprintf(r->output_dir, sizeof r->output_dir, "%s", a->output_dir);
        return;
    }
    char copy[4096];
    snprintf(copy, sizeof copy, "%s", a->config);
    char *base = basename(copy), *dot = strrchr(base, '.');
    if (dot) *dot = '\0';
    snprintf(r->output_dir, sizeof r->output_dir, "runs/%s", base);
}

// Reads the config and builds model, loss, optimizer, schedule, streams and
// metrics. Every setting is read here (ct_config_read_train/loop read each
// one the registry accepts), before training, so the operative config is
// complete and every config error shows before step 1.
static ct_status build_run(train_run *r, const train_args *a, ct_loop_options *o, int64_t *steps, ct_error *err) {
    r->cfg = ct_config_new();
    CT_TRY(ct_config_parse_file(r->cfg, a->config, err));
    for (int i = 0; i < a->n_sets; i++) CT_TRY(ct_config_set(r->cfg, a->sets[i], err));
    CT_TRY(ct_config_validate(r->cfg, err));

    ct_config *c = r->cfg;
    ct_train_settings t;
    ct_loop_settings l;
    int64_t permanent = 0;
    CT_TRY(ct_config_read_train(c, &t, err));
    CT_TRY(ct_config_read_loop(c, &l, err));
    CT_TRY(permanent_period(c, &t, &l, &permanent, err));
    r->eval_frequency = t.eval_frequency;
    r->eval_steps = t.eval_steps;
    if (!t.model) return ct_error_set(err, CT_ERR_ARG, "%s: no model: bind train.model = @SomeModel", a->config);
    if (!t.inputs) return ct_error_set(err, CT_ERR_ARG, "%s: no data: bind train.inputs = @SomeInputs", a->config);
    CT_TRY(check_memory(r, a, &t, err));
    CT_TRY(build_objects(r, &t, err));

    output_dir(r, a);
    r->config_text = ct_config_operative_text(c);
    for (int i = 0; i < ct_config_n_bindings(c); i++) {
        ct_config_binding_info b = ct_config_binding_at(c, i);
        if (!b.used)
            ct_log(CT_LOG_WARN, "%s:%d: %s.%s is bound but this program never reads it", b.file, b.line, b.name,
                   b.param);
    }
    *steps = a->steps >= 0 ? a->steps : t.steps;
    loop_options(r, a, &t, &l, permanent, o);
    return CT_OK;
}


// Which OpenBLAS kernel the matrix products run, and why.
static void print_blas(void) {
    const char *generic = getenv("CTRAX_BLAS_GENERIC"), *better = ct_blas_vector_core();
    if (generic && getenv("OPENBLAS_CORETYPE"))
        printf("blas: OpenBLAS kernel %s, chosen from this CPU's vector features (OpenBLAS's table of CPU models "
               "gave the generic %s)\n",
               ct_blas_core(), generic);
    else if (better)
        printf("blas: OpenBLAS kernel %s (generic): this CPU could run %s; set OPENBLAS_CORETYPE=%s\n",
               ct_blas_core(), better, better);
    else
        printf("blas: OpenBLAS kernel %s\n", ct_blas_core());
}

// The trainer's memory plan: one line at start, and the same figures (bytes)
// in <output_dir>/memory_plan.json, recorded with the run.
static void print_memory_plan(const ct_memory_plan *p, const char *output_dir) {
    char line[512], path[4096];
    printf("%s\n", ct_memory_plan_format(p, line, sizeof line));
    int n = snprintf(path, sizeof path, "%s/memory_plan.json", output_dir);
    FILE *f = n > 0 && (size_t)n < sizeof path ? fopen(path, "w") : NULL;
    if (!f) {
        ct_log(CT_LOG_WARN, "%s: cannot write the memory plan", path);
        return;
    }
    fprintf(f,
            "{\"weights\": %zu, \"gradients\": %zu, \"optimizer_slots\": %zu, \"state\": %zu, "
            "\"activations\": %zu, \"stack\": %zu, \"scratch\": %zu, \"device_bytes\": %zu, \"host_bytes\": %zu}\n",
            p->weights, p->grads, p->slots, p->state, p->activations, p->stack, p->scratch, p->device_bytes,
            p->host_bytes);
    fclose(f);
}

static int run_train(const train_args *a) {
    train_run r;
    memset(&r, 0, sizeof r);
    ct_error err;
    ct_error_clear(&err);
    ct_loop_options o;
    int64_t steps = 0;
    int rc = 1;
    if (ct_comm_mpi_launched() && ct_comm_mpi_new(&r.comm, 0, &err) != CT_OK) goto done;
    int rank = r.comm ? ct_comm_rank(r.comm) : 0;
    if (rank != 0) ct_log_set_level(CT_LOG_ERROR);  // the chief speaks for the job
    if (build_run(&r, a, &o, &steps, &err) != CT_OK) goto done;
    if (rank != 0) o.log = o.progress = NULL;
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
    signal(SIGINT, on_signal);
    signal(SIGTERM, on_signal);
    if (ct_loop_new(&r.loop, r.model, &task, 1, r.eval_steps > 0 ? &ev : NULL, &o, &err) != CT_OK) goto done;
    if (rank == 0) {
        const ct_net *net = ct_loop_net(r.loop);
        char desc[512];
        ct_stream_describe(r.train, desc, sizeof desc);
        printf("%s: %s, %zu weights (%.2f MiB); %s trainer, %d device(s) x %d process(es); output %s\n", a->config,
               r.model->name, net->n_weights, (double)net->n_weights * 4 / (1 << 20),
               o.trainer.memory_efficient ? "memory-efficient" : "standard", o.trainer.n_devices,
               r.comm ? ct_comm_size(r.comm) : 1, r.output_dir);
        printf("data: %s\n", desc);
        print_blas();
        print_memory_plan(ct_trainer_memory_plan(ct_loop_trainer(r.loop)), r.output_dir);
        if (ct_loop_restored_from(r.loop)[0])
            printf("resuming from %s/%s at step %lld\n", r.output_dir, ct_loop_restored_from(r.loop),
                   (long long)ct_loop_step(r.loop));
        fflush(stdout);
    }
    if (ct_loop_run(r.loop, steps, &err) != CT_OK) goto done;
    if (rank == 0) {
        if (ct_loop_stopped(r.loop))
            printf("stopped at step %lld; checkpoint written. Run the same command to continue.\n",
                   (long long)ct_loop_step(r.loop));
        else
            printf("done: step %lld; checkpoints, metrics.jsonl and TensorBoard files in %s\n",
                   (long long)ct_loop_step(r.loop), r.output_dir);
    }
    rc = 0;
done:
    if (rc) {
        fprintf(stderr, "ctrax train: %s\n", err.msg);
        if (r.comm && ct_comm_size(r.comm) > 1) ct_comm_abort(r.comm, 1);  // the others cannot go on alone
    }
    train_run_free(&r);
    return rc;
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
            "  plot PATH           an SVG of the loss and metric curves in metrics.jsonl\n"
            "\n"
            "ctrax COMMAND --help shows a command's options. Exit codes: 0 done, 1 error, 2 bad usage.\n");
}

// OpenBLAS picks its kernel from a table of CPU models when it loads; on a
// CPU the table does not know it falls back to a generic SSE3 kernel, 4-5x
// slower. Then the kernel the CPU's features run (ct_blas_vector_core) is
// put in OPENBLAS_CORETYPE and the program executes itself again, once:
// CTRAX_BLAS_GENERIC keeps the generic name for the log and stops a loop.
// A user's own OPENBLAS_CORETYPE is left alone.
static void use_vector_blas(char **argv) {
    if (getenv("OPENBLAS_CORETYPE") || getenv("CTRAX_BLAS_GENERIC")) return;
    const char *core = ct_blas_vector_core();
    if (!core) return;
    if (setenv("CTRAX_BLAS_GENERIC", ct_blas_core(), 1) || setenv("OPENBLAS_CORETYPE", core, 1)) return;
    execv("/proc/self/exe", argv);
    unsetenv("OPENBLAS_CORETYPE");  // could not run again: keep the generic kernel (logged by train)
}

int main(int argc, char **argv) {
    use_vector_blas(argv);
    if (argc < 2) {
        usage(stderr);
        return EXIT_USAGE;
    }
    const char *cmd = argv[1];
    if (!strcmp(cmd, "-h") || !strcmp(cmd, "--help")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(cmd, "train")) {
        train_args a;
        int r = parse_train_args(argc - 2, argv + 2, &a);
        if (r == 1) return 0;
        if (r) return r;
        return run_train(&a);
    }
    if (!strcmp(cmd, "eval")) return ctrax_cmd_eval(argc - 1, argv + 1);
    if (!strcmp(cmd, "sample")) return ctrax_cmd_sample(argc - 1, argv + 1);
    if (!strcmp(cmd, "info")) return ctrax_cmd_info(argc - 1, argv + 1);
    if (!strcmp(cmd, "plot")) return ctrax_cmd_plot(argc - 1, argv + 1);
    fprintf(stderr, "ctrax: unknown command '%s'\n\n", cmd);
    usage(stderr);
    return EXIT_USAGE;
}
