/* Helpers shared by the shm tests: a FileStore per case (removed once every rank let go), a
 * barrier through the store, an shm transport of all the case's ranks, deterministic bytes, and
 * the check that no segment of this process is left in /dev/shm. */
#ifndef TDIST_TESTS_SHM_UTIL_H
#define TDIST_TESTS_SHM_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/store.h>
#include <tdist/testing.h>

#include "transport/shm.h"

td_store *shm_test_open_store(const char *path);
void shm_test_close_store(const td_test_ctx *ctx, td_store *s, const char *path);
void shm_test_barrier(const td_test_ctx *ctx, td_store *store, const char *name);

int64_t shm_test_after_ms(int64_t ms);
double shm_test_since_s(int64_t t0);

typedef struct shm_world {
    td_store *store;
    td_transport *t;
    const td_test_ctx *ctx;
    bool keep_store; /* a rank died: leave the file (the case allows leftovers) */
} shm_world;

shm_world shm_test_open(td_test_ctx *ctx, int64_t timeout_ms);
void shm_test_close(shm_world *w);

unsigned char shm_test_pattern(int from, int to, size_t i);
/* Each rank sends len bytes to every other and receives from each; checks the bytes. */
void shm_test_all_pairs(const td_test_ctx *ctx, td_transport *t, size_t len);
/* Fails the case if /dev/shm holds a "tdist.<pid>." entry of this process. */
void shm_test_no_segments(void);
/* Pins this process to one CPU (the same one for every rank): the ranks share a core. */
void shm_test_one_core(void);

#endif
