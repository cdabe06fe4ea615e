/* The mp cases beyond the seed (spec/multiprocessing.md section 7 and the "C tests" items of its
 * groups): strategy configuration, the daemon's cleanup after a SIGKILL, the refcount header, the
 * fd limit and a full /dev/shm as clean errors, pools whose tasks fail or whose workers die,
 * td_mp_spawn's failure reports and start methods, fork-safety errors, bounded queues, backlogs,
 * spilled messages, the identity cache's bound, and hostile messages. Every case runs inside the
 * mp leak checker. */
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/clock.h"
#include "mp/message.h"
#include "mp/share.h"
#include "mp/shm_manager.h"
#include "mp_util.h"

static td_mp_context *start_n(const char *entry, td_value *args, int n, td_mp_start_method m, td_mp_leak_checker *lc)
{
    td_mp_context *pc = NULL;
    td_mp_spawn_opts o = {.entry = entry, .args = args, .nprocs = n, .method = m, .daemon = true};
    TD_CHECK_OK(td_mp_spawn(&o, &pc));
    for (int i = 0; lc && i < n; i++)
        td_mp_leak_checker_track(lc, td_mp_context_pid(pc, i));
    return pc;
}

static td_value *tensor_value(td_tensor *t)
{
    td_value *v = td_value_tensor(t);
    td_tensor_release(t);
    return v;
}

/* ---- strategies --------------------------------------------------------------------------- */

TD_MP_ENTRY(report_strategy)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_value *v = td_value_string(td_mp_strategy_name(td_mp_get_sharing_strategy()));
    td_status st = td_mp_queue_put(q, v, 0);
    td_value_release(v);
    return st;
}

/* Receives under its own (default) strategy whatever the parent sent, writes 7 into it. */
TD_MP_ENTRY(receive_and_write)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *done = td_mp_value_event(td_value_at(args, 1));
    E_CHECK(td_mp_get_sharing_strategy() == TD_MP_FILE_DESCRIPTOR);
    td_value *v;
    E_OK(td_mp_queue_get(q, 30000, &v));
    td_status st = td_tensor_fill(td_value_get_tensor(v), 7);
    td_value_release(v);
    E_OK(st);
    td_mp_event_set(done);
    return TD_OK;
}

TD_TEST(strategy_config, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    TD_CHECK_EQ(td_mp_get_sharing_strategy(), TD_MP_FILE_DESCRIPTOR); /* Linux default */
    TD_CHECK_EQ(td_mp_all_sharing_strategies(), (1u << TD_MP_FILE_DESCRIPTOR) | (1u << TD_MP_FILE_SYSTEM));
    TD_CHECK_ERR(td_mp_set_sharing_strategy((td_mp_strategy)7), TD_ERR_INVALID, "file_descriptor and file_system");
    td_mp_strategy s;
    TD_CHECK_OK(td_mp_strategy_from_name("file_system", &s));
    TD_CHECK_EQ(s, TD_MP_FILE_SYSTEM);
    TD_CHECK_ERR(td_mp_strategy_from_name("shared", &s), TD_ERR_INVALID, "unknown sharing strategy 'shared'");
    TD_CHECK_STR_EQ(td_mp_strategy_name(TD_MP_FILE_DESCRIPTOR), "file_descriptor");
    TD_CHECK_OK(td_mp_set_sharing_strategy(TD_MP_FILE_SYSTEM));
    TD_CHECK_EQ(td_mp_get_sharing_strategy(), TD_MP_FILE_SYSTEM);

    /* A forked child inherits the setting; a spawned one starts from the environment. */
    td_mp_queue *q;
    td_mp_event *done;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&done));
    td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(done));
    const char *want[2] = {"file_system", "file_descriptor"};
    for (int m = 0; m < 2; m++) {
        td_mp_context *pc = start_n("report_strategy", args, 1, (td_mp_start_method)m, lc);
        td_value *v;
        TD_CHECK_OK(td_mp_queue_get(q, 30000, &v));
        TD_CHECK_STR_EQ(td_value_get_string(v, NULL), want[m]);
        td_value_release(v);
        TD_CHECK_OK(td_mp_join(pc, 30000));
        td_mp_context_release(pc);
    }
    /* Sent under file_system, received by a process set to file_descriptor: the message says. */
    td_tensor *t;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(3), &t));
    td_value *tv = td_value_tensor(t);
    td_mp_context *pc = start_n("receive_and_write", args, 1, TD_MP_SPAWN, lc);
    TD_CHECK_OK(td_mp_queue_put(q, tv, 0));
    TD_CHECK_OK(td_mp_event_wait(done, 30000));
    TD_CHECK(mpt_all_equal(t, 7));
    TD_CHECK_OK(td_mp_join(pc, 30000));
    td_mp_context_release(pc);
    td_value_release(tv);
    td_tensor_release(t);
    td_value_release(args);
    td_mp_event_release(done);
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

/* ---- file_system: refcount header and the daemon ------------------------------------------ */

static int32_t refcount_of(td_tensor *t)
{
    const td_segment *seg = shm_segment_of(td_tensor_storage(t));
    return seg ? atomic_load(&((td_shm_header *)seg->base)->refcount) : -1;
}

TD_MP_ENTRY(hold_and_report)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *go = td_mp_value_event(td_value_at(args, 1));
    td_mp_queue *r = td_mp_value_queue(td_value_at(args, 2));
    td_value *v;
    E_OK(td_mp_queue_get(q, 30000, &v));
    td_value *back = td_value_int(refcount_of(td_value_get_tensor(v)));
    td_status st = td_mp_queue_put(r, back, 0);
    td_value_release(back);
    E_OK(st);
    st = td_mp_event_wait(go, 60000); /* hold it until the parent has looked */
    td_value_release(v);
    return st;
}

TD_TEST(fs_refcount_header, .timeout_s = 120)
{
    mpt_set_strategy(TD_MP_FILE_SYSTEM);
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_queue *q;
    td_mp_event *go;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&go));
    td_tensor *t;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(5, 5), &t));
    td_value *v = td_value_tensor(t);
    TD_CHECK_OK(td_tensor_share_memory(t));
    TD_CHECK_EQ(refcount_of(t), 1);
    TD_CHECK_OK(td_mp_queue_put(q, v, 0));
    TD_CHECK_EQ(refcount_of(t), 2); /* the message in flight holds one */
    td_value *got;
    TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
    TD_CHECK_EQ(refcount_of(t), 1); /* received by its holder: the in-flight one is dropped */
    td_value_release(got);
    /* One remote receiver holding it: 2. */
    td_mp_queue *r;
    TD_CHECK_OK(td_mp_queue_new(0, &r));
    td_value *args = td_value_tuple_of(3, td_mp_queue_value(q), td_mp_event_value(go), td_mp_queue_value(r));
    td_mp_context *pc = start_n("hold_and_report", args, 1, TD_MP_SPAWN, lc);
    TD_CHECK_OK(td_mp_queue_put(q, v, 0));
    TD_CHECK_OK(td_mp_queue_get(r, 30000, &got));
    int64_t seen = td_value_get_int(got);
    td_value_release(got);
    TD_CHECK_EQ(seen, 2);
    TD_CHECK_EQ(refcount_of(t), 2);
    td_mp_event_set(go);
    TD_CHECK_OK(td_mp_join(pc, 30000));
    TD_CHECK_EQ(refcount_of(t), 1);
    td_mp_context_release(pc);
    td_value_release(args);
    td_value_release(v);
    td_tensor_release(t);
    TD_CHECK_EQ(mpt_shm_entries(getpid()), 0);
    td_mp_event_release(go);
    td_mp_queue_release(r);
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

/* Shares three file_system storages, reports the daemon's pid, and waits to be killed. */
TD_MP_ENTRY(hold_fs_segments)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0));
    td_mp_event *never = td_mp_value_event(td_value_at(args, 1));
    E_CHECK(td_mp_get_sharing_strategy() == TD_MP_FILE_SYSTEM);
    td_tensor *t[3];
    for (int i = 0; i < 3; i++) {
        E_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(100), &t[i]));
        E_OK(td_tensor_share_memory(t[i]));
    }
    td_value *pid = td_value_int(shmm_daemon_pid());
    E_OK(td_mp_queue_put(q, pid, 0));
    td_value_release(pid);
    return td_mp_event_wait(never, 0);
}

static bool process_gone(pid_t pid)
{
    if (kill(pid, 0) != 0)
        return errno == ESRCH;
    char path[64], buf[512] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (!f)
        return true;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return p && p[1] == ' ' && p[2] == 'Z'; /* a zombie nobody reaps has exited all the same */
}

TD_TEST(fs_daemon_cleans_after_sigkill, .timeout_s = 120)
{
    /* A daemon of this test's own, so that its exit can be watched. */
    char sock[64];
    snprintf(sock, sizeof sock, "tdist-test-shm-manager.%d", (int)getpid());
    setenv(TD_SHMM_SOCKET_ENV, sock, 1);
    setenv("TDIST_SHARING_STRATEGY", "file_system", 1); /* the spawned child reads it */
    mpt_set_strategy(TD_MP_FILE_SYSTEM);
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_queue *q;
    td_mp_event *never;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_event_new(&never));
    td_value *args = td_value_tuple_of(2, td_mp_queue_value(q), td_mp_event_value(never));
    td_mp_context *pc = start_n("hold_fs_segments", args, 1, TD_MP_SPAWN, lc);
    pid_t child = td_mp_context_pid(pc, 0);
    td_value *v;
    TD_CHECK_OK(td_mp_queue_get(q, 30000, &v));
    pid_t daemon = (pid_t)td_value_get_int(v);
    td_value_release(v);
    TD_CHECK(daemon > 0);
    TD_CHECK_EQ(mpt_shm_entries(child), 3);
    kill(child, SIGKILL);
    TD_CHECK_ERR(td_mp_join(pc, 30000), TD_ERR_REMOTE, "process 0 terminated with signal SIGKILL");
    /* The daemon saw the connection drop with three references held: gone within 30 s (in
     * practice at once). */
    TD_CHECK_EQ(mpt_wait_shm_entries(child, 0, 30000), 0);
    /* And, its last client gone, it exits after its idle time (2 s). */
    int64_t deadline = deadline_after_ms(30000);
    while (!process_gone(daemon) && !deadline_passed(deadline))
        clock_sleep_ms(50);
    TD_CHECK_MSG(process_gone(daemon), "tdist-shm-manager (pid %d) still runs 30 s after its last client left",
                 (int)daemon);
    td_mp_context_release(pc);
    td_value_release(args);
    td_mp_event_release(never);
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

/* ---- resource limits ---------------------------------------------------------------------- */

static int count_open_fds(void)
{
    int n = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            n++;
    return n;
}

TD_TEST(fd_limit_is_a_clean_error, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    struct rlimit old;
    getrlimit(RLIMIT_NOFILE, &old);
    /* Sending side: share storages until the fds run out. */
    int highest = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            highest = fd;
    struct rlimit low = {.rlim_cur = (rlim_t)highest + 9, .rlim_max = old.rlim_max};
    TD_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    td_tensor *t[64];
    int n = 0;
    td_status st = TD_OK;
    while (n < 64) {
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(16), &t[n]));
        st = td_tensor_share_memory(t[n]);
        n++;
        if (st != TD_OK)
            break;
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "%s", td_last_error());
    setrlimit(RLIMIT_NOFILE, &old);
    TD_CHECK_EQ(st, TD_ERR_IO);
    TD_CHECK_CONTAINS(msg, "out of file descriptors");
    TD_CHECK_CONTAINS(msg, "file_system strategy");
    TD_CHECK(!td_tensor_is_shared(t[n - 1])); /* unchanged by the failure */
    for (int i = 0; i < n; i++)
        td_tensor_release(t[i]);

    /* Receiving side: a message with 10 fds for a process that can open only a few more. */
    td_mp_queue *q;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    td_value *list = td_value_list_new();
    for (int i = 0; i < 10; i++) {
        td_tensor *x;
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(4), &x));
        td_value_list_append(list, tensor_value(x));
    }
    TD_CHECK_OK(td_mp_queue_put(q, list, 0));
    td_value_release(list); /* the 10 segments now live only in the message */
    highest = 0;
    for (int fd = 0; fd < 4096; fd++)
        if (fcntl(fd, F_GETFD) >= 0)
            highest = fd;
    low.rlim_cur = (rlim_t)highest + 4;
    TD_CHECK(setrlimit(RLIMIT_NOFILE, &low) == 0);
    td_value *got = NULL;
    st = td_mp_queue_get(q, 5000, &got);
    snprintf(msg, sizeof msg, "%s", td_last_error());
    setrlimit(RLIMIT_NOFILE, &old);
    TD_CHECK_EQ(st, TD_ERR_IO);
    TD_CHECK_CONTAINS(msg, "without some of its file descriptors");
    TD_CHECK(got == NULL);
    (void)count_open_fds;
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

/* In a private mount namespace with a 1 MiB /dev/shm: sharing more fails with ENOSPC, not SIGBUS. */
TD_MP_ENTRY(small_dev_shm)
{
    E_CHECK(unshare(CLONE_NEWNS) == 0);
    E_CHECK(mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) == 0);
    E_CHECK(mount("tmpfs", "/dev/shm", "tmpfs", 0, "size=1m") == 0);
    for (int s = 0; s < 2; s++) {
        E_OK(td_mp_set_sharing_strategy((td_mp_strategy)s));
        td_tensor *a, *b;
        E_OK(td_tensor_ones(TD_UINT8, TD_SHAPE(512 * 1024), &a));
        E_OK(td_tensor_ones(TD_UINT8, TD_SHAPE(768 * 1024), &b));
        E_OK(td_tensor_share_memory(a)); /* fits */
        td_status st = td_tensor_share_memory(b);
        E_CHECK(st == TD_ERR_NOMEM);
        E_CHECK(strstr(td_last_error(), "No space left on device") != NULL);
        E_CHECK(strstr(td_last_error(), "/dev/shm is full") != NULL);
        E_CHECK(!td_tensor_is_shared(b) && mpt_all_equal(b, 1)); /* still usable */
        td_tensor_release(a);
        td_tensor_release(b);
    }
    return TD_OK;
}

TD_TEST(dev_shm_full_is_a_clean_error, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    /* Root (or a user namespace) gets a real, tiny /dev/shm; elsewhere a segment larger than the
     * whole of /dev/shm, which tmpfs refuses up front. */
    pid_t probe = fork();
    if (probe == 0)
        _exit(unshare(CLONE_NEWNS) == 0 ? 0 : 1);
    int status;
    waitpid(probe, &status, 0);
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
        td_mp_context *pc = start_n("small_dev_shm", NULL, 1, TD_MP_FORK, lc);
        TD_CHECK_OK(td_mp_join(pc, 60000));
        td_mp_context_release(pc);
    } else {
        struct statvfs vfs;
        TD_CHECK(statvfs("/dev/shm", &vfs) == 0);
        uint64_t total = (uint64_t)vfs.f_blocks * vfs.f_frsize + (64u << 20);
        td_storage *s;
        TD_CHECK_OK(td_storage_new(0, &s));
        td_segment seg;
        TD_CHECK_ERR(segment_create("big", total, true, true, &seg), TD_ERR_NOMEM, "No space left on device");
        td_storage_release(s);
    }
    mpt_lc_end(lc);
}

/* ---- pools -------------------------------------------------------------------------------- */

TD_MP_ENTRY(square_or_fail)
{
    int64_t x = td_value_get_int(args);
    if (x == 2)
        return error_fmt(TD_ERR_INVALID, "ValueError: no twos here");
    *result = td_value_int(x * x);
    return TD_OK;
}

TD_MP_ENTRY(die_in_task)
{
    if (td_value_get_int(args) == 3)
        _exit(3);
    *result = td_value_none();
    return TD_OK;
}

TD_TEST(pool_task_fails, .timeout_s = 180)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int m = 0; m < 2; m++) {
        td_mp_pool *p;
        TD_CHECK_OK(td_mp_pool_new(3, (td_mp_start_method)m, &p));
        for (int i = 0; i < 3; i++)
            td_mp_leak_checker_track(lc, td_mp_pool_pid(p, i));
        td_value *args = td_value_list_new(), *res = NULL;
        for (int i = 0; i < 6; i++)
            td_value_list_append(args, td_value_int(i));
        TD_CHECK_ERR(td_mp_pool_map(p, "square_or_fail", args, &res), TD_ERR_REMOTE, "task 2 (square_or_fail)");
        TD_CHECK_CONTAINS(td_last_error(), "ValueError: no twos here");
        TD_CHECK(res == NULL);
        /* The pool survives a failing task, and results keep their order. */
        td_value *ok = td_value_list_new();
        for (int i = 10; i > 0; i--)
            td_value_list_append(ok, td_value_int(i == 2 ? 1 : i));
        TD_CHECK_OK(td_mp_pool_map(p, "square_or_fail", ok, &res));
        for (size_t i = 0; i < 10; i++) {
            int64_t x = td_value_get_int(td_value_at(ok, i));
            TD_CHECK_EQ(td_value_get_int(td_value_at(res, i)), x * x);
        }
        td_value_release(res);
        TD_CHECK_ERR(td_mp_pool_map(p, "no_such_entry", ok, &res), TD_ERR_NOT_FOUND, "no_such_entry");
        td_value_release(ok);
        /* A worker that dies fails the call instead of hanging it. */
        TD_CHECK_ERR(td_mp_pool_map(p, "die_in_task", args, &res), TD_ERR_PEER_LOST, "exited (exit code 3)");
        TD_CHECK_ERR(td_mp_pool_map(p, "square_or_fail", args, &res), TD_ERR_CLOSED, "Pool not running");
        td_mp_pool_terminate(p);
        td_mp_pool_release(p);
        td_value_release(args);
    }
    mpt_lc_end(lc);
}

/* ---- spawn and processes ------------------------------------------------------------------ */

TD_MP_ENTRY(fail_with_message)
{
    if (rank == 1)
        return error_fmt(TD_ERR_INVALID, "rank %d says no", rank);
    clock_sleep_ms(60000); /* the others are terminated when rank 1 fails */
    return TD_OK;
}

TD_MP_ENTRY(exit_code) { _exit((int)td_value_get_int(args)); }

TD_MP_ENTRY(sleep_long)
{
    clock_sleep_ms(60000);
    return TD_OK;
}

/* Writes its rank into slot `rank` of a shared tensor given in the arguments. */
TD_MP_ENTRY(write_rank)
{
    td_tensor *t = td_value_get_tensor(td_value_at(args, 0));
    td_mp_event *e = td_mp_value_event(td_value_at(args, 1));
    E_CHECK(t && e && td_tensor_is_shared(t));
    E_OK(td_mp_event_wait(e, 30000)); /* set by the parent before starting us */
    return td_tensor_set_i64(t, (int64_t[]){rank}, rank + 100);
}

TD_TEST(spawn_reports_failures, .timeout_s = 180)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int m = 0; m < 2; m++) {
        td_mp_context *pc = start_n("fail_with_message", NULL, 3, (td_mp_start_method)m, lc);
        TD_CHECK_ERR(td_mp_join(pc, 60000), TD_ERR_REMOTE,
                     "\n\n-- Process 1 terminated with the following error:\n");
        TD_CHECK_CONTAINS(td_last_error(), "rank 1 says no");
        TD_CHECK(!td_mp_is_alive(pc, 0) && !td_mp_is_alive(pc, 2)); /* the others were terminated */
        TD_CHECK_ERR(td_mp_join(pc, 1000), TD_ERR_REMOTE, "Process 1"); /* and it stays failed */
        td_mp_context_release(pc);

        td_value *three = td_value_int(3);
        pc = start_n("exit_code", three, 1, (td_mp_start_method)m, lc);
        TD_CHECK_ERR(td_mp_join(pc, 60000), TD_ERR_REMOTE, "process 0 terminated with exit code 3");
        int code;
        TD_CHECK_OK(td_mp_exitcode(pc, 0, &code));
        TD_CHECK_EQ(code, 3);
        td_mp_context_release(pc);
        td_value_release(three);

        pc = start_n("sleep_long", NULL, 2, (td_mp_start_method)m, lc);
        TD_CHECK_ERR(td_mp_join(pc, 100), TD_ERR_TIMEOUT, "2 of 2 processes still running");
        TD_CHECK(td_mp_is_alive(pc, 1));
        TD_CHECK_ERR(td_mp_exitcode(pc, 1, &code), TD_ERR_TIMEOUT, "still running");
        kill(td_mp_context_pid(pc, 1), SIGKILL);
        TD_CHECK_ERR(td_mp_join(pc, 60000), TD_ERR_REMOTE, "process 1 terminated with signal SIGKILL");
        td_mp_context_release(pc);
    }
    td_mp_spawn_opts bad = {.entry = "not_registered"};
    td_mp_context *pc;
    TD_CHECK_ERR(td_mp_spawn(&bad, &pc), TD_ERR_NOT_FOUND, "no entry point named 'not_registered'");
    mpt_lc_end(lc);
}

TD_TEST(spawn_args_by_handle, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    for (int m = 0; m < 2; m++) {
        td_tensor *t;
        td_mp_event *e;
        TD_CHECK_OK(td_tensor_zeros(TD_INT64, TD_SHAPE(4), &t));
        TD_CHECK_OK(td_tensor_share_memory(t)); /* fork: must be shared to be seen (spawn shares it anyway) */
        TD_CHECK_OK(td_mp_event_new(&e));
        td_value *args = td_value_tuple_of(2, td_value_tensor(t), td_mp_event_value(e));
        td_mp_event_set(e);
        td_mp_context *pc = start_n("write_rank", args, 4, (td_mp_start_method)m, lc);
        TD_CHECK_OK(td_mp_join(pc, 60000));
        for (int i = 0; i < 4; i++) {
            int64_t x;
            TD_CHECK_OK(td_tensor_get_i64(t, (int64_t[]){i}, &x));
            TD_CHECK_EQ(x, i + 100);
        }
        td_mp_context_release(pc);
        td_value_release(args);
        td_mp_event_release(e);
        td_tensor_release(t);
    }
    mpt_lc_end(lc);
}

/* ---- fork safety -------------------------------------------------------------------------- */

TD_TEST(fork_safety, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_pool *p;
    TD_CHECK_OK(td_mp_pool_new(1, TD_MP_FORK, &p));
    td_mp_leak_checker_track(lc, td_mp_pool_pid(p, 0));
    td_mp_queue *q;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        /* The pool's workers belong to the parent: a clear error, not a hang. */
        td_value *args = td_value_list_new(), *res;
        td_status st = td_mp_pool_map(p, "square_or_fail", args, &res);
        int code = st == TD_ERR_UNSUPPORTED && strstr(td_last_error(), "forked child") ? 0 : 1;
        /* A queue (no threads of its own) keeps working in the child. */
        td_value *v = td_value_int(42);
        if (td_mp_queue_put(q, v, 0) != TD_OK)
            code = 2;
        _exit(code);
    }
    int status;
    waitpid(pid, &status, 0);
    TD_CHECK_EQ(WIFEXITED(status) ? WEXITSTATUS(status) : -1, 0);
    td_value *v;
    TD_CHECK_OK(td_mp_queue_get(q, 10000, &v));
    TD_CHECK_EQ(td_value_get_int(v), 42);
    td_value_release(v);
    td_mp_queue_release(q);
    TD_CHECK_OK(td_mp_pool_close(p));
    TD_CHECK_OK(td_mp_pool_join(p, 30000));
    td_mp_pool_release(p);
    mpt_lc_end(lc);
}

/* ---- queues ------------------------------------------------------------------------------- */

TD_TEST(queue_bounded_and_timeouts, .timeout_s = 120)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_queue *q;
    TD_CHECK_ERR(td_mp_queue_new(-1, &q), TD_ERR_INVALID, "maxsize");
    TD_CHECK_OK(td_mp_queue_new(2, &q));
    td_value *v = td_value_int(1), *got;
    TD_CHECK_ERR(td_mp_queue_get(q, 50, &got), TD_ERR_TIMEOUT, "stayed empty for 50 ms");
    TD_CHECK(td_mp_queue_empty(q) && !td_mp_queue_full(q));
    TD_CHECK_OK(td_mp_queue_put(q, v, 0));
    TD_CHECK_OK(td_mp_queue_put(q, v, 0));
    TD_CHECK(td_mp_queue_full(q) && !td_mp_queue_empty(q));
    TD_CHECK_EQ(td_mp_queue_size(q), 2);
    TD_CHECK_ERR(td_mp_queue_put(q, v, 50), TD_ERR_TIMEOUT, "the queue is full (maxsize 2)");
    TD_CHECK_ERR(td_mp_queue_put(q, v, TD_MP_NO_WAIT), TD_ERR_TIMEOUT, "full");
    TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
    td_value_release(got);
    TD_CHECK_OK(td_mp_queue_put(q, v, 1000)); /* a slot came free */
    for (int i = 0; i < 2; i++) {
        TD_CHECK_OK(td_mp_queue_get(q, 1000, &got));
        td_value_release(got);
    }
    TD_CHECK_OK(td_mp_queue_close(q));
    TD_CHECK_ERR(td_mp_queue_put(q, v, 0), TD_ERR_CLOSED, "closed");
    td_value_release(v);
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

TD_MP_ENTRY(drain_in_order)
{
    td_mp_queue *q = td_mp_value_queue(td_value_at(args, 0)), *out = td_mp_value_queue(td_value_at(args, 1));
    int64_t n = td_value_get_int(td_value_at(args, 2));
    int64_t sum = 0;
    for (int64_t i = 0; i < n; i++) {
        td_value *v;
        E_OK(td_mp_queue_get(q, 60000, &v));
        td_tensor *t = td_value_get_tensor(td_value_at(v, 0));
        E_CHECK(td_value_get_int(td_value_at(v, 1)) == i); /* FIFO */
        sum += ((int64_t *)td_tensor_data(t))[0];
        td_value_release(v);
    }
    td_value *s = td_value_int(sum);
    td_status st = td_mp_queue_put(out, s, 0);
    td_value_release(s);
    return st;
}

TD_TEST(queue_backlog_and_spill, .timeout_s = 180)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_queue *q, *out;
    TD_CHECK_OK(td_mp_queue_new(0, &q));
    TD_CHECK_OK(td_mp_queue_new(0, &out));
    /* More messages than the socket holds, with nobody reading yet: put never blocks for long;
     * the rest waits in this process (the feeder) and arrives in order. */
    const int n = 3000;
    td_value *args = td_value_tuple_of(3, td_mp_queue_value(q), td_mp_queue_value(out), td_value_int(n));
    int64_t want = 0;
    td_mp_context *pc = NULL;
    for (int i = 0; i < n; i++) {
        td_tensor *t;
        TD_CHECK_OK(td_tensor_full(TD_INT64, TD_SHAPE(2), i, &t));
        td_value *v = td_value_tuple_of(2, tensor_value(t), td_value_int(i));
        TD_CHECK_OK(td_mp_queue_put(q, v, 0));
        td_value_release(v);
        want += i;
        if (i == 2000) /* start the reader only now: the feeder must hold part of the backlog */
            pc = start_n("drain_in_order", args, 1, TD_MP_SPAWN, lc);
    }
    td_value *sum;
    TD_CHECK_OK(td_mp_queue_get(out, 120000, &sum));
    TD_CHECK_EQ(td_value_get_int(sum), want);
    td_value_release(sum);
    TD_CHECK_OK(td_mp_join(pc, 60000));
    td_mp_context_release(pc);
    td_value_release(args);

    /* A value larger than a datagram travels in a segment. */
    char *big = malloc(1 << 20);
    memset(big, 'x', 1 << 20);
    td_value *bv = td_value_tuple_of(2, td_value_bytes(big, 1 << 20), td_value_string("tail")), *got;
    TD_CHECK_OK(td_mp_queue_put(q, bv, 0));
    TD_CHECK_OK(td_mp_queue_get(q, 10000, &got));
    TD_CHECK(td_value_equal(got, bv));
    td_value_release(got);
    td_value_release(bv);
    free(big);

    /* A queue travels inside a message, and works on the other side. */
    td_value *qv = td_mp_queue_value(out);
    TD_CHECK_OK(td_mp_queue_put(q, qv, 0));
    TD_CHECK_OK(td_mp_queue_get(q, 10000, &got));
    td_mp_queue *out2 = td_mp_value_queue(got);
    TD_CHECK(out2 != NULL);
    td_value *x = td_value_string("through the copy");
    TD_CHECK_OK(td_mp_queue_put(out2, x, 0));
    td_value_release(x);
    td_value_release(got);
    td_value_release(qv);
    TD_CHECK_OK(td_mp_queue_get(out, 10000, &got));
    TD_CHECK_STR_EQ(td_value_get_string(got, NULL), "through the copy");
    td_value_release(got);
    td_mp_queue_release(out);
    td_mp_queue_release(q);
    mpt_lc_end(lc);
}

TD_TEST(cache_stays_bounded)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    size_t base = shm_cache_size();
    for (int i = 0; i < 300; i++) {
        td_tensor *t;
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(8), &t));
        TD_CHECK_OK(td_tensor_share_memory(t));
        TD_CHECK_EQ(shm_cache_size(), base + 1);
        td_tensor_release(t);
    }
    TD_CHECK_EQ(shm_cache_size(), base);
    mpt_lc_end(lc);
}

/* Hostile messages: every failure is TD_ERR_INVALID, fds are closed, nothing crashes. */
TD_TEST(hostile_messages)
{
    td_mp_leak_checker *lc = mpt_lc_begin();
    td_mp_msg m;
    td_tensor *t;
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(3), &t));
    td_value *v = td_value_list_new();
    td_value_list_append(v, tensor_value(t));
    td_value_list_append(v, td_value_record_of(TD_REC_MP_TENSOR, 1, td_value_int(0)));
    TD_CHECK_ERR(mp_msg_encode(v, &m), TD_ERR_INVALID, "reserved");
    mp_msg_free(&m);
    td_value_release(v);
    v = td_value_dict_new();
    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(3), &t));
    td_value_dict_set(v, tensor_value(t), td_value_int(1));
    TD_CHECK_ERR(mp_msg_encode(v, &m), TD_ERR_UNSUPPORTED, "dict keyed by tensors");
    mp_msg_free(&m);
    td_value_release(v);

    TD_CHECK_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(3), &t));
    v = tensor_value(t);
    TD_CHECK_OK(mp_msg_encode(v, &m));
    td_value *out;
    int fds[1];
    /* Its fd withheld. */
    TD_CHECK_ERR(mp_msg_decode_bytes(m.data.data, m.data.len, fds, 0, mp_object_classes, &out), TD_ERR_INVALID, "file descriptors");
    /* Every truncation and every single-byte corruption. */
    for (size_t cut = 0; cut < m.data.len; cut++) {
        fds[0] = dup(m.fds.items[0]);
        TD_CHECK(mp_msg_decode_bytes(m.data.data, cut, fds, 1, mp_object_classes, &out) == TD_ERR_INVALID);
    }
    char *copy = malloc(m.data.len);
    for (size_t i = 0; i < m.data.len; i++) {
        memcpy(copy, m.data.data, m.data.len);
        copy[i] ^= 0x5a;
        fds[0] = dup(m.fds.items[0]);
        out = NULL;
        if (mp_msg_decode_bytes(copy, m.data.len, fds, 1, mp_object_classes, &out) == TD_OK)
            td_value_release(out); /* a flipped value byte can still be a valid message */
    }
    free(copy);
    fds[0] = dup(m.fds.items[0]);
    TD_CHECK_OK(mp_msg_decode_bytes(m.data.data, m.data.len, fds, 1, mp_object_classes, &out));
    TD_CHECK(td_value_equal(out, v));
    td_value_release(out);
    m.sent = true;
    mp_msg_free(&m);
    td_value_release(v);
    mpt_lc_end(lc);
}

/* Writes the seed corpus of fuzz/fuzz_mp_message.c into $TDIST_FUZZ_SEED_DIR (run by name). */
TD_TEST(write_fuzz_seeds, .hidden = true)
{
    const char *dir = getenv("TDIST_FUZZ_SEED_DIR");
    TD_CHECK(dir != NULL);
    for (int s = 0; s < 2; s++) {
        mpt_set_strategy((td_mp_strategy)s);
        td_tensor *x = mpt_randn(3, 4), *col, *e;
        TD_CHECK_OK(td_tensor_select(x, 1, 2, &col));
        TD_CHECK_OK(td_tensor_empty(TD_INT64, TD_SHAPE(0), &e));
        td_value *v = td_value_tuple_of(4, td_value_tensor(x), td_value_tensor(col), td_value_tensor(e),
                                        td_value_string("label"));
        td_mp_msg m;
        TD_CHECK_OK(mp_msg_encode(v, &m));
        char path[512];
        snprintf(path, sizeof path, "%s/seed_%s", dir, td_mp_strategy_name((td_mp_strategy)s));
        FILE *f = fopen(path, "wb");
        TD_CHECK(f && fwrite(m.data.data, 1, m.data.len, f) == m.data.len);
        fclose(f);
        mp_msg_free(&m);
        td_value_release(v);
        td_tensor_release(e);
        td_tensor_release(col);
        td_tensor_release(x);
    }
}

/* Forks while another thread keeps taking the cache and share locks: the child re-creates them,
 * so it can share and receive without deadlocking (spec F). Under the sanitizers the runtime's
 * own locks are not fork-safe in this pattern, so the case runs only in the plain build. */
static volatile int churn_stop;

static void *churn(void *arg)
{
    while (!churn_stop) {
        td_tensor *t;
        if (td_tensor_zeros(TD_FLOAT32, TD_SHAPE(4), &t) != TD_OK)
            break;
        td_tensor_share_memory(t);
        td_tensor_release(t);
    }
    return NULL;
}

TD_MP_ENTRY(round_trip_in_child)
{
    td_mp_queue *q;
    E_OK(td_mp_queue_new(0, &q));
    td_tensor *t;
    E_OK(td_tensor_ones(TD_FLOAT32, TD_SHAPE(4), &t));
    td_value *v = td_value_tensor(t), *got = NULL;
    td_status st = td_mp_queue_put(q, v, 0);
    if (st == TD_OK)
        st = td_mp_queue_get(q, 10000, &got);
    if (st == TD_OK && td_tensor_storage(td_value_get_tensor(got)) != td_tensor_storage(t))
        st = error_fmt(TD_ERR_INTERNAL, "the round trip lost the storage's identity");
    td_value_release(got);
    td_value_release(v);
    td_tensor_release(t);
    td_mp_queue_release(q);
    return st;
}

TD_TEST(fork_while_cache_lock_held, .timeout_s = 120)
{
#ifdef TDIST_SANITIZED
    TD_SKIP(TD_SKIP_GENERIC, "forking while another thread allocates is not safe under the sanitizers' runtime");
#endif
    td_mp_leak_checker *lc = mpt_lc_begin();
    pthread_t th;
    churn_stop = 0;
    TD_CHECK(pthread_create(&th, NULL, churn, NULL) == 0);
    td_status st = TD_OK;
    for (int i = 0; i < 20 && st == TD_OK; i++) {
        td_mp_context *pc = start_n("round_trip_in_child", NULL, 1, TD_MP_FORK, lc);
        st = td_mp_join(pc, 30000);
        td_mp_context_release(pc);
    }
    churn_stop = 1;
    pthread_join(th, NULL);
    TD_CHECK_OK(st);
    mpt_lc_end(lc);
}

/* The producer puts and exits at once; the consumer gets afterwards and still maps the storage:
 * the fd travels inside the message (file_descriptor), or the message holds a reference on the
 * name (file_system). */
TD_MP_ENTRY(put_and_exit)
{
    td_mp_queue *q = td_mp_value_queue(args);
    td_tensor *t;
    E_OK(td_tensor_full(TD_INT32, TD_SHAPE(6), 9, &t));
    td_value *v = td_value_tensor(t);
    td_tensor_release(t);
    td_status st = td_mp_queue_put(q, v, 0);
    td_value_release(v);
    return st;
}

TD_TEST(sender_exits_before_receive, .timeout_s = 120)
{
    for (int s = 0; s < 2; s++) {
        mpt_set_strategy((td_mp_strategy)s);
        td_mp_leak_checker *lc = mpt_lc_begin();
        /* Under file_system, hold a segment so that this process is a client of the daemon: with
         * no client at all it would sweep the name of a message nobody has received yet. */
        td_tensor *keep;
        TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(1), &keep));
        TD_CHECK_OK(td_tensor_share_memory(keep));
        td_mp_queue *q;
        TD_CHECK_OK(td_mp_queue_new(0, &q));
        td_value *qv = td_mp_queue_value(q);
        td_mp_context *pc = start_n("put_and_exit", qv, 1, TD_MP_SPAWN, lc);
        TD_CHECK_OK(td_mp_join(pc, 30000));
        td_mp_context_release(pc);
        td_value *got;
        TD_CHECK_OK(td_mp_queue_get(q, 10000, &got));
        TD_CHECK(mpt_all_equal(td_value_get_tensor(got), 9));
        td_value_release(got);
        td_value_release(qv);
        td_mp_queue_release(q);
        td_tensor_release(keep);
        mpt_lc_end(lc);
    }
}
