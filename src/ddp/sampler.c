/* DistributedSampler (tdist/ddp.h; torch.utils.data.DistributedSampler): which dataset indices each
 * rank of a data-parallel job reads in an epoch, so that the ranks split the dataset between them.
 *
 * The list is 0 .. dataset_len-1, shuffled (Fisher-Yates driven by a splitmix64 stream seeded with
 * seed + epoch, so every rank computes the same permutation without talking to the others), then
 * padded by repeating it from its start up to a multiple of num_replicas or, with drop_last, cut
 * down to one; rank r takes every num_replicas-th element from r. The padding and the cut follow
 * torch's arithmetic exactly; the permutation is tdist's own, not torch.randperm's. */
#include <inttypes.h>
#include <stdlib.h>

#include <tdist/ddp.h>

#include "base/alloc.h"
#include "base/error.h"

static uint64_t sampler_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* A uniform integer in [0, bound), without modulo bias (bound > 0). */
static uint64_t sampler_below(uint64_t *s, uint64_t bound)
{
    uint64_t limit = UINT64_MAX - UINT64_MAX % bound;
    uint64_t x;
    do
        x = sampler_next(s);
    while (x >= limit);
    return x % bound;
}

static td_status sampler_check(int64_t dataset_len, int num_replicas)
{
    if (num_replicas <= 0)
        return error_fmt(TD_ERR_INVALID,
                         "num_replicas should be a positive integer value, but got num_replicas=%d", num_replicas);
    if (dataset_len < 0)
        return error_fmt(TD_ERR_INVALID, "DistributedSampler: dataset_len must be >= 0, got %" PRId64, dataset_len);
    return TD_OK;
}

td_status td_distributed_sampler_num_samples(int64_t dataset_len, int num_replicas, bool drop_last, int64_t *out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_distributed_sampler_num_samples: out is NULL");
    TD_TRY(sampler_check(dataset_len, num_replicas));
    /* drop_last on an uneven split: ceil((len - n) / n), which is floor(len / n); else ceil(len / n). */
    if (drop_last && dataset_len % num_replicas != 0)
        *out = dataset_len / num_replicas;
    else
        *out = dataset_len / num_replicas + (dataset_len % num_replicas != 0);
    return TD_OK;
}

td_status td_distributed_sampler_indices(int64_t dataset_len, int num_replicas, int rank, bool shuffle, int64_t seed,
                                         int64_t epoch, bool drop_last, int64_t *out, int64_t *n_out)
{
    if (!n_out)
        return error_fmt(TD_ERR_INVALID, "td_distributed_sampler_indices: n_out is NULL");
    *n_out = 0;
    TD_TRY(sampler_check(dataset_len, num_replicas));
    if (rank < 0 || rank >= num_replicas)
        return error_fmt(TD_ERR_INVALID, "Invalid rank %d, rank should be in the interval [0, %d]", rank,
                         num_replicas - 1);
    int64_t num_samples = 0;
    TD_TRY(td_distributed_sampler_num_samples(dataset_len, num_replicas, drop_last, &num_samples));
    *n_out = num_samples;
    if (!out || num_samples == 0)
        return TD_OK;
    if (!shuffle) { /* the list is the identity: element k of the padded list is k % len */
        for (int64_t i = 0; i < num_samples; i++)
            out[i] = (rank + i * num_replicas) % dataset_len;
        return TD_OK;
    }
    int64_t *perm = NULL;
    TD_TRY(alloc_try(sizeof(int64_t) * (size_t)dataset_len, "DistributedSampler permutation", (void **)&perm));
    for (int64_t i = 0; i < dataset_len; i++)
        perm[i] = i;
    uint64_t state = (uint64_t)seed + (uint64_t)epoch;
    for (int64_t i = dataset_len - 1; i > 0; i--) {
        int64_t k = (int64_t)sampler_below(&state, (uint64_t)i + 1);
        int64_t tmp = perm[i];
        perm[i] = perm[k];
        perm[k] = tmp;
    }
    for (int64_t i = 0; i < num_samples; i++)
        out[i] = perm[(rank + i * num_replicas) % dataset_len];
    free(perm);
    return TD_OK;
}
