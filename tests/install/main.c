// A program that uses ctrax the way an outside project would: built by
// tests/install_test.sh against an installed copy, with nothing but
// `pkg-config --cflags --libs ctrax`. It builds Serial(Dense(4), Dense(2)),
// runs a forward pass on a (3, 5) batch and checks the result against the
// same arithmetic done here from the net's own weights.
#include <ctrax/ctrax.h>
#include <ctrax/layers/layer_author.h>

#include <math.h>
#include <stdio.h>

enum { B = 3, D = 5, H = 4, O = 2 };

static const float *param(const ct_net *net, const char *name) {
    const ct_param *p = ct_net_find_param(net, name);
    if (!p) {
        fprintf(stderr, "no weight named %s\n", name);
        return NULL;
    }
    return net->weights + p->offset;
}

int main(void) {
    ct_device dev = ct_device_cpu();
    ct_error err;
    ct_layer *model = ct_serial(CT_LAYERS(ct_dense(H), ct_dense(O)));
    ct_tensor sig = ct_tensor_2d(CT_DTYPE_F32, B, D, NULL);
    ct_net net;
    if (ct_net_init(&net, model, &sig, 1, ct_key_from_seed(0), &dev, &err) != CT_OK) {
        fprintf(stderr, "ct_net_init: %s\n", err.msg);
        return 1;
    }
    ct_layer_free(model);  // the net holds its own reference

    ct_arena arena;
    ct_arena_init(&arena, &dev);
    ct_ctx c;
    ct_ctx_init(&c, &arena);
    ct_net_bind(&net, &c, false);

    float x[B * D];
    for (int i = 0; i < B * D; i++) x[i] = (float)(i % 7) / 7.0f - 0.4f;
    ct_tensor in = ct_tensor_2d(CT_DTYPE_F32, B, D, x), out;
    int bad = 0;
    if (ct_layer_forward(net.root, &c, &in, &out, ct_key_from_seed(1), &err) != CT_OK) {
        fprintf(stderr, "forward: %s\n", err.msg);
        bad = 1;
    } else if (out.ndim != 2 || out.shape[0] != B || out.shape[1] != O) {
        fprintf(stderr, "output has %d dims, want (%d,%d)\n", out.ndim, B, O);
        bad = 1;
    } else {
        const float *k0 = param(&net, "Serial/Dense[0]/kernel"), *b0 = param(&net, "Serial/Dense[0]/bias");
        const float *k1 = param(&net, "Serial/Dense[1]/kernel"), *b1 = param(&net, "Serial/Dense[1]/bias");
        if (!k0 || !b0 || !k1 || !b1) bad = 1;
        double max_err = 0;
        for (int b = 0; !bad && b < B; b++) {
            double h[H];
            for (int j = 0; j < H; j++) {
                h[j] = b0[j];
                for (int i = 0; i < D; i++) h[j] += (double)x[b * D + i] * k0[i * H + j];
            }
            for (int j = 0; j < O; j++) {
                double y = b1[j];
                for (int i = 0; i < H; i++) y += h[i] * k1[i * O + j];
                double e = fabs(y - ct_f32(&out)[b * O + j]);
                if (e > max_err) max_err = e;
            }
        }
        printf("forward (%d,%d) -> (%d,%d), max abs error vs reference %.3g\n", B, D, B, O, max_err);
        if (!(max_err < 1e-5)) bad = 1;
    }

    ct_ctx_free(&c);
    ct_arena_free(&arena);
    ct_net_free(&net);
    if (dev.current_bytes != 0) {
        fprintf(stderr, "%zu bytes still allocated on the device\n", dev.current_bytes);
        bad = 1;
    }
    printf("install program: %s\n", bad ? "FAILED" : "ok");
    return bad;
}
