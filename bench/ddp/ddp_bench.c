/* ddp_bench: one data-parallel training step through DistributedDataParallel (tdist/ddp.h) on
 * tdist's autograd, timed on every rank of a job started by tdrun; bench/ddp/run.sh runs it beside
 * PyTorch's DDP with Gloo (torch_ddp_bench.py, the same model, shapes, buckets and step).
 *
 *   tdrun --standalone --nproc-per-node N ddp_bench [--model mlp|wide] [--steps N] [--warmup N]
 *                                                   [--batch B] [--bucket-kb K]
 *
 * The model is an MLP of float32 linear layers (addmm with weights [in, out], ReLU between them,
 * cross-entropy on the last): "mlp" is the demo's 16-96-96-4 (examples/ddp_train.c), "wide" is
 * 16-1024-1024-1024-4. A step is td_ddp_pre_forward, the forward, td_ddp_post_forward,
 * td_autograd_backward (the gradient buckets all_reduced from its hooks) and SGD with momentum 0.9
 * on the raw parameters, gradients then set to none, on one fixed batch of the demo's data (B rows
 * per rank). --bucket-kb sets DDP's bucket cap and first-bucket size (0: DDP's defaults, 25 MiB and
 * 1 MiB). Rank 0 prints the median step time, the steps per second over the timed loop, and
 * td_ddp_logging's backward, communication and hidden communication per step, summed over the
 * timed steps of every rank, then its own mean time per step in each phase:
 *   step_ms M steps_per_s S backward_ms B comm_ms C hidden_pct H buckets K
 *   phases_ms forward F backward_call W sgd O */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/tdist.h>

#include "mlp.h"

enum { MAX_LAYERS = 8 };

typedef struct net {
    int n_layers;
    td_tensor *param[2 * MAX_LAYERS]; /* w0 [in, out], b0 [out], w1, b1, ... */
    float *vel[2 * MAX_LAYERS];
} net;

static void check(td_status st, const char *what)
{
    if (st != TD_OK) {
        fprintf(stderr, "ddp_bench: %s failed: %s: %s\n", what, td_status_str(st), td_last_error());
        exit(1);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* He-initialised weights and zero biases, each a leaf that requires grad (rank 0's are broadcast
 * by td_ddp_create anyway). */
static void net_make(net *m, const int *dims, int n_layers)
{
    uint64_t seed = 1234;
    m->n_layers = n_layers;
    for (int l = 0; l < n_layers; l++) {
        int in = dims[l], out = dims[l + 1];
        td_tensor *w, *b;
        check(td_tensor_empty(TD_FLOAT32, TD_SHAPE(in, out), &w), "tensor");
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(out), &b), "tensor");
        float *wv = td_tensor_data(w), scale = 2.0f * sqrtf(2.0f / (float)in);
        for (int64_t i = 0; i < (int64_t)in * out; i++)
            wv[i] = scale * ((float)(rng_next(&seed) >> 40) / 16777216.0f - 0.5f);
        m->param[2 * l] = w;
        m->param[2 * l + 1] = b;
    }
    for (int i = 0; i < 2 * n_layers; i++) {
        check(td_autograd_set_requires_grad(m->param[i], true), "requires_grad");
        m->vel[i] = calloc((size_t)td_tensor_numel(m->param[i]), sizeof(float));
    }
}

static void net_free(net *m)
{
    for (int i = 0; i < 2 * m->n_layers; i++) {
        td_tensor_release(m->param[i]);
        free(m->vel[i]);
    }
}

/* The mean cross-entropy of the batch. */
static td_tensor *net_loss(const net *m, td_tensor *x, td_tensor *y)
{
    td_tensor *h = td_tensor_retain(x);
    for (int l = 0; l < m->n_layers; l++) {
        td_tensor *z = NULL;
        check(td_autograd_addmm(m->param[2 * l + 1], h, m->param[2 * l], &z), "addmm");
        td_tensor_release(h);
        if (l + 1 < m->n_layers) {
            check(td_autograd_relu(z, &h), "relu");
            td_tensor_release(z);
        } else {
            h = z;
        }
    }
    td_tensor *loss = NULL;
    check(td_autograd_cross_entropy(h, y, TD_REDUCTION_MEAN, -100, &loss), "cross_entropy");
    td_tensor_release(h);
    return loss;
}

/* torch.optim.SGD(lr, momentum=0.9).step() then zero_grad(set_to_none=True). */
static void net_sgd(net *m, float lr)
{
    for (int i = 0; i < 2 * m->n_layers; i++) {
        td_tensor *g = td_autograd_get_grad(m->param[i]);
        if (!g)
            continue;
        float *restrict p = td_tensor_data(m->param[i]), *restrict v = m->vel[i];
        const float *restrict gv = td_tensor_data(g); /* restrict: the loop vectorizes, as torch's does */
        int64_t n = td_tensor_numel(m->param[i]);
        for (int64_t k = 0; k < n; k++) {
            v[k] = 0.9f * v[k] + gv[k];
            p[k] -= lr * v[k];
        }
        td_tensor_release(g);
        check(td_autograd_set_grad(m->param[i], NULL), "zero_grad");
    }
}

int main(int argc, char **argv)
{
    const char *model_name = "mlp";
    int steps = 500, warmup = 50, batch = 32;
    long long bucket_kb = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--model") == 0)
            model_name = argv[i + 1];
        else if (strcmp(argv[i], "--steps") == 0)
            steps = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--warmup") == 0)
            warmup = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--batch") == 0)
            batch = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--bucket-kb") == 0)
            bucket_kb = atoll(argv[i + 1]);
    }
    int mlp_dims[] = {DIM, 96, 96, CLASSES}, wide_dims[] = {DIM, 1024, 1024, 1024, CLASSES};
    bool wide = strcmp(model_name, "wide") == 0;
    if (!wide && strcmp(model_name, "mlp") != 0) {
        fprintf(stderr, "ddp_bench: --model is mlp or wide, not '%s'\n", model_name);
        return 2;
    }
    if (steps < 1 || warmup < 0 || batch < 1) {
        fprintf(stderr, "ddp_bench: --steps and --batch must be positive, --warmup not negative\n");
        return 2;
    }
    check(td_init_process_group(NULL), "init_process_group");
    int rank = td_get_rank();

    net m = {0};
    if (wide)
        net_make(&m, wide_dims, 4);
    else
        net_make(&m, mlp_dims, 3);
    td_ddp_options opt = TD_DDP_OPTIONS_INIT;
    opt.bucket_cap_bytes = opt.first_bucket_bytes = bucket_kb << 10;
    td_ddp *ddp;
    check(td_ddp_create(NULL, m.param, 2 * m.n_layers, NULL, 0, &opt, &ddp), "ddp_create");

    /* One batch of the demo's data, a different slice on each rank. */
    float *x = malloc(sizeof(float) * DIM * (size_t)batch);
    int *y = malloc(sizeof(int) * (size_t)batch * (size_t)(rank + 1));
    float *xall = malloc(sizeof(float) * DIM * (size_t)batch * (size_t)(rank + 1));
    make_data(1234, batch * (rank + 1), xall, y);
    memcpy(x, xall + (size_t)rank * batch * DIM, sizeof(float) * DIM * (size_t)batch);
    td_tensor *xt, *yt;
    check(td_tensor_from_buffer(TD_FLOAT32, TD_SHAPE(batch, DIM), x, &xt), "tensor");
    check(td_tensor_empty(TD_INT64, TD_SHAPE(batch), &yt), "tensor");
    for (int b = 0; b < batch; b++)
        ((int64_t *)td_tensor_data(yt))[b] = y[rank * batch + b];

    double *ms = malloc(sizeof(double) * (size_t)steps);
    double sums[3] = {0, 0, 0}; /* backward, communication, hidden: ns over the timed steps */
    double t_loop = 0;
    double phase[3] = {0, 0, 0}; /* seconds in the forward, the backward call, the optimizer */
    for (int i = -warmup; i < steps; i++) {
        if (i == 0)
            t_loop = mlp_now_s();
        double t0 = mlp_now_s();
        check(td_ddp_pre_forward(ddp), "pre_forward");
        td_tensor *loss = net_loss(&m, xt, yt);
        check(td_ddp_post_forward(ddp, &loss, 1), "post_forward");
        double t1 = mlp_now_s();
        check(td_autograd_backward(loss, NULL, false), "backward");
        td_tensor_release(loss);
        double t2 = mlp_now_s();
        net_sgd(&m, 0.01f);
        if (i >= 0) {
            double t3 = mlp_now_s();
            ms[i] = (t3 - t0) * 1e3;
            phase[0] += t1 - t0;
            phase[1] += t2 - t1;
            phase[2] += t3 - t2;
            td_ddp_logging_data log;
            check(td_ddp_logging(ddp, &log), "logging");
            sums[0] += (double)log.backward_ns;
            sums[1] += (double)log.comm_ns;
            sums[2] += (double)log.comm_hidden_ns;
        }
    }
    t_loop = mlp_now_s() - t_loop;
    td_ddp_logging_data log;
    check(td_ddp_logging(ddp, &log), "logging");
    td_tensor *all;
    check(td_tensor_from_buffer(TD_FLOAT64, TD_SHAPE(3), sums, &all), "tensor");
    check(td_pg_all_reduce(NULL, all, TD_OP_SUM, NULL), "all_reduce");
    const double *s = td_tensor_data(all);
    int world = td_get_world_size();
    qsort(ms, (size_t)steps, sizeof *ms, cmp_double);
    if (rank == 0)
        printf("step_ms %.3f steps_per_s %.1f backward_ms %.3f comm_ms %.3f hidden_pct %.1f buckets %d\n",
               ms[steps / 2], steps / t_loop, s[0] / 1e6 / steps / world, s[1] / 1e6 / steps / world,
               s[1] > 0 ? 100.0 * s[2] / s[1] : 0.0, log.num_buckets);
    if (rank == 0)
        printf("phases_ms forward %.3f backward_call %.3f sgd %.3f\n", phase[0] * 1e3 / steps, phase[1] * 1e3 / steps,
               phase[2] * 1e3 / steps);
    td_tensor_release(all);
    td_ddp_free(ddp);
    net_free(&m);
    td_tensor_release(xt);
    td_tensor_release(yt);
    free(ms);
    free(x);
    free(xall);
    free(y);
    td_destroy_process_group();
    return 0;
}
