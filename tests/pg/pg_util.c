/* Helpers shared by the process-group tests (pg_util.h). */
#include "pg_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const td_dtype pg_test_dtypes[PG_NDTYPES] = {TD_FLOAT32, TD_FLOAT64, TD_FLOAT16, TD_BFLOAT16, TD_INT32,
                                              TD_INT64,   TD_UINT8,   TD_BOOL,    TD_COMPLEX64};

static bool is_mpi(const td_test_ctx *ctx) { return strcmp(ctx->param, "mpi") == 0; }

static const char *backend_of(const char *param) { return strcmp(param, "auto2x2") == 0 ? "auto" : param; }

const char *pg_test_backend(const td_test_ctx *ctx) { return backend_of(ctx->param); }

const char *pg_test_skip_unavailable(const char *param)
{
    static __thread char reason[256];
    if (!td_backend_available(backend_of(param))) {
        snprintf(reason, sizeof reason, "Test requires backend %s to be available", param);
        return reason;
    }
    /* MPI ranks come from mpirun (CTest's entries); ranks the supervisor starts are not a job. */
    if (strcmp(param, "mpi") == 0 && !getenv("OMPI_COMM_WORLD_SIZE") && !getenv("PMI_SIZE") &&
        !getenv("SLURM_NTASKS")) {
        snprintf(reason, sizeof reason,
                 "Test runs on backend mpi only under an MPI launcher: mpirun -np N <binary> --td-external "
                 "<case>/mpi");
        return reason;
    }
    return NULL;
}

void pg_test_setup(td_test_ctx *ctx)
{
    if (!is_mpi(ctx))
        return;
    td_pg_options po = pg_test_options(ctx, NULL);
    po.init_method = NULL;
    td_pg *pg = NULL;
    TD_CHECK_OK(td_pg_create(&po, &pg));
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(4), &t));
    TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL)); /* connects the ranks */
    TD_CHECK_OK(td_pg_barrier(pg, NULL));
    td_tensor_release(t);
    td_pg_destroy(pg);
}

static void abort_hook(void *arg)
{
    (void)arg;
    td_threaded_abort_all("Test termination event occurs.");
}

/* Rank 0 runs a TCPStore server on port 0 and publishes the port in <tmpdir>/<name>.port (written
 * whole, by rename); the others wait for the file, connect and check in, and rank 0 removes the
 * file once all did. No port is ever guessed. */
td_store *pg_test_store(td_test_ctx *ctx)
{
    static __thread int stores_made; /* the ranks make their stores in the same order */
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/store%d.port", ctx->tmpdir, stores_made++);
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = "127.0.0.1";
    o.world_size = ctx->world_size;
    o.timeout_ms = 60000;
    o.wait_for_workers = false;
    td_store *store = NULL;
    if (ctx->rank == 0) {
        o.port = 0;
        o.is_master = true;
        TD_CHECK_OK(td_tcp_store_create(&o, &store));
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        TD_CHECK(f != NULL);
        fprintf(f, "%d\n", td_tcp_store_port(store));
        TD_CHECK(fclose(f) == 0);
        TD_CHECK(rename(tmp, path) == 0);
        if (ctx->world_size > 1) {
            const char *key = "pg_test/all_connected";
            TD_CHECK_OK(td_store_wait(store, &key, 1, 60000));
        }
        TD_CHECK(unlink(path) == 0);
        return store;
    }
    for (int i = 0; i < 6000 && !store; i++) {
        FILE *f = fopen(path, "r");
        if (!f) {
            struct timespec d = {0, 10 * 1000000L};
            nanosleep(&d, NULL);
            continue;
        }
        int port = -1;
        TD_CHECK(fscanf(f, "%d", &port) == 1);
        fclose(f);
        o.port = port;
        TD_CHECK_OK(td_tcp_store_create(&o, &store));
    }
    TD_CHECK_MSG(store != NULL, "rank 0 did not publish its store's port in %s within 60 s", path);
    int64_t n = 0;
    TD_CHECK_OK(td_store_add(store, "pg_test/connected", 1, &n));
    if (n == ctx->world_size - 1)
        TD_CHECK_OK(td_store_set_str(store, "pg_test/all_connected", "1"));
    return store;
}

td_pg_options pg_test_options(td_test_ctx *ctx, const pg_test_opts *opts)
{
    pg_test_opts o = {0};
    if (opts)
        o = *opts;
    td_pg_options po = TD_PG_OPTIONS_INIT;
    po.backend = pg_test_backend(ctx);
    if (strcmp(ctx->param, "auto2x2") == 0) {
        /* Two simulated hosts. Each rank is a fresh process and sets this before its first group
         * (the value never changes afterwards, so no library thread reads it while it is set). */
        char host[32];
        snprintf(host, sizeof host, "pg-test-host-%d", ctx->rank * 2 / ctx->world_size);
        const char *cur = getenv("TDIST_HOST_ID");
        if (!cur || strcmp(cur, host) != 0)
            setenv("TDIST_HOST_ID", host, 1);
    }
    po.init_method = o.init_url ? o.init_url : ctx->init_url;
    po.rank = ctx->rank;
    po.world_size = ctx->world_size;
    po.timeout_ms = o.timeout_ms ? o.timeout_ms : 60000;
    po.debug_level = o.debug_level ? o.debug_level : "OFF";
    po.group_name = o.group_name;
    return po;
}

td_pg *pg_test_init(td_test_ctx *ctx, const pg_test_opts *opts)
{
    if (ctx->threaded)
        td_test_add_abort_hook(ctx, abort_hook, NULL);
    td_pg_options po = pg_test_options(ctx, opts);
    td_store *store = NULL;
    if ((!opts || !opts->init_url) && !is_mpi(ctx)) { /* an mpi group needs no store */
        store = pg_test_store(ctx);
        po.init_method = NULL;
        po.store = store;
    }
    td_pg *pg = NULL;
    TD_CHECK_OK(td_pg_create(&po, &pg));
    td_store_release(store); /* the group keeps its own reference */
    TD_CHECK_EQ(td_pg_rank(pg), ctx->rank);
    TD_CHECK_EQ(td_pg_size(pg), ctx->world_size);
    return pg;
}

const char *pg_test_url(td_test_ctx *ctx, const char *name)
{
    static __thread char url[1024];
    snprintf(url, sizeof url, "file://%s/%s", ctx->tmpdir, name);
    return url;
}

void pg_test_done(td_test_ctx *ctx, td_pg *pg)
{
    td_pg_destroy(pg);
    if (ctx->threaded)
        td_test_remove_abort_hook(ctx, abort_hook, NULL);
}

double pg_test_value(td_dtype dt, int rank, int64_t i)
{
    if (dt == TD_BOOL)
        return (double)((rank + i) % 2);
    return (double)(1 + (rank + i) % 3);
}

td_tensor *pg_test_tensor(td_dtype dt, int rank, int64_t n)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty(dt, TD_SHAPE(n), &t));
    if (dt == TD_FLOAT32) { /* the fast path for the large cases */
        float *p = td_tensor_data(t);
        for (int64_t i = 0; i < n; i++)
            p[i] = (float)pg_test_value(dt, rank, i);
        return t;
    }
    for (int64_t i = 0; i < n; i++) {
        if (td_dtype_is_complex(dt))
            TD_CHECK_OK(td_tensor_set_complex(t, &i, pg_test_value(dt, rank, i), (double)rank));
        else
            TD_CHECK_OK(td_tensor_set_f64(t, &i, pg_test_value(dt, rank, i)));
    }
    return t;
}

td_tensor *pg_test_strided(td_dtype dt, int rank, int64_t n)
{
    td_tensor *base = NULL, *view = NULL;
    TD_CHECK_OK(td_tensor_full(dt, TD_SHAPE(2 * n), 5.0, &base));
    int64_t stride = 2;
    TD_CHECK_OK(td_tensor_from_storage(td_tensor_storage(base), 0, dt, TD_SHAPE(n), &stride, &view));
    td_tensor_release(base);
    TD_CHECK(n <= 1 || !td_tensor_is_contiguous(view));
    for (int64_t i = 0; i < n; i++) {
        if (td_dtype_is_complex(dt))
            TD_CHECK_OK(td_tensor_set_complex(view, &i, pg_test_value(dt, rank, i), (double)rank));
        else
            TD_CHECK_OK(td_tensor_set_f64(view, &i, pg_test_value(dt, rank, i)));
    }
    return view;
}

double pg_test_expected(td_dtype dt, td_op op, int ws, int64_t i)
{
    double acc = pg_test_value(dt, 0, i);
    int64_t iacc = (int64_t)acc;
    bool any = acc != 0, all = acc != 0;
    int parity = acc != 0;
    for (int r = 1; r < ws; r++) {
        double v = pg_test_value(dt, r, i);
        int64_t iv = (int64_t)v;
        any = any || v != 0;
        all = all && v != 0;
        parity ^= v != 0;
        switch (op.kind) {
        case TD_SUM:
        case TD_AVG:
        case TD_PREMUL_SUM: acc += v; break;
        case TD_PRODUCT: acc *= v; break;
        case TD_MIN: acc = v < acc ? v : acc; break;
        case TD_MAX: acc = v > acc ? v : acc; break;
        case TD_BAND: iacc &= iv; break;
        case TD_BOR: iacc |= iv; break;
        case TD_BXOR: iacc ^= iv; break;
        default: break;
        }
    }
    if (dt == TD_BOOL) {
        switch (op.kind) {
        case TD_SUM:
        case TD_MAX:
        case TD_BOR: return any;
        case TD_BXOR: return parity;
        default: return all;
        }
    }
    switch (op.kind) {
    case TD_BAND:
    case TD_BOR:
    case TD_BXOR: return (double)iacc;
    case TD_AVG: return acc / ws;
    case TD_PREMUL_SUM: return acc * op.factor;
    default: return acc;
    }
}

double pg_test_get(const td_tensor *t, int64_t i)
{
    double v = 0, im = 0;
    if (td_dtype_is_complex(td_tensor_dtype(t)))
        TD_CHECK_OK(td_tensor_get_complex(t, &i, &v, &im));
    else
        TD_CHECK_OK(td_tensor_get_f64(t, &i, &v));
    return v;
}

double pg_test_get_imag(const td_tensor *t, int64_t i)
{
    double v = 0, im = 0;
    TD_CHECK_OK(td_tensor_get_complex(t, &i, &v, &im));
    return im;
}

static double tolerance(td_dtype dt, double expected)
{
    double mag = fabs(expected) > 1 ? fabs(expected) : 1;
    switch (dt) {
    case TD_FLOAT16: return 2e-3 * mag;
    case TD_BFLOAT16: return 2e-2 * mag;
    case TD_FLOAT32:
    case TD_COMPLEX64: return 1e-5 * mag;
    case TD_FLOAT64:
    case TD_COMPLEX128: return 1e-12 * mag;
    default: return 0;
    }
}

void pg_test_check_values(const td_tensor *t, double (*f)(void *arg, int64_t i), void *arg, const char *what)
{
    int64_t n = td_tensor_numel(t);
    td_dtype dt = td_tensor_dtype(t);
    for (int64_t i = 0; i < n; i++) {
        double want = f(arg, i), got = pg_test_get(t, i);
        if (!(fabs(got - want) <= tolerance(dt, want)))
            TD_FAIL("%s: element %lld of %s is %.9g, expected %.9g", what, (long long)i, td_dtype_name(dt), got, want);
    }
}
