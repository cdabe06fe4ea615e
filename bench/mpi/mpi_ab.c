/* mpi_ab: what tdist's mpi backend adds to MPI_Allreduce, measured inside one process. Launches of
 * the same program on this machine differ by up to 1.5x at small sizes (each lands in a faster or a
 * slower state and keeps it), more than the effect to measure, so bench/mpi/run.sh's comparison of
 * two programs needs many launches; here both sides share a launch. The program initializes MPI
 * itself, as an MPI application does (MPI_Init, or MPI_Init_thread(MPI_THREAD_MULTIPLE) with
 * --thread-multiple; tdist adopts it: below MPI_THREAD_SERIALIZED in funneled mode), makes a tdist
 * group with backend "mpi", and for each size alternates batches of in-place float32 SUM
 * MPI_Allreduce on a duplicate of MPI_COMM_WORLD and td_pg_all_reduce of a tensor over the same
 * memory, each batch after MPI_Barrier, which side goes first alternating too. A batch's time is
 * the slowest rank's mean per call; each side's time is the median over its batches. Each call is
 * checked once first (the sum of every rank's 1 + rank).
 *
 *   tdist-mpiexec -n 2 mpi_ab [--min 1K] [--max 64K] [--factor 4] [--batches 40] [--batch-ms 5]
 *                             [--thread-multiple] [--csv] [--no-header]
 *
 * Output: one row per side and size in tdist-bench's CSV columns (impl mpi-same / tdist-same), or a
 * table with the overhead. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mpi.h>

#include <tdist/pg.h>
#include <tdist/tensor.h>

typedef struct opts {
    uint64_t min, max;
    double factor, batch_ms;
    int batches, csv, header, multiple;
} opts;

static void die(const char *what)
{
    fprintf(stderr, "mpi_ab: %s\n", what);
    MPI_Abort(MPI_COMM_WORLD, 2);
}

static uint64_t parse_size(const char *s)
{
    char *end;
    double v = strtod(s, &end);
    if (*end == 'k' || *end == 'K')
        v *= 1024;
    else if (*end == 'm' || *end == 'M')
        v *= 1024 * 1024;
    return (uint64_t)v;
}

static void parse(int argc, char **argv, opts *o)
{
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(a, "--csv")) o->csv = 1;
        else if (!strcmp(a, "--no-header")) o->header = 0;
        else if (!strcmp(a, "--thread-multiple")) o->multiple = 1;
        else if (!strcmp(a, "--min") && ++i) o->min = parse_size(v);
        else if (!strcmp(a, "--max") && ++i) o->max = parse_size(v);
        else if (!strcmp(a, "--factor") && ++i) o->factor = atof(v);
        else if (!strcmp(a, "--batches") && ++i) o->batches = atoi(v);
        else if (!strcmp(a, "--batch-ms") && ++i) o->batch_ms = atof(v);
        else {
            fprintf(stderr, "mpi_ab: unknown argument '%s'\n", a);
            exit(2);
        }
    }
    if (o->factor <= 1 || o->batches < 2 || o->batch_ms <= 0 || o->min < 4 || o->min > o->max) {
        fprintf(stderr, "mpi_ab: bad options\n");
        exit(2);
    }
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Side 0: MPI_Allreduce; side 1: td_pg_all_reduce. */
static void run(int side, MPI_Comm comm, td_pg *pg, td_tensor *t, long n)
{
    float *buf = td_tensor_data(t);
    int count = (int)td_tensor_numel(t);
    for (long i = 0; i < n; i++) {
        if (side == 0) {
            if (MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM, comm) != MPI_SUCCESS)
                die("MPI_Allreduce failed");
        } else if (td_pg_all_reduce(pg, t, TD_OP_SUM, NULL) != TD_OK) {
            fprintf(stderr, "mpi_ab: td_pg_all_reduce: %s\n", td_last_error());
            MPI_Abort(MPI_COMM_WORLD, 3);
        }
    }
}

static void check(int side, MPI_Comm comm, td_pg *pg, td_tensor *t, int rank, int world)
{
    float *buf = td_tensor_data(t);
    int64_t count = td_tensor_numel(t);
    for (int64_t i = 0; i < count; i++)
        buf[i] = (float)(1 + rank);
    run(side, comm, pg, t, 1);
    float want = (float)world * (world + 1) / 2;
    for (int64_t i = 0; i < count; i++)
        if (buf[i] != want)
            die(side ? "td_pg_all_reduce gave a wrong sum" : "MPI_Allreduce gave a wrong sum");
    memset(buf, 0, (size_t)count * sizeof *buf); /* zeros from here on: no overflow, no denormals */
}

int main(int argc, char **argv)
{
    opts o = {1024, 64 * 1024, 4.0, 5.0, 40, 0, 1, 0};
    for (int i = 1; i < argc; i++)
        o.multiple |= !strcmp(argv[i], "--thread-multiple");
    int provided = 0;
    if (o.multiple)
        MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    else
        MPI_Init(&argc, &argv);
    parse(argc, argv, &o);
    int rank, world;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    MPI_Comm comm;
    MPI_Comm_dup(MPI_COMM_WORLD, &comm);

    td_pg_options po = TD_PG_OPTIONS_INIT;
    po.backend = "mpi";
    td_pg *pg = NULL;
    if (td_pg_create(&po, &pg) != TD_OK) {
        fprintf(stderr, "mpi_ab: td_pg_create: %s\n", td_last_error());
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    const char *level = o.multiple ? "MPI_THREAD_MULTIPLE" : "MPI_Init";
    if (rank == 0 && o.header) {
        if (o.csv)
            printf("impl,op,world,dtype,redop,root,size,count,time_us,algbw_gbs,busbw_gbs,wrong,iters\n");
        else
            printf("# MPI_Allreduce and td_pg_all_reduce (backend mpi) in one process, %d ranks, %s; median of %d "
                   "batches of ~%g ms each, alternating\n# %10s %12s %12s %9s\n",
                   world, level, o.batches, o.batch_ms, "size", "MPI (us)", "tdist (us)", "overhead");
        fflush(stdout);
    }
    double *times[2] = {calloc((size_t)o.batches, sizeof(double)), calloc((size_t)o.batches, sizeof(double))};
    double factor = 2.0 * (world - 1) / world;
    uint64_t req = o.min, last = 0;
    for (;;) {
        int64_t count = (int64_t)(req / 4);
        if ((uint64_t)count * 4 != last) {
            last = (uint64_t)count * 4;
            td_tensor *t = NULL;
            if (td_tensor_zeros(TD_FLOAT32, TD_SHAPE(count), &t) != TD_OK)
                die("out of memory");
            check(0, comm, pg, t, rank, world);
            check(1, comm, pg, t, rank, world);
            /* Calls per batch: from a warm-up of both sides (~20 ms), agreed on by every rank. */
            long n = 64;
            double t0 = MPI_Wtime();
            for (int side = 0; side < 2; side++)
                run(side, comm, pg, t, n);
            double est = (MPI_Wtime() - t0) / (2.0 * n);
            MPI_Allreduce(MPI_IN_PLACE, &est, 1, MPI_DOUBLE, MPI_MAX, comm);
            long warm = (long)fmin(fmax(0.010 / est, 1), 100000);
            for (int side = 0; side < 2; side++)
                run(side, comm, pg, t, warm);
            long k = (long)fmin(fmax(o.batch_ms * 1e-3 / est, 1), 1e7);
            for (int b = 0; b < o.batches; b++) {
                for (int j = 0; j < 2; j++) {
                    int side = (b + j) % 2;
                    MPI_Barrier(comm);
                    t0 = MPI_Wtime();
                    run(side, comm, pg, t, k);
                    times[side][b] = (MPI_Wtime() - t0) / (double)k;
                }
            }
            for (int side = 0; side < 2; side++)
                MPI_Allreduce(MPI_IN_PLACE, times[side], o.batches, MPI_DOUBLE, MPI_MAX, comm);
            double us[2] = {median(times[0], o.batches) * 1e6, median(times[1], o.batches) * 1e6};
            if (rank == 0) {
                if (o.csv) {
                    for (int side = 0; side < 2; side++) {
                        double algbw = (double)last / (us[side] * 1e-6) / 1e9;
                        printf("%s,all_reduce,%d,float32,SUM,-1,%llu,%lld,%.3f,%.6f,%.6f,0,%ld\n",
                               side ? "tdist-same" : "mpi-same", world, (unsigned long long)last, (long long)count,
                               us[side], algbw, algbw * factor, k * o.batches);
                    }
                } else {
                    printf("  %10llu %12.3f %12.3f %+8.1f%%\n", (unsigned long long)last, us[0], us[1],
                           100 * (us[1] / us[0] - 1));
                }
                fflush(stdout);
            }
            td_tensor_release(t);
        }
        if (req >= o.max)
            break;
        double next = floor((double)req * o.factor + 0.5);
        req = next <= (double)req ? req + 1 : (uint64_t)next;
        if (req > o.max)
            break;
    }
    free(times[0]);
    free(times[1]);
    td_pg_destroy(pg);
    MPI_Comm_free(&comm);
    MPI_Finalize();
    return 0;
}
