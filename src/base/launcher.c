/* Rank and world size from a launcher's environment variables (launcher.h). One table, so that
 * every part of tdist that must find out "which rank am I" without a store (the env://
 * rendezvous, the harness's external-launcher mode) agrees on the variables and their order. */
#include "base/launcher.h"

#include <ctype.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <tdist/pg.h>

#include "base/env.h"
#include "base/error.h"

static const struct {
    const char *rank, *size, *local, *local_size;
    bool torch;
} g_launchers[] = {
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", true},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", false},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS", false},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NTASKS_PER_NODE", false},
};

/* A non-negative int from a set variable; -1 when unset or not a valid number (no error kept). */
static int env_count(const char *name, int64_t min)
{
    const char *v = env_get_str(name, NULL);
    int64_t x;
    if (!v)
        return -1;
    if (env_parse_int(name, v, min, INT32_MAX, &x) != TD_OK) {
        error_clear();
        return -1;
    }
    return (int)x;
}

/* The ranks on this node as row i's launcher gives them. Slurm sets SLURM_NTASKS_PER_NODE only for
 * --ntasks-per-node; SLURM_TASKS_PER_NODE ("4(x2),3") is always there: its first count is taken. */
static int local_size_of(size_t i)
{
    int n = env_count(g_launchers[i].local_size, 1);
    if (n >= 0 || strcmp(g_launchers[i].local_size, "SLURM_NTASKS_PER_NODE") != 0)
        return n;
    const char *t = env_get_str("SLURM_TASKS_PER_NODE", NULL);
    if (!t || !isdigit((unsigned char)t[0]))
        return -1;
    char *end;
    long v = strtol(t, &end, 10);
    if (v < 1 || v > INT32_MAX || (*end && *end != '(' && *end != ','))
        return -1;
    return (int)v;
}

void launcher_local_read(int *local_rank, int *local_world_size)
{
    *local_rank = *local_world_size = -1;
    for (size_t i = 0; i < sizeof g_launchers / sizeof g_launchers[0]; i++) {
        if (!env_get_str(g_launchers[i].local, NULL))
            continue;
        int r = env_count(g_launchers[i].local, 0), n = local_size_of(i);
        if (r >= 0 && n >= 0 && r >= n)
            r = -1;
        *local_rank = r;
        *local_world_size = n;
        return;
    }
}

int td_get_local_rank(void)
{
    int r, n;
    launcher_local_read(&r, &n);
    return r;
}

int td_get_local_world_size(void)
{
    int r, n;
    launcher_local_read(&r, &n);
    return n;
}

td_status launcher_env_read(bool with_torch, td_launcher_env *out)
{
    for (size_t i = 0; i < sizeof g_launchers / sizeof g_launchers[0]; i++) {
        if (g_launchers[i].torch && !with_torch)
            continue;
        const char *r = env_get_str(g_launchers[i].rank, NULL), *s = env_get_str(g_launchers[i].size, NULL);
        if (!r || !s)
            continue;
        int64_t rank, size, local = -1;
        TD_TRY(env_parse_int(g_launchers[i].rank, r, 0, INT32_MAX, &rank));
        TD_TRY(env_parse_int(g_launchers[i].size, s, 1, INT32_MAX, &size));
        if (rank >= size)
            return error_fmt(TD_ERR_INVALID, "%s (%lld) must be below %s (%lld)", g_launchers[i].rank, (long long)rank,
                            g_launchers[i].size, (long long)size);
        const char *l = env_get_str(g_launchers[i].local, NULL);
        if (l)
            TD_TRY(env_parse_int(g_launchers[i].local, l, 0, INT32_MAX, &local));
        out->rank = (int)rank;
        out->world_size = (int)size;
        out->local_rank = (int)local;
        out->local_world_size = local_size_of(i);
        out->rank_var = g_launchers[i].rank;
        out->size_var = g_launchers[i].size;
        return TD_OK;
    }
    return error_fmt(TD_ERR_NOT_FOUND,
                    "no launcher set this process's rank: none of %sOMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE "
                    "(Open MPI), PMI_RANK / PMI_SIZE (MPICH, Intel MPI) or SLURM_PROCID / SLURM_NTASKS (Slurm) are set",
                    with_torch ? "RANK / WORLD_SIZE (tdrun, torchrun), " : "");
}
