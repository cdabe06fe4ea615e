/* Internal TCPStore hooks for in-tree programs (tools/tdist-store) that are not part of the public
 * Store interface. */
#ifndef TDIST_STORE_TCP_STORE_H
#define TDIST_STORE_TCP_STORE_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/store.h>

#include "store/tcp_server.h"

/* The statistics of the server a master handle runs; false for a non-master handle. */
bool tcp_store_server_stats(td_store *store, td_store_server_stats *stats);

/* One step of c10d's waitForWorkers on a connected TCPStore handle: reads the "init/" count into
 * *joined and sets *done when it reached world_size. Once timeout_ms (> 0) has passed since
 * start_ns it fails with TD_ERR_TIMEOUT and c10d's message, "Timed out after S seconds waiting
 * for clients. n/N clients joined." The caller sleeps between steps (c10d polls every 10 ms). */
td_status tcp_store_workers_step(td_store *store, int world_size, int64_t start_ns, int64_t timeout_ms,
                                    int64_t *joined, bool *done);

#endif
