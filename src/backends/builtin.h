/* Internal: the backends built into libtdist, for the registry in src/pg/registry.c.
 *
 * Each built-in backend defines one `const td_backend_ops` under its name. The registry refers to
 * each of them strongly: with the static library a weak reference would not pull the backend's
 * object file into the program. Adding a built-in backend: define its ops in
 * src/backends/<name>.c, declare them below, and add them to the table in registry.c. */
#ifndef TDIST_BACKENDS_BUILTIN_H
#define TDIST_BACKENDS_BUILTIN_H

#include <tdist/backend.h>

#include "tdist_config.h"

extern const td_backend_ops backend_threaded_ops; /* threaded.c */
extern const td_backend_ops backend_tcp_ops;      /* tcp.c */
extern const td_backend_ops backend_shm_ops;      /* shm.c */
extern const td_backend_ops backend_auto_ops;     /* auto.c: the default */
#if TDIST_HAVE_MPI
extern const td_backend_ops backend_mpi_ops;      /* mpi/backend.c, built when CMake found an MPI */
#endif

#endif
