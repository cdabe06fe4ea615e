/* Test support shared by the collective tests over transports (tests/coll over tcp, tests/shm
 * over shared memory): deterministic inputs (small integers, so every reduction order gives the
 * exact same value), references each rank computes locally, a collective world (a transport, its
 * collective context and the operation counter), and the all_reduce cases both run. */
#ifndef TDIST_TESTS_SUPPORT_COLL_CHECK_H
#define TDIST_TESTS_SUPPORT_COLL_CHECK_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/testing.h>

#include "coll/coll.h"
#include "transport_util.h"

/* ---- values ------------------------------------------------------------------------------------- */

/* Rank's input element i for op (small integers; PRODUCT's are 1, 2, -1; the bitwise ops' bytes). */
double cc_value(td_reduce_op op, int rank, size_t i);
void cc_put(td_dtype dt, void *buf, size_t i, double v);
double cc_get(td_dtype dt, const void *buf, size_t i);
/* n elements of rank's input (one more allocated, zeroed); free() it. */
void *cc_filled(td_dtype dt, td_reduce_op op, int rank, size_t n);
/* Element i of the reduction of every rank's input over ws ranks. */
double cc_expected(td_op op, int ws, size_t i);
/* Fails the case unless buf holds elements skip..skip+n-1 of the reduction (AVG within rounding). */
void cc_check_buf(td_dtype dt, td_op op, const void *buf, size_t n, int ws, size_t skip, const char *what);
uint64_t cc_fnv(const void *p, size_t n);
/* n blocks of count (+1) zeroed elements. */
void **cc_blocks(int n, size_t count, td_dtype dt);
void cc_free_blocks(void **b, int n);

typedef struct cc_combo {
    td_dtype dt;
    td_op op;
} cc_combo;

/* Four test cases per body: world sizes 1 to 4. */
#define CC_COLL_TEST(name, ...)                                                                \
    static void body_##name(td_test_ctx *ctx);                                                 \
    TD_TEST(name##_1, .world_size = 1, __VA_ARGS__) { body_##name(ctx); }                      \
    TD_TEST(name##_2, .world_size = 2, __VA_ARGS__) { body_##name(ctx); }                      \
    TD_TEST(name##_3, .world_size = 3, __VA_ARGS__) { body_##name(ctx); }                      \
    TD_TEST(name##_4, .world_size = 4, __VA_ARGS__) { body_##name(ctx); }                      \
    static void body_##name(td_test_ctx *ctx)

/* ---- a collective world ------------------------------------------------------------------------- */

/* Runs op with algorithm algo (the test's way: forced, or through the shm collectives). */
typedef td_status (*cc_run_fn)(td_coll_ctx *c, const td_coll *op, td_algo algo);

typedef struct cc_world {
    tu_world tw;
    td_coll_ctx c;
    uint64_t seq;
    cc_run_fn run;
} cc_world;

/* The collective context over w->tw.t, with chunk_bytes and small_bytes (and forced algorithms,
 * TDIST_ALGO syntax, when algo is not NULL). */
void cc_world_init(cc_world *w, size_t chunk_bytes, size_t small_bytes, const char *algo, cc_run_fn run);
void cc_world_close(cc_world *w);
/* A collective of kind on count elements of dt (op SUM, root 0, deadline in 60 s), numbered. */
td_coll cc_coll_of(cc_world *w, td_coll_kind kind, td_dtype dt, size_t count);
/* Runs c, failing the case with the error when it fails. */
void cc_run(cc_world *w, const td_coll *c, td_algo a, const char *what);

/* ---- cases -------------------------------------------------------------------------------------- */

/* all_reduce of every combo and size with every algorithm, checked against the references. */
void cc_case_all_reduce(cc_world *w, const td_algo *algos, size_t nalgos, const cc_combo *combos, size_t ncombos,
                        const size_t *sizes, size_t nsizes);
/* Inexact sums (values of every magnitude) still give the same bits on every rank (compared
 * through the store, not the transport). */
void cc_case_all_reduce_bit_identical(cc_world *w, const td_algo *algos, size_t nalgos);

#endif
