/* tdist/collective.h: what names a collective, for the layers that move it.
 *
 * The kinds of collective, and the descriptor that every rank of a group must agree on for each
 * collective it runs (kind, dtype, reduce op, root, element count, collective number). The front
 * end makes the descriptor (tdist/pg.h); backends (tdist/backend.h) and transports carry and
 * compare it without looking inside, and name both sides when ranks disagree. This header stands
 * below both, so that a transport needs nothing of the process group to check what it carries.
 */
#ifndef TDIST_COLLECTIVE_H
#define TDIST_COLLECTIVE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The kinds of collective; the fields each comment names are td_coll's (tdist/backend.h). */
typedef enum td_coll_kind {
    TD_COLL_BROADCAST = 0, /* out (count): root's contents to everyone, in place */
    TD_COLL_ALL_REDUCE,    /* out (count): reduced in place on every rank */
    TD_COLL_REDUCE,        /* out (count): reduced in place on root; others' out is scratch */
    TD_COLL_ALL_GATHER,    /* in (count) from every rank into out_blocks[r] */
    TD_COLL_GATHER,        /* in (count) from every rank into out_blocks[r] on root */
    TD_COLL_SCATTER,       /* in_blocks[r] on root to rank r's out (count) */
    TD_COLL_REDUCE_SCATTER,/* in_blocks[r] (count each) of every rank reduced into rank r's out */
    TD_COLL_ALL_TO_ALL,    /* in_blocks[r] (in_counts[r]) to rank r, arriving in its out_blocks[me] */
    TD_COLL_BARRIER,       /* no data */
    TD_COLL_SEND,          /* in (count) to peer with tag */
    TD_COLL_RECV,          /* out (count) from peer (or TD_ANY_SOURCE) with tag */
    TD_COLL_KIND_COUNT
} td_coll_kind;

/* "broadcast", "all_reduce", ... */
TD_API const char *td_coll_kind_name(td_coll_kind kind);

/* The kinds that combine values with td_coll.op. */
static inline bool td_coll_kind_reduces(td_coll_kind kind)
{
    return kind == TD_COLL_ALL_REDUCE || kind == TD_COLL_REDUCE || kind == TD_COLL_REDUCE_SCATTER;
}

/* The kinds that read td_coll.root. */
static inline bool td_coll_kind_rooted(td_coll_kind kind)
{
    return kind == TD_COLL_BROADCAST || kind == TD_COLL_REDUCE || kind == TD_COLL_GATHER || kind == TD_COLL_SCATTER;
}

/* What every rank must agree on about one collective: its kind, dtype, reduce op (the caller's:
 * AVG stays AVG here), root and element count, made once per operation by the front end
 * (td_coll_desc_make) and opaque to backends and transports, which compare descriptors as bytes.
 * The tcp transport carries it in the header of each message of a collective, the same-host layer
 * in each arrival, and the mpi backend exchanges it; a rank that finds another's description of
 * collective #seq different from its own fails with both (td_coll_mismatch_format) instead of
 * hanging or mixing data. seq is the front end's collective number, equal on ranks that agree. */
typedef struct td_coll_desc {
    uint64_t what;  /* kind | dtype << 8 | (reduce op + 1) << 16 | (root + 1) << 32 */
    uint64_t count; /* elements (0 for all_to_all, whose counts differ between ranks) */
    uint64_t seq;
} td_coll_desc;

/* reduce_op: a td_reduce_op, or -1 for a kind that does not reduce; root: -1 for none. */
static inline td_coll_desc td_coll_desc_make(td_coll_kind kind, td_dtype dtype, int reduce_op, int root,
                                             uint64_t count, uint64_t seq)
{
    uint64_t what = (uint64_t)(uint8_t)kind | (uint64_t)(uint8_t)dtype << 8 | (uint64_t)(uint8_t)(reduce_op + 1) << 16 |
                    (uint64_t)(uint32_t)(root + 1) << 32;
    td_coll_desc d = {what, kind == TD_COLL_ALL_TO_ALL ? 0 : count, seq};
    return d;
}

/* Names the collective d describes, as its caller called it: "all_reduce(float32, 100 elements,
 * sum)", "broadcast(float32, 100 elements, root 0)". Returns what snprintf returns. */
TD_API int td_coll_desc_format(const td_coll_desc *d, char *out, size_t size);
/* The message of a disagreement between rank_a, which runs a (named by td_coll_desc_format or the
 * caller), and rank_b, which runs b: "Ranks disagree about collective #3: rank 0 runs ..., rank 1
 * runs ...; every rank must run the same collectives with the same sizes" ("a collective" when seq
 * is 0). */
TD_API int td_coll_mismatch_format(char *out, size_t size, uint64_t seq, int rank_a, const char *a, int rank_b,
                                   const char *b);

#ifdef __cplusplus
}
#endif

#endif
