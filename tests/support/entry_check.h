/* Checks inside functions that run in another process or return a td_status (mp entry points,
 * spawned scripts): a failed check returns an error naming the file, line and expression, which
 * reaches the parent through td_mp_join instead of ending the test process. Used by tests/mp and
 * tests/device. */
#ifndef TDIST_TESTS_ENTRY_CHECK_H
#define TDIST_TESTS_ENTRY_CHECK_H

#include <tdist/status.h>

#include "base/error.h"

#define E_CHECK(cond)                                                                                 \
    do {                                                                                              \
        if (!(cond))                                                                                  \
            return error_fmt(TD_ERR_INTERNAL, "%s:%d: check failed: %s", __FILE__, __LINE__, #cond);   \
    } while (0)
#define E_OK(expr)                                                                                    \
    do {                                                                                              \
        td_status e_s_ = (expr);                                                                      \
        if (e_s_ != TD_OK)                                                                            \
            return error_prefix(e_s_, "%s:%d: %s", __FILE__, __LINE__, #expr);                     \
    } while (0)

#endif
