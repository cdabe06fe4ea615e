/* The command line of a test binary (td_test_main).
 *
 * td_test_main either runs as a rank (the harness re-executed the binary with --td-child) or as the
 * runner: it lists the cases, writes them as CTest entries (--ctest FILE, used by
 * tests/CMakeLists.txt after each build), or runs the selected cases one after another under the
 * supervisor (supervisor.c), printing gtest-like lines, and exits 0 (all passed or skipped), 1 (a
 * failure) or 77 (everything was skipped).
 *
 * External launchers: `--td-external NAME` runs one rank of one instance in this process, taking
 * the rank and world size from the launcher's environment (base/launcher.h), as c10d's
 * MultiProcContinousTest does under torchrun; `--ctest-launcher PARAM=COMMAND` (given with
 * --ctest) makes the instances of parameter PARAM CTest entries that run
 * `COMMAND <binary> --td-external NAME`, "{np}" in COMMAND becoming the case's world size (how the
 * mpi backend's cases run under mpirun). */
#include <ctype.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/alloc.h"
#include "base/env.h"
#include "base/error.h"
#include "base/launcher.h"
#include "testing/harness.h"

#include <tdist/mp.h>

static td_status validate_registry(void)
{
    for (td_test_case *c = harness_cases(); c; c = c->next) {
        if (!c->name || !c->name[0] || !c->fn)
            return error_fmt(TD_ERR_INVALID, "a test case has no name or no body");
        if (c->world_size < 0 || c->world_size > 64)
            return error_fmt(TD_ERR_INVALID, "test case %s: world_size must be between 1 and 64, got %d", c->name,
                            c->world_size);
        if (c->suite && c->threads)
            return error_fmt(TD_ERR_INVALID, "test case %s: a suite's cases run process ranks, not threads", c->name);
        if (c->timeout_s < 0)
            return error_fmt(TD_ERR_INVALID, "test case %s: timeout_s must be >= 0, got %d", c->name, c->timeout_s);
        for (td_test_case *d = c->next; d; d = d->next)
            if (strcmp(c->name, d->name) == 0)
                return error_fmt(TD_ERR_INVALID, "test case %s is registered twice", c->name);
    }
    return TD_OK;
}

/* ---- selection ---------------------------------------------------------------------------- */

typedef struct selection {
    harness_instance *items; /* names and parameters owned */
    size_t len, cap;
    int argc;
    char **argv;
    bool *used; /* per argv pattern: matched something */
} selection;

static void select_param(void *arg, const td_test_case *cc, const char *param, size_t plen)
{
    selection *s = arg;
    td_test_case *c = (td_test_case *)cc;
    char *name = harness_instance_name(c, param, plen);
    bool take = s->argc == 0 && !c->hidden;
    for (int i = 0; i < s->argc; i++) {
        const char *pat = s->argv[i];
        bool exact = strcmp(pat, name) == 0 || strcmp(pat, c->name) == 0;
        bool prefix = !c->hidden && strncmp(pat, name, strlen(pat)) == 0;
        if (exact || prefix) {
            take = true;
            s->used[i] = true;
        }
    }
    if (!take) {
        free(name);
        return;
    }
    if (s->len == s->cap) {
        s->cap = s->cap ? s->cap * 2 : 16;
        s->items = alloc_resize(s->items, s->cap * sizeof *s->items);
    }
    s->items[s->len++] = (harness_instance){c, name, alloc_strndup(param, plen)};
}

static void selection_free(selection *s)
{
    for (size_t i = 0; i < s->len; i++) {
        free((char *)s->items[i].name);
        free((char *)s->items[i].param);
    }
    free(s->items);
    free(s->used);
}

/* ---- CTest listing ------------------------------------------------------------------------ */

static const char *base_name(const char *path)
{
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

/* --ctest-launcher PARAM=COMMAND: the instances of PARAM run under COMMAND. */
typedef struct launcher {
    const char *param;
    size_t param_len;
    const char *command;
} launcher;

static const launcher *launcher_for(const launcher *ls, int n, const char *param)
{
    for (int i = 0; i < n; i++)
        if (strlen(param) == ls[i].param_len && strncmp(param, ls[i].param, ls[i].param_len) == 0)
            return &ls[i];
    return NULL;
}

/* COMMAND's words as CTest arguments, "{np}" replaced by the world size. */
static void write_launcher_words(FILE *f, const char *command, int np)
{
    const char *p = command;
    for (;;) {
        while (*p == ' ')
            p++;
        if (!*p)
            break;
        size_t n = strcspn(p, " ");
        if (n == 4 && strncmp(p, "{np}", 4) == 0)
            fprintf(f, " [==[%d]==]", np);
        else
            fprintf(f, " [==[%.*s]==]", (int)n, p);
        p += n;
    }
}

static int write_ctest(const char *file, const char *exe, const launcher *launchers, int nlaunchers)
{
    selection sel = {0};
    for (td_test_case *c = harness_cases(); c; c = c->next)
        harness_for_each_param(c, select_param, &sel);
    char *tmp = alloc_printf("%s.tmp", file);
    FILE *f = fopen(tmp, "we");
    if (!f) {
        fprintf(stderr, "cannot write %s: %s\n", tmp, strerror(errno));
        free(tmp);
        selection_free(&sel);
        return 1;
    }
    const char *bin = base_name(exe);
    fprintf(f, "# Generated by %s --ctest: one entry per test case (tdist/testing.h).\n", bin);
    for (size_t i = 0; i < sel.len; i++) {
        const harness_instance *in = &sel.items[i];
        int ws = harness_world_size(in->c);
        int procs = ws < 2 ? ws : 2; /* threaded ranks compete for cores too */
        long long timeout = (long long)(harness_timeout_ms(in->c) / 1000) + 30;
        const launcher *l = launcher_for(launchers, nlaunchers, in->param);
        if (l && !in->c->threads) {
            /* The launcher starts the ranks; each skips by exiting with a skip code after its line. */
            fprintf(f, "add_test([==[%s.%s]==]", bin, in->name);
            write_launcher_words(f, l->command, ws);
            fprintf(f, " [==[%s]==] [==[--td-external]==] [==[%s]==])\n", exe, in->name);
            fprintf(f,
                    "set_tests_properties([==[%s.%s]==] PROPERTIES TIMEOUT %lld PROCESSORS %d "
                    "SKIP_REGULAR_EXPRESSION [==[skipping test .* for following reason]==] LABELS [==[tdist;%s]==])\n",
                    bin, in->name, timeout, procs, in->param);
            continue;
        }
        fprintf(f, "add_test([==[%s.%s]==] [==[%s]==] [==[%s]==])\n", bin, in->name, exe, in->name);
        /* Instances of the parameter "cuda" run on real GPUs: CTest's label gpu selects them. */
        fprintf(f,
                "set_tests_properties([==[%s.%s]==] PROPERTIES TIMEOUT %lld PROCESSORS %d SKIP_RETURN_CODE 77 "
                "LABELS [==[%s]==])\n",
                bin, in->name, timeout, procs, strcmp(in->param, "cuda") == 0 ? "tdist;gpu" : "tdist");
    }
    int rc = 0;
    if (fclose(f) != 0 || rename(tmp, file) != 0) {
        fprintf(stderr, "cannot write %s: %s\n", file, strerror(errno));
        rc = 1;
    }
    free(tmp);
    selection_free(&sel);
    return rc;
}

/* ---- the runner --------------------------------------------------------------------------- */

static int usage(const char *argv0)
{
    fprintf(stderr,
            "usage: %s [--list] [--ctest FILE [--ctest-launcher PARAM=COMMAND ...]] [--keep-going] [NAME_OR_PREFIX ...]\n"
            "       %s --td-external NAME   (one rank of NAME, under a launcher such as mpirun)\n"
            "  Runs the test cases (all visible ones, or those named; a hidden case runs only by its\n"
            "  exact name). Environment: TDIST_TEST_TIMEOUT, TDIST_TEST_SANDCASTLE, TDIST_TEST_QUIET.\n",
            argv0, argv0);
    return 2;
}

/* The directory the ranks of one launched job share: named after the job (the launcher's job id,
 * else the parent process, which is the launcher's on one host) and the case. */
static char *external_dir(const char *name)
{
    const char *tmp = env_get_str("TMPDIR", "/tmp");
    char job[128];
    const char *ns = env_get_str("PMIX_NAMESPACE", env_get_str("OMPI_MCA_ess_base_jobid", NULL));
    const char *slurm = env_get_str("SLURM_JOB_ID", NULL);
    if (ns)
        snprintf(job, sizeof job, "%s", ns);
    else if (slurm)
        snprintf(job, sizeof job, "%s.%s", slurm, env_get_str("SLURM_STEP_ID", "0"));
    else
        snprintf(job, sizeof job, "p%d", (int)getppid());
    char *dir = alloc_printf("%s/tdist-test-%s-%s", tmp, job, name);
    for (char *p = dir + strlen(tmp) + 1; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '-' && *p != '.')
            *p = '_';
    return dir;
}

static int external_entry(const char *argv0, const char *name)
{
    td_test_case *c;
    const char *param;
    size_t plen;
    if (!harness_find(name, &c, &param, &plen)) {
        fprintf(stderr, "%s: no test case named '%s' (--list shows them)\n", argv0, name);
        return 2;
    }
    if (c->threads) {
        fprintf(stderr, "%s: %s runs its ranks as threads of one process; --td-external runs process ranks\n", argv0,
                name);
        return 2;
    }
    td_launcher_env env;
    if (launcher_env_read(true, &env) != TD_OK) {
        fprintf(stderr, "%s: --td-external %s: %s\n", argv0, name, td_last_error());
        return 2;
    }
    int ws = harness_world_size(c);
    if (env.world_size != ws) {
        fprintf(stderr, "%s: case %s runs %d ranks, but the launcher started %d (%s=%d)\n", argv0, name, ws,
                env.world_size, env.size_var, env.world_size);
        return 2;
    }
    char *dir = external_dir(name);
    if (mkdir(dir, 0700) != 0 && errno != EEXIST) {
        fprintf(stderr, "%s: cannot create %s: %s\n", argv0, dir, strerror(errno));
        free(dir);
        return 2;
    }
    td_harness_child_args a = {.name = name, .rank = env.rank, .world_size = ws, .dir = dir, .ctl_fd = -1};
    int rc = harness_child_main(&a);
    rmdir(dir); /* the last rank out removes it; files the case left stay for a look */
    free(dir);
    return rc;
}

static int child_entry(int argc, char **argv)
{
    td_harness_child_args a = {.rank = -1, .world_size = 0, .ctl_fd = -1};
    for (int i = 1; i + 1 < argc; i += 2) {
        const char *k = argv[i], *v = argv[i + 1];
        if (strcmp(k, "--td-child") == 0)
            a.name = v;
        else if (strcmp(k, "--td-rank") == 0)
            a.rank = atoi(v);
        else if (strcmp(k, "--td-world") == 0)
            a.world_size = atoi(v);
        else if (strcmp(k, "--td-dir") == 0)
            a.dir = v;
        else if (strcmp(k, "--td-ctl") == 0)
            a.ctl_fd = atoi(v);
        else if (strcmp(k, "--td-cases") == 0)
            a.suite_cases = v;
    }
    if (!a.name || !a.dir || a.rank < 0 || a.world_size <= 0 || a.ctl_fd < 0) {
        fprintf(stderr, "tdist test harness: malformed child command line\n");
        return 2;
    }
    return harness_child_main(&a);
}

int td_test_main(int argc, char **argv)
{
    /* A process started by td_mp_spawn's spawn method runs its entry point, not the tests. */
    TD_MP_MAIN_PROLOGUE(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--td-child") == 0)
        return child_entry(argc, argv);
    if (argc > 1 && strcmp(argv[1], "--td-external") == 0) {
        if (argc != 3 || validate_registry() != TD_OK) {
            if (argc == 3)
                fprintf(stderr, "%s\n", td_last_error());
            return usage(argv[0]);
        }
        return external_entry(argv[0], argv[2]);
    }
    if (validate_registry() != TD_OK) {
        fprintf(stderr, "%s\n", td_last_error());
        return 1;
    }
    bool list = false, keep_going = false;
    const char *ctest = NULL;
    char **names = alloc_zeroed((size_t)argc + 1, sizeof *names);
    int nnames = 0;
    launcher *launchers = alloc_zeroed((size_t)argc + 1, sizeof *launchers);
    int nlaunchers = 0;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--list") == 0) {
            list = true;
        } else if (strcmp(argv[i], "--keep-going") == 0) {
            keep_going = true;
        } else if (strcmp(argv[i], "--ctest") == 0 && i + 1 < argc) {
            ctest = argv[++i];
        } else if (strcmp(argv[i], "--ctest-launcher") == 0 && i + 1 < argc && strchr(argv[i + 1], '=')) {
            const char *spec = argv[++i];
            launchers[nlaunchers++] = (launcher){spec, (size_t)(strchr(spec, '=') - spec), strchr(spec, '=') + 1};
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0 || argv[i][0] == '-') {
            free(names);
            free(launchers);
            return usage(argv[0]);
        } else {
            names[nnames++] = argv[i];
        }
    }
    if (ctest) {
        char exe[4096];
        ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
        exe[n > 0 ? n : 0] = '\0';
        free(names);
        int rc = write_ctest(ctest, n > 0 ? exe : argv[0], launchers, nlaunchers);
        free(launchers);
        return rc;
    }
    free(launchers);
    selection sel = {.argc = nnames, .argv = names, .used = alloc_zeroed((size_t)nnames + 1, sizeof(bool))};
    for (td_test_case *c = harness_cases(); c; c = c->next)
        harness_for_each_param(c, select_param, &sel);
    int rc = 0;
    for (int i = 0; i < nnames; i++)
        if (!sel.used[i]) {
            fprintf(stderr, "no test case matches '%s' (--list shows them)\n", names[i]);
            rc = 2;
        }
    if (rc == 0 && list) {
        for (size_t i = 0; i < sel.len; i++)
            printf("%s\n", sel.items[i].name);
    } else if (rc == 0) {
        size_t passed = 0, skipped = 0, failed = 0;
        const harness_instance *todo = sel.items;
        for (size_t i = 0; i < sel.len;) {
            /* Consecutive cases of one suite run in one spawn; their lines come after it. */
            int len = harness_batch_len(todo + i, (int)(sel.len - i));
            td_test_result *rs = alloc_zeroed((size_t)len, sizeof *rs);
            if (len == 1) {
                printf("[ RUN      ] %s\n", todo[i].name);
                fflush(stdout);
            }
            harness_supervise(todo + i, len, rs);
            for (int j = 0; j < len; j++) {
                const char *name = todo[i + (size_t)j].name;
                const td_test_result *r = &rs[j];
                if (len > 1)
                    printf("[ RUN      ] %s (suite %s)\n", name, todo[i].c->suite);
                if (r->verdict == TD_TEST_PASS) {
                    passed++;
                    printf("[       OK ] %s (%.2f s)\n", name, r->elapsed_s);
                } else if (r->verdict == TD_TEST_SKIP) {
                    skipped++;
                    printf("[  SKIPPED ] %s (%.2f s): %s\n", name, r->elapsed_s, r->message);
                } else {
                    failed++;
                    printf("[  FAILED  ] %s (%.2f s)\n%s\n", name, r->elapsed_s, r->message);
                }
                td_test_result_free(&rs[j]);
            }
            fflush(stdout);
            free(rs);
            i += (size_t)len;
            if (failed && !keep_going && i < sel.len) {
                printf("[  STOPPED ] after the first failure (--keep-going runs the rest)\n");
                break;
            }
        }
        printf("[==========] %zu passed, %zu skipped, %zu failed\n", passed, skipped, failed);
        rc = failed ? 1 : (sel.len > 0 && skipped == sel.len) ? 77 : 0;
    }
    selection_free(&sel);
    free(names);
    fflush(stdout);
    return rc;
}
