/* tdist/ddp.h: data-parallel training over tdist's autograd (torch.nn.parallel.DistributedDataParallel).
 *
 * A td_ddp wraps a model's parameters (autograd leaves, float dtypes) and optional buffers, and a
 * process group. Construction checks that every rank has the same parameters ("DDP expects same
 * model across all ranks, but Rank 1 has 3 params, while rank 0 has inconsistent 4 params.", or
 * "[1]: params[0] in this process with sizes [2, 3] appears not to match sizes of the same param in
 * process 0."; the other ranks fail too, naming the rank: "... in process 1 with sizes ...") and
 * broadcasts parameters and buffers from rank 0.
 *
 * The reducer groups the parameters into buckets, in reverse order of the array (the order
 * gradients usually arrive in), per dtype, up to bucket_cap_bytes each (the first one
 * first_bucket_bytes). A post-accumulate hook on every parameter copies its gradient into its
 * bucket (divided by the world size) and marks it ready; a bucket whose parameters are all ready
 * starts its asynchronous all_reduce at once (buckets start in index order, so that every rank
 * issues the same sequence), so communication overlaps the rest of the backward. When the last
 * bucket is started the hook waits for all of them and writes the averaged gradients back into
 * .grad: when td_autograd_backward returns, every rank holds the same gradients. After the first
 * iteration the buckets are rebuilt in the order the gradients actually arrived (rank 0's order,
 * broadcast).
 *
 * A training step:
 *     td_ddp_pre_forward(ddp);                  // checks the last reduction, broadcasts buffers
 *     ... forward with the parameters ...
 *     td_ddp_post_forward(ddp, &loss, 1);       // find_unused_parameters: walks the graph
 *     td_autograd_backward(loss, NULL, false);  // gradients are reduced during the backward
 *     ... optimizer step on the parameters ...
 *
 * Errors (PyTorch's texts): starting a step while the previous one's reduction did not finish
 * (a parameter got no gradient) fails td_ddp_pre_forward / td_ddp_post_forward with "Expected to
 * have finished reduction in the prior iteration before starting a new one. ...", which suggests
 * "passing the keyword argument `find_unused_parameters=True`" (or, when it is on, says "Since
 * `find_unused_parameters=True` is enabled") and "making sure all `forward` function outputs
 * participate in calculating loss", then either suggests setting TORCH_DISTRIBUTED_DEBUG (TDIST_DEBUG)
 * "to either INFO or DETAIL" or, at those levels, lists the parameter indices (and under DETAIL the
 * names) that received no gradient. A failed collective fails the step with its own error.
 *
 * Threads: one td_ddp is driven by one thread at a time. */
#ifndef TDIST_DDP_H
#define TDIST_DDP_H

#include <stdbool.h>
#include <stdint.h>

#include <tdist/future.h>
#include <tdist/pg.h>
#include <tdist/status.h>
#include <tdist/tensor.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct td_ddp td_ddp;
typedef struct td_ddp_bucket td_ddp_bucket;

typedef struct td_ddp_options {
    int64_t bucket_cap_bytes;     /* 0: 25 MiB (bucket_cap_mb=25) */
    int64_t first_bucket_bytes;   /* 0: 1 MiB */
    bool find_unused_parameters;  /* parameters the outputs' graph does not reach count as ready */
    bool broadcast_buffers;       /* broadcast the buffers from rank 0 before each forward */
    bool gradient_as_bucket_view; /* .grad becomes a view into its bucket: no copy back */
    bool static_graph;            /* the graph is the same every iteration (only the error differs) */
    const char *const *param_names; /* NULL or one name per parameter, for errors under DETAIL */
} td_ddp_options;

#define TD_DDP_OPTIONS_INIT {0, 0, false, true, false, false, NULL}

/* Wraps n_params parameters (each a leaf that requires grad; borrowed, kept alive by the td_ddp)
 * and n_buffers buffers (any dtype; NULL when 0) over pg (NULL: the default group); every rank of
 * pg calls it with the same model. options may be NULL (TD_DDP_OPTIONS_INIT). */
TD_API td_status td_ddp_create(td_pg *pg, td_tensor *const *params, int n_params, td_tensor *const *buffers,
                               int n_buffers, const td_ddp_options *options, td_ddp **out);
/* Removes the hooks and frees the reducer; the parameters keep their last gradients. NULL is
 * ignored. Reductions still in flight are waited for first. */
TD_API void td_ddp_free(td_ddp *ddp);

/* The part of DDP.forward before the module runs: fails if the previous synchronized step did not
 * finish its reduction, and broadcasts the buffers from rank 0 (broadcast_buffers). */
TD_API td_status td_ddp_pre_forward(td_ddp *ddp);
/* The part after: prepares the reducer for the backward of outputs (n of them; may be NULL when
 * find_unused_parameters is off). With find_unused_parameters, the parameters the outputs' graph
 * does not reach are marked ready once the backward starts. */
TD_API td_status td_ddp_post_forward(td_ddp *ddp, td_tensor *const *outputs, int n);
/* no_sync(): while sync is false, backward passes only accumulate into .grad; the next
 * synchronized backward reduces the accumulated gradients. */
TD_API td_status td_ddp_set_require_sync(td_ddp *ddp, bool sync);

/* ---- uneven inputs: Join ------------------------------------------------------------------------ */

/* model.join(divide_by_initial_world_size, throw_on_early_termination) around a training loop
 * whose ranks may run out of inputs at different iterations. td_ddp_join_begin enters it (every
 * rank); from then on each td_ddp_pre_forward also tells the others this rank is still active. A
 * rank out of inputs calls td_ddp_join_end, which shadows the active ranks' collectives (their
 * buffer broadcasts and gradient reductions, with zeros) until every rank has joined, then makes
 * every rank hold the last joiner's parameters and buffers. Gradients of an iteration are divided by
 * the initial world size, or with divide_by_initial_world_size false by the number of ranks still
 * active. With throw_on_early_termination, the first rank to run out fails td_ddp_join_end with
 * "Rank 0 exhausted all inputs." and the others fail their next td_ddp_pre_forward with "Detected
 * at least one rank that exhausted inputs. Throwing across all ranks." (then td_ddp_join_end
 * returns TD_OK at once). */
TD_API td_status td_ddp_join_begin(td_ddp *ddp, bool divide_by_initial_world_size, bool throw_on_early_termination);
TD_API td_status td_ddp_join_end(td_ddp *ddp);

/* ---- communication hooks ---------------------------------------------------------------------- */

/* register_comm_hook(state, hook): hook replaces the default reduction of each bucket. It gets the
 * bucket (valid during the call) and returns a future that completes with the reduced flat buffer
 * (a td_value tensor of the bucket's dtype and numel; NULL or none: the buffer was reduced in
 * place), the AVERAGE over the ranks. Registered once, before the first backward. */
typedef td_status (*td_ddp_comm_hook_fn)(void *state, td_ddp_bucket *bucket, td_future **out);
TD_API td_status td_ddp_register_comm_hook(td_ddp *ddp, void *state, td_ddp_comm_hook_fn hook);

/* The bucket's flat gradient buffer (borrowed: the local gradients, not yet divided), its index
 * (0 is started first), whether it is the last of the iteration, its parameters, and the group. */
TD_API td_tensor *td_ddp_bucket_buffer(td_ddp_bucket *bucket);
TD_API int td_ddp_bucket_index(const td_ddp_bucket *bucket);
TD_API bool td_ddp_bucket_is_last(const td_ddp_bucket *bucket);
TD_API int td_ddp_bucket_num_params(const td_ddp_bucket *bucket);
TD_API td_tensor *td_ddp_bucket_param(const td_ddp_bucket *bucket, int i);
TD_API td_pg *td_ddp_bucket_group(const td_ddp_bucket *bucket);

/* The built-in hooks (state: a td_pg *, or NULL for the td_ddp's group): allreduce_hook divides by
 * the group size and all_reduces (the default); the compress hooks do the same in float16 /
 * bfloat16 and cast the result back. */
TD_API td_status td_ddp_allreduce_hook(void *state, td_ddp_bucket *bucket, td_future **out);
TD_API td_status td_ddp_fp16_compress_hook(void *state, td_ddp_bucket *bucket, td_future **out);
TD_API td_status td_ddp_bf16_compress_hook(void *state, td_ddp_bucket *bucket, td_future **out);

/* ---- post-local SGD and model averaging -------------------------------------------------------- */

/* post_localSGD_hook's state (PostLocalSGDState): before start_local_sgd_iter backward passes the
 * hook averages over process_group (NULL: the model's group) and counts iterations (at the last
 * bucket); from then on over subgroup only (NULL: process_group, the one-host case of
 * dist.new_subgroups()), or not at all when post_local_gradient_allreduce is false. Initialize with
 * TD_POST_LOCAL_SGD_STATE_INIT(subgroup, start) and pass its address as the hook's state. */
typedef struct td_post_local_sgd_state {
    td_pg *process_group;
    td_pg *subgroup;
    int64_t start_local_sgd_iter;
    bool post_local_gradient_allreduce;
    int64_t iter;
} td_post_local_sgd_state;
#define TD_POST_LOCAL_SGD_STATE_INIT(subgroup, start) {NULL, (subgroup), (start), true, 0}
TD_API td_status td_ddp_post_local_sgd_hook(void *state, td_ddp_bucket *bucket, td_future **out);

/* PeriodicModelAverager(period, warmup_steps, process_group): td_model_average_parameters counts a
 * step and, when step >= warmup_steps and (step - warmup_steps) % period == 0, replaces each
 * parameter by its average over the group (NULL: the default group); returns whether it averaged
 * in *averaged (may be NULL). "Arg ``period`` must be a positive value." */
typedef struct td_model_averager {
    int64_t period, warmup_steps, step;
    td_pg *process_group;
} td_model_averager;
#define TD_MODEL_AVERAGER_INIT(period, warmup) {(period), (warmup), 0, NULL}
TD_API td_status td_model_average_parameters(td_model_averager *averager, td_tensor *const *params, int n,
                                             bool *averaged);

/* ---- SyncBatchNorm ------------------------------------------------------------------------------ */

/* torch.nn.SyncBatchNorm's training-mode forward: x [N, C, *] normalized per channel with the mean
 * and biased variance of every rank's batch together (one all_reduce over pg, NULL: the default
 * group), scaled by weight and shifted by bias ([C] each, may be NULL: affine false); running_mean
 * and running_var ([C], may be NULL) move by momentum toward the global mean and unbiased variance.
 * Records its backward (one more all_reduce), which gives x the gradient of the global batch's loss
 * and weight and bias their local gradients (DDP averages those). Every rank calls it in the same
 * order, in the forward and, through the backward, in the backward. */
TD_API td_status td_sync_batch_norm(td_pg *pg, td_tensor *x, td_tensor *weight, td_tensor *bias,
                                    td_tensor *running_mean, td_tensor *running_var, double momentum, double eps,
                                    td_tensor **out);

/* ---- PowerSGD comm hook and DistributedSampler -------------------------------------------------- */

/* PowerSGDState and powerSGD_hook (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook):
 *     td_powersgd_state *ps = NULL;
 *     td_powersgd_state_new(NULL, 1, 10, 2.0, true, true, 0.0, 0, &ps);
 *     td_ddp_register_comm_hook(ddp, ps, td_ddp_powersgd_hook);
 *     ... train; td_ddp_free(ddp); td_powersgd_state_free(ps);
 * Before start_powerSGD_iter backward passes the hook is allreduce_hook. From then on each bucket
 * gets error feedback (the residual of the last compression is added first), is viewed per
 * parameter as a matrix [size(0), numel / size(0)], and each matrix worth compressing
 * ((rows + cols) * rank * min_compression_rate < rows * cols, rank = min(rows, cols,
 * matrix_approximation_rank)) is replaced by its rank-r approximation P Q^T: P = M Q, all_reduce P,
 * Gram-Schmidt on P, Q = M^T P, all_reduce Q, M = P Q^T / world size. The others (biases and small
 * tensors) are averaged by one all_reduce of their concatenation. With warm_start Q is kept from one
 * iteration to the next; otherwise, and the first time, it is drawn from a normal distribution
 * seeded from random_seed, the same on every rank (tdist's own generator: the values differ from
 * torch's). The iteration counter advances when the last bucket of a backward passes.
 *
 * Threads: the hook issues every collective on the thread that runs the backward, in bucket order
 * (the same sequence on every rank, whatever the backend); it waits for the all_reduces of the
 * uncompressed tensors and of P inside the hook (both small next to the bucket), and returns a
 * future that completes when the all_reduce of Q has and the bucket holds the decompressed
 * average. Compressed buckets must be float32 or float64. */
typedef struct td_powersgd_state td_powersgd_state;

/* pg (borrowed; NULL: each bucket's DDP group) must outlive the state. matrix_approximation_rank >=
 * 1; start_powerSGD_iter > 1 when use_error_feedback or warm_start (the buckets are rebuilt after the
 * first iteration: "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is
 * enabled, because PowerSGD can only be applied after the first two iterations in DDP.");
 * orthogonalization_epsilon >= 0 (0: a column of zeros stays zeros, with an error logged). torch's
 * defaults: 1, 1000, 2.0, true, true, 0.0, 0. */
TD_API td_status td_powersgd_state_new(td_pg *pg, int matrix_approximation_rank, int64_t start_powerSGD_iter,
                                       double min_compression_rate, bool use_error_feedback, bool warm_start,
                                       double orthogonalization_epsilon, uint64_t random_seed,
                                       td_powersgd_state **out);
/* Frees the state (NULL is ignored). Free the td_ddp first: its buckets' futures must have completed. */
TD_API void td_powersgd_state_free(td_powersgd_state *state);
/* The comm hook (state: a td_powersgd_state *). */
TD_API td_status td_ddp_powersgd_hook(void *state, td_ddp_bucket *bucket, td_future **out);

/* The iteration counter (backward passes seen), and compression_stats(): the elements before and
 * after compression summed over every compressed call so far, and their ratio (0 while none). */
TD_API int64_t td_powersgd_state_iter(const td_powersgd_state *state);
TD_API td_status td_powersgd_state_compression_stats(const td_powersgd_state *state, double *rate,
                                                     int64_t *numel_before, int64_t *numel_after);
/* A copy (a new 1-D tensor) of one bucket's memory: the local error of the last compression
 * (error_dict), or the P or Q of the last iteration (p_memory_dict, q_memory_dict); between
 * iterations only. TD_ERR_INVALID when the bucket has none yet. */
typedef enum td_powersgd_memory {
    TD_POWERSGD_ERROR = 0,
    TD_POWERSGD_P = 1,
    TD_POWERSGD_Q = 2
} td_powersgd_memory;
TD_API td_status td_powersgd_state_memory(const td_powersgd_state *state, int bucket_index, td_powersgd_memory which,
                                          td_tensor **out);

/* torch.utils.data.DistributedSampler: the dataset indices rank takes in epoch. Without drop_last
 * every rank gets ceil(dataset_len / num_replicas) indices, the list padded by repeating it from
 * its start; with drop_last floor(dataset_len / num_replicas), the tail dropped. Rank r takes
 * elements r, r + num_replicas, ... of the (shuffled) list. shuffle permutes 0 .. dataset_len-1
 * with a generator seeded by seed + epoch: the same on every rank and process, different from one
 * epoch to the next, but not torch's randperm. out holds td_distributed_sampler_num_samples()
 * indices (NULL: only *n_out is set). A rank outside [0, num_replicas - 1] fails with "Invalid rank
 * 4, rank should be in the interval [0, 3]". */
TD_API td_status td_distributed_sampler_num_samples(int64_t dataset_len, int num_replicas, bool drop_last,
                                                    int64_t *out);
TD_API td_status td_distributed_sampler_indices(int64_t dataset_len, int num_replicas, int rank, bool shuffle,
                                                int64_t seed, int64_t epoch, bool drop_last, int64_t *out,
                                                int64_t *n_out);

/* ---- logging --------------------------------------------------------------------------------- */

/* _get_ddp_logging_data(): printed once per 100 iterations under TDIST_DEBUG=INFO as well. */
typedef struct td_ddp_logging_data {
    int64_t iteration;        /* synchronized backward passes reduced */
    bool has_error;
    char error[512];          /* the last error, "" when none */
    int num_buckets;
    int64_t bucket_bytes[8];  /* the first buckets' sizes, in start order */
    int64_t backward_ns;      /* last iteration: first hook to last bucket started */
    int64_t comm_ns;          /* last iteration: first bucket started to all reduced */
    int64_t comm_hidden_ns;   /* of comm_ns, the part that ran while the backward still ran */
    bool rebuilt;             /* buckets rebuilt in gradient-arrival order */
} td_ddp_logging_data;
TD_API td_status td_ddp_logging(const td_ddp *ddp, td_ddp_logging_data *out);

#ifdef __cplusplus
}
#endif
#endif
