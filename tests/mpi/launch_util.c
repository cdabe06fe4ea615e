/* Helpers shared by the launcher tests (launch_util.h). */
#include "launch_util.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

int launch_test_port(td_test_ctx *ctx, const char *name)
{
    char path[1024], tmp[1100];
    snprintf(path, sizeof path, "%s/%s", ctx->tmpdir, name);
    if (ctx->rank == 0) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        TD_CHECK(fd >= 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        socklen_t len = sizeof a;
        TD_CHECK(bind(fd, (struct sockaddr *)&a, sizeof a) == 0);
        TD_CHECK(getsockname(fd, (struct sockaddr *)&a, &len) == 0);
        close(fd);
        snprintf(tmp, sizeof tmp, "%s.tmp", path);
        FILE *f = fopen(tmp, "w");
        TD_CHECK(f != NULL);
        fprintf(f, "%d\n", ntohs(a.sin_port));
        TD_CHECK(fclose(f) == 0);
        TD_CHECK(rename(tmp, path) == 0);
        return ntohs(a.sin_port);
    }
    for (int i = 0; i < 6000; i++) {
        FILE *f = fopen(path, "r");
        if (f) {
            int port = -1;
            TD_CHECK(fscanf(f, "%d", &port) == 1);
            fclose(f);
            return port;
        }
        struct timespec d = {0, 10 * 1000000L};
        nanosleep(&d, NULL);
    }
    TD_FAIL("rank 0 did not publish a port in %s within 60 s", path);
}

void launch_test_port_done(td_test_ctx *ctx, const char *name)
{
    if (ctx->rank != 0)
        return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", ctx->tmpdir, name);
    TD_CHECK(unlink(path) == 0);
}
