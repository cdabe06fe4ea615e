/* mpi_allreduce: MPI_Allreduce (float32 SUM, in place) measured the way tdist-bench measures
 * (tools/tdist-bench/measure.c), with the same sizes, options and output columns, so that
 * bench/peers/run.sh can put it beside tdist-bench and Gloo.
 *
 *   mpicc -O2 -o mpi_allreduce mpi_allreduce.c -lm
 *   mpirun -np 4 ./mpi_allreduce --min 8 --max 64M --csv
 *
 * Sizes go from --min to --max, times --factor or plus --step (-i, as nccl-tests). For each size:
 * the check (every rank fills 1 + (3 * rank + i) % 4 and counts the wrong elements of the sum,
 * summed over the ranks), then one timed call whose slowest-rank time sets the warm-up
 * (about 50 ms worth, 1 to 1000 calls), the warm-up timed to estimate a call, then --time seconds
 * of calls (at least --min-iters; -n/--iters sets the number, as in tdist-bench and nccl-tests) in
 * --batches batches as even as can be, each after MPI_Barrier; the time is the median over batches
 * of the slowest rank's mean per call. --thread-multiple initializes MPI with
 * MPI_Init_thread(MPI_THREAD_MULTIPLE) instead of MPI_Init, the level tdist's mpi backend asks for,
 * to show what that level alone costs. Standalone on purpose: it uses nothing of tdist, so the same
 * program serves any MPI comparison. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

typedef struct opts {
    uint64_t min, max;
    double factor, time_s;
    uint64_t step; /* --step / -i: sizes grow by this many bytes instead of by --factor */
    long iters, warmup, min_iters;
    int batches, check, csv, header;
    const char *impl;
} opts;

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    switch (*end) {
    case 'k': case 'K': v *= 1024; break;
    case 'm': case 'M': v *= 1024 * 1024; break;
    case 'g': case 'G': v *= 1024.0 * 1024 * 1024; break;
    default: break;
    }
    return (uint64_t)v;
}

static void parse(int argc, char **argv, opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--csv")) {
            o->csv = 1;
            continue;
        }
        if (!strcmp(a, "--no-header")) {
            o->header = 0;
            continue;
        }
        if (!strcmp(a, "--thread-multiple")) /* read before MPI_Init (main) */
            continue;
        i++;
        if (!strcmp(a, "--min") || !strcmp(a, "-b")) o->min = parse_size(v);
        else if (!strcmp(a, "--max") || !strcmp(a, "-e")) o->max = parse_size(v);
        else if (!strcmp(a, "--factor") || !strcmp(a, "-f")) o->factor = atof(v);
        else if (!strcmp(a, "--step") || !strcmp(a, "-i")) o->step = parse_size(v);
        else if (!strcmp(a, "--time")) o->time_s = atof(v);
        else if (!strcmp(a, "--iters") || !strcmp(a, "-n")) o->iters = atol(v);
        else if (!strcmp(a, "--warmup") || !strcmp(a, "-w")) o->warmup = atol(v);
        else if (!strcmp(a, "--min-iters")) o->min_iters = atol(v);
        else if (!strcmp(a, "--batches")) o->batches = atoi(v);
        else if (!strcmp(a, "--check") || !strcmp(a, "-c")) o->check = atoi(v);
        else if (!strcmp(a, "--impl")) o->impl = v;
        else {
            fprintf(stderr, "mpi_allreduce: unknown argument '%s'\n", a);
            MPI_Abort(MPI_COMM_WORLD, 2);
        }
    }
    if (o->factor <= 1 || o->batches < 1 || o->min_iters < 1 || o->min > o->max) {
        fprintf(stderr, "mpi_allreduce: bad options\n");
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
}

static void run(float *buf, int count, long n)
{
    for (long i = 0; i < n; i++)
        MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static long clampl(double v, long lo, long hi)
{
    if (!(v >= (double)lo))
        return lo;
    if (v >= (double)hi)
        return hi;
    return (long)ceil(v);
}

int main(int argc, char **argv)
{
    int multiple = 0;
    for (int i = 1; i < argc; i++)
        multiple |= !strcmp(argv[i], "--thread-multiple");
    int provided = 0;
    if (multiple)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(&argc, &argv);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    opts o = {.min = 8, .max = 64u << 20, .factor = 2.0, .time_s = 0.3, .iters = 0, .warmup = -1, .min_iters = 5,
              .batches = 10, .check = 1, .csv = 0, .header = 1, .impl = "openmpi"};
    parse(argc, argv, &o);
    size_t maxcount = o.max / 4 > 0 ? o.max / 4 : 1;
    float *buf = calloc(maxcount, sizeof *buf);
    double *times = calloc((size_t)o.batches, sizeof *times);
    if (!buf || !times) {
        fprintf(stderr, "mpi_allreduce: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    double factor = 2.0 * (world - 1) / world;
    if (rank == 0 && o.header) {
        if (o.csv) {
            printf("impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters\n");
        } else {
            char lib[MPI_MAX_LIBRARY_VERSION_STRING];
            int len;
            MPI_Get_library_version(lib, &len);
            lib[strcspn(lib, ",\n")] = '\0';
            printf("# %s MPI_Allreduce, %d ranks, dtype float32, reduce op SUM\n", lib, world);
            printf("# time: median of %d batches of the slowest rank's mean time per call (barrier before each batch)\n",
                   o.batches);
            printf("# algbw = size / time; busbw = algbw x 2(n-1)/n (nccl-tests); GB/s = 1e9 bytes/s\n#\n");
            printf("# %10s %12s %9s %7s %5s %11s %12s %12s %8s %9s\n", "size", "count", "type", "redop", "root",
                   "time(us)", "algbw(GB/s)", "busbw(GB/s)", "#wrong", "iters");
        }
        fflush(stdout);
    }
    long total_wrong = 0;
    uint64_t last = UINT64_MAX, req = o.min;
    for (;;) {
        int count = req / 4 > 0 ? (int)(req / 4) : 1;
        uint64_t nbytes = (uint64_t)count * 4;
        if (nbytes != last) {
            last = nbytes;
            long wrong = -1;
            if (o.check) {
                for (int i = 0; i < count; i++)
                    buf[i] = (float)(1 + (3 * rank + i) % 4);
                run(buf, count, 1);
                long w = 0;
                for (int i = 0; i < count; i++) {
                    float want = 0;
                    for (int r = 0; r < world; r++)
                        want += (float)(1 + (3 * r + i) % 4);
                    w += buf[i] != want;
                }
                MPI_Allreduce(&w, &wrong, 1, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
                total_wrong += wrong;
            }
            double t0 = MPI_Wtime(), t1;
            run(buf, count, 1);
            t1 = MPI_Wtime() - t0;
            MPI_Allreduce(MPI_IN_PLACE, &t1, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            long warmup = o.warmup >= 0 ? o.warmup : clampl(0.05 / fmax(t1, 1e-9), 1, 1000);
            double est = t1;
            if (warmup > 0) {
                t0 = MPI_Wtime();
                run(buf, count, warmup);
                est = (MPI_Wtime() - t0) / (double)warmup;
                MPI_Allreduce(MPI_IN_PLACE, &est, 1, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            }
            long iters = o.iters > 0 ? o.iters : clampl(o.time_s / fmax(est, 1e-9), o.min_iters, 10000000);
            int batches = iters < o.batches ? (int)iters : o.batches;
            for (int b = 0; b < batches; b++) {
                long k = iters / batches + (b < iters % batches); /* the first batches take the rest */
                MPI_Barrier(MPI_COMM_WORLD);
                t0 = MPI_Wtime();
                run(buf, count, k);
                times[b] = (MPI_Wtime() - t0) / (double)k;
            }
            MPI_Allreduce(MPI_IN_PLACE, times, batches, MPI_DOUBLE, MPI_MAX, MPI_COMM_WORLD);
            qsort(times, (size_t)batches, sizeof *times, cmp_double);
            double med = batches % 2 ? times[batches / 2] : 0.5 * (times[batches / 2 - 1] + times[batches / 2]);
            if (rank == 0) {
                double us = med * 1e6, algbw = (double)nbytes / med / 1e9;
                char w[32];
                if (wrong < 0)
                    snprintf(w, sizeof w, "N/A");
                else
                    snprintf(w, sizeof w, "%ld", wrong);
                if (o.csv)
                    printf("%s,all_reduce,%d,float32,SUM,-1,%llu,%d,%.3f,%.6f,%.6f,%s,%ld\n", o.impl, world,
                           (unsigned long long)nbytes, count, us, algbw, algbw * factor, w, iters);
                else
                    printf("  %10llu %12d %9s %7s %5d %11.2f %12.3f %12.3f %8s %9ld\n", (unsigned long long)nbytes,
                           count, "float32", "SUM", -1, us, algbw, algbw * factor, w, iters);
                fflush(stdout);
            }
        }
        if (req >= o.max)
            break;
        double next = o.step ? (double)req + (double)o.step : floor((double)req * o.factor + 0.5);
        req = next <= (double)req ? req + 1 : (uint64_t)next;
        if (req > o.max)
            break;
    }
    if (rank == 0 && !o.csv && o.header) {
        printf("# wrong elements: %ld (%s)\n", total_wrong, total_wrong ? "FAILED" : "OK");
        fflush(stdout);
    }
    free(buf);
    free(times);
    MPI_Finalize();
    return total_wrong ? 3 : 0;
}
