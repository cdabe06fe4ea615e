/* Backends by name (td_register_backend, td_backend_available) and the support checks every call
 * makes. A leaf of src/pg: it calls nothing of the other files.
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
    const td_backend_ops *builtins[] = {&backend_tcp_ops, &backend_threaded_ops, &backend_shm_ops,
                                        &backend_auto_ops,
#if TDIST_HAVE_MPI
                                        &backend_mpi_ops,
#endif
    };
    for (size_t i = 0; i < sizeof builtins / sizeof builtins[0]; i++)
        if (builtins[i] && !find_locked(builtins[i]->name))
            g_backends[g_count++] = builtins[i];
}

td_status td_register_backend(const td_backend_ops *ops)
{
    if (!ops || !ops->name || !ops->name[0] || !ops->create || !ops->submit || !ops->destroy)
        return error_fmt(TD_ERR_INVALID, "td_register_backend: a backend needs a name and create, submit "
                                        "and destroy functions");
    pthread_mutex_lock(&g_mu);
    add_builtins_locked();
    td_status st = TD_OK;
    if (find_locked(ops->name))
        st = error_fmt(TD_ERR_ALREADY, "Backend %s already registered", ops->name);
    else if (g_count == MAX_BACKENDS)
        st = error_fmt(TD_ERR_INVALID, "td_register_backend: too many backends (at most %d)", MAX_BACKENDS);
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
        buf_printf(&b, "%s%s", i ? ", " : "", g_backends[i]->name);
    pthread_mutex_unlock(&g_mu);
    return buf_steal(&b);
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
        return error_fmt(TD_ERR_INVALID, "%s: invalid reduce op %d", opname, (int)op.kind);
    if (!td_dtype_is_valid((int)dtype))
        return error_fmt(TD_ERR_INVALID, "%s: invalid dtype %d", opname, (int)dtype);
    if (td_dtype_is_complex(dtype) && complex_denied(op.kind))
        return error_fmt(TD_ERR_INVALID, "%s does not support %s on complex tensors", opname,
                        td_reduce_op_name(op.kind));
    td_status st = td_reduce_check(op.kind, dtype);
    if (st != TD_OK)
        return error_prefix(st, "%s", opname);
    return TD_OK;
}

_Static_assert(TD_REDUCE_OP_COUNT <= 32, "td_pg.supported holds one bit per reduce op");

td_status pg_check_supported_first(td_pg *pg, const char *opname, td_coll_kind kind, td_dtype dtype, td_op op)
{
    td_reduce_op rk = td_coll_kind_reduces(kind) ? op.kind : TD_SUM;
    _Atomic uint32_t *seen = pg_supported_bits(pg, kind, dtype, rk); /* its bit is not set yet */
    if (td_coll_kind_reduces(kind))
        TD_TRY(pg_check_reduce(opname, op, dtype));
    if (pg->ops->supports) {
        /* The backend sees AVG and PREMUL_SUM as the SUM the front end resolves them into. */
        td_reduce_op backend_rk = rk == TD_AVG || rk == TD_PREMUL_SUM ? TD_SUM : rk;
        td_status st = pg->ops->supports(pg->state, kind, dtype, backend_rk);
        if (st != TD_OK)
            return error_prefix(st, "%s", opname);
    }
    if (seen)
        atomic_fetch_or_explicit(seen, 1u << rk, memory_order_relaxed);
    return TD_OK;
}
