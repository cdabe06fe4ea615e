/* Rendezvous (tdist/store.h): from an init URL to a store, a rank and a world size, as c10d's
 * rendezvous() and its env://, tcp:// and file:// handlers do, with their error messages word for
 * word ("Error initializing torch.distributed using env:// rendezvous: ..."), since users search
 * for them. Handlers live in a registry by scheme, so other schemes can be added. */
#include <ctype.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/env.h"
#include "base/error.h"
#include "base/launcher.h"
#include "net/addr.h"
#include "store/store_impl.h"

#define MAX_HANDLERS 32
#define RDZV_ERR "Error initializing torch.distributed using "

typedef struct handler_entry {
    char scheme[32];
    td_rendezvous_handler fn;
    void *arg;
} handler_entry;

static pthread_mutex_t g_mu = PTHREAD_MUTEX_INITIALIZER;
static handler_entry g_handlers[MAX_HANDLERS];
static size_t g_count;
static bool g_builtins;

/* ---- URL pieces ---------------------------------------------------------------------------------- */

/* The query part (after '?', before '#'), or NULL. */
static const char *query_of(const char *url)
{
    const char *q = strchr(url, '?');
    return q ? q + 1 : NULL;
}

bool td_rendezvous_url_param(const char *url, const char *name, char *out, size_t size)
{
    if (!url || !name)
        return false;
    const char *q = query_of(url);
    size_t nlen = strlen(name);
    while (q && *q && *q != '#') {
        const char *end = q + strcspn(q, "&#");
        const char *eq = memchr(q, '=', (size_t)(end - q));
        const char *kend = eq ? eq : end;
        if ((size_t)(kend - q) == nlen && memcmp(q, name, nlen) == 0) {
            if (out && size) {
                const char *v = eq ? eq + 1 : end;
                size_t vlen = (size_t)(end - v);
                if (vlen >= size)
                    vlen = size - 1;
                memcpy(out, v, vlen);
                out[vlen] = '\0';
            }
            return true;
        }
        q = *end == '&' ? end + 1 : NULL;
    }
    return false;
}

/* scheme://netloc/path?query: copies the netloc (host:port) or the path. */
static void url_netloc(const char *url, char *out, size_t size)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    size_t n = strcspn(p, "/?#");
    if (n >= size)
        n = size - 1;
    memcpy(out, p, n);
    out[n] = '\0';
}

static char *url_path_after_scheme(const char *url)
{
    const char *p = strstr(url, "://");
    p = p ? p + 3 : url;
    return alloc_strndup(p, strcspn(p, "?#"));
}

static td_status parse_int_param(const char *scheme, const char *what, const char *s, int64_t min, int64_t max,
                                 int *out)
{
    int64_t v;
    if (env_parse_int(what, s, min, max, &v) != TD_OK)
        return error_fmt(TD_ERR_INVALID, RDZV_ERR "%s:// rendezvous: %s must be an integer from %lld to %lld, got '%s'",
                        scheme, what, (long long)min, (long long)max, s);
    *out = (int)v;
    return TD_OK;
}

/* Without RANK / WORLD_SIZE, env:// takes what an MPI launcher or Slurm set (OMPI_COMM_WORLD_*,
 * PMI_*, SLURM_*: base/launcher.h), so that mpirun and srun start tdist jobs too. */
static td_status launcher_of(bool from_env, td_launcher_env *launcher)
{
    *launcher = (td_launcher_env){.rank = -1};
    if (from_env && (!env_get_str("RANK", NULL) || !env_get_str("WORLD_SIZE", NULL))) {
        td_status st = launcher_env_read(false, launcher);
        if (st == TD_ERR_INVALID)
            return error_prefix(st, RDZV_ERR "env:// rendezvous");
    }
    return TD_OK;
}

static td_status rank_of(const char *scheme, const char *url, bool from_env, const td_launcher_env *launcher,
                         int *rank)
{
    char buf[64], lbuf[32];
    const char *v;
    if (td_rendezvous_url_param(url, "rank", buf, sizeof buf))
        v = buf;
    else if (from_env && (v = env_get_str("RANK", NULL)))
        ;
    else if (launcher->rank >= 0) {
        snprintf(lbuf, sizeof lbuf, "%d", launcher->rank);
        v = lbuf;
    }
    else if (from_env)
        return error_fmt(TD_ERR_INVALID, RDZV_ERR "env:// rendezvous: environment variable RANK expected, but not set");
    else
        return error_fmt(TD_ERR_INVALID, RDZV_ERR "%s:// rendezvous: rank parameter missing", scheme);
    return parse_int_param(scheme, "rank", v, 0, INT32_MAX, rank);
}

/* rank and world_size from the query (or the environment), with c10d's words for a missing one. */
static td_status rank_and_world(const char *scheme, const char *url, bool from_env, int *rank, int *world)
{
    char buf[64], lbuf[32];
    const char *v;
    td_launcher_env launcher;
    TD_TRY(launcher_of(from_env, &launcher));
    TD_TRY(rank_of(scheme, url, from_env, &launcher, rank));
    if (td_rendezvous_url_param(url, "world_size", buf, sizeof buf))
        v = buf;
    else if (from_env && (v = env_get_str("WORLD_SIZE", NULL)))
        ;
    else if (launcher.rank >= 0) {
        snprintf(lbuf, sizeof lbuf, "%d", launcher.world_size);
        v = lbuf;
    }
    else if (from_env)
        return error_fmt(TD_ERR_INVALID,
                        RDZV_ERR "env:// rendezvous: environment variable WORLD_SIZE expected, but not set");
    else
        return error_fmt(TD_ERR_INVALID, RDZV_ERR "%s:// rendezvous: world size parameter missing", scheme);
    TD_TRY(parse_int_param(scheme, "world_size", v, 0, INT32_MAX, world));
    /* A rank outside the world would wait at the store until the timeout (30 minutes by default):
     * say so at once, naming where the numbers came from. */
    if (*world > 0 && *rank >= *world) {
        bool in_url = td_rendezvous_url_param(url, "rank", NULL, 0);
        return error_fmt(TD_ERR_INVALID,
                         RDZV_ERR "%s:// rendezvous: rank %d is out of range for world size %d (ranks are 0 to %d); "
                                  "check %s",
                         scheme, *rank, *world, *world - 1,
                         in_url ? "the URL's rank and world_size" : from_env ? "RANK and WORLD_SIZE" : "the launcher's ranks");
    }
    return TD_OK;
}

td_status store_rendezvous_rank(const char *url, int *rank)
{
    const char *sep = strstr(url, "://");
    char scheme[32] = "";
    if (sep && (size_t)(sep - url) < sizeof scheme)
        memcpy(scheme, url, (size_t)(sep - url));
    bool from_env = strcmp(scheme, "env") == 0;
    td_launcher_env launcher;
    TD_TRY(launcher_of(from_env, &launcher));
    return rank_of(scheme, url, from_env, &launcher, rank);
}

/* c10d's _create_c10d_store. */
static td_status create_c10d_store(const char *host, int port, int rank, int world, int64_t timeout_ms,
                                   td_store **store)
{
    if (port < 0 || port >= 65536)
        return error_fmt(TD_ERR_INVALID, "port must have value from 0 to 65535 but was %d.", port);
    td_tcp_store_options o = TD_TCP_STORE_OPTIONS_INIT;
    o.host = host;
    o.port = port;
    o.world_size = world > 0 ? world : -1; /* 0: no fixed size, nobody to wait for */
    o.wait_for_workers = world > 0;
    o.timeout_ms = timeout_ms;
    /* Under a launcher's agent (tdrun sets TDIST_USE_AGENT_STORE=1, torchrun's elastic agent
     * TORCHELASTIC_USE_AGENT_STORE=True) the agent hosts the store: every rank is a client, and
     * each restart attempt gets its own key space so that a restarted group never reads the keys
     * of the one before. */
    bool tdist_agent = false;
    TD_TRY(env_get_bool("TDIST_USE_AGENT_STORE", false, &tdist_agent));
    const char *torch_agent = env_get_str("TORCHELASTIC_USE_AGENT_STORE", NULL);
    if (tdist_agent || (torch_agent && strcmp(torch_agent, "True") == 0)) {
        const char *count_var = tdist_agent ? "TDIST_RESTART_COUNT" : "TORCHELASTIC_RESTART_COUNT";
        const char *attempt = env_get_str(count_var, NULL);
        if (!attempt)
            return error_fmt(TD_ERR_INVALID, RDZV_ERR "env:// rendezvous: environment variable %s expected, but not set",
                            count_var);
        o.is_master = false;
        td_store *tcp = NULL;
        TD_TRY(td_tcp_store_create(&o, &tcp));
        char prefix[128];
        snprintf(prefix, sizeof prefix, "/worker/attempt_%s", attempt);
        td_status s = td_prefix_store_create(prefix, tcp, store);
        td_store_release(tcp);
        return s;
    }
    o.is_master = rank == 0;
    o.multi_tenant = true;
    return td_tcp_store_create(&o, store);
}

static td_status env_handler(const char *url, int64_t timeout_ms, void *arg, td_store **store, int *rank, int *world)
{
    TD_TRY(rank_and_world("env", url, true, rank, world));
    const char *addr = env_get_str("MASTER_ADDR", NULL);
    if (!addr)
        return error_fmt(TD_ERR_INVALID,
                        RDZV_ERR "env:// rendezvous: environment variable MASTER_ADDR expected, but not set");
    const char *port_s = env_get_str("MASTER_PORT", NULL);
    if (!port_s)
        return error_fmt(TD_ERR_INVALID,
                        RDZV_ERR "env:// rendezvous: environment variable MASTER_PORT expected, but not set");
    int64_t port;
    if (env_parse_int("MASTER_PORT", port_s, INT32_MIN, INT32_MAX, &port) != TD_OK)
        return error_fmt(TD_ERR_INVALID, RDZV_ERR "env:// rendezvous: MASTER_PORT must be an integer, got '%s'", port_s);
    return create_c10d_store(addr, (int)port, *rank, *world, timeout_ms, store);
}

static td_status tcp_handler(const char *url, int64_t timeout_ms, void *arg, td_store **store, int *rank, int *world)
{
    char netloc[512];
    url_netloc(url, netloc, sizeof netloc);
    char *host = NULL;
    int port = -1;
    if (net_split_hostport(netloc, &host, &port) != TD_OK || port <= 0) {
        /* c10d tests `if not result.port`: a missing port and port 0 are both "missing". */
        free(host);
        return error_fmt(TD_ERR_INVALID, RDZV_ERR "tcp:// rendezvous: port number missing");
    }
    td_status s = rank_and_world("tcp", url, false, rank, world);
    if (s == TD_OK && !*host)
        s = error_fmt(TD_ERR_INVALID, RDZV_ERR "tcp:// rendezvous: host name missing");
    if (s == TD_OK)
        s = create_c10d_store(host, port, *rank, *world, timeout_ms, store);
    free(host);
    return s;
}

static td_status file_handler(const char *url, int64_t timeout_ms, void *arg, td_store **store, int *rank, int *world)
{
    char *path = url_path_after_scheme(url);
    td_status s = TD_OK;
    if (!*path)
        s = error_fmt(TD_ERR_INVALID, RDZV_ERR "file:// rendezvous: path missing");
    if (s == TD_OK)
        s = rank_and_world("file", url, false, rank, world);
    if (s == TD_OK)
        s = td_file_store_create(path, *world > 0 ? *world : -1, store);
    free(path);
    return s;
}

/* ---- registry ------------------------------------------------------------------------------------ */

static td_status register_locked(const char *scheme, td_rendezvous_handler fn, void *arg)
{
    for (size_t i = 0; i < g_count; i++)
        if (strcmp(g_handlers[i].scheme, scheme) == 0)
            return error_fmt(TD_ERR_ALREADY, "Rendezvous handler for %s:// already registered", scheme);
    if (g_count == MAX_HANDLERS)
        return error_fmt(TD_ERR_INVALID, "too many rendezvous handlers (at most %d)", MAX_HANDLERS);
    handler_entry *e = &g_handlers[g_count++];
    snprintf(e->scheme, sizeof e->scheme, "%s", scheme);
    e->fn = fn;
    e->arg = arg;
    return TD_OK;
}

static void ensure_builtins_locked(void)
{
    if (g_builtins)
        return;
    g_builtins = true;
    register_locked("env", env_handler, NULL);
    register_locked("tcp", tcp_handler, NULL);
    register_locked("file", file_handler, NULL);
}

td_status td_rendezvous_register(const char *scheme, td_rendezvous_handler handler, void *arg)
{
    if (!scheme || !*scheme || !handler)
        return error_fmt(TD_ERR_INVALID, "td_rendezvous_register: scheme and handler must be given");
    if (strlen(scheme) >= sizeof g_handlers[0].scheme)
        return error_fmt(TD_ERR_INVALID, "td_rendezvous_register: scheme '%s' is too long", scheme);
    for (const char *p = scheme; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '+' && *p != '-' && *p != '.')
            return error_fmt(TD_ERR_INVALID, "td_rendezvous_register: '%s' is not a URL scheme", scheme);
    pthread_mutex_lock(&g_mu);
    ensure_builtins_locked();
    td_status s = register_locked(scheme, handler, arg);
    pthread_mutex_unlock(&g_mu);
    return s;
}

td_status td_rendezvous(const char *url, int rank, int world_size, int64_t timeout_ms, td_store **store,
                        int *rank_out, int *world_size_out)
{
    if (!url || !store)
        return error_fmt(TD_ERR_INVALID, "td_rendezvous: url and store must not be NULL");
    *store = NULL;
    if (timeout_ms < 0)
        return error_fmt(TD_ERR_INVALID, "td_rendezvous: timeout must be >= 0 ms (0: none), got %lld",
                        (long long)timeout_ms);
    const char *sep = strstr(url, "://");
    char scheme[32] = "";
    if (sep && (size_t)(sep - url) < sizeof scheme && (size_t)(sep - url) == strcspn(url, ":/?#")) {
        memcpy(scheme, url, (size_t)(sep - url));
        scheme[sep - url] = '\0';
    }
    /* Append the node-specific arguments given here to the query. */
    td_buf full = TD_BUF_INIT;
    buf_append_str(&full, url);
    if (rank != -1 || world_size != -1) {
        if (td_rendezvous_url_param(url, "rank", NULL, 0) || td_rendezvous_url_param(url, "world_size", NULL, 0)) {
            buf_free(&full);
            return error_fmt(TD_ERR_INVALID, "The url: %s has node-specific arguments(rank, world_size) already.", url);
        }
        const char *frag = strchr(url, '#');
        if (frag)
            full.len = (size_t)(frag - url);
        if (!memchr(full.data, '?', full.len))
            buf_putc(&full, '?');
        else if (full.data[full.len - 1] != '?' && full.data[full.len - 1] != '&')
            buf_putc(&full, '&');
        if (rank != -1)
            buf_printf(&full, "rank=%d", rank);
        if (world_size != -1)
            buf_printf(&full, "%sworld_size=%d", rank != -1 ? "&" : "", world_size);
    }
    pthread_mutex_lock(&g_mu);
    ensure_builtins_locked();
    handler_entry h = {{0}, NULL, NULL};
    for (size_t i = 0; i < g_count; i++)
        if (strcmp(g_handlers[i].scheme, scheme) == 0)
            h = g_handlers[i];
    pthread_mutex_unlock(&g_mu);
    if (!h.fn) {
        buf_free(&full);
        return error_fmt(TD_ERR_INVALID, "No rendezvous handler for %s://", scheme);
    }
    int r = -1, w = -1;
    td_store *s = NULL;
    td_status st = h.fn(full.data, timeout_ms, h.arg, &s, &r, &w);
    buf_free(&full);
    if (st != TD_OK)
        return st;
    if (!s)
        return error_fmt(TD_ERR_INTERNAL, "rendezvous handler for %s:// returned no store", scheme);
    /* init_process_group gives the rendezvous store the group's timeout. */
    td_store_set_timeout(s, timeout_ms);
    *store = s;
    if (rank_out)
        *rank_out = r;
    if (world_size_out)
        *world_size_out = w;
    return TD_OK;
}
