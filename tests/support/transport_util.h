/* Test support shared by the transport, collective and shm tests (tests/transport, tests/coll,
 * tests/shm): a FileStore per case (removed once every rank let go), a barrier through the store,
 * deadlines, deterministic bytes, an exchange among all ranks, the check that no segment of this
 * process is left in /dev/shm, and the transport cases that every transport must pass, written
 * once over an open transport (each test file opens its own transport and runs them). */
#ifndef TDIST_TESTS_SUPPORT_TRANSPORT_UTIL_H
#define TDIST_TESTS_SUPPORT_TRANSPORT_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/store.h>
#include <tdist/testing.h>

#include "transport/transport.h"

/* FileStore counts its handles out with two separate updates, so when ranks close at the same
 * moment the last-handle cleanup can miss and leave the file behind. The tests therefore open it
 * as "never removed", and rank 0 removes it once every rank has let go (marker files). */
td_store *tu_store_open(const char *path);
void tu_store_close(const td_test_ctx *ctx, td_store *s, const char *path);
/* Every rank sets its key, then waits for everyone's (a barrier that does not use the transport). */
void tu_barrier(const td_test_ctx *ctx, td_store *store, const char *name);

int64_t tu_after_ms(int64_t ms);
double tu_since_s(int64_t t0);

unsigned char tu_pattern(int from, int to, size_t i);
/* Each rank sends len bytes to every other and receives from each; checks the bytes. */
void tu_all_pairs(const td_test_ctx *ctx, td_transport *t, size_t len);
/* Fails the case if /dev/shm holds a "tdist.<pid>." entry of this process. */
void tu_no_segments(void);
/* Pins this process to one CPU (the same one for every rank): the ranks share a core. */
void tu_one_core(void);

/* A transport of all the case's ranks over the case's store. */
typedef struct tu_world {
    td_store *store;
    td_transport *t;
    const td_test_ctx *ctx;
    bool keep_store; /* a rank died: leave the file (the case allows leftovers) */
} tu_world;

/* The set-up of a transport of all the case's ranks (timeout_ms 0: 30 s). */
td_transport_setup tu_setup(const td_test_ctx *ctx, td_store *store, int64_t timeout_ms, const char *group);
/* Destroys the transport and lets go of the store. */
void tu_world_close(tu_world *w);

/* ---- cases every transport passes (world sizes as noted) ---------------------------------------- */

/* Makes a transport from a set-up (the test's own options around it). */
typedef td_status (*tu_create_fn)(const td_test_ctx *ctx, const td_transport_setup *setup, td_transport **out);

/* 1 rank: no peer to send to. */
void tu_case_world_1(tu_world *w);
/* 2 ranks: messages of the given sizes, gathered from and scattered into several buffers, in both
 * directions at once. */
void tu_case_sizes_and_iovecs(tu_world *w, const size_t *sizes, size_t nsizes);
/* 2 ranks: receives posted in another order than the sends, some before and some after the data
 * came; several messages with one tag arrive in order. */
void tu_case_tag_matching(tu_world *w);
/* 4 ranks: any-source receives take messages from whichever rank sends; a specific receive posted
 * earlier wins over an any-source one for its sender. */
void tu_case_any_source(tu_world *w);
/* 2 ranks: messages sent before their receive is posted (the sends complete although nothing is
 * posted), large ones included. */
void tu_case_unexpected(tu_world *w);
/* 2 ranks: 64 MiB of unexpected messages of every size class up to 8 MiB, then their receives:
 * the buffers kept for reuse afterwards stay within MATCH_POOL_BUDGET. */
void tu_case_unexpected_pool_bound(tu_world *w);
/* 2 ranks: a receive of the wrong size fails alone, naming both sizes, posted before and after
 * the message came; the connection carries on. */
void tu_case_length_mismatch(tu_world *w);
/* 3 ranks: rank 2 dies by SIGKILL; every survivor fails within 2 s with TD_ERR_PEER_LOST naming
 * it, also while waiting on a different peer, and so does every later operation. */
void tu_case_peer_killed(tu_world *w);
/* 2 ranks: a receive whose peer stalls fails at its deadline with TD_ERR_TIMEOUT; the stalled
 * peer fails at once with (stalled_status, stalled_msg). */
void tu_case_timeout(tu_world *w, td_status stalled_status, const char *stalled_msg);
/* 2 ranks: abort fails what is pending (from another thread, waking the waiter) and everything
 * later. */
void tu_case_abort_wakes_waiters(tu_world *w);
/* 3 ranks, after rank 2 destroyed its transport: the others fail only what involves it and keep
 * talking among themselves. */
void tu_check_after_close(tu_world *w);
/* 2 ranks: large isend/irecv pairs posted in opposite orders on the two sides, completed by
 * callbacks with nobody waiting: the transport's thread moves everything. */
void tu_case_callbacks_any_order(tu_world *w);
/* Registers the cases above that run on an open world as the test binary's TD_TESTs, named as in
 * both transport tests: OPEN(ctx) returns the world (a function of the test file), SIZES is its
 * array of message sizes, the stalled peer of "timeout" fails with (STALLED_STATUS, STALLED_MSG),
 * and the variable arguments are extra TD_TEST options (.params). */
#define TU_TRANSPORT_CASES(OPEN, SIZES, STALLED_STATUS, STALLED_MSG, ...)                                        \
    TU_CASE_(OPEN, sizes_and_iovecs, (.world_size = 2, __VA_ARGS__),                                            \
             tu_case_sizes_and_iovecs(&w, SIZES, sizeof SIZES / sizeof SIZES[0]))                               \
    TU_CASE_(OPEN, tag_matching_out_of_order, (.world_size = 2, __VA_ARGS__), tu_case_tag_matching(&w))          \
    TU_CASE_(OPEN, any_source, (.world_size = 4, __VA_ARGS__), tu_case_any_source(&w))                           \
    TU_CASE_(OPEN, unexpected_messages, (.world_size = 2, __VA_ARGS__), tu_case_unexpected(&w))                  \
    TU_CASE_(OPEN, unexpected_buffers_kept_within_a_budget, (.world_size = 2, __VA_ARGS__),                      \
             tu_case_unexpected_pool_bound(&w))                                                                  \
    TU_CASE_(OPEN, length_mismatch, (.world_size = 2, __VA_ARGS__), tu_case_length_mismatch(&w))                 \
    TU_CASE_(OPEN, peer_killed,                                                                                  \
             (.world_size = 3, .skip_return_code_check = true, .allow_leftovers = true, __VA_ARGS__),            \
             tu_case_peer_killed(&w))                                                                            \
    TU_CASE_(OPEN, timeout, (.world_size = 2, __VA_ARGS__), tu_case_timeout(&w, STALLED_STATUS, STALLED_MSG))    \
    TU_CASE_(OPEN, abort_wakes_waiters, (.world_size = 2, __VA_ARGS__), tu_case_abort_wakes_waiters(&w))         \
    TU_CASE_(OPEN, callbacks_any_order, (.world_size = 2, __VA_ARGS__), tu_case_callbacks_any_order(&w))

#define TU_UNPAREN_(...) __VA_ARGS__
#define TU_CASE_(OPEN, name, options, call)                                                                      \
    TD_TEST(name, TU_UNPAREN_ options)                                                                           \
    {                                                                                                            \
        tu_world w = OPEN(ctx);                                                                                  \
        call;                                                                                                    \
        tu_world_close(&w);                                                                                      \
    }

/* 2 ranks: a rank that never shows up; set-up fails at the timeout naming it. */
void tu_case_setup_timeout(td_test_ctx *ctx, tu_create_fn create);
/* 3 ranks: groups made and destroyed again and again on one store; nothing stays behind, and a
 * new group never reads an old one's addresses. */
void tu_case_create_destroy_repeatedly(td_test_ctx *ctx, tu_create_fn create);
/* 2 ranks with the job secrets secret0 and secret1 (NULL: none): rank 0, which connects, fails at
 * once with want0; rank 1 at its timeout, naming the refusal want1. */
void tu_case_auth_refused(td_test_ctx *ctx, tu_create_fn create, const char *secret0, const char *secret1,
                          const char *want0, const char *want1);

#endif
