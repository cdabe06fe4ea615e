/* Proofs of the job secret for connection handshakes (net/auth.h).
 *
 * The secret is turned once into a 32-byte key (HMAC-SHA256 of a fixed domain string under the
 * secret), so secrets of any length up to the limit become a key of one size; proofs are HMAC-SHA256 from libcrypto, not
 * hand-written crypto, over "label\0" then each part as u32 length + bytes. Nonces come from
 * getrandom(2). Comparisons use CRYPTO_memcmp so that a forged proof learns nothing from timing. */
#include "net/auth.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "base/buf.h"
#include "base/env.h"
#include "base/error.h"
#include "base/log.h"

#define AUTH_DOMAIN "tdist auth key v1"

/* Only an allocation failure inside libcrypto or a broken kernel gets here: no proof can be made. */
static void auth_fatal(const char *what)
{
    TD_LOG_ERROR("authentication: %s", what);
    abort();
}

td_status auth_key_init(const char *secret, auth_key *out)
{
    memset(out, 0, sizeof *out);
    if (!secret)
        secret = env_get_str("TDIST_AUTH_TOKEN", NULL);
    if (!secret || !*secret)
        return TD_OK;
    size_t n = strlen(secret);
    if (n > AUTH_MAX_SECRET)
        return error_fmt(TD_ERR_INVALID, "TDIST_AUTH_TOKEN is longer than %d bytes", AUTH_MAX_SECRET);
    unsigned int len = sizeof out->key;
    if (!HMAC(EVP_sha256(), secret, (int)n, (const unsigned char *)AUTH_DOMAIN, sizeof AUTH_DOMAIN, out->key, &len))
        auth_fatal("HMAC-SHA256 failed");
    out->on = true;
    return TD_OK;
}

void auth_nonce(uint8_t out[AUTH_NONCE_LEN])
{
    size_t got = 0;
    while (got < AUTH_NONCE_LEN) {
        ssize_t n = getrandom(out + got, AUTH_NONCE_LEN - got, 0);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            auth_fatal("getrandom failed");
        got += (size_t)n;
    }
}

void auth_prove(const auth_key *k, const char *label, const auth_part *parts, int n, uint8_t mac[AUTH_MAC_LEN])
{
    td_buf msg = {0};
    buf_append(&msg, label, strlen(label) + 1);
    for (int i = 0; i < n; i++) {
        buf_put_u32(&msg, (uint32_t)parts[i].len);
        buf_append(&msg, parts[i].data, parts[i].len);
    }
    unsigned int len = AUTH_MAC_LEN;
    if (!HMAC(EVP_sha256(), k->key, sizeof k->key, (const unsigned char *)msg.data, msg.len, mac, &len) ||
        len != AUTH_MAC_LEN)
        auth_fatal("HMAC-SHA256 failed");
    buf_free(&msg);
}

bool auth_check(const auth_key *k, const char *label, const auth_part *parts, int n, const uint8_t mac[AUTH_MAC_LEN])
{
    uint8_t want[AUTH_MAC_LEN];
    auth_prove(k, label, parts, n, want);
    return CRYPTO_memcmp(want, mac, AUTH_MAC_LEN) == 0;
}
