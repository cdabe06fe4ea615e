/* Backends by name (td_register_backend, td_backend_available) and the capability queries.
 *
 * The built-in backends (src/backends/builtin.h) are added the first time the registry is used;
 * applications add theirs with td_register_backend. The table is small and append-only, so a
 * lookup takes the lock only to read it. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include <tdist/backend.h>

#include "backends/builtin.h"
#include "base/buf.h"
#include "base/error.h"
#include "pg/pg_impl.h"

#define MAX_BACKENDS 64

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static const td_backend_ops *g_backends[MAX_BACKENDS];
static int g_count;
static bool g_builtins_added;

static const char *const kind_names[TD_COLL_KIND_COUNT] = {
    "broadcast", "all_reduce", "reduce", "all_gather", "gather", "scatter",
    "reduce_scatter", "all_to_all", "barrier", "send", "recv",
};

const char *td_coll_kind_name(td_coll_kind kind)
{
    return (int)kind >= 0 && kind < TD_COLL_KIND_COUNT ? kind_names[kind] : "unknown";
}

static const td_backend_ops *find_locked(const char *name)
{
    for (int i = 0; i < g_count; i++)
        if (strcasecmp(g_backends[i]->name, name) == 0)
            return g_backends[i];
    return NULL;
}

static void add_builtins_locked(void)
{
    if (g_builtins_added)
        return;
    g_builtins_added = true;
    const td_backend_ops *builtins[] = {&td_backend_tcp_ops, &td_backend_threaded_ops, &td_backend_shm_ops,
                                        &td_backend_auto_ops,
#if TDIST_HAVE_MPI
                                        &td_backend_mpi_ops,
#endif
    };
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (builtins[i] && !find_locked(builtins[i]->name))
            g_backends[g_count++] = builtins[i];
}

td_status td_register_backend(const td_backend_ops *ops)
{
    if (!ops || !ops->name || !ops->name[0] || !ops->create || !ops->submit || !ops->destroy)
        return td_error(TD_ERR_INVALID, "td_register_backend: a backend needs a name and create, submit "
                                        "and destroy functions");
    pthread_mutex_lock(&g_mu);
    add_builtins_locked();
    td_status st = TD_OK;
    if (find_locked(ops->name))
        st = td_error(TD_ERR_ALREADY, "Backend %s already registered", ops->name);
    else if (g_count == MAX_BACKENDS)
        st = td_error(TD_ERR_INVALID, "td_register_backend: too many backends (at most %d)", MAX_BACKENDS);
    else
        g_backends[g_count++] = ops;
    pthread_mutex_unlock(&g_mu);
    return st;
}

const td_backend_ops *pg_find_backend(const char *name)
{
    if (!name)
        return NULL;
    pthread_mutex_lock(&g_mu);
    add_builtins_locked();
    const td_backend_ops *ops = find_locked(name);
    pthread_mutex_unlock(&g_mu);
    return ops;
}

char *pg_backend_names(void)
{
    td_buf b = TD_BUF_INIT;
    pthread_mutex_lock(&g_mu);
    add_builtins_locked();
    for (int i = 0; i < g_count; i++)
        td_buf_printf(&b, "%s%s", i ? ", " : "", g_backends[i]->name);
    pthread_mutex_unlock(&g_mu);
    return td_buf_steal(&b);
}

bool td_backend_available(const char *name) { return pg_find_backend(name) != NULL; }

/* c10d's supports_complex(): the ops that are not defined on complex numbers. */
static bool complex_denied(td_reduce_op op)
{
    return op == TD_MAX || op == TD_MIN || op == TD_PRODUCT || op == TD_BAND || op == TD_BOR || op == TD_BXOR;
}

td_status pg_check_reduce(const char *opname, td_op op, td_dtype dtype)
{
    if ((int)op.kind < 0 || op.kind >= TD_REDUCE_OP_COUNT)
        return td_error(TD_ERR_INVALID, "%s: invalid reduce op %d", opname, (int)op.kind);
    if (!td_dtype_is_valid((int)dtype))
        return td_error(TD_ERR_INVALID, "%s: invalid dtype %d", opname, (int)dtype);
    if (td_dtype_is_complex(dtype) && complex_denied(op.kind))
        return td_error(TD_ERR_INVALID, "%s does not support %s on complex tensors", opname,
                        td_reduce_op_name(op.kind));
    td_status st = td_reduce_check(op.kind, dtype);
    if (st != TD_OK)
        return td_error_prefix(st, "%s", opname);
    return TD_OK;
}

_Static_assert(TD_REDUCE_OP_COUNT <= 32, "td_pg.supported holds one bit per reduce op");

td_status pg_check_supported_first(td_pg *pg, const char *opname, td_coll_kind kind, td_dtype dtype, td_op op)
{
    td_reduce_op rk = pg_reducing(kind) ? op.kind : TD_SUM;
    _Atomic uint32_t *seen = pg_supported_bits(pg, kind, dtype, rk); /* its bit is not set yet */
    if (pg_reducing(kind))
        TD_TRY(pg_check_reduce(opname, op, dtype));
    if (pg->ops->supports) {
        td_status st = pg->ops->supports(pg->state, kind, dtype, rk);
        if (st != TD_OK)
            return td_error_prefix(st, "%s", opname);
    }
    if (seen)
        atomic_fetch_or_explicit(seen, 1u << rk, memory_order_relaxed);
    return TD_OK;
}

/* The API names td_pg_supports accepts, with the backend kind each one runs as. */
static const struct {
    const char *name;
    td_coll_kind kind;
} api_kinds[] = {
    {"broadcast", TD_COLL_BROADCAST},
    {"all_reduce", TD_COLL_ALL_REDUCE},
    {"all_reduce_coalesced", TD_COLL_ALL_REDUCE},
    {"reduce", TD_COLL_REDUCE},
    {"all_gather", TD_COLL_ALL_GATHER},
    {"all_gather_into_tensor", TD_COLL_ALL_GATHER},
    {"all_gather_coalesced", TD_COLL_ALL_GATHER},
    {"all_gather_object", TD_COLL_ALL_GATHER},
    {"gather", TD_COLL_GATHER},
    {"gather_object", TD_COLL_GATHER},
    {"scatter", TD_COLL_SCATTER},
    {"scatter_object_list", TD_COLL_SCATTER},
    {"broadcast_object_list", TD_COLL_BROADCAST},
    {"reduce_scatter", TD_COLL_REDUCE_SCATTER},
    {"reduce_scatter_tensor", TD_COLL_REDUCE_SCATTER},
    {"all_to_all", TD_COLL_ALL_TO_ALL},
    {"all_to_all_single", TD_COLL_ALL_TO_ALL},
    {"barrier", TD_COLL_BARRIER},
    {"monitored_barrier", TD_COLL_BARRIER},
    {"send", TD_COLL_SEND},
    {"isend", TD_COLL_SEND},
    {"recv", TD_COLL_RECV},
    {"irecv", TD_COLL_RECV},
};

td_status td_pg_supports(const td_pg *cpg, const char *collective, td_dtype dtype, td_reduce_op op)
{
    td_pg *pg;
    TD_TRY(pg_resolve((td_pg *)cpg, "supports", &pg));
    if (!collective)
        return td_error(TD_ERR_INVALID, "td_pg_supports: collective name is NULL");
    for (size_t i = 0; i < sizeof api_kinds / sizeof api_kinds[0]; i++) {
        if (strcmp(api_kinds[i].name, collective) != 0)
            continue;
        td_status st = pg_check_supported(pg, collective, api_kinds[i].kind, dtype, td_op_of(op));
        return st == TD_ERR_INVALID ? TD_ERR_UNSUPPORTED : st;
    }
    return td_error(TD_ERR_INVALID, "td_pg_supports: unknown collective '%s'", collective);
}
