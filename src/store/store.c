/* The Store front end (tdist/store.h): argument checks, timeout resolution, refcounting and
 * dispatch to a store kind's vtable (store_impl.h), plus the value helpers every kind shares
 * (decimal counters, the compare_set truth table), so the four stores cannot drift apart on them. */
#include "store/store_impl.h"

#include <ctype.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"

void store_init(td_store *s, const td_store_ops *ops, int64_t timeout_ms)
{
    ref_init(&s->ref);
    s->ops = ops;
    atomic_init(&s->timeout_ms, timeout_ms);
}

td_store *td_store_retain(td_store *store)
{
    if (store)
        ref_inc(&store->ref);
    return store;
}

void td_store_release(td_store *store)
{
    if (store && ref_dec(&store->ref))
        store->ops->destroy(store);
}

int64_t store_timeout_of(td_store *s)
{
    if (s->ops->get_timeout)
        return s->ops->get_timeout(s);
    return atomic_load_explicit(&s->timeout_ms, memory_order_relaxed);
}

td_status store_copy_out(const void *data, size_t len, void **out, size_t *out_len)
{
    if (len == SIZE_MAX)
        return error_fmt(TD_ERR_NOMEM, "store value too large");
    void *p = NULL;
    TD_TRY(alloc_try(len + 1, "store value", &p));
    if (len)
        memcpy(p, data, len);
    ((char *)p)[len] = '\0';
    *out = p;
    if (out_len)
        *out_len = len;
    return TD_OK;
}

td_status store_parse_counter(const char *key, const void *value, size_t len, int64_t *out)
{
    const char *p = value, *end = p + len;
    while (p < end && isspace((unsigned char)*p))
        p++;
    if (p == end) {
        if (len == 0) {
            *out = 0;
            return TD_OK;
        }
        goto bad;
    }
    bool neg = false;
    if (*p == '+' || *p == '-')
        neg = *p++ == '-';
    if (p == end)
        goto bad;
    uint64_t mag = 0;
    for (; p < end; p++) {
        if (*p < '0' || *p > '9')
            goto bad;
        mag = mag * 10 + (uint64_t)(*p - '0');
        if (mag > (uint64_t)INT64_MAX + 1)
            goto bad;
    }
    if (!neg && mag > (uint64_t)INT64_MAX)
        goto bad;
    *out = neg ? (int64_t)(0 - mag) : (int64_t)mag;
    return TD_OK;
bad:
    return error_fmt(TD_ERR_INVALID,
                    "add: the value of key '%s' is not a decimal integer (%zu bytes); add only works on "
                    "keys written by add or set to a number",
                    key, len);
}

td_status store_counter_add(const char *key, int64_t current, int64_t delta, int64_t *out)
{
    if (__builtin_add_overflow(current, delta, out))
        return error_fmt(TD_ERR_INVALID, "add: key '%s' would overflow int64 (%" PRId64 " + %" PRId64 ")", key,
                        current, delta);
    return TD_OK;
}

size_t store_format_counter(int64_t v, char *buf)
{
    return (size_t)snprintf(buf, 24, "%" PRId64, v);
}

void store_compare_set_decide(bool present, const void *current, size_t current_len,
                                 const void *expected, size_t expected_len, const void *desired,
                                 size_t desired_len, bool *write, const void **result, size_t *result_len)
{
    bool match = present ? (current_len == expected_len && (expected_len == 0 || memcmp(current, expected, expected_len) == 0))
                         : expected_len == 0;
    *write = match;
    if (match) {
        *result = desired;
        *result_len = desired_len;
    } else if (!present) {
        *result = expected;
        *result_len = expected_len;
    } else {
        *result = current;
        *result_len = current_len;
    }
}

/* ---- public entry points ----------------------------------------------------------------------- */

#define CHECK_STORE(s)                                                   \
    do {                                                                 \
        if (!(s))                                                        \
            return error_fmt(TD_ERR_INVALID, "%s: store is NULL", __func__); \
    } while (0)
#define CHECK_ARG(cond, what)                                                  \
    do {                                                                       \
        if (!(cond))                                                           \
            return error_fmt(TD_ERR_INVALID, "%s: %s", __func__, what);         \
    } while (0)

static td_status check_keys(const char *fn, const char *const *keys, size_t n)
{
    if (n > 0 && !keys)
        return error_fmt(TD_ERR_INVALID, "%s: keys is NULL", fn);
    for (size_t i = 0; i < n; i++)
        if (!keys[i])
            return error_fmt(TD_ERR_INVALID, "%s: keys[%zu] is NULL", fn, i);
    return TD_OK;
}

td_status td_store_set(td_store *store, const char *key, const void *value, size_t len)
{
    CHECK_STORE(store);
    CHECK_ARG(key, "key is NULL");
    CHECK_ARG(value || len == 0, "value is NULL");
    return store->ops->set(store, key, value, len);
}

td_status td_store_set_str(td_store *store, const char *key, const char *value)
{
    CHECK_ARG(value, "value is NULL");
    return td_store_set(store, key, value, strlen(value));
}

td_status td_store_get(td_store *store, const char *key, void **value, size_t *len)
{
    CHECK_STORE(store);
    CHECK_ARG(key, "key is NULL");
    CHECK_ARG(value, "value is NULL");
    *value = NULL;
    size_t dummy;
    return store->ops->get(store, key, value, len ? len : &dummy);
}

td_status td_store_add(td_store *store, const char *key, int64_t delta, int64_t *result)
{
    CHECK_STORE(store);
    CHECK_ARG(key, "key is NULL");
    int64_t dummy;
    return store->ops->add(store, key, delta, result ? result : &dummy);
}

td_status td_store_compare_set(td_store *store, const char *key, const void *expected, size_t expected_len,
                               const void *desired, size_t desired_len, void **value, size_t *len)
{
    CHECK_STORE(store);
    CHECK_ARG(key, "key is NULL");
    CHECK_ARG(expected || expected_len == 0, "expected is NULL");
    CHECK_ARG(desired || desired_len == 0, "desired is NULL");
    CHECK_ARG(value, "value is NULL");
    *value = NULL;
    size_t dummy;
    return store->ops->compare_set(store, key, expected, expected_len, desired, desired_len, value,
                                   len ? len : &dummy);
}

td_status td_store_delete_key(td_store *store, const char *key, bool *deleted)
{
    CHECK_STORE(store);
    CHECK_ARG(key, "key is NULL");
    bool dummy;
    return store->ops->delete_key(store, key, deleted ? deleted : &dummy);
}

td_status td_store_check(td_store *store, const char *const *keys, size_t n, bool *ready)
{
    CHECK_STORE(store);
    CHECK_ARG(ready, "ready is NULL");
    TD_TRY(check_keys(__func__, keys, n));
    if (n == 0) {
        *ready = true;
        return TD_OK;
    }
    return store->ops->check(store, keys, n, ready);
}

td_status td_store_num_keys(td_store *store, int64_t *count)
{
    CHECK_STORE(store);
    CHECK_ARG(count, "count is NULL");
    return store->ops->num_keys(store, count);
}

td_status td_store_wait(td_store *store, const char *const *keys, size_t n, int64_t timeout_ms)
{
    CHECK_STORE(store);
    TD_TRY(check_keys(__func__, keys, n));
    if (timeout_ms < 0 && timeout_ms != TD_STORE_TIMEOUT_DEFAULT)
        return error_fmt(TD_ERR_INVALID, "td_store_wait: timeout must be >= 0 or TD_STORE_TIMEOUT_DEFAULT, got %lld",
                        (long long)timeout_ms);
    if (timeout_ms == TD_STORE_TIMEOUT_DEFAULT)
        timeout_ms = store_timeout_of(store);
    if (n == 0)
        return TD_OK;
    return store->ops->wait(store, keys, n, timeout_ms);
}

td_status td_store_append(td_store *store, const char *key, const void *value, size_t len)
{
    CHECK_STORE(store);
    CHECK_ARG(key, "key is NULL");
    CHECK_ARG(value || len == 0, "value is NULL");
    return store->ops->append(store, key, value, len);
}

td_status td_store_multi_get(td_store *store, const char *const *keys, size_t n, void **values, size_t *lens)
{
    CHECK_STORE(store);
    TD_TRY(check_keys(__func__, keys, n));
    CHECK_ARG(n == 0 || (values && lens), "values or lens is NULL");
    for (size_t i = 0; i < n; i++) {
        values[i] = NULL;
        lens[i] = 0;
    }
    if (n == 0)
        return TD_OK;
    td_status s = store->ops->multi_get(store, keys, n, values, lens);
    if (s != TD_OK) {
        for (size_t i = 0; i < n; i++) {
            free(values[i]);
            values[i] = NULL;
            lens[i] = 0;
        }
    }
    return s;
}

td_status td_store_multi_set(td_store *store, const char *const *keys, const void *const *values,
                             const size_t *lens, size_t n)
{
    CHECK_STORE(store);
    TD_TRY(check_keys(__func__, keys, n));
    CHECK_ARG(n == 0 || (values && lens), "values or lens is NULL");
    for (size_t i = 0; i < n; i++)
        if (!values[i] && lens[i])
            return error_fmt(TD_ERR_INVALID, "td_store_multi_set: values[%zu] is NULL", i);
    if (n == 0)
        return TD_OK;
    return store->ops->multi_set(store, keys, values, lens, n);
}

td_status td_store_set_timeout(td_store *store, int64_t timeout_ms)
{
    CHECK_STORE(store);
    if (timeout_ms < 0)
        return error_fmt(TD_ERR_INVALID, "td_store_set_timeout: timeout must be >= 0 ms (0: none), got %lld",
                        (long long)timeout_ms);
    if (store->ops->set_timeout)
        store->ops->set_timeout(store, timeout_ms);
    else
        atomic_store_explicit(&store->timeout_ms, timeout_ms, memory_order_relaxed);
    return TD_OK;
}

int64_t td_store_get_timeout(td_store *store)
{
    if (!store)
        return -1;
    return store_timeout_of(store);
}
