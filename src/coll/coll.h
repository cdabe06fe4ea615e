/* Collective algorithms over td_transport (transport/transport.h), written once for every transport.
 *
 * A td_coll_ctx holds what the algorithms of one group reuse from one operation to the next: the
 * transport, scratch memory and xfer arrays (grown rarely, so that the hot path allocates nothing
 * after warm-up) and the configuration (which algorithm each collective uses, chunk size, the
 * small/large threshold). coll_execute runs one collective (any td_coll kind but SEND and RECV) on
 * the calling thread and returns when it is done on this rank.
 *
 * Algorithms, by name (TDIST_ALGO forces them; "auto" picks by size and world size):
 *   all_reduce      rd (recursive doubling), ring (reduce-scatter + all-gather, pipelined),
 *                   rhd (recursive halving-doubling, Rabenseifner), tree (reduce + broadcast)
 *   broadcast       tree (binomial, pipelined), ring (pipelined chain)
 *   reduce          tree (binomial, pipelined), ring (pipelined chain)
 *   all_gather      ring, bruck
 *   gather, scatter direct, tree (binomial)
 *   reduce_scatter  ring (pipelined), direct
 *   all_to_all      pairwise, direct
 *   barrier         dissemination
 * and, on the shm backend only (backends/shm/direct.h; coll_execute takes them as auto): shm (direct
 * copies through shared memory) for every collective but all_to_all, shm_flat for all_reduce and
 * reduce.
 * Every all_reduce algorithm gives bit-identical results on every rank (each element's reduction
 * happens once, in an order that does not depend on the rank, and its result is distributed).
 *
 * Failure: an algorithm that fails aborts the transport with its error before returning (a
 * collective that failed on one rank has failed for the group, and no xfer may stay posted into
 * memory the caller is about to reuse).
 */
#ifndef TDIST_COLL_COLL_H
#define TDIST_COLL_COLL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/backend.h>

#include "transport/transport.h"

typedef enum td_algo {
    TD_ALGO_AUTO = 0,
    TD_ALGO_RD,
    TD_ALGO_RING,
    TD_ALGO_RHD,
    TD_ALGO_TREE,
    TD_ALGO_BRUCK,
    TD_ALGO_DIRECT,
    TD_ALGO_PAIRWISE,
    TD_ALGO_DISSEMINATION,
    TD_ALGO_SHM,      /* the shm backend's direct algorithms (backends/shm/direct.h); elsewhere: auto */
    TD_ALGO_SHM_FLAT, /* the shm backend's one-step all_reduce / reduce for small messages */
    TD_ALGO_COUNT
} td_algo;

const char *coll_algo_name(td_algo algo);
/* Whether kind has an algorithm of that name (AUTO: every collective kind). */
bool coll_algo_supports(td_algo algo, td_coll_kind kind);

/* Tags: collective messages have the top bit set, the collective's sequence number and a step;
 * p2p messages carry the user's (non-negative) tag. */
#define TD_TAG_COLL(seq, step)                                                                             \
    (TD_TAG_COLL_BIT | (((uint64_t)(seq) & ((UINT64_C(1) << (63 - TD_TAG_STEP_BITS)) - 1)) << TD_TAG_STEP_BITS) | \
     ((uint64_t)(step) & ((UINT64_C(1) << TD_TAG_STEP_BITS) - 1)))
#define TD_TAG_P2P(tag) ((uint64_t)(uint32_t)(tag))

typedef struct td_coll_config {
    td_algo forced[TD_COLL_KIND_COUNT]; /* AUTO: choose by size */
    size_t chunk_bytes;                 /* pipelining granularity of the large-message algorithms */
    size_t small_bytes;                 /* up to this many bytes a message counts as small */
} td_coll_config;

/* Defaults, then the environment: TDIST_ALGO ("ring", or per collective "all_reduce=rhd,
 * broadcast=tree"), TDIST_COLL_CHUNK and TDIST_COLL_SMALL (sizes such as 256K). An unknown name is
 * TD_ERR_INVALID with a message listing the choices. */
td_status coll_config_from_env(td_coll_config *cfg);
/* Applies one TDIST_ALGO-style spec to cfg. */
td_status coll_config_parse_algo(td_coll_config *cfg, const char *spec);

typedef struct td_coll_ctx {
    td_transport *t;
    int rank;
    int size;
    td_coll_config cfg;
    char *scratch;
    size_t scratch_cap;
    td_xfer *xfers;
    size_t xfers_cap;
    void **ptrs; /* per-rank pointer arrays for the algorithms (4 * size entries) */
    void *steps; /* the pipelined engine's step array */
    size_t steps_cap;
} td_coll_ctx;

/* The transport and cfg (coll_config_from_env, say) are borrowed. */
td_status coll_ctx_init(td_coll_ctx *c, td_transport *t, const td_coll_config *cfg);
void coll_ctx_free(td_coll_ctx *c);

/* Runs op (not SEND / RECV) with algo (AUTO: the forced one, else chosen by size). op->seq tags
 * the messages and op->desc goes with them (the transport's coll_desc for the run: transport.h);
 * op->deadline_ns bounds the whole operation. */
td_status coll_execute(td_coll_ctx *c, const td_coll *op, td_algo algo);
/* The reduce kernel op needs in *fn (NULL for the kinds that do not reduce); TD_ERR_INVALID with
 * td_reduce_kernel's message when the (op, dtype) pair has none. */
td_status coll_reduce_fn(const td_coll *op, td_reduce_fn *fn);
/* The algorithm coll_execute picks for op with algo AUTO. */
td_algo coll_choose(const td_coll_ctx *c, const td_coll *op);

/* ---- a group over one transport ------------------------------------------------------------
 * The state and td_backend_ops entries of a backend made of one transport (tcp, shm): a collective
 * runs on the submitting thread, which drives the transport while it waits, and is completed before
 * submit returns; SEND and RECV are only posted (p2p.h) and complete through the transport's
 * callback. abort aborts the transport, so that the other ranks learn of a failure at once instead
 * of at their timeout. */

/* The set-up of the group's transport (its store, ranks, timeout, name) under key_prefix. */
td_transport_setup coll_transport_setup(const td_backend_args *a, const char *key_prefix);
/* The state of a group over t, which it takes (and destroys on failure too). */
td_status coll_group_create(td_transport *t, const td_coll_config *cfg, void **state);
/* The group's collective context, for a backend that runs algorithms of its own on it (shm). */
td_coll_ctx *coll_group_ctx(void *state);
td_status coll_group_submit(void *state, const td_coll *c, td_work *work);
void coll_group_abort(void *state, td_status status, const char *message);
void coll_group_destroy(void *state);
/* Completes work with the result st of a collective that ran on this thread (with its message on
 * failure); returns TD_OK, what submit returns then. */
td_status coll_finish(td_work *work, td_status st);

#endif
