/* Interprocess device events (spec/multiprocessing.md section M) between spawned processes, on sim
 * and cuda: the seed's test_event_handle_importer and test_event_handle_exporter and upstream's
 * test_event_multiprocess. The "_sleep(50M)" of the seed is a longer spin here (spec M.5:
 * TDIST_TEST_SPIN_CYCLES, 500M cycles by default: 0.5 s on sim, about 0.25 s on a 2 GHz GPU), so
 * "query is False" cannot flake on a slow reply from the other process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/mp.h>

#include "base/error.h"
#include "device_util.h"

#define E_CHECK(cond)                                                                                 \
    do {                                                                                              \
        if (!(cond))                                                                                  \
            return error_fmt(TD_ERR_INTERNAL, "%s:%d: check failed: %s", __FILE__, __LINE__, #cond);   \
    } while (0)
#define E_OK(expr)                                                                                    \
    do {                                                                                              \
        td_status e_s_ = (expr);                                                                      \
        if (e_s_ != TD_OK)                                                                            \
            return error_prefix(e_s_, "%s:%d: %s", __FILE__, __LINE__, #expr);                     \
    } while (0)

#define QUEUE_WAIT_MS 60000

static int64_t spin_cycles(void)
{
    const char *env = getenv("TDIST_TEST_SPIN_CYCLES");
    long long v = env ? atoll(env) : 0;
    return v > 0 ? (int64_t)v : 500000000;
}

/* A spin on the current stream; cuda builds without kernels skip. */
static void spin_or_skip(td_stream *s)
{
    td_status st = td_stream_sleep(s, spin_cycles());
    if (st == TD_ERR_UNSUPPORTED)
        TD_SKIP(TD_SKIP_GENERIC, td_last_error());
    TD_CHECK_OK(st);
}

static td_value *handle_value(const td_event_ipc_handle *h) { return td_value_bytes(h->bytes, sizeof h->bytes); }

static td_status value_handle(const td_value *v, td_event_ipc_handle *h)
{
    size_t len = 0;
    const void *bytes = td_value_get_bytes(v, &len);
    E_CHECK(bytes && len == sizeof h->bytes);
    memcpy(h->bytes, bytes, len);
    return TD_OK;
}

static td_status put_int(td_mp_queue *q, int64_t i)
{
    td_value *v = td_value_int(i);
    td_status st = td_mp_queue_put(q, v, QUEUE_WAIT_MS);
    td_value_release(v);
    return st;
}

static td_status get_any(td_mp_queue *q)
{
    td_value *v = NULL;
    td_status st = td_mp_queue_get(q, QUEUE_WAIT_MS, &v);
    td_value_release(v);
    return st;
}

/* ---- the consumer side (spawned children) --------------------------------------------------- */

/* args: (handle bytes, p2c, c2p, wait for a last message before destroying the event). */
TD_MP_ENTRY(event_importer_consumer)
{
    (void)rank;
    (void)result;
    td_event_ipc_handle h;
    E_OK(value_handle(td_value_at(args, 0), &h));
    td_mp_queue *p2c = td_mp_value_queue(td_value_at(args, 1)), *c2p = td_mp_value_queue(td_value_at(args, 2));
    bool final_wait = td_value_get_bool(td_value_at(args, 3));
    td_device d0 = {td_device_default_type(), 0};
    td_event *e1 = NULL;
    E_OK(td_event_from_ipc_handle(d0, &h, &e1));
    E_OK(put_int(c2p, 0)); /* ready */
    E_OK(get_any(p2c));    /* the parent recorded */
    E_OK(td_event_synchronize(e1));
    E_CHECK(td_event_query(e1));
    E_OK(put_int(c2p, 1)); /* synchronized */
    if (final_wait)
        E_OK(get_any(p2c)); /* the parent is done querying */
    td_event_release(e1);
    return TD_OK;
}

/* args: (handle bytes, p2c, c2p, spin cycles). On its own stream: import on the current device,
 * spin, record. */
TD_MP_ENTRY(event_exporter_consumer)
{
    (void)rank;
    (void)result;
    td_event_ipc_handle h;
    E_OK(value_handle(td_value_at(args, 0), &h));
    td_mp_queue *p2c = td_mp_value_queue(td_value_at(args, 1)), *c2p = td_mp_value_queue(td_value_at(args, 2));
    int64_t cycles = td_value_get_int(td_value_at(args, 3));
    td_device current = {td_device_default_type(), -1};
    td_stream *stream = NULL;
    E_OK(td_stream_create(current, 0, &stream));
    td_stream_guard guard;
    E_OK(td_stream_guard_enter(&guard, stream));
    td_event *e1 = NULL;
    td_status st = td_event_from_ipc_handle(current, &h, &e1);
    if (st == TD_OK)
        st = td_stream_sleep(NULL, cycles);
    if (st == TD_OK)
        st = td_event_record(e1, NULL);
    if (st == TD_OK)
        st = put_int(c2p, 0);
    if (st == TD_OK)
        st = get_any(p2c); /* the parent synchronized: e1 may go */
    td_event_release(e1);
    td_stream_guard_exit(&guard);
    td_stream_release(stream);
    return st;
}

/* ---- parents -------------------------------------------------------------------------------- */

typedef struct event_pair {
    td_mp_queue *p2c, *c2p;
    td_mp_context *proc;
    td_value *args;
} event_pair;

static void start_consumer(event_pair *p, const char *entry, const td_event_ipc_handle *h, td_value *extra)
{
    TD_CHECK_OK(td_mp_queue_new(0, &p->p2c));
    TD_CHECK_OK(td_mp_queue_new(0, &p->c2p));
    p->args = td_value_tuple_of(4, handle_value(h), td_mp_queue_value(p->p2c), td_mp_queue_value(p->c2p), extra);
    td_mp_spawn_opts o = {.entry = entry, .args = p->args, .method = TD_MP_SPAWN};
    TD_CHECK_OK(td_mp_spawn(&o, &p->proc));
}

static void finish_consumer(event_pair *p)
{
    TD_CHECK_OK(td_mp_join(p->proc, 120000));
    td_mp_context_release(p->proc);
    td_value_release(p->args);
    td_mp_queue_release(p->p2c);
    td_mp_queue_release(p->c2p);
}

/* The parent side of test_event_multiprocess and test_event_handle_importer: the child imports
 * the handle and waits for the parent's record behind a long spin. */
static void importer_parent(td_test_ctx *ctx, bool final_wait)
{
    dev_setup(ctx, 1);
    td_event *e0 = NULL;
    TD_CHECK_OK(td_event_create(TD_EVENT_INTERPROCESS, &e0));
    TD_CHECK(td_event_query(e0)); /* True before any record */
    td_event_ipc_handle h;
    TD_CHECK_OK(td_event_ipc_handle_get(e0, &h));
    event_pair p;
    start_consumer(&p, "event_importer_consumer", &h, td_value_bool(final_wait));
    TD_CHECK_OK(get_any(p.c2p)); /* the child is ready */
    spin_or_skip(NULL);
    TD_CHECK_OK(td_event_record(e0, NULL));
    TD_CHECK_OK(put_int(p.p2c, 0));
    TD_CHECK(!td_event_query(e0));
    TD_CHECK_OK(get_any(p.c2p)); /* the child synchronized on it */
    TD_CHECK(td_event_query(e0));
    if (final_wait)
        TD_CHECK_OK(put_int(p.p2c, 1));
    finish_consumer(&p);
    td_event_release(e0);
    dev_teardown();
}

/* Upstream's test_event_multiprocess: query before record, the child synchronizes on the parent's
 * record. (The event travels as its handle bytes: td_event is not an mp object.) */
TD_TEST(test_event_multiprocess, DEV_CASE) { importer_parent(ctx, false); }

TD_TEST(test_event_handle_importer, DEV_CASE) { importer_parent(ctx, true); }

/* The child's record on the imported event is visible to the exporter, whose event was never
 * recorded in this process. */
TD_TEST(test_event_handle_exporter, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_event *e0 = NULL;
    TD_CHECK_OK(td_event_create(TD_EVENT_INTERPROCESS, &e0));
    td_event_ipc_handle h;
    TD_CHECK_OK(td_event_ipc_handle_get(e0, &h)); /* unrecorded: created on the current device */
    /* A spin of this build's device must work before the child relies on it. */
    spin_or_skip(NULL);
    TD_CHECK_OK(td_device_synchronize(dev(0)));
    event_pair p;
    start_consumer(&p, "event_exporter_consumer", &h, td_value_int(spin_cycles()));
    TD_CHECK_OK(get_any(p.c2p)); /* the child recorded behind its spin */
    TD_CHECK(!td_event_query(e0));
    TD_CHECK_OK(td_event_synchronize(e0));
    TD_CHECK(td_event_query(e0));
    TD_CHECK_OK(put_int(p.p2c, 0));
    finish_consumer(&p);
    td_event_release(e0);
    dev_teardown();
}

/* Handles checked: a destroyed event's handle and garbage bytes are refused, not crashed on; a
 * stream of this process waits for the interprocess event. */
TD_TEST(test_event_handle_stale, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    td_event *e0 = NULL, *same = NULL;
    TD_CHECK_OK(td_event_create(TD_EVENT_INTERPROCESS, &e0));
    td_event_ipc_handle h;
    TD_CHECK_OK(td_event_ipc_handle_get(e0, &h));
    td_stream *s = NULL;
    TD_CHECK_OK(td_stream_create(dev(0), 0, &s));
    spin_or_skip(NULL);
    TD_CHECK_OK(td_event_record(e0, NULL));
    TD_CHECK_OK(td_stream_wait_event(s, e0));
    TD_CHECK(!td_stream_query(s) || td_event_query(e0));
    TD_CHECK_OK(td_stream_synchronize(s));
    TD_CHECK(td_event_query(e0));
    td_stream_release(s);
    if (type == TD_DEVICE_SIM) {
        /* sim opens its own handles (CUDA refuses a handle of this process). */
        TD_CHECK_OK(td_event_from_ipc_handle(dev(0), &h, &same));
        TD_CHECK(td_event_query(same));
        td_event_release(same);
        td_event_release(e0);
        e0 = NULL;
        TD_CHECK_ERR(td_event_from_ipc_handle(dev(0), &h, &same), TD_ERR_INVALID, "");
        td_event_ipc_handle garbage;
        memset(&garbage, 0x5a, sizeof garbage);
        TD_CHECK_ERR(td_event_from_ipc_handle(dev(0), &garbage, &same), TD_ERR_INVALID, "invalid interprocess event handle");
    }
    td_event_release(e0);
    dev_teardown();
}

int main(int argc, char **argv)
{
    TD_MP_MAIN_PROLOGUE(argc, argv); /* spawned children run their entry point here */
    return td_test_main(argc, argv);
}
