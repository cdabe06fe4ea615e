/* HashStore (tdist/store.h): c10d's in-memory store for ranks that are threads of one process
 * (the threaded harness's global store). One map under one mutex; every write broadcasts a
 * condition variable on which blocked gets and waits re-check their keys until their deadline. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/clock.h"
#include "base/error.h"
#include "base/map.h"
#include "base/thread.h"
#include "store/store_impl.h"

typedef struct hash_value {
    size_t len;
    char data[];
} hash_value;

typedef struct hash_store {
    td_store base;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    td_map map; /* key -> hash_value* */
} hash_store;

static hash_store *H(td_store *s) { return (hash_store *)s; }

static hash_value *value_new(const void *data, size_t len)
{
    hash_value *v = alloc_or_die(sizeof *v + len + 1);
    v->len = len;
    if (len)
        memcpy(v->data, data, len);
    v->data[len] = '\0';
    return v;
}

static hash_value *lookup(hash_store *h, const char *key) { return map_get(&h->map, key, strlen(key)); }

/* Caller holds mu. */
static void put_locked(hash_store *h, const char *key, hash_value *v)
{
    free(map_put(&h->map, key, strlen(key), v));
}

static bool all_present_locked(hash_store *h, const char *const *keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!lookup(h, keys[i]))
            return false;
    return true;
}

/* Waits (mu held) until all keys exist; false on timeout. */
static bool wait_locked(hash_store *h, const char *const *keys, size_t n, int64_t deadline)
{
    while (!all_present_locked(h, keys, n))
        if (!thread_cond_wait_until(&h->cv, &h->mu, deadline) && !all_present_locked(h, keys, n))
            return false;
    return true;
}

static td_status hs_set(td_store *s, const char *key, const void *value, size_t len)
{
    hash_store *h = H(s);
    hash_value *v = value_new(value, len);
    pthread_mutex_lock(&h->mu);
    put_locked(h, key, v);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return TD_OK;
}

static td_status hs_get(td_store *s, const char *key, void **value, size_t *len)
{
    hash_store *h = H(s);
    int64_t deadline = deadline_after_ms(store_timeout_of(s));
    pthread_mutex_lock(&h->mu);
    if (!wait_locked(h, &key, 1, deadline)) {
        pthread_mutex_unlock(&h->mu);
        return error_fmt(TD_ERR_TIMEOUT, "Wait timeout");
    }
    hash_value *v = lookup(h, key);
    td_status st = store_copy_out(v->data, v->len, value, len);
    pthread_mutex_unlock(&h->mu);
    return st;
}

static td_status hs_add(td_store *s, const char *key, int64_t delta, int64_t *result)
{
    hash_store *h = H(s);
    pthread_mutex_lock(&h->mu);
    hash_value *v = lookup(h, key);
    int64_t cur = 0, next = 0;
    td_status st = v ? store_parse_counter(key, v->data, v->len, &cur) : TD_OK;
    if (st == TD_OK)
        st = store_counter_add(key, cur, delta, &next);
    if (st == TD_OK) {
        char text[24];
        size_t n = store_format_counter(next, text);
        put_locked(h, key, value_new(text, n));
        pthread_cond_broadcast(&h->cv);
        *result = next;
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static td_status hs_compare_set(td_store *s, const char *key, const void *expected, size_t expected_len,
                                const void *desired, size_t desired_len, void **value, size_t *len)
{
    hash_store *h = H(s);
    pthread_mutex_lock(&h->mu);
    hash_value *v = lookup(h, key);
    bool write;
    const void *res;
    size_t res_len;
    store_compare_set_decide(v != NULL, v ? v->data : NULL, v ? v->len : 0, expected, expected_len, desired,
                                desired_len, &write, &res, &res_len);
    /* Copy out before a write frees the current value that res may point into. */
    td_status st = store_copy_out(res, res_len, value, len);
    if (st == TD_OK && write) {
        put_locked(h, key, value_new(desired, desired_len));
        pthread_cond_broadcast(&h->cv);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static td_status hs_delete_key(td_store *s, const char *key, bool *deleted)
{
    hash_store *h = H(s);
    pthread_mutex_lock(&h->mu);
    hash_value *v = map_remove(&h->map, key, strlen(key));
    pthread_mutex_unlock(&h->mu);
    *deleted = v != NULL;
    free(v);
    return TD_OK;
}

static td_status hs_check(td_store *s, const char *const *keys, size_t n, bool *ready)
{
    hash_store *h = H(s);
    pthread_mutex_lock(&h->mu);
    *ready = all_present_locked(h, keys, n);
    pthread_mutex_unlock(&h->mu);
    return TD_OK;
}

static td_status hs_num_keys(td_store *s, int64_t *count)
{
    hash_store *h = H(s);
    pthread_mutex_lock(&h->mu);
    *count = (int64_t)h->map.len;
    pthread_mutex_unlock(&h->mu);
    return TD_OK;
}

static td_status hs_wait(td_store *s, const char *const *keys, size_t n, int64_t timeout_ms)
{
    hash_store *h = H(s);
    int64_t deadline = deadline_after_ms(timeout_ms);
    pthread_mutex_lock(&h->mu);
    bool ok = wait_locked(h, keys, n, deadline);
    pthread_mutex_unlock(&h->mu);
    return ok ? TD_OK : error_fmt(TD_ERR_TIMEOUT, "Wait timeout");
}

static td_status hs_append(td_store *s, const char *key, const void *value, size_t len)
{
    hash_store *h = H(s);
    pthread_mutex_lock(&h->mu);
    hash_value *old = lookup(h, key);
    size_t old_len = old ? old->len : 0;
    if (len > SIZE_MAX - old_len - sizeof(hash_value) - 1) {
        pthread_mutex_unlock(&h->mu);
        return error_fmt(TD_ERR_NOMEM, "append: value of key '%s' would overflow", key);
    }
    hash_value *v = alloc_or_die(sizeof *v + old_len + len + 1);
    v->len = old_len + len;
    if (old_len)
        memcpy(v->data, old->data, old_len);
    if (len)
        memcpy(v->data + old_len, value, len);
    v->data[v->len] = '\0';
    put_locked(h, key, v);
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return TD_OK;
}

static td_status hs_multi_get(td_store *s, const char *const *keys, size_t n, void **values, size_t *lens)
{
    hash_store *h = H(s);
    int64_t deadline = deadline_after_ms(store_timeout_of(s));
    pthread_mutex_lock(&h->mu);
    td_status st = TD_OK;
    if (!wait_locked(h, keys, n, deadline))
        st = error_fmt(TD_ERR_TIMEOUT, "Wait timeout");
    for (size_t i = 0; st == TD_OK && i < n; i++) {
        hash_value *v = lookup(h, keys[i]);
        st = store_copy_out(v->data, v->len, &values[i], &lens[i]);
    }
    pthread_mutex_unlock(&h->mu);
    return st;
}

static td_status hs_multi_set(td_store *s, const char *const *keys, const void *const *values, const size_t *lens,
                              size_t n)
{
    hash_store *h = H(s);
    pthread_mutex_lock(&h->mu);
    for (size_t i = 0; i < n; i++)
        put_locked(h, keys[i], value_new(values[i], lens[i]));
    pthread_cond_broadcast(&h->cv);
    pthread_mutex_unlock(&h->mu);
    return TD_OK;
}

static void hs_destroy(td_store *s)
{
    hash_store *h = H(s);
    map_free(&h->map, free);
    pthread_cond_destroy(&h->cv);
    pthread_mutex_destroy(&h->mu);
    free(h);
}

static const td_store_ops hash_store_ops = {
    .kind = "HashStore",
    .set = hs_set,
    .get = hs_get,
    .add = hs_add,
    .compare_set = hs_compare_set,
    .delete_key = hs_delete_key,
    .check = hs_check,
    .num_keys = hs_num_keys,
    .wait = hs_wait,
    .append = hs_append,
    .multi_get = hs_multi_get,
    .multi_set = hs_multi_set,
    .destroy = hs_destroy,
};

td_status td_hash_store_create(td_store **store)
{
    if (!store)
        return error_fmt(TD_ERR_INVALID, "td_hash_store_create: store is NULL");
    hash_store *h = TD_NEW(hash_store);
    store_init(&h->base, &hash_store_ops, TD_STORE_DEFAULT_TIMEOUT_MS);
    thread_mutex_init(&h->mu);
    thread_cond_init(&h->cv);
    *store = &h->base;
    return TD_OK;
}
