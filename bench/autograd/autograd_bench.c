/* autograd_bench: one training step's forward + backward of the examples' MLP (examples/mlp.c:
 * 16-96-96-4, ReLU, softmax cross-entropy, a batch of 32) three ways, on one thread:
 *   hand-written  mlp.c's backward() per sample (it runs the forward too), as ddp_train does;
 *   autograd      examples/ag_mlp.h through tdist/autograd.h: forward, backward, grads cleared;
 *   (backward)    the autograd step's backward alone.
 * Prints the median microseconds per step over REPS timed steps after a warm-up, and the ratio to
 * the hand-written step. bench/autograd/run.sh runs it beside PyTorch (torch_mlp.py).
 * Usage: autograd_bench [REPS] */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/autograd.h>

#include "ag_mlp.h"
#include "mlp.h"

enum { HIDDEN = 96, BATCH = 32, WARMUP = 200 };

static double now_us(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + ts.tv_nsec * 1e-3;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return v[n / 2];
}

static void check(td_status st, const char *what)
{
    if (st != TD_OK) {
        fprintf(stderr, "autograd_bench: %s: %s\n", what, td_last_error());
        exit(1);
    }
}

int main(int argc, char **argv)
{
    int reps = argc > 1 ? atoi(argv[1]) : 2000;
    if (reps < 1)
        reps = 1;
    float x[BATCH * DIM];
    int y[BATCH];
    int64_t labels[BATCH];
    make_data(1234, BATCH, x, y);
    for (int b = 0; b < BATCH; b++)
        labels[b] = y[b];
    size_t np = model_size(HIDDEN);
    float *params = calloc(np, sizeof(float)), *grads = calloc(np, sizeof(float));
    float *scratch = malloc(sizeof(float) * HIDDEN * 4);
    double *hand = malloc(sizeof(double) * (size_t)reps), *ag = malloc(sizeof(double) * (size_t)reps);
    double *bwd = malloc(sizeof(double) * (size_t)reps);
    model m, g;
    model_bind(&m, params, HIDDEN);
    model_bind(&g, grads, HIDDEN);
    model_init(&m, 1234);

    td_tensor *flat, *xt, *yt;
    check(td_tensor_from_buffer(TD_FLOAT32, TD_SHAPE((int64_t)np), params, &flat), "tensor");
    check(td_tensor_from_buffer(TD_FLOAT32, TD_SHAPE(BATCH, DIM), x, &xt), "tensor");
    check(td_tensor_from_buffer(TD_INT64, TD_SHAPE(BATCH), labels, &yt), "tensor");
    ag_mlp net;
    check(ag_mlp_bind(&net, flat, DIM, HIDDEN, CLASSES), "bind");

    volatile float sink = 0;
    for (int r = -WARMUP; r < reps; r++) {
        double t0 = now_us();
        memset(grads, 0, sizeof(float) * np);
        for (int b = 0; b < BATCH; b++)
            sink += backward(&m, &g, x + b * DIM, y[b], 1.0f / BATCH, scratch, scratch + HIDDEN, scratch + 2 * HIDDEN,
                             scratch + 3 * HIDDEN);
        double t1 = now_us();
        td_tensor *loss;
        for (int i = 0; i < AG_MLP_PARAMS; i++)
            check(td_autograd_set_grad(net.param[i], NULL), "zero_grad");
        check(ag_mlp_loss(&net, xt, yt, &loss), "forward");
        double t2 = now_us();
        check(td_autograd_backward(loss, NULL, false), "backward");
        td_tensor_release(loss);
        double t3 = now_us();
        if (r >= 0) {
            hand[r] = t1 - t0;
            ag[r] = t3 - t1;
            bwd[r] = t3 - t2;
        }
    }
    double h = median(hand, reps), a = median(ag, reps), b = median(bwd, reps);
    printf("MLP %d-%d-%d-%d, batch %d, float32, one thread, median of %d steps\n", DIM, HIDDEN, HIDDEN, CLASSES,
           BATCH, reps);
    printf("%-34s %12s %10s\n", "step", "us/step", "vs hand");
    printf("%-34s %12.1f %10.2f\n", "tdist hand-written fwd+bwd", h, 1.0);
    printf("%-34s %12.1f %10.2f\n", "tdist autograd fwd+bwd", a, a / h);
    printf("%-34s %12.1f %10.2f\n", "tdist autograd bwd only", b, b / h);
    ag_mlp_free(&net);
    td_tensor_release(flat);
    td_tensor_release(xt);
    td_tensor_release(yt);
    free(params);
    free(grads);
    free(scratch);
    free(hand);
    free(ag);
    free(bwd);
    return sink == 12345.0f;
}
