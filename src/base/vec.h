/* Internal typed dynamic arrays.
 *
 *   TD_VEC(int) v = {0};         TD_VEC_PUSH(&v, 3);       v.items[0], v.len
 *   TD_VEC_FREE(&v);
 *
 * Growth aborts on out-of-memory (base/alloc.h). */
#ifndef TDIST_BASE_VEC_H
#define TDIST_BASE_VEC_H

#include <stddef.h>
#include <stdlib.h>

#include "base/alloc.h"

#define TD_VEC(type)  \
    struct {          \
        type *items;  \
        size_t len;   \
        size_t cap;   \
    }

#define TD_VEC_RESERVE(v, n)                                                            \
    do {                                                                                \
        if ((n) > (v)->cap) {                                                           \
            size_t td_vec_cap_ = (v)->cap ? (v)->cap * 2 : 8;                           \
            while (td_vec_cap_ < (n))                                                   \
                td_vec_cap_ *= 2;                                                       \
            (v)->items = alloc_resize((v)->items, td_vec_cap_ * sizeof(*(v)->items));     \
            (v)->cap = td_vec_cap_;                                                     \
        }                                                                               \
    } while (0)

#define TD_VEC_PUSH(v, value)                  \
    do {                                       \
        TD_VEC_RESERVE((v), (v)->len + 1);     \
        (v)->items[(v)->len++] = (value);      \
    } while (0)

/* Removes index i by moving the last element into its place (order not kept). i is evaluated
 * before len changes, so TD_VEC_SWAP_REMOVE(v, v->len - 1) is defined. */
#define TD_VEC_SWAP_REMOVE(v, i)                           \
    do {                                                   \
        size_t td_vec_i_ = (i);                            \
        (v)->items[td_vec_i_] = (v)->items[--(v)->len];    \
    } while (0)

#define TD_VEC_FREE(v)          \
    do {                        \
        free((v)->items);       \
        (v)->items = NULL;      \
        (v)->len = (v)->cap = 0; \
    } while (0)

#endif
