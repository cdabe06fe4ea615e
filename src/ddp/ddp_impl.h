/* The reducer's state (reducer.c), shared with the comm hooks (comm_hooks.c) and Join (join.c). */
#ifndef TDIST_DDP_IMPL_H
#define TDIST_DDP_IMPL_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include <tdist/ddp.h>

typedef struct ddp_param {
    td_tensor *tensor;  /* retained */
    char *name;         /* NULL unless options named it */
    int index;          /* among the reduced parameters (those that require grad) */
    int bucket;         /* -1: not reduced */
    int64_t offset, numel;
    td_tensor *view;    /* its slice of the bucket, in its shape */
    uint64_t hook;
    bool hooked;
    bool ready;         /* marked this iteration */
    bool used;          /* a gradient arrived since the last reduction (find_unused_parameters) */
    bool unused;        /* the outputs' graph does not reach it this iteration */
} ddp_param;

struct td_ddp_bucket {
    td_ddp *ddp;
    int index;
    td_dtype dtype;
    int *params;        /* indices into td_ddp.params */
    int n_params;
    int64_t numel;
    td_tensor *buffer;  /* flat, contiguous */
    int pending;        /* parameters not yet ready this iteration */
    bool is_last;
    td_future *work;    /* the reduction in flight */
};
typedef struct td_ddp_bucket ddp_bucket;

typedef struct ddp_hook_ctx {
    td_ddp *ddp;
    int param;
} ddp_hook_ctx;

typedef struct ddp_join ddp_join;

struct td_ddp {
    pthread_mutex_t mu;
    td_pg *pg;
    int rank, world_size;
    int64_t cap, first_cap;
    bool find_unused, broadcast_buffers, as_view, static_graph;
    int debug;          /* the group's pg_debug_level */

    ddp_param *params;
    int n_params;
    int *reduced;       /* indices of the parameters that require grad */
    int n_reduced;
    td_tensor **buffers;
    int n_buffers;
    ddp_bucket *buckets;
    int num_buckets;

    td_ddp_comm_hook_fn hook;
    void *hook_state;

    /* The iteration. */
    bool require_sync;     /* false under no_sync */
    bool expect_hooks;     /* armed by post_forward */
    bool require_finalize; /* armed and not yet reduced */
    bool marked_unused;
    int next_bucket;
    int div_factor;        /* 0 until the first gradient of the backward */
    bool freed;

    /* Bucket rebuild: the order gradients arrived in during the first iteration. */
    int *arrival;
    int arrival_len;
    bool rebuild_pending, rebuilt;

    /* Logging. */
    int64_t iteration;
    bool has_error;
    char error[512];
    int64_t first_hook_ns, first_launch_ns, last_launch_ns;
    int64_t log_backward_ns, log_comm_ns, log_hidden_ns;

    ddp_join *join;
};

/* reducer.c, for join.c. */
td_status ddp_launch(td_ddp *d, ddp_bucket *bk);     /* starts bk's reduction (comm hook or all_reduce) */
td_status ddp_maybe_rebuild(td_ddp *d);              /* the pending bucket rebuild, if any */
td_status ddp_sync_buffers(td_ddp *d, int src);      /* broadcast_buffers from src */
td_status ddp_broadcast_all(td_pg *pg, td_tensor *const *ts, int n, int src);
td_status ddp_divide(td_tensor *t, int n);             /* t /= n in place */
/* Waits for work (NULL: nothing) and releases it; returns first, or work's failure (set as the
 * thread's error) when first is TD_OK: the one wait loop of every "start all, wait all". */
td_status ddp_settle(td_future *work, td_status first);
/* comm_hooks.c: buf /= pg's size, then an asynchronous all_reduce SUM of buf (allreduce_hook's
 * reduction, shared by post-local SGD and the model averager). */
td_status ddp_average_async(td_pg *pg, td_tensor *buf, td_future **out);

/* join.c. td_ddp_pre_forward calls notify (the active rank's notice, and the early-termination
 * check), buffer_source (the rank buffers come from: 0, or under Join the highest active rank),
 * and sync_flag (whether this iteration reduces gradients); the first gradient of a backward asks
 * div_factor (the world size, or under Join the ranks still active). */
td_status ddp_join_notify(td_ddp *d);
td_status ddp_join_buffer_source(td_ddp *d, bool candidate, int *src);
td_status ddp_join_sync_flag(td_ddp *d);
td_status ddp_join_div_factor(td_ddp *d, int *div);
void ddp_join_free(td_ddp *d);

#endif
