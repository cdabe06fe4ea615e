/* The RPC profiler (tdist/profiler.h): event recording on the threads that profile, the events of
 * profiled calls (keys, the callee's events carried back with the reply and merged under the
 * call's key), user scopes, and the Chrome trace export.
 *
 * A td_profiler is a refcounted list of events under a mutex. A user's profiler is current on the
 * thread that started it (rpc_prof_tls holds a reference); a callee serving a call that carries
 * RPC_FLAG_PROFILING makes a collector (a td_profiler of its own) current on its pool thread while
 * the function runs, and sends the collector's events with the reply (agent.c: run_call,
 * reply_value). The event of a call (rpc_prof_call) holds its profiler until the call completes:
 * complete_reply merges the callee's events and ends the event before it completes the future, so
 * a caller woken by the reply finds them recorded, and an async function's reply, sent when its
 * future completes, already holds the events of the calls it waited for. Nothing here is reached
 * while no thread records but rpc_prof_current's one relaxed load (profiler.h).
 *
 * Locks: a profiler's mu guards its events only; nothing else is taken under it. */
#include "rpc/profiler.h"

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/buf.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/ref.h"
#include "base/thread.h"
#include "base/vec.h"
#include "rpc/agent_impl.h"

#define REMOTE_OP "#remote_op: "
#define SCOPE_DEPTH 64              /* deeper scopes keep the nesting but are not recorded */
#define WIRE_MAX_EVENTS (1u << 22)  /* a reply's events beyond this are refused */
#define WIRE_MAX_INPUTS 1024
#define WIRE_MAX_NAME 65536

atomic_int rpc_prof_recording;
_Thread_local td_profiler *rpc_prof_tls;

typedef struct prof_event {
    char *name;
    int64_t start_ns, end_ns, thread_id, node_id, cpu_memory;
    bool is_remote;
    size_t num_inputs;
    td_shape *inputs;
} prof_event;

struct td_profiler {
    td_ref ref;
    pthread_mutex_t mu;
    td_profiler_options opts;
    _Atomic int64_t node_id; /* for its local events: -1 until known */
    bool collector;          /* a callee's, for one call */
    /* A user's: the thread it runs on, and what was current there before it (that thread's). */
    _Atomic bool running;
    pthread_t thread;
    td_profiler *previous;
    TD_VEC(prof_event) events;
};

static _Thread_local int64_t cached_tid;

static int64_t thread_id(void)
{
    if (!cached_tid)
        cached_tid = (int64_t)syscall(SYS_gettid);
    return cached_tid;
}

static void event_clear(prof_event *e)
{
    free(e->name);
    free(e->inputs);
}

/* Appends e (taking its name and inputs). */
static void add_event(td_profiler *p, prof_event *e)
{
    pthread_mutex_lock(&p->mu);
    TD_VEC_PUSH(&p->events, *e);
    pthread_mutex_unlock(&p->mu);
}

static td_profiler *profiler_new(const td_profiler_options *o, int64_t node_id, bool collector)
{
    td_profiler *p = TD_NEW(td_profiler);
    ref_init(&p->ref);
    thread_mutex_init(&p->mu);
    if (o)
        p->opts = *o;
    atomic_init(&p->node_id, node_id);
    p->collector = collector;
    return p;
}

td_profiler *rpc_prof_retain(td_profiler *p)
{
    ref_inc(&p->ref);
    return p;
}

void rpc_prof_release(td_profiler *p)
{
    if (!p || !ref_dec(&p->ref))
        return;
    for (size_t i = 0; i < p->events.len; i++)
        event_clear(&p->events.items[i]);
    TD_VEC_FREE(&p->events);
    pthread_mutex_destroy(&p->mu);
    free(p);
}

/* ---- a user's profiler ---------------------------------------------------------------------- */

void td_profiler_options_init(td_profiler_options *o)
{
    if (o)
        memset(o, 0, sizeof *o);
}

td_status td_profiler_start(const td_profiler_options *o, td_profiler **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_profiler_start: p is NULL");
    *out = NULL;
    if (rpc_prof_tls && !rpc_prof_tls->collector)
        return error_set(TD_ERR_ALREADY, "Profiler is already enabled on this thread");
    /* Local events carry this process's worker id: the default agent's, or the first agent a
     * profiled call goes through. */
    int64_t node_id = -1;
    td_rpc_agent *a = NULL;
    if (rpc_agent_get(NULL, &a) == TD_OK) {
        node_id = a->self.id;
        rpc_agent_release(a);
    } else {
        error_clear();
    }
    td_profiler *p = profiler_new(o, node_id, false);
    atomic_store(&p->running, true);
    p->thread = pthread_self();
    p->previous = rpc_prof_tls;
    rpc_prof_tls = rpc_prof_retain(p); /* the thread's reference */
    atomic_fetch_add(&rpc_prof_recording, 1);
    *out = p;
    return TD_OK;
}

td_status td_profiler_stop(td_profiler *p)
{
    if (!p)
        return error_fmt(TD_ERR_INVALID, "td_profiler_stop: p is NULL");
    if (!atomic_load(&p->running))
        return error_fmt(TD_ERR_INVALID, "the profiler is not running");
    if (!pthread_equal(p->thread, pthread_self()) || rpc_prof_tls != p)
        return error_fmt(TD_ERR_INVALID, "a profiler is stopped on the thread that started it");
    atomic_store(&p->running, false);
    rpc_prof_tls = p->previous;
    p->previous = NULL;
    atomic_fetch_sub(&rpc_prof_recording, 1);
    rpc_prof_release(p);
    return TD_OK;
}

void td_profiler_free(td_profiler *p)
{
    if (!p)
        return;
    if (rpc_prof_tls == p) /* running here */
        td_profiler_stop(p);
    rpc_prof_release(p);
}

/* ---- reading -------------------------------------------------------------------------------- */

typedef struct sort_item {
    td_profiler_event ev;
    size_t index;
} sort_item;

/* By start; an enclosing event (ending later) first; then in recording order. */
static int cmp_events(const void *x, const void *y)
{
    const sort_item *a = x, *b = y;
    if (a->ev.start_ns != b->ev.start_ns)
        return a->ev.start_ns < b->ev.start_ns ? -1 : 1;
    if (a->ev.end_ns != b->ev.end_ns)
        return a->ev.end_ns > b->ev.end_ns ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

td_status td_profiler_events(td_profiler *p, td_profiler_event **events, size_t *n)
{
    if (!p || !events || !n)
        return error_fmt(TD_ERR_INVALID, "td_profiler_events: an argument is NULL");
    *events = NULL;
    *n = 0;
    pthread_mutex_lock(&p->mu);
    size_t count = p->events.len;
    sort_item *items = count ? TD_NEW_ARRAY(sort_item, count) : NULL;
    for (size_t i = 0; i < count; i++) {
        const prof_event *e = &p->events.items[i];
        items[i].index = i;
        items[i].ev = (td_profiler_event){.name = e->name,
                                          .start_ns = e->start_ns,
                                          .end_ns = e->end_ns,
                                          .thread_id = e->thread_id,
                                          .node_id = e->node_id,
                                          .is_remote = e->is_remote,
                                          .num_inputs = e->num_inputs,
                                          .input_shapes = e->inputs,
                                          .cpu_memory_usage = e->cpu_memory};
    }
    pthread_mutex_unlock(&p->mu);
    if (!count)
        return TD_OK;
    qsort(items, count, sizeof *items, cmp_events);
    td_profiler_event *out = TD_NEW_ARRAY(td_profiler_event, count);
    for (size_t i = 0; i < count; i++)
        out[i] = items[i].ev;
    free(items);
    *events = out;
    *n = count;
    return TD_OK;
}

void td_profiler_events_free(td_profiler_event *events) { free(events); }

/* ---- user scopes ---------------------------------------------------------------------------- */

typedef struct prof_scope {
    td_profiler *p; /* a reference; NULL: not recorded */
    char *name;
    int64_t start_ns;
} prof_scope;

static _Thread_local prof_scope scopes[SCOPE_DEPTH];
static _Thread_local int scope_depth;

void td_record_function_enter(const char *name)
{
    int d = scope_depth++;
    if (d >= SCOPE_DEPTH)
        return;
    td_profiler *p = rpc_prof_current();
    scopes[d].p = p ? rpc_prof_retain(p) : NULL;
    scopes[d].name = p ? alloc_strdup(name ? name : "") : NULL;
    scopes[d].start_ns = p ? clock_now_ns() : 0;
}

td_status td_record_function_exit(void)
{
    if (scope_depth <= 0)
        return error_fmt(TD_ERR_INVALID, "td_record_function_exit: no scope is open on this thread");
    int d = --scope_depth;
    if (d >= SCOPE_DEPTH || !scopes[d].p)
        return TD_OK;
    td_profiler *p = scopes[d].p;
    prof_event e = {.name = scopes[d].name,
                    .start_ns = scopes[d].start_ns,
                    .end_ns = clock_now_ns(),
                    .thread_id = thread_id(),
                    .node_id = atomic_load(&p->node_id)};
    add_event(p, &e);
    rpc_prof_release(p);
    scopes[d].p = NULL;
    scopes[d].name = NULL;
    return TD_OK;
}

/* ---- the caller's side ---------------------------------------------------------------------- */

struct rpc_prof_call {
    td_profiler *p; /* a reference */
    char *key;
    int64_t start_ns, thread_id, node_id;
};

static const char *const mode_names[] = {"sync", "async", "remote"};

/* The RRef protocol's and the group's own messages (rref.c, agent.c). */
static bool is_bookkeeping(const char *fn)
{
    if (strncmp(fn, "tdist::", 7) != 0)
        return false;
    fn += 7;
    return strcmp(fn, "rref_fork") == 0 || strcmp(fn, "rref_accept") == 0 || strcmp(fn, "rref_delete") == 0 ||
           strcmp(fn, "rpc_join") == 0 || strcmp(fn, "rpc_leave") == 0;
}

rpc_prof_call *rpc_prof_call_begin(td_profiler *p, rpc_prof_mode mode, const char *fn, const td_worker_info *caller,
                                   const td_worker_info *callee)
{
    if (!p || is_bookkeeping(fn))
        return NULL;
    int64_t expected = -1;
    atomic_compare_exchange_strong(&p->node_id, &expected, caller->id);
    rpc_prof_call *c = TD_NEW(rpc_prof_call);
    c->p = rpc_prof_retain(p);
    c->key = alloc_printf("rpc_%s#%s(%s -> %s)", mode_names[mode], fn, caller->name, callee->name);
    c->thread_id = thread_id();
    c->node_id = caller->id;
    c->start_ns = clock_now_ns();
    return c;
}

td_value *rpc_prof_call_wrap(const rpc_prof_call *c, const td_value *payload)
{
    int64_t config = (c->p->opts.record_shapes ? 1 : 0) | (c->p->opts.profile_memory ? 2 : 0);
    return td_value_tuple_of(2, td_value_retain((td_value *)payload), td_value_int(config));
}

void rpc_prof_call_discard(rpc_prof_call *c)
{
    if (!c)
        return;
    rpc_prof_release(c->p);
    free(c->key);
    free(c);
}

void rpc_prof_call_end(rpc_prof_call *c)
{
    if (!c)
        return;
    prof_event e = {.name = c->key,
                    .start_ns = c->start_ns,
                    .end_ns = clock_now_ns(),
                    .thread_id = c->thread_id,
                    .node_id = c->node_id};
    add_event(c->p, &e);
    c->key = NULL;
    rpc_prof_call_discard(c);
}

static bool is_int(const td_value *v) { return v && td_value_kind_of(v) == TD_VAL_INT; }

/* One event of a reply, checked (it came from a peer); prefix is the call's key. */
static td_status event_from_wire(const td_value *t, const char *prefix, prof_event *e)
{
    memset(e, 0, sizeof *e);
    if (td_value_kind_of(t) != TD_VAL_TUPLE || td_value_len(t) != 8)
        return error_fmt(TD_ERR_INVALID, "a profiling event is not a tuple of 8");
    const td_value *name = td_value_at(t, 0), *shapes = td_value_at(t, 6), *remote = td_value_at(t, 5);
    size_t name_len = 0;
    const char *text = td_value_kind_of(name) == TD_VAL_STRING ? td_value_get_string(name, &name_len) : NULL;
    if (!text || name_len > WIRE_MAX_NAME || memchr(text, 0, name_len))
        return error_fmt(TD_ERR_INVALID, "a profiling event's name is not a string of at most %d bytes",
                         WIRE_MAX_NAME);
    for (size_t i = 1; i <= 7; i++)
        if (i != 5 && i != 6 && !is_int(td_value_at(t, i)))
            return error_fmt(TD_ERR_INVALID, "field %zu of a profiling event is not an int", i);
    if (td_value_kind_of(remote) != TD_VAL_BOOL ||
        (td_value_kind_of(shapes) != TD_VAL_LIST && td_value_kind_of(shapes) != TD_VAL_TUPLE) ||
        td_value_len(shapes) > WIRE_MAX_INPUTS)
        return error_fmt(TD_ERR_INVALID, "a profiling event's flag or input shapes are malformed");
    size_t n = td_value_len(shapes);
    td_shape *inputs = n ? TD_NEW_ARRAY(td_shape, n) : NULL;
    for (size_t i = 0; i < n; i++) {
        const td_value *s = td_value_at(shapes, i);
        td_value_kind k = td_value_kind_of(s);
        size_t nd = (k == TD_VAL_TUPLE || k == TD_VAL_LIST) ? td_value_len(s) : SIZE_MAX;
        bool ok = nd <= TD_MAX_DIMS;
        for (size_t j = 0; ok && j < nd; j++)
            if ((ok = is_int(td_value_at(s, j))))
                inputs[i].d[j] = td_value_get_int(td_value_at(s, j));
        if (!ok) {
            free(inputs);
            return error_fmt(TD_ERR_INVALID, "a profiling event's input shape is malformed");
        }
        inputs[i].ndim = (int)nd;
    }
    e->name = alloc_printf("%s" REMOTE_OP "%.*s", prefix, (int)name_len, text);
    e->start_ns = td_value_get_int(td_value_at(t, 1));
    e->end_ns = td_value_get_int(td_value_at(t, 2));
    e->thread_id = td_value_get_int(td_value_at(t, 3));
    e->node_id = td_value_get_int(td_value_at(t, 4));
    e->is_remote = true;
    e->num_inputs = n;
    e->inputs = inputs;
    e->cpu_memory = td_value_get_int(td_value_at(t, 7));
    return TD_OK;
}

td_status rpc_prof_reply_unwrap(rpc_prof_call *c, td_value **v)
{
    td_value *w = *v;
    *v = NULL;
    if (!w || td_value_kind_of(w) != TD_VAL_TUPLE || td_value_len(w) != 2 ||
        (td_value_kind_of(td_value_at(w, 1)) != TD_VAL_LIST && td_value_kind_of(td_value_at(w, 1)) != TD_VAL_TUPLE)) {
        td_value_release(w);
        return error_fmt(TD_ERR_INVALID, "a profiled reply is not a tuple (value, events)");
    }
    const td_value *events = td_value_at(w, 1);
    size_t n = td_value_len(events);
    if (n > WIRE_MAX_EVENTS) {
        td_value_release(w);
        return error_fmt(TD_ERR_INVALID, "a profiled reply holds %zu events, more than %u", n, WIRE_MAX_EVENTS);
    }
    /* Without c (no profiler waits for them) the events are not even read. */
    td_status st = TD_OK;
    prof_event *got = c && n ? TD_NEW_ARRAY(prof_event, n) : NULL;
    size_t have = 0; /* the failed one cleans up after itself */
    while (got && have < n && (st = event_from_wire(td_value_at(events, have), c->key, &got[have])) == TD_OK)
        have++;
    if (st == TD_OK && have) {
        pthread_mutex_lock(&c->p->mu);
        TD_VEC_RESERVE(&c->p->events, c->p->events.len + have);
        for (size_t i = 0; i < have; i++)
            c->p->events.items[c->p->events.len++] = got[i];
        pthread_mutex_unlock(&c->p->mu);
    } else {
        for (size_t i = 0; i < have; i++)
            event_clear(&got[i]);
    }
    free(got);
    if (st == TD_OK) {
        td_value *value = td_value_at(w, 0);
        *v = td_value_kind_of(value) == TD_VAL_NONE ? NULL : td_value_retain(value);
    }
    td_value_release(w);
    return st;
}

/* ---- the callee's side ---------------------------------------------------------------------- */

td_status rpc_prof_serve_parts(const td_value *payload, int64_t self, const td_value **call, td_profiler **collector)
{
    *call = NULL;
    *collector = NULL;
    if (!payload || td_value_kind_of(payload) != TD_VAL_TUPLE || td_value_len(payload) != 2 ||
        !is_int(td_value_at(payload, 1)))
        return error_fmt(TD_ERR_INVALID, "a profiled call is not a tuple (call, config)");
    int64_t config = td_value_get_int(td_value_at(payload, 1));
    td_profiler_options o = {.record_shapes = (config & 1) != 0, .profile_memory = (config & 2) != 0};
    *call = td_value_at(payload, 0);
    *collector = profiler_new(&o, self, true);
    return TD_OK;
}

td_profiler *rpc_prof_serve_enter(td_profiler *collector)
{
    td_profiler *previous = rpc_prof_tls;
    rpc_prof_tls = collector;
    atomic_fetch_add(&rpc_prof_recording, 1);
    return previous;
}

void rpc_prof_serve_exit(td_profiler *previous)
{
    rpc_prof_tls = previous;
    atomic_fetch_sub(&rpc_prof_recording, 1);
}

static td_value *shapes_value(const prof_event *e)
{
    td_value *list = td_value_list_new();
    for (size_t i = 0; i < e->num_inputs; i++) {
        td_value *s = td_value_tuple_new((size_t)e->inputs[i].ndim);
        for (int j = 0; j < e->inputs[i].ndim; j++)
            td_value_set(s, (size_t)j, td_value_int(e->inputs[i].d[j]));
        td_value_list_append(list, s);
    }
    return list;
}

td_value *rpc_prof_reply_wrap(td_profiler *collector, const td_value *value)
{
    td_value *events = td_value_list_new();
    pthread_mutex_lock(&collector->mu);
    for (size_t i = 0; i < collector->events.len; i++) {
        const prof_event *e = &collector->events.items[i];
        td_value_list_append(events, td_value_tuple_of(8, td_value_string(e->name), td_value_int(e->start_ns),
                                                       td_value_int(e->end_ns), td_value_int(e->thread_id),
                                                       td_value_int(e->node_id), td_value_bool(e->is_remote),
                                                       shapes_value(e), td_value_int(e->cpu_memory)));
    }
    pthread_mutex_unlock(&collector->mu);
    return td_value_tuple_of(2, value ? td_value_retain((td_value *)value) : td_value_none(), events);
}

/* ---- builtins ------------------------------------------------------------------------------- */

void rpc_prof_record_op(td_profiler *p, const char *name, int64_t start_ns, const td_value *args,
                        const td_value *result)
{
    prof_event e = {.name = alloc_strdup(name),
                    .start_ns = start_ns,
                    .end_ns = clock_now_ns(),
                    .thread_id = thread_id(),
                    .node_id = atomic_load(&p->node_id)};
    if (p->opts.record_shapes && args) {
        size_t n = td_value_len(args);
        e.num_inputs = n;
        e.inputs = n ? TD_NEW_ARRAY(td_shape, n) : NULL;
        for (size_t i = 0; i < n; i++) {
            const td_value *a = td_value_at(args, i);
            if (td_value_kind_of(a) == TD_VAL_TENSOR) {
                const td_tensor *t = td_value_get_tensor(a);
                e.inputs[i] = td_shape_of(td_tensor_ndim(t), td_tensor_sizes(t));
            }
        }
    }
    if (p->opts.profile_memory && result && td_value_kind_of(result) == TD_VAL_TENSOR)
        e.cpu_memory = (int64_t)td_tensor_nbytes(td_value_get_tensor(result));
    add_event(p, &e);
}

/* ---- Chrome trace --------------------------------------------------------------------------- */

static void json_string(FILE *f, const char *s)
{
    td_buf b = TD_BUF_INIT;
    buf_put_json(&b, s);
    fwrite(b.data, 1, b.len, f);
    buf_free(&b);
}

td_status td_profiler_export_chrome_trace(td_profiler *p, const char *path)
{
    if (!p || !path)
        return error_fmt(TD_ERR_INVALID, "td_profiler_export_chrome_trace: %s is NULL", p ? "path" : "p");
    td_profiler_event *ev = NULL;
    size_t n = 0;
    TD_TRY(td_profiler_events(p, &ev, &n));
    FILE *f = fopen(path, "w");
    if (!f) {
        td_profiler_events_free(ev);
        return error_errno(TD_ERR_IO, "cannot open %s to write the trace", path);
    }
    fputs("[", f);
    bool first = true;
    /* One track per worker: a process_name entry for each node id, in order of appearance. */
    TD_VEC(int64_t) nodes = {0};
    for (size_t i = 0; i < n; i++) {
        bool seen = false;
        for (size_t j = 0; j < nodes.len && !seen; j++)
            seen = nodes.items[j] == ev[i].node_id;
        if (seen)
            continue;
        TD_VEC_PUSH(&nodes, ev[i].node_id);
        char label[48];
        if (ev[i].node_id >= 0)
            snprintf(label, sizeof label, "worker %" PRId64, ev[i].node_id);
        else
            snprintf(label, sizeof label, "local");
        fprintf(f, "%s\n{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %" PRId64 ", \"tid\": 0, "
                   "\"args\": {\"name\": \"%s\"}}",
                first ? "" : ",", ev[i].node_id, label);
        first = false;
    }
    TD_VEC_FREE(&nodes);
    for (size_t i = 0; i < n; i++) {
        const td_profiler_event *e = &ev[i];
        int64_t dur = e->end_ns > e->start_ns ? e->end_ns - e->start_ns : 0;
        fprintf(f, "%s\n{\"name\": ", first ? "" : ",");
        json_string(f, e->name);
        fprintf(f,
                ", \"ph\": \"X\", \"ts\": %" PRId64 ".%03d, \"dur\": %" PRId64 ".%03d, \"pid\": %" PRId64
                ", \"tid\": %" PRId64 ", \"args\": {\"node_id\": %" PRId64 ", \"is_remote\": %s, "
                "\"cpu_memory_usage\": %" PRId64 ", \"input_shapes\": [",
                e->start_ns / 1000, (int)(e->start_ns % 1000), dur / 1000,
                (int)(dur % 1000), e->node_id, e->thread_id, e->node_id, e->is_remote ? "true" : "false",
                e->cpu_memory_usage);
        for (size_t s = 0; s < e->num_inputs; s++) {
            fprintf(f, "%s[", s ? ", " : "");
            for (int d = 0; d < e->input_shapes[s].ndim; d++)
                fprintf(f, "%s%" PRId64, d ? ", " : "", e->input_shapes[s].d[d]);
            fputc(']', f);
        }
        fputs("]}}", f);
        first = false;
    }
    fputs("\n]\n", f);
    td_profiler_events_free(ev);
    bool failed = ferror(f) != 0;
    if (fclose(f) != 0 || failed)
        return error_errno(TD_ERR_IO, "cannot write the trace to %s", path);
    return TD_OK;
}
