/* Internal: what the auto backend made of a group, for tests and debugging logs. */
#ifndef TDIST_BACKENDS_AUTO_H
#define TDIST_BACKENDS_AUTO_H

#include <stdbool.h>

#include "transport/transport.h"

typedef struct td_auto_topology {
    const char *runs_as;   /* "shm" (one host), "tcp" (one rank per host) or "hierarchical" */
    int nhosts;
    int host;              /* this rank's host, hosts numbered in order of their lowest rank */
    int local_rank, local_size;
    td_transport *tcp;     /* hierarchical: the tcp transport among all ranks (else NULL) */
    td_transport *shm;     /* hierarchical: the shm transport of this host (NULL when alone) */
} td_auto_topology;

/* state: the auto backend's state of a group (td_pg's backend state). */
void auto_backend_topology(void *state, td_auto_topology *out);

#endif
