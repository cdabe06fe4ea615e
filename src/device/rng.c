/* The per-device random number generators (torch.cuda's get_rng_state / set_rng_state /
 * manual_seed / _set_rng_state_offset): one Philox4x32-10 state (seed, offset) per device of each
 * accelerator type, made with PyTorch's default seed at its first use and kept for the life of
 * the process, as CUDA generators are.
 *
 * The generator holds numbers only: random kernels (td_tensor_normal_ and td_tensor_uniform_ in
 * the tensor layer) take (seed, offset) through device_rng_take, which advances the offset by
 * PHILOX_OFFSET_PER_CALL under the generator's lock, and run the Philox of philox.h with them on
 * the device. The increment depends on nothing but the call, so restoring a state replays the
 * same calls bit for bit (spec/cuda_multigpu.md section 7). The state's 16 bytes are PyTorch's:
 * the seed (uint64) then the offset (int64), little-endian. */
#include "device/device_impl.h"

#include <pthread.h>
#include <string.h>

#include "base/error.h"
#include "base/le.h"
#include "device/philox.h"

#define RNG_TYPES 3 /* indexed by td_device_type */

typedef struct rng_generator {
    pthread_mutex_t lock;
    uint64_t seed;
    uint64_t offset;
} rng_generator;

static rng_generator rng_generators[RNG_TYPES][DEVICE_MAX_DEVICES];
static pthread_once_t rng_once = PTHREAD_ONCE_INIT;

static void rng_init(void)
{
    for (int t = 0; t < RNG_TYPES; t++)
        for (int i = 0; i < DEVICE_MAX_DEVICES; i++) {
            pthread_mutex_init(&rng_generators[t][i].lock, NULL);
            rng_generators[t][i].seed = TD_RNG_DEFAULT_SEED;
        }
}

/* The generator of a resolved device, locked. */
static rng_generator *rng_lock(td_device resolved)
{
    pthread_once(&rng_once, rng_init);
    rng_generator *g = &rng_generators[resolved.type][resolved.index];
    pthread_mutex_lock(&g->lock);
    return g;
}

static void rng_unlock(rng_generator *g) { pthread_mutex_unlock(&g->lock); }

/* PyTorch's set_philox_offset_per_thread check; negative offsets (which PyTorch would wrap to
 * huge unsigned ones) are refused too. */
static td_status rng_check_offset(int64_t offset)
{
    if (offset % 4 != 0)
        return error_set(TD_ERR_INVALID, "offset must be a multiple of 4");
    if (offset < 0)
        return error_fmt(TD_ERR_INVALID, "offset must be non-negative, but got %lld", (long long)offset);
    return TD_OK;
}

void device_rng_take(td_device resolved, uint64_t *seed, uint64_t *offset)
{
    rng_generator *g = rng_lock(resolved);
    *seed = g->seed;
    *offset = g->offset;
    g->offset += PHILOX_OFFSET_PER_CALL;
    rng_unlock(g);
}

td_status td_device_rng_get_state(td_device device, uint8_t out[TD_RNG_STATE_SIZE])
{
    if (!out)
        return error_set(TD_ERR_INVALID, "td_device_rng_get_state: out is NULL");
    td_device d;
    TD_TRY(td_device_resolve(device, &d));
    rng_generator *g = rng_lock(d);
    le_put(out, g->seed, 8);
    le_put(out + 8, g->offset, 8);
    rng_unlock(g);
    return TD_OK;
}

td_status td_device_rng_set_state(td_device device, const uint8_t state[TD_RNG_STATE_SIZE])
{
    if (!state)
        return error_set(TD_ERR_INVALID, "td_device_rng_set_state: state is NULL");
    td_device d;
    TD_TRY(td_device_resolve(device, &d));
    uint64_t seed = le_get(state, 8);
    int64_t offset = (int64_t)le_get(state + 8, 8);
    TD_TRY(rng_check_offset(offset));
    rng_generator *g = rng_lock(d);
    g->seed = seed;
    g->offset = (uint64_t)offset;
    rng_unlock(g);
    return TD_OK;
}

td_status td_device_rng_get_state_all(td_device_type type, uint8_t (*out)[TD_RNG_STATE_SIZE], int capacity,
                                      int *count)
{
    if (!count || (capacity > 0 && !out))
        return error_set(TD_ERR_INVALID, "td_device_rng_get_state_all: out and count must not be NULL");
    if (type == TD_DEVICE_CPU) {
        td_device cpu = {TD_DEVICE_CPU, -1};
        return td_device_resolve(cpu, &cpu); /* the spec's "Expected a cuda device, but got: cpu" */
    }
    int n = td_device_count(type);
    if (n > capacity)
        return error_fmt(TD_ERR_INVALID,
                         "td_device_rng_get_state_all: room for %d states, but there are %d %s devices", capacity,
                         n, td_device_type_name(type));
    for (int i = 0; i < n; i++) {
        td_device d = {type, i};
        TD_TRY(td_device_rng_get_state(d, out[i]));
    }
    *count = n;
    return TD_OK;
}

td_status td_device_rng_set_state_all(td_device_type type, const uint8_t (*states)[TD_RNG_STATE_SIZE], int n)
{
    if (n < 0 || (n > 0 && !states))
        return error_set(TD_ERR_INVALID, "td_device_rng_set_state_all: states must not be NULL");
    /* Check every state before setting any, so a bad one changes nothing. */
    for (int i = 0; i < n; i++) {
        td_device d = {type, i}, resolved;
        TD_TRY(td_device_resolve(d, &resolved));
        TD_TRY(rng_check_offset((int64_t)le_get(states[i] + 8, 8)));
    }
    for (int i = 0; i < n; i++) {
        td_device d = {type, i};
        TD_TRY(td_device_rng_set_state(d, states[i]));
    }
    return TD_OK;
}

td_status td_device_rng_get_offset(td_device device, int64_t *out)
{
    if (!out)
        return error_set(TD_ERR_INVALID, "td_device_rng_get_offset: out is NULL");
    td_device d;
    TD_TRY(td_device_resolve(device, &d));
    rng_generator *g = rng_lock(d);
    *out = (int64_t)g->offset;
    rng_unlock(g);
    return TD_OK;
}

td_status td_device_rng_set_offset(td_device device, int64_t offset)
{
    td_device d;
    TD_TRY(td_device_resolve(device, &d));
    TD_TRY(rng_check_offset(offset));
    rng_generator *g = rng_lock(d);
    g->offset = (uint64_t)offset;
    rng_unlock(g);
    return TD_OK;
}

td_status td_device_manual_seed(td_device device, uint64_t seed)
{
    td_device d;
    TD_TRY(td_device_resolve(device, &d));
    rng_generator *g = rng_lock(d);
    g->seed = seed;
    g->offset = 0;
    rng_unlock(g);
    return TD_OK;
}

td_status td_device_manual_seed_all(td_device_type type, uint64_t seed)
{
    if (type == TD_DEVICE_CPU) {
        td_device cpu = {TD_DEVICE_CPU, -1};
        return td_device_resolve(cpu, &cpu);
    }
    int n = td_device_count(type);
    for (int i = 0; i < n; i++) {
        td_device d = {type, i};
        TD_TRY(td_device_manual_seed(d, seed));
    }
    return TD_OK;
}

td_status td_device_initial_seed(td_device device, uint64_t *out)
{
    if (!out)
        return error_set(TD_ERR_INVALID, "td_device_initial_seed: out is NULL");
    td_device d;
    TD_TRY(td_device_resolve(device, &d));
    rng_generator *g = rng_lock(d);
    *out = g->seed;
    rng_unlock(g);
    return TD_OK;
}
