/* Internal to the transports' set-up (tcp_connect.c, shm_connect.c): the steps every transport
 * takes to connect a group through its store. Each rank counts its generation on the store (so a
 * group re-created under the same name never reads the last one's keys), publishes where it
 * listens under "<prefix><generation>/addr/<rank>", and reads its peers' entries; lower ranks
 * connect to higher ones (one connection per pair) and send a hello, the higher rank answers it.
 * rdv_handshake runs the rest in one poll loop bounded by the group's timeout, so a stray or
 * silent connection cannot stall the set-up: it accepts connections, hands the bytes of each to
 * the transport (which checks hellos and answers), and fails at the deadline naming the ranks
 * still missing. The transport keeps its own formats and checks; how a hello and its answer prove
 * the job secret (net/auth.h) is common to both and lives here once. */
#ifndef TDIST_TRANSPORT_PEER_RENDEZVOUS_H
#define TDIST_TRANSPORT_PEER_RENDEZVOUS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "net/auth.h"
#include "transport/transport.h"

#define TD_RDV_MAX_PENDING 64 /* unidentified accepted connections kept at once */

/* A connection in the handshake, with the bytes read from it so far. */
typedef struct td_rdv_conn {
    int fd;
    int passed_fd; /* an fd that came with its bytes (SCM_RIGHTS), else -1 */
    uint8_t *buf;
    size_t got;
} td_rdv_conn;

typedef struct td_rdv td_rdv;

struct td_rdv {
    const td_transport_setup *o;
    const char *what; /* "tcp transport": for messages */
    const char *prefix;
    int rank, size;
    int64_t deadline;
    int64_t generation;
    uint64_t nonce;    /* this rank's, random: a peer's hello proves it read this rank's entry */
    int *fds;          /* per rank: the connection once its handshake is done, else -1 */
    td_rdv_conn *out;  /* per higher rank: connected, awaiting its answer */
    td_rdv_conn pend[TD_RDV_MAX_PENDING]; /* accepted, not yet identified */
    int npend;
    size_t out_bytes, pend_bytes; /* buffer sizes */
    char last_refusal[640];
    auth_key auth;     /* the job secret's key (auth.on false: none) */
    /* The transport's steps. on_answer: bytes from higher rank r's connection (a failure ends
     * the set-up). on_pending: bytes on pending connection i; it consumes the entry (rdv_drop
     * or rdv_take) or leaves it for more bytes. */
    void *arg;
    td_status (*on_answer)(td_rdv *v, int r);
    void (*on_pending)(td_rdv *v, int i);
};

/* Sets up the state (nonce, deadline, arrays) for o. what: "tcp transport"; default_prefix: the
 * key prefix when o has none; out_bytes, pend_bytes: the buffer of each answer and hello; auth:
 * the job secret's key (copied; the caller made it with auth_key_init). */
void rdv_init(td_rdv *v, const td_transport_setup *o, const char *what, const char *default_prefix,
                 size_t out_bytes, size_t pend_bytes, const auth_key *auth);
/* Closes what is still open (fds too unless keep_fds) and frees the state (the key is wiped). */
void rdv_free(td_rdv *v, bool keep_fds);

static inline int rdv_grank(const td_rdv *v, int r) { return v->o->global_ranks ? v->o->global_ranks[r] : r; }

/* The store key of rank r's entry, "<prefix><generation>/addr/<r>". */
void rdv_entry_key(const td_rdv *v, int r, char *out, size_t size);
/* Counts this rank's generation in the store. */
td_status rdv_generation(td_rdv *v);
/* Publishes this rank's entry. addr_name names it in errors ("tcp address"). */
td_status rdv_publish(td_rdv *v, const char *value, const char *addr_name);
/* Waits (until the deadline) for rank r's entry and reads it into text (NUL-terminated; an entry
 * of size bytes or more is malformed). */
td_status rdv_read(td_rdv *v, int r, const char *addr_name, char *text, size_t size);

/* Connection fd to higher rank r now awaits its answer. */
void rdv_await(td_rdv *v, int r, int fd);
/* Pending connection i was refused or is a stray: closed and dropped. */
void rdv_drop(td_rdv *v, int i);
/* Pending connection i is rank r's: it becomes fds[r]; its passed fd (or -1) is returned. */
int rdv_take(td_rdv *v, int i, int r);
/* Higher rank r answered: out[r]'s connection becomes fds[r]; its passed fd (or -1) is returned. */
int rdv_answered(td_rdv *v, int r);

/* ---- proofs of the job secret ------------------------------------------------------------------
 * Both transports authenticate a connection the same way (docs/protocols.md, "tcp transport" and
 * "shm transport"): the connecting rank's hello carries a fresh nonce and a proof over the hello's
 * bytes, which hold the nonce the listener published (its challenge: fresh per group, and a rank
 * is accepted once); the listener's accept carries a proof over the connector's fresh nonce. Each
 * message also says whether its sender holds a secret at all (claims), so that a secret on one
 * side only is reported as such rather than as a wrong secret. */

/* The proof under label over parts into mac; zeros when this rank holds no secret. */
void rdv_auth_prove(const td_rdv *v, const char *label, const auth_part *parts, int n, uint8_t mac[AUTH_MAC_LEN]);
/* Listener: whether a connecting rank's hello passes (claims: it says it holds a secret; mac: its
 * proof under label over parts). False with the refusal's text in msg. */
bool rdv_auth_check_hello(const td_rdv *v, bool claims, const char *label, const auth_part *parts, int n,
                          const uint8_t mac[AUTH_MAC_LEN], char *msg, size_t msg_size);
/* Connector: checks higher rank r's answer, TD_ERR_INVALID with the message when it fails. mac
 * NULL: a refusal, which carries no proof: it fails here only when this rank holds a secret and r
 * none (TD_OK otherwise, and the caller reports the refusal's own text). */
td_status rdv_auth_check_answer(const td_rdv *v, int r, bool claims, const char *label, const auth_part *parts, int n,
                                const uint8_t *mac);

/* The poll loop: until every peer is connected (fds), or the deadline (TD_ERR_TIMEOUT naming the
 * missing ranks and the last refusal), or on_answer fails. Accepts on the listening sockets. */
td_status rdv_handshake(td_rdv *v, const int *listen_fds, int nlisten);

#endif
