/* The tcp transport's wire format (docs/protocols.md, "tcp transport"): the connection handshake
 * (hello and reply), the 16-byte frame header, and control frames (goodbye, abort). Pure encoders
 * and parsers, shared by the set-up code (tcp_connect.c) and the progress engine (tcp.c), and
 * fuzzed by fuzz/fuzz_tcp_hello.c and fuzz/fuzz_tcp_frames.c. Every parser checks each length
 * against the bytes it has and against the limits below before anything is sized from it. */
#ifndef TDIST_TRANSPORT_TCP_PROTO_H
#define TDIST_TRANSPORT_TCP_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/collective.h>
#include <tdist/status.h>

#include "net/auth.h"

#define TD_TCP_MAGIC 0x50544454u /* bytes "TDTP" */
#define TD_TCP_VERSION 3 /* 2: a collective's frames carry its descriptor; 3: proofs replace the token */
#define TD_TCP_HELLO_FIXED 32 /* magic .. group_len */
#define TD_TCP_MAX_GROUP_NAME 1024
/* After the group name: the connector's fresh nonce, then its proof over every byte before it. */
#define TD_TCP_HELLO_TAIL (AUTH_NONCE_LEN + AUTH_MAC_LEN)
#define TD_TCP_HELLO_MAX (TD_TCP_HELLO_FIXED + TD_TCP_MAX_GROUP_NAME + TD_TCP_HELLO_TAIL)
#define TD_TCP_REPLY_FIXED 16
#define TD_TCP_MAX_REPLY_MSG 512
/* After the message: the listener's proof (zeros in a refusal). */
#define TD_TCP_REPLY_MAX (TD_TCP_REPLY_FIXED + TD_TCP_MAX_REPLY_MSG + AUTH_MAC_LEN)

#define TD_TCP_HDR_SIZE 16
#define TD_TCP_DESC_SIZE 24 /* a collective's descriptor: u64 what, count, seq */
#define TD_TCP_CTRL_MAX 1024   /* control frame payloads */
#define TD_TCP_CTRL_MSG_MAX 512
#define TD_TCP_CTRL_FRAME_MAX (TD_TCP_HDR_SIZE + 7 + TD_TCP_CTRL_MSG_MAX)

enum { TD_TCP_REPLY_OK = 0, TD_TCP_REPLY_REFUSED = 1 };
enum { TD_TCP_CTRL_BYE = 1, TD_TCP_CTRL_ABORT = 2, TD_TCP_CTRL_RTS = 3, TD_TCP_CTRL_FIN = 4 };
/* Hello and answer flags. */
#define TD_TCP_FLAG_CMA 1u /* hello: the connecting side would read and be read with process_vm_readv;
                              answer: agreed (a same-host socket, both sides willing): probe next */
#define TD_TCP_FLAG_AUTH 2u /* the sender holds the job secret (hello: its proof is real; answer: an
                               accept's proof is real) */

#define TD_TCP_CMA_PROBE_SIZE 24 /* u64 magic, u64 address, u64 value */
#define TD_TCP_CMA_PROBE_MAGIC UINT64_C(0x45424f5250414d43) /* "CMAPROBE" */
#define TD_TCP_RTS_MAX_IOV 4
#define TD_TCP_RTS_FIXED 66
#define TD_TCP_RTS_MAX (TD_TCP_RTS_FIXED + 16 * TD_TCP_RTS_MAX_IOV)

/* Parse results: the message is complete, more bytes are needed, or it is malformed. */
typedef enum td_tcp_parse { TD_TCP_PARSE_OK = 0, TD_TCP_PARSE_MORE = 1, TD_TCP_PARSE_BAD = -1 } td_tcp_parse;

typedef struct td_tcp_hello {
    uint16_t version;
    uint16_t flags;
    uint32_t from, to, world;
    uint64_t nonce;
    const char *group; /* not NUL-terminated; points into the parsed bytes */
    uint32_t group_len;
    uint8_t conn_nonce[AUTH_NONCE_LEN]; /* the connector's, fresh for this hello */
    uint8_t proof[AUTH_MAC_LEN];        /* over the hello's bytes before it */
} td_tcp_hello;

/* Writes the hello into b (TD_TCP_HELLO_FIXED + group_len + TD_TCP_HELLO_TAIL bytes); returns its
 * size. The proof is its last AUTH_MAC_LEN bytes and covers all bytes before them. */
size_t tcp_hello_encode(uint8_t *b, const td_tcp_hello *h);
/* Parses the first n bytes of a hello. MORE: *need is how many bytes are needed in all (as far as
 * known yet). BAD: a wrong magic or a length over the limits (*why names it). A hello of another
 * version is complete once its fixed part is in (the rest may be laid out otherwise: the caller
 * refuses it), with only version, flags, from, to, world and nonce set. */
td_tcp_parse tcp_hello_parse(const uint8_t *b, size_t n, td_tcp_hello *h, size_t *need, const char **why);

typedef struct td_tcp_reply {
    uint16_t version;
    uint8_t status, flags;
    uint32_t rank;
    const char *msg;
    uint32_t msg_len;
    uint8_t proof[AUTH_MAC_LEN]; /* an accept's: the listener holds the secret */
} td_tcp_reply;

/* msg may be NULL; it is cut to TD_TCP_MAX_REPLY_MSG. proof NULL: zeros. b holds TD_TCP_REPLY_MAX
 * bytes. */
size_t tcp_reply_encode(uint8_t *b, int rank, int status, unsigned flags, const char *msg,
                        const uint8_t *proof);
/* Parses an answer as tcp_hello_parse a hello; one of another version is complete without the
 * proof (which it may not have), and its proof reads as zeros. */
td_tcp_parse tcp_reply_parse(const uint8_t *b, size_t n, td_tcp_reply *r, size_t *need, const char **why);

/* Frame header: u64 tag, u64 payload length (little-endian); under a collective's tag
 * (transport_tag_is_coll) followed by the collective's descriptor (TD_TCP_DESC_SIZE bytes), which
 * the length does not count. */
void tcp_header_encode(uint8_t *b, uint64_t tag, uint64_t len);
void tcp_header_decode(const uint8_t *b, uint64_t *tag, uint64_t *len);
/* The bytes of a frame's header under tag: TD_TCP_HDR_SIZE, and the descriptor's for a collective. */
size_t tcp_header_size(uint64_t tag);
/* A descriptor (NULL: zeros) into / from TD_TCP_DESC_SIZE bytes. */
void tcp_desc_encode(uint8_t *b, const td_coll_desc *d);
void tcp_desc_decode(const uint8_t *b, td_coll_desc *d);

typedef struct td_tcp_control {
    int type;
    td_status status;  /* ABORT; FIN: TD_OK or why the message could not be read */
    const char *msg;   /* ABORT: not NUL-terminated */
    size_t msg_len;
    /* RTS: a message of `total` bytes under `tag` waits in the sender's memory, in iovcnt pieces;
     * FIN: the receiver is done with it. Both name it by the sender's cookie. */
    uint64_t tag, cookie, total;
    uint64_t guard_addr, guard_value; /* RTS: a word of the sender's that holds guard_value while
                                         the pieces may be read (see tcp.c) */
    td_coll_desc desc; /* RTS: the descriptor of the collective the message belongs to */
    int iovcnt;
    uint64_t addr[TD_TCP_RTS_MAX_IOV], len[TD_TCP_RTS_MAX_IOV];
} td_tcp_control;

/* A whole control frame (header with TD_TAG_RESERVED, then payload) into f
 * (TD_TCP_CTRL_FRAME_MAX bytes); the message is cut to TD_TCP_CTRL_MSG_MAX. Returns its size. */
size_t tcp_control_encode(uint8_t *f, int type, td_status status, const char *msg);
/* Parses a control payload of n bytes (n was checked against TD_TCP_CTRL_MAX from the header). An
 * RTS's pieces must add up to its total, which is at most max_message. */
bool tcp_control_parse(const uint8_t *p, size_t n, uint64_t max_message, td_tcp_control *c);
/* The payload (no header) of an RTS or a FIN into p (TD_TCP_RTS_MAX bytes); returns its size. */
size_t tcp_rts_encode(uint8_t *p, uint64_t tag, uint64_t cookie, uint64_t guard_addr, uint64_t guard_value,
                      const td_coll_desc *desc, const uint64_t *addr, const uint64_t *len, int iovcnt);
size_t tcp_fin_encode(uint8_t *p, uint64_t cookie, td_status status);

/* The single-copy probe (tcp_connect.c): TD_TCP_CMA_PROBE_SIZE bytes naming a word of the
 * sender's (its address) and the value it holds. False when the magic is wrong. */
bool tcp_probe_parse(const uint8_t *m, uint64_t *addr, uint64_t *value);

/* ---- a rank's entry in the store -----------------------------------------------------------
 * What tcp_connect.c publishes and reads back: "<host:port> <nonce, hex> [<host id> [<UNIX socket
 * name, or ->]]" (docs/protocols.md). Fuzzed by fuzz/fuzz_rdv_address.c. */

typedef struct td_tcp_entry {
    char *host; /* malloc'd (tcp_entry_free) */
    int port;
    uint64_t nonce;
    char host_id[160];  /* "" when absent */
    char unix_name[64]; /* "-" when absent */
} td_tcp_entry;

/* Decodes rank grank's entry (NUL-terminated text): TD_ERR_INVALID, with a message naming the
 * rank, when it is malformed or its address has no port; nothing to free then. */
td_status tcp_entry_parse(const char *text, int grank, td_tcp_entry *e);
void tcp_entry_free(td_tcp_entry *e);

#endif
