/* Helpers shared by the launcher tests (tests/mpi): a free port every rank agrees on, for env://
 * rendezvous whose MASTER_PORT the ranks must know before they meet. */
#ifndef TDIST_TESTS_MPI_LAUNCH_UTIL_H
#define TDIST_TESTS_MPI_LAUNCH_UTIL_H

#include <tdist/testing.h>

/* Rank 0 binds 127.0.0.1:0, notes the port and closes the socket, and publishes the port in
 * <tmpdir>/<name> (written whole, by rename); the others wait for the file. Every rank returns the
 * port. (Another process could take the port in between; the tests run on a test machine.) */
int launch_test_port(td_test_ctx *ctx, const char *name);
/* Removes the published file (rank 0, once every rank has read it). */
void launch_test_port_done(td_test_ctx *ctx, const char *name);

#endif
