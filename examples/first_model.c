// Learn y = [x0 * x1 > 0] from 2-d points with a small MLP and Adam.
#include <ctrax/ctrax.h>
#include <stdio.h>

enum { B = 64 };

int main(void) {
    float x[B * 2], w[B];
    int32_t y[B];
    ct_tensor batch[3] = {ct_tensor_2d(CT_DTYPE_F32, B, 2, x), ct_tensor_1d(CT_DTYPE_I32, B, y),
                          ct_tensor_1d(CT_DTYPE_F32, B, w)};
    // Serial(Dense(32), Relu, Dense(32), Relu, Dense(2)): logits for 2 classes.
    ct_layer *model = ct_mlp(3, (int[]){32, 32, 2}, ct_relu, false, false);
    ct_layer *loss = ct_weighted_category_cross_entropy();  // [logits, y, w] -> scalar
    ct_adam_params adam = ct_adam_default_params();

    ct_device cpu = ct_device_cpu();  // counts every byte allocated
    ct_trainer *trainer;
    ct_error err;
    if (ct_trainer_new(&trainer, model, loss, batch, 3, ct_adam_new(adam), ct_key_from_seed(0), &cpu, NULL, &err)) {
        fprintf(stderr, "%s\n", err.msg);
        return 1;
    }
    ct_step_stats stats;
    for (int step = 1; step <= 500; step++) {
        ct_random_uniform(ct_key_from_seed((uint64_t)step), x, B * 2, -1, 1);  // a fresh batch
        for (int i = 0; i < B; i++) y[i] = x[2 * i] * x[2 * i + 1] > 0, w[i] = 1;
        if (ct_trainer_one_step(trainer, batch, ct_key_from_seed(0), step, 0.01f, &stats, &err)) {
            fprintf(stderr, "%s\n", err.msg);
            return 1;
        }
        if (step % 100 == 0) printf("step %3d: loss %.4f\n", step, stats.loss);
    }
    ct_trainer_free(trainer);
    ct_layer_free(model);
    ct_layer_free(loss);
    return stats.loss < 0.2f ? 0 : 1;
}
