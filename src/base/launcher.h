/* Internal: this process's rank and world size as a launcher put them in the environment.
 *
 * tdrun and torchrun set RANK and WORLD_SIZE (and LOCAL_RANK); MPI launchers and batch systems
 * set their own: Open MPI's mpirun OMPI_COMM_WORLD_RANK / _SIZE / _LOCAL_RANK, PMI launchers
 * (MPICH's and Intel MPI's Hydra) PMI_RANK / PMI_SIZE, Slurm's srun SLURM_PROCID / SLURM_NTASKS /
 * SLURM_LOCALID. The env:// rendezvous and the test harness's external-launcher mode read them
 * through this one table, in that order of preference. */
#ifndef TDIST_BASE_LAUNCHER_H
#define TDIST_BASE_LAUNCHER_H

#include <stdbool.h>

#include <tdist/status.h>

typedef struct td_launcher_env {
    int rank;
    int world_size;
    int local_rank;       /* -1 when the launcher does not say */
    int local_world_size; /* ranks on this node; -1 when the launcher does not say */
    const char *rank_var; /* the variables they came from, e.g. "OMPI_COMM_WORLD_RANK" */
    const char *size_var;
} td_launcher_env;

/* The first launcher whose rank and size variables are both set. TD_ERR_NOT_FOUND (with a message
 * listing the variables) when none is; TD_ERR_INVALID when a set variable is not a valid number
 * (or the rank is not below the size). with_torch: whether RANK / WORLD_SIZE count (the env://
 * rendezvous reads those itself, with PyTorch's messages). */
td_status launcher_env_read(bool with_torch, td_launcher_env *out);

/* This process's rank on its node and the number of ranks there (td_get_local_rank), from the first
 * launcher whose local-rank variable is set: LOCAL_RANK / LOCAL_WORLD_SIZE (tdrun, torchrun),
 * OMPI_COMM_WORLD_LOCAL_RANK / _LOCAL_SIZE (Open MPI), MPI_LOCALRANKID / MPI_LOCALNRANKS (MPICH's
 * Hydra), SLURM_LOCALID with SLURM_NTASKS_PER_NODE or the first count of SLURM_TASKS_PER_NODE
 * (Slurm). Either is -1 when that launcher does not set it or sets something that is not a valid
 * number (a local rank not below the local size counts as not set). */
void launcher_local_read(int *local_rank, int *local_world_size);

#endif
