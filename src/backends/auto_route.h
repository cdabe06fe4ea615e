/* Internal to the auto backend: two transports that route onto others (transport/transport.h).
 *
 * A view shows a subset of a transport's ranks as a group of its own (rank i of the view is rank
 * map[i] of the parent), so that the collective algorithms can run among the hosts' leaders over
 * the tcp transport. The map can change between operations (a rooted collective puts its root in
 * place of its host's leader).
 *
 * A composite gives every rank of the group one transport: peers on this host through the shm
 * transport (numbered by local index), the others through the tcp transport (numbered as the
 * group), so that the flat algorithms use shared memory wherever they can. It cannot take
 * any-source receives (they would have to be matched across two transports); the auto backend
 * posts point-to-point operations on the tcp transport instead.
 *
 * Neither owns its parents: destroying one frees only itself; aborting one aborts its parents. */
#ifndef TDIST_BACKENDS_AUTO_ROUTE_H
#define TDIST_BACKENDS_AUTO_ROUTE_H

#include "transport/transport.h"

/* A view of n ranks of parent; this rank is view rank `rank`. map (n entries) is copied. */
td_transport *auto_view_transport_new(td_transport *parent, int rank, int n, const int *map);
/* Points view rank i at parent rank map[i] from now on (no operation may be in flight). */
void auto_view_transport_remap(td_transport *view, const int *map);

/* local_index[g] (size entries, copied): g's index in the shm transport local, or -1 for a peer
 * reached through remote. local may be NULL when no peer shares this host. */
td_transport *auto_composite_transport_new(td_transport *local, td_transport *remote, int rank, int size,
                                         const int *local_index);

#endif
