/* Network faults between hosts (issue 23): two ranks in two network namespaces joined by a link
 * that the test controls, so every byte between them crosses a real kernel network stack (real
 * TCP, retransmissions and all) over a path the test can slow down and cut.
 *
 * The case (a single process, root, `ip` from iproute2, /dev/net/tun) starts two ranks of the
 * hidden case netns_rank, each in a network namespace of its own (unshare(CLONE_NEWNET) between
 * fork and exec, so each rank is a fresh process of this binary under --td-external). The link is
 * a TUN device in each namespace (10.231.N.1 and .2) and a thread of the test between them that
 * carries every IP packet from one to the other: a network emulator in the manner of the kernel's
 * netem qdisc, which this project's machines lack. The ranks form a tcp group over it
 * (TDIST_SOCKET_IFNAME names the device). First the emulator delays every packet by 10 ms and
 * drops one in a hundred: the collectives must only slow down, and every result stays right. Then
 * it drops every packet (the cut link) and the ranks run one more all_reduce: every rank must fail
 * within the group's timeout (plus slack) with an error that names its peer, not hang and not wait
 * for a kernel default of hours. Where namespaces or TUN devices cannot be made (not root, no
 * `ip`, no /dev/net/tun), the case skips. */
#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <linux/if.h>
#include <linux/if_tun.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "pg_util.h"

#include "base/clock.h"

enum { GROUP_TIMEOUT_MS = 3000, ROUNDS = 10, DELAY_MS = 10, DROP_EVERY = 100 };

static bool exists(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return access(path, F_OK) == 0;
}

static void touch(const char *dir, const char *name)
{
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    int fd = open(path, O_WRONLY | O_CREAT | O_CLOEXEC, 0600);
    TD_CHECK_MSG(fd >= 0, "creating %s: %s", path, strerror(errno));
    close(fd);
}

static void await(const char *dir, const char *name, int64_t timeout_ms)
{
    int64_t deadline = deadline_after_ms(timeout_ms);
    while (!exists(dir, name)) {
        TD_CHECK_MSG(!deadline_passed(deadline), "waited %lld ms for %s/%s", (long long)timeout_ms, dir, name);
        usleep(10000);
    }
}

static td_tensor *filled(int rank, int64_t n)
{
    td_tensor *t = NULL;
    TD_CHECK_OK(td_tensor_full(TD_FLOAT32, TD_SHAPE(n), (double)(rank + 1), &t));
    return t;
}

/* One rank, inside its namespace: TDIST_NETNS_DIR is the directory the test and the ranks share. */
TD_TEST(netns_rank, .world_size = 2, .hidden = true, .timeout_s = 120)
{
    const char *dir = getenv("TDIST_NETNS_DIR");
    const char *subnet = getenv("TDIST_NETNS_SUBNET");
    TD_CHECK_MSG(dir && subnet, "run by netns_cut_link only");
    await(dir, "net_ready", 30000);
    char url[128];
    snprintf(url, sizeof url, "tcp://%s.1:29500?rank=%d&world_size=2", subnet, ctx->rank);
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "tcp";
    o.init_method = url;
    o.timeout_ms = GROUP_TIMEOUT_MS;
    td_pg *pg = NULL;
    TD_CHECK_OK(td_pg_create(&o, &pg));
    td_tensor *t = NULL;
    int64_t took_ms[2], slowest_ms = 0;
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1) {
            /* The emulator turns slow once both ranks are done with the fast link. */
            char name[32];
            snprintf(name, sizeof name, "fast_done_%d", ctx->rank);
            touch(dir, name);
            await(dir, "slow_link", 30000);
        }
        int64_t t0 = clock_now_ms();
        for (int i = 0; i < ROUNDS; i++) {
            td_tensor_release(t);
            t = filled(ctx->rank, 1 << 16);
            int64_t t1 = clock_now_ms();
            TD_CHECK_OK(td_pg_all_reduce(pg, t, TD_OP_SUM, NULL));
            int64_t op_ms = clock_now_ms() - t1;
            if (phase == 1 && op_ms > slowest_ms)
                slowest_ms = op_ms;
            const float *v = td_tensor_data(t);
            TD_CHECK_EQ(v[0], 3);
            TD_CHECK_EQ(v[(1 << 16) - 1], 3);
        }
        took_ms[phase] = clock_now_ms() - t0;
    }
    /* Each all_reduce waits for the peer's data at least once: one 10 ms crossing at the least. */
    TD_CHECK_MSG(took_ms[1] >= ROUNDS * DELAY_MS, "%d all_reduces over a 10 ms link took %lld ms", ROUNDS,
                 (long long)took_ms[1]);
    printf("NETNS_LINK rank=%d all_reduces=%d of 256 KiB: fast link %lld ms, 10 ms delay and 1%% loss %lld ms "
           "(slowest %lld ms)\n",
           ctx->rank, ROUNDS, (long long)took_ms[0], (long long)took_ms[1], (long long)slowest_ms);
    char name[32];
    snprintf(name, sizeof name, "worked_%d", ctx->rank);
    touch(dir, name);
    await(dir, "link_cut", 30000);
    int64_t t0 = clock_now_ms();
    td_status st = td_pg_all_reduce(pg, t, TD_OP_SUM, NULL);
    int64_t took = clock_now_ms() - t0;
    char peer[32];
    snprintf(peer, sizeof peer, "rank %d", 1 - ctx->rank);
    TD_CHECK_MSG(st != TD_OK, "rank %d: the all_reduce succeeded over a cut link", ctx->rank);
    TD_CHECK_MSG(strstr(td_last_error(), peer) != NULL, "rank %d's error does not name %s: %s", ctx->rank, peer,
                 td_last_error());
    TD_CHECK_MSG(took < GROUP_TIMEOUT_MS + 5000, "rank %d failed after %lld ms: %s", ctx->rank, (long long)took,
                 td_last_error());
    printf("NETNS_CUT rank=%d ms=%lld status=%s error=%s\n", ctx->rank, (long long)took, td_status_str(st),
           td_last_error());
    fflush(stdout);
    td_tensor_release(t);
    td_pg_destroy(pg);
}

/* ---- the link: two TUN devices and the emulator between them ---------------------------------- */

enum { QUEUE = 4096, PACKET_MAX = 2048 };

typedef struct held_packet {
    int64_t due_ns;
    size_t len;
    unsigned char bytes[PACKET_MAX];
} held_packet;

/* Packets read from tun[d] wait in q[d] until due, then go to tun[1 - d]. */
typedef struct emulator {
    int tun[2];
    held_packet *q[2];
    size_t head[2], count[2];
    _Atomic bool slow, cut, stop; /* slow: 10 ms and 1% loss (before: carried at once, none lost) */
    /* the emulator thread's counters, read after it ended: packets read, carried across, lost by
     * the slow link's one in a hundred, dropped by the cut link or a full queue */
    uint64_t seen, carried, lost, dropped;
} emulator;

/* A TUN device named name in process pid's network namespace (the calling thread enters it, makes
 * the device and comes back); its fd, or -1 with errno. */
static int tun_in_netns(pid_t pid, const char *name)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/ns/net", (int)pid);
    int target = open(path, O_RDONLY | O_CLOEXEC);
    int home = open("/proc/thread-self/ns/net", O_RDONLY | O_CLOEXEC);
    int fd = -1, err = 0;
    if (target >= 0 && home >= 0 && setns(target, CLONE_NEWNET) == 0) {
        fd = open("/dev/net/tun", O_RDWR | O_NONBLOCK | O_CLOEXEC);
        struct ifreq ifr;
        memset(&ifr, 0, sizeof ifr);
        ifr.ifr_flags = IFF_TUN | IFF_NO_PI;
        snprintf(ifr.ifr_name, sizeof ifr.ifr_name, "%s", name);
        if (fd >= 0 && ioctl(fd, TUNSETIFF, &ifr) != 0) {
            err = errno;
            close(fd);
            fd = -1;
        } else if (fd < 0) {
            err = errno;
        }
        TD_CHECK_MSG(setns(home, CLONE_NEWNET) == 0, "returning to the test's network namespace: %s", strerror(errno));
    } else {
        err = errno;
    }
    if (target >= 0)
        close(target);
    if (home >= 0)
        close(home);
    errno = err;
    return fd;
}

static void *emulator_main(void *arg)
{
    emulator *e = arg;
    while (!atomic_load(&e->stop)) {
        int64_t now = clock_now_ns();
        /* Deliver what is due, in order (one delay for all: each queue is sorted by due time). */
        int wait_ms = 5;
        for (int d = 0; d < 2; d++) {
            while (e->count[d] > 0) {
                held_packet *p = &e->q[d][e->head[d]];
                if (p->due_ns > now) {
                    int ms = (int)((p->due_ns - now) / 1000000) + 1;
                    if (ms < wait_ms)
                        wait_ms = ms;
                    break;
                }
                if (!atomic_load(&e->cut) && write(e->tun[1 - d], p->bytes, p->len) == (ssize_t)p->len)
                    e->carried++;
                else
                    e->dropped++;
                e->head[d] = (e->head[d] + 1) % QUEUE;
                e->count[d]--;
            }
        }
        struct pollfd pfd[2] = {{.fd = e->tun[0], .events = POLLIN}, {.fd = e->tun[1], .events = POLLIN}};
        if (poll(pfd, 2, wait_ms) <= 0)
            continue;
        /* (what is read now and due at once goes out at the top of the next turn) */
        now = clock_now_ns();
        for (int d = 0; d < 2; d++) {
            if (!(pfd[d].revents & POLLIN))
                continue;
            for (;;) {
                unsigned char buf[PACKET_MAX];
                ssize_t n = read(e->tun[d], buf, sizeof buf);
                if (n <= 0)
                    break;
                e->seen++;
                /* The cut link loses everything; the slow one every hundredth packet, and what a
                 * full queue cannot hold. */
                if (atomic_load(&e->cut) || e->count[d] == QUEUE) {
                    e->dropped++;
                    continue;
                }
                bool slow = atomic_load(&e->slow);
                if (slow && e->seen % DROP_EVERY == 0) {
                    e->lost++;
                    continue;
                }
                held_packet *p = &e->q[d][(e->head[d] + e->count[d]) % QUEUE];
                p->due_ns = slow ? now + (int64_t)DELAY_MS * 1000000 : now;
                p->len = (size_t)n;
                memcpy(p->bytes, buf, (size_t)n);
                e->count[d]++;
            }
        }
    }
    return NULL;
}

/* Runs a shell command; its exit status. */
static int sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static int sh(const char *fmt, ...)
{
    char cmd[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

static const char *netns_skip(const char *param)
{
    (void)param;
    if (geteuid() != 0)
        return "network namespaces and TUN devices need root";
    if (system("ip -V >/dev/null 2>&1") != 0)
        return "no `ip` (iproute2)";
    if (access("/dev/net/tun", R_OK | W_OK) != 0)
        return "no /dev/net/tun for the emulated link";
    return NULL;
}

TD_TEST(netns_cut_link, .static_skip = netns_skip, .timeout_s = 120)
{
    const char *dir = ctx->tmpdir;
    /* A subnet and interface names of this process's own, so parallel runs never meet. */
    int id = (int)(getpid() % 200) + 20;
    char subnet[32], ifname[2][16];
    snprintf(subnet, sizeof subnet, "10.231.%d", id);
    snprintf(ifname[0], sizeof ifname[0], "tdn%da", (int)getpid());
    snprintf(ifname[1], sizeof ifname[1], "tdn%db", (int)getpid());
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    TD_CHECK(n > 0);
    exe[n] = '\0';

    pid_t pid[2];
    for (int r = 0; r < 2; r++) {
        int sync[2];
        TD_CHECK(pipe2(sync, O_CLOEXEC) == 0);
        char env_rank[32], env_dir[4200], env_subnet[64], env_if[64];
        snprintf(env_rank, sizeof env_rank, "RANK=%d", r);
        snprintf(env_dir, sizeof env_dir, "TDIST_NETNS_DIR=%s", dir);
        snprintf(env_subnet, sizeof env_subnet, "TDIST_NETNS_SUBNET=%s", subnet);
        snprintf(env_if, sizeof env_if, "TDIST_SOCKET_IFNAME=%s", ifname[r]);
        pid[r] = fork();
        TD_CHECK(pid[r] >= 0);
        if (pid[r] == 0) {
            char ok = unshare(CLONE_NEWNET) == 0 ? 1 : 0;
            (void)!write(sync[1], &ok, 1);
            if (!ok)
                _exit(TD_SKIP_GENERIC);
            putenv(env_rank);
            putenv((char *)"WORLD_SIZE=2");
            putenv(env_dir);
            putenv(env_subnet);
            putenv(env_if);
            char *args[] = {exe, (char *)"--td-external", (char *)"netns_rank", NULL};
            execv(exe, args);
            _exit(127);
        }
        close(sync[1]);
        char ok = 0;
        TD_CHECK(read(sync[0], &ok, 1) == 1);
        close(sync[0]);
        if (!ok) {
            waitpid(pid[r], NULL, 0);
            if (r == 1) {
                kill(pid[0], SIGKILL);
                waitpid(pid[0], NULL, 0);
            }
            TD_SKIP(TD_SKIP_GENERIC, "unshare(CLONE_NEWNET) is not allowed here");
        }
    }

    /* The link: a TUN device in each rank's namespace (gone with the emulator's fds), addressed
     * .1 and .2, and the emulator carrying packets between them. */
    emulator *e = calloc(1, sizeof *e);
    TD_CHECK(e != NULL);
    for (int r = 0; r < 2; r++) {
        e->q[r] = malloc(sizeof(held_packet) * QUEUE);
        TD_CHECK(e->q[r] != NULL);
        e->tun[r] = tun_in_netns(pid[r], ifname[r]);
        TD_CHECK_MSG(e->tun[r] >= 0, "a TUN device in rank %d's namespace: %s", r, strerror(errno));
        TD_CHECK_EQ(sh("nsenter -t %d -n sh -c 'ip addr add %s.%d/24 dev %s && ip link set %s up && ip link set lo up'",
                       (int)pid[r], subnet, r + 1, ifname[r], ifname[r]),
                    0);
    }
    pthread_t emu;
    TD_CHECK(pthread_create(&emu, NULL, emulator_main, e) == 0);
    touch(dir, "net_ready");

    /* Both ranks worked over the fast link: slow it down; then they worked over the slow one: cut it. */
    await(dir, "fast_done_0", 60000);
    await(dir, "fast_done_1", 60000);
    atomic_store(&e->slow, true);
    touch(dir, "slow_link");
    await(dir, "worked_0", 60000);
    await(dir, "worked_1", 60000);
    atomic_store(&e->cut, true);
    touch(dir, "link_cut");

    int64_t deadline = deadline_after_ms(GROUP_TIMEOUT_MS + 30000);
    int code[2] = {-1, -1};
    for (int left = 2; left > 0;) {
        for (int r = 0; r < 2; r++) {
            int status;
            if (code[r] == -1 && waitpid(pid[r], &status, WNOHANG) == pid[r]) {
                code[r] = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
                left--;
            }
        }
        if (left > 0 && deadline_passed(deadline)) {
            for (int r = 0; r < 2; r++)
                if (code[r] == -1) {
                    kill(pid[r], SIGKILL);
                    waitpid(pid[r], NULL, 0);
                }
            TD_FAIL("a rank still runs %d ms after the link was cut", GROUP_TIMEOUT_MS + 30000);
        }
        usleep(20000);
    }
    atomic_store(&e->stop, true);
    pthread_join(emu, NULL);
    printf("NETNS_LINK packets=%llu carried=%llu lost_on_the_slow_link=%llu dropped_cut_or_full=%llu\n",
           (unsigned long long)e->seen, (unsigned long long)e->carried, (unsigned long long)e->lost,
           (unsigned long long)e->dropped);
    for (int r = 0; r < 2; r++) {
        close(e->tun[r]);
        free(e->q[r]);
    }
    uint64_t lost = e->lost, carried = e->carried;
    free(e);
    TD_CHECK_MSG(code[0] == 0 && code[1] == 0, "rank exit codes %d and %d (see their output above)", code[0], code[1]);
    /* The slow phase lost packets and TCP carried on: the 1% was real. */
    TD_CHECK_MSG(carried > (uint64_t)DROP_EVERY && lost > 0, "the slow link carried %llu packets and lost %llu",
                 (unsigned long long)carried, (unsigned long long)lost);
    const char *names[] = {"net_ready", "fast_done_0", "fast_done_1", "slow_link", "worked_0", "worked_1", "link_cut"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", dir, names[i]);
        unlink(path);
    }
}
TD_TEST_MAIN()
