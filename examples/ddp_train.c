/* ddp_train: data-parallel training of a small multi-layer perceptron with tdist.
 *
 *   tdrun --nproc-per-node 4 ./ddp_train [--epochs N] [--samples N] [--hidden N] [--batch N]
 *                                        [--lr X] [--seed N] [--target ACCURACY]
 *
 * Every rank builds the same synthetic classification set from a seed (points in 16 dimensions
 * whose class is decided by a fixed nonlinear rule, so a linear model cannot learn it), trains on
 * its own shard, and averages gradients with one all_reduce per step (ReduceOp.AVG over a single
 * flattened gradient buffer, as DDP's bucket does). Rank 0 prints the loss and the test accuracy
 * after each epoch. At the end every rank checks that its parameters are bit-identical to rank 0's
 * and prints how its step time split between computing and communicating. The program exits 1 if
 * training did not reach the target accuracy or the ranks disagree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/tdist.h>

#include "mlp.h"


static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check(td_status st, const char *what)
{
    if (st != TD_OK) {
        fprintf(stderr, "ddp_train: %s failed: %s: %s\n", what, td_status_str(st), td_last_error());
        return 1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    train_config cfg;
    train_config_parse(argc, argv, &cfg);

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
    td_tensor *params_t, *grads_t, *velocity_t;
    if (check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &params_t), "tensor") ||
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &grads_t), "tensor") ||
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &velocity_t), "tensor"))
        return 1;
    float *params = td_tensor_data(params_t), *grads = td_tensor_data(grads_t), *vel = td_tensor_data(velocity_t);
    model m, g;
    model_bind(&m, params, cfg.hidden);
    model_bind(&g, grads, cfg.hidden);
    model_init(&m, cfg.seed);

    float *a1 = malloc(sizeof(float) * (size_t)cfg.hidden * 4);
    float *a2 = a1 + cfg.hidden, *d1 = a2 + cfg.hidden, *d2 = d1 + cfg.hidden;

    /* Every rank takes the same number of steps: the shard is the rank's slice of each global batch. */
    int global_batch = cfg.batch * world;
    int steps_per_epoch = cfg.samples / global_batch;
    if (rank == 0)
        printf("ddp_train: %d ranks, %d samples, MLP %d-%d-%d-%d (%zu parameters), %d steps/epoch of %d\n", world,
               cfg.samples, DIM, cfg.hidden, cfg.hidden, CLASSES, np, steps_per_epoch, global_batch);

    double t_compute = 0, t_comm = 0;
    double acc = 0;
    int *order = malloc(sizeof(int) * (size_t)cfg.samples);
    for (int i = 0; i < cfg.samples; i++)
        order[i] = i;
    uint64_t shuffle = cfg.seed;
    for (int epoch = 1; epoch <= cfg.epochs; epoch++) {
        double t_epoch = now_s();
        for (int i = cfg.samples - 1; i > 0; i--) { /* the same permutation on every rank */
            int j = (int)(rng_next(&shuffle) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double loss_sum = 0;
        double lr = cfg.lr * (epoch > cfg.epochs * 3 / 4 ? 0.3 : 1.0);
        for (int step = 0; step < steps_per_epoch; step++) {
            double t0 = now_s();
            memset(grads, 0, sizeof(float) * np);
            const int *idx = order + (size_t)step * global_batch + (size_t)rank * cfg.batch;
            for (int b = 0; b < cfg.batch; b++)
                loss_sum += backward(&m, &g, x + (size_t)idx[b] * DIM, y[idx[b]], 1.0f / cfg.batch, a1, a2, d1, d2);
            double t1 = now_s();
            if (check(td_pg_all_reduce(pg, grads_t, TD_OP_AVG, NULL), "all_reduce"))
                return 1;
            double t2 = now_s();
            for (size_t i = 0; i < np; i++) {
                vel[i] = 0.9f * vel[i] + grads[i];
                params[i] -= (float)lr * vel[i];
            }
            t_compute += (t1 - t0) + (now_s() - t2);
            t_comm += t2 - t1;
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
                   acc * 100, now_s() - t_epoch);
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
    printf("rank %d: parameters %s rank 0's; per step %.3f ms computing, %.3f ms communicating\n", rank,
           same ? "bit-identical to" : "DIFFER from", 1e3 * t_compute / steps, 1e3 * t_comm / steps);

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
    td_tensor_release(params_t);
    td_tensor_release(grads_t);
    td_tensor_release(velocity_t);
    free(order);
    free(a1);
    free(x);
    free(y);
    td_destroy_process_group();
    return rc;
}
