/* tdist-bench smoke tests: the real program, started as a user would (without a launcher's
 * variables, so that it spawns its own ranks, or runs them as threads for the threaded backend),
 * at small sizes with few iterations. Each case checks the exit code, that no element was wrong,
 * and the CSV columns bench/ relies on (the sizes, counts, and algbw and busbw consistent with the
 * time and nccl-tests' factors) with the in-place columns after them; and that each of nccl-tests'
 * flags has its effect: -n timed calls, -w warm-up calls, -c the check, -o the reduce op, -d the
 * dtype, -r the root, -b/-e/-f/-i the sizes, --nproc the ranks. */
#include <fcntl.h>
#include <math.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <tdist/testing.h>

extern char **environ;

#define CSV_HEADER                                                                                                 \
    "impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters,placement,inplace_time_us,"    \
    "inplace_algbw_gbs,inplace_busbw_gbs,inplace_wrong,inplace_iters"
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

/* run_bench for a run that must succeed. */
static run_result run_ok(td_test_ctx *ctx, const char *const *args)
{
    run_result r = run_bench(ctx, args);
    TD_CHECK_MSG(r.code == 0, "exit code %d\nstdout:\n%s\nstderr:\n%s", r.code, r.out, r.err);
    return r;
}

/* One form's figures; iters -1 where the CSV says N/A (the op has no such second form). */
typedef struct csv_form {
    double time_us, algbw, busbw;
    char wrong[32];
    long long iters;
} csv_form;

typedef struct csv_row {
    char impl[32], op[32], dtype[16], redop[16], placement[16];
    int world, root;
    long long size, count;
    csv_form main_form, inplace; /* time_us..iters (the form `placement` names), inplace_* */
} csv_row;

/* A form's consistency: algbw and busbw follow from the time and nccl-tests' factor, and the
 * wrong count is want_wrong ("0", or "N/A" without the check). */
static void check_form(const csv_form *f, long long size, double busbw_factor, const char *want_wrong, const char *line,
                       int line_len)
{
    TD_CHECK_MSG(strcmp(f->wrong, want_wrong) == 0, "wrong elements '%s', want '%s': %.*s", f->wrong, want_wrong,
                 line_len, line);
    TD_CHECK(f->time_us > 0);
    TD_CHECK(f->iters >= 1);
    double algbw = (double)size / f->time_us / 1e3;
    TD_CHECK_MSG(fabs(f->algbw - algbw) <= 1e-6 + 0.01 * algbw, "algbw %g, want %g", f->algbw, algbw);
    TD_CHECK_MSG(fabs(f->busbw - algbw * busbw_factor) <= 1e-6 + 0.01 * algbw, "busbw %g, want %g x %g", f->busbw, algbw,
                 busbw_factor);
}

/* Parses the CSV output into rows (at most max), checking the header and every row's
 * consistency; returns the number of rows. want_wrong: "0", or "N/A" for runs with --check 0. */
static int parse_csv_checked(const run_result *r, csv_row *rows, int max, double busbw_factor, const char *want_wrong)
{
    const char *p = r->out;
    size_t hl = strlen(CSV_HEADER);
    TD_CHECK_MSG(strncmp(p, CSV_HEADER "\n", hl + 1) == 0, "CSV header is not '%s':\n%s", CSV_HEADER, r->out);
    p += hl + 1;
    int n = 0;
    while (*p) {
        TD_CHECK_MSG(n < max, "too many rows:\n%s", r->out);
        csv_row *w = &rows[n];
        csv_form *m = &w->main_form, *ip = &w->inplace;
        char ip_time[32], ip_algbw[32], ip_busbw[32], ip_iters[32];
        int used = 0, len = (int)strcspn(p, "\n");
        int got = sscanf(p,
                         "%31[^,],%31[^,],%d,%15[^,],%15[^,],%d,%lld,%lld,%lf,%lf,%lf,%31[^,],%lld,"
                         "%15[^,],%31[^,],%31[^,],%31[^,],%31[^,],%31[^,\n]%n",
                         w->impl, w->op, &w->world, w->dtype, w->redop, &w->root, &w->size, &w->count, &m->time_us,
                         &m->algbw, &m->busbw, m->wrong, &m->iters, w->placement, ip_time, ip_algbw, ip_busbw, ip->wrong,
                         ip_iters, &used);
        TD_CHECK_MSG(got == 19 && p[used] == '\n', "bad CSV row: %.*s", len, p);
        check_form(m, w->size, busbw_factor, want_wrong, p, len);
        TD_CHECK_MSG(strcmp(w->placement, "out-of-place") == 0 || strcmp(w->placement, "in-place") == 0,
                     "bad placement: %.*s", len, p);
        if (strcmp(ip_time, "N/A") == 0) {
            TD_CHECK_MSG(strcmp(ip_algbw, "N/A") == 0 && strcmp(ip_busbw, "N/A") == 0 && strcmp(ip->wrong, "N/A") == 0 &&
                             strcmp(ip_iters, "N/A") == 0,
                         "in-place columns partly N/A: %.*s", len, p);
            ip->iters = -1;
        } else {
            TD_CHECK_MSG(strcmp(w->placement, "out-of-place") == 0, "in-place figures twice: %.*s", len, p);
            ip->time_us = atof(ip_time);
            ip->algbw = atof(ip_algbw);
            ip->busbw = atof(ip_busbw);
            ip->iters = atoll(ip_iters);
            check_form(ip, w->size, busbw_factor, want_wrong, p, len);
        }
        p += used + 1;
        n++;
    }
    return n;
}

static int parse_csv(const run_result *r, csv_row *rows, int max, double busbw_factor)
{
    return parse_csv_checked(r, rows, max, busbw_factor, "0");
}

TD_TEST(all_reduce_sizes, .params = "tcp,threaded", .timeout_s = 180)
{
    const char *args[] = {"--nproc", "2", "--op", "all_reduce", "--backend", ctx->param, "--min", "8", "--max", "64K",
                          "--csv", QUICK, NULL};
    run_result r = run_ok(ctx, args);
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
        TD_CHECK_STR_EQ(rows[i].placement, "in-place"); /* all_reduce has no other form */
        TD_CHECK_EQ(rows[i].inplace.iters, -1);
    }
    free_result(&r);
}

/* --step (nccl-tests' -i): sizes grow by a fixed number of bytes, as bench/shm/sweep.sh uses. */
TD_TEST(step_sizes, .timeout_s = 120)
{
    const char *args[] = {"--nproc", "2", "--backend", "threaded", "--min", "1K", "--max", "4K", "--step", "1K",
                          "--csv", QUICK, NULL};
    run_result r = run_ok(ctx, args);
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

/* The forms tdist's API has for an op: both, in place only (one tensor), or out of place only. */
static bool has_both_forms(const char *op)
{
    return strcmp(op, "all_gather") == 0 || strcmp(op, "reduce_scatter") == 0 || strcmp(op, "all_to_all") == 0;
}

static bool in_place_only(const char *op)
{
    return strcmp(op, "all_reduce") == 0 || strcmp(op, "broadcast") == 0 || strcmp(op, "reduce") == 0;
}

/* Every collective once, on three ranks (so that chunking by world size shows), root 1, in each
 * form it has: both column sets carry checked figures for all_gather, reduce_scatter and
 * all_to_all (placement out-of-place, then the inplace_* columns); the others fill one. */
TD_TEST(every_op, .params = "all_reduce,broadcast,reduce,all_gather,gather,scatter,reduce_scatter,all_to_all,barrier,"
                            "send_recv",
        .timeout_s = 120)
{
    const char *args[] = {"--nproc", "3", "--op", ctx->param, "--root", "1", "--min", "1K", "--max", "4K", "--csv", QUICK,
                          NULL};
    run_result r = run_ok(ctx, args);
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
        TD_CHECK_STR_EQ(rows[i].placement, in_place_only(ctx->param) ? "in-place" : "out-of-place");
        if (has_both_forms(ctx->param))
            TD_CHECK(rows[i].inplace.iters >= 2); /* measured, and checked by parse_csv */
        else
            TD_CHECK_EQ(rows[i].inplace.iters, -1);
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
            const char *args[] = {"--nproc", "4", "--backend", b ? "threaded" : "tcp",
                                  "--op", b ? "reduce_scatter" : "all_reduce", "--dtype", pairs[i][0], "--reduce-op", pairs[i][1], "--min", "8", "--max", "64K",
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

/* The rows of the human-readable output (those that start with a space), up to max, as pointers
 * into r->out; returns how many. */
static int text_rows(const run_result *r, const char **rows, int max)
{
    int n = 0;
    for (const char *p = r->out; *p; p += strcspn(p, "\n") + (p[strcspn(p, "\n")] != 0))
        if (p[0] == ' ') {
            TD_CHECK_MSG(n < max, "too many rows:\n%s", r->out);
            rows[n++] = p;
        }
    return n;
}

/* The whitespace-separated fields of one output line (at most max). */
static int fields_of(const char *line, char fields[][32], int max)
{
    int n = 0, used = 0;
    line += strspn(line, " ");
    while (*line && *line != '\n' && n < max && sscanf(line, "%31s%n", fields[n], &used) == 1) {
        n++;
        line += used;
        line += strspn(line, " ");
    }
    return n;
}

/* Both column sets, as nccl-tests prints them: size count type redop root, then time, algbw,
 * busbw, #wrong and iters out of place and in place; N/A in every column of the set of a form
 * the op does not have (broadcast: in place only; gather: out of place only). The default
 * backend is auto. */
TD_TEST(human_output, .params = "broadcast,all_gather,reduce_scatter,gather", .timeout_s = 120)
{
    const char *args[] = {"--nproc", "2", "--op", ctx->param, "--min", "8", "--max", "16", QUICK, NULL};
    run_result r = run_ok(ctx, args);
    char want[128];
    snprintf(want, sizeof want, "# tdist-bench: %s, 2 ranks, backend auto, dtype float32", ctx->param);
    TD_CHECK_CONTAINS(r.out, want);
    TD_CHECK_CONTAINS(r.out, "out-of-place");
    TD_CHECK_CONTAINS(r.out, "in-place");
    TD_CHECK_CONTAINS(r.out, "time(us)  algbw(GB/s)  busbw(GB/s)   #wrong     iters    time(us)  algbw(GB/s)  "
                             "busbw(GB/s)   #wrong     iters");
    TD_CHECK_CONTAINS(r.out, "# wrong elements: 0 (OK)");
    const char *rows[4];
    TD_CHECK_EQ(text_rows(&r, rows, 4), 2);
    bool out_form = !in_place_only(ctx->param), in_form = in_place_only(ctx->param) || has_both_forms(ctx->param);
    for (int i = 0; i < 2; i++) {
        char f[16][32];
        TD_CHECK_MSG(fields_of(rows[i], f, 16) == 15, "row %d has not 15 fields:\n%s", i, r.out);
        for (int set = 0; set < 2; set++) {
            bool has = set == 0 ? out_form : in_form;
            for (int k = 5 + 5 * set; k < 10 + 5 * set; k++) {
                if (!has)
                    TD_CHECK_MSG(strcmp(f[k], "N/A") == 0, "row %d field %d is '%s', want N/A:\n%s", i, k, f[k], r.out);
                else
                    TD_CHECK_MSG(strcmp(f[k], "N/A") != 0 && atof(f[k]) >= 0, "row %d field %d is '%s':\n%s", i, k, f[k],
                                 r.out);
            }
            if (has) {
                TD_CHECK(atof(f[5 + 5 * set]) > 0);              /* time */
                TD_CHECK_STR_EQ(f[8 + 5 * set], "0");            /* #wrong */
            }
        }
    }
    free_result(&r);
}

/* The fields of the one row of a human-readable run of one size (15: size, count, type, redop,
 * root, then five out of place and five in place). */
static void single_text_row(const run_result *r, char fields[16][32])
{
    const char *rows[2];
    TD_CHECK_EQ(text_rows(r, rows, 2), 1);
    TD_CHECK_MSG(fields_of(rows[0], fields, 16) == 15, "the row has not 15 fields:\n%s", r->out);
}

/* -n is nccl-tests' iteration count (timed calls per size, in each form): exactly that many,
 * however the batches split them; --iters=N is the same flag. */
TD_TEST(iters_flag, .timeout_s = 120)
{
    static const struct {
        const char *flag, *value;
        long long want;
    } cases[] = {{"-n", "3", 3}, {"-n", "13", 13}, {"--iters=7", NULL, 7}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *args[] = {"--nproc", "2", "--backend", "threaded", "--op", "all_gather", "-b", "64", "-e", "256",
                              "-w", "0", "--batches", "10", "--csv", cases[i].flag, cases[i].value, NULL};
        run_result r = run_ok(ctx, args);
        csv_row rows[8];
        TD_CHECK_EQ(parse_csv(&r, rows, 8, 0.5), 3);
        for (int k = 0; k < 3; k++) {
            TD_CHECK_EQ(rows[k].main_form.iters, cases[i].want);
            TD_CHECK_EQ(rows[k].inplace.iters, cases[i].want);
        }
        free_result(&r);
    }
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* -w N makes N warm-up calls per size: the header says so, and the run lasts at least a quarter
 * of N times the measured time per call (a quarter, so that the timed calls may run up to four
 * times slower than the warm-up ones on a loaded machine, and a median of 5 batches, which a
 * descheduled moment does not move; without the warm-up the run would last about 20 calls and the
 * start). */
TD_TEST(warmup_flag, .timeout_s = 120)
{
    const char *args[] = {"--nproc", "2", "--backend", "threaded", "-b", "64K", "-e", "64K", "-n", "20", "-w", "1000",
                          "--batches", "5", "-c", "0", NULL};
    double t0 = now_s();
    run_result r = run_ok(ctx, args);
    double wall = now_s() - t0;
    TD_CHECK_CONTAINS(r.out, "# warm-up: 1000 calls per size and form");
    char f[16][32];
    single_text_row(&r, f);
    double per_call = atof(f[10]) * 1e-6; /* all_reduce is in place: the second set */
    TD_CHECK(per_call > 0);
    TD_CHECK_MSG(wall >= 0.25 * 1000 * per_call, "a run with 1000 warm-up calls of %g us took %g s", per_call * 1e6,
                 wall);
    free_result(&r);
    const char *adaptive[] = {"--nproc", "2", "--backend", "threaded", "-e", "8", "--time", "0.005", "--min-iters", "2",
                              "--batches", "2", NULL};
    r = run_ok(ctx, adaptive);
    TD_CHECK_CONTAINS(r.out, "# warm-up: about 50 ms of calls per size and form");
    free_result(&r);
}

/* -c 0: nothing is checked, and the output says so (N/A where the count of wrong elements goes). */
TD_TEST(check_flag_off, .timeout_s = 120)
{
    const char *args[] = {"--nproc", "2", "--backend", "threaded", "--op", "reduce_scatter", "-e", "64", "-f", "8", "-c",
                          "0", "--csv", QUICK, NULL};
    run_result r = run_ok(ctx, args);
    csv_row rows[4];
    TD_CHECK_EQ(parse_csv_checked(&r, rows, 4, 0.5, "N/A"), 2);
    free_result(&r);
    const char *text[] = {"--nproc", "2", "--backend", "threaded", "-e", "8", "--check=0", QUICK, NULL};
    r = run_ok(ctx, text);
    TD_CHECK_CONTAINS(r.out, "# wrong elements: 0 (not checked)");
    char f[16][32];
    single_text_row(&r, f);
    TD_CHECK_STR_EQ(f[13], "N/A");
    free_result(&r);
}

/* --nproc N starts N ranks (processes, or threads for the threaded backend); --nranks is the
 * same; the default backend is auto (the impl column tdist-auto). */
TD_TEST(nproc_and_default_backend, .timeout_s = 120)
{
    const char *procs[] = {"--nproc", "3", "-e", "8", "--csv", QUICK, NULL};
    run_result r = run_ok(ctx, procs);
    csv_row rows[4];
    TD_CHECK_EQ(parse_csv(&r, rows, 4, 4.0 / 3), 1);
    TD_CHECK_EQ(rows[0].world, 3);
    TD_CHECK_STR_EQ(rows[0].impl, "tdist-auto");
    free_result(&r);
    const char *threads[] = {"--nranks=4", "--backend", "threaded", "-e", "8", "--csv", QUICK, NULL};
    r = run_ok(ctx, threads);
    TD_CHECK_EQ(parse_csv(&r, rows, 4, 1.5), 1);
    TD_CHECK_EQ(rows[0].world, 4);
    TD_CHECK_STR_EQ(rows[0].impl, "tdist-threaded");
    free_result(&r);
}

/* nccl-tests' spellings: -b/-e/-f and --minbytes/--maxbytes/--stepfactor/--stepbytes for the
 * sizes, -d/--datatype with its dtype names, -o/--op with its reduction names (all: one row per
 * reduction the dtype takes), -r/--root. */
TD_TEST(nccl_tests_flags, .timeout_s = 180)
{
    const char *short_flags[] = {"--nproc", "3", "--backend", "threaded", "--op", "reduce", "-d", "double", "-o", "max",
                                 "-r", "2", "-b", "1K", "-e", "16K", "-f", "4", "--csv", QUICK, NULL};
    run_result r = run_ok(ctx, short_flags);
    csv_row rows[8];
    TD_CHECK_EQ(parse_csv(&r, rows, 8, 1.0), 3);
    for (int i = 0; i < 3; i++) {
        TD_CHECK_EQ(rows[i].size, 1024LL << (2 * i));
        TD_CHECK_STR_EQ(rows[i].dtype, "float64");
        TD_CHECK_STR_EQ(rows[i].redop, "MAX");
        TD_CHECK_EQ(rows[i].root, 2);
    }
    free_result(&r);

    const char *long_flags[] = {"--nproc", "2", "--backend", "threaded", "--op=reduce_scatter", "--datatype=bfloat16",
                                "--op", "prod", "--minbytes=64", "--maxbytes", "256", "--stepbytes=64", "--csv", QUICK,
                                NULL};
    r = run_ok(ctx, long_flags);
    TD_CHECK_EQ(parse_csv(&r, rows, 8, 0.5), 4);
    for (int i = 0; i < 4; i++) {
        TD_CHECK_EQ(rows[i].size, 64LL * (i + 1));
        TD_CHECK_STR_EQ(rows[i].op, "reduce_scatter");
        TD_CHECK_STR_EQ(rows[i].dtype, "bfloat16");
        TD_CHECK_STR_EQ(rows[i].redop, "PRODUCT");
    }
    free_result(&r);

    const char *all_ops[] = {"--nproc", "2", "--backend", "threaded", "-d", "int32", "-o", "all", "-b", "8", "-e", "32",
                             "--stepfactor=4", "--csv", QUICK, NULL};
    r = run_ok(ctx, all_ops);
    static const char *const int_ops[] = {"SUM", "PRODUCT", "MIN", "MAX"}; /* AVG needs a floating dtype */
    TD_CHECK_EQ(parse_csv(&r, rows, 8, 1.0), 8);
    for (int i = 0; i < 8; i++) {
        TD_CHECK_EQ(rows[i].size, i < 4 ? 8 : 32);
        TD_CHECK_STR_EQ(rows[i].dtype, "int32");
        TD_CHECK_STR_EQ(rows[i].redop, int_ops[i % 4]);
    }
    free_result(&r);
}

TD_TEST(bad_arguments_exit_2, .timeout_s = 60)
{
    static const struct {
        const char *args[8];
        const char *message;
    } cases[] = {
        {{"--dtype", "c64", NULL}, "unsupported --dtype 'c64'"},
        {{"-d", "uint32", NULL}, "unsupported -d 'uint32'"},
        {{"--dtype", "i32", "--reduce-op", "avg", NULL}, "AVG"},
        {{"-o", "mulsum", NULL}, "unknown -o 'mulsum'"},
        {{"--op", "all_everything", NULL}, "unknown --op 'all_everything'"},
        {{"--min", "1M", "--max", "1K", NULL}, "--min is larger than --max"},
        {{"--nproc", "2", "--op", "broadcast", "--root", "2", NULL}, "--root 2 is not a rank of a world of 2"},
        {{"--nproc", "1", "--op", "send_recv", NULL}, "send_recv needs at least 2 ranks"},
        {{"--step", "0", NULL}, "--step wants a size of at least one byte, got '0'"},
        {{"-n", "0", NULL}, "-n must be between 1 and"},
        {{"--nproc", "0", NULL}, "--nproc must be between 1 and 4096"},
        {{"-w", "x", NULL}, "-w must be an integer, got 'x'"},
        {{"--iters", NULL}, "--iters needs a value"},
        {{"-t", "2", NULL}, "unknown argument '-t'"},
        {{"--nranks2", "2", NULL}, "unknown argument '--nranks2'"},
        {{"--backend", "nosuch", NULL}, "unknown --backend 'nosuch'"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        run_result r = run_bench(ctx, cases[i].args);
        TD_CHECK_MSG(r.code == 2, "case %zu: exit code %d, stderr %s", i, r.code, r.err);
        TD_CHECK_CONTAINS(r.err, cases[i].message);
        TD_CHECK(r.out[0] == '\0'); /* nothing ran */
        free_result(&r);
    }
}

TD_TEST_MAIN()
