/* tdist/future.h: td_future, the result of an asynchronous operation.
 *
 * Every collective returns one (c10d's Work), and RPC calls will too (torch.futures.Future). A
 * future is pending until it completes exactly once, with a value (td_value, tdist/value.h) or an
 * error (a td_status code plus a message). It is refcounted and thread-safe: any number of threads
 * may wait on it, query it, or add callbacks.
 *
 * Values by operation: a collective completes with a list of its output tensors; a receive with
 * the sender's rank (an int); an RPC with the remote function's return value.
 *
 * A failure also has a type name, the Python exception class it stands for ("ValueError",
 * "TypeError", ...; td_future_error_type): RPC carries it from the callee to the caller. A future
 * failed without one (td_future_set_error, td_future_failed) is a "RuntimeError". Failures are
 * sticky: every wait on a failed future returns the same code and message.
 *
 * Callbacks never run on an I/O thread: a callback added to a pending future runs on tdist's
 * callback thread once the future completes; one added to a completed future runs at once, in the
 * caller's thread. (While no process group or agent exists there is no I/O thread, and callbacks
 * run in the thread that completes the future.) Callbacks run one at a time: a callback must not
 * block on a future that td_future_then chains, since that future completes on the same thread.
 */
#ifndef TDIST_FUTURE_H
#define TDIST_FUTURE_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/status.h>
#include <tdist/value.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_future td_future;

/* A new pending future (for code that completes futures itself: backends, agents, users). */
TD_API td_future *td_future_new(void);
/* A future already completed with value (taken; NULL means none) or with an error. */
TD_API td_future *td_future_completed(td_value *value);
TD_API td_future *td_future_failed(td_status status, const char *message);
TD_API td_future *td_future_retain(td_future *f);
TD_API void td_future_release(td_future *f);

/* Completion: exactly once. A second completion returns TD_ERR_ALREADY and changes nothing.
 * set_result takes the value (NULL means none). A status of TD_OK is taken as TD_ERR_INTERNAL. */
TD_API td_status td_future_set_result(td_future *f, td_value *value);
TD_API td_status td_future_set_error(td_future *f, td_status status, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* As set_error, with the failure's type name (copied; NULL or "" means "RuntimeError"). */
TD_API td_status td_future_set_typed_error(td_future *f, td_status status, const char *type_name, const char *fmt,
                                           ...) __attribute__((format(printf, 4, 5)));

/* Waits until the future completes or timeout_ms passes (0: no timeout). Returns TD_OK when it
 * completed with a value; the future's own error code when it failed, with td_last_error() set to
 * its message; TD_ERR_TIMEOUT when the wait timed out (the future stays pending). */
TD_API td_status td_future_wait(td_future *f, int64_t timeout_ms);
/* Waits for n futures, as torch.futures.wait_all: TD_OK once all have succeeded (then read each
 * value); as soon as any has failed, without waiting for the others, that failure (code, and its
 * message in td_last_error(); when several have failed by then, the first in index order);
 * TD_ERR_TIMEOUT when timeout_ms (0: none) passes first, the timeout covering the whole wait.
 * n == 0 returns TD_OK; a NULL future fails with TD_ERR_INVALID. */
TD_API td_status td_future_wait_all(td_future *const *fs, int n, int64_t timeout_ms);
/* A future that completes, with no value and never with an error, once all n futures have
 * completed (n == 0: at once); the caller then reads each of them, as torch.futures.collect_all's
 * list. It holds a reference to each input until that input completes (so the caller may release
 * its own). fs is borrowed. Invalid arguments
 * (n < 0, a NULL future) give a future failed with TD_ERR_INVALID. */
TD_API td_future *td_future_collect_all(td_future *const *fs, int n);

TD_API bool td_future_is_completed(const td_future *f);
/* TD_OK for a pending or successful future; the error code of a failed one. */
TD_API td_status td_future_status(const td_future *f);
/* The error message of a failed future (borrowed, valid while f lives); NULL otherwise. */
TD_API const char *td_future_error(const td_future *f);
/* The error's type name of a failed future ("RuntimeError" unless it was given one; borrowed,
 * valid while f lives); NULL when f is pending or succeeded. */
TD_API const char *td_future_error_type(const td_future *f);
/* The value of a successful future (borrowed, valid while f lives); NULL if pending, failed or none. */
TD_API td_value *td_future_value(const td_future *f);

/* Runs cb(f, arg) once f completes (see the threading note above). Callbacks added while f is
 * pending run in the order they were added (then() functions among them). */
TD_API void td_future_add_callback(td_future *f, void (*cb)(td_future *f, void *arg), void *arg);
/* A future for fn's result once f completes. fn is always called, exactly once, with the completed
 * parent (which may have failed: check td_future_status) so it can also free arg; it sets *result (a
 * new reference, or NULL for none) and returns TD_OK, or returns an error code, with the message in
 * td_last_error(), which fails the child: a "RuntimeError", unless fn fails with a type
 * (td_future_propagate_error, or td_rpc_raise in tdist/rpc.h). */
TD_API td_future *td_future_then(td_future *f, td_status (*fn)(td_future *parent, void *arg, td_value **result),
                                 void *arg);
/* Passes on failed's failure, for a then() function to return:
 *     if (td_future_status(parent) != TD_OK) return td_future_propagate_error(parent);
 * returns failed's code with td_last_error() set to its message and its type name (up to 127
 * bytes) kept beside it, so that the then() child, or an RPC function's caller, fails with the same
 * code, message and type. (fn may prefix context to the message.) Returns TD_OK when failed has
 * not failed. */
TD_API td_status td_future_propagate_error(const td_future *failed);

#ifdef __cplusplus
}
#endif
#endif
