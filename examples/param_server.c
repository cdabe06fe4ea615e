/* param_server: the ddp_train model trained through a parameter server over RPC and RRefs, as
 * PyTorch's "batch-updating parameter server" tutorial does.
 *
 *   tdrun --standalone --nproc-per-node 3 ./param_server [--epochs N] [--samples N] [--hidden N]
 *                                                        [--batch N] [--lr X] [--seed N] [--target A]
 *
 * Worker 0 is the server: it owns the model's parameters through an RRef (td_rref_create) and
 * hands that RRef to every other worker, the trainers, in a call to run_trainer. A trainer fetches
 * the parameters once with to_here, then for each step computes the gradient of its shard of the
 * global batch locally (mlp.c, as ddp_train does) and pushes it with update_and_fetch_model, an
 * async function on the server: it adds the gradient to the step's sum and returns the step's
 * future without holding a thread; the last trainer's push applies the averaged gradient (SGD with
 * momentum, ddp_train's schedule) to the parameters the RRef holds and completes that future with
 * them, which answers every trainer at once. So every step is ddp_train's synchronous step, and the
 * job reaches ddp_train's accuracy. The server prints the loss and test accuracy after each epoch;
 * it exits 1 if the final accuracy is below the target. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/tdist.h>

#include "mlp.h"

enum { N_TEST = 4000 };

#define TRY(expr)                     \
    do {                              \
        td_status try_st_ = (expr);   \
        if (try_st_ != TD_OK)         \
            return try_st_;           \
    } while (0)

static train_config cfg;
static float *data_x;
static int *data_y;

/* ---- the server ------------------------------------------------------------------------------ */

static struct {
    pthread_mutex_t mu;
    int trainers, steps_per_epoch;
    td_tensor *grad_sum, *velocity;
    int pushed;              /* trainers whose gradient this step has */
    double loss_sum;         /* this epoch's */
    long step;               /* steps applied */
    td_future *step_done;    /* answers the pushes of the step in progress */
    double epoch_start, accuracy;
    float *scratch;
} ps = {.mu = PTHREAD_MUTEX_INITIALIZER};

/* The parameters the RRef holds (a new reference to the server's tensor). */
static td_tensor *ps_params(const td_value *rref_value)
{
    td_rref *rref = td_value_get_rref(rref_value);
    td_value *v = NULL;
    if (!rref || td_rref_local_value(rref, &v) != TD_OK)
        return NULL;
    td_tensor *t = td_tensor_retain(td_value_get_tensor(v));
    td_value_release(v);
    return t;
}

/* The epoch that just ended: its loss and the test accuracy. ps.mu held. */
static void report_epoch(const model *m, int epoch)
{
    ps.accuracy = accuracy(m, data_x + (size_t)cfg.samples * DIM, data_y + cfg.samples, N_TEST, ps.scratch);
    double loss = ps.loss_sum / ((double)ps.steps_per_epoch * cfg.batch * ps.trainers);
    char bar[21];
    int filled = epoch * 20 / cfg.epochs;
    for (int i = 0; i < 20; i++)
        bar[i] = i < filled ? '#' : '.';
    bar[20] = '\0';
    printf("epoch %2d/%d [%s] loss %.4f  test accuracy %5.1f%%  %.2fs\n", epoch, cfg.epochs, bar, loss,
           ps.accuracy * 100, mlp_now_s() - ps.epoch_start);
    fflush(stdout);
    ps.loss_sum = 0;
    ps.epoch_start = mlp_now_s();
}

/* update_and_fetch_model(ps_rref, grads, loss_sum): an async function on the server. */
static td_future *update_and_fetch_model(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)call;
    const td_value *a[3];
    if (td_rpc_bind("update_and_fetch_model", "ps_rref,grads,loss_sum", args, kwargs, a) != TD_OK)
        return NULL;
    td_tensor *params = ps_params(a[0]), *grads = td_value_get_tensor(a[1]);
    if (!params || !grads || td_tensor_numel(grads) != td_tensor_numel(params)) {
        td_tensor_release(params);
        td_rpc_raise("ValueError", "update_and_fetch_model expects the server's RRef and a gradient of its size");
        return NULL;
    }
    pthread_mutex_lock(&ps.mu);
    float *sum = td_tensor_data(ps.grad_sum);
    const float *g = td_tensor_data(grads);
    size_t n = (size_t)td_tensor_numel(grads);
    for (size_t i = 0; i < n; i++)
        sum[i] += g[i];
    ps.loss_sum += td_value_get_double(a[2]);
    td_future *mine = td_future_retain(ps.step_done), *done = NULL;
    td_value *reply = NULL;
    if (++ps.pushed == ps.trainers) {
        /* The last push of the step: ddp_train's update with the average of the trainers' gradients. */
        int epoch = (int)(ps.step / ps.steps_per_epoch) + 1;
        double lr = cfg.lr * (epoch > cfg.epochs * 3 / 4 ? 0.3 : 1.0);
        float *p = td_tensor_data(params), *vel = td_tensor_data(ps.velocity);
        for (size_t i = 0; i < n; i++) {
            vel[i] = 0.9f * vel[i] + sum[i] / (float)ps.trainers;
            p[i] -= (float)lr * vel[i];
            sum[i] = 0;
        }
        ps.pushed = 0;
        ps.step++;
        if (ps.step % ps.steps_per_epoch == 0) {
            model m;
            model_bind(&m, p, cfg.hidden);
            report_epoch(&m, epoch);
        }
        td_tensor *copy = NULL;
        if (td_tensor_clone(params, &copy) == TD_OK) {
            reply = td_value_tensor(copy);
            td_tensor_release(copy);
        }
        done = ps.step_done;
        ps.step_done = td_future_new();
    }
    pthread_mutex_unlock(&ps.mu);
    if (done) {
        if (reply)
            td_future_set_result(done, reply);
        else
            td_future_set_error(done, TD_ERR_NOMEM, "the server could not copy the parameters");
        td_future_release(done);
    }
    td_tensor_release(params);
    return mine;
}

/* ---- a trainer ------------------------------------------------------------------------------- */

/* run_trainer(ps_rref): trains this worker's shard of every global batch through the server. */
static td_status run_trainer(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    td_rpc_agent *agent = td_rpc_call_agent(call);
    const td_value *a[1];
    TRY(td_rpc_bind("run_trainer", "ps_rref", args, kwargs, a));
    td_rref *rref = td_value_get_rref(a[0]);
    if (!rref)
        return td_rpc_raise("TypeError", "run_trainer expects the server's RRef");
    td_worker_info me, server;
    TRY(td_rpc_worker_info(agent, NULL, &me));
    TRY(td_rref_owner(rref, &server));
    int trainer = (int)me.id - 1, trainers = 0;
    size_t nworkers = 0;
    TRY(td_rpc_worker_infos(agent, NULL, 0, &nworkers));
    trainers = (int)nworkers - 1;

    td_value *fetched = NULL;
    TRY(td_rref_to_here(rref, TD_RPC_DEFAULT_TIMEOUT, &fetched)); /* the initial parameters */
    size_t np = model_size(cfg.hidden);
    td_tensor *grads_t = NULL;
    TRY(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &grads_t));
    float *grads = td_tensor_data(grads_t);
    model g;
    model_bind(&g, grads, cfg.hidden);
    float *scratch = malloc(sizeof(float) * (size_t)cfg.hidden * 4);
    int global_batch = cfg.batch * trainers, steps_per_epoch = cfg.samples / global_batch;
    int *order = malloc(sizeof(int) * (size_t)cfg.samples);
    for (int i = 0; i < cfg.samples; i++)
        order[i] = i;
    uint64_t shuffle = cfg.seed;
    td_status st = TD_OK;
    for (int epoch = 1; epoch <= cfg.epochs && st == TD_OK; epoch++) {
        for (int i = cfg.samples - 1; i > 0; i--) { /* the same permutation on every trainer */
            int j = (int)(rng_next(&shuffle) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        for (int step = 0; step < steps_per_epoch && st == TD_OK; step++) {
            model m;
            model_bind(&m, td_tensor_data(td_value_get_tensor(fetched)), cfg.hidden);
            memset(grads, 0, sizeof(float) * np);
            const int *idx = order + (size_t)step * global_batch + (size_t)trainer * cfg.batch;
            double loss = 0;
            for (int b = 0; b < cfg.batch; b++)
                loss += backward(&m, &g, data_x + (size_t)idx[b] * DIM, data_y[idx[b]], 1.0f / cfg.batch, scratch,
                                 scratch + cfg.hidden, scratch + 2 * cfg.hidden, scratch + 3 * cfg.hidden);
            td_value *push = td_value_tuple_of(3, td_rref_value(rref), td_value_tensor(grads_t), td_value_double(loss));
            td_value *next = NULL;
            st = td_rpc_sync(agent, td_rpc_to_info(&server), "update_and_fetch_model", push, NULL,
                             TD_RPC_DEFAULT_TIMEOUT, &next);
            td_value_release(push);
            if (st == TD_OK) {
                td_value_release(fetched);
                fetched = next;
            }
        }
    }
    free(order);
    free(scratch);
    td_tensor_release(grads_t);
    td_value_release(fetched);
    if (st == TD_OK)
        *result = td_value_int(steps_per_epoch * cfg.epochs);
    return st;
}

/* ---- main ------------------------------------------------------------------------------------ */

static int check(td_status st, const char *what)
{
    if (st != TD_OK) {
        fprintf(stderr, "param_server: %s failed: %s: %s\n", what, td_status_str(st), td_last_error());
        return 1;
    }
    return 0;
}

/* The server's part: returns the exit code. */
static int serve(int world)
{
    ps.trainers = world - 1;
    ps.steps_per_epoch = cfg.samples / (cfg.batch * ps.trainers);
    size_t np = model_size(cfg.hidden);
    td_tensor *params_t = NULL;
    if (check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &params_t), "tensor") ||
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &ps.grad_sum), "tensor") ||
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &ps.velocity), "tensor"))
        return 1;
    model m;
    model_bind(&m, td_tensor_data(params_t), cfg.hidden);
    model_init(&m, cfg.seed);
    ps.scratch = malloc(sizeof(float) * (size_t)cfg.hidden * 2);
    ps.step_done = td_future_new();
    ps.epoch_start = mlp_now_s();
    printf("param_server: 1 server, %d trainers, %d samples, MLP %d-%d-%d-%d (%zu parameters), %d steps/epoch of %d\n",
           ps.trainers, cfg.samples, DIM, cfg.hidden, cfg.hidden, CLASSES, np, ps.steps_per_epoch,
           cfg.batch * ps.trainers);

    /* The model lives in an RRef this worker owns; each trainer gets a user reference to it. */
    td_value *params_v = td_value_tensor(params_t);
    td_rref *ps_rref = NULL;
    int rc = check(td_rref_create(NULL, params_v, &ps_rref), "td_rref_create");
    td_value_release(params_v);
    td_future **runs = calloc((size_t)world, sizeof *runs);
    double t0 = mlp_now_s();
    for (int t = 1; t < world && !rc; t++) {
        td_value *args = td_value_tuple_of(1, td_rref_value(ps_rref));
        rc = check(td_rpc_async(NULL, td_rpc_to_id(t), "run_trainer", args, NULL, TD_RPC_NO_TIMEOUT, &runs[t]),
                   "rpc_async(run_trainer)");
        td_value_release(args);
    }
    for (int t = 1; t < world; t++) {
        if (runs[t] && !rc)
            rc = check(td_future_wait(runs[t], 0), "run_trainer");
        td_future_release(runs[t]);
    }
    free(runs);
    double elapsed = mlp_now_s() - t0;
    if (!rc) {
        printf("param_server: %ld steps in %.2fs (%.3f ms per step)\n", ps.step, elapsed, 1e3 * elapsed / (double)ps.step);
        if (ps.accuracy < cfg.target) {
            printf("FAILED: test accuracy %.1f%% is below the %.0f%% target\n", ps.accuracy * 100, cfg.target * 100);
            rc = 1;
        } else {
            printf("param_server: trained to %.1f%% test accuracy through the server's RRef\n", ps.accuracy * 100);
        }
    }
    td_rref_release(ps_rref);
    td_future_release(ps.step_done);
    td_tensor_release(params_t);
    td_tensor_release(ps.grad_sum);
    td_tensor_release(ps.velocity);
    free(ps.scratch);
    return rc;
}

int main(int argc, char **argv)
{
    train_config_parse(argc, argv, &cfg);
    const char *rank_s = getenv("RANK"), *world_s = getenv("WORLD_SIZE");
    int rank = rank_s ? atoi(rank_s) : 0, world = world_s ? atoi(world_s) : 1;
    if (world < 2) {
        fprintf(stderr, "param_server: needs a server and at least one trainer (tdrun --nproc-per-node 3)\n");
        return 2;
    }
    data_x = malloc(sizeof(float) * DIM * (size_t)(cfg.samples + N_TEST));
    data_y = malloc(sizeof(int) * (size_t)(cfg.samples + N_TEST));
    make_data(cfg.seed, cfg.samples + N_TEST, data_x, data_y);

    char name[32];
    snprintf(name, sizeof name, rank == 0 ? "ps" : "trainer%d", rank);
    if (check(td_rpc_register("run_trainer", run_trainer, NULL), "register") ||
        check(td_rpc_register_async("update_and_fetch_model", update_and_fetch_model, NULL), "register") ||
        check(td_rpc_init(name, rank, world, NULL), "init_rpc"))
        return 1;
    int rc = rank == 0 ? serve(world) : 0;
    /* Trainers serve run_trainer until the server is done: the graceful shutdown waits for it. */
    if (check(td_rpc_shutdown(true, 0), "shutdown"))
        rc = 1;
    free(data_x);
    free(data_y);
    return rc;
}
