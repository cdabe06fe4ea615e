/* Helpers of the shm tests beyond the shared test support (tests/support/transport_util.h): an
 * shm transport of all the case's ranks, checked to be one, with nothing left in /dev/shm. */
#ifndef TDIST_TESTS_SHM_UTIL_H
#define TDIST_TESTS_SHM_UTIL_H

#include <stdint.h>

#include <tdist/testing.h>

#include "../support/transport_util.h"
#include "transport/shm.h"

tu_world shm_test_open(td_test_ctx *ctx, int64_t timeout_ms);

#endif
