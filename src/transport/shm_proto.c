/* Encoders and parsers of the shm transport's formats (shm_proto.h; docs/protocols.md, "shm
 * transport"). All integers are little-endian on the socket; ring headers and the segment header
 * live in memory shared by processes of one host and use its byte order. */
#include "transport/shm_proto.h"

#include <stdio.h>
#include <string.h>

#include "base/error.h"
#include "base/host.h"

#include "transport/wire.h"

/* Hello: u32 magic, u8 version, u8 0, u8 type, u8 flags, u32 from, to, world, pid, u64 nonce,
 * seg_size, ring_bytes, small_bytes, slot_bytes, group_hash, auth nonce[32], proof[32], u16
 * msg_len, msg, zeros to the end. */
void shm_hello_encode(uint8_t *b, const td_shm_hello *h)
{
    memset(b, 0, TD_SHM_HELLO_SIZE);
    wire_put32(b, TD_SHM_MAGIC);
    b[4] = TD_SHM_VERSION;
    b[6] = (uint8_t)h->type;
    b[7] = (uint8_t)h->flags;
    wire_put32(b + 8, h->from);
    wire_put32(b + 12, h->to);
    wire_put32(b + 16, h->world);
    wire_put32(b + 20, h->pid);
    wire_put64(b + 24, h->nonce);
    wire_put64(b + 32, h->seg_size);
    wire_put64(b + 40, h->layout.ring_bytes);
    wire_put64(b + 48, h->layout.small_bytes);
    wire_put64(b + 56, h->layout.slot_bytes);
    wire_put64(b + 64, h->group_hash);
    memcpy(b + TD_SHM_HELLO_NONCE_AT, h->auth_nonce, AUTH_NONCE_LEN);
    memcpy(b + TD_SHM_HELLO_PROOF_AT, h->proof, AUTH_MAC_LEN);
    size_t ml = h->msg ? h->msg_len : 0;
    if (ml > TD_SHM_HELLO_MSG_MAX)
        ml = TD_SHM_HELLO_MSG_MAX;
    wire_put16(b + TD_SHM_HELLO_MSG_AT - 2, (uint16_t)ml);
    if (ml)
        memcpy(b + TD_SHM_HELLO_MSG_AT, h->msg, ml);
}

_Static_assert(TD_SHM_HELLO_PROOF_AT == TD_SHM_HELLO_NONCE_AT + AUTH_NONCE_LEN, "the proof follows the nonce");
_Static_assert(TD_SHM_HELLO_MSG_AT == TD_SHM_HELLO_PROOF_AT + AUTH_MAC_LEN + 2, "then the message's length");
_Static_assert(TD_SHM_HELLO_MSG_AT + TD_SHM_HELLO_MSG_MAX <= TD_SHM_HELLO_SIZE, "a message fits the hello");

bool shm_hello_prefix_ok(const uint8_t *b, size_t n, const char **why)
{
    if (n >= 4 && wire_get32(b) != TD_SHM_MAGIC) {
        *why = "not a tdist shm transport hello (bad magic)";
        return false;
    }
    if (n >= 6 && (b[4] != TD_SHM_VERSION || b[5] != 0)) {
        *why = "a shm transport hello of another protocol version";
        return false;
    }
    return true;
}

bool shm_hello_parse(const uint8_t *b, size_t n, td_shm_hello *h, const char **why)
{
    memset(h, 0, sizeof *h);
    if (n != TD_SHM_HELLO_SIZE) {
        *why = "a hello of the wrong size";
        return false;
    }
    if (!shm_hello_prefix_ok(b, n, why))
        return false;
    h->type = b[6];
    if (h->type != TD_SHM_HELLO && h->type != TD_SHM_REFUSE) {
        *why = "a shm transport hello of an unknown type";
        return false;
    }
    h->flags = b[7];
    if (h->flags & ~TD_SHM_FLAG_AUTH) {
        *why = "a shm transport hello with unknown flags";
        return false;
    }
    h->from = wire_get32(b + 8);
    h->to = wire_get32(b + 12);
    h->world = wire_get32(b + 16);
    h->pid = wire_get32(b + 20);
    h->nonce = wire_get64(b + 24);
    h->seg_size = wire_get64(b + 32);
    h->layout.ring_bytes = wire_get64(b + 40);
    h->layout.small_bytes = wire_get64(b + 48);
    h->layout.slot_bytes = wire_get64(b + 56);
    h->group_hash = wire_get64(b + 64);
    memcpy(h->auth_nonce, b + TD_SHM_HELLO_NONCE_AT, AUTH_NONCE_LEN);
    memcpy(h->proof, b + TD_SHM_HELLO_PROOF_AT, AUTH_MAC_LEN);
    size_t ml = wire_get16(b + TD_SHM_HELLO_MSG_AT - 2);
    if (ml > TD_SHM_HELLO_MSG_MAX) {
        *why = "a shm transport hello with an over-long message";
        return false;
    }
    h->msg = ml ? (const char *)b + TD_SHM_HELLO_MSG_AT : NULL;
    h->msg_len = ml;
    return true;
}

/* Control: u8 type, u8 0, u16 msg_len, i32 status, msg. */
size_t shm_control_encode(uint8_t *f, int type, td_status status, const char *msg)
{
    size_t ml = wire_msg_len(msg, TD_SHM_CTRL_MSG_MAX);
    f[0] = (uint8_t)type;
    f[1] = 0;
    wire_put16(f + 2, (uint16_t)ml);
    wire_put32(f + 4, (uint32_t)(int32_t)status);
    if (ml)
        memcpy(f + TD_SHM_CTRL_HDR, msg, ml);
    return TD_SHM_CTRL_HDR + ml;
}

td_shm_parse shm_control_parse(const uint8_t *b, size_t n, td_shm_control *c, size_t *used)
{
    memset(c, 0, sizeof *c);
    *used = 0;
    if (n < TD_SHM_CTRL_HDR)
        return TD_SHM_PARSE_MORE;
    c->type = b[0];
    if ((c->type != TD_SHM_CTRL_BYE && c->type != TD_SHM_CTRL_ABORT) || b[1] != 0)
        return TD_SHM_PARSE_BAD;
    size_t ml = wire_get16(b + 2);
    if (ml > TD_SHM_CTRL_MSG_MAX || (c->type == TD_SHM_CTRL_BYE && ml))
        return TD_SHM_PARSE_BAD;
    int32_t st = (int32_t)wire_get32(b + 4);
    /* An abort carries a failure: a status outside the codes tdist defines is malformed. */
    if (c->type == TD_SHM_CTRL_ABORT && (st >= 0 || st < TD_ERR_INTERNAL))
        return TD_SHM_PARSE_BAD;
    if (c->type == TD_SHM_CTRL_BYE && st != 0)
        return TD_SHM_PARSE_BAD;
    if (n < TD_SHM_CTRL_HDR + ml)
        return TD_SHM_PARSE_MORE;
    c->status = (td_status)st;
    c->msg = ml ? (const char *)b + TD_SHM_CTRL_HDR : NULL;
    c->msg_len = ml;
    *used = TD_SHM_CTRL_HDR + ml;
    return TD_SHM_PARSE_OK;
}

void shm_msg_encode(uint8_t *b, uint64_t tag, uint64_t len)
{
    memcpy(b, &tag, 8);
    memcpy(b + 8, &len, 8);
}

bool shm_msg_parse(const uint8_t *b, uint64_t *tag, uint64_t *len)
{
    memcpy(tag, b, 8);
    memcpy(len, b + 8, 8);
    return *len <= TD_SHM_MAX_MESSAGE;
}

bool shm_seg_header_check(const td_shm_seg_header *h, uint32_t rank, uint32_t world, uint64_t size,
                             const td_shm_layout *layout, const char **why)
{
    if (h->magic != TD_SHM_MAGIC || h->version != TD_SHM_VERSION) {
        *why = "its segment does not start with a tdist shm header of this version";
        return false;
    }
    if (h->rank != rank || h->world != world) {
        *why = "its segment names another rank or world size";
        return false;
    }
    if (h->size != size || h->layout.ring_bytes != layout->ring_bytes ||
        h->layout.small_bytes != layout->small_bytes || h->layout.slot_bytes != layout->slot_bytes) {
        *why = "its segment's size or layout differs from the one its hello announced";
        return false;
    }
    return true;
}

uint64_t shm_name_hash(const char *name)
{
    uint64_t h = UINT64_C(1469598103934665603);
    for (const char *p = name ? name : ""; *p; p++)
        h = (h ^ (unsigned char)*p) * UINT64_C(1099511628211);
    return h;
}

_Static_assert(TD_SHM_ENTRY_HOST_ID_MAX == TD_HOST_ID_MAX, "an entry holds any host id");

td_status shm_entry_parse(const char *text, int grank, td_shm_entry *e)
{
    unsigned long long nonce = 0;
    if (sscanf(text, "%191s %95s %llx %d", e->host_id, e->sock_name, &nonce, &e->pid) != 4)
        return error_fmt(TD_ERR_INVALID, "rank %d's shm transport address in the store is malformed", grank);
    e->nonce = nonce;
    return TD_OK;
}
