/* tdist-bench: one collective at one size. A bench_case owns two buffers of the largest size (so
 * that resizing only makes views and no timed operation allocates), makes the tensor views each
 * collective takes, in either of nccl-tests' two forms where tdist's API has it (out of place: the
 * result in a buffer apart from the input; in place: the result over the input), runs it blocking
 * through the public pg API, and checks it: every rank fills its inputs with values that depend on
 * the rank and the element index (small integers, exact in every dtype, bfloat16 included), and
 * the check recomputes, element by element, what the collective must have produced, as nccl-tests
 * does. Integer results are compared exactly (with the dtype's wrap-around); floating results
 * within a relative tolerance of the dtype's precision, since the order of a reduction may change
 * an AVG's or PREMUL_SUM's last bit. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/tensor.h>

#include "base/alloc.h"
#include "base/error.h"
#include "bench.h"

#define PREMUL_FACTOR 0.5 /* exact in every floating dtype, and visibly different from SUM */

struct bench_case {
    const bench_options *o;
    td_pg *pg;
    int rank, world;
    size_t esize;
    td_storage *a, *b; /* inputs live in a, outputs in b (in place: both in one of them) */
    int64_t c;         /* elements per chunk: per rank for the split collectives, else the tensor */
    td_tensor *in, *out;
    td_tensor **ins, **outs; /* world chunk views: scatter's inputs, gather's outputs */
};

/* ---- names and factors ------------------------------------------------------------------------ */

static const char *const op_names[BENCH_OP_COUNT] = {
    "all_reduce", "broadcast", "reduce", "all_gather", "gather",
    "scatter", "reduce_scatter", "all_to_all", "barrier", "send_recv",
};

const char *bench_op_name(bench_op op) { return op < BENCH_OP_COUNT ? op_names[op] : "?"; }

bool bench_op_from_name(const char *name, bench_op *out)
{
    for (int i = 0; i < BENCH_OP_COUNT; i++)
        if (strcmp(name, op_names[i]) == 0) {
            *out = (bench_op)i;
            return true;
        }
    if (strcmp(name, "sendrecv") == 0 || strcmp(name, "ping_pong") == 0) {
        *out = BENCH_SEND_RECV;
        return true;
    }
    return false;
}

double bench_busbw_factor(bench_op op, int n)
{
    switch (op) {
    case BENCH_ALL_REDUCE:
        return 2.0 * (n - 1) / n;
    case BENCH_ALL_GATHER:
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALL_TO_ALL:
    case BENCH_GATHER:
    case BENCH_SCATTER:
        return (double)(n - 1) / n;
    case BENCH_BROADCAST:
    case BENCH_REDUCE:
    case BENCH_SEND_RECV:
        return 1.0;
    default:
        return 0.0;
    }
}

bool bench_op_reduces(bench_op op)
{
    return op == BENCH_ALL_REDUCE || op == BENCH_REDUCE || op == BENCH_REDUCE_SCATTER;
}

bool bench_op_has(bench_op op, bench_placement placement)
{
    switch (op) {
    case BENCH_ALL_REDUCE:
    case BENCH_BROADCAST:
    case BENCH_REDUCE:
        return placement == BENCH_IN_PLACE;
    case BENCH_ALL_GATHER:
    case BENCH_REDUCE_SCATTER:
    case BENCH_ALL_TO_ALL:
        return true;
    default:
        return placement == BENCH_OUT_OF_PLACE;
    }
}

const char *bench_placement_name(bench_placement placement)
{
    return placement == BENCH_IN_PLACE ? "in-place" : "out-of-place";
}

const char *bench_placement_note(bench_op op)
{
    switch (op) {
    case BENCH_ALL_REDUCE:
    case BENCH_BROADCAST:
    case BENCH_REDUCE:
        return "in place only (the call writes into its one tensor)";
    case BENCH_ALL_GATHER:
        return "both; in place, the input is this rank's chunk of the output";
    case BENCH_REDUCE_SCATTER:
        return "both; in place, the output is this rank's chunk of the input";
    case BENCH_ALL_TO_ALL:
        return "both; in place, output and input are one buffer";
    case BENCH_GATHER:
    case BENCH_SCATTER:
        return "out of place only (the root's side is a list of chunk tensors)";
    case BENCH_SEND_RECV:
        return "out of place only (a send buffer and a receive buffer)";
    default:
        return "none (no data; the time is in the out-of-place set)";
    }
}

static bool splits(bench_op op)
{
    return op == BENCH_ALL_GATHER || op == BENCH_GATHER || op == BENCH_SCATTER || op == BENCH_REDUCE_SCATTER ||
           op == BENCH_ALL_TO_ALL;
}

/* ---- elements --------------------------------------------------------------------------------- */

static void set_elem(void *p, td_dtype dt, int64_t i, int64_t v)
{
    switch (dt) {
    case TD_BOOL: ((uint8_t *)p)[i] = v != 0; break;
    case TD_UINT8: ((uint8_t *)p)[i] = (uint8_t)v; break;
    case TD_INT8: ((int8_t *)p)[i] = (int8_t)v; break;
    case TD_INT16: ((int16_t *)p)[i] = (int16_t)v; break;
    case TD_INT32: ((int32_t *)p)[i] = (int32_t)v; break;
    case TD_INT64: ((int64_t *)p)[i] = v; break;
    case TD_FLOAT16: ((uint16_t *)p)[i] = td_float_to_half((float)v); break;
    case TD_BFLOAT16: ((uint16_t *)p)[i] = td_float_to_bfloat16((float)v); break;
    case TD_FLOAT32: ((float *)p)[i] = (float)v; break;
    case TD_FLOAT64: ((double *)p)[i] = (double)v; break;
    default: break;
    }
}

static int64_t get_int(const void *p, td_dtype dt, int64_t i)
{
    switch (dt) {
    case TD_BOOL: return ((const uint8_t *)p)[i] != 0;
    case TD_UINT8: return ((const uint8_t *)p)[i];
    case TD_INT8: return ((const int8_t *)p)[i];
    case TD_INT16: return ((const int16_t *)p)[i];
    case TD_INT32: return ((const int32_t *)p)[i];
    case TD_INT64: return ((const int64_t *)p)[i];
    default: return 0;
    }
}

static double get_float(const void *p, td_dtype dt, int64_t i)
{
    switch (dt) {
    case TD_FLOAT16: return td_half_to_float(((const uint16_t *)p)[i]);
    case TD_BFLOAT16: return td_bfloat16_to_float(((const uint16_t *)p)[i]);
    case TD_FLOAT32: return ((const float *)p)[i];
    case TD_FLOAT64: return ((const double *)p)[i];
    default: return (double)get_int(p, dt, i);
    }
}

/* An integer result as the dtype holds it (wrapped to its width; bool is "not zero"). */
static int64_t wrap_int(td_dtype dt, uint64_t v)
{
    switch (dt) {
    case TD_BOOL: return v != 0;
    case TD_UINT8: return (uint8_t)v;
    case TD_INT8: return (int8_t)v;
    case TD_INT16: return (int16_t)v;
    case TD_INT32: return (int32_t)v;
    default: return (int64_t)v;
    }
}

static double round_float(td_dtype dt, double v)
{
    switch (dt) {
    case TD_FLOAT16: return td_half_to_float(td_float_to_half((float)v));
    case TD_BFLOAT16: return td_bfloat16_to_float(td_float_to_bfloat16((float)v));
    case TD_FLOAT32: return (float)v;
    default: return v;
    }
}

static double tolerance(td_dtype dt)
{
    switch (dt) {
    case TD_FLOAT16: return 1e-3;
    case TD_BFLOAT16: return 1e-2;
    case TD_FLOAT32: return 1e-6;
    default: return 1e-12;
    }
}

/* The value rank r puts at element i of its input. Moved data spans more values (so a misplaced
 * chunk shows); reduced data stays small, so that sums of many ranks stay exact in bfloat16, and
 * PRODUCT multiplies ones and twos. bool alternates 0 and 1. */
static int64_t input_value(const bench_case *c, int r, int64_t i)
{
    if (c->o->dtype == TD_BOOL)
        return (r + i) % 2;
    if (!bench_op_reduces(c->o->op))
        return 1 + (31 * (int64_t)r + 7 * i) % 97;
    if (c->o->redop == TD_PRODUCT)
        return 1 + (r + i) % 2;
    return 1 + (3 * (int64_t)r + i) % 4;
}

/* Whether element i of `data` holds the reduction over every rank of input_value(r, src_i). */
static bool reduced_ok(const bench_case *c, const void *data, int64_t i, int64_t src_i)
{
    td_dtype dt = c->o->dtype;
    td_reduce_op op = c->o->redop;
    uint64_t acc = (uint64_t)input_value(c, 0, src_i);
    for (int r = 1; r < c->world; r++) {
        uint64_t v = (uint64_t)input_value(c, r, src_i);
        switch (op) {
        case TD_PRODUCT: acc *= v; break;
        case TD_MIN: acc = v < acc ? v : acc; break;
        case TD_MAX: acc = v > acc ? v : acc; break;
        case TD_BAND: acc &= v; break;
        case TD_BOR: acc |= v; break;
        case TD_BXOR: acc ^= v; break;
        default: acc += v; break;
        }
    }
    if (!td_dtype_is_floating(dt)) {
        if (dt == TD_BOOL && op == TD_BXOR) /* bool's XOR is parity, whatever the integers did */
            acc &= 1;
        return get_int(data, dt, i) == wrap_int(dt, acc);
    }
    double want = (double)acc;
    if (op == TD_AVG)
        want /= c->world;
    else if (op == TD_PREMUL_SUM)
        want *= PREMUL_FACTOR;
    want = round_float(dt, want);
    double got = get_float(data, dt, i);
    return fabs(got - want) <= tolerance(dt) * fmax(1.0, fabs(want));
}

static bool moved_ok(const bench_case *c, const void *data, int64_t i, int src_rank, int64_t src_i)
{
    int64_t want = input_value(c, src_rank, src_i);
    if (td_dtype_is_floating(c->o->dtype))
        return get_float(data, c->o->dtype, i) == (double)want;
    return get_int(data, c->o->dtype, i) == wrap_int(c->o->dtype, (uint64_t)want);
}

/* ---- the case --------------------------------------------------------------------------------- */

td_status bench_case_create(const bench_options *o, td_pg *pg, bench_case **out)
{
    bench_case *c = TD_NEW(bench_case);
    c->o = o;
    c->pg = pg;
    c->rank = td_pg_rank(pg);
    c->world = td_pg_size(pg);
    c->esize = td_dtype_size(o->dtype);
    c->ins = TD_NEW_ARRAY(td_tensor *, c->world);
    c->outs = TD_NEW_ARRAY(td_tensor *, c->world);
    size_t bytes = o->max_bytes > (uint64_t)c->world * c->esize ? (size_t)o->max_bytes : (size_t)c->world * c->esize;
    td_status s = td_storage_new(bytes, &c->a);
    if (s == TD_OK)
        s = td_storage_new(bytes, &c->b);
    if (s != TD_OK) {
        bench_case_destroy(c);
        return s;
    }
    *out = c;
    return TD_OK;
}

static void drop_views(bench_case *c)
{
    td_tensor_release(c->in);
    td_tensor_release(c->out);
    c->in = c->out = NULL;
    for (int r = 0; r < c->world; r++) {
        td_tensor_release(c->ins[r]);
        td_tensor_release(c->outs[r]);
        c->ins[r] = c->outs[r] = NULL;
    }
}

void bench_case_destroy(bench_case *c)
{
    if (!c)
        return;
    drop_views(c);
    free(c->ins);
    free(c->outs);
    td_storage_release(c->a);
    td_storage_release(c->b);
    free(c);
}

td_status bench_case_resize(bench_case *c, uint64_t requested, bench_placement placement, uint64_t *bytes,
                            int64_t *count)
{
    drop_views(c);
    bool in_place = placement == BENCH_IN_PLACE;
    const bench_options *o = c->o;
    int n = c->world;
    int64_t total = (int64_t)(requested / c->esize);
    if (o->op == BENCH_BARRIER) {
        c->c = total = 0;
    } else if (splits(o->op)) {
        c->c = total / n < 1 ? 1 : total / n;
        total = c->c * n;
    } else {
        c->c = total < 1 ? 1 : total;
        total = c->c;
    }
    *bytes = (uint64_t)total * c->esize;
    *count = total;
    td_dtype dt = o->dtype;
    int64_t k = c->c;
#define VIEW(st, off, len, dst) TD_TRY(td_tensor_from_storage((st), (off), dt, TD_SHAPE(len), NULL, (dst)))
    switch (o->op) {
    case BENCH_ALL_REDUCE:
    case BENCH_BROADCAST:
    case BENCH_REDUCE:
        VIEW(c->a, 0, k, &c->in);
        break;
    case BENCH_SEND_RECV:
        VIEW(c->a, 0, k, &c->in);
        VIEW(c->b, 0, k, &c->out);
        break;
    case BENCH_ALL_GATHER:
        VIEW(c->b, 0, n * k, &c->out);
        VIEW(in_place ? c->b : c->a, in_place ? c->rank * k : 0, k, &c->in);
        break;
    case BENCH_GATHER:
        VIEW(c->a, 0, k, &c->in);
        VIEW(c->b, 0, n * k, &c->out);
        for (int r = 0; r < n; r++)
            VIEW(c->b, r * k, k, &c->outs[r]);
        break;
    case BENCH_SCATTER:
        VIEW(c->a, 0, n * k, &c->in);
        for (int r = 0; r < n; r++)
            VIEW(c->a, r * k, k, &c->ins[r]);
        VIEW(c->b, 0, k, &c->out);
        break;
    case BENCH_REDUCE_SCATTER:
        VIEW(c->a, 0, n * k, &c->in);
        VIEW(in_place ? c->a : c->b, in_place ? c->rank * k : 0, k, &c->out);
        break;
    case BENCH_ALL_TO_ALL:
        VIEW(c->a, 0, n * k, &c->in);
        VIEW(in_place ? c->a : c->b, 0, n * k, &c->out);
        break;
    default:
        break;
    }
#undef VIEW
    return TD_OK;
}

static td_op bench_td_op(const bench_options *o)
{
    return o->redop == TD_PREMUL_SUM ? TD_OP_PREMUL_SUM(PREMUL_FACTOR) : td_op_of(o->redop);
}

td_status bench_case_run(bench_case *c)
{
    const bench_options *o = c->o;
    td_pg *pg = c->pg;
    bool root = c->rank == o->root;
    switch (o->op) {
    case BENCH_ALL_REDUCE:
        return td_pg_all_reduce(pg, c->in, bench_td_op(o), NULL);
    case BENCH_BROADCAST:
        return td_pg_broadcast(pg, c->in, o->root, NULL);
    case BENCH_REDUCE:
        return td_pg_reduce(pg, c->in, o->root, bench_td_op(o), NULL);
    case BENCH_ALL_GATHER:
        return td_pg_all_gather_into_tensor(pg, c->out, c->in, NULL);
    case BENCH_GATHER:
        return td_pg_gather(pg, root ? c->outs : NULL, c->in, o->root, NULL);
    case BENCH_SCATTER:
        return td_pg_scatter(pg, c->out, root ? c->ins : NULL, o->root, NULL);
    case BENCH_REDUCE_SCATTER:
        return td_pg_reduce_scatter_tensor(pg, c->out, c->in, bench_td_op(o), NULL);
    case BENCH_ALL_TO_ALL:
        return td_pg_all_to_all_single(pg, c->out, c->in, NULL, NULL, NULL);
    case BENCH_BARRIER:
        return td_pg_barrier(pg, NULL);
    case BENCH_SEND_RECV:
        /* Ping-pong: rank 0's message goes to rank 1 and comes back; the other ranks wait. */
        if (c->rank == 0) {
            TD_TRY(td_pg_send(pg, c->in, 1, 0, NULL));
            return td_pg_recv(pg, c->out, 1, 0, NULL, NULL);
        }
        if (c->rank == 1) {
            TD_TRY(td_pg_recv(pg, c->out, 0, 0, NULL, NULL));
            return td_pg_send(pg, c->out, 0, 0, NULL);
        }
        return TD_OK;
    default:
        return error_fmt(TD_ERR_INVALID, "tdist-bench: unknown op");
    }
}

static void fill_input(const bench_case *c, td_tensor *t, int64_t first)
{
    void *p = td_tensor_data(t);
    int64_t n = td_tensor_numel(t);
    for (int64_t i = 0; i < n; i++)
        set_elem(p, c->o->dtype, i, input_value(c, c->rank, first + i));
}

void bench_case_fill(bench_case *c)
{
    /* Output first: in place, the input lies inside it (or holds it). */
    if (c->out)
        memset(td_tensor_data(c->out), 0, td_tensor_nbytes(c->out));
    if (c->in)
        fill_input(c, c->in, 0);
}

int64_t bench_case_wrong(bench_case *c)
{
    const bench_options *o = c->o;
    int n = c->world, me = c->rank;
    int64_t k = c->c, wrong = 0;
    const void *in = c->in ? td_tensor_data(c->in) : NULL;
    const void *out = c->out ? td_tensor_data(c->out) : NULL;
    switch (o->op) {
    case BENCH_ALL_REDUCE:
        for (int64_t i = 0; i < k; i++)
            wrong += !reduced_ok(c, in, i, i);
        break;
    case BENCH_REDUCE:
        for (int64_t i = 0; i < k; i++)
            wrong += me == o->root ? !reduced_ok(c, in, i, i) : !moved_ok(c, in, i, me, i);
        break;
    case BENCH_BROADCAST:
        for (int64_t i = 0; i < k; i++)
            wrong += !moved_ok(c, in, i, o->root, i);
        break;
    case BENCH_SEND_RECV:
        if (me <= 1)
            for (int64_t i = 0; i < k; i++)
                wrong += !moved_ok(c, out, i, 0, i);
        break;
    case BENCH_ALL_GATHER:
        for (int64_t i = 0; i < n * k; i++)
            wrong += !moved_ok(c, out, i, (int)(i / k), i % k);
        break;
    case BENCH_GATHER:
        if (me == o->root)
            for (int64_t i = 0; i < n * k; i++)
                wrong += !moved_ok(c, out, i, (int)(i / k), i % k);
        break;
    case BENCH_SCATTER:
        for (int64_t i = 0; i < k; i++)
            wrong += !moved_ok(c, out, i, o->root, me * k + i);
        break;
    case BENCH_REDUCE_SCATTER:
        for (int64_t i = 0; i < k; i++)
            wrong += !reduced_ok(c, out, i, me * k + i);
        break;
    case BENCH_ALL_TO_ALL:
        for (int64_t i = 0; i < n * k; i++)
            wrong += !moved_ok(c, out, i, (int)(i / k), me * k + i % k);
        break;
    default:
        break;
    }
    return wrong;
}
