/* Helpers shared by the store tests: publishing a port through a file in the test's tmpdir (never
 * probing for free ports), opening the store a case is parameterized over, store barriers, and
 * timing. */
#ifndef TDIST_TESTS_STORE_UTIL_H
#define TDIST_TESTS_STORE_UTIL_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/store.h>
#include <tdist/testing.h>

double now_s(void);
void sleep_s(double s);

/* Writes "<tmpdir>/<name>" atomically (write, then rename). */
void publish_int(const td_test_ctx *ctx, const char *name, int value);
/* Waits for "<tmpdir>/<name>" and reads it (fails the test after 60 s). */
int read_published_int(const td_test_ctx *ctx, const char *name);
void unpublish(const td_test_ctx *ctx, const char *name);

/* An on_listening hook publishing the port as "port"; arg is the td_test_ctx. */
void publish_port_hook(int port, void *arg);

/* Starts the standalone server binary `bin` with args (NULL-terminated) and reads its port from its
 * first line, "tdist-store listening on HOST:PORT". *out_fd and *err_fd are the read ends of its
 * stdout (after that line) and stderr. Fails the test if it prints no address within 30 s. */
pid_t store_tool_spawn(const char *bin, const char *const *args, int *port, int *out_fd, int *err_fd);

/* A TCPStore master on 127.0.0.1 with port 0 that publishes its port as "port" before waiting
 * for workers, or a client of it. world_size < 1: no wait for workers. */
td_store *tcp_master(const td_test_ctx *ctx, int world_size, int64_t timeout_ms);
td_store *tcp_client(const td_test_ctx *ctx, int world_size, int64_t timeout_ms);

/* The store named by ctx->param for this process alone (world size 1): "tcp", "tcp_inet" (a
 * TCPStore with TDIST_STORE_UNIX=0, so that same-host clients use TCP too), "file", "hash" or
 * "prefix" (a PrefixStore over a TCPStore). */
td_store *open_param_store(const td_test_ctx *ctx);
/* Extra keys the store counts in num_keys beyond the user's (init/, refcount/). */
int64_t param_internal_keys(const td_test_ctx *ctx);
/* The message a get timeout gives for the param's store. */
const char *param_get_timeout_msg(const td_test_ctx *ctx, const char *key, int64_t timeout_ms, char *buf, size_t size);
const char *param_wait_timeout_msg(const td_test_ctx *ctx);

/* All `world` participants add to key, then wait until all did. */
void store_barrier(td_store *store, const char *key, int world);

/* A barrier on an existing counter: adds 1 and waits until it reaches target (creates no key). */
void counter_barrier(td_store *store, const char *key, int64_t target);

/* Runs fn as `world` workers sharing one store: one per rank process for the stores processes can
 * share (tcp, file, prefix), or `world` threads of rank 0 over one HashStore. Ends with a barrier,
 * and the TCPStore master is released last. */
typedef void (*worker_fn)(td_test_ctx *ctx, td_store *store, int rank, int world);
void run_workers(td_test_ctx *ctx, worker_fn fn);

/* Reads the value of key as a NUL-terminated string (free it). */
char *get_str(td_store *store, const char *key);

#endif
