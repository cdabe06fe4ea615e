/* A work queue served by RPC: worker0 hands out jobs (slices of a vector) to the other workers with
 * td_rpc_async, two in flight per worker, and adds up what comes back.
 *   tdrun --standalone --nproc-per-node 3 ./rpc_work_queue   prints "sum of squares of 0..9999 = ..."
 * Every worker registers the same functions before it joins; only worker0 calls. */
#include <stdio.h>
#include <stdlib.h>

#include <tdist/tdist.h>

/* The job: the sum of the squares of the tensor it is given. */
static td_status sum_of_squares(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *arg[1];
    if (td_rpc_bind("sum_of_squares", "t", args, kwargs, arg) != TD_OK)
        return TD_ERR_REMOTE;
    td_tensor *t = td_value_get_tensor(arg[0]);
    if (!t || td_tensor_dtype(t) != TD_FLOAT64)
        return td_rpc_raise("TypeError", "sum_of_squares() expects a float64 tensor");
    const double *x = td_tensor_data(t);
    double sum = 0;
    for (int64_t i = 0; i < td_tensor_numel(t); i++)
        sum += x[i] * x[i];
    *result = td_value_double(sum);
    return TD_OK;
}

#define N 10000
#define JOB 500
#define MAX_SLOTS 64

/* Waits for the job in *f, adds its result to *sum and empties the slot. */
static int collect(td_future **f, double *sum)
{
    int rc = 0;
    if (td_future_wait(*f, 0) != TD_OK) {
        fprintf(stderr, "job failed: %s\n", td_last_error());
        rc = 1;
    } else {
        *sum += td_value_get_double(td_future_value(*f));
    }
    td_future_release(*f);
    *f = NULL;
    return rc;
}

int main(void)
{
    td_rpc_register("sum_of_squares", sum_of_squares, NULL);
    const char *r = getenv("RANK"), *w = getenv("WORLD_SIZE"); /* set by tdrun */
    int rank = r ? atoi(r) : 0, world = w ? atoi(w) : 1;
    char name[32];
    snprintf(name, sizeof name, "worker%d", rank);
    if (td_rpc_init(name, rank, world, NULL) != TD_OK) { /* env:// rendezvous */
        fprintf(stderr, "%s: init failed: %s\n", name, td_last_error());
        return 1;
    }
    int rc = 0;
    if (rank == 0 && world > 1) {
        td_tensor *all;
        td_tensor_arange(TD_FLOAT64, 0, N, 1, &all);
        td_future *inflight[MAX_SLOTS] = {0};
        int slots = 2 * (world - 1) < MAX_SLOTS ? 2 * (world - 1) : MAX_SLOTS;
        double sum = 0;
        for (int job = 0; job < N / JOB; job++) {
            int s = job % slots; /* slot s always goes to the same worker */
            if (inflight[s])
                rc |= collect(&inflight[s], &sum);
            td_tensor *slice;
            td_tensor_narrow(all, 0, (int64_t)job * JOB, JOB, &slice);
            td_value *args = td_value_tuple_of(1, td_value_tensor(slice));
            if (td_rpc_async(NULL, td_rpc_to_id(1 + s % (world - 1)), "sum_of_squares", args, NULL,
                             TD_RPC_DEFAULT_TIMEOUT, &inflight[s]) != TD_OK) {
                fprintf(stderr, "call failed: %s\n", td_last_error());
                rc = 1;
            }
            td_value_release(args);
            td_tensor_release(slice);
        }
        for (int s = 0; s < slots; s++)
            if (inflight[s])
                rc |= collect(&inflight[s], &sum);
        printf("sum of squares of 0..%d = %.0f\n", N - 1, sum);
        td_tensor_release(all);
    }
    /* Graceful: returns once no worker has calls in flight, so the others serve until worker0 is done. */
    if (td_rpc_shutdown(true, 0) != TD_OK) {
        fprintf(stderr, "%s: shutdown failed: %s\n", name, td_last_error());
        rc = 1;
    }
    return rc;
}
