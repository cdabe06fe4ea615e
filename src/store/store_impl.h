/* Internal: the Store vtable behind the opaque td_store handle (tdist/store.h).
 *
 * A store kind embeds `td_store` as its first member, fills a static td_store_ops and calls
 * store_init. store.c checks arguments, resolves timeouts and dispatches, so an implementation
 * sees only valid arguments: non-NULL keys and outputs, n >= 1 for multi-key calls, and for wait a
 * resolved timeout (0 = none). Output values are allocated with store_copy_out. */
#ifndef TDIST_STORE_STORE_IMPL_H
#define TDIST_STORE_STORE_IMPL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/store.h>

#include "base/ref.h"

typedef struct td_store_ops {
    const char *kind; /* "TCPStore", "FileStore", ... */
    td_status (*set)(td_store *s, const char *key, const void *value, size_t len);
    td_status (*get)(td_store *s, const char *key, void **value, size_t *len);
    td_status (*add)(td_store *s, const char *key, int64_t delta, int64_t *result);
    td_status (*compare_set)(td_store *s, const char *key, const void *expected, size_t expected_len,
                             const void *desired, size_t desired_len, void **value, size_t *len);
    td_status (*delete_key)(td_store *s, const char *key, bool *deleted);
    td_status (*check)(td_store *s, const char *const *keys, size_t n, bool *ready);
    td_status (*num_keys)(td_store *s, int64_t *count);
    td_status (*wait)(td_store *s, const char *const *keys, size_t n, int64_t timeout_ms);
    td_status (*append)(td_store *s, const char *key, const void *value, size_t len);
    td_status (*multi_get)(td_store *s, const char *const *keys, size_t n, void **values, size_t *lens);
    td_status (*multi_set)(td_store *s, const char *const *keys, const void *const *values,
                           const size_t *lens, size_t n);
    /* Optional: a store whose timeout lives elsewhere (PrefixStore: its base's). */
    void (*set_timeout)(td_store *s, int64_t timeout_ms);
    int64_t (*get_timeout)(td_store *s);
    /* Frees the store; called once, by the last release. */
    void (*destroy)(td_store *s);
} td_store_ops;

struct td_store {
    td_ref ref;
    const td_store_ops *ops;
    atomic_llong timeout_ms; /* 0 = none */
};

void store_init(td_store *s, const td_store_ops *ops, int64_t timeout_ms);
/* The store's own timeout (for implementations; honours get_timeout overrides). */
int64_t store_timeout_of(td_store *s);

/* A malloc'd copy of data with a NUL byte past len (TD_ERR_NOMEM for a huge len). */
td_status store_copy_out(const void *data, size_t len, void **out, size_t *out_len);
/* Parses a stored counter: optional whitespace and sign, then decimal digits, nothing after.
 * An empty value is 0. Fails with TD_ERR_INVALID naming the key. */
td_status store_parse_counter(const char *key, const void *value, size_t len, int64_t *out);
/* current + delta, failing with TD_ERR_INVALID on int64 overflow. */
td_status store_counter_add(const char *key, int64_t current, int64_t delta, int64_t *out);
/* The decimal text of v into buf (at least 24 bytes); returns its length. */
size_t store_format_counter(int64_t v, char *buf);

/* The compare_set truth table over a current value (present = false when absent): sets *write when
 * desired must be stored and points *result at the bytes to return. */
void store_compare_set_decide(bool present, const void *current, size_t current_len,
                                 const void *expected, size_t expected_len, const void *desired,
                                 size_t desired_len, bool *write, const void **result, size_t *result_len);

/* The rank an init URL gives (its rank parameter; for env:// also RANK or a launcher's variables),
 * without opening any store; fails with c10d's rendezvous messages ("... rank parameter missing"). */
td_status store_rendezvous_rank(const char *url, int *rank);

#endif
