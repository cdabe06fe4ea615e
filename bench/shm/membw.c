/* membw: the memory bandwidth the shared-memory collectives run against (bench/shm/run.sh,
 * docs/performance.md "Collectives on one host"). Two loops over buffers far larger than the
 * caches: memcpy (dst = src) and read-add-write (a[i] += b[i], float32, as the reduce kernels do),
 * run by 1 thread and by T threads at once (each on its own buffers, all started together), best
 * of R rounds. Prints, per loop and thread count, the bytes copied or reduced per second (the
 * size of one operand over the slowest thread's time, times the threads) and the memory traffic
 * that implies (memcpy reads and writes: 2x; read-add-write reads two and writes one: 3x;
 * write-allocate reads of the destination are not counted).
 *
 *   membw [SIZE_MIB (64)] [ROUNDS (5)] [THREADS (the CPUs this process may use)]
 */
#ifndef _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct job {
    float *a, *b;
    size_t n;
    int kind; /* 0 memcpy, 1 read-add-write */
    double secs;
} job;

static pthread_barrier_t g_start;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *run(void *arg)
{
    job *j = arg;
    pthread_barrier_wait(&g_start);
    double t0 = now();
    if (j->kind == 0) {
        memcpy(j->a, j->b, j->n * sizeof(float));
    } else {
        float *restrict a = j->a;
        const float *restrict b = j->b;
        for (size_t i = 0; i < j->n; i++)
            a[i] += b[i];
    }
    j->secs = now() - t0;
    return NULL;
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? strtoul(argv[1], NULL, 10) : 64;
    int rounds = argc > 2 ? atoi(argv[2]) : 5;
    cpu_set_t set;
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    int threads = argc > 3 ? atoi(argv[3]) : cpus;
    if (mib == 0 || rounds < 1 || threads < 1 || threads > 256) {
        fprintf(stderr, "usage: membw [SIZE_MIB] [ROUNDS] [THREADS]\n");
        return 2;
    }
    size_t n = (mib << 20) / sizeof(float);
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    for (int t = 0; t < threads; t++) {
        jobs[t].a = aligned_alloc(64, n * sizeof(float));
        jobs[t].b = aligned_alloc(64, n * sizeof(float));
        for (size_t i = 0; i < n; i++) { /* touch every page */
            jobs[t].a[i] = 1.0f;
            jobs[t].b[i] = (float)(i & 7);
        }
        jobs[t].n = n;
    }
    printf("# membw: %zu MiB per operand, best of %d rounds, %d CPUs\n", mib, rounds, cpus);
    printf("# loop,threads,operand_gbs,traffic_gbs\n");
    const int counts[2] = {1, threads};
    for (int kind = 0; kind < 2; kind++) {
        for (int c = 0; c < (threads > 1 ? 2 : 1); c++) {
            int k = counts[c];
            double best = 1e30;
            for (int r = 0; r < rounds; r++) {
                pthread_barrier_init(&g_start, NULL, (unsigned)k);
                pthread_t th[256];
                for (int t = 0; t < k; t++) {
                    jobs[t].kind = kind;
                    pthread_create(&th[t], NULL, run, &jobs[t]);
                }
                double slowest = 0;
                for (int t = 0; t < k; t++) {
                    pthread_join(th[t], NULL);
                    if (jobs[t].secs > slowest)
                        slowest = jobs[t].secs;
                }
                pthread_barrier_destroy(&g_start);
                if (slowest < best)
                    best = slowest;
            }
            double operand = (double)k * (double)(n * sizeof(float)) / best / 1e9;
            printf("%s,%d,%.2f,%.2f\n", kind == 0 ? "memcpy" : "read-add-write", k, operand,
                   operand * (kind == 0 ? 2 : 3));
        }
    }
    for (int t = 0; t < threads; t++) {
        free(jobs[t].a);
        free(jobs[t].b);
    }
    free(jobs);
    return 0;
}
