/* Internal: the file_system strategy's named segments and the tdist-shm-manager daemon.
 *
 * A named segment starts with a 64-byte header holding a lock-free atomic refcount: one reference
 * per process that maps it, plus one per message in flight that names it. Whoever brings it to 0
 * removes the name. The daemon (tools/tdist-shm-manager) is the backstop for crashes: each process
 * that holds named segments keeps one connection to it and tells it which names it holds; when a
 * connection drops while it still holds names, the daemon drops that process's references for it
 * (removing names that reach 0). When its last client has gone and it stays idle for
 * TDIST_SHM_MANAGER_IDLE_MS (2000), it removes every name it still knows and exits.
 *
 * The protocol (docs/protocols.md, "shm manager"): SOCK_SEQPACKET on the abstract Unix socket
 * "\0tdist-shm-manager.v1.<uid>" (TDIST_SHM_MANAGER_SOCKET overrides the part after the NUL);
 * every datagram is a td_shmm_msg. The client sends HELLO and waits for WELCOME, then sends HOLD,
 * DROP and FORGET without waiting for answers. */
#ifndef TDIST_MP_SHM_MANAGER_H
#define TDIST_MP_SHM_MANAGER_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <tdist/status.h>

#include "base/map.h"
#include "tensor/segment.h"

/* ---- named segment header ----------------------------------------------------------------- */

#define TD_SHM_HEADER_SIZE 64
#define TD_SHM_HEADER_MAGIC 0x48534454u /* "TDSH" */

#if ATOMIC_INT_LOCK_FREE != 2
#error "the file_system strategy needs a lock-free atomic int in shared memory"
#endif

typedef struct td_shm_header {
    _Atomic int32_t refcount; /* at offset 0, as PyTorch's RefcountedMapAllocator */
    uint32_t magic;
    uint64_t nbytes; /* user bytes after the header */
    char reserved[TD_SHM_HEADER_SIZE - 16];
} td_shm_header;
_Static_assert(sizeof(td_shm_header) == TD_SHM_HEADER_SIZE, "header size");

/* Drops one reference of the named segment mapped at h; true when it was the last one (the caller
 * then removes the name). */
static inline bool shm_header_decref(td_shm_header *h)
{
    return atomic_fetch_sub_explicit(&h->refcount, 1, memory_order_acq_rel) <= 1;
}
static inline void shm_header_incref(td_shm_header *h)
{
    atomic_fetch_add_explicit(&h->refcount, 1, memory_order_relaxed);
}

/* ---- protocol ----------------------------------------------------------------------------- */

#define TD_SHMM_VERSION 1
#define TD_SHMM_SOCKET_ENV "TDIST_SHM_MANAGER_SOCKET"

enum {
    TD_SHMM_HELLO = 1,   /* client -> manager: pid; answered by WELCOME */
    TD_SHMM_WELCOME = 2, /* manager -> client: pid is the manager's */
    TD_SHMM_HOLD = 3,    /* client holds one reference to name (sent before creating, after opening) */
    TD_SHMM_DROP = 4,    /* client is about to drop its reference to name (sent before the decrement) */
    TD_SHMM_FORGET = 5,  /* name was removed (its refcount reached 0) */
};

typedef struct td_shmm_msg {
    uint8_t op;
    uint8_t version; /* TD_SHMM_VERSION */
    uint16_t name_len;
    uint32_t pid;
    char name[TD_SEGMENT_NAME_MAX]; /* name_len bytes, no NUL needed */
} td_shmm_msg;

/* The abstract socket name (without the leading NUL) into out. */
void shmm_socket_name(char *out, size_t size);

/* ---- client (one connection per process, open while it holds named segments) ---------------- */

/* Takes a use of the connection, connecting (and starting the daemon) on the first. Fails with a
 * message saying how to point tdist at the daemon (TDIST_SHM_MANAGER). */
td_status shmm_acquire(void);
/* Drops a use; the last one closes the connection. */
void shmm_release(void);
/* Best-effort, non-waiting notice (the caller holds a use). */
void shmm_notify(int op, const char *name);
/* The daemon's pid from its WELCOME, 0 when not connected (tests). */
pid_t shmm_daemon_pid(void);

/* ---- daemon (tools/tdist-shm-manager; shm_manager_server.c) --------------------------------
 * The bookkeeping, without the sockets: the daemon owns the connections and calls these with
 * each datagram it receives (fuzz/fuzz_shm_manager.c calls them with its own). */

typedef struct shmm_client {
    int fd;         /* the daemon's connection (not used here) */
    pid_t pid;      /* from SO_PEERCRED at accept: the kernel's, never the HELLO's */
    td_map holds;   /* name -> (uintptr_t) references held */
    unsigned refused; /* messages refused (logged one by one up to 8) */
} shmm_client;

typedef struct shmm_server {
    td_map known;                  /* every name some client held and that may still exist */
    void (*log)(const char *line); /* one line per event; NULL: silent */
} shmm_server;

typedef enum shmm_verdict {
    SHMM_KEEP = 0,    /* applied, or refused with a log line: the connection stays */
    SHMM_WELCOME = 1, /* a HELLO: the daemon answers WELCOME */
    SHMM_CLOSE = -1,  /* malformed: the daemon drops the connection */
} shmm_verdict;

/* Checks and applies one datagram of n bytes from client c. */
shmm_verdict shmm_server_message(shmm_server *s, shmm_client *c, const void *data, size_t n);
/* Client c went away: drops the references it still held (removing names that reach 0) and
 * empties its table. Does not close c->fd. */
void shmm_server_client_gone(shmm_server *s, shmm_client *c);
/* Removes every name still known and empties the table (the daemon's exit). */
void shmm_server_sweep(shmm_server *s);

#endif
