/* Internal to the transports' wire formats (tcp_proto.c, shm_proto.c, tcp_connect.c): fixed-width
 * little-endian integers read from and written to byte buffers whatever the host's byte order,
 * and the length of a message that a format cuts to its limit. */
#ifndef TDIST_TRANSPORT_WIRE_H
#define TDIST_TRANSPORT_WIRE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline void wire_put16(uint8_t *p, uint16_t v)
{
    p[0] = (uint8_t)v;
    p[1] = (uint8_t)(v >> 8);
}

static inline void wire_put32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline void wire_put64(uint8_t *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

static inline uint16_t wire_get16(const uint8_t *p) { return (uint16_t)(p[0] | (p[1] << 8)); }

static inline uint32_t wire_get32(const uint8_t *p)
{
    return (uint32_t)p[0] | ((uint32_t)p[1] << 8) | ((uint32_t)p[2] << 16) | ((uint32_t)p[3] << 24);
}

static inline uint64_t wire_get64(const uint8_t *p)
{
    return (uint64_t)wire_get32(p) | ((uint64_t)wire_get32(p + 4) << 32);
}

/* The bytes of msg (NULL: none) that a format carries, at most max. */
static inline size_t wire_msg_len(const char *msg, size_t max)
{
    size_t n = msg ? strlen(msg) : 0;
    return n < max ? n : max;
}

#endif
