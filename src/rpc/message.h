/* The RPC message envelope (docs/protocols.md, "RPC messages"): a fixed header followed by one
 * td_value in the value codec's wire form. Every message of the RPC layer travels this way: calls,
 * replies, errors, the agent's own control messages, and (later issues) RRef, profiling and
 * distributed-autograd messages, whose ids the header already carries.
 *
 *   call      payload (function name: string, args: tuple, kwargs: dict)
 *   reply     payload the function's result (none for None)
 *   error     payload a TD_REC_ERROR record (type name, message)
 *   control   the agent's own; today only the hello that opens a connection: no payload, the
 *             listener's nonce in id (docs/protocols.md)
 *
 * The header is little-endian and fixed-size (RPC_HEADER_BYTES). A reader trusts nothing in it: the
 * magic, version, type and flags are checked, and the payload length is bounded by the caller's
 * limit before anything is allocated. */
#ifndef TDIST_RPC_MESSAGE_H
#define TDIST_RPC_MESSAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h>

#include <tdist/status.h>
#include <tdist/tensor.h>
#include <tdist/value.h>

#define RPC_MAGIC 0x43505254u /* "TRPC" read as little-endian bytes */
#define RPC_VERSION 1
#define RPC_HEADER_BYTES 88

typedef enum rpc_msg_type {
    RPC_MSG_CALL = 1,
    RPC_MSG_REPLY = 2,
    RPC_MSG_ERROR = 3,
    RPC_MSG_CONTROL = 4,
    /* 16..31 are reserved; the RRef protocol travels as calls of internal functions (rref.c). */
    RPC_MSG_TYPE_MAX = 31,
} rpc_msg_type;

enum {
    RPC_FLAG_REPLY_WANTED = 1u << 0, /* the sender waits for a reply (a call not sent one-way) */
    RPC_FLAG_PROFILING = 1u << 1,    /* record and return profiling events (profiler.c) */
    RPC_FLAG_AUTOGRAD = 1u << 2,     /* distributed autograd: autograd_context / autograd_message are set */
    RPC_FLAG_RREF = 1u << 3,         /* a remote() call: rref_* / fork_* are set (rref.c) */
    RPC_FLAGS_KNOWN = (1u << 4) - 1,
};

typedef struct rpc_header {
    uint16_t type;       /* rpc_msg_type */
    uint16_t flags;      /* RPC_FLAG_* */
    uint32_t sender;     /* the sender's worker id */
    uint64_t id;         /* a call's id, chosen by its sender; a reply or error carries its call's */
    int64_t timeout_ms;  /* a call's timeout (0: none); the callee bounds sending its reply by it */
    int64_t rref_owner, rref_local;   /* RPC_FLAG_RREF: the RRef id (owner worker, local id) */
    int64_t fork_owner, fork_local;   /* RPC_FLAG_RREF: the caller's fork id */
    int64_t autograd_context, autograd_message; /* RPC_FLAG_AUTOGRAD: context id, sender's message id */
    uint64_t payload_len; /* bytes of payload after the header */
} rpc_header;

/* The header's wire form, into out (RPC_HEADER_BYTES). */
void rpc_header_write(const rpc_header *h, void *out);
/* Reads and checks a header from RPC_HEADER_BYTES at in: the magic, the version, a known type and
 * known flags, and payload_len <= max_payload. Fails with TD_ERR_INVALID and a message naming what
 * is wrong. */
td_status rpc_header_read(const void *in, uint64_t max_payload, rpc_header *h);

/* A message ready to send: the header, then the payload's pieces as iovecs that point into the
 * payload's tensors (no tensor data is copied). */
typedef struct rpc_outgoing rpc_outgoing;
/* Encodes payload (borrowed; NULL: none) under h (payload_len is filled in). */
td_status rpc_outgoing_make(const rpc_header *h, const td_value *payload, rpc_outgoing **out);
size_t rpc_outgoing_size(const rpc_outgoing *m);
const struct iovec *rpc_outgoing_iov(const rpc_outgoing *m, size_t *count);
void rpc_outgoing_free(rpc_outgoing *m);

/* Decodes the payload of a message whose header was h, held in bytes [0, h->payload_len) of
 * storage (retained by the decoded tensors, which are views into it). */
td_status rpc_payload_decode(const rpc_header *h, td_storage *payload, td_value **out);

/* Payload builders and readers for calls and errors. */
td_status rpc_call_payload(const char *fn, const td_value *args, const td_value *kwargs, td_value **out);
/* Splits a call's payload (borrowed pointers into it); fails with TD_ERR_INVALID on a bad shape. */
td_status rpc_call_parts(const td_value *payload, const char **fn, const td_value **args, const td_value **kwargs);
td_value *rpc_error_payload(const char *type_name, const char *message);
td_status rpc_error_parts(const td_value *payload, const char **type_name, const char **message);

#endif
