/* Set-up shared by the RPC tests (rpc_util.h). */
#include "rpc_util.h"

#include <dirent.h>
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "rpc/agent_impl.h"

void rpc_test_register(const rpc_test_function *fns, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        td_status st = fns[i].async_fn ? td_rpc_register_async(fns[i].name, fns[i].async_fn, fns[i].arg)
                                       : td_rpc_register(fns[i].name, fns[i].fn, fns[i].arg);
        TD_CHECK_MSG(st == TD_OK || st == TD_ERR_ALREADY, "registering %s: %s", fns[i].name, td_last_error());
    }
}

td_rpc_options rpc_test_options(const td_test_ctx *ctx)
{
    td_rpc_options o;
    td_rpc_options_init(&o);
    o.init_method = ctx->init_url;
    o.ignore_rref_leak = false;
    return o;
}

void rpc_test_init(const td_test_ctx *ctx, const td_rpc_options *o)
{
    td_rpc_options defaults = rpc_test_options(ctx);
    char name[32];
    snprintf(name, sizeof name, "worker%d", ctx->rank);
    TD_CHECK_OK(td_rpc_init(name, ctx->rank, ctx->world_size, o ? o : &defaults));
}

td_status rpc_test_add_ints(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[2];
    td_status st = td_rpc_bind("add_ints", "a,b", args, kwargs, p);
    if (st == TD_OK)
        *result = td_value_int(td_value_get_int(p[0]) + td_value_get_int(p[1]));
    return st;
}

td_status rpc_test_echo(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    const td_value *p[1];
    td_status st = td_rpc_bind("echo", "x", args, kwargs, p);
    if (st == TD_OK)
        *result = td_value_retain((td_value *)p[0]);
    return st;
}

td_status rpc_test_callee_id(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)args;
    (void)kwargs;
    td_worker_info me;
    td_status st = td_rpc_worker_info(td_rpc_call_agent(call), NULL, &me);
    if (st == TD_OK)
        *result = td_value_int(me.id);
    return st;
}

td_status rpc_test_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs, td_value **result)
{
    (void)call;
    (void)kwargs;
    (void)result;
    const char *type = td_value_len(args) > 0 ? td_value_get_string(td_value_at(args, 0), NULL) : "ValueError";
    const char *msg = td_value_len(args) > 1 ? td_value_get_string(td_value_at(args, 1), NULL) : "Expected error";
    return td_rpc_raise(type, "%s", msg);
}

td_future *rpc_test_async_raise(td_rpc_call *call, const td_value *args, const td_value *kwargs)
{
    (void)call;
    (void)args;
    (void)kwargs;
    td_rpc_raise("RuntimeError", "Expected error");
    return NULL;
}

/* ---- RRef helpers ------------------------------------------------------------------------------ */

td_rpc_agent *rpc_test_default_agent(void)
{
    td_rpc_agent *a = NULL;
    TD_CHECK_OK(rpc_agent_get(NULL, &a));
    rpc_agent_release(a); /* the default agent keeps its own reference until td_rpc_shutdown */
    return a;
}

static bool debug_read(const char *key, int64_t *out, char *text, size_t text_size)
{
    td_value *info = NULL;
    TD_CHECK_OK(td_rpc_debug_info(NULL, &info));
    const td_value *v = td_value_dict_get_str(info, key);
    TD_CHECK_MSG(v != NULL, "td_rpc_debug_info has no key %s", key);
    TD_CHECK_MSG(td_value_kind_of(v) == TD_VAL_STRING, "debug info %s is not a string", key);
    const char *s = td_value_get_string(v, NULL);
    snprintf(text, text_size, "%s", s);
    char *end = NULL;
    errno = 0;
    long long n = strtoll(s, &end, 10);
    bool ok = *s != '\0' && end && *end == '\0' && errno == 0;
    td_value_release(info);
    *out = n;
    return ok;
}

int64_t rpc_test_debug_int(const char *key)
{
    int64_t n = 0;
    char text[64];
    TD_CHECK_MSG(debug_read(key, &n, text, sizeof text), "debug info %s is not a number: '%s'", key, text);
    return n;
}

void rpc_test_sleep_ms(int64_t ms)
{
    struct timespec ts = {(time_t)(ms / 1000), (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
    }
}

double rpc_test_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

void rpc_test_die_noting_time(const char *path)
{
    FILE *fp = fopen(path, "w");
    if (fp) {
        fprintf(fp, "%.6f\n", rpc_test_now_s());
        fclose(fp);
    }
    raise(SIGKILL);
}

int64_t rpc_test_ms_since_death(const char *path)
{
    double now = rpc_test_now_s(), died = 0;
    FILE *fp = fopen(path, "r");
    TD_CHECK_MSG(fp != NULL, "no time of death in %s", path);
    TD_CHECK(fscanf(fp, "%lf", &died) == 1);
    fclose(fp);
    return (int64_t)((now - died) * 1000);
}

void rpc_test_wait_debug(const char *key, int64_t want, int64_t timeout_ms)
{
    int64_t got = 0;
    for (int64_t waited = 0;; waited += 100) {
        got = rpc_test_debug_int(key);
        if (got == want)
            return;
        if (waited >= timeout_ms)
            break;
        rpc_test_sleep_ms(100);
    }
    TD_FAIL("debug info %s is %lld, expected %lld after %lld ms", key, (long long)got, (long long)want,
            (long long)timeout_ms);
}

void rpc_test_wait_rrefs_flushed(void)
{
    int64_t futures = 0, users = 0;
    for (int waited = 0; waited <= 20000; waited += 100) {
        futures = rpc_test_debug_int("num_pending_futures");
        users = rpc_test_debug_int("num_pending_users");
        if (futures == 0 && users == 0)
            return;
        rpc_test_sleep_ms(100);
    }
    TD_FAIL("RRef counters not flushed after 20 s: num_pending_futures %lld, num_pending_users %lld",
            (long long)futures, (long long)users);
}

void rpc_test_wait_owners_and_forks(int64_t owners, int64_t forks)
{
    int64_t got_owners = 0, got_forks = 0;
    for (int waited = 0; waited <= 20000; waited += 100) {
        got_owners = rpc_test_debug_int("num_owner_rrefs");
        got_forks = rpc_test_debug_int("num_forks");
        if (got_owners == owners && got_forks == forks)
            return;
        rpc_test_sleep_ms(100);
    }
    TD_FAIL("Timed out waiting for %lld owners and %lld forks on this worker, got %lld owners and %lld forks",
            (long long)owners, (long long)forks, (long long)got_owners, (long long)got_forks);
}

int rpc_test_open_fds(void)
{
    int n = 0;
    DIR *d = opendir("/proc/self/fd");
    if (!d)
        return -1;
    while (readdir(d))
        n++;
    closedir(d);
    return n;
}

td_tensor *rpc_test_pattern(int64_t n, int seed)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_empty(TD_UINT8, TD_SHAPE(n), &t));
    uint8_t *d = td_tensor_data(t);
    for (int64_t i = 0; i < n; i++)
        d[i] = (uint8_t)((seed + i * 7) % 251);
    return t;
}
