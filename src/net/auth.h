/* Internal: authentication of connections by a shared job secret (docs/protocols.md,
 * "Authentication").
 *
 * Every listener tdist opens (the TCPStore server, the tcp transport's rendezvous sockets, the RPC
 * agent's) admits a connection only from a process that holds the job's secret, TDIST_AUTH_TOKEN
 * (tdrun sets a random one for each job). The secret never travels: each side proves it holds it
 * with an HMAC-SHA256 (OpenSSL's libcrypto) over a label naming the protocol step and the nonces
 * of both sides, one of them fresh for this connection, so a recorded proof is worth nothing on
 * another connection. Labels keep a proof for one step from being replayed as another's. */
#ifndef TDIST_NET_AUTH_H
#define TDIST_NET_AUTH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <tdist/status.h>

#define AUTH_NONCE_LEN 32
#define AUTH_MAC_LEN 32
#define AUTH_MAX_SECRET 4096

typedef struct auth_key {
    bool on; /* false: no secret, connections are not authenticated */
    uint8_t key[32];
} auth_key;

/* The key for secret: NULL takes $TDIST_AUTH_TOKEN, "" means none. TD_ERR_INVALID names a secret
 * longer than AUTH_MAX_SECRET bytes. */
td_status auth_key_init(const char *secret, auth_key *out);

/* Fills out with random bytes (the kernel's generator). */
void auth_nonce(uint8_t out[AUTH_NONCE_LEN]);

/* One piece of what a proof covers. */
typedef struct auth_part {
    const void *data;
    size_t len;
} auth_part;

/* The proof HMAC-SHA256(key, label, parts) into mac; each part's length is covered, so parts cannot
 * be shifted into each other. */
void auth_prove(const auth_key *k, const char *label, const auth_part *parts, int n, uint8_t mac[AUTH_MAC_LEN]);
/* Whether mac is that proof (compared in constant time). */
bool auth_check(const auth_key *k, const char *label, const auth_part *parts, int n, const uint8_t mac[AUTH_MAC_LEN]);

#endif
