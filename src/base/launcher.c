/* Rank and world size from a launcher's environment variables (launcher.h). One table, so that
 * every part of tdist that must find out "which rank am I" without a store (the env://
 * rendezvous, the harness's external-launcher mode) agrees on the variables and their order. */
#include "base/launcher.h"

#include <stdint.h>
#include <stdlib.h>

#include "base/env.h"
#include "base/error.h"

static const struct {
    const char *rank, *size, *local;
    bool torch;
} g_launchers[] = {
    {"RANK", "WORLD_SIZE", "LOCAL_RANK", true},
    {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", false},
    {"PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", false},
    {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", false},
};

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
        out->rank_var = g_launchers[i].rank;
        out->size_var = g_launchers[i].size;
        return TD_OK;
    }
    return error_fmt(TD_ERR_NOT_FOUND,
                    "no launcher set this process's rank: none of %sOMPI_COMM_WORLD_RANK / OMPI_COMM_WORLD_SIZE "
                    "(Open MPI), PMI_RANK / PMI_SIZE (MPICH, Intel MPI) or SLURM_PROCID / SLURM_NTASKS (Slurm) are set",
                    with_torch ? "RANK / WORLD_SIZE (tdrun, torchrun), " : "");
}
