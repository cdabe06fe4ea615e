/* PrefixStore (tdist/store.h): namespaces another store by rewriting every key K to
 * "<prefix>/K", as c10d's PrefixStore does (process groups nest them: "default_pg/0//key").
 * num_keys and the timeout are the base store's, unfiltered, as in c10d. */
#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"
#include "base/error.h"
#include "store/store_impl.h"

typedef struct prefix_store {
    td_store base;
    td_store *inner;
    char *prefix;
    size_t prefix_len;
} prefix_store;

static prefix_store *P(td_store *s) { return (prefix_store *)s; }

static char *full_key(prefix_store *p, const char *key)
{
    size_t n = strlen(key);
    char *k = alloc_or_die(p->prefix_len + 1 + n + 1);
    memcpy(k, p->prefix, p->prefix_len);
    k[p->prefix_len] = '/';
    memcpy(k + p->prefix_len + 1, key, n + 1);
    return k;
}

static char **full_keys(prefix_store *p, const char *const *keys, size_t n)
{
    char **out = TD_NEW_ARRAY(char *, n);
    for (size_t i = 0; i < n; i++)
        out[i] = full_key(p, keys[i]);
    return out;
}

static void free_keys(char **keys, size_t n)
{
    for (size_t i = 0; i < n; i++)
        free(keys[i]);
    free(keys);
}

static td_status ps_set(td_store *s, const char *key, const void *value, size_t len)
{
    char *k = full_key(P(s), key);
    td_status st = td_store_set(P(s)->inner, k, value, len);
    free(k);
    return st;
}

static td_status ps_get(td_store *s, const char *key, void **value, size_t *len)
{
    char *k = full_key(P(s), key);
    td_status st = td_store_get(P(s)->inner, k, value, len);
    free(k);
    return st;
}

static td_status ps_add(td_store *s, const char *key, int64_t delta, int64_t *result)
{
    char *k = full_key(P(s), key);
    td_status st = td_store_add(P(s)->inner, k, delta, result);
    free(k);
    return st;
}

static td_status ps_compare_set(td_store *s, const char *key, const void *expected, size_t expected_len,
                                const void *desired, size_t desired_len, void **value, size_t *len)
{
    char *k = full_key(P(s), key);
    td_status st = td_store_compare_set(P(s)->inner, k, expected, expected_len, desired, desired_len, value, len);
    free(k);
    return st;
}

static td_status ps_delete_key(td_store *s, const char *key, bool *deleted)
{
    char *k = full_key(P(s), key);
    td_status st = td_store_delete_key(P(s)->inner, k, deleted);
    free(k);
    return st;
}

static td_status ps_check(td_store *s, const char *const *keys, size_t n, bool *ready)
{
    char **k = full_keys(P(s), keys, n);
    td_status st = td_store_check(P(s)->inner, (const char *const *)k, n, ready);
    free_keys(k, n);
    return st;
}

static td_status ps_num_keys(td_store *s, int64_t *count) { return td_store_num_keys(P(s)->inner, count); }

static td_status ps_wait(td_store *s, const char *const *keys, size_t n, int64_t timeout_ms)
{
    char **k = full_keys(P(s), keys, n);
    td_status st = td_store_wait(P(s)->inner, (const char *const *)k, n, timeout_ms);
    free_keys(k, n);
    return st;
}

static td_status ps_append(td_store *s, const char *key, const void *value, size_t len)
{
    char *k = full_key(P(s), key);
    td_status st = td_store_append(P(s)->inner, k, value, len);
    free(k);
    return st;
}

static td_status ps_multi_get(td_store *s, const char *const *keys, size_t n, void **values, size_t *lens)
{
    char **k = full_keys(P(s), keys, n);
    td_status st = td_store_multi_get(P(s)->inner, (const char *const *)k, n, values, lens);
    free_keys(k, n);
    return st;
}

static td_status ps_multi_set(td_store *s, const char *const *keys, const void *const *values, const size_t *lens,
                              size_t n)
{
    char **k = full_keys(P(s), keys, n);
    td_status st = td_store_multi_set(P(s)->inner, (const char *const *)k, values, lens, n);
    free_keys(k, n);
    return st;
}

static void ps_set_timeout(td_store *s, int64_t timeout_ms) { td_store_set_timeout(P(s)->inner, timeout_ms); }
static int64_t ps_get_timeout(td_store *s) { return td_store_get_timeout(P(s)->inner); }

static void ps_destroy(td_store *s)
{
    prefix_store *p = P(s);
    td_store_release(p->inner);
    free(p->prefix);
    free(p);
}

static const td_store_ops prefix_store_ops = {
    .kind = "PrefixStore",
    .set = ps_set,
    .get = ps_get,
    .add = ps_add,
    .compare_set = ps_compare_set,
    .delete_key = ps_delete_key,
    .check = ps_check,
    .num_keys = ps_num_keys,
    .wait = ps_wait,
    .append = ps_append,
    .multi_get = ps_multi_get,
    .multi_set = ps_multi_set,
    .set_timeout = ps_set_timeout,
    .get_timeout = ps_get_timeout,
    .destroy = ps_destroy,
};

td_status td_prefix_store_create(const char *prefix, td_store *base, td_store **store)
{
    if (!prefix || !base || !store)
        return error_fmt(TD_ERR_INVALID, "td_prefix_store_create: prefix, base and store must not be NULL");
    prefix_store *p = TD_NEW(prefix_store);
    store_init(&p->base, &prefix_store_ops, 0);
    p->inner = td_store_retain(base);
    p->prefix = alloc_strdup(prefix);
    p->prefix_len = strlen(prefix);
    *store = &p->base;
    return TD_OK;
}
