/* The thread-local error message behind td_last_error().
 *
 * Each thread owns one fixed buffer (no allocation, so reporting an out-of-memory error cannot fail
 * and nothing needs freeing at thread exit). Functions that fail format their message here and
 * return the status code; callers up the stack may prefix context to it. */
#include "base/error.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "tdist_config.h"

static __thread char tl_message[TD_ERROR_MAX];
static __thread char tl_type[128]; /* "" for an untyped failure */

static void mark_truncated(int written)
{
    if (written >= TD_ERROR_MAX)
        memcpy(tl_message + TD_ERROR_MAX - 4, "...", 4);
}

td_status error_fmt(td_status code, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    mark_truncated(vsnprintf(tl_message, sizeof tl_message, fmt, ap));
    va_end(ap);
    tl_type[0] = '\0';
    return code;
}

td_status error_errno(td_status code, const char *fmt, ...)
{
    int err = errno;
    char what[TD_ERROR_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    char reason[128];
    const char *r = strerror_r(err, reason, sizeof reason);
    mark_truncated(snprintf(tl_message, sizeof tl_message, "%s: %s", what, r));
    tl_type[0] = '\0';
    return code;
}

td_status error_prefix(td_status code, const char *fmt, ...)
{
    char prefix[TD_ERROR_MAX / 2];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    if (n < 0)
        return code;
    size_t plen = strlen(prefix);
    size_t mlen = strnlen(tl_message, sizeof tl_message - 1);
    if (plen + 2 + mlen >= sizeof tl_message)
        mlen = sizeof tl_message - 1 - plen - 2;
    memmove(tl_message + plen + 2, tl_message, mlen);
    memcpy(tl_message, prefix, plen);
    memcpy(tl_message + plen, ": ", 2);
    tl_message[plen + 2 + mlen] = '\0';
    return code;
}

td_status error_set(td_status code, const char *message) { return error_set_typed(code, NULL, message); }

td_status error_set_typed(td_status code, const char *type_name, const char *message)
{
    if (message != tl_message) /* error_set(code, td_last_error()) keeps the message */
        mark_truncated(snprintf(tl_message, sizeof tl_message, "%s", message ? message : ""));
    if (type_name != tl_type)
        snprintf(tl_type, sizeof tl_type, "%s", type_name ? type_name : "");
    return code;
}

const char *error_type(void) { return tl_type[0] ? tl_type : NULL; }

void error_clear(void)
{
    tl_message[0] = '\0';
    tl_type[0] = '\0';
}

const char *td_last_error(void) { return tl_message; }

const char *td_status_str(td_status status)
{
    switch (status) {
    case TD_OK: return "TD_OK";
    case TD_ERR_INVALID: return "TD_ERR_INVALID";
    case TD_ERR_TIMEOUT: return "TD_ERR_TIMEOUT";
    case TD_ERR_PEER_LOST: return "TD_ERR_PEER_LOST";
    case TD_ERR_REMOTE: return "TD_ERR_REMOTE";
    case TD_ERR_NOT_INIT: return "TD_ERR_NOT_INIT";
    case TD_ERR_ALREADY: return "TD_ERR_ALREADY";
    case TD_ERR_IO: return "TD_ERR_IO";
    case TD_ERR_CLOSED: return "TD_ERR_CLOSED";
    case TD_ERR_UNSUPPORTED: return "TD_ERR_UNSUPPORTED";
    case TD_ERR_NOMEM: return "TD_ERR_NOMEM";
    case TD_ERR_NOT_MEMBER: return "TD_ERR_NOT_MEMBER";
    case TD_ERR_NOT_FOUND: return "TD_ERR_NOT_FOUND";
    case TD_ERR_INTERNAL: return "TD_ERR_INTERNAL";
    }
    return "TD_ERR_UNKNOWN";
}

const char *td_version(void) { return TDIST_VERSION_STRING; }
