/* tdist/store.h: key-value stores for rendezvous (c10d's Store, TCPStore, FileStore, HashStore and
 * PrefixStore) and td_rendezvous(), which turns an init URL into a store, a rank and a world size.
 *
 * Every process group and RPC agent meets its peers through a store: ranks publish addresses and
 * counters under agreed keys and block until the others' keys appear.
 *
 *     td_store *store;
 *     int rank, world;
 *     TD_CHECK_OK(td_rendezvous("env://", -1, -1, 60000, &store, &rank, &world));
 *     td_store_set_str(store, "addr/0", "10.0.0.1:4000");
 *     void *v; size_t n;
 *     td_store_get(store, "addr/0", &v, &n);   // blocks until some rank set it
 *     free(v);
 *     td_store_release(store);
 *
 * Handles are refcounted: a create function returns one reference; td_store_retain adds one and
 * td_store_release drops one, destroying the store with the last. Every function borrows the
 * store it is given. All stores are thread-safe; calls on one handle may serialize (a TCPStore
 * handle has one connection, and a blocking get holds it), so threads that block on different
 * keys at once should each have their own handle.
 *
 * Keys are NUL-terminated strings; values are bytes (pointer + length). A value a call returns is
 * a malloc'd buffer the caller frees with free(); it carries one extra NUL byte past its length, so
 * a text value can be used as a C string.
 *
 * Timeouts are milliseconds. Each store has one (TD_STORE_DEFAULT_TIMEOUT_MS unless changed; 0
 * means none) that bounds get, multi_get, wait and the TCPStore's socket I/O. A timeout fails with
 * TD_ERR_TIMEOUT and PyTorch's message for that store:
 *   HashStore:  "Wait timeout" (get and wait)
 *   FileStore:  "Timeout waiting for key: K after T ms" (get), "Wait timeout" (wait)
 *   TCPStore:   "Socket Timeout" (get and wait)
 * Other errors: TD_ERR_INVALID (a NULL or oversize argument, an add on a value that is not a
 * decimal integer), TD_ERR_PEER_LOST (the TCPStore server went away), TD_ERR_IO (a file or socket
 * call failed, with errno's text).
 */
#ifndef TDIST_STORE_H
#define TDIST_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#ifdef __cplusplus
extern "C" {
#endif

#ifndef TD_STORE_DECLARED /* declared by store.h, pg.h and rpc.h: C99 allows one typedef */
#define TD_STORE_DECLARED
typedef struct td_store td_store;
#endif

#define TD_STORE_DEFAULT_TIMEOUT_MS 300000 /* c10d's kDefaultTimeout: 300 s */
#define TD_STORE_NO_TIMEOUT 0              /* c10d's kNoTimeout: wait forever */
#define TD_STORE_TIMEOUT_DEFAULT (-1)      /* td_store_wait: use the store's own timeout */

TD_API td_store *td_store_retain(td_store *store);
/* NULL is ignored. Dropping the last reference closes the store: a FileStore counts itself out
 * (and the last one removes the file), a TCPStore closes its connection and, on the master, stops
 * the server once no other handle in the process uses it. */
TD_API void td_store_release(td_store *store);

/* ---- the Store interface --------------------------------------------------------------------- */

TD_API td_status td_store_set(td_store *store, const char *key, const void *value, size_t len);
/* td_store_set with strlen(value) bytes. */
TD_API td_status td_store_set_str(td_store *store, const char *key, const char *value);
/* Blocks until key exists or the store's timeout passes; *value is malloc'd (free() it). */
TD_API td_status td_store_get(td_store *store, const char *key, void **value, size_t *len);
/* Adds delta to the integer stored at key (absent counts as 0) and returns the new value in
 * *result (may be NULL). The value is stored as decimal ASCII: get after add(k, 6) gives "6". */
TD_API td_status td_store_add(td_store *store, const char *key, int64_t delta, int64_t *result);
/* c10d's compareSet; *value (malloc'd) is:
 *   key absent, expected empty          -> key := desired, returns desired
 *   key absent, expected non-empty      -> no write, returns expected
 *   key present and equal to expected   -> key := desired, returns desired
 *   key present with another value      -> no write, returns the current value */
TD_API td_status td_store_compare_set(td_store *store, const char *key, const void *expected,
                                      size_t expected_len, const void *desired, size_t desired_len,
                                      void **value, size_t *len);
/* *deleted (may be NULL) says whether the key existed. */
TD_API td_status td_store_delete_key(td_store *store, const char *key, bool *deleted);
/* Non-blocking: *ready says whether all n keys exist now. */
TD_API td_status td_store_check(td_store *store, const char *const *keys, size_t n, bool *ready);
/* The number of keys, internal ones included, as in c10d (see each store's notes below). */
TD_API td_status td_store_num_keys(td_store *store, int64_t *count);
/* Blocks until all n keys exist. timeout_ms: TD_STORE_TIMEOUT_DEFAULT for the store's timeout, 0
 * for none, else milliseconds. */
TD_API td_status td_store_wait(td_store *store, const char *const *keys, size_t n, int64_t timeout_ms);
/* Appends bytes to key's value (creating it). */
TD_API td_status td_store_append(td_store *store, const char *key, const void *value, size_t len);
/* Blocks until all n keys exist (store timeout), then fills values[i] (malloc'd each) and lens[i].
 * On failure nothing is left allocated. */
TD_API td_status td_store_multi_get(td_store *store, const char *const *keys, size_t n, void **values,
                                    size_t *lens);
TD_API td_status td_store_multi_set(td_store *store, const char *const *keys, const void *const *values,
                                    const size_t *lens, size_t n);
/* 0 means no timeout; negative is invalid. A PrefixStore's timeout is its base store's. */
TD_API td_status td_store_set_timeout(td_store *store, int64_t timeout_ms);
TD_API int64_t td_store_get_timeout(td_store *store);

/* ---- TCPStore ---------------------------------------------------------------------------------
 * A server (one epoll thread, inside the master's process or the standalone tdist-store program)
 * and one client connection per handle. Every handle, the master's included, is a client.
 * Notes users can see (the first three as in c10d):
 *  - with wait_for_workers and a world_size, every handle adds 1 to the key "init/" and the master
 *    waits until world_size handles did ("Timed out after S seconds waiting for clients. n/N
 *    clients joined."); num_keys counts "init/".
 *  - the server holds blocked gets and waits itself: a waiting client costs nothing until its key
 *    is set. The client enforces the timeout (then cancels its request on the server).
 *  - set returns once the request is sent, as c10d's does; the server applies it before any later
 *    request of the same handle, so that handle and anyone blocked on the key see it, but another
 *    handle's non-blocking check right after may not yet. A set the server refuses fails the
 *    handle's next call.
 *  - same-host clients connect through a unix socket beside the TCP port (TDIST_STORE_UNIX=0: off).
 *  - if the server dies, every pending and later call fails at once with TD_ERR_PEER_LOST.
 *  - with TDIST_AUTH_TOKEN (or auth_token) set, server and client prove to each other that they hold
 *    that secret (challenge-response with HMAC-SHA256; the secret never travels), and either side
 *    refuses a peer without it: a server with a secret refuses clients without the same one, and a
 *    client with one refuses a server without it. tdrun sets a random one for each job. */
typedef struct td_tcp_store_options {
    const char *host;        /* master: address to bind (NULL or "": all interfaces); others: the
                                master's address (NULL: 127.0.0.1). IPv4, IPv6 or a host name. */
    int port;                /* 0 on the master picks a free port: read it with td_tcp_store_port */
    int world_size;          /* number of handles that will join; -1 when unknown */
    bool is_master;          /* start the server in this process */
    int64_t timeout_ms;      /* the store's timeout; also bounds connecting and waiting for workers */
    bool wait_for_workers;   /* see above; needs world_size >= 1 */
    bool multi_tenant;       /* masters of one process on the same port share one server */
    const char *auth_token;  /* the job's secret; NULL: $TDIST_AUTH_TOKEN, if set; "": none */
    size_t max_key_len;      /* server and client limit; 0: $TDIST_STORE_MAX_KEY or 64 KiB */
    size_t max_value_len;    /* 0: $TDIST_STORE_MAX_VALUE or 512 MiB */
    /* Master only, may be NULL: called once the server listens, before the master waits for
     * workers, with the bound port. With port 0 this is where the master publishes its port to
     * the other ranks (the create call itself returns only after they joined). */
    void (*on_listening)(int port, void *arg);
    void *on_listening_arg;
} td_tcp_store_options;

#define TD_TCP_STORE_OPTIONS_INIT                                                                   \
    {                                                                                               \
        .host = NULL, .port = 29500, .world_size = -1, .is_master = false,                          \
        .timeout_ms = TD_STORE_DEFAULT_TIMEOUT_MS, .wait_for_workers = true, .multi_tenant = false, \
        .auth_token = NULL, .max_key_len = 0, .max_value_len = 0, .on_listening = NULL,             \
        .on_listening_arg = NULL                                                                    \
    }

TD_API td_status td_tcp_store_create(const td_tcp_store_options *options, td_store **store);
/* The server's port (the bound one when created with port 0); -1 if store is not a TCPStore. */
TD_API int td_tcp_store_port(td_store *store);

/* ---- FileStore --------------------------------------------------------------------------------
 * Shares a file between processes (c10d's algorithm: an append-only log of records under flock,
 * polled every 10 ms by blocking calls). num_workers handles will use the file; once all of them
 * were released the last one removes it (num_workers < 0: never removed). Notes, as in c10d:
 *  - num_keys counts the internal keys "refcount/" (from the first handle on) and "cleanup/"
 *    (once any handle was released).
 *  - timeouts are measured in whole seconds, so they fire up to one second late (never early);
 *  - a handle opened on a path whose file was removed waits for a writer to recreate it, for up
 *    to the timeout; use a fresh path for each job. A crashed process leaves the file behind.
 * Unlike c10d, delete_key reports whether the key existed (c10d's FileStore always says true). */
TD_API td_status td_file_store_create(const char *path, int num_workers, td_store **store);

/* ---- HashStore: in-process map, for ranks that are threads of one process. ---------------------- */
TD_API td_status td_hash_store_create(td_store **store);

/* ---- PrefixStore ------------------------------------------------------------------------------
 * Wraps base (taking a reference to it), turning every key K into "<prefix>/K". num_keys is not
 * filtered: it is the base store's total, as in c10d. c10d nests them, e.g. "default_pg/0//key". */
TD_API td_status td_prefix_store_create(const char *prefix, td_store *base, td_store **store);

/* ---- rendezvous -------------------------------------------------------------------------------
 * td_rendezvous(url, rank, world_size, timeout_ms, ...) turns an init URL into a store and this
 * process's rank and world size, as c10d's rendezvous() does:
 *   env://                            MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE from the environment
 *                                     (rank and world_size may also come from the query)
 *   tcp://HOST:PORT?rank=R&world_size=W   TCPStore; rank 0 runs the server
 *   file://PATH?rank=R&world_size=W       FileStore(PATH, W)
 * rank and world_size >= 0 are appended to the query (a URL that already has them is an error); -1
 * means "from the URL or environment". world_size 0 means no fixed size (PyTorch's world_size=None,
 * for RPC's dynamic groups): the TCPStore master waits for nobody and the FileStore is never
 * removed by a count of its users. The store's timeout is timeout_ms (0: none). Errors use
 * c10d's words: "Error initializing torch.distributed using env:// rendezvous: environment
 * variable MASTER_ADDR expected, but not set", "... tcp:// rendezvous: port number missing",
 * "... file:// rendezvous: world size parameter missing", "No rendezvous handler for foo://". */
TD_API td_status td_rendezvous(const char *url, int rank, int world_size, int64_t timeout_ms,
                               td_store **store, int *rank_out, int *world_size_out);

/* A handler gets the completed URL (rank and world_size already in its query). */
typedef td_status (*td_rendezvous_handler)(const char *url, int64_t timeout_ms, void *arg,
                                           td_store **store, int *rank, int *world_size);
/* Adds a scheme ("etcd" for etcd://...). Fails with TD_ERR_ALREADY, "Rendezvous handler for
 * etcd:// already registered", if it exists. */
TD_API td_status td_rendezvous_register(const char *scheme, td_rendezvous_handler handler, void *arg);
/* For handlers: copies query parameter `name` of url into out (NUL-terminated, truncated to size);
 * false when absent. */
TD_API bool td_rendezvous_url_param(const char *url, const char *name, char *out, size_t size);

#ifdef __cplusplus
}
#endif
#endif
