/* Helpers shared by the mp tests: checks usable inside entry points (which run in child
 * processes, where a failure must travel back as the entry's error rather than end a harness
 * rank), small tensor helpers, and the leak-checker wrapper every mp test uses. */
#ifndef TDIST_TESTS_MP_UTIL_H
#define TDIST_TESTS_MP_UTIL_H

#include <tdist/mp.h>
#include <tdist/testing.h>

#include "base/error.h"

/* Inside an entry point: E_CHECK / E_OK fail the entry (its message reaches td_mp_join). */
#include "../support/entry_check.h"

/* Every element of t equals v (any dtype, any layout). */
bool mpt_all_equal(const td_tensor *t, double v);
/* A contiguous tensor with random float32 values. */
td_tensor *mpt_randn(int64_t rows, int64_t cols);
/* The number of /dev/shm entries named "tdist.<pid>.". */
int mpt_shm_entries(pid_t pid);
/* Waits up to ms for mpt_shm_entries(pid) to be want; returns the last count. */
int mpt_wait_shm_entries(pid_t pid, int want, int ms);
/* The "file_system" / "file_descriptor" parameter of a case, applied. */
void mpt_set_strategy(td_mp_strategy s);

/* Leak checking around a test body: begin, track children, end (30 s for file_system). */
td_mp_leak_checker *mpt_lc_begin(void);
void mpt_lc_end(td_mp_leak_checker *lc);

#endif
