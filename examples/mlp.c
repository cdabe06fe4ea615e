/* mlp.c: the examples' shared model and data (mlp.h): the data set's rule, initialisation, and the
 * forward and backward passes of the MLP, written out by hand over one flat parameter buffer. */
#include "mlp.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- data ---------------------------------------------------------------------------------- */

double mlp_now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

uint64_t rng_next(uint64_t *s)
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

void make_data(unsigned seed, int n, float *x, int *y)
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

void model_bind(model *m, float *p, int h)
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

size_t model_size(int h) { return (size_t)DIM * h + h + (size_t)h * h + h + (size_t)h * CLASSES + CLASSES; }

void model_init(model *m, unsigned seed)
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
void forward(const model *m, const float *x, float *a1, float *a2, float *out)
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
float backward(const model *m, model *g, const float *x, int y, float scale, float *a1, float *a2,
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

double accuracy(const model *m, const float *x, const int *y, int n, float *a1)
{
    int correct = 0;
    float p[CLASSES];
    for (int i = 0; i < n; i++) {
        forward(m, x + (size_t)i * DIM, a1, a1 + m->h, p);
        int best = 0;
        for (int c = 1; c < CLASSES; c++)
            best = p[c] > p[best] ? c : best;
        correct += best == y[i];
    }
    return (double)correct / n;
}

void train_config_parse(int argc, char **argv, train_config *c)
{
    *c = (train_config){.epochs = 10, .samples = 96000, .hidden = 96, .batch = 32, .seed = 1234, .lr = 0.05,
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
