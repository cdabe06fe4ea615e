/* The PowerSGD comm hook and DistributedSampler (tdist/ddp.h; ../shared/spec/c10d.md C17).
 *
 * PowerSGD runs under DDP on 4 ranks (tcp, shm and threaded). The models' losses are sums of
 * parameter * constant, so each rank's local gradient is a known matrix every rank can compute for
 * all ranks, and the test replays the algorithm locally in double: plain averages before
 * start_powerSGD_iter (exactly, on values that divide exactly), then with warm start every step from
 * the state's Q of the previous iteration; the first compressed step, whose Q is random, is checked
 * through the state's P and Q (P orthonormal, Q = mean(M)^T P, output P Q^T). Also: outputs
 * identical on every rank, error feedback (output + new error = input + old error), the error falling
 * as the rank grows (and a full rank giving the plain average), a float32 regression that still
 * converges, the compression statistics and the state's argument checks. DistributedSampler's
 * partitions are checked against torch's arithmetic. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/autograd.h>
#include <tdist/ddp.h>
#include <tdist/testing.h>

#include "../pg/pg_util.h"

#define HOOK_BACKENDS "tcp,shm"

enum { MAXP = 4, MAXBK = 8, WS_MAX = 4 };

/* ---- dense helpers (row-major doubles) --------------------------------------------------------- */

static void gram_schmidt(double *m, int64_t rows, int64_t cols)
{
    for (int64_t i = 0; i < cols; i++) {
        double sq = 0;
        for (int64_t k = 0; k < rows; k++)
            sq += m[k * cols + i] * m[k * cols + i];
        double norm = sqrt(sq);
        if (norm == 0)
            continue;
        for (int64_t k = 0; k < rows; k++)
            m[k * cols + i] /= norm;
        for (int64_t j = i + 1; j < cols; j++) {
            double dot = 0;
            for (int64_t k = 0; k < rows; k++)
                dot += m[k * cols + i] * m[k * cols + j];
            for (int64_t k = 0; k < rows; k++)
                m[k * cols + j] -= dot * m[k * cols + i];
        }
    }
}

/* c[n, p] (+)= a[n, k] @ b[k, p], a or b read transposed when asked (then stored [k, n] / [p, k]). */
static void matmul(const double *a, bool ta, const double *b, bool tb, double *c, int64_t n, int64_t k, int64_t p,
                   bool accumulate)
{
    for (int64_t i = 0; i < n; i++)
        for (int64_t j = 0; j < p; j++) {
            double s = 0;
            for (int64_t x = 0; x < k; x++)
                s += (ta ? a[x * n + i] : a[i * k + x]) * (tb ? b[j * k + x] : b[x * p + j]);
            c[i * p + j] = accumulate ? c[i * p + j] + s : s;
        }
}

/* The elements of t in row-major order, as doubles (a new array). */
static double *tensor_doubles(td_tensor *t)
{
    int64_t n = td_tensor_numel(t);
    double *out = calloc((size_t)(n ? n : 1), sizeof(double));
    td_tensor *flat = NULL;
    TD_CHECK_OK(td_tensor_reshape(t, TD_SHAPE(n), &flat));
    for (int64_t i = 0; i < n; i++)
        out[i] = pg_test_get(flat, i);
    td_tensor_release(flat);
    return out;
}

/* ---- the model: loss = sum_i sum(param_i * G_i(rank, iteration)) -------------------------------- */

typedef struct lin_model {
    int n;
    td_tensor *p[MAXP];
    int64_t numel[MAXP], rows[MAXP], cols[MAXP];
    td_dtype dt;
} lin_model;

static void lin_model_make(lin_model *m, td_dtype dt, const td_shape *shapes, int n)
{
    memset(m, 0, sizeof *m);
    m->dt = dt;
    m->n = n;
    for (int i = 0; i < n; i++) {
        TD_CHECK_OK(td_tensor_zeros(dt, shapes[i], &m->p[i]));
        TD_CHECK_OK(td_autograd_set_requires_grad(m->p[i], true));
        m->numel[i] = td_tensor_numel(m->p[i]);
        m->rows[i] = shapes[i].ndim > 0 ? shapes[i].d[0] : 1;
        m->cols[i] = m->numel[i] / m->rows[i];
    }
}

static void lin_model_free(lin_model *m)
{
    for (int i = 0; i < m->n; i++)
        td_tensor_release(m->p[i]);
}

/* Rank r's gradient of parameter i at iteration t, element e: multiples of 1/8, so that dividing by
 * 4 ranks and summing are exact in any order. The row- and column-dependent terms give every
 * matrix a spread of singular values. */
static double grad_value(int i, int r, int t, int64_t e, int64_t cols)
{
    int64_t row = e / cols, col = e % cols;
    int64_t h = (e * 7 + r * 13 + t * 5 + i * 3) % 19 - 9;
    return (double)h / 8.0 + (double)((row * (col + 1) + r + 2 * t) % 5) / 4.0;
}

static td_tensor *grad_tensor(const lin_model *m, int i, int r, int t)
{
    td_tensor *g = NULL;
    TD_CHECK_OK(td_tensor_empty(m->dt, td_tensor_shape(m->p[i]), &g));
    td_tensor *flat = NULL;
    TD_CHECK_OK(td_tensor_view(g, TD_SHAPE(m->numel[i]), &flat));
    for (int64_t e = 0; e < m->numel[i]; e++)
        TD_CHECK_OK(td_tensor_set_f64(flat, &e, grad_value(i, r, t, e, m->cols[i])));
    td_tensor_release(flat);
    return g;
}

/* One DDP step whose local gradients are G(rank, t); the .grad left is what DDP reduced. */
static void lin_step(td_ddp *ddp, lin_model *m, int rank, int t)
{
    for (int i = 0; i < m->n; i++)
        TD_CHECK_OK(td_autograd_set_grad(m->p[i], NULL));
    TD_CHECK_OK(td_ddp_pre_forward(ddp));
    td_tensor *loss = NULL;
    for (int i = 0; i < m->n; i++) {
        td_tensor *g = grad_tensor(m, i, rank, t), *prod = NULL, *s = NULL;
        TD_CHECK_OK(td_autograd_mul(m->p[i], g, &prod));
        TD_CHECK_OK(td_autograd_sum(prod, &s));
        if (loss) {
            td_tensor *acc = NULL;
            TD_CHECK_OK(td_autograd_add(loss, s, &acc));
            td_tensor_release(loss);
            td_tensor_release(s);
            loss = acc;
        } else {
            loss = s;
        }
        td_tensor_release(g);
        td_tensor_release(prod);
    }
    TD_CHECK_OK(td_ddp_post_forward(ddp, &loss, 1));
    TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
    td_tensor_release(loss);
}

/* ---- a probe around the hook: records each bucket's parameters ------------------------------------ */

typedef struct probe {
    td_powersgd_state *ps;
    const lin_model *m;
    int layout[MAXBK][MAXP]; /* model parameter indices, in bucket order */
    int n_layout[MAXBK];
    int n_buckets;
    int calls;
} probe;

static td_status probe_hook(void *state, td_ddp_bucket *bucket, td_future **out)
{
    probe *pr = state;
    int b = td_ddp_bucket_index(bucket);
    if (b >= 0 && b < MAXBK) {
        pr->n_layout[b] = td_ddp_bucket_num_params(bucket);
        for (int k = 0; k < pr->n_layout[b] && k < MAXP; k++) {
            td_tensor *t = td_ddp_bucket_param(bucket, k);
            pr->layout[b][k] = -1;
            for (int i = 0; i < pr->m->n; i++)
                if (pr->m->p[i] == t)
                    pr->layout[b][k] = i;
        }
        if (b + 1 > pr->n_buckets)
            pr->n_buckets = b + 1;
    }
    pr->calls++;
    return td_ddp_powersgd_hook(pr->ps, bucket, out);
}

/* ---- the reference: every rank's PowerSGD replayed in double ------------------------------------ */

typedef struct reference {
    int ws, rank_r;
    double min_rate;
    double *err[WS_MAX][MAXP]; /* each rank's error feedback memory, per parameter */
    bool compressing;          /* the error memories exist */
} reference;

static bool ref_compressed(const reference *ref, const lin_model *m, int i, int64_t *rank_out)
{
    int64_t rows = m->rows[i], cols = m->cols[i];
    int64_t rank = rows < cols ? rows : cols;
    if (rank > ref->rank_r)
        rank = ref->rank_r;
    *rank_out = rank;
    return (double)((rows + cols) * rank) * ref->min_rate < (double)(rows * cols);
}

/* M_r = G_r + e_r for every rank (new arrays). */
static double **ref_inputs(reference *ref, const lin_model *m, int i, int t)
{
    double **ms = calloc((size_t)ref->ws, sizeof *ms);
    for (int r = 0; r < ref->ws; r++) {
        ms[r] = calloc((size_t)m->numel[i], sizeof(double));
        for (int64_t e = 0; e < m->numel[i]; e++)
            ms[r][e] = grad_value(i, r, t, e, m->cols[i]) + (ref->compressing ? ref->err[r][i][e] : 0.0);
    }
    return ms;
}

static void ref_free_inputs(reference *ref, double **ms)
{
    for (int r = 0; r < ref->ws; r++)
        free(ms[r]);
    free(ms);
}

static void check_close(const double *got, const double *want, int64_t n, double tol, const char *what, int t)
{
    for (int64_t e = 0; e < n; e++)
        TD_CHECK_MSG(fabs(got[e] - want[e]) <= tol * (1.0 + fabs(want[e])),
                     "%s, iteration %d, element %lld: got %.17g, want %.17g", what, t, (long long)e, got[e], want[e]);
}

/* Checks iteration t's reduced gradients, the state's error, P and Q memories against the replay.
 * first: the first compressed iteration, whose random Q only the state knows (P is taken from it). */
static void ref_check_compressed(reference *ref, const lin_model *m, const probe *pr, td_powersgd_state *ps,
                                 double **q_prev, int rank, int t, bool first)
{
    if (!ref->compressing) {
        for (int r = 0; r < ref->ws; r++)
            for (int i = 0; i < m->n; i++)
                ref->err[r][i] = calloc((size_t)m->numel[i], sizeof(double));
        ref->compressing = true;
    }
    for (int b = 0; b < pr->n_buckets; b++) {
        td_tensor *pt = NULL, *qt = NULL, *et = NULL;
        double *pmem = NULL, *qmem = NULL, *emem = NULL;
        if (td_powersgd_state_memory(ps, b, TD_POWERSGD_P, &pt) == TD_OK) {
            pmem = tensor_doubles(pt);
            TD_CHECK_OK(td_powersgd_state_memory(ps, b, TD_POWERSGD_Q, &qt));
            qmem = tensor_doubles(qt);
        }
        TD_CHECK_OK(td_powersgd_state_memory(ps, b, TD_POWERSGD_ERROR, &et));
        emem = tensor_doubles(et);
        int64_t off = 0, p_off = 0, q_off = 0;
        for (int k = 0; k < pr->n_layout[b]; k++) {
            int i = pr->layout[b][k];
            TD_CHECK(i >= 0);
            int64_t rows = m->rows[i], cols = m->cols[i], n = m->numel[i], rank_k = 0;
            double **ms = ref_inputs(ref, m, i, t);
            double *out = calloc((size_t)n, sizeof(double));
            if (ref_compressed(ref, m, i, &rank_k)) {
                TD_CHECK_MSG(pmem && qmem, "bucket %d compresses parameter %d but has no P / Q memory", b, i);
                double *p = calloc((size_t)(rows * rank_k), sizeof(double));
                double *q = calloc((size_t)(cols * rank_k), sizeof(double));
                if (first) {
                    memcpy(p, pmem + p_off, sizeof(double) * (size_t)(rows * rank_k));
                    double *ptp = calloc((size_t)(rank_k * rank_k), sizeof(double)), *eye = calloc((size_t)(rank_k * rank_k), sizeof(double));
                    matmul(p, true, p, false, ptp, rank_k, rows, rank_k, false);
                    for (int64_t x = 0; x < rank_k; x++)
                        eye[x * rank_k + x] = 1.0;
                    check_close(ptp, eye, rank_k * rank_k, 1e-9, "P^T P (P orthonormal)", t);
                    free(ptp);
                    free(eye);
                } else { /* warm start: orthogonalize last Q, P = sum M_r Q, orthogonalize P */
                    double *q0 = calloc((size_t)(cols * rank_k), sizeof(double));
                    memcpy(q0, q_prev[b] + q_off, sizeof(double) * (size_t)(cols * rank_k));
                    gram_schmidt(q0, cols, rank_k);
                    for (int r = 0; r < ref->ws; r++)
                        matmul(ms[r], false, q0, false, p, rows, cols, rank_k, r > 0);
                    gram_schmidt(p, rows, rank_k);
                    check_close(pmem + p_off, p, rows * rank_k, 1e-9, "the state's P", t);
                    free(q0);
                }
                for (int r = 0; r < ref->ws; r++)
                    matmul(ms[r], true, p, false, q, cols, rows, rank_k, r > 0);
                for (int64_t e = 0; e < cols * rank_k; e++)
                    q[e] /= ref->ws;
                check_close(qmem + q_off, q, cols * rank_k, 1e-9, "the state's Q", t);
                matmul(p, false, q, true, out, rows, rank_k, cols, false);
                p_off += rows * rank_k;
                q_off += cols * rank_k;
                free(p);
                free(q);
            } else {
                for (int r = 0; r < ref->ws; r++)
                    for (int64_t e = 0; e < n; e++)
                        out[e] += ms[r][e];
                for (int64_t e = 0; e < n; e++)
                    out[e] /= ref->ws;
            }
            td_tensor *g = td_autograd_get_grad(m->p[i]);
            TD_CHECK(g != NULL);
            double *got = tensor_doubles(g);
            td_tensor_release(g);
            char what[64];
            snprintf(what, sizeof what, "parameter %d's reduced gradient", i);
            check_close(got, out, n, 1e-9, what, t);
            /* Error feedback: the new error is the input minus the output, so output + error = input. */
            for (int r = 0; r < ref->ws; r++)
                for (int64_t e = 0; e < n; e++)
                    ref->err[r][i][e] = ms[r][e] - out[e];
            check_close(emem + off, ref->err[rank][i], n, 1e-9, "the state's error memory", t);
            for (int64_t e = 0; e < n; e++)
                TD_CHECK_MSG(fabs(got[e] + emem[off + e] - ms[rank][e]) <= 1e-12 * (1.0 + fabs(ms[rank][e])),
                             "output + error differs from the input at element %lld", (long long)e);
            free(got);
            free(out);
            ref_free_inputs(ref, ms);
            off += n;
        }
        TD_CHECK_EQ(off, td_tensor_numel(et));
        /* Keep this Q for the next iteration's warm start. */
        free(q_prev[b]);
        q_prev[b] = qmem;
        qmem = NULL;
        free(pmem);
        free(emem);
        td_tensor_release(pt);
        td_tensor_release(qt);
        td_tensor_release(et);
    }
}

static void ref_free(reference *ref, const lin_model *m)
{
    if (ref->compressing)
        for (int r = 0; r < ref->ws; r++)
            for (int i = 0; i < m->n; i++)
                free(ref->err[r][i]);
}

/* Every rank holds the same reduced gradients, bit for bit. */
static void check_same_on_all_ranks(td_pg *pg, const lin_model *m, int t)
{
    int ws = td_pg_size(pg);
    for (int i = 0; i < m->n; i++) {
        td_tensor *g = td_autograd_get_grad(m->p[i]), *flat = NULL, *all = NULL;
        TD_CHECK_OK(td_tensor_reshape(g, TD_SHAPE(m->numel[i]), &flat));
        TD_CHECK_OK(td_tensor_empty(m->dt, TD_SHAPE(ws * m->numel[i]), &all));
        TD_CHECK_OK(td_pg_all_gather_into_tensor(pg, all, flat, NULL));
        const double *a = td_tensor_data(all);
        for (int r = 1; r < ws; r++)
            TD_CHECK_MSG(memcmp(a, a + r * m->numel[i], sizeof(double) * (size_t)m->numel[i]) == 0,
                         "iteration %d: rank %d's reduced gradient of parameter %d differs from rank 0's", t, r, i);
        td_tensor_release(g);
        td_tensor_release(flat);
        td_tensor_release(all);
    }
}

/* Four parameters: a compressed [12, 10], a bias (uncompressed: a vector), a [6, 12] too small to
 * be worth it at rank 2, and a [16, 2, 4] seen as [16, 8]; small buckets, so that several run. */
TD_PG_TEST_ON(powersgd_matches_reference, 4, HOOK_BACKENDS, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    lin_model m;
    td_shape shapes[] = {TD_SHAPE(12, 10), TD_SHAPE(12), TD_SHAPE(6, 12), TD_SHAPE(16, 2, 4)};
    lin_model_make(&m, TD_FLOAT64, shapes, 4);
    td_ddp_options o = TD_DDP_OPTIONS_INIT;
    o.first_bucket_bytes = 1000;
    o.bucket_cap_bytes = 1600;
    td_ddp *ddp = NULL;
    TD_CHECK_OK(td_ddp_create(pg, m.p, m.n, NULL, 0, &o, &ddp));
    probe pr = {0};
    pr.m = &m;
    TD_CHECK_OK(td_powersgd_state_new(NULL, 2, 2, 2.0, true, true, 0.0, 7, &pr.ps));
    TD_CHECK_OK(td_ddp_register_comm_hook(ddp, &pr, probe_hook));
    reference ref = {.ws = ctx->world_size, .rank_r = 2, .min_rate = 2.0};
    double *q_prev[MAXBK] = {0};
    const int iters = 6;
    for (int t = 0; t < iters; t++) {
        TD_CHECK_EQ(td_powersgd_state_iter(pr.ps), t);
        lin_step(ddp, &m, ctx->rank, t);
        check_same_on_all_ranks(pg, &m, t);
        if (t < 2) { /* plain averaging, exact on these values */
            for (int i = 0; i < m.n; i++) {
                td_tensor *want = NULL, *g = td_autograd_get_grad(m.p[i]);
                TD_CHECK_OK(td_tensor_zeros(m.dt, td_tensor_shape(m.p[i]), &want));
                for (int r = 0; r < ctx->world_size; r++) {
                    td_tensor *gr = grad_tensor(&m, i, r, t), *sum = NULL;
                    TD_CHECK_OK(td_tensor_add(want, gr, &sum));
                    td_tensor_release(want);
                    td_tensor_release(gr);
                    want = sum;
                }
                td_tensor *avg = NULL;
                TD_CHECK_OK(td_tensor_div_scalar(want, td_scalar_int(ctx->world_size), &avg));
                TD_CHECK_MSG(td_tensor_equal(g, avg), "iteration %d: parameter %d is not the exact plain average", t, i);
                td_tensor_release(want);
                td_tensor_release(avg);
                td_tensor_release(g);
                td_tensor *none = NULL;
                TD_CHECK_ERR(td_powersgd_state_memory(pr.ps, 0, TD_POWERSGD_ERROR, &none), TD_ERR_INVALID,
                             "has no error memory yet");
            }
        } else {
            ref_check_compressed(&ref, &m, &pr, pr.ps, q_prev, ctx->rank, t, t == 2);
        }
    }
    TD_CHECK_EQ(td_powersgd_state_iter(pr.ps), iters);
    TD_CHECK(pr.n_buckets >= 2);
    /* Per compressed call: 120 + 12 + 72 + 128 elements before, (12 + 10) * 2 + 12 + 72 + (16 + 8) * 2 after. */
    double rate = 0;
    int64_t before = 0, after = 0;
    TD_CHECK_OK(td_powersgd_state_compression_stats(pr.ps, &rate, &before, &after));
    TD_CHECK_EQ(before, (iters - 2) * 332);
    TD_CHECK_EQ(after, (iters - 2) * 176);
    TD_CHECK_NEAR(rate, 332.0 / 176.0, 1e-12);
    for (int b = 0; b < MAXBK; b++)
        free(q_prev[b]);
    ref_free(&ref, &m);
    td_ddp_free(ddp);
    td_powersgd_state_free(pr.ps);
    lin_model_free(&m);
    pg_test_done(ctx, pg);
}

/* Without warm start or error feedback PowerSGD may start at once (iteration 0): Q is drawn afresh
 * every time, and the outputs are still the same on every rank and the projection of the average
 * on P's span. */
TD_PG_TEST_ON(powersgd_cold_start_from_zero, 4, HOOK_BACKENDS, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    lin_model m;
    td_shape shapes[] = {TD_SHAPE(12, 10)};
    lin_model_make(&m, TD_FLOAT64, shapes, 1);
    td_ddp *ddp = NULL;
    TD_CHECK_OK(td_ddp_create(pg, m.p, m.n, NULL, 0, NULL, &ddp));
    td_powersgd_state *ps = NULL;
    TD_CHECK_OK(td_powersgd_state_new(pg, 1, 0, 2.0, false, false, 1e-8, 0, &ps));
    TD_CHECK_OK(td_ddp_register_comm_hook(ddp, ps, td_ddp_powersgd_hook));
    double *last_q = NULL;
    for (int t = 0; t < 3; t++) {
        lin_step(ddp, &m, ctx->rank, t);
        check_same_on_all_ranks(pg, &m, t);
        td_tensor *pt = NULL, *qt = NULL, *none = NULL;
        TD_CHECK_OK(td_powersgd_state_memory(ps, 0, TD_POWERSGD_P, &pt));
        TD_CHECK_OK(td_powersgd_state_memory(ps, 0, TD_POWERSGD_Q, &qt));
        TD_CHECK_ERR(td_powersgd_state_memory(ps, 0, TD_POWERSGD_ERROR, &none), TD_ERR_INVALID, "no error memory");
        double *p = tensor_doubles(pt), *q = tensor_doubles(qt), *out = calloc(120, sizeof(double));
        matmul(p, false, q, true, out, 12, 1, 10, false);
        td_tensor *g = td_autograd_get_grad(m.p[0]);
        double *got = tensor_doubles(g);
        check_close(got, out, 120, 1e-12, "P Q^T", t);
        if (last_q) /* a fresh random start each iteration */
            TD_CHECK(memcmp(last_q, q, 10 * sizeof(double)) != 0);
        free(last_q);
        last_q = q;
        free(p);
        free(out);
        free(got);
        td_tensor_release(g);
        td_tensor_release(pt);
        td_tensor_release(qt);
    }
    free(last_q);
    td_ddp_free(ddp);
    td_powersgd_state_free(ps);
    lin_model_free(&m);
    pg_test_done(ctx, pg);
}

/* The first compressed step's error ||output - mean|| for ranks 1, 2, 4 and 8 on an [8, 8] matrix:
 * it falls as the rank grows, and at full rank the output is the plain average. */
TD_PG_TEST_ON(powersgd_error_falls_with_rank, 4, HOOK_BACKENDS, .timeout_s = 90)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    const int ranks[] = {1, 2, 4, 8};
    double errs[4];
    for (int k = 0; k < 4; k++) {
        lin_model m;
        td_shape shapes[] = {TD_SHAPE(8, 8)};
        lin_model_make(&m, TD_FLOAT64, shapes, 1);
        td_ddp *ddp = NULL;
        TD_CHECK_OK(td_ddp_create(pg, m.p, m.n, NULL, 0, NULL, &ddp));
        td_powersgd_state *ps = NULL;
        /* min_compression_rate 0.25: even rank 8 ((8 + 8) * 8 * 0.25 < 64) is compressed. */
        TD_CHECK_OK(td_powersgd_state_new(NULL, ranks[k], 2, 0.25, true, true, 0.0, 3, &ps));
        TD_CHECK_OK(td_ddp_register_comm_hook(ddp, ps, td_ddp_powersgd_hook));
        for (int t = 0; t < 3; t++)
            lin_step(ddp, &m, ctx->rank, t);
        td_tensor *g = td_autograd_get_grad(m.p[0]);
        double *got = tensor_doubles(g), err = 0;
        for (int64_t e = 0; e < 64; e++) {
            double mean = 0;
            for (int r = 0; r < ctx->world_size; r++)
                mean += grad_value(0, r, 2, e, 8);
            mean /= ctx->world_size;
            double d = got[e] - mean;
            err += d * d;
        }
        errs[k] = sqrt(err);
        free(got);
        td_tensor_release(g);
        int64_t before = 0, after = 0;
        TD_CHECK_OK(td_powersgd_state_compression_stats(ps, NULL, &before, &after));
        TD_CHECK_EQ(before, 64);
        TD_CHECK_EQ(after, 16 * ranks[k]);
        td_ddp_free(ddp);
        td_powersgd_state_free(ps);
        lin_model_free(&m);
    }
    for (int k = 1; k < 4; k++)
        TD_CHECK_MSG(errs[k] < errs[k - 1], "rank %d's error %g is not below rank %d's %g", ranks[k], errs[k],
                     ranks[k - 1], errs[k - 1]);
    TD_CHECK_MSG(errs[0] > 1e-3, "rank 1 reproduced the average (error %g): the test matrix is too simple", errs[0]);
    TD_CHECK_MSG(errs[3] < 1e-12, "the full-rank approximation is off the average by %g", errs[3]);
    pg_test_done(ctx, pg);
}

/* Uneven inputs: rank r has 4 + r steps under Join; the joined ranks shadow the compressed buckets
 * through the same hook (zeros in, their own error memories moving), so the collectives still
 * match, every state counts the 7 backward passes, and all ranks end with the same parameters. */
TD_PG_TEST_ON(powersgd_under_join, 4, HOOK_BACKENDS, .timeout_s = 60)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    lin_model m;
    td_shape shapes[] = {TD_SHAPE(12, 10), TD_SHAPE(12)};
    lin_model_make(&m, TD_FLOAT64, shapes, 2);
    td_ddp *ddp = NULL;
    TD_CHECK_OK(td_ddp_create(pg, m.p, m.n, NULL, 0, NULL, &ddp));
    td_powersgd_state *ps = NULL;
    TD_CHECK_OK(td_powersgd_state_new(NULL, 1, 2, 2.0, true, true, 0.0, 5, &ps));
    TD_CHECK_OK(td_ddp_register_comm_hook(ddp, ps, td_ddp_powersgd_hook));
    TD_CHECK_OK(td_ddp_join_begin(ddp, true, false));
    for (int t = 0; t < 4 + ctx->rank; t++) {
        lin_step(ddp, &m, ctx->rank, t);
        for (int i = 0; i < m.n; i++) {
            td_tensor *g = td_autograd_get_grad(m.p[i]);
            double *pd = td_tensor_data(m.p[i]);
            const double *gd = td_tensor_data(g);
            for (int64_t e = 0; e < m.numel[i]; e++)
                pd[e] -= 0.01 * gd[e];
            td_tensor_release(g);
        }
    }
    TD_CHECK_OK(td_ddp_join_end(ddp));
    TD_CHECK_EQ(td_powersgd_state_iter(ps), 4 + ctx->world_size - 1);
    for (int i = 0; i < m.n; i++) {
        td_tensor *c = NULL;
        TD_CHECK_OK(td_tensor_clone(m.p[i], &c));
        TD_CHECK_OK(td_pg_broadcast(pg, c, 0, NULL));
        TD_CHECK_MSG(td_tensor_equal(c, m.p[i]), "parameter %d differs from rank 0's after join", i);
        td_tensor_release(c);
    }
    td_ddp_free(ddp);
    td_powersgd_state_free(ps);
    lin_model_free(&m);
    pg_test_done(ctx, pg);
}

/* ---- training still converges (float32) ------------------------------------------------------ */

static float hash_unit(uint32_t x)
{
    x ^= x >> 16;
    x *= 0x7feb352dU;
    x ^= x >> 15;
    x *= 0x846ca68bU;
    x ^= x >> 16;
    return (float)(x % 2001) / 1000.0f - 1.0f;
}

/* Linear regression y = x W*^T + b* on each rank's own batches: returns the loss of each step (the
 * mean over ranks comes from the local losses all_reduced). hook NULL: plain DDP. */
static void regression(td_pg *pg, int rank, bool powersgd, int steps, double *losses)
{
    enum { IN = 24, OUT = 12, BATCH = 16 };
    td_tensor *w = NULL, *b = NULL;
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(OUT, IN), &w));
    TD_CHECK_OK(td_tensor_zeros(TD_FLOAT32, TD_SHAPE(OUT), &b));
    TD_CHECK_OK(td_autograd_set_requires_grad(w, true));
    TD_CHECK_OK(td_autograd_set_requires_grad(b, true));
    td_tensor *params[] = {w, b};
    td_ddp *ddp = NULL;
    TD_CHECK_OK(td_ddp_create(pg, params, 2, NULL, 0, NULL, &ddp));
    td_powersgd_state *ps = NULL;
    if (powersgd) {
        TD_CHECK_OK(td_powersgd_state_new(NULL, 1, 2, 2.0, true, true, 0.0, 11, &ps));
        TD_CHECK_OK(td_ddp_register_comm_hook(ddp, ps, td_ddp_powersgd_hook));
    }
    float wstar[OUT * IN], bstar[OUT];
    for (int i = 0; i < OUT * IN; i++)
        wstar[i] = hash_unit(1000u + (uint32_t)i);
    for (int i = 0; i < OUT; i++)
        bstar[i] = hash_unit(5000u + (uint32_t)i);
    for (int t = 0; t < steps; t++) {
        float xs[BATCH * IN], ys[BATCH * OUT];
        for (int i = 0; i < BATCH * IN; i++)
            xs[i] = hash_unit((uint32_t)(rank * 1000003 + t * 7919 + i));
        for (int n = 0; n < BATCH; n++)
            for (int o = 0; o < OUT; o++) {
                float s = bstar[o];
                for (int k = 0; k < IN; k++)
                    s += xs[n * IN + k] * wstar[o * IN + k];
                ys[n * OUT + o] = s;
            }
        td_tensor *x = NULL, *y = NULL, *wt = NULL, *xw = NULL, *pred = NULL, *d = NULL, *sq = NULL, *loss = NULL;
        TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT32, TD_SHAPE(BATCH, IN), xs, &x));
        TD_CHECK_OK(td_tensor_from_buffer(TD_FLOAT32, TD_SHAPE(BATCH, OUT), ys, &y));
        TD_CHECK_OK(td_autograd_set_grad(w, NULL));
        TD_CHECK_OK(td_autograd_set_grad(b, NULL));
        TD_CHECK_OK(td_ddp_pre_forward(ddp));
        TD_CHECK_OK(td_autograd_transpose(w, 0, 1, &wt));
        TD_CHECK_OK(td_autograd_mm(x, wt, &xw));
        TD_CHECK_OK(td_autograd_add(xw, b, &pred));
        TD_CHECK_OK(td_autograd_sub(pred, y, &d));
        TD_CHECK_OK(td_autograd_mul(d, d, &sq));
        TD_CHECK_OK(td_autograd_mean(sq, &loss));
        TD_CHECK_OK(td_ddp_post_forward(ddp, &loss, 1));
        TD_CHECK_OK(td_autograd_backward(loss, NULL, false));
        td_tensor *lsum = NULL;
        TD_CHECK_OK(td_tensor_clone(loss, &lsum));
        TD_CHECK_OK(td_pg_all_reduce(pg, lsum, TD_OP_SUM, NULL));
        losses[t] = pg_test_get(lsum, 0) / td_pg_size(pg);
        td_tensor_release(lsum);
        TD_NO_GRAD
        {
            td_tensor *ps_[] = {w, b};
            for (int k = 0; k < 2; k++) {
                td_tensor *g = td_autograd_get_grad(ps_[k]);
                float *pd = td_tensor_data(ps_[k]);
                const float *gd = td_tensor_data(g);
                for (int64_t e = 0; e < td_tensor_numel(ps_[k]); e++)
                    pd[e] -= 3.0f * gd[e];
                td_tensor_release(g);
            }
        }
        td_tensor *all[] = {x, y, wt, xw, pred, d, sq, loss};
        for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
            td_tensor_release(all[i]);
    }
    td_ddp_free(ddp);
    td_powersgd_state_free(ps);
    td_tensor_release(w);
    td_tensor_release(b);
}

TD_PG_TEST_ON(powersgd_training_converges, 4, HOOK_BACKENDS, .timeout_s = 120)
{
    td_pg *pg = pg_test_init(ctx, NULL);
    enum { STEPS = 150 };
    double plain[STEPS], compressed[STEPS];
    regression(pg, ctx->rank, false, STEPS, plain);
    regression(pg, ctx->rank, true, STEPS, compressed);
    if (ctx->rank == 0)
        printf("regression loss: start %.4g, plain DDP %.4g, PowerSGD rank 1 %.4g\n", compressed[0],
               plain[STEPS - 1], compressed[STEPS - 1]);
    TD_CHECK_NEAR(plain[0], compressed[0], 1e-6);
    TD_CHECK_MSG(compressed[STEPS - 1] < 0.01 * compressed[0], "PowerSGD's loss went from %g to %g only",
                 compressed[0], compressed[STEPS - 1]);
    TD_CHECK_MSG(plain[STEPS - 1] < 0.01 * plain[0], "plain DDP's loss went from %g to %g only", plain[0],
                 plain[STEPS - 1]);
    pg_test_done(ctx, pg);
}

/* ---- argument checks ---------------------------------------------------------------------------- */

TD_TEST(powersgd_state_checks)
{
    td_powersgd_state *ps = NULL;
    TD_CHECK_ERR(td_powersgd_state_new(NULL, 1, 1, 2.0, true, false, 0.0, 0, &ps), TD_ERR_INVALID,
                 "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is enabled, because "
                 "PowerSGD can only be applied after the first two iterations in DDP.");
    TD_CHECK_ERR(td_powersgd_state_new(NULL, 1, 0, 2.0, false, true, 0.0, 0, &ps), TD_ERR_INVALID,
                 "Expect `start_powerSGD_iter` > 1");
    TD_CHECK_ERR(td_powersgd_state_new(NULL, 0, 1000, 2.0, true, true, 0.0, 0, &ps), TD_ERR_INVALID,
                 "matrix_approximation_rank");
    TD_CHECK_ERR(td_powersgd_state_new(NULL, 1, 1000, 2.0, true, true, -1.0, 0, &ps), TD_ERR_INVALID,
                 "orthogonalization_epsilon");
    TD_CHECK(ps == NULL);
    TD_CHECK_OK(td_powersgd_state_new(NULL, 1, 1000, 2.0, true, true, 0.0, 0, &ps));
    TD_CHECK_EQ(td_powersgd_state_iter(ps), 0);
    double rate = -1;
    int64_t before = -1, after = -1;
    TD_CHECK_OK(td_powersgd_state_compression_stats(ps, &rate, &before, &after));
    TD_CHECK(rate == 0 && before == 0 && after == 0);
    td_tensor *t = NULL;
    TD_CHECK_ERR(td_powersgd_state_memory(ps, 0, TD_POWERSGD_Q, &t), TD_ERR_INVALID, "bucket 0 has no Q memory yet");
    td_future *f = NULL;
    TD_CHECK_ERR(td_ddp_powersgd_hook(ps, NULL, &f), TD_ERR_INVALID, "must not be NULL");
    td_powersgd_state_free(ps);
    td_powersgd_state_free(NULL);
}

/* ---- DistributedSampler ------------------------------------------------------------------------- */

static int64_t *sampler_take(int64_t len, int n, int r, bool shuffle, int64_t seed, int64_t epoch, bool drop_last,
                             int64_t *count)
{
    TD_CHECK_OK(td_distributed_sampler_indices(len, n, r, shuffle, seed, epoch, drop_last, NULL, count));
    int64_t *out = calloc((size_t)(*count ? *count : 1), sizeof(int64_t));
    int64_t again = -1;
    TD_CHECK_OK(td_distributed_sampler_indices(len, n, r, shuffle, seed, epoch, drop_last, out, &again));
    TD_CHECK_EQ(again, *count);
    return out;
}

static void check_indices(const int64_t *got, int64_t n, const int64_t *want, const char *what)
{
    for (int64_t i = 0; i < n; i++)
        TD_CHECK_MSG(got[i] == want[i], "%s: index %lld is %lld, want %lld", what, (long long)i, (long long)got[i],
                     (long long)want[i]);
}

TD_TEST(sampler_partitions_like_torch)
{
    int64_t n = 0;
    /* 10 items on 4 replicas: 3 each, the list padded with 0 and 1 (torch's indices[r:12:4]). */
    static const int64_t pad[4][3] = {{0, 4, 8}, {1, 5, 9}, {2, 6, 0}, {3, 7, 1}};
    for (int r = 0; r < 4; r++) {
        int64_t *got = sampler_take(10, 4, r, false, 0, 0, false, &n);
        TD_CHECK_EQ(n, 3);
        check_indices(got, n, pad[r], "10 on 4, padded");
        free(got);
    }
    /* drop_last: 2 each, items 8 and 9 dropped. */
    static const int64_t drop[4][2] = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
    for (int r = 0; r < 4; r++) {
        int64_t *got = sampler_take(10, 4, r, false, 0, 0, true, &n);
        TD_CHECK_EQ(n, 2);
        check_indices(got, n, drop[r], "10 on 4, drop_last");
        free(got);
    }
    /* Padding longer than the list: 2 items on 5 replicas repeat [0, 1, 0, 1, 0]. */
    for (int r = 0; r < 5; r++) {
        int64_t *got = sampler_take(2, 5, r, false, 0, 0, false, &n);
        TD_CHECK_EQ(n, 1);
        TD_CHECK_EQ(got[0], r % 2);
        free(got);
        TD_CHECK_OK(td_distributed_sampler_indices(2, 5, r, false, 0, 0, true, NULL, &n));
        TD_CHECK_EQ(n, 0); /* drop_last with fewer items than replicas: nothing */
    }
    /* Even splits need no padding and drop nothing, with or without drop_last. */
    for (int d = 0; d < 2; d++) {
        TD_CHECK_OK(td_distributed_sampler_num_samples(12, 4, d == 1, &n));
        TD_CHECK_EQ(n, 3);
    }
    TD_CHECK_OK(td_distributed_sampler_num_samples(0, 3, false, &n));
    TD_CHECK_EQ(n, 0);
    TD_CHECK_OK(td_distributed_sampler_indices(0, 3, 2, true, 0, 0, false, NULL, &n));
    TD_CHECK_EQ(n, 0);
    TD_CHECK_OK(td_distributed_sampler_num_samples(11, 4, true, &n));
    TD_CHECK_EQ(n, 2);
    TD_CHECK_OK(td_distributed_sampler_num_samples(11, 4, false, &n));
    TD_CHECK_EQ(n, 3);
}

/* Shuffled: the ranks' lists together cover the dataset (every item once, the padding repeats the
 * permutation's first items); with drop_last they are disjoint. */
TD_TEST(sampler_shuffle_covers_and_differs_by_epoch)
{
    const int64_t len = 103;
    const int reps = 4;
    for (int d = 0; d < 2; d++) {
        bool drop_last = d == 1;
        int64_t total = 0, per = 0;
        int64_t *first[4];
        for (int r = 0; r < reps; r++) {
            first[r] = sampler_take(len, reps, r, true, 42, 3, drop_last, &per);
            TD_CHECK_EQ(per, drop_last ? 25 : 26);
            for (int64_t i = 0; i < per; i++) {
                TD_CHECK(first[r][i] >= 0 && first[r][i] < len);
            }
            total += per;
        }
        int64_t seen[103] = {0};
        for (int r = 0; r < reps; r++)
            for (int64_t i = 0; i < per; i++)
                seen[first[r][i]]++;
        int64_t distinct = 0, repeated = 0;
        for (int64_t k = 0; k < len; k++) {
            distinct += seen[k] > 0;
            repeated += seen[k] > 1 ? seen[k] - 1 : 0;
            TD_CHECK(seen[k] <= 2);
        }
        if (drop_last) {
            TD_CHECK_EQ(distinct, 100);
            TD_CHECK_EQ(repeated, 0);
        } else {
            TD_CHECK_EQ(distinct, len);
            TD_CHECK_EQ(repeated, total - len); /* 104 - 103: one padded item */
            /* The padding is the permutation's first item, which rank 0 gets first. */
            TD_CHECK_EQ(first[3][per - 1], first[0][0]);
        }
        /* Deterministic; another epoch or seed gives another order; the order is not the identity. */
        int64_t *again = sampler_take(len, reps, 1, true, 42, 3, drop_last, &per);
        check_indices(again, per, first[1], "the same seed and epoch");
        int64_t *next = sampler_take(len, reps, 1, true, 42, 4, drop_last, &per);
        int64_t *other = sampler_take(len, reps, 1, true, 43, 3, drop_last, &per);
        TD_CHECK(memcmp(next, first[1], sizeof(int64_t) * (size_t)per) != 0);
        TD_CHECK(memcmp(other, first[1], sizeof(int64_t) * (size_t)per) != 0);
        /* seed + epoch is what seeds the generator, as torch's g.manual_seed(seed + epoch). */
        int64_t *shifted = sampler_take(len, reps, 1, true, 41, 4, drop_last, &per);
        check_indices(shifted, per, first[1], "seed 41 epoch 4 against seed 42 epoch 3");
        int identity = 0;
        for (int64_t i = 0; i < per; i++)
            identity += first[1][i] == 1 + i * reps;
        TD_CHECK(identity < per);
        free(again);
        free(next);
        free(other);
        free(shifted);
        for (int r = 0; r < reps; r++)
            free(first[r]);
    }
}

TD_TEST(sampler_errors)
{
    int64_t n = -1, out[4];
    TD_CHECK_ERR(td_distributed_sampler_indices(10, 4, 4, false, 0, 0, false, out, &n), TD_ERR_INVALID,
                 "Invalid rank 4, rank should be in the interval [0, 3]");
    TD_CHECK_ERR(td_distributed_sampler_indices(10, 4, -1, true, 0, 0, false, out, &n), TD_ERR_INVALID,
                 "Invalid rank -1, rank should be in the interval [0, 3]");
    TD_CHECK_ERR(td_distributed_sampler_indices(10, 0, 0, false, 0, 0, false, out, &n), TD_ERR_INVALID,
                 "num_replicas should be a positive integer value, but got num_replicas=0");
    TD_CHECK_ERR(td_distributed_sampler_indices(-1, 2, 0, false, 0, 0, false, out, &n), TD_ERR_INVALID,
                 "dataset_len must be >= 0");
    TD_CHECK_ERR(td_distributed_sampler_indices(10, 2, 0, false, 0, 0, false, out, NULL), TD_ERR_INVALID,
                 "n_out is NULL");
    TD_CHECK_ERR(td_distributed_sampler_num_samples(10, 2, false, NULL), TD_ERR_INVALID, "out is NULL");
}

TD_TEST_MAIN()
