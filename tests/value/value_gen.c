/* Seeded random td_values for the value and codec tests (value_gen.h). */
#include "value_gen.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

uint64_t value_gen_next(value_gen *g)
{
    /* splitmix64: good enough spread, and a seed reproduces a failure exactly. */
    uint64_t z = (g->state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static int below(value_gen *g, int n) { return (int)(value_gen_next(g) % (uint64_t)n); }

void value_gen_init(value_gen *g, uint64_t seed, int max_depth)
{
    memset(g, 0, sizeof *g);
    g->state = seed;
    g->max_depth = max_depth;
}

void value_gen_free(value_gen *g)
{
    for (int i = 0; i < g->npool; i++)
        td_tensor_release(g->pool[i]);
    g->npool = 0;
}

static double small_double(value_gen *g) { return (double)(below(g, 2001) - 1000) / 8.0; }

/* A contiguous tensor of random, NaN-free contents. */
static td_tensor *fresh(value_gen *g, td_dtype dt, td_shape shape)
{
    td_tensor *t;
    TD_CHECK_OK(td_tensor_empty(dt, shape, &t));
    size_t n = (size_t)td_tensor_numel(t), es = td_dtype_size(dt), nbytes = n * es;
    unsigned char *buf = malloc(nbytes ? nbytes : 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char *p = buf + i * es;
        switch (dt) {
        case TD_BOOL:
            *p = (unsigned char)below(g, 2);
            break;
        case TD_FLOAT16:
        case TD_BFLOAT16: {
            float f = (float)small_double(g);
            uint16_t h = dt == TD_FLOAT16 ? td_float_to_half(f) : td_float_to_bfloat16(f);
            memcpy(p, &h, 2);
            break;
        }
        case TD_FLOAT32:
        case TD_COMPLEX64: {
            float f[2] = {(float)small_double(g), (float)small_double(g)};
            memcpy(p, f, es);
            break;
        }
        case TD_FLOAT64:
        case TD_COMPLEX128: {
            double d[2] = {small_double(g), small_double(g)};
            memcpy(p, d, es);
            break;
        }
        default: {
            uint64_t r = value_gen_next(g);
            memcpy(p, &r, es);
        }
        }
    }
    TD_CHECK_OK(td_tensor_write(t, buf, nbytes));
    free(buf);
    return t;
}

static td_shape random_shape(value_gen *g, int min_ndim, int max_ndim, int max_size)
{
    td_shape s = {.ndim = min_ndim + below(g, max_ndim - min_ndim + 1)};
    for (int i = 0; i < s.ndim; i++)
        s.d[i] = below(g, max_size + 1);
    return s;
}

td_tensor *value_gen_tensor(value_gen *g, int *kind)
{
    td_dtype dt = (td_dtype)below(g, TD_DTYPE_COUNT);
    int k = below(g, 6);
    td_tensor *base, *t = NULL;
    switch (k) {
    case 1: { /* transposed */
        base = fresh(g, dt, random_shape(g, 2, 3, 4));
        TD_CHECK_OK(td_tensor_transpose(base, 0, td_tensor_ndim(base) - 1, &t));
        break;
    }
    case 2: { /* narrowed along some dim */
        td_shape s = random_shape(g, 1, 3, 5);
        s.d[0] += 2;
        base = fresh(g, dt, s);
        int dim = below(g, s.ndim);
        int64_t start = s.d[dim] ? below(g, (int)s.d[dim]) : 0;
        int64_t len = below(g, (int)(s.d[dim] - start) + 1);
        TD_CHECK_OK(td_tensor_narrow(base, dim, start, len, &t));
        break;
    }
    case 3: { /* expanded: a size-1 dim broadcast */
        td_shape s = random_shape(g, 1, 3, 3);
        int dim = below(g, s.ndim);
        s.d[dim] = 1;
        base = fresh(g, dt, s);
        s.d[dim] = 1 + below(g, 4);
        TD_CHECK_OK(td_tensor_expand(base, s, &t));
        break;
    }
    case 4: { /* arbitrary strides and an offset over a 1-D storage */
        base = fresh(g, dt, TD_SHAPE(40));
        int64_t r = 1 + below(g, 3), c = 1 + below(g, 3);
        int64_t strides[2] = {3 * c + 1, 2};
        TD_CHECK_OK(td_tensor_from_storage(td_tensor_storage(base), 1, dt, TD_SHAPE(r, c), strides, &t));
        break;
    }
    case 5: { /* select: drops a dim, 0-dim when the base is 1-D */
        td_shape s = random_shape(g, 1, 3, 4);
        s.d[0] += 1;
        base = fresh(g, dt, s);
        TD_CHECK_OK(td_tensor_select(base, 0, below(g, (int)s.d[0]), &t));
        break;
    }
    default:
        base = NULL;
        t = fresh(g, dt, random_shape(g, 0, 3, 4));
        k = 0;
    }
    td_tensor_release(base);
    if (kind)
        *kind = k;
    return t;
}

static td_tensor *some_tensor(value_gen *g)
{
    if (g->npool && below(g, 4) == 0)
        return td_tensor_retain(g->pool[below(g, g->npool)]);
    td_tensor *t = value_gen_tensor(g, NULL);
    if (g->npool < (int)(sizeof g->pool / sizeof *g->pool))
        g->pool[g->npool++] = td_tensor_retain(t);
    return t;
}

static td_value *tensor_value(value_gen *g)
{
    td_tensor *t = some_tensor(g);
    td_value *v = td_value_tensor(t);
    td_tensor_release(t);
    return v;
}

static double some_double(value_gen *g)
{
    static const double specials[] = {0.0, -0.0, 1.0, 2.5, -1e300, 1e-310, INFINITY, -INFINITY, 0.1};
    if (below(g, 2))
        return specials[below(g, (int)(sizeof specials / sizeof *specials))];
    for (;;) {
        uint64_t bits = value_gen_next(g);
        double d;
        memcpy(&d, &bits, sizeof d);
        if (!isnan(d))
            return d;
    }
}

static td_value *some_string(value_gen *g, td_value_kind kind)
{
    char buf[16];
    size_t n = (size_t)below(g, 13);
    for (size_t i = 0; i < n; i++)
        buf[i] = below(g, 3) ? (char)('a' + below(g, 26)) : (char)below(g, 256);
    return kind == TD_VAL_STRING ? td_value_string_n(buf, n) : td_value_bytes(buf, n);
}

static td_value *scalar(value_gen *g)
{
    static const int64_t ints[] = {0, 1, -1, 127, 128, -129, INT64_MAX, INT64_MIN, 1LL << 40};
    switch (below(g, 8)) {
    case 0:
        return td_value_none();
    case 1:
        return td_value_bool(below(g, 2));
    case 2:
        return td_value_int(below(g, 2) ? ints[below(g, 9)] : (int64_t)value_gen_next(g));
    case 3:
        return td_value_double(some_double(g));
    case 4:
        return td_value_complex(some_double(g), some_double(g));
    case 5:
        return some_string(g, TD_VAL_STRING);
    case 6:
        return some_string(g, TD_VAL_BYTES);
    default:
        return tensor_value(g);
    }
}

static td_value *hashable(value_gen *g, int depth)
{
    if (depth < g->max_depth && below(g, 5) == 0) {
        size_t n = (size_t)below(g, 3);
        td_value *t = td_value_tuple_new(n);
        for (size_t i = 0; i < n; i++)
            TD_CHECK_OK(td_value_set(t, i, hashable(g, depth + 1)));
        return t;
    }
    return scalar(g);
}

static td_value *gen(value_gen *g, int depth)
{
    if (depth >= g->max_depth || below(g, 3) == 0)
        return scalar(g);
    size_t n = (size_t)below(g, 5);
    switch (below(g, 4)) {
    case 0: {
        td_value *l = td_value_list_new();
        for (size_t i = 0; i < n; i++)
            TD_CHECK_OK(td_value_list_append(l, gen(g, depth + 1)));
        return l;
    }
    case 1: {
        td_value *t = td_value_tuple_new(n);
        for (size_t i = 0; i < n; i++)
            TD_CHECK_OK(td_value_set(t, i, gen(g, depth + 1)));
        return t;
    }
    case 2: {
        td_value *d = td_value_dict_new();
        for (size_t i = 0; i < n; i++)
            TD_CHECK_OK(td_value_dict_set(d, hashable(g, depth + 1), gen(g, depth + 1)));
        return d;
    }
    default: {
        static const uint32_t tags[] = {TD_REC_WORKER_INFO, TD_REC_ERROR, TD_REC_USER, 0xffffffffu};
        td_value *r = td_value_record_new(tags[below(g, 4)], n);
        for (size_t i = 0; i < n; i++)
            TD_CHECK_OK(td_value_set(r, i, gen(g, depth + 1)));
        return r;
    }
    }
}

td_value *value_gen_value(value_gen *g) { return gen(g, 0); }
