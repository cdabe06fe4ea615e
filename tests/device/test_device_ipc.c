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

#define QUEUE_WAIT_MS 30000

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
        /* The record's stream item holds the event until that stream has moved past it. */
        TD_CHECK_OK(td_device_synchronize(dev(0)));
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

/* ---- device tensors through queues (spec L) ------------------------------------------------ */

static const char resend_message[] = "Attempted to send CUDA tensor received from another process; this is not "
                                     "currently supported. Consider cloning before sending.";

/* simple_fill: the same storage twice arrives as one; the consumer writes the producer's memory;
 * a received tensor cannot be sent on. args: (q, done event, other queue). */
TD_MP_ENTRY(device_simple_fill)
{
    (void)rank;
    (void)result;
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0)), *other = td_mp_value_queue(td_value_at(args, 2));
    td_mp_event *done = td_mp_value_event(td_value_at(args, 1));
    td_value *a = NULL, *b = NULL;
    E_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &a));
    E_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &b));
    td_tensor *x = td_value_get_tensor(a), *y = td_value_get_tensor(b);
    E_CHECK(td_tensor_storage(x) == td_tensor_storage(y));
    E_CHECK(td_tensor_device(x).type == td_device_default_type());
    E_CHECK(td_tensor_is_shared(x));
    td_status st = td_mp_queue_put(other, a, QUEUE_WAIT_MS);
    if (st != TD_ERR_UNSUPPORTED || !strstr(td_last_error(), resend_message))
        return error_fmt(TD_ERR_INTERNAL, "re-sending a received tensor: %s (status %d)", td_last_error(), (int)st);
    E_OK(td_tensor_fill(x, 4));
    td_stream *s = NULL;
    E_OK(td_stream_current(td_tensor_device(x), &s));
    E_OK(td_stream_synchronize(s));
    td_value_release(a);
    td_value_release(b);
    td_mp_event_set(done);
    return TD_OK;
}

TD_TEST(test_cuda_simple, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *x = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(5, 5), 0, &x));
    td_mp_queue *q = NULL, *other = NULL;
    td_mp_event *done = NULL;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_queue_new(0, &other));
    TD_CHECK_OK(td_mp_event_new(&done));
    td_value *args = td_value_tuple_of(3, td_mp_queue_value(q), td_mp_event_value(done), td_mp_queue_value(other));
    td_mp_spawn_opts o = {.entry = "device_simple_fill", .args = args, .method = TD_MP_SPAWN};
    td_mp_context *pctx = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pctx));
    td_value *v = td_value_tensor(x);
    TD_CHECK_OK(td_mp_queue_put(q, v, QUEUE_WAIT_MS));
    TD_CHECK_OK(td_mp_queue_put(q, v, QUEUE_WAIT_MS));
    td_value_release(v);
    if (td_mp_event_wait(done, QUEUE_WAIT_MS) != TD_OK)
        TD_CHECK_OK(td_mp_join(pctx, 1000)); /* the child's error, if it failed */
    TD_CHECK_EQ(dev_get(x, 0), 4.0);
    TD_CHECK_EQ(dev_get(x, 24), 4.0);
    TD_CHECK_OK(td_mp_join(pctx, 120000));
    td_mp_context_release(pctx);
    td_value_release(args);
    td_mp_queue_release(q);
    td_mp_queue_release(other);
    td_mp_event_release(done);
    td_tensor_release(x);
    TD_CHECK_EQ(td_mp_ipc_collect(), 0);
    dev_teardown();
}

/* send_and_delete_tensors: five int32 [5] tensors full(i), each released right after its put. */
TD_MP_ENTRY(send_and_delete_tensors)
{
    (void)rank;
    (void)result;
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 1));
    td_device d = {td_device_default_type(), 0};
    for (int i = 0; i < 5; i++) {
        td_tensor *t = NULL;
        E_OK(td_tensor_full_on(d, TD_INT32, TD_SHAPE(5), i, &t));
        td_value *v = td_value_tensor(t);
        td_tensor_release(t);
        td_status st = td_mp_queue_put(q, v, QUEUE_WAIT_MS);
        td_value_release(v); /* del t: the block goes to limbo, not back to the allocator */
        E_OK(st);
    }
    E_CHECK(td_mp_ipc_collect() == 5);
    E_OK(td_mp_event_wait(e, QUEUE_WAIT_MS));
    E_CHECK(td_mp_ipc_collect() == 0); /* the consumer released them all */
    return TD_OK;
}

TD_TEST(test_cuda_memory_allocation, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_mp_queue *q = NULL;
    td_mp_event *e = NULL;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&e));
    td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(e));
    td_mp_spawn_opts o = {.entry = "send_and_delete_tensors", .args = args, .method = TD_MP_SPAWN};
    td_mp_context *pctx = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pctx));
    td_value *got[5];
    for (int i = 0; i < 5; i++)
        TD_CHECK_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &got[i]));
    for (int i = 0; i < 5; i++) {
        td_tensor *t = td_value_get_tensor(got[i]);
        TD_CHECK_EQ(td_tensor_dtype(t), TD_INT32);
        for (int64_t k = 0; k < 5; k++)
            TD_CHECK_EQ(dev_get(t, k), (double)i);
    }
    for (int i = 0; i < 5; i++)
        td_value_release(got[i]);
    td_mp_event_set(e);
    TD_CHECK_OK(td_mp_join(pctx, 120000));
    td_mp_context_release(pctx);
    td_value_release(args);
    td_mp_queue_release(q);
    td_mp_event_release(e);
    dev_teardown();
}

/* Ten rounds of a float32 2x2 ones and a uint8 2x2 zeros, likely in one allocator block: the
 * consumer opens the block's handle once and builds both at their offsets. */
TD_MP_ENTRY(mixed_types_producer)
{
    (void)rank;
    (void)result;
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 1));
    td_device d = {td_device_default_type(), 0};
    for (int round = 0; round < 10; round++) {
        td_tensor *f = NULL, *u = NULL;
        E_OK(td_tensor_full_on(d, TD_FLOAT32, TD_SHAPE(2, 2), 1, &f));
        E_OK(td_tensor_full_on(d, TD_UINT8, TD_SHAPE(2, 2), 0, &u));
        td_value *vf = td_value_tensor(f), *vu = td_value_tensor(u);
        td_tensor_release(f);
        td_tensor_release(u);
        td_status st = td_mp_queue_put(q, vf, QUEUE_WAIT_MS);
        if (st == TD_OK)
            st = td_mp_queue_put(q, vu, QUEUE_WAIT_MS);
        td_value_release(vf);
        td_value_release(vu);
        E_OK(st);
        E_OK(td_mp_event_wait(e, QUEUE_WAIT_MS));
        td_mp_event_clear(e);
    }
    E_CHECK(td_mp_ipc_collect() == 0);
    return TD_OK;
}

TD_TEST(test_mixed_types_cuda_sharing, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_mp_queue *q = NULL;
    td_mp_event *e = NULL;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&e));
    td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(e));
    td_mp_spawn_opts o = {.entry = "mixed_types_producer", .args = args, .method = TD_MP_SPAWN};
    td_mp_context *pctx = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pctx));
    for (int round = 0; round < 10; round++) {
        td_value *vf = NULL, *vu = NULL;
        TD_CHECK_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &vf));
        TD_CHECK_OK(td_mp_queue_get(q, QUEUE_WAIT_MS, &vu));
        td_tensor *f = td_value_get_tensor(vf), *u = td_value_get_tensor(vu);
        TD_CHECK_EQ(td_tensor_dtype(f), TD_FLOAT32);
        TD_CHECK_EQ(td_tensor_dtype(u), TD_UINT8);
        for (int64_t k = 0; k < 4; k++) {
            TD_CHECK_EQ(dev_get(f, k), 1.0);
            TD_CHECK_EQ(dev_get(u, k), 0.0);
        }
        td_value_release(vf);
        td_value_release(vu);
        td_mp_event_set(e);
    }
    TD_CHECK_OK(td_mp_join(pctx, 120000));
    td_mp_context_release(pctx);
    td_value_release(args);
    td_mp_queue_release(q);
    td_mp_event_release(e);
    dev_teardown();
}

/* Empty device tensors round-trip in one process without IPC, keeping dtype and device. */
TD_TEST(test_empty_tensor_sharing_cuda, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_mp_queue *q = NULL;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    const td_dtype dtypes[2] = {TD_FLOAT32, TD_INT64};
    for (int i = 0; i < 2; i++) {
        td_tensor *empty = NULL;
        TD_CHECK_OK(td_tensor_empty_on(dev(0), dtypes[i], TD_SHAPE(0), NULL, &empty));
        td_value *v = td_value_tensor(empty);
        TD_CHECK_OK(td_mp_queue_put(q, v, 1000));
        td_value *out = NULL;
        TD_CHECK_OK(td_mp_queue_get(q, 1000, &out));
        td_tensor *t = td_value_get_tensor(out);
        TD_CHECK_EQ(td_tensor_numel(t), 0);
        TD_CHECK_EQ(td_tensor_dtype(t), dtypes[i]);
        TD_CHECK(td_device_equal(td_tensor_device(t), dev(0)));
        td_value_release(out);
        td_value_release(v);
        td_tensor_release(empty);
    }
    td_mp_queue_release(q);
    dev_teardown();
}

TD_TEST(test_is_shared_cuda, DEV_CASE)
{
    dev_setup(ctx, 1);
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(5, 5), 1, &t));
    TD_CHECK(td_tensor_is_shared(t));
    td_tensor_release(t);
    dev_teardown();
}

int main(int argc, char **argv)
{
    TD_MP_MAIN_PROLOGUE(argc, argv); /* spawned children run their entry point here */
    return td_test_main(argc, argv);
}
