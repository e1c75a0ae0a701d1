// Train with the Loop on data held in memory. Arrays of points and labels
// become a stream (ct_arrays_stream_new, as tf.data's from_tensor_slices),
// read in shuffled epochs of batches. The Loop evaluates on other arrays and
// writes checkpoints into a temporary directory; a second Loop on that
// directory resumes where the first stopped, as a restarted program would.
#define _XOPEN_SOURCE 700  // mkdtemp, nftw
#include <ctrax/ctrax.h>
#include <ftw.h>
#include <stdio.h>
#include <stdlib.h>

enum { N_TRAIN = 1024, N_EVAL = 256, BATCH = 32, EVAL_BATCH = 64 };

// Points in [-1, 1]^2, label 1 inside the circle x0^2 + x1^2 < 0.5.
static float train_x[N_TRAIN][2], eval_x[N_EVAL][2];
static int32_t train_y[N_TRAIN], eval_y[N_EVAL];

static void make_points(uint64_t seed, int n, float (*x)[2], int32_t *y) {
    ct_random_uniform(ct_key_from_seed(seed), &x[0][0], 2 * n, -1, 1);
    for (int i = 0; i < n; i++) y[i] = x[i][0] * x[i][0] + x[i][1] * x[i][1] < 0.5f;
}

// arrays (x (N, 2), y (N)) -> items (x (2), y ()) -> epochs -> batches
// (x (B, 2), y (B)) -> loss weights of 1 (w (B)): what the loss takes.
static ct_status points_stream(ct_stream **s, float (*x)[2], int32_t *y, int n, bool shuffle, int batch,
                               ct_error *err) {
    ct_tensor arrays[2] = {ct_tensor_2d(CT_DTYPE_F32, n, 2, x), ct_tensor_1d(CT_DTYPE_I32, n, y)};
    // copy = false borrows the arrays: they are static, so they outlive the
    // stream. Pass true to give the stream its own copy instead.
    CT_TRY(ct_arrays_stream_new(s, arrays, 2, false, err));
    // Each transform takes the stream it wraps, even when it fails: no cleanup here.
    CT_TRY(ct_epochs_stream_new(s, *s, shuffle, 1, 0, err));  // forever; a new order every epoch
    ct_batch_params bp = ct_batch_default_params();
    bp.batch_size = batch;
    CT_TRY(ct_batch_stream_new(s, *s, &bp, err));
    return ct_weights_stream_new(s, *s, -1, err);
}

// What a program builds for the Loop. The Loop takes references to the
// layers and the optimizer; the streams must outlive it.
typedef struct run {
    ct_stream *train, *eval;
    ct_loop *loop;
} run;

static ct_status run_start(run *r, const char *dir, ct_error *err) {
    CT_TRY(points_stream(&r->train, train_x, train_y, N_TRAIN, true, BATCH, err));
    CT_TRY(points_stream(&r->eval, eval_x, eval_y, N_EVAL, false, EVAL_BATCH, err));
    ct_layer *model = ct_mlp(3, (int[]){32, 32, 2}, ct_relu, false, false);  // logits for 2 classes
    ct_layer *loss = ct_weighted_category_cross_entropy();         // [logits, y, w] -> scalar
    ct_train_task task = {.stream = r->train, .loss = loss, .optimizer = ct_adam_new(ct_adam_default_params()),
                          .learning_rate = 0.01f};
    // Each eval reads N_EVAL / EVAL_BATCH batches: the whole eval set once.
    ct_eval_task eval = {.stream = r->eval, .n_metrics = 1, .n_batches = N_EVAL / EVAL_BATCH};
    eval.metrics[0] = ct_weighted_category_accuracy();
    eval.metric_names[0] = "accuracy";
    ct_loop_options opts = ct_loop_default_options();
    opts.output_dir = dir;  // checkpoints model_<step>/, metrics.jsonl, TensorBoard files
    opts.n_steps_per_checkpoint = 100;  // and an eval each time
    opts.log = stdout;
    // Finds the newest checkpoint in dir, if any, and resumes from it: the
    // weights, the optimizer and where each stream was.
    ct_status st = ct_loop_new(&r->loop, model, &task, 1, &eval, &opts, err);
    ct_layer_free(model);  // the Loop keeps references of its own
    ct_layer_free(loss);
    ct_layer_free(eval.metrics[0]);
    return st;
}

static void run_end(run *r) {
    ct_loop_free(r->loop);
    ct_stream_free(r->train);
    ct_stream_free(r->eval);
    *r = (run){0};
}

static int remove_entry(const char *path, const struct stat *sb, int flag, struct FTW *ftw) {
    (void)sb, (void)flag, (void)ftw;
    return remove(path);
}

int main(void) {
    make_points(1, N_TRAIN, train_x, train_y);
    make_points(2, N_EVAL, eval_x, eval_y);
    char dir[] = "/tmp/ctrax_train_in_memory_XXXXXX";
    if (!mkdtemp(dir)) {
        perror("mkdtemp");
        return 1;
    }
    ct_error err;
    run first = {0}, second = {0};
    double accuracy = 0;
    // A first run stops at step 300, as if the program ended there.
    if (run_start(&first, dir, &err) || ct_loop_run(first.loop, 300, &err)) goto fail;
    run_end(&first);
    // A second one on the same directory resumes and goes on to step 600.
    if (run_start(&second, dir, &err)) goto fail;
    printf("resumed from %s at step %lld\n", ct_loop_restored_from(second.loop), (long long)ct_loop_step(second.loop));
    if (ct_loop_run(second.loop, 600, &err)) goto fail;
    accuracy = ct_loop_last_value(second.loop, "eval", "metrics/accuracy");
    printf("eval accuracy at step 600: %.4f\n", accuracy);
    run_end(&second);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return accuracy >= 0.9 ? 0 : 1;
fail:
    fprintf(stderr, "%s\n", err.msg);
    run_end(&first);
    run_end(&second);
    nftw(dir, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
    return 1;
}
