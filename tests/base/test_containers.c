/* Small containers of the base layer: td_buf (byte buffer / string builder), td_map (hash map
 * with byte-string keys, tombstones on removal) and TD_VEC (typed arrays). */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/testing.h>

#include "base/buf.h"
#include "base/error.h"
#include "base/map.h"
#include "base/vec.h"

TD_TEST(buf_builds_strings)
{
    td_buf b = TD_BUF_INIT;
    buf_append(&b, "", 0);
    TD_CHECK(b.data != NULL);
    TD_CHECK_STR_EQ(b.data, "");
    buf_append_str(&b, "ranks");
    buf_putc(&b, ':');
    buf_printf(&b, " %d of %d", 3, 4);
    TD_CHECK_STR_EQ(b.data, "ranks: 3 of 4");
    TD_CHECK_EQ(b.len, 13);
    buf_printf(&b, "%s", "");
    TD_CHECK_EQ(b.len, 13);
    buf_consume(&b, 7);
    TD_CHECK_STR_EQ(b.data, "3 of 4");
    buf_consume(&b, 100);
    TD_CHECK_EQ(b.len, 0);
    TD_CHECK_STR_EQ(b.data, "");
    buf_append_str(&b, "abc");
    buf_clear(&b);
    TD_CHECK_EQ(b.len, 0);
    TD_CHECK_STR_EQ(b.data, "");
    buf_free(&b);
    TD_CHECK(b.data == NULL);

    td_buf e = TD_BUF_INIT;
    char *s = buf_steal(&e); /* never NULL, even when empty */
    TD_CHECK(s != NULL);
    TD_CHECK_STR_EQ(s, "");
    free(s);
}

TD_TEST(buf_grows_and_stays_terminated)
{
    td_buf b = TD_BUF_INIT;
    for (int i = 0; i < 100000; i++) {
        buf_printf(&b, "%05d,", i % 100000);
        TD_CHECK(b.data[b.len] == '\0');
    }
    TD_CHECK_EQ(b.len, 600000);
    TD_CHECK(memcmp(b.data + 6 * 54321, "54321,", 6) == 0);
    char *p = buf_extend(&b, 4);
    memcpy(p, "tail", 4);
    TD_CHECK_EQ(b.len, 600004);
    TD_CHECK_STR_EQ(b.data + 600000, "tail");
    char *s = buf_steal(&b);
    TD_CHECK(b.data == NULL && b.len == 0 && b.cap == 0);
    TD_CHECK_EQ(strlen(s), 600004);
    free(s);
}

TD_TEST(buf_binary_and_little_endian)
{
    td_buf b = TD_BUF_INIT;
    buf_put_u8(&b, 0xab);
    buf_put_u32(&b, 0x01020304u);
    buf_put_u64(&b, 0x1122334455667788ull);
    buf_append(&b, "\0\1\0", 3);
    static const unsigned char want[] = {0xab, 0x04, 0x03, 0x02, 0x01, 0x88, 0x77, 0x66, 0x55,
                                         0x44, 0x33, 0x22, 0x11, 0x00, 0x01, 0x00};
    TD_CHECK_EQ(b.len, sizeof want);
    TD_CHECK(memcmp(b.data, want, sizeof want) == 0);
    buf_free(&b);
}

TD_TEST(buf_try_reserve_refuses_overflow)
{
    td_buf b = TD_BUF_INIT;
    buf_append_str(&b, "x");
    TD_CHECK_ERR(buf_try_reserve(&b, SIZE_MAX), TD_ERR_NOMEM, "buffer size overflow adding");
    TD_CHECK_OK(buf_try_reserve(&b, 1 << 20));
    TD_CHECK(b.cap >= (1u << 20) + 2);
    TD_CHECK_STR_EQ(b.data, "x");
    buf_free(&b);
}

static int g_freed;
static void count_free(void *v)
{
    g_freed++;
    free(v);
}

TD_TEST(map_basic)
{
    td_map m = TD_MAP_INIT;
    TD_CHECK(map_get_str(&m, "missing") == NULL);
    TD_CHECK(map_remove(&m, "missing", 7) == NULL);
    int a = 1, b = 2, c = 3;
    TD_CHECK(map_put(&m, "a", 1, &a) == NULL);
    TD_CHECK(map_put(&m, "b", 1, &b) == NULL);
    TD_CHECK_EQ(m.len, 2);
    TD_CHECK(map_get_str(&m, "a") == &a);
    TD_CHECK(map_put(&m, "a", 1, &c) == &a); /* replace returns the previous value */
    TD_CHECK_EQ(m.len, 2);
    TD_CHECK(map_get_str(&m, "a") == &c);
    TD_CHECK(map_remove(&m, "a", 1) == &c);
    TD_CHECK(map_get_str(&m, "a") == NULL);
    TD_CHECK_EQ(m.len, 1);
    TD_CHECK(map_put(&m, "", 0, &a) == NULL); /* the empty key is a key */
    TD_CHECK(map_get(&m, "", 0) == &a);
    map_free(&m, NULL);
    TD_CHECK(m.slots == NULL && m.len == 0);
}

TD_TEST(map_binary_keys)
{
    td_map m = TD_MAP_INIT;
    int x = 1, y = 2, z = 3;
    map_put(&m, "a\0b", 3, &x);
    map_put(&m, "a\0c", 3, &y);
    map_put(&m, "a", 1, &z);
    TD_CHECK(map_get(&m, "a\0b", 3) == &x);
    TD_CHECK(map_get(&m, "a\0c", 3) == &y);
    TD_CHECK(map_get(&m, "a", 1) == &z);
    TD_CHECK(map_get(&m, "a\0", 2) == NULL);
    size_t it = 0;
    td_map_entry *e;
    int seen = 0;
    while ((e = map_next(&m, &it))) {
        TD_CHECK(e->key[e->key_len] == '\0');
        if (e->key_len == 3)
            TD_CHECK(e->key[1] == '\0');
        seen++;
    }
    TD_CHECK_EQ(seen, 3);
    map_free(&m, NULL);
}

TD_TEST(map_many_keys_removal_and_iteration)
{
    enum { N = 20000 };
    td_map m = TD_MAP_INIT;
    char key[32];
    for (int i = 0; i < N; i++) {
        int *v = malloc(sizeof *v);
        *v = i;
        int n = snprintf(key, sizeof key, "key/%d", i);
        TD_CHECK(map_put(&m, key, (size_t)n, v) == NULL);
    }
    TD_CHECK_EQ(m.len, N);
    for (int i = 0; i < N; i++) {
        int n = snprintf(key, sizeof key, "key/%d", i);
        int *v = map_get(&m, key, (size_t)n);
        TD_CHECK(v != NULL && *v == i);
    }
    for (int i = 0; i < N; i += 2) {
        int n = snprintf(key, sizeof key, "key/%d", i);
        free(map_remove(&m, key, (size_t)n));
    }
    TD_CHECK_EQ(m.len, N / 2);
    /* iteration visits every live key once */
    char *seen = calloc(N, 1);
    size_t it = 0, count = 0;
    td_map_entry *e;
    while ((e = map_next(&m, &it))) {
        int v = *(int *)e->value;
        TD_CHECK(v % 2 == 1);
        TD_CHECK(!seen[v]);
        seen[v] = 1;
        count++;
    }
    TD_CHECK_EQ(count, N / 2);
    free(seen);
    /* removed keys are gone, and can come back */
    for (int i = 0; i < N; i += 2) {
        int n = snprintf(key, sizeof key, "key/%d", i);
        TD_CHECK(map_get(&m, key, (size_t)n) == NULL);
    }
    int n = snprintf(key, sizeof key, "key/%d", 0);
    int *back = malloc(sizeof *back);
    *back = -1;
    TD_CHECK(map_put(&m, key, (size_t)n, back) == NULL);
    TD_CHECK(map_get(&m, key, (size_t)n) == back);
    g_freed = 0;
    map_free(&m, count_free);
    TD_CHECK_EQ(g_freed, N / 2 + 1);
}

TD_TEST(map_churn_reuses_tombstones)
{
    /* Insert and remove distinct keys many times over a small live set: tombstones must be
     * dropped by rehashing, or lookups of missing keys would never find an empty slot. */
    td_map m = TD_MAP_INIT;
    int v = 0;
    char key[32];
    for (int i = 0; i < 100000; i++) {
        int n = snprintf(key, sizeof key, "churn/%d", i);
        map_put(&m, key, (size_t)n, &v);
        if (i >= 4) {
            n = snprintf(key, sizeof key, "churn/%d", i - 4);
            TD_CHECK(map_remove(&m, key, (size_t)n) == &v);
        }
        TD_CHECK(map_get_str(&m, "never-inserted") == NULL);
    }
    TD_CHECK_EQ(m.len, 4);
    TD_CHECK(m.cap <= 64);
    map_free(&m, NULL);
}

TD_TEST(hash_depends_on_bytes_and_seed)
{
    TD_CHECK(map_hash_bytes("abc", 3, 0) == map_hash_bytes("abc", 3, 0));
    TD_CHECK(map_hash_bytes("abc", 3, 0) != map_hash_bytes("abd", 3, 0));
    TD_CHECK(map_hash_bytes("abc", 3, 0) != map_hash_bytes("abc", 3, 1));
    TD_CHECK(map_hash_bytes("a\0b", 3, 0) != map_hash_bytes("a\0c", 3, 0));
    TD_CHECK(map_hash_bytes("12345678abc", 11, 0) != map_hash_bytes("12345678abd", 11, 0));
}

TD_TEST(vec_push_remove_free)
{
    TD_VEC(int) v = {0};
    for (int i = 0; i < 1000; i++)
        TD_VEC_PUSH(&v, i * 3);
    TD_CHECK_EQ(v.len, 1000);
    TD_CHECK(v.cap >= 1000);
    for (int i = 0; i < 1000; i++)
        TD_CHECK_EQ(v.items[i], i * 3);
    TD_VEC_SWAP_REMOVE(&v, 10);
    TD_CHECK_EQ(v.len, 999);
    TD_CHECK_EQ(v.items[10], 999 * 3);
    TD_VEC_SWAP_REMOVE(&v, v.len - 1);
    TD_CHECK_EQ(v.len, 998);
    TD_VEC_RESERVE(&v, 5000);
    TD_CHECK(v.cap >= 5000);
    TD_CHECK_EQ(v.items[0], 0);
    TD_VEC_FREE(&v);
    TD_CHECK(v.items == NULL && v.len == 0 && v.cap == 0);

    typedef struct pair {
        int a;
        double b;
    } pair;
    TD_VEC(pair) ps = {0};
    TD_VEC_PUSH(&ps, ((pair){1, 2.5}));
    TD_CHECK_EQ(ps.items[0].a, 1);
    TD_CHECK_NEAR(ps.items[0].b, 2.5, 0);
    TD_VEC_FREE(&ps);
}
