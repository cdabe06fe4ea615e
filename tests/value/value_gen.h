/* Seeded random td_values for the value and codec tests: nested lists, tuples, dicts and records
 * holding every scalar kind and tensors of every dtype, including 0-dim, empty and
 * non-contiguous views (transposed, narrowed, expanded, strided), and tensors shared between
 * places in the value. Values hold no NaN, so that a value always equals its copy. */
#ifndef TDIST_TESTS_VALUE_GEN_H
#define TDIST_TESTS_VALUE_GEN_H

#include <stdint.h>

#include <tdist/value.h>

typedef struct value_gen {
    uint64_t state;
    int max_depth;
    td_tensor *pool[16]; /* tensors already placed, reused to exercise sharing */
    int npool;
} value_gen;

void value_gen_init(value_gen *g, uint64_t seed, int max_depth);
void value_gen_free(value_gen *g);
uint64_t value_gen_next(value_gen *g);
/* A new random value (a new reference). */
td_value *value_gen_value(value_gen *g);
/* A random tensor (a new reference): a fresh contiguous one or a view; *kind says which
 * (0 contiguous, 1 transposed, 2 narrowed, 3 expanded, 4 strided, 5 selected). */
td_tensor *value_gen_tensor(value_gen *g, int *kind);

#endif
