/* The CPU tests of PyTorch's test/test_multiprocessing.py (spec/multiprocessing.md section 4), in
 * C with real processes: queues carrying shared tensors in both directions (fill, receive, the
 * fd_/fs_ sharing loops), storage identity (preserve_sharing), pools, the file_system strategy's
 * files (test_fs), inheritance through fork, empty and is_shared, thread names, and send_many.
 * 30 repeats where the seed repeats them, each loop inside the mp leak checker, which (unlike the
 * seed's) records child pids after they start. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "base/clock.h"
#include "mp_util.h"

#define REPEATS 30

/* ---- entry points ------------------------------------------------------------------------- */

/* simple_fill(queue, event): data = queue.get(); data[0][:] = 4; event.set() */
TD_MP_ENTRY(simple_fill)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 1));
    E_CHECK(q && e);
    td_value *data = NULL;
    E_OK(td_mp_queue_get(q, 30000, &data));
    E_CHECK(td_value_kind_of(data) == TD_VAL_LIST && td_value_len(data) == 2);
    td_status st = td_tensor_fill(td_value_get_tensor(td_value_at(data, 0)), 4);
    td_value_release(data);
    E_OK(st);
    td_mp_event_set(e);
    return TD_OK;
}

/* send_tensor(queue, event): t = ones(5, 5); put t twice; event.wait() */
TD_MP_ENTRY(send_tensor)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 1));
    E_CHECK(q && e);
    td_tensor *t;
    E_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(5, 5), &t));
    td_value *v = td_value_tensor(t);
    td_tensor_release(t);
    td_status st = td_mp_queue_put(q, v, 0);
    if (st == TD_OK)
        st = td_mp_queue_put(q, v, 0);
    td_value_release(v);
    E_OK(st);
    E_OK(td_mp_event_wait(e, 100000));
    return TD_OK;
}

/* simple_pool_fill(tensor): tensor.fill_(4); return tensor.add(1) */
TD_MP_ENTRY(simple_pool_fill)
{
    E_CHECK(td_value_kind_of(args) == TD_VAL_TENSOR);
    td_tensor *t = td_value_get_tensor(args), *r;
    E_OK(td_tensor_fill(t, 4));
    E_OK(td_tensor_clone(t, &r));
    float *p = td_tensor_data(r);
    for (int64_t i = 0; i < td_tensor_numel(r); i++)
        p[i] += 1;
    *result = td_value_tensor(r);
    td_tensor_release(r);
    return TD_OK;
}

/* SubProcess.run: self.tensor.add_(3) (the tensor is inherited through fork) */
TD_MP_ENTRY(add_three)
{
    td_tensor *t = td_value_get_tensor(args);
    E_CHECK(t && td_tensor_is_contiguous(t));
    float *p = td_tensor_data(t);
    for (int64_t i = 0; i < td_tensor_numel(t); i++)
        p[i] += 3;
    return TD_OK;
}

/* ---- helpers ------------------------------------------------------------------------------ */

static td_mp_context *start(const char *entry, td_value *args, td_mp_start_method m, td_mp_leak_checker *lc)
{
    td_mp_context *ctx = NULL;
    td_mp_spawn_opts o = {.entry = entry, .args = args, .nprocs = 1, .method = m, .daemon = true};
    TD_CHECK_OK(td_mp_spawn(&o, &ctx));
    if (lc)
        td_mp_leak_checker_track(lc, td_mp_context_pid(ctx, 0)); /* after start (seed defect 8) */
    return ctx;
}

/* _test_sharing's test_fill. */
static void test_fill(td_mp_start_method m, td_mp_leak_checker *lc)
{
    td_mp_queue *q;
    td_mp_event *e;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&e));
    td_tensor *x, *col;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(5, 5), &x));
    TD_CHECK_OK(td_tensor_select(x, 1, 1, &col)); /* x[:, 1]: 5 elements, stride 5, offset 1 */
    td_value *data = td_value_list_new();
    td_value_list_append(data, td_value_tensor(x));
    td_value_list_append(data, td_value_tensor(col));
    TD_CHECK_OK(td_mp_queue_put(q, data, 0)); /* before the child exists */
    TD_CHECK(td_tensor_is_shared(x));         /* moved in place by the put */
    TD_CHECK(td_tensor_storage(col) == td_tensor_storage(x));
    td_value_release(data);

    td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(e));
    td_mp_context *ctx = start("simple_fill", args, m, lc);
    td_value_release(args);
    TD_CHECK_OK(td_mp_event_wait(e, 30000));
    TD_CHECK(td_mp_event_is_set(e));
    TD_CHECK(mpt_all_equal(x, 4));
    TD_CHECK(mpt_all_equal(col, 4)); /* the parent's own view sees the child's write */
    TD_CHECK_OK(td_mp_join(ctx, 100000));
    TD_CHECK(!td_mp_is_alive(ctx, 0));
    td_mp_context_release(ctx);
    td_tensor_release(col);
    td_tensor_release(x);
    td_mp_event_release(e);
    td_mp_queue_release(q);
}

/* _test_sharing's test_receive. */
static void test_receive(td_mp_start_method m, td_mp_leak_checker *lc)
{
    td_mp_queue *q;
    td_mp_event *e;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&e));
    td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(e));
    td_mp_context *ctx = start("send_tensor", args, m, lc);
    td_value_release(args);
    td_value *v1, *v2;
    TD_CHECK_OK(td_mp_queue_get(q, 30000, &v1));
    TD_CHECK_OK(td_mp_queue_get(q, 30000, &v2));
    td_tensor *t1 = td_value_get_tensor(v1), *t2 = td_value_get_tensor(v2);
    TD_CHECK(t1 && t2);
    TD_CHECK(mpt_all_equal(t1, 1));
    /* The seed's tautology s1.data_ptr() == s1.data_ptr(), as meant: one storage object. */
    TD_CHECK(td_tensor_storage(t1) == td_tensor_storage(t2));
    TD_CHECK(td_tensor_equal(t1, t2));
    TD_CHECK(td_tensor_is_shared(t1));
    /* Let go before signalling, so the producer can exit with nothing pending. */
    td_value_release(v1);
    td_value_release(v2);
    td_mp_event_set(e);
    TD_CHECK_OK(td_mp_join(ctx, 100000));
    TD_CHECK(!td_mp_is_alive(ctx, 0));
    td_mp_context_release(ctx);
    td_mp_event_release(e);
    td_mp_queue_release(q);
}

static void sharing(td_mp_strategy s, int repeats, td_mp_start_method m)
{
    mpt_set_strategy(s);
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int i = 0; i < repeats; i++) {
        td_test_breadcrumb("repeat %d", i);
        test_fill(m, lc);
        test_receive(m, lc);
    }
    mpt_lc_end(lc);
}

/* _test_preserve_sharing: [x.storage(), x, x[2], x[:,1]] round trip in one process. */
static void preserve_sharing(td_mp_strategy s, int repeats)
{
    mpt_set_strategy(s);
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int r = 0; r < repeats; r++) {
        td_mp_queue *q;
        TD_CHECK_OK(td_mp_queue_new(0, &q));
        td_tensor *x = mpt_randn(5, 5), *row, *col, *bytes;
        TD_CHECK_OK(td_tensor_select(x, 0, 2, &row));
        TD_CHECK_OK(td_tensor_select(x, 1, 1, &col));
        td_storage *st = td_tensor_storage(x);
        /* A bare storage travels as a uint8 tensor over all of it. */
        TD_CHECK_OK(td_tensor_from_storage(st, 0, TD_UINT8, TD_SHAPE((int64_t)td_storage_nbytes(st)), NULL, &bytes));
        td_value *data = td_value_list_new();
        td_value_list_append(data, td_value_tensor(bytes));
        td_value_list_append(data, td_value_tensor(x));
        td_value_list_append(data, td_value_tensor(row));
        td_value_list_append(data, td_value_tensor(col));
        TD_CHECK_OK(td_mp_queue_put(q, data, 0));
        td_value *got;
        TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
        TD_CHECK(td_value_equal(got, data)); /* exact, atol = rtol = 0 */
        for (size_t i = 0; i < td_value_len(got); i++) {
            td_tensor *t = td_value_get_tensor(td_value_at(got, i));
            TD_CHECK(td_tensor_storage(t) == td_tensor_storage(x)); /* the very same storage object */
        }
        td_value_release(got);
        td_value_release(data);
        td_tensor_release(bytes);
        td_tensor_release(col);
        td_tensor_release(row);
        td_tensor_release(x);
        td_mp_queue_release(q);
    }
    mpt_lc_end(lc);
}

/* _test_pool: Pool(2).map(simple_pool_fill, 4 buffers, chunksize=1). */
static void pool(td_mp_strategy s, int repeats)
{
    mpt_set_strategy(s);
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int r = 0; r < repeats; r++) {
        td_mp_pool *p;
        TD_CHECK_OK(td_mp_pool_new(2, TD_MP_FORK, &p));
        for (int i = 0; i < 2; i++)
            td_mp_leak_checker_track(lc, td_mp_pool_pid(p, i));
        td_value *buffers = td_value_list_new();
        for (int i = 0; i < 4; i++) {
            td_tensor *t;
            TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(2, 2), &t));
            td_value_list_append(buffers, td_value_tensor(t));
            td_tensor_release(t);
        }
        td_value *results;
        TD_CHECK_OK(td_mp_pool_map(p, "simple_pool_fill", buffers, &results));
        TD_CHECK_EQ(td_value_len(results), 4);
        for (int i = 0; i < 4; i++) {
            TD_CHECK(mpt_all_equal(td_value_get_tensor(td_value_at(results, (size_t)i)), 5));
            TD_CHECK(mpt_all_equal(td_value_get_tensor(td_value_at(buffers, (size_t)i)), 4));
        }
        TD_CHECK_OK(td_mp_pool_close(p));
        TD_CHECK_OK(td_mp_pool_join(p, 100000));
        td_mp_pool_release(p);
        td_value_release(results);
        td_value_release(buffers);
    }
    mpt_lc_end(lc);
}

/* ---- cases -------------------------------------------------------------------------------- */

TD_TEST(fill, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    test_fill(TD_MP_FORK, lc);
    test_fill(TD_MP_SPAWN, lc);
    mpt_lc_end(lc);
}

TD_TEST(receive, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    test_receive(TD_MP_FORK, lc);
    test_receive(TD_MP_SPAWN, lc);
    mpt_lc_end(lc);
}

TD_TEST(fd_sharing, .timeout_s = 300) { sharing(TD_MP_FILE_DESCRIPTOR, REPEATS, TD_MP_FORK); }
TD_TEST(fd_preserve_sharing, .timeout_s = 120) { preserve_sharing(TD_MP_FILE_DESCRIPTOR, REPEATS); }
TD_TEST(fd_pool, .timeout_s = 300) { pool(TD_MP_FILE_DESCRIPTOR, REPEATS); }
TD_TEST(fs_sharing, .timeout_s = 300) { sharing(TD_MP_FILE_SYSTEM, REPEATS, TD_MP_FORK); }
TD_TEST(fs_preserve_sharing, .timeout_s = 120) { preserve_sharing(TD_MP_FILE_SYSTEM, REPEATS); }
TD_TEST(fs_pool, .timeout_s = 300) { pool(TD_MP_FILE_SYSTEM, REPEATS); }

/* test_fs: a file appears with the put and goes with the last release, 30 times. */
TD_TEST(fs, .timeout_s = 300)
{
    mpt_set_strategy(TD_MP_FILE_SYSTEM);
    td_mp_leak_checker *lc = mpt_lc_begin();
    pid_t self = getpid();
    td_mp_queue *q;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    for (int r = 0; r < REPEATS; r++) {
        td_tensor *x; /* DoubleStorage(4) */
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT64, TD_SHAPE(4), &x));
        TD_CHECK_EQ(mpt_wait_shm_entries(self, 0, 30000), 0);
        td_value *v = td_value_tensor(x);
        TD_CHECK_OK(td_mp_queue_put(q, v, 0));
        TD_CHECK_EQ(mpt_shm_entries(self), 1); /* put is synchronous: no sleep needed */
        td_value *got;
        TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
        TD_CHECK(td_tensor_storage(td_value_get_tensor(got)) == td_tensor_storage(x));
        td_value_release(got);
        td_value_release(v);
        td_tensor_release(x);
        TD_CHECK_EQ(mpt_shm_entries(self), 0); /* the last release removed it at once */
    }
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

/* test_inherit_tensor, and the copy-on-write case it implies. */
TD_TEST(inherit_tensor, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int shared = 1; shared >= 0; shared--) {
        td_tensor *t;
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(5, 5), &t));
        if (shared)
            TD_CHECK_OK(td_tensor_share_memory(t));
        td_value *v = td_value_tensor(t);
        td_mp_context *pc = start("add_three", v, TD_MP_FORK, lc);
        TD_CHECK_OK(td_mp_join(pc, 60000));
        td_mp_context_release(pc);
        /* Shared: the child's += 3 is seen. Not shared: the child wrote its private copy. */
        TD_CHECK(mpt_all_equal(t, shared ? 3 : 0));
        td_value_release(v);
        td_tensor_release(t);
    }
    mpt_lc_end(lc);
}

TD_TEST(empty_shared)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_tensor *t;
    TD_CHECK_OK(td_tensor_empty(TD_FLOAT32, TD_SHAPE(0), &t));
    TD_CHECK_OK(td_tensor_share_memory(t)); /* must not fail: nothing to map */
    TD_CHECK_EQ(mpt_shm_entries(getpid()), 0);
    /* test_empty_tensor_sharing: empty float32 and int64 round trip, no fd involved. */
    td_mp_queue *q;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    td_dtype dtypes[2] = {TD_FLOAT32, TD_INT64};
    for (int i = 0; i < 2; i++) {
        td_tensor *e;
        TD_CHECK_OK(td_tensor_empty(dtypes[i], TD_SHAPE(0), &e));
        td_value *v = td_value_tensor(e), *got;
        TD_CHECK_OK(td_mp_queue_put(q, v, 0));
        TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
        TD_CHECK(td_value_equal(v, got));
        td_value_release(got);
        td_value_release(v);
        td_tensor_release(e);
    }
    td_mp_queue_release(q);
    td_tensor_release(t);
    mpt_lc_end(lc);
}

static void is_shared(td_mp_strategy s)
{
    mpt_set_strategy(s);
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_tensor *t = mpt_randn(5, 5), *copy;
    TD_CHECK_OK(td_tensor_clone(t, &copy));
    TD_CHECK(!td_tensor_is_shared(t));
    void *before = td_tensor_data(t);
    TD_CHECK_OK(td_tensor_share_memory(t));
    TD_CHECK(td_tensor_is_shared(t));
    TD_CHECK(td_tensor_data(t) != before);
    TD_CHECK(td_tensor_equal(t, copy)); /* the bytes moved with it */
    void *after = td_tensor_data(t);
    TD_CHECK_OK(td_tensor_share_memory(t)); /* idempotent: no new mapping */
    TD_CHECK(td_tensor_data(t) == after);
    TD_CHECK_EQ(mpt_shm_entries(getpid()), s == TD_MP_FILE_SYSTEM ? 1 : 0);
    td_tensor_release(copy);
    td_tensor_release(t);
    mpt_lc_end(lc);
}

TD_TEST(is_shared) { is_shared(TD_MP_FILE_DESCRIPTOR); }
TD_TEST(fs_is_shared) { is_shared(TD_MP_FILE_SYSTEM); }

static void *other_thread(void *arg)
{
    td_set_thread_name("other");
    td_get_thread_name(arg, 16);
    return NULL;
}

TD_TEST(set_thread_name)
{
    char name[16], path[64], comm[32] = "";
    TD_CHECK_OK(td_set_thread_name("test name"));
    TD_CHECK_OK(td_get_thread_name(name, sizeof name));
    TD_CHECK_STR_EQ(name, "test name");
    TD_CHECK_OK(td_set_thread_name("a-twenty-char-name!!"));
    TD_CHECK_OK(td_get_thread_name(name, sizeof name));
    TD_CHECK_STR_EQ(name, "a-twenty-char-n"); /* 15 characters kept */
    snprintf(path, sizeof path, "/proc/self/task/%ld/comm", (long)syscall(SYS_gettid));
    FILE *f = fopen(path, "r");
    TD_CHECK(f && fgets(comm, sizeof comm, f));
    fclose(f);
    comm[strcspn(comm, "\n")] = '\0';
    TD_CHECK_STR_EQ(comm, "a-twenty-char-n");
    TD_CHECK_ERR(td_set_thread_name(NULL), TD_ERR_INVALID, "NULL");
    /* Per thread: another thread keeps its own name. */
    pthread_t th;
    char seen[16] = "";
    pthread_create(&th, NULL, other_thread, seen);
    pthread_join(th, NULL);
    TD_CHECK_STR_EQ(seen, "other");
    TD_CHECK_OK(td_get_thread_name(name, sizeof name));
    TD_CHECK_STR_EQ(name, "a-twenty-char-n");
}

/* ---- send_many: 100,000 int64 tensors through a chain of three processes (20,000 under TSan) ---- */

#ifdef TDIST_TSAN
#define SEND_MANY_COUNT 20000 /* the same chain, a fifth as long: ThreadSanitizer is ~10x slower */
#else
#define SEND_MANY_COUNT 100000
#endif

/* send_and_delete_tensors(q1, e1, count) */
TD_MP_ENTRY(send_and_delete)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 1));
    int64_t count = td_value_get_int(td_value_at(args, 2));
    for (int64_t i = 0; i < count; i++) {
        td_tensor *t;
        E_OK(td_tensor_full(TD_INT64, TD_SHAPE(5), (double)i, &t));
        td_value *v = td_value_tensor(t);
        td_tensor_release(t);
        td_status st = td_mp_queue_put(q, v, 0);
        td_value_release(v); /* del t */
        E_OK(st);
    }
    E_OK(td_mp_queue_close(q));
    return td_mp_event_wait(e, 0);
}

/* receive_and_send(q1, q2, e2, count): forwards a clone of each */
TD_MP_ENTRY(receive_and_send)
{
    td_mp_queue *in = td_mp_value_queue(td_value_at(args, 0)), *out = td_mp_value_queue(td_value_at(args, 1));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 2));
    int64_t count = td_value_get_int(td_value_at(args, 3));
    for (int64_t i = 0; i < count; i++) {
        td_value *v, *c;
        E_OK(td_mp_queue_get(in, 0, &v));
        td_tensor *clone;
        td_status st = td_tensor_clone(td_value_get_tensor(v), &clone);
        td_value_release(v);
        E_OK(st);
        c = td_value_tensor(clone);
        td_tensor_release(clone);
        st = td_mp_queue_put(out, c, 0);
        td_value_release(c);
        E_OK(st);
    }
    E_OK(td_mp_queue_close(out));
    return td_mp_event_wait(e, 0);
}

/* receive_and_send_sum(q2, q3, e3, count): s = zeros(5) int64; s += each; put s */
TD_MP_ENTRY(receive_and_send_sum)
{
    td_mp_queue *in = td_mp_value_queue(td_value_at(args, 0)), *out = td_mp_value_queue(td_value_at(args, 1));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 2));
    int64_t count = td_value_get_int(td_value_at(args, 3));
    td_tensor *s;
    E_OK(td_tensor_zeros(TD_INT64, TD_SHAPE(5), &s));
    int64_t *acc = td_tensor_data(s);
    for (int64_t i = 0; i < count; i++) {
        td_value *v;
        E_OK(td_mp_queue_get(in, 0, &v));
        const int64_t *p = td_tensor_data(td_value_get_tensor(v));
        for (int k = 0; k < 5; k++)
            acc[k] += p[k];
        td_value_release(v);
    }
    td_value *sv = td_value_tensor(s);
    td_tensor_release(s);
    td_status st = td_mp_queue_put(out, sv, 0);
    td_value_release(sv);
    E_OK(st);
    E_OK(td_mp_queue_close(out));
    return td_mp_event_wait(e, 0);
}

TD_TEST(send_many, .timeout_s = 600)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_queue *q1, *q2, *q3;
    td_mp_event *e1, *e2, *e3;
    TD_CHECK_OK(td_mp_queue_new(0, &q1));
    TD_CHECK_OK(td_mp_queue_new(0, &q2));
    TD_CHECK_OK(td_mp_queue_new(0, &q3));
    TD_CHECK_OK(td_mp_event_new(&e1));
    TD_CHECK_OK(td_mp_event_new(&e2));
    TD_CHECK_OK(td_mp_event_new(&e3));
    td_value *a1 = td_value_tuple_of(3, td_mp_queue_value(q1), td_mp_event_value(e1), td_value_int(SEND_MANY_COUNT));
    td_value *a2 = td_value_tuple_of(4, td_mp_queue_value(q1), td_mp_queue_value(q2), td_mp_event_value(e2),
                                     td_value_int(SEND_MANY_COUNT));
    td_value *a3 = td_value_tuple_of(4, td_mp_queue_value(q2), td_mp_queue_value(q3), td_mp_event_value(e3),
                                     td_value_int(SEND_MANY_COUNT));
    td_mp_context *p1 = start("send_and_delete", a1, TD_MP_SPAWN, lc);
    td_mp_context *p2 = start("receive_and_send", a2, TD_MP_SPAWN, lc);
    td_mp_context *p3 = start("receive_and_send_sum", a3, TD_MP_SPAWN, lc);
    td_value *result;
    td_status st = td_mp_queue_get(q3, 500000, &result);
    if (st != TD_OK) { /* say which process failed rather than only that nothing came */
        TD_CHECK_OK(td_mp_join(p1, TD_MP_NO_WAIT));
        TD_CHECK_OK(td_mp_join(p2, TD_MP_NO_WAIT));
        TD_CHECK_OK(td_mp_join(p3, TD_MP_NO_WAIT));
        TD_CHECK_OK(st);
    }
    td_tensor *r = td_value_get_tensor(result);
    TD_CHECK(r && td_tensor_dtype(r) == TD_INT64);
    const int64_t want = (int64_t)SEND_MANY_COUNT * (SEND_MANY_COUNT - 1) / 2; /* 4999950000: needs int64 */
    TD_CHECK(mpt_all_equal(r, (double)want));
    int64_t first;
    TD_CHECK_OK(td_tensor_get_i64(r, (int64_t[]){0}, &first));
    TD_CHECK_EQ(first, want);
    td_value_release(result);
    td_mp_event_set(e1);
    td_mp_event_set(e2);
    td_mp_event_set(e3);
    TD_CHECK_OK(td_mp_join(p1, 60000));
    TD_CHECK_OK(td_mp_join(p2, 60000));
    TD_CHECK_OK(td_mp_join(p3, 60000));
    td_mp_context_release(p1);
    td_mp_context_release(p2);
    td_mp_context_release(p3);
    td_value_release(a1);
    td_value_release(a2);
    td_value_release(a3);
    td_mp_event_release(e1);
    td_mp_event_release(e2);
    td_mp_event_release(e3);
    td_mp_queue_release(q1);
    td_mp_queue_release(q2);
    td_mp_queue_release(q3);
    mpt_lc_end(lc);
}
