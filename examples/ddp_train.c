/* ddp_train: data-parallel training of a small multi-layer perceptron with tdist.
 *
 *   tdrun --nproc-per-node 4 ./ddp_train [--epochs N] [--samples N] [--hidden N] [--batch N]
 *                                        [--lr X] [--seed N] [--target ACCURACY]
 *
 * Every rank builds the same synthetic classification set from a seed (points in 16 dimensions
 * whose class is decided by a fixed nonlinear rule, so a linear model cannot learn it), trains on
 * its own shard, and averages gradients with one all_reduce per step (ReduceOp.AVG over a single
 * flattened gradient buffer, as DDP's bucket does). Rank 0 prints the loss and the test accuracy
 * after each epoch. At the end every rank checks that its parameters are bit-identical to rank 0's
 * and prints how its step time split between computing and communicating. The program exits 1 if
 * training did not reach the target accuracy or the ranks disagree. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <tdist/tdist.h>

enum { DIM = 16, CLASSES = 4 };

typedef struct config {
    int epochs;
    int samples;   /* training samples in the whole job */
    int hidden;
    int batch;     /* per rank */
    unsigned seed;
    double lr;
    double target; /* accuracy the job must reach */
} config;

/* ---- data ---------------------------------------------------------------------------------- */

static uint64_t rng_next(uint64_t *s)
{
    /* splitmix64: the same stream on every rank and every machine */
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static float rng_uniform(uint64_t *s) { return (float)((rng_next(s) >> 40) * (1.0 / 16777216.0)); }

static float rng_normal(uint64_t *s)
{
    float u = rng_uniform(s) + 1e-7f, v = rng_uniform(s);
    return sqrtf(-2.0f * logf(u)) * cosf(6.2831853f * v);
}

/* Class of a point: which of four fixed directions its squared projection lines up with best,
 * after a nonlinearity - learnable by an MLP, not by a linear classifier. */
static int label_of(const float *x, const float dirs[CLASSES][DIM])
{
    int best = 0;
    float best_v = -1e30f;
    for (int c = 0; c < CLASSES; c++) {
        float p = 0;
        for (int d = 0; d < DIM; d++)
            p += dirs[c][d] * x[d];
        float v = sinf(2.0f * p) + 0.5f * p * p;
        if (v > best_v) {
            best_v = v;
            best = c;
        }
    }
    return best;
}

static void make_data(unsigned seed, int n, float *x, int *y)
{
    uint64_t s = seed;
    float dirs[CLASSES][DIM];
    for (int c = 0; c < CLASSES; c++)
        for (int d = 0; d < DIM; d++)
            dirs[c][d] = rng_normal(&s) * 0.35f;
    for (int i = 0; i < n; i++) {
        for (int d = 0; d < DIM; d++)
            x[(size_t)i * DIM + d] = rng_normal(&s);
        y[i] = label_of(&x[(size_t)i * DIM], dirs);
    }
}

/* ---- the model: DIM -> H -> H -> CLASSES, ReLU, softmax cross-entropy ---------------------- */

typedef struct model {
    int h;
    size_t n;          /* parameters in total */
    float *w1, *b1, *w2, *b2, *w3, *b3; /* views into params */
} model;

static void model_bind(model *m, float *p, int h)
{
    m->h = h;
    m->w1 = p;
    m->b1 = m->w1 + (size_t)DIM * h;
    m->w2 = m->b1 + h;
    m->b2 = m->w2 + (size_t)h * h;
    m->w3 = m->b2 + h;
    m->b3 = m->w3 + (size_t)h * CLASSES;
    m->n = (size_t)(m->b3 + CLASSES - p);
}

static size_t model_size(int h) { return (size_t)DIM * h + h + (size_t)h * h + h + (size_t)h * CLASSES + CLASSES; }

static void model_init(model *m, unsigned seed)
{
    uint64_t s = seed ^ 0x5eedull;
    float *all = m->w1;
    for (size_t i = 0; i < m->n; i++)
        all[i] = 0;
    for (int i = 0; i < DIM * m->h; i++)
        m->w1[i] = rng_normal(&s) * sqrtf(2.0f / DIM);
    for (int i = 0; i < m->h * m->h; i++)
        m->w2[i] = rng_normal(&s) * sqrtf(2.0f / (float)m->h);
    for (int i = 0; i < m->h * CLASSES; i++)
        m->w3[i] = rng_normal(&s) * sqrtf(1.0f / (float)m->h);
}

/* Forward one sample; fills the activations and returns the class probabilities in out. */
static void forward(const model *m, const float *x, float *a1, float *a2, float *out)
{
    int h = m->h;
    for (int j = 0; j < h; j++) {
        float v = m->b1[j];
        for (int d = 0; d < DIM; d++)
            v += x[d] * m->w1[d * h + j];
        a1[j] = v > 0 ? v : 0;
    }
    for (int j = 0; j < h; j++) {
        float v = m->b2[j];
        for (int k = 0; k < h; k++)
            v += a1[k] * m->w2[k * h + j];
        a2[j] = v > 0 ? v : 0;
    }
    float mx = -1e30f;
    for (int c = 0; c < CLASSES; c++) {
        float v = m->b3[c];
        for (int k = 0; k < h; k++)
            v += a2[k] * m->w3[k * CLASSES + c];
        out[c] = v;
        mx = v > mx ? v : mx;
    }
    float sum = 0;
    for (int c = 0; c < CLASSES; c++)
        sum += out[c] = expf(out[c] - mx);
    for (int c = 0; c < CLASSES; c++)
        out[c] /= sum;
}

/* Adds this sample's gradient (scaled by 1/batch) into g; returns its loss. */
static float backward(const model *m, model *g, const float *x, int y, float scale, float *a1, float *a2,
                      float *d1, float *d2)
{
    int h = m->h;
    float p[CLASSES];
    forward(m, x, a1, a2, p);
    float loss = -logf(p[y] + 1e-12f);
    float d3[CLASSES];
    for (int c = 0; c < CLASSES; c++)
        d3[c] = (p[c] - (c == y)) * scale;
    for (int k = 0; k < h; k++) {
        float acc = 0;
        for (int c = 0; c < CLASSES; c++) {
            g->w3[k * CLASSES + c] += a2[k] * d3[c];
            acc += m->w3[k * CLASSES + c] * d3[c];
        }
        d2[k] = a2[k] > 0 ? acc : 0;
    }
    for (int c = 0; c < CLASSES; c++)
        g->b3[c] += d3[c];
    for (int k = 0; k < h; k++) {
        float acc = 0;
        for (int j = 0; j < h; j++) {
            g->w2[k * h + j] += a1[k] * d2[j];
            acc += m->w2[k * h + j] * d2[j];
        }
        d1[k] = a1[k] > 0 ? acc : 0;
    }
    for (int j = 0; j < h; j++)
        g->b2[j] += d2[j];
    for (int d = 0; d < DIM; d++)
        for (int j = 0; j < h; j++)
            g->w1[d * h + j] += x[d] * d1[j];
    for (int j = 0; j < h; j++)
        g->b1[j] += d1[j];
    return loss;
}

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int check(td_status st, const char *what)
{
    if (st != TD_OK) {
        fprintf(stderr, "ddp_train: %s failed: %s: %s\n", what, td_status_str(st), td_last_error());
        return 1;
    }
    return 0;
}

static void parse_args(int argc, char **argv, config *c)
{
    *c = (config){.epochs = 10, .samples = 96000, .hidden = 96, .batch = 32, .seed = 1234, .lr = 0.05,
                  .target = 0.90};
    for (int i = 1; i + 1 < argc; i += 2) {
        if (strcmp(argv[i], "--epochs") == 0)
            c->epochs = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--samples") == 0)
            c->samples = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--hidden") == 0)
            c->hidden = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--seed") == 0)
            c->seed = (unsigned)strtoul(argv[i + 1], NULL, 10);
        else if (strcmp(argv[i], "--batch") == 0)
            c->batch = atoi(argv[i + 1]);
        else if (strcmp(argv[i], "--lr") == 0)
            c->lr = atof(argv[i + 1]);
        else if (strcmp(argv[i], "--target") == 0)
            c->target = atof(argv[i + 1]);
    }
}

int main(int argc, char **argv)
{
    config cfg;
    parse_args(argc, argv, &cfg);

    /* env:// rendezvous with the launcher's variables, on the default backend. */
    if (check(td_init_process_group(NULL), "init_process_group"))
        return 1;
    td_pg *pg = td_default_pg();
    int rank = td_get_rank(), world = td_get_world_size();

    int n_test = 4000;
    float *x = malloc(sizeof(float) * DIM * (size_t)(cfg.samples + n_test));
    int *y = malloc(sizeof(int) * (size_t)(cfg.samples + n_test));
    make_data(cfg.seed, cfg.samples + n_test, x, y);
    const float *x_test = x + (size_t)cfg.samples * DIM;
    const int *y_test = y + cfg.samples;

    size_t np = model_size(cfg.hidden);
    td_tensor *params_t, *grads_t, *velocity_t;
    if (check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &params_t), "tensor") ||
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &grads_t), "tensor") ||
        check(td_tensor_zeros(TD_FLOAT32, TD_SHAPE((int64_t)np), &velocity_t), "tensor"))
        return 1;
    float *params = td_tensor_data(params_t), *grads = td_tensor_data(grads_t), *vel = td_tensor_data(velocity_t);
    model m, g;
    model_bind(&m, params, cfg.hidden);
    model_bind(&g, grads, cfg.hidden);
    model_init(&m, cfg.seed);

    float *a1 = malloc(sizeof(float) * (size_t)cfg.hidden * 4);
    float *a2 = a1 + cfg.hidden, *d1 = a2 + cfg.hidden, *d2 = d1 + cfg.hidden;

    /* Every rank takes the same number of steps: the shard is the rank's slice of each global batch. */
    int global_batch = cfg.batch * world;
    int steps_per_epoch = cfg.samples / global_batch;
    if (rank == 0)
        printf("ddp_train: %d ranks, %d samples, MLP %d-%d-%d-%d (%zu parameters), %d steps/epoch of %d\n", world,
               cfg.samples, DIM, cfg.hidden, cfg.hidden, CLASSES, np, steps_per_epoch, global_batch);

    double t_compute = 0, t_comm = 0;
    double acc = 0;
    int *order = malloc(sizeof(int) * (size_t)cfg.samples);
    for (int i = 0; i < cfg.samples; i++)
        order[i] = i;
    uint64_t shuffle = cfg.seed;
    for (int epoch = 1; epoch <= cfg.epochs; epoch++) {
        double t_epoch = now_s();
        for (int i = cfg.samples - 1; i > 0; i--) { /* the same permutation on every rank */
            int j = (int)(rng_next(&shuffle) % (uint64_t)(i + 1));
            int t = order[i];
            order[i] = order[j];
            order[j] = t;
        }
        double loss_sum = 0;
        double lr = cfg.lr * (epoch > cfg.epochs * 3 / 4 ? 0.3 : 1.0);
        for (int step = 0; step < steps_per_epoch; step++) {
            double t0 = now_s();
            memset(grads, 0, sizeof(float) * np);
            const int *idx = order + (size_t)step * global_batch + (size_t)rank * cfg.batch;
            for (int b = 0; b < cfg.batch; b++)
                loss_sum += backward(&m, &g, x + (size_t)idx[b] * DIM, y[idx[b]], 1.0f / cfg.batch, a1, a2, d1, d2);
            double t1 = now_s();
            if (check(td_pg_all_reduce(pg, grads_t, TD_OP_AVG, NULL), "all_reduce"))
                return 1;
            double t2 = now_s();
            for (size_t i = 0; i < np; i++) {
                vel[i] = 0.9f * vel[i] + grads[i];
                params[i] -= (float)lr * vel[i];
            }
            t_compute += (t1 - t0) + (now_s() - t2);
            t_comm += t2 - t1;
        }
        /* Loss over the whole job: each rank's sum, averaged. */
        td_tensor *stats;
        if (check(td_tensor_full(TD_FLOAT64, TD_SHAPE(1), loss_sum, &stats), "tensor"))
            return 1;
        if (check(td_pg_all_reduce(pg, stats, TD_OP_SUM, NULL), "all_reduce"))
            return 1;
        double loss = *(double *)td_tensor_data(stats) / ((double)steps_per_epoch * global_batch);
        td_tensor_release(stats);
        if (rank == 0) {
            int correct = 0;
            float p[CLASSES];
            for (int i = 0; i < n_test; i++) {
                forward(&m, x_test + (size_t)i * DIM, a1, a2, p);
                int best = 0;
                for (int c = 1; c < CLASSES; c++)
                    best = p[c] > p[best] ? c : best;
                correct += best == y_test[i];
            }
            acc = (double)correct / n_test;
            char bar[21];
            int filled = epoch * 20 / cfg.epochs;
            for (int i = 0; i < 20; i++)
                bar[i] = i < filled ? '#' : '.';
            bar[20] = '\0';
            printf("epoch %2d/%d [%s] loss %.4f  test accuracy %5.1f%%  %.2fs\n", epoch, cfg.epochs, bar, loss,
                   acc * 100, now_s() - t_epoch);
            fflush(stdout);
        }
    }

    /* Every rank must hold exactly rank 0's parameters. */
    td_tensor *reference;
    if (check(td_tensor_clone(params_t, &reference), "clone") ||
        check(td_pg_broadcast(pg, reference, 0, NULL), "broadcast"))
        return 1;
    int same = memcmp(td_tensor_data(reference), params, sizeof(float) * np) == 0;
    td_tensor *flag;
    if (check(td_tensor_full(TD_INT32, TD_SHAPE(2), 0, &flag), "tensor"))
        return 1;
    ((int32_t *)td_tensor_data(flag))[0] = same;
    ((int32_t *)td_tensor_data(flag))[1] = rank == 0 ? (int32_t)(acc * 10000) : 0;
    /* MIN of "same" tells everyone whether all agreed; SUM carries rank 0's accuracy to all. */
    td_tensor *agree;
    if (check(td_tensor_narrow(flag, 0, 0, 1, &agree), "narrow") ||
        check(td_pg_all_reduce(pg, agree, TD_OP_MIN, NULL), "all_reduce"))
        return 1;
    td_tensor *accv;
    if (check(td_tensor_narrow(flag, 0, 1, 1, &accv), "narrow") ||
        check(td_pg_all_reduce(pg, accv, TD_OP_SUM, NULL), "all_reduce"))
        return 1;
    int all_same = ((int32_t *)td_tensor_data(flag))[0];
    double final_acc = ((int32_t *)td_tensor_data(flag))[1] / 10000.0;
    int steps = steps_per_epoch * cfg.epochs;
    printf("rank %d: parameters %s rank 0's; per step %.3f ms computing, %.3f ms communicating\n", rank,
           same ? "bit-identical to" : "DIFFER from", 1e3 * t_compute / steps, 1e3 * t_comm / steps);

    int rc = 0;
    if (!all_same) {
        if (rank == 0)
            printf("FAILED: ranks disagree on the parameters\n");
        rc = 1;
    } else if (final_acc < cfg.target) {
        if (rank == 0)
            printf("FAILED: test accuracy %.1f%% is below the %.0f%% target\n", final_acc * 100, cfg.target * 100);
        rc = 1;
    } else if (rank == 0) {
        printf("ddp_train: trained to %.1f%% test accuracy; all %d ranks hold identical parameters\n",
               final_acc * 100, world);
    }
    td_tensor_release(agree);
    td_tensor_release(accv);
    td_tensor_release(flag);
    td_tensor_release(reference);
    td_tensor_release(params_t);
    td_tensor_release(grads_t);
    td_tensor_release(velocity_t);
    free(order);
    free(a1);
    free(x);
    free(y);
    td_destroy_process_group();
    return rc;
}
