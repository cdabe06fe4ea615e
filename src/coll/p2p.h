/* Internal to the backends that run over transports (tcp, shm, auto): point-to-point operations
 * (SEND, RECV) posted on a transport, completed through the transport's callback on whichever
 * thread makes progress, from a free list of operations that only grows while warming up. */
#ifndef TDIST_COLL_P2P_H
#define TDIST_COLL_P2P_H

#include <pthread.h>

#include <tdist/backend.h>

#include "transport/transport.h"

typedef struct td_p2p_entry td_p2p_entry;

typedef struct td_p2p_pool {
    pthread_mutex_t mu;
    td_p2p_entry *free;
    td_p2p_entry *all;
} td_p2p_pool;

void p2p_pool_init(td_p2p_pool *p);
/* Frees every operation; all must have completed. */
void p2p_pool_free(td_p2p_pool *p);
/* Posts c (SEND or RECV) on t; td_work_done runs when the transport completes it. A failure to
 * post returns the error and completes nothing. */
td_status p2p_submit(td_p2p_pool *p, td_transport *t, const td_coll *c, td_work *work);

#endif
