/* The shm transport's formats (docs/protocols.md, "shm transport"): the hello that two ranks of
 * one host exchange over their UNIX-domain socket together with their segments' fds, the control
 * frames that travel on that socket afterwards (goodbye, abort), the header of a message in a
 * ring, and the header every rank writes at the start of its segment. Pure encoders and parsers,
 * shared by the set-up code (shm_connect.c) and the engine (shm.c), fuzzed by
 * fuzz/fuzz_shm_proto.c. A parser checks every length against the bytes it has and the limits
 * below; nothing is sized from a peer's number before that. */
#ifndef TDIST_TRANSPORT_SHM_PROTO_H
#define TDIST_TRANSPORT_SHM_PROTO_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#include "net/auth.h"

#define TD_SHM_MAGIC 0x48534454u /* bytes "TDSH" */
#define TD_SHM_VERSION 2 /* 2: hellos carry a nonce and a proof of the job secret */
#define TD_SHM_HELLO_SIZE 320
#define TD_SHM_HELLO_NONCE_AT 72
#define TD_SHM_HELLO_PROOF_AT 104 /* the proof covers every byte before it */
#define TD_SHM_HELLO_MSG_AT 138
#define TD_SHM_HELLO_MSG_MAX 180
#define TD_SHM_CTRL_HDR 8
#define TD_SHM_CTRL_MSG_MAX 248
#define TD_SHM_CTRL_MAX (TD_SHM_CTRL_HDR + TD_SHM_CTRL_MSG_MAX)
#define TD_SHM_MSG_HDR 16
#define TD_SHM_MAX_MESSAGE (UINT64_C(1) << 40)

enum { TD_SHM_HELLO = 1, TD_SHM_REFUSE = 2 };
#define TD_SHM_FLAG_AUTH 1u /* the sender holds the job secret (a hello's proof is real) */
enum { TD_SHM_CTRL_BYE = 1, TD_SHM_CTRL_ABORT = 2 };

typedef enum td_shm_parse { TD_SHM_PARSE_OK = 0, TD_SHM_PARSE_MORE = 1, TD_SHM_PARSE_BAD = -1 } td_shm_parse;

/* The segment layout both sides must agree on (from TDIST_SHM_RING, TDIST_SHM_SLOT, ...). */
typedef struct td_shm_layout {
    uint64_t ring_bytes;  /* data bytes of each ring (a power of two) */
    uint64_t small_bytes; /* each of the two small slots */
    uint64_t slot_bytes;  /* each of the two large slots */
} td_shm_layout;

typedef struct td_shm_hello {
    int type;          /* TD_SHM_HELLO or TD_SHM_REFUSE */
    unsigned flags;    /* TD_SHM_FLAG_AUTH */
    uint32_t from, to, world;
    uint32_t pid;      /* the sender's pid as it sees itself (for messages only) */
    uint64_t nonce;    /* the nonce the receiving side published (proves the sender read the store) */
    uint64_t seg_size; /* bytes of the segment whose fd comes with the hello */
    td_shm_layout layout;
    uint64_t group_hash; /* FNV-1a of the group's name */
    uint8_t auth_nonce[AUTH_NONCE_LEN]; /* the sender's, fresh for this hello */
    uint8_t proof[AUTH_MAC_LEN];        /* over the hello's first TD_SHM_HELLO_PROOF_AT bytes (and,
                                           in an answer, the connector's auth_nonce) */
    const char *msg;   /* REFUSE: why (not NUL-terminated) */
    size_t msg_len;
} td_shm_hello;

/* Writes a hello (or refusal) of exactly TD_SHM_HELLO_SIZE bytes into b. */
void shm_hello_encode(uint8_t *b, const td_shm_hello *h);
/* Parses TD_SHM_HELLO_SIZE bytes; false with *why for a wrong magic, version, type, flags or length. */
bool shm_hello_parse(const uint8_t *b, size_t n, td_shm_hello *h, const char **why);
/* Whether the first n bytes of a hello (any number) can still start one of this version: false,
 * with *why, once its magic or version is in and wrong, so that a peer of another version is
 * told at once instead of waiting for bytes it will never send. */
bool shm_hello_prefix_ok(const uint8_t *b, size_t n, const char **why);

typedef struct td_shm_control {
    int type;
    td_status status; /* ABORT */
    const char *msg;  /* ABORT: not NUL-terminated */
    size_t msg_len;
} td_shm_control;

/* A control frame into f (TD_SHM_CTRL_MAX bytes); the message is cut. Returns its size. */
size_t shm_control_encode(uint8_t *f, int type, td_status status, const char *msg);
/* The first frame of n bytes: OK with *used its size, MORE, or BAD. */
td_shm_parse shm_control_parse(const uint8_t *b, size_t n, td_shm_control *c, size_t *used);

/* Ring message header: u64 tag, u64 payload length (little-endian in memory, as the host). */
void shm_msg_encode(uint8_t *b, uint64_t tag, uint64_t len);
/* False when the length is over TD_SHM_MAX_MESSAGE. */
bool shm_msg_parse(const uint8_t *b, uint64_t *tag, uint64_t *len);

/* The first cache line of each rank's segment, written by its owner before it shares the fd. */
typedef struct td_shm_seg_header {
    uint32_t magic;
    uint32_t version;
    uint32_t rank, world;
    uint32_t pid;
    uint32_t pad;
    uint64_t size;
    td_shm_layout layout;
} td_shm_seg_header;

/* Checks a peer's mapped header against what this rank expects; false with *why. */
bool shm_seg_header_check(const td_shm_seg_header *h, uint32_t rank, uint32_t world, uint64_t size,
                             const td_shm_layout *layout, const char **why);

uint64_t shm_name_hash(const char *name);

/* ---- a rank's entry in the store -----------------------------------------------------------
 * What shm_connect.c publishes and reads back: "<host id> <socket name> <nonce, hex> <pid>"
 * (docs/protocols.md). Fuzzed by fuzz/fuzz_rdv_address.c. */

#define TD_SHM_ENTRY_HOST_ID_MAX 192 /* TD_HOST_ID_MAX */
#define TD_SHM_ENTRY_NAME_MAX 96

typedef struct td_shm_entry {
    char host_id[TD_SHM_ENTRY_HOST_ID_MAX];
    char sock_name[TD_SHM_ENTRY_NAME_MAX];
    uint64_t nonce;
    int pid;
} td_shm_entry;

/* Decodes rank grank's entry (NUL-terminated text): TD_ERR_INVALID, with a message naming the
 * rank, when it is malformed. */
td_status shm_entry_parse(const char *text, int grank, td_shm_entry *e);

#endif
