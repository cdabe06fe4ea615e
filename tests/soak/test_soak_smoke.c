/* tdist-soak smoke tests: the soak program (bench/soak/soak.c, `make soak`) for a few seconds, so
 * that it cannot rot between soak runs. 4 ranks under the real tdrun on the tcp and shm backends,
 * and 4 rank threads on the threaded backend, at small sizes: every rank must print its summary
 * line with result=ok (every element of every step checked, the RSS growth within the bound) and
 * the job exit 0. A failure shows the whole output, seed included, to replay it with --seed. */
#include <fcntl.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/testing.h>

extern char **environ;

/* The RSS bound means nothing under a sanitizer: ASan's quarantine keeps freed memory resident for
 * a while, and under TSan a 4-thread run grows by 60-95 MB in 3-8 s (its allocator caches and the
 * metadata of every address synchronized on) where the plain build grows by 0.2 MB. The plain
 * build checks the bound; the 30-minute soaks measure memory (docs/testing.md). */
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define MAX_GROWTH_MIB "4096"
#else
#define MAX_GROWTH_MIB "64"
#endif

typedef struct run_result {
    int code; /* exit code, or -signal */
    char *out;
} run_result;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    TD_CHECK_MSG(f != NULL, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *s = malloc((size_t)len + 1);
    size_t got = fread(s, 1, (size_t)len, f);
    s[got] = '\0';
    fclose(f);
    unlink(path);
    return s;
}

/* Runs argv (NULL-terminated) to the end with stdout and stderr in one file of the test's directory. */
static run_result run(td_test_ctx *ctx, char *const argv[])
{
    char path[512];
    snprintf(path, sizeof path, "%s/soak.out", ctx->tmpdir);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    TD_CHECK(fd >= 0);
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, fd, 1);
    posix_spawn_file_actions_adddup2(&fa, fd, 2);
    pid_t pid;
    TD_CHECK(posix_spawn(&pid, argv[0], &fa, NULL, argv, environ) == 0);
    posix_spawn_file_actions_destroy(&fa);
    close(fd);
    int st;
    TD_CHECK(waitpid(pid, &st, 0) == pid);
    run_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), slurp(path)};
    return r;
}

/* Every one of the 4 ranks printed its summary with result=ok, for this backend, after some steps. */
static void check_summaries(const run_result *r, const char *backend)
{
    TD_CHECK_MSG(r->code == 0, "exit code %d:\n%s", r->code, r->out);
    TD_CHECK_MSG(strstr(r->out, "SOAK FAIL") == NULL, "a check failed:\n%s", r->out);
    for (int rank = 0; rank < 4; rank++) {
        char want[64];
        snprintf(want, sizeof want, "SOAK rank=%d backend=%s world=4 ", rank, backend);
        const char *line = strstr(r->out, want);
        TD_CHECK_MSG(line != NULL, "no summary of rank %d:\n%s", rank, r->out);
        size_t len = strcspn(line, "\n");
        char copy[1024];
        snprintf(copy, sizeof copy, "%.*s", (int)len, line);
        TD_CHECK_MSG(strstr(copy, " result=ok") != NULL, "rank %d: %s\n%s", rank, copy, r->out);
        const char *steps = strstr(copy, " steps=");
        TD_CHECK_MSG(steps && atoll(steps + 7) > 0, "rank %d ran no step: %s", rank, copy);
    }
}

TD_TEST(soak_under_tdrun, .params = "tcp,shm", .timeout_s = 90)
{
    char *argv[] = {TDRUN_BIN, "--standalone", "--nproc-per-node", "4", SOAK_BIN, "--backend", (char *)ctx->param,
                    "--seconds", "3", "--max-elems", "65536", "--progress", "0", "--max-growth-mib", MAX_GROWTH_MIB,
                    NULL};
    run_result r = run(ctx, argv);
    check_summaries(&r, ctx->param);
    TD_CHECK_CONTAINS(r.out, "soak: backend ");
    free(r.out);
}

TD_TEST(soak_threaded, .timeout_s = 90)
{
    char *argv[] = {SOAK_BIN, "--backend", "threaded", "--nproc", "4", "--seconds", "3", "--max-elems", "65536",
                    "--progress", "0", "--max-growth-mib", MAX_GROWTH_MIB, NULL};
    run_result r = run(ctx, argv);
    check_summaries(&r, "threaded");
    free(r.out);
}

/* --steps makes a run exactly reproducible: the same seed and steps give the same work. */
TD_TEST(soak_steps_and_seed_reproduce, .timeout_s = 90)
{
    char *argv[] = {SOAK_BIN, "--backend", "threaded", "--nproc", "4", "--steps", "300", "--seed", "12345",
                    "--max-elems", "4096", "--no-prelude", "--progress", "0", "--max-growth-mib", MAX_GROWTH_MIB,
                    NULL};
    run_result a = run(ctx, argv), b = run(ctx, argv);
    check_summaries(&a, "threaded");
    check_summaries(&b, "threaded");
    const char *line_a = strstr(a.out, "SOAK rank=2 "), *line_b = strstr(b.out, "SOAK rank=2 ");
    TD_CHECK_CONTAINS(line_a, "seed=12345 steps=300 ");
    /* the same ops and bytes: everything up to the timing fields */
    size_t n = (size_t)(strstr(line_a, " seconds=") - line_a);
    TD_CHECK_MSG(strncmp(line_a, line_b, n) == 0, "two runs differ:\n%.*s\n%.*s", (int)n, line_a, (int)n, line_b);
    free(a.out);
    free(b.out);
}

TD_TEST(soak_bad_arguments_exit_2, .timeout_s = 30)
{
    static const char *const cases[][3] = {
        {"--minutes", "x", "--minutes wants a number"},
        {"--frobnicate", "1", "unknown argument '--frobnicate'"},
        {"--inflight", "0", "--inflight wants a number between 1 and 64"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char *argv[] = {SOAK_BIN, (char *)cases[i][0], (char *)cases[i][1], NULL};
        run_result r = run(ctx, argv);
        TD_CHECK_MSG(r.code == 2, "case %zu: exit code %d:\n%s", i, r.code, r.out);
        TD_CHECK_CONTAINS(r.out, cases[i][2]);
        free(r.out);
    }
}

TD_TEST_MAIN()
