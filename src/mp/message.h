/* Internal: mp messages, the form in which queues and spawned processes' arguments carry
 * td_values between processes (docs/protocols.md, "mp queue").
 *
 * A message is one SOCK_SEQPACKET datagram: a 24-byte header, then a td_value codec message (the
 * envelope) holding the tables of shared storages, tensors and mp objects, and the value itself
 * with each tensor and object replaced by a record naming its table entry. File descriptors (of
 * file_descriptor storages, queues and events) ride along as SCM_RIGHTS. A body larger than the
 * inline limit travels in an unlinked shared-memory segment whose fd is the last one attached.
 *
 * A tensor travels with its requires_grad flag and kind (plain or Parameter), never its .grad, hooks
 * or graph; a non-leaf that requires grad fails the encoding with PyTorch's "Cowardly refusing ...".
 *
 * Encoding is synchronous: it shares every storage that is not yet shared, takes the in-flight
 * references of file_system ones, and retains what the message points at until it is sent or
 * freed (freeing an unsent message gives the in-flight references back). Decoding trusts nothing:
 * every count, index, fd and name is checked before use, every received fd is either kept by a
 * storage or object or closed, and on failure the in-flight references of the storages it did not
 * reach are given back. */
#ifndef TDIST_MP_MESSAGE_H
#define TDIST_MP_MESSAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/mp.h>

#include "base/buf.h"
#include "base/vec.h"
#include "tensor/segment.h"

/* One kind of mp object a message can carry (below). */
typedef struct mp_object_class mp_object_class;

#define TD_MP_MSG_MAGIC 0x514d4454u /* "TDMQ" */
#define TD_MP_MSG_VERSION 1
#define TD_MP_MSG_HEADER 24
#define TD_MP_MSG_INLINE_MAX (64u * 1024u) /* bytes per datagram; larger bodies go in a segment */
#define TD_MP_MSG_MAX_FDS 253              /* the kernel's SCM_MAX_FD */
#define TD_MP_MSG_MAX_SPILL ((uint64_t)1 << 34)
#define TD_MP_MSG_FLAG_SPILLED 1u

/* A tensor entry's optional sixth field (docs/protocols.md): the autograd metadata that travels.
 * A non-leaf that requires grad is refused by the encoder; .grad, hooks and graph never travel. */
#define MP_TENSOR_REQUIRES_GRAD 1
#define MP_TENSOR_PARAMETER 2

typedef struct td_mp_msg {
    td_buf data;                  /* header + inline body */
    TD_VEC(int) fds;              /* attached fds: borrowed from what `keep` holds, or spill.fd */
    TD_VEC(td_storage *) storages; /* retained until the message is freed */
    TD_VEC(td_value *) objects;    /* object values, retained likewise */
    TD_VEC(char *) inflight;       /* file_system names with an in-flight reference */
    TD_VEC(td_storage *) device_storages; /* device storages with a counter reference for the message */
    td_segment spill;
    bool sent;
} td_mp_msg;

td_status mp_msg_encode(const td_value *v, td_mp_msg *m);
/* Sends m as one datagram. nonblock: TD_ERR_TIMEOUT when the socket is full right now; otherwise
 * waits for room until deadline_ns. TD_ERR_PEER_LOST when nobody can read the socket any more. */
td_status mp_msg_send(int sock, td_mp_msg *m, bool nonblock, int64_t deadline_ns);
void mp_msg_free(td_mp_msg *m);

typedef struct td_mp_rmsg {
    char *data;
    size_t len;
    int fds[TD_MP_MSG_MAX_FDS];
    int nfds;
} td_mp_rmsg;

/* Receives one datagram (waiting until deadline_ns). TD_ERR_TIMEOUT when none came. */
td_status mp_msg_recv(int sock, int64_t deadline_ns, td_mp_rmsg *r);
/* Rebuilds the value; consumes r (its fds are kept or closed, its buffer freed) in every case. */
td_status mp_msg_decode(td_mp_rmsg *r, const mp_object_class *const *classes, td_value **out);
/* Decodes a message held in memory with its fds (fuzzing, and the spilled-body path). */
td_status mp_msg_decode_bytes(const void *data, size_t len, int *fds, int nfds, const mp_object_class *const *classes,
                                 td_value **out);
void mp_rmsg_free(td_mp_rmsg *r);

/* ---- mp objects inside td_values ---------------------------------------------------------- */

typedef enum td_mp_object_kind { TD_MP_OBJ_QUEUE = 1, TD_MP_OBJ_EVENT = 2 } td_mp_object_kind;

/* What messages need to know of one kind of mp object (a queue, an event), so that this file
 * depends on none of them: the kinds hand their class to mp_object_value, and a decoder gets the
 * classes it may rebuild from its caller (mp_object_classes, queue.c). On the wire an object is
 * (kind, [param,] fd index x nfds). */
struct mp_object_class {
    td_mp_object_kind kind;
    int nfds;                 /* fds the object travels as (at most MP_OBJECT_MAX_FDS) */
    bool has_param;           /* an int64 travels beside the fds */
    const char *entry_form;   /* the message when an entry does not have that form */
    void *(*retain)(void *obj);
    void (*release)(void *obj);
    /* Borrowed fds into fds[nfds]; returns the param. */
    int64_t (*wire)(void *obj, int *fds);
    /* Takes the fds in every case. */
    td_status (*from_wire)(int64_t param, const int *fds, void **out);
};
#define MP_OBJECT_MAX_FDS 3

/* A TD_REC_MP_OBJECT value holding obj (retained through its class). */
td_value *mp_object_value(const mp_object_class *cls, void *obj);
/* The object in v when v is such a value of that kind (borrowed), else NULL. */
void *mp_object_of(const td_value *v, td_mp_object_kind kind);

/* event.c's class; and every class, NULL-terminated, in queue.c: what a received message may
 * rebuild (mp_msg_decode's usual argument). */
extern const mp_object_class mp_event_class;
extern const mp_object_class *const mp_object_classes[];

/* Makes close and release drop this process's unsent backlog instead of waiting for readers (a
 * pool being terminated: nobody will read its tasks). */
void mp_queue_cancel_join(td_mp_queue *q);

#endif
