/* Jobs started by other launchers, without MPI itself: env:// takes the rank and world size from
 * Open MPI's, PMI's and Slurm's variables when RANK / WORLD_SIZE are absent (tdist issue 7), and the
 * harness's external-launcher mode (--td-external) runs one rank of a case per process, as mpirun
 * starts them, with its verdicts, timeout and CTest entries. The ranks here are supervised harness
 * ranks that set the launcher's variables themselves; tests/mpi/test_mpi.c does the same under the
 * real mpirun. */
#include <fcntl.h>
#include <poll.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tdist/pg.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "launch_util.h"

extern char **environ;

/* ---- env:// from a launcher's variables ------------------------------------------------------- */

static void clear_launcher_env(void)
{
    static const char *const vars[] = {"RANK", "WORLD_SIZE", "LOCAL_RANK", "OMPI_COMM_WORLD_RANK",
                                       "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "PMI_SIZE",
                                       "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "LOCAL_WORLD_SIZE",
                                       "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
                                       "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE"};
    for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++)
        unsetenv(vars[i]);
}

static void set_int_env(const char *name, int v)
{
    char s[32];
    snprintf(s, sizeof s, "%d", v);
    setenv(name, s, 1);
}

/* Every rank sets only the launcher's variables (rank_var, size_var) and meets through env://
 * with the tcp backend: the group must have the launcher's rank and size, and work. */
static void env_rendezvous(td_test_ctx *ctx, const char *rank_var, const char *size_var)
{
    int port = launch_test_port(ctx, "master_port");
    clear_launcher_env(); /* the harness set RANK and WORLD_SIZE; a launcher like mpirun does not */
    set_int_env(rank_var, ctx->rank);
    set_int_env(size_var, ctx->world_size);
    set_int_env("MASTER_PORT", port);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "tcp";
    o.init_method = "env://";
    o.timeout_ms = 60000;
    TD_CHECK_OK(td_init_process_group(&o));
    TD_CHECK_EQ(td_get_rank(), ctx->rank);
    TD_CHECK_EQ(td_get_world_size(), ctx->world_size);
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_INT64, TD_SHAPE(3), ctx->rank + 1.0, &t));
    TD_CHECK_OK(td_pg_all_reduce(NULL, t, TD_OP_SUM, NULL));
    int64_t i = 2, v = 0;
    TD_CHECK_OK(td_tensor_get_i64(t, &i, &v));
    TD_CHECK_EQ(v, ctx->world_size * (ctx->world_size + 1) / 2);
    td_tensor_release(t);
    TD_CHECK_OK(td_pg_barrier(NULL, NULL)); /* every rank has read the port file */
    launch_test_port_done(ctx, "master_port");
    td_destroy_process_group();
}

TD_TEST(env_rendezvous_open_mpi, .world_size = 3, .timeout_s = 60)
{
    env_rendezvous(ctx, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE");
}

TD_TEST(env_rendezvous_pmi, .world_size = 2, .timeout_s = 60) { env_rendezvous(ctx, "PMI_RANK", "PMI_SIZE"); }

TD_TEST(env_rendezvous_slurm, .world_size = 2, .timeout_s = 60)
{
    env_rendezvous(ctx, "SLURM_PROCID", "SLURM_NTASKS");
}

/* The rendezvous alone: RANK / WORLD_SIZE first, then the launchers in order; clear errors. */
TD_TEST(env_rendezvous_variables, .timeout_s = 60)
{
    clear_launcher_env();
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "0", 1); /* one rank: the store picks a free port */
    td_store *s = NULL;
    int rank = -1, ws = -1;
    TD_CHECK_ERR(td_rendezvous("env://", -1, -1, 10000, &s, &rank, &ws), TD_ERR_INVALID,
                 "Error initializing torch.distributed using env:// rendezvous: environment variable RANK expected, "
                 "but not set");
    setenv("SLURM_PROCID", "0", 1);
    setenv("SLURM_NTASKS", "1", 1);
    setenv("PMI_RANK", "abc", 1);
    setenv("PMI_SIZE", "1", 1);
    TD_CHECK_ERR(td_rendezvous("env://", -1, -1, 10000, &s, &rank, &ws), TD_ERR_INVALID, "PMI_RANK must be an integer");
    setenv("PMI_RANK", "3", 1);
    setenv("PMI_SIZE", "2", 1);
    TD_CHECK_ERR(td_rendezvous("env://", -1, -1, 10000, &s, &rank, &ws), TD_ERR_INVALID,
                 "PMI_RANK (3) must be below PMI_SIZE (2)");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
    TD_CHECK_OK(td_rendezvous("env://", -1, -1, 10000, &s, &rank, &ws)); /* Slurm's */
    TD_CHECK(rank == 0 && ws == 1);
    td_store_release(s);
    /* The URL's and RANK / WORLD_SIZE come before any launcher's. */
    setenv("SLURM_NTASKS", "5", 1);
    setenv("SLURM_PROCID", "4", 1);
    TD_CHECK_OK(td_rendezvous("env://?rank=0&world_size=1", -1, -1, 10000, &s, &rank, &ws));
    TD_CHECK(rank == 0 && ws == 1);
    td_store_release(s);
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "1", 1);
    TD_CHECK_OK(td_rendezvous("env://", -1, -1, 10000, &s, &rank, &ws));
    TD_CHECK(rank == 0 && ws == 1);
    td_store_release(s);
    clear_launcher_env();
}

/* The local rank and local world size each launcher sets (issue 22), in the order of preference:
 * LOCAL_*, then Open MPI's, MPICH's and Slurm's; the size always from the launcher that gave the rank. */
TD_TEST(local_rank_variables)
{
    clear_launcher_env();
    TD_CHECK_EQ(td_get_local_rank(), -1);
    TD_CHECK_EQ(td_get_local_world_size(), -1);
    /* Slurm: SLURM_TASKS_PER_NODE's first count, unless SLURM_NTASKS_PER_NODE is set. */
    setenv("SLURM_LOCALID", "2", 1);
    TD_CHECK_EQ(td_get_local_rank(), 2);
    TD_CHECK_EQ(td_get_local_world_size(), -1);
    setenv("SLURM_TASKS_PER_NODE", "4(x2),3", 1);
    TD_CHECK_EQ(td_get_local_rank(), 2);
    TD_CHECK_EQ(td_get_local_world_size(), 4);
    setenv("SLURM_TASKS_PER_NODE", "3", 1);
    TD_CHECK_EQ(td_get_local_world_size(), 3);
    setenv("SLURM_NTASKS_PER_NODE", "8", 1);
    TD_CHECK_EQ(td_get_local_world_size(), 8);
    /* MPICH's Hydra comes before Slurm. */
    setenv("MPI_LOCALRANKID", "1", 1);
    setenv("MPI_LOCALNRANKS", "2", 1);
    TD_CHECK_EQ(td_get_local_rank(), 1);
    TD_CHECK_EQ(td_get_local_world_size(), 2);
    /* Open MPI before MPICH. */
    setenv("OMPI_COMM_WORLD_LOCAL_RANK", "3", 1);
    setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "6", 1);
    TD_CHECK_EQ(td_get_local_rank(), 3);
    TD_CHECK_EQ(td_get_local_world_size(), 6);
    /* LOCAL_RANK / LOCAL_WORLD_SIZE (tdrun, torchrun) first; no size from another launcher. */
    setenv("LOCAL_RANK", "0", 1);
    TD_CHECK_EQ(td_get_local_rank(), 0);
    TD_CHECK_EQ(td_get_local_world_size(), -1);
    setenv("LOCAL_WORLD_SIZE", "5", 1);
    TD_CHECK_EQ(td_get_local_world_size(), 5);
    /* Not valid numbers, or a rank not below the size: -1, no fall-through to the next launcher. */
    setenv("LOCAL_RANK", "x", 1);
    TD_CHECK_EQ(td_get_local_rank(), -1);
    TD_CHECK_EQ(td_get_local_world_size(), 5);
    setenv("LOCAL_RANK", "5", 1);
    TD_CHECK_EQ(td_get_local_rank(), -1);
    /* An empty value counts as unset: the next launcher's. */
    setenv("LOCAL_RANK", "", 1);
    TD_CHECK_EQ(td_get_local_rank(), 3);
    TD_CHECK_EQ(td_get_local_world_size(), 6);
    clear_launcher_env();
    setenv("SLURM_LOCALID", "0", 1);
    setenv("SLURM_TASKS_PER_NODE", "bad", 1);
    TD_CHECK_EQ(td_get_local_rank(), 0);
    TD_CHECK_EQ(td_get_local_world_size(), -1);
    clear_launcher_env();
}

/* ---- the external-launcher mode --------------------------------------------------------------- */

static void wait_for_file(const char *dir, const char *name, bool present)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    for (int i = 0; i < 3000; i++) {
        if ((access(path, F_OK) == 0) == present)
            return;
        struct timespec d = {0, 10 * 1000000L};
        nanosleep(&d, NULL);
    }
    TD_FAIL("%s did not %s within 30 s", path, present ? "appear" : "go away");
}

static void touch(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "w");
    TD_CHECK(f != NULL);
    TD_CHECK(fclose(f) == 0);
}

static void remove_file(const char *dir, const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    TD_CHECK(unlink(path) == 0);
}

/* Ranks see the launcher's rank and size, and share a directory. */
TD_TEST(ext_pass, .world_size = 2, .hidden = true, .timeout_s = 60)
{
    const char *r = getenv("RANK") ? getenv("RANK") : getenv("OMPI_COMM_WORLD_RANK");
    TD_CHECK(r != NULL);
    TD_CHECK_EQ(ctx->rank, atoi(r));
    TD_CHECK_EQ(ctx->world_size, 2);
    struct stat st;
    TD_CHECK(stat(ctx->tmpdir, &st) == 0 && S_ISDIR(st.st_mode));
    if (ctx->rank == 0) {
        touch(ctx->tmpdir, "from0");
        wait_for_file(ctx->tmpdir, "from1", true);
        remove_file(ctx->tmpdir, "from1");
    } else {
        wait_for_file(ctx->tmpdir, "from0", true);
        remove_file(ctx->tmpdir, "from0");
        touch(ctx->tmpdir, "from1");
        wait_for_file(ctx->tmpdir, "from1", false);
    }
}

TD_TEST(ext_fail, .world_size = 2, .hidden = true, .timeout_s = 60)
{
    if (ctx->rank == 1)
        TD_FAIL("deliberate failure on rank %d", ctx->rank);
}

TD_TEST(ext_skip, .hidden = true, .timeout_s = 60) { TD_SKIP(TD_SKIP_SMALL_WORLDSIZE, "one rank is not enough"); }

TD_TEST(ext_hang, .hidden = true, .timeout_s = 1)
{
    for (;;) {
        struct timespec d = {1, 0};
        nanosleep(&d, NULL);
    }
}

typedef struct ext_run {
    int codes[4];
    char *out[4];
} ext_run;

/* Starts n processes of this binary with --td-external name, each with this environment minus the
 * launcher variables plus "<rank_var>=i" and "<size_var>=world" (world 0: n), and collects their
 * exit codes and output. */
static void run_external(const char *name, int n, const char *rank_var, const char *size_var, int world, ext_run *r)
{
    memset(r, 0, sizeof *r);
    char exe[4096];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    TD_CHECK(len > 0);
    exe[len] = '\0';
    size_t nenv = 0;
    while (environ[nenv])
        nenv++;
    pid_t pids[4];
    int fds[4];
    for (int i = 0; i < n; i++) {
        char **envp = calloc(nenv + 3, sizeof *envp);
        size_t k = 0;
        for (size_t e = 0; e < nenv; e++)
            if (strncmp(environ[e], "RANK=", 5) != 0 && strncmp(environ[e], "WORLD_SIZE=", 11) != 0)
                envp[k++] = environ[e];
        char rv[64], sv[64];
        snprintf(rv, sizeof rv, "%s=%d", rank_var, i);
        snprintf(sv, sizeof sv, "%s=%d", size_var, world ? world : n);
        envp[k++] = rv;
        envp[k++] = sv;
        int p[2];
        TD_CHECK(pipe2(p, O_CLOEXEC) == 0);
        posix_spawn_file_actions_t fa;
        posix_spawn_file_actions_init(&fa);
        posix_spawn_file_actions_adddup2(&fa, p[1], 1);
        posix_spawn_file_actions_adddup2(&fa, p[1], 2);
        char *argv[] = {exe, "--td-external", (char *)name, NULL};
        TD_CHECK(posix_spawn(&pids[i], exe, &fa, NULL, argv, envp) == 0);
        posix_spawn_file_actions_destroy(&fa);
        close(p[1]);
        fds[i] = p[0];
        free(envp);
    }
    /* Read everyone's output as it comes (a child blocked on a full pipe would never exit). */
    size_t lens[4] = {0}, caps[4] = {0};
    int open_fds = n;
    while (open_fds > 0) {
        struct pollfd pf[4];
        for (int i = 0; i < n; i++)
            pf[i] = (struct pollfd){.fd = fds[i], .events = POLLIN};
        TD_CHECK(poll(pf, (nfds_t)n, 60000) > 0);
        for (int i = 0; i < n; i++) {
            if (fds[i] < 0 || !pf[i].revents)
                continue;
            if (lens[i] + 4096 + 1 > caps[i]) {
                caps[i] = caps[i] * 2 + 8192;
                r->out[i] = realloc(r->out[i], caps[i]);
            }
            ssize_t got = read(fds[i], r->out[i] + lens[i], 4096);
            if (got <= 0) {
                close(fds[i]);
                fds[i] = -1;
                pf[i].fd = -1;
                open_fds--;
                continue;
            }
            lens[i] += (size_t)got;
        }
        for (int i = 0; i < n; i++)
            if (fds[i] < 0)
                pf[i].fd = -1;
    }
    for (int i = 0; i < n; i++) {
        if (!r->out[i])
            r->out[i] = calloc(1, 1);
        r->out[i][lens[i]] = '\0';
        int status = 0;
        TD_CHECK(waitpid(pids[i], &status, 0) == pids[i]);
        r->codes[i] = WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status);
    }
    /* The job's shared directory (named after its launcher: this process): a rank that failed or
     * skipped leaves it. */
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/tdist-test-p%d-%s", getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp", (int)getpid(),
             name);
    rmdir(dir);
}

static void ext_run_free(ext_run *r)
{
    for (int i = 0; i < 4; i++)
        free(r->out[i]);
}

TD_TEST(external_launcher_mode, .timeout_s = 120)
{
    ext_run r;
    run_external("ext_pass", 2, "RANK", "WORLD_SIZE", 0, &r);
    TD_CHECK_MSG(r.codes[0] == 0 && r.codes[1] == 0, "ext_pass exited %d and %d:\n%s\n%s", r.codes[0], r.codes[1],
                 r.out[0], r.out[1]);
    ext_run_free(&r);
    /* Open MPI's variables, as mpirun sets them. */
    run_external("ext_pass", 2, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", 0, &r);
    TD_CHECK_MSG(r.codes[0] == 0 && r.codes[1] == 0, "ext_pass (OMPI_*) exited %d and %d:\n%s\n%s", r.codes[0],
                 r.codes[1], r.out[0], r.out[1]);
    ext_run_free(&r);

    /* A failure: exit code 10 and the message on the rank's stderr. */
    run_external("ext_fail", 2, "RANK", "WORLD_SIZE", 0, &r);
    TD_CHECK_EQ(r.codes[0], 0);
    TD_CHECK_EQ(r.codes[1], TD_TEST_ERROR_EXIT_CODE);
    TD_CHECK_CONTAINS(r.out[1], "deliberate failure on rank 1");
    TD_CHECK_CONTAINS(r.out[1], "exiting process 1 with exit code: 10");
    ext_run_free(&r);

    /* A skip: the skip code, and the line CTest's SKIP_REGULAR_EXPRESSION looks for. */
    run_external("ext_skip", 1, "RANK", "WORLD_SIZE", 0, &r);
    TD_CHECK_EQ(r.codes[0], TD_SKIP_SMALL_WORLDSIZE);
    TD_CHECK_CONTAINS(r.out[0], "Process 0 skipping test ext_skip for following reason: one rank is not enough");
    ext_run_free(&r);

    /* A hang: the rank's own watchdog ends it at the case's timeout, with its stacks. */
    run_external("ext_hang", 1, "RANK", "WORLD_SIZE", 0, &r);
    TD_CHECK_EQ(r.codes[0], TD_TEST_ERROR_EXIT_CODE);
    TD_CHECK_CONTAINS(r.out[0], "Process 0 terminated or timed out after 1 seconds (case ext_hang)");
    TD_CHECK_CONTAINS(r.out[0], "td_test_body_ext_hang");
    ext_run_free(&r);

    /* Bad starts: a world of the wrong size, a name that is no case, a threaded case, no launcher. */
    run_external("ext_pass", 1, "RANK", "WORLD_SIZE", 3, &r);
    TD_CHECK_EQ(r.codes[0], 2);
    TD_CHECK_CONTAINS(r.out[0], "case ext_pass runs 2 ranks, but the launcher started 3 (WORLD_SIZE=3)");
    ext_run_free(&r);
    run_external("nonesuch", 1, "RANK", "WORLD_SIZE", 0, &r);
    TD_CHECK_EQ(r.codes[0], 2);
    TD_CHECK_CONTAINS(r.out[0], "no test case named 'nonesuch'");
    ext_run_free(&r);
    run_external("ext_threaded", 1, "RANK", "WORLD_SIZE", 0, &r);
    TD_CHECK_EQ(r.codes[0], 2);
    TD_CHECK_CONTAINS(r.out[0], "runs its ranks as threads of one process");
    ext_run_free(&r);
    run_external("ext_pass", 1, "NOT_A_LAUNCHER_RANK", "NOT_A_LAUNCHER_SIZE", 0, &r);
    TD_CHECK_EQ(r.codes[0], 2);
    TD_CHECK_CONTAINS(r.out[0], "no launcher set this process's rank");
    ext_run_free(&r);
}

TD_TEST(ext_threaded, .world_size = 2, .threads = true, .hidden = true) {}

/* --ctest-launcher: the instances of that parameter become entries that run under the command. */
TD_TEST(launcher_probe, .params = "plain,launched") {}

TD_TEST(ctest_launcher_entries, .timeout_s = 60)
{
    char exe[4096], file[1024], cmd[6000];
    ssize_t len = readlink("/proc/self/exe", exe, sizeof exe - 1);
    TD_CHECK(len > 0);
    exe[len] = '\0';
    snprintf(file, sizeof file, "%s/cases.cmake", ctx->tmpdir);
    snprintf(cmd, sizeof cmd, "'%s' --ctest '%s' --ctest-launcher 'launched=/opt/mpi/mpiexec -n {np} --flag' >/dev/null",
             exe, file);
    TD_CHECK_EQ(system(cmd), 0);
    FILE *f = fopen(file, "r");
    TD_CHECK(f != NULL);
    char *text = calloc(1, 1 << 20);
    size_t n = fread(text, 1, (1 << 20) - 1, f);
    fclose(f);
    text[n] = '\0';
    char want[5000];
    snprintf(want, sizeof want,
             "add_test([==[test_launcher.launcher_probe/launched]==] [==[/opt/mpi/mpiexec]==] [==[-n]==] [==[1]==] "
             "[==[--flag]==] [==[%s]==] [==[--td-external]==] [==[launcher_probe/launched]==])",
             exe);
    TD_CHECK_CONTAINS(text, want);
    TD_CHECK_CONTAINS(text, "SKIP_REGULAR_EXPRESSION [==[skipping test .* for following reason]==] "
                            "LABELS [==[tdist;launched]==]");
    snprintf(want, sizeof want, "add_test([==[test_launcher.launcher_probe/plain]==] [==[%s]==] "
                                "[==[launcher_probe/plain]==])",
             exe);
    TD_CHECK_CONTAINS(text, want);
    free(text);
    TD_CHECK(unlink(file) == 0);
}

TD_TEST_MAIN()
