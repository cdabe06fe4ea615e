/* Object collectives (all_gather_object, gather_object, broadcast_object_list, scatter_object_list):
 * td_values sent as their codec bytes (tdist/value.h) over the group's tensor collectives, as c10d
 * sends pickles: first the sizes, then the payloads, padded to the largest where a collective
 * needs equal sizes. They block, and run in issue order with the group's other calls since every
 * step is an ordinary collective. Received sizes are checked before anything is allocated from
 * them, and the codec validates each payload. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "pg/pg_impl.h"

static td_status new_bytes(int64_t n, td_tensor **out) { return td_tensor_zeros(TD_UINT8, TD_SHAPE(n), out); }

static td_status new_sizes(int64_t n, td_tensor **out) { return td_tensor_zeros(TD_INT64, TD_SHAPE(n), out); }

static td_status encode(const td_value *obj, td_tensor **out, int64_t *len)
{
    if (!obj)
        return error_fmt(TD_ERR_INVALID, "object collectives: the object is NULL (use td_value_none())");
    void *data;
    size_t n;
    TD_TRY(td_value_encode_bytes(obj, &data, &n));
    td_status st = td_tensor_from_buffer(TD_UINT8, TD_SHAPE((int64_t)n), data, out);
    free(data);
    *len = (int64_t)n;
    return st;
}

/* A payload of len bytes padded with zeros to size. */
static td_status padded(const td_tensor *payload, int64_t len, int64_t size, td_tensor **out)
{
    TD_TRY(new_bytes(size, out));
    if (len > 0)
        memcpy(td_tensor_data(*out), td_tensor_data(payload), (size_t)len);
    return TD_OK;
}

static td_status check_size(int64_t size, int64_t bound, int rank)
{
    if (size < 0 || size > bound)
        return error_fmt(TD_ERR_INVALID, "object collectives: rank %d announced an object of %lld bytes (bound %lld)",
                        rank, (long long)size, (long long)bound);
    return TD_OK;
}

static td_status decode(const void *data, int64_t len, td_value **out)
{
    td_status st = td_value_decode(data, (size_t)len, out);
    return st == TD_OK ? st : error_prefix(st, "object collectives: decoding a received object");
}

/* all_gathers every rank's byte count; *all is a new int64 tensor of size entries. */
static td_status gather_sizes(td_pg *g, int64_t len, td_tensor **all, int64_t *max)
{
    td_tensor *mine = NULL;
    TD_TRY(new_sizes(1, &mine));
    *(int64_t *)td_tensor_data(mine) = len;
    td_status st = new_sizes(g->size, all);
    if (st == TD_OK)
        st = td_pg_all_gather_into_tensor(g, *all, mine, NULL);
    td_tensor_release(mine);
    if (st != TD_OK) {
        td_tensor_release(*all);
        *all = NULL;
        return st;
    }
    const int64_t *sizes = td_tensor_data(*all);
    *max = 0;
    for (int r = 0; r < g->size; r++) {
        if (sizes[r] < 0) {
            td_tensor_release(*all);
            *all = NULL;
            return check_size(sizes[r], 0, r);
        }
        if (sizes[r] > *max)
            *max = sizes[r];
    }
    return TD_OK;
}

/* The first steps of all_gather_object and gather_object: the object's bytes, padded to the
 * largest object of the group (*mine), and every rank's byte count (*sizes, *max). */
static td_status exchange_sizes(td_pg *g, const td_value *obj, td_tensor **sizes, td_tensor **mine, int64_t *max)
{
    td_tensor *payload = NULL;
    int64_t len = 0;
    td_status st = encode(obj, &payload, &len);
    if (st == TD_OK)
        st = gather_sizes(g, len, sizes, max);
    if (st == TD_OK)
        st = padded(payload, len, *max, mine);
    td_tensor_release(payload);
    return st;
}

/* A new list of the n objects held in rows of max bytes (row r has sizes[r] of them). */
static td_status decode_rows(const uint8_t *rows, int64_t max, const int64_t *sizes, int n, td_value **out)
{
    td_value *list = td_value_list_new();
    for (int r = 0; r < n; r++) {
        td_value *v;
        td_status st = decode(rows + r * max, sizes[r], &v);
        if (st != TD_OK) {
            td_value_release(list);
            return st;
        }
        td_value_list_append(list, v);
    }
    *out = list;
    return TD_OK;
}

td_status td_pg_all_gather_object(td_pg *pg, td_value *obj, td_value **out)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "all_gather_object", &g));
    if (!out)
        return error_fmt(TD_ERR_INVALID, "all_gather_object: out is NULL");
    *out = NULL;
    td_tensor *sizes = NULL, *mine = NULL, *all = NULL;
    int64_t max = 0;
    td_status st = exchange_sizes(g, obj, &sizes, &mine, &max);
    if (st == TD_OK)
        st = new_bytes(max * g->size, &all);
    if (st == TD_OK)
        st = td_pg_all_gather_into_tensor(g, all, mine, NULL);
    if (st == TD_OK)
        st = decode_rows(td_tensor_data(all), max, td_tensor_data(sizes), g->size, out);
    td_tensor_release(sizes);
    td_tensor_release(mine);
    td_tensor_release(all);
    return st;
}

td_status td_pg_gather_object(td_pg *pg, td_value *obj, td_value **out, int dst)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "gather_object", &g));
    if (dst < 0 || dst >= g->size)
        return error_fmt(TD_ERR_INVALID, "gather_object: invalid destination rank: %d (the group has %d ranks)", dst,
                        g->size);
    bool is_dst = g->rank == dst;
    if (is_dst && !out)
        return error_fmt(TD_ERR_INVALID, "Argument ``gather_list`` must be specified on destination rank.");
    if (!is_dst && out)
        return error_fmt(TD_ERR_INVALID, "Argument ``gather_list`` must NOT be specified on non-destination ranks.");
    if (out)
        *out = NULL;
    td_tensor *sizes = NULL, *mine = NULL, *all = NULL;
    td_tensor **rows = NULL; /* on dst: views of all's rows, gather's outputs */
    int64_t max = 0;
    td_status st = exchange_sizes(g, obj, &sizes, &mine, &max);
    if (st == TD_OK && is_dst) {
        st = new_bytes(max * g->size, &all);
        rows = alloc_zeroed((size_t)g->size, sizeof *rows);
        for (int r = 0; r < g->size && st == TD_OK; r++)
            st = td_tensor_narrow(all, 0, r * max, max, &rows[r]);
    }
    if (st == TD_OK)
        st = td_pg_gather(g, rows, mine, dst, NULL);
    if (st == TD_OK && is_dst)
        st = decode_rows(td_tensor_data(all), max, td_tensor_data(sizes), g->size, out);
    for (int r = 0; rows && r < g->size; r++)
        td_tensor_release(rows[r]);
    free(rows);
    td_tensor_release(sizes);
    td_tensor_release(mine);
    td_tensor_release(all);
    return st;
}

td_status td_pg_broadcast_object_list(td_pg *pg, td_value *list, int src)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "broadcast_object_list", &g));
    if (src < 0 || src >= g->size)
        return error_fmt(TD_ERR_INVALID, "broadcast_object_list: invalid source rank: %d (the group has %d ranks)", src,
                        g->size);
    if (!list || td_value_kind_of(list) != TD_VAL_LIST)
        return error_fmt(TD_ERR_INVALID, "broadcast_object_list: object_list must be a td_value list");
    int64_t n = (int64_t)td_value_len(list);
    bool is_src = g->rank == src;
    td_tensor *sizes = NULL, *payload = NULL;
    td_status st = new_sizes(n, &sizes);
    int64_t *sz = st == TD_OK ? td_tensor_data(sizes) : NULL;
    int64_t total = 0;
    /* The source encodes everything once, into one buffer. */
    void **bufs = NULL;
    if (st == TD_OK && is_src) {
        bufs = alloc_zeroed((size_t)(n ? n : 1), sizeof *bufs);
        for (int64_t i = 0; i < n && st == TD_OK; i++) {
            size_t len;
            st = td_value_encode_bytes(td_value_at(list, (size_t)i), &bufs[i], &len);
            sz[i] = (int64_t)len;
        }
    }
    if (st == TD_OK)
        st = td_pg_broadcast(g, sizes, src, NULL);
    for (int64_t i = 0; st == TD_OK && i < n; i++) {
        st = check_size(sz[i], INT64_MAX - total, src);
        total += st == TD_OK ? sz[i] : 0;
    }
    if (st == TD_OK)
        st = new_bytes(total, &payload);
    if (st == TD_OK && is_src) {
        uint8_t *p = td_tensor_data(payload);
        for (int64_t i = 0; i < n; i++) {
            if (sz[i])
                memcpy(p, bufs[i], (size_t)sz[i]);
            p += sz[i];
        }
    }
    if (st == TD_OK)
        st = td_pg_broadcast(g, payload, src, NULL);
    if (st == TD_OK && !is_src) {
        const uint8_t *p = td_tensor_data(payload);
        for (int64_t i = 0; i < n && st == TD_OK; i++) {
            td_value *v;
            st = decode(p, sz[i], &v);
            if (st == TD_OK)
                st = td_value_set(list, (size_t)i, v);
            p += sz[i];
        }
    }
    for (int64_t i = 0; bufs && i < n; i++)
        free(bufs[i]);
    free(bufs);
    td_tensor_release(sizes);
    td_tensor_release(payload);
    return st;
}

td_status td_pg_scatter_object_list(td_pg *pg, td_value **out, td_value *in_list, int src)
{
    td_pg *g;
    TD_TRY(pg_resolve(pg, "scatter_object_list", &g));
    if (!out)
        return error_fmt(TD_ERR_INVALID, "Expected argument scatter_object_output_list to be a list of size at least 1.");
    *out = NULL;
    if (src < 0 || src >= g->size)
        return error_fmt(TD_ERR_INVALID, "scatter_object_list: invalid source rank: %d (the group has %d ranks)", src,
                        g->size);
    bool is_src = g->rank == src;
    if (is_src && (!in_list || td_value_kind_of(in_list) != TD_VAL_LIST || td_value_len(in_list) != (size_t)g->size))
        return error_fmt(TD_ERR_INVALID,
                        "scatter_object_list: scatter_object_input_list must be a td_value list of %d objects (the "
                        "group size) on the source rank",
                        g->size);
    td_tensor **payloads = NULL, **lens = NULL;
    td_tensor *max_t = NULL, *mine = NULL, *my_len = NULL;
    int64_t max = 0;
    td_status st = new_sizes(1, &max_t);
    if (st == TD_OK && is_src) {
        payloads = alloc_zeroed((size_t)g->size, sizeof *payloads);
        lens = alloc_zeroed((size_t)g->size, sizeof *lens);
        td_tensor **enc = alloc_zeroed((size_t)g->size, sizeof *enc);
        for (int r = 0; r < g->size && st == TD_OK; r++) {
            int64_t len = 0;
            st = encode(td_value_at(in_list, (size_t)r), &enc[r], &len);
            if (st == TD_OK)
                st = new_sizes(1, &lens[r]);
            if (st == TD_OK) {
                *(int64_t *)td_tensor_data(lens[r]) = len;
                if (len > max)
                    max = len;
            }
        }
        for (int r = 0; r < g->size && st == TD_OK; r++)
            st = padded(enc[r], td_tensor_numel(enc[r]), max, &payloads[r]);
        for (int r = 0; r < g->size; r++)
            td_tensor_release(enc[r]);
        free(enc);
        if (st == TD_OK)
            *(int64_t *)td_tensor_data(max_t) = max;
    }
    if (st == TD_OK)
        st = td_pg_broadcast(g, max_t, src, NULL);
    if (st == TD_OK) {
        max = *(int64_t *)td_tensor_data(max_t);
        st = check_size(max, INT64_MAX, src);
    }
    if (st == TD_OK)
        st = new_bytes(max, &mine);
    if (st == TD_OK)
        st = td_pg_scatter(g, mine, payloads, src, NULL);
    if (st == TD_OK)
        st = new_sizes(1, &my_len);
    if (st == TD_OK)
        st = td_pg_scatter(g, my_len, lens, src, NULL);
    if (st == TD_OK) {
        int64_t len = *(int64_t *)td_tensor_data(my_len);
        st = check_size(len, max, src);
        if (st == TD_OK)
            st = decode(td_tensor_data(mine), len, out);
    }
    for (int r = 0; is_src && r < g->size; r++) {
        td_tensor_release(payloads[r]);
        td_tensor_release(lens[r]);
    }
    free(payloads);
    free(lens);
    td_tensor_release(max_t);
    td_tensor_release(mine);
    td_tensor_release(my_len);
    return st;
}
