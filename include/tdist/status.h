/* tdist/status.h: status codes and the per-thread error message.
 *
 * Every fallible tdist call returns a td_status: TD_OK (0) on success, a negative code on failure.
 * After a failure, td_last_error() returns a message for the calling thread that names what failed
 * and what to do about it (PyTorch's words where PyTorch has them). The message stays until the
 * thread's next failure; successful calls do not clear it. Asynchronous failures are carried by
 * their future instead (td_future_error, tdist/future.h).
 */
#ifndef TDIST_STATUS_H
#define TDIST_STATUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the symbols that libtdist.so exports. */
#if defined(__GNUC__)
#define TD_API __attribute__((visibility("default")))
#else
#define TD_API
#endif

typedef enum td_status {
    TD_OK = 0,
    TD_ERR_INVALID = -1,      /* bad argument or malformed input */
    TD_ERR_TIMEOUT = -2,      /* a deadline passed */
    TD_ERR_PEER_LOST = -3,    /* a peer process died or disconnected */
    TD_ERR_REMOTE = -4,       /* the remote side ran the request and it failed */
    TD_ERR_NOT_INIT = -5,     /* used before initialization */
    TD_ERR_ALREADY = -6,      /* already initialized / already exists / already done */
    TD_ERR_IO = -7,           /* an OS call failed (the message names it and errno) */
    TD_ERR_CLOSED = -8,       /* the object was closed or shut down */
    TD_ERR_UNSUPPORTED = -9,  /* valid, but not supported by this backend, dtype or build */
    TD_ERR_NOMEM = -10,       /* an allocation failed */
    TD_ERR_NOT_MEMBER = -11,  /* this rank is not a member of the group */
    TD_ERR_NOT_FOUND = -12,   /* no such key, name or entry */
    TD_ERR_INTERNAL = -13,    /* a broken invariant inside tdist: please report it */
} td_status;

/* The calling thread's message for its last failure; "" when it has had none. Never NULL. The
 * pointer is valid until the thread's next tdist call. */
TD_API const char *td_last_error(void);

/* A static name for a status code, e.g. "TD_ERR_TIMEOUT". */
TD_API const char *td_status_str(td_status status);

/* Records why this process fails (printf-style) in torchrun's error file, the path in
 * TORCHELASTIC_ERROR_FILE, which tdrun and torchrun print as a failed worker's traceback. Call it
 * before exiting on a failure; it replaces an earlier record and does nothing without the
 * variable. The library itself records a process group's first failure there (a peer lost, a
 * timeout, an abort) without replacing a record that exists. */
TD_API td_status td_record_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Version of the library this program runs against, e.g. "0.1.0". */
TD_API const char *td_version(void);

#ifdef __cplusplus
}
#endif
#endif
