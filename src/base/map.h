/* Internal hash map from byte-string keys to pointers (insertion order is not kept).
 *
 * Keys are copied into the map; values are borrowed pointers that the owner frees (map_free
 * takes an optional destructor for them). Not thread-safe: the owner locks. */
#ifndef TDIST_BASE_MAP_H
#define TDIST_BASE_MAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct td_map_entry {
    char *key; /* NUL-terminated copy; keys may also contain NUL bytes, len is authoritative */
    size_t key_len;
    uint64_t hash;
    void *value;
} td_map_entry;

typedef struct td_map {
    td_map_entry *slots; /* open addressing; key == NULL marks empty, TD_MAP_TOMB a removed slot */
    size_t cap;          /* a power of two */
    size_t len;
    size_t used;         /* live + tombstones */
} td_map;

#define TD_MAP_INIT {NULL, 0, 0, 0}

uint64_t map_hash_bytes(const void *data, size_t len, uint64_t seed);

void *map_get(const td_map *m, const void *key, size_t key_len);
static inline void *map_get_str(const td_map *m, const char *key);
/* Sets key to value; returns the previous value or NULL. */
void *map_put(td_map *m, const void *key, size_t key_len, void *value);
/* Removes key; returns its value or NULL when absent. */
void *map_remove(td_map *m, const void *key, size_t key_len);
/* Iteration: for (size_t it = 0; (e = map_next(m, &it));) ... The map must not change meanwhile. */
td_map_entry *map_next(const td_map *m, size_t *iter);
void map_free(td_map *m, void (*free_value)(void *));

#include <string.h>
static inline void *map_get_str(const td_map *m, const char *key) { return map_get(m, key, strlen(key)); }

#endif
