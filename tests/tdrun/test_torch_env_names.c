/* PyTorch's environment variable names beside tdist's (issue 22): TORCH_DISTRIBUTED_DEBUG for
 * TDIST_DEBUG, GLOO_SOCKET_IFNAME / NCCL_SOCKET_IFNAME for TDIST_SOCKET_IFNAME. TDIST_* wins, and
 * an error names the variable the user set. Each case runs in its own process, so setenv is safe. */
#include <stdlib.h>
#include <string.h>

#include <tdist/pg.h>
#include <tdist/store.h>
#include <tdist/testing.h>

#include "base/env.h"
#include "pg/pg_impl.h"

static void clear_names(void)
{
    const char *names[] = {"TDIST_DEBUG", "TORCH_DISTRIBUTED_DEBUG", "TDIST_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                           "NCCL_SOCKET_IFNAME"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++)
        unsetenv(names[i]);
}

TD_TEST(env_first_name_wins)
{
    clear_names();
    static const char *const names[] = ENV_DEBUG_NAMES;
    const char *which = NULL;
    TD_CHECK(env_get_first(names, &which) == NULL);
    TD_CHECK_MSG(strcmp(which, "TDIST_DEBUG") == 0, "which = %s", which);
    setenv("TORCH_DISTRIBUTED_DEBUG", "INFO", 1);
    TD_CHECK_MSG(strcmp(env_get_first(names, &which), "INFO") == 0 && strcmp(which, "TORCH_DISTRIBUTED_DEBUG") == 0,
                 "which = %s", which);
    setenv("TDIST_DEBUG", "DETAIL", 1);
    TD_CHECK_MSG(strcmp(env_get_first(names, &which), "DETAIL") == 0 && strcmp(which, "TDIST_DEBUG") == 0,
                 "which = %s", which);
    clear_names();
}

TD_TEST(env_torch_distributed_debug)
{
    clear_names();
    pg_debug_level level = PG_DEBUG_OFF;
    setenv("TORCH_DISTRIBUTED_DEBUG", "detail", 1);
    TD_CHECK_OK(pg_parse_debug_level(NULL, &level));
    TD_CHECK_EQ((int)level, (int)PG_DEBUG_DETAIL);
    setenv("TDIST_DEBUG", "INFO", 1); /* TDIST_* wins */
    TD_CHECK_OK(pg_parse_debug_level(NULL, &level));
    TD_CHECK_EQ((int)level, (int)PG_DEBUG_INFO);
    unsetenv("TDIST_DEBUG");
    setenv("TORCH_DISTRIBUTED_DEBUG", "LOUD", 1);
    TD_CHECK(pg_parse_debug_level(NULL, &level) == TD_ERR_INVALID);
    TD_CHECK_CONTAINS(td_last_error(), "TORCH_DISTRIBUTED_DEBUG must be OFF, INFO, or DETAIL");
    clear_names();
}

TD_TEST(env_socket_ifname_names)
{
    clear_names();
    char name[64];
    const char *which = NULL;
    TD_CHECK(!env_socket_ifname(name, sizeof name, &which));
    setenv("NCCL_SOCKET_IFNAME", "^docker0,lo", 1); /* an exclusion list names no interface */
    TD_CHECK(!env_socket_ifname(name, sizeof name, &which));
    setenv("NCCL_SOCKET_IFNAME", "=eth7", 1);
    TD_CHECK(env_socket_ifname(name, sizeof name, &which));
    TD_CHECK_MSG(strcmp(name, "eth7") == 0 && strcmp(which, "NCCL_SOCKET_IFNAME") == 0, "%s from %s", name, which);
    setenv("GLOO_SOCKET_IFNAME", "eth3,eth4", 1);
    TD_CHECK(env_socket_ifname(name, sizeof name, &which));
    TD_CHECK_MSG(strcmp(name, "eth3") == 0 && strcmp(which, "GLOO_SOCKET_IFNAME") == 0, "%s from %s", name, which);
    setenv("TDIST_SOCKET_IFNAME", "lo", 1);
    TD_CHECK(env_socket_ifname(name, sizeof name, &which));
    TD_CHECK_MSG(strcmp(name, "lo") == 0 && strcmp(which, "TDIST_SOCKET_IFNAME") == 0, "%s from %s", name, which);
    clear_names();
}

/* The tcp transport's error names the variable that was set. */
TD_TEST(env_gloo_socket_ifname_error_names_it, .timeout_s = 30)
{
    clear_names();
    setenv("GLOO_SOCKET_IFNAME", "tdnosuch0", 1);
    td_store *store = NULL;
    TD_CHECK_OK(td_hash_store_create(&store));
    td_pg_options o = TD_PG_OPTIONS_INIT;
    o.backend = "tcp";
    o.store = store;
    o.rank = 0;
    o.world_size = 2;
    o.timeout_ms = 3000;
    td_pg *pg = NULL;
    td_status st = td_pg_create(&o, &pg);
    TD_CHECK_MSG(st != TD_OK, "a tcp group formed with GLOO_SOCKET_IFNAME=tdnosuch0");
    TD_CHECK_CONTAINS(td_last_error(), "GLOO_SOCKET_IFNAME names interface 'tdnosuch0', which does not exist");
    td_store_release(store);
    clear_names();
}

TD_TEST_MAIN()
