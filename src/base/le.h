/* Little-endian integers in byte buffers, for the wire formats (docs/protocols.md): written and
 * read a byte at a time, so they work at any alignment and on any host byte order. */
#ifndef TDIST_BASE_LE_H
#define TDIST_BASE_LE_H

#include <stdint.h>

/* Writes the low n bytes (1..8) of v at p, least significant first. */
static inline void le_put(uint8_t *p, uint64_t v, int n)
{
    for (int i = 0; i < n; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Reads n bytes (1..8) at p, least significant first. */
static inline uint64_t le_get(const uint8_t *p, int n)
{
    uint64_t v = 0;
    for (int i = 0; i < n; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

#endif
