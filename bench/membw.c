/* Memory read bandwidth: N threads each sum their slice of a large buffer; best of R passes.
 * Usage: membw THREADS SIZE_MIB REPS   -> prints "GB/s" (10^9 bytes per second) on stdout.
 * Built and run by bench/membw.py. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct {
    const uint64_t *p;
    size_t n;
    uint64_t sum;
    pthread_barrier_t *start, *stop;
    int reps;
} job_t;

static uint64_t sum_slice(const uint64_t *p, size_t n) {
    /* eight independent accumulators so the loop is load-bound, not add-latency-bound; vectorised by -O3 */
    uint64_t s[8] = {0};
    size_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += p[i + k];
    for (; i < n; i++) s[0] += p[i];
    uint64_t t = 0;
    for (int k = 0; k < 8; k++) t += s[k];
    return t;
}

static void *worker(void *arg) {
    job_t *j = arg;
    for (int r = 0; r < j->reps; r++) {
        pthread_barrier_wait(j->start);
        j->sum += sum_slice(j->p, j->n);
        pthread_barrier_wait(j->stop);
    }
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

int main(int argc, char **argv) {
    int threads = argc > 1 ? atoi(argv[1]) : 1;
    size_t mib = argc > 2 ? strtoull(argv[2], NULL, 10) : 2048;
    int reps = argc > 3 ? atoi(argv[3]) : 7;
    if (threads < 1 || mib < 1 || reps < 1) return 2;
    size_t bytes = mib << 20, n = bytes / sizeof(uint64_t);
    uint64_t *buf = aligned_alloc(4096, bytes);
    if (!buf) { fprintf(stderr, "cannot allocate %zu MiB\n", mib); return 1; }
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9E3779B97F4A7C15ull; /* fault every page in, non-zero */

    pthread_barrier_t start, stop;
    pthread_barrier_init(&start, NULL, threads + 1);
    pthread_barrier_init(&stop, NULL, threads + 1);
    job_t *jobs = calloc(threads, sizeof(job_t));
    pthread_t *tid = calloc(threads, sizeof(pthread_t));
    size_t per = (n / threads) & ~(size_t)7;
    for (int t = 0; t < threads; t++) {
        jobs[t] = (job_t){buf + t * per, t == threads - 1 ? n - t * per : per, 0, &start, &stop, reps};
        pthread_create(&tid[t], NULL, worker, &jobs[t]);
    }
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        pthread_barrier_wait(&start);
        double t0 = now();
        pthread_barrier_wait(&stop);
        double dt = now() - t0;
        if (dt < best) best = dt;
    }
    uint64_t total = 0;
    for (int t = 0; t < threads; t++) { pthread_join(tid[t], NULL); total += jobs[t].sum; }
    printf("%.3f\n", (double)bytes / best / 1e9);
    fprintf(stderr, "checksum %llu\n", (unsigned long long)total);
    return 0;
}
