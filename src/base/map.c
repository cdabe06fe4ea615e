/* Open-addressing hash map with byte-string keys (map.h), used for store contents, registries and
 * caches. Linear probing over a power-of-two table; removals leave tombstones that a rehash drops. */
#include "base/map.h"

#include <stdlib.h>
#include <string.h>

#include "base/alloc.h"

static char tomb_marker;
#define TD_MAP_TOMB (&tomb_marker)

uint64_t map_hash_bytes(const void *data, size_t len, uint64_t seed)
{
    /* FNV-1a over 64-bit words, then a final avalanche (splitmix64). Fast and well spread for keys
     * of a few to a few hundred bytes, which is what the map sees. */
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull ^ seed;
    while (len >= 8) {
        uint64_t w;
        memcpy(&w, p, 8);
        h = (h ^ w) * 0x100000001b3ull;
        p += 8;
        len -= 8;
    }
    while (len--)
        h = (h ^ *p++) * 0x100000001b3ull;
    h ^= h >> 30;
    h *= 0xbf58476d1ce4e5b9ull;
    h ^= h >> 27;
    h *= 0x94d049bb133111ebull;
    h ^= h >> 31;
    return h;
}

static td_map_entry *find(const td_map *m, const void *key, size_t key_len, uint64_t h)
{
    if (!m->cap)
        return NULL;
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        td_map_entry *e = &m->slots[i];
        if (!e->key)
            return NULL;
        if (e->key != TD_MAP_TOMB && e->hash == h && e->key_len == key_len && memcmp(e->key, key, key_len) == 0)
            return e;
    }
}

static void rehash(td_map *m, size_t cap)
{
    td_map_entry *old = m->slots;
    size_t old_cap = m->cap;
    m->slots = alloc_zeroed(cap, sizeof *m->slots);
    m->cap = cap;
    m->used = m->len;
    for (size_t i = 0; i < old_cap; i++) {
        td_map_entry *e = &old[i];
        if (!e->key || e->key == TD_MAP_TOMB)
            continue;
        size_t j = e->hash & (cap - 1);
        while (m->slots[j].key)
            j = (j + 1) & (cap - 1);
        m->slots[j] = *e;
    }
    free(old);
}

void *map_get(const td_map *m, const void *key, size_t key_len)
{
    td_map_entry *e = find(m, key, key_len, map_hash_bytes(key, key_len, 0));
    return e ? e->value : NULL;
}

void *map_put(td_map *m, const void *key, size_t key_len, void *value)
{
    uint64_t h = map_hash_bytes(key, key_len, 0);
    td_map_entry *e = find(m, key, key_len, h);
    if (e) {
        void *prev = e->value;
        e->value = value;
        return prev;
    }
    if ((m->used + 1) * 4 > m->cap * 3)
        rehash(m, m->cap ? (m->len * 2 + 2 > m->cap ? m->cap * 2 : m->cap) : 16);
    size_t mask = m->cap - 1;
    size_t i = h & mask;
    while (m->slots[i].key && m->slots[i].key != TD_MAP_TOMB)
        i = (i + 1) & mask;
    if (!m->slots[i].key)
        m->used++;
    char *k = alloc_or_die(key_len + 1);
    memcpy(k, key, key_len);
    k[key_len] = '\0';
    m->slots[i] = (td_map_entry){k, key_len, h, value};
    m->len++;
    return NULL;
}

void *map_remove(td_map *m, const void *key, size_t key_len)
{
    td_map_entry *e = find(m, key, key_len, map_hash_bytes(key, key_len, 0));
    if (!e)
        return NULL;
    void *value = e->value;
    free(e->key);
    e->key = TD_MAP_TOMB;
    e->value = NULL;
    m->len--;
    return value;
}

td_map_entry *map_next(const td_map *m, size_t *iter)
{
    for (; *iter < m->cap; (*iter)++) {
        td_map_entry *e = &m->slots[*iter];
        if (e->key && e->key != TD_MAP_TOMB) {
            (*iter)++;
            return e;
        }
    }
    return NULL;
}

void map_free(td_map *m, void (*free_value)(void *))
{
    for (size_t i = 0; i < m->cap; i++) {
        td_map_entry *e = &m->slots[i];
        if (!e->key || e->key == TD_MAP_TOMB)
            continue;
        if (free_value)
            free_value(e->value);
        free(e->key);
    }
    free(m->slots);
    *m = (td_map)TD_MAP_INIT;
}
