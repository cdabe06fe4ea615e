/* Helpers shared by the process-group tests: one body runs on every backend.
 *
 * TD_PG_TEST(name, world_size, options...) { body } registers the body twice: "name" as a
 * multi-process case with one instance per process backend (TD_PG_PROCESS_BACKENDS, ctx->param
 * names it), and "name_threaded" in the harness's threaded mode on the threaded backend. A backend
 * that is not built in is skipped statically. The body makes its group with pg_test_init, which
 * meets through a TCPStore on port 0 (rank 0 publishes the port in a file of the case's temp dir)
 * or an init URL, and, in threaded mode, wires the harness's abort hook to the threaded backend so
 * that a failing rank wakes the others.
 *
 * The "mpi" instances (when tdist was built with MPI) run under mpirun, not under the harness's
 * supervisor: CTest starts `mpirun -np N <binary> --td-external <case>/mpi` (tests/CMakeLists.txt,
 * cmake/TdistMpi.cmake), and run by the supervisor they are skipped. Their group needs no store
 * (MPI assigns the ranks); pg_test_setup initializes MPI before the harness's leak baseline.
 * TD_PG_TEST_ON names the backends for cases that need what an MPI job lacks (a rank killed
 * mid-job, a group timeout inside a collective, a store shared by the ranks). */
#ifndef TDIST_TESTS_PG_UTIL_H
#define TDIST_TESTS_PG_UTIL_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/backend.h>
#include <tdist/pg.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "tdist_config.h"

/* "auto2x2" is the auto backend with TDIST_HOST_ID set per rank so that the ranks form two
 * simulated hosts (the first half of the ranks and the rest), which really talk TCP to each other:
 * shared memory inside each, hierarchical collectives across. pg_test_backend names the backend. */
#if TDIST_HAVE_MPI
#define TD_PG_MPI_BACKEND ",mpi"
#else
#define TD_PG_MPI_BACKEND ""
#endif
#define TD_PG_SPAWNED_BACKENDS "tcp,shm,auto,auto2x2" /* ranks started by the harness */
#define TD_PG_PROCESS_BACKENDS TD_PG_SPAWNED_BACKENDS TD_PG_MPI_BACKEND
#define TD_PG_THREAD_BACKENDS "threaded"

const char *pg_test_skip_unavailable(const char *param);
/* The backend a case's parameter runs on ("auto" for "auto2x2"). */
const char *pg_test_backend(const td_test_ctx *ctx);
/* The setup hook of the process cases: makes (and destroys) one mpi group, so that MPI's own
 * threads and files exist before the leak baseline; nothing for other backends. */
void pg_test_setup(td_test_ctx *ctx);

#define TD_PG_TEST(tname, ws, ...) TD_PG_TEST_ON(tname, ws, TD_PG_PROCESS_BACKENDS, __VA_ARGS__)

#define TD_PG_TEST_ON(tname, ws, backends, ...)                                                             \
    static void pg_body_##tname(td_test_ctx *ctx);                                                         \
    TD_TEST(tname, .world_size = (ws), .params = backends, .static_skip = pg_test_skip_unavailable,        \
            .setup = pg_test_setup, __VA_ARGS__)                                                           \
    {                                                                                                      \
        pg_body_##tname(ctx);                                                                              \
    }                                                                                                      \
    TD_TEST(tname##_threaded, .world_size = (ws), .threads = true, .params = TD_PG_THREAD_BACKENDS,        \
            .static_skip = pg_test_skip_unavailable, __VA_ARGS__)                                          \
    {                                                                                                      \
        pg_body_##tname(ctx);                                                                              \
    }                                                                                                      \
    static void pg_body_##tname(td_test_ctx *ctx)

/* The same body for world sizes 1 to 4: cases name_1 .. name_4 (and their _threaded twins). */
#define TD_PG_TEST_WORLDS(tname, ...)                                                                       \
    static void pg_all_##tname(td_test_ctx *ctx);                                                          \
    TD_PG_TEST(tname##_1, 1, __VA_ARGS__) { pg_all_##tname(ctx); }                                         \
    TD_PG_TEST(tname##_2, 2, __VA_ARGS__) { pg_all_##tname(ctx); }                                         \
    TD_PG_TEST(tname##_3, 3, __VA_ARGS__) { pg_all_##tname(ctx); }                                         \
    TD_PG_TEST(tname##_4, 4, __VA_ARGS__) { pg_all_##tname(ctx); }                                         \
    static void pg_all_##tname(td_test_ctx *ctx)

typedef struct pg_test_opts {
    int64_t timeout_ms;      /* 0: 60 s (well below the harness's per-test timeout) */
    const char *debug_level; /* NULL: "OFF" (not the environment: tests choose) */
    const char *init_url;    /* NULL: a TCPStore on port 0 (explicit store); else this URL */
    const char *group_name;
} pg_test_opts;

/* A new TCPStore shared by the case's ranks (rank 0 serves it on port 0 and publishes the port
 * through a file of ctx->tmpdir, removed once every rank connected). */
td_store *pg_test_store(td_test_ctx *ctx);
/* A group of all ranks of the case on ctx->param's backend; fails the test on error. */
td_pg *pg_test_init(td_test_ctx *ctx, const pg_test_opts *opts);
/* td_pg_options for the case (backend, init URL, rank, world size, timeout), for tests that call
 * td_pg_create or td_init_process_group themselves. */
td_pg_options pg_test_options(td_test_ctx *ctx, const pg_test_opts *opts);
/* "file://<tmpdir>/<name>": a fresh rendezvous for a second group in the same case. */
const char *pg_test_url(td_test_ctx *ctx, const char *name);
/* Destroys pg and unhooks the abort hook. */
void pg_test_done(td_test_ctx *ctx, td_pg *pg);

/* Deterministic test data: small values every dtype holds exactly and no reduction overflows. */
double pg_test_value(td_dtype dt, int rank, int64_t i);
/* A contiguous 1-D tensor of n elements of pg_test_value(dt, rank, i) (imaginary part: rank). */
td_tensor *pg_test_tensor(td_dtype dt, int rank, int64_t n);
/* A non-contiguous tensor of n (even) elements: a strided view (every other element of a 2n
 * buffer) holding pg_test_value(dt, rank, i); the other elements hold -7. */
td_tensor *pg_test_strided(td_dtype dt, int rank, int64_t n);
/* The expected reduction of pg_test_value over ranks 0..ws-1 at index i (real part). */
double pg_test_expected(td_dtype dt, td_op op, int ws, int64_t i);
/* Checks every element of t (1-D, n elements, any layout) against f(i); tolerance from dtype. */
void pg_test_check_values(const td_tensor *t, double (*f)(void *arg, int64_t i), void *arg, const char *what);
/* Element i of t as a double (real part). */
double pg_test_get(const td_tensor *t, int64_t i);
double pg_test_get_imag(const td_tensor *t, int64_t i);

#define PG_NDTYPES 9
extern const td_dtype pg_test_dtypes[PG_NDTYPES]; /* f32 f64 f16 bf16 i32 i64 u8 bool c64 */

#endif
