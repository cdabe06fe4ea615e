/* tdist/testing.h: the multi-process and threaded test harness (c10d's MultiProcessTestCase and
 * MultiThreadedTestCase in C), shipped for users' own distributed tests.
 *
 * A test binary declares cases and hands main to the harness:
 *
 *     #include <tdist/testing.h>
 *
 *     TD_TEST(all_reduce_sums, .world_size = 4, .timeout_s = 60) {
 *         TD_CHECK(ctx->rank < ctx->world_size);
 *         TD_CHECK_OK(do_something(ctx->init_url));
 *     }
 *
 *     TD_TEST_MAIN()
 *
 * Each case runs in fresh processes: the harness re-executes the binary (fork+exec, never a bare
 * fork) once per rank, runs the body in every rank, and supervises them: it reads every child's
 * control socket and output continuously, kills all ranks as soon as one fails, enforces the
 * per-test timeout (asking hung ranks for their thread stacks first), reaps every child and gives
 * the verdict with PyTorch's decision table and messages ("Process 2 exited with error code 10 and
 * exception: ..."). With .threads = true the ranks are threads of one child process instead, each
 * with its own default group (td_init_process_group and the calls that name no group act on the
 * rank thread's own; threads a rank starts see the process's: see tdist/pg.h).
 *
 * Inside a body, a failed check ends the rank: a process rank sends its message to the parent and
 * exits with code 10; a thread rank records it and unwinds its thread, and the other ranks are told
 * to stop (td_test_add_abort_hook). Skips exit with the codes of c10d's TEST_SKIPS table; a skip
 * counts only when every rank skips with the same code.
 *
 * After the body returns, each rank checks that it leaked nothing: its open file descriptors and
 * thread count are back where they were before the body (disable with .no_leak_check), and the
 * parent checks that the test's temp dir holds nothing the ranks left (.allow_leftovers) and that
 * /dev/shm holds no "tdist.<pid>." segment of the ranks.
 *
 * Command line of a test binary:  [--list] [--ctest FILE] [--keep-going] [NAME_OR_PREFIX ...]
 * With no names it runs every visible case; a name selects the instance of that exact name, every
 * instance of a case ("case" for "case/a", "case/b"), or (visible cases only) every instance whose
 * name starts with it. It stops at the first failure unless --keep-going. Exit code: 0 all passed
 * or skipped, 1 a failure, 77 everything was skipped, 2 a bad command line or a name that matches
 * nothing. --ctest FILE writes one CTest entry per visible instance (tests/CMakeLists.txt; instances
 * of the parameter "cuda" get the label gpu); with
 * --ctest-launcher PARAM=COMMAND, the instances of parameter PARAM become entries that run
 * "COMMAND <binary> --td-external <instance>" ("{np}" in COMMAND: the world size).
 * External launchers: `<binary> --td-external NAME`, started N times by a launcher (mpirun -np N,
 * srun, tdrun), runs one rank of NAME in each process, with no supervisor (c10d's
 * MultiProcContinousTest): the rank and world size come from RANK / WORLD_SIZE, else
 * OMPI_COMM_WORLD_RANK / _SIZE, PMI_RANK / PMI_SIZE or SLURM_PROCID / SLURM_NTASKS; each process
 * exits 0, 10 (the failure's message on stderr) or a skip code, and enforces the case's timeout
 * itself (logging its threads' stacks). The ranks share a directory named after the launcher's job.
 * See docs/testing.md.
 * Environment: TDIST_TEST_TIMEOUT (default per-test timeout, e.g. "300" or "5m"),
 * TDIST_TEST_SANDCASTLE=1 (skips pass, as on Sandcastle), TDIST_TEST_QUIET=1 (children's output
 * is captured but not echoed), TDIST_TEST_VERBOSE=1 (also print routine harness lines such as
 * "Started process 0 with pid 123"). Ranks get RANK, WORLD_SIZE, MASTER_ADDR=127.0.0.1, and
 * TEMP_DIR and TMPDIR set to the test's own directory.
 */
#ifndef TDIST_TESTING_H
#define TDIST_TESTING_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Exit codes (c10d's TEST_ERROR_EXIT_CODE and TEST_SKIPS). */
enum {
    TD_TEST_ERROR_EXIT_CODE = 10,
    TD_SKIP_BACKEND_UNAVAILABLE = 72, /* "Skipped because distributed backend is not available." */
    TD_SKIP_SMALL_WORLDSIZE = 73,     /* "Skipped due to small world size." */
    TD_SKIP_NO_CUDA = 74,             /* "CUDA is not available." */
    TD_SKIP_MULTI_GPU_1 = 75,         /* "Need at least 1 CUDA device" */
    TD_SKIP_NCCL = 76,                /* "c10d not compiled with NCCL support" */
    TD_SKIP_MULTI_GPU_2 = 77,         /* "Need at least 2 CUDA devices" */
    TD_SKIP_ROCM = 78,                /* "Test skipped for ROCm" */
    TD_SKIP_NO_PEER_ACCESS = 79,      /* "Test skipped because no GPU peer access" */
    /* 80..85: multi-gpu-3 .. multi-gpu-8, "Need at least N CUDA devices": TD_SKIP_MULTI_GPU(n) */
    TD_SKIP_GENERIC = 86,             /* "Test skipped at subprocess level, look at subprocess log..." */
    TD_SKIP_ODD_WORLDSIZE = 87,       /* "Skipped due to odd world size." */
    TD_SKIP_IMPORTERROR = 88,         /* "Test skipped due to missing import" */
};
/* The skip code for "need at least n CUDA devices", n = 1..8; -1 otherwise. */
TD_API int td_skip_multi_gpu(int n);
/* TEST_SKIPS' message for a skip exit code, or NULL if code is not a skip code. */
TD_API const char *td_skip_message(int code);

typedef struct td_test_ctx {
    int rank;              /* 0 .. world_size-1 */
    int world_size;
    const char *name;      /* the case's name, with "/param" for parameterized instances */
    const char *param;     /* this instance's parameter (e.g. a backend name), "" when none */
    const char *tmpdir;    /* the test's own directory, shared by its ranks, removed afterwards */
    const char *store_path; /* a fresh path in tmpdir for a FileStore rendezvous (not yet created) */
    const char *init_url;  /* "file://<store_path>" */
    bool threaded;         /* ranks are threads of one process */
} td_test_ctx;

typedef struct td_test_case {
    const char *name;
    void (*fn)(td_test_ctx *ctx);
    int world_size;        /* ranks; 0 means 1 */
    bool threads;          /* ranks as threads of one child process */
    int timeout_s;         /* 0: TDIST_TEST_TIMEOUT or 300 */
    const char *params;    /* comma-separated: one instance per parameter, named "<name>/<param>" */
    bool skip_return_code_check; /* only exit code 10 or a hang fails (c10d's skip_return_code_checks) */
    const char *(*static_skip)(const char *param); /* checked in the parent; a reason means skip, no spawn */
    bool allow_leftovers;  /* files left in tmpdir are not a failure (crash tests) */
    bool no_leak_check;    /* do not compare fds and threads before / after the body */
    bool hidden;           /* not run by default: only by exact name (harness meta-tests use this) */
    /* Runs in each rank process before the leak baseline (not in threaded mode): for process-wide
     * runtimes the body starts and that stay until exit, such as MPI's (the pg tests create and
     * destroy one mpi group here). */
    void (*setup)(td_test_ctx *ctx);
    /* Shared spawn (c10d's MultiProcContinousTest): cases naming the same suite that run one after
     * another with the same world size share one set of rank processes. See "Suites" below. */
    const char *suite;
    struct td_test_case *next; /* registry link, set by td_test_register */
} td_test_case;

TD_API void td_test_register(td_test_case *c);

/* Suites: consecutive selected cases with the same .suite and world size (process ranks only) run
 * in ONE set of rank processes: each rank runs the suite's setup once (e.g. td_init_process_group:
 * one rendezvous for all of them), then each case's body in turn, each with its own temp dir
 * (ctx->tmpdir, a subdirectory of the suite's; TMPDIR is the suite's) and its own leak check of fds
 * and threads, then the teardown. Every case gets its own verdict. A rank that fails or skips ends
 * its process as in any case, so the case it was in gets the verdict of the usual decision table,
 * the suite's ranks are stopped, and the cases after it run in a fresh spawn (setup again): a
 * failing case fails only itself. Files left in a case's dir fail that case; /dev/shm segments and
 * processes are checked once per spawn, and with the suite's own dir and a failing teardown they
 * count against the last case run in it. A suite case run alone (td_test_run, --td-external) runs
 * with its suite's setup and teardown. */
typedef struct td_test_suite {
    const char *name;
    void (*setup)(td_test_ctx *ctx);    /* in each rank before the first case; ctx->name is the suite's */
    void (*teardown)(td_test_ctx *ctx); /* in each rank after the last case of the spawn */
    struct td_test_suite *next;         /* registry link */
} td_test_suite;

TD_API void td_test_register_suite(td_test_suite *s);

/* Declares a suite's setup and teardown (optional: cases may share a spawn without them). */
#define TD_TEST_SUITE(sname, ...)                                          \
    __attribute__((constructor)) static void td_test_suite_reg_##sname(void) \
    {                                                                      \
        static td_test_suite s = {.name = #sname, __VA_ARGS__};            \
        td_test_register_suite(&s);                                        \
    }

/* Declares and registers a case; the body sees `td_test_ctx *ctx`. Options are td_test_case
 * fields as designated initializers. */
#define TD_TEST(tname, ...)                                                               \
    static void td_test_body_##tname(td_test_ctx *ctx);                                   \
    __attribute__((constructor)) static void td_test_reg_##tname(void)                    \
    {                                                                                     \
        static td_test_case c = {.name = #tname, .fn = td_test_body_##tname, __VA_ARGS__}; \
        td_test_register(&c);                                                             \
    }                                                                                     \
    static void td_test_body_##tname(td_test_ctx *ctx)

/* Runs the registered cases as the command line says; returns the process exit code (0 all passed
 * or skipped, 1 a failure, 77 everything selected was skipped). Also the entry of child ranks. */
TD_API int td_test_main(int argc, char **argv);
#define TD_TEST_MAIN() \
    int main(int argc, char **argv) { return td_test_main(argc, argv); }

/* ---- inside a test body ------------------------------------------------------------------- */

/* Ends this rank with a failure; message formatted like printf. Never returns. */
TD_API void td_test_fail(const char *file, int line, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 3, 4)));
/* Ends this rank with a skip exit code (72..88); reason is logged. Never returns. */
TD_API void td_test_skip(int code, const char *reason) __attribute__((noreturn));
/* Threaded mode: called once when any rank fails, so that ranks blocked in a collective can be
 * woken (the threaded backend registers here). Process mode: never called (ranks are killed). */
TD_API void td_test_add_abort_hook(td_test_ctx *ctx, void (*fn)(void *arg), void *arg);
/* Undoes td_test_add_abort_hook (call it before the hook's argument is freed). */
TD_API void td_test_remove_abort_hook(td_test_ctx *ctx, void (*fn)(void *arg), void *arg);
/* True once another rank of this threaded test failed; blocked waits should give up. */
TD_API bool td_test_aborted(const td_test_ctx *ctx);
/* Records a step ("all_reduce #3 of 8") shown with this rank's stack if the test hangs. */
TD_API void td_test_breadcrumb(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#define TD_FAIL(...) td_test_fail(__FILE__, __LINE__, __VA_ARGS__)
#define TD_SKIP(code, reason) td_test_skip((code), (reason))
#define TD_SKIP_IF(cond, code)                       \
    do {                                             \
        if (cond)                                    \
            td_test_skip((code), "condition: " #cond); \
    } while (0)

#define TD_CHECK(cond)                                 \
    do {                                               \
        if (!(cond))                                   \
            TD_FAIL("Check failed: %s", #cond);        \
    } while (0)
#define TD_CHECK_MSG(cond, ...)       \
    do {                              \
        if (!(cond))                  \
            TD_FAIL(__VA_ARGS__);     \
    } while (0)
/* expr is a td_status call that must succeed; the failure shows the code and td_last_error(). */
#define TD_CHECK_OK(expr)                                                                     \
    do {                                                                                      \
        td_status td_chk_s_ = (expr);                                                         \
        if (td_chk_s_ != TD_OK)                                                               \
            TD_FAIL("%s returned %s: %s", #expr, td_status_str(td_chk_s_), td_last_error()); \
    } while (0)
/* expr must fail with `code`, and td_last_error() must contain `substr` (NULL: any message). */
#define TD_CHECK_ERR(expr, code, substr) td_test_check_err_((expr), (code), (substr), #expr, __FILE__, __LINE__)
#define TD_CHECK_EQ(a, b)                                                                           \
    do {                                                                                            \
        long long td_chk_a_ = (long long)(a), td_chk_b_ = (long long)(b);                           \
        if (td_chk_a_ != td_chk_b_)                                                                 \
            TD_FAIL("Check failed: %s == %s (%lld vs %lld)", #a, #b, td_chk_a_, td_chk_b_);         \
    } while (0)
#define TD_CHECK_NEAR(a, b, tol)                                                                    \
    do {                                                                                            \
        double td_chk_a_ = (double)(a), td_chk_b_ = (double)(b);                                    \
        if (!(td_chk_a_ - td_chk_b_ <= (tol) && td_chk_b_ - td_chk_a_ <= (tol)))                    \
            TD_FAIL("Check failed: %s ~= %s (%.17g vs %.17g, tol %g)", #a, #b, td_chk_a_, td_chk_b_, \
                    (double)(tol));                                                                 \
    } while (0)
#define TD_CHECK_STR_EQ(a, b) td_test_check_str_((a), (b), false, #a, #b, __FILE__, __LINE__)
#define TD_CHECK_CONTAINS(haystack, needle) td_test_check_str_((haystack), (needle), true, #haystack, #needle, __FILE__, __LINE__)

TD_API void td_test_check_err_(td_status got, td_status want, const char *substr, const char *expr,
                               const char *file, int line);
TD_API void td_test_check_str_(const char *a, const char *b, bool contains, const char *ea, const char *eb,
                               const char *file, int line);

/* ---- subtests (c10d's run_subtests) ------------------------------------------------------- */

struct td_pg; /* tdist/pg.h */

/* One dimension of a subtest configuration: a name and its values, shown in the combination's
 * label ("dtype=f32"). A test keeps the typed values in its own arrays, in the same order, and
 * picks them with td_subtest.index. */
typedef struct td_subtest_dim {
    const char *name;
    const char *const *values;
    int count;
} td_subtest_dim;

/* The combination a subtest runs with. Valid during the callback. */
typedef struct td_subtest {
    const td_subtest_dim *dims;
    int ndims;
    const int *index;  /* index[d]: which value of dims[d] (dims[d].values[index[d]]) */
    int number;        /* 0 .. count-1, in itertools.product's order: the last dimension fastest */
    int count;         /* how many combinations: the product of the counts (1 for no dimension) */
    const char *label; /* "dtype=f32, size=4" ("" for no dimension) */
} td_subtest;

/* Runs fn once per combination of the dimensions' values, in this rank, then a barrier on group
 * (NULL: the default group when one is initialized, else no barrier), as c10d's run_subtests runs
 * test_fn under subTest(**kwargs) and c10d.barrier() after each: one spawn and one group serve
 * every combination. Every rank must call it with the same dimensions. A failed check inside fn
 * ends the rank as usual, its message starting "subtest (<label>): "; the combinations after it
 * are not run. The running combination is also the thread's breadcrumb (stacks of a hung case). */
TD_API void td_test_run_subtests(td_test_ctx *ctx, struct td_pg *group, const td_subtest_dim *dims, int ndims,
                                 void (*fn)(td_test_ctx *ctx, const td_subtest *sub, void *arg), void *arg);

/* ---- running cases from code (the harness's own meta-tests use this) ---------------------- */

typedef enum td_test_verdict { TD_TEST_PASS = 0, TD_TEST_FAIL = 1, TD_TEST_SKIP = 2 } td_test_verdict;

#define TD_TEST_NOT_EXITED INT32_MIN /* a rank that was still running (killed at the timeout) */

typedef struct td_test_result {
    td_test_verdict verdict;
    char *message;     /* the verdict's text (failure or skip reason); "" on a plain pass */
    char *log;         /* the harness's own log lines for this run (timeouts, tracebacks, kills) */
    char *output;      /* the ranks' stdout and stderr, each line prefixed "[rank R] " (last 4 MiB) */
    double elapsed_s;
    int world_size;
    int exit_codes[64]; /* per rank process: exit code, -signal, or TD_TEST_NOT_EXITED (killed by
                           the harness: timeout or early abort); a threaded case has one process,
                           exit_codes[0] */
    int spawned;       /* how many rank processes were started (0 after a static skip) */
} td_test_result;

/* Runs one registered case (by name, "<name>/<param>" for a parameter) under the supervisor and
 * fills *result (free with td_test_result_free). Returns TD_ERR_NOT_FOUND for an unknown name. */
TD_API td_status td_test_run(const char *name, td_test_result *result);
/* Runs n instances in order as the command line does: consecutive cases of one suite share a
 * spawn (results[i].spawned is the number of processes started for instance i: 0 for a case that
 * ran in the ranks of an earlier one). TD_ERR_NOT_FOUND (nothing run) for an unknown name. */
TD_API td_status td_test_run_list(const char *const *names, int n, td_test_result *results);
TD_API void td_test_result_free(td_test_result *result);

#ifdef __cplusplus
}
#endif
#endif
