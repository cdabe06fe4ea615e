/* mlp.h: the model and data the training examples share (ddp_train, param_server): a synthetic
 * classification set in 16 dimensions that a linear model cannot learn, and a multi-layer perceptron
 * DIM -> H -> H -> CLASSES with ReLU and softmax cross-entropy, its forward and hand-written backward
 * over one flat parameter buffer. Every rank builds the same data from a seed. */
#ifndef TDIST_EXAMPLES_MLP_H
#define TDIST_EXAMPLES_MLP_H

#include <stddef.h>
#include <stdint.h>

enum { DIM = 16, CLASSES = 4 };

/* A training run's settings, from --epochs N --samples N --hidden N --batch N --lr X --seed N
 * --target ACCURACY (defaults: 10 epochs of 96000 samples, 96 hidden units, batches of 32 per
 * worker, lr 0.05 with momentum 0.9, seed 1234, target 90%). */
typedef struct train_config {
    int epochs;
    int samples;   /* training samples in the whole job */
    int hidden;
    int batch;     /* per rank */
    unsigned seed;
    double lr;
    double target; /* accuracy the job must reach */
} train_config;
void train_config_parse(int argc, char **argv, train_config *c);

/* Monotonic seconds, for the examples' timings. */
double mlp_now_s(void);

/* splitmix64: the same stream on every rank and every machine. */
uint64_t rng_next(uint64_t *s);

/* n points into x (n * DIM floats) and their classes into y. */
void make_data(unsigned seed, int n, float *x, int *y);

typedef struct model {
    int h;
    size_t n;          /* parameters in total */
    float *w1, *b1, *w2, *b2, *w3, *b3; /* views into params */
} model;

/* The number of parameters of a model with h hidden units. */
size_t model_size(int h);
/* Points m's views into p (model_size(h) floats). */
void model_bind(model *m, float *p, int h);
/* He initialisation from a seed (the same on every rank). */
void model_init(model *m, unsigned seed);
/* Forward one sample; a1 and a2 take the activations (h floats each), out the class probabilities. */
void forward(const model *m, const float *x, float *a1, float *a2, float *out);
/* Adds this sample's gradient (scaled by scale, 1/batch) into g and returns its loss; a1, a2, d1 and
 * d2 are scratch of h floats each. */
float backward(const model *m, model *g, const float *x, int y, float scale, float *a1, float *a2, float *d1,
               float *d2);
/* The fraction of the n samples at x, y that m classifies right (a1: scratch of 2h floats). */
double accuracy(const model *m, const float *x, const int *y, int n, float *a1);

#endif
