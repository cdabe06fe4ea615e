/* Fork safety of the device runtime (spec/multiprocessing.md section K): a child forked after the
 * parent initialized a device type cannot use it, and every device entry point there fails with
 * PyTorch's "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you
 * must use the 'spawn' start method" (sim: "sim" for "CUDA") instead of crashing or hanging; a
 * child forked before any device use, or spawned, works. The seed's test_cuda_bad_call and
 * test_wrong_cuda_fork keep their names. */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <tdist/mp.h>

#include "base/error.h"
#include "device_util.h"

#include "../support/entry_check.h"

static const td_device cpu = {TD_DEVICE_CPU, -1};

/* The fork message for the type this process runs on. */
static void fork_message(td_device_type type, char *buf, size_t len)
{
    const char *name = type == TD_DEVICE_CUDA ? "CUDA" : "sim";
    snprintf(buf, len, "Cannot re-initialize %s in forked subprocess. To use %s with multiprocessing, you must use "
                       "the 'spawn' start method",
             name, name);
}

/* The error of a device call in a poisoned child is the fork message, typed RuntimeError. */
static td_status expect_fork_error(td_status st, const char *what)
{
    char want[256];
    fork_message(td_device_default_type(), want, sizeof want);
    if (st == TD_OK)
        return error_fmt(TD_ERR_INTERNAL, "%s succeeded in a forked child", what);
    if (strcmp(td_last_error(), want) != 0)
        return error_fmt(TD_ERR_INTERNAL, "%s failed with '%s', not the fork message", what, td_last_error());
    return TD_OK;
}

/* ---- test_cuda_bad_call ------------------------------------------------------------------- */

/* queue_get_exception: with stderr closed, the child's device use must fail; the error travels
 * back through outq. */
TD_MP_ENTRY(bad_call_child)
{
    (void)rank;
    (void)result;
    close(2);
    td_mp_queue *outq = td_mp_value_queue(td_value_at(args, 1));
    td_tensor *host = NULL, *on_device = NULL;
    E_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(5, 5), &host));
    td_device d = {td_device_default_type(), -1};
    td_status st = td_tensor_to_device(host, d, false, &on_device);
    td_tensor_release(host);
    td_value *report = st == TD_OK ? td_value_string("no error")
                                   : td_value_tuple_of(2, td_value_string(error_type() ? error_type() : ""),
                                                       td_value_string(td_last_error()));
    if (on_device)
        td_tensor_release(on_device);
    st = td_mp_queue_put(outq, report, 10000);
    td_value_release(report);
    return st;
}

TD_TEST(test_cuda_bad_call, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    /* t = torch.zeros(5, 5).cuda().cpu(): the runtime is initialized before the fork. */
    td_tensor *zeros = NULL, *on_device = NULL, *t = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(5, 5), &zeros));
    TD_CHECK_OK(td_tensor_to_device(zeros, dev(0), false, &on_device));
    TD_CHECK_OK(td_tensor_to_device(on_device, cpu, false, &t));
    td_mp_queue *inq = NULL, *outq = NULL;
    TD_CHECK_OK(td_mp_queue_new(0, &inq));
    TD_CHECK_OK(td_mp_queue_new(0, &outq));
    td_value *args = td_value_tuple_of(2, td_mp_queue_value(inq), td_mp_queue_value(outq));
    td_mp_spawn_opts o = {.entry = "bad_call_child", .args = args, .method = TD_MP_FORK};
    td_mp_context *pctx = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pctx));
    td_value *tv = td_value_tensor(t);
    TD_CHECK_OK(td_mp_queue_put(inq, tv, 10000)); /* nobody reads it: harmless */
    td_value_release(tv);
    TD_CHECK_OK(td_mp_join(pctx, 60000));
    td_value *got = NULL;
    TD_CHECK_OK(td_mp_queue_get(outq, 10000, &got));
    TD_CHECK_EQ(td_value_kind_of(got), TD_VAL_TUPLE);
    char want[256];
    fork_message(type, want, sizeof want);
    TD_CHECK_STR_EQ(td_value_get_string(td_value_at(got, 0), NULL), "RuntimeError");
    TD_CHECK_STR_EQ(td_value_get_string(td_value_at(got, 1), NULL), want);
    td_value_release(got);
    td_mp_context_release(pctx);
    td_value_release(args);
    td_mp_queue_release(inq);
    td_mp_queue_release(outq);
    td_tensor_release(t);
    td_tensor_release(on_device);
    td_tensor_release(zeros);
    dev_teardown();
}

/* ---- test_wrong_cuda_fork ----------------------------------------------------------------- */

/* run(rank): torch.cuda.set_device(rank); the uncaught error goes to stderr as Python prints it. */
TD_MP_ENTRY(wrong_fork_run)
{
    (void)args;
    (void)result;
    td_device d = {td_device_default_type(), rank};
    td_status st = td_device_set(d);
    if (st != TD_OK) {
        fprintf(stderr, "Traceback (most recent call last):\n  td_device_set\n%s: %s\n",
                error_type() ? error_type() : "Error", td_last_error());
        fflush(stderr);
    }
    return st;
}

/* The script of test_wrong_cuda_fork, in a fresh (spawned) process whose stderr goes to a file:
 * for rank 0 and 1, x = rand(20, 2).cuda(), then a forked Process running run(rank). */
TD_MP_ENTRY(wrong_fork_script)
{
    (void)rank;
    (void)result;
    const char *path = td_value_get_string(td_value_at(args, 0), NULL);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    E_CHECK(fd >= 0);
    E_CHECK(dup2(fd, 2) == 2);
    close(fd);
    td_device d = {td_device_default_type(), -1};
    td_tensor *xs[2] = {NULL, NULL};
    td_mp_context *procs[2] = {NULL, NULL};
    for (int r = 0; r < 2; r++) {
        E_OK(td_tensor_full_on(d, TD_FLOAT32, TD_SHAPE(20, 2), 0.5, &xs[r]));
        td_mp_spawn_opts o = {.entry = "wrong_fork_run", .method = TD_MP_FORK};
        E_OK(td_mp_spawn(&o, &procs[r]));
    }
    for (int r = 0; r < 2; r++) {
        (void)td_mp_join(procs[r], 60000); /* each child fails: that is the point */
        td_mp_context_release(procs[r]);
        td_tensor_release(xs[r]);
    }
    return TD_OK;
}

TD_TEST(test_wrong_cuda_fork, DEV_CASE)
{
    td_device_type type = dev_setup(ctx, 1);
    char path[512];
    snprintf(path, sizeof path, "%s/wrong_fork_stderr.txt", ctx->tmpdir);
    td_value *args = td_value_tuple_of(1, td_value_string(path));
    td_mp_spawn_opts o = {.entry = "wrong_fork_script", .args = args, .method = TD_MP_SPAWN};
    td_mp_context *pctx = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pctx));
    TD_CHECK_OK(td_mp_join(pctx, 120000));
    td_mp_context_release(pctx);
    td_value_release(args);
    FILE *f = fopen(path, "r");
    TD_CHECK(f != NULL);
    char captured[8192];
    size_t n = fread(captured, 1, sizeof captured - 1, f);
    captured[n] = '\0';
    fclose(f);
    unlink(path);
    /* The seed's regex: "Cannot re-initialize CUDA in forked subprocess." */
    char want[128];
    snprintf(want, sizeof want, "Cannot re-initialize %s in forked subprocess.", type == TD_DEVICE_CUDA ? "CUDA" : "sim");
    TD_CHECK_CONTAINS(captured, want);
    dev_teardown();
}

/* ---- fork before any device use works ------------------------------------------------------ */

/* Uses the device for real: a fill on the device and the values back on the host. */
static td_status use_device(double value)
{
    td_device d = {td_device_default_type(), -1};
    td_tensor *x = NULL, *back = NULL;
    E_OK(td_tensor_full_on(d, TD_FLOAT32, TD_SHAPE(4, 3), value, &x));
    td_status st = td_tensor_to_device(x, cpu, false, &back);
    td_tensor_release(x);
    E_OK(st);
    int64_t idx[2] = {3, 2};
    double got = 0;
    st = td_tensor_get_f64(back, idx, &got);
    td_tensor_release(back);
    E_OK(st);
    E_CHECK(got == value);
    return TD_OK;
}

TD_MP_ENTRY(fork_uses_device)
{
    (void)rank;
    (void)args;
    (void)result;
    E_OK(use_device(7));
    return TD_OK;
}

/* In a fresh (spawned) process that has not touched the device: a forked child uses it, then this
 * process does. */
TD_MP_ENTRY(fresh_fork_script)
{
    (void)rank;
    (void)args;
    (void)result;
    td_mp_spawn_opts o = {.entry = "fork_uses_device", .method = TD_MP_FORK};
    td_mp_context *pctx = NULL;
    E_OK(td_mp_spawn(&o, &pctx));
    td_status st = td_mp_join(pctx, 60000);
    td_mp_context_release(pctx);
    E_OK(st);
    E_OK(use_device(9));
    return TD_OK;
}

TD_TEST(test_fork_before_device_use, DEV_CASE)
{
#if defined(__SANITIZE_THREAD__)
    /* The forked child starts the device's threads, which ThreadSanitizer's runtime refuses after a
     * multi-threaded fork (as the seed skips its fork tests under TSAN). */
    TD_SKIP(TD_SKIP_GENERIC, "TSAN is not fork-safe since we're forking in a multi-threaded environment");
#endif
    td_device_type type = dev_setup(ctx, 1);
    td_mp_spawn_opts o = {.entry = "fresh_fork_script", .method = TD_MP_SPAWN};
    td_mp_context *pctx = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pctx));
    TD_CHECK_OK(td_mp_join(pctx, 120000));
    td_mp_context_release(pctx);
    if (type == TD_DEVICE_SIM) {
        /* sim goes back to uninitialized when the runtime shuts down (its threads are joined), so
         * a fork after td_device_shutdown works too. CUDA's driver stays initialized. */
        TD_CHECK(use_device(5) == TD_OK);
        TD_CHECK_OK(td_device_shutdown());
        o.entry = "fork_uses_device";
        o.method = TD_MP_FORK;
        TD_CHECK_OK(td_mp_spawn(&o, &pctx));
        TD_CHECK_OK(td_mp_join(pctx, 60000));
        td_mp_context_release(pctx);
    }
    dev_teardown();
}

/* ---- every entry point in a poisoned child, with fd 2 closed -------------------------------- */

/* What the parent made before the fork; the forked child sees copies of these pointers. */
static td_stream *inherited_stream;
static td_event *inherited_event;
static td_tensor *inherited_tensor;

TD_MP_ENTRY(poisoned_calls)
{
    (void)rank;
    (void)args;
    (void)result;
    close(2); /* nothing may crash writing to a closed stderr */
    td_device_type type = td_device_default_type();
    td_device d0 = {type, 0};
    E_OK(expect_fork_error(td_device_set(d0), "td_device_set"));
    E_OK(expect_fork_error(td_device_synchronize(d0), "td_device_synchronize"));
    td_device_properties props;
    E_OK(expect_fork_error(td_device_get_properties(d0, &props), "td_device_get_properties"));
    td_stream *s = NULL;
    E_OK(expect_fork_error(td_stream_create(d0, 0, &s), "td_stream_create"));
    E_OK(expect_fork_error(td_stream_current(d0, &s), "td_stream_current"));
    E_OK(expect_fork_error(td_stream_synchronize(inherited_stream), "td_stream_synchronize"));
    E_CHECK(!td_stream_query(inherited_stream));
    E_OK(expect_fork_error(td_stream_sleep(inherited_stream, 10), "td_stream_sleep"));
    E_OK(expect_fork_error(td_event_record(inherited_event, inherited_stream), "td_event_record"));
    E_OK(expect_fork_error(td_event_synchronize(inherited_event), "td_event_synchronize"));
    E_OK(expect_fork_error(td_stream_wait_event(inherited_stream, inherited_event), "td_stream_wait_event"));
    td_event *fresh = NULL;
    E_OK(td_event_create(TD_EVENT_INTERPROCESS, &fresh)); /* no device yet: plain memory */
    E_OK(expect_fork_error(td_event_record(fresh, NULL), "td_event_record of a new event"));
    td_event_release(fresh);
    void *p = NULL;
    E_OK(expect_fork_error(td_device_malloc(d0, 1024, NULL, &p), "td_device_malloc"));
    E_CHECK(p == NULL);
    td_tensor *t = NULL, *back = NULL;
    E_OK(expect_fork_error(td_tensor_full_on(d0, TD_FLOAT32, TD_SHAPE(3), 1, &t), "td_tensor_full_on"));
    E_OK(expect_fork_error(td_tensor_to_device(inherited_tensor, (td_device){TD_DEVICE_CPU, -1}, false, &back),
                           "td_tensor_to_device"));
    td_memory_stats stats;
    E_OK(expect_fork_error(td_memory_stats_get(d0, &stats), "td_memory_stats_get"));
    /* Releasing what the parent made touches nothing of the parent's runtime, and returns. */
    td_tensor_release(inherited_tensor);
    td_event_release(inherited_event);
    td_stream_release(inherited_stream);
    (void)td_device_empty_cache();
    (void)td_device_shutdown();
    return TD_OK;
}

TD_TEST(test_fork_poisoned_entry_points, DEV_CASE)
{
    dev_setup(ctx, 1);
    TD_CHECK_OK(td_stream_create(dev(0), 0, &inherited_stream));
    TD_CHECK_OK(td_event_create(TD_EVENT_DEFAULT, &inherited_event));
    TD_CHECK_OK(td_tensor_full_on(dev(0), TD_FLOAT32, TD_SHAPE(8), 2, &inherited_tensor));
    TD_CHECK_OK(td_stream_sleep(inherited_stream, 1000));
    TD_CHECK_OK(td_event_record(inherited_event, inherited_stream));
    td_mp_spawn_opts o = {.entry = "poisoned_calls", .method = TD_MP_FORK};
    td_mp_context *pctx = NULL;
    TD_CHECK_OK(td_mp_spawn(&o, &pctx));
    TD_CHECK_OK(td_mp_join(pctx, 60000));
    int code = -1;
    TD_CHECK_OK(td_mp_exitcode(pctx, 0, &code));
    TD_CHECK_EQ(code, 0);
    td_mp_context_release(pctx);
    /* The parent's objects are untouched by the child's releases. */
    TD_CHECK_OK(td_event_synchronize(inherited_event));
    TD_CHECK_EQ(dev_get(inherited_tensor, 7), 2.0);
    td_tensor_release(inherited_tensor);
    td_event_release(inherited_event);
    td_stream_release(inherited_stream);
    dev_teardown();
}

int main(int argc, char **argv)
{
    TD_MP_MAIN_PROLOGUE(argc, argv); /* spawned children run their entry point here */
    return td_test_main(argc, argv);
}
