// Training throughput of the default LM (TransformerLM on the copy task, as
// `ctrax train` runs it) in one data-parallel layout, in tokens per second;
// or, with `memory-efficient`, a ReformerLM of the same sizes with the
// memory-efficient (reversible) trainer.
//   bench_dist_throughput DEVICES STEPS [standard|memory-efficient]          one process
//   mpirun -np 2 bench_dist_throughput 1 STEPS [standard|memory-efficient]   two processes
// The global batch is 32 sequences however it is split. bench/run_dist.sh
// runs the three layouts of issue 6 for both trainers and prints their ratios.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ctrax/ctrax.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    bool memory_efficient = argc == 4 && strcmp(argv[3], "memory-efficient") == 0;
    if (argc < 3 || argc > 4 || (argc == 4 && !memory_efficient && strcmp(argv[3], "standard") != 0)) {
        fprintf(stderr, "usage: bench_dist_throughput DEVICES STEPS [standard|memory-efficient]\n");
        return 2;
    }
    int n_local = atoi(argv[1]), steps = atoi(argv[2]);
    ct_error err;
    ct_comm *comm = NULL;
    if (ct_comm_mpi_launched() && ct_comm_mpi_new(&comm, 600, &err) != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    int rank = comm ? ct_comm_rank(comm) : 0, n_proc = comm ? ct_comm_size(comm) : 1;
    enum { GLOBAL_B = 32 };
    ct_copy_task task = {16, 16, false, 1, 0};
    int T = ct_copy_task_seq_len(&task), B = GLOBAL_B / n_proc;
    int32_t *tokens = malloc((size_t)GLOBAL_B * T * sizeof *tokens);
    float *weights = malloc((size_t)GLOBAL_B * T * sizeof *weights);
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_I32, B, T, tokens + rank * B * T),
                          ct_tensor_2d(CT_DTYPE_I32, B, T, tokens + rank * B * T),
                          ct_tensor_2d(CT_DTYPE_F32, B, T, weights + rank * B * T)};
    ct_layer *model;
    if (memory_efficient) {
        ct_reformer_lm_params mp = ct_reformer_lm_default_params();
        mp.vocab_size = 16;
        mp.d_model = 64;
        mp.d_ff = 128;
        mp.n_layers = 2;
        mp.n_heads = 4;
        mp.max_len = T;
        mp.dropout = 0;
        mp.attention[0] = CT_REFORMER_CAUSAL_ATTENTION;  // the standard trainer's TransformerLM's attention
        mp.fixed_positions = true;
        model = ct_reformer_lm(mp);
    } else {
        ct_transformer_lm_params mp = ct_transformer_lm_default_params();
        mp.vocab_size = 16;
        mp.d_model = 64;
        mp.d_ff = 128;
        mp.n_layers = 2;
        mp.n_heads = 4;
        mp.max_len = T;
        mp.dropout = 0;
        model = ct_transformer_lm(mp);
    }
    ct_layer *loss = ct_weighted_category_cross_entropy();
    ct_device dev = ct_device_cpu();
    ct_trainer_options o = ct_trainer_default_options();
    o.n_devices = n_local;
    o.comm = comm;
    ct_trainer *tr = NULL;
    ct_optimizer *adam = ct_adam_new(ct_adam_default_params());
    ct_status st;
    o.memory_efficient = memory_efficient;
    o.reversible.log_every = 0;
    st = ct_trainer_new(&tr, model, loss, batch, 3, adam, ct_key_from_seed(0), &dev, &o, &err);
    if (st != CT_OK) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ct_step_stats s;
    double t0 = 0;
    int warmup = 5;
    for (int step = 1; step <= warmup + steps; step++) {
        if (step == warmup + 1) t0 = now_s();
        ct_copy_task_batch(&task, (uint64_t)step, GLOBAL_B, tokens, weights);
        ct_key key = ct_key_from_seed((uint64_t)step);
        st = ct_trainer_one_step(tr, batch, key, step, 1e-3f, &s, &err);
        if (st != CT_OK) {
            fprintf(stderr, "%s\n", err.msg);
            ct_comm_abort(comm, 1);
            return 1;
        }
    }
    double dt = now_s() - t0;
    if (rank == 0)
        printf("tokens/s %.0f  (%s trainer, %d process(es) x %d device(s), %d steps of %d x %d tokens, %.2f s, "
               "loss %.3f)\n",
               (double)steps * GLOBAL_B * T / dt, memory_efficient ? "memory-efficient" : "standard", n_proc, n_local,
               steps, GLOBAL_B, T, dt, s.loss);
    ct_trainer_free(tr);
    ct_layer_free(model);
    ct_layer_free(loss);
    free(tokens);
    free(weights);
    ct_comm_free(comm);
    return 0;
}
