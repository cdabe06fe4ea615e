/* Internal error reporting: set the thread's message and return the code in one expression.
 *
 *   if (n < 0) return error_fmt(TD_ERR_INVALID, "size must be >= 0, got %lld", (long long)n);
 *   if (fd < 0) return error_errno(TD_ERR_IO, "open(%s)", path);   // appends ": <strerror>"
 *
 * error_prefix() prepends context to the current message when a lower layer's error is passed
 * up ("connecting to 10.0.0.1:29500: Connection refused"). */
#ifndef TDIST_BASE_ERROR_H
#define TDIST_BASE_ERROR_H

#include <tdist/status.h>

#define TD_ERROR_MAX 4096 /* longer messages are truncated with "..." */

td_status error_fmt(td_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* As error_fmt, with ": " and strerror(errno) appended; errno is read before anything else runs. */
td_status error_errno(td_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Prepends "<context>: " to the thread's current message and returns code. */
td_status error_prefix(td_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Sets the message verbatim (e.g. one carried by a future or received from a peer). */
td_status error_set(td_status code, const char *message);
void error_clear(void);
/* The thread's failure may carry a Python error type name ("ValueError"), for RPC, which sends it
 * to the caller (td_rpc_raise, typed futures). error_set_typed sets message and type; error_fmt,
 * error_errno, error_set and error_clear drop the type (a new failure is untyped), error_prefix
 * keeps it. error_type is NULL when the current failure has no type; a type name is cut to 127
 * bytes. */
td_status error_set_typed(td_status code, const char *type_name, const char *message);
const char *error_type(void);

/* Propagate a failure: TD_TRY(call) returns its status from the enclosing function when non-zero. */
#define TD_TRY(expr)                 \
    do {                             \
        td_status td_try_s_ = (expr); \
        if (td_try_s_ != TD_OK)      \
            return td_try_s_;        \
    } while (0)

#endif
