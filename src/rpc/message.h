/* The RPC message envelope (docs/protocols.md, "RPC messages"): a fixed header followed by one
 * td_value in the value codec's wire form. Every message of the RPC layer travels this way: calls,
 * replies, errors, the agent's own control messages, and (later issues) RRef, profiling and
 * distributed-autograd messages, whose ids the header already carries.
 *
 *   call      payload (function name: string, args: tuple, kwargs: dict)
 *   reply     payload the function's result (none for None)
 *   error     payload a TD_REC_ERROR record (type name, message)
 *   control   the agent's own; today only the hello that opens a connection (the listener's
 *             nonce in id; the payload rpc_hello: the connector's nonce and its proof of the job's
 *             secret) and the listener's answer to it (rpc_answer: admitted or why not, and the
 *             listener's own proof) (docs/protocols.md, "Connections and the hello")
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
#define RPC_VERSION 5 /* 2: the hello carries proofs of the job's secret and is answered; 3: single-copy pieces;
                        * 4: the shared segment holds lanes (docs/protocols.md, "Lanes on one host");
                        * 5: and a shared copy per side (docs/protocols.md, "Single copy") */
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
    RPC_FLAG_PIECES = 1u << 4,       /* same-host single copy: a piece table follows the header */
    RPC_FLAGS_KNOWN = (1u << 5) - 1,
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

/* ---- the hello and its answer (control messages with raw payloads, not td_values) ---- */

#define RPC_HELLO_PAYLOAD 72  /* u32 auth flags, u32 features, nonce[32], proof[32] */
#define RPC_ANSWER_PAYLOAD 40 /* u32 status, u32 auth flags, proof[32] */
#define RPC_AUTH_NONCE_BYTES 32
#define RPC_AUTH_PROOF_BYTES 32

enum {
    RPC_AUTH_HAS_SECRET = 1u << 0, /* the sender holds a secret (TDIST_AUTH_TOKEN) */
};

enum {
    /* The hello came with a shared segment's fd (a same-host socket): the two workers' single-copy
     * state (rpc_cma in agent_impl.h). */
    RPC_HELLO_CMA = 1u << 0,
    RPC_HELLO_FEATURES_KNOWN = (1u << 1) - 1,
};

/* What the listener answers: the connection is admitted, or why it is refused (then closed). A
 * refusal for any other reason (not this world's nonce, a worker id already connected) gets no
 * answer, only the close. */
typedef enum rpc_answer_status {
    RPC_ANSWER_ADMITTED = 0,
    RPC_ANSWER_NEEDS_SECRET = 1,   /* the listener has a secret; the hello proves none */
    RPC_ANSWER_WRONG_SECRET = 2,   /* the hello's proof does not check under the listener's secret */
    RPC_ANSWER_HAS_NO_SECRET = 3,  /* the listener has no secret; the hello says it has one */
    RPC_ANSWER_STATUS_MAX = 3,
} rpc_answer_status;

typedef struct rpc_hello {
    uint32_t auth_flags;                    /* RPC_AUTH_* */
    uint32_t features;                      /* RPC_HELLO_* */
    uint8_t nonce[RPC_AUTH_NONCE_BYTES];    /* the connector's, fresh for this connection */
    uint8_t proof[RPC_AUTH_PROOF_BYTES];    /* zeros without a secret */
} rpc_hello;

typedef struct rpc_answer {
    uint32_t status;                        /* rpc_answer_status */
    uint32_t auth_flags;                    /* RPC_AUTH_*, the listener's */
    uint8_t proof[RPC_AUTH_PROOF_BYTES];    /* admitted with a secret: the listener's proof; else zeros */
} rpc_answer;

void rpc_hello_write(const rpc_hello *h, uint8_t out[RPC_HELLO_PAYLOAD]);
/* Fails with TD_ERR_INVALID on unknown flags or features. */
td_status rpc_hello_read(const uint8_t in[RPC_HELLO_PAYLOAD], rpc_hello *h);
void rpc_answer_write(const rpc_answer *a, uint8_t out[RPC_ANSWER_PAYLOAD]);
/* Fails with TD_ERR_INVALID on an unknown status or flags. */
td_status rpc_answer_read(const uint8_t in[RPC_ANSWER_PAYLOAD], rpc_answer *a);

/* ---- single-copy pieces (RPC_FLAG_PIECES) ----
 * Between workers of one host that can read each other's memory, the large parts of a payload
 * (tensor data) stay in the sender's memory: the header is followed by a table of pieces (where in
 * the payload, how long, at which address of the sender), then the payload's other bytes, and the
 * receiver reads the pieces with process_vm_readv straight into the payload's storage. */

#define RPC_PIECES_MAX 8
#define RPC_PIECES_HEAD 8   /* u32 count, u32 reserved */
#define RPC_PIECE_BYTES 24  /* u64 offset in the payload, u64 length, u64 address in the sender */
#define RPC_PIECES_WIRE_MAX (RPC_PIECES_HEAD + RPC_PIECES_MAX * RPC_PIECE_BYTES)

typedef struct rpc_piece {
    uint64_t offset, len, addr;
} rpc_piece;

typedef struct rpc_pieces {
    uint32_t count;
    rpc_piece piece[RPC_PIECES_MAX]; /* by offset, none overlapping */
    uint64_t bytes;                  /* their lengths summed */
} rpc_pieces;

/* The table's wire form into out (RPC_PIECES_HEAD + count * RPC_PIECE_BYTES bytes). */
size_t rpc_pieces_write(const rpc_pieces *p, uint8_t *out);
/* The count in a table's first RPC_PIECES_HEAD bytes: 1..RPC_PIECES_MAX, reserved 0. */
td_status rpc_pieces_count(const uint8_t *head, uint32_t *count);
/* Reads and checks a table of count entries (after its head) for a payload of payload_len bytes:
 * each piece non-empty, inside the payload, after the one before. TD_ERR_INVALID names the fault. */
td_status rpc_pieces_read(const uint8_t *entries, uint32_t count, uint64_t payload_len, rpc_pieces *p);
/* Where the payload byte that is the inline_off-th byte not in a piece lies, and how many such
 * bytes follow it contiguously. */
uint64_t rpc_pieces_place(const rpc_pieces *p, uint64_t payload_len, uint64_t inline_off, uint64_t *room);

/* A message ready to send: the header, then the payload's pieces as iovecs that point into the
 * payload's tensors (no tensor data is copied). */
typedef struct rpc_outgoing rpc_outgoing;
/* Encodes payload (borrowed; NULL: none) under h (payload_len is filled in). */
td_status rpc_outgoing_make(const rpc_header *h, const td_value *payload, rpc_outgoing **out);
size_t rpc_outgoing_size(const rpc_outgoing *m);
const struct iovec *rpc_outgoing_iov(const rpc_outgoing *m, size_t *count);
void rpc_outgoing_free(rpc_outgoing *m);
/* The single-copy form of m: up to RPC_PIECES_MAX of its payload's iovecs of at least min bytes
 * become pieces (p->count 0: none does; send m as it is). Otherwise hdr gets m's header with
 * RPC_FLAG_PIECES, table the piece table, and iov (room for rpc_outgoing_iov's count + 1) what
 * to write: hdr, table, the other iovecs; *count their number. */
void rpc_outgoing_pieces(const rpc_outgoing *m, size_t min, rpc_pieces *p, uint8_t hdr[RPC_HEADER_BYTES],
                         uint8_t table[RPC_PIECES_WIRE_MAX], struct iovec *iov, size_t *count);

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
