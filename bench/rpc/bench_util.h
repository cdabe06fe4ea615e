/* What rpc_bench and rref_bench share: the clock, a median, failing loudly, and the FileStore their
 * forked workers meet through (in a temporary folder removed at exit, whatever the outcome). */
#ifndef TDIST_BENCH_RPC_UTIL_H
#define TDIST_BENCH_RPC_UTIL_H

#include <stddef.h>

double bench_now_s(void);
/* Sorts v (n values) and returns their median. */
double bench_median(double *v, size_t n);
/* Prints "<prog>: <what>: td_last_error()" and exits 1. */
void bench_die(const char *prog, const char *what) __attribute__((noreturn));
/* A file:// URL of a new FileStore under /tmp/<prog>.XXXXXX, removed at exit; exits on failure. */
const char *bench_store_url(const char *prog);

#endif
