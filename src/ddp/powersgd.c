/* The PowerSGD comm hook (tdist/ddp.h; torch's powerSGD_hook and PowerSGDState): low-rank
 * compression of DDP's gradient buckets with error feedback and warm start.
 *
 * The state keeps, per bucket index, the local error of the last compression and the P and Q
 * memories, plus the iteration counter, the compression statistics and the generator that seeds
 * Q's random start (the same sequence on every rank, since every rank sees the same buckets in the
 * same order). A compressed call runs its collectives on the backward's thread, in a fixed order:
 * the all_reduce of the concatenated uncompressed tensors, then of P (waited for in the hook; both
 * are small), then of Q, whose completion a then() callback turns into the decompressed average.
 * The callback touches only what the call handed it (retained tensors), never the state, so the
 * next bucket's hook runs beside it and the state may be freed as soon as the futures completed.
 * Issuing every collective from the hook, not from callbacks, keeps the order identical across
 * ranks and works on backends that accept collectives only from the application's thread. */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/ddp.h>

#include "base/alloc.h"
#include "base/error.h"
#include "base/log.h"
#include "base/thread.h"
#include "ddp/ddp_impl.h"

#define POWERSGD_STATS_EVERY 10000 /* compression_stats_logging_frequency */

/* One bucket index's memory. */
typedef struct powersgd_bucket {
    int64_t numel;
    td_dtype dtype;
    td_tensor *error;     /* error_dict: input - decompressed output, NULL until the first compression */
    td_tensor *p, *q;     /* p_memory_dict, q_memory_dict */
} powersgd_bucket;

struct td_powersgd_state {
    td_pg *pg;
    int rank;
    int64_t start_iter;
    double min_rate;
    bool error_feedback, warm_start;
    double epsilon;
    uint64_t rng;
    pthread_mutex_t mu;          /* the bucket table, against td_powersgd_state_memory */
    powersgd_bucket **buckets;   /* by index; entries never move */
    int n_buckets;
    int64_t iter;
    int64_t numel_before, numel_after, next_stats_report;
};

/* One compressed parameter: its matrix view of the bucket and its slices of P and Q. */
typedef struct powersgd_matrix {
    int64_t offset, rows, cols;
    int64_t rank;
    int64_t p_offset, q_offset;
} powersgd_matrix;

/* What the decompressing callback needs; every tensor retained. */
typedef struct powersgd_job {
    td_tensor *buffer;
    td_tensor *input_copy; /* the input after error feedback; NULL without error feedback */
    td_tensor *error;
    td_tensor *p, *q;
    powersgd_matrix *mats;
    int n_mats;
    int world_size;
} powersgd_job;

/* ---- random numbers: splitmix64, the same stream on every rank -------------------------------- */

static uint64_t powersgd_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9E3779B97F4A7C15ULL);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
    return z ^ (z >> 31);
}

/* A uniform double in (0, 1]. */
static double powersgd_uniform(uint64_t *s) { return ((double)(powersgd_next(s) >> 11) + 1.0) * 0x1.0p-53; }

/* Standard normal values (Box-Muller) into t (contiguous float32 or float64). */
static void powersgd_randn(td_tensor *t, uint64_t seed)
{
    uint64_t s = seed;
    int64_t n = td_tensor_numel(t);
    bool f32 = td_tensor_dtype(t) == TD_FLOAT32;
    void *data = td_tensor_data(t);
    for (int64_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(powersgd_uniform(&s))), a = 6.283185307179586 * powersgd_uniform(&s);
        double v[2] = {r * cos(a), r * sin(a)};
        for (int64_t k = 0; k < 2 && i + k < n; k++) {
            if (f32)
                ((float *)data)[i + k] = (float)v[k];
            else
                ((double *)data)[i + k] = v[k];
        }
    }
}

/* ---- dense kernels on float32 / float64 -------------------------------------------------------- */

/* Gram-Schmidt on the columns of a row-major [rows, cols] matrix, as torch's
 * _orthogonalize_gram_schmidt: normalize column i (by its norm, plus epsilon when it is not 0), then
 * remove its projection from every later column. Sums accumulate in double. Returns false when a
 * column was all zeros with epsilon 0 (it stays zeros, where torch would produce NaNs). */
#define POWERSGD_GRAM_SCHMIDT(T, NAME)                                                             \
    static bool NAME(T *m, int64_t rows, int64_t cols, double epsilon)                             \
    {                                                                                              \
        bool finite = true;                                                                        \
        for (int64_t i = 0; i < cols; i++) {                                                       \
            double sq = 0;                                                                         \
            for (int64_t k = 0; k < rows; k++)                                                     \
                sq += (double)m[k * cols + i] * (double)m[k * cols + i];                           \
            double norm = sqrt(sq) + epsilon;                                                      \
            if (norm == 0) {                                                                       \
                finite = false;                                                                    \
                continue; /* a zero column: nothing to normalize or project out */                 \
            }                                                                                      \
            T scale = (T)norm;                                                                     \
            for (int64_t k = 0; k < rows; k++)                                                     \
                m[k * cols + i] /= scale;                                                          \
            for (int64_t j = i + 1; j < cols; j++) {                                               \
                double dot = 0;                                                                    \
                for (int64_t k = 0; k < rows; k++)                                                 \
                    dot += (double)m[k * cols + i] * (double)m[k * cols + j];                      \
                T d = (T)dot;                                                                      \
                for (int64_t k = 0; k < rows; k++)                                                 \
                    m[k * cols + j] -= d * m[k * cols + i];                                        \
            }                                                                                      \
        }                                                                                          \
        return finite;                                                                             \
    }
POWERSGD_GRAM_SCHMIDT(float, powersgd_gram_schmidt_f32)
POWERSGD_GRAM_SCHMIDT(double, powersgd_gram_schmidt_f64)

/* Orthogonalizes the [rows, rank] slice of mem at offset. */
static void powersgd_orthogonalize(td_tensor *mem, int64_t offset, int64_t rows, int64_t rank, double epsilon)
{
    bool ok;
    if (td_tensor_dtype(mem) == TD_FLOAT32)
        ok = powersgd_gram_schmidt_f32((float *)td_tensor_data(mem) + offset, rows, rank, epsilon);
    else
        ok = powersgd_gram_schmidt_f64((double *)td_tensor_data(mem) + offset, rows, rank, epsilon);
    if (!ok)
        TD_LOG_ERROR("The matrices to be orthogonalized has at least a column of all 0s. Please set a small value "
                     "such as 1e-8 as `orthogonalization_epsilon` in PowerSGD state.");
}

/* dst += src, or dst = a - b (both contiguous, same dtype and numel). */
static void powersgd_add(td_tensor *dst, const td_tensor *src)
{
    int64_t n = td_tensor_numel(dst);
    if (td_tensor_dtype(dst) == TD_FLOAT32) {
        float *d = td_tensor_data(dst);
        const float *s = td_tensor_data(src);
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
    } else {
        double *d = td_tensor_data(dst);
        const double *s = td_tensor_data(src);
        for (int64_t i = 0; i < n; i++)
            d[i] += s[i];
    }
}

static void powersgd_sub(td_tensor *dst, const td_tensor *a, const td_tensor *b)
{
    int64_t n = td_tensor_numel(dst);
    if (td_tensor_dtype(dst) == TD_FLOAT32) {
        float *d = td_tensor_data(dst);
        const float *x = td_tensor_data(a), *y = td_tensor_data(b);
        for (int64_t i = 0; i < n; i++)
            d[i] = x[i] - y[i];
    } else {
        double *d = td_tensor_data(dst);
        const double *x = td_tensor_data(a), *y = td_tensor_data(b);
        for (int64_t i = 0; i < n; i++)
            d[i] = x[i] - y[i];
    }
}

/* The [rows, cols] matrix at offset of a flat tensor (a new view). */
static td_status powersgd_matrix_view(td_tensor *flat, int64_t offset, int64_t rows, int64_t cols, td_tensor **out)
{
    td_tensor *slice = NULL;
    TD_TRY(td_tensor_narrow(flat, 0, offset, rows * cols, &slice));
    td_status st = td_tensor_view(slice, TD_SHAPE(rows, cols), out);
    td_tensor_release(slice);
    return st;
}

/* dst_mem[dst_offset as rows x cols] = a @ b (a or b transposed first when asked). */
static td_status powersgd_mm_into(td_tensor *a, bool transpose_a, td_tensor *b, bool transpose_b, td_tensor *dst_mem,
                                  int64_t dst_offset, int64_t rows, int64_t cols)
{
    td_tensor *at = NULL, *bt = NULL, *prod = NULL, *dst = NULL;
    td_status st = TD_OK;
    if (transpose_a)
        st = td_tensor_transpose(a, 0, 1, &at);
    if (st == TD_OK && transpose_b)
        st = td_tensor_transpose(b, 0, 1, &bt);
    if (st == TD_OK)
        st = td_tensor_mm(at ? at : a, bt ? bt : b, &prod);
    if (st == TD_OK)
        st = powersgd_matrix_view(dst_mem, dst_offset, rows, cols, &dst);
    if (st == TD_OK)
        st = td_tensor_copy(dst, prod);
    td_tensor_release(at);
    td_tensor_release(bt);
    td_tensor_release(prod);
    td_tensor_release(dst);
    return st;
}

/* ---- the state --------------------------------------------------------------------------------- */

td_status td_powersgd_state_new(td_pg *pg, int matrix_approximation_rank, int64_t start_powerSGD_iter,
                                double min_compression_rate, bool use_error_feedback, bool warm_start,
                                double orthogonalization_epsilon, uint64_t random_seed, td_powersgd_state **out)
{
    if (!out)
        return error_fmt(TD_ERR_INVALID, "td_powersgd_state_new: out is NULL");
    *out = NULL;
    if (matrix_approximation_rank < 1)
        return error_fmt(TD_ERR_INVALID, "PowerSGD: matrix_approximation_rank must be at least 1, got %d",
                         matrix_approximation_rank);
    if ((use_error_feedback || warm_start) && start_powerSGD_iter <= 1)
        return error_fmt(TD_ERR_INVALID,
                         "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is enabled, "
                         "because PowerSGD can only be applied after the first two iterations in DDP.");
    if (!(orthogonalization_epsilon >= 0) || !isfinite(orthogonalization_epsilon))
        return error_fmt(TD_ERR_INVALID, "PowerSGD: orthogonalization_epsilon must be finite and >= 0, got %g",
                         orthogonalization_epsilon);
    if (isnan(min_compression_rate))
        return error_fmt(TD_ERR_INVALID, "PowerSGD: min_compression_rate is NaN");
    td_powersgd_state *s = TD_NEW(td_powersgd_state);
    s->pg = pg;
    s->rank = matrix_approximation_rank;
    s->start_iter = start_powerSGD_iter;
    s->min_rate = min_compression_rate;
    s->error_feedback = use_error_feedback;
    s->warm_start = warm_start;
    s->epsilon = orthogonalization_epsilon;
    s->rng = random_seed;
    thread_mutex_init(&s->mu);
    TD_LOG_INFO("PowerSGD config: matrix_approximation_rank = %d; start_powerSGD_iter = %" PRId64
                "; min_compression_rate = %g; orthogonalization_epsilon = %g; use_error_feedback = %d; "
                "warm_start = %d; random_seed = %" PRIu64 "; compression_stats_logging_frequency = %d",
                matrix_approximation_rank, start_powerSGD_iter, min_compression_rate, orthogonalization_epsilon,
                use_error_feedback, warm_start, random_seed, POWERSGD_STATS_EVERY);
    *out = s;
    return TD_OK;
}

static void powersgd_bucket_clear(powersgd_bucket *b)
{
    td_tensor_release(b->error);
    td_tensor_release(b->p);
    td_tensor_release(b->q);
    b->error = b->p = b->q = NULL;
}

void td_powersgd_state_free(td_powersgd_state *s)
{
    if (!s)
        return;
    for (int i = 0; i < s->n_buckets; i++) {
        if (s->buckets[i])
            powersgd_bucket_clear(s->buckets[i]);
        free(s->buckets[i]);
    }
    free(s->buckets);
    pthread_mutex_destroy(&s->mu);
    free(s);
}

int64_t td_powersgd_state_iter(const td_powersgd_state *s) { return s ? s->iter : -1; }

td_status td_powersgd_state_compression_stats(const td_powersgd_state *s, double *rate, int64_t *numel_before,
                                              int64_t *numel_after)
{
    if (!s)
        return error_fmt(TD_ERR_INVALID, "td_powersgd_state_compression_stats: state is NULL");
    if (rate)
        *rate = s->numel_after > 0 ? (double)s->numel_before / (double)s->numel_after : 0.0;
    if (numel_before)
        *numel_before = s->numel_before;
    if (numel_after)
        *numel_after = s->numel_after;
    return TD_OK;
}

td_status td_powersgd_state_memory(const td_powersgd_state *s, int bucket_index, td_powersgd_memory which,
                                   td_tensor **out)
{
    if (!s || !out)
        return error_fmt(TD_ERR_INVALID, "td_powersgd_state_memory: state and out must not be NULL");
    *out = NULL;
    static const char *const names[] = {"error", "P", "Q"};
    if (which < TD_POWERSGD_ERROR || which > TD_POWERSGD_Q)
        return error_fmt(TD_ERR_INVALID, "td_powersgd_state_memory: unknown memory %d", (int)which);
    td_powersgd_state *m = (td_powersgd_state *)s;
    pthread_mutex_lock(&m->mu);
    td_tensor *t = NULL;
    if (bucket_index >= 0 && bucket_index < s->n_buckets && s->buckets[bucket_index]) {
        powersgd_bucket *b = s->buckets[bucket_index];
        t = which == TD_POWERSGD_ERROR ? b->error : which == TD_POWERSGD_P ? b->p : b->q;
    }
    td_status st = t ? td_tensor_clone(t, out)
                     : error_fmt(TD_ERR_INVALID, "PowerSGD: bucket %d has no %s memory yet", bucket_index,
                                 names[which]);
    pthread_mutex_unlock(&m->mu);
    return st;
}

/* The memory of bucket `index`, created on first use and reset when the bucket changed shape. */
static powersgd_bucket *powersgd_bucket_of(td_powersgd_state *s, int index, int64_t numel, td_dtype dtype)
{
    pthread_mutex_lock(&s->mu);
    if (index >= s->n_buckets) {
        s->buckets = alloc_resize(s->buckets, sizeof *s->buckets * (size_t)(index + 1));
        for (int i = s->n_buckets; i <= index; i++)
            s->buckets[i] = NULL;
        s->n_buckets = index + 1;
    }
    if (!s->buckets[index])
        s->buckets[index] = TD_NEW(powersgd_bucket);
    powersgd_bucket *b = s->buckets[index];
    if (b->numel != numel || b->dtype != dtype) {
        powersgd_bucket_clear(b);
        b->numel = numel;
        b->dtype = dtype;
    }
    pthread_mutex_unlock(&s->mu);
    return b;
}

/* maybe_increase_iter: once per backward, when its last bucket passes. */
static void powersgd_maybe_increase_iter(td_powersgd_state *s, td_ddp_bucket *bucket)
{
    if (td_ddp_bucket_is_last(bucket)) {
        s->iter++;
        if (s->iter == s->start_iter)
            TD_LOG_INFO("Start to apply PowerSGD after %" PRId64 " iterations.", s->iter);
    }
}

/* ---- the hook ---------------------------------------------------------------------------------- */

static void powersgd_job_free(powersgd_job *j)
{
    if (!j)
        return;
    td_tensor_release(j->buffer);
    td_tensor_release(j->input_copy);
    td_tensor_release(j->error);
    td_tensor_release(j->p);
    td_tensor_release(j->q);
    free(j->mats);
    free(j);
}

/* The local error (input after error feedback minus what the bucket now holds). */
static void powersgd_memorize_error(powersgd_job *j)
{
    if (j->input_copy)
        powersgd_sub(j->error, j->input_copy, j->buffer);
}

/* Q's all_reduce completed: M = P Q^T / world size for each compressed matrix, then the error. */
static td_status powersgd_decompress(td_future *parent, void *arg, td_value **result)
{
    powersgd_job *j = arg;
    td_status st = td_future_status(parent);
    if (st != TD_OK)
        st = td_future_propagate_error(parent);
    if (st == TD_OK)
        st = ddp_divide(j->q, j->world_size);
    for (int i = 0; i < j->n_mats && st == TD_OK; i++) {
        powersgd_matrix *m = &j->mats[i];
        td_tensor *p = NULL, *q = NULL;
        st = powersgd_matrix_view(j->p, m->p_offset, m->rows, m->rank, &p);
        if (st == TD_OK)
            st = powersgd_matrix_view(j->q, m->q_offset, m->cols, m->rank, &q);
        if (st == TD_OK)
            st = powersgd_mm_into(p, false, q, true, j->buffer, m->offset, m->rows, m->cols);
        td_tensor_release(p);
        td_tensor_release(q);
    }
    if (st == TD_OK) {
        powersgd_memorize_error(j);
        *result = td_value_tensor(j->buffer);
    }
    powersgd_job_free(j);
    return st;
}

/* Splits the bucket's parameters into compressed matrices (with their P / Q slices) and the
 * uncompressed rest, counting the compression statistics. */
static void powersgd_plan(td_powersgd_state *s, td_ddp_bucket *bucket, powersgd_job *j, int64_t **unc_offsets,
                          int64_t **unc_numels, int *n_unc, int64_t *p_size, int64_t *q_size)
{
    int n = td_ddp_bucket_num_params(bucket);
    j->mats = TD_NEW_ARRAY(powersgd_matrix, n ? n : 1);
    *unc_offsets = TD_NEW_ARRAY(int64_t, n ? n : 1);
    *unc_numels = TD_NEW_ARRAY(int64_t, n ? n : 1);
    *n_unc = 0;
    *p_size = *q_size = 0;
    for (int k = 0; k < n; k++) {
        const ddp_param *prm = &bucket->ddp->params[bucket->params[k]];
        const td_tensor *t = prm->tensor;
        int64_t numel = prm->numel;
        int64_t rows = td_tensor_ndim(t) > 0 ? td_tensor_sizes(t)[0] : 1;
        int64_t cols = rows > 0 ? numel / rows : 0;
        int64_t rank = rows < cols ? rows : cols;
        if (rank > s->rank)
            rank = s->rank;
        int64_t uncompressed = rows * cols, compressed = (rows + cols) * rank;
        s->numel_before += uncompressed;
        if (rank > 0 && (double)compressed * s->min_rate < (double)uncompressed) {
            j->mats[j->n_mats++] = (powersgd_matrix){prm->offset, rows, cols, rank, *p_size, *q_size};
            *p_size += rows * rank;
            *q_size += cols * rank;
            s->numel_after += compressed;
        } else {
            (*unc_offsets)[*n_unc] = prm->offset;
            (*unc_numels)[*n_unc] = numel;
            (*n_unc)++;
            s->numel_after += uncompressed;
        }
    }
    if (td_ddp_bucket_is_last(bucket) && s->iter >= s->next_stats_report) {
        TD_LOG_INFO("Compression stats: iter %" PRId64 ", total before compression %" PRId64
                    ", total after compression %" PRId64 ", rate %g",
                    s->iter, s->numel_before, s->numel_after,
                    s->numel_after > 0 ? (double)s->numel_before / (double)s->numel_after : 0.0);
        s->next_stats_report = s->iter + POWERSGD_STATS_EVERY;
    }
}

/* Copies the uncompressed tensors into one flat tensor (to_memory) or back (from it). */
static td_status powersgd_gather_uncompressed(td_tensor *buffer, td_tensor *memory, const int64_t *offsets,
                                              const int64_t *numels, int n, bool to_memory)
{
    td_status st = TD_OK;
    int64_t at = 0;
    for (int i = 0; i < n && st == TD_OK; i++) {
        td_tensor *src = NULL, *dst = NULL;
        st = td_tensor_narrow(buffer, 0, offsets[i], numels[i], &src);
        if (st == TD_OK)
            st = td_tensor_narrow(memory, 0, at, numels[i], &dst);
        if (st == TD_OK)
            st = to_memory ? td_tensor_copy(dst, src) : td_tensor_copy(src, dst);
        td_tensor_release(src);
        td_tensor_release(dst);
        at += numels[i];
    }
    return st;
}

/* The compressed path, after start_powerSGD_iter. */
static td_status powersgd_compress(td_powersgd_state *s, td_pg *pg, td_ddp_bucket *bucket, td_future **out)
{
    td_tensor *buffer = td_ddp_bucket_buffer(bucket);
    td_dtype dt = td_tensor_dtype(buffer);
    int index = td_ddp_bucket_index(bucket);
    if (dt != TD_FLOAT32 && dt != TD_FLOAT64)
        return error_fmt(TD_ERR_UNSUPPORTED, "PowerSGD compresses float32 and float64 buckets; bucket %d is %s",
                         index, td_dtype_name(dt));
    int64_t numel = td_tensor_numel(buffer);
    int ws = td_pg_size(pg);
    powersgd_bucket *mem = powersgd_bucket_of(s, index, numel, dt);
    powersgd_job *j = TD_NEW(powersgd_job);
    j->buffer = td_tensor_retain(buffer);
    j->world_size = ws;
    td_status st = TD_OK;

    /* Error feedback: the residual of the last compression joins this input. */
    if (s->error_feedback) {
        if (mem->error) {
            powersgd_add(buffer, mem->error);
        } else {
            TD_LOG_INFO("A zero tensor of length %" PRId64 " that represents local error is created.", numel);
            st = td_tensor_zeros(dt, TD_SHAPE(numel), &mem->error);
        }
        if (st == TD_OK)
            st = td_tensor_clone(buffer, &j->input_copy);
        if (st == TD_OK)
            j->error = td_tensor_retain(mem->error);
    }

    int64_t *unc_offsets = NULL, *unc_numels = NULL, p_size = 0, q_size = 0;
    int n_unc = 0;
    powersgd_plan(s, bucket, j, &unc_offsets, &unc_numels, &n_unc, &p_size, &q_size);
    int64_t unc_size = 0;
    for (int i = 0; i < n_unc; i++)
        unc_size += unc_numels[i];
    td_tensor *unc = NULL;
    if (st == TD_OK && unc_size > 0) {
        st = td_tensor_empty(dt, TD_SHAPE(unc_size), &unc);
        if (st == TD_OK)
            st = powersgd_gather_uncompressed(buffer, unc, unc_offsets, unc_numels, n_unc, true);
    }

    /* P and Q: kept from the last iteration with warm start, else a fresh random Q. */
    bool randomize = !s->warm_start || !mem->p || td_tensor_numel(mem->p) != p_size ||
                     td_tensor_numel(mem->q) != q_size;
    if (st == TD_OK && randomize && j->n_mats > 0) {
        if (!mem->p || td_tensor_numel(mem->p) != p_size || td_tensor_numel(mem->q) != q_size) {
            if (s->warm_start)
                TD_LOG_INFO("Allocating contiguous memory of length %" PRId64 " for Ps, and of length %" PRId64
                            " for Qs, respectively.",
                            p_size, q_size);
            td_tensor_release(mem->p);
            td_tensor_release(mem->q);
            mem->p = mem->q = NULL;
            st = td_tensor_zeros(dt, TD_SHAPE(p_size), &mem->p);
            if (st == TD_OK)
                st = td_tensor_zeros(dt, TD_SHAPE(q_size), &mem->q);
        }
        if (st == TD_OK)
            powersgd_randn(mem->q, powersgd_next(&s->rng) % 1000000000ULL);
    }
    if (st == TD_OK && j->n_mats > 0) {
        j->p = td_tensor_retain(mem->p);
        j->q = td_tensor_retain(mem->q);
        for (int i = 0; i < j->n_mats; i++)
            powersgd_orthogonalize(j->q, j->mats[i].q_offset, j->mats[i].cols, j->mats[i].rank, s->epsilon);
    }

    /* P = M Q for each matrix. */
    td_tensor **views = TD_NEW_ARRAY(td_tensor *, j->n_mats ? j->n_mats : 1);
    for (int i = 0; i < j->n_mats && st == TD_OK; i++) {
        powersgd_matrix *m = &j->mats[i];
        td_tensor *q = NULL;
        st = powersgd_matrix_view(buffer, m->offset, m->rows, m->cols, &views[i]);
        if (st == TD_OK)
            st = powersgd_matrix_view(j->q, m->q_offset, m->cols, m->rank, &q);
        if (st == TD_OK)
            st = powersgd_mm_into(views[i], false, q, false, j->p, m->p_offset, m->rows, m->rank);
        td_tensor_release(q);
    }

    /* The collectives, in the same order on every rank: the uncompressed tensors, then P. */
    td_future *unc_work = NULL, *p_work = NULL, *q_work = NULL;
    if (st == TD_OK && unc)
        st = td_pg_all_reduce(pg, unc, TD_OP_SUM, &unc_work);
    if (st == TD_OK && j->n_mats > 0)
        st = td_pg_all_reduce(pg, j->p, TD_OP_SUM, &p_work);
    td_status w = ddp_settle(unc_work, TD_OK);
    if (st == TD_OK)
        st = w;
    if (st == TD_OK && unc) {
        st = ddp_divide(unc, ws);
        if (st == TD_OK)
            st = powersgd_gather_uncompressed(buffer, unc, unc_offsets, unc_numels, n_unc, false);
    }
    w = ddp_settle(p_work, TD_OK);
    if (st == TD_OK)
        st = w;

    /* Orthogonalize P (no need to divide it: only its span matters), Q = M^T P, all_reduce Q. */
    for (int i = 0; i < j->n_mats && st == TD_OK; i++) {
        powersgd_matrix *m = &j->mats[i];
        td_tensor *p = NULL;
        powersgd_orthogonalize(j->p, m->p_offset, m->rows, m->rank, s->epsilon);
        st = powersgd_matrix_view(j->p, m->p_offset, m->rows, m->rank, &p);
        if (st == TD_OK)
            st = powersgd_mm_into(views[i], true, p, false, j->q, m->q_offset, m->cols, m->rank);
        td_tensor_release(p);
    }
    if (st == TD_OK && j->n_mats > 0)
        st = td_pg_all_reduce(pg, j->q, TD_OP_SUM, &q_work);

    for (int i = 0; i < j->n_mats; i++)
        td_tensor_release(views[i]);
    free(views);
    td_tensor_release(unc);
    free(unc_offsets);
    free(unc_numels);
    if (st != TD_OK) {
        powersgd_job_free(j);
        return st;
    }
    powersgd_maybe_increase_iter(s, bucket);
    if (!q_work) { /* nothing worth compressing: the bucket already holds the average */
        powersgd_memorize_error(j);
        *out = td_future_completed(td_value_tensor(buffer));
        powersgd_job_free(j);
        return TD_OK;
    }
    *out = td_future_then(q_work, powersgd_decompress, j);
    td_future_release(q_work);
    return TD_OK;
}

td_status td_ddp_powersgd_hook(void *state, td_ddp_bucket *bucket, td_future **out)
{
    if (!state || !bucket || !out)
        return error_fmt(TD_ERR_INVALID, "td_ddp_powersgd_hook: state, bucket and out must not be NULL");
    td_powersgd_state *s = state;
    td_pg *pg = s->pg ? s->pg : td_ddp_bucket_group(bucket);
    if (s->iter < s->start_iter) { /* plain averaging until start_powerSGD_iter */
        td_tensor *buffer = td_ddp_bucket_buffer(bucket);
        powersgd_maybe_increase_iter(s, bucket);
        TD_TRY(ddp_divide(buffer, td_pg_size(pg)));
        return td_pg_all_reduce(pg, buffer, TD_OP_SUM, out);
    }
    return powersgd_compress(s, pg, bucket, out);
}
