/* tdist-bench's internal interface: the options, the collectives it measures (collective.c) and
 * the measuring loop with its output (measure.c). main.c parses the command line and starts the
 * ranks: as processes it spawns, as the processes of a launcher (tdrun, mpirun), or as threads of
 * one process for the threaded backend. */
#ifndef TDIST_TOOLS_BENCH_H
#define TDIST_TOOLS_BENCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/pg.h>

typedef enum bench_op {
    BENCH_ALL_REDUCE = 0,
    BENCH_BROADCAST,
    BENCH_REDUCE,
    BENCH_ALL_GATHER,
    BENCH_GATHER,
    BENCH_SCATTER,
    BENCH_REDUCE_SCATTER,
    BENCH_ALL_TO_ALL,
    BENCH_BARRIER,
    BENCH_SEND_RECV,
    BENCH_OP_COUNT
} bench_op;

const char *bench_op_name(bench_op op);
bool bench_op_from_name(const char *name, bench_op *out);
/* nccl-tests' bus bandwidth factor for a world of n ranks. */
double bench_busbw_factor(bench_op op, int n);
/* Whether the op reduces (and so takes --reduce-op). */
bool bench_op_reduces(bench_op op);

/* nccl-tests' two forms of a collective: the result in a buffer apart from the input, or over the
 * input. */
typedef enum bench_placement { BENCH_OUT_OF_PLACE = 0, BENCH_IN_PLACE, BENCH_PLACEMENTS } bench_placement;

/* Whether tdist's API has the op in that form: all_reduce, broadcast and reduce take one tensor
 * (in place only); all_gather, reduce_scatter and all_to_all both (in place, the input is the
 * rank's chunk of the output, the output the rank's chunk of the input, or the two are one
 * buffer); gather, scatter, send_recv and barrier out of place only. */
bool bench_op_has(bench_op op, bench_placement placement);
const char *bench_placement_name(bench_placement placement); /* "out-of-place", "in-place" */
/* One line on the forms the op has, for the header. */
const char *bench_placement_note(bench_op op);

typedef struct bench_options {
    int nranks;           /* --nproc: ranks to start; 0 when the launcher decides */
    bench_op op;
    const char *backend;  /* "auto" by default */
    td_dtype dtype;
    td_reduce_op redop;
    bool all_redops;      /* -o all (nccl-tests): a row for each of sum, product, min, max, avg */
    int root;
    uint64_t min_bytes, max_bytes;
    double factor;        /* size multiplier from one row to the next (> 1) */
    uint64_t step_bytes;  /* -i: when > 0, sizes grow by this many bytes instead (nccl-tests' -i) */
    int64_t iters;        /* -n: timed calls per size; 0: adapt to time_s */
    int64_t warmup;       /* -w: -1: adapt */
    double time_s;        /* measuring time per size when iters is 0 */
    int64_t min_iters;
    int batches;          /* timed batches per size; the reported time is their median */
    bool check;
    bool csv;
    bool header;          /* print the header line(s) */
    const char *algo;     /* TDIST_ALGO for the ranks, or NULL */
    bool no_spawn;
    int64_t timeout_ms;   /* the group's timeout */
    const char *impl;     /* the first CSV column: "tdist-<backend>" */
} bench_options;

/* One rank's run: every size from min to max, rank 0 printing a row per size. Returns the exit
 * code: 0, or 1 after printing what failed (wrong elements are not a failure of the run: they are
 * reported in the #wrong column, and the exit code is then 3). */
int bench_run_rank(const bench_options *o, td_pg *pg);

/* ---- collective.c: one collective at one size ----------------------------------------------- */

typedef struct bench_case bench_case;

/* Buffers for every size up to o->max_bytes (allocated once, so that no size allocates while it
 * is timed). The case borrows o and reads it at every call, so the caller may change o->redop
 * between sizes. */
td_status bench_case_create(const bench_options *o, td_pg *pg, bench_case **out);
void bench_case_destroy(bench_case *c);
/* Sets up the views for a requested size in one form (which the op must have); *bytes and *count
 * get the size actually used (the collectives that split a buffer into world-size chunks round it
 * to whole elements per rank, at least one) and the elements in it. */
td_status bench_case_resize(bench_case *c, uint64_t requested, bench_placement placement, uint64_t *bytes,
                            int64_t *count);
/* Runs the collective once, blocking. */
td_status bench_case_run(bench_case *c);
/* Fills the inputs with rank-dependent values (and the rest of the outputs with zeros). */
void bench_case_fill(bench_case *c);
/* Counts this rank's result elements that differ from what the fill makes the collective give. */
int64_t bench_case_wrong(bench_case *c);

#endif
