/* tdist-bench smoke tests: the real program, started as a user would (without a launcher's
 * variables, so that it spawns its own ranks, or runs them as threads for the threaded backend),
 * at small sizes with few iterations. Each case checks the exit code, that no element was wrong,
 * and the CSV columns bench/peers/run.sh relies on: the sizes, counts, and algbw and busbw
 * consistent with the time and nccl-tests' factors. */
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <tdist/testing.h>

extern char **environ;

#define CSV_HEADER "impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters"
#define QUICK "--time", "0.005", "--min-iters", "2", "--batches", "2", "--warmup", "1"

typedef struct run_result {
    int code; /* exit code, or -signal */
    char *out, *err;
} run_result;

static char *slurp(const char *path)
{
    FILE *f = fopen(path, "rb");
    TD_CHECK_MSG(f != NULL, "cannot open %s", path);
    size_t cap = 4096, len = 0;
    char *s = malloc(cap);
    size_t n;
    while ((n = fread(s + len, 1, cap - len - 1, f)) > 0) {
        len += n;
        if (cap - len < 2) {
            cap *= 2;
            s = realloc(s, cap);
        }
    }
    s[len] = '\0';
    fclose(f);
    unlink(path);
    return s;
}

/* Runs tdist-bench with args (NULL-terminated) in an environment without the harness's rank
 * variables, collecting its stdout and stderr through files in the test's directory. */
static run_result run_bench(td_test_ctx *ctx, const char *const *args)
{
    char out_path[512], err_path[512];
    snprintf(out_path, sizeof out_path, "%s/bench.out", ctx->tmpdir);
    snprintf(err_path, sizeof err_path, "%s/bench.err", ctx->tmpdir);
    int out = open(out_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err = open(err_path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    TD_CHECK(out >= 0 && err >= 0);
    static const char *const drop[] = {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "LOCAL_WORLD_SIZE=", "MASTER_ADDR=",
                                       "MASTER_PORT=", "TDIST_USE_AGENT_STORE=", "TDIST_ALGO="};
    size_t n = 0;
    while (environ[n])
        n++;
    char **env = calloc(n + 1, sizeof *env);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        bool keep = true;
        for (size_t j = 0; j < sizeof drop / sizeof *drop; j++)
            keep = keep && strncmp(environ[i], drop[j], strlen(drop[j])) != 0;
        if (keep)
            env[k++] = environ[i];
    }
    char *argv[64];
    int a = 0;
    argv[a++] = (char *)TDIST_BENCH_BIN;
    for (int i = 0; args[i] && a < 63; i++)
        argv[a++] = (char *)args[i];
    argv[a] = NULL;
    posix_spawn_file_actions_t fa;
    posix_spawn_file_actions_init(&fa);
    posix_spawn_file_actions_adddup2(&fa, out, 1);
    posix_spawn_file_actions_adddup2(&fa, err, 2);
    pid_t pid;
    TD_CHECK(posix_spawn(&pid, TDIST_BENCH_BIN, &fa, NULL, argv, env) == 0);
    posix_spawn_file_actions_destroy(&fa);
    free(env);
    close(out);
    close(err);
    int st;
    TD_CHECK(waitpid(pid, &st, 0) == pid);
    run_result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -WTERMSIG(st), slurp(out_path), slurp(err_path)};
    return r;
}

static void free_result(run_result *r)
{
    free(r->out);
    free(r->err);
}

typedef struct csv_row {
    char impl[32], op[32], dtype[16], redop[16];
    int world, root;
    long long size, count, wrong, iters;
    double time_us, algbw, busbw;
} csv_row;

/* Parses the CSV output into rows (at most max), checking the header and every row's
 * consistency; returns the number of rows. */
static int parse_csv(const run_result *r, csv_row *rows, int max, double busbw_factor)
{
    const char *p = r->out;
    size_t hl = strlen(CSV_HEADER);
    TD_CHECK_MSG(strncmp(p, CSV_HEADER "\n", hl + 1) == 0, "CSV header is not '%s':\n%s", CSV_HEADER, r->out);
    p += hl + 1;
    int n = 0;
    while (*p) {
        TD_CHECK_MSG(n < max, "too many rows:\n%s", r->out);
        csv_row *w = &rows[n];
        char wrong[32];
        int used = 0;
        int got = sscanf(p, "%31[^,],%31[^,],%d,%15[^,],%15[^,],%d,%lld,%lld,%lf,%lf,%lf,%31[^,],%lld%n", w->impl, w->op,
                         &w->world, w->dtype, w->redop, &w->root, &w->size, &w->count, &w->time_us, &w->algbw,
                         &w->busbw, wrong, &w->iters, &used);
        TD_CHECK_MSG(got == 13 && p[used] == '\n', "bad CSV row: %.*s", (int)strcspn(p, "\n"), p);
        TD_CHECK_MSG(strcmp(wrong, "0") == 0, "wrong elements: %.*s", (int)strcspn(p, "\n"), p);
        w->wrong = 0;
        TD_CHECK(w->time_us > 0);
        TD_CHECK(w->iters >= 2);
        double algbw = (double)w->size / w->time_us / 1e3;
        TD_CHECK_MSG(fabs(w->algbw - algbw) <= 1e-6 + 0.01 * algbw, "algbw %g, want %g", w->algbw, algbw);
        TD_CHECK_MSG(fabs(w->busbw - algbw * busbw_factor) <= 1e-6 + 0.01 * algbw, "busbw %g, want %g x %g", w->busbw,
                     algbw, busbw_factor);
        p += used + 1;
        n++;
    }
    return n;
}

TD_TEST(all_reduce_sizes, .params = "tcp,threaded", .timeout_s = 180)
{
    const char *args[] = {"-n", "2", "--op", "all_reduce", "--backend", ctx->param, "--min", "8", "--max", "64K",
                          "--csv", QUICK, NULL};
    run_result r = run_bench(ctx, args);
    TD_CHECK_MSG(r.code == 0, "exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    csv_row rows[32];
    int n = parse_csv(&r, rows, 32, 1.0);
    TD_CHECK_EQ(n, 14); /* 8 B to 64 KiB, doubling */
    char impl[32];
    snprintf(impl, sizeof impl, "tdist-%s", ctx->param);
    for (int i = 0; i < n; i++) {
        TD_CHECK_EQ(rows[i].size, 8LL << i);
        TD_CHECK_EQ(rows[i].count, 2LL << i);
        TD_CHECK_STR_EQ(rows[i].impl, impl);
        TD_CHECK_STR_EQ(rows[i].op, "all_reduce");
        TD_CHECK_STR_EQ(rows[i].dtype, "float32");
        TD_CHECK_STR_EQ(rows[i].redop, "SUM");
        TD_CHECK_EQ(rows[i].world, 2);
        TD_CHECK_EQ(rows[i].root, -1);
    }
    free_result(&r);
}

/* --step (nccl-tests' -i): sizes grow by a fixed number of bytes, as bench/shm/sweep.sh uses. */
TD_TEST(step_sizes, .timeout_s = 120)
{
    const char *args[] = {"-n", "2", "--backend", "threaded", "--min", "1K", "--max", "4K", "--step", "1K",
                          "--csv", QUICK, NULL};
    run_result r = run_bench(ctx, args);
    TD_CHECK_MSG(r.code == 0, "exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    csv_row rows[8];
    int n = parse_csv(&r, rows, 8, 1.0);
    TD_CHECK_EQ(n, 4); /* 1, 2, 3 and 4 KiB */
    for (int i = 0; i < n; i++)
        TD_CHECK_EQ(rows[i].size, 1024LL * (i + 1));
    free_result(&r);
}

static double factor_of(const char *op, int n)
{
    if (strcmp(op, "all_reduce") == 0)
        return 2.0 * (n - 1) / n;
    if (strcmp(op, "broadcast") == 0 || strcmp(op, "reduce") == 0 || strcmp(op, "send_recv") == 0)
        return 1.0;
    if (strcmp(op, "barrier") == 0)
        return 0.0;
    return (double)(n - 1) / n;
}

/* Every collective once, on three ranks (so that chunking by world size shows), root 1. */
TD_TEST(every_op, .params = "all_reduce,broadcast,reduce,all_gather,gather,scatter,reduce_scatter,all_to_all,barrier,"
                            "send_recv",
        .timeout_s = 120)
{
    const char *args[] = {"-n", "3", "--op", ctx->param, "--root", "1", "--min", "1K", "--max", "4K", "--csv", QUICK,
                          NULL};
    run_result r = run_bench(ctx, args);
    TD_CHECK_MSG(r.code == 0, "exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    csv_row rows[8];
    int n = parse_csv(&r, rows, 8, factor_of(ctx->param, 3));
    bool barrier = strcmp(ctx->param, "barrier") == 0;
    TD_CHECK_EQ(n, barrier ? 1 : 3);
    for (int i = 0; i < n; i++) {
        TD_CHECK_STR_EQ(rows[i].op, ctx->param);
        TD_CHECK_EQ(rows[i].world, 3);
        bool rooted = strcmp(ctx->param, "broadcast") == 0 || strcmp(ctx->param, "reduce") == 0 ||
                      strcmp(ctx->param, "gather") == 0 || strcmp(ctx->param, "scatter") == 0;
        TD_CHECK_EQ(rows[i].root, rooted ? 1 : -1);
        if (!barrier) {
            /* 1K, 2K, 4K; the collectives that split by rank round to whole elements per rank. */
            long long want = 1024LL << i;
            if (factor_of(ctx->param, 3) < 1.0)
                want = want / 4 / 3 * 3 * 4;
            TD_CHECK_EQ(rows[i].size, want);
            TD_CHECK_EQ(rows[i].count, want / 4);
        }
    }
    free_result(&r);
}

/* Reduce ops and dtypes where the check is subtle: rounding (f16, bf16 AVG), wrap-around (i8
 * PRODUCT), bool's OR and parity. reduce_scatter on the threaded backend keeps it quick. */
TD_TEST(dtypes_and_reduce_ops, .timeout_s = 180)
{
    static const char *const pairs[][2] = {
        {"bf16", "avg"}, {"f16", "premul_sum"}, {"f64", "max"}, {"i8", "product"},
        {"u8", "bxor"},  {"bool", "sum"},       {"bool", "bxor"}, {"i64", "min"},
    };
    for (size_t i = 0; i < sizeof pairs / sizeof *pairs; i++) {
        for (int b = 0; b < 2; b++) {
            const char *args[] = {"-n", "4", "--backend", b ? "threaded" : "tcp", "--op", b ? "reduce_scatter" : "all_reduce",
                                  "--dtype", pairs[i][0], "--reduce-op", pairs[i][1], "--min", "8", "--max", "64K",
                                  "--factor", "16", "--csv", QUICK, NULL};
            run_result r = run_bench(ctx, args);
            TD_CHECK_MSG(r.code == 0, "%s %s: exit code %d\nstdout:\n%s\nstderr:\n%s", pairs[i][0], pairs[i][1], r.code,
                         r.out, r.err);
            csv_row rows[8];
            TD_CHECK(parse_csv(&r, rows, 8, b ? 0.75 : 1.5) >= 4);
            free_result(&r);
        }
    }
}

TD_TEST(human_output, .timeout_s = 120)
{
    const char *args[] = {"-n", "2", "--op", "broadcast", "--min", "8", "--max", "16", QUICK, NULL};
    run_result r = run_bench(ctx, args);
    TD_CHECK_MSG(r.code == 0, "exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    TD_CHECK_CONTAINS(r.out, "# tdist-bench: broadcast, 2 ranks, backend tcp, dtype float32");
    TD_CHECK_CONTAINS(r.out, "time(us)  algbw(GB/s)  busbw(GB/s)   #wrong");
    TD_CHECK_CONTAINS(r.out, "# wrong elements: 0 (OK)");
    int rows = 0;
    for (const char *p = r.out; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0))
        rows += p[0] == ' ';
    TD_CHECK_EQ(rows, 2);
    free_result(&r);
}

TD_TEST(bad_arguments_exit_2, .timeout_s = 60)
{
    static const struct {
        const char *args[8];
        const char *message;
    } cases[] = {
        {{"--dtype", "c64", NULL}, "unsupported --dtype 'c64'"},
        {{"--dtype", "i32", "--reduce-op", "avg", NULL}, "AVG"},
        {{"--op", "all_everything", NULL}, "unknown --op 'all_everything'"},
        {{"--min", "1M", "--max", "1K", NULL}, "--min is larger than --max"},
        {{"-n", "2", "--op", "broadcast", "--root", "2", NULL}, "--root 2 is not a rank of a world of 2"},
        {{"-n", "1", "--op", "send_recv", NULL}, "send_recv needs at least 2 ranks"},
        {{"--step", "0", NULL}, "--step wants a size of at least one byte, got '0'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_result r = run_bench(ctx, cases[i].args);
        TD_CHECK_MSG(r.code == 2, "case %zu: exit code %d, stderr %s", i, r.code, r.err);
        TD_CHECK_CONTAINS(r.err, cases[i].message);
        free_result(&r);
    }
}

TD_TEST_MAIN()
