/* Internal: shared storages (share.c) as the message layer sees them: a storage turns into a
 * handle for sending, and a received handle turns back into a storage, the same td_storage when
 * this process already holds it (the per-process identity cache). */
#ifndef TDIST_MP_SHARE_H
#define TDIST_MP_SHARE_H

#include <stddef.h>
#include <stdint.h>

#include <tdist/mp.h>

#include "tensor/segment.h"

typedef enum td_shm_kind {
    TD_SHM_EMPTY = 0, /* a 0-byte storage: nothing to map, rebuilt as a new empty storage */
    TD_SHM_FD = 1,    /* file_descriptor strategy: the fd travels with the message */
    TD_SHM_NAMED = 2, /* file_system strategy: the name travels */
} td_shm_kind;

typedef struct td_shm_handle {
    td_shm_kind kind;
    size_t nbytes;
    int fd;            /* TD_SHM_FD: the storage's own fd, borrowed (keep the storage alive) */
    uint64_t dev, ino; /* TD_SHM_FD: identity of the segment */
    char name[TD_SEGMENT_NAME_MAX]; /* TD_SHM_NAMED */
} td_shm_handle;

/* For sending s: moves it into shared memory first when it is not there (current strategy).
 * TD_SHM_NAMED takes a reference for the message in flight: the receiver takes it over, and
 * shm_abandon undoes it when the message is never sent. */
td_status shm_export(td_storage *s, td_shm_handle *h);
void shm_abandon(const char *name);

/* Receiving. import_fd always takes fd (closes it when it is not kept). import_named takes over
 * the in-flight reference (dropping it when this process already holds the segment). */
td_status shm_import_fd(int fd, size_t nbytes, td_storage **out);
td_status shm_import_named(const char *name, size_t nbytes, td_storage **out);

/* Live entries in the identity cache (tests). */
size_t shm_cache_size(void);
/* The segment behind a shared storage (tests: refcount header inspection); NULL otherwise. */
const td_segment *shm_segment_of(const td_storage *s);

#endif
