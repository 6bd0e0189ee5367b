/*
 * MPI_Allreduce (float32, sum) swept over sizes the way nccl-tests' all_reduce_perf does,
 * printing one chorus_bench JSON document (see benches/peer/README.md) on rank 0's stdout.
 *
 * Built and launched by benches/peer/run.sh (through peer-run):
 *   mpicc -O2 -o mpi_allreduce mpi_allreduce.c
 *   mpirun -n N --mca pml ob1 --mca btl self,vader ./mpi_allreduce -b 8 -e 128M -f 2 -w 5 -i 20 -t shm
 *
 * Per size and per mode (out-of-place, then in-place): barrier, W warm-up calls, barrier,
 * I timed calls; time = the ranks' average of (elapsed / I), as nccl-tests averages. Then a
 * fresh pattern is written and one more call is checked element by element on every rank;
 * "wrong" is the number of wrong elements summed over ranks. The timed in-place calls run
 * on a zeroed buffer so that repeated in-place sums cannot overflow to inf.
 */
#include <errno.h>
#include <mpi.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct options {
    size_t min_bytes, max_bytes;
    size_t factor;
    int warmup, iters;
    const char *transport;
    /* Test hook (CHORUS_PEER_CORRUPT=1): rank 0 spoils one element of every checked result,
     * so tests can see that wrong results are counted. */
    int corrupt;
};

struct measure {
    double time_us;
    long long wrong;
};

static void usage_and_exit(int rank, const char *why)
{
    if (rank == 0)
        fprintf(stderr,
                "mpi_allreduce: %s\nusage: mpi_allreduce -b MIN -e MAX -f FACTOR -w WARMUP "
                "-i ITERS -t TRANSPORT (sizes in bytes, K/M/G suffixes allowed)\n",
                why);
    MPI_Finalize();
    exit(2);
}

/* Parses "8", "64K", "128M", "1G"; returns 0 on malformed input. */
static size_t parse_size(const char *text)
{
    char *end = NULL;
    errno = 0;
    unsigned long long value = strtoull(text, &end, 10);
    if (errno != 0 || end == text)
        return 0;
    unsigned long long scale = 1;
    if (*end == 'K' || *end == 'k')
        scale = 1ULL << 10, end++;
    else if (*end == 'M' || *end == 'm')
        scale = 1ULL << 20, end++;
    else if (*end == 'G' || *end == 'g')
        scale = 1ULL << 30, end++;
    if (*end != '\0')
        return 0;
    return (size_t)(value * scale);
}

static int parse_int(const char *text, int *out)
{
    char *end = NULL;
    errno = 0;
    long value = strtol(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < 0 || value > 1000000)
        return 0;
    *out = (int)value;
    return 1;
}

static void parse_options(int argc, char **argv, int rank, struct options *opt)
{
    opt->min_bytes = 8;
    opt->max_bytes = 128u << 20;
    opt->factor = 2;
    opt->warmup = 5;
    opt->iters = 20;
    opt->transport = "unknown";
    const char *corrupt = getenv("CHORUS_PEER_CORRUPT");
    opt->corrupt = corrupt != NULL && strcmp(corrupt, "1") == 0;
    for (int i = 1; i < argc; i++) {
        const char *flag = argv[i];
        if (i + 1 >= argc)
            usage_and_exit(rank, "missing value after an option");
        const char *value = argv[++i];
        if (strcmp(flag, "-b") == 0)
            opt->min_bytes = parse_size(value);
        else if (strcmp(flag, "-e") == 0)
            opt->max_bytes = parse_size(value);
        else if (strcmp(flag, "-f") == 0)
            opt->factor = parse_size(value);
        else if (strcmp(flag, "-w") == 0) {
            if (!parse_int(value, &opt->warmup))
                usage_and_exit(rank, "bad -w");
        } else if (strcmp(flag, "-i") == 0) {
            if (!parse_int(value, &opt->iters) || opt->iters == 0)
                usage_and_exit(rank, "bad -i");
        } else if (strcmp(flag, "-t") == 0)
            opt->transport = value;
        else
            usage_and_exit(rank, "unknown option");
    }
    if (opt->min_bytes < sizeof(float) || opt->max_bytes < opt->min_bytes)
        usage_and_exit(rank, "need 4 <= MIN <= MAX");
    if (opt->factor < 2)
        usage_and_exit(rank, "need FACTOR >= 2");
}

/* The check pattern repeats every PERIOD elements: (7i + 3r) mod 64 is a permutation of
 * 0..63 over any 64 consecutive i, different for every rank, and small enough that every
 * partial sum is exact in float32. The same pattern as gloo_allreduce.py. */
#define PERIOD 64

static float pattern(int rank, size_t i)
{
    return (float)((i * 7 + (size_t)rank * 3) % PERIOD);
}

static void fill_pattern(float *buf, size_t count, int rank)
{
    for (size_t i = 0; i < count; i++)
        buf[i] = pattern(rank, i);
}

static long long count_wrong(const float *buf, size_t count, int nranks)
{
    float expected[PERIOD];
    for (size_t i = 0; i < PERIOD; i++) {
        expected[i] = 0.0f;
        for (int r = 0; r < nranks; r++)
            expected[i] += pattern(r, i);
    }
    long long wrong = 0;
    for (size_t i = 0; i < count; i++)
        if (buf[i] != expected[i % PERIOD])
            wrong++;
    return wrong;
}

static struct measure run_mode(float *send, float *recv, size_t count, int in_place,
                               const struct options *opt, int rank, int nranks)
{
    const void *src = in_place ? MPI_IN_PLACE : (const void *)send;
    if (in_place)
        memset(recv, 0, count * sizeof(float));
    else
        fill_pattern(send, count, rank);

    MPI_Barrier(MPI_COMM_WORLD);
    for (int i = 0; i < opt->warmup; i++)
        MPI_Allreduce(src, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    MPI_Barrier(MPI_COMM_WORLD);
    double start = MPI_Wtime();
    for (int i = 0; i < opt->iters; i++)
        MPI_Allreduce(src, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    double per_call = (MPI_Wtime() - start) / opt->iters;
    double sum_per_call = 0.0;
    MPI_Allreduce(&per_call, &sum_per_call, 1, MPI_DOUBLE, MPI_SUM, MPI_COMM_WORLD);

    /* Correctness: a fresh pattern, one call, every element checked on every rank. */
    if (in_place)
        fill_pattern(recv, count, rank);
    else
        memset(recv, 0, count * sizeof(float));
    MPI_Allreduce(src, recv, (int)count, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    if (opt->corrupt && rank == 0)
        recv[count - 1] += 1.0f;
    long long wrong = count_wrong(recv, count, nranks);
    long long wrong_total = 0;
    MPI_Allreduce(&wrong, &wrong_total, 1, MPI_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);

    struct measure m = {sum_per_call / nranks * 1e6, wrong_total};
    return m;
}

static void print_measure(const struct measure *m, size_t bytes, int nranks)
{
    double algbw = (double)bytes / (m->time_us * 1e-6) / 1e9;
    double busbw = algbw * 2.0 * (nranks - 1) / nranks;
    printf("{\"time_us\":%.3f,\"algbw_gbs\":%.6f,\"busbw_gbs\":%.6f,\"wrong\":%lld}", m->time_us,
           algbw, busbw, m->wrong);
}

int main(int argc, char **argv)
{
    MPI_Init(&argc, &argv);
    int rank = 0, nranks = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nranks);

    struct options opt;
    parse_options(argc, argv, rank, &opt);

    size_t max_count = opt.max_bytes / sizeof(float);
    if (max_count > (size_t)INT32_MAX)
        usage_and_exit(rank, "MAX too large for an int count");
    float *send = NULL, *recv = NULL;
    if (posix_memalign((void **)&send, 64, max_count * sizeof(float)) != 0 ||
        posix_memalign((void **)&recv, 64, max_count * sizeof(float)) != 0) {
        fprintf(stderr, "mpi_allreduce: rank %d cannot allocate %zu bytes\n", rank,
                opt.max_bytes);
        MPI_Abort(MPI_COMM_WORLD, 3);
    }
    /* Fault every page in before timing anything. */
    memset(send, 0, max_count * sizeof(float));
    memset(recv, 0, max_count * sizeof(float));

    char version[MPI_MAX_LIBRARY_VERSION_STRING] = {0};
    int version_len = 0;
    MPI_Get_library_version(version, &version_len);
    for (int i = 0; i < version_len; i++)
        if (version[i] == '"' || version[i] == '\\' || (unsigned char)version[i] < 0x20)
            version[i] = ' ';

    if (rank == 0)
        printf("{\"chorus_bench\":1,\"collective\":\"all-reduce\",\"ranks\":%d,"
               "\"transport\":\"%s\",\"dtype\":\"float\",\"op\":\"sum\",\"warmup\":%d,"
               "\"iters\":%d,\"library\":\"%s\",\"rows\":[",
               nranks, opt.transport, opt.warmup, opt.iters, version);

    /* A first sweep-wide warm-up, so the first size does not pay for connection set-up. */
    for (int i = 0; i < (opt.warmup > 0 ? opt.warmup : 1); i++)
        MPI_Allreduce(MPI_IN_PLACE, recv, 1, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);

    double busbw_sum = 0.0;
    int busbw_n = 0;
    int first = 1;
    for (size_t bytes = opt.min_bytes; bytes <= opt.max_bytes; bytes *= opt.factor) {
        size_t count = bytes / sizeof(float);
        size_t row_bytes = count * sizeof(float);
        struct measure oop = run_mode(send, recv, count, 0, &opt, rank, nranks);
        struct measure ip = run_mode(send, recv, count, 1, &opt, rank, nranks);
        if (rank == 0) {
            printf("%s{\"size\":%zu,\"count\":%zu,\"type\":\"float\",\"redop\":\"sum\","
                   "\"root\":-1,\"out_of_place\":",
                   first ? "" : ",", row_bytes, count);
            print_measure(&oop, row_bytes, nranks);
            printf(",\"in_place\":");
            print_measure(&ip, row_bytes, nranks);
            printf("}");
            fflush(stdout);
            double factor = 2.0 * (nranks - 1) / nranks;
            busbw_sum += (double)row_bytes / (oop.time_us * 1e-6) / 1e9 * factor;
            busbw_sum += (double)row_bytes / (ip.time_us * 1e-6) / 1e9 * factor;
            busbw_n += 2;
        }
        first = 0;
        if (bytes > SIZE_MAX / opt.factor)
            break;
    }
    if (rank == 0)
        printf("],\"avg_busbw_gbs\":%.6f}\n", busbw_n ? busbw_sum / busbw_n : 0.0);

    free(send);
    free(recv);
    MPI_Finalize();
    return 0;
}
