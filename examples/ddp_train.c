/* ddp_train: data-parallel training of a small multi-layer perceptron with tdist.
 *
 *   tdrun --nproc-per-node 4 ./ddp_train [--epochs N] [--samples N] [--hidden N] [--batch N]
 *                                        [--lr X] [--seed N] [--target ACCURACY]
 *                                        [--bucket-kb N] [--manual]
 *
 * Every rank builds the same synthetic classification set from a seed (points in 16 dimensions
 * whose class is decided by a fixed nonlinear rule, so a linear model cannot learn it) and trains
 * on its own shard. By default each step goes through DistributedDataParallel (tdist/ddp.h) on
 * tdist's autograd: td_ddp_pre_forward, the loss from autograd ops (ag_mlp.h), td_ddp_post_forward,
 * td_autograd_backward (whose gradient hooks all_reduce the buckets while the backward goes on),
 * then SGD with momentum on the parameters' raw data. --bucket-kb sets DDP's bucket cap (the first
 * bucket's too). Its default, 1 KiB, makes one bucket per layer: the demo's 44 KiB of gradients
 * would fit DDP's default first bucket (1 MiB) whole, which starts only when the backward is over,
 * so nothing could overlap it. --manual trains the way this example did before DDP: mlp.c's hand-written
 * backward per sample and one all_reduce (ReduceOp.AVG over the flat gradient buffer) after it.
 * Rank 0 prints the loss and the test accuracy after each epoch. At the end every rank checks that
 * its parameters are bit-identical to rank 0's and prints its time per step; in DDP mode rank 0
 * also prints how much of the communication ran hidden behind the backward, summed over every
 * step of every rank (td_ddp_logging). The program exits 1 if training did not reach the target
 * accuracy or the ranks disagree. */
#include <inttypes.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/tdist.h>

#include "ag_mlp.h"
#include "mlp.h"


static int check(td_status st, const char *what)
{
    if (st != TD_OK) {
        fprintf(stderr, "ddp_train: %s failed: %s: %s\n", what, td_status_str(st), td_last_error());
        return 1;
    }
    return 0;
}

/* What a training step needs in either mode, and the timings it adds up. */
typedef struct trainer {
    bool manual;
    int batch;
    size_t np;
    /* --manual: the hand-written backward into one flat gradient tensor, one all_reduce */
    model *m, *g;
    td_tensor *grads_t;
    float *scratch;
    /* DDP: the autograd model over the same flat parameters, the batch as tensors */
    ag_mlp net;
    td_ddp *ddp;
    td_tensor *xb, *yb;
    int64_t steps, backward_ns, comm_ns, hidden_ns;
    double t_compute, t_comm; /* --manual's split; DDP's step time goes into t_compute */
} trainer;

/* One step on the rank's slice idx (cfg.batch sample indices): gradients averaged over the ranks,
 * then SGD with momentum. Adds the slice's summed loss to *loss_sum. */
static int train_step(trainer *tr, td_pg *pg, const float *x, const int *y, const int *idx, float *params, float *vel,
                      double lr, double *loss_sum)
{
    double t0 = mlp_now_s();
    if (tr->manual) {
        float *grads = td_tensor_data(tr->grads_t), *a1 = tr->scratch;
        memset(grads, 0, sizeof(float) * tr->np);
        for (int b = 0; b < tr->batch; b++)
            *loss_sum += backward(tr->m, tr->g, x + (size_t)idx[b] * DIM, y[idx[b]], 1.0f / tr->batch, a1,
                                  a1 + tr->m->h, a1 + 2 * tr->m->h, a1 + 3 * tr->m->h);
        double t1 = mlp_now_s();
        if (check(td_pg_all_reduce(pg, tr->grads_t, TD_OP_AVG, NULL), "all_reduce"))
            return 1;
        double t2 = mlp_now_s();
        for (size_t i = 0; i < tr->np; i++) {
            vel[i] = 0.9f * vel[i] + grads[i];
            params[i] -= (float)lr * vel[i];
        }
        tr->t_compute += (t1 - t0) + (mlp_now_s() - t2);
        tr->t_comm += t2 - t1;
        return 0;
    }
    float *xv = td_tensor_data(tr->xb);
    int64_t *yv = td_tensor_data(tr->yb);
    for (int b = 0; b < tr->batch; b++) {
        memcpy(xv + (size_t)b * DIM, x + (size_t)idx[b] * DIM, sizeof(float) * DIM);
        yv[b] = y[idx[b]];
    }
    td_tensor *loss = NULL;
    if (check(td_ddp_pre_forward(tr->ddp), "ddp pre_forward") ||
        check(ag_mlp_loss(&tr->net, tr->xb, tr->yb, &loss), "forward") ||
        check(td_ddp_post_forward(tr->ddp, &loss, 1), "ddp post_forward"))
        return 1;
    double mean = 0;
    td_tensor_get_f64(loss, NULL, &mean);
    *loss_sum += mean * tr->batch;
    td_status st = td_autograd_backward(loss, NULL, false); /* the buckets are reduced inside */
    td_tensor_release(loss);
    if (check(st, "backward"))
        return 1;
    td_ddp_logging_data log;
    if (check(td_ddp_logging(tr->ddp, &log), "ddp logging"))
        return 1;
    tr->steps++;
    tr->backward_ns += log.backward_ns;
    tr->comm_ns += log.comm_ns;
    tr->hidden_ns += log.comm_hidden_ns;
    ag_mlp_sgd(&tr->net, vel, (float)lr); /* on the raw data; clears the gradients */
    tr->t_compute += mlp_now_s() - t0;
    return 0;
}

/* Drops a flag without a value (--manual) from argv, since train_config_parse reads flags in pairs;
 * returns whether it was there. */
static bool take_flag(int *argc, char **argv, const char *flag)
{
    bool found = false;
    int out = 1;
    for (int i = 1; i < *argc; i++) {
        if (strcmp(argv[i], flag) == 0)
            found = true;
        else
            argv[out++] = argv[i];
    }
    *argc = out;
    return found;
}

int main(int argc, char **argv)
{
    trainer tr = {0};
    tr.manual = take_flag(&argc, argv, "--manual");
    train_config cfg;
    train_config_parse(argc, argv, &cfg);
    int64_t bucket_kb = 1;
    for (int i = 1; i + 1 < argc; i += 2)
        if (strcmp(argv[i], "--bucket-kb") == 0)
            bucket_kb = atoll(argv[i + 1]);

    /* env:// rendezvous with the launcher's variables, on the default backend. */
    if (check(td_init_process_group(NULL), "init_process_group"))
        return 1;
    td_pg *pg = td_default_pg();
    int rank = td_get_rank(), world = td_get_world_size();

    int n_test = 4000;
    float *x = malloc(sizeof(float) * DIM * (size_t)(cfg.samples + n_test));
    int *y = malloc(sizeof(int) * (size_t)(cfg.samples + n_test));
    make_data(cfg.seed, cfg.samples + n_test, x, y);
    const float *x_test = x + (size_t)cfg.samples * DIM;
    const int *y_test = y + cfg.samples;

    size_t np = model_size(cfg.hidden);
    td_tensor *params_t, *velocity_t;
    if (check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &params_t), "tensor") ||
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &velocity_t), "tensor"))
        return 1;
    float *params = td_tensor_data(params_t), *vel = td_tensor_data(velocity_t);
    model m, g;
    model_bind(&m, params, cfg.hidden);
    model_init(&m, cfg.seed);
    float *a1 = malloc(sizeof(float) * (size_t)cfg.hidden * 4); /* mlp.c's scratch */

    tr.batch = cfg.batch;
    tr.np = np;
    tr.m = &m;
    tr.g = &g;
    tr.scratch = a1;
    if (tr.manual) {
        if (check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &tr.grads_t), "tensor"))
            return 1;
        model_bind(&g, td_tensor_data(tr.grads_t), cfg.hidden);
    } else {
        /* The autograd model views the same flat parameters; DDP wraps its six leaves. */
        td_ddp_options opt = TD_DDP_OPTIONS_INIT;
        opt.bucket_cap_bytes = opt.first_bucket_bytes = bucket_kb << 10;
        if (check(ag_mlp_bind(&tr.net, params_t, DIM, cfg.hidden, CLASSES), "ag_mlp_bind") ||
            check(td_ddp_create(pg, tr.net.param, AG_MLP_PARAMS, NULL, 0, &opt, &tr.ddp), "ddp_create") ||
            check(td_tensor_empty(TD_FLOAT32, TD_SHAPE(cfg.batch, DIM), &tr.xb), "tensor") ||
            check(td_tensor_empty(TD_INT64, TD_SHAPE(cfg.batch), &tr.yb), "tensor"))
            return 1;
    }

    /* Every rank takes the same number of steps: the shard is the rank's slice of each global batch. */
    int global_batch = cfg.batch * world;
    int steps_per_epoch = cfg.samples / global_batch;
    if (rank == 0)
        printf("ddp_train: %d ranks, %d samples, MLP %d-%d-%d-%d (%zu parameters), %d steps/epoch of %d, %s\n", world,
               cfg.samples, DIM, cfg.hidden, cfg.hidden, CLASSES, np, steps_per_epoch, global_batch,
               tr.manual ? "hand-written backward + all_reduce" : "autograd + DDP");

    double acc = 0;
    int *order = malloc(sizeof(int) * (size_t)cfg.samples);
    for (int i = 0; i < cfg.samples; i++)
        order[i] = i;
    uint64_t shuffle = cfg.seed;
    for (int epoch = 1; epoch <= cfg.epochs; epoch++) {
        double t_epoch = mlp_now_s();
        for (int i = cfg.samples - 1; i > 0; i--) { /* the same permutation on every rank */
            int j = (int)(rng_next(&shuffle) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double loss_sum = 0;
        double lr = cfg.lr * (epoch > cfg.epochs * 3 / 4 ? 0.3 : 1.0);
        for (int step = 0; step < steps_per_epoch; step++) {
            const int *idx = order + (size_t)step * global_batch + (size_t)rank * cfg.batch;
            if (train_step(&tr, pg, x, y, idx, params, vel, lr, &loss_sum))
                return 1;
        }
        /* Loss over the whole job: each rank's sum, averaged. */
        td_tensor *stats;
        if (check(td_tensor_full(TD_FLOAT64, TD_SHAPE(1), loss_sum, &stats), "tensor"))
            return 1;
        if (check(td_pg_all_reduce(pg, stats, TD_OP_SUM, NULL), "all_reduce"))
            return 1;
        double loss = *(double *)td_tensor_data(stats) / ((double)steps_per_epoch * global_batch);
        td_tensor_release(stats);
        if (rank == 0) {
            acc = accuracy(&m, x_test, y_test, n_test, a1);
            char bar[21];
            int filled = epoch * 20 / cfg.epochs;
            for (int i = 0; i < 20; i++)
                bar[i] = i < filled ? '#' : '.';
            bar[20] = '\0';
            printf("epoch %2d/%d [%s] loss %.4f  test accuracy %5.1f%%  %.2fs\n", epoch, cfg.epochs, bar, loss,
                   acc * 100, mlp_now_s() - t_epoch);
            fflush(stdout);
        }
    }

    /* Every rank must hold exactly rank 0's parameters. */
    td_tensor *reference;
    if (check(td_tensor_clone(params_t, &reference), "clone") ||
        check(td_pg_broadcast(pg, reference, 0, NULL), "broadcast"))
        return 1;
    int same = memcmp(td_tensor_data(reference), params, sizeof(float) * np) == 0;
    td_tensor *flag;
    if (check(td_tensor_full(TD_INT32, TD_SHAPE(2), 0, &flag), "tensor"))
        return 1;
    ((int32_t *)td_tensor_data(flag))[0] = same;
    ((int32_t *)td_tensor_data(flag))[1] = rank == 0 ? (int32_t)(acc * 10000) : 0;
    /* MIN of "same" tells everyone whether all agreed; SUM carries rank 0's accuracy to all. */
    td_tensor *agree;
    if (check(td_tensor_narrow(flag, 0, 0, 1, &agree), "narrow") ||
        check(td_pg_all_reduce(pg, agree, TD_OP_MIN, NULL), "all_reduce"))
        return 1;
    td_tensor *accv;
    if (check(td_tensor_narrow(flag, 0, 1, 1, &accv), "narrow") ||
        check(td_pg_all_reduce(pg, accv, TD_OP_SUM, NULL), "all_reduce"))
        return 1;
    int all_same = ((int32_t *)td_tensor_data(flag))[0];
    double final_acc = ((int32_t *)td_tensor_data(flag))[1] / 10000.0;
    int steps = steps_per_epoch * cfg.epochs;
    if (tr.manual)
        printf("rank %d: parameters %s rank 0's; per step %.3f ms computing, %.3f ms communicating\n", rank,
               same ? "bit-identical to" : "DIFFER from", 1e3 * tr.t_compute / steps, 1e3 * tr.t_comm / steps);
    else
        printf("rank %d: parameters %s rank 0's; per step %.3f ms, backward %.3f ms, communication %.3f ms (%.0f%% "
               "hidden)\n",
               rank, same ? "bit-identical to" : "DIFFER from", 1e3 * tr.t_compute / steps,
               1e-6 * (double)tr.backward_ns / (double)tr.steps, 1e-6 * (double)tr.comm_ns / (double)tr.steps,
               tr.comm_ns ? 100.0 * (double)tr.hidden_ns / (double)tr.comm_ns : 0.0);

    /* The overlap over the whole job: every rank's communication and hidden time, summed. */
    if (!tr.manual) {
        td_tensor *overlap;
        td_ddp_logging_data log;
        if (check(td_tensor_zeros(TD_FLOAT64, TD_SHAPE(2), &overlap), "tensor") ||
            check(td_ddp_logging(tr.ddp, &log), "ddp logging"))
            return 1;
        ((double *)td_tensor_data(overlap))[0] = (double)tr.comm_ns;
        ((double *)td_tensor_data(overlap))[1] = (double)tr.hidden_ns;
        if (check(td_pg_all_reduce(pg, overlap, TD_OP_SUM, NULL), "all_reduce"))
            return 1;
        const double *o = td_tensor_data(overlap);
        if (rank == 0) {
            printf("DDP: %d buckets (", log.num_buckets);
            for (int b = 0; b < log.num_buckets && b < 8; b++)
                printf("%s%.1f", b ? ", " : "", (double)log.bucket_bytes[b] / 1024.0);
            printf(" KiB)%s, %" PRId64 " steps on %d ranks: communication %.3f ms per step, %.0f%% hidden behind the "
                   "backward\n",
                   log.rebuilt ? ", rebuilt in gradient order" : "", tr.steps, world, 1e-6 * o[0] / (double)(tr.steps * world),
                   o[0] > 0 ? 100.0 * o[1] / o[0] : 0.0);
        }
        td_tensor_release(overlap);
    }

    int rc = 0;
    if (!all_same) {
        if (rank == 0)
            printf("FAILED: ranks disagree on the parameters\n");
        rc = 1;
    } else if (final_acc < cfg.target) {
        if (rank == 0)
            printf("FAILED: test accuracy %.1f%% is below the %.0f%% target\n", final_acc * 100, cfg.target * 100);
        rc = 1;
    } else if (rank == 0) {
        printf("ddp_train: trained to %.1f%% test accuracy; all %d ranks hold identical parameters\n",
               final_acc * 100, world);
    }
    td_tensor_release(agree);
    td_tensor_release(accv);
    td_tensor_release(flag);
    td_tensor_release(reference);
    if (!tr.manual) {
        td_ddp_free(tr.ddp);
        ag_mlp_free(&tr.net);
        td_tensor_release(tr.xb);
        td_tensor_release(tr.yb);
    }
    td_tensor_release(tr.grads_t);
    td_tensor_release(params_t);
    td_tensor_release(velocity_t);
    free(order);
    free(a1);
    free(x);
    free(y);
    td_destroy_process_group();
    return rc;
}
