// The Loop's Trax semantics (issue 14, Deliver 2): permanent checkpoints
// (the step-1 one, a period, a list) that pruning never removes;
// checkpoints_at and eval_at_steps; which_task's default (step % n_tasks);
// train tasks with their own loss and optimizer, resumed bit for bit;
// tasks with losses of two kinds (TaskLosses' gradient with each active, a
// step of each task as a loop of that task alone);
// several eval tasks and an eval model; training metrics averaged since the
// last log; the system seed recorded in the checkpoint; init_checkpoint.
#define _GNU_SOURCE  // memmem
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "check.h"
#include "copy_fixture.h"
#include "ctrax/ctrax.h"
#include "ctrax/layers/layer_author.h"
#include "core/fs.h"
#include "feed_fixture.h"
#include "gradcheck.h"
#include "scratch.h"

// A run directory in this program's scratch directory (the caller frees the name).
static char *temp_dir(const char *tag) { return strdup(tmp_path(tag)); }

static bool exists(const char *dir, const char *name) {
    char p[512];
    struct stat st;
    snprintf(p, sizeof p, "%s/%s", dir, name);
    return stat(p, &st) == 0;
}

// Whether checkpoint `name` is in dir and marked kept (permanent, best).
static int kept(const char *dir, const char *name) {
    ct_checkpoint_info *infos;
    int n;
    ct_error err;
    CHECK_OK(ct_checkpoint_list(dir, &infos, &n, &err), &err);
    int r = -1;  // absent
    for (int i = 0; i < n; i++)
        if (!strcmp(infos[i].name, name)) r = infos[i].keep;
    free(infos);
    return r;
}

static float lr_adam(void) { return ct_adam_default_params().learning_rate; }

// One task (Adam on the copy task), no evals, run to `steps` in dir.
static ct_loop *one_task_loop(const char *dir, ct_loop_options o, ct_stream *train, ct_layer *model, ct_layer *loss) {
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", lr_adam()};
    o.output_dir = dir;
    o.seed = 11;
    ct_loop *loop = NULL;
    ct_error err;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err), &err);
    return loop;
}

// ---- 1, 2: permanent checkpoints, checkpoints_at, eval_at_steps ---------------------

static void test_permanent_and_lists(void) {
    char *dir = temp_dir("perm");
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_error err;

    // Regular every 2 steps, one kept; permanent every 4, and so at step 1.
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 2;
    o.n_steps_per_permanent_checkpoint = 4;
    o.keep_last = 1;
    ct_loop *loop = one_task_loop(dir, o, train, model, loss);
    CHECK_OK(ct_loop_run(loop, 10, &err), &err);
    ct_loop_free(loop);
    int k1 = kept(dir, "model_1"), k4 = kept(dir, "model_4"), k8 = kept(dir, "model_8"), k10 = kept(dir, "model_10");
    printf("permanent every 4, regular every 2, keep 1: model_1 %d, model_4 %d, model_8 %d, model_10 %d "
           "(1 kept, 0 regular, -1 gone); model_2 %d, model_6 %d\n",
           k1, k4, k8, k10, kept(dir, "model_2"), kept(dir, "model_6"));
    CHECK_MSG(k1 == 1, "no permanent checkpoint at step 1 (Trax writes one with a period)");
    CHECK(k4 == 1 && k8 == 1 && k10 == 0);
    CHECK(kept(dir, "model_2") == -1 && kept(dir, "model_6") == -1);

    // Lists: regular checkpoints at 3 and 5 only (and the final one),
    // permanent at 2, evals (and training logs) at 4 only.
    ct_fs_remove_tree(dir, NULL);
    o = ct_loop_default_options();
    o.keep_last = 10;
    int64_t ck[2] = {5, 3}, perm[1] = {2}, ev[1] = {4};
    o.checkpoints_at = ck, o.n_checkpoints_at = 2;
    o.permanent_checkpoints_at = perm, o.n_permanent_checkpoints_at = 1;
    o.eval_at_steps = ev, o.n_eval_at_steps = 1;
    loop = one_task_loop(dir, o, train, model, loss);
    CHECK_OK(ct_loop_run(loop, 7, &err), &err);
    int n_hist, logs = 0, log_at_4 = 0;
    const ct_history_entry *h = ct_loop_history(loop, &n_hist);
    for (int i = 0; i < n_hist; i++)
        if (!strcmp(h[i].metric, "metrics/loss")) logs++, log_at_4 += h[i].step == 4;
    ct_loop_free(loop);
    CHECK(kept(dir, "model_1") == -1 && kept(dir, "model_2") == 1 && kept(dir, "model_3") == 0);
    CHECK(kept(dir, "model_4") == -1 && kept(dir, "model_5") == 0 && kept(dir, "model_7") == 0);
    // Training logs at 4 and at the last step (7).
    CHECK_MSG(logs == 2 && log_at_4 == 1, "%d training logs, %d at step 4", logs, log_at_4);

    // An empty list means never; a step 0 is refused.
    ct_fs_remove_tree(dir, NULL);
    o = ct_loop_default_options();
    o.checkpoints_at = ck, o.n_checkpoints_at = 0;
    loop = one_task_loop(dir, o, train, model, loss);
    CHECK_OK(ct_loop_run(loop, 3, &err), &err);
    ct_loop_free(loop);
    CHECK(kept(dir, "model_1") == -1 && kept(dir, "model_3") == 0);
    int64_t zero[1] = {0};
    o.checkpoints_at = zero, o.n_checkpoints_at = 1;
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
    CHECK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err) == CT_ERR_ARG && strstr(err.msg, "checkpoints_at[0]"));
    printf("step 0 in a list: %s\n", err.msg);

    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(loss);
    ct_fs_remove_tree(dir, NULL);
    free(dir);
}

// ---- 3: which_task's default ---------------------------------------------------------

static int task_two(int64_t step, void *user) {
    (void)step, (void)user;
    return 2;
}

static void test_which_task_default(void) {
    ct_stream *a = copy_batches(1), *b = copy_batches(5);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_train_task tasks[2] = {{a, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()},
                              {b, loss, NULL, NULL, NULL, lr_adam()}};
    ct_loop_options o = ct_loop_default_options();
    ct_loop *loop;
    ct_error err;
    CHECK_OK(ct_loop_new(&loop, model, tasks, 2, NULL, &o, &err), &err);
    CHECK_OK(ct_loop_run(loop, 5, &err), &err);
    // Steps 1, 3, 5 train task 1 (s % 2 == 1), steps 2, 4 task 0, as Trax's
    // `n % len(tasks)` of its step after the increment.
    int64_t pa = ct_stream_get_cursor(a).position, pb = ct_stream_get_cursor(b).position;
    printf("which_task default, 5 steps: task 0 took %lld batches, task 1 %lld\n", (long long)pa, (long long)pb);
    CHECK_MSG(pa == 2 && pb == 3, "task cursors %lld and %lld (want 2 and 3)", (long long)pa, (long long)pb);
    ct_loop_free(loop);

    // A which_task out of range stops the run naming the step.
    tasks[0].optimizer = ct_adam_new(ct_adam_default_params());
    o.which_task = task_two;
    CHECK_OK(ct_loop_new(&loop, model, tasks, 2, NULL, &o, &err), &err);
    CHECK(ct_loop_run(loop, 5, &err) == CT_ERR_ARG && strstr(err.msg, "task 2 for step 1"));
    printf("which_task out of range: %s\n", err.msg);
    ct_loop_free(loop);

    // The memory-efficient trainer lays its slots out once: a task's own
    // optimizer is refused there.
    o = ct_loop_default_options();
    o.trainer.memory_efficient = true;
    tasks[0].optimizer = ct_adam_new(ct_adam_default_params());
    tasks[1].optimizer = ct_sgd_new(ct_sgd_default_params());
    CHECK(ct_loop_new(&loop, model, tasks, 2, NULL, &o, &err) == CT_ERR_ARG && strstr(err.msg, "memory-efficient"));
    printf("own optimizer, memory-efficient trainer: %s\n", err.msg);
    ct_stream_free(a), ct_stream_free(b);
    ct_layer_free(model), ct_layer_free(loss);
}

// ---- 4: tasks with their own loss and optimizer ---------------------------------------

typedef struct two_tasks {
    ct_stream *a, *b;
    ct_layer *model, *loss_a, *loss_b;
    ct_loop *loop;
} two_tasks;

// Task 0: Adam and its loss; task 1: Adafactor (own: true) or task 0's
// optimizer (own: false), with a loss layer of its own. base: the options
// (NULL: checkpoints every 4 steps, seed 3).
static ct_status two_tasks_new_with(two_tasks *r, const char *dir, bool own, const ct_loop_options *base,
                                    ct_error *err) {
    memset(r, 0, sizeof *r);
    r->a = copy_batches(1);
    r->b = copy_batches(5);
    r->model = small_lm(0.1f);
    r->loss_a = ct_weighted_category_cross_entropy();
    r->loss_b = ct_weighted_category_cross_entropy();
    ct_adafactor_params ap = ct_adafactor_default_params();
    ct_train_task tasks[2] = {{r->a, r->loss_a, ct_adam_new(ct_adam_default_params()), NULL, "loss", lr_adam()},
                              {r->b, r->loss_b, own ? ct_adafactor_new(ap) : NULL, NULL, "loss_b", 0.01f}};
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 4;
    o.seed = 3;
    if (base) o = *base;
    o.output_dir = dir;
    return ct_loop_new(&r->loop, r->model, tasks, 2, NULL, &o, err);
}

static ct_status two_tasks_new(two_tasks *r, const char *dir, bool own, ct_error *err) {
    return two_tasks_new_with(r, dir, own, NULL, err);
}

static void two_tasks_free(two_tasks *r) {
    ct_loop_free(r->loop);
    ct_stream_free(r->a), ct_stream_free(r->b);
    ct_layer_free(r->model), ct_layer_free(r->loss_a), ct_layer_free(r->loss_b);
}

static float *copy_floats(const float *x, size_t n) {
    float *c = malloc(n * sizeof *c + 4);
    memcpy(c, x, n * sizeof *c);
    return c;
}

static void test_own_loss_and_optimizer(void) {
    char *a = temp_dir("own_a"), *b = temp_dir("own_b"), *c = temp_dir("own_c");
    two_tasks r;
    ct_error err;
    // Straight: 10 steps.
    CHECK_OK(two_tasks_new(&r, a, true, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 10, &err), &err);
    const ct_net *net = ct_loop_net(r.loop);
    size_t nw = net->n_weights, ns;
    float *w1 = copy_floats(net->weights, nw);
    const float *slots = ct_trainer_slots(ct_loop_trainer(r.loop), &ns);
    float *s1 = copy_floats(slots, ns);
    double loss_b = ct_loop_last_value(r.loop, "train", "metrics/loss");
    two_tasks_free(&r);
    CHECK(exists(a, "model_10/slots_task1.safetensors") && exists(a, "model_10/slots.safetensors"));

    // 6 steps, then resumed to 10: the same weights and slots, bit for bit.
    CHECK_OK(two_tasks_new(&r, b, true, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    two_tasks_free(&r);
    CHECK_OK(two_tasks_new(&r, b, true, &err), &err);
    CHECK(ct_loop_step(r.loop) == 6);
    CHECK_OK(ct_loop_run(r.loop, 10, &err), &err);
    net = ct_loop_net(r.loop);
    CHECK_MSG(net->n_weights == nw && memcmp(net->weights, w1, nw * sizeof *w1) == 0,
              "two tasks with their own optimizers: resumed weights differ");
    CHECK_MSG(memcmp(ct_trainer_slots(ct_loop_trainer(r.loop), NULL), s1, ns * sizeof *s1) == 0,
              "task 0's slots differ after resume");
    two_tasks_free(&r);
    // Task 1's slots too: the two final checkpoints' slots_task1 files hold the same bytes.
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/model_10/slots_task1.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model_10/slots_task1.safetensors", b);
    char *ta, *tb;
    size_t na, nb;
    CHECK_OK(ct_fs_read(pa, &ta, &na, &err), &err);
    CHECK_OK(ct_fs_read(pb, &tb, &nb, &err), &err);
    CHECK_MSG(na == nb && memcmp(ta, tb, na) == 0, "task 1's slots differ after resume");
    CHECK(memmem(ta, na, "Adafactor", 9) != NULL);  // the file's metadata names its optimizer
    free(ta), free(tb);
    printf("two tasks (Adam, Adafactor; two losses), 10 steps straight vs 6 + resumed 4: weights and both tasks' "
           "slots bitwise equal; last train loss %.6f\n",
           loss_b);

    // Sharing task 0's optimizer trains differently: task 1's own one is used.
    CHECK_OK(two_tasks_new(&r, c, false, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 10, &err), &err);
    CHECK(memcmp(ct_loop_net(r.loop)->weights, w1, nw * sizeof *w1) != 0);
    CHECK(!exists(c, "model_10/slots_task1.safetensors"));
    two_tasks_free(&r);
    // Resuming a run whose task 1 shared the optimizer, now with its own: refused.
    CHECK(two_tasks_new(&r, c, true, &err) == CT_ERR_FORMAT && strstr(err.msg, "task 1"));
    printf("own optimizer against a shared one's checkpoint: %s\n", err.msg);
    two_tasks_free(&r);

    free(w1), free(s1);
    ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL), ct_fs_remove_tree(c, NULL);
    free(a), free(b), free(c);
}

// ---- 4b: tasks whose losses differ in kind --------------------------------------------

// which_task for the test: every step trains task *(const int *)user.
static int task_of_user(int64_t step, void *user) {
    (void)step;
    return *(const int *)user;
}

// One step of a loop on model: with n_tasks 2, task 0 is losses[0] on
// copy_batches(1) and task 1 losses[1] on copy_batches(5), and the step
// trains task `task`; with n_tasks 1, task `task` alone (as the loop's task
// 0). SGD for task 0, shared by task 1, so the update is the gradient of the
// loss that ran. Returns the weights after the step (malloc'd, *nw of them);
// with tl, a reference to the trainer's loss layer (TaskLosses for 2 tasks).
static float *one_step(ct_layer *model, ct_layer *const losses[2], int n_tasks, int task, size_t *nw,
                       ct_layer **tl) {
    static const uint64_t seeds[2] = {1, 5};
    ct_stream *s[2] = {NULL, NULL};
    ct_train_task tasks[2];
    for (int i = 0; i < n_tasks; i++) {
        int t = n_tasks == 1 ? task : i;
        s[i] = copy_batches(seeds[t]);
        tasks[i] = (ct_train_task){s[i], losses[t], i == 0 ? ct_sgd_new(ct_sgd_default_params()) : NULL, NULL,
                                   NULL, 0.1f};
    }
    int which = n_tasks == 1 ? 0 : task;
    ct_loop_options o = ct_loop_default_options();
    o.seed = 3;
    o.which_task = task_of_user, o.which_task_user = &which;
    ct_loop *loop;
    ct_error err;
    CHECK_OK(ct_loop_new(&loop, model, tasks, n_tasks, NULL, &o, &err), &err);
    CHECK_OK(ct_loop_run(loop, 1, &err), &err);
    const ct_net *net = ct_loop_net(loop);
    *nw = net->n_weights;
    float *w = copy_floats(net->weights, net->n_weights);
    // The trainer's net is Serial(model, loss).
    if (tl) *tl = ct_layer_ref(net->root->sub[1]);
    ct_loop_free(loop);
    for (int i = 0; i < n_tasks; i++) ct_stream_free(s[i]);
    return w;
}

// Tasks with losses of different kinds (CrossEntropyLoss: Trax's, for
// log-probabilities, on these logits linear in them;
// WeightedCategoryCrossEntropy) share the model through TaskLosses, which
// runs the active task's loss. With task t active: TaskLosses' gradient
// against finite differences (forward and backward must both run loss t),
// and a step of the two-task loop equals a step of a loop of task t alone,
// bit for bit, while the steps of the two tasks differ. CrossEntropyLoss
// first: its backward reads no logits, so a TaskLosses that ran loss 0's
// backward after loss 1's forward gives a wrong gradient here, not a crash.
static void test_losses_of_two_kinds(void) {
    ct_layer *model = small_lm(0.0f);
    ct_layer *losses[2] = {ct_cross_entropy_loss(), ct_weighted_category_cross_entropy()};
    float *two[2];
    size_t nw2[2];
    for (int t = 0; t < 2; t++) {
        size_t nw1;
        ct_layer *tl;
        two[t] = one_step(model, losses, 2, t, &nw2[t], &tl);
        float *one = one_step(model, losses, 1, t, &nw1, NULL);
        CHECK_MSG(nw1 == nw2[t] && memcmp(one, two[t], nw1 * sizeof *one) == 0,
                  "a step of task %d (%s) differs from a loop of that task alone", t, losses[t]->name);
        free(one);

        // TaskLosses on (logits, targets, weights) shaped as the loop's, the
        // weights fed (feed_fixture.h), task t's loss still active.
        CHECK(strcmp(tl->name, "TaskLosses") == 0 && tl->n_sub == 2);
        ct_tensor x = ct_tensor_sig(&tl->in_sigs[0]), ids = ct_tensor_sig(&tl->in_sigs[1]);
        ct_tensor ws = ct_tensor_sig(&tl->in_sigs[2]);
        x.data = malloc(ct_tensor_nbytes(&x)), ids.data = malloc(ct_tensor_nbytes(&ids));
        ws.data = malloc(ct_tensor_nbytes(&ws));
        gradcheck_fill(&x, 30, -2.0f, 2.0f);
        gradcheck_fill(&ws, 31, 0.0f, 1.0f);
        ((float *)ws.data)[1] = 0.0f;  // a padding position
        for (int64_t i = 0; i < ct_tensor_numel(&ids); i++) ((int32_t *)ids.data)[i] = (int32_t)((i * 7 + 3) % VOCAB);
        feed f = {2, 1, {ws}};
        ct_layer *l = with_feed(&f, tl);
        char label[64];
        snprintf(label, sizeof label, "TaskLosses, task %d (%s)", t, losses[t]->name);
        double e = gradcheck(label, l, (ct_tensor[]){x, ids}, 2, ct_gradcheck_defaults());
        CHECK_MSG(e >= 0 && e < CT_GRADCHECK_TOL, "%s: rel err %g", label, e);
        ct_layer_free(l);
        free(x.data), free(ids.data), free(ws.data);
    }
    size_t differ = 0;
    for (size_t i = 0; nw2[0] == nw2[1] && i < nw2[0]; i++) differ += two[0][i] != two[1][i];
    CHECK_MSG(nw2[0] == nw2[1] && differ > 0, "a step of task 0 and one of task 1 leave the same weights");
    printf("tasks with CrossEntropyLoss and WeightedCategoryCrossEntropy: a step of each equals a loop of that task "
           "alone, bitwise; the two steps leave %zu of %zu weights different\n",
           differ, nw2[0]);
    free(two[0]), free(two[1]);
    ct_layer_free(model), ct_layer_free(losses[0]), ct_layer_free(losses[1]);
}

// Three tasks whose losses are A, A, B: TaskLosses holds A and B once each,
// and task 2 runs B (its index among the distinct losses is 1, not 2): a
// step of task 2 equals a step of a loop of B alone.
static void test_three_tasks_two_losses(void) {
    ct_layer *model = small_lm(0.0f);
    ct_layer *losses[2] = {ct_cross_entropy_loss(), ct_weighted_category_cross_entropy()};
    ct_stream *s[3] = {copy_batches(1), copy_batches(1), copy_batches(5)};
    ct_train_task tasks[3] = {{s[0], losses[0], ct_sgd_new(ct_sgd_default_params()), NULL, NULL, 0.1f},
                              {s[1], losses[0], NULL, NULL, NULL, 0.1f},
                              {s[2], losses[1], NULL, NULL, NULL, 0.1f}};
    int which = 2;
    ct_loop_options o = ct_loop_default_options();
    o.seed = 3;
    o.which_task = task_of_user, o.which_task_user = &which;
    ct_loop *loop;
    ct_error err;
    CHECK_OK(ct_loop_new(&loop, model, tasks, 3, NULL, &o, &err), &err);
    CHECK_OK(ct_loop_run(loop, 1, &err), &err);
    const ct_net *net = ct_loop_net(loop);
    CHECK(net->root->sub[1]->n_sub == 2);  // TaskLosses: A and B once each
    size_t n3 = net->n_weights, nw;
    float *three = copy_floats(net->weights, n3);
    ct_loop_free(loop);  // the model is then free for the loop of B alone
    float *alone = one_step(model, losses, 1, 1, &nw, NULL);
    bool same = nw == n3 && memcmp(alone, three, nw * sizeof *alone) == 0;
    CHECK_MSG(same, "a step of task 2 (loss B, after two tasks of loss A) differs from a loop of B alone");
    printf("three tasks with losses A, A, B: a step of task 2 equals a loop of B alone: %s\n", same ? "yes" : "no");
    free(alone), free(three);
    for (int i = 0; i < 3; i++) ct_stream_free(s[i]);
    ct_layer_free(model), ct_layer_free(losses[0]), ct_layer_free(losses[1]);
}

// ---- 5: several eval tasks and an eval model -----------------------------------------

typedef struct evals_run {
    ct_stream *train, *ev_main, *ev_more;
    ct_layer *model, *eval_model, *loss, *m_main, *m_more;
    ct_loop *loop;
} evals_run;

// eval_model: 0 none, 1 the model without dropout, 2 that and a LogSoftmax,
// 3 a model of another width (refused).
static ct_status evals_new(evals_run *r, const char *dir, int eval_model, ct_error *err) {
    memset(r, 0, sizeof *r);
    r->train = copy_batches(1);
    r->ev_main = copy_batches(99);
    r->ev_more = copy_batches(99);  // the same data: the same values
    r->model = small_lm(0.1f);
    if (eval_model == 1) r->eval_model = small_lm(0);
    if (eval_model == 2) r->eval_model = ct_serial(CT_LAYERS(small_lm(0), ct_log_softmax()));
    if (eval_model == 3) {
        ct_transformer_lm_params p = ct_transformer_lm_default_params();
        p.vocab_size = VOCAB, p.d_model = 8, p.d_ff = 32, p.n_layers = 1, p.n_heads = 2, p.max_len = 2 * LEN + 2;
        r->eval_model = ct_transformer_lm(p);
    }
    r->loss = ct_weighted_category_cross_entropy();
    r->m_main = ct_weighted_category_cross_entropy();
    r->m_more = ct_weighted_category_cross_entropy();
    ct_train_task task = {r->train, r->loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", lr_adam()};
    ct_eval_task main_ev = {.stream = r->ev_main, .n_metrics = 1, .n_batches = 2};
    main_ev.metrics[0] = r->m_main;
    main_ev.metric_names[0] = "loss";
    static ct_eval_task more;
    more = (ct_eval_task){.stream = r->ev_more, .n_metrics = 1, .n_batches = 2};
    more.metrics[0] = r->m_more;
    more.metric_names[0] = "loss";
    static const char *const prefixes[1] = {"other"};
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = dir;
    o.n_steps_per_checkpoint = 3;
    o.seed = 5;
    o.additional_eval_tasks = &more;
    o.n_additional_eval_tasks = 1;
    o.eval_export_prefixes = prefixes;
    o.eval_model = r->eval_model;
    return ct_loop_new(&r->loop, r->model, &task, 1, &main_ev, &o, err);
}

static void evals_free(evals_run *r) {
    ct_loop_free(r->loop);
    ct_stream_free(r->train), ct_stream_free(r->ev_main), ct_stream_free(r->ev_more);
    ct_layer_free(r->model), ct_layer_free(r->eval_model), ct_layer_free(r->loss);
    ct_layer_free(r->m_main), ct_layer_free(r->m_more);
}

static void test_eval_tasks_and_model(void) {
    char *d[4];
    for (int i = 0; i < 4; i++) {
        char tag[16];
        snprintf(tag, sizeof tag, "evals%d", i);
        d[i] = temp_dir(tag);
    }
    evals_run r;
    ct_error err;
    double main_v[3], more_v[3];
    for (int m = 0; m < 3; m++) {
        CHECK_OK(evals_new(&r, d[m], m, &err), &err);
        CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
        main_v[m] = ct_loop_last_value(r.loop, "eval", "metrics/loss");
        more_v[m] = ct_loop_last_value(r.loop, "eval", "metrics/other/loss");
        evals_free(&r);
    }
    printf("eval loss at step 6: main %.7f, other %.7f; eval model without dropout %.7f / %.7f; with a LogSoftmax "
           "%.7f / %.7f\n",
           main_v[0], more_v[0], main_v[1], more_v[1], main_v[2], more_v[2]);
    // The same data in both tasks: the same values, under their own names.
    CHECK(isfinite(main_v[0]) && main_v[0] == more_v[0]);
    // Evals run in eval mode, so the model without dropout gives the same bits.
    CHECK(main_v[1] == main_v[0] && more_v[1] == more_v[0]);
    // log_softmax of log-probabilities changes them by rounding only.
    CHECK(fabs(main_v[2] - main_v[0]) < 1e-5 && fabs(more_v[2] - more_v[0]) < 1e-5);

    // Resumed at 3, the additional task's data goes on where it was.
    CHECK_OK(evals_new(&r, d[3], 1, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 3, &err), &err);
    evals_free(&r);
    CHECK_OK(evals_new(&r, d[3], 1, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    CHECK(ct_loop_last_value(r.loop, "eval", "metrics/other/loss") == more_v[1]);
    evals_free(&r);

    // Two additional tasks under one prefix ("1", the first one's number)
    // would record into the same metric names: refused.
    {
        ct_stream *t = copy_batches(1), *e0 = copy_batches(99), *e1 = copy_batches(99), *e2 = copy_batches(99);
        ct_layer *m = small_lm(0), *l = ct_weighted_category_cross_entropy();
        ct_layer *k0 = ct_weighted_category_cross_entropy(), *k1 = ct_weighted_category_cross_entropy(),
                 *k2 = ct_weighted_category_cross_entropy();
        ct_eval_task main_ev = {.stream = e0, .n_metrics = 1, .n_batches = 1}, more[2];
        main_ev.metrics[0] = k0, main_ev.metric_names[0] = "loss";
        more[0] = main_ev, more[0].stream = e1, more[0].metrics[0] = k1;
        more[1] = main_ev, more[1].stream = e2, more[1].metrics[0] = k2;
        const char *const prefixes[2] = {NULL, "1"};
        ct_loop_options o = ct_loop_default_options();
        o.additional_eval_tasks = more, o.n_additional_eval_tasks = 2, o.eval_export_prefixes = prefixes;
        ct_train_task task = {t, l, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
        ct_loop *loop = NULL;
        ct_status st = ct_loop_new(&loop, m, &task, 1, &main_ev, &o, &err);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "metrics/1/"), "two eval tasks under prefix 1: %s",
                  st == CT_OK ? "accepted" : err.msg);
        printf("two additional eval tasks under one prefix: %s\n", err.msg);
        if (st == CT_OK) ct_loop_free(loop);
        ct_stream_free(t), ct_stream_free(e0), ct_stream_free(e1), ct_stream_free(e2);
        ct_layer_free(m), ct_layer_free(l), ct_layer_free(k0), ct_layer_free(k1), ct_layer_free(k2);
    }

    // A metric's name as recorded (metrics/<prefix>/<name>) must fit the
    // history's entries: one cut short there was another name than the
    // summaries' (ct_loop_last_value of it found nothing), and two tasks whose
    // prefixes differ past the cut recorded under one name. Refused, naming it.
    {
        ct_stream *t = copy_batches(1), *e0 = copy_batches(99), *e1 = copy_batches(99);
        ct_layer *m = small_lm(0), *l = ct_weighted_category_cross_entropy();
        ct_layer *k0 = ct_weighted_category_cross_entropy(), *k1 = ct_weighted_category_cross_entropy();
        ct_eval_task main_ev = {.stream = e0, .n_metrics = 1, .n_batches = 1}, more;
        main_ev.metrics[0] = k0, main_ev.metric_names[0] = "loss";
        more = main_ev, more.stream = e1, more.metrics[0] = k1;
        char prefix[64], tag[128];
        memset(prefix, 'p', 60);
        prefix[60] = '\0';
        snprintf(tag, sizeof tag, "metrics/%s/loss", prefix);
        const char *const prefixes[1] = {prefix};
        ct_loop_options o = ct_loop_default_options();
        o.additional_eval_tasks = &more, o.n_additional_eval_tasks = 1, o.eval_export_prefixes = prefixes;
        ct_train_task task = {t, l, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
        ct_loop *loop = NULL;
        ct_status st = ct_loop_new(&loop, m, &task, 1, &main_ev, &o, &err);
        if (st == CT_OK) {
            CHECK_OK(ct_loop_run(loop, 1, &err), &err);
            int n;
            const ct_history_entry *h = ct_loop_history(loop, &n);
            printf("a 73-character metric name: accepted; recorded as '%s', %s\n", h[n - 1].metric,
                   isnan(ct_loop_last_value(loop, "eval", tag)) ? "not found by its name" : "found by its name");
            ct_loop_free(loop);
        } else {
            printf("a 73-character metric name: %s\n", err.msg);
        }
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, tag), "eval metric %s: %s", tag,
                  st == CT_OK ? "accepted" : err.msg);
        // The same for a train task's loss, recorded as metrics/<loss_name>.
        memcpy(prefix, "loss", 4);
        task = (ct_train_task){t, l, ct_adam_new(ct_adam_default_params()), NULL, prefix, lr_adam()};
        st = ct_loop_new(&loop, m, &task, 1, NULL, NULL, &err);
        if (st == CT_OK) ct_loop_free(loop);
        snprintf(tag, sizeof tag, "metrics/%s", prefix);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, tag), "train loss %s: %s", tag,
                  st == CT_OK ? "accepted" : err.msg);
        // A name that is not UTF-8 would go into metrics.jsonl and into
        // TensorBoard's proto3 strings, and readers refuse both files: refused
        // here, at the byte that breaks it. A loss name (a byte that starts
        // no character), an eval metric name (a character cut short) and an
        // additional eval task's prefix (a surrogate, which UTF-8 excludes).
        task = (ct_train_task){t, l, ct_adam_new(ct_adam_default_params()), NULL, "loss\xff", lr_adam()};
        st = ct_loop_new(&loop, m, &task, 1, NULL, NULL, &err);
        if (st == CT_OK) ct_loop_free(loop);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "train task's loss 'loss\\xff...'") && strstr(err.msg, "byte 4"),
                  "loss name not UTF-8: %s", st == CT_OK ? "accepted" : err.msg);
        printf("a loss name that is not UTF-8: %s\n", st == CT_OK ? "accepted" : err.msg);
        ct_eval_task bad_ev = main_ev;
        bad_ev.metric_names[0] = "acc\xe2\x82";
        task = (ct_train_task){t, l, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
        st = ct_loop_new(&loop, m, &task, 1, &bad_ev, NULL, &err);
        if (st == CT_OK) ct_loop_free(loop);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "eval metric 'acc\\xe2...'") && strstr(err.msg, "byte 3"),
                  "eval metric name not UTF-8: %s", st == CT_OK ? "accepted" : err.msg);
        const char *const bad_prefixes[1] = {"p\xed\xa0\x80"};
        o.eval_export_prefixes = bad_prefixes;
        task = (ct_train_task){t, l, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
        st = ct_loop_new(&loop, m, &task, 1, &main_ev, &o, &err);
        if (st == CT_OK) ct_loop_free(loop);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "export_prefix 'p\\xed...'") && strstr(err.msg, "byte 1"),
                  "export_prefix not UTF-8: %s", st == CT_OK ? "accepted" : err.msg);
        ct_stream_free(t), ct_stream_free(e0), ct_stream_free(e1);
        ct_layer_free(m), ct_layer_free(l), ct_layer_free(k0), ct_layer_free(k1);
    }

    // An eval model whose weights are not the model's is refused, by name.
    ct_fs_remove_tree(d[3], NULL);
    CHECK(evals_new(&r, d[3], 3, &err) == CT_ERR_ARG && strstr(err.msg, "eval model"));
    printf("eval model of another width: %s\n", err.msg);
    evals_free(&r);
    for (int i = 0; i < 4; i++) ct_fs_remove_tree(d[i], NULL), free(d[i]);
}

// An eval model runs on the model's state too: a layer whose output is
// x * (1 + count), count going up by one at each training forward (a
// counter, as LSHSelfAttention's), makes an eval depend on the state
// training left. Loop a evals with an eval model, loop b on the model.
static ct_status counted_init(ct_layer *l, ct_init_ctx *ic, const ct_tensor *in, ct_tensor *out, ct_key key,
                              ct_error *err) {
    (void)err;
    ct_layer_declare_state(l, ic, "count", ct_tensor_1d(CT_DTYPE_F32, 1, NULL), (ct_initializer){CT_INIT_ZEROS, 0},
                           key);
    out[0] = ct_tensor_sig(&in[0]);
    return CT_OK;
}
static ct_status counted_forward(ct_layer *l, ct_ctx *c, const ct_tensor *in, ct_tensor *out, ct_key key,
                                 ct_error *err) {
    (void)key;
    out[0] = ct_tensor_sig(&in[0]);
    CT_TRY(ct_ctx_alloc(c, &out[0], err));
    float scale = 1.0f + ct_state(c, l, 0)[0];
    for (int64_t i = 0; i < ct_tensor_numel(&in[0]); i++) ct_f32(&out[0])[i] = ct_f32(&in[0])[i] * scale;
    if (c->train) ct_state(c, l, 0)[0] += 1.0f;
    return CT_OK;
}
static ct_status counted_backward(ct_layer *l, ct_ctx *c, const ct_tensor *grad_out, ct_tensor *grad_in, ct_key key,
                                  ct_error *err) {
    (void)key;
    ct_tensor g = grad_out[0];
    CT_TRY(ct_ctx_grad_or_zeros(c, &g, err));
    grad_in[0] = ct_tensor_sig(&g);
    CT_TRY(ct_ctx_alloc(c, &grad_in[0], err));
    float scale = ct_state(c, l, 0)[0];  // 1 + the count forward read: it has gone up by one since
    for (int64_t i = 0; i < ct_tensor_numel(&g); i++) ct_f32(&grad_in[0])[i] = ct_f32(&g)[i] * scale;
    return CT_OK;
}
static const ct_layer_vtable counted_vt = {
    .type = "Counted", .init = counted_init, .forward = counted_forward, .backward = counted_backward};
static ct_layer *counted_lm(float dropout) {
    return ct_serial(CT_LAYERS(small_lm(dropout), ct_layer_new(&counted_vt, "Counted", 1, 1, NULL, NULL, 0)));
}

static void test_eval_model_state(void) {
    double v[2];
    for (int k = 0; k < 2; k++) {
        ct_stream *train = copy_batches(1), *ev = copy_batches(99);
        ct_layer *model = counted_lm(0.1f), *eval_model = k == 0 ? counted_lm(0) : NULL;
        ct_layer *loss = ct_weighted_category_cross_entropy(), *metric = ct_weighted_category_cross_entropy();
        ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", lr_adam()};
        ct_eval_task e = {.stream = ev, .n_metrics = 1, .n_batches = 1, .metrics = {metric}, .metric_names = {"loss"}};
        ct_loop_options o = ct_loop_default_options();
        o.n_steps_per_checkpoint = 3;  // evals at 1 and 3
        o.seed = 5;
        o.eval_model = eval_model;
        ct_loop *loop;
        ct_error err;
        CHECK_OK(ct_loop_new(&loop, model, &task, 1, &e, &o, &err), &err);
        CHECK_OK(ct_loop_run(loop, 3, &err), &err);
        v[k] = ct_loop_last_value(loop, "eval", "metrics/loss");
        ct_loop_free(loop);
        ct_stream_free(train), ct_stream_free(ev);
        ct_layer_free(model), ct_layer_free(eval_model), ct_layer_free(loss), ct_layer_free(metric);
    }
    printf("a model with a counter, eval at step 3: with an eval model %.9g, on the model %.9g\n", v[0], v[1]);
    CHECK_MSG(isfinite(v[0]) && v[0] == v[1], "the eval model's eval %.9g differs from the model's %.9g", v[0], v[1]);
}

// ---- 6: training metrics averaged since the last log ---------------------------------

static bool every_step(int64_t step, void *user) {
    (void)step, (void)user;
    return true;
}

// The value of (train, metric) logged at step, or NAN.
static double logged(const ct_loop *loop, const char *metric, int64_t step) {
    int n;
    const ct_history_entry *h = ct_loop_history(loop, &n);
    for (int i = 0; i < n; i++)
        if (!strcmp(h[i].mode, "train") && !strcmp(h[i].metric, metric) && h[i].step == step) return h[i].value;
    return NAN;
}

static void test_averaged_since_log(void) {
    ct_stream *s1 = copy_batches(1), *s2 = copy_batches(1);
    ct_layer *m1 = small_lm(0.1f), *m2 = small_lm(0.1f);
    ct_layer *loss = ct_weighted_category_cross_entropy(), *loss2 = ct_weighted_category_cross_entropy();
    ct_error err;
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 4;  // logs at 1, 4 (steps 2..4 averaged), 8 (5..8)
    char *log_text = NULL;
    size_t log_len = 0;
    FILE *a_log = open_memstream(&log_text, &log_len);
    o.log = a_log;
    ct_loop *a = one_task_loop(NULL, o, s1, m1, loss);
    o.log = NULL;
    o.eval_at = every_step;  // logs every step: each step's own values
    ct_loop *b = one_task_loop(NULL, o, s2, m2, loss2);
    CHECK_OK(ct_loop_run(a, 8, &err), &err);
    CHECK_OK(ct_loop_run(b, 8, &err), &err);
    const char *metrics[4] = {"metrics/loss", "training/loss", "training/gradients_l2", "training/weights_l2"};
    for (int k = 0; k < 4; k++) {
        for (int64_t end = 4; end <= 8; end += 4) {
            // The logs before: at step 1, then at 4.
            int64_t from = end == 4 ? 2 : 5;
            double sum = 0;
            for (int64_t s = from; s <= end; s++) sum += logged(b, k == 1 ? "metrics/loss" : metrics[k], s);
            double got = logged(a, metrics[k], end), want = sum / (double)(end - from + 1), last = logged(b, metrics[k], end);
            if (end == 8) printf("%s at step 8: logged %.7f, mean of steps 5..8 %.7f, step 8's %.7f\n", metrics[k], got,
                                 want, last);
            CHECK_MSG(fabs(got - want) <= 1e-6 * fabs(want), "%s at step %lld: %.9g, the mean since the last log is %.9g",
                      metrics[k], (long long)end, got, want);
        }
    }
    // The runs are the same run: its weights are the same (evals change nothing).
    CHECK(memcmp(ct_loop_net(a)->weights, ct_loop_net(b)->weights, ct_loop_net(a)->n_weights * sizeof(float)) == 0);
    // Trax's log lines count the steps since the last log: 1, then 3, then 4.
    ct_loop_free(a), ct_loop_free(b);
    fclose(a_log);
    const char *ran[3] = {"Step      1: Ran 1 train steps in", "Step      4: Ran 3 train steps in",
                          "Step      8: Ran 4 train steps in"};
    for (int i = 0; i < 3; i++)
        CHECK_MSG(log_text && strstr(log_text, ran[i]), "no line '%s' in the log:\n%s", ran[i], log_text ? log_text : "");
    free(log_text);
    ct_stream_free(s1), ct_stream_free(s2);
    ct_layer_free(m1), ct_layer_free(m2), ct_layer_free(loss), ct_layer_free(loss2);
}

// A stop requested at step 6 (as SIGINT does).
static volatile sig_atomic_t stop_flag;
static void stop_at_6(int64_t step, void *user) {
    (void)user;
    if (step == 6) stop_flag = 1;
}

static void stop_at_3(int64_t step, void *user) {
    (void)user;
    if (step == 3) stop_flag = 1;
}

// The averages since the last log survive a stop between logs: 10 steps
// straight and stopped at 6 + resumed to 10 log the same training metrics
// (the log at 8 averages steps 5..8 in both).
static void test_averaged_across_stop(void) {
    char *a = temp_dir("avg_a"), *b = temp_dir("avg_b");
    ct_stream *s1 = copy_batches(1);
    ct_layer *m1 = small_lm(0.1f), *loss = ct_weighted_category_cross_entropy();
    ct_error err;
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 4;
    ct_loop *loop = one_task_loop(a, o, s1, m1, loss);
    CHECK_OK(ct_loop_run(loop, 10, &err), &err);
    int n;
    const ct_history_entry *h = ct_loop_history(loop, &n);
    ct_history_entry *straight = malloc((size_t)n * sizeof *straight + 1);
    memcpy(straight, h, (size_t)n * sizeof *straight);
    int n_straight = n;
    ct_loop_free(loop);

    // A fresh stream for the second run (the first moved s1 on by 10 batches).
    ct_stream_free(s1);
    s1 = copy_batches(1);
    stop_flag = 0;
    o.stop = &stop_flag;
    o.callbacks[0] = (ct_loop_callback){.on_step_end = stop_at_6};
    o.n_callbacks = 1;
    loop = one_task_loop(b, o, s1, m1, loss);
    CHECK_OK(ct_loop_run(loop, 10, &err), &err);
    CHECK(ct_loop_stopped(loop) && ct_loop_step(loop) == 6);
    ct_loop_free(loop);
    stop_flag = 0;
    o.n_callbacks = 0;
    loop = one_task_loop(b, o, s1, m1, loss);
    CHECK(ct_loop_step(loop) == 6);
    CHECK_OK(ct_loop_run(loop, 10, &err), &err);
    h = ct_loop_history(loop, &n);
    int same = 0, compared = 0;
    for (int i = 0; i < n && i < n_straight; i++) {
        if (strstr(h[i].metric, "per second")) continue;
        compared++;
        same += !strcmp(h[i].metric, straight[i].metric) && h[i].step == straight[i].step && h[i].value == straight[i].value;
    }
    printf("stopped at 6 and resumed vs straight, 10 steps: %d of %d history entries equal (%d and %d in all)\n", same,
           compared, n, n_straight);
    CHECK_MSG(n == n_straight && same == compared, "history after a stop: %d of %d equal, %d vs %d entries", same,
              compared, n, n_straight);
    ct_loop_free(loop);
    free(straight);
    ct_stream_free(s1);
    ct_layer_free(m1), ct_layer_free(loss);
    ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL);
    free(a), free(b);
}

// Two tasks whose losses differ (the default which_task: odd steps train
// task 1, "loss_b", even steps task 0, "loss"): the log at a step of task t
// gives metrics/<task t's loss> as the mean of task t's steps since the last
// log alone (Trax starts its average over whenever the task changes: it
// never mixes two tasks' losses under one name), and training/loss, as
// Trax's optimizer stat, the mean of every step since the last log. Run b
// logs every step, so its logs are each step's own values.
static void test_averaged_per_task(void) {
    two_tasks ra, rb;
    ct_error err;
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 4;  // logs at 1, 4 (steps 2..4), 8 (5..8)
    o.seed = 3;
    CHECK_OK(two_tasks_new_with(&ra, NULL, true, &o, &err), &err);
    o.eval_at = every_step;
    CHECK_OK(two_tasks_new_with(&rb, NULL, true, &o, &err), &err);
    CHECK_OK(ct_loop_run(ra.loop, 8, &err), &err);
    CHECK_OK(ct_loop_run(rb.loop, 8, &err), &err);
    for (int64_t end = 4; end <= 8; end += 4) {
        int64_t from = end == 4 ? 2 : 5;
        double task0 = 0, all = 0;
        int n0 = 0;
        for (int64_t s = from; s <= end; s++) {
            const char *name = s % 2 ? "metrics/loss_b" : "metrics/loss";
            all += logged(rb.loop, name, s);
            if (s % 2 == 0) task0 += logged(rb.loop, name, s), n0++;
        }
        double want = task0 / n0, got = logged(ra.loop, "metrics/loss", end);
        double want_all = all / (double)(end - from + 1), got_all = logged(ra.loop, "training/loss", end);
        printf("two tasks, log at step %lld: metrics/loss %.7f (task 0's steps: %.7f; all steps: %.7f), "
               "training/loss %.7f (all steps: %.7f)\n",
               (long long)end, got, want, want_all, got_all, want_all);
        CHECK_MSG(fabs(got - want) <= 1e-6 * fabs(want), "metrics/loss at step %lld: %.9g, task 0's mean is %.9g",
                  (long long)end, got, want);
        CHECK_MSG(fabs(got_all - want_all) <= 1e-6 * fabs(want_all), "training/loss at step %lld: %.9g, the mean is %.9g",
                  (long long)end, got_all, want_all);
    }
    // Step 1 trains task 1: its log names task 1's loss.
    CHECK(logged(ra.loop, "metrics/loss_b", 1) == logged(rb.loop, "metrics/loss_b", 1));
    CHECK(isnan(logged(ra.loop, "metrics/loss", 1)));
    two_tasks_free(&rb);

    // Stopped at 6 (between the logs at 4 and 8) and resumed: the log at 8
    // averages task 0's steps 6 and 8 as the straight run's does.
    char *dir = temp_dir("per_task");
    o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 4;
    o.seed = 3;
    stop_flag = 0;
    o.stop = &stop_flag;
    o.callbacks[0] = (ct_loop_callback){.on_step_end = stop_at_6};
    o.n_callbacks = 1;
    CHECK_OK(two_tasks_new_with(&rb, dir, true, &o, &err), &err);
    CHECK_OK(ct_loop_run(rb.loop, 8, &err), &err);
    CHECK(ct_loop_stopped(rb.loop) && ct_loop_step(rb.loop) == 6);
    two_tasks_free(&rb);
    stop_flag = 0;
    o.n_callbacks = 0;
    CHECK_OK(two_tasks_new_with(&rb, dir, true, &o, &err), &err);
    CHECK_OK(ct_loop_run(rb.loop, 8, &err), &err);
    double straight = logged(ra.loop, "metrics/loss", 8), resumed = logged(rb.loop, "metrics/loss", 8);
    printf("two tasks, stopped at 6 and resumed: metrics/loss at 8 %.9g, straight %.9g\n", resumed, straight);
    CHECK_MSG(resumed == straight, "two tasks resumed at 6: metrics/loss at 8 is %.9g, straight %.9g", resumed,
              straight);
    two_tasks_free(&ra), two_tasks_free(&rb);
    ct_fs_remove_tree(dir, NULL);
    free(dir);
}

// ---- 7: the system seed, recorded ---------------------------------------------------

static void test_system_seed(void) {
    ct_error err;
    uint64_t s1, s2;
    CHECK_OK(ct_loop_system_seed(&s1, &err), &err);
    CHECK_OK(ct_loop_system_seed(&s2, &err), &err);
    CHECK(s1 < (1ull << 31) && s2 < (1ull << 31));
    CHECK_MSG(s1 != s2, "two drawn seeds are both %llu", (unsigned long long)s1);  // 2^-31 to fail by chance

    char *dir = temp_dir("seed");
    bool found = true;
    uint64_t got = 0;
    CHECK_OK(ct_loop_checkpoint_seed(dir, NULL, &found, &got, &err), &err);
    CHECK(!found);
    // No checkpoint: *opened is NULL (loop.h), whatever the caller left in
    // it, so that a caller may close it unconditionally.
    static int junk;
    ct_checkpoint *opened = (ct_checkpoint *)&junk;
    CHECK_OK(ct_loop_checkpoint_seed(dir, &opened, &found, &got, &err), &err);
    CHECK_MSG(!found && opened == NULL, "no checkpoint, yet *opened was left %p", (void *)opened);
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
    ct_loop_options o = ct_loop_default_options();
    o.output_dir = dir;
    o.seed = (1ull << 62) + 12345;  // more bits than a double holds
    ct_loop *loop;
    CHECK_OK(ct_loop_new(&loop, model, &task, 1, NULL, &o, &err), &err);
    CHECK_OK(ct_loop_run(loop, 2, &err), &err);
    ct_loop_free(loop);
    CHECK_OK(ct_loop_checkpoint_seed(dir, NULL, &found, &got, &err), &err);
    CHECK_MSG(found && got == o.seed, "recorded seed %llu, want %llu", (unsigned long long)got,
              (unsigned long long)o.seed);
    // Asked for, the checkpoint the search read is handed back open (ctrax
    // train resumes from it without a second search).
    got = 0;
    CHECK_OK(ct_loop_checkpoint_seed(dir, &opened, &found, &got, &err), &err);
    CHECK_MSG(found && got == o.seed && opened && ct_checkpoint_step(opened) == 2, "opened %p at step %lld",
              (void *)opened, opened ? (long long)ct_checkpoint_step(opened) : -1LL);
    ct_checkpoint_close(opened);
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(loss);
    ct_fs_remove_tree(dir, NULL);
    free(dir);
}

// ---- 8: init_checkpoint ------------------------------------------------------------------

static void test_init_checkpoint(void) {
    char *a = temp_dir("init_a"), *b = temp_dir("init_b"), *c = temp_dir("init_c");
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_error err;
    ct_loop_options o = ct_loop_default_options();
    ct_loop *loop = one_task_loop(a, o, train, model, loss);
    CHECK_OK(ct_loop_run(loop, 5, &err), &err);
    size_t nw = ct_loop_net(loop)->n_weights;
    float *w5 = copy_floats(ct_loop_net(loop)->weights, nw);
    ct_loop_free(loop);

    // From a checkpoint directory, then from a run directory (its newest).
    char ckpt[512];
    snprintf(ckpt, sizeof ckpt, "%s/model_5/", a);
    const char *from[2] = {ckpt, a};
    for (int k = 0; k < 2; k++) {
        ct_fs_remove_tree(b, NULL);
        o = ct_loop_default_options();
        o.init_checkpoint = from[k];
        loop = one_task_loop(b, o, train, model, loss);
        size_t ns;
        const float *slots = ct_trainer_slots(ct_loop_trainer(loop), &ns);
        bool fresh = true;
        for (size_t i = 0; i < ns; i++) fresh = fresh && slots[i] == 0;
        CHECK_MSG(ct_loop_step(loop) == 0 && memcmp(ct_loop_net(loop)->weights, w5, nw * sizeof *w5) == 0 && fresh,
                  "init_checkpoint %s: step %lld, weights %s, slots %s", from[k], (long long)ct_loop_step(loop),
                  memcmp(ct_loop_net(loop)->weights, w5, nw * sizeof *w5) ? "differ" : "equal",
                  fresh ? "fresh" : "not fresh");
        CHECK_OK(ct_loop_run(loop, 2, &err), &err);
        ct_loop_free(loop);
    }
    // A run that resumes takes its own checkpoint, not init_checkpoint's weights.
    loop = one_task_loop(b, o, train, model, loss);
    CHECK(ct_loop_step(loop) == 2 && memcmp(ct_loop_net(loop)->weights, w5, nw * sizeof *w5) != 0);
    ct_loop_free(loop);

    // Hostile paths: each a clear error naming init_checkpoint and the path.
    char file[512], empty[512];
    snprintf(file, sizeof file, "%s/model_5/state.json", a);
    snprintf(empty, sizeof empty, "%s/empty", c);
    CHECK_OK(ct_fs_mkdirs(empty, &err), &err);
    const char *bad[5] = {"/nonexistent/run", file, empty, "/dev/zero", ""};
    for (int k = 0; k < 5; k++) {
        ct_fs_remove_tree(b, NULL);
        o = ct_loop_default_options();
        o.init_checkpoint = bad[k];
        o.output_dir = b;
        ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
        ct_status st = ct_loop_new(&loop, model, &task, 1, NULL, &o, &err);
        CHECK_MSG(st != CT_OK && strstr(err.msg, "init_checkpoint") && strstr(err.msg, bad[k]), "'%s': %s", bad[k],
                  st == CT_OK ? "accepted" : err.msg);
        if (st != CT_OK) printf("init_checkpoint '%s': %s\n", bad[k], err.msg);
        else ct_loop_free(loop);
    }
    // Another model's checkpoint (another width: every name the same, most
    // shapes not): an error naming init_checkpoint and a tensor, not a run
    // that goes on from mostly random weights after a warning.
    ct_transformer_lm_params wide = ct_transformer_lm_default_params();
    wide.vocab_size = VOCAB, wide.d_model = 8, wide.d_ff = 32, wide.n_layers = 1, wide.n_heads = 2;
    wide.max_len = 2 * LEN + 2;
    ct_layer *other = ct_transformer_lm(wide);
    ct_fs_remove_tree(b, NULL);
    o = ct_loop_default_options();
    o.init_checkpoint = a;
    o.output_dir = b;
    ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
    ct_status st = ct_loop_new(&loop, other, &task, 1, NULL, &o, &err);
    CHECK_MSG(st == CT_ERR_SHAPE && strstr(err.msg, "init_checkpoint") && strstr(err.msg, "expected"),
              "init_checkpoint of another model: %s", st == CT_OK ? "accepted" : err.msg);
    printf("init_checkpoint of a model of another width: %.200s\n", err.msg);
    if (st == CT_OK) ct_loop_free(loop);
    ct_layer_free(other);
    free(w5);
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(loss);
    ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL), ct_fs_remove_tree(c, NULL);
    free(a), free(b), free(c);
}

// ---- 9: every feature at once, resumed --------------------------------------------------

// Which of model_1 .. model_12 are in dir: "1" kept, "0" regular, "-" absent.
static void kept_string(const char *dir, char *out) {
    for (int s = 1; s <= 12; s++) {
        char name[32];
        snprintf(name, sizeof name, "model_%d", s);
        int k = kept(dir, name);
        out[s - 1] = k < 0 ? '-' : (char)('0' + k);
    }
    out[12] = '\0';
}

// Two tasks with their own optimizers and losses, permanent checkpoints at a
// list, regular ones at another, keep_last 1 and a seed drawn from the
// system: 12 steps straight, and 6 + resumed 6 (the resume finds the seed
// in the checkpoint, as ctrax train does), end with the same weights, slots,
// checkpoints on disk and history.
static void test_all_resumed(void) {
    char *a = temp_dir("all_a"), *b = temp_dir("all_b");
    ct_error err;
    uint64_t seed;
    CHECK_OK(ct_loop_system_seed(&seed, &err), &err);
    int64_t perm[3] = {1, 5, 9}, ck[4] = {2, 4, 8, 10};
    ct_loop_options o = ct_loop_default_options();
    o.permanent_checkpoints_at = perm, o.n_permanent_checkpoints_at = 3;
    o.checkpoints_at = ck, o.n_checkpoints_at = 4;
    o.n_steps_per_checkpoint = 3;  // evals and logs at 1, 3, 6, 9, 12
    o.keep_last = 1;
    o.seed = seed;
    two_tasks r;
    CHECK_OK(two_tasks_new_with(&r, a, true, &o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 12, &err), &err);
    const ct_net *net = ct_loop_net(r.loop);
    size_t nw = net->n_weights, ns;
    float *w = copy_floats(net->weights, nw);
    const float *slots = ct_trainer_slots(ct_loop_trainer(r.loop), &ns);  // (sets ns before the copy reads it)
    float *sl = copy_floats(slots, ns);
    int nh;
    const ct_history_entry *h = ct_loop_history(r.loop, &nh);
    ct_history_entry *hist = malloc((size_t)nh * sizeof *hist + 1);
    memcpy(hist, h, (size_t)nh * sizeof *hist);
    two_tasks_free(&r);

    CHECK_OK(two_tasks_new_with(&r, b, true, &o, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 6, &err), &err);
    two_tasks_free(&r);
    // The resume takes the seed its checkpoint recorded, as ctrax train does
    // for random_seed = None.
    bool found;
    uint64_t recorded;
    CHECK_OK(ct_loop_checkpoint_seed(b, NULL, &found, &recorded, &err), &err);
    CHECK(found && recorded == seed);
    o.seed = recorded;
    CHECK_OK(two_tasks_new_with(&r, b, true, &o, &err), &err);
    CHECK(ct_loop_step(r.loop) == 6);
    CHECK_OK(ct_loop_run(r.loop, 12, &err), &err);
    net = ct_loop_net(r.loop);
    CHECK_MSG(memcmp(net->weights, w, nw * sizeof *w) == 0, "all features, resumed at 6: weights differ");
    CHECK_MSG(memcmp(ct_trainer_slots(ct_loop_trainer(r.loop), NULL), sl, ns * sizeof *sl) == 0,
              "all features, resumed at 6: task 0's slots differ");
    h = ct_loop_history(r.loop, &nh);
    int same = 0, compared = 0;
    for (int i = 0; i < nh; i++) {
        if (strstr(hist[i].metric, "per second")) continue;
        compared++;
        same += !strcmp(h[i].metric, hist[i].metric) && h[i].step == hist[i].step &&
                (h[i].value == hist[i].value || (isnan(h[i].value) && isnan(hist[i].value)));
    }
    CHECK_MSG(same == compared && compared > 0, "history: %d of %d entries the same", same, compared);
    two_tasks_free(&r);
    char ka[16], kb[16];
    kept_string(a, ka);
    kept_string(b, kb);
    printf("all features (2 own optimizers, permanent [1, 5, 9], checkpoints [2, 4, 8, 10], keep 1, drawn seed "
           "%llu): model_1..12 straight %s, resumed at 6 %s; weights, slots, %d history entries equal\n",
           (unsigned long long)seed, ka, kb, compared);
    // Permanent 1, 5, 9 kept; of the regular ones only the final 12.
    CHECK_MSG(!strcmp(ka, "1---1---1--0") && !strcmp(ka, kb), "checkpoints on disk: %s and %s", ka, kb);
    char pa[512], pb[512];
    snprintf(pa, sizeof pa, "%s/model_12/slots_task1.safetensors", a);
    snprintf(pb, sizeof pb, "%s/model_12/slots_task1.safetensors", b);
    char *ta = NULL, *tb = NULL;
    size_t na = 0, nb = 0;
    CHECK_OK(ct_fs_read(pa, &ta, &na, &err), &err);
    CHECK_OK(ct_fs_read(pb, &tb, &nb, &err), &err);
    CHECK_MSG(na == nb && na > 0 && memcmp(ta, tb, na) == 0, "task 1's slots differ after the resume");
    free(ta), free(tb), free(w), free(sl), free(hist);
    ct_fs_remove_tree(a, NULL), ct_fs_remove_tree(b, NULL);
    free(a), free(b);
}

// ---- 10: edges of the cadences ------------------------------------------------------------

static void test_cadence_edges(void) {
    char *dir = temp_dir("edges");
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_error err;
    // A checkpoint at step 0 (before any update) is on no cadence, so not
    // permanent: Trax's _at_step_1_and_every_nth_step asks for step > 0.
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_permanent_checkpoint = 4;
    ct_loop *loop = one_task_loop(dir, o, train, model, loss);
    CHECK_OK(ct_loop_run(loop, 0, &err), &err);
    ct_loop_free(loop);
    printf("a run of 0 steps with permanent checkpoints every 4: model_0 %d (0 regular, 1 kept)\n",
           kept(dir, "model_0"));
    CHECK_MSG(kept(dir, "model_0") == 0, "model_0 is %d (want 0, regular: step 0 is no multiple of the period)",
              kept(dir, "model_0"));

    // A step twice in a list is refused by name, like a step 0.
    int64_t twice[3] = {4, 8, 4};
    const char *what[3] = {"checkpoints_at", "eval_at_steps", "permanent_checkpoints_at"};
    for (int k = 0; k < 3; k++) {
        o = ct_loop_default_options();
        if (k == 0) o.checkpoints_at = twice, o.n_checkpoints_at = 3;
        if (k == 1) o.eval_at_steps = twice, o.n_eval_at_steps = 3;
        if (k == 2) o.permanent_checkpoints_at = twice, o.n_permanent_checkpoints_at = 3;
        ct_train_task task = {train, loss, ct_adam_new(ct_adam_default_params()), NULL, NULL, lr_adam()};
        ct_status st = ct_loop_new(&loop, model, &task, 1, NULL, &o, &err);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, what[k]) && strstr(err.msg, "step 4 twice"), "%s [4, 8, 4]: %s",
                  what[k], st == CT_OK ? "accepted" : err.msg);
        if (st == CT_OK) ct_loop_free(loop);
        else if (k == 0) printf("a step twice: %s\n", err.msg);
    }
    // No schedule and a learning rate of 0: refused (every step would update nothing).
    {
        o = ct_loop_default_options();
        ct_train_task task = {train, loss, ct_sgd_new(ct_sgd_default_params()), NULL, NULL, 0.0f};
        ct_status st = ct_loop_new(&loop, model, &task, 1, NULL, &o, &err);
        CHECK_MSG(st == CT_ERR_ARG && strstr(err.msg, "learning_rate is 0"), "learning_rate 0, no schedule: %s",
                  st == CT_OK ? "accepted" : err.msg);
        if (st == CT_OK) ct_loop_free(loop);
    }

    // A stop before the first log (evals at step 5 only): every step so far
    // is in the loss since the last log (its count is the step), and the
    // run resumes from there, logging at 5 what a run straight to 5 logs.
    ct_fs_remove_tree(dir, NULL);
    int64_t at5[1] = {5};
    o = ct_loop_default_options();
    o.eval_at_steps = at5, o.n_eval_at_steps = 1;
    ct_stream *s2 = copy_batches(1);
    loop = one_task_loop(dir, o, s2, model, loss);
    CHECK_OK(ct_loop_run(loop, 5, &err), &err);
    double straight = ct_loop_last_value(loop, "train", "metrics/loss");
    ct_loop_free(loop);
    ct_fs_remove_tree(dir, NULL);
    ct_stream_free(s2);
    s2 = copy_batches(1);
    stop_flag = 0;
    o.stop = &stop_flag;
    o.callbacks[0] = (ct_loop_callback){.on_step_end = stop_at_3};
    o.n_callbacks = 1;
    loop = one_task_loop(dir, o, s2, model, loss);
    CHECK_OK(ct_loop_run(loop, 5, &err), &err);
    CHECK(ct_loop_stopped(loop) && ct_loop_step(loop) == 3);
    ct_loop_free(loop);
    stop_flag = 0;
    o.n_callbacks = 0;
    ct_train_task task = {s2, loss, ct_adam_new(ct_adam_default_params()), NULL, "loss", lr_adam()};
    o.output_dir = dir, o.seed = 11;
    ct_status st = ct_loop_new(&loop, model, &task, 1, NULL, &o, &err);
    CHECK_MSG(st == CT_OK, "resuming a stop before the first log: %s", st == CT_OK ? "" : err.msg);
    if (st == CT_OK) {
        CHECK(ct_loop_step(loop) == 3);
        CHECK_OK(ct_loop_run(loop, 5, &err), &err);
        double resumed = ct_loop_last_value(loop, "train", "metrics/loss");
        printf("stopped at 3 before the first log (at 5), resumed: metrics/loss at 5 %.9g, straight %.9g\n", resumed,
               straight);
        CHECK(resumed == straight);
        ct_loop_free(loop);
    }
    ct_stream_free(s2);
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(loss);
    ct_fs_remove_tree(dir, NULL);
    free(dir);
}

// ---- 11: a checkpoint edited by hand -------------------------------------------------------

// The files of one checkpoint, read once, to write edited copies of it.
typedef struct ckpt_files {
    const char *dir, *name;
    int64_t step;
    int n;
    const char *file[8];
    char *data[8];
    size_t size[8];
} ckpt_files;

static void ckpt_files_read(ckpt_files *f, const char *dir, const char *name) {
    static const char *const names[] = {"weights.safetensors", "slots.safetensors", "slots_task1.safetensors",
                                        "config.gin", "state.json"};
    memset(f, 0, sizeof *f);
    f->dir = dir, f->name = name;
    ct_checkpoint *c;
    ct_error err;
    CHECK_OK(ct_checkpoint_open(&c, dir, name, &err), &err);
    f->step = ct_checkpoint_step(c);
    ct_checkpoint_close(c);
    for (int i = 0; i < 5; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s/%s", dir, name, names[i]);
        if (!exists(dir, path + strlen(dir) + 1)) continue;
        f->file[f->n] = names[i];
        CHECK_OK(ct_fs_read(path, &f->data[f->n], &f->size[f->n], &err), &err);
        f->n++;
    }
}

static void ckpt_files_free(ckpt_files *f) {
    for (int i = 0; i < f->n; i++) free(f->data[i]);
}

// The file's bytes, or NULL.
static const char *ckpt_file(const ckpt_files *f, const char *file, size_t *size) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->file[i], file)) {
            if (size) *size = f->size[i];
            return f->data[i];
        }
    return NULL;
}

// Writes the checkpoint again through the writer (so its manifest's sizes
// and checksums hold, and the loop's own checks are what is tested), with
// state.json as given, file `drop` left out and file `as` holding the
// bytes of file `from` (NULLs: neither).
static void ckpt_write(const ckpt_files *f, const char *state, const char *drop, const char *as, const char *from) {
    ct_checkpoint_options co = ct_checkpoint_default_options();
    co.step = f->step;
    ct_checkpoint_writer *w;
    ct_error err;
    CHECK_OK(ct_checkpoint_writer_begin(&w, f->dir, f->name, &co, &err), &err);
    for (int i = 0; i < f->n; i++) {
        if (!strcmp(f->file[i], "state.json") || (drop && !strcmp(f->file[i], drop))) continue;
        size_t n = f->size[i];
        const char *data = as && !strcmp(f->file[i], as) ? ckpt_file(f, from, &n) : f->data[i];
        CHECK_OK(ct_checkpoint_writer_add_bytes(w, f->file[i], data, n, &err), &err);
    }
    CHECK_OK(ct_checkpoint_writer_set_state(w, state, &err), &err);
    CHECK_OK(ct_checkpoint_writer_commit(w, &err), &err);
}

// state.json with field `path` ("a", "a.b" or "a[i]") set to the JSON `raw`
// (NULL: removed). The caller frees the text.
static char *state_edit(const char *state, const char *path, const char *raw) {
    cJSON *root = cJSON_Parse(state);
    char key[64];
    snprintf(key, sizeof key, "%s", path);
    char *dot = strchr(key, '.'), *br = strchr(key, '[');
    cJSON *parent = root;
    const char *field = key;
    int index = -1;
    if (dot) *dot = '\0', parent = cJSON_GetObjectItemCaseSensitive(root, key), field = dot + 1;
    if (br) *br = '\0', parent = cJSON_GetObjectItemCaseSensitive(root, key), index = atoi(br + 1);
    CHECK(parent != NULL);
    if (index >= 0) {
        if (raw) cJSON_ReplaceItemInArray(parent, index, cJSON_Parse(raw));
        else cJSON_DeleteItemFromArray(parent, index);
    } else if (raw) {
        if (cJSON_GetObjectItemCaseSensitive(parent, field))
            cJSON_ReplaceItemInObjectCaseSensitive(parent, field, cJSON_Parse(raw));
        else cJSON_AddItemToObject(parent, field, cJSON_Parse(raw));
    } else {
        cJSON_DeleteItemFromObjectCaseSensitive(parent, field);
    }
    char *text = cJSON_Print(root);
    cJSON_Delete(root);
    return text;
}

// The same on *text, in place.
static void state_edit_in(char **text, const char *path, const char *raw) {
    char *edited = state_edit(*text, path, raw);
    free(*text);
    *text = edited;
}

static void test_hostile_checkpoint(void) {
    char *dir = temp_dir("hostile");
    two_tasks r;
    ct_error err;
    CHECK_OK(two_tasks_new(&r, dir, true, &err), &err);
    CHECK_OK(ct_loop_run(r.loop, 3, &err), &err);
    two_tasks_free(&r);
    ckpt_files f;
    ckpt_files_read(&f, dir, "model_3");
    const char *state = ckpt_file(&f, "state.json", NULL);
    CHECK(state != NULL);
    if (!state) return;

    // Each edit: the field, its new value (NULL: removed), and what the error must say.
    static const struct {
        const char *path, *raw, *says;
    } edits[] = {
        {"step", "5", "\"step\" is 5, the manifest's is 3"},
        {"step", "-3", "\"step\""},
        {"step", "1e300", "\"step\""},
        {"step", "\"3\"", "\"step\""},
        {"version", "99", "version 2 to 5"},
        {"version", "\"4\"", "version 2 to 5"},
        {"key", "[1]", "\"key\""},
        {"key[0]", "4294967296", "\"key\""},
        {"train_cursors", NULL, "\"train_cursors\""},
        {"train_cursors[1]", "{\"position\": \"99999999999999999999\", \"fingerprint\": \"1\"}", "train cursor"},
        {"train_cursors[0]", "{\"position\": \"-1\", \"fingerprint\": \"1\"}", "train cursor"},
        {"train_cursors[0]", "{\"position\": \"281474976710657\", \"fingerprint\": \"1\"}", "over 2^48"},
        {"train_since_log", NULL, "\"train_since_log\""},
        {"train_since_log.loss_count", "7", "\"train_since_log\""},
        {"train_since_log.gradients_l2_sum", "\"x\"", "\"train_since_log\""},
        {"train_since_log.weights_l2_sum", NULL, "\"train_since_log\""},
        {"train_since_log.task_loss_counts", NULL, "task_loss_counts"},
        {"train_since_log.task_loss_counts", "[0]", "task_loss_counts"},
        {"train_since_log.task_loss_counts", "[1, 0]", "task_loss_counts"},
        {"train_since_log.task_loss_sums", "[0, \"x\"]", "task_loss_sums"},
        {"train_since_log", "{\"loss_sum\": 1, \"loss_count\": 1, \"gradients_l2_sum\": 1, \"weights_l2_sum\": 1, "
                            "\"task_loss_sums\": [0, 0], \"task_loss_counts\": [0, 0]}", "adding up to loss_count"},
        {"skipped_steps", "-1", "\"skipped_steps\""},
        {"additional_eval_cursors", NULL, "\"additional_eval_cursors\""},
        {"task_optimizers", NULL, "\"task_optimizers\""},
        {"task_optimizers", "[null]", "\"task_optimizers\""},
        {"task_optimizers[1]", "5", "\"task_optimizers\"[1]"},
        {"task_optimizers[1]", "null", "train task 1 shared task 0's optimizer there"},
        {"task_optimizers[1]", "{\"name\": \"SGD\", \"params\": {}}", "task_optimizers[1]: trained with optimizer SGD"},
        {"optimizer", "[]", "\"optimizer\""},
        {"best", "3", "\"best\""},
        {"history", "{}", "\"history\""},
        {"history[0]", "[\"bogus\", \"metrics/loss\", 1, 2.5]", "history[0]"},
        {"history[0]", "[\"train\", \"metrics/loss\", 4, 2.5]", "history[0]"},
        {"history[0]", "[\"train\", \"\", 1, 2.5]", "history[0]"},
    };
    int n_edits = (int)(sizeof edits / sizeof edits[0]);
    for (int k = 0; k < n_edits; k++) {
        char *edited = state_edit(state, edits[k].path, edits[k].raw);
        ckpt_write(&f, edited, NULL, NULL, NULL);
        free(edited);
        ct_status st = two_tasks_new(&r, dir, true, &err);
        CHECK_MSG(st != CT_OK && strstr(err.msg, "model_3") && strstr(err.msg, edits[k].says),
                  "state.json %s = %s: %s (want an error saying %s)", edits[k].path, edits[k].raw ? edits[k].raw : "(none)",
                  st == CT_OK ? "accepted" : err.msg, edits[k].says);
        if (st != CT_OK && k % 7 == 0) printf("state.json %s = %s: %s\n", edits[k].path, edits[k].raw, err.msg);
        two_tasks_free(&r);
    }

    // Task 1's slots missing, or another optimizer's in their place (Adam's
    // two slots per weight where Adafactor has its factored ones).
    ckpt_write(&f, state, "slots_task1.safetensors", NULL, NULL);
    ct_status st = two_tasks_new(&r, dir, true, &err);
    CHECK_MSG(st != CT_OK && strstr(err.msg, "slots_task1.safetensors"), "slots_task1 missing: %s",
              st == CT_OK ? "accepted" : err.msg);
    printf("slots_task1.safetensors missing: %s\n", err.msg);
    two_tasks_free(&r);
    ckpt_write(&f, state, NULL, "slots_task1.safetensors", "slots.safetensors");
    st = two_tasks_new(&r, dir, true, &err);
    CHECK_MSG(st != CT_OK && strstr(err.msg, "slots_task1.safetensors"), "slots_task1 with Adam's slots: %s",
              st == CT_OK ? "accepted" : err.msg);
    printf("slots_task1.safetensors holding Adam's slots: %s\n", err.msg);
    two_tasks_free(&r);

    // The seed a resume of a drawn-seed run reads back: ill-typed is an error.
    const char *seeds[3] = {"\"-5\"", "\"123456789012345678901234\"", "\"12x\""};
    for (int k = 0; k < 3; k++) {
        char *edited = state_edit(state, "seed_text", seeds[k]);
        ckpt_write(&f, edited, NULL, NULL, NULL);
        free(edited);
        bool found = true;
        uint64_t seed;
        st = ct_loop_checkpoint_seed(dir, NULL, &found, &seed, &err);
        CHECK_MSG(st == CT_ERR_FORMAT && !found && strstr(err.msg, "seed_text") && strstr(err.msg, "model_3"),
                  "seed_text %s: %s", seeds[k], st == CT_OK ? "accepted" : err.msg);
        // On the error nothing is handed back (loop.h): the checkpoint it
        // read is closed there, not left to a caller that sees a failure.
        ct_checkpoint *opened = NULL;
        st = ct_loop_checkpoint_seed(dir, &opened, &found, &seed, &err);
        CHECK_MSG(st == CT_ERR_FORMAT && !found && opened == NULL, "seed_text %s: %s, *opened %p", seeds[k],
                  st == CT_OK ? "accepted" : err.msg, (void *)opened);
    }

    // The untouched state resumes.
    ckpt_write(&f, state, NULL, NULL, NULL);
    CHECK_OK(two_tasks_new(&r, dir, true, &err), &err);
    CHECK(ct_loop_step(r.loop) == 3);
    two_tasks_free(&r);
    ckpt_files_free(&f);
    ct_fs_remove_tree(dir, NULL);
    free(dir);
}

// ---- 12: state.json versions 2 to 4 still load -------------------------------------------

static void test_old_versions(void) {
    char *dir = temp_dir("versions");
    ct_stream *train = copy_batches(1);
    ct_layer *model = small_lm(0), *loss = ct_weighted_category_cross_entropy();
    ct_error err;
    ct_loop_options o = ct_loop_default_options();
    o.n_steps_per_checkpoint = 2;  // logs at 1, 2, 4
    // Stopped at 3 (a checkpoint, no log): step 3's loss is the one since the last log.
    stop_flag = 0;
    o.stop = &stop_flag;
    o.callbacks[0] = (ct_loop_callback){.on_step_end = stop_at_3};
    o.n_callbacks = 1;
    ct_loop *loop = one_task_loop(dir, o, train, model, loss);
    CHECK_OK(ct_loop_run(loop, 4, &err), &err);
    CHECK(ct_loop_stopped(loop) && ct_loop_step(loop) == 3);
    ct_loop_free(loop);
    stop_flag = 0;
    o.n_callbacks = 0;
    ckpt_files f;
    ckpt_files_read(&f, dir, "model_3");
    const char *state = ckpt_file(&f, "state.json", NULL);
    CHECK(state != NULL);
    if (!state) return;
    // What a run straight to step 4 logs there (the mean of steps 3 and 4):
    // a resume at 3 from a version that keeps the loss since the last log
    // (3 and up; one task's is the loss itself) logs the same.
    char *dir4 = temp_dir("versions4");
    ct_stream *fresh = copy_batches(1);
    loop = one_task_loop(dir4, o, fresh, model, loss);
    CHECK_OK(ct_loop_run(loop, 4, &err), &err);
    double want = ct_loop_last_value(loop, "train", "metrics/loss");
    ct_loop_free(loop);
    // Version 4: no task_loss_sums / task_loss_counts; version 3 also no
    // norms since the last log, no additional eval cursors, no task
    // optimizers; version 2 also no loss since the last log and no skipped
    // steps.
    const char *v5_only[2] = {"train_since_log.task_loss_sums", "train_since_log.task_loss_counts"};
    const char *v4_only[4] = {"train_since_log.gradients_l2_sum", "train_since_log.weights_l2_sum",
                              "additional_eval_cursors", "task_optimizers"};
    const char *v3_only[2] = {"train_since_log", "skipped_steps"};
    char *text = state_edit(state, "version", "4");
    for (int i = 0; i < 2; i++) state_edit_in(&text, v5_only[i], NULL);
    for (int version = 4; version >= 2; version--) {
        if (version == 3) {
            for (int i = 0; i < 4; i++) state_edit_in(&text, v4_only[i], NULL);
            state_edit_in(&text, "version", "3");
        }
        if (version == 2) {
            for (int i = 0; i < 2; i++) state_edit_in(&text, v3_only[i], NULL);
            state_edit_in(&text, "version", "2");
        }
        ckpt_write(&f, text, NULL, NULL, NULL);
        loop = one_task_loop(dir, o, train, model, loss);
        printf("state.json version %d: resumed at step %lld\n", version, (long long)ct_loop_step(loop));
        CHECK(ct_loop_step(loop) == 3 && !strcmp(ct_loop_restored_from(loop), "model_3"));
        CHECK_OK(ct_loop_run(loop, 4, &err), &err);
        double got = ct_loop_last_value(loop, "train", "metrics/loss");
        if (version >= 3)
            CHECK_MSG(got == want, "state.json version %d resumed at 3: metrics/loss at 4 is %.9g, straight %.9g",
                      version, got, want);
        ct_loop_free(loop);
        ct_fs_remove_tree(dir, NULL);
    }
    free(text);
    ct_stream_free(fresh);
    ct_fs_remove_tree(dir4, NULL);
    free(dir4);
    ckpt_files_free(&f);
    ct_stream_free(train);
    ct_layer_free(model), ct_layer_free(loss);
    free(dir);
}

int main(void) {
    scratch_init("test_loop_trax");
    ct_log_set_level(CT_LOG_WARN);
    test_permanent_and_lists();
    test_which_task_default();
    test_own_loss_and_optimizer();
    test_losses_of_two_kinds();
    test_three_tasks_two_losses();
    test_eval_tasks_and_model();
    test_eval_model_state();
    test_averaged_since_log();
    test_averaged_per_task();
    test_averaged_across_stop();
    test_system_seed();
    test_init_checkpoint();
    test_all_resumed();
    test_cadence_edges();
    test_hostile_checkpoint();
    test_old_versions();
    if (!check_failed_) ct_fs_remove_tree(g_tmp, NULL);
    return check_summary("test_loop_trax");
}
