/* tcp_zerocopy: can the kernel's zero-copy paths take copies out of a large message over loopback
 * TCP? Issue 18 asks a 16 MiB RPC round trip forced over TCP to run 3x faster than TorchRPC's,
 * which on one host is faster than two processes that only send the bytes back and forth
 * (rpc_bench --floor): plain loopback TCP copies every byte into the kernel and out again. This
 * program times one-way transfers of BYTES between two processes over 127.0.0.1, alternating two
 * ways: plain send/recv, and zero-copy (the sender's MSG_ZEROCOPY with its completions reaped, the
 * receiver's TCP_ZEROCOPY_RECEIVE mapping the received pages into a region mmapped on the socket,
 * recv for what cannot be mapped). Prints, per way, the median time and how many bytes were mapped
 * rather than copied on the receiving side.
 *
 *   tcp_zerocopy [BYTES (16777216)] [ROUNDS (20)]
 */
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef SO_ZEROCOPY
#define SO_ZEROCOPY 60
#endif
#ifndef MSG_ZEROCOPY
#define MSG_ZEROCOPY 0x4000000
#endif

static double now_ms(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e3 + t.tv_nsec / 1e6;
}

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* The sender: for each round, wait for the receiver's go byte (which names the way), send BYTES. */
static void sender(int fd, size_t bytes, int rounds)
{
    int one = 1;
    if (setsockopt(fd, SOL_SOCKET, SO_ZEROCOPY, &one, sizeof one) != 0)
        die("tcp_zerocopy: SO_ZEROCOPY");
    char *buf = aligned_alloc(4096, bytes);
    if (!buf)
        die("tcp_zerocopy: alloc");
    memset(buf, 7, bytes);
    for (int r = 0; r < 2 * rounds; r++) {
        char way;
        if (recv(fd, &way, 1, MSG_WAITALL) != 1)
            die("tcp_zerocopy: go");
        for (size_t off = 0; off < bytes;) {
            ssize_t n = send(fd, buf + off, bytes - off, way ? MSG_ZEROCOPY : 0);
            if (n < 0 && errno == ENOBUFS) { /* too many completions unread: reap them, go on */
                char ctl[128];
                struct msghdr m = {.msg_control = ctl, .msg_controllen = sizeof ctl};
                recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT);
                continue;
            }
            if (n < 0)
                die("tcp_zerocopy: send");
            off += (size_t)n;
        }
        for (;;) { /* reap the completions of this round's zero-copy sends */
            char ctl[128];
            struct msghdr m = {.msg_control = ctl, .msg_controllen = sizeof ctl};
            if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
                break;
        }
    }
    free(buf);
}

/* One transfer on the receiving side; returns the bytes mapped. */
static size_t receive(int fd, void *region, char *copy, size_t bytes, int zerocopy)
{
    size_t got = 0, mapped = 0;
    while (got < bytes) {
        size_t want = bytes - got;
        if (zerocopy && want >= 4096) {
            struct tcp_zerocopy_receive z;
            memset(&z, 0, sizeof z);
            z.address = (uint64_t)(uintptr_t)region;
            z.length = (uint32_t)(want & ~(size_t)4095);
            socklen_t zl = sizeof z;
            if (getsockopt(fd, IPPROTO_TCP, TCP_ZEROCOPY_RECEIVE, &z, &zl) != 0)
                die("tcp_zerocopy: TCP_ZEROCOPY_RECEIVE");
            got += z.length;
            mapped += z.length;
            if (z.recv_skip_hint) { /* bytes that cannot be mapped (not whole pages): copy them */
                size_t k = z.recv_skip_hint < bytes - got ? z.recv_skip_hint : bytes - got;
                ssize_t n = recv(fd, copy + got, k, 0);
                if (n <= 0)
                    die("tcp_zerocopy: recv");
                got += (size_t)n;
            } else if (!z.length) { /* nothing queued yet: wait for data without taking it */
                char c;
                if (recv(fd, &c, 1, MSG_PEEK) <= 0)
                    die("tcp_zerocopy: recv");
            }
            continue;
        }
        ssize_t n = recv(fd, copy + got, want, 0);
        if (n <= 0)
            die("tcp_zerocopy: recv");
        got += (size_t)n;
    }
    return mapped;
}

int main(int argc, char **argv)
{
    size_t bytes = argc > 1 ? strtoull(argv[1], NULL, 10) : 16u << 20;
    int rounds = argc > 2 ? atoi(argv[2]) : 20;
    if (bytes < 4096 || rounds < 1) {
        fprintf(stderr, "usage: tcp_zerocopy [BYTES >= 4096] [ROUNDS >= 1]\n");
        return 2;
    }
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    if (lfd < 0 || bind(lfd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(lfd, 1) != 0 ||
        getsockname(lfd, (struct sockaddr *)&sa, &len) != 0)
        die("tcp_zerocopy: listen");
    pid_t pid = fork();
    if (pid == 0) {
        close(lfd);
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0)
            die("tcp_zerocopy: connect");
        sender(fd, bytes, rounds);
        close(fd);
        _exit(0);
    }
    int fd = accept(lfd, NULL, NULL);
    close(lfd);
    if (fd < 0)
        die("tcp_zerocopy: accept");
    void *region = mmap(NULL, bytes, PROT_READ, MAP_SHARED, fd, 0);
    if (region == MAP_FAILED)
        die("tcp_zerocopy: mmap of the socket");
    char *copy = malloc(bytes);
    double *ms[2] = {calloc((size_t)rounds, sizeof(double)), calloc((size_t)rounds, sizeof(double))};
    size_t mapped[2] = {0, 0};
    if (!copy || !ms[0] || !ms[1])
        die("tcp_zerocopy: alloc");
    for (int r = 0; r < rounds; r++)
        for (int way = 0; way < 2; way++) {
            char go = (char)way;
            double t0 = now_ms();
            if (send(fd, &go, 1, 0) != 1)
                die("tcp_zerocopy: go");
            mapped[way] += receive(fd, region, copy, bytes, way);
            ms[way][r] = now_ms() - t0;
        }
    for (int way = 0; way < 2; way++) {
        qsort(ms[way], (size_t)rounds, sizeof(double), cmp_double);
        printf("%-9s %zu bytes one way: median %.2f ms over %d rounds, %.0f%% of the bytes mapped\n",
               way ? "zero-copy" : "plain", bytes, ms[way][rounds / 2], rounds,
               100.0 * (double)mapped[way] / ((double)bytes * rounds));
    }
    munmap(region, bytes);
    close(fd);
    waitpid(pid, NULL, 0);
    free(copy);
    free(ms[0]);
    free(ms[1]);
    return 0;
}
